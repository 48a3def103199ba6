//! The user's scenario of issue 25 on loopback: the one-process membership service (no data
//! directory) is stopped abruptly and started again without its state on the same address.
//! Every node joins again by itself under a new id and the new service's incarnation, carries
//! its subscriptions and publishers over, and the group goes on: the surviving subscriber
//! receives, in order and without duplicates, everything published after the rejoin, and the
//! publisher is not blocked (its unstable messages of the old incarnation are abandoned).
//! The same holds for a replicated service whose replicas all restart without their state.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tidings::{GmsReplicaServer, GmsServer, ReplicaConfig, Topic};

const TOPIC: &str = "stateless-restart/t1";
/// Bound of every wait of the test.
const WAIT: Duration = Duration::from_secs(20);

fn wait_for<T>(what: &str, done: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, WAIT, done)
}

#[test]
fn nodes_rejoin_a_service_restarted_without_its_state() {
    let service =
        GmsServer::start(common::gms_config(), SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = service.local_addr();
    let topic: Topic<u64> = Topic::new(TOPIC).unwrap();
    let publishing = common::node(&[addr]);
    let survivor = common::node(&[addr]);
    let victim = common::node(&[addr]);
    let sub = survivor.subscribe(&topic).unwrap();
    let sub_victim = victim.subscribe(&topic).unwrap();
    let mut publisher = publishing.publisher(&topic).unwrap();
    let mut next = 0u64;
    // Published until both subscribers have a message (the publisher learns of them with
    // its next view).
    let start = Instant::now();
    loop {
        publisher.publish(&next).unwrap();
        next += 1;
        if sub.recv_timeout(Duration::from_millis(50)).is_ok()
            && sub_victim.recv_timeout(Duration::from_millis(50)).is_ok()
        {
            break;
        }
        assert!(start.elapsed() < WAIT, "the subscribers got nothing");
    }

    // The service dies with its state, then a subscriber dies too.
    service.shutdown();
    drop(sub_victim);
    drop(victim);
    for _ in 0..20 {
        publisher.publish(&next).unwrap();
        next += 1;
    }
    let restarted = GmsServer::start(common::gms_config(), addr).unwrap();
    wait_for("every live node joined again", || {
        let (p, s) = (publishing.stats().ok()?, survivor.stats().ok()?);
        (p.runtime.gms_rejoins == 1 && s.runtime.gms_rejoins == 1).then_some(())
    });
    let after = publishing.stats().unwrap();
    assert!(!after.runtime.gms_removed);
    eprintln!(
        "publisher: {} messages abandoned at the rejoin",
        after.runtime.messages_abandoned
    );

    // After the rejoin: the survivor receives every message published from some point on,
    // in order and once; the publisher's window moves (each message becomes stable).
    let since = Instant::now();
    let first_new = next;
    let (first_seen, last) = loop {
        let sent = publisher.publish(&next).unwrap();
        next += 1;
        let seen = loop {
            match sub.recv_timeout(Duration::from_millis(50)) {
                Ok(m) if m.value >= first_new => break Some(m.value),
                Ok(_) => continue,
                Err(_) => break None,
            }
        };
        if let Some(v) = seen {
            break (v, sent);
        }
        assert!(
            since.elapsed() < WAIT,
            "the survivor got none of {} messages published after the restart",
            next - first_new
        );
    };
    for _ in 0..200 {
        publisher.publish(&next).unwrap();
        next += 1;
    }
    let last_sent = publisher.publish(&next).unwrap();
    next += 1;
    for k in first_seen + 1..next {
        assert_eq!(sub.recv_timeout(WAIT).unwrap().value, k);
    }
    publisher.wait_stable(last, WAIT).unwrap();
    publisher.wait_stable(last_sent, WAIT).unwrap();
    assert!(
        sub.recv_timeout(Duration::from_millis(200)).is_err(),
        "a duplicate"
    );
    wait_for("the service knows the two live nodes", || {
        restarted.snapshot().filter(|s| s.members.len() == 2)
    });
    // The subscription was made under the topic's id of the old incarnation: dropping it
    // still unsubscribes the topic, now bound to another id.
    assert_eq!(survivor.stats().unwrap().runtime.subscriptions.len(), 1);
    drop(sub);
    wait_for("the survivor unsubscribed", || {
        let s = survivor.stats().ok()?;
        s.runtime.subscriptions.is_empty().then_some(())
    });
    publishing.shutdown().unwrap();
    survivor.shutdown().unwrap();
    restarted.shutdown();
}

fn replica_config(index: usize) -> ReplicaConfig {
    let mut c = common::replica_config();
    c.index = index;
    c.seed = 11 + index as u64;
    c
}

/// Publishes until `sub` receives a message published after `from`, and returns that
/// message's value.
fn first_after(
    publisher: &mut tidings::Publisher<u64>,
    sub: &tidings::Subscription<u64>,
    next: &mut u64,
    from: u64,
) -> u64 {
    let since = Instant::now();
    loop {
        publisher.publish(next).unwrap();
        *next += 1;
        while let Ok(m) = sub.recv_timeout(Duration::from_millis(50)) {
            if m.value >= from {
                return m.value;
            }
        }
        assert!(
            since.elapsed() < WAIT,
            "the subscriber got none of {} messages published since {from}",
            *next - from
        );
    }
}

#[test]
fn nodes_rejoin_a_replicated_service_whose_replicas_all_lost_their_state() {
    let replicas = GmsReplicaServer::start_loopback(&replica_config(0), 3).unwrap();
    let servers: Vec<SocketAddr> = replicas.iter().map(GmsReplicaServer::local_addr).collect();
    let topic: Topic<u64> = Topic::new("stateless-restart/replicated").unwrap();
    let publishing = common::node(&servers);
    let subscribing = common::node(&servers);
    let sub = subscribing.subscribe(&topic).unwrap();
    let mut publisher = publishing.publisher(&topic).unwrap();
    let mut next = 0u64;
    first_after(&mut publisher, &sub, &mut next, 0);

    // Every replica dies with its state; the group restarts empty on the same addresses.
    for r in replicas {
        r.shutdown();
    }
    let restarted: Vec<GmsReplicaServer> = servers
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            GmsReplicaServer::start(replica_config(i), servers.clone(), addr).unwrap()
        })
        .collect();
    wait_for("both nodes joined the new service", || {
        let (p, s) = (publishing.stats().ok()?, subscribing.stats().ok()?);
        (p.runtime.gms_rejoins == 1 && s.runtime.gms_rejoins == 1).then_some(())
    });
    assert!(!publishing.stats().unwrap().runtime.gms_removed);
    let notices: u64 = restarted
        .iter()
        .filter_map(GmsReplicaServer::snapshot)
        .map(|s| s.removal_notices)
        .sum();
    assert!(
        notices >= 2,
        "the new leader told both nodes: {notices} notices"
    );

    // The group goes on: from its first message after the rejoin, the subscriber gets every
    // message in order, once, and they become stable.
    let first_new = next;
    let first_seen = first_after(&mut publisher, &sub, &mut next, first_new);
    let mut last = None;
    for _ in 0..200 {
        last = Some(publisher.publish(&next).unwrap());
        next += 1;
    }
    for k in first_seen + 1..next {
        assert_eq!(sub.recv_timeout(WAIT).unwrap().value, k);
    }
    publisher.wait_stable(last.unwrap(), WAIT).unwrap();
    assert!(
        sub.recv_timeout(Duration::from_millis(200)).is_err(),
        "a duplicate"
    );
    drop(sub);
    publishing.shutdown().unwrap();
    subscribing.shutdown().unwrap();
    for r in restarted {
        r.shutdown();
    }
}

/// A subscription full when its service restarts without state: the topic stays held across
/// the rejoin, under its new id, and what the old node had delivered but not handed on waits
/// for the reader instead of being dropped. The reader gets the queue's messages and then the
/// held ones, in order with no gap, and later messages once it reads again.
#[test]
fn a_held_topic_stays_held_across_a_rejoin() {
    const CAPACITY: usize = 8;
    let service =
        GmsServer::start(common::gms_config(), SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = service.local_addr();
    let topic: Topic<u64> = Topic::new("stateless-restart/held").unwrap();
    let publishing = common::node(&[addr]);
    let subscribing = common::node(&[addr]);
    let sub = subscribing
        .subscription(&topic)
        .capacity(CAPACITY)
        .subscribe()
        .unwrap();
    let mut publisher = publishing.publisher(&topic).unwrap();
    let mut next = 0u64;
    // Unread: the queue fills and the topic is held at the subscriber's node.
    wait_for("the unread subscription holds its topic", || {
        if next < 4 * CAPACITY as u64 {
            publisher.publish(&next).unwrap();
            next += 1;
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
        let stats = subscribing.stats().ok()?;
        (stats.runtime.delivery_stalls >= 1).then_some(())
    });

    service.shutdown();
    let restarted = GmsServer::start(common::gms_config(), addr).unwrap();
    wait_for("both nodes joined again", || {
        let (p, s) = (publishing.stats().ok()?, subscribing.stats().ok()?);
        (p.runtime.gms_rejoins == 1 && s.runtime.gms_rejoins == 1).then_some(())
    });
    let dropped = subscribing.stats().unwrap().runtime.deliveries_unsubscribed;

    // The queue's messages, then at least one held back at the old node, without a gap.
    for k in 0..=CAPACITY as u64 {
        assert_eq!(sub.recv_timeout(WAIT).unwrap().value, k);
    }
    // The hold ends once the reader has room, and the topic goes on: what is published now
    // arrives, in order.
    let mut last = CAPACITY as u64;
    let first_new = next;
    let since = Instant::now();
    let final_sent = loop {
        assert!(
            since.elapsed() < WAIT,
            "nothing published after the rejoin arrived"
        );
        for _ in 0..4 * CAPACITY {
            publisher.publish(&next).unwrap();
            next += 1;
        }
        while let Ok(m) = sub.recv_timeout(Duration::from_millis(50)) {
            assert!(m.value > last, "{} after {last}", m.value);
            last = m.value;
        }
        if last >= first_new {
            break next - 1;
        }
    };
    while last < final_sent {
        let m = sub.recv_timeout(WAIT).unwrap();
        assert_eq!(m.value, last + 1);
        last = m.value;
    }
    let stats = subscribing.stats().unwrap().runtime;
    assert!(stats.topic_releases >= 1, "{stats:?}");
    assert_eq!(
        stats.deliveries_unsubscribed, dropped,
        "held messages were dropped"
    );
    drop(sub);
    publishing.shutdown().unwrap();
    subscribing.shutdown().unwrap();
    restarted.shutdown();
}
