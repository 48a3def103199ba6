//! The tidings node runtime (docs/design.md section 5): the QuickSilver core thread that drives the
//! sans-IO protocol ([`tidings_proto::Node`]) over real UDP sockets, and hands deliveries to the
//! delivery scheduler ([`tidings_sched`]).
//!
//! * [`NodeRuntime::start`] spawns one **core thread** per node. It owns the protocol, the
//!   sockets and every protocol data structure, so the protocol path takes no lock. It serves
//!   three queues in rounds, as paper 000 section 3 describes (Figures 11-12): the **request
//!   queue** (lock-free, from application threads), the **I/O queue** (`epoll` via mio; sockets
//!   drained in batches with `recvmmsg`/GRO, each batch sorted by priority before processing,
//!   datagrams pulled from the protocol only when the socket can send and sent in GSO runs), and
//!   the **alarm queue** (the protocol's deadlines), each for at most its quantum. With nothing to
//!   do it sleeps in the kernel.
//! * [`Publisher`]s (one per application thread) queue messages without locks, and without
//!   allocation once their queue has grown to what they need (it starts at 16 messages); the
//!   core thread looks only at publishers that queued something (ADR 17). Back pressure from
//!   the protocol shows as [`PublishError::WouldBlock`] or a blocking wait;
//!   [`Publisher::wait_stable`] waits until a message is stable.
//! * [`NodeRuntime::subscribe`] registers a callback per topic as a task of the credit scheduler
//!   with a share; callbacks run on its worker threads, in order within a topic. The core thread
//!   hands each subscription the run of its topic's messages one input brought as one batch
//!   ([`Deliveries`]; [`NodeRuntime::subscribe_batch`] shows it to the callback).
//! * Transports ([`Transport`]): IP multicast with a group per region, several regions sharing
//!   one past the service's `groups_max` (a group is joined once; the groups of a port share a
//!   socket, up to the kernel's 20 per socket), or unicast fan-out.
//! * [`RuntimeStats`]: cycle time and alarm lateness (maximum per second, as in paper 000
//!   Figures 34-35), short sends, invalid packets, and the protocol's own counters.
//!
//! Its benchmarks live in the `tidings-bench` crate, outside the library.

#![forbid(unsafe_code)]

mod addr;
mod batch;
mod clock;
mod config;
mod core;
mod flow;
mod gms_replica;
mod gms_server;
mod metrics;
mod net;
mod oplog;
mod publish;
mod runtime;
mod stats;

pub use addr::AddressBook;
pub use batch::{Deliveries, DeliveriesDrain};
pub use clock::now;
pub use config::{
    ConfigError, GmsLinkConfig, MulticastConfig, RuntimeConfig, Transport, BATCH_DATAGRAMS_MAX,
    CONTROL_DSCP_DEFAULT, DELIVERY_BACKLOG_MSGS_MAX, DELIVERY_QUEUE_DEFAULT, IDLE_SPIN_MAX,
    METRICS_STREAMS_MAX, METRICS_TOPICS_MAX, PUBLISH_QUEUED_NODE_BYTES_MIN,
    PUBLISH_QUEUE_CAPACITY_MAX,
};
pub use flow::{BottleneckState, Unread};
pub use gms_replica::{
    check_peers, replica_data_dir, GmsReplicaServer, ReplicaHostConfig, ReplicaSnapshot,
    REPLICA_MAGIC, STATE_FILE,
};
pub use gms_server::{GmsServer, GmsServerError, GmsSnapshot, GMS_MAGIC};
pub use metrics::{
    register_gms, register_node, register_replica, Collect, MetricsError, MetricsServer, Registry,
    MEMBER_ENDPOINTS_MAX, OTHER_STREAMS, OTHER_TOPICS,
};
pub use net::set_socket_buffers;
pub use oplog::{GMS_TARGET, STALL_TARGET, VIEW_TARGET};
pub use publish::{PublishError, PublishHandle, Publisher, WaitError};
pub use runtime::{NodeRuntime, RequestError, ShutdownError, StartError, Subscription};
pub use stats::{
    HeldGroupState, HeldTopicState, LatencyHistogram, MaxPerSecond, RuntimeStats, SealingStats,
    SubscriptionState, HISTOGRAM_BUCKETS, LATENCY_BUCKETS,
};
pub use tidings_proto::{Delivery, Membership, NodeId, RegionId, StreamReport, TopicId};
