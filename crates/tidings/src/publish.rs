//! Typed publishing.

use std::time::Duration;

use bytes::BytesMut;
use tidings_proto::TopicId;
use tidings_runtime::PublishHandle;

use crate::error::{PublishError, StableError};
use crate::topic::Topic;

/// Publishes on one topic from one thread (or task): messages of one publisher are published
/// in call order, and [`wait_stable`](Publisher::wait_stable) waits for a message and every
/// earlier one of the same publisher. Get one from [`Node::publisher`](crate::Node::publisher).
pub struct Publisher<T> {
    inner: tidings_runtime::Publisher,
    topic: Topic<T>,
    id: TopicId,
    /// Where typed values are encoded (raw topics do not use it).
    arena: BytesMut,
}

impl<T> Publisher<T> {
    pub(crate) fn new(inner: tidings_runtime::Publisher, topic: Topic<T>, id: TopicId) -> Self {
        Publisher {
            inner,
            topic,
            id,
            arena: BytesMut::new(),
        }
    }

    /// The topic.
    #[must_use]
    pub fn topic(&self) -> &Topic<T> {
        &self.topic
    }

    /// The topic's id, as the membership service bound it.
    #[must_use]
    pub fn topic_id(&self) -> TopicId {
        self.id
    }

    /// Largest encoded message accepted, in bytes.
    #[must_use]
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    /// Publishes `value`, waiting while back pressure holds (the protocol's window of unstable
    /// messages is full), until there is room or the node shuts down.
    pub fn publish(&mut self, value: &T) -> Result<PublishHandle, PublishError> {
        let bytes = self.topic.encode(value, &mut self.arena)?;
        Ok(self.inner.publish(self.id, bytes)?)
    }

    /// Like [`publish`](Publisher::publish), waiting for room at most `timeout`.
    pub fn publish_timeout(
        &mut self,
        value: &T,
        timeout: Duration,
    ) -> Result<PublishHandle, PublishError> {
        let bytes = self.topic.encode(value, &mut self.arena)?;
        Ok(self.inner.publish_timeout(self.id, bytes, Some(timeout))?)
    }

    /// Publishes `value` without waiting: [`PublishError::WouldBlock`] under back pressure.
    pub fn try_publish(&mut self, value: &T) -> Result<PublishHandle, PublishError> {
        let bytes = self.topic.encode(value, &mut self.arena)?;
        Ok(self.inner.try_publish(self.id, bytes)?)
    }

    /// Publishes from async code: under back pressure the task waits, not the thread.
    pub async fn publish_async(&mut self, value: &T) -> Result<PublishHandle, PublishError> {
        let bytes = self.topic.encode(value, &mut self.arena)?;
        Ok(self.inner.publish_async(self.id, bytes).await?)
    }

    /// Whether `handle`'s message (and every earlier one of this publisher) is stable.
    #[must_use]
    pub fn is_stable(&self, handle: PublishHandle) -> bool {
        self.inner.is_stable(handle)
    }

    /// Waits until `handle`'s message and every earlier one of this publisher are stable
    /// (received by every member of every region the topic spans), at most `timeout`.
    pub fn wait_stable(
        &mut self,
        handle: PublishHandle,
        timeout: Duration,
    ) -> Result<(), StableError> {
        Ok(self.inner.wait_stable(handle, timeout)?)
    }

    /// Waits from async code until `handle`'s message and every earlier one are stable.
    pub async fn wait_stable_async(&self, handle: PublishHandle) -> Result<(), StableError> {
        Ok(self.inner.wait_stable_async(handle).await?)
    }

    /// Messages this publisher has published.
    #[must_use]
    pub fn published_count(&self) -> u64 {
        self.inner.published_count()
    }
}

/// Publishes on several topics from one thread (or task) through one queue to the core thread:
/// [`publish(i, value)`](PublisherGroup::publish) publishes on the `i`-th topic. Get one from
/// [`Node::publisher_group`](crate::Node::publisher_group).
///
/// The group's messages are published in call order, whatever their topics, and
/// [`wait_stable`](PublisherGroup::wait_stable) waits for a message and every earlier one of
/// the group. So a message the node cannot take yet (its region's window is full, or its topic
/// is held by a slow subscription of this node) holds back the group's later messages on every
/// topic until it is taken; topics that must not wait for each other take a [`Publisher`] each.
/// With thousands of topics published in turn from one thread, one queue rather than one per
/// topic keeps the hand-over to the core thread in cache.
pub struct PublisherGroup<T> {
    inner: tidings_runtime::Publisher,
    topics: Vec<(Topic<T>, TopicId)>,
    /// Where typed values are encoded (raw topics do not use it).
    arena: BytesMut,
}

impl<T> PublisherGroup<T> {
    pub(crate) fn new(inner: tidings_runtime::Publisher, topics: Vec<(Topic<T>, TopicId)>) -> Self {
        PublisherGroup {
            inner,
            topics,
            arena: BytesMut::new(),
        }
    }

    /// Topics in the group.
    #[must_use]
    pub fn len(&self) -> usize {
        self.topics.len()
    }

    /// Whether the group has no topic.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// The `i`-th topic, if there is one.
    #[must_use]
    pub fn topic(&self, i: usize) -> Option<&Topic<T>> {
        self.topics.get(i).map(|(t, _)| t)
    }

    /// The `i`-th topic's id, as the membership service bound it.
    #[must_use]
    pub fn topic_id(&self, i: usize) -> Option<TopicId> {
        self.topics.get(i).map(|&(_, id)| id)
    }

    /// Largest encoded message accepted, in bytes.
    #[must_use]
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }

    /// The `i`-th topic's id and `value` encoded for it.
    fn encode(&mut self, i: usize, value: &T) -> Result<(TopicId, bytes::Bytes), PublishError> {
        let topics = self.topics.len();
        let (topic, id) = self
            .topics
            .get(i)
            .ok_or(PublishError::NoSuchTopic { index: i, topics })?;
        Ok((*id, topic.encode(value, &mut self.arena)?))
    }

    /// Publishes `value` on the `i`-th topic, waiting while back pressure holds, until there is
    /// room or the node shuts down.
    pub fn publish(&mut self, i: usize, value: &T) -> Result<PublishHandle, PublishError> {
        let (id, bytes) = self.encode(i, value)?;
        Ok(self.inner.publish(id, bytes)?)
    }

    /// Like [`publish`](PublisherGroup::publish), waiting for room at most `timeout`.
    pub fn publish_timeout(
        &mut self,
        i: usize,
        value: &T,
        timeout: Duration,
    ) -> Result<PublishHandle, PublishError> {
        let (id, bytes) = self.encode(i, value)?;
        Ok(self.inner.publish_timeout(id, bytes, Some(timeout))?)
    }

    /// Publishes `value` on the `i`-th topic without waiting: [`PublishError::WouldBlock`]
    /// under back pressure.
    pub fn try_publish(&mut self, i: usize, value: &T) -> Result<PublishHandle, PublishError> {
        let (id, bytes) = self.encode(i, value)?;
        Ok(self.inner.try_publish(id, bytes)?)
    }

    /// Publishes from async code: under back pressure the task waits, not the thread.
    pub async fn publish_async(
        &mut self,
        i: usize,
        value: &T,
    ) -> Result<PublishHandle, PublishError> {
        let (id, bytes) = self.encode(i, value)?;
        Ok(self.inner.publish_async(id, bytes).await?)
    }

    /// Whether `handle`'s message (and every earlier one of this group) is stable.
    #[must_use]
    pub fn is_stable(&self, handle: PublishHandle) -> bool {
        self.inner.is_stable(handle)
    }

    /// Waits until `handle`'s message and every earlier one of this group are stable, at most
    /// `timeout`.
    pub fn wait_stable(
        &mut self,
        handle: PublishHandle,
        timeout: Duration,
    ) -> Result<(), StableError> {
        Ok(self.inner.wait_stable(handle, timeout)?)
    }

    /// Waits from async code until `handle`'s message and every earlier one are stable.
    pub async fn wait_stable_async(&self, handle: PublishHandle) -> Result<(), StableError> {
        Ok(self.inner.wait_stable_async(handle).await?)
    }

    /// Messages this group has published.
    #[must_use]
    pub fn published_count(&self) -> u64 {
        self.inner.published_count()
    }
}

impl<T> std::fmt::Debug for PublisherGroup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherGroup")
            .field("topics", &self.topics.len())
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Publisher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("topic", &self.topic.name())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
