//! The engine's own cost on the main scenario's load: one sender multicasting 1100-byte
//! datagrams as fast as its 100 Mbit/s uplink allows (about 11,400/s) to 99 receivers for 30 s
//! of virtual time, about 34 million arrivals, with hosts that do nothing.
//!
//! Run: `cargo test --release -p tidings-sim --test world_perf -- --ignored --nocapture`

// Helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use tidings_proto::{Destination, NodeId, RegionId, Time};
use tidings_sim::world::{Host, NodeNetConfig, World, WorldConfig};
use tidings_wire::{Kind, HEADER_LEN, MAGIC, VERSION};

const DATAGRAM_BYTES: usize = 1100;

struct Trivial {
    sender: bool,
    arrivals: u64,
    bytes: u64,
}

impl Host for Trivial {
    fn handle_datagram(&mut self, _now: Time, datagram: Bytes) {
        self.arrivals += 1;
        self.bytes += datagram.len() as u64;
    }

    fn handle_timeout(&mut self, _now: Time) {}

    fn poll_transmit(&mut self, _now: Time, buf: &mut [u8]) -> Option<(Destination, usize)> {
        if !self.sender {
            return None;
        }
        buf[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        buf[2] = VERSION;
        buf[3] = Kind::Data as u8;
        buf[4..HEADER_LEN].fill(0);
        Some((Destination::Region(RegionId(0)), DATAGRAM_BYTES))
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn one_to_99_for_30_virtual_seconds() {
    let n = 100;
    let config = WorldConfig::uniform(1, n, &NodeNetConfig::default());
    let hosts = (0..n)
        .map(|i| Trivial {
            sender: i == 0,
            arrivals: 0,
            bytes: 0,
        })
        .collect();
    let regions = BTreeMap::from([(RegionId(0), (0..n as u32).map(NodeId).collect())]);
    let mut world = World::new(config, hosts, regions).unwrap();
    let virtual_end = Time::ZERO + Duration::from_secs(30);
    // Wall time is what this test measures; the engine itself never reads it.
    #[allow(clippy::disallowed_methods)]
    let start = std::time::Instant::now();
    world.run_until(virtual_end);
    let wall = start.elapsed();
    let arrivals: u64 = world.hosts().iter().map(|h| h.arrivals).sum();
    let sent = world.stats().nodes[0].datagrams_sent;
    println!(
        "sent {sent} datagrams, {arrivals} arrivals, {} events in {:.2} s wall: {:.1} M arrivals/s, {:.0} ns/arrival",
        world.stats().events,
        wall.as_secs_f64(),
        arrivals as f64 / wall.as_secs_f64() / 1e6,
        wall.as_nanos() as f64 / arrivals as f64,
    );
    // 100 Mbit/s / (1100 * 8 bit) = 11,364 datagrams/s, to 99 receivers, for 30 s.
    let expected = 99.0 * 30.0 * 100e6 / (DATAGRAM_BYTES as f64 * 8.0);
    assert!(
        (arrivals as f64 - expected).abs() < expected * 0.01,
        "{arrivals} arrivals, expected about {expected}"
    );
    let drops: u64 = world.stats().nodes.iter().map(|s| s.drops.total()).sum();
    assert_eq!(drops, 0);
}
