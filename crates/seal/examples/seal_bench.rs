//! Cost of sealing and opening one datagram, per mode, AEAD and size, beside ring's own call.
//!
//! `cargo run --release -p tidings-seal --example seal_bench` prints a Markdown table: ns per
//! datagram for sealing ([`SealingKey::seal`]) and opening ([`KeyRing::open`], which includes
//! the key lookup and the replay window), and for the one ring call each of them makes on the
//! same bytes (`LessSafeKey::seal_in_place_separate_tag` / `open_in_place_separate_tag`
//! with the mode's associated data; in `authenticate` with AES-256-GCM both sides make the
//! sealing call, over a copy of the datagram): the crypto floor. Each cell is the best of five
//! runs of a fixed number of datagrams; a 1084-byte datagram carries one 1000-byte message.

#![allow(clippy::disallowed_methods)] // a benchmark reads the wall clock

use std::hint::black_box;
use std::time::Instant;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use tidings_seal::datagram::{
    CLEAR_HEADER_LEN, COUNTER_LIMIT_DEFAULT, HEADER_SENDER_OFFSET, TRAILER_FIELDS_LEN, TRAILER_LEN,
};
use tidings_seal::{Aead, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, SealingKey};

/// Sealed datagram sizes: a small message, a 1000-byte message (20-byte header, 2-byte data
/// header, 30-byte message header, trailer), a full default datagram, a jumbo one.
const SIZES: [usize; 4] = [64, 1084, 1472, 8972];
/// Datagrams sealed, then opened, per round: enough to hide the clock reads, few enough that a
/// round of the largest stays in the last-level cache (2.3 MB).
const BATCH: usize = 256;
const RUNS: usize = 5;
const SECRET: [u8; 32] = [9; 32];

fn rounds(size: usize) -> usize {
    // About 32 MB of datagrams per run.
    ((32 << 20) / (size * BATCH)).max(4)
}

fn main() {
    println!("| AEAD | mode | datagram bytes | seal ns | open ns | ring seal ns | ring open ns |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            for size in SIZES {
                let (seal_ns, open_ns) = measure(aead, mode, size);
                let (raw_seal_ns, raw_open_ns) = measure_ring(aead, mode, size);
                println!(
                    "| {aead:?} | {mode} | {size} | {seal_ns:.0} | {open_ns:.0} | \
                     {raw_seal_ns:.0} | {raw_open_ns:.0} |"
                );
            }
        }
    }
}

/// A batch of `size`-byte datagram slots whose header names sender 1.
fn batch(size: usize) -> Vec<u8> {
    let mut batch = vec![0x42u8; size * BATCH];
    for d in batch.chunks_exact_mut(size) {
        d[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4].copy_from_slice(&1u32.to_be_bytes());
    }
    batch
}

/// Best of `RUNS` of: `rounds` rounds, each timing `first` over the batch, then `second`.
fn best_of(
    size: usize,
    mut setup: impl FnMut(),
    mut first: impl FnMut(&mut [u8], u64),
    mut second: impl FnMut(&mut [u8], u64),
) -> (f64, f64) {
    let rounds = rounds(size);
    let count = (rounds * BATCH) as f64;
    let mut best = (f64::MAX, f64::MAX);
    let mut batch = batch(size);
    for _ in 0..RUNS {
        setup();
        let (mut first_ns, mut second_ns) = (0u128, 0u128);
        let mut counter = 0u64;
        for _ in 0..rounds {
            let start = Instant::now();
            for (i, d) in batch.chunks_exact_mut(size).enumerate() {
                first(d, counter + i as u64);
            }
            let middle = Instant::now();
            for (i, d) in batch.chunks_exact_mut(size).enumerate() {
                second(d, counter + i as u64);
            }
            second_ns += middle.elapsed().as_nanos();
            first_ns += (middle - start).as_nanos();
            counter += BATCH as u64;
        }
        best.0 = best.0.min(first_ns as f64 / count);
        best.1 = best.1.min(second_ns as f64 / count);
    }
    best
}

/// (seal, open) nanoseconds per datagram of `size` bytes on the wire (the trailer included: the
/// protocol's datagram is `size - TRAILER_LEN`) through [`SealingKey`] and [`KeyRing`].
fn measure(aead: Aead, mode: Mode, size: usize) -> (f64, f64) {
    let secret = KeySecret::from_bytes(SECRET);
    let plain = size - TRAILER_LEN;
    let fresh = || {
        let key = SealingKey::new(aead, mode, KeyId(1), 1, &secret, COUNTER_LIMIT_DEFAULT);
        let mut ring = KeyRing::new(KeyRingConfig {
            mode,
            aead,
            ..KeyRingConfig::default()
        })
        .expect("valid config");
        ring.install(KeyId(1), &secret).expect("empty ring");
        (key, ring)
    };
    let pair = std::cell::RefCell::new(fresh());
    best_of(
        size,
        || *pair.borrow_mut() = fresh(),
        |d, _| {
            black_box(pair.borrow_mut().0.seal(d, plain).expect("room"));
        },
        |d, _| {
            black_box(pair.borrow_mut().1.open(d).expect("opens"));
        },
    )
}

/// (seal, open) nanoseconds of the ring call alone that [`measure`]'s seal and open make.
fn measure_ring(aead: Aead, mode: Mode, size: usize) -> (f64, f64) {
    let algorithm = match aead {
        Aead::Aes256Gcm => &aead::AES_256_GCM,
        Aead::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
    };
    let key = LessSafeKey::new(UnboundKey::new(algorithm, &SECRET).expect("32 bytes"));
    let plain = size - TRAILER_LEN;
    let nonce = |counter: u64| {
        let mut n = [0u8; aead::NONCE_LEN];
        n[..4].copy_from_slice(&1u32.to_be_bytes());
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    };
    let tag_at = plain + TRAILER_FIELDS_LEN;
    let seal = |d: &mut [u8], counter: u64| {
        let (datagram, trailer) = d.split_at_mut(plain);
        let tag = match (mode, aead) {
            // Over the datagram itself rather than a scratch copy: the copy is ours.
            (Mode::Authenticate, Aead::Aes256Gcm) => {
                key.seal_in_place_separate_tag(nonce(counter), Aad::empty(), datagram)
            }
            (Mode::Authenticate, Aead::ChaCha20Poly1305) => {
                key.seal_in_place_separate_tag(nonce(counter), Aad::from(&*datagram), &mut [])
            }
            _ => {
                let (header, payload) = datagram.split_at_mut(CLEAR_HEADER_LEN);
                key.seal_in_place_separate_tag(nonce(counter), Aad::from(&*header), payload)
            }
        };
        trailer[TRAILER_FIELDS_LEN..].copy_from_slice(tag.expect("sealed").as_ref());
    };
    best_of(
        size,
        || {},
        seal,
        |d, counter| match mode {
            // Authenticating recomputes the tag: the same call as sealing.
            Mode::Authenticate => seal(d, counter),
            _ => {
                let mut tag = [0u8; 16];
                tag.copy_from_slice(&d[tag_at..size]);
                let (header, payload) = d[..plain].split_at_mut(CLEAR_HEADER_LEN);
                let opened = key.open_in_place_separate_tag(
                    nonce(counter),
                    Aad::from(&*header),
                    aead::Tag::from(tag),
                    payload,
                    0..,
                );
                assert!(black_box(opened).is_ok());
            }
        },
    )
}
