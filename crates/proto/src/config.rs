//! Protocol configuration: every limit explicit, with its default and why.

use std::time::Duration;

use crate::policy::RecoveryPolicy;

/// Configuration of one protocol node. Build with [`Config::default`] and adjust; [`Config::validate`]
/// is called by [`Node::new`](crate::Node::new).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Largest datagram the node writes. Default 1472: an Ethernet MTU minus IP and UDP headers, so
    /// nothing is fragmented on the paper's cluster.
    pub max_datagram_bytes: usize,
    /// The credit window of each region stream (Horus' flow control).
    pub window: WindowConfig,
    /// Horus' message packing: a data datagram carries as many pending messages of the stream as
    /// fit. Off: one message per datagram (to measure what packing gains). Default on.
    pub packing: bool,
    /// Largest number of published messages waiting to be sent per region stream (the queue ahead
    /// of the socket); beyond it `publish` returns `WouldBlock`. With the window this bounds unsent
    /// plus unstable data (back pressure, Horus' end-to-end chain). Default 1024: about 90 ms of
    /// 1000-byte messages at 100 Mbit/s, enough to keep the socket busy between two application
    /// wake-ups without adding seconds of queueing delay.
    pub send_queue_msgs_max: usize,
    /// Largest unsent payload bytes per region stream. Default 1 MiB.
    pub send_queue_bytes_max: usize,
    /// Largest number of messages a node holds for all its region streams together, unsent or
    /// unacknowledged (a message counts once per region); beyond it `publish` returns
    /// `WouldBlock`. The windows and send queues bound each stream, not their sum: a node
    /// publishing a few messages on each of 100,000 topics, each its own region, held two
    /// million at once and sent them as one burst of one-message datagrams that the receiver's
    /// socket dropped by millions. Default 32768: two streams at their full window and send
    /// queue, and about what a 32 MiB receive buffer takes of small datagrams.
    pub node_held_msgs_max: usize,
    /// Out-of-order messages a receiver keeps per stream beyond what it delivered. Must be at least
    /// `window.msgs_max` so a sender within its window never overruns a receiver. Default 32768.
    pub receive_window_msgs: usize,
    /// Least time between two token releases by a ring leader (the token release rate). Default
    /// 100 ms: paper 000 uses 1 token/s and shows that faster tokens cut unacknowledged data; our
    /// tokens are cheap, and time to stability drives sender memory.
    pub token_interval: Duration,
    /// Least time between two token releases of a ring whose senders are fast (token pacing):
    /// a leader whose last round saw some sender's contiguous point advance at a rate that would
    /// fill a quarter of `window.msgs_max` within `token_interval` releases the next token
    /// sooner, after the time that rate takes to fill that quarter, but never sooner than this.
    /// A sender's window then holds about four rounds of its traffic instead of less than one,
    /// so the window, not a fixed token rate, bounds a fast sender; quiet or slow rings keep
    /// `token_interval`. Equal to `token_interval`: fixed-rate tokens (the paper's). Default
    /// 1 ms.
    pub token_interval_min: Duration,
    /// A ring leader that does not see its token back within this time (or within four smoothed
    /// round trips, if longer) releases a new round. Default 300 ms.
    pub token_timeout: Duration,
    /// How long a node waits for the next ring member to confirm a token before resending it.
    /// Default 50 ms: above a hop's round trip through a full 256 KiB switch queue at 100 Mbit/s
    /// (about 21 ms each way).
    pub token_handoff_timeout: Duration,
    /// Resends of an unconfirmed token before the next member is reported as suspected.
    /// Default 3.
    pub token_handoff_retries: u32,
    /// Most members of a ring above the partition level; more partitions than this add a level to
    /// the hierarchy, so aggregation latency grows with log(N). Default 32.
    pub ring_fanout_max: usize,
    /// Rounds a fully stable, unchanged sender record stays in the token before it leaves it
    /// (paper 001: 2-3 rounds). Default 3.
    pub idle_rounds_before_drop: u32,
    /// Most ranges in each list of a token record (the token must fit one datagram, so fewer are
    /// used when many senders share it). Default 32.
    pub token_ranges_max: usize,
    /// Sequence numbers per caching block: the caching partition of `seq` is
    /// `((seq - 1) / block) mod partitions`. Default 1 (round-robin by sequence number).
    pub cache_block_msgs: u64,
    /// Interval of silence heartbeats of a stream that has sent nothing new and still has unstable
    /// messages (Gryphon's `t_silence`; lets receivers detect tail loss). Default 20 ms.
    pub silence_interval: Duration,
    /// Interval of silence heartbeats of a fully stable stream; with `silence_backoff` the
    /// first one, the next ones doubling up to `silence_idle_interval_max`. Default 1 s.
    pub silence_idle_interval: Duration,
    /// With `silence_backoff`, the longest interval between silences of a fully stable stream.
    /// Such a silence tells receivers nothing they need (everything sent is stable), and at a
    /// second each a node that had published on 100,000 topics sent 100,000 datagrams a second
    /// at rest, each waking its region's ring at the receivers (a core at rest). Kept at all as
    /// a bound on how long a ring that missed a wake-up would wait (ADR 18). Default 64 s.
    pub silence_idle_interval_max: Duration,
    /// Silences of a stream with unstable messages back off: after a data packet the first
    /// comes `silence_interval` later, each next one twice as long after the one before, up to
    /// `silence_idle_interval`. The first silence tells receivers the tail; the later ones only
    /// matter if it (or the region's ACK) was lost, so a node with thousands of streams waiting
    /// for stability sends a few silences per stream instead of one per stream every
    /// `silence_interval` (30,000 streams: 1.5 M datagrams a second, which overran the
    /// receiver and fed a storm of repairs). PDCC and SDCC read the sender's clock from
    /// silences (the doubt horizon, Gryphon), so with either on silences keep the fixed
    /// interval. Default on.
    pub silence_backoff: bool,
    /// How long a gap must exist before it is requested (absorbs reordering). Default 2 ms.
    pub repair_delay: Duration,
    /// How long a requested message may stay missing before it is requested again, from another
    /// random caching member; doubled after every attempt, up to 4 times. Default 40 ms.
    pub repair_timeout: Duration,
    /// Requests to caching members for one message before asking its sender. Default 4 (about
    /// 280 ms with the default timeout and its doubling: later than a region NAK, which repairs a
    /// loss of the whole caching partition with one multicast instead of one unicast per receiver).
    pub repair_attempts_before_sender: u32,
    /// The pacing of repair requests (the NACK window).
    pub recovery: RecoveryConfig,
    /// Interval of the scan that requests missing messages, while some stream has gaps (after
    /// a time without any, the first scan comes `repair_delay` after the first gap was
    /// noticed). Default 5 ms.
    pub repair_interval: Duration,
    /// Most messages queued for retransmission (pushes, pull answers, NAK answers) at one node;
    /// requests beyond it are dropped and counted (the requester asks again). Default 8192.
    pub retransmit_queue_max: usize,
    /// A queued retransmission not sent within this time is dropped (its requester has asked
    /// again by then; sending it late only feeds a repair storm). Default 250 ms.
    pub repair_queue_ttl: Duration,
    /// Most messages pushed to the previous ring member per token visit. Default 256.
    pub push_max_per_token: usize,
    /// Most inbound streams (senders) per region; records for more are ignored and counted.
    /// Default 1024.
    pub streams_max: usize,
    /// After a view change a sender waits this long before sending into the new view, so that
    /// receivers install it first (they buffer what arrives early anyway). Default 5 ms.
    pub view_change_pause: Duration,
    /// Most datagrams of views this node does not know yet that it keeps until the view arrives
    /// (the oldest are dropped beyond it). Default 4096.
    pub future_datagrams_max: usize,
    /// Smoothing factor of the doubt horizon rate (Gryphon's equation 5, Table 1). Default 0.1.
    pub doubt_rate_alpha: f64,
    /// Interval at which each receiver samples the progress of its doubt horizons, with
    /// [`CongestionControl::Pdcc`] or [`RecoveryPacing::Sdcc`] (their readers; without them
    /// nothing is sampled and [`StreamReport::doubt_rate`](crate::StreamReport::doubt_rate)
    /// stays `None`).
    /// Default 100 ms.
    pub doubt_sample_interval: Duration,
    /// A sender's congestion control (PDCC or none).
    pub congestion: CongestionConfig,
    /// Seed of the node's random choices (which caching member to ask). Default 1.
    pub rng_seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_datagram_bytes: 1472,
            window: WindowConfig::default(),
            packing: true,
            send_queue_msgs_max: 1024,
            send_queue_bytes_max: 1 << 20,
            node_held_msgs_max: 32768,
            receive_window_msgs: 32768,
            token_interval: Duration::from_millis(100),
            token_interval_min: Duration::from_millis(1),
            token_timeout: Duration::from_millis(300),
            token_handoff_timeout: Duration::from_millis(50),
            token_handoff_retries: 3,
            ring_fanout_max: 32,
            idle_rounds_before_drop: 3,
            token_ranges_max: 32,
            cache_block_msgs: 1,
            silence_interval: Duration::from_millis(20),
            silence_idle_interval: Duration::from_secs(1),
            silence_idle_interval_max: Duration::from_secs(64),
            silence_backoff: true,
            repair_delay: Duration::from_millis(2),
            repair_timeout: Duration::from_millis(40),
            repair_attempts_before_sender: 4,
            recovery: RecoveryConfig::default(),
            repair_interval: Duration::from_millis(5),
            retransmit_queue_max: 8192,
            repair_queue_ttl: Duration::from_millis(250),
            push_max_per_token: 256,
            streams_max: 1024,
            view_change_pause: Duration::from_millis(5),
            doubt_rate_alpha: 0.1,
            doubt_sample_interval: Duration::from_millis(100),
            congestion: CongestionConfig::default(),
            future_datagrams_max: 4096,
            rng_seed: 1,
        }
    }
}

/// Horus' credit window of a sender (paper 004 section 3): how much of its data may be unstable.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WindowConfig {
    /// Largest unstable (sent, not yet acknowledged by the region) messages per region stream:
    /// Horus' local credit window. Default 16384: about 1.3 s of 1000-byte messages at 100 Mbit/s,
    /// several times the time to stability, so the window only closes when a receiver falls behind.
    pub msgs_max: usize,
    /// Largest unstable bytes (payload) per region stream. Default 16 MiB, matching the message
    /// window for 1000-byte messages.
    pub bytes_max: usize,
    /// Which credit window `msgs_max` bounds (Horus, paper 004 section 3). Default
    /// [`WindowAlgorithm::Local`]: the paper found it better, and it needs no shared state.
    pub algorithm: WindowAlgorithm,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            msgs_max: 16384,
            bytes_max: 16 << 20,
            algorithm: WindowAlgorithm::Local,
        }
    }
}

/// How fast a receiver asks for the messages it misses (the NACK window of its streams).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RecoveryConfig {
    /// Most messages a receiver has requested and not yet received (nor timed out) per stream: the
    /// bound on the recovery rate (a fixed NACK window; [`RecoveryPacing::Sdcc`] adds
    /// Gryphon's adaptive one inside it). Default 512.
    pub inflight_max: usize,
    /// How a receiver paces its repair requests. Default [`RecoveryPacing::Fixed`] (the window
    /// is fixed at `inflight_max`), until the congestion experiments decide for
    /// [`RecoveryPacing::Sdcc`].
    pub pacing: RecoveryPacing,
    /// nwnd_0: the NACK window a receiver starts with, in the sender's time (ticks). Default
    /// 100 ms (Table 1: 100 tickms).
    pub nack_window_initial: Duration,
    /// size_NACK: the step by which the NACK window opens or closes, in the sender's time.
    /// Default 100 ms (Table 1: 100 tickms).
    pub nack_size: Duration,
    /// alpha_NACK: relative growth of the recovery rate that opens the NACK window. Default 0.1
    /// (Table 1).
    pub alpha: f64,
    /// beta_NACK: relative fall of the recovery rate that closes the NACK window. Default 0.3
    /// (Table 1).
    pub beta: f64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            inflight_max: 512,
            pacing: RecoveryPacing::Fixed,
            nack_window_initial: Duration::from_millis(100),
            nack_size: Duration::from_millis(100),
            alpha: 0.1,
            beta: 0.3,
        }
    }
}

/// A sender's congestion control and the parameters of Gryphon's PDCC (paper 002 section 3.1,
/// Table 1).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct CongestionConfig {
    /// Which congestion control a sender runs. Default [`CongestionControl::None`] (ADR 5):
    /// with [`CongestionControl::Pdcc`], one seed of the GMS churn sweep fails (the GMS removes
    /// a live node).
    pub control: CongestionControl,
    /// Interval between DCQs from a sender. Default 1 s (paper 002's example).
    pub dcq_interval: Duration,
    /// t_noUCA: time without alerts before the rate rises. Default 2 s (Table 1).
    pub t_no_uca: Duration,
    /// r_min: least rate increase, messages per second. Default 2 (Table 1).
    pub rate_min_increase: f64,
    /// Least rate increase as a share of the rate in force (eq. 1's r_min, scaled): an increase
    /// is at least `rate_min_increase` and at least this share of the rate. Default 0
    /// (Table 1's fixed r_min alone). Table 1's 2 messages/s were 0.4% of the paper's 500
    /// messages/s; at thousands of messages/s a fixed r_min takes minutes to climb back after a
    /// decrease (ADR 9: 313 to 331 messages/s in 20 s behind an 8 Mbit/s bottleneck).
    pub rate_min_increase_share: f64,
    /// f_incr: multiplicative increment (eq. 1). Default 0.05 (Table 1).
    pub f_incr: f64,
    /// f_decr1: multiplicative decrement (eqs. 2-3). Default 0.5 (Table 1).
    pub f_decr1: f64,
    /// f_decr2: decrement relative to the previous one (eq. 2). Default 0.25 (Table 1).
    pub f_decr2: f64,
    /// delta_t_nonrec: alert threshold of receivers that are not recovering, tick-seconds per
    /// second below 1. Default 0.05 (50 tickms, Table 1).
    pub delta_t_nonrec: f64,
    /// delta_t_rec: how much faster than the sender a recovering receiver must progress.
    /// Default 1.0 (1000 tickms, Table 1).
    pub delta_t_rec: f64,
    /// delta_t_s: largest lag of a receiver's doubt horizon behind the sender's position before
    /// it alerts (eq. 7). Default 4 s (Table 1).
    pub delta_t_s: Duration,
    /// How much the one-way delay of fresh messages must have grown over its minimum of the last
    /// `queue_delay_baseline` before a non-recovering receiver's falling doubt horizon rate
    /// (equation 6) counts as congestion. Repairing random loss stalls the doubt horizon without
    /// delaying new messages; a filling queue (a bottleneck, an overloaded receiver) delays
    /// them. Default 200 ms: above
    /// what a sender at full speed adds by itself (its send queue of 1024 messages, about 90 ms
    /// at 100 Mbit/s, fills and drains with its window) plus full 256 KiB switch ports (21 ms
    /// each), so these are not read as congestion. Zero: equation 6 alone, as in the paper.
    pub queue_delay_threshold: Duration,
    /// The queueing delay is measured over the least one-way delay of this long a past (in
    /// whole [`Config::doubt_sample_interval`]s): a queue that stands longer becomes the new
    /// baseline and no longer counts. Default 2 s: a sender's own full send queue, which stands as long as it
    /// publishes at full speed, is not congestion. A bottleneck's queue that stands for a few
    /// seconds below the alert threshold, while the rate probes back up, hides the next rise
    /// over a baseline this short (ADR 9: behind a tbf the queue then overflowed); 10 s sees it.
    pub queue_delay_baseline: Duration,
    /// Queueing delay at which a non-recovering receiver alerts even though its doubt horizon
    /// keeps pace (t >= 1 - delta_t_nonrec): the rate then does not rise while the queue
    /// stands, and falls if it does not drain. Equation 6 alone lets the rate probe upwards
    /// from a queue left by the last overshoot, which then overflows (ADR 9). Default zero
    /// (off: the paper's equations).
    pub standing_queue_threshold: Duration,
    /// Share of the messages a receiver learnt of since the last DCQ that it did not receive
    /// fresh (they had to be repaired) above which its falling doubt horizon rate counts as
    /// congestion even without queueing: a full shallow queue drops rather than delays. Default
    /// 0.25: far above the random loss the simulator injects (at most 5% on average; 1% bursty
    /// loss reaches 10% at some of 99 receivers within a second now and then).
    pub loss_threshold: f64,
    /// After a decrease of the publish rate, alerts answering queries sent within this time do
    /// not count either (besides those answering queries sent before it, which never do): the
    /// receivers' smoothed doubt horizon rates (equation 5) lag by about
    /// `Config::doubt_sample_interval / Config::doubt_rate_alpha` (1 s), and the queue built
    /// before the decrease must drain before the lower rate shows, so an early second alert looks "not
    /// improving" and halves the rate again (equation 3). Default zero (the paper's rule alone,
    /// enough with 1 s queries); with faster queries about the smoothing's lag (ADR 9).
    pub decrease_holdoff: Duration,
    /// Burst the publish rate allows, as time at the rate. Default 50 ms.
    pub burst: Duration,
    /// The publish rate never falls below this, messages per second. Default 10.
    pub rate_floor: f64,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            control: CongestionControl::None,
            dcq_interval: Duration::from_secs(1),
            t_no_uca: Duration::from_secs(2),
            rate_min_increase: 2.0,
            rate_min_increase_share: 0.0,
            f_incr: 0.05,
            f_decr1: 0.5,
            f_decr2: 0.25,
            delta_t_nonrec: 0.05,
            delta_t_rec: 1.0,
            delta_t_s: Duration::from_secs(4),
            queue_delay_threshold: Duration::from_millis(200),
            queue_delay_baseline: Duration::from_secs(2),
            standing_queue_threshold: Duration::ZERO,
            loss_threshold: 0.25,
            decrease_holdoff: Duration::ZERO,
            burst: Duration::from_millis(50),
            rate_floor: 10.0,
        }
    }
}

/// The congestion control of a sender (the policy behind [`CongestionConfig::control`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CongestionControl {
    /// None: a sender publishes as fast as its windows and send queues allow.
    #[default]
    None,
    /// Gryphon's PDCC (paper 002): senders query their regions and adapt their publish rate to
    /// the slowest receiver's doubt horizon rate. A receiver alerts only when its fresh messages
    /// queue up or many are lost, so repairing random loss is not read as congestion (the
    /// 100-node bursty-loss run keeps its 11,600 messages/s with it).
    Pdcc,
}

/// How a receiver paces its repair requests (the policy behind [`RecoveryConfig::pacing`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecoveryPacing {
    /// A fixed NACK window: at most [`RecoveryConfig::inflight_max`] requests in flight per
    /// stream, each repeated after `repair_timeout`.
    #[default]
    Fixed,
    /// Gryphon's SDCC (paper 002, equations 9-10): a receiver requests only gaps within its NACK
    /// window (a span of the sender's time after its doubt horizon, converted to messages at the
    /// stream's rate, inside the receive window), which opens and closes additively on the
    /// measured recovery rate; it also waits at least twice the smoothed repair time before
    /// asking again. [`RecoveryConfig::inflight_max`] still bounds the requests in flight.
    Sdcc,
}

/// The credit window of a sender (Horus, paper 004 section 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowAlgorithm {
    /// One window per sender and region: the sender's own unstable messages (the most any
    /// receiver has not acknowledged, `max_j(s_i - r_ij)`) stay below `window.msgs_max`, and their
    /// payload below `window.bytes_max`.
    #[default]
    Local,
    /// One window per region shared by all its senders: the sum over the region's senders of
    /// their unstable messages (`sum_i max_j(s_i - r_ij)`) stays below `window.msgs_max`, so a
    /// sender holds back when the region as a whole has too much outstanding. Each node
    /// approximates the sum from what it already knows, with no extra messages: for itself, sent
    /// minus stable; for every other sender of the region, the highest sequence number it knows
    /// to exist (received data, silences, and token records' `agg_max`) minus the stability
    /// point the token records carry (`stable_upto`). Both lag the truth by up to a token round,
    /// so the estimate is stale, never invented. `window.bytes_max` still bounds the node's own
    /// unstable bytes (other senders' bytes are not in the records).
    Global,
}

/// A configuration that cannot work, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of its allowed range.
    #[error("config: {field} = {value} is invalid: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value, printed.
        value: String,
        /// What is allowed.
        why: &'static str,
    },
}

fn invalid(field: &'static str, value: impl std::fmt::Debug, why: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: format!("{value:?}"),
        why,
    }
}

impl Config {
    /// Smallest datagram that holds a header and a token with a few records.
    pub const MIN_DATAGRAM_BYTES: usize = 256;

    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(Self::MIN_DATAGRAM_BYTES..=65_507).contains(&self.max_datagram_bytes) {
            return Err(invalid(
                "max_datagram_bytes",
                self.max_datagram_bytes,
                "must be within 256..=65507 (a UDP payload)",
            ));
        }
        for (field, v) in [
            ("window.msgs_max", self.window.msgs_max),
            ("window.bytes_max", self.window.bytes_max),
            ("send_queue_msgs_max", self.send_queue_msgs_max),
            ("node_held_msgs_max", self.node_held_msgs_max),
            ("receive_window_msgs", self.receive_window_msgs),
            ("ring_fanout_max", self.ring_fanout_max),
            ("token_ranges_max", self.token_ranges_max),
            ("recovery.inflight_max", self.recovery.inflight_max),
            ("retransmit_queue_max", self.retransmit_queue_max),
            ("streams_max", self.streams_max),
        ] {
            if v == 0 {
                return Err(invalid(field, v, "must be at least 1"));
            }
        }
        if self.ring_fanout_max < 2 {
            return Err(invalid(
                "ring_fanout_max",
                self.ring_fanout_max,
                "must be at least 2",
            ));
        }
        if self.token_ranges_max > 255 {
            return Err(invalid(
                "token_ranges_max",
                self.token_ranges_max,
                "at most 255",
            ));
        }
        if self.send_queue_bytes_max < self.max_datagram_bytes {
            return Err(invalid(
                "send_queue_bytes_max",
                self.send_queue_bytes_max,
                "must hold at least one datagram's worth of payload",
            ));
        }
        if self.receive_window_msgs < self.window.msgs_max {
            return Err(invalid(
                "receive_window_msgs",
                self.receive_window_msgs,
                "must be at least window.msgs_max, or a sender within its window overruns receivers",
            ));
        }
        if !(self.doubt_rate_alpha > 0.0 && self.doubt_rate_alpha <= 1.0) {
            return Err(invalid(
                "doubt_rate_alpha",
                self.doubt_rate_alpha,
                "must be within (0, 1]",
            ));
        }
        for (field, v) in [
            ("congestion.f_decr1", self.congestion.f_decr1),
            ("congestion.f_decr2", self.congestion.f_decr2),
            ("recovery.beta", self.recovery.beta),
        ] {
            if !(v > 0.0 && v < 1.0) {
                return Err(invalid(field, v, "must be within (0, 1)"));
            }
        }
        for (field, v) in [
            ("congestion.f_incr", self.congestion.f_incr),
            (
                "congestion.rate_min_increase",
                self.congestion.rate_min_increase,
            ),
            (
                "congestion.rate_min_increase_share",
                self.congestion.rate_min_increase_share,
            ),
            ("congestion.delta_t_nonrec", self.congestion.delta_t_nonrec),
            ("congestion.rate_floor", self.congestion.rate_floor),
            ("recovery.alpha", self.recovery.alpha),
            ("congestion.loss_threshold", self.congestion.loss_threshold),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(field, v, "must be finite and not negative"));
            }
        }
        if !(self.congestion.delta_t_rec.is_finite() && self.congestion.delta_t_rec > 0.0) {
            return Err(invalid(
                "congestion.delta_t_rec",
                self.congestion.delta_t_rec,
                "must be positive (0 can make recovery endless)",
            ));
        }
        if self.cache_block_msgs == 0 {
            return Err(invalid(
                "cache_block_msgs",
                self.cache_block_msgs,
                "must be at least 1",
            ));
        }
        for (field, d) in [
            ("token_interval", self.token_interval),
            ("token_interval_min", self.token_interval_min),
            ("token_timeout", self.token_timeout),
            ("silence_interval", self.silence_interval),
            ("silence_idle_interval", self.silence_idle_interval),
            ("silence_idle_interval_max", self.silence_idle_interval_max),
            ("repair_timeout", self.repair_timeout),
            ("repair_interval", self.repair_interval),
            ("repair_queue_ttl", self.repair_queue_ttl),
            ("doubt_sample_interval", self.doubt_sample_interval),
            ("congestion.dcq_interval", self.congestion.dcq_interval),
            ("congestion.t_no_uca", self.congestion.t_no_uca),
            ("token_handoff_timeout", self.token_handoff_timeout),
            (
                "recovery.nack_window_initial",
                self.recovery.nack_window_initial,
            ),
            ("recovery.nack_size", self.recovery.nack_size),
        ] {
            if d.is_zero() {
                return Err(invalid(field, d, "must be positive"));
            }
        }
        if self.token_interval_min > self.token_interval {
            return Err(invalid(
                "token_interval_min",
                self.token_interval_min,
                "must not exceed token_interval",
            ));
        }
        if self.token_timeout <= self.token_interval {
            return Err(invalid(
                "token_timeout",
                self.token_timeout,
                "must exceed token_interval",
            ));
        }
        if self.congestion.queue_delay_baseline < self.doubt_sample_interval {
            return Err(invalid(
                "congestion.queue_delay_baseline",
                self.congestion.queue_delay_baseline,
                "must be at least doubt_sample_interval",
            ));
        }
        Ok(())
    }

    /// Whether something reads the doubt horizons (the sender's clock that silences carry):
    /// congestion control (the rates a receiver reports) or the adaptive NACK window (a
    /// stream's message rate). Only then are they sampled, and only without them do silences
    /// back off.
    pub(crate) fn reads_doubt_horizons(&self) -> bool {
        self.congestion.control.reads_doubt_horizons()
            || self.recovery.pacing.reads_doubt_horizons()
    }

    /// How many doubt samples the queueing delay's baseline is the least of
    /// (`congestion.queue_delay_baseline` in whole `doubt_sample_interval`s, at least one).
    pub(crate) fn pdcc_queue_delay_history_samples(&self) -> usize {
        let samples = self.congestion.queue_delay_baseline.as_micros()
            / self.doubt_sample_interval.as_micros().max(1);
        usize::try_from(samples).unwrap_or(usize::MAX).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_relations_are_checked() {
        Config::default().validate().unwrap();
        let bad = Config {
            receive_window_msgs: 10,
            ..Config::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                field: "receive_window_msgs",
                ..
            })
        ));
        let bad = Config {
            max_datagram_bytes: 70_000,
            ..Config::default()
        };
        assert!(bad.validate().is_err());
        let bad = Config {
            token_timeout: Duration::from_millis(100),
            ..Config::default()
        };
        assert!(bad.validate().is_err());
    }
}
