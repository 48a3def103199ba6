//! A replicated GMS replica's state file (`replica::decode_durable`): whatever a restarted
//! `tidings gms --data-dir` host finds on its disk.
//!
//! The oracle (`check_durable` in `../oracle.rs`) bounds the memory decoding asks for by the
//! input's length, requires an accepted input to re-encode to exactly itself, and restarts a
//! replica from it. It also tries the input with its checksum made right, so that the body's
//! decoder is reached.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check_durable(data);
});
