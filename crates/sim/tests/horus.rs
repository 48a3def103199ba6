//! Reduced-size checks of the Horus figures (paper 004): what each figure shows holds at two
//! points of its axis.

use tidings_sim::horus::{Figure, Point, Setup, BUFFER_LIMIT_MSGS, FC_WINDOW_MSGS};

fn run(figure: Figure) -> Vec<Point> {
    let setup = Setup {
        figure,
        reduced: true,
        seed: 1,
    };
    setup.run(&mut |_| {}).expect("the figure runs")
}

fn at(points: &[Point], variant: usize, x: f64) -> Point {
    *points
        .iter()
        .find(|p| p.variant == variant && p.x == x)
        .expect("the point was run")
}

#[test]
fn fig1_throughput_grows_with_the_window_and_local_is_not_worse_than_global() {
    let points = run(Figure::Fig1);
    let (small, large) = (at(&points, 0, 4.0), at(&points, 0, 64.0));
    assert!(
        large.throughput_msgs > 3.0 * small.throughput_msgs,
        "{small:?} {large:?}"
    );
    let global = at(&points, 1, 64.0);
    assert!(
        large.throughput_msgs >= global.throughput_msgs,
        "{large:?} {global:?}"
    );
    // The global window bounds what the region holds in all: this sender's share is smaller.
    assert!(global.throughput_msgs < large.throughput_msgs * 0.9);
    assert!(points.iter().all(|p| p.verdict == "pass"), "{points:?}");
}

#[test]
fn fig2_packing_carries_more_small_messages() {
    let points = run(Figure::Fig2);
    let (on, off) = (at(&points, 0, 6000.0), at(&points, 1, 6000.0));
    assert!(
        on.throughput_msgs > 2.0 * off.throughput_msgs,
        "{on:?} {off:?}"
    );
    // Below saturation both carry the offered load.
    for variant in 0..2 {
        let light = at(&points, variant, 500.0);
        assert!(light.throughput_msgs > 4.0 * 500.0 * 0.95, "{light:?}");
    }
    assert!(points.iter().all(|p| p.verdict == "pass"), "{points:?}");
}

#[test]
fn fig3_back_pressure_holds_throughput_and_bounds_memory() {
    let points = run(Figure::Fig3);
    let (bp_light, bp) = (at(&points, 0, 4000.0), at(&points, 0, 20000.0));
    let none = at(&points, 1, 20000.0);
    // With back pressure an overload keeps the peak, and a sender holds at most its window
    // plus its send queue.
    assert!(bp.throughput_msgs >= bp_light.throughput_msgs, "{bp:?}");
    assert!(
        bp.held_msgs_max <= (FC_WINDOW_MSGS + BUFFER_LIMIT_MSGS) as u64,
        "{bp:?}"
    );
    assert_eq!(bp.verdict, "pass");
    // Without it, memory grows and throughput collapses.
    assert!(none.held_msgs_max > 10 * bp.held_msgs_max, "{none:?}");
    assert!(none.throughput_msgs < bp.throughput_msgs / 2.0, "{none:?}");
}
