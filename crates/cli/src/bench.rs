//! `tidings bench`: publishers and subscribers as separate processes on this host (this binary
//! re-executed as `tidings bench-child`), a static membership and an address book handed to the
//! children, and the raw UDP ceiling for the same datagram size measured in the same run.
//!
//! The parent and each child talk in JSON lines: the child's stdout carries [`FromChild`], its
//! stdin [`ToChild`]. A child that sees its stdin close, or outlives its `lifetime_ms`, exits, so
//! no child outlives a parent that died.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tidings::{GmsConfig, SecurityMode};
use tidings_bench::runtime::{self as rt_bench, RawMode, RawTarget};
use tidings_proto::{CongestionControl, Membership, NodeId, RegionId, TopicId};
use tidings_runtime::{AddressBook, GmsServer, MulticastConfig, Transport};

#[path = "bench_sys.rs"]
pub(crate) mod bench_sys;
#[path = "bench_child.rs"]
mod child;
#[path = "bench_oneway.rs"]
pub(crate) mod oneway;

/// Bytes at the start of every payload: publish time (shared clock, ns), publisher index,
/// sequence number within (publisher, topic).
pub(crate) const HEADER_BYTES: usize = 16;
/// Messages per latency sample at full rate (see `--latency-sample-every`).
const LATENCY_SAMPLE_EVERY_DEFAULT: u32 = 16;

/// A spec without the field (an older parent) measures every message.
fn every_message() -> u32 {
    1
}

/// `--latency-sample-every`, or its default: every message of a paced run (few of them, and
/// the clock is cheap next to the pacing), one in 16 at full rate.
fn latency_sample_every(args: &BenchArgs) -> u32 {
    args.latency_sample_every.unwrap_or(if args.rate.is_some() {
        1
    } else {
        LATENCY_SAMPLE_EVERY_DEFAULT
    })
}
/// What a datagram holds beside one message's payload: the datagram header (16), a
/// retransmission's extra fields (6) and the message header (30), as
/// `tidings_proto::Node::max_payload` computes it.
const MESSAGE_FRAMING_BYTES: usize = 16 + 6 + 30;
/// How long children have to start, bind, and build their nodes.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long publishers wait for their last messages to become stable, and subscribers for their
/// last deliveries, after publishing ends.
const DRAIN: Duration = Duration::from_secs(15);
/// Longest publishing phase with `--messages` (it ends earlier when all are published).
const COUNT_MODE_PUBLISH_MAX: Duration = Duration::from_secs(120);
/// Delay between the parent's `Go` and the first publish, so that every child sees it in time.
const START_DELAY: Duration = Duration::from_millis(200);

/// How region datagrams leave a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum TransportArg {
    /// One datagram per region member (fan-out).
    Unicast,
    /// One IP multicast datagram per region (groups joined on `--interface`).
    Multicast,
}

impl TransportArg {
    fn name(self) -> &'static str {
        match self {
            TransportArg::Unicast => "unicast",
            TransportArg::Multicast => "multicast",
        }
    }
}

/// Which interface of tidings the benchmark's processes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum ApiArg {
    /// The public library (`tidings::Node`, raw topics, callback subscriptions), joined
    /// through a membership service the benchmark starts: what applications get.
    Library,
    /// The runtime underneath (`tidings_runtime::NodeRuntime`) with a static membership: no
    /// membership service, one publisher handle for every topic.
    Runtime,
}

/// How the library's subscribers take their messages (`--receive`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum ReceiveArg {
    /// A callback per message on the delivery workers, one for all the topics
    /// (`Node::subscribe_group_with`).
    #[default]
    Callback,
    /// A callback per batch on the delivery workers (`Node::subscribe_batch_with`).
    Batch,
    /// An iterator subscription per topic, read with `Subscription::recv` on a thread of its
    /// own.
    Iterator,
    /// An iterator subscription per topic, read with `Subscription::recv_many` (up to 256 a
    /// call, into one reused vector) on a thread of its own.
    RecvMany,
}

impl ReceiveArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReceiveArg::Callback => "callback",
            ReceiveArg::Batch => "batch",
            ReceiveArg::Iterator => "iterator",
            ReceiveArg::RecvMany => "recv-many",
        }
    }
}

/// How the library's publishers hand their messages on (`--publish`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum PublishArg {
    /// A `Publisher` per topic (`Node::publishers`): a queue to the core thread each.
    #[default]
    Each,
    /// One `PublisherGroup` for all the topics (`Node::publisher_group`): one queue.
    Group,
}

impl PublishArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            PublishArg::Each => "a publisher per topic",
            PublishArg::Group => "a publisher group",
        }
    }
}

/// Most topics `--receive iterator` and `--receive recv-many` take: each topic's subscription
/// is read by a thread of its own.
pub(crate) const READER_THREAD_TOPICS_MAX: u32 = 64;

/// `tidings bench`.
#[derive(Args, Debug, Clone)]
pub(crate) struct BenchArgs {
    /// The interface measured: the public library (default) or the runtime underneath it.
    #[arg(long, value_enum, default_value_t = ApiArg::Library)]
    api: ApiArg,
    /// How the library's subscribers take their messages: a callback per message (default), a
    /// callback per batch, or an iterator subscription read message by message or with
    /// `recv_many` (at most 64 topics: a reader thread each). The runtime (`--api runtime`)
    /// always uses a callback per message.
    #[arg(long, value_enum, default_value_t = ReceiveArg::Callback)]
    receive: ReceiveArg,
    /// How the library's publishers hand messages to their node: a `Publisher` per topic
    /// (default) or one `PublisherGroup` for all topics (one queue). The runtime
    /// (`--api runtime`) always uses one publisher handle for every topic.
    #[arg(long, value_enum, default_value_t = PublishArg::Each)]
    publish: PublishArg,
    /// Publisher processes. Each publishes round-robin over all topics.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    publishers: u32,
    /// Subscriber processes. Each subscribes to every topic (so they form one region).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    subscribers: u32,
    /// Topics.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    topics: u32,
    /// Payload bytes per message (at least 16: the benchmark's stamp, publisher and sequence
    /// number; at most what fits one datagram: 1420 with the default 1472-byte datagrams).
    #[arg(long, default_value_t = 1000, value_parser = parse_message_bytes)]
    message_bytes: usize,
    /// Measured seconds of publishing (after the warm-up).
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds, conflicts_with = "messages")]
    seconds: f64,
    /// Seconds of publishing before measuring starts.
    #[arg(
        long,
        default_value_t = 1.0,
        value_parser = parse_seconds_or_zero,
        conflicts_with = "messages"
    )]
    warmup_seconds: f64,
    /// Instead of a duration: messages per publisher; all of them are measured (no warm-up).
    /// Publishing stops after 120 s regardless.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    messages: Option<u64>,
    /// Messages per second per publisher; default: as fast as back pressure allows.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    rate: Option<u64>,
    /// Transport of region datagrams.
    #[arg(long, value_enum, default_value_t = TransportArg::Unicast)]
    transport: TransportArg,
    /// Interface address every process binds to, and for multicast joins groups on.
    #[arg(long, default_value_t = Ipv4Addr::LOCALHOST)]
    interface: Ipv4Addr,
    /// Protocol: token interval in milliseconds (default: the library's, 10; see
    /// `NodeBuilder::default_protocol_config`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    token_ms: Option<u64>,
    /// Protocol: most unstable messages per sender and region (default: the library's, 32768);
    /// the byte window grows with it (1 KiB per message).
    #[arg(long, value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    window: Option<u64>,
    /// Protocol: Gryphon's PDCC congestion control on or off (default: the library's).
    #[arg(long)]
    congestion_control: Option<bool>,
    /// Protocol: largest datagram in bytes (default: the protocol's, 1472, an Ethernet MTU).
    /// Larger datagrams pack several messages each (loopback's MTU is 65536, jumbo frames
    /// 9000); `--message-bytes` may then go up to what fits one datagram. The raw UDP ceiling
    /// uses the same datagram size.
    #[arg(long, value_parser = clap::value_parser!(u64).range(256..=65_507))]
    max_datagram_bytes: Option<u64>,
    /// Runtime: events each subscription's delivery queue holds (the scheduler's
    /// `task_queue_capacity`; default: the runtime's, 4096).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    delivery_queue: Option<u64>,
    /// Runtime: deliveries a subscriber keeps for topics held because a delivery queue is full
    /// before it stops reading (`delivery_backlog_msgs`; default: the runtime's, 16384; 0 stops
    /// reading at once).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=4_194_304))]
    delivery_backlog: Option<u64>,
    /// Runtime: kernel receive and send buffer requested per socket (`socket_recv_buffer_bytes`
    /// and `socket_send_buffer_bytes`; default: the runtime's, 32 MiB and 4 MiB). Past
    /// `net.core.rmem_max` only for a privileged process. The raw UDP ceiling keeps the
    /// runtime's defaults.
    #[arg(long, value_parser = clap::value_parser!(u64).range(4096..=1_073_741_824))]
    socket_buffer_bytes: Option<u64>,
    /// Runtime: microseconds each core thread keeps polling after its last work before it
    /// sleeps (`idle_spin`; default: the runtime's, 0).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    idle_spin_us: Option<u64>,
    /// Runtime: microseconds each delivery worker keeps looking for work before it sleeps
    /// (`sched.idle_spin_ns`; default: the runtime's, 0).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    worker_idle_spin_us: Option<u64>,
    /// Seconds of each raw UDP ceiling measurement (plain and batched); 0 skips them.
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds_or_zero)]
    ceiling_seconds: f64,
    /// Seconds of the raw UDP one-way latency measured beside a paced run (`--rate`): the
    /// benchmark's process sends datagrams of one message's size, timestamped and paced as the
    /// publishers pace their messages, to one receiver process per subscriber blocking in
    /// `recv`. Default: `--seconds` (after `--warmup-seconds`, at most 1 s of warm-up); 0 skips
    /// it. Not measured without `--rate`.
    #[arg(long, value_parser = parse_seconds_or_zero)]
    udp_latency_seconds: Option<f64>,
    /// Latency is measured on every Nth message each publisher sends (its clock read at publish
    /// and the subscriber's at delivery); the others carry the publisher's last reading, which
    /// places them in or out of the measured window. Default 16 at full rate (two clock reads
    /// per message cost this host's 2 cores about 0.1 us of the ~1.3 us a message takes), 1
    /// with `--rate`. 1 measures every message.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    latency_sample_every: Option<u32>,
    /// Measurements of the batched raw UDP ceiling; the best is the ceiling. On a 2-core host a
    /// single one varies by 2x with where the scheduler puts the sender and receiver threads.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    ceiling_trials: u32,
    /// Serve every process's metrics (on a free loopback port) and scrape them this often, in
    /// milliseconds, as Prometheus would (each scrape: one snapshot of the node's counters and
    /// its OpenMetrics text over HTTP, read by a thread of the process). Default: no metrics
    /// endpoint.
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    metrics_scrape_ms: Option<u64>,
    /// How protocol datagrams are protected (the library only): off, authenticate (an AEAD
    /// tag) or encrypt (payloads encrypted too). With any but off the benchmark makes an
    /// identity per process, admits them at its membership service and deletes them after.
    #[arg(long, value_name = "MODE", default_value_t = SecurityMode::Off)]
    security: SecurityMode,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// `tidings bench-child`: one process of a benchmark.
#[derive(Args, Debug)]
pub(crate) struct ChildArgs {
    /// The child's part, as JSON ([`ChildSpec`]).
    #[arg(long)]
    spec: String,
}

fn runtime_api() -> ApiArg {
    ApiArg::Runtime
}

/// The name of topic `t` in the library's benchmark.
pub(crate) fn topic_name(t: u32) -> String {
    format!("bench/{t}")
}

/// At least the benchmark's stamp; the upper bound depends on `--max-datagram-bytes` and is
/// checked in [`measure`].
fn parse_message_bytes(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if n >= HEADER_BYTES {
        Ok(n)
    } else {
        Err(format!("must be at least {HEADER_BYTES}"))
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() && x > 0.0 && x <= 3600.0 {
        Ok(x)
    } else {
        Err("must be more than 0 and at most 3600".to_owned())
    }
}

fn parse_seconds_or_zero(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() && (0.0..=3600.0).contains(&x) {
        Ok(x)
    } else {
        Err("must be within 0..=3600".to_owned())
    }
}

/// What a child process is told at start (as JSON on its command line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ChildSpec {
    /// Whether this child publishes (`true`) or subscribes.
    pub(crate) publisher: bool,
    /// The interface measured.
    #[serde(default = "runtime_api")]
    pub(crate) api: ApiArg,
    /// How a library subscriber takes its messages.
    #[serde(default)]
    pub(crate) receive: ReceiveArg,
    /// How a library publisher hands its messages on.
    #[serde(default)]
    pub(crate) publish: PublishArg,
    /// The membership service the library's nodes join (`ApiArg::Library`).
    #[serde(default)]
    pub(crate) gms: Option<SocketAddr>,
    /// This child's node id: publishers are `0..publishers`, subscribers follow.
    pub(crate) node: u32,
    pub(crate) publishers: u32,
    pub(crate) subscribers: u32,
    pub(crate) topics: u32,
    pub(crate) message_bytes: usize,
    /// Duration mode: warm-up and measured time, in milliseconds.
    pub(crate) warmup_ms: u64,
    pub(crate) duration_ms: u64,
    /// Count mode: messages per publisher.
    pub(crate) messages: Option<u64>,
    pub(crate) rate: Option<u64>,
    /// Latency is measured on messages `k` with `k % latency_sample_every == 0`, `k` counting
    /// a publisher's messages from 0 (`seq * topics + topic`).
    #[serde(default = "every_message")]
    pub(crate) latency_sample_every: u32,
    pub(crate) transport: TransportArg,
    pub(crate) interface: Ipv4Addr,
    pub(crate) token_ms: Option<u64>,
    pub(crate) window: Option<u64>,
    #[serde(default)]
    pub(crate) congestion_control: Option<bool>,
    #[serde(default)]
    pub(crate) max_datagram_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) delivery_queue: Option<u64>,
    #[serde(default)]
    pub(crate) delivery_backlog: Option<u64>,
    #[serde(default)]
    pub(crate) socket_buffer_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) idle_spin_us: Option<u64>,
    #[serde(default)]
    pub(crate) worker_idle_spin_us: Option<u64>,
    /// Serve metrics and scrape them this often, in milliseconds (`--metrics-scrape-ms`).
    #[serde(default)]
    pub(crate) metrics_scrape_ms: Option<u64>,
    /// With sealed datagrams: the mode, this child's identity file and the service's public
    /// key (`--security`).
    #[serde(default)]
    pub(crate) security: Option<ChildSecurity>,
    /// Injected receive loss at subscribers (tests).
    pub(crate) receive_loss: f64,
    /// The child exits by itself after this long, whatever happens.
    pub(crate) lifetime_ms: u64,
    /// How long to wait for stability (publishers) or the last deliveries (subscribers).
    pub(crate) drain_ms: u64,
}

/// A child's part in a benchmark with sealed datagrams.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ChildSecurity {
    /// `off`, `authenticate` or `encrypt`.
    pub(crate) mode: String,
    /// The child's identity (written by the benchmark, mode 0600).
    pub(crate) identity_file: std::path::PathBuf,
    /// The membership service's public key, as text.
    pub(crate) service_key: String,
}

impl ChildSpec {
    /// The static membership every process computes the same way: subscribers subscribe to all
    /// topics, publishers to none.
    pub(crate) fn membership(&self) -> Membership {
        let subs: BTreeMap<NodeId, Vec<TopicId>> = (0..self.publishers + self.subscribers)
            .map(|i| {
                let topics = if i < self.publishers {
                    vec![]
                } else {
                    (0..self.topics).map(TopicId).collect()
                };
                (NodeId(i), topics)
            })
            .collect();
        Membership::from_subscriptions(&subs, 5)
    }

    /// The protocol configuration of every node: the library's default for nodes on a network
    /// (`NodeBuilder::default_protocol_config`), with the overrides of the command line.
    pub(crate) fn protocol(&self) -> tidings_proto::Config {
        let mut protocol = tidings::NodeBuilder::default_protocol_config();
        if let Some(w) = self.window {
            let w = usize::try_from(w).unwrap_or(usize::MAX);
            protocol.window.msgs_max = w;
            // The byte window must not close first: 1 KiB per message of the window.
            protocol.window.bytes_max = protocol.window.bytes_max.max(w.saturating_mul(1024));
            protocol.receive_window_msgs = protocol.receive_window_msgs.max(2 * w);
        }
        if let Some(on) = self.congestion_control {
            protocol.congestion.control = if on {
                CongestionControl::Pdcc
            } else {
                CongestionControl::None
            };
        }
        if let Some(d) = self.max_datagram_bytes {
            protocol.max_datagram_bytes = usize::try_from(d).unwrap_or(usize::MAX);
            // The send queue must hold a datagram's worth (the protocol checks it).
            protocol.send_queue_bytes_max = protocol
                .send_queue_bytes_max
                .max(protocol.max_datagram_bytes);
        }
        if let Some(t) = self.token_ms {
            protocol.token_interval = Duration::from_millis(t);
            protocol.token_timeout = protocol.token_timeout.max(3 * protocol.token_interval);
        }
        protocol
    }

    /// The transport of every node.
    pub(crate) fn transport(&self) -> Transport {
        match self.transport {
            TransportArg::Unicast => Transport::Unicast,
            TransportArg::Multicast => Transport::Multicast({
                let mut c = MulticastConfig::default();
                c.interface = self.interface;
                c
            }),
        }
    }
}

/// The address book as it crosses a pipe.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct BookWire {
    nodes: Vec<(u32, SocketAddr)>,
    groups: Vec<(u32, SocketAddrV4)>,
}

impl BookWire {
    pub(crate) fn to_book(&self) -> AddressBook {
        let mut book = AddressBook::default();
        for &(n, a) in &self.nodes {
            book.nodes.insert(NodeId(n), a);
        }
        for &(r, a) in &self.groups {
            book.groups.insert(RegionId(r), a);
        }
        book
    }
}

/// Parent to child, one JSON object per line on the child's stdin.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToChild {
    /// Everyone's addresses: start the node.
    Book(BookWire),
    /// Publishing starts at this shared-clock time (ns).
    Go { start_ns: u64 },
    /// Publishing is over; messages each publisher published (subscribers wait for them all).
    End { published: Vec<u64> },
}

/// Child to parent, one JSON object per line on the child's stdout.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromChild {
    /// The child's unicast address (bound, so no other process takes it).
    Addr(SocketAddr),
    /// The node runs (and subscribers have subscribed).
    Ready,
    /// Messages published (publishers) or delivered (subscribers) so far.
    Progress(u64),
    /// The child's measurements.
    Result(Box<ChildResult>),
    /// The child failed.
    Error(String),
}

/// What one child measured.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ChildResult {
    /// Messages published in all (publishers).
    pub(crate) published: u64,
    /// Messages published (publishers) or delivered (subscribers) with a publish stamp inside the
    /// measured window.
    pub(crate) in_window: u64,
    /// Length of the measured window, in nanoseconds (count mode: until the last delivery).
    pub(crate) window_ns: u64,
    /// Heap allocations of the process in the measured window.
    pub(crate) allocations: u64,
    /// CPU time of the process in the measured window, in nanoseconds.
    pub(crate) cpu_ns: u64,
    /// Peak resident set size of the process, in bytes.
    pub(crate) peak_rss_bytes: u64,
    /// Publishers: every message became stable within the drain time.
    pub(crate) stable: bool,
    /// Subscribers: messages delivered in all, out of order (or duplicated), and missing at the
    /// end.
    pub(crate) delivered: u64,
    pub(crate) order_errors: u64,
    pub(crate) missing: u64,
    /// Subscribers: latency histogram (microseconds, count) of the window's deliveries.
    pub(crate) latency_us: Vec<(u64, u64)>,
    /// Datagrams sent and send calls of the node in the window (from the runtime's stats); for a
    /// subscriber: tokens, acknowledgements, repair requests and repairs.
    pub(crate) datagrams_sent: u64,
    pub(crate) send_calls: u64,
    /// Injected drops and repairs received in all (subscribers).
    pub(crate) injected_drops: u64,
    /// Subscribers: datagrams the kernel dropped at the node's sockets (buffers full), over the
    /// whole run (the runtime's `kernel_drops`).
    #[serde(default)]
    pub(crate) kernel_drops: u64,
    pub(crate) repairs_received: u64,
    /// Subscribers: times the core thread found a subscription's queue full and held its topic
    /// (the runtime's `delivery_stalls`), over the whole run.
    pub(crate) delivery_stalls: u64,
    /// Subscribers: messages that arrived beyond the receive window and were dropped, to be
    /// repaired later (the protocol's `out_of_window_dropped`), over the whole run.
    #[serde(default)]
    pub(crate) out_of_window: u64,
    /// Subscribers: messages received again after they had arrived (repairs or pushes that
    /// crossed the original), over the whole run.
    #[serde(default)]
    pub(crate) duplicates: u64,
    /// Messages pushed to ring neighbours (what their token records said they lacked), over
    /// the whole run.
    #[serde(default)]
    pub(crate) pushed: u64,
    /// Subscribers: sealed datagrams opened (`--security`), and those refused, over the whole
    /// run.
    #[serde(default)]
    pub(crate) datagrams_opened: u64,
    #[serde(default)]
    pub(crate) datagrams_refused: u64,
}

/// Entry point of the hidden `tidings bench-child`.
pub(crate) fn run_child(args: &ChildArgs) -> ExitCode {
    child::run(&args.spec)
}

/// The processes of a run; killed and reaped when dropped, whatever happened.
struct Children {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
}

impl Children {
    fn send(&mut self, i: usize, msg: &ToChild) -> Result<(), String> {
        let line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
        let stdin = self.stdins[i]
            .as_mut()
            .ok_or_else(|| format!("child {i}: stdin closed"))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("child {i}: {e}"))
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        // Closing stdin tells a child to shut down; it gets a bounded time, then is killed.
        self.stdins.clear();
        let deadline = bench_sys::shared_clock_ns() + 5_000_000_000;
        for c in &mut self.children {
            while matches!(c.try_wait(), Ok(None)) && bench_sys::shared_clock_ns() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One line from child `.0`, or `None` when its stdout closed.
type Line = (usize, Option<FromChild>);

fn spawn(specs: &[ChildSpec], lines: &mpsc::Sender<Line>) -> Result<Children, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let mut all = Children {
        children: Vec::new(),
        stdins: Vec::new(),
    };
    for (i, spec) in specs.iter().enumerate() {
        let json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
        let mut child = Command::new(&exe)
            .args(["bench-child", "--spec", &json])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a child process: {e}"))?;
        let stdout = child.stdout.take();
        all.stdins.push(child.stdin.take());
        all.children.push(child);
        let Some(stdout) = stdout else {
            return Err("child stdout missing".to_owned());
        };
        let tx = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let msg = serde_json::from_str::<FromChild>(&line)
                    .unwrap_or_else(|_| FromChild::Error(format!("unexpected output: {line}")));
                if tx.send((i, Some(msg))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        });
    }
    Ok(all)
}

/// Waits for one message from each child in `from` for which `want` returns `Some` (in the order
/// of `from`), handling progress on the way.
fn gather<T>(
    rx: &mpsc::Receiver<Line>,
    from: std::ops::Range<usize>,
    timeout: Duration,
    what: &str,
    mut want: impl FnMut(usize, FromChild) -> Option<T>,
    mut progress: impl FnMut(usize, u64),
) -> Result<Vec<T>, String> {
    let deadline = bench_sys::shared_clock_ns().saturating_add(nanos(timeout));
    let n = from.end;
    let mut got: Vec<Option<T>> = (0..n).map(|_| None).collect();
    while from.clone().any(|i| got[i].is_none()) {
        let left = deadline.saturating_sub(bench_sys::shared_clock_ns());
        if left == 0 {
            let missing: Vec<usize> = from.clone().filter(|&i| got[i].is_none()).collect();
            return Err(format!(
                "timed out after {timeout:?} waiting for {what} from children {missing:?}"
            ));
        }
        match rx.recv_timeout(Duration::from_nanos(left).min(Duration::from_millis(100))) {
            Ok((i, Some(FromChild::Progress(count)))) => progress(i, count),
            Ok((i, Some(FromChild::Error(e)))) => return Err(format!("child {i}: {e}")),
            Ok((i, Some(msg))) => {
                if from.contains(&i) && got[i].is_none() {
                    got[i] = want(i, msg);
                }
            }
            Ok((i, None)) => {
                if from.contains(&i) && got[i].is_none() {
                    return Err(format!("child {i} exited while waiting for {what}"));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => progress(usize::MAX, 0),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err("all children gone".to_owned()),
        }
    }
    Ok(got.into_iter().flatten().collect())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn millis(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

/// A multicast group and port for each region, unlikely to collide with another run.
fn groups(
    membership: &Membership,
    interface: Ipv4Addr,
) -> Result<Vec<(u32, SocketAddrV4)>, String> {
    let mut rng =
        fastrand::Rng::with_seed(u64::from(std::process::id()) ^ bench_sys::shared_clock_ns());
    membership
        .regions
        .keys()
        .map(|&region| {
            let port = std::net::UdpSocket::bind((interface, 0))
                .and_then(|s| s.local_addr())
                .map_err(|e| format!("cannot find a free port on {interface}: {e}"))?
                .port();
            let ip = Ipv4Addr::new(239, 255, rng.u8(1..255), rng.u8(1..255));
            Ok((region.0, SocketAddrV4::new(ip, port)))
        })
        .collect()
}

/// Shows progress on stderr: one rewritten line on a terminal, a line per phase otherwise.
struct Progress {
    tty: bool,
    quiet: bool,
}

impl Progress {
    fn phase(&self, text: &str) {
        if self.quiet {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[2K{text}");
        } else {
            eprintln!("bench: {text}");
        }
    }
    fn update(&self, text: &str) {
        if self.tty && !self.quiet {
            eprint!("\r\x1b[2K{text}");
        }
    }
    fn done(&self) {
        if self.tty && !self.quiet {
            eprint!("\r\x1b[2K");
        }
    }
}

/// Runs `tidings bench`.
pub(crate) fn run(args: &BenchArgs) -> ExitCode {
    if let Err(e) = check_sizes(args) {
        // A usage error, like the ones the argument parser reports.
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let progress = Progress {
        tty: std::io::stderr().is_terminal(),
        quiet: args.quiet,
    };
    match measure(args, &progress) {
        Ok(report) => {
            progress.done();
            if args.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.text());
            }
            if report.pass() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            progress.done();
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Everything a run measured.
struct Report {
    args: BenchArgs,
    datagram_bytes: usize,
    messages_per_datagram: usize,
    ceiling_plain_mb_per_sec: Option<f64>,
    ceiling_batched_mb_per_sec: Option<f64>,
    /// Every measurement of the batched ceiling (the best is `ceiling_batched_mb_per_sec`).
    ceiling_batched_trials: Vec<f64>,
    /// The raw UDP one-way latency at the run's rate (`--rate`), and its datagram size.
    one_way: Option<(oneway::OneWay, usize)>,
    window_secs: f64,
    published: u64,
    published_in_window: u64,
    /// Messages published in the measured window that the slowest subscriber got (throughput is
    /// this over the window's length; in count mode the window ends at the last delivery).
    delivered_in_window_min: u64,
    latency_us: Histogram<u64>,
    allocs_publishers: u64,
    allocs_subscribers: Vec<u64>,
    delivered_in_window: Vec<u64>,
    cpu_ns_publishers: u64,
    cpu_ns_subscribers: Vec<u64>,
    rss_publisher_max: u64,
    rss_subscriber_max: u64,
    order_errors: u64,
    missing: u64,
    unstable_publishers: u32,
    sender_datagrams: u64,
    sender_send_calls: u64,
    injected_drops: u64,
    kernel_drops: u64,
    repairs_received: u64,
    delivery_stalls: u64,
    out_of_window: u64,
    duplicates: u64,
    /// Per subscriber: duplicates dropped and messages delivered, whole run.
    duplicates_delivered: Vec<(u64, u64)>,
    pushed: u64,
    datagrams_opened: u64,
    datagrams_refused: u64,
    /// Datagrams all subscribers sent in the window.
    subscriber_datagrams: u64,
}

impl Report {
    fn pass(&self) -> bool {
        self.order_errors == 0 && self.missing == 0 && self.unstable_publishers == 0
    }
    fn messages_per_sec(&self) -> f64 {
        self.delivered_in_window_min as f64 / self.window_secs.max(1e-9)
    }
    fn mb_per_sec(&self) -> f64 {
        self.messages_per_sec() * self.args.message_bytes as f64 / 1e6
    }
    fn allocs_per_message(&self) -> Option<f64> {
        let all = self.allocs_publishers + self.allocs_subscribers.iter().sum::<u64>();
        (self.published_in_window > 0).then(|| all as f64 / self.published_in_window as f64)
    }
    fn allocs_per_message_publisher(&self) -> Option<f64> {
        (self.published_in_window > 0)
            .then(|| self.allocs_publishers as f64 / self.published_in_window as f64)
    }
    /// Mean over subscribers of allocations per delivered message.
    fn allocs_per_message_subscriber(&self) -> Option<f64> {
        let per: Vec<f64> = self
            .allocs_subscribers
            .iter()
            .zip(&self.delivered_in_window)
            .filter(|(_, &d)| d > 0)
            .map(|(&a, &d)| a as f64 / d as f64)
            .collect();
        (!per.is_empty()).then(|| per.iter().sum::<f64>() / per.len() as f64)
    }
    fn ratio_to_ceiling(&self) -> Option<f64> {
        self.ceiling_batched_mb_per_sec
            .map(|c| self.mb_per_sec() / c.max(1e-9))
    }
    fn cpu_us_per_message(&self) -> Option<f64> {
        let all = self.cpu_ns_publishers + self.cpu_ns_subscribers.iter().sum::<u64>();
        (self.published_in_window > 0).then(|| all as f64 / 1e3 / self.published_in_window as f64)
    }
    fn cpu_cores(&self, ns: u64) -> f64 {
        ns as f64 / 1e9 / self.window_secs.max(1e-9)
    }
    fn cpu_subscriber_max(&self) -> u64 {
        self.cpu_ns_subscribers.iter().copied().max().unwrap_or(0)
    }
    /// Duplicates dropped per message delivered, each subscriber (whole run).
    fn duplicate_fractions(&self) -> Vec<f64> {
        self.duplicates_delivered
            .iter()
            .map(|&(d, n)| d as f64 / n.max(1) as f64)
            .collect()
    }
    /// Duplicates dropped per message delivered, all subscribers (whole run).
    fn duplicate_fraction(&self) -> f64 {
        let (d, n) = self
            .duplicates_delivered
            .iter()
            .fold((0, 0), |(d, n), &(a, b)| (d + a, n + b));
        d as f64 / n.max(1) as f64
    }
    /// A quantile of the raw UDP one-way latency, if measured.
    fn one_way(&self, q: f64) -> Option<u64> {
        let (o, _) = self.one_way.as_ref()?;
        (!o.latency_us.is_empty()).then(|| o.latency_us.value_at_quantile(q))
    }
    fn latency(&self, q: f64) -> u64 {
        if self.latency_us.is_empty() {
            0
        } else {
            self.latency_us.value_at_quantile(q)
        }
    }

    fn json(&self) -> String {
        let a = &self.args;
        let opt = |x: Option<f64>| x.map_or(serde_json::Value::Null, serde_json::Value::from);
        let mut v = serde_json::json!({
            "verdict": if self.pass() { "pass" } else { "fail" },
            "api": match a.api {
                ApiArg::Library => "library",
                ApiArg::Runtime => "runtime",
            },
            "publishers": a.publishers,
            "subscribers": a.subscribers,
            "topics": a.topics,
            "message_bytes": a.message_bytes,
            "transport": a.transport.name(),
            "rate_per_publisher": a.rate,
            "metrics_scrape_ms": a.metrics_scrape_ms,
            "window_secs": self.window_secs,
            "published": self.published,
            "published_in_window": self.published_in_window,
            "delivered_in_window_min": self.delivered_in_window_min,
            "messages_per_sec": self.messages_per_sec(),
            "mb_per_sec": self.mb_per_sec(),
            "latency_us": {
                "p50": self.latency(0.5),
                "p90": self.latency(0.9),
                "p99": self.latency(0.99),
                "p999": self.latency(0.999),
                "max": self.latency_us.max(),
                "samples": self.latency_us.len(),
                "sample_every": latency_sample_every(&self.args),
            },
            "allocs_per_message": opt(self.allocs_per_message()),
            "allocs_per_message_publisher": opt(self.allocs_per_message_publisher()),
            "allocs_per_message_subscriber": opt(self.allocs_per_message_subscriber()),
            "cpu_us_per_message": opt(self.cpu_us_per_message()),
            "cpu_cores": {
                "publishers": self.cpu_cores(self.cpu_ns_publishers),
                "subscriber_max": self.cpu_cores(self.cpu_subscriber_max()),
            },
            "peak_rss_bytes": {
                "publisher_max": self.rss_publisher_max,
                "subscriber_max": self.rss_subscriber_max,
            },
            "sender_datagrams_per_sec": self.sender_datagrams as f64 / self.window_secs.max(1e-9),
            "sender_send_calls_per_sec": self.sender_send_calls as f64 / self.window_secs.max(1e-9),
            "datagram_bytes": self.datagram_bytes,
            "messages_per_datagram": self.messages_per_datagram,
            "udp_ceiling_mb_per_sec": opt(self.ceiling_batched_mb_per_sec),
            "udp_ceiling_plain_mb_per_sec": opt(self.ceiling_plain_mb_per_sec),
            "udp_ceiling_trials_mb_per_sec": self.ceiling_batched_trials,
            "ratio_to_udp_ceiling": opt(self.ratio_to_ceiling()),
            "order_errors": self.order_errors,
            "missing": self.missing,
            "unstable_publishers": self.unstable_publishers,
            "injected_drops": self.injected_drops,
            "kernel_drops": self.kernel_drops,
            "repairs_received": self.repairs_received,
            "delivery_stalls": self.delivery_stalls,
            "out_of_window_dropped": self.out_of_window,
            "duplicates_dropped": self.duplicates,
            "messages_pushed": self.pushed,
            "subscriber_datagrams_per_sec": self.subscriber_datagrams as f64
                / self.window_secs.max(1e-9)
                / f64::from(self.args.subscribers.max(1)),
        });
        // Beside the literal: `json!` has reached the macro recursion limit.
        v["receive"] = serde_json::Value::from(match a.api {
            ApiArg::Library => a.receive.name(),
            ApiArg::Runtime => ReceiveArg::Callback.name(),
        });
        v["publish"] = serde_json::Value::from(match a.api {
            ApiArg::Library => a.publish.name(),
            ApiArg::Runtime => PublishArg::Group.name(),
        });
        v["udp_one_way_us"] = match &self.one_way {
            Some((o, bytes)) => serde_json::json!({
                "p50": self.one_way(0.5),
                "p90": self.one_way(0.9),
                "p99": self.one_way(0.99),
                "max": o.latency_us.max(),
                "samples": o.latency_us.len(),
                "sent_per_receiver": o.sent_in_window,
                "receivers": a.subscribers,
                "datagram_bytes": bytes,
            }),
            None => serde_json::Value::Null,
        };
        let ratio = |x: u64, y: Option<u64>| {
            y.filter(|&y| y > 0 && x > 0)
                .map_or(serde_json::Value::Null, |y| (x as f64 / y as f64).into())
        };
        v["latency_p50_to_udp_one_way_p50"] = ratio(self.latency(0.5), self.one_way(0.5));
        v["latency_p99_to_p50"] = ratio(self.latency(0.99), Some(self.latency(0.5)));
        v["duplicates_per_delivered"] = self.duplicate_fraction().into();
        v["duplicates_per_delivered_each"] = self.duplicate_fractions().into();
        v["security"] = a.security.to_string().into();
        v["datagrams_opened"] = self.datagrams_opened.into();
        v["datagrams_refused"] = self.datagrams_refused.into();
        v.to_string()
    }

    fn text(&self) -> String {
        let a = &self.args;
        let mut s = String::new();
        let f =
            |x: Option<f64>, digits: usize| x.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
        s += &format!(
            "tidings bench ({}{}): {} publisher(s) -> {} subscriber(s), {} topic(s), {} B messages, {}, {}\n",
            match a.api {
                ApiArg::Library => format!(
                    "the library, {}, receiving by {}",
                    a.publish.name(),
                    a.receive.name()
                ),
                ApiArg::Runtime => "the runtime".to_owned(),
            },
            match a.security {
                SecurityMode::Off => String::new(),
                mode => format!(", datagrams sealed: {mode}"),
            },
            a.publishers,
            a.subscribers,
            a.topics,
            a.message_bytes,
            match a.transport {
                TransportArg::Unicast => "unicast fan-out".to_owned(),
                TransportArg::Multicast => format!("IP multicast on {}", a.interface),
            },
            match a.messages {
                Some(n) => format!("{n} messages per publisher"),
                None => format!("{} s warm-up + {} s measured", a.warmup_seconds, a.seconds),
            }
        );
        s += &format!(
            "  throughput   {:.0} msgs/s, {:.1} MB/s per subscriber ({} published in the {:.2} s window and delivered to the slowest)\n",
            self.messages_per_sec(),
            self.mb_per_sec(),
            self.delivered_in_window_min,
            self.window_secs
        );
        let sampled = match latency_sample_every(&self.args) {
            1 => "every message".to_owned(),
            n => format!("1 message in {n}"),
        };
        s += &format!(
            "  latency      p50 {} us, p90 {} us, p99 {} us, p999 {} us, max {} us (publish to callback, across processes; {sampled}, {} samples)\n",
            self.latency(0.5),
            self.latency(0.9),
            self.latency(0.99),
            self.latency(0.999),
            self.latency_us.max(),
            self.latency_us.len()
        );
        if let Some((o, bytes)) = &self.one_way {
            let f0 = |x: Option<u64>| x.map_or("-".to_owned(), |x| x.to_string());
            let r = |x: u64, y: Option<u64>| {
                y.filter(|&y| y > 0)
                    .map_or("-".to_owned(), |y| format!("{:.2}", x as f64 / y as f64))
            };
            s += &format!(
                "  raw UDP 1-way p50 {} us, p90 {} us, p99 {} us, max {} us ({} B datagrams at the same rate to {} receiver process(es) blocking in recv, {} samples); tidings p50 {}x of it, tidings p99 {}x of tidings p50\n",
                f0(self.one_way(0.5)),
                f0(self.one_way(0.9)),
                f0(self.one_way(0.99)),
                o.latency_us.max(),
                bytes,
                a.subscribers,
                o.latency_us.len(),
                r(self.latency(0.5), self.one_way(0.5)),
                r(self.latency(0.99), Some(self.latency(0.5))),
            );
        }
        s += &format!(
            "  allocations  {} per message, all processes (publishers {} per published, subscribers {} per delivered)\n",
            f(self.allocs_per_message(), 3),
            f(self.allocs_per_message_publisher(), 3),
            f(self.allocs_per_message_subscriber(), 3),
        );
        s += &format!(
            "  CPU          {} us per message, all processes; publishers {:.2} cores, busiest subscriber {:.2} cores\n",
            f(self.cpu_us_per_message(), 2),
            self.cpu_cores(self.cpu_ns_publishers),
            self.cpu_cores(self.cpu_subscriber_max())
        );
        s += &format!(
            "  peak RSS     publisher {:.1} MB, subscriber {:.1} MB (largest)\n",
            self.rss_publisher_max as f64 / 1e6,
            self.rss_subscriber_max as f64 / 1e6
        );
        s += &format!(
            "  sender       {:.0} datagrams/s in {:.0} send calls/s\n",
            self.sender_datagrams as f64 / self.window_secs.max(1e-9),
            self.sender_send_calls as f64 / self.window_secs.max(1e-9)
        );
        match self.ceiling_batched_mb_per_sec {
            Some(batched) => {
                s += &format!(
                    "  raw UDP      {} MB/s plain, {:.1} MB/s batched (GSO/GRO; best of {}), {} to {} receiver(s), {} B datagrams of {} message(s); this run: {:.2} of batched\n",
                    f(self.ceiling_plain_mb_per_sec, 1),
                    batched,
                    self.ceiling_batched_trials
                        .iter()
                        .map(|t| format!("{t:.0}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    match a.transport {
                        TransportArg::Unicast => "fan-out",
                        TransportArg::Multicast => "multicast",
                    },
                    a.subscribers,
                    self.datagram_bytes,
                    self.messages_per_datagram,
                    self.mb_per_sec() / batched.max(1e-9)
                );
            }
            None => s += "  raw UDP      not measured (--ceiling-seconds 0)\n",
        }
        s += &format!(
            "  subscribers  {:.0} datagrams/s sent each (tokens, acknowledgements, repair requests); {} repairs received, {} dropped by the kernel, {} delivery stalls, {} dropped beyond the receive window, {} duplicates ({:.3}% of delivered; each: {}), {} pushed to neighbours (whole run)\n",
            self.subscriber_datagrams as f64
                / self.window_secs.max(1e-9)
                / f64::from(a.subscribers.max(1)),
            self.repairs_received,
            self.kernel_drops,
            self.delivery_stalls,
            self.out_of_window,
            self.duplicates,
            100.0 * self.duplicate_fraction(),
            self.duplicate_fractions()
                .iter()
                .map(|x| format!("{:.3}%", 100.0 * x))
                .collect::<Vec<_>>()
                .join(", "),
            self.pushed
        );
        if a.security != SecurityMode::Off {
            s += &format!(
                "  sealing      {} datagrams opened by the subscribers, {} refused (whole run)\n",
                self.datagrams_opened, self.datagrams_refused
            );
        }
        s += &format!(
            "  delivery     {}: {} published, {} out of order, {} missing, {} publisher(s) not stable\n",
            if self.pass() { "pass" } else { "FAIL" },
            self.published,
            self.order_errors,
            self.missing,
            self.unstable_publishers
        );
        s
    }
}

/// The largest datagram of the run: `--max-datagram-bytes` or the protocol's default.
fn max_datagram_bytes(args: &BenchArgs) -> usize {
    args.max_datagram_bytes
        .map_or(tidings_proto::Config::default().max_datagram_bytes, |d| {
            usize::try_from(d).unwrap_or(usize::MAX)
        })
}

/// A message must fit one datagram (the protocol does not fragment).
fn check_sizes(args: &BenchArgs) -> Result<(), String> {
    let max_datagram = max_datagram_bytes(args);
    let message_bytes_max = max_datagram.saturating_sub(MESSAGE_FRAMING_BYTES);
    if args.message_bytes > message_bytes_max {
        return Err(format!(
            "--message-bytes {} does not fit a datagram of {max_datagram} bytes (at most \
             {message_bytes_max}); raise --max-datagram-bytes",
            args.message_bytes
        ));
    }
    Ok(())
}

fn measure(args: &BenchArgs, progress: &Progress) -> Result<Report, String> {
    let max_datagram = max_datagram_bytes(args);
    let (messages_per_datagram, datagram_bytes) =
        rt_bench::packing(args.message_bytes, max_datagram);

    // The ceiling first, while no child competes for the cores.
    let mut ceiling = [None, None];
    let mut batched_trials = Vec::new();
    if args.ceiling_seconds > 0.0 {
        let trials = std::iter::once(RawMode::Plain).chain(std::iter::repeat_n(
            RawMode::Batched,
            args.ceiling_trials as usize,
        ));
        for (trial, mode) in trials.enumerate() {
            progress.phase(&format!(
                "raw UDP ceiling ({mode:?}, {datagram_bytes} B datagrams{})",
                match mode {
                    RawMode::Plain => String::new(),
                    RawMode::Batched => format!(", {trial} of {}", args.ceiling_trials),
                }
            ));
            let target = match args.transport {
                TransportArg::Unicast => RawTarget::Unicast,
                TransportArg::Multicast => RawTarget::Multicast {
                    interface: args.interface,
                },
            };
            let r = rt_bench::raw_udp_to(
                target,
                mode,
                datagram_bytes,
                messages_per_datagram,
                args.message_bytes,
                args.subscribers,
                Duration::from_secs_f64(args.ceiling_seconds),
            )
            .map_err(|e| {
                format!(
                    "raw UDP ceiling ({} on {}): {e}",
                    args.transport.name(),
                    args.interface
                )
            })?;
            match mode {
                RawMode::Plain => ceiling[0] = Some(r.payload_mb_per_sec),
                RawMode::Batched => {
                    batched_trials.push(r.payload_mb_per_sec);
                    ceiling[1] = Some(ceiling[1].map_or(r.payload_mb_per_sec, |best: f64| {
                        best.max(r.payload_mb_per_sec)
                    }));
                }
            }
        }
    }

    // The raw UDP one-way latency, at the rate of a paced run, before its processes start.
    let one_way_secs = args.udp_latency_seconds.unwrap_or(args.seconds);
    let one_way = match args.rate {
        Some(rate) if one_way_secs > 0.0 => {
            let bytes = rt_bench::packing(args.message_bytes, 0).1;
            progress.phase(&format!(
                "raw UDP one-way latency ({bytes} B datagrams, {rate}/s, {} receiver(s))",
                args.subscribers
            ));
            let o = oneway::measure(
                args.interface,
                args.subscribers,
                bytes,
                rate,
                Duration::from_secs_f64(args.warmup_seconds.min(1.0)),
                Duration::from_secs_f64(one_way_secs),
            )
            .map_err(|e| format!("raw UDP one-way latency: {e}"))?;
            Some((o, bytes))
        }
        _ => None,
    };

    if args.api == ApiArg::Runtime && args.receive != ReceiveArg::Callback {
        return Err("--receive needs the library (--api library)".to_owned());
    }
    if args.api == ApiArg::Runtime && args.publish != PublishArg::Each {
        return Err("--publish needs the library (--api library)".to_owned());
    }
    if matches!(args.receive, ReceiveArg::Iterator | ReceiveArg::RecvMany)
        && args.topics > READER_THREAD_TOPICS_MAX
    {
        return Err(format!(
            "--receive {} reads each topic on a thread of its own: at most \
             {READER_THREAD_TOPICS_MAX} topics",
            args.receive.name()
        ));
    }
    let p = args.publishers;
    let n = p + args.subscribers;
    let identities = match (args.security, args.api) {
        (SecurityMode::Off, _) => None,
        (_, ApiArg::Library) => Some(crate::identities::RunIdentities::new("bench", n)?),
        (_, ApiArg::Runtime) => {
            return Err(
                "--security needs the library (--api library): the runtime's nodes \
                        have no membership service to admit them"
                    .to_owned(),
            )
        }
    };
    // The library's nodes join a membership service of the benchmark's own, in this process.
    let gms = match args.api {
        ApiArg::Library => Some(
            GmsServer::start_secure(
                GmsConfig::default(),
                SocketAddr::from((args.interface, 0)),
                identities.as_ref().map(|ids| ids.service.clone()),
            )
            .map_err(|e| format!("cannot start the membership service: {e}"))?,
        ),
        ApiArg::Runtime => None,
    };
    let (warmup_ms, duration_ms) = match args.messages {
        Some(_) => (0, nanos(COUNT_MODE_PUBLISH_MAX) / 1_000_000),
        None => (millis(args.warmup_seconds), millis(args.seconds)),
    };
    let lifetime =
        SETUP_TIMEOUT + START_DELAY + Duration::from_millis(warmup_ms + duration_ms) + 3 * DRAIN;
    let specs: Vec<ChildSpec> = (0..n)
        .map(|i| ChildSpec {
            publisher: i < p,
            api: args.api,
            receive: args.receive,
            publish: args.publish,
            gms: gms.as_ref().map(GmsServer::local_addr),
            node: i,
            publishers: p,
            subscribers: args.subscribers,
            topics: args.topics,
            message_bytes: args.message_bytes,
            warmup_ms,
            duration_ms,
            messages: args.messages,
            rate: args.rate,
            latency_sample_every: latency_sample_every(args),
            transport: args.transport,
            interface: args.interface,
            token_ms: args.token_ms,
            window: args.window,
            congestion_control: args.congestion_control,
            max_datagram_bytes: args.max_datagram_bytes,
            delivery_queue: args.delivery_queue,
            delivery_backlog: args.delivery_backlog,
            socket_buffer_bytes: args.socket_buffer_bytes,
            idle_spin_us: args.idle_spin_us,
            worker_idle_spin_us: args.worker_idle_spin_us,
            metrics_scrape_ms: args.metrics_scrape_ms,
            security: identities.as_ref().and_then(|ids| {
                Some(ChildSecurity {
                    mode: args.security.to_string(),
                    identity_file: ids.children.get(i as usize)?.clone(),
                    service_key: ids.service.identity.public().to_string(),
                })
            }),
            receive_loss: 0.0,
            lifetime_ms: nanos(lifetime) / 1_000_000,
            drain_ms: nanos(DRAIN) / 1_000_000,
        })
        .collect();
    let Some(first) = specs.first() else {
        return Err("no processes".to_owned());
    };
    let membership = first.membership();

    progress.phase(&format!(
        "starting {p} publisher and {} subscriber processes",
        args.subscribers
    ));
    let (tx, rx) = mpsc::channel();
    let mut children = spawn(&specs, &tx)?;
    drop(tx);
    let n = n as usize;
    let no_progress = |_: usize, _: u64| {};
    let addrs = gather(
        &rx,
        0..n,
        SETUP_TIMEOUT,
        "addresses",
        |_, m| match m {
            FromChild::Addr(a) => Some(a),
            _ => None,
        },
        no_progress,
    )?;
    let mut book = BookWire {
        nodes: addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| (i as u32, a))
            .collect(),
        groups: Vec::new(),
    };
    if args.transport == TransportArg::Multicast {
        book.groups = groups(&membership, args.interface)?;
    }
    // Subscribers first: a publisher then learns the topics' regions with every subscriber in
    // them when it declares its topics (through the library), before it publishes.
    for range in [p as usize..n, 0..p as usize] {
        for i in range.clone() {
            children.send(i, &ToChild::Book(book.clone()))?;
        }
        gather(
            &rx,
            range,
            SETUP_TIMEOUT,
            "ready",
            |_, m| matches!(m, FromChild::Ready).then_some(()),
            no_progress,
        )?;
    }

    let start_ns = bench_sys::shared_clock_ns() + nanos(START_DELAY);
    for i in 0..n {
        children.send(i, &ToChild::Go { start_ns })?;
    }
    let total_secs = (warmup_ms + duration_ms) as f64 / 1e3;
    progress.phase("publishing");
    let mut published_now = vec![0u64; n];
    let mut delivered_now = vec![0u64; n];
    let mut show = |i: usize, count: u64| {
        if i < n {
            if i < p as usize {
                published_now[i] = count;
            } else {
                delivered_now[i] = count;
            }
        }
        let t = bench_sys::shared_clock_ns().saturating_sub(start_ns) as f64 / 1e9;
        let phase = match args.messages {
            Some(_) => format!("{t:.1} s"),
            None if t < warmup_ms as f64 / 1e3 => format!("warm-up {t:.1}/{total_secs:.1} s"),
            None => format!("measuring {t:.1}/{total_secs:.1} s"),
        };
        let slowest = delivered_now[p as usize..]
            .iter()
            .min()
            .copied()
            .unwrap_or(0);
        progress.update(&format!(
            "{phase}: published {}, slowest subscriber delivered {slowest}",
            published_now.iter().sum::<u64>()
        ));
    };
    // Publishers report when their messages are stable (or the drain time is up).
    let publish_bound = START_DELAY
        + Duration::from_millis(warmup_ms + duration_ms)
        + DRAIN
        + Duration::from_secs(5);
    let mut pub_results = gather(
        &rx,
        0..p as usize,
        publish_bound,
        "publisher results",
        |i, m| match m {
            FromChild::Result(r) if i < p as usize => Some(r),
            _ => None,
        },
        &mut show,
    )?;
    progress.phase("waiting for the last deliveries");
    let published: Vec<u64> = pub_results.iter().map(|r| r.published).collect();
    for i in p as usize..n {
        children.send(
            i,
            &ToChild::End {
                published: published.clone(),
            },
        )?;
    }
    let sub_results = gather(
        &rx,
        p as usize..n,
        DRAIN + Duration::from_secs(5),
        "subscriber results",
        |_, m| match m {
            FromChild::Result(r) => Some(r),
            _ => None,
        },
        &mut show,
    )?;
    drop(children);

    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string())?;
    for r in &sub_results {
        for &(v, c) in &r.latency_us {
            latency
                .record_n(v.clamp(1, 600_000_000), c)
                .map_err(|e| e.to_string())?;
        }
    }
    let window_secs = match args.messages {
        None => duration_ms as f64 / 1e3,
        Some(_) => sub_results.iter().map(|r| r.window_ns).max().unwrap_or(0) as f64 / 1e9,
    };
    let pubs = std::mem::take(&mut pub_results);
    Ok(Report {
        args: args.clone(),
        datagram_bytes,
        messages_per_datagram,
        ceiling_plain_mb_per_sec: ceiling[0],
        ceiling_batched_mb_per_sec: ceiling[1],
        ceiling_batched_trials: batched_trials,
        one_way,
        window_secs,
        published: pubs.iter().map(|r| r.published).sum(),
        published_in_window: pubs.iter().map(|r| r.in_window).sum(),
        delivered_in_window_min: sub_results.iter().map(|r| r.in_window).min().unwrap_or(0),
        latency_us: latency,
        allocs_publishers: pubs.iter().map(|r| r.allocations).sum(),
        allocs_subscribers: sub_results.iter().map(|r| r.allocations).collect(),
        delivered_in_window: sub_results.iter().map(|r| r.in_window).collect(),
        cpu_ns_publishers: pubs.iter().map(|r| r.cpu_ns).sum(),
        cpu_ns_subscribers: sub_results.iter().map(|r| r.cpu_ns).collect(),
        rss_publisher_max: pubs.iter().map(|r| r.peak_rss_bytes).max().unwrap_or(0),
        rss_subscriber_max: sub_results
            .iter()
            .map(|r| r.peak_rss_bytes)
            .max()
            .unwrap_or(0),
        order_errors: sub_results.iter().map(|r| r.order_errors).sum(),
        missing: sub_results.iter().map(|r| r.missing).sum(),
        unstable_publishers: pubs.iter().filter(|r| !r.stable).count() as u32,
        sender_datagrams: pubs.iter().map(|r| r.datagrams_sent).sum(),
        sender_send_calls: pubs.iter().map(|r| r.send_calls).sum(),
        injected_drops: sub_results.iter().map(|r| r.injected_drops).sum(),
        kernel_drops: sub_results.iter().map(|r| r.kernel_drops).sum(),
        repairs_received: sub_results.iter().map(|r| r.repairs_received).sum(),
        delivery_stalls: sub_results.iter().map(|r| r.delivery_stalls).sum(),
        out_of_window: sub_results.iter().map(|r| r.out_of_window).sum(),
        duplicates: sub_results.iter().map(|r| r.duplicates).sum(),
        duplicates_delivered: sub_results
            .iter()
            .map(|r| (r.duplicates, r.delivered))
            .collect(),
        pushed: pubs.iter().chain(&sub_results).map(|r| r.pushed).sum(),
        datagrams_opened: sub_results.iter().map(|r| r.datagrams_opened).sum(),
        datagrams_refused: sub_results.iter().map(|r| r.datagrams_refused).sum(),
        subscriber_datagrams: sub_results.iter().map(|r| r.datagrams_sent).sum(),
    })
}
