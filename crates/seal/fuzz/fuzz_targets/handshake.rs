//! Handshake and link messages: arbitrary bytes as a hello to the service, as a welcome to a
//! node waiting for one, and as data to both ends of an admitted session.
//!
//! The oracle (`handshake_any` in `tests/common/oracle.rs`, shared with `tests/hostile.rs`)
//! requires every one to be refused and the genuine handshake and a data datagram to go through
//! afterwards. The identities are fixed so that runs replay exactly.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tidings_seal::Identity;

#[allow(dead_code)]
#[path = "../../tests/common/oracle.rs"]
mod oracle;

fn identities() -> &'static (Identity, Identity) {
    static IDS: OnceLock<(Identity, Identity)> = OnceLock::new();
    IDS.get_or_init(|| {
        (
            Identity::from_private([1; 32]).expect("key"),
            Identity::from_private([2; 32]).expect("key"),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let (service, node) = identities();
    oracle::handshake_any(data, service, node);
});
