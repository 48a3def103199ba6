//! The extension module `tidings._tidings`: the Rust library [`tidings`] seen from Python.
//!
//! It carries bytes: every topic is a raw topic underneath, and a Python codec (given as an
//! `encode` or `decode` callable) turns values into bytes and back. The pure-Python package
//! `tidings` on top adds the codecs, asyncio and callbacks.
//!
//! Every wait (joining, subscribing, receiving, publishing under back pressure, waiting for
//! stability) runs with the interpreter detached (the GIL released), in slices of
//! [`WAIT_SLICE`] between which pending signals are handled, so Ctrl-C interrupts it.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod errors;
mod node;
mod publish;
mod subscribe;
mod waker;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Longest stretch a blocking call waits with the interpreter detached before it checks for
/// signals (Ctrl-C): short enough to feel immediate, long enough to cost nothing.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Threads that are, or are about to be, outside the interpreter and will attach to it again:
/// calls from Python waiting detached, and the asyncio waker calling into Python. A thread that
/// attaches once the interpreter is finalizing is ended by CPython through its Rust frames, which
/// aborts the process; so at exit the package closes the nodes, calls `begin_exit()` and waits
/// until this is zero (`waiting()`), after which no thread leaves the interpreter to come back.
static OUTSIDE: AtomicUsize = AtomicUsize::new(0);

/// Set by `begin_exit()`: the interpreter is about to finalize, so no call detaches from it any
/// more (a wait on a closed node ends at once, attached) and the waker calls nothing.
static EXITING: AtomicBool = AtomicBool::new(false);

/// A thread counted in [`OUTSIDE`] until it is dropped.
pub(crate) struct Outside(());

impl Outside {
    /// Counts this thread out of the interpreter, unless the interpreter is exiting (`None`).
    /// Count first, then check (both `SeqCst`): either `begin_exit` sees this thread counted and
    /// waits for it, or this thread sees `EXITING` and stays.
    pub(crate) fn enter() -> Option<Self> {
        OUTSIDE.fetch_add(1, Ordering::SeqCst);
        let outside = Self(());
        (!EXITING.load(Ordering::SeqCst)).then_some(outside)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        OUTSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `f` with the interpreter detached (the GIL released), counted in [`OUTSIDE`]; once the
/// interpreter is exiting, `f` runs attached instead.
pub(crate) fn detached<T: Send, F: Send + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    match Outside::enter() {
        Some(_outside) => py.detach(f),
        None => f(),
    }
}

/// Marks the interpreter as exiting (see [`EXITING`]); called at exit once the nodes are closed.
#[pyfunction]
fn begin_exit() {
    EXITING.store(true, Ordering::SeqCst);
}

/// How many threads are outside the interpreter and will attach again (see [`OUTSIDE`]).
#[pyfunction]
fn waiting() -> usize {
    OUTSIDE.load(Ordering::SeqCst)
}

/// A timeout from Python (seconds, `None` for no limit) as a duration; a clear error for a
/// negative or non-finite one.
pub(crate) fn timeout_from(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) => Duration::try_from_secs_f64(s).map(Some).map_err(|_| {
            errors::to_py(tidings::RequestError::Config(format!(
                "timeout = {s} must be a finite number of seconds >= 0"
            )))
        }),
    }
}

/// The instant `timeout` from now, if any.
#[allow(clippy::disallowed_methods)] // the wait is the application's, in wall time
pub(crate) fn deadline_in(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// The next slice of a wait until `deadline`, `None` once it has passed.
#[allow(clippy::disallowed_methods)] // the wait is the application's, in wall time
pub(crate) fn next_slice(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(WAIT_SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(WAIT_SLICE))
        }
    }
}

/// Checks a topic name as the library does (1..=`TOPIC_NAME_BYTES_MAX` bytes of UTF-8):
/// raises `TopicNameError` with the library's message if it is not one.
#[pyfunction]
fn check_topic_name(name: &str) -> PyResult<()> {
    tidings::Topic::raw(name).map(drop).map_err(errors::to_py)
}

/// The extension module.
#[pymodule]
fn _tidings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TOPIC_NAME_BYTES_MAX", tidings::TOPIC_NAME_BYTES_MAX)?;
    m.add("LOCAL_GMS_PORT", tidings::LOCAL_GMS_PORT)?;
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(check_topic_name, m)?)?;
    m.add_function(wrap_pyfunction!(waiting, m)?)?;
    m.add_function(wrap_pyfunction!(begin_exit, m)?)?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<publish::PyPublisher>()?;
    m.add_class::<publish::PyPublishHandle>()?;
    m.add_class::<subscribe::PySubscription>()?;
    m.add_class::<subscribe::PyMessage>()?;
    m.add_class::<subscribe::PyWorkerSubscription>()?;
    Ok(())
}
