//! The replicated GMS's log entries (`replica::decode_decision`): what a replica applies
//! once committed.
//!
//! The oracle (`check_decision` in `../oracle.rs`) bounds the memory decoding asks for by the
//! input's length and requires an accepted input to re-encode to exactly itself.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check_decision(data);
});
