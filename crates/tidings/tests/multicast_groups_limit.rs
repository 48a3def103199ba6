//! A multicast node holds a socket per region. When the process cannot open more (its hard
//! limit of open files), subscribing fails with a clear error naming the cause, instead of
//! leaving the subscription to wait for messages that cannot arrive; topics within the limit
//! keep working. Its own test binary: it lowers the limit of the whole process for good.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tidings::{Bytes, Error, GmsConfig, MulticastConfig, MulticastPool, Node, Topic, Transport};

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
    let gms = GmsConfig {
        multicast_pool: Some(MulticastPool {
            base: [239, 78, group_byte(), 0],
            prefix_len: 24,
            port,
        }),
        ..GmsConfig::default()
    };
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
    // Room for about 40 more descriptors in the whole process (both nodes, their threads'
    // sockets and the ones each region group needs).
    let limit = open_files() + 40;
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
    let many: Vec<Topic<Bytes>> = (0..200)
        .map(|t| Topic::raw(format!("many/{t}")).unwrap())
        .collect();
    let err = subscriber
        .subscribe_many_with(&many, |_| |_| {})
        .expect_err("200 more groups cannot fit 40 descriptors");
    let text = err.to_string();
    assert!(
        matches!(err, Error::Refused(_)) && text.contains("open-file limit"),
        "{text}"
    );
    let stats = subscriber.stats().unwrap().runtime;
    assert!(stats.groups_join_failed > 0, "{stats:?}");

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

/// A byte from the process id, so that concurrent test runs use different groups.
fn group_byte() -> u8 {
    (std::process::id() % 250) as u8 + 1
}
