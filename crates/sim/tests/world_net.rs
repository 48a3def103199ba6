//! The world's network and CPU model, end to end with scripted hosts.

// Helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod world_support;

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_proto::{NodeId, RegionId, Time};
use tidings_sim::fault::{LossModel, Periodic};
use tidings_sim::world::{NodeNetConfig, World, WorldConfig, WorldError};
use tidings_wire::Kind;
use world_support::*;

fn world(
    config: WorldConfig,
    hosts: Vec<ScriptHost>,
    regions: BTreeMap<RegionId, Vec<NodeId>>,
) -> World<ScriptHost> {
    World::new(config, hosts, regions).unwrap()
}

fn uniform(n: usize) -> WorldConfig {
    WorldConfig::uniform(1, n, &NodeNetConfig::default())
}

fn hosts(n: usize) -> Vec<ScriptHost> {
    (0..n).map(|_| ScriptHost::new()).collect()
}

#[test]
fn unicast_timing_is_exact() {
    let mut h = hosts(2);
    h[0] = ScriptHost::new().send_at(Time::ZERO, to_node(1), packet(Kind::Data, 1000, 7));
    let mut w = world(uniform(2), h, BTreeMap::new());
    w.run_until(ms(1));
    // send cost 2 us, uplink 80 + 50 us, downlink 80 + 50 us.
    assert_eq!(w.host(NodeId(0)).sent_at, vec![Time::ZERO]);
    let got: Vec<_> = w
        .host(NodeId(1))
        .received
        .iter()
        .map(|(t, d)| (*t, tag(d)))
        .collect();
    assert_eq!(got, vec![(us(262), 7)]);
    let s = &w.stats().nodes;
    assert_eq!((s[0].datagrams_sent, s[0].bytes_sent), (1, 1000));
    assert_eq!((s[1].datagrams_delivered, s[1].bytes_delivered), (1, 1000));
    assert_eq!(s[0].busy_time, dur_us(2));
    assert_eq!(s[1].busy_time, dur_us(2));
    assert_eq!(s[0].uplink.packets_sent, 1);
    assert_eq!(s[1].downlink.packets_sent, 1);
    assert_eq!(w.now(), ms(1));
}

#[test]
fn links_are_fifo_per_sender() {
    let mut h = hosts(3);
    h[0] = ScriptHost::new().flooding(to_node(2), 1000, 300);
    h[1] = ScriptHost::new().flooding(to_node(2), 200, 300);
    let mut w = world(uniform(3), h, BTreeMap::new());
    w.run_until(ms(100));
    let r = &w.host(NodeId(2)).received;
    assert_eq!(r.len(), 600);
    for len in [1000, 200] {
        let tags: Vec<u64> = r
            .iter()
            .filter(|(_, d)| d.len() == len)
            .map(|(_, d)| tag(d))
            .collect();
        assert_eq!(
            tags,
            (0..300).collect::<Vec<_>>(),
            "order from the {len}-byte sender"
        );
    }
    assert!(r.windows(2).all(|p| p[0].0 < p[1].0));
}

#[test]
fn multicast_reaches_members_but_not_sender() {
    let regions = BTreeMap::from([
        (
            RegionId(0),
            vec![NodeId(0), NodeId(1), NodeId(2), NodeId(3)],
        ),
        (RegionId(1), vec![NodeId(2), NodeId(3)]),
    ]);
    let mut h = hosts(4);
    h[0] = ScriptHost::new().flooding(to_region(0), 500, 10);
    h[1] = ScriptHost::new()
        .send_at(us(1), to_region(1), packet(Kind::Data, 100, 99))
        .send_at(us(2), to_region(9), packet(Kind::Data, 100, 1))
        .send_at(us(3), to_node(77), packet(Kind::Data, 100, 2));
    let mut w = world(uniform(4), h, regions);
    w.run_until(ms(10));
    assert_eq!(w.host(NodeId(0)).received.len(), 0);
    assert_eq!(w.host(NodeId(1)).tags(), (0..10).collect::<Vec<_>>());
    for n in [2, 3] {
        let mut tags = w.host(NodeId(n)).tags();
        tags.sort();
        let mut want: Vec<u64> = (0..10).collect();
        want.push(99);
        want.sort();
        assert_eq!(tags, want, "node {n}");
    }
    assert_eq!(w.stats().unroutable, 2);
    // The sender serialized each multicast once.
    assert_eq!(w.stats().nodes[0].uplink.packets_sent, 10);
}

/// Per node: (time, tag, length) of every datagram handed over.
type Traces = Vec<Vec<(Time, u64, usize)>>;

fn lossy_run(seed: u64) -> (Traces, tidings_sim::world::WorldStats) {
    let n = 20;
    let node = NodeNetConfig {
        loss_up: LossModel::iid(0.01).unwrap(),
        loss_down: LossModel::gilbert_elliott(0.05, 5.0).unwrap(),
        proc_cost_per_packet: dur_us(20),
        ..NodeNetConfig::default()
    };
    let config = WorldConfig::uniform(seed, n, &node);
    let mut h = hosts(n);
    for (i, host) in h.iter_mut().enumerate().take(4) {
        *host = ScriptHost::new().flooding(to_region(0), 300 + 100 * i, 2000);
    }
    let mut w = world(config, h, one_region(n as u32));
    w.run_until(ms(500));
    let traces = w
        .hosts()
        .iter()
        .map(|h| {
            h.received
                .iter()
                .map(|(t, d)| (*t, tag(d), d.len()))
                .collect()
        })
        .collect();
    (traces, w.stats().clone())
}

#[test]
fn same_seed_same_run_different_seed_different_run() {
    let (a, stats_a) = lossy_run(42);
    let (b, stats_b) = lossy_run(42);
    assert_eq!(a, b);
    assert_eq!(stats_a, stats_b);
    assert!(stats_a.nodes[10].drops.loss_down > 0);
    assert!(stats_a.nodes[0].drops.loss_up > 0);
    let (c, _) = lossy_run(43);
    assert_ne!(a, c);
}

fn one_to_one_with_downlink_loss(loss: LossModel, count: u64) -> World<ScriptHost> {
    let mut config = uniform(2);
    config.nodes[1].loss_down = loss;
    let mut h = hosts(2);
    h[0] = ScriptHost::new().flooding(to_node(1), 1000, count);
    let mut w = world(config, h, BTreeMap::new());
    w.run_until(Time::from_nanos(count * 100_000));
    w
}

#[test]
fn iid_loss_rate_in_the_world() {
    let w = one_to_one_with_downlink_loss(LossModel::iid(0.1).unwrap(), 20_000);
    let s = &w.stats().nodes[1];
    assert_eq!(s.datagrams_delivered + s.drops.loss_down, 20_000);
    assert_eq!(s.drops.total(), s.drops.loss_down);
    let rate = s.drops.loss_down as f64 / 20_000.0;
    assert!((rate - 0.1).abs() < 0.01, "rate {rate}");
}

#[test]
fn bursty_loss_in_the_world() {
    let count = 100_000;
    let w = one_to_one_with_downlink_loss(LossModel::gilbert_elliott(0.05, 10.0).unwrap(), count);
    let tags = w.host(NodeId(1)).tags();
    let lost = count - tags.len() as u64;
    let mut bursts = 0;
    let mut expected = 0;
    for t in tags.iter().copied().chain([count]) {
        if t > expected {
            bursts += 1;
        }
        expected = t + 1;
    }
    let rate = lost as f64 / count as f64;
    let burst = lost as f64 / bursts as f64;
    assert!((rate - 0.05).abs() < 0.01, "rate {rate}");
    assert!((burst - 10.0).abs() < 1.5, "mean burst {burst}");
}

#[test]
fn blackout_drops_exactly_inside_windows() {
    let window = Periodic::every(dur_ms(10), dur_ms(50)).with_phase(dur_ms(5));
    let mut config = uniform(2);
    config.nodes[1].blackout = Some(window);
    let mut sender = ScriptHost::new();
    let count = 2000;
    for k in 0..count {
        sender = sender.send_at(us(100 * k), to_node(1), packet(Kind::Data, 1000, k));
    }
    let mut h = hosts(2);
    h[0] = sender;
    let mut w = world(config, h, BTreeMap::new());
    w.run_until(ms(300));
    // Links are idle between sends (100 us apart, 80 us each), so arrival = send + 262 us.
    let want: Vec<u64> = (0..count)
        .filter(|k| !window.active(us(100 * k + 262)))
        .collect();
    assert!(want.len() < count as usize * 9 / 10 && want.len() > count as usize / 2);
    assert_eq!(w.host(NodeId(1)).tags(), want);
    assert_eq!(w.stats().nodes[1].drops.blackout, count - want.len() as u64);
    // The blacked-out node still sends.
    assert_eq!(w.stats().nodes[0].drops.blackout, 0);
}

/// Node 1 frozen during [0, 50 ms) of every 200 ms; node 0 sends one 1000-byte datagram per
/// millisecond from 10 ms; node 1 has an alarm at 20 ms.
fn freeze_world(socket_buffer_bytes: usize) -> World<ScriptHost> {
    let mut config = uniform(2);
    config.nodes[1].freeze = Some(Periodic::every(dur_ms(50), dur_ms(200)));
    config.nodes[1].socket_buffer_bytes = socket_buffer_bytes;
    let mut sender = ScriptHost::new();
    for k in 0..60 {
        sender = sender.send_at(ms(10 + k), to_node(1), packet(Kind::Data, 1000, k));
    }
    let mut h = hosts(2);
    h[0] = sender;
    h[1] = ScriptHost::new().alarm(ms(20));
    let mut w = world(config, h, BTreeMap::new());
    w.run_until(ms(100));
    w
}

#[test]
fn freeze_delays_processing_and_timers() {
    let w = freeze_world(1 << 20);
    assert!(w.is_frozen(NodeId(1), ms(49)));
    assert!(!w.is_frozen(NodeId(1), ms(50)));
    let r = &w.host(NodeId(1)).received;
    assert_eq!(w.host(NodeId(1)).tags(), (0..60).collect::<Vec<_>>());
    // Arrivals at 10.262 .. 49.262 ms (40 of them) wait for the end of the freeze, then are
    // processed back to back at 2 us each.
    for (k, (t, _)) in r.iter().enumerate().take(40) {
        assert_eq!(*t, ms(50) + dur_us(2 * k as u64), "datagram {k}");
    }
    for (k, (t, _)) in r.iter().enumerate().skip(40) {
        assert_eq!(*t, ms(10 + k as u64) + dur_us(262), "datagram {k}");
    }
    // The timer due at 20 ms fires after the batch at 50 ms, never during the freeze.
    assert_eq!(w.host(NodeId(1)).timeouts, vec![ms(50) + dur_us(80)]);
    assert!(w.host(NodeId(1)).timeout_calls.iter().all(|t| *t >= ms(50)));
    assert_eq!(w.stats().nodes[1].socket_queue_bytes_max, 40_000);
    assert_eq!(w.stats().nodes[1].drops.socket_overflow, 0);
}

#[test]
fn freeze_overflows_a_small_socket_buffer() {
    let w = freeze_world(10_000);
    let s = &w.stats().nodes[1];
    assert_eq!(s.drops.socket_overflow, 30);
    assert_eq!(s.datagrams_delivered, 30);
    assert_eq!(s.socket_queue_bytes_max, 10_000);
    let tags = w.host(NodeId(1)).tags();
    assert_eq!(tags, (0..10).chain(40..60).collect::<Vec<_>>());
}

/// Six datagrams of different kinds arrive while node 1 is frozen (until 5 ms).
fn priority_world(freeze: bool, batch_max: usize) -> Vec<u64> {
    let mut config = uniform(2);
    config.batch_max = batch_max;
    if freeze {
        config.nodes[1].freeze = Some(Periodic::every(dur_ms(5), Duration::from_secs(1)));
    }
    let sends = [
        garbage(100, 1),
        packet(Kind::Data, 100, 2),
        packet(Kind::Token, 100, 3),
        packet(Kind::Retransmit, 100, 4),
        packet(Kind::Data, 100, 5),
        packet(Kind::Ack, 100, 6),
    ];
    let mut sender = ScriptHost::new();
    for (k, bytes) in sends.into_iter().enumerate() {
        sender = sender.send_at(ms(1) + dur_us(100 * k as u64), to_node(1), bytes);
    }
    let mut h = hosts(2);
    h[0] = sender;
    let mut w = world(config, h, BTreeMap::new());
    w.run_until(ms(10));
    w.host(NodeId(1)).tags()
}

#[test]
fn batches_are_processed_by_priority() {
    // Without a backlog every datagram is its own batch: arrival order.
    assert_eq!(priority_world(false, 64), vec![1, 2, 3, 4, 5, 6]);
    // One batch: control (token, ack), recovery, data, then the unknown kind; stable within.
    assert_eq!(priority_world(true, 64), vec![3, 6, 4, 2, 5, 1]);
    // Sorting is per batch.
    assert_eq!(priority_world(true, 2), vec![2, 1, 3, 4, 6, 5]);
}

#[test]
fn crash_stops_a_node_and_drops_what_reaches_it() {
    let mut to1 = ScriptHost::new();
    let mut to3 = ScriptHost::new();
    for k in 0..20 {
        to1 = to1.send_at(ms(k), to_node(1), packet(Kind::Data, 1000, k));
        to3 = to3.send_at(ms(k), to_node(3), packet(Kind::Data, 1000, k));
    }
    let h = vec![to1, ScriptHost::new().alarm(ms(10)), to3, ScriptHost::new()];
    let mut w = world(uniform(4), h, BTreeMap::new());
    w.crash(NodeId(1), ms(5)).unwrap();
    w.crash(NodeId(2), ms(9) + dur_us(500)).unwrap();
    assert_eq!(
        w.crash(NodeId(4), ms(1)),
        Err(WorldError::UnknownNode(NodeId(4)))
    );
    w.run_until(ms(50));
    assert!(w.is_crashed(NodeId(1)));
    assert_eq!(w.host(NodeId(1)).tags(), (0..5).collect::<Vec<_>>());
    assert!(w.host(NodeId(1)).timeouts.is_empty());
    assert_eq!(w.stats().nodes[1].drops.crashed, 15);
    // A crashed sender stops sending; what it sent before still arrives.
    assert_eq!(w.host(NodeId(2)).sent_at.len(), 10);
    assert_eq!(w.host(NodeId(3)).tags(), (0..10).collect::<Vec<_>>());
    assert_eq!(
        w.crash(NodeId(0), ms(1)),
        Err(WorldError::InThePast {
            at: ms(1),
            now: ms(50)
        })
    );
}

#[test]
fn crash_discards_the_socket_buffer() {
    // A crash during the freeze: 20 datagrams wait when it comes.
    let mut config = uniform(2);
    config.nodes[1].freeze = Some(Periodic::every(dur_ms(50), dur_ms(200)));
    let mut sender = ScriptHost::new();
    for k in 0..60 {
        sender = sender.send_at(ms(10 + k), to_node(1), packet(Kind::Data, 1000, k));
    }
    let mut w = world(config, vec![sender, ScriptHost::new()], BTreeMap::new());
    w.crash(NodeId(1), ms(30)).unwrap();
    w.run_until(ms(100));
    assert!(w.host(NodeId(1)).received.is_empty());
    assert_eq!(w.stats().nodes[1].drops.crashed, 60);
}

#[test]
fn cpu_cost_limits_a_receiver() {
    let mut config = uniform(2);
    config.nodes[1].proc_cost_per_packet = dur_us(100);
    config.nodes[1].socket_buffer_bytes = 64 * 1024;
    let mut h = hosts(2);
    h[0] = ScriptHost::new().flooding(to_node(1), 1000, 3000);
    let mut w = world(config, h, BTreeMap::new());
    w.run_until(ms(200));
    // 12,500 arrivals/s against 10,000 processed/s: saturated, and the socket overflows.
    let busy = w.node_busy_fraction(NodeId(1));
    assert!(busy > 0.95 && busy <= 1.0, "busy {busy}");
    let r = &w.host(NodeId(1)).received;
    assert!(r.windows(2).all(|p| p[1].0 - p[0].0 >= dur_us(100)));
    w.run_until(ms(1000));
    let s = &w.stats().nodes[1];
    assert!(s.drops.socket_overflow > 0);
    assert_eq!(s.datagrams_delivered + s.drops.socket_overflow, 3000);
    assert!(s.socket_queue_bytes_max <= 64 * 1024);
}

#[test]
fn uplink_paces_a_flooding_sender() {
    let mut h = hosts(2);
    h[0] = ScriptHost::new().flooding(to_node(1), 1000, u64::MAX);
    let mut w = world(uniform(2), h, BTreeMap::new());
    w.run_until(ms(1000));
    let s = &w.stats().nodes[0];
    // 1000 bytes at 100 Mbit/s: 12,500 per second, plus what sits in the 256 KiB buffer.
    let queued_max = 256 * 1024 / 1000;
    assert!(
        s.datagrams_sent >= 12_499 && s.datagrams_sent <= 12_501 + queued_max,
        "sent {}",
        s.datagrams_sent
    );
    assert_eq!(s.drops.tail_drop_up, 0);
    assert!(s.uplink.queued_bytes_max <= 256 * 1024);
    assert!(s.uplink.queued_bytes_max > 256 * 1024 - 1472);
    let delivered = w.stats().nodes[1].datagrams_delivered;
    assert!(
        (12_490..=12_500).contains(&delivered),
        "delivered {delivered}"
    );
}

#[test]
fn fan_in_overflows_the_switch_port() {
    let mut h = hosts(3);
    h[0] = ScriptHost::new().flooding(to_node(2), 1000, 5000);
    h[1] = ScriptHost::new().flooding(to_node(2), 1000, 5000);
    let mut w = world(uniform(3), h, BTreeMap::new());
    w.run_until(ms(2000));
    let s = &w.stats().nodes[2];
    assert!(s.drops.tail_drop_down > 1000, "{:?}", s.drops);
    assert_eq!(s.datagrams_delivered + s.drops.tail_drop_down, 10_000);
    assert_eq!(s.downlink.packets_dropped, s.drops.tail_drop_down);
    assert!(s.downlink.queued_bytes_max <= 256 * 1024);
    assert!(s.downlink.queued_bytes_max > 256 * 1024 - 1000);
}

#[test]
fn timers_fire_on_time_once() {
    let mut h = hosts(1);
    h[0] = ScriptHost::new()
        .alarm(ms(1))
        .alarm(ms(2))
        .alarm(ms(2))
        .alarm(ms(3) + dur_us(1));
    let mut w = world(uniform(1), h, BTreeMap::new());
    w.run_until(ms(10));
    assert_eq!(
        w.host(NodeId(0)).timeouts,
        vec![ms(1), ms(2), ms(2), ms(3) + dur_us(1)]
    );
    assert_eq!(
        w.host(NodeId(0)).timeout_calls,
        vec![ms(1), ms(2), ms(3) + dur_us(1)]
    );
}

/// A host whose timer is always due must not stop the clock.
struct Stuck(u64);

impl tidings_sim::world::Host for Stuck {
    fn handle_datagram(&mut self, _: Time, _: bytes::Bytes) {}
    fn handle_timeout(&mut self, _: Time) {
        self.0 += 1;
    }
    fn poll_transmit(
        &mut self,
        _: Time,
        _: &mut [u8],
    ) -> Option<(tidings_proto::Destination, usize)> {
        None
    }
    fn poll_timeout(&self) -> Option<Time> {
        Some(Time::ZERO)
    }
}

#[test]
fn a_stuck_timer_does_not_stop_time() {
    let mut w = World::new(uniform(1), vec![Stuck(0)], BTreeMap::new()).unwrap();
    w.run_until(us(10));
    assert_eq!(w.now(), us(10));
    assert!(w.host(NodeId(0)).0 > 1000);
}

#[test]
fn invalid_worlds_are_rejected() {
    let err = |config: WorldConfig, n: usize, regions| World::new(config, hosts(n), regions).err();
    assert_eq!(
        err(uniform(2), 3, BTreeMap::new()),
        Some(WorldError::HostCount {
            configs: 2,
            hosts: 3
        })
    );
    assert_eq!(
        err(uniform(2), 2, one_region(3)),
        Some(WorldError::UnknownMember {
            region: RegionId(0),
            node: NodeId(2)
        })
    );
    let dup = BTreeMap::from([(RegionId(4), vec![NodeId(1), NodeId(0), NodeId(1)])]);
    assert_eq!(
        err(uniform(2), 2, dup),
        Some(WorldError::DuplicateMember {
            region: RegionId(4),
            node: NodeId(1)
        })
    );
    let mut small = uniform(2);
    small.nodes[1].socket_buffer_bytes = 1000;
    assert!(matches!(
        err(small, 2, BTreeMap::new()),
        Some(WorldError::BufferTooSmall { .. })
    ));
    let mut zero = uniform(1);
    zero.batch_max = 0;
    assert!(matches!(
        err(zero, 1, BTreeMap::new()),
        Some(WorldError::ZeroLimit { .. })
    ));
    let mut bad_loss = uniform(1);
    bad_loss.nodes[0].loss_down = LossModel::Iid { p: 1.5 };
    assert!(matches!(
        err(bad_loss, 1, BTreeMap::new()),
        Some(WorldError::Fault { .. })
    ));
    let mut bad_window = uniform(1);
    bad_window.nodes[0].freeze = Some(Periodic::every(dur_ms(5), dur_ms(5)));
    assert!(matches!(
        err(bad_window, 1, BTreeMap::new()),
        Some(WorldError::Fault { .. })
    ));
    let mut bad_link = uniform(1);
    bad_link.nodes[0].downlink.bandwidth_bps = 0;
    assert!(matches!(
        err(bad_link, 1, BTreeMap::new()),
        Some(WorldError::Link { .. })
    ));
}

#[test]
fn a_tap_sees_copies_of_what_crosses_the_switch_but_not_its_own() {
    use tidings_sim::world::Tap;
    let mut h = hosts(4);
    h[0] = ScriptHost::new()
        .send_at(Time::ZERO, to_node(1), packet(Kind::Data, 500, 1))
        .send_at(ms(1), to_region(9), packet(Kind::Token, 300, 2))
        .send_at(ms(2), to_node(3), packet(Kind::Ack, 200, 3));
    h[3] = ScriptHost::new().send_at(ms(3), to_node(1), packet(Kind::Nak, 100, 4));
    let mut config = uniform(4);
    config.tap = Some(Tap {
        node: NodeId(3),
        every: 1,
    });
    let regions = BTreeMap::from([(RegionId(9), vec![NodeId(1), NodeId(2)])]);
    let mut w = world(config, h, regions);
    w.run_until(ms(10));
    // The unicast and the multicast are copied to the tap once each; the datagram addressed to
    // the tap arrives once, and the tap's own is not copied back to it.
    let tapped: Vec<u64> = w
        .host(NodeId(3))
        .received
        .iter()
        .map(|(_, d)| tag(d))
        .collect();
    assert_eq!(tapped, vec![1, 2, 3]);
    let to_one: Vec<u64> = w
        .host(NodeId(1))
        .received
        .iter()
        .map(|(_, d)| tag(d))
        .collect();
    assert_eq!(to_one, vec![1, 2, 4]);
}
