//! The flow-control experiments of paper 004 (Horus) as simulator scenarios: each sweeps one axis
//! (window size, offered load) over short runs of a four-member group in which every member
//! multicasts small messages and receives everyone's (the paper's *ring* benchmark), and records
//! the group's throughput (messages of all members delivered per second: the paper's "messages
//! per group per second"), the memory its senders hold, and the delivery latency.
//!
//! The hosts are modelled on the paper's: a 10 Mbit/s Ethernet and a CPU that costs
//! [`PROC_COST_PER_PACKET`] per datagram sent or received, so packing and overload matter.
//! Figure 3 also charges [`PUBLISH_COST`] of the sender's CPU per message the application hands
//! to the node: without back pressure an overloaded application keeps handing them over, which
//! takes the CPU the node needs to receive, so packets are lost at its socket and repaired
//! (the simulator's stand-in for the paper's paging), while the unsent queue grows without bound.
//! ADR 8 records where the model departs from the paper.

use std::fmt::Write as _;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use tidings_proto::{NodeId, Time, WindowAlgorithm};

use crate::checker::Ledger;
use crate::experiment::Experiment;
use crate::plot::{colour, nice_ceiling, render, Panel, Series, XAxis};
use crate::scenario::{run_observed, Scenario, ScenarioError, SimHost};
use crate::world::World;

/// Group size of every figure (the paper's four).
pub const GROUP: u32 = 4;
/// Payload bytes of a message: small, as the paper's 1-byte messages (our payload carries a
/// 12-byte id for the checker).
pub const MESSAGE_BYTES: usize = 16;
/// The hosts' link, Mbit/s (the paper's Ethernet).
pub const LINK_MBPS: f64 = 10.0;
/// CPU time per datagram sent or received (a workstation of the paper's time).
pub const PROC_COST_PER_PACKET: Duration = Duration::from_micros(100);
/// CPU time per message the application publishes (Fig. 3).
pub const PUBLISH_COST: Duration = Duration::from_micros(50);
/// How often the token rings release a round (they carry the acknowledgements).
pub const TOKEN_INTERVAL: Duration = Duration::from_millis(5);
/// The local window of Figs. 2 and 3 (the paper's FC stack: window and packing): about where
/// Fig. 1's throughput levels off; a larger one only lets an overloaded group flood the
/// switch's queues.
pub const FC_WINDOW_MSGS: usize = 1024;
/// Fig. 3's buffer limit with back pressure: the paper's 1000 messages.
pub const BUFFER_LIMIT_MSGS: usize = 1000;

/// The figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    /// Fig. 1: throughput against window size, local and global credit windows.
    Fig1,
    /// Fig. 2: throughput against offered load, with and without message packing.
    Fig2,
    /// Fig. 3: throughput, memory and latency against offered load, with and without back
    /// pressure.
    Fig3,
}

impl Figure {
    /// Every figure.
    pub const ALL: [Figure; 3] = [Figure::Fig1, Figure::Fig2, Figure::Fig3];

    /// The name on the command line and of the files written.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Figure::Fig1 => "horus-fig1",
            Figure::Fig2 => "horus-fig2",
            Figure::Fig3 => "horus-fig3",
        }
    }

    /// One line on what it shows.
    #[must_use]
    pub fn title(self) -> &'static str {
        match self {
            Figure::Fig1 => "Horus Fig. 1: throughput against the credit window, local and global",
            Figure::Fig2 => "Horus Fig. 2: throughput with and without message packing",
            Figure::Fig3 => "Horus Fig. 3: throughput and memory with and without back pressure",
        }
    }

    /// A short title for the plot.
    #[must_use]
    pub fn plot_title(self) -> &'static str {
        match self {
            Figure::Fig1 => "Horus Fig. 1: window, local/global",
            Figure::Fig2 => "Horus Fig. 2: packing on/off",
            Figure::Fig3 => "Horus Fig. 3: back pressure on/off",
        }
    }

    /// What the x axis is.
    #[must_use]
    pub fn x_label(self) -> &'static str {
        match self {
            Figure::Fig1 => "x: the window (msgs, log scale)",
            Figure::Fig2 | Figure::Fig3 => "x: offered load per member (msgs/s)",
        }
    }

    /// The plot's x axis for these points (Fig. 1's windows on a log scale).
    fn x_axis(self, points: &[Point]) -> XAxis {
        let x_max = points.iter().map(|p| p.x).fold(1.0, f64::max);
        match self {
            Figure::Fig1 => XAxis::Log(
                points.iter().map(|p| p.x).fold(x_max, f64::min).max(0.5),
                x_max,
            ),
            Figure::Fig2 | Figure::Fig3 => XAxis::Linear(x_max),
        }
    }

    /// The two variants compared, in plotting order.
    #[must_use]
    pub fn variants(self) -> [&'static str; 2] {
        match self {
            Figure::Fig1 => ["local", "global"],
            Figure::Fig2 => ["packing", "no-packing"],
            Figure::Fig3 => ["back-pressure", "no-back-pressure"],
        }
    }

    /// The x values swept (`reduced`: the few CI runs).
    #[must_use]
    pub fn xs(self, reduced: bool) -> Vec<f64> {
        let full: &[f64] = match self {
            Figure::Fig1 => &[
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
            ],
            Figure::Fig2 => &[
                250.0, 500.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0, 8000.0,
                9000.0, 10000.0,
            ],
            Figure::Fig3 => &[
                2000.0, 4000.0, 6000.0, 8000.0, 10000.0, 12000.0, 14000.0, 16000.0, 18000.0,
                20000.0,
            ],
        };
        let small: &[f64] = match self {
            Figure::Fig1 => &[4.0, 64.0],
            Figure::Fig2 => &[500.0, 6000.0],
            Figure::Fig3 => &[4000.0, 20000.0],
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

/// A paper experiment named on the command line: Gryphon's (paper 002), Horus' (paper 004) or
/// QSM's (paper 000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaperScenario {
    /// A congestion experiment of [`crate::experiment`].
    Gryphon(Experiment),
    /// A flow-control figure of this module.
    Horus(Figure),
    /// A scaling figure of [`crate::qsm`].
    Qsm(crate::qsm::Figure),
}

impl FromStr for PaperScenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(f) = Figure::from_str(s) {
            return Ok(PaperScenario::Horus(f));
        }
        if let Ok(f) = crate::qsm::Figure::from_str(s) {
            return Ok(PaperScenario::Qsm(f));
        }
        Experiment::from_str(s)
            .map(PaperScenario::Gryphon)
            .map_err(|e| {
                let names: Vec<&str> = Figure::ALL
                    .iter()
                    .map(|f| f.name())
                    .chain(crate::qsm::Figure::ALL.iter().map(|f| f.name()))
                    .collect();
                format!("{e}, {}", names.join(", "))
            })
    }
}

/// One run of a figure: one x value of one variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The x value (window or offered load per member).
    pub x: f64,
    /// Index into [`Figure::variants`].
    pub variant: usize,
    /// Messages of the group delivered per second (deliveries at the members of messages from
    /// other members, divided by the members each reaches), over the second half of publishing.
    pub throughput_msgs: f64,
    /// Messages published per second per member over the same span (what was admitted).
    pub published_msgs: f64,
    /// Most payload bytes any member held unsent or unstable.
    pub held_bytes_max: u64,
    /// Most messages any member held unsent or unstable (sampled every 100 ms).
    pub held_msgs_max: u64,
    /// Publish-to-delivery latency, median, ms.
    pub latency_p50_ms: f64,
    /// Publish-to-delivery latency, 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// Datagrams dropped by the network and the sockets (all causes).
    pub drops: u64,
    /// The checker's verdict ("pass" or "fail").
    pub verdict: &'static str,
}

/// How a figure is run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Setup {
    /// Which figure.
    pub figure: Figure,
    /// The reduced size CI runs (two x values, shorter runs).
    pub reduced: bool,
    /// Seed.
    pub seed: u64,
}

impl Setup {
    /// Seconds of publishing; throughput is measured over its second half.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        if self.reduced {
            2.0
        } else {
            4.0
        }
    }

    /// The scenario of one point.
    #[must_use]
    pub fn scenario(&self, x: f64, variant: usize) -> Scenario {
        let mut s = Scenario {
            nodes: GROUP,
            senders: GROUP,
            senders_subscribe: true,
            topics: 1,
            profiles: Some(1),
            seconds: self.seconds(),
            drain_seconds: 10.0,
            seed: self.seed,
            message_bytes: MESSAGE_BYTES,
            replication: GROUP as usize,
            link_mbps: LINK_MBPS,
            proc_cost_per_packet: PROC_COST_PER_PACKET,
            ..Scenario::default()
        };
        // Horus acknowledged messages about as soon as they arrived; our tokens carry the
        // acknowledgements, so they circulate fast (a round of four members takes about 1 ms).
        s.proto.token_interval = TOKEN_INTERVAL;
        // At a fixed rate (no token pacing, ADR 19): the figures compare windows under one
        // acknowledgement rate, as Horus' did.
        s.proto.token_interval_min = TOKEN_INTERVAL;
        s.proto.token_timeout = TOKEN_INTERVAL * 10;
        match self.figure {
            Figure::Fig1 => {
                // As fast as the window allows.
                let window = x as usize;
                s.proto.window.msgs_max = window;
                // A send queue in proportion, so what is queued at the end drains quickly.
                s.proto.send_queue_msgs_max = (window * 4).max(16);
                s.proto.window.algorithm = if variant == 0 {
                    WindowAlgorithm::Local
                } else {
                    WindowAlgorithm::Global
                };
            }
            Figure::Fig2 => {
                s.proto.window.msgs_max = FC_WINDOW_MSGS;
                s.publish_rate = Some(x);
                s.proto.packing = variant == 0;
            }
            Figure::Fig3 => {
                s.proto.window.msgs_max = FC_WINDOW_MSGS;
                s.publish_rate = Some(x);
                s.publish_cost = PUBLISH_COST;
                // The run stops at the end of publishing plus a short drain: an unbounded queue
                // would take minutes to empty, and what matters is the publishing phase.
                s.drain_seconds = 2.0;
                if variant == 0 {
                    s.proto.send_queue_msgs_max = BUFFER_LIMIT_MSGS;
                } else {
                    // No back pressure: the send queue takes whatever the application offers.
                    s.proto.send_queue_msgs_max = usize::MAX;
                    s.proto.send_queue_bytes_max = usize::MAX / 2;
                }
            }
        }
        s
    }

    /// Runs one point.
    pub fn run_point(&self, x: f64, variant: usize) -> Result<Point, ScenarioError> {
        let s = self.scenario(x, variant);
        let from = s.seconds / 2.0;
        let to = s.seconds;
        let mut at_from: Option<(u64, u64)> = None;
        let mut at_to: Option<(u64, u64)> = None;
        let mut held_msgs_max = 0u64;
        let mut held_bytes_max = 0u64;
        let totals = |world: &World<SimHost>| {
            (0..GROUP).fold((0u64, 0u64), |(d, p), i| {
                let st = world.host(NodeId(i)).node().stats();
                (d + st.messages_delivered, p + st.messages_published)
            })
        };
        let report = run_observed(
            &s,
            &mut |_| {},
            &mut |now: Time, world: &World<SimHost>, _: &Ledger| {
                let t = now.as_nanos() as f64 / 1e9;
                if t <= to + 1e-9 {
                    for i in 0..GROUP {
                        let st = world.host(NodeId(i)).node().stats();
                        held_msgs_max = held_msgs_max.max(st.held_msgs_current);
                        held_bytes_max = held_bytes_max.max(st.held_bytes_max);
                    }
                }
                if at_from.is_none() && t >= from - 1e-9 {
                    at_from = Some(totals(world));
                }
                if at_to.is_none() && t >= to - 1e-9 {
                    at_to = Some(totals(world));
                }
            },
        )?;
        let (d0, p0) = at_from.unwrap_or_default();
        let (d1, p1) = at_to.unwrap_or((d0, p0));
        let span = to - from;
        // A member delivers its own messages when it publishes them: only the others' count,
        // each delivered at GROUP - 1 members.
        let remote = (d1 - d0).saturating_sub(p1 - p0);
        Ok(Point {
            x,
            variant,
            throughput_msgs: remote as f64 / f64::from(GROUP - 1) / span,
            published_msgs: (p1 - p0) as f64 / f64::from(GROUP) / span,
            held_bytes_max,
            held_msgs_max,
            latency_p50_ms: report.latency_ms.p50,
            latency_p99_ms: report.latency_ms.p99,
            drops: report.network_drops.total(),
            verdict: report.verdict,
        })
    }

    /// Runs every point of the figure, calling `progress` after each.
    pub fn run(&self, progress: &mut dyn FnMut(&Point)) -> Result<Vec<Point>, ScenarioError> {
        let mut points = Vec::new();
        for variant in 0..2 {
            for x in self.figure.xs(self.reduced) {
                let p = self.run_point(x, variant)?;
                progress(&p);
                points.push(p);
            }
        }
        Ok(points)
    }
}

/// The header of [`to_csv`].
pub const CSV_HEADER: &str = "x,variant,throughput_msgs,published_msgs,held_msgs_max,held_bytes_max,latency_p50_ms,latency_p99_ms,drops,verdict";

/// The points as CSV, one row per run.
#[must_use]
pub fn to_csv(figure: Figure, points: &[Point]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for p in points {
        let _ = writeln!(
            out,
            "{},{},{:.0},{:.0},{},{},{:.1},{:.1},{},{}",
            p.x,
            figure.variants()[p.variant],
            p.throughput_msgs,
            p.published_msgs,
            p.held_msgs_max,
            p.held_bytes_max,
            p.latency_p50_ms,
            p.latency_p99_ms,
            p.drops,
            p.verdict
        );
    }
    out
}

/// The plot: throughput against x for both variants; Fig. 3 adds memory and latency.
#[must_use]
pub fn to_png(figure: Figure, points: &[Point]) -> Vec<u8> {
    let colours = [colour::BLUE, colour::RED];
    let line = |variant: usize, f: &dyn Fn(&Point) -> f64| Series {
        label: figure.variants()[variant].to_string(),
        colour: colours[variant],
        points: points
            .iter()
            .filter(|p| p.variant == variant)
            .map(|p| (p.x, f(p)))
            .collect(),
    };
    let panel = |title: String, f: &dyn Fn(&Point) -> f64| Panel {
        title,
        y_max: nice_ceiling(points.iter().map(f).fold(0.0, f64::max)),
        series: vec![line(0, f), line(1, f)],
    };
    let mut panels = vec![panel("throughput (msgs/s per group)".into(), &|p| {
        p.throughput_msgs
    })];
    if figure == Figure::Fig3 {
        panels.push(panel("most msgs held by a sender".into(), &|p| {
            p.held_msgs_max as f64
        }));
        panels.push(panel("latency p99 (ms)".into(), &|p| p.latency_p99_ms));
    }
    render(
        figure.plot_title(),
        &[(figure.x_label().to_string(), panels)],
        figure.x_axis(points),
    )
}

/// Runs a figure and writes `<name>.csv` and `<name>.png` into `out`; returns the points.
pub fn run_and_write(
    setup: &Setup,
    out: &Path,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let points = setup.run(progress).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let name = setup.figure.name();
    let csv = out.join(format!("{name}.csv"));
    std::fs::write(&csv, to_csv(setup.figure, &points))
        .map_err(|e| format!("{}: {e}", csv.display()))?;
    let png = out.join(format!("{name}.png"));
    std::fs::write(&png, to_png(setup.figure, &points))
        .map_err(|e| format!("{}: {e}", png.display()))?;
    Ok(points)
}

/// One line per point, for the terminal.
#[must_use]
pub fn point_line(figure: Figure, p: &Point) -> String {
    format!(
        "{} {} x={}: throughput {:.0} msgs/s, published {:.0} msgs/s/member, held max {} msgs ({} B), latency p50 {:.1} ms p99 {:.1} ms, drops {}, checker {}",
        figure.name(),
        figure.variants()[p.variant],
        p.x,
        p.throughput_msgs,
        p.published_msgs,
        p.held_msgs_max,
        p.held_bytes_max,
        p.latency_p50_ms,
        p.latency_p99_ms,
        p.drops,
        p.verdict
    )
}
