//! The fuzz oracles (`tests/common/oracle.rs`) on random input, on stable.

#[allow(dead_code)]
#[path = "common/oracle.rs"]
mod oracle;

use proptest::prelude::*;
use tidings_seal::Identity;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn open_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        oracle::open_any(&data);
    }

    #[test]
    fn handshake_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..300),
                                 hello_like in any::<bool>()) {
        let service = Identity::from_private([1; 32]).unwrap();
        let node = Identity::from_private([2; 32]).unwrap();
        let mut data = data;
        if hello_like {
            // Right magic and type, so the bytes reach Noise itself.
            let mut framed = b"TGS\x01\x01".to_vec();
            framed.extend_from_slice(&data);
            framed.resize(tidings_seal::link::HELLO_LEN, 0);
            data = framed;
        }
        oracle::handshake_any(&data, &service, &node);
    }
}

#[test]
fn framed_but_forged_messages() {
    let service = Identity::from_private([1; 32]).unwrap();
    let node = Identity::from_private([2; 32]).unwrap();
    for kind in 1..=4u8 {
        for len in [5, 40, 54, 109, 200] {
            let mut d = vec![0xa5u8; len];
            d[..5].copy_from_slice(&[b'T', b'G', b'S', 1, kind]);
            oracle::handshake_any(&d, &service, &node);
        }
    }
}
