//! **tidings**: reliable multicast and publish-subscribe for applications whose processes share
//! many topics at once.
//!
//! Every subscriber of a topic gets every message published on it, exactly once and in the
//! order each publisher sent them, straight from the publisher (IP multicast or unicast
//! fan-out), while it stays a member. A publisher can wait until a message is *stable*: received
//! by every member of every region its topic spans.
//!
//! A [`Node`] is one process's membership in the group. It joins through the membership service
//! (the GMS). By default ([`GmsMode::Local`]) that is the host's service at
//! `127.0.0.1:`[`LOCAL_GMS_PORT`], which the first node to start embeds, so every process of a
//! host started with the defaults is in one group; [`NodeBuilder::gms`] names another service
//! (`tidings gms`, replicated or not), [`NodeBuilder::private_gms`] embeds one of the node's own.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use tidings::{Node, Topic};
//!
//! #[derive(Serialize, Deserialize, Debug)]
//! struct Quote { symbol: String, price: f64 }
//!
//! # fn main() -> Result<(), tidings::Error> {
//! let node = Node::builder().start()?;         // joins (or starts) the host's GMS
//! let quotes: Topic<Quote> = Topic::new("quotes/eu")?;
//! let subscription = node.subscribe(&quotes)?;        // in force when it returns
//! let mut publisher = node.publisher(&quotes)?;
//! let handle = publisher.publish(&Quote { symbol: "ACME".into(), price: 12.5 })?;
//! publisher.wait_stable(handle, std::time::Duration::from_secs(5))?;
//! let message = subscription.recv()?;          // also recv_timeout, try_recv, recv_async
//! println!("{:?} from node {:?}", message.value, message.origin);
//! node.shutdown()?;                                    // leaves the group
//! # Ok(())
//! # }
//! ```
//!
//! Small messages travel many to a datagram, and can be taken that way:
//! [`Subscription::recv_many`] moves the queued messages into the caller's vector with one lock
//! of the queue, and [`Node::subscribe_batch_with`] runs a callback once per run of in-order
//! messages a datagram brought ([`MessageBatch`]).
//!
//! A process that subscribes to or publishes on thousands of topics does it in batches:
//! [`Node::subscribe_many_with`] and [`Node::publishers`] tell the membership service 128 topics
//! per request, one membership change each. [`Node::subscribe_group_with`] takes many topics
//! with one callback and one delivery task, which gets their messages in batches whatever
//! their topic.
//!
//! Under the hood ([`tidings_runtime`]): one core thread per node drives the sans-IO protocol
//! (`tidings_proto`) over batched UDP; callbacks run on the delivery scheduler's worker threads.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod node;
mod publish;
mod queue;
mod subscribe;
mod topic;

pub use error::{Error, PublishError, RecvError, RequestError, StableError, StartError};
pub use node::SubscribeBuilder;
pub use node::{GmsMode, Node, NodeBuilder, NodeStats, LOCAL_GMS_PORT};
pub use publish::{Publisher, PublisherGroup};
pub use subscribe::{CallbackSubscription, Iter, MessageBatch, SlowConsumerPolicy, Subscription};
pub use topic::{Message, Topic, TOPIC_NAME_BYTES_MAX};

pub use bytes::Bytes;
pub use tidings_gms::{
    Acl, AclAction, AclError, GmsConfig, MulticastPool, PlannerConfig, ReplicaConfig,
};
pub use tidings_proto::{Config as ProtocolConfig, NodeId, TopicId};
pub use tidings_runtime::{
    GmsLinkConfig, GmsReplicaServer, GmsServer, GmsSnapshot, MetricsServer, MulticastConfig,
    PublishHandle, ReplicaHostConfig, ReplicaSnapshot, RuntimeConfig, StartError as JoinError,
    Transport,
};
pub use tidings_seal::{AllowList, Identity, LinkError, Mode as SecurityMode, PublicKey};
