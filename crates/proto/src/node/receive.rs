//! Receiving: what each kind of datagram does to the node, once `Node::receive` has parsed it
//! and placed its view.

use bytes::Bytes;
use tidings_wire::{Body, Header, MsgId, NodeId, RegionId, SeqRange, Silence, TopicId};

use crate::event::{Delivery, Event};
use crate::outbox::{Outbox, RepairCause, RepairJob};
use crate::policy::CongestionPolicy;
use crate::recv::{Arrival, InMsg};
use crate::region::{CachingRule, OwnedToken};
use crate::time::Time;
use crate::topic_bits::TopicBits;
use crate::Destination;

use super::{Node, ViewStatus};

impl Node {
    /// A token: folded into this node's place in its ring. False if it is not for a ring of
    /// this node (the datagram is then done with: no gauges or timers to look at).
    pub(super) fn on_token(
        &mut self,
        now: Time,
        h: &Header,
        t: &tidings_wire::TokenView<'_>,
    ) -> bool {
        if !self.check_member_region(h) {
            return false;
        }
        let Some(region) = self.regions.get_mut(&h.region) else {
            return false;
        };
        // The records, lists and all, are reused from token to token.
        let mut records = std::mem::take(&mut self.token_records);
        crate::region::assign_records(&mut records, t.records(), &mut self.out);
        let mut token = OwnedToken {
            level: t.level,
            ring: t.ring,
            round: t.round,
            records,
        };
        let own = self.outbound.get(&h.region);
        region.on_token(now, h.sender, &mut token, own, &self.config, &mut self.out);
        self.token_records = token.records;
        self.apply_self_feedback(now);
        true
    }

    /// A congestion alert (PDCC): to this node's rate if it is about this node's stream, else
    /// consolidated and passed up the region's rings. `rates`: non-recovering, recovering.
    pub(super) fn on_uca(
        &mut self,
        now: Time,
        h: &Header,
        origin: NodeId,
        seq: u64,
        rates: (f64, f64),
    ) {
        let (nonrec, rec) = rates;
        if origin == self.me {
            self.out.stats.ucas_received += 1;
            self.congestion
                .on_feedback(now, seq, nonrec.min(rec), &self.config);
        } else if let Some(region) = self.regions.get_mut(&h.region) {
            region.on_uca(origin, seq, nonrec, rec, &mut self.out);
            self.apply_self_feedback(now);
        }
    }

    /// A region NAK of this node's stream: what it lists is re-multicast. False if it is not
    /// for a current stream of this node (counted).
    pub(super) fn on_nak(
        &mut self,
        now: Time,
        h: &Header,
        origin: NodeId,
        ranges: tidings_wire::RangesView<'_>,
    ) -> bool {
        let Some(stream) = self.outbound.get(&h.region) else {
            self.out.stats.foreign_dropped += 1;
            return false;
        };
        if origin != self.me || stream.view != h.view {
            self.out.stats.invalid_dropped += 1;
            return false;
        }
        self.out.stats.naks_received += 1;
        self.remulticast(now, h.region, ranges.iter());
        true
    }

    /// A pull: the messages of `origin` it lists are sent to the puller, from this node's
    /// stream or its cache. False if the view is not one this node knows (counted).
    pub(super) fn on_pull(
        &mut self,
        now: Time,
        h: &Header,
        origin: NodeId,
        ranges: tidings_wire::RangesView<'_>,
    ) -> bool {
        let known = if origin == self.me {
            self.outbound
                .get(&h.region)
                .is_some_and(|s| s.view == h.view)
        } else {
            self.regions
                .get(&h.region)
                .is_some_and(|r| r.view == h.view)
        };
        if !known {
            self.out.stats.foreign_dropped += 1;
            return false;
        }
        self.out.stats.pulls_received += 1;
        for r in ranges.iter() {
            let job = RepairJob::new(
                Destination::Node(h.sender),
                h.region,
                h.view,
                origin,
                r.start,
                r.end(),
                RepairCause::Pull,
                now,
            );
            self.out.queue_repair(job, &self.config);
        }
        true
    }

    /// Where the datagram's view stands: packets of a region this node is in are compared with
    /// that region's view, ACKs and NAKs with the view of the stream they acknowledge.
    pub(super) fn view_status(
        &self,
        h: &Header,
        body: &Body<'_>,
        unknown_region: ViewStatus,
    ) -> ViewStatus {
        // A view from the base on is the current one's past: its streams go on (ADR 30).
        let compare =
            |known: tidings_wire::ViewId, base: tidings_wire::ViewId| match h.view.cmp(&known) {
                std::cmp::Ordering::Equal => ViewStatus::Current(known),
                std::cmp::Ordering::Greater => ViewStatus::Future,
                std::cmp::Ordering::Less if h.view >= base => ViewStatus::Current(known),
                std::cmp::Ordering::Less => ViewStatus::Stale,
            };
        let to_sender = match body {
            Body::Ack { .. } | Body::Nak { .. } => true,
            Body::Pull { origin, .. } | Body::Uca { origin, .. } => *origin == self.me,
            _ => false,
        };
        if to_sender {
            return match self.outbound.get(&h.region) {
                Some(s) => compare(s.view, s.base),
                None => match self.membership.regions.get(&h.region) {
                    Some(v) if h.view > v.view => ViewStatus::Future,
                    _ => ViewStatus::Foreign,
                },
            };
        }
        match self.regions.get(&h.region) {
            Some(r) => compare(r.view, r.base),
            // A region this node is not in: a later view may add it (buffer), an older or current
            // one does not concern it.
            None => match self.membership.regions.get(&h.region) {
                Some(v) if h.view <= v.view => ViewStatus::Foreign,
                Some(_) => ViewStatus::Future,
                None => unknown_region,
            },
        }
    }

    /// Whether `h` belongs to a region view this node is in and its sender is a member.
    pub(super) fn check_member_region(&mut self, h: &Header) -> bool {
        match self.regions.get(&h.region) {
            Some(r) if r.view == h.view && r.is_member(h.sender) => true,
            Some(_) => {
                self.out.stats.invalid_dropped += 1;
                false
            }
            None => {
                self.out.stats.foreign_dropped += 1;
                false
            }
        }
    }

    pub(super) fn receive_messages(
        &mut self,
        now: Time,
        h: &Header,
        origin: NodeId,
        messages: tidings_wire::MessagesView<'_>,
        datagram: &Bytes,
        retransmit: bool,
    ) {
        let Some(region) = self.regions.get_mut(&h.region) else {
            self.out.stats.foreign_dropped += 1;
            return;
        };
        if region.view != h.view || origin == self.me {
            self.out.stats.foreign_dropped += 1;
            return;
        }
        let config = &self.config;
        let out = &mut self.out;
        let delivers = self.delivered.as_ref();
        let held_topics = &self.held_topics;
        let Some((stream, caching, topics)) = region.receive_parts(origin, config) else {
            out.stats.invalid_dropped += 1;
            return;
        };
        for m in messages.iter() {
            let sent_us = m.timestamp_us;
            if retransmit {
                stream.note_answer(now, m.seq);
            }
            let msg = InMsg {
                msg_id: MsgId(m.msg_id),
                topic: m.topic,
                timestamp_us: m.timestamp_us,
                payload: datagram.slice_ref(m.payload),
            };
            let was_held = stream.is_held();
            let arrival = stream.receive_holding(
                now,
                m.seq,
                msg,
                config.receive_window_msgs,
                |topic| {
                    held_topics.binary_search(&topic).is_ok()
                        && topics.binary_search(&topic).is_ok()
                },
                |seq, msg, fresh| {
                    deliver_in_order(out, origin, topics, delivers, caching, seq, msg, fresh)
                },
            );
            if !was_held && stream.is_held() {
                out.stats.held_topic_stops += 1;
            }
            match arrival {
                Arrival::New => {
                    out.stats.messages_received += 1;
                    if retransmit {
                        out.stats.repairs_received += 1;
                    } else {
                        stream.queue_delay.on_fresh(now, sent_us);
                        stream.fresh_since_dcq += 1;
                    }
                }
                Arrival::Duplicate => out.stats.duplicates_dropped += 1,
                Arrival::OutOfWindow => {
                    out.stats.out_of_window_dropped += 1;
                    if stream.is_held() {
                        out.stats.held_topic_window_dropped += 1;
                    }
                    stream.ignored_since_dcq += 1;
                }
            }
        }
    }

    pub(super) fn on_silence(&mut self, now: Time, h: &Header, s: Silence) {
        self.out.stats.silences_received += 1;
        let Some(region) = self.regions.get_mut(&h.region) else {
            self.out.stats.foreign_dropped += 1;
            return;
        };
        if region.view != h.view {
            self.out.stats.foreign_dropped += 1;
            return;
        }
        region.on_silence(now, h.sender, s, &self.config, &mut self.out);
    }

    pub(super) fn on_ack(&mut self, h: &Header, origin: NodeId, stable_upto: u64) {
        let Some(stream) = self.outbound.get_mut(&h.region) else {
            self.out.stats.foreign_dropped += 1;
            return;
        };
        if origin != self.me || stream.view != h.view {
            self.out.stats.invalid_dropped += 1;
            return;
        }
        self.out.stats.acks_received += 1;
        self.apply_ack(h.region, stable_upto);
    }

    pub(super) fn apply_ack(&mut self, region: RegionId, stable_upto: u64) {
        let Some(stream) = self.outbound.get_mut(&region) else {
            return;
        };
        let stability = &mut self.stability;
        let out = &mut self.out;
        let ok = stream.ack(stable_upto, |msg_id| {
            if stability.acked(msg_id) {
                out.stable(msg_id);
            }
        });
        if !ok {
            out.stats.invalid_dropped += 1;
        }
        self.refresh_gauges(region);
    }

    /// Applies ACKs and NAKs this node owes itself as region leader of its own streams.
    pub(super) fn apply_self_feedback(&mut self, now: Time) {
        for (region, stable) in std::mem::take(&mut self.out.self_acks) {
            let stable = stable.min(self.outbound.get(&region).map_or(0, |s| s.sent_upto));
            self.apply_ack(region, stable);
        }
        for (seq, rate) in std::mem::take(&mut self.out.self_ucas) {
            self.out.stats.ucas_received += 1;
            self.congestion.on_feedback(now, seq, rate, &self.config);
        }
        // The list of NAKs and their range lists are kept for reuse.
        let mut naks = std::mem::take(&mut self.out.self_naks);
        for (region, ranges) in naks.drain(..) {
            self.remulticast(now, region, ranges.iter().copied());
            self.out.recycle_range_list(ranges);
        }
        self.out.self_naks = naks;
    }

    /// Answers a region NAK: queues the sent, unstable messages of `ranges` of this node's stream
    /// into `region` for re-multicast.
    pub(super) fn remulticast(
        &mut self,
        now: Time,
        region: RegionId,
        ranges: impl Iterator<Item = SeqRange>,
    ) {
        let Some(stream) = self.outbound.get(&region) else {
            return;
        };
        let (sent, stable, view) = (stream.sent_upto, stream.stable_upto, stream.view);
        for r in ranges {
            let (start, end) = (r.start.max(stable + 1), r.end().min(sent + 1));
            let to = Destination::Region(region);
            let job = RepairJob::new(to, region, view, self.me, start, end, RepairCause::Nak, now);
            self.out.queue_repair(job, &self.config);
        }
    }
}

/// What happens to a message of `origin` that became in order: handed to the application
/// (`fresh` and a topic this node subscribes to), or counted as filtered or as delivered in an
/// earlier view; returns whether the message is cached (its sequence number is in this node's
/// caching partition).
#[allow(clippy::too_many_arguments)] // the receive loop's disjoint borrows, passed apart
pub(super) fn deliver_in_order(
    out: &mut Outbox,
    origin: NodeId,
    topics: &[TopicId],
    delivers: Option<&TopicBits>,
    caching: CachingRule,
    seq: u64,
    msg: &InMsg,
    fresh: bool,
) -> bool {
    if !fresh {
        out.stats.view_duplicates_dropped += 1;
    } else if topics.binary_search(&msg.topic).is_ok()
        && delivers.is_none_or(|d| d.contains(msg.topic))
    {
        out.stats.messages_delivered += 1;
        out.events.push_back(Event::Deliver(Delivery {
            origin,
            topic: msg.topic,
            msg_id: msg.msg_id,
            timestamp_us: msg.timestamp_us,
            payload: msg.payload.clone(),
        }));
    } else {
        out.stats.messages_filtered += 1;
        out.stats.bytes_filtered += msg.payload.len() as u64;
    }
    let cache = caching.caches(seq);
    if cache {
        out.stats.cache_inserts += 1;
    }
    cache
}
