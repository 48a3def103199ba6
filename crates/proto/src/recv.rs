//! The receiving side of one stream (one origin into one region view): a bounded out-of-order
//! window, in-order exactly-once delivery, the cooperative cache, and the bookkeeping of which gaps
//! were requested when.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use tidings_wire::{MsgId, NodeId, SeqRange, TopicId};

use crate::ranges::push_range;
use crate::time::Time;

/// A received message, its payload sharing the datagram's buffer.
#[derive(Clone, Debug)]
pub(crate) struct InMsg {
    pub(crate) msg_id: MsgId,
    pub(crate) topic: TopicId,
    pub(crate) timestamp_us: u64,
    pub(crate) payload: Bytes,
}

/// A missing message and when it was last asked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gap {
    noticed: Time,
    first_request: Option<Time>,
    last_request: Option<Time>,
    pub(crate) attempts: u32,
}

impl Gap {
    /// Whether the last request for this gap may still be answered: within its backoff, and
    /// not presumed `lost`.
    fn pending(&self, now: Time, timeout: std::time::Duration, lost: Lost) -> bool {
        self.last_request.is_some_and(|at| {
            now < at + InboundStream::backoff(timeout, self.attempts)
                && lost.upto.is_none_or(|upto| at > upto)
                && (self.attempts > 1
                    || lost
                        .overtaken
                        .is_none_or(|(reorder, answered)| at + reorder >= answered))
        })
    }
}

/// Which requests are presumed lost before their timeout (see [`Retry`]).
#[derive(Clone, Copy, Debug)]
struct Lost {
    /// A first request sent more than this reordering window before this answered request.
    overtaken: Option<(std::time::Duration, Time)>,
    /// Any request sent up to here: an answered probe was sent after it.
    upto: Option<Time>,
}

/// When a request for a gap counts as unanswered, so that the gap may be asked for again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retry {
    /// How long to wait for an answer after the first request; doubled with every further
    /// attempt, up to 4 times.
    pub(crate) timeout: std::time::Duration,
    /// With SDCC: a gap's first request sent more than this before a request that has been
    /// answered is presumed lost, whatever its timeout (RACK's reordering window, RFC 8985), and
    /// asked again; a second loss waits for the timeout or the probe below, so that on a full
    /// queue the requests do not pile up faster than the timeout lets them. `None`: no
    /// reordering rule.
    pub(crate) reorder: Option<std::time::Duration>,
    /// With SDCC, a tail loss probe (as RACK-TLP's, RFC 8985): when requests are pending and
    /// neither an answer has arrived nor a request left for twice the last answer's round trip
    /// (at least this long, at most `timeout`), the gap requested last is asked for again, and
    /// when that probe's answer arrives, every request sent before the silence and still
    /// unanswered is presumed lost and asked again at once. Answers reach a receiver through one
    /// queue, its downlink, in about the order they were asked for, so whatever was asked
    /// before the probe and has not arrived by then was dropped. On a drop-tail bottleneck the
    /// full queue drops answers, and the timeout (twice a repair time measured through it,
    /// doubled per attempt: up to 4 s) left the link idle while the last gaps waited; while
    /// answers keep arriving nothing changes. `None`: the timeout alone.
    pub(crate) probe_after_min: Option<std::time::Duration>,
}

/// A tail loss probe on its way (see [`Retry::probe_after_min`]).
#[derive(Clone, Copy, Debug)]
struct Probe {
    seq: u64,
    sent_at: Time,
    /// When the silence it ends began: requests sent up to then are lost if the probe's answer
    /// comes before theirs.
    silent_since: Time,
}

impl Retry {
    /// The timeout alone.
    #[cfg(test)]
    pub(crate) fn after(timeout: std::time::Duration) -> Retry {
        Retry {
            timeout,
            reorder: None,
            probe_after_min: None,
        }
    }
}

#[derive(Clone, Debug)]
enum Slot {
    Missing(Gap),
    Have(InMsg),
}

/// What became of a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// First copy, stored (and possibly delivered).
    New,
    /// Already received or delivered.
    Duplicate,
    /// Beyond the receive window; dropped, to be recovered later.
    OutOfWindow,
}

/// Receiving state of one stream.
#[derive(Debug)]
pub(crate) struct InboundStream {
    pub(crate) origin: NodeId,
    /// Everything up to here was delivered (or filtered), in order.
    pub(crate) delivered_upto: u64,
    /// Slot `i` holds sequence number `delivered_upto + 1 + i`; its length is `known_max -
    /// delivered_upto`, never more than the receive window.
    window: VecDeque<Slot>,
    /// Number of `Missing` slots in `window`.
    missing: usize,
    /// The cooperative cache: messages whose caching partition is ours, ascending by sequence
    /// number, kept until the region reports them stable.
    cache: VecDeque<(u64, InMsg)>,
    /// Highest sequence number known stable in the region (from tokens).
    pub(crate) stable_upto: u64,
    /// At the region leader: the highest stability point ACKed to the origin. Rounds ACK only
    /// beyond it; an ACK the origin did not get is sent again when its silence shows it.
    pub(crate) ack_sent_upto: u64,
    /// Messages ever put in the cache (for the cache-fraction figure).
    pub(crate) cached_total: u64,
    /// Gryphon's doubt horizon, in the sender's clock (microseconds): nothing sent before it is
    /// unknown here any more (every message before it was delivered, and a silence heartbeat
    /// covered the time after the last one).
    pub(crate) doubt_horizon_us: u64,
    /// A silence heartbeat (last sequence number, sender time) waiting for the gaps before it.
    pending_silence: Option<(u64, u64)>,
    /// The previous rate sample: (local time, horizon then).
    doubt_sample: Option<(Time, u64)>,
    /// Rate of progress of the doubt horizon in tick-seconds per second, smoothed with the
    /// low-pass filter of Gryphon's equation 5 (`None` until two samples exist).
    pub(crate) doubt_rate: Option<f64>,
    /// Messages ignored beyond the receive window since the last DCQ: a receiver that had to ignore
    /// some is recovering (paper 002, section 4).
    pub(crate) ignored_since_dcq: u64,
    /// Per topic, the highest message id of this origin handed to the application, carried
    /// across views: after a view change the sender resends what was unstable, and what this
    /// node already delivered is recognised by its id. Kept per topic because a sender's ids
    /// increase along each topic, while a node in several regions gets the sender's topics
    /// through parallel streams whose ids interleave (a topic reaches a node through one region
    /// at a time).
    pub(crate) msg_id_floors: BTreeMap<TopicId, u64>,
    /// Gryphon's NACK window (SDCC) and the smoothed repair time.
    pub(crate) nack: crate::sdcc::NackWindow,
    /// Sender timestamp of the last message delivered in order.
    last_delivered_ts_us: u64,
    /// `delivered_upto` and `last_delivered_ts_us` at the last doubt horizon sample (the stream's
    /// rate, for the NACK window).
    progress_at_sample: (u64, u64),
    /// Queueing met by fresh messages (tells congestion from repairable loss for PDCC).
    pub(crate) queue_delay: crate::pdcc::QueueDelay,
    /// Messages received fresh (not retransmitted) since the last DCQ.
    pub(crate) fresh_since_dcq: u64,
    /// `known_max` at the last DCQ.
    pub(crate) known_at_dcq: u64,
    /// When the last answer to a request arrived, and how long after its request.
    last_answer: Option<(Time, std::time::Duration)>,
    /// The tail loss probe on its way.
    probe: Option<Probe>,
    /// Requests sent up to here and still unanswered are lost: an answered probe came later.
    lost_upto: Option<Time>,
    /// The latest time a request was sent whose answer has arrived (see [`Retry::reorder`]).
    answered_request_at: Option<Time>,
}

impl InboundStream {
    pub(crate) fn new(origin: NodeId) -> Self {
        InboundStream {
            origin,
            delivered_upto: 0,
            window: VecDeque::new(),
            missing: 0,
            cache: VecDeque::new(),
            stable_upto: 0,
            ack_sent_upto: 0,
            cached_total: 0,
            msg_id_floors: BTreeMap::new(),
            ignored_since_dcq: 0,
            doubt_horizon_us: 0,
            pending_silence: None,
            doubt_sample: None,
            doubt_rate: None,
            nack: crate::sdcc::NackWindow::default(),
            queue_delay: crate::pdcc::QueueDelay::default(),
            last_delivered_ts_us: 0,
            progress_at_sample: (0, 0),
            fresh_since_dcq: 0,
            known_at_dcq: 0,
            last_answer: None,
            probe: None,
            lost_upto: None,
            answered_request_at: None,
        }
    }

    /// A retransmission of `seq` arrived (before [`receive`](Self::receive) stores it): if `seq`
    /// was requested, an answer came now, a round trip after its last request; if that was the
    /// probe, what was asked before its silence and is still missing was lost.
    pub(crate) fn note_answer(&mut self, now: Time, seq: u64) {
        let Some(idx) = seq.checked_sub(self.delivered_upto + 1) else {
            return;
        };
        if let Some(Slot::Missing(Gap {
            last_request: Some(at),
            ..
        })) = usize::try_from(idx).ok().and_then(|i| self.window.get(i))
        {
            self.last_answer = Some((now, now.saturating_duration_since(*at)));
            self.answered_request_at = self.answered_request_at.max(Some(*at));
            if let Some(probe) = self.probe.filter(|p| p.seq == seq && p.sent_at == *at) {
                self.lost_upto = self.lost_upto.max(Some(probe.silent_since));
                self.probe = None;
            }
        }
    }

    /// A silence heartbeat: nothing was sent after `last_seq` until `timestamp_us` (sender time).
    pub(crate) fn note_silence(&mut self, last_seq: u64, timestamp_us: u64) {
        if self.pending_silence.is_none_or(|(_, ts)| timestamp_us > ts) {
            self.pending_silence = Some((last_seq, timestamp_us));
        }
        self.apply_silence();
    }

    /// Frees the receive window's and the cache's storage once the stream is at rest, as a
    /// silence sent at `silence_ts_us` (the sender's clock) shows it: everything delivered
    /// and stable, and nothing sent for `idle` before the silence. Each deque keeps the
    /// capacity of its largest burst otherwise, for every stream of a node in thousands of
    /// regions; a stream in use keeps its storage (no allocation per message).
    pub(crate) fn release_storage_at_rest(
        &mut self,
        silence_ts_us: u64,
        idle: std::time::Duration,
    ) {
        let idle_us = u64::try_from(idle.as_micros()).unwrap_or(u64::MAX);
        let at_rest = self.window.is_empty()
            && self.cache.is_empty()
            && silence_ts_us >= self.last_delivered_ts_us.saturating_add(idle_us);
        if at_rest && self.window.capacity() + self.cache.capacity() > 0 {
            self.window = VecDeque::new();
            self.cache = VecDeque::new();
        }
    }

    fn apply_silence(&mut self) {
        if let Some((last_seq, ts)) = self.pending_silence {
            if self.delivered_upto >= last_seq {
                self.doubt_horizon_us = self.doubt_horizon_us.max(ts);
                self.pending_silence = None;
            }
        }
    }

    /// Takes a sample of the doubt horizon's progress and folds it into the smoothed rate:
    /// `t = horizon advance / time elapsed`, `t_smoothed = (1 - alpha) t_smoothed + alpha t`.
    /// `queue_delay_history` is how many samples the queueing delay's baseline is the least of.
    /// True if the stream's rate, and so its NACK window, may have changed (messages were
    /// delivered since the last sample).
    pub(crate) fn sample_doubt_rate(
        &mut self,
        now: Time,
        alpha: f64,
        queue_delay_history: usize,
    ) -> bool {
        let mut rate_changed = false;
        if let Some((at, horizon)) = self.doubt_sample {
            // The stream's rate from messages alone (silence would make it look sparse).
            let (delivered, ts) = self.progress_at_sample;
            rate_changed = self.nack.on_progress(
                self.delivered_upto.saturating_sub(delivered),
                std::time::Duration::from_micros(self.last_delivered_ts_us.saturating_sub(ts)),
            );
            let elapsed_us = now.saturating_duration_since(at).as_micros() as f64;
            if elapsed_us <= 0.0 {
                return rate_changed;
            }
            let t = self.doubt_horizon_us.saturating_sub(horizon) as f64 / elapsed_us;
            self.doubt_rate = Some(match self.doubt_rate {
                None => t,
                Some(smoothed) => (1.0 - alpha) * smoothed + alpha * t,
            });
        }
        self.doubt_sample = Some((now, self.doubt_horizon_us));
        self.progress_at_sample = (self.delivered_upto, self.last_delivered_ts_us);
        self.queue_delay.sample(queue_delay_history);
        rate_changed
    }

    /// Highest sequence number known to exist.
    pub(crate) fn known_max(&self) -> u64 {
        self.delivered_upto + self.window.len() as u64
    }

    /// Number of known gaps.
    pub(crate) fn missing_count(&self) -> usize {
        self.missing
    }

    /// Messages in the cache now.
    pub(crate) fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Learns that messages up to `upto` exist, opening gaps for those not received. Bounded by the
    /// receive window.
    pub(crate) fn note_exists(&mut self, now: Time, upto: u64, receive_window: usize) {
        let limit = self.delivered_upto + receive_window as u64;
        let upto = upto.min(limit);
        while self.known_max() < upto {
            self.window.push_back(Slot::Missing(Gap {
                noticed: now,
                first_request: None,
                last_request: None,
                attempts: 0,
            }));
            self.missing += 1;
        }
    }

    /// Stores a received message, then delivers every message that became in order, calling
    /// `deliver(seq, msg, fresh)` for each, where `fresh` is false for a message already delivered
    /// in an earlier view (not to be handed to the application again); `deliver` returns whether
    /// the message must be cached.
    #[cfg(test)]
    pub(crate) fn receive(
        &mut self,
        now: Time,
        seq: u64,
        msg: InMsg,
        receive_window: usize,
        deliver: impl FnMut(u64, &InMsg, bool) -> bool,
    ) -> Arrival {
        self.receive_holding(now, seq, msg, receive_window, |_| false, deliver)
    }

    /// [`receive`](Self::receive), where in-order delivery stops at the first message whose
    /// topic `held` names and that would be handed to the application (not one already
    /// delivered in an earlier view): it stays at the front of the window, so the window stops
    /// advancing, `delivered_upto` (what the token record and the ACKs report) stays before it,
    /// and [`deliver_ready`](Self::deliver_ready) goes on once the topic is released.
    pub(crate) fn receive_holding(
        &mut self,
        now: Time,
        seq: u64,
        msg: InMsg,
        receive_window: usize,
        held: impl Fn(TopicId) -> bool,
        deliver: impl FnMut(u64, &InMsg, bool) -> bool,
    ) -> Arrival {
        if seq <= self.delivered_upto {
            return Arrival::Duplicate;
        }
        if seq > self.delivered_upto + receive_window as u64 {
            return Arrival::OutOfWindow;
        }
        self.note_exists(now, seq, receive_window);
        let idx = (seq - self.delivered_upto - 1) as usize;
        match &self.window[idx] {
            Slot::Have(_) => return Arrival::Duplicate,
            Slot::Missing(gap) => {
                if let Some(at) = gap.first_request {
                    self.nack.on_repair(now.saturating_duration_since(at));
                }
                self.window[idx] = Slot::Have(msg);
                self.missing -= 1;
            }
        }
        self.deliver_ready(held, deliver);
        Arrival::New
    }

    /// Whether in-order delivery stands at a message of a held topic: the front of the window
    /// is received and waits (see [`receive_holding`](Self::receive_holding)).
    pub(crate) fn is_held(&self) -> bool {
        matches!(self.window.front(), Some(Slot::Have(_)))
    }

    /// Delivers every message in order from the front of the window, up to the first gap or the
    /// first message of a topic `held` names that would be handed to the application; calls
    /// `deliver` as [`receive`](Self::receive) does. True if it stopped at a held message.
    pub(crate) fn deliver_ready(
        &mut self,
        held: impl Fn(TopicId) -> bool,
        mut deliver: impl FnMut(u64, &InMsg, bool) -> bool,
    ) -> bool {
        let mut stopped = false;
        while let Some(Slot::Have(front)) = self.window.front() {
            if held(front.topic)
                && self
                    .msg_id_floors
                    .get(&front.topic)
                    .is_none_or(|&floor| front.msg_id.0 > floor)
            {
                stopped = true;
                break;
            }
            let Some(Slot::Have(msg)) = self.window.pop_front() else {
                break;
            };
            self.delivered_upto += 1;
            let seq = self.delivered_upto;
            self.doubt_horizon_us = self.doubt_horizon_us.max(msg.timestamp_us);
            self.last_delivered_ts_us = self.last_delivered_ts_us.max(msg.timestamp_us);
            let floor = self.msg_id_floors.entry(msg.topic).or_insert(0);
            let fresh = msg.msg_id.0 > *floor;
            *floor = (*floor).max(msg.msg_id.0);
            if deliver(seq, &msg, fresh) && seq > self.stable_upto {
                self.cache.push_back((seq, msg));
                self.cached_total += 1;
            }
        }
        self.apply_silence();
        stopped
    }

    /// A message this node holds (cached or waiting in the window), for retransmission.
    pub(crate) fn get(&self, seq: u64) -> Option<&InMsg> {
        if seq > self.delivered_upto {
            return match self.window.get((seq - self.delivered_upto - 1) as usize) {
                Some(Slot::Have(m)) => Some(m),
                _ => None,
            };
        }
        let idx = self.cache.partition_point(|(s, _)| *s < seq);
        match self.cache.get(idx) {
            Some((s, m)) if *s == seq => Some(m),
            _ => None,
        }
    }

    /// Raises the region's stable point and drops cached messages up to it; returns how many were
    /// dropped.
    pub(crate) fn set_stable(&mut self, stable_upto: u64) -> usize {
        if stable_upto <= self.stable_upto {
            return 0;
        }
        self.stable_upto = stable_upto;
        let before = self.cache.len();
        while self.cache.front().is_some_and(|(s, _)| *s <= stable_upto) {
            self.cache.pop_front();
        }
        before - self.cache.len()
    }

    /// The ranges this node lacks in `(delivered_upto, horizon]` (including what lies beyond its
    /// own knowledge), at most `cap` ranges; returns the highest sequence number the list
    /// describes exactly (lower than `horizon` if the list was cut).
    pub(crate) fn missing_ranges(&self, horizon: u64, cap: usize, out: &mut Vec<SeqRange>) -> u64 {
        out.clear();
        let mut run: Option<u64> = None;
        for (i, slot) in self.window.iter().enumerate() {
            let seq = self.delivered_upto + 1 + i as u64;
            if seq > horizon {
                break;
            }
            match (slot, run) {
                (Slot::Missing(_), None) => run = Some(seq),
                (Slot::Have(_), Some(start)) => {
                    if !push_range(out, start, seq, cap) {
                        return start - 1;
                    }
                    run = None;
                }
                _ => {}
            }
        }
        let known = self.known_max().min(horizon);
        let start = run.unwrap_or(known + 1);
        if horizon >= start && !push_range(out, start, horizon + 1, cap) {
            return start - 1;
        }
        horizon.max(self.delivered_upto)
    }

    /// Calls `request(seq, attempts_so_far)` for each gap due for a (re)request among the first
    /// `range_max` messages after the last delivered one (the NACK window) and marks it
    /// requested now, keeping at most `inflight_max` gaps requested and still pending. The wait
    /// before asking again doubles with every attempt, up to 4 times `retry.timeout`, so that
    /// requests slow down when answers are slow instead of piling up in queues; with
    /// `retry.reorder` a first request overtaken by the answer to a later one is asked again at
    /// once, and with `retry.probe_after_min` the gap asked for last is probed after a silence.
    pub(crate) fn due_gaps(
        &mut self,
        now: Time,
        delay: std::time::Duration,
        retry: Retry,
        (inflight_max, range_max): (usize, usize),
        mut request: impl FnMut(u64, u32),
    ) {
        if self.missing == 0 {
            return;
        }
        let lost = self.lost(retry);
        let pending = |gap: &Gap| gap.pending(now, retry.timeout, lost);
        // What is pending, and the request sent last (the probe's candidate).
        let (mut inflight, mut last) = (0, None);
        for (i, slot) in self.window.iter().enumerate() {
            if let Slot::Missing(gap) = slot {
                if pending(gap) {
                    inflight += 1;
                    if last.is_none_or(|(_, at)| gap.last_request >= Some(at)) {
                        last = gap.last_request.map(|at| (i, at));
                    }
                }
            }
        }
        let mut seen = 0;
        for (i, slot) in self.window.iter_mut().enumerate() {
            if inflight >= inflight_max || seen >= self.missing || i >= range_max {
                break;
            }
            let Slot::Missing(gap) = slot else { continue };
            seen += 1;
            let due = match gap.last_request {
                None => now >= gap.noticed + delay,
                Some(_) => !pending(gap),
            };
            if due {
                request(self.delivered_upto + 1 + i as u64, gap.attempts);
                gap.first_request.get_or_insert(now);
                gap.last_request = Some(now);
                gap.attempts += 1;
                inflight += 1;
                last = None;
            }
        }
        self.probe_after_silence(now, retry, last, &mut request);
    }

    /// What is presumed lost now (see [`Retry`]).
    fn lost(&self, retry: Retry) -> Lost {
        Lost {
            overtaken: retry.reorder.zip(self.answered_request_at),
            upto: self.lost_upto,
        }
    }

    /// The tail loss probe (see [`Retry::probe_after_min`]): `last` is the pending request sent
    /// last (window index, time), `None` if a request left now or none is pending.
    fn probe_after_silence(
        &mut self,
        now: Time,
        retry: Retry,
        last: Option<(usize, Time)>,
        request: &mut impl FnMut(u64, u32),
    ) {
        let (Some(least), Some((answered_at, rtt)), Some((i, requested_at))) =
            (retry.probe_after_min, self.last_answer, last)
        else {
            return;
        };
        let silent_since = answered_at.max(requested_at);
        if now < silent_since + (rtt * 2).max(least).min(retry.timeout) {
            return;
        }
        if let Some(Slot::Missing(gap)) = self.window.get_mut(i) {
            let seq = self.delivered_upto + 1 + i as u64;
            request(seq, gap.attempts);
            gap.last_request = Some(now);
            gap.attempts += 1;
            self.probe = Some(Probe {
                seq,
                sent_at: now,
                silent_since,
            });
        }
    }

    /// The gaps this node asks its ring successor to push, written to `out` (at most `cap`
    /// ranges) as it passes a token on: those for which `cached` is true (the successor, in this
    /// node's partition, holds only what the partition caches) and that are not requested
    /// already, among the first `range_max` messages after the last delivered one (the NACK
    /// window), at most `max` of them, and no more than leave `inflight_max` gaps requested.
    /// They are marked requested now, as a pull would be: the token record is the request, so
    /// the timed requests of [`due_gaps`](Self::due_gaps) do not ask for them elsewhere while
    /// the push is on its way, and come back to them after the backoff if it never arrives.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn offer_for_push(
        &mut self,
        now: Time,
        retry: Retry,
        (max, inflight_max, range_max): (usize, usize, usize),
        cap: usize,
        mut cached: impl FnMut(u64) -> bool,
        out: &mut Vec<SeqRange>,
    ) {
        out.clear();
        if self.missing == 0 || max == 0 || cap == 0 {
            return;
        }
        let lost = self.lost(retry);
        let inflight = self
            .window
            .iter()
            .filter(
                |slot| matches!(slot, Slot::Missing(gap) if gap.pending(now, retry.timeout, lost)),
            )
            .count();
        let room = inflight_max.saturating_sub(inflight).min(max);
        let mut taken = 0;
        for (i, slot) in self.window.iter_mut().enumerate().take(range_max) {
            if taken >= room {
                break;
            }
            let Slot::Missing(gap) = slot else { continue };
            let seq = self.delivered_upto + 1 + i as u64;
            if gap.pending(now, retry.timeout, lost) || !cached(seq) {
                continue;
            }
            if !push_range(out, seq, seq + 1, cap) {
                break;
            }
            gap.first_request.get_or_insert(now);
            gap.last_request = Some(now);
            gap.attempts += 1;
            taken += 1;
        }
    }

    /// Whether everything this node lacks is a young tail: no hole before the last message
    /// received, and every gap after it noticed less than `young` ago (mostly on its way, in
    /// this node's socket buffer). False with nothing missing.
    pub(crate) fn lacks_only_young_tail(&self, now: Time, young: std::time::Duration) -> bool {
        if self.missing == 0 {
            return false;
        }
        let last_received = self
            .window
            .iter()
            .rposition(|slot| matches!(slot, Slot::Have(_)));
        self.window.iter().enumerate().all(|(i, slot)| match slot {
            Slot::Have(_) => true,
            Slot::Missing(gap) => {
                last_received.is_none_or(|last| i > last)
                    && now.saturating_duration_since(gap.noticed) < young
            }
        })
    }

    /// How long to wait for an answer after `attempts` requests.
    pub(crate) fn backoff(timeout: std::time::Duration, attempts: u32) -> std::time::Duration {
        timeout * (1u32 << attempts.saturating_sub(1).min(2))
    }

    /// Marks the gaps for which `pick` returns true as requested now (from a ring neighbour that has
    /// them), calling `requested(seq)` for each, at most `max`, among the first `range_max`
    /// messages after the last delivered one (the NACK window). Gaps whose request is pending
    /// (see [`Retry`]) are left alone: their answers may still be on the way (queued at this
    /// node's port), and asking again would only bring duplicates. So is the tail after the
    /// last message received while it is younger than the request timeout: it is mostly on
    /// its way (in this node's socket buffer), and the timed requests of
    /// [`due_gaps`](Self::due_gaps) ask for it after the repair delay if not.
    pub(crate) fn request_gaps_where(
        &mut self,
        now: Time,
        retry: Retry,
        (max, range_max): (usize, usize),
        mut pick: impl FnMut(u64) -> bool,
        mut requested: impl FnMut(u64),
    ) {
        let mut taken = 0;
        let lost = self.lost(retry);
        // Gaps before the last message received are holes; after it, the tail.
        let last_received = self
            .window
            .iter()
            .rposition(|slot| matches!(slot, Slot::Have(_)));
        for (i, slot) in self.window.iter_mut().enumerate() {
            if taken >= max || i >= range_max {
                break;
            }
            let Slot::Missing(gap) = slot else { continue };
            if last_received.is_none_or(|last| i > last)
                && now.saturating_duration_since(gap.noticed) < retry.timeout
            {
                continue;
            }
            let seq = self.delivered_upto + 1 + i as u64;
            if !gap.pending(now, retry.timeout, lost) && pick(seq) {
                requested(seq);
                gap.first_request.get_or_insert(now);
                gap.last_request = Some(now);
                gap.attempts += 1;
                taken += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests answered within 40 ms, or asked again (the timeout alone).
    const TIMEOUT_40MS: Retry = Retry {
        timeout: std::time::Duration::from_millis(40),
        reorder: None,
        probe_after_min: None,
    };

    fn msg(id: u64) -> InMsg {
        InMsg {
            msg_id: MsgId(id),
            topic: TopicId(1),
            timestamp_us: 0,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn delivers_in_order_exactly_once() {
        let mut s = InboundStream::new(NodeId(1));
        let mut got = Vec::new();
        let t = Time::ZERO;
        for seq in [3, 1, 3, 2, 5, 4, 1] {
            s.receive(t, seq, msg(seq), 100, |seq, _, _| {
                got.push(seq);
                seq % 2 == 0
            });
        }
        assert_eq!(got, vec![1, 2, 3, 4, 5]);
        assert_eq!(s.cache_len(), 2);
        assert!(s.get(2).is_some() && s.get(3).is_none());
        assert_eq!(s.set_stable(3), 1);
        assert!(s.get(2).is_none() && s.get(4).is_some());
    }

    /// The receive window and the cache keep their storage while the stream is in use, and
    /// give it back once a silence shows it at rest: all delivered and stable, nothing sent
    /// for the idle interval before the silence (in the sender's clock).
    #[test]
    fn a_stream_at_rest_gives_its_storage_back() {
        let idle = std::time::Duration::from_secs(1);
        let mut s = InboundStream::new(NodeId(1));
        for seq in 1..=100 {
            let m = InMsg {
                timestamp_us: 5_000,
                ..msg(seq)
            };
            s.receive(Time::ZERO, seq, m, 1000, |_, _, _| true);
        }
        assert_eq!(s.cache_len(), 100);
        let held = |s: &InboundStream| s.window.capacity() + s.cache.capacity();
        // Cached until stable: kept whatever the silence says.
        s.release_storage_at_rest(5_000 + 2_000_000, idle);
        assert!(held(&s) >= 100);
        assert_eq!(s.set_stable(100), 100);
        // Stable, but the sender was not idle for long enough.
        s.release_storage_at_rest(5_000 + 999_999, idle);
        assert!(held(&s) >= 100);
        s.release_storage_at_rest(5_000 + 1_000_000, idle);
        assert_eq!(held(&s), 0);
        // A gap still open keeps the window.
        s.receive(Time::ZERO, 102, msg(102), 1000, |_, _, _| false);
        s.release_storage_at_rest(u64::MAX, idle);
        assert!(s.window.capacity() > 0);
        s.receive(Time::ZERO, 101, msg(101), 1000, |_, _, _| false);
        assert_eq!(s.delivered_upto, 102);
    }

    /// In-order delivery stops at a message of a held topic: the window stops there, what lies
    /// beyond it is refused, and releasing delivers in order from the held message.
    #[test]
    fn a_held_topic_stops_the_stream_at_its_next_message() {
        let topic = |seq: u64| TopicId(if seq.is_multiple_of(3) { 2 } else { 1 });
        let m = |seq: u64| InMsg {
            topic: topic(seq),
            ..msg(seq)
        };
        let held = |t: TopicId| t == TopicId(2);
        let mut s = InboundStream::new(NodeId(1));
        let mut got = Vec::new();
        for seq in 1..=10 {
            let arrival = s.receive_holding(Time::ZERO, seq, m(seq), 5, held, |seq, _, _| {
                got.push(seq);
                false
            });
            let want = if seq <= 7 {
                Arrival::New
            } else {
                Arrival::OutOfWindow
            };
            assert_eq!(arrival, want, "seq {seq}");
        }
        assert_eq!(got, vec![1, 2]);
        assert!(s.is_held());
        assert_eq!((s.delivered_upto, s.known_max()), (2, 7));
        // Still held: nothing moves.
        assert!(s.deliver_ready(held, |seq, _, _| {
            got.push(seq);
            false
        }));
        assert_eq!(got, vec![1, 2]);
        assert!(!s.deliver_ready(
            |_| false,
            |seq, _, _| {
                got.push(seq);
                false
            }
        ));
        assert_eq!(got, (1..=7).collect::<Vec<_>>());
        assert!(!s.is_held());
        // What was refused comes in again (recovery) and is delivered.
        for seq in 8..=10 {
            s.receive_holding(
                Time::ZERO,
                seq,
                m(seq),
                5,
                |_| false,
                |seq, _, _| {
                    got.push(seq);
                    false
                },
            );
        }
        assert_eq!(got, (1..=10).collect::<Vec<_>>());
    }

    /// A message delivered in an earlier view (its id at or below the topic's floor) is not
    /// handed to the application again, so a held topic does not stop at it.
    #[test]
    fn a_held_topic_does_not_stop_at_what_was_delivered_before() {
        let mut s = InboundStream::new(NodeId(1));
        s.msg_id_floors.insert(TopicId(1), 5);
        let mut got = Vec::new();
        for seq in 1..=3 {
            s.receive_holding(
                Time::ZERO,
                seq,
                msg(seq + 3),
                10,
                |_| true,
                |seq, _, fresh| {
                    got.push((seq, fresh));
                    false
                },
            );
        }
        assert_eq!(got, vec![(1, false), (2, false)]);
        assert!(s.is_held());
    }

    #[test]
    fn window_bounds_what_is_kept() {
        let mut s = InboundStream::new(NodeId(1));
        assert_eq!(
            s.receive(Time::ZERO, 11, msg(11), 10, |_, _, _| false),
            Arrival::OutOfWindow
        );
        assert_eq!(
            s.receive(Time::ZERO, 10, msg(10), 10, |_, _, _| false),
            Arrival::New
        );
        assert_eq!(s.missing_count(), 9);
        s.note_exists(Time::ZERO, 1000, 10);
        assert_eq!(s.known_max(), 10);
    }

    #[test]
    fn missing_ranges_include_unknown_tail() {
        let mut s = InboundStream::new(NodeId(1));
        for seq in [1, 2, 5, 6, 9] {
            s.receive(Time::ZERO, seq, msg(seq), 100, |_, _, _| false);
        }
        let mut out = Vec::new();
        assert_eq!(s.missing_ranges(12, 10, &mut out), 12);
        let got: Vec<(u64, u64)> = out.iter().map(|r| (r.start, r.end())).collect();
        assert_eq!(got, vec![(3, 5), (7, 9), (10, 13)]);
        assert_eq!(s.missing_ranges(12, 1, &mut out), 6);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn gaps_are_requested_after_delay_and_again_after_timeout() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut s = InboundStream::new(NodeId(1));
        s.receive(Time::ZERO, 3, msg(3), 100, |_, _, _| false);
        let mut asked = Vec::new();
        s.due_gaps(
            Time::ZERO,
            ms(2),
            TIMEOUT_40MS,
            (10, usize::MAX),
            |seq, a| asked.push((seq, a)),
        );
        assert!(asked.is_empty());
        let t = Time::ZERO + ms(2);
        s.due_gaps(t, ms(2), TIMEOUT_40MS, (1, usize::MAX), |seq, a| {
            asked.push((seq, a))
        });
        assert_eq!(asked, vec![(1, 0)]);
        s.due_gaps(t, ms(2), TIMEOUT_40MS, (10, usize::MAX), |seq, a| {
            asked.push((seq, a))
        });
        assert_eq!(asked, vec![(1, 0), (2, 0)]);
        // Both are in flight: the window of 2 is full until they time out.
        s.receive(Time::ZERO, 6, msg(6), 100, |_, _, _| false);
        s.due_gaps(t, ms(2), TIMEOUT_40MS, (2, usize::MAX), |seq, a| {
            asked.push((seq, a))
        });
        assert_eq!(asked.len(), 2);
        s.due_gaps(
            t + ms(40),
            ms(2),
            TIMEOUT_40MS,
            (2, usize::MAX),
            |seq, a| asked.push((seq, a)),
        );
        assert_eq!(&asked[2..], &[(1, 1), (2, 1)]);
        // The second wait is twice as long.
        s.due_gaps(
            t + ms(100),
            ms(2),
            TIMEOUT_40MS,
            (10, usize::MAX),
            |seq, a| asked.push((seq, a)),
        );
        assert_eq!(&asked[4..], &[(4, 0), (5, 0)]);
        s.due_gaps(
            t + ms(120),
            ms(2),
            TIMEOUT_40MS,
            (10, usize::MAX),
            |seq, a| asked.push((seq, a)),
        );
        assert_eq!(&asked[6..], &[(1, 2), (2, 2)]);
    }

    /// The gaps `due_gaps` asks for at `at_ms` (2 ms repair delay, no inflight bound).
    fn due_at(s: &mut InboundStream, retry: Retry, at_ms: u64) -> Vec<(u64, u32)> {
        let ms = std::time::Duration::from_millis;
        let mut asked = Vec::new();
        s.due_gaps(
            Time::ZERO + ms(at_ms),
            ms(2),
            retry,
            (100, usize::MAX),
            |seq, a| asked.push((seq, a)),
        );
        asked
    }

    /// The answer to a request for `seq` arrives at `at_ms`.
    fn answer_at(s: &mut InboundStream, at_ms: u64, seq: u64) {
        let at = Time::ZERO + std::time::Duration::from_millis(at_ms);
        s.note_answer(at, seq);
        s.receive(at, seq, msg(seq), 100, |_, _, _| false);
    }

    #[test]
    fn a_first_request_overtaken_by_the_answer_to_a_later_one_is_asked_again_at_once() {
        let ms = std::time::Duration::from_millis;
        let timeout_1s = std::time::Duration::from_secs(1);
        let reordering = Retry {
            timeout: timeout_1s,
            reorder: Some(ms(5)),
            probe_after_min: None,
        };
        for retry in [Retry::after(timeout_1s), reordering] {
            let ask = |s: &mut InboundStream, at_ms: u64| due_at(s, retry, at_ms);
            let mut s = InboundStream::new(NodeId(1));
            // 1-2 are asked for at 2 ms, 4-5 at 22 ms, 7-8 at 42 ms.
            s.receive(Time::ZERO, 3, msg(3), 100, |_, _, _| false);
            assert_eq!(ask(&mut s, 2), vec![(1, 0), (2, 0)]);
            s.receive(Time::ZERO + ms(20), 6, msg(6), 100, |_, _, _| false);
            assert_eq!(ask(&mut s, 22), vec![(4, 0), (5, 0)]);
            // The answer to 1 says nothing of the later requests.
            answer_at(&mut s, 25, 1);
            assert!(ask(&mut s, 25).is_empty());
            // 4's answer arrives first: 2, asked for 20 ms before it, was lost on the way (with
            // the reordering window); 5, asked for with 4, is not.
            answer_at(&mut s, 30, 4);
            let again = ask(&mut s, 30);
            if retry.reorder.is_none() {
                assert!(again.is_empty(), "without it, only the timeout asks again");
                continue;
            }
            assert_eq!(again, vec![(2, 1)]);
            // A second request overtaken too waits for its timeout.
            s.receive(Time::ZERO + ms(40), 9, msg(9), 100, |_, _, _| false);
            assert_eq!(ask(&mut s, 42), vec![(7, 0), (8, 0)]);
            answer_at(&mut s, 50, 7);
            assert_eq!(ask(&mut s, 50), vec![(5, 1)]);
        }
    }

    #[test]
    fn after_a_silence_a_probe_finds_which_answers_were_lost() {
        let ms = std::time::Duration::from_millis;
        let timeout_1s = std::time::Duration::from_secs(1);
        let probing = Retry {
            timeout: timeout_1s,
            reorder: None,
            probe_after_min: Some(ms(5)),
        };
        for retry in [Retry::after(timeout_1s), probing] {
            let ask = |s: &mut InboundStream, at_ms: u64| due_at(s, retry, at_ms);
            let mut s = InboundStream::new(NodeId(1));
            // 1-3 are asked for at 2 ms; 2's answer comes 10 ms later, 1's and 3's never do.
            s.receive(Time::ZERO, 4, msg(4), 100, |_, _, _| false);
            assert_eq!(ask(&mut s, 2), vec![(1, 0), (2, 0), (3, 0)]);
            answer_at(&mut s, 12, 2);
            // Less than twice that round trip of silence: nothing.
            assert!(ask(&mut s, 31).is_empty());
            let probe = ask(&mut s, 32);
            if retry.probe_after_min.is_none() {
                assert!(probe.is_empty(), "without it, only the timeout asks again");
                continue;
            }
            // Then the gap asked for last is probed, once per silence.
            assert_eq!(probe, vec![(3, 1)]);
            assert!(ask(&mut s, 40).is_empty());
            // 5 is asked for after the silence began.
            s.receive(Time::ZERO + ms(40), 6, msg(6), 100, |_, _, _| false);
            assert_eq!(ask(&mut s, 42), vec![(5, 0)]);
            // The probe's answer: 1, asked for before the silence, was lost; 5 may still come.
            answer_at(&mut s, 44, 3);
            assert_eq!(ask(&mut s, 44), vec![(1, 1)]);
        }
    }

    #[test]
    fn a_young_tail_alone_is_told_apart_from_holes_and_old_tails() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut s = InboundStream::new(NodeId(1));
        // Nothing missing.
        s.receive(Time::ZERO, 1, msg(1), 100, |_, _, _| true);
        assert!(!s.lacks_only_young_tail(Time::ZERO, ms(40)));
        // 2-5 are known to exist (a token said so) and not received: a tail.
        s.note_exists(Time::ZERO, 5, 100);
        assert!(s.lacks_only_young_tail(Time::ZERO + ms(39), ms(40)));
        assert!(!s.lacks_only_young_tail(Time::ZERO + ms(40), ms(40)));
        // 4 arrives: 2 and 3 are holes now.
        s.receive(Time::ZERO, 4, msg(4), 100, |_, _, _| false);
        assert!(!s.lacks_only_young_tail(Time::ZERO, ms(40)));
    }

    #[test]
    fn pushes_are_asked_only_for_cached_gaps_not_requested_elsewhere() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut s = InboundStream::new(NodeId(1));
        // Gaps 1-9 and 11-19; 20 arrived.
        for seq in [10, 20] {
            s.receive(Time::ZERO, seq, msg(seq), 100, |_, _, _| false);
        }
        let t = Time::ZERO + ms(2);
        // 1 and 2 are pulled already.
        let mut asked = Vec::new();
        s.due_gaps(t, ms(2), TIMEOUT_40MS, (2, usize::MAX), |seq, _| {
            asked.push(seq)
        });
        assert_eq!(asked, vec![1, 2]);
        let odd = |seq: u64| seq % 2 == 1;
        let mut out = Vec::new();
        // Within a NACK window of 15 messages, at most 4, only the odd ones (cached here).
        s.offer_for_push(t, TIMEOUT_40MS, (4, 100, 15), 10, odd, &mut out);
        let got: Vec<(u64, u64)> = out.iter().map(|r| (r.start, r.end())).collect();
        assert_eq!(got, vec![(3, 4), (5, 6), (7, 8), (9, 10)]);
        // They count as requested now: neither the timed requests nor the next token ask again.
        asked.clear();
        s.due_gaps(t, ms(2), TIMEOUT_40MS, (100, usize::MAX), |seq, _| {
            asked.push(seq)
        });
        assert_eq!(asked, vec![4, 6, 8, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
        s.offer_for_push(t, TIMEOUT_40MS, (100, 100, 100), 10, odd, &mut out);
        assert!(out.is_empty());
        // After the backoff an unanswered push request is asked for again.
        s.offer_for_push(t + ms(40), TIMEOUT_40MS, (100, 100, 15), 10, odd, &mut out);
        let got: Vec<(u64, u64)> = out.iter().map(|r| (r.start, r.end())).collect();
        assert_eq!(
            got,
            vec![
                (1, 2),
                (3, 4),
                (5, 6),
                (7, 8),
                (9, 10),
                (11, 12),
                (13, 14),
                (15, 16)
            ]
        );
        // The inflight bound leaves no room while three gaps are pending.
        let mut s2 = InboundStream::new(NodeId(1));
        s2.receive(Time::ZERO, 5, msg(5), 100, |_, _, _| false);
        s2.due_gaps(t, ms(2), TIMEOUT_40MS, (3, usize::MAX), |_, _| {});
        s2.offer_for_push(t, TIMEOUT_40MS, (100, 3, 100), 10, |_| true, &mut out);
        assert!(out.is_empty());
        s2.offer_for_push(t, TIMEOUT_40MS, (100, 4, 100), 10, |_| true, &mut out);
        let got: Vec<(u64, u64)> = out.iter().map(|r| (r.start, r.end())).collect();
        assert_eq!(got, vec![(4, 5)]);
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;

    #[test]
    fn messages_delivered_in_an_earlier_view_are_not_fresh() {
        let mut s = InboundStream::new(NodeId(1));
        s.msg_id_floors.insert(TopicId(1), 5);
        let mut fresh = Vec::new();
        for (seq, id) in [(1, 4), (2, 5), (3, 6), (4, 7)] {
            let m = InMsg {
                msg_id: MsgId(id),
                topic: TopicId(1),
                timestamp_us: 0,
                payload: Bytes::new(),
            };
            s.receive(Time::ZERO, seq, m, 100, |_, m, f| {
                fresh.push((m.msg_id.0, f));
                false
            });
        }
        assert_eq!(fresh, vec![(4, false), (5, false), (6, true), (7, true)]);
        assert_eq!(s.msg_id_floors.get(&TopicId(1)), Some(&7));
    }

    #[test]
    fn neighbours_are_asked_for_holes_at_once_and_for_the_tail_once_it_is_overdue() {
        let mut s = InboundStream::new(NodeId(1));
        // 1-2 and 5 came, 3-4 are a hole; a token says 10 exist: 6-10 are the tail.
        for seq in [1, 2, 5] {
            let m = InMsg {
                msg_id: MsgId(seq),
                topic: TopicId(1),
                timestamp_us: 0,
                payload: Bytes::new(),
            };
            s.receive(Time::ZERO, seq, m, 100, |_, _, _| false);
        }
        s.note_exists(Time::ZERO, 10, 100);
        let pull = |s: &mut InboundStream, now: Time| {
            let mut asked = Vec::new();
            let retry = Retry {
                timeout: std::time::Duration::from_millis(40),
                reorder: None,
                probe_after_min: None,
            };
            s.request_gaps_where(
                now,
                retry,
                (100, 100),
                |_| true,
                |seq| {
                    asked.push(seq);
                },
            );
            asked
        };
        let soon = Time::ZERO + std::time::Duration::from_millis(5);
        assert_eq!(pull(&mut s, soon), vec![3, 4]);
        // The tail still missing a request timeout later: on its way no more, asked too (the
        // hole is pending).
        let late = Time::ZERO + std::time::Duration::from_millis(40);
        assert_eq!(pull(&mut s, late), vec![6, 7, 8, 9, 10]);
    }
}

#[cfg(test)]
mod doubt_tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> Time {
        Time::ZERO + Duration::from_millis(ms)
    }

    fn msg_at(id: u64, ts_ms: u64) -> InMsg {
        InMsg {
            msg_id: MsgId(id),
            topic: TopicId(1),
            timestamp_us: ts_ms * 1000,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn the_doubt_horizon_follows_delivery_and_silence() {
        let mut s = InboundStream::new(NodeId(1));
        s.receive(at(0), 1, msg_at(1, 10), 100, |_, _, _| false);
        assert_eq!(s.doubt_horizon_us, 10_000);
        // Message 3 arrives before 2: the horizon waits for the gap.
        s.receive(at(0), 3, msg_at(3, 30), 100, |_, _, _| false);
        assert_eq!(s.doubt_horizon_us, 10_000);
        // Silence after 3 at 50 ms cannot apply before 2 is known either.
        s.note_silence(3, 50_000);
        assert_eq!(s.doubt_horizon_us, 10_000);
        s.receive(at(0), 2, msg_at(2, 20), 100, |_, _, _| false);
        assert_eq!(s.doubt_horizon_us, 50_000);
    }

    #[test]
    fn the_rate_is_one_in_real_time_and_drops_when_stalled() {
        let mut s = InboundStream::new(NodeId(1));
        let alpha = 0.1;
        // One message per 10 ms of sender time, arriving in real time.
        for k in 1..=20u64 {
            s.receive(at(k * 10), k, msg_at(k, k * 10), 100, |_, _, _| false);
            if k % 5 == 0 {
                s.sample_doubt_rate(at(k * 10), alpha, 20);
            }
        }
        let r = s.doubt_rate.unwrap();
        assert!((r - 1.0).abs() < 1e-9, "rate {r}");
        // A gap at 21 stalls the horizon while later messages keep arriving.
        for k in 22..=40u64 {
            s.receive(at(k * 10), k, msg_at(k, k * 10), 100, |_, _, _| false);
            if k % 5 == 0 {
                s.sample_doubt_rate(at(k * 10), alpha, 20);
            }
        }
        let stalled = s.doubt_rate.unwrap();
        assert!(
            stalled < 0.75,
            "smoothed rate should fall while the horizon is stuck: {stalled}"
        );
        // The repair releases everything at once: the rate jumps above real time.
        s.receive(at(405), 21, msg_at(21, 210), 100, |_, _, _| false);
        s.sample_doubt_rate(at(410), alpha, 20);
        assert!(s.doubt_rate.unwrap() > stalled);
    }
}
