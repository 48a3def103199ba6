//! A task: one subscription's bounded event queue, its share and credit, and its handler.
//!
//! Three counters coordinate the threads that touch a task without locks (section III-A):
//!
//! * `slots_used` bounds the queue: a writer reserves a slot (compare-and-swap below the capacity)
//!   before pushing, and the worker frees it right after popping. A writer that finds no slot
//!   registers in `waiting` and sleeps (or parks its waker); the worker whose release leaves the
//!   queue exactly half full, and sees `waiting > 0`, wakes the writers. Each side updates its own
//!   counter, then a SeqCst fence (`sync::handshake_fence`), then reads the other's, so at least
//!   one of them sees the other: no lost wake-up.
//! * `queue_size` is the paper's `t.queueSize`: a writer raises it *after* its push, a worker
//!   lowers it *after* running the event. The writer whose increment started from zero owns the
//!   task and puts it into the schedulable set; a worker returns the task to the set only if its
//!   decrement left a non-zero value. So exactly one party holds the task whenever it has events:
//!   it is never lost and never on two threads at once.
//! * `credit_ns` / `credit_epoch` are only touched by the party that holds the task (the set's
//!   FIFOs hand it over with release/acquire), so relaxed atomics are enough: they are atomics
//!   only because Rust needs interior mutability to share the task.

use crate::error::TryPushError;
use crate::fifo::{Fifo, TaskFifo};
use crate::sync::{
    handshake_fence, lock, wait, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Condvar, Mutex,
    MutexGuard, Ordering,
};
use std::task::Waker;

/// The event handler of a task: the application callback of a subscription.
pub(crate) type Handler<E> = Box<dyn FnMut(E) + Send>;

/// Writers waiting for a free slot.
#[derive(Default)]
pub(crate) struct WaitList {
    /// Wakers of pending `push_async` futures.
    wakers: Vec<Waker>,
}

/// Counters of one task, readable at any time.
#[derive(Default)]
pub(crate) struct TaskCounters {
    pub(crate) events_run: AtomicU64,
    pub(crate) run_ns: AtomicU64,
    pub(crate) events_discarded: AtomicU64,
    pub(crate) writer_waits: AtomicU64,
}

/// A schedulable task.
pub(crate) struct Task<E> {
    pub(crate) id: u64,
    events: TaskFifo<E>,
    capacity: usize,
    slots_used: AtomicUsize,
    queue_size: AtomicUsize,
    /// Writers registered in `wait_list` (sleeping threads plus parked wakers).
    waiting: AtomicUsize,
    wait_list: Mutex<WaitList>,
    writers: Condvar,
    /// No new events are accepted (task removed or scheduler shutting down).
    closed: AtomicBool,
    /// Queued events are dropped instead of run (task removed or discarding shutdown).
    discard: AtomicBool,
    /// The share, as the bits of an `f64` in (0, 1].
    share_bits: AtomicU64,
    credit_ns: AtomicI64,
    credit_epoch: AtomicU64,
    pub(crate) handler: Mutex<Handler<E>>,
    pub(crate) counters: TaskCounters,
}

impl<E: Send> Task<E> {
    /// A task with a full period of credit in `epoch`.
    pub(crate) fn new(
        id: u64,
        capacity: usize,
        share: f64,
        credit_ns: i64,
        epoch: u64,
        handler: Handler<E>,
    ) -> Self {
        Self {
            id,
            events: TaskFifo::with_capacity(capacity),
            capacity,
            slots_used: AtomicUsize::new(0),
            queue_size: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            wait_list: Mutex::new(WaitList::default()),
            writers: Condvar::new(),
            closed: AtomicBool::new(false),
            discard: AtomicBool::new(false),
            share_bits: AtomicU64::new(share.to_bits()),
            credit_ns: AtomicI64::new(credit_ns),
            credit_epoch: AtomicU64::new(epoch),
            handler: Mutex::new(handler),
            counters: TaskCounters::default(),
        }
    }

    /// Reserves one queue slot if fewer than `capacity` are in use.
    fn try_reserve_slot(&self) -> bool {
        let mut used = self.slots_used.load(Ordering::SeqCst);
        loop {
            if used >= self.capacity {
                return false;
            }
            match self.slots_used.compare_exchange_weak(
                used,
                used + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(current) => used = current,
            }
        }
    }

    /// Appends `event` if there is room. `Ok(true)` means the queue size went from zero to one:
    /// the caller now holds the task and must put it into the schedulable set (Fig. 2a).
    pub(crate) fn enqueue(&self, event: E) -> Result<bool, TryPushError<E>> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(TryPushError::Closed(event));
        }
        if !self.try_reserve_slot() {
            return Err(TryPushError::Full(event));
        }
        self.events.push(event);
        Ok(self.queue_size.fetch_add(1, Ordering::SeqCst) == 0)
    }

    /// Takes the next event. Only the holder of the task calls this, and only while
    /// `queue_size > 0`, so an event is always there.
    pub(crate) fn dequeue(&self) -> E {
        let Some(event) = self.events.pop() else {
            panic!(
                "task {}: queue_size > 0 but the event queue is empty",
                self.id
            );
        };
        self.release_slot();
        event
    }

    /// Frees one slot and wakes waiting writers if there are any.
    ///
    /// Writers are woken only once the queue has drained to half its capacity: a writer sleeps
    /// only on a full queue, so the release that crosses the half mark always follows its
    /// registration and sees it, and the hysteresis costs one wake-up per half queue of events
    /// instead of one per event.
    ///
    /// Only that crossing release (the one that leaves exactly half) needs the handshake: the
    /// count moves by one at a time, so from the full queue a sleeping writer saw it must pass
    /// through the half mark, and a writer that registers after that release missed it only if
    /// its own re-check saw the freed slots (the fence pair), so it did not sleep. Every other
    /// release skips the fence and the read of `waiting`: with a queue that holds one event at
    /// a time (many quiet subscriptions) the fence was a third of the handoff.
    fn release_slot(&self) {
        let used = self.slots_used.fetch_sub(1, Ordering::SeqCst) - 1;
        if used != self.capacity / 2 {
            return;
        }
        handshake_fence();
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.wake_writers();
        }
    }

    /// Wakes every waiting writer (threads and futures); they retry.
    pub(crate) fn wake_writers(&self) {
        let mut list = lock(&self.wait_list);
        let wakers = std::mem::take(&mut list.wakers);
        self.waiting.fetch_sub(wakers.len(), Ordering::SeqCst);
        self.writers.notify_all();
        drop(list);
        for waker in wakers {
            waker.wake();
        }
    }

    /// Registers the calling writer, retries `event` under the wait-list lock (which closes the
    /// window between "queue full" and "asleep"), and if the queue is still full sleeps until a
    /// worker frees a slot or the task closes. `Err(Full)` hands the event back for another try.
    pub(crate) fn enqueue_or_wait(&self, event: E) -> Result<bool, TryPushError<E>> {
        let list = lock(&self.wait_list);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        handshake_fence();
        self.counters.writer_waits.fetch_add(1, Ordering::Relaxed);
        let result = self.enqueue(event);
        let list: MutexGuard<'_, WaitList> = match result {
            Err(TryPushError::Full(_)) => wait(&self.writers, list),
            _ => list,
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        drop(list);
        result
    }

    /// The asynchronous variant of [`enqueue_or_wait`](Self::enqueue_or_wait): parks `waker` and
    /// retries once under the lock. `Err(Full)` means the waker is registered and will be woken.
    pub(crate) fn enqueue_or_park(&self, event: E, waker: &Waker) -> Result<bool, TryPushError<E>> {
        let mut list = lock(&self.wait_list);
        if !list.wakers.iter().any(|parked| parked.will_wake(waker)) {
            list.wakers.push(waker.clone());
            self.waiting.fetch_add(1, Ordering::SeqCst);
            self.counters.writer_waits.fetch_add(1, Ordering::Relaxed);
        }
        handshake_fence();
        // A waker left behind by a successful retry only causes one spurious wake-up; the next
        // worker that frees a slot drains it.
        self.enqueue(event)
    }

    /// Stops accepting events; with `discard`, queued events are dropped instead of run.
    /// Waiting writers are woken so that they see the closure.
    pub(crate) fn close(&self, discard: bool) {
        if discard {
            self.discard.store(true, Ordering::SeqCst);
        }
        self.closed.store(true, Ordering::SeqCst);
        self.wake_writers();
    }

    /// Whether new events are refused.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Whether queued events are to be dropped.
    pub(crate) fn is_discarding(&self) -> bool {
        self.discard.load(Ordering::SeqCst)
    }

    /// The paper's `t.queueSize`: events pushed and not yet run.
    pub(crate) fn queue_size(&self) -> usize {
        self.queue_size.load(Ordering::SeqCst)
    }

    /// Lowers the queue size by `n` after running (or dropping) `n` events; `true` if events
    /// remain, in which case the caller still holds the task and must put it back.
    pub(crate) fn finish(&self, n: usize) -> bool {
        self.queue_size.fetch_sub(n, Ordering::SeqCst) > n
    }

    /// Drops up to `queue_size` queued events (a removed task); returns how many.
    pub(crate) fn drop_queued(&self) -> usize {
        let n = self.queue_size();
        for _ in 0..n {
            drop(self.dequeue());
        }
        self.counters
            .events_discarded
            .fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Replaces the handler with a no-op, dropping the application's closure (after shutdown).
    #[cfg(not(loom))]
    pub(crate) fn drop_handler(&self) {
        let old = std::mem::replace(&mut *lock(&self.handler), Box::new(|_| {}));
        drop(old);
    }

    /// The current share.
    pub(crate) fn share(&self) -> f64 {
        f64::from_bits(self.share_bits.load(Ordering::Relaxed))
    }

    /// Sets the share (validated by the caller); it takes effect at the task's next reset.
    pub(crate) fn set_share(&self, share: f64) {
        self.share_bits.store(share.to_bits(), Ordering::Relaxed);
    }

    /// The remaining credit (holder only).
    pub(crate) fn credit_ns(&self) -> i64 {
        self.credit_ns.load(Ordering::Relaxed)
    }

    /// The epoch in which the credit was last reset (holder only).
    pub(crate) fn credit_epoch(&self) -> u64 {
        self.credit_epoch.load(Ordering::Relaxed)
    }

    /// Sets the credit and its epoch (holder only).
    pub(crate) fn set_credit(&self, credit_ns: i64, epoch: u64) {
        self.credit_ns.store(credit_ns, Ordering::Relaxed);
        self.credit_epoch.store(epoch, Ordering::Relaxed);
    }

    /// Charges `run_ns` to the credit (holder only).
    pub(crate) fn charge(&self, run_ns: u64) {
        let run_ns = i64::try_from(run_ns).unwrap_or(i64::MAX);
        let credit = self
            .credit_ns
            .load(Ordering::Relaxed)
            .saturating_sub(run_ns);
        self.credit_ns.store(credit, Ordering::Relaxed);
    }

    /// Events queued (a snapshot, for statistics).
    pub(crate) fn queue_len(&self) -> usize {
        self.slots_used.load(Ordering::Relaxed).min(self.capacity)
    }
}
