//! Many topics through the library: a node subscribes to hundreds or thousands of topics
//! through the membership service with callbacks, one by one or in batches
//! (`Node::subscribe_many_with`, `Node::publishers`), or with one callback and one publisher
//! for all of them (`Node::subscribe_group_with`, `Node::publisher_group`); the callbacks run on its delivery workers (the thread count
//! does not grow with the topics), and every message of every topic arrives once, in order.

// The deadline is wall time (the test's own, not the protocol's).
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{Bytes, Node, Topic};

const MESSAGES_PER_TOPIC: u64 = 4;

/// Threads of this process (Linux: one entry per thread in `/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// How the test subscribes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `subscribe_with` per topic, `publisher` per topic.
    OneByOne,
    /// `subscribe_many_with`, `publishers`.
    Batched,
    /// `subscribe_group_with` (one callback, one delivery task), `publisher_group` (one queue).
    Group,
}

#[test]
fn hundreds_of_callback_subscriptions_share_the_workers_and_get_every_message_in_order() {
    run(500, Mode::OneByOne);
}

/// 3,000 topics in batches: the service changes the views once per batch of 128, so this
/// takes about as long as a few hundred one by one.
#[test]
fn thousands_of_topics_subscribed_and_advertised_in_batches_get_every_message_in_order() {
    run(3_000, Mode::Batched);
}

/// 3,000 topics with one callback: their messages share one delivery task, routed to the
/// callback with each topic's index.
#[test]
fn thousands_of_topics_with_one_callback_get_every_message_in_order() {
    run(3_000, Mode::Group);
}

/// The tests take turns: each counts the process's threads.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(topics: u64, mode: Mode) {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let publisher_node = Node::builder().private_gms().start().unwrap();
    let subscriber_node = Node::builder()
        .gms(publisher_node.gms_addr())
        .start()
        .unwrap();
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..topics).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let names: Vec<_> = (0..topics)
        .map(|t| Topic::raw(format!("many/{t}")).unwrap())
        .collect();
    let callback_for = |t: usize| {
        let (next, errors, delivered) = (next.clone(), errors.clone(), delivered.clone());
        move |message: Result<tidings::Message<Bytes>, tidings::RecvError>| {
            let seq = message
                .ok()
                .and_then(|m| Some(u64::from_be_bytes(m.value.get(..8)?.try_into().ok()?)));
            if seq == Some(next[t].load(Ordering::Relaxed)) {
                next[t].fetch_add(1, Ordering::Relaxed);
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            delivered.fetch_add(1, Ordering::Relaxed);
        }
    };

    let threads_before = threads();
    let subscriptions = match mode {
        Mode::Batched => subscriber_node
            .subscribe_many_with(&names, callback_for)
            .unwrap(),
        Mode::OneByOne => names
            .iter()
            .enumerate()
            .map(|(t, topic)| {
                subscriber_node
                    .subscribe_with(topic, callback_for(t))
                    .unwrap()
            })
            .collect(),
        Mode::Group => {
            let callbacks: Vec<_> = (0..names.len()).map(callback_for).collect();
            subscriber_node
                .subscribe_group_with(&names, move |t, message| callbacks[t](message))
                .unwrap()
        }
    };
    assert_eq!(subscriptions.len(), names.len());
    let threads_after = threads();
    assert!(
        threads_after < threads_before + 10,
        "{topics} callback subscriptions took {} threads",
        threads_after - threads_before
    );

    let mut publishers: Vec<_> = match mode {
        Mode::Batched => publisher_node.publishers(&names).unwrap(),
        Mode::OneByOne => names
            .iter()
            .map(|topic| publisher_node.publisher(topic).unwrap())
            .collect(),
        Mode::Group => Vec::new(),
    };
    let mut group = (mode == Mode::Group).then(|| publisher_node.publisher_group(&names).unwrap());
    // The topics share their one subscriber: they share regions too, of at most 1,024 topics
    // (`PlannerConfig::subset_topics_max`), not one each.
    let regions = publisher_node
        .stats()
        .unwrap()
        .gms
        .unwrap()
        .stats
        .regions_current;
    assert_eq!(
        regions,
        topics.div_ceil(1024),
        "{topics} topics of one subscriber"
    );
    // Both lists are in the order of the topics.
    for (publisher, subscription) in publishers.iter().zip(&subscriptions) {
        assert_eq!(publisher.topic_id(), subscription.topic_id());
    }
    let mut last = Vec::new();
    let mut group_last = None;
    for seq in 0..MESSAGES_PER_TOPIC {
        last.clear();
        let payload = Bytes::copy_from_slice(&seq.to_be_bytes());
        for publisher in &mut publishers {
            last.push(publisher.publish(&payload).unwrap());
        }
        if let Some(group) = &mut group {
            for t in 0..group.len() {
                group_last = Some(group.publish(t, &payload).unwrap());
            }
        }
    }
    if let Some(group) = &mut group {
        // In the order of the topics, as the subscriptions.
        for (t, subscription) in subscriptions.iter().enumerate() {
            assert_eq!(group.topic_id(t), Some(subscription.topic_id()));
        }
        match group.publish(group.len(), &Bytes::new()) {
            Err(tidings::PublishError::NoSuchTopic { index, topics: n }) => {
                assert_eq!((index, n), (group.len(), group.len()));
            }
            other => panic!("expected NoSuchTopic, got {other:?}"),
        }
        // One handle stands for every earlier message of the group.
        group
            .wait_stable(group_last.unwrap(), Duration::from_secs(10))
            .unwrap();
    }
    let total = topics * MESSAGES_PER_TOPIC;
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(delivered.load(Ordering::Relaxed), total);
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    for n in next.iter() {
        assert_eq!(n.load(Ordering::Relaxed), MESSAGES_PER_TOPIC);
    }
    for (publisher, handle) in publishers.iter_mut().zip(&last) {
        publisher
            .wait_stable(*handle, Duration::from_secs(10))
            .unwrap();
    }
    // Dropping every subscription leaves the topics in requests of up to 128 (the core thread
    // gathers a round's unsubscriptions): a few commands for the service, not one per topic
    // (each a view change of the regions the node moves between).
    let commands = || publisher_node.stats().unwrap().gms.unwrap().stats.commands;
    let before = commands();
    drop(subscriptions);
    let (mut last, mut settled_at) = (before, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(30);
    while settled_at.elapsed() < Duration::from_millis(500) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let now = commands();
        if now != last {
            (last, settled_at) = (now, Instant::now());
        }
    }
    let applied = last - before;
    assert!(
        applied >= topics.div_ceil(128) && applied <= topics / 8,
        "{applied} commands for dropping {topics} subscriptions"
    );
    subscriber_node.shutdown().unwrap();
    publisher_node.shutdown().unwrap();
}

/// A group's topics are subscriptions each: dropping one stops its messages (even those
/// already queued) and the others go on; a callback slower than the topics holds them (every
/// message still arrives once, in order, and the publishers slow down).
#[test]
fn a_topic_of_a_group_is_unsubscribed_alone_and_a_slow_group_callback_loses_nothing() {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    const TOPICS: usize = 8;
    const SLOW_MESSAGES: u64 = 200;
    let publisher_node = Node::builder().private_gms().start().unwrap();
    // A task queue of a few batches, so that the slow callback fills it.
    let mut runtime = tidings::RuntimeConfig::default();
    runtime.sched.task_queue_capacity = 4;
    let subscriber_node = Node::builder()
        .gms(publisher_node.gms_addr())
        .runtime_config(runtime)
        .start()
        .unwrap();
    let names: Vec<_> = (0..TOPICS)
        .map(|t| Topic::raw(format!("group/{t}")).unwrap())
        .collect();
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..TOPICS).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let slow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (n, e, s) = (next.clone(), errors.clone(), slow.clone());
    let mut subscriptions = subscriber_node
        .subscribe_group_with(&names, move |t, message| {
            let seq = message
                .ok()
                .and_then(|m| Some(u64::from_be_bytes(m.value.get(..8)?.try_into().ok()?)));
            if seq == Some(n[t].load(Ordering::Relaxed)) {
                n[t].fetch_add(1, Ordering::Relaxed);
            } else {
                e.fetch_add(1, Ordering::Relaxed);
            }
            if s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_micros(200));
            }
        })
        .unwrap();
    let mut publishers = publisher_node.publishers(&names).unwrap();
    let publish_round = |publishers: &mut Vec<tidings::Publisher<Bytes>>, seq: u64| {
        publishers
            .iter_mut()
            .map(|p| {
                p.publish(&Bytes::copy_from_slice(&seq.to_be_bytes()))
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    let wait_all = |publishers: &mut Vec<tidings::Publisher<Bytes>>, handles: Vec<_>| {
        for (p, h) in publishers.iter_mut().zip(handles) {
            p.wait_stable(h, Duration::from_secs(30)).unwrap();
        }
    };
    let until = |what: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !what() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let handles = publish_round(&mut publishers, 0);
    wait_all(&mut publishers, handles);
    until(&|| next.iter().all(|n| n.load(Ordering::Relaxed) == 1));

    // Topic 3 unsubscribed alone: its next message is not delivered, the others' are.
    drop(subscriptions.remove(3));
    let handles = publish_round(&mut publishers, 1);
    wait_all(&mut publishers, handles);
    until(&|| {
        (0..TOPICS)
            .filter(|&t| t != 3)
            .all(|t| next[t].load(Ordering::Relaxed) == 2)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(next[3].load(Ordering::Relaxed), 1, "an unsubscribed topic");
    for t in (0..TOPICS).filter(|&t| t != 3) {
        assert_eq!(next[t].load(Ordering::Relaxed), 2, "topic {t}");
    }

    // A slow callback: the group's task fills, its topics are held, nothing is lost.
    slow.store(true, Ordering::Relaxed);
    let mut last = Vec::new();
    for seq in 2..2 + SLOW_MESSAGES {
        last = publish_round(&mut publishers, seq);
    }
    wait_all(&mut publishers, last);
    until(&|| {
        (0..TOPICS)
            .filter(|&t| t != 3)
            .all(|t| next[t].load(Ordering::Relaxed) == 2 + SLOW_MESSAGES)
    });
    for t in (0..TOPICS).filter(|&t| t != 3) {
        assert_eq!(
            next[t].load(Ordering::Relaxed),
            2 + SLOW_MESSAGES,
            "topic {t}"
        );
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    let stats = subscriber_node.stats().unwrap().runtime;
    assert!(
        stats.delivery_stalls > 0,
        "a callback this slow fills its task's queue and holds its topics"
    );
    drop(subscriptions);
    subscriber_node.shutdown().unwrap();
    publisher_node.shutdown().unwrap();
}

#[test]
fn a_group_naming_a_topic_twice_is_refused_with_its_name() {
    let node = Node::builder().private_gms().start().unwrap();
    let names: Vec<_> = ["twice/a", "twice/b", "twice/a"]
        .iter()
        .map(|n| Topic::raw(*n).unwrap())
        .collect();
    match node.subscribe_group_with(&names, |_, _| {}) {
        Err(tidings::RequestError::Refused(why)) => assert!(why.contains("twice/a"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|v| v.len())),
    }
    // Nothing was kept: the names can be taken once each afterwards.
    let subscriptions = node.subscribe_group_with(&names[..2], |_, _| {}).unwrap();
    assert_eq!(subscriptions.len(), 2);
}

/// A group callback slower than its 64 topics, published round-robin through one publisher
/// group: the group's task fills and the group is held as one (one hold for all its topics,
/// none of them held on its own), and every message still arrives once, in order per topic.
/// While it is held, one topic is unsubscribed (nothing of it arrives afterwards, the others
/// go on) and another is taken by a second subscription too (the group's hold ends by topic;
/// the group still gets everything, the new subscription a gapless tail).
#[test]
fn a_slow_group_is_held_as_one_and_loses_nothing() {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    const TOPICS: usize = 64;
    const ROUNDS: u64 = 60;
    const DROPPED: usize = 5;
    const SHARED: usize = 9;
    let publisher_node = Node::builder().private_gms().start().unwrap();
    let mut runtime = tidings::RuntimeConfig::default();
    runtime.sched.task_queue_capacity = 8;
    let subscriber_node = Node::builder()
        .gms(publisher_node.gms_addr())
        .runtime_config(runtime)
        .start()
        .unwrap();
    let names: Vec<_> = (0..TOPICS)
        .map(|t| Topic::raw(format!("held-group/{t}")).unwrap())
        .collect();
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..TOPICS).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let (n, e, d) = (next.clone(), errors.clone(), delivered.clone());
    let mut subscriptions = subscriber_node
        .subscribe_group_with(&names, move |t, message| {
            let seq = message
                .ok()
                .and_then(|m| Some(u64::from_be_bytes(m.value.get(..8)?.try_into().ok()?)));
            if seq == Some(n[t].load(Ordering::Relaxed)) {
                n[t].fetch_add(1, Ordering::Relaxed);
            } else {
                e.fetch_add(1, Ordering::Relaxed);
            }
            d.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(50));
        })
        .unwrap();
    let mut group = publisher_node.publisher_group(&names).unwrap();
    let held_groups = || subscriber_node.stats().unwrap().runtime.held_groups.len();
    let mut dropped_at = None;
    let mut shared = None;
    let shared_seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut last = None;
    for seq in 0..ROUNDS {
        let payload = Bytes::copy_from_slice(&seq.to_be_bytes());
        for t in 0..TOPICS {
            last = Some(group.publish(t, &payload).unwrap());
        }
        if seq == ROUNDS / 3 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while held_groups() == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            // Held now: one topic dropped while held (its publisher goes on). A batch the
            // worker routed before the drop may still run its messages: counted after it.
            drop(subscriptions.remove(DROPPED));
            std::thread::sleep(Duration::from_millis(100));
            dropped_at = Some(next[DROPPED].load(Ordering::Relaxed));
        }
        if seq == 2 * ROUNDS / 3 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while held_groups() == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let seen = shared_seen.clone();
            let sub = subscriber_node
                .subscribe_with(&names[SHARED], move |message| {
                    let seq = message
                        .ok()
                        .and_then(|m| Some(u64::from_be_bytes(m.value.get(..8)?.try_into().ok()?)));
                    seen.lock().unwrap().push(seq);
                })
                .unwrap();
            shared = Some(sub);
        }
    }
    group
        .wait_stable(last.unwrap(), Duration::from_secs(30))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (0..TOPICS)
        .filter(|&t| t != DROPPED)
        .any(|t| next[t].load(Ordering::Relaxed) < ROUNDS)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "out of order or duplicated"
    );
    for t in (0..TOPICS).filter(|&t| t != DROPPED) {
        assert_eq!(next[t].load(Ordering::Relaxed), ROUNDS, "topic {t}");
    }
    let dropped_at = dropped_at.unwrap();
    assert_eq!(
        next[DROPPED].load(Ordering::Relaxed),
        dropped_at,
        "a topic unsubscribed while held got more"
    );
    // The second subscription of a topic of the group: a gapless tail, to the last message.
    let seen: Vec<Option<u64>> = shared_seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    let first = seen[0].unwrap();
    assert_eq!(
        seen,
        (first..ROUNDS).map(Some).collect::<Vec<_>>(),
        "the second subscription"
    );
    let stats = subscriber_node.stats().unwrap().runtime;
    assert!(stats.group_holds > 0, "the group was never held");
    assert!(stats.held_groups.is_empty(), "still held at the end");
    assert!(stats.held_topics.is_empty(), "topics still held at the end");
    drop(shared);
    drop(subscriptions);
    subscriber_node.shutdown().unwrap();
    publisher_node.shutdown().unwrap();
}
