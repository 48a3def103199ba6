//! The FIFOs under the scheduler, behind small traits.
//!
//! The coordination protocol (bucket counters, spill counters, queue size, slot reservations,
//! epoch) is written once against [`Fifo`] and [`RingFifo`]. Normal builds plug in crossbeam's
//! lock-free `ArrayQueue` for the buckets' rings and a [`GrowingFifo`] (two mutex-guarded
//! deques, storage that follows use) for the tasks' event queues and the buckets' spill queues;
//! `--cfg loom` builds plug in [`MutexFifo`], a loom-visible queue, because loom cannot
//! instrument crossbeam's internals. The protocol code under test is therefore the production
//! code.
//!
//! After construction, queues allocate only when they hold more than they ever held before:
//! a task's event queue as it first fills, a spill queue when more tasks than ever share one
//! bucket beyond its preallocated ring (see `bucket.rs`).

/// A multi-producer multi-consumer FIFO.
///
/// `push` never fails: unbounded queues always have room, and bounded ones are only pushed to
/// after a slot was reserved (see `Task::try_reserve_slot`), so a full queue there is a bug.
pub(crate) trait Fifo<T>: Send + Sync {
    /// Appends `item` at the tail.
    fn push(&self, item: T);
    /// Takes the head item, or `None` if the queue is empty.
    fn pop(&self) -> Option<T>;
}

/// An unbounded FIFO that can be created empty (the spill queue of each priority bucket).
pub(crate) trait NewFifo<T>: Fifo<T> {
    /// An empty queue.
    fn new_fifo() -> Self;
}

/// A bounded FIFO whose storage is allocated once, at construction (the ring of each priority
/// bucket): `try_push` hands the item back when the queue is full.
pub(crate) trait RingFifo<T>: Send + Sync {
    /// An empty queue of `capacity` (>= 1) items.
    fn with_capacity(capacity: usize) -> Self;
    /// Appends `item` at the tail, or returns it if the queue is full.
    fn try_push(&self, item: T) -> Result<(), T>;
    /// Takes the head item, or `None` if the queue is empty.
    fn pop(&self) -> Option<T>;
    /// Items in the queue (a snapshot).
    fn len(&self) -> usize;
}

#[cfg(not(loom))]
mod lock_free {
    use super::{Fifo, RingFifo};
    use crossbeam_queue::ArrayQueue;

    /// A bounded lock-free FIFO (crossbeam's `ArrayQueue`, one allocation at construction): the
    /// rings of the priority buckets.
    #[derive(Debug)]
    pub(crate) struct BoundedFifo<T> {
        queue: ArrayQueue<T>,
    }

    impl<T> BoundedFifo<T> {
        /// A queue of `capacity` (>= 1) events.
        pub(crate) fn with_capacity(capacity: usize) -> Self {
            Self {
                queue: ArrayQueue::new(capacity),
            }
        }
    }

    impl<T: Send> Fifo<T> for BoundedFifo<T> {
        fn push(&self, item: T) {
            if self.queue.push(item).is_err() {
                // Writers reserve a slot in `Task::slots_used` before pushing, and the reserved
                // count never exceeds the capacity: reaching this line is a scheduler bug.
                panic!("bounded event queue overflow despite a reserved slot");
            }
        }
        fn pop(&self) -> Option<T> {
            self.queue.pop()
        }
    }

    impl<T: Send> RingFifo<T> for BoundedFifo<T> {
        fn with_capacity(capacity: usize) -> Self {
            BoundedFifo::with_capacity(capacity)
        }
        fn try_push(&self, item: T) -> Result<(), T> {
            self.queue.push(item)
        }
        fn pop(&self) -> Option<T> {
            self.queue.pop()
        }
        fn len(&self) -> usize {
            self.queue.len()
        }
    }
}

#[cfg(not(loom))]
pub(crate) use lock_free::BoundedFifo;

/// Pops between two looks at whether a [`GrowingFifo`] holds far more storage than it used.
const GROWING_FIFO_SHRINK_CHECK_POPS: usize = 4096;
/// Slots a [`GrowingFifo`] keeps however little it is used.
const GROWING_FIFO_SLOTS_KEPT: usize = 32;

/// A bounded FIFO whose storage follows its use: the event queue of each task.
///
/// A node subscribes once per topic, so it has as many tasks as topics; a queue allocated at
/// full capacity for each (1024 events of 56 bytes: 64 KiB) made memory grow by that much per
/// topic, 330 MB at 5,000 topics, though a topic among thousands rarely holds more than a few
/// events. This queue starts empty and grows (by doubling) to the most events it holds at
/// once, never beyond the capacity the task's slot reservation enforces; a check every
/// [`GROWING_FIFO_SHRINK_CHECK_POPS`] pops gives storage back when less than a quarter of it
/// was used since the last one. A steady flow allocates nothing once the queue has grown.
///
/// Two double-ended queues behind mutexes: writers push to `pushed`; the reader pops from
/// `taken` and, when that is empty, swaps the two (taking everything pushed so far at once,
/// and leaving its own drained storage to the writers). So writer and reader meet on a lock
/// once per batch, not once per event, and the reader's lock is its own (only the worker that
/// holds the task pops). The order is FIFO: `taken` holds only events older than `pushed`'s.
#[derive(Debug)]
pub(crate) struct GrowingFifo<T> {
    pushed: crate::sync::Mutex<std::collections::VecDeque<T>>,
    taken: crate::sync::Mutex<Taken<T>>,
    capacity: usize,
}

/// The reader's side of a [`GrowingFifo`].
#[derive(Debug)]
struct Taken<T> {
    items: std::collections::VecDeque<T>,
    /// Most events taken at once since the last shrink check.
    peak: usize,
    /// Pops since the last shrink check.
    pops: usize,
}

impl<T> GrowingFifo<T> {
    /// An empty queue of at most `capacity` items; it allocates when first pushed to.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            pushed: crate::sync::Mutex::new(std::collections::VecDeque::new()),
            taken: crate::sync::Mutex::new(Taken {
                items: std::collections::VecDeque::new(),
                peak: 0,
                pops: 0,
            }),
            capacity,
        }
    }

    /// Slots of storage held now (for tests).
    #[cfg(test)]
    fn slots(&self) -> usize {
        crate::sync::lock(&self.pushed).capacity() + crate::sync::lock(&self.taken).items.capacity()
    }
}

impl<T: Send> Fifo<T> for GrowingFifo<T> {
    fn push(&self, item: T) {
        let mut pushed = crate::sync::lock(&self.pushed);
        // Writers reserve a slot in `Task::slots_used` before pushing: a bug otherwise.
        assert!(
            pushed.len() < self.capacity,
            "bounded event queue overflow despite a reserved slot"
        );
        pushed.push_back(item);
    }

    fn pop(&self) -> Option<T> {
        let mut taken = crate::sync::lock(&self.taken);
        let taken = &mut *taken;
        if taken.items.is_empty() {
            if taken.pops >= GROWING_FIFO_SHRINK_CHECK_POPS {
                // Shrink the drained storage that goes to the writers (the other half is
                // looked at next time).
                let wanted = (taken.peak * 2).max(GROWING_FIFO_SLOTS_KEPT);
                if taken.items.capacity() > 2 * wanted {
                    taken.items.shrink_to(wanted);
                }
                taken.pops = 0;
                taken.peak = 0;
            }
            std::mem::swap(&mut taken.items, &mut *crate::sync::lock(&self.pushed));
            taken.peak = taken.peak.max(taken.items.len());
        }
        let item = taken.items.pop_front()?;
        taken.pops += 1;
        Some(item)
    }
}

impl<T: Send> NewFifo<T> for GrowingFifo<T> {
    fn new_fifo() -> Self {
        GrowingFifo::with_capacity(usize::MAX)
    }
}

/// The preallocated ring of each priority bucket.
#[cfg(not(loom))]
pub(crate) type BucketRing<T> = BoundedFifo<T>;
/// The spill queue of each priority bucket: unbounded, and its storage is reused (a
/// `SegQueue` allocated a block every 31 items pushed, 0.05 allocations per message with
/// 5,000 busy subscriptions). The same code in loom builds (its mutexes are loom's there).
pub(crate) type BucketSpill<T> = GrowingFifo<T>;
/// The ring of each priority bucket (loom build: a loom-visible queue with the same bound).
#[cfg(loom)]
pub(crate) type BucketRing<T> = MutexFifo<T>;
/// The bounded FIFO of each task's events. The same code in loom builds (its mutexes are
/// loom's there), so the models check it too.
pub(crate) type TaskFifo<T> = GrowingFifo<T>;

/// A FIFO behind a (loom) mutex: the loom stand-in for the lock-free queues. Linearizable, which
/// is all the protocol assumes of its FIFOs. Like `ArrayQueue` it has a capacity: `push` past it
/// panics (a task queue overflowing despite its slot reservation) and `try_push` refuses (a full
/// bucket ring, which then spills).
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct MutexFifo<T> {
    items: crate::sync::Mutex<std::collections::VecDeque<T>>,
    capacity: usize,
}

#[cfg(loom)]
impl<T> MutexFifo<T> {
    /// An empty queue of `capacity` items.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            items: crate::sync::Mutex::new(std::collections::VecDeque::with_capacity(
                capacity.min(16),
            )),
            capacity,
        }
    }
}

#[cfg(loom)]
impl<T: Send> Fifo<T> for MutexFifo<T> {
    fn push(&self, item: T) {
        let mut items = crate::sync::lock(&self.items);
        assert!(
            items.len() < self.capacity,
            "bounded event queue overflow despite a reserved slot"
        );
        items.push_back(item);
    }
    fn pop(&self) -> Option<T> {
        crate::sync::lock(&self.items).pop_front()
    }
}

#[cfg(loom)]
impl<T: Send> NewFifo<T> for MutexFifo<T> {
    fn new_fifo() -> Self {
        Self::with_capacity(usize::MAX)
    }
}

#[cfg(loom)]
impl<T: Send> RingFifo<T> for MutexFifo<T> {
    fn with_capacity(capacity: usize) -> Self {
        MutexFifo::with_capacity(capacity)
    }
    fn try_push(&self, item: T) -> Result<(), T> {
        let mut items = crate::sync::lock(&self.items);
        if items.len() >= self.capacity {
            return Err(item);
        }
        items.push_back(item);
        Ok(())
    }
    fn pop(&self) -> Option<T> {
        crate::sync::lock(&self.items).pop_front()
    }
    fn len(&self) -> usize {
        crate::sync::lock(&self.items).len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bounded_fifo_keeps_order() {
        let fifo = BoundedFifo::with_capacity(3);
        for i in 0..3 {
            fifo.push(i);
        }
        let pop = || Fifo::pop(&fifo);
        assert_eq!(
            (pop(), pop(), pop(), pop()),
            (Some(0), Some(1), Some(2), None)
        );
    }

    #[test]
    fn a_full_ring_hands_the_item_back() {
        let ring: BoundedFifo<u32> = RingFifo::with_capacity(2);
        assert_eq!(ring.try_push(1), Ok(()));
        assert_eq!(ring.try_push(2), Ok(()));
        assert_eq!(ring.try_push(3), Err(3));
        assert_eq!(RingFifo::pop(&ring), Some(1));
        assert_eq!(ring.try_push(3), Ok(()));
    }

    #[test]
    fn a_growing_fifo_keeps_order_and_grows_only_as_far_as_it_is_filled() {
        let fifo = GrowingFifo::with_capacity(1024);
        assert_eq!(fifo.slots(), 0, "allocated before the first push");
        for round in 0..3 {
            for i in 0..10 {
                fifo.push(round * 10 + i);
            }
            for i in 0..10 {
                assert_eq!(Fifo::pop(&fifo), Some(round * 10 + i));
            }
            assert_eq!(Fifo::pop(&fifo), None);
        }
        assert!(fifo.slots() >= 10 && fifo.slots() < 64, "{}", fifo.slots());
    }

    #[test]
    fn a_growing_fifo_gives_storage_back_once_it_is_used_less() {
        let fifo = GrowingFifo::with_capacity(4096);
        // A burst fills it...
        for i in 0..4000 {
            fifo.push(i);
        }
        for i in 0..4000 {
            assert_eq!(Fifo::pop(&fifo), Some(i));
        }
        let after_burst = fifo.slots();
        assert!(after_burst >= 4000, "{after_burst}");
        // ...then a trickle, one event at a time: the checks that see only the trickle since
        // the one before shrink both halves.
        for i in 0..3 * super::GROWING_FIFO_SHRINK_CHECK_POPS {
            fifo.push(i);
            assert_eq!(Fifo::pop(&fifo), Some(i));
        }
        assert!(
            fifo.slots() <= 4 * super::GROWING_FIFO_SLOTS_KEPT,
            "kept {} slots after a trickle",
            fifo.slots()
        );
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn a_growing_fifo_overflow_is_a_bug() {
        let fifo = GrowingFifo::with_capacity(1);
        fifo.push(1);
        fifo.push(2);
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn bounded_fifo_overflow_is_a_bug() {
        let fifo = BoundedFifo::with_capacity(1);
        fifo.push(1);
        fifo.push(2);
    }
}
