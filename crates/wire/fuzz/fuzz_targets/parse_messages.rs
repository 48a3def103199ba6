//! Data and retransmission bodies: the first input byte picks Data (even) or Retransmit (odd);
//! the rest follows a valid header of that kind.
//!
//! The oracle (`Target::run` in `tests/common/model.rs`, shared with the corpus replay test)
//! parses, checks `peek_kind` against the result, iterates every view to its end and re-encodes
//! an accepted packet with the writers, which must reproduce the input exactly.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../tests/common/model.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    let _ = model::Target::Messages.run(data);
});
