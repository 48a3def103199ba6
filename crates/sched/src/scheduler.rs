//! The public face: [`Scheduler`], its worker threads, and [`TaskHandle`].

use crate::clock::{Clock, MonotonicClock};
use crate::config::SchedConfig;
use crate::core::{Core, Step};
use crate::credit::share_is_valid;
use crate::error::{PushError, ShareError, ShutdownError, StartError, TryPushError};
use crate::sync::{lock, Arc, Mutex, Ordering};
use crate::task::Task;
use crossbeam_utils::Backoff;
use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};
use std::thread::JoinHandle;

/// Identity of a task within its scheduler (assigned in creation order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

/// What to do with queued events at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Refuse new events, run every event already accepted, then stop. Events that workers have
    /// not reached when they stop (only those pushed concurrently with the shutdown call) are run
    /// on the calling thread, so every accepted event is delivered exactly once.
    Drain,
    /// Stop after the events now running; queued events are dropped (and counted).
    Discard,
}

/// Counters of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskStats {
    /// Events run by the handler.
    pub events_run: u64,
    /// Total measured handler time, in nanoseconds (what was charged to the credit).
    pub run_ns: u64,
    /// Events dropped because the task was removed or the scheduler discarded them.
    pub events_discarded: u64,
    /// Times a writer found the queue full and had to wait.
    pub writer_waits: u64,
    /// Events queued now (a snapshot).
    pub queue_len: u64,
}

/// Counters of a scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedStats {
    /// Events run, all tasks together.
    pub events_run: u64,
    /// Credit resets (periods ended), which is also the current epoch.
    pub resets: u64,
    /// Tasks put back without running because their credit was from an earlier epoch.
    pub requeues: u64,
    /// Times a worker went to sleep for lack of work.
    pub idle_waits: u64,
    /// Handler panics caught (the task keeps running).
    pub handler_panics: u64,
    /// Events dropped from removed tasks.
    pub events_discarded: u64,
    /// Puts into the schedulable set that found their priority bucket's preallocated ring full
    /// (`SchedConfig::bucket_ring_capacity`) and went to its spill queue, which allocates. Zero
    /// while no more tasks share a priority level than the ring holds.
    pub bucket_spills: u64,
}

/// The delivery scheduler of paper 003: worker threads run tasks' events by time-based credit.
///
/// Each task (a subscription or topic) has a share `v` in `(0, 1]` and receives `v * T` of
/// credit per period `T`. Workers take the task with the most credit, run exactly one of its
/// events, charge the measured time, and put the task back while it has events; when the best
/// task has no credit left, all credits are reset. A task runs on one thread at a time, so its
/// events are handled in push order. Pushing never runs a handler on the caller's thread: the
/// node's core thread can feed deliveries without running application code.
///
/// ```
/// use tidings_sched::{SchedConfig, Scheduler, ShutdownMode};
/// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
///
/// let scheduler = Scheduler::new(SchedConfig { worker_threads: 2, ..SchedConfig::default() })?;
/// let sum = Arc::new(AtomicU64::new(0));
/// let seen = Arc::clone(&sum);
/// let topic = scheduler.add_task(0.5, move |x: u64| { seen.fetch_add(x, Ordering::Relaxed); })?;
/// for x in 1..=100 {
///     topic.push(x).map_err(|_| "closed")?;
/// }
/// scheduler.shutdown(ShutdownMode::Drain)?;
/// assert_eq!(sum.load(Ordering::Relaxed), 5050);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Scheduler<E: Send + 'static> {
    core: Arc<Core<E>>,
    workers: Vec<JoinHandle<()>>,
    /// Every task created, so that shutdown can close them and wake their blocked writers.
    tasks: Mutex<Vec<Weak<Task<E>>>>,
}

impl<E: Send + 'static> Scheduler<E> {
    /// A scheduler measuring with the real monotonic clock, with `config.worker_threads` workers.
    pub fn new(config: SchedConfig) -> Result<Self, StartError> {
        Self::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A scheduler measuring event durations with `clock`.
    ///
    /// With `worker_threads: 0` and a [`ManualClock`](crate::ManualClock) nothing runs unless the
    /// caller calls [`run_once`](Self::run_once): the scheduler is then deterministic.
    pub fn with_clock(config: SchedConfig, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        config.validate()?;
        let core = Arc::new(Core::new(&config, clock));
        let mut scheduler = Self {
            core: Arc::clone(&core),
            workers: Vec::new(),
            tasks: Mutex::new(Vec::new()),
        };
        for index in 0..config.worker_threads {
            let core = Arc::clone(&core);
            let spawned = std::thread::Builder::new()
                .name(format!("{}-{index}", config.thread_name_prefix))
                .spawn(move || worker_loop(&core));
            match spawned {
                Ok(handle) => scheduler.workers.push(handle),
                // Dropping `scheduler` stops and joins the workers already started.
                Err(error) => return Err(StartError::Spawn(error)),
            }
        }
        Ok(scheduler)
    }

    /// Adds a task with `share` in `(0, 1]` whose events `handler` runs, one at a time, in push
    /// order, on a worker thread. The task has no events yet.
    ///
    /// Shares are relative weights: only their ratios among busy tasks matter (section II).
    pub fn add_task<H>(&self, share: f64, handler: H) -> Result<TaskHandle<E>, ShareError>
    where
        H: FnMut(E) + Send + 'static,
    {
        if !share_is_valid(share) {
            return Err(ShareError { share });
        }
        let task = self.core.new_task(share, Box::new(handler));
        let mut tasks = lock(&self.tasks);
        // Forget dropped tasks now and then, so the registry stays proportional to live tasks.
        if tasks.len() >= 64 && tasks.len() == tasks.capacity() {
            tasks.retain(|weak| weak.strong_count() > 0);
        }
        tasks.push(Arc::downgrade(&task));
        drop(tasks);
        Ok(TaskHandle {
            task,
            core: Arc::clone(&self.core),
        })
    }

    /// Runs one scheduling step on the calling thread (which then runs a handler).
    ///
    /// For `worker_threads: 0` (deterministic tests, the simulator); also safe beside workers.
    /// Never call it on the node's core thread: it runs application callbacks.
    pub fn run_once(&self) -> Step {
        self.core.step()
    }

    /// The current counters.
    pub fn stats(&self) -> SchedStats {
        let c = &self.core.counters;
        SchedStats {
            events_run: c.events_run.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            requeues: c.requeues.load(Ordering::Relaxed),
            idle_waits: c.idle_waits.load(Ordering::Relaxed),
            handler_panics: c.handler_panics.load(Ordering::Relaxed),
            events_discarded: c.events_discarded.load(Ordering::Relaxed),
            bucket_spills: self.core.bucket_spills(),
        }
    }

    /// The number of credit resets so far (the epoch counter of section III-B).
    pub fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    /// Number of worker threads.
    pub fn worker_threads(&self) -> usize {
        self.workers.len()
    }

    /// Stops the scheduler and joins its workers; see [`ShutdownMode`]. Writers blocked on a full
    /// queue are woken and get their event back; handlers are dropped once nothing can run them.
    /// Returns the final counters.
    pub fn shutdown(mut self, mode: ShutdownMode) -> Result<SchedStats, ShutdownError> {
        self.stop_and_join(mode)?;
        Ok(self.stats())
    }

    fn stop_and_join(&mut self, mode: ShutdownMode) -> Result<(), ShutdownError> {
        let discard = mode == ShutdownMode::Discard;
        self.core.begin_shutdown(discard);
        let tasks: Vec<_> = lock(&self.tasks).iter().filter_map(Weak::upgrade).collect();
        for task in &tasks {
            task.close(discard);
        }
        let mut panicked = 0;
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                panicked += 1;
            }
        }
        if panicked > 0 {
            return Err(ShutdownError { panicked });
        }
        // Drain what workers left (events pushed concurrently with the shutdown, or everything
        // when there are no workers), or drop it when discarding.
        while self.core.step() != Step::Idle {}
        // Nothing will run again: drop the handlers, releasing what they captured (including
        // handles to their own task, which would otherwise keep the task alive forever).
        for task in &tasks {
            task.drop_handler();
        }
        Ok(())
    }
}

impl<E: Send + 'static> Drop for Scheduler<E> {
    fn drop(&mut self) {
        if !self.workers.is_empty() || !self.core.is_closed() {
            // Not shut down explicitly: stop without running queued events. A worker panic has no
            // one to report to here; it was already printed by the panic hook.
            let _ = self.stop_and_join(ShutdownMode::Discard);
        }
    }
}

impl<E: Send + 'static> std::fmt::Debug for Scheduler<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("worker_threads", &self.workers.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The loop of a worker thread: steps; when idle, a short backoff (a few spins, then a few
/// yields), then (with `SchedConfig::idle_spin_ns`) more looks until that long after it last
/// found work, then a sleep until a writer wakes it.
///
/// The yields stay although a yield on a host whose cores other processes want can give the
/// core away for the rest of a time slice: on two cores shared by a node's core thread and its
/// worker, a yield hands the core to the thread that makes the next delivery, which costs less
/// than sleeping and being woken for it (without them CPU per message at full rate rose 15-20%,
/// ADR 45).
fn worker_loop<E: Send + 'static>(core: &Core<E>) {
    let backoff = Backoff::new();
    // The tasks a reset drains: kept across steps, so resets do not allocate.
    let mut scratch = Vec::new();
    // When the idle spin of this idle stretch began, if it has.
    let mut spinning_since: Option<u64> = None;
    loop {
        if core.must_stop() {
            return;
        }
        match core.step_with(&mut scratch) {
            Step::Idle => {
                if core.is_closed() && !core.maybe_has_work() {
                    return;
                }
                if !backoff.is_completed() {
                    backoff.snooze();
                    continue;
                }
                let spin_ns = core.idle_spin_ns();
                if spin_ns > 0 {
                    let now = core.now_ns();
                    let since = *spinning_since.get_or_insert(now);
                    if now.saturating_sub(since) < spin_ns {
                        std::hint::spin_loop();
                        continue;
                    }
                }
                if core.wait_for_work() {
                    backoff.reset();
                    spinning_since = None;
                } else {
                    // A put is in flight (counted, not yet visible): yield to it.
                    std::thread::yield_now();
                }
            }
            _ => {
                backoff.reset();
                spinning_since = None;
            }
        }
    }
}

/// A task: push events to it, change its share, remove it. Cloneable; all clones are the same
/// task. Holding a handle keeps the task (and its handler) alive.
pub struct TaskHandle<E: Send + 'static> {
    task: Arc<Task<E>>,
    core: Arc<Core<E>>,
}

impl<E: Send + 'static> Clone for TaskHandle<E> {
    fn clone(&self) -> Self {
        Self {
            task: Arc::clone(&self.task),
            core: Arc::clone(&self.core),
        }
    }
}

impl<E: Send + 'static> std::fmt::Debug for TaskHandle<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle")
            .field("id", &self.id())
            .field("share", &self.share())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl<E: Send + 'static> TaskHandle<E> {
    /// The task's identity.
    pub fn id(&self) -> TaskId {
        TaskId(self.task.id)
    }

    /// Queues `event` if there is room; never waits. `Full` is the `WouldBlock` case.
    pub fn try_push(&self, event: E) -> Result<(), TryPushError<E>> {
        self.core.try_push(&self.task, event)
    }

    /// Queues `event`, blocking the calling thread while the queue is full. A worker that takes
    /// an event wakes it. Fails only if the task is removed or the scheduler shuts down.
    pub fn push(&self, event: E) -> Result<(), PushError<E>> {
        self.core
            .push_blocking(&self.task, event)
            .map_err(PushError)
    }

    /// Queues `event`, waiting asynchronously while the queue is full (no executor required:
    /// the worker that frees a slot wakes the future's waker).
    pub fn push_async(&self, event: E) -> PushFuture<'_, E> {
        PushFuture {
            handle: self,
            event: Some(event),
        }
    }

    /// Changes the share; it takes effect when the task's credit is next renewed (at the latest
    /// one period later).
    pub fn set_share(&self, share: f64) -> Result<(), ShareError> {
        if !share_is_valid(share) {
            return Err(ShareError { share });
        }
        self.task.set_share(share);
        Ok(())
    }

    /// The current share.
    pub fn share(&self) -> f64 {
        self.task.share()
    }

    /// Removes the task: new pushes fail, blocked writers are woken with their event, and queued
    /// events are dropped (counted in [`TaskStats::events_discarded`]). An event already running
    /// finishes. Idempotent.
    pub fn remove(&self) {
        self.task.close(true);
    }

    /// Whether the task refuses new events (removed, or the scheduler shut down).
    pub fn is_closed(&self) -> bool {
        self.task.is_closed() || self.core.is_closed()
    }

    /// Events queued now.
    pub fn queue_len(&self) -> usize {
        self.task.queue_len()
    }

    /// The task's counters.
    pub fn stats(&self) -> TaskStats {
        let c = &self.task.counters;
        TaskStats {
            events_run: c.events_run.load(Ordering::Relaxed),
            run_ns: c.run_ns.load(Ordering::Relaxed),
            events_discarded: c.events_discarded.load(Ordering::Relaxed),
            writer_waits: c.writer_waits.load(Ordering::Relaxed),
            queue_len: self.task.queue_len() as u64,
        }
    }

    /// A handle that does not keep the task alive: for handlers that push to their own task
    /// (holding a strong handle there would be a reference cycle).
    pub fn downgrade(&self) -> WeakTaskHandle<E> {
        WeakTaskHandle {
            task: Arc::downgrade(&self.task),
            core: Arc::downgrade(&self.core),
        }
    }
}

/// A non-owning [`TaskHandle`].
pub struct WeakTaskHandle<E: Send + 'static> {
    task: Weak<Task<E>>,
    core: Weak<Core<E>>,
}

impl<E: Send + 'static> Clone for WeakTaskHandle<E> {
    fn clone(&self) -> Self {
        Self {
            task: Weak::clone(&self.task),
            core: Weak::clone(&self.core),
        }
    }
}

impl<E: Send + 'static> WeakTaskHandle<E> {
    /// The task, if it is still alive.
    pub fn upgrade(&self) -> Option<TaskHandle<E>> {
        Some(TaskHandle {
            task: self.task.upgrade()?,
            core: self.core.upgrade()?,
        })
    }
}

/// The future of [`TaskHandle::push_async`]. Resolves when the event is queued, or with the event
/// if the task closed.
#[must_use = "futures do nothing unless polled"]
pub struct PushFuture<'a, E: Send + 'static> {
    handle: &'a TaskHandle<E>,
    event: Option<E>,
}

// The event is only ever moved out of the `Option`, never pinned in place, so the future can be
// `Unpin` whatever `E` is.
impl<E: Send + 'static> Unpin for PushFuture<'_, E> {}

impl<E: Send + 'static> Future for PushFuture<'_, E> {
    type Output = Result<(), PushError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = Pin::into_inner(self);
        let Some(event) = this.event.take() else {
            panic!("PushFuture polled after completion");
        };
        match this
            .handle
            .core
            .poll_push(&this.handle.task, event, cx.waker())
        {
            Ok(Ok(())) => Poll::Ready(Ok(())),
            Ok(Err(event)) => {
                this.event = Some(event);
                Poll::Pending
            }
            Err(event) => Poll::Ready(Err(PushError(event))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
    use std::task::{Wake, Waker};

    fn config(workers: usize, capacity: usize) -> SchedConfig {
        SchedConfig {
            worker_threads: workers,
            task_queue_capacity: capacity,
            ..SchedConfig::default()
        }
    }

    #[test]
    fn many_writers_two_workers_deliver_everything_in_order_once() {
        const TASKS: usize = 6;
        const WRITERS_PER_TASK: u64 = 2;
        const EVENTS_PER_WRITER: u64 = 5_000;
        let scheduler = Scheduler::new(config(2, 4)).expect("config");
        type Seen = Arc<Mutex<Vec<(u64, u64)>>>;
        let seen: Vec<Seen> = (0..TASKS)
            .map(|_| Arc::new(Mutex::new(Vec::new())))
            .collect();
        let inside: Vec<Arc<AtomicBool>> = (0..TASKS)
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        let core_thread = std::thread::current().id();
        let handles: Vec<_> = (0..TASKS)
            .map(|i| {
                let (seen, inside) = (Arc::clone(&seen[i]), Arc::clone(&inside[i]));
                let share = 0.1 * (i as f64 + 1.0);
                scheduler
                    .add_task(share, move |(writer, n): (u64, u64)| {
                        assert!(
                            !inside.swap(true, Ordering::SeqCst),
                            "two threads in one task"
                        );
                        assert_ne!(std::thread::current().id(), core_thread);
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((writer, n));
                        inside.store(false, Ordering::SeqCst);
                    })
                    .expect("share")
            })
            .collect();
        std::thread::scope(|scope| {
            for handle in &handles {
                for writer in 0..WRITERS_PER_TASK {
                    scope.spawn(move || {
                        for n in 0..EVENTS_PER_WRITER {
                            handle.push((writer, n)).expect("open");
                        }
                    });
                }
            }
        });
        let stats = scheduler.shutdown(ShutdownMode::Drain).expect("clean");
        assert_eq!(
            stats.events_run,
            TASKS as u64 * WRITERS_PER_TASK * EVENTS_PER_WRITER
        );
        for (i, seen) in seen.iter().enumerate() {
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for writer in 0..WRITERS_PER_TASK {
                let mine: Vec<u64> = seen
                    .iter()
                    .filter(|(w, _)| *w == writer)
                    .map(|(_, n)| *n)
                    .collect();
                let expected: Vec<u64> = (0..EVENTS_PER_WRITER).collect();
                assert_eq!(
                    mine, expected,
                    "task {i} writer {writer}: lost, duplicated or reordered"
                );
            }
            assert!(handles[i].stats().writer_waits > 0 || EVENTS_PER_WRITER < 4);
        }
    }

    #[test]
    fn try_push_reports_would_block_when_full() {
        let scheduler = Scheduler::new(config(0, 2)).expect("config");
        let task = scheduler.add_task(0.5, |_: u32| {}).expect("share");
        assert_eq!(task.try_push(1), Ok(()));
        assert_eq!(task.try_push(2), Ok(()));
        assert_eq!(task.try_push(3), Err(TryPushError::Full(3)));
        assert_eq!(task.queue_len(), 2);
        // One burst runs both queued events (they take far less than `burst_ns`).
        assert_eq!(scheduler.run_once(), Step::Ran);
        assert_eq!(task.queue_len(), 0);
        assert_eq!(task.try_push(3), Ok(()));
        assert_eq!(scheduler.run_once(), Step::Ran);
        assert_eq!(scheduler.run_once(), Step::Idle);
        assert_eq!(task.stats().events_run, 3);
    }

    /// A burst runs a task's queued events until `burst_ns` has passed, charges the whole burst
    /// to the task, and leaves the rest for the next dispatch; with `burst_ns` 0 every dispatch
    /// runs one event.
    #[test]
    fn a_burst_runs_queued_events_until_its_time_is_up() {
        for (burst_ns, expected_runs) in [(0, vec![1, 1, 1, 1, 1, 1]), (250, vec![3, 3])] {
            let clock = Arc::new(ManualClock::new(0));
            let config = SchedConfig {
                burst_ns,
                ..config(0, 16)
            };
            let scheduler = Scheduler::with_clock(config, clock.clone()).expect("config");
            let ran = Arc::new(AtomicU64::new(0));
            let (advance, count) = (clock.clone(), ran.clone());
            let task = scheduler
                .add_task(1.0, move |_: u32| {
                    advance.advance_ns(100);
                    count.fetch_add(1, Ordering::SeqCst);
                })
                .expect("share");
            for event in 0..6 {
                assert_eq!(task.try_push(event), Ok(()));
            }
            let mut runs = Vec::new();
            let mut before = 0;
            while scheduler.run_once() == Step::Ran {
                let now = ran.load(Ordering::SeqCst);
                runs.push(now - before);
                before = now;
            }
            assert_eq!(runs, expected_runs, "burst_ns {burst_ns}");
            let stats = task.stats();
            assert_eq!(stats.events_run, 6);
            assert_eq!(stats.run_ns, 600, "every event's time charged once");
        }
    }

    struct FlagWaker(AtomicUsize);
    impl Wake for FlagWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn push_async_waits_for_a_slot_and_is_woken_by_the_worker() {
        let scheduler = Scheduler::new(config(0, 1)).expect("config");
        let ran = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&ran);
        let task = scheduler.add_task(1.0, move |x: u64| {
            counter.fetch_add(x, Ordering::SeqCst);
        });
        let task = task.expect("share");
        task.try_push(1).expect("room");
        let flag = Arc::new(FlagWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        let mut future = task.push_async(10);
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        assert!(
            Pin::new(&mut future).poll(&mut cx).is_pending(),
            "re-poll registers once"
        );
        assert_eq!(flag.0.load(Ordering::SeqCst), 0);
        assert_eq!(scheduler.run_once(), Step::Ran);
        assert_eq!(
            flag.0.load(Ordering::SeqCst),
            1,
            "freeing a slot wakes the future"
        );
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready(Ok(())));
        assert_eq!(scheduler.run_once(), Step::Ran);
        assert_eq!(ran.load(Ordering::SeqCst), 11);
    }

    #[test]
    fn remove_drops_queued_events_and_wakes_blocked_writers() {
        let scheduler = Scheduler::new(config(0, 1)).expect("config");
        let task = scheduler.add_task(0.5, |_: u32| {}).expect("share");
        task.try_push(1).expect("room");
        std::thread::scope(|scope| {
            let blocked = scope.spawn(|| task.push(2));
            // Give the writer time to block; the outcome does not depend on it.
            std::thread::sleep(std::time::Duration::from_millis(20));
            task.remove();
            assert_eq!(blocked.join().expect("no panic"), Err(PushError(2)));
        });
        assert_eq!(task.try_push(3), Err(TryPushError::Closed(3)));
        assert_eq!(scheduler.run_once(), Step::Discarded);
        assert_eq!(scheduler.run_once(), Step::Idle);
        assert_eq!(task.stats().events_discarded, 1);
        assert_eq!(task.stats().events_run, 0);
    }

    #[test]
    fn discarding_shutdown_wakes_writers_and_drops_events() {
        let scheduler = Scheduler::new(config(0, 1)).expect("config");
        let task = scheduler.add_task(0.5, |_: u32| {}).expect("share");
        task.try_push(1).expect("room");
        let writer_task = task.clone();
        let writer = std::thread::spawn(move || writer_task.push(2));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let stats = scheduler.shutdown(ShutdownMode::Discard).expect("clean");
        assert_eq!(writer.join().expect("no panic"), Err(PushError(2)));
        assert_eq!(stats.events_discarded, 1);
        assert_eq!(stats.events_run, 0);
        assert!(task.is_closed());
    }

    #[test]
    fn draining_shutdown_without_workers_runs_queued_events_on_the_caller() {
        let scheduler = Scheduler::new(config(0, 8)).expect("config");
        let sum = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&sum);
        let task = scheduler
            .add_task(0.5, move |x: u64| {
                seen.fetch_add(x, Ordering::SeqCst);
            })
            .expect("share");
        for x in 1..=4 {
            task.try_push(x).expect("room");
        }
        let stats = scheduler.shutdown(ShutdownMode::Drain).expect("clean");
        assert_eq!(stats.events_run, 4);
        assert_eq!(sum.load(Ordering::SeqCst), 10);
        assert_eq!(task.try_push(5), Err(TryPushError::Closed(5)));
    }

    #[test]
    fn a_panicking_handler_is_counted_and_the_task_goes_on() {
        let scheduler = Scheduler::new(config(0, 8)).expect("config");
        let after = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&after);
        let task = scheduler
            .add_task(0.5, move |x: u32| {
                if x == 1 {
                    panic!("application bug (expected by this test)");
                }
                seen.fetch_add(1, Ordering::SeqCst);
            })
            .expect("share");
        task.try_push(1).expect("room");
        task.try_push(2).expect("room");
        while scheduler.run_once() != Step::Idle {}
        assert_eq!(scheduler.stats().handler_panics, 1);
        assert_eq!(after.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn shares_are_validated() {
        let scheduler = Scheduler::new(config(0, 8)).expect("config");
        assert_eq!(
            scheduler.add_task(0.0, |_: ()| {}).err(),
            Some(ShareError { share: 0.0 })
        );
        let task = scheduler.add_task(0.25, |_: ()| {}).expect("share");
        assert_eq!(task.set_share(1.5), Err(ShareError { share: 1.5 }));
        assert_eq!(task.set_share(0.75), Ok(()));
        assert_eq!(task.share(), 0.75);
        assert!(Scheduler::<()>::new(SchedConfig {
            bucket_count: 0,
            ..config(0, 8)
        })
        .is_err());
    }

    #[test]
    fn the_best_task_without_credit_starts_a_new_epoch() {
        // One task, share 0.5 of a 1 ms period: every 5 events of 100 µs use up its credit.
        let clock = Arc::new(ManualClock::new(0));
        let config = SchedConfig {
            period_ns: 1_000_000,
            ..config(0, 64)
        };
        let scheduler = Scheduler::with_clock(config, clock.clone()).expect("config");
        let advance = clock.clone();
        let task = scheduler
            .add_task(0.5, move |()| advance.advance_ns(100_000))
            .expect("share");
        for _ in 0..20 {
            task.try_push(()).expect("room");
        }
        let mut steps = Vec::new();
        loop {
            match scheduler.run_once() {
                Step::Idle => break,
                step => steps.push(step),
            }
        }
        let resets = steps.iter().filter(|s| **s == Step::Reset).count();
        assert_eq!(steps.iter().filter(|s| **s == Step::Ran).count(), 20);
        assert_eq!(resets, 3, "{steps:?}");
        assert_eq!(scheduler.epoch(), 3);
        assert_eq!(scheduler.stats().resets, 3);
    }

    #[test]
    fn a_new_share_applies_from_the_next_period() {
        let clock = Arc::new(ManualClock::new(0));
        let scheduler = Scheduler::with_clock(config(0, 64), clock.clone()).expect("config");
        let mut tasks = Vec::new();
        for share in [0.5, 0.5] {
            let advance = clock.clone();
            tasks.push(
                scheduler
                    .add_task(share, move |()| advance.advance_ns(100_000))
                    .expect("share"),
            );
        }
        let run = |until_ns: u64| {
            let before: Vec<u64> = tasks.iter().map(|t| t.stats().events_run).collect();
            while crate::Clock::now_ns(&*clock) < until_ns {
                for task in &tasks {
                    while task.try_push(()).is_ok() {}
                }
                scheduler.run_once();
            }
            let after: Vec<u64> = tasks.iter().map(|t| t.stats().events_run).collect();
            (after[0] - before[0], after[1] - before[1])
        };
        let (a, b) = run(500_000_000);
        assert!(a.abs_diff(b) <= 50, "equal shares: {a} vs {b}");
        tasks[0].set_share(0.9).expect("share");
        tasks[1].set_share(0.1).expect("share");
        let (a, b) = run(1_000_000_000);
        let ratio = a as f64 / b as f64;
        assert!((ratio - 9.0).abs() < 0.3, "0.9 vs 0.1: {a} vs {b}");
    }

    #[test]
    fn mutex_baseline_schedules_the_same_way() {
        let scheduler = Scheduler::new(SchedConfig {
            task_set: crate::TaskSetKind::Mutex,
            ..config(2, 4)
        })
        .expect("config");
        let total = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for _ in 0..4 {
            let total = Arc::clone(&total);
            handles.push(
                scheduler
                    .add_task(0.25, move |x: u64| {
                        total.fetch_add(x, Ordering::Relaxed);
                    })
                    .expect("share"),
            );
        }
        for x in 0..10_000u64 {
            handles[(x % 4) as usize].push(x).expect("open");
        }
        scheduler.shutdown(ShutdownMode::Drain).expect("clean");
        assert_eq!(total.load(Ordering::Relaxed), (0..10_000u64).sum::<u64>());
    }

    #[test]
    fn weak_handles_do_not_keep_tasks_alive() {
        let scheduler = Scheduler::new(config(0, 8)).expect("config");
        let task = scheduler.add_task(0.5, |_: ()| {}).expect("share");
        let weak = task.downgrade();
        assert!(weak.upgrade().is_some());
        drop(task);
        assert!(weak.upgrade().is_none());
    }
}
