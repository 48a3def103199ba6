//! `cargo run --release -p tidings-bench --example runtime_bench [-- --quick] [--multicast]`: one
//! publisher to 1 and to 4 subscribers, 1000-byte and 64-byte messages, on loopback; messages/s,
//! MB/s, latency and heap allocations per message, next to the raw UDP ceiling of the same
//! datagram size measured in the same run.

use std::alloc::System;
use std::time::Duration;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings_bench::runtime::{self as bench, BenchSpec, RawMode};
use tidings_runtime::{MulticastConfig, Transport};

// Counts every allocation in the process (all threads).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn allocations() -> u64 {
    GLOBAL.stats().allocations as u64 + GLOBAL.stats().reallocations as u64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let multicast = args.iter().any(|a| a == "--multicast");
    let (warmup, duration) = if quick {
        (Duration::from_millis(300), Duration::from_secs(1))
    } else {
        (Duration::from_secs(1), Duration::from_secs(3))
    };
    // `--subs N` and `--bytes B` restrict the matrix (for profiling one case).
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let subs_list: Vec<u32> = arg("--subs").map_or(vec![1, 4], |s| vec![s as u32]);
    let bytes_list: Vec<usize> = arg("--bytes").map_or(vec![1000, 64], |b| vec![b]);
    let max_only = args.iter().any(|a| a == "--max-only");
    // `--window N`: the protocol's window of unstable messages per stream (and twice that for
    // the receive window); `--token-ms T`: the token interval.
    let mut protocol = tidings_proto::Config::default();
    if let Some(w) = arg("--window") {
        protocol.window.msgs_max = w;
        protocol.receive_window_msgs = protocol.receive_window_msgs.max(2 * w);
    }
    if let Some(t) = arg("--token-ms") {
        protocol.token_interval = Duration::from_millis(t as u64);
        protocol.token_timeout = protocol.token_timeout.max(3 * protocol.token_interval);
    }
    let transport = if multicast {
        Transport::Multicast(MulticastConfig::default())
    } else {
        Transport::Unicast
    };
    let max_datagram = tidings_proto::Config::default().max_datagram_bytes;
    println!(
        "protocol: window_msgs_max {}, token_interval {:?}",
        protocol.window.msgs_max, protocol.token_interval
    );
    println!(
        "transport: {}; warm-up {warmup:?}, measured {duration:?} per run; {} cores",
        if multicast {
            "IP multicast (loopback)"
        } else {
            "unicast fan-out (loopback)"
        },
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!();
    println!("| subs | msg B | mode | msgs/s | MB/s | p50 µs | p99 µs | allocs/msg | sender dgrams/s | send calls/s | raw UDP MB/s plain / batched (dgram B) | ratio to batched |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &subscribers in &subs_list {
        for &message_bytes in &bytes_list {
            let (per_datagram, datagram_bytes) = bench::packing(message_bytes, max_datagram);
            let plain = bench::raw_udp(
                RawMode::Plain,
                datagram_bytes,
                per_datagram,
                message_bytes,
                subscribers,
                duration,
            )?;
            let raw = bench::raw_udp(
                RawMode::Batched,
                datagram_bytes,
                per_datagram,
                message_bytes,
                subscribers,
                duration,
            )?;
            let rates: &[Option<u64>] = if max_only {
                &[None]
            } else {
                &[None, Some(10_000)]
            };
            for &rate in rates {
                let spec = BenchSpec {
                    subscribers,
                    message_bytes,
                    warmup,
                    duration,
                    rate_per_sec: rate,
                    transport: transport.clone(),
                    protocol: protocol.clone(),
                };
                let r = bench::run(&spec, Some(&allocations))?;
                println!(
                    "| {subscribers} | {message_bytes} | {} | {:.0} | {:.1} | {} | {} | {} | {:.0} | {:.0} | {:.1} / {:.1} ({datagram_bytes}) | {} |",
                    rate.map_or("max".to_owned(), |r| format!("{r}/s")),
                    r.messages_per_sec,
                    r.payload_mb_per_sec,
                    r.latency_p50_us,
                    r.latency_p99_us,
                    r.allocations_per_message
                        .map_or("-".to_owned(), |a| format!("{a:.3}")),
                    r.sender_datagrams_per_sec,
                    r.sender_send_calls_per_sec,
                    plain.payload_mb_per_sec,
                    raw.payload_mb_per_sec,
                    if rate.is_none() {
                        format!("{:.2}", r.payload_mb_per_sec / raw.payload_mb_per_sec.max(1e-9))
                    } else {
                        "-".to_owned()
                    },
                );
                if r.order_errors > 0 {
                    eprintln!("ORDER ERRORS: {}", r.order_errors);
                }
            }
            for r in [&plain, &raw] {
                eprintln!(
                    "raw UDP {:?} {datagram_bytes} B to {subscribers}: {:.0} dgrams/s per receiver, loss {:.1}%",
                    r.mode,
                    r.datagrams_per_sec,
                    r.loss_fraction * 100.0
                );
            }
        }
    }
    Ok(())
}
