//! The state a node keeps for a region it is a member of: inbound streams, and its places in the
//! hierarchy of token rings that recovers, aggregates and cleans up for all senders at once
//! (paper 000 section 2, paper 001 section 3).
//!
//! The hierarchy: level 0 rings are the partitions; a ring at level `l + 1` is made of the leaders
//! of at most `ring_fanout_max` rings of level `l`; the single ring at the top is led by the region
//! leader. Each ring's leader releases a token at most every `token_interval`; rings at different
//! levels do not wait for each other. A token carries one record per active sender; each member
//! folds its state into the records (minimum contiguous prefix, maximum known, what is missing at
//! every member) and compares them with its predecessor's state to push what the predecessor
//! lacks or pull what it has. When a token returns to its leader the aggregate becomes the leader's
//! state in the ring above. At the top, the region leader ACKs each sender with the region's
//! contiguous minimum and NAKs what the caching partition of a message lost entirely.
//!
//! Cooperative caching: the caching partition of `seq` is `((seq - 1) / cache_block_msgs) mod
//! partitions`; only its members keep `seq` after delivery, until the region reports it stable.
//! A receiver missing `seq` asks a random member of that partition (parallel repair).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use tidings_wire::{NodeId, RecordView, RegionId, SeqRange, TopicId, ViewId};

use crate::config::Config;
use crate::membership::RegionView;
use crate::outbox::{Control, Outbox, RepairCause, RepairJob};
use crate::ranges;
use crate::recv::InboundStream;
use crate::send::OutboundStream;
use crate::time::Time;
use crate::{Destination, Event};

/// A token record in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnedRecord {
    pub(crate) origin: NodeId,
    pub(crate) stable_upto: u64,
    pub(crate) agg_contiguous: u64,
    pub(crate) agg_max: u64,
    pub(crate) prev_contiguous: u64,
    pub(crate) prev_max: u64,
    pub(crate) missing_all: Vec<SeqRange>,
    pub(crate) lost: Vec<SeqRange>,
    pub(crate) prev_missing: Vec<SeqRange>,
}

impl OwnedRecord {
    /// A record whose (empty) lists come from `out`'s pool, so filling them reuses storage.
    fn with_pooled_lists(out: &mut Outbox) -> Self {
        OwnedRecord {
            missing_all: out.take_range_list(),
            lost: out.take_range_list(),
            prev_missing: out.take_range_list(),
            ..Default::default()
        }
    }

    /// Overwrites this record with `v`, keeping the lists' storage.
    fn assign_view(&mut self, v: &RecordView<'_>) {
        self.origin = v.origin;
        self.stable_upto = v.stable_upto;
        self.agg_contiguous = v.agg_contiguous;
        self.agg_max = v.agg_max;
        self.prev_contiguous = v.prev_contiguous;
        self.prev_max = v.prev_max;
        self.missing_all.clear();
        self.missing_all.extend(v.missing_all.iter());
        self.lost.clear();
        self.lost.extend(v.lost.iter());
        self.prev_missing.clear();
        self.prev_missing.extend(v.prev_missing.iter());
    }

    pub(crate) fn as_wire(&self) -> tidings_wire::Record<'_> {
        tidings_wire::Record {
            origin: self.origin,
            stable_upto: self.stable_upto,
            agg_contiguous: self.agg_contiguous,
            agg_max: self.agg_max,
            prev_contiguous: self.prev_contiguous,
            prev_max: self.prev_max,
            missing_all: &self.missing_all,
            lost: &self.lost,
            prev_missing: &self.prev_missing,
        }
    }
}

/// The `n`-th record of `records`, appended if `records` is shorter (every field is to be
/// overwritten: records are reused from token to token, lists and all).
fn record_slot<'a>(
    records: &'a mut Vec<OwnedRecord>,
    n: usize,
    out: &mut Outbox,
) -> &'a mut OwnedRecord {
    while records.len() <= n {
        records.push(OwnedRecord::with_pooled_lists(out));
    }
    &mut records[n]
}

/// Shortens `records` to `len`, handing the lists of the records cut off back to `out`'s pool.
fn truncate_records(records: &mut Vec<OwnedRecord>, len: usize, out: &mut Outbox) {
    while records.len() > len {
        if let Some(r) = records.pop() {
            out.recycle_range_list(r.missing_all);
            out.recycle_range_list(r.lost);
            out.recycle_range_list(r.prev_missing);
        }
    }
}

/// Overwrites `records` with the records of a token that arrived, reusing their storage.
pub(crate) fn assign_records<'v>(
    records: &mut Vec<OwnedRecord>,
    views: impl Iterator<Item = RecordView<'v>>,
    out: &mut Outbox,
) {
    let mut n = 0;
    for v in views {
        record_slot(records, n, out).assign_view(&v);
        n += 1;
    }
    truncate_records(records, n, out);
}

/// A token in memory: which ring, which round, the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedToken {
    pub(crate) level: u8,
    pub(crate) ring: u16,
    pub(crate) round: u64,
    pub(crate) records: Vec<OwnedRecord>,
}

/// A member's own state for one sender at one level of the hierarchy. One is kept as scratch and
/// overwritten for every record, so its lists keep their storage.
#[derive(Clone, Debug, Default)]
struct MemberState {
    contiguous: u64,
    max: u64,
    /// Level 0: what this node lacks in `(contiguous, exact_upto]`.
    missing: Vec<SeqRange>,
    /// The highest sequence number `missing` describes exactly.
    exact_upto: u64,
    /// Level 0: the gaps this node asks its successor to push (ADR 13), set by
    /// [`RegionState::offer_pushes`] when it passes the token on. Level 1 and up: what caching
    /// partitions below lost entirely.
    lost: Vec<SeqRange>,
}

impl MemberState {
    /// Sets the figures and empties the lists (keeping their storage).
    fn reset(&mut self, contiguous: u64, max: u64, exact_upto: u64) {
        self.contiguous = contiguous;
        self.max = max;
        self.exact_upto = exact_upto;
        self.missing.clear();
        self.lost.clear();
    }
}

/// What a ring leader learned from the last completed round, per sender.
#[derive(Clone, Debug, Default)]
pub(crate) struct Report {
    contiguous: u64,
    max: u64,
    /// Level 0: missing at every member of the partition. Higher: lost by caching partitions.
    ranges: Vec<SeqRange>,
}

#[derive(Debug)]
struct Lead {
    /// Smoothed round-trip time of this ring's token (zero until measured).
    rtt_smoothed: std::time::Duration,
    round: u64,
    in_flight: bool,
    released_at: Time,
    next_release: Time,
    /// The last release found nothing to carry: the lead has no deadline until something
    /// touches its region ([`RegionState::wake_leads`]). A release with nothing to carry sends
    /// nothing and changes nothing but `next_release`, so sleeping through those releases and
    /// waking on the ring's grid is the same protocol; a node alone in thousands of quiet
    /// regions no longer fires a timer per region every token interval.
    dormant: bool,
    /// When the previous round came back (token pacing measures its senders' rates from it).
    last_round_at: Option<Time>,
    reports: BTreeMap<NodeId, Report>,
    idle_rounds: BTreeMap<NodeId, u32>,
}

impl Lead {
    /// How long to wait for the token before releasing a new round: the configured minimum, or
    /// four smoothed round trips when the ring is slower (a busy ring is not a lossy one).
    fn timeout(&self, config: &Config) -> std::time::Duration {
        config.token_timeout.max(self.rtt_smoothed * 4)
    }

    /// Token pacing (see [`Config::token_interval_min`]): how long after this round's release
    /// the next one goes out. The round that just came back carries each sender's contiguous
    /// point; against the previous round's report of the same sender that is the messages the
    /// sender got acknowledged-as-received since the previous round came back, a measure of its
    /// rate. The fastest sender sets the pace: the next round comes after the time that rate
    /// takes to fill a quarter of a sender's window, within `token_interval_min ..=
    /// token_interval`. A window thus spans about four rounds of the fastest sender's traffic,
    /// so its ACKs arrive before it fills, whatever the sender's rate; a quiet ring keeps the
    /// configured interval and its token traffic.
    fn paced_interval(&self, now: Time, records: &[OwnedRecord], config: &Config) -> Duration {
        let Some(since) = self.last_round_at.map(|t| now - t).filter(|d| !d.is_zero()) else {
            return config.token_interval;
        };
        let advance = records
            .iter()
            .filter_map(|rec| {
                let before = self.reports.get(&rec.origin)?.contiguous;
                Some(rec.agg_contiguous.saturating_sub(before))
            })
            .max()
            .unwrap_or(0);
        if advance == 0 {
            return config.token_interval;
        }
        let quarter_window = (config.window_msgs_max / 4).max(1) as u128;
        let nanos = quarter_window * since.as_nanos() / u128::from(advance);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            .clamp(config.token_interval_min, config.token_interval)
    }
}

/// A token handed to the next member and not yet confirmed.
#[derive(Debug)]
struct Handoff {
    to: NodeId,
    round: u64,
    sent_at: Time,
    attempts: u32,
}

/// This node's place in one ring.
#[derive(Debug)]
pub(crate) struct Ring {
    level: u8,
    index: u16,
    members: Vec<NodeId>,
    pos: usize,
    top: bool,
    last_round_seen: u64,
    lead: Option<Lead>,
    /// The token this node passed on, until the next member confirms it.
    handoff: Option<Handoff>,
    /// The encoding of the last token this node passed on (resent while `handoff` is unconfirmed);
    /// the buffer is reused every round.
    handoff_bytes: Vec<u8>,
}

impl Ring {
    fn successor(&self) -> NodeId {
        self.members[(self.pos + 1) % self.members.len()]
    }

    fn predecessor(&self) -> NodeId {
        let n = self.members.len();
        self.members[(self.pos + n - 1) % n]
    }
}

/// The rings of a region view, level by level: `levels[l][r]` lists ring `r` of level `l`, leader
/// first.
pub(crate) fn hierarchy(view: &RegionView, fanout: usize) -> Vec<Vec<Vec<NodeId>>> {
    let mut levels = vec![view.partitions.clone()];
    while let Some(last) = levels.last() {
        if last.len() <= 1 {
            break;
        }
        let leaders: Vec<NodeId> = last.iter().map(|r| r[0]).collect();
        levels.push(
            leaders
                .chunks(fanout.max(2))
                .map(<[NodeId]>::to_vec)
                .collect(),
        );
    }
    levels
}

/// Which partition caches which sequence number: blocks of `block` sequence numbers, round-robin
/// over the partitions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CachingRule {
    my_partition: usize,
    partitions: usize,
    block: u64,
}

impl CachingRule {
    /// The partition caching `seq`.
    pub(crate) fn partition_of(&self, seq: u64) -> usize {
        ((seq.saturating_sub(1) / self.block) % self.partitions as u64) as usize
    }

    /// Whether this node's partition caches `seq`.
    pub(crate) fn caches(&self, seq: u64) -> bool {
        self.partition_of(seq) == self.my_partition
    }
}

/// The inbound stream of `origin` (never this node's own), created if fewer than `streams_max`
/// exist, seeded with the message-id floor of earlier views. A free function over the fields it
/// needs, so callers can still lend out other fields of the region.
fn inbound_stream<'a>(
    inbound: &'a mut BTreeMap<NodeId, Box<InboundStream>>,
    floors: &BTreeMap<(NodeId, TopicId), u64>,
    me: NodeId,
    origin: NodeId,
    streams_max: usize,
) -> Option<&'a mut InboundStream> {
    if origin == me || (!inbound.contains_key(&origin) && inbound.len() >= streams_max) {
        return None;
    }
    Some(inbound.entry(origin).or_insert_with(|| {
        let mut s = Box::new(InboundStream::new(origin));
        s.msg_id_floors = floors
            .range((origin, TopicId(0))..=(origin, TopicId(u32::MAX)))
            .map(|(&(_, t), &f)| (t, f))
            .collect();
        s
    }))
}

/// The state of one region this node is a member of.
#[derive(Debug)]
pub(crate) struct RegionState {
    pub(crate) region: RegionId,
    pub(crate) view: ViewId,
    /// The base of the views this state runs in: a view of the same base continues it
    /// (`RegionView::base`, ADR 30).
    pub(crate) base: ViewId,
    me: NodeId,
    /// Sorted topics this node subscribes to (the region's topics).
    topics: Vec<TopicId>,
    partitions: Vec<Vec<NodeId>>,
    my_partition: usize,
    cache_block: u64,
    /// The streams received in this region, boxed: a B-tree leaf holds room for eleven
    /// entries, so unboxed streams (about 450 bytes each) cost 5 KB per region even with one
    /// sender, 50 MB for a node alone in 10,000 regions.
    pub(crate) inbound: BTreeMap<NodeId, Box<InboundStream>>,
    rings: Vec<Ring>,
    /// Per origin, the consolidation of congestion alerts passing through this node (Fig. 5).
    ucas: BTreeMap<NodeId, crate::pdcc::UcaConsolidator>,
    /// The deadline of [`Self::next_deadline`] as last entered in the node's timer queue.
    pub(crate) timer_at: Option<Time>,
    /// Per origin, the highest message id delivered in earlier views (seeds new streams): the
    /// node's own record when the view was installed, shared by the regions installed with it.
    msg_id_floors: Arc<BTreeMap<(NodeId, TopicId), u64>>,
    /// Scratch lists reused across tokens, so a token round allocates nothing in steady state.
    state_scratch: MemberState,
    origins_scratch: Vec<NodeId>,
    records_scratch: Vec<OwnedRecord>,
    /// Gaps due for a repair request (sequence number, attempts so far), and the pull lists by
    /// target, reused every repair interval.
    wanted_scratch: Vec<(u64, u32)>,
    pulls_by_target: Vec<(NodeId, Vec<SeqRange>)>,
    /// What a ring neighbour lacks and this node can push, reused every token.
    push_scratch: Vec<SeqRange>,
}

impl RegionState {
    /// Builds the state for `me`, which must be a member of `view`.
    pub(crate) fn new(view: &RegionView, me: NodeId, config: &Config, now: Time) -> Option<Self> {
        let my_partition = view.partition_of(me)?;
        let levels = hierarchy(view, config.ring_fanout_max);
        let top_level = levels.len() - 1;
        let mut rings = Vec::new();
        for (l, level) in levels.iter().enumerate() {
            let Some((index, members)) = level
                .iter()
                .enumerate()
                .find(|(_, ring)| ring.contains(&me))
            else {
                break;
            };
            let pos = members.iter().position(|&m| m == me)?;
            let lead = (pos == 0).then(|| Lead {
                rtt_smoothed: std::time::Duration::ZERO,
                round: 0,
                in_flight: false,
                released_at: now,
                next_release: now + config.token_interval,
                dormant: false,
                last_round_at: None,
                reports: BTreeMap::new(),
                idle_rounds: BTreeMap::new(),
            });
            rings.push(Ring {
                level: l as u8,
                index: index as u16,
                members: members.clone(),
                pos,
                top: l == top_level,
                last_round_seen: 0,
                lead,
                handoff: None,
                handoff_bytes: Vec::new(),
            });
        }
        let mut topics = view.topics.clone();
        topics.sort_unstable();
        Some(RegionState {
            region: view.region,
            view: view.view,
            base: view.base,
            me,
            topics,
            partitions: view.partitions.clone(),
            my_partition,
            cache_block: config.cache_block_msgs,
            inbound: BTreeMap::new(),
            rings,
            msg_id_floors: Arc::default(),
            ucas: BTreeMap::new(),
            timer_at: None,
            state_scratch: MemberState::default(),
            origins_scratch: Vec::new(),
            records_scratch: Vec::new(),
            wanted_scratch: Vec::new(),
            pulls_by_target: Vec::new(),
            push_scratch: Vec::new(),
        })
    }

    /// Whether `view` continues this state ([`RegionView::continues`]).
    pub(crate) fn continues_into(&self, view: &RegionView) -> bool {
        view.continues(self.view, self.base, &self.partitions)
    }

    /// Moves this state to `view`, which [continues](Self::continues_into) it: its streams,
    /// rings and caches go on, and the topics it delivers are the view's. `floors` is the node's
    /// record of what it delivered anywhere (gathered at this install): a topic the region gains
    /// may come with messages re-homed from the region that carried it, and each stream's
    /// record of that topic starts from the node's, so none is delivered twice.
    pub(crate) fn continue_into(
        &mut self,
        view: &RegionView,
        floors: &Arc<BTreeMap<(NodeId, TopicId), u64>>,
    ) {
        debug_assert!(self.continues_into(view));
        let mut topics = view.topics.clone();
        topics.sort_unstable();
        let gained: Vec<TopicId> = topics
            .iter()
            .copied()
            .filter(|t| self.topics.binary_search(t).is_err())
            .collect();
        for stream in self.inbound.values_mut() {
            for &t in &gained {
                if let Some(&f) = floors.get(&(stream.origin, t)) {
                    let floor = stream.msg_id_floors.entry(t).or_insert(0);
                    *floor = (*floor).max(f);
                }
            }
        }
        self.view = view.view;
        self.topics = topics;
        self.msg_id_floors = Arc::clone(floors);
    }

    /// Whether this node subscribes to `topic`.
    pub(crate) fn subscribes(&self, topic: TopicId) -> bool {
        self.topics.binary_search(&topic).is_ok()
    }

    /// The partition that caches `seq`.
    pub(crate) fn caching_partition(&self, seq: u64) -> usize {
        self.caching_rule().partition_of(seq)
    }

    /// Whether this node caches `seq`.
    #[cfg(test)]
    pub(crate) fn caches(&self, seq: u64) -> bool {
        self.caching_rule().caches(seq)
    }

    /// Whether this node leads the top ring (the region leader).
    pub(crate) fn is_region_leader(&self) -> bool {
        self.rings.last().is_some_and(|r| r.top && r.pos == 0)
    }

    /// Whether `node` is a member of this region view.
    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        self.partitions.iter().any(|p| p.contains(&node))
    }

    /// The caching rule of this node in this region view.
    /// Partitions of this view (at least 1): the caching share is one in this many.
    pub(crate) fn partition_count(&self) -> usize {
        self.partitions.len().max(1)
    }

    pub(crate) fn caching_rule(&self) -> CachingRule {
        CachingRule {
            my_partition: self.my_partition,
            partitions: self.partitions.len().max(1),
            block: self.cache_block,
        }
    }

    /// What receiving needs at once: the stream of `origin` (created if there is room), the
    /// caching rule and the subscribed topics.
    pub(crate) fn receive_parts(
        &mut self,
        origin: NodeId,
        config: &Config,
    ) -> Option<(&mut InboundStream, CachingRule, &[TopicId])> {
        let caching = self.caching_rule();
        let stream = inbound_stream(
            &mut self.inbound,
            &self.msg_id_floors,
            self.me,
            origin,
            config.streams_max,
        )?;
        Some((stream, caching, &self.topics))
    }

    /// What releasing a held topic needs at once: the caching rule, the subscribed topics and
    /// the inbound streams.
    pub(crate) fn held_parts(
        &mut self,
    ) -> (
        CachingRule,
        &[TopicId],
        impl Iterator<Item = &mut InboundStream>,
    ) {
        let caching = self.caching_rule();
        (
            caching,
            &self.topics,
            self.inbound.values_mut().map(|s| &mut **s),
        )
    }

    /// The inbound stream of `origin`, created if there is room.
    pub(crate) fn stream_mut(
        &mut self,
        origin: NodeId,
        config: &Config,
    ) -> Option<&mut InboundStream> {
        inbound_stream(
            &mut self.inbound,
            &self.msg_id_floors,
            self.me,
            origin,
            config.streams_max,
        )
    }

    /// Seeds the per-origin floors of message ids delivered in earlier views.
    pub(crate) fn set_msg_id_floors(&mut self, floors: Arc<BTreeMap<(NodeId, TopicId), u64>>) {
        self.msg_id_floors = floors;
    }

    /// Per origin and topic, the highest message id delivered in this view. The seeds are left
    /// out: they are a copy of the node's record, which only grows, so folding them back into it
    /// changes nothing.
    pub(crate) fn stream_msg_id_floors(
        &self,
    ) -> impl Iterator<Item = ((NodeId, TopicId), u64)> + '_ {
        self.inbound
            .values()
            .flat_map(|s| s.msg_id_floors.iter().map(|(&t, &f)| ((s.origin, t), f)))
    }

    /// A random member of the caching partition of `seq` other than this node.
    pub(crate) fn random_cacher(&self, seq: u64, rng: &mut fastrand::Rng) -> Option<NodeId> {
        let members = &self.partitions[self.caching_partition(seq)];
        let others = members.len() - usize::from(members.contains(&self.me));
        if others == 0 {
            return None;
        }
        let pick = rng.usize(..others);
        members.iter().copied().filter(|&m| m != self.me).nth(pick)
    }

    /// The earliest deadline of this region's rings.
    pub(crate) fn next_deadline(&self, config: &Config) -> Option<Time> {
        self.rings
            .iter()
            .filter_map(|r| r.lead.as_ref())
            .filter(|l| l.in_flight || !l.dormant)
            .map(|l| {
                if l.in_flight {
                    l.released_at + l.timeout(config)
                } else {
                    l.next_release
                }
            })
            .chain(
                self.rings
                    .iter()
                    .filter_map(|r| r.handoff.as_ref())
                    .map(|h| h.sent_at + config.token_handoff_timeout),
            )
            .min()
    }

    /// Releases tokens whose time has come (and gives up on rounds that did not return).
    pub(crate) fn on_timeout(
        &mut self,
        now: Time,
        own: Option<&mut OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let own = own.map(|s| &*s);
        self.check_handoffs(now, config, out);
        for level in 0..self.rings.len() {
            let Some(lead) = self.rings[level].lead.as_mut() else {
                continue;
            };
            if lead.in_flight {
                if now < lead.released_at + lead.timeout(config) {
                    continue;
                }
                lead.in_flight = false;
                out.stats.tokens_lost += 1;
            } else if lead.dormant || now < lead.next_release {
                continue;
            }
            let released = out.stats.tokens_released;
            self.release(now, level, own, config, out);
            if out.stats.tokens_released != released {
                // A round of this level may complete at once (a ring of one) and give the
                // levels above something to carry.
                self.wake_leads(now, config);
            }
        }
    }

    /// Wakes the dormant leads of this region's rings, at the first release time of their
    /// grid (`next_release` plus whole token intervals) at or after `now`: called whenever
    /// something touches the region (a datagram of it, a send from this node's stream into
    /// it, a released token), which is everything that can give a ring something to carry.
    /// True if some lead was asleep (its region's deadline may have moved).
    pub(crate) fn wake_leads(&mut self, now: Time, config: &Config) -> bool {
        let interval = config.token_interval;
        let mut woke = false;
        for lead in self.rings.iter_mut().filter_map(|r| r.lead.as_mut()) {
            if !lead.dormant {
                continue;
            }
            lead.dormant = false;
            woke = true;
            if lead.next_release < now && !interval.is_zero() {
                let behind = (now - lead.next_release).as_nanos();
                let step = interval.as_nanos();
                let steps = behind.div_ceil(step);
                let skip = u32::try_from(steps).unwrap_or(u32::MAX);
                lead.next_release += interval.saturating_mul(skip);
            }
        }
        woke
    }

    /// Horus' global window without its own sender: the sum over the other senders of the region
    /// of their unstable messages, as far as this node knows (the highest sequence number it knows
    /// to exist, from data, silences and token records, minus the stability point the tokens
    /// report). Stale by up to a token round, never invented.
    pub(crate) fn others_unstable_estimate(&self) -> u64 {
        self.inbound
            .values()
            .map(|s| s.known_max().saturating_sub(s.stable_upto))
            .sum()
    }

    fn stable_known(&self, origin: NodeId, own: Option<&OutboundStream>) -> u64 {
        if origin == self.me {
            own.map_or(0, |s| s.stable_upto)
        } else {
            self.inbound.get(&origin).map_or(0, |s| s.stable_upto)
        }
    }

    /// This node's state for `origin` at `level`, into `st` (whose lists keep their storage);
    /// level-0 missing lists extend to `horizon`.
    #[allow(clippy::too_many_arguments)]
    fn member_state(
        &self,
        level: usize,
        origin: NodeId,
        horizon: u64,
        own: Option<&OutboundStream>,
        cap: usize,
        config: &Config,
        st: &mut MemberState,
    ) {
        if level == 0 {
            if origin == self.me {
                let sent = own.map_or(0, |s| s.sent_upto);
                st.reset(sent, sent, sent);
                return;
            }
            let Some(stream) = self.inbound.get(&origin) else {
                st.reset(0, 0, horizon);
                ranges::push_range(&mut st.missing, 1, horizon + 1, cap);
                return;
            };
            let mut horizon = horizon.max(stream.known_max());
            if config.adaptive_nack_window {
                // Ring neighbours push only what lies within this node's NACK window.
                let window = u64::try_from(stream.nack.window(config)).unwrap_or(u64::MAX);
                horizon = horizon.min(stream.delivered_upto.saturating_add(window));
            }
            st.reset(stream.delivered_upto, stream.known_max(), 0);
            st.exact_upto = stream.missing_ranges(horizon, cap, &mut st.missing);
            return;
        }
        let below = &self.rings[level - 1];
        let Some(report) = below.lead.as_ref().and_then(|l| l.reports.get(&origin)) else {
            st.reset(0, 0, 0);
            return;
        };
        st.reset(report.contiguous, report.max, report.max);
        if level == 1 {
            ranges::filter_partition(
                &report.ranges,
                self.my_partition,
                self.partitions.len(),
                config.cache_block_msgs,
                cap,
                &mut st.lost,
            );
        } else {
            st.lost.extend(report.ranges.iter().take(cap).copied());
        }
    }

    /// Origins this node has something to say about at `level`, sorted, into `origins`.
    fn known_origins(&self, level: usize, own: Option<&OutboundStream>, origins: &mut Vec<NodeId>) {
        origins.clear();
        if level == 0 {
            origins.extend(self.inbound.keys().copied());
            if own.is_some_and(|s| s.sent_upto > 0) {
                if let Err(at) = origins.binary_search(&self.me) {
                    origins.insert(at, self.me);
                }
            }
        } else if let Some(lead) = self.rings[level - 1].lead.as_ref() {
            origins.extend(lead.reports.keys().copied());
        }
    }

    fn record_cap(config: &Config, records: usize) -> usize {
        let budget = config.max_datagram_bytes
            - tidings_wire::HEADER_LEN
            - 13
            - records * tidings_wire::RECORD_FIXED_LEN;
        let per_list = budget / records.max(1) / (3 * tidings_wire::RANGE_LEN);
        per_list.min(config.token_ranges_max)
    }

    /// Most records a token carries, so that each still has room for a couple of ranges per list.
    fn records_max(config: &Config) -> usize {
        (config.max_datagram_bytes - tidings_wire::HEADER_LEN - 13)
            / (tidings_wire::RECORD_FIXED_LEN + 6 * tidings_wire::RANGE_LEN)
    }

    fn release(
        &mut self,
        now: Time,
        level: usize,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let mut origins = std::mem::take(&mut self.origins_scratch);
        self.known_origins(level, own, &mut origins);
        let mut st = std::mem::take(&mut self.state_scratch);
        origins.retain(|&o| {
            let lead = self.rings[level].lead.as_ref();
            let idle = lead
                .and_then(|l| l.idle_rounds.get(&o))
                .copied()
                .unwrap_or(0);
            self.member_state(level, o, 0, own, 0, config, &mut st);
            !(idle >= config.idle_rounds_before_drop && st.max <= self.stable_known(o, own))
        });
        self.state_scratch = st;
        self.release_with(now, level, &mut origins, own, config, out);
        self.origins_scratch = origins;
    }

    /// [`release`](Self::release) for the origins that ride along this round.
    fn release_with(
        &mut self,
        now: Time,
        level: usize,
        origins: &mut Vec<NodeId>,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let Some(lead) = self.rings[level].lead.as_mut() else {
            return;
        };
        lead.next_release = now + config.token_interval;
        if origins.is_empty() {
            if !lead.dormant {
                out.stats.ring_sleeps += 1;
            }
            lead.dormant = true;
            return;
        }
        let records_max = Self::records_max(config);
        if origins.len() > records_max {
            // Rotate which senders ride along so every one gets its turn.
            let shift = (lead.round as usize) % origins.len();
            origins.rotate_left(shift);
            origins.truncate(records_max);
        }
        lead.round += 1;
        lead.in_flight = true;
        lead.released_at = now;
        let round = lead.round;
        let cap = Self::record_cap(config, origins.len());
        // Records (and their lists) are overwritten in place, round after round.
        let mut records = std::mem::take(&mut self.records_scratch);
        let mut st = std::mem::take(&mut self.state_scratch);
        // A ring of one has no successor to push anything.
        let alone = self.rings[level].members.len() == 1;
        for (n, &o) in origins.iter().enumerate() {
            self.member_state(level, o, 0, own, cap, config, &mut st);
            if level == 0 && !alone {
                self.offer_pushes(now, o, cap, true, config, &mut st);
            }
            let rec = record_slot(&mut records, n, out);
            rec.origin = o;
            rec.stable_upto = self.stable_known(o, own);
            rec.agg_contiguous = st.contiguous;
            rec.agg_max = st.max;
            rec.prev_contiguous = st.contiguous;
            rec.prev_max = st.exact_upto.max(st.contiguous);
            rec.missing_all.clone_from(&st.missing);
            rec.lost.clone_from(&st.lost);
            rec.prev_missing.clone_from(&st.missing);
        }
        truncate_records(&mut records, origins.len(), out);
        self.state_scratch = st;
        out.stats.tokens_released += 1;
        let ring = &self.rings[level];
        let mut token = OwnedToken {
            level: ring.level,
            ring: ring.index,
            round,
            records,
        };
        if ring.members.len() == 1 {
            self.complete_round(now, level, &mut token, own, config, out);
        } else {
            self.pass_on(now, level, &token, config, out);
        }
        self.records_scratch = token.records;
    }

    /// Hands `token` to the next member of the ring at `level`, keeping its encoding until the
    /// member confirms it.
    fn pass_on(
        &mut self,
        now: Time,
        level: usize,
        token: &OwnedToken,
        config: &Config,
        out: &mut Outbox,
    ) {
        let (region, view, me) = (self.region, self.view, self.me);
        let ring = &mut self.rings[level];
        let to = ring.successor();
        out.send_token(region, view, me, to, token, config, &mut ring.handoff_bytes);
        ring.handoff = Some(Handoff {
            to,
            round: token.round,
            sent_at: now,
            attempts: 0,
        });
    }

    /// A token arrived from `from`.
    pub(crate) fn on_token(
        &mut self,
        now: Time,
        from: NodeId,
        token: &mut OwnedToken,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let level = usize::from(token.level);
        let Some(ring) = self.rings.get_mut(level) else {
            out.stats.invalid_dropped += 1;
            return;
        };
        if ring.index != token.ring || ring.predecessor() != from {
            out.stats.invalid_dropped += 1;
            return;
        }
        // Confirm even a duplicate, so the sender stops resending.
        out.control.push_back(Control::TokenAck {
            to: from,
            region: self.region,
            view: self.view,
            level: token.level,
            ring: token.ring,
            round: token.round,
        });
        if let Some(lead) = ring.lead.as_ref() {
            if !lead.in_flight || lead.round != token.round {
                out.stats.tokens_stale_dropped += 1;
                return;
            }
            self.complete_round(now, level, token, own, config, out);
            return;
        }
        if token.round <= ring.last_round_seen {
            out.stats.tokens_stale_dropped += 1;
            return;
        }
        ring.last_round_seen = token.round;
        // Records (and their lists) are overwritten in place, token after token.
        let mut records = std::mem::take(&mut self.records_scratch);
        let mut st = std::mem::take(&mut self.state_scratch);
        let mut n = 0;
        let cap = Self::record_cap(config, token.records.len() + 1);
        for rec in &token.records {
            self.learn(now, level, rec, config, out);
            self.member_state(level, rec.origin, rec.agg_max, own, cap, config, &mut st);
            if level == 0 {
                self.compare_with_predecessor(now, from, rec, own, config, out);
                // After the pulls above, so that what this node just asked its predecessor
                // for is not asked of its successor too.
                self.offer_pushes(now, rec.origin, cap, true, config, &mut st);
            }
            let merged = record_slot(&mut records, n, out);
            self.merge(level, rec, &st, cap, own, merged);
            n += 1;
        }
        // Senders this node knows of with unstable data that the token lacks: add a record whose
        // aggregate claims nothing (earlier members did not report), so the leader learns of them.
        if n < Self::records_max(config) {
            let mut origins = std::mem::take(&mut self.origins_scratch);
            self.known_origins(level, own, &mut origins);
            for &o in &origins {
                let seen = token.records.iter().any(|r| r.origin == o);
                if seen || n >= Self::records_max(config) {
                    continue;
                }
                self.member_state(level, o, 0, own, cap, config, &mut st);
                let stable = self.stable_known(o, own);
                if st.max <= stable {
                    continue;
                }
                if level == 0 {
                    // The token's list budget counted one record more than it carried, so a
                    // record added here asks for no pushes (at most one range, beside its
                    // missing list).
                    self.offer_pushes(now, o, cap, false, config, &mut st);
                }
                let rec = record_slot(&mut records, n, out);
                rec.origin = o;
                rec.stable_upto = stable;
                rec.agg_contiguous = 0;
                rec.agg_max = st.max;
                rec.prev_contiguous = st.contiguous;
                rec.prev_max = st.exact_upto.max(st.contiguous);
                rec.missing_all.clear();
                rec.lost.clear();
                if level == 0 {
                    // The push request (ADR 13); above level 0 an added record claims nothing.
                    rec.lost.clone_from(&st.lost);
                }
                rec.prev_missing.clone_from(&st.missing);
                n += 1;
            }
            self.origins_scratch = origins;
        }
        truncate_records(&mut records, n, out);
        self.state_scratch = st;
        let forwarded = OwnedToken {
            level: token.level,
            ring: token.ring,
            round: token.round,
            records,
        };
        out.stats.tokens_forwarded += 1;
        self.pass_on(now, level, &forwarded, config, out);
        self.records_scratch = forwarded.records;
    }

    /// The next member confirmed a token this node passed on.
    pub(crate) fn on_token_ack(
        &mut self,
        from: NodeId,
        level: u8,
        ring: u16,
        round: u64,
        out: &mut Outbox,
    ) {
        let Some(r) = self.rings.get_mut(usize::from(level)) else {
            out.stats.invalid_dropped += 1;
            return;
        };
        if r.index != ring {
            out.stats.invalid_dropped += 1;
            return;
        }
        if r.handoff
            .as_ref()
            .is_some_and(|h| h.to == from && h.round == round)
        {
            r.handoff = None;
        }
    }

    /// Resends tokens the next member did not confirm; after `token_handoff_retries` resends,
    /// reports it as suspected (the membership service decides) and stops trying.
    fn check_handoffs(&mut self, now: Time, config: &Config, out: &mut Outbox) {
        for ring in &mut self.rings {
            let Some(h) = ring.handoff.as_mut() else {
                continue;
            };
            if now < h.sent_at + config.token_handoff_timeout {
                continue;
            }
            if h.attempts < config.token_handoff_retries {
                h.attempts += 1;
                h.sent_at = now;
                out.stats.tokens_resent += 1;
                out.queue_token(h.to, &ring.handoff_bytes);
            } else {
                out.stats.suspicions += 1;
                out.events.push_back(Event::Suspect {
                    region: self.region,
                    node: h.to,
                });
                ring.handoff = None;
            }
        }
    }

    /// Folds this node's state into a record, written over `merged` (whose lists keep their
    /// storage).
    fn merge(
        &self,
        level: usize,
        rec: &OwnedRecord,
        st: &MemberState,
        cap: usize,
        own: Option<&OutboundStream>,
        merged: &mut OwnedRecord,
    ) {
        merged.origin = rec.origin;
        merged.stable_upto = rec.stable_upto.max(self.stable_known(rec.origin, own));
        merged.agg_contiguous = rec.agg_contiguous.min(st.contiguous);
        merged.agg_max = rec.agg_max.max(st.max);
        merged.prev_contiguous = st.contiguous;
        merged.prev_max = st.exact_upto.max(st.contiguous);
        if level == 0 {
            ranges::intersect(&rec.missing_all, &st.missing, cap, &mut merged.missing_all);
            merged.prev_missing.clone_from(&st.missing);
            merged.lost.clone_from(&st.lost);
        } else {
            ranges::union(&rec.lost, &st.lost, cap, &mut merged.lost);
            merged.missing_all.clear();
            merged.prev_missing.clear();
        }
    }

    /// What a record teaches this node: that messages exist (gap detection) and what is stable
    /// (cleanup).
    fn learn(
        &mut self,
        now: Time,
        level: usize,
        rec: &OwnedRecord,
        config: &Config,
        out: &mut Outbox,
    ) {
        let Some(stream) = self.stream_mut(rec.origin, config) else {
            return;
        };
        if level == 0 {
            stream.note_exists(now, rec.agg_max, config.receive_window_msgs);
        }
        let dropped = stream.set_stable(rec.stable_upto);
        out.stats.cache_evictions += dropped as u64;
    }

    /// Neighbour comparison on a level-0 token from `pred`: push what it lacks and this node
    /// holds; pull what this node lacks, its partition caches, and `pred` has.
    fn compare_with_predecessor(
        &mut self,
        now: Time,
        pred: NodeId,
        rec: &OwnedRecord,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let (region, view) = (self.region, self.view);
        // Push: what the predecessor asked to have pushed (`lost` at level 0, ADR 13), reported
        // missing, and this node holds. A recovering predecessor pulls its other gaps elsewhere
        // (or has them on the way): pushing them too made a third of its repairs duplicates.
        let mut push = std::mem::take(&mut self.push_scratch);
        push.clear();
        let (mut pushed, mut scanned) = (0usize, 0usize);
        let scan_max = config.push_max_per_token * 4;
        // An empty request list: the predecessor is not recovering and takes anything it lacks.
        let asked = if rec.lost.is_empty() {
            &rec.prev_missing
        } else {
            &rec.lost
        };
        'ranges: for r in asked {
            for seq in r.start..r.end() {
                if pushed >= config.push_max_per_token || scanned >= scan_max {
                    break 'ranges;
                }
                scanned += 1;
                if seq <= rec.prev_contiguous || !ranges::contains(&rec.prev_missing, seq) {
                    // A request for what the predecessor does not report missing: ignored
                    // (only a faulty or hostile peer sends one).
                    continue;
                }
                let have = if rec.origin == self.me {
                    own.is_some_and(|s| seq <= s.sent_upto && s.get(seq).is_some())
                } else {
                    self.inbound
                        .get(&rec.origin)
                        .is_some_and(|s| s.get(seq).is_some())
                };
                if have {
                    ranges::push_range(&mut push, seq, seq + 1, usize::MAX);
                    pushed += 1;
                }
            }
        }
        for &r in &push {
            let job = RepairJob::new(
                Destination::Node(pred),
                region,
                view,
                rec.origin,
                r.start,
                r.end(),
                RepairCause::Push,
                now,
            );
            out.queue_repair(job, config);
        }
        self.push_scratch = push;
        // Pull.
        if rec.origin == self.me {
            return;
        }
        let caching = self.caching_rule();
        let Some(stream) = self.inbound.get_mut(&rec.origin) else {
            return;
        };
        let stable = stream.stable_upto;
        let mut pulls = out.take_range_list();
        let (retry, range) = (stream.nack.retry(config), stream.nack.window(config));
        stream.request_gaps_where(
            now,
            retry,
            (config.repair_inflight_max, range),
            |seq| {
                let cached_here = caching.caches(seq);
                let pred_has = seq <= rec.prev_contiguous
                    || (seq <= rec.prev_max && !ranges::contains(&rec.prev_missing, seq));
                seq > stable && cached_here && pred_has
            },
            |seq| {
                ranges::push_range(&mut pulls, seq, seq + 1, usize::MAX);
            },
        );
        if !pulls.is_empty() {
            out.stats.pulls_sent += 1;
            out.stats.pull_seqs_requested += pulls.iter().map(|r| u64::from(r.len)).sum::<u64>();
            out.control.push_back(Control::Pull {
                to: pred,
                region,
                view,
                origin: rec.origin,
                ranges: pulls,
            });
        } else {
            out.recycle_range_list(pulls);
        }
    }

    /// At level 0, before this node's state for `origin` goes into a token: which of its gaps it
    /// asks its successor to push, into `st.lost` (ADR 13). A node that is not recovering leaves
    /// the list empty, which takes pushes of anything it lacks, as before: repairs are cheap
    /// then, and a push may beat a pull that was lost. A recovering one (with SDCC, its gaps
    /// reach beyond its NACK window) names only gaps its partition caches (all the successor
    /// keeps), not requested already, within the NACK window and the room
    /// `repair_inflight_max` leaves, at most `push_max_per_token`, and they count as requested
    /// from now on, so each gap is asked of one peer at a time and the recovering receiver gets
    /// each missing message about once; with nothing to ask (or `requests` false: a record the
    /// token's budget did not plan for) it names one sequence number beyond what its record
    /// describes, which no neighbour can push.
    fn offer_pushes(
        &mut self,
        now: Time,
        origin: NodeId,
        cap: usize,
        requests: bool,
        config: &Config,
        st: &mut MemberState,
    ) {
        st.lost.clear();
        if origin == self.me {
            return;
        }
        let caching = self.caching_rule();
        let Some(stream) = self.inbound.get_mut(&origin) else {
            return;
        };
        let (retry, range) = (stream.nack.retry(config), stream.nack.window(config));
        let span = stream.known_max().saturating_sub(stream.delivered_upto);
        let recovering =
            config.adaptive_nack_window && span > u64::try_from(range).unwrap_or(u64::MAX);
        if !recovering {
            return;
        }
        if requests {
            let stable = stream.stable_upto;
            stream.offer_for_push(
                now,
                retry,
                (config.push_max_per_token, config.repair_inflight_max, range),
                cap,
                |seq| seq > stable && caching.caches(seq),
                &mut st.lost,
            );
        }
        if st.lost.is_empty() {
            // The record's `prev_max`: nothing beyond it is in `prev_missing`.
            let beyond = st.exact_upto.max(st.contiguous);
            if let Some(seq) = beyond.checked_add(1).filter(|s| s.checked_add(1).is_some()) {
                st.lost.push(SeqRange { start: seq, len: 1 });
            }
        }
    }

    fn complete_round(
        &mut self,
        now: Time,
        level: usize,
        token: &mut OwnedToken,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let ring = &mut self.rings[level];
        let top = ring.top;
        let pred = ring.predecessor();
        let single = ring.members.len() == 1;
        let Some(lead) = ring.lead.as_mut() else {
            return;
        };
        let rtt = now - lead.released_at;
        lead.rtt_smoothed = if lead.rtt_smoothed.is_zero() {
            rtt
        } else {
            (lead.rtt_smoothed * 7 + rtt) / 8
        };
        lead.in_flight = false;
        let interval = lead.paced_interval(now, &token.records, config);
        if interval < config.token_interval {
            out.stats.tokens_paced += 1;
        }
        lead.last_round_at = Some(now);
        lead.next_release = (lead.released_at + interval).max(now);
        out.stats.token_rounds_completed += 1;
        out.events.push_back(Event::TokenRound {
            region: self.region,
            level: token.level,
            top,
            rtt,
        });
        // The records stay in the token for reuse; their lists are swapped with the reports'.
        for rec in &mut token.records {
            if !single {
                self.learn(now, level, rec, config, out);
                if level == 0 {
                    self.compare_with_predecessor(now, pred, rec, own, config, out);
                }
            }
            let Some(lead) = self.rings[level].lead.as_mut() else {
                return;
            };
            let idle = rec.agg_contiguous == rec.agg_max && rec.stable_upto == rec.agg_max;
            let count = lead.idle_rounds.entry(rec.origin).or_insert(0);
            *count = if idle { count.saturating_add(1) } else { 0 };
            // The old report's list goes to the record (overwritten next round) rather than freed.
            let mut report = lead
                .reports
                .get_mut(&rec.origin)
                .map(std::mem::take)
                .unwrap_or_default();
            report.contiguous = rec.agg_contiguous;
            report.max = rec.agg_max;
            let list = if level == 0 {
                &mut rec.missing_all
            } else {
                &mut rec.lost
            };
            std::mem::swap(&mut report.ranges, list);
            if top {
                self.region_round(rec.origin, &report, own, config, out);
            }
            if let Some(lead) = self.rings[level].lead.as_mut() {
                lead.reports.insert(rec.origin, report);
            }
        }
    }

    /// The region leader's duties for one sender after a top-level round: ACK the region's
    /// contiguous minimum, NAK what caching partitions lost entirely.
    fn region_round(
        &mut self,
        origin: NodeId,
        report: &Report,
        own: Option<&OutboundStream>,
        config: &Config,
        out: &mut Outbox,
    ) {
        let (region, view) = (self.region, self.view);
        let stable = report.contiguous.max(self.stable_known(origin, own));
        let lost = &report.ranges;
        if origin == self.me {
            out.self_acks.push((region, stable));
            if !lost.is_empty() {
                let mut list = out.take_range_list();
                list.extend_from_slice(lost);
                out.self_naks.push((region, list));
            }
            return;
        }
        // Each round ACKs only progress: in a region with a quiet sender (or a node in
        // thousands of regions) a round every token interval would otherwise send the same
        // ACK each time. A lost ACK is sent again when the sender's silence shows it lacks it
        // (`on_silence`).
        let mut advanced = true;
        if let Some(stream) = self.stream_mut(origin, config) {
            let dropped = stream.set_stable(stable);
            out.stats.cache_evictions += dropped as u64;
            advanced = stable > stream.ack_sent_upto;
            stream.ack_sent_upto = stream.ack_sent_upto.max(stable);
        }
        if stable > 0 && advanced {
            out.stats.acks_sent += 1;
            out.control.push_back(Control::Ack {
                to: origin,
                region,
                view,
                origin,
                stable_upto: stable,
            });
        }
        if !lost.is_empty() {
            out.stats.naks_sent += 1;
            let mut list = out.take_range_list();
            list.extend_from_slice(lost);
            out.control.push_back(Control::Nak {
                to: origin,
                region,
                view,
                origin,
                ranges: list,
            });
        }
    }

    /// A silence heartbeat: gap detection for tail loss, and, at the region leader, a chance to
    /// resend an ACK the sender did not get.
    pub(crate) fn on_silence(
        &mut self,
        now: Time,
        origin: NodeId,
        silence: tidings_wire::Silence,
        config: &Config,
        out: &mut Outbox,
    ) {
        let tidings_wire::Silence {
            last_seq,
            timestamp_us,
            acked_upto,
        } = silence;
        let leader = self.is_region_leader();
        let (region, view) = (self.region, self.view);
        let Some(stream) = self.stream_mut(origin, config) else {
            return;
        };
        stream.note_exists(now, last_seq, config.receive_window_msgs);
        stream.note_silence(last_seq, timestamp_us);
        stream.release_storage_at_rest(timestamp_us, config.silence_idle_interval);
        if leader && acked_upto < stream.stable_upto {
            out.stats.acks_sent += 1;
            let stable_upto = stream.stable_upto;
            stream.ack_sent_upto = stream.ack_sent_upto.max(stable_upto);
            out.control.push_back(Control::Ack {
                to: origin,
                region,
                view,
                origin,
                stable_upto,
            });
        }
    }

    /// Asks for every gap that is due, from a random member of its caching partition, or from the
    /// sender once caching members failed `repair_attempts_before_sender` times.
    pub(crate) fn request_repairs(
        &mut self,
        now: Time,
        config: &Config,
        rng: &mut fastrand::Rng,
        out: &mut Outbox,
    ) {
        let (region, view) = (self.region, self.view);
        let mut wanted = std::mem::take(&mut self.wanted_scratch);
        let mut by_target = std::mem::take(&mut self.pulls_by_target);
        // Walks the origins by key rather than collecting them: this runs every repair interval.
        let mut next_origin = self.inbound.keys().next().copied();
        while let Some(origin) = next_origin {
            next_origin = self
                .inbound
                .range((Bound::Excluded(origin), Bound::Unbounded))
                .next()
                .map(|(&o, _)| o);
            wanted.clear();
            if let Some(stream) = self.inbound.get_mut(&origin) {
                let (retry, range) = (stream.nack.retry(config), stream.nack.window(config));
                stream.due_gaps(
                    now,
                    config.repair_delay,
                    retry,
                    (config.repair_inflight_max, range),
                    |seq, attempts| wanted.push((seq, attempts)),
                );
            }
            for &(seq, attempts) in &wanted {
                let target = if attempts < config.repair_attempts_before_sender {
                    self.random_cacher(seq, rng).unwrap_or(origin)
                } else {
                    origin
                };
                // Targets are a handful of cachers: a list beats a map here.
                let at = match by_target.iter().position(|(t, _)| *t == target) {
                    Some(at) => at,
                    None => {
                        by_target.push((target, out.take_range_list()));
                        by_target.len() - 1
                    }
                };
                let list = &mut by_target[at].1;
                let end = list.last().map_or(0, |r| r.end());
                if seq >= end {
                    ranges::push_range(list, seq, seq + 1, usize::MAX);
                }
            }
            // Requests go out in target order, as they did from an ordered map.
            by_target.sort_unstable_by_key(|(t, _)| *t);
            for (target, ranges) in by_target.drain(..) {
                if target == origin {
                    out.stats.pulls_to_sender += 1;
                } else {
                    out.stats.pulls_sent += 1;
                }
                out.stats.pull_seqs_requested +=
                    ranges.iter().map(|r| u64::from(r.len)).sum::<u64>();
                out.control.push_back(Control::Pull {
                    to: target,
                    region,
                    view,
                    origin,
                    ranges,
                });
            }
        }
        self.wanted_scratch = wanted;
        self.pulls_by_target = by_target;
    }

    /// A dump of the rings' state, for debugging.
    pub(crate) fn debug_rings(&self) -> String {
        let mut out = String::new();
        for r in &self.rings {
            out += &format!(
                "  ring level {} index {} pos {} top {} members {:?} last_round_seen {}\n",
                r.level, r.index, r.pos, r.top, r.members, r.last_round_seen
            );
            if let Some(l) = &r.lead {
                out += &format!(
                    "    lead round {} in_flight {} idle {:?}\n",
                    l.round, l.in_flight, l.idle_rounds
                );
                for (o, rep) in &l.reports {
                    out += &format!(
                        "    report {o}: contiguous {} max {} ranges {:?}\n",
                        rep.contiguous, rep.max, rep.ranges
                    );
                }
            }
        }
        out
    }

    /// Where this node sends congestion alerts: the leader of the lowest ring it does not lead,
    /// or, for the region leader, the sender itself.
    fn uca_parent(&self, origin: NodeId) -> NodeId {
        self.rings
            .iter()
            .find(|r| r.pos != 0)
            .map_or(origin, |r| r.members[0])
    }

    /// A sender's congestion query: answer it by equations 6-8 if this node falls behind.
    pub(crate) fn on_dcq(
        &mut self,
        origin: NodeId,
        seq: u64,
        position_us: u64,
        config: &Config,
        out: &mut Outbox,
    ) {
        let Some(stream) = self.inbound.get_mut(&origin) else {
            return;
        };
        let recovering = stream.ignored_since_dcq > 0;
        stream.ignored_since_dcq = 0;
        let lag = Duration::from_micros(position_us.saturating_sub(stream.doubt_horizon_us));
        let queueing = stream.queue_delay.queueing();
        // Fresh loss since the last query: what became known but did not arrive fresh.
        let learnt = stream.known_max().saturating_sub(stream.known_at_dcq);
        let loss = if learnt == 0 {
            0.0
        } else {
            1.0 - (stream.fresh_since_dcq as f64 / learnt as f64).min(1.0)
        };
        stream.known_at_dcq = stream.known_max();
        stream.fresh_since_dcq = 0;
        if let Some((nonrec, rec)) =
            crate::pdcc::uca_rates(stream.doubt_rate, recovering, lag, (queueing, loss), config)
        {
            self.consolidate_uca(origin, seq, nonrec, rec, out);
        }
    }

    /// A congestion alert from below, about `origin`'s stream.
    pub(crate) fn on_uca(
        &mut self,
        origin: NodeId,
        seq: u64,
        nonrec: f64,
        rec: f64,
        out: &mut Outbox,
    ) {
        self.consolidate_uca(origin, seq, nonrec, rec, out);
    }

    fn consolidate_uca(
        &mut self,
        origin: NodeId,
        seq: u64,
        nonrec: f64,
        rec: f64,
        out: &mut Outbox,
    ) {
        let Some((seq, nonrec, rec)) = self
            .ucas
            .entry(origin)
            .or_default()
            .process(seq, nonrec, rec)
        else {
            return;
        };
        let to = self.uca_parent(origin);
        if to == self.me {
            out.self_ucas.push((seq, nonrec.min(rec)));
            return;
        }
        out.stats.ucas_sent += 1;
        out.control.push_back(Control::Uca {
            to,
            region: self.region,
            view: self.view,
            origin,
            seq,
            nonrec: crate::pdcc::rate_to_milli(nonrec),
            rec: crate::pdcc::rate_to_milli(rec),
        });
    }

    /// Samples the doubt horizon rate of every inbound stream. True if some stream's NACK
    /// window may have changed (the region's part of the gauges then needs a refresh).
    pub(crate) fn sample_doubt_rates(
        &mut self,
        now: Time,
        alpha: f64,
        queue_delay_history: usize,
    ) -> bool {
        let mut windows_changed = false;
        for stream in self.inbound.values_mut() {
            windows_changed |= stream.sample_doubt_rate(now, alpha, queue_delay_history);
        }
        windows_changed
    }

    /// Adjusts the NACK window of every inbound stream (SDCC, equations 9-10).
    pub(crate) fn adjust_nack_windows(&mut self, now: Time, config: &Config) {
        for stream in self.inbound.values_mut() {
            let has_gaps = stream.missing_count() > 0;
            stream.nack.adjust(now, has_gaps, config);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recv::{InMsg, Retry};

    fn view(n: u32, size: usize) -> RegionView {
        let members: Vec<NodeId> = (0..n).map(NodeId).collect();
        RegionView {
            region: RegionId(1),
            view: ViewId(1),
            base: ViewId(1),
            topics: vec![TopicId(1)],
            partitions: RegionView::partitioned(&members, size),
        }
    }

    #[test]
    fn hierarchy_has_log_levels_and_bounded_rings() {
        let v = view(100, 5);
        let h = hierarchy(&v, 4);
        // 20 partitions -> 5 rings of 4 leaders -> 2 rings -> 1 ring.
        assert_eq!(
            h.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![20, 5, 2, 1]
        );
        for level in &h[1..] {
            assert!(level.iter().all(|r| r.len() <= 4 && !r.is_empty()));
        }
        assert_eq!(h.last().unwrap()[0][0], NodeId(0));
        let single = hierarchy(&view(3, 5), 4);
        assert_eq!(single.len(), 1);
    }

    #[test]
    fn caching_is_round_robin_over_partitions() {
        let v = view(20, 5);
        let st = RegionState::new(&v, NodeId(7), &Config::default(), Time::ZERO).unwrap();
        let cached: Vec<u64> = (1..=12).filter(|&s| st.caches(s)).collect();
        assert_eq!(cached, vec![2, 6, 10]);
        let mut rng = fastrand::Rng::with_seed(1);
        for seq in 1..50 {
            let m = st.random_cacher(seq, &mut rng).unwrap();
            assert_ne!(m, NodeId(7));
            assert_eq!(v.partition_of(m), Some(st.caching_partition(seq)));
        }
    }

    fn range(start: u64, end: u64) -> SeqRange {
        SeqRange {
            start,
            len: (end - start) as u32,
        }
    }

    fn pushed(out: &Outbox) -> Vec<(u64, u64)> {
        out.repairs
            .iter()
            .filter(|j| j.cause == RepairCause::Push)
            .map(|j| (j.next, j.end))
            .collect()
    }

    /// A member of a one-partition region of four (it caches everything) holding messages 1-10
    /// of sender 0.
    fn holder(me: u32) -> (RegionState, Config) {
        let config = Config::default();
        let mut st = RegionState::new(&view(4, 5), NodeId(me), &config, Time::ZERO).unwrap();
        let stream = st.stream_mut(NodeId(0), &config).unwrap();
        for seq in 1..=10 {
            let m = InMsg {
                msg_id: tidings_wire::MsgId(seq),
                topic: TopicId(1),
                timestamp_us: 0,
                payload: bytes::Bytes::new(),
            };
            stream.receive(Time::ZERO, seq, m, 100, |_, _, _| true);
        }
        (st, config)
    }

    #[test]
    fn neighbours_push_only_what_the_record_asks_for() {
        let (mut st, config) = holder(2);
        let mut out = Outbox::default();
        // The predecessor lacks 1-10 and asks for 3-4 and 20 (which it does not report
        // missing: ignored); the rest it pulls elsewhere.
        let rec = OwnedRecord {
            origin: NodeId(0),
            agg_max: 10,
            prev_max: 10,
            prev_missing: vec![range(1, 11)],
            lost: vec![range(3, 5), range(20, 21)],
            ..Default::default()
        };
        st.compare_with_predecessor(Time::ZERO, NodeId(1), &rec, None, &config, &mut out);
        assert_eq!(pushed(&out), vec![(3, 5)]);
        // A name beyond what the record describes: nothing pushed, however much is missing.
        let mut out = Outbox::default();
        let rec = OwnedRecord {
            lost: vec![range(11, 12)],
            ..rec
        };
        st.compare_with_predecessor(Time::ZERO, NodeId(1), &rec, None, &config, &mut out);
        assert!(pushed(&out).is_empty());
        // No list: a predecessor that is not recovering takes anything it lacks.
        let mut out = Outbox::default();
        let rec = OwnedRecord {
            lost: Vec::new(),
            ..rec
        };
        st.compare_with_predecessor(Time::ZERO, NodeId(1), &rec, None, &config, &mut out);
        assert_eq!(pushed(&out), vec![(1, 11)]);
    }

    #[test]
    fn a_recovering_record_asks_for_pushes_once_and_not_for_what_is_pulled() {
        let config = Config {
            adaptive_nack_window: true,
            ..Config::default()
        };
        let mut st = RegionState::new(&view(4, 5), NodeId(2), &config, Time::ZERO).unwrap();
        let stream = st.stream_mut(NodeId(0), &config).unwrap();
        // 1000 messages per second: the NACK window (nwnd_0, 100 ms) is 100 messages, and 200
        // are missing: recovering.
        stream
            .nack
            .on_progress(1000, std::time::Duration::from_secs(1));
        assert_eq!(stream.nack.window(&config), 100);
        stream.note_exists(Time::ZERO, 200, 1000);
        let t = Time::ZERO + config.repair_delay;
        // 1 and 2 are pulled already (the timed requests).
        stream.due_gaps(
            t,
            config.repair_delay,
            Retry::after(config.repair_timeout),
            (2, 100),
            |_, _| {},
        );
        // The record describes the NACK window: missing up to 100.
        let mut ms = MemberState {
            exact_upto: 100,
            ..MemberState::default()
        };
        st.offer_pushes(t, NodeId(0), 10, true, &config, &mut ms);
        assert_eq!(ms.lost, vec![range(3, 101)]);
        // The next token asks for nothing more while those requests are within their backoff:
        // it names 101, beyond what the record describes.
        st.offer_pushes(t, NodeId(0), 10, true, &config, &mut ms);
        assert_eq!(ms.lost, vec![range(101, 102)]);
        // Nor do the timed requests.
        let mut asked = Vec::new();
        let stream = st.stream_mut(NodeId(0), &config).unwrap();
        stream.due_gaps(
            t,
            config.repair_delay,
            Retry::after(config.repair_timeout),
            (1000, 100),
            |s, _| asked.push(s),
        );
        assert!(asked.is_empty());
    }

    #[test]
    fn a_receiver_that_is_not_recovering_takes_pushes_of_anything_it_lacks() {
        // Without SDCC there is no NACK window to exceed; with it, 50 gaps fit in 100.
        for adaptive_nack_window in [false, true] {
            let config = Config {
                adaptive_nack_window,
                ..Config::default()
            };
            let mut st = RegionState::new(&view(4, 5), NodeId(2), &config, Time::ZERO).unwrap();
            let stream = st.stream_mut(NodeId(0), &config).unwrap();
            stream
                .nack
                .on_progress(1000, std::time::Duration::from_secs(1));
            stream.note_exists(Time::ZERO, 50, 1000);
            let t = Time::ZERO + config.repair_delay;
            stream.due_gaps(
                t,
                config.repair_delay,
                Retry::after(config.repair_timeout),
                (2, 100),
                |_, _| {},
            );
            let mut ms = MemberState {
                missing: vec![range(1, 51)],
                exact_upto: 50,
                ..MemberState::default()
            };
            st.offer_pushes(t, NodeId(0), 10, true, &config, &mut ms);
            assert!(ms.lost.is_empty());
        }
    }

    /// The region leader ACKs a sender when its stability point advanced, not every round;
    /// a silence showing an older point gets the ACK again.
    #[test]
    fn the_leader_acks_progress_once_and_again_when_a_silence_shows_it_was_lost() {
        let config = Config::default();
        let mut st = RegionState::new(&view(4, 5), NodeId(0), &config, Time::ZERO).unwrap();
        assert!(st.is_region_leader());
        let acks = |out: &Outbox| -> Vec<u64> {
            out.control
                .iter()
                .filter_map(|c| match c {
                    Control::Ack { stable_upto, .. } => Some(*stable_upto),
                    _ => None,
                })
                .collect()
        };
        let report = |contiguous| Report {
            contiguous,
            max: contiguous,
            ranges: Vec::new(),
        };
        let mut out = Outbox::default();
        st.region_round(NodeId(3), &report(5), None, &config, &mut out);
        st.region_round(NodeId(3), &report(5), None, &config, &mut out);
        assert_eq!(acks(&out), vec![5], "the same point is ACKed once");
        st.region_round(NodeId(3), &report(8), None, &config, &mut out);
        assert_eq!(acks(&out), vec![5, 8]);
        // The sender's silence says it only knows 5: the ACK of 8 was lost.
        let silence = |acked_upto| tidings_wire::Silence {
            last_seq: 8,
            timestamp_us: 0,
            acked_upto,
        };
        st.on_silence(Time::ZERO, NodeId(3), silence(5), &config, &mut out);
        assert_eq!(acks(&out), vec![5, 8, 8]);
        st.on_silence(Time::ZERO, NodeId(3), silence(8), &config, &mut out);
        st.region_round(NodeId(3), &report(8), None, &config, &mut out);
        assert_eq!(acks(&out), vec![5, 8, 8], "nothing new to ACK");
    }
}
