//! A multicast node holds a socket per region. When the process cannot open more (its hard
//! limit of open files), subscribing fails with a clear error naming the cause, instead of
//! leaving the subscription to wait for messages that cannot arrive; topics within the limit
//! keep working. Its own test binary: it lowers the limit of the whole process for good.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tidings::{
    Bytes, GmsConfig, MulticastConfig, MulticastPool, Node, RequestError, Topic, Transport,
};

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

#[test]
fn subscribing_past_the_open_file_limit_is_refused_with_the_reason() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut gms = GmsConfig::default();
    gms.multicast_pool = Some(MulticastPool {
        // 4,096 addresses: every region of the test gets a group (past the pool, the
        // service would make regions unicast).
        base: [239, group_byte(), 0, 0],
        prefix_len: 20,
        port,
        ports: MulticastPool::PORTS_DEFAULT,
        groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
    });
    // A region per topic, as for topics of distinct subscribers: topics of the same
    // subscribers would otherwise share a few regions (and groups).
    gms.planner.subset_topics_max = 1;
    let transport = Transport::Multicast(MulticastConfig::default());
    let publisher = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), gms)
        .transport(transport.clone())
        .start()
        .unwrap();
    let subscriber = Node::builder()
        .gms(publisher.gms_addr())
        .transport(transport)
        .start()
        .unwrap();
    // Room for about 12 more descriptors in the whole process; the groups of a port share a
    // socket up to the kernel's per-socket limit (20 by default), so 1,000 groups need 50.
    let limit = open_files() + 12;
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .unwrap();

    // Within the limit: subscribed, and the messages arrive.
    let few: Vec<Topic<Bytes>> = (0..5)
        .map(|t| Topic::raw(format!("few/{t}")).unwrap())
        .collect();
    let subs: Vec<_> = few
        .iter()
        .map(|t| subscriber.subscribe(t).unwrap())
        .collect();
    let mut publishers = publisher.publishers(&few).unwrap();
    for p in &mut publishers {
        p.publish(&Bytes::from_static(b"hello")).unwrap();
    }
    for s in &subs {
        let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&m.value[..], b"hello");
    }

    // Past it: refused, with the cause and what to do.
    let many: Vec<Topic<Bytes>> = (0..1000)
        .map(|t| Topic::raw(format!("many/{t}")).unwrap())
        .collect();
    let err = match subscriber.subscribe_many_with(&many, |_| |_| {}) {
        Ok(subs) => panic!(
            "{} subscriptions for 1,000 groups in 12 descriptors",
            subs.len()
        ),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(
        matches!(err, RequestError::Refused(_)) && text.contains("open-file limit"),
        "{text}"
    );
    let stats = subscriber.stats().unwrap().runtime;
    assert!(stats.groups_join_failed > 0, "{stats:?}");
    // The five groups within the limit share one socket.
    assert!(
        stats.group_sockets_current < stats.groups_joined,
        "{stats:?}"
    );

    // The topics within the limit still work.
    for p in &mut publishers {
        p.publish(&Bytes::from_static(b"again")).unwrap();
    }
    for s in &subs {
        let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&m.value[..], b"again");
    }
    drop(subs);
    drop(publishers);
    subscriber.shutdown().unwrap();
    publisher.shutdown().unwrap();
}

/// The second byte of the groups, from the process id, so that concurrent test runs use
/// different groups (239.64.0.0 to 239.127.255.255, administratively scoped).
fn group_byte() -> u8 {
    (std::process::id() % 64) as u8 + 64
}
