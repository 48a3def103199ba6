//! Fault strings, loss models and periodic windows.

// Helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proptest::prelude::*;
use tidings_proto::Time;
use tidings_sim::fault::{
    parse_duration, FaultError, FaultSpec, LossModel, LossSpec, Periodic, BLACKOUT_DEFAULT,
    FREEZE_DEFAULT,
};
use tidings_sim::world::NodeNetConfig;

fn parse(s: &str) -> Result<FaultSpec, FaultError> {
    s.parse()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn parses_every_form() {
    assert_eq!(parse("none").unwrap(), FaultSpec::NONE);
    assert_eq!(
        parse("iid:0.01").unwrap().loss,
        Some(LossSpec::Iid { p: 0.01 })
    );
    assert_eq!(
        parse("bursty:0.05").unwrap().loss,
        Some(LossSpec::Bursty {
            p: 0.05,
            burst_len: 10.0
        })
    );
    assert_eq!(
        parse("bursty:0.05:4").unwrap().loss,
        Some(LossSpec::Bursty {
            p: 0.05,
            burst_len: 4.0
        })
    );
    assert_eq!(parse("blackout").unwrap().blackout, Some(BLACKOUT_DEFAULT));
    assert_eq!(BLACKOUT_DEFAULT, Periodic::every(ms(10), ms(1000)));
    assert_eq!(
        parse("blackout:20ms:2s").unwrap().blackout,
        Some(Periodic::every(ms(20), ms(2000)))
    );
    assert_eq!(parse("freeze").unwrap().freeze, Some(FREEZE_DEFAULT));
    assert_eq!(FREEZE_DEFAULT, Periodic::every(ms(500), ms(5000)));
    assert_eq!(
        parse("freeze:500us:1.5s:100ms").unwrap().freeze,
        Some(Periodic::every(Duration::from_micros(500), ms(1500)).with_phase(ms(100)))
    );
    let combined = parse(" iid:0.01 , freeze ").unwrap();
    assert_eq!(
        combined,
        FaultSpec {
            loss: Some(LossSpec::Iid { p: 0.01 }),
            blackout: None,
            freeze: Some(FREEZE_DEFAULT),
        }
    );
}

#[test]
fn display_is_canonical_and_round_trips() {
    let cases = [
        ("none", "none"),
        ("iid:0.01", "iid:0.01"),
        ("bursty:0.05", "bursty:0.05:10"),
        ("blackout", "blackout:10ms:1s"),
        ("freeze", "freeze:500ms:5s"),
        ("freeze,iid:0.01", "iid:0.01,freeze:500ms:5s"),
        (
            "freeze:1.5s:10s:250us,blackout:1500us:1s",
            "blackout:1500us:1s,freeze:1500ms:10s:250us",
        ),
    ];
    for (input, canonical) in cases {
        let spec = parse(input).unwrap();
        assert_eq!(spec.to_string(), canonical, "display of {input}");
        assert_eq!(parse(canonical).unwrap(), spec, "round trip of {input}");
    }
}

#[test]
fn errors_name_the_bad_part_and_list_the_forms() {
    // (input, variant, the part the message must name)
    let bad = [
        ("", "Empty", ""),
        ("iid:0.1,", "Empty", "`iid:0.1,`"),
        ("wobble", "Unknown", "`wobble`"),
        ("iid", "Arity", "`iid`"),
        ("iid:0.1:3", "Arity", "`iid:0.1:3`"),
        ("none:1", "Arity", "`none:1`"),
        ("blackout:10ms", "Arity", "`blackout:10ms`"),
        ("iid:x", "BadNumber", "`x`"),
        ("bursty:0.1:y", "BadNumber", "`y`"),
        ("iid:1", "Probability", "`iid:1`"),
        ("iid:-0.1", "Probability", "`iid:-0.1`"),
        ("iid:NaN", "Probability", "`iid:NaN`"),
        ("bursty:0.05:0.5", "BurstLen", "`bursty:0.05:0.5`"),
        ("bursty:0.9:1", "BurstInfeasible", "`bursty:0.9:1`"),
        ("blackout:10:1s", "BadDuration", "`10`"),
        ("blackout:10ms:1h", "BadDuration", "`1h`"),
        ("freeze:-1ms:1s", "BadDuration", "`-1ms`"),
        ("blackout:1s:1s", "Window", "`blackout:1s:1s`"),
        ("freeze:0ms:1s", "Window", "`freeze:0ms:1s`"),
        ("iid:0.1,bursty:0.1", "Duplicate", "`bursty:0.1`"),
        ("freeze,freeze", "Duplicate", "`freeze`"),
        ("none,iid:0.1", "NoneCombined", "`none,iid:0.1`"),
    ];
    for (input, variant, named) in bad {
        let err = parse(input).expect_err(input);
        assert!(
            format!("{err:?}").starts_with(variant),
            "{input}: {err:?} is not {variant}"
        );
        let message = err.to_string();
        assert!(
            message.contains(named),
            "{input}: `{message}` does not name {named}"
        );
    }
    let message = parse("wobble").unwrap_err().to_string();
    assert!(
        message.contains("accepted: none | iid:P | bursty:P[:LEN]"),
        "{message}"
    );
}

#[test]
fn durations() {
    assert_eq!(parse_duration("1.5s"), Some(ms(1500)));
    assert_eq!(parse_duration("250ns"), Some(Duration::from_nanos(250)));
    assert_eq!(parse_duration("7us"), Some(Duration::from_micros(7)));
    assert_eq!(parse_duration("0.0001ms"), Some(Duration::from_nanos(100)));
    for bad in ["10", "ms", "-1ms", "+1ms", "1 m s", "1e400s", "x s"] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn periodic_windows_with_phase() {
    let w = Periodic::every(ms(10), ms(100)).with_phase(ms(30));
    let t = |n: u64| Time::from_nanos(n);
    assert!(!w.active(t(29_999_999)));
    assert!(w.active(t(30_000_000)));
    assert!(w.active(t(39_999_999)));
    assert!(!w.active(t(40_000_000)));
    assert!(w.active(t(130_000_000)));
    assert!(!w.active(Time::ZERO));
    assert_eq!(w.next_change(Time::ZERO), t(30_000_000));
    assert_eq!(w.next_change(t(35_000_000)), t(40_000_000));
    assert_eq!(w.next_change(t(40_000_000)), t(130_000_000));
    // A phase beyond the period is the same windows.
    let later = Periodic::every(ms(10), ms(100)).with_phase(ms(230));
    for n in (0..400_000_000).step_by(1_234_567) {
        assert_eq!(later.active(t(n)), w.active(t(n)));
        assert_eq!(later.next_change(t(n)), w.next_change(t(n)));
    }
    let start = Periodic::every(ms(10), ms(100));
    assert!(start.active(Time::ZERO));
    assert_eq!(start.next_change(Time::ZERO), t(10_000_000));
}

#[test]
fn iid_loss_rate() {
    let mut model = LossModel::iid(0.1).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let n = 200_000;
    let lost = (0..n).filter(|_| model.drops(&mut rng)).count();
    let rate = lost as f64 / n as f64;
    assert!((rate - 0.1).abs() < 0.005, "rate {rate}");
    assert_eq!(model.mean_loss(), 0.1);
}

/// Returns (loss rate, mean burst length) over `n` packets.
fn measure(model: &mut LossModel, seed: u64, n: usize) -> (f64, f64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut lost, mut bursts, mut prev) = (0usize, 0usize, false);
    for _ in 0..n {
        let d = model.drops(&mut rng);
        lost += usize::from(d);
        if d && !prev {
            bursts += 1;
        }
        prev = d;
    }
    (lost as f64 / n as f64, lost as f64 / bursts.max(1) as f64)
}

#[test]
fn gilbert_elliott_mean_and_burst_length() {
    for (p, len) in [(0.05, 10.0), (0.01, 3.0), (0.2, 1.0)] {
        let mut model = LossModel::gilbert_elliott(p, len).unwrap();
        assert!((model.mean_loss() - p).abs() < 1e-12);
        let (rate, burst) = measure(&mut model, 11, 2_000_000);
        assert!((rate - p).abs() < p * 0.1, "p={p} len={len}: rate {rate}");
        assert!(
            (burst - len).abs() < len * 0.1,
            "p={p} len={len}: burst {burst}"
        );
    }
    // An iid model of the same rate has bursts near 1 / (1 - p): the test can tell them apart.
    let (_, burst) = measure(&mut LossModel::iid(0.05).unwrap(), 11, 1_000_000);
    assert!(burst < 1.2, "iid burst {burst}");
}

/// A burst is a stretch of the link's time: a chain left in the bad state by the last packet
/// is, after a second of idle link, as likely bad as ever (the mean loss), not still in its burst
/// (17 in 18 for bursts of 18); less idle than a packet time changes nothing; and idle gaps keep
/// the long-run loss rate.
#[test]
fn gilbert_elliott_bursts_pass_with_idle_time() {
    let slot = Duration::from_nanos(117_760); // 1472 bytes at 100 Mbit/s
    let in_burst = || {
        let mut model = LossModel::gilbert_elliott(0.016, 18.0).unwrap();
        if let LossModel::GilbertElliott { bad, .. } = &mut model {
            *bad = true;
        }
        model
    };
    let mut rng = fastrand::Rng::with_seed(5);
    let (mut after_second, mut after_nothing) = (0, 0);
    for _ in 0..10_000 {
        let mut model = in_burst();
        model.pass_idle(&mut rng, Duration::from_secs(1), || slot);
        after_second += usize::from(model.drops(&mut rng));
        let mut model = in_burst();
        model.pass_idle(&mut rng, slot / 2, || slot);
        after_nothing += usize::from(model.drops(&mut rng));
    }
    assert!(
        after_second < 400,
        "lost after a second idle: {after_second} of 10000"
    );
    assert!(
        after_nothing > 9_000,
        "lost right after: {after_nothing} of 10000"
    );
    // Gaps of 0 to 4 packet times between packets: the loss rate stays the chain's.
    let mut model = LossModel::gilbert_elliott(0.05, 10.0).unwrap();
    let n: u32 = 1_000_000;
    let lost = (0..n)
        .filter(|i| {
            model.pass_idle(&mut rng, slot * (i % 5), || slot);
            model.drops(&mut rng)
        })
        .count();
    let rate = lost as f64 / f64::from(n);
    assert!((rate - 0.05).abs() < 0.005, "rate {rate}");
}

#[test]
fn apply_faults_sets_downlink_loss_and_windows() {
    let mut node = NodeNetConfig::default();
    node.apply_faults(&parse("bursty:0.05:4,blackout,freeze").unwrap())
        .unwrap();
    assert_eq!(
        node.loss_down,
        LossModel::gilbert_elliott(0.05, 4.0).unwrap()
    );
    assert_eq!(node.loss_up, LossModel::None);
    assert_eq!(node.blackout, Some(BLACKOUT_DEFAULT));
    assert_eq!(node.freeze, Some(FREEZE_DEFAULT));
}

fn arb_window() -> impl Strategy<Value = Periodic> {
    (
        1u64..1_000_000_000,
        1u64..1_000_000_000,
        0u64..3_000_000_000,
    )
        .prop_map(|(d, extra, phase)| {
            Periodic::every(Duration::from_nanos(d), Duration::from_nanos(d + extra))
                .with_phase(Duration::from_nanos(phase))
        })
}

fn arb_spec() -> impl Strategy<Value = FaultSpec> {
    let loss = prop_oneof![
        Just(None),
        (0.0f64..1.0).prop_map(|p| Some(LossSpec::Iid { p })),
        (0.0f64..0.5, 1.0f64..100.0)
            .prop_map(|(p, burst_len)| Some(LossSpec::Bursty { p, burst_len })),
    ];
    (
        loss,
        prop::option::of(arb_window()),
        prop::option::of(arb_window()),
    )
        .prop_map(|(loss, blackout, freeze)| FaultSpec {
            loss,
            blackout,
            freeze,
        })
}

proptest! {
    #[test]
    fn any_spec_round_trips(spec in arb_spec()) {
        let text = spec.to_string();
        prop_assert_eq!(parse(&text), Ok(spec), "{}", text);
    }

    /// `next_change` is exactly where `active` flips.
    #[test]
    fn next_change_is_where_active_flips(w in arb_window(), now in 0u64..10_000_000_000) {
        let now = Time::from_nanos(now);
        let next = w.next_change(now);
        prop_assert!(next > now);
        prop_assert_ne!(w.active(next), w.active(now));
        prop_assert_eq!(w.active(Time::from_nanos(next.as_nanos() - 1)), w.active(now));
    }
}
