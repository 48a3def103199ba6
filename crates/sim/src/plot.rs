//! Line plots as PNG, drawn with `plotters` on an in-memory bitmap and encoded with `png`. The
//! text is DejaVu Sans (from the `dejavu` crate), so no system font library is needed.
//! Deterministic: the same series give the same bytes.

use std::sync::Once;

use plotters::coord::combinators::IntoLogRange;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::experiment::{Outcome, Row};

/// Colour indices for series.
pub mod colour {
    /// Text and axes.
    pub const BLACK: u8 = 1;
    /// Blue.
    pub const BLUE: u8 = 3;
    /// Red.
    pub const RED: u8 = 4;
    /// Green.
    pub const GREEN: u8 = 5;
    /// Orange.
    pub const ORANGE: u8 = 6;
    /// Purple.
    pub const PURPLE: u8 = 7;
    /// Grey (reference lines).
    pub const GREY: u8 = 8;
    /// Cyan.
    pub const CYAN: u8 = 9;
}

/// The RGB colour of a [`colour`] index.
fn rgb(c: u8) -> RGBColor {
    match c {
        colour::BLUE => RGBColor(31, 119, 180),
        colour::RED => RGBColor(214, 39, 40),
        colour::GREEN => RGBColor(44, 160, 44),
        colour::ORANGE => RGBColor(255, 127, 14),
        colour::PURPLE => RGBColor(148, 103, 189),
        colour::GREY => RGBColor(120, 120, 120),
        colour::CYAN => RGBColor(23, 190, 207),
        _ => RGBColor(0, 0, 0),
    }
}

/// One line of a panel.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend.
    pub label: String,
    /// Colour index (see [`colour`]).
    pub colour: u8,
    /// Points `(x, y)`, by increasing `x`.
    pub points: Vec<(f64, f64)>,
}

/// One chart: a title, a y range from zero, and its lines.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Title (with the unit).
    pub title: String,
    /// Top of the y axis.
    pub y_max: f64,
    /// The lines.
    pub series: Vec<Series>,
}

/// The x axis shared by every panel of a figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum XAxis {
    /// Linear from 0 to a round number at or above the given maximum.
    Linear(f64),
    /// Logarithmic from the first to the second value (both > 0), for sweeps over sizes.
    Log(f64, f64),
}

/// A round number at or above `v` (1, 2 or 5 times a power of ten).
#[must_use]
pub fn nice_ceiling(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&c| c >= v * 0.999_999)
        .unwrap_or(10.0 * p)
}

/// An axis label: `12K` for 12,000, `1.5M` for 1,500,000.
fn label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}K", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// A log axis' label: only at 1, 2 and 5 times a power of ten (the other ticks stay bare, so
/// labels do not run into each other).
fn log_label(v: f64) -> String {
    if !(v.is_finite() && v > 0.0) {
        return String::new();
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6 * m)
    {
        label(v)
    } else {
        String::new()
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// The family every text of a plot uses.
const FONT: &str = "sans-serif";

/// Registers DejaVu Sans as [`FONT`] with plotters (once per process).
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font ships inside the `dejavu` crate; a failure here is a broken build.
        #[allow(clippy::expect_used)]
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "DejaVu Sans does not parse")
            .expect("the embedded font parses");
    });
}

/// Panel size in pixels.
const PANEL_W: u32 = 720;
const PANEL_H: u32 = 300;
/// Heights of the figure's title and of each column's title.
const TITLE_H: u32 = 50;
const COLUMN_TITLE_H: u32 = 34;

/// Draws a grid of panels, one column per entry of `columns` (its title and panels), on the x
/// axis `x` shared by all, and returns the PNG file. Sweeps (few points) also get a marker at
/// each point.
#[must_use]
pub fn render(title: &str, columns: &[(String, Vec<Panel>)], x: XAxis) -> Vec<u8> {
    register_font();
    let rows = columns.iter().map(|c| c.1.len()).max().unwrap_or(0).max(1) as u32;
    let cols = columns.len().max(1) as u32;
    // Wide enough for the title (about 15 px a character at its size).
    let title_w = 15 * title.chars().count() as u32 + 40;
    let (width, height) = (
        (cols * PANEL_W).max(title_w),
        TITLE_H + COLUMN_TITLE_H + rows * PANEL_H,
    );
    let mut rgb_pixels = vec![255u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb_pixels, (width, height)).into_drawing_area();
        // Drawing into memory cannot fail but for a bug in the figure (e.g. an empty range):
        // the figure is then left blank rather than the run lost.
        let _ = draw(&root, title, columns, x, rows);
        let _ = root.present();
    }
    encode_png(width, height, &rgb_pixels)
}

/// The whole figure on `root`.
fn draw(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    columns: &[(String, Vec<Panel>)],
    x: XAxis,
    rows: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let (head, body) = root.split_vertically(TITLE_H);
    head.draw(&Text::new(
        title.to_string(),
        (14, 12),
        (FONT, 28).into_font().color(&BLACK),
    ))?;
    let column_areas = body.split_evenly((1, columns.len().max(1)));
    for ((col_title, panels), area) in columns.iter().zip(column_areas) {
        let (top, panel_area) = area.split_vertically(COLUMN_TITLE_H);
        top.draw(&Text::new(
            col_title.clone(),
            (14, 6),
            (FONT, 21).into_font().color(&BLACK),
        ))?;
        let panel_areas = panel_area.split_evenly((rows as usize, 1));
        for (p, pa) in panels.iter().zip(panel_areas) {
            match x {
                XAxis::Linear(x_max) => {
                    let x_max = nice_ceiling(x_max);
                    let mut chart = ChartBuilder::on(&pa)
                        .caption(&p.title, (FONT, 18))
                        .margin(8)
                        .margin_right(22)
                        .x_label_area_size(30)
                        .y_label_area_size(64)
                        .build_cartesian_2d(0f64..x_max, 0f64..p.y_max.max(1e-9))?;
                    chart
                        .configure_mesh()
                        .light_line_style(TRANSPARENT)
                        .x_labels(10)
                        .y_labels(6)
                        .x_label_formatter(&|v| label(*v))
                        .y_label_formatter(&|v| label(*v))
                        .label_style((FONT, 15))
                        .draw()?;
                    draw_lines(&mut chart, p)?;
                }
                XAxis::Log(x_min, x_max) => {
                    let mut chart = ChartBuilder::on(&pa)
                        .caption(&p.title, (FONT, 18))
                        .margin(8)
                        .margin_right(22)
                        .x_label_area_size(30)
                        .y_label_area_size(64)
                        .build_cartesian_2d((x_min..x_max).log_scale(), 0f64..p.y_max.max(1e-9))?;
                    chart
                        .configure_mesh()
                        .light_line_style(TRANSPARENT)
                        .y_labels(6)
                        .x_label_formatter(&|v| log_label(*v))
                        .y_label_formatter(&|v| label(*v))
                        .label_style((FONT, 15))
                        .draw()?;
                    draw_lines(&mut chart, p)?;
                }
            }
        }
    }
    Ok(())
}

/// A panel's lines (clamped just above its y range), markers for short series, and the legend.
fn draw_lines<'a, X>(
    chart: &mut ChartContext<
        'a,
        BitMapBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    p: &Panel,
) -> Result<(), Box<dyn std::error::Error>>
where
    X: Ranged<ValueType = f64>,
{
    let y_top = p.y_max * 1.02;
    for s in &p.series {
        let c = rgb(s.colour);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, y)| (x, y.clamp(0.0, y_top)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(s.label.clone())
            .legend(move |(lx, ly)| {
                PathElement::new(vec![(lx, ly), (lx + 18, ly)], c.stroke_width(3))
            });
        if (3..=40).contains(&pts.len()) {
            chart.draw_series(pts.iter().map(|&pt| Circle::new(pt, 3, c.filled())))?;
        }
    }
    if p.series.iter().any(|s| !s.label.is_empty()) {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 15))
            .draw()?;
    }
    Ok(())
}

/// An 8-bit RGB image as a PNG file.
fn encode_png(width: u32, height: u32, rgb_pixels: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    // Plots are mostly flat colour: the strongest compression and per-row filters keep the
    // committed figures small.
    enc.set_compression(png::Compression::Best);
    enc.set_filter(png::FilterType::Paeth);
    enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    // Encoding into a Vec fails only on a size mismatch, which `render` rules out.
    if let Ok(mut w) = enc.write_header() {
        let _ = w.write_image_data(rgb_pixels);
    }
    out
}

/// A blank 1x1 PNG, for a figure with no run.
fn empty_png() -> Vec<u8> {
    encode_png(1, 1, &[255, 255, 255])
}

fn series(label: &str, colour: u8, rows: &[Row], f: impl Fn(&Row) -> f64) -> Series {
    Series {
        label: label.to_string(),
        colour,
        points: rows.iter().map(|r| (r.t_s, f(r))).collect(),
    }
}

/// A rate averaged over the last second (10 samples), as the paper's smoothed rates.
fn smoothed(label: &str, colour: u8, rows: &[Row], f: impl Fn(&Row) -> f64) -> Series {
    let values: Vec<f64> = rows.iter().map(&f).collect();
    Series {
        label: label.to_string(),
        colour,
        points: rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let w = &values[i.saturating_sub(9)..=i];
                (r.t_s, w.iter().sum::<f64>() / w.len() as f64)
            })
            .collect(),
    }
}

/// The plot of an experiment: one column per run (without, then with congestion control), with
/// panels for rates, the victim's queue, repair traffic, and the NACK window.
#[must_use]
pub fn experiment_png(outcomes: &[Outcome]) -> Vec<u8> {
    let Some(first) = outcomes.first() else {
        return empty_png();
    };
    let all = || outcomes.iter().flat_map(|o| o.rows.iter());
    let fold = |f: &dyn Fn(&Row) -> f64| nice_ceiling(all().map(f).fold(0.0, f64::max));
    // Rates are shown smoothed and up to 1.5 times the offered rate (catch-up bursts go off
    // scale).
    let rate_max = nice_ceiling(first.setup.offered_rate() * 1.5);
    let queue_max = fold(&|r| r.victim_queue_bytes as f64 / 1024.0).max(1024.0);
    let repair_max = fold(&|r| r.retransmits.max(r.victim_tail_drops));
    let x_max = all().map(|r| r.t_s).fold(1.0, f64::max);
    let capacity =
        (first.setup.bottleneck_bps() as f64 / 8.0 / 1048.0).min(first.setup.offered_rate() * 2.0);
    let columns: Vec<(String, Vec<Panel>)> = outcomes
        .iter()
        .map(|o| {
            let rows = &o.rows;
            let s = &o.summary;
            let head = format!(
                "congestion control {}: goodput {:.0}%, queue max {:.0} KB",
                if o.setup.congestion_control {
                    "on"
                } else {
                    "off"
                },
                s.goodput_share * 100.0,
                s.queue_bytes_max as f64 / 1024.0
            );
            let mut rates = vec![
                smoothed("published", colour::BLUE, rows, |r| r.publish_rate),
                smoothed("goodput victim", colour::RED, rows, |r| r.goodput_victim),
                smoothed("goodput other", colour::GREEN, rows, |r| r.goodput_other),
            ];
            if capacity < rate_max {
                rates.push(series("bottleneck", colour::GREY, rows, |r| {
                    o.setup.capacity_at(0, r.t_s).min(rate_max)
                }));
            }
            let panels = vec![
                Panel {
                    title: "messages/s (1 s average) over time (s)".into(),
                    y_max: rate_max,
                    series: rates,
                },
                Panel {
                    title: "queue at the victim's port (KB)".into(),
                    y_max: queue_max,
                    series: vec![
                        series("queue", colour::RED, rows, |r| {
                            r.victim_queue_bytes as f64 / 1024.0
                        }),
                        Series {
                            label: "1 MB".into(),
                            colour: colour::GREY,
                            points: vec![(0.0, 1000.0 * 1000.0 / 1024.0), (x_max, 976.6)],
                        },
                    ],
                },
                Panel {
                    title: "repair traffic (per s)".into(),
                    y_max: repair_max,
                    series: vec![
                        smoothed("retransmitted msgs", colour::PURPLE, rows, |r| {
                            r.retransmits
                        }),
                        smoothed("tail drops at victim", colour::ORANGE, rows, |r| {
                            r.victim_tail_drops
                        }),
                    ],
                },
                Panel {
                    title: "victim's NACK window (msgs)".into(),
                    // Each run on its own scale: the fixed window dwarfs the adaptive one. The
                    // first second (before the stream's rate is known) is left out of it.
                    y_max: nice_ceiling(
                        rows.iter()
                            .filter(|r| r.t_s > 1.0)
                            .map(|r| r.nack_window as f64)
                            .fold(0.0, f64::max),
                    ),
                    series: vec![series("NACK window", colour::CYAN, rows, |r| {
                        r.nack_window as f64
                    })],
                },
            ];
            (head, panels)
        })
        .collect();
    render(
        first.setup.experiment.title(),
        &columns,
        XAxis::Linear(x_max),
    )
}

fn on_off(o: &Outcome) -> &'static str {
    if o.setup.congestion_control {
        "on"
    } else {
        "off"
    }
}

/// The plot of a failed link's recovery as the paper's Figs. 7-8 show it: one column per run,
/// with the publish rate and the receivers' rates, the victim's NACK window, its doubt horizon
/// rate against equation 8's threshold, and its lag behind the sender.
#[must_use]
pub fn recovery_png(outcomes: &[Outcome]) -> Vec<u8> {
    let Some(first) = outcomes.first() else {
        return empty_png();
    };
    let all = || outcomes.iter().flat_map(|o| o.rows.iter());
    let rate_max = nice_ceiling(first.setup.offered_rate() * 1.5);
    let x_max = all().map(|r| r.t_s).fold(1.0, f64::max);
    let lag_max = nice_ceiling(all().map(|r| r.lag_s).fold(0.0, f64::max));
    let columns: Vec<(String, Vec<Panel>)> = outcomes
        .iter()
        .map(|o| {
            let rows = &o.rows;
            let s = &o.summary;
            let head = format!(
                "congestion control {}: recovery {}, queue max {:.0} KB",
                on_off(o),
                s.recovery_s
                    .map_or("never".to_string(), |r| format!("{r:.0} s")),
                s.queue_bytes_max as f64 / 1024.0
            );
            let threshold = 1.0 + o.setup.delta_t_rec.unwrap_or(1.0);
            let panels = vec![
                Panel {
                    title: "messages/s (1 s average) over time (s)".into(),
                    y_max: rate_max,
                    series: vec![
                        smoothed("published", colour::BLUE, rows, |r| r.publish_rate),
                        series("PDCC rate", colour::GREY, rows, |r| {
                            r.pdcc_rate.min(rate_max)
                        }),
                        smoothed("victim", colour::RED, rows, |r| r.goodput_victim),
                        smoothed("other receiver", colour::GREEN, rows, |r| r.goodput_other),
                    ],
                },
                Panel {
                    title: "victim's NACK window (msgs, 500 msgs = 1 tick-s)".into(),
                    y_max: nice_ceiling(
                        rows.iter()
                            .filter(|r| r.t_s > 1.0)
                            .map(|r| r.nack_window as f64)
                            .fold(0.0, f64::max),
                    ),
                    series: vec![series("NACK window", colour::CYAN, rows, |r| {
                        r.nack_window as f64
                    })],
                },
                Panel {
                    title: "victim's doubt horizon rate (tick-s/s)".into(),
                    y_max: 4.0,
                    series: vec![
                        series("doubt horizon rate", colour::PURPLE, rows, |r| r.doubt_rate),
                        Series {
                            label: "1 + delta_t_rec".into(),
                            colour: colour::GREY,
                            points: vec![(0.0, threshold), (x_max, threshold)],
                        },
                    ],
                },
                Panel {
                    title: "victim's lag behind the sender (s)".into(),
                    y_max: lag_max,
                    series: vec![series("lag", colour::ORANGE, rows, |r| r.lag_s)],
                },
            ];
            (head, panels)
        })
        .collect();
    render(
        first.setup.experiment.title(),
        &columns,
        XAxis::Linear(x_max),
    )
}

/// The plot of several regions at once (Figs. 12-15): one column per run, one panel per region
/// (its sender's rate, its victim's and a healthy receiver's goodput, the victim's link), and the
/// victims' queues.
#[must_use]
pub fn regions_png(outcomes: &[Outcome]) -> Vec<u8> {
    let Some(first) = outcomes.first() else {
        return empty_png();
    };
    let probes = first.setup.probes();
    let all = || outcomes.iter().flat_map(|o| o.regions.iter().flatten());
    let rate_max = nice_ceiling(first.setup.offered_rate() * 1.5);
    let x_max = all().map(|r| r.t_s).fold(1.0, f64::max);
    let queue_max = nice_ceiling(
        all()
            .map(|r| r.victim_queue_bytes as f64 / 1024.0)
            .fold(0.0, f64::max),
    )
    .max(1024.0);
    let queue_colours = [colour::RED, colour::PURPLE, colour::ORANGE, colour::CYAN];
    let columns: Vec<(String, Vec<Panel>)> = outcomes
        .iter()
        .map(|o| {
            let s = &o.summary;
            let head = format!(
                "congestion control {}: least goodput {:.0}%, queue max {:.0} KB",
                on_off(o),
                s.goodput_share * 100.0,
                s.queue_bytes_max as f64 / 1024.0
            );
            let mut panels: Vec<Panel> = probes
                .iter()
                .zip(&o.regions)
                .enumerate()
                .map(|(i, (p, rows))| {
                    let mut lines = vec![
                        smoothed("published", colour::BLUE, rows, |r| r.publish_rate),
                        smoothed("victim", colour::RED, rows, |r| r.goodput_victim),
                        smoothed("other receiver", colour::GREEN, rows, |r| r.goodput_other),
                    ];
                    if p.share.is_some() {
                        lines.push(series("victim's link", colour::GREY, rows, |r| {
                            o.setup.capacity_at(i, r.t_s).min(rate_max)
                        }));
                    }
                    Panel {
                        title: format!(
                            "region {} ({}): msgs/s over time (s)",
                            i + 1,
                            p.share.map_or("not throttled".to_string(), |x| format!(
                                "victim's link {:.0}%",
                                x * 100.0
                            ))
                        ),
                        y_max: rate_max,
                        series: lines,
                    }
                })
                .collect();
            let mut queues: Vec<Series> = o
                .regions
                .iter()
                .zip(queue_colours.iter().cycle())
                .enumerate()
                .map(|(i, (rows, &c))| {
                    series(&format!("region {}", i + 1), c, rows, |r| {
                        r.victim_queue_bytes as f64 / 1024.0
                    })
                })
                .collect();
            queues.push(Series {
                label: "1 MB".into(),
                colour: colour::GREY,
                points: vec![(0.0, 976.6), (x_max, 976.6)],
            });
            panels.push(Panel {
                title: "queue at each victim's port (KB)".into(),
                y_max: queue_max,
                series: queues,
            });
            (head, panels)
        })
        .collect();
    render(
        first.setup.experiment.title(),
        &columns,
        XAxis::Linear(x_max),
    )
}

/// The plot of the delta_t_rec sweep (Fig. 16): recovery time, the publish rate during the
/// recovery and the largest queue, each against delta_t_rec. Runs that never recovered are left
/// out of the first panel.
#[must_use]
pub fn sweep_png(outcomes: &[Outcome]) -> Vec<u8> {
    if outcomes.is_empty() {
        return empty_png();
    }
    let point = |o: &Outcome, y: f64| (o.setup.delta_t_rec.unwrap_or(1.0), y);
    let recovery: Vec<(f64, f64)> = outcomes
        .iter()
        .filter_map(|o| o.summary.recovery_s.map(|r| point(o, r)))
        .collect();
    let publish: Vec<(f64, f64)> = outcomes
        .iter()
        .map(|o| point(o, o.summary.publish_rate_recovery))
        .collect();
    let queue: Vec<(f64, f64)> = outcomes
        .iter()
        .map(|o| point(o, o.summary.queue_bytes_max as f64 / 1024.0))
        .collect();
    let y_max = |pts: &[(f64, f64)]| nice_ceiling(pts.iter().map(|p| p.1).fold(0.0, f64::max));
    let x_max = outcomes
        .iter()
        .map(|o| o.setup.delta_t_rec.unwrap_or(1.0))
        .fold(0.1, f64::max);
    let panels = vec![
        Panel {
            title: "recovery time (s) against delta_t_rec (tick-s/s)".into(),
            y_max: y_max(&recovery),
            series: vec![Series {
                label: "recovery time".into(),
                colour: colour::RED,
                points: recovery,
            }],
        },
        Panel {
            title: "publish rate during the recovery (msgs/s)".into(),
            y_max: y_max(&publish),
            series: vec![Series {
                label: "published".into(),
                colour: colour::BLUE,
                points: publish,
            }],
        },
        Panel {
            title: "largest queue (KB)".into(),
            y_max: y_max(&queue).max(1024.0),
            series: vec![
                Series {
                    label: "largest queue".into(),
                    colour: colour::PURPLE,
                    points: queue,
                },
                Series {
                    label: "1 MB".into(),
                    colour: colour::GREY,
                    points: vec![(0.0, 976.6), (x_max, 976.6)],
                },
            ],
        },
    ];
    let columns = vec![(
        "congestion control on, one run per value".to_string(),
        panels,
    )];
    // One column is narrower than the experiment's title.
    render("Gryphon Fig. 16 (E4)", &columns, XAxis::Linear(x_max))
}

/// One run of `tidings sim regions` in a sweep over the waste bound: the workload and the
/// figures [`waste_sweep_png`] draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WasteSweepPoint {
    /// Nodes of the workload.
    pub nodes: usize,
    /// Topics of the workload.
    pub topics: usize,
    /// Share of the topics each node subscribes to.
    pub interest: f64,
    /// Exponent of the topics' Zipf popularity.
    pub zipf: f64,
    /// Seed of the workload.
    pub seed: u64,
    /// The planner's bound on waste, in thousandths.
    pub waste_max_permille: u32,
    /// Regions per node, mean.
    pub regions_per_node_mean: f64,
    /// Regions per node, most.
    pub regions_per_node_max: usize,
    /// Regions per topic, mean.
    pub regions_per_topic_mean: f64,
    /// Regions per topic, most.
    pub regions_per_topic_max: usize,
    /// Members per region, mean.
    pub region_size_mean: f64,
    /// Share of a node's traffic in its two busiest regions, mean over nodes.
    pub top2_region_traffic_share: f64,
    /// Share of what a node receives that it discards, mean over nodes.
    pub waste_mean: f64,
    /// Share of what a node receives that it discards, most over nodes.
    pub waste_max: f64,
}

/// The trade-off of approximate regions (ADR 34): paper 001's region figures against the
/// planner's bound on waste, one report of `tidings sim regions` per bound, with the paper's
/// figures as grey reference lines.
#[must_use]
pub fn waste_sweep_png(reports: &[WasteSweepPoint]) -> Vec<u8> {
    let Some(first) = reports.first() else {
        return empty_png();
    };
    let x = |r: &WasteSweepPoint| f64::from(r.waste_max_permille) / 10.0;
    let x_max = reports.iter().map(x).fold(1.0, f64::max);
    let line = |label: &str, colour: u8, f: &dyn Fn(&WasteSweepPoint) -> f64| Series {
        label: label.into(),
        colour,
        points: reports.iter().map(|r| (x(r), f(r))).collect(),
    };
    let reference = |label: &str, y: f64| Series {
        label: label.into(),
        colour: colour::GREY,
        points: vec![(0.0, y), (x_max, y)],
    };
    let max_of = |f: &dyn Fn(&WasteSweepPoint) -> f64| {
        nice_ceiling(reports.iter().map(f).fold(1.0, f64::max))
    };
    let per_node = Panel {
        title: "regions per node".into(),
        y_max: max_of(&|r| r.regions_per_node_max as f64),
        series: vec![
            line("mean", colour::BLUE, &|r| r.regions_per_node_mean),
            line("max", colour::RED, &|r| r.regions_per_node_max as f64),
            reference("paper 001: 4-14", 14.0),
        ],
    };
    let waste = Panel {
        title: "waste per node (% of received, by rate)".into(),
        y_max: max_of(&|r| 100.0 * r.waste_max),
        series: vec![
            line("mean", colour::BLUE, &|r| 100.0 * r.waste_mean),
            line("max", colour::RED, &|r| 100.0 * r.waste_max),
            line("bound", colour::GREY, &|r| {
                f64::from(r.waste_max_permille) / 10.0
            }),
        ],
    };
    let top2 = Panel {
        title: "traffic in a node's top-2 regions (%)".into(),
        y_max: 100.0,
        series: vec![
            line("by popularity", colour::BLUE, &|r| {
                100.0 * r.top2_region_traffic_share
            }),
            reference("paper 001: ~95%", 95.0),
        ],
    };
    let per_topic = Panel {
        title: "regions per topic, region size".into(),
        y_max: max_of(&|r| r.region_size_mean.max(r.regions_per_topic_max as f64)),
        series: vec![
            line("regions per topic, mean", colour::BLUE, &|r| {
                r.regions_per_topic_mean
            }),
            line("regions per topic, max", colour::RED, &|r| {
                r.regions_per_topic_max as f64
            }),
            line("region size, mean", colour::GREEN, &|r| r.region_size_mean),
            reference("paper 001: 5 per topic, 5-10 members", 10.0),
        ],
    };
    let title = format!(
        "approximate regions: {} nodes, {} topics, interest {}, zipf {}, seed {}, against the waste bound (%)",
        first.nodes, first.topics, first.interest, first.zipf, first.seed
    );
    render(
        &title,
        &[
            ("structure".into(), vec![per_node, per_topic]),
            ("cost and locality".into(), vec![waste, top2]),
        ],
        XAxis::Linear(x_max),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_writes_a_png_of_the_expected_size() {
        let panel = Panel {
            title: "a panel (msgs/s)".into(),
            y_max: 10.0,
            series: vec![Series {
                label: "line".into(),
                colour: colour::RED,
                points: vec![(1.0, 1.0), (10.0, 5.0), (100.0, 20.0)],
            }],
        };
        let columns = vec![("column".to_string(), vec![panel.clone(), panel])];
        let png = render("title", &columns, XAxis::Log(1.0, 100.0));
        assert_eq!(&png[..8], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
        assert_eq!(&png[12..16], b"IHDR");
        let w = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
        let h = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
        assert_eq!((w, h), (PANEL_W, TITLE_H + COLUMN_TITLE_H + 2 * PANEL_H));
        assert_eq!(png, render("title", &columns, XAxis::Log(1.0, 100.0)));
        assert_ne!(png, render("title", &columns, XAxis::Linear(100.0)));
    }

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(11_600.0), 20_000.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
    }
}
