//! The oracle: checks the delivery promise of DESIGN.md section 1 on every event of a run.
//!
//! - every message a sender publishes on topic T is delivered to every subscriber of T,
//! - exactly once and in sender order (a per receiver and sender cursor over the sender's
//!   publication log must advance one subscribed message at a time),
//! - with the payload that was published,
//! - and a message is reported stable only when every subscriber has delivered it.
//!
//! It works incrementally (O(1) per delivery, O(subscribers) per stability report) so it can watch
//! tens of millions of deliveries without keeping them.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use tidings_proto::{Delivery, MsgId, NodeId, Time, TopicId};

/// Most violation descriptions kept (all are counted).
const VIOLATIONS_KEPT: usize = 20;

/// Bytes of a payload that identify it: origin (u32) then message id (u64).
pub const PAYLOAD_ID_LEN: usize = 12;

/// The payload a simulated publisher sends: its identity, then filler derived from it, so any
/// corruption or mix-up is caught.
#[must_use]
pub fn payload_for(origin: NodeId, msg_id: u64, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(len.max(PAYLOAD_ID_LEN));
    p.extend_from_slice(&origin.0.to_be_bytes());
    p.extend_from_slice(&msg_id.to_be_bytes());
    let fill = (msg_id as u8) ^ (origin.0 as u8);
    p.resize(len.max(PAYLOAD_ID_LEN), fill);
    p
}

/// Whether a delivered payload is the one published. Identity and length are checked on every
/// delivery; the filler on one message id in 64 at every receiver (payloads are zero-copy slices of
/// datagrams, so a wrong slice shows in identity or length, and checking every byte of tens of
/// millions of deliveries would dominate a run).
fn payload_ok(d: &Delivery, expected_len: usize) -> bool {
    let p = &d.payload[..];
    let identity = p.len() == expected_len
        && p.len() >= PAYLOAD_ID_LEN
        && p[0..4] == d.origin.0.to_be_bytes()
        && p[4..12] == d.msg_id.0.to_be_bytes();
    if !identity {
        return false;
    }
    if !d.msg_id.0.is_multiple_of(64) {
        return true;
    }
    let fill = (d.msg_id.0 as u8) ^ (d.origin.0 as u8);
    p[PAYLOAD_ID_LEN..].iter().all(|&b| b == fill)
}

#[derive(Debug, Default)]
struct SenderLog {
    topics: Vec<TopicId>,
    lens: Vec<u32>,
    published_at: Vec<Time>,
    stable: Vec<bool>,
    stable_count: u64,
}

/// What the checker saw.
#[derive(Debug)]
pub struct Ledger {
    /// Sorted subscriptions per node.
    subscriptions: Vec<Vec<TopicId>>,
    subscribers: BTreeMap<TopicId, Vec<NodeId>>,
    senders: BTreeMap<NodeId, SenderLog>,
    /// `cursors[r][s]`: index in sender `s`'s log just after the last message `r` delivered.
    cursors: Vec<BTreeMap<NodeId, usize>>,
    violations: Vec<String>,
    violation_count: u64,
    deliveries: u64,
    /// Publish to stable, microseconds.
    pub time_to_stable_us: Histogram<u64>,
    /// Publish to delivery at each receiver, microseconds.
    pub latency_us: Histogram<u64>,
    /// Round trips of top-level (region) rings, microseconds.
    pub token_rtt_us: Histogram<u64>,
    /// Round trips of lower rings (partitions and intermediate levels), microseconds.
    pub partition_token_rtt_us: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    // Three significant digits from 1 us to an hour.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

impl Ledger {
    /// A ledger for nodes with the given subscriptions (`subscriptions[i]` for `NodeId(i)`).
    #[must_use]
    pub fn new(subscriptions: &[Vec<TopicId>]) -> Self {
        let mut subs: Vec<Vec<TopicId>> = subscriptions.to_vec();
        let mut subscribers: BTreeMap<TopicId, Vec<NodeId>> = BTreeMap::new();
        for (i, s) in subs.iter_mut().enumerate() {
            s.sort_unstable();
            s.dedup();
            for &t in s.iter() {
                subscribers.entry(t).or_default().push(NodeId(i as u32));
            }
        }
        Ledger {
            cursors: vec![BTreeMap::new(); subs.len()],
            subscriptions: subs,
            subscribers,
            senders: BTreeMap::new(),
            violations: Vec::new(),
            violation_count: 0,
            deliveries: 0,
            time_to_stable_us: histogram(),
            latency_us: histogram(),
            token_rtt_us: histogram(),
            partition_token_rtt_us: histogram(),
        }
    }

    fn violation(&mut self, text: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(text);
        }
    }

    fn subscribes(&self, node: NodeId, topic: TopicId) -> bool {
        self.subscriptions
            .get(node.0 as usize)
            .is_some_and(|s| s.binary_search(&topic).is_ok())
    }

    /// A sender published `msg_id` on `topic` with a payload of `len` bytes.
    pub fn published(
        &mut self,
        origin: NodeId,
        msg_id: MsgId,
        topic: TopicId,
        len: usize,
        now: Time,
    ) {
        let log = self.senders.entry(origin).or_default();
        let expected = log.topics.len() as u64 + 1;
        log.topics.push(topic);
        log.lens.push(u32::try_from(len).unwrap_or(u32::MAX));
        log.published_at.push(now);
        log.stable.push(false);
        if msg_id.0 != expected {
            self.violation(format!(
                "{origin} published message id {} where {expected} was due",
                msg_id.0
            ));
        }
    }

    /// `receiver` delivered `d`.
    pub fn delivered(&mut self, receiver: NodeId, d: &Delivery, now: Time) {
        self.deliveries += 1;
        let expected_len = self
            .senders
            .get(&d.origin)
            .and_then(|l| l.lens.get(d.msg_id.0.saturating_sub(1) as usize))
            .map_or(usize::MAX, |&l| l as usize);
        if !payload_ok(d, expected_len) {
            self.violation(format!(
                "{receiver} got a corrupt payload for {}#{}",
                d.origin, d.msg_id.0
            ));
        }
        if !self.subscribes(receiver, d.topic) {
            self.violation(format!(
                "{receiver} got {}#{} on topic {} it does not subscribe to",
                d.origin, d.msg_id.0, d.topic
            ));
        }
        let Some(log) = self.senders.get(&d.origin) else {
            self.violation(format!(
                "{receiver} got {}#{} that was never published",
                d.origin, d.msg_id.0
            ));
            return;
        };
        let subs = &self.subscriptions[receiver.0 as usize];
        let mut idx = self.cursors[receiver.0 as usize]
            .get(&d.origin)
            .copied()
            .unwrap_or(0);
        while idx < log.topics.len() && subs.binary_search(&log.topics[idx]).is_err() {
            idx += 1;
        }
        let expected = idx as u64 + 1;
        if let Some(&at) = log.published_at.get(d.msg_id.0.saturating_sub(1) as usize) {
            let _ = self
                .latency_us
                .record(now.saturating_duration_since(at).as_micros().max(1) as u64);
        }
        if d.msg_id.0 != expected {
            let what = if d.msg_id.0 < expected {
                "duplicate or reordered"
            } else {
                "gap before"
            };
            self.violation(format!(
                "{receiver} delivered {}#{} ({what}); expected #{expected}",
                d.origin, d.msg_id.0
            ));
        }
        let next = (d.msg_id.0 as usize).max(idx);
        self.cursors[receiver.0 as usize].insert(d.origin, next);
    }

    /// `origin` reported `msg_id` stable.
    pub fn stable(&mut self, origin: NodeId, msg_id: MsgId, now: Time) {
        let idx = msg_id.0.saturating_sub(1) as usize;
        let Some(log) = self.senders.get_mut(&origin) else {
            self.violation(format!(
                "{origin} reported unknown message #{} stable",
                msg_id.0
            ));
            return;
        };
        let (Some(&topic), Some(&at)) = (log.topics.get(idx), log.published_at.get(idx)) else {
            self.violation(format!(
                "{origin} reported unpublished message #{} stable",
                msg_id.0
            ));
            return;
        };
        if log.stable[idx] {
            self.violation(format!("{origin} reported #{} stable twice", msg_id.0));
            return;
        }
        log.stable[idx] = true;
        log.stable_count += 1;
        let _ = self
            .time_to_stable_us
            .record(now.saturating_duration_since(at).as_micros().max(1) as u64);
        let mut missing = Vec::new();
        for &r in self.subscribers.get(&topic).map_or(&[][..], Vec::as_slice) {
            let cursor = self.cursors[r.0 as usize]
                .get(&origin)
                .copied()
                .unwrap_or(0);
            if cursor <= idx {
                missing.push(r);
            }
        }
        if let Some(r) = missing.first() {
            self.violation(format!(
                "{origin}#{} reported stable but {} subscriber(s) had not delivered it (first: {r})",
                msg_id.0,
                missing.len()
            ));
        }
    }

    /// Records a token round trip.
    pub fn token_round(&mut self, top: bool, rtt: std::time::Duration) {
        let us = rtt.as_micros().max(1) as u64;
        let h = if top {
            &mut self.token_rtt_us
        } else {
            &mut self.partition_token_rtt_us
        };
        let _ = h.record(us);
    }

    /// Messages published in all.
    #[must_use]
    pub fn published_total(&self) -> u64 {
        self.senders.values().map(|l| l.topics.len() as u64).sum()
    }

    /// Messages reported stable in all.
    #[must_use]
    pub fn stable_total(&self) -> u64 {
        self.senders.values().map(|l| l.stable_count).sum()
    }

    /// Deliveries seen.
    #[must_use]
    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }

    /// Whether every published message is stable.
    #[must_use]
    pub fn all_stable(&self) -> bool {
        self.senders
            .values()
            .all(|l| l.stable_count == l.topics.len() as u64)
    }

    /// The end-of-run check: every subscriber delivered every message of its topics, and every
    /// message became stable. Adds violations for what is missing.
    pub fn finish(&mut self) {
        let mut found = Vec::new();
        for (r, subs) in self.subscriptions.iter().enumerate() {
            for (&s, log) in &self.senders {
                let mut idx = self.cursors[r].get(&s).copied().unwrap_or(0);
                let mut undelivered = 0u64;
                let mut first = None;
                while idx < log.topics.len() {
                    if subs.binary_search(&log.topics[idx]).is_ok() {
                        undelivered += 1;
                        first.get_or_insert(idx + 1);
                    }
                    idx += 1;
                }
                if let Some(first) = first {
                    found.push(format!(
                        "node {r} never delivered {undelivered} message(s) of {s} (first #{first})"
                    ));
                }
            }
        }
        for (&s, log) in &self.senders {
            let unstable = log.topics.len() as u64 - log.stable_count;
            if unstable > 0 {
                found.push(format!("{unstable} message(s) of {s} never became stable"));
            }
        }
        for f in found {
            self.violation(f);
        }
    }

    /// The violations kept (the first ones) and how many there were in all.
    #[must_use]
    pub fn violations(&self) -> (&[String], u64) {
        (&self.violations, self.violation_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn delivery(origin: u32, id: u64, topic: u32) -> Delivery {
        Delivery {
            origin: NodeId(origin),
            topic: TopicId(topic),
            msg_id: MsgId(id),
            timestamp_us: 0,
            payload: Bytes::from(payload_for(NodeId(origin), id, 40)),
        }
    }

    #[test]
    fn accepts_a_correct_history() {
        let mut l = Ledger::new(&[vec![], vec![TopicId(1)], vec![TopicId(1), TopicId(2)]]);
        let t = Time::ZERO;
        l.published(NodeId(0), MsgId(1), TopicId(2), 40, t);
        l.published(NodeId(0), MsgId(2), TopicId(1), 40, t);
        l.delivered(NodeId(2), &delivery(0, 1, 2), t);
        l.delivered(NodeId(1), &delivery(0, 2, 1), t);
        l.stable(NodeId(0), MsgId(1), t);
        l.delivered(NodeId(2), &delivery(0, 2, 1), t);
        l.stable(NodeId(0), MsgId(2), t);
        l.finish();
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
    }

    #[test]
    fn catches_gaps_duplicates_early_stability_and_loss() {
        let mut l = Ledger::new(&[vec![], vec![TopicId(1)]]);
        let t = Time::ZERO;
        for id in 1..=3 {
            l.published(NodeId(0), MsgId(id), TopicId(1), 40, t);
        }
        l.delivered(NodeId(1), &delivery(0, 2, 1), t); // gap
        assert_eq!(l.violations().1, 1);
        l.delivered(NodeId(1), &delivery(0, 2, 1), t); // duplicate
        assert_eq!(l.violations().1, 2);
        l.stable(NodeId(0), MsgId(3), t); // not delivered yet
        assert_eq!(l.violations().1, 3);
        let mut bad = delivery(0, 3, 1);
        bad.payload = Bytes::from(payload_for(NodeId(0), 3, 39));
        l.delivered(NodeId(1), &bad, t); // corrupt
        assert_eq!(l.violations().1, 4);
        l.finish(); // messages 1 and 2 never stable
        assert!(l.violations().1 >= 5);
    }
}
