//! Deterministic check of section II: with an injected clock, measured rates follow the
//! weighted max-min formula, including the paper's worked example.

// The public `Scheduler` is not built under the loom cfg (see `src/lib.rs`).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tidings_sched::maxmin::expected_rates;
use tidings_sched::{ManualClock, SchedConfig, Scheduler, Step, TryPushError};

/// Runs tasks with `shares` fed at `offered` events/s for `duration_ns` of virtual time, where
/// every event takes `cost_ns` (so the capacity is 1e9 / cost_ns events/s). Returns the measured
/// rates (events/s) after `warmup_ns`.
fn simulate(
    shares: &[f64],
    offered: &[f64],
    cost_ns: u64,
    warmup_ns: u64,
    duration_ns: u64,
) -> Vec<f64> {
    let clock = Arc::new(ManualClock::new(0));
    let config = SchedConfig {
        worker_threads: 0,
        task_queue_capacity: 256,
        ..SchedConfig::default()
    };
    let scheduler = match Scheduler::with_clock(config, clock.clone()) {
        Ok(s) => s,
        Err(e) => panic!("valid config: {e}"),
    };
    let counts: Vec<Arc<AtomicU64>> = shares.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let tasks: Vec<_> = shares
        .iter()
        .zip(&counts)
        .map(|(&share, count)| {
            let (clock, count) = (clock.clone(), count.clone());
            scheduler
                .add_task(share, move |_sent_ns: u64| {
                    // Each event takes cost_ns of (virtual) time; count those run after warm-up.
                    if clock.now_ns_for_test() >= warmup_ns {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    clock.advance_ns(cost_ns);
                })
                .expect("valid share")
        })
        .collect();
    let gap_ns: Vec<f64> = offered.iter().map(|rate| 1e9 / rate).collect();
    let mut next_ns: Vec<f64> = gap_ns.iter().map(|gap| gap / 2.0).collect();
    loop {
        let now = clock.now_ns_for_test();
        if now >= duration_ns {
            break;
        }
        // Arrivals due by now; a full queue means the (blocked) writer is backlogged anyway.
        for i in 0..tasks.len() {
            while next_ns[i] <= now as f64 {
                match tasks[i].try_push(next_ns[i] as u64) {
                    Ok(()) | Err(TryPushError::Full(_)) => {}
                    Err(TryPushError::Closed(_)) => panic!("task closed"),
                }
                next_ns[i] += gap_ns[i];
            }
        }
        if scheduler.run_once() == Step::Idle {
            let next = next_ns.iter().copied().fold(f64::INFINITY, f64::min);
            clock.advance_to_ns(next.ceil() as u64);
        }
    }
    let seconds = (duration_ns - warmup_ns) as f64 / 1e9;
    counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed) as f64 / seconds)
        .collect()
}

trait NowForTest {
    fn now_ns_for_test(&self) -> u64;
}
impl NowForTest for ManualClock {
    fn now_ns_for_test(&self) -> u64 {
        tidings_sched::Clock::now_ns(self)
    }
}

fn assert_close(measured: &[f64], expected: &[f64], tolerance: f64) {
    eprintln!("measured {measured:.1?} expected {expected:.1?}");
    for (i, (m, e)) in measured.iter().zip(expected).enumerate() {
        assert!(
            (m - e).abs() <= tolerance * e.max(1.0),
            "task {i}: measured {m:.0}/s, expected {e:.0}/s (all measured {measured:.0?}, expected {expected:.0?})"
        );
    }
}

#[test]
fn paper_worked_example_gives_4000_3600_2400() {
    let shares = [0.5, 0.3, 0.2];
    let offered = [4000.0, 6000.0, 5000.0];
    // 100 µs per event: Rmax = 10 000 events/s.
    let expected = expected_rates(&shares, &offered, 10_000.0);
    assert_close(&expected, &[4000.0, 3600.0, 2400.0], 1e-9);
    let measured = simulate(&shares, &offered, 100_000, 200_000_000, 2_200_000_000);
    assert_close(&measured, &expected, 0.02);
}

#[test]
fn backlogged_tasks_split_capacity_by_share() {
    let shares = [0.6, 0.3, 0.1];
    let offered = [20_000.0, 20_000.0, 20_000.0];
    let measured = simulate(&shares, &offered, 100_000, 200_000_000, 2_200_000_000);
    assert_close(&measured, &[6000.0, 3000.0, 1000.0], 0.02);
}

#[test]
fn below_capacity_every_task_gets_its_offered_rate() {
    let shares = [0.7, 0.2, 0.1];
    let offered = [1000.0, 3000.0, 2500.0];
    let measured = simulate(&shares, &offered, 100_000, 200_000_000, 2_200_000_000);
    assert_close(&measured, &offered, 0.02);
}

#[test]
fn unequal_event_costs_are_charged_by_time_not_by_count() {
    // Two backlogged tasks with equal shares: the one whose events cost more gets fewer events,
    // in proportion, so that each gets half of the time.
    let clock = Arc::new(ManualClock::new(0));
    let config = SchedConfig {
        worker_threads: 0,
        ..SchedConfig::default()
    };
    let scheduler = Scheduler::with_clock(config, clock.clone()).expect("valid config");
    let mut tasks = Vec::new();
    for cost_ns in [50_000u64, 200_000] {
        let clock = clock.clone();
        tasks.push(
            scheduler
                .add_task(0.5, move |()| clock.advance_ns(cost_ns))
                .expect("share"),
        );
    }
    while tidings_sched::Clock::now_ns(&*clock) < 1_000_000_000 {
        for task in &tasks {
            while task.try_push(()).is_ok() {}
        }
        scheduler.run_once();
    }
    let cheap = tasks[0].stats();
    let dear = tasks[1].stats();
    let ratio = cheap.run_ns as f64 / dear.run_ns as f64;
    assert!(
        (ratio - 1.0).abs() < 0.03,
        "time split {ratio}: {cheap:?} {dear:?}"
    );
    assert!(cheap.events_run > 3 * dear.events_run, "{cheap:?} {dear:?}");
}
