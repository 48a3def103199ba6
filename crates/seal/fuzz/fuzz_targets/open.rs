//! `KeyRing::open` on arbitrary bytes (the first byte picks the mode and the AEAD).
//!
//! The oracle (`open_any` in `tests/common/oracle.rs`, shared with `tests/hostile.rs`) requires
//! the bytes to be refused and counted, and a genuine datagram of the same size to open after
//! them.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../tests/common/oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::open_any(data);
});
