//! One replica of the replicated membership service on a real UDP socket:
//! [`GmsReplicaServer`] runs the sans-IO [`tidings_gms::Replica`] on its own thread
//! (`tidings gms --bind ADDR --id N --peers a,b,c`, `tidings gms --replicas 3`, tests).
//!
//! One socket carries both kinds of traffic. Client datagrams are framed as a single service's
//! ([`frame`], [`GMS_MAGIC`](crate::GMS_MAGIC)); only the serving leader answers them, the others redirect
//! (ADR 32). Replica-to-replica datagrams start with [`REPLICA_MAGIC`] and are taken only from
//! the configured peer addresses, each known by its index in the list; others are counted and
//! dropped. A replica message longer than a datagram (a snapshot of a large state) is cut into
//! fragments by the replica itself (`ReplicaConfig::fragment_bytes`, set here to what fits one
//! datagram with the magic) and put together by the receiving replica: the host sends and
//! receives each fragment as its own datagram.
//!
//! With replica security ([`ReplicaHostConfig::replica_security`], ADR 44) the Raft messages
//! travel only inside Noise sessions between the listed replicas (`tidings_gms::ReplicaLink`):
//! their datagrams start with [`REPLICA_LINK_MAGIC`] instead, plain replica datagrams are
//! counted and dropped, and so is anything from a replica whose key is not listed.
//!
//! Members are known by the address their datagrams come from, which the host puts in their
//! `Join`: so the replicated state holds it ([`Gms::member_addr`]), and a replica that becomes
//! leader reaches the members another replica welcomed.
//!
//! With a data directory ([`ReplicaHostConfig::data_dir`], `tidings gms --data-dir`) the host
//! keeps the replica's durable state (`Replica::durable`: Raft's hard state, the latest snapshot
//! and the log after it) in the file [`STATE_FILE`] there: it writes it, whenever
//! `Replica::durable_generation` moved, before it sends anything the replica queued (a
//! temporary file, fsync, rename, fsync of the directory), and a host started on a directory
//! that holds a state restarts the replica from it (`Replica::restart`). A state of another
//! replica index or count is refused. Without one the state stays in memory: a replica whose
//! process stops comes back empty under the same Raft id and catches up from the leader's
//! snapshot, having forgotten its votes and the entries it acknowledged.
//!
//! [`Gms::member_addr`]: tidings_gms::Gms::member_addr

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tidings_gms::replica::{decode_durable, encode_durable, DurableLimits};
use tidings_gms::{
    GmsEvent, GmsMessage, GmsStats, Peer, RemoveCause, Replica, ReplicaConfig, ReplicaEvent,
    ReplicaLink, ReplicaLinkStats, ReplicaSecurity, ReplicaStats, ReplicaTransmit, ServiceLink,
    ServiceLinkStats, ServiceSecurity, REPLICAS_MAX, REPLICA_LINK_MAGIC, REPLICA_LINK_OVERHEAD,
};
use tidings_proto::{NodeId, Time, TopicId};

use crate::clock;
use crate::gms_server::{frame, open_admitted, send_admitted, unframe, GmsServerError};

/// The first bytes of a replica-to-replica datagram: distinct from [`GMS_MAGIC`](crate::GMS_MAGIC), so that a
/// client's datagram is never taken for a Raft message, nor the other way round.
pub const REPLICA_MAGIC: [u8; 4] = *b"TGR\x01";

/// Longest sleep of the replica thread, so that shutdown and snapshot requests are served.
const SERVER_TICK: Duration = Duration::from_millis(10);
/// Joins remembered (by nonce) until welcomed; more are dropped and counted, so forged joins
/// cannot grow the table.
const JOINERS_MAX: usize = 65_536;
/// Largest datagram read or sent (a UDP payload over IPv4 is at most 65,507 bytes).
const DATAGRAM_BYTES_MAX: usize = 65_507;
// The replicas' default fragment size is exactly what fits one datagram behind the magic.
const _: () = assert!(
    tidings_gms::replica::FRAGMENT_BYTES_DEFAULT + REPLICA_MAGIC.len() == DATAGRAM_BYTES_MAX
);
/// The receive buffer a replica's socket asks for: a snapshot's fragments leave in one burst,
/// and a buffer smaller than the snapshot drops its tail (the kernel caps the request at
/// `net.core.rmem_max` unless the process may force it).
const RECV_BUFFER_BYTES: usize = 8 << 20;

/// The replica's state file in its data directory.
pub const STATE_FILE: &str = "replica.state";
/// Where the state is written before it is renamed over [`STATE_FILE`].
const STATE_FILE_TMP: &str = "replica.state.tmp";
/// Most datagrams handled, when the state is kept in a file, before what they changed is
/// written and their answers sent (a burst costs one write, not one per datagram).
const STATE_BATCH_DATAGRAMS: usize = 64;

/// How a replica host runs its replica.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ReplicaHostConfig {
    /// The replica's configuration (`replicas` is set from the address list).
    pub replica: ReplicaConfig,
    /// Where the replica's durable state is kept ([`STATE_FILE`] inside; created if missing).
    /// `None`: in memory only, so a restarted replica comes back empty under the same Raft id.
    pub data_dir: Option<PathBuf>,
    /// This replica's identity and every replica's public key (ADR 44): Raft messages travel
    /// only inside Noise sessions between listed replicas, and plain or unadmitted replica
    /// datagrams are counted and dropped. Required when the service admits only its allow list
    /// and has more than one replica (the datagram key is in the Raft log). `None`: plain Raft
    /// datagrams, for a trusted network.
    pub replica_security: Option<ReplicaSecurity>,
}

/// The data directory of replica `index` when several replicas share `dir`
/// (`tidings gms --replicas N --data-dir DIR`, [`GmsReplicaServer::start_loopback_in`]).
#[must_use]
pub fn replica_data_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("replica-{index}"))
}

/// What a replica looks like now (for tests and `tidings gms`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaSnapshot {
    /// This replica's index.
    pub index: usize,
    /// Its Raft term.
    pub term: u64,
    /// Whether it is the serving leader.
    pub serving: bool,
    /// The leader it knows of, by index.
    pub leader: Option<usize>,
    /// The members (as applied here) and the address each sends from.
    pub members: BTreeMap<NodeId, SocketAddr>,
    /// Where members serve their metrics, as applied here (`Gms::member_metrics`).
    pub member_metrics: Vec<(NodeId, SocketAddr)>,
    /// Topic names bound so far.
    pub topics: BTreeMap<String, TopicId>,
    /// Every removal applied here, in order: the node, why, and when this replica applied it.
    pub removed: Vec<(NodeId, RemoveCause, Time)>,
    /// When this replica last became the serving leader, if it serves now.
    pub leading_since: Option<Time>,
    /// When it first issued a view (applied a new view epoch) since then.
    pub first_view_leading: Option<Time>,
    /// The service's counters (the replicated state's, as applied here).
    pub stats: GmsStats,
    /// The replica's counters (Raft messages, redirects, snapshots...).
    pub replica: ReplicaStats,
    /// Client datagrams from addresses that are not members (and not joins), dropped.
    pub unknown_sources: u64,
    /// Removal notices sent, as the serving leader, to those sources (so they join again).
    pub removal_notices: u64,
    /// Datagrams with neither framing, dropped.
    pub invalid_datagrams: u64,
    /// Replica datagrams from addresses that are not configured peers, dropped.
    pub foreign_replica_datagrams: u64,
    /// Replica datagrams too large for one datagram, not sent. None are expected: the replica
    /// cuts longer messages into fragments that fit.
    pub oversized: u64,
    /// The receive buffer the kernel granted the replica's socket, in bytes.
    pub socket_recv_buffer_bytes: usize,
    /// Writes of the state file (0 without a data directory).
    pub state_writes: u64,
    /// Bytes of the last state file written.
    pub state_bytes: u64,
    /// Time spent writing the state file (encoding, writes, fsyncs, rename), in total.
    pub state_write_time: Duration,
    /// The longest single write of the state file.
    pub state_write_time_max: Duration,
    /// The admitted link's counters (all zero when the service admits anyone).
    pub link: ServiceLinkStats,
    /// The sealed replica links' counters (all zero when replicas speak plain Raft).
    pub replica_link: ReplicaLinkStats,
}

/// A running replica of the membership service.
#[derive(Debug)]
pub struct GmsReplicaServer {
    index: usize,
    local_addr: SocketAddr,
    restored_term: Option<u64>,
    failure: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    snapshots: SyncSender<SyncSender<ReplicaSnapshot>>,
    thread: Option<JoinHandle<()>>,
}

impl GmsReplicaServer {
    /// Binds `bind` and starts replica `config.index` of the service whose replicas are at
    /// `peers` (every replica's address by index, this one's included), its state in memory
    /// only. `config.replicas` is set to the number of peers.
    pub fn start(
        config: ReplicaConfig,
        peers: Vec<SocketAddr>,
        bind: SocketAddr,
    ) -> Result<GmsReplicaServer, GmsServerError> {
        GmsReplicaServer::start_host(
            ReplicaHostConfig {
                replica: config,
                data_dir: None,
                replica_security: None,
            },
            peers,
            bind,
        )
    }

    /// As [`start`](GmsReplicaServer::start), on a socket already bound.
    pub fn start_on(
        config: ReplicaConfig,
        peers: Vec<SocketAddr>,
        socket: UdpSocket,
    ) -> Result<GmsReplicaServer, GmsServerError> {
        GmsReplicaServer::start_host_on(
            ReplicaHostConfig {
                replica: config,
                data_dir: None,
                replica_security: None,
            },
            peers,
            socket,
        )
    }

    /// As [`start`](GmsReplicaServer::start), keeping the replica's state in
    /// `host.data_dir` if given: a directory that holds a state restarts the replica from it
    /// (it must be the state of replica `index` of as many replicas as `peers` lists), an
    /// empty or missing one starts a new replica there.
    pub fn start_host(
        host: ReplicaHostConfig,
        peers: Vec<SocketAddr>,
        bind: SocketAddr,
    ) -> Result<GmsReplicaServer, GmsServerError> {
        let socket = UdpSocket::bind(bind)?;
        GmsReplicaServer::start_host_on(host, peers, socket)
    }

    /// As [`start_host`](GmsReplicaServer::start_host), on a socket already bound.
    pub fn start_host_on(
        host: ReplicaHostConfig,
        peers: Vec<SocketAddr>,
        socket: UdpSocket,
    ) -> Result<GmsReplicaServer, GmsServerError> {
        GmsReplicaServer::start_secure_on(host, peers, socket, None)
    }

    /// As [`start_host_on`](GmsReplicaServer::start_host_on); with `security`, the replica
    /// admits only the identities of its allow list, each after a Noise handshake, and speaks
    /// with nodes only over the handshake's session (plain GMS datagrams are dropped). Every
    /// replica of a service has the same identity and list. A service of several replicas
    /// with `security` needs `host.replica_security` too ([`GmsServerError::Peers`] otherwise),
    /// so that its Raft log, which holds the datagram key, never crosses the network in clear.
    pub fn start_secure_on(
        host: ReplicaHostConfig,
        peers: Vec<SocketAddr>,
        socket: UdpSocket,
        security: Option<ServiceSecurity>,
    ) -> Result<GmsReplicaServer, GmsServerError> {
        let mut config = host.replica;
        check_peers(&peers)?;
        config.replicas = peers.len();
        if security.is_some() && peers.len() > 1 && host.replica_security.is_none() {
            return Err(GmsServerError::Peers(
                "a service that admits only its allow list needs the replicas' identities and \
                 keys (replica security) when it has more than one replica: its Raft log holds \
                 the datagram key"
                    .to_owned(),
            ));
        }
        let replica_link = match host.replica_security {
            Some(mut s) => {
                s.stamp_base = clock::wall_micros();
                Some(
                    ReplicaLink::new(s, config.index, crate::config::os_entropy())
                        .map_err(|e| GmsServerError::Peers(e.to_string()))?,
                )
            }
            None => None,
        };
        let overhead = if replica_link.is_some() {
            REPLICA_LINK_OVERHEAD
        } else {
            REPLICA_MAGIC.len()
        };
        // Every replica datagram (a whole message or a fragment) must fit one datagram with its
        // framing; appends are cut to fit one too, so that one lost datagram loses one append.
        config.fragment_bytes = config.fragment_bytes.min(DATAGRAM_BYTES_MAX - overhead);
        config.append_bytes_max = config
            .append_bytes_max
            .min(config.fragment_bytes as u64 / 2);
        let index = config.index;
        // Used only if this replica is the first leader of a service without state.
        config.gms.incarnation = crate::config::draw_incarnation();
        // Datagram keys go to admitted members only, over their encrypted links.
        config.gms.datagram_keys = security.is_some();
        config.validate()?;
        let store = host.data_dir.map(StateStore::open).transpose()?;
        let kept = match &store {
            Some(store) => store.load(&config)?,
            None => None,
        };
        let restored_term = kept.as_ref().map(tidings_gms::Durable::term);
        let replica = match kept {
            Some(durable) => Replica::restart(config, durable)?,
            None => Replica::new(config)?,
        };
        socket.set_read_timeout(Some(SERVER_TICK))?;
        let socket_recv_buffer_bytes = set_recv_buffer(&socket);
        let local_addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let (snapshots, requests) = mpsc::sync_channel(4);
        let mut host = Host {
            replica,
            store,
            written_generation: None,
            state_writes: 0,
            state_bytes: 0,
            state_write_time: Duration::ZERO,
            state_write_time_max: Duration::ZERO,
            failure: Arc::clone(&failure),
            socket,
            peers,
            requests,
            stop: Arc::clone(&stop),
            joiners: HashMap::new(),
            members: BTreeMap::new(),
            by_addr: HashMap::new(),
            topics: BTreeMap::new(),
            removed: Vec::new(),
            leading_since: None,
            first_view_leading: None,
            views_at_lead: 0,
            snapshots_restored: 0,
            unknown_sources: 0,
            removal_notices: 0,
            invalid_datagrams: 0,
            foreign_replica_datagrams: 0,
            oversized: 0,
            socket_recv_buffer_bytes,
            secure: security.map(|s| ServiceLink::new(s, crate::config::os_entropy())),
            replica_link,
        };
        // The state is on disk before the replica says anything, and a restarted replica's
        // members (restored from its snapshot) are reachable at once.
        host.persist().map_err(|(path, e)| GmsServerError::State {
            path,
            reason: format!("cannot write: {e}"),
        })?;
        host.rebuild_addresses();
        let thread = std::thread::Builder::new()
            .name(format!("tidings-gms-{index}"))
            .spawn(crate::oplog::in_span(
                tracing::info_span!(target: crate::oplog::GMS_TARGET, "gms_replica", index),
                move || host.run(),
            ))?;
        Ok(GmsReplicaServer {
            index,
            local_addr,
            restored_term,
            failure,
            stop,
            snapshots,
            thread: Some(thread),
        })
    }

    /// Starts `replicas` replicas on loopback ports the system picks, each with `config`
    /// (its `index` set), and returns them by index: their addresses are the list members
    /// join with.
    pub fn start_loopback(
        config: &ReplicaConfig,
        replicas: usize,
    ) -> Result<Vec<GmsReplicaServer>, GmsServerError> {
        GmsReplicaServer::start_loopback_in(config, replicas, None)
    }

    /// As [`start_loopback`](GmsReplicaServer::start_loopback), each replica keeping its
    /// state in [`replica_data_dir`]`(data_dir, index)` if `data_dir` is given.
    pub fn start_loopback_in(
        config: &ReplicaConfig,
        replicas: usize,
        data_dir: Option<&Path>,
    ) -> Result<Vec<GmsReplicaServer>, GmsServerError> {
        GmsReplicaServer::start_loopback_secure(config, replicas, data_dir, None)
    }

    /// As [`start_loopback_in`](GmsReplicaServer::start_loopback_in); with `security`, the
    /// service admits only its allow list and, with more than one replica, the replicas speak
    /// over sealed links with identities generated here ([`ReplicaSecurity::generate`]).
    pub fn start_loopback_secure(
        config: &ReplicaConfig,
        replicas: usize,
        data_dir: Option<&Path>,
        security: Option<ServiceSecurity>,
    ) -> Result<Vec<GmsReplicaServer>, GmsServerError> {
        let mut replica_security = match &security {
            Some(_) if replicas > 1 => ReplicaSecurity::generate(replicas)
                .map_err(|e| GmsServerError::Peers(format!("replica identities: {e}")))?
                .into_iter()
                .map(Some)
                .collect(),
            _ => vec![None; replicas],
        };
        let sockets = (0..replicas)
            .map(|_| UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))))
            .collect::<io::Result<Vec<_>>>()?;
        let peers = sockets
            .iter()
            .map(UdpSocket::local_addr)
            .collect::<io::Result<Vec<_>>>()?;
        sockets
            .into_iter()
            .enumerate()
            .map(|(index, socket)| {
                let host = ReplicaHostConfig {
                    replica: {
                        let mut c = config.clone();
                        c.index = index;
                        c.seed = config.seed.wrapping_add(index as u64);
                        c
                    },
                    data_dir: data_dir.map(|d| replica_data_dir(d, index)),
                    replica_security: replica_security.get_mut(index).and_then(Option::take),
                };
                GmsReplicaServer::start_secure_on(host, peers.clone(), socket, security.clone())
            })
            .collect()
    }

    /// The term of the state this replica restarted from, if it found one in its data
    /// directory.
    #[must_use]
    pub fn restored_term(&self) -> Option<u64> {
        self.restored_term
    }

    /// Why the replica stopped by itself, if it did: its state could not be written (it sends
    /// nothing it has not kept, so it stops instead, as a crash would).
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// This replica's index.
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// The address the replica's socket is bound to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The replica's state and counters now; `None` if the thread has stopped.
    #[must_use]
    pub fn snapshot(&self) -> Option<ReplicaSnapshot> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.snapshots.send(reply).ok()?;
        answer.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Serves the replica's metrics on `bind` (`GET /metrics`) until the returned server is
    /// dropped.
    pub fn serve_metrics(
        &self,
        bind: SocketAddr,
    ) -> Result<crate::metrics::MetricsServer, crate::metrics::MetricsError> {
        crate::metrics::serve_snapshots(
            bind,
            self.snapshots.clone(),
            crate::metrics::register_replica,
        )
    }

    /// Stops the replica's thread and closes its socket at once, with no goodbye: to the
    /// other replicas and the members it is a crash.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for GmsReplicaServer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Asks for [`RECV_BUFFER_BYTES`] of receive buffer (forced if the process may) and returns
/// what the kernel granted (0 if it cannot tell).
fn set_recv_buffer(socket: &UdpSocket) -> usize {
    let s = socket2::SockRef::from(socket);
    let _ = s.set_recv_buffer_size(RECV_BUFFER_BYTES);
    // The kernel reports twice what it granted (its bookkeeping).
    if s.recv_buffer_size().unwrap_or(0) < RECV_BUFFER_BYTES.saturating_mul(2) {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(socket, RECV_BUFFER_BYTES);
    }
    s.recv_buffer_size().unwrap_or(0)
}

/// Checks a replica address list: 1..=[`REPLICAS_MAX`] addresses, none twice, none
/// unspecified or of port 0 (others must be able to send there).
pub fn check_peers(peers: &[SocketAddr]) -> Result<(), GmsServerError> {
    if !(1..=REPLICAS_MAX).contains(&peers.len()) {
        return Err(GmsServerError::Peers(format!(
            "{} replica addresses: must be 1..={REPLICAS_MAX}",
            peers.len()
        )));
    }
    for (i, p) in peers.iter().enumerate() {
        if p.ip().is_unspecified() || p.port() == 0 {
            return Err(GmsServerError::Peers(format!(
                "replica address {p} must be reachable (not 0.0.0.0 or port 0)"
            )));
        }
        if peers.get(..i).is_some_and(|before| before.contains(p)) {
            return Err(GmsServerError::Peers(format!(
                "replica address {p} is named twice"
            )));
        }
    }
    Ok(())
}

/// A replica's data directory: its state file, written whole each time.
struct StateStore {
    dir: PathBuf,
    path: PathBuf,
    tmp: PathBuf,
}

impl StateStore {
    /// The directory, created if missing.
    fn open(dir: PathBuf) -> Result<StateStore, GmsServerError> {
        fs::create_dir_all(&dir).map_err(|e| GmsServerError::State {
            path: dir.clone(),
            reason: format!("cannot create the data directory: {e}"),
        })?;
        Ok(StateStore {
            path: dir.join(STATE_FILE),
            tmp: dir.join(STATE_FILE_TMP),
            dir,
        })
    }

    /// The state kept here, if any: checked to be replica `config.index`'s of
    /// `config.replicas`. A temporary file left by a write that a crash cut short is removed
    /// (the state file is the one renamed last).
    fn load(&self, config: &ReplicaConfig) -> Result<Option<tidings_gms::Durable>, GmsServerError> {
        let err = |reason: String| GmsServerError::State {
            path: self.path.clone(),
            reason,
        };
        let _ = fs::remove_file(&self.tmp);
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(format!("cannot read: {e}"))),
        };
        let limits = DurableLimits::default();
        let mut bytes = Vec::new();
        file.take(limits.bytes_max as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| err(format!("cannot read: {e}")))?;
        let kept = decode_durable(&bytes, limits).map_err(|e| {
            err(format!(
                "{e}; move it away to start this replica empty (it then takes the leader's \
                 snapshot, but may vote again in a term it voted in)"
            ))
        })?;
        if (kept.index, kept.replicas) != (config.index, config.replicas) {
            let hint = if kept.replicas == config.replicas {
                "give each replica its own data directory"
            } else {
                "a service keeps its number of replicas (a new service starts in empty directories)"
            };
            return Err(err(format!(
                "holds the state of replica {} of {}, but this is replica {} of {}: {hint}",
                kept.index, kept.replicas, config.index, config.replicas
            )));
        }
        Ok(Some(kept.durable))
    }

    /// Replaces the state file with `bytes`: written to a temporary file, synced, renamed
    /// over the state file, and the directory synced, so that a crash leaves the old state or
    /// the new one, whole.
    fn write(&self, bytes: &[u8]) -> Result<(), (PathBuf, io::Error)> {
        let at = |p: &Path| {
            let p = p.to_path_buf();
            move |e| (p, e)
        };
        let mut f = File::create(&self.tmp).map_err(at(&self.tmp))?;
        f.write_all(bytes).map_err(at(&self.tmp))?;
        f.sync_all().map_err(at(&self.tmp))?;
        drop(f);
        fs::rename(&self.tmp, &self.path).map_err(at(&self.path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(at(&self.dir))
    }
}

/// The replica thread's state.
struct Host {
    replica: Replica,
    /// The data directory, if the state is kept on disk.
    store: Option<StateStore>,
    /// The replica's durable generation last written.
    written_generation: Option<u64>,
    state_writes: u64,
    state_bytes: u64,
    state_write_time: Duration,
    state_write_time_max: Duration,
    failure: Arc<Mutex<Option<String>>>,
    socket: UdpSocket,
    /// Every replica's address, by index.
    peers: Vec<SocketAddr>,
    requests: Receiver<SyncSender<ReplicaSnapshot>>,
    stop: Arc<AtomicBool>,
    /// Where each joiner's `Join` came from, by nonce, until it is welcomed.
    joiners: HashMap<u64, SocketAddr>,
    members: BTreeMap<NodeId, SocketAddr>,
    by_addr: HashMap<SocketAddr, NodeId>,
    topics: BTreeMap<String, TopicId>,
    removed: Vec<(NodeId, RemoveCause, Time)>,
    leading_since: Option<Time>,
    first_view_leading: Option<Time>,
    /// Views issued (as applied) when this replica became leader.
    views_at_lead: u64,
    /// Snapshots restored when the address table was last rebuilt.
    snapshots_restored: u64,
    unknown_sources: u64,
    removal_notices: u64,
    invalid_datagrams: u64,
    foreign_replica_datagrams: u64,
    oversized: u64,
    socket_recv_buffer_bytes: usize,
    /// The admitted link, when the service admits only its allow list.
    secure: Option<ServiceLink<SocketAddr>>,
    /// The sealed links with the other replicas, with replica security.
    replica_link: Option<ReplicaLink>,
}

impl Host {
    /// Sends the framed `datagram` to the node at `to`, sealed in its session when the link is
    /// admitted (nothing is sent to an address without one).
    fn send_client(&mut self, framed: &[u8], to: SocketAddr) {
        send_admitted(self.secure.as_mut(), &self.socket, framed, to);
    }

    fn run(&mut self) {
        let mut buf = vec![0u8; DATAGRAM_BYTES_MAX + 1];
        while !self.stop.load(Ordering::Acquire) {
            let now = clock::service_now();
            let due = match (
                self.replica.poll_timeout(),
                self.replica_link
                    .as_ref()
                    .and_then(ReplicaLink::poll_timeout),
            ) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let wait = due
                .map_or(SERVER_TICK, |t| t.saturating_duration_since(now))
                .clamp(Duration::from_millis(1), SERVER_TICK);
            // A zero timeout would mean "block forever" to the socket.
            let _ = self.socket.set_read_timeout(Some(wait));
            if let Ok((len, from)) = self.socket.recv_from(&mut buf) {
                let now = clock::service_now();
                if let Some(datagram) = buf.get(..len) {
                    self.on_datagram(now, from, datagram);
                }
                // Drain what else is queued without waiting. With a state file, one write
                // (and its fsyncs) covers up to `STATE_BATCH_DATAGRAMS` datagrams.
                let batch = if self.store.is_some() {
                    STATE_BATCH_DATAGRAMS
                } else {
                    1
                };
                let mut unflushed = 1;
                let _ = self.socket.set_nonblocking(true);
                while let Ok((len, from)) = self.socket.recv_from(&mut buf) {
                    if let Some(datagram) = buf.get(..len) {
                        self.on_datagram(now, from, datagram);
                    }
                    unflushed += 1;
                    if unflushed >= batch {
                        self.flush(now);
                        unflushed = 0;
                    }
                }
                let _ = self.socket.set_nonblocking(false);
            }
            // Timeouts, interruptions and ICMP errors from peers that went away: nothing to do.
            let now = clock::service_now();
            if self.replica.poll_timeout().is_some_and(|t| t <= now) {
                self.replica.handle_timeout(now);
            }
            if let Some(link) = self.replica_link.as_mut() {
                if link.poll_timeout().is_some_and(|t| t <= now) {
                    link.handle_timeout(now);
                }
            }
            self.flush(now);
            while let Ok(reply) = self.requests.try_recv() {
                let _ = reply.send(self.snapshot());
            }
        }
    }

    fn on_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let plain = datagram.starts_with(&REPLICA_MAGIC);
        if plain || datagram.starts_with(&REPLICA_LINK_MAGIC) {
            let index = self
                .peers
                .iter()
                .position(|&p| p == from)
                .filter(|&i| i != self.replica.config().index);
            let Some(index) = index else {
                self.foreign_replica_datagrams += 1;
                return;
            };
            match (self.replica_link.as_mut(), plain) {
                (None, true) => {
                    if let Some(body) = datagram.get(REPLICA_MAGIC.len()..) {
                        self.replica.handle_replica(now, index, body);
                    }
                }
                // Sealed replica datagrams to a replica without replica security.
                (None, false) => self.foreign_replica_datagrams += 1,
                (Some(link), true) => link.drop_plain(),
                (Some(link), false) => {
                    if let Some(message) = link.receive(now, index, datagram) {
                        self.replica.handle_replica(now, index, &message);
                    }
                }
            }
            return;
        }
        let Some(datagram) = open_admitted(self.secure.as_mut(), &self.socket, from, datagram)
        else {
            return;
        };
        let Some(body) = unframe(&datagram) else {
            self.invalid_datagrams += 1;
            return;
        };
        let known = self.by_addr.get(&from).copied();
        match GmsMessage::decode(body) {
            Ok(GmsMessage::Join { nonce, addr }) => {
                if self.joiners.len() >= JOINERS_MAX && !self.joiners.contains_key(&nonce) {
                    self.unknown_sources += 1;
                    return;
                }
                self.joiners.insert(nonce, from);
                // The address goes into the replicated state, for whichever replica leads.
                let join = GmsMessage::Join {
                    nonce,
                    addr: Some(addr.unwrap_or(from)),
                };
                let mut bytes = Vec::with_capacity(64);
                join.encode(&mut bytes);
                self.replica.handle_client(now, Peer::Joiner(nonce), &bytes);
            }
            // Counted by the replica as malformed.
            Err(_) => {
                self.replica
                    .handle_client(now, known.map_or(Peer::Joiner(0), Peer::Node), body)
            }
            Ok(_) => match known {
                Some(node) => {
                    // The identity its admitted session proved: the access rules check it.
                    let identity = self.secure.as_ref().and_then(|l| l.peer(&from)).copied();
                    self.replica
                        .handle_client_as(now, Peer::Node(node), identity.as_ref(), body);
                }
                None => {
                    self.unknown_sources += 1;
                    // A serving leader has applied every committed entry, so its member table
                    // is complete: a source it does not know is no member (the service lost
                    // it, e.g. every replica restarted without its state, or removed it) and
                    // is told so, to join again. Followers and a leader still catching up
                    // cannot tell, and stay silent. Stamped with the term like every leader
                    // message, so a client refuses it from a deposed leader (ADR 32 item 6).
                    // One short reply per datagram.
                    if self.replica.is_serving() {
                        self.removal_notices += 1;
                        let notice = GmsMessage::Stamped {
                            term: self.replica.term(),
                            msg: Box::new(GmsMessage::Update {
                                seq: 0,
                                items: vec![tidings_gms::Item::Removed],
                            }),
                        };
                        self.send_client(&frame(&notice), from);
                    }
                }
            },
        }
    }

    /// Writes the replica's durable state if it changed since the last write.
    fn persist(&mut self) -> Result<(), (PathBuf, io::Error)> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let generation = self.replica.durable_generation();
        if self.written_generation == Some(generation) {
            return Ok(());
        }
        let started = clock::service_now();
        let config = self.replica.config();
        let mut bytes = Vec::with_capacity(self.state_bytes as usize + 4096);
        encode_durable(
            config.index,
            config.replicas,
            &self.replica.durable(),
            &mut bytes,
        );
        store.write(&bytes)?;
        let took = clock::service_now().saturating_duration_since(started);
        self.written_generation = Some(generation);
        self.state_writes += 1;
        self.state_bytes = bytes.len() as u64;
        self.state_write_time += took;
        self.state_write_time_max = self.state_write_time_max.max(took);
        Ok(())
    }

    /// Sends what the replica queued and follows its events. The durable state is written
    /// first; if it cannot be, nothing is sent and the replica stops.
    fn flush(&mut self, now: Time) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        if let Err((path, e)) = self.persist() {
            if let Ok(mut f) = self.failure.lock() {
                *f = Some(format!(
                    "replica {}: cannot write its state ({}: {e}); stopped",
                    self.replica.config().index,
                    path.display()
                ));
            }
            self.stop.store(true, Ordering::Release);
            return;
        }
        if self.replica.wants_key_entropy() {
            if let Some(bytes) = tidings_seal::os_random::<32>() {
                self.replica.give_key_entropy(now, bytes);
            }
        }
        while let Some(t) = self.replica.poll_transmit() {
            match t {
                ReplicaTransmit::Client(t) => {
                    let to = match t.to {
                        Peer::Node(n) => self
                            .members
                            .get(&n)
                            .copied()
                            .or_else(|| self.replica.gms().member_addr(n)),
                        Peer::Joiner(nonce) => {
                            let addr = self.joiners.get(&nonce).copied();
                            let inner = match &t.msg {
                                GmsMessage::Stamped { msg, .. } => msg.as_ref(),
                                msg => msg,
                            };
                            if matches!(
                                inner,
                                GmsMessage::Welcome { .. } | GmsMessage::NonceTaken { .. }
                            ) {
                                // Welcomed (its address is in the replicated state now), or
                                // coming back with another nonce.
                                self.joiners.remove(&nonce);
                            }
                            addr
                        }
                    };
                    if let Some(to) = to {
                        // Lost sends are the service's to resend.
                        self.send_client(&frame(&t.msg), to);
                    }
                }
                ReplicaTransmit::Replica { to, bytes } => {
                    let Some(&addr) = self.peers.get(to) else {
                        continue;
                    };
                    if let Some(link) = self.replica_link.as_mut() {
                        if bytes.len() + REPLICA_LINK_OVERHEAD > DATAGRAM_BYTES_MAX {
                            self.oversized += 1;
                            continue;
                        }
                        link.send(now, to, &bytes);
                        continue;
                    }
                    if bytes.len() + REPLICA_MAGIC.len() > DATAGRAM_BYTES_MAX {
                        self.oversized += 1;
                        continue;
                    }
                    let mut datagram = Vec::with_capacity(bytes.len() + REPLICA_MAGIC.len());
                    datagram.extend_from_slice(&REPLICA_MAGIC);
                    datagram.extend_from_slice(&bytes);
                    // Raft resends what is lost.
                    let _ = self.socket.send_to(&datagram, addr);
                }
            }
        }
        if let Some(link) = self.replica_link.as_mut() {
            while let Some((to, datagram)) = link.poll_transmit() {
                if let Some(&addr) = self.peers.get(to) {
                    // Raft resends what is lost; a lost hello is sent again when due.
                    let _ = self.socket.send_to(&datagram, addr);
                }
            }
        }
        while let Some(e) = self.replica.poll_event() {
            match e {
                ReplicaEvent::Gms(GmsEvent::Joined(node)) => {
                    crate::oplog::gms_joined(node);
                    if let Some(a) = self.replica.gms().member_addr(node) {
                        self.members.insert(node, a);
                        self.by_addr.insert(a, node);
                    }
                }
                ReplicaEvent::Gms(GmsEvent::Removed { node, cause }) => {
                    crate::oplog::gms_removed(node, cause);
                    self.forget(node);
                    self.removed.push((node, cause, now));
                }
                ReplicaEvent::Gms(GmsEvent::TopicCreated { name, topic }) => {
                    self.topics.insert(name, topic);
                }
                ReplicaEvent::Leading { term } => {
                    crate::oplog::gms_leading(self.replica.config().index, term);
                    self.leading_since = Some(now);
                    self.first_view_leading = None;
                    self.views_at_lead = self.replica.gms().stats().views_issued;
                    self.rebuild_addresses();
                }
                ReplicaEvent::Following { term, leader } => {
                    crate::oplog::gms_following(self.replica.config().index, term, leader);
                    self.leading_since = None;
                }
            }
        }
        if self.replica.stats().snapshots_restored != self.snapshots_restored {
            // A restored snapshot brings members and topics without their events.
            self.snapshots_restored = self.replica.stats().snapshots_restored;
            self.rebuild_addresses();
        }
        if self.leading_since.is_some()
            && self.first_view_leading.is_none()
            && self.replica.gms().stats().views_issued > self.views_at_lead
        {
            self.first_view_leading = Some(now);
        }
    }

    fn forget(&mut self, node: NodeId) {
        if let Some(a) = self.members.remove(&node) {
            if self.by_addr.get(&a) == Some(&node) {
                self.by_addr.remove(&a);
                // Its admitted session ends too (sessions are bounded by `SESSIONS_MAX`);
                // were it still running, it is admitted again.
                if let Some(link) = self.secure.as_mut() {
                    link.forget(&a);
                }
            }
        }
    }

    /// The member address table and the topic table from the replicated state.
    fn rebuild_addresses(&mut self) {
        let gms = self.replica.gms();
        self.members = gms
            .members()
            .filter_map(|n| Some((n, gms.member_addr(n)?)))
            .collect();
        self.by_addr = self.members.iter().map(|(&n, &a)| (a, n)).collect();
        self.topics = gms
            .topics()
            .map(|(name, id)| (name.to_owned(), id))
            .collect();
    }

    fn snapshot(&self) -> ReplicaSnapshot {
        ReplicaSnapshot {
            index: self.replica.config().index,
            term: self.replica.term(),
            serving: self.replica.is_serving(),
            leader: self.replica.leader(),
            members: self.members.clone(),
            member_metrics: self.replica.gms().member_metrics().collect(),
            topics: self.topics.clone(),
            removed: self.removed.clone(),
            leading_since: self.leading_since,
            first_view_leading: self.first_view_leading,
            stats: self.replica.gms().stats().clone(),
            replica: self.replica.stats().clone(),
            unknown_sources: self.unknown_sources,
            removal_notices: self.removal_notices,
            invalid_datagrams: self.invalid_datagrams,
            foreign_replica_datagrams: self.foreign_replica_datagrams,
            oversized: self.oversized,
            socket_recv_buffer_bytes: self.socket_recv_buffer_bytes,
            state_writes: self.state_writes,
            state_bytes: self.state_bytes,
            state_write_time: self.state_write_time,
            state_write_time_max: self.state_write_time_max,
            link: self
                .secure
                .as_ref()
                .map(|l| l.stats().clone())
                .unwrap_or_default(),
            replica_link: self
                .replica_link
                .as_ref()
                .map(ReplicaLink::stats)
                .unwrap_or_default(),
        }
    }
}
