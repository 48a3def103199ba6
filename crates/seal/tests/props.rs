//! Hostile-input properties of sealed datagrams: round trips, bit flips, replays, retired keys,
//! and arbitrary bytes.

use proptest::prelude::*;
use tidings_seal::datagram::{
    CLEAR_HEADER_LEN, COUNTER_LIMIT_DEFAULT, HEADER_SENDER_OFFSET, TRAILER_LEN,
};
use tidings_seal::window::Refusal;
use tidings_seal::{
    Aead, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, OpenError, ReplayWindow, SealingKey,
};

fn aead() -> impl Strategy<Value = Aead> {
    prop_oneof![Just(Aead::Aes256Gcm), Just(Aead::ChaCha20Poly1305)]
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Authenticate), Just(Mode::Encrypt)]
}

fn pair(aead: Aead, mode: Mode, sender: u32) -> (SealingKey, KeyRing) {
    let secret = KeySecret::from_bytes([0x5a; 32]);
    let key = SealingKey::new(aead, mode, KeyId(7), sender, &secret, COUNTER_LIMIT_DEFAULT);
    let mut ring = KeyRing::new(KeyRingConfig {
        mode,
        aead,
        senders_max: 8,
        ..KeyRingConfig::default()
    })
    .expect("valid config");
    ring.install(KeyId(7), &secret).expect("empty ring");
    (key, ring)
}

/// `datagram` with its header's sender set to the key's, sealed.
fn sealed(key: &mut SealingKey, sender: u32, datagram: &[u8]) -> Vec<u8> {
    let mut buf = datagram.to_vec();
    buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4].copy_from_slice(&sender.to_be_bytes());
    buf.resize(datagram.len() + TRAILER_LEN, 0);
    let n = key.seal(&mut buf, datagram.len()).expect("room");
    assert_eq!(n, buf.len());
    buf
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip(aead in aead(), mode in mode(), sender in any::<u32>(),
                  datagram in proptest::collection::vec(any::<u8>(), CLEAR_HEADER_LEN..9000)) {
        let (mut key, mut ring) = pair(aead, mode, sender);
        let mut datagram = datagram;
        datagram[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4].copy_from_slice(&sender.to_be_bytes());
        let mut buf = sealed(&mut key, sender, &datagram);
        prop_assert_eq!(&buf[..CLEAR_HEADER_LEN], &datagram[..CLEAR_HEADER_LEN]);
        if mode == Mode::Authenticate {
            prop_assert_eq!(&buf[..datagram.len()], &datagram[..]);
        }
        let opened = ring.open(&mut buf).unwrap();
        prop_assert_eq!(opened.len, datagram.len());
        prop_assert_eq!(&buf[..opened.len], &datagram[..]);
        let origin = opened.origin.unwrap();
        prop_assert_eq!((origin.key, origin.sender, origin.counter), (KeyId(7), sender, 0));
    }

    #[test]
    fn any_bit_flip_is_refused(aead in aead(), mode in mode(),
                               datagram in proptest::collection::vec(any::<u8>(), CLEAR_HEADER_LEN..300),
                               bit in any::<prop::sample::Index>()) {
        let (mut key, mut ring) = pair(aead, mode, 3);
        let mut buf = sealed(&mut key, 3, &datagram);
        let bit = bit.index(buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
        let got = ring.open(&mut buf);
        prop_assert!(got.is_err(), "bit {} accepted", bit);
        prop_assert_eq!(ring.stats().opened, 0);
    }

    #[test]
    fn replays_are_refused(aead in aead(), mode in mode(), n in 1usize..40,
                           order in proptest::collection::vec(any::<prop::sample::Index>(), 1..80)) {
        let (mut key, mut ring) = pair(aead, mode, 1);
        let all: Vec<Vec<u8>> = (0..n).map(|i| sealed(&mut key, 1, &[i as u8; 40])).collect();
        let mut seen = std::collections::BTreeSet::new();
        for pick in order {
            let i = pick.index(n);
            let mut d = all[i].clone();
            let got = ring.open(&mut d);
            if seen.insert(i) {
                prop_assert!(got.is_ok(), "first copy of {} refused: {:?}", i, got);
            } else {
                prop_assert_eq!(got, Err(OpenError::Replayed));
            }
        }
    }

    #[test]
    fn retired_key_is_refused(aead in aead(), mode in mode(), before in 0usize..5, after in 1usize..5) {
        let (mut key, mut ring) = pair(aead, mode, 1);
        for _ in 0..before {
            let mut d = sealed(&mut key, 1, &[1; 20]);
            prop_assert!(ring.open(&mut d).is_ok());
        }
        ring.retire(KeyId(7));
        for _ in 0..after {
            let mut d = sealed(&mut key, 1, &[1; 20]);
            prop_assert_eq!(ring.open(&mut d), Err(OpenError::RetiredKey(KeyId(7))));
        }
        prop_assert_eq!(ring.stats().retired_key, after as u64);
    }

    #[test]
    fn arbitrary_bytes_never_open(mode in mode(), aead in aead(),
                                  bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let (_, mut ring) = pair(aead, mode, 1);
        let mut b = bytes.clone();
        prop_assert!(ring.open(&mut b).is_err());
        prop_assert_eq!(ring.stats().refused(), 1);
    }

    /// The window agrees with a model that remembers every counter.
    #[test]
    fn window_matches_model(width in 64usize..300,
                            counters in proptest::collection::vec(0u64..2000, 1..300)) {
        let mut w = ReplayWindow::new(width);
        let width = w.width() as u64;
        let mut seen = std::collections::BTreeSet::new();
        let mut highest: Option<u64> = None;
        for c in counters {
            let expect = match highest {
                Some(h) if c <= h && h - c >= width => Err(Refusal::TooOld),
                _ if seen.contains(&c) => Err(Refusal::Replayed),
                _ => Ok(()),
            };
            prop_assert_eq!(w.accept(c), expect, "counter {}", c);
            if expect.is_ok() {
                seen.insert(c);
                highest = Some(highest.map_or(c, |h| h.max(c)));
            }
        }
    }
}

#[test]
fn window_edge_at_exact_width() {
    let (mut key, mut ring) = pair(Aead::Aes256Gcm, Mode::Authenticate, 1);
    // Seal 1025 datagrams; open the last first, then the oldest ones around the edge.
    let all: Vec<Vec<u8>> = (0..1025)
        .map(|_| sealed(&mut key, 1, &[0; CLEAR_HEADER_LEN]))
        .collect();
    let mut last = all[1024].clone();
    assert!(ring.open(&mut last).is_ok());
    // Default width 1024: counter 1024 - 1023 = 1 is the oldest inside, 0 is outside.
    let mut oldest = all[1].clone();
    assert!(ring.open(&mut oldest).is_ok());
    let mut outside = all[0].clone();
    assert_eq!(ring.open(&mut outside), Err(OpenError::TooOld));
}

#[test]
fn header_constants_match_the_wire() {
    use tidings_wire::{Header, Kind, NodeId, RegionId, ViewId};
    assert_eq!(CLEAR_HEADER_LEN, tidings_wire::HEADER_LEN);
    let header = Header {
        kind: Kind::Ack,
        region: RegionId(1),
        view: ViewId(2),
        sender: NodeId(0x0102_0304),
        incarnation: 0x0a0b_0c0d,
    };
    let mut buf = [0u8; 64];
    let n = tidings_wire::write_ack(&mut buf, &header, NodeId(5), 7).expect("room");
    assert!(n >= CLEAR_HEADER_LEN);
    assert_eq!(
        buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4],
        [1, 2, 3, 4]
    );
}
