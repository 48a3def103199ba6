//! Gryphon's SHB-driven congestion control (paper 002, section 3.2): a receiver bounds what it
//! asks to have repaired by a NACK window, a span of the stream starting at its doubt horizon,
//! inside its receive window. While it repairs, the window opens and closes additively, like TCP
//! Vegas, on the recovery rate of equation 9, `r = nwnd / RTT`, where RTT is the smoothed time a
//! request takes to be answered: up by `size_NACK` when `r` grew by at least `alpha_NACK` since
//! the last RTT, down by `size_NACK` when it fell by at least `beta_NACK` (equation 10).
//!
//! Units: as in the paper, the window is a span of the sender's time (ticks); it is converted to
//! messages at the stream's rate (messages per second of sender time, measured as the doubt
//! horizon advances), because tidings' windows count messages.
//! `recovery.inflight_max` still bounds the requests in flight. [`Sdcc`] is the recovery policy
//! ([`RecoveryPolicy`]) of [`RecoveryPacing::Sdcc`](crate::RecoveryPacing::Sdcc); [`NackWindow`]
//! holds the measurements of one stream that every recovery policy reads.

use std::time::Duration;

use crate::config::Config;
use crate::policy::RecoveryPolicy;
use crate::recv::Retry;
use crate::time::Time;

/// The longest wait before a request is repeated, before the doubling of later attempts.
const REPAIR_TIMEOUT_MAX: Duration = Duration::from_secs(1);

/// The NACK window of one inbound stream.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NackWindow {
    /// The window in the sender's time; `None` until first adjusted (then `nwnd_0`).
    window: Option<Duration>,
    /// Messages per second of the sender's time, measured; `None` until known.
    msgs_per_sec: Option<f64>,
    /// Smoothed time from a gap's first request to its repair, microseconds.
    srtt_us: Option<f64>,
    /// The recovery rate (eq. 9) at the last adjustment, messages per second.
    rate_prev: Option<f64>,
    /// When the window was last adjusted.
    last_adjust: Option<Time>,
}

impl NackWindow {
    fn span(&self, config: &Config) -> Duration {
        self.window.unwrap_or(config.recovery.nack_window_initial)
    }

    fn msgs_in(&self, span: Duration, config: &Config) -> Option<usize> {
        let rate = self.msgs_per_sec?;
        let msgs = (span.as_secs_f64() * rate).ceil();
        Some((msgs as usize).clamp(1, config.receive_window_msgs))
    }

    /// How many messages after the last delivered one may be requested, by the recovery
    /// policy of `config` (`usize::MAX`: any).
    pub(crate) fn window(&self, config: &Config) -> usize {
        config.recovery.pacing.window(self, config)
    }

    /// The window in messages as a gauge, by the recovery policy of `config`.
    pub(crate) fn gauge(&self, config: &Config) -> usize {
        config.recovery.pacing.gauge(self, config)
    }

    /// When a request counts as unanswered, by the recovery policy of `config`.
    pub(crate) fn retry(&self, config: &Config) -> Retry {
        config.recovery.pacing.retry(self, config)
    }

    /// Once per repair scan of the stream: the recovery policy of `config` adapts the window.
    pub(crate) fn adjust(&mut self, now: Time, has_gaps: bool, config: &Config) {
        config.recovery.pacing.adjust(self, now, has_gaps, config);
    }

    fn srtt(&self) -> Option<Duration> {
        self.srtt_us.map(|us| Duration::from_micros(us as u64))
    }

    /// A requested gap was filled `rtt` after it was first requested (an answer to a repeated
    /// request counts from the first: the estimate errs long, which is the safe side).
    pub(crate) fn on_repair(&mut self, rtt: Duration) {
        let sample = rtt.as_micros() as f64;
        self.srtt_us = Some(match self.srtt_us {
            None => sample,
            Some(s) => 0.875 * s + 0.125 * sample,
        });
    }

    /// `msgs` messages were delivered while the doubt horizon advanced by `span` of the
    /// sender's time: the stream's rate, smoothed.
    ///
    /// True if the measured rate (and so the window) may have changed.
    pub(crate) fn on_progress(&mut self, msgs: u64, span: Duration) -> bool {
        if msgs == 0 || span.is_zero() {
            return false;
        }
        let rate = msgs as f64 / span.as_secs_f64();
        self.msgs_per_sec = Some(self.msgs_per_sec.map_or(rate, |r| 0.5 * r + 0.5 * rate));
        true
    }
}

/// Gryphon's SDCC as a recovery policy: the adaptive NACK window of equations 9 and 10.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sdcc;

impl RecoveryPolicy for Sdcc {
    fn reads_doubt_horizons(&self) -> bool {
        true
    }

    /// The adaptive window (any, until the stream's rate is known).
    fn window(&self, nack: &NackWindow, config: &Config) -> usize {
        nack.msgs_in(nack.span(config), config)
            .unwrap_or(usize::MAX)
    }

    /// The adaptive window, at most the receive window.
    fn gauge(&self, nack: &NackWindow, config: &Config) -> usize {
        self.window(nack, config).min(config.receive_window_msgs)
    }

    /// Twice the smoothed repair time, so that requests are not repeated while their answers
    /// still wait in a queue (at least `repair_timeout`, at most `REPAIR_TIMEOUT_MAX`, so a lost
    /// request is asked again soon); `repair_timeout` until a repair time is measured.
    fn timeout(&self, nack: &NackWindow, config: &Config) -> Duration {
        match nack.srtt_us {
            Some(srtt) => Duration::from_micros((2.0 * srtt) as u64).clamp(
                config.repair_timeout,
                REPAIR_TIMEOUT_MAX.max(config.repair_timeout),
            ),
            None => config.repair_timeout,
        }
    }

    /// [`timeout`](Self::timeout), a reordering window of a quarter of the smoothed repair time
    /// (RACK's takes a quarter of the least round trip), at least `repair_delay` (the reordering
    /// a new gap waits out), and the tail loss probe after a silence of at least
    /// `repair_timeout` (see [`Retry`]).
    fn retry(&self, nack: &NackWindow, config: &Config) -> Retry {
        Retry {
            timeout: self.timeout(nack, config),
            reorder: nack.srtt().map(|srtt| (srtt / 4).max(config.repair_delay)),
            probe_after_min: Some(config.repair_timeout),
        }
    }

    /// Once per smoothed repair time while the stream has gaps: equations 9 and 10.
    fn adjust(&self, nack: &mut NackWindow, now: Time, has_gaps: bool, config: &Config) {
        let (Some(srtt), Some(msgs)) = (nack.srtt(), nack.msgs_in(nack.span(config), config))
        else {
            return;
        };
        if !has_gaps {
            // Not recovering: the next recovery compares against a fresh rate.
            nack.rate_prev = None;
            return;
        }
        if nack
            .last_adjust
            .is_some_and(|at| now < at + srtt.max(Duration::from_millis(1)))
        {
            return;
        }
        nack.last_adjust = Some(now);
        let size = config.recovery.nack_size;
        let span = nack.span(config);
        let rate = msgs as f64 / srtt.as_secs_f64().max(1e-6);
        let full = msgs >= config.receive_window_msgs;
        let next = match nack.rate_prev {
            // The first RTT of a recovery probes upwards.
            None if !full => span + size,
            Some(prev) if rate >= prev * (1.0 + config.recovery.alpha) && !full => span + size,
            Some(prev) if rate <= prev * (1.0 - config.recovery.beta) => span.saturating_sub(size),
            _ => span,
        };
        nack.window = Some(next.max(size));
        nack.rate_prev = Some(rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> Config {
        let mut c = Config::default();
        c.recovery.pacing = crate::RecoveryPacing::Sdcc;
        c
    }

    fn ms(m: u64) -> Time {
        Time::ZERO + Duration::from_millis(m)
    }

    /// A window at 1000 messages per second of sender time.
    fn known_rate() -> NackWindow {
        let mut w = NackWindow::default();
        w.on_progress(1000, Duration::from_secs(1));
        w
    }

    #[test]
    fn unbounded_without_sdcc_or_before_the_rate_is_known() {
        let c = Config::default();
        let mut w = known_rate();
        w.on_repair(Duration::from_secs(1));
        w.adjust(ms(0), true, &c);
        assert_eq!(w.window(&c), usize::MAX);
        assert_eq!(w.gauge(&c), c.recovery.inflight_max);
        assert_eq!(w.retry(&c).timeout, c.repair_timeout);
        assert_eq!(NackWindow::default().window(&on()), usize::MAX);
    }

    #[test]
    fn the_repair_timeout_follows_the_repair_time_within_bounds() {
        let c = on();
        let mut w = known_rate();
        w.on_repair(Duration::from_millis(1));
        assert_eq!(w.retry(&c).timeout, c.repair_timeout);
        w.on_repair(Duration::from_secs(60));
        // A repair that took a minute (its first request was lost, say) does not make the
        // receiver wait a minute before asking again.
        assert_eq!(w.retry(&c).timeout, REPAIR_TIMEOUT_MAX);
    }

    #[test]
    fn requests_are_presumed_lost_before_their_timeout_only_with_sdcc() {
        let mut w = known_rate();
        // No repair time measured yet: no reordering window.
        assert_eq!(w.retry(&on()).reorder, None);
        w.on_repair(Duration::from_millis(400));
        let off = w.retry(&Config::default());
        assert_eq!((off.reorder, off.probe_after_min), (None, None));
        let c = on();
        assert_eq!(w.retry(&c).timeout, w.retry(&c).timeout);
        assert_eq!(w.retry(&c).reorder, Some(Duration::from_millis(100)));
        assert_eq!(w.retry(&c).probe_after_min, Some(c.repair_timeout));
        // At least repair_delay, the reordering a new gap waits out.
        let mut fast = known_rate();
        fast.on_repair(Duration::from_millis(1));
        assert_eq!(fast.retry(&c).reorder, Some(c.repair_delay));
    }

    #[test]
    fn the_window_is_a_span_of_sender_time_in_messages() {
        let c = on();
        let w = known_rate();
        // nwnd_0 = 100 ms at 1000 msgs/s.
        assert_eq!(w.window(&c), 100);
    }

    #[test]
    fn opens_while_the_recovery_rate_grows_and_stops_when_it_does_not() {
        let c = on();
        let mut w = known_rate();
        // A constant repair time: every step adds size_NACK and raises nwnd / RTT, by less and
        // less; the window grows while the gain is at least alpha: up to size / alpha.
        w.on_repair(Duration::from_millis(10));
        for k in 0..100 {
            w.adjust(ms(k * 10), true, &c);
        }
        let size = c.recovery.nack_size.as_secs_f64() * 1000.0;
        let stop = (size / c.recovery.alpha) as usize;
        let window = w.window(&c);
        assert!((stop..=stop + size as usize).contains(&window), "{window}");
    }

    #[test]
    fn closes_when_the_recovery_rate_falls_and_waits_longer_for_slow_repairs() {
        let c = on();
        let mut w = known_rate();
        w.on_repair(Duration::from_millis(10));
        for k in 0..3 {
            w.adjust(ms(k * 10), true, &c);
        }
        let opened = w.window(&c);
        assert_eq!(opened, 400);
        // Repairs now take ten times as long (queues filled up): the rate falls, the window
        // closes by one size_NACK per RTT.
        for _ in 0..40 {
            w.on_repair(Duration::from_millis(100));
        }
        w.adjust(ms(1000), true, &c);
        assert_eq!(w.window(&c), 300);
        assert!(w.retry(&c).timeout >= Duration::from_millis(190));
        // No adjustment before another RTT has passed.
        w.adjust(ms(1010), true, &c);
        assert_eq!(w.window(&c), 300);
        // Without gaps nothing changes, and the next recovery starts with a probe.
        w.adjust(ms(2000), false, &c);
        assert_eq!(w.window(&c), 300);
        w.adjust(ms(3000), true, &c);
        assert_eq!(w.window(&c), 400);
    }
}
