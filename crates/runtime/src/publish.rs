//! Publishing from application threads: a bounded lock-free request queue per publisher whose
//! storage follows use, drained by the core thread, which looks only at publishers that queued
//! something (a ready list), and per-publisher stability tracking that publish handles wait on.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::CachePadded;
use tidings_proto::{MsgId, TopicId};
use tidings_sched::handoff::{ring_chain, ChainConsumer, ChainProducer, ReadyFlag};

use crate::core::CoreShared;

/// Longest single park of a waiting application thread. Wake-ups are exact (the core thread
/// unparks waiters), so this only bounds the damage of a missed one.
const PARK_SLICE: Duration = Duration::from_millis(100);

/// One message handed to the core thread.
#[derive(Debug)]
pub(crate) struct PublishRequest {
    pub(crate) topic: TopicId,
    pub(crate) payload: Bytes,
}

/// What a publisher shares with the core thread.
#[derive(Debug)]
pub(crate) struct PublisherShared {
    /// Identity of the publisher, so that a handle is only waited on where it was issued.
    pub(crate) id: u64,
    /// Set while the publisher is on the core's ready list or being served (see
    /// [`tidings_sched::handoff::ReadyList`]), with its slot in the core's table.
    pub(crate) ready: ReadyFlag,
    /// Every message of this publisher up to this ticket (its position, from 1) is stable.
    pub(crate) stable_upto: AtomicU64,
    /// The publisher thread is parked (or about to park) waiting for room or stability.
    pub(crate) waiting: AtomicBool,
    /// Wakes the publisher thread.
    pub(crate) unparker: Unparker,
    /// Wakes the publisher's task when it waits in `publish_async` or `wait_stable_async`.
    pub(crate) async_waker: AtomicWaker,
    /// The `Publisher` was dropped: the core thread forgets it once its messages are stable.
    pub(crate) dropped: AtomicBool,
}

impl PublisherShared {
    /// Wakes the publisher if it waits (called by the core thread after making room or progress).
    pub(crate) fn wake(&self) {
        // Pairs with the fence in `Publisher::park`: either the publisher sees the change that
        // preceded this call, or this sees its `waiting` flag.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::AcqRel) {
            self.unparker.unpark();
            self.async_waker.wake();
        }
    }
}

/// What a queued request counts against the node-wide bound besides its payload: its slot
/// in the queue and the payload's shared header, about.
pub(crate) const REQUEST_OVERHEAD_BYTES: usize = 64;

/// The bytes a queued request of `payload_len` bytes counts against the node-wide bound.
pub(crate) fn request_cost(payload_len: usize) -> usize {
    payload_len + REQUEST_OVERHEAD_BYTES
}

/// The node-wide bound on the requests all publishers have queued and the core thread has not
/// yet handed to the protocol (`RuntimeConfig::publish_queued_node_bytes_max`, ADR 25).
///
/// Each publisher's queue has its own bound, but a node with thousands of publishers could
/// queue thousands of those (ten thousand topics published round-robin by one thread held 10
/// M requests, 3 GB). Publishers count the bytes they queue here ([`request_cost`]); the
/// core thread subtracts what it took once per turn, and wakes the publishers that found the
/// bound reached once the queues hold at most half of it, so that each wake-up lets a waiting
/// thread queue half the bound's worth.
#[derive(Debug)]
pub(crate) struct PublishRoom {
    /// Bytes queued by every publisher of the node, a stalled request included.
    queued: CachePadded<AtomicUsize>,
    max: usize,
    /// Some publisher waits for room (set before it looks once more; see [`PublishRoom::wait`]).
    wanted: AtomicBool,
    /// The publishers waiting for room: as many as application threads blocked at once.
    waiters: Mutex<Vec<Arc<PublisherShared>>>,
    /// Times a publisher found the bound reached.
    pub(crate) waits: AtomicU64,
}

impl PublishRoom {
    pub(crate) fn new(max: usize) -> PublishRoom {
        PublishRoom {
            queued: CachePadded::new(AtomicUsize::new(0)),
            max: max.max(1),
            wanted: AtomicBool::new(false),
            waiters: Mutex::new(Vec::new()),
            waits: AtomicU64::new(0),
        }
    }

    /// Whether the node may queue one more request (which may pass the bound by its size, so
    /// that a request larger than the bound is still taken).
    fn has_room(&self) -> bool {
        self.queued.load(Ordering::SeqCst) < self.max
    }

    /// Bytes queued now over all publishers (a snapshot).
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Publisher: asks to be woken when room is made. The caller then looks once more before
    /// parking: either it sees the room, or the core thread sees `wanted` after making it.
    fn wait(&self, publisher: &Arc<PublisherShared>) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut waiters) = self.waiters.lock() {
            if !waiters.iter().any(|w| Arc::ptr_eq(w, publisher)) {
                waiters.push(Arc::clone(publisher));
            }
        }
        self.wanted.store(true, Ordering::SeqCst);
    }

    /// Core thread: requests of `n` bytes in all left the publishers' queues (published or
    /// refused).
    pub(crate) fn taken(&self, n: usize) {
        if n == 0 {
            return;
        }
        let left = self.queued.fetch_sub(n, Ordering::SeqCst).saturating_sub(n);
        if left <= self.max / 2 && self.wanted.load(Ordering::SeqCst) {
            self.wake_all();
        }
    }

    /// Wakes every waiting publisher (also when the runtime stops).
    pub(crate) fn wake_all(&self) {
        self.wanted.store(false, Ordering::SeqCst);
        if let Ok(mut waiters) = self.waiters.lock() {
            for w in waiters.drain(..) {
                w.waiting.store(true, Ordering::SeqCst);
                w.wake();
            }
        }
    }
}

/// Identifies one published message, to wait until it is stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublishHandle {
    publisher: u64,
    ticket: u64,
}

impl PublishHandle {
    /// The message's position among its publisher's messages, from 1.
    #[must_use]
    pub fn ticket(self) -> u64 {
        self.ticket
    }
}

/// Why a message was not published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The payload does not fit one datagram.
    #[error("payload of {len} bytes exceeds the largest of {max} bytes")]
    TooLarge {
        /// The payload length.
        len: usize,
        /// The largest payload the node accepts.
        max: usize,
    },
    /// Back pressure (from `try_publish`): the protocol's send queue and this publisher's
    /// request queue are full, or the node's publishers together queued
    /// `publish_queued_node_bytes_max`. The payload is handed back.
    #[error("publisher queue is full (back pressure); try again when messages become stable")]
    WouldBlock(Bytes),
    /// Back pressure lasted longer than the caller's timeout. The payload is handed back.
    #[error("timed out waiting for room to publish")]
    Timeout(Bytes),
    /// The runtime has stopped.
    #[error("the node runtime has stopped")]
    Closed,
}

/// Why waiting for stability ended without it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The message was not stable within the timeout.
    #[error("timed out waiting for stability")]
    Timeout,
    /// The message was not stable within the timeout, and regions of the node are stalled
    /// (`RuntimeConfig::stall_after`): whom its unstable messages wait for.
    #[error("timed out waiting for stability: {0}")]
    Stalled(String),
    /// The runtime stopped first.
    #[error("the node runtime has stopped")]
    Closed,
    /// The handle was issued by another publisher.
    #[error("the handle belongs to another publisher")]
    ForeignHandle,
}

/// Publishes messages from one application thread (create one per thread with
/// [`NodeRuntime::publisher`](crate::NodeRuntime::publisher)). Messages of one publisher are
/// published in call order; [`wait_stable`](Publisher::wait_stable) waits until a message and
/// every earlier message of the same publisher are stable.
///
/// The queue between the publisher and the core thread is a bounded lock-free ring (one per
/// publisher, so it needs no multi-producer ordering) that starts small and grows to its bound
/// only if the publisher fills it; publishing never takes a lock and, once the ring has grown
/// to what the publisher needs, never allocates. All publishers of a node together queue at
/// most `RuntimeConfig::publish_queued_node_bytes_max` (ADR 25); past it a publish waits (or
/// `try_publish` reports `WouldBlock`) even if its own queue has room.
#[derive(Debug)]
pub struct Publisher {
    shared: Arc<PublisherShared>,
    queue: ChainProducer<PublishRequest>,
    core: Arc<CoreShared>,
    parker: Parker,
    next_ticket: u64,
    max_payload: usize,
}

impl Publisher {
    pub(crate) fn new(
        id: u64,
        capacity: usize,
        core: Arc<CoreShared>,
        max_payload: usize,
    ) -> (Publisher, PublisherCore) {
        let parker = Parker::new();
        let (queue, consumer) = ring_chain(capacity);
        let shared = Arc::new(PublisherShared {
            id,
            ready: ReadyFlag::new(),
            stable_upto: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            unparker: parker.unparker().clone(),
            async_waker: AtomicWaker::new(),
            dropped: AtomicBool::new(false),
        });
        let publisher = Publisher {
            shared: Arc::clone(&shared),
            queue,
            core,
            parker,
            next_ticket: 1,
            max_payload,
        };
        (publisher, PublisherCore::new(shared, consumer))
    }

    /// Largest payload accepted.
    #[must_use]
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    fn check(&self, payload: &Bytes) -> Result<(), PublishError> {
        if payload.len() > self.max_payload {
            return Err(PublishError::TooLarge {
                len: payload.len(),
                max: self.max_payload,
            });
        }
        if !self.core.is_running() {
            return Err(PublishError::Closed);
        }
        Ok(())
    }

    fn accepted(&mut self) -> PublishHandle {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.core.notify_ready(&self.shared.ready);
        PublishHandle {
            publisher: self.shared.id,
            ticket,
        }
    }

    /// Queues `request` if this publisher's queue and the node's bound both have room.
    fn enqueue(&mut self, request: PublishRequest) -> Result<(), PublishRequest> {
        let room = &self.core.publish_room;
        if !room.has_room() {
            return Err(request);
        }
        let cost = request_cost(request.payload.len());
        self.queue.push(request)?;
        room.queued.fetch_add(cost, Ordering::SeqCst);
        Ok(())
    }

    /// Before a publisher waits: if the node's bound (not its own queue) refused the request,
    /// asks the core thread to wake it when there is room.
    fn announce_wait(&self) {
        let room = &self.core.publish_room;
        if !room.has_room() {
            room.wait(&self.shared);
        }
    }

    /// Publishes without blocking: `WouldBlock` (with the payload) when back pressure holds.
    pub fn try_publish(
        &mut self,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<PublishHandle, PublishError> {
        self.check(&payload)?;
        match self.enqueue(PublishRequest { topic, payload }) {
            Ok(()) => Ok(self.accepted()),
            Err(request) => Err(PublishError::WouldBlock(request.payload)),
        }
    }

    /// Publishes, waiting while back pressure holds (until the protocol has room), for at most
    /// `timeout` (`None`: as long as it takes, or until the runtime stops).
    pub fn publish_timeout(
        &mut self,
        topic: TopicId,
        payload: Bytes,
        timeout: Option<Duration>,
    ) -> Result<PublishHandle, PublishError> {
        self.check(&payload)?;
        // The deadline is taken when the first push fails: a push that goes through (nearly
        // all of them) then costs no clock read.
        let mut deadline = None;
        let mut request = PublishRequest { topic, payload };
        loop {
            match self.enqueue(request) {
                Ok(()) => return Ok(self.accepted()),
                Err(r) => request = r,
            }
            // Announce the wait, then look again: the core thread makes room and then checks
            // `waiting` (see `PublisherShared::wake`).
            self.shared.waiting.store(true, Ordering::SeqCst);
            self.announce_wait();
            fence(Ordering::SeqCst);
            match self.enqueue(request) {
                Ok(()) => {
                    self.shared.waiting.store(false, Ordering::Relaxed);
                    return Ok(self.accepted());
                }
                Err(r) => request = r,
            }
            if !self.core.is_running() {
                return Err(PublishError::Closed);
            }
            if let Some(t) = timeout {
                deadline.get_or_insert_with(|| crate::clock::now() + t);
            }
            if !self.park(deadline) {
                return Err(PublishError::Timeout(request.payload));
            }
        }
    }

    /// Publishes, waiting while back pressure holds, until there is room or the runtime stops.
    pub fn publish(
        &mut self,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<PublishHandle, PublishError> {
        self.publish_timeout(topic, payload, None)
    }

    /// Publishes from async code: like [`publish`](Publisher::publish), but while back pressure
    /// holds the task waits (woken by the core thread when there is room) instead of the
    /// thread. Dropping the future before it completes publishes nothing.
    pub async fn publish_async(
        &mut self,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<PublishHandle, PublishError> {
        self.check(&payload)?;
        let mut request = Some(PublishRequest { topic, payload });
        std::future::poll_fn(|cx| {
            let Some(r) = request.take() else {
                return Poll::Ready(Err(PublishError::Closed));
            };
            let r = match self.enqueue(r) {
                Ok(()) => return Poll::Ready(Ok(self.accepted())),
                Err(r) => r,
            };
            // Register, announce the wait, then look again (see `PublisherShared::wake`).
            self.shared.async_waker.register(cx.waker());
            self.shared.waiting.store(true, Ordering::SeqCst);
            self.announce_wait();
            fence(Ordering::SeqCst);
            match self.enqueue(r) {
                Ok(()) => Poll::Ready(Ok(self.accepted())),
                Err(_) if !self.core.is_running() => Poll::Ready(Err(PublishError::Closed)),
                Err(r) => {
                    request = Some(r);
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Waits from async code until `handle`'s message and every earlier message of this
    /// publisher are stable, or the runtime stops. Bound it with the timer of your executor.
    pub async fn wait_stable_async(&self, handle: PublishHandle) -> Result<(), WaitError> {
        if handle.publisher != self.shared.id {
            return Err(WaitError::ForeignHandle);
        }
        std::future::poll_fn(|cx| {
            if self.shared.stable_upto.load(Ordering::Acquire) >= handle.ticket {
                return Poll::Ready(Ok(()));
            }
            self.shared.async_waker.register(cx.waker());
            self.shared.waiting.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.shared.stable_upto.load(Ordering::Acquire) >= handle.ticket {
                Poll::Ready(Ok(()))
            } else if !self.core.is_running() {
                Poll::Ready(Err(WaitError::Closed))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Parks until woken or `deadline`; false if the deadline has passed.
    fn park(&self, deadline: Option<tidings_proto::Time>) -> bool {
        let slice = match deadline {
            Some(d) => {
                let now = crate::clock::now();
                if now >= d {
                    return false;
                }
                (d - now).min(PARK_SLICE)
            }
            None => PARK_SLICE,
        };
        self.parker.park_timeout(slice);
        true
    }

    /// Whether `handle`'s message (and every earlier one of this publisher) is stable.
    #[must_use]
    pub fn is_stable(&self, handle: PublishHandle) -> bool {
        handle.publisher == self.shared.id
            && self.shared.stable_upto.load(Ordering::Acquire) >= handle.ticket
    }

    /// Messages of this publisher known stable, counted from the first.
    #[must_use]
    pub fn stable_count(&self) -> u64 {
        self.shared.stable_upto.load(Ordering::Acquire)
    }

    /// Messages this publisher has published.
    #[must_use]
    pub fn published_count(&self) -> u64 {
        self.next_ticket - 1
    }

    /// Waits until `handle`'s message and every earlier message of this publisher are stable
    /// (received by every member of every region their topics span), for at most `timeout`.
    pub fn wait_stable(
        &mut self,
        handle: PublishHandle,
        timeout: Duration,
    ) -> Result<(), WaitError> {
        if handle.publisher != self.shared.id {
            return Err(WaitError::ForeignHandle);
        }
        let deadline = crate::clock::now() + timeout;
        loop {
            if self.shared.stable_upto.load(Ordering::Acquire) >= handle.ticket {
                return Ok(());
            }
            self.shared.waiting.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.shared.stable_upto.load(Ordering::Acquire) >= handle.ticket {
                self.shared.waiting.store(false, Ordering::Relaxed);
                return Ok(());
            }
            if !self.core.is_running() {
                return Err(WaitError::Closed);
            }
            if !self.park(Some(deadline)) {
                return Err(self
                    .core
                    .stalls()
                    .map_or(WaitError::Timeout, WaitError::Stalled));
            }
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shared.dropped.store(true, Ordering::Release);
        // Listed like a publisher with work, so the core thread sees the drop without looking
        // at every publisher.
        self.core.notify_ready(&self.shared.ready);
    }
}

/// The core thread's side of one publisher.
#[derive(Debug)]
pub(crate) struct PublisherCore {
    pub(crate) shared: Arc<PublisherShared>,
    /// The publisher's requests, in publish order.
    pub(crate) queue: ChainConsumer<PublishRequest>,
    /// On the core's list of publishers to serve this turn (`Core::active`).
    pub(crate) listed: bool,
    /// A request the protocol refused (back pressure); it goes first when there is room.
    pub(crate) stalled: Option<PublishRequest>,
    /// Congestion control refused the stalled request until this time.
    pub(crate) retry_at: Option<tidings_proto::Time>,
    /// Message ids of this publisher's unstable messages in publish order, with whether each is
    /// stable yet (stability can arrive out of order across regions).
    pub(crate) pending: VecDeque<(MsgId, bool)>,
    /// Tickets known stable (mirrors `shared.stable_upto`).
    pub(crate) stable_upto: u64,
    /// `stable_upto` advanced since the publisher was last woken (see [`Self::wake_if_advanced`]).
    advanced: bool,
    /// The node's rejoins when the publisher was added: its requests name topics by the ids
    /// of that incarnation, which the core translates to the current ones.
    pub(crate) epoch: usize,
}

impl PublisherCore {
    pub(crate) fn new(
        shared: Arc<PublisherShared>,
        queue: ChainConsumer<PublishRequest>,
    ) -> PublisherCore {
        PublisherCore {
            shared,
            queue,
            listed: false,
            stalled: None,
            retry_at: None,
            pending: VecDeque::new(),
            stable_upto: 0,
            advanced: false,
            epoch: 0,
        }
    }

    /// Marks the `count` messages of ids from `first` on stable (each of them this
    /// publisher's); advances the stable ticket over the stable prefix. True if the ticket
    /// advanced for the first time since the last [`Self::wake_if_advanced`] (the publisher is
    /// woken once per batch of events: waking costs a fence).
    pub(crate) fn on_stable(&mut self, first: MsgId, count: u64) -> bool {
        let before = self.stable_upto;
        // Messages usually become stable in publish order: the oldest pending ones. Ids
        // increase along `pending`, so a front from `first` to its last id is the run.
        let n = usize::try_from(count).unwrap_or(usize::MAX);
        let last = MsgId(first.0 + count.saturating_sub(1));
        if n > 0
            && self.pending.front().is_some_and(|&(m, _)| m == first)
            && self.pending.get(n - 1).is_some_and(|&(m, _)| m == last)
        {
            self.pending.drain(..n);
            self.stable_upto += count;
        } else {
            for id in first.0..first.0 + count {
                if let Ok(i) = self.pending.binary_search_by_key(&MsgId(id), |&(m, _)| m) {
                    self.pending[i].1 = true;
                }
            }
        }
        while self.pending.front().is_some_and(|&(_, stable)| stable) {
            self.pending.pop_front();
            self.stable_upto += 1;
        }
        if self.stable_upto != before {
            self.shared
                .stable_upto
                .store(self.stable_upto, Ordering::Release);
            return !std::mem::replace(&mut self.advanced, true);
        }
        false
    }

    /// Wakes the publisher if its stable ticket advanced since the last call.
    pub(crate) fn wake_if_advanced(&mut self) {
        if std::mem::take(&mut self.advanced) {
            self.shared.wake();
        }
    }

    /// Whether the core thread can forget this publisher.
    pub(crate) fn is_finished(&self) -> bool {
        self.shared.dropped.load(Ordering::Acquire)
            && self.stalled.is_none()
            && self.queue.is_empty()
            && self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Poll, Token, Waker};

    #[test]
    fn the_node_wide_bound_holds_publishers_with_room_of_their_own_until_half_is_free() {
        let poll = Poll::new().expect("epoll");
        let bound = 64 * 1024;
        let core = Arc::new(CoreShared::new(
            Waker::new(poll.registry(), Token(0)).expect("eventfd"),
            bound,
        ));
        let payload = Bytes::from(vec![7u8; 1000]);
        let cost = request_cost(payload.len());
        let (mut publishers, _core_sides): (Vec<_>, Vec<_>) = (0..4)
            .map(|id| Publisher::new(id, 1024, Arc::clone(&core), 1400))
            .unzip();
        // Round-robin until the node refuses: each queue holds a sixteenth of its capacity.
        let mut queued = 0;
        'fill: loop {
            for p in &mut publishers {
                match p.try_publish(TopicId(1), payload.clone()) {
                    Ok(_) => queued += 1,
                    Err(PublishError::WouldBlock(back)) => {
                        assert_eq!(back, payload, "the payload comes back");
                        break 'fill;
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        }
        // Requests are taken while less than the bound is queued: the last one passes it.
        assert_eq!(queued, bound.div_ceil(cost));
        assert_eq!(core.publish_room.queued(), queued * cost);
        // A blocking publish waits for room...
        let mut blocked = publishers.pop().expect("four publishers");
        let waiter = std::thread::spawn(move || blocked.publish(TopicId(1), payload).is_ok());
        // (registered: `wanted` is the last thing `PublishRoom::wait` sets)
        while !core.publish_room.wanted.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        assert!(!waiter.is_finished(), "published past the node's bound");
        // ...and is woken once at most half the bound is queued (the waiter may queue its
        // request at once, so the half is checked on the numbers).
        let taken = queued - (bound / 2) / cost;
        assert!((queued - taken) * cost <= bound / 2);
        core.publish_room.taken(taken * cost);
        assert!(
            !core.publish_room.wanted.load(Ordering::SeqCst),
            "the waiters were not woken"
        );
        assert!(
            waiter.join().expect("publisher thread"),
            "the waiting publish failed"
        );
        assert_eq!(core.publish_room.queued(), (queued - taken + 1) * cost);
    }
}
