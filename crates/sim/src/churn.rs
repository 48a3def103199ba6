//! Membership changes during a run: crashes, leaves, joins and subscription changes, and the
//! membership each change produces.
//!
//! [`MembershipOracle`] is the default membership of a run (the real GMS is
//! [`MembershipKind::Gms`](crate::gms::MembershipKind), see [`crate::gms`]): it keeps every live node's subscriptions, forms regions of identical subscription
//! sets (keeping a region's id for as long as its topic set exists), bumps a region's view whenever
//! its members change, and the scenario installs the result on every live node at once; a crash is
//! noticed after a configurable detection delay (the heartbeat timeout of a GMS).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tidings_proto::{Membership, NodeId, RegionId, RegionView, Time, TopicId, ViewId};

/// The membership service of a simulated run.
#[derive(Debug)]
pub struct MembershipOracle {
    /// Live nodes and what they subscribe to (sorted).
    subscriptions: BTreeMap<NodeId, Vec<TopicId>>,
    /// Per topic set: its region, the current view and members.
    regions: BTreeMap<Vec<TopicId>, (RegionId, ViewId, Vec<NodeId>)>,
    next_region: u32,
    partition_size: usize,
    /// Approximate regions (ADR 34): the planner's waste bound in thousandths; 0 forms regions
    /// of identical subscription sets.
    waste_max_permille: u32,
}

impl MembershipOracle {
    /// Starts with `subscriptions[i]` for `NodeId(i)`.
    #[must_use]
    pub fn new(subscriptions: &[Vec<TopicId>], partition_size: usize) -> Self {
        let subscriptions = subscriptions
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut t = t.clone();
                t.sort_unstable();
                t.dedup();
                (NodeId(i as u32), t)
            })
            .collect();
        MembershipOracle {
            subscriptions,
            regions: BTreeMap::new(),
            next_region: 1,
            partition_size,
            waste_max_permille: 0,
        }
    }

    /// Forms approximate regions with the real planner ([`tidings_gms::Planner`], each node
    /// subscribing to its topics at once, in id order) under a waste bound of `permille`
    /// thousandths instead of regions of identical subscription sets (0 keeps those). Each
    /// node must then be told its own subscriptions ([`Membership::subscriptions`]).
    #[must_use]
    pub fn approximate(mut self, permille: u32) -> Self {
        self.waste_max_permille = permille;
        self
    }

    /// The topic sets and members of the regions for the current subscriptions.
    fn groups(&self) -> BTreeMap<Vec<TopicId>, Vec<NodeId>> {
        let mut groups: BTreeMap<Vec<TopicId>, Vec<NodeId>> = BTreeMap::new();
        if self.waste_max_permille > 0 {
            let config = {
                let mut c = tidings_gms::PlannerConfig::default();
                c.waste_max_permille = self.waste_max_permille;
                c
            };
            if let Ok(mut planner) = tidings_gms::Planner::new(config) {
                for (&node, topics) in &self.subscriptions {
                    let _changes = planner.subscribe_many(node, topics);
                }
                for (_, reg) in planner.regions() {
                    // Topics are in one subset each, so no two regions carry the same set.
                    groups.insert(reg.topics.clone(), reg.members.iter().copied().collect());
                }
                return groups;
            }
        }
        for (&node, topics) in &self.subscriptions {
            if !topics.is_empty() {
                groups.entry(topics.clone()).or_default().push(node);
            }
        }
        groups
    }

    /// What `node` subscribes to now (empty if it left or crashed).
    #[must_use]
    pub fn subscriptions_of(&self, node: NodeId) -> &[TopicId] {
        self.subscriptions.get(&node).map_or(&[], Vec::as_slice)
    }

    /// `node` now subscribes to exactly `topics`.
    pub fn set(&mut self, node: NodeId, topics: &[TopicId]) {
        let mut t = topics.to_vec();
        t.sort_unstable();
        t.dedup();
        self.subscriptions.insert(node, t);
    }

    /// `node` is gone (crashed and detected).
    pub fn remove(&mut self, node: NodeId) {
        self.subscriptions.remove(&node);
    }

    /// The membership for the current subscriptions; regions whose members changed get a new view.
    pub fn membership(&mut self) -> Membership {
        let groups = self.groups();
        self.regions.retain(|topics, _| groups.contains_key(topics));
        let mut m = Membership::default();
        for (topics, members) in groups {
            let entry = self.regions.entry(topics.clone()).or_insert_with(|| {
                let id = RegionId(self.next_region);
                self.next_region += 1;
                (id, ViewId(0), Vec::new())
            });
            if entry.2 != members {
                entry.1 = ViewId(entry.1 .0 + 1);
                entry.2 = members.clone();
            }
            let (region, view) = (entry.0, entry.1);
            for &t in &topics {
                m.topic_regions.entry(t).or_default().push(region);
            }
            let partitions = RegionView::partitioned(&members, self.partition_size);
            m.regions.insert(
                region,
                RegionView {
                    region,
                    view,
                    base: view,
                    topics,
                    partitions,
                },
            );
        }
        m
    }
}

/// What happens to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChurnKind {
    /// The node stops dead; the membership learns it after the detection delay.
    Crash,
    /// The node unsubscribes from everything (a clean leave; it stays up).
    Leave,
    /// A node that left subscribes again (to some profile's topics).
    Join,
    /// The node changes its subscriptions (to another profile's topics).
    Resubscribe,
    /// The node subscribes to one more topic, one that no profile takes (`Scenario::adopt`).
    Adopt(TopicId),
    /// The node drops such a topic, if it holds it (`Scenario::abandon`).
    Abandon(TopicId),
}

/// One membership event of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChurnEvent {
    /// When it happens.
    pub at: Time,
    /// What happens.
    pub kind: ChurnKind,
    /// To whom.
    pub node: NodeId,
}

impl fmt::Display for ChurnEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ChurnKind::Crash => "crash",
            ChurnKind::Leave => "leave",
            ChurnKind::Join => "join",
            ChurnKind::Resubscribe => "resubscribe",
            ChurnKind::Adopt(_) => "adopt",
            ChurnKind::Abandon(_) => "abandon",
        };
        write!(
            f,
            "{:.3} s {kind} {}",
            self.at.as_nanos() as f64 / 1e9,
            self.node
        )?;
        if let ChurnKind::Adopt(t) | ChurnKind::Abandon(t) = self.kind {
            write!(f, " topic {}", t.0)?;
        }
        Ok(())
    }
}

/// A membership change to install, at a time.
#[derive(Clone, Debug)]
pub(crate) struct Install {
    pub(crate) at: Time,
    /// The event that caused it (for the report).
    pub(crate) cause: ChurnEvent,
}

/// Detection delay of a crash when the scenario does not say otherwise.
pub const DETECTION_DEFAULT: Duration = Duration::from_millis(300);
