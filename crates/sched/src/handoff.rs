//! Hand-off from many producer threads to one consumer thread, for a consumer that serves many
//! producers of which few are busy at a time (the runtime's core thread and its publishers).
//!
//! * [`ring_chain`]: a single-producer single-consumer FIFO whose storage follows use. A chain of
//!   bounded lock-free rings: it starts with a small ring and, when that is full, the producer
//!   links a ring of twice the capacity (up to a bound) and writes there; the consumer drains a
//!   ring before it moves to the next one and drops it. Order is kept because the producer never
//!   writes to a ring again once it linked the next one. A thousand idle producers thus hold a
//!   thousand small rings, not a thousand rings of the bound; a busy one grows its ring once.
//! * [`ReadyList`] and [`ReadyFlag`]: which producers have work. A producer that finds its flag
//!   clear after queueing sets it and puts its slot number on the list; the consumer takes
//!   slots off the list, serves them, and clears the flag of a drained producer before it
//!   looks at its queue once more. Each "flag set" phase thus has exactly one entry on the list
//!   (or, if the list was full, the list's overflow mark, which makes the consumer look at every
//!   producer once), so the consumer looks only at producers with work: the cost of a turn no
//!   longer grows with the number of idle producers.
//!
//! Both are lock-free in normal builds (crossbeam's `ArrayQueue` rings); under `--cfg loom` the
//! rings are loom-visible stand-ins (see `fifo.rs`) and the loom models in `loom_tests.rs`
//! check the linking of rings and the flag handshake as they are written here.

use crate::fifo::{BucketRing, RingFifo};
use crate::sync::{fence, Arc, AtomicBool, Ordering};

/// The link from a full ring to its successor: set once, by the producer.
#[cfg(not(loom))]
type NextLink<T> = std::sync::OnceLock<Arc<Link<T>>>;
#[cfg(loom)]
type NextLink<T> = crate::sync::Mutex<Option<Arc<Link<T>>>>;

#[cfg(not(loom))]
fn empty_link<T>() -> NextLink<T> {
    std::sync::OnceLock::new()
}
#[cfg(loom)]
fn empty_link<T>() -> NextLink<T> {
    crate::sync::Mutex::new(None)
}

/// One ring of a chain and the link to the next.
struct Link<T> {
    ring: BucketRing<T>,
    capacity: usize,
    next: NextLink<T>,
}

impl<T: Send> Link<T> {
    fn new(capacity: usize) -> Arc<Link<T>> {
        Arc::new(Link {
            ring: BucketRing::with_capacity(capacity),
            capacity,
            next: empty_link(),
        })
    }

    #[cfg(not(loom))]
    fn next(&self) -> Option<Arc<Link<T>>> {
        self.next.get().cloned()
    }

    #[cfg(loom)]
    fn next(&self) -> Option<Arc<Link<T>>> {
        crate::sync::lock(&self.next).clone()
    }

    /// The sum of `f` over this link and every one after it, walking the links by reference
    /// (no reference count touched: the consumer's `len` is called once per publisher turn).
    #[cfg(not(loom))]
    fn sum_from(&self, f: impl Fn(&Link<T>) -> usize) -> usize {
        let mut sum = f(self);
        let mut link = self.next.get();
        while let Some(l) = link {
            sum += f(l);
            link = l.next.get();
        }
        sum
    }

    #[cfg(loom)]
    fn sum_from(&self, f: impl Fn(&Link<T>) -> usize) -> usize {
        let mut sum = f(self);
        let mut link = self.next();
        while let Some(l) = link {
            sum += f(&l);
            link = l.next();
        }
        sum
    }

    #[cfg(not(loom))]
    fn set_next(&self, next: Arc<Link<T>>) {
        // Only the producer links, once per ring (it moves to `next` right after).
        let _ = self.next.set(next);
    }

    #[cfg(loom)]
    fn set_next(&self, next: Arc<Link<T>>) {
        *crate::sync::lock(&self.next) = Some(next);
    }
}

/// Capacity of the first ring of a chain (or the bound, if smaller).
pub const RING_CHAIN_FIRST_CAPACITY: usize = 16;

/// The writing end of a [`ring_chain`].
pub struct ChainProducer<T> {
    tail: Arc<Link<T>>,
    capacity_max: usize,
}

/// The reading end of a [`ring_chain`].
pub struct ChainConsumer<T> {
    head: Arc<Link<T>>,
}

/// A single-producer single-consumer FIFO of at most `capacity_max` (>= 1) items in its newest
/// ring, whose storage starts at [`RING_CHAIN_FIRST_CAPACITY`] items and doubles when full.
/// While the consumer still drains an older ring the chain can hold the older rings' items
/// besides (at most `capacity_max` more in all), so the bound is a bound on the storage a busy
/// producer gets, not an exact count.
pub fn ring_chain<T: Send>(capacity_max: usize) -> (ChainProducer<T>, ChainConsumer<T>) {
    ring_chain_from(RING_CHAIN_FIRST_CAPACITY, capacity_max)
}

/// [`ring_chain`] with a first ring of `first` items (the loom models grow tiny chains).
pub(crate) fn ring_chain_from<T: Send>(
    first: usize,
    capacity_max: usize,
) -> (ChainProducer<T>, ChainConsumer<T>) {
    let capacity_max = capacity_max.max(1);
    let first = Link::new(first.clamp(1, capacity_max));
    (
        ChainProducer {
            tail: Arc::clone(&first),
            capacity_max,
        },
        ChainConsumer { head: first },
    )
}

impl<T: Send> ChainProducer<T> {
    /// Appends `item`, or hands it back if the newest ring is full at the bound.
    ///
    /// Allocates only when the chain grows (a new ring of twice the capacity), at most
    /// `log2(capacity_max / 16)` times in the producer's life.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        let item = match self.tail.ring.try_push(item) {
            Ok(()) => return Ok(()),
            Err(item) => item,
        };
        if self.tail.capacity >= self.capacity_max {
            return Err(item);
        }
        let next = Link::new((self.tail.capacity * 2).min(self.capacity_max));
        // The item goes in before the link is published: a consumer that follows the link
        // finds it there, behind everything of the older rings.
        next.ring.try_push(item)?;
        self.tail.set_next(Arc::clone(&next));
        self.tail = next;
        Ok(())
    }

    /// Capacity of the ring the producer writes to.
    pub fn ring_capacity(&self) -> usize {
        self.tail.capacity
    }
}

impl<T: Send> ChainConsumer<T> {
    /// Takes the oldest item, or `None` if the chain is empty.
    pub fn pop(&mut self) -> Option<T> {
        loop {
            if let Some(item) = self.head.ring.pop() {
                return Some(item);
            }
            let next = self.head.next()?;
            // The producer wrote to this ring only before it linked `next`: look once more,
            // then this ring is done for good.
            if let Some(item) = self.head.ring.pop() {
                return Some(item);
            }
            self.head = next;
        }
    }

    /// Items in the chain (a snapshot: the producer may be adding).
    pub fn len(&self) -> usize {
        self.head.sum_from(|l| l.ring.len())
    }

    /// Whether the chain holds no item (a snapshot: the producer may be adding).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots of storage the chain holds (every ring from the consumer's to the producer's).
    pub fn slots(&self) -> usize {
        self.head.sum_from(|l| l.capacity)
    }
}

impl<T> std::fmt::Debug for ChainProducer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainProducer")
            .field("ring_capacity", &self.tail.capacity)
            .field("capacity_max", &self.capacity_max)
            .finish()
    }
}

impl<T> std::fmt::Debug for ChainConsumer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainConsumer")
            .field("ring_capacity", &self.head.capacity)
            .finish_non_exhaustive()
    }
}

/// Slot number that no producer has yet (the consumer gives each producer its slot).
pub const SLOT_NONE: u32 = u32::MAX;

/// One producer's side of the [`ReadyList`] handshake: whether it has an entry (or is being
/// served), and its slot number.
#[derive(Debug)]
pub struct ReadyFlag {
    set: AtomicBool,
    slot: crate::sync::AtomicU64,
}

impl Default for ReadyFlag {
    fn default() -> Self {
        ReadyFlag::new()
    }
}

impl ReadyFlag {
    /// A flag that starts set, with no slot: the consumer serves a new producer once when it
    /// gives it its slot ([`ReadyList::adopt`]), so nothing queued before that is missed.
    pub fn new() -> ReadyFlag {
        ReadyFlag {
            set: AtomicBool::new(true),
            slot: crate::sync::AtomicU64::new(u64::from(SLOT_NONE)),
        }
    }

    /// Whether the producer is on the list or being served.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// The producer's slot ([`SLOT_NONE`] until adopted).
    pub fn slot(&self) -> u32 {
        u32::try_from(self.slot.load(Ordering::Acquire)).unwrap_or(SLOT_NONE)
    }
}

/// The producers with work, by slot number: a bounded lock-free list and an overflow mark.
#[derive(Debug)]
pub struct ReadyList {
    slots: BucketRing<u32>,
    overflow: AtomicBool,
}

/// What [`ReadyList::mark`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// The flag was set already: the consumer will look at the producer anyway.
    AlreadySet,
    /// The producer's slot was put on the list.
    Listed,
    /// The list was full (or the producer had no slot yet): the overflow mark was set.
    Overflow,
}

impl ReadyList {
    /// A list of room for `capacity` (>= 1) entries before it overflows.
    pub fn with_capacity(capacity: usize) -> ReadyList {
        ReadyList {
            slots: BucketRing::with_capacity(capacity.max(1)),
            overflow: AtomicBool::new(false),
        }
    }

    /// Producer: after queueing work, makes sure the consumer will look at it.
    ///
    /// Starts with a sequentially consistent fence: the item queued before it and the flag read
    /// after it pair with the consumer's clear, fence and second look in [`Self::finish`], so
    /// either this sees the flag clear (and lists the producer) or the consumer sees the item.
    /// When it lists, a second fence orders the entry before whatever the caller reads next
    /// (the consumer's "sleeping" flag, whose sleep check looks at this list).
    pub fn mark(&self, flag: &ReadyFlag) -> Marked {
        fence(Ordering::SeqCst);
        if flag.set.load(Ordering::Relaxed) || flag.set.swap(true, Ordering::AcqRel) {
            return Marked::AlreadySet;
        }
        let slot = flag.slot();
        let marked = if slot != SLOT_NONE && self.slots.try_push(slot).is_ok() {
            Marked::Listed
        } else {
            self.overflow.store(true, Ordering::Release);
            Marked::Overflow
        };
        fence(Ordering::SeqCst);
        marked
    }

    /// Entries on the list (a snapshot: producers may be adding).
    pub fn len_hint(&self) -> usize {
        self.slots.len()
    }

    /// Consumer: takes one listed slot.
    pub fn pop(&self) -> Option<u32> {
        self.slots.pop()
    }

    /// Consumer: whether the list overflowed since the last call (then every producer whose
    /// flag is set must be looked at).
    pub fn take_overflow(&self) -> bool {
        self.overflow.load(Ordering::Relaxed) && self.overflow.swap(false, Ordering::AcqRel)
    }

    /// Consumer: whether any entry or an overflow waits (for the check before sleeping).
    pub fn has_work(&self) -> bool {
        self.slots.len() > 0 || self.overflow.load(Ordering::Acquire)
    }

    /// Consumer: gives a new producer its slot. Its flag is still set from [`ReadyFlag::new`],
    /// so the caller serves it once, as if it had been listed.
    pub fn adopt(&self, flag: &ReadyFlag, slot: u32) {
        flag.slot.store(u64::from(slot), Ordering::Release);
    }

    /// Consumer: after draining a producer's queue, clears its flag and looks at the queue
    /// once more (`is_empty`). True if work arrived meanwhile and the consumer must serve the
    /// producer again: its flag is set again and it is not on the list.
    pub fn finish(&self, flag: &ReadyFlag, is_empty: impl FnOnce() -> bool) -> bool {
        flag.set.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // Only one side may take the work: the producer by setting the flag (it then lists
        // itself), or the consumer by setting it here.
        !is_empty() && !flag.set.swap(true, Ordering::AcqRel)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_chain_keeps_order_across_growth_and_stops_at_its_bound() {
        let (mut tx, mut rx) = ring_chain::<u32>(64);
        assert_eq!(rx.slots(), 16);
        for i in 0..64 {
            assert_eq!(tx.push(i), Ok(()), "item {i}");
        }
        // 16 + 32 + 64 slots, the newest full at the bound only once it holds 64.
        assert_eq!(rx.len(), 64);
        assert_eq!(rx.slots(), 16 + 32 + 64);
        for i in 64..(16 + 32 + 64) {
            assert_eq!(tx.push(i), Ok(()), "item {i}");
        }
        assert_eq!(tx.push(999), Err(999), "full at the bound");
        for i in 0..(16 + 32 + 64) {
            assert_eq!(rx.pop(), Some(i));
        }
        assert_eq!(rx.pop(), None);
        // The drained rings are gone: only the newest remains.
        assert_eq!(rx.slots(), 64);
        assert_eq!(tx.ring_capacity(), 64);
    }

    #[test]
    fn a_quiet_chain_stays_small() {
        let (mut tx, mut rx) = ring_chain::<u32>(1024);
        for round in 0..1000 {
            for i in 0..10 {
                assert_eq!(tx.push(round * 10 + i), Ok(()));
            }
            for i in 0..10 {
                assert_eq!(rx.pop(), Some(round * 10 + i));
            }
        }
        assert_eq!(rx.slots(), 16, "never more than 10 items at once");
    }

    #[test]
    fn a_chain_of_bound_one_holds_one() {
        let (mut tx, mut rx) = ring_chain::<u32>(1);
        assert_eq!(tx.push(1), Ok(()));
        assert_eq!(tx.push(2), Err(2));
        assert_eq!(rx.pop(), Some(1));
        assert_eq!(tx.push(2), Ok(()));
        assert_eq!(rx.pop(), Some(2));
    }

    #[test]
    fn a_chain_between_two_threads_delivers_everything_in_order() {
        const N: u64 = 200_000;
        let (mut tx, mut rx) = ring_chain::<u64>(256);
        let producer = std::thread::spawn(move || {
            for i in 0..N {
                let mut item = i;
                while let Err(back) = tx.push(item) {
                    item = back;
                    std::thread::yield_now();
                }
            }
        });
        let mut expected = 0;
        while expected < N {
            match rx.pop() {
                Some(i) => {
                    assert_eq!(i, expected);
                    expected += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        producer.join().expect("producer");
        assert_eq!(rx.pop(), None);
    }

    #[test]
    fn a_flag_lists_its_producer_once_until_the_consumer_finishes_it() {
        let list = ReadyList::with_capacity(4);
        let flag = ReadyFlag::new();
        // Set from birth: the consumer serves a new producer when it adopts it.
        assert_eq!(list.mark(&flag), Marked::AlreadySet);
        list.adopt(&flag, 7);
        assert!(!list.finish(&flag, || true), "drained: nothing more");
        assert_eq!(list.mark(&flag), Marked::Listed);
        assert_eq!(list.mark(&flag), Marked::AlreadySet);
        assert_eq!(list.pop(), Some(7));
        assert_eq!(list.pop(), None);
        // Work arrived after the drain: the consumer keeps the producer.
        assert!(list.finish(&flag, || false));
        assert!(flag.is_set());
    }

    #[test]
    fn a_full_list_overflows_once() {
        let list = ReadyList::with_capacity(1);
        let flags: Vec<ReadyFlag> = (0..3).map(|_| ReadyFlag::new()).collect();
        for (slot, flag) in flags.iter().enumerate() {
            list.adopt(flag, slot as u32);
            assert!(!list.finish(flag, || true));
        }
        assert_eq!(list.mark(&flags[0]), Marked::Listed);
        assert_eq!(list.mark(&flags[1]), Marked::Overflow);
        assert_eq!(list.mark(&flags[2]), Marked::Overflow);
        assert!(list.has_work());
        assert!(list.take_overflow());
        assert!(!list.take_overflow());
        assert_eq!(list.pop(), Some(0));
        assert!(!list.has_work());
    }
}
