//! The replicated GMS's replica-to-replica Raft messages (`replica::decode_raft`): whatever
//! arrives on a replica link.
//!
//! The oracle (`check_raft` in `../oracle.rs`) bounds the memory decoding asks for by the
//! input's length and requires an accepted input to re-encode to exactly itself.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check_raft(data);
});
