//! Helpers shared by the integration tests; each test crate uses a subset.
#![allow(dead_code)]

pub(crate) mod model;
pub(crate) mod strategies;
