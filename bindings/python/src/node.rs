//! `_tidings.Node`: one process's membership in the group.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;
use crate::publish::PyPublisher;
use crate::subscribe::{deliver_to, Decoder, PySubscription, PyWorkerSubscription};

/// A node (the Rust `tidings::Node`). The Python class `tidings.Node` wraps it; see there.
#[pyclass(name = "Node", module = "tidings._tidings", frozen)]
pub(crate) struct PyNode {
    /// `None` once closed.
    node: Mutex<Option<tidings::Node>>,
    id: u32,
    local_addr: String,
    gms_addrs: Vec<String>,
}

/// A `host:port` address from Python (a name is resolved; its first address is taken).
fn parse_addr(what: &str, text: &str) -> PyResult<SocketAddr> {
    let bad = |why: String| {
        to_py(tidings::StartError::Config(format!(
            "{what} = {text:?} is not a host:port address: {why}"
        )))
    };
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| bad("the name has no address".to_owned())),
        Err(e) => Err(bad(e.to_string())),
    }
}

impl PyNode {
    /// The node, or `ClosedError` once closed.
    fn node(&self) -> PyResult<MutexGuard<'_, Option<tidings::Node>>> {
        let guard = self
            .node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.is_none() {
            return Err(to_py(tidings::RequestError::Closed));
        }
        Ok(guard)
    }
}

/// A node dropped without `close` (its last reference gone, or the interpreter exiting) leaves
/// the group with the interpreter detached, so other Python threads run meanwhile.
impl Drop for PyNode {
    fn drop(&mut self) {
        let node = self
            .node
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(node) = node {
            // Not attached (the interpreter is shutting down): dropped as it is.
            let _ = Python::try_attach(|py| crate::detached(py, || drop(node)));
        }
    }
}

#[pymethods]
impl PyNode {
    /// Starts a node and joins the group.
    ///
    /// `gms` is where the membership service is: `"local"` (the host's shared service at
    /// `127.0.0.1:LOCAL_GMS_PORT`, embedded by the first node to start, the Rust default),
    /// `"private"` (a service of the node's own on a free loopback port), `"embed"` (a service
    /// of the node's own bound to `gms_addrs[0]`) or `"connect"` (join the service, or the
    /// replicated service's replicas in order, at `gms_addrs`).
    #[new]
    #[allow(clippy::too_many_arguments)] // the Python constructor's arguments, one per setting
    #[pyo3(signature = (gms, gms_addrs, bind, transport, subscription_capacity, subscription_share, metrics=None))]
    fn new(
        py: Python<'_>,
        gms: &str,
        gms_addrs: Vec<String>,
        bind: &str,
        transport: &str,
        subscription_capacity: usize,
        subscription_share: f64,
        metrics: Option<&str>,
    ) -> PyResult<Self> {
        let addrs = gms_addrs
            .iter()
            .map(|a| parse_addr("gms", a))
            .collect::<PyResult<Vec<_>>>()?;
        let mut builder = tidings::Node::builder()
            .bind(parse_addr("bind", bind)?)
            .subscription_capacity(subscription_capacity)
            .subscription_share(subscription_share);
        builder = match (gms, addrs.as_slice()) {
            ("local", []) => builder,
            ("private", []) => builder.private_gms(),
            ("embed", [addr]) => builder.embedded_gms(*addr, tidings::GmsConfig::default()),
            ("connect", [_, ..]) => builder.gms_replicas(&addrs),
            _ => {
                return Err(to_py(tidings::StartError::Config(format!(
                    "gms = {gms:?} with {} addresses: expected local or private (none), embed \
                     (one address) or connect (one or more)",
                    addrs.len()
                ))))
            }
        };
        builder = match transport {
            "unicast" => builder.transport(tidings::Transport::Unicast),
            "multicast" => builder.transport(tidings::Transport::Multicast(
                tidings::MulticastConfig::default(),
            )),
            other => {
                return Err(to_py(tidings::StartError::Config(format!(
                    "transport = {other:?} must be \"unicast\" or \"multicast\""
                ))))
            }
        };
        if let Some(metrics) = metrics {
            builder = builder.metrics(parse_addr("metrics", metrics)?);
        }
        let node = crate::detached(py, || builder.start()).map_err(to_py)?;
        Ok(PyNode {
            id: node.id().0,
            local_addr: node.local_addr().to_string(),
            gms_addrs: node.gms_addrs().iter().map(ToString::to_string).collect(),
            node: Mutex::new(Some(node)),
        })
    }

    /// This node's id (given by the membership service).
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// The node's unicast address, `host:port`.
    #[getter]
    fn local_addr(&self) -> &str {
        &self.local_addr
    }

    /// The membership service's replicas' addresses (one unless it is replicated).
    #[getter]
    fn gms_addrs(&self) -> Vec<String> {
        self.gms_addrs.clone()
    }

    /// Where the node serves its metrics, if it does.
    #[getter]
    fn metrics_addr(&self) -> PyResult<Option<String>> {
        Ok(self
            .node()?
            .as_ref()
            .and_then(tidings::Node::metrics_addr)
            .map(|a| a.to_string()))
    }

    /// Whether the node has been closed.
    #[getter]
    fn closed(&self) -> bool {
        self.node().is_err()
    }

    /// A publisher on the bytes topic `name`; `encode` (a callable, or `None` for bytes as
    /// they are) turns a published value into bytes.
    #[pyo3(signature = (name, encode=None))]
    fn publisher(
        &self,
        py: Python<'_>,
        name: String,
        encode: Option<Py<PyAny>>,
    ) -> PyResult<PyPublisher> {
        let topic = tidings::Topic::raw(name.clone()).map_err(to_py)?;
        let guard = self.node()?;
        let node = guard
            .as_ref()
            .ok_or_else(|| to_py(tidings::RequestError::Closed))?;
        let publisher = crate::detached(py, || node.publisher(&topic)).map_err(to_py)?;
        Ok(PyPublisher::new(publisher, name, encode))
    }

    /// Publishers of the bytes topics `topics` (pairs of a name and its `encode`, as for
    /// `publisher`), in their order: the membership service is told in batches, one
    /// membership update per batch, so a node publishing on thousands of topics starts in time
    /// linear in their number.
    fn publishers(
        &self,
        py: Python<'_>,
        topics: Vec<(String, Option<Py<PyAny>>)>,
    ) -> PyResult<Vec<PyPublisher>> {
        let raw = topics
            .iter()
            .map(|(name, _)| tidings::Topic::raw(name.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_py)?;
        let guard = self.node()?;
        let node = guard
            .as_ref()
            .ok_or_else(|| to_py(tidings::RequestError::Closed))?;
        let publishers = crate::detached(py, || node.publishers(&raw)).map_err(to_py)?;
        Ok(publishers
            .into_iter()
            .zip(topics)
            .map(|(publisher, (name, encode))| PyPublisher::new(publisher, name, encode))
            .collect())
    }

    /// Subscribes to the bytes topic `name`, read from a queue of `capacity` messages (`None`:
    /// the node's `subscription_capacity`); a full queue slows the topic down, or with
    /// `disconnect_after` (seconds) disconnects the subscription if it stays full that long.
    /// `decode` (a callable, or `None` for bytes as they are) turns received bytes into a
    /// value.
    #[pyo3(signature = (name, capacity=None, disconnect_after=None, decode=None))]
    fn subscribe(
        &self,
        py: Python<'_>,
        name: String,
        capacity: Option<usize>,
        disconnect_after: Option<f64>,
        decode: Option<Py<PyAny>>,
    ) -> PyResult<PySubscription> {
        let topic = tidings::Topic::raw(name.clone()).map_err(to_py)?;
        let policy = match crate::timeout_from(disconnect_after)? {
            None => tidings::SlowConsumerPolicy::SlowDown,
            Some(max_wait) => tidings::SlowConsumerPolicy::Disconnect { max_wait },
        };
        let guard = self.node()?;
        let node = guard
            .as_ref()
            .ok_or_else(|| to_py(tidings::RequestError::Closed))?;
        let subscription: tidings::Subscription<Bytes> = crate::detached(py, || {
            let mut builder = node.subscription(&topic).slow_consumer(policy);
            if let Some(capacity) = capacity {
                builder = builder.capacity(capacity);
            }
            builder.subscribe()
        })
        .map_err(to_py)?;
        Ok(PySubscription::new(
            py,
            Arc::new(subscription),
            name,
            decode,
        ))
    }

    /// Subscribes to every bytes topic of `topics` (triples of a name, its `decode` as for
    /// `subscribe`, and a `deliver` callable), the callables running on the node's delivery
    /// workers (the Rust `Node::subscribe_many_with`): `deliver(message)` for each message in
    /// order, or `deliver(exception)` for an error in its place. The membership service takes
    /// them in batches, one membership update per batch, so subscribing to thousands of topics
    /// takes time linear in their number. Returns once all are in force, in the order of
    /// `topics`; on an error none is kept.
    fn subscribe_many(
        &self,
        py: Python<'_>,
        topics: Vec<(String, Option<Py<PyAny>>, Py<PyAny>)>,
    ) -> PyResult<Vec<PyWorkerSubscription>> {
        let raw = topics
            .iter()
            .map(|(name, _, _)| tidings::Topic::raw(name.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_py)?;
        let names: Vec<String> = topics.iter().map(|(name, _, _)| name.clone()).collect();
        let mut callables: Vec<Option<(Decoder, Py<PyAny>)>> = topics
            .into_iter()
            .map(|(name, decode, deliver)| Some((Decoder::new(py, name, decode), deliver)))
            .collect();
        let guard = self.node()?;
        let node = guard
            .as_ref()
            .ok_or_else(|| to_py(tidings::RequestError::Closed))?;
        let subscriptions = crate::detached(py, || {
            node.subscribe_many_with(&raw, |i| {
                let (decoder, deliver) = callables[i]
                    .take()
                    .expect("subscribe_many_with asks for each topic's callback once");
                deliver_to(decoder, deliver)
            })
        })
        .map_err(to_py)?;
        Ok(subscriptions
            .into_iter()
            .zip(&names)
            .map(|(subscription, name)| PyWorkerSubscription::new(py, subscription, name))
            .collect())
    }

    /// A few of the node's counters, by name.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self.node()?;
        let node = guard
            .as_ref()
            .ok_or_else(|| to_py(tidings::RequestError::Closed))?;
        let stats = crate::detached(py, || node.stats()).map_err(to_py)?.runtime;
        let dict = PyDict::new(py);
        dict.set_item("datagrams_received", stats.datagrams_received)?;
        dict.set_item("bytes_received", stats.bytes_received)?;
        dict.set_item("kernel_drops", stats.kernel_drops)?;
        dict.set_item("recv_calls", stats.recv_calls)?;
        dict.set_item("cycles", stats.cycles)?;
        Ok(dict)
    }

    /// Leaves the group and stops (the embedded membership service, if any, too); waits with
    /// the interpreter detached. Closing a closed node does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let node = self
            .node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match node {
            Some(node) => crate::detached(py, || node.shutdown())
                .map(|_| ())
                .map_err(to_py),
            None => Ok(()),
        }
    }
}
