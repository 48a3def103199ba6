//! The sending side: one stream per region view the node sends to, holding each payload once
//! until the region acknowledges it, and the tracker that turns per-region ACKs into per-message
//! stability.

use std::collections::VecDeque;

use bytes::Bytes;
use tidings_wire::{Message, MessagesWriter, MsgId, TopicId, ViewId};

use crate::config::Config;
use crate::time::Time;

/// A published message waiting to be sent or to become stable in one region.
#[derive(Clone, Debug)]
pub(crate) struct OutMsg {
    pub(crate) msg_id: MsgId,
    pub(crate) topic: TopicId,
    pub(crate) timestamp_us: u64,
    /// Shared by every region the message goes to (stored once).
    pub(crate) payload: Bytes,
}

/// What a sender keeps for one region view: sequence numbers `stable_upto + 1 ..= last_seq`.
#[derive(Debug)]
pub(crate) struct OutboundStream {
    pub(crate) view: ViewId,
    /// The base of the views this stream runs in: a view of the same base continues it
    /// (`RegionView::base`, ADR 30).
    pub(crate) base: ViewId,
    /// Whether message ids increase along `msgs`: false after a view that continued the stream
    /// re-homed older messages of a topic it gained to its end (see [`Self::push_rehomed`]),
    /// until the stream empties.
    ids_sorted: bool,
    /// Messages after `stable_upto`, in sequence order (sent ones first, then unsent).
    msgs: VecDeque<OutMsg>,
    /// Everything up to here is stable in the region and released.
    pub(crate) stable_upto: u64,
    /// Everything up to here was transmitted at least once.
    pub(crate) sent_upto: u64,
    /// Payload bytes of held messages not yet sent.
    unsent_bytes: usize,
    /// Payload bytes of sent, unstable messages.
    unstable_bytes: usize,
    /// Last time a data packet or silence went out.
    pub(crate) last_send: Time,
    /// Last time a data packet went out: the stream is at rest `silence_idle_interval` after
    /// it (see [`OutboundStream::release_storage_at_rest`]).
    pub(crate) last_data_at: Time,
    /// A silence heartbeat is due (set by the timer, cleared when sent).
    pub(crate) silence_pending: bool,
    /// Silences sent since the last data packet: each one waits twice as long as the one before
    /// (see [`Config::silence_backoff`]).
    pub(crate) silences_since_data: u32,
    /// After a view change, nothing is sent before this time (receivers install the new view);
    /// `Time::ZERO` when not paused. Cleared by the node's timer.
    pub(crate) paused_until: Time,
    /// The stream is in the node's queue of streams with unsent messages (`SendQueue::data`).
    pub(crate) data_queued: bool,
    /// Time of the stream's live entry in the node's stream timers (`Timers::streams`),
    /// at or before its silence or pause deadline; `None` without one.
    pub(crate) timer_at: Option<Time>,
    /// Generation of that entry: older entries of this stream are skipped.
    pub(crate) timer_generation: u64,
    /// A publish added a message whose gauges and silence deadline are not refreshed yet (the
    /// stream is listed in the node's `published`).
    pub(crate) published_unrefreshed: bool,
}

impl OutboundStream {
    pub(crate) fn new(view: ViewId, base: ViewId, now: Time) -> Self {
        OutboundStream {
            view,
            base,
            ids_sorted: true,
            msgs: VecDeque::new(),
            stable_upto: 0,
            sent_upto: 0,
            unsent_bytes: 0,
            unstable_bytes: 0,
            last_send: now,
            last_data_at: now,
            silence_pending: false,
            silences_since_data: 0,
            paused_until: Time::ZERO,
            data_queued: false,
            timer_at: None,
            timer_generation: 0,
            published_unrefreshed: false,
        }
    }

    /// Frees the message queue's storage once the stream is at rest: everything stable and
    /// nothing sent for `silence_idle_interval`. A queue keeps the capacity of its largest
    /// burst, which a node publishing on 100,000 topics held for each of them long after the
    /// traffic; a stream in use keeps its storage (no allocation per message), and one that
    /// wakes allocates once per burst after at least a second at rest.
    pub(crate) fn release_storage_at_rest(&mut self, now: Time, config: &Config) {
        if self.msgs.is_empty()
            && self.msgs.capacity() > 0
            && now >= self.last_data_at + config.silence_idle_interval
        {
            self.msgs = VecDeque::new();
        }
    }

    /// Highest sequence number assigned.
    pub(crate) fn last_seq(&self) -> u64 {
        self.stable_upto + self.msgs.len() as u64
    }

    /// Sent and not yet stable.
    pub(crate) fn unstable_msgs(&self) -> u64 {
        self.sent_upto - self.stable_upto
    }

    /// The oldest message sent and not yet stable in the region, if any.
    pub(crate) fn oldest_unstable(&self) -> Option<&OutMsg> {
        (self.unstable_msgs() > 0)
            .then(|| self.msgs.front())
            .flatten()
    }

    pub(crate) fn unstable_bytes(&self) -> usize {
        self.unstable_bytes
    }

    /// Messages published and not yet sent.
    pub(crate) fn unsent_msgs(&self) -> u64 {
        self.last_seq() - self.sent_upto
    }

    /// Whether one more message of `len` bytes fits in the send queue (back pressure). A lone
    /// message always fits an empty queue, so any payload `publish` accepts can be sent.
    pub(crate) fn admits(&self, len: usize, config: &Config) -> bool {
        let unsent = self.unsent_msgs() as usize;
        unsent == 0
            || (unsent < config.send_queue_msgs_max
                && self.unsent_bytes + len <= config.send_queue_bytes_max)
    }

    /// Appends a message; returns its sequence number.
    pub(crate) fn push(&mut self, msg: OutMsg) -> u64 {
        self.unsent_bytes += msg.payload.len();
        self.msgs.push_back(msg);
        self.last_seq()
    }

    /// Appends a message re-homed from a stream whose view ended, into this stream that goes on
    /// in a view of the same base: its id may be below those already here.
    pub(crate) fn push_rehomed(&mut self, msg: OutMsg) -> u64 {
        if self
            .msgs
            .back()
            .is_some_and(|last| last.msg_id > msg.msg_id)
        {
            self.ids_sorted = false;
        }
        self.push(msg)
    }

    /// Whether an unsent message may go out now. `others_unstable` is what the credit window
    /// counts besides this stream's own unstable messages: 0 for Horus' local window, the other
    /// senders' estimated unstable messages in the region for the global one. A stream with
    /// nothing unstable may always send, so every sender progresses however stale the estimate
    /// (the global sum then overshoots by at most one datagram per sender).
    pub(crate) fn can_send(&self, config: &Config, others_unstable: u64) -> bool {
        let unstable = self.unstable_msgs();
        self.sent_upto < self.last_seq()
            && self.paused_until == Time::ZERO
            && (unstable == 0
                || (unstable.saturating_add(others_unstable) < config.window.msgs_max as u64
                    && self.unstable_bytes < config.window.bytes_max))
    }

    /// Payload bytes held: unsent plus sent and unstable (what back pressure bounds).
    pub(crate) fn held_bytes(&self) -> usize {
        self.unsent_bytes + self.unstable_bytes
    }

    /// A held message by sequence number (sent or not).
    pub(crate) fn get(&self, seq: u64) -> Option<&OutMsg> {
        if seq <= self.stable_upto {
            return None;
        }
        self.msgs.get((seq - self.stable_upto - 1) as usize)
    }

    /// Packs unsent messages into `writer` while the window (see [`Self::can_send`]) and the
    /// datagram allow, or only one if `config.packing` is off; returns how many were packed.
    pub(crate) fn pack_unsent(
        &mut self,
        writer: &mut MessagesWriter<'_>,
        config: &Config,
        others_unstable: u64,
    ) -> usize {
        let mut packed = 0;
        while self.can_send(config, others_unstable) && (config.packing || packed == 0) {
            let seq = self.sent_upto + 1;
            let Some(m) = self.msgs.get((seq - self.stable_upto - 1) as usize) else {
                break;
            };
            let message = Message {
                seq,
                msg_id: m.msg_id.0,
                timestamp_us: m.timestamp_us,
                topic: m.topic,
                payload: &m.payload,
            };
            if writer.push(&message).is_err() {
                break;
            }
            self.unstable_bytes += m.payload.len();
            self.unsent_bytes -= m.payload.len();
            self.sent_upto = seq;
            packed += 1;
        }
        packed
    }

    /// Every message held (unstable or unsent), in sequence order, leaving the stream empty; used
    /// when the stream's view ends.
    pub(crate) fn drain_all(&mut self) -> impl Iterator<Item = OutMsg> + '_ {
        self.unsent_bytes = 0;
        self.unstable_bytes = 0;
        self.sent_upto = self.stable_upto;
        self.ids_sorted = true;
        self.msgs.drain(..)
    }

    /// Whether the stream holds message `msg_id` (ids increase along the stream), for a caller
    /// asking about increasing ids while the stream does not change: `cursor` (0 at first) is
    /// where the previous answer was found, and the search gallops forward from there (steps of
    /// 1, 2, 4 ... then a binary search in the last step), so a run of questions costs about the
    /// logarithm of the distance between answers instead of a search of the whole stream each.
    pub(crate) fn holds_after(&self, cursor: &mut usize, msg_id: MsgId) -> bool {
        if !self.ids_sorted {
            // Rare: re-homed messages sit out of order at the end. A plain search.
            return self.msgs.iter().any(|m| m.msg_id == msg_id);
        }
        let len = self.msgs.len();
        let below = |i: usize| self.msgs[i].msg_id < msg_id;
        // Every index before `lo` holds a lower id; `hi` is the end or holds one at least as high.
        let mut lo = (*cursor).min(len);
        let mut hi = lo;
        let mut step = 1;
        while hi < len && below(hi) {
            lo = hi + 1;
            hi = lo.saturating_add(step).min(len);
            step = step.saturating_mul(2);
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if below(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        *cursor = lo;
        self.msgs.get(lo).is_some_and(|m| m.msg_id == msg_id)
    }

    /// Applies a region ACK: releases everything up to `stable_upto`, calling `released` with each
    /// message id. Returns false (and changes nothing) for an ACK beyond what was sent.
    pub(crate) fn ack(&mut self, stable_upto: u64, mut released: impl FnMut(MsgId)) -> bool {
        if stable_upto > self.sent_upto {
            return false;
        }
        while self.stable_upto < stable_upto {
            let Some(m) = self.msgs.pop_front() else {
                break;
            };
            self.stable_upto += 1;
            self.unstable_bytes -= m.payload.len();
            released(m.msg_id);
        }
        if self.msgs.is_empty() {
            self.ids_sorted = true;
        }
        true
    }
}

/// Counts, per published message, the regions that have not yet acknowledged it. Message ids are
/// assigned consecutively, so a deque indexed by id replaces a map.
#[derive(Debug)]
pub(crate) struct StabilityTracker {
    /// Message id of `pending[0]`.
    first: u64,
    pending: VecDeque<u16>,
}

impl StabilityTracker {
    pub(crate) fn new() -> Self {
        Self::starting_at(1)
    }

    /// The oldest message id not known stable (every earlier one is).
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// A tracker whose first message id is `first`.
    pub(crate) fn starting_at(first: u64) -> Self {
        StabilityTracker {
            first,
            pending: VecDeque::new(),
        }
    }

    /// Registers the next message id with the number of regions it was sent to.
    pub(crate) fn register(&mut self, msg_id: MsgId, regions: u16) {
        debug_assert_eq!(msg_id.0, self.first + self.pending.len() as u64);
        self.pending.push_back(regions);
        self.trim();
    }

    /// One region acknowledged `msg_id`; returns true if it is now stable everywhere.
    pub(crate) fn acked(&mut self, msg_id: MsgId) -> bool {
        let Some(idx) = msg_id.0.checked_sub(self.first) else {
            return false;
        };
        let Some(count) = self.pending.get_mut(idx as usize) else {
            return false;
        };
        debug_assert!(
            *count > 0,
            "message acknowledged by more regions than it was sent to"
        );
        *count = count.saturating_sub(1);
        let stable = *count == 0;
        self.trim();
        stable
    }

    /// A view change took `msg_id` out of `removed` streams (theirs ended) and put it into
    /// `added` others (re-homed); the streams that still hold it keep their share. Returns true
    /// if that makes it stable.
    pub(crate) fn moved(&mut self, msg_id: MsgId, removed: u16, added: u16) -> bool {
        let Some(idx) = msg_id.0.checked_sub(self.first) else {
            return false;
        };
        let Some(count) = self.pending.get_mut(idx as usize) else {
            return false;
        };
        if *count == 0 {
            return false;
        }
        debug_assert!(
            *count >= removed,
            "message taken out of more streams than held it"
        );
        *count = count.saturating_sub(removed).saturating_add(added);
        let stable = *count == 0;
        self.trim();
        stable
    }

    /// Whether `msg_id` (an id this node assigned) is stable.
    pub(crate) fn is_stable(&self, msg_id: MsgId) -> bool {
        match msg_id.0.checked_sub(self.first) {
            None => true,
            Some(idx) => self.pending.get(idx as usize).is_some_and(|&c| c == 0),
        }
    }

    fn trim(&mut self) {
        while self.pending.front() == Some(&0) {
            self.pending.pop_front();
            self.first += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WindowConfig;
    use tidings_wire::{Header, Kind, NodeId, Packet, RegionId};

    fn out(id: u64, len: usize) -> OutMsg {
        OutMsg {
            msg_id: MsgId(id),
            topic: TopicId(1),
            timestamp_us: 0,
            payload: vec![0; len].into(),
        }
    }

    /// A stream of `count` messages of 10 bytes, and how many of them one datagram of
    /// `datagram_bytes` packs (checked to parse).
    fn packed_stream(
        count: u64,
        datagram_bytes: usize,
        config: &Config,
    ) -> (OutboundStream, usize) {
        let mut s = OutboundStream::new(ViewId(1), ViewId(1), Time::ZERO);
        for id in 1..=count {
            s.push(out(id, 10));
        }
        let header = Header {
            kind: Kind::Data,
            region: RegionId(1),
            view: ViewId(1),
            sender: NodeId(0),
            incarnation: 0,
        };
        let mut buf = vec![0u8; datagram_bytes];
        let mut w = MessagesWriter::data(&mut buf, &header).unwrap();
        let packed = s.pack_unsent(&mut w, config, 0);
        let len = w.finish();
        assert!(Packet::parse(&buf[..len]).is_ok());
        (s, packed)
    }

    #[test]
    fn window_limits_sending_and_ack_releases() {
        let config = Config {
            window: WindowConfig {
                msgs_max: 2,
                ..Default::default()
            },
            ..Config::default()
        };
        let (mut s, packed) = packed_stream(3, 1472, &config);
        assert_eq!(packed, 2);
        assert!(!s.can_send(&config, 0));
        let mut released = Vec::new();
        assert!(!s.ack(3, |m| released.push(m)));
        assert!(s.ack(1, |m| released.push(m)));
        assert_eq!(released, vec![MsgId(1)]);
        assert!(s.can_send(&config, 0));
        assert!(s.get(1).is_none() && s.get(3).is_some());
    }

    /// A stream keeps its queue's storage while in use, and gives it back once everything is
    /// stable and it sent nothing for `silence_idle_interval`.
    #[test]
    fn a_stream_at_rest_gives_its_queue_storage_back() {
        let config = Config::default();
        let (mut s, packed) = packed_stream(100, 8972, &config);
        assert_eq!(packed, 100);
        let sent_at = Time::ZERO + std::time::Duration::from_millis(5);
        s.last_data_at = sent_at;
        let idle = config.silence_idle_interval;
        // Unstable: kept whatever the time.
        s.release_storage_at_rest(sent_at + idle * 2, &config);
        assert!(s.msgs.capacity() >= 100);
        assert!(s.ack(100, |_| {}));
        // Stable, but not at rest yet.
        s.release_storage_at_rest(sent_at + idle / 2, &config);
        assert!(s.msgs.capacity() >= 100);
        s.release_storage_at_rest(sent_at + idle, &config);
        assert_eq!(s.msgs.capacity(), 0);
        // A later burst is queued as before.
        s.push(out(101, 10));
        assert!(s.get(101).is_some());
    }

    /// A re-homed message's count moves by what changed hands: it becomes stable only when
    /// every stream that holds it, old or new, has acknowledged it.
    #[test]
    fn a_moved_message_waits_for_every_stream_that_holds_it() {
        let mut t = StabilityTracker::new();
        t.register(MsgId(1), 2);
        t.register(MsgId(2), 1);
        // Message 1 leaves one ended stream and goes into two new ones; one stream kept it.
        assert!(!t.moved(MsgId(1), 1, 2));
        assert!(!t.acked(MsgId(1)));
        assert!(!t.acked(MsgId(1)));
        assert!(t.acked(MsgId(1)), "the third holder's acknowledgement");
        // Message 2 leaves its only stream for none: stable at once, and never again.
        assert!(t.moved(MsgId(2), 1, 0));
        assert!(t.is_stable(MsgId(2)));
        assert!(!t.moved(MsgId(2), 0, 1));
    }

    #[test]
    fn holds_after_answers_increasing_ids_as_a_search_would() {
        let mut s = OutboundStream::new(ViewId(1), ViewId(1), Time::ZERO);
        // Ids with gaps of every width, so galloping overshoots and lands exactly.
        let ids: Vec<u64> = (1..400u64).filter(|i| i % 3 != 0 && i % 7 != 0).collect();
        for &id in &ids {
            s.push(out(id, 1));
        }
        for stride in [1, 2, 5, 17, 101] {
            let mut cursor = 0;
            for q in (0..420u64).step_by(stride) {
                assert_eq!(
                    s.holds_after(&mut cursor, MsgId(q)),
                    ids.contains(&q),
                    "id {q} stride {stride}"
                );
            }
        }
        let mut cursor = 0;
        assert!(!OutboundStream::new(ViewId(1), ViewId(1), Time::ZERO)
            .holds_after(&mut cursor, MsgId(1)));
    }

    fn data_writer(buf: &mut [u8]) -> MessagesWriter<'_> {
        let header = Header {
            kind: Kind::Data,
            region: RegionId(1),
            view: ViewId(1),
            sender: NodeId(0),
            incarnation: 0,
        };
        MessagesWriter::data(buf, &header).unwrap()
    }

    #[test]
    fn global_window_counts_other_senders_and_packing_can_be_off() {
        let config = Config {
            window: WindowConfig {
                msgs_max: 4,
                algorithm: crate::config::WindowAlgorithm::Global,
                ..Default::default()
            },
            ..Config::default()
        };
        let mut s = OutboundStream::new(ViewId(1), ViewId(1), Time::ZERO);
        for id in 1..=6 {
            s.push(out(id, 10));
        }
        let mut buf = [0u8; 1472];
        // Others hold 3 of the 4 credits: this sender gets the one left.
        assert_eq!(s.pack_unsent(&mut data_writer(&mut buf), &config, 3), 1);
        assert!(!s.can_send(&config, 3));
        // Others hold them all: nothing more while this sender has unstable messages...
        assert!(!s.can_send(&config, 10));
        assert!(s.ack(1, |_| {}));
        // ...but a sender with nothing unstable may always send one datagram.
        assert_eq!(s.pack_unsent(&mut data_writer(&mut buf), &config, 10), 1);
        // Packing off: one message per datagram even with credit left.
        let one = Config {
            packing: false,
            ..config
        };
        assert_eq!(s.pack_unsent(&mut data_writer(&mut buf), &one, 0), 1);
        assert_eq!(s.pack_unsent(&mut data_writer(&mut buf), &config, 0), 2);
    }

    #[test]
    fn send_queue_and_window_bound_unsent_plus_unstable() {
        // Horus' end-to-end chain: publish is admitted only while the send queue has room, the
        // window bounds what leaves it; together they bound all a sender holds, by count and by
        // bytes, whatever the region acknowledges.
        let config = Config {
            window: WindowConfig {
                msgs_max: 8,
                bytes_max: 3000,
                ..Default::default()
            },
            send_queue_msgs_max: 5,
            send_queue_bytes_max: 2000,
            ..Config::default()
        };
        let mut s = OutboundStream::new(ViewId(1), ViewId(1), Time::ZERO);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut next_id = 1;
        let mut buf = [0u8; 1472];
        let msg_max = 700;
        for round in 0..2000u64 {
            for _ in 0..rng.usize(0..4) {
                let len = rng.usize(1..=msg_max);
                if s.admits(len, &config) {
                    s.push(out(next_id, len));
                    next_id += 1;
                }
            }
            if rng.bool() {
                s.pack_unsent(&mut data_writer(&mut buf), &config, 0);
            }
            if round % 7 == 0 {
                let upto = s.stable_upto + rng.u64(0..=s.unstable_msgs());
                assert!(s.ack(upto, |_| {}));
            }
            let unsent = s.unsent_msgs() as usize;
            let unstable = s.unstable_msgs() as usize;
            assert!(unsent <= config.send_queue_msgs_max);
            assert!(unstable <= config.window.msgs_max);
            assert!(s.unsent_bytes <= config.send_queue_bytes_max.max(msg_max));
            // The window is checked before a message is added, so it may end one message over.
            assert!(s.unstable_bytes < config.window.bytes_max + msg_max);
            assert!(
                s.held_bytes()
                    < config.send_queue_bytes_max.max(msg_max) + config.window.bytes_max + msg_max
            );
        }
        assert!(next_id > 100, "the run admitted {next_id} messages");
    }

    #[test]
    fn stability_needs_every_region() {
        let mut t = StabilityTracker::new();
        t.register(MsgId(1), 2);
        t.register(MsgId(2), 1);
        assert!(!t.acked(MsgId(1)));
        assert!(t.acked(MsgId(2)));
        assert!(t.is_stable(MsgId(2)) && !t.is_stable(MsgId(1)));
        assert!(t.acked(MsgId(1)));
        assert!(t.is_stable(MsgId(1)));
        t.register(MsgId(3), 0);
        assert!(t.is_stable(MsgId(3)));
    }
}
