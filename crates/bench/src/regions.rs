//! The `tidings sim regions` experiment: paper 001's Figures 5 and 6 on a generated workload,
//! fed to the membership service's region planner.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use tidings_wire::{NodeId, TopicId};

use tidings_gms::{Planner, PlannerConfig, PlannerStats, SubsetId};

/// The workload of the experiment. Build with [`RegionsParams::new`] (or `Default`) and adjust.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionsParams {
    /// Nodes (paper 001: 250 to 2000).
    pub nodes: usize,
    /// Topics (paper 001: 1000 to 10000).
    pub topics: usize,
    /// Fraction of the topics each node subscribes to (paper 001: "some 10%", so 0.1).
    pub interest: f64,
    /// Exponent of the Zipf popularity of topics: topic of rank `r` (1-based) has weight
    /// `1 / r^zipf` (paper 001 uses Zipf popularity; 1.0 is the classic law).
    pub zipf: f64,
    /// Seed of the workload; the same seed gives the same figures.
    pub seed: u64,
    /// Interest communities (0: none, every node draws its topics independently, which is how
    /// paper 001 describes its workload). With `c > 0`, node `i` belongs to community `i mod c`;
    /// each community draws one profile of topics by Zipf popularity, and its nodes subscribe to
    /// that profile, except for a [`personal`](Self::personal) share drawn on their own. This
    /// models correlated interest: nodes that share some topics share many.
    pub communities: usize,
    /// With communities, the share of each node's subscriptions drawn independently of its
    /// community (0.0: a node subscribes to exactly its community's profile).
    pub personal: f64,
    /// Topics alone in their subset with at most this many subscribers go through personal
    /// regions in the figures `personal_*` (ADR 0010); more popular ones keep their region.
    /// Default 100.
    pub personal_subscribers_max: usize,
    /// The planner's tuning.
    pub planner: PlannerConfig,
    /// Also run the paper's batch greedy ([`Planner::from_scratch`]) on the final subscriptions
    /// and report its figures (`batch`). Default false: it doubles the run time (about 10 s more
    /// at 2000 nodes x 10000 topics).
    pub compare_batch: bool,
}

impl Default for RegionsParams {
    fn default() -> Self {
        RegionsParams {
            nodes: 2000,
            topics: 10000,
            interest: 0.1,
            zipf: 1.0,
            seed: 1,
            communities: 0,
            personal: 0.0,
            personal_subscribers_max: 100,
            planner: PlannerConfig::default(),
            compare_batch: false,
        }
    }
}

impl RegionsParams {
    /// The workload with default planner tuning.
    #[must_use]
    pub fn new(nodes: usize, topics: usize, interest: f64, zipf: f64, seed: u64) -> RegionsParams {
        RegionsParams {
            nodes,
            topics,
            interest,
            zipf,
            seed,
            ..RegionsParams::default()
        }
    }
}

/// How many regions have a size in `min..=max`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    /// Smallest size in the bucket.
    pub min: usize,
    /// Largest size in the bucket (`usize::MAX` for the last).
    pub max: usize,
    /// Regions with a size in the bucket.
    pub regions: usize,
}

/// The figures of one region structure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StructureFigures {
    /// Regions per node with at least one subscription, mean (paper 001 Figure 5: 4-14).
    pub regions_per_node_mean: f64,
    /// Regions per node, max.
    pub regions_per_node_max: usize,
    /// Regions per topic with at least one subscriber, max (paper 001: about 5).
    pub regions_per_topic_max: usize,
    /// Regions per topic, mean.
    pub regions_per_topic_mean: f64,
    /// Members per region, mean over regions (paper 001: 5-10).
    pub region_size_mean: f64,
    /// Members per region, max.
    pub region_size_max: usize,
    /// Size of the region of an average (node, region) membership: what a node sees.
    pub region_size_member_weighted_mean: f64,
    /// Mean over nodes of the share of the node's received packets that fall in its two busiest
    /// regions, each topic publishing at a rate proportional to its popularity (paper 001
    /// Figure 6: about 95%).
    pub top2_region_traffic_share: f64,
    /// The same with every topic publishing at the same rate.
    pub top2_region_traffic_share_uniform: f64,
    /// Regions per node, mean, if the topics alone in their subset (with at most
    /// `personal_subscribers_max` subscribers) reached each subscriber through one region of its
    /// own (a *personal region*: its one member subscribes to every
    /// topic it carries, so it stays exact) instead of one region per topic. ADR 0010.
    pub personal_regions_per_node_mean: f64,
    /// What personal regions cost on IP multicast: datagrams a publisher sends per message with
    /// them over datagrams with the planned regions, weighted by topic rate (popularity). Such a
    /// topic is one multicast region today and one unicast copy per subscriber
    /// with personal regions. On unicast fan-out the cost is the same either way (1.0).
    pub personal_multicast_send_factor: f64,
    /// Waste per node, mean: the share of the messages a node receives (each topic at its
    /// publishing rate, its popularity) that are on topics it does not subscribe to, and that
    /// it discards. With messages of one size, the share of bytes. 0 with exact regions.
    pub waste_mean: f64,
    /// Waste per node, max (at most the planner's `waste_max_permille` / 1000).
    pub waste_max: f64,
    /// Topics a node receives without subscribing to them (its pads), mean per node.
    pub pads_per_node_mean: f64,
    /// Subsets of regularly overlapping topics.
    pub subsets: usize,
    /// Regions.
    pub regions: usize,
    /// Topics alone in their subset (they could not join any other).
    pub singleton_subsets: usize,
    /// Region sizes.
    pub region_size_histogram: Vec<SizeBucket>,
    /// Wall time of building the structure, in milliseconds.
    pub elapsed_ms: u64,
}

/// The result of [`regions_report`]. The JSON names of the headline figures are fixed (the CLI's
/// `--json` prints this).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegionsReport {
    /// Nodes.
    pub nodes: usize,
    /// Topics.
    pub topics: usize,
    /// Interest (fraction of topics per node).
    pub interest: f64,
    /// Zipf exponent.
    pub zipf: f64,
    /// Seed.
    pub seed: u64,
    /// Interest communities (0: independent draws).
    pub communities: usize,
    /// Share of each node's subscriptions drawn outside its community.
    pub personal: f64,
    /// Subscriptions fed to the planner.
    pub subscriptions: usize,
    /// Topics with at least one subscriber.
    pub topics_subscribed: usize,
    /// Regions per node, mean (incremental planner).
    pub regions_per_node_mean: f64,
    /// Regions per node, max.
    pub regions_per_node_max: usize,
    /// Regions per topic, max.
    pub regions_per_topic_max: usize,
    /// Regions per topic, mean.
    pub regions_per_topic_mean: f64,
    /// Members per region, mean.
    pub region_size_mean: f64,
    /// Members per region, max.
    pub region_size_max: usize,
    /// Share of a node's packets in its two busiest regions (popularity-proportional rates).
    pub top2_region_traffic_share: f64,
    /// The planner's bound on waste, in thousandths (0: exact regions).
    pub waste_max_permille: u32,
    /// Waste per node, mean (share of received messages, by rate, discarded).
    pub waste_mean: f64,
    /// Waste per node, max.
    pub waste_max: f64,
    /// Wall time of the incremental computation (every subscription fed one by one), in ms.
    pub elapsed_ms: u64,
    /// Wall time of generating the workload, in ms (not included in `elapsed_ms`).
    pub workload_ms: u64,
    /// All figures of the incremental planner.
    pub incremental: StructureFigures,
    /// The planner's work counters.
    pub planner_stats: PlannerStatsReport,
    /// The figures of the paper's batch greedy on the same final subscriptions, if requested.
    pub batch: Option<StructureFigures>,
}

/// [`PlannerStats`] in serializable form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannerStatsReport {
    /// Placements attempted.
    pub placements_tried: u64,
    /// Placements that moved a topic.
    pub placements_moved: u64,
    /// Candidate subsets evaluated.
    pub candidates_evaluated: u64,
    /// Topics evicted for breaking the regions-per-topic bound.
    pub evictions: u64,
    /// Topics that joined a subset holding a region of exactly their subscribers.
    pub identical_joins: u64,
    /// Node moves between regions.
    pub node_moves: u64,
    /// Pads given to nodes (approximate regions).
    pub pads_added: u64,
    /// Subscriptions served by joining a region that carries more than the node wants.
    pub carrier_joins: u64,
    /// Regions that took a placed topic whole, padding some members.
    pub absorptions: u64,
    /// Moves back to exact regions to keep a node within the bound.
    pub sheds: u64,
}

impl From<&PlannerStats> for PlannerStatsReport {
    fn from(s: &PlannerStats) -> Self {
        PlannerStatsReport {
            placements_tried: s.placements_tried,
            placements_moved: s.placements_moved,
            candidates_evaluated: s.candidates_evaluated,
            evictions: s.evictions,
            identical_joins: s.identical_joins,
            node_moves: s.node_moves,
            pads_added: s.pads_added,
            carrier_joins: s.carrier_joins,
            absorptions: s.absorptions,
            sheds: s.sheds,
        }
    }
}

/// The subscriptions of the workload: for each node (in order), its topics in the order it
/// subscribes to them, plus each topic's publishing weight (its popularity).
#[derive(Clone, Debug)]
pub struct Workload {
    /// Each node's topics, in the order it subscribes to them.
    pub subscriptions: Vec<(NodeId, Vec<TopicId>)>,
    /// `weight[t - 1]` is topic `t`'s publishing rate (its popularity).
    pub weight: Vec<f64>,
}

/// Generates the workload of paper 001: each node subscribes to `round(interest * topics)`
/// distinct topics drawn by Zipf popularity, in a random order; with
/// [`communities`](RegionsParams::communities), a node takes its community's profile instead,
/// except for its [`personal`](RegionsParams::personal) share. Topic of rank `r` is `TopicId(r)`,
/// node `i` is `NodeId(i + 1)`.
pub fn workload(params: &RegionsParams) -> Workload {
    let mut rng = fastrand::Rng::with_seed(params.seed);
    let weight: Vec<f64> = (1..=params.topics)
        .map(|r| 1.0 / (r as f64).powf(params.zipf))
        .collect();
    let interest = params.interest.clamp(0.0, 1.0);
    let k = ((interest * params.topics as f64).round() as usize).min(params.topics);
    let mut keys: Vec<(f64, u32)> = Vec::with_capacity(params.topics);
    let profiles: Vec<Vec<TopicId>> = (0..params.communities)
        .map(|_| zipf_sample(&mut rng, &weight, k, &mut keys))
        .collect();
    let personal = ((params.personal.clamp(0.0, 1.0) * k as f64).round() as usize).min(k);
    let mut subscriptions = Vec::with_capacity(params.nodes);
    for i in 0..params.nodes {
        let mut chosen = zipf_sample(&mut rng, &weight, k, &mut keys);
        if let Some(profile) = profiles.get(i % params.communities.max(1)) {
            // The profile (in its shuffled order) less `personal` topics, then that many of the
            // node's own draws that the kept part lacks.
            let kept: BTreeSet<TopicId> = profile[..k - personal].iter().copied().collect();
            let own = chosen.iter().copied().filter(|t| !kept.contains(t));
            let mut mine: Vec<TopicId> = kept.iter().copied().chain(own.take(personal)).collect();
            rng.shuffle(&mut mine);
            chosen = mine;
        }
        subscriptions.push((NodeId(i as u32 + 1), chosen));
    }
    Workload {
        subscriptions,
        weight,
    }
}

/// `k` distinct topics drawn by weight (weighted sampling without replacement,
/// Efraimidis-Spirakis: the `k` largest of `ln(u) / w`), in a random order.
fn zipf_sample(
    rng: &mut fastrand::Rng,
    weight: &[f64],
    k: usize,
    keys: &mut Vec<(f64, u32)>,
) -> Vec<TopicId> {
    if k == 0 {
        return Vec::new();
    }
    keys.clear();
    for (t, &w) in weight.iter().enumerate() {
        // ln(u) < 0; divided by the weight, popular topics get keys nearer zero (larger).
        let u = rng.f64().max(f64::MIN_POSITIVE);
        keys.push((u.ln() / w, t as u32 + 1));
    }
    keys.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
    let mut chosen: Vec<TopicId> = keys[..k].iter().map(|&(_, t)| TopicId(t)).collect();
    rng.shuffle(&mut chosen);
    chosen
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the experiment: generates the workload, feeds it to the planner one subscription at a
/// time (node by node), and measures the structure as paper 001's Figures 5 and 6 do.
#[must_use]
pub fn regions_report(params: &RegionsParams) -> RegionsReport {
    // The experiment measures its own wall time; this is the CLI's report, not protocol code.
    #[allow(clippy::disallowed_methods)]
    let start = std::time::Instant::now();
    let load = workload(params);
    let workload_ms = millis(start.elapsed());

    // An invalid planner config falls back to the defaults (the report states the config used).
    let (config, mut planner) = match Planner::new(params.planner.clone()) {
        Ok(planner) => (params.planner.clone(), planner),
        Err(_) => (PlannerConfig::default(), Planner::default()),
    };
    #[allow(clippy::disallowed_methods)]
    let start = std::time::Instant::now();
    // Each topic's weight is its publishing rate (its popularity), scaled so the least popular
    // topic of 10,000 weighs about 100: what the waste bound counts in.
    let top = load
        .weight
        .first()
        .copied()
        .unwrap_or(1.0)
        .max(f64::MIN_POSITIVE);
    for (i, &w) in load.weight.iter().enumerate() {
        let weight = (1e6 * w / top).round().max(1.0) as u64;
        let _changes = planner.set_topic_weight(TopicId(i as u32 + 1), weight);
    }
    let mut subscriptions = 0usize;
    for (n, ts) in &load.subscriptions {
        // Each node subscribes to its interests at once, as one operation.
        let _changes = planner.subscribe_many(*n, ts);
        subscriptions += ts.len();
    }
    let elapsed_ms = millis(start.elapsed());
    let mut incremental = figures(&planner, &load.weight, params.personal_subscribers_max);
    incremental.elapsed_ms = elapsed_ms;

    let batch = params.compare_batch.then(|| {
        let table: BTreeMap<NodeId, BTreeSet<TopicId>> = load
            .subscriptions
            .iter()
            .map(|(n, ts)| (*n, ts.iter().copied().collect()))
            .collect();
        #[allow(clippy::disallowed_methods)]
        let start = std::time::Instant::now();
        let p = Planner::from_scratch(config.clone(), &table).unwrap_or_default();
        let ms = millis(start.elapsed());
        let mut f = figures(&p, &load.weight, params.personal_subscribers_max);
        f.elapsed_ms = ms;
        f
    });

    RegionsReport {
        nodes: params.nodes,
        topics: params.topics,
        interest: params.interest,
        zipf: params.zipf,
        seed: params.seed,
        communities: params.communities,
        personal: params.personal,
        subscriptions,
        topics_subscribed: planner.topic_count(),
        regions_per_node_mean: incremental.regions_per_node_mean,
        regions_per_node_max: incremental.regions_per_node_max,
        regions_per_topic_max: incremental.regions_per_topic_max,
        regions_per_topic_mean: incremental.regions_per_topic_mean,
        region_size_mean: incremental.region_size_mean,
        region_size_max: incremental.region_size_max,
        top2_region_traffic_share: incremental.top2_region_traffic_share,
        waste_max_permille: config.waste_max_permille,
        waste_mean: incremental.waste_mean,
        waste_max: incremental.waste_max,
        elapsed_ms,
        workload_ms,
        planner_stats: PlannerStatsReport::from(planner.stats()),
        incremental,
        batch,
    }
}

const BUCKETS: [(usize, usize); 9] = [
    (1, 1),
    (2, 4),
    (5, 10),
    (11, 20),
    (21, 50),
    (51, 100),
    (101, 500),
    (501, 1000),
    (1001, usize::MAX),
];

/// Measures a structure. `weight[t - 1]` is topic `t`'s publishing rate.
fn figures(planner: &Planner, weight: &[f64], personal_max: usize) -> StructureFigures {
    let rate = |t: TopicId| {
        weight
            .get((t.0 as usize).wrapping_sub(1))
            .copied()
            .unwrap_or(0.0)
    };
    let mut singletons = BTreeSet::new();
    let mut subset_topics: BTreeMap<SubsetId, usize> = BTreeMap::new();
    for t in planner.topics() {
        if let Some(s) = planner.subset_of(t) {
            *subset_topics.entry(s).or_default() += 1;
        }
    }
    for (s, c) in subset_topics {
        if c == 1 {
            singletons.insert(s);
        }
    }
    // Topics alone in their subset with few enough subscribers to go through personal regions.
    let personal: BTreeSet<SubsetId> = singletons
        .iter()
        .copied()
        .filter(|&s| {
            planner
                .subset_topics(s)
                .all(|t| planner.subscribers(t).count() <= personal_max)
        })
        .collect();
    let mut personal_per_node_sum = 0usize;
    let mut per_node_sum = 0usize;
    let mut per_node_max = 0usize;
    let mut share_sum = 0.0;
    let mut share_uniform_sum = 0.0;
    let mut nodes = 0usize;
    let (mut waste_sum, mut waste_max, mut pads_sum) = (0.0f64, 0.0f64, 0usize);
    let mut traffic: Vec<f64> = Vec::new();
    let mut traffic_uniform: Vec<f64> = Vec::new();
    for n in planner.nodes() {
        let shared = planner
            .node_regions(n)
            .filter(|(subset, _)| !personal.contains(subset))
            .count();
        let alone = planner
            .node_regions(n)
            .any(|(subset, _)| personal.contains(&subset));
        personal_per_node_sum += shared + usize::from(alone);
        let regions: Vec<_> = planner.node_regions(n).map(|(_, r)| r).collect();
        nodes += 1;
        let waste = planner.waste(n);
        waste_sum += waste;
        waste_max = waste_max.max(waste);
        pads_sum += planner.pads(n).count();
        per_node_sum += regions.len();
        per_node_max = per_node_max.max(regions.len());
        traffic.clear();
        traffic_uniform.clear();
        for r in regions {
            if let Some(reg) = planner.region(r) {
                traffic.push(reg.topics.iter().map(|&t| rate(t)).sum());
                traffic_uniform.push(reg.topics.len() as f64);
            }
        }
        share_sum += top2_share(&mut traffic);
        share_uniform_sum += top2_share(&mut traffic_uniform);
    }
    let mut per_topic_sum = 0usize;
    let mut per_topic_max = 0usize;
    let (mut planned_sends, mut personal_sends) = (0.0, 0.0);
    for t in planner.topics() {
        let c = planner.topic_regions(t).count();
        per_topic_sum += c;
        per_topic_max = per_topic_max.max(c);
        planned_sends += rate(t) * c as f64;
        let alone = planner.subset_of(t).is_some_and(|s| personal.contains(&s));
        personal_sends += rate(t)
            * if alone {
                planner.subscribers(t).count() as f64
            } else {
                c as f64
            };
    }
    let mut size_sum = 0usize;
    let mut size_sq_sum = 0usize;
    let mut size_max = 0usize;
    let mut histogram: Vec<SizeBucket> = BUCKETS
        .iter()
        .map(|&(min, max)| SizeBucket {
            min,
            max,
            regions: 0,
        })
        .collect();
    for (_, reg) in planner.regions() {
        let size = reg.members.len();
        size_sum += size;
        size_sq_sum += size * size;
        size_max = size_max.max(size);
        if let Some(b) = histogram
            .iter_mut()
            .find(|b| size >= b.min && size <= b.max)
        {
            b.regions += 1;
        }
    }
    let ratio = |a: f64, b: usize| if b == 0 { 0.0 } else { a / b as f64 };
    StructureFigures {
        regions_per_node_mean: ratio(per_node_sum as f64, nodes),
        regions_per_node_max: per_node_max,
        regions_per_topic_max: per_topic_max,
        regions_per_topic_mean: ratio(per_topic_sum as f64, planner.topic_count()),
        region_size_mean: ratio(size_sum as f64, planner.region_count()),
        region_size_max: size_max,
        region_size_member_weighted_mean: ratio(size_sq_sum as f64, size_sum),
        top2_region_traffic_share: ratio(share_sum, nodes),
        top2_region_traffic_share_uniform: ratio(share_uniform_sum, nodes),
        personal_regions_per_node_mean: ratio(personal_per_node_sum as f64, nodes),
        personal_multicast_send_factor: if planned_sends > 0.0 {
            personal_sends / planned_sends
        } else {
            1.0
        },
        waste_mean: ratio(waste_sum, nodes),
        waste_max,
        pads_per_node_mean: ratio(pads_sum as f64, nodes),
        subsets: planner.subset_count(),
        regions: planner.region_count(),
        singleton_subsets: singletons.len(),
        region_size_histogram: histogram,
        elapsed_ms: 0,
    }
}

/// The share of the two largest entries in the total (1 for one or two entries).
fn top2_share(traffic: &mut [f64]) -> f64 {
    let total: f64 = traffic.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    traffic.sort_by(|a, b| b.total_cmp(a));
    traffic.iter().take(2).sum::<f64>() / total
}

impl RegionsReport {
    /// The report for humans, with paper 001's figures alongside.
    #[must_use]
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "regions: {} nodes, {} topics ({} subscribed), interest {}, zipf {}, seed {}: {} subscriptions",
            self.nodes,
            self.topics,
            self.topics_subscribed,
            self.interest,
            self.zipf,
            self.seed,
            self.subscriptions
        );
        if self.waste_max_permille > 0 {
            let _ = writeln!(
                s,
                "approximate regions: waste at most {:.1}% per node (the batch greedy plans exact regions)",
                f64::from(self.waste_max_permille) / 10.0
            );
        }
        if self.communities > 0 {
            let _ = writeln!(
                s,
                "correlated interest: {} communities, {}% of each node's topics its own",
                self.communities,
                self.personal * 100.0
            );
        }
        let _ = writeln!(
            s,
            "{:<38} {:>14} {:>14}   paper 001",
            "", "incremental", "batch greedy"
        );
        let b = self.batch.as_ref();
        let i = &self.incremental;
        let row = |s: &mut String, name: &str, inc: String, bat: Option<String>, paper: &str| {
            let _ = writeln!(
                s,
                "{name:<38} {inc:>14} {:>14}   {paper}",
                bat.unwrap_or_else(|| "-".into())
            );
        };
        row(
            &mut s,
            "regions per node, mean / max",
            format!(
                "{:.1} / {}",
                i.regions_per_node_mean, i.regions_per_node_max
            ),
            b.map(|b| {
                format!(
                    "{:.1} / {}",
                    b.regions_per_node_mean, b.regions_per_node_max
                )
            }),
            "4-14 (mean)",
        );
        row(
            &mut s,
            "regions per topic, mean / max",
            format!(
                "{:.2} / {}",
                i.regions_per_topic_mean, i.regions_per_topic_max
            ),
            b.map(|b| {
                format!(
                    "{:.2} / {}",
                    b.regions_per_topic_mean, b.regions_per_topic_max
                )
            }),
            "max ~5",
        );
        row(
            &mut s,
            "region size, mean / max",
            format!("{:.1} / {}", i.region_size_mean, i.region_size_max),
            b.map(|b| format!("{:.1} / {}", b.region_size_mean, b.region_size_max)),
            "5-10 members",
        );
        row(
            &mut s,
            "region size seen by a member, mean",
            format!("{:.1}", i.region_size_member_weighted_mean),
            b.map(|b| format!("{:.1}", b.region_size_member_weighted_mean)),
            "",
        );
        row(
            &mut s,
            "traffic in top-2 regions (by popularity)",
            format!("{:.1}%", 100.0 * i.top2_region_traffic_share),
            b.map(|b| format!("{:.1}%", 100.0 * b.top2_region_traffic_share)),
            "~95%",
        );
        row(
            &mut s,
            "traffic in top-2 regions (uniform)",
            format!("{:.1}%", 100.0 * i.top2_region_traffic_share_uniform),
            b.map(|b| format!("{:.1}%", 100.0 * b.top2_region_traffic_share_uniform)),
            "",
        );
        row(
            &mut s,
            "waste per node (by rate), mean / max",
            format!("{:.1}% / {:.1}%", 100.0 * i.waste_mean, 100.0 * i.waste_max),
            b.map(|b| format!("{:.1}% / {:.1}%", 100.0 * b.waste_mean, 100.0 * b.waste_max)),
            "(not reported)",
        );
        row(
            &mut s,
            "topics received, not subscribed, per node",
            format!("{:.1}", i.pads_per_node_mean),
            b.map(|b| format!("{:.1}", b.pads_per_node_mean)),
            "",
        );
        row(
            &mut s,
            "subsets (alone) / regions",
            format!("{} ({}) / {}", i.subsets, i.singleton_subsets, i.regions),
            b.map(|b| format!("{} ({}) / {}", b.subsets, b.singleton_subsets, b.regions)),
            "",
        );
        row(
            &mut s,
            "with personal regions: per node / sends",
            format!(
                "{:.1} / x{:.2}",
                i.personal_regions_per_node_mean, i.personal_multicast_send_factor
            ),
            b.map(|b| {
                format!(
                    "{:.1} / x{:.2}",
                    b.personal_regions_per_node_mean, b.personal_multicast_send_factor
                )
            }),
            "",
        );
        row(
            &mut s,
            "elapsed",
            format!("{} ms", i.elapsed_ms),
            b.map(|b| format!("{} ms", b.elapsed_ms)),
            "",
        );
        let _ = write!(s, "region sizes (incremental):");
        for bucket in &i.region_size_histogram {
            if bucket.max == usize::MAX {
                let _ = write!(s, " >{}: {}", bucket.min - 1, bucket.regions);
            } else {
                let _ = write!(s, " {}-{}: {}", bucket.min, bucket.max, bucket.regions);
            }
        }
        let _ = writeln!(s);
        let p = &self.planner_stats;
        let _ = writeln!(
            s,
            "planner work: {} placements tried, {} moved, {} candidates, {} evictions, {} node moves, {} pads added, {} carrier joins, {} absorptions, {} sheds; workload {} ms",
            p.placements_tried,
            p.placements_moved,
            p.candidates_evaluated,
            p.evictions,
            p.node_moves,
            p.pads_added,
            p.carrier_joins,
            p.absorptions,
            p.sheds,
            self.workload_ms
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tidings_gms::{Planner, PlannerConfig};
    use tidings_wire::{NodeId, TopicId};

    use super::*;

    #[test]
    fn report_is_deterministic_and_names_its_figures() {
        let params = RegionsParams {
            compare_batch: true,
            ..RegionsParams::new(60, 200, 0.1, 1.0, 7)
        };
        let a = regions_report(&params);
        let b = regions_report(&params);
        assert_eq!(a.subscriptions, 60 * 20);
        assert_eq!(a.regions_per_node_mean, b.regions_per_node_mean);
        assert_eq!(
            a.incremental.region_size_histogram,
            b.incremental.region_size_histogram
        );
        assert!(a.regions_per_node_mean >= 1.0);
        assert!(a.regions_per_topic_max <= params.planner.max_regions_per_topic);
        assert!(a.top2_region_traffic_share > 0.0 && a.top2_region_traffic_share <= 1.0);
        let json = serde_json::to_value(&a).unwrap();
        for name in [
            "regions_per_node_mean",
            "regions_per_node_max",
            "regions_per_topic_max",
            "region_size_mean",
            "top2_region_traffic_share",
            "elapsed_ms",
        ] {
            assert!(json.get(name).is_some(), "missing {name}");
        }
        assert!(a.to_text().contains("regions per node"));
        let batch = a.batch.unwrap();
        assert!(batch.regions_per_topic_max <= params.planner.max_regions_per_topic);
    }

    #[test]
    fn workload_draws_popular_topics_more_often() {
        let params = RegionsParams::new(200, 1000, 0.1, 1.0, 3);
        let w = workload(&params);
        let mut count = vec![0usize; 1001];
        for (_, ts) in &w.subscriptions {
            assert_eq!(ts.len(), 100);
            assert_eq!(
                ts.iter().collect::<BTreeSet<_>>().len(),
                100,
                "distinct topics"
            );
            for t in ts {
                count[t.0 as usize] += 1;
            }
        }
        assert!(
            count[1] > 190,
            "the top topic is nearly universal: {}",
            count[1]
        );
        let tail: usize = count[900..].iter().sum::<usize>() / 101;
        assert!(tail < count[10], "tail {tail} vs rank 10 {}", count[10]);
    }

    /// Node `i`'s subscriptions in workload `w`, as a set.
    fn topic_set(w: &Workload, i: usize) -> BTreeSet<TopicId> {
        w.subscriptions[i].1.iter().copied().collect()
    }

    #[test]
    fn community_workload_shares_profiles_and_personal_topics_differ() {
        let mut params = RegionsParams::new(200, 1000, 0.1, 1.0, 5);
        params.communities = 10;
        let w = workload(&params);
        let set = |i: usize| topic_set(&w, i);
        for i in 0..200 {
            assert_eq!(set(i).len(), 100, "node {i} has 100 distinct topics");
            // Nodes 10 apart are in the same community: identical subscriptions.
            if i >= 10 {
                assert_eq!(set(i), set(i - 10), "node {i} and its community");
            }
        }
        assert_ne!(set(0), set(1), "two communities, two profiles");

        params.personal = 0.1;
        let w = workload(&params);
        let set = |i: usize| topic_set(&w, i);
        for i in 10..200 {
            assert_eq!(set(i).len(), 100);
            let shared = set(i).intersection(&set(i - 10)).count();
            assert!(
                (80..100).contains(&shared),
                "node {i} shares 90 profile topics plus chance overlaps with its community: {shared}"
            );
        }
    }

    #[test]
    fn nodes_of_one_community_always_share_their_regions() {
        // With no personal topics, the nodes of a community subscribe to the same topics, so the
        // planner (fed node by node, incrementally) must keep them in the same regions throughout.
        let mut params = RegionsParams::new(120, 600, 0.1, 1.0, 4);
        params.communities = 12;
        let w = workload(&params);
        let mut planner = Planner::new(PlannerConfig::default()).unwrap();
        for (n, ts) in &w.subscriptions {
            for &t in ts {
                let _ = planner.subscribe(*n, t);
            }
        }
        planner.check_invariants().unwrap();
        let regions = |i: u32| planner.node_regions(NodeId(i + 1)).collect::<Vec<_>>();
        for i in 12..120 {
            assert_eq!(
                regions(i),
                regions(i - 12),
                "node {} and its community",
                i + 1
            );
        }
        assert!(!regions(0).is_empty());
    }

    #[test]
    fn personal_regions_bound_regions_per_node_by_the_shared_subsets() {
        let report = regions_report(&RegionsParams::new(200, 1000, 0.1, 1.0, 6));
        let f = &report.incremental;
        assert!(f.singleton_subsets > 0, "this workload leaves topics alone");
        assert!(f.personal_regions_per_node_mean >= 1.0);
        // Every topic alone in its subset folds into one region per node.
        assert!(
            f.personal_regions_per_node_mean < f.regions_per_node_mean,
            "{} vs {}",
            f.personal_regions_per_node_mean,
            f.regions_per_node_mean
        );
        assert!(
            f.personal_regions_per_node_mean <= (f.subsets - f.singleton_subsets + 1) as f64,
            "at most one region per shared subset plus the personal one"
        );
        // A topic alone in its subset is one region today, so unicast copies cost more sends.
        assert!(f.personal_multicast_send_factor > 1.0);
    }
}
