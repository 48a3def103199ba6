//! The event loop: hosts (sans-IO nodes) on a switched network of [`Link`]s, in virtual time.
//!
//! # Model
//!
//! Every node has an uplink to one switch and a downlink from it. A datagram a host sends is
//! serialized on its uplink (drop-tail), may be lost on it, and reaches the switch; at that moment
//! the switch replicates it onto the downlink of each destination (every member of the region but
//! the sender, for a multicast). From the downlink it may be lost, then it reaches the node, where
//! a blackout or a crash drops it, or it waits in the node's socket buffer (drop-tail).
//!
//! Each node has one CPU. When datagrams wait and the CPU is free (and the node is neither frozen
//! nor crashed), the node takes up to `batch_max` of them, stable-sorts them by packet priority
//! (tokens, ACKs and NAKs first; unknown kinds last) and hands them to the host one after another,
//! charging `proc_cost_per_packet` each. Then it fires the host's timer if due, then pulls
//! datagrams from the host while the uplink has room for a `max_datagram` packet (at most
//! `batch_max` per turn, so received control traffic is not starved by a sender that always has
//! data), charging the same cost per datagram sent. The node's clock during a turn runs ahead of
//! the world's by the CPU time charged; the node is busy until then. Freezes and crashes are
//! checked at the start of a turn, so a turn already under way finishes.
//!
//! # Determinism
//!
//! Events are ordered by (time, insertion sequence). Every random draw comes from a per-link,
//! per-purpose [`fastrand::Rng`] derived from the world seed and the node index, so the same seed
//! and hosts give the same run, and adding a node leaves the other links' streams unchanged.
//!
//! # Cost
//!
//! A link hands out its packets in arrival order, so each uplink (towards the switch) and each
//! downlink (towards a node) has a single event-queue entry, for its next arrival. A control packet
//! that jumps a link's data queue ([`LinkConfig::control_priority`]) may arrive before the packet
//! whose event is pending, or delay it: an earlier arrival gets an event of its own, and an event
//! that finds its packet delayed (or is superseded) reschedules or does nothing. Each node has at most
//! one live service event (CPU free, timer, uplink room, end of freeze; stale ones are skipped by
//! generation). A datagram is copied once when sent; multicast copies share it by reference count.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tidings_proto::{Destination, NodeId, RegionId, Time};
use tidings_wire::{peek_kind, Kind};

use crate::fault::{FaultError, FaultSpec, LossModel, Periodic};
use crate::net::{Class, Link, LinkConfig, LinkConfigError, LinkStats};

/// A simulated node: the sans-IO protocol node (or a test double) that the world drives.
///
/// Contract: after any `handle_*` call the world drains `poll_transmit` (while the uplink has
/// room) and then reads `poll_timeout`. Times passed in never decrease for one host.
pub trait Host {
    /// A datagram arrived and the node's CPU processes it now.
    fn handle_datagram(&mut self, now: Time, datagram: Bytes);
    /// The deadline last returned by `poll_timeout` has passed (may be called early/late; host
    /// re-checks).
    fn handle_timeout(&mut self, now: Time);
    /// Pull one datagram to send, written into `buf`; called only while the node's uplink has
    /// room for `buf.len()` bytes. Returns the destination and the number of bytes written.
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Destination, usize)>;
    /// CPU time the host spent beyond the per-datagram cost since it was last asked (work the
    /// application did on the node's CPU, such as publishing), charged to the node's turn after
    /// each `handle_*` call. Default: none.
    fn take_cpu_charge(&mut self) -> Duration {
        Duration::ZERO
    }
    /// The next time `handle_timeout` must be called.
    fn poll_timeout(&self) -> Option<Time>;
    /// A new region map for the world (a host that runs the membership service changes the
    /// multicast groups as it issues views), read at the end of each of the host's turns, before
    /// its transmits. Default: never.
    fn poll_regions(&mut self) -> Option<BTreeMap<RegionId, Vec<NodeId>>> {
        None
    }
}

/// The network and CPU parameters of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeNetConfig {
    /// Node to switch. Default [`LinkConfig::default`] (100 Mbit/s, 50 us, 256 KiB).
    pub uplink: LinkConfig,
    /// Switch to node; its buffer is the switch's output port queue. Default as `uplink`.
    pub downlink: LinkConfig,
    /// Loss on the uplink (applied after serialization, so lost packets still cost bandwidth).
    /// Default none.
    pub loss_up: LossModel,
    /// Loss on the downlink. Default none.
    pub loss_down: LossModel,
    /// Windows in which everything arriving at the node is lost (the node's link is dead inbound;
    /// what it sends still leaves). Default none.
    pub blackout: Option<Periodic>,
    /// Windows in which the node processes nothing (no datagrams, timers or transmits); arrivals
    /// wait in the socket buffer. Default none.
    pub freeze: Option<Periodic>,
    /// Receive socket buffer, drop-tail. Default 1 MiB: a generously tuned `SO_RCVBUF`, which
    /// holds about 80 ms of a saturated 100 Mbit/s link.
    pub socket_buffer_bytes: usize,
    /// CPU time charged per datagram received and per datagram sent. Default 2 us, a UDP
    /// syscall plus protocol work on the papers' hardware; it is what makes overload and
    /// priority inversion possible.
    pub proc_cost_per_packet: Duration,
}

impl NodeNetConfig {
    /// Default receive socket buffer.
    pub const SOCKET_BUFFER_BYTES_DEFAULT: usize = 1024 * 1024;
    /// Default CPU cost per datagram.
    pub const PROC_COST_PER_PACKET_DEFAULT: Duration = Duration::from_micros(2);

    /// Installs the faults of a parsed fault string: the loss model on the downlink (receivers
    /// then lose independently of each other), the blackout and freeze windows on the node.
    /// Faults the string does not mention are left as they are.
    pub fn apply_faults(&mut self, spec: &FaultSpec) -> Result<(), FaultError> {
        if let Some(loss) = &spec.loss {
            self.loss_down = loss.model()?;
        }
        if let Some(blackout) = spec.blackout {
            self.blackout = Some(blackout);
        }
        if let Some(freeze) = spec.freeze {
            self.freeze = Some(freeze);
        }
        Ok(())
    }
}

impl Default for NodeNetConfig {
    fn default() -> NodeNetConfig {
        NodeNetConfig {
            uplink: LinkConfig::default(),
            downlink: LinkConfig::default(),
            loss_up: LossModel::None,
            loss_down: LossModel::None,
            blackout: None,
            freeze: None,
            socket_buffer_bytes: Self::SOCKET_BUFFER_BYTES_DEFAULT,
            proc_cost_per_packet: Self::PROC_COST_PER_PACKET_DEFAULT,
        }
    }
}

/// Everything the world needs besides the hosts and the region map.
#[derive(Clone, Debug, PartialEq)]
pub struct WorldConfig {
    /// Seeds every random stream of the run.
    pub seed: u64,
    /// One entry per node; `nodes[i]` is `NodeId(i)`.
    pub nodes: Vec<NodeNetConfig>,
    /// Size of the buffer handed to `poll_transmit`, and the uplink room required before asking.
    /// Default 1472: the UDP payload of a 1500-byte Ethernet frame.
    pub max_datagram: usize,
    /// Most datagrams a node processes, and most it sends, per turn of its loop. Default 64, a
    /// `recvmmsg` batch.
    pub batch_max: usize,
    /// A sniffer on the switch (a mirror port): a copy of datagrams crossing the switch goes to
    /// this node too, as a host on a shared LAN would see them. Default none.
    pub tap: Option<Tap>,
}

/// A mirror port of the switch ([`WorldConfig::tap`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tap {
    /// The node that receives the copies (through its downlink, like any datagram).
    pub node: NodeId,
    /// One datagram in this many is copied (1: every one), counted over everything the switch
    /// forwards from other nodes.
    pub every: u32,
}

impl WorldConfig {
    /// Default largest datagram.
    pub const MAX_DATAGRAM_DEFAULT: usize = 1472;
    /// Default batch.
    pub const BATCH_MAX_DEFAULT: usize = 64;

    /// `node_count` nodes with the same configuration, default datagram and batch sizes.
    #[must_use]
    pub fn uniform(seed: u64, node_count: usize, node: &NodeNetConfig) -> WorldConfig {
        WorldConfig {
            seed,
            nodes: vec![node.clone(); node_count],
            max_datagram: Self::MAX_DATAGRAM_DEFAULT,
            batch_max: Self::BATCH_MAX_DEFAULT,
            tap: None,
        }
    }
}

/// Why a world could not be built, or an operation on it was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorldError {
    /// `config.nodes` and the hosts differ in length.
    #[error("{configs} node configurations but {hosts} hosts")]
    HostCount {
        /// Entries in `config.nodes`.
        configs: usize,
        /// Hosts given.
        hosts: usize,
    },
    /// More nodes than a [`NodeId`] can name.
    #[error("{0} nodes do not fit in a 32-bit node id")]
    TooManyNodes(usize),
    /// `max_datagram` or `batch_max` is zero.
    #[error("max_datagram ({max_datagram}) and batch_max ({batch_max}) must be non-zero")]
    ZeroLimit {
        /// The configured value.
        max_datagram: usize,
        /// The configured value.
        batch_max: usize,
    },
    /// A link configuration is invalid.
    #[error("node {node} {direction}: {source}")]
    Link {
        /// The node.
        node: NodeId,
        /// `uplink` or `downlink`.
        direction: &'static str,
        /// What is wrong.
        source: LinkConfigError,
    },
    /// A buffer cannot hold one `max_datagram` packet, so the node could never send or receive it.
    #[error(
        "node {node} {buffer} of {buffer_bytes} bytes cannot hold a {max_datagram}-byte datagram"
    )]
    BufferTooSmall {
        /// The node.
        node: NodeId,
        /// `uplink buffer` or `socket buffer`.
        buffer: &'static str,
        /// Its size.
        buffer_bytes: usize,
        /// The configured largest datagram.
        max_datagram: usize,
    },
    /// A loss model or window is invalid.
    #[error("node {node} {what}: {source}")]
    Fault {
        /// The node.
        node: NodeId,
        /// `loss_up`, `loss_down`, `blackout` or `freeze`.
        what: &'static str,
        /// What is wrong.
        source: FaultError,
    },
    /// A region lists a node that does not exist.
    #[error("region {region} lists node {node}, which does not exist")]
    UnknownMember {
        /// The region.
        region: RegionId,
        /// The missing node.
        node: NodeId,
    },
    /// A region lists a node twice (it would receive each multicast twice).
    #[error("region {region} lists node {node} twice")]
    DuplicateMember {
        /// The region.
        region: RegionId,
        /// The repeated node.
        node: NodeId,
    },
    /// An operation named a node that does not exist.
    #[error("no node {0}")]
    UnknownNode(NodeId),
    /// An operation was scheduled before the world's current time.
    #[error("time {at:?} is before the world's current time {now:?}")]
    InThePast {
        /// The requested time.
        at: Time,
        /// The world's time.
        now: Time,
    },
}

/// Datagrams lost, by cause. Drops on the way to a node are counted at that node, except uplink
/// drops, which are counted at the sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DropCounts {
    /// Lost on the node's uplink (counted at the sender).
    pub loss_up: u64,
    /// Lost on the node's downlink.
    pub loss_down: u64,
    /// Refused by the node's full uplink buffer (counted at the sender).
    pub tail_drop_up: u64,
    /// Refused by the full switch port (downlink buffer) towards the node.
    pub tail_drop_down: u64,
    /// Arrived during a blackout of the node.
    pub blackout: u64,
    /// Arrived at a full socket buffer.
    pub socket_overflow: u64,
    /// Arrived at, or were waiting in the socket of, a crashed node.
    pub crashed: u64,
}

impl DropCounts {
    /// All drops.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.loss_up
            + self.loss_down
            + self.tail_drop_up
            + self.tail_drop_down
            + self.blackout
            + self.socket_overflow
            + self.crashed
    }
}

/// Counters of one node and its two links.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeStats {
    /// Datagrams the host produced (`poll_transmit` returned one).
    pub datagrams_sent: u64,
    /// Bytes of those datagrams.
    pub bytes_sent: u64,
    /// Datagrams handed to the host.
    pub datagrams_delivered: u64,
    /// Bytes of those datagrams.
    pub bytes_delivered: u64,
    /// Datagrams lost, by cause.
    pub drops: DropCounts,
    /// CPU time charged (receiving and sending).
    pub busy_time: Duration,
    /// Most bytes ever waiting in the socket buffer.
    pub socket_queue_bytes_max: usize,
    /// The uplink's counters (including its largest queue).
    pub uplink: LinkStats,
    /// The downlink's counters (including its largest queue).
    pub downlink: LinkStats,
}

/// Counters of the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorldStats {
    /// Per node, indexed by node id.
    pub nodes: Vec<NodeStats>,
    /// Datagrams sent to a node or region that does not exist.
    pub unroutable: u64,
    /// Events processed (a measure of the engine's work).
    pub events: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// The node's turn (CPU free, timer due, uplink room, end of freeze), valid if `gen` is
    /// still the node's current generation.
    Service { node: u32, gen: u64 },
    /// The head of the node's uplink queue reaches the switch.
    Switch { node: u32 },
    /// The head of the node's downlink queue reaches the node.
    Arrive { node: u32 },
    /// The node crashes.
    Crash { node: u32 },
}

/// Pending events, in buckets of events of one time taken in insertion order, the buckets in a
/// binary heap ordered by (time, creation sequence). An event joins the most recently created
/// bucket if that has its time (a multicast reaches every idle receiver's downlink end at the
/// same instant, one push after another), else starts a bucket of its own. So ties are broken by
/// insertion order, and an event pushed for the current time while a bucket of that time is
/// being processed comes after all of it. (An ordered map of one bucket per time cost about 550
/// instructions per event in the GMS churn sweep, where most events have a time of their own; a
/// heap of single events was 40% slower on the fan-out of `tests/world_perf.rs`.)
#[derive(Debug, Default)]
struct EventQueue {
    heap: std::collections::BinaryHeap<Bucket>,
    /// The buckets' events, by slot; emptied slots are reused, so steady state allocates
    /// nothing.
    slots: Vec<Vec<Event>>,
    free: Vec<usize>,
    /// The most recently created bucket, while it is still queued: its time and slot.
    last: Option<(Time, usize)>,
    /// Creation sequence of the next bucket.
    next_seq: u64,
}

/// A queued bucket, ordered earliest first (the heap is a max-heap, so the order is reversed).
#[derive(Debug)]
struct Bucket {
    at: Time,
    seq: u64,
    slot: usize,
}

impl PartialEq for Bucket {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Bucket {}

impl PartialOrd for Bucket {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bucket {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl EventQueue {
    fn push(&mut self, at: Time, event: Event) {
        if let Some((t, slot)) = self.last {
            if t == at {
                self.slots[slot].push(event);
                return;
            }
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Vec::new());
            self.slots.len() - 1
        });
        self.slots[slot].push(event);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Bucket { at, seq, slot });
        self.last = Some((at, slot));
    }

    fn next_time(&self) -> Option<Time> {
        self.heap.peek().map(|b| b.at)
    }

    /// Removes the earliest bucket if its time is at or before `t`: its time and events. Events
    /// pushed meanwhile go to other buckets; give the list back with [`recycle`](Self::recycle).
    fn pop_bucket(&mut self, t: Time) -> Option<(Time, Vec<Event>, usize)> {
        if self.heap.peek()?.at > t {
            return None;
        }
        let bucket = self.heap.pop()?;
        if self.last.is_some_and(|(_, slot)| slot == bucket.slot) {
            self.last = None;
        }
        let events = std::mem::take(&mut self.slots[bucket.slot]);
        Some((bucket.at, events, bucket.slot))
    }

    fn recycle(&mut self, mut events: Vec<Event>, slot: usize) {
        events.clear();
        self.slots[slot] = events;
        self.free.push(slot);
    }
}

/// Per-node simulation state.
#[derive(Debug)]
struct NodeState {
    /// Carries (destination, bytes) to the switch.
    uplink: Link<(Destination, Bytes)>,
    /// Carries bytes to the node.
    downlink: Link<Bytes>,
    /// Time of the pending event for the uplink's next arrival at the switch (`Time::MAX`: none).
    switch_at: Time,
    /// Time of the pending event for the downlink's next arrival at the node (`Time::MAX`: none).
    arrive_at: Time,
    loss_up: LossModel,
    loss_down: LossModel,
    rng_up: fastrand::Rng,
    rng_down: fastrand::Rng,
    blackout: Option<Periodic>,
    freeze: Option<Periodic>,
    socket_buffer_bytes: usize,
    proc_cost: Duration,
    /// Received, waiting for the CPU.
    socket: VecDeque<Bytes>,
    socket_bytes: usize,
    busy_until: Time,
    /// Time of the live service event, `Time::MAX` if none.
    service_at: Time,
    service_gen: u64,
    crashed: bool,
}

impl NodeState {
    /// Makes sure the node gets a turn at `at` or earlier.
    fn schedule(&mut self, events: &mut EventQueue, node: u32, at: Time) {
        if at < self.service_at {
            self.service_gen += 1;
            self.service_at = at;
            events.push(
                at,
                Event::Service {
                    node,
                    gen: self.service_gen,
                },
            );
        }
    }

    fn frozen(&self, now: Time) -> bool {
        self.freeze.is_some_and(|f| f.active(now))
    }
}

/// Random stream purposes, mixed into the per-node seeds.
const PURPOSE_LOSS_UP: u64 = 1;
const PURPOSE_LOSS_DOWN: u64 = 2;

/// One splitmix64 step: a strong 64-bit mix, so nearby (seed, node, purpose) give unrelated
/// streams.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn derive_seed(seed: u64, node: u64, purpose: u64) -> u64 {
    splitmix(splitmix(seed) ^ splitmix(node.wrapping_mul(16).wrapping_add(purpose)))
}

/// Sort key of a received datagram: its kind's priority, unknown kinds after every known one.
fn priority_key(datagram: &[u8]) -> u8 {
    peek_kind(datagram).map_or(u8::MAX, |kind| kind.priority() as u8)
}

/// The simulated network and its hosts. See the [module docs](self) for the model.
pub struct World<H: Host> {
    config: WorldConfig,
    hosts: Vec<H>,
    regions: BTreeMap<RegionId, Vec<NodeId>>,
    nodes: Vec<NodeState>,
    events: EventQueue,
    now: Time,
    stats: WorldStats,
    /// Reused transmit buffer of `max_datagram` bytes.
    tx_buf: Vec<u8>,
    /// Reused batch of (priority key, datagram).
    batch: Vec<(u8, Bytes)>,
    /// Datagrams the switch forwarded from nodes other than the tap's ([`WorldConfig::tap`]).
    tap_seen: u64,
}

impl<H: Host> World<H> {
    /// Builds a world at time zero; every node gets a first turn at time zero (to read its timer
    /// and initial transmits). `hosts[i]` is `NodeId(i)`; `regions` expands multicast
    /// destinations (a multicast is never delivered back to its sender).
    pub fn new(
        config: WorldConfig,
        hosts: Vec<H>,
        regions: BTreeMap<RegionId, Vec<NodeId>>,
    ) -> Result<World<H>, WorldError> {
        let n = config.nodes.len();
        if n != hosts.len() {
            return Err(WorldError::HostCount {
                configs: n,
                hosts: hosts.len(),
            });
        }
        if u32::try_from(n).is_err() {
            return Err(WorldError::TooManyNodes(n));
        }
        if config.max_datagram == 0 || config.batch_max == 0 {
            return Err(WorldError::ZeroLimit {
                max_datagram: config.max_datagram,
                batch_max: config.batch_max,
            });
        }
        check_regions(&regions, n)?;
        let mut nodes = Vec::with_capacity(n);
        let mut events = EventQueue::default();
        for (i, c) in config.nodes.iter().enumerate() {
            let node = NodeId(i as u32);
            let link_error = |direction| {
                move |source| WorldError::Link {
                    node,
                    direction,
                    source,
                }
            };
            let fault = |what| move |source| WorldError::Fault { node, what, source };
            c.loss_up.validate().map_err(fault("loss_up"))?;
            c.loss_down.validate().map_err(fault("loss_down"))?;
            if let Some(w) = &c.blackout {
                w.validate().map_err(fault("blackout"))?;
            }
            if let Some(w) = &c.freeze {
                w.validate().map_err(fault("freeze"))?;
            }
            for (buffer, buffer_bytes) in [
                ("uplink buffer", c.uplink.buffer_bytes),
                ("socket buffer", c.socket_buffer_bytes),
            ] {
                if buffer_bytes < config.max_datagram {
                    return Err(WorldError::BufferTooSmall {
                        node,
                        buffer,
                        buffer_bytes,
                        max_datagram: config.max_datagram,
                    });
                }
            }
            let mut state = NodeState {
                uplink: Link::new(c.uplink).map_err(link_error("uplink"))?,
                downlink: Link::new(c.downlink).map_err(link_error("downlink"))?,
                loss_up: c.loss_up.clone(),
                loss_down: c.loss_down.clone(),
                rng_up: fastrand::Rng::with_seed(derive_seed(
                    config.seed,
                    i as u64,
                    PURPOSE_LOSS_UP,
                )),
                rng_down: fastrand::Rng::with_seed(derive_seed(
                    config.seed,
                    i as u64,
                    PURPOSE_LOSS_DOWN,
                )),
                blackout: c.blackout,
                freeze: c.freeze,
                socket_buffer_bytes: c.socket_buffer_bytes,
                proc_cost: c.proc_cost_per_packet,
                switch_at: Time::MAX,
                arrive_at: Time::MAX,
                socket: VecDeque::new(),
                socket_bytes: 0,
                busy_until: Time::ZERO,
                service_at: Time::MAX,
                service_gen: 0,
                crashed: false,
            };
            state.schedule(&mut events, i as u32, Time::ZERO);
            nodes.push(state);
        }
        let stats = WorldStats {
            nodes: vec![NodeStats::default(); n],
            unroutable: 0,
            events: 0,
        };
        let tx_buf = vec![0; config.max_datagram];
        let batch = Vec::with_capacity(config.batch_max);
        Ok(World {
            config,
            hosts,
            regions,
            nodes,
            events,
            now: Time::ZERO,
            stats,
            tx_buf,
            batch,
            tap_seen: 0,
        })
    }

    /// The world's current time.
    #[must_use]
    pub fn now(&self) -> Time {
        self.now
    }

    /// The configuration the world was built from.
    #[must_use]
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// The region map.
    #[must_use]
    pub fn regions(&self) -> &BTreeMap<RegionId, Vec<NodeId>> {
        &self.regions
    }

    /// Replaces the region map (multicast group membership changes with the views, as IP
    /// multicast joins and leaves would). Datagrams already at the switch keep their old fan-out.
    pub fn set_regions(
        &mut self,
        regions: BTreeMap<RegionId, Vec<NodeId>>,
    ) -> Result<(), WorldError> {
        check_regions(&regions, self.hosts.len())?;
        self.regions = regions;
        Ok(())
    }

    /// All hosts; `hosts()[i]` is `NodeId(i)`.
    #[must_use]
    pub fn hosts(&self) -> &[H] {
        &self.hosts
    }

    /// All hosts, mutably (for commands injected between `run_until` calls; the world does not
    /// notice new transmits or timers until the node's next turn, so prefer hosts that act from
    /// their own timers).
    pub fn hosts_mut(&mut self) -> &mut [H] {
        &mut self.hosts
    }

    /// One host.
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn host(&self, node: NodeId) -> &H {
        &self.hosts[node.0 as usize]
    }

    /// One host, mutably. The same caveat as [`hosts_mut`](Self::hosts_mut) applies; call
    /// [`wake`](Self::wake) after changing what the host wants to do.
    ///
    /// # Panics
    /// If `node` does not exist.
    pub fn host_mut(&mut self, node: NodeId) -> &mut H {
        &mut self.hosts[node.0 as usize]
    }

    /// Gives up the hosts (after a run, to inspect them by value).
    #[must_use]
    pub fn into_hosts(self) -> Vec<H> {
        self.hosts
    }

    /// Gives `node` a turn at the current time (or as soon as it is free), so it sees changes
    /// made through [`host_mut`](Self::host_mut).
    pub fn wake(&mut self, node: NodeId) -> Result<(), WorldError> {
        let now = self.now;
        let state = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(WorldError::UnknownNode(node))?;
        state.schedule(&mut self.events, node.0, now);
        Ok(())
    }

    /// Counters, with the link counters as of the last [`run_until`](Self::run_until).
    #[must_use]
    pub fn stats(&self) -> &WorldStats {
        &self.stats
    }

    /// The uplink of `node` (for its live counters and queue).
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn uplink(&self, node: NodeId) -> &Link<(Destination, Bytes)> {
        &self.nodes[node.0 as usize].uplink
    }

    /// The downlink of `node`.
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn downlink(&self, node: NodeId) -> &Link<Bytes> {
        &self.nodes[node.0 as usize].downlink
    }

    /// Throttles or restores `node`'s downlink (the switch port towards it) from now on: new
    /// bandwidth and buffer, see [`Link::reconfigure`].
    pub fn reconfigure_downlink(
        &mut self,
        node: NodeId,
        bandwidth_bps: u64,
        buffer_bytes: usize,
    ) -> Result<(), WorldError> {
        let state = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(WorldError::UnknownNode(node))?;
        state
            .downlink
            .reconfigure(bandwidth_bps, buffer_bytes)
            .map_err(|source| WorldError::Link {
                node,
                direction: "downlink",
                source,
            })
    }

    /// Throttles or restores `node`'s uplink from now on, see [`Link::reconfigure`].
    pub fn reconfigure_uplink(
        &mut self,
        node: NodeId,
        bandwidth_bps: u64,
        buffer_bytes: usize,
    ) -> Result<(), WorldError> {
        if buffer_bytes < self.config.max_datagram {
            return Err(WorldError::BufferTooSmall {
                node,
                buffer: "uplink buffer",
                buffer_bytes,
                max_datagram: self.config.max_datagram,
            });
        }
        let state = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(WorldError::UnknownNode(node))?;
        state
            .uplink
            .reconfigure(bandwidth_bps, buffer_bytes)
            .map_err(|source| WorldError::Link {
                node,
                direction: "uplink",
                source,
            })
    }

    /// Replaces `node`'s blackout windows (for instance with one long window: a link that fails
    /// and comes back).
    pub fn set_blackout(
        &mut self,
        node: NodeId,
        blackout: Option<Periodic>,
    ) -> Result<(), WorldError> {
        if let Some(w) = &blackout {
            w.validate().map_err(|source| WorldError::Fault {
                node,
                what: "blackout",
                source,
            })?;
        }
        let state = self
            .nodes
            .get_mut(node.0 as usize)
            .ok_or(WorldError::UnknownNode(node))?;
        state.blackout = blackout;
        Ok(())
    }

    /// Fraction of the time so far that `node`'s CPU was busy, in `[0, 1]`. CPU time already
    /// charged for work that runs past the current time (a turn's clock runs ahead of the
    /// world's) is not counted yet.
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn node_busy_fraction(&self, node: NodeId) -> f64 {
        let elapsed = self.now.as_nanos();
        if elapsed == 0 {
            return 0.0;
        }
        let i = node.0 as usize;
        let ahead = self.nodes[i].busy_until - self.now;
        let busy = self.stats.nodes[i].busy_time.saturating_sub(ahead);
        busy.as_nanos() as f64 / elapsed as f64
    }

    /// Whether `node` is inside a freeze window at `now`.
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn is_frozen(&self, node: NodeId, now: Time) -> bool {
        self.nodes[node.0 as usize].frozen(now)
    }

    /// Whether `node` has crashed.
    ///
    /// # Panics
    /// If `node` does not exist.
    #[must_use]
    pub fn is_crashed(&self, node: NodeId) -> bool {
        self.nodes[node.0 as usize].crashed
    }

    /// Crashes `node` at `at`: from then on it does nothing, its socket buffer is discarded and
    /// datagrams arriving at it are dropped (all counted as `crashed`). What it already put on
    /// its uplink still arrives.
    pub fn crash(&mut self, node: NodeId, at: Time) -> Result<(), WorldError> {
        if node.0 as usize >= self.nodes.len() {
            return Err(WorldError::UnknownNode(node));
        }
        if at < self.now {
            return Err(WorldError::InThePast { at, now: self.now });
        }
        self.events.push(at, Event::Crash { node: node.0 });
        Ok(())
    }

    /// The time of the next pending event, if any (stale service events included).
    #[must_use]
    pub fn next_event_time(&self) -> Option<Time> {
        self.events.next_time()
    }

    /// Processes every event at or before `t`, then sets the clock to `t` (if it is later).
    pub fn run_until(&mut self, t: Time) {
        while let Some((at, mut events, slot)) = self.events.pop_bucket(t) {
            self.now = at;
            self.stats.events += events.len() as u64;
            for event in events.drain(..) {
                self.dispatch(at, event);
            }
            self.events.recycle(events, slot);
        }
        self.now = self.now.max(t);
        for (state, stats) in self.nodes.iter().zip(&mut self.stats.nodes) {
            stats.uplink = *state.uplink.stats();
            stats.downlink = *state.downlink.stats();
        }
    }

    fn dispatch(&mut self, at: Time, event: Event) {
        match event {
            Event::Service { node, gen } => {
                let state = &mut self.nodes[node as usize];
                if state.service_gen == gen && state.service_at == at {
                    state.service_at = Time::MAX;
                    self.service(node);
                }
            }
            Event::Switch { node } => self.on_switch(node),
            Event::Arrive { node } => self.on_arrive(node),
            Event::Crash { node } => self.on_crash(node),
        }
    }

    fn on_crash(&mut self, node: u32) {
        let state = &mut self.nodes[node as usize];
        if state.crashed {
            return;
        }
        state.crashed = true;
        self.stats.nodes[node as usize].drops.crashed += state.socket.len() as u64;
        state.socket.clear();
        state.socket_bytes = 0;
    }

    /// The head of `src`'s uplink queue reaches the switch, which replicates it onto the
    /// destinations' downlinks.
    fn on_switch(&mut self, src: u32) {
        let now = self.now;
        let max_datagram = self.config.max_datagram;
        let state = &mut self.nodes[src as usize];
        let Some((destination, datagram)) = take_arrival(
            &mut state.uplink,
            &mut state.switch_at,
            &mut self.events,
            now,
            Event::Switch { node: src },
        ) else {
            return;
        };
        let class = link_class(&datagram);
        if let Some(tap) = self.config.tap.filter(|t| t.node.0 != src) {
            self.tap_seen += 1;
            let addressed = match destination {
                Destination::Node(dst) => dst == tap.node,
                Destination::Region(_) => false,
            };
            if !addressed && self.tap_seen.is_multiple_of(u64::from(tap.every.max(1))) {
                if let Some(state) = self.nodes.get_mut(tap.node.0 as usize) {
                    forward(
                        state,
                        &mut self.stats.nodes[tap.node.0 as usize],
                        &mut self.events,
                        tap.node.0,
                        (now, max_datagram),
                        (&datagram, class),
                    );
                }
            }
        }
        match destination {
            Destination::Node(dst) => match self.nodes.get_mut(dst.0 as usize) {
                Some(state) => forward(
                    state,
                    &mut self.stats.nodes[dst.0 as usize],
                    &mut self.events,
                    dst.0,
                    (now, max_datagram),
                    (&datagram, class),
                ),
                None => self.stats.unroutable += 1,
            },
            Destination::Region(region) => match self.regions.get(&region) {
                Some(members) => {
                    for &dst in members {
                        if dst.0 == src {
                            continue;
                        }
                        let i = dst.0 as usize;
                        forward(
                            &mut self.nodes[i],
                            &mut self.stats.nodes[i],
                            &mut self.events,
                            dst.0,
                            (now, max_datagram),
                            (&datagram, class),
                        );
                    }
                }
                None => self.stats.unroutable += 1,
            },
        }
    }

    /// The head of `node`'s downlink queue reaches it.
    fn on_arrive(&mut self, node: u32) {
        let now = self.now;
        let i = node as usize;
        let state = &mut self.nodes[i];
        let Some(datagram) = take_arrival(
            &mut state.downlink,
            &mut state.arrive_at,
            &mut self.events,
            now,
            Event::Arrive { node },
        ) else {
            return;
        };
        let stats = &mut self.stats.nodes[i];
        if state.crashed {
            stats.drops.crashed += 1;
            return;
        }
        if state.blackout.is_some_and(|w| w.active(now)) {
            stats.drops.blackout += 1;
            return;
        }
        let len = datagram.len();
        if state.socket_bytes + len > state.socket_buffer_bytes {
            stats.drops.socket_overflow += 1;
            return;
        }
        state.socket.push_back(datagram);
        state.socket_bytes += len;
        stats.socket_queue_bytes_max = stats.socket_queue_bytes_max.max(state.socket_bytes);
        if let Some(freeze) = state.freeze.filter(|f| f.active(now)) {
            state.schedule(&mut self.events, node, freeze.next_change(now));
        } else if state.busy_until > now {
            state.schedule(&mut self.events, node, state.busy_until);
        } else {
            // Idle: take the turn now rather than through the queue; this is the common case
            // and saves two heap operations per arrival.
            self.service(node);
        }
    }

    /// One turn of `node`'s loop at the world's current time: a batch of received datagrams,
    /// the timer, then transmits; then the next turn is scheduled.
    fn service(&mut self, node: u32) {
        let now = self.now;
        let i = node as usize;
        let max_datagram = self.config.max_datagram;
        let batch_max = self.config.batch_max;
        let node_count = self.nodes.len();
        let state = &mut self.nodes[i];
        if state.crashed {
            return;
        }
        if let Some(freeze) = state.freeze.filter(|f| f.active(now)) {
            state.schedule(&mut self.events, node, freeze.next_change(now));
            return;
        }
        if state.busy_until > now {
            state.schedule(&mut self.events, node, state.busy_until);
            return;
        }
        let host = &mut self.hosts[i];
        let stats = &mut self.stats.nodes[i];
        let cost = state.proc_cost;
        // The node's own clock: advances by the CPU time charged during this turn.
        let mut t = now;

        if !state.socket.is_empty() {
            let batch = &mut self.batch;
            batch.clear();
            for _ in 0..state.socket.len().min(batch_max) {
                let Some(datagram) = state.socket.pop_front() else {
                    break;
                };
                state.socket_bytes -= datagram.len();
                batch.push((priority_key(&datagram), datagram));
            }
            // Stable insertion sort: batches are at most batch_max long and usually one
            // priority, and this neither allocates nor reorders equals.
            for j in 1..batch.len() {
                let mut k = j;
                while k > 0 && batch[k - 1].0 > batch[k].0 {
                    batch.swap(k - 1, k);
                    k -= 1;
                }
            }
            for (_, datagram) in batch.drain(..) {
                stats.datagrams_delivered += 1;
                stats.bytes_delivered += datagram.len() as u64;
                host.handle_datagram(t, datagram);
                let charged = cost + host.take_cpu_charge();
                t += charged;
                stats.busy_time += charged;
            }
        }

        let mut fired = false;
        if host.poll_timeout().is_some_and(|deadline| deadline <= t) {
            host.handle_timeout(t);
            let charged = host.take_cpu_charge();
            t += charged;
            stats.busy_time += charged;
            fired = true;
        }
        if let Some(regions) = host.poll_regions() {
            // A map naming unknown nodes is refused (the old one stays) and counted.
            if check_regions(&regions, node_count).is_ok() {
                self.regions = regions;
            } else {
                self.stats.unroutable += 1;
            }
        }

        let mut more = false;
        let mut blocked = false;
        let mut sent = 0;
        loop {
            if sent == batch_max {
                more = true;
                break;
            }
            if !state.uplink.has_room(t, max_datagram) {
                blocked = true;
                break;
            }
            let Some((destination, len)) = host.poll_transmit(t, &mut self.tx_buf) else {
                break;
            };
            assert!(
                len <= max_datagram,
                "host {node} wrote {len} bytes into a {max_datagram}-byte buffer"
            );
            let datagram = Bytes::copy_from_slice(&self.tx_buf[..len]);
            sent += 1;
            stats.datagrams_sent += 1;
            stats.bytes_sent += len as u64;
            t += cost;
            stats.busy_time += cost;
            let class = link_class(&datagram);
            let (loss, rng, link) = (&mut state.loss_up, &mut state.rng_up, &state.uplink);
            loss.pass_idle(rng, t.saturating_duration_since(link.free_at()), || {
                link.config().transmit_time(max_datagram)
            });
            let mut lost = false;
            let arrives = || {
                lost = loss.drops(rng);
                (!lost).then_some((destination, datagram))
            };
            match state.uplink.offer(t, len, class, arrives) {
                Err(_) => stats.drops.tail_drop_up += 1,
                Ok(_) if lost => stats.drops.loss_up += 1,
                Ok(_) => schedule_arrival(
                    &state.uplink,
                    &mut state.switch_at,
                    &mut self.events,
                    Event::Switch { node },
                ),
            }
        }
        state.busy_until = t;

        let mut next = Time::MAX;
        if more || !state.socket.is_empty() {
            next = t;
        }
        if blocked {
            next = next.min(state.uplink.room_at(t, max_datagram));
        }
        if let Some(deadline) = host.poll_timeout() {
            // A host that just handled its timer and still reports it due is retried a
            // nanosecond later rather than spun at the same instant forever.
            let floor = if fired {
                t + Duration::from_nanos(1)
            } else {
                t
            };
            next = next.min(deadline.max(floor));
        }
        if next != Time::MAX {
            state.schedule(&mut self.events, node, next);
        }
    }
}

/// The switch puts `datagram` (of link class `class`, the same for every copy) on `dst`'s
/// downlink at `now` (`max_datagram`: the packet time of the loss model's idle steps). The copy
/// shares the datagram and is made only if the packet arrives.
fn forward(
    state: &mut NodeState,
    stats: &mut NodeStats,
    events: &mut EventQueue,
    dst: u32,
    (now, max_datagram): (Time, usize),
    (datagram, class): (&Bytes, Class),
) {
    let len = datagram.len();
    let (loss, rng, link) = (&mut state.loss_down, &mut state.rng_down, &state.downlink);
    loss.pass_idle(rng, now.saturating_duration_since(link.free_at()), || {
        link.config().transmit_time(max_datagram)
    });
    let mut lost = false;
    let arrives = || {
        lost = loss.drops(rng);
        (!lost).then(|| datagram.clone())
    };
    match state.downlink.offer(now, len, class, arrives) {
        Err(_) => stats.drops.tail_drop_down += 1,
        Ok(_) if lost => stats.drops.loss_down += 1,
        Ok(_) => schedule_arrival(
            &state.downlink,
            &mut state.arrive_at,
            events,
            Event::Arrive { node: dst },
        ),
    }
}

/// The queue a datagram joins on a link with control priority: Gryphon's congestion messages
/// (DCQ, UCA) are control, everything else is data. Not the other control kinds: a token
/// announces messages (its records) that would then overtake the data still queued, and the
/// receiver would ask for them again (ADR 11).
fn link_class(datagram: &[u8]) -> Class {
    match peek_kind(datagram) {
        Some(Kind::Dcq | Kind::Uca) => Class::Control,
        _ => Class::Data,
    }
}

/// Makes sure an event (`event`, pending at `scheduled`) comes at `link`'s next arrival: pushes
/// one if that is earlier than the one pending.
fn schedule_arrival<P>(
    link: &Link<P>,
    scheduled: &mut Time,
    events: &mut EventQueue,
    event: Event,
) {
    if let Some(next) = link.next_arrival() {
        if next < *scheduled {
            events.push(next, event);
            *scheduled = next;
        }
    }
}

/// The packet `link` delivers at `now`, if the event firing now is the pending one (`scheduled`)
/// and its packet was not delayed by a control packet; schedules the event for the next arrival.
fn take_arrival<P>(
    link: &mut Link<P>,
    scheduled: &mut Time,
    events: &mut EventQueue,
    now: Time,
    event: Event,
) -> Option<P> {
    if *scheduled != now {
        return None; // superseded by an earlier event
    }
    *scheduled = Time::MAX;
    let packet = link.pop_arrival(now);
    schedule_arrival(link, scheduled, events, event);
    packet
}

/// Every member of every region is a node of the world, listed once.
fn check_regions(regions: &BTreeMap<RegionId, Vec<NodeId>>, n: usize) -> Result<(), WorldError> {
    for (&region, members) in regions {
        let mut seen = vec![false; n];
        for &node in members {
            let index = node.0 as usize;
            if index >= n {
                return Err(WorldError::UnknownMember { region, node });
            }
            if std::mem::replace(&mut seen[index], true) {
                return Err(WorldError::DuplicateMember { region, node });
            }
        }
    }
    Ok(())
}
