//! The admitted GMS link, sans-IO: a node's [`NodeLink`] runs the Noise handshake of
//! `tidings_seal::link` with each replica of the membership service before its first GMS
//! datagram and carries every GMS datagram after it in the [`Session`]; the service's
//! [`ServiceLink`] admits only the identities of its allow list and keeps one session per source
//! address. Entropy is an input ([`Entropy`]): a host draws it with `tidings_seal::os_random`,
//! the simulator from its seed.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tidings_proto::Time;
use tidings_seal::link::{
    is_link_datagram, DATAGRAM_BYTES_MAX, DATA_OVERHEAD, ENTROPY_LEN, HELLO_LEN, UNREADABLE_LEN,
    UNREADABLE_NOTICE, WELCOME_LEN,
};
use tidings_seal::{AllowList, Identity, Initiator, LinkError, PublicKey, Responder, Session};

use crate::member::GMS_MAGIC;

/// A source of fresh random bytes for handshakes (`None` when it fails: the handshake waits).
pub type Entropy = Box<dyn FnMut() -> Option<[u8; ENTROPY_LEN]> + Send>;

/// Datagrams a node holds per replica while its handshake runs; older ones are dropped (the
/// client resends what matters).
const PENDING_MAX: usize = 64;
/// Sessions a service keeps at once, at most (one per node address).
pub const SESSIONS_MAX: usize = 65_536;

/// What a node needs to be admitted: its identity and the service's public key.
#[derive(Clone, Debug)]
pub struct LinkSecurity {
    /// This node's key pair (`tidings keygen`); the service admits its public key.
    pub identity: Identity,
    /// The service's public key: a node talks only to a service that proves it holds it.
    pub service: PublicKey,
    /// Least time between two hellos to one replica. Default 250 ms.
    pub hello_interval: Duration,
    /// Added to the time (in microseconds) to make each hello's stamp, which must grow from
    /// one hello of an identity to the next, across restarts: a host gives its wall clock's
    /// microseconds at start, the simulator 0.
    pub stamp_base: u64,
}

impl LinkSecurity {
    /// `identity` speaking to the service whose key is `service`, with the defaults.
    #[must_use]
    pub fn new(identity: Identity, service: PublicKey) -> LinkSecurity {
        LinkSecurity {
            identity,
            service,
            hello_interval: Duration::from_millis(250),
            stamp_base: 0,
        }
    }
}

/// Counters of a [`NodeLink`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLinkStats {
    /// Hellos sent.
    pub hellos: u64,
    /// Sessions established (welcomes accepted).
    pub sessions: u64,
    /// Datagrams sealed for the service.
    pub sealed: u64,
    /// Datagrams from the service opened.
    pub opened: u64,
    /// Datagrams from the service refused (not a link datagram, bad tag, replay, stray
    /// welcome), dropped.
    pub refused: u64,
    /// Unreadable notices received: the service cannot read this node's hello (wrong service
    /// key) or lost its session.
    pub unreadable: u64,
    /// Datagrams dropped while waiting for a handshake (more than the pending bound).
    pub pending_dropped: u64,
}

enum ReplicaState {
    Idle,
    Handshaking { initiator: Box<Initiator> },
    Up(Box<Session>),
}

struct Replica {
    state: ReplicaState,
    pending: VecDeque<Vec<u8>>,
    /// When the last hello went to this replica: at most one per `hello_interval`, whatever
    /// the service (or an attacker's notices) says.
    last_hello: Option<Time>,
}

/// A node's side of the admitted GMS link, for every replica of the service.
pub struct NodeLink {
    security: LinkSecurity,
    entropy: Entropy,
    replicas: Vec<Replica>,
    out: VecDeque<(usize, Vec<u8>)>,
    refusal: Option<LinkError>,
    stats: NodeLinkStats,
}

impl fmt::Debug for NodeLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeLink")
            .field("identity", self.security.identity.public())
            .field("service", &self.security.service)
            .field("refusal", &self.refusal)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl NodeLink {
    /// The link of a node with `security` to a service of `replicas` replicas.
    #[must_use]
    pub fn new(security: LinkSecurity, replicas: usize, entropy: Entropy) -> NodeLink {
        NodeLink {
            security,
            entropy,
            replicas: (0..replicas.max(1))
                .map(|_| Replica {
                    state: ReplicaState::Idle,
                    pending: VecDeque::new(),
                    last_hello: None,
                })
                .collect(),
            out: VecDeque::new(),
            refusal: None,
            stats: NodeLinkStats::default(),
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &NodeLinkStats {
        &self.stats
    }

    /// Why the service did not admit this node, if it said so: [`LinkError::NotAdmitted`]
    /// (authenticated, final) or [`LinkError::WrongServiceKey`] (a hint: the service could not
    /// read the hello, or its answer did not match the configured key).
    #[must_use]
    pub fn refusal(&self) -> Option<&LinkError> {
        self.refusal.as_ref()
    }

    /// Whether the session with `replica` is established.
    #[must_use]
    pub fn is_up(&self, replica: usize) -> bool {
        matches!(
            self.replicas.get(replica).map(|r| &r.state),
            Some(ReplicaState::Up(_))
        )
    }

    /// Sends the framed GMS datagram `framed` to `replica`: sealed at once if the session is up,
    /// otherwise held until it is (a hello is sent when due).
    pub fn send(&mut self, now: Time, replica: usize, framed: Vec<u8>) {
        let Some(r) = self.replicas.get_mut(replica) else {
            return;
        };
        if let ReplicaState::Up(session) = &mut r.state {
            if let Some(sealed) = seal(session, &framed) {
                self.stats.sealed += 1;
                self.out.push_back((replica, sealed));
                return;
            }
            // Nonces exhausted or too large: a new handshake.
            r.state = ReplicaState::Idle;
        }
        if r.pending.len() >= PENDING_MAX {
            r.pending.pop_front();
            self.stats.pending_dropped += 1;
        }
        r.pending.push_back(framed);
        self.hello_if_due(now, replica);
    }

    /// Time has passed: a handshake that went unanswered is started again.
    pub fn handle_timeout(&mut self, now: Time) {
        for replica in 0..self.replicas.len() {
            let waiting = !self.replicas[replica].pending.is_empty();
            if waiting {
                self.hello_if_due(now, replica);
            }
        }
    }

    /// When [`handle_timeout`](NodeLink::handle_timeout) is due: the next hello to a replica
    /// that has datagrams waiting for its session.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.replicas
            .iter()
            .filter(|r| !r.pending.is_empty() && !matches!(r.state, ReplicaState::Up(_)))
            .map(|r| {
                r.last_hello
                    .map_or(Time::ZERO, |t| t + self.security.hello_interval)
            })
            .min()
    }

    fn hello_if_due(&mut self, now: Time, replica: usize) {
        let interval = self.security.hello_interval;
        let Some(r) = self.replicas.get_mut(replica) else {
            return;
        };
        if matches!(r.state, ReplicaState::Up(_))
            || r.last_hello.is_some_and(|t| now < t + interval)
        {
            return;
        }
        let Some(entropy) = (self.entropy)() else {
            return;
        };
        let mut hello = vec![0u8; HELLO_LEN];
        let stamp = self.security.stamp_base.saturating_add(now.as_micros());
        match Initiator::start(
            &self.security.identity,
            &self.security.service,
            stamp,
            entropy,
            &mut hello,
        ) {
            Ok((initiator, len)) => {
                hello.truncate(len);
                r.state = ReplicaState::Handshaking {
                    initiator: Box::new(initiator),
                };
                r.last_hello = Some(now);
                self.stats.hellos += 1;
                self.out.push_back((replica, hello));
            }
            Err(e) => self.refusal = Some(e),
        }
    }

    /// A datagram from `replica`: returns the framed GMS datagram it carries, or `None` when it
    /// was part of the handshake or refused (counted).
    pub fn receive(&mut self, now: Time, replica: usize, datagram: &[u8]) -> Option<Vec<u8>> {
        let r = self.replicas.get_mut(replica)?;
        if !is_link_datagram(datagram) {
            self.stats.refused += 1;
            return None;
        }
        if datagram.len() == UNREADABLE_LEN && datagram == UNREADABLE_NOTICE {
            self.stats.unreadable += 1;
            match &r.state {
                // The service lost the session: a new handshake when next due.
                ReplicaState::Up(_) => {
                    r.state = ReplicaState::Idle;
                    self.hello_if_due(now, replica);
                }
                ReplicaState::Handshaking { .. } => {
                    self.refusal = Some(LinkError::WrongServiceKey);
                }
                ReplicaState::Idle => {}
            }
            return None;
        }
        match &mut r.state {
            ReplicaState::Handshaking { initiator, .. } if datagram.len() == WELCOME_LEN => {
                match initiator.finish(datagram) {
                    Ok(mut session) => {
                        self.stats.sessions += 1;
                        self.refusal = None;
                        for framed in r.pending.drain(..) {
                            if let Some(sealed) = seal(&mut session, &framed) {
                                self.stats.sealed += 1;
                                self.out.push_back((replica, sealed));
                            }
                        }
                        r.state = ReplicaState::Up(Box::new(session));
                    }
                    Err(e @ LinkError::NotAdmitted(_)) => {
                        self.refusal = Some(e);
                        r.state = ReplicaState::Idle;
                        r.pending.clear();
                    }
                    Err(e) => {
                        if e == LinkError::WrongServiceKey {
                            self.refusal = Some(e);
                        }
                        self.stats.refused += 1;
                    }
                }
                None
            }
            ReplicaState::Up(session) if datagram.len() > DATA_OVERHEAD => {
                let mut plain = vec![0u8; datagram.len() - DATA_OVERHEAD];
                match session.open(datagram, &mut plain) {
                    Ok(n) => {
                        plain.truncate(n);
                        self.stats.opened += 1;
                        Some(plain)
                    }
                    Err(_) => {
                        self.stats.refused += 1;
                        None
                    }
                }
            }
            _ => {
                self.stats.refused += 1;
                None
            }
        }
    }

    /// The next datagram for the service (a hello or a sealed GMS datagram), with its replica.
    pub fn poll_transmit(&mut self) -> Option<(usize, Vec<u8>)> {
        self.out.pop_front()
    }
}

fn seal(session: &mut Session, payload: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; payload.len() + DATA_OVERHEAD];
    let n = session.seal(payload, &mut out).ok()?;
    out.truncate(n);
    Some(out)
}

/// What the service admits: its identity and the allowed identities.
#[derive(Clone, Debug)]
pub struct ServiceSecurity {
    /// The service's key pair; nodes are configured with its public key.
    pub identity: Identity,
    /// The node identities admitted.
    pub allowed: AllowList,
}

/// Counters of a [`ServiceLink`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceLinkStats {
    /// Hellos admitted.
    pub admitted: u64,
    /// Hellos of identities not on the allow list (answered with a refusal).
    pub not_admitted: u64,
    /// Hellos unreadable (wrong service key, forged) or replayed, and malformed link
    /// datagrams.
    pub bad_hellos: u64,
    /// Plain GMS datagrams (not over a session), dropped.
    pub plain_dropped: u64,
    /// Data datagrams from addresses without a session (answered with the unreadable notice).
    pub no_session: u64,
    /// Data datagrams refused by their session (bad tag, replay, malformed).
    pub refused: u64,
    /// Datagrams opened.
    pub opened: u64,
    /// Datagrams sealed.
    pub sealed: u64,
    /// Hellos dropped because [`SESSIONS_MAX`] sessions are up.
    pub sessions_full: u64,
    /// Sessions up now (a gauge): one per admitted address, ended when its node is removed.
    pub sessions_up: u64,
}

/// What a [`ServiceLink`] made of a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// A framed GMS datagram from an admitted node, for the service.
    Gms(Vec<u8>),
    /// A handshake answer (or an unreadable notice) to send back to the source.
    Reply(Vec<u8>),
    /// Nothing to do (refused and counted).
    Dropped,
}

/// The service's side of the admitted GMS link: one session per node address.
pub struct ServiceLink<A> {
    responder: Responder,
    sessions: HashMap<A, Session>,
    entropy: Entropy,
    stats: ServiceLinkStats,
}

impl<A> fmt::Debug for ServiceLink<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceLink")
            .field("responder", &self.responder)
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<A: Copy + Eq + Hash> ServiceLink<A> {
    /// The link of a service with `security`.
    #[must_use]
    pub fn new(security: ServiceSecurity, entropy: Entropy) -> ServiceLink<A> {
        ServiceLink {
            responder: Responder::new(security.identity, security.allowed),
            sessions: HashMap::new(),
            entropy,
            stats: ServiceLinkStats::default(),
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &ServiceLinkStats {
        &self.stats
    }

    /// The admitted identity behind `from`, if it has a session.
    #[must_use]
    pub fn peer(&self, from: &A) -> Option<&PublicKey> {
        self.sessions.get(from).map(Session::peer)
    }

    /// Ends the session of `addr` (a removed node): its next datagrams are answered with the
    /// unreadable notice, so it must be admitted again.
    pub fn forget(&mut self, addr: &A) {
        self.sessions.remove(addr);
        self.stats.sessions_up = self.sessions.len() as u64;
    }

    /// A datagram from `from`.
    pub fn receive(&mut self, from: A, datagram: &[u8]) -> Inbound {
        if datagram.len() > DATAGRAM_BYTES_MAX {
            self.stats.bad_hellos += 1;
            return Inbound::Dropped;
        }
        if !is_link_datagram(datagram) {
            if datagram.starts_with(&GMS_MAGIC) {
                self.stats.plain_dropped += 1;
            } else {
                self.stats.bad_hellos += 1;
            }
            return Inbound::Dropped;
        }
        if datagram.len() == HELLO_LEN {
            if self.sessions.len() >= SESSIONS_MAX && !self.sessions.contains_key(&from) {
                self.stats.sessions_full += 1;
                return Inbound::Dropped;
            }
            let Some(entropy) = (self.entropy)() else {
                return Inbound::Dropped;
            };
            let mut reply = vec![0u8; WELCOME_LEN];
            let answer = self.responder.handle_hello(datagram, entropy, &mut reply);
            reply.truncate(answer.reply_len);
            match answer.outcome {
                Ok(session) => {
                    self.stats.admitted += 1;
                    self.sessions.insert(from, session);
                    self.stats.sessions_up = self.sessions.len() as u64;
                }
                Err(LinkError::NotAdmitted(_)) => self.stats.not_admitted += 1,
                Err(_) => self.stats.bad_hellos += 1,
            }
            return if reply.is_empty() {
                Inbound::Dropped
            } else {
                Inbound::Reply(reply)
            };
        }
        if datagram.len() <= DATA_OVERHEAD {
            // Not sealed data (a notice, say): never answered, so a notice sent in the
            // service's own name cannot make it answer itself for ever.
            self.stats.bad_hellos += 1;
            return Inbound::Dropped;
        }
        let Some(session) = self.sessions.get_mut(&from) else {
            self.stats.no_session += 1;
            return Inbound::Reply(UNREADABLE_NOTICE.to_vec());
        };
        let mut plain = vec![0u8; datagram.len() - DATA_OVERHEAD];
        match session.open(datagram, &mut plain) {
            Ok(n) => {
                plain.truncate(n);
                self.stats.opened += 1;
                Inbound::Gms(plain)
            }
            Err(_) => {
                self.stats.refused += 1;
                Inbound::Dropped
            }
        }
    }

    /// `framed` sealed for `to`, or `None` when `to` has no session (nothing is sent).
    pub fn seal_to(&mut self, to: &A, framed: &[u8]) -> Option<Vec<u8>> {
        let session = self.sessions.get_mut(to)?;
        let sealed = seal(session, framed)?;
        self.stats.sealed += 1;
        Some(sealed)
    }
}

/// The first bytes of a sealed replica-to-replica datagram: distinct from the plain replica
/// framing (`TGR\x01`), the GMS framing and the node link's, so one socket carries all of them.
pub const REPLICA_LINK_MAGIC: [u8; 4] = *b"TGR\x02";
/// Bytes a sealed replica datagram has more than the Raft message it carries: the magic, the
/// direction byte and the link's data overhead.
pub const REPLICA_LINK_OVERHEAD: usize = REPLICA_LINK_MAGIC.len() + 1 + DATA_OVERHEAD;
/// Direction byte: from a replica's initiating side to its peer's responding side (hellos and
/// sealed Raft messages).
const TO_RESPONDER: u8 = 1;
/// Direction byte: from a replica's responding side to its peer's initiating side (welcomes
/// and unreadable notices).
const TO_INITIATOR: u8 = 2;

/// What a replica needs to speak with the other replicas of its service: its own identity and
/// every replica's public key, by index (its own included).
#[derive(Clone, Debug)]
pub struct ReplicaSecurity {
    /// This replica's key pair (`tidings keygen`), distinct from the service's.
    pub identity: Identity,
    /// Every replica's public key, by replica index; entry `index` is this replica's own.
    pub keys: Vec<PublicKey>,
    /// Least time between two hellos to one peer. Default 250 ms.
    pub hello_interval: Duration,
    /// Added to the time (in microseconds) to make each hello's stamp, which must grow across
    /// restarts: a host gives its wall clock's microseconds at start.
    pub stamp_base: u64,
}

impl ReplicaSecurity {
    /// `identity` among the replicas whose keys are `keys` (by index), with the defaults.
    #[must_use]
    pub fn new(identity: Identity, keys: Vec<PublicKey>) -> ReplicaSecurity {
        ReplicaSecurity {
            identity,
            keys,
            hello_interval: Duration::from_millis(250),
            stamp_base: 0,
        }
    }

    /// Fresh identities for `replicas` replicas run in one process (`tidings gms --replicas N`,
    /// the demo, tests), each knowing all their keys, by index.
    pub fn generate(replicas: usize) -> Result<Vec<ReplicaSecurity>, tidings_seal::IdentityError> {
        let ids = (0..replicas)
            .map(|_| Identity::generate())
            .collect::<Result<Vec<_>, _>>()?;
        let keys: Vec<PublicKey> = ids.iter().map(|i| *i.public()).collect();
        Ok(ids
            .into_iter()
            .map(|i| ReplicaSecurity::new(i, keys.clone()))
            .collect())
    }
}

/// Why a [`ReplicaLink`] cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaLinkError {
    /// The key list does not have one key per replica.
    #[error("replica keys: {keys} keys for {replicas} replicas (one a replica, by index)")]
    KeyCount {
        /// Keys given.
        keys: usize,
        /// Replicas of the service.
        replicas: usize,
    },
    /// The key listed for this replica's index is not its identity's public key.
    #[error("replica keys: entry {index} is not this replica's identity ({own})")]
    NotOwnKey {
        /// This replica's index.
        index: usize,
        /// Its identity's public key.
        own: PublicKey,
    },
    /// Two replicas are listed with the same key.
    #[error("replica keys: {0} is listed twice")]
    Duplicate(PublicKey),
}

/// Counters of a [`ReplicaLink`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaLinkStats {
    /// The initiating sides' counters, summed over the peers (hellos, sessions, sealed Raft
    /// messages, refusals and notices received).
    pub outbound: NodeLinkStats,
    /// The responding side's counters (hellos admitted or refused, Raft messages opened or
    /// refused, data without a session).
    pub inbound: ServiceLinkStats,
    /// Plain (unsealed) Raft datagrams from peers, dropped.
    pub plain_dropped: u64,
    /// Sessions whose proven key is not the key of the replica at that address (another
    /// replica's key from this address), ended; their datagrams are dropped.
    pub wrong_peer: u64,
    /// Sealed replica datagrams too short or of an unknown direction, dropped.
    pub malformed: u64,
    /// Raft messages handed to the replica after opening.
    pub delivered: u64,
}

/// A replica's sealed links with the other replicas of its service, sans-IO.
///
/// Two sessions per pair of replicas: each replica runs a [`NodeLink`] (the Noise initiator)
/// to each peer for what it sends, keyed with the peer's listed public key, and one
/// [`ServiceLink`] (the responder) for what it receives, admitting only the other replicas'
/// listed keys, each only from that replica's address. Raft messages travel only inside the
/// sessions; a restarted replica handshakes again in both directions (its hellos carry newer
/// stamps, and its peers' sealed datagrams are answered with the unreadable notice until they
/// handshake again). Feed it the datagrams of the configured peers
/// ([`receive`](ReplicaLink::receive)), hand it the replica's messages
/// ([`send`](ReplicaLink::send)), and drain [`poll_transmit`](ReplicaLink::poll_transmit)
/// after each; call [`handle_timeout`](ReplicaLink::handle_timeout) at
/// [`poll_timeout`](ReplicaLink::poll_timeout).
pub struct ReplicaLink {
    index: usize,
    keys: Vec<PublicKey>,
    outbound: Vec<Option<NodeLink>>,
    inbound: ServiceLink<usize>,
    out: VecDeque<(usize, Vec<u8>)>,
    stats: ReplicaLinkStats,
}

impl fmt::Debug for ReplicaLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaLink")
            .field("index", &self.index)
            .field("keys", &self.keys)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ReplicaLink {
    /// The links of replica `index` of `security.keys.len()` replicas. `entropy` serves every
    /// handshake of both sides.
    pub fn new(
        security: ReplicaSecurity,
        index: usize,
        entropy: Entropy,
    ) -> Result<ReplicaLink, ReplicaLinkError> {
        let replicas = security.keys.len();
        if index >= replicas || replicas > crate::REPLICAS_MAX {
            return Err(ReplicaLinkError::KeyCount {
                keys: replicas,
                replicas: replicas.max(index + 1),
            });
        }
        let own = *security.identity.public();
        if security.keys[index] != own {
            return Err(ReplicaLinkError::NotOwnKey { index, own });
        }
        let mut allowed = AllowList::new();
        for (i, key) in security.keys.iter().enumerate() {
            if security.keys[..i].contains(key) {
                return Err(ReplicaLinkError::Duplicate(*key));
            }
            if i != index {
                allowed.insert(*key, &format!("replica-{i}"));
            }
        }
        let shared = std::sync::Arc::new(std::sync::Mutex::new(entropy));
        let draw = |shared: &std::sync::Arc<std::sync::Mutex<Entropy>>| -> Entropy {
            let shared = std::sync::Arc::clone(shared);
            Box::new(move || shared.lock().ok().and_then(|mut e| e()))
        };
        let outbound = security
            .keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                (i != index).then(|| {
                    let mut link = LinkSecurity::new(security.identity.clone(), *key);
                    link.hello_interval = security.hello_interval;
                    link.stamp_base = security.stamp_base;
                    NodeLink::new(link, 1, draw(&shared))
                })
            })
            .collect();
        let inbound = ServiceLink::new(
            ServiceSecurity {
                identity: security.identity,
                allowed,
            },
            draw(&shared),
        );
        Ok(ReplicaLink {
            index,
            keys: security.keys,
            outbound,
            inbound,
            out: VecDeque::new(),
            stats: ReplicaLinkStats::default(),
        })
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> ReplicaLinkStats {
        let mut stats = self.stats.clone();
        stats.inbound = self.inbound.stats().clone();
        for link in self.outbound.iter().flatten() {
            let s = link.stats();
            let o = &mut stats.outbound;
            o.hellos += s.hellos;
            o.sessions += s.sessions;
            o.sealed += s.sealed;
            o.opened += s.opened;
            o.refused += s.refused;
            o.unreadable += s.unreadable;
            o.pending_dropped += s.pending_dropped;
        }
        stats
    }

    /// Whether this replica's session for sending to `peer` is up.
    #[must_use]
    pub fn is_up(&self, peer: usize) -> bool {
        self.outbound
            .get(peer)
            .and_then(Option::as_ref)
            .is_some_and(|l| l.is_up(0))
    }

    /// Why `peer` refused this replica's hello, if it did: [`LinkError::NotAdmitted`] (this
    /// identity is not on its list) or [`LinkError::WrongServiceKey`] (the key listed here for
    /// it is not its identity).
    #[must_use]
    pub fn refusal(&self, peer: usize) -> Option<&LinkError> {
        self.outbound.get(peer)?.as_ref()?.refusal()
    }

    /// Sends the Raft message `message` to replica `to`: sealed at once if the session is up,
    /// otherwise held until it is (a hello goes out when due).
    pub fn send(&mut self, now: Time, to: usize, message: &[u8]) {
        if let Some(Some(link)) = self.outbound.get_mut(to) {
            link.send(now, 0, message.to_vec());
        }
    }

    /// A plain Raft datagram (unsealed framing) from a peer: counted and dropped.
    pub fn drop_plain(&mut self) {
        self.stats.plain_dropped += 1;
    }

    /// A datagram that starts with [`REPLICA_LINK_MAGIC`] from replica `from` (the host knows
    /// it by its configured address): returns the Raft message it carries, or `None` when it
    /// was part of a handshake or refused (counted).
    pub fn receive(&mut self, now: Time, from: usize, datagram: &[u8]) -> Option<Vec<u8>> {
        let Some((&direction, body)) = datagram
            .strip_prefix(&REPLICA_LINK_MAGIC)
            .and_then(<[u8]>::split_first)
        else {
            self.stats.malformed += 1;
            return None;
        };
        if from == self.index || from >= self.keys.len() {
            self.stats.malformed += 1;
            return None;
        }
        match direction {
            TO_RESPONDER => match self.inbound.receive(from, body) {
                Inbound::Gms(message) => {
                    if self.inbound.peer(&from) == Some(&self.keys[from]) {
                        self.stats.delivered += 1;
                        Some(message)
                    } else {
                        self.stats.wrong_peer += 1;
                        self.inbound.forget(&from);
                        None
                    }
                }
                Inbound::Reply(reply) => {
                    // A session admitted for another replica's key from this address ends at
                    // once: each replica speaks only from its own address.
                    if self
                        .inbound
                        .peer(&from)
                        .is_some_and(|k| k != &self.keys[from])
                    {
                        self.stats.wrong_peer += 1;
                        self.inbound.forget(&from);
                    }
                    self.out.push_back((from, framed(TO_INITIATOR, &reply)));
                    None
                }
                Inbound::Dropped => None,
            },
            TO_INITIATOR => {
                let link = self.outbound.get_mut(from)?.as_mut()?;
                if link.receive(now, 0, body).is_some() {
                    // Responders never send data: a stray datagram of a confused peer.
                    self.stats.malformed += 1;
                }
                self.drain_outbound();
                None
            }
            _ => {
                self.stats.malformed += 1;
                None
            }
        }
    }

    /// Time has passed: unanswered hellos are sent again.
    pub fn handle_timeout(&mut self, now: Time) {
        for link in self.outbound.iter_mut().flatten() {
            link.handle_timeout(now);
        }
    }

    /// When [`handle_timeout`](ReplicaLink::handle_timeout) is due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.outbound
            .iter()
            .flatten()
            .filter_map(NodeLink::poll_timeout)
            .min()
    }

    fn drain_outbound(&mut self) {
        for (peer, link) in self.outbound.iter_mut().enumerate() {
            let Some(link) = link else { continue };
            while let Some((_, datagram)) = link.poll_transmit() {
                self.out.push_back((peer, framed(TO_RESPONDER, &datagram)));
            }
        }
    }

    /// The next datagram for a peer (a hello, a welcome, a notice or a sealed Raft message),
    /// with the peer's index.
    pub fn poll_transmit(&mut self) -> Option<(usize, Vec<u8>)> {
        if self.out.is_empty() {
            self.drain_outbound();
        }
        self.out.pop_front()
    }
}

fn framed(direction: u8, datagram: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLICA_LINK_MAGIC.len() + 1 + datagram.len());
    out.extend_from_slice(&REPLICA_LINK_MAGIC);
    out.push(direction);
    out.extend_from_slice(datagram);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter_entropy() -> Entropy {
        let mut n = 0u8;
        Box::new(move || {
            n = n.wrapping_add(1);
            Some([n; ENTROPY_LEN])
        })
    }

    fn setup(admit: bool) -> (NodeLink, ServiceLink<u32>) {
        let service = Identity::from_private([7; 32]).unwrap();
        let node = Identity::from_private([9; 32]).unwrap();
        let mut allowed = AllowList::new();
        if admit {
            allowed.insert(*node.public(), "n");
        }
        let link = NodeLink::new(
            LinkSecurity::new(node, *service.public()),
            1,
            counter_entropy(),
        );
        let svc = ServiceLink::new(
            ServiceSecurity {
                identity: service,
                allowed,
            },
            counter_entropy(),
        );
        (link, svc)
    }

    /// Carries every datagram both ways; returns what the service got.
    fn exchange(link: &mut NodeLink, svc: &mut ServiceLink<u32>, now: Time) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for _ in 0..4 {
            while let Some((_, d)) = link.poll_transmit() {
                match svc.receive(1, &d) {
                    Inbound::Gms(g) => got.push(g),
                    Inbound::Reply(r) => {
                        assert!(link.receive(now, 0, &r).is_none());
                    }
                    Inbound::Dropped => {}
                }
            }
        }
        got
    }

    #[test]
    fn an_admitted_node_sends_after_its_handshake_and_both_ways_are_sealed() {
        let (mut link, mut svc) = setup(true);
        let framed = [&GMS_MAGIC[..], b"join"].concat();
        link.send(Time::ZERO, 0, framed.clone());
        assert_eq!(
            exchange(&mut link, &mut svc, Time::ZERO),
            vec![framed.clone()]
        );
        assert!(link.is_up(0));
        let back = svc.seal_to(&1, b"TGM\x04welcome").unwrap();
        assert_eq!(
            link.receive(Time::ZERO, 0, &back).unwrap(),
            b"TGM\x04welcome"
        );
        // A replay is refused.
        assert!(link.receive(Time::ZERO, 0, &back).is_none());
        // Plain GMS datagrams never reach the service.
        assert_eq!(svc.receive(1, &framed), Inbound::Dropped);
        assert_eq!(svc.stats().plain_dropped, 1);
    }

    #[test]
    fn an_identity_off_the_list_is_refused_with_a_clear_error() {
        let (mut link, mut svc) = setup(false);
        link.send(Time::ZERO, 0, GMS_MAGIC.to_vec());
        assert!(exchange(&mut link, &mut svc, Time::ZERO).is_empty());
        assert!(matches!(link.refusal(), Some(LinkError::NotAdmitted(_))));
        assert_eq!(svc.stats().not_admitted, 1);
        assert!(svc.seal_to(&1, b"x").is_none());
    }

    #[test]
    fn a_wrong_service_key_is_reported() {
        let (_, mut svc) = setup(true);
        let node = Identity::from_private([9; 32]).unwrap();
        let wrong = Identity::from_private([8; 32]).unwrap();
        let mut link = NodeLink::new(
            LinkSecurity::new(node, *wrong.public()),
            1,
            counter_entropy(),
        );
        link.send(Time::ZERO, 0, GMS_MAGIC.to_vec());
        assert!(exchange(&mut link, &mut svc, Time::ZERO).is_empty());
        assert_eq!(link.refusal(), Some(&LinkError::WrongServiceKey));
    }

    #[test]
    fn a_node_handshakes_again_when_the_service_lost_its_session() {
        let (mut link, mut svc) = setup(true);
        link.send(Time::ZERO, 0, GMS_MAGIC.to_vec());
        assert_eq!(exchange(&mut link, &mut svc, Time::ZERO).len(), 1);
        svc.forget(&1);
        let later = Time::ZERO + Duration::from_secs(1);
        link.send(later, 0, b"TGM\x04a".to_vec());
        // The sealed datagram is answered with the notice; the next send handshakes again.
        exchange(&mut link, &mut svc, later);
        assert!(!link.is_up(0) || link.stats().sessions == 2);
        link.send(later, 0, b"TGM\x04b".to_vec());
        let got = exchange(&mut link, &mut svc, later);
        assert_eq!(got.last().map(Vec::as_slice), Some(&b"TGM\x04b"[..]));
    }

    #[test]
    fn a_notice_is_never_answered_so_a_spoofed_one_cannot_loop() {
        let (_, mut svc) = setup(true);
        // The service's own notice, arriving under its own (spoofed) address.
        assert_eq!(svc.receive(0, &UNREADABLE_NOTICE), Inbound::Dropped);
        assert_eq!(svc.stats().no_session, 0);
        assert_eq!(svc.stats().bad_hellos, 1);
        // Sealed-looking data from an address without a session is still answered.
        let mut d = vec![0u8; DATA_OVERHEAD + 8];
        d[..5].copy_from_slice(&UNREADABLE_NOTICE);
        assert_eq!(
            svc.receive(0, &d),
            Inbound::Reply(UNREADABLE_NOTICE.to_vec())
        );
    }

    #[test]
    fn hostile_bytes_are_counted_and_dropped() {
        let (mut link, mut svc) = setup(true);
        for len in [0, 1, 4, 5, 29, HELLO_LEN, WELCOME_LEN, 200] {
            let mut d = vec![0xA5u8; len];
            if len >= 4 {
                d[..4].copy_from_slice(&tidings_seal::link::LINK_MAGIC);
            }
            let _ = svc.receive(3, &d);
            assert!(link.receive(Time::ZERO, 0, &d).is_none());
            assert!(link.receive(Time::ZERO, 5, &d).is_none());
        }
        assert!(svc.peer(&3).is_none());
    }

    fn replica_links(ids: &[Identity], keys: &[PublicKey]) -> Vec<ReplicaLink> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| {
                ReplicaLink::new(
                    ReplicaSecurity::new(id.clone(), keys.to_vec()),
                    i,
                    counter_entropy(),
                )
                .unwrap()
            })
            .collect()
    }

    /// Carries every datagram between the links; returns the Raft messages each got, by
    /// (receiver, sender).
    fn carry(links: &mut [ReplicaLink], now: Time) -> Vec<(usize, usize, Vec<u8>)> {
        let mut got = Vec::new();
        for _ in 0..6 {
            for from in 0..links.len() {
                while let Some((to, d)) = links[from].poll_transmit() {
                    assert!(d.starts_with(&REPLICA_LINK_MAGIC));
                    if let Some(m) = links[to].receive(now, from, &d) {
                        got.push((to, from, m));
                    }
                }
            }
        }
        got
    }

    #[test]
    fn replicas_seal_raft_messages_to_each_other_and_refuse_a_stranger() {
        let ids: Vec<Identity> = (1..=3u8)
            .map(|i| Identity::from_private([i; 32]).unwrap())
            .collect();
        let keys: Vec<PublicKey> = ids.iter().map(|i| *i.public()).collect();
        let mut links = replica_links(&ids, &keys);
        links[0].send(Time::ZERO, 1, b"append");
        links[1].send(Time::ZERO, 2, b"vote");
        let got = carry(&mut links, Time::ZERO);
        assert_eq!(
            got,
            vec![(1, 0, b"append".to_vec()), (2, 1, b"vote".to_vec())]
        );
        assert!(links[0].is_up(1) && !links[0].is_up(2));
        // A stranger in replica 2's place: its hellos are refused, its messages never delivered.
        let stranger = Identity::from_private([9; 32]).unwrap();
        let mut rogue_keys = keys.clone();
        rogue_keys[2] = *stranger.public();
        let mut rogue = ReplicaLink::new(
            ReplicaSecurity::new(stranger, rogue_keys),
            2,
            counter_entropy(),
        )
        .unwrap();
        rogue.send(Time::ZERO, 0, b"vote for me");
        while let Some((to, d)) = rogue.poll_transmit() {
            assert_eq!(to, 0);
            if let Some((back_to, reply)) = {
                assert!(links[0].receive(Time::ZERO, 2, &d).is_none());
                links[0].poll_transmit()
            } {
                assert_eq!(back_to, 2);
                assert!(rogue.receive(Time::ZERO, 0, &reply).is_none());
            }
        }
        assert!(matches!(rogue.refusal(0), Some(LinkError::NotAdmitted(_))));
        assert_eq!(links[0].stats().inbound.not_admitted, 1);
        // Plain framing and garbage are counted, not delivered.
        assert!(links[0].receive(Time::ZERO, 1, b"TGR\x02").is_none());
        assert!(links[0].receive(Time::ZERO, 1, b"TGR\x02\x07xx").is_none());
        assert!(links[0].receive(Time::ZERO, 0, b"TGR\x02\x01xx").is_none());
        assert_eq!(links[0].stats().malformed, 3);
        // The builder checks the key list.
        assert!(matches!(
            ReplicaLink::new(
                ReplicaSecurity::new(ids[0].clone(), keys.clone()),
                1,
                counter_entropy()
            ),
            Err(ReplicaLinkError::NotOwnKey { .. })
        ));
        assert!(matches!(
            ReplicaLink::new(
                ReplicaSecurity::new(ids[0].clone(), keys.clone()),
                3,
                counter_entropy()
            ),
            Err(ReplicaLinkError::KeyCount { .. })
        ));
    }

    #[test]
    fn a_restarted_replica_handshakes_again_both_ways() {
        let ids: Vec<Identity> = (1..=2u8)
            .map(|i| Identity::from_private([i; 32]).unwrap())
            .collect();
        let keys: Vec<PublicKey> = ids.iter().map(|i| *i.public()).collect();
        let mut links = replica_links(&ids, &keys);
        links[0].send(Time::ZERO, 1, b"a");
        links[1].send(Time::ZERO, 0, b"b");
        assert_eq!(carry(&mut links, Time::ZERO).len(), 2);
        // Replica 1 restarts: a new link with a later stamp.
        let later = Time::ZERO + Duration::from_secs(1);
        let mut security = ReplicaSecurity::new(ids[1].clone(), keys.clone());
        security.stamp_base = 5_000_000;
        links[1] = ReplicaLink::new(security, 1, counter_entropy()).unwrap();
        links[0].send(later, 1, b"lost");
        links[1].send(later, 0, b"c");
        let got = carry(&mut links, later);
        assert_eq!(got, vec![(0, 1, b"c".to_vec())]);
        links[0].send(later, 1, b"d");
        let got = carry(&mut links, later);
        assert_eq!(got, vec![(1, 0, b"d".to_vec())]);
        assert_eq!(links[0].stats().outbound.sessions, 2);
    }
}
