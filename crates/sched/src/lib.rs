//! The tidings delivery scheduler: lock-free time-based credit scheduling with per-topic shares,
//! after paper 003 (sections II-IV) and docs/design.md section 8.
//!
//! * A **task** (one per subscription or topic) has a share `v` and a bounded lock-free event
//!   queue; its handler runs one event at a time, in push order.
//! * Each period `T` (default 10 ms) a task receives `v * T` nanoseconds of **credit**. Worker
//!   threads take the task with the most credit, run exactly one event, charge the measured time,
//!   and put the task back while it has events. When the best task has no credit left, all
//!   credits are reset; an **epoch** counter lets a thread that was running a task during a reset
//!   correct that task's credit (section III-B).
//! * The **schedulable-task set** is the non-blocking quantized priority queue of section III-B:
//!   `N` buckets of lock-free FIFOs in groups of about `sqrt(N)`, with atomic counts.
//! * Writers and workers coordinate through the task's atomic queue size (section III-A,
//!   Fig. 2), so a task with events is never lost and never on two threads at once.
//! * [`maxmin::expected_rates`] is the throughput model of section II, and [`history`] checks the
//!   invariant of section III-D on recorded histories. The experiments of section IV are in the
//!   `tidings-bench` crate.
//!
//! Time is an input: durations come from a [`Clock`] ([`MonotonicClock`] for workers,
//! [`ManualClock`] for deterministic tests, with `worker_threads: 0` and
//! [`Scheduler::run_once`]).

// Loom builds compile the protocol without the thread-spawning `Scheduler`, so most of the
// crate is unused there; dead-code analysis is only meaningful in normal builds.
#![cfg_attr(loom, allow(dead_code))]

mod bucket;
mod clock;
mod config;
mod core;
mod credit;
mod error;
mod fifo;
pub mod handoff;
pub mod history;
pub mod maxmin;
#[cfg(not(loom))]
mod scheduler;
mod sync;
mod task;

#[cfg(all(test, loom))]
mod loom_tests;

pub use crate::clock::{Clock, ManualClock, MonotonicClock};
pub use crate::config::{
    SchedConfig, TaskSetKind, BUCKET_COUNT_MAX, BUCKET_RING_CAPACITY_MAX, IDLE_SPIN_NS_MAX,
    TASK_QUEUE_CAPACITY_MAX, WORKER_THREADS_MAX,
};
pub use crate::core::Step;
pub use crate::error::{
    ConfigError, PushError, ShareError, ShutdownError, StartError, TryPushError,
};
#[cfg(not(loom))]
pub use crate::scheduler::{
    PushFuture, SchedStats, Scheduler, ShutdownMode, TaskHandle, TaskId, TaskStats, WeakTaskHandle,
};
