//! The region planner: topics are split into *subsets* whose memberships overlap regularly
//! (paper 001 section 3, after its reference \[28\]), and within each subset the nodes with identical
//! subscriptions (restricted to that subset's topics) form a *region*. A node is therefore in at
//! most one region per subset, and a topic spans the regions of its subset that contain it.
//!
//! # The regularity rule
//!
//! Paper 001 describes the partitioning in one garbled sentence: "we start by choosing the largest
//! group, and then look for another group that is either contained in it, or [...] produce small
//! regions. We keep adding groups to the set as long as maintaining regular overlap is possible,
//! and then simply start a new set". Its results say what "regular" must buy: regions of 5-10
//! members or more, and no group fragmented into more than about 5 regions. We read the missing
//! words as "disjoint from it, or overlaps it without producing small regions", and state the rule
//! on the regions of the subset, which is what the protocol pays for:
//!
//! A topic `T` (not yet in subset `S`) may join `S` iff, after it joins,
//! 1. every region `R` of `S` is either contained in `T`, disjoint from `T`, or split by `T` into
//!    two parts of at least [`PlannerConfig::min_region_size`] members each;
//! 2. the subscribers of `T` that are in no region of `S` (they form one new region) are none or at
//!    least `min_region_size`;
//! 3. `T` spans at most [`PlannerConfig::max_regions_per_topic`] regions of `S`, and no topic
//!    already in `S` spans more than that because of the splits.
//!
//! Containment and disjointness (the hierarchical overlap of the paper) never violate 1 and 2; a
//! laminar family passes 3 as long as no group has more than `max_regions_per_topic - 1` direct
//! sub-groups. Among the subsets `T` may join, it joins the one holding most of its subscribers
//! already (fewest new node-region memberships), then the one creating fewest regions; if none
//! admits it, it starts a subset of its own. A topic alone in its subset always satisfies the rule.
//!
//! # Incremental operation
//!
//! The paper's greedy runs over the final group sizes, largest first. A service sees one
//! subscription at a time, so the planner keeps the rule as an invariant instead:
//!
//! - A new topic starts in a subset of its own (one region: its subscribers).
//! - A topic alone in its subset looks for a subset to join when its subscriber count reaches
//!   [`PlannerConfig::first_placement_subscribers`], and again each time the count has grown by
//!   [`PlannerConfig::placement_growth_factor`] (a group's size is only meaningful once it has some
//!   members; the geometric schedule bounds the work per subscription by a constant on average).
//! - A subscribe or unsubscribe moves one node between two regions of one subset. If that makes a
//!   topic span more than `max_regions_per_topic` regions, the topic that caused it (or the topic
//!   that now violates) is *evicted* to a subset of its own, which restores the bound.
//!   Min-region-size is checked when a topic is placed, not on every later change: every region
//!   grows from one member, and forcing the rule on each step would evict every topic constantly.
//! - Whatever its size, a topic alone in its subset joins a subset with a region of exactly its
//!   subscribers (an *identical join*: contained in that region and disjoint from the others, it
//!   breaks no rule), so topics shared by the same nodes share their regions from their first
//!   subscriber on. Like any topic of a shared subset, it may then spread over several regions
//!   as subscriptions change, up to `max_regions_per_topic`.
//! - No subset holds more than [`PlannerConfig::subset_topics_max`] topics, which bounds the size
//!   of a region view and the work of an operation (a node's signature is copied when it moves).
//!
//! Each operation touches only the subsets of the topics it changes and returns the [`Changes`]
//! (regions created, changed and removed; topics whose region list changed), so the service can
//! issue new views for exactly those. [`Planner::from_scratch`] runs the paper's batch greedy
//! (largest topic first) on a full subscription table, for comparison; both satisfy
//! [`Planner::check_invariants`].

mod approx;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use tidings_proto::{Membership, RegionView};
use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

/// A subset of topics whose memberships overlap regularly; each has its own regions.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct SubsetId(pub u32);

/// Tuning of the region planner. Every field has a documented default; check with
/// [`PlannerConfig::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannerConfig {
    /// Least members of a region that placing a topic may create (rule 1 and 2 of the module
    /// docs). Default 5: paper 001 reports regions of 5-10 members, and a partition (the lowest
    /// token ring) needs a few members to be worth running.
    pub min_region_size: usize,
    /// Most regions a topic may span within its subset. Default 5: paper 001 reports no group
    /// fragmented into more than about 5 regions; a sender sends each message once per region.
    pub max_regions_per_topic: usize,
    /// Most candidate subsets evaluated when placing a topic. Default 16: each evaluation scans
    /// the topic's subscribers, so this bounds the work of one placement.
    pub placement_candidates_max: usize,
    /// Subscribers of a topic sampled to find candidate subsets (the subsets those nodes are in).
    /// Default 8.
    pub placement_sample_nodes: usize,
    /// Subscriber count at which a topic alone in its subset first looks for a subset to join.
    /// Default 10 (twice `min_region_size`: a smaller topic can only join by being contained in a
    /// region, which random early members rarely are).
    pub first_placement_subscribers: usize,
    /// Factor by which a topic's subscriber count must grow before it looks again. Default 2
    /// (at least 2, so the placement work per topic is a geometric series).
    pub placement_growth_factor: usize,
    /// Most topics in a subset, so in any region's view: a topic joins a subset only while it
    /// holds fewer. Default 1024: a region view then lists at most 1024 topic ids (4 KB, a few
    /// IP fragments, where 65,536 would not fit a UDP datagram at all), and a planner operation
    /// copies at most that many ids. 1 keeps every topic in a region of its own.
    pub subset_topics_max: usize,
    /// Approximate regions (ADR 34): the most a node may *waste*, in thousandths. A node's
    /// waste is the share of the messages it receives that it discards, each topic counted at
    /// its [weight](Planner::set_topic_weight) (its message rate; 1 unless set): `pad / (real +
    /// pad)`, where `real` sums the weights of the topics it subscribes to and `pad` those of
    /// the topics its regions carry that it does not subscribe to (its *pads*). With equal
    /// message sizes this is the share of bytes received and discarded. With a bound above 0 a
    /// region may carry a topic some of its members do not subscribe to: a node joins a region
    /// of its new topic that carries all it wants of the subset, and a topic joins a subset by
    /// being carried whole by regions that hold some of its subscribers, as long as every node
    /// so padded stays within the bound. Default 0: exact regions (every member of a region
    /// subscribes to every topic it carries), until the figures of ADR 34 justify more. At
    /// most 999.
    pub waste_max_permille: u32,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            min_region_size: 5,
            max_regions_per_topic: 5,
            placement_candidates_max: 16,
            placement_sample_nodes: 8,
            first_placement_subscribers: 10,
            placement_growth_factor: 2,
            subset_topics_max: 1024,
            waste_max_permille: 0,
        }
    }
}

/// An invalid [`PlannerConfig`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlannerConfigError {
    /// A field that must be at least 1 is 0.
    #[error("planner config: {0} must be at least 1")]
    Zero(&'static str),
    /// `placement_growth_factor` is below 2.
    #[error("planner config: placement_growth_factor must be at least 2 (got {0})")]
    GrowthFactor(usize),
    /// `waste_max_permille` is 1000 or more.
    #[error("planner config: waste_max_permille must be below 1000 (got {0})")]
    Waste(u32),
}

impl PlannerConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), PlannerConfigError> {
        for (name, v) in [
            ("min_region_size", self.min_region_size),
            ("max_regions_per_topic", self.max_regions_per_topic),
            ("placement_candidates_max", self.placement_candidates_max),
            ("placement_sample_nodes", self.placement_sample_nodes),
            (
                "first_placement_subscribers",
                self.first_placement_subscribers,
            ),
            ("subset_topics_max", self.subset_topics_max),
        ] {
            if v == 0 {
                return Err(PlannerConfigError::Zero(name));
            }
        }
        if self.placement_growth_factor < 2 {
            return Err(PlannerConfigError::GrowthFactor(
                self.placement_growth_factor,
            ));
        }
        if self.waste_max_permille >= 1000 {
            return Err(PlannerConfigError::Waste(self.waste_max_permille));
        }
        Ok(())
    }
}

/// What one planner operation changed, so the service can issue new views for exactly these.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Regions that did not exist before the operation.
    pub regions_created: BTreeSet<RegionId>,
    /// Regions that existed before and after, whose members or topics changed.
    pub regions_changed: BTreeSet<RegionId>,
    /// Those of `regions_changed` whose streams must start anew (a new view base): members
    /// changed, or topics moved out to another subset. The others only gained topics or lost
    /// topics their members dropped, and their streams go on (ADR 30).
    pub regions_restarted: BTreeSet<RegionId>,
    /// Regions that existed before and no longer do.
    pub regions_removed: BTreeSet<RegionId>,
    /// Topics whose list of regions changed (including topics created or dropped).
    pub topics_changed: BTreeSet<TopicId>,
}

impl Changes {
    /// Whether nothing changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.regions_created.is_empty()
            && self.regions_changed.is_empty()
            && self.regions_removed.is_empty()
            && self.topics_changed.is_empty()
    }

    /// Folds `later` (the changes of a following operation) into `self`.
    pub fn merge(&mut self, later: Changes) {
        for r in later.regions_created {
            if self.regions_removed.remove(&r) {
                // Ids are never reused, so this cannot happen; treat it as a change to stay total.
                self.regions_changed.insert(r);
            } else {
                self.regions_created.insert(r);
            }
        }
        for r in later.regions_changed {
            if !self.regions_created.contains(&r) {
                self.regions_changed.insert(r);
            }
        }
        for r in later.regions_restarted {
            if !self.regions_created.contains(&r) {
                self.regions_restarted.insert(r);
            }
        }
        for r in later.regions_removed {
            self.regions_changed.remove(&r);
            self.regions_restarted.remove(&r);
            if !self.regions_created.remove(&r) {
                self.regions_removed.insert(r);
            }
        }
        self.topics_changed.extend(later.topics_changed);
    }

    fn created(&mut self, r: RegionId) {
        self.regions_created.insert(r);
    }

    /// Only topics were added to `r`, or dropped by all its members: its streams go on.
    fn changed(&mut self, r: RegionId) {
        if !self.regions_created.contains(&r) {
            self.regions_changed.insert(r);
        }
    }

    /// `r`'s members changed or topics moved out of it: its streams start anew.
    fn restarted(&mut self, r: RegionId) {
        if !self.regions_created.contains(&r) {
            self.regions_changed.insert(r);
            self.regions_restarted.insert(r);
        }
    }

    fn removed(&mut self, r: RegionId) {
        self.regions_changed.remove(&r);
        self.regions_restarted.remove(&r);
        // A region created and removed within one operation was never seen by anyone.
        if !self.regions_created.remove(&r) {
            self.regions_removed.insert(r);
        }
    }
}

/// One region: the nodes whose subscriptions, restricted to the topics of `subset`, are exactly
/// `topics`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// The subset the region belongs to.
    pub subset: SubsetId,
    /// The topics every member subscribes to (within the subset), sorted.
    pub topics: Vec<TopicId>,
    /// The members, sorted (this is also the ring order).
    pub members: BTreeSet<NodeId>,
    /// [`set_hash`] of `members`, kept as they change: the key of [`Planner::by_members`].
    members_hash: u64,
}

/// Counters of the planner's work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannerStats {
    /// Placements attempted (a topic looking for a subset to join).
    pub placements_tried: u64,
    /// Placements that moved a topic into another subset.
    pub placements_moved: u64,
    /// Candidate subsets evaluated.
    pub candidates_evaluated: u64,
    /// Topics evicted to a subset of their own because they broke `max_regions_per_topic`.
    pub evictions: u64,
    /// Topics that joined a subset holding a region of exactly their subscribers.
    pub identical_joins: u64,
    /// Node moves between regions (the unit of work of every operation).
    pub node_moves: u64,
    /// Approximate regions: pads given to nodes (a node receiving a topic it does not
    /// subscribe to), by absorption or by joining a region that carries more than it wants.
    #[serde(default)]
    pub pads_added: u64,
    /// Approximate regions: subscriptions served by joining a region of the topic that
    /// carries all the node wants of the subset.
    #[serde(default)]
    pub carrier_joins: u64,
    /// Approximate regions: regions that took a placed topic whole, padding their members
    /// that do not subscribe to it.
    #[serde(default)]
    pub absorptions: u64,
    /// Approximate regions: moves of a node back to exact regions in a subset, to bring its
    /// waste within the bound.
    #[serde(default)]
    pub sheds: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TopicState {
    /// The nodes that receive the topic: its subscribers and the nodes that pad it.
    subscribers: BTreeSet<NodeId>,
    /// The nodes among `subscribers` that do not subscribe (approximate regions, ADR 34).
    #[serde(default)]
    pads: BTreeSet<NodeId>,
    /// [`set_hash`] of `subscribers`.
    subscribers_hash: u64,
    subset: SubsetId,
    regions: BTreeSet<RegionId>,
    /// Subscriber count at which the topic next looks for a subset to join.
    next_placement_at: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct NodeState {
    /// The topics the node receives: those it subscribes to and its pads.
    topics: BTreeSet<TopicId>,
    regions: BTreeMap<SubsetId, RegionId>,
    /// The topics among `topics` it does not subscribe to (approximate regions, ADR 34).
    #[serde(default)]
    pads: BTreeSet<TopicId>,
    /// Sum of the weights of the topics it subscribes to.
    #[serde(default)]
    real_weight: u64,
    /// Sum of the weights of its pads.
    #[serde(default)]
    pad_weight: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Subset {
    topics: BTreeSet<TopicId>,
    /// The regions of the subset by their topic set (their "signature").
    by_sig: BTreeMap<Vec<TopicId>, RegionId>,
}

/// How good a subset is for a topic (see the module docs); larger is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Fit {
    /// Subscribers of the topic already in a region of the subset.
    inside: usize,
    /// Negated count of regions the placement creates.
    fewer_new_regions: std::cmp::Reverse<usize>,
    /// Negated weight of the pads the placement adds (approximate regions).
    less_padding: std::cmp::Reverse<u64>,
}

/// The incremental region planner. See the module docs for the rule it keeps.
/// Serialized (for a replica's snapshot, ADR 32) without its configuration, which the
/// restoring side supplies, and without its scratch counters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Planner {
    #[serde(skip)]
    config: PlannerConfig,
    topics: BTreeMap<TopicId, TopicState>,
    nodes: BTreeMap<NodeId, NodeState>,
    subsets: BTreeMap<SubsetId, Subset>,
    regions: BTreeMap<RegionId, Region>,
    next_region: u32,
    next_subset: u32,
    /// Ids of removed subsets, reused so subset ids stay below the number of live subsets plus
    /// one (subset ids are internal: nothing outside the planner holds them across operations).
    free_subsets: Vec<u32>,
    /// Scratch counters indexed by subset id, all zero between calls of `best_subset`.
    #[serde(skip)]
    candidate_counts: Vec<u32>,
    /// The regions of subsets with room for another topic (fewer than `subset_topics_max`), by
    /// the [`set_hash`] of their members: where a topic finds a region of exactly its
    /// subscribers without a pass over its subscribers' regions (a node may be in thousands).
    by_members: BTreeMap<u64, Vec<RegionId>>,
    /// Topic weights set by [`Planner::set_topic_weight`] (1 for the others).
    #[serde(default)]
    weights: BTreeMap<TopicId, u64>,
    stats: PlannerStats,
}

/// A node's contribution to [`set_hash`] (splitmix64's finalizer: node ids are small and dense,
/// their hashes must not be).
fn node_hash(node: NodeId) -> u64 {
    let mut z = u64::from(node.0).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash of a set of nodes that follows the set as members come and go: the wrapping sum of
/// [`node_hash`]. Equal sets hash alike; a match is confirmed by comparing the sets.
fn set_hash<'a>(nodes: impl IntoIterator<Item = &'a NodeId>) -> u64 {
    nodes
        .into_iter()
        .fold(0u64, |h, &n| h.wrapping_add(node_hash(n)))
}

impl Default for Planner {
    /// An empty planner with the default configuration.
    fn default() -> Planner {
        Planner::with_valid(PlannerConfig::default())
    }
}

impl Planner {
    /// An empty planner. Fails if the configuration is invalid.
    pub fn new(config: PlannerConfig) -> Result<Planner, PlannerConfigError> {
        config.validate()?;
        Ok(Planner::with_valid(config))
    }

    /// Puts back the configuration a deserialized planner was snapshotted without.
    pub(crate) fn set_config(&mut self, config: PlannerConfig) {
        self.config = config;
    }

    /// An empty planner with a configuration already validated.
    fn with_valid(config: PlannerConfig) -> Planner {
        Planner {
            config,
            topics: BTreeMap::new(),
            nodes: BTreeMap::new(),
            subsets: BTreeMap::new(),
            regions: BTreeMap::new(),
            next_region: 0,
            next_subset: 0,
            free_subsets: Vec::new(),
            candidate_counts: Vec::new(),
            by_members: BTreeMap::new(),
            weights: BTreeMap::new(),
            stats: PlannerStats::default(),
        }
    }

    /// The paper's batch greedy over a full subscription table: topics are placed largest first
    /// (ties by id), each with all its subscribers, into the best admitting subset or a new one.
    pub fn from_scratch(
        config: PlannerConfig,
        subscriptions: &BTreeMap<NodeId, BTreeSet<TopicId>>,
    ) -> Result<Planner, PlannerConfigError> {
        config.validate()?;
        Ok(Planner::from_scratch_valid(config, subscriptions))
    }

    fn from_scratch_valid(
        config: PlannerConfig,
        subscriptions: &BTreeMap<NodeId, BTreeSet<TopicId>>,
    ) -> Planner {
        let mut p = Planner::with_valid(config);
        let mut by_topic: BTreeMap<TopicId, Vec<NodeId>> = BTreeMap::new();
        for (&n, ts) in subscriptions {
            for &t in ts {
                by_topic.entry(t).or_default().push(n);
            }
        }
        let mut order: Vec<(TopicId, Vec<NodeId>)> = by_topic.into_iter().collect();
        order.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut ch = Changes::default();
        for (t, subs) in order {
            let members: BTreeSet<NodeId> = subs.into_iter().collect();
            let best = p.best_subset(t, &members, None, false);
            let subset = best.unwrap_or_else(|| p.new_subset());
            let had_room = p.subset_has_room(subset);
            let next = members
                .len()
                .saturating_mul(p.config.placement_growth_factor);
            p.topics.insert(
                t,
                TopicState {
                    subscribers_hash: set_hash(&members),
                    subscribers: members.clone(),
                    pads: BTreeSet::new(),
                    subset,
                    regions: BTreeSet::new(),
                    next_placement_at: next,
                },
            );
            p.subset_mut(subset).topics.insert(t);
            p.reindex_if_room_changed(subset, had_room);
            for n in members {
                let w = p.topic_weight(t);
                let ns = p.nodes.entry(n).or_default();
                ns.topics.insert(t);
                ns.real_weight = ns.real_weight.saturating_add(w);
                let sig = p.sig_plus(n, subset, t);
                p.set_sig(n, subset, sig, &mut ch);
            }
        }
        p
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// The work counters.
    #[must_use]
    pub fn stats(&self) -> &PlannerStats {
        &self.stats
    }

    /// `node` subscribes to each of `topics`, in order, as one operation (the changes of
    /// [`subscribe`](Planner::subscribe) one by one, merged). With approximate regions the
    /// weight of every topic of the batch counts towards what the node wants from the first
    /// one on, so the pads it takes early are measured against its whole interest: the bound
    /// holds when the operation ends, as after any other. A node that subscribes to its
    /// interests at once can so join shared regions that it could not afford topic by topic.
    pub fn subscribe_many(&mut self, node: NodeId, topics: &[TopicId]) -> Changes {
        let mut ch = Changes::default();
        let fresh: Vec<TopicId> = {
            let held = self.nodes.get(&node).map(|ns| &ns.topics);
            let mut seen = BTreeSet::new();
            topics
                .iter()
                .copied()
                .filter(|t| held.is_none_or(|h| !h.contains(t)) && seen.insert(*t))
                .collect()
        };
        let credit: u64 = if self.approximate() {
            fresh.iter().map(|&t| self.topic_weight(t)).sum()
        } else {
            0
        };
        if credit > 0 {
            let ns = self.nodes.entry(node).or_default();
            ns.real_weight = ns.real_weight.saturating_add(credit);
        }
        let fresh_set: BTreeSet<TopicId> = fresh.iter().copied().collect();
        for &t in topics {
            if credit > 0 && fresh_set.contains(&t) {
                // Taken back just before `subscribe` adds it, so the rest stays credited.
                let w = self.topic_weight(t);
                if let Some(ns) = self.nodes.get_mut(&node) {
                    if !ns.topics.contains(&t) {
                        ns.real_weight = ns.real_weight.saturating_sub(w);
                    }
                }
            }
            ch.merge(self.subscribe(node, t));
        }
        ch
    }

    /// `node` subscribes to `topic` (a new topic or node is created on first use). Returns what
    /// changed; nothing if the subscription already existed, or if the node received the topic
    /// already as a pad (it now delivers it too).
    pub fn subscribe(&mut self, node: NodeId, topic: TopicId) -> Changes {
        let mut ch = Changes::default();
        let w = self.topic_weight(topic);
        let ns = self.nodes.entry(node).or_default();
        if ns.pads.remove(&topic) {
            ns.pad_weight = ns.pad_weight.saturating_sub(w);
            ns.real_weight = ns.real_weight.saturating_add(w);
            if let Some(ts) = self.topics.get_mut(&topic) {
                ts.pads.remove(&node);
            }
            return ch;
        }
        if !ns.topics.insert(topic) {
            return ch;
        }
        ns.real_weight = ns.real_weight.saturating_add(w);
        let Some(state) = self.topics.get_mut(&topic) else {
            let subset = self.new_subset();
            self.subset_mut(subset).topics.insert(topic);
            self.topics.insert(
                topic,
                TopicState {
                    subscribers: BTreeSet::from([node]),
                    pads: BTreeSet::new(),
                    subscribers_hash: node_hash(node),
                    subset,
                    regions: BTreeSet::new(),
                    next_placement_at: self.config.first_placement_subscribers,
                },
            );
            ch.topics_changed.insert(topic);
            self.set_sig(node, subset, vec![topic], &mut ch);
            self.join_identical(topic, &mut ch);
            return ch;
        };
        state.subscribers.insert(node);
        state.subscribers_hash = state.subscribers_hash.wrapping_add(node_hash(node));
        let subset = state.subset;
        // Approximate regions: into a region of the topic that carries all the node wants of
        // the subset, if the pads fit its bound. Spans only shrink, so nothing needs repair.
        if !(self.approximate() && self.join_carrier(node, topic, subset, &mut ch)) {
            let sig = self.sig_plus(node, subset, topic);
            self.set_sig(node, subset, sig.clone(), &mut ch);
            self.repair(subset, &sig, topic, &mut ch);
        }
        // Checked after the repair: an evicted topic has had its threshold raised.
        let due = self
            .topics
            .get(&topic)
            .is_some_and(|ts| ts.subscribers.len() >= ts.next_placement_at);
        if due {
            self.place(topic, &mut ch);
        }
        self.join_identical(topic, &mut ch);
        ch
    }

    /// `node` unsubscribes from `topic`. Returns what changed; nothing if it was not subscribed
    /// (a pad is not a subscription), or if it keeps receiving the topic as a pad.
    pub fn unsubscribe(&mut self, node: NodeId, topic: TopicId) -> Changes {
        let mut ch = Changes::default();
        let w = self.topic_weight(topic);
        let Some(ns) = self.nodes.get(&node) else {
            return ch;
        };
        if ns.pads.contains(&topic) || !ns.topics.contains(&topic) {
            return ch;
        }
        if self.approximate() && self.keep_as_pad(node, topic) {
            return ch;
        }
        let Some(ns) = self.nodes.get_mut(&node) else {
            return ch;
        };
        ns.topics.remove(&topic);
        ns.real_weight = ns.real_weight.saturating_sub(w);
        let node_empty = ns.topics.is_empty();
        let Some(state) = self.topics.get_mut(&topic) else {
            return ch;
        };
        state.subscribers.remove(&node);
        state.subscribers_hash = state.subscribers_hash.wrapping_sub(node_hash(node));
        let subset = state.subset;
        let topic_empty = state.subscribers.is_empty();
        let left = self
            .nodes
            .get(&node)
            .and_then(|ns| ns.regions.get(&subset).copied());
        let sig = self.sig_minus(node, subset, topic);
        self.set_sig(node, subset, sig.clone(), &mut ch);
        if topic_empty {
            self.drop_topic(topic, &mut ch);
        } else {
            self.after_real_loss(topic, left, &mut ch);
            if self.topics.contains_key(&topic) {
                self.repair(subset, &sig, topic, &mut ch);
                self.join_identical(topic, &mut ch);
            }
        }
        if !node_empty {
            self.shed(node, &mut ch);
        }
        // A node left with pads alone sheds them all (it wants nothing, so any pad is beyond
        // the bound).
        if self.nodes.get(&node).is_some_and(|ns| ns.topics.is_empty()) {
            self.nodes.remove(&node);
        }
        ch
    }

    /// `node` leaves (or failed): it leaves every region and topic. Only regions shrink or
    /// disappear, so no topic can break the bounds.
    pub fn remove_node(&mut self, node: NodeId) -> Changes {
        let mut ch = Changes::default();
        let Some(ns) = self.nodes.remove(&node) else {
            return ch;
        };
        for (_, r) in ns.regions {
            self.leave_region(node, r, &mut ch);
        }
        for t in ns.topics {
            let empty = match self.topics.get_mut(&t) {
                Some(s) => {
                    s.subscribers.remove(&node);
                    s.pads.remove(&node);
                    s.subscribers_hash = s.subscribers_hash.wrapping_sub(node_hash(node));
                    s.subscribers.is_empty()
                }
                None => false,
            };
            if empty {
                self.drop_topic(t, &mut ch);
            } else if !ns.pads.contains(&t) {
                self.after_real_loss(t, None, &mut ch);
            }
        }
        ch
    }

    /// A region.
    #[must_use]
    pub fn region(&self, region: RegionId) -> Option<&Region> {
        self.regions.get(&region)
    }

    /// All regions, by id.
    pub fn regions(&self) -> impl Iterator<Item = (RegionId, &Region)> + '_ {
        self.regions.iter().map(|(&r, reg)| (r, reg))
    }

    /// The regions `topic` spans (empty if unknown).
    pub fn topic_regions(&self, topic: TopicId) -> impl Iterator<Item = RegionId> + '_ {
        self.topics
            .get(&topic)
            .into_iter()
            .flat_map(|s| s.regions.iter().copied())
    }

    /// The subscribers of `topic` (empty if unknown); not the nodes that only pad it.
    pub fn subscribers(&self, topic: TopicId) -> impl Iterator<Item = NodeId> + '_ {
        self.topics.get(&topic).into_iter().flat_map(|s| {
            s.subscribers
                .iter()
                .copied()
                .filter(|n| !s.pads.contains(n))
        })
    }

    /// The nodes that receive `topic`: its subscribers and its pads (empty if unknown).
    pub fn carriers(&self, topic: TopicId) -> impl Iterator<Item = NodeId> + '_ {
        self.topics
            .get(&topic)
            .into_iter()
            .flat_map(|s| s.subscribers.iter().copied())
    }

    /// The topics `node` subscribes to (empty if unknown); not its pads.
    pub fn subscriptions(&self, node: NodeId) -> impl Iterator<Item = TopicId> + '_ {
        self.nodes
            .get(&node)
            .into_iter()
            .flat_map(|s| s.topics.iter().copied().filter(|t| !s.pads.contains(t)))
    }

    /// The topics `node` receives without subscribing to them (approximate regions).
    pub fn pads(&self, node: NodeId) -> impl Iterator<Item = TopicId> + '_ {
        self.nodes
            .get(&node)
            .into_iter()
            .flat_map(|s| s.pads.iter().copied())
    }

    /// The regions `node` is in, one per subset.
    pub fn node_regions(&self, node: NodeId) -> impl Iterator<Item = (SubsetId, RegionId)> + '_ {
        self.nodes
            .get(&node)
            .into_iter()
            .flat_map(|s| s.regions.iter().map(|(&s, &r)| (s, r)))
    }

    /// The subset `topic` is in.
    #[must_use]
    pub fn subset_of(&self, topic: TopicId) -> Option<SubsetId> {
        self.topics.get(&topic).map(|s| s.subset)
    }

    /// The topics of `subset` (empty if unknown).
    pub fn subset_topics(&self, subset: SubsetId) -> impl Iterator<Item = TopicId> + '_ {
        self.subsets
            .get(&subset)
            .into_iter()
            .flat_map(|s| s.topics.iter().copied())
    }

    /// Number of subsets.
    #[must_use]
    pub fn subset_count(&self) -> usize {
        self.subsets.len()
    }

    /// Number of regions.
    #[must_use]
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// Number of topics with at least one subscriber.
    #[must_use]
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// Number of nodes with at least one subscription.
    #[must_use]
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// All topics with subscribers, sorted.
    pub fn topics(&self) -> impl Iterator<Item = TopicId> + '_ {
        self.topics.keys().copied()
    }

    /// All nodes with subscriptions, sorted.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// The view of `region` at epoch `view` with base `base`, its members (in id order, which is
    /// the ring order) split into partitions of `partition_size` (see
    /// [`RegionView::partitioned`]).
    #[must_use]
    pub fn region_view(
        &self,
        region: RegionId,
        (view, base): (ViewId, ViewId),
        partition_size: usize,
    ) -> Option<RegionView> {
        let r = self.regions.get(&region)?;
        let members: Vec<NodeId> = r.members.iter().copied().collect();
        Some(RegionView {
            region,
            view,
            base,
            topics: r.topics.clone(),
            partitions: RegionView::partitioned(&members, partition_size),
        })
    }

    /// The regions `node` must know: those it is a member of, and those spanned by the topics in
    /// `publishes` (a sender sends to every region of its topic, member or not).
    #[must_use]
    pub fn relevant_regions(&self, node: NodeId, publishes: &[TopicId]) -> BTreeSet<RegionId> {
        // Gathered with repeats and built at once (a set from a list sorts it and builds in
        // bulk): a node publishing many topics names each region many times, and inserting
        // them one by one was most of this function.
        let mut all: Vec<RegionId> = self.node_regions(node).map(|(_, r)| r).collect();
        for &t in publishes {
            all.extend(self.topic_regions(t));
        }
        all.into_iter().collect()
    }

    /// The membership `node` must use: the views of its [relevant
    /// regions](Planner::relevant_regions) at the epochs `view_of` gives, the region lists of
    /// the topics it publishes to, and the topics it subscribes to (what it delivers).
    pub fn membership(
        &self,
        node: NodeId,
        publishes: &[TopicId],
        partition_size: usize,
        view_of: impl Fn(RegionId) -> (ViewId, ViewId),
    ) -> Membership {
        let mut m = Membership::default();
        for r in self.relevant_regions(node, publishes) {
            if let Some(v) = self.region_view(r, view_of(r), partition_size) {
                m.regions.insert(r, v);
            }
        }
        for &t in publishes {
            m.topic_regions
                .insert(t, self.topic_regions(t).collect::<Vec<_>>());
        }
        m.subscriptions = Some(self.subscriptions(node).collect());
        m
    }

    /// Checks every invariant of the structure; `Err` names the first violated. Used by tests
    /// and debug builds of the service.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (&r, reg) in &self.regions {
            if reg.members.is_empty() || reg.topics.is_empty() {
                return Err(format!("region {r} is empty"));
            }
            if !reg.topics.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("region {r} topics not sorted"));
            }
            let Some(sub) = self.subsets.get(&reg.subset) else {
                return Err(format!("region {r} in unknown subset"));
            };
            if sub.by_sig.get(reg.topics.as_slice()) != Some(&r) {
                return Err(format!("region {r} not indexed by its signature"));
            }
            if reg.members_hash != set_hash(&reg.members) {
                return Err(format!("region {r} members hash is stale"));
            }
            let indexed = self
                .by_members
                .get(&reg.members_hash)
                .is_some_and(|rs| rs.contains(&r));
            if indexed != self.subset_has_room(reg.subset) {
                return Err(format!(
                    "region {r} indexed by members: {indexed}, its subset has room: {}",
                    !indexed
                ));
            }
            for &n in &reg.members {
                let Some(ns) = self.nodes.get(&n) else {
                    return Err(format!("region {r} member {n} unknown"));
                };
                if ns.regions.get(&reg.subset) != Some(&r) {
                    return Err(format!("node {n} does not record region {r}"));
                }
                // Members subscribe exactly to the region's topics within the subset.
                let within: Vec<TopicId> = ns
                    .topics
                    .iter()
                    .copied()
                    .filter(|t| sub.topics.contains(t))
                    .collect();
                if within != reg.topics {
                    return Err(format!(
                        "node {n} subscribes to {within:?} in subset {:?}, region {r} has {:?}",
                        reg.subset, reg.topics
                    ));
                }
            }
        }
        for (&n, ns) in &self.nodes {
            if ns.topics.is_empty() {
                return Err(format!("node {n} kept without subscriptions"));
            }
            if !ns.pads.is_subset(&ns.topics) {
                return Err(format!("node {n} pads topics it does not receive"));
            }
            let (mut real, mut pad) = (0u64, 0u64);
            for &t in &ns.topics {
                let w = self.topic_weight(t);
                if ns.pads.contains(&t) {
                    pad += w;
                    if !self.topics.get(&t).is_some_and(|ts| ts.pads.contains(&n)) {
                        return Err(format!("node {n} pad {t} not mirrored"));
                    }
                } else {
                    real += w;
                }
            }
            if (real, pad) != (ns.real_weight, ns.pad_weight) {
                return Err(format!(
                    "node {n} weights {}/{} recorded, {real}/{pad} counted",
                    ns.real_weight, ns.pad_weight
                ));
            }
            if !self.within(real, pad) {
                return Err(format!(
                    "node {n} wastes {pad} of {}, beyond {} permille",
                    real + pad,
                    self.config.waste_max_permille
                ));
            }
            for (&s, &r) in &ns.regions {
                match self.regions.get(&r) {
                    Some(reg) if reg.subset == s && reg.members.contains(&n) => {}
                    _ => return Err(format!("node {n} records region {r} wrongly")),
                }
            }
            for t in &ns.topics {
                let Some(ts) = self.topics.get(t) else {
                    return Err(format!("node {n} subscribes to unknown topic {t}"));
                };
                if !ts.subscribers.contains(&n) || !ns.regions.contains_key(&ts.subset) {
                    return Err(format!("node {n} topic {t} not mirrored"));
                }
            }
        }
        for (&t, ts) in &self.topics {
            let Some(sub) = self.subsets.get(&ts.subset) else {
                return Err(format!("topic {t} in unknown subset"));
            };
            if !sub.topics.contains(&t) {
                return Err(format!("subset does not list topic {t}"));
            }
            let expected: BTreeSet<RegionId> = sub
                .by_sig
                .iter()
                .filter(|(sig, _)| sig.binary_search(&t).is_ok())
                .map(|(_, &r)| r)
                .collect();
            if expected != ts.regions {
                return Err(format!("topic {t} region list is stale"));
            }
            // The subscribers are exactly the union of the members of the topic's regions.
            let mut union = BTreeSet::new();
            for r in &ts.regions {
                if let Some(reg) = self.regions.get(r) {
                    union.extend(reg.members.iter().copied());
                }
            }
            if union != ts.subscribers {
                return Err(format!("topic {t} subscribers differ from its regions"));
            }
            if ts.subscribers_hash != set_hash(&ts.subscribers) {
                return Err(format!("topic {t} subscribers hash is stale"));
            }
            if !ts.pads.is_subset(&ts.subscribers) || ts.pads.len() >= ts.subscribers.len() {
                return Err(format!(
                    "topic {t} pads are not a proper part of its receivers"
                ));
            }
            if ts.regions.len() > self.config.max_regions_per_topic {
                return Err(format!(
                    "topic {t} spans {} regions, more than {}",
                    ts.regions.len(),
                    self.config.max_regions_per_topic
                ));
            }
        }
        let entries: usize = self.by_members.values().map(Vec::len).sum();
        let with_room = self
            .regions
            .values()
            .filter(|reg| self.subset_has_room(reg.subset))
            .count();
        if entries != with_room {
            return Err(format!(
                "{entries} regions indexed by members, {with_room} in subsets with room"
            ));
        }
        for (&s, sub) in &self.subsets {
            if sub.topics.is_empty() {
                return Err(format!("subset {s:?} kept without topics"));
            }
            if sub.topics.len() > self.config.subset_topics_max {
                return Err(format!(
                    "subset {s:?} holds {} topics, more than {}",
                    sub.topics.len(),
                    self.config.subset_topics_max
                ));
            }
            for t in &sub.topics {
                if self.topics.get(t).map(|ts| ts.subset) != Some(s) {
                    return Err(format!("subset {s:?} lists topic {t} of another subset"));
                }
            }
        }
        Ok(())
    }

    // ----- internals -----

    fn new_subset(&mut self) -> SubsetId {
        let id = match self.free_subsets.pop() {
            Some(id) => SubsetId(id),
            None => {
                let id = SubsetId(self.next_subset);
                // At most one live subset per topic, so this never nears u32::MAX.
                self.next_subset = self.next_subset.saturating_add(1);
                id
            }
        };
        self.subsets.insert(id, Subset::default());
        id
    }

    fn remove_subset(&mut self, id: SubsetId) {
        if self.subsets.remove(&id).is_some() {
            self.free_subsets.push(id.0);
        }
    }

    fn subset_mut(&mut self, s: SubsetId) -> &mut Subset {
        self.subsets.entry(s).or_default()
    }

    fn new_region_id(&mut self) -> RegionId {
        // Region ids are never reused (a node may still hold an old view of a removed region), so
        // skip any id still in use should the counter ever wrap.
        loop {
            self.next_region = self.next_region.wrapping_add(1);
            let id = RegionId(self.next_region);
            if self.next_region != 0 && !self.regions.contains_key(&id) {
                return id;
            }
        }
    }

    /// The node's current signature in `subset`.
    fn sig(&self, node: NodeId, subset: SubsetId) -> &[TopicId] {
        self.nodes
            .get(&node)
            .and_then(|ns| ns.regions.get(&subset))
            .and_then(|r| self.regions.get(r))
            .map_or(&[], |reg| reg.topics.as_slice())
    }

    fn sig_plus(&self, node: NodeId, subset: SubsetId, t: TopicId) -> Vec<TopicId> {
        let mut sig = self.sig(node, subset).to_vec();
        if let Err(at) = sig.binary_search(&t) {
            sig.insert(at, t);
        }
        sig
    }

    fn sig_minus(&self, node: NodeId, subset: SubsetId, t: TopicId) -> Vec<TopicId> {
        let mut sig = self.sig(node, subset).to_vec();
        if let Ok(at) = sig.binary_search(&t) {
            sig.remove(at);
        }
        sig
    }

    /// Moves `node` in `subset` to the region of signature `sig` (none if empty).
    fn set_sig(&mut self, node: NodeId, subset: SubsetId, sig: Vec<TopicId>, ch: &mut Changes) {
        let old = self
            .nodes
            .get(&node)
            .and_then(|ns| ns.regions.get(&subset).copied());
        if let Some(r) = old {
            let Some(reg) = self.regions.get(&r) else {
                return;
            };
            if reg.topics == sig {
                return;
            }
            // The region's only member: the region follows it (same id, new topics), unless
            // another region already has those topics.
            if reg.members.len() == 1 && !sig.is_empty() && !self.has_sig(subset, &sig) {
                self.stats.node_moves += 1;
                self.retag_region(r, sig, ch);
                return;
            }
            self.leave_region(node, r, ch);
        }
        self.stats.node_moves += 1;
        if sig.is_empty() {
            return;
        }
        let existing = self
            .subsets
            .get(&subset)
            .and_then(|s| s.by_sig.get(sig.as_slice()).copied());
        let r = match existing {
            Some(r) => {
                ch.restarted(r);
                r
            }
            None => self.create_region(subset, sig),
        };
        self.set_member(r, node, true);
        self.nodes
            .entry(node)
            .or_default()
            .regions
            .insert(subset, r);
        if existing.is_none() {
            ch.created(r);
            if let Some(reg) = self.regions.get(&r) {
                ch.topics_changed.extend(reg.topics.iter().copied());
            }
        }
    }

    /// Whether `subset` has a region of signature `sig`.
    fn has_sig(&self, subset: SubsetId, sig: &[TopicId]) -> bool {
        self.subsets
            .get(&subset)
            .is_some_and(|s| s.by_sig.contains_key(sig))
    }

    /// Gives region `r`, whose members all move together, the signature `sig` (which no other
    /// region of its subset has, and not empty): the region keeps its id and members, its
    /// topics change (reported as a changed region, so it gets a new view), and only the
    /// topics that enter or leave it have their region lists edited. Replacing the region
    /// instead (a new one, the old one removed) cost an edit of every topic's list and a new
    /// multicast group for each topic joining a region of a thousand.
    fn retag_region(&mut self, r: RegionId, sig: Vec<TopicId>, ch: &mut Changes) {
        let Some(reg) = self.regions.get_mut(&r) else {
            return;
        };
        let subset = reg.subset;
        let old = std::mem::replace(&mut reg.topics, sig.clone());
        if let Some(s) = self.subsets.get_mut(&subset) {
            s.by_sig.remove(old.as_slice());
            s.by_sig.insert(sig.clone(), r);
        }
        // The topics that left and those that entered (both lists sorted; in practice they
        // differ by one topic).
        let left: Vec<TopicId> = old
            .iter()
            .copied()
            .filter(|t| sig.binary_search(t).is_err())
            .collect();
        // A topic that left while its members still subscribe to it moved to another subset:
        // its next messages go to other regions of the same receivers, and only re-homing the
        // unstable ones ahead of them (a new base) keeps them in sender order. A topic the
        // members dropped has no receiver here any more, so nothing of it needs moving and the
        // streams go on (ADR 30, addendum).
        let members = self.regions.get(&r).map(|reg| &reg.members);
        let moved = left.iter().any(|t| {
            members.is_some_and(|m| {
                m.iter()
                    .any(|n| self.nodes.get(n).is_some_and(|ns| ns.topics.contains(t)))
            })
        });
        if moved {
            ch.restarted(r);
        }
        for t in left {
            if let Some(ts) = self.topics.get_mut(&t) {
                ts.regions.remove(&r);
            }
            ch.topics_changed.insert(t);
        }
        for &t in sig.iter().filter(|t| old.binary_search(t).is_err()) {
            if let Some(ts) = self.topics.get_mut(&t) {
                ts.regions.insert(r);
            }
            ch.topics_changed.insert(t);
        }
        ch.changed(r);
    }

    fn create_region(&mut self, subset: SubsetId, sig: Vec<TopicId>) -> RegionId {
        let id = self.new_region_id();
        for t in &sig {
            if let Some(ts) = self.topics.get_mut(t) {
                ts.regions.insert(id);
            }
        }
        self.subset_mut(subset).by_sig.insert(sig.clone(), id);
        self.regions.insert(
            id,
            Region {
                subset,
                topics: sig,
                members: BTreeSet::new(),
                members_hash: set_hash(&[]),
            },
        );
        if self.subset_has_room(subset) {
            self.index_insert(id, set_hash(&[]));
        }
        id
    }

    /// Removes `node` from region `r` (and the region, if it empties).
    fn leave_region(&mut self, node: NodeId, r: RegionId, ch: &mut Changes) {
        let Some(subset) = self.regions.get(&r).map(|reg| reg.subset) else {
            return;
        };
        let empty = self.set_member(r, node, false);
        if let Some(ns) = self.nodes.get_mut(&node) {
            if ns.regions.get(&subset) == Some(&r) {
                ns.regions.remove(&subset);
            }
        }
        if !empty {
            ch.restarted(r);
            return;
        }
        let Some(reg) = self.regions.remove(&r) else {
            return;
        };
        if let Some(s) = self.subsets.get_mut(&reg.subset) {
            s.by_sig.remove(reg.topics.as_slice());
        }
        for t in &reg.topics {
            if let Some(ts) = self.topics.get_mut(t) {
                ts.regions.remove(&r);
            }
            ch.topics_changed.insert(*t);
        }
        ch.removed(r);
    }

    /// Forgets a topic without subscribers (its regions are gone already).
    fn drop_topic(&mut self, topic: TopicId, ch: &mut Changes) {
        let Some(ts) = self.topics.remove(&topic) else {
            return;
        };
        debug_assert!(
            ts.regions.is_empty(),
            "a topic without subscribers has no region"
        );
        ch.topics_changed.insert(topic);
        let had_room = self.subset_has_room(ts.subset);
        if let Some(s) = self.subsets.get_mut(&ts.subset) {
            s.topics.remove(&topic);
            if s.topics.is_empty() {
                self.remove_subset(ts.subset);
            }
        }
        self.reindex_if_room_changed(ts.subset, had_room);
    }

    /// After a node moved in `subset` to signature `sig` by subscribing to or unsubscribing
    /// from `cause`, evicts topics that now span more than `max_regions_per_topic` regions:
    /// `cause` first (its leaving gives the node its old signature back, which mends every
    /// topic the move spread at once: the topics of a region of a thousand topics would
    /// otherwise leave one by one), then any remaining violator.
    fn repair(&mut self, subset: SubsetId, sig: &[TopicId], cause: TopicId, ch: &mut Changes) {
        let max = self.config.max_regions_per_topic;
        let violates = |p: &Planner, t: &TopicId| {
            p.topics
                .get(t)
                .is_some_and(|ts| ts.subset == subset && ts.regions.len() > max)
        };
        if !violates(self, &cause) && !sig.iter().any(|t| violates(self, t)) {
            return;
        }
        self.evict(cause, ch);
        // Eviction only merges regions, so this loop ends; it rarely runs more than once.
        while let Some(&t) = sig.iter().find(|t| violates(self, t)) {
            if !self.evict(t, ch) {
                break;
            }
        }
    }

    /// Moves `topic` out of its subset into a subset of its own. Returns false if it is alone.
    fn evict(&mut self, topic: TopicId, ch: &mut Changes) -> bool {
        let Some(ts) = self.topics.get(&topic) else {
            return false;
        };
        let from = ts.subset;
        if self.subsets.get(&from).is_none_or(|s| s.topics.len() <= 1) {
            return false;
        }
        self.stats.evictions += 1;
        // Its pads stay behind: a topic on its own is not worth receiving for nothing.
        self.drop_pads(topic);
        let to = self.new_subset();
        self.move_topic(topic, from, to, ch);
        if let Some(ts) = self.topics.get_mut(&topic) {
            // Wait for growth before looking for a new home, so an evicted topic cannot thrash.
            ts.next_placement_at = ts
                .subscribers
                .len()
                .saturating_mul(self.config.placement_growth_factor)
                .max(ts.next_placement_at);
        }
        self.join_identical(topic, ch);
        true
    }

    /// Takes `topic` out of each region of `regions` (of `subset`) as a whole: the region is
    /// kept under its new signature unless that empties it or another region has that
    /// signature (then its members go node by node: they leave or merge).
    fn strip_topic(
        &mut self,
        topic: TopicId,
        subset: SubsetId,
        regions: Vec<RegionId>,
        ch: &mut Changes,
    ) {
        for r in regions {
            let Some(reg) = self.regions.get(&r) else {
                continue;
            };
            if reg.topics.binary_search(&topic).is_err() {
                continue;
            }
            let mut sig = reg.topics.clone();
            sig.retain(|&t| t != topic);
            if !sig.is_empty() && !self.has_sig(subset, &sig) {
                self.stats.node_moves += 1;
                self.retag_region(r, sig, ch);
            } else {
                let members: Vec<NodeId> = reg.members.iter().copied().collect();
                for n in members {
                    self.set_sig(n, subset, sig.clone(), ch);
                }
            }
        }
    }

    /// Moves `topic` with all its subscribers from subset `from` to subset `to`.
    fn move_topic(&mut self, topic: TopicId, from: SubsetId, to: SubsetId, ch: &mut Changes) {
        let Some(ts) = self.topics.get(&topic) else {
            return;
        };
        let subscribers: Vec<NodeId> = ts.subscribers.iter().copied().collect();
        // Out of `from`: each region of the topic loses it as a whole.
        let leaving: Vec<RegionId> = ts.regions.iter().copied().collect();
        self.strip_topic(topic, from, leaving, ch);
        let from_had_room = self.subset_has_room(from);
        if let Some(s) = self.subsets.get_mut(&from) {
            s.topics.remove(&topic);
            if s.topics.is_empty() {
                self.remove_subset(from);
            }
        }
        self.reindex_if_room_changed(from, from_had_room);
        let to_had_room = self.subset_has_room(to);
        self.subset_mut(to).topics.insert(topic);
        self.reindex_if_room_changed(to, to_had_room);
        if let Some(ts) = self.topics.get_mut(&topic) {
            ts.subset = to;
        }
        ch.topics_changed.insert(topic);
        // Into `to`: a region all of whose members subscribe takes the topic as a whole; the
        // others' subscribers (and those in no region of `to`) move node by node.
        let mut inside: BTreeMap<RegionId, usize> = BTreeMap::new();
        for n in &subscribers {
            if let Some(&r) = self.nodes.get(n).and_then(|ns| ns.regions.get(&to)) {
                *inside.entry(r).or_default() += 1;
            }
        }
        let mut whole: BTreeSet<RegionId> = BTreeSet::new();
        for (r, count) in inside {
            let Some(reg) = self.regions.get(&r) else {
                continue;
            };
            if reg.members.len() == count {
                let mut sig = reg.topics.clone();
                if let Err(at) = sig.binary_search(&topic) {
                    sig.insert(at, topic);
                }
                // No region of `to` holds the topic yet, so no other has this signature.
                self.stats.node_moves += 1;
                self.retag_region(r, sig, ch);
                whole.insert(r);
            }
        }
        for &n in &subscribers {
            let in_whole = self
                .nodes
                .get(&n)
                .and_then(|ns| ns.regions.get(&to))
                .is_some_and(|r| whole.contains(r));
            if !in_whole {
                let sig = self.sig_plus(n, to, topic);
                self.set_sig(n, to, sig, ch);
            }
        }
    }

    /// A topic alone in its subset whose subscriber count reached its threshold looks for a
    /// subset to join.
    fn place(&mut self, topic: TopicId, ch: &mut Changes) {
        let Some(ts) = self.topics.get_mut(&topic) else {
            return;
        };
        ts.next_placement_at = ts
            .subscribers
            .len()
            .saturating_mul(self.config.placement_growth_factor);
        let from = ts.subset;
        if self.subsets.get(&from).is_some_and(|s| s.topics.len() > 1) {
            // Already shares a subset: moving it would churn views for no gain in the bound.
            return;
        }
        self.stats.placements_tried += 1;
        let absorb = self.approximate();
        // Placed with its subscribers alone: its pads stay behind if it moves.
        let members: BTreeSet<NodeId> = self.subscribers(topic).collect();
        if let Some(to) = self.best_subset(topic, &members, Some(from), absorb) {
            self.stats.placements_moved += 1;
            if absorb {
                self.drop_pads(topic);
                self.pad_absorbing_regions(topic, &members, to);
            }
            self.move_topic(topic, from, to, ch);
        }
    }

    /// A topic alone in its subset joins the subset of a region whose members are exactly its
    /// subscribers, if a subset with room holds one (the fullest, then the lowest region id).
    /// Contained in that region and disjoint from the others, it breaks no rule of the module
    /// docs, and its subscribers are then in one region fewer: topics shared by the same nodes
    /// share their regions whatever their size (a publisher and a subscriber of 100,000 topics
    /// have 98 regions, not 100,000), where the rule itself waits for
    /// `first_placement_subscribers`.
    fn join_identical(&mut self, topic: TopicId, ch: &mut Changes) {
        let Some(ts) = self.topics.get(&topic) else {
            return;
        };
        let from = ts.subset;
        if self.subsets.get(&from).is_none_or(|s| s.topics.len() > 1) {
            return;
        }
        let Some(candidates) = self.by_members.get(&ts.subscribers_hash) else {
            return;
        };
        let mut best: Option<(usize, std::cmp::Reverse<RegionId>, SubsetId)> = None;
        for &r in candidates {
            let Some(reg) = self.regions.get(&r) else {
                continue;
            };
            if reg.subset == from || reg.members != ts.subscribers {
                continue;
            }
            let held = self.subsets.get(&reg.subset).map_or(0, |s| s.topics.len());
            let key = (held, std::cmp::Reverse(r), reg.subset);
            if best.is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                best = Some(key);
            }
        }
        if let Some((_, _, to)) = best {
            self.stats.identical_joins += 1;
            self.move_topic(topic, from, to, ch);
        }
    }

    /// Whether `subset` may take another topic (`subset_topics_max`).
    fn subset_has_room(&self, subset: SubsetId) -> bool {
        self.subsets
            .get(&subset)
            .is_some_and(|s| s.topics.len() < self.config.subset_topics_max)
    }

    fn index_insert(&mut self, r: RegionId, members_hash: u64) {
        self.by_members.entry(members_hash).or_default().push(r);
    }

    fn index_remove(&mut self, r: RegionId, members_hash: u64) {
        if let Some(rs) = self.by_members.get_mut(&members_hash) {
            if let Some(at) = rs.iter().position(|&x| x == r) {
                rs.swap_remove(at);
            }
            if rs.is_empty() {
                self.by_members.remove(&members_hash);
            }
        }
    }

    /// Adds `node` to region `r`'s members (`join`) or removes it, keeping the members' hash
    /// and the region's entry in `by_members` with them; an emptied region leaves the index
    /// (it is about to be removed). Returns whether the region is now empty.
    fn set_member(&mut self, r: RegionId, node: NodeId, join: bool) -> bool {
        let Some(reg) = self.regions.get_mut(&r) else {
            return true;
        };
        let old_hash = reg.members_hash;
        let changed = if join {
            reg.members.insert(node)
        } else {
            reg.members.remove(&node)
        };
        if changed {
            reg.members_hash = if join {
                old_hash.wrapping_add(node_hash(node))
            } else {
                old_hash.wrapping_sub(node_hash(node))
            };
        }
        let (subset, new_hash, empty) = (reg.subset, reg.members_hash, reg.members.is_empty());
        if changed && self.subset_has_room(subset) {
            self.index_remove(r, old_hash);
            if !empty {
                self.index_insert(r, new_hash);
            }
        }
        empty
    }

    /// After `subset`'s topics changed: its regions enter or leave the index if it gained or
    /// lost room for another topic (`had_room`: whether it had before).
    fn reindex_if_room_changed(&mut self, subset: SubsetId, had_room: bool) {
        let room = self.subset_has_room(subset);
        if room == had_room {
            return;
        }
        let regions: Vec<(RegionId, u64)> = self
            .subsets
            .get(&subset)
            .into_iter()
            .flat_map(|s| s.by_sig.values())
            .filter_map(|r| self.regions.get(r).map(|reg| (*r, reg.members_hash)))
            .collect();
        for (r, h) in regions {
            if room {
                self.index_insert(r, h);
            } else {
                self.index_remove(r, h);
            }
        }
    }

    /// The best subset (other than `exclude`) that admits a topic with `members` as subscribers,
    /// among candidates found through a sample of the members.
    fn best_subset(
        &mut self,
        topic: TopicId,
        members: &BTreeSet<NodeId>,
        exclude: Option<SubsetId>,
        absorb: bool,
    ) -> Option<SubsetId> {
        let sample_max = self.config.placement_sample_nodes;
        let step = (members.len() / sample_max).max(1);
        // Dense counters indexed by subset id (ids are reused, so the vector stays small); this
        // loop is the planner's hot spot: a node is in one region per subset, often hundreds.
        let needed = self.next_subset as usize;
        if self.candidate_counts.len() < needed {
            self.candidate_counts.resize(needed, 0);
        }
        let mut touched: Vec<SubsetId> = Vec::new();
        for n in members.iter().step_by(step).take(sample_max) {
            if let Some(ns) = self.nodes.get(n) {
                for &s in ns.regions.keys() {
                    if let Some(c) = self.candidate_counts.get_mut(s.0 as usize) {
                        if *c == 0 {
                            touched.push(s);
                        }
                        *c += 1;
                    }
                }
            }
        }
        let mut candidates: Vec<(u32, SubsetId)> = Vec::with_capacity(touched.len());
        for s in touched {
            if let Some(c) = self.candidate_counts.get_mut(s.0 as usize) {
                if Some(s) != exclude {
                    candidates.push((*c, s));
                }
                *c = 0;
            }
        }
        // Most sampled members first, then lowest id, so the result is deterministic.
        let order = |a: &(u32, SubsetId), b: &(u32, SubsetId)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        let keep = self.config.placement_candidates_max;
        if candidates.len() > keep {
            candidates.select_nth_unstable_by(keep - 1, order);
            candidates.truncate(keep);
        }
        candidates.sort_by(order);
        let mut best: Option<(Fit, SubsetId)> = None;
        for (_, s) in candidates {
            self.stats.candidates_evaluated += 1;
            if let Some(fit) = self.evaluate(topic, members, s, absorb) {
                if best.is_none_or(|(b, _)| fit > b) {
                    best = Some((fit, s));
                }
            }
        }
        best.map(|(_, s)| s)
    }

    /// Whether subset `s` admits a topic with subscribers `members` (rules 1-3 of the module
    /// docs), and how well. With `absorb` (approximate regions), a region holding some of the
    /// subscribers takes the topic whole, not split, when its other members can all pad it.
    fn evaluate(
        &self,
        topic: TopicId,
        members: &BTreeSet<NodeId>,
        s: SubsetId,
        absorb: bool,
    ) -> Option<Fit> {
        let min = self.config.min_region_size;
        let max = self.config.max_regions_per_topic;
        if !self.subset_has_room(s) {
            return None;
        }
        let mut counts: BTreeMap<RegionId, usize> = BTreeMap::new();
        let mut outside = 0usize;
        for n in members {
            match self.nodes.get(n).and_then(|ns| ns.regions.get(&s)) {
                Some(&r) => {
                    *counts.entry(r).or_default() += 1;
                    // Fail early: most candidates break the bound after a few subscribers.
                    if counts.len() + usize::from(outside > 0) > max {
                        return None;
                    }
                }
                None => {
                    outside += 1;
                    if counts.len() + 1 > max {
                        return None;
                    }
                }
            }
        }
        if outside > 0 && outside < min {
            return None;
        }
        let mut new_regions = usize::from(outside > 0);
        let mut padded = 0u64;
        let mut extra: BTreeMap<TopicId, usize> = BTreeMap::new();
        for (&r, &c) in &counts {
            let reg = self.regions.get(&r)?;
            let size = reg.members.len();
            if c < size && absorb {
                if let Some(w) = self.absorbs(r, topic, members) {
                    padded = padded.saturating_add(w);
                    continue;
                }
            }
            if c < size {
                if c < min || size - c < min {
                    return None;
                }
                new_regions += 1;
                for &u in &reg.topics {
                    *extra.entry(u).or_default() += 1;
                }
            }
        }
        for (u, e) in extra {
            if u == topic {
                continue;
            }
            let span = self.topics.get(&u).map_or(0, |ts| ts.regions.len());
            if span + e > max {
                return None;
            }
        }
        Some(Fit {
            inside: members.len() - outside,
            fewer_new_regions: std::cmp::Reverse(new_regions),
            less_padding: std::cmp::Reverse(padded),
        })
    }
}
