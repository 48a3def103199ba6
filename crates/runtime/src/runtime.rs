//! The public face of a node: start it, publish, subscribe, change its membership, read its
//! counters, shut it down.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tidings_gms::{Joining, Member, MemberConfig, MemberError, NamedRefusal, TopicRefusal};
use tidings_proto::{Delivery, Membership, NodeId, TopicId};
use tidings_sched::{Scheduler, ShutdownMode, TaskStats};

use crate::addr::AddressBook;
use crate::batch::{Deliveries, SubTask, TaskGroup, BATCH_MSGS_MAX};
use crate::clock;
use crate::config::{ConfigError, GmsLinkConfig, RuntimeConfig, Transport};
use crate::core::{Control, Core, CoreShared, GmsLink};
use crate::flow::Unread;
use crate::publish::Publisher;
use crate::stats::RuntimeStats;

/// Requests of `subscribe_named_many` and `advertise_many` sent before the first is answered.
/// The membership service syncs a node once for all the requests it reads together, so a node
/// subscribing to thousands of topics installs a membership per few requests instead of one
/// per request (whose cost grows with the regions it is in); well under the GMS client's
/// requests in flight (64) and queue (4,096).
const REQUESTS_PIPELINED: usize = 16;

/// The answer to one name of a batch request: the topic's id, or why it was refused.
type NamedAnswer = mpsc::Receiver<Result<TopicId, NamedRefusal>>;

/// Sends the batch requests `send` makes of `chunks`, keeping up to `REQUESTS_PIPELINED` of
/// them unanswered, and gives each one's answers to `collect`, in order. Stops sending at the
/// first failure, but collects every request sent (so that what it did is handed back, to be
/// kept or undone). The first failure, if any.
fn pipelined<C, W>(
    chunks: impl IntoIterator<Item = C>,
    mut send: impl FnMut(C) -> Result<W, RequestError>,
    mut collect: impl FnMut(W, &mut Option<RequestError>),
) -> Option<RequestError> {
    let mut failed = None;
    let mut outstanding = VecDeque::with_capacity(REQUESTS_PIPELINED);
    for chunk in chunks {
        if outstanding.len() >= REQUESTS_PIPELINED {
            if let Some(waits) = outstanding.pop_front() {
                collect(waits, &mut failed);
            }
        }
        if failed.is_some() {
            break;
        }
        match send(chunk) {
            Ok(waits) => outstanding.push_back(waits),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    for waits in outstanding {
        collect(waits, &mut failed);
    }
    failed
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The runtime configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The protocol configuration is invalid.
    #[error("protocol {0}")]
    Protocol(#[from] tidings_proto::ConfigError),
    /// The address book has no address for this node (and no socket was given).
    #[error("the address book has no address for node {0}")]
    NoAddress(NodeId),
    /// A socket could not be set up (bind, buffer sizes, multicast join...).
    #[error("socket setup: {0}")]
    Io(#[from] std::io::Error),
    /// The delivery scheduler could not start.
    #[error("delivery scheduler: {0}")]
    Sched(#[from] tidings_sched::StartError),
    /// The membership service did not answer the join in time.
    #[error(
        "no answer from the membership service at {servers:?} within {waited:?}: is `tidings gms` \
         (or a node embedding it) running there, and is the address reachable? (A service \
         started with an identity answers only nodes joining with theirs.)"
    )]
    GmsUnreachable {
        /// The replica addresses tried.
        servers: Vec<SocketAddr>,
        /// How long the node tried.
        waited: std::time::Duration,
    },
    /// The membership service did not admit this node: its identity is not on the service's
    /// allow list, or the service key configured here is not the service's.
    #[error("the membership service at {servers:?} did not admit this node: {reason}")]
    NotAdmitted {
        /// The replica addresses tried.
        servers: Vec<SocketAddr>,
        /// Why, from the handshake.
        reason: tidings_seal::LinkError,
    },
}

/// Why a request to the core thread failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The runtime has stopped.
    #[error("the node runtime has stopped")]
    Closed,
    /// The core thread did not answer within `RuntimeConfig::request_timeout`.
    #[error("the core thread did not answer in time")]
    Timeout,
    /// The share is not in `(0, 1]`.
    #[error("share {0} is not in (0, 1]")]
    Share(f64),
    /// The request was refused (the message says why).
    #[error("refused: {0}")]
    Refused(String),
    /// The membership service's access rules refused the subscription or advertisement: the
    /// topic, the action and the rule.
    #[error("{0}")]
    TopicRefused(TopicRefusal),
}

impl From<NamedRefusal> for RequestError {
    fn from(why: NamedRefusal) -> RequestError {
        match why {
            NamedRefusal::Topic(r) => RequestError::TopicRefused(r),
            NamedRefusal::Other(why) => RequestError::Refused(why),
        }
    }
}

/// Why shutting down was not clean.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// The core thread panicked (a bug).
    #[error("the core thread panicked")]
    CorePanicked,
    /// A delivery worker thread panicked (a bug in the scheduler; callback panics are caught).
    #[error("delivery scheduler: {0}")]
    Sched(#[from] tidings_sched::ShutdownError),
}

/// A running node: the core thread driving the protocol over real sockets, and the delivery
/// scheduler's worker threads that run subscription callbacks.
///
/// ```no_run
/// use std::collections::BTreeMap;
/// use tidings_runtime::{AddressBook, NodeRuntime, RuntimeConfig};
/// use tidings_proto::{Config, Membership, NodeId, TopicId};
///
/// let subs = BTreeMap::from([(NodeId(0), vec![]), (NodeId(1), vec![TopicId(7)])]);
/// let membership = Membership::from_subscriptions(&subs, 5);
/// let mut book = AddressBook::default();
/// book.nodes.insert(NodeId(0), "127.0.0.1:7000".parse()?);
/// book.nodes.insert(NodeId(1), "127.0.0.1:7001".parse()?);
/// let node = NodeRuntime::start(RuntimeConfig::default(), Config::default(), NodeId(0),
///     membership, book)?;
/// let mut publisher = node.publisher();
/// let handle = publisher.publish(TopicId(7), bytes::Bytes::from_static(b"hello"))?;
/// publisher.wait_stable(handle, std::time::Duration::from_secs(5))?;
/// node.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct NodeRuntime {
    me: NodeId,
    shared: Arc<CoreShared>,
    thread: Option<JoinHandle<RuntimeStats>>,
    scheduler: Option<Scheduler<Deliveries>>,
    local_addr: SocketAddr,
    max_payload: usize,
    config: RuntimeConfig,
    next_publisher: AtomicU64,
}

impl NodeRuntime {
    /// Starts node `me`, binding its address from `addresses`.
    pub fn start(
        config: RuntimeConfig,
        protocol: tidings_proto::Config,
        me: NodeId,
        membership: Membership,
        addresses: AddressBook,
    ) -> Result<NodeRuntime, StartError> {
        let addr = *addresses.nodes.get(&me).ok_or(StartError::NoAddress(me))?;
        let socket = std::net::UdpSocket::bind(addr)?;
        NodeRuntime::start_with_socket(config, protocol, me, membership, addresses, socket)
    }

    /// Starts node `me` on an already bound unicast socket (for example bound to port 0, whose
    /// address was then put in everyone's address book).
    pub fn start_with_socket(
        config: RuntimeConfig,
        protocol: tidings_proto::Config,
        me: NodeId,
        membership: Membership,
        addresses: AddressBook,
        socket: std::net::UdpSocket,
    ) -> Result<NodeRuntime, StartError> {
        config.validate()?;
        let member_config = MemberConfig {
            stall_after: config.stall_after,
            ..MemberConfig::default()
        };
        let member = Member::with_membership(protocol, member_config, me, membership, clock::now())
            .map_err(|e| match e {
                MemberError::Protocol(e) => StartError::Protocol(e),
                e => StartError::Config(ConfigError::Gms(e.to_string())),
            })?;
        NodeRuntime::spawn(config, member, addresses, socket, None)
    }

    /// Joins the group through the membership service: binds nothing itself (give it a bound
    /// socket, port 0 is fine), gets a node id from the service, and starts the node with an
    /// empty membership. Topics are then taken by name with
    /// [`subscribe_named`](NodeRuntime::subscribe_named) and
    /// [`advertise`](NodeRuntime::advertise); the views, node addresses and multicast groups
    /// come from the service, and a clean [`shutdown`](NodeRuntime::shutdown) leaves the group.
    pub fn join(
        config: RuntimeConfig,
        protocol: tidings_proto::Config,
        gms: GmsLinkConfig,
        socket: std::net::UdpSocket,
    ) -> Result<NodeRuntime, StartError> {
        config.validate()?;
        gms.validate()?;
        protocol.validate()?;
        let member_config = MemberConfig {
            suspect_interval: gms.suspect_interval,
            leave_timeout: gms.leave_timeout,
            stall_after: config.stall_after,
            sealing: tidings_seal::KeyRingConfig {
                mode: gms.sealing,
                ..tidings_seal::KeyRingConfig::default()
            },
            key_grace: gms.key_grace,
            ..MemberConfig::default()
        };
        let member_error = |e| match e {
            MemberError::Protocol(e) => StartError::Protocol(e),
            MemberError::Config(why) => StartError::Config(ConfigError::Gms(why)),
            // The handshake returns once the node has its id.
            MemberError::NotJoined => StartError::GmsUnreachable {
                servers: gms.servers.clone(),
                waited: gms.join_timeout,
            },
        };
        let mut joining =
            Joining::new(protocol, member_config, gms.client.clone()).map_err(member_error)?;
        if let Some(security) = &gms.security {
            let mut security = security.clone();
            security.stamp_base = clock::wall_micros();
            joining = joining.with_link(tidings_gms::NodeLink::new(
                security,
                gms.servers.len(),
                crate::config::os_entropy(),
            ));
        }
        handshake(&socket, &gms, &mut joining)?;
        let member = joining.into_member(clock::now()).map_err(member_error)?;
        NodeRuntime::spawn(
            config,
            member,
            AddressBook::default(),
            socket,
            Some(GmsLink::new(gms.servers.clone())),
        )
    }

    fn spawn(
        config: RuntimeConfig,
        member: Member,
        addresses: AddressBook,
        socket: std::net::UdpSocket,
        gms: Option<GmsLink>,
    ) -> Result<NodeRuntime, StartError> {
        let me = member.id();
        let local_addr = socket.local_addr()?;
        let max_payload = member.node().max_payload();
        if config.raise_open_file_limit && matches!(config.transport, Transport::Multicast(_)) {
            raise_open_file_limit();
        }
        let (core, shared) = Core::new(member, config.clone(), addresses, socket, gms)?;
        let scheduler = Scheduler::new(config.sched.clone())?;
        let thread = std::thread::Builder::new()
            .name(config.thread_name.clone())
            .spawn(crate::oplog::in_span(
                tracing::info_span!(target: crate::oplog::VIEW_TARGET, "node", id = me.0),
                move || core.run(),
            ))?;
        Ok(NodeRuntime {
            me,
            shared,
            thread: Some(thread),
            scheduler: Some(scheduler),
            local_addr,
            max_payload,
            config,
            next_publisher: AtomicU64::new(1),
        })
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// The address of the node's unicast socket.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Largest payload a message may have.
    #[must_use]
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// A new publisher, for one application thread.
    #[must_use]
    pub fn publisher(&self) -> Publisher {
        let id = self.next_publisher.fetch_add(1, Ordering::Relaxed);
        let (publisher, core_side) = Publisher::new(
            id,
            self.config.publish_queue_capacity,
            Arc::clone(&self.shared),
            self.max_payload,
        );
        self.shared.send(Control::AddPublisher(Box::new(core_side)));
        publisher
    }

    /// Runs `callback` for every message delivered on `topic`, in sender order, on a worker
    /// thread of the delivery scheduler (never on the core thread), with `share` in `(0, 1]`
    /// of the workers' time when topics compete. In force when this returns.
    ///
    /// The node must be in a region that carries `topic` (its membership says so) for messages
    /// to arrive; this only routes them. When the subscription's task queue is full (the
    /// callback is slower than the topic) the topic is held at this node: the streams that
    /// carry it (same sender, same region) stop here until the callback catches up, which
    /// slows their senders, and every other stream goes on.
    pub fn subscribe<F>(
        &self,
        topic: TopicId,
        share: f64,
        callback: F,
    ) -> Result<Subscription, RequestError>
    where
        F: FnMut(Delivery) + Send + 'static,
    {
        let task = self.delivery_task(share, callback)?;
        self.subscribe_task(topic, task)
    }

    /// Like [`subscribe`](NodeRuntime::subscribe), with `callback` run once per batch: the
    /// in-order run of the topic's messages that one input brought (up to 256), as one event of
    /// the scheduler, which charges the batch's time to the subscription's share.
    pub fn subscribe_batch<F>(
        &self,
        topic: TopicId,
        share: f64,
        callback: F,
    ) -> Result<Subscription, RequestError>
    where
        F: FnMut(&mut Deliveries) + Send + 'static,
    {
        let task = self.batch_task(share, callback)?;
        self.subscribe_task(topic, task)
    }

    fn subscribe_task(&self, topic: TopicId, task: SubTask) -> Result<Subscription, RequestError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.shared.send(Control::Subscribe {
            topic,
            task: task.clone(),
            reply,
        });
        let subscription = Subscription {
            topic,
            task,
            shared: Arc::clone(&self.shared),
        };
        self.wait(&answer)?;
        Ok(subscription)
    }

    /// Subscribes, through the membership service, to the topic called `name`: like
    /// [`subscribe`](NodeRuntime::subscribe), and returns once the service has put this node in
    /// a region that carries the topic (the topic's id comes back with the subscription).
    /// Only for nodes started with [`join`](NodeRuntime::join).
    pub fn subscribe_named<F>(
        &self,
        name: &str,
        share: f64,
        callback: F,
    ) -> Result<Subscription, RequestError>
    where
        F: FnMut(Delivery) + Send + 'static,
    {
        let task = self.delivery_task(share, callback)?;
        self.subscribe_named_task(name, task)
    }

    /// Like [`subscribe_named`](NodeRuntime::subscribe_named), with `callback` run once per
    /// batch as in [`subscribe_batch`](NodeRuntime::subscribe_batch): the in-order run of the
    /// topic's messages that one input brought (up to 256), one event of the scheduler, which
    /// charges the batch's time to the subscription's share.
    pub fn subscribe_named_batch<F>(
        &self,
        name: &str,
        share: f64,
        callback: F,
    ) -> Result<Subscription, RequestError>
    where
        F: FnMut(&mut Deliveries) + Send + 'static,
    {
        let task = self.batch_task(share, callback)?;
        self.subscribe_named_task(name, task)
    }

    /// [`subscribe_named`](NodeRuntime::subscribe_named) for a subscription whose callback
    /// hands each batch of deliveries to a reader (run once per batch, as in
    /// [`subscribe_batch`](NodeRuntime::subscribe_batch)): at most `capacity` deliveries are
    /// handed on and not yet read, as the returned [`Unread`] counts them (the reader calls
    /// [`Unread::taken`] for what it takes). When the count reaches `capacity` the core thread holds the topic in the protocol:
    /// the streams that carry it (same sender, same region) stop at this node, their senders'
    /// windows close and their publishers slow down, while every other stream goes on. The
    /// topic is released once the reader is down to half the capacity. With `max_wait`, a
    /// subscription still without room after that long is dropped and `on_disconnect` is told
    /// how long it waited (on the core thread: it must not block), and the topic is released
    /// at once unless another subscription of it is full.
    pub fn subscribe_named_bounded<F, D>(
        &self,
        name: &str,
        share: f64,
        (capacity, max_wait): (usize, Option<Duration>),
        callback: F,
        on_disconnect: D,
    ) -> Result<(Subscription, Arc<Unread>), RequestError>
    where
        F: FnMut(&mut Deliveries) + Send + 'static,
        D: FnOnce(Duration) + Send + 'static,
    {
        let task = self.batch_task(share, callback)?;
        let unread = Arc::new(Unread::new(capacity, Arc::clone(&self.shared)));
        self.shared.send(Control::Bound {
            task: task.id(),
            unread: Arc::clone(&unread),
            max_wait,
            on_disconnect: Box::new(on_disconnect),
        });
        let subscription = self.subscribe_named_task(name, task)?;
        Ok((subscription, unread))
    }

    fn subscribe_named_task(
        &self,
        name: &str,
        task: SubTask,
    ) -> Result<Subscription, RequestError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.shared.send(Control::SubscribeNamed {
            name: name.to_owned(),
            task: task.clone(),
            reply,
        });
        match self.wait_long(&answer) {
            Ok(Ok(topic)) => Ok(Subscription {
                topic,
                task,
                shared: Arc::clone(&self.shared),
            }),
            Ok(Err(why)) => {
                task.remove();
                Err(why.into())
            }
            Err(e) => {
                task.remove();
                Err(e)
            }
        }
    }

    /// Subscribes, through the membership service, to every topic of `names` (its `i`-th
    /// delivering to `callback_for(i)`): like [`subscribe_named`](NodeRuntime::subscribe_named)
    /// for each, but the service gets them in requests of up to `NAMES_PER_REQUEST_MAX` names and
    /// changes the views once per request instead of once per topic, which is what makes
    /// subscribing to thousands of topics take time linear in their number. Returns once all are
    /// in force, the subscriptions in the order of `names`; on an error none is kept.
    pub fn subscribe_named_many<F>(
        &self,
        names: &[String],
        share: f64,
        mut callback_for: impl FnMut(usize) -> F,
    ) -> Result<Vec<Subscription>, RequestError>
    where
        F: FnMut(Delivery) + Send + 'static,
    {
        let (subscriptions, failed) =
            self.subscribe_named_tasks(names, |i| self.delivery_task(share, callback_for(i)));
        match failed {
            // Dropping the subscriptions made so far unsubscribes them.
            Some(e) => Err(e),
            None => Ok(subscriptions),
        }
    }

    /// The requests of [`subscribe_named_many`] and [`subscribe_named_group`]: `names` in
    /// chunks of `NAMES_PER_REQUEST_MAX`, the `i`-th delivering to `task_for(i)`, the answers of
    /// one chunk awaited while the next is sent. Returns the subscriptions made (dropping them
    /// unsubscribes) and the first failure. A task `task_for` fails to make ends it there, the
    /// tasks of its chunk removed.
    ///
    /// [`subscribe_named_many`]: NodeRuntime::subscribe_named_many
    /// [`subscribe_named_group`]: NodeRuntime::subscribe_named_group
    fn subscribe_named_tasks(
        &self,
        names: &[String],
        mut task_for: impl FnMut(usize) -> Result<SubTask, RequestError>,
    ) -> (Vec<Subscription>, Option<RequestError>) {
        let mut subscriptions = Vec::with_capacity(names.len());
        let send = |(chunk_index, chunk): (usize, &[String])| {
            let first = chunk_index * tidings_gms::NAMES_PER_REQUEST_MAX;
            let mut entries: Vec<(String, SubTask, _)> = Vec::with_capacity(chunk.len());
            let mut waits = Vec::with_capacity(chunk.len());
            for (i, name) in chunk.iter().enumerate() {
                match task_for(first + i) {
                    Ok(task) => {
                        let (reply, answer) = mpsc::sync_channel(1);
                        waits.push((task.clone(), answer));
                        entries.push((name.clone(), task, reply));
                    }
                    Err(e) => {
                        for (_, task, _) in entries {
                            task.remove();
                        }
                        return Err(e);
                    }
                }
            }
            self.shared.send(Control::SubscribeNamedMany { entries });
            Ok(waits)
        };
        let failed = pipelined(
            names.chunks(tidings_gms::NAMES_PER_REQUEST_MAX).enumerate(),
            send,
            |waits, failed| self.collect_subscriptions(waits, &mut subscriptions, failed),
        );
        (subscriptions, failed)
    }

    /// Waits for the answers of one request of [`subscribe_named_many`]: each subscription made
    /// goes to `subscriptions` (kept even after a failure, so that dropping them unsubscribes
    /// them), the first failure to `failed`.
    fn collect_subscriptions(
        &self,
        waits: Vec<(SubTask, NamedAnswer)>,
        subscriptions: &mut Vec<Subscription>,
        failed: &mut Option<RequestError>,
    ) {
        for (task, answer) in waits {
            match self.wait_long(&answer) {
                Ok(Ok(topic)) => {
                    if let Some(g) = &task.group {
                        g.group.add_subscription();
                    }
                    subscriptions.push(Subscription {
                        topic,
                        task,
                        shared: Arc::clone(&self.shared),
                    });
                }
                Ok(Err(why)) => {
                    // A group's shared task is removed by its caller on a failure.
                    if !task.is_group() {
                        task.remove();
                    }
                    failed.get_or_insert(why.into());
                }
                Err(e) => {
                    if !task.is_group() {
                        task.remove();
                    }
                    failed.get_or_insert(e);
                }
            }
        }
    }

    /// Subscribes, through the membership service, to every topic of `names` with one
    /// callback, `callback(i, delivery)` for a message of the `i`-th: like
    /// [`subscribe_named_many`](NodeRuntime::subscribe_named_many), but the topics share one
    /// delivery task. The core thread hands the task the in-order run of all their messages
    /// as one batch whatever their topic, so a node taking many topics round-robin pays per
    /// batch what it pays per message with a task per topic, and keeps one task's state warm
    /// instead of one per topic.
    ///
    /// The group is one subscription for the scheduler: `share` is the whole group's, and
    /// [`Subscription::stats`] and [`Subscription::set_share`] of any of its topics are the
    /// group's. Each topic still has its [`Subscription`]: dropping one stops that topic's
    /// deliveries (those queued are dropped) and the others go on; the task goes with the
    /// last. When the callback falls behind and the task's queue is full, the group is held
    /// as one: the protocol holds all its topics together (their streams stop at this node,
    /// as a held topic's do, [`subscribe`](NodeRuntime::subscribe)), what it had delivered
    /// waits in one backlog in arrival order, and once the task's queue is down to half its
    /// capacity the backlog is handed on in runs of up to 256 messages and the topics are
    /// released; other subscriptions' topics go on. Returns
    /// once all are in force, in the order of `names`; on an error none is kept. A name given
    /// twice is refused.
    pub fn subscribe_named_group<F>(
        &self,
        names: &[String],
        share: f64,
        mut callback: F,
    ) -> Result<Vec<Subscription>, RequestError>
    where
        F: FnMut(usize, Delivery) + Send + 'static,
    {
        if u32::try_from(names.len()).is_err() {
            return Err(RequestError::Refused(
                "too many topics in one group".to_owned(),
            ));
        }
        // A topic named twice would reach the callback twice per message under two indices.
        let mut seen = std::collections::HashSet::with_capacity(names.len());
        if let Some(twice) = names.iter().find(|n| !seen.insert(n.as_str())) {
            return Err(RequestError::Refused(format!(
                "topic {twice:?} is named more than once in one group"
            )));
        }
        let group = TaskGroup::new(names.len());
        let routes = Arc::clone(&group);
        let mut indices = Vec::with_capacity(BATCH_MSGS_MAX);
        let task = self.batch_task(share, move |batch: &mut Deliveries| {
            routes.dispatch(batch, &mut indices, &mut callback);
        })?;
        let (subscriptions, failed) = self.subscribe_named_tasks(names, |i| {
            // Below `names.len()`, which fits in a u32.
            Ok(task.in_group(&group, i as u32))
        });
        match failed {
            Some(e) => {
                // Dropping the subscriptions made so far unsubscribes them; the task goes now.
                task.remove();
                Err(e)
            }
            None => Ok(subscriptions),
        }
    }

    /// Declares, through the membership service, that this node publishes on the topic called
    /// `name`; returns the topic's id (to publish with) once the node knows where the topic's
    /// subscribers are. Only for nodes started with [`join`](NodeRuntime::join).
    pub fn advertise(&self, name: &str) -> Result<TopicId, RequestError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.shared.send(Control::Advertise {
            name: name.to_owned(),
            reply,
        });
        self.wait_long(&answer)?.map_err(RequestError::from)
    }

    /// Declares, through the membership service, that this node publishes on every topic of
    /// `names`: like [`advertise`](NodeRuntime::advertise) for each, in requests of up to
    /// `NAMES_PER_REQUEST_MAX` names, each one update of this node's membership instead of one
    /// per topic. The topics' ids, in the order of `names`.
    pub fn advertise_many(&self, names: &[String]) -> Result<Vec<TopicId>, RequestError> {
        let mut ids = Vec::with_capacity(names.len());
        let send = |chunk: &[String]| {
            let mut entries = Vec::with_capacity(chunk.len());
            let mut answers = Vec::with_capacity(chunk.len());
            for name in chunk {
                let (reply, answer) = mpsc::sync_channel(1);
                entries.push((name.clone(), reply));
                answers.push(answer);
            }
            self.shared.send(Control::AdvertiseMany { entries });
            Ok(answers)
        };
        let collect = |answers: Vec<NamedAnswer>, failed: &mut Option<RequestError>| {
            for answer in answers {
                match self.wait_long(&answer) {
                    Ok(Ok(topic)) => ids.push(topic),
                    Ok(Err(why)) => {
                        failed.get_or_insert(why.into());
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        };
        match pipelined(
            names.chunks(tidings_gms::NAMES_PER_REQUEST_MAX),
            send,
            collect,
        ) {
            Some(e) => Err(e),
            None => Ok(ids),
        }
    }

    /// Like `wait`, for requests that need the membership service: twice the request timeout.
    fn wait_long<T>(&self, answer: &mpsc::Receiver<T>) -> Result<T, RequestError> {
        self.wait_for(answer, self.config.request_timeout * 2)
    }

    /// A scheduler task running `callback` for each delivery of a batch, then waking the core
    /// thread if it waits for room.
    fn delivery_task<F>(&self, share: f64, mut callback: F) -> Result<SubTask, RequestError>
    where
        F: FnMut(Delivery) + Send + 'static,
    {
        self.batch_task(share, move |batch: &mut Deliveries| {
            for d in batch.drain() {
                callback(d);
            }
        })
    }

    /// A scheduler task running `callback` for each batch, then counting its messages and
    /// waking the core thread if it waits for room.
    fn batch_task<F>(&self, share: f64, mut callback: F) -> Result<SubTask, RequestError>
    where
        F: FnMut(&mut Deliveries) + Send + 'static,
    {
        let scheduler = self.scheduler.as_ref().ok_or(RequestError::Closed)?;
        let shared = Arc::clone(&self.shared);
        let delivered = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&delivered);
        let handle = scheduler
            .add_task(share, move |mut batch: Deliveries| {
                let n = batch.len() as u64;
                callback(&mut batch);
                count.fetch_add(n, Ordering::Relaxed);
                shared.delivered();
            })
            .map_err(|e| RequestError::Share(e.share))?;
        Ok(SubTask {
            handle,
            delivered,
            group: None,
        })
    }

    /// Installs a new membership (from the GMS), and a new address book if given. Multicast
    /// groups are joined and left to match.
    pub fn set_membership(
        &self,
        membership: Membership,
        addresses: Option<AddressBook>,
    ) -> Result<(), RequestError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.shared.send(Control::SetMembership {
            membership,
            addresses,
            reply,
        });
        self.wait(&answer)?.map_err(RequestError::Refused)
    }

    /// Serves this node's metrics on `bind` (`GET /metrics`, OpenMetrics text) until the
    /// returned server is dropped; each scrape asks the core thread for a snapshot. A node of
    /// a membership service tells it where (so that `tidings top --gms` finds the node).
    pub fn serve_metrics(
        &self,
        bind: SocketAddr,
    ) -> Result<crate::metrics::MetricsServer, crate::metrics::MetricsError> {
        let server = self.serve_metrics_unannounced(bind)?;
        self.shared
            .send(Control::AnnounceMetrics(Some(server.local_addr())));
        Ok(server)
    }

    fn serve_metrics_unannounced(
        &self,
        bind: SocketAddr,
    ) -> Result<crate::metrics::MetricsServer, crate::metrics::MetricsError> {
        let shared = Arc::clone(&self.shared);
        let timeout = self.config.request_timeout;
        let me = self.me.0;
        let topics_max = self.config.metrics_topics_max;
        let streams_max = self.config.metrics_streams_max;
        crate::metrics::MetricsServer::start(
            bind,
            Box::new(move |registry| {
                if !shared.is_running() {
                    return Err("the node has stopped".to_owned());
                }
                let (reply, answer) = mpsc::sync_channel(1);
                shared.send(Control::Stats { reply });
                let stats = answer
                    .recv_timeout(timeout)
                    .map_err(|_| "the node did not answer in time".to_owned())?;
                crate::metrics::register_node(registry, me, &stats, topics_max, streams_max);
                Ok(())
            }),
        )
    }

    /// A copy of the counters (the runtime's and the protocol's).
    pub fn stats(&self) -> Result<RuntimeStats, RequestError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.shared.send(Control::Stats { reply });
        self.wait(&answer)
    }

    fn wait<T>(&self, answer: &mpsc::Receiver<T>) -> Result<T, RequestError> {
        self.wait_for(answer, self.config.request_timeout)
    }

    fn wait_for<T>(
        &self,
        answer: &mpsc::Receiver<T>,
        timeout: std::time::Duration,
    ) -> Result<T, RequestError> {
        if !self.shared.is_running() {
            return Err(RequestError::Closed);
        }
        match answer.recv_timeout(timeout) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => Err(RequestError::Timeout),
            Err(RecvTimeoutError::Disconnected) => Err(RequestError::Closed),
        }
    }

    /// Stops the core thread, then runs every delivery already handed to subscriptions and
    /// stops the workers; returns the final counters.
    pub fn shutdown(mut self) -> Result<RuntimeStats, ShutdownError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<RuntimeStats, ShutdownError> {
        let mut stats = RuntimeStats::default();
        if let Some(thread) = self.thread.take() {
            self.shared.send(Control::Shutdown);
            stats = thread.join().map_err(|_| ShutdownError::CorePanicked)?;
        }
        if let Some(scheduler) = self.scheduler.take() {
            // The core thread has stopped, so nothing pushes any more: draining is bounded.
            scheduler.shutdown(ShutdownMode::Drain)?;
        }
        Ok(stats)
    }
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A subscription to one topic; dropping it (or [`unsubscribe`](Subscription::unsubscribe))
/// stops deliveries.
#[derive(Debug)]
pub struct Subscription {
    topic: TopicId,
    task: SubTask,
    shared: Arc<CoreShared>,
}

impl Subscription {
    /// The topic.
    #[must_use]
    pub fn topic(&self) -> TopicId {
        self.topic
    }

    /// The delivery task's counters (batches run, time spent, queue length in batches): the
    /// whole group's for a topic of [`subscribe_named_group`](NodeRuntime::subscribe_named_group).
    #[must_use]
    pub fn stats(&self) -> TaskStats {
        self.task.stats()
    }

    /// Changes the share of the workers' time this subscription gets when topics compete (the
    /// whole group's, for a topic of a group).
    pub fn set_share(&self, share: f64) -> Result<(), RequestError> {
        self.task
            .set_share(share)
            .map_err(|e| RequestError::Share(e.share))
    }

    /// Stops deliveries (those already queued are dropped).
    pub fn unsubscribe(self) {}
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // A group's shared task goes with its last subscription; the others' messages go on.
        let last = self
            .task
            .group
            .as_ref()
            .is_none_or(|g| g.group.drop_subscription(g.index));
        if last {
            self.task.remove();
        }
        if self.shared.is_running() {
            self.shared.send(Control::Unsubscribe {
                topic: self.topic,
                task: self.task.id(),
            });
        }
    }
}

/// Carries the join handshake's datagrams and timeouts on `socket` before the core thread exists
/// (the protocol node needs the id the service gives) until the service welcomes the node or
/// `join_timeout` passes. What the service sends meanwhile is kept by `joining` for the member.
fn handshake(
    socket: &std::net::UdpSocket,
    gms: &GmsLinkConfig,
    joining: &mut Joining,
) -> Result<(), StartError> {
    socket.set_read_timeout(Some(std::time::Duration::from_millis(20)))?;
    let start = clock::now();
    let mut buf = vec![0u8; 65_536];
    loop {
        let now = clock::now();
        if joining.poll_timeout().is_some_and(|t| t <= now) {
            joining.handle_timeout(now);
        }
        while let Some((replica, datagram)) = joining.poll_gms_transmit() {
            // An unreachable service shows as a refused send (ICMP): keep trying until the
            // timeout, the service may be starting. The client names replicas below
            // `client.replicas`, which `validate` checked equals the number of addresses.
            if let Some(&server) = gms.servers.get(replica) {
                let _ = socket.send_to(&datagram, server);
            }
        }
        if joining.is_joined() {
            socket.set_read_timeout(None)?;
            return Ok(());
        }
        // A refusal is authenticated: final at once. A wrong service key shows as unreadable
        // notices, which anyone can send: reported when the join times out.
        let refusal = joining.link_refusal().cloned();
        if let Some(reason @ tidings_seal::LinkError::NotAdmitted(_)) = refusal.clone() {
            return Err(StartError::NotAdmitted {
                servers: gms.servers.clone(),
                reason,
            });
        }
        let waited = now.saturating_duration_since(start);
        if let (true, Some(reason)) = (waited >= gms.join_timeout, refusal) {
            return Err(StartError::NotAdmitted {
                servers: gms.servers.clone(),
                reason,
            });
        }
        if waited >= gms.join_timeout {
            return Err(StartError::GmsUnreachable {
                servers: gms.servers.clone(),
                waited,
            });
        }
        if let Ok((len, from)) = socket.recv_from(&mut buf) {
            if let (Some(replica), Some(datagram)) = (gms.replica_of(from), buf.get(..len)) {
                joining.handle_gms_datagram(clock::now(), replica, datagram);
            }
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit (as Go's runtime does at
/// start), when `RuntimeConfig::raise_open_file_limit` asks. Best effort: where the limit
/// cannot be raised, groups that find no descriptor are refused with the reason
/// (`Core::sync_groups`).
#[cfg(unix)]
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

#[cfg(not(unix))]
fn raise_open_file_limit() {}
