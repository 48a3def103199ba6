//! Scheduler configuration: every default documented, checked once by [`SchedConfig::validate`].

use crate::error::ConfigError;

/// Which implementation backs the set of schedulable tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskSetKind {
    /// The non-blocking quantized priority queue of paper 003 section III-B (the default).
    #[default]
    LockFree,
    /// The same buckets behind one mutex: the baseline of the paper's Figure 7, kept for the
    /// benchmarks that show what the lock-free queue buys.
    Mutex,
}

/// Configuration of a [`Scheduler`](crate::Scheduler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedConfig {
    /// Length of the credit period `T`, in nanoseconds. Default 10 ms (the paper's setting): each
    /// task receives `share * period_ns` of credit per period, so with no task overrunning its
    /// slot no runnable task waits longer than about one period.
    pub period_ns: u64,
    /// Number of priority levels `N` for tasks with credit left. Default 100 (the paper's
    /// setting): with a 10 ms period, tasks are told apart at 100 µs granularity. One more bucket
    /// holds the tasks whose credit is used up.
    pub bucket_count: usize,
    /// Buckets per bucket group `M`. `None` (the default) takes `ceil(sqrt(bucket_count + 1))`,
    /// the size that minimises the expected scan cost `M/2 + N/(2M)` (section III-B).
    pub bucket_group_size: Option<usize>,
    /// Number of worker threads. Default: one per available core (the paper's setting). Zero
    /// means no worker threads: the caller drives the scheduler with
    /// [`Scheduler::run_once`](crate::Scheduler::run_once), which is how deterministic tests and
    /// the simulator use it.
    pub worker_threads: usize,
    /// Capacity of each task's event queue, in events. Default 1024: enough to absorb a burst of
    /// one period at 100 000 events/s per topic; when it is full, writers block (or get
    /// `WouldBlock`, or wait asynchronously) until a worker takes an event. A bound, not an
    /// allocation: the queue's storage grows to the most events it held at once and shrinks
    /// again when it is used less, so thousands of quiet tasks cost little memory.
    pub task_queue_capacity: usize,
    /// The schedulable-task set implementation. Default [`TaskSetKind::LockFree`].
    pub task_set: TaskSetKind,
    /// Tasks each priority bucket of the lock-free set holds in its preallocated ring. Default
    /// 128: the set then never allocates while at most 128 tasks with events share one
    /// priority level (tasks of equal share move through the levels together, so this is about
    /// the number of busy subscriptions); more spill into an unbounded queue (counted in
    /// `SchedStats::bucket_spills`) that allocates only to hold more than it ever held. Memory: 16 bytes per slot,
    /// `(bucket_count + 1) * bucket_ring_capacity` slots, 207 KB with the defaults.
    pub bucket_ring_capacity: usize,
    /// Prefix of worker thread names (`<prefix>-<index>`). Default `"tidings-sched"`.
    pub thread_name_prefix: String,
    /// How long, in nanoseconds, a worker keeps running the queued events of the task it took
    /// before it puts the task back and takes the one with the most credit again. Default
    /// 50 µs, half a priority level at the default period and bucket count, so the order of
    /// service is as fine as the set can tell tasks apart; the whole burst is charged to the
    /// task, as one event would be. A burst takes the task from the set once and reads the clock
    /// once per stride of events (one event while events are long, up to 8 while they average
    /// under 1/64 of the burst), where one event per dispatch reads it twice per event and takes
    /// the task every time: at a million short events a second that is most of a worker's
    /// overhead.
    /// `0` runs exactly one event per dispatch (Fig. 1b of paper 003 as written). At most
    /// `period_ns`.
    pub burst_ns: u64,
    /// How long, in nanoseconds, an idle worker keeps looking for work (spinning, without
    /// yielding its core) before it sleeps on the scheduler's condition variable. An event pushed
    /// while a worker looks is taken without a wake-up (the wake-up of a sleeping worker and
    /// what precedes it were 20-40 us of a lone message's latency at p50 on a 2-core virtual
    /// machine, ADR 45). Default 0: workers sleep once their short backoff (a few microseconds)
    /// finds nothing, so a node whose deliveries come one by one costs no CPU between them; a spin
    /// longer than the gap between deliveries keeps a worker awake (one core busy) for as long
    /// as they keep coming, and on a host whose cores other processes want it was measured to
    /// make latency worse, not better. At most [`IDLE_SPIN_NS_MAX`].
    pub idle_spin_ns: u64,
}

/// Largest accepted `bucket_count`: the scan cost grows with sqrt(N) and finer priorities than
/// this are below any clock's useful resolution.
pub const BUCKET_COUNT_MAX: usize = 1 << 16;
/// Largest accepted per-task queue capacity (events), to bound memory per task.
pub const TASK_QUEUE_CAPACITY_MAX: usize = 1 << 20;
/// Largest accepted `bucket_ring_capacity` (tasks per bucket ring), to bound the set's memory.
pub const BUCKET_RING_CAPACITY_MAX: usize = 1 << 16;
/// Largest accepted number of worker threads.
pub const WORKER_THREADS_MAX: usize = 1024;
/// Largest accepted `idle_spin_ns` (10 ms): a longer spin is a busy worker, not a wait.
pub const IDLE_SPIN_NS_MAX: u64 = 10_000_000;

impl Default for SchedConfig {
    fn default() -> Self {
        Self {
            period_ns: 10_000_000,
            bucket_count: 100,
            bucket_group_size: None,
            worker_threads: std::thread::available_parallelism().map_or(1, usize::from),
            task_queue_capacity: 1024,
            task_set: TaskSetKind::LockFree,
            bucket_ring_capacity: 128,
            thread_name_prefix: "tidings-sched".to_owned(),
            burst_ns: 50_000,
            idle_spin_ns: 0,
        }
    }
}

impl SchedConfig {
    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bucket_count == 0 || self.bucket_count > BUCKET_COUNT_MAX {
            return Err(ConfigError::BucketCount {
                bucket_count: self.bucket_count,
            });
        }
        // Each priority level must cover at least one nanosecond of credit.
        if self.period_ns < self.bucket_count as u64 || self.period_ns > i64::MAX as u64 / 4 {
            return Err(ConfigError::Period {
                period_ns: self.period_ns,
                bucket_count: self.bucket_count,
            });
        }
        if let Some(group) = self.bucket_group_size {
            if group == 0 || group > self.bucket_count + 1 {
                return Err(ConfigError::BucketGroupSize {
                    bucket_group_size: group,
                    bucket_count: self.bucket_count,
                });
            }
        }
        if self.worker_threads > WORKER_THREADS_MAX {
            return Err(ConfigError::WorkerThreads {
                worker_threads: self.worker_threads,
            });
        }
        if self.task_queue_capacity == 0 || self.task_queue_capacity > TASK_QUEUE_CAPACITY_MAX {
            return Err(ConfigError::TaskQueueCapacity {
                task_queue_capacity: self.task_queue_capacity,
            });
        }
        if self.bucket_ring_capacity == 0 || self.bucket_ring_capacity > BUCKET_RING_CAPACITY_MAX {
            return Err(ConfigError::BucketRingCapacity {
                bucket_ring_capacity: self.bucket_ring_capacity,
            });
        }
        if self.burst_ns > self.period_ns {
            return Err(ConfigError::Burst {
                burst_ns: self.burst_ns,
                period_ns: self.period_ns,
            });
        }
        if self.idle_spin_ns > IDLE_SPIN_NS_MAX {
            return Err(ConfigError::IdleSpin {
                idle_spin_ns: self.idle_spin_ns,
            });
        }
        Ok(())
    }

    /// The bucket group size in effect: the configured one or `ceil(sqrt(N + 1))`.
    pub fn effective_bucket_group_size(&self) -> usize {
        self.bucket_group_size
            .unwrap_or_else(|| ceil_sqrt(self.bucket_count + 1))
    }
}

/// Smallest `m` with `m * m >= n` (integer arithmetic, no float rounding surprises).
fn ceil_sqrt(n: usize) -> usize {
    let mut m = 1;
    while m * m < n {
        m += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_matches_the_paper() {
        let config = SchedConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.period_ns, 10_000_000);
        assert_eq!(config.bucket_count, 100);
        // 101 buckets (100 levels plus the exhausted bucket) in groups of 11.
        assert_eq!(config.effective_bucket_group_size(), 11);
        assert!(config.worker_threads >= 1);
    }

    #[test]
    fn invalid_fields_are_rejected_with_their_value() {
        let base = SchedConfig::default();
        let cases = [
            SchedConfig {
                bucket_count: 0,
                ..base.clone()
            },
            SchedConfig {
                period_ns: 50,
                ..base.clone()
            },
            SchedConfig {
                bucket_group_size: Some(0),
                ..base.clone()
            },
            SchedConfig {
                bucket_group_size: Some(200),
                ..base.clone()
            },
            SchedConfig {
                task_queue_capacity: 0,
                ..base.clone()
            },
            SchedConfig {
                worker_threads: WORKER_THREADS_MAX + 1,
                ..base.clone()
            },
            SchedConfig {
                bucket_ring_capacity: 0,
                ..base.clone()
            },
            SchedConfig {
                bucket_ring_capacity: BUCKET_RING_CAPACITY_MAX + 1,
                ..base.clone()
            },
            SchedConfig {
                burst_ns: base.period_ns + 1,
                ..base.clone()
            },
            SchedConfig {
                idle_spin_ns: IDLE_SPIN_NS_MAX + 1,
                ..base.clone()
            },
        ];
        for config in cases {
            let err = config.validate();
            assert!(err.is_err(), "{config:?} should be rejected");
        }
        let err = SchedConfig {
            period_ns: 50,
            ..base
        }
        .validate();
        assert_eq!(
            err,
            Err(ConfigError::Period {
                period_ns: 50,
                bucket_count: 100
            })
        );
    }

    #[test]
    fn ceil_sqrt_is_exact() {
        assert_eq!(ceil_sqrt(1), 1);
        assert_eq!(ceil_sqrt(4), 2);
        assert_eq!(ceil_sqrt(5), 3);
        assert_eq!(ceil_sqrt(101), 11);
    }
}
