//! The node side of the membership service.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

use tidings_proto::{Membership, MembershipChange, Time};
use tidings_wire::{NodeId, RegionId, TopicId};

use crate::acl::{AclAction, TopicRefusal};
use crate::config::{ClientConfig, ConfigError};
use crate::message::{
    GmsMessage, GmsRegionView, Item, RegionAddress, Request, WireKey, NAMES_PER_REQUEST_MAX,
    TOPIC_NAME_BYTES_MAX,
};

/// What the client reports to its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The GMS gave this node its id.
    Joined(NodeId),
    /// A topic name this node subscribed to or advertised is bound to this id.
    TopicBound {
        /// The name.
        name: String,
        /// The id.
        topic: TopicId,
    },
    /// The full membership this node must now use (after every committed batch of updates).
    Membership(Membership),
    /// The service's access rules refused a subscription or advertisement of this node
    /// ([`Item::Refused`]): the name is dropped from what the client subscribed to or
    /// advertised (a rejoin does not ask for it again).
    Refused(TopicRefusal),
    /// The GMS removed this node; it must stop and may join again with a new client.
    Removed,
    /// The service no longer knows this node (it was removed, or the service lost its state:
    /// a single replica restarted without its log) and the client joins again by itself
    /// (`ClientConfig::rejoin`): it draws a new nonce, forgets its membership and update
    /// stream, and once welcomed ([`Joined`](ClientEvent::Joined) with the new id) sends its
    /// subscriptions and advertisements again. The node id changes: the host decides what to
    /// do with the protocol node that ran under `old`.
    Rejoining {
        /// The id the node had.
        old: NodeId,
    },
}

/// Why a request was not queued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The topic name is empty or longer than [`TOPIC_NAME_BYTES_MAX`].
    #[error("topic name must be 1..={TOPIC_NAME_BYTES_MAX} bytes")]
    Name,
    /// `requests_queued_max` requests are waiting.
    #[error("too many requests queued")]
    QueueFull,
    /// The node was removed or has left.
    #[error("not a member")]
    NotMember,
    /// A batch of subscriptions is empty or holds more than [`NAMES_PER_REQUEST_MAX`] names.
    #[error("a batch of subscriptions holds 1..={NAMES_PER_REQUEST_MAX} names")]
    TooMany,
}

/// Counters of the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Messages that failed to decode (dropped).
    pub malformed: u64,
    /// Messages of a kind or state the client does not expect (dropped).
    pub unexpected: u64,
    /// Update items received again (already applied).
    pub updates_duplicate: u64,
    /// Update items received ahead of a missing one and buffered.
    pub updates_reordered: u64,
    /// Update items dropped because the reorder buffer was full.
    pub updates_dropped: u64,
    /// Update items applied.
    pub updates_applied: u64,
    /// Requests sent again.
    pub requests_retransmitted: u64,
    /// Probes of the service answered (a ring neighbour suspected this node).
    pub probes_answered: u64,
    /// Joins answered `NonceTaken` (another node holds the nonce), each followed by a join
    /// with a fresh one.
    pub nonces_taken: u64,
    /// Messages from a replicated service's leader of an older term than one already seen
    /// (a deposed leader's late updates): dropped.
    pub stale_term: u64,
    /// Messages from a replica index outside `0..replicas`: dropped.
    pub unknown_replica: u64,
    /// Moves to another replica because the one talked to was silent.
    pub failovers: u64,
    /// Heartbeats sent at a failover to the replicas other than the next one, so the leader
    /// (or a follower naming it) answers in one round trip even when replicas are down.
    pub failover_probes: u64,
    /// Moves to the leader a follower named.
    pub redirects: u64,
    /// Joins again after the service forgot this node ([`ClientEvent::Rejoining`]).
    pub rejoins: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Joining { sent_at: Option<Time> },
    Member(NodeId),
    Removed,
}

#[derive(Clone, Debug)]
struct PendingRequest {
    req: u64,
    body: Request,
    sent_at: Option<Time>,
}

/// The named timers of the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Join,
    Heartbeat,
    Retransmit,
    Failover,
}

/// A node's view of the membership service, sans-IO.
///
/// Drive it like [`Gms`](crate::Gms): `handle_*` with `now`, then drain
/// [`poll_transmit`](GmsClient::poll_transmit) (every message goes to the GMS) and
/// [`poll_event`](GmsClient::poll_event), and call [`handle_timeout`](GmsClient::handle_timeout)
/// at [`poll_timeout`](GmsClient::poll_timeout). The client joins at once, heartbeats, sends its
/// requests reliably and in order, applies the GMS's update stream in order exactly once, and
/// after each committed batch emits [`ClientEvent::Membership`] with everything the protocol
/// node needs.
#[derive(Debug)]
pub struct GmsClient {
    config: ClientConfig,
    nonce: u64,
    /// Draws the nonces from the config's seed: the first, and a fresh one whenever the service
    /// says another node holds the current one.
    nonce_rng: fastrand::Rng,
    state: State,
    next_req: u64,
    requests: VecDeque<PendingRequest>,
    last_heartbeat: Option<Time>,
    /// The next update sequence number expected.
    next_update: u64,
    reorder: BTreeMap<u64, Item>,
    /// The current key of each region the service sent this node a key for
    /// ([`Item::RegionKey`]): its id and secret; dropped with the region's view.
    region_keys: BTreeMap<RegionId, (u32, WireKey)>,
    /// Regions whose key changed or went since [`take_key_changes`](GmsClient::take_key_changes).
    key_changes: Vec<RegionId>,
    ack_due: bool,
    regions: BTreeMap<RegionId, GmsRegionView>,
    topic_regions: BTreeMap<TopicId, Vec<RegionId>>,
    topics: BTreeMap<String, TopicId>,
    addresses: BTreeMap<NodeId, SocketAddr>,
    outbox: VecDeque<GmsMessage>,
    events: VecDeque<ClientEvent>,
    /// Whether a committed batch emits [`ClientEvent::Membership`].
    membership_events: bool,
    /// Committed batches applied so far.
    commits: u64,
    /// Membership items of the batch being received, applied at its Commit.
    uncommitted: Vec<Item>,
    /// Regions and published topics changed by batches committed since the last
    /// [`take_change`](GmsClient::take_change) or membership event.
    changed_regions: BTreeSet<RegionId>,
    changed_topics: BTreeSet<TopicId>,
    stats: ClientStats,
    /// The replica messages go to: the leader as far as the client knows.
    target: usize,
    /// The highest term of a replicated service's leader seen.
    term: u64,
    /// When the target was last heard from (or became the target).
    heard_at: Option<Time>,
    /// The topics subscribed to and advertised, as requested: what a rejoin asks for again.
    subscribed: BTreeSet<String>,
    advertised: BTreeSet<String>,
    /// The ids of the subscribed names the service has bound: the topics this node delivers
    /// ([`Membership::subscriptions`]), which with approximate regions (ADR 34) may be fewer
    /// than its regions carry.
    subscribed_topics: BTreeSet<TopicId>,
    /// Names unsubscribed, by the request that did it: each leaves `subscribed_topics` when the
    /// service acknowledges the request (it has applied it), so that the node delivers the topic
    /// for as long as the service counts it a subscriber.
    unsubscribing: VecDeque<(u64, String)>,
    /// Changes to `subscribed_topics` not yet taken
    /// ([`take_subscription_changes`](GmsClient::take_subscription_changes)).
    subscription_changes: Vec<(TopicId, bool)>,
    /// A `Leave` was requested: a removal then ends the client, never a rejoin.
    leaving: bool,
    /// Where this node serves its metrics, as last told ([`GmsClient::announce_metrics`]):
    /// what a rejoin tells again.
    metrics_at: Option<SocketAddr>,
    /// The incarnation of the service that welcomed this node (0 before).
    incarnation: u32,
    /// Failovers since a message was last taken from the replica talked to.
    silent_failovers: usize,
    /// Replicas still to get a heartbeat of the last failover (see
    /// [`ClientStats::failover_probes`]).
    failover_probes: Vec<usize>,
}

impl GmsClient {
    /// A client that will join at the first [`handle_timeout`](GmsClient::handle_timeout). Fails
    /// if the configuration is invalid.
    pub fn new(config: ClientConfig) -> Result<GmsClient, ConfigError> {
        config.validate()?;
        let mut nonce_rng = fastrand::Rng::with_seed(config.seed);
        let nonce = nonce_rng.u64(..);
        Ok(GmsClient {
            config,
            nonce,
            nonce_rng,
            state: State::Joining { sent_at: None },
            next_req: 1,
            requests: VecDeque::new(),
            last_heartbeat: None,
            next_update: 1,
            reorder: BTreeMap::new(),
            region_keys: BTreeMap::new(),
            key_changes: Vec::new(),
            ack_due: false,
            regions: BTreeMap::new(),
            topic_regions: BTreeMap::new(),
            topics: BTreeMap::new(),
            addresses: BTreeMap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            membership_events: true,
            commits: 0,
            uncommitted: Vec::new(),
            changed_regions: BTreeSet::new(),
            changed_topics: BTreeSet::new(),
            stats: ClientStats::default(),
            target: 0,
            term: 0,
            heard_at: None,
            subscribed: BTreeSet::new(),
            subscribed_topics: BTreeSet::new(),
            unsubscribing: VecDeque::new(),
            subscription_changes: Vec::new(),
            advertised: BTreeSet::new(),
            leaving: false,
            metrics_at: None,
            incarnation: 0,
            silent_failovers: 0,
            failover_probes: Vec::new(),
        })
    }

    /// The incarnation of the service that last welcomed this node (0 before the first
    /// welcome): what its protocol node writes in every packet.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// The current key of `region` (id and secret), if the service sent one and the region's
    /// view is still this node's: the member seals and opens the region's datagrams with it.
    #[must_use]
    pub fn region_key(&self, region: RegionId) -> Option<(u32, &WireKey)> {
        self.region_keys.get(&region).map(|(id, k)| (*id, k))
    }

    /// Every region key this node holds, by region.
    pub fn region_keys(&self) -> impl Iterator<Item = (RegionId, u32, &WireKey)> + '_ {
        self.region_keys.iter().map(|(&r, (id, k))| (r, *id, k))
    }

    /// The regions whose key changed or went since the last call (in the order it happened,
    /// possibly repeated): the member looks each up with [`region_key`](GmsClient::region_key).
    pub fn take_key_changes(&mut self) -> Vec<RegionId> {
        std::mem::take(&mut self.key_changes)
    }

    /// The join nonce (the runtime maps it to this client until it has a node id).
    #[must_use]
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// This node's id, once joined.
    #[must_use]
    pub fn node(&self) -> Option<NodeId> {
        match self.state {
            State::Member(n) => Some(n),
            _ => None,
        }
    }

    /// Whether the GMS removed this node (or it left).
    #[must_use]
    pub fn is_removed(&self) -> bool {
        self.state == State::Removed
    }

    /// The index of the replica the client talks to (0 with one replica).
    #[must_use]
    pub fn replica(&self) -> usize {
        self.target
    }

    /// The highest leader term seen (0 with a single-process service).
    #[must_use]
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> &ClientStats {
        &self.stats
    }

    /// The id of a topic name, once bound.
    #[must_use]
    pub fn topic_id(&self, name: &str) -> Option<TopicId> {
        self.topics.get(name).copied()
    }

    /// The address of a region this node knows.
    #[must_use]
    pub fn region_address(&self, region: RegionId) -> Option<RegionAddress> {
        self.regions.get(&region).map(|v| v.address)
    }

    /// The data address of a node this node talks to (a member of one of its regions, or a
    /// publisher of one of their topics), as the GMS told it.
    #[must_use]
    pub fn node_address(&self, node: NodeId) -> Option<SocketAddr> {
        self.addresses.get(&node).copied()
    }

    /// Every node address the GMS told this node.
    pub fn node_addresses(&self) -> impl Iterator<Item = (NodeId, SocketAddr)> + '_ {
        self.addresses.iter().map(|(&n, &a)| (n, a))
    }

    /// The region views this node knows, with their addresses.
    pub fn region_views(&self) -> impl Iterator<Item = &GmsRegionView> + '_ {
        self.regions.values()
    }

    /// The membership as of the last committed batch (also emitted as an event).
    #[must_use]
    pub fn membership(&self) -> Membership {
        Membership {
            regions: self
                .regions
                .iter()
                .map(|(&r, v)| (r, v.view.clone()))
                .collect(),
            topic_regions: self.topic_regions.clone(),
            subscriptions: Some(self.subscribed_topics.clone()),
        }
    }

    /// The topics this node delivers: the ids of the names it subscribed to, from the request
    /// on (once the service bound the name), until the service acknowledges an unsubscription.
    /// Its regions may carry more (approximate regions, ADR 34).
    #[must_use]
    pub fn subscribed_topics(&self) -> &BTreeSet<TopicId> {
        &self.subscribed_topics
    }

    /// The changes to [`subscribed_topics`](GmsClient::subscribed_topics) since the last call,
    /// in order (`true`: subscribed), for [`Node::set_subscribed`](tidings_proto::Node::set_subscribed).
    pub fn take_subscription_changes(&mut self) -> std::vec::Drain<'_, (TopicId, bool)> {
        self.subscription_changes.drain(..)
    }

    /// Follows a change of the subscribed names in `subscribed_topics`, for a bound name.
    fn note_subscribed(&mut self, name: &str, subscribed: bool) {
        let Some(&topic) = self.topics.get(name) else {
            return;
        };
        let changed = if subscribed {
            self.subscribed_topics.insert(topic)
        } else {
            self.subscribed_topics.remove(&topic)
        };
        if changed {
            self.subscription_changes.push((topic, subscribed));
        }
    }

    /// Requests made and not yet acknowledged by the service (sent or waiting for the window).
    #[must_use]
    pub fn requests_unacknowledged(&self) -> usize {
        self.requests.len()
    }

    /// Committed batches applied so far: a host that turned the membership events off installs
    /// [`take_change`](GmsClient::take_change) when this has moved, once for however many
    /// batches one call applied.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// What the batches committed since the last call (or the last membership event) changed:
    /// each changed region's view and each changed published topic's region list as they are
    /// now, for [`Node::update_membership`](tidings_proto::Node::update_membership). Its size
    /// follows the change, where [`membership`](GmsClient::membership) copies everything.
    pub fn take_change(&mut self) -> MembershipChange {
        let regions = std::mem::take(&mut self.changed_regions)
            .into_iter()
            .map(|r| (r, self.regions.get(&r).map(|v| v.view.clone())))
            .collect();
        let topic_regions = std::mem::take(&mut self.changed_topics)
            .into_iter()
            .map(|t| (t, self.topic_regions.get(&t).cloned()))
            .collect();
        MembershipChange {
            regions,
            topic_regions,
        }
    }

    /// Turns the [`ClientEvent::Membership`] of each committed batch off or on (on by default).
    /// Each one is a copy of the whole membership; a host that reads
    /// [`membership`](GmsClient::membership) itself when it needs it (a simulator replaying a
    /// long bootstrap stream into many clients) turns them off meanwhile.
    pub fn set_membership_events(&mut self, on: bool) {
        self.membership_events = on;
    }

    /// Subscribes to a topic by name.
    pub fn subscribe(&mut self, name: &str) -> Result<(), RequestError> {
        self.request_named(name, Request::Subscribe)
    }

    /// Subscribes to several topics by name in one request (at most [`NAMES_PER_REQUEST_MAX`]):
    /// the service changes the views once for all of them.
    pub fn subscribe_many(&mut self, names: &[String]) -> Result<(), RequestError> {
        Self::check_names(names)?;
        self.request(Request::SubscribeMany(names.to_vec()))
    }

    /// Unsubscribes from a topic by name.
    pub fn unsubscribe(&mut self, name: &str) -> Result<(), RequestError> {
        self.request_named(name, Request::Unsubscribe)
    }

    /// Unsubscribes from several topics by name in one request (at most
    /// [`NAMES_PER_REQUEST_MAX`]): the service changes the views once for all of them.
    pub fn unsubscribe_many(&mut self, names: &[String]) -> Result<(), RequestError> {
        Self::check_names(names)?;
        self.request(Request::UnsubscribeMany(names.to_vec()))
    }

    /// Declares that this node publishes on a topic: it will be told the topic's regions.
    pub fn advertise(&mut self, name: &str) -> Result<(), RequestError> {
        self.request_named(name, Request::Advertise)
    }

    /// Declares that this node publishes on several topics in one request (at most
    /// [`NAMES_PER_REQUEST_MAX`]): one update of its membership for all of them.
    pub fn advertise_many(&mut self, names: &[String]) -> Result<(), RequestError> {
        Self::check_names(names)?;
        self.request(Request::AdvertiseMany(names.to_vec()))
    }

    /// A batch of 1..=[`NAMES_PER_REQUEST_MAX`] valid names.
    fn check_names(names: &[String]) -> Result<(), RequestError> {
        if names.is_empty() || names.len() > NAMES_PER_REQUEST_MAX {
            return Err(RequestError::TooMany);
        }
        if names
            .iter()
            .any(|n| n.is_empty() || n.len() > TOPIC_NAME_BYTES_MAX)
        {
            return Err(RequestError::Name);
        }
        Ok(())
    }

    /// Withdraws [`advertise`](GmsClient::advertise).
    pub fn unadvertise(&mut self, name: &str) -> Result<(), RequestError> {
        self.request_named(name, Request::Unadvertise)
    }

    /// Reports that a ring neighbour seems dead.
    pub fn suspect(&mut self, node: NodeId) -> Result<(), RequestError> {
        self.request(Request::Suspect(node))
    }

    /// Leaves the system (the GMS removes this node once the request arrives).
    pub fn leave(&mut self) -> Result<(), RequestError> {
        self.request(Request::Leave)
    }

    /// Asks the service for a new region key in place of key `id`, which this node has nearly
    /// used up (the service ignores it if `id` is no longer its region's current key).
    pub fn renew_datagram_key(&mut self, id: u32) -> Result<(), RequestError> {
        self.request(Request::RenewDatagramKey(id))
    }

    /// Tells the service where this node serves its metrics (`None`: nowhere), for operators'
    /// tools that find the members' endpoints through it; told again after a rejoin.
    pub fn announce_metrics(&mut self, addr: Option<SocketAddr>) -> Result<(), RequestError> {
        self.request(Request::MetricsAt(addr))
    }

    fn request_named(
        &mut self,
        name: &str,
        make: fn(String) -> Request,
    ) -> Result<(), RequestError> {
        if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX {
            return Err(RequestError::Name);
        }
        self.request(make(name.to_owned()))
    }

    fn request(&mut self, body: Request) -> Result<(), RequestError> {
        if self.state == State::Removed {
            return Err(RequestError::NotMember);
        }
        if self.requests.len() >= self.config.requests_queued_max {
            return Err(RequestError::QueueFull);
        }
        match &body {
            Request::Subscribe(n) => {
                self.subscribed.insert(n.clone());
                self.note_subscribed(n, true);
            }
            Request::SubscribeMany(names) => {
                for n in names {
                    self.subscribed.insert(n.clone());
                    self.note_subscribed(n, true);
                }
            }
            Request::Unsubscribe(n) => {
                self.subscribed.remove(n);
                self.unsubscribing.push_back((self.next_req, n.clone()));
            }
            Request::UnsubscribeMany(names) => {
                for n in names {
                    self.subscribed.remove(n);
                    self.unsubscribing.push_back((self.next_req, n.clone()));
                }
            }
            Request::Advertise(n) => {
                self.advertised.insert(n.clone());
            }
            Request::AdvertiseMany(names) => self.advertised.extend(names.iter().cloned()),
            Request::Unadvertise(n) => {
                self.advertised.remove(n);
            }
            Request::Leave => self.leaving = true,
            Request::MetricsAt(addr) => self.metrics_at = *addr,
            Request::Suspect(_) | Request::RenewDatagramKey(_) => {}
        }
        self.requests.push_back(PendingRequest {
            req: self.next_req,
            body,
            sent_at: None,
        });
        self.next_req += 1;
        Ok(())
    }

    /// A datagram from replica `from` of the GMS (0 with one replica). Malformed ones are
    /// counted and dropped.
    pub fn handle_datagram(&mut self, now: Time, from: usize, bytes: &[u8]) {
        match GmsMessage::decode(bytes) {
            Ok(msg) => self.handle_message(now, from, msg),
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// A decoded message from replica `from` of the GMS. A leader's message is stamped with
    /// its term: one of an older term than seen is refused; a newer term makes its sender the
    /// replica the client talks to. A follower's redirect moves the client to the leader it
    /// names.
    pub fn handle_message(&mut self, now: Time, from: usize, msg: GmsMessage) {
        if from >= self.config.replicas {
            self.stats.unknown_replica += 1;
            return;
        }
        let msg = match msg {
            GmsMessage::Stamped { term, msg } => {
                // With one replica there is no other leader to refuse: a service restarted
                // without its state starts its terms again.
                if term < self.term && self.config.replicas > 1 {
                    self.stats.stale_term += 1;
                    return;
                }
                self.term = term;
                if from != self.target {
                    self.move_to(from);
                }
                *msg
            }
            GmsMessage::Redirect { term, leader } => {
                if term < self.term && self.config.replicas > 1 {
                    self.stats.stale_term += 1;
                    return;
                }
                self.term = term;
                let leader = leader.and_then(|l| usize::try_from(l).ok());
                if let Some(l) = leader.filter(|&l| l < self.config.replicas && l != self.target) {
                    self.stats.redirects += 1;
                    self.move_to(l);
                    self.heard_at = Some(now);
                }
                return;
            }
            msg => msg,
        };
        if from != self.target {
            // An unstamped message comes from a single-process service, whose index is 0.
            self.stats.unexpected += 1;
            return;
        }
        self.heard_at = Some(now);
        self.silent_failovers = 0;
        match (self.state, msg) {
            (State::Removed, _) => self.stats.unexpected += 1,
            (
                State::Joining { .. },
                GmsMessage::Welcome {
                    nonce,
                    node,
                    incarnation,
                },
            ) if nonce == self.nonce => {
                self.state = State::Member(node);
                self.incarnation = incarnation;
                self.events.push_back(ClientEvent::Joined(node));
                self.send_requests(now);
            }
            (State::Joining { .. }, GmsMessage::NonceTaken { nonce }) if nonce == self.nonce => {
                // Another node joined with this nonce: join again with a fresh one, at once.
                self.nonce = self.nonce_rng.u64(..);
                self.stats.nonces_taken += 1;
                self.state = State::Joining { sent_at: None };
            }
            (State::Member(_), GmsMessage::Welcome { nonce, .. }) if nonce == self.nonce => {
                // A repeated answer to a resent Join.
            }
            // A serving leader's answer to a heartbeat: only a sign of life.
            (_, GmsMessage::Heartbeat) => {}
            (State::Member(_), GmsMessage::Update { seq: 0, items }) => {
                // Outside the stream: only a removal notice is expected here.
                if items.contains(&Item::Removed) {
                    self.removed();
                } else {
                    self.stats.unexpected += 1;
                }
            }
            (State::Member(_), GmsMessage::Update { seq, items }) => {
                for (i, item) in items.into_iter().enumerate() {
                    if self.state == State::Removed {
                        break;
                    }
                    self.on_update(seq.saturating_add(i as u64), item);
                }
            }
            (State::Member(_), GmsMessage::Probe) => {
                // A ring neighbour suspects this node: the answer tells the service it lives.
                self.stats.probes_answered += 1;
                self.outbox.push_back(GmsMessage::Heartbeat);
                self.last_heartbeat = Some(now);
            }
            (State::Member(_), GmsMessage::RequestAck { upto }) => {
                while self.requests.front().is_some_and(|r| r.req <= upto) {
                    self.requests.pop_front();
                }
                while self
                    .unsubscribing
                    .front()
                    .is_some_and(|(req, _)| *req <= upto)
                {
                    if let Some((_, name)) = self.unsubscribing.pop_front() {
                        // Unless subscribed again since.
                        if !self.subscribed.contains(&name) {
                            self.note_subscribed(&name, false);
                        }
                    }
                }
                self.send_requests(now);
            }
            _ => self.stats.unexpected += 1,
        }
    }

    /// The replica messages go to from now on: unacknowledged requests, the join, the
    /// heartbeat and the acknowledgement of the update stream go there at once (a new leader
    /// resends the stream from the last acknowledgement it knows).
    fn move_to(&mut self, replica: usize) {
        self.target = replica;
        for r in &mut self.requests {
            r.sent_at = None;
        }
        match self.state {
            State::Joining { .. } => self.state = State::Joining { sent_at: None },
            State::Member(_) => {
                self.last_heartbeat = None;
                self.ack_due = true;
            }
            State::Removed => {}
        }
    }

    fn removed(&mut self) {
        if let (true, false, State::Member(old)) = (self.config.rejoin, self.leaving, self.state) {
            self.rejoin(old);
            return;
        }
        self.state = State::Removed;
        self.requests.clear();
        self.key_changes.extend(self.region_keys.keys().copied());
        self.region_keys.clear();
        self.reorder.clear();
        self.events.push_back(ClientEvent::Removed);
    }

    /// Joins again under a new nonce, with the subscriptions and advertisements queued as the
    /// first requests of the new id ([`ClientEvent::Rejoining`]).
    fn rejoin(&mut self, old: NodeId) {
        self.stats.rejoins += 1;
        self.events.push_back(ClientEvent::Rejoining { old });
        self.nonce = self.nonce_rng.u64(..);
        self.state = State::Joining { sent_at: None };
        self.next_update = 1;
        self.reorder.clear();
        self.uncommitted.clear();
        self.ack_due = false;
        self.regions.clear();
        self.topic_regions.clear();
        self.topics.clear();
        // The old id's keys: the service replaced each when it removed that id.
        self.key_changes.extend(self.region_keys.keys().copied());
        self.region_keys.clear();
        // Ids of the service that lost this node; the names are bound again after the rejoin.
        self.unsubscribing.clear();
        for topic in std::mem::take(&mut self.subscribed_topics) {
            self.subscription_changes.push((topic, false));
        }
        self.addresses.clear();
        self.changed_regions.clear();
        self.changed_topics.clear();
        self.last_heartbeat = None;
        self.requests.clear();
        self.next_req = 1;
        let subscribed: Vec<String> = self.subscribed.iter().cloned().collect();
        let advertised: Vec<String> = self.advertised.iter().cloned().collect();
        for names in subscribed.chunks(NAMES_PER_REQUEST_MAX) {
            self.queue_again(Request::SubscribeMany(names.to_vec()));
        }
        for names in advertised.chunks(NAMES_PER_REQUEST_MAX) {
            self.queue_again(Request::AdvertiseMany(names.to_vec()));
        }
        if self.metrics_at.is_some() {
            self.queue_again(Request::MetricsAt(self.metrics_at));
        }
    }

    /// Queues a request of a rejoin (not counted against `requests_queued_max`: it restores
    /// what was already granted).
    fn queue_again(&mut self, body: Request) {
        self.requests.push_back(PendingRequest {
            req: self.next_req,
            body,
            sent_at: None,
        });
        self.next_req += 1;
    }

    fn on_update(&mut self, seq: u64, item: Item) {
        self.ack_due = true;
        if seq < self.next_update {
            self.stats.updates_duplicate += 1;
            return;
        }
        if seq > self.next_update {
            if self.reorder.len() >= self.config.reorder_max && !self.reorder.contains_key(&seq) {
                self.stats.updates_dropped += 1;
            } else if self.reorder.insert(seq, item).is_none() {
                self.stats.updates_reordered += 1;
            }
            return;
        }
        self.apply(item);
        self.next_update += 1;
        while let Some(item) = self.reorder.remove(&self.next_update) {
            self.apply(item);
            self.next_update += 1;
        }
    }

    fn apply(&mut self, item: Item) {
        self.stats.updates_applied += 1;
        match item {
            Item::TopicBound { name, topic } => {
                self.topics.insert(name.clone(), topic);
                if self.subscribed.contains(&name) {
                    self.note_subscribed(&name, true);
                }
                self.events
                    .push_back(ClientEvent::TopicBound { name, topic });
            }
            Item::Refused(r) => {
                match r.action {
                    AclAction::Subscribe => {
                        if self.subscribed.remove(&r.topic) {
                            self.note_subscribed(&r.topic, false);
                        }
                    }
                    AclAction::Publish => {
                        self.advertised.remove(&r.topic);
                    }
                }
                self.events.push_back(ClientEvent::Refused(r));
            }
            // The membership changes at the batch's Commit, all at once: what a host installs
            // is always a committed state, never part of a batch.
            Item::Region(_)
            | Item::RegionGone(_)
            | Item::TopicRegions { .. }
            | Item::TopicGone(_) => {
                self.uncommitted.push(item);
            }
            Item::NodeAddress { node, addr } => {
                self.addresses.insert(node, addr);
            }
            Item::Commit => {
                for item in std::mem::take(&mut self.uncommitted) {
                    match item {
                        Item::Region(v) => {
                            self.changed_regions.insert(v.view.region);
                            self.regions.insert(v.view.region, v);
                        }
                        Item::RegionGone(r) => {
                            self.changed_regions.insert(r);
                            self.regions.remove(&r);
                            // The region's key goes with its view.
                            if self.region_keys.remove(&r).is_some() {
                                self.key_changes.push(r);
                            }
                        }
                        Item::TopicRegions { topic, regions } => {
                            self.changed_topics.insert(topic);
                            self.topic_regions.insert(topic, regions);
                        }
                        Item::TopicGone(t) => {
                            self.changed_topics.insert(t);
                            self.topic_regions.remove(&t);
                        }
                        _ => {}
                    }
                }
                self.commits += 1;
                if self.membership_events {
                    let m = self.membership();
                    self.events.push_back(ClientEvent::Membership(m));
                    // The event carries everything: the changes start again from it.
                    self.changed_regions.clear();
                    self.changed_topics.clear();
                }
            }
            Item::Removed => self.removed(),
            // In force at once, like the protocol's use of it: the region's members get it at
            // slightly different times, and open the previous key for a grace.
            Item::RegionKey { region, id, secret } => {
                self.region_keys.insert(region, (id, secret));
                self.key_changes.push(region);
            }
        }
    }

    /// Time has passed: join retries, heartbeats, request retransmission, and with several
    /// replicas the move to the next one when the one talked to is silent.
    pub fn handle_timeout(&mut self, now: Time) {
        let heard = *self.heard_at.get_or_insert(now);
        if self.config.replicas > 1
            && self.state != State::Removed
            && now >= heard + self.config.failover_timeout
        {
            self.stats.failovers += 1;
            self.silent_failovers += 1;
            if self.silent_failovers > self.config.replicas {
                // No replica answered for a whole round: if the service lost its majority's
                // state and started its terms again, the newest term seen would refuse its
                // leader for ever.
                self.term = 0;
            }
            let next = (self.target + 1) % self.config.replicas;
            self.move_to(next);
            self.heard_at = Some(now);
            if let State::Member(_) = self.state {
                // Asking one replica after another costs a failover timeout for every replica
                // that is down on the way; asking all at once finds the leader in one round
                // trip. The old one too: its answers may only have been lost.
                self.failover_probes.clear();
                self.failover_probes
                    .extend((0..self.config.replicas).filter(|&r| r != next));
            }
        }
        match self.state {
            State::Removed => {}
            State::Joining { sent_at } => {
                if sent_at.is_none_or(|t| now >= t + self.config.retransmit_interval) {
                    self.outbox.push_back(GmsMessage::Join {
                        nonce: self.nonce,
                        addr: self.config.data_addr,
                    });
                    self.state = State::Joining { sent_at: Some(now) };
                }
            }
            State::Member(_) => {
                if self.heartbeat_due().is_none_or(|t| now >= t) {
                    self.outbox.push_back(GmsMessage::Heartbeat);
                    self.last_heartbeat = Some(now);
                }
                self.send_requests(now);
            }
        }
    }

    /// Sends unsent requests within the window, and resends all unacknowledged ones (in order:
    /// the GMS applies only the next one) once the oldest has timed out.
    fn send_requests(&mut self, now: Time) {
        if self.node().is_none() {
            return;
        }
        let interval = self.config.retransmit_interval;
        let resend = self
            .requests
            .front()
            .and_then(|r| r.sent_at)
            .is_some_and(|t| now >= t + interval);
        for r in self
            .requests
            .iter_mut()
            .take(self.config.requests_inflight_max)
        {
            if r.sent_at.is_none() || resend {
                if r.sent_at.is_some() {
                    self.stats.requests_retransmitted += 1;
                }
                r.sent_at = Some(now);
                self.outbox.push_back(GmsMessage::Request {
                    req: r.req,
                    body: r.body.clone(),
                });
            }
        }
    }

    /// When the next heartbeat is due (`None`: at once). With several replicas a heartbeat
    /// not answered within `retransmit_interval` is sent again: the serving leader answers
    /// each one, so a few lost datagrams do not look like a dead leader.
    fn heartbeat_due(&self) -> Option<Time> {
        let last = self.last_heartbeat?;
        let regular = last + self.config.heartbeat_interval;
        let unanswered = self.config.replicas > 1 && self.heard_at.is_some_and(|h| h < last);
        Some(if unanswered {
            regular.min(last + self.config.retransmit_interval)
        } else {
            regular
        })
    }

    fn timer(&self, timer: Timer) -> Option<Time> {
        match (timer, self.state) {
            (Timer::Join, State::Joining { sent_at }) => {
                Some(sent_at.map_or(Time::ZERO, |t| t + self.config.retransmit_interval))
            }
            (Timer::Heartbeat, State::Member(_)) => {
                Some(self.heartbeat_due().unwrap_or(Time::ZERO))
            }
            (Timer::Failover, State::Joining { .. } | State::Member(_))
                if self.config.replicas > 1 =>
            {
                Some(
                    self.heard_at
                        .map_or(Time::ZERO, |t| t + self.config.failover_timeout),
                )
            }
            (Timer::Retransmit, State::Member(_)) => {
                // A request queued and not yet sent (within the window) is due at once.
                let unsent = self
                    .requests
                    .iter()
                    .take(self.config.requests_inflight_max)
                    .any(|r| r.sent_at.is_none());
                if unsent {
                    Some(Time::ZERO)
                } else {
                    self.requests
                        .front()
                        .and_then(|r| r.sent_at)
                        .map(|t| t + self.config.retransmit_interval)
                }
            }
            _ => None,
        }
    }

    /// The next time [`handle_timeout`](GmsClient::handle_timeout) must be called (the earliest
    /// of the join, heartbeat and retransmission timers).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        // Only the timers of the current state can be set (a host asks this after every input,
        // so it goes straight to them).
        let due = match self.state {
            State::Joining { .. } => self.timer(Timer::Join),
            State::Member(_) => {
                let heartbeat = self.timer(Timer::Heartbeat);
                match (heartbeat, self.timer(Timer::Retransmit)) {
                    (Some(h), Some(r)) => Some(h.min(r)),
                    (h, r) => h.or(r),
                }
            }
            State::Removed => None,
        };
        match (due, self.timer(Timer::Failover)) {
            (Some(d), Some(f)) => Some(d.min(f)),
            (d, f) => d.or(f),
        }
    }

    /// The next message to the GMS, with the index of the replica it goes to (always 0 with
    /// one replica). An acknowledgement of received updates comes first.
    pub fn poll_transmit(&mut self) -> Option<(usize, GmsMessage)> {
        if self.ack_due {
            self.ack_due = false;
            if self.node().is_some() {
                return Some((
                    self.target,
                    GmsMessage::Ack {
                        upto: self.next_update - 1,
                    },
                ));
            }
        }
        if let Some(m) = self.outbox.pop_front() {
            return Some((self.target, m));
        }
        let replica = self.failover_probes.pop()?;
        self.stats.failover_probes += 1;
        Some((replica, GmsMessage::Heartbeat))
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }
}
