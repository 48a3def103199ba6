//! The FIFOs under the scheduler, behind one small trait.
//!
//! The coordination protocol (bucket counters, queue size, slot reservations, epoch) is written
//! once against [`Fifo`]. Normal builds plug in crossbeam's lock-free queues; `--cfg loom` builds
//! plug in [`MutexFifo`], a loom-visible queue, because loom cannot instrument crossbeam's
//! internals. The protocol code under test is therefore the production code.

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

/// An unbounded FIFO that can be created empty (the priority buckets).
pub(crate) trait NewFifo<T>: Fifo<T> {
    /// An empty queue.
    fn new_fifo() -> Self;
}

#[cfg(not(loom))]
mod lock_free {
    use super::{Fifo, NewFifo};
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

    /// A bounded lock-free FIFO (crossbeam's `ArrayQueue`) used for the per-task event queues.
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
}

#[cfg(not(loom))]
pub(crate) use lock_free::BoundedFifo;

/// The FIFO of each priority bucket.
#[cfg(not(loom))]
pub(crate) type BucketFifo<T> = crossbeam_queue::SegQueue<T>;
/// The FIFO of each priority bucket (loom build: a loom-visible queue).
#[cfg(loom)]
pub(crate) type BucketFifo<T> = MutexFifo<T>;
/// The bounded FIFO of each task's events (loom build: a loom-visible queue).
#[cfg(loom)]
pub(crate) type BoundedFifo<T> = MutexFifo<T>;

/// A FIFO behind a (loom) mutex: the loom stand-in for the lock-free queues. Linearizable, which
/// is all the protocol assumes of its FIFOs.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct MutexFifo<T> {
    items: crate::sync::Mutex<std::collections::VecDeque<T>>,
}

#[cfg(loom)]
impl<T> MutexFifo<T> {
    /// An empty queue; `capacity` is only a hint (bounds are enforced by slot reservation).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            items: crate::sync::Mutex::new(std::collections::VecDeque::with_capacity(capacity)),
        }
    }
}

#[cfg(loom)]
impl<T: Send> Fifo<T> for MutexFifo<T> {
    fn push(&self, item: T) {
        crate::sync::lock(&self.items).push_back(item);
    }
    fn pop(&self) -> Option<T> {
        crate::sync::lock(&self.items).pop_front()
    }
}

#[cfg(loom)]
impl<T: Send> NewFifo<T> for MutexFifo<T> {
    fn new_fifo() -> Self {
        Self::with_capacity(0)
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
        assert_eq!(
            (fifo.pop(), fifo.pop(), fifo.pop(), fifo.pop()),
            (Some(0), Some(1), Some(2), None)
        );
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn bounded_fifo_overflow_is_a_bug() {
        let fifo = BoundedFifo::with_capacity(1);
        fifo.push(1);
        fifo.push(2);
    }
}
