//! IP multicast between network namespaces joined by a bridge (issue 4, done-when): one
//! publisher and three subscribers, each a process of this test binary in its own network
//! namespace, 100 topics, 100 000 messages, 1% injected receive loss, `Transport::Multicast` on the
//! namespace's veth address with multicast loopback off, so every datagram crosses the bridge.
//! Every subscriber must get every message of its topics exactly once and in order.
//!
//! Needs root (CI runs as root). Where namespaces cannot be created the test says so and fails:
//! it never passes without having run.

#![allow(clippy::unwrap_used)]

mod netns_support;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use netns_support::{address, address_book, field, spawn_in, stdin_lines, Children, Namespaces};
use tidings_proto::{Config, Membership, NodeId, TopicId};
use tidings_runtime::{AddressBook, MulticastConfig, NodeRuntime, RuntimeConfig, Transport};

/// Set in a child process: its node id.
const CHILD: &str = "TIDINGS_NETNS_TEST_CHILD";
/// Node 0 publishes; nodes 1..=SUBSCRIBERS subscribe.
const SUBSCRIBERS: u32 = 3;
const TOPICS: u32 = 100;
const TOTAL: u64 = 100_000;
const PAYLOAD_BYTES: usize = 100;
const LOSS: f64 = 0.01;
/// Every wait of the test is bounded by this (or less).
const TIMEOUT: Duration = Duration::from_secs(90);
/// Unicast port of every node (each namespace has its own network stack, so one port serves all).
const PORT: u16 = 40_000;

fn topics_of(i: u32) -> Vec<TopicId> {
    match i {
        0 => vec![],
        1 | 2 => (0..TOPICS).map(TopicId).collect(),
        _ => (0..TOPICS / 2).map(TopicId).collect(),
    }
}

fn membership() -> Membership {
    let subs: BTreeMap<NodeId, Vec<TopicId>> = (0..=SUBSCRIBERS)
        .map(|i| (NodeId(i), topics_of(i)))
        .collect();
    Membership::from_subscriptions(&subs, 5)
}

/// Everyone's addresses: fixed, since each node has a namespace of its own; one group per region.
fn book() -> AddressBook {
    address_book(&membership(), SUBSCRIBERS, PORT, 0)
}

fn config(me: u32) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.receive_loss = if me == 0 { 0.0 } else { LOSS };
    c.receive_loss_seed = u64::from(me) + 11;
    let mut multicast = MulticastConfig::default();
    multicast.interface = address(me);
    multicast.ttl = 1;
    // One node per namespace: nothing needs its own datagrams back, and with loopback off
    // a delivery proves the datagram crossed the bridge.
    multicast.loopback = false;
    c.transport = Transport::Multicast(multicast);
    c
}

fn payload(topic: TopicId, index: u64) -> Bytes {
    let mut p = Vec::with_capacity(PAYLOAD_BYTES);
    p.extend_from_slice(&topic.0.to_be_bytes());
    p.extend_from_slice(&index.to_be_bytes());
    p.resize(PAYLOAD_BYTES, 0x5a);
    Bytes::from(p)
}

/// Messages published on `t`: round-robin over the topics.
fn want(t: TopicId) -> u64 {
    TOTAL / u64::from(TOPICS) + u64::from(u64::from(t.0) < TOTAL % u64::from(TOPICS))
}

/// Runs only in a child process, inside a namespace: one node.
#[test]
fn child_netns_node() {
    let Ok(me) = std::env::var(CHILD) else {
        return;
    };
    let me: u32 = me.parse().unwrap();
    let input = stdin_lines();
    let node = NodeRuntime::start(
        config(me),
        Config::default(),
        NodeId(me),
        membership(),
        book(),
    )
    .unwrap();
    let verdict = if me == 0 {
        publisher(&node, &input)
    } else {
        subscriber(me, &node)
    };
    let stats = node.stats().unwrap();
    println!(
        "CHILD-RESULT {me} {verdict} (groups joined {}, datagrams received {}, injected drops {}, repairs {})",
        stats.groups_joined,
        stats.datagrams_received,
        stats.injected_drops,
        stats.proto.repairs_received
    );
    // Stay in the regions (their token rings carry the acknowledgements that make the last
    // messages stable) until the parent closes stdin, or the timeout.
    while let Ok(Some(_)) = input.recv_timeout(TIMEOUT) {}
    node.shutdown().unwrap();
}

fn publisher(node: &NodeRuntime, input: &mpsc::Receiver<Option<String>>) -> String {
    println!("CHILD-READY 0");
    match input.recv_timeout(TIMEOUT) {
        Ok(Some(line)) if line == "GO" => {}
        other => return format!("no GO from the parent: {other:?}"),
    }
    let mut p = node.publisher();
    let mut counts: HashMap<TopicId, u64> = HashMap::new();
    let mut last = None;
    for i in 0..TOTAL {
        let topic = TopicId((i % u64::from(TOPICS)) as u32);
        let index = counts.entry(topic).or_default();
        match p.publish_timeout(topic, payload(topic, *index), Some(TIMEOUT)) {
            Ok(h) => last = Some(h),
            Err(e) => return format!("publish {i} failed: {e}"),
        }
        *index += 1;
    }
    match p.wait_stable(last.unwrap(), TIMEOUT) {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("not stable: {e}"),
    }
}

fn subscriber(me: u32, node: &NodeRuntime) -> String {
    let log: Arc<Mutex<HashMap<TopicId, Vec<u64>>>> = Arc::default();
    let mut subs = Vec::new();
    for t in topics_of(me) {
        let log = Arc::clone(&log);
        subs.push(
            node.subscribe(t, 0.5, move |d| {
                let index = u64::from_be_bytes(d.payload[4..12].try_into().unwrap());
                log.lock().unwrap().entry(d.topic).or_default().push(index);
            })
            .unwrap(),
        );
    }
    println!("CHILD-READY {me}");
    let expected: u64 = topics_of(me).into_iter().map(want).sum();
    let deadline = tidings_runtime::now() + TIMEOUT;
    loop {
        let got: u64 = log.lock().unwrap().values().map(|v| v.len() as u64).sum();
        if got >= expected || tidings_runtime::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in topics_of(me) {
        let got = log.lock().unwrap().get(&t).cloned().unwrap_or_default();
        if got != (0..want(t)).collect::<Vec<_>>() {
            return format!(
                "topic {} got {} of {} (or out of order)",
                t.0,
                got.len(),
                want(t)
            );
        }
    }
    drop(subs);
    "ok".to_owned()
}

#[test]
fn multicast_between_network_namespaces() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let namespaces = Namespaces::create(SUBSCRIBERS + 1, "multicast between namespaces");
    let (tx, rx) = mpsc::channel();
    let mut children = Children(
        (0..=SUBSCRIBERS)
            .map(|i| {
                spawn_in(
                    &namespaces.nodes[i as usize],
                    "child_netns_node",
                    (CHILD, &i.to_string()),
                    tx.clone(),
                )
            })
            .collect(),
    );
    drop(tx);
    let mut ready = 0;
    while ready <= SUBSCRIBERS {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("CHILD-READY") => ready += 1,
            Ok(line) => panic!("a child failed before it was ready: {line}"),
            Err(e) => panic!("children not ready in time ({ready} of 4): {e}"),
        }
    }
    let publisher_stdin = children.0[0].stdin.as_mut().unwrap();
    writeln!(publisher_stdin, "GO").unwrap();
    publisher_stdin.flush().unwrap();
    let mut results = Vec::new();
    while results.len() <= SUBSCRIBERS as usize {
        match rx.recv_timeout(TIMEOUT) {
            Ok(line) if line.starts_with("CHILD-RESULT") => results.push(line),
            Ok(_) => {}
            Err(e) => panic!("results missing ({e}): {results:?}"),
        }
    }
    drop(children);
    drop(namespaces);
    results.sort();
    for r in &results {
        let verdict = r.split_whitespace().nth(2).unwrap();
        assert_eq!(verdict, "ok", "{r}\nall: {results:#?}");
    }
    // Loss was injected and repaired at every subscriber, and every node joined its groups.
    for r in &results[1..] {
        let drops: u64 = field(r, "injected drops");
        let repairs: u64 = field(r, "repairs");
        assert!(drops > 0 && repairs > 0, "{r}");
    }
    for r in &results {
        assert!(
            field(r, "groups joined") > 0 || r.starts_with("CHILD-RESULT 0"),
            "{r}"
        );
    }
    eprintln!("{results:#?}");
}
