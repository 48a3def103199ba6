//! `tidings gms`, `tidings node`, `tidings pub` and `tidings sub`: the membership service and
//! nodes as long-running processes, for real deployments and for trying tidings by hand.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use tidings::{Bytes, GmsConfig, MulticastConfig, MulticastPool, Node, Topic, Transport};
use tidings_runtime::GmsServer;

use crate::demo::TransportArg;

/// Interval of status lines.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Options of `tidings gms`.
#[derive(Args, Debug)]
pub(crate) struct GmsArgs {
    /// Address to serve on (nodes give it as `--gms`).
    #[arg(long, default_value = "127.0.0.1:7300")]
    bind: SocketAddr,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    seconds: Option<u64>,
    /// Hand out unicast regions only (no multicast group pool).
    #[arg(long)]
    no_multicast: bool,
    /// Most multicast groups handed out; regions past that many share the least loaded one.
    #[arg(long, default_value_t = MulticastPool::GROUPS_MAX_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..))]
    multicast_groups: u32,
    /// A node not heard from for this long is removed, in milliseconds (its heartbeats come
    /// every 500 ms).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_timeout_ms: u64,
    /// A node suspected by a ring neighbour and silent for this long after the suspicion is
    /// removed, in milliseconds (at most the heartbeat timeout).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    suspicion_timeout_ms: u64,
    /// Probes sent to a suspected node over the suspicion timeout; each asks it to answer at
    /// once (0: none).
    #[arg(long, default_value_t = 4)]
    suspicion_probes: u32,
    /// Print a status line every second.
    #[arg(long)]
    verbose: bool,
}

/// Runs the membership service.
pub(crate) fn gms(a: &GmsArgs) -> ExitCode {
    let config = GmsConfig {
        multicast_pool: if a.no_multicast {
            None
        } else {
            GmsConfig::default().multicast_pool.map(|p| MulticastPool {
                groups_max: a.multicast_groups,
                ..p
            })
        },
        heartbeat_timeout: Duration::from_millis(a.heartbeat_timeout_ms),
        suspicion_timeout: Duration::from_millis(a.suspicion_timeout_ms),
        suspicion_probes: a.suspicion_probes,
        ..GmsConfig::default()
    };
    if let Err(e) = config.validate() {
        eprintln!("error: {e} (--heartbeat-timeout-ms, --suspicion-timeout-ms)");
        return ExitCode::from(2);
    }
    let server = match GmsServer::start(config, a.bind) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot serve on {}: {e}", a.bind);
            return ExitCode::FAILURE;
        }
    };
    println!("tidings gms: serving on {}", server.local_addr());
    let mut elapsed = 0u64;
    loop {
        std::thread::sleep(STATUS_INTERVAL);
        elapsed += 1;
        if a.verbose {
            if let Some(s) = server.snapshot() {
                println!(
                    "members {} topics {} removed {} views issued {} suspicions {} probes {}",
                    s.members.len(),
                    s.topics.len(),
                    s.removed.len(),
                    s.stats.views_issued,
                    s.stats.suspicions_accepted,
                    s.stats.probes_sent
                );
            }
        }
        if a.seconds.is_some_and(|s| elapsed >= s) {
            break;
        }
    }
    server.shutdown();
    ExitCode::SUCCESS
}

/// How a node process reaches the group (shared by `node`, `pub` and `sub`).
#[derive(Args, Debug, Clone)]
pub(crate) struct JoinArgs {
    /// The membership service (`tidings gms`).
    #[arg(long, default_value = "127.0.0.1:7300")]
    gms: SocketAddr,
    /// This node's unicast address.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Unicast fan-out or IP multicast.
    #[arg(long, value_enum, default_value_t = TransportArg::Unicast)]
    transport: TransportArg,
    /// Interface address for multicast.
    #[arg(long, default_value = "127.0.0.1")]
    interface: std::net::Ipv4Addr,
}

impl JoinArgs {
    fn start(&self) -> Result<Node, String> {
        let transport = match self.transport {
            TransportArg::Unicast => Transport::Unicast,
            TransportArg::Multicast => Transport::Multicast(MulticastConfig {
                interface: self.interface,
                ..MulticastConfig::default()
            }),
        };
        Node::builder()
            .gms(self.gms)
            .bind(self.bind)
            .transport(transport)
            .start()
            .map_err(|e| e.to_string())
    }
}

/// Options of `tidings pub`.
#[derive(Args, Debug)]
pub(crate) struct PubArgs {
    /// The topic.
    topic: String,
    #[command(flatten)]
    join: JoinArgs,
    /// Publish this many generated messages instead of reading lines from stdin.
    #[arg(long)]
    generate: Option<u64>,
    /// Size of generated messages in bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Most generated messages per second (default: as fast as back pressure allows).
    #[arg(long)]
    rate: Option<f64>,
    /// Longest wait for the last message to become stable before exiting.
    #[arg(long, default_value_t = 30)]
    stable_timeout_seconds: u64,
}

/// Publishes lines from stdin (one message each) or generated messages, then waits until they
/// are stable and leaves.
pub(crate) fn publish(a: &PubArgs) -> ExitCode {
    match publish_inner(a) {
        Ok(n) => {
            eprintln!("published {n} messages on {:?}; all stable", a.topic);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn publish_inner(a: &PubArgs) -> Result<u64, String> {
    if a.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err("--rate must be positive".to_owned());
    }
    let topic = Topic::raw(a.topic.clone()).map_err(|e| e.to_string())?;
    let node = a.join.start()?;
    let mut publisher = node.publisher(&topic).map_err(|e| e.to_string())?;
    let mut last = None;
    let mut count = 0u64;
    let mut stalled = String::new();
    match a.generate {
        Some(n) => {
            let interval = a.rate.map(|r| Duration::from_secs_f64(1.0 / r));
            let mut payload = vec![b'x'; a.size];
            for i in 0..n {
                let text = format!("{i} ");
                let k = text.len().min(payload.len());
                payload[..k].copy_from_slice(&text.as_bytes()[..k]);
                last = Some(publish_watching(
                    &node,
                    &mut publisher,
                    &Bytes::copy_from_slice(&payload),
                    &mut stalled,
                )?);
                count += 1;
                if let Some(d) = interval {
                    std::thread::sleep(d);
                }
            }
        }
        None => {
            for line in std::io::stdin().lock().lines() {
                let line = line.map_err(|e| format!("reading stdin: {e}"))?;
                last = Some(publish_watching(
                    &node,
                    &mut publisher,
                    &Bytes::from(line.into_bytes()),
                    &mut stalled,
                )?);
                count += 1;
            }
        }
    }
    if let Some(h) = last {
        publisher
            .wait_stable(h, Duration::from_secs(a.stable_timeout_seconds))
            .map_err(|e| e.to_string())?;
    }
    drop(publisher);
    node.shutdown().map_err(|e| e.to_string())?;
    Ok(count)
}

/// How long `tidings pub` waits under back pressure before it looks whether the node's
/// messages are stalled (and says so).
const STALL_LOOK_INTERVAL: Duration = Duration::from_secs(1);

/// Publishes `value`, waiting under back pressure as long as it takes; while it waits, says on
/// stderr whom the node's unstable messages wait for when regions stall, and when they resume.
/// `stalled` is what was said last.
fn publish_watching(
    node: &tidings::Node,
    publisher: &mut tidings::Publisher<Bytes>,
    value: &Bytes,
    stalled: &mut String,
) -> Result<tidings::PublishHandle, String> {
    loop {
        match publisher.publish_timeout(value, STALL_LOOK_INTERVAL) {
            Ok(h) => {
                if !stalled.is_empty() {
                    eprintln!("resumed: the stalled regions acknowledged");
                    stalled.clear();
                }
                return Ok(h);
            }
            Err(tidings::Error::Timeout(_)) => {
                let stats = node.stats().map_err(|e| e.to_string())?;
                let now: Vec<String> = stats.runtime.stalls.iter().map(|s| s.to_string()).collect();
                let now = now.join("; ");
                if !now.is_empty() && now != *stalled {
                    eprintln!("stalled: {now}");
                }
                *stalled = now;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Options of `tidings sub`.
#[derive(Args, Debug)]
pub(crate) struct SubArgs {
    /// The topic.
    topic: String,
    #[command(flatten)]
    join: JoinArgs,
    /// Exit after this many messages.
    #[arg(long)]
    count: Option<u64>,
    /// Exit after this many seconds.
    #[arg(long)]
    seconds: Option<u64>,
}

/// Prints every message of a topic to stdout, one per line (bytes that are not UTF-8 are
/// replaced), until `--count` or `--seconds`.
pub(crate) fn subscribe(a: &SubArgs) -> ExitCode {
    match subscribe_inner(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn subscribe_inner(a: &SubArgs) -> Result<(), String> {
    let topic = Topic::raw(a.topic.clone()).map_err(|e| e.to_string())?;
    let node = a.join.start()?;
    let sub = node.subscribe(&topic).map_err(|e| e.to_string())?;
    // Subscribed (in force): say so on stderr, so scripts can start publishing.
    eprintln!("subscribed to {:?}", a.topic);
    let mut out = std::io::stdout().lock();
    let mut got = 0u64;
    let deadline = a.seconds.map(Duration::from_secs);
    let mut waited = Duration::ZERO;
    let slice = Duration::from_millis(100);
    while a.count.is_none_or(|c| got < c) {
        if deadline.is_some_and(|d| waited >= d) {
            break;
        }
        match sub.recv_timeout(slice) {
            Ok(m) => {
                got += 1;
                let _ = out.write_all(&m.value);
                let _ = out.write_all(b"\n");
                let _ = out.flush();
            }
            Err(tidings::Error::Timeout(_)) => waited += slice,
            Err(e) => return Err(e.to_string()),
        }
    }
    drop(sub);
    node.shutdown().map_err(|e| e.to_string())?;
    Ok(())
}

/// A node's configuration file (TOML).
///
/// ```toml
/// gms = "127.0.0.1:7300"
/// bind = "127.0.0.1:0"
/// transport = "unicast"        # or "multicast"
/// interface = "127.0.0.1"      # for multicast
/// subscribe = ["prices/eu", "prices/us"]
/// print = false                 # print every message to stdout
/// seconds = 60                  # run this long (default: until killed)
/// ```
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    gms: SocketAddr,
    #[serde(default = "default_bind")]
    bind: SocketAddr,
    #[serde(default = "default_transport")]
    transport: TransportArg,
    #[serde(default = "default_interface")]
    interface: std::net::Ipv4Addr,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    print: bool,
    seconds: Option<u64>,
}

fn default_bind() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
fn default_transport() -> TransportArg {
    TransportArg::Unicast
}
fn default_interface() -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::LOCALHOST
}

/// Options of `tidings node`.
#[derive(Args, Debug)]
pub(crate) struct NodeArgs {
    /// The node's configuration file (TOML; see `crates/cli/README.md`).
    #[arg(long)]
    config: PathBuf,
}

/// Runs a member from a configuration file: joins, subscribes to its topics, and prints a status
/// line every second (and every message with `print = true`).
pub(crate) fn node(a: &NodeArgs) -> ExitCode {
    match node_inner(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn node_inner(a: &NodeArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.config)
        .map_err(|e| format!("cannot read {}: {e}", a.config.display()))?;
    let file: NodeFile =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", a.config.display()))?;
    let join = JoinArgs {
        gms: file.gms,
        bind: file.bind,
        transport: file.transport,
        interface: file.interface,
    };
    let node = join.start()?;
    let received = Arc::new(AtomicU64::new(0));
    let mut subscriptions = Vec::new();
    for name in &file.subscribe {
        let topic = Topic::raw(name.clone()).map_err(|e| e.to_string())?;
        let received = Arc::clone(&received);
        let print = file.print;
        let name = name.clone();
        subscriptions.push(
            node.subscribe_with(&topic, move |m| {
                received.fetch_add(1, Ordering::Relaxed);
                if print {
                    if let Ok(m) = m {
                        println!("{name}: {}", String::from_utf8_lossy(&m.value));
                    }
                }
            })
            .map_err(|e| e.to_string())?,
        );
    }
    eprintln!(
        "node {:?} on {} joined {}; subscribed to {:?}",
        node.id().map_err(|e| e.to_string())?,
        node.local_addr().map_err(|e| e.to_string())?,
        file.gms,
        file.subscribe
    );
    let mut elapsed = 0u64;
    loop {
        std::thread::sleep(STATUS_INTERVAL);
        elapsed += 1;
        let s = node.stats().map_err(|e| e.to_string())?.runtime;
        eprintln!(
            "received {} delivered {} repairs {} memberships {}",
            received.load(Ordering::Relaxed),
            s.deliveries,
            s.proto.repairs_received,
            s.memberships_installed
        );
        if s.gms_removed {
            return Err("the membership service removed this node".to_owned());
        }
        if file.seconds.is_some_and(|d| elapsed >= d) {
            break;
        }
    }
    drop(subscriptions);
    node.shutdown().map_err(|e| e.to_string())?;
    Ok(())
}
