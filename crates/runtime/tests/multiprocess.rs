//! Multi-process test on loopback (issue 4: 1 publisher, 5 subscribers, 100 topics, 100 000
//! messages, 1% injected receive loss): the publisher runs in this process, five subscribers run as
//! separate processes (this test binary re-executed in child mode), each checking that it got
//! every message of its topics exactly once and in order.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tidings_proto::{Config, Membership, NodeId, RegionId, TopicId};
use tidings_runtime::{AddressBook, MulticastConfig, NodeRuntime, RuntimeConfig, Transport};

const CHILD: &str = "TIDINGS_RUNTIME_TEST_CHILD";
const SUBSCRIBERS: u32 = 5;
const TOPICS: u32 = 100;
const TOTAL: u64 = 100_000;
const LOSS: f64 = 0.01;
const TIMEOUT: Duration = Duration::from_secs(60);

fn topics_of(i: u32) -> Vec<TopicId> {
    match i {
        0 => vec![],
        1..=3 => (0..TOPICS).map(TopicId).collect(),
        _ => (0..TOPICS / 2).map(TopicId).collect(),
    }
}

fn membership() -> Membership {
    let subs: BTreeMap<NodeId, Vec<TopicId>> = (0..=SUBSCRIBERS)
        .map(|i| (NodeId(i), topics_of(i)))
        .collect();
    Membership::from_subscriptions(&subs, 5)
}

fn config(me: u32, multicast: bool) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.receive_loss = if me == 0 { 0.0 } else { LOSS };
    c.receive_loss_seed = u64::from(me) + 7;
    c.transport = if multicast {
        Transport::Multicast(MulticastConfig::default())
    } else {
        Transport::Unicast
    };
    c
}

fn encode_book(book: &AddressBook) -> String {
    let nodes: Vec<String> = book
        .nodes
        .iter()
        .map(|(n, a)| format!("{}={a}", n.0))
        .collect();
    let groups: Vec<String> = book
        .groups
        .iter()
        .map(|(r, a)| format!("{}={a}", r.0))
        .collect();
    format!("{};{}", nodes.join(","), groups.join(","))
}

fn decode_book(s: &str) -> AddressBook {
    let (nodes, groups) = s.split_once(';').unwrap();
    let mut book = AddressBook::default();
    for kv in nodes.split(',').filter(|x| !x.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap();
        book.nodes
            .insert(NodeId(k.parse().unwrap()), v.parse().unwrap());
    }
    for kv in groups.split(',').filter(|x| !x.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap();
        book.groups
            .insert(RegionId(k.parse().unwrap()), v.parse().unwrap());
    }
    book
}

/// Runs only in a child process: one subscriber node.
#[test]
fn child_node() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (me, rest) = spec.split_once('|').unwrap();
    let (multicast, book) = rest.split_once('|').unwrap();
    let me: u32 = me.parse().unwrap();
    let multicast = multicast == "multicast";
    let book = decode_book(book);
    let node = NodeRuntime::start(
        config(me, multicast),
        Config::default(),
        NodeId(me),
        membership(),
        book,
    )
    .unwrap();
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
    let want = |t: TopicId| {
        TOTAL / u64::from(TOPICS) + u64::from(u64::from(t.0) < TOTAL % u64::from(TOPICS))
    };
    let expected: u64 = topics_of(me).into_iter().map(want).sum();
    let deadline = tidings_runtime::now() + TIMEOUT;
    loop {
        let got: u64 = log.lock().unwrap().values().map(|v| v.len() as u64).sum();
        if got >= expected || tidings_runtime::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut verdict = "ok".to_owned();
    for t in topics_of(me) {
        let got = log.lock().unwrap().get(&t).cloned().unwrap_or_default();
        if got != (0..want(t)).collect::<Vec<_>>() {
            verdict = format!(
                "topic {} got {} of {} (or out of order)",
                t.0,
                got.len(),
                want(t)
            );
            break;
        }
    }
    let stats = node.stats().unwrap();
    println!(
        "CHILD-RESULT {me} {verdict} (injected drops {}, repairs {})",
        stats.injected_drops, stats.proto.repairs_received
    );
    // Stay in the region (its token rings carry the acknowledgements that make the publisher's
    // last messages stable) until the parent closes our stdin, or the timeout.
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = done.send(());
    });
    let _ = wait.recv_timeout(TIMEOUT);
    drop(subs);
    node.shutdown().unwrap();
}

fn spawn(me: u32, multicast: bool, book: &AddressBook, lines: mpsc::Sender<String>) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_node", "--exact", "--nocapture", "--test-threads=1"])
        .env(
            CHILD,
            format!(
                "{me}|{}|{}",
                if multicast { "multicast" } else { "unicast" },
                encode_book(book)
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test child_node ... " without a newline before the output.
            if let Some(at) = line.find("CHILD-") {
                let _ = lines.send(line[at..].to_owned());
            }
        }
    });
    child
}

fn parent(multicast: bool) {
    // Ports for the children, found by binding and releasing them; the publisher keeps its own.
    let publisher_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut book = AddressBook::default();
    book.nodes
        .insert(NodeId(0), publisher_socket.local_addr().unwrap());
    for i in 1..=SUBSCRIBERS {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        book.nodes
            .insert(NodeId(i), SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let m = membership();
    if multicast {
        let mut rng = fastrand::Rng::with_seed(u64::from(std::process::id()) + 99);
        for &region in m.regions.keys() {
            let port = UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let ip = std::net::Ipv4Addr::new(239, 255, rng.u8(1..255), rng.u8(1..255));
            book.groups
                .insert(region, std::net::SocketAddrV4::new(ip, port));
        }
    }
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (1..=SUBSCRIBERS)
        .map(|i| spawn(i, multicast, &book, tx.clone()))
        .collect();
    let kill_all = |children: &mut Vec<Child>| {
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    let mut ready = 0;
    while ready < SUBSCRIBERS {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("CHILD-READY") => ready += 1,
            Ok(line) => {
                kill_all(&mut children);
                panic!("child failed before ready: {line}");
            }
            Err(_) => {
                kill_all(&mut children);
                panic!("children not ready in time ({ready} of {SUBSCRIBERS})");
            }
        }
    }
    let node = NodeRuntime::start_with_socket(
        config(0, multicast),
        Config::default(),
        NodeId(0),
        m,
        book,
        publisher_socket,
    )
    .unwrap();
    let mut publisher = node.publisher();
    let mut counts: HashMap<TopicId, u64> = HashMap::new();
    let mut last = None;
    for i in 0..TOTAL {
        let topic = TopicId((i % u64::from(TOPICS)) as u32);
        let index = counts.entry(topic).or_default();
        let mut p = Vec::with_capacity(100);
        p.extend_from_slice(&topic.0.to_be_bytes());
        p.extend_from_slice(&index.to_be_bytes());
        p.resize(100, 0);
        *index += 1;
        last = Some(
            publisher
                .publish_timeout(topic, Bytes::from(p), Some(TIMEOUT))
                .unwrap(),
        );
    }
    let stable = publisher.wait_stable(last.unwrap(), TIMEOUT);
    let mut results = Vec::new();
    while results.len() < SUBSCRIBERS as usize {
        match rx.recv_timeout(TIMEOUT) {
            Ok(line) if line.starts_with("CHILD-RESULT") => results.push(line),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    for c in children.iter_mut() {
        // Closing stdin tells the child to leave; bounded wait, then kill.
        drop(c.stdin.take());
        let deadline = tidings_runtime::now() + Duration::from_secs(10);
        while c.try_wait().unwrap().is_none() && tidings_runtime::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    kill_all(&mut children);
    let stats = node.shutdown().unwrap();
    if let Err(e) = stable {
        panic!("not stable: {e}; children: {results:?}; publisher: {stats:?}");
    }
    assert_eq!(results.len(), SUBSCRIBERS as usize, "results: {results:?}");
    for r in &results {
        let verdict = r.split_whitespace().nth(2).unwrap();
        assert_eq!(verdict, "ok", "{r}");
    }
}

#[test]
fn multi_process_unicast() {
    parent(false);
}

#[test]
fn multi_process_multicast() {
    parent(true);
}
