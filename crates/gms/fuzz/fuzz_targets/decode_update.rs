//! Update items: the input follows a valid update tag and `seq`, so it starts at the item count
//! and every mutation lands in the item decoder (regions, partitions, addresses, id lists), the
//! largest part of the codec.
//!
//! The oracle (`check` in `../oracle.rs`) bounds the memory decoding asks for by the framed
//! input's length, and requires an accepted message to decode again from its own encoding to an
//! equal value, to re-encode to exactly the framed input and to agree with `item_len`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    let mut framed = oracle::update_prefix();
    framed.extend_from_slice(data);
    oracle::check(&framed);
});
