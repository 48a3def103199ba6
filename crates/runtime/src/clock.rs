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
