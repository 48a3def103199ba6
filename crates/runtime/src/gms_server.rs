//! The membership service on a real UDP socket: [`GmsServer`] runs the sans-IO
//! [`tidings_gms::Gms`] on its own thread, embedded in a node's process or standalone
//! (`tidings gms`).
//!
//! Nodes send GMS messages from their unicast data socket, so the source address of a node's
//! datagrams is where it receives protocol traffic: a `Join` that names no address gets its
//! source address, and the service tells every node the addresses of the nodes it talks to with
//! the views (`Item::NodeAddress`). The server knows members by that address; a datagram from an
//! unknown address that is not a `Join` is counted and dropped.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tidings_gms::{
    ConfigError, Gms, GmsConfig, GmsEvent, GmsMessage, GmsStats, Inbound, MemberState, Peer,
    RemoveCause, ServiceLink, ServiceLinkStats, ServiceSecurity,
};
use tidings_proto::{NodeId, Time, TopicId};

use crate::clock;

pub use tidings_gms::GMS_MAGIC;
pub(crate) use tidings_gms::{frame, unframe};

/// Sends the framed GMS datagram `framed` to `to` on `socket`, sealed in its session when the
/// service runs an admitted link (nothing goes to an address without a session).
pub(crate) fn send_admitted(
    secure: Option<&mut ServiceLink<SocketAddr>>,
    socket: &UdpSocket,
    framed: &[u8],
    to: SocketAddr,
) {
    match secure {
        None => {
            let _ = socket.send_to(framed, to);
        }
        Some(link) => {
            if let Some(sealed) = link.seal_to(&to, framed) {
                let _ = socket.send_to(&sealed, to);
            }
        }
    }
}

/// The GMS datagram `datagram` from `from` carries: itself when the service runs without an
/// admitted link, else what the link opens. `None` when the link answered the source (a
/// handshake reply, sent on `socket`) or dropped the datagram (counted by the link).
pub(crate) fn open_admitted<'a>(
    secure: Option<&mut ServiceLink<SocketAddr>>,
    socket: &UdpSocket,
    from: SocketAddr,
    datagram: &'a [u8],
) -> Option<Cow<'a, [u8]>> {
    let Some(link) = secure else {
        return Some(Cow::Borrowed(datagram));
    };
    match link.receive(from, datagram) {
        Inbound::Gms(plain) => Some(Cow::Owned(plain)),
        Inbound::Reply(reply) => {
            let _ = socket.send_to(&reply, from);
            None
        }
        Inbound::Dropped => None,
    }
}

/// Longest sleep of the server thread, so that shutdown and snapshot requests are served.
const SERVER_TICK: Duration = Duration::from_millis(20);
/// Joins remembered (by nonce) until welcomed; more are dropped and counted, so forged joins
/// cannot grow the table.
const JOINERS_MAX: usize = 65_536;
/// Largest GMS datagram accepted.
const GMS_DATAGRAM_BYTES_MAX: usize = 65_535;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum GmsServerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The socket could not be set up.
    #[error("gms socket: {0}")]
    Io(#[from] io::Error),
    /// The replica's configuration is invalid.
    #[error(transparent)]
    Replica(#[from] tidings_gms::ReplicaError),
    /// The list of replica addresses is invalid.
    #[error("gms replicas: {0}")]
    Peers(String),
    /// A replica's data directory or state file cannot be used: unreadable, corrupt, or the
    /// state of another replica.
    #[error("replica state {}: {reason}", path.display())]
    State {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// What the server looks like now (for tests, `tidings gms` and the demo's report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GmsSnapshot {
    /// The members and the address each sends from.
    pub members: BTreeMap<NodeId, SocketAddr>,
    /// Topic names bound so far.
    pub topics: BTreeMap<String, TopicId>,
    /// Every removal so far, in order: the node and why.
    pub removed: Vec<(NodeId, RemoveCause)>,
    /// The service's counters.
    pub stats: GmsStats,
    /// The service's record of each member, with how long ago it was last heard from.
    pub member_states: BTreeMap<NodeId, (MemberState, Duration)>,
    /// GMS datagrams from addresses that are not members (and not joins), dropped.
    pub unknown_sources: u64,
    /// Datagrams without the GMS framing, dropped.
    pub invalid_datagrams: u64,
    /// The admitted link's counters (all zero when the service admits anyone).
    pub link: ServiceLinkStats,
    /// Where members serve their metrics, as they told the service (`Gms::member_metrics`).
    pub member_metrics: Vec<(NodeId, SocketAddr)>,
}

/// A running membership service.
#[derive(Debug)]
pub struct GmsServer {
    local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    snapshots: SyncSender<SyncSender<GmsSnapshot>>,
    thread: Option<JoinHandle<()>>,
}

impl GmsServer {
    /// Binds `bind` and starts the service thread. The service starts without state, under an
    /// incarnation drawn from the OS (`config.incarnation` is replaced). It admits anyone.
    pub fn start(config: GmsConfig, bind: SocketAddr) -> Result<GmsServer, GmsServerError> {
        GmsServer::start_secure(config, bind, None)
    }

    /// As [`start`](GmsServer::start); with `security`, the service admits only the identities
    /// of its allow list, each after a Noise handshake, and speaks with them only over the
    /// handshake's session (plain GMS datagrams are dropped), and hands out datagram keys
    /// (`GmsConfig::datagram_keys`, drawn from the OS RNG) to its admitted members over those
    /// sessions. Without `security` it hands out none: they would travel in clear.
    pub fn start_secure(
        mut config: GmsConfig,
        bind: SocketAddr,
        security: Option<ServiceSecurity>,
    ) -> Result<GmsServer, GmsServerError> {
        config.incarnation = crate::config::draw_incarnation();
        config.datagram_keys = security.is_some();
        let gms = Gms::new(config)?;
        let socket = UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(SERVER_TICK))?;
        let local_addr = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (snapshots, requests) = mpsc::sync_channel(4);
        let mut host = Host {
            gms,
            socket,
            requests,
            stop: Arc::clone(&stop),
            joiners: HashMap::new(),
            members: BTreeMap::new(),
            by_addr: HashMap::new(),
            topics: BTreeMap::new(),
            removed: Vec::new(),
            unknown_sources: 0,
            invalid_datagrams: 0,
            secure: security.map(|s| ServiceLink::new(s, crate::config::os_entropy())),
        };
        let thread = std::thread::Builder::new()
            .name("tidings-gms".to_owned())
            .spawn(crate::oplog::in_span(
                tracing::info_span!(target: crate::oplog::GMS_TARGET, "gms"),
                move || host.run(),
            ))?;
        Ok(GmsServer {
            local_addr,
            stop,
            snapshots,
            thread: Some(thread),
        })
    }

    /// The address nodes reach the service at.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The current members, topics, removals and counters; `None` if the thread has stopped.
    #[must_use]
    pub fn snapshot(&self) -> Option<GmsSnapshot> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.snapshots.send(reply).ok()?;
        answer.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Serves the service's metrics on `bind` (`GET /metrics`) until the returned server is
    /// dropped.
    pub fn serve_metrics(
        &self,
        bind: SocketAddr,
    ) -> Result<crate::metrics::MetricsServer, crate::metrics::MetricsError> {
        crate::metrics::serve_snapshots(bind, self.snapshots.clone(), crate::metrics::register_gms)
    }

    /// Stops the service thread.
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

impl Drop for GmsServer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The service thread's state.
struct Host {
    gms: Gms,
    socket: UdpSocket,
    requests: Receiver<SyncSender<GmsSnapshot>>,
    stop: Arc<AtomicBool>,
    /// Where each joiner's `Join` came from, by nonce, until it is welcomed.
    joiners: HashMap<u64, SocketAddr>,
    members: BTreeMap<NodeId, SocketAddr>,
    by_addr: HashMap<SocketAddr, NodeId>,
    topics: BTreeMap<String, TopicId>,
    removed: Vec<(NodeId, RemoveCause)>,
    unknown_sources: u64,
    invalid_datagrams: u64,
    /// The admitted link, when the service admits only its allow list.
    secure: Option<ServiceLink<SocketAddr>>,
}

impl Host {
    /// Sends the framed `datagram` to `to`, sealed in its session when the link is admitted
    /// (nothing is sent to an address without one).
    fn send(&mut self, framed: &[u8], to: SocketAddr) {
        send_admitted(self.secure.as_mut(), &self.socket, framed, to);
    }

    fn run(&mut self) {
        let mut buf = vec![0u8; GMS_DATAGRAM_BYTES_MAX];
        while !self.stop.load(Ordering::Acquire) {
            let now = clock::service_now();
            let wait = self
                .gms
                .poll_timeout()
                .map_or(SERVER_TICK, |t| t.saturating_duration_since(now))
                .clamp(Duration::from_millis(1), SERVER_TICK);
            // A zero timeout would mean "block forever" to the socket.
            let _ = self.socket.set_read_timeout(Some(wait));
            match self.socket.recv_from(&mut buf) {
                Ok((len, from)) => {
                    let now = clock::service_now();
                    if let Some(datagram) = buf.get(..len) {
                        self.on_datagram(now, from, datagram);
                    }
                    // Drain what else is queued without waiting.
                    let _ = self.socket.set_nonblocking(true);
                    while let Ok((len, from)) = self.socket.recv_from(&mut buf) {
                        if let Some(datagram) = buf.get(..len) {
                            self.on_datagram(now, from, datagram);
                        }
                    }
                    let _ = self.socket.set_nonblocking(false);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                // An ICMP error from a node that went away: nothing to do.
                Err(_) => {}
            }
            let now = clock::service_now();
            if self.gms.poll_timeout().is_some_and(|t| t <= now) {
                self.gms.handle_timeout(now);
            }
            self.flush();
            while let Ok(reply) = self.requests.try_recv() {
                let _ = reply.send(self.snapshot());
            }
        }
    }

    fn on_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let Some(datagram) = open_admitted(self.secure.as_mut(), &self.socket, from, datagram)
        else {
            return;
        };
        let Some(body) = unframe(&datagram) else {
            self.invalid_datagrams += 1;
            return;
        };
        let msg = match GmsMessage::decode(body) {
            Ok(m) => m,
            Err(_) => {
                // Counted by the service as malformed.
                let peer = self
                    .by_addr
                    .get(&from)
                    .map_or(Peer::Joiner(0), |&n| Peer::Node(n));
                self.gms.handle_datagram(now, peer, body);
                return;
            }
        };
        match msg {
            GmsMessage::Join { nonce, addr } => {
                if self.joiners.len() >= JOINERS_MAX && !self.joiners.contains_key(&nonce) {
                    self.unknown_sources += 1;
                    return;
                }
                self.joiners.insert(nonce, from);
                let addr = Some(addr.unwrap_or(from));
                self.gms
                    .handle_message(now, Peer::Joiner(nonce), GmsMessage::Join { nonce, addr });
            }
            msg => match self.by_addr.get(&from) {
                Some(&node) => {
                    // The identity its admitted session proved: the access rules check it.
                    let identity = self.secure.as_ref().and_then(|l| l.peer(&from)).copied();
                    self.gms
                        .handle_message_as(now, Peer::Node(node), identity.as_ref(), msg);
                }
                None => {
                    // A node this service does not know (it restarted without its state, or
                    // removed the node) is told so, as the service tells a removed node, so
                    // that it joins again. One short reply per datagram, to its source.
                    self.unknown_sources += 1;
                    let notice = GmsMessage::Update {
                        seq: 0,
                        items: vec![tidings_gms::Item::Removed],
                    };
                    self.send(&frame(&notice), from);
                }
            },
        }
        // Sent after the whole batch of datagrams read together (`run`): the service syncs
        // each node once for every request of the batch.
    }

    /// Sends what the service queued and follows its events.
    fn flush(&mut self) {
        if self.gms.wants_key_entropy() {
            if let Some(bytes) = tidings_seal::os_random::<32>() {
                self.gms.give_key_entropy(bytes);
            }
        }
        while let Some(t) = self.gms.poll_transmit() {
            let to = match t.to {
                Peer::Node(n) => self.members.get(&n).copied(),
                Peer::Joiner(nonce) => {
                    let addr = self.joiners.get(&nonce).copied();
                    match (&t.msg, addr) {
                        (GmsMessage::Welcome { node, .. }, Some(a)) => {
                            self.members.insert(*node, a);
                            self.by_addr.insert(a, *node);
                            self.joiners.remove(&nonce);
                        }
                        // The joiner comes back with another nonce.
                        (GmsMessage::NonceTaken { .. }, Some(_)) => {
                            self.joiners.remove(&nonce);
                        }
                        _ => {}
                    }
                    addr
                }
            };
            if let Some(to) = to {
                // Lost sends are the service's to resend (updates and welcomes are retried).
                self.send(&frame(&t.msg), to);
            }
        }
        while let Some(e) = self.gms.poll_event() {
            match e {
                GmsEvent::Removed { node, cause } => {
                    if let Some(a) = self.members.remove(&node) {
                        if self.by_addr.get(&a) == Some(&node) {
                            self.by_addr.remove(&a);
                            // Its admitted session ends too (sessions are bounded by
                            // `SESSIONS_MAX`); were it still running, it is admitted again.
                            if let Some(link) = self.secure.as_mut() {
                                link.forget(&a);
                            }
                        }
                    }
                    crate::oplog::gms_removed(node, cause);
                    self.removed.push((node, cause));
                }
                GmsEvent::TopicCreated { name, topic } => {
                    self.topics.insert(name, topic);
                }
                GmsEvent::Joined(node) => crate::oplog::gms_joined(node),
            }
        }
    }

    fn snapshot(&self) -> GmsSnapshot {
        GmsSnapshot {
            members: self.members.clone(),
            topics: self.topics.clone(),
            removed: self.removed.clone(),
            stats: self.gms.stats().clone(),
            member_states: {
                let now = clock::service_now();
                self.gms
                    .members()
                    .filter_map(|n| {
                        let m = self.gms.member_state(n)?;
                        Some((n, (m, now.saturating_duration_since(m.last_heard))))
                    })
                    .collect()
            },
            unknown_sources: self.unknown_sources,
            invalid_datagrams: self.invalid_datagrams,
            member_metrics: self.gms.member_metrics().collect(),
            link: self
                .secure
                .as_ref()
                .map(|l| l.stats().clone())
                .unwrap_or_default(),
        }
    }
}
