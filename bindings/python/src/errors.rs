//! The Python exceptions: one class per kind of the library's errors, with its message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _tidings,
    TidingsError,
    PyException,
    "Base class of every error tidings raises."
);
create_exception!(
    _tidings,
    ConfigError,
    TidingsError,
    "A configuration value cannot work; the message names the field."
);
create_exception!(
    _tidings,
    BindError,
    TidingsError,
    "The node's socket could not be bound (is the address taken, or not this host's?)."
);
create_exception!(
    _tidings,
    StartError,
    TidingsError,
    "The node could not start (socket, membership service, protocol configuration)."
);
create_exception!(
    _tidings,
    MetricsError,
    TidingsError,
    "The metrics endpoint could not start (is its address taken?)."
);
create_exception!(
    _tidings,
    GmsError,
    TidingsError,
    "The embedded membership service could not start (is its address taken?)."
);
create_exception!(
    _tidings,
    TopicNameError,
    TidingsError,
    "A topic name is empty or longer than TOPIC_NAME_BYTES_MAX bytes of UTF-8."
);
create_exception!(
    _tidings,
    WouldBlock,
    TidingsError,
    "Back pressure (from try_publish): retry once messages become stable, or use publish()."
);
create_exception!(
    _tidings,
    TimeoutError,
    TidingsError,
    "A wait ran out of time."
);
create_exception!(
    _tidings,
    EmptyError,
    TidingsError,
    "try_recv found no message queued."
);
create_exception!(
    _tidings,
    NotStableError,
    TimeoutError,
    "A wait for stability ran out of time while regions did not acknowledge the node's messages."
);
create_exception!(
    _tidings,
    TooLargeError,
    TidingsError,
    "The encoded message does not fit one datagram (attributes `len` and `max`)."
);
create_exception!(
    _tidings,
    EncodeError,
    TidingsError,
    "The value could not be encoded by the topic's codec."
);
create_exception!(
    _tidings,
    DecodeError,
    TidingsError,
    "A received message could not be decoded by the subscription's codec (attributes `topic` \
     and `why`); the message is skipped and this error takes its place."
);
create_exception!(
    _tidings,
    RefusedError,
    TidingsError,
    "The node refused the request (the message says why)."
);
create_exception!(
    _tidings,
    TopicRefusedError,
    RefusedError,
    "The membership service's access rules refused to let this node subscribe to or publish on \
     a topic (attributes `topic`, `action`: \"publish\" or \"subscribe\", and `rule`: the rule \
     that denied it, or \"no rule allows\")."
);
create_exception!(
    _tidings,
    SlowConsumerError,
    TidingsError,
    "The subscription's reader fell behind and was disconnected (attributes `topic`, \
     `capacity`, `waited` in seconds)."
);
create_exception!(
    _tidings,
    ClosedError,
    TidingsError,
    "The node has shut down, or the subscription has ended and every queued message was taken."
);
create_exception!(
    _tidings,
    ShutdownError,
    TidingsError,
    "The node's core thread panicked while shutting down (a bug; please report it)."
);

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TidingsError", py.get_type::<TidingsError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("BindError", py.get_type::<BindError>())?;
    m.add("StartError", py.get_type::<StartError>())?;
    m.add("MetricsError", py.get_type::<MetricsError>())?;
    m.add("GmsError", py.get_type::<GmsError>())?;
    m.add("TopicNameError", py.get_type::<TopicNameError>())?;
    m.add("WouldBlock", py.get_type::<WouldBlock>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("EmptyError", py.get_type::<EmptyError>())?;
    m.add("NotStableError", py.get_type::<NotStableError>())?;
    m.add("TooLargeError", py.get_type::<TooLargeError>())?;
    m.add("EncodeError", py.get_type::<EncodeError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("TopicRefusedError", py.get_type::<TopicRefusedError>())?;
    m.add("SlowConsumerError", py.get_type::<SlowConsumerError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("ShutdownError", py.get_type::<ShutdownError>())?;
    Ok(())
}

/// The Python exception for `e`, with the Rust error's message (its `Display`) and, where the
/// variant has fields, the same fields as attributes.
pub(crate) fn to_py(e: impl Into<tidings::Error>) -> PyErr {
    let e: tidings::Error = e.into();
    let message = e.to_string();
    use tidings::{Error, PublishError, RecvError, RequestError, StableError, StartError as Start};
    match e {
        Error::Start(Start::Config(_)) | Error::Request(RequestError::Config(_)) => {
            ConfigError::new_err(message)
        }
        Error::Start(Start::Bind { .. }) => BindError::new_err(message),
        Error::Start(Start::Metrics(_)) => MetricsError::new_err(message),
        Error::Start(Start::Gms(_)) => GmsError::new_err(message),
        Error::Start(_) => StartError::new_err(message),
        Error::TopicName(_) => TopicNameError::new_err(message),
        Error::Publish(PublishError::WouldBlock) => WouldBlock::new_err(message),
        Error::Stable(StableError::NotStable(_)) => NotStableError::new_err(message),
        Error::Request(RequestError::Timeout)
        | Error::Publish(PublishError::Timeout)
        | Error::Stable(StableError::Timeout)
        | Error::Recv(RecvError::Timeout) => TimeoutError::new_err(message),
        Error::Recv(RecvError::Empty) => EmptyError::new_err(message),
        Error::Publish(PublishError::TooLarge { len, max }) => {
            with_fields(TooLargeError::new_err(message), |_, v| {
                v.setattr("len", len)?;
                v.setattr("max", max)
            })
        }
        Error::Publish(PublishError::Encode(_)) => EncodeError::new_err(message),
        Error::Recv(RecvError::Decode { topic, why }) => {
            with_fields(DecodeError::new_err(message), |_, v| {
                v.setattr("topic", topic)?;
                v.setattr("why", why)
            })
        }
        Error::Request(RequestError::Refused(_)) | Error::Stable(StableError::ForeignHandle) => {
            RefusedError::new_err(message)
        }
        Error::Request(RequestError::TopicRefused {
            topic,
            action,
            rule,
        }) => with_fields(TopicRefusedError::new_err(message), |_, v| {
            v.setattr("topic", topic)?;
            v.setattr("action", action.to_string())?;
            v.setattr("rule", rule)
        }),
        Error::Recv(RecvError::SlowConsumer {
            topic,
            capacity,
            waited,
        }) => with_fields(SlowConsumerError::new_err(message), |_, v| {
            v.setattr("topic", topic)?;
            v.setattr("capacity", capacity)?;
            v.setattr("waited", waited.as_secs_f64())
        }),
        Error::Request(RequestError::Closed)
        | Error::Publish(PublishError::Closed)
        | Error::Stable(StableError::Closed)
        | Error::Recv(RecvError::Closed) => ClosedError::new_err(message),
        Error::Shutdown(_) => ShutdownError::new_err(message),
        // A kind of failure added to the library after this binding: its message, as the base.
        _ => TidingsError::new_err(message),
    }
}

/// `err` with attributes set on its value by `set` (left without them if that fails).
fn with_fields(
    err: PyErr,
    set: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<()>,
) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py).clone().into_any();
        let _ = set(py, &value);
    });
    err
}

/// What `str(exception)` says (the exception's type name if it says nothing).
pub(crate) fn exception_text(py: Python<'_>, e: &PyErr) -> String {
    match e.value(py).str() {
        Ok(text) if !text.to_string().is_empty() => text.to_string(),
        _ => e
            .get_type(py)
            .name()
            .map_or_else(|_| "an exception".to_owned(), |n| n.to_string()),
    }
}
