//! The delivery promise over seeds and faults, at a size that suits `cargo test`; `scripts/test`
//! runs the same matrix over 100 seeds each on the release binary (`tidings sim sweep`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;
use tidings_sim::fault::FaultSpec;

use tidings_proto::{CongestionControl, NodeId, Time};
use tidings_sim::{run, sweep, LinkChange, LinkEvent, MembershipKind, RunReport, Scenario};

const FAULTS: [&str; 6] = [
    "none",
    "iid:0.01",
    "iid:0.05",
    "bursty:0.01",
    "blackout",
    "freeze",
];

fn faults() -> Vec<FaultSpec> {
    FAULTS.iter().map(|f| f.parse().unwrap()).collect()
}

fn check_sweep(base: &Scenario, seeds: std::ops::RangeInclusive<u64>) {
    let runs = sweep(base, &faults(), seeds, 2, &|_, _| {}).unwrap();
    let failures: Vec<String> = runs
        .iter()
        .filter(|r| !r.passed())
        .map(|r| {
            let why = match &r.result {
                Ok(report) => report.violations.join("; "),
                Err(e) => e.clone(),
            };
            format!(
                "seed {} failed: {why}\n  replay: {}",
                r.scenario.seed,
                r.scenario.replay_command()
            )
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One sender, 20 receivers, one topic (a single region of four partitions).
fn one_sender() -> Scenario {
    Scenario {
        nodes: 21,
        senders: 1,
        topics: 1,
        seconds: 0.4,
        ..Scenario::default()
    }
}

/// Three senders that also subscribe, 50 nodes, 200 topics over several regions, with loss on
/// uplinks too so whole-region losses exercise the NAK path.
fn many_topics() -> Scenario {
    Scenario {
        nodes: 50,
        senders: 3,
        senders_subscribe: true,
        topics: 200,
        uplink_loss: true,
        seconds: 0.3,
        ..Scenario::default()
    }
}

#[test]
fn one_sender_twenty_receivers_over_seeds() {
    check_sweep(&one_sender(), 1..=4);
}

#[test]
fn three_senders_two_hundred_topics_over_seeds() {
    check_sweep(&many_topics(), 1..=2);
}

#[test]
fn same_seed_same_bytes() {
    let s = Scenario {
        faults: "iid:0.05,freeze".parse().unwrap(),
        seed: 7,
        ..one_sender()
    };
    let a = run(&s, &mut |_| {}).unwrap().to_json();
    let b = run(&s, &mut |_| {}).unwrap().to_json();
    assert_eq!(a, b);
    let other = run(&Scenario { seed: 8, ..s }, &mut |_| {})
        .unwrap()
        .to_json();
    assert_ne!(
        a, other,
        "different seeds should give different runs under loss"
    );
}

#[test]
fn cooperative_caching_bounds_receiver_memory() {
    // 40 receivers in partitions of 5: each caches one message in eight.
    let s = Scenario {
        nodes: 41,
        seconds: 0.3,
        faults: "iid:0.01".parse().unwrap(),
        ..one_sender()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.violations);
    assert!(
        r.cache_fraction_max <= 0.126,
        "cache fraction {}",
        r.cache_fraction_max
    );
    assert!(
        r.cache_fraction_max >= 0.124,
        "cache fraction {}",
        r.cache_fraction_max
    );
}

#[test]
fn a_lost_region_is_repaired_through_naks() {
    // Uplink loss at the sender loses packets for the whole region; only the region leader's NAK
    // (or the fallback pull to the sender) can repair them.
    let s = Scenario {
        faults: "iid:0.05".parse().unwrap(),
        uplink_loss: true,
        ..one_sender()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.violations);
    assert!(
        r.recovery.naks_sent > 0 && r.recovery.messages_resent_on_nak > 0,
        "{:?}",
        r.recovery
    );
}

#[test]
fn churn_keeps_the_promise_for_nodes_that_stay() {
    // Joins, leaves, crashes and subscription changes while 3 senders publish on 100 topics with
    // 1% loss.
    let base = Scenario {
        nodes: 50,
        senders: 3,
        topics: 100,
        seconds: 0.6,
        churn: 8,
        faults: "iid:0.01".parse().unwrap(),
        ..Scenario::default()
    };
    for seed in 1..=3 {
        let r = run(
            &Scenario {
                seed,
                ..base.clone()
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(
            r.passed(),
            "seed {seed}: {:?}\nreplay: {}",
            r.violations,
            r.replay
        );
        assert!(
            r.view_changes >= 6,
            "seed {seed}: only {} view changes",
            r.view_changes
        );
    }
}

#[test]
fn region_and_partition_leader_crashes_lose_nothing() {
    let s = Scenario {
        nodes: 31,
        seconds: 1.0,
        crash_leaders: true,
        faults: "iid:0.01".parse().unwrap(),
        ..one_sender()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    assert_eq!(r.churn.len(), 2, "{:?}", r.churn);
    assert_eq!(r.view_change_pause_ms.count, 2);
}

/// The churn scenario with the real GMS on an extra node: views reach nodes at different times,
/// crashes are found by missed heartbeats and ring suspicions.
fn gms_churn() -> Scenario {
    Scenario {
        nodes: 50,
        senders: 3,
        topics: 100,
        seconds: 0.6,
        churn: 8,
        faults: "iid:0.01".parse().unwrap(),
        membership: MembershipKind::Gms,
        ..Scenario::default()
    }
}

#[test]
fn gms_churn_keeps_the_promise_for_nodes_that_stay() {
    for seed in 1..=3 {
        let r = run(
            &Scenario {
                seed,
                ..gms_churn()
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(
            r.passed(),
            "seed {seed}: {:?}\nreplay: {}",
            r.violations,
            r.replay
        );
        assert_eq!(r.membership, "gms");
        assert!(r.replay.ends_with(" --gms"), "{}", r.replay);
        assert!(
            r.view_changes >= 6,
            "seed {seed}: only {} view changes",
            r.view_changes
        );
        let crashes = r.churn.iter().filter(|c| c.contains(" crash ")).count() as u64;
        assert_eq!(r.crash_detection_ms.count, crashes, "{:?}", r.churn);
    }
}

#[test]
fn gms_region_and_partition_leader_crashes_lose_nothing() {
    let s = Scenario {
        nodes: 31,
        seconds: 1.0,
        crash_leaders: true,
        faults: "iid:0.01".parse().unwrap(),
        membership: MembershipKind::Gms,
        ..one_sender()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    assert_eq!(r.churn.len(), 2, "{:?}", r.churn);
    // Both crashes were found by the GMS, within its heartbeat timeout (plus a heartbeat).
    assert_eq!(r.crash_detection_ms.count, 2);
    assert!(
        r.crash_detection_ms.max <= 400.0,
        "{:?}",
        r.crash_detection_ms
    );
    assert!(
        r.view_change_pause_ms.count >= 2,
        "{:?}",
        r.view_change_pause_ms
    );
}

/// A run of the adoption scenario (30 nodes, 2 senders, 50 topics, 30 adoptions, the GMS, 1%
/// loss) with `abandon` abandonments, checked to pass and to name both in its replay command.
fn adoption_run(seed: u64, abandon: u32) -> RunReport {
    let s = Scenario {
        nodes: 30,
        senders: 2,
        topics: 50,
        seconds: 1.0,
        adopt: 30,
        abandon,
        seed,
        faults: "iid:0.01".parse().unwrap(),
        membership: MembershipKind::Gms,
        ..Scenario::default()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(
        r.passed(),
        "seed {seed}: {:?}\nreplay: {}",
        r.violations,
        r.replay
    );
    assert!(r.replay.contains(" --adopt 30"), "{}", r.replay);
    assert_eq!(
        r.replay.contains(" --abandon "),
        abandon > 0,
        "{}",
        r.replay
    );
    r
}

/// Topics adopted one at a time by a few nodes join the regions of exactly their subscribers:
/// views that only add topics, which the nodes continue (ADR 30), while traffic flows on the
/// topics already there; the promise holds and the runs do continue some views.
#[test]
fn adopted_topics_continue_the_regions_they_join() {
    let mut continued = 0;
    for seed in 1..=3 {
        let r = adoption_run(seed, 0);
        assert!(
            r.churn.iter().any(|c| c.contains(" adopt ")),
            "{:?}",
            r.churn
        );
        continued += r.recovery.views_continued;
    }
    assert!(continued > 0, "no view was continued");
}

/// Adopters drop fresh topics again while traffic flows: a node alone in the region of its
/// fresh topics keeps the region with a topic fewer, a view its streams go on through (ADR 30,
/// addendum); the promise holds for the topics kept and for the other subscribers of the one
/// dropped.
#[test]
fn abandoned_topics_leave_regions_that_go_on() {
    let mut abandoned = 0;
    for seed in 1..=3 {
        let r = adoption_run(seed, 20);
        abandoned += r.churn.iter().filter(|c| c.contains(" abandon ")).count();
        assert!(
            r.recovery.views_continued > 0,
            "seed {seed}: no view continued"
        );
    }
    assert!(abandoned > 0, "no topic was abandoned");
}

#[test]
fn gms_same_seed_same_bytes() {
    let s = Scenario {
        seconds: 0.3,
        churn: 4,
        seed: 5,
        ..gms_churn()
    };
    let a = run(&s, &mut |_| {}).unwrap().to_json();
    let b = run(&s, &mut |_| {}).unwrap().to_json();
    assert_eq!(a, b);
}

/// Seeds 6 and 14 once failed: `Node::set_membership` took a region's stream created earlier in
/// the same call for an "unchanged region that already acknowledged" every re-homed message but
/// the first, so a receiver that moved into a new region missed messages that became stable
/// without it. The GMS's one-request-per-topic resubscribe (a chain of new regions) exposed it.
/// The service on three replicas: each fault of the service during churn (its leader crashes,
/// is cut off from the other replicas, a follower restarts from its snapshot) keeps the
/// promise; a leader crash is followed by a new leader, and by views it issues.
#[test]
fn replicated_gms_faults_keep_the_promise() {
    use tidings_sim::gms::GmsFault;
    for fault in GmsFault::ALL {
        for seed in 1..=2 {
            let s = Scenario {
                seed,
                gms_replicas: 3,
                gms_fault: Some(fault),
                ..gms_churn()
            };
            let r = run(&s, &mut |_| {}).unwrap();
            assert!(
                r.passed(),
                "{fault:?} seed {seed}: {:?}\nreplay: {}",
                r.violations,
                r.replay
            );
            assert!(r.replay.contains(&format!("--gms-fault {}", fault.name())));
            if fault == GmsFault::CrashLeader {
                let to_leader = r.gms_fault_to_leader_ms.expect("no new leader");
                assert!(
                    to_leader < 1_000.0,
                    "seed {seed}: {to_leader} ms to a new leader"
                );
            }
        }
    }
    // A fault needs replicas.
    let one = Scenario {
        gms_fault: Some(GmsFault::CrashLeader),
        ..gms_churn()
    };
    assert!(run(&one, &mut |_| {}).is_err());
}

#[test]
fn gms_churn_rehomes_into_new_regions() {
    for seed in [6, 14] {
        let s = Scenario {
            seed,
            seconds: 1.0,
            churn: 10,
            ..gms_churn()
        };
        let r = run(&s, &mut |_| {}).unwrap();
        assert!(r.passed(), "seed {seed}: {:?}", r.violations);
    }
}

#[test]
fn congestion_control_slows_the_sender_and_loses_nothing() {
    // A receiver's downlink is throttled below the publish rate: with PDCC its queue and its
    // late messages make it alert, the sender is rate-limited (it waits; nothing is dropped),
    // and every message still reaches every subscriber.
    let mut s = one_sender();
    s.seconds = 4.0;
    s.publish_rate = Some(2000.0);
    s.proto.congestion.control = CongestionControl::Pdcc;
    s.link_events = vec![LinkEvent {
        at: Time::ZERO + Duration::from_secs(1),
        node: NodeId(s.nodes - 1),
        change: LinkChange::Downlink {
            bandwidth_bps: 10_000_000,
            buffer_bytes: 4 << 20,
        },
    }];
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    assert!(
        r.recovery.ucas_received > 0,
        "no congestion alert reached a sender: {:?}",
        r.recovery
    );
    assert!(
        r.recovery.publish_rate_limited > 0,
        "no publish was rate-limited: {:?}",
        r.recovery
    );
}

#[test]
fn congestion_control_does_not_read_repairable_loss_as_congestion() {
    // Three full-rate senders and 1% random loss: receivers' doubt horizons stall while gaps
    // are repaired, but nothing queues up, so no sender is slowed.
    let mut s = Scenario {
        seconds: 3.0,
        ..many_topics()
    };
    s.faults = "iid:0.01".parse().unwrap();
    s.proto.congestion.control = CongestionControl::Pdcc;
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    assert_eq!(r.recovery.publish_rate_limited, 0, "{:?}", r.recovery);
}

#[test]
fn a_link_that_fails_and_comes_back_loses_nothing() {
    // One receiver's inbound link is down for half a second in the middle of publishing, then
    // its downlink is throttled to 20 Mbit/s: it recovers everything.
    let mut s = one_sender();
    s.seconds = 1.5;
    let victim = NodeId(s.nodes - 1);
    s.link_events = vec![
        LinkEvent {
            at: Time::ZERO + Duration::from_millis(300),
            node: victim,
            change: LinkChange::Outage {
                duration: Duration::from_millis(500),
            },
        },
        LinkEvent {
            at: Time::ZERO + Duration::from_millis(900),
            node: victim,
            change: LinkChange::Downlink {
                bandwidth_bps: 20_000_000,
                buffer_bytes: 256 * 1024,
            },
        },
    ];
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    assert!(r.recovery.repairs_received > 0, "{:?}", r.recovery);
}

/// Approximate regions (ADR 34): the oracle forms regions with the planner under a 30% waste
/// bound over 5 overlapping interest profiles, so members receive topics they do not subscribe
/// to. The checker passes (nothing delivered that was not subscribed, nothing missed that was)
/// and the receivers did discard messages.
#[test]
fn approximate_regions_deliver_exactly_the_subscriptions() {
    let s = Scenario {
        nodes: 30,
        senders: 2,
        topics: 12,
        profiles: Some(5),
        seconds: 0.4,
        waste_max_permille: 300,
        faults: "iid:0.01".parse().unwrap(),
        seed: 3,
        ..Scenario::default()
    };
    let report = run(&s, &mut |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    assert!(report.messages_filtered > 0, "no pads in the regions");
    assert!(report.bytes_filtered >= report.messages_filtered);
}

/// A subscription that stops reading for half the run: its node holds the topic, the streams
/// from the other senders go on being delivered there during the hold, and everything is
/// delivered and stable by the end (the sender of the held topic waits, then catches up).
#[test]
fn a_subscription_that_stops_reading_holds_only_its_streams() {
    for seed in 1..=5 {
        let s = Scenario {
            nodes: 12,
            senders: 3,
            topics: 6,
            profiles: Some(2),
            seconds: 0.5,
            slow_consumer: true,
            // Below the links' capacity, so that what the other streams must deliver within
            // `SLOW_CONSUMER_LAG` does not wait in queues.
            publish_rate: Some(2000.0),
            faults: "iid:0.01".parse().unwrap(),
            seed,
            ..Scenario::default()
        };
        let plan = s.slow_consumer_plan().unwrap();
        assert_eq!(plan.node, NodeId(3));
        let r = run(&s, &mut |_| {}).unwrap();
        assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
        assert!(
            r.delivered_beside_hold > 0,
            "seed {seed}: nothing of the other streams was owed during the hold"
        );
    }
}

/// A case of `random_scenarios::delivery_promise_holds` (about 1 in 10,000 of its strategy's
/// draws) whose stability rests on ACKs crossing a link that carries nothing else: sender 2
/// subscribes to nothing, so once the pulls to it are answered its downlink carries only the
/// region leader's ACKs of its stream into region 2, one per top round that moves the stability
/// point, then one per silence of node 2 that shows it behind (`RegionState::on_silence`), and
/// those silences back off to one a second (`Config::silence_backoff`). The region's ring sleeps
/// once everything is delivered and stable at every member, and does not resend ACKs. A burst of
/// the bursty loss is a stretch of the link's time (the loss chain steps over idle time too), so
/// an ACK lost to one is followed by one that gets through within about a silence interval, and
/// everything is stable within the run. Replay:
/// `tidings sim run --nodes 23 --senders 3 --topics 6 --loss bursty:0.016:18 --seconds 0.3
/// --seed 689716 --message-bytes 642 --replication 1 --rate 3896.246639982913 --churn 5
/// --crash-leaders`
#[test]
fn acks_to_a_sender_whose_downlink_carries_nothing_else_get_through_a_burst() {
    let s = Scenario {
        nodes: 23,
        senders: 3,
        topics: 6,
        faults: "bursty:0.016:18".parse().unwrap(),
        seconds: 0.3,
        seed: 689_716,
        message_bytes: 642,
        replication: 1,
        publish_rate: Some(3_896.246_639_982_913),
        churn: 5,
        crash_leaders: true,
        ..Scenario::default()
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
}
