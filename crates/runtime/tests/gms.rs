//! Nodes that join through a real membership service ([`GmsServer`] on loopback): topics by name,
//! views, node addresses and multicast groups from the service, and leaving on shutdown.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidings_gms::{GmsConfig, MulticastPool, RemoveCause};
use tidings_proto::{Config, TopicId};
use tidings_runtime::{
    GmsLinkConfig, GmsServer, MulticastConfig, NodeRuntime, RuntimeConfig, StartError, Transport,
};

type Log = Arc<Mutex<HashMap<TopicId, Vec<u64>>>>;

fn gms_config(multicast: bool) -> GmsConfig {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    {
        let mut c = GmsConfig::default();
        c.multicast_pool = multicast.then_some(MulticastPool {
            base: [239, 255, fastrand::u8(1..255), 0],
            prefix_len: 24,
            port,
            ports: MulticastPool::PORTS_DEFAULT,
            groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
        });
        c
    }
}

fn join(server: SocketAddr, multicast: bool, loss: f64, seed: u64) -> NodeRuntime {
    let config = {
        let mut c = RuntimeConfig::default();
        c.transport = if multicast {
            Transport::Multicast(MulticastConfig::default())
        } else {
            Transport::Unicast
        };
        c.receive_loss = loss;
        c.receive_loss_seed = seed;
        c
    };
    let mut link = GmsLinkConfig::new(server);
    link.client.seed = seed;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    NodeRuntime::join(config, Config::default(), link, socket).unwrap()
}

fn payload(index: u64) -> Bytes {
    let mut v = index.to_be_bytes().to_vec();
    v.resize(64, 0xab);
    Bytes::from(v)
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run(multicast: bool) {
    let server = GmsServer::start(gms_config(multicast), "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.local_addr();
    let names: Vec<String> = (0..10).map(|i| format!("prices/{i}")).collect();
    // Three subscribers: 1 and 2 take every topic, 3 the first half.
    let mut subscribers = Vec::new();
    let mut logs: Vec<Log> = Vec::new();
    let mut subscriptions = Vec::new();
    for i in 1..=3u64 {
        let node = join(addr, multicast, 0.01, 10 + i);
        let log: Log = Arc::default();
        let upto = if i <= 2 { names.len() } else { names.len() / 2 };
        for name in &names[..upto] {
            let l = Arc::clone(&log);
            let sub = node
                .subscribe_named(name, 0.5, move |d| {
                    let index = u64::from_be_bytes(d.payload[..8].try_into().unwrap());
                    l.lock().unwrap().entry(d.topic).or_default().push(index);
                })
                .unwrap();
            subscriptions.push(sub);
        }
        subscribers.push(node);
        logs.push(log);
    }
    let publisher = join(addr, multicast, 0.0, 1);
    let topics: Vec<TopicId> = names
        .iter()
        .map(|n| publisher.advertise(n).unwrap())
        .collect();
    let snap = server.snapshot().unwrap();
    assert_eq!(snap.members.len(), 4);
    assert_eq!(snap.topics.len(), names.len());
    if multicast {
        let groups = subscribers[0].stats().unwrap().groups_joined;
        assert!(groups >= 1, "multicast groups from the GMS were not joined");
    }

    let per_topic = 2000u64;
    let mut p = publisher.publisher();
    let mut last = None;
    for k in 0..per_topic {
        for &t in &topics {
            last = Some(p.publish(t, payload(k)).unwrap());
        }
    }
    p.wait_stable(last.unwrap(), Duration::from_secs(30))
        .unwrap();
    for (i, log) in logs.iter().enumerate() {
        let upto = if i < 2 {
            topics.len()
        } else {
            topics.len() / 2
        };
        wait_until("deliveries", Duration::from_secs(20), || {
            let l = log.lock().unwrap();
            topics[..upto]
                .iter()
                .all(|t| l.get(t).is_some_and(|v| v.len() as u64 == per_topic))
        });
        let l = log.lock().unwrap();
        for t in &topics[..upto] {
            let expected: Vec<u64> = (0..per_topic).collect();
            assert_eq!(l.get(t).unwrap(), &expected, "subscriber {i} topic {t:?}");
        }
        for t in &topics[upto..] {
            assert!(
                !l.contains_key(t),
                "subscriber {i} got a topic it did not take"
            );
        }
    }
    let repaired: u64 = subscribers
        .iter()
        .map(|n| n.stats().unwrap().proto.repairs_received)
        .sum();
    assert!(repaired > 0, "1% loss but nothing repaired");

    // A clean shutdown leaves the group: the service removes the node at once, for leaving.
    let leaver = subscribers.pop().unwrap();
    let leaver_id = leaver.id();
    let stats = leaver.shutdown().unwrap();
    assert!(stats.gms_removed, "the leave was not confirmed");
    let snap = server.snapshot().unwrap();
    assert!(!snap.members.contains_key(&leaver_id));
    assert!(snap.removed.contains(&(leaver_id, RemoveCause::Left)));

    // The others go on without loss after the view change.
    let mut last = None;
    for k in per_topic..per_topic + 500 {
        for &t in &topics {
            last = Some(p.publish(t, payload(k)).unwrap());
        }
    }
    p.wait_stable(last.unwrap(), Duration::from_secs(30))
        .unwrap();
    for log in &logs[..2] {
        let done = || {
            let l = log.lock().unwrap();
            topics
                .iter()
                .all(|t| l.get(t).is_some_and(|v| v.len() as u64 == per_topic + 500))
        };
        let start = Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !done() {
            let l = log.lock().unwrap();
            let counts: Vec<usize> = topics
                .iter()
                .map(|t| l.get(t).map_or(0, Vec::len))
                .collect();
            panic!(
                "deliveries after the leave: {counts:?}; sender {:?}; subscribers {:?}",
                publisher.stats().unwrap().proto,
                subscribers
                    .iter()
                    .map(|n| n.stats().unwrap())
                    .collect::<Vec<_>>()
            );
        }
        let l = log.lock().unwrap();
        for t in &topics {
            let expected: Vec<u64> = (0..per_topic + 500).collect();
            assert_eq!(l.get(t).unwrap(), &expected);
        }
    }
    drop(subscriptions);
    drop(p);
    for n in subscribers {
        n.shutdown().unwrap();
    }
    publisher.shutdown().unwrap();
    // Nothing of the group is left in the service.
    wait_until("an empty service", Duration::from_secs(5), || {
        server.snapshot().unwrap().members.is_empty()
    });
    let snap = server.snapshot().unwrap();
    assert!(snap
        .removed
        .iter()
        .all(|&(_, cause)| cause == RemoveCause::Left));
    server.shutdown();
}

#[test]
fn unicast_nodes_join_through_the_gms_and_leave_cleanly() {
    run(false);
}

#[test]
fn multicast_groups_come_from_the_gms() {
    run(true);
}

#[test]
fn joining_without_a_service_fails_and_names_the_address() {
    // A bound socket nobody reads: the join times out.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut link = GmsLinkConfig::new(silent.local_addr().unwrap());
    link.join_timeout = Duration::from_millis(300);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let err =
        NodeRuntime::join(RuntimeConfig::default(), Config::default(), link, socket).unwrap_err();
    assert!(matches!(err, StartError::GmsUnreachable { .. }), "{err}");
    assert!(err
        .to_string()
        .contains(&silent.local_addr().unwrap().to_string()));
}

#[test]
fn a_second_joiner_with_the_same_nonce_does_not_become_the_first_node() {
    let server = GmsServer::start(gms_config(false), "127.0.0.1:0".parse().unwrap()).unwrap();
    let first = join(server.local_addr(), false, 0.0, 7);
    // The same seed, so the same join nonce, from another socket: the service must not take it
    // for the first node's repeated join (the two would share one id and one update stream).
    // It says the nonce is taken, and the joiner joins again with a fresh one.
    let second = join(server.local_addr(), false, 0.0, 7);
    assert_ne!(second.id(), first.id());
    let snapshot = server.snapshot().unwrap();
    assert!(
        snapshot.stats.joins_conflicting >= 1,
        "{:?}",
        snapshot.stats
    );
    assert_eq!(snapshot.members.len(), 2);
    assert!(snapshot.members.contains_key(&second.id()));
    assert!(second.stats().unwrap().gms_nonces_taken >= 1);
    second.shutdown().unwrap();
    first.shutdown().unwrap();
    // Without a seed of their own, links draw their nonces from the OS: no two alike.
    let seeds: std::collections::BTreeSet<u64> = (0..1000)
        .map(|_| GmsLinkConfig::new(server.local_addr()).client.seed)
        .collect();
    assert_eq!(seeds.len(), 1000);
    server.shutdown();
}
