//! Test hosts and packet builders shared by the `world_*` tests.

// Each test binary uses a different part; unwrapping is how a helper fails a test.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use tidings_proto::{Destination, NodeId, RegionId, Time};
use tidings_sim::world::Host;
use tidings_wire::{Kind, HEADER_LEN, MAGIC, VERSION};

/// A datagram of `len` bytes (at least the header plus a tag) with a valid header of `kind` and
/// `tag` in bytes 8..16, so tests can tell datagrams apart.
pub fn packet(kind: Kind, len: usize, tag: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len.max(HEADER_LEN)];
    buf[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    buf[2] = VERSION;
    buf[3] = kind as u8;
    buf[8..16].copy_from_slice(&tag.to_be_bytes());
    buf
}

/// A datagram whose header is not a tidings header (unknown kind), tagged like [`packet`].
pub fn garbage(len: usize, tag: u64) -> Vec<u8> {
    let mut buf = vec![0xffu8; len.max(HEADER_LEN)];
    buf[8..16].copy_from_slice(&tag.to_be_bytes());
    buf
}

/// The tag written by [`packet`].
pub fn tag(datagram: &[u8]) -> u64 {
    u64::from_be_bytes(datagram[8..16].try_into().unwrap())
}

pub fn ms(n: u64) -> Time {
    Time::from_nanos(n * 1_000_000)
}

pub fn us(n: u64) -> Time {
    Time::from_nanos(n * 1_000)
}

/// A host that sends scripted datagrams at given times (through its timer), optionally floods,
/// and records everything it is handed.
#[derive(Debug, Default)]
pub struct ScriptHost {
    /// (time, destination, bytes), in time order.
    pub script: VecDeque<(Time, Destination, Vec<u8>)>,
    /// Due, waiting for the uplink.
    pub outbox: VecDeque<(Destination, Vec<u8>)>,
    /// Extra timer deadlines to be woken at (recorded in `timeouts` when fired).
    pub alarms: Vec<Time>,
    /// (time, datagram) for every datagram handed over.
    pub received: Vec<(Time, Bytes)>,
    /// Times of `handle_timeout` calls at which an alarm fired.
    pub timeouts: Vec<Time>,
    /// Times of every `handle_timeout` call.
    pub timeout_calls: Vec<Time>,
    /// Send this many datagrams as fast as the uplink allows: (destination, length, first tag).
    pub flood: Option<(Destination, usize, u64)>,
    pub flood_left: u64,
    pub flood_kind: Option<Kind>,
    /// Times of every `poll_transmit` that returned a datagram.
    pub sent_at: Vec<Time>,
    next_flood_tag: u64,
}

impl ScriptHost {
    pub fn new() -> ScriptHost {
        ScriptHost::default()
    }

    pub fn send_at(mut self, at: Time, to: Destination, bytes: Vec<u8>) -> ScriptHost {
        self.script.push_back((at, to, bytes));
        self
    }

    pub fn alarm(mut self, at: Time) -> ScriptHost {
        self.alarms.push(at);
        self.alarms.sort();
        self
    }

    pub fn flooding(mut self, to: Destination, len: usize, count: u64) -> ScriptHost {
        self.flood = Some((to, len, 0));
        self.flood_left = count;
        self
    }

    pub fn tags(&self) -> Vec<u64> {
        self.received.iter().map(|(_, d)| tag(d)).collect()
    }
}

impl Host for ScriptHost {
    fn handle_datagram(&mut self, now: Time, datagram: Bytes) {
        if let Some(&(last, _)) = self.received.last() {
            assert!(now >= last, "time went backwards");
        }
        self.received.push((now, datagram));
    }

    fn handle_timeout(&mut self, now: Time) {
        self.timeout_calls.push(now);
        while self.script.front().is_some_and(|(at, ..)| *at <= now) {
            let (_, to, bytes) = self.script.pop_front().unwrap();
            self.outbox.push_back((to, bytes));
        }
        while self.alarms.first().is_some_and(|at| *at <= now) {
            self.alarms.remove(0);
            self.timeouts.push(now);
        }
    }

    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Destination, usize)> {
        let (to, bytes) = if let Some(item) = self.outbox.pop_front() {
            item
        } else if let (Some((to, len, _)), true) = (self.flood, self.flood_left > 0) {
            self.flood_left -= 1;
            let t = self.next_flood_tag;
            self.next_flood_tag += 1;
            (to, packet(self.flood_kind.unwrap_or(Kind::Data), len, t))
        } else {
            return None;
        };
        self.sent_at.push(now);
        buf[..bytes.len()].copy_from_slice(&bytes);
        Some((to, bytes.len()))
    }

    fn poll_timeout(&self) -> Option<Time> {
        let script = self.script.front().map(|(at, ..)| *at);
        let alarm = self.alarms.first().copied();
        match (script, alarm) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One region holding nodes `0..n`.
pub fn one_region(n: u32) -> BTreeMap<RegionId, Vec<NodeId>> {
    BTreeMap::from([(RegionId(0), (0..n).map(NodeId).collect())])
}

pub fn to_node(i: u32) -> Destination {
    Destination::Node(NodeId(i))
}

pub fn to_region(r: u32) -> Destination {
    Destination::Region(RegionId(r))
}

pub fn dur_us(n: u64) -> Duration {
    Duration::from_micros(n)
}

pub fn dur_ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
