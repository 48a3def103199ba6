//! Heap allocations per message through the public library in steady state: a raw topic, a
//! publisher on one node and an iterator subscription on another (loopback, embedded membership
//! service). Everything both nodes do is counted (their core threads, delivery workers, the
//! membership service), not only the publishing and reading threads.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::alloc::System;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings::{Bytes, Error, Node, Publisher, Subscription, Topic};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A typed message whose decoding needs no heap (no strings or vectors in it).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Tick {
    seq: u64,
    price: f64,
    volume: u32,
}

/// Publishes `n` messages made by `make` and reads them all back (checking each with `check`),
/// without ever blocking the one thread that does both (a blocked publish with an unread
/// subscription would wait forever).
fn publish_and_read<T>(
    publisher: &mut Publisher<T>,
    sub: &Subscription<T>,
    n: u64,
    make: impl Fn(u64) -> T,
    check: impl Fn(&T),
) {
    let (mut sent, mut read) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read < n {
        assert!(Instant::now() < deadline, "sent {sent}, read {read} of {n}");
        if sent < n {
            match publisher.try_publish(&make(sent)) {
                Ok(_) => sent += 1,
                Err(Error::WouldBlock) => {}
                Err(e) => panic!("publish: {e}"),
            }
        }
        while let Some(m) = sub.try_recv() {
            check(&m.unwrap().value);
            read += 1;
        }
        if sent == n && read < n {
            check(&sub.recv_timeout(Duration::from_secs(10)).unwrap().value);
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

    // A static payload: cloning it allocates nothing, so what is counted is the library's.
    let payload = Bytes::from_static(&[0x5a; 200]);
    let make = |_| payload.clone();
    let check = |b: &Bytes| assert_eq!(b.len(), 200);
    // Warm-up: queues, arenas and windows grow to their working size.
    publish_and_read(&mut publisher, &sub, 50_000, make, check);
    let n = 50_000;
    let region = Region::new(GLOBAL);
    publish_and_read(&mut publisher, &sub, n, make, check);
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

#[test]
fn typed_messages_are_encoded_into_an_arena_not_one_allocation_each() {
    let node = Node::builder().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let topic: Topic<Tick> = Topic::new("alloc/ticks").unwrap();
    let sub = peer.subscribe(&topic).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    let make = |seq| Tick {
        seq,
        price: seq as f64 * 0.25,
        volume: 7,
    };
    let check = |t: &Tick| assert_eq!(t.volume, 7);

    publish_and_read(&mut publisher, &sub, 50_000, make, check);
    let n = 50_000;
    let region = Region::new(GLOBAL);
    publish_and_read(&mut publisher, &sub, n, make, check);
    let allocations = region.change().allocations;
    let per_message = allocations as f64 / n as f64;
    eprintln!("{allocations} allocations for {n} typed messages: {per_message:.4} per message");
    // One allocation per message before (`postcard::to_stdvec`); now one per 64 KiB block of
    // encoded messages at most.
    assert!(
        per_message < 0.005,
        "{allocations} allocations for {n} typed messages ({per_message:.4} per message)"
    );
    drop(sub);
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
}
