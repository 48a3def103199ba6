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
use tidings::{
    Acl, AllowList, Bytes, GmsConfig, GmsReplicaServer, Identity, MulticastConfig, MulticastPool,
    Node, PublicKey, ReplicaConfig, RuntimeConfig, SecurityMode, Topic, Transport,
};
use tidings_gms::{ReplicaSecurity, ServiceSecurity};
use tidings_runtime::{replica_data_dir, GmsServer, ReplicaHostConfig, STATE_FILE};

use crate::demo::TransportArg;

/// Interval of status lines.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Default address of the membership service (the first replica's with `--replicas`).
const GMS_DEFAULT: &str = "127.0.0.1:7300";

/// A list of membership service addresses, one per replica, by index (`a,b,c`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GmsAddrs(pub(crate) Vec<SocketAddr>);

/// Parses `a,b,c`: 1..=`REPLICAS_MAX` socket addresses, none twice.
pub(crate) fn parse_gms_addrs(s: &str) -> Result<GmsAddrs, String> {
    let addrs = s
        .split(',')
        .map(|a| {
            a.trim()
                .parse::<SocketAddr>()
                .map_err(|e| format!("{a:?} is not an address and port: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    tidings_runtime::check_peers(&addrs).map_err(|e| e.to_string())?;
    Ok(GmsAddrs(addrs))
}

/// Options of `tidings gms`.
#[derive(Args, Debug)]
pub(crate) struct GmsArgs {
    /// Address to serve on (nodes give it as `--gms`). Default 127.0.0.1:7300; with `--peers`,
    /// the replica's own entry of the list; with `--replicas N`, the first replica's, the others
    /// taking the next ports.
    #[arg(long)]
    bind: Option<SocketAddr>,
    /// Run one replica of a replicated service: its index in `--peers` (from 0).
    #[arg(long, requires = "peers", conflicts_with = "replicas")]
    id: Option<usize>,
    /// Every replica's address, by index, this one's included (`a,b,c`; nodes give the same
    /// list as `--gms`).
    #[arg(long, requires = "id", value_parser = parse_gms_addrs)]
    peers: Option<GmsAddrs>,
    /// Run this many replicas in this process, on consecutive ports from `--bind`, for trying
    /// the replicated service on one host (1..=7).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=7))]
    replicas: Option<u16>,
    /// Keep each replica's Raft state (term, vote, snapshot, log) in this directory, written
    /// before the replica sends anything, and restart a replica from it when it holds one
    /// (with `--replicas N`: one subdirectory `replica-I` per replica). Without it the state
    /// is in memory only: a restarted replica comes back empty under the same id. Alone (no
    /// `--id`, no `--replicas`) it runs the service as one replica that keeps its state here,
    /// so a restarted service knows its members and views and the group goes on.
    #[arg(long)]
    data_dir: Option<PathBuf>,
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
    /// Serve the service's metrics for Prometheus on this address (`GET /metrics`); with
    /// `--replicas N`, replica I on the port after it by I.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// The service's identity (`tidings keygen --out FILE`): with `--allow`, the service
    /// admits only the listed node identities, each after a Noise handshake; nodes join with
    /// `--identity` and the public key printed at start as `--service-key`.
    #[arg(long, requires = "allow")]
    identity: Option<PathBuf>,
    /// The admitted node identities: one public key a line, optionally followed by a name.
    #[arg(long, requires = "identity")]
    allow: Option<PathBuf>,
    /// This replica's own identity (`tidings keygen --out FILE`, one per replica, not the
    /// service's): with `--replica-keys`, Raft messages between replicas travel only inside
    /// Noise sessions between the listed replicas (ADR 44). Required with `--identity` and
    /// more than one `--peers`; with `--replicas N` the replicas' identities are generated.
    #[arg(long, requires_all = ["replica_keys", "peers"])]
    replica_identity: Option<PathBuf>,
    /// Every replica's public key, one a line in the order of `--peers` (line I is replica
    /// I's, its own included), optionally followed by a name; `#` starts a comment.
    #[arg(long, requires = "replica_identity")]
    replica_keys: Option<PathBuf>,
    /// Topic access rules, one a line: `allow|deny publish|subscribe|* WHO TOPICS`, WHO being
    /// `*`, a public key or a name from `--allow`, TOPICS a name or a prefix ending in `*`
    /// (docs/security.md). The first matching rule decides; what no rule allows is refused.
    /// Without it every node may publish and subscribe to every topic.
    #[arg(long, value_name = "FILE")]
    acl: Option<PathBuf>,
}

/// Most bytes of an `--acl` file (4096 rules of about 400 bytes).
const ACL_FILE_BYTES_MAX: u64 = 2 << 20;

/// The access rules of `--acl`, names resolved in the `--allow` list, printing their number
/// and fingerprint (compare it across the replicas of one service).
fn service_acl(a: &GmsArgs, security: Option<&ServiceSecurity>) -> Result<Acl, String> {
    let Some(path) = &a.acl else {
        return Ok(Acl::default());
    };
    let what = |e: &dyn std::fmt::Display| format!("--acl {}: {e}", path.display());
    let len = std::fs::metadata(path).map_err(|e| what(&e))?.len();
    if len > ACL_FILE_BYTES_MAX {
        return Err(what(&format!("larger than {ACL_FILE_BYTES_MAX} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| what(&e))?;
    let acl = Acl::parse(&text, security.map(|s| &s.allowed)).map_err(|e| what(&e))?;
    println!(
        "tidings gms: {} access rules, fingerprint {:016x}{}",
        acl.rules().len(),
        acl.fingerprint(),
        if acl.is_empty() {
            " (none: everything is allowed)"
        } else {
            " (what no rule allows is refused)"
        }
    );
    Ok(acl)
}

/// The service's security from `--identity` and `--allow`, printing its public key.
fn service_security(a: &GmsArgs) -> Result<Option<ServiceSecurity>, String> {
    let (Some(identity), Some(allow)) = (&a.identity, &a.allow) else {
        return Ok(None);
    };
    let identity = Identity::read_file(identity)
        .map_err(|e| format!("--identity {}: {e}", identity.display()))?;
    let allowed =
        AllowList::read_file(allow).map_err(|e| format!("--allow {}: {e}", allow.display()))?;
    println!(
        "tidings gms: admitting {} identities; service key {}",
        allowed.len(),
        identity.public()
    );
    Ok(Some(ServiceSecurity { identity, allowed }))
}

/// Most bytes of a `--replica-keys` file (a few lines of 44-character keys and names).
const REPLICA_KEYS_FILE_BYTES_MAX: u64 = 64 << 10;

/// This replica's security from `--replica-identity` and `--replica-keys`, checked against
/// `--peers` and `--id`.
fn replica_security(a: &GmsArgs) -> Result<Option<ReplicaSecurity>, String> {
    let (Some(identity), Some(keys), Some(peers), Some(id)) =
        (&a.replica_identity, &a.replica_keys, &a.peers, a.id)
    else {
        return Ok(None);
    };
    let identity = Identity::read_file(identity)
        .map_err(|e| format!("--replica-identity {}: {e}", identity.display()))?;
    let what = |e: &dyn std::fmt::Display| format!("--replica-keys {}: {e}", keys.display());
    let len = std::fs::metadata(keys).map_err(|e| what(&e))?.len();
    if len > REPLICA_KEYS_FILE_BYTES_MAX {
        return Err(what(&format!(
            "larger than {REPLICA_KEYS_FILE_BYTES_MAX} bytes"
        )));
    }
    let text = std::fs::read_to_string(keys).map_err(|e| what(&e))?;
    let keys = parse_replica_keys(&text).map_err(|e| what(&e))?;
    if keys.len() != peers.0.len() {
        return Err(what(&format!(
            "{} keys for {} --peers (one a replica, in the same order)",
            keys.len(),
            peers.0.len()
        )));
    }
    let security = ReplicaSecurity::new(identity, keys);
    // The same checks the replica makes at start, reported against the flags here.
    tidings_gms::ReplicaLink::new(security.clone(), id, Box::new(|| None)).map_err(|e| what(&e))?;
    println!(
        "tidings gms: replica {id} speaks to its {} peers over sealed links; replica key {}",
        peers.0.len() - 1,
        security.identity.public()
    );
    Ok(Some(security))
}

/// The keys of a `--replica-keys` file, in order: one a line, optionally followed by a name.
fn parse_replica_keys(text: &str) -> Result<Vec<PublicKey>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = line.split_whitespace().next().unwrap_or(line);
        let key = key
            .parse::<PublicKey>()
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        if keys.len() >= tidings_gms::REPLICAS_MAX {
            return Err(format!(
                "more than {} replica keys",
                tidings_gms::REPLICAS_MAX
            ));
        }
        keys.push(key);
    }
    Ok(keys)
}

/// The metrics address of the `i`-th server of this process, if metrics were asked for.
fn metrics_addr(a: &GmsArgs, i: usize) -> Option<Result<SocketAddr, String>> {
    let base = a.metrics?;
    Some(
        u16::try_from(i)
            .ok()
            .and_then(|i| base.port().checked_add(i))
            .map(|port| SocketAddr::new(base.ip(), port))
            .ok_or_else(|| format!("--metrics {base}: no port for replica {i}")),
    )
}

/// Runs the membership service.
pub(crate) fn gms(a: &GmsArgs) -> ExitCode {
    let security = match service_security(a) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let acl = match service_acl(a, security.as_ref()) {
        Ok(acl) => acl,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let config = {
        let mut c = GmsConfig::default();
        c.acl = acl;
        c.multicast_pool = if a.no_multicast {
            None
        } else {
            GmsConfig::default().multicast_pool.map(|p| MulticastPool {
                groups_max: a.multicast_groups,
                ..p
            })
        };
        c.heartbeat_timeout = Duration::from_millis(a.heartbeat_timeout_ms);
        c.suspicion_timeout = Duration::from_millis(a.suspicion_timeout_ms);
        c.suspicion_probes = a.suspicion_probes;
        c
    };
    if let Err(e) = config.validate() {
        eprintln!("error: {e} (--heartbeat-timeout-ms, --suspicion-timeout-ms)");
        return ExitCode::from(2);
    }
    // With a data directory the one-process service is a replicated service of one replica,
    // whose state survives a restart.
    if a.id.is_some() || a.replicas.is_some() || a.data_dir.is_some() {
        return gms_replicated(a, config, security);
    }
    let bind = a.bind.unwrap_or_else(default_gms);
    let server = match GmsServer::start_secure(config, bind, security) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot serve on {bind}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("tidings gms: serving on {}", server.local_addr());
    let _metrics = match metrics_addr(a, 0)
        .map(|m| m.and_then(|addr| server.serve_metrics(addr).map_err(|e| e.to_string())))
    {
        Some(Ok(m)) => {
            println!("tidings gms: metrics on http://{}/metrics", m.local_addr());
            Some(m)
        }
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        None => None,
    };
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

fn default_gms() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7300))
}

/// Runs one replica (`--id`, `--peers`), several in this process (`--replicas`), or, with only
/// `--data-dir`, a service of one replica that keeps its state there.
fn gms_replicated(a: &GmsArgs, gms: GmsConfig, security: Option<ServiceSecurity>) -> ExitCode {
    let (peers, binds, ids) = match (a.id, &a.peers, a.replicas) {
        (None, None, None) => {
            let bind = a.bind.unwrap_or_else(default_gms);
            (vec![bind], vec![bind], vec![0])
        }
        (Some(id), Some(peers), None) => {
            let Some(&own) = peers.0.get(id) else {
                eprintln!(
                    "error: --id {id} must be below the number of --peers ({})",
                    peers.0.len()
                );
                return ExitCode::from(2);
            };
            (peers.0.clone(), vec![a.bind.unwrap_or(own)], vec![id])
        }
        (None, None, Some(n)) => {
            let first = a.bind.unwrap_or_else(default_gms);
            if first.ip().is_unspecified() || first.port() == 0 {
                eprintln!(
                    "error: --bind {first} with --replicas must name an address others can \
                     reach and a port (the replicas take consecutive ports from it)"
                );
                return ExitCode::from(2);
            }
            let peers = (0..n)
                .map(|i| {
                    first
                        .port()
                        .checked_add(i)
                        .map(|p| SocketAddr::new(first.ip(), p))
                })
                .collect::<Option<Vec<_>>>();
            let Some(peers) = peers else {
                eprintln!("error: --bind {first}: --replicas {n} ports do not fit after it");
                return ExitCode::from(2);
            };
            (peers.clone(), peers, (0..usize::from(n)).collect())
        }
        // clap's `requires` and `conflicts_with` leave no other combination.
        _ => {
            eprintln!("error: give --id with --peers, or --replicas");
            return ExitCode::from(2);
        }
    };
    // The replicas' own identities: from the flags for `--id`, generated for `--replicas`.
    let mut replica_securities: Vec<Option<ReplicaSecurity>> = match replica_security(a) {
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Ok(Some(s)) => vec![Some(s)],
        Ok(None) if security.is_some() && peers.len() > 1 && a.replicas.is_some() => {
            match ReplicaSecurity::generate(peers.len()) {
                Ok(s) => s.into_iter().map(Some).collect(),
                Err(e) => {
                    eprintln!("error: cannot generate the replicas' identities: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Ok(None) if security.is_some() && peers.len() > 1 => {
            eprintln!(
                "error: with --identity, a replica of several (--peers) needs \
                 --replica-identity and --replica-keys: the Raft log holds the datagram key, \
                 so the replicas speak only over sealed links (docs/security.md)"
            );
            return ExitCode::from(2);
        }
        Ok(None) => Vec::new(),
    };
    let mut servers = Vec::new();
    for (i, (&index, &bind)) in ids.iter().zip(&binds).enumerate() {
        let config = {
            let mut c = ReplicaConfig::default();
            c.index = index;
            c.replicas = peers.len();
            c.seed = index as u64;
            c.gms = gms.clone();
            c
        };
        // One directory per replica: the given one for `--id`, a subdirectory of it for each
        // of `--replicas`.
        let data_dir = a.data_dir.as_ref().map(|d| {
            if a.replicas.is_some() {
                replica_data_dir(d, index)
            } else {
                d.clone()
            }
        });
        let host = {
            let mut c = ReplicaHostConfig::default();
            c.replica = config;
            c.data_dir = data_dir.clone();
            c.replica_security = replica_securities.get_mut(i).and_then(Option::take);
            c
        };
        let started = std::net::UdpSocket::bind(bind)
            .map_err(tidings_runtime::GmsServerError::Io)
            .and_then(|socket| {
                GmsReplicaServer::start_secure_on(host, peers.clone(), socket, security.clone())
            });
        match started {
            Ok(s) => servers.push((s, data_dir)),
            Err(e @ tidings_runtime::GmsServerError::Io(_)) => {
                eprintln!("error: replica {index} cannot serve on {bind}: {e}");
                return ExitCode::FAILURE;
            }
            Err(e @ tidings_runtime::GmsServerError::State { .. }) => {
                eprintln!("error: replica {index}: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: replica {index}: {e} (--id, --peers, --replicas)");
                return ExitCode::from(2);
            }
        }
    }
    let list: Vec<String> = peers.iter().map(SocketAddr::to_string).collect();
    for (s, data_dir) in &servers {
        let state = match (data_dir, s.restored_term()) {
            (Some(d), Some(term)) => format!(
                "restarted from {} at term {term}",
                d.join(STATE_FILE).display()
            ),
            (Some(d), None) => format!("state kept in {}", d.join(STATE_FILE).display()),
            (None, _) => "state in memory only: restarted, it comes back empty under the same \
                          id and takes the leader's snapshot (--data-dir keeps its votes and log)"
                .to_owned(),
        };
        println!(
            "tidings gms: replica {} of {} serving on {}, {state}",
            s.index(),
            peers.len(),
            s.local_addr()
        );
    }
    let servers: Vec<GmsReplicaServer> = servers.into_iter().map(|(s, _)| s).collect();
    let mut _metrics = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        match metrics_addr(a, i)
            .map(|m| m.and_then(|addr| s.serve_metrics(addr).map_err(|e| e.to_string())))
        {
            Some(Ok(m)) => {
                println!(
                    "tidings gms: replica {} metrics on http://{}/metrics",
                    s.index(),
                    m.local_addr()
                );
                _metrics.push(m);
            }
            Some(Err(e)) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            None => {}
        }
    }
    println!("tidings gms: nodes join with --gms {}", list.join(","));
    let mut elapsed = 0u64;
    loop {
        std::thread::sleep(STATUS_INTERVAL);
        elapsed += 1;
        if a.verbose {
            for s in servers.iter().filter_map(GmsReplicaServer::snapshot) {
                println!(
                    "replica {} term {} {} members {} topics {} removed {} views issued {} \
                     redirects {} snapshots {} state writes {}",
                    s.index,
                    s.term,
                    if s.serving { "leader" } else { "follower" },
                    s.members.len(),
                    s.topics.len(),
                    s.removed.len(),
                    s.stats.views_issued,
                    s.replica.redirects,
                    s.replica.snapshots_taken,
                    s.state_writes
                );
            }
        }
        if let Some(failure) = servers.iter().find_map(GmsReplicaServer::failure) {
            eprintln!("error: {failure}");
            for s in servers {
                s.shutdown();
            }
            return ExitCode::FAILURE;
        }
        if a.seconds.is_some_and(|s| elapsed >= s) {
            break;
        }
    }
    for s in servers {
        s.shutdown();
    }
    ExitCode::SUCCESS
}

/// How a node process reaches the group (shared by `node`, `pub` and `sub`).
#[derive(Args, Debug, Clone)]
pub(crate) struct JoinArgs {
    /// The membership service (`tidings gms`): its address, or every replica's, by index
    /// (`a,b,c`, the replicas' `--peers` list).
    #[arg(long, default_value = GMS_DEFAULT, value_parser = parse_gms_addrs)]
    gms: GmsAddrs,
    /// This node's unicast address.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Unicast fan-out or IP multicast.
    #[arg(long, value_enum, default_value_t = TransportArg::Unicast)]
    transport: TransportArg,
    /// Interface address for multicast.
    #[arg(long, default_value = "127.0.0.1")]
    interface: std::net::Ipv4Addr,
    /// Serve the node's metrics for Prometheus on this address (`GET /metrics`).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// This node's identity (`tidings keygen --out FILE`), for a service started with
    /// `--identity` and `--allow`: the node is admitted by a Noise handshake before it joins.
    #[arg(long, requires = "service_key")]
    identity: Option<PathBuf>,
    /// The service's public key (printed by `tidings gms --identity`); the node speaks only to
    /// a service that proves it holds it.
    #[arg(long, requires = "identity")]
    service_key: Option<PublicKey>,
    /// How protocol datagrams are protected: off, authenticate (an AEAD tag, payloads
    /// readable) or encrypt (payloads encrypted too). Default: encrypt with `--identity`, off
    /// without; anything but off needs `--identity`. Every node of a group uses the same.
    #[arg(long, value_name = "MODE")]
    security: Option<SecurityMode>,
}

impl JoinArgs {
    fn start(&self) -> Result<Node, String> {
        let transport = match self.transport {
            TransportArg::Unicast => Transport::Unicast,
            TransportArg::Multicast => Transport::Multicast({
                let mut c = MulticastConfig::default();
                c.interface = self.interface;
                c
            }),
        };
        let mut builder = match self.metrics {
            Some(addr) => Node::builder().metrics(addr),
            None => Node::builder(),
        };
        if let (Some(path), Some(key)) = (&self.identity, self.service_key) {
            let identity = Identity::read_file(path)
                .map_err(|e| format!("identity {}: {e}", path.display()))?;
            builder = builder.identity(identity).service_key(key);
        }
        if let Some(mode) = self.security {
            builder = builder.security(mode);
        }
        let node = builder
            .gms_replicas(&self.gms.0)
            .bind(self.bind)
            .runtime_config({
                let mut c = RuntimeConfig::default();
                // A command of its own process: a multicast node in many regions needs the
                // descriptors.
                c.raise_open_file_limit = true;
                c
            })
            .transport(transport)
            .start()
            .map_err(|e| e.to_string())?;
        if let Some(addr) = node.metrics_addr() {
            eprintln!("metrics on http://{addr}/metrics");
        }
        Ok(node)
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
            Err(tidings::PublishError::Timeout) => {
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
    /// Most messages delivered and not yet read (the subscription's queue); when full, the
    /// topic is held at this node and its publishers slowed.
    #[arg(long, default_value_t = 1024)]
    capacity: usize,
    /// Wait this long after each message: a deliberately slow reader (to see back pressure,
    /// or a slow subscriber in `tidings top`).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
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
    let sub = node
        .subscription(&topic)
        .capacity(a.capacity)
        .subscribe()
        .map_err(|e| e.to_string())?;
    // Subscribed (in force): say so on stderr, so scripts can start publishing.
    eprintln!("subscribed to {:?}", a.topic);
    let mut out = std::io::stdout().lock();
    let mut got = 0u64;
    let deadline = a.seconds.map(Duration::from_secs);
    let mut waited = Duration::ZERO;
    let slice = Duration::from_millis(100);
    // Whether the subscription held its topic when last looked at (its queue full: stdout is
    // slower than the topic), and how often it had; said on stderr when it changes.
    let (mut held, mut times) = (false, 0u64);
    while a.count.is_none_or(|c| got < c) {
        if deadline.is_some_and(|d| waited >= d) {
            break;
        }
        let state = sub.bottleneck();
        let now_held = state.since.is_some();
        if state.times > times || now_held != held {
            if now_held && (!held || state.times > times) {
                eprintln!(
                    "bottleneck: {:?} is full ({} queued); its streams are held at this node",
                    a.topic,
                    sub.queued()
                );
            } else if !now_held {
                eprintln!("recovered: {:?} has room again", a.topic);
            }
            (held, times) = (now_held, state.times);
        }
        match sub.recv_timeout(slice) {
            Ok(m) => {
                got += 1;
                let _ = out.write_all(&m.value);
                let _ = out.write_all(b"\n");
                let _ = out.flush();
                if a.delay_ms > 0 {
                    std::thread::sleep(Duration::from_millis(a.delay_ms));
                }
            }
            Err(tidings::RecvError::Timeout) => waited += slice,
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
/// gms = "127.0.0.1:7300"         # or every replica's: "127.0.0.1:7300,127.0.0.1:7301,..."
/// bind = "127.0.0.1:0"
/// transport = "unicast"        # or "multicast"
/// interface = "127.0.0.1"      # for multicast
/// subscribe = ["prices/eu", "prices/us"]
/// print = false                 # print every message to stdout
/// seconds = 60                  # run this long (default: until killed)
/// identity = "node.key"         # with service_key: be admitted by a secured service
/// service_key = "ab12..."       # the key `tidings gms --identity` prints
/// security = "encrypt"          # off, authenticate or encrypt (default: encrypt with identity)
/// ```
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    gms: String,
    #[serde(default = "default_bind")]
    bind: SocketAddr,
    #[serde(default = "default_transport")]
    transport: TransportArg,
    #[serde(default = "default_interface")]
    interface: std::net::Ipv4Addr,
    /// Serve the node's metrics on this address (`GET /metrics`).
    #[serde(default)]
    metrics: Option<SocketAddr>,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    print: bool,
    seconds: Option<u64>,
    /// This node's identity file, for a service that admits only its allow list.
    #[serde(default)]
    identity: Option<PathBuf>,
    /// The service's public key (with `identity`).
    #[serde(default)]
    service_key: Option<String>,
    /// How protocol datagrams are protected (`off`, `authenticate`, `encrypt`).
    #[serde(default)]
    security: Option<String>,
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
    /// Serve the node's metrics for Prometheus on this address (`GET /metrics`); overrides
    /// `metrics` in the file.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// How protocol datagrams are protected (off, authenticate, encrypt); overrides
    /// `security` in the file.
    #[arg(long, value_name = "MODE")]
    security: Option<SecurityMode>,
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
    let gms = parse_gms_addrs(&file.gms)
        .map_err(|e| format!("{}: gms = {:?}: {e}", a.config.display(), file.gms))?;
    let service_key = file
        .service_key
        .as_deref()
        .map(str::parse::<PublicKey>)
        .transpose()
        .map_err(|e| format!("{}: service_key: {e}", a.config.display()))?;
    if file.identity.is_some() != service_key.is_some() {
        return Err(format!(
            "{}: identity and service_key go together",
            a.config.display()
        ));
    }
    let security = file
        .security
        .as_deref()
        .map(str::parse::<SecurityMode>)
        .transpose()
        .map_err(|e| format!("{}: security: {e}", a.config.display()))?;
    let join = JoinArgs {
        gms,
        bind: file.bind,
        transport: file.transport,
        interface: file.interface,
        metrics: a.metrics.or(file.metrics),
        identity: file.identity,
        service_key,
        security: a.security.or(security),
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
        node.id(),
        node.local_addr(),
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

#[cfg(test)]
mod tests {
    use super::{parse_gms_addrs, parse_replica_keys};

    #[test]
    fn replica_key_files_keep_their_order() {
        let a = tidings::Identity::from_private([1; 32]).unwrap();
        let b = tidings::Identity::from_private([2; 32]).unwrap();
        let text = format!("# replicas\n{} r0\n\n{}\n", a.public(), b.public());
        let keys = parse_replica_keys(&text).unwrap();
        assert_eq!(keys, vec![*a.public(), *b.public()]);
        assert!(parse_replica_keys("not-a-key r0").is_err());
        let many = format!("{}\n", a.public()).repeat(8);
        assert!(parse_replica_keys(&many).is_err());
    }

    #[test]
    fn gms_address_lists_are_checked() {
        let two = parse_gms_addrs("127.0.0.1:7300, 127.0.0.1:7301").unwrap();
        assert_eq!(two.0.len(), 2);
        assert_eq!(two.0[1].port(), 7301);
        for bad in [
            "",
            "127.0.0.1:7300,",
            "127.0.0.1:7300,127.0.0.1:7300",
            "0.0.0.0:7300",
            "127.0.0.1:0",
            "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5,127.0.0.1:6,127.0.0.1:7,127.0.0.1:8",
        ] {
            assert!(parse_gms_addrs(bad).is_err(), "{bad:?}");
        }
    }
}
