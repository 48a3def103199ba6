//! A replica of the membership service on a real socket ([`GmsReplicaServer`]): it elects a
//! leader with its peers, counts and drops what does not come from them, and a follower
//! catches up from a snapshot larger than a datagram.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use tidings_gms::{frame, unframe, ClientConfig, GmsClient, ReplicaConfig};
use tidings_runtime::{GmsReplicaServer, GmsServerError, GMS_MAGIC, REPLICA_MAGIC};

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn replicas_elect_a_leader_and_drop_datagrams_from_strangers() {
    let replicas = GmsReplicaServer::start_loopback(&ReplicaConfig::default(), 3).unwrap();
    wait_for("a leader serves", || {
        replicas
            .iter()
            .filter_map(GmsReplicaServer::snapshot)
            .filter(|s| s.serving)
            .count()
            == 1
    });
    let follower = replicas
        .iter()
        .find(|r| r.snapshot().is_some_and(|s| !s.serving))
        .unwrap();
    let before = follower.snapshot().unwrap();

    // A stranger claims to be a replica, sends garbage, and sends a heartbeat without joining.
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut forged = REPLICA_MAGIC.to_vec();
    forged.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    stranger.send_to(&forged, follower.local_addr()).unwrap();
    stranger
        .send_to(b"not tidings", follower.local_addr())
        .unwrap();
    let mut heartbeat = GMS_MAGIC.to_vec();
    tidings_gms::GmsMessage::Heartbeat.encode(&mut heartbeat);
    stranger.send_to(&heartbeat, follower.local_addr()).unwrap();
    wait_for("the stranger's datagrams are counted", || {
        follower.snapshot().is_some_and(|s| {
            s.foreign_replica_datagrams > before.foreign_replica_datagrams
                && s.invalid_datagrams > before.invalid_datagrams
                && s.unknown_sources > before.unknown_sources
        })
    });
    let after = follower.snapshot().unwrap();
    // Nothing reached raft-rs: the term and the replica's own counters did not move for it.
    assert_eq!(after.replica.malformed, before.replica.malformed);
    assert_eq!(after.replica.impostors, before.replica.impostors);
    for r in replicas {
        r.shutdown();
    }
}

#[test]
fn replica_address_lists_are_checked() {
    let socket = || UdpSocket::bind("127.0.0.1:0").unwrap();
    let a = |port| SocketAddr::from(([127, 0, 0, 1], port));
    for peers in [
        vec![],
        vec![a(1), a(1)],
        vec![a(0)],
        (1..=8).map(a).collect(),
    ] {
        let err =
            GmsReplicaServer::start_on(ReplicaConfig::default(), peers, socket()).unwrap_err();
        assert!(matches!(err, GmsServerError::Peers(_)), "{err}");
    }
    let config = {
        let mut c = ReplicaConfig::default();
        c.index = 2;
        c
    };
    let err = GmsReplicaServer::start_on(config, vec![a(1), a(2)], socket()).unwrap_err();
    assert!(matches!(err, GmsServerError::Replica(_)), "{err}");
}

/// A directory of its own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("tidings-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A replica's data directory holds its state from the start; a host refuses, with the path
/// and the reason, a state of another replica index or count and a corrupt one.
#[test]
fn a_data_dir_of_another_replica_or_a_corrupt_state_is_refused() {
    use tidings_runtime::{ReplicaHostConfig, STATE_FILE};
    let dir = TempDir::new("replica-refused");
    let sockets = || {
        let s: Vec<UdpSocket> = (0..3)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let peers: Vec<SocketAddr> = s.iter().map(|s| s.local_addr().unwrap()).collect();
        (s, peers)
    };
    let host = |index| {
        let mut cfg = ReplicaHostConfig::default();
        cfg.replica.index = index;
        cfg.data_dir = Some(dir.0.join("r"));
        cfg
    };
    let (mut s, peers) = sockets();
    let r = GmsReplicaServer::start_host_on(host(0), peers, s.remove(0)).unwrap();
    assert_eq!(r.restored_term(), None);
    let written = r.snapshot().unwrap();
    assert_eq!(written.state_writes, 1);
    r.shutdown();
    let file = dir.0.join("r").join(STATE_FILE);
    assert!(file.exists());

    // The same replica starts again from it.
    let (mut s, peers) = sockets();
    let r = GmsReplicaServer::start_host_on(host(0), peers, s.remove(0)).unwrap();
    assert_eq!(r.restored_term(), Some(0));
    r.shutdown();

    let refused = |index: usize, n: usize| {
        let (mut s, mut peers) = sockets();
        peers.truncate(n);
        let err = GmsReplicaServer::start_host_on(host(index), peers, s.remove(0)).unwrap_err();
        assert!(matches!(err, GmsServerError::State { .. }), "{err}");
        err.to_string()
    };
    let other = refused(1, 3);
    assert!(other.contains("replica 0 of 3"), "{other}");
    assert!(other.contains(STATE_FILE), "{other}");
    let fewer = refused(0, 2);
    assert!(fewer.contains("replica 0 of 2"), "{fewer}");

    let mut bytes = std::fs::read(&file).unwrap();
    bytes[7] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let corrupt = refused(0, 3);
    assert!(corrupt.contains("checksum"), "{corrupt}");
    bytes.truncate(3);
    std::fs::write(&file, &bytes).unwrap();
    let short = refused(0, 3);
    assert!(short.contains("truncated"), "{short}");
}

/// A replica whose state cannot be written stops rather than send what it has not kept: its
/// data directory removed under it, the one-replica service's election (a new term to keep)
/// stops it, and `failure` says why.
#[test]
fn a_replica_that_cannot_write_its_state_stops() {
    use tidings_runtime::ReplicaHostConfig;
    let dir = TempDir::new("replica-unwritable");
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let peers = vec![socket.local_addr().unwrap()];
    let host = {
        let mut c = ReplicaHostConfig::default();
        c.replica = ReplicaConfig::default();
        c.data_dir = Some(dir.0.join("r"));
        c
    };
    let r = GmsReplicaServer::start_host_on(host, peers, socket).unwrap();
    std::fs::remove_dir_all(dir.0.join("r")).unwrap();
    wait_for("the replica stops", || r.failure().is_some());
    let failure = r.failure().unwrap();
    assert!(failure.contains("cannot write its state"), "{failure}");
    wait_for("its thread is gone", || r.snapshot().is_none());
}

/// Members driven by the test over their own sockets: each a [`GmsClient`] on a loopback
/// socket (the replica hosts know members by their source address).
struct Members {
    clients: Vec<(GmsClient, UdpSocket)>,
    replicas: Vec<SocketAddr>,
}

impl Members {
    fn new(count: usize, replicas: Vec<SocketAddr>) -> Members {
        let clients = (0..count)
            .map(|i| {
                let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
                socket.set_nonblocking(true).unwrap();
                let client = GmsClient::new(ClientConfig {
                    replicas: replicas.len(),
                    seed: 1000 + i as u64,
                    ..ClientConfig::default()
                })
                .unwrap();
                (client, socket)
            })
            .collect();
        Members { clients, replicas }
    }

    /// Runs every client's inputs and outputs once.
    fn pump(&mut self) {
        let mut buf = vec![0u8; 65_536];
        let now = tidings_runtime::now();
        for (client, socket) in &mut self.clients {
            while let Ok((len, from)) = socket.recv_from(&mut buf) {
                let (Some(replica), Some(body)) = (
                    self.replicas.iter().position(|&r| r == from),
                    unframe(&buf[..len]),
                ) else {
                    continue;
                };
                client.handle_datagram(now, replica, body);
            }
            if client.poll_timeout().is_some_and(|t| t <= now) {
                client.handle_timeout(now);
            }
            while let Some((replica, msg)) = client.poll_transmit() {
                let _ = socket.send_to(&frame(&msg), self.replicas[replica]);
            }
            while client.poll_event().is_some() {}
        }
    }

    /// Pumps until `done`, at most 30 s.
    fn until(&mut self, what: &str, mut done: impl FnMut(&mut Members) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            self.pump();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How a late follower caught up.
struct CatchUp {
    /// Bytes of the snapshot it restored.
    snapshot_bytes: u64,
    /// Fragments it received (the snapshot's, and any other long message's).
    fragments: u64,
    /// Messages in progress it dropped when their fragments stopped coming.
    expired: u64,
    /// Snapshots the leader sent again.
    retried: u64,
    /// From its start to holding every member and topic.
    took: Duration,
}

/// A follower started after the others compacted their log, with a service state larger than
/// one datagram, catches up from the leader's snapshot in fragments.
fn catch_up_from_a_large_snapshot(members: usize, topics_each: usize) -> CatchUp {
    let config = {
        let mut c = ReplicaConfig::default();
        c.snapshot_entries = 20;
        c
    };
    let sockets: Vec<UdpSocket> = (0..3)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let mut sockets = sockets.into_iter();
    let mut replicas: Vec<GmsReplicaServer> = (0..2)
        .map(|index| {
            let config = {
                let mut c = config.clone();
                c.index = index;
                c.seed = index as u64;
                c
            };
            GmsReplicaServer::start_on(config, peers.clone(), sockets.next().unwrap()).unwrap()
        })
        .collect();
    // The third replica's socket is bound (what the others send it waits there) but read by
    // nobody until it starts.
    let late = sockets.next().unwrap();
    let mut m = Members::new(members, peers.clone());
    m.until("every member joins", |m| {
        m.clients.iter().all(|(c, _)| c.node().is_some())
    });
    for (i, (client, _)) in m.clients.iter_mut().enumerate() {
        let names: Vec<String> = (0..topics_each)
            .map(|t| format!("member-{i:03}-subscribes-to-a-topic-with-a-long-name-{t:03}"))
            .collect();
        for chunk in names.chunks(tidings_gms::NAMES_PER_REQUEST_MAX) {
            client.subscribe_many(chunk).unwrap();
        }
    }
    let leader_state = |replicas: &[GmsReplicaServer]| {
        replicas
            .iter()
            .filter_map(GmsReplicaServer::snapshot)
            .find(|s| s.serving)
    };
    m.until(
        "every subscription is in force and the log compacted",
        |m| {
            m.clients
                .iter()
                .all(|(c, _)| c.requests_unacknowledged() == 0)
                && leader_state(&replicas).is_some_and(|s| {
                    s.topics.len() == members * topics_each && s.replica.snapshots_taken >= 2
                })
        },
    );
    let leader = leader_state(&replicas).unwrap();
    let started = Instant::now();
    replicas.push(
        GmsReplicaServer::start_on(
            {
                let mut c = config;
                c.index = 2;
                c.seed = 2;
                c
            },
            peers,
            late,
        )
        .unwrap(),
    );
    let mut took = None;
    m.until("the late follower holds every member and topic", |_| {
        let s = replicas[2].snapshot().unwrap();
        let done = s.members.len() == members && s.topics.len() == members * topics_each;
        if done {
            took = Some(started.elapsed());
        }
        done
    });
    let s = replicas[2].snapshot().unwrap();
    assert!(s.replica.snapshots_restored >= 1, "{:?}", s.replica);
    let leader = replicas
        .iter()
        .filter_map(GmsReplicaServer::snapshot)
        .find(|l| l.index == leader.index)
        .unwrap();
    assert_eq!(s.oversized + leader.oversized, 0);
    for r in replicas {
        r.shutdown();
    }
    CatchUp {
        snapshot_bytes: s.replica.snapshot_bytes,
        fragments: s.replica.fragments.fragments_received,
        expired: s.replica.fragments.expired,
        retried: leader.replica.snapshots_retried,
        took: took.unwrap(),
    }
}

#[test]
fn a_late_follower_catches_up_from_a_snapshot_in_fragments() {
    let c = catch_up_from_a_large_snapshot(30, 50);
    println!(
        "snapshot of {} bytes, {} fragments received, caught up in {:?}",
        c.snapshot_bytes, c.fragments, c.took
    );
    assert!(
        c.snapshot_bytes > 65_507,
        "a snapshot of {} bytes",
        c.snapshot_bytes
    );
    assert!(c.fragments >= 2, "{} fragments", c.fragments);
}

/// Catch-up time against the snapshot's size (`cargo test -p tidings-runtime --test
/// gms_replica -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement: prints catch-up times"]
fn catch_up_time_against_snapshot_size() {
    for (members, topics) in [
        (10, 20),
        (30, 50),
        (100, 50),
        (300, 20),
        (300, 60),
        (300, 120),
    ] {
        let c = catch_up_from_a_large_snapshot(members, topics);
        println!(
            "{members} members x {topics} topics: snapshot {} KB, {} fragments received \
             ({} messages expired, {} snapshots sent again), caught up in {:.1} ms",
            c.snapshot_bytes / 1000,
            c.fragments,
            c.expired,
            c.retried,
            c.took.as_secs_f64() * 1e3
        );
    }
}
