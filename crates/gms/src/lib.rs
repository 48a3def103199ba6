//! The global membership service of tidings (docs/design.md section 6), sans-IO.
//!
//! - [`regions`]: the region planner. Topics are split into subsets whose memberships overlap
//!   regularly (paper 001's greedy), and within a subset nodes with identical subscriptions form a
//!   region; incremental, it reports exactly which regions and topics each change touches.
//! - [`Gms`]: the service. Joins, leaves, subscriptions by topic name, failure detection
//!   (heartbeats, plus suspicions from ring neighbours that it checks by probing the suspect:
//!   ADR 31), joins told apart by nonce (a taken one is refused), region views with partitions, a base
//!   (kept by views that only add topics or drop topics every member left, whose streams go
//!   on: ADR 30) and a
//!   multicast group each (shared by several regions past the pool's `groups_max`), and one reliable, ordered update stream per node carrying only what
//!   concerns that node. Its state changes are [`Command`]s.
//! - [`GmsClient`]: the node side; it turns the update stream into
//!   [`tidings_proto::Membership`] values for the protocol node.
//! - [`Member`]: a node's control plane, the protocol node and the client together; the
//!   runtime and the simulator both drive it.
//! - [`message`]: the messages between them and their checked encoding.
//! - [`acl`]: topic access rules, checked when the service takes subscriptions and
//!   advertisements.
//! - [`secure`]: the admitted GMS link (Noise handshake and sessions of `tidings-seal`).
//!
//! Nothing here reads a clock, opens a socket or spawns a thread: time and seeds are inputs.
//! See `docs/gms.md`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod acl;
pub mod arena;
mod client;
mod config;
mod groups;
mod member;
pub mod message;
pub mod regions;
pub mod replica;
pub mod secure;
mod service;
#[cfg(test)]
mod tests;

pub use acl::{Acl, AclAction, AclEffect, AclError, AclRule, AclWho, TopicRefusal};
pub use arena::BlockArena;
pub use client::{ClientEvent, ClientStats, GmsClient, RequestError};
pub use config::{ClientConfig, ConfigError, GmsConfig, MulticastPool};
pub use member::{
    frame, unframe, Joining, Member, MemberConfig, MemberError, MemberEvent, MemberStats,
    NamedRefusal, NamedRequest, ReceivedDatagram, Stall, GMS_MAGIC,
};
pub use message::{
    DecodeError, GmsMessage, GmsRegionView, Item, RegionAddress, Request, WireKey,
    NAMES_PER_REQUEST_MAX, TOPIC_NAME_BYTES_MAX,
};
pub use regions::{
    Changes, Planner, PlannerConfig, PlannerConfigError, PlannerStats, Region, SubsetId,
};
pub use replica::{
    Durable, DurableError, DurableFile, DurableLimits, Replica, ReplicaConfig, ReplicaError,
    ReplicaEvent, ReplicaStats, ReplicaTransmit, REPLICAS_MAX,
};
pub use secure::{
    Entropy, Inbound, LinkSecurity, NodeLink, NodeLinkStats, ReplicaLink, ReplicaLinkError,
    ReplicaLinkStats, ReplicaSecurity, ServiceLink, ServiceLinkStats, ServiceSecurity,
    REPLICA_LINK_MAGIC, REPLICA_LINK_OVERHEAD,
};
pub use service::{
    Command, Decision, Gms, GmsEvent, GmsStats, GmsTransmit, MemberState, Peer, RemoveCause,
    SnapshotError,
};
