//! Batch delivery: the core thread hands a subscription the in-order run of one topic's messages
//! that one input (a datagram, a repair, a release) brought, as one scheduler event. A run of one
//! message is kept in the batch itself; longer runs are stored on storage recycled through a
//! lock-free pool, so steady delivery allocates nothing.
//!
//! The topics of a group subscription ([`NodeRuntime::subscribe_named_group`]) share one task:
//! the core thread hands it the in-order run of all their messages as one batch, whatever the
//! topic of each, and the task routes each message to its topic's callback ([`TaskGroup`]).
//!
//! [`NodeRuntime::subscribe_named_group`]: crate::NodeRuntime::subscribe_named_group

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_queue::ArrayQueue;
use rustc_hash::FxHashMap;
use tidings_proto::{Delivery, TopicId};
use tidings_sched::TaskHandle;

/// Most messages in one batch: a run longer than this (a repair that releases a long gap) is cut,
/// so that one event stays a bounded piece of the scheduler's time.
pub(crate) const BATCH_MSGS_MAX: usize = 256;

/// Batch storage kept for reuse; more in flight than this at once are freed when they come back.
const POOL_BATCHES_MAX: usize = 4096;

/// Capacity a new batch starts with (a datagram of small messages fits).
const BATCH_CAPACITY_INITIAL: usize = 32;

/// The emptied storage of delivered batches, taken by the core thread for new ones.
#[derive(Debug)]
pub(crate) struct BatchPool {
    free: ArrayQueue<Vec<Delivery>>,
}

impl BatchPool {
    /// An empty pool.
    pub(crate) fn new() -> Arc<BatchPool> {
        Arc::new(BatchPool {
            free: ArrayQueue::new(POOL_BATCHES_MAX),
        })
    }

    /// An empty batch of `topic`, on recycled storage if there is some.
    pub(crate) fn batch(self: &Arc<Self>, topic: TopicId) -> Deliveries {
        Deliveries {
            topic,
            items: Items::One(None),
            pool: Some(Arc::clone(self)),
        }
    }

    /// Empty storage for a run of two or more messages, recycled if there is some.
    fn storage(&self) -> Vec<Delivery> {
        self.free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BATCH_CAPACITY_INITIAL))
    }

    fn put(&self, mut items: Vec<Delivery>) {
        items.clear();
        if items.capacity() <= 2 * BATCH_MSGS_MAX {
            // A full pool frees the storage.
            let _ = self.free.push(items);
        }
    }
}

/// A run of messages of one topic, in sender order, delivered to a subscription as one event
/// ([`NodeRuntime::subscribe_batch`](crate::NodeRuntime::subscribe_batch)). It reads as a
/// slice of [`Delivery`]; [`drain`](Deliveries::drain) takes the messages out. Its storage goes
/// back to the runtime when it is dropped. (The batches of a group subscription's shared task,
/// which no caller sees, hold the run of several topics: each message names its own.)
#[derive(Debug)]
pub struct Deliveries {
    topic: TopicId,
    items: Items,
    pool: Option<Arc<BatchPool>>,
}

/// Where a batch keeps its messages: a run of one (every run of 1000-byte messages, one to a
/// datagram, and of topics taken in turn) in place, without touching the pool; longer runs on
/// pooled storage.
#[derive(Debug)]
enum Items {
    /// At most one message.
    One(Option<Delivery>),
    /// Two or more (or a drained run's storage).
    Many(Vec<Delivery>),
}

impl Deliveries {
    /// A batch outside any pool (for tests and for callers that build their own).
    #[must_use]
    pub fn new(topic: TopicId, items: Vec<Delivery>) -> Deliveries {
        Deliveries {
            topic,
            items: Items::Many(items),
            pool: None,
        }
    }

    /// The topic of every message of the batch (of its first message, in a group's batch).
    #[must_use]
    pub fn topic(&self) -> TopicId {
        self.topic
    }

    /// Takes the messages out, in order; the batch is empty afterwards (messages the iterator
    /// has not yielded when it is dropped are dropped with it).
    pub fn drain(&mut self) -> DeliveriesDrain<'_> {
        match &mut self.items {
            Items::One(d) => DeliveriesDrain {
                one: d.take(),
                many: None,
            },
            Items::Many(items) => DeliveriesDrain {
                one: None,
                many: Some(items.drain(..)),
            },
        }
    }

    /// Names the batch and its messages by `topic`: the topic's id after a rejoin.
    pub(crate) fn retopic(&mut self, topic: TopicId) {
        self.topic = topic;
        let items: &mut [Delivery] = match &mut self.items {
            Items::One(d) => d.as_mut_slice(),
            Items::Many(items) => items,
        };
        for d in items {
            d.topic = topic;
        }
    }

    pub(crate) fn push(&mut self, d: Delivery) {
        match &mut self.items {
            Items::One(slot @ None) => *slot = Some(d),
            Items::One(Some(_)) => {
                let mut items = match &self.pool {
                    Some(pool) => pool.storage(),
                    None => Vec::with_capacity(BATCH_CAPACITY_INITIAL),
                };
                if let Items::One(Some(first)) =
                    std::mem::replace(&mut self.items, Items::One(None))
                {
                    items.push(first);
                }
                items.push(d);
                self.items = Items::Many(items);
            }
            Items::Many(items) => items.push(d),
        }
    }

    /// Whether messages of more than one topic are in the batch (a group's run).
    #[cfg(test)]
    pub(crate) fn is_mixed(&self) -> bool {
        self.iter().any(|d| d.topic != self.topic)
    }

    /// The batch cut into runs of one topic each, in order, on storage of `pool`, appended to
    /// `runs` (the caller's, reused): what a held group's backlog becomes when the group's
    /// topics are held one by one instead (another subscription took one of them, or a rejoin).
    pub(crate) fn split_by_topic(mut self, pool: &Arc<BatchPool>, runs: &mut Vec<Deliveries>) {
        for d in self.drain() {
            match runs.last_mut() {
                Some(run) if run.topic == d.topic && !run.is_full() => run.push(d),
                _ => {
                    let mut run = pool.batch(d.topic);
                    run.push(d);
                    runs.push(run);
                }
            }
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= BATCH_MSGS_MAX
    }

    /// A copy of the messages `range` of the batch on storage of `pool` (payloads are shared,
    /// not copied).
    pub(crate) fn copy_in(
        &self,
        pool: &Arc<BatchPool>,
        range: std::ops::Range<usize>,
    ) -> Deliveries {
        let mut copy = pool.batch(self.topic);
        if let Some(items) = self.get(range) {
            for d in items {
                copy.push(d.clone());
            }
        }
        copy
    }
}

/// The messages of a batch taken out in order, from [`Deliveries::drain`].
#[derive(Debug)]
pub struct DeliveriesDrain<'a> {
    one: Option<Delivery>,
    many: Option<std::vec::Drain<'a, Delivery>>,
}

impl Iterator for DeliveriesDrain<'_> {
    type Item = Delivery;

    fn next(&mut self) -> Option<Delivery> {
        match &mut self.many {
            Some(many) => many.next(),
            None => self.one.take(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.many {
            Some(many) => many.len(),
            None => usize::from(self.one.is_some()),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for DeliveriesDrain<'_> {}

impl std::ops::Deref for Deliveries {
    type Target = [Delivery];

    fn deref(&self) -> &[Delivery] {
        match &self.items {
            Items::One(d) => d.as_slice(),
            Items::Many(items) => items,
        }
    }
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        if let (Some(pool), Items::Many(items)) = (self.pool.take(), &mut self.items) {
            pool.put(std::mem::take(items));
        }
    }
}

/// The topics that share one delivery task, each with a callback of its own (by index): which
/// index each topic's messages go to, and which of the group's subscriptions are still alive.
#[derive(Debug)]
pub(crate) struct TaskGroup {
    /// Each bound topic's index, written by the core thread as the membership service binds
    /// the topics (and again as a rejoin gives them new ids), read by the task once per batch.
    routes: Mutex<Routes>,
    /// Per index, whether its subscription is alive: cleared when it is dropped, so that its
    /// messages already queued in the shared task are dropped, as a task's own are.
    live: Box<[AtomicBool]>,
    /// Subscriptions of the group not dropped yet; the last one dropped removes the task.
    subscriptions: AtomicUsize,
}

/// Index of a message whose topic has no route (unbound or unsubscribed): dropped.
const NO_ROUTE: u32 = u32::MAX;

/// Topic ids below this are routed through [`Routes`]' vector (4 bytes each, 256 KiB at
/// most); the membership service numbers topics from 1 up.
const DENSE_TOPIC_IDS: u32 = 1 << 16;

/// A group's topics to their indices, looked up for every message the task runs: a vector
/// indexed by topic id for the ids below [`DENSE_TOPIC_IDS`] (40 KB for 10,000 topics, which
/// stays in cache where a hash map's look-up of one of 10,000 topics taken round-robin missed
/// it), a hash map for larger ids (a static membership may use any).
#[derive(Debug, Default)]
struct Routes {
    /// By topic id: the index, or [`NO_ROUTE`].
    dense: Vec<u32>,
    sparse: FxHashMap<TopicId, u32>,
}

impl Routes {
    fn get(&self, topic: TopicId) -> Option<u32> {
        match self.dense.get(topic.0 as usize) {
            Some(&index) if index != NO_ROUTE => Some(index),
            _ if self.sparse.is_empty() => None,
            _ => self.sparse.get(&topic).copied(),
        }
    }

    fn insert(&mut self, topic: TopicId, index: u32) {
        if topic.0 < DENSE_TOPIC_IDS && index != NO_ROUTE {
            let at = topic.0 as usize;
            if self.dense.len() <= at {
                self.dense.resize(at + 1, NO_ROUTE);
            }
            if let Some(slot) = self.dense.get_mut(at) {
                *slot = index;
                return;
            }
        }
        self.sparse.insert(topic, index);
    }

    fn remove(&mut self, topic: TopicId) -> Option<u32> {
        match self.dense.get_mut(topic.0 as usize) {
            Some(slot) if *slot != NO_ROUTE => Some(std::mem::replace(slot, NO_ROUTE)),
            _ => self.sparse.remove(&topic),
        }
    }
}

impl TaskGroup {
    /// A group of `topics` topics (indices `0..topics`), none bound yet.
    pub(crate) fn new(topics: usize) -> Arc<TaskGroup> {
        Arc::new(TaskGroup {
            routes: Mutex::new(Routes::default()),
            live: (0..topics).map(|_| AtomicBool::new(true)).collect(),
            subscriptions: AtomicUsize::new(0),
        })
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Messages of `topic` go to index `index` (the core thread, as the topic is bound).
    pub(crate) fn bind(&self, topic: TopicId, index: u32) {
        self.routes().insert(topic, index);
    }

    /// A rejoin gave the topic `old` the id `new` (the core thread).
    pub(crate) fn rebind(&self, old: TopicId, new: TopicId) {
        let mut routes = self.routes();
        if let Some(index) = routes.remove(old) {
            routes.insert(new, index);
        }
    }

    /// Messages of `topic` go nowhere any more (the core thread, as it is unsubscribed).
    pub(crate) fn unbind(&self, topic: TopicId) {
        self.routes().remove(topic);
    }

    /// Counts a subscription handed out for the group.
    pub(crate) fn add_subscription(&self) {
        self.subscriptions.fetch_add(1, Ordering::Relaxed);
    }

    /// The subscription of index `index` is dropped: its messages are dropped from now on.
    /// Whether it was the group's last (then the shared task is to be removed).
    pub(crate) fn drop_subscription(&self, index: u32) -> bool {
        if let Some(live) = self.live.get(index as usize) {
            live.store(false, Ordering::Release);
        }
        self.subscriptions.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Fills `indices` with the index of each message of `batch`, [`NO_ROUTE`] for those of
    /// topics unbound or unsubscribed: one lock per batch.
    fn route(&self, batch: &Deliveries, indices: &mut Vec<u32>) {
        indices.clear();
        let routes = self.routes();
        indices.extend(batch.iter().map(|d| {
            routes
                .get(d.topic)
                .filter(|&i| {
                    self.live
                        .get(i as usize)
                        .is_some_and(|l| l.load(Ordering::Acquire))
                })
                .unwrap_or(NO_ROUTE)
        }));
    }

    /// Runs `callback(index, message)` for each message of `batch` whose topic is routed, in
    /// order; `indices` is scratch storage (kept by the task, so nothing is allocated per batch
    /// once it has grown to the longest batch).
    pub(crate) fn dispatch(
        &self,
        batch: &mut Deliveries,
        indices: &mut Vec<u32>,
        mut callback: impl FnMut(usize, Delivery),
    ) {
        self.route(batch, indices);
        for (d, &index) in batch.drain().zip(indices.iter()) {
            if index != NO_ROUTE {
                callback(index as usize, d);
            }
        }
    }
}

/// A group subscription's place in its group: the shared group and its own index.
#[derive(Clone, Debug)]
pub(crate) struct GroupRoute {
    pub(crate) group: Arc<TaskGroup>,
    pub(crate) index: u32,
}

/// A subscription's delivery task, with the count of messages its handler has run (a task's
/// own count is of batches), and, for a subscription of a group, its place in the group.
#[derive(Clone, Debug)]
pub(crate) struct SubTask {
    pub(crate) handle: TaskHandle<Deliveries>,
    pub(crate) delivered: Arc<AtomicU64>,
    pub(crate) group: Option<GroupRoute>,
}

impl SubTask {
    /// The same task as the subscription of index `index` of `group`.
    pub(crate) fn in_group(&self, group: &Arc<TaskGroup>, index: u32) -> SubTask {
        SubTask {
            handle: self.handle.clone(),
            delivered: Arc::clone(&self.delivered),
            group: Some(GroupRoute {
                group: Arc::clone(group),
                index,
            }),
        }
    }

    /// Whether the task is shared by a group's topics.
    pub(crate) fn is_group(&self) -> bool {
        self.group.is_some()
    }

    /// Messages the subscription's handler has run.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

impl std::ops::Deref for SubTask {
    type Target = TaskHandle<Deliveries>;

    fn deref(&self) -> &TaskHandle<Deliveries> {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tidings_proto::{MsgId, NodeId};

    fn delivery(i: u64) -> Delivery {
        Delivery {
            origin: NodeId(1),
            topic: TopicId(7),
            msg_id: MsgId(i),
            timestamp_us: i,
            payload: Bytes::from_static(b"payload"),
        }
    }

    #[test]
    fn a_dropped_batch_gives_its_storage_back_and_the_next_one_reuses_it() {
        let pool = BatchPool::new();
        let mut b = pool.batch(TopicId(7));
        for i in 0..100 {
            b.push(delivery(i));
        }
        let copy = b.copy_in(&pool, 0..100);
        assert_eq!(&*copy, &*b);
        let part = b.copy_in(&pool, 10..12);
        assert_eq!(&*part, &b[10..12]);
        let storage = b.as_ptr();
        let ids: Vec<u64> = b.drain().map(|d| d.msg_id.0).collect();
        assert_eq!(ids, (0..100).collect::<Vec<_>>());
        assert!(b.is_empty());
        drop(b);
        drop(copy);
        drop(part);
        assert_eq!(pool.free.len(), 3);
        let mut again = pool.batch(TopicId(8));
        assert!(again.is_empty());
        assert_eq!(again.topic(), TopicId(8));
        again.push(delivery(1));
        again.push(delivery(2));
        assert_eq!(pool.free.len(), 2, "a run of two takes pooled storage");
        assert_eq!(
            again.as_ptr(),
            storage,
            "the first storage back is reused first"
        );
    }

    #[test]
    fn a_run_of_one_keeps_its_message_in_place_and_leaves_the_pool_alone() {
        let pool = BatchPool::new();
        let mut b = pool.batch(TopicId(7));
        for i in 0..3 {
            b.push(delivery(i));
        }
        drop(b);
        assert_eq!(pool.free.len(), 1);
        let mut one = pool.batch(TopicId(7));
        one.push(delivery(5));
        assert_eq!(pool.free.len(), 1, "a run of one takes no storage");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].msg_id, MsgId(5));
        one.retopic(TopicId(9));
        assert_eq!((one.topic(), one[0].topic), (TopicId(9), TopicId(9)));
        let copy = one.copy_in(&pool, 0..1);
        assert_eq!(&*copy, &*one);
        let ids: Vec<u64> = one.drain().map(|d| d.msg_id.0).collect();
        assert_eq!(ids, vec![5]);
        assert!(one.is_empty());
        drop(one);
        drop(copy);
        assert_eq!(pool.free.len(), 1, "runs of one give nothing back");
    }

    fn delivery_of(topic: u32, i: u64) -> Delivery {
        Delivery {
            topic: TopicId(topic),
            ..delivery(i)
        }
    }

    #[test]
    fn a_group_run_is_cut_into_runs_of_one_topic_in_order() {
        let pool = BatchPool::new();
        let mut b = pool.batch(TopicId(1));
        for (topic, i) in [(1, 0), (1, 1), (2, 2), (1, 3), (3, 4), (3, 5)] {
            b.push(delivery_of(topic, i));
        }
        assert!(b.is_mixed());
        let mut split = Vec::new();
        b.split_by_topic(&pool, &mut split);
        let runs: Vec<(u32, Vec<u64>)> = split
            .iter()
            .map(|r| {
                assert!(!r.is_mixed());
                (r.topic().0, r.iter().map(|d| d.msg_id.0).collect())
            })
            .collect();
        assert_eq!(
            runs,
            vec![(1, vec![0, 1]), (2, vec![2]), (1, vec![3]), (3, vec![4, 5]),]
        );
    }

    #[test]
    fn a_group_routes_each_message_to_its_topics_index_until_it_is_dropped() {
        let pool = BatchPool::new();
        let group = TaskGroup::new(3);
        group.bind(TopicId(10), 0);
        group.bind(TopicId(20), 1);
        group.bind(TopicId(30), 2);
        for _ in 0..3 {
            group.add_subscription();
        }
        let mut indices = Vec::new();
        let mut seen = Vec::new();
        let mut b = pool.batch(TopicId(10));
        for (topic, i) in [(10, 0), (20, 1), (40, 2), (30, 3), (10, 4)] {
            b.push(delivery_of(topic, i));
        }
        group.dispatch(&mut b, &mut indices, |index, d| {
            seen.push((index, d.msg_id.0))
        });
        // Topic 40 is not the group's: dropped.
        assert_eq!(seen, vec![(0, 0), (1, 1), (2, 3), (0, 4)]);
        // Index 1 dropped, topic 30 unbound, topic 10 moved to 11 by a rejoin.
        assert!(!group.drop_subscription(1));
        group.unbind(TopicId(30));
        group.rebind(TopicId(10), TopicId(11));
        seen.clear();
        let mut b = pool.batch(TopicId(11));
        for (topic, i) in [(11, 5), (20, 6), (30, 7), (10, 8)] {
            b.push(delivery_of(topic, i));
        }
        group.dispatch(&mut b, &mut indices, |index, d| {
            seen.push((index, d.msg_id.0))
        });
        assert_eq!(seen, vec![(0, 5)]);
        // A topic id past the vector's range routes as well.
        let large = TopicId(DENSE_TOPIC_IDS + 1);
        group.bind(large, 2);
        seen.clear();
        let mut b = pool.batch(large);
        for (topic, i) in [(DENSE_TOPIC_IDS + 1, 9), (DENSE_TOPIC_IDS + 2, 10)] {
            b.push(delivery_of(topic, i));
        }
        group.dispatch(&mut b, &mut indices, |index, d| {
            seen.push((index, d.msg_id.0))
        });
        assert_eq!(seen, vec![(2, 9)]);
        assert!(!group.drop_subscription(0));
        assert!(
            group.drop_subscription(2),
            "the last subscription of the group"
        );
    }

    #[test]
    fn a_batch_outside_a_pool_is_freed() {
        let b = Deliveries::new(TopicId(1), vec![delivery(1)]);
        assert_eq!(b.len(), 1);
        drop(b);
    }
}
