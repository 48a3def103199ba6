//! The runtime's clock: the one place that reads real time and turns it into protocol time.

use std::sync::OnceLock;
use std::time::Instant;

use tidings_proto::Time;

/// The epoch of protocol time in this process: the first time any runtime read the clock. One
/// epoch per process (not per runtime) so that sender timestamps of nodes in the same process
/// compare directly (tests and benchmarks measure latency with them).
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Now, as protocol time (nanoseconds since the process's epoch).
// The protocol crates may not read the clock (clippy.toml); the runtime is where time enters.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Time {
    let epoch = *EPOCH.get_or_init(Instant::now);
    let nanos = Instant::now().saturating_duration_since(epoch).as_nanos();
    Time::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Microseconds of the wall clock since the Unix epoch: the base of a node's hello stamps, which
/// must grow across restarts of one identity (protocol time starts again at each).
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
