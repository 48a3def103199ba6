//! Cost of sealing and opening one datagram, per mode, AEAD and size.
//!
//! `cargo run --release -p tidings-seal --example seal_bench` prints a Markdown table: ns per
//! datagram and GB/s of datagram bytes, for sealing and for opening (which includes the replay
//! window). Each cell is the best of five runs of a fixed number of datagrams.

#![allow(clippy::disallowed_methods)] // a benchmark reads the wall clock

use std::hint::black_box;
use std::time::Instant;

use tidings_seal::datagram::{COUNTER_LIMIT_DEFAULT, TRAILER_LEN};
use tidings_seal::{Aead, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, SealingKey};

const SIZES: [usize; 4] = [64, 1000, 1472, 8972];
const RUNS: usize = 5;

fn bytes_per_run(size: usize) -> usize {
    // About 64 MB of datagrams per run, at least 20 000 datagrams.
    (64 << 20).max(size * 20_000)
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

/// (seal, open) nanoseconds per datagram of `size` bytes (trailer included in the datagram
/// bytes: the protocol's datagram is `size - TRAILER_LEN`).
fn measure(aead: Aead, mode: Mode, size: usize) -> (f64, f64) {
    let secret = KeySecret::from_bytes([9; 32]);
    let plain = size - TRAILER_LEN;
    let count = bytes_per_run(size) / size;
    let mut best_seal = f64::MAX;
    let mut best_open = f64::MAX;
    for _ in 0..RUNS {
        let mut key = SealingKey::new(aead, mode, KeyId(1), 1, &secret, COUNTER_LIMIT_DEFAULT);
        let mut ring = KeyRing::new(KeyRingConfig {
            mode,
            aead,
            ..KeyRingConfig::default()
        })
        .expect("valid config");
        ring.install(KeyId(1), &secret).expect("empty ring");
        let mut buf = vec![0x42u8; size];
        // Seal only.
        let start = Instant::now();
        for _ in 0..count {
            black_box(key.seal(&mut buf, plain).expect("room"));
        }
        best_seal = best_seal.min(start.elapsed().as_nanos() as f64 / count as f64);
        // Seal then open (each open needs a fresh counter); subtract the sealing time.
        let start = Instant::now();
        for _ in 0..count {
            let n = key.seal(&mut buf, plain).expect("room");
            black_box(ring.open(&mut buf[..n]).expect("opens"));
        }
        let both = start.elapsed().as_nanos() as f64 / count as f64;
        best_open = best_open.min((both - best_seal).max(0.0));
    }
    (best_seal, best_open)
}
