//! Sealing and opening allocate nothing per datagram: counted by a global allocator.

use std::alloc::System;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings_seal::datagram::{
    CLEAR_HEADER_LEN, COUNTER_LIMIT_DEFAULT, HEADER_SENDER_OFFSET, TRAILER_LEN,
};
use tidings_seal::{Aead, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, SealingKey};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn seal_and_open_allocate_nothing() {
    for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let secret = KeySecret::from_bytes([3; 32]);
            let mut ring = KeyRing::new(KeyRingConfig {
                mode,
                aead,
                ..KeyRingConfig::default()
            })
            .unwrap();
            ring.install(KeyId(1), &secret).unwrap();
            let mut senders: Vec<SealingKey> = (0..4)
                .map(|s| SealingKey::new(aead, mode, KeyId(1), s, &secret, COUNTER_LIMIT_DEFAULT))
                .collect();
            let mut buf = vec![0u8; 1472 + TRAILER_LEN];
            let mut round = |senders: &mut [SealingKey], ring: &mut KeyRing| {
                for i in 0..1000usize {
                    let sender = &mut senders[i % 4];
                    let len = CLEAR_HEADER_LEN + (i * 7) % 1400;
                    buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4]
                        .copy_from_slice(&((i % 4) as u32).to_be_bytes());
                    let n = sender.seal(&mut buf, len).unwrap();
                    let opened = ring.open(&mut buf[..n]).unwrap();
                    assert_eq!(opened.len, len);
                    // Refusals allocate nothing either.
                    assert!(ring.open(&mut buf[..n]).is_err());
                }
            };
            // The allocator counts every thread's allocations, and the test harness's own
            // threads allocate now and then (seen: 4 allocations, 900 bytes, while a round ran).
            // An allocation per datagram shows in every round; the harness's in a few at most.
            let mut rounds = Vec::new();
            for _ in 0..3 {
                let region = Region::new(GLOBAL);
                round(&mut senders, &mut ring);
                let stats = region.change();
                rounds.push((stats.allocations, stats.reallocations));
                if rounds.last() == Some(&(0, 0)) {
                    break;
                }
            }
            assert_eq!(
                rounds.last(),
                Some(&(0, 0)),
                "{aead:?} {mode:?}: allocations and reallocations in each round: {rounds:?}"
            );
            assert_eq!(ring.stats().opened, 1000 * rounds.len() as u64);
        }
    }
}
