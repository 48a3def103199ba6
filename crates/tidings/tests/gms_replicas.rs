//! The replicated membership service on loopback (issue 25): three replicas (threads of this
//! process), a publisher and a subscriber in this process and a second subscriber in a child
//! process (this test binary re-executed), all joined with the three addresses. While the
//! publisher sends at a modest rate, the leader replica is stopped abruptly and then the child
//! is killed (SIGKILL: no leave). The surviving subscriber must get every message in order, the
//! publisher's messages must become stable, and the dead subscriber must be removed within the
//! failure-detection time plus one election. Prints the measured times (`cargo test -p tidings
//! --test gms_replicas -- --nocapture`).

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{GmsLinkConfig, GmsReplicaServer, Node, ReplicaSnapshot, Topic};

/// Set in the child: the replicas' addresses, comma-separated.
const CHILD: &str = "TIDINGS_GMS_REPLICAS_TEST_CHILD";
const TEST_NAME: &str = "the_group_survives_the_gms_leader_and_a_subscriber_crashing";
const TOPIC: &str = "replicated/t1";
const MESSAGES: u64 = 2000;
/// The publisher sends one message per this interval (about 1000 a second).
const SEND_EVERY: Duration = Duration::from_millis(1);
/// Messages published when the leader replica is stopped, and when the child is killed.
const KILL_LEADER_AT: u64 = 400;
const KILL_SUBSCRIBER_AT: u64 = 700;
/// Bound of every wait of the test.
const WAIT: Duration = Duration::from_secs(30);

/// The link of [`common::link`], with suspicions reported every 100 ms.
fn link(servers: &[SocketAddr]) -> GmsLinkConfig {
    let mut link = common::link(servers);
    link.suspect_interval = Duration::from_millis(100);
    link
}

fn node(servers: &[SocketAddr]) -> Node {
    common::node_over(servers, link(servers))
}

/// The child: a subscriber that says it is ready (with its node id) and then takes deliveries
/// until it is killed (or, bounded, gives up).
fn run_child(addrs: &str) {
    let servers: Vec<SocketAddr> = addrs.split(',').map(|a| a.parse().unwrap()).collect();
    let node = node(&servers);
    let topic: Topic<u64> = Topic::new(TOPIC).unwrap();
    let sub = node.subscribe(&topic).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "ready {}", node.id().0).unwrap();
    out.flush().unwrap();
    let start = Instant::now();
    while start.elapsed() < WAIT {
        let _ = sub.recv_timeout(Duration::from_millis(100));
    }
}

/// Kills the child when dropped, so that a failing test leaves no process behind.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn snapshots(replicas: &[GmsReplicaServer]) -> Vec<ReplicaSnapshot> {
    replicas
        .iter()
        .filter_map(GmsReplicaServer::snapshot)
        .collect()
}

/// Waits until one of `replicas` serves with a term above `above`, and returns its index in
/// the slice.
fn serving(replicas: &[GmsReplicaServer], above: u64) -> usize {
    let start = Instant::now();
    loop {
        if let Some(i) = snapshots(replicas)
            .iter()
            .position(|s| s.serving && s.term > above)
        {
            return i;
        }
        assert!(start.elapsed() < WAIT, "no replica serves");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_group_survives_the_gms_leader_and_a_subscriber_crashing() {
    if let Ok(addrs) = std::env::var(CHILD) {
        run_child(&addrs);
        return;
    }
    let mut replicas = GmsReplicaServer::start_loopback(&common::replica_config(), 3).unwrap();
    let servers: Vec<SocketAddr> = replicas.iter().map(GmsReplicaServer::local_addr).collect();
    let leader = serving(&replicas, 0);
    let old_term = replicas[leader].snapshot().unwrap().term;

    let topic: Topic<u64> = Topic::new(TOPIC).unwrap();
    let survivor = node(&servers);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let _cb = survivor
        .subscribe_with(&topic, move |m| s.lock().unwrap().push(m.unwrap().value))
        .unwrap();

    let addrs: Vec<String> = servers.iter().map(SocketAddr::to_string).collect();
    let mut child = Reaper(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD, addrs.join(","))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may have written the test's name on the same line.
            if let Some((_, id)) = line.split_once("ready ") {
                let _ = tx.send(id.trim().parse::<u32>().unwrap());
            }
        }
    });
    let victim = rx.recv_timeout(WAIT).expect("the child subscriber joins");

    let publisher_node = node(&servers);
    let mut publisher = publisher_node.publisher(&topic).unwrap();
    let mut last = None;
    let mut leader_killed = None;
    let mut subscriber_killed = None;
    for k in 0..MESSAGES {
        if k == KILL_LEADER_AT {
            replicas.remove(leader).shutdown();
            leader_killed = Some(tidings_runtime::now());
        }
        if k == KILL_SUBSCRIBER_AT {
            child.0.kill().unwrap();
            subscriber_killed = Some(tidings_runtime::now());
        }
        last = Some(publisher.publish(&k).unwrap());
        std::thread::sleep(SEND_EVERY);
    }
    let (leader_killed, subscriber_killed) = (leader_killed.unwrap(), subscriber_killed.unwrap());

    publisher.wait_stable(last.unwrap(), WAIT).unwrap();
    let start = Instant::now();
    while seen.lock().unwrap().len() < MESSAGES as usize {
        assert!(
            start.elapsed() < WAIT,
            "the surviving subscriber got {} of {MESSAGES}",
            seen.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(*seen.lock().unwrap(), (0..MESSAGES).collect::<Vec<_>>());

    // The new leader: elected, it issued views, and removed the killed subscriber.
    let new_leader = serving(&replicas, old_term);
    let snap = replicas[new_leader].snapshot().unwrap();
    let elected = snap
        .leading_since
        .unwrap()
        .saturating_duration_since(leader_killed);
    let first_view = snap
        .first_view_leading
        .expect("the new leader issued a view")
        .saturating_duration_since(leader_killed);
    let removed = snap
        .removed
        .iter()
        .find(|(n, _, _)| n.0 == victim)
        .map(|&(_, _, at)| at.saturating_duration_since(subscriber_killed))
        .expect("the killed subscriber is removed");
    let config = common::replica_config();
    let detection = config.gms.heartbeat_timeout + config.gms.suspicion_timeout;
    let election = config.tick_interval
        * u32::try_from(config.election_ticks + config.election_spread_ticks).unwrap();
    // Slack for threads that lose the shared CPU for a while.
    let slack = Duration::from_millis(500);
    println!(
        "leader killed -> new leader serving {elected:?}, -> its first view {first_view:?}; \
         subscriber killed -> removed {removed:?} (bound: detection {detection:?} + election \
         {election:?} + slack {slack:?})"
    );
    assert!(
        removed <= detection + election + slack,
        "removal took {removed:?}"
    );
    assert!(snap.members.keys().all(|n| n.0 != victim));

    drop(_cb);
    publisher_node.shutdown().unwrap();
    survivor.shutdown().unwrap();
    for r in replicas {
        r.shutdown();
    }
}
