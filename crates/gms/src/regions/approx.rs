//! Approximate regions (ADR 34): the planner's pads.
//!
//! With [`PlannerConfig::waste_max_permille`] above 0 a node may receive topics it does not
//! subscribe to, its *pads*. The partitioning of the module docs then runs on what each node
//! *receives* (its subscriptions and its pads): a region's members all receive every topic it
//! carries, and a topic's receivers are exactly the members of its regions. The pads are
//! chosen so that each node's waste, `pad / (real + pad)` over the weights of its topics, stays
//! within the bound after every operation:
//!
//! - **Carrier join** (a subscription): a node subscribing to a topic moves into a region of
//!   that topic which carries all the node wants of the subset, padding the rest, instead of
//!   forming a region of its own signature. The topic spans no more regions than before.
//! - **Absorption** (a placement): a topic looking for a subset may be carried whole by a
//!   region that holds some of its subscribers, padding the region's other members, instead of
//!   splitting the region. That is what lets a thinly spread topic join a subset at all.
//! - **Keep as pad** (an unsubscription): a node leaving a topic that another member of its
//!   region still subscribes to keeps receiving it, if it can afford to.
//! - **Shed**: a node whose waste exceeds the bound (an unsubscription lowered what it wants,
//!   or a topic's weight changed) moves back to its exact signature in the subsets of its pads,
//!   one subset at a time, until it is within the bound. An exact signature has no pad.
//!
//! A topic nobody subscribes to any more is taken out of every region that still carries it
//! for pads. A topic evicted to a subset of its own, or placed anew, leaves its pads behind.

use std::collections::BTreeSet;

use tidings_wire::{NodeId, RegionId, TopicId};

use super::{node_hash, Changes, Planner, SubsetId};

impl Planner {
    /// The weight of `topic`: its message rate, in any unit common to all topics (1 unless
    /// [set](Planner::set_topic_weight)).
    #[must_use]
    pub fn topic_weight(&self, topic: TopicId) -> u64 {
        self.weights.get(&topic).copied().unwrap_or(1)
    }

    /// Sets the weight of `topic` (at least 1): its message rate relative to the other topics,
    /// which the waste bound of approximate regions counts in. The weights of its current
    /// receivers are updated, and any of them now beyond the bound sheds pads (the returned
    /// changes). With exact regions weights change nothing.
    pub fn set_topic_weight(&mut self, topic: TopicId, weight: u64) -> Changes {
        let mut ch = Changes::default();
        let weight = weight.max(1);
        let old = self.topic_weight(topic);
        if weight == 1 {
            self.weights.remove(&topic);
        } else {
            self.weights.insert(topic, weight);
        }
        if old == weight {
            return ch;
        }
        let Some(ts) = self.topics.get(&topic) else {
            return ch;
        };
        let receivers: Vec<(NodeId, bool)> = ts
            .subscribers
            .iter()
            .map(|&n| (n, ts.pads.contains(&n)))
            .collect();
        for &(n, pad) in &receivers {
            if let Some(ns) = self.nodes.get_mut(&n) {
                let sum = if pad {
                    &mut ns.pad_weight
                } else {
                    &mut ns.real_weight
                };
                *sum = sum.saturating_sub(old).saturating_add(weight);
            }
        }
        for (n, _) in receivers {
            self.shed(n, &mut ch);
        }
        ch
    }

    /// Whether regions may be approximate.
    pub(super) fn approximate(&self) -> bool {
        self.config.waste_max_permille > 0
    }

    /// Whether a node wanting `real` and padding `pad` (weights) is within the bound.
    pub(super) fn within(&self, real: u64, pad: u64) -> bool {
        u128::from(pad) * 1000
            <= u128::from(self.config.waste_max_permille) * (u128::from(real) + u128::from(pad))
    }

    /// The waste of `node`: the share of the weight of the topics it receives that it does not
    /// subscribe to (0 for an unknown node or with exact regions).
    #[must_use]
    pub fn waste(&self, node: NodeId) -> f64 {
        self.nodes.get(&node).map_or(0.0, |ns| {
            let total = ns.real_weight.saturating_add(ns.pad_weight);
            if total == 0 {
                0.0
            } else {
                ns.pad_weight as f64 / total as f64
            }
        })
    }

    /// Records that `node` receives `topic` as a pad (no region moves).
    fn record_pad(&mut self, node: NodeId, topic: TopicId) {
        let w = self.topic_weight(topic);
        let (Some(ns), Some(ts)) = (self.nodes.get_mut(&node), self.topics.get_mut(&topic)) else {
            return;
        };
        if !ns.topics.insert(topic) {
            return;
        }
        ns.pads.insert(topic);
        ns.pad_weight = ns.pad_weight.saturating_add(w);
        ts.subscribers.insert(node);
        ts.pads.insert(node);
        ts.subscribers_hash = ts.subscribers_hash.wrapping_add(node_hash(node));
        self.stats.pads_added += 1;
    }

    /// Records that `node` no longer receives its pad `topic` (no region moves).
    fn unrecord_pad(&mut self, node: NodeId, topic: TopicId) {
        let w = self.topic_weight(topic);
        let (Some(ns), Some(ts)) = (self.nodes.get_mut(&node), self.topics.get_mut(&topic)) else {
            return;
        };
        if !ns.pads.remove(&topic) {
            return;
        }
        ns.topics.remove(&topic);
        ns.pad_weight = ns.pad_weight.saturating_sub(w);
        ts.subscribers.remove(&node);
        ts.pads.remove(&node);
        ts.subscribers_hash = ts.subscribers_hash.wrapping_sub(node_hash(node));
    }

    /// Forgets every pad of `topic` (no region moves: the caller takes the topic out of their
    /// regions, or moves it to another subset without them).
    pub(super) fn drop_pads(&mut self, topic: TopicId) {
        let pads: Vec<NodeId> = self
            .topics
            .get(&topic)
            .map(|ts| ts.pads.iter().copied().collect())
            .unwrap_or_default();
        for n in pads {
            self.unrecord_pad(n, topic);
        }
    }

    /// Carrier join: `node`, which has just subscribed to `topic` of `subset` (recorded in the
    /// topic's and node's sets, not yet in a region), moves into the region of `topic` that
    /// carries all the node subscribes to in the subset with the least padding within the
    /// bound. Returns false (nothing done) if there is none.
    pub(super) fn join_carrier(
        &mut self,
        node: NodeId,
        topic: TopicId,
        subset: SubsetId,
        ch: &mut Changes,
    ) -> bool {
        let Some(ns) = self.nodes.get(&node) else {
            return false;
        };
        let current = self.sig(node, subset);
        let old_pads: Vec<TopicId> = current
            .iter()
            .copied()
            .filter(|t| ns.pads.contains(t))
            .collect();
        let mut want: Vec<TopicId> = current
            .iter()
            .copied()
            .filter(|t| !ns.pads.contains(t))
            .collect();
        if let Err(at) = want.binary_search(&topic) {
            want.insert(at, topic);
        }
        let old_pad_weight: u64 = old_pads.iter().map(|&t| self.topic_weight(t)).sum();
        let base = ns.pad_weight.saturating_sub(old_pad_weight);
        let real = ns.real_weight;
        let mut best: Option<(u64, RegionId)> = None;
        for r in self.topic_regions(topic) {
            let Some(reg) = self.regions.get(&r) else {
                continue;
            };
            if reg.topics.len() < want.len()
                || !want.iter().all(|t| reg.topics.binary_search(t).is_ok())
            {
                continue;
            }
            let pad: u64 = reg
                .topics
                .iter()
                .filter(|t| want.binary_search(t).is_err())
                .map(|&t| self.topic_weight(t))
                .sum();
            if self.within(real, base.saturating_add(pad)) && best.is_none_or(|(b, _)| pad < b) {
                best = Some((pad, r));
            }
        }
        let Some((_, r)) = best else {
            return false;
        };
        let Some(sig) = self.regions.get(&r).map(|reg| reg.topics.clone()) else {
            return false;
        };
        for t in old_pads {
            self.unrecord_pad(node, t);
        }
        for &t in &sig {
            if want.binary_search(&t).is_err() {
                self.record_pad(node, t);
            }
        }
        self.stats.carrier_joins += 1;
        self.set_sig(node, subset, sig, ch);
        true
    }

    /// Keep as pad: `node` unsubscribing from `topic` keeps receiving it if another member of
    /// its region subscribes to it and the node stays within the bound. Returns whether it
    /// did (then the subscription is a pad now and nothing else changed).
    pub(super) fn keep_as_pad(&mut self, node: NodeId, topic: TopicId) -> bool {
        let w = self.topic_weight(topic);
        let Some(ts) = self.topics.get(&topic) else {
            return false;
        };
        let Some(ns) = self.nodes.get(&node) else {
            return false;
        };
        let Some(reg) = ns.regions.get(&ts.subset).and_then(|r| self.regions.get(r)) else {
            return false;
        };
        let shared = reg
            .members
            .iter()
            .any(|&m| m != node && !ts.pads.contains(&m));
        if !shared
            || !self.within(
                ns.real_weight.saturating_sub(w),
                ns.pad_weight.saturating_add(w),
            )
        {
            return false;
        }
        if let Some(ns) = self.nodes.get_mut(&node) {
            ns.pads.insert(topic);
            ns.real_weight = ns.real_weight.saturating_sub(w);
            ns.pad_weight = ns.pad_weight.saturating_add(w);
        }
        if let Some(ts) = self.topics.get_mut(&topic) {
            ts.pads.insert(node);
        }
        true
    }

    /// After `topic` lost a subscriber that was in region `left` (if known): if nobody
    /// subscribes to it any more, it leaves every region that carries it for pads and is
    /// dropped; else, if no member of `left` subscribes to it, `left` stops carrying it.
    pub(super) fn after_real_loss(
        &mut self,
        topic: TopicId,
        left: Option<RegionId>,
        ch: &mut Changes,
    ) {
        let Some(ts) = self.topics.get(&topic) else {
            return;
        };
        let subset = ts.subset;
        if ts.pads.len() == ts.subscribers.len() {
            let regions: Vec<RegionId> = ts.regions.iter().copied().collect();
            self.drop_pads(topic);
            self.strip_topic(topic, subset, regions, ch);
            self.drop_topic(topic, ch);
            return;
        }
        let Some(r) = left else {
            return;
        };
        let Some(reg) = self.regions.get(&r) else {
            return;
        };
        if reg.topics.binary_search(&topic).is_err()
            || reg.members.iter().any(|m| !ts.pads.contains(m))
        {
            return;
        }
        let members: Vec<NodeId> = reg.members.iter().copied().collect();
        for m in members {
            self.unrecord_pad(m, topic);
        }
        self.strip_topic(topic, subset, vec![r], ch);
    }

    /// Shed: while `node` is beyond the bound, it moves to its exact signature in the subset of
    /// one of its pads (dropping its pads there), and any topic that now spans too many regions
    /// is evicted.
    pub(super) fn shed(&mut self, node: NodeId, ch: &mut Changes) {
        loop {
            let Some(ns) = self.nodes.get(&node) else {
                return;
            };
            if self.within(ns.real_weight, ns.pad_weight) {
                return;
            }
            let Some(subset) = ns
                .pads
                .first()
                .and_then(|t| self.topics.get(t))
                .map(|ts| ts.subset)
            else {
                return;
            };
            let current = self.sig(node, subset).to_vec();
            let (pads, exact): (Vec<TopicId>, Vec<TopicId>) =
                current.iter().copied().partition(|t| ns.pads.contains(t));
            if pads.is_empty() {
                // Every pad is in the subset of its topic's regions; a break of that would loop.
                debug_assert!(false, "node {node} pads outside its regions");
                return;
            }
            for t in pads {
                self.unrecord_pad(node, t);
            }
            self.stats.sheds += 1;
            self.set_sig(node, subset, exact.clone(), ch);
            self.repair_violators(subset, &exact, ch);
        }
    }

    /// Evicts the topics of `sig` (in `subset`) that span more than `max_regions_per_topic`.
    fn repair_violators(&mut self, subset: SubsetId, sig: &[TopicId], ch: &mut Changes) {
        let max = self.config.max_regions_per_topic;
        let violates = |p: &Planner, t: &TopicId| {
            p.topics
                .get(t)
                .is_some_and(|ts| ts.subset == subset && ts.regions.len() > max)
        };
        while let Some(&t) = sig.iter().find(|t| violates(self, t)) {
            if !self.evict(t, ch) {
                break;
            }
        }
    }

    /// Absorption: whether region `r` can carry `topic` whole, every member not among
    /// `receivers` padding it within the bound; the weight of those pads if so.
    pub(super) fn absorbs(
        &self,
        r: RegionId,
        topic: TopicId,
        receivers: &BTreeSet<NodeId>,
    ) -> Option<u64> {
        let w = self.topic_weight(topic);
        let reg = self.regions.get(&r)?;
        let mut total = 0u64;
        for m in &reg.members {
            if receivers.contains(m) {
                continue;
            }
            let ns = self.nodes.get(m)?;
            if !self.within(ns.real_weight, ns.pad_weight.saturating_add(w)) {
                return None;
            }
            total = total.saturating_add(w);
        }
        Some(total)
    }

    /// Before `topic` (with receivers `receivers`) moves into subset `to`: the regions of `to`
    /// that hold some of its receivers and can absorb it get their other members padded, so the
    /// move takes the topic into them whole.
    pub(super) fn pad_absorbing_regions(
        &mut self,
        topic: TopicId,
        receivers: &BTreeSet<NodeId>,
        to: SubsetId,
    ) {
        let mut touched: BTreeSet<RegionId> = BTreeSet::new();
        for n in receivers {
            if let Some(&r) = self.nodes.get(n).and_then(|ns| ns.regions.get(&to)) {
                touched.insert(r);
            }
        }
        for r in touched {
            let Some(reg) = self.regions.get(&r) else {
                continue;
            };
            if reg.members.is_subset(receivers) || self.absorbs(r, topic, receivers).is_none() {
                continue;
            }
            let members: Vec<NodeId> = reg
                .members
                .iter()
                .copied()
                .filter(|m| !receivers.contains(m))
                .collect();
            self.stats.absorptions += 1;
            for m in members {
                self.record_pad(m, topic);
            }
        }
    }
}
