//! Admission to the membership service on loopback: only identities on the service's allow list
//! join, each over a Noise session; a plain or unlisted process cannot join or inject, and a
//! node holding the wrong service key is told so.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::{SocketAddr, UdpSocket};
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
    let sockets: Vec<UdpSocket> = (0..3)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let _replicas: Vec<tidings::GmsReplicaServer> = sockets
        .into_iter()
        .enumerate()
        .map(|(index, socket)| {
            let host = {
                let mut cfg = tidings::ReplicaHostConfig::default();
                cfg.replica = {
                    let mut c = common::replica_config();
                    c.index = index;
                    c
                };
                cfg.data_dir = None;
                cfg
            };
            let security = tidings_gms::ServiceSecurity {
                identity: service.clone(),
                allowed: allowed.clone(),
            };
            tidings::GmsReplicaServer::start_secure_on(host, peers.clone(), socket, Some(security))
                .unwrap()
        })
        .collect();
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
