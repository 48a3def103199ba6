//! A cluster of `NodeRuntime`s on loopback for the integration tests: node 0 publishes, the
//! others subscribe; every delivery is recorded so the tests can check the delivery promise.

#![allow(clippy::unwrap_used, dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tidings_proto::{Config, Membership, NodeId, TopicId};
use tidings_runtime::{
    AddressBook, MulticastConfig, NodeRuntime, PublishHandle, RuntimeConfig, Subscription,
    Transport,
};

/// Per topic, the per-topic indices delivered, in delivery order.
pub(crate) type Log = Arc<Mutex<HashMap<TopicId, Vec<u64>>>>;

pub(crate) struct Cluster {
    pub(crate) nodes: Vec<NodeRuntime>,
    pub(crate) logs: Vec<Log>,
    pub(crate) subscriptions: Vec<Subscription>,
    pub(crate) topics_of: Vec<Vec<TopicId>>,
    pub(crate) membership: Membership,
}

/// Payload: topic (u32), per-topic index (u64), padding up to `size`.
pub(crate) fn payload(topic: TopicId, index: u64, size: usize) -> Bytes {
    let mut v = Vec::with_capacity(size.max(12));
    v.extend_from_slice(&topic.0.to_be_bytes());
    v.extend_from_slice(&index.to_be_bytes());
    v.resize(size.max(12), 0xab);
    Bytes::from(v)
}

fn parse(p: &[u8]) -> (u32, u64) {
    let topic = u32::from_be_bytes(p[0..4].try_into().unwrap());
    let index = u64::from_be_bytes(p[4..12].try_into().unwrap());
    (topic, index)
}

/// A multicast group address and port unlikely to collide with another test run on this host.
pub(crate) fn random_group(rng: &mut fastrand::Rng) -> SocketAddrV4 {
    let port = {
        // A free port, found by binding one.
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    SocketAddrV4::new(
        Ipv4Addr::new(239, 255, rng.u8(1..255), rng.u8(1..255)),
        port,
    )
}

impl Cluster {
    /// Node 0 subscribes to nothing; node `i >= 1` subscribes to `subs(i)`.
    pub(crate) fn start(
        subscribers: u32,
        subs: impl Fn(u32) -> Vec<TopicId>,
        multicast: bool,
        loss: f64,
        seed: u64,
    ) -> Cluster {
        let n = subscribers + 1;
        let topics_of: Vec<Vec<TopicId>> = (0..n)
            .map(|i| if i == 0 { vec![] } else { subs(i) })
            .collect();
        let subscriptions: BTreeMap<NodeId, Vec<TopicId>> = (0..n)
            .map(|i| (NodeId(i), topics_of[i as usize].clone()))
            .collect();
        let membership = Membership::from_subscriptions(&subscriptions, 5);
        let sockets: Vec<UdpSocket> = (0..n)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let mut book = AddressBook::default();
        for (i, s) in sockets.iter().enumerate() {
            book.nodes.insert(NodeId(i as u32), s.local_addr().unwrap());
        }
        let mut rng = fastrand::Rng::with_seed(seed ^ std::process::id() as u64);
        if multicast {
            for &region in membership.regions.keys() {
                book.groups.insert(region, random_group(&mut rng));
            }
        }
        let mut nodes = Vec::new();
        let mut logs = Vec::new();
        let mut subscription_handles = Vec::new();
        for (i, socket) in sockets.into_iter().enumerate() {
            let config = {
                let mut c = RuntimeConfig::default();
                c.receive_loss = if i == 0 { 0.0 } else { loss };
                c.receive_loss_seed = seed + i as u64;
                c.transport = if multicast {
                    Transport::Multicast(MulticastConfig::default())
                } else {
                    Transport::Unicast
                };
                c.thread_name = format!("tidings-core-{i}");
                c
            };
            let protocol = {
                let mut c = Config::default();
                c.rng_seed = seed;
                c
            };
            let node = NodeRuntime::start_with_socket(
                config,
                protocol,
                NodeId(i as u32),
                membership.clone(),
                book.clone(),
                socket,
            )
            .unwrap_or_else(|e| {
                panic!(
                    "node {i} failed to start ({e}); multicast on loopback needs \
                     IP_MULTICAST_IF=127.0.0.1 to be accepted by this host"
                )
            });
            let log: Log = Arc::default();
            for &topic in &topics_of[i] {
                let log = Arc::clone(&log);
                let sub = node
                    .subscribe(topic, 0.5, move |d| {
                        let (t, index) = parse(&d.payload);
                        assert_eq!(t, d.topic.0, "payload of another topic");
                        log.lock().unwrap().entry(d.topic).or_default().push(index);
                    })
                    .unwrap();
                subscription_handles.push(sub);
            }
            nodes.push(node);
            logs.push(log);
        }
        Cluster {
            nodes,
            logs,
            subscriptions: subscription_handles,
            topics_of,
            membership,
        }
    }

    /// Publishes `total` messages round-robin over `topics` from node 0 and waits until they are
    /// stable. Returns the number published per topic.
    pub(crate) fn publish(
        &self,
        total: u64,
        topics: u32,
        size: usize,
        timeout: Duration,
    ) -> HashMap<TopicId, u64> {
        let mut publisher = self.nodes[0].publisher();
        let mut counts: HashMap<TopicId, u64> = HashMap::new();
        let mut last: Option<PublishHandle> = None;
        let deadline = tidings_runtime::now() + timeout;
        for i in 0..total {
            let topic = TopicId((i % u64::from(topics)) as u32);
            let index = counts.entry(topic).or_default();
            let left = deadline - tidings_runtime::now();
            let handle = publisher
                .publish_timeout(topic, payload(topic, *index, size), Some(left))
                .unwrap_or_else(|e| panic!("publish {i} of {total}: {e}"));
            *index += 1;
            last = Some(handle);
        }
        if let Some(h) = last {
            let left = deadline - tidings_runtime::now();
            publisher.wait_stable(h, left).unwrap_or_else(|e| {
                let stats = self.nodes[0].stats().unwrap();
                panic!(
                    "not stable: {e}; stable {} of {total}\nsender stats {stats:#?}",
                    publisher.stable_count()
                )
            });
        }
        counts
    }

    /// Waits until every subscriber has received every message of its topics (or `timeout`),
    /// then checks exactly-once, in-order delivery.
    pub(crate) fn check(&self, counts: &HashMap<TopicId, u64>, timeout: Duration) {
        let deadline = tidings_runtime::now() + timeout;
        for (i, log) in self.logs.iter().enumerate().skip(1) {
            let want: u64 = self.topics_of[i]
                .iter()
                .map(|t| counts.get(t).copied().unwrap_or(0))
                .sum();
            loop {
                let got: u64 = log.lock().unwrap().values().map(|v| v.len() as u64).sum();
                if got >= want || tidings_runtime::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let log = log.lock().unwrap();
            for topic in &self.topics_of[i] {
                let n = counts.get(topic).copied().unwrap_or(0);
                let got = log.get(topic).cloned().unwrap_or_default();
                if got.len() as u64 != n || got.iter().zip(0..).any(|(&a, b)| a != b) {
                    let first_bad = got.iter().zip(0..).position(|(&a, b)| a != b);
                    panic!(
                        "node {i} topic {topic:?}: {} of {n} delivered, first out of order at {first_bad:?}",
                        got.len()
                    );
                }
            }
        }
    }

    pub(crate) fn shutdown(self) {
        let Cluster {
            nodes,
            subscriptions,
            ..
        } = self;
        drop(subscriptions);
        for (i, node) in nodes.into_iter().enumerate() {
            let stats = node.shutdown().unwrap();
            if std::env::var_os("RUNTIME_DEBUG").is_some() {
                eprintln!("node {i}: {stats:#?}");
            }
        }
    }

    pub(crate) fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].local_addr()
    }
}
