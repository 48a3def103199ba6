//! The library's errors: one type per operation where its failures differ ([`StartError`],
//! [`RequestError`], [`PublishError`], [`StableError`], [`RecvError`]), each saying what went
//! wrong and what to do about it, and [`Error`], which holds any of them, for code that passes
//! them on with `?`.

use tidings_runtime::{GmsServerError, StartError as JoinError, WaitError};

/// Any failure of the library: each operation's own error, for code that passes errors of
/// several operations on with `?` (every operation error converts into it), and the failures
/// of the calls that have no error type of their own. New kinds may be added, so a `match`
/// needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node did not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A request through the node (subscribe, publisher, set_share, stats) failed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A message was not published.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A wait for stability ended without it.
    #[error(transparent)]
    Stable(#[from] StableError),
    /// A subscription yielded an error instead of a message.
    #[error(transparent)]
    Recv(#[from] RecvError),
    /// A topic name is empty or too long.
    #[error("topic name {0:?} must be 1..=256 bytes of UTF-8")]
    TopicName(String),
    /// The node's core thread panicked while shutting down (a bug; please report it).
    #[error("shutdown was not clean: {0}")]
    Shutdown(String),
}

/// Why [`NodeBuilder::start`](crate::NodeBuilder::start) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
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
    /// The node could not join: its runtime or the membership service refused or did not answer.
    #[error("the node could not start: {0}")]
    Join(#[from] JoinError),
    /// The metrics endpoint could not start (is its address taken?).
    #[error(transparent)]
    Metrics(#[from] tidings_runtime::MetricsError),
    /// The embedded membership service could not start (is its address taken?).
    #[error("the embedded membership service could not start: {0}")]
    Gms(#[from] GmsServerError),
}

/// Why a request to the membership service through the node failed:
/// [`Node::subscribe`](crate::Node::subscribe), [`Node::publisher`](crate::Node::publisher) and
/// their batch and builder forms, and `set_share`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// An argument cannot work (a capacity or share out of range); the message names it.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The node or the membership service did not answer in time.
    #[error("timed out: the node or the membership service did not answer")]
    Timeout,
    /// The node refused the request (the message says why), e.g. the service removed it.
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
    /// The node has shut down.
    #[error("the node has shut down")]
    Closed,
}

/// Why a message was not published: [`Publisher::publish`](crate::Publisher::publish) and its
/// timed, non-blocking and async forms.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
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
    /// Back pressure (from `try_publish`): the protocol's window and the publisher's queue are
    /// full, or the node's publishers together queued `publish_queued_node_bytes_max`. Retry
    /// once messages become stable, or use `publish`, which waits.
    #[error(
        "back pressure: the publisher's queue (or the node's bound on queued messages) is full; \
         retry later or use publish(), which waits"
    )]
    WouldBlock,
    /// `publish_timeout` found no room within its timeout.
    #[error("timed out: no room to publish")]
    Timeout,
    /// The value could not be serialized.
    #[error("could not encode the message: {0}")]
    Encode(String),
    /// The node has shut down.
    #[error("the node has shut down")]
    Closed,
    /// A [`PublisherGroup`](crate::PublisherGroup) was asked to publish on a topic it does not
    /// have.
    #[error("no topic {index} in a publisher group of {topics}")]
    NoSuchTopic {
        /// The index asked for.
        index: usize,
        /// Topics in the group.
        topics: usize,
    },
}

/// Why a wait for stability ended without it:
/// [`Publisher::wait_stable`](crate::Publisher::wait_stable) and its async form.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StableError {
    /// The wait ran out of time.
    #[error("timed out: the message did not become stable")]
    Timeout,
    /// The wait ran out of time while regions of the node did not acknowledge its messages:
    /// the text names them, the message they hold back and their members.
    #[error("timed out: the message did not become stable: {0}")]
    NotStable(String),
    /// The handle came from another publisher.
    #[error("the handle belongs to another publisher")]
    ForeignHandle,
    /// The node has shut down.
    #[error("the node has shut down")]
    Closed,
}

/// What a subscription yields instead of a message, the same for its three receive calls
/// ([`recv`](crate::Subscription::recv), [`recv_timeout`](crate::Subscription::recv_timeout),
/// [`try_recv`](crate::Subscription::try_recv)), `recv_async`, its iterator and stream, and
/// callbacks. An iterator, a stream and a callback see only `Decode` and `SlowConsumer`: their
/// end is the end of the iteration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// `try_recv` found no message queued.
    #[error("no message is queued")]
    Empty,
    /// `recv_timeout` waited its timeout and no message came.
    #[error("timed out: no message")]
    Timeout,
    /// The subscription has ended (the node shut down, or it was disconnected) and every
    /// message queued before was taken.
    #[error("the subscription has ended")]
    Closed,
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
}

impl From<tidings_runtime::RequestError> for RequestError {
    fn from(e: tidings_runtime::RequestError) -> RequestError {
        match e {
            tidings_runtime::RequestError::Closed => RequestError::Closed,
            tidings_runtime::RequestError::Timeout => RequestError::Timeout,
            tidings_runtime::RequestError::Share(s) => {
                RequestError::Config(format!("share {s} is not in (0, 1]"))
            }
            tidings_runtime::RequestError::Refused(why) => RequestError::Refused(why),
            tidings_runtime::RequestError::TopicRefused(r) => RequestError::TopicRefused {
                topic: r.topic,
                action: r.action,
                rule: r.rule,
            },
        }
    }
}

impl From<tidings_runtime::PublishError> for PublishError {
    fn from(e: tidings_runtime::PublishError) -> PublishError {
        match e {
            tidings_runtime::PublishError::TooLarge { len, max } => {
                PublishError::TooLarge { len, max }
            }
            tidings_runtime::PublishError::WouldBlock(_) => PublishError::WouldBlock,
            tidings_runtime::PublishError::Timeout(_) => PublishError::Timeout,
            tidings_runtime::PublishError::Closed => PublishError::Closed,
        }
    }
}

impl From<WaitError> for StableError {
    fn from(e: WaitError) -> StableError {
        match e {
            WaitError::Timeout => StableError::Timeout,
            WaitError::Stalled(why) => StableError::NotStable(why),
            WaitError::Closed => StableError::Closed,
            WaitError::ForeignHandle => StableError::ForeignHandle,
        }
    }
}

impl From<tidings_runtime::RequestError> for Error {
    fn from(e: tidings_runtime::RequestError) -> Error {
        Error::Request(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation's error passed on as [`Error`] keeps its message and its source.
    #[test]
    fn operation_errors_pass_on_their_message_and_source() {
        let bind = StartError::Bind {
            addr: "127.0.0.1:1".parse().expect("an address"),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let text = bind.to_string();
        let general = Error::from(bind);
        assert_eq!(general.to_string(), text);
        assert!(std::error::Error::source(&general).is_some());
        assert!(matches!(
            Error::from(tidings_runtime::RequestError::Share(2.0)),
            Error::Request(RequestError::Config(why)) if why.contains("share 2")
        ));
        assert!(matches!(
            StableError::from(WaitError::Stalled("region 1".to_owned())),
            StableError::NotStable(why) if why == "region 1"
        ));
        let recv = RecvError::SlowConsumer {
            topic: "t".to_owned(),
            capacity: 4,
            waited: std::time::Duration::from_millis(50),
        };
        let text = recv.to_string();
        assert_eq!(Error::from(recv).to_string(), text);
    }
}
