//! The real membership service in the simulator ([`MembershipKind::Gms`]).
//!
//! One extra simulated node (id `nodes`, after every protocol node) runs [`tidings_gms::Gms`];
//! every protocol node's host runs a [`Member`](tidings_gms::Member) that joined it, the same
//! control plane as the runtime's. Their messages are datagrams on the simulated network (lost,
//! queued and delayed like any other): the GMS framing of the runtime ([`tidings_gms::frame`])
//! behind `"GM"` and the sender's node id (`u32`, little-endian), which stand for the UDP source
//! address the simulated network does not carry. Protocol datagrams start with `"TD"`
//! ([`tidings_wire::peek_kind`]), so a host tells the two apart by the first two bytes.
//!
//! **Ids.** The GMS numbers nodes from 1 in join order; the simulator's nodes are `0..nodes`.
//! The bootstrap joins them in id order, so GMS id = simulator id + 1 ([`to_gms`],
//! [`from_gms`]). The protocol nodes run with their GMS ids; the host translates at its boundary
//! (destinations, deliveries, and memberships for the checker). Topics: topic `t` is named
//! `"t{t}"`; sender 0 advertises `t1..=tT` first, in order, so the GMS binds `"t{t}"` to
//! `TopicId(t)`; every binding the GMS announces is checked against that rule (a mismatch is a
//! violation of the run).
//!
//! **Bootstrap.** The initial joins, subscriptions and advertisements are GMS commands applied
//! before time zero, and the GMS's update streams are handed to the clients directly, so every
//! node starts with its own part of the initial membership (as with the oracle, where everyone
//! starts with the whole of it). Everything from time zero on travels over the network:
//! heartbeats, requests (churn), suspicions, updates and acknowledgements.
//!
//! **Multicast groups.** The world's fan-out of a region is the member list of the GMS's latest
//! view of it, changed the moment the GMS issues the view (as IGMP joins would, a little
//! early). This loses nothing the promise covers: a sender still using an older view has its
//! message delivered to the members common to both views; a member that left gets no more of
//! the old view's data, but the old view cannot become stable without its acknowledgement, so the
//! sender, once it learns the new view, re-homes the message into the regions its topic spans
//! then (where a receiver that moved is); a member that joined early gets datagrams of a view it
//! does not know yet and buffers them until its update arrives.
//!
//! **The checker** ([`Ledger`]) runs in its asynchronous mode: what a receiver must deliver is
//! decided by the sender's membership when it published and by the GMS's own record of the
//! receiver's subscriptions (see the ledger's docs); view-change pauses are measured from each
//! GMS turn that issues views; crash-to-removal times are reported as `crash_detection_ms`; a live
//! node removed by the GMS, a node put in two regions, or a topic bound to an unexpected id is a
//! violation.
//!
//! **Security** (`Scenario::security` not `Off`). Every node and the service get identities drawn
//! from the seed (`seeded_identity`; the replicas of a replicated service share the service's,
//! as on socket hosts); each node's [`NodeLink`] runs the real Noise handshake with every
//! replica's [`ServiceLink`] before time zero (carried directly, as the joins are), and every GMS
//! datagram after it travels sealed in its session, the simulator id standing for the source
//! address. The service runs with `GmsConfig::datagram_keys`, each replica's key entropy drawn
//! from the seed after every input (the leader's decides the key, which reaches the others
//! through the log), and each member seals and opens protocol datagrams in [`member_config`]'s
//! mode with the region keys it hands out (ADR 43; grace [`KEY_GRACE`]). A removed node's session ends with it
//! at every replica, as on a socket host; a restarted replica starts with no sessions, and the
//! nodes shake hands with it again when it tells them it cannot read them. Replicas speak Raft
//! only through their [`ReplicaLink`]s (identities drawn from the seed), as on socket hosts.
//!
//! **Churn.** A leave unsubscribes from everything (the node stays a member, so its id and
//! client stay), a join or resubscribe asks for another profile's topics, one request per topic;
//! the GMS applies them one by one, so a resubscribe walks the node through a chain of
//! intermediate regions, each a view change for the senders of its topics.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use tidings_gms::replica::{FRAGMENT_BYTES_DEFAULT, FRAGMENT_BYTES_MIN};
use tidings_gms::{
    ClientConfig, Command, Durable, Entropy, Gms, GmsClient, GmsConfig, GmsEvent, GmsMessage,
    Inbound, LinkSecurity, MemberConfig, NodeLink, Peer, PlannerConfig, RemoveCause, Replica,
    ReplicaConfig, ReplicaEvent, ReplicaLink, ReplicaSecurity, ReplicaTransmit, ServiceLink,
    ServiceSecurity, REPLICA_LINK_OVERHEAD,
};
use tidings_proto::{Membership, NodeId, RegionId, RegionView, Time, TopicId, ViewId};
use tidings_seal::{AllowList, Identity, KeyRingConfig, Mode, PublicKey};

use crate::checker::Ledger;

/// First bytes of a GMS datagram in the simulator, before the sender's id.
pub const GMS_MAGIC: [u8; 2] = *b"GM";

/// First bytes of a datagram between the replicas of the GMS in the simulator, before the
/// sender's id.
pub const REPLICA_MAGIC: [u8; 2] = *b"GR";

/// Magic plus the sender's id.
const HEADER_LEN: usize = 6;

/// A suspicion of the same node is reported to the GMS at most this often.
const SUSPECT_INTERVAL: Duration = Duration::from_millis(100);

/// How long a member still opens datagrams under the previous datagram key, in the simulator
/// (the runtime's default is 2 s, longer than most simulated runs): datagrams in flight when a
/// key changes cross a simulated LAN in well under a millisecond, and the service resends a
/// lost update every 50 ms.
pub const KEY_GRACE: Duration = Duration::from_millis(150);

/// The members' settings in the simulator: protocol datagrams sealed in `security` mode (with
/// the service's datagram keys) unless it is [`Mode::Off`].
#[must_use]
pub fn member_config(security: Mode) -> MemberConfig {
    MemberConfig {
        suspect_interval: SUSPECT_INTERVAL,
        sealing: KeyRingConfig {
            mode: security,
            ..KeyRingConfig::default()
        },
        key_grace: KEY_GRACE,
        ..MemberConfig::default()
    }
}

/// Entropy for handshakes and keys from a seeded generator: the simulator's stand-in for
/// `tidings_seal::os_random`, so a seed replays every handshake and key exactly.
#[must_use]
pub fn seeded_entropy(seed: u64) -> Entropy {
    let mut rng = fastrand::Rng::with_seed(seed);
    Box::new(move || Some(seeded_bytes(&mut rng)))
}

/// 32 bytes from `rng`.
pub(crate) fn seeded_bytes(rng: &mut fastrand::Rng) -> [u8; 32] {
    let mut b = [0u8; 32];
    rng.fill(&mut b);
    b
}

/// An identity drawn from `rng` (the simulator's stand-in for `tidings keygen`).
pub(crate) fn seeded_identity(rng: &mut fastrand::Rng) -> Result<Identity, String> {
    Identity::from_private(seeded_bytes(rng)).map_err(|e| e.to_string())
}

/// Which membership service a scenario runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MembershipKind {
    /// [`MembershipOracle`](crate::churn::MembershipOracle): every change installed on every live
    /// node at the same instant; a crash noticed after `Scenario::detection`.
    #[default]
    Oracle,
    /// The real GMS on an extra simulated node, clients in every host, messages on the network;
    /// views reach nodes at different times. `Scenario::detection` is its heartbeat timeout.
    Gms,
}

/// A fault of the replicated service (`--gms-fault`), at 40% of the publishing time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GmsFault {
    /// The leader replica crashes for good.
    CrashLeader,
    /// The leader is cut off from the other replicas for a second (clients still reach it):
    /// they elect another, and what it sends meanwhile must not be obeyed.
    IsolateLeader,
    /// A follower crashes and restarts at once from what it kept (its snapshot and log).
    RestartReplica,
}

impl GmsFault {
    /// Every fault, for sweeps and help texts.
    pub const ALL: [GmsFault; 3] = [
        GmsFault::CrashLeader,
        GmsFault::IsolateLeader,
        GmsFault::RestartReplica,
    ];

    /// The name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            GmsFault::CrashLeader => "crash-leader",
            GmsFault::IsolateLeader => "isolate-leader",
            GmsFault::RestartReplica => "restart-replica",
        }
    }

    /// The fault of a command-line name.
    #[must_use]
    pub fn parse(name: &str) -> Option<GmsFault> {
        GmsFault::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The GMS's id of simulator node `node`.
#[must_use]
pub fn to_gms(node: NodeId) -> NodeId {
    NodeId(node.0.saturating_add(1))
}

/// The simulator's id of GMS node `node` (`None` for id 0, which the GMS never gives).
#[must_use]
pub fn from_gms(node: NodeId) -> Option<NodeId> {
    node.0.checked_sub(1).map(NodeId)
}

/// A region view with GMS ids turned into simulator ids.
fn translate_view(mut v: RegionView) -> RegionView {
    translate_ids(&mut v);
    v
}

/// Turns the GMS ids of `v` into simulator ids in place (every committed batch of every client
/// comes through here).
fn translate_ids(v: &mut RegionView) {
    for p in &mut v.partitions {
        p.retain(|&n| from_gms(n).is_some());
        for n in p.iter_mut() {
            *n = from_gms(*n).unwrap_or(*n);
        }
    }
}

/// A membership with GMS ids turned into simulator ids (in place, like the views).
#[must_use]
pub fn translate(mut m: Membership) -> Membership {
    m.regions.values_mut().for_each(translate_ids);
    m
}

/// The name of simulator topic `t`.
#[must_use]
pub fn topic_name(t: TopicId) -> String {
    format!("t{}", t.0)
}

/// A GMS datagram (framed as the runtime frames it) from `from`, for the simulated network.
pub(crate) fn wrap(from: NodeId, datagram: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + datagram.len());
    out.extend_from_slice(&GMS_MAGIC);
    out.extend_from_slice(&from.0.to_le_bytes());
    out.extend_from_slice(datagram);
    out
}

/// A datagram between replicas from `from`, for the simulated network.
fn wrap_replica(from: NodeId, datagram: &[u8]) -> Vec<u8> {
    let mut out = wrap(from, datagram);
    out[..2].copy_from_slice(&REPLICA_MAGIC);
    out
}

/// First bytes of a fragment of a GMS datagram larger than the simulated network's datagram
/// limit: `"GF"`, the sender's id (`u32`), the datagram's number at the sender (`u32`), the
/// fragment's index and the fragment count (`u16` each), all little-endian, then the bytes.
/// Such datagrams (a region view of hundreds of members) travel in fragments as IP would carry
/// them: one fragment lost loses the datagram. Replicas do not need them: they cut their
/// messages to the datagram limit themselves (see `bootstrap`).
pub const FRAGMENT_MAGIC: [u8; 2] = *b"GF";

/// Bytes of a fragment's header.
const FRAGMENT_HEADER_LEN: usize = 14;

/// Fragments of one datagram at most (a 16 MiB snapshot in 1472-byte datagrams).
const FRAGMENTS_MAX: usize = 16_384;

/// Datagrams in reassembly at a host at most; the oldest is dropped past it.
const REASSEMBLY_MAX: usize = 64;

/// Cuts `datagram` (from `from`, its `number`-th) into fragments of at most `limit` bytes.
pub(crate) fn fragments(from: NodeId, number: u32, datagram: &[u8], limit: usize) -> Vec<Vec<u8>> {
    let room = limit.saturating_sub(FRAGMENT_HEADER_LEN).max(1);
    let count = datagram.len().div_ceil(room);
    if count > FRAGMENTS_MAX {
        return Vec::new();
    }
    datagram
        .chunks(room)
        .enumerate()
        .map(|(i, chunk)| {
            let mut f = Vec::with_capacity(FRAGMENT_HEADER_LEN + chunk.len());
            f.extend_from_slice(&FRAGMENT_MAGIC);
            f.extend_from_slice(&from.0.to_le_bytes());
            f.extend_from_slice(&number.to_le_bytes());
            f.extend_from_slice(&(i as u16).to_le_bytes());
            f.extend_from_slice(&(count as u16).to_le_bytes());
            f.extend_from_slice(chunk);
            f
        })
        .collect()
}

/// The fragments of one datagram received so far, and how many those are.
type Partial = (Vec<Option<Vec<u8>>>, usize);

/// Datagrams being put together from their fragments, at one host.
#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    /// By (sender, number): the fragments so far and how many there are.
    partial: BTreeMap<(NodeId, u32), Partial>,
    /// Arrival order of the partial datagrams, oldest first.
    order: VecDeque<(NodeId, u32)>,
}

impl Reassembly {
    /// Takes a fragment; the whole datagram once its last fragment is in. `None` for anything
    /// else (including bytes that are not a well-formed fragment).
    pub(crate) fn take(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        if bytes.len() < FRAGMENT_HEADER_LEN || bytes[..2] != FRAGMENT_MAGIC {
            return None;
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u16_at = |i: usize| usize::from(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
        let key = (NodeId(u32_at(2)), u32_at(6));
        let (index, count) = (u16_at(10), u16_at(12));
        if count == 0 || index >= count {
            return None;
        }
        if !self.partial.contains_key(&key) {
            if self.order.len() >= REASSEMBLY_MAX {
                if let Some(old) = self.order.pop_front() {
                    self.partial.remove(&old);
                }
            }
            self.order.push_back(key);
            self.partial.insert(key, (vec![None; count], 0));
        }
        let (parts, have) = self.partial.get_mut(&key)?;
        if parts.len() != count {
            return None;
        }
        if parts[index].is_none() {
            parts[index] = Some(bytes[FRAGMENT_HEADER_LEN..].to_vec());
            *have += 1;
        }
        if *have < count {
            return None;
        }
        let (parts, _) = self.partial.remove(&key)?;
        self.order.retain(|k| *k != key);
        Some(parts.into_iter().flatten().flatten().collect())
    }
}

/// The sender and body of a simulated datagram between replicas, or `None` if it is not one.
pub(crate) fn unwrap_replica(bytes: &[u8]) -> Option<(NodeId, &[u8])> {
    if bytes.len() < HEADER_LEN || bytes[..2] != REPLICA_MAGIC {
        return None;
    }
    let id = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    Some((NodeId(id), &bytes[HEADER_LEN..]))
}

/// The sender and the GMS datagram of a simulated one, or `None` if it is not one.
pub(crate) fn unwrap(bytes: &[u8]) -> Option<(NodeId, &[u8])> {
    if bytes.len() < HEADER_LEN || bytes[..2] != GMS_MAGIC {
        return None;
    }
    let id = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    Some((NodeId(id), &bytes[HEADER_LEN..]))
}

/// What the GMS did during a run, for the scenario loop and the report.
#[derive(Debug, Default)]
pub struct GmsLog {
    /// Nodes the GMS removed (simulator ids), when and why.
    pub removed: BTreeMap<NodeId, (Time, RemoveCause)>,
    /// GMS commands that issued new views (after the bootstrap).
    pub view_changes: u64,
    /// Live nodes told they were removed.
    pub removed_alive: BTreeSet<NodeId>,
    /// With replicas: when a replica began to lead, and which (simulator id).
    pub leaderships: Vec<(Time, NodeId)>,
    /// When the GMS fault of the run struck, if it did.
    pub fault_at: Option<Time>,
    /// The first view issued after the fault (by the leader then).
    pub first_view_after_fault: Option<Time>,
    /// Joins the service read from a node that is not one of the scenario's (the attacker's).
    pub foreign_joins: u64,
}

/// The service on one simulated node: the whole service, or one replica of it.
#[derive(Debug)]
enum Service {
    Single(Box<Gms>),
    Replicated(Box<ReplicaRole>),
}

/// One replica of the service, and the faults the scenario puts on it.
#[derive(Debug)]
struct ReplicaRole {
    replica: Replica,
    config: ReplicaConfig,
    /// The sim ids of every replica, by index.
    peers: Vec<NodeId>,
    /// Until then, what this replica sends to or receives from the other replicas is lost (it
    /// still hears and answers clients).
    isolated_until: Time,
    /// With security: the sealed links with the other replicas (Raft only inside Noise
    /// sessions, as on socket hosts), and how to start them over after a restart.
    link: Option<ReplicaLinks>,
}

/// A replica's sealed links with the other replicas.
struct ReplicaLinks {
    link: ReplicaLink,
    /// This replica's identity and the replicas' keys.
    security: ReplicaSecurity,
    /// Seeds the handshakes' entropy (with the restarts so far).
    seed: u64,
    /// Restarts so far.
    restarts: u64,
}

impl std::fmt::Debug for ReplicaLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaLinks")
            .field("link", &self.link.stats())
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl ReplicaLinks {
    /// The links of replica `index`, with no session yet.
    fn new(security: ReplicaSecurity, index: usize, seed: u64) -> Result<ReplicaLinks, String> {
        let link = ReplicaLink::new(security.clone(), index, seeded_entropy(seed))
            .map_err(|e| e.to_string())?;
        Ok(ReplicaLinks {
            link,
            security,
            seed,
            restarts: 0,
        })
    }

    /// The replica restarted: its sessions are gone.
    fn restart(&mut self, index: usize) -> Result<(), String> {
        self.restarts += 1;
        self.link = ReplicaLink::new(
            self.security.clone(),
            index,
            seeded_entropy(self.seed ^ self.restarts.rotate_left(48)),
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The membership service (or one replica of it), on its own simulated node.
#[derive(Debug)]
pub(crate) struct ServiceRole {
    service: Service,
    /// The service was serving clients at the end of the last input (the leader, with
    /// replicas): it then tells the checker and the world what it applied.
    was_serving: bool,
    nodes: u32,
    nonces: BTreeMap<u64, NodeId>,
    commands_seen: u64,
    views_seen: u64,
    subscriptions: Vec<Vec<TopicId>>,
    regions: BTreeMap<RegionId, Vec<NodeId>>,
    regions_changed: bool,
    log: Rc<RefCell<GmsLog>>,
    /// Datagrams to send: the destination and the simulated datagram.
    pub(crate) outgoing: VecDeque<(NodeId, Vec<u8>)>,
    /// This host's simulator id.
    me: NodeId,
    /// With security: the admitted link and where the service's datagram keys come from.
    secure: Option<SecureService>,
    /// Replica datagrams longer than the replica's fragment size, so longer than a datagram
    /// (dropped).
    pub(crate) oversize: u64,
}

/// The admitted link of a service (or replica) host.
struct SecureService {
    /// Noise sessions by simulator id, which stands for the source address.
    link: ServiceLink<NodeId>,
    /// The generator the service's datagram keys are drawn from.
    keys: fastrand::Rng,
    /// The identity and allow list, to start the link over when the host restarts.
    security: ServiceSecurity,
    /// Seeds the link's handshake entropy (with the restarts so far).
    seed: u64,
    /// Restarts of the host so far.
    restarts: u64,
}

impl std::fmt::Debug for SecureService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureService")
            .field("link", &self.link.stats())
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl SecureService {
    /// The link of a host that starts with no sessions.
    fn new(security: ServiceSecurity, keys: fastrand::Rng, seed: u64) -> SecureService {
        SecureService {
            link: ServiceLink::new(security.clone(), seeded_entropy(seed)),
            keys,
            security,
            seed,
            restarts: 0,
        }
    }

    /// The host restarted: its sessions are gone.
    fn restart(&mut self) {
        self.restarts += 1;
        self.link = ServiceLink::new(
            self.security.clone(),
            seeded_entropy(self.seed ^ self.restarts.rotate_left(48)),
        );
    }
}

impl ServiceRole {
    /// A GMS datagram (framed) from simulator node `from`.
    pub(crate) fn handle_datagram(&mut self, now: Time, from: NodeId, datagram: &[u8]) {
        let opened;
        let datagram = match self.secure.as_mut() {
            None => datagram,
            Some(secure) => match secure.link.receive(from, datagram) {
                Inbound::Gms(plain) => {
                    opened = plain;
                    &opened[..]
                }
                Inbound::Reply(reply) => {
                    self.outgoing.push_back((from, wrap(self.me, &reply)));
                    return;
                }
                Inbound::Dropped => return,
            },
        };
        let peer = Peer::Node(to_gms(from));
        let body = tidings_gms::unframe(datagram);
        if let Some(Ok(GmsMessage::Join { nonce, .. })) = body.map(GmsMessage::decode) {
            self.nonces.insert(nonce, from);
            if from.0 >= self.nodes {
                self.log.borrow_mut().foreign_joins += 1;
            }
        }
        match (&mut self.service, body) {
            // Counted by the service as malformed.
            (Service::Single(gms), None) => gms.handle_datagram(now, peer, datagram),
            (Service::Single(gms), Some(body)) => gms.handle_datagram(now, peer, body),
            (Service::Replicated(r), body) => {
                r.replica.handle_client(now, peer, body.unwrap_or(datagram))
            }
        }
    }

    /// A datagram from another replica (simulator node `from`).
    pub(crate) fn handle_replica(&mut self, now: Time, from: NodeId, bytes: &[u8]) {
        if let Service::Replicated(r) = &mut self.service {
            if now < r.isolated_until {
                return;
            }
            // A node that is not a replica is the replica's to count (an impostor).
            let index = r
                .peers
                .iter()
                .position(|&p| p == from)
                .unwrap_or(usize::MAX);
            match r.link.as_mut() {
                Some(links) if index != usize::MAX => {
                    if let Some(message) = links.link.receive(now, index, bytes) {
                        r.replica.handle_replica(now, index, &message);
                    }
                }
                _ => r.replica.handle_replica(now, index, bytes),
            }
        }
    }

    /// Time has passed.
    pub(crate) fn handle_timeout(&mut self, now: Time) {
        match &mut self.service {
            Service::Single(gms) => {
                if gms.poll_timeout().is_some_and(|t| t <= now) {
                    gms.handle_timeout(now);
                }
            }
            Service::Replicated(r) => {
                if r.replica.poll_timeout().is_some_and(|t| t <= now) {
                    r.replica.handle_timeout(now);
                }
                if let Some(links) = r.link.as_mut() {
                    if links.link.poll_timeout().is_some_and(|t| t <= now) {
                        links.link.handle_timeout(now);
                    }
                }
            }
        }
    }

    /// The next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        match &self.service {
            Service::Single(gms) => gms.poll_timeout(),
            Service::Replicated(r) => {
                let link = r.link.as_ref().and_then(|l| l.link.poll_timeout());
                match (r.replica.poll_timeout(), link) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }

    /// Whether this replica serves clients (always, without replicas).
    pub(crate) fn is_serving(&self) -> bool {
        match &self.service {
            Service::Single(_) => true,
            Service::Replicated(r) => r.replica.is_serving(),
        }
    }

    /// The replica crashes and restarts at once from what it kept ([`Replica::durable`]).
    pub(crate) fn restart(&mut self) -> Result<(), String> {
        if let Service::Replicated(r) = &mut self.service {
            r.replica = Replica::restart(r.config.clone(), r.replica.durable())
                .map_err(|e| e.to_string())?;
            if let Some(links) = r.link.as_mut() {
                links.restart(r.config.index)?;
            }
            if let Some(secure) = self.secure.as_mut() {
                secure.restart();
            }
        }
        Ok(())
    }

    /// Cuts the replica off from the other replicas until `until` (clients still reach it).
    pub(crate) fn isolate(&mut self, until: Time) {
        if let Service::Replicated(r) = &mut self.service {
            r.isolated_until = until;
        }
    }

    /// A new region map for the world, if the GMS issued views since the last call.
    pub(crate) fn poll_regions(&mut self) -> Option<BTreeMap<RegionId, Vec<NodeId>>> {
        if !self.regions_changed {
            return None;
        }
        self.regions_changed = false;
        Some(self.regions.clone())
    }

    /// The admitted link's counters, when the service runs one.
    pub(crate) fn link_stats(&self) -> Option<&tidings_gms::ServiceLinkStats> {
        self.secure.as_ref().map(|secure| secure.link.stats())
    }

    /// The service (this replica's state of it).
    pub(crate) fn gms(&self) -> &Gms {
        match &self.service {
            Service::Single(gms) => gms,
            Service::Replicated(r) => r.replica.gms(),
        }
    }
}

/// The topics of the regions `me` is a member of in `m` that it subscribes to (what it may
/// deliver; with approximate regions its regions carry others too).
pub(crate) fn local_topics(m: &Membership, me: NodeId) -> BTreeSet<TopicId> {
    m.regions
        .values()
        .filter(|v| v.members().any(|n| n == me))
        .flat_map(|v| v.topics.iter().copied())
        .filter(|t| m.subscriptions.as_ref().is_none_or(|s| s.contains(t)))
        .collect()
}

/// Per topic, the members of the regions `m` maps it to, each with its region and view. A
/// publisher's membership maps each of its topics (a hundred in the churn sweep) to a few of the
/// same regions, and this runs at every membership it installs: each region's members are listed
/// once, and each topic's list is allocated at its size.
pub(crate) fn sender_view(m: &Membership) -> BTreeMap<TopicId, Vec<(NodeId, RegionId, ViewId)>> {
    let members: BTreeMap<RegionId, Vec<(NodeId, RegionId, ViewId)>> = m
        .regions
        .iter()
        .map(|(&r, v)| (r, v.members().map(|n| (n, r, v.view)).collect()))
        .collect();
    m.topic_regions
        .iter()
        .map(|(&t, regions)| {
            let of = || regions.iter().filter_map(|r| members.get(r));
            let mut list = Vec::with_capacity(of().map(Vec::len).sum());
            for region_members in of() {
                list.extend_from_slice(region_members);
            }
            (t, list)
        })
        .collect()
}

impl ServiceRole {
    /// Drains the service's outputs after an input: datagrams to send, and what the checker
    /// must learn. `me` is this host's id.
    pub(crate) fn after_input(&mut self, now: Time, me: NodeId, ledger: &mut Ledger) {
        let mut events = Vec::new();
        if let Some(secure) = self.secure.as_mut() {
            match &mut self.service {
                Service::Single(gms) if gms.wants_key_entropy() => {
                    gms.give_key_entropy(seeded_bytes(&mut secure.keys));
                }
                Service::Replicated(r) if r.replica.wants_key_entropy() => {
                    r.replica
                        .give_key_entropy(now, seeded_bytes(&mut secure.keys));
                }
                _ => {}
            }
        }
        loop {
            let tx = match &mut self.service {
                Service::Single(gms) => gms.poll_transmit(),
                Service::Replicated(r) => match r.replica.poll_transmit() {
                    Some(ReplicaTransmit::Client(tx)) => Some(tx),
                    Some(ReplicaTransmit::Replica { to, bytes }) => {
                        if bytes.len() > r.config.fragment_bytes {
                            self.oversize += 1;
                        } else if let Some(links) = r.link.as_mut() {
                            // Sealed below, with the link's handshakes.
                            links.link.send(now, to, &bytes);
                        } else if now >= r.isolated_until {
                            if let Some(&peer) = r.peers.get(to) {
                                self.outgoing.push_back((peer, wrap_replica(me, &bytes)));
                            }
                        }
                        continue;
                    }
                    None => None,
                },
            };
            let Some(tx) = tx else { break };
            let to = match tx.to {
                Peer::Node(n) => from_gms(n),
                Peer::Joiner(nonce) => self.nonces.get(&nonce).copied(),
            };
            if let Some(to) = to.filter(|n| n.0 < self.nodes) {
                let framed = tidings_gms::frame(&tx.msg);
                match self.secure.as_mut() {
                    None => self.outgoing.push_back((to, wrap(me, &framed))),
                    Some(secure) => {
                        // Nothing goes to a node without a session.
                        if let Some(sealed) = secure.link.seal_to(&to, &framed) {
                            self.outgoing.push_back((to, wrap(me, &sealed)));
                        }
                    }
                }
            }
        }
        if let Service::Replicated(r) = &mut self.service {
            if let Some(links) = r.link.as_mut() {
                while let Some((to, datagram)) = links.link.poll_transmit() {
                    if now >= r.isolated_until {
                        if let Some(&peer) = r.peers.get(to) {
                            self.outgoing.push_back((peer, wrap_replica(me, &datagram)));
                        }
                    }
                }
            }
        }
        match &mut self.service {
            Service::Single(gms) => events.extend(std::iter::from_fn(|| gms.poll_event())),
            Service::Replicated(r) => {
                while let Some(e) = r.replica.poll_event() {
                    match e {
                        ReplicaEvent::Gms(e) => events.push(e),
                        ReplicaEvent::Leading { .. } => {
                            self.log.borrow_mut().leaderships.push((now, me));
                        }
                        ReplicaEvent::Following { .. } => {}
                    }
                }
            }
        }
        // Every replica applies (and reports) what was committed: a removed node's admitted
        // session ends with it at every replica, as on a socket host.
        if let Some(secure) = self.secure.as_mut() {
            for ev in &events {
                if let GmsEvent::Removed { node, .. } = ev {
                    if let Some(n) = from_gms(*node) {
                        secure.link.forget(&n);
                    }
                }
            }
        }
        // The checker hears what was committed from the replica serving.
        let serving = self.is_serving();
        let became = serving && !self.was_serving;
        self.was_serving = serving;
        if !serving {
            return;
        }
        for ev in events {
            match ev {
                GmsEvent::Removed { node, cause } => {
                    if let Some(n) = from_gms(node) {
                        self.log
                            .borrow_mut()
                            .removed
                            .entry(n)
                            .or_insert((now, cause));
                    }
                }
                GmsEvent::TopicCreated { name, topic } => {
                    if name != topic_name(topic) {
                        ledger.external_violation(format!(
                            "the GMS bound {name:?} to {topic}, expected {}",
                            topic_name(topic)
                        ));
                    }
                }
                GmsEvent::Joined(_) => {}
            }
        }
        let gms = match &self.service {
            Service::Single(gms) => gms,
            Service::Replicated(r) => r.replica.gms(),
        };
        let stats = gms.stats();
        if became {
            // A new leader: what it applied as a follower is the old leader's news, told to
            // the checker then; only the subscriptions and regions are checked against it.
            self.views_seen = stats.views_issued;
        }
        if stats.commands != self.commands_seen || became {
            self.commands_seen = stats.commands;
            for i in 0..self.nodes {
                let node = NodeId(i);
                let topics: Vec<TopicId> = gms.planner().subscriptions(to_gms(node)).collect();
                if self.subscriptions[i as usize] != topics {
                    ledger.set_subscriptions(node, &topics, now);
                    self.subscriptions[i as usize] = topics;
                }
            }
            let regions = world_regions(gms);
            if regions != self.regions {
                self.regions = regions;
                self.regions_changed = true;
            }
        }
        let views = gms.stats().views_issued;
        if views != self.views_seen || became {
            let issued = views != self.views_seen;
            self.views_seen = views;
            // When each view was issued, for what a stale sender's membership still requires
            // (a view already known keeps its first time).
            for (r, _) in gms.planner().regions() {
                if let Some(v) = gms.view_of(r) {
                    ledger.view_issued(r, v, now);
                }
            }
            if issued {
                let mut log = self.log.borrow_mut();
                log.view_changes += 1;
                if log.fault_at.is_some_and(|t| now >= t) && log.first_view_after_fault.is_none() {
                    log.first_view_after_fault = Some(now);
                }
                drop(log);
                ledger.view_change(now);
            }
        }
    }
}

/// The most regions any node is in (1 is what the protocol node supports today).
#[must_use]
pub fn regions_per_node_max(gms: &Gms) -> usize {
    let mut count: BTreeMap<NodeId, usize> = BTreeMap::new();
    for (_, reg) in gms.planner().regions() {
        for &n in &reg.members {
            *count.entry(n).or_default() += 1;
        }
    }
    count.values().copied().max().unwrap_or(0)
}

/// The GMS's latest region views as the world's multicast map (simulator ids).
fn world_regions(gms: &Gms) -> BTreeMap<RegionId, Vec<NodeId>> {
    gms.planner()
        .regions()
        .map(|(r, reg)| (r, reg.members.iter().filter_map(|&n| from_gms(n)).collect()))
        .collect()
}

/// The GMS's whole current membership (simulator ids): every region view and topic.
#[must_use]
pub fn global_membership(gms: &Gms) -> Membership {
    let planner = gms.planner();
    let mut m = Membership::default();
    for (r, _) in planner.regions() {
        let view = gms.view_of(r).zip(gms.base_of(r));
        if let Some(v) = view.and_then(|v| planner.region_view(r, v, gms.config().partition_size)) {
            m.regions.insert(r, translate_view(v));
        }
    }
    for t in planner.topics() {
        m.topic_regions
            .insert(t, planner.topic_regions(t).collect());
    }
    m
}

/// The configuration of the simulated GMS and its clients.
///
/// **Regions.** The planner runs with its defaults (paper 001's subsets), so a node is in
/// several regions and gets a sender's topics through parallel streams: the promise is order per
/// sender within a topic, and duplicates after view changes are recognised per (sender, topic)
/// (ADR 0007).
///
/// **Timing:** `detection` is the heartbeat timeout; clients heartbeat six
/// times per timeout (so a few lost heartbeats never remove a node), a ring neighbour's
/// suspicion removes a silent node after a third of it, and updates and requests are resent
/// every 50 ms (a simulated LAN round trip is well under a millisecond).
#[must_use]
pub fn configs(detection: Duration, partition_size: usize) -> (GmsConfig, ClientConfig) {
    let detection = detection.max(Duration::from_millis(6));
    let gms = {
        let mut c = GmsConfig::default();
        c.planner = PlannerConfig::default();
        c.partition_size = partition_size.max(1);
        c.heartbeat_timeout = detection;
        c.suspicion_timeout = detection / 3;
        c.retransmit_interval = Duration::from_millis(50);
        c
    };
    let client = ClientConfig {
        heartbeat_interval: detection / 6,
        retransmit_interval: Duration::from_millis(50),
        ..ClientConfig::default()
    };
    (gms, client)
}

/// The GMS and clients of a scenario at time zero.
pub(crate) struct Bootstrap {
    /// The joined clients, `[i]` for `NodeId(i)`.
    pub(crate) clients: Vec<GmsClient>,
    /// The service for the GMS node, or one replica each for the GMS nodes.
    pub(crate) services: Vec<ServiceRole>,
    /// Each protocol node's initial membership (simulator ids).
    pub(crate) memberships: Vec<Membership>,
    /// The whole initial membership.
    pub(crate) global: Membership,
    /// Shared with the roles.
    pub(crate) log: Rc<RefCell<GmsLog>>,
    /// With security: each node's admitted GMS link, its session with the service up.
    pub(crate) links: Vec<NodeLink>,
    /// With security: the service's public key (every node is configured with it).
    pub(crate) service_key: Option<PublicKey>,
}

/// How the simulated service runs: its timing, regions and replicas.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServiceSetup {
    /// The heartbeat timeout ([`configs`]).
    pub(crate) detection: Duration,
    /// Members of a region per partition.
    pub(crate) partition_size: usize,
    /// Replicas of the service (1: the one-process service).
    pub(crate) replicas: u32,
    /// The planner's bound on each node's waste, in thousandths (0: exact regions; ADR 34).
    pub(crate) waste_max_permille: u32,
    /// The simulated network's largest datagram: replicas fragment what is longer.
    pub(crate) datagram_bytes: usize,
    /// How protocol datagrams are sealed. Any mode but [`Mode::Off`] runs the admitted GMS
    /// link (every node gets an identity on the service's allow list, and a session with every
    /// replica) and the service hands out datagram keys.
    pub(crate) security: Mode,
}

/// Builds the GMS and the clients, applies the initial joins (in id order), advertisements
/// (sender 0's first, topic by topic, so ids follow names) and subscriptions, and hands each
/// client its update stream directly. Errors name what did not come out as expected.
#[allow(clippy::too_many_arguments)] // the scenario's settings the service depends on, each apart
pub(crate) fn bootstrap(
    seed: u64,
    subscriptions: &[Vec<TopicId>],
    senders: u32,
    topics: u32,
    service: &ServiceSetup,
) -> Result<Bootstrap, String> {
    let (mut gms_config, mut client_config) = configs(service.detection, service.partition_size);
    gms_config.planner.waste_max_permille = service.waste_max_permille;
    let secure = service.security != Mode::Off;
    gms_config.datagram_keys = secure;
    let replicas = service.replicas.max(1);
    client_config.replicas = replicas as usize;
    // A client moves to the next replica after three of its heartbeats unanswered.
    client_config.failover_timeout = client_config.heartbeat_interval * 3;
    let mut gms = Gms::new(gms_config.clone()).map_err(|e| e.to_string())?;
    let mut key_rng = fastrand::Rng::with_seed(seed ^ 0x4b45_5953_0000);
    if secure {
        // The master secret, before the first region: every region's key derives from it.
        gms.give_key_entropy(seeded_bytes(&mut key_rng));
    }
    let n = u32::try_from(subscriptions.len()).map_err(|_| "too many nodes".to_string())?;
    let mut clients = Vec::with_capacity(n as usize);
    let mut nonces = BTreeMap::new();
    for i in 0..n {
        let config = ClientConfig {
            seed: seed.wrapping_mul(0xA24B_AED4_963E_E407) ^ u64::from(i) ^ 0x474d_5300,
            ..client_config.clone()
        };
        let mut client = GmsClient::new(config).map_err(|e| e.to_string())?;
        // The bootstrap reads each client's membership once, at the end; an event per committed
        // batch would copy it thousands of times only to be dropped.
        client.set_membership_events(false);
        if nonces.insert(client.nonce(), NodeId(i)).is_some() {
            return Err(format!("join nonce of node {i} collides"));
        }
        clients.push(client);
    }
    let t0 = Time::ZERO;
    for i in 0..clients.len() {
        let nonce = clients[i].nonce();
        gms.apply(t0, Command::Join { nonce, addr: None });
        exchange(&mut gms, &mut clients, &nonces);
    }
    let all: Vec<TopicId> = (1..=topics).map(TopicId).collect();
    let advertise = |gms: &mut Gms, clients: &mut [GmsClient], node: NodeId| {
        for &t in &all {
            gms.apply(
                t0,
                Command::Advertise {
                    node: to_gms(node),
                    name: topic_name(t),
                },
            );
            exchange(gms, clients, &nonces);
        }
    };
    if senders > 0 {
        advertise(&mut gms, &mut clients, NodeId(0));
    }
    // Nodes 0 and 1 subscribe to every topic first (dropping at the end those they do not want),
    // then the others: the planner groups the topics into subsets as they gain subscribers, as
    // paper 001's incremental greedy does; a node ends in one region per subset it has topics in.
    // Through the clients' own requests, so that each client knows what it subscribes to (and
    // delivers only that, with approximate regions).
    let sub = |gms: &mut Gms, clients: &mut [GmsClient], node: u32, t: TopicId, on: bool| {
        let name = topic_name(t);
        let client = &mut clients[node as usize];
        let sent = if on {
            client.subscribe(&name)
        } else {
            client.unsubscribe(&name)
        };
        debug_assert!(sent.is_ok(), "node {node}: {sent:?}");
        // Requests leave at the client's timer.
        client.handle_timeout(t0);
        exchange(gms, clients, &nonces);
    };
    let anchors = n.min(2);
    for a in 0..anchors {
        for &t in &all {
            sub(&mut gms, &mut clients, a, t, true);
        }
    }
    for (i, subs) in subscriptions.iter().enumerate().skip(anchors as usize) {
        for &t in subs {
            sub(&mut gms, &mut clients, i as u32, t, true);
        }
    }
    for a in 0..anchors {
        let keep = &subscriptions[a as usize];
        for &t in &all {
            if !keep.contains(&t) {
                sub(&mut gms, &mut clients, a, t, false);
            }
        }
    }
    for s in 1..senders.min(n) {
        advertise(&mut gms, &mut clients, NodeId(s));
    }
    exchange(&mut gms, &mut clients, &nonces);
    while let Some(ev) = gms.poll_event() {
        if let GmsEvent::TopicCreated { name, topic } = ev {
            if name != topic_name(topic) {
                return Err(format!("the GMS bound {name:?} to {topic}"));
            }
        }
    }
    let mut memberships = Vec::with_capacity(n as usize);
    for (i, c) in clients.iter_mut().enumerate() {
        let me = NodeId(i as u32);
        // The events (the names bound) stay for the member the client goes to.
        if c.node() != Some(to_gms(me)) {
            return Err(format!("node {i} joined as {:?}", c.node()));
        }
        let mut want: Vec<TopicId> = subscriptions[i].clone();
        want.sort_unstable();
        want.dedup();
        let got: Vec<TopicId> = gms.planner().subscriptions(to_gms(me)).collect();
        if got != want {
            return Err(format!("node {i} subscribes to {got:?}, not {want:?}"));
        }
        memberships.push(translate(c.membership()));
    }
    for t in &all {
        if gms.topic_id(&topic_name(*t)) != Some(*t) {
            return Err(format!("topic {} is not bound to {t}", topic_name(*t)));
        }
    }
    let log = Rc::new(RefCell::new(GmsLog::default()));
    let (links, service_links, service_key) = if secure {
        admit(seed, n, replicas, service.detection, &key_rng)?
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let mut service_links = service_links.into_iter();
    let global = global_membership(&gms);
    let regions = world_regions(&gms);
    let stats = gms.stats().clone();
    let sorted_subscriptions: Vec<Vec<TopicId>> = subscriptions
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    // Replicas start from the bootstrapped state, each restarted from the same snapshot of it.
    let mut replicated = Vec::new();
    if replicas > 1 {
        let durable = Durable::seeded(gms.snapshot(), replicas as usize);
        let peers: Vec<NodeId> = (0..replicas).map(|k| NodeId(n + k)).collect();
        // Replica links obey the simulated network's datagram limit as a socket host's obey
        // UDP's: each replica datagram (magic and sender included) fits one datagram, and
        // longer messages (appends of up to the default 60,000 bytes, as on a socket host, and
        // snapshots) travel in the replicas' own fragments. The fragments are not paced: the
        // simulated links queue them as a switch port would, and a socket host paces only so
        // as not to overflow a receive buffer the simulator does not model.
        let link_overhead = if secure { REPLICA_LINK_OVERHEAD } else { 0 };
        let fragment_bytes = service
            .datagram_bytes
            .saturating_sub(HEADER_LEN + link_overhead)
            .clamp(FRAGMENT_BYTES_MIN, FRAGMENT_BYTES_DEFAULT);
        // With security the replicas speak Raft only inside Noise sessions, each with its own
        // identity (drawn from the seed) and the others' keys listed by index.
        let replica_security = if secure {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x5245_504c_4b45_5953);
            let identities: Vec<Identity> = (0..replicas)
                .map(|_| seeded_identity(&mut rng))
                .collect::<Result<_, _>>()?;
            let keys: Vec<PublicKey> = identities.iter().map(|i| *i.public()).collect();
            identities
                .into_iter()
                .map(|identity| Some(ReplicaSecurity::new(identity, keys.clone())))
                .collect()
        } else {
            vec![None; replicas as usize]
        };
        for (k, security) in replica_security.into_iter().enumerate() {
            let config = {
                let mut c = ReplicaConfig::default();
                c.index = k;
                c.replicas = replicas as usize;
                c.seed = seed ^ 0x5245_504c ^ ((k as u64) << 32);
                c.fragment_bytes = fragment_bytes;
                c.fragments_per_tick = usize::MAX;
                c.gms = gms_config.clone();
                c
            };
            let replica =
                Replica::restart(config.clone(), durable.clone()).map_err(|e| e.to_string())?;
            let link = match security {
                Some(security) => Some(ReplicaLinks::new(
                    security,
                    k,
                    seed ^ 0x5245_504c_4c4e_4b00 ^ ((k as u64) << 40),
                )?),
                None => None,
            };
            replicated.push(Service::Replicated(Box::new(ReplicaRole {
                replica,
                config,
                peers: peers.clone(),
                isolated_until: Time::ZERO,
                link,
            })));
        }
    } else {
        replicated.push(Service::Single(Box::new(gms)));
    }
    let services = replicated
        .into_iter()
        .enumerate()
        .map(|(k, service)| ServiceRole {
            me: NodeId(n + k as u32),
            secure: service_links.next(),
            was_serving: matches!(service, Service::Single(_)),
            service,
            nodes: n,
            commands_seen: stats.commands,
            views_seen: stats.views_issued,
            regions: regions.clone(),
            regions_changed: false,
            log: log.clone(),
            outgoing: VecDeque::new(),
            oversize: 0,
            nonces: nonces.clone(),
            subscriptions: sorted_subscriptions.clone(),
        })
        .collect();
    Ok(Bootstrap {
        clients,
        services,
        memberships,
        global,
        log,
        links,
        service_key,
    })
}

/// The admitted links of a run with security: identities drawn from the seed for the service
/// (shared by its replicas) and each of `n` nodes, all nodes on the allow list, and each node's
/// Noise session with each of the `replicas` set up before time zero (the real handshake,
/// carried directly, as the bootstrap carries the joins). Hellos are resent every sixth of
/// `detection`, as heartbeats are. The first replica's datagram keys go on from `keys` (the
/// bootstrap's generator), the others' from their own.
#[allow(clippy::type_complexity)] // the three parts of the result, each used apart
fn admit(
    seed: u64,
    n: u32,
    replicas: u32,
    detection: Duration,
    keys: &fastrand::Rng,
) -> Result<(Vec<NodeLink>, Vec<SecureService>, Option<PublicKey>), String> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x4944_454e_5449_5459);
    let service = seeded_identity(&mut rng)?;
    let service_key = *service.public();
    let nodes: Vec<Identity> = (0..n)
        .map(|_| seeded_identity(&mut rng))
        .collect::<Result<_, _>>()?;
    let mut allowed = AllowList::new();
    for (i, id) in nodes.iter().enumerate() {
        allowed.insert(*id.public(), &format!("node{i}"));
    }
    let security = ServiceSecurity {
        identity: service,
        allowed,
    };
    let mut services: Vec<SecureService> = (0..u64::from(replicas.max(1)))
        .map(|k| {
            let link_seed = seed ^ 0x0053_4552_5649_4345 ^ (k << 40);
            let keys = if k == 0 {
                keys.clone()
            } else {
                fastrand::Rng::with_seed(link_seed ^ 0x4b45_5953)
            };
            SecureService::new(security.clone(), keys, link_seed)
        })
        .collect();
    let t0 = Time::ZERO;
    let mut links = Vec::with_capacity(n as usize);
    for (i, identity) in nodes.into_iter().enumerate() {
        let security = LinkSecurity {
            hello_interval: (detection / 6).max(Duration::from_millis(1)),
            ..LinkSecurity::new(identity, service_key)
        };
        let mut link = NodeLink::new(
            security,
            services.len(),
            seeded_entropy(seed ^ 0x4e4f_4445_0000_0000 ^ i as u64),
        );
        let me = NodeId(i as u32);
        for (k, svc) in services.iter_mut().enumerate() {
            // A heartbeat starts the handshake; the service drops it (the bootstrap is at
            // rest).
            link.send(t0, k, tidings_gms::frame(&GmsMessage::Heartbeat));
            for _ in 0..4 {
                while let Some((to, d)) = link.poll_transmit() {
                    if to != k {
                        continue;
                    }
                    if let Inbound::Reply(r) = svc.link.receive(me, &d) {
                        let _ = link.receive(t0, k, &r);
                    }
                }
            }
            if !link.is_up(k) {
                return Err(format!(
                    "node {i} was not admitted by replica {k}: {:?}",
                    link.refusal()
                ));
            }
        }
        links.push(link);
    }
    Ok((links, services, Some(service_key)))
}

/// Hands the GMS's messages to the clients and theirs back, directly and at time zero, until both
/// sides are quiet (the bootstrap's network).
fn exchange(gms: &mut Gms, clients: &mut [GmsClient], nonces: &BTreeMap<u64, NodeId>) {
    let t0 = Time::ZERO;
    loop {
        let mut progressed = false;
        while let Some(tx) = gms.poll_transmit() {
            progressed = true;
            let to = match tx.to {
                Peer::Node(g) => from_gms(g),
                Peer::Joiner(nonce) => nonces.get(&nonce).copied(),
            };
            if let Some(c) = to.and_then(|to| clients.get_mut(to.0 as usize)) {
                c.handle_message(t0, 0, tx.msg);
            }
        }
        for (i, c) in clients.iter_mut().enumerate() {
            while let Some((_replica, msg)) = c.poll_transmit() {
                progressed = true;
                gms.handle_message(t0, Peer::Node(to_gms(NodeId(i as u32))), msg);
            }
        }
        if !progressed {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn frames_are_told_apart_from_protocol_datagrams() {
        let msg = GmsMessage::Heartbeat;
        let bytes = wrap(NodeId(7), &tidings_gms::frame(&msg));
        let (from, datagram) = unwrap(&bytes).unwrap();
        assert_eq!(from, NodeId(7));
        let body = tidings_gms::unframe(datagram).unwrap();
        assert_eq!(GmsMessage::decode(body).unwrap(), msg);
        // Protocol datagrams start with "TD"; short or foreign bytes are not GMS frames.
        assert!(unwrap(b"TD\x01\x00\x00\x00\x00\x00").is_none());
        assert!(unwrap(b"GM\x01").is_none());
        assert_eq!(to_gms(NodeId(0)), NodeId(1));
        assert_eq!(from_gms(NodeId(1)), Some(NodeId(0)));
        assert_eq!(from_gms(NodeId(0)), None);
    }

    #[test]
    fn large_datagrams_travel_in_fragments_and_one_lost_fragment_loses_the_datagram() {
        let datagram: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let pieces = fragments(NodeId(3), 7, &datagram, 1472);
        assert_eq!(pieces.len(), 7);
        assert!(pieces.iter().all(|p| p.len() <= 1472));
        // In any order, once each (a repeated fragment changes nothing).
        let mut r = Reassembly::default();
        let mut order: Vec<usize> = (0..pieces.len()).rev().collect();
        order.insert(2, 5);
        let mut whole = None;
        for i in order {
            if let Some(d) = r.take(&pieces[i]) {
                whole = Some(d);
            }
        }
        assert_eq!(whole, Some(datagram.clone()));
        // One missing: nothing comes out, and the partial datagram is dropped in time.
        let mut r = Reassembly::default();
        for p in &pieces[1..] {
            assert_eq!(r.take(p), None);
        }
        for n in 0..REASSEMBLY_MAX as u32 {
            let other = fragments(NodeId(4), n, &datagram, 1472);
            assert_eq!(r.take(&other[0]), None);
        }
        assert!(r.partial.len() <= REASSEMBLY_MAX);
        // Malformed fragments are ignored.
        assert_eq!(r.take(b"GF"), None);
        let mut bad = pieces[0].clone();
        bad[10] = 9; // index past the count
        bad[12] = 2;
        assert_eq!(r.take(&bad), None);
    }

    #[test]
    fn bootstrap_matches_names_ids_and_subscriptions() {
        let t = TopicId;
        let subs = vec![
            vec![],
            vec![t(1), t(3)],
            vec![t(2), t(3)],
            vec![t(1), t(3)],
            vec![t(2)],
            vec![t(1), t(2), t(3)],
        ];
        let service = ServiceSetup {
            detection: Duration::from_millis(300),
            partition_size: 2,
            replicas: 1,
            waste_max_permille: 0,
            datagram_bytes: 1472,
            security: Mode::Off,
        };
        let b = bootstrap(9, &subs, 1, 4, &service).unwrap();
        assert_eq!(b.clients.len(), subs.len());
        let gms = b.services[0].gms();
        for i in 1..=4 {
            assert_eq!(gms.topic_id(&format!("t{i}")), Some(TopicId(i)));
        }
        // Every topic's members, as the sender sees them, are exactly its subscribers.
        let view = sender_view(&b.memberships[0]);
        for topic in 1..=3 {
            let want: Vec<NodeId> = (0..subs.len())
                .filter(|&i| subs[i].contains(&TopicId(topic)))
                .map(|i| NodeId(i as u32))
                .collect();
            let mut got: Vec<NodeId> = view
                .get(&TopicId(topic))
                .map(|m| m.iter().map(|&(n, _, _)| n).collect())
                .unwrap_or_default();
            got.sort_unstable();
            assert_eq!(got, want, "topic {topic}");
        }
        // A receiver knows only its own region; the sender knows all of them.
        assert_eq!(b.memberships[4].regions.len(), 1);
        assert_eq!(
            local_topics(&b.memberships[5], NodeId(5)),
            [t(1), t(2), t(3)].into_iter().collect()
        );
        assert_eq!(b.memberships[0].regions.len(), b.global.regions.len());
    }
}
