//! The congestion experiments of paper 002 (Gryphon) as simulator scenarios: each builds a
//! [`Scenario`] with link events, runs it with and without congestion control, samples a time
//! series every 100 ms (publish rate, goodput, queues, repair traffic, NACK window, doubt horizon)
//! and sums it up against the targets of issue 6: goodput at least 90% of the bottleneck, largest
//! queue under 1 MB, recovery time, and the checker's verdict.
//!
//! The paper's topology is a broker tree (a publisher-hosting broker, an intermediate broker, two
//! subscriber-hosting brokers); ours is one sender multicasting into a region of receivers through
//! a switch. The intermediate broker's output queue towards a subscriber broker becomes the switch
//! port towards one receiver (its downlink), with a large buffer like the paper's 5 MB queues.

use std::fmt::Write as _;
use std::str::FromStr;
use std::time::Duration;

use tidings_proto::{NodeId, Time};

use crate::checker::Ledger;
use crate::report::RunReport;
use crate::scenario::{run_observed, LinkChange, LinkEvent, Scenario, ScenarioError, SimHost};
use crate::world::World;

/// Bytes a 1000-byte message occupies on the wire (packet header, message header, count).
const MESSAGE_WIRE_BYTES: usize = 1048;

/// A receiver's in-order progress counts as caught up when its doubt horizon is this close to the
/// sender's clock.
const CAUGHT_UP: Duration = Duration::from_millis(500);

/// The experiments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// Gryphon Figs. 2-3: one receiver's link is throttled to 60% of the publish rate; without
    /// congestion control its queue fills, overflows, repairs are lost too, and its goodput
    /// collapses.
    GryphonFig2,
    /// Gryphon Fig. 4: one receiver's link fails and comes back; without congestion control its
    /// recovery (repairs on top of new data) congests the link and it never catches up.
    GryphonFig4,
    /// Gryphon Figs. 9-11 (E2): the victim's link alternates between 60% and 150% of the
    /// offered load; the publish rate should track it and the queue stay small.
    GryphonFig9,
}

impl Experiment {
    /// Every experiment.
    pub const ALL: [Experiment; 3] = [
        Experiment::GryphonFig2,
        Experiment::GryphonFig4,
        Experiment::GryphonFig9,
    ];

    /// The name on the command line and of the files written.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Experiment::GryphonFig2 => "gryphon-fig2",
            Experiment::GryphonFig4 => "gryphon-fig4",
            Experiment::GryphonFig9 => "gryphon-fig9",
        }
    }

    /// One line on what it shows.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Experiment::GryphonFig2 => {
                "Gryphon Figs. 2-3: a receiver's link throttled to 60% of the publish rate"
            }
            Experiment::GryphonFig4 => "Gryphon Fig. 4: a receiver's link fails and comes back",
            Experiment::GryphonFig9 => {
                "Gryphon Figs. 9-11 (E2): a receiver's link alternates 60% / 150% of the load"
            }
        }
    }
}

impl FromStr for Experiment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Experiment::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Experiment::ALL.iter().map(|e| e.name()).collect();
                format!("unknown scenario {s:?}; known: {}", names.join(", "))
            })
    }
}

/// How an experiment is run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setup {
    /// Which experiment.
    pub experiment: Experiment,
    /// Gryphon's congestion control on (PDCC and the NACK window) or off (the sender publishes
    /// at its offered rate within its window, receivers ask for every gap at once).
    pub congestion_control: bool,
    /// The reduced size CI runs (shorter phases) instead of the full one.
    pub reduced: bool,
    /// Length of the link failure of [`Experiment::GryphonFig4`] (the paper: 120 s). Default
    /// 30 s (full) or 10 s (reduced).
    pub outage: Option<Duration>,
    /// Seed.
    pub seed: u64,
}

impl Setup {
    /// An experiment at full size, seed 1.
    #[must_use]
    pub fn new(experiment: Experiment, congestion_control: bool) -> Setup {
        Setup {
            experiment,
            congestion_control,
            reduced: false,
            outage: None,
            seed: 1,
        }
    }

    /// The receiver whose link is throttled or fails.
    #[must_use]
    pub fn victim(&self) -> NodeId {
        NodeId(self.scenario().nodes - 1)
    }

    fn secs(&self, full: f64, reduced: f64) -> f64 {
        if self.reduced {
            reduced
        } else {
            full
        }
    }

    /// When the bottleneck or the failure starts.
    #[must_use]
    pub fn onset(&self) -> Time {
        Time::ZERO + Duration::from_secs_f64(self.secs(4.0, 3.0))
    }

    /// When the failed link comes back (the onset for the bottleneck experiment).
    #[must_use]
    pub fn restore(&self) -> Time {
        match self.experiment {
            Experiment::GryphonFig2 | Experiment::GryphonFig9 => self.onset(),
            Experiment::GryphonFig4 => self.onset() + self.outage_duration(),
        }
    }

    /// The buffer of the victim's switch port: the paper's 5 MB output queues; 1 MiB for the
    /// bottleneck at reduced size (so the queue overflows within the shorter run).
    #[must_use]
    pub fn port_buffer_bytes(&self) -> usize {
        if self.reduced && self.experiment == Experiment::GryphonFig2 {
            1 << 20
        } else {
            5 << 20
        }
    }

    /// Length of each phase of the alternating limit: the paper's 120 s (15 s reduced).
    fn phase(&self) -> Duration {
        Duration::from_secs_f64(self.secs(120.0, 15.0))
    }

    /// What the victim's link carries at `t_s` seconds, messages per second.
    #[must_use]
    pub fn capacity_at(&self, t_s: f64) -> f64 {
        let per_msg_bits = MESSAGE_WIRE_BYTES as f64 * 8.0;
        let full = 100e6 / per_msg_bits;
        let onset = (self.onset() - Time::ZERO).as_secs_f64();
        match self.experiment {
            Experiment::GryphonFig2 if t_s >= onset => self.bottleneck_bps() as f64 / per_msg_bits,
            Experiment::GryphonFig4 => self.bottleneck_bps() as f64 / per_msg_bits,
            Experiment::GryphonFig9 if t_s >= onset => {
                let phase = ((t_s - onset) / self.phase().as_secs_f64()) as u64;
                let share = if phase == 1 { 1.5 } else { 0.6 };
                self.offered_rate() * share
            }
            _ => full,
        }
    }

    fn outage_duration(&self) -> Duration {
        self.outage
            .unwrap_or(Duration::from_secs_f64(self.secs(30.0, 10.0)))
    }

    /// The bottleneck the experiment imposes, bits per second (the victim's link): 60% of the
    /// offered load for the bottleneck (the paper: 60 KB/s), three times the offered load for the
    /// failed link (the paper: 250 KB/s, enough without a failure).
    #[must_use]
    pub fn bottleneck_bps(&self) -> u64 {
        let offered_bps = self.offered_rate() * MESSAGE_WIRE_BYTES as f64 * 8.0;
        let share = match self.experiment {
            Experiment::GryphonFig2 | Experiment::GryphonFig9 => 0.6,
            Experiment::GryphonFig4 => 3.0,
        };
        (offered_bps * share) as u64
    }

    /// The sender's offered rate, messages per second: the paper's 500.
    #[must_use]
    pub fn offered_rate(&self) -> f64 {
        500.0
    }

    /// The scenario: 1 sender and 10 receivers on 100 Mbit/s links, 1000-byte messages at the
    /// offered rate, and the experiment's link events on the last receiver.
    #[must_use]
    pub fn scenario(&self) -> Scenario {
        let nodes = 11;
        let victim = NodeId(nodes - 1);
        let mut s = Scenario {
            nodes,
            senders: 1,
            topics: 1,
            seed: self.seed,
            publish_rate: Some(self.offered_rate()),
            drain_seconds: self.secs(30.0, 10.0),
            ..Scenario::default()
        };
        s.proto.congestion_control = self.congestion_control;
        s.proto.adaptive_nack_window = self.congestion_control;
        if !self.congestion_control {
            // No SDCC either: a receiver asks for every gap in its receive window at once.
            s.proto.repair_inflight_max = s.proto.receive_window_msgs;
        }
        let at = self.onset();
        match self.experiment {
            Experiment::GryphonFig2 => {
                s.seconds = self.secs(130.0, 50.0);
                s.link_events.push(LinkEvent {
                    at,
                    node: victim,
                    change: LinkChange::Downlink {
                        bandwidth_bps: self.bottleneck_bps(),
                        buffer_bytes: self.port_buffer_bytes(),
                    },
                });
            }
            Experiment::GryphonFig9 => {
                s.seconds = (at - Time::ZERO + self.phase() * 3).as_secs_f64();
                let offered_bps = self.offered_rate() * MESSAGE_WIRE_BYTES as f64 * 8.0;
                for (k, share) in [0.6, 1.5, 0.6].into_iter().enumerate() {
                    s.link_events.push(LinkEvent {
                        at: at + self.phase() * k as u32,
                        node: victim,
                        change: LinkChange::Downlink {
                            bandwidth_bps: (offered_bps * share) as u64,
                            buffer_bytes: self.port_buffer_bytes(),
                        },
                    });
                }
            }
            Experiment::GryphonFig4 => {
                // Publishing goes on for a while after the link comes back.
                s.seconds = (self.restore() - Time::ZERO).as_secs_f64() + self.secs(40.0, 15.0);
                // The sender keeps publishing through the outage (Gryphon's pubend logs to disk):
                // its window holds everything the failed receiver misses.
                let outage_msgs =
                    (self.offered_rate() * self.outage_duration().as_secs_f64()).ceil() as usize;
                let window = (outage_msgs * 2).max(s.proto.window_msgs_max);
                s.proto.window_msgs_max = window;
                s.proto.window_bytes_max = window * 1024;
                s.proto.receive_window_msgs = window * 2;
                if !self.congestion_control {
                    s.proto.repair_inflight_max = s.proto.receive_window_msgs;
                }
                s.link_events.push(LinkEvent {
                    at: Time::ZERO,
                    node: victim,
                    change: LinkChange::Downlink {
                        bandwidth_bps: self.bottleneck_bps(),
                        buffer_bytes: self.port_buffer_bytes(),
                    },
                });
                s.link_events.push(LinkEvent {
                    at,
                    node: victim,
                    change: LinkChange::Outage {
                        duration: self.outage_duration(),
                    },
                });
            }
        }
        s
    }
}

/// One sample of the time series (rates over the 100 ms before `t_s`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Row {
    /// Simulated seconds.
    pub t_s: f64,
    /// Messages the sender published per second.
    pub publish_rate: f64,
    /// The publish rate PDCC allows, messages per second (0: not throttled).
    pub pdcc_rate: f64,
    /// Messages delivered in order per second at the victim.
    pub goodput_victim: f64,
    /// Messages delivered in order per second at a healthy receiver.
    pub goodput_other: f64,
    /// Bytes queued at the switch port towards the victim.
    pub victim_queue_bytes: usize,
    /// Most bytes queued at any link now.
    pub queue_bytes_max: usize,
    /// Messages the sender holds unstable.
    pub sender_unstable_msgs: u64,
    /// Retransmitted messages per second, all nodes (push, pull and NAK answers).
    pub retransmits: f64,
    /// Packets per second tail-dropped at the victim's port.
    pub victim_tail_drops: f64,
    /// The victim's NACK window, messages.
    pub nack_window: u64,
    /// The victim's smoothed doubt horizon rate (tick-seconds per second).
    pub doubt_rate: f64,
    /// How far the victim's doubt horizon trails the sender's clock, seconds.
    pub lag_s: f64,
}

/// The figures that matter, against the targets of issue 6.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Goodput at the victim as a share of what its link can carry (or of the offered rate, if
    /// lower): for the bottleneck, from the onset plus 5 s to the end of publishing; for the
    /// failed link, during the recovery.
    pub goodput_share: f64,
    /// The sender's publish rate from the onset (or restore) to the end of publishing, as a
    /// share of the offered rate.
    pub publish_share: f64,
    /// Most bytes ever queued at any link (exact, from the link counters).
    pub queue_bytes_max: usize,
    /// Most messages the sender held unstable.
    pub sender_unstable_max: u64,
    /// From the restore (or onset) until the victim last caught up for good; `None` if it was
    /// still behind at the end of publishing.
    pub recovery_s: Option<f64>,
    /// The checker's verdict ("pass" or "fail").
    pub verdict: &'static str,
}

impl Summary {
    /// No collapse: queues under 1 MB, the victim recovered, the checker passed, and (for the
    /// bottleneck) goodput at least 90% of it.
    #[must_use]
    pub fn meets_targets(&self, experiment: Experiment) -> bool {
        let goodput_ok = match experiment {
            Experiment::GryphonFig2 | Experiment::GryphonFig9 => self.goodput_share >= 0.9,
            Experiment::GryphonFig4 => true,
        };
        goodput_ok
            && self.queue_bytes_max < 1_000_000
            && self.recovery_s.is_some()
            && self.verdict == "pass"
    }
}

/// A finished experiment run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// How it was run.
    pub setup: Setup,
    /// The time series.
    pub rows: Vec<Row>,
    /// The sums.
    pub summary: Summary,
    /// The run's report.
    pub report: RunReport,
}

#[derive(Default)]
struct Prev {
    t: f64,
    published: u64,
    delivered_victim: u64,
    delivered_other: u64,
    retransmits: u64,
    tail_drops: u64,
}

fn retransmits(world: &World<SimHost>) -> u64 {
    world
        .hosts()
        .iter()
        .map(|h| {
            let s = h.node().stats();
            s.messages_pushed + s.messages_resent_on_pull + s.messages_resent_on_nak
        })
        .sum()
}

fn sample(now: Time, world: &World<SimHost>, victim: NodeId, prev: &mut Prev) -> Row {
    let t = now.as_nanos() as f64 / 1e9;
    let dt = (t - prev.t).max(1e-9);
    let sender = world.host(NodeId(0)).node().stats();
    let v = world.host(victim).node();
    let other = world.host(NodeId(1)).node().stats();
    let published = sender.messages_published;
    let delivered_victim = v.stats().messages_delivered;
    let delivered_other = other.messages_delivered;
    let retx = retransmits(world);
    let drops = world.stats().nodes[victim.0 as usize].drops.tail_drop_down;
    let queue_bytes_max = (0..world.hosts().len())
        .map(|i| {
            let n = NodeId(i as u32);
            world
                .uplink(n)
                .queued_bytes_at(now)
                .max(world.downlink(n).queued_bytes_at(now))
        })
        .max()
        .unwrap_or(0);
    let stream = v
        .stream_reports()
        .into_iter()
        .find(|r| r.origin == NodeId(0));
    let row = Row {
        t_s: t,
        publish_rate: (published - prev.published) as f64 / dt,
        pdcc_rate: sender.publish_rate_milli_current as f64 / 1000.0,
        goodput_victim: (delivered_victim - prev.delivered_victim) as f64 / dt,
        goodput_other: (delivered_other - prev.delivered_other) as f64 / dt,
        victim_queue_bytes: world.downlink(victim).queued_bytes_at(now),
        queue_bytes_max,
        sender_unstable_msgs: sender.unstable_msgs_current,
        retransmits: (retx - prev.retransmits) as f64 / dt,
        victim_tail_drops: drops.saturating_sub(prev.tail_drops) as f64 / dt,
        nack_window: v.stats().nack_window_msgs_current,
        doubt_rate: stream.and_then(|s| s.doubt_rate).unwrap_or(0.0),
        lag_s: stream.map_or(0.0, |s| {
            now.as_micros().saturating_sub(s.doubt_horizon_us) as f64 / 1e6
        }),
    };
    *prev = Prev {
        t,
        published,
        delivered_victim,
        delivered_other,
        retransmits: retx,
        tail_drops: drops,
    };
    row
}

/// Runs one experiment.
pub fn run_experiment(setup: &Setup) -> Result<Outcome, ScenarioError> {
    run_variant(setup, &setup.scenario())
}

/// Runs one experiment with a changed scenario (other protocol parameters, say); `s` should be
/// `setup.scenario()` with changes that keep its link events.
pub fn run_variant(setup: &Setup, s: &Scenario) -> Result<Outcome, ScenarioError> {
    let victim = setup.victim();
    let mut rows = Vec::new();
    let mut prev = Prev::default();
    let mut links_max = 0usize;
    let report = run_observed(
        s,
        &mut |_| {},
        &mut |now, world: &World<SimHost>, _: &Ledger| {
            rows.push(sample(now, world, victim, &mut prev));
            links_max = (0..world.hosts().len())
                .map(|i| {
                    let n = NodeId(i as u32);
                    world
                        .uplink(n)
                        .stats()
                        .queued_bytes_max
                        .max(world.downlink(n).stats().queued_bytes_max)
                })
                .max()
                .unwrap_or(0);
        },
    )?;
    let summary = summarize(setup, s, &rows, links_max, &report);
    Ok(Outcome {
        setup: *setup,
        rows,
        summary,
        report,
    })
}

fn summarize(
    setup: &Setup,
    s: &Scenario,
    rows: &[Row],
    queue_bytes_max: usize,
    report: &RunReport,
) -> Summary {
    let publish_end = s.seconds;
    let restore = setup.restore().as_nanos() as f64 / 1e9;
    let capacity = setup.bottleneck_bps() as f64 / 8.0 / MESSAGE_WIRE_BYTES as f64;
    let after: Vec<&Row> = rows
        .iter()
        .filter(|r| r.t_s >= restore && r.t_s <= publish_end)
        .collect();
    let recovery_s = match setup.experiment {
        // Until the queue the onset built up at the victim's port (its peak within 10 s) has
        // drained below a tenth of it.
        Experiment::GryphonFig2 | Experiment::GryphonFig9 => {
            let (peak_at, peak) = after
                .iter()
                .filter(|r| r.t_s <= restore + 10.0)
                .map(|r| (r.t_s, r.victim_queue_bytes))
                .fold((restore, 0), |a, b| if b.1 > a.1 { b } else { a });
            after
                .iter()
                .find(|r| r.t_s > peak_at && r.victim_queue_bytes * 10 <= peak)
                .map(|r| r.t_s - restore)
        }
        // Until the victim's doubt horizon is within 0.5 s of the sender's clock again.
        Experiment::GryphonFig4 => after
            .iter()
            .find(|r| r.lag_s <= CAUGHT_UP.as_secs_f64())
            .map(|r| r.t_s - restore),
    };
    let mean = |rows: &[&Row], f: &dyn Fn(&Row) -> f64| {
        rows.iter().map(|r| f(r)).sum::<f64>() / rows.len().max(1) as f64
    };
    let goodput_share = match setup.experiment {
        // In steady state: from 5 s after the onset (congestion control needs a few query
        // intervals to find the rate) to the end of publishing, against what the link carries.
        Experiment::GryphonFig2 | Experiment::GryphonFig9 => {
            let steady: Vec<&Row> = after
                .iter()
                .copied()
                .filter(|r| r.t_s > restore + 5.0)
                .collect();
            mean(&steady, &|r| r.goodput_victim)
                / mean(&steady, &|r| {
                    setup.capacity_at(r.t_s).min(setup.offered_rate())
                })
        }
        // During the recovery (to the end of publishing if it never ends): how much of the
        // victim's link carried messages it needed.
        Experiment::GryphonFig4 => {
            let until = restore + recovery_s.unwrap_or(publish_end);
            let recovering: Vec<&Row> = after
                .iter()
                .copied()
                .filter(|r| r.t_s > restore && r.t_s <= until.max(restore + 0.1))
                .collect();
            mean(&recovering, &|r| r.goodput_victim) / capacity
        }
    };
    let publish_share = mean(&after, &|r| r.publish_rate) / setup.offered_rate();
    Summary {
        goodput_share,
        publish_share,
        queue_bytes_max,
        sender_unstable_max: report.pending_ack_max,
        recovery_s,
        verdict: report.verdict,
    }
}

/// The header of [`to_csv`].
pub const CSV_HEADER: &str = "t_s,publish_rate_msgs,pdcc_rate_msgs,goodput_victim_msgs,goodput_other_msgs,victim_queue_bytes,queue_bytes_max,sender_unstable_msgs,retransmits_msgs,victim_tail_drops_pkts,nack_window_msgs,doubt_rate,lag_s";

/// The time series as CSV (one row per 100 ms; rates per second).
#[must_use]
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in rows {
        let _ = writeln!(
            out,
            "{:.1},{:.0},{:.0},{:.0},{:.0},{},{},{},{:.0},{:.0},{},{:.3},{:.3}",
            r.t_s,
            r.publish_rate,
            r.pdcc_rate,
            r.goodput_victim,
            r.goodput_other,
            r.victim_queue_bytes,
            r.queue_bytes_max,
            r.sender_unstable_msgs,
            r.retransmits,
            r.victim_tail_drops,
            r.nack_window,
            r.doubt_rate,
            r.lag_s
        );
    }
    out
}

impl Outcome {
    /// One line of figures.
    #[must_use]
    pub fn summary_line(&self) -> String {
        let s = &self.summary;
        format!(
            "{} (congestion control {}): goodput {:.0}% of the bottleneck, published {:.0}% of the offered rate, largest queue {:.0} KiB, sender unstable max {} msgs, recovery {}, checker {}, throughput {:.0} msgs/s",
            self.setup.experiment.name(),
            if self.setup.congestion_control { "on" } else { "off" },
            s.goodput_share * 100.0,
            s.publish_share * 100.0,
            s.queue_bytes_max as f64 / 1024.0,
            s.sender_unstable_max,
            s.recovery_s.map_or("never".to_string(), |r| format!("{r:.1} s")),
            s.verdict,
            self.report.throughput_msgs_per_sec,
        )
    }
}
