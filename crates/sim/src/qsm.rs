//! The evaluation of paper 000 (QSM, section 4) as simulator scenarios: each figure sweeps one
//! axis (nodes, token rate, caching replicas, publish rate, topics) over runs of the paper's
//! setup (switched 100 Mbit/s, 1000-byte messages, senders publishing as fast as flow control
//! allows, one region of every node subscribed to every topic), and records per run the
//! throughput, the messages pending ACK, the sender's memory, token round trips, latency and the
//! delivery checker's verdict.
//!
//! The simulator models the network, the protocol and a fixed CPU cost per datagram, not the
//! paper's .NET runtime: its garbage collector and allocation costs, which the paper blames for
//! most of its slowdowns, have no counterpart here. "Memory" is what the protocol holds: message
//! data a sender keeps until it is stable, and what receivers cache for recovery.

use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;

use tidings_proto::{NodeId, Time};

use crate::checker::Ledger;
use crate::fault::FaultSpec;
use crate::plot::{colour, nice_ceiling, render, Panel, Series, XAxis};
use crate::scenario::{run_observed, Scenario, ScenarioError, SimHost};
use crate::world::World;

/// Payload bytes of a message (the paper's 1000-byte arrays).
pub const MESSAGE_BYTES: usize = 1000;
/// Each sender's publish rate with two senders, msgs/s: together just under what one sender gets
/// through a receiver's 100 Mbit/s link alone (11,926 msgs/s), the paper's "highest combined
/// send rate that the system could sustain"; unlimited, two senders overrun every receiver's
/// link.
pub const TWO_SENDER_RATE: f64 = 5_850.0;
/// The paper's perturbed node sleeps: every 5 s it stops for 0.5 s.
pub const SLEEP: &str = "freeze:500ms:5s";
/// The paper's perturbed node loses packets: every 1 s it drops everything for 10 ms.
pub const LOSS: &str = "blackout:10ms:1s";

/// The figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// Figs. 15, 20 and 21: throughput, messages pending ACK, sender memory and token round
    /// trips against the number of nodes, 1 and 2 senders.
    Fig15,
    /// Fig. 22: the token release rate varied.
    Fig22,
    /// Figs. 26-27: the caching replicas per message varied.
    Fig26,
    /// Figs. 28-33: one perturbed receiver (sleeps; bursts of loss) against the number of nodes.
    Fig28,
    /// Fig. 38: send-to-receive latency against the publish rate (light to full load).
    Fig38,
    /// Figs. 40-46: 1 to 10,000 topics, every node subscribed to all, published round robin.
    Fig40,
}

impl Figure {
    /// Every figure.
    pub const ALL: [Figure; 6] = [
        Figure::Fig15,
        Figure::Fig22,
        Figure::Fig26,
        Figure::Fig28,
        Figure::Fig38,
        Figure::Fig40,
    ];

    /// The name on the command line and of the files written.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Figure::Fig15 => "qsm-fig15",
            Figure::Fig22 => "qsm-fig22",
            Figure::Fig26 => "qsm-fig26",
            Figure::Fig28 => "qsm-fig28",
            Figure::Fig38 => "qsm-fig38",
            Figure::Fig40 => "qsm-fig40",
        }
    }

    /// The plot's title.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Figure::Fig15 => "QSM Figs. 15, 20-21: scaling in nodes (1 topic)",
            Figure::Fig22 => "QSM Fig. 22: token release rate varied",
            Figure::Fig26 => "QSM Figs. 26-27: caching replicas per message varied",
            Figure::Fig28 => "QSM Figs. 28-33: one perturbed receiver (1 sender, 1 topic)",
            Figure::Fig38 => "QSM Fig. 38: send-to-receive latency against the publish rate",
            Figure::Fig40 => "QSM Figs. 40-46: topics (1 sender, all nodes on all topics)",
        }
    }

    /// What the x axis is.
    #[must_use]
    pub fn x_label(self) -> &'static str {
        match self {
            Figure::Fig15 | Figure::Fig28 => "x: nodes (senders and receivers, log scale)",
            Figure::Fig22 => "x: tokens released per second (log scale)",
            Figure::Fig26 => "x: caching replicas per message (log scale)",
            Figure::Fig38 => "x: publish rate (msgs/s, log scale)",
            Figure::Fig40 => "x: topics (log scale)",
        }
    }

    /// The variants compared, in plotting order.
    #[must_use]
    pub fn variants(self) -> &'static [&'static str] {
        match self {
            Figure::Fig15 => &["1 sender", "2 senders"],
            Figure::Fig22 | Figure::Fig26 | Figure::Fig40 => &["1 sender"],
            Figure::Fig28 => &["unperturbed", "sleep", "loss"],
            Figure::Fig38 => &["1000 B", "100 B"],
        }
    }

    /// The x values swept (`reduced`: the few CI runs).
    #[must_use]
    pub fn xs(self, reduced: bool) -> Vec<f64> {
        let (full, small): (&[f64], &[f64]) = match self {
            Figure::Fig15 => (
                &[
                    3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 500.0, 1000.0,
                ],
                &[5.0, 20.0],
            ),
            Figure::Fig22 => (&[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0], &[2.0, 20.0]),
            Figure::Fig26 => (&[2.0, 5.0, 10.0, 20.0, 50.0, 96.0, 192.0], &[2.0, 10.0]),
            Figure::Fig28 => (
                &[10.0, 20.0, 50.0, 100.0, 200.0, 300.0, 500.0, 1000.0],
                &[5.0, 10.0],
            ),
            Figure::Fig38 => (
                &[
                    100.0, 300.0, 1000.0, 2000.0, 4000.0, 6000.0, 8000.0, 10000.0, 11000.0,
                    11500.0, 11900.0,
                ],
                &[200.0, 2000.0],
            ),
            Figure::Fig40 => (&[1.0, 10.0, 100.0, 1000.0, 3000.0, 10000.0], &[1.0, 1000.0]),
        };
        if reduced { small } else { full }.to_vec()
    }
}

impl FromStr for Figure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Figure::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown scenario {s:?}"))
    }
}

/// One run of a figure: one x value of one variant.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The x value.
    pub x: f64,
    /// Index into [`Figure::variants`].
    pub variant: usize,
    /// Nodes of the run.
    pub nodes: u32,
    /// Messages delivered per second per receiver, over the second half of publishing.
    pub throughput_msgs: f64,
    /// Mean over 100 ms samples of messages pending ACK per sender.
    pub pending_ack_mean: f64,
    /// Most messages any sender held pending ACK.
    pub pending_ack_max: u64,
    /// Most payload bytes a sender held unsent or unstable.
    pub sender_bytes_max: u64,
    /// Most messages any receiver cached for recovery, times the payload size.
    pub receiver_cache_bytes_max: u64,
    /// Most messages the perturbed (last) node cached, times the payload size.
    pub perturbed_cache_bytes_max: u64,
    /// Share of the messages the perturbed (last) node received that came by repair (the loss
    /// it saw and had repaired).
    pub perturbed_repaired_share: f64,
    /// Region-level (top ring) token round trip, median, ms.
    pub token_rtt_p50_ms: f64,
    /// Region-level token round trip, 99th percentile, ms.
    pub token_rtt_p99_ms: f64,
    /// Partition (and intermediate) ring round trip, median, ms: a region's state aggregates
    /// over these and the top ring.
    pub partition_rtt_p50_ms: f64,
    /// Publish to stable (the sender may drop it), median, ms.
    pub stable_p50_ms: f64,
    /// Publish to delivery, median, ms.
    pub latency_p50_ms: f64,
    /// Publish to delivery, 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// Regions formed.
    pub regions: usize,
    /// The checker's verdict ("pass" or "fail").
    pub verdict: &'static str,
    /// The command that replays the figure this run belongs to.
    pub replay: String,
}

/// How a figure is run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setup {
    /// Which figure.
    pub figure: Figure,
    /// The reduced size CI runs (two x values, short runs, small clusters).
    pub reduced: bool,
    /// Seed.
    pub seed: u64,
    /// Seconds of publishing (default: 5, reduced 2; Fig. 28 10, reduced 5.5, so that a sleep
    /// falls inside the measured half).
    pub seconds: Option<f64>,
}

impl Setup {
    /// A figure's setup with the default length.
    #[must_use]
    pub fn new(figure: Figure, reduced: bool, seed: u64) -> Setup {
        Setup {
            figure,
            reduced,
            seed,
            seconds: None,
        }
    }

    /// Seconds of publishing; throughput is measured over its second half.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        self.seconds.unwrap_or(match (self.figure, self.reduced) {
            (Figure::Fig28, false) => 10.0,
            (Figure::Fig28, true) => 5.5,
            (_, false) => 5.0,
            (_, true) => 2.0,
        })
    }

    /// Nodes of the runs whose x is not the number of nodes (the paper's 192 receivers for
    /// Figs. 22 and 26, 110 for Fig. 40, 100 for Fig. 38; reduced: 20 and 10).
    fn fixed_nodes(&self) -> u32 {
        match (self.figure, self.reduced) {
            (Figure::Fig22 | Figure::Fig26, false) => 193,
            (Figure::Fig40, false) => 111,
            (Figure::Fig38, false) => 101,
            (Figure::Fig22 | Figure::Fig26, true) => 20,
            (_, true) => 10,
            _ => 100,
        }
    }

    /// The scenario of one point.
    #[must_use]
    pub fn scenario(&self, x: f64, variant: usize) -> Scenario {
        let mut s = Scenario {
            nodes: self.fixed_nodes(),
            senders: 1,
            topics: 1,
            profiles: Some(1),
            seconds: self.seconds(),
            drain_seconds: 30.0,
            seed: self.seed,
            message_bytes: MESSAGE_BYTES,
            ..Scenario::default()
        };
        match self.figure {
            Figure::Fig15 => {
                s.nodes = x as u32;
                s.senders = variant as u32 + 1;
                if s.senders == 2 {
                    s.publish_rate = Some(TWO_SENDER_RATE);
                }
            }
            Figure::Fig22 => {
                // Fixed-rate tokens, as the paper's: no pacing.
                let interval = std::time::Duration::from_secs_f64(1.0 / x);
                s.proto.token_interval = interval;
                s.proto.token_interval_min = interval;
                s.proto.token_timeout = s.proto.token_timeout.max(interval * 3);
            }
            Figure::Fig26 => {
                s.replication = x as usize;
            }
            Figure::Fig28 => {
                s.nodes = x as u32;
                s.flaky = 1;
                s.faults = match variant {
                    0 => FaultSpec::NONE,
                    1 => SLEEP.parse().unwrap_or(FaultSpec::NONE),
                    _ => LOSS.parse().unwrap_or(FaultSpec::NONE),
                };
            }
            Figure::Fig38 => {
                s.publish_rate = Some(x);
                s.message_bytes = if variant == 0 { MESSAGE_BYTES } else { 100 };
            }
            Figure::Fig40 => {
                s.topics = x as u32;
                s.round_robin_topics = true;
            }
        }
        s
    }

    /// The command that replays the figure (every point of it: the runs are deterministic).
    #[must_use]
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "tidings sim run --scenario {} --seed {}",
            self.figure.name(),
            self.seed
        );
        if self.reduced {
            cmd += " --reduced";
        }
        if let Some(sec) = self.seconds {
            cmd += &format!(" --seconds {sec}");
        }
        cmd
    }

    /// Runs one point.
    pub fn run_point(&self, x: f64, variant: usize) -> Result<Point, ScenarioError> {
        let s = self.scenario(x, variant);
        let from = s.seconds / 2.0;
        let to = s.seconds;
        let receivers: Vec<NodeId> = (s.senders..s.nodes).map(NodeId).collect();
        let delivered = |world: &World<SimHost>| {
            receivers
                .iter()
                .map(|&n| world.host(n).node().stats().messages_delivered)
                .sum::<u64>()
        };
        let (mut at_from, mut at_to) = (None, None);
        let mut sender_bytes_max = 0u64;
        let last = NodeId(s.nodes - 1);
        // After publishing, each sample keeps the latest per-node numbers (maxima and totals,
        // so the last sample holds the run's).
        let (mut cache_msgs_max, mut perturbed_cache_msgs, mut repaired_share) = (0u64, 0u64, 0.0);
        let report = run_observed(
            &s,
            &mut |_| {},
            &mut |now: Time, world: &World<SimHost>, _: &Ledger| {
                let t = now.as_nanos() as f64 / 1e9;
                if at_from.is_none() && t >= from - 1e-9 {
                    at_from = Some(delivered(world));
                }
                if t >= to - 1e-9 {
                    if at_to.is_none() {
                        at_to = Some(delivered(world));
                    }
                    for i in 0..s.senders {
                        let st = world.host(NodeId(i)).node().stats();
                        sender_bytes_max = sender_bytes_max.max(st.held_bytes_max);
                    }
                    cache_msgs_max = receivers
                        .iter()
                        .map(|&n| world.host(n).node().stats().cache_msgs_max)
                        .max()
                        .unwrap_or(0);
                    let st = world.host(last).node().stats();
                    perturbed_cache_msgs = st.cache_msgs_max;
                    repaired_share =
                        st.repairs_received as f64 / st.messages_received.max(1) as f64;
                }
            },
        )?;
        let d0 = at_from.unwrap_or_default();
        let d1 = at_to.unwrap_or(d0);
        let span = to - from;
        let bytes = s.message_bytes as u64;
        Ok(Point {
            x,
            variant,
            nodes: s.nodes,
            throughput_msgs: (d1 - d0) as f64 / receivers.len().max(1) as f64 / span,
            pending_ack_mean: report.pending_ack_mean,
            pending_ack_max: report.pending_ack_max,
            sender_bytes_max,
            receiver_cache_bytes_max: cache_msgs_max * bytes,
            perturbed_cache_bytes_max: perturbed_cache_msgs * bytes,
            perturbed_repaired_share: repaired_share,
            token_rtt_p50_ms: report.token_rtt_ms.p50,
            token_rtt_p99_ms: report.token_rtt_ms.p99,
            partition_rtt_p50_ms: report.partition_token_rtt_ms.p50,
            stable_p50_ms: report.time_to_stable_ms.p50,
            latency_p50_ms: report.latency_ms.p50,
            latency_p99_ms: report.latency_ms.p99,
            regions: report.regions,
            verdict: report.verdict,
            replay: self.replay_command(),
        })
    }

    /// Runs every point of the figure, each x for every variant before the next x (so an
    /// interrupted sweep compares the variants as far as it got), calling `progress` with the
    /// points so far after each.
    pub fn run(&self, progress: &mut dyn FnMut(&[Point])) -> Result<Vec<Point>, ScenarioError> {
        let mut points = Vec::new();
        for x in self.figure.xs(self.reduced) {
            for variant in 0..self.figure.variants().len() {
                points.push(self.run_point(x, variant)?);
                progress(&points);
            }
        }
        Ok(points)
    }
}

/// The header of [`to_csv`].
pub const CSV_HEADER: &str = "x,variant,nodes,throughput_msgs,pending_ack_mean,pending_ack_max,sender_bytes_max,receiver_cache_bytes_max,perturbed_cache_bytes_max,perturbed_repaired_share,token_rtt_p50_ms,token_rtt_p99_ms,partition_rtt_p50_ms,stable_p50_ms,latency_p50_ms,latency_p99_ms,regions,verdict";

/// The points as CSV, one row per run.
#[must_use]
pub fn to_csv(figure: Figure, points: &[Point]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{},{:.0},{:.1},{},{},{},{},{:.4},{:.1},{:.1},{:.1},{:.1},{:.2},{:.2},{},{}",
            p.x,
            figure.variants()[p.variant],
            p.nodes,
            p.throughput_msgs,
            p.pending_ack_mean,
            p.pending_ack_max,
            p.sender_bytes_max,
            p.receiver_cache_bytes_max,
            p.perturbed_cache_bytes_max,
            p.perturbed_repaired_share,
            p.token_rtt_p50_ms,
            p.token_rtt_p99_ms,
            p.partition_rtt_p50_ms,
            p.stable_p50_ms,
            p.latency_p50_ms,
            p.latency_p99_ms,
            p.regions,
            p.verdict
        );
    }
    out
}

/// The points of a CSV written by [`to_csv`] (to draw a figure again without running it).
pub fn from_csv(figure: Figure, text: &str) -> Result<Vec<Point>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(CSV_HEADER) {
        return Err(format!("not a {} CSV: unexpected header", figure.name()));
    }
    lines
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.split(',').collect();
            let bad = |what: &str| format!("row {}: {what}", i + 1);
            if f.len() != CSV_HEADER.split(',').count() {
                return Err(bad("wrong number of fields"));
            }
            let num = |k: usize| f[k].parse::<f64>().map_err(|e| bad(&e.to_string()));
            let int = |k: usize| f[k].parse::<u64>().map_err(|e| bad(&e.to_string()));
            let variant = figure
                .variants()
                .iter()
                .position(|v| *v == f[1])
                .ok_or_else(|| bad("unknown variant"))?;
            Ok(Point {
                x: num(0)?,
                variant,
                nodes: int(2)? as u32,
                throughput_msgs: num(3)?,
                pending_ack_mean: num(4)?,
                pending_ack_max: int(5)?,
                sender_bytes_max: int(6)?,
                receiver_cache_bytes_max: int(7)?,
                perturbed_cache_bytes_max: int(8)?,
                perturbed_repaired_share: num(9)?,
                token_rtt_p50_ms: num(10)?,
                token_rtt_p99_ms: num(11)?,
                partition_rtt_p50_ms: num(12)?,
                stable_p50_ms: num(13)?,
                latency_p50_ms: num(14)?,
                latency_p99_ms: num(15)?,
                regions: int(16)? as usize,
                verdict: if f[17] == "pass" { "pass" } else { "fail" },
                replay: String::new(),
            })
        })
        .collect()
}

/// The panels of a figure: (title, value of a point).
type Metric = (&'static str, fn(&Point) -> f64);

fn metrics(figure: Figure) -> Vec<Metric> {
    let throughput: Metric = ("throughput (msgs/s per receiver)", |p| p.throughput_msgs);
    let pending: Metric = ("messages pending ACK (mean per sender)", |p| {
        p.pending_ack_mean
    });
    let sender_kb: Metric = ("sender memory: most message data held (KB)", |p| {
        p.sender_bytes_max as f64 / 1024.0
    });
    let rtt: Metric = (
        "token round trip of the region's top ring, median (ms)",
        |p| p.token_rtt_p50_ms,
    );
    let partition_rtt: Metric = ("token round trip of partition rings, median (ms)", |p| {
        p.partition_rtt_p50_ms
    });
    let stable: Metric = (
        "time to acknowledge (publish to stable), median (ms)",
        |p| p.stable_p50_ms,
    );
    match figure {
        Figure::Fig15 | Figure::Fig22 => {
            vec![throughput, pending, sender_kb, rtt, partition_rtt, stable]
        }
        Figure::Fig26 => vec![
            throughput,
            pending,
            rtt,
            partition_rtt,
            ("most a receiver caches (KB)", |p| {
                p.receiver_cache_bytes_max as f64 / 1024.0
            }),
        ],
        Figure::Fig28 => vec![
            throughput,
            (
                "loss at the perturbed node (% of its messages repaired)",
                |p| p.perturbed_repaired_share * 100.0,
            ),
            ("memory at the perturbed node: cache (KB)", |p| {
                p.perturbed_cache_bytes_max as f64 / 1024.0
            }),
            pending,
            rtt,
            partition_rtt,
            stable,
        ],
        Figure::Fig38 => vec![
            ("latency, median (ms)", |p| p.latency_p50_ms),
            ("latency, 99th percentile (ms)", |p| p.latency_p99_ms),
            throughput,
        ],
        Figure::Fig40 => vec![
            throughput,
            pending,
            sender_kb,
            ("most a receiver caches (KB)", |p| {
                p.receiver_cache_bytes_max as f64 / 1024.0
            }),
            rtt,
            partition_rtt,
        ],
    }
}

/// The plot: one panel per metric, one line per variant, x on a log scale.
#[must_use]
pub fn to_png(figure: Figure, points: &[Point]) -> Vec<u8> {
    let colours = [colour::BLUE, colour::RED, colour::GREEN];
    let panels: Vec<Panel> = metrics(figure)
        .into_iter()
        .map(|(title, f)| Panel {
            title: title.to_string(),
            y_max: nice_ceiling(points.iter().map(f).fold(0.0, f64::max)),
            series: (0..figure.variants().len())
                .map(|v| Series {
                    label: figure.variants()[v].to_string(),
                    colour: colours[v % colours.len()],
                    points: points
                        .iter()
                        .filter(|p| p.variant == v)
                        .map(|p| (p.x, f(p)))
                        .collect(),
                })
                .collect(),
        })
        .collect();
    let x_min = points.iter().map(|p| p.x).fold(f64::MAX, f64::min);
    let x_max = points.iter().map(|p| p.x).fold(1.0, f64::max);
    let x_min = if x_min < x_max { x_min } else { x_max / 10.0 };
    render(
        figure.title(),
        &[(figure.x_label().to_string(), panels)],
        XAxis::Log(x_min * 0.9, x_max * 1.1),
    )
}

/// Runs a figure and writes `<name>.csv` and `<name>.png` into `out`, again after each point (a
/// long sweep stopped early leaves the points it ran); calls `progress` with each new point and
/// returns them all.
pub fn run_and_write(
    setup: &Setup,
    out: &Path,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let name = setup.figure.name();
    let csv = out.join(format!("{name}.csv"));
    let png = out.join(format!("{name}.png"));
    let mut written: Result<(), String> = Ok(());
    let points = setup
        .run(&mut |points| {
            if let Some(p) = points.last() {
                progress(p);
            }
            if written.is_ok() {
                written = std::fs::write(&csv, to_csv(setup.figure, points))
                    .map_err(|e| format!("{}: {e}", csv.display()))
                    .and_then(|()| {
                        std::fs::write(&png, to_png(setup.figure, points))
                            .map_err(|e| format!("{}: {e}", png.display()))
                    });
            }
        })
        .map_err(|e| e.to_string())?;
    written?;
    Ok(points)
}

/// One line per point, for the terminal.
#[must_use]
pub fn point_line(figure: Figure, p: &Point) -> String {
    format!(
        "{} {} x={} nodes={}: throughput {:.0} msgs/s per receiver, pending ACK mean {:.0} max {}, sender held max {} KB, receiver cache max {} KB, perturbed node repaired {:.1}%, token rtt p50 {:.1} ms p99 {:.1} ms, partition rtt p50 {:.1} ms, stable p50 {:.0} ms, latency p50 {:.2} ms p99 {:.2} ms, regions {}, checker {}",
        figure.name(),
        figure.variants()[p.variant],
        p.x,
        p.nodes,
        p.throughput_msgs,
        p.pending_ack_mean,
        p.pending_ack_max,
        p.sender_bytes_max / 1024,
        p.receiver_cache_bytes_max / 1024,
        p.perturbed_repaired_share * 100.0,
        p.token_rtt_p50_ms,
        p.token_rtt_p99_ms,
        p.partition_rtt_p50_ms,
        p.stable_p50_ms,
        p.latency_p50_ms,
        p.latency_p99_ms,
        p.regions,
        p.verdict
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_every_figure_has_points_and_panels() {
        for f in Figure::ALL {
            assert_eq!(f.name().parse::<Figure>(), Ok(f));
            assert_eq!(f.xs(true).len(), 2);
            assert!(f.xs(false).len() > 2);
            assert!(!metrics(f).is_empty());
        }
        assert!("qsm-fig99".parse::<Figure>().is_err());
    }

    #[test]
    fn scenarios_follow_the_paper_setup() {
        let s = Setup::new(Figure::Fig15, false, 1).scenario(1000.0, 1);
        assert_eq!((s.nodes, s.senders, s.topics), (1000, 2, 1));
        assert_eq!(s.publish_rate, Some(TWO_SENDER_RATE));
        assert_eq!(s.message_bytes, MESSAGE_BYTES);
        let s = Setup::new(Figure::Fig40, false, 1).scenario(10_000.0, 0);
        assert_eq!((s.topics, s.profiles), (10_000, Some(1)));
        assert!(s.round_robin_topics);
        // One profile: every receiver wants every topic, so all of them form one region.
        let subs = s.subscriptions();
        assert!(subs[0].is_empty());
        assert!(subs[1..].iter().all(|t| t.len() == 10_000));
        let s = Setup::new(Figure::Fig28, false, 1).scenario(100.0, 1);
        assert_eq!(s.faults, SLEEP.parse::<FaultSpec>().expect("parses"));
        assert_eq!(s.flaky, 1);
        let s = Setup::new(Figure::Fig22, false, 1).scenario(5.0, 0);
        assert_eq!(
            s.proto.token_interval,
            std::time::Duration::from_millis(200)
        );
        assert_eq!(s.proto.token_interval_min, s.proto.token_interval);
        assert!(s.proto.validate().is_ok());
    }

    #[test]
    fn csv_has_one_row_per_point_and_the_plot_is_a_png() {
        let p = Point {
            x: 10.0,
            variant: 1,
            nodes: 10,
            throughput_msgs: 100.0,
            pending_ack_mean: 1.0,
            pending_ack_max: 2,
            sender_bytes_max: 3,
            receiver_cache_bytes_max: 4,
            perturbed_cache_bytes_max: 5,
            perturbed_repaired_share: 0.5,
            token_rtt_p50_ms: 1.0,
            token_rtt_p99_ms: 2.0,
            partition_rtt_p50_ms: 2.5,
            stable_p50_ms: 3.0,
            latency_p50_ms: 4.0,
            latency_p99_ms: 5.0,
            regions: 1,
            verdict: "pass",
            replay: String::new(),
        };
        let csv = to_csv(Figure::Fig28, &[p.clone(), p.clone()]);
        assert_eq!(csv.lines().count(), 3);
        assert!(csv
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("10,sleep,10,100,")));
        let back = from_csv(Figure::Fig28, &csv).expect("parses");
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].x, back[0].variant, back[0].nodes), (10.0, 1, 10));
        assert_eq!(back[0].partition_rtt_p50_ms, 2.5);
        assert!(from_csv(Figure::Fig28, "x,y\n").is_err());
        assert_eq!(&to_png(Figure::Fig28, &[p])[1..4], b"PNG");
    }
}
