//! Runtime configuration: every limit explicit, each default documented with its reason, checked
//! once by [`RuntimeConfig::validate`] (STYLE.md item 12).

use std::net::Ipv4Addr;
use std::time::Duration;

use tidings_sched::SchedConfig;

/// How datagrams addressed to a whole region leave the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One unicast datagram per region member (fan-out), for networks without IP multicast (most
    /// clouds). The default, because it works everywhere.
    Unicast,
    /// One IP multicast datagram per region, to the region's group in the
    /// [`AddressBook`](crate::AddressBook). The node joins the group of every region it is a
    /// member of.
    Multicast(MulticastConfig),
}

/// IP multicast settings (IPv4).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MulticastConfig {
    /// Interface (by its address) groups are joined on and multicast is sent from. On a single
    /// host, `127.0.0.1` with `loopback: true` works without a multicast route.
    pub interface: Ipv4Addr,
    /// Time-to-live of multicast datagrams. Default 1: regions live in one subnet, and a datagram
    /// that escapes the subnet is a configuration error better caught early.
    pub ttl: u32,
    /// Whether multicast sent by this host is also delivered to its own sockets
    /// (`IP_MULTICAST_LOOP`). Default true: several nodes on one host (tests, demos) need it; a
    /// node drops its own datagrams anyway.
    pub loopback: bool,
}

impl Default for MulticastConfig {
    fn default() -> Self {
        MulticastConfig {
            interface: Ipv4Addr::LOCALHOST,
            ttl: 1,
            loopback: true,
        }
    }
}

/// Configuration of a [`NodeRuntime`](crate::NodeRuntime) (the protocol itself is configured by
/// [`tidings_proto::Config`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// A region that has not acknowledged a message of this node for this long is reported
    /// (`RuntimeStats::stalls`, and the error of a `wait_stable` that times out names whom it
    /// waits for). Default 5 s (`tidings_gms::MemberConfig::stall_after`).
    pub stall_after: Duration,
    /// Raise this process's soft limit of open files to its hard limit when a multicast node
    /// starts (a node holds a socket per 20 regions it is in, more where a socket takes only
    /// one group). A setting of the whole process, so off by default: an application that
    /// wants it says so (the `tidings` command line does). Without it, a group that finds no
    /// descriptor is refused with the reason.
    pub raise_open_file_limit: bool,
    /// Longest time the core thread spends on I/O (receiving, processing, sending) before it
    /// looks at alarms and requests again. Default 50 ms, paper 000's I/O quantum.
    pub io_quantum: Duration,
    /// Longest time the core thread spends firing alarms before it looks at I/O again. Default
    /// 5 ms, paper 000's alarm quantum. Requests have no quantum (as in the paper), but each
    /// round serves at most what was queued when it started, so a busy publisher cannot starve
    /// I/O.
    pub alarm_quantum: Duration,
    /// How long the core thread keeps polling its queues (without sleeping or yielding its
    /// core) after its last round that did work: a request served, a datagram received
    /// or sent. Work that arrives meanwhile is taken without a wake-up (each wake-up on a lone
    /// message's path was tens of microseconds on a 2-core virtual machine, ADR 45). Default
    /// zero: the thread sleeps as soon as its queues are empty, so a node costs no CPU between
    /// messages. A spin longer than the gap between messages keeps the thread awake (one core
    /// busy) while traffic flows, and on a host whose cores other processes want it was
    /// measured to make latency worse, not better; timers alone start no spin. At most 10 ms.
    pub idle_spin: Duration,
    /// Most datagrams taken from the sockets before the batch is sorted by priority and
    /// processed. Default 512: large enough that a burst is sorted as a whole (control before
    /// recovery before data, paper 000 Fig. 12), small enough (about 0.7 MB of 1472-byte
    /// datagrams) that processing a batch takes well under a millisecond.
    pub recv_batch_datagrams_max: usize,
    /// Most datagrams pulled from the protocol per send batch; consecutive datagrams to the same
    /// address and of the same length leave in one `sendmsg` with segmentation offload (GSO).
    /// Default 64: the kernel's GSO limit, and about 90 KB of 1472-byte datagrams.
    pub send_batch_datagrams_max: usize,
    /// Requested kernel receive buffer per socket. Default 32 MiB: what the protocol's default
    /// window lets one sender have in flight (16384 datagrams of about 1 KB take about 38 MB of
    /// the kernel's accounting, which counts each datagram's whole buffer), so that a receiver
    /// whose threads lose their core for a while does not drop what must then be repaired (on
    /// loopback that cut the CPU per message by a fifth). Memory is used only while datagrams
    /// wait. The kernel caps an ordinary request at `net.core.rmem_max` (often 208 KiB or
    /// 4 MiB): raise it (`sysctl -w net.core.rmem_max=33554432`), or run with `CAP_NET_ADMIN`,
    /// with which the runtime asks past it; the granted size is in
    /// [`RuntimeStats`](crate::RuntimeStats).
    pub socket_recv_buffer_bytes: usize,
    /// Requested kernel send buffer per socket. Default 4 MiB (capped at `net.core.wmem_max`
    /// for a process without `CAP_NET_ADMIN`).
    pub socket_send_buffer_bytes: usize,
    /// Whether to send runs of equal-size datagrams with one system call (UDP GSO) where the
    /// kernel supports it. Default true.
    pub gso: bool,
    /// Whether to let the kernel coalesce received datagrams (UDP GRO) where it supports it.
    /// Default true; the receive buffers are then 64 KiB each.
    pub gro: bool,
    /// The DSCP (0..=63) of congestion control's datagrams (PDCC's DCQs and UCAs), `None` to
    /// leave them unmarked like everything else. Default `Some(46)` (Expedited Forwarding,
    /// RFC 3246): Gryphon's congestion control needs its queries and alerts to pass the queues
    /// that data builds (paper 002, section 3.1), and a network that honours DSCP (a `tc prio`
    /// qdisc, a switch trusting it; Linux's default `pfifo_fast` bands EF first) sends them
    /// ahead of data. Nothing else is marked: tokens, ACKs and NAKs must not overtake the data
    /// they speak of (ADR 11), and data and repairs are what the marks make room for.
    pub control_dscp: Option<u8>,
    /// How region datagrams are sent. Default [`Transport::Unicast`].
    pub transport: Transport,
    /// Deliveries the core thread keeps for the topics it holds (a subscription of theirs has
    /// no room), in messages: what the protocol had delivered in order before the hold took
    /// effect. A held topic's streams stop at this node and every other topic goes on, so the
    /// core thread keeps reading its sockets (paper 000 drains them whenever a packet arrives:
    /// a datagram the kernel drops must be recovered, which costs far more than holding it).
    /// Past this bound it stops reading until the backlogs drain, the kernel drops, and the
    /// senders' windows slow them down. Default 16384 (one sender's window, about 17 MB of
    /// 1000-byte messages); 0 stops reading as soon as a delivery finds no room.
    pub delivery_backlog_msgs: usize,
    /// Capacity of each publisher's request queue, in messages: the slack between application
    /// threads and the protocol's own send queue. When the protocol refuses more (back pressure)
    /// the core thread stops taking requests, this queue fills, and `try_publish` reports
    /// `WouldBlock`. Default 1024: one protocol send queue's worth. A bound, not an allocation:
    /// each queue starts at 16 messages and doubles only when its publisher fills it, so a node
    /// with thousands of mostly quiet publishers does not hold thousands of full queues.
    pub publish_queue_capacity: usize,
    /// Most bytes of publish requests queued by all of the node's publishers together and not
    /// yet taken by the protocol (ADR 25): each request counts its payload plus 64 bytes. Each
    /// publisher's queue has its own bound (`publish_queue_capacity`), but ten thousand
    /// publishers could otherwise fill ten thousand queues (10 M requests and 3 GB in the
    /// `many_topics` example, one thread publishing 100-byte messages round-robin as fast as it
    /// could). Past the bound `publish` waits and `try_publish` reports `WouldBlock`, as for a
    /// full queue; waiting publishers are woken once half the bound is free. Default 64 MiB
    /// (about 400,000 requests of 100 bytes or 60,000 of 1000). A bound much smaller than
    /// what the busy topics need to fill their datagrams sends fewer messages per datagram.
    pub publish_queued_node_bytes_max: usize,
    /// Probability that a received datagram is dropped on purpose before processing (tests of
    /// recovery over real sockets). Default 0.
    pub receive_loss: f64,
    /// Seed of the injected receive loss. Default 1.
    pub receive_loss_seed: u64,
    /// The delivery scheduler (worker threads that run subscription callbacks). Default
    /// [`SchedConfig::default`] with one worker thread (callbacks are expected to be short, and
    /// on small hosts every extra thread competes with the core thread) and delivery queues of
    /// [`DELIVERY_QUEUE_DEFAULT`] events (each a batch of up to 256 messages of one topic).
    pub sched: SchedConfig,
    /// Longest wait of a control request (subscribe, stats, membership) for the core thread's
    /// answer. Default 5 s: the core thread answers within one round of its loop (at most an I/O
    /// plus an alarm quantum) unless it is stuck, which this turns into an error.
    pub request_timeout: Duration,
    /// Name of the core thread. Default `"tidings-core"`.
    pub thread_name: String,
    /// Most topics the metrics endpoint labels one by one (`topic="..."`): the held ones
    /// first, then the busiest by deliveries; the rest are summed into `topic="other"`, so
    /// that a node with 100,000 topics does not make a 100 MB scrape. Default 100: what a dashboard can show. Within
    /// 1..=[`METRICS_TOPICS_MAX`].
    pub metrics_topics_max: usize,
    /// Most streams (a sender's messages in a region: regions times senders) the metrics
    /// endpoint labels one by one (`region="...",sender="..."`): those with gaps being
    /// repaired first, then those caching the most; the rest are summed into
    /// `region="other",sender="other"` (their gaps and cached messages; their sequence numbers
    /// are left out, as they do not add up). Default 100, four series each. Within
    /// 1..=[`METRICS_STREAMS_MAX`].
    pub metrics_streams_max: usize,
}

/// Largest accepted [`RuntimeConfig::metrics_topics_max`].
pub const METRICS_TOPICS_MAX: usize = 100_000;

/// Largest accepted [`RuntimeConfig::metrics_streams_max`].
pub const METRICS_STREAMS_MAX: usize = 100_000;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            stall_after: Duration::from_secs(5),
            raise_open_file_limit: false,
            io_quantum: Duration::from_millis(50),
            idle_spin: Duration::ZERO,
            alarm_quantum: Duration::from_millis(5),
            recv_batch_datagrams_max: 512,
            send_batch_datagrams_max: 64,
            socket_recv_buffer_bytes: 32 << 20,
            socket_send_buffer_bytes: 4 << 20,
            gso: true,
            gro: true,
            control_dscp: Some(CONTROL_DSCP_DEFAULT),
            transport: Transport::Unicast,
            delivery_backlog_msgs: 16384,
            publish_queue_capacity: 1024,
            publish_queued_node_bytes_max: 64 << 20,
            receive_loss: 0.0,
            receive_loss_seed: 1,
            sched: SchedConfig {
                worker_threads: 1,
                task_queue_capacity: DELIVERY_QUEUE_DEFAULT,
                ..SchedConfig::default()
            },
            request_timeout: Duration::from_secs(5),
            thread_name: "tidings-core".to_owned(),
            metrics_topics_max: 100,
            metrics_streams_max: 100,
        }
    }
}

/// Default capacity of each subscription's delivery queue, in events (the scheduler's
/// `task_queue_capacity`; an event is a batch of up to 256 messages of one topic). A bound, not an allocation (a queue's storage follows its use), so
/// quiet topics cost nothing for it. With 1024, a saturated 1 -> 1 run stalled the core thread
/// on a full queue 2,900-3,400 times a run (each stall a wake-up); with 4096 110-160, for
/// 1.22-1.37 M msgs/s instead of 1.14-1.25 M (three interleaved runs each).
pub const DELIVERY_QUEUE_DEFAULT: usize = 4096;

/// How a node reaches the membership service ([`NodeRuntime::join`](crate::NodeRuntime::join)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GmsLinkConfig {
    /// Every replica's address, by index (one for `tidings gms` or a
    /// [`GmsServer`](crate::GmsServer) embedded in some process; 3 or 5 for a replicated
    /// service, in the same order as the replicas' own `--peers` list). The node takes GMS
    /// datagrams from these addresses only. Set it with [`GmsLinkConfig::set_servers`], which
    /// keeps `client.replicas` equal to its length.
    pub servers: Vec<std::net::SocketAddr>,
    /// The membership client (heartbeat interval, retransmission...). Its `data_addr` may stay
    /// `None`: the service then uses the address the node's datagrams come from. Its `seed`
    /// makes the join nonce: [`GmsLinkConfig::new`] draws a random one, and nodes of one
    /// service must not share it. Its `replicas` must equal `servers.len()`.
    pub client: tidings_gms::ClientConfig,
    /// Longest wait for the service to answer the join. Default 5 s; then `join` fails and names
    /// the addresses it tried.
    pub join_timeout: Duration,
    /// Longest wait, on shutdown, for the service to confirm the leave. Default 2.5 s: a
    /// replicated service's leader that just crashed is found again only after the client's
    /// `failover_timeout` (1.5 s) and a round trip, and a leave sent meanwhile must wait for
    /// it. A node that cannot confirm is removed by the service's failure detection instead.
    pub leave_timeout: Duration,
    /// Least time between two suspicions of one node reported to the service. Default 500 ms:
    /// one per heartbeat interval is enough, the service decides.
    pub suspect_interval: Duration,
    /// This node's identity and the service's key, for a service that admits only its allow
    /// list (`None`: the link is plain, for a service that admits anyone).
    pub security: Option<tidings_gms::LinkSecurity>,
    /// How protocol datagrams are protected: `Off` (default), `Authenticate` or `Encrypt`,
    /// under the datagram keys the service hands to its admitted members. Anything but `Off`
    /// needs `security` (the keys come only over the admitted link), and every node of the
    /// group must use the same mode.
    pub sealing: tidings_seal::Mode,
    /// How long a replaced datagram key still opens datagrams (`MemberConfig::key_grace`).
    /// Default 2 s.
    pub key_grace: Duration,
}

impl GmsLinkConfig {
    /// The defaults, for the one-process service at `server`.
    #[must_use]
    pub fn new(server: std::net::SocketAddr) -> GmsLinkConfig {
        GmsLinkConfig::replicated(vec![server])
    }

    /// The defaults, for the replicated service whose replicas are at `servers` (by index).
    /// [`validate`](GmsLinkConfig::validate) checks the list.
    #[must_use]
    pub fn replicated(servers: Vec<std::net::SocketAddr>) -> GmsLinkConfig {
        let replicas = servers.len();
        GmsLinkConfig {
            servers,
            // The join nonce must differ between nodes (the service tells joiners apart by it):
            // a random seed per link, unlike the sans-IO client's fixed default.
            // A node the service lost (restarted without its state) joins again by itself: the
            // member follows the new id and incarnation (ADR 32 item 10).
            client: tidings_gms::ClientConfig {
                seed: join_seed(),
                replicas,
                rejoin: true,
                ..tidings_gms::ClientConfig::default()
            },
            join_timeout: Duration::from_secs(5),
            leave_timeout: Duration::from_millis(2500),
            suspect_interval: Duration::from_millis(500),
            security: None,
            sealing: tidings_seal::Mode::Off,
            key_grace: Duration::from_secs(2),
        }
    }

    /// Replaces the replicas' addresses, and the client's count of replicas with it.
    pub fn set_servers(&mut self, servers: Vec<std::net::SocketAddr>) {
        self.client.replicas = servers.len();
        self.servers = servers;
    }

    /// The index of the replica at `addr`, if it is one of [`servers`](GmsLinkConfig::servers).
    #[must_use]
    pub fn replica_of(&self, addr: std::net::SocketAddr) -> Option<usize> {
        self.servers.iter().position(|&s| s == addr)
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("gms.join_timeout", self.join_timeout),
            ("gms.leave_timeout", self.leave_timeout),
            ("gms.suspect_interval", self.suspect_interval),
        ] {
            if d.is_zero() {
                return Err(invalid(field, d, "must be positive"));
            }
        }
        if !(1..=tidings_gms::REPLICAS_MAX).contains(&self.servers.len()) {
            return Err(invalid(
                "gms.servers",
                &self.servers,
                "must name 1..=7 replica addresses (REPLICAS_MAX)",
            ));
        }
        for (i, server) in self.servers.iter().enumerate() {
            if server.ip().is_unspecified() || server.port() == 0 {
                return Err(invalid(
                    "gms.servers",
                    server,
                    "must be reachable addresses and ports (not 0.0.0.0 or port 0)",
                ));
            }
            if self.servers.get(..i).is_some_and(|s| s.contains(server)) {
                return Err(invalid(
                    "gms.servers",
                    server,
                    "must not name an address twice",
                ));
            }
        }
        if self.sealing != tidings_seal::Mode::Off && self.security.is_none() {
            return Err(invalid(
                "gms.sealing",
                self.sealing,
                "needs an admitted link (gms.security: an identity and the service key): \
                 datagram keys are handed out only over it",
            ));
        }
        if self.client.replicas != self.servers.len() {
            return Err(invalid(
                "gms.client.replicas",
                self.client.replicas,
                "must equal the number of gms.servers (GmsLinkConfig::set_servers keeps them equal)",
            ));
        }
        self.client
            .validate()
            .map_err(|e| ConfigError::Gms(e.to_string()))
    }
}

/// A runtime configuration that cannot work, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of its allowed range.
    #[error("runtime config: {field} = {value} is invalid: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value, printed.
        value: String,
        /// What is allowed.
        why: &'static str,
    },
    /// The scheduler configuration is invalid.
    #[error("runtime config: sched: {0}")]
    Sched(#[from] tidings_sched::ConfigError),
    /// The membership client configuration is invalid.
    #[error("runtime config: gms client: {0}")]
    Gms(String),
}

fn invalid(field: &'static str, value: impl std::fmt::Debug, why: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: format!("{value:?}"),
        why,
    }
}

/// Largest accepted receive or send batch: beyond it a batch no longer fits the caches it is
/// meant to stay in, and the core thread's preallocated buffers would grow past tens of MB.
pub const BATCH_DATAGRAMS_MAX: usize = 4096;
/// The default DSCP of control datagrams: Expedited Forwarding.
pub const CONTROL_DSCP_DEFAULT: u8 = 46;
/// Largest accepted publisher queue capacity (messages).
pub const PUBLISH_QUEUE_CAPACITY_MAX: usize = 1 << 20;
/// Smallest accepted [`RuntimeConfig::publish_queued_node_bytes_max`]: a datagram's largest
/// payload, so that every publisher can always queue one request.
pub const PUBLISH_QUEUED_NODE_BYTES_MIN: usize = 1 << 16;
/// Largest accepted delivery backlog (messages): about 4 GB of 1000-byte messages.
pub const DELIVERY_BACKLOG_MSGS_MAX: usize = 1 << 22;
/// Largest accepted `idle_spin` (10 ms): a longer spin is a busy thread, not a wait.
pub const IDLE_SPIN_MAX: Duration = Duration::from_millis(10);

impl RuntimeConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("io_quantum", self.io_quantum),
            ("alarm_quantum", self.alarm_quantum),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(field, d, "must be positive"));
            }
        }
        if self.stall_after < Duration::from_millis(4) {
            return Err(invalid(
                "stall_after",
                self.stall_after,
                "must be at least 4 ms",
            ));
        }
        if self.idle_spin > IDLE_SPIN_MAX {
            return Err(invalid(
                "idle_spin",
                self.idle_spin,
                "must be at most 10 ms",
            ));
        }
        for (field, v) in [
            ("recv_batch_datagrams_max", self.recv_batch_datagrams_max),
            ("send_batch_datagrams_max", self.send_batch_datagrams_max),
        ] {
            if !(1..=BATCH_DATAGRAMS_MAX).contains(&v) {
                return Err(invalid(field, v, "must be within 1..=4096"));
            }
        }
        if !(1..=PUBLISH_QUEUE_CAPACITY_MAX).contains(&self.publish_queue_capacity) {
            return Err(invalid(
                "publish_queue_capacity",
                self.publish_queue_capacity,
                "must be within 1..=1048576",
            ));
        }
        if self.publish_queued_node_bytes_max < PUBLISH_QUEUED_NODE_BYTES_MIN {
            return Err(invalid(
                "publish_queued_node_bytes_max",
                self.publish_queued_node_bytes_max,
                "must be at least 65536 (one request of the largest payload)",
            ));
        }
        if self.delivery_backlog_msgs > DELIVERY_BACKLOG_MSGS_MAX {
            return Err(invalid(
                "delivery_backlog_msgs",
                self.delivery_backlog_msgs,
                "must be at most 4194304",
            ));
        }
        for (field, v) in [
            ("socket_recv_buffer_bytes", self.socket_recv_buffer_bytes),
            ("socket_send_buffer_bytes", self.socket_send_buffer_bytes),
        ] {
            if !(4096..=1 << 30).contains(&v) {
                return Err(invalid(field, v, "must be within 4 KiB..=1 GiB"));
            }
        }
        if let Some(dscp) = self.control_dscp {
            if dscp > 63 {
                return Err(invalid(
                    "control_dscp",
                    dscp,
                    "must be a DSCP within 0..=63 (None leaves control unmarked)",
                ));
            }
        }
        if !(0.0..1.0).contains(&self.receive_loss) {
            return Err(invalid(
                "receive_loss",
                self.receive_loss,
                "must be a probability in [0, 1)",
            ));
        }
        if let Transport::Multicast(m) = &self.transport {
            if !(1..=255).contains(&m.ttl) {
                return Err(invalid("transport.ttl", m.ttl, "must be within 1..=255"));
            }
        }
        if !(1..=METRICS_TOPICS_MAX).contains(&self.metrics_topics_max) {
            return Err(invalid(
                "metrics_topics_max",
                self.metrics_topics_max,
                "must be within 1..=100000",
            ));
        }
        if !(1..=METRICS_STREAMS_MAX).contains(&self.metrics_streams_max) {
            return Err(invalid(
                "metrics_streams_max",
                self.metrics_streams_max,
                "must be within 1..=100000",
            ));
        }
        self.sched.validate()?;
        Ok(())
    }
}

/// A seed for the GMS join nonce, from the operating system's random source. fastrand's own
/// seed hashes the clock and the thread id: processes started together (the demo's nodes)
/// drew the same nonce about once in 2,000 pairs, and the service took the second joiner for
/// the first one's repeated join. Where the OS source fails, the process id, the clock and
/// std's randomly keyed hasher still make one.
fn join_seed() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u64(crate::clock::now().as_nanos());
        h.finish()
    })
}

/// A membership service's incarnation for a service that starts without state: nonzero and
/// from the operating system's random source (as [`join_seed`]), so that a service restarted
/// without its state almost surely takes another one than the one it lost.
/// Handshake entropy from the operating system's RNG.
pub(crate) fn os_entropy() -> tidings_gms::Entropy {
    Box::new(tidings_seal::os_random)
}

pub(crate) fn draw_incarnation() -> u32 {
    loop {
        let i = join_seed() as u32;
        if i != 0 {
            return i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gms_links_check_their_replica_addresses() {
        let a = |port| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(GmsLinkConfig::new(a(7300)).validate(), Ok(()));
        let three = GmsLinkConfig::replicated(vec![a(7300), a(7301), a(7302)]);
        assert_eq!(three.validate(), Ok(()));
        assert_eq!(three.client.replicas, 3);
        assert_eq!(three.replica_of(a(7302)), Some(2));
        assert_eq!(three.replica_of(a(7303)), None);
        for servers in [
            vec![],
            vec![a(7300), a(7300)],
            vec![a(0)],
            vec![std::net::SocketAddr::from(([0, 0, 0, 0], 7300))],
            (1..=8).map(a).collect(),
        ] {
            let link = GmsLinkConfig::replicated(servers.clone());
            assert!(
                matches!(
                    link.validate(),
                    Err(ConfigError::Invalid {
                        field: "gms.servers",
                        ..
                    })
                ),
                "{servers:?}"
            );
        }
        // The client must count as many replicas as there are addresses.
        let mut link = GmsLinkConfig::new(a(7300));
        link.servers.push(a(7301));
        assert!(link.validate().is_err());
        link.set_servers(vec![a(7300), a(7301)]);
        assert_eq!(link.validate(), Ok(()));
    }

    #[test]
    fn default_is_valid_and_fields_are_checked() {
        assert_eq!(RuntimeConfig::default().validate(), Ok(()));
        let bad = RuntimeConfig {
            receive_loss: 1.0,
            ..RuntimeConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::Invalid {
                field: "receive_loss",
                ..
            })
        ));
        let bad = RuntimeConfig {
            io_quantum: Duration::ZERO,
            ..RuntimeConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RuntimeConfig {
            delivery_backlog_msgs: DELIVERY_BACKLOG_MSGS_MAX + 1,
            ..RuntimeConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RuntimeConfig {
            idle_spin: IDLE_SPIN_MAX + Duration::from_nanos(1),
            ..RuntimeConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RuntimeConfig {
            transport: Transport::Multicast(MulticastConfig {
                ttl: 0,
                ..MulticastConfig::default()
            }),
            ..RuntimeConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
