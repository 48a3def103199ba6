//! The runtime's clock: the one place that reads real time and turns it into protocol time.

use std::sync::OnceLock;
use std::time::Instant;

use tidings_proto::Time;

/// The epoch of protocol time in this process: the monotonic clock's reading when a runtime
/// first read the clock, and the wall clock's (nanoseconds since the Unix epoch) at that
/// moment. One epoch per process (not per runtime).
static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();

/// The epoch of [`service_now`]: the first time a membership service host read it.
static SERVICE_EPOCH: OnceLock<Instant> = OnceLock::new();

/// Now, as a node's protocol time: nanoseconds since the Unix epoch, the wall clock read once
/// per process and advanced by the monotonic clock from there (so it never goes back). The
/// timestamps a node writes on its messages are this time's microseconds, so a receiver
/// compares them with its own clock: the delivery latency
/// (`RuntimeStats::delivery_latency`), exact between nodes of one host and off by the hosts'
/// clock difference between hosts.
// The protocol crates may not read the clock (clippy.toml); the runtime is where time enters.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Time {
    let (epoch, wall_ns) = *EPOCH.get_or_init(|| (Instant::now(), wall_nanos()));
    let nanos = Instant::now().saturating_duration_since(epoch).as_nanos();
    Time::from_nanos(wall_ns.saturating_add(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

/// Now, as the membership service's time (its own hosts and replicas): nanoseconds since the
/// process's first reading. The service keeps member deadlines in its state, and a state
/// restored from disk compares them with this clock as it always has.
#[allow(clippy::disallowed_methods)]
pub(crate) fn service_now() -> Time {
    let epoch = *SERVICE_EPOCH.get_or_init(Instant::now);
    let nanos = Instant::now().saturating_duration_since(epoch).as_nanos();
    Time::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Nanoseconds of the wall clock since the Unix epoch (0 before it).
#[allow(clippy::disallowed_methods)]
fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Microseconds of the wall clock since the Unix epoch: the base of a node's hello stamps, which
/// must grow across restarts of one identity.
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
