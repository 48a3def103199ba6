//! Errors, one enum per operation.

use thiserror::Error;

/// Why a [`SchedConfig`](crate::SchedConfig) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `bucket_count` must be in `1..=BUCKET_COUNT_MAX`.
    #[error(
        "bucket_count {bucket_count} is outside 1..={}",
        crate::config::BUCKET_COUNT_MAX
    )]
    BucketCount {
        /// The rejected value.
        bucket_count: usize,
    },
    /// `period_ns` must give every bucket at least 1 ns of credit and stay far from `i64::MAX`.
    #[error("period_ns {period_ns} must be at least bucket_count ({bucket_count}) and below 2^61")]
    Period {
        /// The rejected period.
        period_ns: u64,
        /// The bucket count it was checked against.
        bucket_count: usize,
    },
    /// `bucket_group_size` must be in `1..=bucket_count + 1`.
    #[error("bucket_group_size {bucket_group_size} is outside 1..={}", bucket_count + 1)]
    BucketGroupSize {
        /// The rejected group size.
        bucket_group_size: usize,
        /// The bucket count it was checked against.
        bucket_count: usize,
    },
    /// `worker_threads` must be at most `WORKER_THREADS_MAX`.
    #[error(
        "worker_threads {worker_threads} exceeds {}",
        crate::config::WORKER_THREADS_MAX
    )]
    WorkerThreads {
        /// The rejected value.
        worker_threads: usize,
    },
    /// `task_queue_capacity` must be in `1..=TASK_QUEUE_CAPACITY_MAX`.
    #[error(
        "task_queue_capacity {task_queue_capacity} is outside 1..={}",
        crate::config::TASK_QUEUE_CAPACITY_MAX
    )]
    TaskQueueCapacity {
        /// The rejected value.
        task_queue_capacity: usize,
    },
    /// `bucket_ring_capacity` is zero or above [`BUCKET_RING_CAPACITY_MAX`](crate::BUCKET_RING_CAPACITY_MAX).
    #[error(
        "bucket_ring_capacity {bucket_ring_capacity} is outside 1..={}",
        crate::config::BUCKET_RING_CAPACITY_MAX
    )]
    BucketRingCapacity {
        /// The rejected value.
        bucket_ring_capacity: usize,
    },
    /// `burst_ns` is longer than the period: a burst could use more than a whole period's
    /// credit before the task is looked at again.
    #[error("burst_ns {burst_ns} exceeds period_ns {period_ns}")]
    Burst {
        /// The rejected burst.
        burst_ns: u64,
        /// The period it was checked against.
        period_ns: u64,
    },
    /// `idle_spin_ns` is above [`IDLE_SPIN_NS_MAX`](crate::config::IDLE_SPIN_NS_MAX).
    #[error("idle_spin_ns {idle_spin_ns} exceeds 10 ms")]
    IdleSpin {
        /// The rejected spin.
        idle_spin_ns: u64,
    },
}

/// Why a share was rejected: it must be a finite number in `(0, 1]`.
///
/// A zero share is refused because a task with no credit after a reset would make every reset
/// useless (the best task would still have none); use a small share for best-effort tasks.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[error("share {share} is not a finite number in (0, 1]")]
pub struct ShareError {
    /// The rejected share.
    pub share: f64,
}

/// Why [`TaskHandle::try_push`](crate::TaskHandle::try_push) did not take the event; the event
/// is handed back.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TryPushError<E> {
    /// The task's queue is full (`WouldBlock`): retry later, block with `push`, or await
    /// `push_async`.
    #[error("task queue is full")]
    Full(E),
    /// The task was removed or the scheduler shut down.
    #[error("task is closed")]
    Closed(E),
}

impl<E> TryPushError<E> {
    /// The event that was not taken.
    pub fn into_event(self) -> E {
        match self {
            Self::Full(event) | Self::Closed(event) => event,
        }
    }
}

/// Why a blocking or asynchronous push did not take the event: the task was removed or the
/// scheduler shut down (possibly while the writer was waiting). The event is handed back.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("task is closed")]
pub struct PushError<E>(pub E);

/// Why [`Scheduler::shutdown`](crate::Scheduler::shutdown) could not join every worker.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{panicked} worker thread(s) panicked")]
pub struct ShutdownError {
    /// How many worker threads ended with a panic (a bug in the scheduler: handler panics are
    /// caught and counted, not propagated).
    pub panicked: usize,
}

/// Why worker threads could not be started.
#[derive(Debug, Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The operating system refused to spawn a worker thread.
    #[error("cannot spawn worker thread: {0}")]
    Spawn(#[from] std::io::Error),
}
