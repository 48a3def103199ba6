//! Runtime behaviour beyond the happy path: back pressure from a slow subscriber, tiny socket
//! buffers, invalid datagrams, membership changes (multicast groups joined at run time),
//! shutdown, and the per-second counters.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{payload, random_group};
use tidings_proto::{Config, Membership, NodeId, TopicId, ViewId};
use tidings_runtime::{
    AddressBook, MulticastConfig, NodeRuntime, PublishError, RuntimeConfig, Transport,
};
use tidings_sched::SchedConfig;

struct Nodes {
    nodes: Vec<NodeRuntime>,
    book: AddressBook,
}

/// Starts `n` nodes with one configuration each, all bound to loopback ports.
fn start(
    n: u32,
    membership: &Membership,
    configs: impl Fn(u32) -> RuntimeConfig,
    groups: bool,
) -> Nodes {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut book = AddressBook::default();
    for (i, s) in sockets.iter().enumerate() {
        book.nodes.insert(NodeId(i as u32), s.local_addr().unwrap());
    }
    if groups {
        let mut rng = fastrand::Rng::with_seed(u64::from(std::process::id()));
        for &region in membership.regions.keys() {
            book.groups.insert(region, random_group(&mut rng));
        }
    }
    let nodes = sockets
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            NodeRuntime::start_with_socket(
                configs(i as u32),
                Config::default(),
                NodeId(i as u32),
                membership.clone(),
                book.clone(),
                s,
            )
            .unwrap()
        })
        .collect();
    Nodes { nodes, book }
}

fn membership(subs: &[(u32, &[u32])]) -> Membership {
    let map: BTreeMap<NodeId, Vec<TopicId>> = subs
        .iter()
        .map(|(n, t)| (NodeId(*n), t.iter().map(|&t| TopicId(t)).collect()))
        .collect();
    Membership::from_subscriptions(&map, 5)
}

fn index_of(d: &tidings_proto::Delivery) -> u64 {
    u64::from_be_bytes(d.payload[4..12].try_into().unwrap())
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tidings_runtime::now() + timeout;
    while tidings_runtime::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// A publisher (node 0) and a subscriber of topic 1 (node 1) whose subscription's queue holds
/// `queue` events and whose callback runs `before` on each message index before logging it.
fn publisher_and_slow_subscriber(
    config: RuntimeConfig,
    queue: usize,
    before: impl Fn(u64) + Send + 'static,
) -> (Nodes, tidings_runtime::Subscription, Arc<Mutex<Vec<u64>>>) {
    let m = membership(&[(0, &[]), (1, &[1])]);
    let nodes = start(
        2,
        &m,
        |_| {
            let mut c = config.clone();
            c.sched = SchedConfig {
                worker_threads: 1,
                task_queue_capacity: queue,
                ..SchedConfig::default()
            };
            c
        },
        false,
    );
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    let sub = nodes.nodes[1]
        .subscribe(TopicId(1), 1.0, move |d| {
            let i = index_of(&d);
            before(i);
            g.lock().unwrap().push(i);
        })
        .unwrap();
    (nodes, sub, got)
}

/// Publishes message `i` of topic 1 with a `len`-byte payload, waiting up to 30 s for room.
fn publish_one(
    publisher: &mut tidings_runtime::Publisher,
    i: u64,
    len: usize,
) -> tidings_runtime::PublishHandle {
    publisher
        .publish_timeout(
            TopicId(1),
            payload(TopicId(1), i, len),
            Some(Duration::from_secs(30)),
        )
        .unwrap()
}

/// Waits until `got` holds `0..total` and checks the order.
fn assert_all_delivered_in_order(got: &Mutex<Vec<u64>>, total: u64) {
    assert!(wait_until(Duration::from_secs(30), || got
        .lock()
        .unwrap()
        .len()
        == total as usize));
    assert_eq!(*got.lock().unwrap(), (0..total).collect::<Vec<_>>());
}

#[test]
fn slow_subscriber_slows_the_publisher_and_loses_nothing() {
    let config = {
        let mut c = RuntimeConfig::default();
        c.publish_queue_capacity = 16;
        c
    };
    let (nodes, _sub, got) = publisher_and_slow_subscriber(config, 8, |_| {
        std::thread::sleep(Duration::from_micros(100));
    });
    let mut publisher = nodes.nodes[0].publisher();
    let total = 3000u64;
    let mut would_block = 0;
    let mut i = 0;
    let deadline = tidings_runtime::now() + Duration::from_secs(30);
    while i < total {
        assert!(tidings_runtime::now() < deadline, "publishing stalled");
        match publisher.try_publish(TopicId(1), payload(TopicId(1), i, 64)) {
            Ok(_) => i += 1,
            Err(PublishError::WouldBlock(_)) => {
                would_block += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(would_block > 0, "the publisher never felt back pressure");
    assert_all_delivered_in_order(&got, total);
    let stats = nodes.nodes[1].stats().unwrap();
    assert!(
        stats.delivery_stalls > 0,
        "the subscriber's queue never filled: {stats:?}"
    );
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

/// Publishes `total` messages at about `rate` per second to one subscriber whose callback
/// stalls for `stall` every `stall_every` messages; returns the messages the subscriber's
/// protocol received as repairs (each one a datagram its kernel dropped, or a duplicate).
fn repairs_behind_a_stalling_subscriber(delivery_backlog_msgs: usize) -> u64 {
    const TOTAL: u64 = 4000;
    const STALL_EVERY: u64 = 500;
    const STALL: Duration = Duration::from_millis(60);
    const PER_MILLISECOND: u64 = 20;
    let config = {
        let mut c = RuntimeConfig::default();
        // About 100 datagrams of 500 bytes: 5 ms of this stream.
        c.socket_recv_buffer_bytes = 128 * 1024;
        c.delivery_backlog_msgs = delivery_backlog_msgs;
        c
    };
    let (nodes, _sub, got) = publisher_and_slow_subscriber(config, 64, |i| {
        if i % STALL_EVERY == STALL_EVERY - 1 {
            std::thread::sleep(STALL);
        }
    });
    let mut publisher = nodes.nodes[0].publisher();
    let start = tidings_runtime::now();
    let mut last = None;
    for i in 0..TOTAL {
        // Paced, so that only the stalls (not the publisher) can outrun the subscriber.
        let due = start + Duration::from_millis(i / PER_MILLISECOND);
        let now = tidings_runtime::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        last = Some(publish_one(&mut publisher, i, 500));
    }
    publisher
        .wait_stable(last.unwrap(), Duration::from_secs(60))
        .unwrap();
    assert_all_delivered_in_order(&got, TOTAL);
    let repairs = nodes.nodes[1].stats().unwrap().proto.repairs_received;
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
    repairs
}

/// A subscriber whose callback stalls: without a backlog the core thread stops reading while the
/// subscription's queue is full, the socket overflows and what the kernel dropped is repaired;
/// with one (the default) it keeps reading, holds the deliveries, and (nearly) nothing is lost.
#[test]
fn a_stalled_subscription_does_not_make_the_kernel_drop_while_the_backlog_lasts() {
    let without = repairs_behind_a_stalling_subscriber(0);
    let with = repairs_behind_a_stalling_subscriber(RuntimeConfig::default().delivery_backlog_msgs);
    eprintln!("repairs: {without} without a backlog, {with} with one");
    assert!(
        without >= 100,
        "no backlog: the stalls should have overflowed the socket ({without} repairs)"
    );
    // Not zero: on a loaded host the core thread itself may be descheduled for longer than
    // the socket buffer lasts.
    assert!(
        with * 4 <= without,
        "with a backlog: {with} repairs, without: {without}"
    );
}

#[test]
fn tiny_socket_buffers_lose_packets_but_not_messages() {
    let m = membership(&[(0, &[]), (1, &[1]), (2, &[1])]);
    let nodes = start(
        3,
        &m,
        |_| {
            let mut c = RuntimeConfig::default();
            c.socket_recv_buffer_bytes = 16 * 1024;
            c.socket_send_buffer_bytes = 16 * 1024;
            c.send_batch_datagrams_max = 4;
            c.recv_batch_datagrams_max = 8;
            c
        },
        false,
    );
    let counts: Vec<Arc<Mutex<Vec<u64>>>> = (0..2).map(|_| Arc::default()).collect();
    let subs: Vec<_> = (1..3)
        .map(|i| {
            let log = Arc::clone(&counts[i - 1]);
            nodes.nodes[i]
                .subscribe(TopicId(1), 1.0, move |d| {
                    log.lock().unwrap().push(index_of(&d))
                })
                .unwrap()
        })
        .collect();
    let mut publisher = nodes.nodes[0].publisher();
    let total = 20_000u64;
    let mut last = None;
    for i in 0..total {
        last = Some(publish_one(&mut publisher, i, 500));
    }
    if let Err(e) = publisher.wait_stable(last.unwrap(), Duration::from_secs(60)) {
        for (i, n) in nodes.nodes.iter().enumerate() {
            eprintln!("node {i}: {:#?}", n.stats().unwrap());
        }
        for log in &counts {
            eprintln!("delivered {}", log.lock().unwrap().len());
        }
        panic!(
            "not stable: {e}; stable {} of {total}",
            publisher.stable_count()
        );
    }
    for log in &counts {
        assert!(wait_until(Duration::from_secs(10), || log
            .lock()
            .unwrap()
            .len()
            == total as usize));
        assert_eq!(*log.lock().unwrap(), (0..total).collect::<Vec<_>>());
    }
    let s = nodes.nodes[0].stats().unwrap();
    assert!(s.socket_send_buffer_bytes < 64 * 1024, "{s:?}");
    drop(subs);
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

#[test]
fn invalid_datagrams_are_counted_and_dropped() {
    let m = membership(&[(0, &[]), (1, &[1])]);
    let nodes = start(2, &m, |_| RuntimeConfig::default(), false);
    let target = nodes.nodes[1].local_addr();
    let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
    for len in [0usize, 1, 15, 16, 100, 1500] {
        junk.send_to(&vec![0xee; len], target).unwrap();
    }
    // A valid-looking header with garbage after it: the protocol counts it as malformed.
    let mut forged = vec![0u8; 40];
    forged[0..2].copy_from_slice(&tidings_wire::MAGIC.to_be_bytes());
    forged[2] = tidings_wire::VERSION;
    forged[3] = 1; // data
    junk.send_to(&forged, target).unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        let s = nodes.nodes[1].stats().unwrap();
        s.invalid_packets == 6 && s.proto.datagrams_received >= 1
    }));
    let s = nodes.nodes[1].stats().unwrap();
    assert_eq!(s.proto.malformed_dropped + s.proto.foreign_dropped, 1);
    // Still works afterwards.
    let got = Arc::new(AtomicU64::new(0));
    let g = Arc::clone(&got);
    let _sub = nodes.nodes[1]
        .subscribe(TopicId(1), 1.0, move |_| {
            g.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    let mut p = nodes.nodes[0].publisher();
    let h = p
        .publish(TopicId(1), Bytes::from_static(b"0123456789abcdef"))
        .unwrap();
    p.wait_stable(h, Duration::from_secs(10)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || got
        .load(Ordering::Relaxed)
        == 1));
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

/// Node 3 starts in no region and joins the region of topic 1 by a membership change (a new
/// view); over multicast it must join the region's group at run time.
fn membership_change(multicast: bool) {
    let before = membership(&[(0, &[]), (1, &[1]), (2, &[1]), (3, &[])]);
    let transport = if multicast {
        Transport::Multicast(MulticastConfig::default())
    } else {
        Transport::Unicast
    };
    let nodes = start(
        4,
        &before,
        |_| {
            let mut c = RuntimeConfig::default();
            c.transport = transport.clone();
            c
        },
        multicast,
    );
    let logs: Vec<Arc<Mutex<Vec<u64>>>> = (0..4).map(|_| Arc::default()).collect();
    let subs: Vec<_> = (1..4)
        .map(|i| {
            let log = Arc::clone(&logs[i]);
            nodes.nodes[i]
                .subscribe(TopicId(1), 1.0, move |d| {
                    log.lock().unwrap().push(index_of(&d))
                })
                .unwrap()
        })
        .collect();
    let mut publisher = nodes.nodes[0].publisher();
    let mut publish = |range: std::ops::Range<u64>| {
        let mut last = None;
        for i in range {
            last = Some(publish_one(&mut publisher, i, 100));
        }
        publisher
            .wait_stable(last.unwrap(), Duration::from_secs(30))
            .unwrap();
    };
    publish(0..2000);
    let mut after = membership(&[(0, &[]), (1, &[1]), (2, &[1]), (3, &[1])]);
    for view in after.regions.values_mut() {
        // A new member: a new view and a new base (ADR 30).
        view.view = ViewId(2);
        view.base = ViewId(2);
    }
    // The region keeps its id (and so its group); the book is unchanged.
    assert_eq!(
        after.regions.keys().collect::<Vec<_>>(),
        before.regions.keys().collect::<Vec<_>>()
    );
    for n in &nodes.nodes {
        n.set_membership(after.clone(), Some(nodes.book.clone()))
            .unwrap();
    }
    if multicast {
        assert_eq!(nodes.nodes[3].stats().unwrap().groups_joined, 1);
    }
    publish(2000..4000);
    for (i, log) in logs.iter().enumerate().skip(1) {
        let want_from = if i == 3 { 2000 } else { 0 };
        assert!(
            wait_until(Duration::from_secs(10), || log
                .lock()
                .unwrap()
                .last()
                .is_some_and(|&l| l == 3999)),
            "node {i} did not get the last message"
        );
        let got = log.lock().unwrap().clone();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "node {i}: order or duplicates"
        );
        assert!(
            (want_from..4000).all(|m| got.binary_search(&m).is_ok()),
            "node {i}: missing messages"
        );
    }
    drop(subs);
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

#[test]
fn membership_change_unicast() {
    membership_change(false);
}

#[test]
fn membership_change_multicast_joins_the_group() {
    membership_change(true);
}

#[test]
fn shutdown_refuses_publishers_and_counters_tick_every_second() {
    let m = membership(&[(0, &[]), (1, &[1]), (2, &[1])]);
    let nodes = start(3, &m, |_| RuntimeConfig::default(), false);
    let mut publisher = nodes.nodes[0].publisher();
    let mut last = None;
    for i in 0..100 {
        last = Some(
            publisher
                .publish(TopicId(1), payload(TopicId(1), i, 64))
                .unwrap(),
        );
    }
    publisher
        .wait_stable(last.unwrap(), Duration::from_secs(10))
        .unwrap();
    // Let the statistics tick close at least one second.
    std::thread::sleep(Duration::from_millis(1200));
    let s = nodes.nodes[1].stats().unwrap();
    assert!(s.cycle_time.seconds >= 1, "{:?}", s.cycle_time);
    assert!(s.alarm_lateness.seconds >= 1, "{:?}", s.alarm_lateness);
    assert!(s.alarms_fired > 0 && s.sleeps > 0);
    let mut it = nodes.nodes.into_iter();
    let sender = it.next().unwrap();
    let final_stats = sender.shutdown().unwrap();
    assert_eq!(final_stats.publishes, 100);
    assert!(matches!(
        publisher.try_publish(TopicId(1), Bytes::from_static(b"late")),
        Err(PublishError::Closed)
    ));
    for n in it {
        n.shutdown().unwrap();
    }
}

/// Thousands of publishers on one node, more than the core thread's ready list holds: every
/// message arrives once, the quiet publishers keep their first small queue, a busy one grows
/// its queue and keeps its order, and dropped publishers are forgotten once their messages are
/// stable.
#[test]
fn thousands_of_publishers_are_served_without_full_queues_and_forgotten_when_dropped() {
    const PUBLISHERS: u64 = 5_000;
    const BURST: u64 = 3_000;
    let m = membership(&[(0, &[]), (1, &[1])]);
    let nodes = start(2, &m, |_| RuntimeConfig::default(), false);
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    let _sub = nodes.nodes[1]
        .subscribe(TopicId(1), 1.0, move |d| {
            g.lock().unwrap().push(index_of(&d))
        })
        .unwrap();
    let mut publishers: Vec<_> = (0..PUBLISHERS)
        .map(|_| nodes.nodes[0].publisher())
        .collect();
    let handles: Vec<_> = publishers
        .iter_mut()
        .enumerate()
        .map(|(i, p)| publish_one(p, i as u64, 32))
        .collect();
    for (p, h) in publishers.iter_mut().zip(&handles) {
        p.wait_stable(*h, Duration::from_secs(30)).unwrap();
    }
    let s = nodes.nodes[0].stats().unwrap();
    assert_eq!(s.publishers_current, PUBLISHERS);
    assert_eq!(
        s.publish_queue_slots_current,
        PUBLISHERS * 16,
        "one message each: every queue is still its first ring of 16"
    );
    // One publisher's burst: its queue grows (to the bound at most) and keeps the order.
    let busy = &mut publishers[0];
    let mut last = None;
    for i in PUBLISHERS..PUBLISHERS + BURST {
        last = Some(publish_one(busy, i, 32));
    }
    busy.wait_stable(last.unwrap(), Duration::from_secs(30))
        .unwrap();
    assert!(wait_until(Duration::from_secs(30), || got
        .lock()
        .unwrap()
        .len()
        == (PUBLISHERS + BURST) as usize));
    {
        let got = got.lock().unwrap();
        let burst: Vec<u64> = got.iter().copied().filter(|&i| i >= PUBLISHERS).collect();
        assert_eq!(burst, (PUBLISHERS..PUBLISHERS + BURST).collect::<Vec<_>>());
        let mut all = got.clone();
        all.sort_unstable();
        assert_eq!(all, (0..PUBLISHERS + BURST).collect::<Vec<_>>());
    }
    drop(publishers);
    assert!(
        wait_until(Duration::from_secs(10), || nodes.nodes[0]
            .stats()
            .unwrap()
            .publishers_current
            == 0),
        "dropped publishers are forgotten: {:?}",
        nodes.nodes[0].stats().unwrap().publishers_current
    );
    // Slots are reused: a new publisher works as before.
    let mut again = nodes.nodes[0].publisher();
    let h = publish_one(&mut again, PUBLISHERS + BURST, 32);
    again.wait_stable(h, Duration::from_secs(10)).unwrap();
    assert_eq!(nodes.nodes[0].stats().unwrap().publishers_current, 1);
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

/// Whether this process has `CAP_NET_ADMIN` (bit 12 of `CapEff` in `/proc/self/status`).
fn has_net_admin() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
    mask & (1 << 12) != 0
}

#[test]
fn receive_buffers_go_past_the_sysctl_cap_only_when_privileged() {
    let cap: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let asked = 2 * cap;
    let m = membership(&[(0, &[])]);
    let nodes = start(
        1,
        &m,
        |_| {
            let mut c = RuntimeConfig::default();
            c.socket_recv_buffer_bytes = asked;
            c
        },
        false,
    );
    let s = nodes.nodes[0].stats().unwrap();
    // The kernel reports twice what it grants (its bookkeeping).
    if has_net_admin() {
        assert!(s.socket_recv_buffer_bytes >= 2 * asked, "{s:?}");
    } else {
        assert_eq!(s.socket_recv_buffer_bytes, 2 * cap, "{s:?}");
    }
    for n in nodes.nodes {
        n.shutdown().unwrap();
    }
}

#[test]
fn a_publisher_whose_region_stops_acknowledging_is_told_whom_it_waits_for() {
    let m = membership(&[(0, &[]), (1, &[1]), (2, &[1])]);
    let stall_after = Duration::from_millis(300);
    let nodes = start(
        3,
        &m,
        |_| {
            let mut c = RuntimeConfig::default();
            c.stall_after = stall_after;
            c
        },
        false,
    );
    let mut it = nodes.nodes.into_iter();
    let sender = it.next().unwrap();
    let receivers: Vec<NodeRuntime> = it.collect();
    let mut publisher = sender.publisher();
    let first = publish_one(&mut publisher, 0, 64);
    publisher
        .wait_stable(first, Duration::from_secs(10))
        .unwrap();
    assert_eq!(sender.stats().unwrap().stalls_reported, 0);
    // One receiver goes away without telling anyone (no membership service to remove it): the
    // region can no longer acknowledge.
    let mut receivers = receivers.into_iter();
    let gone = receivers.next().unwrap();
    drop(gone.shutdown());
    let second = publish_one(&mut publisher, 1, 64);
    let err = publisher.wait_stable(second, stall_after * 4).unwrap_err();
    let tidings_runtime::WaitError::Stalled(why) = err else {
        panic!("not a stall: {err:?}");
    };
    assert!(why.contains("waiting for members 1, 2"), "{why}");
    let stats = sender.stats().unwrap();
    assert_eq!(stats.stalls_reported, 1);
    assert_eq!(stats.stalls.len(), 1);
    assert_eq!(stats.stalls[0].members, vec![NodeId(1), NodeId(2)]);
    assert!(stats.stalls[0].waited >= stall_after);
}
