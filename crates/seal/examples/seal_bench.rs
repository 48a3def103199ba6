//! Cost of sealing and opening one datagram, per mode, AEAD and size.
//!
//! `cargo run --release -p tidings-seal --example seal_bench` prints a Markdown table: ns per
//! datagram and GB/s of datagram bytes, for sealing and for opening (which includes the replay
//! window). Each cell is the best of five runs of a fixed number of datagrams.

#![allow(clippy::disallowed_methods)] // a benchmark reads the wall clock

use std::hint::black_box;
use std::time::Instant;

use tidings_seal::datagram::{COUNTER_LIMIT_DEFAULT, HEADER_SENDER_OFFSET, TRAILER_LEN};
use tidings_seal::{Aead, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, SealingKey};

const SIZES: [usize; 4] = [64, 1000, 1472, 8972];
/// Datagrams sealed, then opened, per round: enough to hide the clock reads, few enough that a
/// round of the largest stays in the last-level cache (2.3 MB).
const BATCH: usize = 256;
const RUNS: usize = 5;

fn rounds(size: usize) -> usize {
    // About 32 MB of datagrams per run.
    ((32 << 20) / (size * BATCH)).max(4)
}

fn main() {
    println!("| AEAD | mode | datagram bytes | seal ns | seal GB/s | open ns | open GB/s |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            for size in SIZES {
                let (seal_ns, open_ns) = measure(aead, mode, size);
                println!(
                    "| {aead:?} | {mode} | {size} | {seal_ns:.0} | {:.2} | {open_ns:.0} | {:.2} |",
                    size as f64 / seal_ns,
                    size as f64 / open_ns
                );
            }
        }
    }
}

/// (seal, open) nanoseconds per datagram of `size` bytes on the wire (the trailer included: the
/// protocol's datagram is `size - TRAILER_LEN`). Each round seals a batch, then opens it; the
/// best of `RUNS` runs is kept for each.
fn measure(aead: Aead, mode: Mode, size: usize) -> (f64, f64) {
    let secret = KeySecret::from_bytes([9; 32]);
    let plain = size - TRAILER_LEN;
    let rounds = rounds(size);
    let count = (rounds * BATCH) as f64;
    let mut best_seal = f64::MAX;
    let mut best_open = f64::MAX;
    let mut batch = vec![0x42u8; size * BATCH];
    for d in batch.chunks_exact_mut(size) {
        // The header's sender is the sealing node (1).
        d[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4].copy_from_slice(&1u32.to_be_bytes());
    }
    for _ in 0..RUNS {
        let mut key = SealingKey::new(aead, mode, KeyId(1), 1, &secret, COUNTER_LIMIT_DEFAULT);
        let mut ring = KeyRing::new(KeyRingConfig {
            mode,
            aead,
            ..KeyRingConfig::default()
        })
        .expect("valid config");
        ring.install(KeyId(1), &secret).expect("empty ring");
        let mut seal_ns = 0u128;
        let mut open_ns = 0u128;
        for _ in 0..rounds {
            let start = Instant::now();
            for d in batch.chunks_exact_mut(size) {
                black_box(key.seal(d, plain).expect("room"));
            }
            let sealed = Instant::now();
            for d in batch.chunks_exact_mut(size) {
                black_box(ring.open(d).expect("opens"));
            }
            open_ns += sealed.elapsed().as_nanos();
            seal_ns += (sealed - start).as_nanos();
        }
        best_seal = best_seal.min(seal_ns as f64 / count);
        best_open = best_open.min(open_ns as f64 / count);
    }
    (best_seal, best_open)
}
