//! The congestion collapse of paper 002 (Gryphon Figs. 2-4) at the reduced size, as CI checks it:
//! without congestion control the collapse is reproduced (the experiment can fail), with it the
//! same scenario meets its targets. The full-size runs and their plots are
//! `tidings sim run --scenario NAME` (docs/experiments/).

#![allow(clippy::unwrap_used)]

use tidings_sim::experiment::{run_experiment, to_csv, Experiment, Setup};

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

#[test]
fn the_time_series_is_the_same_for_the_same_seed() {
    let setup = reduced(Experiment::GryphonFig4, true);
    let a = run_experiment(&setup).unwrap();
    let b = run_experiment(&setup).unwrap();
    assert_eq!(to_csv(&a.rows), to_csv(&b.rows));
    assert!(a.rows.len() > 100);
}
