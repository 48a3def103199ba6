//! `tidings top ADDR...`: a live terminal view of a running group from its metrics endpoints
//! (nodes', the membership service's, replicas'): nodes and their rates, the busiest topics,
//! each subscription's lag with the slowest named, stalled publishers and whom they wait for,
//! regions. Scrapes every endpoint once per interval on a thread of its own (a slow endpoint
//! never freezes the screen); keys sort the tables, `q` quits.
//!
//! It takes the endpoints' addresses, or finds the nodes through the membership service
//! (`--gms`): members with metrics on tell the service where they serve them, and its own
//! endpoint lists them (`tidings_gms_member_metrics_info`); each round asks it again, so nodes
//! that join show up and nodes that leave go.

use std::collections::BTreeMap;
use std::io;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;

use crate::scrape::{self, Family, Sample};

/// Options of `tidings top`.
#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    /// Metrics endpoints of the group's nodes, membership service and replicas: `HOST:PORT`
    /// (its `/metrics`) or URLs.
    #[arg(required_unless_present = "gms")]
    addrs: Vec<String>,
    /// Metrics endpoint of the membership service (or of a replica; repeat for several):
    /// shown, and asked each round for the members' metrics endpoints, which are shown too.
    #[arg(long)]
    gms: Vec<String>,
    /// Time between two scrapes of every endpoint, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Longest wait for one endpoint's answer, in milliseconds.
    #[arg(long, default_value_t = 800)]
    timeout_ms: u64,
    /// Largest answer read from one endpoint, in bytes.
    #[arg(long, default_value_t = scrape::BODY_BYTES_MAX_DEFAULT)]
    body_bytes_max: u64,
}

/// How the topic and subscription tables are sorted (keys `r`, `l`, `t`, `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sort {
    /// Deliveries per second, highest first.
    Rate,
    /// Lag (subscriptions) or time held (topics), largest first.
    Lag,
    /// Deliveries in all, highest first.
    Total,
    /// By name.
    Name,
}

impl Sort {
    fn name(self) -> &'static str {
        match self {
            Sort::Rate => "rate",
            Sort::Lag => "lag",
            Sort::Total => "total",
            Sort::Name => "name",
        }
    }
}

/// One scrape of one endpoint.
struct Scrape {
    at: Instant,
    families: Vec<Family>,
}

/// What `top` knows of one endpoint: its last two scrapes (for rates), or why the last failed.
struct Endpoint {
    addr: String,
    last: Option<Scrape>,
    prev: Option<Scrape>,
    error: Option<String>,
}

impl Endpoint {
    /// Samples named `name` in the last scrape.
    fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        samples(self.last.as_ref().map(|s| &s.families[..]), name)
    }

    /// Per second since the previous scrape, of the sample named `name` with `sample`'s labels
    /// (0 without a previous scrape, or if the counter went back: a restarted node).
    fn rate(&self, sample: &Sample) -> f64 {
        let (Some(last), Some(prev)) = (&self.last, &self.prev) else {
            return 0.0;
        };
        let dt = last.at.saturating_duration_since(prev.at).as_secs_f64();
        let before = samples(Some(&prev.families), &sample.name)
            .find(|s| s.labels == sample.labels)
            .map_or(0.0, |s| s.value);
        if dt <= 0.0 || sample.value < before {
            return 0.0;
        }
        (sample.value - before) / dt
    }

    /// The sum of samples named `name` and their rate.
    fn total_and_rate(&self, name: &str) -> (f64, f64) {
        self.samples(name)
            .fold((0.0, 0.0), |(t, r), s| (t + s.value, r + self.rate(s)))
    }

    fn node(&self) -> String {
        self.samples("tidings_messages_published_total")
            .find_map(|s| s.label("node"))
            .map_or_else(String::new, str::to_owned)
    }
}

fn samples<'a>(
    families: Option<&'a [Family]>,
    name: &'a str,
) -> impl Iterator<Item = &'a Sample> + 'a {
    families
        .unwrap_or(&[])
        .iter()
        .flat_map(|f| f.samples.iter())
        .filter(move |s| s.name == name)
}

/// A row of the nodes table.
#[derive(Debug, Default)]
pub(crate) struct NodeRow {
    pub(crate) endpoint: String,
    pub(crate) node: String,
    pub(crate) published_rate: f64,
    pub(crate) delivered_rate: f64,
    pub(crate) repairs_rate: f64,
    pub(crate) unstable: f64,
    pub(crate) stalls: usize,
    pub(crate) status: String,
}

/// A row of the topics table: one topic over every node.
#[derive(Debug, Default)]
pub(crate) struct TopicRow {
    pub(crate) topic: String,
    pub(crate) delivered: f64,
    pub(crate) delivered_rate: f64,
    pub(crate) subscriptions: usize,
    pub(crate) held_s: f64,
}

/// A row of the subscriptions table.
#[derive(Debug, Default)]
pub(crate) struct SubRow {
    pub(crate) endpoint: String,
    pub(crate) node: String,
    pub(crate) topic: String,
    pub(crate) subscription: String,
    pub(crate) lag: f64,
    pub(crate) capacity: f64,
    pub(crate) bottleneck_s: f64,
    pub(crate) delivered_rate: f64,
}

/// A stalled region of a publishing node, and whom it waits for.
#[derive(Debug, Default)]
pub(crate) struct StallRow {
    pub(crate) node: String,
    pub(crate) region: String,
    pub(crate) members: Vec<String>,
    pub(crate) waited_s: f64,
}

/// A region over every node: messages in senders' windows, gaps being repaired.
#[derive(Debug, Default)]
pub(crate) struct RegionRow {
    pub(crate) region: String,
    pub(crate) nodes: usize,
    pub(crate) unstable: f64,
    pub(crate) missing: f64,
}

/// Everything one screen shows.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) nodes: Vec<NodeRow>,
    pub(crate) topics: Vec<TopicRow>,
    pub(crate) subscriptions: Vec<SubRow>,
    pub(crate) stalls: Vec<StallRow>,
    pub(crate) regions: Vec<RegionRow>,
    pub(crate) gms: Vec<String>,
}

impl View {
    fn build(endpoints: &[Endpoint], sort: Sort) -> View {
        let mut view = View::default();
        let mut topics: BTreeMap<String, TopicRow> = BTreeMap::new();
        let mut regions: BTreeMap<String, (BTreeMap<String, ()>, RegionRow)> = BTreeMap::new();
        for e in endpoints {
            let node = e.node();
            if let Some(gms) = gms_line(e) {
                view.gms.push(gms);
            }
            let status = match (&e.error, &e.last) {
                (Some(why), _) => why.clone(),
                (None, None) => "waiting for the first scrape".to_owned(),
                (None, Some(_)) => String::new(),
            };
            if node.is_empty() && status.is_empty() {
                continue; // A membership service: its line is enough.
            }
            let stalls = stall_rows(e, &node);
            view.nodes.push(NodeRow {
                endpoint: e.addr.clone(),
                node: node.clone(),
                published_rate: e.total_and_rate("tidings_messages_published_total").1,
                delivered_rate: e.total_and_rate("tidings_messages_delivered_total").1,
                repairs_rate: e.total_and_rate("tidings_repairs_received_total").1,
                unstable: e.total_and_rate("tidings_unstable_messages").0,
                stalls: stalls.len(),
                status,
            });
            view.stalls.extend(stalls);
            for s in e.samples("tidings_topic_delivered_total") {
                let topic = s.label("topic").unwrap_or("?").to_owned();
                let row = topics.entry(topic.clone()).or_insert_with(|| TopicRow {
                    topic,
                    ..TopicRow::default()
                });
                row.delivered += s.value;
                row.delivered_rate += e.rate(s);
            }
            for s in e.samples("tidings_topic_held_seconds") {
                let topic = s.label("topic").unwrap_or("?").to_owned();
                let row = topics.entry(topic.clone()).or_insert_with(|| TopicRow {
                    topic,
                    ..TopicRow::default()
                });
                row.held_s = row.held_s.max(s.value);
            }
            let subs = sub_rows(e, &node);
            for sub in &subs {
                if let Some(row) = topics.get_mut(&sub.topic) {
                    row.subscriptions += 1;
                }
            }
            view.subscriptions.extend(subs);
            for (name, field) in [
                ("tidings_region_unstable_messages", 0),
                ("tidings_stream_missing_messages", 1),
            ] {
                for s in e.samples(name) {
                    let region = s.label("region").unwrap_or("?").to_owned();
                    let (nodes, row) = regions.entry(region.clone()).or_insert_with(|| {
                        (
                            BTreeMap::new(),
                            RegionRow {
                                region,
                                ..RegionRow::default()
                            },
                        )
                    });
                    nodes.insert(node.clone(), ());
                    row.nodes = nodes.len();
                    if field == 0 {
                        row.unstable += s.value;
                    } else {
                        row.missing += s.value;
                    }
                }
            }
        }
        view.topics = topics.into_values().collect();
        view.regions = regions.into_values().map(|(_, r)| r).collect();
        view.sort(sort);
        view
    }

    fn sort(&mut self, sort: Sort) {
        let desc = |a: f64, b: f64| b.total_cmp(&a);
        match sort {
            Sort::Rate => {
                self.topics
                    .sort_by(|a, b| desc(a.delivered_rate, b.delivered_rate));
                self.subscriptions
                    .sort_by(|a, b| desc(a.delivered_rate, b.delivered_rate));
            }
            Sort::Lag => {
                self.topics.sort_by(|a, b| desc(a.held_s, b.held_s));
                self.subscriptions
                    .sort_by(|a, b| slowness(b).total_cmp(&slowness(a)));
            }
            Sort::Total => {
                self.topics.sort_by(|a, b| desc(a.delivered, b.delivered));
                self.subscriptions.sort_by(|a, b| desc(a.lag, b.lag));
            }
            Sort::Name => {
                self.topics.sort_by(|a, b| a.topic.cmp(&b.topic));
                self.subscriptions
                    .sort_by(|a, b| (&a.topic, &a.node).cmp(&(&b.topic, &b.node)));
            }
        }
    }

    /// The slowest subscription: the one full longest, else the one with the most lag.
    pub(crate) fn slowest(&self) -> Option<&SubRow> {
        self.subscriptions
            .iter()
            .filter(|s| slowness(s) > 0.0)
            .max_by(|a, b| slowness(a).total_cmp(&slowness(b)))
    }
}

/// How slow a subscription is, to rank them: time full first (a held topic slows its
/// senders), then lag relative to its capacity (or in messages, for a callback).
fn slowness(s: &SubRow) -> f64 {
    let fill = if s.capacity > 0.0 {
        s.lag / s.capacity
    } else {
        s.lag / 1e6
    };
    s.bottleneck_s * 1e3 + fill.min(1.0)
}

fn gms_line(e: &Endpoint) -> Option<String> {
    let members = e.samples("tidings_gms_members").collect::<Vec<_>>();
    if members.is_empty() {
        return None;
    }
    let views = e.total_and_rate("tidings_gms_views_issued_total");
    let mut line = format!("{}:", e.addr);
    for m in members {
        let leader = m.label("replica").map_or(String::new(), |r| {
            let leads = e
                .samples("tidings_gms_leader")
                .any(|l| l.label("replica") == Some(r) && l.value >= 1.0);
            format!(" replica {r}{}", if leads { " (leader)" } else { "" })
        });
        line.push_str(&format!("{leader} {} members", m.value));
    }
    line.push_str(&format!(", {} views issued ({:.1}/s)", views.0, views.1));
    Some(line)
}

fn stall_rows(e: &Endpoint, node: &str) -> Vec<StallRow> {
    let mut by_region: BTreeMap<String, StallRow> = BTreeMap::new();
    for s in e.samples("tidings_stall_member_wait_seconds") {
        let region = s.label("region").unwrap_or("?").to_owned();
        let row = by_region.entry(region.clone()).or_insert_with(|| StallRow {
            node: node.to_owned(),
            region,
            ..StallRow::default()
        });
        row.members
            .push(s.label("member").unwrap_or("?").to_owned());
        row.waited_s = row.waited_s.max(s.value);
    }
    by_region.into_values().collect()
}

/// Sets a field of a subscription's row from a sample's value and rate.
type SetField = fn(&mut SubRow, f64, f64);

fn sub_rows(e: &Endpoint, node: &str) -> Vec<SubRow> {
    let key = |s: &Sample| {
        (
            s.label("topic").unwrap_or("?").to_owned(),
            s.label("subscription").unwrap_or("?").to_owned(),
        )
    };
    // Each family fills its field of the subscription's row.
    let fields: [(&str, SetField); 4] = [
        ("tidings_subscription_lag_messages", |r, v, _| r.lag = v),
        ("tidings_subscription_capacity_messages", |r, v, _| {
            r.capacity = v;
        }),
        ("tidings_subscription_bottleneck_seconds", |r, v, _| {
            r.bottleneck_s = v;
        }),
        ("tidings_subscription_delivered_total", |r, _, rate| {
            r.delivered_rate = rate;
        }),
    ];
    let mut out: BTreeMap<(String, String), SubRow> = BTreeMap::new();
    for (name, set) in fields {
        for s in e.samples(name) {
            let (topic, subscription) = key(s);
            let r = out
                .entry((topic.clone(), subscription.clone()))
                .or_insert_with(|| SubRow {
                    endpoint: e.addr.clone(),
                    node: node.to_owned(),
                    topic,
                    subscription,
                    ..SubRow::default()
                });
            set(r, s.value, e.rate(s));
        }
    }
    out.into_values().collect()
}

/// Runs the view until `q` (or Esc, or Ctrl-C).
pub(crate) fn run(a: &TopArgs) -> ExitCode {
    if a.interval_ms == 0 || a.timeout_ms == 0 {
        eprintln!("error: --interval-ms and --timeout-ms must be positive");
        return ExitCode::from(2);
    }
    let mut terminal = ratatui::init();
    let result = run_in(&mut terminal, a);
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

// The screen refreshes on the wall clock: it is an operator's view, not protocol logic.
#[allow(clippy::disallowed_methods)]
fn run_in(terminal: &mut ratatui::DefaultTerminal, a: &TopArgs) -> io::Result<()> {
    let mut endpoints: Vec<Endpoint> = Vec::new();
    let interval = Duration::from_millis(a.interval_ms);
    let (results_tx, results) = mpsc::channel::<Scraped>();
    let (rounds, round_rx) = mpsc::sync_channel::<()>(1);
    let (gms, addrs) = (a.gms.clone(), a.addrs.clone());
    let (timeout, body_max) = (Duration::from_millis(a.timeout_ms), a.body_bytes_max);
    // The scraper: one round of every endpoint per request (the services' first, then the
    // endpoints given and those the services list), results as they come.
    let scraper = std::thread::Builder::new()
        .name("tidings-top-scrape".to_owned())
        .spawn(move || {
            let one = |addr: &str| {
                scrape::scrape(addr, timeout, body_max).map(|families| Scrape {
                    at: Instant::now(),
                    families,
                })
            };
            // The members last listed: kept while no service answers, so that a service's
            // failover does not blank the screen.
            let mut listed = Vec::new();
            while round_rx.recv().is_ok() {
                let mut found = Vec::new();
                let mut scraped = Vec::new();
                let mut answered = false;
                for addr in &gms {
                    let r = one(addr);
                    if let Ok(s) = &r {
                        answered = true;
                        found.extend(member_endpoints(&s.families));
                    }
                    scraped.push((addr.clone(), r));
                }
                if answered {
                    listed.clone_from(&found);
                } else {
                    found.clone_from(&listed);
                }
                let mut round: Vec<String> = gms.clone();
                for addr in addrs.iter().chain(&found) {
                    if !round.contains(addr) {
                        round.push(addr.clone());
                    }
                }
                if results_tx.send(Scraped::Round(round.clone())).is_err() {
                    return;
                }
                for (addr, r) in scraped {
                    if results_tx.send(Scraped::One(addr, r)).is_err() {
                        return;
                    }
                }
                for addr in round.iter().skip(gms.len()) {
                    if results_tx
                        .send(Scraped::One(addr.clone(), one(addr)))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        })?;
    let mut sort = Sort::Rate;
    let mut next_round = Instant::now();
    let mut view = View::default();
    let result = loop {
        if Instant::now() >= next_round {
            // A round still running (slow endpoints) is not doubled.
            let _ = rounds.try_send(());
            next_round += interval;
        }
        let mut changed = false;
        while let Ok(scraped) = results.try_recv() {
            match scraped {
                Scraped::Round(addrs) => set_endpoints(&mut endpoints, &addrs),
                Scraped::One(addr, r) => {
                    let Some(e) = endpoints.iter_mut().find(|e| e.addr == addr) else {
                        continue;
                    };
                    match r {
                        Ok(s) => {
                            e.prev = e.last.replace(s);
                            e.error = None;
                        }
                        Err(why) => e.error = Some(why),
                    }
                }
            }
            changed = true;
        }
        if changed {
            view = View::build(&endpoints, sort);
        }
        if let Err(e) = terminal.draw(|f| draw(f, &view, sort, &endpoints)) {
            break Err(e);
        }
        let wait = next_round
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        match event::poll(wait) {
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                    let ctrl_c = k.code == KeyCode::Char('c')
                        && k.modifiers.contains(event::KeyModifiers::CONTROL);
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => break Ok(()),
                        _ if ctrl_c => break Ok(()),
                        KeyCode::Char('r') => sort = Sort::Rate,
                        KeyCode::Char('l') => sort = Sort::Lag,
                        KeyCode::Char('t') => sort = Sort::Total,
                        KeyCode::Char('n') => sort = Sort::Name,
                        _ => {}
                    }
                    view.sort(sort);
                }
                Ok(_) => {}
                Err(e) => break Err(e),
            },
            Ok(false) => {}
            Err(e) => break Err(e),
        }
    };
    drop(rounds);
    drop(results);
    // The scraper ends after its current scrape (each bounded by the timeout).
    let _ = scraper.join();
    result
}

/// What the scraper reports: the endpoints of a round (before their scrapes), or one scrape.
enum Scraped {
    Round(Vec<String>),
    One(String, Result<Scrape, String>),
}

/// The members' metrics endpoints a membership service's scrape lists.
pub(crate) fn member_endpoints(families: &[Family]) -> Vec<String> {
    samples(Some(families), "tidings_gms_member_metrics_info")
        .filter_map(|s| s.label("address"))
        .map(str::to_owned)
        .collect()
}

/// Makes `endpoints` those of `addrs`, in that order: the ones kept keep their scrapes (for
/// rates), new ones start empty, the others (members that left) go.
fn set_endpoints(endpoints: &mut Vec<Endpoint>, addrs: &[String]) {
    let mut old = std::mem::take(endpoints);
    for addr in addrs {
        let e = match old.iter().position(|e| &e.addr == addr) {
            Some(i) => old.swap_remove(i),
            None => Endpoint {
                addr: addr.clone(),
                last: None,
                prev: None,
                error: None,
            },
        };
        endpoints.push(e);
    }
}

fn rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn draw(f: &mut Frame, view: &View, sort: Sort, endpoints: &[Endpoint]) {
    let nodes_h = (view.nodes.len() as u16).clamp(1, 12) + 3;
    let bottom_h = (view.stalls.len().max(view.regions.len()) as u16).clamp(1, 8) + 3;
    let [header, slowest, nodes, middle, bottom, footer] = Layout::vertical([
        Constraint::Length(1 + view.gms.len() as u16),
        Constraint::Length(1),
        Constraint::Length(nodes_h),
        Constraint::Min(6),
        Constraint::Length(bottom_h),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let mut head = vec![Line::from(format!(
        "tidings top: {} endpoints, sorted by {}",
        endpoints.len(),
        sort.name()
    ))
    .bold()];
    head.extend(view.gms.iter().map(|g| Line::from(format!("gms {g}"))));
    f.render_widget(Paragraph::new(head), header);
    let slow = match view.slowest() {
        Some(s) => Line::from(format!(
            "slowest subscriber: node {} ({}) topic {} sub {}: lag {:.0}/{:.0}, full for {:.1} s",
            s.node, s.endpoint, s.topic, s.subscription, s.lag, s.capacity, s.bottleneck_s
        ))
        .style(Style::new().add_modifier(Modifier::BOLD).red()),
        None => Line::from("slowest subscriber: none behind"),
    };
    f.render_widget(Paragraph::new(slow), slowest);
    draw_nodes(f, view, nodes);
    let [topics, subs] =
        Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(middle);
    draw_topics(f, view, topics);
    draw_subscriptions(f, view, subs);
    let [stalls, regions] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(bottom);
    draw_stalls(f, view, stalls);
    draw_regions(f, view, regions);
    f.render_widget(
        Paragraph::new("q quit   sort: r rate  l lag  t total  n name").dim(),
        footer,
    );
}

fn header_row(cells: &[&'static str]) -> Row<'static> {
    Row::new(cells.to_vec()).style(Style::new().add_modifier(Modifier::BOLD))
}

fn draw_nodes(f: &mut Frame, view: &View, area: Rect) {
    let rows = view.nodes.iter().map(|n| {
        Row::new(vec![
            n.node.clone(),
            n.endpoint.clone(),
            rate(n.published_rate),
            rate(n.delivered_rate),
            rate(n.repairs_rate),
            format!("{:.0}", n.unstable),
            n.stalls.to_string(),
            n.status.clone(),
        ])
    });
    let widths = [
        Constraint::Length(5),
        Constraint::Length(22),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header_row(&[
            "node", "metrics", "pub/s", "deliv/s", "repair/s", "unstable", "stalls", "status",
        ]))
        .block(Block::bordered().title("nodes"));
    f.render_widget(table, area);
}

fn draw_topics(f: &mut Frame, view: &View, area: Rect) {
    let rows = view.topics.iter().map(|t| {
        Row::new(vec![
            t.topic.clone(),
            rate(t.delivered_rate),
            format!("{:.0}", t.delivered),
            t.subscriptions.to_string(),
            if t.held_s > 0.0 {
                format!("{:.1}", t.held_s)
            } else {
                String::new()
            },
        ])
    });
    let widths = [
        Constraint::Fill(1),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(5),
        Constraint::Length(7),
    ];
    let table = Table::new(rows, widths)
        .header(header_row(&[
            "topic",
            "deliv/s",
            "delivered",
            "subs",
            "held s",
        ]))
        .block(Block::bordered().title("topics (busiest first by rate)"));
    f.render_widget(table, area);
}

fn draw_subscriptions(f: &mut Frame, view: &View, area: Rect) {
    let slowest = view
        .slowest()
        .map(|s| (&s.endpoint, &s.topic, &s.subscription));
    let rows = view.subscriptions.iter().map(|s| {
        let row = Row::new(vec![
            s.node.clone(),
            s.topic.clone(),
            s.subscription.clone(),
            rate(s.delivered_rate),
            format!("{:.0}", s.lag),
            if s.capacity > 0.0 {
                format!("{:.0}", s.capacity)
            } else {
                "-".to_owned()
            },
            if s.bottleneck_s > 0.0 {
                format!("{:.1}", s.bottleneck_s)
            } else {
                String::new()
            },
        ]);
        if Some((&s.endpoint, &s.topic, &s.subscription)) == slowest {
            row.style(Style::new().red())
        } else {
            row
        }
    });
    let widths = [
        Constraint::Length(5),
        Constraint::Fill(1),
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(7),
    ];
    let table = Table::new(rows, widths)
        .header(header_row(&[
            "node", "topic", "sub", "deliv/s", "lag", "cap", "full s",
        ]))
        .block(Block::bordered().title("subscriptions"));
    f.render_widget(table, area);
}

fn draw_stalls(f: &mut Frame, view: &View, area: Rect) {
    let rows = view.stalls.iter().map(|s| {
        Row::new(vec![
            s.node.clone(),
            s.region.clone(),
            format!("{:.1}", s.waited_s),
            s.members.join(","),
        ])
    });
    let widths = [
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header_row(&[
            "node",
            "region",
            "waited",
            "waits for members",
        ]))
        .block(Block::bordered().title("stalled publishers"));
    f.render_widget(table, area);
}

fn draw_regions(f: &mut Frame, view: &View, area: Rect) {
    let rows = view.regions.iter().map(|r| {
        Row::new(vec![
            r.region.clone(),
            r.nodes.to_string(),
            format!("{:.0}", r.unstable),
            format!("{:.0}", r.missing),
        ])
    });
    let widths = [
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header_row(&["region", "nodes", "unstable", "missing"]))
        .block(Block::bordered().title("regions"));
    f.render_widget(table, area);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[allow(clippy::disallowed_methods)] // a base for two scrapes 2 s apart
    fn endpoint(addr: &str, before: &str, after: &str) -> Endpoint {
        let at = Instant::now();
        Endpoint {
            addr: addr.to_owned(),
            prev: Some(Scrape {
                at,
                families: scrape::parse(before).unwrap(),
            }),
            last: Some(Scrape {
                at: at + Duration::from_secs(2),
                families: scrape::parse(after).unwrap(),
            }),
            error: None,
        }
    }

    #[test]
    fn members_are_found_in_the_services_scrape_and_kept_across_rounds() {
        let service = "# TYPE tidings_gms_member_metrics_info gauge\n\
            tidings_gms_member_metrics_info{member=\"1\",address=\"127.0.0.1:9464\"} 1.0\n\
            tidings_gms_member_metrics_info{member=\"2\",address=\"[::1]:9465\"} 1.0\n\
            # TYPE tidings_gms_members gauge\n\
            tidings_gms_members 3\n";
        let found = member_endpoints(&scrape::parse(service).unwrap());
        assert_eq!(found, ["127.0.0.1:9464", "[::1]:9465"]);
        let mut endpoints = vec![endpoint("127.0.0.1:9464", "", "")];
        set_endpoints(
            &mut endpoints,
            &["gms:9400".to_owned(), "127.0.0.1:9464".to_owned()],
        );
        let addrs: Vec<&str> = endpoints.iter().map(|e| e.addr.as_str()).collect();
        assert_eq!(addrs, ["gms:9400", "127.0.0.1:9464"]);
        // The kept endpoint keeps its scrapes; one that left goes.
        assert!(endpoints[1].last.is_some() && endpoints[0].last.is_none());
        set_endpoints(&mut endpoints, &["gms:9400".to_owned()]);
        assert_eq!(endpoints.len(), 1);
    }

    #[test]
    fn the_view_ranks_topics_by_rate_and_names_the_slowest_subscription() {
        let before = "# TYPE tidings_topic_delivered counter\n\
            tidings_topic_delivered_total{node=\"2\",topic=\"busy\"} 100\n\
            tidings_topic_delivered_total{node=\"2\",topic=\"quiet\"} 10\n";
        let after = "# TYPE tidings_messages_published counter\n\
            tidings_messages_published_total{node=\"2\"} 0\n\
            # TYPE tidings_topic_delivered counter\n\
            tidings_topic_delivered_total{node=\"2\",topic=\"busy\"} 300\n\
            tidings_topic_delivered_total{node=\"2\",topic=\"quiet\"} 12\n\
            # TYPE tidings_subscription_lag_messages gauge\n\
            tidings_subscription_lag_messages{node=\"2\",topic=\"busy\",subscription=\"1\"} 3\n\
            tidings_subscription_lag_messages{node=\"2\",topic=\"quiet\",subscription=\"2\"} 8\n\
            # TYPE tidings_subscription_capacity_messages gauge\n\
            tidings_subscription_capacity_messages{node=\"2\",topic=\"busy\",subscription=\"1\"} 1024\n\
            tidings_subscription_capacity_messages{node=\"2\",topic=\"quiet\",subscription=\"2\"} 8\n\
            # TYPE tidings_subscription_bottleneck_seconds gauge\n\
            tidings_subscription_bottleneck_seconds{node=\"2\",topic=\"quiet\",subscription=\"2\"} 1.5\n\
            # TYPE tidings_stall_member_wait_seconds gauge\n\
            tidings_stall_member_wait_seconds{node=\"2\",region=\"4\",member=\"3\"} 6\n\
            tidings_stall_member_wait_seconds{node=\"2\",region=\"4\",member=\"5\"} 6\n";
        let e = endpoint("127.0.0.1:1", before, after);
        let view = View::build(&[e], Sort::Rate);
        assert_eq!(view.topics[0].topic, "busy");
        assert_eq!(view.topics[0].delivered_rate, 100.0);
        assert_eq!(view.topics[1].delivered_rate, 1.0);
        let slowest = view.slowest().unwrap();
        assert_eq!(
            (slowest.topic.as_str(), slowest.node.as_str()),
            ("quiet", "2")
        );
        assert_eq!(view.stalls.len(), 1);
        assert_eq!(view.stalls[0].members, ["3", "5"]);
        assert_eq!(view.nodes[0].stalls, 1);
        let mut view = view;
        view.sort(Sort::Name);
        assert_eq!(view.subscriptions[0].topic, "busy");
        view.sort(Sort::Lag);
        assert_eq!(view.subscriptions[0].topic, "quiet");
    }
}
