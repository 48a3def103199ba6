//! Sealed protocol datagrams on loopback: admitted nodes get the keys of their regions from the
//! service and deliver with every datagram sealed, in both modes; a datagram of the right
//! format sealed with another key is counted and dropped and changes nothing, and one naming a
//! region the receiver holds no key of is refused as an unknown key; when a member leaves, the
//! keys of its regions are replaced, and the old ones stop opening datagrams after their grace.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use tidings::{AllowList, Identity, Node, SecurityMode, Topic};
use tidings_seal::{Aead, KeyId, KeySecret, SealingKey};

/// Three identities admitted by a service embedded in the first node, which joins as the first
/// identity in `mode` (`None`: the default).
struct Cluster {
    service: Identity,
    nodes: Vec<Identity>,
    first: Node,
}

fn cluster(mode: Option<SecurityMode>) -> Cluster {
    let service = Identity::generate().unwrap();
    let nodes: Vec<Identity> = (0..3).map(|_| Identity::generate().unwrap()).collect();
    let mut allowed = AllowList::new();
    for (i, n) in nodes.iter().enumerate() {
        allowed.insert(*n.public(), &format!("node{i}"));
    }
    let mut builder = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), common::gms_config())
        .secure_gms(service.clone(), allowed)
        .identity(nodes[0].clone());
    if let Some(mode) = mode {
        builder = builder.security(mode);
    }
    Cluster {
        first: builder.start().unwrap(),
        service,
        nodes,
    }
}

impl Cluster {
    /// A node joined as identity `i`, in `mode` (`None`: the default), with `grace` for
    /// replaced keys.
    fn join(&self, i: usize, mode: Option<SecurityMode>, grace: Duration) -> Node {
        let mut link = common::link(&[self.first.gms_addr()]);
        link.key_grace = grace;
        let mut builder = Node::builder()
            .gms(self.first.gms_addr())
            .gms_link(link)
            .identity(self.nodes[i].clone())
            .service_key(*self.service.public());
        if let Some(mode) = mode {
            builder = builder.security(mode);
        }
        builder.start().unwrap()
    }
}

/// Publishes 0..n on a fresh topic from `from` and checks that `to` gets them in order.
fn exchange(from: &Node, to: &Node, name: &str, n: u64) {
    let topic: Topic<u64> = Topic::new(name).unwrap();
    let sub = to.subscribe(&topic).unwrap();
    let mut publisher = from.publisher(&topic).unwrap();
    for k in 0..n {
        publisher.publish(&k).unwrap();
    }
    for k in 0..n {
        let m = sub.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.value, k);
    }
}

/// The one region `node` sends to. Its outbound stream lasts while it is a member, where a
/// receiver's inbound stream starts afresh (not yet listed) whenever the region's view is replaced.
fn sending_region(node: &Node) -> u32 {
    let regions = node.stats().unwrap().runtime.unstable_by_region;
    assert_eq!(regions.len(), 1, "{regions:?}");
    regions[0].0 .0
}

/// A datagram with a valid-looking protocol header (magic "TD", version 2, kind data) of
/// `region` from `sender`, sealed in `mode` under key `key` with a secret no member has.
fn forged(sender: u32, key: u32, mode: SecurityMode, region: u32) -> Vec<u8> {
    let mut d = vec![0u8; 20 + 40 + tidings_seal::datagram::TRAILER_LEN];
    d[0..2].copy_from_slice(&0x5444u16.to_be_bytes());
    d[2] = 2;
    d[3] = 1;
    d[8..12].copy_from_slice(&region.to_be_bytes());
    d[16..20].copy_from_slice(&sender.to_be_bytes());
    let mut sealer = SealingKey::new(
        Aead::Aes256Gcm,
        mode,
        KeyId(key),
        sender,
        &KeySecret::from_bytes([0x42; 32]),
        u64::MAX,
    );
    // Past any counter a real sender used, so the replay window is not what refuses it.
    for _ in 0..100_000 {
        sealer.seal(&mut d.clone(), 60).unwrap();
    }
    let len = sealer.seal(&mut d, 60).unwrap();
    d.truncate(len);
    d
}

#[test]
fn admitted_nodes_deliver_sealed_in_both_modes_and_encrypt_is_the_default() {
    for mode in [
        Some(SecurityMode::Authenticate),
        Some(SecurityMode::Encrypt),
        None,
    ] {
        let c = cluster(mode);
        let second = c.join(1, mode, Duration::from_secs(2));
        exchange(&c.first, &second, "sealed/t", 200);
        let sent = c.first.stats().unwrap().runtime.sealing;
        assert!(sent.sealed > 0, "{mode:?} {sent:?}");
        assert_eq!(sent.unsealed_dropped, 0, "{mode:?} {sent:?}");
        assert!(sent.key_id.is_some(), "{mode:?} {sent:?}");
        let received = second.stats().unwrap().runtime.sealing;
        assert!(received.open.opened > 0, "{mode:?} {received:?}");
        assert_eq!(received.open.refused(), 0, "{mode:?} {received:?}");
        // One region, one key: the publisher's and the subscriber's.
        assert_eq!(received.key_id, sent.key_id, "{mode:?} {received:?}");
        // The runtime hands datagrams over in bytes they alone hold: opened where they lie.
        assert_eq!(received.open_copies, 0, "{mode:?} {received:?}");
    }
}

#[test]
fn a_node_without_an_identity_cannot_ask_for_sealing() {
    let refused = Node::builder()
        .private_gms()
        .security(SecurityMode::Encrypt)
        .start();
    match refused {
        Err(tidings::StartError::Config(why)) => assert!(why.contains("identity"), "{why}"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[test]
fn a_forged_datagram_is_counted_and_dropped_and_changes_nothing() {
    let c = cluster(Some(SecurityMode::Encrypt));
    let second = c.join(1, Some(SecurityMode::Encrypt), Duration::from_secs(2));
    // Subscriber and publisher live through the forgeries, so the region (and its key) does too.
    let topic: Topic<u64> = Topic::new("forged/t").unwrap();
    let sub = second.subscribe(&topic).unwrap();
    let mut publisher = c.first.publisher(&topic).unwrap();
    for k in 0..50 {
        publisher.publish(&k).unwrap();
    }
    for k in 0..50 {
        assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, k);
    }
    let before = second.stats().unwrap().runtime;
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let key = before.sealing.key_id.unwrap();
    let region = sending_region(&c.first);
    // The region's current key id, the first node's id as sender: only the secret is wrong.
    for _ in 0..10 {
        attacker
            .send_to(
                &forged(c.first.id().0, key, SecurityMode::Encrypt, region),
                second.local_addr(),
            )
            .unwrap();
    }
    // A key id nobody handed out.
    attacker
        .send_to(
            &forged(c.first.id().0, key + 1000, SecurityMode::Encrypt, region),
            second.local_addr(),
        )
        .unwrap();
    // The right key id in a region the receiver holds no key of.
    attacker
        .send_to(
            &forged(c.first.id().0, key, SecurityMode::Encrypt, region + 1000),
            second.local_addr(),
        )
        .unwrap();
    let after = common::wait_for("the forgeries counted", Duration::from_secs(5), || {
        let s = second.stats().unwrap().runtime;
        (s.sealing.open.bad_tag + s.sealing.open.unknown_key >= 12).then_some(s)
    });
    assert_eq!(after.sealing.open.bad_tag, 10, "{:?}", after.sealing);
    assert_eq!(after.sealing.open.unknown_key, 2, "{:?}", after.sealing);
    // The protocol never saw them.
    for (a, b) in [
        (
            after.proto.malformed_dropped,
            before.proto.malformed_dropped,
        ),
        (after.proto.invalid_dropped, before.proto.invalid_dropped),
        (after.proto.foreign_dropped, before.proto.foreign_dropped),
        (
            after.proto.incarnation_dropped,
            before.proto.incarnation_dropped,
        ),
        (
            after.proto.messages_delivered,
            before.proto.messages_delivered,
        ),
    ] {
        assert_eq!(a, b, "{:?}", after.proto);
    }
    // And the nodes go on.
    for k in 50..100 {
        publisher.publish(&k).unwrap();
    }
    for k in 50..100 {
        assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, k);
    }
    exchange(&c.first, &second, "forged/after", 50);
}

#[test]
fn a_departed_members_key_is_replaced_and_stops_opening_after_the_grace() {
    let grace = Duration::from_millis(800);
    let c = cluster(Some(SecurityMode::Authenticate));
    let second = c.join(1, Some(SecurityMode::Authenticate), grace);
    let third = c.join(2, Some(SecurityMode::Authenticate), grace);
    // Second subscribes and third publishes, both for the whole test: their region's key is
    // the one third holds when it leaves.
    let topic: Topic<u64> = Topic::new("departed/t").unwrap();
    let sub = second.subscribe(&topic).unwrap();
    let mut publisher = third.publisher(&topic).unwrap();
    for k in 0..20 {
        publisher.publish(&k).unwrap();
    }
    for k in 0..20 {
        assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, k);
    }
    let before = second.stats().unwrap().runtime;
    let old = before.sealing.key_id.unwrap();
    let region = sending_region(&third);
    third.shutdown().unwrap();
    let new = common::wait_for("a new key", Duration::from_secs(5), || {
        let k = second.stats().unwrap().runtime.sealing.key_id?;
        (k > old).then_some(k)
    });
    assert!(new > old);
    // Within the grace the old key is still installed: a forgery under it fails its tag.
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let probe = |key: u32| {
        attacker
            .send_to(
                &forged(c.first.id().0, key, SecurityMode::Authenticate, region),
                second.local_addr(),
            )
            .unwrap();
    };
    probe(old);
    let s = common::wait_for("the forgery counted", Duration::from_secs(5), || {
        let s = second.stats().unwrap().runtime.sealing;
        (s.open.bad_tag >= 1).then_some(s)
    });
    assert_eq!((s.open.bad_tag, s.open.retired_key), (1, 0), "{s:?}");
    std::thread::sleep(grace + Duration::from_millis(400));
    let s = second.stats().unwrap().runtime.sealing;
    assert!(s.keys_retired >= 1, "{s:?}");
    // After it, anything under the old key is refused as retired before any AEAD work.
    probe(old);
    let s = common::wait_for("the retired key counted", Duration::from_secs(5), || {
        let s = second.stats().unwrap().runtime.sealing;
        (s.open.retired_key >= 1).then_some(s)
    });
    assert_eq!(s.open.retired_key, 1, "{s:?}");
    // The remaining members deliver in the region under the new key.
    let mut publisher = c.first.publisher(&topic).unwrap();
    for k in 100..120 {
        publisher.publish(&k).unwrap();
    }
    for k in 100..120 {
        assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, k);
    }
    let s = second.stats().unwrap().runtime.sealing;
    assert!(s.key_id >= Some(new), "{s:?}");
}
