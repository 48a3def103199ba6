//! One error type for the library: what went wrong, and what to do about it.

use tidings_runtime::{GmsServerError, PublishError, RequestError, StartError, WaitError};

/// What went wrong. New kinds of failure may be added, so a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value cannot work; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The node's socket could not be bound (is the address taken, or not this host's?).
    #[error("cannot bind the node's socket to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why the system refused.
        source: std::io::Error,
    },
    /// The node could not start (socket, membership service, protocol configuration).
    #[error("the node could not start: {0}")]
    Start(#[from] StartError),
    /// The metrics endpoint could not start (is its address taken?).
    #[error(transparent)]
    Metrics(#[from] tidings_runtime::MetricsError),
    /// The embedded membership service could not start (is its address taken?).
    #[error("the embedded membership service could not start: {0}")]
    Gms(#[from] GmsServerError),
    /// A topic name is empty or too long.
    #[error("topic name {0:?} must be 1..=256 bytes of UTF-8")]
    TopicName(String),
    /// Back pressure (from `try_publish`): the protocol's window and the publisher's queue are
    /// full, or the node's publishers together queued `publish_queued_node_bytes_max`. Retry
    /// once messages become stable, or use `publish`, which waits.
    #[error(
        "back pressure: the publisher's queue (or the node's bound on queued messages) is full; \
         retry later or use publish(), which waits"
    )]
    WouldBlock,
    /// A wait ran out of time.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// `try_recv` found no message queued.
    #[error("no message is queued")]
    Empty,
    /// A wait for stability ran out of time while regions of the node did not acknowledge its
    /// messages: the text names them, the message they hold back and their members.
    #[error("timed out: the message did not become stable: {0}")]
    NotStable(String),
    /// The encoded message does not fit one datagram.
    #[error(
        "message of {len} bytes exceeds the largest of {max} bytes: split it, or raise \
         ProtocolConfig::max_datagram_bytes"
    )]
    TooLarge {
        /// Encoded size.
        len: usize,
        /// Largest accepted.
        max: usize,
    },
    /// The value could not be serialized.
    #[error("could not encode the message: {0}")]
    Encode(String),
    /// A received message could not be deserialized as the topic's type (a publisher uses
    /// another type for the same topic name). The message is skipped, not lost silently: this
    /// error is what the subscription yields in its place.
    #[error("could not decode a message of topic {topic:?} as the subscription's type: {why}")]
    Decode {
        /// The topic's name.
        topic: String,
        /// Why.
        why: String,
    },
    /// The node refused the request (the message says why), e.g. the GMS removed it.
    #[error("refused: {0}")]
    Refused(String),
    /// The membership service's access rules refused to let this node subscribe to or publish
    /// on the topic: `rule` is the rule that denied it (`rule N (deny ...)`) or `no rule
    /// allows` (docs/security.md). The node does not take part in the topic.
    #[error("{action} on topic {topic:?} refused by the service's access rules: {rule}")]
    TopicRefused {
        /// The topic's name.
        topic: String,
        /// What was refused: publish or subscribe.
        action: crate::AclAction,
        /// The rule.
        rule: String,
    },
    /// The subscription's reader fell behind: its queue stayed full longer than its
    /// [`SlowConsumerPolicy::Disconnect`](crate::SlowConsumerPolicy::Disconnect) allows, so it
    /// was disconnected. The messages before this error were delivered in order; none after it
    /// will be. Subscribe again (and read faster, or allow more lag) to resume.
    #[error(
        "subscription to {topic:?} disconnected: its queue of {capacity} messages stayed full \
         for {waited:?}; read faster or allow more lag"
    )]
    SlowConsumer {
        /// The topic's name.
        topic: String,
        /// The queue's capacity (the lag allowed, in messages).
        capacity: usize,
        /// How long the delivery waited for room.
        waited: std::time::Duration,
    },
    /// The node has shut down (or its core thread stopped). From a subscription's receive:
    /// the subscription has ended (the node shut down, or it was disconnected) and every
    /// message queued before was taken.
    #[error("the node has shut down")]
    Closed,
    /// The node's core thread panicked while shutting down (a bug; please report it).
    #[error("shutdown was not clean: {0}")]
    Shutdown(String),
}

impl From<RequestError> for Error {
    fn from(e: RequestError) -> Error {
        match e {
            RequestError::Closed => Error::Closed,
            RequestError::Timeout => {
                Error::Timeout("the node or the membership service did not answer")
            }
            RequestError::Share(s) => Error::Config(format!("share {s} is not in (0, 1]")),
            RequestError::Refused(why) => Error::Refused(why),
            RequestError::TopicRefused(r) => Error::TopicRefused {
                topic: r.topic,
                action: r.action,
                rule: r.rule,
            },
        }
    }
}

impl From<PublishError> for Error {
    fn from(e: PublishError) -> Error {
        match e {
            PublishError::TooLarge { len, max } => Error::TooLarge { len, max },
            PublishError::WouldBlock(_) => Error::WouldBlock,
            PublishError::Timeout(_) => Error::Timeout("no room to publish"),
            PublishError::Closed => Error::Closed,
        }
    }
}

impl From<WaitError> for Error {
    fn from(e: WaitError) -> Error {
        match e {
            WaitError::Timeout => Error::Timeout("the message did not become stable"),
            WaitError::Stalled(why) => Error::NotStable(why),
            WaitError::Closed => Error::Closed,
            WaitError::ForeignHandle => {
                Error::Refused("the handle belongs to another publisher".to_owned())
            }
        }
    }
}
