//! `tidings demo`: the main job on an embedded default. This process runs the membership service;
//! subscriber and publisher nodes run as separate processes on loopback (this binary, hidden
//! subcommand `demo-node`), join through the service, and publish on many topics with injected
//! receive loss. Every subscriber checks that it got every message of its topics exactly once
//! and in each publisher's order; the parent shows progress and prints a summary.
//!
//! Parent and children speak JSON lines: children report on stdout (`ready`, `progress`, `done`,
//! `published`), the parent writes `go` (publishers) and `exit` (everyone) to their stdin.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use tidings::{
    Bytes, GmsConfig, GmsReplicaServer, Identity, MulticastConfig, Node, PublicKey, RuntimeConfig,
    SecurityMode, Topic, Transport,
};
use tidings_gms::{MulticastPool, ReplicaSecurity, ServiceSecurity};
use tidings_runtime::{GmsServer, GmsSnapshot, ReplicaHostConfig};

use crate::identities::RunIdentities;
use crate::node_cmd::{parse_gms_addrs, GmsAddrs};

use crate::bench::bench_sys::shared_clock_ns;

/// Bytes of the demo's message header: publisher index, topic index, sequence, send time.
const HEADER_BYTES: usize = 4 + 4 + 8 + 8;
/// Interval of the subscribers' progress reports.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
/// Longest wait for a child to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for children to leave after `exit`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Problems a subscriber describes in detail (the rest are counted).
const ERRORS_SHOWN_MAX: usize = 5;

/// How region datagrams travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TransportArg {
    /// Unicast fan-out (works everywhere).
    Unicast,
    /// IP multicast on loopback (interface 127.0.0.1, loop on).
    Multicast,
}

impl TransportArg {
    fn transport(self) -> Transport {
        match self {
            TransportArg::Unicast => Transport::Unicast,
            TransportArg::Multicast => Transport::Multicast(MulticastConfig::default()),
        }
    }
}

/// Options of `tidings demo`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DemoArgs {
    /// Publisher processes (each publishes on every topic).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    publishers: u32,
    /// Subscriber processes (each takes about 70% of the topics, so subscriptions overlap
    /// irregularly and nodes sit in several regions).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    subscribers: u32,
    /// Topics.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    topics: u32,
    /// Messages each publisher publishes on each topic.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    messages_per_topic: u64,
    /// Message size in bytes (at least the 24-byte demo header).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(24..=8000))]
    size: u64,
    /// Probability that a subscriber drops a received datagram on purpose (the protocol must
    /// repair it).
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Unicast fan-out or IP multicast on loopback.
    #[arg(long, value_enum, default_value_t = TransportArg::Unicast)]
    transport: TransportArg,
    /// Give up (verdict "fail") after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_seconds: u64,
    /// Messages per second each publisher publishes (over all its topics); default: as fast
    /// as back pressure allows, where latency is mostly time in queues. A rate below what the
    /// subscribers keep up with shows the latency of a message that does not wait.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    rate: Option<u64>,
    /// Kill subscriber 0 (SIGKILL) once a third of the deliveries are done: the membership
    /// service must remove it for failure, and the other subscribers must still get everything.
    #[arg(long)]
    kill_subscriber: bool,
    /// Run the membership service as this many replicas (threads of the demo's process, on
    /// loopback) instead of one: the replicated service (Raft, ADR 32).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=7))]
    gms_replicas: Option<u16>,
    /// Stop the leader replica abruptly once a quarter of the deliveries are done: a new leader
    /// must take over, and every subscriber must still get everything (needs `--gms-replicas`).
    #[arg(long, requires = "gms_replicas")]
    kill_gms_leader: bool,
    /// How protocol datagrams are protected: off, authenticate or encrypt. With
    /// authenticate or encrypt the demo generates an identity for its membership service and
    /// one for each process (files of mode 0600 in a temporary directory, each read and
    /// deleted by its process at start, the directory removed at the end), admits them all,
    /// and every node seals its datagrams in that mode.
    #[arg(long, value_name = "MODE", default_value_t = SecurityMode::Off)]
    security: SecurityMode,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Options of one demo process (set by the parent).
#[derive(Args, Debug, Clone)]
pub(crate) struct DemoNodeArgs {
    /// `pub` or `sub`.
    #[arg(long)]
    role: String,
    /// Index among the processes of its role.
    #[arg(long)]
    index: u32,
    /// The membership service: every replica's address, by index.
    #[arg(long, value_parser = parse_gms_addrs)]
    gms: GmsAddrs,
    #[arg(long)]
    publishers: u32,
    #[arg(long)]
    subscribers: u32,
    #[arg(long)]
    topics: u32,
    #[arg(long)]
    messages_per_topic: u64,
    #[arg(long)]
    size: u64,
    #[arg(long)]
    loss: f64,
    #[arg(long, value_enum)]
    transport: TransportArg,
    #[arg(long)]
    timeout_seconds: u64,
    #[arg(long)]
    rate: Option<u64>,
    /// This process's identity file (deleted once read), with `--service-key`.
    #[arg(long, requires = "service_key")]
    identity: Option<std::path::PathBuf>,
    /// The demo's service key.
    #[arg(long, requires = "identity")]
    service_key: Option<PublicKey>,
    /// How protocol datagrams are protected.
    #[arg(long, value_name = "MODE", default_value_t = SecurityMode::Off)]
    security: SecurityMode,
}

/// What a child reports, one JSON object per line.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "event", rename_all = "lowercase")]
enum Report {
    /// Subscribed (subscribers) or advertised (publishers) everything.
    Ready { node: u32 },
    /// Messages received so far.
    Progress { received: u64 },
    /// A subscriber's final account.
    Done(SubscriberResult),
    /// A publisher's final account.
    Published(PublisherResult),
    /// A child could not run.
    Failed { why: String },
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct SubscriberResult {
    topics: u32,
    expected: u64,
    received: u64,
    out_of_order: u64,
    duplicates: u64,
    malformed: u64,
    errors: Vec<String>,
    latency_us_p50: u64,
    latency_us_p99: u64,
    latency_us_p999: u64,
    latency_us_max: u64,
    injected_drops: u64,
    repairs_received: u64,
    pulls_sent: u64,
    view_changes: u64,
    regions: usize,
    #[serde(default)]
    sealing: SealCounts,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct PublisherResult {
    messages: u64,
    seconds: f64,
    stable: bool,
    retransmit_packets_sent: u64,
    #[serde(default)]
    sealing: SealCounts,
}

/// A node's sealed datagrams: sealed, opened, and refused when opening (any cause).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default)]
struct SealCounts {
    sealed: u64,
    opened: u64,
    refused: u64,
}

impl SealCounts {
    fn of(stats: &tidings_runtime::RuntimeStats) -> SealCounts {
        SealCounts {
            sealed: stats.sealing.sealed,
            opened: stats.sealing.open.opened,
            refused: stats.sealing.open.refused(),
        }
    }

    fn add(self, o: SealCounts) -> SealCounts {
        SealCounts {
            sealed: self.sealed + o.sealed,
            opened: self.opened + o.opened,
            refused: self.refused + o.refused,
        }
    }
}

/// A demo node's builder: the service's replicas, and its identity and sealing when the demo
/// runs with `--security` (the identity file is deleted once read).
fn demo_builder(a: &DemoNodeArgs) -> Result<tidings::NodeBuilder, String> {
    let builder = Node::builder().gms_replicas(&a.gms.0);
    let (Some(path), Some(key)) = (&a.identity, a.service_key) else {
        return Ok(builder);
    };
    let identity = Identity::read_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = std::fs::remove_file(path);
    Ok(builder
        .identity(identity)
        .service_key(key)
        .security(a.security))
}

/// Whether subscriber `s` takes topic `t`: about 70%, overlapping irregularly.
fn takes(s: u32, t: u32) -> bool {
    (u64::from(t) * 7 + u64::from(s) * 13 + u64::from(t / 10) * 3) % 10 < 7
}

fn topic_name(t: u32) -> String {
    format!("demo/{t}")
}

fn emit(report: &Report) {
    if let Ok(line) = serde_json::to_string(report) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Waits for a line on stdin equal to `word` (or its end).
fn wait_for_word(word: &str) {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        match line {
            Ok(l) if l.trim() == word => return,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

fn runtime_config(a: &DemoNodeArgs, loss: f64, seed: u64) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.transport = a.transport.transport();
    c.receive_loss = loss;
    c.receive_loss_seed = seed;
    c.raise_open_file_limit = true;
    c
}

/// What a failing demo node reports of itself: its id (two processes holding one id would merge
/// into one node), and enough to tell a silent membership service from a stalled core thread or
/// a lossy path.
fn node_state(node: &Node) -> String {
    let id = u64::from(node.id().0);
    match node.stats() {
        Ok(s) => {
            let r = &s.runtime;
            format!(
                "node {id}: {} GMS datagrams sent, {} received, {} memberships installed, {} \
                 datagrams dropped on purpose, {} core cycles, worst cycle {} us, worst alarm \
                 lateness {} us; GMS link: {} requests unacknowledged ({} resent), {} update \
                 items applied, {} batches committed, named requests waiting {} unbound and {} \
                 bound{}",
                r.gms_datagrams_sent,
                r.gms_datagrams_received,
                r.memberships_installed,
                r.injected_drops,
                r.cycles,
                r.cycle_time.max_us,
                r.alarm_lateness.max_us,
                r.gms_requests_unacknowledged,
                r.gms_requests_retransmitted,
                r.gms_updates_applied,
                r.gms_commits,
                r.gms_named_waiting.0,
                r.gms_named_waiting.1,
                if r.gms_removed { ", removed" } else { "" }
            )
        }
        Err(e) => format!("node {id}: stats unavailable: {e}"),
    }
}

/// Runs one demo process.
pub(crate) fn run_node(a: &DemoNodeArgs) -> ExitCode {
    let result = match a.role.as_str() {
        "sub" => run_subscriber(a),
        "pub" => run_publisher(a),
        other => Err(format!("unknown role {other:?}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            emit(&Report::Failed { why });
            ExitCode::FAILURE
        }
    }
}

/// A subscriber's running account.
#[derive(Default)]
struct Account {
    /// Next sequence number expected per (publisher, topic).
    next: BTreeMap<(u32, u32), u64>,
    out_of_order: u64,
    duplicates: u64,
    malformed: u64,
    errors: Vec<String>,
    latency: Option<hdrhistogram::Histogram<u64>>,
}

impl Account {
    fn note(&mut self, what: String) {
        if self.errors.len() < ERRORS_SHOWN_MAX {
            self.errors.push(what);
        }
    }

    fn record(&mut self, payload: &[u8], now_ns: u64) -> bool {
        let Some(header) = payload.get(..HEADER_BYTES) else {
            self.malformed += 1;
            self.note(format!("a message of {} bytes", payload.len()));
            return false;
        };
        let word =
            |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let long = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let (publisher, topic, seq, sent) = (word(0), word(4), long(8), long(16));
        let next = self.next.get(&(publisher, topic)).copied().unwrap_or(0);
        if seq < next {
            self.duplicates += 1;
            self.note(format!(
                "duplicate: publisher {publisher} topic {topic} seq {seq}"
            ));
            return false;
        }
        if seq > next {
            self.out_of_order += 1;
            self.note(format!(
                "gap or reorder: publisher {publisher} topic {topic} got {seq}, expected {next}"
            ));
        }
        self.next.insert((publisher, topic), seq + 1);
        if let Some(h) = self.latency.as_mut() {
            let _ = h.record(now_ns.saturating_sub(sent) / 1000);
        }
        true
    }
}

fn run_subscriber(a: &DemoNodeArgs) -> Result<(), String> {
    let node = demo_builder(a)?
        .runtime_config(runtime_config(a, a.loss, 1000 + u64::from(a.index)))
        .start()
        .map_err(|e| e.to_string())?;
    let account = Arc::new(Mutex::new(Account {
        latency: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).ok(),
        ..Account::default()
    }));
    let received = Arc::new(AtomicU64::new(0));
    let mut subscriptions = Vec::new();
    let mut topics = 0;
    let wanted = (0..a.topics).filter(|&t| takes(a.index, t)).count();
    for t in (0..a.topics).filter(|&t| takes(a.index, t)) {
        let topic = Topic::raw(topic_name(t)).map_err(|e| e.to_string())?;
        let asked = shared_clock_ns();
        let account = Arc::clone(&account);
        let received = Arc::clone(&received);
        let sub = node
            .subscribe_with(&topic, move |m| {
                let now = shared_clock_ns();
                let Ok(mut acc) = account.lock() else {
                    return;
                };
                match m {
                    Ok(m) => {
                        if acc.record(&m.value, now) {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        acc.malformed += 1;
                        acc.note(e.to_string());
                    }
                }
            })
            .map_err(|e| {
                format!(
                    "subscribing to {} ({} of {wanted}) failed after {:.1} s: {e}; {}",
                    topic_name(t),
                    topics + 1,
                    (shared_clock_ns() - asked) as f64 / 1e9,
                    node_state(&node)
                )
            })?;
        subscriptions.push(sub);
        topics += 1;
    }
    let expected = u64::from(topics) * u64::from(a.publishers) * a.messages_per_topic;
    emit(&Report::Ready { node: node.id().0 });
    // Report progress until everything arrived (or the parent gives up and says exit).
    let exit = Arc::new(AtomicBool::new(false));
    let exit_seen = Arc::clone(&exit);
    std::thread::spawn(move || {
        wait_for_word("exit");
        exit_seen.store(true, Ordering::Release);
    });
    let start = shared_clock_ns();
    let timeout_ns = a.timeout_seconds.saturating_mul(1_000_000_000);
    loop {
        let got = received.load(Ordering::Relaxed);
        emit(&Report::Progress { received: got });
        if got >= expected
            || exit.load(Ordering::Acquire)
            || shared_clock_ns().saturating_sub(start) > timeout_ns
        {
            break;
        }
        std::thread::sleep(PROGRESS_INTERVAL);
    }
    let stats = node.stats().map_err(|e| e.to_string())?.runtime;
    let result = {
        let acc = account
            .lock()
            .map_err(|_| "a delivery callback panicked".to_owned())?;
        let q = |p: f64| acc.latency.as_ref().map_or(0, |h| h.value_at_quantile(p));
        SubscriberResult {
            topics,
            expected,
            received: received.load(Ordering::Relaxed),
            out_of_order: acc.out_of_order,
            duplicates: acc.duplicates,
            malformed: acc.malformed,
            errors: acc.errors.clone(),
            latency_us_p50: q(0.5),
            latency_us_p99: q(0.99),
            latency_us_p999: q(0.999),
            latency_us_max: acc.latency.as_ref().map_or(0, hdrhistogram::Histogram::max),
            injected_drops: stats.injected_drops,
            repairs_received: stats.proto.repairs_received,
            pulls_sent: stats.proto.pulls_sent,
            view_changes: stats.proto.view_changes,
            regions: stats.groups_joined,
            sealing: SealCounts::of(&stats),
        }
    };
    emit(&Report::Done(result));
    while !exit.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(subscriptions);
    node.shutdown().map_err(|e| e.to_string())?;
    Ok(())
}

fn run_publisher(a: &DemoNodeArgs) -> Result<(), String> {
    let node = demo_builder(a)?
        .runtime_config(runtime_config(a, 0.0, 1))
        .start()
        .map_err(|e| e.to_string())?;
    let mut publishers = Vec::new();
    for t in 0..a.topics {
        let topic = Topic::raw(topic_name(t)).map_err(|e| e.to_string())?;
        let asked = shared_clock_ns();
        publishers.push(node.publisher(&topic).map_err(|e| {
            format!(
                "publishing on {} ({} of {}) failed after {:.1} s: {e}; {}",
                topic_name(t),
                t + 1,
                a.topics,
                (shared_clock_ns() - asked) as f64 / 1e9,
                node_state(&node)
            )
        })?);
    }
    emit(&Report::Ready { node: node.id().0 });
    wait_for_word("go");
    let size = usize::try_from(a.size).map_err(|e| e.to_string())?;
    let start = shared_clock_ns();
    let mut last = vec![None; publishers.len()];
    let mut buf = vec![0u8; size];
    // With a rate, message i is due at start + i / rate (a schedule, so pauses do not drift).
    let interval_ns = a.rate.map(|r| 1_000_000_000 / r.max(1));
    let mut published = 0u64;
    for seq in 0..a.messages_per_topic {
        for (t, publisher) in publishers.iter_mut().enumerate() {
            if let Some(interval) = interval_ns {
                let due = start.saturating_add(published.saturating_mul(interval));
                let now = shared_clock_ns();
                if due > now {
                    std::thread::sleep(Duration::from_nanos(due - now));
                }
                published += 1;
            }
            buf[0..4].copy_from_slice(&a.index.to_be_bytes());
            buf[4..8].copy_from_slice(&u32::try_from(t).unwrap_or(u32::MAX).to_be_bytes());
            buf[8..16].copy_from_slice(&seq.to_be_bytes());
            buf[16..24].copy_from_slice(&shared_clock_ns().to_be_bytes());
            let h = publisher
                .publish(&Bytes::copy_from_slice(&buf))
                .map_err(|e| e.to_string())?;
            last[t] = Some(h);
        }
    }
    let timeout = Duration::from_secs(a.timeout_seconds);
    let mut stable = true;
    for (publisher, h) in publishers.iter_mut().zip(&last) {
        if let Some(h) = h {
            stable &= publisher.wait_stable(*h, timeout).is_ok();
        }
    }
    let seconds = shared_clock_ns().saturating_sub(start) as f64 / 1e9;
    let stats = node.stats().map_err(|e| e.to_string())?.runtime;
    emit(&Report::Published(PublisherResult {
        messages: a.messages_per_topic * u64::from(a.topics),
        seconds,
        stable,
        retransmit_packets_sent: stats.proto.retransmit_packets_sent,
        sealing: SealCounts::of(&stats),
    }));
    wait_for_word("exit");
    drop(publishers);
    node.shutdown().map_err(|e| e.to_string())?;
    Ok(())
}

/// One child process as the parent sees it.
struct Proc {
    role: &'static str,
    index: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    fn say(&mut self, word: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{word}");
            let _ = stdin.flush();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A child still running here was not told to exit or did not: it must not outlive us.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn spawn(
    a: &DemoArgs,
    gms: &str,
    role: &'static str,
    index: u32,
    reports: &mpsc::Sender<(usize, Report)>,
    slot: usize,
    identities: Option<&RunIdentities>,
) -> Result<Proc, String> {
    let security: Vec<String> =
        match identities.and_then(|ids| Some((ids, ids.children.get(slot)?))) {
            Some((ids, path)) => vec![
                "--identity".to_owned(),
                path.to_string_lossy().into_owned(),
                "--service-key".to_owned(),
                ids.service.identity.public().to_string(),
                "--security".to_owned(),
                a.security.to_string(),
            ],
            None => Vec::new(),
        };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut child = Command::new(exe)
        .arg("demo-node")
        .args(["--role", role])
        .args(["--index", &index.to_string()])
        .args(["--gms", gms])
        .args(["--publishers", &a.publishers.to_string()])
        .args(["--subscribers", &a.subscribers.to_string()])
        .args(["--topics", &a.topics.to_string()])
        .args(["--messages-per-topic", &a.messages_per_topic.to_string()])
        .args(["--size", &a.size.to_string()])
        .args(["--loss", &a.loss.to_string()])
        .args(["--transport", &format!("{:?}", a.transport).to_lowercase()])
        .args(["--timeout-seconds", &a.timeout_seconds.to_string()])
        .args(
            a.rate
                .map(|r| vec!["--rate".to_owned(), r.to_string()])
                .unwrap_or_default(),
        )
        .args(security)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start a {role} process: {e}"))?;
    let stdin = child.stdin.take();
    if let Some(stdout) = child.stdout.take() {
        let tx = reports.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<Report>(&line) {
                    Ok(r) => {
                        if tx.send((slot, r)).is_err() {
                            return;
                        }
                    }
                    Err(_) => eprintln!("{role} {index}: {line}"),
                }
            }
        });
    }
    Ok(Proc {
        role,
        index,
        child,
        stdin,
    })
}

/// The summary of a demo run.
#[derive(Serialize, Debug, Default)]
struct Summary {
    verdict: &'static str,
    reasons: Vec<String>,
    publishers: u32,
    subscribers: u32,
    topics: u32,
    transport: String,
    messages_published: u64,
    messages_expected: u64,
    messages_delivered: u64,
    messages_lost: u64,
    out_of_order: u64,
    duplicates: u64,
    messages_per_sec: f64,
    deliveries_per_sec: f64,
    mb_per_sec: f64,
    elapsed_s: f64,
    latency_us: BTreeMap<&'static str, u64>,
    injected_drops: u64,
    repairs_received: u64,
    retransmit_packets_sent: u64,
    gms_members_after: usize,
    gms_removed_for_failure: usize,
    subscriber_killed: bool,
    /// Replicas of the membership service (1: the one-process service).
    gms_replicas: u16,
    /// Whether the leader replica was stopped mid-run.
    gms_leader_killed: bool,
    /// Messages per second per publisher, if paced.
    rate_per_publisher: Option<u64>,
    /// How protocol datagrams were protected (`--security`).
    security: String,
    /// Hellos the membership service admitted (0 without `--security`): one per process, and
    /// one more for each hello a process sent again before the welcome of the first arrived.
    identities_admitted: u64,
    /// Protocol datagrams sealed by every node.
    datagrams_sealed: u64,
    /// Sealed datagrams every node opened (authenticated, not replayed).
    datagrams_opened: u64,
    /// Sealed datagrams every node refused when opening (bad tag, unknown or retired key,
    /// replay ...): dropped before the protocol saw them.
    datagrams_refused: u64,
}

fn progress_bar(total: u64, quiet: bool) -> Option<indicatif::ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} deliveries ({per_sec}) {msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

/// Runs the demo.
pub(crate) fn run(a: &DemoArgs) -> ExitCode {
    if !(0.0..0.5).contains(&a.loss) {
        eprintln!("error: --loss must be a probability in [0, 0.5)");
        return ExitCode::from(2);
    }
    match demo(a) {
        Ok(summary) => {
            print_summary(a, &summary);
            if summary.verdict == "pass" {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(why) => {
            if a.json {
                let s = Summary {
                    verdict: "fail",
                    reasons: vec![why],
                    ..Summary::default()
                };
                println!("{}", serde_json::to_string(&s).unwrap_or_default());
            } else {
                eprintln!("error: {why}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The demo's membership service: one process's, or replicas on loopback.
enum Service {
    One(GmsServer),
    Replicated(Vec<GmsReplicaServer>),
}

impl Service {
    fn start(
        a: &DemoArgs,
        config: GmsConfig,
        security: Option<ServiceSecurity>,
    ) -> Result<Service, String> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let failed = |e: tidings_runtime::GmsServerError| {
            format!("cannot start the membership service: {e}")
        };
        let Some(n) = a.gms_replicas else {
            return GmsServer::start_secure(config, loopback, security)
                .map(Service::One)
                .map_err(failed);
        };
        let sockets = (0..n)
            .map(|_| std::net::UdpSocket::bind(loopback))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| failed(e.into()))?;
        let peers = sockets
            .iter()
            .map(std::net::UdpSocket::local_addr)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| failed(e.into()))?;
        let seed = fastrand::u64(..);
        // With security the replicas speak over sealed links, with identities drawn here.
        let mut replica_security: Vec<Option<ReplicaSecurity>> = match &security {
            Some(_) if n > 1 => ReplicaSecurity::generate(usize::from(n))
                .map_err(|e| format!("cannot generate the replicas' identities: {e}"))?
                .into_iter()
                .map(Some)
                .collect(),
            _ => vec![None; usize::from(n)],
        };
        let mut replicas = Vec::new();
        for (index, socket) in sockets.into_iter().enumerate() {
            let mut host = ReplicaHostConfig::default();
            host.replica.gms = config.clone();
            host.replica.index = index;
            host.replica.seed = seed.wrapping_add(index as u64);
            host.replica_security = replica_security.get_mut(index).and_then(Option::take);
            replicas.push(
                GmsReplicaServer::start_secure_on(host, peers.clone(), socket, security.clone())
                    .map_err(failed)?,
            );
        }
        Ok(Service::Replicated(replicas))
    }

    /// Every replica's address, by index, as `--gms` takes them.
    fn addrs(&self) -> String {
        let addrs: Vec<String> = match self {
            Service::One(s) => vec![s.local_addr().to_string()],
            Service::Replicated(r) => r.iter().map(|r| r.local_addr().to_string()).collect(),
        };
        addrs.join(",")
    }

    /// The service's state: the serving leader's, for replicas (any live replica's while none
    /// serves).
    fn snapshot(&self) -> Option<GmsSnapshot> {
        match self {
            Service::One(s) => s.snapshot(),
            Service::Replicated(replicas) => {
                let snaps: Vec<_> = replicas
                    .iter()
                    .filter_map(GmsReplicaServer::snapshot)
                    .collect();
                let snap = snaps
                    .iter()
                    .find(|s| s.serving)
                    .or_else(|| snaps.first())?
                    .clone();
                Some(GmsSnapshot {
                    members: snap.members,
                    member_metrics: snap.member_metrics,
                    topics: snap.topics,
                    removed: snap.removed.into_iter().map(|(n, c, _)| (n, c)).collect(),
                    stats: snap.stats,
                    member_states: Default::default(),
                    unknown_sources: snap.unknown_sources,
                    invalid_datagrams: snap.invalid_datagrams,
                    link: snap.link,
                })
            }
        }
    }

    /// Stops the serving leader replica abruptly; its index, if one served.
    fn kill_leader(&mut self) -> Option<usize> {
        let Service::Replicated(replicas) = self else {
            return None;
        };
        let slot = replicas
            .iter()
            .position(|r| r.snapshot().is_some_and(|s| s.serving))?;
        let leader = replicas.remove(slot);
        let index = leader.index();
        leader.shutdown();
        Some(index)
    }

    fn shutdown(self) {
        match self {
            Service::One(s) => s.shutdown(),
            Service::Replicated(replicas) => {
                replicas.into_iter().for_each(GmsReplicaServer::shutdown)
            }
        }
    }
}

/// What the membership service reports of itself when a demo process failed.
fn gms_state(server: &Service) -> String {
    match server.snapshot() {
        Some(g) => {
            format!(
                "membership service: {} members, {} topics, {} commands, {} updates sent ({} \
                 resent), {} duplicate and {} out-of-order requests, {} malformed, {} from \
                 unknown sources",
                g.members.len(),
                g.topics.len(),
                g.stats.commands,
                g.stats.updates_sent,
                g.stats.updates_retransmitted,
                g.stats.requests_duplicate,
                g.stats.requests_out_of_order,
                g.stats.malformed,
                g.unknown_sources
            ) + &member_states(&g)
        }
        None => "the membership service's thread has stopped".to_owned(),
    }
}

/// Each member's standing with the service (requests taken, updates unacknowledged, when last
/// heard from), and every removal with its cause.
fn member_states(g: &tidings_runtime::GmsSnapshot) -> String {
    let mut out = String::new();
    for (node, (m, ago)) in &g.member_states {
        out += &format!(
            "; node {}: {} requests taken, {} updates unacknowledged (sent up to {} times), \
             heard from {} ms ago, publishes {} topics{}",
            node.0,
            m.requests_taken,
            m.updates_unacknowledged,
            m.updates_sent_max_attempts,
            ago.as_millis(),
            m.publishes,
            if m.suspected { ", suspected" } else { "" }
        );
    }
    for (node, cause) in &g.removed {
        out += &format!("; node {} removed: {cause:?}", node.0);
    }
    out
}

fn wait_ready(
    procs: &[Proc],
    rx: &mpsc::Receiver<(usize, Report)>,
    want: &[usize],
) -> Result<(), String> {
    let mut pending: Vec<usize> = want.to_vec();
    let start = shared_clock_ns();
    while !pending.is_empty() {
        let left = READY_TIMEOUT.saturating_sub(Duration::from_nanos(shared_clock_ns() - start));
        match rx.recv_timeout(left) {
            Ok((slot, Report::Ready { .. })) => pending.retain(|&s| s != slot),
            Ok((slot, Report::Failed { why })) => {
                let p = &procs[slot];
                return Err(format!("{} {} failed: {why}", p.role, p.index));
            }
            Ok(_) => {}
            Err(_) => {
                return Err(format!(
                    "{} processes were not ready within {READY_TIMEOUT:?}",
                    pending.len()
                ))
            }
        }
    }
    Ok(())
}

fn demo(a: &DemoArgs) -> Result<Summary, String> {
    let multicast_port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())?;
    let gms_config = {
        let mut c = GmsConfig::default();
        c.multicast_pool = Some(MulticastPool {
            base: [239, 255, fastrand::u8(1..255), 0],
            prefix_len: 24,
            port: multicast_port,
            ports: MulticastPool::PORTS_DEFAULT,
            groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
        });
        c
    };
    let heartbeat_timeout = gms_config.heartbeat_timeout;
    let identities = match a.security {
        SecurityMode::Off => None,
        _ => Some(RunIdentities::new("demo", a.subscribers + a.publishers)?),
    };
    let mut server = Service::start(
        a,
        gms_config,
        identities.as_ref().map(|i| i.service.clone()),
    )?;
    let gms = server.addrs();
    if !a.json {
        eprintln!(
            "tidings demo: membership service on {gms}; {} publishers and {} subscribers \
             (separate processes), {} topics, {} messages per publisher per topic, {} B, \
             {:.1}% receive loss, {:?}, security {}",
            a.publishers,
            a.subscribers,
            a.topics,
            a.messages_per_topic,
            a.size,
            a.loss * 100.0,
            a.transport,
            a.security
        );
    }
    let (tx, rx) = mpsc::channel();
    let mut procs = Vec::new();
    for i in 0..a.subscribers {
        let slot = procs.len();
        procs.push(spawn(a, &gms, "sub", i, &tx, slot, identities.as_ref())?);
    }
    let subs: Vec<usize> = (0..procs.len()).collect();
    wait_ready(&procs, &rx, &subs).map_err(|why| format!("{why}; {}", gms_state(&server)))?;
    for i in 0..a.publishers {
        let slot = procs.len();
        procs.push(spawn(a, &gms, "pub", i, &tx, slot, identities.as_ref())?);
    }
    let pubs: Vec<usize> = (subs.len()..procs.len()).collect();
    wait_ready(&procs, &rx, &pubs).map_err(|why| format!("{why}; {}", gms_state(&server)))?;

    let expected_per_sub: Vec<u64> = (0..a.subscribers)
        .map(|s| {
            u64::from((0..a.topics).filter(|&t| takes(s, t)).count() as u32)
                * u64::from(a.publishers)
                * a.messages_per_topic
        })
        .collect();
    let total_expected: u64 = expected_per_sub.iter().sum();
    let bar = progress_bar(total_expected, a.json);
    let start = shared_clock_ns();
    for &p in &pubs {
        procs[p].say("go");
    }
    let mut progress = vec![0u64; subs.len()];
    // The subscriber killed on purpose (`--kill-subscriber`), once it is.
    let mut killed: Option<usize> = None;
    // The leader replica stopped on purpose (`--kill-gms-leader`), once it is.
    let mut gms_leader_killed: Option<usize> = None;
    let mut expected_live = total_expected;
    let mut done: BTreeMap<usize, SubscriberResult> = BTreeMap::new();
    let mut published: BTreeMap<usize, PublisherResult> = BTreeMap::new();
    let mut reasons = Vec::new();
    let deadline = Duration::from_secs(a.timeout_seconds);
    let mut finished_at = None;
    while done.len() + usize::from(killed.is_some()) < subs.len() || published.len() < pubs.len() {
        let elapsed = Duration::from_nanos(shared_clock_ns() - start);
        let Some(left) = deadline.checked_sub(elapsed) else {
            reasons.push(format!("timed out after {} s", a.timeout_seconds));
            break;
        };
        match rx.recv_timeout(left.min(Duration::from_millis(500))) {
            Ok((slot, Report::Progress { received })) => {
                if killed == Some(slot) {
                    continue;
                }
                if let Some(p) = progress.get_mut(slot) {
                    *p = received;
                }
                if let Some(bar) = &bar {
                    bar.set_position(progress.iter().sum());
                }
                if a.kill_gms_leader
                    && gms_leader_killed.is_none()
                    && progress.iter().sum::<u64>() * 4 >= total_expected
                {
                    gms_leader_killed = server.kill_leader();
                    if let (Some(bar), Some(i)) = (&bar, gms_leader_killed) {
                        bar.set_message(format!("stopped the leader replica {i}"));
                    }
                }
                if a.kill_subscriber
                    && killed.is_none()
                    && progress.iter().sum::<u64>() * 3 >= total_expected
                {
                    let victim = 0;
                    let _ = procs[victim].child.kill();
                    killed = Some(victim);
                    expected_live -= expected_per_sub[victim];
                    // What it had delivered no longer counts towards the total.
                    let had = std::mem::take(&mut progress[victim]);
                    if let Some(bar) = &bar {
                        bar.set_length(expected_live);
                        bar.set_position(progress.iter().sum());
                        bar.set_message(format!("killed subscriber 0 after {had} deliveries"));
                    }
                }
            }
            Ok((slot, Report::Done(r))) => {
                if let Some(p) = progress.get_mut(slot) {
                    *p = r.received;
                }
                if killed == Some(slot) {
                    continue;
                }
                done.insert(slot, r);
                if done.len() + usize::from(killed.is_some()) == subs.len() {
                    finished_at = Some(shared_clock_ns());
                }
            }
            Ok((slot, Report::Published(r))) => {
                if let Some(bar) = &bar {
                    bar.set_message(format!("publisher {} done", procs[slot].index));
                }
                published.insert(slot, r);
            }
            Ok((slot, Report::Failed { why })) => {
                reasons.push(format!(
                    "{} {} failed: {why}",
                    procs[slot].role, procs[slot].index
                ));
                break;
            }
            Ok((_, Report::Ready { .. })) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // A child that died without a word (other than the one killed on purpose).
                for (slot, p) in procs.iter_mut().enumerate() {
                    if killed == Some(slot) {
                        continue;
                    }
                    if let Ok(Some(status)) = p.child.try_wait() {
                        reasons.push(format!("{} {} exited early: {status}", p.role, p.index));
                    }
                }
                if !reasons.is_empty() {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let elapsed_ns = finished_at.unwrap_or_else(shared_clock_ns) - start;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    // Everyone leaves; the service must end up empty (clean shutdown leaves no trace).
    for p in &mut procs {
        p.say("exit");
        p.stdin = None;
    }
    let exit_start = shared_clock_ns();
    for (slot, p) in procs.iter_mut().enumerate() {
        loop {
            match p.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && killed != Some(slot) {
                        reasons.push(format!("{} {} exited with {status}", p.role, p.index));
                    }
                    break;
                }
                Ok(None) if Duration::from_nanos(shared_clock_ns() - exit_start) < EXIT_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    reasons.push(format!("{} {} did not exit; killed", p.role, p.index));
                    let _ = p.child.kill();
                    break;
                }
            }
        }
    }
    // Give the service a moment to process the last leaves. A killed subscriber is removed by
    // failure detection: when no ring neighbour was left to suspect it (everyone else finished
    // and left), that takes the heartbeat timeout from its last heartbeat.
    let settle_max = if killed.is_some() {
        heartbeat_timeout + Duration::from_secs(2)
    } else {
        Duration::from_secs(2)
    };
    let mut snapshot = server.snapshot();
    let settle = shared_clock_ns();
    while snapshot.as_ref().is_some_and(|s| !s.members.is_empty())
        && Duration::from_nanos(shared_clock_ns() - settle) < settle_max
    {
        std::thread::sleep(Duration::from_millis(20));
        snapshot = server.snapshot();
    }
    server.shutdown();
    let mut expected_per_sub = expected_per_sub;
    if let Some(k) = killed {
        expected_per_sub.remove(k);
    } else if a.kill_subscriber {
        reasons.push("the subscriber to kill was never killed".to_owned());
    }
    if a.kill_gms_leader && gms_leader_killed.is_none() {
        reasons.push("the leader replica to stop was never stopped".to_owned());
    }
    Ok(summarize(
        a,
        &done,
        &published,
        &expected_per_sub,
        elapsed_ns,
        snapshot,
        reasons,
    ))
}

fn summarize(
    a: &DemoArgs,
    done: &BTreeMap<usize, SubscriberResult>,
    published: &BTreeMap<usize, PublisherResult>,
    expected_per_sub: &[u64],
    elapsed_ns: u64,
    snapshot: Option<tidings_runtime::GmsSnapshot>,
    mut reasons: Vec<String>,
) -> Summary {
    let elapsed_s = elapsed_ns as f64 / 1e9;
    let expected: u64 = expected_per_sub.iter().sum();
    let delivered: u64 = done.values().map(|r| r.received).sum();
    let published_total: u64 = published.values().map(|r| r.messages).sum();
    let mut s = Summary {
        publishers: a.publishers,
        subscribers: a.subscribers,
        topics: a.topics,
        transport: format!("{:?}", a.transport).to_lowercase(),
        subscriber_killed: a.kill_subscriber,
        gms_replicas: a.gms_replicas.unwrap_or(1),
        gms_leader_killed: a.kill_gms_leader,
        rate_per_publisher: a.rate,
        messages_published: published_total,
        messages_expected: expected,
        messages_delivered: delivered,
        messages_lost: expected.saturating_sub(delivered),
        out_of_order: done.values().map(|r| r.out_of_order).sum(),
        duplicates: done.values().map(|r| r.duplicates).sum(),
        elapsed_s,
        injected_drops: done.values().map(|r| r.injected_drops).sum(),
        repairs_received: done.values().map(|r| r.repairs_received).sum(),
        retransmit_packets_sent: published.values().map(|r| r.retransmit_packets_sent).sum(),
        security: a.security.to_string(),
        ..Summary::default()
    };
    let sealing = done
        .values()
        .map(|r| r.sealing)
        .chain(published.values().map(|r| r.sealing))
        .fold(SealCounts::default(), SealCounts::add);
    s.datagrams_sealed = sealing.sealed;
    s.datagrams_opened = sealing.opened;
    s.datagrams_refused = sealing.refused;
    if a.security != SecurityMode::Off && (sealing.sealed == 0 || sealing.opened == 0) {
        reasons.push(format!(
            "--security {}: {} datagrams sealed and {} opened, expected some of each",
            a.security, sealing.sealed, sealing.opened
        ));
    }
    if elapsed_s > 0.0 {
        s.messages_per_sec = published_total as f64 / elapsed_s;
        s.deliveries_per_sec = delivered as f64 / elapsed_s;
        s.mb_per_sec = s.deliveries_per_sec * a.size as f64 / 1e6;
    }
    for (name, f) in [
        (
            "p50",
            (|r: &SubscriberResult| r.latency_us_p50) as fn(&SubscriberResult) -> u64,
        ),
        ("p99", |r| r.latency_us_p99),
        ("p999", |r| r.latency_us_p999),
        ("max", |r| r.latency_us_max),
    ] {
        // The worst subscriber's percentile: what every subscriber got at least.
        s.latency_us
            .insert(name, done.values().map(f).max().unwrap_or(0));
    }
    if done.len() < expected_per_sub.len() {
        reasons.push(format!(
            "{} of {} subscribers did not finish",
            expected_per_sub.len() - done.len(),
            expected_per_sub.len()
        ));
    }
    for (slot, r) in done {
        if r.received != r.expected || r.out_of_order > 0 || r.duplicates > 0 || r.malformed > 0 {
            reasons.push(format!(
                "subscriber {slot}: {} of {} messages, {} out of order, {} duplicates, {} \
                 malformed; first problems: {:?}",
                r.received, r.expected, r.out_of_order, r.duplicates, r.malformed, r.errors
            ));
        }
    }
    if published.len() < a.publishers as usize {
        reasons.push("not every publisher finished".to_owned());
    }
    if published.values().any(|r| !r.stable) {
        reasons.push("some messages never became stable".to_owned());
    }
    match snapshot {
        Some(snap) => {
            s.identities_admitted = snap.link.admitted;
            s.gms_members_after = snap.members.len();
            s.gms_removed_for_failure = snap
                .removed
                .iter()
                .filter(|(_, c)| *c != tidings_gms::RemoveCause::Left)
                .count();
            let want = usize::from(a.kill_subscriber);
            if s.gms_removed_for_failure != want {
                reasons.push(format!(
                    "{} nodes removed for failure, expected {want}",
                    s.gms_removed_for_failure
                ));
            }
            if !snap.members.is_empty() {
                reasons.push(format!(
                    "{} nodes still in the membership service after shutdown",
                    snap.members.len()
                ));
            }
        }
        None => reasons.push("the membership service stopped early".to_owned()),
    }
    s.verdict = if reasons.is_empty() { "pass" } else { "fail" };
    s.reasons = reasons;
    s
}

fn print_summary(a: &DemoArgs, s: &Summary) {
    if a.json {
        println!("{}", serde_json::to_string(s).unwrap_or_default());
        return;
    }
    println!("verdict: {}", s.verdict);
    for r in &s.reasons {
        println!("  - {r}");
    }
    println!(
        "delivered {} of {} messages ({} lost, {} out of order, {} duplicates) in {:.2} s",
        s.messages_delivered,
        s.messages_expected,
        s.messages_lost,
        s.out_of_order,
        s.duplicates,
        s.elapsed_s
    );
    println!(
        "throughput: {:.0} messages/s published, {:.0} deliveries/s ({:.1} MB/s delivered)",
        s.messages_per_sec, s.deliveries_per_sec, s.mb_per_sec
    );
    println!(
        "latency publish-to-callback (worst subscriber): p50 {} us, p99 {} us, p99.9 {} us, max {} us{}",
        s.latency_us.get("p50").copied().unwrap_or(0),
        s.latency_us.get("p99").copied().unwrap_or(0),
        s.latency_us.get("p999").copied().unwrap_or(0),
        s.latency_us.get("max").copied().unwrap_or(0),
        match a.rate {
            None => " (publishing as fast as back pressure allows: mostly time in queues; --rate N paces it)",
            Some(_) => "",
        }
    );
    println!(
        "loss: {} datagrams dropped on purpose at subscribers, {} messages recovered by repair, \
         {} retransmission packets from publishers",
        s.injected_drops, s.repairs_received, s.retransmit_packets_sent
    );
    if s.subscriber_killed {
        println!("subscriber 0 was killed (SIGKILL) a third of the way through");
    }
    if s.gms_replicas > 1 {
        println!("membership service: {} replicas (Raft)", s.gms_replicas);
    }
    if a.security == SecurityMode::Off {
        println!(
            "security: off (datagrams not sealed; --security authenticate|encrypt seals them)"
        );
    } else {
        println!(
            "security: {}: generated identities, {} admitted by the service; {} datagrams \
             sealed, {} opened, {} refused",
            s.security,
            s.identities_admitted,
            s.datagrams_sealed,
            s.datagrams_opened,
            s.datagrams_refused
        );
    }
    if s.gms_leader_killed {
        println!("the leader replica was stopped a quarter of the way through");
    }
    println!(
        "membership: {} nodes left in the service after shutdown, {} removed for failure",
        s.gms_members_after, s.gms_removed_for_failure
    );
}
