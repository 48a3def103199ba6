//! Heap allocations per message through the public library in steady state: a raw topic, a
//! publisher on one node and an iterator subscription on another (loopback, embedded membership
//! service). Everything both nodes do is counted (their core threads, delivery workers, the
//! membership service), not only the publishing and reading threads.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::alloc::System;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tidings::{Bytes, Message, Node, PublishError, Publisher, Subscription, Topic};

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
/// subscription would wait forever). With `batch`, reads with `try_recv_many` into that
/// vector (cleared after each call, so its storage is reused), else with `try_recv`.
fn publish_and_read<T>(
    publisher: &mut Publisher<T>,
    sub: &Subscription<T>,
    n: u64,
    make: impl Fn(u64) -> T,
    check: impl Fn(&T),
    mut batch: Option<&mut Vec<Message<T>>>,
) {
    let (mut sent, mut read) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read < n {
        assert!(Instant::now() < deadline, "sent {sent}, read {read} of {n}");
        if sent < n {
            match publisher.try_publish(&make(sent)) {
                Ok(_) => sent += 1,
                Err(PublishError::WouldBlock) => {}
                Err(e) => panic!("publish: {e}"),
            }
        }
        match batch.as_deref_mut() {
            Some(out) => {
                while let Ok(got) = sub.try_recv_many(out, BATCH_MAX) {
                    for m in out.iter() {
                        check(&m.value);
                    }
                    out.clear();
                    read += got as u64;
                }
            }
            None => {
                while let Ok(m) = sub.try_recv() {
                    check(&m.value);
                    read += 1;
                }
            }
        }
        if sent == n && read < n {
            check(&sub.recv_timeout(Duration::from_secs(10)).unwrap().value);
            read += 1;
        }
    }
}

/// Most messages one `try_recv_many` takes.
const BATCH_MAX: usize = 64;

/// Messages measured after the warm-up.
const MEASURED: u64 = 50_000;

/// Held by each measurement.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Two nodes, a publisher on one and an iterator subscription on the other: allocations per
/// message over `MEASURED` messages, after as many to warm up (queues, arenas and windows grow
/// to their working size).
fn allocations_per_message<T: Send + 'static>(
    topic: &Topic<T>,
    make: impl Fn(u64) -> T + Copy,
    check: impl Fn(&T) + Copy,
    read_in_batches: bool,
) -> f64 {
    // The counter is the whole process's: one measurement at a time (tests run in parallel).
    let _alone = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let node = Node::builder().private_gms().start().unwrap();
    let peer = Node::builder().gms(node.gms_addr()).start().unwrap();
    let sub = peer.subscribe(topic).unwrap();
    let mut publisher = node.publisher(topic).unwrap();
    let mut out = Vec::with_capacity(BATCH_MAX);
    let mut batch = read_in_batches.then_some(&mut out);
    publish_and_read(
        &mut publisher,
        &sub,
        MEASURED,
        make,
        check,
        batch.as_deref_mut(),
    );
    let region = Region::new(GLOBAL);
    publish_and_read(&mut publisher, &sub, MEASURED, make, check, batch);
    let allocations = region.change().allocations;
    drop(sub);
    peer.shutdown().unwrap();
    node.shutdown().unwrap();
    let per_message = allocations as f64 / MEASURED as f64;
    eprintln!(
        "{}: {allocations} allocations for {MEASURED} messages, {per_message:.4} per message",
        topic.name()
    );
    per_message
}

#[test]
fn reading_a_raw_topic_through_an_iterator_allocates_nothing_per_message() {
    // A static payload: cloning it allocates nothing, so what is counted is the library's.
    let payload = Bytes::from_static(&[0x5a; 200]);
    let per_message = allocations_per_message(
        &Topic::raw("alloc/raw").unwrap(),
        |_| payload.clone(),
        |b: &Bytes| assert_eq!(b.len(), 200),
        false,
    );
    // A crossbeam list channel alone allocated one block per 31 messages (0.032); what is left
    // is the background work of two nodes (tokens, acknowledgements, membership heartbeats).
    assert!(per_message < 0.005, "{per_message:.4} per message");
}

#[test]
fn typed_messages_are_encoded_into_an_arena_not_one_allocation_each() {
    let per_message = allocations_per_message(
        &Topic::<Tick>::new("alloc/ticks").unwrap(),
        |seq| Tick {
            seq,
            price: seq as f64 * 0.25,
            volume: 7,
        },
        |t: &Tick| assert_eq!(t.volume, 7),
        false,
    );
    // One allocation per message before (`postcard::to_stdvec`); now one per 64 KiB block of
    // encoded messages at most.
    assert!(per_message < 0.005, "{per_message:.4} per message");
}

#[test]
fn reading_in_batches_with_recv_many_into_one_vector_allocates_nothing_per_message() {
    let payload = Bytes::from_static(&[0x5a; 32]);
    let per_message = allocations_per_message(
        &Topic::raw("alloc/recv-many").unwrap(),
        |_| payload.clone(),
        |b: &Bytes| assert_eq!(b.len(), 32),
        true,
    );
    assert!(per_message < 0.005, "{per_message:.4} per message");
}
