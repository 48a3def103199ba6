//! `tidings sim`: the deterministic simulator (run, sweep, regions).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use tidings_bench::regions::{regions_report, RegionsParams};
use tidings_proto::{Config, CongestionControl, RecoveryPacing};
use tidings_sim::fault::FaultSpec;
use tidings_sim::horus::PaperScenario;
use tidings_sim::{MembershipKind, Progress, Scenario};

#[derive(Subcommand, Debug)]
pub(crate) enum SimCommand {
    /// Runs one scenario and prints throughput, time to stability, token round trips, pending
    /// ACKs, cache occupancy, recovery counts and the checker's verdict. Exit status 1 if the
    /// checker found a violation.
    Run(RunArgs),
    /// Runs one scenario over many seeds and fault specifications on all cores, and reports every
    /// failing seed with the command that replays it. Exit status 1 if any run failed.
    Sweep(SweepArgs),
    /// Forms regions for a synthetic workload (paper 001, Figures 5-6): nodes subscribing to a
    /// share of Zipf-popular topics, fed to the GMS's incremental planner one subscription at a
    /// time; reports regions per node and per topic, region sizes, the share of a node's traffic
    /// in its two busiest regions, and the time the computation took.
    Regions(RegionsArgs),
}

#[derive(Args, Debug)]
pub(crate) struct RegionsArgs {
    /// Nodes.
    #[arg(long, default_value_t = 2000)]
    nodes: usize,
    /// Topics.
    #[arg(long, default_value_t = 10000)]
    topics: usize,
    /// Share of the topics each node subscribes to.
    #[arg(long, default_value_t = 0.1)]
    interest: f64,
    /// Exponent of the Zipf popularity of topics.
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Correlated interest: nodes form this many communities, each subscribing to its own
    /// Zipf-drawn profile of topics (0: every node draws independently, paper 001's workload).
    #[arg(long, default_value_t = 0)]
    communities: usize,
    /// With --communities, the share of each node's topics drawn on its own, outside its
    /// community's profile.
    #[arg(long, default_value_t = 0.0)]
    personal: f64,
    /// Topics alone in their subset with at most this many subscribers count as carried by
    /// personal regions in the "with personal regions" figures (ADR 0010).
    #[arg(long, default_value_t = 100)]
    personal_max: usize,
    /// Also run the batch (from scratch, largest first) greedy for comparison.
    #[arg(long)]
    batch: bool,
    /// Approximate regions: the most a node may waste (share of the messages it receives, by
    /// rate, that it discards), e.g. 0.1; 0 keeps regions exact (ADR 34).
    #[arg(long, default_value_t = 0.0)]
    waste_max: f64,
    /// A sweep over the waste bound instead of one run: the bounds, comma-separated (e.g.
    /// 0,0.05,0.1,0.2); writes `<out>.csv` and `<out>.png` (see --out).
    #[arg(long, value_delimiter = ',')]
    waste_sweep: Vec<f64>,
    /// With --waste-sweep: the path of the CSV and PNG, without extension.
    #[arg(long, default_value = "docs/experiments/approx-regions")]
    out: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn sim_regions(a: &RegionsArgs) -> ExitCode {
    if a.nodes == 0
        || a.topics == 0
        || !(a.interest > 0.0 && a.interest <= 1.0)
        || a.zipf.is_nan()
        || a.zipf < 0.0
        || !(0.0..=1.0).contains(&a.personal)
        || !(0.0..1.0).contains(&a.waste_max)
        || a.waste_sweep.iter().any(|w| !(0.0..1.0).contains(w))
    {
        eprintln!("error: --nodes and --topics must be positive, --interest within (0, 1], --zipf at least 0, --personal within [0, 1], --waste-max within [0, 1)");
        return ExitCode::from(2);
    }
    let mut params = RegionsParams::new(a.nodes, a.topics, a.interest, a.zipf, a.seed);
    params.compare_batch = a.batch;
    params.communities = a.communities;
    params.personal = a.personal;
    params.personal_subscribers_max = a.personal_max;
    params.planner.waste_max_permille = (a.waste_max * 1000.0).round() as u32;
    if !a.waste_sweep.is_empty() {
        return waste_sweep(&params, &a.waste_sweep, &a.out);
    }
    let report = regions_report(&params);
    if a.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::SUCCESS
}

/// `tidings sim regions --waste-sweep`: one report per bound, as CSV and PNG.
fn waste_sweep(params: &RegionsParams, bounds: &[f64], out: &str) -> ExitCode {
    let mut reports = Vec::with_capacity(bounds.len());
    let mut csv = String::from(
        "waste_bound,regions_per_node_mean,regions_per_node_max,regions_per_topic_mean,regions_per_topic_max,region_size_mean,region_size_max,top2_region_traffic_share,waste_mean,waste_max,pads_per_node_mean,subsets,singleton_subsets,elapsed_ms\n",
    );
    for &b in bounds {
        let mut p = params.clone();
        p.planner.waste_max_permille = (b * 1000.0).round() as u32;
        let r = regions_report(&p);
        let i = &r.incremental;
        csv += &format!(
            "{:.3},{:.2},{},{:.3},{},{:.2},{},{:.4},{:.4},{:.4},{:.1},{},{},{}\n",
            f64::from(r.waste_max_permille) / 1000.0,
            i.regions_per_node_mean,
            i.regions_per_node_max,
            i.regions_per_topic_mean,
            i.regions_per_topic_max,
            i.region_size_mean,
            i.region_size_max,
            i.top2_region_traffic_share,
            i.waste_mean,
            i.waste_max,
            i.pads_per_node_mean,
            i.subsets,
            i.singleton_subsets,
            i.elapsed_ms
        );
        eprintln!(
            "waste bound {:.1}%: {:.1} regions per node, waste mean {:.1}% max {:.1}%, top-2 {:.1}%",
            b * 100.0,
            i.regions_per_node_mean,
            100.0 * i.waste_mean,
            100.0 * i.waste_max,
            100.0 * i.top2_region_traffic_share
        );
        reports.push(tidings_sim::plot::WasteSweepPoint {
            nodes: r.nodes,
            topics: r.topics,
            interest: r.interest,
            zipf: r.zipf,
            seed: r.seed,
            waste_max_permille: r.waste_max_permille,
            regions_per_node_mean: r.regions_per_node_mean,
            regions_per_node_max: r.regions_per_node_max,
            regions_per_topic_mean: r.regions_per_topic_mean,
            regions_per_topic_max: r.regions_per_topic_max,
            region_size_mean: r.region_size_mean,
            top2_region_traffic_share: r.top2_region_traffic_share,
            waste_mean: r.waste_mean,
            waste_max: r.waste_max,
        });
    }
    let png = tidings_sim::plot::waste_sweep_png(&reports);
    for (path, bytes) in [
        (format!("{out}.csv"), csv.into_bytes()),
        (format!("{out}.png"), png),
    ] {
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("error: {path}: {e}");
            return ExitCode::from(2);
        }
        println!("wrote {path}");
    }
    ExitCode::SUCCESS
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Faults: none, iid:P, bursty:P[:LEN], blackout[:10ms:1s], freeze[:500ms:5s], comma-separated.
    #[arg(long, default_value = "none")]
    loss: FaultSpec,
    /// Seed: same seed, same output.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Run a paper experiment instead (gryphon-fig2, gryphon-fig4, gryphon-fig7, gryphon-fig9,
    /// gryphon-fig12, gryphon-fig16 with and without congestion control; horus-fig1, horus-fig2,
    /// horus-fig3: see `tidings_sim::horus`; qsm-fig15, qsm-fig22, qsm-fig26, qsm-fig28,
    /// qsm-fig38, qsm-fig40: see `tidings_sim::qsm`), writing a CSV time series per run (gryphon-fig16: one
    /// CSV row per delta_t_rec) and a PNG plot into --out; the other scenario flags are ignored
    /// (--seed is used).
    #[arg(long = "scenario")]
    experiment: Option<tidings_sim::horus::PaperScenario>,
    /// Where experiments write their CSV and PNG files.
    #[arg(long, default_value = "docs/experiments")]
    out: std::path::PathBuf,
    /// Experiments at the reduced size CI runs.
    #[arg(long)]
    reduced: bool,
    /// QSM figures: draw the PNG again from the CSV in --out instead of running the figure.
    #[arg(long)]
    replot: bool,
    /// Length of the link failure of gryphon-fig4, -fig7 and -fig16, seconds (the paper: 120;
    /// default 30, for -fig7 120).
    #[arg(long)]
    outage_seconds: Option<f64>,
    /// Gryphon experiments: every port one FIFO, DCQs and UCAs waiting behind data (by default
    /// they go first, as Gryphon's brokers sent them; ADR 12).
    #[arg(long)]
    fifo_ports: bool,
    /// Gryphon experiments: PDCC with the protocol's defaults alone (Table 1's constants, ADR
    /// 5's thresholds) instead of the experiments' settings (r_min for the paper's 4 pubends, a
    /// 1 s hold-off after a decrease, a 150 ms queueing threshold; ADR 12). With --fifo-ports,
    /// the experiments as they ran before ADR 12.
    #[arg(long)]
    table1: bool,
}

#[derive(Args, Debug)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Fault specifications to sweep, one per flag (each as for `run --loss`).
    #[arg(long = "loss", required = true)]
    losses: Vec<FaultSpec>,
    /// Seeds, as FIRST..=LAST (or FIRST..LAST, inclusive as well).
    #[arg(long, default_value = "1..=100", value_parser = parse_seeds)]
    seeds: std::ops::RangeInclusive<u64>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    jobs: Option<usize>,
    /// No progress on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_seeds(text: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let (a, b) = text
        .split_once("..=")
        .or_else(|| text.split_once(".."))
        .ok_or_else(|| format!("seeds {text:?}: expected FIRST..=LAST, e.g. 1..=100"))?;
    let a: u64 = a
        .trim()
        .parse()
        .map_err(|e| format!("seeds {text:?}: {e}"))?;
    let b: u64 = b
        .trim()
        .parse()
        .map_err(|e| format!("seeds {text:?}: {e}"))?;
    if a > b {
        return Err(format!("seeds {text:?}: FIRST is after LAST"));
    }
    Ok(a..=b)
}

/// What defines a scenario, besides its seed and faults.
#[derive(Args, Debug)]
struct ScenarioArgs {
    /// Nodes in all (senders included).
    #[arg(long, default_value_t = 21)]
    nodes: u32,
    /// Nodes 0..S publish.
    #[arg(long, default_value_t = 1)]
    senders: u32,
    /// Topics.
    #[arg(long, default_value_t = 1)]
    topics: u32,
    /// Seconds of publishing (simulated time).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Interest profiles (regions); default 1 for one topic, else nodes/12 (at least 2).
    #[arg(long)]
    profiles: Option<u32>,
    /// Approximate regions (ADR 34): the planner (the oracle's, or the GMS's with --gms) forms
    /// regions with each node wasting at most this share of what it receives (e.g. 0.3); nodes
    /// deliver only their own subscriptions. 0: exact regions.
    #[arg(long, default_value_t = 0.0)]
    waste_max: f64,
    /// Apply the loss model to uplinks too (whole-region losses, repaired by NAKs).
    #[arg(long)]
    uplink_loss: bool,
    /// Senders subscribe too (by default senders and receivers are distinct, as in the papers).
    #[arg(long)]
    senders_subscribe: bool,
    /// Nodes that get the blackout and freeze windows.
    #[arg(long, default_value_t = 1)]
    flaky: u32,
    /// Most simulated seconds after publishing for everything to become stable.
    #[arg(long, default_value_t = 30.0)]
    drain_seconds: f64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1000)]
    message_bytes: usize,
    /// Caching replicas per message (partition size).
    #[arg(long, default_value_t = 5)]
    replication: usize,
    /// Per-sender publish rate, messages/s (default: as fast as flow control allows).
    #[arg(long)]
    rate: Option<f64>,
    /// Link bandwidth, Mbit/s.
    #[arg(long, default_value_t = 100.0)]
    link_mbps: f64,
    /// Links serve congestion queries and alerts (DCQ, UCA) before the data waiting (the Gryphon
    /// experiments always do, unless --fifo-ports).
    #[arg(long)]
    control_priority: bool,
    /// Token release interval of ring leaders, milliseconds.
    #[arg(long)]
    token_interval_ms: Option<u64>,
    /// Sender window: unstable messages per region.
    #[arg(long)]
    window: Option<usize>,
    /// Turn on Gryphon's congestion control (PDCC): senders adapt their publish rate to the
    /// slowest receiver.
    #[arg(long)]
    congestion_control: bool,
    /// Turn on Gryphon's adaptive NACK window (SDCC, equations 9-10).
    #[arg(long)]
    adaptive_nack_window: bool,
    /// Random membership events (crash, leave, join, resubscribe) during publishing.
    #[arg(long, default_value_t = 0)]
    churn: u32,
    /// Adoptions during publishing: one of the first three receivers subscribes to one of three
    /// extra topics that every sender publishes on and no profile takes, so topics join the
    /// regions of exactly their subscribers (views that only add topics, ADR 30).
    #[arg(long, default_value_t = 0)]
    adopt: u32,
    /// Abandonments during publishing (with --adopt): an adopter drops one of the extra topics
    /// if it holds it, so a region alone with its node loses a topic (views that drop topics
    /// their members left go on, ADR 30).
    #[arg(long, default_value_t = 0)]
    abandon: u32,
    /// Crash the largest region's leader and one of its partition leaders during publishing.
    #[arg(long)]
    crash_leaders: bool,
    /// A subscription that stops reading for a while: the first receiver holds its first topic
    /// from 20% to 70% of the publishing time, which only sender 0 publishes; the checker asks
    /// that the node's other streams are delivered throughout the hold.
    #[arg(long)]
    slow_consumer: bool,
    /// How long a crash goes unnoticed by the membership, milliseconds.
    #[arg(long, default_value_t = 300)]
    detection_ms: u64,
    /// Run the real membership service (GMS) on an extra simulated node, with a client in every
    /// node, instead of the oracle that installs every view everywhere at once.
    #[arg(long)]
    gms: bool,
    /// With --gms: run the service as this many replicas on Raft (3 or 5), each on its own
    /// simulated node.
    #[arg(long, default_value_t = 1)]
    gms_replicas: u32,
    /// With --gms-replicas 3 or more: a fault of the service at 40% of the publishing time:
    /// crash-leader, isolate-leader (cut off from the other replicas for a second) or
    /// restart-replica (a follower restarts from its snapshot and log).
    #[arg(long, value_parser = parse_gms_fault)]
    gms_fault: Option<tidings_sim::gms::GmsFault>,
    /// With --gms: seal protocol datagrams, off, authenticate or encrypt: nodes get identities
    /// from the seed, are admitted over the Noise link, and seal and open with the service's
    /// datagram keys, as the runtime does (with replicas too: a session with each).
    #[arg(long, default_value = "off", value_parser = parse_security)]
    security: tidings_seal::Mode,
    /// With --gms: a hostile host on the LAN sniffs, tries to join without credentials, replays
    /// and forges data, tokens, ACKs, NAKs and GMS requests, and keeps using the key of a member
    /// crashed at 20% of the publishing time; nothing it sends may be delivered.
    #[arg(long)]
    attacker: bool,
}

fn scenario(a: &ScenarioArgs, faults: FaultSpec, seed: u64) -> Scenario {
    let mut proto = Config::default();
    if let Some(ms) = a.token_interval_ms {
        proto.token_interval = Duration::from_millis(ms);
    }
    if a.congestion_control {
        proto.congestion.control = CongestionControl::Pdcc;
    }
    if a.adaptive_nack_window {
        proto.recovery.pacing = RecoveryPacing::Sdcc;
    }
    if let Some(w) = a.window {
        proto.window.msgs_max = w;
        proto.receive_window_msgs = proto.receive_window_msgs.max(w);
    }
    Scenario {
        nodes: a.nodes,
        senders: a.senders,
        senders_subscribe: a.senders_subscribe,
        topics: a.topics,
        profiles: a.profiles,
        waste_max_permille: (a.waste_max.clamp(0.0, 0.999) * 1000.0).round() as u32,
        faults,
        uplink_loss: a.uplink_loss,
        flaky: a.flaky,
        seconds: a.seconds,
        drain_seconds: a.drain_seconds,
        seed,
        message_bytes: a.message_bytes,
        replication: a.replication,
        publish_rate: a.rate,
        link_mbps: a.link_mbps,
        control_priority: a.control_priority,
        proto,
        churn: a.churn,
        adopt: a.adopt,
        abandon: a.abandon,
        churn_events: Vec::new(),
        crash_leaders: a.crash_leaders,
        slow_consumer: a.slow_consumer,
        detection: Duration::from_millis(a.detection_ms),
        membership: if a.gms {
            MembershipKind::Gms
        } else {
            MembershipKind::Oracle
        },
        gms_replicas: a.gms_replicas,
        gms_fault: a.gms_fault,
        security: a.security,
        attacker: a.attacker,
        link_events: Vec::new(),
        ..Scenario::default()
    }
}

fn sim_experiment(a: &RunArgs, experiment: tidings_sim::experiment::Experiment) -> ExitCode {
    use tidings_sim::experiment::{
        regions_csv, run_experiment, run_sweep, sweep_csv, to_csv, Experiment, Setup,
    };
    if let Some(o) = a.outage_seconds {
        if !(o > 0.0 && o <= 3600.0) {
            eprintln!("error: --outage-seconds must be within (0, 3600]");
            return ExitCode::from(2);
        }
    }
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("error: {}: {e}", a.out.display());
        return ExitCode::from(2);
    }
    let mut outcomes = Vec::new();
    for cc in [false, true] {
        let setup = Setup {
            reduced: a.reduced,
            outage: a.outage_seconds.map(Duration::from_secs_f64),
            seed: a.seed,
            control_priority: !a.fifo_ports,
            table1_only: a.table1,
            ..Setup::new(experiment, cc)
        };
        if experiment == Experiment::GryphonFig16 && cc {
            // With congestion control: the sweep, one run per delta_t_rec.
            let sweep = match run_sweep(&setup) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            for o in &sweep {
                println!("{}", o.summary_line());
            }
            let file = a.out.join(format!("{}.csv", experiment.name()));
            if let Err(e) = std::fs::write(&file, sweep_csv(&sweep)) {
                eprintln!("error: {}: {e}", file.display());
                return ExitCode::from(2);
            }
            println!("  wrote {}", file.display());
            outcomes = sweep;
            break;
        }
        let outcome = match run_experiment(&setup) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        println!("{}", outcome.summary_line());
        if experiment == Experiment::GryphonFig16 {
            // Without congestion control delta_t_rec means nothing: one reference run, printed
            // only.
            continue;
        }
        let file = a.out.join(format!(
            "{}-cc-{}.csv",
            experiment.name(),
            if cc { "on" } else { "off" }
        ));
        let csv = if experiment == Experiment::GryphonFig12 {
            regions_csv(&outcome.regions)
        } else {
            to_csv(&outcome.rows)
        };
        if let Err(e) = std::fs::write(&file, csv) {
            eprintln!("error: {}: {e}", file.display());
            return ExitCode::from(2);
        }
        println!("  wrote {}", file.display());
        outcomes.push(outcome);
    }
    let png = a.out.join(format!("{}.png", experiment.name()));
    let plot = match experiment {
        Experiment::GryphonFig7 => tidings_sim::plot::recovery_png(&outcomes),
        Experiment::GryphonFig12 => tidings_sim::plot::regions_png(&outcomes),
        Experiment::GryphonFig16 => tidings_sim::plot::sweep_png(&outcomes),
        _ => tidings_sim::plot::experiment_png(&outcomes),
    };
    if let Err(e) = std::fs::write(&png, plot) {
        eprintln!("error: {}: {e}", png.display());
        return ExitCode::from(2);
    }
    println!("  wrote {}", png.display());
    // The experiment passes when congestion control prevents the collapse (every run of the
    // sweep).
    if outcomes
        .iter()
        .any(|o| o.setup.congestion_control && !o.summary.meets_targets(experiment))
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn sim_run(a: &RunArgs) -> ExitCode {
    match a.experiment {
        Some(PaperScenario::Gryphon(experiment)) => return sim_experiment(a, experiment),
        Some(PaperScenario::Horus(figure)) => return sim_horus(a, figure),
        Some(PaperScenario::Qsm(figure)) => return sim_qsm(a, figure),
        None => {}
    }
    let s = scenario(&a.scenario, a.loss, a.seed);
    let show = !a.quiet && std::io::stderr().is_terminal();
    #[allow(clippy::disallowed_methods)] // wall time of the whole run, for the operator only
    let started = std::time::Instant::now();
    let mut progress = |p: &Progress| {
        if show {
            let t = p.now.as_nanos() as f64 / 1e9;
            let phase = if t <= p.publish_seconds {
                "publishing"
            } else {
                "draining"
            };
            eprint!(
                "\r  simulated {t:6.1} s of {:.0}+ ({phase}): {} published, {} stable   ",
                p.publish_seconds, p.published, p.stable
            );
            let _ = std::io::stderr().flush();
        }
    };
    let report = match tidings_sim::run(&s, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if show {
        eprintln!(
            "\r  done in {:.1} s of wall time{}",
            started.elapsed().as_secs_f64(),
            " ".repeat(40)
        );
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn sim_sweep(a: &SweepArgs) -> ExitCode {
    let base = scenario(&a.scenario, FaultSpec::NONE, *a.seeds.start());
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let show = !a.quiet && std::io::stderr().is_terminal();
    let done = |finished: usize, total: usize| {
        if show {
            eprint!("\r  {finished}/{total} runs");
            let _ = std::io::stderr().flush();
        }
    };
    let runs = match tidings_sim::sweep(&base, &a.losses, a.seeds.clone(), jobs, &done) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if show {
        eprintln!();
    }
    let mut failed = 0;
    for fault in &a.losses {
        let of_fault: Vec<_> = runs
            .iter()
            .filter(|r| r.scenario.faults == *fault)
            .collect();
        let reports: Vec<_> = of_fault
            .iter()
            .filter_map(|r| r.result.as_ref().ok())
            .collect();
        let passed = of_fault.iter().filter(|r| r.passed()).count();
        let mean = |f: &dyn Fn(&tidings_sim::RunReport) -> f64| {
            reports.iter().map(|r| f(r)).sum::<f64>() / reports.len().max(1) as f64
        };
        let worst_p99 = reports
            .iter()
            .map(|r| r.time_to_stable_ms.p99)
            .fold(0.0, f64::max);
        println!(
            "{:<28} {passed}/{} pass; throughput mean {:.0} msgs/s; time to stable p50 mean {:.0} ms, worst p99 {:.0} ms; repaired mean {:.0}",
            fault.to_string(),
            of_fault.len(),
            mean(&|r| r.throughput_msgs_per_sec),
            mean(&|r| r.time_to_stable_ms.p50),
            worst_p99,
            mean(&|r| r.recovery.repairs_received as f64),
        );
        // With a fault of the replicated GMS: its failover over the seeds.
        let failover = |f: &dyn Fn(&tidings_sim::RunReport) -> Option<f64>| {
            let mut v: Vec<f64> = reports.iter().filter_map(|r| f(r)).collect();
            v.sort_by(f64::total_cmp);
            let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
            (!v.is_empty()).then(|| {
                format!(
                    "p50 {:.0} ms, p99 {:.0} ms ({} runs)",
                    at(0.5),
                    at(0.99),
                    v.len()
                )
            })
        };
        if let Some(leader) = failover(&|r| r.gms_fault_to_leader_ms) {
            let view = failover(&|r| r.gms_fault_to_view_ms).unwrap_or_else(|| "none".to_owned());
            println!(
                "{:<28} GMS fault to a new leader {leader}; to the first view after it {view}",
                ""
            );
        }
        for r in of_fault.iter().filter(|r| !r.passed()) {
            failed += 1;
            let why = match &r.result {
                Ok(report) => report.violations.first().cloned().unwrap_or_default(),
                Err(e) => e.clone(),
            };
            println!("  FAIL seed {}: {why}", r.scenario.seed);
            println!("    replay: {}", r.scenario.replay_command());
        }
    }
    if failed == 0 {
        println!("all {} runs passed", runs.len());
        ExitCode::SUCCESS
    } else {
        println!("{failed} of {} runs failed", runs.len());
        ExitCode::from(1)
    }
}

/// Runs one `tidings sim` command.
pub(crate) fn run(command: SimCommand) -> ExitCode {
    match command {
        SimCommand::Run(a) => sim_run(&a),
        SimCommand::Sweep(a) => sim_sweep(&a),
        SimCommand::Regions(a) => sim_regions(&a),
    }
}

/// Runs a Horus figure (paper 004) and writes its CSV and PNG.
fn sim_horus(a: &RunArgs, figure: tidings_sim::horus::Figure) -> ExitCode {
    let setup = tidings_sim::horus::Setup {
        figure,
        reduced: a.reduced,
        seed: a.seed,
    };
    let mut show = |p: &tidings_sim::horus::Point| {
        println!("{}", tidings_sim::horus::point_line(figure, p));
    };
    match tidings_sim::horus::run_and_write(&setup, &a.out, &mut show) {
        Ok(_) => {
            println!("  wrote {}/{}.{{csv,png}}", a.out.display(), figure.name());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// A `--gms-fault` name.
fn parse_security(name: &str) -> Result<tidings_seal::Mode, String> {
    name.parse::<tidings_seal::Mode>()
        .map_err(|e| e.to_string())
}

fn parse_gms_fault(name: &str) -> Result<tidings_sim::gms::GmsFault, String> {
    tidings_sim::gms::GmsFault::parse(name).ok_or_else(|| {
        let names: Vec<&str> = tidings_sim::gms::GmsFault::ALL
            .iter()
            .map(|f| f.name())
            .collect();
        format!("unknown GMS fault {name:?}; one of {}", names.join(", "))
    })
}

/// Runs a QSM figure (paper 000, section 4) and writes its CSV and PNG; exit status 1 if the
/// checker failed any run of it (with the command that replays the figure).
fn sim_qsm(a: &RunArgs, figure: tidings_sim::qsm::Figure) -> ExitCode {
    if a.replot {
        let csv = a.out.join(format!("{}.csv", figure.name()));
        let png = a.out.join(format!("{}.png", figure.name()));
        let drawn = std::fs::read_to_string(&csv)
            .map_err(|e| format!("{}: {e}", csv.display()))
            .and_then(|text| tidings_sim::qsm::from_csv(figure, &text))
            .and_then(|points| {
                std::fs::write(&png, tidings_sim::qsm::to_png(figure, &points))
                    .map_err(|e| format!("{}: {e}", png.display()))
            });
        return match drawn {
            Ok(()) => {
                println!("  wrote {}", png.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let setup = tidings_sim::qsm::Setup::new(figure, a.reduced, a.seed);
    let mut show = |p: &tidings_sim::qsm::Point| {
        println!("{}", tidings_sim::qsm::point_line(figure, p));
    };
    match tidings_sim::qsm::run_and_write(&setup, &a.out, &mut show) {
        Ok(points) => {
            println!("  wrote {}/{}.{{csv,png}}", a.out.display(), figure.name());
            let failed: Vec<_> = points.iter().filter(|p| p.verdict != "pass").collect();
            if failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                for p in &failed {
                    println!(
                        "  FAIL {} x={} ({}): checker {}",
                        figure.name(),
                        p.x,
                        figure.variants()[p.variant],
                        p.verdict
                    );
                }
                println!("    replay: {}", setup.replay_command());
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
