//! `GmsMessage::decode` on whole datagrams: the input is the datagram, as the GMS service and
//! client receive it from the network.
//!
//! The oracle (`check` in `../oracle.rs`) bounds the memory decoding asks for by the input's
//! length, and requires an accepted message to decode again from its own encoding to an equal
//! value, to re-encode to exactly the input and, for an update, to agree with `item_len`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check(data);
});
