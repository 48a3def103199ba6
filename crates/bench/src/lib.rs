//! Benchmarks and experiments of the tidings runtime and delivery scheduler, outside the library
//! crates so that those depend only on what they need at run time.
//!
//! * [`runtime`]: one publisher to N subscribers over loopback in one process, next to the raw
//!   UDP ceiling of the same datagram size measured in the same run; `tidings bench` uses its
//!   ceiling and packing, `examples/runtime_bench.rs` the whole matrix.
//! * [`regions`]: paper 001's Figures 5 and 6 for the membership service's region planner on a
//!   generated workload (`tidings sim regions`).
//! * [`sched`]: the experiments of paper 003 section IV on the delivery scheduler
//!   (`examples/sched_bench.rs`).
//!
//! Functions return plain result structs; nothing asserts timings.

#![forbid(unsafe_code)]

pub mod regions;
pub mod runtime;
pub mod sched;
