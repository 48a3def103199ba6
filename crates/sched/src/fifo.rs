//! The FIFOs under the scheduler, behind small traits.
//!
//! The coordination protocol (bucket counters, spill counters, queue size, slot reservations,
//! epoch) is written once against [`Fifo`] and [`RingFifo`]. Normal builds plug in crossbeam's
//! lock-free queues; `--cfg loom` builds plug in [`MutexFifo`], a loom-visible queue, because
//! loom cannot instrument crossbeam's internals. The protocol code under test is therefore the
//! production code.
//!
//! Only the spill queues of the priority buckets (`SegQueue`) allocate after construction, and
//! only when more tasks share one bucket than its preallocated ring holds (see `bucket.rs`).

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
}

#[cfg(not(loom))]
mod lock_free {
    use super::{Fifo, NewFifo, RingFifo};
    use crossbeam_queue::{ArrayQueue, SegQueue};

    impl<T: Send> Fifo<T> for SegQueue<T> {
        fn push(&self, item: T) {
            SegQueue::push(self, item);
        }
        fn pop(&self) -> Option<T> {
            SegQueue::pop(self)
        }
    }

    impl<T: Send> NewFifo<T> for SegQueue<T> {
        fn new_fifo() -> Self {
            SegQueue::new()
        }
    }

    /// A bounded lock-free FIFO (crossbeam's `ArrayQueue`, one allocation at construction): the
    /// per-task event queues and the rings of the priority buckets.
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
    }
}

#[cfg(not(loom))]
pub(crate) use lock_free::BoundedFifo;

/// The preallocated ring of each priority bucket.
#[cfg(not(loom))]
pub(crate) type BucketRing<T> = BoundedFifo<T>;
/// The spill queue of each priority bucket (allocates one block per 31 items pushed).
#[cfg(not(loom))]
pub(crate) type BucketSpill<T> = crossbeam_queue::SegQueue<T>;
/// The ring of each priority bucket (loom build: a loom-visible queue with the same bound).
#[cfg(loom)]
pub(crate) type BucketRing<T> = MutexFifo<T>;
/// The spill queue of each priority bucket (loom build: a loom-visible queue).
#[cfg(loom)]
pub(crate) type BucketSpill<T> = MutexFifo<T>;
/// The bounded FIFO of each task's events (loom build: a loom-visible queue).
#[cfg(loom)]
pub(crate) type BoundedFifo<T> = MutexFifo<T>;

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
    #[should_panic(expected = "overflow")]
    fn bounded_fifo_overflow_is_a_bug() {
        let fifo = BoundedFifo::with_capacity(1);
        fifo.push(1);
        fifo.push(2);
    }
}
