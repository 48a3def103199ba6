//! The experiments of paper 003 section IV, as bounded functions returning plain result structs
//! (the CLI serialises them; `examples/sched_bench.rs` of this crate prints them as tables).
//!
//! * [`rate_delay`]: throughput and delay against offered rate, one topic (Fig. 5).
//! * [`scaling`]: throughput against number of topics and threads, lock-free set against the
//!   mutex baseline (Figs. 6-7).
//! * [`share_error`]: CCDF of the relative share error over random configurations, at
//!   saturation and below (Fig. 8), on real threads; [`share_error_simulated`] runs the same
//!   experiment in virtual time, which separates the algorithm's own error from the noise of the
//!   machine.
//!
//! Handlers do synthetic work ([`SpinWork`]) instead of application code. Every experiment is
//! bounded by its configured durations. Nothing here asserts timings: results are reported.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use thiserror::Error;
use tidings_sched::maxmin::{expected_rates, relative_error};
use tidings_sched::{
    Clock, ManualClock, MonotonicClock, SchedConfig, Scheduler, ShareError, ShutdownError,
    ShutdownMode, StartError, Step, TaskHandle, TaskSetKind, TryPushError,
};

/// Why an experiment could not run.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The scheduler could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A task could not be added.
    #[error(transparent)]
    Share(#[from] ShareError),
    /// A worker panicked.
    #[error(transparent)]
    Shutdown(#[from] ShutdownError),
    /// The experiment's parameters are unusable.
    #[error("invalid benchmark parameter: {0}")]
    Invalid(&'static str),
}

/// Synthetic handler work: a dependent chain of integer operations of calibrated length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinWork {
    /// Loop iterations per event.
    pub iterations: u64,
}

impl SpinWork {
    /// Work that takes about `target_ns` on this machine (measured once, now).
    pub fn calibrate(target_ns: u64) -> Self {
        if target_ns == 0 {
            return Self { iterations: 0 };
        }
        let clock = MonotonicClock::new();
        let probe = 2_000_000;
        let mut best_ns = u64::MAX;
        // Best of three, to discount preemption during calibration.
        for _ in 0..3 {
            let start = clock.now_ns();
            black_box(spin(probe));
            best_ns = best_ns.min(clock.now_ns().saturating_sub(start).max(1));
        }
        let iterations = (u128::from(target_ns) * u128::from(probe) / u128::from(best_ns)).max(1);
        Self {
            iterations: u64::try_from(iterations).unwrap_or(u64::MAX),
        }
    }

    /// Does the work once.
    pub fn run(&self) {
        black_box(spin(self.iterations));
    }
}

/// A dependent multiply-add chain the optimiser cannot remove.
fn spin(iterations: u64) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for _ in 0..iterations {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
    }
    x
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn ns_per_s(ns: u64) -> f64 {
    ns as f64 / 1e9
}

// ---------------------------------------------------------------------------------------------
// Capacity
// ---------------------------------------------------------------------------------------------

/// Aggregate events/s of `topics` always-backlogged tasks with equal shares on `worker_threads`
/// workers, each event doing `work`: the `R_max` of section II for this setting.
pub fn capacity(
    worker_threads: usize,
    topics: usize,
    work: SpinWork,
    task_set: TaskSetKind,
    duration_ms: u64,
) -> Result<f64, BenchError> {
    let point = closed_loop(worker_threads, topics, work, task_set, 4, duration_ms)?;
    Ok(point)
}

/// Runs `topics` self-feeding tasks (each handler re-queues its event, keeping `in_flight` events
/// per task) and returns events/s over `duration_ms` after a short warm-up.
fn closed_loop(
    worker_threads: usize,
    topics: usize,
    work: SpinWork,
    task_set: TaskSetKind,
    in_flight: usize,
    duration_ms: u64,
) -> Result<f64, BenchError> {
    if topics == 0 || in_flight == 0 || worker_threads == 0 {
        return Err(BenchError::Invalid(
            "topics, in_flight and worker_threads must be positive",
        ));
    }
    let config = SchedConfig {
        worker_threads,
        task_queue_capacity: in_flight.max(2),
        task_set,
        ..SchedConfig::default()
    };
    let scheduler = Scheduler::new(config)?;
    let share = 1.0 / topics as f64;
    let mut handles = Vec::with_capacity(topics);
    for _ in 0..topics {
        let me: Arc<OnceLock<TaskHandle<u64>>> = Arc::new(OnceLock::new());
        let inner = Arc::clone(&me);
        let handle = scheduler.add_task(share, move |event: u64| {
            work.run();
            if let Some(me) = inner.get() {
                // Room is guaranteed (this event's slot was just freed); a closed task at
                // shutdown simply ends the loop.
                let _ = me.try_push(event);
            }
        })?;
        // The handler's handle to its own task is a cycle that shutdown breaks (it drops
        // handlers once nothing can run them).
        let _ = me.set(handle.clone());
        handles.push(handle);
    }
    for handle in &handles {
        for event in 0..in_flight as u64 {
            let _ = handle.try_push(event);
        }
    }
    let clock = MonotonicClock::new();
    sleep_ms(duration_ms.div_ceil(10).max(5));
    let (start_ns, start_events) = (clock.now_ns(), scheduler.stats().events_run);
    sleep_ms(duration_ms);
    let (end_ns, end_events) = (clock.now_ns(), scheduler.stats().events_run);
    scheduler.shutdown(ShutdownMode::Discard)?;
    Ok((end_events - start_events) as f64 / ns_per_s(end_ns - start_ns))
}

// ---------------------------------------------------------------------------------------------
// Fig. 5: throughput and delay against offered rate
// ---------------------------------------------------------------------------------------------

/// Parameters of [`rate_delay`].
#[derive(Debug, Clone, PartialEq)]
pub struct RateDelayConfig {
    /// Offered rates to try, events/s.
    pub offered_per_s: Vec<f64>,
    /// Duration of each point, milliseconds.
    pub duration_ms: u64,
    /// Worker threads (the publisher is one more thread).
    pub worker_threads: usize,
    /// Handler work per event.
    pub work: SpinWork,
    /// Capacity of the topic's queue; when full the publisher blocks, as a TCP sender would.
    pub task_queue_capacity: usize,
}

/// One point of Fig. 5.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateDelayPoint {
    /// What the publisher tried to send, events/s.
    pub offered_per_s: f64,
    /// What the handler received, events/s.
    pub delivered_per_s: f64,
    /// Mean delay from the push of an event to the start of its handler (the scheduler's
    /// queueing and wake-up delay), µs.
    pub delay_us_mean: f64,
    /// Median of that delay, µs.
    pub delay_us_p50: f64,
    /// 99th percentile of that delay, µs.
    pub delay_us_p99: f64,
    /// Mean delay from the event's *scheduled* send time to the start of its handler, µs: adds
    /// the time the publisher was held back (by a full queue past saturation, or by the OS).
    pub lag_us_mean: f64,
}

/// Fig. 5: one publisher paces events into one topic at each offered rate; the handler measures
/// the delay since each event's push, and since its *scheduled* send time (so that a publisher
/// held back by a full queue shows up, as in the paper where delay explodes past saturation).
pub fn rate_delay(config: &RateDelayConfig) -> Result<Vec<RateDelayPoint>, BenchError> {
    config
        .offered_per_s
        .iter()
        .map(|&rate| rate_delay_point(config, rate))
        .collect()
}

fn rate_delay_point(config: &RateDelayConfig, rate: f64) -> Result<RateDelayPoint, BenchError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(BenchError::Invalid("offered rates must be positive"));
    }
    let clock = Arc::new(MonotonicClock::new());
    let sched_config = SchedConfig {
        worker_threads: config.worker_threads.max(1),
        task_queue_capacity: config.task_queue_capacity,
        ..SchedConfig::default()
    };
    let scheduler = Scheduler::with_clock(sched_config, clock.clone())?;
    let delays: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let (handler_delays, handler_clock, work) =
        (Arc::clone(&delays), Arc::clone(&clock), config.work);
    let delivered = Arc::new(AtomicU64::new(0));
    let handler_delivered = Arc::clone(&delivered);
    let duration_ns = config.duration_ms * 1_000_000;
    let topic = scheduler.add_task(
        1.0,
        move |(index, scheduled_ns, pushed_ns): (u64, u64, u64)| {
            let now = handler_clock.now_ns();
            if now <= duration_ns {
                handler_delivered.fetch_add(1, Ordering::Relaxed);
            }
            // Sample one event in 16 to keep the recording cheap.
            if index % 16 == 0 {
                let mut delays = handler_delays.lock().unwrap_or_else(|e| e.into_inner());
                delays.push((
                    now.saturating_sub(pushed_ns),
                    now.saturating_sub(scheduled_ns),
                ));
            }
            work.run();
        },
    )?;
    let gap_ns = 1e9 / rate;
    let mut index = 0u64;
    loop {
        let scheduled_ns = (index as f64 * gap_ns) as u64;
        if scheduled_ns >= duration_ns {
            break;
        }
        // Pace: spin until the scheduled time (yielding keeps a 2-core machine usable).
        while clock.now_ns() < scheduled_ns {
            std::thread::yield_now();
        }
        if topic.push((index, scheduled_ns, clock.now_ns())).is_err() {
            break;
        }
        index += 1;
        if clock.now_ns() > duration_ns {
            break;
        }
    }
    scheduler.shutdown(ShutdownMode::Discard)?;
    let samples = std::mem::take(&mut *delays.lock().unwrap_or_else(|e| e.into_inner()));
    let lag_us_mean = mean_us(samples.iter().map(|s| s.1));
    let mut delays: Vec<u64> = samples.iter().map(|s| s.0).collect();
    delays.sort_unstable();
    let percentile = |p: f64| -> f64 {
        if delays.is_empty() {
            return 0.0;
        }
        let rank = ((delays.len() - 1) as f64 * p).round() as usize;
        delays[rank.min(delays.len() - 1)] as f64 / 1e3
    };
    let mean = mean_us(delays.iter().copied());
    Ok(RateDelayPoint {
        offered_per_s: rate,
        delivered_per_s: delivered.load(Ordering::Relaxed) as f64 / ns_per_s(duration_ns),
        delay_us_mean: mean,
        delay_us_p50: percentile(0.5),
        delay_us_p99: percentile(0.99),
        lag_us_mean,
    })
}

/// Mean of nanosecond samples, in µs (0 for none).
fn mean_us(samples: impl Iterator<Item = u64>) -> f64 {
    let (sum, count) = samples.fold((0.0, 0u64), |(sum, count), x| (sum + x as f64, count + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64 / 1e3
    }
}

// ---------------------------------------------------------------------------------------------
// Figs. 6-7: scaling with topics and threads, lock-free against mutex
// ---------------------------------------------------------------------------------------------

/// Parameters of [`scaling`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    /// Numbers of topics to try.
    pub topics: Vec<usize>,
    /// Numbers of worker threads to try.
    pub worker_threads: Vec<usize>,
    /// Task-set implementations to compare.
    pub task_sets: Vec<TaskSetKind>,
    /// Events kept in flight per topic (each handler re-queues its event).
    pub in_flight_per_topic: usize,
    /// Handler work per event.
    pub work: SpinWork,
    /// Duration of each run, milliseconds.
    pub duration_ms: u64,
    /// Runs per point; the point reports their median. Runs of the different task sets are
    /// interleaved, so that drifting background load on a shared machine hits them alike.
    pub repetitions: usize,
}

/// One point of Figs. 6-7.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalingPoint {
    /// The schedulable-task set used.
    pub task_set: TaskSetKind,
    /// Number of topics (tasks).
    pub topics: usize,
    /// Number of worker threads.
    pub worker_threads: usize,
    /// Events handled per second, all topics together (median of the repetitions).
    pub events_per_s: f64,
    /// Smallest and largest of the repetitions, events/s.
    pub events_per_s_range: (f64, f64),
}

/// Figs. 6-7, closed loop: every topic always has events (each handler re-queues its event), so
/// the measured rate is the scheduler's saturation throughput, with no publisher thread taking
/// a core from the workers.
pub fn scaling(config: &ScalingConfig) -> Result<Vec<ScalingPoint>, BenchError> {
    let mut points = Vec::new();
    for &topics in &config.topics {
        for &worker_threads in &config.worker_threads {
            let mut runs: Vec<Vec<f64>> = vec![Vec::new(); config.task_sets.len()];
            for _ in 0..config.repetitions.max(1) {
                for (index, &task_set) in config.task_sets.iter().enumerate() {
                    runs[index].push(closed_loop(
                        worker_threads,
                        topics,
                        config.work,
                        task_set,
                        config.in_flight_per_topic,
                        config.duration_ms,
                    )?);
                }
            }
            for (mut rates, &task_set) in runs.into_iter().zip(&config.task_sets) {
                rates.sort_by(f64::total_cmp);
                let events_per_s = rates[rates.len() / 2];
                let events_per_s_range = (rates[0], rates[rates.len() - 1]);
                points.push(ScalingPoint {
                    task_set,
                    topics,
                    worker_threads,
                    events_per_s,
                    events_per_s_range,
                });
            }
        }
    }
    Ok(points)
}

// ---------------------------------------------------------------------------------------------
// Fig. 8: share error over random configurations
// ---------------------------------------------------------------------------------------------

/// Parameters of [`share_error`] and [`share_error_simulated`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShareErrorConfig {
    /// Number of random configurations (the paper: 500).
    pub configurations: usize,
    /// Topics per configuration (the paper: 10).
    pub topics: usize,
    /// Worker threads (real-thread runs only).
    pub worker_threads: usize,
    /// Offered aggregate rate as a multiple of the measured capacity: 2.0 is the paper's
    /// saturation setting, below 1.0 is unsaturated.
    pub load_factor: f64,
    /// Mean of the Poisson distribution of shares (each share is `1 + Poisson`, normalised).
    pub share_poisson_mean: f64,
    /// Mean of the Poisson distribution of offered fractions (`1 + Poisson`, normalised).
    pub offered_poisson_mean: f64,
    /// Warm-up per configuration, ms (not measured).
    pub warmup_ms: u64,
    /// Measurement per configuration, ms (virtual ms for the simulated run).
    pub measure_ms: u64,
    /// Handler work per event.
    pub work: SpinWork,
    /// Seed of the configurations.
    pub seed: u64,
    /// `R_max` to scale the offered load to; `None` measures it first (closed loop, 300 ms).
    /// Passing one measurement to several experiments keeps them on the same scale.
    pub capacity_per_s: Option<f64>,
}

/// Result of a share-error experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareErrorResult {
    /// The capacity `R_max` the offered load was scaled to, events/s.
    pub capacity_per_s: f64,
    /// Relative error of every configuration, ascending.
    pub errors: Vec<f64>,
}

impl ShareErrorResult {
    /// Fraction of configurations whose relative error exceeds `threshold` (the CCDF).
    pub fn ccdf(&self, threshold: f64) -> f64 {
        if self.errors.is_empty() {
            return 0.0;
        }
        let above = self.errors.len() - self.errors.partition_point(|&e| e <= threshold);
        above as f64 / self.errors.len() as f64
    }

    /// Fraction of configurations within `threshold` (0.10 for the paper's "within 10%").
    pub fn fraction_within(&self, threshold: f64) -> f64 {
        1.0 - self.ccdf(threshold)
    }
}

/// One random configuration: shares and offered fractions from two Poisson distributions.
fn random_configuration(
    rng: &mut fastrand::Rng,
    config: &ShareErrorConfig,
) -> (Vec<f64>, Vec<f64>) {
    let draw = |rng: &mut fastrand::Rng, mean: f64| -> Vec<f64> {
        let raw: Vec<f64> = (0..config.topics)
            .map(|_| 1.0 + poisson(rng, mean) as f64)
            .collect();
        let total: f64 = raw.iter().sum();
        raw.iter().map(|x| x / total).collect()
    };
    let shares = draw(rng, config.share_poisson_mean);
    let fractions = draw(rng, config.offered_poisson_mean);
    (shares, fractions)
}

/// Knuth's Poisson sampler (fine for the small means used here).
fn poisson(rng: &mut fastrand::Rng, mean: f64) -> u64 {
    let limit = (-mean).exp();
    let mut product = rng.f64();
    let mut count = 0;
    while product > limit && count < 1_000 {
        product *= rng.f64();
        count += 1;
    }
    count
}

fn check_share_config(config: &ShareErrorConfig) -> Result<(), BenchError> {
    if config.configurations == 0 || config.topics == 0 || config.measure_ms == 0 {
        return Err(BenchError::Invalid(
            "configurations, topics and measure_ms must be positive",
        ));
    }
    if !(config.load_factor.is_finite() && config.load_factor > 0.0) {
        return Err(BenchError::Invalid("load_factor must be positive"));
    }
    Ok(())
}

/// Fig. 8 on real threads. For each random configuration, a generator thread (the caller) offers
/// `load_factor * capacity` events/s split by the random fractions (a full queue drops the
/// excess, as a blocked publisher would not send it); after the warm-up, each topic's delivered
/// rate is measured. As in the paper, the model's `R_max` is the aggregate rate actually
/// achieved in that run; the error is `|predicted - measured| / |measured|`.
pub fn share_error(config: &ShareErrorConfig) -> Result<ShareErrorResult, BenchError> {
    check_share_config(config)?;
    let threads = config.worker_threads.max(1);
    let capacity_per_s = match config.capacity_per_s {
        Some(capacity_per_s) => capacity_per_s,
        None => capacity(
            threads,
            config.topics,
            config.work,
            TaskSetKind::LockFree,
            300,
        )?,
    };
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut errors = Vec::with_capacity(config.configurations);
    for _ in 0..config.configurations {
        let (shares, fractions) = random_configuration(&mut rng, config);
        let offered: Vec<f64> = fractions
            .iter()
            .map(|f| f * config.load_factor * capacity_per_s)
            .collect();
        let measured = run_offered_load(threads, &shares, &offered, config)?;
        let achieved: f64 = measured.iter().sum();
        let predicted = expected_rates(&shares, &offered, achieved);
        errors.push(relative_error(&predicted, &measured));
    }
    errors.sort_by(f64::total_cmp);
    Ok(ShareErrorResult {
        capacity_per_s,
        errors,
    })
}

/// Offers `offered` events/s to tasks with `shares` on real workers; returns delivered events/s.
fn run_offered_load(
    worker_threads: usize,
    shares: &[f64],
    offered: &[f64],
    config: &ShareErrorConfig,
) -> Result<Vec<f64>, BenchError> {
    let sched_config = SchedConfig {
        worker_threads,
        task_queue_capacity: 8192,
        ..SchedConfig::default()
    };
    let scheduler = Scheduler::new(sched_config)?;
    let work = config.work;
    let tasks = shares
        .iter()
        .map(|&share| scheduler.add_task(share, move |_: ()| work.run()))
        .collect::<Result<Vec<_>, _>>()?;
    let clock = MonotonicClock::new();
    let start_ns = clock.now_ns();
    let mut window = PeriodWindow::new(start_ns, config);
    let mut sent = vec![0u64; tasks.len()];
    let counts = || {
        tasks
            .iter()
            .map(|t| t.stats().events_run)
            .collect::<Vec<_>>()
    };
    loop {
        let now = clock.now_ns();
        if window.observe(now, scheduler.epoch(), counts) {
            break;
        }
        let elapsed_s = ns_per_s(now - start_ns);
        for (i, task) in tasks.iter().enumerate() {
            let due = (offered[i] * elapsed_s) as u64;
            while sent[i] < due {
                match task.try_push(()) {
                    Ok(()) => sent[i] += 1,
                    // The publisher would block here; what it cannot send now is not sent.
                    Err(TryPushError::Full(())) | Err(TryPushError::Closed(())) => sent[i] = due,
                }
            }
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    scheduler.shutdown(ShutdownMode::Discard)?;
    window.rates()
}

/// The measurement window of a share-error run, aligned on credit periods.
///
/// Within one period the scheduler serves tasks in credit order (the best first), so a window
/// that cuts a period in the middle over-counts the tasks with most credit. The window therefore
/// opens and closes at a reset (an epoch change) after the warm-up and after the measuring time,
/// or 2 periods later if no reset comes (below saturation resets may not happen at all, and
/// then nothing depends on the cut).
struct PeriodWindow {
    warmup_end_ns: u64,
    measure_ns: u64,
    wait_ns_max: u64,
    /// (epoch, time) when the current boundary became due.
    due: Option<(u64, u64)>,
    begin: Option<(u64, Vec<u64>)>,
    end: Option<(u64, Vec<u64>)>,
}

impl PeriodWindow {
    fn new(start_ns: u64, config: &ShareErrorConfig) -> Self {
        Self {
            warmup_end_ns: start_ns + config.warmup_ms * 1_000_000,
            measure_ns: config.measure_ms * 1_000_000,
            wait_ns_max: 2 * SchedConfig::default().period_ns,
            due: None,
            begin: None,
            end: None,
        }
    }

    /// Feeds the time and epoch; takes `counts` at a boundary. `true` once the window closed.
    fn observe(&mut self, now_ns: u64, epoch: u64, counts: impl Fn() -> Vec<u64>) -> bool {
        let boundary_ns = match &self.begin {
            None => self.warmup_end_ns,
            Some((begin_ns, _)) => begin_ns + self.measure_ns,
        };
        if now_ns < boundary_ns {
            return false;
        }
        let Some((due_epoch, due_ns)) = self.due else {
            self.due = Some((epoch, now_ns));
            return false;
        };
        if epoch == due_epoch && now_ns - due_ns < self.wait_ns_max {
            return false;
        }
        self.due = None;
        if self.begin.is_none() {
            self.begin = Some((now_ns, counts()));
            false
        } else {
            self.end = Some((now_ns, counts()));
            true
        }
    }

    /// Events/s per task over the window.
    fn rates(&self) -> Result<Vec<f64>, BenchError> {
        let (Some((begin_ns, begin)), Some((end_ns, end))) = (&self.begin, &self.end) else {
            return Err(BenchError::Invalid("measurement window never closed"));
        };
        let seconds = ns_per_s(end_ns - begin_ns);
        Ok(end
            .iter()
            .zip(begin)
            .map(|(e, b)| (e - b) as f64 / seconds)
            .collect())
    }
}

/// Fig. 8 in virtual time: the same random configurations on one `run_once` worker with a
/// [`ManualClock`], each event costing a random 50-150 µs (so `R_max` is about 10 000 events/s).
/// Deterministic for a given seed; shows the error of the algorithm itself (quantization,
/// periods, non-preemption), free of the machine's noise.
pub fn share_error_simulated(config: &ShareErrorConfig) -> Result<ShareErrorResult, BenchError> {
    check_share_config(config)?;
    const COST_NS_MEAN: u64 = 100_000;
    let capacity_per_s = 1e9 / COST_NS_MEAN as f64;
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut errors = Vec::with_capacity(config.configurations);
    for _ in 0..config.configurations {
        let (shares, fractions) = random_configuration(&mut rng, config);
        let offered: Vec<f64> = fractions
            .iter()
            .map(|f| f * config.load_factor * capacity_per_s)
            .collect();
        let measured = simulate_offered_load(&shares, &offered, config, rng.u64(..))?;
        let achieved: f64 = measured.iter().sum();
        let predicted = expected_rates(&shares, &offered, achieved);
        errors.push(relative_error(&predicted, &measured));
    }
    errors.sort_by(f64::total_cmp);
    Ok(ShareErrorResult {
        capacity_per_s,
        errors,
    })
}

fn simulate_offered_load(
    shares: &[f64],
    offered: &[f64],
    config: &ShareErrorConfig,
    seed: u64,
) -> Result<Vec<f64>, BenchError> {
    let clock = Arc::new(ManualClock::new(0));
    let sched_config = SchedConfig {
        worker_threads: 0,
        task_queue_capacity: 256,
        ..SchedConfig::default()
    };
    let scheduler = Scheduler::with_clock(sched_config, clock.clone())?;
    let costs = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    let mut tasks = Vec::with_capacity(shares.len());
    for &share in shares {
        let (clock, costs) = (clock.clone(), costs.clone());
        tasks.push(scheduler.add_task(share, move |_: ()| {
            let cost = costs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .u64(50_000..=150_000);
            clock.advance_ns(cost);
        })?);
    }
    let mut window = PeriodWindow::new(0, config);
    let counts = || {
        tasks
            .iter()
            .map(|t| t.stats().events_run)
            .collect::<Vec<_>>()
    };
    let gap_ns: Vec<f64> = offered.iter().map(|r| 1e9 / r.max(1e-9)).collect();
    let mut next_ns: Vec<f64> = gap_ns.iter().map(|g| g / 2.0).collect();
    loop {
        let now = clock.now_ns();
        if window.observe(now, scheduler.epoch(), counts) {
            break;
        }
        for (i, task) in tasks.iter().enumerate() {
            while next_ns[i] <= now as f64 {
                // A full queue: the blocked publisher does not send this one.
                let _ = task.try_push(());
                next_ns[i] += gap_ns[i];
            }
        }
        if scheduler.run_once() == Step::Idle {
            let next = next_ns.iter().copied().fold(f64::INFINITY, f64::min);
            clock.advance_to_ns(next.ceil() as u64);
        }
    }
    scheduler.shutdown(ShutdownMode::Discard)?;
    window.rates()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ccdf_counts_configurations_above_the_threshold() {
        let result = ShareErrorResult {
            capacity_per_s: 1.0,
            errors: vec![0.01, 0.05, 0.2, 0.5],
        };
        assert_eq!(result.ccdf(0.1), 0.5);
        assert_eq!(result.fraction_within(0.1), 0.5);
        assert_eq!(result.ccdf(0.0), 1.0);
        assert_eq!(result.ccdf(1.0), 0.0);
    }

    #[test]
    fn poisson_sampler_has_the_right_mean() {
        let mut rng = fastrand::Rng::with_seed(1);
        let n = 20_000;
        let mean = (0..n).map(|_| poisson(&mut rng, 4.0) as f64).sum::<f64>() / n as f64;
        assert!((mean - 4.0).abs() < 0.1, "{mean}");
    }

    #[test]
    fn simulated_share_error_is_small_and_deterministic() {
        let config = ShareErrorConfig {
            configurations: 5,
            topics: 10,
            worker_threads: 1,
            load_factor: 2.0,
            share_poisson_mean: 4.0,
            offered_poisson_mean: 8.0,
            warmup_ms: 100,
            measure_ms: 400,
            work: SpinWork { iterations: 0 },
            seed: 42,
            capacity_per_s: None,
        };
        let a = share_error_simulated(&config).expect("runs");
        let b = share_error_simulated(&config).expect("runs");
        assert_eq!(a, b, "same seed, same result");
        assert_eq!(a.errors.len(), 5);
        assert!(a.fraction_within(0.10) >= 0.8, "{:?}", a.errors);
    }
}
