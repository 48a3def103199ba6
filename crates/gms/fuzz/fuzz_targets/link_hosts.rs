//! The GMS link's hosts on hostile input: records of arbitrary bytes delivered to an admitted
//! node's `NodeLink` and to its service's `ServiceLink`, from arbitrary addresses and replicas.
//!
//! The oracle (`link_any` in `../link_oracle.rs`, shared with `tests/link_hostile.rs`) requires
//! that nothing panics, nothing is admitted or handed on, no session is opened for another
//! address, and the genuine node and service still exchange datagrams afterwards.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../link_oracle.rs"]
mod link_oracle;

fuzz_target!(|data: &[u8]| {
    link_oracle::link_any(data);
});
