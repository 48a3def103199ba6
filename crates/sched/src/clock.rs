//! Time as an input of the credit policy.
//!
//! The scheduler charges each task the time its event took. Where that time comes from is a
//! [`Clock`]: the real monotonic clock for worker threads, a [`ManualClock`] that tests and the
//! simulator move by hand so that credit accounting is deterministic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A monotonic source of nanoseconds.
///
/// The origin is arbitrary; only differences are used. Implementations must be cheap (two reads
/// per event) and must never go backwards.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;
}

/// The real monotonic clock (`std::time::Instant`), used by worker threads.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

/// Reads the operating system's monotonic clock.
///
/// This is the one place in the crate where real time enters: every other time in the scheduler
/// is a `u64` nanosecond count obtained through the [`Clock`] trait, so policy code stays
/// testable with a [`ManualClock`].
#[allow(clippy::disallowed_methods)] // the real clock must be read somewhere; it is read here only
fn read_real_clock() -> Instant {
    Instant::now()
}

impl MonotonicClock {
    /// A clock whose origin is the moment of the call.
    pub fn new() -> Self {
        Self {
            origin: read_real_clock(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds cover 584 years of uptime; saturate rather than wrap past that.
        let elapsed = read_real_clock().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to: for deterministic tests and the simulator.
///
/// A handler can advance it to model how long an event "took" (for example 100 µs per event gives
/// `Rmax` = 10 000 events/s, the paper's worked example).
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self {
            now_ns: AtomicU64::new(start_ns),
        }
    }

    /// Moves the clock forward by `delta_ns`.
    pub fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }

    /// Moves the clock to `now_ns` if that is later than its current reading (it never goes back).
    pub fn advance_to_ns(&self, now_ns: u64) {
        self.now_ns.fetch_max(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for std::sync::Arc<C> {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let clock = ManualClock::new(5);
        assert_eq!(clock.now_ns(), 5);
        clock.advance_ns(10);
        assert_eq!(clock.now_ns(), 15);
        clock.advance_to_ns(12);
        assert_eq!(clock.now_ns(), 15, "advance_to_ns must not go back");
        clock.advance_to_ns(40);
        assert_eq!(clock.now_ns(), 40);
    }

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let clock = MonotonicClock::new();
        let a = clock.now_ns();
        let b = clock.now_ns();
        assert!(b >= a);
    }
}
