//! The node-wide gauges of [`crate::Stats`] (messages unstable, held and cached now, the
//! smallest NACK window), kept per region so that a change confined to one region updates the
//! totals by difference: the cost of a message does not grow with the number of regions the
//! node is in.
//!
//! Invariants (checked after every timeout in debug builds, so by every simulator test): every
//! region the node sends to or receives in has exactly one share, equal to what a whole
//! recomputation finds; each total is the sum of the shares; `regions_with_gaps` counts the
//! shares with gaps; `nack_windows` counts the shares by their smallest NACK window.

use std::collections::{BTreeMap, BTreeSet};

use tidings_wire::RegionId;

use crate::config::Config;
use crate::region::RegionState;
use crate::send::OutboundStream;
use crate::stats::Stats;

/// One region's part in the node-wide gauges: this node's outbound stream into it and the caches
/// of its inbound streams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GaugeShare {
    unstable_msgs: u64,
    unstable_bytes: u64,
    held_msgs: u64,
    held_bytes: u64,
    cached_msgs: u64,
    nack_window_min: Option<usize>,
    /// Some inbound stream of the region has gaps to repair.
    has_gaps: bool,
}

impl GaugeShare {
    /// The share of `region`, from the node's streams and region states.
    pub(crate) fn of(
        region: RegionId,
        outbound: &BTreeMap<RegionId, OutboundStream>,
        regions: &BTreeMap<RegionId, RegionState>,
        config: &Config,
    ) -> GaugeShare {
        GaugeShare::from_parts(outbound.get(&region), regions.get(&region), config)
    }

    /// [`GaugeShare::of`] from the region's stream and state, already looked up.
    pub(crate) fn from_parts(
        outbound: Option<&OutboundStream>,
        region: Option<&RegionState>,
        config: &Config,
    ) -> GaugeShare {
        let mut share = GaugeShare::default();
        share.set_outbound(outbound, config);
        if let Some(r) = region {
            // One pass over the inbound streams (this runs after every datagram).
            for s in r.inbound.values() {
                share.cached_msgs += s.cache_len() as u64;
                let gauge = s.nack.gauge(config);
                share.nack_window_min = Some(share.nack_window_min.map_or(gauge, |m| m.min(gauge)));
                share.has_gaps |= s.missing_count() > 0;
            }
        }
        share
    }

    /// Sets the outbound part (this node's stream into the region, if any).
    pub(crate) fn set_outbound(&mut self, stream: Option<&OutboundStream>, config: &Config) {
        let Some(stream) = stream else {
            (self.unstable_msgs, self.unstable_bytes) = (0, 0);
            (self.held_msgs, self.held_bytes) = (0, 0);
            return;
        };
        debug_assert!(stream.unstable_msgs() as usize <= config.window.msgs_max);
        debug_assert!(stream.stable_upto <= stream.sent_upto);
        self.unstable_msgs = stream.unstable_msgs();
        self.unstable_bytes = stream.unstable_bytes() as u64;
        self.held_msgs = stream.unstable_msgs() + stream.unsent_msgs();
        self.held_bytes = stream.held_bytes() as u64;
    }
}

/// Each region's share of the gauges and the indices that keep the totals current without a
/// pass over every region.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// Each region's part, as last computed.
    shares: BTreeMap<RegionId, GaugeShare>,
    /// How many regions have each smallest NACK window: the gauge's minimum is the first key.
    /// A pass over every region for each change was quadratic for a node in thousands of
    /// regions whose repair scan adjusts their windows.
    nack_windows: BTreeMap<usize, usize>,
    /// Regions whose share has gaps to repair, so that `poll_timeout` need not look.
    regions_with_gaps: usize,
}

impl Gauges {
    /// How many regions have gaps to repair.
    pub(crate) fn regions_with_gaps(&self) -> usize {
        self.regions_with_gaps
    }

    /// `region`'s part as last computed.
    pub(crate) fn share(&self, region: RegionId) -> Option<GaugeShare> {
        self.shares.get(&region).copied()
    }

    /// Recomputes every share from every stream (a new node), and the totals from the shares.
    /// Every region with gaps goes into `repair_scan`.
    pub(crate) fn recompute(
        &mut self,
        outbound: &BTreeMap<RegionId, OutboundStream>,
        regions: &BTreeMap<RegionId, RegionState>,
        config: &Config,
        repair_scan: &mut BTreeSet<RegionId>,
        s: &mut Stats,
    ) {
        self.shares
            .retain(|r, _| outbound.contains_key(r) || regions.contains_key(r));
        for &region in outbound.keys().chain(regions.keys()) {
            let share = GaugeShare::of(region, outbound, regions, config);
            // An existing key is overwritten in place: no allocation in steady state.
            self.shares.insert(region, share);
        }
        let (mut unstable, mut held_msgs, mut held_bytes, mut cached) = (0, 0, 0, 0);
        self.regions_with_gaps = self.shares.values().filter(|s| s.has_gaps).count();
        for (&region, share) in &self.shares {
            if share.has_gaps {
                repair_scan.insert(region);
            }
        }
        for share in self.shares.values() {
            unstable += share.unstable_msgs;
            held_msgs += share.held_msgs;
            held_bytes += share.held_bytes;
            cached += share.cached_msgs;
            s.unstable_msgs_max = s.unstable_msgs_max.max(share.unstable_msgs);
            s.unstable_bytes_max = s.unstable_bytes_max.max(share.unstable_bytes);
        }
        s.unstable_msgs_current = unstable;
        s.held_msgs_current = held_msgs;
        s.held_bytes_current = held_bytes;
        s.held_bytes_max = s.held_bytes_max.max(held_bytes);
        s.cache_msgs_current = cached;
        s.cache_msgs_max = s.cache_msgs_max.max(cached);
        self.nack_windows.clear();
        for window in self.shares.values().filter_map(|g| g.nack_window_min) {
            *self.nack_windows.entry(window).or_default() += 1;
        }
        s.nack_window_msgs_current = self.nack_windows.keys().next().map_or(0, |&w| w as u64);
    }

    /// Takes `region`'s part out of the gauges (the node neither sends nor receives there now).
    pub(crate) fn forget(&mut self, region: RegionId, s: &mut Stats) {
        if self.shares.contains_key(&region) {
            self.set(region, GaugeShare::default(), s);
            self.shares.remove(&region);
        }
    }

    /// Sets the outbound part of `region`'s share from `stream` and updates the totals by
    /// difference, with one look-up; the inbound part is kept as last computed. False (and
    /// nothing changed) if the region has no share yet.
    pub(crate) fn set_outbound(
        &mut self,
        region: RegionId,
        stream: &OutboundStream,
        config: &Config,
        s: &mut Stats,
    ) -> bool {
        let Some(slot) = self.shares.get_mut(&region) else {
            return false;
        };
        let old = *slot;
        slot.set_outbound(Some(stream), config);
        let share = *slot;
        if old != share {
            // The inbound part did not move: no region gains gaps.
            self.apply(old, share, s);
        }
        true
    }

    /// Puts `share` in place of `region`'s part and updates the totals by difference. True if
    /// the region has gaps now and had none before (the repair scan must visit it).
    pub(crate) fn set(&mut self, region: RegionId, share: GaugeShare, s: &mut Stats) -> bool {
        // One look-up. A region seen for the first time (rare: membership changes refresh
        // everything) starts from an empty part, which adds nothing to the totals.
        let slot = self.shares.entry(region).or_default();
        let old = *slot;
        if old == share {
            return false;
        }
        *slot = share;
        self.apply(old, share, s);
        share.has_gaps && !old.has_gaps
    }

    /// The totals and indices, after a region's part went from `old` to `share`.
    fn apply(&mut self, old: GaugeShare, share: GaugeShare, s: &mut Stats) {
        self.regions_with_gaps =
            self.regions_with_gaps + usize::from(share.has_gaps) - usize::from(old.has_gaps);
        // Each total includes the region's old part, so none of these can go below zero.
        s.unstable_msgs_current = s.unstable_msgs_current + share.unstable_msgs - old.unstable_msgs;
        s.held_msgs_current = s.held_msgs_current + share.held_msgs - old.held_msgs;
        s.held_bytes_current = s.held_bytes_current + share.held_bytes - old.held_bytes;
        s.cache_msgs_current = s.cache_msgs_current + share.cached_msgs - old.cached_msgs;
        s.unstable_msgs_max = s.unstable_msgs_max.max(share.unstable_msgs);
        s.unstable_bytes_max = s.unstable_bytes_max.max(share.unstable_bytes);
        s.held_bytes_max = s.held_bytes_max.max(s.held_bytes_current);
        s.cache_msgs_max = s.cache_msgs_max.max(s.cache_msgs_current);
        if share.nack_window_min != old.nack_window_min {
            // The new count first: the map never empties on the way, so its root stays
            // allocated (no allocation per change in steady state).
            if let Some(new) = share.nack_window_min {
                *self.nack_windows.entry(new).or_default() += 1;
            }
            if let Some(old) = old.nack_window_min {
                if let Some(count) = self.nack_windows.get_mut(&old) {
                    *count -= 1;
                    if *count == 0 {
                        self.nack_windows.remove(&old);
                    }
                }
            }
            s.nack_window_msgs_current = self.nack_windows.keys().next().map_or(0, |&w| w as u64);
        }
    }

    /// Debug builds: every region's share is current, the totals are their sums, and every
    /// region with gaps is in `repair_scan`.
    #[cfg(debug_assertions)]
    pub(crate) fn check(
        &self,
        outbound: &BTreeMap<RegionId, OutboundStream>,
        regions: &BTreeMap<RegionId, RegionState>,
        config: &Config,
        repair_scan: &BTreeSet<RegionId>,
        s: &Stats,
    ) {
        // Without allocating (the steady-state allocation test runs debug builds): the same keys.
        for region in self.shares.keys() {
            assert!(
                outbound.contains_key(region) || regions.contains_key(region),
                "gauge share of region {region:?}, which the node is not in"
            );
        }
        for region in outbound.keys().chain(regions.keys()) {
            assert!(
                self.shares.contains_key(region),
                "no gauge share of region {region:?}"
            );
        }
        for (&region, share) in &self.shares {
            assert_eq!(
                *share,
                GaugeShare::of(region, outbound, regions, config),
                "stale gauge share of region {region:?}"
            );
        }
        for (region, share) in &self.shares {
            assert!(
                !share.has_gaps || repair_scan.contains(region),
                "region {region:?} has gaps the repair scan would not visit"
            );
        }
        let sum = |f: fn(&GaugeShare) -> u64| self.shares.values().map(f).sum::<u64>();
        assert_eq!(s.unstable_msgs_current, sum(|g| g.unstable_msgs));
        assert_eq!(s.held_msgs_current, sum(|g| g.held_msgs));
        assert_eq!(s.held_bytes_current, sum(|g| g.held_bytes));
        assert_eq!(s.cache_msgs_current, sum(|g| g.cached_msgs));
        assert_eq!(
            self.regions_with_gaps,
            self.shares.values().filter(|g| g.has_gaps).count()
        );
        let window_min = self
            .shares
            .values()
            .filter_map(|g| g.nack_window_min)
            .min()
            .unwrap_or(0) as u64;
        assert_eq!(s.nack_window_msgs_current, window_min);
        assert_eq!(
            self.nack_windows.values().sum::<usize>(),
            self.shares
                .values()
                .filter(|g| g.nack_window_min.is_some())
                .count()
        );
    }
}
