//! The synchronisation primitives of the crate, switched at build time.
//!
//! Normal builds use `std`; `--cfg loom` builds use loom's instrumented twins, so the loom models
//! in `loom_tests.rs` explore every interleaving of the *real* coordination code (queue size,
//! slot reservations, bucket counters, epoch, wait lists). Only the lock-free FIFOs themselves are
//! substituted under loom (see `fifo.rs`), because loom cannot see inside crossbeam.

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering},
    Arc, Condvar, Mutex, MutexGuard,
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering},
    Arc, Condvar, Mutex, MutexGuard,
};

/// The store-buffering fence of the two "register, then re-check" handshakes (a writer waiting
/// for a slot / a worker freeing one; an idle worker going to sleep / a writer making a task
/// schedulable). Each side does an atomic read-modify-write on its own counter, this fence, then
/// a load of the other side's counter; with the fence on both sides, at least one side sees the
/// other, so no wake-up is lost.
///
/// In the C11 model sequentially consistent accesses alone would suffice, but loom models them
/// only as acquire/release (loom README, "Unsupported features") while it models `fence(SeqCst)`
/// exactly; the explicit fence makes the production code the code loom verifies. Its cost is one
/// `mfence` on x86 on two paths per event.
pub(crate) fn handshake_fence() {
    fence(Ordering::SeqCst);
}

/// Locks `mutex`, ignoring poisoning.
///
/// Every mutex in this crate guards plain bookkeeping (wait lists, the baseline queue, a task's
/// handler) whose state stays consistent even if a holder panicked; handler panics are caught
/// before they can poison anything, so a poisoned lock carries no broken invariant.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Waits on `condvar`, ignoring poisoning for the same reason as [`lock`].
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match condvar.wait(guard) {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
