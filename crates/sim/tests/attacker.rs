//! The hostile host (`--attacker`) against the sealed simulator (`--security`): with sealing on
//! nothing it sends is delivered and the members' refusal counters show each attack; with
//! sealing off its forgeries are delivered and the checker fails the run, so the check can
//! fail. `scripts/test` runs the sealed case over 100 seeds on the release binary.

#![allow(clippy::unwrap_used)]

use tidings_seal::Mode;
use tidings_sim::gms::GmsFault;
use tidings_sim::{run, sweep, MembershipKind, RunReport, Scenario, ScenarioError};

fn attacked(security: Mode, seed: u64) -> Scenario {
    Scenario {
        nodes: 8,
        senders: 1,
        topics: 2,
        seconds: 1.0,
        drain_seconds: 10.0,
        publish_rate: Some(400.0),
        faults: "iid:0.01".parse().unwrap(),
        membership: MembershipKind::Gms,
        security,
        attacker: true,
        seed,
        ..Scenario::default()
    }
}

fn explain(r: &RunReport) -> String {
    format!("{:?}\n{}", r.violations, r.to_text())
}

#[test]
fn sealed_members_deliver_nothing_the_attacker_sent_and_count_every_attack() {
    let s = attacked(Mode::Encrypt, 1);
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{}", explain(&r));
    let a = r.attack.as_ref().unwrap();
    let (sent, refused) = (&a.sent, &a.refused);
    // Every kind of attack happened ...
    assert!(sent.captured > 0 && sent.replayed > 0, "{a:?}");
    assert!(sent.forged_data > 0 && sent.forged_control > 0, "{a:?}");
    assert!(sent.forged_unknown_key > 0 && sent.forged_gms > 0, "{a:?}");
    assert!(
        sent.old_key > 0,
        "the removed member's key was never used: {a:?}"
    );
    // ... and was refused by cause.
    assert!(sent.join_refused && !sent.joined, "{a:?}");
    assert!(a.gms_not_admitted > 0 && a.gms_plain_dropped > 0, "{a:?}");
    assert!(refused.bad_tag > 0, "{a:?}");
    assert!(refused.unknown_key > 0, "{a:?}");
    assert!(refused.retired_key > 0, "{a:?}");
    assert!(refused.replayed + refused.too_old > 0, "{a:?}");
    assert!(r.deliveries > 0);
    assert_eq!(r.forged_delivered, 0);
}

#[test]
fn authenticated_members_hold_the_promise_against_the_attacker_over_seeds() {
    let base = attacked(Mode::Authenticate, 1);
    let runs = sweep(&base, &[base.faults], 2..=4, 2, &|_, _| {}).unwrap();
    for r in &runs {
        let report = r.result.as_ref().unwrap();
        assert!(
            r.passed(),
            "seed {}: {}\n  replay: {}",
            r.scenario.seed,
            explain(report),
            r.scenario.replay_command()
        );
    }
}

#[test]
fn without_sealing_the_attackers_forgeries_are_obeyed_and_the_checker_fails() {
    // As fast as flow control allows, on one topic: forged sequence numbers just ahead of the
    // sender's land before the genuine datagrams.
    let base = Scenario {
        topics: 1,
        seconds: 0.6,
        publish_rate: None,
        ..attacked(Mode::Off, 1)
    };
    let runs = sweep(&base, &[base.faults], 1..=6, 2, &|_, _| {}).unwrap();
    let reports: Vec<&RunReport> = runs.iter().map(|r| r.result.as_ref().unwrap()).collect();
    let all = |r: &RunReport| r.violations.join("; ");
    for r in &reports {
        // Its plain join reached the service; nothing was sealed, so nothing was refused.
        assert!(!r.passed());
        assert!(all(r).contains("join(s) from the attacker"), "{}", all(r));
        assert!(r.replay.contains("--gms --attacker"), "{}", r.replay);
        assert_eq!(r.attack.as_ref().unwrap().refused.total(), 0);
    }
    // Its forged data was delivered, and its forged leaves removed live members.
    assert!(
        reports.iter().map(|r| r.forged_delivered).sum::<u64>() > 0,
        "{:?}",
        reports.iter().map(|r| all(r)).collect::<Vec<_>>()
    );
    assert!(reports.iter().any(|r| all(r).contains("which was alive")));
}

#[test]
fn an_attacked_sealed_run_replays_exactly() {
    let s = attacked(Mode::Encrypt, 7);
    let a = run(&s, &mut |_| {}).unwrap();
    let b = run(&s, &mut |_| {}).unwrap();
    assert_eq!(a, b);
    assert!(
        a.replay.contains("--security encrypt --attacker"),
        "{}",
        a.replay
    );
}

#[test]
fn sealing_and_the_attacker_need_the_gms() {
    let oracle = Scenario {
        membership: MembershipKind::Oracle,
        ..attacked(Mode::Encrypt, 1)
    };
    assert!(matches!(oracle.validate(), Err(ScenarioError::Invalid(_))));
    assert!(attacked(Mode::Encrypt, 1).validate().is_ok());
}

#[test]
fn sealed_replicas_hand_out_keys_across_a_leader_crash_against_the_attacker() {
    // Three replicas, each with its own admitted link; the leader crashes mid-run and the new
    // one goes on drawing keys (the crashed member's departure changes the key).
    let s = Scenario {
        gms_replicas: 3,
        gms_fault: Some(GmsFault::CrashLeader),
        ..attacked(Mode::Encrypt, 3)
    };
    let r = run(&s, &mut |_| {}).unwrap();
    assert!(r.passed(), "{}", explain(&r));
    assert!(
        r.replay
            .contains("--gms-replicas 3 --gms-fault crash-leader"),
        "{}",
        r.replay
    );
    assert!(r.gms_fault_to_leader_ms.is_some(), "{}", explain(&r));
    let a = r.attack.as_ref().unwrap();
    assert!(a.sent.join_refused && !a.sent.joined, "{a:?}");
    assert!(a.refused.bad_tag > 0 && a.refused.retired_key > 0, "{a:?}");
    assert!(r.deliveries > 0);
    assert_eq!(r.forged_delivered, 0);
}
