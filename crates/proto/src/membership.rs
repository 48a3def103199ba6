//! The membership a node is given: region views with their partitions, and which regions each
//! topic spans. The GMS will supply it dynamically; for now the caller builds it.

use std::collections::{BTreeMap, BTreeSet};

use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

/// One region view: the members (nodes with identical subscription sets) and their partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RegionView {
    /// The region.
    pub region: RegionId,
    /// The view epoch.
    pub view: ViewId,
    /// The epoch at which the region's streams and rings began (at most `view`). Views of one
    /// region with the same base continue them: between them only topics were added or dropped
    /// by every member (none moved to another region of the same nodes), the members and
    /// partitions are the same. A node installing such a view keeps its streams,
    /// their sequence numbers and unstable messages, and its rings (ADR 30); packets of any
    /// view from the base on belong to them. Any other change starts a new base.
    pub base: ViewId,
    /// The topics every member subscribes to.
    pub topics: Vec<TopicId>,
    /// The partitions in ring order of the partition leaders; each lists its members in ring order,
    /// the first being the partition leader. The leader of partition 0 is the region leader.
    pub partitions: Vec<Vec<NodeId>>,
}

impl RegionView {
    /// All members, partition by partition, in ring order.
    pub fn members(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.partitions.iter().flatten().copied()
    }

    /// Whether this view continues the streams and rings of a region that ran in view `view` of
    /// base `base` with `partitions` (ADR 30): a later view of the same base. The partitions
    /// must be the same too; the base implies them, and comparing them makes a service's error
    /// restart the streams everywhere rather than mix two memberships.
    #[must_use]
    pub fn continues(&self, view: ViewId, base: ViewId, partitions: &[Vec<NodeId>]) -> bool {
        self.base == base && self.view > view && self.partitions == partitions
    }

    /// Number of members.
    #[must_use]
    pub fn member_count(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }

    /// The partition `node` is in, if it is a member.
    #[must_use]
    pub fn partition_of(&self, node: NodeId) -> Option<usize> {
        self.partitions.iter().position(|p| p.contains(&node))
    }

    /// The partition that caches sequence number `seq` (round-robin over partitions).
    #[must_use]
    pub fn caching_partition(&self, seq: u64) -> usize {
        // Partitions are never empty in a valid view; `max(1)` keeps this total anyway.
        (seq % self.partitions.len().max(1) as u64) as usize
    }

    /// Splits `members` (in ring order) into partitions of at least `partition_size` nodes
    /// (the last partitions absorb the remainder, so sizes stay within `size..2*size`).
    #[must_use]
    pub fn partitioned(members: &[NodeId], partition_size: usize) -> Vec<Vec<NodeId>> {
        let size = partition_size.max(1);
        let count = (members.len() / size).max(1);
        let base = members.len() / count;
        let extra = members.len() % count;
        let mut out = Vec::with_capacity(count);
        let mut at = 0;
        for i in 0..count {
            let len = base + usize::from(i < extra);
            out.push(members[at..at + len].to_vec());
            at += len;
        }
        out
    }
}

/// A change of a node's membership, for [`Node::update_membership`](crate::Node::update_membership):
/// the regions and published topics that changed, each as it is now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipChange {
    /// Each changed region's view now, `None` if the node no longer knows it.
    pub regions: Vec<(RegionId, Option<RegionView>)>,
    /// Each changed topic's region list now, `None` if the node no longer publishes on it.
    pub topic_regions: Vec<(TopicId, Option<Vec<RegionId>>)>,
}

impl MembershipChange {
    /// Whether nothing changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty() && self.topic_regions.is_empty()
    }
}

/// What a node knows of the membership: region views and the topic-to-regions map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// Region views by region.
    pub regions: BTreeMap<RegionId, RegionView>,
    /// For each topic, the regions its subscribers span.
    pub topic_regions: BTreeMap<TopicId, Vec<RegionId>>,
    /// With approximate regions (ADR 34): the topics this node subscribes to, so delivers. Its
    /// regions may carry others, which it receives and discards. `None`: every topic of its
    /// regions (exact regions).
    pub subscriptions: Option<BTreeSet<TopicId>>,
}

impl Membership {
    /// Forms regions from subscriptions as paper 001 does for regularly overlapping topics: nodes
    /// with identical subscription sets share a region. Nodes that subscribe to nothing are in no
    /// region. Regions are numbered in order of their smallest member; all views are epoch 1.
    #[must_use]
    pub fn from_subscriptions(
        subscriptions: &BTreeMap<NodeId, Vec<TopicId>>,
        partition_size: usize,
    ) -> Membership {
        let mut by_set: BTreeMap<Vec<TopicId>, Vec<NodeId>> = BTreeMap::new();
        for (&node, topics) in subscriptions {
            let mut set = topics.clone();
            set.sort_unstable();
            set.dedup();
            if !set.is_empty() {
                by_set.entry(set).or_default().push(node);
            }
        }
        let mut groups: Vec<(Vec<TopicId>, Vec<NodeId>)> = by_set.into_iter().collect();
        groups.sort_by_key(|(_, nodes)| nodes[0]);
        let mut m = Membership::default();
        for (i, (topics, nodes)) in groups.into_iter().enumerate() {
            let region = RegionId(i as u32 + 1);
            for &t in &topics {
                m.topic_regions.entry(t).or_default().push(region);
            }
            let partitions = RegionView::partitioned(&nodes, partition_size);
            m.regions.insert(
                region,
                RegionView {
                    region,
                    view: ViewId(1),
                    base: ViewId(1),
                    topics,
                    partitions,
                },
            );
        }
        m
    }

    /// The region `node` is a member of, if any.
    #[must_use]
    pub fn region_of(&self, node: NodeId) -> Option<&RegionView> {
        self.regions
            .values()
            .find(|r| r.partition_of(node).is_some())
    }

    /// The members of `region`, empty if unknown.
    pub fn members(&self, region: RegionId) -> impl Iterator<Item = NodeId> + '_ {
        self.regions
            .get(&region)
            .into_iter()
            .flat_map(RegionView::members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_members_with_bounded_sizes() {
        for n in 1..60u32 {
            let members: Vec<NodeId> = (0..n).map(NodeId).collect();
            let parts = RegionView::partitioned(&members, 5);
            let flat: Vec<NodeId> = parts.iter().flatten().copied().collect();
            assert_eq!(flat, members);
            for p in &parts {
                assert!(!p.is_empty());
                assert!(
                    n < 5 || (5..10).contains(&p.len()),
                    "n={n} sizes {:?}",
                    p.len()
                );
            }
        }
    }

    #[test]
    fn identical_subscriptions_share_a_region() {
        let mut subs = BTreeMap::new();
        subs.insert(NodeId(1), vec![TopicId(1), TopicId(2)]);
        subs.insert(NodeId(2), vec![TopicId(2), TopicId(1)]);
        subs.insert(NodeId(3), vec![TopicId(2)]);
        subs.insert(NodeId(4), vec![]);
        let m = Membership::from_subscriptions(&subs, 5);
        assert_eq!(m.regions.len(), 2);
        assert_eq!(m.topic_regions[&TopicId(1)].len(), 1);
        assert_eq!(m.topic_regions[&TopicId(2)].len(), 2);
        assert_eq!(m.region_of(NodeId(2)).unwrap().member_count(), 2);
        assert!(m.region_of(NodeId(4)).is_none());
    }
}
