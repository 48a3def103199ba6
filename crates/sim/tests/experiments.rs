//! The congestion experiments of paper 002 (Gryphon Figs. 2-16) at the reduced size, as CI checks
//! them: without congestion control the collapse is reproduced (the experiment can fail), with it
//! the same scenario meets its targets; the recovery (Figs. 7-8), several regions (Figs. 12-15)
//! and the delta_t_rec sweep (Fig. 16) show the paper's shapes. Congestion control runs with the
//! experiments' settings (ADR 12: DCQ and UCA ahead of data, r_min for the paper's four pubends,
//! a hold-off after each decrease). The full-size runs and their plots
//! are `tidings sim run --scenario NAME` (docs/experiments/).

#![allow(clippy::unwrap_used)]

use tidings_sim::experiment::{
    run_experiment, run_sweep, run_variant, to_csv, Experiment, Outcome, Row, Setup,
    EXPERIMENT_QUEUE_DELAY_THRESHOLD, PAPER_PUBENDS,
};
use tidings_sim::LinkChange;

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

/// The victim's NACK window, messages, over the samples in `(from_s, to_s]`: (narrowest, widest).
fn nack_window(rows: &[Row], from_s: f64, to_s: f64) -> (u64, u64) {
    rows.iter()
        .filter(|r| r.t_s > from_s && r.t_s <= to_s)
        .map(|r| r.nack_window)
        .fold((u64::MAX, 0), |(lo, hi), w| (lo.min(w), hi.max(w)))
}

/// SDCC's constants as message counts at the offered rate (the stream the victim recovers was
/// published at it): (`nwnd_0`, `size_NACK`, the receive window).
fn sdcc_msgs(setup: &Setup) -> (u64, u64, u64) {
    let c = setup.scenario().proto;
    let msgs = |d: std::time::Duration| (d.as_secs_f64() * setup.offered_rate()).ceil() as u64;
    (
        msgs(c.recovery.nack_window_initial),
        msgs(c.recovery.nack_size),
        c.receive_window_msgs as u64,
    )
}

#[test]
fn a_link_limited_recovery_slows_the_publisher_keeps_its_nack_window_and_few_duplicates() {
    // Figs. 7-8 with congestion control (Fig. 4's check covers the run without it). The victim's
    // link carries three times the offered load, and that link, not the NACK window, limits the
    // recovery: a wider window only lengthens the queue at its port, so the repair time (RTT)
    // grows with the window and the recovery rate of eq. 9 (nwnd / RTT) does not grow by
    // alpha_NACK. By eq. 10 SDCC then probes upwards when the recovery starts and keeps the
    // window there (in the full run 150 messages from the return to the end of the recovery).
    // It used to open to 300-500 messages here, while pulls on token comparison asked again for
    // gaps whose answers were still queued at the victim's port: half the repairs that reached
    // it were duplicates, the extra window only brought more of them and the largest queue
    // passed 1 MB. The paper's Fig. 8 window opens because its recovery had spare capacity
    // (footnote 7: the limit was elsewhere); the next test shows that shape.
    let on = run_experiment(&reduced(Experiment::GryphonFig7, true)).unwrap();
    let s = &on.summary;
    assert!(
        s.meets_targets(Experiment::GryphonFig7),
        "{}",
        on.summary_line()
    );
    let onset = (on.setup.onset() - tidings_proto::Time::ZERO).as_secs_f64();
    let restore = (on.setup.restore() - tidings_proto::Time::ZERO).as_secs_f64();
    let recovered = restore + s.recovery_s.unwrap();
    // The publish rate is cut while the victim recovers (Fig. 7)...
    let before = mean(&on.rows, 1.0, onset, |r| r.publish_rate);
    assert!(
        s.publish_rate_recovery < 0.8 * before,
        "publish rate {before:.0} before, {:.0} during the recovery",
        s.publish_rate_recovery
    );
    // ...the victim gets each missing message about once (it got 50% duplicates while pulls on
    // token comparison asked again for gaps whose answers were queued, and a third while ring
    // neighbours pushed what it pulled; ADR 13: none)...
    assert!(
        s.victim_duplicate_share < 0.05,
        "victim duplicates {:.0}% of repairs: {}",
        100.0 * s.victim_duplicate_share,
        on.summary_line()
    );
    // ...and the NACK window follows eqs. 9-10 (Fig. 8): nwnd_0 while nothing is missing...
    let (nwnd_0, size, receive_window) = sdcc_msgs(&on.setup);
    assert_eq!(
        nack_window(&on.rows, 1.0, onset),
        (nwnd_0, nwnd_0),
        "NACK window before the failure"
    );
    // ...widened when the recovery starts (its first RTT probes upwards)...
    let (_, first) = nack_window(&on.rows, restore, restore + 1.0);
    assert!(
        first >= nwnd_0 + size,
        "NACK window {first} after the return, {nwnd_0} before"
    );
    // ...moved in steps of size_NACK, never below one step nor beyond the receive window...
    for r in on
        .rows
        .iter()
        .filter(|r| r.t_s > restore && r.t_s <= recovered - 0.5)
    {
        assert!(
            r.nack_window % size == 0 && r.nack_window >= size && r.nack_window <= receive_window,
            "NACK window {} at {:.1} s is not a multiple of size_NACK = {size} within the \
             receive window {receive_window}",
            r.nack_window,
            r.t_s
        );
    }
    // ...and, the recovery rate not growing, not opened step after step: at most two steps above
    // the probe (the full run: none).
    let (_, widest) = nack_window(&on.rows, restore, recovered);
    assert!(
        widest <= first + 2 * size,
        "NACK window {first} at the return opened to {widest} on a link-limited recovery: {}",
        on.summary_line()
    );
}

#[test]
fn the_nack_window_opens_while_the_recovery_rate_grows() {
    // Fig. 8's shape: the paper's run of it limited a link upstream (its footnote 7), so the
    // victim's recovery was limited by its NACK window, and SDCC opened the window step by step
    // (eq. 10) while each step raised the recovery rate (eq. 9) by alpha_NACK, up to an operating
    // point. Here the victim's link carries twelve times the offered load (50 Mbit/s) and every
    // link has 10 ms of latency, so a repair takes at least 40 ms (request and answer, two hops
    // each) whatever the window: each step of the window adds to the recovery rate until the
    // link is full (at about 350 messages), and there the window stops. On a LAN (50 us hops)
    // the first window already fills the link, since the victim gets each repair once (ADR 13;
    // the failure and everything else as in the reduced Fig. 7).
    let setup = reduced(Experiment::GryphonFig7, true);
    let mut scenario = setup.scenario();
    let victim = setup.victim();
    let fast = (12.0 * setup.offered_rate() * 1048.0 * 8.0) as u64;
    scenario.link_latency = std::time::Duration::from_millis(10);
    let mut throttles = 0;
    for e in scenario.link_events.iter_mut().filter(|e| e.node == victim) {
        if let LinkChange::Downlink { bandwidth_bps, .. } = &mut e.change {
            *bandwidth_bps = fast;
            throttles += 1;
        }
    }
    assert_eq!(throttles, 1, "the victim's link is set once");
    let on = run_variant(&setup, &scenario).unwrap();
    let s = &on.summary;
    assert!(
        s.recovery_s.is_some() && s.verdict == "pass",
        "{}",
        on.summary_line()
    );
    let restore = (setup.restore() - tidings_proto::Time::ZERO).as_secs_f64();
    let recovered = restore + s.recovery_s.unwrap();
    let (nwnd_0, size, receive_window) = sdcc_msgs(&setup);
    // The first sample after the return: the window has made its first probe or two...
    let (_, at_start) = nack_window(&on.rows, restore, restore + 0.1);
    let (_, widest) = nack_window(&on.rows, restore, recovered);
    assert!(
        at_start <= nwnd_0 + 2 * size,
        "NACK window {at_start} 100 ms after the return: {}",
        on.summary_line()
    );
    // ...and then opens by at least four steps of size_NACK beyond nwnd_0 (the link-limited
    // run above: two steps at most)...
    assert!(
        widest >= nwnd_0 + 4 * size,
        "NACK window {at_start} at the return, at most {widest} during the recovery: {}",
        on.summary_line()
    );
    // ...and never beyond the receive window.
    assert!(widest <= receive_window);
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
    // Every queue stays under 1 MB: the 30% region's used to reach 2.8 MB while its DCQs and
    // UCAs waited behind data in the FIFO port (ADR 11), and its second decrease came late.
    assert!(
        on.summary.queue_bytes_max < 1_000_000,
        "largest queue {} bytes: {}",
        on.summary.queue_bytes_max,
        region_line(&on)
    );
    // The 60% and 30% regions meet their goodput target alongside the others. The 80% region
    // does only at full size (91%): after the first decrease halves its rate to 250 messages/s,
    // eq. 1 needs about 40 s to climb back to the 400 its link carries, most of the reduced
    // run's 40 s (it reaches about 80% here).
    for (i, share) in [(0, "60%"), (1, "30%")] {
        assert!(
            on.region_summaries[i].goodput_share >= 0.9,
            "the {share} region's goodput: {}",
            region_line(&on)
        );
    }
}

#[test]
fn the_experiments_run_pdcc_with_control_priority_and_the_papers_four_pubends() {
    // ADR 12: the settings every experiment uses with congestion control, on top of Table 1.
    let table1 = tidings_proto::Config::default();
    let setup = reduced(Experiment::GryphonFig2, true);
    assert!(setup.control_priority && !setup.table1_only);
    let s = setup.scenario();
    assert!(s.control_priority);
    assert_eq!(
        s.proto.congestion.rate_min_increase,
        table1.congestion.rate_min_increase * f64::from(PAPER_PUBENDS)
    );
    // One time constant of eq. 5's filter.
    assert_eq!(s.proto.congestion.decrease_holdoff.as_millis(), 1000);
    assert_eq!(
        s.proto.congestion.queue_delay_threshold,
        EXPERIMENT_QUEUE_DELAY_THRESHOLD
    );
    // Table 1's other constants are untouched.
    assert_eq!(s.proto.congestion.t_no_uca, table1.congestion.t_no_uca);
    assert_eq!(s.proto.congestion.f_incr, table1.congestion.f_incr);
    assert_eq!(s.proto.congestion.f_decr1, table1.congestion.f_decr1);
    assert_eq!(s.proto.congestion.f_decr2, table1.congestion.f_decr2);
    assert_eq!(
        s.proto.congestion.dcq_interval,
        table1.congestion.dcq_interval
    );
    // With --table1 the protocol's defaults alone, as before ADR 12.
    let before = Setup {
        table1_only: true,
        ..setup
    }
    .scenario();
    assert_eq!(
        before.proto.congestion.rate_min_increase,
        table1.congestion.rate_min_increase
    );
    assert_eq!(
        before.proto.congestion.decrease_holdoff,
        table1.congestion.decrease_holdoff
    );
    assert_eq!(
        before.proto.congestion.queue_delay_threshold,
        table1.congestion.queue_delay_threshold
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
