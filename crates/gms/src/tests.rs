//! Scenario tests of the service and its clients on injected time and a controllable network.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tidings_proto::{Membership, Time};
use tidings_wire::{NodeId, ViewId};

use crate::{
    ClientConfig, ClientEvent, Gms, GmsClient, GmsConfig, GmsEvent, GmsMessage, Item,
    MulticastPool, Peer, RegionAddress, RemoveCause, RequestError, NAMES_PER_REQUEST_MAX,
    TOPIC_NAME_BYTES_MAX,
};

type Filter = Box<dyn FnMut(usize, &GmsMessage) -> bool>;

/// The data address client `i` announces in its join.
fn client_addr(i: usize) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
}

/// A GMS and clients (by index) on a network that delivers at once, except what `drop_to`
/// rejects (messages to client `i`) and anything to or from a crashed client.
struct World {
    now: Time,
    gms: Gms,
    clients: Vec<GmsClient>,
    crashed: BTreeSet<usize>,
    /// Keep a message to client i if this returns true.
    keep_to: Filter,
    /// Keep a message from client i if this returns true.
    keep_from: Filter,
    events: Vec<(usize, ClientEvent)>,
    gms_events: Vec<GmsEvent>,
    /// Every update item delivered to each client (after the filter).
    delivered: Vec<Vec<GmsMessage>>,
    /// The identity each client's link proved (`None`: no admission).
    identities: Vec<Option<tidings_seal::PublicKey>>,
}

impl World {
    fn new(n: usize) -> World {
        World::with_config(n, GmsConfig::default())
    }

    fn with_config(n: usize, config: GmsConfig) -> World {
        let gms = Gms::new(config).unwrap();
        let clients = (0..n)
            .map(|i| {
                GmsClient::new(ClientConfig {
                    seed: 100 + i as u64,
                    data_addr: Some(client_addr(i)),
                    ..ClientConfig::default()
                })
                .unwrap()
            })
            .collect();
        let mut w = World {
            now: Time::ZERO,
            gms,
            clients,
            crashed: BTreeSet::new(),
            keep_to: Box::new(|_, _| true),
            keep_from: Box::new(|_, _| true),
            events: Vec::new(),
            gms_events: Vec::new(),
            delivered: vec![Vec::new(); n],
            identities: vec![None; n],
        };
        w.tick();
        w
    }

    fn index_of(&self, peer: Peer) -> Option<usize> {
        self.clients.iter().position(|c| match peer {
            Peer::Node(n) => c.node() == Some(n),
            Peer::Joiner(nonce) => c.nonce() == nonce,
        })
    }

    /// Exchanges messages until nothing moves.
    fn pump(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..self.clients.len() {
                while let Some((_, msg)) = self.clients[i].poll_transmit() {
                    moved = true;
                    if self.crashed.contains(&i) || !(self.keep_from)(i, &msg) {
                        continue;
                    }
                    let from = match self.clients[i].node() {
                        Some(n) => Peer::Node(n),
                        None => Peer::Joiner(self.clients[i].nonce()),
                    };
                    let identity = self.identities.get(i).copied().flatten();
                    self.gms
                        .handle_message_as(self.now, from, identity.as_ref(), msg);
                }
                while let Some(e) = self.clients[i].poll_event() {
                    self.events.push((i, e));
                }
            }
            while let Some(t) = self.gms.poll_transmit() {
                moved = true;
                let Some(i) = self.index_of(t.to) else {
                    continue;
                };
                if self.crashed.contains(&i) || !(self.keep_to)(i, &t.msg) {
                    continue;
                }
                self.delivered[i].push(t.msg.clone());
                self.clients[i].handle_datagram(self.now, 0, &t.msg.to_bytes());
            }
            while let Some(e) = self.gms.poll_event() {
                self.gms_events.push(e);
            }
            if !moved {
                return;
            }
        }
        panic!("livelock");
    }

    fn tick(&mut self) {
        for (i, c) in self.clients.iter_mut().enumerate() {
            if !self.crashed.contains(&i) {
                c.handle_timeout(self.now);
            }
        }
        self.gms.handle_timeout(self.now);
        self.pump();
    }

    /// Runs to `until`, waking at every deadline (at least every 50 ms).
    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        while self.now < until {
            let mut next = self.now + Duration::from_millis(50);
            let deadlines = self
                .clients
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.crashed.contains(i))
                .filter_map(|(_, c)| c.poll_timeout())
                .chain(self.gms.poll_timeout());
            for t in deadlines {
                if t > self.now && t < next {
                    next = t;
                }
            }
            self.now = next.min(until);
            self.tick();
        }
    }

    fn node(&self, i: usize) -> NodeId {
        self.clients[i].node().unwrap()
    }

    /// Asserts that client `i` was told the node addresses of clients `others`, and no other.
    fn assert_knows_addresses_of(&self, i: usize, others: &[usize]) {
        let known: BTreeSet<(NodeId, std::net::SocketAddr)> =
            self.clients[i].node_addresses().collect();
        let expected = others
            .iter()
            .map(|&j| (self.node(j), client_addr(j)))
            .collect();
        assert_eq!(known, expected, "addresses known to client {i}");
    }

    fn last_membership(&self, i: usize) -> Option<&Membership> {
        self.events.iter().rev().find_map(|(j, e)| match e {
            ClientEvent::Membership(m) if *j == i => Some(m),
            _ => None,
        })
    }

    /// What node `i` should hold according to the GMS's own state.
    fn expected(&self, i: usize, publishes: &[&str]) -> Membership {
        let topics: Vec<_> = publishes
            .iter()
            .filter_map(|n| self.gms.topic_id(n))
            .collect();
        self.gms.planner().membership(
            self.node(i),
            &topics,
            self.gms.config().partition_size,
            |r| (self.gms.view_of(r).unwrap(), self.gms.base_of(r).unwrap()),
        )
    }
}

/// The incarnation is the configuration's, reaches every client in its welcome, and is part
/// of the snapshot; a replicated service has none until its first leader decides one, and the
/// decision is taken once.
/// A member says where it serves metrics; the service lists it until the member leaves, and
/// a snapshot keeps it.
#[test]
fn the_service_lists_where_members_serve_metrics() {
    let mut w = World::new(3);
    w.run_for(Duration::from_secs(1));
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    w.clients[0].announce_metrics(Some(addr(9464))).unwrap();
    w.clients[2].announce_metrics(Some(addr(9466))).unwrap();
    w.run_for(Duration::from_secs(1));
    let (n0, n2) = (w.node(0), w.node(2));
    let listed: Vec<_> = w.gms.member_metrics().collect();
    assert_eq!(listed, vec![(n0, addr(9464)), (n2, addr(9466))]);
    let mut copy = Gms::new(GmsConfig::default()).unwrap();
    copy.restore(&w.gms.snapshot()).unwrap();
    assert_eq!(copy.member_metrics().collect::<Vec<_>>(), listed);
    // A new address replaces the old; `None` withdraws it; a member that leaves is gone.
    w.clients[0].announce_metrics(Some(addr(9470))).unwrap();
    w.clients[2].announce_metrics(None).unwrap();
    w.run_for(Duration::from_secs(1));
    assert_eq!(
        w.gms.member_metrics().collect::<Vec<_>>(),
        vec![(n0, addr(9470))]
    );
    w.clients[0].leave().unwrap();
    w.run_for(Duration::from_secs(1));
    assert_eq!(w.gms.member_metrics().count(), 0);
}

#[test]
fn the_incarnation_is_welcomed_and_kept_by_snapshots() {
    let mut w = World::new(2);
    assert_eq!(w.gms.incarnation(), 1);
    assert!(w.clients.iter().all(|c| c.incarnation() == 1));
    let config = GmsConfig {
        incarnation: 0x5eed,
        ..GmsConfig::default()
    };
    let mut replica = Gms::new_replicated(config.clone()).unwrap();
    assert_eq!(replica.incarnation(), 0);
    replica.lead(Time::ZERO);
    let first = replica
        .poll_decision()
        .expect("the incarnation is decided first");
    assert_eq!(
        first,
        crate::Decision::Command(crate::Command::Incarnate {
            incarnation: 0x5eed
        })
    );
    replica.apply_decision(Time::ZERO, first);
    // Taken once: a later decision does not change it.
    replica.apply_decision(
        Time::ZERO,
        crate::Decision::Command(crate::Command::Incarnate { incarnation: 9 }),
    );
    assert_eq!(replica.incarnation(), 0x5eed);
    let mut other = Gms::new_replicated(GmsConfig {
        incarnation: 3,
        ..config
    })
    .unwrap();
    other.restore(&replica.snapshot()).unwrap();
    assert_eq!(other.incarnation(), 0x5eed);
    // A new leader of a state that has one decides none.
    other.lead(Time::ZERO);
    assert_eq!(other.poll_decision(), None);
    w.gms
        .apply(w.now, crate::Command::Incarnate { incarnation: 5 });
    assert_eq!(w.gms.incarnation(), 1);
    assert_eq!(
        GmsConfig {
            incarnation: 0,
            ..GmsConfig::default()
        }
        .validate(),
        Err(crate::ConfigError::Zero("incarnation"))
    );
}

#[test]
fn join_gives_an_id_and_an_empty_membership() {
    let w = World::new(2);
    assert_ne!(w.node(0), w.node(1));
    assert!(w.events.contains(&(0, ClientEvent::Joined(w.node(0)))));
    let nothing = Membership {
        subscriptions: Some(BTreeSet::new()),
        ..Membership::default()
    };
    assert_eq!(w.last_membership(0), Some(&nothing));
    assert_eq!(w.gms.members().count(), 2);
}

#[test]
fn a_join_with_a_members_nonce_from_another_address_is_not_welcomed() {
    let mut gms = Gms::new(GmsConfig::default()).unwrap();
    // The answers to joins: (welcomes, nonce-taken notices).
    let welcomes = |gms: &mut Gms| {
        let sent: Vec<GmsMessage> = std::iter::from_fn(|| gms.poll_transmit())
            .filter(|t| t.to == Peer::Joiner(42))
            .map(|t| t.msg)
            .collect();
        let count = |f: fn(&GmsMessage) -> bool| sent.iter().filter(|m| f(m)).count();
        (
            count(|m| matches!(m, GmsMessage::Welcome { .. })),
            count(|m| matches!(m, GmsMessage::NonceTaken { nonce: 42 })),
        )
    };
    let join = |i| GmsMessage::Join {
        nonce: 42,
        addr: Some(client_addr(i)),
    };
    gms.handle_message(Time::ZERO, Peer::Joiner(42), join(0));
    assert_eq!(welcomes(&mut gms), (1, 0));
    // Another process drew the same nonce: welcoming it would give it the first one's id, and
    // the two would share one node's update stream. It is told to draw another.
    gms.handle_message(Time::ZERO, Peer::Joiner(42), join(1));
    assert_eq!(welcomes(&mut gms), (0, 1));
    assert_eq!(gms.stats().joins_conflicting, 1);
    assert_eq!(gms.members().count(), 1);
    // The first joiner's own repeated join (its welcome lost) is still answered.
    gms.handle_message(Time::ZERO, Peer::Joiner(42), join(0));
    assert_eq!(welcomes(&mut gms), (1, 0));
}

#[test]
fn a_joiner_told_its_nonce_is_taken_joins_again_with_another() {
    let mut client = GmsClient::new(ClientConfig::default()).unwrap();
    client.handle_timeout(Time::ZERO);
    let first = client.nonce();
    assert!(matches!(
        client.poll_transmit(),
        Some((0, GmsMessage::Join { nonce, .. })) if nonce == first
    ));
    // A notice about another nonce is not for this joiner.
    client.handle_message(Time::ZERO, 0, GmsMessage::NonceTaken { nonce: first ^ 1 });
    assert_eq!(client.nonce(), first);
    client.handle_message(Time::ZERO, 0, GmsMessage::NonceTaken { nonce: first });
    let second = client.nonce();
    assert_ne!(second, first);
    assert_eq!(client.stats().nonces_taken, 1);
    // The new join goes at once, not after the retransmission interval.
    assert_eq!(client.poll_timeout(), Some(Time::ZERO));
    client.handle_timeout(Time::ZERO);
    assert!(matches!(
        client.poll_transmit(),
        Some((0, GmsMessage::Join { nonce, .. })) if nonce == second
    ));
}

#[test]
fn subscribers_form_a_region_with_partitions_and_an_address() {
    let mut w = World::new(3);
    for i in 0..3 {
        w.clients[i].subscribe("quotes").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let topic = w.gms.topic_id("quotes").unwrap();
    assert_eq!(w.clients[0].topic_id("quotes"), Some(topic));
    for i in 0..3 {
        let m = w.last_membership(i).unwrap();
        assert_eq!(m, &w.expected(i, &[]));
        assert_eq!(m.regions.len(), 1);
        let view = m.regions.values().next().unwrap();
        assert_eq!(view.member_count(), 3);
        assert_eq!(view.topics, vec![topic]);
        assert!(matches!(
            w.clients[i].region_address(view.region),
            Some(RegionAddress::Multicast {
                group: [239, 192, _, _],
                port: 7400
            })
        ));
    }
}

#[test]
fn region_groups_are_spread_over_the_pools_ports() {
    let mut w = World::new(3);
    // Each client alone on its topic: a region each, groups 0, 1 and 2 of the pool.
    for i in 0..3 {
        w.clients[i].subscribe(&format!("t{i}")).unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let pool = GmsConfig::default().multicast_pool.unwrap();
    let mut ports = BTreeSet::new();
    for i in 0..3 {
        let m = w.last_membership(i).unwrap();
        assert_eq!(m.regions.len(), 1);
        let region = *m.regions.keys().next().unwrap();
        let Some(RegionAddress::Multicast { group, port }) = w.clients[i].region_address(region)
        else {
            panic!("region {region:?} has no group");
        };
        let index = u32::from_be_bytes(group) & (pool.size() - 1);
        assert_eq!(port, pool.port_of(index));
        assert_eq!(port, 7400 + index as u16 % MulticastPool::PORTS_DEFAULT);
        ports.insert(port);
    }
    assert_eq!(ports.len(), 3, "each group on a port of its own: {ports:?}");
}

#[test]
fn regions_past_groups_max_share_the_least_loaded_group() {
    let mut config = GmsConfig::default();
    let pool = config.multicast_pool.as_mut().unwrap();
    pool.groups_max = 2;
    let pool = *pool;
    let mut w = World::with_config(5, config);
    // Each client alone on its topic: five regions over two groups.
    for i in 0..5 {
        w.clients[i].subscribe(&format!("t{i}")).unwrap();
        w.run_for(Duration::from_millis(10));
    }
    let group_of = |w: &World, i: usize| {
        let m = w.last_membership(i).unwrap();
        let region = *m.regions.keys().next().unwrap();
        match w.clients[i].region_address(region) {
            Some(RegionAddress::Multicast { group, port }) => {
                let index = u32::from_be_bytes(group) & (pool.size() - 1);
                assert_eq!(port, pool.port_of(index));
                index
            }
            other => panic!("region {region:?} has no group: {other:?}"),
        }
    };
    let groups: Vec<u32> = (0..5).map(|i| group_of(&w, i)).collect();
    assert_eq!(groups, [0, 1, 0, 1, 0]);
    assert_eq!(w.gms.stats().group_shares, 3);
    // Clients 0 and 2 leave their topics: group 0 carries one region (client 4's) against
    // group 1's two, so the next region takes group 0.
    w.clients[0].unsubscribe("t0").unwrap();
    w.clients[2].unsubscribe("t2").unwrap();
    w.run_for(Duration::from_millis(10));
    w.clients[0].subscribe("u").unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(group_of(&w, 0), 0);
}

#[test]
fn a_pool_without_ports_or_past_the_last_port_is_refused() {
    for (port, ports) in [(7400, 0), (65_500, 64)] {
        let config = GmsConfig {
            multicast_pool: Some(MulticastPool {
                base: [239, 192, 0, 0],
                prefix_len: 14,
                port,
                ports,
                groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
            }),
            ..GmsConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(crate::ConfigError::Ports { port, ports }),
            "{port} + {ports}"
        );
    }
    let last = GmsConfig {
        multicast_pool: Some(MulticastPool {
            base: [239, 192, 0, 0],
            prefix_len: 14,
            port: 65_472,
            ports: 64,
            groups_max: MulticastPool::GROUPS_MAX_DEFAULT,
        }),
        ..GmsConfig::default()
    };
    assert_eq!(last.validate(), Ok(()), "ports up to 65535");
}

#[test]
fn a_node_is_told_only_what_concerns_it() {
    let mut w = World::new(4);
    w.clients[0].subscribe("a").unwrap();
    w.clients[1].subscribe("a").unwrap();
    w.clients[2].subscribe("b").unwrap();
    // Node 3 publishes on "a" without subscribing: it needs a's regions, and nothing of b's.
    w.clients[3].advertise("a").unwrap();
    w.run_for(Duration::from_millis(10));
    let a = w.gms.topic_id("a").unwrap();
    let b = w.gms.topic_id("b").unwrap();
    let ra: Vec<_> = w.gms.planner().topic_regions(a).collect();
    let rb: Vec<_> = w.gms.planner().topic_regions(b).collect();
    let m0 = w.last_membership(0).unwrap();
    assert_eq!(m0.regions.keys().copied().collect::<Vec<_>>(), ra);
    let m2 = w.last_membership(2).unwrap();
    assert_eq!(m2.regions.keys().copied().collect::<Vec<_>>(), rb);
    let m3 = w.last_membership(3).unwrap();
    assert_eq!(m3.regions.keys().copied().collect::<Vec<_>>(), ra);
    assert_eq!(m3.topic_regions.get(&a), Some(&ra));
    assert_eq!(m3, &w.expected(3, &["a"]));
    // No item about b's region ever went to nodes 0, 1, 3.
    for i in [0, 1, 3] {
        for m in &w.delivered[i] {
            if let GmsMessage::Update { items, .. } = m {
                for item in items {
                    if let Item::Region(v) = item {
                        assert!(!rb.contains(&v.view.region), "node {i} told about b");
                    }
                }
            }
        }
    }
}

#[test]
fn a_crash_is_detected_by_heartbeats_and_only_survivors_get_new_views() {
    let mut w = World::new(3);
    for i in 0..3 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let dead = w.node(2);
    let region = *w.last_membership(0).unwrap().regions.keys().next().unwrap();
    let view_before = w.gms.view_of(region).unwrap();
    w.crashed.insert(2);
    let crashed_at = w.now;
    let delivered_before = w.delivered[2].len();
    w.run_for(Duration::from_millis(2900));
    assert!(w.gms.members().any(|n| n == dead), "not before the timeout");
    w.run_for(Duration::from_millis(200));
    assert!(w.gms_events.contains(&GmsEvent::Removed {
        node: dead,
        cause: RemoveCause::HeartbeatTimeout
    }));
    assert!(w.now >= crashed_at + Duration::from_secs(3));
    for i in 0..2 {
        let m = w.last_membership(i).unwrap();
        let view = &m.regions[&region];
        assert_eq!(view.member_count(), 2);
        assert!(view.view > view_before);
        assert_eq!(m, &w.expected(i, &[]));
    }
    assert_eq!(
        w.delivered[2].len(),
        delivered_before,
        "nothing reaches the dead"
    );
}

#[test]
fn a_suspicion_from_a_ring_neighbour_speeds_removal_up() {
    let mut w = World::new(4);
    for i in 0..3 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.clients[3].subscribe("other").unwrap();
    w.run_for(Duration::from_millis(10));
    let dead = w.node(2);
    w.crashed.insert(2);
    // Node 3 shares no region with the suspect: its suspicion is ignored.
    w.clients[3].suspect(dead).unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.gms.stats().suspicions_ignored, 1);
    w.clients[0].suspect(dead).unwrap();
    w.run_for(Duration::from_millis(1100));
    assert_eq!(w.gms.stats().suspicions_accepted, 1);
    assert!(w.gms_events.contains(&GmsEvent::Removed {
        node: dead,
        cause: RemoveCause::Suspected
    }));
    assert!(w.now < Time::ZERO + Duration::from_secs(2));
}

#[test]
fn a_suspected_node_that_speaks_stays() {
    let mut w = World::new(3);
    for i in 0..3 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let alive = w.node(2);
    w.clients[0].suspect(alive).unwrap();
    w.run_for(Duration::from_secs(5));
    assert!(w.gms.members().any(|n| n == alive));
}

#[test]
fn lost_updates_are_resent_and_applied_in_order_exactly_once() {
    // Small datagrams (one or two items each), so that losses leave gaps inside the window.
    let mut w = World::with_config(
        3,
        GmsConfig {
            update_bytes_max: 40,
            ..GmsConfig::default()
        },
    );
    // Drop two of every three updates to client 0, for a while.
    let mut count = 0u32;
    w.keep_to = Box::new(move |i, m| {
        if i == 0 && matches!(m, GmsMessage::Update { .. }) {
            count += 1;
            return count.is_multiple_of(3) || count > 60;
        }
        true
    });
    for name in ["x", "y", "z"] {
        for i in 0..3 {
            w.clients[i].subscribe(name).unwrap();
        }
    }
    w.clients[1].unsubscribe("y").unwrap();
    w.clients[0].advertise("y").unwrap();
    w.run_for(Duration::from_secs(3));
    assert!(w.gms.stats().updates_retransmitted > 0);
    let stats = w.clients[0].stats().clone();
    assert!(stats.updates_duplicate + stats.updates_reordered > 0);
    // Applied exactly once each: the count of applied items is the stream's length.
    let seqs: BTreeSet<u64> = w.delivered[0]
        .iter()
        .flat_map(|m| match m {
            GmsMessage::Update { seq, items } if *seq > 0 => *seq..*seq + items.len() as u64,
            _ => 0..0,
        })
        .collect();
    assert_eq!(stats.updates_applied, seqs.len() as u64);
    assert_eq!(seqs.iter().copied().max(), Some(seqs.len() as u64));
    for i in 0..3 {
        let publishes: &[&str] = if i == 0 { &["y"] } else { &[] };
        assert_eq!(
            w.last_membership(i).unwrap(),
            &w.expected(i, publishes),
            "client {i}"
        );
    }
}

#[test]
fn lost_requests_and_welcomes_are_resent() {
    let mut w = World::new(0);
    w.clients
        .push(GmsClient::new(ClientConfig::default()).unwrap());
    w.delivered.push(Vec::new());
    let mut dropped = 0;
    w.keep_to = Box::new(move |_, m| {
        if matches!(
            m,
            GmsMessage::Welcome { .. } | GmsMessage::RequestAck { .. }
        ) && dropped < 2
        {
            dropped += 1;
            return false;
        }
        true
    });
    w.clients[0].subscribe("late").unwrap();
    w.run_for(Duration::from_secs(1));
    assert!(w.clients[0].node().is_some());
    assert_eq!(
        w.gms.members().count(),
        1,
        "a resent Join does not make a second node"
    );
    assert!(w.clients[0].topic_id("late").is_some());
    assert_eq!(w.last_membership(0).unwrap().regions.len(), 1);
}

#[test]
fn leaving_removes_the_node_and_updates_the_others() {
    let mut w = World::new(3);
    for i in 0..3 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let leaver = w.node(1);
    w.clients[1].leave().unwrap();
    w.run_for(Duration::from_millis(10));
    assert!(w.gms_events.contains(&GmsEvent::Removed {
        node: leaver,
        cause: RemoveCause::Left
    }));
    assert!(w.clients[1].is_removed());
    assert!(w.events.contains(&(1, ClientEvent::Removed)));
    let m = w.last_membership(0).unwrap();
    assert_eq!(m.regions.values().next().unwrap().member_count(), 2);
    // A removed node's later messages are counted, not applied.
    let before = w.gms.stats().unexpected;
    w.gms
        .handle_message(w.now, Peer::Node(leaver), GmsMessage::Heartbeat);
    assert_eq!(w.gms.stats().unexpected, before + 1);
}

#[test]
fn malformed_messages_are_counted_and_dropped() {
    let mut w = World::new(1);
    let n = w.node(0);
    w.gms.handle_datagram(w.now, Peer::Node(n), &[]);
    w.gms.handle_datagram(w.now, Peer::Node(n), &[200, 1, 2]);
    w.gms.handle_datagram(
        w.now,
        Peer::Node(n),
        &[3, 1, 0, 0, 0, 0, 0, 0, 0, 1, 255, 255],
    );
    assert_eq!(w.gms.stats().malformed, 3);
    w.clients[0].handle_datagram(w.now, 0, &[6, 1]);
    assert_eq!(w.clients[0].stats().malformed, 1);
    assert_eq!(w.gms.members().count(), 1);
}

#[test]
fn many_changes_under_loss_converge_to_the_gms_state() {
    let mut w = World::new(8);
    let mut rng = fastrand::Rng::with_seed(5);
    let mut seen = 0u64;
    w.keep_to = Box::new(move |_, _| {
        seen += 1;
        // 20% loss, deterministic.
        !(seen.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).is_multiple_of(5)
    });
    let names = ["a", "b", "c", "d", "e"];
    let mut publishes: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for _ in 0..60 {
        let i = rng.usize(..8);
        let name = names[rng.usize(..names.len())];
        match rng.u8(..4) {
            0 | 1 => w.clients[i].subscribe(name).unwrap(),
            2 => w.clients[i].unsubscribe(name).unwrap(),
            _ => {
                w.clients[i].advertise(name).unwrap();
                publishes.entry(i).or_default().insert(name);
            }
        }
        w.run_for(Duration::from_millis(rng.u64(1..30)));
    }
    w.run_for(Duration::from_secs(2));
    assert_eq!(w.gms.members().count(), 8, "loss alone removes nobody");
    w.gms.planner().check_invariants().unwrap();
    for i in 0..8 {
        let p: Vec<&str> = publishes.get(&i).into_iter().flatten().copied().collect();
        assert_eq!(
            w.last_membership(i).unwrap(),
            &w.expected(i, &p),
            "client {i}"
        );
        assert_eq!(&w.clients[i].membership(), &w.expected(i, &p));
    }
}

#[test]
fn nodes_learn_the_addresses_of_their_region_members_and_publishers_only() {
    let mut w = World::new(5);
    w.clients[0].subscribe("a").unwrap();
    w.clients[1].subscribe("a").unwrap();
    w.clients[2].subscribe("b").unwrap();
    w.clients[3].subscribe("b").unwrap();
    w.run_for(Duration::from_millis(10));
    // Node 4 publishes on "a": the members of a's region learn its address, and it theirs.
    w.clients[4].advertise("a").unwrap();
    w.run_for(Duration::from_millis(10));
    w.assert_knows_addresses_of(0, &[1, 4]);
    w.assert_knows_addresses_of(1, &[0, 4]);
    w.assert_knows_addresses_of(4, &[0, 1]);
    w.assert_knows_addresses_of(2, &[3]);
    // In stream order, every member of a view arrived with an address before the view.
    for i in 0..5 {
        let me = w.node(i);
        let mut stream = BTreeMap::new();
        for m in &w.delivered[i] {
            if let GmsMessage::Update { seq, items } = m {
                for (k, item) in items.iter().enumerate() {
                    stream.insert(seq + k as u64, item.clone());
                }
            }
        }
        let mut known = BTreeSet::new();
        for item in stream.values() {
            match item {
                Item::NodeAddress { node, .. } => {
                    known.insert(*node);
                }
                Item::Region(v) => {
                    for n in v.view.partitions.iter().flatten() {
                        assert!(
                            *n == me || known.contains(n),
                            "node {i}: {n:?} before its address"
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

/// A second publisher of a topic is someone the first is told of, as the members are, even
/// though nothing about the first publisher's topics or regions changed (the sync scope of a
/// region's audience includes its publishers: the service's debug check caught the `tidings
/// demo` run that missed it).
#[test]
fn a_second_publisher_of_a_topic_and_the_first_learn_each_others_address() {
    let mut w = World::new(3);
    w.clients[0].subscribe("a").unwrap();
    w.run_for(Duration::from_millis(10));
    w.clients[1].advertise("a").unwrap();
    w.run_for(Duration::from_millis(10));
    w.clients[2].advertise("a").unwrap();
    w.run_for(Duration::from_millis(10));
    w.assert_knows_addresses_of(0, &[1, 2]);
    w.assert_knows_addresses_of(1, &[0, 2]);
    w.assert_knows_addresses_of(2, &[0, 1]);
}

#[test]
fn consecutive_updates_are_packed_into_few_datagrams() {
    let mut w = World::new(2);
    for k in 0..40 {
        w.clients[0].subscribe(&format!("topic-{k}")).unwrap();
    }
    w.run_for(Duration::from_millis(100));
    let datagrams = w.delivered[0]
        .iter()
        .filter(|m| matches!(m, GmsMessage::Update { .. }))
        .count();
    let items: usize = w.delivered[0]
        .iter()
        .map(|m| match m {
            GmsMessage::Update { items, .. } => items.len(),
            _ => 0,
        })
        .sum();
    // A TopicBound per subscribe at least (the 40 topics share one region: its view comes once
    // the round of requests is planned).
    assert!(items >= 41, "a TopicBound per subscribe at least: {items}");
    assert!(
        datagrams * 4 <= items,
        "{items} items in {datagrams} datagrams: not packed"
    );
    for m in &w.delivered[0] {
        assert!(m.to_bytes().len() <= GmsConfig::default().update_bytes_max.max(200));
    }
}

#[test]
fn a_queued_request_is_due_at_once() {
    let mut w = World::new(1);
    w.run_for(Duration::from_millis(10));
    let now = w.now;
    w.clients[0].subscribe("t").unwrap();
    // The host learns that the request must go now, not at the next heartbeat.
    assert!(w.clients[0].poll_timeout().is_some_and(|t| t <= now));
    w.clients[0].handle_timeout(now);
    let sent: Vec<GmsMessage> =
        std::iter::from_fn(|| w.clients[0].poll_transmit().map(|(_, m)| m)).collect();
    assert!(
        sent.iter().any(|m| matches!(m, GmsMessage::Request { .. })),
        "{sent:?}"
    );
    // Once sent, it waits for the retransmission interval.
    assert!(w.clients[0].poll_timeout().is_some_and(|t| t > now));
}

#[test]
fn suspicions_are_accepted_along_the_token_rings_of_the_partitioned_view() {
    // 14 members of one region: two partitions of 7 (partition_size 6), leaders 0 and 7.
    let mut w = World::new(14);
    for i in 0..14 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let r = w
        .gms
        .planner()
        .topic_regions(w.gms.topic_id("t").unwrap())
        .next()
        .unwrap();
    let view = w
        .gms
        .planner()
        .region_view(r, (ViewId(1), ViewId(1)), 6)
        .unwrap();
    assert_eq!(view.partitions.len(), 2);
    let (p0, p1) = (&view.partitions[0], &view.partitions[1]);
    let ids: Vec<NodeId> = (0..14).map(|i| w.node(i)).collect();
    let index = |n: NodeId| ids.iter().position(|&x| x == n).unwrap();
    // A non-leader of partition 0 suspecting a member of partition 1: no shared ring.
    w.clients[index(p0[2])].suspect(p1[3]).unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.gms.stats().suspicions_ignored, 1);
    assert_eq!(w.gms.stats().suspicions_accepted, 0);
    // The wrap-around of partition 0's ring (last member, first member): accepted.
    w.clients[index(p0[6])].suspect(p0[0]).unwrap();
    // Leader to leader (the ring of partition leaders): accepted.
    w.clients[index(p0[0])].suspect(p1[0]).unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.gms.stats().suspicions_accepted, 2);
}

#[test]
fn a_suspected_node_gets_the_whole_suspicion_timeout_to_speak() {
    let mut w = World::new(3);
    for i in 0..3 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    let dead = w.node(2);
    w.crashed.insert(2);
    // Silent for 900 ms, then suspected: the 1 s suspicion timeout counts from the suspicion.
    w.run_for(Duration::from_millis(900));
    w.clients[0].suspect(dead).unwrap();
    w.run_for(Duration::from_millis(300));
    assert!(
        w.gms.members().any(|n| n == dead),
        "removed before it could speak"
    );
    w.run_for(Duration::from_millis(900));
    assert!(w.gms_events.contains(&GmsEvent::Removed {
        node: dead,
        cause: RemoveCause::Suspected
    }));
}

/// A live node suspected by a ring neighbour whose heartbeats are lost (all of them, here) is
/// probed, answers, and stays; the same node deaf to the probes is removed at the suspicion
/// timeout, as a crashed one would be.
#[test]
fn a_suspected_node_that_answers_the_probes_stays() {
    for answers in [true, false] {
        let mut w = World::new(3);
        for i in 0..3 {
            w.clients[i].subscribe("t").unwrap();
        }
        w.run_for(Duration::from_millis(10));
        let suspect = w.node(2);
        // Its heartbeats are lost; what it sends in answer to a probe arrives (or not).
        let probed = std::rc::Rc::new(std::cell::Cell::new(false));
        let seen = probed.clone();
        w.keep_to = Box::new(move |i, msg| {
            if i == 2 && matches!(msg, GmsMessage::Probe) {
                seen.set(true);
            }
            true
        });
        let answered = probed.clone();
        w.keep_from = Box::new(move |i, msg| {
            i != 2 || !matches!(msg, GmsMessage::Heartbeat) || (answers && answered.take())
        });
        w.clients[0].suspect(suspect).unwrap();
        w.run_for(Duration::from_millis(1500));
        let removed = w.gms_events.contains(&GmsEvent::Removed {
            node: suspect,
            cause: RemoveCause::Suspected,
        });
        assert_eq!(removed, !answers, "answers probes: {answers}");
        assert!(w.gms.stats().probes_sent >= 1);
        if answers {
            assert!(w.clients[2].stats().probes_answered >= 1);
        } else {
            assert_eq!(
                w.gms.stats().probes_sent,
                4,
                "one per quarter of the timeout"
            );
        }
    }
}

#[test]
fn membership_events_can_be_turned_off_and_the_membership_read_directly() {
    let mut w = World::new(3);
    w.clients[2].set_membership_events(false);
    w.events.clear();
    for i in 0..3 {
        w.clients[i].subscribe("quotes").unwrap();
    }
    w.run_for(Duration::from_millis(10));
    // Client 2 emits no membership events but holds the same membership as the others.
    assert!(w.last_membership(2).is_none());
    assert_eq!(w.clients[2].membership(), w.expected(2, &[]));
    assert_eq!(w.last_membership(0), Some(&w.expected(0, &[])));
    // Turned on again, the next committed batch is an event as before.
    w.clients[2].set_membership_events(true);
    w.clients[0].unsubscribe("quotes").unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.last_membership(2), Some(&w.expected(2, &[])));
}

/// `m` with every view's epoch set to 1: what a membership says apart from how many changes
/// led to it (a region's epoch counts the commands that changed it).
fn without_epochs(m: &Membership) -> Membership {
    let mut m = m.clone();
    for v in m.regions.values_mut() {
        v.view = ViewId(1);
        v.base = ViewId(1);
    }
    m
}

/// 300 names in batches (`subscribe_many`, `advertise_many`: three requests of at most 128)
/// end in the same memberships as one request per name (the topics share one subscriber, so
/// one region either way; only the views' epochs differ: a command each, or a batch each). The service syncs a node once for all the requests that
/// arrive together, so either way the clients install a membership per window of requests
/// in flight (64), not one per request: 600 requests one by one make about ten, the six
/// batches a few.
#[test]
fn batches_of_subscriptions_and_advertisements_are_told_in_one_update_per_batch() {
    let names: Vec<String> = (0..300).map(|i| format!("t/{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut outcomes = Vec::new();
    for batched in [false, true] {
        let mut w = World::new(2);
        if batched {
            for chunk in names.chunks(NAMES_PER_REQUEST_MAX) {
                w.clients[0].subscribe_many(chunk).unwrap();
                w.clients[1].advertise_many(chunk).unwrap();
            }
        } else {
            for name in &names {
                w.clients[0].subscribe(name).unwrap();
                w.clients[1].advertise(name).unwrap();
            }
        }
        w.run_for(Duration::from_millis(200));
        for name in &names {
            let topic = w.gms.topic_id(name).unwrap();
            assert_eq!(w.clients[0].topic_id(name), Some(topic));
            assert_eq!(w.clients[1].topic_id(name), Some(topic));
        }
        let m0 = w.last_membership(0).unwrap().clone();
        assert_eq!(m0, w.expected(0, &[]));
        let m1 = w.last_membership(1).unwrap().clone();
        assert_eq!(m1, w.expected(1, &refs));
        assert_eq!(m1.topic_regions.len(), 300);
        // Each committed batch of updates is one new membership for the node to install.
        let installs = w
            .events
            .iter()
            .filter(|(_, e)| matches!(e, ClientEvent::Membership(_)))
            .count();
        outcomes.push((m0, m1, installs));
    }
    let (one_by_one, batched) = (&outcomes[0], &outcomes[1]);
    assert_eq!(
        without_epochs(&batched.0),
        without_epochs(&one_by_one.0),
        "the subscriber's membership"
    );
    assert_eq!(
        without_epochs(&batched.1),
        without_epochs(&one_by_one.1),
        "the publisher's membership"
    );
    assert!(
        batched.2 <= 6 && one_by_one.2 <= 30,
        "memberships installed: {} batched, {} one by one (600 requests)",
        batched.2,
        one_by_one.2
    );
}

/// Unsubscribing in batches (`unsubscribe_many`) ends in the same memberships as one request
/// per name: both nodes subscribe to 300 topics (one region of both), then node 0 leaves 200
/// of them. Batched, that is two requests and commands instead of 200, and the node installs
/// a membership per batch at most (one by one, the service syncs per window of requests in
/// flight, as for subscriptions).
#[test]
fn batches_of_unsubscriptions_are_one_command_each() {
    let names: Vec<String> = (0..300).map(|i| format!("t/{i}")).collect();
    let mut outcomes = Vec::new();
    for batched in [false, true] {
        let mut w = World::new(2);
        for chunk in names.chunks(NAMES_PER_REQUEST_MAX) {
            w.clients[0].subscribe_many(chunk).unwrap();
            w.clients[1].subscribe_many(chunk).unwrap();
        }
        w.run_for(Duration::from_millis(200));
        let installs = |w: &World| {
            w.events
                .iter()
                .filter(|(c, e)| *c == 0 && matches!(e, ClientEvent::Membership(_)))
                .count()
        };
        let (commands_before, installs_before) = (w.gms.stats().commands, installs(&w));
        let leaving = &names[..200];
        if batched {
            for chunk in leaving.chunks(NAMES_PER_REQUEST_MAX) {
                w.clients[0].unsubscribe_many(chunk).unwrap();
            }
        } else {
            for name in leaving {
                w.clients[0].unsubscribe(name).unwrap();
            }
        }
        w.run_for(Duration::from_millis(200));
        let m0 = w.clients[0].membership().clone();
        assert_eq!(m0, w.expected(0, &[]));
        let topics: usize = m0.regions.values().map(|r| r.topics.len()).sum();
        assert_eq!(topics, 100, "the node's regions hold the topics it kept");
        let m1 = w.clients[1].membership().clone();
        assert_eq!(m1, w.expected(1, &[]));
        let commands = w.gms.stats().commands - commands_before;
        outcomes.push((m0, m1, commands, installs(&w) - installs_before));
    }
    let (one_by_one, batched) = (&outcomes[0], &outcomes[1]);
    assert_eq!(
        without_epochs(&batched.0),
        without_epochs(&one_by_one.0),
        "the membership of the node that left"
    );
    assert_eq!(
        without_epochs(&batched.1),
        without_epochs(&one_by_one.1),
        "the other node's membership"
    );
    assert_eq!((one_by_one.2, batched.2), (200, 2), "commands");
    assert!(
        (1..=2).contains(&batched.3) && batched.3 <= one_by_one.3,
        "memberships installed: {} batched, {} one by one",
        batched.3,
        one_by_one.3
    );
}

/// A sync compares only what a change touched: with a publisher of 1,000 topics (each a region
/// of its own with one subscriber), one more topic costs the service a comparison of a few
/// regions, not of the publisher's 1,000 (a pass over every region of the node per sync, as
/// before scopes, made a publisher's batch of requests cost it O(topics) at 100,000 topics).
/// Both nodes still end with exactly the membership the service's state gives them.
#[test]
fn a_sync_compares_the_regions_a_change_touched_not_all_the_nodes_regions() {
    let names: Vec<String> = (0..1000).map(|i| format!("t/{i}")).collect();
    let mut w = World::new(2);
    for chunk in names.chunks(NAMES_PER_REQUEST_MAX) {
        w.clients[0].subscribe_many(chunk).unwrap();
        w.clients[1].advertise_many(chunk).unwrap();
    }
    w.run_for(Duration::from_millis(200));
    let before = w.gms.stats().clone();
    w.clients[0].subscribe("extra").unwrap();
    w.clients[1].advertise("extra").unwrap();
    w.run_for(Duration::from_millis(200));
    let after = w.gms.stats();
    let (syncs, compared) = (
        after.syncs - before.syncs,
        after.sync_regions_compared - before.sync_regions_compared,
    );
    assert!(syncs >= 2, "both nodes synced: {syncs}");
    assert!(
        compared <= 4 * syncs,
        "{compared} regions compared over {syncs} syncs for one new topic"
    );
    let mut refs: Vec<&str> = names.iter().map(String::as_str).collect();
    refs.push("extra");
    assert_eq!(w.last_membership(0), Some(&w.expected(0, &[])));
    assert_eq!(w.last_membership(1), Some(&w.expected(1, &refs)));
    assert_eq!(w.last_membership(1).unwrap().topic_regions.len(), 1001);
}

/// A host that installs changes (`take_change`, with the events off) ends with the membership
/// the events would have given it, and never sees part of a batch: the items of a batch whose
/// `Commit` has not arrived change nothing yet.
#[test]
fn changes_add_up_to_the_membership_and_come_a_whole_batch_at_a_time() {
    let names: Vec<String> = (0..200).map(|i| format!("t/{i}")).collect();
    let mut w = World::new(2);
    w.clients[1].set_membership_events(false);
    // Node 1 only publishes: its membership says it subscribes to nothing.
    let mut installed = Membership {
        subscriptions: Some(BTreeSet::new()),
        ..Membership::default()
    };
    let apply = |change: tidings_proto::MembershipChange, m: &mut Membership| {
        for (r, v) in change.regions {
            match v {
                Some(v) => m.regions.insert(r, v),
                None => m.regions.remove(&r),
            };
        }
        for (t, l) in change.topic_regions {
            match l {
                Some(l) => m.topic_regions.insert(t, l),
                None => m.topic_regions.remove(&t),
            };
        }
    };
    for (k, chunk) in names.chunks(NAMES_PER_REQUEST_MAX).enumerate() {
        w.clients[0].subscribe_many(chunk).unwrap();
        w.clients[1].advertise_many(chunk).unwrap();
        if k == 0 {
            let applied = w.clients[1].stats().updates_applied;
            // Hold back every Commit: the items before it are received, not applied.
            w.keep_to = Box::new(|i, m| {
                i != 1
                    || !matches!(m, GmsMessage::Update { items, .. } if items.iter().any(|x| matches!(x, Item::Commit)))
            });
            w.run_for(Duration::from_millis(20));
            assert!(
                w.clients[1].stats().updates_applied > applied,
                "items of the batch arrived"
            );
            assert!(
                w.clients[1].take_change().is_empty(),
                "part of a batch leaked"
            );
            w.keep_to = Box::new(|_, _| true);
        }
        w.run_for(Duration::from_millis(200));
        apply(w.clients[1].take_change(), &mut installed);
        assert_eq!(installed, w.clients[1].membership());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(installed, w.expected(1, &refs));
    unsubscribe_half(&mut w, &names);
    apply(w.clients[1].take_change(), &mut installed);
    assert_eq!(installed, w.expected(1, &refs));
}

fn unsubscribe_half(w: &mut World, names: &[String]) {
    for name in names.iter().step_by(2) {
        w.clients[0].unsubscribe(name).unwrap();
    }
    w.run_for(Duration::from_millis(300));
}

#[test]
fn a_batch_must_hold_one_to_the_most_names_and_valid_names() {
    let mut w = World::new(1);
    let too_many: Vec<String> = (0..=NAMES_PER_REQUEST_MAX)
        .map(|i| format!("{i}"))
        .collect();
    assert_eq!(w.clients[0].subscribe_many(&[]), Err(RequestError::TooMany));
    assert_eq!(
        w.clients[0].advertise_many(&too_many),
        Err(RequestError::TooMany)
    );
    let bad = vec!["ok".to_owned(), String::new()];
    assert_eq!(w.clients[0].subscribe_many(&bad), Err(RequestError::Name));
    let long = vec!["x".repeat(TOPIC_NAME_BYTES_MAX + 1)];
    assert_eq!(w.clients[0].advertise_many(&long), Err(RequestError::Name));
}

/// The demo's pattern: three subscribers each take about 70% of 30 topics, one request at a
/// time, interleaved at random, then two publishers advertise all 30; 2% of the service's
/// messages are lost. Every seed must converge to the service's state with the planner's
/// invariants intact (a failing seed is named).
#[test]
fn interleaved_overlapping_subscriptions_converge_over_many_seeds() {
    for seed in 0..300u64 {
        let r = std::panic::catch_unwind(|| overlapping_subscriptions(seed));
        assert!(r.is_ok(), "seed {seed} failed");
    }
}

fn overlapping_subscriptions(seed: u64) {
    let mut w = World::with_config(
        5,
        GmsConfig {
            multicast_pool: Some(crate::MulticastPool {
                base: [239, 255, 7, 0],
                prefix_len: 24,
                port: 5000,
                ports: crate::MulticastPool::PORTS_DEFAULT,
                groups_max: crate::MulticastPool::GROUPS_MAX_DEFAULT,
            }),
            ..GmsConfig::default()
        },
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut seen = seed;
    w.keep_to = Box::new(move |_, _| {
        seen += 1;
        !(seen.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).is_multiple_of(50)
    });
    let takes = |s: u64, t: u64| (t * 7 + s * 13 + (t / 10) * 3) % 10 < 7;
    let names: Vec<String> = (0..30).map(|t| format!("demo/{t}")).collect();
    let mut queues: Vec<Vec<usize>> = (0..3u64)
        .map(|s| (0..30).filter(|&t| takes(s, t as u64)).rev().collect())
        .collect();
    queues.extend((0..2).map(|_| (0..30).rev().collect::<Vec<usize>>()));
    // Subscribers first, then publishers (as the demo starts them).
    for (clients, offset) in [(0..3, 0), (3..5, 3)] {
        while clients.clone().any(|i| !queues[i].is_empty()) {
            let i = offset + rng.usize(..clients.len());
            if let Some(t) = queues[i].pop() {
                if i < 3 {
                    w.clients[i].subscribe(&names[t]).unwrap();
                } else {
                    w.clients[i].advertise(&names[t]).unwrap();
                }
            }
            if rng.u8(..3) == 0 {
                w.run_for(Duration::from_millis(rng.u64(0..5)));
            }
        }
    }
    w.run_for(Duration::from_secs(2));
    w.gms.planner().check_invariants().unwrap();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    for i in 0..5 {
        let publishes = if i < 3 { &[][..] } else { &all[..] };
        let m = w.clients[i].membership();
        assert_eq!(&m, &w.expected(i, publishes), "client {i}");
        // Each subscriber is in a region carrying each of its topics; each publisher knows
        // the regions of all 30.
        let me = w.node(i);
        for (t, name) in names.iter().enumerate() {
            let id = w.gms.topic_id(name).unwrap();
            let carried = m
                .regions
                .values()
                .any(|v| v.topics.contains(&id) && v.partition_of(me).is_some());
            if i < 3 {
                assert_eq!(carried, takes(i as u64, t as u64), "client {i} topic {t}");
            } else {
                assert!(m.topic_regions.get(&id).is_some_and(|r| !r.is_empty()));
            }
        }
    }
}

/// A region that only gains a topic keeps its view base, so its streams go on (ADR 30); a
/// member leaving or joining it starts a new base.
#[test]
fn a_region_that_only_gains_topics_keeps_its_base() {
    let mut w = World::new(3);
    for i in 0..2 {
        w.clients[i].subscribe("a").unwrap();
    }
    w.run_for(Duration::from_millis(100));
    let region_of = |w: &World, name: &str| {
        let t = w.gms.topic_id(name).unwrap();
        let regions: Vec<tidings_proto::RegionId> = w.gms.planner().topic_regions(t).collect();
        assert_eq!(regions.len(), 1, "{name}");
        regions[0]
    };
    let shared = region_of(&w, "a");
    let (view, base) = (
        w.gms.view_of(shared).unwrap(),
        w.gms.base_of(shared).unwrap(),
    );
    assert_eq!(view, base);
    // "b" of client 0 alone, then of both: it joins the region of exactly its subscribers.
    w.clients[0].subscribe("b").unwrap();
    w.run_for(Duration::from_millis(100));
    let continued_before = w.gms.stats().views_continued;
    w.clients[1].subscribe("b").unwrap();
    w.run_for(Duration::from_millis(100));
    assert_eq!(region_of(&w, "b"), shared);
    assert!(w.gms.view_of(shared).unwrap() > view);
    assert_eq!(
        w.gms.base_of(shared).unwrap(),
        base,
        "gaining a topic keeps the base"
    );
    assert_eq!(w.gms.stats().views_continued, continued_before + 1);
    for i in 0..2 {
        let v = &w.clients[i].membership().regions[&shared];
        assert_eq!((v.base, v.topics.len()), (base, 2), "client {i}");
    }
    // Client 1 drops "b": it moves to a region of "a" alone, and the shared one restarts.
    w.clients[1].unsubscribe("b").unwrap();
    w.run_for(Duration::from_millis(100));
    let now = w.gms.view_of(shared).unwrap();
    assert_eq!(w.gms.planner().region(shared).unwrap().members.len(), 1);
    assert_eq!(
        w.gms.base_of(shared).unwrap(),
        now,
        "a member leaving restarts"
    );
    // Client 2 takes both: it joins the region, which restarts again.
    w.clients[2].subscribe("a").unwrap();
    w.clients[2].subscribe("b").unwrap();
    w.run_for(Duration::from_millis(100));
    assert_eq!(w.gms.planner().region(shared).unwrap().members.len(), 2);
    let later = w.gms.view_of(shared).unwrap();
    assert!(later > now);
    assert_eq!(
        w.gms.base_of(shared).unwrap(),
        later,
        "a member joining restarts"
    );
}

/// A world whose service hands out region keys, its master secret drawn from the host's
/// entropy.
fn keyed_world(n: usize) -> World {
    keyed_world_with(n, GmsConfig::default())
}

fn keyed_world_with(n: usize, config: GmsConfig) -> World {
    let mut w = World::with_config(
        n,
        GmsConfig {
            datagram_keys: true,
            ..config
        },
    );
    w.gms.give_key_entropy([1; 32]);
    w.pump();
    w
}

/// The region a topic is in (the tests below use topics alone in their region).
fn region_of(w: &World, topic: &str) -> tidings_wire::RegionId {
    let t = w.gms.topic_id(topic).unwrap();
    let regions: Vec<_> = w.gms.planner().topic_regions(t).collect();
    assert_eq!(regions.len(), 1, "{topic}: {regions:?}");
    regions[0]
}

/// Each client holds exactly the keys of the regions whose views the service sent it, each
/// the service's current key of the region.
fn check_holders(w: &World) {
    for (i, c) in w.clients.iter().enumerate() {
        let Some(node) = c.node() else { continue };
        for (region, id, secret) in c.region_keys() {
            assert_eq!(
                w.gms.region_key(region),
                Some((id, secret.0)),
                "client {i}, {region:?}"
            );
            assert!(w.gms.region_key_holders(region).any(|n| n == node));
        }
        for (region, _) in w.gms.planner().regions() {
            if w.gms.region_key_holders(region).any(|n| n == node) {
                assert!(c.region_key(region).is_some(), "client {i}, {region:?}");
            }
        }
    }
}

#[test]
fn a_node_gets_the_keys_of_its_regions_only() {
    let mut w = keyed_world(4);
    for i in 0..2 {
        w.clients[i].subscribe("a").unwrap();
    }
    for i in 2..4 {
        w.clients[i].subscribe("b").unwrap();
    }
    // A publisher of "a" that is not a member of its region gets its key too.
    w.clients[3].advertise("a").unwrap();
    w.run_for(Duration::from_millis(100));
    let (a, b) = (region_of(&w, "a"), region_of(&w, "b"));
    assert_ne!(a, b);
    let key = |w: &World, i: usize, r| w.clients[i].region_key(r).map(|(id, k)| (id, k.0));
    let ka = w.gms.region_key(a).unwrap();
    let kb = w.gms.region_key(b).unwrap();
    assert_ne!(ka.0, kb.0);
    assert_ne!(ka.1, kb.1);
    for i in [0, 1, 3] {
        assert_eq!(key(&w, i, a), Some(ka), "client {i}");
    }
    assert_eq!(key(&w, 2, a), None);
    for i in [2, 3] {
        assert_eq!(key(&w, i, b), Some(kb), "client {i}");
    }
    for i in [0, 1] {
        assert_eq!(key(&w, i, b), None, "client {i}");
    }
    check_holders(&w);
    // The master secret is never sent: no update item carries it.
    let master = [1u8; 32];
    for msgs in &w.delivered {
        for m in msgs {
            if let GmsMessage::Update { items, .. } = m {
                for item in items {
                    if let Item::RegionKey { secret, .. } = item {
                        assert_ne!(secret.0, master);
                    }
                }
            }
        }
    }
}

#[test]
fn a_departure_changes_the_key_of_its_regions_and_no_other() {
    let mut w = keyed_world(5);
    for i in 0..3 {
        w.clients[i].subscribe("a").unwrap();
    }
    w.clients[3].subscribe("b").unwrap();
    w.clients[4].subscribe("b").unwrap();
    w.clients[4].advertise("a").unwrap();
    w.run_for(Duration::from_millis(100));
    let b = region_of(&w, "b");
    let kb = w.gms.region_key(b).unwrap();
    let ka = w.gms.region_key(region_of(&w, "a")).unwrap();
    // An unsubscription: the region of "a" gets a new key the leaver does not get.
    w.clients[2].unsubscribe("a").unwrap();
    w.run_for(Duration::from_millis(100));
    let a = region_of(&w, "a");
    let ka2 = w.gms.region_key(a).unwrap();
    assert!(ka2.0 > ka.0 && ka2.1 != ka.1);
    assert!(w.clients[2].region_keys().next().is_none());
    assert_eq!(w.gms.region_key(b), Some(kb));
    check_holders(&w);
    // A publisher withdraws: the same.
    w.clients[4].unadvertise("a").unwrap();
    w.run_for(Duration::from_millis(100));
    let ka3 = w.gms.region_key(region_of(&w, "a")).unwrap();
    assert!(ka3.0 > ka2.0);
    assert_eq!(w.clients[4].region_key(region_of(&w, "a")), None);
    assert_eq!(w.gms.region_key(b), Some(kb));
    check_holders(&w);
    // A member leaves the group: the keys of its regions change, and it keeps only its old
    // ones; "b" is not its region and keeps its key.
    let old = w.clients[1]
        .region_key(region_of(&w, "a"))
        .map(|(id, _)| id);
    w.clients[1].leave().unwrap();
    w.run_for(Duration::from_millis(100));
    let ka4 = w.gms.region_key(region_of(&w, "a")).unwrap();
    assert!(ka4.0 > ka3.0);
    assert_eq!(old, Some(ka3.0));
    assert_eq!(w.gms.region_key(b), Some(kb));
    check_holders(&w);
    // A join changes no key.
    let made = w.gms.stats().region_keys_made;
    w.clients[3].subscribe("a").unwrap();
    w.run_for(Duration::from_millis(100));
    check_holders(&w);
    assert!(w.clients[3].region_key(region_of(&w, "a")).is_some());
    assert!(w.gms.stats().region_keys_made >= made);
}

#[test]
fn a_refused_subscriber_gets_no_key() {
    let config = GmsConfig {
        acl: crate::Acl::parse("allow subscribe * open.*\nallow publish * *\n", None).unwrap(),
        ..GmsConfig::default()
    };
    let mut w = keyed_world_with(3, config);
    w.clients[0].subscribe("secret").unwrap();
    w.clients[1].advertise("secret").unwrap();
    w.clients[2].subscribe("open.x").unwrap();
    w.run_for(Duration::from_millis(100));
    assert_eq!(w.gms.stats().topics_refused, 1);
    // The refused subscriber holds no key; the region of "open.x" is client 2's alone.
    assert!(w.clients[0].region_keys().next().is_none());
    assert!(w.clients[1].region_keys().next().is_none());
    let open = region_of(&w, "open.x");
    assert!(w.clients[2].region_key(open).is_some());
    check_holders(&w);
}

#[test]
fn a_service_without_datagram_keys_hands_out_none() {
    let mut w = World::new(2);
    w.gms.give_key_entropy([1; 32]);
    w.clients[0].subscribe("t").unwrap();
    w.run_for(Duration::from_millis(10));
    assert!(!w.gms.wants_key_entropy());
    assert_eq!(w.gms.datagram_key_id(), None);
    assert_eq!(w.gms.region_key(region_of(&w, "t")), None);
    assert!(w.clients[0].region_keys().next().is_none());
}

#[test]
fn region_keys_are_kept_by_snapshots() {
    let mut w = keyed_world(2);
    w.clients[0].subscribe("a").unwrap();
    w.clients[1].subscribe("b").unwrap();
    w.run_for(Duration::from_millis(10));
    let snapshot = w.gms.snapshot();
    let mut other = Gms::new_replicated(GmsConfig {
        datagram_keys: true,
        ..GmsConfig::default()
    })
    .unwrap();
    other.restore(&snapshot).unwrap();
    assert_eq!(other.datagram_key_id(), Some(1));
    for (r, _) in w.gms.planner().regions() {
        assert!(w.gms.region_key(r).is_some());
        assert_eq!(other.region_key(r), w.gms.region_key(r));
    }
}

#[test]
fn a_renewal_names_the_current_key_and_is_taken_once() {
    let mut w = keyed_world(3);
    for i in 0..2 {
        w.clients[i].subscribe("t").unwrap();
    }
    w.clients[2].subscribe("u").unwrap();
    w.run_for(Duration::from_millis(10));
    let (t, u) = (region_of(&w, "t"), region_of(&w, "u"));
    let (first, _) = w.gms.region_key(t).unwrap();
    let ku = w.gms.region_key(u);
    // Both members wore the key out at once: one new key, for that region only.
    w.clients[0].renew_datagram_key(first).unwrap();
    w.clients[1].renew_datagram_key(first).unwrap();
    w.run_for(Duration::from_millis(10));
    let (next, _) = w.gms.region_key(t).unwrap();
    assert!(next > first);
    assert_eq!(w.gms.region_key(u), ku);
    let made = w.gms.stats().region_keys_made;
    // A renewal of a key already replaced changes nothing.
    w.clients[0].renew_datagram_key(first).unwrap();
    w.run_for(Duration::from_millis(10));
    assert_eq!(w.gms.region_key(t).map(|k| k.0), Some(next));
    assert_eq!(w.gms.stats().region_keys_made, made);
    assert_eq!(w.gms.stats().keys_drawn, 1);
    for i in 0..2 {
        assert_eq!(w.clients[i].region_key(t).map(|(id, _)| id), Some(next));
    }
    check_holders(&w);
}

/// The access rules: with none, everything is allowed; with rules, the first match decides
/// and what no rule allows is refused. A refused subscription or advertisement is told to its
/// node naming the topic and the rule, and leaves the node out of the topic; the allowed
/// topics of the same batch are taken.
#[test]
fn the_access_rules_refuse_topics_naming_the_rule() {
    use crate::{Acl, AclAction, TopicRefusal};
    use tidings_seal::{AllowList, PublicKey};

    let east = PublicKey([1; 32]);
    let west = PublicKey([2; 32]);
    let mut allowed = AllowList::new();
    allowed.insert(east, "east");
    allowed.insert(west, "west");
    let rules = "deny * * market.secret*\n\
                 allow publish east market.*\n\
                 allow subscribe * market.*\n";
    let config = GmsConfig {
        acl: Acl::parse(rules, Some(&allowed)).unwrap(),
        ..GmsConfig::default()
    };
    let mut w = World::with_config(3, config);
    w.identities = vec![Some(east), Some(west), None];
    w.run_for(Duration::from_secs(1));
    let refusals = |w: &World, i: usize| -> Vec<TopicRefusal> {
        w.events
            .iter()
            .filter_map(|(j, e)| match e {
                ClientEvent::Refused(r) if *j == i => Some(r.clone()),
                _ => None,
            })
            .collect()
    };
    // East publishes on market.eu; west may only subscribe; the anonymous client subscribes.
    w.clients[0].advertise("market.eu").unwrap();
    w.clients[1].advertise("market.eu").unwrap();
    w.clients[1].subscribe("market.eu").unwrap();
    w.clients[2]
        .subscribe_many(&["market.eu".into(), "news".into(), "market.secret".into()])
        .unwrap();
    w.run_for(Duration::from_secs(1));
    assert!(refusals(&w, 0).is_empty());
    assert_eq!(
        refusals(&w, 1),
        vec![TopicRefusal {
            topic: "market.eu".into(),
            action: AclAction::Publish,
            rule: "no rule allows".into(),
        }]
    );
    assert_eq!(
        refusals(&w, 2),
        vec![
            TopicRefusal {
                topic: "news".into(),
                action: AclAction::Subscribe,
                rule: "no rule allows".into(),
            },
            TopicRefusal {
                topic: "market.secret".into(),
                action: AclAction::Subscribe,
                rule: "rule 1 (deny * * market.secret*)".into(),
            },
        ]
    );
    assert_eq!(w.gms.stats().topics_refused, 3);
    // The allowed part of the batch was taken; the refused topics were never bound.
    let eu = w.gms.topic_id("market.eu").unwrap();
    assert!(w.gms.topic_id("news").is_none());
    assert!(w.gms.topic_id("market.secret").is_none());
    assert!(w.clients[1].subscribed_topics().contains(&eu));
    assert!(w.clients[2].subscribed_topics().contains(&eu));
    assert_eq!(w.gms.member_state(w.node(0)).unwrap().publishes, 1);
    assert_eq!(w.gms.member_state(w.node(1)).unwrap().publishes, 0);
    // Only the subscribers are in the topic's region.
    for (i, member) in [(0, false), (1, true), (2, true)] {
        let m = w.last_membership(i).unwrap();
        let in_region = m
            .regions
            .values()
            .any(|v| v.topics.contains(&eu) && v.members().any(|n| n == w.node(i)));
        assert_eq!(in_region, member, "client {i}");
    }
    // Requests without a topic are not affected by the rules.
    w.clients[1].unsubscribe("market.eu").unwrap();
    w.run_for(Duration::from_secs(1));
    assert!(!w.clients[1].subscribed_topics().contains(&eu));
    assert_eq!(w.gms.stats().topics_refused, 3);
}

/// Without rules every identity (and none) may publish and subscribe.
#[test]
fn without_rules_everything_is_allowed() {
    let mut w = World::new(2);
    w.identities = vec![Some(tidings_seal::PublicKey([7; 32])), None];
    w.run_for(Duration::from_secs(1));
    w.clients[0].advertise("anything").unwrap();
    w.clients[1].subscribe("anything").unwrap();
    w.run_for(Duration::from_secs(1));
    assert!(!w
        .events
        .iter()
        .any(|(_, e)| matches!(e, ClientEvent::Refused(_))));
    assert_eq!(w.gms.stats().topics_refused, 0);
    assert!(w.gms.topic_id("anything").is_some());
}
