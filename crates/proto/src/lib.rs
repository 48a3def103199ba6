//! The sans-IO protocol of one tidings node.

#![forbid(unsafe_code)]

mod config;
mod event;
mod gauges;
pub mod membership;
mod node;
mod outbox;
mod pdcc;
mod policy;
mod ranges;
mod recv;
mod region;
mod sdcc;
mod send;
mod send_queue;
mod stats;
pub mod time;
mod timers;
mod topic_bits;

pub use config::{
    Config, ConfigError, CongestionConfig, CongestionControl, RecoveryConfig, RecoveryPacing,
    WindowAlgorithm, WindowConfig,
};
pub use event::{Delivery, Event};
pub use node::{BufferTooSmall, Node, PublishError, PublishRun, StreamReport, Transmit};
pub use stats::Stats;
pub use tidings_wire::Priority;
pub use timers::Timer;

pub use membership::{Membership, MembershipChange, RegionView};
pub use tidings_wire::{MsgId, NodeId, RegionId, SeqNo, TopicId, ViewId};
pub use time::Time;

/// Where a datagram produced by [`poll_transmit`](crate) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// One node (unicast).
    Node(NodeId),
    /// Every member of a region (IP multicast, or unicast fan-out where there is none).
    Region(RegionId),
}
