//! The invariant of section III-D, checked on recorded histories of the priority queue.
//!
//! The queue is not linearizable (section III-C): a `get` may miss an element put into a bucket
//! it already passed. What it guarantees instead: if a get returned an element of *lower*
//! priority than a later-completing get, then the later element's put must have completed after
//! the earlier get started. Formally, with gets `H` ordered by completion,
//!
//! ```text
//! for all g: g.end > g.put.start
//! for all i < j: H[i].prio < H[j].prio  =>  H[i].start < H[j].put.end
//! ```
//!
//! Times are any totally ordered stamps. For the check to be meaningful, an operation's `end`
//! must be stamped at its linearization point (the FIFO push or pop), not merely "some time
//! after" it: a thread delayed between its pop and its return would otherwise make any
//! implementation look wrong.

use thiserror::Error;

/// One completed put: `element` with priority `prio` (larger = more credit = served first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutRecord {
    /// Identity of the element.
    pub element: u64,
    /// Priority of the element (larger is served first).
    pub prio: i64,
    /// Stamp taken when the put started.
    pub start: u64,
    /// Stamp taken when the put completed (when the element became visible).
    pub end: u64,
}

/// One completed get that returned the element of `puts[put]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetRecord {
    /// Index of the put whose element was returned.
    pub put: usize,
    /// Stamp taken when the get started.
    pub start: u64,
    /// Stamp taken when the get took the element.
    pub end: u64,
}

/// A history that breaks the section III-D invariant (or is malformed).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HistoryViolation {
    /// A get refers to a put that does not exist.
    #[error("get {get} refers to missing put {put}")]
    UnknownPut {
        /// Index of the get (in the input order).
        get: usize,
        /// The put index it named.
        put: usize,
    },
    /// Two gets returned the same put's element (a duplicated task).
    #[error("element of put {put} was returned twice")]
    Duplicate {
        /// The put index.
        put: usize,
    },
    /// A get completed before the put of its element started.
    #[error("get {get} ended before put {put} started")]
    GetBeforePut {
        /// Index of the get.
        get: usize,
        /// Index of the put.
        put: usize,
    },
    /// `H[earlier].prio < H[later].prio` but the later element's put completed before the earlier
    /// get started.
    #[error(
        "get {earlier} (prio {earlier_prio}) started at {earlier_start}, after put of the \
         higher-priority element later taken by get {later} (prio {later_prio}) ended at {put_end}"
    )]
    PriorityInversion {
        /// Index of the earlier-completing get.
        earlier: usize,
        /// Its element's priority.
        earlier_prio: i64,
        /// When it started.
        earlier_start: u64,
        /// Index of the later-completing get.
        later: usize,
        /// Its element's priority.
        later_prio: i64,
        /// When the put of its element completed.
        put_end: u64,
    },
}

/// Checks a history against the section III-D invariant in `O(n log n)`.
pub fn check_history(puts: &[PutRecord], gets: &[GetRecord]) -> Result<(), HistoryViolation> {
    let mut taken = vec![false; puts.len()];
    for (index, get) in gets.iter().enumerate() {
        let Some(put) = puts.get(get.put) else {
            return Err(HistoryViolation::UnknownPut {
                get: index,
                put: get.put,
            });
        };
        if std::mem::replace(&mut taken[get.put], true) {
            return Err(HistoryViolation::Duplicate { put: get.put });
        }
        if get.end <= put.start {
            return Err(HistoryViolation::GetBeforePut {
                get: index,
                put: get.put,
            });
        }
    }
    // Distinct priorities, ascending, to index a prefix-maximum (Fenwick) tree by rank.
    let mut prios: Vec<i64> = gets.iter().map(|g| puts[g.put].prio).collect();
    prios.sort_unstable();
    prios.dedup();
    let rank = |prio: i64| prios.partition_point(|&p| p < prio);
    let mut order: Vec<usize> = (0..gets.len()).collect();
    order.sort_by_key(|&i| gets[i].end);
    // best[k]: the (start, get) with the latest start among gets so far with prio rank < k+1.
    let mut tree: Vec<Option<(u64, usize)>> = vec![None; prios.len() + 1];
    for &j in &order {
        let later = gets[j];
        let later_put = puts[later.put];
        let r = rank(later_put.prio);
        // Latest start among earlier gets with strictly lower priority (ranks 0..r).
        let mut k = r;
        let mut latest: Option<(u64, usize)> = None;
        while k > 0 {
            if let Some(candidate) = tree[k] {
                if latest.is_none_or(|(start, _)| candidate.0 > start) {
                    latest = Some(candidate);
                }
            }
            k &= k - 1;
        }
        if let Some((earlier_start, earlier)) = latest {
            if earlier_start >= later_put.end {
                return Err(HistoryViolation::PriorityInversion {
                    earlier,
                    earlier_prio: puts[gets[earlier].put].prio,
                    earlier_start,
                    later: j,
                    later_prio: later_put.prio,
                    put_end: later_put.end,
                });
            }
        }
        let mut k = r + 1;
        while k < tree.len() {
            if tree[k].is_none_or(|(start, _)| later.start > start) {
                tree[k] = Some((later.start, j));
            }
            k += k & k.wrapping_neg();
        }
    }
    Ok(())
}

/// Recording FIFOs for the tests: they stamp pushes and pops inside their critical section, i.e.
/// at the linearization point, from one global logical clock.
#[cfg(any(test, loom))]
pub(crate) mod recording {
    use crate::fifo::{Fifo, NewFifo, RingFifo};
    use crate::sync::{lock, AtomicU64, Mutex, Ordering};
    use std::collections::VecDeque;

    // Under loom the clock is a loom atomic (reset for every execution), so that "this put's
    // stamp is below that get's stamp" is a happens-before edge loom knows about, exactly as the
    // real-time order it stands for.
    #[cfg(loom)]
    loom::lazy_static! {
        static ref LOGICAL_CLOCK: AtomicU64 = AtomicU64::new(1);
    }
    #[cfg(not(loom))]
    static LOGICAL_CLOCK: AtomicU64 = AtomicU64::new(1);

    /// The next stamp of the global logical clock.
    pub(crate) fn stamp() -> u64 {
        LOGICAL_CLOCK.fetch_add(1, Ordering::SeqCst)
    }

    /// An element that remembers when it was pushed and popped.
    #[derive(Debug)]
    pub(crate) struct Stamped {
        pub(crate) element: u64,
        pub(crate) pushed_at: u64,
        pub(crate) popped_at: u64,
    }

    impl Stamped {
        pub(crate) fn new(element: u64) -> Self {
            Self {
                element,
                pushed_at: 0,
                popped_at: 0,
            }
        }
    }

    /// A linearizable FIFO that stamps its elements at the linearization points; bounded when
    /// used as a bucket ring, unbounded as a spill queue.
    pub(crate) struct RecordingFifo {
        items: Mutex<VecDeque<Stamped>>,
        capacity: usize,
    }

    impl RecordingFifo {
        fn pop_stamped(&self) -> Option<Stamped> {
            let mut items = lock(&self.items);
            let mut item = items.pop_front()?;
            item.popped_at = stamp();
            Some(item)
        }
    }

    impl Fifo<Stamped> for RecordingFifo {
        fn push(&self, item: Stamped) {
            if self.try_push(item).is_err() {
                panic!("recording FIFO overflow");
            }
        }
        fn pop(&self) -> Option<Stamped> {
            self.pop_stamped()
        }
    }

    impl NewFifo<Stamped> for RecordingFifo {
        fn new_fifo() -> Self {
            RingFifo::with_capacity(usize::MAX)
        }
    }

    impl RingFifo<Stamped> for RecordingFifo {
        fn with_capacity(capacity: usize) -> Self {
            Self {
                items: Mutex::new(VecDeque::new()),
                capacity,
            }
        }
        fn try_push(&self, mut item: Stamped) -> Result<(), Stamped> {
            let mut items = lock(&self.items);
            if items.len() >= self.capacity {
                return Err(item);
            }
            item.pushed_at = stamp();
            items.push_back(item);
            Ok(())
        }
        fn pop(&self) -> Option<Stamped> {
            self.pop_stamped()
        }
        fn len(&self) -> usize {
            lock(&self.items).len()
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::recording::{stamp, RecordingFifo, Stamped};
    use super::*;
    use crate::bucket::BucketQueue;

    fn put(element: u64, prio: i64, start: u64, end: u64) -> PutRecord {
        PutRecord {
            element,
            prio,
            start,
            end,
        }
    }

    #[test]
    fn papers_counter_example_is_accepted_but_a_true_inversion_is_not() {
        // Section III-C: Get()A; Put(x)B; Ok()B; Put(y)B; Ok()B; Ok(y)A; Get()C; Ok(x)C, with x of
        // higher priority: not linearizable, but it satisfies the invariant.
        let puts = [put(1, 10, 2, 3), put(2, 1, 4, 5)];
        let gets = [
            GetRecord {
                put: 1,
                start: 1,
                end: 6,
            },
            GetRecord {
                put: 0,
                start: 7,
                end: 8,
            },
        ];
        assert_eq!(check_history(&puts, &gets), Ok(()));
        // The same, except that A's get started after x was in the queue: A should have seen it.
        let gets = [
            GetRecord {
                put: 1,
                start: 4,
                end: 6,
            },
            GetRecord {
                put: 0,
                start: 7,
                end: 8,
            },
        ];
        assert!(matches!(
            check_history(&puts, &gets),
            Err(HistoryViolation::PriorityInversion {
                earlier: 0,
                later: 1,
                ..
            })
        ));
    }

    #[test]
    fn malformed_histories_are_rejected() {
        let puts = [put(1, 1, 5, 6)];
        let dup = [
            GetRecord {
                put: 0,
                start: 7,
                end: 8,
            },
            GetRecord {
                put: 0,
                start: 9,
                end: 10,
            },
        ];
        assert_eq!(
            check_history(&puts, &dup),
            Err(HistoryViolation::Duplicate { put: 0 })
        );
        let early = [GetRecord {
            put: 0,
            start: 1,
            end: 4,
        }];
        assert_eq!(
            check_history(&puts, &early),
            Err(HistoryViolation::GetBeforePut { get: 0, put: 0 })
        );
        let missing = [GetRecord {
            put: 3,
            start: 1,
            end: 9,
        }];
        assert_eq!(
            check_history(&puts, &missing),
            Err(HistoryViolation::UnknownPut { get: 0, put: 3 })
        );
    }

    /// Every pair, the slow way, to cross-check the Fenwick version.
    fn check_quadratic(puts: &[PutRecord], gets: &[GetRecord]) -> bool {
        let mut order: Vec<usize> = (0..gets.len()).collect();
        order.sort_by_key(|&i| gets[i].end);
        for (a, &i) in order.iter().enumerate() {
            for &j in &order[a + 1..] {
                let (gi, gj) = (gets[i], gets[j]);
                if puts[gi.put].prio < puts[gj.put].prio && gi.start >= puts[gj.put].end {
                    return false;
                }
            }
        }
        true
    }

    #[test]
    fn fenwick_check_agrees_with_the_quadratic_one() {
        let mut rng = fastrand_like(7);
        for _ in 0..2000 {
            let n = (rng() % 6 + 1) as usize;
            let puts: Vec<_> = (0..n)
                .map(|i| {
                    let start = rng() % 20;
                    put(i as u64, (rng() % 4) as i64, start, start + 1 + rng() % 5)
                })
                .collect();
            let gets: Vec<_> = (0..n)
                .map(|i| {
                    let start = rng() % 30;
                    GetRecord {
                        put: i,
                        start,
                        end: puts[i].start.max(start) + 1 + rng() % 5,
                    }
                })
                .collect();
            let fast = check_history(&puts, &gets).is_ok();
            assert_eq!(fast, check_quadratic(&puts, &gets), "{puts:?} {gets:?}");
        }
    }

    /// A tiny deterministic xorshift, so this module needs no RNG dependency.
    fn fastrand_like(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    type Queue = BucketQueue<Stamped, RecordingFifo, RecordingFifo>;

    /// Real threads use the real bucket-queue code (with recording FIFOs) the way scheduler
    /// threads do: get a task, put it back with a new priority. The recorded history must satisfy
    /// the invariant, and no element may be lost or duplicated.
    #[test]
    fn recorded_concurrent_histories_satisfy_the_invariant() {
        const THREADS: u64 = 4;
        const ELEMENTS_PER_THREAD: u64 = 8;
        const ROUNDS: u64 = 3_000;
        let buckets = 21;
        // Rings of 2: with 32 elements over 21 buckets, puts also spill (and come back).
        let queue: Queue = BucketQueue::new(buckets, 5, 2);
        let prio_of = |bucket: usize| (buckets - bucket) as i64;
        let logs = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (queue, logs) = (&queue, &logs);
                scope.spawn(move || {
                    let mut rng = fastrand_like(t + 1);
                    // (element, bucket, put start) of our puts; (get start, element, bucket,
                    // pushed_at, popped_at) of our gets.
                    let mut puts = Vec::new();
                    let mut gets = Vec::new();
                    let mut next = t * 1_000_000;
                    let mut put_one = |queue: &Queue, puts: &mut Vec<(u64, usize, u64)>| {
                        let bucket = (rng() % buckets as u64) as usize;
                        let start = stamp();
                        queue.put(Stamped::new(next), bucket);
                        puts.push((next, bucket, start));
                        next += 1;
                    };
                    for _ in 0..ELEMENTS_PER_THREAD {
                        put_one(queue, &mut puts);
                    }
                    for _ in 0..ROUNDS {
                        let start = stamp();
                        if let Some((item, bucket)) = queue.get() {
                            gets.push((
                                start,
                                item.element,
                                bucket,
                                item.pushed_at,
                                item.popped_at,
                            ));
                            // Re-insert as a new put (a task returning with less credit).
                            put_one(queue, &mut puts);
                        }
                    }
                    logs.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((puts, gets));
                });
            }
        });
        // Drain what is left, single-threaded.
        let mut tail = Vec::new();
        loop {
            let start = stamp();
            let Some((item, bucket)) = queue.get() else {
                break;
            };
            tail.push((start, item.element, bucket, item.pushed_at, item.popped_at));
        }
        assert!(queue.spills() > 0, "the spill path was exercised");
        let mut logs = logs.into_inner().unwrap_or_else(|e| e.into_inner());
        logs.push((Vec::new(), tail));
        // Assemble: each element id is put exactly once, so it identifies its put.
        let mut puts = Vec::new();
        let mut index_of = std::collections::HashMap::new();
        let mut pushed_at = std::collections::HashMap::new();
        for (_, gets) in &logs {
            for &(_, element, _, pushed, _) in gets {
                pushed_at.insert(element, pushed);
            }
        }
        for (log_puts, _) in &logs {
            for &(element, bucket, start) in log_puts {
                let end = pushed_at.get(&element).copied();
                let Some(end) = end else {
                    panic!("element {element} was put but never got back")
                };
                index_of.insert(element, puts.len());
                puts.push(put(element, prio_of(bucket), start, end));
            }
        }
        let mut gets = Vec::new();
        for (_, log_gets) in &logs {
            for &(start, element, _, _, popped) in log_gets {
                gets.push(GetRecord {
                    put: index_of[&element],
                    start,
                    end: popped,
                });
            }
        }
        assert_eq!(gets.len(), puts.len(), "every element is got exactly once");
        assert!(
            gets.len() as u64 > THREADS * ROUNDS / 2,
            "the threads made progress"
        );
        assert_eq!(check_history(&puts, &gets), Ok(()));
    }
}
