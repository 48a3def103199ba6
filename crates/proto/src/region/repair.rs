//! Recovery within a region: on a level-0 token each member compares its state with its
//! predecessor's and pushes what the predecessor lacks or pulls what it has (ADR 13); silences
//! reveal tail loss; every `repair_interval` a receiver asks for its gaps from a random member of
//! the caching partition (parallel repair), and SDCC adjusts its NACK windows.

use std::ops::Bound;

use tidings_wire::{NodeId, SeqRange};

use crate::config::Config;
use crate::outbox::{Control, Outbox, RepairCause, RepairJob};
use crate::ranges;
use crate::send::OutboundStream;
use crate::time::Time;
use crate::Destination;

use super::ring::MemberState;
use super::token::OwnedRecord;
use super::RegionState;

impl RegionState {
    /// Neighbour comparison on a level-0 token from `pred`: push what it lacks and this node
    /// holds; pull what this node lacks, its partition caches, and `pred` has.
    pub(super) fn compare_with_predecessor(
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
            (config.recovery.inflight_max, range),
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
    /// then, and a push may beat a pull that was lost; unless all it lacks is a tail younger
    /// than its request timeout, which it asks nothing for (ADR 42). A recovering one (with SDCC, its gaps
    /// reach beyond its NACK window) names only gaps its partition caches (all the successor
    /// keeps), not requested already, within the NACK window and the room
    /// `recovery.inflight_max` leaves, at most `push_max_per_token`, and they count as requested
    /// from now on, so each gap is asked of one peer at a time and the recovering receiver gets
    /// each missing message about once; with nothing to ask (or `requests` false: a record the
    /// token's budget did not plan for) it names one sequence number beyond what its record
    /// describes, which no neighbour can push.
    pub(super) fn offer_pushes(
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
        // A window of any size (fixed pacing) never counts as recovering.
        let recovering = span > u64::try_from(range).unwrap_or(u64::MAX);
        if !recovering && !stream.lacks_only_young_tail(now, retry.timeout) {
            return;
        }
        // A node that lacks only a young tail asks for nothing (ADR 42): the tail is mostly in
        // its socket buffer, and a neighbour that read further pushed it again.
        if recovering && requests {
            let stable = stream.stable_upto;
            stream.offer_for_push(
                now,
                retry,
                (
                    config.push_max_per_token,
                    config.recovery.inflight_max,
                    range,
                ),
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
                    (config.recovery.inflight_max, range),
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

    /// Adjusts the NACK window of every inbound stream (SDCC, equations 9-10).
    pub(crate) fn adjust_nack_windows(&mut self, now: Time, config: &Config) {
        for stream in self.inbound.values_mut() {
            let has_gaps = stream.missing_count() > 0;
            stream.nack.adjust(now, has_gaps, config);
        }
    }
}
