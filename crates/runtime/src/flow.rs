//! What a bounded subscription shares with the core thread: how many of its deliveries the
//! application has not read, its capacity, and whether it is the bottleneck of its topic now.
//!
//! The core thread counts a batch's deliveries up before handing it to the subscription's task;
//! the reader counts each down as it takes it ([`Unread::taken`]). A batch gets as far as the
//! capacity; what finds the count at the capacity is not handed on: the core holds the topic in the protocol (its streams stop at
//! this node, the other topics go on) and waits until the reader brings the count down to the
//! low watermark, half the capacity, which wakes it.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tidings_proto::Time;

use crate::core::CoreShared;

/// The read side of a bounded subscription (see the module documentation). Shared by the
/// subscription's reader, its delivery task and the core thread.
#[derive(Debug)]
pub struct Unread {
    count: AtomicUsize,
    capacity: usize,
    low: usize,
    /// Set by the core thread while it waits for the count to fall to `low`.
    waiting: AtomicBool,
    /// When the subscription became its topic's bottleneck (microseconds of the runtime's clock
    /// plus one; 0: it is not).
    bottleneck_since: AtomicU64,
    bottlenecks: AtomicU64,
    shared: Arc<CoreShared>,
}

/// A subscription's state as the bottleneck of its topic, from [`Unread::bottleneck`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BottleneckState {
    /// How long the subscription has been full with its topic held, if it is now.
    pub since: Option<Duration>,
    /// Times it became the bottleneck (each one ended by its reader making room, or by a
    /// disconnection).
    pub times: u64,
}

impl Unread {
    pub(crate) fn new(capacity: usize, shared: Arc<CoreShared>) -> Unread {
        Unread {
            count: AtomicUsize::new(0),
            capacity,
            low: capacity / 2,
            waiting: AtomicBool::new(false),
            bottleneck_since: AtomicU64::new(0),
            bottlenecks: AtomicU64::new(0),
            shared,
        }
    }

    /// The reader took `n` deliveries: counts them down, and wakes the core thread if it waits
    /// for room and the count reached the low watermark.
    pub fn taken(&self, n: usize) {
        let before = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(n))
            })
            .unwrap_or(0);
        // Looked at before it is written: a reader that keeps up writes nothing shared here.
        if before.saturating_sub(n) <= self.low
            && self.waiting.load(Ordering::Acquire)
            && self.waiting.swap(false, Ordering::AcqRel)
        {
            self.shared.wake();
        }
    }

    /// Deliveries handed on and not yet read.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// The most deliveries handed on and not read.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the subscription is its topic's bottleneck now, and how often it was.
    #[must_use]
    pub fn bottleneck(&self) -> BottleneckState {
        let since = match self.bottleneck_since.load(Ordering::Acquire) {
            0 => None,
            at => Some(
                crate::clock::now()
                    .saturating_duration_since(Time::ZERO + Duration::from_micros(at - 1)),
            ),
        };
        BottleneckState {
            since,
            times: self.bottlenecks.load(Ordering::Acquire),
        }
    }

    /// Core side: how many of a batch of `n` deliveries there is room for (at most `n`), which
    /// are then counted. Only the core thread counts up, so the count stays within the capacity.
    pub(crate) fn admit(&self, n: usize) -> usize {
        let count = self.count.load(Ordering::Acquire);
        let room = self.capacity.saturating_sub(count).min(n);
        if room > 0 {
            self.count.fetch_add(room, Ordering::AcqRel);
        }
        room
    }

    /// Core side, after [`admit`](Self::admit) found no room: asks the reader to wake the core
    /// thread once the count is down to the low watermark, then looks again (the reader may
    /// have taken some between the two looks); how many of the `n` there is room for after all
    /// (those are then counted).
    pub(crate) fn wake_when_low_then_admit(&self, n: usize) -> usize {
        self.waiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.admit(n)
    }

    /// Core side: `n` deliveries counted by [`admit`](Self::admit) were not handed on.
    pub(crate) fn unadmit(&self, n: usize) {
        let _ = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n));
    }

    /// Core side: whether the count is at the low watermark or below; if not, the reader wakes
    /// the core thread once it is.
    pub(crate) fn has_room_or_wake_later(&self) -> bool {
        if self.count.load(Ordering::Acquire) <= self.low {
            return true;
        }
        self.waiting.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // The reader may have taken the last ones between the two looks.
        if self.count.load(Ordering::Acquire) <= self.low {
            self.waiting.store(false, Ordering::Release);
            return true;
        }
        false
    }

    /// Core side: the subscription became its topic's bottleneck at `now`.
    pub(crate) fn became_bottleneck(&self, now: Time) {
        if self.bottleneck_since.load(Ordering::Acquire) == 0 {
            self.bottleneck_since
                .store(now.as_micros().saturating_add(1), Ordering::Release);
            self.bottlenecks.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Core side: the subscription has room again (or is gone). Returns how long it was the
    /// bottleneck, if it was.
    pub(crate) fn recovered(&self, now: Time) -> Option<Duration> {
        match self.bottleneck_since.swap(0, Ordering::AcqRel) {
            0 => None,
            at => Some(now.saturating_duration_since(Time::ZERO + Duration::from_micros(at - 1))),
        }
    }

    /// Core side: when it became the bottleneck, if it is.
    pub(crate) fn bottleneck_since(&self) -> Option<Time> {
        match self.bottleneck_since.load(Ordering::Acquire) {
            0 => None,
            at => Some(Time::ZERO + Duration::from_micros(at - 1)),
        }
    }
}
