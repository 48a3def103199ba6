//! The deterministic simulator of docs/design.md section 9.

#![forbid(unsafe_code)]

pub mod fault;
pub mod net;
pub mod plot;
pub mod world;

pub mod attack;
pub mod checker;
pub mod churn;
pub mod experiment;
pub mod gms;
pub mod horus;
pub mod qsm;
pub mod report;
pub mod scenario;
pub mod sweep;

pub use gms::MembershipKind;
pub use report::RunReport;
pub use scenario::{
    run, run_observed, LinkChange, LinkEvent, Progress, Scenario, ScenarioError, SlowConsumerPlan,
};
pub use sweep::{sweep, SweepRun};
