//! What a message costs the protocol as the number of regions a node is in grows: the point of
//! tidings is many topics, so the per-message work must not grow with them.
//!
//! Node 0 publishes 1000-byte messages; node 1 is in `R` regions (one topic each, shared with
//! one other node), so it runs `R` token rings. Two workloads:
//! - `one-topic`: node 0 publishes on one topic (one of node 1's regions);
//! - `all-topics`: node 0 publishes round-robin over all `R` topics (it has `R` streams).
//!
//! The wall time spent inside the publisher's and node 1's protocol calls is divided by the
//! messages node 1 delivered, after a warm-up; no loss, 10 ms token rounds, virtual time. The
//! harness only calls a node when it has a datagram or a deadline (a heap of the nodes'
//! deadlines), so the other nodes' state does not pass through the cache between the measured
//! calls, as it would not between two processes; `--by-call` adds the time per kind of call.
//!
//! ```text
//! cargo run --release -p tidings-proto --example regions_per_node [-- [--by-call] R...]
//! ```

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tidings_proto::{Config, Destination, Event, Membership, Node, NodeId, Time, TopicId};

/// One message every 10 µs of virtual time.
const PUBLISH_INTERVAL: Duration = Duration::from_micros(10);
const LATENCY: Duration = Duration::from_micros(50);
const WARMUP: Duration = Duration::from_secs(1);
const MEASURED: Duration = Duration::from_secs(2);

struct Run {
    nodes: Vec<Node>,
    membership: Membership,
    now: Time,
    wire: VecDeque<(Time, usize, Bytes)>,
    block: BytesMut,
    buf: Vec<u8>,
    /// Each node's deadline as last entered in `deadlines` (older entries there are stale).
    deadline_of: Vec<Option<Time>>,
    deadlines: BinaryHeap<Reverse<(Time, usize)>>,
    /// Wall time inside nodes 0 and 1.
    measured: Duration,
    /// Wall time and calls per kind of call (node and method), for `--by-call`.
    by_call: BTreeMap<(usize, &'static str), (Duration, u64)>,
    measuring: bool,
    delivered: u64,
}

impl Run {
    fn new(regions: u32) -> Result<Run, String> {
        // Node 1 subscribes to every topic; node 2 + i to topic i alone: topic i's region is
        // {1, 2 + i}, so node 1 is in `regions` regions.
        let mut subscriptions: BTreeMap<NodeId, Vec<TopicId>> = BTreeMap::new();
        subscriptions.insert(NodeId(0), vec![]);
        subscriptions.insert(NodeId(1), (0..regions).map(TopicId).collect());
        for i in 0..regions {
            subscriptions.insert(NodeId(2 + i), vec![TopicId(i)]);
        }
        let membership = Membership::from_subscriptions(&subscriptions, 5);
        let config = {
            let mut c = Config::default();
            c.token_interval = Duration::from_millis(10);
            c
        };
        let nodes = (0..regions + 2)
            .map(|i| Node::new(config.clone(), NodeId(i), membership.clone(), Time::ZERO))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        Ok(Run {
            nodes,
            membership,
            now: Time::ZERO,
            wire: VecDeque::new(),
            block: BytesMut::new(),
            buf: vec![0; 1472],
            deadline_of: vec![None; regions as usize + 2],
            deadlines: BinaryHeap::new(),
            measured: Duration::ZERO,
            by_call: BTreeMap::new(),
            measuring: false,
            delivered: 0,
        })
    }

    /// Enters node `i`'s deadline in the heap if it moved.
    fn update_deadline(&mut self, i: usize) {
        let at = self.nodes[i].poll_timeout().map(|(at, _)| at);
        if at != self.deadline_of[i] {
            self.deadline_of[i] = at;
            if let Some(at) = at {
                self.deadlines.push(Reverse((at, i)));
            }
        }
    }

    /// The earliest current deadline of any node (stale heap entries dropped).
    fn next_deadline(&mut self) -> Option<Time> {
        while let Some(&Reverse((at, i))) = self.deadlines.peek() {
            if self.deadline_of[i] == Some(at) {
                return Some(at);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Runs `f` on node `i`, timing it if it is node 0 or 1.
    // The wall clock measures the protocol from outside; the protocol itself never reads it.
    #[allow(clippy::disallowed_methods)]
    fn call<R>(
        &mut self,
        i: usize,
        kind: &'static str,
        f: impl FnOnce(&mut Node, Time, &mut [u8]) -> R,
    ) -> R {
        let timed = self.measuring && i < 2;
        let start = timed.then(Instant::now);
        let result = f(&mut self.nodes[i], self.now, &mut self.buf);
        if let Some(start) = start {
            let spent = start.elapsed();
            self.measured += spent;
            let entry = self.by_call.entry((i, kind)).or_default();
            entry.0 += spent;
            entry.1 += 1;
        }
        result
    }

    /// Takes node `i`'s events and datagrams, then its new deadline.
    // The wall clock measures the protocol from outside; the protocol itself never reads it.
    #[allow(clippy::disallowed_methods)]
    fn flush(&mut self, i: usize) {
        while let Some(event) = self.call(i, "poll_event", |n, _, _| n.poll_event()) {
            if i == 1 && self.measuring && matches!(event, Event::Deliver(_)) {
                self.delivered += 1;
            }
        }
        while let Some(t) = self.call(i, "poll_transmit", |n, now, buf| {
            n.poll_transmit(now, buf)
                .expect("the buffer holds max_datagram_bytes")
        }) {
            let to: Vec<usize> = match t.destination {
                Destination::Node(n) => vec![n.0 as usize],
                Destination::Region(r) => {
                    self.membership.members(r).map(|n| n.0 as usize).collect()
                }
            };
            for d in to.into_iter().filter(|&d| d != i) {
                if self.block.capacity() < t.len {
                    self.block = BytesMut::with_capacity(1 << 20);
                }
                self.block.extend_from_slice(&self.buf[..t.len]);
                let datagram = self.block.split().freeze();
                self.wire.push_back((self.now + LATENCY, d, datagram));
            }
        }
        let timed = self.measuring && i < 2;
        let start = timed.then(Instant::now);
        self.update_deadline(i);
        if let Some(start) = start {
            self.measured += start.elapsed();
            let entry = self.by_call.entry((i, "poll_timeout")).or_default();
            entry.0 += start.elapsed();
            entry.1 += 1;
        }
    }

    fn run(&mut self, until: Time, topics: u32, payload: &Bytes, next: &mut (Time, u32)) {
        while self.now < until {
            while next.0 <= self.now {
                let topic = TopicId(next.1 % topics);
                let p = payload.clone();
                // Back pressure (a full window) skips the slot.
                let _ = self.call(0, "publish", |n, now, _| n.publish(now, topic, p));
                next.0 += PUBLISH_INTERVAL;
                next.1 = next.1.wrapping_add(1);
            }
            self.flush(0);
            let next_packet = self.wire.front().map(|(t, ..)| *t);
            let next_timer = self.next_deadline();
            let step = [next_packet, next_timer, Some(next.0)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(until);
            self.now = self.now.max(step).min(until);
            while let Some(&(t, to, _)) = self.wire.front() {
                if t > self.now {
                    break;
                }
                if let Some((_, _, datagram)) = self.wire.pop_front() {
                    self.call(to, "handle_datagram", |n, now, _| {
                        n.handle_datagram(now, datagram)
                    });
                    self.flush(to);
                }
            }
            while self.next_deadline().is_some_and(|t| t <= self.now) {
                let Some(Reverse((_, i))) = self.deadlines.pop() else {
                    break;
                };
                self.deadline_of[i] = None;
                self.call(i, "handle_timeout", |n, now, _| n.handle_timeout(now));
                self.flush(i);
            }
        }
    }
}

/// Runs one workload; with `by_call`, prints where nodes 0 and 1 spent their time.
fn measure(regions: u32, topics: u32, by_call: bool) -> Result<(f64, u64), String> {
    let mut run = Run::new(regions)?;
    let payload = Bytes::from(vec![7u8; 1000]);
    let mut next = (Time::ZERO, 0);
    run.run(Time::ZERO + WARMUP, topics, &payload, &mut next);
    run.measuring = true;
    run.run(Time::ZERO + WARMUP + MEASURED, topics, &payload, &mut next);
    let delivered = run.delivered.max(1) as f64;
    let per_message = run.measured.as_nanos() as f64 / delivered;
    if by_call {
        for ((node, kind), (spent, calls)) in &run.by_call {
            println!(
                "    node {node} {kind:<15} {:>6.0} ns per message, {calls:>8} calls, {:>7.0} ns per call",
                spent.as_nanos() as f64 / delivered,
                spent.as_nanos() as f64 / (*calls).max(1) as f64
            );
        }
    }
    Ok((per_message, run.delivered))
}

fn main() -> Result<(), String> {
    let by_call = std::env::args().any(|a| a == "--by-call");
    let counts: Vec<u32> = std::env::args()
        .skip(1)
        .filter(|a| a != "--by-call")
        .map(|a| a.parse().map_err(|e| format!("{a}: {e}")))
        .collect::<Result<_, _>>()?;
    let counts = if counts.is_empty() {
        vec![1, 10, 100, 1000]
    } else {
        counts
    };
    println!("regions of node 1 | workload   | delivered | ns per message (nodes 0 and 1)");
    for &regions in &counts {
        for (name, topics) in [("one-topic", 1), ("all-topics", regions)] {
            let (ns, delivered) = measure(regions, topics, by_call)?;
            println!("{regions:>17} | {name:<10} | {delivered:>9} | {ns:>8.0}");
        }
    }
    Ok(())
}
