//! Slow consumers isolated, on loopback: node A subscribes to "slow" (published by B) and to
//! "fast" (published by C) and does not read "slow". A still gets every message of "fast", B's
//! publisher is slowed (not failed), and once A reads "slow" again every message of B arrives
//! in order; under `Disconnect` the unread subscription is dropped with an error instead.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidings::{Node, PublishError, RecvError, SlowConsumerPolicy, Subscription, Topic};

/// Messages C publishes on "fast" while "slow" is unread.
const FAST: u64 = 20_000;
/// The unread subscription's capacity.
const CAPACITY: usize = 256;

/// B's flood on "slow": publishes 0, 1, 2, ... until told to stop, counting the waits for room
/// (publishes that timed out); any other error fails the test.
struct Flood {
    stop: Arc<AtomicBool>,
    published: Arc<AtomicU64>,
    waits: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

fn flood(b: &Node, slow: &Topic<u64>) -> Flood {
    let mut publisher = b.publisher(slow).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(AtomicU64::new(0));
    let (s, p, w) = (
        Arc::clone(&stop),
        Arc::clone(&published),
        Arc::clone(&waits),
    );
    let thread = std::thread::spawn(move || {
        let mut next = 0u64;
        while !s.load(Ordering::Acquire) {
            match publisher.publish_timeout(&next, Duration::from_millis(20)) {
                Ok(_) => {
                    next += 1;
                    p.store(next, Ordering::Release);
                }
                Err(PublishError::Timeout) => {
                    w.fetch_add(1, Ordering::AcqRel);
                }
                Err(e) => panic!("B's publisher failed: {e}"),
            }
        }
    });
    Flood {
        stop,
        published,
        waits,
        thread,
    }
}

/// Waits until `sub` is its topic's bottleneck.
fn until_bottleneck(sub: &Subscription<u64>) {
    let start = Instant::now();
    while sub.bottleneck().since.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the unread subscription never filled ({} queued)",
            sub.queued()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// C publishes `FAST` messages on "fast" and A reads them all, in order, while "slow" stays
/// unread; returns how long that took.
fn fast_topic_flows(a_fast: &Subscription<u64>, c: &Node, fast: &Topic<u64>) -> Duration {
    let start = Instant::now();
    let mut publisher = c.publisher(fast).unwrap();
    let writer = std::thread::spawn(move || {
        for k in 0..FAST {
            publisher.publish(&k).unwrap();
        }
        publisher
    });
    for k in 0..FAST {
        let m = a_fast
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("fast message {k} of {FAST}: {e}"));
        assert_eq!(m.value, k);
    }
    let took = start.elapsed();
    drop(writer.join().unwrap());
    took
}

struct Group {
    a: Node,
    b: Node,
    c: Node,
    slow: Topic<u64>,
    fast: Topic<u64>,
}

fn group(name: &str) -> Group {
    let a = Node::builder().private_gms().start().unwrap();
    let b = Node::builder().gms(a.gms_addr()).start().unwrap();
    let c = Node::builder().gms(a.gms_addr()).start().unwrap();
    Group {
        slow: Topic::new(format!("{name}/slow")).unwrap(),
        fast: Topic::new(format!("{name}/fast")).unwrap(),
        a,
        b,
        c,
    }
}

#[test]
fn an_unread_subscription_slows_only_its_publisher_and_loses_nothing() {
    let g = group("slow-down");
    let slow =
        g.a.subscription(&g.slow)
            .capacity(CAPACITY)
            .subscribe()
            .unwrap();
    let fast = g.a.subscribe(&g.fast).unwrap();
    let b = flood(&g.b, &g.slow);
    until_bottleneck(&slow);
    let took = fast_topic_flows(&fast, &g.c, &g.fast);
    eprintln!("{FAST} fast messages in {took:?} beside the unread subscription");
    // Still the bottleneck, and B held back by it: waiting for room, not failing.
    assert!(slow.bottleneck().since.is_some());
    let stats = g.a.stats().unwrap().runtime;
    assert!(
        stats.held_topics.iter().any(|h| h.topic == slow.topic_id()),
        "{:?}",
        stats.held_topics
    );
    let waits_before = b.waits.load(Ordering::Acquire);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        b.waits.load(Ordering::Acquire) > waits_before,
        "B's publisher was not held back"
    );
    b.stop.store(true, Ordering::Release);
    b.thread.join().unwrap();
    let published = b.published.load(Ordering::Acquire);
    assert!(published > CAPACITY as u64, "{published}");
    // A reads again: every message of B, in order.
    for k in 0..published {
        let m = slow
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("slow message {k} of {published}: {e}"));
        assert_eq!(m.value, k);
    }
    // Released (the core thread hands the backlog on just before it releases the topic).
    let start = Instant::now();
    while slow.bottleneck().since.is_some() {
        assert!(start.elapsed() < Duration::from_secs(10), "never released");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(slow.bottleneck().times >= 1);
    let stats = g.a.stats().unwrap().runtime;
    assert!(stats.delivery_stalls >= 1 && stats.topic_releases >= 1);
    assert!(stats.proto.held_topic_stops >= 1);
    assert!(matches!(slow.try_recv(), Err(RecvError::Empty)));
}

#[test]
fn an_unread_subscription_under_disconnect_is_dropped_and_the_rest_goes_on() {
    let g = group("disconnect");
    let slow =
        g.a.subscription(&g.slow)
            .capacity(CAPACITY)
            .slow_consumer(SlowConsumerPolicy::Disconnect {
                max_wait: Duration::from_millis(300),
            })
            .subscribe()
            .unwrap();
    let fast = g.a.subscribe(&g.fast).unwrap();
    let b = flood(&g.b, &g.slow);
    until_bottleneck(&slow);
    fast_topic_flows(&fast, &g.c, &g.fast);
    // Reading before `max_wait` ran out would make room and keep the subscription: wait for
    // the disconnection.
    let start = Instant::now();
    while g.a.stats().unwrap().runtime.slow_consumer_disconnects == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not disconnected"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Past `max_wait` the subscription was told: its queue, then the error, then the end.
    let mut got = Vec::new();
    let error = loop {
        match slow.recv_timeout(Duration::from_secs(20)) {
            Ok(m) => got.push(m.value),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            error,
            RecvError::SlowConsumer {
                capacity: CAPACITY,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(got, (0..CAPACITY as u64).collect::<Vec<_>>());
    assert!(matches!(slow.recv(), Err(RecvError::Closed)));
    assert_eq!(g.a.stats().unwrap().runtime.slow_consumer_disconnects, 1);
    // B was slowed, not failed, and goes on now that nobody holds it.
    let before = b.published.load(Ordering::Acquire);
    let start = Instant::now();
    while b.published.load(Ordering::Acquire) < before + 1000 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "B's publisher did not go on"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    b.stop.store(true, Ordering::Release);
    b.thread.join().unwrap();
}
