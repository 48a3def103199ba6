//! Gryphon's PHB-driven congestion control (paper 002, section 3.1), mapped onto QSM's hierarchy:
//! a sender (the pubend) multicasts a DCQ to each of its regions every `dcq_interval`; each
//! receiver (an SHB) decides with equations 6-8 from its smoothed doubt horizon rate whether to
//! answer with a UCA; UCAs travel up the ring hierarchy (member, partition leader, ..., region
//! leader, sender), each node consolidating them with the rule of Figure 5; the sender adjusts its
//! publish rate with equations 1-3 and enforces it by admission at `publish`.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_wire::{NodeId, RegionId, ViewId};

use crate::config::Config;
use crate::outbox::{Control, Outbox};
use crate::policy::CongestionPolicy;
use crate::recv::InboundStream;
use crate::time::Time;

/// A rate on the wire: thousandths of tick-seconds per second; `u32::MAX` means "none".
pub(crate) fn rate_to_milli(rate: f64) -> u32 {
    if rate.is_finite() {
        (rate.max(0.0) * 1000.0).min(f64::from(u32::MAX - 1)) as u32
    } else {
        u32::MAX
    }
}

/// The inverse of [`rate_to_milli`].
pub(crate) fn milli_to_rate(milli: u32) -> f64 {
    if milli == u32::MAX {
        f64::INFINITY
    } else {
        f64::from(milli) / 1000.0
    }
}

/// Equations 6-8: whether a receiver answers a DCQ, and with which rates (non-recovering,
/// recovering; infinity for "not this kind").
///
/// A receiver is recovering if it ignored messages beyond its receive window (paper 002, section
/// 4) or if its doubt horizon trails the sender's position by more than `congestion.delta_t_s`.
/// The paper's receive window is a span of ticks, so ignoring messages beyond it means "lagging
/// by a significant amount"; ours counts messages and must hold the sender's whole window
/// (`Config::validate`), so a receiver catching up a backlog the sender still holds never ignores
/// anything, and without the lag it would never count as recovering: equation 8 and
/// `congestion.delta_t_rec` would have no effect (the Fig. 16 experiment found this). Such a
/// receiver must gain on the sender by `delta_t_rec` (eq. 8) instead of alerting on every query
/// until it caught up, whatever its progress (eq. 7).
///
/// A non-recovering receiver's falling rate (eq. 6) counts only if its fresh messages also meet
/// at least `congestion.queue_delay_threshold` of queueing, or at least `congestion.loss_threshold`
/// of them are lost: repairing random loss stalls the doubt horizon without delaying new
/// messages, while a filling queue delays them, and a full shallow one drops many.
pub(crate) fn uca_rates(
    rate: Option<f64>,
    recovering: bool,
    lag: Duration,
    (queueing, loss): (Duration, f64),
    config: &Config,
) -> Option<(f64, f64)> {
    let t = rate?;
    let recovering = recovering || lag > config.congestion.delta_t_s;
    let queue_grew = queueing >= config.congestion.queue_delay_threshold
        || loss >= config.congestion.loss_threshold;
    let queue_stands = !config.congestion.standing_queue_threshold.is_zero()
        && queueing >= config.congestion.standing_queue_threshold;
    if recovering {
        // Eq. 8: a recovering receiver must gain on the sender by at least delta_t_rec.
        (t < 1.0 + config.congestion.delta_t_rec).then_some((f64::INFINITY, t))
    } else if (t < 1.0 - config.congestion.delta_t_nonrec && queue_grew) || queue_stands {
        // Eq. 6 (falling behind), or a queue that still stands although the rate fell below the
        // bottleneck's: the alert holds the rate (no increase while alerts come) and lowers it if
        // the queue does not drain (the rate does not improve). Eq. 7 (slowly drifting more than
        // delta_t_s behind the sender's position) is within eq. 8 above: such a receiver must
        // gain on the sender.
        Some((t, f64::INFINITY))
    } else {
        None
    }
}

/// How much the one-way delay of fresh (not retransmitted) messages of a stream has grown over
/// its recent minimum: the queueing a receiver's messages meet. Clock offsets between sender and
/// receiver cancel out (only differences of `arrival - timestamp` are used).
#[derive(Clone, Debug, Default)]
pub(crate) struct QueueDelay {
    /// Least `arrival - timestamp` (microseconds) in the current sample interval.
    interval_min_us: Option<i64>,
    /// Least delays of the last intervals, oldest first (at most the history asked for, see
    /// `CongestionConfig::queue_delay_baseline`).
    history: std::collections::VecDeque<i64>,
    /// The latest interval's least delay.
    current_us: Option<i64>,
    /// Intervals with fresh messages seen.
    intervals: usize,
}

/// Sample intervals at the start of a stream that are not used (1 s at the default 100 ms).
const QUEUE_DELAY_WARMUP: usize = 10;

impl QueueDelay {
    /// A fresh message sent at `timestamp_us` (sender clock) arrived at `now`.
    pub(crate) fn on_fresh(&mut self, now: Time, timestamp_us: u64) {
        let d = now.as_micros() as i64 - timestamp_us as i64;
        self.interval_min_us = Some(self.interval_min_us.map_or(d, |m| m.min(d)));
    }

    /// End of a sample interval; the baseline is the least delay of the last `history`
    /// intervals. An interval without fresh messages leaves the estimate as it was.
    pub(crate) fn sample(&mut self, history: usize) {
        if let Some(m) = self.interval_min_us.take() {
            self.intervals += 1;
            if self.intervals <= QUEUE_DELAY_WARMUP {
                // The start of a stream (the sender's queue filling) sets no baseline.
                return;
            }
            while self.history.len() >= history.max(1) {
                self.history.pop_front();
            }
            self.history.push_back(m);
            self.current_us = Some(m);
        }
    }

    /// Queueing delay now: the latest interval's least delay above the least of the history;
    /// zero until `QUEUE_DELAY_WARMUP` more intervals than the warm-up were seen.
    pub(crate) fn queueing(&self) -> Duration {
        if self.intervals < 2 * QUEUE_DELAY_WARMUP {
            return Duration::ZERO;
        }
        let (Some(current), Some(&base)) = (self.current_us, self.history.iter().min()) else {
            return Duration::ZERO;
        };
        Duration::from_micros(u64::try_from(current - base).unwrap_or(0))
    }
}

/// DCQ send times a sender remembers to time its feedback loop (64 s at the default interval;
/// an answer older than that is timed by the oldest).
const DCQ_SENT_HISTORY: usize = 64;

/// Figure 5: consolidation of UCAs for one sender at one node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UcaConsolidator {
    seq: u64,
    min_nonrec: f64,
    min_rec: f64,
}

impl Default for UcaConsolidator {
    fn default() -> Self {
        UcaConsolidator {
            seq: 0,
            min_nonrec: f64::INFINITY,
            min_rec: f64::INFINITY,
        }
    }
}

impl UcaConsolidator {
    /// Folds a UCA in; returns the UCA to send upstream when this is the first of a new sequence
    /// number (later ones of the same number fold into the minima sent with the next one).
    pub(crate) fn process(&mut self, seq: u64, nonrec: f64, rec: f64) -> Option<(u64, f64, f64)> {
        self.min_nonrec = self.min_nonrec.min(nonrec);
        self.min_rec = self.min_rec.min(rec);
        if seq > self.seq {
            let up = (seq, self.min_nonrec, self.min_rec);
            self.min_nonrec = f64::INFINITY;
            self.min_rec = f64::INFINITY;
            self.seq = seq;
            return Some(up);
        }
        None
    }
}

/// Equations 6-8 at a receiver: its answer to a sender's congestion query (DCQ) about
/// `stream`, from what the stream saw since the previous query (which this starts afresh).
/// `position_us`: the sender's clock when it sent the query. `None`: the receiver keeps up.
pub(crate) fn answer_dcq(
    stream: &mut InboundStream,
    position_us: u64,
    config: &Config,
) -> Option<(f64, f64)> {
    let recovering = stream.ignored_since_dcq > 0;
    stream.ignored_since_dcq = 0;
    let lag = Duration::from_micros(position_us.saturating_sub(stream.doubt_horizon_us));
    let queueing = stream.queue_delay.queueing();
    // Fresh loss since the last query: what became known but did not arrive fresh.
    let learnt = stream.known_max().saturating_sub(stream.known_at_dcq);
    let loss = if learnt == 0 {
        0.0
    } else {
        1.0 - (stream.fresh_since_dcq as f64 / learnt as f64).min(1.0)
    };
    stream.known_at_dcq = stream.known_max();
    stream.fresh_since_dcq = 0;
    uca_rates(stream.doubt_rate, recovering, lag, (queueing, loss), config)
}

/// A congestion alert (UCA) about one sender's stream: the query it answers and the smallest
/// rates below (messages per second, of non-recovering and recovering receivers).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Alert {
    pub(crate) origin: NodeId,
    pub(crate) seq: u64,
    pub(crate) nonrec: f64,
    pub(crate) rec: f64,
}

/// Where a node passes alerts on in one region view: `parent`, the leader of the lowest ring it
/// does not lead (the sender itself, for the region leader).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AlertRoute {
    pub(crate) me: NodeId,
    pub(crate) parent: NodeId,
    pub(crate) region: RegionId,
    pub(crate) view: ViewId,
}

/// Figure 5 at one node of one region: the alerts passing through it, consolidated per sender
/// and passed up the ring hierarchy, one per query.
#[derive(Debug, Default)]
pub(crate) struct UcaRelay {
    consolidators: BTreeMap<NodeId, UcaConsolidator>,
}

impl UcaRelay {
    /// Folds `alert` in and, when it is the first of a new query, sends the consolidated alert
    /// to `route.parent` (to this node's own rate controller when it is the sender).
    pub(crate) fn relay(&mut self, alert: Alert, route: AlertRoute, out: &mut Outbox) {
        let Some((seq, nonrec, rec)) = self.consolidators.entry(alert.origin).or_default().process(
            alert.seq,
            alert.nonrec,
            alert.rec,
        ) else {
            return;
        };
        if route.parent == route.me {
            out.self_ucas.push((seq, nonrec.min(rec)));
            return;
        }
        out.stats.ucas_sent += 1;
        out.control.push_back(Control::Uca {
            to: route.parent,
            region: route.region,
            view: route.view,
            origin: alert.origin,
            seq,
            nonrec: rate_to_milli(nonrec),
            rec: rate_to_milli(rec),
        });
    }
}

/// The sender's publish rate: equations 1-3, enforced by a token bucket at `publish`.
#[derive(Clone, Debug)]
pub(crate) struct RateController {
    /// Messages per second; `None` until the first UCA asks to slow down.
    rate: Option<f64>,
    /// The rate at the last decrease (`r_decr`).
    rate_at_decrease: f64,
    /// The DCQ sequence number sent after the last decrease: UCAs older than that answer queries
    /// sent before the system could react, and are ignored.
    seq_after_decrease: u64,
    /// When the rate was last decreased.
    decreased_at: Time,
    last_uca_value: f64,
    last_uca_at: Time,
    tokens: f64,
    tokens_at: Time,
    /// A publish was refused by the rate since the last increase.
    throttled: bool,
    published_in_interval: u64,
    interval_start: Time,
    measured_rate: f64,
    /// When the last DCQs were sent (at most `DCQ_SENT_HISTORY`, oldest first), to time the
    /// feedback loop.
    dcq_sent_at: std::collections::VecDeque<(u64, Time)>,
    /// How long the last UCA took from its DCQ's sending to its arrival here: the delay of the
    /// feedback loop, which grows with the queue at a bottleneck the DCQs wait in.
    feedback_delay: Duration,
    /// Sequence number of the last DCQ sent.
    dcq_seq: u64,
    /// When the next DCQ goes out.
    next_dcq: Time,
}

impl RateController {
    pub(crate) fn new(now: Time, config: &Config) -> Self {
        RateController {
            rate: None,
            rate_at_decrease: 0.0,
            seq_after_decrease: 0,
            decreased_at: now,
            last_uca_value: f64::INFINITY,
            last_uca_at: now,
            tokens: 0.0,
            tokens_at: now,
            throttled: false,
            published_in_interval: 0,
            interval_start: now,
            measured_rate: 0.0,
            dcq_sent_at: std::collections::VecDeque::new(),
            feedback_delay: Duration::ZERO,
            dcq_seq: 0,
            next_dcq: now + config.congestion.dcq_interval,
        }
    }
}

/// PDCC as a congestion policy: DCQs on `dcq_interval`, the publish rate of equations 1-3 set by
/// the UCAs that answer them and enforced by a token bucket at `publish`.
impl CongestionPolicy for RateController {
    /// The publish rate in force (messages per second), if throttled.
    fn rate(&self) -> Option<f64> {
        self.rate
    }

    fn next_query(&self) -> Option<Time> {
        Some(self.next_dcq)
    }

    /// Admission of one message at `now`: `Err(retry_at)` if the rate does not allow it yet.
    fn admit(&mut self, now: Time, config: &Config) -> Result<(), Time> {
        let Some(rate) = self.rate else {
            self.published_in_interval += 1;
            return Ok(());
        };
        let burst = (rate * config.congestion.burst.as_secs_f64()).max(1.0);
        let elapsed = now.saturating_duration_since(self.tokens_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.tokens_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.published_in_interval += 1;
            Ok(())
        } else {
            self.throttled = true;
            Err(now + Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }

    /// Time for a DCQ: measures the publish rate of the interval, raises the rate after
    /// `t_noUCA` without alerts while throttled (eq. 1), and returns the new DCQ's sequence
    /// number.
    fn on_query_timer(&mut self, now: Time, config: &Config) -> u64 {
        let elapsed = now
            .saturating_duration_since(self.interval_start)
            .as_secs_f64();
        if elapsed > 0.0 {
            self.measured_rate = self.published_in_interval as f64 / elapsed;
        }
        self.published_in_interval = 0;
        self.interval_start = now;
        if let Some(old) = self.rate {
            // Silence means "not congested" only once it outlasts the feedback loop: a DCQ that
            // waits behind data in a bottleneck's queue comes back late, and alerts then arrive
            // further apart than t_noUCA while the queue grows (Figs. 12-15 at 30%: the rate
            // rose twice while the queue grew, and the next decrease was then eq. 2's tiny one).
            let silence = config.congestion.t_no_uca + self.feedback_delay;
            if self.throttled && now.saturating_duration_since(self.last_uca_at) >= silence {
                // Eq. 1, with r_min at least a share of the rate: Table 1's fixed r_min was
                // sized for hundreds of messages per second.
                let rate_min_increase = config
                    .congestion
                    .rate_min_increase
                    .max(config.congestion.rate_min_increase_share * old);
                let new = (old + rate_min_increase)
                    .max(old + config.congestion.f_incr * (old - self.rate_at_decrease));
                self.rate = Some(new);
                self.throttled = false;
                self.last_uca_at = now;
                // The silence outlasted the last delay measured: the loop is faster now.
                self.feedback_delay = Duration::ZERO;
            }
        }
        self.dcq_seq += 1;
        if self.rate.is_some()
            && now.saturating_duration_since(self.decreased_at) < config.congestion.decrease_holdoff
        {
            // The receivers cannot show the last decrease yet (their smoothed rates lag, and
            // the queue built before it still drains): alerts answering this query do not count.
            self.seq_after_decrease = self.dcq_seq + 1;
        }
        self.next_dcq = now + config.congestion.dcq_interval;
        if self.dcq_sent_at.len() == DCQ_SENT_HISTORY {
            self.dcq_sent_at.pop_front();
        }
        self.dcq_sent_at.push_back((self.dcq_seq, now));
        self.dcq_seq
    }

    /// A UCA reached the sender: maybe decrease the rate (eqs. 2-3).
    fn on_feedback(&mut self, now: Time, seq: u64, value: f64, config: &Config) {
        self.last_uca_at = now;
        // An answer older than the history took at least as long as the oldest entry.
        let sent = self
            .dcq_sent_at
            .iter()
            .find(|(k, _)| *k >= seq)
            .map(|&(_, at)| at);
        if let Some(sent) = sent {
            self.feedback_delay = now.saturating_duration_since(sent);
        }
        if seq < self.seq_after_decrease {
            // The system has not had time to react to the last decrease.
            return;
        }
        let improving = value > self.last_uca_value;
        self.last_uca_value = value;
        if improving {
            return;
        }
        let old = self
            .rate
            .unwrap_or_else(|| self.measured_rate.max(config.congestion.rate_min_increase));
        let new = if self.rate_at_decrease != old {
            (config.congestion.f_decr1 * old).max(
                self.rate_at_decrease + config.congestion.f_decr2 * (old - self.rate_at_decrease),
            )
        } else {
            config.congestion.f_decr1 * old
        };
        let new = new.max(config.congestion.rate_floor);
        self.rate = Some(new);
        self.rate_at_decrease = new;
        self.seq_after_decrease = self.dcq_seq + 1;
        self.decreased_at = now;
        self.tokens = self.tokens.min(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CongestionConfig, CongestionControl};

    fn ms(m: u64) -> Time {
        Time::ZERO + Duration::from_millis(m)
    }

    fn on() -> Config {
        Config {
            congestion: CongestionConfig {
                control: CongestionControl::Pdcc,
                ..Default::default()
            },
            ..Config::default()
        }
    }

    #[test]
    fn receivers_alert_by_equations_6_to_8() {
        let c = on();
        let none = Duration::ZERO;
        assert_eq!(uca_rates(None, false, none, (none, 0.0), &c), None);
        assert_eq!(uca_rates(Some(1.0), false, none, (none, 0.0), &c), None);
        // A stalled horizon alone (repairing random loss) is not congestion...
        assert_eq!(uca_rates(Some(0.9), false, none, (none, 0.0), &c), None);
        // ...it is when fresh messages queue up too.
        let queued = c.congestion.queue_delay_threshold;
        assert_eq!(
            uca_rates(Some(0.9), false, none, (queued, 0.0), &c),
            Some((0.9, f64::INFINITY))
        );
        // ...or when many fresh messages are lost (a full shallow queue).
        assert_eq!(
            uca_rates(
                Some(0.9),
                false,
                none,
                (none, c.congestion.loss_threshold),
                &c
            ),
            Some((0.9, f64::INFINITY))
        );
        // More than delta_t_s behind the sender (eq. 7) is recovering: it must gain on the
        // sender by delta_t_rec (eq. 8), and does not alert once it does.
        let behind = c.congestion.delta_t_s + Duration::from_secs(1);
        assert_eq!(
            uca_rates(Some(1.0), false, behind, (none, 0.0), &c),
            Some((f64::INFINITY, 1.0))
        );
        assert_eq!(uca_rates(Some(2.5), false, behind, (none, 0.0), &c), None);
        assert_eq!(
            uca_rates(Some(1.5), true, none, (none, 0.0), &c),
            Some((f64::INFINITY, 1.5))
        );
        assert_eq!(uca_rates(Some(2.5), true, none, (none, 0.0), &c), None);
        // A standing queue alerts even while the horizon keeps pace, if asked to.
        let deep = Duration::from_millis(300);
        assert_eq!(uca_rates(Some(1.1), false, none, (deep, 0.0), &c), None);
        let hold = Config {
            congestion: CongestionConfig {
                standing_queue_threshold: deep,
                ..on().congestion
            },
            ..on()
        };
        assert_eq!(
            uca_rates(Some(1.1), false, none, (deep, 0.0), &hold),
            Some((1.1, f64::INFINITY))
        );
    }

    #[test]
    fn queueing_is_the_delay_above_its_recent_minimum() {
        let mut q = QueueDelay::default();
        assert_eq!(q.queueing(), Duration::ZERO);
        // A constant clock offset of 7 s and 2 ms of transit: no queueing.
        for k in 0..10u64 {
            q.on_fresh(ms(7000 + k * 100 + 2), k * 100_000);
            q.sample(20);
        }
        // Nothing is reported in the first 2 s.
        assert_eq!(q.queueing(), Duration::ZERO);
        for k in 10..40u64 {
            q.on_fresh(ms(7000 + k * 100 + 2), k * 100_000);
            q.sample(20);
        }
        assert_eq!(q.queueing(), Duration::ZERO);
        // The queue grows: each message is 30 ms later than the least seen.
        q.on_fresh(ms(7000 + 4000 + 32), 4_000_000);
        q.sample(20);
        assert_eq!(q.queueing(), Duration::from_millis(30));
        // An interval without fresh messages keeps the estimate.
        q.sample(20);
        assert_eq!(q.queueing(), Duration::from_millis(30));
    }

    #[test]
    fn figure_5_sends_the_first_of_a_sequence_number_at_once() {
        let mut u = UcaConsolidator::default();
        assert_eq!(
            u.process(1, 0.8, f64::INFINITY),
            Some((1, 0.8, f64::INFINITY))
        );
        assert_eq!(u.process(1, 0.5, f64::INFINITY), None);
        assert_eq!(u.process(1, f64::INFINITY, 1.2), None);
        // The next number carries the minima folded in since.
        assert_eq!(u.process(2, 0.9, f64::INFINITY), Some((2, 0.5, 1.2)));
    }

    #[test]
    fn the_rate_falls_on_alerts_and_climbs_back_without_them() {
        let c = on();
        let mut r = RateController::new(ms(0), &c);
        for k in 0..1000 {
            assert!(r.admit(ms(k), &c).is_ok(), "unthrottled before any alert");
        }
        let seq = r.on_query_timer(ms(1000), &c);
        assert_eq!(seq, 1);
        // First alert: eq. 3 halves the measured rate (1000 msgs/s).
        r.on_feedback(ms(1010), 1, 0.5, &c);
        assert_eq!(r.rate(), Some(500.0));
        // An alert answering a query sent before the decrease is ignored.
        r.on_feedback(ms(1020), 1, 0.4, &c);
        assert_eq!(r.rate(), Some(500.0));
        // The bucket holds the rate: about 500 of 1000 attempts in a second pass.
        let admitted = (0..1000)
            .filter(|k| r.admit(ms(1100 + k), &c).is_ok())
            .count();
        assert!((450..=560).contains(&admitted), "admitted {admitted}");
        // An improving alert does not lower the rate; a worse one does (eq. 3: r_decr == r_old).
        r.on_query_timer(ms(2000), &c);
        r.on_feedback(ms(2010), 2, 0.6, &c);
        assert_eq!(r.rate(), Some(500.0));
        r.on_feedback(ms(2020), 2, 0.3, &c);
        assert_eq!(r.rate(), Some(250.0));
        // No alert for t_noUCA while throttled: eq. 1 raises the rate.
        let _ = r.admit(ms(2021), &c);
        let _ = (0..10).map(|_| r.admit(ms(2021), &c)).count();
        r.on_query_timer(ms(3000), &c);
        r.on_query_timer(ms(4100), &c);
        assert!(r.rate().is_some_and(|x| x > 250.0), "rate {:?}", r.rate());
    }

    #[test]
    fn alerts_to_queries_within_the_holdoff_after_a_decrease_do_not_count() {
        let c = Config {
            congestion: CongestionConfig {
                decrease_holdoff: Duration::from_millis(1500),
                ..on().congestion
            },
            ..on()
        };
        let mut r = RateController::new(ms(0), &c);
        for k in 0..1000 {
            let _ = r.admit(ms(k), &c);
        }
        assert_eq!(r.on_query_timer(ms(1000), &c), 1);
        r.on_feedback(ms(1010), 1, 0.5, &c);
        assert_eq!(r.rate(), Some(500.0));
        // Query 2 goes out 1 s after the decrease, within the holdoff: its alert is ignored.
        assert_eq!(r.on_query_timer(ms(2000), &c), 2);
        r.on_feedback(ms(2010), 2, 0.4, &c);
        assert_eq!(r.rate(), Some(500.0));
        // Query 3, 2 s after: its alert counts (eq. 3, consecutive decreases halve).
        assert_eq!(r.on_query_timer(ms(3000), &c), 3);
        r.on_feedback(ms(3010), 3, 0.3, &c);
        assert_eq!(r.rate(), Some(250.0));
    }

    #[test]
    fn the_least_increase_can_be_a_share_of_the_rate() {
        let c = Config {
            congestion: CongestionConfig {
                rate_min_increase_share: 0.1,
                ..on().congestion
            },
            ..on()
        };
        let mut r = RateController::new(ms(0), &c);
        for k in 0..1000 {
            let _ = r.admit(ms(k), &c);
        }
        r.on_query_timer(ms(1000), &c);
        r.on_feedback(ms(1010), 1, 0.5, &c);
        assert_eq!(r.rate(), Some(500.0));
        // Throttled, then t_noUCA without alerts: 10% of 500 rather than r_min = 2.
        for k in 0..100 {
            let _ = r.admit(ms(1100 + k), &c);
        }
        r.on_query_timer(ms(2000), &c);
        r.on_query_timer(ms(3100), &c);
        assert_eq!(r.rate(), Some(550.0));
    }

    #[test]
    fn silence_counts_only_once_it_outlasts_the_feedback_delay() {
        let c = on();
        let mut r = RateController::new(ms(0), &c);
        for k in 0..1000 {
            let _ = r.admit(ms(k), &c);
        }
        r.on_query_timer(ms(1000), &c);
        // The answer to DCQ 1 took 5 s (it waited in a bottleneck's queue).
        r.on_feedback(ms(6000), 1, 0.5, &c);
        assert_eq!(r.rate(), Some(500.0));
        // Publishers want more than the rate allows (the burst is 25 messages).
        let _ = (0..100).map(|_| r.admit(ms(6001), &c)).count();
        // 3 s of silence is not enough: t_noUCA (2 s) plus the 5 s delay is.
        for t in [7000, 8000, 9000, 10_000, 12_000] {
            r.on_query_timer(ms(t), &c);
        }
        assert_eq!(r.rate(), Some(500.0));
        let _ = (0..100).map(|_| r.admit(ms(12_001), &c)).count();
        r.on_query_timer(ms(13_000), &c);
        assert!(r.rate().is_some_and(|x| x > 500.0), "rate {:?}", r.rate());
    }
}
