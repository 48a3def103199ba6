//! The set of schedulable tasks: the non-blocking quantized priority queue of section III-B.
//!
//! `N + 1` buckets, each a lock-free FIFO with an atomic count, ordered from most credit
//! (bucket 0) to none (the last bucket). Buckets are grouped into groups of about `sqrt(N)` with
//! one more atomic count per group, so a removal skips empty groups with one load each: the
//! expected cost is about `sqrt(N)` loads and the worst case `2 sqrt(N)`.
//!
//! The counts are *reservations*: `put` raises the group count, then the bucket count, then
//! pushes; `get` pops, then lowers the bucket count, then the group count. So a group count is
//! never below the sum of its bucket counts, and a bucket count never below its queue's length:
//! a zero count always means empty, and a put that completed before a get started is always seen
//! by that get (this is what gives the section III-D invariant, see `history.rs`). A non-zero
//! count whose item is still being pushed, or was just taken, makes `get` move on to the next
//! bucket, as in the paper.
//!
//! **No allocation per put.** Each bucket's FIFO is a preallocated ring (`ArrayQueue`,
//! `SchedConfig::bucket_ring_capacity` tasks) with an unbounded spill queue (`GrowingFifo`)
//! behind it. A put goes to the ring unless the ring is full or items are already spilled; a get
//! takes from the ring first, then from the spill queue. While no more than the ring's capacity
//! of tasks share a bucket (each task is in the set at most once), nothing is allocated after
//! construction, and the spill queue reuses its storage, so it allocates only when more tasks
//! than ever before are spilled at once (a `SegQueue` allocated a block every 31 puts). The spill keeps the
//! bucket's FIFO order in sequential runs: items spill only behind a full ring or behind other
//! spilled items, and the spill queue is only served when the ring is empty. `spilled` counts
//! spilled items as a reservation too (raised before the push, lowered after the pop).

use crate::fifo::{BucketRing, BucketSpill, NewFifo, RingFifo};
use crate::sync::{lock, AtomicU64, AtomicUsize, Mutex, Ordering};
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::marker::PhantomData;

/// One bucket: a preallocated ring, its spill queue, and the number of items reserved in each.
struct Bucket<R, S> {
    ring: R,
    spill: S,
    /// Items reserved in the whole bucket (ring and spill queue).
    count: AtomicUsize,
    /// Items reserved in the spill queue.
    spilled: AtomicUsize,
}

/// The lock-free bucketed priority queue. `T` is the item (a task), `R` the bucket ring and `S`
/// its spill queue.
pub(crate) struct BucketQueue<T, R = BucketRing<T>, S = BucketSpill<T>> {
    /// Padded so that threads working in different buckets do not share cache lines.
    buckets: Box<[CachePadded<Bucket<R, S>>]>,
    groups: Box<[CachePadded<AtomicUsize>]>,
    group_size: usize,
    /// Puts that went to a spill queue (a ring was full or already spilled).
    spills: AtomicU64,
    _items: PhantomData<fn(T) -> T>,
}

impl<T: Send, R: RingFifo<T>, S: NewFifo<T>> BucketQueue<T, R, S> {
    /// A queue of `bucket_total` buckets in groups of `group_size`, each bucket with a ring of
    /// `ring_capacity` items (all at least 1).
    pub(crate) fn new(bucket_total: usize, group_size: usize, ring_capacity: usize) -> Self {
        assert!(
            bucket_total >= 1 && group_size >= 1 && ring_capacity >= 1,
            "validated by SchedConfig"
        );
        let buckets = (0..bucket_total)
            .map(|_| {
                CachePadded::new(Bucket {
                    ring: R::with_capacity(ring_capacity),
                    spill: S::new_fifo(),
                    count: AtomicUsize::new(0),
                    spilled: AtomicUsize::new(0),
                })
            })
            .collect();
        let group_total = bucket_total.div_ceil(group_size);
        let groups = (0..group_total)
            .map(|_| CachePadded::new(AtomicUsize::new(0)))
            .collect();
        Self {
            buckets,
            groups,
            group_size,
            spills: AtomicU64::new(0),
            _items: PhantomData,
        }
    }

    /// Adds `item` to bucket `bucket` (clamped to the last bucket).
    pub(crate) fn put(&self, item: T, bucket: usize) {
        let bucket_index = bucket.min(self.buckets.len() - 1);
        let group = bucket_index / self.group_size;
        let bucket = &self.buckets[bucket_index];
        // Reserve in the group, then the bucket, then publish the item (see the module docs).
        self.groups[group].fetch_add(1, Ordering::SeqCst);
        bucket.count.fetch_add(1, Ordering::SeqCst);
        let item = if bucket.spilled.load(Ordering::SeqCst) == 0 {
            match bucket.ring.try_push(item) {
                Ok(()) => return,
                Err(item) => item,
            }
        } else {
            // Behind items already spilled, to keep the bucket's FIFO order.
            item
        };
        self.spills.fetch_add(1, Ordering::Relaxed);
        bucket.spilled.fetch_add(1, Ordering::SeqCst);
        bucket.spill.push(item);
    }

    /// Takes an item from the first non-empty bucket, with the index of its bucket.
    ///
    /// Not linearizable (section III-C): an item put into a bucket this call already passed is
    /// not seen. Returns `None` only if every bucket was empty when it was visited.
    pub(crate) fn get(&self) -> Option<(T, usize)> {
        for (group_index, group) in self.groups.iter().enumerate() {
            if group.load(Ordering::SeqCst) == 0 {
                continue;
            }
            let first = group_index * self.group_size;
            let last = (first + self.group_size).min(self.buckets.len());
            for bucket_index in first..last {
                let bucket = &self.buckets[bucket_index];
                if bucket.count.load(Ordering::SeqCst) == 0 {
                    continue;
                }
                if let Some(item) = Self::pop_bucket(bucket) {
                    bucket.count.fetch_sub(1, Ordering::SeqCst);
                    group.fetch_sub(1, Ordering::SeqCst);
                    return Some((item, bucket_index));
                }
            }
        }
        None
    }

    /// The head of a bucket: from its ring, or if the ring is empty from its spill queue.
    fn pop_bucket(bucket: &Bucket<R, S>) -> Option<T> {
        if let Some(item) = bucket.ring.pop() {
            return Some(item);
        }
        if bucket.spilled.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let item = bucket.spill.pop()?;
        bucket.spilled.fetch_sub(1, Ordering::SeqCst);
        Some(item)
    }

    /// Whether any item is in the queue or being put (a conservative answer: used by idle workers
    /// to decide not to sleep).
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.groups
            .iter()
            .any(|group| group.load(Ordering::SeqCst) > 0)
    }

    /// Puts that went to a spill queue (and so may have allocated) since construction.
    pub(crate) fn spills(&self) -> u64 {
        self.spills.load(Ordering::Relaxed)
    }
}

/// The baseline of the paper's Figure 7: the same buckets, one lock around all of them.
pub(crate) struct MutexBucketQueue<T> {
    buckets: Mutex<Vec<VecDeque<T>>>,
    /// Items in the queue, kept under the lock but readable without it (for idle workers).
    len: AtomicUsize,
}

impl<T> MutexBucketQueue<T> {
    /// A queue of `bucket_total` (>= 1) buckets.
    pub(crate) fn new(bucket_total: usize) -> Self {
        Self {
            buckets: Mutex::new((0..bucket_total.max(1)).map(|_| VecDeque::new()).collect()),
            len: AtomicUsize::new(0),
        }
    }

    /// Adds `item` to bucket `bucket` (clamped to the last bucket).
    pub(crate) fn put(&self, item: T, bucket: usize) {
        let mut buckets = lock(&self.buckets);
        let bucket = bucket.min(buckets.len() - 1);
        buckets[bucket].push_back(item);
        self.len.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes the head of the first non-empty bucket (linearizable: it holds the lock).
    pub(crate) fn get(&self) -> Option<(T, usize)> {
        let mut buckets = lock(&self.buckets);
        for (index, bucket) in buckets.iter_mut().enumerate() {
            if let Some(item) = bucket.pop_front() {
                self.len.fetch_sub(1, Ordering::SeqCst);
                return Some((item, index));
            }
        }
        None
    }

    /// Whether any item is in the queue.
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.len.load(Ordering::SeqCst) > 0
    }
}

/// The schedulable-task set, by configuration ([`TaskSetKind`](crate::TaskSetKind)).
pub(crate) enum TaskSet<T> {
    /// The lock-free bucket queue.
    LockFree(BucketQueue<T>),
    /// The mutex baseline.
    Mutex(MutexBucketQueue<T>),
}

impl<T: Send> TaskSet<T> {
    /// Adds `item` to bucket `bucket`.
    pub(crate) fn put(&self, item: T, bucket: usize) {
        match self {
            Self::LockFree(queue) => queue.put(item, bucket),
            Self::Mutex(queue) => queue.put(item, bucket),
        }
    }

    /// Takes the item with the most credit (modulo section III-C).
    pub(crate) fn get(&self) -> Option<(T, usize)> {
        match self {
            Self::LockFree(queue) => queue.get(),
            Self::Mutex(queue) => queue.get(),
        }
    }

    /// Whether any item may be in the set.
    pub(crate) fn maybe_nonempty(&self) -> bool {
        match self {
            Self::LockFree(queue) => queue.maybe_nonempty(),
            Self::Mutex(queue) => queue.maybe_nonempty(),
        }
    }

    /// Puts that spilled past a bucket's ring (the lock-free set only).
    pub(crate) fn spills(&self) -> u64 {
        match self {
            Self::LockFree(queue) => queue.spills(),
            Self::Mutex(_) => 0,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn get_takes_the_best_bucket_first_and_fifo_within_a_bucket() {
        let queue: BucketQueue<u32> = BucketQueue::new(101, 11, 4);
        queue.put(1, 50);
        queue.put(2, 7);
        queue.put(3, 100);
        queue.put(4, 7);
        queue.put(5, 500); // clamped to the exhausted bucket
        assert!(queue.maybe_nonempty());
        let order: Vec<_> = std::iter::from_fn(|| queue.get()).collect();
        assert_eq!(order, vec![(2, 7), (4, 7), (1, 50), (3, 100), (5, 100)]);
        assert!(!queue.maybe_nonempty());
    }

    #[test]
    fn a_full_ring_spills_and_the_bucket_stays_fifo() {
        let queue: BucketQueue<u32> = BucketQueue::new(3, 2, 2);
        for item in 1..=3 {
            queue.put(item, 1);
        }
        assert_eq!(queue.spills(), 1);
        assert_eq!(queue.get(), Some((1, 1)));
        // Behind the spilled item, although the ring has room again.
        queue.put(4, 1);
        assert_eq!(queue.spills(), 2);
        let order: Vec<_> = std::iter::from_fn(|| queue.get()).collect();
        assert_eq!(order, vec![(2, 1), (3, 1), (4, 1)]);
        // Drained: puts go to the ring again.
        queue.put(5, 1);
        assert_eq!(queue.spills(), 2);
        assert_eq!(queue.get(), Some((5, 1)));
        assert!(!queue.maybe_nonempty());
    }

    #[test]
    fn mutex_baseline_has_the_same_order() {
        let lock_free: BucketQueue<u32> = BucketQueue::new(13, 4, 1);
        let locked = MutexBucketQueue::new(13);
        for (item, bucket) in [(1, 12), (2, 3), (3, 3), (4, 0), (5, 9)] {
            lock_free.put(item, bucket);
            locked.put(item, bucket);
        }
        let a: Vec<_> = std::iter::from_fn(|| lock_free.get()).collect();
        let b: Vec<_> = std::iter::from_fn(|| locked.get()).collect();
        assert_eq!(a, b);
        assert!(!locked.maybe_nonempty());
    }

    #[test]
    fn concurrent_puts_and_gets_lose_and_duplicate_nothing() {
        let queue: BucketQueue<u64> = BucketQueue::new(101, 11, 2);
        let threads = 4;
        let per_thread = 20_000u64;
        let taken = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for t in 0..threads {
                let queue = &queue;
                let taken = &taken;
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..per_thread {
                        let item = t * per_thread + i;
                        queue.put(item, (item % 101) as usize);
                        // Like a scheduler thread: get one back after each put.
                        if let Some((got, bucket)) = queue.get() {
                            assert_eq!(bucket, (got % 101) as usize);
                            mine.push(got);
                        }
                    }
                    taken.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
                });
            }
        });
        let mut all = taken.into_inner().unwrap_or_else(|e| e.into_inner());
        all.extend(std::iter::from_fn(|| queue.get().map(|(item, _)| item)));
        all.sort_unstable();
        let expected: Vec<u64> = (0..threads * per_thread).collect();
        assert_eq!(all, expected);
    }
}
