//! Subscriptions: as an iterator (a bounded queue the application reads) or as a callback.

use std::sync::Arc;
use std::time::Duration;

use crate::queue::{NoItem, Receiver, Wait};
use tidings_proto::TopicId;

use crate::error::{RecvError, RequestError};
use crate::topic::Message;

/// What an iterator [`Subscription`] does when its reader falls behind: its queue holds
/// `capacity` messages (the most it may lag) and is full.
///
/// Either way the node holds back only what feeds the full subscription: the streams that carry
/// its topic stop at this node, and everything else (other topics, other senders) goes on.
/// A stream is one sender's messages into one region, and a region may carry several topics
/// (those with the same subscribers share one), so **topics that share the held stream (same
/// sender, same region) wait with it** at this node; other nodes are not held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlowConsumerPolicy {
    /// Slow the stream: while the queue is full the topic is held at this node (its streams
    /// stop here, their senders' windows close and their publishers slow down), and released
    /// once the reader has taken half the queue; nothing is lost, every message comes in order.
    /// The default.
    #[default]
    SlowDown,
    /// Slow the stream for at most this long; if the queue is still full then, the
    /// subscription is disconnected and its topic released at once: its reader gets the
    /// messages already queued, then `Err(RecvError::SlowConsumer)`, then the end (`None`). Later
    /// messages of the topic are not queued for it (it was told), and the node's other
    /// subscriptions go on.
    Disconnect {
        /// Longest wait for room before disconnecting.
        max_wait: std::time::Duration,
    },
}

/// A subscription read as an iterator: every message of the topic, in each publisher's order.
///
/// Messages wait in a bounded queue (`NodeBuilder::subscription_capacity`, or
/// [`SubscribeBuilder::capacity`](crate::SubscribeBuilder::capacity)). When the application
/// does not keep up and the queue is full, its [`SlowConsumerPolicy`] applies: by default the
/// node holds the topic's streams, which slows their publishers down (back pressure) while its
/// other topics go on; or the subscription is disconnected with an error. Nothing is dropped
/// silently. [`bottleneck`](Subscription::bottleneck) tells whether it holds its topic now.
/// Dropping the subscription unsubscribes.
pub struct Subscription<T> {
    pub(crate) inner: tidings_runtime::Subscription,
    pub(crate) queue: Receiver<Result<Message<T>, RecvError>>,
    pub(crate) name: String,
    /// What the reader has not read, as the runtime counts it.
    pub(crate) unread: Arc<tidings_runtime::Unread>,
}

impl<T> Subscription<T> {
    /// The topic's id.
    #[must_use]
    pub fn topic_id(&self) -> TopicId {
        self.inner.topic()
    }

    /// The topic's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next message, waiting as long as it takes; `Err(RecvError::Closed)` once the
    /// subscription has ended (the node shut down, or it was disconnected) and every queued
    /// message was taken.
    ///
    /// The three receive calls and [`recv_async`](Self::recv_async) have one shape: a message,
    /// or the error that took its place (a message that did not decode, a slow-consumer
    /// disconnection), or why none came (`Timeout`, `Empty`, `Closed`).
    pub fn recv(&self) -> Result<Message<T>, RecvError> {
        from_queue(self.queue.recv_until(None))
    }

    /// The next message, waiting at most `timeout`: `Err(RecvError::Timeout)` if none came,
    /// `Err(RecvError::Closed)` once the subscription has ended and the queue is empty.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message<T>, RecvError> {
        #[allow(clippy::disallowed_methods)] // the wait is the application's, in wall time
        let deadline = std::time::Instant::now().checked_add(timeout);
        from_queue(self.queue.recv_until(deadline))
    }

    /// The next message if one is queued: `Err(RecvError::Empty)` if none is, `Err(RecvError::Closed)`
    /// once the subscription has ended and the queue is empty.
    pub fn try_recv(&self) -> Result<Message<T>, RecvError> {
        from_queue(self.queue.try_recv())
    }

    /// The next message, from async code: the task waits, not the thread. `Err(RecvError::Closed)`
    /// once the subscription has ended and the queue is empty. Works on any executor (the
    /// delivery worker wakes the task).
    pub async fn recv_async(&self) -> Result<Message<T>, RecvError> {
        from_queue(std::future::poll_fn(|cx| self.queue.poll_recv(cx)).await)
    }

    /// Moves up to `max` queued messages, in order, to the end of `out`, waiting as long as it
    /// takes while none is queued; how many it moved (0 only for `max == 0`, which returns at
    /// once). The queue is locked once for the lot, not once per message, and nothing is
    /// allocated once `out` has room: a loop that clears `out` and calls again reuses its
    /// storage.
    ///
    /// An error keeps its place among the messages: the messages queued before it come first
    /// (this call returns them), then the error on its own (`Err`, from the next call), then
    /// what followed it. So under [`SlowConsumerPolicy::Disconnect`] a reader gets the queued
    /// messages, then `Err(RecvError::SlowConsumer)`, then `Err(RecvError::Closed)`, as with
    /// [`recv`](Self::recv). `Err(RecvError::Closed)` once the subscription has ended and every
    /// queued message was taken.
    pub fn recv_many(&self, out: &mut Vec<Message<T>>, max: usize) -> Result<usize, RecvError> {
        self.recv_many_waiting(out, max, Wait::Forever)
    }

    /// [`recv_many`](Self::recv_many) waiting at most `timeout` for the first message:
    /// `Err(RecvError::Timeout)` if none came.
    pub fn recv_many_timeout(
        &self,
        out: &mut Vec<Message<T>>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize, RecvError> {
        #[allow(clippy::disallowed_methods)] // the wait is the application's, in wall time
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.recv_many_waiting(out, max, Wait::until(deadline))
    }

    /// [`recv_many`](Self::recv_many) without waiting: `Err(RecvError::Empty)` if nothing is
    /// queued.
    pub fn try_recv_many(&self, out: &mut Vec<Message<T>>, max: usize) -> Result<usize, RecvError> {
        self.recv_many_waiting(out, max, Wait::No)
    }

    fn recv_many_waiting(
        &self,
        out: &mut Vec<Message<T>>,
        max: usize,
        wait: Wait,
    ) -> Result<usize, RecvError> {
        let mut error = None;
        let n = self
            .queue
            .recv_many(max, wait, Result::is_err, |item| match item {
                Ok(m) => out.push(m),
                Err(e) => error = Some(e),
            })
            .map_err(|e| match e {
                NoItem::Timeout => RecvError::Timeout,
                NoItem::Empty => RecvError::Empty,
                NoItem::Closed => RecvError::Closed,
            })?;
        match error {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Messages queued and not yet taken.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether this subscription is its topic's bottleneck now (its queue is full, so the
    /// topic's streams are held at this node), since when, and how often it was.
    #[must_use]
    pub fn bottleneck(&self) -> tidings_runtime::BottleneckState {
        self.unread.bottleneck()
    }

    /// Changes the share of the delivery workers' time this subscription's deliveries get when
    /// topics compete, in `(0, 1]` (the node's `subscription_share` until changed):
    /// `Err(RequestError::Config)` for a share outside it.
    pub fn set_share(&self, share: f64) -> Result<(), RequestError> {
        Ok(self.inner.set_share(share)?)
    }

    /// A blocking iterator over the messages (ends when the node shuts down).
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { queue: &self.queue }
    }

    /// Unsubscribes (also done by dropping it).
    pub fn unsubscribe(self) {}
}

/// A received item as the application sees it.
fn from_queue<T>(
    r: Result<Result<Message<T>, RecvError>, NoItem>,
) -> Result<Message<T>, RecvError> {
    r.unwrap_or_else(|e| {
        Err(match e {
            NoItem::Timeout => RecvError::Timeout,
            NoItem::Empty => RecvError::Empty,
            NoItem::Closed => RecvError::Closed,
        })
    })
}

/// A subscription is a stream of its messages for async code (`futures::StreamExt::next`),
/// ending when the subscription does.
impl<T> futures_core::Stream for Subscription<T> {
    type Item = Result<Message<T>, RecvError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.queue.poll_recv(cx).map(Result::ok)
    }
}

/// Blocking iterator of a [`Subscription`].
#[derive(Debug)]
pub struct Iter<'a, T> {
    queue: &'a Receiver<Result<Message<T>, RecvError>>,
}

impl<T> Iterator for Iter<'_, T> {
    type Item = Result<Message<T>, RecvError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.queue.recv_until(None).ok()
    }
}

impl<'a, T> IntoIterator for &'a Subscription<T> {
    type Item = Result<Message<T>, RecvError>;
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

/// The run of a topic's messages, in order, that one input (a datagram, a repair) brought,
/// handed to a batch callback ([`Node::subscribe_batch_with`](crate::Node::subscribe_batch_with))
/// as one event. An iterator: each message is decoded as it is taken (a message that does not
/// decode as `T` comes as `Err(RecvError::Decode)`). Messages the callback does not take are
/// dropped when it returns.
pub struct MessageBatch<'a, T> {
    pub(crate) deliveries: tidings_runtime::DeliveriesDrain<'a>,
    pub(crate) topic: TopicId,
    pub(crate) decode: fn(bytes::Bytes) -> Result<T, String>,
    pub(crate) name: &'a str,
}

impl<T> MessageBatch<'_, T> {
    /// The topic's id.
    #[must_use]
    pub fn topic_id(&self) -> TopicId {
        self.topic
    }

    /// The topic's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name
    }

    /// Messages not yet taken.
    #[must_use]
    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    /// Whether every message was taken.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Iterator for MessageBatch<'_, T> {
    type Item = Result<Message<T>, RecvError>;

    fn next(&mut self) -> Option<Self::Item> {
        let d = self.deliveries.next()?;
        Some(crate::node::to_message(d, self.decode, self.name))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.deliveries.size_hint()
    }
}

impl<T> std::fmt::Debug for MessageBatch<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageBatch")
            .field("name", &self.name)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// A subscription whose messages go to a callback, in order within the topic. Dropping it
/// unsubscribes.
///
/// From [`Node::subscribe_with`](crate::Node::subscribe_with) (a call per message) and
/// [`Node::subscribe_batch_with`](crate::Node::subscribe_batch_with) (a call per
/// [`MessageBatch`]) the callback runs on a delivery
/// worker thread, with no subscription queue of its own: what waits for it is its delivery
/// task's queue in the scheduler (`RuntimeConfig::sched.task_queue_capacity` events). A
/// callback slower than its topic fills that queue, and the topic is then held at this node
/// as for a full [`Subscription`] under [`SlowConsumerPolicy::SlowDown`] (its streams stop
/// here and their publishers slow down; other topics go on) until the callback has taken
/// half of it. The callback also shares the workers with the node's other callbacks, so one
/// that blocks keeps the others waiting. From
/// [`SubscribeBuilder::subscribe_with`](crate::SubscribeBuilder::subscribe_with) it runs on a
/// thread of its own behind the subscription's bounded queue, so the builder's capacity and
/// [`SlowConsumerPolicy`] apply: a callback that falls behind under
/// [`SlowConsumerPolicy::Disconnect`] gets `Err(RecvError::SlowConsumer)` as its last call.
pub struct CallbackSubscription {
    pub(crate) handle: Box<dyn SubscriptionHandle>,
}

/// What a [`CallbackSubscription`] keeps of its subscription: dropping it unsubscribes.
pub(crate) trait SubscriptionHandle: Send {
    fn topic_id(&self) -> TopicId;
    fn set_share(&self, share: f64) -> Result<(), RequestError>;
}

impl SubscriptionHandle for tidings_runtime::Subscription {
    fn topic_id(&self) -> TopicId {
        self.topic()
    }

    fn set_share(&self, share: f64) -> Result<(), RequestError> {
        Ok(tidings_runtime::Subscription::set_share(self, share)?)
    }
}

impl<T: Send> SubscriptionHandle for Subscription<T> {
    fn topic_id(&self) -> TopicId {
        self.inner.topic()
    }

    fn set_share(&self, share: f64) -> Result<(), RequestError> {
        Ok(self.inner.set_share(share)?)
    }
}

impl CallbackSubscription {
    /// The topic's id.
    #[must_use]
    pub fn topic_id(&self) -> TopicId {
        self.handle.topic_id()
    }

    /// Changes the share of the delivery workers' time this subscription gets when topics
    /// compete, in `(0, 1]`.
    pub fn set_share(&self, share: f64) -> Result<(), RequestError> {
        self.handle.set_share(share)
    }

    /// Unsubscribes (also done by dropping it).
    pub fn unsubscribe(self) {}
}

impl std::fmt::Debug for CallbackSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackSubscription")
            .field("topic", &self.handle.topic_id())
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}
