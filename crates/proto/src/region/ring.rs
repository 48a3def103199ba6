//! The hierarchy of token rings (paper 000 section 2, paper 001 section 3): level 0 rings are the
//! partitions; a ring at level `l + 1` is made of the leaders of at most `ring_fanout_max` rings
//! of level `l`; the single ring at the top is led by the region leader. Each ring's leader
//! releases a token at most every `token_interval`; rings at different levels do not wait for
//! each other. A token carries one record per active sender; each member folds its state into
//! the records (minimum contiguous prefix, maximum known, what is missing at every member). When
//! a token returns to its leader the aggregate becomes the leader's state in the ring above. At
//! the top, the region leader ACKs each sender with the region's contiguous minimum and NAKs
//! what the caching partition of a message lost entirely.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_wire::{NodeId, SeqRange};

use crate::config::Config;
use crate::membership::RegionView;
use crate::outbox::{Control, Outbox};
use crate::ranges;
use crate::send::OutboundStream;
use crate::time::Time;
use crate::Event;

use super::token::{record_slot, truncate_records, OwnedRecord, OwnedToken};
use super::RegionState;

/// A member's own state for one sender at one level of the hierarchy. One is kept as scratch and
/// overwritten for every record, so its lists keep their storage.
#[derive(Clone, Debug, Default)]
pub(super) struct MemberState {
    pub(super) contiguous: u64,
    pub(super) max: u64,
    /// Level 0: what this node lacks in `(contiguous, exact_upto]`.
    pub(super) missing: Vec<SeqRange>,
    /// The highest sequence number `missing` describes exactly.
    pub(super) exact_upto: u64,
    /// Level 0: the gaps this node asks its successor to push (ADR 13), set by
    /// [`RegionState::offer_pushes`] when it passes the token on. Level 1 and up: what caching
    /// partitions below lost entirely.
    pub(super) lost: Vec<SeqRange>,
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
    pub(super) contiguous: u64,
    pub(super) max: u64,
    /// Level 0: missing at every member of the partition. Higher: lost by caching partitions.
    pub(super) ranges: Vec<SeqRange>,
}

#[derive(Debug)]
pub(super) struct Lead {
    /// Smoothed round-trip time of this ring's token (zero until measured).
    pub(super) rtt_smoothed: std::time::Duration,
    pub(super) round: u64,
    pub(super) in_flight: bool,
    pub(super) released_at: Time,
    pub(super) next_release: Time,
    /// The last release found nothing to carry: the lead has no deadline until something
    /// touches its region ([`RegionState::wake_leads`]). A release with nothing to carry sends
    /// nothing and changes nothing but `next_release`, so sleeping through those releases and
    /// waking on the ring's grid is the same protocol, and a node alone in thousands of quiet
    /// regions fires no timer per region every token interval.
    pub(super) dormant: bool,
    /// When the previous round came back (token pacing measures its senders' rates from it).
    pub(super) last_round_at: Option<Time>,
    pub(super) reports: BTreeMap<NodeId, Report>,
    pub(super) idle_rounds: BTreeMap<NodeId, u32>,
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
        let quarter_window = (config.window.msgs_max / 4).max(1) as u128;
        let nanos = quarter_window * since.as_nanos() / u128::from(advance);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            .clamp(config.token_interval_min, config.token_interval)
    }
}

/// A token handed to the next member and not yet confirmed.
#[derive(Debug)]
pub(super) struct Handoff {
    pub(super) to: NodeId,
    pub(super) round: u64,
    pub(super) sent_at: Time,
    pub(super) attempts: u32,
}

/// This node's place in one ring.
#[derive(Debug)]
pub(crate) struct Ring {
    pub(super) level: u8,
    pub(super) index: u16,
    pub(super) members: Vec<NodeId>,
    pub(super) pos: usize,
    pub(super) top: bool,
    pub(super) last_round_seen: u64,
    pub(super) lead: Option<Lead>,
    /// The token this node passed on, until the next member confirms it.
    pub(super) handoff: Option<Handoff>,
    /// The encoding of the last token this node passed on (resent while `handoff` is unconfirmed);
    /// the buffer is reused every round.
    pub(super) handoff_bytes: Vec<u8>,
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

impl RegionState {
    /// Whether this node leads the top ring (the region leader).
    pub(crate) fn is_region_leader(&self) -> bool {
        self.rings.last().is_some_and(|r| r.top && r.pos == 0)
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

    pub(super) fn stable_known(&self, origin: NodeId, own: Option<&OutboundStream>) -> u64 {
        if origin == self.me {
            own.map_or(0, |s| s.stable_upto)
        } else {
            self.inbound.get(&origin).map_or(0, |s| s.stable_upto)
        }
    }

    /// This node's state for `origin` at `level`, into `st` (whose lists keep their storage);
    /// level-0 missing lists extend to `horizon`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn member_state(
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
            // Ring neighbours push only what lies within this node's NACK window (any, with
            // fixed pacing).
            let window = u64::try_from(stream.nack.window(config)).unwrap_or(u64::MAX);
            horizon = horizon.min(stream.delivered_upto.saturating_add(window));
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
    pub(super) fn known_origins(
        &self,
        level: usize,
        own: Option<&OutboundStream>,
        origins: &mut Vec<NodeId>,
    ) {
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

    pub(super) fn record_cap(config: &Config, records: usize) -> usize {
        let budget = config.max_datagram_bytes
            - tidings_wire::HEADER_LEN
            - 13
            - records * tidings_wire::RECORD_FIXED_LEN;
        let per_list = budget / records.max(1) / (3 * tidings_wire::RANGE_LEN);
        per_list.min(config.token_ranges_max)
    }

    /// Most records a token carries, so that each still has room for a couple of ranges per list.
    pub(super) fn records_max(config: &Config) -> usize {
        (config.max_datagram_bytes - tidings_wire::HEADER_LEN - 13)
            / (tidings_wire::RECORD_FIXED_LEN + 6 * tidings_wire::RANGE_LEN)
    }

    pub(super) fn release(
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
    pub(super) fn release_with(
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
    pub(super) fn pass_on(
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
    pub(super) fn check_handoffs(&mut self, now: Time, config: &Config, out: &mut Outbox) {
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
    pub(super) fn merge(
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
    pub(super) fn learn(
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

    pub(super) fn complete_round(
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
    pub(super) fn region_round(
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

    /// Where this node sends congestion alerts: the leader of the lowest ring it does not lead,
    /// or, for the region leader, the sender itself.
    pub(super) fn uca_parent(&self, origin: NodeId) -> NodeId {
        self.rings
            .iter()
            .find(|r| r.pos != 0)
            .map_or(origin, |r| r.members[0])
    }
}
