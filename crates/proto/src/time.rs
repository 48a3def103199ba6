//! Protocol time: an input, never read from a clock inside the protocol.

use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an epoch chosen by whoever drives the protocol (the
/// runtime's start, or zero in the simulator). Only differences are meaningful.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Time(u64);

impl Time {
    /// The driver's epoch.
    pub const ZERO: Time = Time(0);
    /// Later than any time the protocol will see.
    pub const MAX: Time = Time(u64::MAX);

    /// The time `nanos` nanoseconds after the epoch.
    #[must_use]
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Microseconds since the epoch (the unit of sender timestamps on the wire).
    #[must_use]
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// Time elapsed since `earlier`, zero if `earlier` is later.
    #[must_use]
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;

    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(nanos(rhs)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;

    /// Saturating: a later `rhs` gives zero.
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_duration_since(rhs)
    }
}
