//! The link model: serialization, latency, FIFO order and exact drop-tail.

// Helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use tidings_proto::Time;
use tidings_sim::net::{Class, Dropped, Link, LinkConfig, LinkConfigError};

fn us(n: u64) -> Time {
    Time::from_nanos(n * 1_000)
}

fn link(buffer_bytes: usize) -> Link {
    link_with_payload(buffer_bytes)
}

#[test]
fn defaults_are_the_papers_cluster() {
    let c = LinkConfig::default();
    assert_eq!(c.bandwidth_bps, 100_000_000);
    assert_eq!(c.latency, Duration::from_micros(50));
    assert_eq!(c.buffer_bytes, 256 * 1024);
}

#[test]
fn serialization_and_latency_are_exact() {
    let mut l = link(1 << 20);
    // 1000 bytes at 100 Mbit/s = 80 us, then 50 us latency.
    assert_eq!(l.offer(Time::ZERO, 1000, Class::Data, || None), Ok(us(130)));
    // Queued behind the first: starts at 80 us.
    assert_eq!(l.offer(Time::ZERO, 1000, Class::Data, || None), Ok(us(210)));
    assert_eq!(l.free_at(), us(160));
    // An offer after the link went idle starts at once.
    assert_eq!(
        l.offer(us(1000), 500, Class::Data, || None),
        Ok(us(1000 + 40 + 50))
    );
    let s = l.stats();
    assert_eq!(
        (s.packets_offered, s.packets_sent, s.packets_dropped),
        (3, 3, 0)
    );
    assert_eq!((s.bytes_offered, s.bytes_sent), (2500, 2500));
    assert_eq!(s.queued_bytes_max, 2000);
}

#[test]
fn odd_bandwidth_rounds_up_to_the_nanosecond() {
    let mut l: Link = Link::new(LinkConfig {
        bandwidth_bps: 3,
        latency: Duration::ZERO,
        buffer_bytes: 10,
        ..LinkConfig::default()
    })
    .unwrap();
    // 8 bits at 3 bit/s = 2.666... s, rounded up.
    assert_eq!(
        l.offer(Time::ZERO, 1, Class::Data, || None),
        Ok(Time::from_nanos(2_666_666_667))
    );
    assert_eq!(
        LinkConfig {
            bandwidth_bps: 1_000_000_007,
            ..LinkConfig::default()
        }
        .transmit_time(1000),
        // 7999.99994 ns, rounded up.
        Duration::from_nanos(8_000)
    );
}

#[test]
fn tail_drop_counts_bytes_not_yet_fully_transmitted() {
    let mut l = link(3000);
    for _ in 0..3 {
        assert!(l.offer(Time::ZERO, 1000, Class::Data, || None).is_ok());
    }
    assert_eq!(
        l.offer(Time::ZERO, 1000, Class::Data, || None),
        Err(Dropped {
            queued_bytes: 3000,
            len: 1000
        })
    );
    // The first packet is still on the wire 1 ns before its last bit leaves.
    assert_eq!(l.queued_bytes(Time::from_nanos(79_999)), 3000);
    assert!(l
        .offer(Time::from_nanos(79_999), 1, Class::Data, || None)
        .is_err());
    // Room for a max-size packet exactly when the first packet finishes.
    assert_eq!(l.room_at(Time::from_nanos(79_999), 1000), us(80));
    assert_eq!(l.room_at(Time::from_nanos(79_999), 1001), us(160));
    assert_eq!(l.room_at(Time::from_nanos(79_999), 3001), Time::MAX);
    assert_eq!(
        l.offer(us(80), 1000, Class::Data, || None),
        Ok(us(80 * 4 + 50))
    );
    // Fits exactly: 2000 queued + 1000 = buffer.
    assert_eq!(l.queued_bytes(us(160)), 2000);
    assert!(l.has_room(us(160), 1000));
    assert!(!l.has_room(us(160), 1001));
    let s = l.stats();
    assert_eq!(
        (s.packets_offered, s.packets_sent, s.packets_dropped),
        (6, 4, 2)
    );
    assert_eq!(s.bytes_dropped, 1001);
    assert_eq!(s.queued_bytes_max, 3000);
    assert_eq!(l.room_at(us(10_000), 3000), us(10_000));
}

#[test]
fn invalid_configs_are_rejected() {
    let zero_bw = LinkConfig {
        bandwidth_bps: 0,
        ..LinkConfig::default()
    };
    assert_eq!(
        Link::<()>::new(zero_bw).err(),
        Some(LinkConfigError::ZeroBandwidth)
    );
    let zero_buf = LinkConfig {
        buffer_bytes: 0,
        ..LinkConfig::default()
    };
    assert_eq!(
        Link::<()>::new(zero_buf).err(),
        Some(LinkConfigError::ZeroBuffer)
    );
}

/// A reference model that keeps every accepted packet forever and scans.
struct Reference {
    config: LinkConfig,
    finishes: Vec<(u64, usize)>,
    free_at: u64,
}

impl Reference {
    fn offer(&mut self, now: u64, len: usize) -> Option<u64> {
        let queued: usize = self
            .finishes
            .iter()
            .filter(|(finish, _)| *finish > now)
            .map(|(_, l)| l)
            .sum();
        if queued + len > self.config.buffer_bytes {
            return None;
        }
        let tx = (len as u128 * 8_000_000_000).div_ceil(self.config.bandwidth_bps as u128) as u64;
        let finish = self.free_at.max(now) + tx;
        self.free_at = finish;
        self.finishes.push((finish, len));
        Some(finish + self.config.latency.as_nanos() as u64)
    }
}

proptest! {
    /// Against the reference: same accept/drop decisions and arrival times; arrivals are FIFO.
    #[test]
    fn link_matches_reference(
        bandwidth_bps in prop::sample::select(vec![100_000_000u64, 1_000_000_000, 12_345_678]),
        buffer_bytes in 1500usize..20_000,
        offers in prop::collection::vec((0u64..200_000, 1usize..1500), 1..300),
    ) {
        let config = LinkConfig {
            bandwidth_bps,
            latency: Duration::from_micros(7),
            buffer_bytes,
            ..LinkConfig::default()
        };
        let mut link: Link = Link::new(config).unwrap();
        let mut reference = Reference { config, finishes: Vec::new(), free_at: 0 };
        let mut now = 0;
        let mut last_arrival = Time::ZERO;
        let mut dropped = 0;
        for (gap, len) in offers {
            now += gap;
            let got = link.offer(Time::from_nanos(now), len, Class::Data, || None).ok();
            let want = reference.offer(now, len).map(Time::from_nanos);
            prop_assert_eq!(got, want);
            if let Some(arrival) = got {
                prop_assert!(arrival >= last_arrival);
                last_arrival = arrival;
            } else {
                dropped += 1;
            }
            prop_assert!(link.queued_bytes(Time::from_nanos(now)) <= buffer_bytes);
        }
        prop_assert_eq!(link.stats().packets_dropped, dropped);
        prop_assert_eq!(
            link.stats().packets_offered,
            link.stats().packets_sent + link.stats().packets_dropped
        );
    }

    /// `room_at` is the earliest time with room: room then, none a nanosecond before.
    #[test]
    fn room_at_is_tight(
        offers in prop::collection::vec((0u64..50_000, 1usize..1500), 1..100),
        len in 1usize..3000,
    ) {
        let mut link = link(6000);
        let mut now = 0;
        for (gap, l) in offers {
            now += gap;
            let _ = link.offer(Time::from_nanos(now), l, Class::Data, || None);
        }
        let at = link.room_at(Time::from_nanos(now), len);
        prop_assert!(at >= Time::from_nanos(now));
        if at > Time::from_nanos(now) {
            let mut probe = link.clone();
            prop_assert!(!probe.has_room(Time::from_nanos(at.as_nanos() - 1), len));
        }
        prop_assert!(link.has_room(at, len));
    }
}

#[test]
fn a_reconfigured_link_keeps_what_it_accepted_and_serializes_the_rest_at_the_new_rate() {
    let mut l = link(1 << 20);
    assert_eq!(l.offer(Time::ZERO, 1000, Class::Data, || None), Ok(us(130)));
    assert_eq!(l.queued_bytes_at(Time::ZERO), 1000);
    // Throttled to 10 Mbit/s with a 2000-byte buffer: the first packet keeps its timing; the
    // next starts when it is done and takes 800 us.
    l.reconfigure(10_000_000, 2000).unwrap();
    assert_eq!(
        l.offer(Time::ZERO, 1000, Class::Data, || None),
        Ok(us(80 + 800 + 50))
    );
    assert_eq!(l.queued_bytes_at(us(80)), 1000);
    assert_eq!(l.queued_bytes_at(us(880)), 0);
    // The smaller buffer applies to the next offer.
    assert!(l.offer(Time::ZERO, 1000, Class::Data, || None).is_err());
    assert_eq!(l.reconfigure(0, 2000), Err(LinkConfigError::ZeroBandwidth));
}

fn priority_link(buffer_bytes: usize, control_buffer_bytes: usize) -> Link<u32> {
    Link::new(LinkConfig {
        buffer_bytes,
        control_priority: true,
        control_buffer_bytes,
        ..LinkConfig::default()
    })
    .unwrap()
}

#[test]
fn a_control_packet_goes_after_the_packet_on_the_wire_and_delays_the_data_waiting() {
    let mut l = priority_link(1 << 20, 1000);
    // Three data packets of 1000 bytes: on the wire until 80 us, then 160, 240.
    for id in 0..3 {
        assert!(l.offer(Time::ZERO, 1000, Class::Data, || Some(id)).is_ok());
    }
    // A 100-byte control packet at 10 us: after the first (80 us), 8 us on the wire.
    assert_eq!(
        l.offer(us(10), 100, Class::Control, || Some(10)),
        Ok(us(88 + 50))
    );
    // A second one queues behind the first control packet, still ahead of the data.
    assert_eq!(
        l.offer(us(20), 100, Class::Control, || Some(11)),
        Ok(us(96 + 50))
    );
    assert_eq!(l.free_at(), us(240 + 16));
    // Both queues count; the control queue has its own bound (1000 bytes).
    assert_eq!(l.queued_bytes_at(us(20)), 3200);
    assert!(l.offer(us(20), 900, Class::Control, || Some(12)).is_err());
    assert_eq!(l.stats().queued_bytes_max, 3200);
    assert_eq!(l.stats().control_queued_bytes_max, 200);
    // Data offered now goes last.
    assert_eq!(
        l.offer(us(20), 1000, Class::Data, || Some(3)),
        Ok(us(336 + 50))
    );
    // Arrivals: the packet that was on the wire, the control packets, then the data, delayed by
    // the control packets' 16 us.
    let mut order = Vec::new();
    while let Some(at) = l.next_arrival() {
        order.push((at, l.pop_arrival(at).unwrap()));
    }
    let want = [(130, 0), (138, 10), (146, 11), (226, 1), (306, 2), (386, 3)];
    assert_eq!(order, want.map(|(t, id)| (us(t), id)));
    assert_eq!(l.queued_bytes_at(us(336)), 0);
}

#[test]
fn without_priority_control_packets_wait_in_the_fifo() {
    let mut l: Link<u32> = link_with_payload(1 << 20);
    assert!(l.offer(Time::ZERO, 1000, Class::Data, || Some(0)).is_ok());
    assert!(l.offer(Time::ZERO, 1000, Class::Data, || Some(1)).is_ok());
    assert_eq!(
        l.offer(us(10), 100, Class::Control, || Some(2)),
        Ok(us(168 + 50))
    );
    // A lost packet takes its place on the wire but never arrives.
    assert_eq!(
        l.offer(us(10), 1000, Class::Data, || None),
        Ok(us(248 + 50))
    );
    assert_eq!(l.queued_bytes_at(us(10)), 3100);
    let mut ids = Vec::new();
    while let Some(at) = l.next_arrival() {
        assert!(l.pop_arrival(Time::from_nanos(at.as_nanos() - 1)).is_none());
        ids.push(l.pop_arrival(at).unwrap());
    }
    assert_eq!(ids, [0, 1, 2]);
}

fn link_with_payload<P>(buffer_bytes: usize) -> Link<P> {
    Link::new(LinkConfig {
        buffer_bytes,
        ..LinkConfig::default()
    })
    .unwrap()
}

#[test]
fn room_at_counts_only_the_data_queue_under_priority() {
    let mut l = priority_link(2000, 1000);
    assert!(l.offer(Time::ZERO, 1000, Class::Data, || Some(0)).is_ok());
    assert!(l.offer(Time::ZERO, 1000, Class::Data, || Some(1)).is_ok());
    assert!(l.offer(Time::ZERO, 500, Class::Control, || Some(2)).is_ok());
    assert!(!l.has_room(Time::ZERO, 1000));
    // The first data packet leaves at 80 us; the control packet (40 us) delays the second.
    assert_eq!(l.room_at(Time::ZERO, 1000), us(80));
    assert_eq!(l.room_at(Time::ZERO, 2000), us(200));
}
