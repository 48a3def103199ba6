//! The protocol's policies as traits: congestion control, the flow window and recovery pacing.
//! The core calls these traits; [`Config`]'s policy enums ([`CongestionControl`],
//! [`WindowAlgorithm`], [`RecoveryPacing`]) choose the implementation, dispatched statically by
//! a `match` (ADR 38). A new policy is an implementation of its trait and a variant of its enum.

use std::time::Duration;

use crate::config::{Config, CongestionControl, RecoveryPacing, WindowAlgorithm};
use crate::pdcc::RateController;
use crate::recv::Retry;
use crate::region::RegionState;
use crate::sdcc::{NackWindow, Sdcc};
use crate::time::Time;

/// A sender's congestion control: whether a message may be published now, and the congestion
/// queries it sends and the feedback it takes.
pub(crate) trait CongestionPolicy {
    /// Admission of one message at `now`: `Err(retry_at)` if the policy does not allow it yet.
    fn admit(&mut self, now: Time, config: &Config) -> Result<(), Time>;
    /// When the next congestion query is due; `None` if the policy sends none.
    fn next_query(&self) -> Option<Time>;
    /// Time for a congestion query: returns its sequence number.
    fn on_query_timer(&mut self, now: Time, config: &Config) -> u64;
    /// Feedback answering query `seq` reached the sender: `value` is the least rate reported.
    fn on_feedback(&mut self, now: Time, seq: u64, value: f64, config: &Config);
    /// The publish rate in force (messages per second), if throttled.
    fn rate(&self) -> Option<f64>;
}

/// No congestion control: every message is admitted, no query is sent, feedback is ignored.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NoCongestionControl;

impl CongestionPolicy for NoCongestionControl {
    fn admit(&mut self, _now: Time, _config: &Config) -> Result<(), Time> {
        Ok(())
    }

    fn next_query(&self) -> Option<Time> {
        None
    }

    fn on_query_timer(&mut self, _now: Time, _config: &Config) -> u64 {
        0
    }

    fn on_feedback(&mut self, _now: Time, _seq: u64, _value: f64, _config: &Config) {}

    fn rate(&self) -> Option<f64> {
        None
    }
}

/// The congestion control of a node, as [`CongestionConfig::control`](crate::CongestionConfig)
/// chooses it.
#[derive(Clone, Debug)]
pub(crate) enum Congestion {
    /// [`CongestionControl::None`].
    None(NoCongestionControl),
    /// [`CongestionControl::Pdcc`]: Gryphon's publish rate (`pdcc::RateController`).
    Pdcc(RateController),
}

impl Congestion {
    /// The policy `config` chooses, starting at `now`.
    pub(crate) fn new(now: Time, config: &Config) -> Congestion {
        match config.congestion.control {
            CongestionControl::None => Congestion::None(NoCongestionControl),
            CongestionControl::Pdcc => Congestion::Pdcc(RateController::new(now, config)),
        }
    }
}

impl CongestionPolicy for Congestion {
    fn admit(&mut self, now: Time, config: &Config) -> Result<(), Time> {
        match self {
            Congestion::None(p) => p.admit(now, config),
            Congestion::Pdcc(p) => p.admit(now, config),
        }
    }

    fn next_query(&self) -> Option<Time> {
        match self {
            Congestion::None(p) => p.next_query(),
            Congestion::Pdcc(p) => p.next_query(),
        }
    }

    fn on_query_timer(&mut self, now: Time, config: &Config) -> u64 {
        match self {
            Congestion::None(p) => p.on_query_timer(now, config),
            Congestion::Pdcc(p) => p.on_query_timer(now, config),
        }
    }

    fn on_feedback(&mut self, now: Time, seq: u64, value: f64, config: &Config) {
        match self {
            Congestion::None(p) => p.on_feedback(now, seq, value, config),
            Congestion::Pdcc(p) => p.on_feedback(now, seq, value, config),
        }
    }

    fn rate(&self) -> Option<f64> {
        match self {
            Congestion::None(p) => p.rate(),
            Congestion::Pdcc(p) => p.rate(),
        }
    }
}

impl CongestionControl {
    /// Whether the policy reads the receivers' doubt horizons (PDCC's alerts do).
    pub(crate) fn reads_doubt_horizons(self) -> bool {
        match self {
            CongestionControl::None => false,
            CongestionControl::Pdcc => true,
        }
    }
}

/// Horus' credit window: how many unstable messages of other senders count against a sender's
/// window in a region (its own always count, in `OutboundStream::can_send`).
pub(crate) trait FlowWindow {
    /// Unstable messages of the region's other senders that count against this node's window.
    fn others_unstable(&self, region: Option<&RegionState>) -> u64;
}

/// Horus' local window: a sender's own unstable messages alone.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LocalWindow;

impl FlowWindow for LocalWindow {
    fn others_unstable(&self, _region: Option<&RegionState>) -> u64 {
        0
    }
}

/// Horus' global window: the region's senders share one window, estimated from what this node
/// knows of the others ([`RegionState::others_unstable_estimate`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GlobalWindow;

impl FlowWindow for GlobalWindow {
    fn others_unstable(&self, region: Option<&RegionState>) -> u64 {
        region.map_or(0, RegionState::others_unstable_estimate)
    }
}

impl FlowWindow for WindowAlgorithm {
    #[inline]
    fn others_unstable(&self, region: Option<&RegionState>) -> u64 {
        match self {
            WindowAlgorithm::Local => LocalWindow.others_unstable(region),
            WindowAlgorithm::Global => GlobalWindow.others_unstable(region),
        }
    }
}

/// The pacing of a receiver's repair requests on one inbound stream, whose measurements
/// ([`NackWindow`]: the stream's rate, the smoothed repair time) the policy reads and adjusts.
pub(crate) trait RecoveryPolicy {
    /// Whether the policy reads the doubt horizons (the stream's rate in the sender's time).
    fn reads_doubt_horizons(&self) -> bool;
    /// How many messages after the last delivered one may be requested (`usize::MAX`: any).
    fn window(&self, nack: &NackWindow, config: &Config) -> usize;
    /// The window in messages as a gauge (bounded).
    fn gauge(&self, nack: &NackWindow, config: &Config) -> usize;
    /// How long to wait for a repair before asking again (before the doubling of later
    /// attempts).
    fn timeout(&self, nack: &NackWindow, config: &Config) -> Duration;
    /// When a request counts as unanswered.
    fn retry(&self, nack: &NackWindow, config: &Config) -> Retry;
    /// Called on every repair scan of the stream (`has_gaps`: it has some): adapts the window.
    fn adjust(&self, nack: &mut NackWindow, now: Time, has_gaps: bool, config: &Config);
}

/// A fixed NACK window: at most `recovery.inflight_max` requests in flight, each repeated after
/// `repair_timeout`; no window on what may be requested.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FixedPacing;

impl RecoveryPolicy for FixedPacing {
    fn reads_doubt_horizons(&self) -> bool {
        false
    }

    fn window(&self, _nack: &NackWindow, _config: &Config) -> usize {
        usize::MAX
    }

    fn gauge(&self, _nack: &NackWindow, config: &Config) -> usize {
        config.recovery.inflight_max
    }

    fn timeout(&self, _nack: &NackWindow, config: &Config) -> Duration {
        config.repair_timeout
    }

    fn retry(&self, nack: &NackWindow, config: &Config) -> Retry {
        Retry {
            timeout: self.timeout(nack, config),
            reorder: None,
            probe_after_min: None,
        }
    }

    fn adjust(&self, _nack: &mut NackWindow, _now: Time, _has_gaps: bool, _config: &Config) {}
}

impl RecoveryPolicy for RecoveryPacing {
    #[inline]
    fn reads_doubt_horizons(&self) -> bool {
        match self {
            RecoveryPacing::Fixed => FixedPacing.reads_doubt_horizons(),
            RecoveryPacing::Sdcc => Sdcc.reads_doubt_horizons(),
        }
    }

    #[inline]
    fn window(&self, nack: &NackWindow, config: &Config) -> usize {
        match self {
            RecoveryPacing::Fixed => FixedPacing.window(nack, config),
            RecoveryPacing::Sdcc => Sdcc.window(nack, config),
        }
    }

    #[inline]
    fn gauge(&self, nack: &NackWindow, config: &Config) -> usize {
        match self {
            RecoveryPacing::Fixed => FixedPacing.gauge(nack, config),
            RecoveryPacing::Sdcc => Sdcc.gauge(nack, config),
        }
    }

    #[inline]
    fn timeout(&self, nack: &NackWindow, config: &Config) -> Duration {
        match self {
            RecoveryPacing::Fixed => FixedPacing.timeout(nack, config),
            RecoveryPacing::Sdcc => Sdcc.timeout(nack, config),
        }
    }

    #[inline]
    fn retry(&self, nack: &NackWindow, config: &Config) -> Retry {
        match self {
            RecoveryPacing::Fixed => FixedPacing.retry(nack, config),
            RecoveryPacing::Sdcc => Sdcc.retry(nack, config),
        }
    }

    #[inline]
    fn adjust(&self, nack: &mut NackWindow, now: Time, has_gaps: bool, config: &Config) {
        match self {
            RecoveryPacing::Fixed => FixedPacing.adjust(nack, now, has_gaps, config),
            RecoveryPacing::Sdcc => Sdcc.adjust(nack, now, has_gaps, config),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::RegionView;
    use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

    fn ms(m: u64) -> Time {
        Time::ZERO + Duration::from_millis(m)
    }

    fn pdcc() -> Config {
        let mut c = Config::default();
        c.congestion.control = CongestionControl::Pdcc;
        c
    }

    #[test]
    fn no_congestion_control_admits_everything_and_never_queries() {
        let c = Config::default();
        let mut p = Congestion::new(ms(0), &c);
        assert!(matches!(p, Congestion::None(_)));
        assert!(!c.reads_doubt_horizons());
        // Feedback that would halve PDCC's rate changes nothing.
        p.on_feedback(ms(10), 1, 0.0, &c);
        for t in 0..10_000 {
            assert_eq!(p.admit(ms(t / 100), &c), Ok(()));
        }
        assert_eq!((p.next_query(), p.rate()), (None, None));
    }

    #[test]
    fn pdcc_queries_on_its_interval_and_throttles_after_an_alert() {
        let c = pdcc();
        assert!(c.reads_doubt_horizons());
        let mut p = Congestion::new(ms(0), &c);
        assert_eq!(p.next_query(), Some(ms(1000)));
        // Unthrottled until the first alert: 100 messages in the first second.
        for t in 0..100 {
            assert_eq!(p.admit(ms(t * 10), &c), Ok(()));
        }
        assert_eq!(p.on_query_timer(ms(1000), &c), 1);
        assert_eq!(p.next_query(), Some(ms(2000)));
        // An alert answering query 1 halves the measured rate (eq. 3): 50 messages/s.
        p.on_feedback(ms(1010), 1, 0.5, &c);
        assert_eq!(p.rate(), Some(50.0));
        // The bucket holds a burst of 50 ms at the rate (2.5 messages); then a message waits
        // for its token, 10 ms for the half token left.
        assert_eq!(p.admit(ms(1010), &c), Ok(()));
        assert_eq!(p.admit(ms(1010), &c), Ok(()));
        let retry_at = p.admit(ms(1010), &c).unwrap_err();
        assert!((ms(1019)..=ms(1020)).contains(&retry_at), "{retry_at:?}");
        assert_eq!(p.admit(ms(1020), &c), Ok(()));
    }

    fn region(config: &Config) -> RegionState {
        let members: Vec<NodeId> = (0..3).map(NodeId).collect();
        let view = RegionView {
            region: RegionId(1),
            view: ViewId(1),
            base: ViewId(1),
            topics: vec![TopicId(1)],
            partitions: RegionView::partitioned(&members, 5),
        };
        RegionState::new(&view, NodeId(2), config, Time::ZERO).unwrap()
    }

    #[test]
    fn the_local_window_ignores_other_senders_and_the_global_one_counts_them() {
        let c = Config::default();
        let mut st = region(&c);
        // Sender 0 has 30 messages this node knows of, 10 of them stable.
        let stream = st.stream_mut(NodeId(0), &c).unwrap();
        stream.note_exists(ms(0), 30, c.receive_window_msgs);
        stream.set_stable(10);
        assert_eq!(WindowAlgorithm::Local.others_unstable(Some(&st)), 0);
        assert_eq!(WindowAlgorithm::Global.others_unstable(Some(&st)), 20);
        assert_eq!(WindowAlgorithm::Global.others_unstable(None), 0);
    }

    #[test]
    fn fixed_pacing_requests_anything_within_the_inflight_bound() {
        let c = Config::default();
        let mut nack = NackWindow::default();
        nack.on_progress(1000, Duration::from_secs(1));
        nack.on_repair(Duration::from_secs(1));
        let p = RecoveryPacing::Fixed;
        for t in 0..10 {
            p.adjust(&mut nack, ms(t * 100), true, &c);
        }
        assert!(!p.reads_doubt_horizons());
        assert_eq!(p.window(&nack, &c), usize::MAX);
        assert_eq!(p.gauge(&nack, &c), c.recovery.inflight_max);
        assert_eq!(p.timeout(&nack, &c), c.repair_timeout);
        assert_eq!(p.retry(&nack, &c), Retry::after(c.repair_timeout));
    }

    #[test]
    fn sdcc_pacing_opens_its_window_while_repairs_keep_pace() {
        let mut c = Config::default();
        c.recovery.pacing = RecoveryPacing::Sdcc;
        assert!(c.reads_doubt_horizons());
        let p = c.recovery.pacing;
        let mut nack = NackWindow::default();
        nack.on_progress(1000, Duration::from_secs(1));
        // nwnd_0 = 100 ms of the sender's time at 1000 messages/s.
        assert_eq!(p.window(&nack, &c), 100);
        nack.on_repair(Duration::from_millis(10));
        // One step of size_NACK per smoothed repair time, not sooner.
        p.adjust(&mut nack, ms(0), true, &c);
        p.adjust(&mut nack, ms(5), true, &c);
        assert_eq!(p.window(&nack, &c), 200);
        p.adjust(&mut nack, ms(10), true, &c);
        assert_eq!(p.window(&nack, &c), 300);
        assert_eq!(p.gauge(&nack, &c), 300);
        assert_eq!(p.timeout(&nack, &c), c.repair_timeout);
    }
}
