//! The sans-IO protocol of one tidings node.

#![forbid(unsafe_code)]

pub mod membership;
pub mod time;

pub use membership::{Membership, RegionView};
pub use time::Time;
pub use tidings_wire::{MsgId, NodeId, RegionId, SeqNo, TopicId, ViewId};

/// Where a datagram produced by [`poll_transmit`](crate) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// One node (unicast).
    Node(NodeId),
    /// Every member of a region (IP multicast, or unicast fan-out where there is none).
    Region(RegionId),
}
