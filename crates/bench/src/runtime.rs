//! Throughput and latency of one publisher to N subscribers over loopback, next to the raw UDP
//! ceiling measured in the same run (docs/design.md section 11). Functions return plain structs so
//! that `tidings bench` and `examples/runtime_bench.rs` print the same numbers.
//!
//! All nodes run in this process, each with its own core thread and sockets, so the numbers
//! include every thread competing for the host's cores.

use std::collections::BTreeMap;
use std::io;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use hdrhistogram::Histogram;
use tidings_proto::{Config, Membership, NodeId, Time, TopicId};

use tidings_runtime::{AddressBook, NodeRuntime, RuntimeConfig, Transport};

/// Bytes at the start of every benchmark payload: the publish time (nanoseconds of
/// [`tidings_runtime::now`]).
const STAMP_BYTES: usize = 8;
/// Size of the blocks payloads are written into (one allocation per block, not per message).
const PAYLOAD_BLOCK_BYTES: usize = 1 << 20;
/// Per-message overhead on the wire (the wire crate's message header) and per-datagram overhead
/// (header plus the count of a data packet), to size the raw UDP comparison like the real
/// datagrams.
const MESSAGE_OVERHEAD_BYTES: usize = tidings_wire::MESSAGE_HEADER_LEN;
const DATAGRAM_OVERHEAD_BYTES: usize = tidings_wire::HEADER_LEN + 2;

/// One benchmark run.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// Number of subscriber nodes (each subscribes to the one topic).
    pub subscribers: u32,
    /// Payload size of each message, in bytes (at least 8: the publish timestamp).
    pub message_bytes: usize,
    /// Time before measuring starts (queues fill, rings start).
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// Messages per second to publish; `None` publishes as fast as back pressure allows.
    pub rate_per_sec: Option<u64>,
    /// How region datagrams leave the publisher.
    pub transport: Transport,
    /// The protocol configuration of every node. With the defaults, a sender's throughput is
    /// bounded by `window.msgs_max` unstable messages per time to stability (about one
    /// `token_interval`): 16384 / 100 ms = 164 k messages/s.
    pub protocol: Config,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// The run.
    pub spec: BenchSpec,
    /// Messages delivered to the slowest subscriber in the measured window.
    pub messages: u64,
    /// Messages per second delivered to each subscriber (slowest subscriber).
    pub messages_per_sec: f64,
    /// Payload megabytes (10^6 bytes) per second delivered to each subscriber.
    pub payload_mb_per_sec: f64,
    /// Median publish-to-callback latency, in microseconds.
    pub latency_p50_us: u64,
    /// 99th percentile publish-to-callback latency, in microseconds.
    pub latency_p99_us: u64,
    /// Heap allocations in the whole process (all nodes, the publisher and the workers) per
    /// published message in the measured window, if an allocation counter was given.
    pub allocations_per_message: Option<f64>,
    /// Datagrams the publisher's runtime sent per second (fan-out copies included).
    pub sender_datagrams_per_sec: f64,
    /// The publisher's send calls per second (a GSO run is one call).
    pub sender_send_calls_per_sec: f64,
    /// Short sends (socket buffer full) at the publisher in the window.
    pub short_sends: u64,
    /// Deliveries that were not in order, or duplicated, at any subscriber (must be 0).
    pub order_errors: u64,
}

/// The raw UDP ceiling: plain sockets, no protocol, the same datagram size.
#[derive(Clone, Debug)]
pub struct RawUdpResult {
    /// How datagrams were moved.
    pub mode: RawMode,
    /// Datagram size, in bytes.
    pub datagram_bytes: usize,
    /// Receivers; the sender sends every datagram to each.
    pub receivers: u32,
    /// Messages of the benchmark's size each datagram stands for (packing).
    pub messages_per_datagram: usize,
    /// Datagrams per second arriving at each receiver (slowest receiver).
    pub datagrams_per_sec: f64,
    /// The same in message payload megabytes per second (10^6 bytes), directly comparable
    /// with [`BenchResult::payload_mb_per_sec`].
    pub payload_mb_per_sec: f64,
    /// Fraction of datagrams sent that did not arrive (the sender has no flow control).
    pub loss_fraction: f64,
}

/// How many messages of `message_bytes` the protocol packs into one datagram of
/// `max_datagram_bytes`, and the resulting datagram size.
#[must_use]
pub fn packing(message_bytes: usize, max_datagram_bytes: usize) -> (usize, usize) {
    let per_message = message_bytes + MESSAGE_OVERHEAD_BYTES;
    let per_datagram =
        (max_datagram_bytes.saturating_sub(DATAGRAM_OVERHEAD_BYTES) / per_message).max(1);
    (
        per_datagram,
        DATAGRAM_OVERHEAD_BYTES + per_datagram * per_message,
    )
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-9)
}

fn elapsed(since: Time) -> Duration {
    tidings_runtime::now().saturating_duration_since(since)
}

/// Per-subscriber measurements, written by the subscription callback.
struct Probe {
    delivered: AtomicU64,
    order_errors: AtomicU64,
    /// Deliveries published after this time go into the histogram.
    window_start_ns: AtomicU64,
    window_open: AtomicBool,
    latency_us: Mutex<Histogram<u64>>,
}

/// Runs one benchmark. `allocations` reads a process-wide allocation counter (the caller's
/// counting global allocator), if there is one.
pub fn run(spec: &BenchSpec, allocations: Option<&dyn Fn() -> u64>) -> io::Result<BenchResult> {
    let topic = TopicId(1);
    let n = spec.subscribers + 1;
    let subscriptions: BTreeMap<NodeId, Vec<TopicId>> = (0..n)
        .map(|i| (NodeId(i), if i == 0 { vec![] } else { vec![topic] }))
        .collect();
    let membership = Membership::from_subscriptions(&subscriptions, 5);
    let sockets = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    let mut book = AddressBook::default();
    for (i, s) in sockets.iter().enumerate() {
        book.nodes.insert(NodeId(i as u32), s.local_addr()?);
    }
    if let Transport::Multicast(_) = spec.transport {
        let mut rng = fastrand::Rng::with_seed(u64::from(std::process::id()));
        for &region in membership.regions.keys() {
            let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
            let ip = std::net::Ipv4Addr::new(239, 255, rng.u8(1..255), rng.u8(1..255));
            book.groups
                .insert(region, std::net::SocketAddrV4::new(ip, port));
        }
    }
    let mut nodes = Vec::new();
    let mut probes = Vec::new();
    let mut subs = Vec::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        let config = {
            let mut c = RuntimeConfig::default();
            c.transport = spec.transport.clone();
            c.thread_name = format!("tidings-core-{i}");
            c
        };
        let node = NodeRuntime::start_with_socket(
            config,
            spec.protocol.clone(),
            NodeId(i as u32),
            membership.clone(),
            book.clone(),
            socket,
        )
        .map_err(io::Error::other)?;
        if i > 0 {
            let histogram =
                Histogram::new_with_bounds(1, 60_000_000, 3).map_err(io::Error::other)?;
            let probe = Arc::new(Probe {
                delivered: AtomicU64::new(0),
                order_errors: AtomicU64::new(0),
                window_start_ns: AtomicU64::new(u64::MAX),
                window_open: AtomicBool::new(false),
                latency_us: Mutex::new(histogram),
            });
            let p = Arc::clone(&probe);
            let mut last_stamp = 0u64;
            let sub = node
                .subscribe(topic, 1.0, move |d| {
                    let mut stamp = [0u8; STAMP_BYTES];
                    if let Some(s) = d.payload.get(..STAMP_BYTES) {
                        stamp.copy_from_slice(s);
                    }
                    let stamp = u64::from_be_bytes(stamp);
                    if stamp < last_stamp {
                        p.order_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    last_stamp = stamp;
                    p.delivered.fetch_add(1, Ordering::Relaxed);
                    if p.window_open.load(Ordering::Relaxed)
                        && stamp >= p.window_start_ns.load(Ordering::Relaxed)
                    {
                        let now = tidings_runtime::now().as_nanos();
                        let us = now.saturating_sub(stamp) / 1_000;
                        if let Ok(mut h) = p.latency_us.lock() {
                            h.saturating_record(us.max(1));
                        }
                    }
                })
                .map_err(io::Error::other)?;
            subs.push(sub);
            probes.push(probe);
        }
        nodes.push(node);
    }

    // The publisher thread: stamps, publishes, stops at `stop`.
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let mut publisher = nodes[0].publisher();
    let message_bytes = spec.message_bytes.max(STAMP_BYTES);
    let rate = spec.rate_per_sec;
    let publisher_thread = {
        let stop = Arc::clone(&stop);
        let published = Arc::clone(&published);
        std::thread::Builder::new()
            .name("bench-publisher".to_owned())
            .spawn(move || {
                let mut block = BytesMut::with_capacity(PAYLOAD_BLOCK_BYTES);
                let start = tidings_runtime::now();
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rate) = rate {
                        // Paced: publish message `sent` at start + sent / rate.
                        let due = start + Duration::from_nanos(sent * 1_000_000_000 / rate.max(1));
                        let now = tidings_runtime::now();
                        if now < due {
                            std::thread::sleep((due - now).min(Duration::from_millis(1)));
                            continue;
                        }
                    }
                    if block.capacity() < message_bytes {
                        block.reserve(PAYLOAD_BLOCK_BYTES);
                    }
                    block.put_u64(tidings_runtime::now().as_nanos());
                    block.put_bytes(0x5a, message_bytes - STAMP_BYTES);
                    let payload = block.split().freeze();
                    match publisher.publish_timeout(
                        topic,
                        payload,
                        Some(Duration::from_millis(100)),
                    ) {
                        Ok(_) => {
                            sent += 1;
                            published.store(sent, Ordering::Relaxed);
                        }
                        Err(tidings_runtime::PublishError::Timeout(_)) => {}
                        Err(_) => break,
                    }
                }
                publisher
            })?
    };

    std::thread::sleep(spec.warmup);
    let window_start = tidings_runtime::now();
    for p in &probes {
        p.window_start_ns
            .store(window_start.as_nanos(), Ordering::Relaxed);
        p.window_open.store(true, Ordering::Relaxed);
    }
    let delivered_before: Vec<u64> = probes
        .iter()
        .map(|p| p.delivered.load(Ordering::Relaxed))
        .collect();
    let published_before = published.load(Ordering::Relaxed);
    let allocs_before = allocations.map(|f| f());
    let sender_before = nodes[0].stats().map_err(io::Error::other)?;
    std::thread::sleep(spec.duration);
    let window = elapsed(window_start);
    let allocs_after = allocations.map(|f| f());
    let published_in_window = published.load(Ordering::Relaxed) - published_before;
    let sender_after = nodes[0].stats().map_err(io::Error::other)?;
    let messages = probes
        .iter()
        .zip(&delivered_before)
        .map(|(p, before)| p.delivered.load(Ordering::Relaxed) - before)
        .min()
        .unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    let _publisher = publisher_thread
        .join()
        .map_err(|_| io::Error::other("publisher thread panicked"))?;

    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(io::Error::other)?;
    let mut order_errors = 0;
    for p in &probes {
        order_errors += p.order_errors.load(Ordering::Relaxed);
        if let Ok(h) = p.latency_us.lock() {
            latency.add(&*h).map_err(io::Error::other)?;
        }
    }
    drop(subs);
    for node in nodes {
        node.shutdown().map_err(io::Error::other)?;
    }
    let secs = seconds(window);
    Ok(BenchResult {
        spec: spec.clone(),
        messages,
        messages_per_sec: messages as f64 / secs,
        payload_mb_per_sec: (messages * message_bytes as u64) as f64 / secs / 1e6,
        latency_p50_us: latency.value_at_quantile(0.5),
        latency_p99_us: latency.value_at_quantile(0.99),
        allocations_per_message: match (allocs_before, allocs_after) {
            (Some(a), Some(b)) if published_in_window > 0 => {
                Some((b - a) as f64 / published_in_window as f64)
            }
            _ => None,
        },
        sender_datagrams_per_sec: (sender_after.datagrams_sent - sender_before.datagrams_sent)
            as f64
            / secs,
        sender_send_calls_per_sec: (sender_after.send_calls - sender_before.send_calls) as f64
            / secs,
        short_sends: sender_after.short_sends - sender_before.short_sends,
        order_errors,
    })
}

/// How the raw UDP ceiling moves datagrams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawMode {
    /// One `send_to` and one `recv` system call per datagram.
    Plain,
    /// What the runtime does: GSO runs on the sender (up to 64 KB per call), `recvmmsg` with
    /// GRO on the receivers.
    Batched,
}

/// The raw UDP ceiling: one thread sends `datagram_bytes`-byte datagrams to `receivers`
/// sockets (each datagram to every receiver, as unicast fan-out does) as fast as the socket
/// allows, one thread per receiver counts arrivals, for `duration`.
pub fn raw_udp(
    mode: RawMode,
    datagram_bytes: usize,
    messages_per_datagram: usize,
    message_bytes: usize,
    receivers: u32,
    duration: Duration,
) -> io::Result<RawUdpResult> {
    raw_udp_to(
        RawTarget::Unicast,
        mode,
        datagram_bytes,
        messages_per_datagram,
        message_bytes,
        receivers,
        duration,
    )
}

/// Where the raw UDP ceiling sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawTarget {
    /// Each datagram to every receiver's own address (what unicast fan-out does).
    Unicast,
    /// Each datagram once to an IP multicast group that every receiver joined on `interface`,
    /// with multicast loopback on (what [`Transport::Multicast`] does on one host).
    Multicast {
        /// The interface (by address) the group is joined on and sent from.
        interface: std::net::Ipv4Addr,
    },
}

/// A receiver socket of the ceiling: unicast on 127.0.0.1, or bound to `group` and joined.
fn raw_receiver(target: RawTarget, group: std::net::SocketAddrV4) -> io::Result<UdpSocket> {
    match target {
        RawTarget::Unicast => UdpSocket::bind("127.0.0.1:0"),
        RawTarget::Multicast { interface } => {
            use socket2::{Domain, Protocol, Socket, Type};
            let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
            // Several receivers on one host share the group and port (as the runtime's do).
            socket.set_reuse_address(true)?;
            socket.bind(&std::net::SocketAddr::V4(group).into())?;
            socket.join_multicast_v4(group.ip(), &interface)?;
            socket.set_multicast_all_v4(false)?;
            Ok(socket.into())
        }
    }
}

/// [`raw_udp`] to a [`RawTarget`]: with `Multicast`, the sender sends each datagram once, to a
/// group all `receivers` joined, and the kernel makes the copies.
pub fn raw_udp_to(
    target: RawTarget,
    mode: RawMode,
    datagram_bytes: usize,
    messages_per_datagram: usize,
    message_bytes: usize,
    receivers: u32,
    duration: Duration,
) -> io::Result<RawUdpResult> {
    let group = {
        let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut rng = fastrand::Rng::with_seed(u64::from(std::process::id()) ^ u64::from(port));
        std::net::SocketAddrV4::new(
            std::net::Ipv4Addr::new(239, 255, rng.u8(1..255), rng.u8(1..255)),
            port,
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut addrs = Vec::new();
    // The runtime's default buffers, so that the ceiling and the runs it is compared with lose
    // (or do not lose) datagrams in the kernel alike.
    let defaults = tidings_runtime::RuntimeConfig::default();
    for _ in 0..receivers {
        let socket = raw_receiver(target, group)?;
        tidings_runtime::set_socket_buffers(&socket2::SockRef::from(&socket), &defaults)?;
        let state = quinn_udp::UdpSocketState::new((&socket).into())?;
        socket.set_nonblocking(false)?;
        socket.set_read_timeout(Some(Duration::from_millis(20)))?;
        addrs.push(socket.local_addr()?);
        let stop = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            let mut count = 0u64;
            match mode {
                RawMode::Plain => {
                    let mut buf = vec![0u8; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        if socket.recv(&mut buf).is_ok() {
                            count += 1;
                        }
                    }
                }
                RawMode::Batched => {
                    let mut storage = vec![0u8; quinn_udp::BATCH_SIZE * 65536];
                    let mut meta = [quinn_udp::RecvMeta::default(); quinn_udp::BATCH_SIZE];
                    while !stop.load(Ordering::Relaxed) {
                        let mut chunks = storage.chunks_mut(65536);
                        let mut slices: [std::io::IoSliceMut<'_>; quinn_udp::BATCH_SIZE] =
                            std::array::from_fn(|_| {
                                std::io::IoSliceMut::new(chunks.next().unwrap_or_default())
                            });
                        if let Ok(n) = state.recv((&socket).into(), &mut slices, &mut meta) {
                            for m in meta.iter().take(n) {
                                count += m.len.div_ceil(m.stride.max(1)) as u64;
                            }
                        }
                    }
                }
            }
            count
        }));
    }
    let sender = match target {
        RawTarget::Unicast => UdpSocket::bind("127.0.0.1:0")?,
        RawTarget::Multicast { interface } => {
            let s = UdpSocket::bind((interface, 0))?;
            let r = socket2::SockRef::from(&s);
            r.set_multicast_if_v4(&interface)?;
            r.set_multicast_loop_v4(true)?;
            r.set_multicast_ttl_v4(1)?;
            // One copy per datagram leaves the sender; the kernel delivers it to each receiver.
            addrs = vec![std::net::SocketAddr::V4(group)];
            s
        }
    };
    tidings_runtime::set_socket_buffers(&socket2::SockRef::from(&sender), &defaults)?;
    let state = quinn_udp::UdpSocketState::new((&sender).into())?;
    // Blocking sends: the sender waits for buffer space like the runtime waits for `WRITABLE`.
    sender.set_nonblocking(false)?;
    let segments = match mode {
        RawMode::Plain => 1,
        RawMode::Batched => state
            .max_gso_segments()
            .min(65_000 / datagram_bytes.max(1))
            .max(1),
    };
    let run = vec![0x5au8; datagram_bytes * segments];
    let start = tidings_runtime::now();
    let mut sent = 0u64;
    while elapsed(start) < duration {
        for _ in 0..16 {
            for addr in &addrs {
                let ok = match mode {
                    RawMode::Plain => sender.send_to(&run, addr).is_ok(),
                    RawMode::Batched => {
                        let transmit = quinn_udp::Transmit {
                            destination: *addr,
                            ecn: None,
                            contents: &run,
                            segment_size: (segments > 1).then_some(datagram_bytes),
                            src_ip: None,
                        };
                        state.try_send((&sender).into(), &transmit).is_ok()
                    }
                };
                if ok {
                    sent += segments as u64;
                }
            }
        }
    }
    let window = elapsed(start);
    // Let the receivers take what is queued, then stop them.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let mut received = Vec::new();
    for t in threads {
        received.push(
            t.join()
                .map_err(|_| io::Error::other("receiver thread panicked"))?,
        );
    }
    let slowest = received.iter().copied().min().unwrap_or(0);
    let total: u64 = received.iter().sum();
    let secs = seconds(window);
    let datagrams_per_sec = slowest as f64 / secs;
    Ok(RawUdpResult {
        mode,
        datagram_bytes,
        receivers,
        messages_per_datagram,
        datagrams_per_sec,
        payload_mb_per_sec: datagrams_per_sec * (messages_per_datagram * message_bytes) as f64
            / 1e6,
        loss_fraction: if sent == 0 {
            0.0
        } else {
            // With multicast each datagram sent reaches every receiver.
            let copies = match target {
                RawTarget::Unicast => 1.0,
                RawTarget::Multicast { .. } => f64::from(receivers),
            };
            (1.0 - total as f64 / (sent as f64 * copies)).max(0.0)
        },
    })
}
