//! One process of `tidings bench`: a publisher or a subscriber node, told what to do by the
//! parent over stdin and reporting on stdout (see the parent module).

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use bytes::{BufMut, BytesMut};
use hdrhistogram::Histogram;
use tidings_proto::{NodeId, TopicId};
use tidings_runtime::{NodeRuntime, PublishError, PublishHandle, RuntimeConfig, RuntimeStats};

use super::bench_sys::{allocations, cpu_time_ns, peak_rss_bytes, shared_clock_ns};
use super::{
    topic_name, ApiArg, ChildResult, ChildSpec, FromChild, PublishArg, ReceiveArg, ToChild,
    HEADER_BYTES,
};

/// The node a child measures: the public library's or the runtime's underneath.
enum BenchNode {
    Library(Box<tidings::Node>),
    Runtime(Box<NodeRuntime>),
}

impl BenchNode {
    fn stats(&self) -> Option<RuntimeStats> {
        match self {
            BenchNode::Library(n) => n.stats().ok().map(|s| s.runtime),
            BenchNode::Runtime(n) => n.stats().ok(),
        }
    }

    fn shutdown(self) -> Result<(), String> {
        match self {
            BenchNode::Library(n) => n.shutdown().map(drop).map_err(|e| e.to_string()),
            BenchNode::Runtime(n) => n.shutdown().map(drop).map_err(|e| e.to_string()),
        }
    }
}

/// A publisher child's handles: through the library one per topic or one group for all topics
/// (`--publish`), on the runtime one for all topics.
enum BenchPublisher {
    Library {
        publishers: Vec<tidings::Publisher<Bytes>>,
        last: Vec<Option<PublishHandle>>,
    },
    LibraryGroup {
        group: tidings::PublisherGroup<Bytes>,
        last: Option<PublishHandle>,
    },
    Runtime {
        publisher: tidings_runtime::Publisher,
        last: Option<PublishHandle>,
    },
}

/// What one attempt to publish came to.
enum Attempt {
    Published,
    /// No room within the attempt's time: the payload, to try again.
    NoRoom(Bytes),
}

impl BenchPublisher {
    fn new(node: &BenchNode, topics: u32, publish: PublishArg) -> Result<BenchPublisher, String> {
        Ok(match node {
            BenchNode::Library(n) => {
                let topics = (0..topics)
                    .map(|t| tidings::Topic::raw(topic_name(t)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                match publish {
                    PublishArg::Each => {
                        let publishers = n
                            .publishers(&topics)
                            .map_err(|e| format!("publishers: {e}"))?;
                        BenchPublisher::Library {
                            last: vec![None; publishers.len()],
                            publishers,
                        }
                    }
                    PublishArg::Group => BenchPublisher::LibraryGroup {
                        group: n
                            .publisher_group(&topics)
                            .map_err(|e| format!("publisher group: {e}"))?,
                        last: None,
                    },
                }
            }
            BenchNode::Runtime(n) => BenchPublisher::Runtime {
                publisher: n.publisher(),
                last: None,
            },
        })
    }

    /// Publishes `payload` on topic number `topic`, waiting for room at most `wait`.
    fn publish(&mut self, topic: u32, payload: Bytes, wait: Duration) -> Result<Attempt, String> {
        match self {
            BenchPublisher::Library { publishers, last } => {
                let i = topic as usize;
                let p = publishers.get_mut(i).ok_or("no such topic")?;
                match p.publish_timeout(&payload, wait) {
                    Ok(h) => {
                        last[i] = Some(h);
                        Ok(Attempt::Published)
                    }
                    Err(tidings::PublishError::Timeout) => Ok(Attempt::NoRoom(payload)),
                    Err(e) => Err(format!("publish: {e}")),
                }
            }
            BenchPublisher::LibraryGroup { group, last } => {
                match group.publish_timeout(topic as usize, &payload, wait) {
                    Ok(h) => {
                        *last = Some(h);
                        Ok(Attempt::Published)
                    }
                    Err(tidings::PublishError::Timeout) => Ok(Attempt::NoRoom(payload)),
                    Err(e) => Err(format!("publish: {e}")),
                }
            }
            BenchPublisher::Runtime { publisher, last } => {
                match publisher.publish_timeout(TopicId(topic), payload, Some(wait)) {
                    Ok(h) => {
                        *last = Some(h);
                        Ok(Attempt::Published)
                    }
                    Err(PublishError::Timeout(p)) => Ok(Attempt::NoRoom(p)),
                    Err(e) => Err(format!("publish: {e}")),
                }
            }
        }
    }

    /// Waits until every message published is stable, at most `timeout` in all.
    #[allow(clippy::disallowed_methods)] // a wall-clock bound on the drain
    fn wait_stable(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        match self {
            BenchPublisher::Library { publishers, last } => publishers
                .iter_mut()
                .zip(last.iter())
                .all(|(p, h)| h.is_none_or(|h| p.wait_stable(h, left()).is_ok())),
            BenchPublisher::LibraryGroup { group, last } => {
                last.is_none_or(|h| group.wait_stable(h, left()).is_ok())
            }
            BenchPublisher::Runtime { publisher, last } => {
                last.is_none_or(|h| publisher.wait_stable(h, left()).is_ok())
            }
        }
    }
}

/// Size of the blocks payloads are written into (one allocation per block, not per message).
const PAYLOAD_BLOCK_BYTES: usize = 1 << 20;
/// Most filled payload blocks kept for reuse: 128 MiB, more than a sender holds unstable and
/// queued at once with the default bounds. With many topics the publishers together queue up
/// to `publish_queued_node_bytes_max` (64 MiB) besides the protocol's `node_held_msgs_max`
/// (32,768 messages); 64 blocks were fewer than that, and a new block was allocated every
/// thousand messages.
const PAYLOAD_BLOCKS_RETAINED_MAX: usize = 128;

/// The publisher's payload blocks, recycled once every message cut from them was dropped (the
/// runtime drops a message when it is stable), so steady publishing allocates nothing: the same
/// scheme as the runtime's receive arena (`tidings_runtime`'s `net.rs`).
struct PayloadBlocks {
    current: BytesMut,
    /// Filled blocks, oldest first (each the empty tail handle of its block).
    retired: VecDeque<BytesMut>,
}

impl PayloadBlocks {
    fn new() -> PayloadBlocks {
        PayloadBlocks {
            current: BytesMut::with_capacity(PAYLOAD_BLOCK_BYTES),
            retired: VecDeque::with_capacity(PAYLOAD_BLOCKS_RETAINED_MAX),
        }
    }

    /// The current block, with room for `len` (<= `PAYLOAD_BLOCK_BYTES`) more bytes.
    fn with_room(&mut self, len: usize) -> &mut BytesMut {
        if self.current.capacity() < len && !self.current.try_reclaim(PAYLOAD_BLOCK_BYTES) {
            // A retired block whose messages are all gone, else a new block.
            let reusable = (0..self.retired.len()).find_map(|_| {
                let mut block = self.retired.pop_front()?;
                if block.try_reclaim(PAYLOAD_BLOCK_BYTES) {
                    Some(block)
                } else {
                    self.retired.push_back(block);
                    None
                }
            });
            let next = reusable.unwrap_or_else(|| BytesMut::with_capacity(PAYLOAD_BLOCK_BYTES));
            let full = std::mem::replace(&mut self.current, next);
            if self.retired.len() >= PAYLOAD_BLOCKS_RETAINED_MAX {
                self.retired.pop_front();
            }
            self.retired.push_back(full);
        }
        &mut self.current
    }
}
/// How often a child reports progress.
const PROGRESS_EVERY_NS: u64 = 250_000_000;
/// Largest latency recorded, in microseconds (larger values are clamped).
const LATENCY_US_MAX: u64 = 600_000_000;

/// What the stdin reader thread passes on.
enum Input {
    Msg(ToChild),
    /// Stdin closed (the parent is done or gone): shut down.
    Quit,
}

/// Runs the child described by `spec` (JSON); exit status 0 if it finished its part.
pub(super) fn run(spec: &str) -> ExitCode {
    let spec: ChildSpec = match serde_json::from_str(spec) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: bench-child: bad --spec: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The child never outlives its lifetime, whatever the parent does.
    let lifetime = Duration::from_millis(spec.lifetime_ms);
    std::thread::spawn(move || {
        std::thread::sleep(lifetime);
        eprintln!("bench-child: lifetime of {lifetime:?} over, exiting");
        std::process::exit(3);
    });
    match child_main(&spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The parent prints it (with the child's number).
            send(&FromChild::Error(e));
            ExitCode::FAILURE
        }
    }
}

fn send(msg: &FromChild) {
    if let Ok(line) = serde_json::to_string(msg) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Progress without allocating (the measured window counts allocations).
fn send_progress(count: u64) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{{\"Progress\":{count}}}");
    let _ = out.flush();
}

fn stdin_reader(quit: Arc<AtomicBool>) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<ToChild>(&line) {
                Ok(msg) => {
                    if tx.send(Input::Msg(msg)).is_err() {
                        return;
                    }
                }
                Err(e) => eprintln!("bench-child: ignoring bad input ({e}): {line}"),
            }
        }
        quit.store(true, Ordering::Relaxed);
        let _ = tx.send(Input::Quit);
    });
    rx
}

fn recv(rx: &mpsc::Receiver<Input>, timeout: Duration, what: &str) -> Result<ToChild, String> {
    match rx.recv_timeout(timeout) {
        Ok(Input::Msg(m)) => Ok(m),
        Ok(Input::Quit) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(format!("parent closed stdin while I waited for {what}"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!("no {what} within {timeout:?}")),
    }
}

fn sleep_until(t_ns: u64) {
    let now = shared_clock_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos(t_ns - now));
    }
}

/// Allocations and CPU time at one instant.
#[derive(Clone, Copy, Default)]
struct Snapshot {
    allocations: u64,
    cpu_ns: u64,
    datagrams_sent: u64,
    send_calls: u64,
    pushed: u64,
}

/// Which end of the measured window a [`Snapshot`] marks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Edge {
    Start,
    End,
}

impl Snapshot {
    /// The counters at `edge`. The node's statistics are read outside the window (after the
    /// allocation count and CPU time at its end, before them at its start): a statistics
    /// snapshot allocates per topic (the topic names, the subscriptions), 10,000 and more at
    /// 10,000 topics, which is the benchmark's cost, not the messages'.
    fn take(node: &BenchNode, edge: Edge) -> Snapshot {
        let counters = || (allocations(), cpu_time_ns());
        let before = (edge == Edge::End).then(counters);
        let stats: Option<RuntimeStats> = node.stats();
        let (allocations, cpu_ns) = before.unwrap_or_else(counters);
        Snapshot {
            allocations,
            cpu_ns,
            datagrams_sent: stats.as_ref().map_or(0, |s| s.datagrams_sent),
            send_calls: stats.as_ref().map_or(0, |s| s.send_calls),
            pushed: stats.as_ref().map_or(0, |s| s.proto.messages_pushed),
        }
    }
}

fn child_main(spec: &ChildSpec) -> Result<(), String> {
    let quit = Arc::new(AtomicBool::new(false));
    let rx = stdin_reader(Arc::clone(&quit));
    let socket = UdpSocket::bind((spec.interface, 0))
        .map_err(|e| format!("cannot bind a UDP socket on {}: {e}", spec.interface))?;
    let addr = socket.local_addr().map_err(|e| e.to_string())?;
    send(&FromChild::Addr(addr));
    let setup = Duration::from_millis(spec.lifetime_ms);
    let ToChild::Book(book) = recv(&rx, setup, "the address book")? else {
        return Err("expected the address book".to_owned());
    };
    let config = {
        let mut c = RuntimeConfig::default();
        c.transport = spec.transport();
        c.receive_loss = if spec.publisher {
            0.0
        } else {
            spec.receive_loss
        };
        c.receive_loss_seed = u64::from(spec.node) + 1;
        c.thread_name = format!("tidings-core-{}", spec.node);
        c.raise_open_file_limit = true;
        c
    };
    let mut config = config;
    if let Some(capacity) = spec.delivery_queue {
        config.sched.task_queue_capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
    }
    if let Some(backlog) = spec.delivery_backlog {
        config.delivery_backlog_msgs = usize::try_from(backlog).unwrap_or(usize::MAX);
    }
    if let Some(us) = spec.idle_spin_us {
        config.idle_spin = Duration::from_micros(us);
    }
    if let Some(us) = spec.worker_idle_spin_us {
        config.sched.idle_spin_ns = us * 1_000;
    }
    if let Some(bytes) = spec.socket_buffer_bytes {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        config.socket_recv_buffer_bytes = bytes;
        config.socket_send_buffer_bytes = bytes;
    }
    let node = match (spec.api, spec.gms) {
        (ApiArg::Library, Some(gms)) => {
            // The builder binds the address this child reported (free again once dropped).
            drop(socket);
            let mut builder = match spec.metrics_scrape_ms {
                Some(_) => tidings::Node::builder().metrics(SocketAddr::from(([127, 0, 0, 1], 0))),
                None => tidings::Node::builder(),
            };
            if let Some(security) = &spec.security {
                let mode = security
                    .mode
                    .parse::<tidings::SecurityMode>()
                    .map_err(|e| format!("security: {e}"))?;
                let identity = tidings::Identity::read_file(&security.identity_file)
                    .map_err(|e| format!("{}: {e}", security.identity_file.display()))?;
                let service_key = security
                    .service_key
                    .parse::<tidings::PublicKey>()
                    .map_err(|e| format!("service key: {e}"))?;
                builder = builder
                    .identity(identity)
                    .service_key(service_key)
                    .security(mode);
            }
            let node = builder
                .gms(gms)
                .bind(addr)
                .runtime_config(config)
                .protocol_config(spec.protocol())
                .start()
                .map_err(|e| format!("cannot start the node: {e}"))?;
            BenchNode::Library(Box::new(node))
        }
        (ApiArg::Library, None) => return Err("the library needs a membership service".into()),
        (ApiArg::Runtime, _) => BenchNode::Runtime(Box::new(
            NodeRuntime::start_with_socket(
                config,
                spec.protocol(),
                NodeId(spec.node),
                spec.membership(),
                book.to_book(),
                socket,
            )
            .map_err(|e| format!("cannot start the node: {e}"))?,
        )),
    };
    // The runtime's endpoint (the library's node serves its own).
    let mut served = None;
    let metrics_addr = match (&node, spec.metrics_scrape_ms) {
        (_, None) => None,
        (BenchNode::Library(n), Some(_)) => n.metrics_addr(),
        (BenchNode::Runtime(n), Some(_)) => {
            let server = n
                .serve_metrics(SocketAddr::from(([127, 0, 0, 1], 0)))
                .map_err(|e| e.to_string())?;
            let addr = server.local_addr();
            served = Some(server);
            Some(addr)
        }
    };
    let scraper = match (metrics_addr, spec.metrics_scrape_ms) {
        (Some(addr), Some(ms)) => Some(scrape_until_quit(addr, ms, Arc::clone(&quit))?),
        _ => None,
    };
    let result = if spec.publisher {
        publisher(spec, &node, &rx, &quit)
    } else {
        subscriber(spec, &node, &rx, &quit)
    };
    let result = result.map(|r| send(&FromChild::Result(Box::new(r))));
    // Stay in the region until the parent closes stdin: the token rings that make the other
    // nodes' messages stable need every member.
    if result.is_ok() {
        while !quit.load(Ordering::Relaxed) {
            if let Ok(Input::Quit) | Err(mpsc::RecvTimeoutError::Disconnected) =
                rx.recv_timeout(Duration::from_millis(100))
            {
                break;
            }
        }
    }
    quit.store(true, Ordering::Relaxed);
    let scraped = scraper.map(|t| t.join().unwrap_or(Err("the scraper panicked".to_owned())));
    drop(served);
    node.shutdown()
        .map_err(|e| format!("shutdown: {e}"))
        .and(result)
        .and(scraped.transpose().map(drop))
}

/// Scrapes the metrics endpoint at `addr` every `every_ms` until `quit`, as Prometheus would;
/// the thread's result says whether every scrape succeeded.
fn scrape_until_quit(
    addr: SocketAddr,
    every_ms: u64,
    quit: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<u64, String>>, String> {
    std::thread::Builder::new()
        .name("bench-scrape".to_owned())
        .spawn(move || {
            let mut scrapes = 0u64;
            while !quit.load(Ordering::Relaxed) {
                crate::scrape::fetch(
                    &addr.to_string(),
                    crate::scrape::SCRAPE_TIMEOUT_DEFAULT,
                    crate::scrape::BODY_BYTES_MAX_DEFAULT,
                )
                .map_err(|e| format!("scrape {scrapes}: {e}"))?;
                scrapes += 1;
                std::thread::sleep(Duration::from_millis(every_ms));
            }
            Ok(scrapes)
        })
        .map_err(|e| format!("cannot start the scraper: {e}"))
}

fn publisher(
    spec: &ChildSpec,
    node: &BenchNode,
    rx: &mpsc::Receiver<Input>,
    quit: &AtomicBool,
) -> Result<ChildResult, String> {
    let mut publisher = BenchPublisher::new(node, spec.topics, spec.publish)?;
    send(&FromChild::Ready);
    let ToChild::Go { start_ns } = recv(rx, Duration::from_millis(spec.lifetime_ms), "Go")? else {
        return Err("expected Go".to_owned());
    };
    let window_start = start_ns + spec.warmup_ms * 1_000_000;
    let window_end = window_start + spec.duration_ms * 1_000_000;
    let count = spec.messages.unwrap_or(u64::MAX);
    let topics = u64::from(spec.topics);
    let message_bytes = spec.message_bytes.max(HEADER_BYTES);
    sleep_until(start_ns);

    let mut blocks = PayloadBlocks::new();
    let mut sent = 0u64;
    let mut in_window = 0u64;
    let mut first_snapshot: Option<Snapshot> = None;
    let mut next_progress = start_ns;
    let sample_every = u64::from(spec.latency_sample_every.max(1));
    let mut now = start_ns;
    while sent < count && !quit.load(Ordering::Relaxed) {
        // The clock is read for the messages whose latency is measured; the others carry the
        // last reading (a few microseconds old at full rate), which is all the window needs.
        if sent.is_multiple_of(sample_every) {
            now = shared_clock_ns();
        }
        if first_snapshot.is_none() && now >= window_start {
            first_snapshot = Some(Snapshot::take(node, Edge::Start));
        }
        if now >= window_end {
            break;
        }
        if now >= next_progress {
            send_progress(sent);
            next_progress = now + PROGRESS_EVERY_NS;
        }
        if let Some(rate) = spec.rate {
            // Paced: message `sent` is due at start + sent / rate.
            let due = start_ns + sent.saturating_mul(1_000_000_000) / rate.max(1);
            if now < due {
                std::thread::sleep(Duration::from_nanos(due - now).min(Duration::from_millis(1)));
                now = shared_clock_ns();
                continue;
            }
        }
        let topic = (sent % topics) as u32;
        let seq = (sent / topics) as u32;
        let block = blocks.with_room(message_bytes);
        // The loop's clock read, taken just before (for a sampled message, this message's own):
        // the clock was the publishing thread's largest item after the library's own work.
        let stamp = now;
        block.put_u64(stamp);
        block.put_u32(spec.node);
        block.put_u32(seq);
        block.put_bytes(0x5a, message_bytes - HEADER_BYTES);
        let mut payload = block.split().freeze();
        loop {
            match publisher.publish(topic, payload, Duration::from_millis(100))? {
                Attempt::Published => {
                    sent += 1;
                    if stamp >= window_start && stamp < window_end {
                        in_window += 1;
                    }
                    break;
                }
                Attempt::NoRoom(p) => {
                    if quit.load(Ordering::Relaxed) || shared_clock_ns() >= window_end {
                        break;
                    }
                    payload = p;
                }
            }
        }
    }
    if quit.load(Ordering::Relaxed) {
        return Err("parent closed stdin while publishing".to_owned());
    }
    let end = Snapshot::take(node, Edge::End);
    let start = first_snapshot.unwrap_or(end);
    send_progress(sent);
    let stable = publisher.wait_stable(Duration::from_millis(spec.drain_ms));
    Ok(ChildResult {
        published: sent,
        in_window: if spec.messages.is_some() {
            sent
        } else {
            in_window
        },
        allocations: end.allocations - start.allocations,
        cpu_ns: end.cpu_ns - start.cpu_ns,
        peak_rss_bytes: peak_rss_bytes(),
        stable,
        datagrams_sent: end.datagrams_sent - start.datagrams_sent,
        send_calls: end.send_calls - start.send_calls,
        pushed: end.pushed,
        ..ChildResult::default()
    })
}

/// What a subscriber's callbacks record.
struct Tally {
    /// Messages received per (publisher, topic): the next expected sequence number.
    next_seq: Vec<AtomicU32>,
    topics: u32,
    publishers: u32,
    delivered: AtomicU64,
    in_window: AtomicU64,
    order_errors: AtomicU64,
    window_start_ns: AtomicU64,
    window_end_ns: AtomicU64,
    /// Latency is measured on a publisher's messages `k` (`seq * topics + topic`) with
    /// `k % latency_sample_every == 0`: those the publisher stamped with a clock read of their own.
    latency_sample_every: u64,
    latency_us: Mutex<Histogram<u64>>,
}

impl Tally {
    /// A message of the library's, or an error in its place (counted as out of order).
    fn record_message(
        &self,
        topic: TopicId,
        m: Result<tidings::Message<Bytes>, tidings::RecvError>,
    ) {
        match m {
            Ok(m) => self.record(topic, &m.value),
            Err(_) => {
                self.order_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn record(&self, topic: TopicId, payload: &[u8]) {
        let field = |at: usize, len: usize| -> u64 {
            payload.get(at..at + len).map_or(u64::MAX, |b| {
                b.iter().fold(0u64, |v, &x| v << 8 | u64::from(x))
            })
        };
        let (stamp, publisher, seq) = (field(0, 8), field(8, 4), field(12, 4));
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let slot = (publisher < u64::from(self.publishers) && topic.0 < self.topics)
            .then(|| &self.next_seq[publisher as usize * self.topics as usize + topic.0 as usize]);
        match slot {
            Some(next) if u64::from(next.load(Ordering::Relaxed)) == seq => {
                next.store(seq as u32 + 1, Ordering::Relaxed);
            }
            _ => {
                self.order_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if stamp >= self.window_start_ns.load(Ordering::Relaxed)
            && stamp < self.window_end_ns.load(Ordering::Relaxed)
        {
            self.in_window.fetch_add(1, Ordering::Relaxed);
            let k = seq
                .saturating_mul(u64::from(self.topics))
                .saturating_add(u64::from(topic.0));
            if k.is_multiple_of(self.latency_sample_every) {
                let us = (shared_clock_ns().saturating_sub(stamp) / 1_000).clamp(1, LATENCY_US_MAX);
                if let Ok(mut h) = self.latency_us.lock() {
                    h.saturating_record(us);
                }
            }
        }
    }
}

/// Subscribes the library's node to every topic of `topics` as `receive` says; the topic's
/// number (not the service's id) indexes the tally. Returns the callback subscriptions (none
/// for iterator subscriptions: the threads that read them own them, and end when the node
/// shuts down).
fn library_subscribe(
    receive: ReceiveArg,
    node: &tidings::Node,
    topics: &[tidings::Topic<Bytes>],
    tally: &Arc<Tally>,
) -> Result<Vec<tidings::CallbackSubscription>, String> {
    let failed = |e: tidings::RequestError| format!("subscribe: {e}");
    let subscriptions = match receive {
        // One callback for all the topics, on the delivery workers, as the runtime's; the
        // topic's number (not the service's id) indexes the tally.
        ReceiveArg::Callback => {
            let tally = Arc::clone(tally);
            node.subscribe_group_with(
                topics,
                move |i, m: Result<tidings::Message<Bytes>, tidings::RecvError>| {
                    tally.record_message(TopicId(i as u32), m);
                },
            )
            .map_err(failed)?
        }
        ReceiveArg::Batch => {
            let mut subscriptions = Vec::with_capacity(topics.len());
            for (i, t) in topics.iter().enumerate() {
                let tally = Arc::clone(tally);
                let topic = TopicId(i as u32);
                let sub = node
                    .subscribe_batch_with(t, move |batch| {
                        for m in batch {
                            tally.record_message(topic, m);
                        }
                    })
                    .map_err(failed)?;
                subscriptions.push(sub);
            }
            subscriptions
        }
        ReceiveArg::Iterator | ReceiveArg::RecvMany => {
            for (i, t) in topics.iter().enumerate() {
                let tally = Arc::clone(tally);
                let topic = TopicId(i as u32);
                let sub = node.subscribe(t).map_err(failed)?;
                std::thread::Builder::new()
                    .name(format!("bench-reader-{i}"))
                    .spawn(move || read_until_closed(receive, &sub, topic, &tally))
                    .map_err(|e| format!("no reader thread: {e}"))?;
            }
            Vec::new()
        }
    };
    Ok(subscriptions)
}

/// Most messages one `recv_many` of `--receive recv-many` takes.
const RECV_MANY_MAX: usize = 256;

/// Reads `sub` until it ends (the node shut down), message by message or with `recv_many`.
fn read_until_closed(
    receive: ReceiveArg,
    sub: &tidings::Subscription<Bytes>,
    topic: TopicId,
    tally: &Tally,
) {
    if receive == ReceiveArg::RecvMany {
        let mut batch = Vec::with_capacity(RECV_MANY_MAX);
        loop {
            batch.clear();
            match sub.recv_many(&mut batch, RECV_MANY_MAX) {
                Ok(_) => {
                    for m in batch.drain(..) {
                        tally.record(topic, &m.value);
                    }
                }
                Err(tidings::RecvError::Closed) => return,
                Err(e) => tally.record_message(topic, Err(e)),
            }
        }
    } else {
        loop {
            match sub.recv() {
                Err(tidings::RecvError::Closed) => return,
                m => tally.record_message(topic, m),
            }
        }
    }
}

fn subscriber(
    spec: &ChildSpec,
    node: &BenchNode,
    rx: &mpsc::Receiver<Input>,
    quit: &AtomicBool,
) -> Result<ChildResult, String> {
    let histogram = Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).map_err(|e| e.to_string())?;
    let tally = Arc::new(Tally {
        next_seq: (0..spec.publishers * spec.topics)
            .map(|_| AtomicU32::new(0))
            .collect(),
        topics: spec.topics,
        publishers: spec.publishers,
        delivered: AtomicU64::new(0),
        in_window: AtomicU64::new(0),
        order_errors: AtomicU64::new(0),
        window_start_ns: AtomicU64::new(u64::MAX),
        window_end_ns: AtomicU64::new(u64::MAX),
        latency_sample_every: u64::from(spec.latency_sample_every.max(1)),
        latency_us: Mutex::new(histogram),
    });
    // Dropped at the end: unsubscribes.
    let mut runtime_subscriptions = Vec::new();
    let mut library_subscriptions = None;
    match node {
        BenchNode::Library(n) => {
            let topics = (0..spec.topics)
                .map(|t| tidings::Topic::raw(topic_name(t)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            library_subscriptions = Some(library_subscribe(spec.receive, n, &topics, &tally)?);
        }
        BenchNode::Runtime(n) => {
            for t in 0..spec.topics {
                let tally = Arc::clone(&tally);
                let sub = n
                    .subscribe(TopicId(t), 1.0, move |d| tally.record(d.topic, &d.payload))
                    .map_err(|e| format!("subscribe: {e}"))?;
                runtime_subscriptions.push(sub);
            }
        }
    }
    send(&FromChild::Ready);
    let ToChild::Go { start_ns } = recv(rx, Duration::from_millis(spec.lifetime_ms), "Go")? else {
        return Err("expected Go".to_owned());
    };
    let window_start = start_ns + spec.warmup_ms * 1_000_000;
    let window_end = match spec.messages {
        Some(_) => u64::MAX,
        None => window_start + spec.duration_ms * 1_000_000,
    };
    tally.window_end_ns.store(window_end, Ordering::Relaxed);
    tally.window_start_ns.store(window_start, Ordering::Relaxed);
    let expected_in_count_mode = spec
        .messages
        .map(|m| m.saturating_mul(u64::from(spec.publishers)));

    let mut first: Option<Snapshot> = None;
    let mut last: Option<Snapshot> = None;
    let mut published: Option<Vec<u64>> = None;
    let mut drain_deadline = u64::MAX;
    let mut next_progress = 0;
    // When this loop first saw the latest delivery count: the end of a count-mode window, at
    // most one turn of the loop (5 ms) late, so the throughput derived from it errs low. (The
    // deliveries themselves read no clock unless their latency is measured.)
    let (mut last_delivery_ns, mut last_delivered) = (0, 0);
    loop {
        let now = shared_clock_ns();
        let delivered = tally.delivered.load(Ordering::Relaxed);
        if delivered != last_delivered {
            (last_delivery_ns, last_delivered) = (now, delivered);
        }
        if first.is_none() && now >= window_start {
            first = Some(Snapshot::take(node, Edge::Start));
        }
        if last.is_none() && first.is_some() {
            let done = match expected_in_count_mode {
                Some(e) => delivered >= e,
                None => now >= window_end,
            };
            if done {
                last = Some(Snapshot::take(node, Edge::End));
            }
        }
        if now >= next_progress {
            send_progress(delivered);
            next_progress = now + PROGRESS_EVERY_NS;
        }
        if let Some(p) = &published {
            if delivered >= p.iter().sum::<u64>() || now >= drain_deadline {
                break;
            }
        }
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(Input::Msg(ToChild::End { published: p })) => {
                if p.len() != spec.publishers as usize {
                    return Err(format!("End names {} publishers", p.len()));
                }
                published = Some(p);
                drain_deadline = now + spec.drain_ms * 1_000_000;
            }
            Ok(Input::Msg(other)) => return Err(format!("unexpected {other:?}")),
            Ok(Input::Quit) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("parent closed stdin before End".to_owned());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if quit.load(Ordering::Relaxed) {
            return Err("parent closed stdin before End".to_owned());
        }
    }
    let end = Snapshot::take(node, Edge::End);
    let start = first.unwrap_or(end);
    let last = last.unwrap_or(end);
    let published = published.unwrap_or_default();
    // Missing: per (publisher, topic), the messages published less those received.
    let topics = u64::from(spec.topics);
    let mut missing = 0u64;
    for (p, &n) in published.iter().enumerate() {
        for t in 0..topics {
            let want = n / topics + u64::from(t < n % topics);
            let got = u64::from(
                tally.next_seq[p * spec.topics as usize + t as usize].load(Ordering::Relaxed),
            );
            missing += want.saturating_sub(got);
        }
    }
    let stats = node.stats().ok_or("no stats: the node stopped")?;
    drop(runtime_subscriptions);
    drop(library_subscriptions);
    let latency_us = tally
        .latency_us
        .lock()
        .map(|h| {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect()
        })
        .unwrap_or_default();
    Ok(ChildResult {
        in_window: tally.in_window.load(Ordering::Relaxed),
        window_ns: last_delivery_ns.saturating_sub(window_start),
        allocations: last.allocations - start.allocations,
        cpu_ns: last.cpu_ns - start.cpu_ns,
        peak_rss_bytes: peak_rss_bytes(),
        stable: true,
        delivered: tally.delivered.load(Ordering::Relaxed),
        order_errors: tally.order_errors.load(Ordering::Relaxed),
        missing,
        latency_us,
        injected_drops: stats.injected_drops,
        kernel_drops: stats.kernel_drops,
        repairs_received: stats.proto.repairs_received,
        delivery_stalls: stats.delivery_stalls,
        out_of_window: stats.proto.out_of_window_dropped,
        duplicates: stats.proto.duplicates_dropped,
        pushed: stats.proto.messages_pushed,
        datagrams_opened: stats.sealing.open.opened,
        datagrams_refused: stats.sealing.open.refused(),
        datagrams_sent: last.datagrams_sent - start.datagrams_sent,
        send_calls: last.send_calls - start.send_calls,
        ..ChildResult::default()
    })
}
