//! The congestion experiments of paper 002 (Gryphon Figs. 2-16) at the reduced size, as CI checks
//! them: without congestion control the collapse is reproduced (the experiment can fail), with it
//! the same scenario meets its targets; the recovery (Figs. 7-8), several regions (Figs. 12-15)
//! and the delta_t_rec sweep (Fig. 16) show the paper's shapes. The full-size runs and their plots
//! are `tidings sim run --scenario NAME` (docs/experiments/).

#![allow(clippy::unwrap_used)]

use tidings_sim::experiment::{run_experiment, run_sweep, to_csv, Experiment, Outcome, Row, Setup};

fn reduced(experiment: Experiment, congestion_control: bool) -> Setup {
    Setup {
        reduced: true,
        ..Setup::new(experiment, congestion_control)
    }
}

fn check(experiment: Experiment) {
    let off = run_experiment(&reduced(experiment, false)).unwrap();
    assert!(
        !off.summary.meets_targets(experiment),
        "no collapse without congestion control: {}",
        off.summary_line()
    );
    let on = run_experiment(&reduced(experiment, true)).unwrap();
    assert!(
        on.summary.meets_targets(experiment),
        "congestion control did not prevent the collapse: {}",
        on.summary_line()
    );
}

#[test]
fn a_throttled_link_collapses_without_congestion_control_and_not_with_it() {
    check(Experiment::GryphonFig2);
}

#[test]
fn a_failed_link_coming_back_collapses_without_congestion_control_and_not_with_it() {
    check(Experiment::GryphonFig4);
}

fn mean(rows: &[Row], from_s: f64, to_s: f64, f: impl Fn(&Row) -> f64) -> f64 {
    let w: Vec<f64> = rows
        .iter()
        .filter(|r| r.t_s > from_s && r.t_s <= to_s)
        .map(f)
        .collect();
    w.iter().sum::<f64>() / w.len().max(1) as f64
}

#[test]
fn the_recovery_slows_the_publisher_and_opens_the_nack_window() {
    // Figs. 7-8 with congestion control (Fig. 4's check covers the run without it).
    let on = run_experiment(&reduced(Experiment::GryphonFig7, true)).unwrap();
    let s = &on.summary;
    assert!(
        s.meets_targets(Experiment::GryphonFig7),
        "{}",
        on.summary_line()
    );
    let restore = (on.setup.restore() - tidings_proto::Time::ZERO).as_secs_f64();
    let recovered = restore + s.recovery_s.unwrap();
    // The publish rate is cut while the victim recovers (Fig. 7)...
    let before = mean(
        &on.rows,
        1.0,
        on.setup.onset().as_nanos() as f64 / 1e9,
        |r| r.publish_rate,
    );
    assert!(
        s.publish_rate_recovery < 0.8 * before,
        "publish rate {before:.0} before, {:.0} during the recovery",
        s.publish_rate_recovery
    );
    // ...and the NACK window opens from its start while it does (Fig. 8).
    let window = |from: f64, to: f64| {
        on.rows
            .iter()
            .filter(|r| r.t_s > from && r.t_s <= to)
            .map(|r| r.nack_window)
            .max()
            .unwrap_or(0)
    };
    let at_start = window(restore, restore + 0.5);
    let widest = window(restore, recovered);
    assert!(
        widest > at_start,
        "NACK window {at_start} at the return, at most {widest} during the recovery"
    );
}

fn region_line(o: &Outcome) -> String {
    o.summary_line()
}

#[test]
fn each_region_follows_its_own_bottleneck_and_the_free_region_keeps_its_rate() {
    let experiment = Experiment::GryphonFig12;
    let off = run_experiment(&reduced(experiment, false)).unwrap();
    assert!(
        off.summary.queue_bytes_max > 1_000_000,
        "no queue without congestion control: {}",
        region_line(&off)
    );
    let on = run_experiment(&reduced(experiment, true)).unwrap();
    assert_eq!(on.summary.verdict, "pass", "{}", region_line(&on));
    let probes = on.setup.probes();
    let end = on.setup.scenario().seconds;
    for (i, ((p, r), rows)) in probes
        .iter()
        .zip(&on.region_summaries)
        .zip(&on.regions)
        .enumerate()
    {
        match p.share {
            // Each sender publishes at most what its own region's bottleneck carries once the
            // rate has settled (the last 10 s of publishing)...
            Some(_) => {
                let rate = mean(rows, end - 10.0, end, |r| r.publish_rate);
                let bottleneck = on.setup.capacity_at(i, end);
                assert!(
                    rate <= 1.1 * bottleneck,
                    "region of {} publishes {rate:.0} msgs/s above its bottleneck {bottleneck:.0}: {}",
                    p.sender,
                    region_line(&on)
                );
            }
            // ...and the region without one keeps the offered rate.
            None => assert!(
                r.publish_share >= 0.95,
                "the free region was slowed: {}",
                region_line(&on)
            ),
        }
    }
    // The 60% region (the bottleneck of Figs. 2-3) meets its goodput target alongside the others.
    assert!(
        on.region_summaries[0].goodput_share >= 0.9,
        "{}",
        region_line(&on)
    );
}

#[test]
fn a_larger_delta_t_rec_slows_the_publisher_more_during_a_recovery() {
    let sweep = run_sweep(&reduced(Experiment::GryphonFig16, true)).unwrap();
    for o in &sweep {
        assert!(
            o.summary.recovery_s.is_some() && o.summary.verdict == "pass",
            "{}",
            o.summary_line()
        );
    }
    let (first, last) = (&sweep[0].summary, &sweep[sweep.len() - 1].summary);
    assert!(
        last.publish_rate_recovery < first.publish_rate_recovery,
        "delta_t_rec changed nothing: {} / {}",
        sweep[0].summary_line(),
        sweep[sweep.len() - 1].summary_line()
    );
}

#[test]
fn the_time_series_is_the_same_for_the_same_seed() {
    let setup = reduced(Experiment::GryphonFig4, true);
    let a = run_experiment(&setup).unwrap();
    let b = run_experiment(&setup).unwrap();
    assert_eq!(to_csv(&a.rows), to_csv(&b.rows));
    assert!(a.rows.len() > 100);
}
