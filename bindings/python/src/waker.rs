//! Wakers for asyncio: a Rust future polled from Python wakes its asyncio task through a
//! Python callable (which calls `loop.call_soon_threadsafe`).
//!
//! A waker is woken on the library's threads (a delivery worker, the node's core thread), which
//! must never wait for the interpreter: a wake only queues the callable for one helper thread,
//! `tidings-asyncio-waker`, which attaches to the interpreter and calls what is queued. That
//! thread is started by the first wake and stays for the life of the process; once the
//! interpreter is exiting (`begin_exit`) it no longer attaches and drops what it is given.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::prelude::*;

/// The callable a waker calls, shared by the waker's clones.
struct PyWake {
    callback: Arc<Py<PyAny>>,
}

impl Wake for PyWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(queue) = helper() {
            // The queue is gone only if the helper thread could not start: nothing to wake then.
            let _ = queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(Arc::clone(&self.callback));
        }
    }
}

/// Where wakes are queued for the helper thread.
type Queue = Mutex<Sender<Arc<Py<PyAny>>>>;

/// The helper thread's queue (started on first use); `None` if no thread could be started.
fn helper() -> Option<&'static Queue> {
    static QUEUE: OnceLock<Option<Queue>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (sender, receiver) = channel();
            std::thread::Builder::new()
                .name("tidings-asyncio-waker".to_owned())
                .spawn(move || run(&receiver))
                .ok()
                .map(|_| Mutex::new(sender))
        })
        .as_ref()
}

/// Calls the queued callables, as many as are queued per attachment to the interpreter.
fn run(receiver: &Receiver<Arc<Py<PyAny>>>) {
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        batch.extend(receiver.try_iter());
        // Counted out of the interpreter while it calls into it, so that the exit waits for
        // it; once the interpreter is exiting nothing is called.
        let called = crate::Outside::enter().and_then(|_outside| {
            Python::try_attach(|py| {
                for callback in batch.drain(..) {
                    if let Err(e) = callback.call0(py) {
                        // The callable is the package's own and catches what it expects (a
                        // closed loop); anything else is a bug worth seeing, not stopping for.
                        e.write_unraisable(py, None);
                    }
                }
            })
        });
        if called.is_none() {
            // The interpreter is exiting: nobody is left to wake. The callables are leaked
            // rather than released without the interpreter.
            std::mem::forget(batch);
        }
    }
}

/// Polls `future` once with a waker that calls `callback` (from the helper thread, attached)
/// when the future can make progress.
pub(crate) fn poll_once<F: std::future::Future>(future: F, callback: Py<PyAny>) -> Poll<F::Output> {
    let waker = Waker::from(Arc::new(PyWake {
        callback: Arc::new(callback),
    }));
    let mut cx = Context::from_waker(&waker);
    let future = std::pin::pin!(future);
    future.poll(&mut cx)
}
