//! The scheduling loop of Fig. 1b, shared by worker threads, `run_once` and the loom models.

use crate::bucket::{BucketQueue, MutexBucketQueue, TaskSet};
use crate::clock::Clock;
use crate::config::{SchedConfig, TaskSetKind};
use crate::credit::{bucket_for_credit, full_credit_ns};
use crate::error::TryPushError;
use crate::sync::{
    handshake_fence, lock, wait, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering,
};
use crate::task::{Handler, Task};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::TryLockError;
use std::task::Waker;

/// What one scheduling step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Ran events of the task with the most credit (one, or a burst of up to
    /// `SchedConfig::burst_ns`) and charged their duration.
    Ran,
    /// The best task had no credit left: this step started a new period (reset every credit).
    Reset,
    /// The task taken had a credit from an earlier period (another thread reset meanwhile); its
    /// credit was renewed and it was put back without running.
    Requeued,
    /// The task taken had been removed; its queued events were dropped.
    Discarded,
    /// No task had events.
    Idle,
}

/// Scheduler-wide counters.
#[derive(Default)]
pub(crate) struct CoreCounters {
    pub(crate) events_run: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) requeues: AtomicU64,
    pub(crate) idle_waits: AtomicU64,
    pub(crate) handler_panics: AtomicU64,
    pub(crate) events_discarded: AtomicU64,
}

/// The shared state of a scheduler: the schedulable set, the epoch, the clock.
pub(crate) struct Core<E> {
    period_ns: u64,
    bucket_count: usize,
    task_queue_capacity: usize,
    /// How long a worker keeps running one task's events (`SchedConfig::burst_ns`).
    burst_ns: u64,
    /// How long an idle worker keeps looking before it sleeps (`SchedConfig::idle_spin_ns`).
    idle_spin_ns: u64,
    set: TaskSet<Arc<Task<E>>>,
    /// Incremented at every credit reset (section III-B).
    epoch: AtomicU64,
    /// A `std` Arc even under loom: the clock is an input, not part of the protocol.
    clock: std::sync::Arc<dyn Clock>,
    /// Workers asleep (or about to sleep) in `wait_for_work`.
    idle_workers: AtomicUsize,
    idle_lock: Mutex<()>,
    idle_cv: Condvar,
    /// Shutdown has begun: no new events are accepted.
    closed: AtomicBool,
    /// Workers must exit after their current event.
    stop: AtomicBool,
    next_task_id: AtomicU64,
    pub(crate) counters: CoreCounters,
}

impl<E: Send + 'static> Core<E> {
    /// A core for a validated `config`.
    pub(crate) fn new(config: &SchedConfig, clock: std::sync::Arc<dyn Clock>) -> Self {
        let bucket_total = config.bucket_count + 1;
        let set = match config.task_set {
            TaskSetKind::LockFree => TaskSet::LockFree(BucketQueue::new(
                bucket_total,
                config.effective_bucket_group_size(),
                config.bucket_ring_capacity,
            )),
            TaskSetKind::Mutex => TaskSet::Mutex(MutexBucketQueue::new(bucket_total)),
        };
        Self {
            period_ns: config.period_ns,
            bucket_count: config.bucket_count,
            task_queue_capacity: config.task_queue_capacity,
            burst_ns: config.burst_ns,
            idle_spin_ns: config.idle_spin_ns,
            set,
            epoch: AtomicU64::new(0),
            clock,
            idle_workers: AtomicUsize::new(0),
            idle_lock: Mutex::new(()),
            idle_cv: Condvar::new(),
            closed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            next_task_id: AtomicU64::new(0),
            counters: CoreCounters::default(),
        }
    }

    /// A new task with a validated `share`, a full credit, and no events (so not in the set).
    pub(crate) fn new_task(&self, share: f64, handler: Handler<E>) -> Arc<Task<E>> {
        let id = self.next_task_id.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let credit_ns = full_credit_ns(share, self.period_ns);
        Arc::new(Task::new(
            id,
            self.task_queue_capacity,
            share,
            credit_ns,
            epoch,
            handler,
        ))
    }

    /// The current epoch (number of credit resets so far).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Whether workers must stop now.
    pub(crate) fn must_stop(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Puts a task that the caller holds into the schedulable set.
    ///
    /// If a reset happened since the task's credit was set, the credit is renewed first, minus
    /// `charge_ns` (the event the holder just ran, which belongs to the new period): this is the
    /// epoch check of section III-B that corrects a task that was busy during a reset.
    ///
    /// `wake_idle` wakes a sleeping worker. Writers (a task becoming schedulable) and resets do;
    /// a worker putting back the task it just ran does not, because it is itself about to take
    /// the best task: waking another worker there would cost a futex call per event and, with
    /// one busy task, wake a thread that finds nothing to do. Any task a worker may skip in favour
    /// of a better one was put by a writer or a reset, which woke a worker for it.
    fn put_task(&self, task: Arc<Task<E>>, charge_ns: u64, wake_idle: bool) {
        let epoch = self.epoch.load(Ordering::SeqCst);
        if task.credit_epoch() != epoch {
            task.set_credit(full_credit_ns(task.share(), self.period_ns), epoch);
            task.charge(charge_ns);
        }
        let bucket = bucket_for_credit(task.credit_ns(), self.period_ns, self.bucket_count);
        self.set.put(task, bucket);
        if !wake_idle {
            return;
        }
        // Pairs with `wait_for_work`: the put raised the set's counts, an idle worker raises
        // `idle_workers`; each then fences and reads the other's, so one of the two sees the other.
        handshake_fence();
        if self.idle_workers.load(Ordering::SeqCst) > 0 {
            // Take the lock and let it go before notifying. A worker between its look at the set
            // and its wait holds the lock, so once this thread has had it that worker is waiting
            // on the condvar and the notify reaches it; notifying after the release spares the
            // woken worker blocking on a lock this thread still holds (a second futex call and a
            // second wake-up on the delivery path).
            drop(lock(&self.idle_lock));
            self.idle_cv.notify_one();
        }
    }

    /// `try_push`: enqueue without waiting, and put the task into the set if it had no events.
    pub(crate) fn try_push(&self, task: &Arc<Task<E>>, event: E) -> Result<(), TryPushError<E>> {
        if self.is_closed() {
            return Err(TryPushError::Closed(event));
        }
        if task.enqueue(event)? {
            self.put_task(Arc::clone(task), 0, true);
        }
        Ok(())
    }

    /// `push`: enqueue, sleeping while the task's queue is full. `Err` hands back the event of a
    /// closed task.
    pub(crate) fn push_blocking(&self, task: &Arc<Task<E>>, mut event: E) -> Result<(), E> {
        loop {
            match self.try_push(task, event) {
                Ok(()) => return Ok(()),
                Err(TryPushError::Closed(back)) => return Err(back),
                Err(TryPushError::Full(back)) => event = back,
            }
            if self.is_closed() {
                return Err(event);
            }
            match task.enqueue_or_wait(event) {
                Ok(schedulable) => {
                    if schedulable {
                        self.put_task(Arc::clone(task), 0, true);
                    }
                    return Ok(());
                }
                Err(TryPushError::Closed(back)) => return Err(back),
                Err(TryPushError::Full(back)) => event = back,
            }
        }
    }

    /// One poll of an asynchronous push: `Ok(Ok(()))` done, `Ok(Err(e))` still full (the waker is
    /// parked), `Err(e)` closed.
    pub(crate) fn poll_push(
        &self,
        task: &Arc<Task<E>>,
        event: E,
        waker: &Waker,
    ) -> Result<Result<(), E>, E> {
        let event = match self.try_push(task, event) {
            Ok(()) => return Ok(Ok(())),
            Err(TryPushError::Closed(back)) => return Err(back),
            Err(TryPushError::Full(back)) => back,
        };
        if self.is_closed() {
            return Err(event);
        }
        match task.enqueue_or_park(event, waker) {
            Ok(schedulable) => {
                if schedulable {
                    self.put_task(Arc::clone(task), 0, true);
                }
                Ok(Ok(()))
            }
            Err(TryPushError::Closed(back)) => Err(back),
            Err(TryPushError::Full(back)) => Ok(Err(back)),
        }
    }

    /// One iteration of the scheduling thread of Fig. 1b.
    pub(crate) fn step(&self) -> Step {
        self.step_with(&mut Vec::new())
    }

    /// [`step`](Self::step) with a caller-owned scratch list for the tasks a reset drains, so
    /// that a worker's resets reuse one allocation (the list grows to the number of tasks and
    /// stays): resets happen every period, 100 times a second by default.
    pub(crate) fn step_with(&self, scratch: &mut Vec<Arc<Task<E>>>) -> Step {
        let Some((task, _bucket)) = self.set.get() else {
            return Step::Idle;
        };
        if task.is_discarding() {
            let dropped = task.drop_queued();
            self.counters
                .events_discarded
                .fetch_add(dropped as u64, Ordering::Relaxed);
            if task.finish(dropped) {
                // A writer raced with the removal: its event is dropped on the next visit.
                self.put_task(task, 0, false);
            }
            return Step::Discarded;
        }
        let epoch = self.epoch.load(Ordering::SeqCst);
        if task.credit_epoch() != epoch {
            // Put into the set before a reset that did not drain it: renew and retry.
            self.counters.requeues.fetch_add(1, Ordering::Relaxed);
            self.put_task(task, 0, false);
            return Step::Requeued;
        }
        if task.credit_ns() <= 0 {
            // The task with the most credit has none: the period is over (line 3 of Fig. 1b).
            // Only the thread that moves the epoch on resets; a thread that loses the race just
            // renews this task's credit (the epoch has moved) and puts it back.
            if self
                .epoch
                .compare_exchange(epoch, epoch + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.reset_all_credits(task, scratch);
                return Step::Reset;
            }
            self.counters.requeues.fetch_add(1, Ordering::Relaxed);
            self.put_task(task, 0, false);
            return Step::Requeued;
        }
        let (ran, run_ns) = self.run_burst(&task);
        self.counters
            .events_run
            .fetch_add(ran as u64, Ordering::Relaxed);
        if task.finish(ran) {
            self.put_task(task, run_ns, false);
        }
        Step::Ran
    }

    /// Runs the task's queued events, one at least, for up to `burst_ns`, and charges their
    /// measured duration (lines 7-10 of Fig. 1b, with the burst taking the place of one event):
    /// how many ran, and for how long.
    ///
    /// Only the holder of the task runs this. `queue_size` counts events whose push is complete,
    /// so every one it counts can be dequeued; it is read again when those are used up, to take
    /// events pushed meanwhile into the same burst.
    fn run_burst(&self, task: &Task<E>) -> (usize, u64) {
        let mut handler = match task.handler.try_lock() {
            Ok(handler) => handler,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                panic!("task {} dispatched on two threads at once", task.id)
            }
        };
        let mut available = task.queue_size();
        let start_ns = self.clock.now_ns();
        let mut end_ns = start_ns;
        let mut ran = 0;
        // The clock is read after event `next_read`; `timed` events are covered by `end_ns`.
        let (mut stride, mut next_read, mut timed) = (1, 1, 0);
        loop {
            let event = task.dequeue();
            let outcome = catch_unwind(AssertUnwindSafe(|| (*handler)(event)));
            ran += 1;
            if outcome.is_err() {
                // The application's bug, not ours: count it and keep delivering.
                self.counters.handler_panics.fetch_add(1, Ordering::Relaxed);
            }
            if ran == next_read {
                // The end of one timed stretch is the start of the next.
                end_ns = self.clock.now_ns();
                timed = ran;
                let elapsed = end_ns.saturating_sub(start_ns);
                if elapsed >= self.burst_ns {
                    break;
                }
                stride = next_clock_stride(stride, elapsed, ran, self.burst_ns);
                next_read = ran + stride;
            }
            if self.must_stop() || task.is_discarding() {
                break;
            }
            if ran == available {
                available = task.queue_size();
                if ran == available {
                    break;
                }
            }
        }
        if timed != ran {
            end_ns = self.clock.now_ns();
        }
        drop(handler);
        let run_ns = end_ns.saturating_sub(start_ns);
        task.charge(run_ns);
        task.counters
            .events_run
            .fetch_add(ran as u64, Ordering::Relaxed);
        task.counters.run_ns.fetch_add(run_ns, Ordering::Relaxed);
        (ran, run_ns)
    }

    /// Starts a new period: takes every task out of the set, renews its credit for the new epoch
    /// and puts it back (section III-B). Tasks held by other threads are renewed when those
    /// threads put them back. Terminates: each task is in the set at most once and the drained
    /// ones are held here (in `drained`, empty on entry and on return) until the end.
    fn reset_all_credits(&self, first: Arc<Task<E>>, drained: &mut Vec<Arc<Task<E>>>) {
        debug_assert!(drained.is_empty());
        self.counters.resets.fetch_add(1, Ordering::Relaxed);
        drained.push(first);
        while let Some((task, _bucket)) = self.set.get() {
            drained.push(task);
        }
        for task in drained.drain(..) {
            self.put_task(task, 0, true);
        }
    }

    /// Sleeps until a task may be schedulable or shutdown begins; `false` if it returned at once
    /// because the set may already hold a task (possibly one whose put is still in flight: the
    /// caller should back off briefly and step again). Spurious returns are allowed.
    pub(crate) fn wait_for_work(&self) -> bool {
        let guard = lock(&self.idle_lock);
        self.idle_workers.fetch_add(1, Ordering::SeqCst);
        handshake_fence();
        let sleep = !self.set.maybe_nonempty() && !self.is_closed() && !self.must_stop();
        if sleep {
            self.counters.idle_waits.fetch_add(1, Ordering::Relaxed);
            let guard = wait(&self.idle_cv, guard);
            drop(guard);
        }
        self.idle_workers.fetch_sub(1, Ordering::SeqCst);
        sleep
    }

    /// Begins shutdown: refuse new events, and with `stop_now` make workers exit after their
    /// current event. Wakes idle workers.
    pub(crate) fn begin_shutdown(&self, stop_now: bool) {
        self.closed.store(true, Ordering::SeqCst);
        if stop_now {
            self.stop.store(true, Ordering::SeqCst);
        }
        let _guard = lock(&self.idle_lock);
        self.idle_cv.notify_all();
    }

    /// Puts into the set that spilled past a bucket's preallocated ring.
    pub(crate) fn bucket_spills(&self) -> u64 {
        self.set.spills()
    }

    /// Whether the set may hold a task (for shutdown draining).
    pub(crate) fn maybe_has_work(&self) -> bool {
        self.set.maybe_nonempty()
    }

    /// The scheduler's clock, in nanoseconds (a worker times its idle spin with it).
    pub(crate) fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// How long an idle worker keeps looking for work before it sleeps
    /// (`SchedConfig::idle_spin_ns`).
    pub(crate) fn idle_spin_ns(&self) -> u64 {
        self.idle_spin_ns
    }
}

/// Most events a burst runs between two clock reads.
const CLOCK_STRIDE_MAX: usize = 8;

/// How many events to run before the burst's next clock read: twice the last stride while the
/// events so far average under 1/64 of the burst (so a whole stride of such events stays within
/// an eighth of it), else one. A clock read costs about as much as a short delivery's own work,
/// so reading after every event was a large part of a worker's overhead at a million events a
/// second; the charge stays exact (it is the time from the first read to the last, which follows
/// the last event), and a burst overruns by at most `CLOCK_STRIDE_MAX - 1` events that turned
/// slow after a fast start. Events that cost a measurable part of the burst are timed one by one,
/// as before (and in the loom models, whose clock moves a whole tick per read).
fn next_clock_stride(stride: usize, elapsed_ns: u64, ran: usize, burst_ns: u64) -> usize {
    let events = u64::try_from(ran).unwrap_or(u64::MAX).max(1);
    if elapsed_ns / events < burst_ns / 64 {
        (stride * 2).min(CLOCK_STRIDE_MAX)
    } else {
        1
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::{OnceLock, Weak};

    /// A [`ManualClock`] that counts its readings.
    struct CountingClock {
        clock: ManualClock,
        reads: AtomicU64,
    }

    impl Clock for CountingClock {
        fn now_ns(&self) -> u64 {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.clock.now_ns()
        }
    }

    /// A core with one task whose events cost `cost_ns(event)` of clock time; `events` queued.
    fn burst_core(
        burst_ns: u64,
        events: u32,
        cost_ns: fn(u32) -> u64,
    ) -> (Arc<Core<u32>>, Arc<Task<u32>>, Arc<CountingClock>) {
        let clock = Arc::new(CountingClock {
            clock: ManualClock::new(0),
            reads: AtomicU64::new(0),
        });
        let config = SchedConfig {
            burst_ns,
            worker_threads: 0,
            ..SchedConfig::default()
        };
        let core: Arc<Core<u32>> = Arc::new(Core::new(&config, clock.clone()));
        let advance = clock.clone();
        let task = core.new_task(
            1.0,
            Box::new(move |event| advance.clock.advance_ns(cost_ns(event))),
        );
        for event in 0..events {
            assert!(core.try_push(&task, event).is_ok());
        }
        (core, task, clock)
    }

    /// Short events are timed in strides (1, 2, 4, then 8 events per clock read) and the burst
    /// is still charged its exact duration.
    #[test]
    fn a_burst_of_short_events_reads_the_clock_once_per_stride() {
        let (core, task, clock) = burst_core(50_000, 64, |_| 10);
        assert_eq!(core.step(), Step::Ran);
        let stats = task.counters.events_run.load(Ordering::SeqCst);
        assert_eq!(stats, 64, "one burst runs every queued event");
        assert_eq!(
            task.counters.run_ns.load(Ordering::SeqCst),
            640,
            "charged exactly"
        );
        // The start, after events 1, 3, 7, 15, 23, ..., 63, and the end (after event 64).
        assert_eq!(clock.reads.load(Ordering::SeqCst), 1 + 10 + 1);
    }

    /// Events that cost a measurable part of the burst are timed one by one, so the burst ends
    /// right after the event that uses it up (as with a read per event).
    #[test]
    fn a_burst_of_long_events_reads_the_clock_after_each() {
        let (core, task, clock) = burst_core(50_000, 64, |_| 20_000);
        assert_eq!(core.step(), Step::Ran);
        assert_eq!(task.counters.events_run.load(Ordering::SeqCst), 3);
        assert_eq!(task.counters.run_ns.load(Ordering::SeqCst), 60_000);
        assert_eq!(clock.reads.load(Ordering::SeqCst), 1 + 3);
    }

    /// Events that turn slow after a fast start overrun the burst by less than one stride.
    #[test]
    fn a_burst_whose_events_turn_slow_overruns_by_less_than_a_stride() {
        let (core, task, _clock) = burst_core(50_000, 64, |e| if e < 15 { 10 } else { 30_000 });
        assert_eq!(core.step(), Step::Ran);
        let ran = task.counters.events_run.load(Ordering::SeqCst);
        // Read after 15 (fast so far: next read after 23); events 16-23 are slow.
        assert_eq!(ran, 23);
        assert!(ran - 15 <= CLOCK_STRIDE_MAX as u64);
        assert_eq!(
            task.counters.run_ns.load(Ordering::SeqCst),
            15 * 10 + 8 * 30_000
        );
    }

    /// Section III-B: a thread that was running a task while another thread reset the credits
    /// renews that task's credit (minus the event it just ran) before putting it back.
    ///
    /// The "other thread" is simulated deterministically: X's first handler itself calls `step`,
    /// which finds only the exhausted task Y and resets.
    #[test]
    fn a_task_busy_during_a_reset_is_corrected_at_put_back() {
        let clock = Arc::new(ManualClock::new(0));
        let config = SchedConfig {
            period_ns: 1_000_000,
            worker_threads: 0,
            ..SchedConfig::default()
        };
        let core: Arc<Core<&'static str>> = Arc::new(Core::new(&config, clock.clone()));
        let order = Arc::new(Mutex::new(Vec::new()));
        let me: Arc<OnceLock<Weak<Core<&'static str>>>> = Arc::new(OnceLock::new());
        let (x_clock, x_order, x_me) = (clock.clone(), order.clone(), me.clone());
        // X: share 0.5 (500 µs), events cost 100 µs; its first event triggers the nested step.
        let x = core.new_task(
            0.5,
            Box::new(move |event| {
                lock(&x_order).push(event);
                x_clock.advance_ns(100_000);
                if event == "x1" {
                    let core = x_me.get().and_then(Weak::upgrade).expect("core alive");
                    assert_eq!(core.step(), Step::Reset);
                }
            }),
        );
        // Y: share 0.6 (600 µs), events cost 700 µs: one event exhausts it.
        let (y_clock, y_order) = (clock.clone(), order.clone());
        let y = core.new_task(
            0.6,
            Box::new(move |event| {
                lock(&y_order).push(event);
                y_clock.advance_ns(700_000);
            }),
        );
        me.set(Arc::downgrade(&core)).expect("set once");
        for (task, event) in [(&y, "y1"), (&y, "y2"), (&x, "x1"), (&x, "x2")] {
            assert!(core.try_push(task, event).is_ok());
        }
        // Y (600 µs) is ahead of X (500 µs): Y1 runs and leaves Y exhausted (-100 µs).
        assert_eq!(core.step(), Step::Ran);
        assert_eq!(y.credit_ns(), -100_000);
        // X1 runs; meanwhile the nested step finds only exhausted Y and resets (epoch 0 -> 1).
        assert_eq!(core.step(), Step::Ran);
        assert_eq!(core.epoch(), 1);
        // X was busy during the reset: it comes back renewed for epoch 1, minus X1's 100 µs.
        assert_eq!(x.credit_epoch(), 1);
        assert_eq!(x.credit_ns(), 400_000);
        let mut steps = Vec::new();
        loop {
            match core.step() {
                Step::Idle => break,
                step => steps.push(step),
            }
        }
        assert_eq!(*lock(&order), vec!["y1", "x1", "y2", "x2"]);
        assert_eq!(steps, vec![Step::Ran, Step::Ran], "no stale requeue");
        assert_eq!(core.counters.requeues.load(Ordering::Relaxed), 0);
    }
}
