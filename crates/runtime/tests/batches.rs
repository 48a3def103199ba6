//! Batch delivery over real UDP sockets on loopback: a batch subscription beside a per-message
//! one on the same topic gets every message once, in order, in runs of more than one; the
//! per-message subscription sees the same messages one by one, and the metrics count messages.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Cluster;
use tidings_proto::TopicId;

#[test]
fn a_batch_subscription_gets_every_message_in_order_in_runs() {
    // One topic: runs are of consecutive messages of one topic (round-robin topics give runs
    // of one).
    let topics = 1;
    let cluster = Cluster::start(1, |_| vec![TopicId(0)], false, 0.0, 11);
    // (per-topic index of each message, length of each batch)
    let seen: Arc<Mutex<(Vec<u64>, Vec<usize>)>> = Arc::default();
    let log = Arc::clone(&seen);
    let batch_sub = cluster.nodes[1]
        .subscribe_batch(TopicId(0), 0.5, move |batch| {
            assert!(!batch.is_empty(), "an empty batch");
            assert!(batch.iter().all(|d| d.topic == batch.topic()));
            let mut log = log.lock().unwrap();
            log.1.push(batch.len());
            for d in batch.drain() {
                log.0
                    .push(u64::from_be_bytes(d.payload[4..12].try_into().unwrap()));
            }
            assert!(batch.is_empty(), "drain leaves the batch empty");
        })
        .unwrap();
    let total = 40_000;
    let counts = cluster.publish(total, topics, 16, Duration::from_secs(60));
    cluster.check(&counts, Duration::from_secs(20));
    let want = counts[&TopicId(0)];
    let deadline = tidings_runtime::now() + Duration::from_secs(20);
    while (seen.lock().unwrap().0.len() as u64) < want && tidings_runtime::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (indices, lengths) = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(indices, (0..want).collect::<Vec<_>>(), "not once, in order");
    assert!(
        lengths.iter().any(|&n| n > 1),
        "every batch held one message"
    );
    assert!(lengths.iter().all(|&n| n <= 256), "a batch above the bound");
    // Metrics count messages, not batches.
    let stats = cluster.nodes[1].stats().unwrap();
    let of_batch_sub = stats
        .subscriptions
        .iter()
        .filter(|s| s.topic == TopicId(0))
        .map(|s| s.delivered)
        .collect::<Vec<_>>();
    assert_eq!(of_batch_sub, vec![want, want], "{:?}", stats.subscriptions);
    assert!(batch_sub.stats().events_run < want, "one event per message");
    drop(batch_sub);
    cluster.shutdown();
}
