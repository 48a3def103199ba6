//! What a message costs the protocol as the number of regions a node is in grows: the point of
//! tidings is many topics, so the per-message work must not grow with them.
//!
//! Node 0 publishes 1000-byte messages; node 1 is in `R` regions (one topic each, shared with
//! one other node), so it runs `R` token rings. Two workloads:
//! - `one-topic`: node 0 publishes on one topic (one of node 1's regions);
//! - `all-topics`: node 0 publishes round-robin over all `R` topics (it has `R` streams).
//!
//! The wall time spent inside the publisher's and node 1's protocol calls is divided by the
//! messages node 1 delivered, after a warm-up; no loss, 10 ms token rounds, virtual time.
//!
//! ```text
//! cargo run --release -p tidings-proto --example regions_per_node [-- R...]
//! ```

use std::collections::{BTreeMap, VecDeque};
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
    /// Wall time inside nodes 0 and 1.
    measured: Duration,
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
        let config = Config {
            token_interval: Duration::from_millis(10),
            ..Config::default()
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
            measured: Duration::ZERO,
            measuring: false,
            delivered: 0,
        })
    }

    /// Runs `f` on node `i`, timing it if it is node 0 or 1.
    // The wall clock measures the protocol from outside; the protocol itself never reads it.
    #[allow(clippy::disallowed_methods)]
    fn call<R>(&mut self, i: usize, f: impl FnOnce(&mut Node, Time, &mut [u8]) -> R) -> R {
        let timed = self.measuring && i < 2;
        let start = timed.then(Instant::now);
        let result = f(&mut self.nodes[i], self.now, &mut self.buf);
        if let Some(start) = start {
            self.measured += start.elapsed();
        }
        result
    }

    fn flush(&mut self, i: usize) {
        while let Some(event) = self.call(i, |n, _, _| n.poll_event()) {
            if i == 1 && self.measuring && matches!(event, Event::Deliver(_)) {
                self.delivered += 1;
            }
        }
        while let Some(t) = self.call(i, |n, now, buf| n.poll_transmit(now, buf)) {
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
    }

    fn run(&mut self, until: Time, topics: u32, payload: &Bytes, next: &mut (Time, u32)) {
        while self.now < until {
            while next.0 <= self.now {
                let topic = TopicId(next.1 % topics);
                let p = payload.clone();
                // Back pressure (a full window) skips the slot.
                let _ = self.call(0, |n, now, _| n.publish(now, topic, p));
                next.0 += PUBLISH_INTERVAL;
                next.1 = next.1.wrapping_add(1);
            }
            self.flush(0);
            let next_packet = self.wire.front().map(|(t, ..)| *t);
            let next_timer = self.nodes.iter().filter_map(Node::poll_timeout).min();
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
                    self.call(to, |n, now, _| n.handle_datagram(now, datagram));
                    self.flush(to);
                }
            }
            for i in 0..self.nodes.len() {
                if self.nodes[i].poll_timeout().is_some_and(|t| t <= self.now) {
                    self.call(i, |n, now, _| n.handle_timeout(now));
                }
                self.flush(i);
            }
        }
    }
}

fn measure(regions: u32, topics: u32) -> Result<(f64, u64), String> {
    let mut run = Run::new(regions)?;
    let payload = Bytes::from(vec![7u8; 1000]);
    let mut next = (Time::ZERO, 0);
    run.run(Time::ZERO + WARMUP, topics, &payload, &mut next);
    run.measuring = true;
    run.run(Time::ZERO + WARMUP + MEASURED, topics, &payload, &mut next);
    let per_message = run.measured.as_nanos() as f64 / run.delivered.max(1) as f64;
    Ok((per_message, run.delivered))
}

fn main() -> Result<(), String> {
    let counts: Vec<u32> = std::env::args()
        .skip(1)
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
            let (ns, delivered) = measure(regions, topics)?;
            println!("{regions:>17} | {name:<10} | {delivered:>9} | {ns:>8.0}");
        }
    }
    Ok(())
}
