//! The GMS link's hosts (`ServiceLink::receive`, `NodeLink::receive`) on hostile input, with
//! the `link_hosts` fuzz target's oracle (`fuzz/link_oracle.rs`), on stable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../fuzz/link_oracle.rs"]
mod link_oracle;

use proptest::prelude::*;

/// Records as the oracle reads them: a selector byte, a `u16` length, the bytes.
fn records(rs: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (selector, bytes) in rs {
        out.push(*selector);
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_datagrams_from_arbitrary_addresses(
        rs in proptest::collection::vec(
            (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..200)),
            0..24,
        )
    ) {
        link_oracle::link_any(&records(&rs));
    }

    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..1000)) {
        link_oracle::link_any(&data);
    }
}

#[test]
fn framed_but_forged_datagrams_of_every_type_and_length() {
    use tidings_seal::link::{DATA_OVERHEAD, HELLO_LEN, UNREADABLE_LEN, WELCOME_LEN};
    let mut rs = Vec::new();
    for kind in 0..=5u8 {
        for len in [
            0,
            1,
            UNREADABLE_LEN,
            DATA_OVERHEAD,
            WELCOME_LEN,
            HELLO_LEN,
            300,
        ] {
            let mut d = vec![0xa5u8; len.saturating_sub(4)];
            if let Some(t) = d.first_mut() {
                *t = kind;
            }
            // To the service from address 3, and to the node from replica 0 and 1.
            for selector in [2 | (3 << 2), 3, 3 | (1 << 2)] {
                rs.push((selector, d.clone()));
            }
        }
    }
    for chunk in rs.chunks(60) {
        link_oracle::link_any(&records(chunk));
    }
}
