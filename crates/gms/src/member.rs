//! A node's control plane as one sans-IO state machine: the protocol node and, when the node
//! joined through the membership service, its client and everything between the two (install
//! by difference, named requests, suspicion reports, removal, leaving).
//!
//! The runtime's core thread and the simulator both drive exactly this type, so the install path
//! the seeded simulator checks is the one that ships. Before a node has its id (the protocol
//! node needs one), [`Joining`] runs the join handshake with the service, sans-IO as well, and
//! becomes the [`Member`]: a host only carries its datagrams and timeouts.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustc_hash::FxHashMap;
use tidings_proto::{
    Config, ConfigError as ProtoConfigError, Event, Membership, MembershipChange, MsgId, Node,
    PublishError, PublishRun, RegionView, Time, Transmit,
};
use tidings_seal::datagram::{COUNTER_LIMIT_DEFAULT, TRAILER_LEN};
use tidings_seal::{
    KeyError, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, OpenError, OpenStats, SealingKey,
};
use tidings_wire::{NodeId, RegionId, TopicId};

use crate::acl::{AclAction, TopicRefusal};
use crate::arena::BlockArena;
use crate::client::{ClientEvent, GmsClient, RequestError};
use crate::config::ClientConfig;
use crate::message::{GmsMessage, NAMES_PER_REQUEST_MAX};
use crate::secure::NodeLink;

/// The first bytes of every GMS datagram, in both directions: unlike the protocol's `"TD"`
/// header, so one socket can carry both. The last byte is the codec's version (4: a member
/// may tell where it serves its metrics, `Request::MetricsAt`); a node of another version is
/// not understood.
pub const GMS_MAGIC: [u8; 4] = *b"TGM\x04";

/// `msg` framed for the wire.
#[must_use]
pub fn frame(msg: &GmsMessage) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&GMS_MAGIC);
    msg.encode(&mut out);
    out
}

/// The body of a GMS datagram, or `None` if it is not one.
#[must_use]
pub fn unframe(datagram: &[u8]) -> Option<&[u8]> {
    datagram.strip_prefix(&GMS_MAGIC)
}

/// The next datagram for the service from `client`: framed, and sealed when the node has an
/// admitted link (which also sends its own handshake datagrams first), with the replica's index.
/// Counts each one in `sent`.
fn next_gms_datagram(
    now: Time,
    client: &mut GmsClient,
    secure: Option<&mut NodeLink>,
    sent: &mut u64,
) -> Option<(usize, Vec<u8>)> {
    let Some(link) = secure else {
        let (replica, msg) = client.poll_transmit()?;
        *sent += 1;
        return Some((replica, frame(&msg)));
    };
    loop {
        if let Some(out) = link.poll_transmit() {
            *sent += 1;
            return Some(out);
        }
        let (replica, msg) = client.poll_transmit()?;
        link.send(now, replica, frame(&msg));
    }
}

/// Settings of a [`Member`] beyond the protocol's and the client's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    /// Least time between two reports of one suspected node to the service: a ring keeps
    /// suspecting a dead neighbour every token timeout until the view drops it. Default 500 ms.
    pub suspect_interval: Duration,
    /// How long a leave waits for the service's confirmation before the member counts itself
    /// gone. Default 1 s.
    pub leave_timeout: Duration,
    /// A region that has not acknowledged a message of this node for this long is reported
    /// stalled ([`MemberEvent::Stalled`]): the publisher learns whom it waits for instead of
    /// waiting silently. Checked four times per period while messages are unstable. Default
    /// 5 s, longer than a failure detection and a view change (3 s and a few token rounds by
    /// default), so a crash the service handles is not reported.
    pub stall_after: Duration,
    /// How protocol datagrams are sealed and opened: the mode (`mode: Off`, the default,
    /// seals nothing), the AEAD and the key ring's limits. With any other mode every datagram
    /// the protocol writes is sealed with the service's current key of the region its header
    /// names ([`Item::RegionKey`](crate::Item::RegionKey)) and every one received must open
    /// under a key of its header's region the service handed out, or it is dropped and counted
    /// by cause ([`MemberStats::open`]). The protocol's `max_datagram_bytes` shrinks by the trailer
    /// ([`TRAILER_LEN`]), so sealed datagrams keep the configured size on the wire.
    pub sealing: KeyRingConfig,
    /// How long the previous datagram key still opens datagrams after a new one arrives:
    /// members get a new key at slightly different times, and datagrams sealed just before
    /// are still in flight or queued for retransmission. Default 2 s; a removed member's key
    /// stops working this long after the others got the next one.
    pub key_grace: Duration,
    /// Datagrams this member may seal under one key ([`COUNTER_LIMIT_DEFAULT`], 2^32, the
    /// nonce argument of ADR 40). At three quarters of it the member asks the service for a
    /// new key ([`Request::RenewDatagramKey`](crate::message::Request::RenewDatagramKey));
    /// at the limit it drops what it cannot seal until the key comes. At least 4.
    pub key_counter_limit: u64,
}

impl Default for MemberConfig {
    fn default() -> MemberConfig {
        MemberConfig {
            suspect_interval: Duration::from_millis(500),
            leave_timeout: Duration::from_secs(1),
            stall_after: Duration::from_secs(5),
            sealing: KeyRingConfig {
                mode: Mode::Off,
                ..KeyRingConfig::default()
            },
            key_grace: Duration::from_secs(2),
            key_counter_limit: COUNTER_LIMIT_DEFAULT,
        }
    }
}

impl MemberConfig {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), MemberError> {
        if self.stall_after < Duration::from_millis(4) {
            return Err(MemberError::Config(
                "stall_after must be at least 4 ms".to_owned(),
            ));
        }
        self.sealing
            .validate()
            .map_err(|e| MemberError::Config(format!("sealing: {e}")))?;
        if self.key_counter_limit < 4 {
            return Err(MemberError::Config(format!(
                "key_counter_limit = {} must be at least 4",
                self.key_counter_limit
            )));
        }
        Ok(())
    }

    /// `protocol` with its datagram budget reduced by the sealing trailer when sealing is on,
    /// so a sealed datagram is no longer on the wire than the configuration says.
    fn sealed_protocol(&self, mut protocol: Config) -> Result<Config, MemberError> {
        let overhead = self.sealing.mode.overhead();
        protocol.max_datagram_bytes = protocol
            .max_datagram_bytes
            .checked_sub(overhead)
            .ok_or_else(|| {
                MemberError::Config("max_datagram_bytes is shorter than the sealing trailer".into())
            })?;
        Ok(protocol)
    }
}

/// A received datagram as the host holds it. Sealing opens a datagram in place, so a host that
/// can open it where it received it ([`Member::open_received`], then
/// [`ReceivedDatagram::Opened`]) or hand over bytes nobody else holds
/// ([`ReceivedDatagram::Writable`]) spares the member a copy.
#[derive(Debug)]
pub enum ReceivedDatagram {
    /// Bytes that may be shared with other datagrams (a slice of a receive buffer): opened in
    /// place if nobody else holds them after all, else copied first.
    Shared(Bytes),
    /// Bytes only this datagram holds: opened where they are.
    Writable(BytesMut),
    /// A protocol datagram the host already opened with [`Member::open_received`] (its length
    /// as that returned): handed to the protocol as it is. Anything else handed over this way
    /// reaches the protocol unauthenticated.
    Opened(Bytes),
}

impl ReceivedDatagram {
    /// The datagram as shared bytes, as the protocol takes it.
    fn into_bytes(self) -> Bytes {
        match self {
            ReceivedDatagram::Shared(bytes) | ReceivedDatagram::Opened(bytes) => bytes,
            ReceivedDatagram::Writable(bytes) => bytes.freeze(),
        }
    }
}

impl std::ops::Deref for ReceivedDatagram {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ReceivedDatagram::Shared(bytes) | ReceivedDatagram::Opened(bytes) => bytes,
            ReceivedDatagram::Writable(bytes) => bytes,
        }
    }
}

impl From<Bytes> for ReceivedDatagram {
    fn from(bytes: Bytes) -> ReceivedDatagram {
        ReceivedDatagram::Shared(bytes)
    }
}

impl From<BytesMut> for ReceivedDatagram {
    fn from(bytes: BytesMut) -> ReceivedDatagram {
        ReceivedDatagram::Writable(bytes)
    }
}

/// A member's sealing state, when [`MemberConfig::sealing`] is on: a key ring and a sealing
/// key per region whose key the service sent it (ADR 43).
struct Sealing {
    /// The rings' settings (validated when the member was made).
    config: KeyRingConfig,
    /// By region: one lookup per datagram, by the header's region (a cheap hash: the keys are
    /// the regions the service gave keys for, and a datagram's region only looks one up).
    regions: FxHashMap<RegionId, RegionSeal>,
    /// The earliest time a previous key or a gone region's keys must be retired (cached: the
    /// host asks for timeouts far more often than keys change).
    retire_at: Option<Time>,
    /// Where a received datagram whose buffer is shared is copied to be opened in place
    /// (blocks reused once every datagram cut from them is dropped).
    arena: BlockArena,
}

impl Sealing {
    /// The keys of `region`.
    fn region_mut(&mut self, region: RegionId) -> Option<&mut RegionSeal> {
        self.regions.get_mut(&region)
    }

    /// Recomputes [`Sealing::retire_at`] after a change of keys.
    fn update_retire_at(&mut self) {
        self.retire_at = self
            .regions
            .values()
            .filter_map(RegionSeal::retire_at)
            .min();
    }
}

/// The keys of one region.
struct RegionSeal {
    ring: KeyRing,
    /// The key this node seals the region's datagrams with: the service's latest, under this
    /// node's id.
    key: Option<SealingKey>,
    /// That key's id and secret, to seal again under a new node id after a rejoin.
    secret: Option<(KeyId, KeySecret)>,
    /// Previous keys and when they stop opening datagrams.
    retiring: Vec<(KeyId, Time)>,
    /// The key whose renewal this member asked for (once per key).
    renewal_asked: Option<KeyId>,
    /// The service took the region's key away (its view went): the region's keys seal and
    /// open until then, for datagrams in flight, and are dropped at that time.
    gone_at: Option<Time>,
}

impl RegionSeal {
    /// When this region's next key must be retired, or the whole region dropped.
    fn retire_at(&self) -> Option<Time> {
        let next = self.retiring.iter().map(|&(_, at)| at).min();
        match (next, self.gone_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Opens `buf` in place with the ring of its header's region: the protocol datagram's length,
/// or `None` (counted in `stats`). The ring of the header's region: the header is clear, and
/// is associated data of the tag, so a datagram moved to another region does not open there
/// either.
fn open_sealed(sealing: &mut Sealing, stats: &mut OpenStats, buf: &mut [u8]) -> Option<usize> {
    let Some(region) = tidings_wire::peek_region(buf) else {
        stats.count(&Err(OpenError::Malformed));
        return None;
    };
    let Some(keys) = sealing.region_mut(region) else {
        let id = buf
            .len()
            .checked_sub(TRAILER_LEN)
            .and_then(|at| buf.get(at..at + 4))
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_be_bytes);
        stats.count(&Err(OpenError::UnknownKey(KeyId(id))));
        return None;
    };
    let opened = keys.ring.open(buf);
    stats.count(&opened);
    opened.ok().map(|o| o.len)
}

impl std::fmt::Debug for Sealing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut regions: Vec<(RegionId, Option<KeyId>)> = self
            .regions
            .iter()
            .map(|(&r, s)| (r, s.key.as_ref().map(SealingKey::id)))
            .collect();
        regions.sort();
        f.debug_struct("Sealing")
            .field("config", &self.config)
            .field("regions", &regions)
            .field("retire_at", &self.retire_at)
            .finish_non_exhaustive()
    }
}

/// A region that has not acknowledged a message of this node for longer than
/// [`MemberConfig::stall_after`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The region.
    pub region: RegionId,
    /// The oldest message it has not acknowledged.
    pub oldest: MsgId,
    /// How long that message has waited (since it was published).
    pub waited: Duration,
    /// The region's members in this node's view. Acknowledgements come for the region as a
    /// whole (its token ring gathers them), so these are whom the message waits for: one of
    /// them has not received it, or has not passed the token on.
    pub members: Vec<NodeId>,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "region {} has not acknowledged message {} for {:.1} s (waiting for members",
            self.region.0,
            self.oldest.0,
            self.waited.as_secs_f64()
        )?;
        for (i, n) in self.members.iter().enumerate() {
            write!(f, "{}{}", if i == 0 { " " } else { ", " }, n.0)?;
        }
        write!(f, ")")
    }
}

/// What a named request asks of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamedRequest {
    /// Receive the topic: answered once this node is in a region that carries it.
    Subscribe,
    /// Publish on the topic: answered once this node knows the topic's regions.
    Advertise,
}

/// An output of a [`Member`] other than datagrams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberEvent {
    /// An event of the protocol node (deliveries, stability, token rounds, suspicions). A
    /// suspicion has already been reported to the service.
    Protocol(Event),
    /// A membership was installed in the protocol node: the views of the `changed` regions
    /// (every region when `None`) and the node addresses may have changed. The host makes the
    /// install effective (routes, multicast groups) and reports any region it cannot receive
    /// with [`Member::set_unreachable`] before it polls the next event: the answers to waiting
    /// requests follow and take it into account.
    Installed {
        /// The regions whose views changed, or `None` for a whole new membership.
        changed: Option<Vec<RegionId>>,
    },
    /// The answer to a named request: the topic's id, or why it cannot be done.
    Answered {
        /// The token the host gave with the request.
        token: u64,
        /// The topic, or the reason for the refusal.
        result: Result<TopicId, NamedRefusal>,
    },
    /// The service bound a topic name this node asked for to an id.
    TopicBound {
        /// The name.
        name: String,
        /// Its id.
        topic: TopicId,
    },
    /// The service removed this node (declared failed while alive, or after a leave). Its
    /// waiting requests were refused; a node declared failed installs an empty membership.
    Removed,
    /// A leave is complete (confirmed by the service, or its timeout passed, or there was no
    /// service to leave): the host may stop.
    Left,
    /// A region has not acknowledged a message of this node for longer than
    /// [`MemberConfig::stall_after`]; reported once until it clears.
    Stalled(Stall),
    /// A region reported stalled has acknowledged what it waited for (or left this node's
    /// view).
    StallCleared {
        /// The region.
        region: RegionId,
        /// How long the oldest message it held back had waited when it cleared.
        waited: Duration,
    },
    /// The service no longer knew this node (it restarted without its state, or removed the
    /// node while alive) and the node joined again (`ClientConfig::rejoin`): its protocol node
    /// now runs under `new` and the service's `incarnation`, and its message ids go on from
    /// the old node's. Every protocol event of the old node came before this one. The old
    /// node's messages that were not stable are `abandoned`: never sent again (so no
    /// subscriber gets one twice, and each publisher's order holds for what is delivered),
    /// each reported here once instead of as stable. The subscriptions and advertisements
    /// are asked for again; each name bound anew is reported with
    /// [`TopicMoved`](MemberEvent::TopicMoved).
    Rejoined {
        /// The id the node had.
        old: NodeId,
        /// The id it has now.
        new: NodeId,
        /// The service's incarnation now.
        incarnation: u32,
        /// The old node's messages that were not stable, in order.
        abandoned: Vec<MsgId>,
    },
    /// After a [`Rejoined`](MemberEvent::Rejoined), a topic name this node had bound is bound
    /// again, to `new`: a host moves what it keeps under `old` (subscriptions, publishers'
    /// topics) to `new`. Comes before any delivery of `new`.
    TopicMoved {
        /// The name.
        name: String,
        /// Its id under the old incarnation.
        old: TopicId,
        /// Its id now.
        new: TopicId,
    },
}

/// Counters of a [`Member`]'s control plane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    /// GMS datagrams handed to the member.
    pub gms_datagrams_received: u64,
    /// GMS datagrams without the GMS framing (dropped).
    pub gms_unframed: u64,
    /// GMS datagrams produced.
    pub gms_datagrams_sent: u64,
    /// Memberships installed in the protocol node (whole or by difference).
    pub installs: u64,
    /// Suspicions reported to the service (after throttling).
    pub suspicions_reported: u64,
    /// Stalls reported ([`MemberEvent::Stalled`]).
    pub stalls_reported: u64,
    /// Rejoins followed: protocol nodes replaced under a new id ([`MemberEvent::Rejoined`]).
    pub rejoins: u64,
    /// Messages of replaced protocol nodes that were never stable, reported abandoned.
    pub messages_abandoned: u64,
    /// Protocol datagrams sealed ([`MemberConfig::sealing`]).
    pub datagrams_sealed: u64,
    /// Protocol datagrams the protocol wrote that could not be sealed (no key from the service
    /// yet, or the key's counter limit reached), dropped unsent; the protocol recovers them
    /// as it does lost ones.
    pub datagrams_unsealed_dropped: u64,
    /// Received datagrams opened and refused, by cause (bad tag, unknown key, retired key,
    /// replayed, too old ...): a refused datagram is dropped before the protocol sees it.
    pub open: OpenStats,
    /// Received datagrams copied before opening (the host handed them over shared).
    pub open_copies: u64,
    /// Blocks allocated for those copies (each reused once every datagram cut from it is
    /// dropped, so a steady flow stops allocating).
    pub open_blocks_allocated: u64,
    /// Region keys installed (from the service, or [`Member::install_region_key`]).
    pub keys_installed: u64,
    /// Previous keys retired after their grace ([`MemberConfig::key_grace`]).
    pub keys_retired: u64,
    /// New keys asked of the service because the one in use neared its counter limit
    /// ([`MemberConfig::key_counter_limit`]).
    pub key_renewals_asked: u64,
}

/// Why a named request was not done ([`MemberEvent::Answered`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamedRefusal {
    /// The service's access rules refused the topic (`GmsConfig::acl`).
    Topic(TopicRefusal),
    /// Any other reason (no service, the node was removed, an unreachable region, a bad
    /// name), in words.
    Other(String),
}

impl std::fmt::Display for NamedRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamedRefusal::Topic(r) => r.fmt(f),
            NamedRefusal::Other(why) => f.write_str(why),
        }
    }
}

impl From<String> for NamedRefusal {
    fn from(why: String) -> NamedRefusal {
        NamedRefusal::Other(why)
    }
}

/// A named request waiting for the service.
#[derive(Debug)]
struct Waiting {
    kind: NamedRequest,
    name: String,
    token: u64,
}

/// Named requests waiting for the service, indexed so that a change looks at the requests of the
/// topics it touched, not at every request (a node advertising 100,000 topics has as many
/// waiting, and every install would otherwise look each name up again).
#[derive(Debug, Default)]
struct WaitingRequests {
    /// By name, while the service has not bound the name to a topic id.
    unbound: HashMap<String, Vec<Waiting>>,
    /// By topic, bound but not yet in force at this node.
    bound: HashMap<TopicId, Vec<Waiting>>,
    /// Topics to look at at the next install besides those it changes: requests bound when
    /// made or since (answered at an install, as every request is, so that the service has
    /// taken the request in first).
    recheck: Vec<TopicId>,
}

impl WaitingRequests {
    fn add(&mut self, w: Waiting, client: &GmsClient) {
        match client.topic_id(&w.name) {
            Some(topic) => {
                self.bound.entry(topic).or_default().push(w);
                self.recheck.push(topic);
            }
            None => self.unbound.entry(w.name.clone()).or_default().push(w),
        }
    }

    fn bind(&mut self, name: &str, topic: TopicId) {
        if let Some(requests) = self.unbound.remove(name) {
            self.bound.entry(topic).or_default().extend(requests);
            self.recheck.push(topic);
        }
    }

    /// Takes the tokens of the requests of `kind` for `name` out (the service refused them).
    fn refuse(&mut self, name: &str, kind: NamedRequest, client: &GmsClient) -> Vec<u64> {
        let mut tokens = Vec::new();
        let mut take = |list: &mut Vec<Waiting>| {
            list.retain(|w| {
                let refused = w.kind == kind && w.name == name;
                if refused {
                    tokens.push(w.token);
                }
                !refused
            });
            list.is_empty()
        };
        if self.unbound.get_mut(name).is_some_and(&mut take) {
            self.unbound.remove(name);
        }
        if let Some(topic) = client.topic_id(name) {
            if self.bound.get_mut(&topic).is_some_and(&mut take) {
                self.bound.remove(&topic);
            }
        }
        tokens
    }

    fn drain(&mut self) -> impl Iterator<Item = Waiting> + '_ {
        self.unbound
            .drain()
            .flat_map(|(_, w)| w)
            .chain(self.bound.drain().flat_map(|(_, w)| w))
    }
}

/// The client and what the member keeps about the service.
#[derive(Debug)]
struct Link {
    client: GmsClient,
    waiting: WaitingRequests,
    /// Names of the topics this node subscribed to by name, to unsubscribe.
    names: HashMap<TopicId, String>,
    /// Names whose last local subscription was dropped since the outputs were last drained:
    /// unsubscribed together (one request and view change per 128 names, not one per topic).
    unsubscribing: Vec<String>,
    /// The client's committed batches when its change was last installed: one install per
    /// input, however many batches the input applied (ADR 23).
    installed_commits: u64,
    /// When each node was last reported.
    suspected: BTreeMap<NodeId, Time>,
    /// The leave was sent at this time.
    leaving_since: Option<Time>,
    removed: bool,
    /// The topic names bound by the service, to carry them over a rejoin.
    bound: HashMap<String, TopicId>,
    /// The client joins again (between [`ClientEvent::Rejoining`] and its welcome): the old
    /// protocol node runs on in its views, and nothing of the new id is installed.
    rejoining: bool,
    /// After a rejoin, the names bound under the old incarnation not yet bound again: their
    /// old id, and whether this node subscribed to it by name.
    moving: HashMap<String, (TopicId, bool)>,
}

impl Link {
    /// Sends the gathered unsubscriptions, in requests of up to [`NAMES_PER_REQUEST_MAX`] names.
    fn send_unsubscribes(&mut self) {
        for names in self.unsubscribing.chunks(NAMES_PER_REQUEST_MAX) {
            let _ = self.client.unsubscribe_many(names);
        }
        self.unsubscribing.clear();
    }

    fn deadline(&self, leave_timeout: Duration) -> Option<Time> {
        let leave = self
            .leaving_since
            .filter(|_| !self.removed)
            .map(|t| t + leave_timeout);
        match (self.client.poll_timeout(), leave) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// An event of the member's own, with its place among the protocol node's events.
#[derive(Debug)]
struct Queued {
    /// Comes after this many protocol events were taken (in total): those the node had
    /// produced when the event was made.
    after: u64,
    event: MemberEvent,
}

/// A node's control plane, sans-IO: the [`Node`] and, for a node that joined through the
/// membership service, its [`GmsClient`].
///
/// **Inputs:** [`handle_datagram`](Member::handle_datagram) and
/// [`handle_group_datagram`](Member::handle_group_datagram) (protocol datagrams),
/// [`handle_gms_datagram`](Member::handle_gms_datagram) (from the service; the host checks the
/// source), [`handle_timeout`](Member::handle_timeout), and commands: publishing, named requests,
/// [`unsubscribe`](Member::unsubscribe), [`leave`](Member::leave),
/// [`set_membership`](Member::set_membership) for a node without a service.
///
/// **Drain contract:** after an input (or a run of datagrams: events wait in order), the host
/// takes [`poll_event`](Member::poll_event) (or
/// [`take_protocol_events`](Member::take_protocol_events)) until `None` (acting on
/// [`MemberEvent::Installed`] before the next poll), then
/// [`poll_gms_transmit`](Member::poll_gms_transmit) and
/// [`poll_transmit`](Member::poll_transmit) until `None` (or its socket is full), then reads
/// [`poll_timeout`](Member::poll_timeout) and calls `handle_timeout` when it passes. Events come
/// in the order they happened: a delivery made before an install comes before its
/// [`MemberEvent::Installed`], one the install made (packets its views let in) after it. A host that cannot take a protocol event now (a full
/// subscription) may take the member's own events ahead of it with
/// [`poll_control_event`](Member::poll_control_event).
#[derive(Debug)]
pub struct Member {
    node: Node,
    config: MemberConfig,
    link: Option<Link>,
    /// The time of the latest input (suspicions found while events are polled are reported
    /// with it).
    now: Time,
    events: VecDeque<Queued>,
    /// Protocol events taken so far.
    node_events_taken: u64,
    /// `Installed` events queued and not yet taken: answers wait for the host to act on them.
    installs_queued: usize,
    /// Topics whose waiting requests may be answerable after the last install.
    touched: Vec<TopicId>,
    /// The region of each topic of the regions this node is a member of (a node is in at most
    /// one region per subset, and a topic in one subset).
    topic_regions_in: HashMap<TopicId, RegionId>,
    /// Regions the host cannot receive, with the reason.
    unreachable: BTreeMap<RegionId, String>,
    left: bool,
    /// The regions reported stalled, with their oldest unacknowledged message and its publish
    /// time (microseconds).
    stalls: BTreeMap<RegionId, (MsgId, u64)>,
    /// When stalls were last looked for.
    stalls_checked: Time,
    /// The admitted GMS link, when the node joined with an identity.
    secure: Option<NodeLink>,
    /// Sealing and opening of protocol datagrams, when [`MemberConfig::sealing`] is on.
    sealing: Option<Sealing>,
    stats: MemberStats,
}

/// Enters (`add`) or takes out the topics of `view` in `index`, if `me` is a member of it.
fn index_member_region(
    index: &mut HashMap<TopicId, RegionId>,
    me: NodeId,
    view: &RegionView,
    add: bool,
) {
    if view.partition_of(me).is_none() {
        return;
    }
    for &t in &view.topics {
        if add {
            index.insert(t, view.region);
        } else if index.get(&t) == Some(&view.region) {
            index.remove(&t);
        }
    }
}

/// A node joining through the membership service, before it has an id: it sends its join
/// until the service welcomes it, and keeps what the service sends meanwhile (the first
/// batches of its membership). Driven like a [`Member`]'s service side
/// ([`handle_gms_datagram`](Joining::handle_gms_datagram), [`handle_timeout`](Joining::handle_timeout)
/// in; [`poll_gms_transmit`](Joining::poll_gms_transmit), [`poll_timeout`](Joining::poll_timeout)
/// out, datagrams framed with [`GMS_MAGIC`]); once [`is_joined`](Joining::is_joined),
/// [`into_member`](Joining::into_member) gives the [`Member`]. Giving up (a join timeout) is
/// the host's: it knows its clock.
#[derive(Debug)]
pub struct Joining {
    protocol: Config,
    config: MemberConfig,
    client: GmsClient,
    /// The admitted link, when the node has an identity: every GMS datagram goes through it.
    secure: Option<NodeLink>,
    now: Time,
    stats: MemberStats,
}

impl Joining {
    /// A node that will join the service of `client` at its first
    /// [`handle_timeout`](Joining::handle_timeout). Fails if a configuration is invalid.
    pub fn new(
        protocol: Config,
        config: MemberConfig,
        client: ClientConfig,
    ) -> Result<Joining, MemberError> {
        config.validate()?;
        protocol.validate()?;
        let client = GmsClient::new(client).map_err(|e| MemberError::Config(e.to_string()))?;
        Ok(Joining {
            protocol,
            config,
            client,
            secure: None,
            now: Time::ZERO,
            stats: MemberStats::default(),
        })
    }

    /// Runs the GMS link through `link`: a Noise handshake with each replica before its first
    /// datagram, every datagram sealed after it, plain GMS datagrams refused.
    #[must_use]
    pub fn with_link(mut self, link: NodeLink) -> Joining {
        self.secure = Some(link);
        self
    }

    /// Why the service did not admit this node, if it said so (see [`NodeLink::refusal`]).
    #[must_use]
    pub fn link_refusal(&self) -> Option<&tidings_seal::LinkError> {
        self.secure.as_ref().and_then(NodeLink::refusal)
    }

    /// A datagram from replica `replica` of the membership service (framed with
    /// [`GMS_MAGIC`]; anything else is counted in [`MemberStats::gms_unframed`] and dropped).
    pub fn handle_gms_datagram(&mut self, now: Time, replica: usize, datagram: &[u8]) {
        self.now = self.now.max(now);
        self.stats.gms_datagrams_received += 1;
        let opened;
        let datagram = match self.secure.as_mut() {
            None => datagram,
            Some(link) => match link.receive(now, replica, datagram) {
                Some(plain) => {
                    opened = plain;
                    &opened[..]
                }
                None => return,
            },
        };
        match unframe(datagram) {
            Some(body) => self.client.handle_datagram(now, replica, body),
            None => self.stats.gms_unframed += 1,
        }
    }

    /// Time has passed: the join (and the link's hello) is sent again when due.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = self.now.max(now);
        if self.client.poll_timeout().is_some_and(|t| t <= now) {
            self.client.handle_timeout(now);
        }
        if let Some(link) = self.secure.as_mut() {
            if link.poll_timeout().is_some_and(|t| t <= now) {
                link.handle_timeout(now);
            }
        }
    }

    /// The next datagram for the service: the replica's index and the framed bytes (sealed
    /// when the link is admitted).
    pub fn poll_gms_transmit(&mut self) -> Option<(usize, Vec<u8>)> {
        next_gms_datagram(
            self.now,
            &mut self.client,
            self.secure.as_mut(),
            &mut self.stats.gms_datagrams_sent,
        )
    }

    /// The next time [`handle_timeout`](Joining::handle_timeout) must be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        earliest(
            self.client.poll_timeout(),
            self.secure.as_ref().and_then(NodeLink::poll_timeout),
        )
    }

    /// Whether the service welcomed this node (it has its id).
    #[must_use]
    pub fn is_joined(&self) -> bool {
        self.client.node().is_some()
    }

    /// The client's counters (joins sent, redirects, failovers...).
    #[must_use]
    pub fn client_stats(&self) -> &crate::ClientStats {
        self.client.stats()
    }

    /// The member, once [`is_joined`](Joining::is_joined): its protocol node has the id the
    /// service gave, its membership is what the service sent so far, and its counters include
    /// the handshake's datagrams. Fails with [`MemberError::NotJoined`] before that.
    pub fn into_member(self, now: Time) -> Result<Member, MemberError> {
        let Joining {
            protocol,
            config,
            client,
            secure,
            stats,
            ..
        } = self;
        let mut member = Member::joined(protocol, config, client, now)?;
        member.secure = secure;
        member.stats.gms_datagrams_received += stats.gms_datagrams_received;
        member.stats.gms_datagrams_sent += stats.gms_datagrams_sent;
        member.stats.gms_unframed += stats.gms_unframed;
        Ok(member)
    }
}

/// The earlier of two optional times.
fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Why named requests of a node without a service are refused.
const NO_SERVICE: &str = "this node did not join through a GMS";
/// Why named requests of a removed node are refused.
const REMOVED: &str = "the GMS removed this node";

impl Member {
    /// A member with a fixed membership and no service (memberships come from
    /// [`set_membership`](Member::set_membership)). Its first event is the
    /// [`MemberEvent::Installed`] of `membership`.
    pub fn with_membership(
        protocol: Config,
        config: MemberConfig,
        id: NodeId,
        membership: Membership,
        now: Time,
    ) -> Result<Member, MemberError> {
        config.validate()?;
        let protocol = config.sealed_protocol(protocol)?;
        let node = Node::new(protocol, id, membership, now)?;
        let mut member = Member::around(node, config, None, now)?;
        member.reindex();
        member.queue_installed(0, None);
        Ok(member)
    }

    /// A member of the service `client` joined (it has its id). What the client learned so far
    /// (the handshake's batches) is the initial membership; the topics of the regions this node
    /// is in are its subscriptions by name. Its first event is the [`MemberEvent::Installed`] of
    /// that membership. Fails with [`MemberError::NotJoined`] if the client
    /// has no id yet.
    pub fn joined(
        protocol: Config,
        config: MemberConfig,
        mut client: GmsClient,
        now: Time,
    ) -> Result<Member, MemberError> {
        config.validate()?;
        let protocol = config.sealed_protocol(protocol)?;
        let id = client.node().ok_or(MemberError::NotJoined)?;
        // Changes are taken from the client as differences from here on, not whole copies.
        client.set_membership_events(false);
        let mut bound = Vec::new();
        while let Some(e) = client.poll_event() {
            if let ClientEvent::TopicBound { name, topic } = e {
                bound.push((name, topic));
            }
        }
        let _ = client.take_change();
        // The membership carries the topics subscribed so far; later changes follow one by one.
        drop(client.take_subscription_changes());
        let membership = client.membership();
        let mut node = Node::new(protocol, id, membership, now).map_err(MemberError::Protocol)?;
        node.set_incarnation(client.incarnation());
        let installed_commits = client.commits();
        let link = Link {
            client,
            waiting: WaitingRequests::default(),
            names: HashMap::new(),
            unsubscribing: Vec::new(),
            installed_commits,
            suspected: BTreeMap::new(),
            leaving_since: None,
            removed: false,
            bound: bound.iter().cloned().collect(),
            rejoining: false,
            moving: HashMap::new(),
        };
        let mut member = Member::around(node, config, Some(link), now)?;
        member.take_region_keys(now);
        member.reindex();
        if let Some(link) = member.link.as_mut() {
            for (name, topic) in bound {
                if member.topic_regions_in.contains_key(&topic) {
                    link.names.insert(topic, name);
                }
            }
        }
        member.queue_installed(0, None);
        Ok(member)
    }

    /// Runs this member's GMS link through `link`, whose sessions a host set up before the
    /// member existed (the simulator admits its nodes before time zero, as it joins them):
    /// every GMS datagram is sealed in its session and every one received must open in it.
    /// A node that joins over the network gets its link from [`Joining::with_link`] instead.
    #[must_use]
    pub fn with_link(mut self, link: NodeLink) -> Member {
        self.secure = Some(link);
        self
    }

    fn around(
        node: Node,
        config: MemberConfig,
        link: Option<Link>,
        now: Time,
    ) -> Result<Member, MemberError> {
        let sealing = match config.sealing.mode {
            Mode::Off => None,
            _ => {
                config
                    .sealing
                    .validate()
                    .map_err(|e| MemberError::Config(format!("sealing: {e}")))?;
                Some(Sealing {
                    config: config.sealing.clone(),
                    regions: FxHashMap::default(),
                    retire_at: None,
                    arena: BlockArena::new(),
                })
            }
        };
        Ok(Member {
            sealing,
            node,
            config,
            link,
            now,
            events: VecDeque::new(),
            node_events_taken: 0,
            installs_queued: 0,
            touched: Vec::new(),
            topic_regions_in: HashMap::new(),
            unreachable: BTreeMap::new(),
            left: false,
            stalls: BTreeMap::new(),
            stalls_checked: now,
            secure: None,
            stats: MemberStats::default(),
        })
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    /// The protocol node (its membership, counters and configuration).
    #[must_use]
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The membership client, for a node that joined through the service.
    #[must_use]
    pub fn client(&self) -> Option<&GmsClient> {
        self.link.as_ref().map(|l| &l.client)
    }

    /// The control plane's counters.
    #[must_use]
    pub fn stats(&self) -> &MemberStats {
        &self.stats
    }

    /// Named requests waiting for the service: (not yet bound to an id, bound and not yet in
    /// force).
    #[must_use]
    pub fn requests_waiting(&self) -> (usize, usize) {
        self.link.as_ref().map_or((0, 0), |l| {
            (
                l.waiting.unbound.values().map(Vec::len).sum(),
                l.waiting.bound.values().map(Vec::len).sum(),
            )
        })
    }

    /// Whether the service removed this node.
    #[must_use]
    pub fn is_removed(&self) -> bool {
        self.link.as_ref().is_some_and(|l| l.removed)
    }

    /// Whether a leave is under way or complete.
    #[must_use]
    pub fn is_leaving(&self) -> bool {
        self.left
            || self
                .link
                .as_ref()
                .is_some_and(|l| l.leaving_since.is_some())
    }

    // ---- Inputs --------------------------------------------------------------------------

    /// A protocol datagram from a peer. With sealing on it is opened first (in place when
    /// its buffer is not shared): one that does not open is counted by cause in
    /// [`MemberStats::open`] and dropped before the protocol sees it.
    pub fn handle_datagram(&mut self, now: Time, datagram: impl Into<ReceivedDatagram>) {
        let datagram = datagram.into();
        self.now = now;
        if let Some(datagram) = self.open(datagram) {
            self.node.handle_datagram(now, datagram);
        }
    }

    /// A protocol datagram received on a multicast group (where regions may share the group),
    /// opened as in [`handle_datagram`](Member::handle_datagram).
    pub fn handle_group_datagram(&mut self, now: Time, datagram: impl Into<ReceivedDatagram>) {
        let datagram = datagram.into();
        self.now = now;
        if let Some(datagram) = self.open(datagram) {
            self.node.handle_group_datagram(now, datagram);
        }
    }

    /// The protocol datagram inside a received one: itself without sealing, opened with
    /// sealing, `None` (counted) if it does not open.
    fn open(&mut self, datagram: ReceivedDatagram) -> Option<Bytes> {
        let Some(sealing) = self.sealing.as_mut() else {
            return Some(datagram.into_bytes());
        };
        let mut buf = match datagram {
            ReceivedDatagram::Opened(bytes) => return Some(bytes),
            ReceivedDatagram::Writable(buf) => buf,
            ReceivedDatagram::Shared(shared) => match shared.try_into_mut() {
                Ok(buf) => buf,
                Err(shared) => {
                    self.stats.open_copies += 1;
                    let copy = sealing.arena.keep_mut(&shared);
                    self.stats.open_blocks_allocated = sealing.arena.blocks_allocated();
                    copy
                }
            },
        };
        let len = open_sealed(sealing, &mut self.stats.open, &mut buf)?;
        buf.truncate(len);
        Some(buf.freeze())
    }

    /// Opens a received protocol datagram in place, where the host received it: the length of
    /// the protocol datagram at the start of `buf`, to hand over as
    /// [`ReceivedDatagram::Opened`], or `None` if it does not open (counted by cause in
    /// [`MemberStats::open`]; drop it). Without sealing, `buf` as it is. For a host that
    /// receives into buffers it shares afterwards: opening before it shares them spares a copy
    /// per datagram.
    pub fn open_received(&mut self, buf: &mut [u8]) -> Option<usize> {
        match self.sealing.as_mut() {
            None => Some(buf.len()),
            Some(sealing) => open_sealed(sealing, &mut self.stats.open, buf),
        }
    }

    /// Installs key `id` of `region` with `secret`: this node seals the region's datagrams
    /// with it from now on, and the region's key it sealed with before keeps opening datagrams
    /// for [`MemberConfig::key_grace`]. The service's keys come by themselves (this is for a
    /// member without a service, whose host distributes keys, and for tests). Ignored with
    /// sealing off or when `id` is the region's key in use. A key id the region's ring knew
    /// before (a service that restarted without its state numbers keys afresh) starts the
    /// region's ring over with this key alone.
    pub fn install_region_key(&mut self, now: Time, region: RegionId, id: u32, secret: [u8; 32]) {
        let me = self.node.id().0;
        let grace = self.config.key_grace;
        let counter_limit = self.config.key_counter_limit;
        let Some(sealing) = self.sealing.as_mut() else {
            return;
        };
        let config = sealing.config.clone();
        let keys = match sealing.regions.entry(region) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let Ok(ring) = KeyRing::new(config.clone()) else {
                    return;
                };
                v.insert(RegionSeal {
                    ring,
                    key: None,
                    secret: None,
                    retiring: Vec::new(),
                    renewal_asked: None,
                    gone_at: None,
                })
            }
        };
        keys.gone_at = None;
        let id = KeyId(id);
        if keys.secret.as_ref().is_some_and(|(k, _)| *k == id) {
            sealing.update_retire_at();
            return;
        }
        let secret = KeySecret::from_bytes(secret);
        // Keep room for the new key: the oldest retiring keys go first.
        while keys.ring.len() + 1 > config.keys_max && !keys.retiring.is_empty() {
            let (old, _) = keys.retiring.remove(0);
            keys.ring.retire(old);
            self.stats.keys_retired += 1;
        }
        if let Err(KeyError::Installed(_) | KeyError::Retired(_) | KeyError::Full) =
            keys.ring.install(id, &secret)
        {
            let Ok(mut ring) = KeyRing::new(config.clone()) else {
                return;
            };
            if ring.install(id, &secret).is_err() {
                return;
            }
            keys.ring = ring;
            keys.retiring.clear();
            keys.key = None;
        }
        if let Some(old) = keys.key.take() {
            keys.retiring.push((old.id(), now + grace));
        }
        keys.key = Some(SealingKey::new(
            config.aead,
            config.mode,
            id,
            me,
            &secret,
            counter_limit,
        ));
        keys.secret = Some((id, secret));
        self.stats.keys_installed += 1;
        sealing.update_retire_at();
    }

    /// The service took `region`'s key away (this node no longer gets the region's view): its
    /// keys keep sealing and opening for [`MemberConfig::key_grace`], for the datagrams in
    /// flight, and are then dropped, so the region's datagrams are refused as `unknown_key`.
    pub fn drop_region_key(&mut self, now: Time, region: RegionId) {
        let grace = self.config.key_grace;
        let Some(sealing) = self.sealing.as_mut() else {
            return;
        };
        if let Some(keys) = sealing.regions.get_mut(&region) {
            keys.gone_at.get_or_insert(now + grace);
            sealing.update_retire_at();
        }
    }

    /// Installs the region keys the service sent since the last call, and drops those it took
    /// away.
    fn take_region_keys(&mut self, now: Time) {
        if self.sealing.is_none() {
            return;
        }
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let changes = link.client.take_key_changes();
        for region in changes {
            let key = self
                .link
                .as_ref()
                .and_then(|l| l.client.region_key(region))
                .map(|(id, secret)| (id, secret.0));
            match key {
                Some((id, secret)) => self.install_region_key(now, region, id, secret),
                None => self.drop_region_key(now, region),
            }
        }
    }

    /// Seals under this node's id again after the protocol node was replaced under a new id
    /// (a rejoin): the same keys, counters from 0 under the new sender.
    fn reseal(&mut self) {
        let me = self.node.id().0;
        let counter_limit = self.config.key_counter_limit;
        let Some(sealing) = self.sealing.as_mut() else {
            return;
        };
        let config = &sealing.config;
        for keys in sealing.regions.values_mut() {
            let Some((id, secret)) = keys.secret.as_ref() else {
                continue;
            };
            keys.key = Some(SealingKey::new(
                config.aead,
                config.mode,
                *id,
                me,
                secret,
                counter_limit,
            ));
        }
    }

    /// Whether this member seals and opens datagrams: a host then spares it a copy of each
    /// received datagram by opening it where it received it ([`Member::open_received`]).
    #[must_use]
    pub fn seals(&self) -> bool {
        self.sealing.is_some()
    }

    /// Bytes sealing adds to every protocol datagram (0 with sealing off): a transmit buffer
    /// must hold `max_datagram_bytes` of the protocol node plus these.
    #[must_use]
    pub fn datagram_overhead(&self) -> usize {
        self.sealing.as_ref().map_or(0, |_| TRAILER_LEN)
    }

    /// The id of the key this node seals `region`'s datagrams with, if sealing is on and the
    /// service sent it one.
    #[must_use]
    pub fn region_key_id(&self, region: RegionId) -> Option<u32> {
        self.sealing
            .as_ref()
            .and_then(|s| s.regions.get(&region))
            .and_then(|k| k.key.as_ref())
            .map(|k| k.id().0)
    }

    /// The newest key id this node seals with in any region (ids grow with every key the
    /// service makes), if sealing is on and it holds a key.
    #[must_use]
    pub fn datagram_key_id(&self) -> Option<u32> {
        self.sealing.as_ref().and_then(|s| {
            s.regions
                .values()
                .filter_map(|k| k.key.as_ref().map(|k| k.id().0))
                .max()
        })
    }

    /// The regions whose keys this node holds (sealing on), sorted.
    #[must_use]
    pub fn keyed_regions(&self) -> Vec<RegionId> {
        let mut v: Vec<RegionId> = self
            .sealing
            .as_ref()
            .map(|s| s.regions.keys().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Retires the previous keys whose grace has passed, and drops the regions whose key the
    /// service took away once theirs has.
    fn retire_keys(&mut self, now: Time) {
        let Some(sealing) = self.sealing.as_mut() else {
            return;
        };
        let retired = &mut self.stats.keys_retired;
        sealing.regions.retain(|_, keys| {
            if keys.gone_at.is_some_and(|at| at <= now) {
                *retired += (keys.retiring.len() + usize::from(keys.key.is_some())) as u64;
                return false;
            }
            let ring = &mut keys.ring;
            keys.retiring.retain(|&(id, at)| {
                if at > now {
                    return true;
                }
                ring.retire(id);
                *retired += 1;
                false
            });
            true
        });
        sealing.update_retire_at();
    }

    /// When the next previous key must be retired, or a gone region's keys dropped.
    fn retire_at(&self) -> Option<Time> {
        self.sealing.as_ref().and_then(|s| s.retire_at)
    }

    /// A datagram from replica `replica` of the membership service (0 when it has one),
    /// framed ([`frame`]); the host has checked that it comes from that replica's address.
    /// Datagrams without the framing, or for a node without a service, are counted and dropped.
    pub fn handle_gms_datagram(&mut self, now: Time, replica: usize, datagram: &[u8]) {
        self.handle_gms_datagrams(now, [(replica, datagram)]);
    }

    /// Several datagrams from the membership service, as
    /// [`handle_gms_datagram`](Member::handle_gms_datagram) but with one install for all the
    /// batches they commit.
    pub fn handle_gms_datagrams<'a>(
        &mut self,
        now: Time,
        datagrams: impl IntoIterator<Item = (usize, &'a [u8])>,
    ) {
        self.now = now;
        for (replica, datagram) in datagrams {
            self.stats.gms_datagrams_received += 1;
            let opened;
            let datagram = match self.secure.as_mut() {
                None => datagram,
                Some(link) => match link.receive(now, replica, datagram) {
                    Some(plain) => {
                        opened = plain;
                        &opened[..]
                    }
                    None => continue,
                },
            };
            match (self.link.as_mut(), unframe(datagram)) {
                (Some(link), Some(body)) => link.client.handle_datagram(now, replica, body),
                _ => self.stats.gms_unframed += 1,
            }
        }
        self.take_region_keys(now);
        self.pump(now);
    }

    /// Time has passed: the protocol's timers, the client's (joins, heartbeats, resends) and a
    /// leave's timeout, whichever are due.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = now;
        if self.node.poll_timeout().is_some_and(|(t, _)| t <= now) {
            self.node.handle_timeout(now);
        }
        if self.stall_check_at().is_some_and(|t| t <= now) {
            self.check_stalls(now);
        }
        if self.retire_at().is_some_and(|t| t <= now) {
            self.retire_keys(now);
        }
        if let Some(secure) = self.secure.as_mut() {
            if secure.poll_timeout().is_some_and(|t| t <= now) {
                secure.handle_timeout(now);
            }
        }
        let leave_timeout = self.config.leave_timeout;
        if self
            .link
            .as_ref()
            .and_then(|l| l.deadline(leave_timeout))
            .is_some_and(|t| t <= now)
        {
            self.pump(now);
        }
    }

    /// Whether the protocol would take a message of `len` bytes on `topic` now.
    #[must_use]
    pub fn can_publish(&self, topic: TopicId, len: usize) -> bool {
        self.node.can_publish(topic, len)
    }

    /// Holds `topic` back at this node ([`Node::hold_topic`]): for a host whose subscription to
    /// it is full. The streams that carry it stop at their next message of it; the others go on.
    pub fn hold_topic(&mut self, topic: TopicId) {
        self.node.hold_topic(topic);
    }

    /// Releases a held topic ([`Node::release_topic`]): what its streams held comes out as
    /// protocol events, in order.
    pub fn release_topic(&mut self, now: Time, topic: TopicId) {
        self.now = now;
        self.node.release_topic(now, topic);
    }

    /// Holds every topic of `topics` back at once ([`Node::hold_topics`]): for a host whose
    /// one delivery task for them all is full.
    pub fn hold_topics(&mut self, topics: &[TopicId]) {
        self.node.hold_topics(topics);
    }

    /// Releases every held topic of `topics` (sorted) at once ([`Node::release_topics`]).
    pub fn release_topics(&mut self, now: Time, topics: &[TopicId]) {
        self.now = now;
        self.node.release_topics(now, topics);
    }

    /// Publishes on `topic` ([`Node::publish`]).
    pub fn publish(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, PublishError> {
        self.now = now;
        self.node.publish(now, topic, payload)
    }

    /// Publishes on `topic`, giving the payload back when refused
    /// ([`Node::publish_or_return`]).
    pub fn publish_or_return(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, (PublishError, Bytes)> {
        self.now = now;
        self.node.publish_or_return(now, topic, payload)
    }

    /// Starts a run of publishes ([`Node::publish_run`]), all at `now`.
    pub fn publish_run(&mut self, now: Time) -> PublishRun<'_> {
        self.now = now;
        self.node.publish_run()
    }

    /// Installs a whole membership, for a node without a service (a node that has one takes its
    /// memberships from it).
    pub fn set_membership(&mut self, now: Time, membership: Membership) {
        self.now = now;
        let after = self.events_made();
        self.node.set_membership(now, membership);
        self.reindex();
        self.queue_installed(after, None);
    }

    /// Asks the service for the topics of `names`, each with a token that its
    /// [`MemberEvent::Answered`] carries back. Requests are sent in batches of up to
    /// [`NAMES_PER_REQUEST_MAX`] names; each is answered once its topic is in force (or refused
    /// with the reason).
    pub fn request_named(&mut self, now: Time, kind: NamedRequest, names: Vec<(u64, String)>) {
        self.now = now;
        let why = match self.link.as_mut() {
            None => NO_SERVICE,
            Some(link) if link.removed => REMOVED,
            Some(link) => {
                // Requests keep their order: unsubscriptions gathered before go first (a
                // subscription to a topic just left, for one).
                link.send_unsubscribes();
                let mut names = names.into_iter().peekable();
                while names.peek().is_some() {
                    let batch: Vec<(u64, String)> =
                        names.by_ref().take(NAMES_PER_REQUEST_MAX).collect();
                    let sent = Self::send_named(&mut link.client, kind, &batch);
                    for (token, name) in batch {
                        match &sent {
                            Ok(()) => link
                                .waiting
                                .add(Waiting { kind, name, token }, &link.client),
                            Err(e) => self.events.push_back(Queued {
                                after: self.node_events_taken + self.node.close_events() as u64,
                                event: MemberEvent::Answered {
                                    token,
                                    result: Err(e.to_string().into()),
                                },
                            }),
                        }
                    }
                }
                self.pump(now);
                return;
            }
        };
        for (token, _) in names {
            self.push_event(MemberEvent::Answered {
                token,
                result: Err(why.to_owned().into()),
            });
        }
    }

    fn send_named(
        client: &mut GmsClient,
        kind: NamedRequest,
        batch: &[(u64, String)],
    ) -> Result<(), RequestError> {
        match (kind, batch) {
            (NamedRequest::Subscribe, [(_, name)]) => client.subscribe(name),
            (NamedRequest::Advertise, [(_, name)]) => client.advertise(name),
            _ => {
                let names: Vec<String> = batch.iter().map(|(_, n)| n.clone()).collect();
                match kind {
                    NamedRequest::Subscribe => client.subscribe_many(&names),
                    NamedRequest::Advertise => client.advertise_many(&names),
                }
            }
        }
    }

    /// The last local subscription of `topic` is gone: the service is told, together with the
    /// other unsubscriptions made before the outputs are next drained. Topics not subscribed
    /// by name are ignored.
    pub fn unsubscribe(&mut self, topic: TopicId) {
        if let Some(link) = self.link.as_mut() {
            if let Some(name) = link.names.remove(&topic) {
                link.unsubscribing.push(name);
            }
        }
    }

    /// Tells the service where this node serves its metrics (`None`: nowhere), so that
    /// operators' tools find it through the service (and again after a rejoin). Without a
    /// service, or once removed, there is no one to tell and nothing happens.
    pub fn announce_metrics(&mut self, now: Time, addr: Option<std::net::SocketAddr>) {
        self.now = now;
        if let Some(link) = self.link.as_mut().filter(|l| !l.removed) {
            // A full request queue refuses it: the service then does not list the endpoint.
            let _ = link.client.announce_metrics(addr);
            self.pump(now);
        }
    }

    /// Leaves the group: the service is told, so that the others' views drop this node at once
    /// rather than after a failure timeout. [`MemberEvent::Left`] follows when the service
    /// confirms, when [`MemberConfig::leave_timeout`] passes, or at once without a service.
    pub fn leave(&mut self, now: Time) {
        self.now = now;
        match self.link.as_mut() {
            Some(link) if !link.removed && link.leaving_since.is_none() => {
                link.send_unsubscribes();
                if link.client.leave().is_ok() {
                    link.leaving_since = Some(now);
                    self.pump(now);
                } else {
                    self.push_left();
                }
            }
            Some(link) if link.leaving_since.is_some() => {}
            _ => self.push_left(),
        }
    }

    /// Regions the host cannot receive (a multicast group it could not join), with the reason:
    /// subscriptions their topics would answer are refused with it (and withdrawn from the
    /// service, so that nobody waits for this node's acknowledgements). Replaces the set before.
    pub fn set_unreachable(&mut self, regions: BTreeMap<RegionId, String>) {
        self.unreachable = regions;
    }

    // ---- Outputs -------------------------------------------------------------------------

    /// The next event, in the order they happened (see the drain contract).
    pub fn poll_event(&mut self) -> Option<MemberEvent> {
        if self.installs_queued == 0 && !self.touched.is_empty() {
            self.answer_waiting();
        }
        if let Some(q) = self.events.front() {
            if q.after <= self.node_events_taken {
                return self.pop_own();
            }
        }
        match self.node.poll_event() {
            Some(e) => {
                self.node_events_taken += 1;
                if let Event::Suspect { node, .. } = e {
                    self.report_suspect(node);
                }
                Some(MemberEvent::Protocol(e))
            }
            // Counted ahead of protocol events that were never taken: nothing is behind it.
            None => self.pop_own(),
        }
    }

    /// Moves the protocol events that come before the member's next own event to the back of
    /// `into`, in order, and returns how many: what [`poll_event`](Self::poll_event) would
    /// return one by one as [`MemberEvent::Protocol`] until its next own event (which
    /// `poll_event` returns next). Suspicions among them are reported as `poll_event` reports
    /// them.
    pub fn take_protocol_events(&mut self, into: &mut VecDeque<Event>) -> usize {
        if self.installs_queued == 0 && !self.touched.is_empty() {
            self.answer_waiting();
        }
        let before_own = self.events.front().map_or(usize::MAX, |q| {
            usize::try_from(q.after.saturating_sub(self.node_events_taken)).unwrap_or(usize::MAX)
        });
        let start = into.len();
        let n = self.node.take_events(into, before_own);
        self.node_events_taken += n as u64;
        for e in into.range(start..) {
            if let Event::Suspect { node, .. } = *e {
                self.report_suspect(node);
            }
        }
        n
    }

    /// The member's own next event (installs, answers, removal), ahead of protocol events made
    /// before it that the host has not taken.
    pub fn poll_control_event(&mut self) -> Option<MemberEvent> {
        if self.installs_queued == 0 && !self.touched.is_empty() {
            self.answer_waiting();
        }
        self.pop_own()
    }

    fn pop_own(&mut self) -> Option<MemberEvent> {
        let q = self.events.pop_front()?;
        if matches!(q.event, MemberEvent::Installed { .. }) {
            self.installs_queued -= 1;
        }
        Some(q.event)
    }

    /// The next datagram for the membership service, framed, with the index of the replica it
    /// goes to (0: the only one).
    pub fn poll_gms_transmit(&mut self) -> Option<(usize, Vec<u8>)> {
        let link = self.link.as_mut()?;
        if !link.unsubscribing.is_empty() {
            link.send_unsubscribes();
            for (topic, subscribed) in link.client.take_subscription_changes() {
                self.node.set_subscribed(topic, subscribed);
            }
        }
        if link.client.poll_timeout().is_some_and(|t| t <= self.now) {
            link.client.handle_timeout(self.now);
        }
        next_gms_datagram(
            self.now,
            &mut link.client,
            self.secure.as_mut(),
            &mut self.stats.gms_datagrams_sent,
        )
    }

    /// The admitted GMS link's counters, when the node joined with an identity.
    #[must_use]
    pub fn link_stats(&self) -> Option<&crate::secure::NodeLinkStats> {
        self.secure.as_ref().map(NodeLink::stats)
    }

    /// The next protocol datagram, written into `buf` ([`Node::poll_transmit`]) and, with
    /// sealing on, sealed in place: `buf` must hold the protocol node's `max_datagram_bytes`
    /// plus [`datagram_overhead`](Member::datagram_overhead), or it is refused. A datagram
    /// that cannot be sealed (no key yet) is dropped and counted, and the next one taken.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, tidings_proto::BufferTooSmall> {
        let Some(sealing) = self.sealing.as_mut() else {
            return self.node.poll_transmit(now, buf);
        };
        let needed = self.node.config().max_datagram_bytes + TRAILER_LEN;
        if buf.len() < needed {
            return Err(tidings_proto::BufferTooSmall {
                len: buf.len(),
                needed,
            });
        }
        loop {
            let Some(mut t) = self.node.poll_transmit(now, buf)? else {
                return Ok(None);
            };
            // Sealed under the key of the header's region.
            let keys = tidings_wire::peek_region(&buf[..t.len]).and_then(|r| sealing.region_mut(r));
            let Some(keys) = keys else {
                self.stats.datagrams_unsealed_dropped += 1;
                continue;
            };
            match keys.key.as_mut().map(|k| k.seal(buf, t.len)) {
                Some(Ok(len)) => {
                    t.len = len;
                    self.stats.datagrams_sealed += 1;
                    let worn = keys
                        .key
                        .as_ref()
                        .filter(|k| k.needs_rotation())
                        .map(SealingKey::id)
                        .filter(|id| keys.renewal_asked != Some(*id));
                    if let (Some(id), Some(link)) = (worn, self.link.as_mut()) {
                        if link.client.renew_datagram_key(id.0).is_ok() {
                            keys.renewal_asked = Some(id);
                            self.stats.key_renewals_asked += 1;
                        }
                    }
                    return Ok(Some(t));
                }
                _ => self.stats.datagrams_unsealed_dropped += 1,
            }
        }
    }

    /// The next time [`handle_timeout`](Member::handle_timeout) must be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let link = self
            .link
            .as_ref()
            .and_then(|l| l.deadline(self.config.leave_timeout));
        let secure = self.secure.as_ref().and_then(NodeLink::poll_timeout);
        earliest(
            earliest(self.node.poll_timeout().map(|(at, _)| at), link),
            earliest(earliest(self.stall_check_at(), secure), self.retire_at()),
        )
    }

    /// The stall check's next time, while messages are unstable or a stall is reported.
    fn stall_check_at(&self) -> Option<Time> {
        (self.node.stats().unstable_msgs_current > 0 || !self.stalls.is_empty())
            .then(|| self.stalls_checked + self.config.stall_after / 4)
    }

    /// Reports the regions whose oldest unacknowledged message has waited `stall_after`, and
    /// the reported ones that cleared.
    fn check_stalls(&mut self, now: Time) {
        self.stalls_checked = now;
        let now_us = now.as_micros();
        let bound_us = self.config.stall_after.as_micros() as u64;
        let stalled: BTreeMap<RegionId, (MsgId, u64)> = self
            .node
            .oldest_unstable()
            .filter(|&(_, _, at)| now_us.saturating_sub(at) >= bound_us)
            .map(|(r, m, at)| (r, (m, at)))
            .collect();
        let cleared: Vec<(RegionId, u64)> = self
            .stalls
            .iter()
            .filter(|(r, _)| !stalled.contains_key(r))
            .map(|(&r, &(_, at))| (r, at))
            .collect();
        for (region, at) in cleared {
            self.stalls.remove(&region);
            self.push_event(MemberEvent::StallCleared {
                region,
                waited: Duration::from_micros(now_us.saturating_sub(at)),
            });
        }
        for (region, (oldest, at)) in stalled {
            if self.stalls.insert(region, (oldest, at)).is_some() {
                continue;
            }
            let members = self
                .node
                .membership()
                .regions
                .get(&region)
                .map(|v| v.members().collect())
                .unwrap_or_default();
            self.stats.stalls_reported += 1;
            self.push_event(MemberEvent::Stalled(Stall {
                region,
                oldest,
                waited: Duration::from_micros(now_us.saturating_sub(at)),
                members,
            }));
        }
    }

    // ---- The service ---------------------------------------------------------------------

    /// Runs the client's due timers and acts on what it learned: installs the batches it
    /// committed (one install for however many), binds names, handles removal and the end of a
    /// leave.
    fn pump(&mut self, now: Time) {
        let leave_timeout = self.config.leave_timeout;
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if link.client.poll_timeout().is_some_and(|t| t <= now) {
            link.client.handle_timeout(now);
        }
        let mut whole = None;
        let mut removed = false;
        let mut rejoined = None;
        let mut bound = Vec::new();
        let mut refused = Vec::new();
        while let Some(e) = link.client.poll_event() {
            match e {
                // Only if a host turned the events back on: installed whole.
                ClientEvent::Membership(m) => whole = Some(m),
                ClientEvent::TopicBound { name, topic } => {
                    link.waiting.bind(&name, topic);
                    link.bound.insert(name.clone(), topic);
                    bound.push((name, topic));
                }
                ClientEvent::Refused(r) => refused.push(r),
                ClientEvent::Removed => removed = true,
                // The old protocol node runs on in its views until the service welcomes the
                // node again; the requests waiting are asked again by name.
                ClientEvent::Rejoining { .. } => {
                    link.rejoining = true;
                    rejoined = None;
                    let waiting: Vec<Waiting> = link.waiting.drain().collect();
                    link.waiting = WaitingRequests::default();
                    for w in waiting {
                        link.waiting
                            .unbound
                            .entry(w.name.clone())
                            .or_default()
                            .push(w);
                    }
                }
                ClientEvent::Joined(new) if link.rejoining => rejoined = Some(new),
                ClientEvent::Joined(_) => {}
            }
        }
        // The topics this node delivers, before the views that carry them are installed: a
        // message a new view lets in is delivered, not filtered (approximate regions, ADR 34).
        // A rejoining client's changes are the old ids' end and the new ids' start: the new
        // protocol node takes the latter with its membership.
        for (topic, subscribed) in link.client.take_subscription_changes() {
            if !link.rejoining {
                self.node.set_subscribed(topic, subscribed);
            }
        }
        let moved = link.client.commits() != link.installed_commits;
        link.installed_commits = link.client.commits();
        // A removed member installs nothing more; a rejoining one nothing before its new
        // protocol node exists (the batches are for the new id).
        let change = moved
            .then(|| link.client.take_change())
            .filter(|_| !link.removed && !link.rejoining);
        if let Some(new) = rejoined {
            self.rebuild(now, new);
            self.reseal();
        }
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let mut moves = Vec::new();
        for (name, topic) in &bound {
            if let Some((old, subscribed)) = link.moving.remove(name) {
                if subscribed {
                    link.names.insert(*topic, name.clone());
                }
                moves.push(MemberEvent::TopicMoved {
                    name: name.clone(),
                    old,
                    new: *topic,
                });
            }
        }
        for event in moves {
            self.push_event(event);
        }
        for (name, topic) in bound {
            self.push_event(MemberEvent::TopicBound { name, topic });
        }
        for r in refused {
            let kind = match r.action {
                AclAction::Subscribe => NamedRequest::Subscribe,
                AclAction::Publish => NamedRequest::Advertise,
            };
            let Some(link) = self.link.as_mut() else {
                return;
            };
            for token in link.waiting.refuse(&r.topic, kind, &link.client) {
                self.push_event(MemberEvent::Answered {
                    token,
                    result: Err(NamedRefusal::Topic(r.clone())),
                });
            }
        }
        if let Some(m) = whole {
            self.install_whole(now, m);
        }
        if let Some(change) = change {
            // Also when no view changed: the batch may have brought a node's address (a new
            // publisher's), which the host's routes take at the install (ADR 23).
            self.install_change(now, change);
        }
        if removed {
            self.on_removed(now);
        }
        let Some(link) = self.link.as_ref() else {
            return;
        };
        let done = link.removed || link.leaving_since.is_some_and(|t| now >= t + leave_timeout);
        if link.leaving_since.is_some() && done && !self.left {
            self.push_left();
        }
    }

    /// Replaces the protocol node after a rejoin: the old node's pending events are queued in
    /// their places, its unstable messages reported abandoned, and a new node under `new` and
    /// the service's incarnation takes the client's membership, numbering its messages on
    /// from the old node's.
    fn rebuild(&mut self, now: Time, new: NodeId) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        link.rejoining = false;
        let incarnation = link.client.incarnation();
        drop(link.client.take_subscription_changes());
        let _ = link.client.take_change();
        link.installed_commits = link.client.commits();
        let membership = link.client.membership();
        let mut node = match Node::new(self.node.config().clone(), new, membership, now) {
            Ok(node) => node,
            // The configuration was valid for the old node: it is the same.
            Err(_) => return,
        };
        node.set_incarnation(incarnation);
        node.set_first_msg_id(self.node.next_msg_id());
        let subscribed_names = std::mem::take(&mut link.names);
        link.moving = std::mem::take(&mut link.bound)
            .into_iter()
            .map(|(name, old)| (name, (old, subscribed_names.contains_key(&old))))
            .collect();
        link.suspected.clear();
        let mut old = std::mem::replace(&mut self.node, node);
        let abandoned: Vec<MsgId> = (old.first_unstable().0..old.next_msg_id().0)
            .map(MsgId)
            .filter(|&m| !old.is_stable(m))
            .collect();
        // The old node's events not yet taken, each in its place among the member's own.
        let base = self.node_events_taken;
        let mut taken = 0u64;
        let mut merged = VecDeque::with_capacity(self.events.len() + old.events_pending());
        for q in std::mem::take(&mut self.events) {
            while q.after > base + taken {
                let Some(e) = old.poll_event() else {
                    break;
                };
                taken += 1;
                merged.push_back(Queued {
                    after: 0,
                    event: MemberEvent::Protocol(e),
                });
            }
            merged.push_back(Queued {
                after: 0,
                event: q.event,
            });
        }
        while let Some(e) = old.poll_event() {
            taken += 1;
            merged.push_back(Queued {
                after: 0,
                event: MemberEvent::Protocol(e),
            });
        }
        self.events = merged;
        self.node_events_taken = base + taken;
        let old_id = old.id();
        drop(old);
        for (region, (_, at)) in std::mem::take(&mut self.stalls) {
            self.push_event(MemberEvent::StallCleared {
                region,
                waited: Duration::from_micros(now.as_micros().saturating_sub(at)),
            });
        }
        self.touched.clear();
        self.unreachable.clear();
        self.stats.rejoins += 1;
        self.stats.messages_abandoned += abandoned.len() as u64;
        self.push_event(MemberEvent::Rejoined {
            old: old_id,
            new,
            incarnation,
            abandoned,
        });
        self.reindex();
        let after = self.events_made();
        self.queue_installed(after, None);
    }

    fn install_whole(&mut self, now: Time, membership: Membership) {
        let after = self.events_made();
        self.node.set_membership(now, membership);
        self.reindex();
        if let Some(link) = self.link.as_mut() {
            self.touched.append(&mut link.waiting.recheck);
            self.touched.extend(link.waiting.bound.keys().copied());
        }
        self.queue_installed(after, None);
    }

    /// Installs a change: the protocol and the index of this node's regions take the changed
    /// regions only, so an update costs what it changed, not a pass over every region (ADR 23).
    fn install_change(&mut self, now: Time, change: MembershipChange) {
        let me = self.node.id();
        let changed: Vec<RegionId> = change.regions.iter().map(|&(r, _)| r).collect();
        if let Some(link) = self.link.as_mut() {
            // The topics whose waiting requests may be answerable after this install: those
            // bound or requested since the last one, and those the install changes (a topic
            // comes in force through its region list, for publishers, or a view of a region
            // carrying it, for members).
            self.touched.append(&mut link.waiting.recheck);
        }
        self.touched
            .extend(change.topic_regions.iter().map(|&(t, _)| t));
        for (_, view) in &change.regions {
            self.touched
                .extend(view.iter().flat_map(|v| v.topics.iter().copied()));
        }
        for r in &changed {
            if let Some(old) = self.node.membership().regions.get(r) {
                index_member_region(&mut self.topic_regions_in, me, old, false);
            }
        }
        let after = self.events_made();
        self.node.update_membership(now, change);
        for r in &changed {
            if let Some(view) = self.node.membership().regions.get(r) {
                index_member_region(&mut self.topic_regions_in, me, view, true);
            }
        }
        #[cfg(debug_assertions)]
        {
            let mut anew = HashMap::new();
            for view in self.node.membership().regions.values() {
                index_member_region(&mut anew, me, view, true);
            }
            debug_assert_eq!(
                self.topic_regions_in, anew,
                "the index of this node's regions"
            );
            debug_assert!(self
                .link
                .as_ref()
                .is_none_or(|l| &l.client.membership() == self.node.membership()));
        }
        self.queue_installed(after, Some(changed));
    }

    fn reindex(&mut self) {
        let me = self.node.id();
        self.topic_regions_in.clear();
        for view in self.node.membership().regions.values() {
            index_member_region(&mut self.topic_regions_in, me, view, true);
        }
    }

    /// Protocol events made so far (taken or not): an event queued with this comes after them
    /// (they are closed: nothing that happens later is reported in them).
    fn events_made(&mut self) -> u64 {
        self.node_events_taken + self.node.close_events() as u64
    }

    /// Queues the [`MemberEvent::Installed`] of an install, after the protocol events made
    /// before the install began (`after`; those the install itself makes, such as deliveries of
    /// packets the new views let in, come after it); or, while one is queued and not taken, adds
    /// the regions to it: the host makes effective what changed since it last acted, at the
    /// membership the node holds then.
    fn queue_installed(&mut self, after: u64, changed: Option<Vec<RegionId>>) {
        self.stats.installs += 1;
        if self.installs_queued > 0 {
            let queued = self
                .events
                .iter_mut()
                .rev()
                .find_map(|q| match &mut q.event {
                    MemberEvent::Installed { changed } => Some(changed),
                    _ => None,
                });
            if let Some(queued) = queued {
                match (queued.as_mut(), changed) {
                    (Some(regions), Some(more)) => {
                        regions.extend(more);
                        regions.sort_unstable();
                        regions.dedup();
                    }
                    (_, None) => *queued = None,
                    (None, Some(_)) => {}
                }
                return;
            }
        }
        self.installs_queued += 1;
        self.events.push_back(Queued {
            after,
            event: MemberEvent::Installed { changed },
        });
    }

    /// Queues an event behind the protocol events made so far.
    fn push_event(&mut self, event: MemberEvent) {
        let after = self.events_made();
        self.events.push_back(Queued { after, event });
    }

    fn push_left(&mut self) {
        if !self.left {
            self.left = true;
            self.push_event(MemberEvent::Left);
        }
    }

    /// Answers the waiting requests of the touched topics that are now in force. Due at once:
    /// the answers go ahead of everything queued.
    fn answer_waiting(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        let Some(link) = self.link.as_mut() else {
            return;
        };
        touched.sort_unstable();
        touched.dedup();
        let mut answers = Vec::new();
        for topic in touched {
            let Some(requests) = link.waiting.bound.remove(&topic) else {
                continue;
            };
            let mut still = Vec::new();
            for w in requests {
                match w.kind {
                    NamedRequest::Subscribe => {
                        let mine = self.topic_regions_in.get(&topic).copied();
                        if let Some(why) = mine.and_then(|r| self.unreachable.get(&r)) {
                            // Its messages cannot reach this node: refused, and the service is
                            // told (so nobody waits for this node's acknowledgements).
                            let _ = link.client.unsubscribe(&w.name);
                            answers.push(MemberEvent::Answered {
                                token: w.token,
                                result: Err(
                                    format!("cannot subscribe to {:?}: {why}", w.name).into()
                                ),
                            });
                        } else if mine.is_some() {
                            answers.push(MemberEvent::Answered {
                                token: w.token,
                                result: Ok(topic),
                            });
                            link.names.insert(topic, w.name);
                        } else {
                            still.push(w);
                        }
                    }
                    NamedRequest::Advertise => {
                        if self.node.membership().topic_regions.contains_key(&topic) {
                            answers.push(MemberEvent::Answered {
                                token: w.token,
                                result: Ok(topic),
                            });
                        } else {
                            still.push(w);
                        }
                    }
                }
            }
            if !still.is_empty() {
                link.waiting.bound.insert(topic, still);
            }
        }
        let after = self.node_events_taken;
        for event in answers.into_iter().rev() {
            self.events.push_front(Queued { after, event });
        }
    }

    /// The service removed this node: its waiting requests are refused; a node declared failed
    /// while alive stops taking part rather than act on stale views.
    fn on_removed(&mut self, now: Time) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        link.removed = true;
        let refused: Vec<u64> = link.waiting.drain().map(|w| w.token).collect();
        let leaving = link.leaving_since.is_some();
        for token in refused {
            self.push_event(MemberEvent::Answered {
                token,
                result: Err(REMOVED.to_owned().into()),
            });
        }
        if !leaving {
            let after = self.events_made();
            self.node.set_membership(now, Membership::default());
            self.reindex();
            self.queue_installed(after, None);
        }
        self.push_event(MemberEvent::Removed);
    }

    /// Reports a ring neighbour the protocol suspects, at most once per `suspect_interval`.
    fn report_suspect(&mut self, node: NodeId) {
        let now = self.now;
        let interval = self.config.suspect_interval;
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if link.removed
            || link
                .suspected
                .get(&node)
                .is_some_and(|&t| now < t + interval)
        {
            return;
        }
        if link.client.suspect(node).is_ok() {
            link.suspected.insert(node, now);
            self.stats.suspicions_reported += 1;
        }
    }
}

/// Why a [`Member`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The client has not been welcomed by the service (it has no node id).
    #[error("the membership client has not joined yet")]
    NotJoined,
    /// The protocol's configuration is invalid.
    #[error(transparent)]
    Protocol(#[from] ProtoConfigError),
    /// A [`MemberConfig`] setting is invalid (the message names it).
    #[error("invalid member configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;

    use tidings_proto::Destination;

    use super::*;
    use crate::{ClientConfig, Gms, GmsConfig, Peer, RemoveCause};

    const T0: Time = Time::ZERO;

    /// The handshake, as the runtime carries it: `n` nodes join `gms` through [`Joining`]
    /// over `rounds` exchanges of framed datagrams, before their members exist (the service
    /// knows a joiner by the nonce of its `Join`, as a host does). Returns the joinings and
    /// the datagrams each sent.
    fn handshake(gms: &mut Gms, n: usize, rounds: usize) -> (Vec<Joining>, Vec<u64>) {
        handshake_with(gms, n, rounds, false)
    }

    /// [`handshake`], with the clients' `rejoin` as given.
    fn handshake_with(
        gms: &mut Gms,
        n: usize,
        rounds: usize,
        rejoin: bool,
    ) -> (Vec<Joining>, Vec<u64>) {
        handshake_configured(gms, n, rounds, rejoin, &MemberConfig::default())
    }

    fn handshake_configured(
        gms: &mut Gms,
        n: usize,
        rounds: usize,
        rejoin: bool,
        member: &MemberConfig,
    ) -> (Vec<Joining>, Vec<u64>) {
        let mut joinings: Vec<(Joining, Option<Peer>)> = (0..n)
            .map(|i| {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16));
                let client = ClientConfig {
                    seed: 40 + i as u64,
                    data_addr: Some(addr),
                    rejoin,
                    ..ClientConfig::default()
                };
                let j = Joining::new(Config::default(), member.clone(), client);
                (j.unwrap(), None)
            })
            .collect();
        let mut sent = vec![0; n];
        for _ in 0..rounds {
            for (i, (j, peer)) in joinings.iter_mut().enumerate() {
                j.handle_timeout(T0);
                while let Some((replica, datagram)) = j.poll_gms_transmit() {
                    assert_eq!(replica, 0);
                    sent[i] += 1;
                    let msg = GmsMessage::decode(unframe(&datagram).unwrap()).unwrap();
                    if let GmsMessage::Join { nonce, .. } = msg {
                        peer.get_or_insert(Peer::Joiner(nonce));
                    }
                    gms.handle_message(T0, peer.unwrap(), msg);
                }
            }
            while let Some(t) = gms.poll_transmit() {
                let Some((j, peer)) = joinings.iter_mut().find(|(_, p)| *p == Some(t.to)) else {
                    continue;
                };
                if let GmsMessage::Welcome { node, .. } = &t.msg {
                    *peer = Some(Peer::Node(*node));
                }
                j.handle_gms_datagram(T0, 0, &frame(&t.msg));
            }
        }
        (joinings.into_iter().map(|(j, _)| j).collect(), sent)
    }

    /// A service and members on a network that delivers at once, except to and from the members
    /// in `cut_from` / `cut_to` (by index).
    struct Group {
        now: Time,
        gms: Gms,
        members: Vec<Member>,
        events: Vec<Vec<MemberEvent>>,
        /// Messages from these members to the service are lost.
        cut_from: BTreeSet<usize>,
        /// Messages from the service to these members are lost.
        cut_to: BTreeSet<usize>,
        /// Requests the service applied (its command count) when last read.
        commands: u64,
    }

    impl Group {
        fn new(n: usize) -> Group {
            Group::with(n, false)
        }

        fn with(n: usize, rejoin: bool) -> Group {
            Group::with_gms(n, rejoin, GmsConfig::default())
        }

        fn with_gms(n: usize, rejoin: bool, config: GmsConfig) -> Group {
            Group::configured(n, rejoin, config, &MemberConfig::default())
        }

        fn configured(n: usize, rejoin: bool, config: GmsConfig, member: &MemberConfig) -> Group {
            let mut gms = Gms::new(config).unwrap();
            let (joinings, _) = handshake_configured(&mut gms, n, 10, rejoin, member);
            let members: Vec<Member> = joinings
                .into_iter()
                .map(|j| j.into_member(T0).unwrap())
                .collect();
            let mut g = Group {
                now: T0,
                gms,
                events: vec![Vec::new(); members.len()],
                members,
                cut_from: BTreeSet::new(),
                cut_to: BTreeSet::new(),
                commands: 0,
            };
            g.pump();
            g.commands = g.gms.stats().commands;
            g
        }

        fn index_of(&self, node: NodeId) -> Option<usize> {
            self.members.iter().position(|m| m.id() == node)
        }

        /// Exchanges messages until nothing moves.
        fn pump(&mut self) {
            for _ in 0..1_000 {
                let mut moved = false;
                for i in 0..self.members.len() {
                    while let Some(e) = self.members[i].poll_event() {
                        self.events[i].push(e);
                    }
                    while let Some((replica, datagram)) = self.members[i].poll_gms_transmit() {
                        assert_eq!(replica, 0);
                        moved = true;
                        if !self.cut_from.contains(&i) {
                            let body = unframe(&datagram).unwrap();
                            // A rejoining member joins by its nonce, as a joiner does.
                            let from = match GmsMessage::decode(body) {
                                Ok(GmsMessage::Join { nonce, .. }) => Peer::Joiner(nonce),
                                _ => Peer::Node(self.members[i].id()),
                            };
                            self.gms.handle_datagram(self.now, from, body);
                        }
                    }
                }
                while let Some(t) = self.gms.poll_transmit() {
                    moved = true;
                    let found = match t.to {
                        Peer::Node(node) => self.index_of(node),
                        Peer::Joiner(nonce) => self
                            .members
                            .iter()
                            .position(|m| m.client().is_some_and(|c| c.nonce() == nonce)),
                    };
                    let Some(i) = found else {
                        continue;
                    };
                    if !self.cut_to.contains(&i) {
                        self.members[i].handle_gms_datagram(self.now, 0, &frame(&t.msg));
                    }
                }
                while self.gms.poll_event().is_some() {}
                if !moved {
                    return;
                }
            }
            panic!("livelock");
        }

        fn advance(&mut self, by: Duration) {
            let end = self.now + by;
            while self.now < end {
                self.now = (self.now + Duration::from_millis(10)).min(end);
                for m in &mut self.members {
                    if m.poll_timeout().is_some_and(|t| t <= self.now) {
                        m.handle_timeout(self.now);
                    }
                }
                if self.gms.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.gms.handle_timeout(self.now);
                }
                self.pump();
            }
        }

        /// Commands the service applied since the last call.
        fn new_commands(&mut self) -> u64 {
            let now = self.gms.stats().commands;
            std::mem::replace(&mut self.commands, now).abs_diff(now)
        }

        fn take_events(&mut self, i: usize) -> Vec<MemberEvent> {
            std::mem::take(&mut self.events[i])
        }
    }

    /// Two members of one region on topic 1, sealing in `mode` with key 1 installed.
    fn sealed_pair(mode: Mode) -> Vec<Member> {
        let subs: BTreeMap<NodeId, Vec<TopicId>> =
            [(NodeId(1), vec![TopicId(1)]), (NodeId(2), vec![TopicId(1)])].into();
        let membership = Membership::from_subscriptions(&subs, 6);
        let config = sealed_config(mode);
        (1..=2)
            .map(|n| {
                let mut m = Member::with_membership(
                    Config::default(),
                    config.clone(),
                    NodeId(n),
                    membership.clone(),
                    T0,
                )
                .unwrap();
                install_everywhere(&mut m, T0, 1, [7; 32]);
                m
            })
            .collect()
    }

    /// A member configuration sealing in `mode`, with a 500 ms key grace.
    fn sealed_config(mode: Mode) -> MemberConfig {
        MemberConfig {
            sealing: KeyRingConfig {
                mode,
                ..KeyRingConfig::default()
            },
            key_grace: Duration::from_millis(500),
            ..MemberConfig::default()
        }
    }

    /// Installs key `id` with `secret` for every region `m` knows.
    fn install_everywhere(m: &mut Member, now: Time, id: u32, secret: [u8; 32]) {
        let regions: Vec<RegionId> = m.node().membership().regions.keys().copied().collect();
        assert!(!regions.is_empty());
        for r in regions {
            m.install_region_key(now, r, id, secret);
        }
    }

    /// Moves every datagram between `members` at `now`; returns them as sent (sealed), with
    /// the index of their receiver, and the deliveries each member made.
    fn exchange(members: &mut [Member], now: Time) -> (Vec<(usize, Vec<u8>)>, Vec<usize>) {
        let mut wire = Vec::new();
        let mut delivered = vec![0; members.len()];
        for _ in 0..100 {
            let mut moved = false;
            for i in 0..members.len() {
                let len =
                    members[i].node().config().max_datagram_bytes + members[i].datagram_overhead();
                let mut buf = vec![0u8; len];
                while let Some(t) = members[i].poll_transmit(now, &mut buf).unwrap() {
                    moved = true;
                    let to: Vec<usize> = match t.destination {
                        Destination::Node(n) => vec![n.0 as usize - 1],
                        Destination::Region(_) => (0..members.len()).filter(|&j| j != i).collect(),
                    };
                    for j in to {
                        wire.push((j, buf[..t.len].to_vec()));
                        members[j].handle_datagram(now, Bytes::copy_from_slice(&buf[..t.len]));
                    }
                }
                while let Some(e) = members[i].poll_event() {
                    if matches!(e, MemberEvent::Protocol(Event::Deliver(_))) {
                        delivered[i] += 1;
                    }
                }
            }
            if !moved {
                break;
            }
        }
        (wire, delivered)
    }

    #[test]
    fn sealed_members_deliver_in_both_modes_and_refuse_forgeries_by_cause() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut m = sealed_pair(mode);
            let payload = Bytes::from_static(b"sealed hello, sealed hello");
            m[0].publish(T0, TopicId(1), payload.clone()).unwrap();
            let (wire, delivered) = exchange(&mut m, T0);
            assert_eq!(delivered, vec![1, 1], "{mode}");
            assert!(m[0].stats().datagrams_sealed > 0, "{mode}");
            assert!(m[1].stats().open.opened > 0, "{mode}");
            assert_eq!(m[1].stats().open.refused(), 0, "{mode}");
            // In encrypt mode the payload is not on the wire in clear.
            let visible = wire
                .iter()
                .any(|(_, d)| d.windows(payload.len()).any(|w| w == &payload[..]));
            assert_eq!(visible, mode == Mode::Authenticate, "{mode}");

            let (to, captured) = wire.iter().find(|(j, _)| *j == 1).unwrap().clone();
            let before = m[1].node().stats().clone();
            // A replay.
            m[1].handle_datagram(T0, Bytes::from(captured.clone()));
            assert_eq!(m[1].stats().open.replayed, 1, "{mode}");
            // The right format and key id, sealed with another secret.
            let plain_len = captured.len() - TRAILER_LEN;
            let mut forged = captured.clone();
            let mut other = SealingKey::new(
                tidings_seal::Aead::Aes256Gcm,
                mode,
                KeyId(1),
                1,
                &KeySecret::from_bytes([8; 32]),
                u64::MAX,
            );
            // Past every counter node 1 used, so the replay window does not stop it first.
            for _ in 0..1_000 {
                other.seal(&mut captured.clone(), plain_len).unwrap();
            }
            other.seal(&mut forged, plain_len).unwrap();
            m[to].handle_datagram(T0, Bytes::from(forged));
            assert_eq!(m[1].stats().open.bad_tag, 1, "{mode}");
            // An unknown key.
            let mut unknown = captured.clone();
            let mut stranger = SealingKey::new(
                tidings_seal::Aead::Aes256Gcm,
                mode,
                KeyId(99),
                1,
                &KeySecret::from_bytes([7; 32]),
                u64::MAX,
            );
            stranger.seal(&mut unknown, plain_len).unwrap();
            m[1].handle_datagram(T0, Bytes::from(unknown));
            assert_eq!(m[1].stats().open.unknown_key, 1, "{mode}");
            // A clear datagram.
            m[1].handle_datagram(T0, Bytes::copy_from_slice(&captured[..plain_len]));
            assert_eq!(m[1].stats().open.refused(), 4, "{mode}");
            // None of it reached the protocol.
            assert_eq!(m[1].node().stats(), &before, "{mode}");
        }
    }

    /// Three members on two regions: 1 and 2 on topic 1 (region A), 3 on topic 2 (region B).
    /// Members hold the keys of their regions only: 1 and 2 key 1 of A, 3 key 1 of B, under
    /// another secret.
    fn two_regions(mode: Mode) -> (Vec<Member>, RegionId, RegionId) {
        let subs: BTreeMap<NodeId, Vec<TopicId>> = [
            (NodeId(1), vec![TopicId(1)]),
            (NodeId(2), vec![TopicId(1)]),
            (NodeId(3), vec![TopicId(2)]),
        ]
        .into();
        let membership = Membership::from_subscriptions(&subs, 6);
        let region = |t: TopicId| membership.topic_regions[&t][0];
        let (a, b) = (region(TopicId(1)), region(TopicId(2)));
        assert_ne!(a, b);
        let config = sealed_config(mode);
        let members = (1..=3)
            .map(|n| {
                let mut m = Member::with_membership(
                    Config::default(),
                    config.clone(),
                    NodeId(n),
                    membership.clone(),
                    T0,
                )
                .unwrap();
                if n < 3 {
                    m.install_region_key(T0, a, 1, [7; 32]);
                } else {
                    m.install_region_key(T0, b, 1, [8; 32]);
                }
                m
            })
            .collect();
        (members, a, b)
    }

    /// A member of region A only can neither get its datagrams opened by a member of region B
    /// nor move them into B: B's member has no key for A (`unknown_key`), and under B's key
    /// a datagram whose header was changed to B fails its tag (the header is associated data).
    /// Nothing reaches B's protocol.
    #[test]
    fn a_member_of_one_region_cannot_reach_another() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let (mut m, a, b) = two_regions(mode);
            assert_eq!(m[0].keyed_regions(), vec![a]);
            assert_eq!(m[2].keyed_regions(), vec![b]);
            m[0].publish(T0, TopicId(1), Bytes::from_static(b"region A only"))
                .unwrap();
            let (wire, delivered) = exchange(&mut m[..2], T0);
            assert_eq!(delivered, vec![1, 1], "{mode}");
            let (_, captured) = wire.iter().find(|(j, _)| *j == 1).unwrap().clone();
            let before = m[2].node().stats().clone();
            m[2].handle_datagram(T0, Bytes::from(captured.clone()));
            assert_eq!(m[2].stats().open.unknown_key, 1, "{mode}");
            // Moved into region B by its header.
            let mut moved = captured.clone();
            moved[8..12].copy_from_slice(&b.0.to_be_bytes());
            m[2].handle_datagram(T0, Bytes::from(moved.clone()));
            assert_eq!(m[2].stats().open.bad_tag, 1, "{mode}");
            assert_eq!(m[2].stats().open.refused(), 2, "{mode}");
            assert_eq!(m[2].node().stats(), &before, "{mode}");
            // The same under A's key (were B's key A's, it would be refused as moved all the
            // same: the tag covers the header).
            m[1].handle_datagram(T0, Bytes::from(moved));
            assert_eq!(m[1].stats().open.unknown_key, 1, "{mode}");
        }
    }

    /// When the service takes a region's key away (the member's view of it went), the keys
    /// seal and open for the grace and are then dropped: the region's datagrams are refused
    /// as `unknown_key`, and nothing is sealed for it.
    #[test]
    fn a_region_key_taken_away_stops_opening_after_the_grace() {
        let (mut m, a, _) = two_regions(Mode::Encrypt);
        m[0].publish(T0, TopicId(1), Bytes::from_static(b"one"))
            .unwrap();
        let (wire, _) = exchange(&mut m[..2], T0);
        let (_, sample) = wire.iter().find(|(j, _)| *j == 1).unwrap().clone();
        let t1 = T0 + Duration::from_millis(100);
        m[1].drop_region_key(t1, a);
        // Within the grace the key still opens (a replay is refused as such, not as unknown).
        m[1].handle_datagram(t1, Bytes::from(sample.clone()));
        assert_eq!(m[1].stats().open.replayed, 1);
        assert_eq!(m[1].region_key_id(a), Some(1));
        let t2 = t1 + Duration::from_millis(500);
        assert!(m[1].poll_timeout().is_some_and(|t| t <= t2));
        m[1].handle_timeout(t2);
        assert_eq!(m[1].region_key_id(a), None);
        assert!(m[1].keyed_regions().is_empty());
        m[1].handle_datagram(t2, Bytes::from(sample));
        assert_eq!(m[1].stats().open.unknown_key, 1);
        // A new key for the region brings it back.
        m[1].install_region_key(t2, a, 5, [9; 32]);
        assert_eq!(m[1].region_key_id(a), Some(5));
    }

    #[test]
    fn a_replaced_key_opens_for_its_grace_and_then_is_retired() {
        let mut m = sealed_pair(Mode::Authenticate);
        // A third party (a member about to be removed) holds key 1 and seals as node 2.
        let mut leaver = SealingKey::new(
            tidings_seal::Aead::Aes256Gcm,
            Mode::Authenticate,
            KeyId(1),
            2,
            &KeySecret::from_bytes([7; 32]),
            u64::MAX,
        );
        m[1].publish(T0, TopicId(1), Bytes::from_static(b"one"))
            .unwrap();
        let (wire, _) = exchange(&mut m, T0);
        let (_, sample) = wire.iter().find(|(j, _)| *j == 0).unwrap().clone();
        let plain_len = sample.len() - TRAILER_LEN;
        let mut late = |at_counter: u64| {
            let mut d = sample.clone();
            while leaver.sealed() < at_counter {
                let mut scratch = sample.clone();
                leaver.seal(&mut scratch, plain_len).unwrap();
            }
            leaver.seal(&mut d, plain_len).unwrap();
            d
        };
        let t1 = T0 + Duration::from_millis(100);
        for member in &mut m {
            install_everywhere(member, t1, 2, [9; 32]);
            assert_eq!(member.datagram_key_id(), Some(2));
        }
        // Within the grace: key 1 still opens (a counter node 2 never used).
        let within = late(1_000);
        m[0].handle_datagram(t1, Bytes::from(within));
        assert_eq!(m[0].stats().open.retired_key, 0);
        assert_eq!(m[0].stats().open.refused(), 0);
        // After it: refused as retired, and new traffic goes under key 2.
        let t2 = t1 + Duration::from_millis(500);
        assert!(m[0].poll_timeout().is_some_and(|t| t <= t2));
        m[0].handle_timeout(t2);
        assert_eq!(m[0].stats().keys_retired, 1);
        let after = late(2_000);
        m[0].handle_datagram(t2, Bytes::from(after));
        assert_eq!(m[0].stats().open.retired_key, 1);
        m[1].handle_timeout(t2);
        m[0].publish(t2, TopicId(1), Bytes::from_static(b"two"))
            .unwrap();
        let (wire, delivered) = exchange(&mut m, t2);
        assert_eq!(delivered[1], 1);
        assert!(wire
            .iter()
            .all(|(_, d)| d[d.len() - TRAILER_LEN..][..4] == 2u32.to_be_bytes()));
    }

    fn answers(events: &[MemberEvent]) -> Vec<(u64, Result<TopicId, String>)> {
        events
            .iter()
            .filter_map(|e| match e {
                MemberEvent::Answered { token, result } => {
                    Some((*token, result.clone().map_err(|why| why.to_string())))
                }
                _ => None,
            })
            .collect()
    }

    fn names(list: &[&str]) -> Vec<(u64, String)> {
        list.iter()
            .enumerate()
            .map(|(i, n)| (i as u64 + 1, (*n).to_owned()))
            .collect()
    }

    /// A request the service's access rules refuse is answered with the topic and the rule;
    /// the allowed names of the same batch are answered with their topics.
    #[test]
    fn refused_named_requests_are_answered_with_the_topic_and_the_rule() {
        let config = GmsConfig {
            acl: crate::Acl::parse("allow subscribe * a\n", None).unwrap(),
            ..GmsConfig::default()
        };
        let mut g = Group::with_gms(1, false, config);
        g.take_events(0);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a", "b"]));
        g.members[0].request_named(g.now, NamedRequest::Advertise, vec![(3, "a".to_owned())]);
        g.pump();
        let events = g.take_events(0);
        let a = g.members[0].client().unwrap().topic_id("a").unwrap();
        let refusal = |topic: &str, action| {
            NamedRefusal::Topic(TopicRefusal {
                topic: topic.to_owned(),
                action,
                rule: crate::acl::NO_RULE_ALLOWS.to_owned(),
            })
        };
        let mut got: Vec<(u64, Result<TopicId, NamedRefusal>)> = events
            .iter()
            .filter_map(|e| match e {
                MemberEvent::Answered { token, result } => Some((*token, result.clone())),
                _ => None,
            })
            .collect();
        got.sort_by_key(|(token, _)| *token);
        assert_eq!(
            got,
            vec![
                (1, Ok(a)),
                (2, Err(refusal("b", AclAction::Subscribe))),
                (3, Err(refusal("a", AclAction::Publish))),
            ],
            "{events:?}"
        );
        assert!(g.members[0].client().unwrap().topic_id("b").is_none());
        assert_eq!(g.members[0].requests_waiting(), (0, 0));
    }

    #[test]
    fn named_requests_are_answered_once_in_force_after_the_install() {
        let mut g = Group::new(2);
        assert!(matches!(
            g.take_events(0).first(),
            Some(MemberEvent::Installed { changed: None })
        ));
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a", "b"]));
        g.pump();
        assert_eq!(g.new_commands(), 1, "two names, one request");
        let events = g.take_events(0);
        let got = answers(&events);
        assert_eq!(got.len(), 2, "{events:?}");
        let a = g.members[0].client().unwrap().topic_id("a").unwrap();
        let b = g.members[0].client().unwrap().topic_id("b").unwrap();
        assert_eq!(got, vec![(1, Ok(a)), (2, Ok(b))]);
        // Answered after the install that put the node in the topics' region.
        let installed = events
            .iter()
            .position(|e| matches!(e, MemberEvent::Installed { .. }))
            .unwrap();
        let answered = events
            .iter()
            .position(|e| matches!(e, MemberEvent::Answered { .. }))
            .unwrap();
        assert!(installed < answered, "{events:?}");
        let region = g.members[0]
            .node()
            .membership()
            .region_of(g.members[0].id());
        assert!(region.is_some_and(|r| r.topics.contains(&a) && r.topics.contains(&b)));
        // A publisher is answered once it knows the topic's regions.
        g.members[1].request_named(g.now, NamedRequest::Advertise, vec![(7, "a".to_owned())]);
        g.pump();
        assert_eq!(answers(&g.take_events(1)), vec![(7, Ok(a))]);
        assert!(g.members[1]
            .node()
            .membership()
            .topic_regions
            .contains_key(&a));
    }

    /// A member that has sealed three quarters of what its key allows asks the service for a
    /// new one, once, and seals under it when it comes.
    #[test]
    fn a_member_near_its_key_counter_limit_asks_for_a_new_key() {
        let member = MemberConfig {
            sealing: KeyRingConfig {
                mode: Mode::Encrypt,
                ..KeyRingConfig::default()
            },
            key_counter_limit: 8,
            ..MemberConfig::default()
        };
        let gms = GmsConfig {
            datagram_keys: true,
            ..GmsConfig::default()
        };
        let mut g = Group::configured(2, false, gms, &member);
        g.gms.give_key_entropy([1; 32]);
        g.pump();
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a"]));
        g.members[1].request_named(g.now, NamedRequest::Advertise, names(&["a"]));
        g.pump();
        let a = g.members[1]
            .node()
            .membership()
            .topic_regions
            .keys()
            .next()
            .copied()
            .unwrap();
        let region = g.gms.planner().topic_regions(a).next().unwrap();
        let first = g.gms.region_key_id(region).unwrap();
        assert_eq!(g.members[1].region_key_id(region), Some(first));
        assert_eq!(g.members[0].region_key_id(region), Some(first));
        let mut buf = vec![0u8; 2048];
        let mut sealed = 0;
        for k in 0..8u8 {
            g.members[1]
                .publish(g.now, a, Bytes::from(vec![k; 10]))
                .unwrap();
            while g.members[1]
                .poll_transmit(g.now, &mut buf)
                .unwrap()
                .is_some()
            {
                sealed += 1;
            }
            if sealed >= 6 {
                break;
            }
        }
        assert!(sealed >= 6, "sealed {sealed}");
        assert_eq!(g.members[1].stats().key_renewals_asked, 1);
        g.pump();
        assert_eq!(g.gms.stats().key_renewals_asked, 1);
        let next = g.gms.region_key_id(region).unwrap();
        assert!(next > first);
        assert_eq!(g.members[1].region_key_id(region), Some(next));
        assert_eq!(g.members[0].region_key_id(region), Some(next));
        // The next ones are sealed under the new key; the old one is not asked for again.
        g.members[1]
            .publish(g.now, a, Bytes::from_static(b"new key"))
            .unwrap();
        while g.members[1]
            .poll_transmit(g.now, &mut buf)
            .unwrap()
            .is_some()
        {}
        g.pump();
        assert_eq!(g.members[1].stats().key_renewals_asked, 1);
        // The master secret stays: only the region's key changed.
        assert_eq!(g.gms.stats().keys_drawn, 1);
    }

    #[test]
    fn unsubscriptions_are_gathered_into_one_request() {
        let mut g = Group::new(1);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a", "b", "c"]));
        g.pump();
        let topic = |g: &Group, n: &str| g.members[0].client().unwrap().topic_id(n).unwrap();
        let (a, b, c) = (topic(&g, "a"), topic(&g, "b"), topic(&g, "c"));
        g.new_commands();
        g.members[0].unsubscribe(a);
        g.members[0].unsubscribe(b);
        // Not subscribed by name: ignored.
        g.members[0].unsubscribe(TopicId(999));
        g.pump();
        assert_eq!(g.new_commands(), 1, "two unsubscriptions, one request");
        let me = g.members[0].id();
        let subscribed: Vec<TopicId> = g.gms.planner().subscriptions(me).collect();
        assert_eq!(subscribed, vec![c]);
        let region = g.members[0].node().membership().region_of(me).unwrap();
        assert_eq!(region.topics, vec![c]);
    }

    #[test]
    fn a_subscription_whose_region_cannot_be_received_is_refused_and_withdrawn() {
        let mut g = Group::new(1);
        // The host could not join any group: every region is unreachable.
        let reach: BTreeMap<RegionId, String> = (1..50)
            .map(|r| (RegionId(r), "no socket left".to_owned()))
            .collect();
        g.members[0].set_unreachable(reach);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a"]));
        g.pump();
        let got = answers(&g.take_events(0));
        assert_eq!(got.len(), 1);
        let why = got[0].1.clone().unwrap_err();
        assert!(
            why.contains("\"a\"") && why.contains("no socket left"),
            "{why}"
        );
        let me = g.members[0].id();
        assert_eq!(g.gms.planner().subscriptions(me).count(), 0, "withdrawn");
    }

    #[test]
    fn a_removed_member_refuses_what_waits_and_empties_its_membership() {
        let mut g = Group::new(2);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["a"]));
        g.pump();
        g.take_events(0);
        // Cut off towards the service: its heartbeats and the next request are lost.
        g.cut_from.insert(0);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, vec![(9, "b".to_owned())]);
        g.advance(GmsConfig::default().heartbeat_timeout + Duration::from_millis(500));
        let events = g.take_events(0);
        assert!(events.contains(&MemberEvent::Removed), "{events:?}");
        assert_eq!(
            answers(&events),
            vec![(9, Err("the GMS removed this node".to_owned()))]
        );
        assert!(events.contains(&MemberEvent::Installed { changed: None }));
        assert!(g.members[0].is_removed());
        assert!(g.members[0].node().membership().regions.is_empty());
        // Further requests are refused at once.
        g.members[0].request_named(g.now, NamedRequest::Subscribe, vec![(10, "c".to_owned())]);
        assert_eq!(
            answers(&g.take_events_now(0)),
            vec![(10, Err("the GMS removed this node".to_owned()))]
        );
        // The other member is still in.
        assert!(!g.members[1].is_removed());
        assert!(!g.events[1].contains(&MemberEvent::Removed));
    }

    impl Group {
        /// Polls member `i`'s events now.
        fn take_events_now(&mut self, i: usize) -> Vec<MemberEvent> {
            std::iter::from_fn(|| self.members[i].poll_event()).collect()
        }
    }

    #[test]
    fn a_leave_ends_when_confirmed_or_when_its_timeout_passes() {
        let mut g = Group::new(3);
        let gone = g.members[0].id();
        g.members[0].leave(g.now);
        g.pump();
        assert!(g.take_events(0).contains(&MemberEvent::Left));
        assert!(g.gms.members().all(|n| n != gone));
        // A member whose leave gets no answer counts itself gone after the timeout.
        g.cut_to.insert(1);
        g.members[1].leave(g.now);
        g.pump();
        assert!(!g.take_events(1).contains(&MemberEvent::Left));
        g.advance(MemberConfig::default().leave_timeout + Duration::from_millis(20));
        assert_eq!(
            g.take_events(1)
                .iter()
                .filter(|e| **e == MemberEvent::Left)
                .count(),
            1
        );
        // Without a service, a leave ends at once.
        let mut alone = Member::with_membership(
            Config::default(),
            MemberConfig::default(),
            NodeId(1),
            Membership::default(),
            T0,
        )
        .unwrap();
        alone.leave(T0);
        let events: Vec<MemberEvent> = std::iter::from_fn(|| alone.poll_event()).collect();
        assert_eq!(
            events,
            vec![MemberEvent::Installed { changed: None }, MemberEvent::Left]
        );
        let _ = RemoveCause::Left;
    }

    #[test]
    fn a_delivery_made_before_an_install_comes_before_its_event() {
        let t1 = TopicId(1);
        let subs: BTreeMap<NodeId, Vec<TopicId>> =
            [(NodeId(1), vec![t1]), (NodeId(2), vec![t1])].into();
        let m = Membership::from_subscriptions(&subs, 8);
        let new = |id| {
            Member::with_membership(
                Config::default(),
                MemberConfig::default(),
                id,
                m.clone(),
                T0,
            )
            .unwrap()
        };
        let (mut sender, mut receiver) = (new(NodeId(1)), new(NodeId(2)));
        // A twin of the receiver, fed the same, whose events are taken in bulk.
        let mut twin = new(NodeId(2));
        while sender.poll_event().is_some() {}
        while receiver.poll_event().is_some() {}
        while twin.poll_event().is_some() {}
        let mut now = T0;
        for text in [&b"hello"[..], b"again", b"and again"] {
            sender.publish(now, t1, Bytes::from(text)).unwrap();
        }
        let mut buf = vec![0; 1472];
        for _ in 0..5 {
            now += Duration::from_millis(1);
            sender.handle_timeout(now);
            while let Some(t) = sender.poll_transmit(now, &mut buf).unwrap() {
                if matches!(
                    t.destination,
                    Destination::Region(_) | Destination::Node(NodeId(2))
                ) {
                    let datagram = Bytes::copy_from_slice(&buf[..t.len]);
                    receiver.handle_datagram(now, datagram.clone());
                    twin.handle_datagram(now, datagram);
                }
            }
        }
        // The delivery waits in the receiver; then a new membership arrives.
        assert!(receiver.node().events_pending() > 0);
        receiver.set_membership(now, m.clone());
        twin.set_membership(now, m.clone());
        // A message of its own, delivered to itself after the install.
        for node in [&mut receiver, &mut twin] {
            node.publish(now, t1, Bytes::from_static(b"mine")).unwrap();
        }
        let events: Vec<MemberEvent> = std::iter::from_fn(|| receiver.poll_event()).collect();
        // Taken in bulk up to each own event, the same events come in the same order.
        let mut bulk = Vec::new();
        let mut taken = VecDeque::new();
        loop {
            let n = twin.take_protocol_events(&mut taken);
            assert_eq!(n, taken.len());
            bulk.extend(taken.drain(..).map(MemberEvent::Protocol));
            match twin.poll_event() {
                Some(e) => bulk.push(e),
                None => break,
            }
        }
        assert_eq!(bulk, events);
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, MemberEvent::Protocol(Event::Deliver(_))))
                .count(),
            4
        );
        assert!(matches!(
            events.last(),
            Some(MemberEvent::Protocol(Event::Deliver(d))) if d.origin == NodeId(2)
        ));
        let delivered = events
            .iter()
            .position(|e| matches!(e, MemberEvent::Protocol(Event::Deliver(_))))
            .unwrap();
        let installed = events
            .iter()
            .position(|e| matches!(e, MemberEvent::Installed { .. }))
            .unwrap();
        assert!(delivered < installed, "{events:?}");
        // A host that cannot take deliveries now takes the install ahead of them.
        receiver.set_membership(now, m);
        assert_eq!(
            receiver.poll_control_event(),
            Some(MemberEvent::Installed { changed: None })
        );
    }

    #[test]
    fn a_region_that_does_not_acknowledge_is_reported_stalled_until_it_does() {
        let t1 = TopicId(1);
        let subs: BTreeMap<NodeId, Vec<TopicId>> =
            [(NodeId(1), vec![t1]), (NodeId(2), vec![t1])].into();
        let m = Membership::from_subscriptions(&subs, 8);
        let config = MemberConfig {
            stall_after: Duration::from_millis(400),
            ..MemberConfig::default()
        };
        let new = |id| {
            Member::with_membership(Config::default(), config.clone(), id, m.clone(), T0).unwrap()
        };
        let (mut sender, mut receiver) = (new(NodeId(1)), new(NodeId(2)));
        let mut buf = vec![0; 1472];
        let mut now = T0;
        sender
            .publish(now, t1, Bytes::from_static(b"hello"))
            .unwrap();
        // The receiver hears nothing for a second: the sender's message stays unstable.
        let mut events = Vec::new();
        while now < T0 + Duration::from_secs(1) {
            now = sender.poll_timeout().unwrap().max(now);
            sender.handle_timeout(now);
            while sender.poll_transmit(now, &mut buf).unwrap().is_some() {}
            events.extend(std::iter::from_fn(|| sender.poll_event()));
        }
        let stalls: Vec<&Stall> = events
            .iter()
            .filter_map(|e| match e {
                MemberEvent::Stalled(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(stalls.len(), 1, "reported once: {events:?}");
        let stall = stalls[0];
        assert_eq!(stall.oldest, MsgId(1));
        assert_eq!(stall.members, vec![NodeId(1), NodeId(2)]);
        assert!(stall.waited >= Duration::from_millis(400));
        assert!(stall.waited < Duration::from_millis(600), "{stall:?}");
        assert!(
            stall.to_string().contains("waiting for members 1, 2"),
            "{stall}"
        );
        assert_eq!(sender.stats().stalls_reported, 1);
        // The network heals: the receiver gets everything and acknowledges; the stall clears.
        let end = now + Duration::from_secs(2);
        let mut cleared = false;
        while now < end && !cleared {
            now += Duration::from_millis(1);
            let mut pair = [&mut sender, &mut receiver];
            for i in 0..2 {
                let [a, b] = &mut pair;
                let (from, to) = if i == 0 { (a, b) } else { (b, a) };
                if from.poll_timeout().is_some_and(|t| t <= now) {
                    from.handle_timeout(now);
                }
                while let Some(t) = from.poll_transmit(now, &mut buf).unwrap() {
                    to.handle_datagram(now, Bytes::copy_from_slice(&buf[..t.len]));
                }
            }
            while receiver.poll_event().is_some() {}
            while let Some(e) = sender.poll_event() {
                if let MemberEvent::StallCleared { region, waited } = e {
                    assert_eq!(region, stall.region);
                    assert!(waited >= stall.waited);
                    cleared = true;
                }
            }
        }
        assert!(cleared, "the stall did not clear");
        assert!(sender.node().is_stable(MsgId(1)));
        // Nothing unstable, nothing stalled: no stall check is due.
        assert!(sender.stall_check_at().is_none());
    }

    #[test]
    fn installs_not_yet_taken_are_merged() {
        let mut g = Group::new(1);
        g.take_events(0);
        let before = g.members[0].stats().installs;
        // Each request exchanged without taking events: two installs, one event.
        for (token, name) in [(1, "a"), (2, "b")] {
            g.members[0].request_named(
                g.now,
                NamedRequest::Subscribe,
                vec![(token, name.to_owned())],
            );
            for _ in 0..3 {
                while let Some((_, d)) = g.members[0].poll_gms_transmit() {
                    let from = Peer::Node(g.members[0].id());
                    g.gms.handle_datagram(g.now, from, unframe(&d).unwrap());
                }
                while let Some(t) = g.gms.poll_transmit() {
                    g.members[0].handle_gms_datagram(g.now, 0, &frame(&t.msg));
                }
            }
        }
        assert!(g.members[0].stats().installs >= before + 2);
        let events = g.take_events_now(0);
        let installs = events
            .iter()
            .filter(|e| matches!(e, MemberEvent::Installed { .. }))
            .count();
        assert_eq!(installs, 1, "{events:?}");
        assert_eq!(answers(&events).len(), 2, "{events:?}");
    }

    /// A node joins through [`Joining`]: not a member before the welcome, then one whose
    /// membership holds what the service sent during the handshake and whose counters include
    /// its datagrams; a datagram without the GMS framing is counted and dropped.
    #[test]
    fn a_joining_node_becomes_a_member_once_welcomed() {
        let mut gms = Gms::new(GmsConfig::default()).unwrap();
        let (mut two, sent) = handshake(&mut gms, 2, 3);
        assert!(two.iter().all(Joining::is_joined));
        let mut j = two.remove(0);
        j.handle_gms_datagram(T0, 0, b"not a gms datagram");
        let m = j.into_member(T0).unwrap();
        assert_ne!(m.id(), two[0].client.node().unwrap());
        assert_eq!(m.client().and_then(GmsClient::node), Some(m.id()));
        let stats = m.stats();
        assert_eq!(stats.gms_unframed, 1);
        assert!(stats.gms_datagrams_received >= 2, "{stats:?}");
        assert_eq!(stats.gms_datagrams_sent, sent[0]);
        // Without a welcome (no service answers), a node is no member.
        let mut lone = Joining::new(
            Config::default(),
            MemberConfig::default(),
            ClientConfig::default(),
        )
        .unwrap();
        lone.handle_timeout(T0);
        assert!(lone.poll_gms_transmit().is_some(), "the join goes out");
        assert!(!lone.is_joined());
        assert!(matches!(lone.into_member(T0), Err(MemberError::NotJoined)));
    }

    /// The service restarts without its state: every member joins again under a new id and
    /// the new incarnation, its subscriptions and advertisements carried over and reported
    /// moved to their new ids, its unstable messages reported abandoned, and its message ids
    /// going on.
    #[test]
    fn members_follow_a_rejoin_to_a_service_restarted_without_its_state() {
        let mut g = Group::with(3, true);
        g.members[0].request_named(g.now, NamedRequest::Subscribe, names(&["z", "a", "b"]));
        g.members[1].request_named(g.now, NamedRequest::Subscribe, names(&["b"]));
        g.members[2].request_named(g.now, NamedRequest::Advertise, names(&["a", "b"]));
        g.pump();
        let z = g.gms.topic_id("z").unwrap();
        let (old_a, old_b) = (g.gms.topic_id("a").unwrap(), g.gms.topic_id("b").unwrap());
        g.members[0].unsubscribe(z);
        g.pump();
        for i in 0..3 {
            g.take_events(i);
        }
        let old_ids: Vec<NodeId> = g.members.iter().map(Member::id).collect();
        assert!(g.members.iter().all(|m| m.node().incarnation() == 1));
        // Three messages that no region acknowledges (this harness carries no data).
        for _ in 0..3 {
            g.members[2]
                .publish(g.now, old_a, Bytes::from_static(b"m"))
                .unwrap();
        }
        assert_eq!(g.members[2].node().next_msg_id(), MsgId(4));
        g.gms = Gms::new(GmsConfig {
            incarnation: 2,
            first_node: 100,
            ..GmsConfig::default()
        })
        .unwrap();
        g.advance(Duration::from_secs(3));
        let (new_a, new_b) = (g.gms.topic_id("a").unwrap(), g.gms.topic_id("b").unwrap());
        assert_ne!((new_a, new_b), (old_a, old_b));
        assert_eq!(g.gms.members().count(), 3);
        for (i, &old_id) in old_ids.iter().enumerate() {
            let events = g.take_events(i);
            let m = &g.members[i];
            assert!(m.id().0 >= 100, "{:?}", m.id());
            assert_eq!(m.node().incarnation(), 2);
            assert!(!m.is_removed());
            assert_eq!(m.stats().rejoins, 1);
            let rejoined: Vec<_> = events
                .iter()
                .filter_map(|e| match e {
                    MemberEvent::Rejoined {
                        old,
                        new,
                        incarnation,
                        abandoned,
                    } => Some((*old, *new, *incarnation, abandoned.clone())),
                    _ => None,
                })
                .collect();
            let abandoned: Vec<MsgId> = if i == 2 {
                (1..4).map(MsgId).collect()
            } else {
                Vec::new()
            };
            assert_eq!(rejoined, vec![(old_id, m.id(), 2, abandoned)]);
            let moved: BTreeSet<(String, TopicId, TopicId)> = events
                .iter()
                .filter_map(|e| match e {
                    MemberEvent::TopicMoved { name, old, new } => Some((name.clone(), *old, *new)),
                    _ => None,
                })
                .collect();
            let expected: Vec<(&str, TopicId, TopicId)> = match i {
                0 | 2 => vec![("a", old_a, new_a), ("b", old_b, new_b)],
                _ => vec![("b", old_b, new_b)],
            };
            let expected: BTreeSet<(String, TopicId, TopicId)> = expected
                .into_iter()
                .map(|(n, o, w)| (n.to_owned(), o, w))
                .collect();
            assert_eq!(moved, expected, "member {i}");
            // The carried-over subscriptions are in force under the new ids.
            let subs = m
                .node()
                .membership()
                .subscriptions
                .clone()
                .unwrap_or_default();
            match i {
                0 => assert_eq!(subs, [new_a, new_b].into()),
                1 => assert_eq!(subs, [new_b].into()),
                _ => assert!(subs.is_empty()),
            }
            assert!(g.gms.planner().subscribers(new_b).any(|n| n == m.id()) || i == 2);
        }
        // The publisher numbers on, and publishes on the new id.
        assert!(g.members[2]
            .node()
            .membership()
            .topic_regions
            .contains_key(&new_a));
        let next = g.members[2]
            .publish(g.now, new_a, Bytes::from_static(b"n"))
            .unwrap();
        assert_eq!(next, MsgId(4));
        assert_eq!(g.members[2].stats().messages_abandoned, 3);
        // The moved subscription can be dropped by its new id.
        g.members[1].unsubscribe(new_b);
        g.pump();
        assert!(!g
            .gms
            .planner()
            .subscribers(new_b)
            .any(|n| n == g.members[1].id()));
    }
}
