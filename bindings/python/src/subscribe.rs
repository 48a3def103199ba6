//! `_tidings.Subscription` and `_tidings.Message`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::errors::to_py;
use crate::{deadline_in, next_slice, timeout_from, waker};

type Item = Result<tidings::Message<Bytes>, tidings::RecvError>;

/// One delivered message.
#[pyclass(name = "Message", module = "tidings._tidings", frozen, get_all)]
pub(crate) struct PyMessage {
    /// The value, decoded by the subscription's codec (bytes on a bytes topic).
    value: Py<PyAny>,
    /// The id of the node that published it.
    origin: u32,
    /// The topic's name.
    topic: Py<PyString>,
    /// The topic's id (bound to its name by the membership service).
    topic_id: u32,
    /// When it was published, in microseconds since the Unix epoch by the publisher's clock
    /// (its wall clock read once when its process started, advanced monotonically).
    sent_at_us: u64,
}

#[pymethods]
impl PyMessage {
    fn __repr__(&self, py: Python<'_>) -> String {
        let value = self
            .value
            .bind(py)
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        format!(
            "Message(topic={:?}, origin={}, value={value})",
            self.topic.bind(py).to_string(),
            self.origin
        )
    }
}

/// A subscription read from its queue (the Rust `tidings::Subscription`); wrapped by
/// `tidings.Subscription`.
#[pyclass(name = "Subscription", module = "tidings._tidings", frozen)]
pub(crate) struct PySubscription {
    /// `None` once closed (unsubscribed).
    inner: Mutex<Option<Arc<tidings::Subscription<Bytes>>>>,
    /// Items taken from the queue but not yet handed out (the rest of a batch whose decoding
    /// failed part way), in order: every receive takes from here first.
    taken: Mutex<VecDeque<Item>>,
    decoder: Decoder,
    topic_id: u32,
}

/// Turns a topic's received messages into Python `Message` objects.
pub(crate) struct Decoder {
    /// The topic's name, shared by its messages.
    name: Py<PyString>,
    name_str: String,
    /// The codec's `decode`, or `None` for a bytes topic.
    decode: Option<Py<PyAny>>,
}

impl Decoder {
    /// The decoder of the topic `name`, with the codec's `decode` (`None`: bytes as they are).
    pub(crate) fn new(py: Python<'_>, name: String, decode: Option<Py<PyAny>>) -> Self {
        Decoder {
            name: PyString::new(py, &name).unbind(),
            name_str: name,
            decode,
        }
    }

    /// The topic's name.
    pub(crate) fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    /// A message as Python sees it, its value decoded by the codec (`DecodeError` if the codec
    /// raises).
    pub(crate) fn message(
        &self,
        py: Python<'_>,
        message: &tidings::Message<Bytes>,
    ) -> PyResult<PyMessage> {
        let value = match &self.decode {
            None => PyBytes::new(py, &message.value).into_any().unbind(),
            Some(decode) => {
                let bytes = PyBytes::new(py, &message.value);
                decode.bind(py).call1((bytes,)).map_err(|e| {
                    let err = to_py(tidings::RecvError::Decode {
                        topic: self.name_str.clone(),
                        why: crate::errors::exception_text(py, &e),
                    });
                    err.set_cause(py, Some(e));
                    err
                })?
            }
            .unbind(),
        };
        Ok(PyMessage {
            value,
            origin: message.origin.0,
            topic: self.name.clone_ref(py),
            topic_id: message.topic.0,
            sent_at_us: message.sent_at_us,
        })
    }
}

fn lock<U>(m: &Mutex<U>) -> MutexGuard<'_, U> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PySubscription {
    pub(crate) fn new(
        py: Python<'_>,
        subscription: Arc<tidings::Subscription<Bytes>>,
        name: String,
        decode: Option<Py<PyAny>>,
    ) -> Self {
        PySubscription {
            topic_id: subscription.topic_id().0,
            inner: Mutex::new(Some(subscription)),
            taken: Mutex::new(VecDeque::new()),
            decoder: Decoder::new(py, name, decode),
        }
    }

    /// The subscription, or `ClosedError` once closed.
    fn inner(&self) -> PyResult<Arc<tidings::Subscription<Bytes>>> {
        lock(&self.inner)
            .clone()
            .ok_or_else(|| to_py(tidings::RecvError::Closed))
    }

    /// A received item as Python sees it: a message with its value decoded, or the error.
    fn convert(&self, py: Python<'_>, item: Item) -> PyResult<PyMessage> {
        self.message(py, &item.map_err(to_py)?)
    }

    /// Puts items taken but not handed out back in front of the next receive, in order.
    fn keep(&self, items: VecDeque<Item>) {
        if !items.is_empty() {
            let mut taken = lock(&self.taken);
            for item in items.into_iter().rev() {
                taken.push_front(item);
            }
        }
    }

    /// A message as Python sees it, its value decoded by the codec.
    fn message(&self, py: Python<'_>, message: &tidings::Message<Bytes>) -> PyResult<PyMessage> {
        self.decoder.message(py, message)
    }

    /// The next item: one already queued at once, else waits (detached, in slices between
    /// which signals are handled) at most until `deadline`.
    fn wait(&self, py: Python<'_>, deadline: Option<Instant>) -> PyResult<Item> {
        if let Some(item) = lock(&self.taken).pop_front() {
            return Ok(item);
        }
        loop {
            // Looked up again each slice, so that a close from another thread ends the wait.
            let inner = self.inner()?;
            // What is queued is taken without detaching (a queue's pop never waits), also
            // once out of time.
            match inner.try_recv() {
                Err(tidings::RecvError::Empty) => {}
                item => return Ok(item),
            }
            let Some(slice) = next_slice(deadline) else {
                return Ok(Err(tidings::RecvError::Timeout));
            };
            match crate::detached(py, || inner.recv_timeout(slice)) {
                Err(tidings::RecvError::Timeout) => py.check_signals()?,
                item => return Ok(item),
            }
        }
    }
}

#[pymethods]
impl PySubscription {
    /// The topic's name.
    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.decoder.name(py)
    }

    /// The topic's id.
    #[getter]
    fn topic_id(&self) -> u32 {
        self.topic_id
    }

    /// Messages queued and not yet taken.
    #[getter]
    fn queued(&self) -> usize {
        let taken = lock(&self.taken).len();
        taken + lock(&self.inner).as_ref().map_or(0, |s| s.queued())
    }

    /// Whether the subscription is its topic's bottleneck now (its queue is full, so the
    /// topic's streams are held at this node): for how many seconds (`None`: it is not), and
    /// how many times it has been. Raises `ClosedError` once closed.
    fn bottleneck(&self) -> PyResult<(Option<f64>, u64)> {
        let state = self.inner()?.bottleneck();
        Ok((state.since.map(|d| d.as_secs_f64()), state.times))
    }

    /// Changes the share of the delivery workers' time this subscription's deliveries get when
    /// topics compete, in (0, 1] (the node's `subscription_share` until changed). Raises
    /// `ConfigError` for a share outside it, `ClosedError` once closed.
    fn set_share(&self, share: f64) -> PyResult<()> {
        self.inner()?.set_share(share).map_err(to_py)
    }

    /// Whether the subscription has been closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// The next message, waiting (with the interpreter detached) at most `timeout` seconds
    /// (`None`: as long as it takes). Raises `TimeoutError` if none came, `ClosedError` once the
    /// subscription has ended and every queued message was taken, `DecodeError` or
    /// `SlowConsumerError` in place of a message.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyMessage> {
        let deadline = deadline_in(timeout_from(timeout)?);
        let item = self.wait(py, deadline)?;
        self.convert(py, item)
    }

    /// The next message if one is queued; raises `EmptyError` if none is.
    fn try_recv(&self, py: Python<'_>) -> PyResult<PyMessage> {
        let item = match lock(&self.taken).pop_front() {
            Some(item) => item,
            None => self.inner()?.try_recv(),
        };
        self.convert(py, item)
    }

    /// Up to `n` messages: waits (detached) at most `timeout` seconds for the first (`None`: as
    /// long as it takes), then takes the others already queued without waiting. Returns an
    /// empty list if none came in time. An error in place of a message ends the batch before
    /// it and is raised by the next call (or by this one if it is first).
    #[pyo3(signature = (n, timeout=None))]
    fn recv_many<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        if n == 0 {
            return Err(to_py(tidings::RequestError::Config(
                "recv_many: n = 0 must be at least 1".to_owned(),
            )));
        }
        let deadline = deadline_in(timeout_from(timeout)?);
        let first = match self.wait(py, deadline)? {
            Err(tidings::RecvError::Timeout) => return Ok(PyList::empty(py)),
            item => item,
        };
        let mut items = VecDeque::with_capacity(n.min(4096));
        items.push_back(first);
        {
            let mut taken = lock(&self.taken);
            while items.len() < n {
                match taken.pop_front() {
                    Some(item) => items.push_back(item),
                    None => break,
                }
            }
        }
        if items.len() < n {
            // Attached: taking what is queued never waits. The queued messages in one take,
            // then one look at what follows them (an error or the end comes on its own).
            if let Ok(inner) = self.inner() {
                let mut messages = Vec::with_capacity((n - items.len()).min(4096));
                let ended = match inner.try_recv_many(&mut messages, n - items.len()) {
                    Ok(_) | Err(tidings::RecvError::Empty) => false,
                    // Ends the batch (no message came with it): an end, or an error for the
                    // next call to raise.
                    Err(e) => {
                        items.push_back(Err(e));
                        true
                    }
                };
                items.extend(messages.into_iter().map(Ok));
                if !ended && items.len() < n {
                    match inner.try_recv() {
                        Err(tidings::RecvError::Empty) => {}
                        item => items.push_back(item),
                    }
                }
            }
        }
        let list = PyList::empty(py);
        while let Some(item) = items.pop_front() {
            match item {
                Ok(message) => match self.message(py, &message) {
                    Ok(m) => list.append(m)?,
                    Err(e) if list.is_empty() => {
                        self.keep(items);
                        return Err(e);
                    }
                    Err(_) => {
                        // Decoding failed part way: this message comes first next call, which
                        // decodes it again and raises.
                        items.push_front(Ok(message));
                        break;
                    }
                },
                // The end after messages: the next call finds the subscription ended again.
                Err(tidings::RecvError::Closed) if !list.is_empty() => break,
                Err(e) if list.is_empty() => {
                    self.keep(items);
                    return Err(to_py(e));
                }
                Err(e) => {
                    items.push_front(Err(e));
                    break;
                }
            }
        }
        self.keep(items);
        Ok(list)
    }

    /// The next message if one is queued, else registers `wake` (called from another thread
    /// once one may be) and returns `None`: one step of `recv_async`.
    fn poll_recv(&self, py: Python<'_>, wake: Py<PyAny>) -> PyResult<Option<PyMessage>> {
        if let Some(item) = lock(&self.taken).pop_front() {
            return self.convert(py, item).map(Some);
        }
        let inner = self.inner()?;
        match waker::poll_once(inner.recv_async(), wake) {
            Poll::Ready(item) => self.convert(py, item).map(Some),
            Poll::Pending => Ok(None),
        }
    }

    /// Unsubscribes: later receives raise `ClosedError`. Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let inner = lock(&self.inner).take();
        lock(&self.taken).clear();
        // Unsubscribing tells the node, which may take a moment: detached.
        crate::detached(py, || drop(inner));
    }
}

/// A subscription whose callable runs on the node's delivery workers (the Rust
/// `tidings::CallbackSubscription` of `Node::subscribe_many_with`); wrapped by
/// `tidings.WorkerSubscription`.
#[pyclass(name = "WorkerSubscription", module = "tidings._tidings", frozen)]
pub(crate) struct PyWorkerSubscription {
    /// `None` once closed (unsubscribed).
    inner: Mutex<Option<tidings::CallbackSubscription>>,
    name: Py<PyString>,
    topic_id: u32,
}

impl PyWorkerSubscription {
    pub(crate) fn new(
        py: Python<'_>,
        subscription: tidings::CallbackSubscription,
        name: &str,
    ) -> Self {
        PyWorkerSubscription {
            topic_id: subscription.topic_id().0,
            inner: Mutex::new(Some(subscription)),
            name: PyString::new(py, name).unbind(),
        }
    }
}

/// What a delivery worker runs for each message of a topic of `Node.subscribe_many`: attached
/// to the interpreter (counted outside it meanwhile, see [`crate::Outside`]), it calls `deliver`
/// with the `Message`, or with the exception that took its place (`DecodeError`...). Once the
/// interpreter is exiting it calls nothing.
pub(crate) fn deliver_to(
    decoder: Decoder,
    deliver: Py<PyAny>,
) -> impl FnMut(Item) + Send + 'static {
    move |item| {
        let Some(_outside) = crate::Outside::enter() else {
            return;
        };
        let _ = Python::try_attach(|py| {
            let arg = match item.map_err(to_py).and_then(|m| decoder.message(py, &m)) {
                Ok(message) => Py::new(py, message).map(Py::into_any),
                Err(e) => Ok(e.into_value(py).into_any()),
            };
            // `deliver` is the package's own and reports what the application's callback
            // raises; anything else is a bug worth seeing, not stopping the worker for.
            if let Err(e) = arg.and_then(|arg| deliver.call1(py, (arg,))) {
                e.write_unraisable(py, None);
            }
        });
    }
}

#[pymethods]
impl PyWorkerSubscription {
    /// The topic's name.
    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    /// The topic's id.
    #[getter]
    fn topic_id(&self) -> u32 {
        self.topic_id
    }

    /// Whether the subscription has been closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// Changes the share of the delivery workers' time this subscription's callable gets when
    /// topics compete, in (0, 1]. Raises `ConfigError` for a share outside it, `ClosedError`
    /// once closed.
    fn set_share(&self, share: f64) -> PyResult<()> {
        lock(&self.inner)
            .as_ref()
            .ok_or_else(|| to_py(tidings::RecvError::Closed))?
            .set_share(share)
            .map_err(to_py)
    }

    /// Unsubscribes: messages not yet delivered are dropped (a call already running
    /// finishes). Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let inner = lock(&self.inner).take();
        crate::detached(py, || drop(inner));
    }
}
