//! `_tidings.Publisher` and `_tidings.PublishHandle`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::errors::{exception_text, to_py};
use crate::{deadline_in, next_slice, timeout_from, waker};

type Shared = Arc<Mutex<tidings::Publisher<Bytes>>>;

fn lock<U>(m: &Mutex<U>) -> MutexGuard<'_, U> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Smallest and largest chunk of a publisher's [`Arena`]: a publisher starts small and doubles
/// its chunks as it publishes, so that a rarely used one holds little.
const CHUNK_BYTES_MIN: usize = 1024;
const CHUNK_BYTES_MAX: usize = 64 * 1024;

/// Most bytes of full chunks an [`Arena`] keeps for reuse: above the 16 MiB that the default
/// credit window (16,384 unstable messages) holds of 1000-byte messages, so that a publisher
/// held by its window reuses its chunks rather than allocating new ones.
const RETIRED_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Where a publisher's payloads are copied: one after another into a chunk, each split off as
/// a message's payload, so that a run of messages shares one allocation. A full chunk is kept
/// and used again once every payload in it has been released (its messages are stable), so a
/// busy publisher cycles through the same memory instead of allocating (and faulting in) new.
#[derive(Default)]
struct Arena {
    /// The chunk being filled, and its size.
    current: BytesMut,
    current_bytes: usize,
    /// Full chunks, oldest first (its messages become stable first), with their sizes.
    retired: VecDeque<(BytesMut, usize)>,
    retired_bytes: usize,
}

impl Arena {
    /// `data` copied into the arena, as a message's payload.
    fn copy_in(&mut self, data: &[u8]) -> Bytes {
        if self.current.capacity() < data.len() {
            self.next_chunk(data.len());
        }
        self.current.extend_from_slice(data);
        self.current.split().freeze()
    }

    /// Retires the current chunk and takes the oldest retired one if it is free and fits
    /// `len` bytes, else a new chunk twice the size of the last (within the bounds).
    fn next_chunk(&mut self, len: usize) {
        let full = std::mem::take(&mut self.current);
        if self.current_bytes > 0 {
            self.retired.push_back((full, self.current_bytes));
            self.retired_bytes += self.current_bytes;
        }
        if let Some((chunk, size)) = self.retired.front_mut() {
            if *size >= len && chunk.try_reclaim(*size) {
                let size = *size;
                self.current = self.retired.pop_front().map(|(c, _)| c).unwrap_or_default();
                self.current_bytes = size;
                self.retired_bytes -= size;
                return;
            }
        }
        // Past the bound the oldest are let go: each is freed once its last payload is.
        while self.retired_bytes > RETIRED_BYTES_MAX {
            match self.retired.pop_front() {
                Some((_, size)) => self.retired_bytes -= size,
                None => break,
            }
        }
        let size = (self.current_bytes * 2)
            .clamp(CHUNK_BYTES_MIN, CHUNK_BYTES_MAX)
            .max(len);
        self.current = BytesMut::with_capacity(size);
        self.current_bytes = size;
    }
}

/// A publisher on one topic (the Rust `tidings::Publisher`); wrapped by `tidings.Publisher`.
#[pyclass(name = "Publisher", module = "tidings._tidings", frozen)]
pub(crate) struct PyPublisher {
    inner: Shared,
    name: String,
    topic_id: u32,
    max_payload: usize,
    /// The codec's `encode`, or `None` for a bytes topic.
    encode: Option<Py<PyAny>>,
    /// Where payloads are copied. Never locked while calling into Python.
    arena: Mutex<Arena>,
}

impl PyPublisher {
    pub(crate) fn new(
        publisher: tidings::Publisher<Bytes>,
        name: String,
        encode: Option<Py<PyAny>>,
    ) -> Self {
        PyPublisher {
            topic_id: publisher.topic_id().0,
            max_payload: publisher.max_payload(),
            inner: Arc::new(Mutex::new(publisher)),
            name,
            encode,
            arena: Mutex::new(Arena::default()),
        }
    }

    /// `data` copied into the publisher's arena, as a message's payload. Copying (rather than
    /// keeping the Python object) lets Python free its object at once, and the payload is
    /// released by the node's threads without the interpreter.
    fn copy_in(&self, data: &[u8]) -> Bytes {
        lock(&self.arena).copy_in(data)
    }

    fn handle(&self, handle: tidings::PublishHandle) -> PyPublishHandle {
        PyPublishHandle {
            publisher: Arc::clone(&self.inner),
            handle,
        }
    }
}

#[pymethods]
impl PyPublisher {
    /// The topic's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The topic's id, as the membership service bound it.
    #[getter]
    fn topic_id(&self) -> u32 {
        self.topic_id
    }

    /// Largest encoded message accepted, in bytes.
    #[getter]
    fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Messages this publisher has published.
    #[getter]
    fn published_count(&self) -> u64 {
        lock(&self.inner).published_count()
    }

    /// `value` encoded by the topic's codec (bytes as they are on a bytes topic); raises
    /// `EncodeError` if it cannot be.
    fn encode<'py>(&self, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.encode_value(value)?;
        Ok(PyBytes::new(value.py(), &bytes))
    }

    /// Publishes `value`, waiting (with the interpreter detached) while back pressure holds,
    /// at most `timeout` seconds (`None`: as long as it takes). Returns the message's handle.
    #[pyo3(signature = (value, timeout=None))]
    fn publish(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<PyPublishHandle> {
        let bytes = self.encode_value(value)?;
        let deadline = deadline_in(timeout_from(timeout)?);
        let handle = self.publish_waiting(py, &bytes, deadline)?;
        Ok(self.handle(handle))
    }

    /// Publishes every value of the iterable `values` in order, as `publish` does each (waiting
    /// under back pressure, the whole call at most `timeout` seconds), in one call: a loop
    /// that pays the interpreter's per-call cost once. Returns the last message's handle
    /// (stable means every earlier one is too), `None` for no values. If it raises, the values
    /// before the failing one were published (`published_count` says how many).
    #[pyo3(signature = (values, timeout=None))]
    fn publish_many(
        &self,
        py: Python<'_>,
        values: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Option<PyPublishHandle>> {
        let deadline = deadline_in(timeout_from(timeout)?);
        let mut last = None;
        for value in values.try_iter()? {
            let bytes = self.encode_value(&value?)?;
            last = Some(self.publish_waiting(py, &bytes, deadline)?);
        }
        Ok(last.map(|handle| self.handle(handle)))
    }

    /// Publishes `value` without waiting: raises `WouldBlock` under back pressure.
    fn try_publish(&self, value: &Bound<'_, PyAny>) -> PyResult<PyPublishHandle> {
        let bytes = self.encode_value(value)?;
        let handle = lock(&self.inner).try_publish(&bytes).map_err(to_py)?;
        Ok(self.handle(handle))
    }

    /// Publishes the encoded `data` if there is room, else registers `wake` (called from
    /// another thread once there may be room) and returns `None`: one step of
    /// `publish_async`.
    fn poll_publish(&self, data: &[u8], wake: Py<PyAny>) -> PyResult<Option<PyPublishHandle>> {
        let bytes = self.copy_in(data);
        let mut publisher = lock(&self.inner);
        match waker::poll_once(publisher.publish_async(&bytes), wake) {
            Poll::Ready(Ok(handle)) => {
                drop(publisher);
                Ok(Some(self.handle(handle)))
            }
            Poll::Ready(Err(e)) => Err(to_py(e)),
            Poll::Pending => Ok(None),
        }
    }
}

impl PyPublisher {
    /// Publishes `bytes`, waiting (with the interpreter detached, Ctrl-C checked between
    /// slices) while back pressure holds, until `deadline`. The first attempt does not wait,
    /// so a publisher with room pays no detaching.
    fn publish_waiting(
        &self,
        py: Python<'_>,
        bytes: &Bytes,
        deadline: Option<std::time::Instant>,
    ) -> PyResult<tidings::PublishHandle> {
        match lock(&self.inner).try_publish(bytes) {
            Ok(handle) => return Ok(handle),
            Err(tidings::PublishError::WouldBlock) => {}
            Err(e) => return Err(to_py(e)),
        }
        loop {
            let Some(slice) = next_slice(deadline) else {
                return Err(to_py(tidings::PublishError::Timeout));
            };
            let inner = &self.inner;
            match crate::detached(py, || lock(inner).publish_timeout(bytes, slice)) {
                Ok(handle) => return Ok(handle),
                Err(tidings::PublishError::Timeout) => py.check_signals()?,
                Err(e) => return Err(to_py(e)),
            }
        }
    }

    /// `bytes` or `bytearray` as a payload (copied); anything else is not one.
    fn payload(&self, value: &Bound<'_, PyAny>) -> Option<Bytes> {
        if let Ok(b) = value.cast::<PyBytes>() {
            Some(self.copy_in(b.as_bytes()))
        } else if let Ok(b) = value.cast::<PyByteArray>() {
            Some(Bytes::from(b.to_vec()))
        } else {
            None
        }
    }

    fn encode_value(&self, value: &Bound<'_, PyAny>) -> PyResult<Bytes> {
        let encoded;
        let value = match &self.encode {
            None => value,
            Some(encode) => {
                encoded = encode.bind(value.py()).call1((value,)).map_err(|e| {
                    let err = to_py(tidings::PublishError::Encode(exception_text(
                        value.py(),
                        &e,
                    )));
                    err.set_cause(value.py(), Some(e));
                    err
                })?;
                &encoded
            }
        };
        self.payload(value).ok_or_else(|| {
            let what = if self.encode.is_some() {
                "the codec's encode returned"
            } else {
                "a bytes topic takes bytes or bytearray, not"
            };
            let type_name = value
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            to_py(tidings::PublishError::Encode(format!("{what} {type_name}")))
        })
    }
}

/// Identifies one published message, to wait until it (and every earlier message of its
/// publisher) is stable: received by every member of every region its topic spans. Await it
/// from asyncio, or call `wait_stable`.
#[pyclass(name = "PublishHandle", module = "tidings._tidings", frozen)]
pub(crate) struct PyPublishHandle {
    publisher: Shared,
    handle: tidings::PublishHandle,
}

#[pymethods]
impl PyPublishHandle {
    /// The message's position among its publisher's messages, from 1.
    #[getter]
    fn ticket(&self) -> u64 {
        self.handle.ticket()
    }

    /// Whether the message (and every earlier one of its publisher) is stable.
    fn is_stable(&self) -> bool {
        lock(&self.publisher).is_stable(self.handle)
    }

    /// Waits (with the interpreter detached) until the message and every earlier one of its
    /// publisher are stable, at most `timeout` seconds (`None`: as long as it takes). Raises
    /// `TimeoutError`, or `NotStableError` naming the regions that hold it back.
    #[pyo3(signature = (timeout=None))]
    fn wait_stable(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let deadline = deadline_in(timeout_from(timeout)?);
        let mut last = tidings::StableError::Timeout;
        loop {
            if self.is_stable() {
                return Ok(());
            }
            let Some(slice) = next_slice(deadline) else {
                return Err(to_py(last));
            };
            let (publisher, handle) = (&self.publisher, self.handle);
            match crate::detached(py, || lock(publisher).wait_stable(handle, slice)) {
                Ok(()) => return Ok(()),
                Err(e @ (tidings::StableError::Timeout | tidings::StableError::NotStable(_))) => {
                    last = e;
                    py.check_signals()?;
                }
                Err(e) => return Err(to_py(e)),
            }
        }
    }

    /// True if the message is stable, else registers `wake` (called from another thread
    /// once it may be) and returns false: one step of awaiting the handle.
    fn poll_stable(&self, wake: Py<PyAny>) -> PyResult<bool> {
        let publisher = lock(&self.publisher);
        match waker::poll_once(publisher.wait_stable_async(self.handle), wake) {
            Poll::Ready(Ok(())) => Ok(true),
            Poll::Ready(Err(e)) => Err(to_py(e)),
            Poll::Pending => Ok(false),
        }
    }

    /// Awaiting a handle waits until its message is stable (no time limit: bound it with
    /// `asyncio.wait_for`).
    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("tidings._aio")?
            .getattr("wait_stable")?
            .call1((slf,))?
            .call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        format!("PublishHandle(ticket={})", self.handle.ticket())
    }
}
