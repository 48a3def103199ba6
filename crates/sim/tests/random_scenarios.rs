//! Property test: the delivery promise holds for randomly shaped clusters (sizes, partitions of
//! one, tiny and large messages, several senders and topics, rate limits, every fault kind,
//! membership churn and leader crashes).

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use tidings_sim::{run, Scenario};

fn fault() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("none".to_string()),
        (0.001f64..0.08).prop_map(|p| format!("iid:{p:.3}")),
        (0.001f64..0.05, 2u32..20).prop_map(|(p, len)| format!("bursty:{p:.3}:{len}")),
        Just("blackout".to_string()),
        Just("freeze".to_string()),
        (0.001f64..0.05).prop_map(|p| format!("iid:{p:.3},freeze")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn delivery_promise_holds(
        receivers in 1u32..30,
        senders in 1u32..4,
        senders_subscribe in any::<bool>(),
        topics in 1u32..12,
        replication in 1usize..7,
        message_bytes in prop_oneof![12usize..64, 64usize..1400],
        rate in prop_oneof![Just(None), (200.0f64..4000.0).prop_map(Some)],
        uplink_loss in any::<bool>(),
        faults in fault(),
        churn in 0u32..6,
        crash_leaders in any::<bool>(),
        seed in 1u64..1_000_000,
    ) {
        let s = Scenario {
            nodes: receivers + senders,
            senders,
            senders_subscribe,
            topics,
            replication,
            message_bytes,
            publish_rate: rate,
            uplink_loss,
            faults: faults.parse().unwrap(),
            seconds: 0.3,
            churn,
            crash_leaders,
            seed,
            ..Scenario::default()
        };
        let r = run(&s, &mut |_| {}).unwrap();
        prop_assert!(r.passed(), "{:?}\nreplay: {}", r.violations, r.replay);
    }
}
