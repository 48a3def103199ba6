//! Line plots as PNG, with no dependency: a palette canvas, straight lines, a 5x7 pixel font, and
//! a PNG writer whose deflate stream uses fixed Huffman codes and run-length matches (plots are
//! mostly background, so they compress to a few tens of kilobytes). Deterministic: the same
//! series give the same bytes.

use crate::experiment::{Outcome, Row};

/// The palette: index 0 is the background.
const PALETTE: [[u8; 3]; 10] = [
    [255, 255, 255], // 0 background
    [0, 0, 0],       // 1 text and axes
    [200, 200, 200], // 2 grid
    [31, 119, 180],  // 3 blue
    [214, 39, 40],   // 4 red
    [44, 160, 44],   // 5 green
    [255, 127, 14],  // 6 orange
    [148, 103, 189], // 7 purple
    [120, 120, 120], // 8 grey
    [23, 190, 207],  // 9 cyan
];

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

/// A canvas of palette indices.
#[derive(Clone, Debug)]
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    /// A blank canvas.
    #[must_use]
    pub fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            pixels: vec![0; width * height],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: u8) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = c;
        }
    }

    /// A line from `(x0, y0)` to `(x1, y1)`, `thick` pixels wide (Bresenham).
    pub fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: u8, thick: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            for t in 0..thick {
                self.set(x, y + t, c);
                self.set(x + t, y, c);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text at `(x, y)` (top left), each font pixel `scale` pixels square; returns its width.
    pub fn text(&mut self, x: i64, y: i64, text: &str, c: u8, scale: i64) -> i64 {
        let mut cx = x;
        for ch in text.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                self.set(cx + col * scale + dx, y + row as i64 * scale + dy, c);
                            }
                        }
                    }
                }
            }
            cx += 6 * scale;
        }
        cx - x
    }

    /// The canvas as a PNG file.
    #[must_use]
    pub fn to_png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity((self.width + 1) * self.height);
        for row in self.pixels.chunks(self.width.max(1)) {
            raw.push(0); // filter: none
            raw.extend_from_slice(row);
        }
        let mut png = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&(self.width as u32).to_be_bytes());
        ihdr.extend_from_slice(&(self.height as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 3, 0, 0, 0]); // 8-bit palette indices
        chunk(&mut png, b"IHDR", &ihdr);
        let plte: Vec<u8> = PALETTE.iter().flatten().copied().collect();
        chunk(&mut png, b"PLTE", &plte);
        chunk(&mut png, b"IDAT", &zlib(&raw));
        chunk(&mut png, b"IEND", &[]);
        png
    }
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = png.len();
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let crc = crc32(&png[start..]);
    png.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                0xedb8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

struct Bits {
    out: Vec<u8>,
    acc: u32,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, bits: u32) {
        self.acc |= value << self.n;
        self.n += bits;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, most significant bit first.
    fn code(&mut self, code: u32, bits: u32) {
        let reversed = code.reverse_bits() >> (32 - bits);
        self.put(reversed, bits);
    }

    fn literal(&mut self, v: u32) {
        match v {
            0..=143 => self.code(0x30 + v, 8),
            144..=255 => self.code(0x190 + v - 144, 9),
            256..=279 => self.code(v - 256, 7),
            _ => self.code(0xc0 + v - 280, 8),
        }
    }

    /// A match of `len` (3..=258) at distance 1.
    fn run(&mut self, len: u32) {
        const BASE: [u32; 29] = [
            3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
            115, 131, 163, 195, 227, 258,
        ];
        const EXTRA: [u32; 29] = [
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
        ];
        let i = BASE.iter().rposition(|&b| b <= len).unwrap_or(0);
        self.literal(257 + i as u32);
        self.put(len - BASE[i], EXTRA[i]);
        self.code(0, 5); // distance code 0: distance 1
    }
}

/// A zlib stream of one fixed-Huffman deflate block with distance-1 runs.
fn zlib(data: &[u8]) -> Vec<u8> {
    let mut b = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        n: 0,
    };
    b.put(1, 1); // final block
    b.put(1, 2); // fixed Huffman codes
    let mut i = 0;
    while i < data.len() {
        if i > 0 {
            let prev = data[i - 1];
            let len = data[i..]
                .iter()
                .take(258)
                .take_while(|&&x| x == prev)
                .count();
            if len >= 3 {
                b.run(len as u32);
                i += len;
                continue;
            }
        }
        b.literal(u32::from(data[i]));
        i += 1;
    }
    b.literal(256);
    if b.n > 0 {
        b.out.push(b.acc as u8);
    }
    let (mut s1, mut s2) = (1u32, 0u32);
    for &x in data {
        s1 = (s1 + u32::from(x)) % 65521;
        s2 = (s2 + s1) % 65521;
    }
    b.out.extend_from_slice(&((s2 << 16) | s1).to_be_bytes());
    b.out
}

/// The 5x7 glyph of a character (upper case only; lower case is drawn as upper case).
fn glyph(c: char) -> [u8; 7] {
    match c.to_ascii_uppercase() {
        'A' => [14, 17, 17, 31, 17, 17, 17],
        'B' => [30, 17, 17, 30, 17, 17, 30],
        'C' => [14, 17, 16, 16, 16, 17, 14],
        'D' => [30, 17, 17, 17, 17, 17, 30],
        'E' => [31, 16, 16, 30, 16, 16, 31],
        'F' => [31, 16, 16, 30, 16, 16, 16],
        'G' => [14, 17, 16, 23, 17, 17, 15],
        'H' => [17, 17, 17, 31, 17, 17, 17],
        'I' => [14, 4, 4, 4, 4, 4, 14],
        'J' => [7, 2, 2, 2, 2, 18, 12],
        'K' => [17, 18, 20, 24, 20, 18, 17],
        'L' => [16, 16, 16, 16, 16, 16, 31],
        'M' => [17, 27, 21, 21, 17, 17, 17],
        'N' => [17, 17, 25, 21, 19, 17, 17],
        'O' => [14, 17, 17, 17, 17, 17, 14],
        'P' => [30, 17, 17, 30, 16, 16, 16],
        'Q' => [14, 17, 17, 17, 21, 18, 13],
        'R' => [30, 17, 17, 30, 20, 18, 17],
        'S' => [15, 16, 16, 14, 1, 1, 30],
        'T' => [31, 4, 4, 4, 4, 4, 4],
        'U' => [17, 17, 17, 17, 17, 17, 14],
        'V' => [17, 17, 17, 17, 17, 10, 4],
        'W' => [17, 17, 17, 21, 21, 21, 10],
        'X' => [17, 17, 10, 4, 10, 17, 17],
        'Y' => [17, 17, 10, 4, 4, 4, 4],
        'Z' => [31, 1, 2, 4, 8, 16, 31],
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [31, 2, 4, 2, 1, 17, 14],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        ' ' => [0; 7],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        ',' => [0, 0, 0, 0, 12, 4, 8],
        '-' => [0, 0, 0, 31, 0, 0, 0],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '/' => [1, 2, 2, 4, 8, 8, 16],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        '%' => [24, 25, 2, 4, 8, 19, 3],
        '=' => [0, 0, 31, 0, 31, 0, 0],
        '+' => [0, 4, 4, 31, 4, 4, 0],
        '_' => [0, 0, 0, 0, 0, 0, 31],
        '\'' => [4, 4, 8, 0, 0, 0, 0],
        _ => [14, 17, 1, 2, 4, 0, 4],
    }
}

/// One line of a panel.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend.
    pub label: String,
    /// Palette index (see [`colour`]).
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

fn label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e4 {
        format!("{}K", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Draws a grid of panels: one column per entry of `columns` (its title and panels, all columns
/// with the same number of panels), x from 0 to `x_max` seconds.
#[must_use]
pub fn render(title: &str, columns: &[(String, Vec<Panel>)], x_max: f64) -> Canvas {
    let (panel_w, panel_h) = (620i64, 230i64);
    let (left, top, gap_x, gap_y) = (90i64, 70i64, 110i64, 70i64);
    let rows = columns.iter().map(|c| c.1.len()).max().unwrap_or(0) as i64;
    let width = left + columns.len() as i64 * (panel_w + gap_x);
    let height = top + rows * (panel_h + gap_y);
    let mut cv = Canvas::new(width as usize, height as usize);
    cv.text(left, 16, title, colour::BLACK, 3);
    let x_max = nice_ceiling(x_max);
    for (ci, (col_title, panels)) in columns.iter().enumerate() {
        let x0 = left + ci as i64 * (panel_w + gap_x);
        cv.text(x0, 48, col_title, colour::BLACK, 2);
        for (ri, p) in panels.iter().enumerate() {
            let y0 = top + ri as i64 * (panel_h + gap_y) + 28;
            let h = panel_h - 28;
            cv.text(x0, y0 - 24, &p.title, colour::BLACK, 2);
            // Grid, axes and labels.
            for k in 0..=4 {
                let y = y0 + h - h * k / 4;
                cv.line((x0, y), (x0 + panel_w, y), if k == 0 { 1 } else { 2 }, 1);
                let v = p.y_max * k as f64 / 4.0;
                let s = label(v);
                cv.text(x0 - 8 - 12 * s.len() as i64, y - 6, &s, colour::BLACK, 2);
            }
            cv.line((x0, y0), (x0, y0 + h), colour::BLACK, 1);
            let x_step = nice_ceiling(x_max / 8.0);
            let mut xv = 0.0;
            while xv <= x_max + 1e-9 {
                let x = x0 + (xv / x_max * panel_w as f64) as i64;
                cv.line((x, y0 + h), (x, y0 + h + 4), colour::BLACK, 1);
                let s = label(xv);
                cv.text(x - 6 * s.len() as i64, y0 + h + 8, &s, colour::BLACK, 2);
                xv += x_step;
            }
            // Lines.
            let map = |(x, y): (f64, f64)| {
                let px = x0 + (x / x_max * panel_w as f64).round() as i64;
                let yc = (y / p.y_max).clamp(0.0, 1.02);
                (px, y0 + h - (yc * h as f64).round() as i64)
            };
            for s in &p.series {
                for w in s.points.windows(2) {
                    cv.line(map(w[0]), map(w[1]), s.colour, 2);
                }
            }
            // Legend, top right, one line per series.
            let mut ly = y0 + 4;
            for s in &p.series {
                let wdt = 12 * s.label.chars().count() as i64;
                cv.text(x0 + panel_w - wdt - 4, ly, &s.label, s.colour, 2);
                ly += 18;
            }
        }
    }
    cv
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
        return Canvas::new(1, 1).to_png();
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
    render(first.setup.experiment.title(), &columns, x_max).to_png()
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
        return Canvas::new(1, 1).to_png();
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
    render(first.setup.experiment.title(), &columns, x_max).to_png()
}

/// The plot of several regions at once (Figs. 12-15): one column per run, one panel per region
/// (its sender's rate, its victim's and a healthy receiver's goodput, the victim's link), and the
/// victims' queues.
#[must_use]
pub fn regions_png(outcomes: &[Outcome]) -> Vec<u8> {
    let Some(first) = outcomes.first() else {
        return Canvas::new(1, 1).to_png();
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
    render(first.setup.experiment.title(), &columns, x_max).to_png()
}

/// The plot of the delta_t_rec sweep (Fig. 16): recovery time, the publish rate during the
/// recovery and the largest queue, each against delta_t_rec. Runs that never recovered are left
/// out of the first panel.
#[must_use]
pub fn sweep_png(outcomes: &[Outcome]) -> Vec<u8> {
    if outcomes.is_empty() {
        return Canvas::new(1, 1).to_png();
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
    render("Gryphon Fig. 16 (E4)", &columns, x_max).to_png()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_has_its_chunks_and_a_valid_checksum() {
        let mut c = Canvas::new(40, 20);
        c.line((0, 0), (39, 19), colour::RED, 1);
        c.text(1, 1, "Ab1%", colour::BLACK, 1);
        let png = c.to_png();
        assert_eq!(&png[..8], &[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[png.len() - 8..png.len() - 4], b"IEND");
        // CRC of IEND is the well-known constant.
        assert_eq!(&png[png.len() - 4..], &[0xae, 0x42, 0x60, 0x82]);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(11_600.0), 20_000.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
    }
}
