//! The timers' work, step by step (`Node::handle_timeout`), and the scheduling of the ring and
//! stream deadlines.

use std::cmp::Reverse;

use tidings_wire::RegionId;

use crate::gauges::GaugeShare;
use crate::outbox::Control;
use crate::policy::CongestionPolicy;
use crate::time::Time;
use crate::timers::{schedule_region, schedule_stream, silence_deadline};

use super::Node;

impl Node {
    /// The ring timers that are due: each region's token releases, round and hand-off
    /// timeouts, with its gauges and next deadline.
    pub(super) fn run_ring_timers(&mut self, now: Time) {
        // The ring timers that are due, taken out first so that a timer rescheduled at or
        // before `now` waits for the next call instead of looping here.
        let mut due = std::mem::take(&mut self.timers.due_regions);
        while let Some(&Reverse((at, region))) = self.timers.regions.peek() {
            if at > now {
                break;
            }
            self.timers.regions.pop();
            if let Some(state) = self.regions.get_mut(&region) {
                // Only the entry of the region's current deadline; older ones are skipped.
                if state.timer_at == Some(at) {
                    state.timer_at = None;
                    due.push(region);
                }
            }
        }
        for &region_id in &due {
            // One look-up of the region and of its stream serves the timeout, the gauges and
            // the next timer (a node in 100,000 regions has as many entries in each map).
            let mut outbound = self.outbound.get_mut(&region_id);
            let share = match self.regions.get_mut(&region_id) {
                Some(region) => {
                    region.on_timeout(now, outbound.as_deref_mut(), &self.config, &mut self.out);
                    schedule_region(&mut self.timers.regions, region_id, region, &self.config);
                    self.receiving |= !region.inbound.is_empty();
                    GaugeShare::from_parts(outbound.as_deref(), Some(region), &self.config)
                }
                None => GaugeShare::from_parts(outbound.as_deref(), None, &self.config),
            };
            self.set_gauge_share(region_id, share);
        }
        due.clear();
        self.timers.due_regions = due;
    }

    /// PDCC: a congestion query (DCQ) into every region this node sends to.
    pub(super) fn query_congestion(&mut self, now: Time) {
        let seq = self.congestion.on_query_timer(now, &self.config);
        for (&region, stream) in &self.outbound {
            self.out.stats.dcqs_sent += 1;
            self.out.control.push_back(Control::Dcq {
                region,
                view: stream.view,
                seq,
                position_us: now.as_micros(),
            });
        }
        self.out.stats.publish_rate_milli_current =
            self.congestion.rate().map_or(0, |r| (r * 1000.0) as u64);
    }

    /// Samples the doubt horizon rates of the regions that receive; the regions whose NACK
    /// windows may have moved go into `scanned` (their gauges are refreshed).
    pub(super) fn sample_doubt_horizons(&mut self, now: Time, scanned: &mut Vec<RegionId>) {
        // Sampled only for their readers (`Config::reads_doubt_horizons`): without them the
        // samples were a pass over every inbound stream ten times a second for nothing, a fifth
        // of a core at rest in a node with 100,000 regions that had traffic, and their deadline
        // woke a node at rest as often (ADR 28).
        self.timers.doubt_sample_at = now + self.config.doubt_sample_interval;
        let queue_delay_history = self.config.pdcc_queue_delay_history_samples();
        for (&id, region) in &mut self.regions {
            if region.inbound.is_empty() {
                continue;
            }
            // Only a sample that moved a stream's rate can move the region's gauges (its
            // NACK windows); refreshing the others was most of the core thread's time in a
            // node in 100,000 regions, ten times a second.
            if region.sample_doubt_rates(now, self.config.doubt_rate_alpha, queue_delay_history) {
                scanned.push(id);
            }
        }
    }

    /// The repair scan: adjusts the NACK windows of the regions with gaps (and of those whose
    /// gaps just closed) and requests their repairs; the regions visited go into `scanned`.
    pub(super) fn scan_repairs(&mut self, now: Time, scanned: &mut Vec<RegionId>) {
        self.timers.repair_scan_at = now + self.config.repair_interval;
        // In region order, as a pass over every region would visit them (the random
        // choices of the requests come in the same order).
        let regions = &mut self.regions;
        let (config, rng, out) = (&self.config, &mut self.rng, &mut self.out);
        self.timers.repair_scan_regions.retain(|&id| {
            let Some(region) = regions.get_mut(&id) else {
                return false;
            };
            if !region.inbound.is_empty() {
                region.adjust_nack_windows(now, config);
                region.request_repairs(now, config, rng, out);
                scanned.push(id);
            }
            // Kept while it has gaps (its share is refreshed below: ask the streams).
            region.inbound.values().any(|s| s.missing_count() > 0)
        });
    }

    /// The outbound streams whose silence or pause is due: silences are queued, pauses end.
    pub(super) fn run_stream_timers(&mut self, now: Time) {
        while let Some(&Reverse((at, region, generation))) = self.timers.streams.peek() {
            if at > now {
                break;
            }
            self.timers.streams.pop();
            let Some(stream) = self.outbound.get_mut(&region) else {
                continue;
            };
            if stream.timer_generation != generation {
                // Replaced by an earlier entry of the same stream.
                continue;
            }
            stream.timer_at = None;
            if stream.paused_until != Time::ZERO && now >= stream.paused_until {
                stream.paused_until = Time::ZERO;
            }
            if let Some(deadline) = silence_deadline(stream, &self.config) {
                if now >= deadline {
                    self.send_queue.queue_silence(region, stream);
                    stream.last_send = now;
                    stream.release_storage_at_rest(now, &self.config);
                }
            }
            schedule_stream(&mut self.timers.streams, region, stream, &self.config);
        }
    }

    /// Enters `region`'s next ring deadline in the timer queue if it moved.
    pub(super) fn schedule_region_timer(&mut self, region: RegionId) {
        if let Some(state) = self.regions.get_mut(&region) {
            schedule_region(&mut self.timers.regions, region, state, &self.config);
        }
    }

    /// After a publish into or a send from `region`'s stream: its gauges, and its silence
    /// deadline, which may now come before the streams' timer. The stream's publishes are
    /// refreshed (`published_unrefreshed`).
    pub(super) fn stream_changed(&mut self, region: RegionId) {
        let Some(stream) = self.outbound.get_mut(&region) else {
            return self.refresh_gauges(region);
        };
        stream.published_unrefreshed = false;
        schedule_stream(&mut self.timers.streams, region, stream, &self.config);
        // The inbound part of the region's share is kept as last computed (every change to it
        // refreshes it), so the outbound part is set alone.
        if !self
            .gauges
            .set_outbound(region, stream, &self.config, &mut self.out.stats)
        {
            return self.refresh_gauges(region);
        }
        // The inbound part kept must be what a full pass finds (checked in debug builds, so
        // by every simulator test).
        debug_assert_eq!(
            self.gauges.share(region),
            Some(GaugeShare::of(
                region,
                &self.outbound,
                &self.regions,
                &self.config
            ))
        );
    }

    /// Enters every outbound stream's deadline afresh and recounts the pending silences (a
    /// new membership: streams were replaced, re-homed or paused).
    pub(super) fn reset_stream_timer(&mut self) {
        self.timers.streams.clear();
        for (&region, stream) in &mut self.outbound {
            stream.timer_at = None;
            schedule_stream(&mut self.timers.streams, region, stream, &self.config);
        }
        self.send_queue.recount_silences(&self.outbound);
    }

    /// Rebuilds the timer queue from every region (a new node, a new membership).
    pub(super) fn schedule_all_region_timers(&mut self) {
        self.timers.regions.clear();
        for (&region, state) in &mut self.regions {
            state.timer_at = state.next_deadline(&self.config);
            if let Some(at) = state.timer_at {
                self.timers.regions.push(Reverse((at, region)));
            }
        }
    }
}
