//! The check of the GMS link's hosts on hostile input (`secure::ServiceLink::receive`,
//! `secure::NodeLink::receive`), shared by the `link_hosts` fuzz target (with `#[path]`) and
//! `tests/link_hostile.rs` (proptest, on stable).
//!
//! A genuine node (fixed identity, address 0) is admitted first; then every record of the input
//! is delivered as a datagram, to the service from some address or to the node from some
//! replica. None may panic, admit anyone, open a session for another address, or be handed on
//! as a GMS datagram; afterwards the genuine node and service still exchange datagrams both
//! ways (handshaking again if a forged notice ended the node's session).

use std::time::Duration;

use tidings_gms::secure::{
    Entropy, Inbound, LinkSecurity, NodeLink, ServiceLink, ServiceSecurity, SESSIONS_MAX,
};
use tidings_proto::Time;
use tidings_seal::link::LINK_MAGIC;
use tidings_seal::{AllowList, Identity};

/// Records read from one input, at most.
const RECORDS_MAX: usize = 64;
/// Addresses the hostile datagrams come from (0 is the genuine node's).
const ADDRS: u8 = 8;

fn entropy() -> Entropy {
    let mut n = 0u8;
    Box::new(move || {
        n = n.wrapping_add(1);
        Some([n; 32])
    })
}

/// The framed GMS datagram the genuine node sends.
fn framed(body: &[u8]) -> Vec<u8> {
    [&tidings_gms::GMS_MAGIC[..], body].concat()
}

/// Carries the node's datagrams to the service (from address 0) and the replies back; returns
/// what the service got.
fn exchange(node: &mut NodeLink, service: &mut ServiceLink<u8>, now: Time) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for _ in 0..4 {
        while let Some((_, d)) = node.poll_transmit() {
            match service.receive(0, &d) {
                Inbound::Gms(g) => got.push(g),
                Inbound::Reply(r) => {
                    let _ = node.receive(now, 0, &r);
                }
                Inbound::Dropped => {}
            }
        }
    }
    got
}

/// Runs `data` (records: a selector byte, a `u16` length little-endian, the bytes) against an
/// admitted node and its service.
pub(crate) fn link_any(data: &[u8]) {
    let service_id = Identity::from_private([1; 32]).expect("key");
    let node_id = Identity::from_private([2; 32]).expect("key");
    let mut allowed = AllowList::new();
    allowed.insert(*node_id.public(), "node");
    let mut service = ServiceLink::<u8>::new(
        ServiceSecurity {
            identity: service_id.clone(),
            allowed,
        },
        entropy(),
    );
    let mut node = NodeLink::new(
        LinkSecurity::new(node_id.clone(), *service_id.public()),
        2,
        entropy(),
    );
    let mut now = Time::ZERO;
    node.send(now, 0, framed(b"join"));
    assert_eq!(
        exchange(&mut node, &mut service, now),
        vec![framed(b"join")]
    );
    assert!(node.is_up(0));
    let admitted = service.stats().admitted;

    let mut rest = data;
    for _ in 0..RECORDS_MAX {
        let [selector, a, b, tail @ ..] = rest else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*a, *b])).min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let mut datagram = Vec::with_capacity(bytes.len() + 4);
        if selector & 2 != 0 {
            // Right magic, so the bytes reach the handshake and the sessions.
            datagram.extend_from_slice(&LINK_MAGIC);
        }
        datagram.extend_from_slice(bytes);
        now += Duration::from_millis(u64::from(selector >> 5));
        if selector & 1 == 0 {
            let from = (selector >> 2) % ADDRS;
            match service.receive(from, &datagram) {
                Inbound::Gms(g) => panic!("hostile datagram handed on from {from}: {g:?}"),
                Inbound::Reply(r) => assert!(r.len() <= 64, "a reply longer than a welcome"),
                Inbound::Dropped => {}
            }
        } else {
            let replica = usize::from((selector >> 2) % 4);
            assert!(
                node.receive(now, replica, &datagram).is_none(),
                "hostile datagram opened by the node"
            );
        }
        let stats = service.stats();
        assert_eq!(stats.admitted, admitted, "a hostile hello was admitted");
        assert!(stats.sessions_up <= 1 && stats.sessions_up as usize <= SESSIONS_MAX);
        for a in 1..ADDRS {
            assert!(service.peer(&a).is_none(), "a session for address {a}");
        }
    }

    // The genuine exchange still works, both ways.
    now += Duration::from_secs(1);
    node.send(now, 0, framed(b"after"));
    let got = exchange(&mut node, &mut service, now);
    if got.is_empty() {
        // A forged notice ended the node's session: the next send handshakes again.
        now += Duration::from_secs(1);
        node.send(now, 0, framed(b"again"));
        let got = exchange(&mut node, &mut service, now);
        assert!(got.last().is_some(), "the genuine node was locked out");
    }
    let sealed = service
        .seal_to(&0, b"TGM\x04view")
        .expect("a session for the node");
    assert_eq!(
        node.receive(now, 0, &sealed).as_deref(),
        Some(&b"TGM\x04view"[..]),
        "the node cannot open the service's datagram"
    );
}
