//! Admission to the membership service on loopback: only identities on the service's allow list
//! join, each over a Noise session; a plain or unlisted process cannot join or inject, and a
//! node holding the wrong service key is told so.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidings::{AllowList, GmsLinkConfig, Identity, JoinError, LinkError, Node, StartError, Topic};

struct Cluster {
    service: Identity,
    nodes: Vec<Identity>,
    first: Node,
}

/// A node embedding a service that admits `nodes[0..admitted]`, joined as `nodes[0]`.
fn cluster(admitted: usize) -> Cluster {
    let service = Identity::generate().unwrap();
    let nodes: Vec<Identity> = (0..4).map(|_| Identity::generate().unwrap()).collect();
    let mut allowed = AllowList::new();
    for (i, n) in nodes.iter().take(admitted).enumerate() {
        allowed.insert(*n.public(), &format!("node{i}"));
    }
    let first = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), common::gms_config())
        .secure_gms(service.clone(), allowed)
        .identity(nodes[0].clone())
        .start()
        .unwrap();
    Cluster {
        service,
        nodes,
        first,
    }
}

fn link_to(node: &Node, join_timeout: Duration) -> GmsLinkConfig {
    let mut link = common::link(&[node.gms_addr()]);
    link.join_timeout = join_timeout;
    link
}

#[test]
fn admitted_nodes_join_and_exchange_messages() {
    let c = cluster(2);
    let second = Node::builder()
        .gms(c.first.gms_addr())
        .gms_link(link_to(&c.first, Duration::from_secs(5)))
        .identity(c.nodes[1].clone())
        .service_key(*c.service.public())
        .start()
        .unwrap();
    let topic: Topic<u64> = Topic::new("admitted/t").unwrap();
    let sub = second.subscribe(&topic).unwrap();
    let mut publisher = c.first.publisher(&topic).unwrap();
    for k in 0..100u64 {
        publisher.publish(&k).unwrap();
    }
    for k in 0..100u64 {
        let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.value, k);
    }
    let gms = c.first.stats().unwrap().gms.unwrap();
    assert_eq!(gms.link.admitted, 2, "{:?}", gms.link);
    assert!(gms.link.opened > 0 && gms.link.sealed > 0, "{:?}", gms.link);
    assert_eq!(gms.members.len(), 2);
    assert_eq!(gms.link.sessions_up, 2, "{:?}", gms.link);
    // A node that leaves takes its session with it: sessions are bounded, and a service that
    // kept every departed address's would refuse new nodes once the bound filled.
    drop(sub);
    second.shutdown().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let gms = c.first.stats().unwrap().gms.unwrap();
        if gms.members.len() == 1 && gms.link.sessions_up == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the departed node's session stayed: {:?}, members {:?}",
            gms.link,
            gms.members
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_identity_off_the_list_is_refused_at_once_with_a_clear_error() {
    let c = cluster(1);
    let started = std::time::Instant::now();
    let refused = Node::builder()
        .gms(c.first.gms_addr())
        .gms_link(link_to(&c.first, Duration::from_secs(5)))
        .identity(c.nodes[2].clone())
        .service_key(*c.service.public())
        .start();
    match refused {
        Err(StartError::Join(JoinError::NotAdmitted {
            reason: LinkError::NotAdmitted(key),
            ..
        })) => assert_eq!(key, *c.nodes[2].public()),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The refusal is authenticated, so the node does not wait for its join timeout.
    assert!(started.elapsed() < Duration::from_secs(3));
    let message = StartError::Join(JoinError::NotAdmitted {
        servers: vec![c.first.gms_addr()],
        reason: LinkError::NotAdmitted(*c.nodes[2].public()),
    })
    .to_string();
    assert!(message.contains("not admitted"), "{message}");
    let gms = c.first.stats().unwrap().gms.unwrap();
    assert_eq!(gms.link.not_admitted, 1, "{:?}", gms.link);
    assert_eq!(gms.members.len(), 1);
}

#[test]
fn a_node_with_the_wrong_service_key_gets_a_clear_error() {
    let c = cluster(2);
    let wrong = Identity::generate().unwrap();
    let refused = Node::builder()
        .gms(c.first.gms_addr())
        .gms_link(link_to(&c.first, Duration::from_secs(1)))
        .identity(c.nodes[1].clone())
        .service_key(*wrong.public())
        .start();
    match refused {
        Err(
            e @ StartError::Join(JoinError::NotAdmitted {
                reason: LinkError::WrongServiceKey,
                ..
            }),
        ) => assert!(e.to_string().contains("service key"), "{e}"),
        other => panic!("expected a wrong service key, got {other:?}"),
    }
    let gms = c.first.stats().unwrap().gms.unwrap();
    assert!(gms.link.bad_hellos > 0, "{:?}", gms.link);
    assert_eq!(gms.members.len(), 1);
}

#[test]
fn a_plain_process_cannot_join_or_inject() {
    let c = cluster(2);
    // A node without an identity speaks the plain GMS protocol: never answered.
    let plain = Node::builder()
        .gms(c.first.gms_addr())
        .gms_link(link_to(&c.first, Duration::from_millis(800)))
        .start();
    assert!(
        matches!(
            plain,
            Err(StartError::Join(JoinError::GmsUnreachable { .. }))
        ),
        "{plain:?}"
    );
    // Raw datagrams: plain GMS framing, a link data datagram without a session, garbage.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let gms = c.first.gms_addr();
    let mut forged_data = b"TGS\x01\x04".to_vec();
    forged_data.extend_from_slice(&[0u8; 40]);
    for datagram in [
        &b"TGM\x04\x01\x02\x03"[..],
        &forged_data[..],
        &[0xFFu8; 64][..],
    ] {
        socket.send_to(datagram, gms).unwrap();
    }
    // The only answer is the unreadable notice to the data datagram without a session.
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 256];
    let (n, _) = socket.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"TGS\x01\x03");
    assert!(socket.recv_from(&mut buf).is_err());
    let stats = c.first.stats().unwrap().gms.unwrap();
    assert!(stats.link.plain_dropped >= 2, "{:?}", stats.link);
    assert_eq!(stats.link.no_session, 1, "{:?}", stats.link);
    assert_eq!(stats.members.len(), 1);
}

#[test]
fn a_replicated_service_admits_only_its_list() {
    let service = Identity::generate().unwrap();
    let node = Identity::generate().unwrap();
    let stranger = Identity::generate().unwrap();
    let mut allowed = AllowList::new();
    allowed.insert(*node.public(), "node");
    let (sockets, peers) = replica_sockets(3);
    let replica_security = tidings_gms::ReplicaSecurity::generate(3).unwrap();
    let _replicas = secure_replicas(sockets, &peers, &service, &allowed, replica_security, None);
    let mut link = common::link(&peers);
    link.join_timeout = Duration::from_secs(10);
    let admitted = Node::builder()
        .gms_replicas(&peers)
        .gms_link(link.clone())
        .identity(node)
        .service_key(*service.public())
        .start()
        .unwrap();
    let topic: Topic<u64> = Topic::new("replicated/admitted").unwrap();
    let sub = admitted.subscribe(&topic).unwrap();
    let mut publisher = admitted.publisher(&topic).unwrap();
    publisher.publish(&7).unwrap();
    assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, 7);
    let refused = Node::builder()
        .gms_replicas(&peers)
        .gms_link(link)
        .identity(stranger)
        .service_key(*service.public())
        .start();
    assert!(
        matches!(
            refused,
            Err(StartError::Join(JoinError::NotAdmitted {
                reason: LinkError::NotAdmitted(_),
                ..
            }))
        ),
        "{refused:?}"
    );
}

/// Forwards the replicas' datagrams to one another through sockets of its own (the addresses
/// the replicas list for their peers), keeping a copy of each.
struct Tap {
    listed: Vec<SocketAddr>,
    captured: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Tap {
    fn new(real: Vec<SocketAddr>) -> Tap {
        let sockets: Arc<Vec<UdpSocket>> = Arc::new(
            real.iter()
                .map(|_| {
                    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    s
                })
                .collect(),
        );
        let listed = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
        let captured = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..real.len())
            .map(|to| {
                let (sockets, real, captured, stop) = (
                    Arc::clone(&sockets),
                    real.clone(),
                    Arc::clone(&captured),
                    Arc::clone(&stop),
                );
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((n, src)) = sockets[to].recv_from(&mut buf) else {
                            continue;
                        };
                        let Some(from) = real.iter().position(|&r| r == src) else {
                            continue;
                        };
                        captured.lock().unwrap().push(buf[..n].to_vec());
                        let _ = sockets[from].send_to(&buf[..n], real[to]);
                    }
                })
            })
            .collect();
        Tap {
            listed,
            captured,
            stop,
            threads,
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Replica `index` on `socket` listing `peers`, admitting `allowed`, with replica security `rs`.
fn secure_replica(
    index: usize,
    socket: UdpSocket,
    peers: &[SocketAddr],
    service: &Identity,
    allowed: &AllowList,
    rs: tidings_gms::ReplicaSecurity,
    data_dir: Option<&std::path::Path>,
) -> tidings::GmsReplicaServer {
    let mut host = tidings::ReplicaHostConfig::default();
    host.replica = common::replica_config();
    host.replica.index = index;
    host.data_dir = data_dir.map(|d| tidings_runtime::replica_data_dir(d, index));
    host.replica_security = Some(rs);
    let security = tidings_gms::ServiceSecurity {
        identity: service.clone(),
        allowed: allowed.clone(),
    };
    tidings::GmsReplicaServer::start_secure_on(host, peers.to_vec(), socket, Some(security))
        .unwrap()
}

/// `n` loopback sockets for replicas, and their addresses.
fn replica_sockets(n: usize) -> (Vec<UdpSocket>, Vec<SocketAddr>) {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    (sockets, addrs)
}

/// Replicas on `sockets` listing `peers`, admitting `allowed`, each with its replica security.
fn secure_replicas(
    sockets: Vec<UdpSocket>,
    peers: &[SocketAddr],
    service: &Identity,
    allowed: &AllowList,
    replica_security: Vec<tidings_gms::ReplicaSecurity>,
    data_dir: Option<&std::path::Path>,
) -> Vec<tidings::GmsReplicaServer> {
    sockets
        .into_iter()
        .zip(replica_security)
        .enumerate()
        .map(|(index, (socket, rs))| {
            secure_replica(index, socket, peers, service, allowed, rs, data_dir)
        })
        .collect()
}

#[test]
fn sealed_replicas_serve_sealed_nodes_and_never_show_the_datagram_key() {
    let service = Identity::generate().unwrap();
    let nodes: Vec<Identity> = (0..2).map(|_| Identity::generate().unwrap()).collect();
    let mut allowed = AllowList::new();
    for (i, n) in nodes.iter().enumerate() {
        allowed.insert(*n.public(), &format!("node{i}"));
    }
    let (sockets, real) = replica_sockets(3);
    // The replicas reach one another only through the tap; nodes reach them directly.
    let tap = Tap::new(real.clone());
    let dir = std::env::temp_dir().join(format!(
        "tidings-sealed-replicas-{}-{}",
        std::process::id(),
        fastrand_suffix()
    ));
    let replica_security = tidings_gms::ReplicaSecurity::generate(3).unwrap();
    let mut replicas = secure_replicas(
        sockets,
        &tap.listed,
        &service,
        &allowed,
        replica_security.clone(),
        Some(&dir),
    );
    let start = |id: &Identity| {
        let mut link = common::link(&real);
        link.join_timeout = Duration::from_secs(10);
        Node::builder()
            .gms_replicas(&real)
            .gms_link(link)
            .identity(id.clone())
            .service_key(*service.public())
            .start()
            .unwrap()
    };
    let a = start(&nodes[0]);
    let b = start(&nodes[1]);
    let topic: Topic<u64> = Topic::new("replicas/sealed").unwrap();
    let sub = b.subscribe(&topic).unwrap();
    let mut publisher = a.publisher(&topic).unwrap();
    common::wait_for("a sealed delivery", Duration::from_secs(10), || {
        publisher.publish(&7).unwrap();
        sub.recv_timeout(Duration::from_millis(50)).ok()
    });
    let sealing = b.stats().unwrap().runtime.sealing;
    assert!(
        sealing.key_id.is_some() && sealing.open.opened > 0,
        "{sealing:?}"
    );
    let leader = replicas
        .iter()
        .filter_map(|r| r.snapshot())
        .find(|s| s.serving)
        .unwrap();
    assert!(leader.stats.keys_drawn >= 1, "{:?}", leader.stats);
    for (i, r) in replicas.iter().enumerate() {
        let s = r.snapshot().unwrap();
        assert_eq!(s.replica_link.plain_dropped, 0);
        assert_eq!(s.replica_link.wrong_peer, 0);
        assert!(s.replica_link.delivered > 0, "{:?}", s.replica_link);
        // The leader sends to both followers; a follower that never stood for election has
        // only answered the candidate that won, so it may have a session to that one alone.
        let peers = if i == leader.index { 2 } else { 1 };
        assert!(
            s.replica_link.outbound.sessions >= peers,
            "replica {i}: {:?}",
            s.replica_link
        );
    }
    // A follower restarts (from its state file, on its address): both directions handshake
    // again, and it takes part again.
    let follower = (0..3).find(|&i| i != leader.index).unwrap();
    let sessions_before = replicas[leader.index]
        .snapshot()
        .unwrap()
        .replica_link
        .outbound
        .sessions;
    replicas.remove(follower).shutdown();
    let socket = UdpSocket::bind(real[follower]).unwrap();
    let restarted = secure_replica(
        follower,
        socket,
        &tap.listed,
        &service,
        &allowed,
        replica_security[follower].clone(),
        Some(&dir),
    );
    replicas.insert(follower, restarted);
    common::wait_for(
        "the restarted replica's sessions",
        Duration::from_secs(10),
        || {
            let s = replicas[follower].snapshot()?;
            let l = replicas[leader.index].snapshot()?;
            (s.replica_link.outbound.sessions >= 1
                && s.replica_link.delivered > 0
                && l.replica_link.inbound.admitted >= 3
                && l.replica_link.outbound.sessions > sessions_before
                && s.members.len() == 2)
                .then_some(())
        },
    );
    drop((a, b));
    drop(replicas);
    let captured = std::mem::take(&mut *tap.captured.lock().unwrap());
    drop(tap);
    // The key is in the leader's state file in clear (it is the Raft log); its random-looking
    // 32-byte windows are the candidates, and none may appear in a captured replica datagram.
    let state = std::fs::read(
        tidings_runtime::replica_data_dir(&dir, leader.index).join(tidings_runtime::STATE_FILE),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let windows: std::collections::HashSet<&[u8]> = state
        .windows(32)
        .filter(|w| {
            let mut seen = [false; 256];
            w.iter().for_each(|&b| seen[usize::from(b)] = true);
            seen.iter().filter(|&&s| s).count() >= 24
        })
        .collect();
    assert!(!windows.is_empty(), "no key-like bytes in the state file");
    assert!(!captured.is_empty());
    for d in &captured {
        assert!(
            d.starts_with(&tidings_gms::REPLICA_LINK_MAGIC),
            "plain replica datagram"
        );
        assert!(
            !d.windows(32).any(|w| windows.contains(w)),
            "a replica datagram shows bytes of the Raft state in clear"
        );
    }
}

/// A suffix that keeps concurrent runs' directories apart.
fn fastrand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn a_replica_whose_identity_is_not_listed_cannot_take_part() {
    let service = Identity::generate().unwrap();
    let node = Identity::generate().unwrap();
    let mut allowed = AllowList::new();
    allowed.insert(*node.public(), "node");
    let (sockets, peers) = replica_sockets(3);
    let mut security = tidings_gms::ReplicaSecurity::generate(3).unwrap();
    // Replica 2 runs with an identity the others do not list (it lists its own key).
    let stranger = Identity::generate().unwrap();
    security[2].keys[2] = *stranger.public();
    security[2].identity = stranger;
    let replicas = secure_replicas(sockets, &peers, &service, &allowed, security, None);
    let mut link = common::link(&peers);
    link.join_timeout = Duration::from_secs(10);
    let member = Node::builder()
        .gms_replicas(&peers)
        .gms_link(link)
        .identity(node)
        .service_key(*service.public())
        .start()
        .unwrap();
    let topic: Topic<u64> = Topic::new("replicas/stranger").unwrap();
    let sub = member.subscribe(&topic).unwrap();
    member.publisher(&topic).unwrap().publish(&3).unwrap();
    assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, 3);
    // Long enough for the stranger to try elections of its own (timeouts of a few hundred ms).
    std::thread::sleep(Duration::from_millis(1200));
    let snaps: Vec<_> = replicas.iter().map(|r| r.snapshot().unwrap()).collect();
    let leader = snaps.iter().find(|s| s.serving).unwrap();
    assert!(leader.index < 2, "the stranger leads");
    assert!(
        !snaps[2].serving && snaps[2].members.is_empty(),
        "{:?}",
        snaps[2]
    );
    assert_eq!(snaps[2].replica.snapshots_restored, 0);
    assert!(snaps[2].replica_link.outbound.sessions == 0);
    for s in &snaps[..2] {
        assert!(
            s.replica_link.inbound.not_admitted >= 1,
            "{:?}",
            s.replica_link
        );
        assert_eq!(s.members.len(), 1);
        // The stranger's elections never reached them: no term moved past the leader's.
        assert_eq!(s.term, leader.term);
    }
    let term = leader.term;
    std::thread::sleep(Duration::from_millis(500));
    let again = replicas[leader.index].snapshot().unwrap();
    assert!(again.serving && again.term == term);
}
