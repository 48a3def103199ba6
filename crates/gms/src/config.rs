//! Configuration of the service and of its clients: every limit explicit, with its default and why.

use std::time::Duration;

use crate::acl::{Acl, AclError};
use crate::regions::{PlannerConfig, PlannerConfigError};

/// The pool multicast addresses of regions are taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastPool {
    /// First address of the range (its host bits are ignored).
    pub base: [u8; 4],
    /// Prefix length of the range: `32 - prefix_len` host bits. Must be 8..=32.
    pub prefix_len: u8,
    /// UDP port of the pool's first group; see `ports`.
    pub port: u16,
    /// Consecutive UDP ports the groups are spread over, from `port`: group `i` of the pool
    /// uses `port + i % ports`. Linux hands each received multicast datagram to the sockets
    /// bound to its port after checking each one's group memberships, so with one port for
    /// every group a datagram cost a look at every membership on the host (100,000 with one
    /// subscriber of 100,000 topics: 29% of the sending thread in `ip_mc_sf_allow`). Spread
    /// over `ports`, it looks at a `ports`-th of them, for at most `ports` more sockets per
    /// node (each socket takes the groups of one port). Default [`MulticastPool::PORTS_DEFAULT`].
    pub ports: u16,
    /// Most groups handed out, from the pool's first addresses (at most the pool's size). Past
    /// it, a new region shares the group with the fewest regions: its members receive the other
    /// regions' datagrams on that group too and drop them, which costs far less than the
    /// kernel's work per joined group once a host is in thousands (every membership is a list
    /// and hash entry the kernel looks through on each multicast send, join and leave; ADR 27).
    /// Default [`MulticastPool::GROUPS_MAX_DEFAULT`].
    pub groups_max: u32,
}

impl MulticastPool {
    /// Default of [`MulticastPool::ports`].
    pub const PORTS_DEFAULT: u16 = 64;
    /// Default of [`MulticastPool::groups_max`]: 4,096 groups, about 200 sockets per node at
    /// the kernel's default 20 groups per socket.
    pub const GROUPS_MAX_DEFAULT: u32 = 4096;

    /// How many groups regions get: `groups_max`, or the pool's size if smaller.
    #[must_use]
    pub fn groups(&self) -> u32 {
        self.groups_max.min(self.size())
    }

    /// The UDP port of the pool's `i`-th group.
    #[must_use]
    pub fn port_of(&self, i: u32) -> u16 {
        let span = u32::from(self.ports.max(1));
        // Validated: `port + ports - 1` fits a port number.
        self.port
            .saturating_add(u16::try_from(i % span).unwrap_or(0))
    }

    /// Number of addresses in the pool.
    #[must_use]
    pub fn size(&self) -> u32 {
        1u32.checked_shl(32 - u32::from(self.prefix_len.min(32)))
            .unwrap_or(u32::MAX)
    }

    /// The `i`-th address of the pool.
    #[must_use]
    pub fn address(&self, i: u32) -> [u8; 4] {
        let mask = self.size().wrapping_sub(1);
        let base = u32::from_be_bytes(self.base) & !mask;
        (base | (i & mask)).to_be_bytes()
    }
}

/// Configuration of the [`Gms`](crate::Gms).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GmsConfig {
    /// The region planner's tuning.
    pub planner: PlannerConfig,
    /// Members per partition (the lowest token ring). Default 6: a ring of about 5-8 members keeps a token round short;
    /// [`RegionView::partitioned`](tidings_proto::RegionView::partitioned) keeps sizes within
    /// `size..2*size`.
    pub partition_size: usize,
    /// A node not heard from (any message) for this long is removed. Default 3 s: six client
    /// heartbeats at the default 500 ms, so one or two lost heartbeats never remove a node.
    pub heartbeat_timeout: Duration,
    /// A node suspected by a ring neighbour and not heard from for this long is removed (the
    /// faster path). Default 1 s: two missed heartbeats.
    pub suspicion_timeout: Duration,
    /// Probes sent to a suspected node over `suspicion_timeout`, evenly spaced, the first at
    /// once: each asks it to answer now. Without them a live node was removed whenever its
    /// next two heartbeats were lost (0.05 squared: 1 suspicion in 400 at 5% loss); with the default 4, all
    /// four round trips must fail as well. 0 sends none.
    pub suspicion_probes: u32,
    /// An update not acknowledged within this time is sent again. Default 200 ms (a LAN round
    /// trip is well under 1 ms; the slack covers a busy client).
    pub retransmit_interval: Duration,
    /// Sends of one update before the node is declared failed. Default 20 (4 s at the default
    /// interval, longer than `heartbeat_timeout`, so a live node is never removed for this alone).
    pub retransmit_attempts_max: u32,
    /// Updates sent and not acknowledged per node. Default 64.
    pub updates_inflight_max: usize,
    /// Largest update datagram the GMS packs consecutive items into (a single larger item, such
    /// as a big region view, is sent alone). Default 1400 bytes: one Ethernet frame, so an
    /// update is never fragmented.
    pub update_bytes_max: usize,
    /// Updates queued per node (sent or not); a node that falls further behind is removed, so
    /// the GMS's memory stays bounded. Default 65536.
    pub updates_queued_max: usize,
    /// Most nodes; joins beyond are ignored and counted. Default 65536.
    pub nodes_max: usize,
    /// Most topic names the GMS binds. Default 1 048 576.
    pub topics_max: usize,
    /// Multicast addresses for regions; `None` makes regions unicast. Default 239.192.0.0/14
    /// from port 7400 (the organisation-local scope), of which the first
    /// [`MulticastPool::GROUPS_MAX_DEFAULT`] groups are used, shared by regions past that many.
    pub multicast_pool: Option<MulticastPool>,
    /// The first node id given. A host that restarts a service without its state gives a
    /// value above any id the old one can have given (from its clock, say), so that a member
    /// of the old service is never taken for a member of the new one before it rejoins.
    /// Default 1.
    pub first_node: u32,
    /// The incarnation a service that starts without state takes (nonzero): drawn by the host
    /// from its randomness, so that a service restarted without its state numbers its
    /// regions, views and topics under another incarnation than the one it lost, and the
    /// protocol nodes of the two never take each other's packets. A replicated service takes
    /// its first leader's. Default 1 (tests; hosts draw one).
    pub incarnation: u32,
    /// Hand out region keys ([`Item::RegionKey`](crate::Item::RegionKey), ADR 43): each
    /// region's key, derived from a master secret drawn from the host's entropy
    /// ([`Gms::give_key_entropy`](crate::Gms::give_key_entropy)) and never sent, goes with the
    /// region's view to the nodes sent the view only, and a new one replaces it whenever one of
    /// them stops being sent it. Only for a service whose every member link is encrypted (the
    /// host runs the admitted link, `ServiceLink`): the update stream carries the keys.
    /// Default false.
    pub datagram_keys: bool,
    /// Topic access rules (ADR 41): which identities may publish and subscribe, by topic name
    /// or prefix, checked by the leader when it takes a `Subscribe`, `SubscribeMany`,
    /// `Advertise` or `AdvertiseMany` request. Default empty: everything is allowed, as a
    /// service without admission cannot tell its nodes apart; once there are rules, what no
    /// rule allows is refused. Every replica of one service should hold the same rules (a
    /// refusal is logged, so replicas never disagree about what was taken; the leader's rules
    /// decide).
    pub acl: Acl,
}

impl Default for GmsConfig {
    fn default() -> Self {
        GmsConfig {
            planner: PlannerConfig::default(),
            partition_size: 6,
            heartbeat_timeout: Duration::from_secs(3),
            suspicion_timeout: Duration::from_secs(1),
            suspicion_probes: 4,
            retransmit_interval: Duration::from_millis(200),
            retransmit_attempts_max: 20,
            updates_inflight_max: 64,
            update_bytes_max: 1400,
            updates_queued_max: 65_536,
            nodes_max: 65_536,
            topics_max: 1 << 20,
            multicast_pool: Some(MulticastPool {
                base: [239, 192, 0, 0],
                prefix_len: 14,
                port: 7400,
                ports: MulticastPool::PORTS_DEFAULT,
                groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
            }),
            first_node: 1,
            incarnation: 1,
            datagram_keys: false,
            acl: Acl::default(),
        }
    }
}

/// An invalid configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The planner's part is invalid.
    #[error(transparent)]
    Planner(#[from] PlannerConfigError),
    /// The access rules are invalid (`acl`).
    #[error(transparent)]
    Acl(#[from] AclError),
    /// A field that must be positive is zero.
    #[error("gms config: {0} must be positive")]
    Zero(&'static str),
    /// More replicas than [`REPLICAS_MAX`](crate::REPLICAS_MAX).
    #[error("{0} replicas: at most REPLICAS_MAX")]
    Replicas(usize),
    /// `suspicion_timeout` exceeds `heartbeat_timeout` (suspicion must speed removal up).
    #[error("gms config: suspicion_timeout must not exceed heartbeat_timeout")]
    SuspicionSlower,
    /// The multicast pool's prefix is outside 8..=32.
    #[error("gms config: multicast prefix length {0} outside 8..=32")]
    Prefix(u8),
    /// The multicast pool's ports are none, or run past port 65535.
    #[error("gms config: multicast ports {port}..{port}+{ports} must be at least one and end at 65535 or before")]
    Ports {
        /// The first port.
        port: u16,
        /// The number of ports.
        ports: u16,
    },
}

impl GmsConfig {
    /// Checks every field and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.planner.validate()?;
        self.acl.validate()?;
        for (name, zero) in [
            ("partition_size", self.partition_size == 0),
            ("heartbeat_timeout", self.heartbeat_timeout.is_zero()),
            ("suspicion_timeout", self.suspicion_timeout.is_zero()),
            ("retransmit_interval", self.retransmit_interval.is_zero()),
            ("retransmit_attempts_max", self.retransmit_attempts_max == 0),
            ("updates_inflight_max", self.updates_inflight_max == 0),
            ("update_bytes_max", self.update_bytes_max == 0),
            ("updates_queued_max", self.updates_queued_max == 0),
            ("nodes_max", self.nodes_max == 0),
            ("topics_max", self.topics_max == 0),
            ("first_node", self.first_node == 0),
            ("incarnation", self.incarnation == 0),
        ] {
            if zero {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.suspicion_timeout > self.heartbeat_timeout {
            return Err(ConfigError::SuspicionSlower);
        }
        if let Some(p) = self.multicast_pool {
            if !(8..=32).contains(&p.prefix_len) {
                return Err(ConfigError::Prefix(p.prefix_len));
            }
            if p.groups_max == 0 {
                return Err(ConfigError::Zero("multicast_pool.groups_max"));
            }
            if p.ports == 0 || u32::from(p.port) + u32::from(p.ports) - 1 > u32::from(u16::MAX) {
                return Err(ConfigError::Ports {
                    port: p.port,
                    ports: p.ports,
                });
            }
        }
        Ok(())
    }
}

/// Configuration of a [`GmsClient`](crate::GmsClient).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Interval of heartbeats to the GMS. Default 500 ms (the GMS's default timeout is six of
    /// these).
    pub heartbeat_interval: Duration,
    /// A join or request not answered within this time is sent again. Default 200 ms.
    pub retransmit_interval: Duration,
    /// Requests sent and not acknowledged. Default 64.
    pub requests_inflight_max: usize,
    /// Requests queued (sent or not); beyond it the request methods return an error. Default 4096.
    pub requests_queued_max: usize,
    /// Out-of-order updates buffered ahead of the next expected one; later ones are dropped (the
    /// GMS sends them again). Default 1024 (well above the GMS's default in-flight window).
    pub reorder_max: usize,
    /// Seed of the join nonce (the client's only random choice).
    pub seed: u64,
    /// Where this node receives protocol datagrams, told to the GMS in its `Join` (the GMS tells
    /// the nodes that talk to it). `None` lets the GMS's host use the address the `Join` came
    /// from, which is right when the client shares the node's unicast socket. Default `None`.
    pub data_addr: Option<std::net::SocketAddr>,
    /// How many replicas the service has (1..=[`REPLICAS_MAX`](crate::REPLICAS_MAX)), known
    /// by index `0..replicas`; the host maps indices to addresses. Default 1 (one process).
    pub replicas: usize,
    /// With several replicas: the replica the client talks to is left for the next one after
    /// this long without a message from it (a serving leader answers every heartbeat).
    /// Default 1.5 s (three heartbeats).
    pub failover_timeout: Duration,
    /// When the service says it does not know this node (it was removed, or the service lost
    /// its state), join again under a new id and send the subscriptions and advertisements
    /// again ([`ClientEvent::Rejoining`](crate::ClientEvent::Rejoining)) instead of stopping
    /// ([`ClientEvent::Removed`](crate::ClientEvent::Removed)). A [`Member`](crate::Member)
    /// follows it (a new protocol node under the new id and incarnation,
    /// [`MemberEvent::Rejoined`](crate::MemberEvent::Rejoined)); the runtime turns it on.
    /// Default `false` for a bare client, whose host must follow a change of node id itself.
    pub rejoin: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            heartbeat_interval: Duration::from_millis(500),
            retransmit_interval: Duration::from_millis(200),
            requests_inflight_max: 64,
            requests_queued_max: 4096,
            reorder_max: 1024,
            seed: 1,
            data_addr: None,
            replicas: 1,
            failover_timeout: Duration::from_millis(1500),
            rejoin: false,
        }
    }
}

impl ClientConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, zero) in [
            ("heartbeat_interval", self.heartbeat_interval.is_zero()),
            ("retransmit_interval", self.retransmit_interval.is_zero()),
            ("requests_inflight_max", self.requests_inflight_max == 0),
            ("requests_queued_max", self.requests_queued_max == 0),
            ("reorder_max", self.reorder_max == 0),
            ("replicas", self.replicas == 0),
            ("failover_timeout", self.failover_timeout.is_zero()),
        ] {
            if zero {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.replicas > crate::REPLICAS_MAX {
            return Err(ConfigError::Replicas(self.replicas));
        }
        Ok(())
    }
}
