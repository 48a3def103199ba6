//! The public library end to end on loopback: an embedded membership service, typed and raw
//! topics, iterator and callback subscriptions, async publishing, errors.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidings::{Bytes, Error, Node, PublishError, RecvError, SlowConsumerPolicy, StartError, Topic};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Quote {
    seq: u64,
    symbol: String,
    price: f64,
}

fn quote(seq: u64) -> Quote {
    Quote {
        seq,
        symbol: format!("SYM{}", seq % 7),
        price: seq as f64 * 0.5,
    }
}

#[test]
fn typed_messages_reach_iterator_and_callback_subscribers_in_order() {
    let first = Node::builder().private_gms().start().unwrap();
    let second = Node::builder().gms(first.gms_addr()).start().unwrap();
    let topic: Topic<Quote> = Topic::new("quotes/eu").unwrap();

    let sub = second.subscribe(&topic).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let _cb = first
        .subscribe_with(&topic, move |m| {
            s.lock().unwrap().push(m.unwrap().value.seq)
        })
        .unwrap();

    let mut publisher = first.publisher(&topic).unwrap();
    let n = 3000;
    let mut last = None;
    for k in 0..n {
        last = Some(publisher.publish(&quote(k)).unwrap());
    }
    // The iterator holds 1024 messages: read before waiting for stability, since an unread
    // subscription holds its node back (back pressure).
    for k in 0..n {
        let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.value, quote(k));
        assert_eq!(m.origin, first.id());
    }
    publisher
        .wait_stable(last.unwrap(), Duration::from_secs(20))
        .unwrap();
    let start = std::time::Instant::now();
    while seen.lock().unwrap().len() < n as usize {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "callback deliveries"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(*seen.lock().unwrap(), (0..n).collect::<Vec<_>>());
    let stats = first.stats().unwrap();
    let gms = stats.gms.unwrap();
    assert_eq!(gms.members.len(), 2);
    drop(sub);
    second.shutdown().unwrap();
    // The leave reached the embedded service.
    let gms = first.stats().unwrap().gms.unwrap();
    assert_eq!(gms.members.len(), 1);
    first.shutdown().unwrap();
}

#[test]
fn raw_topics_pass_bytes_through_and_async_publish_works() {
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic = Topic::raw("raw/bytes").unwrap();
    let sub = peer.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    pollster::block_on(async {
        let mut last = None;
        for k in 0u32..500 {
            last = Some(
                publisher
                    .publish_async(&Bytes::from(k.to_be_bytes().to_vec()))
                    .await
                    .unwrap(),
            );
        }
        publisher.wait_stable_async(last.unwrap()).await.unwrap();
    });
    for k in 0u32..500 {
        let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&m.value[..], &k.to_be_bytes());
    }
    drop(sub);
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}

#[test]
fn a_message_of_another_type_is_reported_not_dropped() {
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let as_text: Topic<String> = Topic::new("mixed").unwrap();
    let as_raw = Topic::raw("mixed").unwrap();
    let sub = peer.subscribe(&as_text).unwrap();
    let mut publisher = node.publisher(&as_raw).unwrap();
    // A length prefix of 200 with 1 byte of text: not a valid postcard string.
    let h = publisher
        .publish(&Bytes::from_static(&[200, 1, b'x']))
        .unwrap();
    publisher.wait_stable(h, Duration::from_secs(10)).unwrap();
    match sub.recv_timeout(Duration::from_secs(10)) {
        Err(RecvError::Decode { topic, .. }) => assert_eq!(topic, "mixed"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    drop(sub);
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}

#[test]
fn bad_settings_and_names_are_refused_with_the_reason() {
    let err = Node::builder()
        .subscription_capacity(0)
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("subscription_capacity"), "{err}");
    let err = Node::builder().subscription_share(1.5).start().unwrap_err();
    assert!(err.to_string().contains("subscription_share"), "{err}");
    assert!(matches!(Topic::<u32>::new(""), Err(Error::TopicName(_))));
    assert!(matches!(
        Topic::<u32>::new("x".repeat(300)),
        Err(Error::TopicName(_))
    ));
}

#[test]
fn too_large_messages_are_refused_with_the_limit() {
    let node = Node::builder().private_gms().start().unwrap();
    let topic = Topic::raw("big").unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    let max = publisher.max_payload();
    let err = publisher
        .try_publish(&Bytes::from(vec![0u8; max + 1]))
        .unwrap_err();
    assert!(matches!(err, PublishError::TooLarge { .. }), "{err}");
    node.shutdown().unwrap();
}

#[test]
fn a_slow_subscriber_is_disconnected_with_an_error_and_the_others_go_on() {
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic: Topic<Quote> = Topic::new("quotes/slow").unwrap();
    // Never read until the end: lags 4 messages at most, waits 50 ms for room, then leaves.
    let slow = peer
        .subscription(&topic)
        .capacity(4)
        .slow_consumer(SlowConsumerPolicy::Disconnect {
            max_wait: Duration::from_millis(50),
        })
        .subscribe()
        .unwrap();
    let fast = peer.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    for seq in 0..40 {
        publisher.publish(&quote(seq)).unwrap();
    }
    for seq in 0..40 {
        let m = fast.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.value.seq, seq);
    }
    // Reading now could make room within the 50 ms and keep the subscription (the fast reader
    // can take all 40 sooner than that): wait until the error is queued behind the 4 messages.
    let start = std::time::Instant::now();
    while slow.queued() <= 4 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the slow subscription was not disconnected: {} queued",
            slow.queued()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The slow reader gets what was queued, in order, then the error, then the end.
    let mut got = Vec::new();
    let error = loop {
        match slow.recv_timeout(Duration::from_secs(10)) {
            Ok(m) => got.push(m.value.seq),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(error, RecvError::SlowConsumer { capacity: 4, .. }),
        "{error}"
    );
    assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>());
    assert!(got.len() <= 5, "{got:?}");
    assert!(matches!(slow.recv(), Err(RecvError::Closed)));
}

#[test]
fn a_slow_callback_is_disconnected_with_an_error_as_its_last_call() {
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic: Topic<Quote> = Topic::new("quotes/slow-callback").unwrap();
    let (calls, seen) = std::sync::mpsc::channel();
    // Takes 200 ms per message with room for 4 and 50 ms of patience: a burst of 40 leaves its
    // queue full for longer than that.
    let _slow = peer
        .subscription(&topic)
        .capacity(4)
        .slow_consumer(SlowConsumerPolicy::Disconnect {
            max_wait: Duration::from_millis(50),
        })
        .subscribe_with(move |m: Result<tidings::Message<Quote>, RecvError>| {
            std::thread::sleep(Duration::from_millis(200));
            let _ = calls.send(m.map(|m| m.value.seq));
        })
        .unwrap();
    let fast = peer.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    for seq in 0..40 {
        publisher.publish(&quote(seq)).unwrap();
    }
    for seq in 0..40 {
        assert_eq!(
            fast.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .value
                .seq,
            seq
        );
    }
    let mut got = Vec::new();
    let error = loop {
        match seen.recv_timeout(Duration::from_secs(10)).unwrap() {
            Ok(seq) => got.push(seq),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(error, RecvError::SlowConsumer { capacity: 4, .. }),
        "{error}"
    );
    assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>());
    assert!(got.len() < 40, "disconnected before the end: {got:?}");
    // The error was the last call: the callback's thread has ended.
    assert!(seen.recv_timeout(Duration::from_millis(500)).is_err());
}

#[test]
fn a_builder_callback_within_its_capacity_gets_everything() {
    let node = Node::builder().private_gms().start().unwrap();
    let topic: Topic<Quote> = Topic::new("quotes/callback").unwrap();
    let (calls, seen) = std::sync::mpsc::channel();
    let subscription = node
        .subscription(&topic)
        .capacity(8)
        .subscribe_with(move |m: Result<tidings::Message<Quote>, RecvError>| {
            let _ = calls.send(m.unwrap().value.seq);
        })
        .unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    for seq in 0..200 {
        publisher.publish(&quote(seq)).unwrap();
    }
    let got: Vec<u64> = (0..200)
        .map(|_| seen.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    assert_eq!(subscription.topic_id(), publisher.topic_id());
    drop(subscription);
}

/// Regions past the pool's `groups_max` share a group. With one group for everything, two
/// subscribers of different topics (two regions) each receive the other's datagrams on it, drop
/// them as foreign, and get exactly their own topic's messages, in order.
#[test]
fn regions_sharing_a_multicast_group_each_get_only_their_own_messages() {
    use tidings::{GmsConfig, MulticastConfig, MulticastPool, Transport};
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gms = {
        let mut c = GmsConfig::default();
        c.multicast_pool = Some(MulticastPool {
            // Apart from other test processes' groups.
            base: [239, 130, (std::process::id() % 250) as u8, 0],
            prefix_len: 24,
            port,
            ports: 1,
            groups_max: 1,
        });
        c
    };
    let transport = Transport::Multicast(MulticastConfig::default());
    let publisher_node = Node::builder()
        .embedded_gms(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), gms)
        .transport(transport.clone())
        .start()
        .unwrap();
    let subscriber_node = |_| {
        Node::builder()
            .gms(publisher_node.gms_addr())
            .transport(transport.clone())
            .start()
            .unwrap()
    };
    let nodes: Vec<Node> = (0..2).map(subscriber_node).collect();
    let topics: Vec<Topic<Bytes>> = ["shared/a", "shared/b"]
        .iter()
        .map(|t| Topic::raw(*t).unwrap())
        .collect();
    let subs: Vec<_> = nodes
        .iter()
        .zip(&topics)
        .map(|(n, t)| n.subscribe(t).unwrap())
        .collect();
    let mut publishers = publisher_node.publishers(&topics).unwrap();
    const MESSAGES: u32 = 300;
    for k in 0..MESSAGES {
        for (i, p) in publishers.iter_mut().enumerate() {
            let value = [k.to_be_bytes(), (i as u32).to_be_bytes()].concat();
            p.publish(&Bytes::from(value)).unwrap();
        }
    }
    for (i, sub) in subs.iter().enumerate() {
        for k in 0..MESSAGES {
            let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
            let expected = [k.to_be_bytes(), (i as u32).to_be_bytes()].concat();
            assert_eq!(&m.value[..], &expected[..], "subscriber {i}");
        }
        assert!(sub.recv_timeout(Duration::from_millis(200)).is_err());
    }
    let shares = publisher_node
        .stats()
        .unwrap()
        .gms
        .unwrap()
        .stats
        .group_shares;
    assert_eq!(shares, 1, "the second region did not share the group");
    for (i, n) in nodes.iter().enumerate() {
        let foreign = n.stats().unwrap().runtime.proto.foreign_dropped;
        assert!(
            foreign > 0,
            "subscriber {i} saw none of the other region's traffic"
        );
    }
    drop(subs);
    for n in nodes {
        n.shutdown().unwrap();
    }
    publisher_node.shutdown().unwrap();
}

/// A second subscription and a second publisher of a topic the node already has are answered
/// (the topic is in force at the node before the service sees the request), and get and send
/// the messages like the first ones.
#[test]
fn a_second_subscription_and_publisher_of_a_topic_are_answered() {
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic = Topic::raw("again/t").unwrap();
    let first = peer.subscribe(&topic).unwrap();
    let mut first_publisher = node.publisher(&topic).unwrap();
    let started = std::time::Instant::now();
    let second = peer.subscribe(&topic).unwrap();
    let mut second_publisher = node.publisher(&topic).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        started.elapsed()
    );
    first_publisher
        .publish(&Bytes::from_static(b"one"))
        .unwrap();
    second_publisher
        .publish(&Bytes::from_static(b"two"))
        .unwrap();
    for sub in [&first, &second] {
        let mut got: Vec<Bytes> = (0..2)
            .map(|_| sub.recv_timeout(Duration::from_secs(10)).unwrap().value)
            .collect();
        got.sort();
        assert_eq!(
            got,
            [Bytes::from_static(b"one"), Bytes::from_static(b"two")]
        );
    }
    drop((first, second));
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}

/// A subscriber alone in the region of its topics drops half of them while the publisher sends
/// on all: the region loses topics its only member left, and its streams go on (ADR 30,
/// addendum). The kept topics get every message once and in order, and the publisher sends
/// nothing again.
#[test]
fn dropping_topics_under_traffic_sends_nothing_again() {
    let publisher_node = Node::builder().private_gms().start().unwrap();
    let subscriber_node = Node::builder()
        .gms(publisher_node.gms_addr())
        .start()
        .unwrap();
    let topics: Vec<Topic<Bytes>> = (0..8)
        .map(|t| Topic::raw(format!("dropped/{t}")).unwrap())
        .collect();
    let mut subs: Vec<_> = topics
        .iter()
        .map(|t| subscriber_node.subscribe(t).unwrap())
        .collect();
    const ROUNDS: u64 = 4000;
    // Topics 0..4 are kept, each read by a thread of its own (one full queue would hold back
    // the node's other deliveries); 4..8 are dropped one at a time while the traffic flows.
    let readers: Vec<_> = subs
        .drain(..4)
        .enumerate()
        .map(|(i, sub)| {
            std::thread::spawn(move || {
                for k in 0..ROUNDS {
                    let m = sub
                        .recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|e| panic!("topic {i}, message {k}: {e:?}"));
                    assert_eq!(&m.value[..], &k.to_be_bytes()[..], "topic {i}");
                }
                assert!(sub.recv_timeout(Duration::from_millis(200)).is_err());
                sub
            })
        })
        .collect();
    let mut publishers = publisher_node.publishers(&topics).unwrap();
    let publishing = std::thread::spawn(move || {
        for k in 0..ROUNDS {
            for p in &mut publishers {
                p.publish(&Bytes::copy_from_slice(&k.to_be_bytes()))
                    .unwrap();
            }
            if k % 500 == 0 {
                // Room for the unsubscriptions to land between bursts of traffic.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    let before = publisher_node.stats().unwrap();
    for sub in subs.drain(..).rev() {
        std::thread::sleep(Duration::from_millis(20));
        drop(sub);
    }
    publishing.join().unwrap();
    let kept: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let after = publisher_node.stats().unwrap();
    let gms = after.gms.unwrap().stats;
    assert_eq!(
        gms.regions_current, 1,
        "one region for the subscriber's topics"
    );
    assert!(
        gms.views_continued > before.gms.unwrap().stats.views_continued,
        "the drops did not continue the region's views"
    );
    assert_eq!(
        after.runtime.proto.messages_rehomed, 0,
        "the publisher sent messages again"
    );
    drop(kept);
    subscriber_node.shutdown().unwrap();
    publisher_node.shutdown().unwrap();
}

#[test]
fn a_subscription_is_read_from_async_code_as_a_future_and_as_a_stream() {
    use futures_core::Stream;
    let node = Node::builder().private_gms().start().unwrap();
    let topic: Topic<u64> = Topic::new("async/recv").unwrap();
    let mut sub = node.subscribe(&topic).unwrap();
    assert!(matches!(sub.try_recv(), Err(RecvError::Empty)));
    let mut publisher = node.publisher(&topic).unwrap();
    let writer = std::thread::spawn(move || {
        // After the reader has started waiting: the delivery must wake its task.
        std::thread::sleep(Duration::from_millis(50));
        for k in 0..100u64 {
            publisher.publish(&k).unwrap();
        }
        publisher
    });
    let mut got = Vec::new();
    pollster::block_on(async {
        for _ in 0..50 {
            got.push(sub.recv_async().await.unwrap().value);
        }
        while got.len() < 100 {
            let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut sub).poll_next(cx));
            got.push(next.await.unwrap().unwrap().value);
        }
    });
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    drop(writer.join().unwrap());
    node.shutdown().unwrap();
    // The subscription has ended: every call says so, the stream ends.
    assert!(matches!(sub.try_recv(), Err(RecvError::Closed)));
    assert!(matches!(
        pollster::block_on(sub.recv_async()),
        Err(RecvError::Closed)
    ));
    let end = pollster::block_on(std::future::poll_fn(|cx| {
        std::pin::Pin::new(&mut sub).poll_next(cx)
    }));
    assert!(end.is_none());
}

#[test]
fn a_taken_address_is_refused_with_the_system_error_as_source() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = Node::builder()
        .private_gms()
        .bind(addr)
        .start()
        .unwrap_err();
    match &err {
        StartError::Bind { addr: a, source } => {
            assert_eq!(*a, addr);
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected StartError::Bind, got {other:?}"),
    }
    assert!(std::error::Error::source(&err).is_some());
}

/// The only test of this binary on the host's shared service port (`LOCAL_GMS_PORT`).
#[test]
fn nodes_started_with_the_defaults_on_one_host_form_one_group() {
    let first = Node::builder().start().unwrap();
    let second = Node::builder().start().unwrap();
    assert!(first.embedded_gms().is_some());
    assert!(
        second.embedded_gms().is_none(),
        "the second joins the first's service"
    );
    assert_eq!(first.gms_addr(), second.gms_addr());
    assert_eq!(first.gms_addr().port(), tidings::LOCAL_GMS_PORT);
    let topic: Topic<u32> = Topic::new("defaults/one-group").unwrap();
    let sub = second.subscribe(&topic).unwrap();
    let mut publisher = first.publisher(&topic).unwrap();
    publisher.publish(&7).unwrap();
    assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, 7);
    drop(sub);
    second.shutdown().unwrap();
    first.shutdown().unwrap();
}

/// `GET path` on `addr`, the whole response as text (status line, headers, body).
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn a_node_serves_its_metrics_for_prometheus() {
    let node = Node::builder()
        .private_gms()
        .metrics("127.0.0.1:0".parse().unwrap())
        .start()
        .unwrap();
    let addr = node.metrics_addr().unwrap();
    let topic: Topic<u32> = Topic::new("metrics/t").unwrap();
    let sub = node.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    let mut last = None;
    for k in 0..10 {
        last = Some(publisher.publish(&k).unwrap());
    }
    for _ in 0..10 {
        sub.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    publisher
        .wait_stable(last.unwrap(), Duration::from_secs(10))
        .unwrap();
    let response = http_get(addr, "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("application/openmetrics-text"),
        "{response}"
    );
    let id = node.id().0;
    let published = format!("tidings_messages_published_total{{node=\"{id}\"}} 10");
    assert!(response.contains(&published), "{response}");
    let delivered = format!("tidings_messages_delivered_total{{node=\"{id}\"}} 10");
    assert!(response.contains(&delivered), "{response}");
    assert!(response.trim_end().ends_with("# EOF"), "{response}");
    assert!(http_get(addr, "/").starts_with("HTTP/1.1 404"));
    drop(sub);
    node.shutdown().unwrap();
    // Stopped with the node.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// The value of the first sample of `response` whose name and labels start with `prefix`.
fn sample(response: &str, prefix: &str) -> Option<f64> {
    response
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_name_the_slow_subscription_by_topic_within_the_bound() {
    let runtime = |topics_max| {
        let mut c = tidings::RuntimeConfig::default();
        c.metrics_topics_max = topics_max;
        c
    };
    let loopback = "127.0.0.1:0".parse().unwrap();
    let node = Node::builder()
        .private_gms()
        .runtime_config(runtime(100))
        .metrics(loopback)
        .start()
        .unwrap();
    // One topic labelled by name; the quiet ones are summed into `other`.
    let peer = Node::builder()
        .gms(node.gms_addr())
        .runtime_config(runtime(1))
        .metrics(loopback)
        .start()
        .unwrap();
    let slow_topic: Topic<u32> = Topic::new("metrics/slow").unwrap();
    let quiet: Vec<Topic<u32>> = (0..2)
        .map(|i| Topic::new(format!("metrics/quiet-{i}")).unwrap())
        .collect();
    // Never read until the end: full after 2 messages, which holds the topic at the peer.
    let slow = peer
        .subscription(&slow_topic)
        .capacity(2)
        .subscribe()
        .unwrap();
    let quiet_subs: Vec<_> = quiet.iter().map(|t| peer.subscribe(t).unwrap()).collect();
    let mut publisher = node.publisher(&slow_topic).unwrap();
    let mut last = None;
    for k in 0..20 {
        last = Some(publisher.publish(&k).unwrap());
    }
    let (node_id, peer_id) = (node.id().0, peer.id().0);
    let peer_addr = peer.metrics_addr().unwrap();
    let held = format!("tidings_topic_held_seconds{{node=\"{peer_id}\",topic=\"metrics/slow\"}}");
    let start = std::time::Instant::now();
    let r = loop {
        let r = http_get(peer_addr, "/metrics");
        if sample(&r, &held).is_some_and(|s| s > 0.0) {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "not held: {r}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let bottleneck = format!(
        "tidings_subscription_bottleneck_seconds{{node=\"{peer_id}\",topic=\"metrics/slow\","
    );
    assert!(sample(&r, &bottleneck).unwrap() > 0.0, "{r}");
    let lag =
        format!("tidings_subscription_lag_messages{{node=\"{peer_id}\",topic=\"metrics/slow\",");
    assert_eq!(sample(&r, &lag), Some(2.0), "{r}");
    // The two quiet topics are one `other` row, bounded by metrics_topics_max = 1.
    let other = format!("tidings_topic_delivered_total{{node=\"{peer_id}\",topic=\"other\"}}");
    assert_eq!(sample(&r, &other), Some(0.0), "{r}");
    assert!(!r.contains("metrics/quiet"), "{r}");
    let sender = format!("tidings_stream_delivered_seq{{node=\"{peer_id}\",");
    assert!(
        r.lines()
            .any(|l| l.starts_with(&sender) && l.contains(&format!("sender=\"{node_id}\""))),
        "{r}"
    );
    // Once read, the subscription has run them all, and all of them are stable.
    for _ in 0..20 {
        slow.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    publisher
        .wait_stable(last.unwrap(), Duration::from_secs(10))
        .unwrap();
    // The worker counts a batch of deliveries after handing it on, so the reader may have
    // taken the last messages a moment before the count shows them.
    let delivered =
        format!("tidings_topic_delivered_total{{node=\"{peer_id}\",topic=\"metrics/slow\"}}");
    let mut r = http_get(peer_addr, "/metrics");
    for _ in 0..50 {
        if sample(&r, &delivered) == Some(20.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        r = http_get(peer_addr, "/metrics");
    }
    assert_eq!(sample(&r, &delivered), Some(20.0), "{r}");
    let r = http_get(node.metrics_addr().unwrap(), "/metrics");
    let stable = format!("tidings_time_to_stable_seconds_count{{node=\"{node_id}\"}}");
    assert_eq!(sample(&r, &stable), Some(20.0), "{r}");
    drop((slow, quiet_subs));
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}

/// Two nodes with metrics on tell the membership service where they serve them; the service's
/// own endpoint lists both (how `tidings top --gms` finds the nodes).
#[test]
fn the_service_lists_where_its_members_serve_metrics() {
    let loopback: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server =
        tidings_runtime::GmsServer::start(tidings_gms::GmsConfig::default(), loopback).unwrap();
    let gms_metrics = server.serve_metrics(loopback).unwrap();
    let nodes: Vec<Node> = (0..2)
        .map(|_| {
            Node::builder()
                .gms(server.local_addr())
                .metrics(loopback)
                .start()
                .unwrap()
        })
        .collect();
    let listed = |r: &str, node: &Node| {
        let (id, at) = (node.id().0, node.metrics_addr().unwrap());
        r.lines().any(|l| {
            l.starts_with(&format!(
                "tidings_gms_member_metrics_info{{member=\"{id}\",address=\"{at}\"}} 1"
            ))
        })
    };
    let start = std::time::Instant::now();
    let r = loop {
        let r = http_get(gms_metrics.local_addr(), "/metrics");
        if nodes.iter().all(|n| listed(&r, n)) {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{r}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        sample(&r, "tidings_gms_member_metrics_endpoints "),
        Some(2.0),
        "{r}"
    );
    // A node that leaves is no longer listed.
    let mut nodes = nodes;
    nodes.pop().unwrap().shutdown().unwrap();
    let start = std::time::Instant::now();
    loop {
        let r = http_get(gms_metrics.local_addr(), "/metrics");
        if sample(&r, "tidings_gms_member_metrics_endpoints ") == Some(1.0) {
            assert!(listed(&r, &nodes[0]), "{r}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{r}");
        std::thread::sleep(Duration::from_millis(20));
    }
    for n in nodes {
        n.shutdown().unwrap();
    }
    drop(gms_metrics);
    server.shutdown();
}
