use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

use super::*;

fn small_config() -> PlannerConfig {
    PlannerConfig {
        min_region_size: 1,
        max_regions_per_topic: 3,
        placement_candidates_max: 4,
        placement_sample_nodes: 4,
        first_placement_subscribers: 2,
        placement_growth_factor: 2,
        subset_topics_max: 1024,
        waste_max_permille: 0,
    }
}

fn approx_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u32..13, 1u32..9).prop_map(|(n, t)| Op::Sub(n, t)),
        3 => (1u32..13, 1u32..9).prop_map(|(n, t)| Op::Unsub(n, t)),
        1 => (1u32..13).prop_map(Op::Remove),
        1 => (1u32..9, 1u64..20).prop_map(|(t, w)| Op::Weight(t, w)),
    ]
}

fn snapshot(p: &Planner) -> BTreeMap<RegionId, BTreeSet<NodeId>> {
    p.regions()
        .map(|(r, reg)| (r, reg.members.clone()))
        .collect()
}

fn topic_regions(p: &Planner) -> BTreeMap<TopicId, BTreeSet<RegionId>> {
    p.topics()
        .map(|t| (t, p.topic_regions(t).collect()))
        .collect()
}

/// The reported changes match the difference between two snapshots.
fn check_changes(
    before: &BTreeMap<RegionId, BTreeSet<NodeId>>,
    tr_before: &BTreeMap<TopicId, BTreeSet<RegionId>>,
    p: &Planner,
    ch: &Changes,
) -> Result<(), TestCaseError> {
    let after = snapshot(p);
    let created: BTreeSet<RegionId> = after
        .keys()
        .filter(|r| !before.contains_key(r))
        .copied()
        .collect();
    let removed: BTreeSet<RegionId> = before
        .keys()
        .filter(|r| !after.contains_key(r))
        .copied()
        .collect();
    let changed: BTreeSet<RegionId> = after
        .iter()
        .filter(|(r, m)| before.get(r).is_some_and(|b| b != *m))
        .map(|(r, _)| *r)
        .collect();
    prop_assert_eq!(&ch.regions_created, &created);
    prop_assert_eq!(&ch.regions_removed, &removed);
    // A region may be reported changed when a node left and came back within one operation.
    prop_assert!(ch.regions_changed.is_superset(&changed));
    let tr_after = topic_regions(p);
    let topics: BTreeSet<TopicId> = tr_before.keys().chain(tr_after.keys()).copied().collect();
    for t in topics {
        if tr_before.get(&t) != tr_after.get(&t) {
            prop_assert!(
                ch.topics_changed.contains(&t),
                "topic {} change not reported",
                t
            );
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Sub(u32, u32),
    Unsub(u32, u32),
    Remove(u32),
    Weight(u32, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..13, 1u32..9).prop_map(|(n, t)| Op::Sub(n, t)),
        2 => (1u32..13, 1u32..9).prop_map(|(n, t)| Op::Unsub(n, t)),
        1 => (1u32..13).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// After every operation: every invariant holds (at most one region per node and subset,
    /// identical subscriptions within a region, topic subscribers = union of its regions, bounded
    /// regions per topic, bounded topics per subset, the index of regions by members), and the
    /// reported changes are exact.
    #[test]
    fn incremental_operations_keep_invariants(ops in proptest::collection::vec(op(), 1..120),
                                              max_regions in 1usize..4,
                                              subset_topics_max in 1usize..6,
                                              first_placement in 2usize..5) {
        let config = PlannerConfig {
            max_regions_per_topic: max_regions,
            subset_topics_max,
            first_placement_subscribers: first_placement,
            ..small_config()
        };
        let mut p = Planner::new(config.clone()).unwrap();
        let mut table: BTreeMap<NodeId, BTreeSet<TopicId>> = BTreeMap::new();
        for op in ops {
            let before = snapshot(&p);
            let tr_before = topic_regions(&p);
            let ch = match op {
                Op::Sub(n, t) => {
                    table.entry(NodeId(n)).or_default().insert(TopicId(t));
                    p.subscribe(NodeId(n), TopicId(t))
                }
                Op::Unsub(n, t) => {
                    if let Some(s) = table.get_mut(&NodeId(n)) {
                        s.remove(&TopicId(t));
                    }
                    p.unsubscribe(NodeId(n), TopicId(t))
                }
                Op::Remove(n) => {
                    table.remove(&NodeId(n));
                    p.remove_node(NodeId(n))
                }
                Op::Weight(t, w) => p.set_topic_weight(TopicId(t), w),
            };
            table.retain(|_, s| !s.is_empty());
            if let Err(e) = p.check_invariants() {
                prop_assert!(false, "{}", e);
            }
            check_changes(&before, &tr_before, &p, &ch)?;
        }
        // The planner's subscriptions are the table's.
        for (n, ts) in &table {
            let got: BTreeSet<TopicId> = p.subscriptions(*n).collect();
            prop_assert_eq!(&got, ts);
        }
        prop_assert_eq!(p.node_count(), table.len());
        // Building from scratch gives an equally valid structure with the same topic memberships.
        let batch = Planner::from_scratch(config, &table).unwrap();
        if let Err(e) = batch.check_invariants() {
            prop_assert!(false, "batch: {}", e);
        }
        for t in p.topics() {
            let a: BTreeSet<NodeId> = p.subscribers(t).collect();
            let b: BTreeSet<NodeId> = batch.subscribers(t).collect();
            prop_assert_eq!(a, b);
        }
    }

    /// Approximate regions: after every operation (subscriptions, unsubscriptions, removals and
    /// weight changes, on topics of random weights) every invariant holds, including that no
    /// node wastes more than the bound and that every receiver of a topic is a member of one of
    /// its regions, and the reported changes are exact; the subscriptions are the table's, and
    /// the subscribers of each topic are the nodes that subscribe to it (not its pads).
    #[test]
    fn approximate_operations_keep_the_waste_bound(ops in proptest::collection::vec(approx_op(), 1..150),
                                                   waste in 1u32..700,
                                                   max_regions in 1usize..4,
                                                   subset_topics_max in 1usize..6,
                                                   first_placement in 1usize..4) {
        let config = PlannerConfig {
            max_regions_per_topic: max_regions,
            subset_topics_max,
            first_placement_subscribers: first_placement,
            waste_max_permille: waste,
            ..small_config()
        };
        let mut p = Planner::new(config).unwrap();
        let mut table: BTreeMap<NodeId, BTreeSet<TopicId>> = BTreeMap::new();
        for op in ops {
            let before = snapshot(&p);
            let tr_before = topic_regions(&p);
            let ch = match op {
                Op::Sub(n, t) => {
                    table.entry(NodeId(n)).or_default().insert(TopicId(t));
                    p.subscribe(NodeId(n), TopicId(t))
                }
                Op::Unsub(n, t) => {
                    if let Some(s) = table.get_mut(&NodeId(n)) {
                        s.remove(&TopicId(t));
                    }
                    p.unsubscribe(NodeId(n), TopicId(t))
                }
                Op::Remove(n) => {
                    table.remove(&NodeId(n));
                    p.remove_node(NodeId(n))
                }
                Op::Weight(t, w) => p.set_topic_weight(TopicId(t), w),
            };
            table.retain(|_, s| !s.is_empty());
            if let Err(e) = p.check_invariants() {
                prop_assert!(false, "{:?}: {}", op, e);
            }
            check_changes(&before, &tr_before, &p, &ch)?;
            for n in p.nodes() {
                prop_assert!(p.waste(n) <= f64::from(waste) / 1000.0 + 1e-12);
            }
        }
        for (n, ts) in &table {
            let got: BTreeSet<TopicId> = p.subscriptions(*n).collect();
            prop_assert_eq!(&got, ts);
        }
        prop_assert_eq!(p.node_count(), table.len());
        for t in p.topics() {
            let subs: BTreeSet<NodeId> = p.subscribers(t).collect();
            let want: BTreeSet<NodeId> = table
                .iter()
                .filter(|(_, ts)| ts.contains(&t))
                .map(|(n, _)| *n)
                .collect();
            prop_assert_eq!(subs, want);
        }
    }
}

#[test]
fn identical_topics_share_one_subset_and_one_region() {
    // Three topics with the same five subscribers: each is contained in the others' region.
    let mut p = Planner::new(PlannerConfig {
        first_placement_subscribers: 5,
        ..PlannerConfig::default()
    })
    .unwrap();
    for n in 1..=5 {
        for t in 1..=3 {
            p.subscribe(NodeId(n), TopicId(t));
        }
    }
    p.check_invariants().unwrap();
    assert_eq!(p.subset_count(), 1, "containment keeps one subset");
    assert_eq!(p.region_count(), 1);
    assert_eq!(p.node_regions(NodeId(1)).count(), 1);
}

#[test]
fn the_rule_refuses_small_regions_and_admits_even_splits() {
    // Topic 1: nodes 1-10. Topic 2: nodes 1-8 (would split off a region of 2 < 5). Topic 3:
    // nodes 1-5 (splits topic 1's region 5 + 5, topic 2's 5 + 3).
    let mut table: BTreeMap<NodeId, BTreeSet<TopicId>> = BTreeMap::new();
    for n in 1..=10 {
        let ts = table.entry(NodeId(n)).or_default();
        ts.insert(TopicId(1));
        if n <= 8 {
            ts.insert(TopicId(2));
        }
        if n <= 5 {
            ts.insert(TopicId(3));
        }
    }
    let p = Planner::from_scratch(PlannerConfig::default(), &table).unwrap();
    p.check_invariants().unwrap();
    assert_ne!(p.subset_of(TopicId(1)), p.subset_of(TopicId(2)));
    assert_eq!(p.subset_of(TopicId(3)), p.subset_of(TopicId(1)));
    assert_eq!(p.topic_regions(TopicId(1)).count(), 2);
    assert_eq!(p.node_regions(NodeId(1)).count(), 2);
    assert_eq!(p.node_regions(NodeId(10)).count(), 1);
}

#[test]
fn too_many_regions_evicts_the_topic() {
    let mut p = Planner::new(PlannerConfig {
        max_regions_per_topic: 2,
        ..small_config()
    })
    .unwrap();
    // Topics 1 and 2 identical on nodes 1-4: one subset, one region.
    for n in 1..=4 {
        p.subscribe(NodeId(n), TopicId(1));
        p.subscribe(NodeId(n), TopicId(2));
    }
    assert_eq!(p.subset_of(TopicId(1)), p.subset_of(TopicId(2)));
    // Nodes 5, 6 subscribe to topic 1 only, node 7 to topic 2 only, then 8 and 9 to others.
    for (n, t) in [(5, 1), (6, 1), (7, 2), (8, 2), (9, 3), (9, 1)] {
        p.subscribe(NodeId(n), TopicId(t));
        p.check_invariants().unwrap();
    }
    for t in p.topics().collect::<Vec<_>>() {
        assert!(p.topic_regions(t).count() <= 2);
    }
}

#[test]
fn membership_holds_own_regions_and_published_topics() {
    let mut p = Planner::new(small_config()).unwrap();
    for n in 1..=3 {
        p.subscribe(NodeId(n), TopicId(1));
    }
    p.subscribe(NodeId(4), TopicId(2));
    let m = p.membership(NodeId(4), &[TopicId(1)], 2, |_| (ViewId(7), ViewId(7)));
    // Node 4 is in topic 2's region and publishes to topic 1's.
    assert_eq!(m.regions.len(), 2);
    assert_eq!(m.topic_regions.len(), 1);
    let r1 = m.topic_regions[&TopicId(1)][0];
    assert_eq!(m.regions[&r1].member_count(), 3);
    assert_eq!(m.regions[&r1].view, ViewId(7));
    assert_eq!(m.regions[&r1].partitions.len(), 1);
    assert!(m.region_of(NodeId(4)).is_some());
    let m1 = p.membership(NodeId(1), &[], 2, |_| (ViewId(1), ViewId(1)));
    assert_eq!(m1.regions.len(), 1);
    assert!(m1.topic_regions.is_empty());
}

#[test]
fn config_is_validated() {
    assert!(PlannerConfig::default().validate().is_ok());
    let bad = PlannerConfig {
        min_region_size: 0,
        ..PlannerConfig::default()
    };
    assert_eq!(
        bad.validate(),
        Err(PlannerConfigError::Zero("min_region_size"))
    );
    let bad = PlannerConfig {
        placement_growth_factor: 1,
        ..PlannerConfig::default()
    };
    assert!(Planner::new(bad).is_err());
}

#[test]
fn topics_of_the_same_subscribers_share_regions_of_at_most_subset_topics_max_topics() {
    let mut p = Planner::new(PlannerConfig::default()).unwrap();
    let max = PlannerConfig::default().subset_topics_max;
    // One subscriber of 3,000 topics, then a second of the same topics.
    for n in 1..=2 {
        for t in 0..3000 {
            p.subscribe(NodeId(n), TopicId(t));
        }
        p.check_invariants().unwrap();
        assert_eq!(p.region_count(), 3000usize.div_ceil(max), "node {n}");
        assert_eq!(p.node_regions(NodeId(n)).count(), p.region_count());
        for (_, reg) in p.regions() {
            assert!(reg.topics.len() <= max);
            assert_eq!(reg.members.len(), n as usize);
        }
    }
    // The first subscriber's topics joined by identity (all but the first of each region).
    assert_eq!(p.stats().identical_joins, 3000 - 3);
    // Each subscription moved its subscriber between regions a bounded number of times (the
    // first node's topics start alone and join; the second node's grow its own region until it
    // has them all): the work grows with the subscriptions, not with their square.
    assert!(
        p.stats().node_moves <= 3 * 2 * 3000,
        "{} node moves for 6,000 subscriptions",
        p.stats().node_moves
    );
    // Dropping them leaves nothing behind.
    for n in 1..=2 {
        for t in 0..3000 {
            p.unsubscribe(NodeId(n), TopicId(t));
        }
    }
    p.check_invariants().unwrap();
    assert_eq!(
        (p.region_count(), p.subset_count(), p.topic_count()),
        (0, 0, 0)
    );
}

#[test]
fn a_subset_topics_max_of_one_keeps_each_topic_in_a_region_of_its_own() {
    let mut p = Planner::new(PlannerConfig {
        subset_topics_max: 1,
        ..PlannerConfig::default()
    })
    .unwrap();
    for n in 1..=12 {
        for t in 0..20 {
            p.subscribe(NodeId(n), TopicId(t));
        }
    }
    p.check_invariants().unwrap();
    assert_eq!((p.region_count(), p.subset_count()), (20, 20));
    assert_eq!(p.stats().identical_joins, 0);
}

#[test]
fn a_second_subscriber_of_shared_topics_leaves_the_first_ones_region_alone_until_it_has_them_all() {
    let mut p = Planner::new(PlannerConfig::default()).unwrap();
    let (a, b) = (NodeId(1), NodeId(2));
    let topics = [TopicId(1), TopicId(2), TopicId(3)];
    for t in topics {
        p.subscribe(a, t);
    }
    assert_eq!(p.region_count(), 1);
    let (_, shared) = p.node_regions(a).next().unwrap();
    // b subscribes to the topics one by one: each change is b's region's; a's region (which
    // carries the traffic of all three) keeps its id and its members until b has them all.
    for (k, t) in topics.into_iter().enumerate() {
        let ch = p.subscribe(b, t);
        p.check_invariants().unwrap();
        if k < 2 {
            assert!(
                !ch.regions_changed.contains(&shared) && !ch.regions_removed.contains(&shared),
                "{ch:?}"
            );
            assert_eq!(p.topic_regions(t).count(), 2);
        } else {
            // The same subscriptions now: b joins a's region.
            assert!(ch.regions_changed.contains(&shared), "{ch:?}");
        }
    }
    assert_eq!(p.region_count(), 1);
    assert_eq!(p.region(shared).unwrap().members, BTreeSet::from([a, b]));
    // a drops topic 1: topics 2 and 3 span a's new region and b's.
    p.unsubscribe(a, topics[0]);
    p.check_invariants().unwrap();
    assert_eq!(p.topic_regions(topics[0]).count(), 1);
    assert_eq!(p.topic_regions(topics[1]).count(), 2);
    assert_eq!(p.node_regions(a).count(), 1);
}

/// A region whose members all drop a topic goes on (its view keeps its base: nothing of the
/// topic has a receiver there, ADR 30 addendum); a region a topic moves out of while its members
/// still subscribe to it starts anew, so that the topic's unstable messages are re-homed ahead of
/// its next ones.
#[test]
fn a_region_goes_on_when_its_members_drop_a_topic_and_restarts_when_a_topic_moves_out() {
    let mut p = Planner::new(PlannerConfig {
        max_regions_per_topic: 1,
        ..small_config()
    })
    .unwrap();
    let (a, b) = (NodeId(1), NodeId(2));
    for t in 1..=4 {
        p.subscribe(a, TopicId(t));
    }
    assert_eq!(p.region_count(), 1);
    let (_, shared) = p.node_regions(a).next().unwrap();
    // a drops topic 4: the region follows it with one topic fewer and goes on.
    let ch = p.unsubscribe(a, TopicId(4));
    p.check_invariants().unwrap();
    assert_eq!(p.region(shared).unwrap().topics.len(), 3);
    assert!(ch.regions_changed.contains(&shared), "{ch:?}");
    assert!(!ch.regions_restarted.contains(&shared), "{ch:?}");
    // b takes topic 3, which may span one region only: it moves to a subset of its own, out of
    // the region while a still subscribes to it, and the region restarts.
    let ch = p.subscribe(b, TopicId(3));
    p.check_invariants().unwrap();
    assert_ne!(p.subset_of(TopicId(3)), p.subset_of(TopicId(1)));
    assert_eq!(p.region(shared).unwrap().topics.len(), 2);
    assert!(ch.regions_restarted.contains(&shared), "{ch:?}");
}
