//! Batch delivery: the core thread hands a subscription the in-order run of one topic's messages
//! that one input (a datagram, a repair, a release) brought, as one scheduler event. A run of one
//! message is kept in the batch itself; longer runs are stored on storage recycled through a
//! lock-free pool, so steady delivery allocates nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
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
/// back to the runtime when it is dropped.
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

    /// The topic of every message of the batch.
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

/// A subscription's delivery task, with the count of messages its handler has run (a task's
/// own count is of batches).
#[derive(Clone, Debug)]
pub(crate) struct SubTask {
    pub(crate) handle: TaskHandle<Deliveries>,
    pub(crate) delivered: Arc<AtomicU64>,
}

impl SubTask {
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

    #[test]
    fn a_batch_outside_a_pool_is_freed() {
        let b = Deliveries::new(TopicId(1), vec![delivery(1)]);
        assert_eq!(b.len(), 1);
        drop(b);
    }
}
