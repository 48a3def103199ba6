//! Heap allocations per message through the public library in steady state: a raw topic, a
//! publisher on one node and an iterator subscription on another (loopback, embedded membership
//! service). Everything both nodes do is counted (their core threads, delivery workers, the
//! membership service), not only the publishing and reading threads.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::alloc::System;
use std::time::{Duration, Instant};

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings::{Bytes, Error, Node, Publisher, Subscription, Topic};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Publishes `n` messages and reads them all back, without ever blocking the one thread that
/// does both (a blocked publish with an unread subscription would wait forever).
fn publish_and_read(publisher: &mut Publisher<Bytes>, sub: &Subscription<Bytes>, n: u64) {
    // A static payload: cloning it allocates nothing, so what is counted is the library's.
    let payload = Bytes::from_static(&[0x5a; 200]);
    let (mut sent, mut read) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read < n {
        assert!(Instant::now() < deadline, "sent {sent}, read {read} of {n}");
        if sent < n {
            match publisher.try_publish(&payload) {
                Ok(_) => sent += 1,
                Err(Error::WouldBlock) => {}
                Err(e) => panic!("publish: {e}"),
            }
        }
        while let Some(m) = sub.try_recv() {
            assert_eq!(m.unwrap().value.len(), 200);
            read += 1;
        }
        if sent == n && read < n {
            let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(m.value.len(), 200);
            read += 1;
        }
    }
}

#[test]
fn reading_a_raw_topic_through_an_iterator_allocates_nothing_per_message() {
    let node = Node::builder().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic = Topic::raw("alloc/raw").unwrap();
    let sub = peer.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();

    // Warm-up: queues, arenas and windows grow to their working size.
    publish_and_read(&mut publisher, &sub, 50_000);
    let n = 50_000;
    let region = Region::new(GLOBAL);
    publish_and_read(&mut publisher, &sub, n);
    let allocations = region.change().allocations;
    let per_message = allocations as f64 / n as f64;
    eprintln!("{allocations} allocations for {n} messages: {per_message:.4} per message");
    // A crossbeam list channel alone allocated one block per 31 messages (0.032); what is left
    // is the background work of two nodes (tokens, acknowledgements, membership heartbeats).
    assert!(
        per_message < 0.005,
        "{allocations} allocations for {n} messages ({per_message:.4} per message)"
    );
    drop(sub);
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}
