//! Many runs at once: a scenario over a range of seeds and fault specifications, spread over
//! worker threads (each run is deterministic and independent, so the order of execution does not
//! matter; results are reported in seed order).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::fault::FaultSpec;
use crate::report::RunReport;
use crate::scenario::{run, Scenario, ScenarioError};

/// The outcome of one run of a sweep.
#[derive(Debug)]
pub struct SweepRun {
    /// The scenario that ran (its seed and faults set).
    pub scenario: Scenario,
    /// Its report, or why it could not run.
    pub result: Result<RunReport, String>,
}

impl SweepRun {
    /// Whether the run completed and the checker passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.result.as_ref().is_ok_and(RunReport::passed)
    }
}

/// Runs `base` once per (fault, seed), on `jobs` threads, calling `done(finished, total)` after
/// each run. Results come back ordered by fault, then seed.
pub fn sweep(
    base: &Scenario,
    faults: &[FaultSpec],
    seeds: std::ops::RangeInclusive<u64>,
    jobs: usize,
    done: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<SweepRun>, ScenarioError> {
    base.validate()?;
    let scenarios: Vec<Scenario> = faults
        .iter()
        .flat_map(|&f| seeds.clone().map(move |seed| (f, seed)))
        .map(|(faults, seed)| Scenario {
            faults,
            seed,
            ..base.clone()
        })
        .collect();
    let total = scenarios.len();
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<SweepRun>>> = Mutex::new((0..total).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(s) = scenarios.get(i) else { break };
                let result = run(s, &mut |_| {}).map_err(|e| e.to_string());
                let r = SweepRun {
                    scenario: s.clone(),
                    result,
                };
                if let Ok(mut all) = results.lock() {
                    all[i] = Some(r);
                }
                done(finished.fetch_add(1, Ordering::Relaxed) + 1, total);
            });
        }
    });
    let all = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(all.into_iter().flatten().collect())
}
