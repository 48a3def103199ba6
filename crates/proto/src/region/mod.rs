//! The state a node keeps for a region it is a member of (paper 000 section 2, paper 001
//! section 3), by mechanism:
//! - [`ring`]: the hierarchy of token rings that recovers, aggregates and cleans up for all
//!   senders at once, and the region leader's ACKs and NAKs;
//! - [`token`]: the token records in memory;
//! - [`caching`]: cooperative caching, which partition keeps which message;
//! - [`repair`]: gap detection, neighbour push and pull on tokens, repair requests;
//! - [`doubt`]: the doubt horizon samples (Gryphon) that PDCC and SDCC read;
//! - DCQ answers and UCA consolidation are PDCC's ([`crate::pdcc`]).

mod caching;
mod doubt;
mod repair;
mod ring;
mod token;

pub(crate) use caching::CachingRule;
pub(crate) use token::{assign_records, OwnedRecord, OwnedToken};

use ring::{hierarchy, Lead, MemberState, Ring};

use std::collections::BTreeMap;
use std::sync::Arc;

use tidings_wire::{NodeId, RegionId, SeqRange, TopicId, ViewId};

use crate::config::Config;
use crate::membership::RegionView;
use crate::outbox::Outbox;
use crate::recv::InboundStream;
use crate::time::Time;

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
    ucas: crate::pdcc::UcaRelay,
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
            ucas: crate::pdcc::UcaRelay::default(),
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

    /// Whether `node` is a member of this region view.
    pub(crate) fn is_member(&self, node: NodeId) -> bool {
        self.partitions.iter().any(|p| p.contains(&node))
    }

    /// The caching rule of this node in this region view.
    /// Partitions of this view (at least 1): the caching share is one in this many.
    pub(crate) fn partition_count(&self) -> usize {
        self.partitions.len().max(1)
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
        if let Some((nonrec, rec)) = crate::pdcc::answer_dcq(stream, position_us, config) {
            self.on_uca(origin, seq, nonrec, rec, out);
        }
    }

    /// A congestion alert from below (or this node's own answer), about `origin`'s stream:
    /// consolidated and passed up the hierarchy.
    pub(crate) fn on_uca(
        &mut self,
        origin: NodeId,
        seq: u64,
        nonrec: f64,
        rec: f64,
        out: &mut Outbox,
    ) {
        let route = crate::pdcc::AlertRoute {
            me: self.me,
            parent: self.uca_parent(origin),
            region: self.region,
            view: self.view,
        };
        let alert = crate::pdcc::Alert {
            origin,
            seq,
            nonrec,
            rec,
        };
        self.ucas.relay(alert, route, out);
    }
}

#[cfg(test)]
mod tests {
    use super::ring::Report;
    use super::*;
    use crate::config::{RecoveryConfig, RecoveryPacing};
    use crate::outbox::{Control, RepairCause};
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
            recovery: RecoveryConfig {
                pacing: RecoveryPacing::Sdcc,
                ..Default::default()
            },
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
                recovery: RecoveryConfig {
                    pacing: if adaptive_nack_window {
                        RecoveryPacing::Sdcc
                    } else {
                        RecoveryPacing::Fixed
                    },
                    ..Default::default()
                },
                ..Config::default()
            };
            let mut st = RegionState::new(&view(4, 5), NodeId(2), &config, Time::ZERO).unwrap();
            let stream = st.stream_mut(NodeId(0), &config).unwrap();
            stream
                .nack
                .on_progress(1000, std::time::Duration::from_secs(1));
            // 50 arrived: 1-49 are holes.
            stream.receive(
                Time::ZERO,
                50,
                InMsg {
                    msg_id: tidings_wire::MsgId(50),
                    topic: TopicId(1),
                    timestamp_us: 0,
                    payload: bytes::Bytes::new(),
                },
                1000,
                |_, _, _| true,
            );
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

    /// A receiver that lacks only a tail younger than its request timeout (on its way, in its
    /// socket buffer) asks for no pushes: its record names one sequence number beyond what it
    /// describes (ADR 42). Once the tail is older, it takes anything again.
    #[test]
    fn a_receiver_lacking_only_a_young_tail_asks_for_no_pushes() {
        let config = Config::default();
        let mut st = RegionState::new(&view(4, 5), NodeId(2), &config, Time::ZERO).unwrap();
        let stream = st.stream_mut(NodeId(0), &config).unwrap();
        stream.note_exists(Time::ZERO, 50, 1000);
        let timeout = stream.nack.retry(&config).timeout;
        let mut ms = MemberState {
            missing: vec![range(1, 51)],
            exact_upto: 50,
            ..MemberState::default()
        };
        st.offer_pushes(Time::ZERO, NodeId(0), 10, true, &config, &mut ms);
        assert_eq!(ms.lost, vec![range(51, 52)]);
        st.offer_pushes(Time::ZERO + timeout, NodeId(0), 10, true, &config, &mut ms);
        assert!(ms.lost.is_empty());
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
