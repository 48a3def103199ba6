//! What `tidings bench` reads from the operating system: a clock shared by every process on the
//! host, the process's CPU time and peak resident memory, and the heap allocations counted by
//! this binary's global allocator.

use std::alloc::System;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

/// Counts every heap allocation of the process (all threads), so that `tidings bench` can report
/// allocations per message. `stats_alloc` does it without `unsafe` in this workspace. The cost is
/// a few relaxed atomic additions per allocation, in every command of this binary.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap allocations (and reallocations, which may move) of this process so far.
pub(crate) fn allocations() -> u64 {
    let stats = GLOBAL.stats();
    (stats.allocations + stats.reallocations) as u64
}

/// Nanoseconds of `CLOCK_MONOTONIC`. Every process on the host reads the same clock (network
/// namespaces do not change it), so a publisher's stamp and a subscriber's reading in another
/// process subtract to the publish-to-callback latency. `tidings_runtime::now()` cannot serve:
/// its epoch is per process.
// The one clock read of the benchmark's processes. It is not `Instant::now` (whose value cannot
// cross a process boundary), so clippy's `disallowed-methods` does not list it, but it is a clock
// read all the same and lives only here.
pub(crate) fn shared_clock_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    timespec_ns(t)
}

/// CPU time (user and system, all threads) this process has used, in nanoseconds.
pub(crate) fn cpu_time_ns() -> u64 {
    timespec_ns(rustix::time::clock_gettime(
        rustix::time::ClockId::ProcessCPUTime,
    ))
}

fn timespec_ns(t: rustix::time::Timespec) -> u64 {
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// Peak resident set size of this process (`VmHWM` in `/proc/self/status`), in bytes; 0 where
/// the kernel does not say.
pub(crate) fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_and_memory_is_known() {
        let a = shared_clock_ns();
        let c = cpu_time_ns();
        let v: Vec<u64> = (0..100_000).collect();
        assert!(v.iter().sum::<u64>() > 0);
        assert!(shared_clock_ns() >= a);
        assert!(cpu_time_ns() >= c);
        assert!(peak_rss_bytes() > 0);
        assert!(allocations() > 0);
    }
}
