//! What the node tells its application (or the simulator's checker).

use std::time::Duration;

use bytes::Bytes;
use tidings_wire::{MsgId, NodeId, RegionId, TopicId};

/// A message delivered in sender order, exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The node that published it.
    pub origin: NodeId,
    /// The topic it was published on.
    pub topic: TopicId,
    /// The sender's message id.
    pub msg_id: MsgId,
    /// The sender's timestamp, microseconds of the sender's clock.
    pub timestamp_us: u64,
    /// The payload (shares the received datagram's buffer; no copy).
    pub payload: Bytes,
}

/// An output of the node other than datagrams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message to hand to the application.
    Deliver(Delivery),
    /// Messages this node published are stable: every member of every region their topics span
    /// has them, and their memory is released. The messages of ids `first..=last`, each of them
    /// this node's: messages that become stable one after another in id order, with no other
    /// event between them, are reported together (an acknowledgement typically releases a run
    /// of them).
    Stable {
        /// The first of them.
        first: MsgId,
        /// The last of them (`first` for one message).
        last: MsgId,
    },
    /// The next member of one of this node's rings did not confirm a token after every resend:
    /// it may have failed. For the membership service (with missed heartbeats, a reason to
    /// remove it faster); the protocol itself keeps the member until a new view says otherwise.
    Suspect {
        /// The region.
        region: RegionId,
        /// The suspected member.
        node: NodeId,
    },
    /// A ring this node leads completed a token round.
    TokenRound {
        /// The region.
        region: RegionId,
        /// Level of the ring (0 = partition).
        level: u8,
        /// Whether this is the region's top ring (led by the region leader).
        top: bool,
        /// Time from release to return.
        rtt: Duration,
    },
}
