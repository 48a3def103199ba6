//! Heap allocations made by the protocol in steady state: one sender publishing a steady stream to
//! a region of receivers (several partitions, so every ring level runs), no loss, token rounds
//! every 10 ms as on a real network. Allocations are counted only inside the protocol's calls
//! (`publish`, `handle_datagram`, `handle_timeout`, `poll_transmit`, `poll_event`), after a
//! warm-up that lets every buffer reach its working size. The target of issue 4 is zero per
//! message; this test holds it at zero in total, per message and per token round alike. With loss,
//! the range lists of pulls, NAKs and token records with gaps are reused too; what is left is
//! buffers growing to a new high, printed and bounded.
//!
//! Allocations are counted by a global allocator, so this file holds a single test: another test
//! running in a parallel thread would be counted too.

#![allow(clippy::unwrap_used)]

use std::alloc::System;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings_proto::{Config, Destination, Event, Membership, Node, NodeId, Time, TopicId};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const TOPIC: TopicId = TopicId(1);
const PAYLOAD_BYTES: usize = 1000;
/// One message every 20 µs of virtual time: 50 000 messages/s.
const PUBLISH_INTERVAL: Duration = Duration::from_micros(20);
/// One-way delay of every datagram.
const LATENCY: Duration = Duration::from_micros(50);

/// Counts heap allocations (and reallocations) made inside the closures it runs, while `on`.
struct AllocationCounter {
    on: bool,
    allocations: u64,
}

impl AllocationCounter {
    fn count<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let region = Region::new(GLOBAL);
        let result = f();
        let change = region.change();
        if self.on {
            self.allocations += (change.allocations + change.reallocations) as u64;
        }
        result
    }
}

struct Harness {
    nodes: Vec<Node>,
    membership: Membership,
    now: Time,
    /// Datagrams in flight, in arrival order (a constant delay keeps the queue sorted).
    wire: VecDeque<(Time, usize, Bytes)>,
    /// Receive blocks the datagrams are cut from, as the runtime's arena does: their `Bytes` are
    /// shared (reference-counted) from the start, so cloning a slice never allocates.
    block: BytesMut,
    counter: AllocationCounter,
    delivered: Vec<u64>,
    token_rounds: u64,
    /// Every `drop_every`-th datagram is lost (0: none).
    drop_every: u64,
    datagrams: u64,
    buf: Vec<u8>,
}

impl Harness {
    fn new(receivers: u32, partition: usize) -> Harness {
        let subscriptions: BTreeMap<NodeId, Vec<TopicId>> = (0..=receivers)
            .map(|i| (NodeId(i), if i == 0 { vec![] } else { vec![TOPIC] }))
            .collect();
        let membership = Membership::from_subscriptions(&subscriptions, partition);
        let config = {
            let mut c = Config::default();
            c.token_interval = Duration::from_millis(10);
            c
        };
        let nodes = (0..=receivers)
            .map(|i| Node::new(config.clone(), NodeId(i), membership.clone(), Time::ZERO).unwrap())
            .collect();
        Harness {
            nodes,
            membership,
            now: Time::ZERO,
            wire: VecDeque::new(),
            block: BytesMut::new(),
            counter: AllocationCounter {
                on: false,
                allocations: 0,
            },
            delivered: vec![0; receivers as usize + 1],
            token_rounds: 0,
            drop_every: 0,
            datagrams: 0,
            buf: vec![0; 1472],
        }
    }

    /// Takes node `i`'s events and datagrams.
    fn flush(&mut self, i: usize) {
        loop {
            let Some(event) = self.counter.count(|| self.nodes[i].poll_event()) else {
                break;
            };
            match event {
                Event::Deliver(_) => self.delivered[i] += 1,
                Event::TokenRound { top: true, .. } => self.token_rounds += 1,
                _ => {}
            }
        }
        loop {
            let now = self.now;
            let node = &mut self.nodes[i];
            let buf = &mut self.buf;
            let polled = self.counter.count(|| node.poll_transmit(now, buf));
            let Some(t) = polled.expect("the buffer holds max_datagram_bytes") else {
                break;
            };
            let bytes = &self.buf[..t.len];
            let destinations: Vec<usize> = match t.destination {
                Destination::Node(n) => vec![n.0 as usize],
                Destination::Region(r) => {
                    self.membership.members(r).map(|n| n.0 as usize).collect()
                }
            };
            for d in destinations.into_iter().filter(|&d| d != i) {
                self.datagrams += 1;
                if self.drop_every > 0 && self.datagrams.is_multiple_of(self.drop_every) {
                    continue;
                }
                if self.block.capacity() < bytes.len() {
                    self.block = BytesMut::with_capacity(1 << 20);
                }
                self.block.extend_from_slice(bytes);
                let datagram = self.block.split().freeze();
                self.wire.push_back((self.now + LATENCY, d, datagram));
            }
        }
    }

    /// Runs until `until`, publishing one message every [`PUBLISH_INTERVAL`].
    fn run(&mut self, until: Time, payload: &Bytes, next_publish: &mut Time) {
        while self.now < until {
            while *next_publish <= self.now {
                let (node, now, p) = (&mut self.nodes[0], self.now, payload.clone());
                self.counter
                    .count(|| node.publish(now, TOPIC, p))
                    .expect("the window never fills without loss");
                *next_publish += PUBLISH_INTERVAL;
            }
            self.flush(0);
            let next_packet = self.wire.front().map(|(t, ..)| *t);
            let next_timer = self
                .nodes
                .iter()
                .filter_map(|n| n.poll_timeout().map(|(at, _)| at))
                .min();
            let next = [next_packet, next_timer, Some(*next_publish)]
                .into_iter()
                .flatten()
                .min()
                .unwrap();
            self.now = self.now.max(next).min(until);
            while self.wire.front().is_some_and(|(t, ..)| *t <= self.now) {
                let (_, to, datagram) = self.wire.pop_front().unwrap();
                let (node, now) = (&mut self.nodes[to], self.now);
                self.counter.count(|| node.handle_datagram(now, datagram));
                self.flush(to);
            }
            for i in 0..self.nodes.len() {
                if self.nodes[i]
                    .poll_timeout()
                    .is_some_and(|(t, _)| t <= self.now)
                {
                    let (node, now) = (&mut self.nodes[i], self.now);
                    self.counter.count(|| node.handle_timeout(now));
                }
                self.flush(i);
            }
        }
    }
}

#[test]
fn no_heap_allocation_per_message_in_steady_state() {
    // 6 receivers in partitions of 2: three partitions, so the partition rings and the ring of
    // partition leaders both run.
    let mut h = Harness::new(6, 2);
    let payload = Bytes::from(vec![7u8; PAYLOAD_BYTES]);
    let mut next_publish = Time::ZERO;
    h.run(
        Time::ZERO + Duration::from_secs(4),
        &payload,
        &mut next_publish,
    );

    let delivered_before = h.delivered[1];
    let rounds_before = h.token_rounds;
    h.counter.on = true;
    h.run(
        Time::ZERO + Duration::from_secs(8),
        &payload,
        &mut next_publish,
    );
    let messages = h.delivered[1] - delivered_before;
    let rounds = h.token_rounds - rounds_before;
    let allocations = h.counter.allocations;
    eprintln!(
        "{messages} messages, {rounds} token rounds, {allocations} allocations inside the \
         protocol ({:.4} per message, {:.2} per round)",
        allocations as f64 / messages as f64,
        allocations as f64 / rounds.max(1) as f64
    );
    assert!(messages >= 90_000, "only {messages} messages delivered");
    assert!(rounds >= 100, "only {rounds} token rounds");
    for (i, &d) in h.delivered.iter().enumerate().skip(1) {
        assert!(d + 1000 >= h.delivered[1], "receiver {i} fell behind: {d}");
    }
    assert_eq!(
        allocations, 0,
        "the protocol allocated in steady state ({messages} messages, {rounds} token rounds)"
    );

    // The same stream with 1% of the datagrams lost: gaps, pulls, pushes and retransmissions reuse
    // their range lists. Not held to zero: see the bound below.
    h.drop_every = 100;
    h.counter.on = false;
    h.run(
        Time::ZERO + Duration::from_secs(10),
        &payload,
        &mut next_publish,
    );
    let delivered_before = h.delivered[1];
    h.counter.allocations = 0;
    h.counter.on = true;
    h.run(
        Time::ZERO + Duration::from_secs(14),
        &payload,
        &mut next_publish,
    );
    let messages = h.delivered[1] - delivered_before;
    eprintln!(
        "with 1% loss: {messages} messages, {} allocations inside the protocol ({:.5} per message)",
        h.counter.allocations,
        h.counter.allocations as f64 / messages as f64
    );
    assert!(
        messages >= 190_000,
        "only {messages} messages delivered with loss"
    );
    // 18 over 200 000 messages when measured (6 817 before token records reused their lists).
    // What remains is buffers doubling when the loss pattern sets a new high: the receive window,
    // the sender's unstable messages, the event queue, a pooled range list that must hold more
    // ranges than before. Longer runs keep finding new highs (5 to 10 per further 200 000
    // messages), so the bound leaves room for that and catches any allocation per repair.
    assert!(
        h.counter.allocations * 2_000 <= messages,
        "repairs allocate more than one per 2 000 messages: {}",
        h.counter.allocations
    );
}
