//! The membership service: a deterministic state machine driven by messages and time.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use tidings_proto::Time;
use tidings_seal::PublicKey;
use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

use crate::acl::{AclAction, TopicRefusal};
use crate::config::{ConfigError, GmsConfig};
use crate::groups::GroupLoads;
use crate::message::{
    item_len, GmsMessage, GmsRegionView, Item, RegionAddress, Request, WireKey,
    ITEMS_PER_UPDATE_MAX, TOPIC_NAME_BYTES_MAX,
};
use crate::regions::{Changes, Planner};

/// Bytes of an update message before its items: tag, sequence number, item count.
const UPDATE_HEADER_BYTES: usize = 1 + 8 + 4;

/// Who a message comes from or goes to: a member, or a joiner that has no node id yet (the runtime
/// maps the nonce to the address the `Join` came from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// A member.
    Node(NodeId),
    /// A joiner, by the nonce of its `Join`.
    Joiner(u64),
}

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GmsTransmit {
    /// The destination.
    pub to: Peer,
    /// The message ([`GmsMessage::encode`] gives the bytes).
    pub msg: GmsMessage,
}

/// Why a node was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RemoveCause {
    /// It asked to leave.
    Left,
    /// Not heard from for `heartbeat_timeout`.
    HeartbeatTimeout,
    /// Suspected by a ring neighbour and not heard from for `suspicion_timeout`.
    Suspected,
    /// It did not acknowledge an update after `retransmit_attempts_max` sends, or fell more than
    /// `updates_queued_max` updates behind.
    Unresponsive,
}

/// A state change of the service: the only way its membership state changes, so a log of these
/// (with their times) replays it exactly, and a consensus layer replicates it ([`Decision`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A joiner (by nonce) becomes a member.
    Join {
        /// The joiner's nonce.
        nonce: u64,
        /// Where it receives protocol datagrams, if known.
        addr: Option<SocketAddr>,
    },
    /// A member subscribes to a topic by name.
    Subscribe {
        /// The member.
        node: NodeId,
        /// The topic's name.
        name: String,
    },
    /// A member subscribes to several topics by name at once: one round of views for all.
    SubscribeMany {
        /// The member.
        node: NodeId,
        /// The topics' names.
        names: Vec<String>,
    },
    /// A member unsubscribes.
    Unsubscribe {
        /// The member.
        node: NodeId,
        /// The topic's name.
        name: String,
    },
    /// A member unsubscribes from several topics at once: one round of views for all.
    UnsubscribeMany {
        /// The member.
        node: NodeId,
        /// The topics' names.
        names: Vec<String>,
    },
    /// A member declares it publishes on a topic.
    Advertise {
        /// The member.
        node: NodeId,
        /// The topic's name.
        name: String,
    },
    /// A member declares it publishes on several topics at once: one update for all.
    AdvertiseMany {
        /// The member.
        node: NodeId,
        /// The topics' names.
        names: Vec<String>,
    },
    /// A member withdraws that declaration.
    Unadvertise {
        /// The member.
        node: NodeId,
        /// The topic's name.
        name: String,
    },
    /// A member says where it serves its metrics (`None`: nowhere).
    MetricsAt {
        /// The member.
        node: NodeId,
        /// Its metrics endpoint.
        addr: Option<SocketAddr>,
    },
    /// A member is removed.
    Remove {
        /// The member.
        node: NodeId,
        /// Why.
        cause: RemoveCause,
    },
    /// The service's master datagram secret (with [`GmsConfig::datagram_keys`], ADR 43):
    /// decided by the leader from the host's entropy, logged so that every replica (and so a
    /// new leader) holds the same one, and never sent to members: every region's key is
    /// derived from it ([`Item::RegionKey`]). Ignored unless `id` is above the current
    /// secret's; a new one replaces every region's key.
    DatagramKey {
        /// The key's id.
        id: u32,
        /// Its secret.
        secret: WireKey,
    },
    /// The leader's access rules (`GmsConfig::acl`) refused some topics of a member's request:
    /// the member is told each ([`Item::Refused`]), then `then` (the request with the
    /// refused names taken out, if any are left) is applied. The refusal is decided by the
    /// leader and logged, so every replica tells the member the same.
    Refuse {
        /// The member.
        node: NodeId,
        /// The topics refused (at most [`NAMES_PER_REQUEST_MAX`](crate::NAMES_PER_REQUEST_MAX)).
        refusals: Vec<TopicRefusal>,
        /// The rest of the request (never itself a `Refuse`).
        then: Option<Box<Command>>,
    },
    /// A member nearly used up `region`'s key `id` ([`Request::RenewDatagramKey`]): the region
    /// gets a new key if `id` is still its current one (once per key, however many ask).
    RenewRegionKey {
        /// The region.
        region: RegionId,
        /// The key asked to be replaced.
        id: u32,
    },
    /// The service takes its incarnation: the first decision of a replicated service's first
    /// leader (the one in its configuration), so every replica holds the same one. Ignored once
    /// the service has one.
    Incarnate {
        /// The incarnation (nonzero; zero is ignored).
        incarnation: u32,
    },
}

/// What a replicated service's leader decided: one entry of the replicated log (ADR 32). Every
/// replica applies the committed ones in log order with [`Gms::apply_decision`], so all hold
/// the same state; a single-process service applies each as it decides it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// A state change not asked for by a numbered request (a join, a removal by failure
    /// detection).
    Command(Command),
    /// A member's request `req`, taken if it is the next one of that member (a request decided
    /// twice before its first commit is taken once), with the command it asks for (none for a
    /// suspicion, which only the leader acts on).
    Request {
        /// The member.
        node: NodeId,
        /// The request's number.
        req: u64,
        /// What it changes, if anything.
        command: Option<Command>,
    },
    /// A member acknowledged its update stream up to `upto`: every replica drops those items,
    /// so a new leader resends only from here.
    Acked {
        /// The member.
        node: NodeId,
        /// Highest item received in order.
        upto: u64,
    },
}

/// What the service reports to its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GmsEvent {
    /// A node joined.
    Joined(NodeId),
    /// A node was removed.
    Removed {
        /// The node.
        node: NodeId,
        /// Why.
        cause: RemoveCause,
    },
    /// A topic name was bound to an id.
    TopicCreated {
        /// The name.
        name: String,
        /// The id.
        topic: TopicId,
    },
}

/// Counters of the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GmsStats {
    /// Messages that failed to decode (dropped).
    pub malformed: u64,
    /// Master datagram secrets decided ([`GmsConfig::datagram_keys`]): one per service
    /// incarnation.
    pub keys_drawn: u64,
    /// Region keys made (ADR 43): one per region created, and one each time a holder of a
    /// region's key stops being one, a member renews it, or the master secret changes.
    pub region_keys_made: u64,
    /// Renewals of a current region key asked by members that nearly used it up
    /// ([`Request::RenewDatagramKey`]).
    pub key_renewals_asked: u64,
    /// Messages from unknown nodes, or of a kind the GMS does not accept (dropped).
    pub unexpected: u64,
    /// Requests received again (re-acknowledged, not re-applied).
    pub requests_duplicate: u64,
    /// Requests received ahead of a missing one (dropped; the client resends in order).
    pub requests_out_of_order: u64,
    /// Requests refused (topic name too long, too many topics).
    pub requests_refused: u64,
    /// Topics of subscriptions and advertisements refused by the access rules
    /// (`GmsConfig::acl`), each told to its node.
    pub topics_refused: u64,
    /// Update items sent for the first time.
    pub updates_sent: u64,
    /// Update items sent again.
    pub updates_retransmitted: u64,
    /// Region views issued (new view epochs).
    pub views_issued: u64,
    /// Of those, views that only added topics to their region or dropped topics all its members
    /// left: its streams go on (ADR 30).
    pub views_continued: u64,
    /// Regions in the plan now (a gauge): topics of the same subscribers share them, up to
    /// `PlannerConfig::subset_topics_max` topics each.
    pub regions_current: u64,
    /// Suspicions accepted (from a ring neighbour).
    pub suspicions_accepted: u64,
    /// Suspicions ignored (not from a ring neighbour, or of an unknown node).
    pub suspicions_ignored: u64,
    /// Joins refused because `nodes_max` was reached.
    pub joins_refused: u64,
    /// Probes sent to suspected nodes (`GmsConfig::suspicion_probes`).
    pub probes_sent: u64,
    /// Joins with a member's nonce from another address: another joiner drew the same nonce.
    /// Welcoming it would make two nodes one; it is told `NonceTaken` instead.
    pub joins_conflicting: u64,
    /// Commands applied.
    pub commands: u64,
    /// Syncs of a node (each compares what changed for it with what it was told).
    pub syncs: u64,
    /// Regions those syncs compared: what a change costs the service, proportional to the
    /// regions it touched, not to every region the node knows.
    pub sync_regions_compared: u64,
    /// Regions given a multicast group that already carried another region (more regions than
    /// the pool's `groups_max`).
    pub group_shares: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Pending {
    seq: u64,
    item: Item,
    sent_at: Option<Time>,
    attempts: u32,
}

/// The service's record of one member ([`Gms::member_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberState {
    /// The member's requests taken so far (their numbers run from 1).
    pub requests_taken: u64,
    /// Update items sent or queued for it and not acknowledged.
    pub updates_unacknowledged: usize,
    /// The most times any of those was sent.
    pub updates_sent_max_attempts: u32,
    /// When it was last heard from.
    pub last_heard: Time,
    /// Topics it publishes on.
    pub publishes: usize,
    /// A ring neighbour's suspicion of it stands.
    pub suspected: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeEntry {
    nonce: u64,
    last_heard: Time,
    /// When a ring neighbour's suspicion was first accepted since the node was last heard from:
    /// the node is removed if it stays silent for `suspicion_timeout` after that (counting
    /// from the suspicion, not from the last message, so a suspicion never removes a node that
    /// had no chance to speak).
    suspected: Option<Time>,
    /// Probes sent since the suspicion (`GmsConfig::suspicion_probes`).
    probes_sent: u32,
    publishes: BTreeSet<TopicId>,
    req_upto: u64,
    next_seq: u64,
    queue: VecDeque<Pending>,
    /// The region views this node has been sent (and not told gone), at their epochs.
    known_regions: BTreeMap<RegionId, ViewId>,
    /// The ids of the region keys this node has been sent (and not told gone).
    known_keys: BTreeMap<RegionId, u32>,
    /// The region lists of published topics this node has been sent.
    known_topics: BTreeMap<TopicId, Vec<RegionId>>,
    /// Where this node receives protocol datagrams (from its `Join`).
    addr: Option<SocketAddr>,
    /// The nodes whose address this node has been sent (node ids are never reused, so an
    /// address once told stays true).
    told_addresses: BTreeSet<NodeId>,
    /// Where this node serves its metrics, as it said ([`Request::MetricsAt`]).
    metrics: Option<SocketAddr>,
}

/// What a pending sync of a node looks at: the regions and published topics whose state may
/// have changed for it since its last sync. A sync compares only these with what the node was
/// told, so its cost follows the change, not the node's whole part of the membership (at
/// 100,000 topics a pass over every region of a publisher per batch of requests was most of
/// the service's time).
#[derive(Debug, Default)]
struct SyncScope {
    regions: BTreeSet<RegionId>,
    topics: BTreeSet<TopicId>,
}

/// The global membership service, sans-IO.
///
/// Drive it with [`handle_datagram`](Gms::handle_datagram) (or
/// [`handle_message`](Gms::handle_message)) and [`handle_timeout`](Gms::handle_timeout); after
/// each call, drain [`poll_transmit`](Gms::poll_transmit) and [`poll_event`](Gms::poll_event)
/// until they return `None`, then call `handle_timeout` at [`poll_timeout`](Gms::poll_timeout)
/// (or earlier). It never reads a clock: `now` is an input.
///
/// Each member has one reliable update stream: items numbered 1, 2, 3 ..., at most
/// `updates_inflight_max` unacknowledged, resent every `retransmit_interval`. A member is sent only
/// the views of the regions it is in or publishes to, and the region lists of the topics it
/// publishes on; each batch ends with [`Item::Commit`].
#[derive(Debug)]
pub struct Gms {
    config: GmsConfig,
    planner: Planner,
    nodes: BTreeMap<NodeId, NodeEntry>,
    /// Members whose `Join` gave an address. While there are none (the simulator routes by node
    /// id), `sync` does not gather the nodes each member talks to, only to find no address.
    addressed_members: usize,
    joins: BTreeMap<u64, NodeId>,
    next_node: u32,
    /// The incarnation its members' protocol nodes write in every packet: chosen when the
    /// service starts without state, kept by its snapshots and log; 0 until a replicated
    /// service's first leader decides it.
    incarnation: u32,
    topic_ids: BTreeMap<String, TopicId>,
    next_topic: u32,
    views: BTreeMap<RegionId, ViewId>,
    /// Each region's view base: the epoch its streams began at (ADR 30).
    bases: BTreeMap<RegionId, ViewId>,
    addresses: BTreeMap<RegionId, RegionAddress>,
    /// The multicast pool's groups handed out so far and how many regions each carries.
    groups: GroupLoads,
    publishers: BTreeMap<TopicId, BTreeSet<NodeId>>,
    known_by: BTreeMap<RegionId, BTreeSet<NodeId>>,
    outbox: VecDeque<GmsTransmit>,
    /// Nodes with update items queued since the last `poll_transmit`: their items are packed
    /// and sent there, so everything one batch of inputs causes leaves in as few datagrams as
    /// possible.
    unsent: BTreeSet<NodeId>,
    /// Nodes whose part of the membership changed since the last `poll_transmit`: each is
    /// synced there once, however many commands touched it. A node subscribing to thousands
    /// of topics sends its requests in batches, several of which arrive together; one sync of
    /// the node for all of them is one batch of updates and one membership to install, where
    /// a sync per request cost both sides a pass over every region of the node per request.
    syncs_pending: BTreeMap<NodeId, SyncScope>,
    /// The latest `now` given, the send time of items sent from `poll_transmit`.
    last_now: Time,
    events: VecDeque<GmsEvent>,
    stats: GmsStats,
    /// `None` for a single-process service, which applies what it decides at once; a replica's
    /// role otherwise, where decisions wait for the log (ADR 32).
    replicated: Option<Role>,
    /// Decisions of a replicated leader not yet taken by [`Gms::poll_decision`].
    decisions: VecDeque<Decision>,
    /// Members a replicated leader decided to remove, until the removal is applied: failure
    /// detection neither decides it again nor counts their deadlines.
    removing: BTreeSet<NodeId>,
    /// The highest request of each member a replicated leader decided (soft state): the
    /// next one is taken while earlier ones wait for their commit.
    requests_decided: BTreeMap<NodeId, u64>,
    /// The highest acknowledgement of each member a replicated leader decided (soft state).
    acks_decided: BTreeMap<NodeId, u64>,
    /// The master datagram secret and its id (replicated state), with
    /// [`GmsConfig::datagram_keys`]: region keys are derived from it; never sent.
    datagram_key: Option<(u32, WireKey)>,
    /// Each region's current key id (replicated state, ADR 43). Ids are unique over all
    /// regions of the incarnation: the last one given is `last_key_id`.
    region_keys: BTreeMap<RegionId, u32>,
    /// The last region key id given (replicated state).
    last_key_id: u32,
    /// Entropy from the host for the master secret (soft state).
    key_entropy: Option<[u8; 32]>,
    /// A replicated leader decided a master secret that is not applied yet (soft state).
    key_deciding: bool,
}

/// A replica's role in a replicated service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Decides, detects failures and sends the update streams.
    Leader,
    /// Only applies what the log commits; sends nothing.
    Follower,
}

/// The replicated part of the service's state, as a snapshot encodes it (ADR 32): everything
/// the committed log determines. Soft state (heartbeat times, suspicions, sends of updates) is
/// rebuilt by a new leader ([`Gms::lead`]).
#[derive(Serialize)]
struct StateRef<'a> {
    planner: &'a Planner,
    nodes: &'a BTreeMap<NodeId, NodeEntry>,
    addressed_members: usize,
    joins: &'a BTreeMap<u64, NodeId>,
    next_node: u32,
    topic_ids: &'a BTreeMap<String, TopicId>,
    next_topic: u32,
    views: &'a BTreeMap<RegionId, ViewId>,
    bases: &'a BTreeMap<RegionId, ViewId>,
    addresses: &'a BTreeMap<RegionId, RegionAddress>,
    groups: &'a GroupLoads,
    publishers: &'a BTreeMap<TopicId, BTreeSet<NodeId>>,
    known_by: &'a BTreeMap<RegionId, BTreeSet<NodeId>>,
    last_now: Time,
    incarnation: u32,
    datagram_key: &'a Option<(u32, WireKey)>,
    region_keys: &'a BTreeMap<RegionId, u32>,
    last_key_id: u32,
}

/// [`StateRef`] decoded.
#[derive(Deserialize)]
struct State {
    planner: Planner,
    nodes: BTreeMap<NodeId, NodeEntry>,
    addressed_members: usize,
    joins: BTreeMap<u64, NodeId>,
    next_node: u32,
    topic_ids: BTreeMap<String, TopicId>,
    next_topic: u32,
    views: BTreeMap<RegionId, ViewId>,
    bases: BTreeMap<RegionId, ViewId>,
    addresses: BTreeMap<RegionId, RegionAddress>,
    groups: GroupLoads,
    publishers: BTreeMap<TopicId, BTreeSet<NodeId>>,
    known_by: BTreeMap<RegionId, BTreeSet<NodeId>>,
    last_now: Time,
    incarnation: u32,
    datagram_key: Option<(u32, WireKey)>,
    region_keys: BTreeMap<RegionId, u32>,
    last_key_id: u32,
}

/// Why a snapshot was not restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes are not a snapshot of this version of the service.
    #[error("snapshot does not decode: {0}")]
    Decode(String),
}

impl Gms {
    /// A service with no members. Fails if the configuration is invalid.
    pub fn new(config: GmsConfig) -> Result<Gms, ConfigError> {
        config.validate()?;
        let planner = Planner::new(config.planner.clone())?;
        let first_node = config.first_node;
        let incarnation = config.incarnation;
        Ok(Gms {
            config,
            planner,
            nodes: BTreeMap::new(),
            addressed_members: 0,
            joins: BTreeMap::new(),
            next_node: first_node,
            incarnation,
            topic_ids: BTreeMap::new(),
            next_topic: 1,
            views: BTreeMap::new(),
            bases: BTreeMap::new(),
            addresses: BTreeMap::new(),
            groups: GroupLoads::default(),
            publishers: BTreeMap::new(),
            known_by: BTreeMap::new(),
            outbox: VecDeque::new(),
            unsent: BTreeSet::new(),
            syncs_pending: BTreeMap::new(),
            last_now: Time::ZERO,
            events: VecDeque::new(),
            stats: GmsStats::default(),
            replicated: None,
            decisions: VecDeque::new(),
            removing: BTreeSet::new(),
            requests_decided: BTreeMap::new(),
            acks_decided: BTreeMap::new(),
            datagram_key: None,
            region_keys: BTreeMap::new(),
            last_key_id: 0,
            key_entropy: None,
            key_deciding: false,
        })
    }

    /// Whether the service wants 32 bytes of fresh entropy for its master datagram secret
    /// ([`give_key_entropy`](Gms::give_key_entropy)): with [`GmsConfig::datagram_keys`], while
    /// it has neither a secret nor entropy for one. A host asks after every input.
    #[must_use]
    pub fn wants_key_entropy(&self) -> bool {
        self.config.datagram_keys && self.datagram_key.is_none() && self.key_entropy.is_none()
    }

    /// Entropy for the master datagram secret, drawn by the host from a cryptographic RNG (the
    /// simulator, from its seed). The service keeps one; a leader without a secret decides one
    /// from it at once.
    pub fn give_key_entropy(&mut self, bytes: [u8; 32]) {
        if self.config.datagram_keys {
            self.key_entropy = Some(bytes);
            self.rotate_key_if_due();
        }
    }

    /// The id of the master datagram secret, if one was drawn.
    #[must_use]
    pub fn datagram_key_id(&self) -> Option<u32> {
        self.datagram_key.as_ref().map(|(id, _)| *id)
    }

    /// The id of `region`'s current key (ADR 43), with [`GmsConfig::datagram_keys`].
    #[must_use]
    pub fn region_key_id(&self, region: RegionId) -> Option<u32> {
        self.region_keys.get(&region).copied()
    }

    /// `region`'s current key, id and secret, as its holders are sent it: `None` without a
    /// master secret or for a region without a key.
    #[must_use]
    pub fn region_key(&self, region: RegionId) -> Option<(u32, [u8; 32])> {
        let id = *self.region_keys.get(&region)?;
        let (_, master) = self.datagram_key.as_ref()?;
        Some((id, self.derive(region, id, master)))
    }

    /// The nodes that hold `region`'s key: those sent its view (its members and the
    /// publishers of its topics) and not told it is gone.
    pub fn region_key_holders(&self, region: RegionId) -> impl Iterator<Item = NodeId> + '_ {
        self.known_by.get(&region).into_iter().flatten().copied()
    }

    fn derive(&self, region: RegionId, id: u32, master: &WireKey) -> [u8; 32] {
        tidings_seal::derive_region_key(&master.0, self.incarnation, region.0, id)
    }

    /// Gives `region` a new key (if it has one: with [`GmsConfig::datagram_keys`]) and queues
    /// a sync of the region for every node that holds its key, which sends them the new one.
    /// Deterministic in the applied log, so every replica gives the same ids.
    fn rekey(&mut self, region: RegionId) {
        if !self.region_keys.contains_key(&region) {
            return;
        }
        // Ids are never reused within an incarnation. Past the last one the region loses its
        // key: its holders keep the one they have, and nobody is sent it again (a node that
        // left and came back would otherwise seal under it from counter 0 once more).
        let Some(id) = self.last_key_id.checked_add(1) else {
            self.region_keys.remove(&region);
            return;
        };
        self.last_key_id = id;
        self.region_keys.insert(region, id);
        self.stats.region_keys_made += 1;
        for &k in self.known_by.get(&region).into_iter().flatten() {
            self.syncs_pending
                .entry(k)
                .or_default()
                .regions
                .insert(region);
        }
    }

    /// Decides the master datagram secret when there is none and the host gave entropy; only
    /// where the service leads, one in flight at a time.
    fn rotate_key_if_due(&mut self) {
        if !self.config.datagram_keys
            || !self.is_leading()
            || self.key_deciding
            || self.datagram_key.is_some()
        {
            return;
        }
        let Some(secret) = self.key_entropy.take() else {
            return;
        };
        let id = self.datagram_key_id().unwrap_or(0).wrapping_add(1).max(1);
        self.key_deciding = true;
        self.stats.keys_drawn += 1;
        let now = self.last_now;
        self.decide(
            now,
            Decision::Command(Command::DatagramKey {
                id,
                secret: WireKey(secret),
            }),
        );
    }

    /// A service run as one replica of a replicated log (ADR 32), starting as a follower: it
    /// changes its state only in [`apply_decision`](Gms::apply_decision), and sends nothing
    /// until [`lead`](Gms::lead). As leader, what it decides from its inputs comes out of
    /// [`poll_decision`](Gms::poll_decision) for the log instead of being applied.
    pub fn new_replicated(config: GmsConfig) -> Result<Gms, ConfigError> {
        let mut gms = Gms::new(config)?;
        gms.replicated = Some(Role::Follower);
        gms.incarnation = 0;
        Ok(gms)
    }

    /// Whether this is a replica that leads (always true of a single-process service).
    #[must_use]
    pub fn is_leading(&self) -> bool {
        self.replicated != Some(Role::Follower)
    }

    /// A replica becomes the leader at `now`, having applied every committed decision. What
    /// was not replicated is rebuilt: every member gets a fresh heartbeat deadline (nobody is
    /// removed for the silence of the election), and every unacknowledged update is sent
    /// again from the last replicated acknowledgement (clients drop the duplicates by sequence
    /// number).
    pub fn lead(&mut self, now: Time) {
        if self.replicated.is_none() {
            return;
        }
        self.replicated = Some(Role::Leader);
        self.last_now = self.last_now.max(now);
        self.clear_decided();
        self.key_deciding = false;
        if self.incarnation == 0 {
            // The service's first leader: its incarnation goes first into the log, ahead of
            // any join it welcomes.
            self.decisions
                .push_back(Decision::Command(Command::Incarnate {
                    incarnation: self.config.incarnation,
                }));
        }
        for e in self.nodes.values_mut() {
            e.last_heard = now;
            e.suspected = None;
            e.probes_sent = 0;
            for p in &mut e.queue {
                p.sent_at = None;
                p.attempts = 0;
            }
        }
        self.unsent = self.nodes.keys().copied().collect();
    }

    /// A replica stops leading: what it decided and did not apply is dropped (the new leader
    /// decides again from what it hears), and it sends nothing more.
    pub fn follow(&mut self) {
        if self.replicated.is_none() {
            return;
        }
        self.replicated = Some(Role::Follower);
        self.clear_decided();
        self.outbox.clear();
        self.unsent.clear();
    }

    fn clear_decided(&mut self) {
        self.decisions.clear();
        self.removing.clear();
        self.requests_decided.clear();
        self.acks_decided.clear();
    }

    /// The next decision a replicated leader made, to append to the log.
    pub fn poll_decision(&mut self) -> Option<Decision> {
        self.rotate_key_if_due();
        self.decisions.pop_front()
    }

    /// Applies a decision: at once in a single-process service, and on every replica for each
    /// committed one in log order, at the time the leader stamped on it. A replica then
    /// computes at once what every member must be told (identically on every replica, so a
    /// member's update stream is numbered alike by each).
    pub fn apply_decision(&mut self, now: Time, decision: Decision) {
        self.last_now = self.last_now.max(now);
        match decision {
            Decision::Command(cmd) => {
                if let Command::Remove { node, .. } = cmd {
                    self.removing.remove(&node);
                }
                self.apply(now, cmd);
            }
            Decision::Request { node, req, command } => self.take_request(now, node, req, command),
            Decision::Acked { node, upto } => self.on_ack(node, upto),
        }
        if self.replicated.is_some() {
            self.run_syncs();
        }
    }

    /// Encodes the replicated state (postcard): with the log index it was taken at, all a
    /// replica needs to catch up without the log before it.
    #[must_use]
    pub fn snapshot(&self) -> Vec<u8> {
        let state = StateRef {
            planner: &self.planner,
            nodes: &self.nodes,
            addressed_members: self.addressed_members,
            joins: &self.joins,
            next_node: self.next_node,
            topic_ids: &self.topic_ids,
            next_topic: self.next_topic,
            views: &self.views,
            bases: &self.bases,
            addresses: &self.addresses,
            groups: &self.groups,
            publishers: &self.publishers,
            known_by: &self.known_by,
            last_now: self.last_now,
            incarnation: self.incarnation,
            datagram_key: &self.datagram_key,
            region_keys: &self.region_keys,
            last_key_id: self.last_key_id,
        };
        postcard::to_allocvec(&state).unwrap_or_default()
    }

    /// Replaces the replicated state with a [`snapshot`](Gms::snapshot)'s. Soft state starts
    /// afresh (a replica restores as a follower; [`lead`](Gms::lead) rebuilds the rest).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let state: State =
            postcard::from_bytes(bytes).map_err(|e| SnapshotError::Decode(e.to_string()))?;
        self.planner = state.planner;
        self.planner.set_config(self.config.planner.clone());
        self.nodes = state.nodes;
        self.addressed_members = state.addressed_members;
        self.joins = state.joins;
        self.next_node = state.next_node;
        self.topic_ids = state.topic_ids;
        self.next_topic = state.next_topic;
        self.views = state.views;
        self.bases = state.bases;
        self.addresses = state.addresses;
        self.groups = state.groups;
        self.publishers = state.publishers;
        self.known_by = state.known_by;
        self.last_now = state.last_now;
        self.incarnation = state.incarnation;
        self.datagram_key = state.datagram_key;
        self.region_keys = state.region_keys;
        self.last_key_id = state.last_key_id;
        self.syncs_pending.clear();
        self.unsent.clear();
        self.outbox.clear();
        self.clear_decided();
        Ok(())
    }

    /// In a single-process service applies `decision` at once; in a replicated leader queues
    /// it for the log.
    fn decide(&mut self, now: Time, decision: Decision) {
        match self.replicated {
            None => self.apply_decision(now, decision),
            Some(_) => self.decisions.push_back(decision),
        }
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &GmsConfig {
        &self.config
    }

    /// The service's incarnation, which its welcomes carry and its members' protocol nodes
    /// write in every packet; 0 until a replicated service's first leader decided it.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> &GmsStats {
        &self.stats
    }

    /// The region planner (read only).
    #[must_use]
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The members, sorted.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// Where the service stands with `node`: its requests taken, its updates not yet
    /// acknowledged, when it was last heard from. For diagnostics (a host's status report).
    #[must_use]
    pub fn member_state(&self, node: NodeId) -> Option<MemberState> {
        let e = self.nodes.get(&node)?;
        Some(MemberState {
            requests_taken: e.req_upto,
            updates_unacknowledged: e.queue.len(),
            updates_sent_max_attempts: e.queue.iter().map(|p| p.attempts).max().unwrap_or(0),
            last_heard: e.last_heard,
            publishes: e.publishes.len(),
            suspected: e.suspected.is_some(),
        })
    }

    /// Where a member receives datagrams, as its `Join` said (replicated: every replica knows
    /// it, so a new leader's host can reach the members another replica welcomed).
    #[must_use]
    pub fn member_addr(&self, node: NodeId) -> Option<SocketAddr> {
        self.nodes.get(&node).and_then(|e| e.addr)
    }

    /// The members that serve metrics, with where (their [`Request::MetricsAt`]), by node id.
    /// An endpoint bound to every interface (`0.0.0.0`, `::`) is given at the IP of the
    /// member's data address, where known: the one its peers reach it at.
    pub fn member_metrics(&self) -> impl Iterator<Item = (NodeId, SocketAddr)> + '_ {
        self.nodes.iter().filter_map(|(&node, e)| {
            let mut at = e.metrics?;
            if let Some(data) = e.addr.filter(|_| at.ip().is_unspecified()) {
                at.set_ip(data.ip());
            }
            Some((node, at))
        })
    }

    /// The id bound to a topic name.
    #[must_use]
    pub fn topic_id(&self, name: &str) -> Option<TopicId> {
        self.topic_ids.get(name).copied()
    }

    /// Every topic name bound to an id, sorted by name.
    pub fn topics(&self) -> impl Iterator<Item = (&str, TopicId)> + '_ {
        self.topic_ids.iter().map(|(name, &id)| (name.as_str(), id))
    }

    /// The current epoch of a region's view.
    #[must_use]
    pub fn view_of(&self, region: RegionId) -> Option<ViewId> {
        self.views.get(&region).copied()
    }

    /// The base of a region's current view: the epoch its streams began at (ADR 30).
    #[must_use]
    pub fn base_of(&self, region: RegionId) -> Option<ViewId> {
        self.bases.get(&region).copied()
    }

    /// The address of a region.
    #[must_use]
    pub fn address_of(&self, region: RegionId) -> Option<RegionAddress> {
        self.addresses.get(&region).copied()
    }

    /// A datagram from `from`. Malformed ones are counted and dropped.
    pub fn handle_datagram(&mut self, now: Time, from: Peer, bytes: &[u8]) {
        match GmsMessage::decode(bytes) {
            Ok(msg) => self.handle_message(now, from, msg),
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// A decoded message from `from`.
    pub fn handle_message(&mut self, now: Time, from: Peer, msg: GmsMessage) {
        self.handle_message_as(now, from, None, msg);
    }

    /// A decoded message from `from`, whose admitted GMS link proved it holds `identity`
    /// (the host's `ServiceLink` knows it; `None` without admission): the access rules
    /// (`GmsConfig::acl`) are checked against it.
    pub fn handle_message_as(
        &mut self,
        now: Time,
        from: Peer,
        identity: Option<&PublicKey>,
        msg: GmsMessage,
    ) {
        if !self.is_leading() {
            // A follower replica serves no client (its host redirects them).
            self.stats.unexpected += 1;
            return;
        }
        self.last_now = self.last_now.max(now);
        match (from, msg) {
            (_, GmsMessage::Join { nonce, addr }) => self.on_join(now, nonce, addr),
            (Peer::Node(node), msg) => {
                let Some(entry) = self.nodes.get_mut(&node) else {
                    // A removed (or never joined) node: tell it, so it can rejoin.
                    self.stats.unexpected += 1;
                    self.outbox.push_back(GmsTransmit {
                        to: Peer::Node(node),
                        msg: GmsMessage::Update {
                            seq: 0,
                            items: vec![Item::Removed],
                        },
                    });
                    return;
                };
                entry.last_heard = now;
                // Heard from: whatever a neighbour suspected, it is alive.
                entry.suspected = None;
                entry.probes_sent = 0;
                match msg {
                    GmsMessage::Heartbeat => {}
                    GmsMessage::Ack { upto } => self.on_ack_received(now, node, upto),
                    GmsMessage::Request { req, body } => {
                        self.on_request(now, node, req, body, identity);
                    }
                    _ => self.stats.unexpected += 1,
                }
            }
            (Peer::Joiner(_), _) => self.stats.unexpected += 1,
        }
    }

    /// Time has passed: failure detection and retransmission.
    pub fn handle_timeout(&mut self, now: Time) {
        if !self.is_leading() {
            return;
        }
        self.last_now = self.last_now.max(now);
        let mut failed: Vec<(NodeId, RemoveCause)> = Vec::new();
        for (&node, e) in &self.nodes {
            if self.removing.contains(&node) {
                continue;
            }
            if now >= e.last_heard + self.config.heartbeat_timeout {
                failed.push((node, RemoveCause::HeartbeatTimeout));
            } else if e
                .suspected
                .is_some_and(|at| now >= at + self.config.suspicion_timeout)
            {
                failed.push((node, RemoveCause::Suspected));
            } else if Self::in_window(e, &self.config)
                .any(|p| p.attempts >= self.config.retransmit_attempts_max && self.due(p, now))
            {
                failed.push((node, RemoveCause::Unresponsive));
            } else if self.replicated.is_some() && e.queue.len() > self.config.updates_queued_max {
                // A replica applying a command does not decide removals: the leader does here.
                failed.push((node, RemoveCause::Unresponsive));
            }
        }
        for (node, cause) in failed {
            if self.replicated.is_some() {
                self.removing.insert(node);
            }
            self.decide(now, Decision::Command(Command::Remove { node, cause }));
        }
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for &node in &nodes {
            self.send_window(now, node);
        }
        for node in nodes {
            self.send_probes(now, node);
        }
    }

    /// When the next probe of a node suspected since `at` is due, after `sent` probes; `None`
    /// once all are sent. Probe `k` is due `k` `suspicion_timeout / suspicion_probes` after
    /// the suspicion.
    fn probe_due(&self, at: Time, sent: u32) -> Option<Time> {
        let probes = self.config.suspicion_probes;
        (sent < probes).then(|| at + self.config.suspicion_timeout * sent / probes)
    }

    /// Sends a suspected node the probe that is due, if any (one, even if several fell due
    /// while the service was not called: they would arrive together).
    fn send_probes(&mut self, now: Time, node: NodeId) {
        let Some(e) = self.nodes.get(&node) else {
            return;
        };
        let Some(at) = e.suspected else {
            return;
        };
        let mut sent = e.probes_sent;
        let mut due = false;
        while self.probe_due(at, sent).is_some_and(|t| t <= now) {
            sent += 1;
            due = true;
        }
        if !due {
            return;
        }
        if let Some(e) = self.nodes.get_mut(&node) {
            e.probes_sent = sent;
        }
        self.stats.probes_sent += 1;
        self.outbox.push_back(GmsTransmit {
            to: Peer::Node(node),
            msg: GmsMessage::Probe,
        });
    }

    /// The next time [`handle_timeout`](Gms::handle_timeout) must be called: the earliest of every
    /// member's liveness deadline and retransmission deadline.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        if !self.is_leading() {
            return None;
        }
        self.nodes
            .iter()
            .filter(|(node, _)| !self.removing.contains(node))
            .flat_map(|(_, e)| {
                let heartbeat = e.last_heard + self.config.heartbeat_timeout;
                let live = match e.suspected {
                    Some(at) => {
                        let removal = heartbeat.min(at + self.config.suspicion_timeout);
                        self.probe_due(at, e.probes_sent)
                            .map_or(removal, |p| removal.min(p))
                    }
                    None => heartbeat,
                };
                let resend = Self::in_window(e, &self.config)
                    .filter_map(|p| p.sent_at)
                    .min()
                    .map(|t| t + self.config.retransmit_interval);
                std::iter::once(live).chain(resend)
            })
            .min()
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<GmsTransmit> {
        self.rotate_key_if_due();
        self.run_syncs();
        if !self.is_leading() {
            self.unsent.clear();
            self.outbox.clear();
            return None;
        }
        while let Some(node) = self.unsent.pop_first() {
            self.send_window(self.last_now, node);
        }
        self.outbox.pop_front()
    }

    /// Runs the pending syncs. A sync may remove an unresponsive node, which queues more
    /// syncs: until none is left.
    fn run_syncs(&mut self) {
        while let Some((node, scope)) = self.syncs_pending.pop_first() {
            self.sync(self.last_now, node, scope);
        }
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<GmsEvent> {
        self.events.pop_front()
    }

    /// Applies one state change and queues the updates it causes. Public so that a host can
    /// replay or replicate a command log; [`handle_message`](Gms::handle_message) and
    /// [`handle_timeout`](Gms::handle_timeout) call it for every change they make.
    pub fn apply(&mut self, now: Time, cmd: Command) {
        self.last_now = self.last_now.max(now);
        self.stats.commands += 1;
        match cmd {
            Command::Join { nonce, addr } => {
                if self.joins.contains_key(&nonce) || self.nodes.len() >= self.config.nodes_max {
                    return;
                }
                let node = NodeId(self.next_node);
                self.next_node = self.next_node.saturating_add(1);
                self.joins.insert(nonce, node);
                self.addressed_members += usize::from(addr.is_some());
                self.nodes.insert(
                    node,
                    NodeEntry {
                        nonce,
                        last_heard: now,
                        suspected: None,
                        probes_sent: 0,
                        publishes: BTreeSet::new(),
                        req_upto: 0,
                        next_seq: 1,
                        queue: VecDeque::new(),
                        known_regions: BTreeMap::new(),
                        known_keys: BTreeMap::new(),
                        known_topics: BTreeMap::new(),
                        addr,
                        told_addresses: BTreeSet::new(),
                        metrics: None,
                    },
                );
                self.events.push_back(GmsEvent::Joined(node));
                // The Welcome goes out before the first update, so the joiner knows its id when
                // the update arrives.
                self.outbox.push_back(GmsTransmit {
                    to: Peer::Joiner(nonce),
                    msg: GmsMessage::Welcome {
                        nonce,
                        node,
                        incarnation: self.incarnation,
                    },
                });
                // An empty first batch: the node learns it has an (empty) membership.
                self.push_items(now, node, vec![Item::Commit]);
            }
            Command::Subscribe { node, .. }
            | Command::SubscribeMany { node, .. }
            | Command::Unsubscribe { node, .. }
            | Command::UnsubscribeMany { node, .. }
            | Command::Advertise { node, .. }
            | Command::AdvertiseMany { node, .. }
            | Command::Unadvertise { node, .. }
            | Command::Refuse { node, .. }
                if !self.nodes.contains_key(&node) =>
            {
                self.stats.requests_refused += 1;
            }
            Command::Subscribe { node, name } => self.subscribe(now, node, vec![name]),
            Command::SubscribeMany { node, names } => self.subscribe(now, node, names),
            Command::Unsubscribe { node, name } => self.unsubscribe(node, &[name]),
            Command::UnsubscribeMany { node, names } => self.unsubscribe(node, &names),
            Command::Advertise { node, name } => self.advertise(now, node, vec![name]),
            Command::AdvertiseMany { node, names } => self.advertise(now, node, names),
            Command::Unadvertise { node, name } => {
                let Some(topic) = self.topic_ids.get(&name).copied() else {
                    return;
                };
                if let Some(e) = self.nodes.get_mut(&node) {
                    e.publishes.remove(&topic);
                }
                if let Some(p) = self.publishers.get_mut(&topic) {
                    p.remove(&node);
                    if p.is_empty() {
                        self.publishers.remove(&topic);
                    }
                }
                let scope = SyncScope {
                    topics: [topic].into(),
                    ..SyncScope::default()
                };
                self.propagate(Changes::default(), [(node, scope)].into());
            }
            Command::Refuse {
                node,
                refusals,
                then,
            } => {
                self.stats.topics_refused += refusals.len() as u64;
                let items = refusals.into_iter().map(Item::Refused).collect();
                self.push_items(now, node, items);
                match then.map(|c| *c) {
                    // One level only: a nested refusal is not something the leader decides.
                    Some(Command::Refuse { .. }) | None => {}
                    Some(cmd) => self.apply(now, cmd),
                }
            }
            Command::MetricsAt { node, addr } => {
                if let Some(e) = self.nodes.get_mut(&node) {
                    e.metrics = addr;
                }
            }
            Command::Incarnate { incarnation } => {
                if self.incarnation == 0 {
                    self.incarnation = incarnation;
                }
            }
            Command::DatagramKey { id, secret } => {
                self.key_deciding = false;
                if self.datagram_key_id().is_some_and(|current| id <= current) {
                    return;
                }
                self.datagram_key = Some((id, secret));
                // Every region's key is derived anew, under a new id, and sent to its holders.
                let regions: Vec<RegionId> = self.region_keys.keys().copied().collect();
                for r in regions {
                    self.rekey(r);
                }
            }
            Command::RenewRegionKey { region, id } => {
                if self.region_keys.get(&region) == Some(&id) {
                    self.rekey(region);
                }
            }
            Command::Remove { node, cause } => {
                let Some(e) = self.nodes.remove(&node) else {
                    return;
                };
                self.addressed_members -= usize::from(e.addr.is_some());
                self.joins.remove(&e.nonce);
                for t in &e.publishes {
                    if let Some(p) = self.publishers.get_mut(t) {
                        p.remove(&node);
                        if p.is_empty() {
                            self.publishers.remove(t);
                        }
                    }
                }
                for r in e.known_regions.keys() {
                    if let Some(k) = self.known_by.get_mut(r) {
                        k.remove(&node);
                    }
                }
                // What its regions carry from now on is sealed under keys it never gets.
                for &r in e.known_keys.keys() {
                    self.rekey(r);
                }
                // Best effort (its stream is gone): tell the node, in case it is alive.
                self.outbox.push_back(GmsTransmit {
                    to: Peer::Node(node),
                    msg: GmsMessage::Update {
                        seq: 0,
                        items: vec![Item::Removed],
                    },
                });
                self.events.push_back(GmsEvent::Removed { node, cause });
                let ch = self.planner.remove_node(node);
                self.propagate(ch, BTreeMap::new());
            }
        }
    }

    fn bind(&mut self, name: &str) -> Option<TopicId> {
        if let Some(&t) = self.topic_ids.get(name) {
            return Some(t);
        }
        if name.is_empty()
            || name.len() > TOPIC_NAME_BYTES_MAX
            || self.topic_ids.len() >= self.config.topics_max
        {
            self.stats.requests_refused += 1;
            return None;
        }
        let topic = TopicId(self.next_topic);
        self.next_topic = self.next_topic.saturating_add(1);
        self.topic_ids.insert(name.to_owned(), topic);
        self.events.push_back(GmsEvent::TopicCreated {
            name: name.to_owned(),
            topic,
        });
        Some(topic)
    }

    /// `node` subscribes to the topics of `names` (bound if new): the planner's changes of each
    /// subscription are folded into one set, so that every region touched gets one new view
    /// and every node concerned one update.
    fn subscribe(&mut self, now: Time, node: NodeId, names: Vec<String>) {
        let mut ch = Changes::default();
        let mut bound = Vec::with_capacity(names.len());
        for name in names {
            let Some(topic) = self.bind(&name) else {
                continue;
            };
            ch.merge(self.planner.subscribe(node, topic));
            bound.push(Item::TopicBound { name, topic });
        }
        if bound.is_empty() {
            // Nothing bound (the topic limit): nothing to tell.
            return;
        }
        self.push_items(now, node, bound);
        // The regions the node joined are in `ch`.
        self.propagate(ch, [(node, SyncScope::default())].into());
    }

    /// `node` leaves the topics of `names` it subscribes to (names never bound are skipped), in
    /// one round of views: the planner's changes of each are folded together.
    fn unsubscribe(&mut self, node: NodeId, names: &[String]) {
        let mut ch = Changes::default();
        let mut known = false;
        for name in names {
            if let Some(&topic) = self.topic_ids.get(name) {
                ch.merge(self.planner.unsubscribe(node, topic));
                known = true;
            }
        }
        if !known {
            return;
        }
        // The node's regions before and after are in `ch`; itself is synced even if nothing
        // changed (its request's batch gets a Commit).
        self.propagate(ch, [(node, SyncScope::default())].into());
    }

    /// `node` publishes on the topics of `names` (bound if new): it is told their ids and
    /// regions, and the members of those regions its address, in one round of updates.
    fn advertise(&mut self, now: Time, node: NodeId, names: Vec<String>) {
        let mut bound = Vec::with_capacity(names.len());
        // The members of the topics' regions learn the new publisher's address (its
        // acknowledgements and repairs go there).
        let mut also: BTreeMap<NodeId, SyncScope> = [(node, SyncScope::default())].into();
        // Marked once each after the loop: the topics of a batch often share their regions,
        // and marking a region goes over all its topics (up to `subset_topics_max`).
        let mut audiences: BTreeSet<RegionId> = BTreeSet::new();
        for name in names {
            let Some(topic) = self.bind(&name) else {
                continue;
            };
            if let Some(e) = self.nodes.get_mut(&node) {
                e.publishes.insert(topic);
            }
            self.publishers.entry(topic).or_default().insert(node);
            bound.push(Item::TopicBound { name, topic });
            also.entry(node).or_default().topics.insert(topic);
            audiences.extend(self.planner.topic_regions(topic));
        }
        for r in audiences {
            self.mark_audience(&mut also, r);
        }
        if bound.is_empty() {
            // Nothing bound (the topic limit): nothing to tell, as for a single request.
            return;
        }
        self.push_items(now, node, bound);
        self.propagate(Changes::default(), also);
    }

    fn on_join(&mut self, now: Time, nonce: u64, addr: Option<SocketAddr>) {
        if !self.joins.contains_key(&nonce) {
            if self.nodes.len() >= self.config.nodes_max {
                self.stats.joins_refused += 1;
                return;
            }
            self.decide(now, Decision::Command(Command::Join { nonce, addr }));
        } else if let Some(&node) = self.joins.get(&nonce) {
            let member_addr = self.nodes.get(&node).and_then(|e| e.addr);
            if addr.is_some() && member_addr.is_some() && addr != member_addr {
                self.stats.joins_conflicting += 1;
                self.outbox.push_back(GmsTransmit {
                    to: Peer::Joiner(nonce),
                    msg: GmsMessage::NonceTaken { nonce },
                });
                return;
            }
            // A repeated Join whose Welcome was lost.
            self.outbox.push_back(GmsTransmit {
                to: Peer::Joiner(nonce),
                msg: GmsMessage::Welcome {
                    nonce,
                    node,
                    incarnation: self.incarnation,
                },
            });
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        node: NodeId,
        req: u64,
        body: Request,
        identity: Option<&PublicKey>,
    ) {
        let Some(e) = self.nodes.get(&node) else {
            return;
        };
        let upto = e.req_upto;
        // A replicated leader takes the next request while earlier ones wait for their commit.
        let decided = self.requests_decided.get(&node).copied().unwrap_or(0);
        if req <= upto {
            self.stats.requests_duplicate += 1;
        } else if req <= decided {
            // Decided, not yet committed: its commit acknowledges it.
            self.stats.requests_duplicate += 1;
            return;
        } else if req > upto.max(decided) + 1 {
            self.stats.requests_out_of_order += 1;
        } else {
            let command = match body {
                Request::Subscribe(name) => Some(Command::Subscribe { node, name }),
                Request::SubscribeMany(names) => Some(Command::SubscribeMany { node, names }),
                Request::Unsubscribe(name) => Some(Command::Unsubscribe { node, name }),
                Request::UnsubscribeMany(names) => Some(Command::UnsubscribeMany { node, names }),
                Request::Advertise(name) => Some(Command::Advertise { node, name }),
                Request::AdvertiseMany(names) => Some(Command::AdvertiseMany { node, names }),
                Request::Unadvertise(name) => Some(Command::Unadvertise { node, name }),
                Request::Suspect(suspect) => {
                    self.on_suspect(now, node, suspect);
                    None
                }
                Request::MetricsAt(addr) => Some(Command::MetricsAt { node, addr }),
                Request::RenewDatagramKey(id) => {
                    // Key ids are unique over the regions: the id names its region. A key
                    // replaced meanwhile (another holder asked first) names none, or is
                    // ignored when applied.
                    let region = self
                        .region_keys
                        .iter()
                        .find(|&(_, &k)| k == id)
                        .map(|(&r, _)| r);
                    region.map(|region| {
                        self.stats.key_renewals_asked += 1;
                        Command::RenewRegionKey { region, id }
                    })
                }
                Request::Leave => Some(Command::Remove {
                    node,
                    cause: RemoveCause::Left,
                }),
            };
            let command = command.map(|c| self.check_access(node, identity, c));
            if self.replicated.is_some() {
                self.requests_decided.insert(node, req);
            }
            // Its application acknowledges it.
            self.decide(now, Decision::Request { node, req, command });
            return;
        }
        self.outbox.push_back(GmsTransmit {
            to: Peer::Node(node),
            msg: GmsMessage::RequestAck { upto },
        });
    }

    /// The command with the topics the access rules refuse to `identity` taken out into a
    /// [`Command::Refuse`]; unchanged when every topic is allowed (always, without rules).
    fn check_access(&self, node: NodeId, identity: Option<&PublicKey>, cmd: Command) -> Command {
        let acl = &self.config.acl;
        if acl.is_empty() {
            return cmd;
        }
        let (action, names, many) = match cmd {
            Command::Subscribe { name, .. } => (AclAction::Subscribe, vec![name], false),
            Command::SubscribeMany { names, .. } => (AclAction::Subscribe, names, true),
            Command::Advertise { name, .. } => (AclAction::Publish, vec![name], false),
            Command::AdvertiseMany { names, .. } => (AclAction::Publish, names, true),
            other => return other,
        };
        let mut allowed = Vec::with_capacity(names.len());
        let mut refusals = Vec::new();
        for name in names {
            match acl.check(identity, action, &name) {
                Ok(()) => allowed.push(name),
                Err(rule) => refusals.push(TopicRefusal {
                    topic: name,
                    action,
                    rule,
                }),
            }
        }
        let rest = |mut allowed: Vec<String>| match (action, many) {
            (AclAction::Subscribe, false) => Command::Subscribe {
                node,
                name: allowed.pop().unwrap_or_default(),
            },
            (AclAction::Subscribe, true) => Command::SubscribeMany {
                node,
                names: allowed,
            },
            (AclAction::Publish, false) => Command::Advertise {
                node,
                name: allowed.pop().unwrap_or_default(),
            },
            (AclAction::Publish, true) => Command::AdvertiseMany {
                node,
                names: allowed,
            },
        };
        if refusals.is_empty() {
            return rest(allowed);
        }
        Command::Refuse {
            node,
            refusals,
            then: (!allowed.is_empty()).then(|| Box::new(rest(allowed))),
        }
    }

    /// Takes request `req` of `node` if it is the next one, applying its command, and
    /// acknowledges it.
    fn take_request(&mut self, now: Time, node: NodeId, req: u64, command: Option<Command>) {
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        if req != e.req_upto + 1 {
            self.stats.requests_duplicate += 1;
            return;
        }
        e.req_upto = req;
        match command {
            Some(Command::Remove { node, cause }) => {
                // Acknowledge before the entry is gone, so the client can stop resending.
                self.outbox.push_back(GmsTransmit {
                    to: Peer::Node(node),
                    msg: GmsMessage::RequestAck { upto: req },
                });
                self.apply(now, Command::Remove { node, cause });
                return;
            }
            Some(cmd) => self.apply(now, cmd),
            None => {}
        }
        if let Some(e) = self.nodes.get(&node) {
            self.outbox.push_back(GmsTransmit {
                to: Peer::Node(node),
                msg: GmsMessage::RequestAck { upto: e.req_upto },
            });
        }
    }

    /// Accepts a suspicion only from a node that shares a token ring with the suspect in some
    /// region both are in: a member of the same partition (the partition ring), or, for a
    /// partition leader, another partition leader (the rings of leaders above it). These are the
    /// rings whose silence the protocol reports (`tidings_proto::Event::Suspect`). Anyone else's
    /// suspicion could be used to evict arbitrary nodes.
    fn on_suspect(&mut self, now: Time, by: NodeId, suspect: NodeId) {
        let partition_size = self.config.partition_size;
        let neighbour = by != suspect
            && self.planner.node_regions(by).any(|(_, r)| {
                self.planner.region(r).is_some_and(|reg| {
                    if !reg.members.contains(&suspect) {
                        return false;
                    }
                    let members: Vec<NodeId> = reg.members.iter().copied().collect();
                    let partitions =
                        tidings_proto::RegionView::partitioned(&members, partition_size);
                    let of = |n: NodeId| partitions.iter().position(|p| p.contains(&n));
                    let leader = |n: NodeId| partitions.iter().any(|p| p.first() == Some(&n));
                    match (of(by), of(suspect)) {
                        (Some(a), Some(b)) => a == b || (leader(by) && leader(suspect)),
                        _ => false,
                    }
                })
            });
        match self.nodes.get_mut(&suspect) {
            Some(e) if neighbour => {
                e.suspected.get_or_insert(now);
                self.stats.suspicions_accepted += 1;
                // The first probe at once (the others from `handle_timeout`).
                self.send_probes(now, suspect);
            }
            _ => self.stats.suspicions_ignored += 1,
        }
    }

    /// An acknowledgement from a member: applied at once by a single-process service, decided
    /// (once per advance) by a replicated leader.
    fn on_ack_received(&mut self, now: Time, node: NodeId, upto: u64) {
        if self.replicated.is_none() {
            self.on_ack(node, upto);
            return;
        }
        let front = self
            .nodes
            .get(&node)
            .and_then(|e| e.queue.front().map(|p| p.seq));
        let decided = self.acks_decided.get(&node).copied().unwrap_or(0);
        if upto > decided && front.is_some_and(|s| s <= upto) {
            self.acks_decided.insert(node, upto);
            self.decide(now, Decision::Acked { node, upto });
        }
    }

    fn on_ack(&mut self, node: NodeId, upto: u64) {
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        while e.queue.front().is_some_and(|p| p.seq <= upto) {
            e.queue.pop_front();
        }
        self.unsent.insert(node);
    }

    /// The first `updates_inflight_max` items of `e`'s queue: every item ever sent is among them
    /// (only these are sent, and the queue only loses items at the front), so timers need look
    /// no further. The queue of a node that stopped acknowledging grows long until it is
    /// removed, and this is read on every `poll_timeout`.
    fn in_window<'a>(e: &'a NodeEntry, config: &GmsConfig) -> impl Iterator<Item = &'a Pending> {
        e.queue.iter().take(config.updates_inflight_max)
    }

    fn due(&self, p: &Pending, now: Time) -> bool {
        p.sent_at
            .is_some_and(|t| now >= t + self.config.retransmit_interval)
    }

    /// Sends what the window allows: first sends of queued items, and resends of timed-out ones.
    /// Consecutive items leave packed in one [`GmsMessage::Update`] of at most
    /// `update_bytes_max` bytes (a single larger item goes alone).
    fn send_window(&mut self, now: Time, node: NodeId) {
        let interval = self.config.retransmit_interval;
        let inflight_max = self.config.updates_inflight_max;
        let bytes_max = self.config.update_bytes_max;
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        // The run being packed: its first sequence number, items and encoded size.
        let mut run: Option<(u64, Vec<Item>, usize)> = None;
        let outbox = &mut self.outbox;
        let mut flush = |run: &mut Option<(u64, Vec<Item>, usize)>| {
            if let Some((seq, items, _)) = run.take() {
                outbox.push_back(GmsTransmit {
                    to: Peer::Node(node),
                    msg: GmsMessage::Update { seq, items },
                });
            }
        };
        for p in e.queue.iter_mut().take(inflight_max) {
            let send = match p.sent_at {
                None => {
                    self.stats.updates_sent += 1;
                    true
                }
                Some(t) if now >= t + interval => {
                    self.stats.updates_retransmitted += 1;
                    true
                }
                Some(_) => false,
            };
            if !send {
                flush(&mut run);
                continue;
            }
            p.sent_at = Some(now);
            p.attempts += 1;
            let len = item_len(&p.item);
            let fits = run.as_ref().is_some_and(|(first, items, bytes)| {
                *first + items.len() as u64 == p.seq
                    && items.len() < ITEMS_PER_UPDATE_MAX
                    && bytes + len <= bytes_max
            });
            if !fits {
                flush(&mut run);
                run = Some((p.seq, Vec::new(), UPDATE_HEADER_BYTES));
            }
            if let Some((_, items, bytes)) = run.as_mut() {
                items.push(p.item.clone());
                *bytes += len;
            }
        }
        flush(&mut run);
    }

    fn push_items(&mut self, now: Time, node: NodeId, items: Vec<Item>) {
        let Some(e) = self.nodes.get_mut(&node) else {
            return;
        };
        for item in items {
            e.queue.push_back(Pending {
                seq: e.next_seq,
                item,
                sent_at: None,
                attempts: 0,
            });
            e.next_seq += 1;
        }
        if e.queue.len() > self.config.updates_queued_max && self.replicated.is_none() {
            self.apply(
                now,
                Command::Remove {
                    node,
                    cause: RemoveCause::Unresponsive,
                },
            );
            return;
        }
        self.unsent.insert(node);
    }

    /// Issues new views for what `ch` changed and queues each affected node (plus `also`) for a
    /// sync (the difference between what it knows and what it must know), done once per node
    /// in `poll_transmit` at the time `apply` recorded.
    fn propagate(&mut self, ch: Changes, also: BTreeMap<NodeId, SyncScope>) {
        for &r in &ch.regions_created {
            if self.config.datagram_keys {
                if let Some(id) = self.last_key_id.checked_add(1) {
                    self.last_key_id = id;
                    self.region_keys.insert(r, id);
                    self.stats.region_keys_made += 1;
                }
            }
            self.views.insert(r, ViewId(1));
            self.bases.insert(r, ViewId(1));
            self.stats.views_issued += 1;
            let address = match self.config.multicast_pool {
                Some(pool) => {
                    let i = self.groups.take(pool.groups());
                    if self.groups.load(i) > 1 {
                        self.stats.group_shares += 1;
                    }
                    RegionAddress::Multicast {
                        group: pool.address(i),
                        port: pool.port_of(i),
                    }
                }
                None => RegionAddress::Unicast,
            };
            self.addresses.insert(r, address);
        }
        for &r in &ch.regions_changed {
            if let Some(v) = self.views.get_mut(&r) {
                v.0 = v.0.saturating_add(1);
                self.stats.views_issued += 1;
                if ch.regions_restarted.contains(&r) {
                    self.bases.insert(r, *v);
                } else {
                    self.stats.views_continued += 1;
                }
            }
        }
        for &r in &ch.regions_removed {
            self.region_keys.remove(&r);
            self.views.remove(&r);
            self.bases.remove(&r);
            if let (Some(RegionAddress::Multicast { group, .. }), Some(pool)) =
                (self.addresses.remove(&r), self.config.multicast_pool)
            {
                let mask = pool.size().wrapping_sub(1);
                self.groups.release(u32::from_be_bytes(group) & mask);
            }
        }
        self.stats.regions_current = self.planner.region_count() as u64;
        let mut pending = std::mem::take(&mut self.syncs_pending);
        for (node, scope) in also {
            let p = pending.entry(node).or_default();
            p.regions.extend(scope.regions);
            p.topics.extend(scope.topics);
        }
        // Members and publishers of a new or changed region: their view of it, and the
        // addresses of its members and publishers. Each region once (below): marking goes over
        // all its topics, and a batch's topics often share their regions.
        let mut audiences: BTreeSet<RegionId> = ch
            .regions_created
            .iter()
            .chain(&ch.regions_changed)
            .copied()
            .collect();
        // Whoever was told of a changed or removed region: its new view, or that it is gone.
        for &r in ch.regions_changed.iter().chain(&ch.regions_removed) {
            for &k in self.known_by.get(&r).into_iter().flatten() {
                pending.entry(k).or_default().regions.insert(r);
            }
        }
        for &t in &ch.topics_changed {
            // The topic's publishers: its region list (the regions it left and joined are
            // added to the scope by `sync`).
            for &p in self.publishers.get(&t).into_iter().flatten() {
                pending.entry(p).or_default().topics.insert(t);
            }
            // The regions it is in now: their members and publishers talk to its publishers
            // (a topic may move into a region whose members do not change).
            audiences.extend(self.planner.topic_regions(t));
        }
        for r in audiences {
            self.mark_audience(&mut pending, r);
        }
        for r in &ch.regions_removed {
            self.known_by.remove(r);
        }
        self.syncs_pending = pending;
    }

    /// Adds region `r` to the sync scope of everyone who must know it and its nodes' addresses:
    /// its members and the publishers of its topics (a new member or publisher is someone
    /// they all talk to or may be told of).
    fn mark_audience(&self, pending: &mut BTreeMap<NodeId, SyncScope>, r: RegionId) {
        let Some(reg) = self.planner.region(r) else {
            return;
        };
        for &m in &reg.members {
            pending.entry(m).or_default().regions.insert(r);
        }
        // The topics of a region mostly share their publishers: each publisher's scope is
        // looked up once per run of topics it publishes, not once per topic.
        let mut last = None;
        for t in &reg.topics {
            for &p in self.publishers.get(t).into_iter().flatten() {
                if last != Some(p) {
                    pending.entry(p).or_default().regions.insert(r);
                    last = Some(p);
                }
            }
        }
    }

    /// Sends `node` what changed in the part of the membership that concerns it, as one batch:
    /// the differences, within `scope`, between what it was told and what it must know.
    ///
    /// This runs for every node a change touches (every publisher of a changed region's topics,
    /// so nearly every command for a node publishing many topics): it looks only at the regions
    /// and topics of `scope`, edits the node's record of what it knows in place, and allocates
    /// only for what goes out. Debug builds check after each sync that a pass over everything
    /// the node knows or must know would find nothing more to send.
    fn sync(&mut self, now: Time, node: NodeId, scope: SyncScope) {
        let (mut items, compared, dropped) = self.sync_items(node, scope);
        // The node no longer holds these regions' keys: they change for the rest.
        for r in dropped {
            self.rekey(r);
        }
        self.stats.syncs += 1;
        self.stats.sync_regions_compared += compared as u64;
        #[cfg(debug_assertions)]
        {
            let everything = self.full_scope(node);
            let (missed, _, _) = self.sync_items(node, everything);
            debug_assert!(
                missed.is_empty(),
                "a sync of {node:?} left out {missed:?}: its scope missed a change"
            );
        }
        if !items.is_empty() {
            items.push(Item::Commit);
        }
        // A batch made only of TopicBound items still needs its Commit.
        let needs_commit = items.is_empty()
            && self.nodes.get(&node).is_some_and(|e| {
                e.queue
                    .back()
                    .is_some_and(|p| !matches!(p.item, Item::Commit))
            });
        if needs_commit {
            items.push(Item::Commit);
        }
        if !items.is_empty() {
            self.push_items(now, node, items);
        }
    }

    /// Everything that concerns `node`: the regions it was told of or must know, and the topics
    /// it publishes or was told the regions of (what a sync looked at before scopes).
    #[cfg(debug_assertions)]
    fn full_scope(&self, node: NodeId) -> SyncScope {
        let Some(e) = self.nodes.get(&node) else {
            return SyncScope::default();
        };
        let publishes: Vec<TopicId> = e.publishes.iter().copied().collect();
        let mut regions = self.planner.relevant_regions(node, &publishes);
        regions.extend(e.known_regions.keys().copied());
        let mut topics = e.publishes.clone();
        topics.extend(e.known_topics.keys().copied());
        SyncScope { regions, topics }
    }

    /// Whether `node` must know region `r`: it is a member, or publishes on one of its topics.
    fn is_relevant(&self, node: NodeId, publishes: &BTreeSet<TopicId>, r: RegionId) -> bool {
        let Some(reg) = self.planner.region(r) else {
            return false;
        };
        reg.members.contains(&node)
            || reg
                .topics
                .iter()
                .any(|t| publishes.contains(t) && self.planner.topic_regions(*t).any(|tr| tr == r))
    }

    /// The update items that bring what `node` knows of `scope` up to date (no Commit), with
    /// the node's record of what it knows edited to match, the number of regions compared, and
    /// the regions whose key the node no longer holds.
    fn sync_items(
        &mut self,
        node: NodeId,
        mut scope: SyncScope,
    ) -> (Vec<Item>, usize, Vec<RegionId>) {
        let Some(e) = self.nodes.get(&node) else {
            return (Vec::new(), 0, Vec::new());
        };
        // A topic whose region list changed, or that the node started or stopped publishing on,
        // brings the regions it was in and is in now.
        for &t in &scope.topics {
            scope
                .regions
                .extend(e.known_topics.get(&t).into_iter().flatten().copied());
            if e.publishes.contains(&t) {
                scope.regions.extend(self.planner.topic_regions(t));
            }
        }
        let (relevant, gone): (Vec<RegionId>, Vec<RegionId>) = scope
            .regions
            .iter()
            .partition(|&&r| self.is_relevant(node, &e.publishes, r));
        let compared = scope.regions.len();
        let mut items = Vec::new();
        let mut dropped = Vec::new();
        let master = self.datagram_key.as_ref().map(|(_, m)| m.clone());
        let incarnation = self.incarnation;
        let Some(e) = self.nodes.get_mut(&node) else {
            return (Vec::new(), compared, dropped);
        };
        for r in gone {
            if e.known_regions.remove(&r).is_some() {
                if let Some(k) = self.known_by.get_mut(&r) {
                    k.remove(&node);
                }
                items.push(Item::RegionGone(r));
            }
            if e.known_keys.remove(&r).is_some() {
                dropped.push(r);
            }
        }
        for &r in &relevant {
            let Some(&view) = self.views.get(&r) else {
                continue;
            };
            if e.known_regions.get(&r) != Some(&view) {
                let Some(v) = self.planner.region_view(
                    r,
                    (view, self.bases.get(&r).copied().unwrap_or(view)),
                    self.config.partition_size,
                ) else {
                    continue;
                };
                let address = self
                    .addresses
                    .get(&r)
                    .copied()
                    .unwrap_or(RegionAddress::Unicast);
                items.push(Item::Region(GmsRegionView { view: v, address }));
                e.known_regions.insert(r, view);
                self.known_by.entry(r).or_default().insert(node);
            }
            // The region's key, to the nodes sent its view only (ADR 43), in the same batch.
            if let (Some(&id), Some(master)) = (self.region_keys.get(&r), master.as_ref()) {
                if e.known_keys.get(&r) != Some(&id) {
                    let secret = tidings_seal::derive_region_key(&master.0, incarnation, r.0, id);
                    items.push(Item::RegionKey {
                        region: r,
                        id,
                        secret: WireKey(secret),
                    });
                    e.known_keys.insert(r, id);
                }
            }
        }
        // The addresses of the nodes this node will talk to in these regions: their members and
        // the publishers of their topics. They go before the views, in the same batch.
        if self.addressed_members > 0 {
            // Gathered with repeats, then sorted and deduplicated.
            let mut needed = Vec::new();
            for &r in &relevant {
                if let Some(reg) = self.planner.region(r) {
                    needed.extend(reg.members.iter().copied());
                    for t in &reg.topics {
                        if let Some(p) = self.publishers.get(t) {
                            needed.extend(p.iter().copied());
                        }
                    }
                }
            }
            needed.sort_unstable();
            needed.dedup();
            let told = &self.nodes.get(&node).map(|e| &e.told_addresses);
            let mut addresses = Vec::new();
            for n in needed {
                if n == node || told.is_some_and(|t| t.contains(&n)) {
                    continue;
                }
                if let Some(addr) = self.nodes.get(&n).and_then(|x| x.addr) {
                    addresses.push((n, addr));
                }
            }
            if !addresses.is_empty() {
                let Some(e) = self.nodes.get_mut(&node) else {
                    return (Vec::new(), compared, dropped);
                };
                e.told_addresses.extend(addresses.iter().map(|&(n, _)| n));
                let mut with_addresses: Vec<Item> = addresses
                    .into_iter()
                    .map(|(node, addr)| Item::NodeAddress { node, addr })
                    .collect();
                with_addresses.append(&mut items);
                items = with_addresses;
            }
        }
        let Some(e) = self.nodes.get_mut(&node) else {
            return (Vec::new(), compared, dropped);
        };
        for &t in &scope.topics {
            if !e.publishes.contains(&t) && e.known_topics.remove(&t).is_some() {
                items.push(Item::TopicGone(t));
            }
        }
        for &t in scope.topics.iter().filter(|t| e.publishes.contains(t)) {
            let unchanged = e
                .known_topics
                .get(&t)
                .is_some_and(|known| known.iter().copied().eq(self.planner.topic_regions(t)));
            if !unchanged {
                let regions: Vec<RegionId> = self.planner.topic_regions(t).collect();
                items.push(Item::TopicRegions {
                    topic: t,
                    regions: regions.clone(),
                });
                e.known_topics.insert(t, regions);
            }
        }
        (items, compared, dropped)
    }
}
