//! The oracle: checks the delivery promise of docs/design.md section 1 on every event of a run.
//!
//! - every message a sender publishes on topic T is delivered to every node subscribed to T at
//!   that moment that stays alive and subscribed (membership may change during a run),
//! - exactly once and in sender order (message ids from one sender only increase at a receiver),
//! - with the payload that was published,
//! - and a message is reported stable only when every subscriber has delivered it.
//!
//! It works incrementally (O(1) per delivery, O(subscribers) per stability report, one bit per
//! delivered message) so it can watch tens of millions of deliveries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hdrhistogram::Histogram;
use tidings_proto::{Delivery, MsgId, NodeId, RegionId, RegionView, Time, TopicId, ViewId};

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

/// A sender's membership as the checker keeps it: per topic, the members of the regions it maps
/// the topic to, sorted by node, each with the time the GMS issued its region's view.
type SenderSnapshot = BTreeMap<TopicId, Vec<(NodeId, Time)>>;

#[derive(Debug, Default)]
struct SenderLog {
    /// Per message, the index of the sender's view snapshot in force when it was published
    /// (asynchronous membership only; empty otherwise).
    epochs: Vec<u32>,
    topics: Vec<TopicId>,
    lens: Vec<u32>,
    published_at: Vec<Time>,
    stable: Vec<bool>,
    stable_count: u64,
}

/// Which message ids of one sender a receiver delivered (bit `msg_id - 1`).
#[derive(Clone, Debug, Default)]
struct Delivered {
    bits: Vec<u64>,
    last: u64,
}

impl Delivered {
    fn set(&mut self, msg_id: u64) {
        let i = (msg_id - 1) as usize;
        if self.bits.len() <= i / 64 {
            self.bits.resize(i / 64 + 1, 0);
        }
        self.bits[i / 64] |= 1 << (i % 64);
    }

    fn get(&self, msg_id: u64) -> bool {
        let i = (msg_id - 1) as usize;
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
}

/// A view change whose pause is being measured: the live subscribers that have not delivered
/// anything since it happened.
#[derive(Debug)]
struct PendingPause {
    at: Time,
    awaiting: BTreeSet<NodeId>,
    longest: Duration,
}

/// What the checker saw.
///
/// Membership may change during a run (churn): a receiver must deliver a message if it was
/// subscribed to the message's topic when it was published and stays alive and subscribed to the
/// end (or, for the stability check, until the message became stable); it may deliver a message
/// of any topic it subscribes to at the time of delivery; from each sender it delivers in
/// increasing message id order, each at most once.
///
/// With asynchronous views ([`asynchronous`](Ledger::asynchronous), the GMS), "subscribed" has
/// three clocks: the GMS's (when it applied the change: [`set_subscriptions`](Ledger::set_subscriptions)),
/// the receiver's (when its own membership put it in a region of the topic:
/// [`local_topics`](Ledger::local_topics)) and the sender's (its membership at publish time:
/// [`sender_view`](Ledger::sender_view), kept as one snapshot per change of the sender's
/// membership and an index per message). A receiver must deliver a message if it was a member of a
/// region the sender's membership mapped the topic to when it published, and the GMS kept it
/// subscribed to the topic without a break from before the publish, and from before that region
/// view was issued ([`view_issued`](Ledger::view_issued)), to the end (or to the stability
/// report); it may deliver a topic only while its own membership says it subscribes. A sender
/// whose membership is behind the GMS's publishes by a view older than the receiver's latest
/// subscription: if the receiver dropped the topic and took it again since that view, the
/// message belongs to the subscription that ended, in the order of views.
#[derive(Debug)]
pub struct Ledger {
    /// Per node, its topics and since when it subscribes to each (`None`: from the start).
    since: Vec<BTreeMap<TopicId, Option<Time>>>,
    alive: Vec<bool>,
    subscribers: BTreeMap<TopicId, BTreeSet<NodeId>>,
    senders: BTreeMap<NodeId, SenderLog>,
    /// `delivered[r][s]`: what receiver `r` delivered of sender `s`.
    delivered: Vec<BTreeMap<NodeId, Delivered>>,
    /// `last_by_topic[r][(s, t)]`: the last message of sender `s` on topic `t` receiver `r`
    /// delivered. Order is promised per sender within a topic (docs/design.md section 1): a node in
    /// several regions gets a sender's topics through parallel streams.
    last_by_topic: Vec<BTreeMap<(NodeId, TopicId), u64>>,
    violations: Vec<String>,
    violation_count: u64,
    /// Deliveries of payloads the attacker forged ([`crate::attack::is_forged`]).
    forged_delivered: u64,
    deliveries: u64,
    pause: Option<PendingPause>,
    /// Asynchronous membership (the GMS): per node, the topics of the regions it is a member of in
    /// the membership it holds now (what it may deliver). `None`: memberships are installed
    /// everywhere at once and `since` says what a node may deliver.
    local: Option<Vec<BTreeSet<TopicId>>>,
    /// Asynchronous membership: per sender, its view snapshots (per topic, the members of the
    /// regions its membership mapped the topic to, sorted, each with the time the GMS issued the
    /// region view that put it there); the last is in force.
    sender_views: BTreeMap<NodeId, Vec<SenderSnapshot>>,
    /// Asynchronous membership: when the GMS issued each region view.
    views_issued: BTreeMap<(RegionId, ViewId), Time>,
    /// The first installed copy of each region view (asynchronous membership).
    views_installed: BTreeMap<(RegionId, ViewId), RegionView>,
    /// Publish to stable, microseconds.
    pub time_to_stable_us: Histogram<u64>,
    /// Publish to delivery at each receiver, microseconds.
    pub latency_us: Histogram<u64>,
    /// Round trips of top-level (region) rings, microseconds.
    pub token_rtt_us: Histogram<u64>,
    /// Round trips of lower rings (partitions and intermediate levels), microseconds.
    pub partition_token_rtt_us: Histogram<u64>,
    /// Per view change: from the change until every live subscriber delivered again, microseconds.
    pub view_change_pause_us: Histogram<u64>,
    /// A subscription that stops reading, while it does ([`hold_started`](Ledger::hold_started)).
    hold: Option<HoldCheck>,
    /// Messages of streams without the held topic that the held node delivered during holds.
    pub delivered_beside_holds: u64,
}

/// The check of a subscription that stops reading: its node holds one topic back, and must go
/// on delivering the streams that do not carry it.
#[derive(Debug)]
struct HoldCheck {
    node: NodeId,
    topic: TopicId,
    /// Messages published from here until `lag` before the hold ends must be delivered
    /// before it ends.
    from: Time,
    lag: Duration,
    /// Senders that published the held topic: their streams may wait with it.
    carriers: BTreeSet<NodeId>,
    /// Messages of other senders the node must deliver and has not yet, with their publish
    /// times.
    owed: BTreeMap<(NodeId, u64), Time>,
}

fn histogram() -> Histogram<u64> {
    // Three significant digits from 1 us to an hour.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record((d.as_micros() as u64).max(1));
}

impl Ledger {
    /// A ledger for nodes with the given subscriptions (`subscriptions[i]` for `NodeId(i)`), held
    /// from the start of the run.
    #[must_use]
    pub fn new(subscriptions: &[Vec<TopicId>]) -> Self {
        let mut l = Ledger {
            since: vec![BTreeMap::new(); subscriptions.len()],
            alive: vec![true; subscriptions.len()],
            subscribers: BTreeMap::new(),
            senders: BTreeMap::new(),
            delivered: vec![BTreeMap::new(); subscriptions.len()],
            last_by_topic: vec![BTreeMap::new(); subscriptions.len()],
            violations: Vec::new(),
            violation_count: 0,
            forged_delivered: 0,
            deliveries: 0,
            pause: None,
            local: None,
            sender_views: BTreeMap::new(),
            views_issued: BTreeMap::new(),
            views_installed: BTreeMap::new(),
            time_to_stable_us: histogram(),
            latency_us: histogram(),
            token_rtt_us: histogram(),
            partition_token_rtt_us: histogram(),
            view_change_pause_us: histogram(),
            hold: None,
            delivered_beside_holds: 0,
        };
        for (i, topics) in subscriptions.iter().enumerate() {
            for &t in topics {
                l.since[i].insert(t, None);
                l.subscribers.entry(t).or_default().insert(NodeId(i as u32));
            }
        }
        l
    }

    fn violation(&mut self, text: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(text);
        }
    }

    /// Whether `node` must deliver message `idx` (0-based) of `origin`, on `topic` published at
    /// `at`.
    ///
    /// Synchronous membership (the oracle): `node` subscribed to `topic` before `at` and still
    /// does. Asynchronous membership (the GMS): `node` was a member of a region that the
    /// sender's own membership mapped `topic` to when it published, and the GMS has kept `node`
    /// subscribed to `topic` without a break from before `at` until now.
    fn required(&self, node: NodeId, origin: NodeId, idx: usize, topic: TopicId, at: Time) -> bool {
        if !self.alive[node.0 as usize] {
            return false;
        }
        let since = self.since[node.0 as usize].get(&topic);
        if self.local.is_none() {
            return since.is_some_and(|s| s.is_none_or(|s| s < at));
        }
        let issued = self
            .senders
            .get(&origin)
            .and_then(|log| log.epochs.get(idx))
            .and_then(|&e| self.sender_views.get(&origin)?.get(e as usize))
            .and_then(|v| v.get(&topic))
            .and_then(|members| {
                let at = members.binary_search_by_key(&node, |&(n, _)| n).ok()?;
                Some(members[at].1)
            });
        issued.is_some_and(|issued| since.is_some_and(|s| s.is_none_or(|s| s <= at && s <= issued)))
    }

    /// Switches to asynchronous membership (the GMS): each node may deliver what its own
    /// membership says ([`local_topics`](Self::local_topics)), and what a receiver must deliver
    /// depends on the sender's membership at publish time ([`sender_view`](Self::sender_view)).
    /// [`set_subscriptions`](Self::set_subscriptions) then follows the GMS's own state, as it
    /// applies each change.
    pub fn asynchronous(&mut self) {
        let n = self.since.len();
        self.local.get_or_insert_with(|| vec![BTreeSet::new(); n]);
    }

    /// Asynchronous membership: `node` now holds a membership in which it is a member of regions
    /// carrying exactly `topics`.
    pub fn local_topics(&mut self, node: NodeId, topics: BTreeSet<TopicId>) {
        if let Some(slot) = self.local.as_mut().and_then(|l| l.get_mut(node.0 as usize)) {
            *slot = topics;
        }
    }

    /// `node` installed `view` (simulator ids): every member must install the same view of a
    /// region under one number, whichever replica of the service issued it. A second, different
    /// view of the same region and number is a violation.
    pub fn installed_view(&mut self, node: NodeId, view: &RegionView) {
        let key = (view.region, view.view);
        match self.views_installed.get(&key) {
            None => {
                self.views_installed.insert(key, view.clone());
            }
            Some(first) if first == view => {}
            Some(first) => {
                let what = format!(
                    "{node} installed view {} of region {} as {:?}, another member as {:?}",
                    view.view.0, view.region.0, view, first
                );
                self.violation(what);
            }
        }
    }

    /// Asynchronous membership: the GMS issued view `view` of `region` at `now` (the first report
    /// of a view counts).
    pub fn view_issued(&mut self, region: RegionId, view: ViewId, now: Time) {
        self.views_issued.entry((region, view)).or_insert(now);
    }

    /// Asynchronous membership: from now on, `sender` publishes with this membership: per topic,
    /// the members of the regions it maps the topic to, each with the region view. A view the
    /// GMS was not seen to issue counts as issued at the end of time (only the publish time then
    /// bounds the subscription).
    pub fn sender_view(
        &mut self,
        sender: NodeId,
        view: BTreeMap<TopicId, Vec<(NodeId, RegionId, ViewId)>>,
    ) {
        let issued =
            |r: RegionId, v: ViewId| self.views_issued.get(&(r, v)).copied().unwrap_or(Time::MAX);
        let view: SenderSnapshot = view
            .into_iter()
            .map(|(t, members)| {
                let mut members: Vec<(NodeId, Time)> = members
                    .into_iter()
                    .map(|(n, r, v)| (n, issued(r, v)))
                    .collect();
                // A node is in one region per subset, so once per topic; the latest view if not.
                members.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
                members.dedup_by_key(|&mut (n, _)| n);
                (t, members)
            })
            .collect();
        let views = self.sender_views.entry(sender).or_default();
        if views.last() != Some(&view) {
            views.push(view);
        }
    }

    /// Records a violation found outside the ledger (by the simulation's membership glue).
    pub fn external_violation(&mut self, text: String) {
        self.violation(text);
    }

    /// From `now` on, `node` subscribes to exactly `topics`: the membership that says so was just
    /// installed everywhere (oracle), or the GMS just applied the change (asynchronous).
    pub fn set_subscriptions(&mut self, node: NodeId, topics: &[TopicId], now: Time) {
        let i = node.0 as usize;
        let old: Vec<TopicId> = self.since[i].keys().copied().collect();
        for t in old {
            if !topics.contains(&t) {
                self.since[i].remove(&t);
                if let Some(s) = self.subscribers.get_mut(&t) {
                    s.remove(&node);
                }
            }
        }
        for &t in topics {
            if let std::collections::btree_map::Entry::Vacant(e) = self.since[i].entry(t) {
                e.insert(Some(now));
                self.subscribers.entry(t).or_default().insert(node);
            }
        }
    }

    /// `node` crashed: nothing is required of it any more.
    pub fn crashed(&mut self, node: NodeId) {
        self.alive[node.0 as usize] = false;
        if let Some(p) = self.pause.as_mut() {
            p.awaiting.remove(&node);
        }
    }

    /// A membership change took effect at `now`: starts measuring how long until every live
    /// subscriber delivers again (closing the previous measurement if still open).
    pub fn view_change(&mut self, now: Time) {
        self.close_pause(now);
        // The live nodes subscribed to anything, marked by index and then listed in order: each
        // node appears under every topic it subscribes to, and inserting every appearance into a
        // set took a third of a million instructions per view change.
        let mut subscribed = vec![false; self.alive.len()];
        for n in self.subscribers.values().flatten() {
            if let Some(slot) = subscribed.get_mut(n.0 as usize) {
                *slot = true;
            }
        }
        let awaiting: BTreeSet<NodeId> = (0..subscribed.len())
            .filter(|&i| subscribed[i] && self.alive[i])
            .map(|i| NodeId(i as u32))
            .collect();
        self.pause = Some(PendingPause {
            at: now,
            awaiting,
            longest: Duration::ZERO,
        });
    }

    fn close_pause(&mut self, now: Time) {
        if let Some(p) = self.pause.take() {
            let longest = if p.awaiting.is_empty() {
                p.longest
            } else {
                now - p.at
            };
            record(&mut self.view_change_pause_us, longest);
        }
    }

    /// `node` holds `topic` back from `now` (its subscription stops reading): until
    /// [`hold_ended`](Self::hold_ended) it may deliver nothing of `topic`, and must deliver
    /// every message it is owed from senders that do not publish `topic` within `lag` of its
    /// publication.
    pub fn hold_started(&mut self, node: NodeId, topic: TopicId, now: Time, lag: Duration) {
        let carriers = self
            .senders
            .iter()
            .filter(|(_, log)| log.topics.contains(&topic))
            .map(|(&s, _)| s)
            .collect();
        self.hold = Some(HoldCheck {
            node,
            topic,
            from: now,
            lag,
            carriers,
            owed: BTreeMap::new(),
        });
    }

    /// The hold ends at `now`: what the node was owed of the other streams, published `lag`
    /// before now or earlier and not delivered, is a violation.
    pub fn hold_ended(&mut self, now: Time) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let late: Vec<(NodeId, u64)> = hold
            .owed
            .iter()
            .filter(|(key, &at)| at + hold.lag <= now && !hold.carriers.contains(&key.0))
            .map(|(&key, _)| key)
            .collect();
        if let Some(&(origin, id)) = late.first() {
            self.violation(format!(
                "{} held topic {} from {:?} to {now:?} and did not deliver {} message(s) of \
                 streams without it within {:?} (first {origin}#{id})",
                hold.node,
                hold.topic,
                hold.from,
                late.len(),
                hold.lag
            ));
        }
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
        let epoch = self
            .sender_views
            .get(&origin)
            .map(|v| u32::try_from(v.len().saturating_sub(1)).unwrap_or(u32::MAX));
        let asynchronous = self.local.is_some();
        let log = self.senders.entry(origin).or_default();
        let expected = log.topics.len() as u64 + 1;
        if asynchronous {
            // No snapshot yet: nothing can be required of anyone.
            log.epochs.push(epoch.unwrap_or(u32::MAX));
        }
        let idx = log.topics.len();
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
        if let Some(node) = self.hold.as_ref().map(|h| h.node) {
            let owed = self.required(node, origin, idx, topic, now);
            if let Some(hold) = self.hold.as_mut() {
                if topic == hold.topic {
                    hold.carriers.insert(origin);
                } else if owed {
                    hold.owed.insert((origin, msg_id.0), now);
                }
            }
        }
    }

    /// `receiver` delivered `d`.
    pub fn delivered(&mut self, receiver: NodeId, d: &Delivery, now: Time) {
        self.deliveries += 1;
        if crate::attack::is_forged(&d.payload) {
            self.forged_delivered += 1;
            self.violation(format!(
                "{receiver} delivered a message the attacker forged (as {}#{} on topic {})",
                d.origin, d.msg_id.0, d.topic
            ));
            return;
        }
        let Some(log) = self.senders.get(&d.origin) else {
            self.violation(format!(
                "{receiver} got {}#{} that was never published",
                d.origin, d.msg_id.0
            ));
            return;
        };
        let idx = d.msg_id.0.saturating_sub(1) as usize;
        let (Some(&topic), Some(&len), Some(&at)) = (
            log.topics.get(idx),
            log.lens.get(idx),
            log.published_at.get(idx),
        ) else {
            self.violation(format!(
                "{receiver} got {}#{} that was never published",
                d.origin, d.msg_id.0
            ));
            return;
        };
        if !payload_ok(d, len as usize) || d.topic != topic {
            self.violation(format!(
                "{receiver} got a corrupt payload for {}#{}",
                d.origin, d.msg_id.0
            ));
        }
        let may = match &self.local {
            Some(local) => local[receiver.0 as usize].contains(&d.topic),
            None => self.since[receiver.0 as usize].contains_key(&d.topic),
        };
        if !may {
            self.violation(format!(
                "{receiver} got {}#{} on topic {} it does not subscribe to",
                d.origin, d.msg_id.0, d.topic
            ));
        }
        record(&mut self.latency_us, now - at);
        if let Some(hold) = self.hold.as_mut().filter(|h| h.node == receiver) {
            if d.topic == hold.topic {
                let topic = hold.topic;
                self.violation(format!(
                    "{receiver} delivered {}#{} on topic {topic} while it held the topic",
                    d.origin, d.msg_id.0
                ));
            } else if hold.owed.remove(&(d.origin, d.msg_id.0)).is_some() {
                self.delivered_beside_holds += 1;
            }
        }
        // Each map looked up once per delivery (this runs for every delivery of a run); the
        // violation, if any, is recorded after the bookkeeping it was found in.
        let seen = self.delivered[receiver.0 as usize]
            .entry(d.origin)
            .or_default();
        let twice = seen.get(d.msg_id.0);
        seen.last = seen.last.max(d.msg_id.0);
        seen.set(d.msg_id.0);
        let last = self.last_by_topic[receiver.0 as usize]
            .entry((d.origin, d.topic))
            .or_default();
        let before = *last;
        *last = before.max(d.msg_id.0);
        if twice || d.msg_id.0 <= before {
            let what = if twice { "twice" } else { "out of order" };
            self.violation(format!(
                "{receiver} delivered {}#{} {what} (after #{before} on topic {})",
                d.origin, d.msg_id.0, d.topic
            ));
        }
        if let Some(p) = self.pause.as_mut() {
            if p.awaiting.remove(&receiver) {
                p.longest = p.longest.max(now - p.at);
                if p.awaiting.is_empty() {
                    self.close_pause(now);
                }
            }
        }
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
            let ms = |t: Time| t.as_nanos() as f64 / 1e6;
            self.violation(format!(
                "{origin} reported #{} ({topic}, published at {:.1} ms) stable twice, again at {:.1} ms",
                msg_id.0,
                ms(at),
                ms(now)
            ));
            return;
        }
        log.stable[idx] = true;
        log.stable_count += 1;
        record(&mut self.time_to_stable_us, now - at);
        let mut missing = Vec::new();
        for &r in self.subscribers.get(&topic).into_iter().flatten() {
            let done = self.delivered[r.0 as usize]
                .get(&origin)
                .is_some_and(|d| d.get(msg_id.0));
            if !done && self.required(r, origin, idx, topic, at) {
                missing.push(r);
            }
        }
        if let Some(&r) = missing.first() {
            let ms = |t: Time| t.as_nanos() as f64 / 1e6;
            let since = match self.since[r.0 as usize].get(&topic) {
                Some(Some(s)) => format!("{:.1} ms", ms(*s)),
                _ => "the start".into(),
            };
            self.violation(format!(
                "{origin}#{} ({topic}, published at {:.1} ms) reported stable at {:.1} ms but {} subscriber(s) had not delivered it (first: {r}, subscribed since {since})",
                msg_id.0,
                ms(at),
                ms(now),
                missing.len()
            ));
        }
    }

    /// Records a token round trip.
    pub fn token_round(&mut self, top: bool, rtt: Duration) {
        let h = if top {
            &mut self.token_rtt_us
        } else {
            &mut self.partition_token_rtt_us
        };
        record(h, rtt);
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

    /// The end-of-run check: every receiver delivered every message it had to, and every message
    /// became stable. Adds violations for what is missing.
    pub fn finish(&mut self, now: Time) {
        self.close_pause(now);
        let mut found = Vec::new();
        for (&s, log) in &self.senders {
            if !self.alive[s.0 as usize] {
                // The promise is for live senders.
                continue;
            }
            let mut undelivered: BTreeMap<NodeId, (u64, usize)> = BTreeMap::new();
            for (idx, (&topic, &at)) in log.topics.iter().zip(&log.published_at).enumerate() {
                for &r in self.subscribers.get(&topic).into_iter().flatten() {
                    let done = self.delivered[r.0 as usize]
                        .get(&s)
                        .is_some_and(|d| d.get(idx as u64 + 1));
                    if !done && self.required(r, s, idx, topic, at) {
                        let e = undelivered.entry(r).or_insert((0, idx + 1));
                        e.0 += 1;
                    }
                }
            }
            for (r, (count, first)) in undelivered {
                found.push(format!(
                    "{r} never delivered {count} message(s) of {s} (first #{first})"
                ));
            }
            let unstable = log.topics.len() as u64 - log.stable_count;
            if unstable > 0 {
                found.push(format!("{unstable} message(s) of {s} never became stable"));
            }
        }
        for f in found {
            self.violation(f);
        }
    }

    /// Deliveries of payloads the attacker forged (each one a violation).
    #[must_use]
    pub fn forged_delivered(&self) -> u64 {
        self.forged_delivered
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
        l.finish(t);
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
    }

    #[test]
    fn a_delivered_forgery_is_a_violation_even_in_a_published_slot() {
        let mut l = Ledger::new(&[vec![], vec![TopicId(1)]]);
        let t = Time::ZERO;
        l.published(NodeId(0), MsgId(1), TopicId(1), 40, t);
        // The attacker's payload claims the identity of a published message.
        let mut forged = delivery(0, 1, 1);
        let mut p = forged.payload.to_vec();
        p[PAYLOAD_ID_LEN..PAYLOAD_ID_LEN + 8].copy_from_slice(&crate::attack::ATTACK_MARKER);
        forged.payload = Bytes::from(p);
        l.delivered(NodeId(1), &forged, t);
        assert_eq!(l.forged_delivered(), 1);
        assert!(l.violations().0[0].contains("the attacker forged"));
        // The genuine message is still owed, and accepted.
        l.delivered(NodeId(1), &delivery(0, 1, 1), t);
        assert_eq!(l.violations().1, 1);
    }

    #[test]
    fn order_is_per_sender_within_a_topic() {
        // A node in two regions gets one sender's topics through parallel streams.
        let mut l = Ledger::new(&[vec![], vec![TopicId(1), TopicId(2)]]);
        let t = Time::ZERO;
        l.published(NodeId(0), MsgId(1), TopicId(1), 40, t);
        l.published(NodeId(0), MsgId(2), TopicId(2), 40, t);
        l.published(NodeId(0), MsgId(3), TopicId(1), 40, t);
        l.delivered(NodeId(1), &delivery(0, 2, 2), t);
        l.delivered(NodeId(1), &delivery(0, 1, 1), t);
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
        l.delivered(NodeId(1), &delivery(0, 3, 1), t);
        l.delivered(NodeId(1), &delivery(0, 1, 1), t); // twice, and out of order in topic 1
        assert_eq!(l.violations().1, 1);
    }

    #[test]
    fn catches_duplicates_reordering_early_stability_corruption_and_loss() {
        let mut l = Ledger::new(&[vec![], vec![TopicId(1)]]);
        let t = Time::ZERO;
        for id in 1..=3 {
            l.published(NodeId(0), MsgId(id), TopicId(1), 40, t);
        }
        l.delivered(NodeId(1), &delivery(0, 2, 1), t);
        assert_eq!(l.violations().1, 0);
        l.delivered(NodeId(1), &delivery(0, 2, 1), t); // twice
        assert_eq!(l.violations().1, 1);
        l.delivered(NodeId(1), &delivery(0, 1, 1), t); // out of order
        assert_eq!(l.violations().1, 2);
        l.stable(NodeId(0), MsgId(3), t); // not delivered yet
        assert_eq!(l.violations().1, 3);
        let mut bad = delivery(0, 3, 1);
        bad.payload = Bytes::from(payload_for(NodeId(0), 3, 39));
        l.delivered(NodeId(1), &bad, t); // corrupt
        assert_eq!(l.violations().1, 4);
        l.finish(t); // messages 1 and 2 never stable
        assert_eq!(l.violations().1, 5);
    }

    #[test]
    fn churn_changes_what_is_required() {
        let ms = |m| Time::ZERO + Duration::from_millis(m);
        let mut l = Ledger::new(&[vec![], vec![TopicId(1)], vec![TopicId(1)], vec![]]);
        l.published(NodeId(0), MsgId(1), TopicId(1), 40, ms(1));
        // Node 3 joins after message 1 and may, but need not, get it; node 2 crashes.
        l.set_subscriptions(NodeId(3), &[TopicId(1)], ms(2));
        l.crashed(NodeId(2));
        l.published(NodeId(0), MsgId(2), TopicId(1), 40, ms(3));
        for id in 1..=2 {
            l.delivered(NodeId(1), &delivery(0, id, 1), ms(4));
        }
        l.delivered(NodeId(3), &delivery(0, 2, 1), ms(4));
        l.stable(NodeId(0), MsgId(1), ms(5));
        l.stable(NodeId(0), MsgId(2), ms(5));
        l.finish(ms(6));
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
        // Node 1 leaves; a delivery after that is on a topic it does not subscribe to.
        l.set_subscriptions(NodeId(1), &[], ms(7));
        l.published(NodeId(0), MsgId(3), TopicId(1), 40, ms(8));
        l.delivered(NodeId(1), &delivery(0, 3, 1), ms(9));
        assert_eq!(l.violations().1, 1);
    }

    #[test]
    fn asynchronous_membership_requires_what_the_sender_saw() {
        let ms = |m| Time::ZERO + Duration::from_millis(m);
        let t1 = TopicId(1);
        let mut l = Ledger::new(&[vec![], vec![t1], vec![t1], vec![]]);
        l.asynchronous();
        for n in 1..=2 {
            l.local_topics(NodeId(n), [t1].into());
        }
        // The sender's view: only nodes 1 and 2 on topic 1.
        l.sender_view(NodeId(0), [(t1, members(&[2, 1]))].into());
        // Node 3 subscribes (the GMS applied it) but the sender does not know yet.
        l.set_subscriptions(NodeId(3), &[t1], ms(1));
        l.published(NodeId(0), MsgId(1), t1, 40, ms(2));
        // Node 3 may not deliver before its own membership says so.
        l.delivered(NodeId(3), &delivery(0, 1, 1), ms(3));
        assert_eq!(l.violations().1, 1);
        l.local_topics(NodeId(3), [t1].into());
        l.sender_view(NodeId(0), [(t1, members(&[1, 2, 3]))].into());
        l.published(NodeId(0), MsgId(2), t1, 40, ms(4));
        for n in 1..=2 {
            l.delivered(NodeId(n), &delivery(0, 1, 1), ms(5));
        }
        l.stable(NodeId(0), MsgId(1), ms(5));
        assert_eq!(l.violations().1, 1, "{:?}", l.violations().0);
        // Message 2 is required at node 3 (in the sender's view, subscribed since before).
        l.delivered(NodeId(1), &delivery(0, 2, 1), ms(6));
        l.delivered(NodeId(2), &delivery(0, 2, 1), ms(6));
        l.stable(NodeId(0), MsgId(2), ms(6));
        assert_eq!(l.violations().1, 2, "{:?}", l.violations().0);
        l.finish(ms(7));
        assert_eq!(l.violations().1, 3, "{:?}", l.violations().0);
    }

    #[test]
    fn asynchronous_membership_forgives_a_broken_subscription() {
        let ms = |m| Time::ZERO + Duration::from_millis(m);
        let t1 = TopicId(1);
        let mut l = Ledger::new(&[vec![], vec![t1]]);
        l.asynchronous();
        l.local_topics(NodeId(1), [t1].into());
        l.sender_view(NodeId(0), [(t1, members(&[1]))].into());
        l.published(NodeId(0), MsgId(1), t1, 40, ms(1));
        // Node 1 leaves and comes back: message 1 is no longer owed to it.
        l.set_subscriptions(NodeId(1), &[], ms(2));
        l.set_subscriptions(NodeId(1), &[t1], ms(3));
        l.stable(NodeId(0), MsgId(1), ms(4));
        l.finish(ms(5));
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
    }

    /// Members of region 1, view 1, for a sender's snapshot.
    fn members(nodes: &[u32]) -> Vec<(NodeId, RegionId, ViewId)> {
        nodes
            .iter()
            .map(|&n| (NodeId(n), RegionId(1), ViewId(1)))
            .collect()
    }

    /// A sender whose membership is behind the GMS's publishes by a view issued before the
    /// receiver dropped the topic and took it again: the message belongs to the subscription
    /// that ended, even though it was published after the new one began. A receiver subscribed
    /// without a break since the view was issued still owes it.
    #[test]
    fn a_stale_senders_view_does_not_require_a_subscription_taken_again_since() {
        let ms = |m| Time::ZERO + Duration::from_millis(m);
        let t1 = TopicId(1);
        let mut l = Ledger::new(&[vec![], vec![t1], vec![t1]]);
        l.asynchronous();
        for n in 1..=2 {
            l.local_topics(NodeId(n), [t1].into());
        }
        l.view_issued(RegionId(1), ViewId(1), ms(1));
        // Node 2 drops topic 1 at 2 ms and takes it again at 3 ms; the sender still holds view
        // 1 and publishes at 4 ms.
        l.set_subscriptions(NodeId(2), &[], ms(2));
        l.set_subscriptions(NodeId(2), &[t1], ms(3));
        l.sender_view(NodeId(0), [(t1, members(&[1, 2]))].into());
        l.published(NodeId(0), MsgId(1), t1, 40, ms(4));
        l.delivered(NodeId(1), &delivery(0, 1, 1), ms(5));
        l.stable(NodeId(0), MsgId(1), ms(5));
        assert_eq!(l.violations().1, 0, "{:?}", l.violations().0);
        // Node 1 kept its subscription since view 1: a message it misses is a violation.
        l.published(NodeId(0), MsgId(2), t1, 40, ms(6));
        l.stable(NodeId(0), MsgId(2), ms(7));
        assert_eq!(l.violations().1, 1, "{:?}", l.violations().0);
    }
}
