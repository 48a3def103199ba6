//! Batch delivery in the library: `Subscription::recv_many` (and its timeout and non-blocking
//! forms) and `Node::subscribe_batch_with`, on loopback between two nodes: order across many
//! batches, how many a call takes, errors in their place, holding and releasing a topic.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidings::{Message, Node, PublishError, RecvError, SlowConsumerPolicy, Subscription, Topic};

/// Messages published where many are wanted (small ones: many to a datagram).
const MANY: u64 = 20_000;

/// A subscriber node with its own service, and a publisher node that joins it.
fn pair() -> (Node, Node) {
    let a = Node::builder().private_gms().start().unwrap();
    let b = Node::builder().gms(a.gms_addr()).start().unwrap();
    (a, b)
}

/// Publishes `0..=n` on `topic` from `node`, on a thread of its own, and waits until the last
/// is stable.
fn publish_range(node: &Node, topic: &Topic<u64>, n: u64) -> JoinHandle<()> {
    let mut publisher = node.publisher(topic).unwrap();
    std::thread::spawn(move || {
        for k in 0..n {
            publisher.publish(&k).unwrap();
        }
        // Kept until the last is stable, so that the stream outlives its messages.
        let last = publisher.publish(&n).unwrap();
        publisher
            .wait_stable(last, Duration::from_secs(30))
            .unwrap();
    })
}

/// Publishes 0, 1, 2, ... on `topic` from `node` until told to stop; the count published.
fn flood(node: &Node, topic: &Topic<u64>) -> (Arc<AtomicBool>, Arc<AtomicU64>, JoinHandle<()>) {
    let mut publisher = node.publisher(topic).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let (s, p) = (Arc::clone(&stop), Arc::clone(&published));
    let thread = std::thread::spawn(move || {
        let mut next = 0u64;
        while !s.load(Ordering::Acquire) {
            match publisher.publish_timeout(&next, Duration::from_millis(20)) {
                Ok(_) => {
                    next += 1;
                    p.store(next, Ordering::Release);
                }
                Err(PublishError::Timeout) => {}
                Err(e) => panic!("the flood's publisher failed: {e}"),
            }
        }
    });
    (stop, published, thread)
}

/// Waits at most 20 s for `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reads `0..n` from `sub` with `recv_many` (at most `max` a call) into one reused vector;
/// returns the most messages one call took.
fn read_in_order(sub: &Subscription<u64>, n: u64, max: usize) -> usize {
    let mut out: Vec<Message<u64>> = Vec::with_capacity(max);
    let storage = out.as_ptr();
    let (mut next, mut most) = (0u64, 0usize);
    while next < n {
        out.clear();
        let got = sub
            .recv_many_timeout(&mut out, max, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("after {next} of {n}: {e}"));
        assert!(got >= 1 && got <= max, "{got} of at most {max}");
        assert_eq!(got, out.len());
        for m in &out {
            assert_eq!(m.value, next);
            next += 1;
        }
        most = most.max(got);
        assert_eq!(out.as_ptr(), storage, "the vector's storage was replaced");
    }
    most
}

#[test]
fn recv_many_returns_every_message_in_order_across_many_batches_in_one_vector() {
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/order").unwrap();
    let sub = a.subscribe(&topic).unwrap();
    let writer = publish_range(&b, &topic, MANY);
    // With the end marker, `MANY` itself.
    let most = read_in_order(&sub, MANY + 1, 64);
    writer.join().unwrap();
    assert!(matches!(
        sub.try_recv_many(&mut Vec::new(), 64),
        Err(RecvError::Empty)
    ));
    eprintln!("at most {most} messages per recv_many");
    assert!(most > 1, "every recv_many took one message");
}

#[test]
fn recv_many_takes_at_most_max_and_its_forms_tell_why_none_came() {
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/max").unwrap();
    let sub = a.subscribe(&topic).unwrap();
    let mut publisher = b.publisher(&topic).unwrap();
    for k in 0..10 {
        publisher.publish(&k).unwrap();
    }
    wait_until("ten queued", || sub.queued() == 10);
    let mut out = Vec::new();
    assert!(matches!(sub.recv_many(&mut out, 0), Ok(0)));
    assert!(matches!(sub.try_recv_many(&mut out, 4), Ok(4)));
    assert_eq!(sub.queued(), 6);
    // Appended after what `out` holds.
    assert!(matches!(sub.recv_many(&mut out, 100), Ok(6)));
    let values: Vec<u64> = out.iter().map(|m| m.value).collect();
    assert_eq!(values, (0..10).collect::<Vec<_>>());
    assert_eq!(sub.queued(), 0);
    let start = Instant::now();
    assert!(matches!(
        sub.recv_many_timeout(&mut out, 10, Duration::from_millis(100)),
        Err(RecvError::Timeout)
    ));
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert!(matches!(
        sub.try_recv_many(&mut out, 10),
        Err(RecvError::Empty)
    ));
    assert_eq!(out.len(), 10, "nothing added by the calls that found none");
    // Still read as before after the batch calls.
    publisher.publish(&10).unwrap();
    assert_eq!(sub.recv_timeout(Duration::from_secs(20)).unwrap().value, 10);
}

#[test]
fn recv_many_brings_a_held_topic_back_and_loses_nothing() {
    const CAPACITY: usize = 64;
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/held").unwrap();
    let sub = a
        .subscription(&topic)
        .capacity(CAPACITY)
        .subscribe()
        .unwrap();
    let (stop, published, thread) = flood(&b, &topic);
    wait_until("the unread subscription never filled", || {
        sub.bottleneck().since.is_some()
    });
    // Held at its capacity: the runtime counts what the reader has not taken (the last of it
    // may still be on its way from the delivery worker to the queue).
    wait_until("the queue never filled", || sub.queued() == CAPACITY);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(sub.queued(), CAPACITY);
    // Reading in batches makes room: the topic is released and the flood goes on.
    let before = published.load(Ordering::Acquire);
    let mut out = Vec::with_capacity(16);
    let mut next = 0u64;
    while published.load(Ordering::Acquire) < before + 1000 {
        out.clear();
        sub.recv_many_timeout(&mut out, 16, Duration::from_secs(20))
            .unwrap();
        for m in &out {
            assert_eq!(m.value, next);
            next += 1;
        }
    }
    stop.store(true, Ordering::Release);
    thread.join().unwrap();
    let published = published.load(Ordering::Acquire);
    while next < published {
        out.clear();
        sub.recv_many_timeout(&mut out, 16, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("message {next} of {published}: {e}"));
        for m in &out {
            assert_eq!(m.value, next);
            next += 1;
        }
    }
    wait_until("never released", || sub.bottleneck().since.is_none());
    assert!(sub.bottleneck().times >= 1);
    assert!(matches!(
        sub.try_recv_many(&mut out, 16),
        Err(RecvError::Empty)
    ));
}

#[test]
fn recv_many_under_disconnect_gives_the_queued_messages_then_the_error_then_the_end() {
    const CAPACITY: usize = 100;
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/disconnect").unwrap();
    let sub = a
        .subscription(&topic)
        .capacity(CAPACITY)
        .slow_consumer(SlowConsumerPolicy::Disconnect {
            max_wait: Duration::from_millis(200),
        })
        .subscribe()
        .unwrap();
    let (stop, _, thread) = flood(&b, &topic);
    wait_until("not disconnected", || {
        a.stats().unwrap().runtime.slow_consumer_disconnects >= 1
    });
    let mut out = Vec::new();
    let mut calls = 0;
    let error = loop {
        match sub.recv_many_timeout(&mut out, 30, Duration::from_secs(20)) {
            Ok(n) => {
                assert!((1..=30).contains(&n));
                calls += 1;
            }
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
    let values: Vec<u64> = out.iter().map(|m| m.value).collect();
    assert_eq!(values, (0..CAPACITY as u64).collect::<Vec<_>>());
    assert!(
        calls >= 4,
        "{calls} calls for {CAPACITY} messages, 30 at most each"
    );
    assert!(matches!(
        sub.recv_many(&mut out, 30),
        Err(RecvError::Closed)
    ));
    assert!(matches!(
        sub.try_recv_many(&mut out, 30),
        Err(RecvError::Closed)
    ));
    stop.store(true, Ordering::Release);
    thread.join().unwrap();
}

#[test]
fn a_batch_callback_sees_every_message_in_order_in_batches_of_several() {
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/callback").unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let (s, z) = (Arc::clone(&seen), Arc::clone(&sizes));
    let name = topic.name().to_owned();
    let sub = a
        .subscribe_batch_with(&topic, move |batch| {
            assert_eq!(batch.name(), name);
            let n = batch.len();
            assert!(n >= 1 && !batch.is_empty());
            let topic = batch.topic_id();
            let mut seen = s.lock().unwrap();
            for m in batch.by_ref() {
                let m = m.unwrap();
                assert_eq!(m.topic, topic);
                seen.push(m.value);
            }
            assert!(batch.is_empty());
            z.lock().unwrap().push(n);
        })
        .unwrap();
    // A share as for `subscribe_with`.
    sub.set_share(0.5).unwrap();
    assert!(sub.set_share(1.5).is_err());
    let writer = publish_range(&b, &topic, MANY);
    wait_until("the batch callback's deliveries", || {
        seen.lock().unwrap().len() as u64 > MANY
    });
    writer.join().unwrap();
    assert_eq!(*seen.lock().unwrap(), (0..=MANY).collect::<Vec<_>>());
    let sizes = sizes.lock().unwrap();
    let most = sizes.iter().copied().max().unwrap();
    eprintln!(
        "{} batches for {} messages, at most {most} in one",
        sizes.len(),
        MANY + 1
    );
    assert!(most > 1, "every batch held one message");
    assert_eq!(sizes.iter().sum::<usize>() as u64, MANY + 1);
}

#[test]
fn messages_a_batch_callback_leaves_are_dropped_and_the_next_batch_follows_them() {
    let (a, b) = pair();
    let topic: Topic<u64> = Topic::new("batches/partial").unwrap();
    // (first message, batch length) of each batch; only the first is taken.
    let batches = Arc::new(Mutex::new(Vec::new()));
    let f = Arc::clone(&batches);
    let _sub = a
        .subscribe_batch_with(&topic, move |batch| {
            let n = batch.len();
            if let Some(m) = batch.next() {
                f.lock().unwrap().push((m.unwrap().value, n));
            }
        })
        .unwrap();
    let writer = publish_range(&b, &topic, 1000);
    wait_until("every batch", || {
        batches
            .lock()
            .unwrap()
            .iter()
            .map(|&(_, n)| n)
            .sum::<usize>()
            == 1001
    });
    writer.join().unwrap();
    let batches = batches.lock().unwrap();
    assert_eq!(batches[0].0, 0);
    for w in batches.windows(2) {
        assert_eq!(w[1].0, w[0].0 + w[0].1 as u64, "{batches:?}");
    }
}
