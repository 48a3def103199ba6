//! Replica datagrams in fragments (`replica::decode_fragment`, `replica::Reassembly`): whatever
//! arrives on replica links, as a sequence of datagrams from two peers over time.
//!
//! The oracle (`check_fragments` in `../oracle.rs`) bounds the memory decoding asks for by the
//! input's length, what the reassembly holds by what arrived, and checks that messages come
//! back whole from their fragments in any order.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)] // not every target uses every helper
#[path = "../oracle.rs"]
mod oracle;

fuzz_target!(|data: &[u8]| {
    oracle::check_fragments(data);
});
