//! The queue between a subscription's delivery worker and the application thread that reads it.
//!
//! Unbounded underneath (the subscription bounds it by waiting for room, see
//! `SubscribeBuilder::subscribe`), with storage that follows use: a crossbeam list channel
//! allocated a block every 31 messages, which made every message read through an iterator cost
//! an allocation share, and a bounded array channel would hold its full capacity for every
//! subscribed topic. Here, as in the scheduler's task queues (ADR 14), two deques behind
//! mutexes: the worker pushes to one, the reader pops from the other and swaps them when its
//! own is empty, so the two meet on a lock once per batch, and nothing is allocated once the
//! deques have grown to the largest batch; a check every [`SHRINK_CHECK_POPS`] pops gives
//! storage back when less than a quarter of it was used.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tidings_runtime::Unread;

/// Pops between two looks at whether the queue holds far more storage than it used.
const SHRINK_CHECK_POPS: usize = 4096;
/// Slots kept however little the queue is used.
const SLOTS_KEPT: usize = 32;

/// What the worker side shares with the reader.
struct Pushed<T> {
    items: VecDeque<T>,
    /// The sender was dropped: after what is queued, the reader gets the end.
    closed: bool,
    /// The receiver was dropped: pushes are refused.
    abandoned: bool,
    /// A reader waits on `Shared::readable`.
    reader_waiting: bool,
    /// An async reader waits: woken by the next send or the end.
    waker: Option<Waker>,
}

/// The reader's side.
struct Taken<T> {
    items: VecDeque<T>,
    /// Most items taken at once since the last shrink check.
    peak: usize,
    /// Pops since the last shrink check.
    pops: usize,
}

struct Shared<T> {
    /// Lock order: `taken` before `pushed`. A reader waits for items holding `taken`, so
    /// nothing the writer calls may take it.
    taken: Mutex<Taken<T>>,
    pushed: Mutex<Pushed<T>>,
    readable: Condvar,
    /// Items queued and not yet taken.
    queued: AtomicUsize,
    /// Told of every item taken: the runtime's count of what the reader has not read.
    on_take: OnceLock<Arc<Unread>>,
}

/// A poisoned lock only means a panic elsewhere while it was held; the deques stay valid.
fn lock<U>(m: &Mutex<U>) -> MutexGuard<'_, U> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new queue: its sending and receiving halves.
pub(crate) fn queue<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        taken: Mutex::new(Taken {
            items: VecDeque::new(),
            peak: 0,
            pops: 0,
        }),
        pushed: Mutex::new(Pushed {
            items: VecDeque::new(),
            closed: false,
            abandoned: false,
            reader_waiting: false,
            waker: None,
        }),
        readable: Condvar::new(),
        queued: AtomicUsize::new(0),
        on_take: OnceLock::new(),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver {
            alive: Arc::new(Alive(shared)),
        },
    )
}

/// The worker's half. Dropping it ends the reader's stream after what is queued.
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `item`; hands it back if the receiver is gone.
    pub(crate) fn send(&self, item: T) -> Result<(), T> {
        let mut pushed = lock(&self.shared.pushed);
        if pushed.abandoned {
            return Err(item);
        }
        pushed.items.push_back(item);
        self.shared.queued.fetch_add(1, Ordering::Release);
        self.wake_reader(pushed);
        Ok(())
    }

    /// After a push: lets `pushed` go, then wakes a reader that found both deques empty and
    /// waits (a system call, so only then) or a task that polled.
    fn wake_reader(&self, mut pushed: MutexGuard<'_, Pushed<T>>) {
        let wake = pushed.reader_waiting;
        let waker = pushed.waker.take();
        drop(pushed);
        if wake {
            self.shared.readable.notify_one();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Queues every item of `items`, in order, under one lock, leaving `items` empty (its
    /// storage kept for the next batch); `Err(())` if the receiver is gone (the items are then
    /// dropped).
    pub(crate) fn send_many(&self, items: &mut Vec<T>) -> Result<(), ()> {
        if items.is_empty() {
            return Ok(());
        }
        let mut pushed = lock(&self.shared.pushed);
        if pushed.abandoned {
            drop(pushed);
            items.clear();
            return Err(());
        }
        let n = items.len();
        pushed.items.extend(items.drain(..));
        self.shared.queued.fetch_add(n, Ordering::Release);
        self.wake_reader(pushed);
        Ok(())
    }

    /// Items queued and not yet taken.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut pushed = lock(&self.shared.pushed);
            pushed.closed = true;
            pushed.waker.take()
        };
        self.shared.readable.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Why nothing was received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoItem {
    /// Nothing came within the timeout.
    Timeout,
    /// Nothing is queued (from `try_recv`).
    Empty,
    /// The sender is gone and nothing is queued.
    Closed,
}

/// How long a reader waits for an item when none is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not at all: `NoItem::Empty`.
    No,
    /// Until the deadline: `NoItem::Timeout`.
    Until(Instant),
    /// As long as it takes.
    Forever,
}

impl Wait {
    /// Until `deadline`, or as long as it takes without one.
    pub(crate) fn until(deadline: Option<Instant>) -> Wait {
        deadline.map_or(Wait::Forever, Wait::Until)
    }
}

/// The reader's half; clones read the same queue. Dropping the last clone makes later sends
/// fail (and drops what is queued).
pub(crate) struct Receiver<T> {
    alive: Arc<Alive<T>>,
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            alive: Arc::clone(&self.alive),
        }
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("queued", &self.len())
            .finish_non_exhaustive()
    }
}

/// Held by every clone of a [`Receiver`]; dropped with the last.
struct Alive<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    fn shared(&self) -> &Shared<T> {
        &self.alive.0
    }

    /// The next item, waiting until `deadline` (`None`: as long as it takes).
    pub(crate) fn recv_until(&self, deadline: Option<Instant>) -> Result<T, NoItem> {
        self.recv_waiting(Wait::until(deadline))
    }

    /// The next item if one is queued: `Err(Empty)` if none is, `Err(Closed)` once the sender
    /// is gone and the queue is empty.
    pub(crate) fn try_recv(&self) -> Result<T, NoItem> {
        self.recv_waiting(Wait::No)
    }

    fn recv_waiting(&self, wait: Wait) -> Result<T, NoItem> {
        let shared = self.shared();
        let mut taken = lock(&shared.taken);
        if let Some(item) = pop(&mut taken, shared) {
            return Ok(item);
        }
        refill(&mut taken, shared, wait)?;
        pop(&mut taken, shared).ok_or(NoItem::Closed)
    }

    /// Takes up to `max` items, in order, handing each to `put`, with one synchronisation
    /// with the writer for the lot (two when the reader's own deque runs dry before `max`):
    /// waits as `wait` says only while none is queued. An item for which `alone` is true is
    /// taken only as the first of a call, and ends it: the items before it come out in one
    /// call, it in the next. How many were taken (0 only for `max == 0`), or why none were.
    pub(crate) fn recv_many(
        &self,
        max: usize,
        wait: Wait,
        alone: impl Fn(&T) -> bool,
        mut put: impl FnMut(T),
    ) -> Result<usize, NoItem> {
        if max == 0 {
            return Ok(0);
        }
        let shared = self.shared();
        let mut taken = lock(&shared.taken);
        let mut swapped = false;
        if taken.items.is_empty() {
            refill(&mut taken, shared, wait)?;
            swapped = true;
        }
        let mut n = 0;
        'taking: loop {
            while n < max {
                let single = match taken.items.front() {
                    Some(item) => alone(item),
                    None => break,
                };
                if single && n > 0 {
                    break 'taking;
                }
                let Some(item) = taken.items.pop_front() else {
                    break;
                };
                put(item);
                n += 1;
                if single {
                    break 'taking;
                }
            }
            if n == max || swapped {
                break;
            }
            // The reader's deque ran dry first: what the writer queued meanwhile, without
            // waiting.
            let mut pushed = lock(&shared.pushed);
            if pushed.items.is_empty() {
                break;
            }
            std::mem::swap(&mut taken.items, &mut pushed.items);
            drop(pushed);
            taken.peak = taken.peak.max(taken.items.len());
            swapped = true;
        }
        took(&mut taken, shared, n);
        Ok(n)
    }

    /// The next item for an async reader: `Pending` (the task is woken by the next send or the
    /// end) while none is queued, `Err(Closed)` once the sender is gone and the queue is empty.
    pub(crate) fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<T, NoItem>> {
        let shared = self.shared();
        let mut taken = lock(&shared.taken);
        if let Some(item) = pop(&mut taken, shared) {
            return Poll::Ready(Ok(item));
        }
        let mut pushed = lock(&shared.pushed);
        if !pushed.items.is_empty() {
            std::mem::swap(&mut taken.items, &mut pushed.items);
            drop(pushed);
            taken.peak = taken.peak.max(taken.items.len());
            return Poll::Ready(pop(&mut taken, shared).ok_or(NoItem::Closed));
        }
        if pushed.closed {
            return Poll::Ready(Err(NoItem::Closed));
        }
        // Registered under the lock a send takes: no send can slip between the look and this.
        match &mut pushed.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Items queued and not yet taken.
    pub(crate) fn len(&self) -> usize {
        self.shared().queued.load(Ordering::Acquire)
    }

    /// Tells `unread` of every item taken from now on (set once; later calls are ignored).
    pub(crate) fn count_takes_in(&self, unread: Arc<Unread>) {
        let _ = self.shared().on_take.set(unread);
    }

    /// The items as they come, until the sender is gone and the queue is empty.
    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.recv_until(None).ok())
    }
}

impl<T> Drop for Alive<T> {
    fn drop(&mut self) {
        // Taken out under the locks, dropped after them (an item's drop may take time).
        let (a, b) = {
            let mut taken = lock(&self.0.taken);
            let mut pushed = lock(&self.0.pushed);
            pushed.abandoned = true;
            self.0.queued.store(0, Ordering::Release);
            (
                std::mem::take(&mut taken.items),
                std::mem::take(&mut pushed.items),
            )
        };
        drop((a, b));
    }
}

/// Swaps the writer's deque in when the reader's is empty: returns once the reader's holds an
/// item, waiting for one as `wait` says; `Err(Closed)` once the sender is gone and nothing is
/// queued.
#[allow(clippy::disallowed_methods)] // the wait is the application's, in wall time
fn refill<T>(taken: &mut Taken<T>, shared: &Shared<T>, wait: Wait) -> Result<(), NoItem> {
    let mut pushed = lock(&shared.pushed);
    loop {
        if !pushed.items.is_empty() {
            std::mem::swap(&mut taken.items, &mut pushed.items);
            drop(pushed);
            taken.peak = taken.peak.max(taken.items.len());
            return Ok(());
        }
        if pushed.closed {
            return Err(NoItem::Closed);
        }
        pushed.reader_waiting = true;
        pushed = match wait {
            Wait::No => {
                pushed.reader_waiting = false;
                return Err(NoItem::Empty);
            }
            Wait::Forever => shared
                .readable
                .wait(pushed)
                .unwrap_or_else(PoisonError::into_inner),
            Wait::Until(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left == Duration::ZERO {
                    pushed.reader_waiting = false;
                    return Err(NoItem::Timeout);
                }
                shared
                    .readable
                    .wait_timeout(pushed, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        pushed.reader_waiting = false;
    }
}

/// Pops from the reader's deque (see [`took`]).
fn pop<T>(taken: &mut Taken<T>, shared: &Shared<T>) -> Option<T> {
    let item = taken.items.pop_front()?;
    took(taken, shared, 1);
    Some(item)
}

/// Counts `n` items taken from the reader's deque (the queue's length and the runtime's
/// [`Unread`], once for the lot); every [`SHRINK_CHECK_POPS`] items, once the deque is empty,
/// shrinks it if it held less than a quarter of its storage since the last check (the storage
/// then goes to the writer at the next swap, so both deques get looked at in turn).
fn took<T>(taken: &mut Taken<T>, shared: &Shared<T>, n: usize) {
    if n == 0 {
        return;
    }
    shared.queued.fetch_sub(n, Ordering::Release);
    if let Some(unread) = shared.on_take.get() {
        unread.taken(n);
    }
    taken.pops += n;
    if taken.items.is_empty() && taken.pops >= SHRINK_CHECK_POPS {
        let wanted = (taken.peak * 2).max(SLOTS_KEPT);
        if taken.items.capacity() > 2 * wanted {
            taken.items.shrink_to(wanted);
        }
        taken.pops = 0;
        taken.peak = 0;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::disallowed_methods)]

    use super::*;

    #[test]
    fn items_come_out_in_order_across_swaps() {
        let (tx, rx) = queue();
        for round in 0..5 {
            for i in 0..7 {
                tx.send(round * 10 + i).unwrap();
            }
            assert_eq!(rx.len(), 7);
            for i in 0..7 {
                assert_eq!(rx.try_recv(), Ok(round * 10 + i));
            }
            assert_eq!(rx.try_recv(), Err(NoItem::Empty));
        }
    }

    #[test]
    fn a_waiting_reader_is_woken_by_a_send_and_a_timeout_ends_the_wait() {
        let (tx, rx) = queue();
        let deadline = Instant::now() + Duration::from_millis(30);
        assert_eq!(rx.recv_until(Some(deadline)), Err(NoItem::Timeout));
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(7).unwrap();
            tx
        });
        assert_eq!(rx.recv_until(None), Ok(7));
        drop(sender.join().unwrap());
        // The sender is gone and nothing is queued: the end.
        assert_eq!(rx.recv_until(None), Err(NoItem::Closed));
    }

    #[test]
    fn the_writer_sees_the_length_while_a_reader_waits() {
        let (tx, rx) = queue::<u32>();
        let reader = std::thread::spawn(move || rx.recv_until(None));
        std::thread::sleep(Duration::from_millis(20));
        // The reader waits holding its own lock: the length must not need it.
        assert_eq!(tx.len(), 0);
        tx.send(5).unwrap();
        assert_eq!(reader.join().unwrap(), Ok(5));
        assert_eq!(tx.len(), 0);
    }

    #[test]
    fn what_was_queued_before_the_sender_left_is_still_read() {
        let (tx, rx) = queue();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        assert_eq!(rx.recv_until(None), Ok(1));
        assert_eq!(rx.recv_until(None), Ok(2));
        assert_eq!(rx.recv_until(None), Err(NoItem::Closed));
    }

    #[test]
    fn sends_fail_once_the_last_receiver_is_gone() {
        let (tx, rx) = queue();
        tx.send(1).unwrap();
        let clone = rx.clone();
        drop(rx);
        tx.send(2).unwrap();
        assert_eq!(clone.try_recv(), Ok(1));
        drop(clone);
        assert_eq!(tx.send(3), Err(3));
        assert_eq!(tx.len(), 0);
    }

    #[test]
    fn an_async_reader_is_woken_by_a_send_and_by_the_end() {
        let (tx, rx) = queue();
        let reader = std::thread::spawn(move || {
            let first = pollster::block_on(std::future::poll_fn(|cx| rx.poll_recv(cx)));
            let second = pollster::block_on(std::future::poll_fn(|cx| rx.poll_recv(cx)));
            (first, second)
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send(9).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(tx);
        assert_eq!(reader.join().unwrap(), (Ok(9), Err(NoItem::Closed)));
    }

    #[test]
    fn try_recv_tells_an_empty_queue_from_an_ended_one() {
        let (tx, rx) = queue();
        assert_eq!(rx.try_recv(), Err(NoItem::Empty));
        tx.send(1).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.try_recv(), Err(NoItem::Closed));
    }

    /// Takes up to `max` into `out` (items below 0 stand alone, as errors do).
    fn many(
        rx: &Receiver<i32>,
        max: usize,
        wait: Wait,
        out: &mut Vec<i32>,
    ) -> Result<usize, NoItem> {
        rx.recv_many(max, wait, |&i| i < 0, |i| out.push(i))
    }

    #[test]
    fn recv_many_takes_up_to_max_in_order_across_both_deques() {
        let (tx, rx) = queue();
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(many(&rx, 3, Wait::No, &mut out), Ok(3));
        assert_eq!(out, [0, 1, 2]);
        // Two left on the reader's side, three more on the writer's: one call takes all five.
        let mut more = vec![5, 6, 7];
        tx.send_many(&mut more).unwrap();
        assert!(more.is_empty());
        assert_eq!(rx.len(), 5);
        out.clear();
        assert_eq!(many(&rx, 100, Wait::No, &mut out), Ok(5));
        assert_eq!(out, [3, 4, 5, 6, 7]);
        assert_eq!(rx.len(), 0);
        assert_eq!(many(&rx, 100, Wait::No, &mut out), Err(NoItem::Empty));
        assert_eq!(many(&rx, 0, Wait::Forever, &mut out), Ok(0));
        let deadline = Instant::now() + Duration::from_millis(20);
        assert_eq!(
            many(&rx, 10, Wait::Until(deadline), &mut out),
            Err(NoItem::Timeout)
        );
    }

    #[test]
    fn an_item_that_stands_alone_ends_a_batch_and_comes_in_the_next_call() {
        let (tx, rx) = queue();
        let mut items = vec![1, 2, -1, 3];
        tx.send_many(&mut items).unwrap();
        drop(tx);
        let mut out = Vec::new();
        assert_eq!(many(&rx, 10, Wait::Forever, &mut out), Ok(2));
        assert_eq!(out, [1, 2]);
        out.clear();
        assert_eq!(many(&rx, 10, Wait::Forever, &mut out), Ok(1));
        assert_eq!(out, [-1]);
        out.clear();
        assert_eq!(many(&rx, 10, Wait::Forever, &mut out), Ok(1));
        assert_eq!(out, [3]);
        assert_eq!(many(&rx, 10, Wait::Forever, &mut out), Err(NoItem::Closed));
    }

    #[test]
    fn a_waiting_recv_many_is_woken_by_a_batch_and_takes_all_of_it() {
        let (tx, rx) = queue();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let n = many(&rx, 100, Wait::Forever, &mut out);
            (n, out)
        });
        std::thread::sleep(Duration::from_millis(20));
        let mut items: Vec<i32> = (0..10).collect();
        tx.send_many(&mut items).unwrap();
        let (n, out) = reader.join().unwrap();
        assert_eq!(n, Ok(10));
        assert_eq!(out, (0..10).collect::<Vec<_>>());
        drop(rx_gone_check(tx));
    }

    /// A batch sent once the receiver is gone is refused and dropped.
    fn rx_gone_check(tx: Sender<i32>) -> Sender<i32> {
        let mut items = vec![1, 2];
        assert_eq!(tx.send_many(&mut items), Err(()));
        assert!(items.is_empty());
        tx
    }

    #[test]
    fn storage_is_given_back_after_a_burst() {
        let (tx, rx) = queue();
        for i in 0..4000 {
            tx.send(i).unwrap();
        }
        for i in 0..4000 {
            assert_eq!(rx.try_recv(), Ok(i));
        }
        for i in 0..3 * SHRINK_CHECK_POPS {
            tx.send(i).unwrap();
            assert_eq!(rx.try_recv(), Ok(i));
        }
        let shared = rx.shared();
        let slots = lock(&shared.taken).items.capacity() + lock(&shared.pushed).items.capacity();
        assert!(
            slots <= 4 * SLOTS_KEPT,
            "kept {slots} slots after a trickle"
        );
    }
}
