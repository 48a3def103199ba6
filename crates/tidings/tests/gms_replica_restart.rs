//! A replica of the replicated membership service keeps its state on disk
//! (`ReplicaHostConfig::data_dir`, `tidings gms --data-dir`, ADR 32): stopped abruptly and
//! started again from its data directory on the same address, it comes back under the same
//! Raft id with at least its term, follows the leader, applies what it missed, and the group
//! goes on installing views. Prints the state file's size and write times (`cargo test -p
//! tidings --test gms_replica_restart -- --nocapture`).

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tidings::{GmsReplicaServer, Node, ReplicaHostConfig, ReplicaSnapshot, Topic};
use tidings_runtime::{replica_data_dir, STATE_FILE};

const TOPIC: &str = "replica-disk/t1";
/// Bound of every wait of the test.
const WAIT: Duration = Duration::from_secs(20);

/// A directory of its own, removed when dropped (the test passing or not).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "tidings-replica-restart-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait_for<T>(what: &str, done: impl FnMut() -> Option<T>) -> T {
    common::wait_for(what, WAIT, done)
}

/// The serving replica's snapshot, with its index in `replicas`.
fn leader(replicas: &[Option<GmsReplicaServer>]) -> Option<(usize, ReplicaSnapshot)> {
    replicas
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.as_ref()?.snapshot()?)))
        .find(|(_, s)| s.serving)
}

fn view_changes(node: &Node) -> u64 {
    node.stats().unwrap().runtime.proto.view_changes
}

#[test]
fn a_replica_restarted_from_its_data_dir_rejoins_and_the_group_goes_on() {
    let dir = TempDir::new();
    let config = common::replica_config();
    let started = GmsReplicaServer::start_loopback_in(&config, 3, Some(&dir.0)).unwrap();
    let peers: Vec<SocketAddr> = started.iter().map(GmsReplicaServer::local_addr).collect();
    let mut replicas: Vec<Option<GmsReplicaServer>> = started.into_iter().map(Some).collect();
    let topic: Topic<u64> = Topic::new(TOPIC).unwrap();

    let a = common::node(&peers);
    let _sub_a = a.subscribe(&topic).unwrap();
    let b = common::node(&peers);
    let _sub_b = b.subscribe(&topic).unwrap();
    let (first_leader, _) = wait_for("a leader with both members", || {
        leader(&replicas).filter(|(_, s)| s.members.len() == 2)
    });

    // A follower stops abruptly: no goodbye, its socket closed.
    let f = (first_leader + 1) % 3;
    let before = replicas[f].as_ref().unwrap().snapshot().unwrap();
    assert!(before.state_writes > 0, "{before:?}");
    replicas[f].take().unwrap().shutdown();
    let file = replica_data_dir(&dir.0, f).join(STATE_FILE);
    assert!(file.exists());

    // The group changes while it is down: a third member joins and subscribes.
    let views_a = view_changes(&a);
    let c = common::node(&peers);
    let c_id = c.id();
    let _sub_c = c.subscribe(&topic).unwrap();
    wait_for("a installs the view with c", || {
        (view_changes(&a) > views_a).then_some(())
    });

    // Started again from its data directory, on its address.
    let restart = Instant::now();
    let host = {
        let mut cfg = ReplicaHostConfig::default();
        cfg.replica = {
            let mut c = config.clone();
            c.index = f;
            c.seed = config.seed.wrapping_add(f as u64);
            c
        };
        cfg.data_dir = Some(replica_data_dir(&dir.0, f));
        cfg
    };
    let r = GmsReplicaServer::start_host(host, peers.clone(), peers[f]).unwrap();
    let restored = r.restored_term().expect("restarted from its state");
    assert!(restored >= before.term, "{restored} < {}", before.term);
    replicas[f] = Some(r);
    let (caught_up, leader_now) = wait_for("the restarted replica follows and catches up", || {
        let (l, ls) = leader(&replicas)?;
        let s = replicas[f].as_ref()?.snapshot()?;
        (l != f
            && !s.serving
            && s.leader == Some(l)
            && s.term >= before.term
            && s.term == ls.term
            && s.members.contains_key(&c_id)
            && s.stats.views_issued == ls.stats.views_issued)
            .then_some((restart.elapsed(), l))
    });

    // The group goes on: c leaves, the others install the view without it, and the
    // restarted replica applies the removal.
    let views_a = view_changes(&a);
    c.shutdown().unwrap();
    wait_for("a installs the view without c", || {
        (view_changes(&a) > views_a).then_some(())
    });
    let s = wait_for("the restarted replica applies c's removal", || {
        let s = replicas[f].as_ref()?.snapshot()?;
        s.removed.iter().any(|(n, _, _)| *n == c_id).then_some(s)
    });
    assert!(s.state_writes > 0 && s.state_bytes > 0, "{s:?}");
    let writes: Vec<(u64, u64, Duration, Duration)> = replicas
        .iter()
        .flatten()
        .filter_map(GmsReplicaServer::snapshot)
        .map(|s| {
            (
                s.state_writes,
                s.state_bytes,
                s.state_write_time / u32::try_from(s.state_writes.max(1)).unwrap_or(u32::MAX),
                s.state_write_time_max,
            )
        })
        .collect();
    println!(
        "replica {f} restarted from its data dir at term {restored} (was {}); following leader \
         {leader_now} with c's join applied after {caught_up:?}; state files (writes, bytes, \
         mean write, longest write): {writes:?}",
        before.term
    );
    for r in replicas.into_iter().flatten() {
        r.shutdown();
    }
    b.shutdown().unwrap();
    a.shutdown().unwrap();
}

/// The one-process service with a data directory (`tidings gms --data-dir D`: one replica)
/// stops and starts again from its state on its address: it knows its members and topics, the
/// running nodes keep their ids, and the group goes on (new requests answered, messages
/// delivered and stable, a new member served).
#[test]
fn the_one_process_service_restarted_from_its_data_dir_keeps_its_group() {
    let dir = TempDir::new();
    let config = common::replica_config();
    let started = GmsReplicaServer::start_loopback_in(&config, 1, Some(&dir.0)).unwrap();
    let peers: Vec<SocketAddr> = started.iter().map(GmsReplicaServer::local_addr).collect();
    let mut service = started.into_iter().next();
    let first: Topic<u64> = Topic::new(TOPIC).unwrap();

    let a = common::node(&peers);
    let b = common::node(&peers);
    let sub_b = b.subscribe(&first).unwrap();
    let mut publisher = a.publisher(&first).unwrap();
    for k in 0..100 {
        publisher.publish(&k).unwrap();
    }
    for k in 0..100 {
        assert_eq!(sub_b.recv_timeout(WAIT).unwrap().value, k);
    }
    let before = wait_for("the service serves both members", || {
        service
            .as_ref()?
            .snapshot()
            .filter(|s| s.serving && s.members.len() == 2)
    });

    // The service stops abruptly and starts again from its directory, on its address.
    service.take().unwrap().shutdown();
    let host = {
        let mut cfg = ReplicaHostConfig::default();
        cfg.replica = {
            let mut c = config.clone();
            c.index = 0;
            c.replicas = 1;
            c
        };
        cfg.data_dir = Some(replica_data_dir(&dir.0, 0));
        cfg
    };
    let restarted = GmsReplicaServer::start_host(host, peers.clone(), peers[0]).unwrap();
    assert!(
        restarted.restored_term().is_some(),
        "restarted from its state"
    );
    let after = wait_for("the restarted service serves with both members", || {
        restarted
            .snapshot()
            .filter(|s| s.serving && s.members.len() == 2)
    });
    assert_eq!(
        after.members.keys().collect::<Vec<_>>(),
        before.members.keys().collect::<Vec<_>>()
    );
    assert!(after.topics.contains_key(TOPIC), "{:?}", after.topics);

    // The group goes on: a new topic is answered and carries messages, the first one still
    // does, and a new member's view reaches the others.
    let second: Topic<u64> = Topic::new("replica-disk/t2").unwrap();
    let sub_b2 = b.subscribe(&second).unwrap();
    let mut publisher2 = a.publisher(&second).unwrap();
    publisher2.publish(&7).unwrap();
    assert_eq!(sub_b2.recv_timeout(WAIT).unwrap().value, 7);
    let last = publisher.publish(&100).unwrap();
    assert_eq!(sub_b.recv_timeout(WAIT).unwrap().value, 100);
    publisher.wait_stable(last, WAIT).unwrap();
    let c = common::node(&peers);
    let sub_c = c.subscribe(&first).unwrap();
    // The subscription is in force at c when `subscribe` returns; the publisher learns of c
    // with its next view, so it publishes until c's first message arrives, and c then gets
    // every later one in order.
    let since = Instant::now();
    let mut next = 101u64;
    let (first_at_c, last) = loop {
        let sent = publisher.publish(&next).unwrap();
        next += 1;
        if let Ok(m) = sub_c.recv_timeout(Duration::from_millis(100)) {
            break (m.value, sent);
        }
        assert!(
            since.elapsed() < WAIT,
            "c got none of {} messages",
            next - 101
        );
    };
    for k in first_at_c + 1..next {
        assert_eq!(sub_c.recv_timeout(WAIT).unwrap().value, k);
    }
    for k in 101..next {
        assert_eq!(sub_b.recv_timeout(WAIT).unwrap().value, k);
    }
    publisher.wait_stable(last, WAIT).unwrap();
    assert_eq!(restarted.snapshot().unwrap().members.len(), 3);
    drop(sub_c);
    c.shutdown().unwrap();
    drop((sub_b, sub_b2));
    b.shutdown().unwrap();
    a.shutdown().unwrap();
    restarted.shutdown();
}
