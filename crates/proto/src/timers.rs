//! Why and when a node wakes: the [`Timer`] kinds, and the queues that find the next deadline
//! without a pass over every region or stream (a node may be in 100,000 regions).
//!
//! Invariants: each region state's `timer_at` is its ring deadline as entered in `regions` (an
//! entry that differs from it is stale and skipped); each outbound stream with a deadline has
//! one live entry in `streams` at or before it (`timer_at`, `timer_generation`); every region
//! whose gauge share has gaps is in `repair_scan_regions`.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use tidings_wire::RegionId;

use crate::config::Config;
use crate::region::RegionState;
use crate::send::OutboundStream;
use crate::time::Time;

/// What a [`crate::Node::poll_timeout`] deadline is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// A region's token ring: a hand-off to resend, a token round to start or to time out, a
    /// ring waking from sleep.
    Region,
    /// The scan of the regions with gaps for repairs to request.
    RepairScan,
    /// An outbound stream's silence heartbeat or its pause after a view change.
    Stream,
    /// Congestion control's next query down the rings (DCQ).
    CongestionQuery,
    /// Congestion control allows a refused publish again.
    RateRetry,
    /// The next sample of the receive streams' doubt horizons.
    DoubtSample,
}

/// The node's deadlines, by the [`Timer`] they serve.
#[derive(Debug)]
pub(crate) struct Timers {
    /// The regions' ring timers (token releases, round and hand-off timeouts), earliest first, so
    /// that a timer costs the same whatever the number of regions. An entry is current while it
    /// equals its region's `timer_at`; a moved deadline adds an entry and the old one is skipped.
    pub(crate) regions: BinaryHeap<Reverse<(Time, RegionId)>>,
    /// Scratch list of the regions whose timers are due (kept to reuse its buffer).
    pub(crate) due_regions: Vec<RegionId>,
    /// The outbound streams' silence and pause deadlines: `(deadline, region, generation)`,
    /// earliest first. Each stream with a deadline has one live entry at or before it (its
    /// `timer_at` and `timer_generation`); an entry of an older generation is skipped. Sends
    /// move a deadline later, which leaves the entry early (it is re-entered when it comes up);
    /// only a deadline that moves earlier adds an entry. `handle_timeout` thus visits the
    /// streams that are due, not every stream of a node that publishes on thousands of topics.
    pub(crate) streams: BinaryHeap<Reverse<(Time, RegionId, u64)>>,
    /// When the repair scan runs next.
    pub(crate) repair_scan_at: Time,
    /// The regions the repair scan visits: every region whose gauge share has gaps, and those
    /// whose gaps closed since the last scan (it visits them once more: the NACK window of a
    /// stream that stopped recovering forgets its last recovery rate). A region without gaps
    /// gives the scan nothing else to do, so a node in thousands of regions pays the scan for
    /// the few that are recovering, not for all of them every repair interval.
    pub(crate) repair_scan_regions: BTreeSet<RegionId>,
    /// When the doubt horizon rates are sampled next.
    pub(crate) doubt_sample_at: Time,
    /// After a publish refused by the rate: when to wake the application to try again.
    pub(crate) rate_retry_at: Option<Time>,
}

impl Timers {
    /// No deadline yet; the periodic ones start at `now`.
    pub(crate) fn new(now: Time) -> Timers {
        Timers {
            regions: BinaryHeap::new(),
            due_regions: Vec::new(),
            streams: BinaryHeap::new(),
            repair_scan_at: now,
            repair_scan_regions: BTreeSet::new(),
            doubt_sample_at: now,
            rate_retry_at: None,
        }
    }
}

/// Enters `state`'s next ring deadline in `timers` (`Timers::regions`) if it moved.
pub(crate) fn schedule_region(
    timers: &mut BinaryHeap<Reverse<(Time, RegionId)>>,
    region: RegionId,
    state: &mut RegionState,
    config: &Config,
) {
    let deadline = state.next_deadline(config);
    if deadline != state.timer_at {
        state.timer_at = deadline;
        if let Some(at) = deadline {
            timers.push(Reverse((at, region)));
        }
    }
}

/// Enters `stream`'s silence or pause deadline in `timers` (`Timers::streams`) if it has
/// none or it comes before the stream's live entry.
pub(crate) fn schedule_stream(
    timers: &mut BinaryHeap<Reverse<(Time, RegionId, u64)>>,
    region: RegionId,
    stream: &mut OutboundStream,
    config: &Config,
) {
    let Some(at) = stream_deadline(stream, config) else {
        return;
    };
    if stream.timer_at.is_none_or(|t| at < t) {
        stream.timer_generation += 1;
        stream.timer_at = Some(at);
        timers.push(Reverse((at, region, stream.timer_generation)));
    }
}

/// When `stream`'s silence or pause may be due next.
pub(crate) fn stream_deadline(stream: &OutboundStream, config: &Config) -> Option<Time> {
    let pause = (stream.paused_until != Time::ZERO).then_some(stream.paused_until);
    silence_deadline(stream, config)
        .into_iter()
        .chain(pause)
        .min()
}

/// When `stream` owes its next silence heartbeat: `silence_interval` while it has messages in
/// flight, `silence_idle_interval` when all is stable, backed off exponentially (with
/// `silence_backoff`) since its last data.
pub(crate) fn silence_deadline(stream: &OutboundStream, config: &Config) -> Option<Time> {
    if stream.sent_upto == 0 || stream.silence_pending {
        return None;
    }
    let backoff = config.silence_backoff && !config.reads_doubt_horizons();
    // The n-th silence since the last data waits 2^n intervals.
    let backed_off = || {
        config
            .silence_interval
            .saturating_mul(1 << stream.silences_since_data.min(16))
    };
    let interval = if stream.unstable_msgs() > 0 || stream.sent_upto < stream.last_seq() {
        if backoff {
            // Up to the idle interval.
            backed_off().min(config.silence_idle_interval.max(config.silence_interval))
        } else {
            config.silence_interval
        }
    } else if backoff {
        // Fully stable: from the idle interval on, up to its maximum.
        backed_off().clamp(
            config.silence_idle_interval,
            config
                .silence_idle_interval_max
                .max(config.silence_idle_interval),
        )
    } else {
        config.silence_idle_interval
    };
    Some(stream.last_send + interval)
}
