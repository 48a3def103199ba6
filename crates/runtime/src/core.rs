//! The core thread (docs/design.md section 5, paper 000 section 3): one thread per node that owns the
//! protocol and serves three queues in rounds:
//!
//! * the **request queue** (lock-free, from application threads): control requests, then every
//!   publisher's queue, no quantum but at most what was queued when the round started;
//! * the **I/O queue** (`epoll` through mio): sockets are drained in batches (`recvmmsg`, GRO),
//!   the batch is sorted by priority (control, then recovery, then data; Fig. 12) and processed,
//!   then datagrams are pulled from the protocol while the socket can send (GSO runs); inbound
//!   before outbound; at most `io_quantum`;
//! * the **alarm queue**: a table of named alarms (the protocol's next deadline, the one-second
//!   statistics tick), fired for at most `alarm_quantum`, with their lateness measured.
//!
//! When no queue has work the thread sleeps in `epoll_wait` until the next alarm, a packet, or
//! the waker (application requests, a subscription that has room again); with
//! `RuntimeConfig::idle_spin` it first keeps polling that long after its last work.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_queue::SegQueue;
use mio::{Events, Interest, Poll, Token, Waker};
use tidings_gms::{
    unframe, GmsClient, Member, MemberEvent, NamedRefusal, NamedRequest, ReceivedDatagram,
    RegionAddress, Stall,
};
use tidings_proto::{
    Delivery, Event, Membership, MsgId, Priority, PublishError, RegionId, Time, TopicId,
};
use tidings_sched::handoff::{ReadyFlag, ReadyList};
use tidings_sched::{TaskId, TryPushError};

use crate::addr::{AddressBook, Routes};
use crate::batch::{BatchPool, Deliveries, SubTask, BATCH_MSGS_MAX};
use crate::clock;
use crate::config::{RuntimeConfig, Transport};
use crate::flow::Unread;
use crate::net::{self, Flush, NetSocket, RxBuffers, TxBatch, TxCounts};
use crate::oplog::{self, ViewLog};
use crate::publish::{request_cost, PublishRequest, PublishRoom, PublisherCore};
use crate::stats::{HeldGroupState, HeldTopicState, RuntimeStats, SubscriptionState};

const WAKER: Token = Token(0);
const UNICAST: Token = Token(1);
/// Multicast group sockets are `Token(GROUP_BASE + slot)`.
const GROUP_BASE: usize = 2;
/// Interval of the statistics tick (per-second maxima).
const TICK: Duration = Duration::from_secs(1);
/// Longest sleep while a topic is held for a subscription without room: the reader (or the
/// workers, for a full task queue) wake the core thread when room returns, so this only bounds
/// the damage of a missed wake-up.
const HELD_SLEEP_MAX: Duration = Duration::from_millis(50);
/// Emptied backlogs of held topics kept for the next holds: a group's hold ended by topic
/// ([`Core::dissolve_group_hold`]) holds every topic with runs in its backlog on its own,
/// hundreds at once with thousands of topics, each with a backlog (a few hundred bytes kept at
/// most).
const SPARE_BACKLOGS: usize = 1024;
/// Storage of ended group holds kept for the next (a node has few group subscriptions).
const SPARE_GROUP_HOLDS: usize = 4;
/// Readiness events taken per `epoll_wait`.
const EVENTS_CAPACITY: usize = 64;
/// Entries of the list of publishers with work. More publishers turning busy between two turns
/// of the core thread overflow it, and the core then looks at every publisher once: correct,
/// only slower (a bound on the list's memory, 16 bytes per entry, not on publishers).
const READY_LIST_CAPACITY: usize = 4096;

/// A request from an application thread to the core thread.
pub(crate) enum Control {
    /// A new publisher's queue to serve.
    AddPublisher(Box<PublisherCore>),
    /// Deliveries of `topic` go (also) to `task`; the reply confirms it is in force.
    Subscribe {
        topic: TopicId,
        task: SubTask,
        reply: SyncSender<()>,
    },
    /// Stop delivering `topic` to `task`.
    Unsubscribe { topic: TopicId, task: TaskId },
    /// The deliveries of `task` are bounded by what its reader has not read (sent before the
    /// task's subscription request); after `max_wait` without room the subscription is dropped
    /// and `on_disconnect` told how long it waited.
    Bound {
        task: TaskId,
        unread: Arc<Unread>,
        max_wait: Option<Duration>,
        on_disconnect: Box<dyn FnOnce(Duration) + Send>,
    },
    /// Install a new membership (and, if given, address book).
    SetMembership {
        membership: Membership,
        addresses: Option<AddressBook>,
        reply: SyncSender<Result<(), String>>,
    },
    /// Subscribe through the GMS to the topic of this name, delivering to `task`; the reply (the
    /// topic's id) comes once this node is in a region that carries it.
    SubscribeNamed {
        name: String,
        task: SubTask,
        reply: SyncSender<Result<TopicId, NamedRefusal>>,
    },
    /// [`SubscribeNamed`](Control::SubscribeNamed) for several topics in one request to the
    /// GMS (at most `NAMES_PER_REQUEST_MAX`): a name, its task and its reply each.
    SubscribeNamedMany {
        entries: Vec<(String, SubTask, NamedReply)>,
    },
    /// Declare through the GMS that this node publishes on the topic of this name; the reply
    /// comes once the node knows the topic's regions.
    Advertise {
        name: String,
        reply: SyncSender<Result<TopicId, NamedRefusal>>,
    },
    /// [`Advertise`](Control::Advertise) for several topics in one request to the GMS (at most
    /// `NAMES_PER_REQUEST_MAX`): a name and its reply each.
    AdvertiseMany { entries: Vec<(String, NamedReply)> },
    /// Send a copy of the counters.
    Stats { reply: SyncSender<RuntimeStats> },
    /// Tell the membership service where this node serves its metrics.
    AnnounceMetrics(Option<std::net::SocketAddr>),
    /// Stop the core thread.
    Shutdown,
}

/// What application threads share with the core thread.
pub(crate) struct CoreShared {
    pub(crate) waker: Waker,
    /// The core thread is in (or about to enter) a blocking wait.
    pub(crate) sleeping: AtomicBool,
    /// The core thread is alive and taking requests.
    pub(crate) running: AtomicBool,
    /// A delivery is waiting for room in a subscription's queue: the workers count their
    /// deliveries down from here and the one that reaches zero wakes the core thread (0: no one
    /// waits). Waking only once half the full queue is delivered lets each wake-up move half a
    /// queue of events, instead of one wake-up per event when the subscriber is the bottleneck.
    pub(crate) deliveries_until_wake: AtomicUsize,
    pub(crate) controls: SegQueue<Control>,
    /// The publishers that queued messages (or were dropped) since the core thread last
    /// served them, by slot: a turn looks only at these, however many publishers there are.
    pub(crate) ready: ReadyList,
    /// The node-wide bound on queued publish requests.
    pub(crate) publish_room: PublishRoom,
    /// What the node's unstable messages wait for, while a region is stalled: written by the
    /// core thread when a stall starts or clears, read when a wait for stability times out.
    stalls: Mutex<Option<String>>,
}

impl std::fmt::Debug for CoreShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreShared")
            .field("sleeping", &self.sleeping)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

impl CoreShared {
    pub(crate) fn new(waker: Waker, publish_queued_node_bytes_max: usize) -> CoreShared {
        CoreShared {
            publish_room: PublishRoom::new(publish_queued_node_bytes_max),
            waker,
            sleeping: AtomicBool::new(false),
            running: AtomicBool::new(true),
            deliveries_until_wake: AtomicUsize::new(0),
            controls: SegQueue::new(),
            ready: ReadyList::with_capacity(READY_LIST_CAPACITY),
            stalls: Mutex::new(None),
        }
    }

    /// Describes the stalled regions for publishers that time out waiting for stability.
    fn set_stalls<'a>(&self, stalls: impl Iterator<Item = &'a Stall>) {
        let text: Vec<String> = stalls.map(Stall::to_string).collect();
        let text = (!text.is_empty()).then(|| text.join("; "));
        if let Ok(mut s) = self.stalls.lock() {
            *s = text;
        }
    }

    /// What the node's unstable messages wait for, if a region is stalled now.
    pub(crate) fn stalls(&self) -> Option<String> {
        self.stalls.lock().ok().and_then(|s| s.clone())
    }

    pub(crate) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// After a publisher queued a message (or was dropped): lists it for the core thread if it
    /// is not listed yet, then wakes the core thread if it sleeps. A wake-up costs a system
    /// call, so a busy core thread is not woken: it looks at its queues every round.
    pub(crate) fn notify_ready(&self, flag: &ReadyFlag) {
        // `mark` fences after the queued message, and again after a list entry it made, so the
        // read of `sleeping` below is ordered after both: it pairs with the fence in `Core::run`
        // between announcing sleep and looking at the queues once more.
        self.ready.mark(flag);
        // Only the first caller to see the flag writes the eventfd: one wake-up is enough, and
        // at high publish rates the others would each pay a system call for nothing.
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }

    /// Queues a control request and wakes the core thread.
    pub(crate) fn send(&self, control: Control) {
        self.controls.push(control);
        fence(Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// Wakes the core thread (a reader made room).
    pub(crate) fn wake(&self) {
        fence(Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// Called by a subscription's worker after running a delivery: counts down the deliveries
    /// the core thread waits for, and wakes it at the last.
    pub(crate) fn delivered(&self) {
        if self.deliveries_until_wake.load(Ordering::Acquire) == 0 {
            return;
        }
        let counted =
            self.deliveries_until_wake
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if counted == Ok(1) {
            let _ = self.waker.wake();
        }
    }
}

/// The protocol's next deadline, and when it became due as far as the core thread can know.
#[derive(Clone, Copy, Debug)]
struct ProtocolAlarm {
    deadline: Time,
    /// `deadline`, or, for a deadline that appeared already in the past, the earliest time the
    /// core thread could have known it: its last look, or its waking if it slept since (the
    /// inputs that made the deadline were taken after). Lateness is counted from here: a
    /// protocol deadline long past (a periodic scan not advanced while it had nothing to do)
    /// that first shows after a sleep is not seconds late.
    due: Time,
}

impl ProtocolAlarm {
    /// The alarm for `deadline`, read at a look where the one read before was `before` and
    /// where any new deadline can have been known since `known_since`.
    fn at(deadline: Time, before: Option<ProtocolAlarm>, known_since: Time) -> ProtocolAlarm {
        let due = match before {
            // Known before: late from its own due (a thread that overslept it shows).
            Some(a) if a.deadline == deadline => a.due,
            _ => deadline.max(known_since),
        };
        ProtocolAlarm { deadline, due }
    }
}

/// A socket receiving multicast groups of one port, and the groups joined on it.
struct GroupSocket {
    net: NetSocket,
    port: u16,
    /// Address of each group joined on the socket (once, however many regions share it).
    joined: Vec<Ipv4Addr>,
    /// No more groups go here: a join failed for the kernel's per-socket limit, or the socket
    /// is bound to its one group's address (`net::group_socket`).
    full: bool,
}

/// Where groups can still be joined: per port, the group sockets with room, and the free
/// slots of the socket table. Built once per `Core::sync_groups`, so that each join finds its
/// socket at once instead of looking through every group socket (a node in 100,000 regions
/// has about 5,000).
struct GroupRoom {
    by_port: FxHashMap<u16, Vec<usize>>,
    /// Lowest last, taken first.
    free_slots: Vec<usize>,
}

impl GroupRoom {
    fn of(groups: &[Option<GroupSocket>], per_socket: usize) -> GroupRoom {
        let mut room = GroupRoom {
            by_port: FxHashMap::default(),
            free_slots: Vec::new(),
        };
        for (slot, g) in groups.iter().enumerate().rev() {
            match g {
                None => room.free_slots.push(slot),
                Some(g) if !g.full && g.joined.len() < per_socket => {
                    room.by_port.entry(g.port).or_default().push(slot);
                }
                Some(_) => {}
            }
        }
        room
    }
}

/// The kernel's answer to a join past `igmp_max_memberships` on one socket.
const ENOBUFS: i32 = rustix::io::Errno::NOBUFS.raw_os_error();

/// The current id of `topic` as named by a publisher added after `epoch` rejoins, through the
/// rejoins since (`None` while a name is not bound again).
fn current_topic(
    moves: &[FxHashMap<TopicId, TopicId>],
    epoch: usize,
    topic: TopicId,
) -> Option<TopicId> {
    moves
        .get(epoch..)
        .unwrap_or_default()
        .iter()
        .try_fold(topic, |t, m| m.get(&t).copied())
}

/// How long a publisher whose topic is not yet bound again after a rejoin waits before it is
/// looked at again.
const TOPIC_MOVE_RETRY: Duration = Duration::from_millis(10);

/// The shared task of `topic`'s group, if `topic` is delivered to that task alone (subscribed
/// in one group, by nothing else; `group_topics` says) and is not held: its messages may join
/// a run of the group's other topics.
fn group_task(
    group_topics: &GroupTopics,
    held: &FxHashMap<TopicId, HeldTopic>,
    topic: TopicId,
) -> Option<TaskId> {
    if !held.is_empty() && held.contains_key(&topic) {
        return None;
    }
    group_topics.get(topic)
}

/// Topic ids below this are kept in [`GroupTopics`]' vector (8 bytes each, 512 KiB at most);
/// the membership service numbers topics from 1 up, so a node's are there unless it has tens
/// of thousands.
const DENSE_TOPIC_IDS: u32 = 1 << 16;

/// No task, in [`GroupTopics`]' vector (task ids count up from 0, so none is this).
const NO_TASK: u64 = u64::MAX;

/// The topics delivered to a group's shared task alone, with the task: looked up for every
/// message of a group's run. A vector indexed by topic id holds the ids below
/// [`DENSE_TOPIC_IDS`] (80 KB for 10,000 topics, which stays in cache where a hash map's
/// look-up of one of 10,000 topics taken round-robin missed it); larger ids (a static
/// membership may use any) are in a hash map.
#[derive(Debug, Default)]
struct GroupTopics {
    /// By topic id: the task's id, or [`NO_TASK`].
    dense: Vec<u64>,
    sparse: FxHashMap<TopicId, TaskId>,
    len: usize,
}

impl GroupTopics {
    fn get(&self, topic: TopicId) -> Option<TaskId> {
        if let Some(&task) = self.dense.get(topic.0 as usize) {
            if task != NO_TASK {
                return Some(TaskId(task));
            }
        }
        if self.sparse.is_empty() {
            return None;
        }
        self.sparse.get(&topic).copied()
    }

    /// Records `topic` as delivered to `task` alone; the task it was delivered to before.
    fn insert(&mut self, topic: TopicId, task: TaskId) -> Option<TaskId> {
        let old = if topic.0 < DENSE_TOPIC_IDS && task.0 != NO_TASK {
            let at = topic.0 as usize;
            if self.dense.len() <= at {
                self.dense.resize(at + 1, NO_TASK);
            }
            match self.dense.get_mut(at) {
                Some(slot) => {
                    let old = (*slot != NO_TASK).then_some(TaskId(*slot));
                    *slot = task.0;
                    old
                }
                None => self.sparse.insert(topic, task),
            }
        } else {
            self.sparse.insert(topic, task)
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, topic: TopicId) -> Option<TaskId> {
        let old = match self.dense.get_mut(topic.0 as usize) {
            Some(slot) if *slot != NO_TASK => {
                let task = TaskId(*slot);
                *slot = NO_TASK;
                Some(task)
            }
            _ => self.sparse.remove(&topic),
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.dense.clear();
        self.sparse.clear();
        self.len = 0;
    }

    /// The topics delivered to `task` alone.
    fn topics_of(&self, task: TaskId) -> impl Iterator<Item = TopicId> + '_ {
        let dense = self
            .dense
            .iter()
            .enumerate()
            .filter(move |&(_, &t)| t == task.0)
            .filter_map(|(at, _)| u32::try_from(at).ok().map(TopicId));
        let sparse = self
            .sparse
            .iter()
            .filter(move |&(_, &t)| t == task)
            .map(|(&topic, _)| topic);
        dense.chain(sparse)
    }
}

/// Pushes `event` to `task`. A full queue (a slow callback) asks the workers to wake the core
/// thread once half of it is delivered, then is tried once more: if that still finds it full,
/// all it holds is delivered after the count was set, so the count runs out.
fn push_or_wake(
    shared: &CoreShared,
    task: &SubTask,
    event: Deliveries,
) -> Result<(), TryPushError<Deliveries>> {
    match task.try_push(event) {
        Err(TryPushError::Full(event)) => {
            let wake_after = (task.queue_len() / 2).max(1);
            shared
                .deliveries_until_wake
                .store(wake_after, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let again = task.try_push(event);
            if again.is_ok() {
                // Room after all: no wake-up is owed.
                shared.deliveries_until_wake.store(0, Ordering::Release);
            }
            again
        }
        other => other,
    }
}

impl HeldGroup {
    /// Puts `batch` at the back of the backlog: into the last run while it has room, so that
    /// the release hands the backlog on in runs of up to `BATCH_MSGS_MAX` messages.
    fn append(&mut self, mut batch: Deliveries) {
        self.msgs += batch.len();
        if let Some(last) = self.backlog.back_mut() {
            if last.len() + batch.len() <= BATCH_MSGS_MAX {
                for d in batch.drain() {
                    last.push(d);
                }
                return;
            }
        }
        self.backlog.push_back(batch);
    }
}

/// A topic held back at this node because one of its subscriptions has no room: its streams
/// stop at this node ([`Member::hold_topic`]) while the others go on.
#[derive(Debug)]
struct HeldTopic {
    since: Time,
    /// Batches of the topic not handed on yet, in order: those the protocol had delivered
    /// before the hold took effect, each with where its hand-over stopped.
    backlog: VecDeque<(Deliveries, Position)>,
}

/// A group subscription's shared task, as the core thread hands it a group's runs: the task, and
/// its topics (those delivered to it alone) sorted, for holding them together.
#[derive(Debug)]
struct GroupTask {
    task: SubTask,
    /// Entries of `Core::group_topics` naming this task.
    topics: usize,
    /// Those topics, sorted; rebuilt from `Core::group_topics` when `stale`.
    sorted: Vec<TopicId>,
    stale: bool,
}

/// A group subscription held as one because its shared task had no room: the protocol holds
/// its topics together ([`Member::hold_topics`]) and its runs wait in one backlog, in the
/// order they came, whatever their topics.
#[derive(Debug)]
struct HeldGroup {
    task: SubTask,
    since: Time,
    /// The topics the protocol holds for the group, sorted: the group's topics when the hold
    /// began (less those held on their own), and those bound to it since.
    topics: Vec<TopicId>,
    /// Runs of the group not handed on yet, in order; each of at most `BATCH_MSGS_MAX`
    /// messages (a run that comes while the last one has room joins it).
    backlog: VecDeque<Deliveries>,
    /// Messages in `backlog`.
    msgs: usize,
}

/// Where the hand-over of a batch to its topic's subscriptions stopped: the subscription at
/// index `task` has its first `skip` messages, those before it have all of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Position {
    task: usize,
    skip: usize,
}

/// A subscription bounded by what its reader has not read ([`Control::Bound`]).
struct BoundSub {
    unread: Arc<Unread>,
    max_wait: Option<Duration>,
    on_disconnect: Option<Box<dyn FnOnce(Duration) + Send>>,
}

/// Where the answer to a named request (subscribe, advertise) goes: the topic's id, or why not.
type NamedReply = SyncSender<Result<TopicId, NamedRefusal>>;

/// Why requests that raced with the shutdown are refused.
const SHUTTING_DOWN: &str = "the runtime is shutting down";

/// Answers a named request with why it cannot be done.
fn refuse(reply: NamedReply, why: &str) {
    let _ = reply.send(Err(NamedRefusal::Other(why.to_owned())));
}

/// A named request waiting for its answer from the member, by the token it was made with.
enum Pending {
    Subscribe { task: SubTask, reply: NamedReply },
    Advertise { reply: NamedReply },
}

impl Pending {
    fn reply(self) -> NamedReply {
        match self {
            Pending::Subscribe { reply, .. } | Pending::Advertise { reply } => reply,
        }
    }
}

/// The node's link to the membership service, when it joined through one: the member's client
/// runs on the core thread and its datagrams share the unicast socket.
pub(crate) struct GmsLink {
    /// Every replica's address, by index: GMS datagrams go to the replica the member names,
    /// and only the replicas' are taken.
    servers: Vec<SocketAddr>,
    /// GMS datagrams received in the current batch, with the index of the replica they came
    /// from.
    inbox: Vec<(usize, Bytes)>,
}

impl GmsLink {
    pub(crate) fn new(servers: Vec<SocketAddr>) -> GmsLink {
        GmsLink {
            servers,
            inbox: Vec::new(),
        }
    }

    /// The index of the replica at `addr`, if it is one.
    fn replica_of(&self, addr: SocketAddr) -> Option<usize> {
        self.servers.iter().position(|&s| s == addr)
    }
}

/// Outcome of the send phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxOutcome {
    /// The protocol has nothing more to send.
    Idle,
    /// The socket buffer is full.
    Blocked,
    /// The I/O quantum ran out with data left.
    Expired,
}

/// Everything the core thread owns. Built on the caller's thread (so that setup errors return
/// from `start`), then moved to the core thread by [`Core::run`].
pub(crate) struct Core {
    /// The protocol node and its control plane.
    member: Member,
    config: RuntimeConfig,
    shared: Arc<CoreShared>,
    poll: Poll,
    unicast: NetSocket,
    /// Whether the unicast socket can take more (edge-triggered writable events).
    writable: bool,
    /// Multicast group sockets by slot (the slot gives the token), each with the groups joined
    /// on it.
    groups: Vec<Option<GroupSocket>>,
    /// Most groups joined on one socket (`net::groups_per_socket`).
    groups_per_socket: usize,
    routes: Routes,
    addresses: AddressBook,
    rx: RxBuffers,
    arena: tidings_gms::BlockArena,
    /// The received batch, by priority class (control, recovery, data): each datagram opened
    /// where it was received ([`Member::open_received`]), with whether it came on a multicast
    /// group (where regions may share the group).
    classes: [Vec<(Bytes, bool)>; 3],
    tx: TxBatch,
    /// The protocol may have datagrams to send (set after every input).
    tx_more: bool,
    loss_rng: fastrand::Rng,
    /// The publishers by slot (a slot is reused once its publisher is forgotten).
    publishers: Vec<Option<PublisherCore>>,
    /// Slots of forgotten publishers.
    free_slots: Vec<u32>,
    /// Slots to serve in the next turn besides the ready list: publishers with messages left
    /// (refused by the protocol for now, or queued while they were served) and new ones.
    active: Vec<u32>,
    /// Scratch for the slots served in a turn (kept to reuse its storage).
    serving: Vec<u32>,
    /// Slots of publishers whose stable ticket advanced during the current batch of events.
    advanced: Vec<u32>,
    /// Owner (slot in `publishers`) of each message id from `owners_base`, and when the core
    /// took it (for `RuntimeStats::time_to_stable`), until stable.
    owners: VecDeque<Option<(u32, Time)>>,
    owners_base: u64,
    /// The subscriptions of each topic, looked up per delivery: Fx hashing (the std hasher was
    /// 0.9% of a subscriber's CPU at 1 -> 1; keys are topic ids this node subscribed to, so
    /// hostile input can only look up, not shape the table).
    subscriptions: FxHashMap<TopicId, Vec<SubTask>>,
    /// After a rejoin, the subscriptions by their old topic id until the name is bound again
    /// (`MemberEvent::TopicMoved`).
    subscriptions_moving: FxHashMap<TopicId, Vec<SubTask>>,
    /// Per rejoin, each topic's old id to its new one: publishers added before a rejoin name
    /// topics by old ids (`PublisherCore::epoch` is their index here).
    topic_moves: Vec<FxHashMap<TopicId, TopicId>>,
    /// The bounded subscriptions, by task.
    bounds: FxHashMap<TaskId, BoundSub>,
    /// Topics held back now, with the deliveries that wait for room (a hash map, which keeps
    /// its storage: a reader that keeps filling its queue makes holds come and go).
    held: FxHashMap<TopicId, HeldTopic>,
    /// Storage reused across holds: emptied backlogs, and the held topics of a retry.
    spare_backlogs: Vec<VecDeque<(Deliveries, Position)>>,
    held_scratch: Vec<TopicId>,
    /// Storage reused for the one-topic runs a group's run is cut into when its task is full.
    split_scratch: Vec<Deliveries>,
    /// The group subscriptions held as one now (few: at most one per group subscription).
    held_groups: Vec<HeldGroup>,
    /// Storage of ended group holds (topics, backlog), reused by the next.
    spare_groups: Vec<(Vec<TopicId>, VecDeque<Deliveries>)>,
    /// Messages in the held topics' and groups' backlogs.
    backlog_total: usize,
    /// Storage of delivery batches, recycled by the workers that ran them.
    batch_pool: Arc<BatchPool>,
    /// The run of one topic's deliveries taken from the protocol and not handed on yet: handed
    /// on as one batch when another topic or another kind of event comes, or the events run
    /// out. A run of a group's topic ([`NodeRuntime::subscribe_named_group`]) takes the
    /// group's other topics too.
    ///
    /// [`NodeRuntime::subscribe_named_group`]: crate::NodeRuntime::subscribe_named_group
    run: Option<Deliveries>,
    /// The protocol's events taken in bulk and not yet handled (empty between rounds; kept for
    /// its storage).
    protocol_events: VecDeque<Event>,
    /// The shared task of the current run's group, if the run is a group's.
    run_group: Option<TaskId>,
    /// The topics delivered to a group's shared task alone, with the task: looked up per
    /// message of a group's run, so kept apart from `subscriptions` (no task list to follow).
    /// Refreshed wherever a topic's subscriptions change ([`Core::refresh_group`]).
    group_topics: GroupTopics,
    /// The shared tasks named in `group_topics`, each with its topics.
    group_tasks: FxHashMap<TaskId, GroupTask>,
    alarm: Option<ProtocolAlarm>,
    last_look: Time,
    /// When the thread last woke from `poll` (the start of the cycle).
    woke_at: Time,
    /// The start of the last cycle that did work (served a request, received or sent a
    /// datagram): the thread polls without sleeping until `RuntimeConfig::idle_spin` after it.
    worked_at: Time,
    next_tick: Time,
    stats: RuntimeStats,
    shutdown: bool,
    gms: Option<GmsLink>,
    local_addr: SocketAddr,
    /// Named requests waiting for their answers, by token.
    pending: HashMap<u64, Pending>,
    next_token: u64,
    /// The address book of the next whole install (`Control::SetMembership`).
    addresses_next: Option<AddressBook>,
    /// What went wrong at the last install (a multicast group not joined), if anything.
    install_error: Option<String>,
    /// Regions whose multicast group could not be joined, with the reason.
    unjoined: BTreeMap<RegionId, String>,
    /// The names of the topics this node asked for by name, as the service bound them.
    topic_names: BTreeMap<TopicId, String>,
    /// The regions stalled now (`MemberEvent::Stalled`).
    stalls: BTreeMap<RegionId, Stall>,
    /// What the view lines compare against (`oplog`).
    view_log: ViewLog,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("node", &self.member.id())
            .finish_non_exhaustive()
    }
}

fn priority_class(p: Priority) -> usize {
    match p {
        Priority::Control => 0,
        Priority::Recovery => 1,
        Priority::Data => 2,
    }
}

impl Core {
    /// Sets up sockets and the poller; `socket` is the node's bound unicast socket.
    pub(crate) fn new(
        member: Member,
        config: RuntimeConfig,
        addresses: AddressBook,
        socket: std::net::UdpSocket,
        gms: Option<GmsLink>,
    ) -> io::Result<(Core, Arc<CoreShared>)> {
        let local_addr = socket.local_addr()?;
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(CoreShared::new(waker, config.publish_queued_node_bytes_max));
        let mut unicast = net::unicast_socket(socket, &config)?;
        poll.registry().register(
            &mut unicast.socket,
            UNICAST,
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let routes = Routes::new(
            member.id(),
            member.node().membership(),
            &addresses,
            &config.transport,
        );
        let gso_segments = if config.gso {
            unicast.state.max_gso_segments()
        } else {
            1
        };
        let mut stats = RuntimeStats {
            gso_segments_max: gso_segments,
            gro_segments: unicast.state.gro_segments(),
            ..RuntimeStats::default()
        };
        {
            let s = socket2::SockRef::from(&unicast.socket);
            stats.socket_recv_buffer_bytes = s.recv_buffer_size().unwrap_or(0);
            stats.socket_send_buffer_bytes = s.send_buffer_size().unwrap_or(0);
        }
        let tx = TxBatch::new(
            config.send_batch_datagrams_max,
            member.node().config().max_datagram_bytes + member.datagram_overhead(),
            gso_segments,
        );
        let batch = config.recv_batch_datagrams_max;
        let now = clock::now();
        let mut core = Core {
            loss_rng: fastrand::Rng::with_seed(config.receive_loss_seed),
            member,
            shared: Arc::clone(&shared),
            poll,
            unicast,
            writable: true,
            groups: Vec::new(),
            groups_per_socket: net::groups_per_socket(),
            routes,
            addresses,
            rx: RxBuffers::new(),
            arena: RxBuffers::arena(),
            classes: [
                Vec::with_capacity(batch),
                Vec::with_capacity(batch),
                Vec::with_capacity(batch),
            ],
            tx,
            tx_more: true,
            publishers: Vec::new(),
            free_slots: Vec::new(),
            active: Vec::new(),
            serving: Vec::new(),
            advanced: Vec::new(),
            owners: VecDeque::new(),
            owners_base: 1,
            subscriptions: FxHashMap::default(),
            subscriptions_moving: FxHashMap::default(),
            topic_moves: Vec::new(),
            bounds: FxHashMap::default(),
            held: FxHashMap::default(),
            spare_backlogs: Vec::new(),
            held_scratch: Vec::new(),
            split_scratch: Vec::new(),
            held_groups: Vec::new(),
            spare_groups: Vec::new(),
            backlog_total: 0,
            batch_pool: BatchPool::new(),
            run: None,
            protocol_events: VecDeque::new(),
            run_group: None,
            group_topics: GroupTopics::default(),
            group_tasks: FxHashMap::default(),
            alarm: None,
            last_look: now,
            woke_at: now,
            worked_at: Time::ZERO,
            next_tick: now + TICK,
            stats,
            shutdown: false,
            config,
            gms,
            local_addr,
            pending: HashMap::new(),
            next_token: 1,
            addresses_next: None,
            install_error: None,
            unjoined: BTreeMap::new(),
            topic_names: BTreeMap::new(),
            stalls: BTreeMap::new(),
            view_log: ViewLog::default(),
        };
        core.sync_groups()?;
        core.look_at_deadline(now);
        Ok((core, shared))
    }

    /// The core loop. Returns the final counters when asked to shut down.
    pub(crate) fn run(mut self) -> RuntimeStats {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.shutdown {
            let now = clock::now();
            let mut timeout = self.sleep_timeout(now);
            let mut spinning = false;
            if timeout != Some(Duration::ZERO)
                && now.saturating_duration_since(self.worked_at) < self.config.idle_spin
            {
                // The idle spin: look again without sleeping. No sleep is announced, so an
                // application thread queueing work writes no eventfd either.
                timeout = Some(Duration::ZERO);
                spinning = true;
            }
            if timeout != Some(Duration::ZERO) {
                // Announce the sleep, then look at the request queues once more: an application
                // thread that queued work before seeing the flag is caught here (see
                // `CoreShared::notify`).
                self.shared.sleeping.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if self.requests_pending() {
                    timeout = Some(Duration::ZERO);
                } else {
                    self.stats.sleeps += 1;
                }
            }
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // epoll itself failed: nothing can be served; stop rather than spin.
                    self.shutdown = true;
                }
            }
            self.shared.sleeping.store(false, Ordering::Relaxed);
            if spinning && events.is_empty() && !self.requests_pending() {
                // Nothing yet: look again. No `yield`: on a host whose cores are busy it would
                // give the core away for a whole time slice.
                std::hint::spin_loop();
                continue;
            }
            let start = clock::now();
            self.woke_at = start;
            let moved = (self.stats.datagrams_received, self.stats.datagrams_sent);
            for event in &events {
                match event.token() {
                    WAKER => {}
                    UNICAST => {
                        if event.is_readable() || event.is_error() {
                            self.unicast.readable = true;
                        }
                        if event.is_writable() || event.is_error() {
                            self.writable = true;
                        }
                    }
                    Token(t) => {
                        if let Some(Some(g)) = self.groups.get_mut(t - GROUP_BASE) {
                            g.net.readable = true;
                        }
                    }
                }
            }
            self.serve_requests(start);
            if self.shutdown {
                break;
            }
            self.serve_io(start);
            if moved != (self.stats.datagrams_received, self.stats.datagrams_sent) {
                self.worked_at = start;
            }
            self.serve_alarms();
            self.stats.cycles += 1;
            self.stats
                .cycle_time
                .record(clock::now().saturating_duration_since(start));
        }
        self.stop()
    }

    /// Zero if some queue has work now, else how long the thread may sleep.
    fn sleep_timeout(&mut self, now: Time) -> Option<Duration> {
        if !self.held.is_empty() || !self.held_groups.is_empty() {
            self.retry_held(now);
        }
        let reading = self.reading();
        let readable =
            self.unicast.readable || self.groups.iter().flatten().any(|g| g.net.readable);
        let sending = self.writable && (self.tx_more || self.tx.has_pending());
        let stalled = self.active_publishers().any(|p| {
            p.retry_at.is_none_or(|t| now >= t)
                && p.stalled.as_ref().is_some_and(|r| {
                    current_topic(&self.topic_moves, p.epoch, r.topic)
                        .is_none_or(|t| self.member.can_publish(t, r.payload.len()))
                })
        });
        if (reading && readable) || sending || stalled {
            return Some(Duration::ZERO);
        }
        let mut next = self.next_tick;
        if let Some(a) = self.alarm {
            next = next.min(a.due);
        }
        for t in self.active_publishers().filter_map(|p| p.retry_at) {
            next = next.min(t);
        }
        let mut sleep = next.saturating_duration_since(now);
        if !self.held_groups.is_empty() {
            sleep = sleep.min(HELD_SLEEP_MAX);
        }
        if !self.held.is_empty() {
            sleep = sleep.min(HELD_SLEEP_MAX);
            for deadline in self.disconnect_deadlines() {
                sleep = sleep.min(deadline.saturating_duration_since(now));
            }
        }
        Some(sleep)
    }

    /// Whether the sockets are read: unless the held topics' and groups' backlogs (what the
    /// protocol delivered before their holds took effect) reach `delivery_backlog_msgs`.
    fn reading(&self) -> bool {
        self.backlog_total == 0 || self.backlog_total < self.config.delivery_backlog_msgs
    }

    /// Whether application threads queued work.
    fn requests_pending(&self) -> bool {
        !self.shared.controls.is_empty()
            || self.shared.ready.has_work()
            || self.active_publishers().any(|p| p.stalled.is_none())
    }

    /// The publishers the next turn serves besides the ready list (few: the stalled ones and
    /// those with messages left).
    fn active_publishers(&self) -> impl Iterator<Item = &PublisherCore> {
        self.active
            .iter()
            .filter_map(|&slot| self.publishers.get(slot as usize)?.as_ref())
    }

    // ---- The request queue -------------------------------------------------------------

    fn serve_requests(&mut self, now: Time) {
        let mut took = false;
        // Only what was queued when the round started: a control request queued meanwhile waits
        // one round.
        for _ in 0..self.shared.controls.len() {
            let Some(control) = self.shared.controls.pop() else {
                break;
            };
            self.handle_control(now, control);
            took = true;
        }
        // The unsubscriptions of this round go together (the member gathers them until its
        // outputs are drained), and the answers and installs the requests brought are taken.
        self.drain_events();
        self.send_gms();
        self.take_ready();
        // Each listed publisher once, in the order they became ready; those with messages
        // left go to the back of the list for the next turn.
        let mut serving = std::mem::take(&mut self.serving);
        std::mem::swap(&mut serving, &mut self.active);
        let mut left_bytes = 0;
        for &slot in &serving {
            let (taken_bytes, drained) = self.serve_publisher(now, slot);
            took |= taken_bytes > 0;
            left_bytes += taken_bytes;
            self.after_serving(slot, drained);
        }
        serving.clear();
        self.serving = serving;
        self.shared.publish_room.taken(left_bytes);
        if took {
            self.worked_at = now;
            self.tx_more = true;
            self.drain_events();
            self.look_at_deadline(now);
        }
    }

    fn handle_control(&mut self, now: Time, control: Control) {
        match control {
            Control::AddPublisher(publisher) => self.add_publisher(*publisher),
            Control::Subscribe { topic, task, reply } => {
                self.subscriptions.entry(topic).or_default().push(task);
                self.refresh_group(topic);
                let _ = reply.send(());
            }
            Control::Unsubscribe { topic, task } => self.remove_subscription(now, topic, task),
            Control::Bound {
                task,
                unread,
                max_wait,
                on_disconnect,
            } => {
                self.bounds.insert(
                    task,
                    BoundSub {
                        unread,
                        max_wait,
                        on_disconnect: Some(on_disconnect),
                    },
                );
            }
            Control::SetMembership {
                membership,
                addresses,
                reply,
            } => {
                self.addresses_next = addresses;
                self.install_error = None;
                self.member.set_membership(now, membership);
                // The install is made effective (routes, groups) as its event is taken.
                self.drain_control_events();
                let result = match self.install_error.take() {
                    Some(why) => Err(why),
                    None => Ok(()),
                };
                let _ = reply.send(result);
            }
            Control::SubscribeNamed { name, task, reply } => {
                let token = self.pend(Pending::Subscribe { task, reply });
                self.member
                    .request_named(now, NamedRequest::Subscribe, vec![(token, name)]);
            }
            Control::SubscribeNamedMany { entries } => {
                let names = entries
                    .into_iter()
                    .map(|(name, task, reply)| {
                        (self.pend(Pending::Subscribe { task, reply }), name)
                    })
                    .collect();
                self.member
                    .request_named(now, NamedRequest::Subscribe, names);
            }
            Control::Advertise { name, reply } => {
                let token = self.pend(Pending::Advertise { reply });
                self.member
                    .request_named(now, NamedRequest::Advertise, vec![(token, name)]);
            }
            Control::AdvertiseMany { entries } => {
                let names = entries
                    .into_iter()
                    .map(|(name, reply)| (self.pend(Pending::Advertise { reply }), name))
                    .collect();
                self.member
                    .request_named(now, NamedRequest::Advertise, names);
            }
            Control::Stats { reply } => {
                let _ = reply.send(self.snapshot());
            }
            // Leave the group first, so that the others' views drop this node at once rather
            // than after a failure timeout; the thread stops at `MemberEvent::Left`.
            Control::Shutdown => self.member.leave(now),
            Control::AnnounceMetrics(addr) => self.member.announce_metrics(now, addr),
        }
    }

    /// Keeps a named request's reply until the member answers it; its token.
    fn pend(&mut self, pending: Pending) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, pending);
        token
    }

    // ---- The control plane ------------------------------------------------------------

    /// Acts on one of the member's own events.
    fn on_member_event(&mut self, event: MemberEvent) {
        if !matches!(event, MemberEvent::Protocol(_)) {
            // Installs, answers and rejoins change the subscriptions: the run so far goes to
            // those it was delivered for.
            self.flush_run();
        }
        match event {
            MemberEvent::Protocol(e) => self.on_protocol_event(e),
            MemberEvent::Installed { changed } => {
                let membership = self.member.node().membership();
                self.view_log.installed(membership, changed.as_deref());
                if let Err(e) = self.installed(changed) {
                    self.install_error = Some(e.to_string());
                }
            }
            MemberEvent::Answered { token, result } => match self.pending.remove(&token) {
                Some(Pending::Subscribe { task, reply }) => {
                    if let Ok(topic) = result {
                        if let Some(g) = &task.group {
                            g.group.bind(topic, g.index);
                        }
                        self.subscriptions.entry(topic).or_default().push(task);
                        self.refresh_group(topic);
                    }
                    let _ = reply.send(result);
                }
                Some(Pending::Advertise { reply }) => {
                    let _ = reply.send(result);
                }
                None => {}
            },
            MemberEvent::TopicBound { name, topic } => {
                // Names of the topics this node asked for (as many as it asked for), for
                // the metrics' labels.
                self.topic_names.insert(topic, name);
            }
            MemberEvent::Removed => {
                oplog::removed(self.member.is_leaving());
                self.stats.gms_removed = true;
            }
            MemberEvent::Rejoined {
                old,
                new,
                incarnation,
                abandoned,
            } => {
                oplog::rejoined(old, new, incarnation, abandoned.len());
                self.stats.gms_rejoins += 1;
                self.stats.messages_abandoned += abandoned.len() as u64;
                // Never sent again: the publishers' windows let them go.
                for msg_id in abandoned {
                    self.on_stable(msg_id, msg_id);
                }
                self.topic_moves.push(FxHashMap::default());
                // The new protocol node holds nothing: a held group's backlog waits per topic,
                // re-keyed and held again by topic as each name is bound again.
                while !self.held_groups.is_empty() {
                    self.dissolve_group_hold(0, true);
                }
                self.subscriptions_moving
                    .extend(std::mem::take(&mut self.subscriptions));
                self.group_topics.clear();
                self.group_tasks.clear();
                self.topic_names.clear();
            }
            MemberEvent::TopicMoved { old, new, .. } => {
                if let Some(moves) = self.topic_moves.last_mut() {
                    moves.insert(old, new);
                }
                if let Some(tasks) = self.subscriptions_moving.remove(&old) {
                    for g in tasks.iter().filter_map(|t| t.group.as_ref()) {
                        g.group.rebind(old, new);
                    }
                    self.subscriptions.entry(new).or_default().extend(tasks);
                    self.refresh_group(new);
                }
                if let Some(mut held) = self.held.remove(&old) {
                    // Still full: the new node holds the topic too, and what the old one had
                    // delivered goes on waiting, under the topic's new id.
                    for (batch, _) in &mut held.backlog {
                        batch.retopic(new);
                    }
                    self.member.hold_topic(new);
                    self.held.insert(new, held);
                }
            }
            MemberEvent::Left => self.shutdown = true,
            MemberEvent::Stalled(stall) => {
                oplog::stalled(&stall);
                self.stalls.insert(stall.region, stall);
                self.shared.set_stalls(self.stalls.values());
            }
            MemberEvent::StallCleared { region, waited } => {
                oplog::stall_cleared(region, waited);
                self.stalls.remove(&region);
                self.shared.set_stalls(self.stalls.values());
            }
        }
    }

    /// Takes the member's own events (installs, answers) ahead of the protocol's: used where
    /// a full subscription holds the protocol's events back.
    fn drain_control_events(&mut self) {
        while let Some(event) = self.member.poll_control_event() {
            self.on_member_event(event);
        }
    }

    /// Makes an install effective: the address book, the routes (of the `changed` regions, or
    /// all), the multicast groups; the member learns which regions cannot be received.
    fn installed(&mut self, changed: Option<Vec<RegionId>>) -> io::Result<()> {
        self.stats.memberships_installed += 1;
        let me = self.member.id();
        match changed {
            None => {
                if self.gms.is_some() {
                    self.addresses = self.gms_address_book();
                } else if let Some(book) = self.addresses_next.take() {
                    self.addresses = book;
                }
                self.routes = Routes::new(
                    me,
                    self.member.node().membership(),
                    &self.addresses,
                    &self.config.transport,
                );
            }
            Some(changed) => {
                self.addresses = self.gms_address_book_after(&changed);
                let membership = self.member.node().membership();
                self.routes.update(
                    me,
                    membership,
                    &self.addresses,
                    &self.config.transport,
                    changed,
                );
                debug_assert_eq!(
                    self.routes,
                    Routes::new(me, membership, &self.addresses, &self.config.transport),
                    "routes updated by the change differ from routes built anew"
                );
            }
        }
        self.tx_more = true;
        let synced = self.sync_groups();
        self.member.set_unreachable(self.unjoined.clone());
        synced
    }

    /// Hands the GMS datagrams of the last batch to the member.
    fn gms_input(&mut self, now: Time) {
        let Some(link) = self.gms.as_mut() else {
            return;
        };
        let mut inbox = std::mem::take(&mut link.inbox);
        // One install for every batch the datagrams commit (ADR 23).
        self.member
            .handle_gms_datagrams(now, inbox.iter().map(|(r, d)| (*r, &d[..])));
        inbox.clear();
        if let Some(link) = self.gms.as_mut() {
            link.inbox = inbox;
        }
    }

    /// Sends what the member has for the membership service.
    fn send_gms(&mut self) {
        let Some(link) = self.gms.as_ref() else {
            return;
        };
        while let Some((replica, datagram)) = self.member.poll_gms_transmit() {
            let Some(&server) = link.servers.get(replica) else {
                // The client names replicas below `client.replicas`, which the link's
                // configuration keeps equal to the number of addresses.
                self.stats.send_errors += 1;
                continue;
            };
            // A lost send is the client's to resend (requests and acks are retried).
            match self.unicast.socket.send_to(&datagram, server) {
                Ok(_) => self.stats.gms_datagrams_sent += 1,
                Err(_) => self.stats.send_errors += 1,
            }
        }
    }

    /// Node and group addresses from what the GMS told this node. Groups only for the
    /// multicast transport (the service hands them out whatever a node's transport).
    fn gms_address_book(&self) -> AddressBook {
        let mut book = AddressBook::default();
        let Some(client) = self.member.client() else {
            return book;
        };
        self.fill_node_addresses(&mut book, client);
        if matches!(self.config.transport, Transport::Multicast(_)) {
            for v in client.region_views() {
                if let RegionAddress::Multicast { group, port } = v.address {
                    book.groups
                        .insert(v.view.region, SocketAddrV4::new(group.into(), port));
                }
            }
        }
        book
    }

    /// Puts the addresses of the nodes the service told of, and this node's own, in `book`.
    fn fill_node_addresses(&self, book: &mut AddressBook, client: &GmsClient) {
        book.nodes.clear();
        book.nodes.extend(client.node_addresses());
        book.nodes.insert(self.member.id(), self.local_addr);
    }

    /// [`Core::gms_address_book`] after a change of the `changed` regions, from the book in
    /// force: the nodes anew (a few hundred at most), the groups of the changed regions only.
    /// Built whole at every install, the groups of 100,000 regions were a quarter of the core
    /// thread's time while a node created 100,000 publishers (an install per batch of them).
    fn gms_address_book_after(&mut self, changed: &[RegionId]) -> AddressBook {
        let mut book = std::mem::take(&mut self.addresses);
        let Some(client) = self.member.client() else {
            return book;
        };
        self.fill_node_addresses(&mut book, client);
        if matches!(self.config.transport, Transport::Multicast(_)) {
            for &region in changed {
                match client.region_address(region) {
                    Some(RegionAddress::Multicast { group, port }) => {
                        book.groups
                            .insert(region, SocketAddrV4::new(group.into(), port));
                    }
                    _ => {
                        book.groups.remove(&region);
                    }
                }
            }
        }
        debug_assert_eq!(book, self.gms_address_book(), "address book after a change");
        book
    }

    /// Takes requests of the publisher in `slot` while the protocol admits them, at most a
    /// queue's worth. Returns what the taken requests counted against the node-wide bound
    /// (`request_cost`), and whether the queue was found empty.
    fn serve_publisher(&mut self, now: Time, slot: u32) -> (usize, bool) {
        let Some(Some(p)) = self.publishers.get_mut(slot as usize) else {
            return (0, false);
        };
        // At most a queue's worth per turn, so that a publisher that keeps its queue full
        // cannot hold the core thread; counted by pops rather than by the queue's length,
        // which would read every ring's indices (cache lines the publisher writes) once more.
        let budget = self.config.publish_queue_capacity + 1;
        // One run: the protocol refreshes the streams' gauges and timers once, at its end.
        let mut run = self.member.publish_run(now);
        let mut took = 0;
        let mut took_bytes = 0;
        let mut drained = false;
        for _ in 0..budget {
            let Some(request) = p.stalled.take().or_else(|| p.queue.pop()) else {
                drained = true;
                break;
            };
            // A publisher older than the last rejoin names its topic by an old id.
            let current = current_topic(&self.topic_moves, p.epoch, request.topic);
            let Some(topic) = current.filter(|_| p.retry_at.is_none_or(|t| now >= t)) else {
                // Not bound again yet: looked at again shortly.
                if current.is_none() {
                    p.retry_at = Some(now + TOPIC_MOVE_RETRY);
                }
                p.stalled = Some(request);
                self.stats.publish_stalls += 1;
                break;
            };
            p.retry_at = None;
            let cost = request_cost(request.payload.len());
            // No `can_publish` first: `publish_or_return` makes the same checks and hands a
            // refused payload back, and each look-up of the topic's regions is a cache miss per
            // message when thousands of topics take turns.
            match run.publish_or_return(now, topic, request.payload) {
                Ok(msg_id) => {
                    p.pending.push_back((msg_id, false));
                    // Message ids are consecutive, so the owner table is indexed by id.
                    debug_assert_eq!(msg_id.0, self.owners_base + self.owners.len() as u64);
                    self.owners.push_back(Some((slot, now)));
                    self.stats.publishes += 1;
                    took += 1;
                    took_bytes += cost;
                }
                Err((PublishError::RateLimited { retry_at }, payload)) => {
                    // Congestion control: the protocol's rate admits the next message at
                    // `retry_at` (and its alarm fires then).
                    p.retry_at = Some(retry_at);
                    p.stalled = Some(PublishRequest { topic, payload });
                    self.stats.publish_rate_limited += 1;
                    break;
                }
                Err((PublishError::WouldBlock { .. }, payload)) => {
                    p.stalled = Some(PublishRequest { topic, payload });
                    self.stats.publish_stalls += 1;
                    break;
                }
                Err(_) => {
                    // The size was checked by the publisher: a refusal here is a bug. Counted
                    // rather than trusted; the message is dropped.
                    self.stats.publish_refused += 1;
                    took += 1;
                    took_bytes += cost;
                }
            }
        }
        drop(run);
        if took > 0 {
            // Room in the queue: wake a publisher blocked on it.
            p.shared.wake();
        }
        (took_bytes, drained)
    }

    /// Gives a new publisher a slot and serves it in the next turn (its ready flag is set from
    /// birth, so whatever it queued before this is served then).
    fn add_publisher(&mut self, mut publisher: PublisherCore) {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                let Ok(slot) = u32::try_from(self.publishers.len()) else {
                    // Four billion live publishers: refuse rather than alias a slot.
                    self.stats.publish_refused += 1;
                    return;
                };
                self.publishers.push(None);
                slot
            }
        };
        self.shared.ready.adopt(&publisher.shared.ready, slot);
        publisher.listed = true;
        publisher.epoch = self.topic_moves.len();
        self.publishers[slot as usize] = Some(publisher);
        self.active.push(slot);
    }

    /// Moves the ready list's publishers (and, after an overflow, every publisher whose flag
    /// is set) to `active`, once each.
    fn take_ready(&mut self) {
        for _ in 0..self.shared.ready.len_hint() {
            let Some(slot) = self.shared.ready.pop() else {
                break;
            };
            // An entry can outlive its publisher (forgotten meanwhile, or served through an
            // overflow scan): serving again is harmless, a missing slot is skipped.
            if let Some(Some(p)) = self.publishers.get_mut(slot as usize) {
                if !std::mem::replace(&mut p.listed, true) {
                    self.active.push(slot);
                }
            }
        }
        if self.shared.ready.take_overflow() {
            self.stats.publisher_ready_overflows += 1;
            for (slot, p) in self.publishers.iter_mut().enumerate() {
                if let Some(p) = p {
                    if !p.listed && p.shared.ready.is_set() {
                        p.listed = true;
                        // Slots fit u32 (`add_publisher`).
                        self.active.push(slot as u32);
                    }
                }
            }
        }
    }

    /// After serving the publisher in `slot`: keeps it listed while it has messages left,
    /// forgets it if it was dropped and is done, else clears its ready flag (and lists it
    /// again if a message arrived meanwhile).
    fn after_serving(&mut self, slot: u32, drained: bool) {
        let Some(entry) = self.publishers.get_mut(slot as usize) else {
            return;
        };
        let Some(p) = entry.as_mut() else {
            return;
        };
        // A queue found empty at the end of the turn is looked at again by `finish` below.
        if p.stalled.is_some() || !drained {
            self.active.push(slot);
            return;
        }
        if p.is_finished() {
            *entry = None;
            self.free_slots.push(slot);
            return;
        }
        p.listed = false;
        let queue = &p.queue;
        if self
            .shared
            .ready
            .finish(&p.shared.ready, || queue.is_empty())
        {
            p.listed = true;
            self.active.push(slot);
        }
    }

    // ---- Events: deliveries and stability ----------------------------------------------

    /// Hands the protocol's events on, until a subscription's queue is full, then wakes the
    /// publishers whose messages became stable.
    fn drain_events(&mut self) {
        self.hand_events_on();
        for slot in self.advanced.drain(..) {
            if let Some(Some(p)) = self.publishers.get_mut(slot as usize) {
                p.wake_if_advanced();
            }
        }
    }

    /// Takes the member's events: its own first (installs, answers), then the protocol's; the
    /// last run of deliveries is handed on at the end.
    fn hand_events_on(&mut self) {
        self.drain_control_events();
        // The protocol's events up to the member's next own event are taken in bulk (a
        // datagram's deliveries at once), then that event; until neither is left.
        let mut events = std::mem::take(&mut self.protocol_events);
        loop {
            self.member.take_protocol_events(&mut events);
            while let Some(event) = events.pop_front() {
                self.on_protocol_event(event);
            }
            match self.member.poll_event() {
                Some(event) => self.on_member_event(event),
                None => break,
            }
        }
        self.protocol_events = events;
        self.flush_run();
    }

    fn on_protocol_event(&mut self, event: Event) {
        match event {
            Event::Deliver(d) => self.on_delivery(d),
            Event::Stable { first, last } => self.on_stable(first, last),
            // Suspicions are the member's to report to the service.
            Event::Suspect { region, node } => {
                self.view_log.suspected(region, node);
                self.stats.other_events += 1;
            }
            Event::TokenRound { .. } => self.stats.other_events += 1,
        }
    }

    /// Adds `d` to the current run of deliveries if it is of the run's topic (or of the run's
    /// group) and the run has room; otherwise hands the run on and starts a new one.
    fn on_delivery(&mut self, d: Delivery) {
        if d.origin != self.member.id() {
            // The wake of this cycle stands for now (no clock read per message).
            let sent = Time::ZERO + Duration::from_micros(d.timestamp_us);
            self.stats
                .delivery_latency
                .record(self.woke_at.saturating_duration_since(sent));
        }
        if let Some(run) = self.run.as_mut() {
            if !run.is_full()
                && (run.topic() == d.topic
                    || (self.run_group.is_some()
                        && group_task(&self.group_topics, &self.held, d.topic) == self.run_group))
            {
                run.push(d);
                return;
            }
        }
        self.flush_run();
        if !self.group_topics.is_empty() {
            self.run_group = group_task(&self.group_topics, &self.held, d.topic);
        }
        let mut run = self.batch_pool.batch(d.topic);
        run.push(d);
        self.run = Some(run);
    }

    /// Hands the current run of deliveries on, if there is one.
    fn flush_run(&mut self) {
        let group = self.run_group.take();
        if let Some(run) = self.run.take() {
            match group {
                Some(task) => self.on_group_batch(task, run),
                None => self.on_batch(run),
            }
        }
    }

    /// Hands a group's run to the group's shared task, or, if it has no room (or the group is
    /// held already), keeps it in the group's backlog.
    fn on_group_batch(&mut self, task: TaskId, batch: Deliveries) {
        if let Some(held) = self.held_groups.iter_mut().find(|h| h.task.id() == task) {
            // Delivered by the protocol before the hold took effect: waits behind the others.
            self.backlog_total += batch.len();
            held.append(batch);
            return;
        }
        let Some(group) = self.group_tasks.get(&task) else {
            // Not a group's any more (cannot be: runs end where subscriptions change).
            self.on_batch(batch);
            return;
        };
        let n = batch.len();
        match push_or_wake(&self.shared, &group.task, batch) {
            Ok(()) => self.stats.deliveries += n as u64,
            Err(TryPushError::Full(batch)) => self.hold_group(task, batch),
            // Removed meanwhile (the group's last subscription dropped).
            Err(TryPushError::Closed(_)) => {}
        }
    }

    /// Hands `batch` on to its topic's subscriptions, or, if one has no room, holds the topic.
    fn on_batch(&mut self, batch: Deliveries) {
        // No lookup while nothing is held (nearly always).
        let held = if self.held.is_empty() {
            None
        } else {
            self.held.get_mut(&batch.topic())
        };
        if let Some(held) = held {
            // Delivered by the protocol before the hold took effect: waits behind the others.
            self.backlog_total += batch.len();
            held.backlog.push_back((batch, Position::default()));
            return;
        }
        if let Err((batch, next)) = self.deliver(batch, Position::default()) {
            self.hold(batch, next);
        }
    }

    /// Records whether `topic` is delivered to a group's shared task alone, after its
    /// subscriptions changed. A held group keeps its hold right: a topic that joins it is held
    /// with it; one unsubscribed leaves it (its runs in the backlog are dropped by the group's
    /// routing, which no longer knows the topic); one that another subscription takes too ends
    /// the group's hold as one, its backlog held on by topic instead ([`Core::hold`]'s way).
    fn refresh_group(&mut self, topic: TopicId) {
        let new = match self.subscriptions.get(&topic).map(Vec::as_slice) {
            Some([task]) if task.is_group() && !self.bounds.contains_key(&task.id()) => Some(task),
            _ => None,
        };
        let new_id = new.map(|t| t.id());
        let old_id = match new {
            Some(task) => {
                let id = task.id();
                let old = self.group_topics.insert(topic, id);
                if old != Some(id) {
                    let group = self.group_tasks.entry(id).or_insert_with(|| GroupTask {
                        task: task.clone(),
                        topics: 0,
                        sorted: Vec::new(),
                        stale: true,
                    });
                    group.topics += 1;
                    group.stale = true;
                }
                old
            }
            None => self.group_topics.remove(topic),
        };
        if old_id == new_id {
            return;
        }
        if let Some(old) = old_id {
            if let Some(group) = self.group_tasks.get_mut(&old) {
                group.topics -= 1;
                group.stale = true;
                if group.topics == 0 {
                    self.group_tasks.remove(&old);
                }
            }
        }
        if self.held_groups.is_empty() {
            return;
        }
        let now = clock::now();
        if let Some(i) = old_id.and_then(|old| self.held_group_index(old)) {
            if let Some(held) = self.held_groups.get_mut(i) {
                if let Ok(at) = held.topics.binary_search(&topic) {
                    if self.subscriptions.get(&topic).is_none_or(Vec::is_empty) {
                        // Unsubscribed: the protocol lets it go (nothing of it is wanted).
                        held.topics.remove(at);
                        self.member.release_topic(now, topic);
                    } else {
                        self.dissolve_group_hold(i, false);
                    }
                }
            }
        }
        if let Some(i) = new_id.and_then(|new| self.held_group_index(new)) {
            if let Some(held) = self.held_groups.get_mut(i) {
                if let Err(at) = held.topics.binary_search(&topic) {
                    if !self.held.contains_key(&topic) {
                        held.topics.insert(at, topic);
                        self.member.hold_topic(topic);
                    }
                }
            }
        }
    }

    /// The index in `held_groups` of the hold of the group of `task`, if it is held.
    fn held_group_index(&self, task: TaskId) -> Option<usize> {
        self.held_groups.iter().position(|h| h.task.id() == task)
    }

    /// Holds the group of the shared task `task` as one, with `batch` (a run of the group that
    /// found the task full) as the first of its backlog: the protocol holds every topic of the
    /// group at once (but those held on their own already).
    fn hold_group(&mut self, task: TaskId, batch: Deliveries) {
        let Some(group) = self.group_tasks.get_mut(&task) else {
            return;
        };
        if group.stale {
            group.sorted.clear();
            group.sorted.extend(self.group_topics.topics_of(task));
            group.sorted.sort_unstable();
            group.stale = false;
        }
        let (mut topics, mut backlog) = self.spare_groups.pop().unwrap_or_default();
        topics.clear();
        let held = &self.held;
        topics.extend(
            group
                .sorted
                .iter()
                .filter(|t| held.is_empty() || !held.contains_key(t)),
        );
        self.member.hold_topics(&topics);
        self.stats.delivery_stalls += 1;
        self.stats.group_holds += 1;
        let msgs = batch.len();
        self.backlog_total += msgs;
        backlog.clear();
        backlog.push_back(batch);
        self.held_groups.push(HeldGroup {
            task: group.task.clone(),
            since: clock::now(),
            topics,
            backlog,
            msgs,
        });
    }

    /// Hands the held groups' backlogs on, in big runs, once their tasks' queues are down to
    /// half their capacity (the workers wake the core thread then), and releases a group whose
    /// backlog is all handed on: the protocol lets its topics go together, and what its
    /// streams held comes out as events.
    fn retry_groups(&mut self, now: Time) {
        let half = self.config.sched.task_queue_capacity / 2;
        let mut i = 0;
        while let Some(held) = self.held_groups.get_mut(i) {
            if held.task.queue_len() > half {
                i += 1;
                continue;
            }
            let mut closed = false;
            while let Some(batch) = held.backlog.pop_front() {
                let n = batch.len();
                match push_or_wake(&self.shared, &held.task, batch) {
                    Ok(()) => {
                        held.msgs -= n;
                        self.backlog_total -= n;
                        self.stats.deliveries += n as u64;
                    }
                    Err(TryPushError::Full(batch)) => {
                        held.backlog.push_front(batch);
                        break;
                    }
                    Err(TryPushError::Closed(_)) => {
                        closed = true;
                        break;
                    }
                }
            }
            if closed || held.backlog.is_empty() {
                self.release_group(now, i);
            } else {
                i += 1;
            }
        }
    }

    /// Ends the hold of the group at `i` of `held_groups` (its backlog dropped, if any is left:
    /// its task is gone): the protocol lets its topics go.
    fn release_group(&mut self, now: Time, i: usize) {
        let mut held = self.held_groups.swap_remove(i);
        self.backlog_total -= held.msgs;
        held.backlog.clear();
        self.member.release_topics(now, &held.topics);
        self.group_hold_ended(now, held);
    }

    /// Counts the end of a group's hold and keeps its (emptied) storage for the next.
    fn group_hold_ended(&mut self, now: Time, held: HeldGroup) {
        self.stats.topic_releases += 1;
        self.stats.topic_held_time += now.saturating_duration_since(held.since);
        if self.spare_groups.len() < SPARE_GROUP_HOLDS {
            self.spare_groups.push((held.topics, held.backlog));
        }
    }

    /// Ends the hold of the group at `i` of `held_groups` as one: each topic with runs in its
    /// backlog is held on its own with them, in order ([`Core::hold`]'s way), and the protocol
    /// lets the others go (unless the protocol node was replaced by a rejoin, which holds
    /// nothing). For a change no group hold can follow: a topic of the group taken by another
    /// subscription too, or a rejoin, whose topics move one by one.
    fn dissolve_group_hold(&mut self, i: usize, rejoined: bool) {
        let mut held = self.held_groups.swap_remove(i);
        self.backlog_total -= held.msgs;
        let mut runs = std::mem::take(&mut self.split_scratch);
        for batch in held.backlog.drain(..) {
            batch.split_by_topic(&self.batch_pool, &mut runs);
        }
        for run in runs.drain(..) {
            let topic = run.topic();
            self.backlog_total += run.len();
            match self.held.get_mut(&topic) {
                Some(h) => h.backlog.push_back((run, Position::default())),
                None => {
                    // The protocol holds it already, as one of the group's.
                    let mut backlog = self.spare_backlogs.pop().unwrap_or_default();
                    backlog.push_back((run, Position::default()));
                    self.held.insert(
                        topic,
                        HeldTopic {
                            since: held.since,
                            backlog,
                        },
                    );
                }
            }
        }
        self.split_scratch = runs;
        let now = clock::now();
        if !rejoined {
            let by_topic = &self.held;
            held.topics.retain(|t| !by_topic.contains_key(t));
            self.member.release_topics(now, &held.topics);
        }
        self.group_hold_ended(now, held);
    }

    /// Holds the topic of `batch` (a run of one topic that found no room from `next` on) with
    /// `batch` at the back of its backlog.
    fn hold(&mut self, batch: Deliveries, next: Position) {
        let topic = batch.topic();
        self.backlog_total += batch.len();
        if let Some(held) = self.held.get_mut(&topic) {
            held.backlog.push_back((batch, next));
            return;
        }
        let now = clock::now();
        self.member.hold_topic(topic);
        self.stats.delivery_stalls += 1;
        let mut backlog = self.spare_backlogs.pop().unwrap_or_default();
        backlog.push_back((batch, next));
        self.held.insert(
            topic,
            HeldTopic {
                since: now,
                backlog,
            },
        );
    }

    /// Pushes `batch` to the subscriptions of its topic from index `start` (whose first `skip`
    /// messages that subscription already has), as one event each. A bounded subscription
    /// with room for part of it gets that part. On a subscription without room for the rest,
    /// gives `batch` back with that subscription's index and the messages it has.
    fn deliver(
        &mut self,
        batch: Deliveries,
        start: Position,
    ) -> Result<(), (Deliveries, Position)> {
        let Some(tasks) = self.subscriptions.get(&batch.topic()) else {
            self.stats.deliveries_unsubscribed += batch.len() as u64;
            return Ok(());
        };
        let n = batch.len();
        let last = tasks.len().saturating_sub(1);
        let mut batch = Some(batch);
        for (i, task) in tasks.iter().enumerate().skip(start.task) {
            let from = if i == start.task { start.skip } else { 0 };
            let want = n.saturating_sub(from);
            // No lookup on a node without bounded subscriptions (callbacks alone).
            let bound = if self.bounds.is_empty() {
                None
            } else {
                self.bounds.get(&task.id())
            };
            let mut take = want;
            if let Some(b) = bound {
                take = match b.unread.admit(want) {
                    0 => b.unread.wake_when_low_then_admit(want),
                    k => k,
                };
                if take < want {
                    b.unread.became_bottleneck(clock::now());
                }
                if take == 0 {
                    return batch.map_or(Ok(()), |b| {
                        Err((
                            b,
                            Position {
                                task: i,
                                skip: from,
                            },
                        ))
                    });
                }
            }
            let whole = from == 0 && take == n;
            let event = match batch.as_ref() {
                None => break,
                Some(b) if !whole => b.copy_in(&self.batch_pool, from..from + take),
                Some(b) if i != last => b.copy_in(&self.batch_pool, 0..n),
                Some(_) => match batch.take() {
                    Some(b) => b,
                    None => break,
                },
            };
            let pushed = match push_or_wake(&self.shared, task, event) {
                Ok(()) => true,
                Err(TryPushError::Full(event)) => {
                    if let Some(b) = bound {
                        b.unread.unadmit(take);
                    }
                    // The batch itself if it was the event, else the one kept.
                    let batch = match batch.take() {
                        Some(b) => {
                            drop(event);
                            b
                        }
                        None => event,
                    };
                    return Err((
                        batch,
                        Position {
                            task: i,
                            skip: from,
                        },
                    ));
                }
                // Unsubscribed meanwhile.
                Err(TryPushError::Closed(_)) => false,
            };
            if !pushed {
                if let Some(b) = bound {
                    b.unread.unadmit(take);
                }
                continue;
            }
            self.stats.deliveries += take as u64;
            if take < want {
                // The bounded subscription took part of the batch: the rest waits for room.
                if let Some(batch) = batch.take() {
                    return Err((
                        batch,
                        Position {
                            task: i,
                            skip: from + take,
                        },
                    ));
                }
            }
        }
        Ok(())
    }

    /// Hands the held topics' backlogs on as far as their subscriptions have room, drops the
    /// subscriptions that waited longer than their policy allows, and releases the topics
    /// whose subscriptions have room again (their streams go on, and the events that brings
    /// are handed on).
    fn retry_held(&mut self, now: Time) {
        self.disconnect_slow(now);
        let mut topics = std::mem::take(&mut self.held_scratch);
        topics.clear();
        topics.extend(self.held.keys().copied());
        topics.sort_unstable();
        for &topic in &topics {
            if self.subscriptions_moving.contains_key(&topic) {
                // Its name is not bound again after a rejoin yet: its subscriptions wait
                // apart, and so does its backlog.
                continue;
            }
            let Some(mut held) = self.held.remove(&topic) else {
                continue;
            };
            while let Some((batch, next)) = held.backlog.pop_front() {
                let n = batch.len();
                match self.deliver(batch, next) {
                    Ok(()) => self.backlog_total -= n,
                    Err((batch, next)) => {
                        held.backlog.push_front((batch, next));
                        break;
                    }
                }
            }
            if held.backlog.is_empty() && self.topic_has_room(topic) {
                self.release(now, topic, held);
            } else {
                self.held.insert(topic, held);
            }
        }
        self.held_scratch = topics;
        if !self.held_groups.is_empty() {
            self.retry_groups(now);
        }
        // What the released streams held comes out as events.
        self.drain_events();
    }

    /// Whether every bounded subscription of `topic` is down to its low watermark (if one is
    /// not, its reader wakes the core thread when it is).
    fn topic_has_room(&self, topic: TopicId) -> bool {
        let Some(tasks) = self.subscriptions.get(&topic) else {
            return true;
        };
        tasks.iter().all(|t| {
            self.bounds
                .get(&t.id())
                .is_none_or(|b| b.unread.has_room_or_wake_later())
        })
    }

    /// Ends the hold of `topic`: its streams go on at this node.
    fn release(&mut self, now: Time, topic: TopicId, mut held: HeldTopic) {
        self.backlog_total -= held.backlog.iter().map(|(b, _)| b.len()).sum::<usize>();
        held.backlog.clear();
        if self.spare_backlogs.len() < SPARE_BACKLOGS {
            self.spare_backlogs.push(held.backlog);
        }
        self.member.release_topic(now, topic);
        self.stats.topic_releases += 1;
        self.stats.topic_held_time += now.saturating_duration_since(held.since);
        for task in self.subscriptions.get(&topic).into_iter().flatten() {
            if let Some(b) = self.bounds.get(&task.id()) {
                b.unread.recovered(now);
            }
        }
    }

    /// The bounded subscriptions of the held topics (a full one is always of a held topic).
    fn held_bounds(&self) -> impl Iterator<Item = (TopicId, TaskId, &BoundSub)> + '_ {
        self.held.keys().flat_map(move |&topic| {
            self.subscriptions
                .get(&topic)
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((topic, t.id(), self.bounds.get(&t.id())?)))
        })
    }

    /// When the held topics' bounded subscriptions with a `max_wait` are due to be dropped.
    fn disconnect_deadlines(&self) -> impl Iterator<Item = Time> + '_ {
        self.held_bounds().filter_map(|(_, _, b)| {
            let since = b.unread.bottleneck_since()?;
            Some(since + b.max_wait?)
        })
    }

    /// Drops the subscriptions that stayed without room for longer than their `max_wait`
    /// (`SlowConsumerPolicy::Disconnect`): they are told, and their topics go on without them.
    fn disconnect_slow(&mut self, now: Time) {
        let due: Vec<(TopicId, TaskId)> = self
            .held_bounds()
            .filter(|(_, _, b)| {
                b.unread
                    .bottleneck_since()
                    .zip(b.max_wait)
                    .is_some_and(|(since, wait)| now >= since + wait)
            })
            .map(|(topic, task, _)| (topic, task))
            .collect();
        for (topic, task) in due {
            if let Some(mut b) = self.bounds.remove(&task) {
                let waited = b.unread.recovered(now).unwrap_or_default();
                if let Some(tell) = b.on_disconnect.take() {
                    tell(waited);
                }
                self.stats.slow_consumer_disconnects += 1;
            }
            if let Some(t) = self
                .subscriptions
                .get(&topic)
                .and_then(|tasks| tasks.iter().find(|t| t.id() == task))
            {
                t.remove();
            }
            self.remove_subscription(now, topic, task);
        }
    }

    /// Stops delivering `topic` to `task`: the topic's backlog goes on to the others (or is
    /// dropped with the last subscription, and the hold with it).
    fn remove_subscription(&mut self, now: Time, topic: TopicId, task: TaskId) {
        self.bounds.remove(&task);
        let Some(topic) = self.subscribed_topic(topic, task) else {
            return;
        };
        let Some(tasks) = self.subscriptions.get_mut(&topic) else {
            return;
        };
        let Some(index) = tasks.iter().position(|t| t.id() == task) else {
            return;
        };
        if let Some(g) = &tasks.remove(index).group {
            g.group.unbind(topic);
        }
        if let Some(held) = self.held.get_mut(&topic) {
            for (_, at) in &mut held.backlog {
                if index < at.task {
                    at.task -= 1;
                } else if index == at.task {
                    // The subscription now at this index has none of the batch.
                    at.skip = 0;
                }
            }
        }
        let none_left = tasks.is_empty();
        self.refresh_group(topic);
        if none_left {
            self.subscriptions.remove(&topic);
            self.member.unsubscribe(topic);
            if let Some(held) = self.held.remove(&topic) {
                self.release(now, topic, held);
            }
        }
    }

    /// The topic id under which `task` is subscribed now: `topic`, the id it was subscribed
    /// with, unless a rejoin since bound the topic to a new id (the application's handle keeps
    /// the old one). Follows the rejoins' moves, then looks through every topic.
    fn subscribed_topic(&self, topic: TopicId, task: TaskId) -> Option<TopicId> {
        let holds = |t: &TopicId| {
            self.subscriptions
                .get(t)
                .is_some_and(|tasks| tasks.iter().any(|s| s.id() == task))
        };
        if holds(&topic) {
            return Some(topic);
        }
        let mut moved = topic;
        for moves in &self.topic_moves {
            if let Some(&new) = moves.get(&moved) {
                moved = new;
            }
        }
        if holds(&moved) {
            return Some(moved);
        }
        // An id of an older incarnation may name another topic in a later one: only after
        // rejoins, and only for an unsubscribe.
        self.subscriptions
            .iter()
            .find(|(_, tasks)| tasks.iter().any(|s| s.id() == task))
            .map(|(&t, _)| t)
    }

    /// The messages of ids `first..=last` are stable: their publishers learn it, each run of
    /// one publisher's messages taken in the same turn at once.
    fn on_stable(&mut self, first: MsgId, last: MsgId) {
        self.stats.stable += (last.0 + 1).saturating_sub(first.0);
        let mut id = first.0.max(self.owners_base);
        while id <= last.0 {
            let Ok(index) = usize::try_from(id - self.owners_base) else {
                break;
            };
            let Some(&owner) = self.owners.get(index) else {
                // Beyond the ids this core gave publishers.
                break;
            };
            let Some((slot, taken)) = owner else {
                id += 1;
                continue;
            };
            // The run of the same publisher's messages taken in the same turn.
            let run_max = usize::try_from(last.0 - id + 1).unwrap_or(usize::MAX);
            let run = self
                .owners
                .range_mut(index..)
                .take(run_max)
                .take_while(|o| **o == owner)
                .map(|o| *o = None)
                .count();
            // The acknowledgement that made them stable arrived in this cycle: its start stands
            // for now (no clock read per message).
            self.stats
                .time_to_stable
                .record_n(self.woke_at.saturating_duration_since(taken), run as u64);
            let entry = self.publishers.get_mut(slot as usize);
            if let Some(Some(p)) = entry {
                if p.on_stable(MsgId(id), run as u64) {
                    self.advanced.push(slot);
                }
                // A dropped publisher is forgotten with its last stable message, unless the
                // core has it listed (`after_serving` forgets it then).
                if !p.listed && p.is_finished() {
                    p.wake_if_advanced();
                    self.publishers[slot as usize] = None;
                    self.free_slots.push(slot);
                }
            }
            id += run as u64;
        }
        while self.owners.front().is_some_and(Option::is_none) {
            self.owners.pop_front();
            self.owners_base += 1;
        }
    }

    // ---- The I/O queue -----------------------------------------------------------------

    fn serve_io(&mut self, start: Time) {
        let deadline = start + self.config.io_quantum;
        loop {
            let received = if self.reading() {
                self.receive_batch()
            } else {
                0
            };
            if received > 0 {
                self.process_batch();
            }
            let sent = self.transmit(deadline);
            if clock::now() >= deadline {
                if received > 0 || sent == TxOutcome::Expired {
                    self.stats.io_quantum_expired += 1;
                }
                break;
            }
            if received == 0 {
                break;
            }
        }
    }

    /// Drains readable sockets into the priority classes, up to about a batch; returns the
    /// number of datagrams kept.
    fn receive_batch(&mut self) -> usize {
        let max = self.config.recv_batch_datagrams_max;
        let mut kept = 0;
        let mut slot: Option<usize> = None;
        loop {
            if kept >= max {
                break;
            }
            // The unicast socket first, then the groups.
            let socket = match slot {
                None => &mut self.unicast,
                Some(i) => match self.groups.get_mut(i) {
                    Some(Some(g)) => &mut g.net,
                    Some(None) => {
                        slot = Some(i + 1);
                        continue;
                    }
                    None => break,
                },
            };
            if !socket.readable {
                slot = Some(slot.map_or(0, |i| i + 1));
                continue;
            }
            match self.rx.recv(socket) {
                Ok(filled) => {
                    self.stats.recv_calls += 1;
                    let (stats, arena, classes, rng, member) = (
                        &mut self.stats,
                        &mut self.arena,
                        &mut self.classes,
                        &mut self.loss_rng,
                        &mut self.member,
                    );
                    let loss = self.config.receive_loss;
                    let gms = &mut self.gms;
                    let via_group = slot.is_some();
                    let mut gms_kept = 0;
                    let inspect = |from, datagram: &mut [u8]| {
                        stats.datagrams_received += 1;
                        stats.bytes_received += datagram.len() as u64;
                        if unframe(datagram).is_some()
                            || tidings_seal::link::is_link_datagram(datagram)
                        {
                            // Membership traffic: only from the service this node joined, and
                            // never dropped on purpose (injected loss is for the protocol).
                            let link = gms.as_mut();
                            match link.and_then(|l| Some((l.replica_of(from)?, l))) {
                                Some((replica, link)) => {
                                    stats.gms_datagrams_received += 1;
                                    link.inbox.push((replica, Bytes::copy_from_slice(datagram)));
                                    // Counted, so that the batch is processed (and the
                                    // client fed) at once.
                                    gms_kept += 1;
                                }
                                _ => stats.gms_foreign += 1,
                            }
                            return None;
                        }
                        if loss > 0.0 && rng.f64() < loss {
                            stats.injected_drops += 1;
                            return None;
                        }
                        let Some(kind) = tidings_wire::peek_kind(datagram) else {
                            stats.invalid_packets += 1;
                            return None;
                        };
                        let class = priority_class(kind.priority());
                        // Opened here, in the receive buffer, before the buffer is shared: no
                        // copy (refusals are counted by the member).
                        let len = member.open_received(datagram)?;
                        Some((len, class as u8))
                    };
                    let protocol_kept =
                        self.rx
                            .datagrams(filled, arena, inspect, |datagram, class| {
                                classes[usize::from(class)].push((datagram, via_group));
                            });
                    kept += protocol_kept + gms_kept;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // E.g. an ICMP error queued on the socket; the next read continues.
                    self.stats.recv_errors += 1;
                }
            }
        }
        kept
    }

    /// Processes the received batch: control, then recovery, then data.
    fn process_batch(&mut self) {
        let now = clock::now();
        for class in 0..self.classes.len() {
            let mut batch = std::mem::take(&mut self.classes[class]);
            self.stats.received_by_priority[class] += batch.len() as u64;
            for (datagram, via_group) in batch.drain(..) {
                let datagram = ReceivedDatagram::Opened(datagram);
                if via_group {
                    self.member.handle_group_datagram(now, datagram);
                } else {
                    self.member.handle_datagram(now, datagram);
                }
                // The class's datagrams are handed on together: a topic's deliveries from
                // several datagrams make one run for its subscriptions, up to a batch's worth.
                if self.member.node().events_pending() >= BATCH_MSGS_MAX {
                    self.drain_events();
                }
            }
            self.drain_events();
            // Keep the capacity.
            self.classes[class] = batch;
        }
        if self.gms.as_ref().is_some_and(|l| !l.inbox.is_empty()) {
            self.gms_input(now);
            self.drain_events();
            self.send_gms();
        }
        self.tx_more = true;
        self.look_at_deadline(now);
    }

    /// Pulls datagrams from the protocol and sends them while the socket accepts them.
    fn transmit(&mut self, deadline: Time) -> TxOutcome {
        loop {
            if !self.writable {
                return TxOutcome::Blocked;
            }
            if self.tx.has_pending() {
                let mut counts = TxCounts::default();
                let control_tos = self.config.control_dscp.map_or(0, |dscp| dscp << 2);
                let flush = self.tx.flush(
                    &mut self.unicast,
                    &self.routes,
                    (self.config.gso, control_tos),
                    &mut counts,
                );
                self.add_tx_counts(counts);
                if flush == Flush::Blocked {
                    self.writable = false;
                    return TxOutcome::Blocked;
                }
            }
            if !self.tx_more {
                return TxOutcome::Idle;
            }
            let now = clock::now();
            if now >= deadline {
                return TxOutcome::Expired;
            }
            let member = &mut self.member;
            // The batch's slots are `max_datagram_bytes` long with room for the sealing
            // trailer (`TxBatch::new`): never refused.
            let pull = |buf: &mut [u8]| {
                member
                    .poll_transmit(now, buf)
                    .expect("transmit slots hold max_datagram_bytes")
            };
            if self.tx.fill(pull) == 0 {
                self.tx_more = false;
                return TxOutcome::Idle;
            }
        }
    }

    fn add_tx_counts(&mut self, c: TxCounts) {
        let s = &mut self.stats;
        s.send_calls += c.send_calls;
        s.datagrams_sent += c.datagrams;
        s.bytes_sent += c.bytes;
        s.short_sends += c.short_sends;
        s.send_errors += c.errors;
        s.unroutable += c.unroutable;
        s.tos_errors += c.tos_errors;
        s.control_datagrams_sent += c.control_datagrams;
    }

    /// Joins the groups of the regions this node is in (a group that regions share, once) and
    /// leaves the others, several groups of a port to a socket (`groups_per_socket`). A group that cannot be joined (most often:
    /// no file descriptor left for a new socket) is recorded in `unjoined` with the reason, the
    /// others are still joined, and subscriptions whose topic it carries are refused with that
    /// reason (`answer_waiting`) rather than left to wait for messages that cannot arrive. Err
    /// (the first reason) if some group is not joined.
    fn sync_groups(&mut self) -> io::Result<()> {
        let Transport::Multicast(multicast) = &self.config.transport else {
            return Ok(());
        };
        let interface = multicast.interface;
        // Each group once, with the regions that share it (in region order: `joined` is).
        let mut wanted: HashMap<SocketAddrV4, Vec<RegionId>> = HashMap::new();
        for &(region, group) in self.routes.joined() {
            wanted.entry(group).or_default().push(region);
        }
        let mut present: HashSet<SocketAddrV4> = HashSet::with_capacity(wanted.len());
        for slot in &mut self.groups {
            let Some(g) = slot.as_mut() else {
                continue;
            };
            let port = g.port;
            g.joined.retain(|&ip| {
                let group = SocketAddrV4::new(ip, port);
                if wanted.contains_key(&group) {
                    present.insert(group);
                    true
                } else {
                    net::leave_group(&g.net, ip, interface);
                    false
                }
            });
            if g.joined.is_empty() {
                if let Some(mut g) = slot.take() {
                    let _ = self.poll.registry().deregister(&mut g.net.socket);
                }
            }
        }
        // Every group not joined is tried again below; what fails now is what stays unjoined.
        self.unjoined.clear();
        // In the order of their first regions, so that which groups fail (if some do) does not
        // depend on hashing.
        let mut missing: Vec<(&SocketAddrV4, &Vec<RegionId>)> = wanted
            .iter()
            .filter(|(g, _)| !present.contains(g))
            .collect();
        missing.sort_unstable_by_key(|(_, regions)| regions.first().copied());
        let mut room = GroupRoom::of(&self.groups, self.groups_per_socket);
        for (&group, regions) in missing {
            if let Err(e) = self.join_group(&mut room, group, interface) {
                self.stats.groups_join_failed += 1;
                for region in regions {
                    self.unjoined.insert(
                        *region,
                        format!(
                            "cannot join multicast group {group} of region {}: {e} (raise the \
                             open-file limit, `ulimit -n`, or use the unicast transport)",
                            region.0
                        ),
                    );
                }
            }
        }
        self.stats.groups_joined = self.groups.iter().flatten().map(|g| g.joined.len()).sum();
        self.stats.group_sockets_current = self.groups.iter().flatten().count();
        self.stats.groups_unjoined_current = self.unjoined.len();
        match self.unjoined.values().next() {
            Some(why) => Err(io::Error::other(why.clone())),
            None => Ok(()),
        }
    }

    /// Joins `group` on a socket of its port with room (found through `room`), or on a new one.
    fn join_group(
        &mut self,
        room: &mut GroupRoom,
        group: SocketAddrV4,
        interface: Ipv4Addr,
    ) -> io::Result<()> {
        let per_socket = self.groups_per_socket;
        if let Some(slots) = room.by_port.get_mut(&group.port()) {
            while let Some(&slot) = slots.last() {
                let Some(Some(g)) = self.groups.get_mut(slot) else {
                    slots.pop();
                    continue;
                };
                match net::join_group(&g.net, *group.ip(), interface) {
                    Ok(()) => {
                        g.joined.push(*group.ip());
                        if g.joined.len() >= per_socket {
                            slots.pop();
                        }
                        return Ok(());
                    }
                    // The kernel's per-socket limit is lower than assumed: this socket is full.
                    Err(e) if e.raw_os_error() == Some(ENOBUFS) => {
                        g.full = true;
                        slots.pop();
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let slot = room.free_slots.pop().unwrap_or_else(|| {
            self.groups.push(None);
            self.groups.len() - 1
        });
        let joined = (|| {
            let (mut net, shared) = net::group_socket(group, &self.config)?;
            net::join_group(&net, *group.ip(), interface)?;
            self.poll.registry().register(
                &mut net.socket,
                Token(GROUP_BASE + slot),
                Interest::READABLE,
            )?;
            Ok::<_, io::Error>((net, shared))
        })();
        let (net, shared) = match joined {
            Ok(j) => j,
            Err(e) => {
                room.free_slots.push(slot);
                return Err(e);
            }
        };
        self.groups[slot] = Some(GroupSocket {
            net,
            port: group.port(),
            joined: vec![*group.ip()],
            full: !shared,
        });
        if shared && per_socket > 1 {
            room.by_port.entry(group.port()).or_default().push(slot);
        }
        Ok(())
    }

    // ---- The alarm queue ---------------------------------------------------------------

    /// Reads the protocol's next deadline after inputs.
    fn look_at_deadline(&mut self, now: Time) {
        let known_since = self.last_look.max(self.woke_at);
        let before = self.alarm;
        self.alarm = self
            .member
            .poll_timeout()
            .map(|deadline| ProtocolAlarm::at(deadline, before, known_since));
        self.last_look = now;
    }

    fn serve_alarms(&mut self) {
        let start = clock::now();
        let deadline = start + self.config.alarm_quantum;
        let mut now = start;
        loop {
            if now >= self.next_tick {
                self.tick(now);
            }
            let Some(alarm) = self.alarm.filter(|a| a.due <= now) else {
                break;
            };
            self.stats
                .alarm_lateness
                .record(now.saturating_duration_since(alarm.due));
            self.stats.alarms_fired += 1;
            self.member.handle_timeout(now);
            self.tx_more = true;
            self.drain_events();
            self.send_gms();
            self.look_at_deadline(now);
            if self.alarm.is_some_and(|a| a.deadline <= alarm.deadline) {
                // The protocol did not move its deadline; fire it again next round rather than
                // spin here.
                break;
            }
            now = clock::now();
            if now >= deadline {
                self.stats.alarm_quantum_expired += 1;
                break;
            }
        }
    }

    /// The one-second statistics alarm.
    fn tick(&mut self, now: Time) {
        self.stats.cycle_time.roll();
        self.stats.alarm_lateness.roll();
        self.next_tick += TICK;
        if self.next_tick <= now {
            // Stalled for more than a second (suspended process): do not replay the ticks.
            self.next_tick = now + TICK;
        }
    }

    fn snapshot(&self) -> RuntimeStats {
        let mut s = self.stats.clone();
        let publishers = || self.publishers.iter().flatten();
        s.publish_queued_current = publishers()
            .map(|p| p.queue.len() as u64 + u64::from(p.stalled.is_some()))
            .sum();
        s.publish_queued_node_bytes_current = self.shared.publish_room.queued() as u64;
        s.publish_node_bound_waits = self.shared.publish_room.waits.load(Ordering::Relaxed);
        s.publishers_stalled_current = publishers().filter(|p| p.stalled.is_some()).count() as u64;
        s.publishers_current = publishers().count() as u64;
        s.publish_queue_slots_current = publishers().map(|p| p.queue.slots() as u64).sum();
        s.proto = self.member.node().stats().clone();
        let sockets = std::iter::once(&self.unicast.socket)
            .chain(self.groups.iter().flatten().map(|g| &g.net.socket));
        s.kernel_drops = net::kernel_drops(sockets);
        s.suspicions_reported = self.member.stats().suspicions_reported;
        let m = self.member.stats();
        s.sealing = crate::stats::SealingStats {
            sealed: m.datagrams_sealed,
            unsealed_dropped: m.datagrams_unsealed_dropped,
            open: m.open.clone(),
            open_copies: m.open_copies,
            open_blocks_allocated: m.open_blocks_allocated,
            keys_installed: m.keys_installed,
            keys_retired: m.keys_retired,
            key_renewals_asked: m.key_renewals_asked,
            key_id: self.member.datagram_key_id(),
        };
        s.stalls_reported = self.member.stats().stalls_reported;
        s.stalls = self.stalls.values().cloned().collect();
        let now = clock::now();
        oplog::stalls_now(
            &mut s.stalls,
            self.member.node().oldest_unstable(),
            now.as_micros(),
        );
        let mut held: Vec<(&TopicId, &HeldTopic)> = self.held.iter().collect();
        held.sort_unstable_by_key(|(t, _)| **t);
        s.held_topics = held
            .into_iter()
            .map(|(&topic, held)| HeldTopicState {
                topic,
                held_for: now.saturating_duration_since(held.since),
                backlog: held.backlog.iter().map(|(b, _)| b.len()).sum(),
                full_subscriptions: self.subscriptions.get(&topic).map_or(0, |tasks| {
                    tasks
                        .iter()
                        .filter(|t| {
                            self.bounds
                                .get(&t.id())
                                .is_some_and(|b| b.unread.bottleneck_since().is_some())
                        })
                        .count()
                }),
            })
            .collect();
        s.held_groups = self
            .held_groups
            .iter()
            .map(|held| HeldGroupState {
                task: held.task.id().0,
                topics: held.topics.len(),
                held_for: now.saturating_duration_since(held.since),
                backlog: held.msgs,
            })
            .collect();
        s.subscriptions = self
            .subscriptions
            .iter()
            .flat_map(|(&topic, tasks)| {
                tasks.iter().map(move |task| {
                    let t = task.stats();
                    let bound = self.bounds.get(&task.id());
                    SubscriptionState {
                        topic,
                        id: task.id().0,
                        delivered: task.delivered(),
                        queued: t.queue_len,
                        unread: bound.map_or(0, |b| b.unread.count() as u64),
                        capacity: bound.map_or(0, |b| b.unread.capacity() as u64),
                        bottleneck: bound.map(|b| b.unread.bottleneck()).unwrap_or_default(),
                    }
                })
            })
            .collect();
        s.subscriptions
            .sort_unstable_by_key(|sub| (sub.topic, sub.id));
        s.topic_names = self
            .topic_names
            .iter()
            .map(|(&t, name)| (t, name.clone()))
            .collect();
        s.streams = self.member.node().stream_reports();
        s.unstable_by_region = self.member.node().unstable_by_region();
        if let Some(client) = self.member.client() {
            s.gms_requests_unacknowledged = client.requests_unacknowledged();
            s.gms_requests_retransmitted = client.stats().requests_retransmitted;
            s.gms_nonces_taken = client.stats().nonces_taken;
            s.gms_updates_applied = client.stats().updates_applied;
            s.gms_commits = client.commits();
            s.gms_named_waiting = self.member.requests_waiting();
        }
        s
    }

    /// Leaves the loop: refuses further requests and wakes every waiting publisher.
    fn stop(mut self) -> RuntimeStats {
        self.shared.running.store(false, Ordering::Release);
        fence(Ordering::SeqCst);
        // Answer requests that raced with the shutdown so no caller waits for its timeout.
        while let Some(control) = self.shared.controls.pop() {
            match control {
                Control::AddPublisher(p) => p.shared.wake(),
                Control::Stats { reply } => {
                    let _ = reply.send(self.snapshot());
                }
                Control::Subscribe { reply, .. } => drop(reply),
                Control::SubscribeNamed { reply, .. } | Control::Advertise { reply, .. } => {
                    refuse(reply, SHUTTING_DOWN);
                }
                Control::SubscribeNamedMany { entries } => {
                    entries
                        .into_iter()
                        .for_each(|(_, _, r)| refuse(r, SHUTTING_DOWN));
                }
                Control::AdvertiseMany { entries } => {
                    entries
                        .into_iter()
                        .for_each(|(_, r)| refuse(r, SHUTTING_DOWN));
                }
                Control::SetMembership { reply, .. } => {
                    let _ = reply.send(Err(SHUTTING_DOWN.to_owned()));
                }
                Control::Unsubscribe { .. }
                | Control::Bound { .. }
                | Control::AnnounceMetrics(_)
                | Control::Shutdown => {}
            }
        }
        for (_, pending) in self.pending.drain() {
            refuse(pending.reply(), SHUTTING_DOWN);
        }
        for p in self.publishers.iter().flatten() {
            p.shared.waiting.store(true, Ordering::SeqCst);
            p.shared.wake();
        }
        self.shared.publish_room.wake_all();
        self.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readiness events on `poll` within a short wait (the waker's).
    fn woken(poll: &mut Poll) -> usize {
        let mut events = Events::with_capacity(4);
        poll.poll(&mut events, Some(Duration::from_millis(20)))
            .expect("epoll_wait");
        events.iter().count()
    }

    #[test]
    fn group_topics_are_found_by_small_and_large_ids_alike() {
        let mut g = GroupTopics::default();
        assert!(g.is_empty());
        let (a, b) = (TaskId(3), TaskId(7));
        let large = TopicId(DENSE_TOPIC_IDS + 5);
        assert_eq!(g.insert(TopicId(10), a), None);
        assert_eq!(g.insert(TopicId(2), b), None);
        assert_eq!(g.insert(large, a), None);
        assert_eq!(g.insert(TopicId(10), b), Some(a));
        assert_eq!(g.insert(TopicId(1), a), None);
        assert_eq!(g.get(TopicId(10)), Some(b));
        assert_eq!(g.get(TopicId(1)), Some(a));
        assert_eq!(g.get(large), Some(a));
        assert_eq!(g.get(TopicId(3)), None);
        assert_eq!(g.get(TopicId(DENSE_TOPIC_IDS + 6)), None);
        let mut of_a: Vec<TopicId> = g.topics_of(a).collect();
        of_a.sort_unstable();
        assert_eq!(of_a, vec![TopicId(1), large]);
        assert_eq!(g.remove(TopicId(10)), Some(b));
        assert_eq!(g.remove(TopicId(10)), None);
        assert_eq!(g.remove(large), Some(a));
        assert_eq!(g.get(large), None);
        assert!(!g.is_empty());
        g.clear();
        assert!(g.is_empty());
        assert_eq!(g.get(TopicId(1)), None);
    }

    #[test]
    fn an_alarm_is_late_from_when_the_core_could_have_known_it() {
        let t = |ms: u64| Time::ZERO + Duration::from_millis(ms);
        // A future deadline is due at itself.
        assert_eq!(ProtocolAlarm::at(t(50), None, t(10)).due, t(50));
        // A deadline long past that shows only now (the thread slept until 4,000 ms with no
        // alarm): due from the waking, not 4 s late.
        assert_eq!(ProtocolAlarm::at(t(5), None, t(4_000)).due, t(4_000));
        // A new deadline replacing another: the same.
        let before = ProtocolAlarm::at(t(90), None, t(0));
        assert_eq!(ProtocolAlarm::at(t(5), Some(before), t(70)).due, t(70));
        // The same deadline as before keeps its due: a thread that overslept it is late.
        let before = ProtocolAlarm::at(t(20), None, t(10));
        assert_eq!(ProtocolAlarm::at(t(20), Some(before), t(300)).due, t(20));
    }

    /// A bounded subscription admits up to its capacity; its reader wakes the core thread once,
    /// when it takes the count down to half the capacity, and only if the core waits for it.
    #[test]
    fn a_full_subscription_wakes_the_core_when_its_reader_is_down_to_half() {
        let mut poll = Poll::new().expect("epoll");
        let shared = Arc::new(CoreShared::new(
            Waker::new(poll.registry(), WAKER).expect("eventfd"),
            RuntimeConfig::default().publish_queued_node_bytes_max,
        ));
        let unread = Unread::new(4, Arc::clone(&shared));
        assert!((0..4).all(|_| unread.admit(1) == 1));
        assert_eq!(unread.admit(1), 0);
        // Nobody waits: reads wake no one.
        unread.taken(3);
        assert_eq!(woken(&mut poll), 0);
        assert!((0..3).all(|_| unread.admit(1) == 1));
        // The core waits: no room, and none until the reader is down to 2.
        assert_eq!(unread.wake_when_low_then_admit(1), 0);
        unread.became_bottleneck(Time::ZERO);
        assert!(unread.bottleneck().since.is_some());
        unread.taken(1);
        assert_eq!(woken(&mut poll), 0);
        assert!(!unread.has_room_or_wake_later());
        unread.taken(1);
        assert_eq!(woken(&mut poll), 1);
        assert!(unread.has_room_or_wake_later());
        // Once: the next reads wake no one.
        unread.taken(2);
        assert_eq!(woken(&mut poll), 0);
        assert_eq!(unread.count(), 0);
        assert!(unread.recovered(Time::ZERO).is_some());
        assert_eq!(unread.bottleneck().since, None);
        assert_eq!(unread.bottleneck().times, 1);
        // More taken than counted (the error after a disconnection) stays at zero.
        unread.taken(1);
        assert_eq!(unread.count(), 0);
        // A batch is admitted as far as the capacity; what is not handed on is counted back.
        assert_eq!(unread.admit(3), 3);
        assert_eq!(unread.admit(3), 1);
        assert_eq!(unread.count(), 4);
        assert_eq!(unread.admit(1), 0);
        unread.unadmit(3);
        assert_eq!(unread.count(), 1);
    }

    #[test]
    fn a_waiting_core_is_woken_once_by_the_delivery_that_ends_the_count() {
        let mut poll = Poll::new().expect("epoll");
        let shared = CoreShared::new(
            Waker::new(poll.registry(), WAKER).expect("eventfd"),
            RuntimeConfig::default().publish_queued_node_bytes_max,
        );
        // No one waits: deliveries wake no one.
        shared.delivered();
        assert_eq!(woken(&mut poll), 0);
        shared.deliveries_until_wake.store(3, Ordering::SeqCst);
        shared.delivered();
        shared.delivered();
        assert_eq!(woken(&mut poll), 0, "woken before the count ran out");
        shared.delivered();
        assert_eq!(woken(&mut poll), 1, "not woken when the count ran out");
        // The count stays at zero: later deliveries do not wake again.
        shared.delivered();
        assert_eq!(woken(&mut poll), 0);
        assert_eq!(shared.deliveries_until_wake.load(Ordering::SeqCst), 0);
    }
}
