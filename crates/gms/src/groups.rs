//! Which multicast groups of the pool carry which regions (ADR 27).

use std::collections::BTreeSet;

/// How many regions each group of the multicast pool carries. A new region takes a group no
/// region uses (the lowest such index) while fewer than `groups` are in use; after that, the
/// group carrying the fewest regions (ties: the lowest index), so regions spread evenly over the
/// groups they share and a freed group is used again first.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct GroupLoads {
    /// Regions per group handed out so far (index: the group's index in the pool).
    load: Vec<u32>,
    /// `(load, index)` of every group handed out, least loaded first.
    by_load: BTreeSet<(u32, u32)>,
}

impl GroupLoads {
    /// The group of a new region, out of the pool's first `groups` (at least one).
    pub(crate) fn take(&mut self, groups: u32) -> u32 {
        let fresh = u32::try_from(self.load.len()).unwrap_or(u32::MAX);
        let index = match self.by_load.first() {
            // A group whose regions are all gone.
            Some(&(0, i)) => i,
            Some(&(_, i)) if fresh >= groups.max(1) => i,
            _ => {
                self.load.push(0);
                self.by_load.insert((0, fresh));
                fresh
            }
        };
        self.adjust(index, |l| l.saturating_add(1));
        index
    }

    /// A region of group `index` is gone.
    pub(crate) fn release(&mut self, index: u32) {
        self.adjust(index, |l| l.saturating_sub(1));
    }

    /// Regions on group `index`.
    pub(crate) fn load(&self, index: u32) -> u32 {
        self.load.get(index as usize).copied().unwrap_or(0)
    }

    fn adjust(&mut self, index: u32, f: impl FnOnce(u32) -> u32) {
        let Some(load) = self.load.get_mut(index as usize) else {
            return;
        };
        self.by_load.remove(&(*load, index));
        *load = f(*load);
        self.by_load.insert((*load, index));
    }
}

#[cfg(test)]
mod tests {
    use super::GroupLoads;

    #[test]
    fn regions_take_fresh_groups_then_share_the_least_loaded() {
        let mut g = GroupLoads::default();
        assert_eq!((0..3).map(|_| g.take(3)).collect::<Vec<_>>(), [0, 1, 2]);
        // All three in use: shared round the groups, lowest index first among equals.
        assert_eq!((0..4).map(|_| g.take(3)).collect::<Vec<_>>(), [0, 1, 2, 0]);
        assert_eq!((g.load(0), g.load(1), g.load(2)), (3, 2, 2));
        // Group 1 loses both its regions: it is the emptiest, so the next region takes it.
        g.release(1);
        g.release(1);
        assert_eq!(g.take(3), 1);
        assert_eq!(g.take(3), 1);
        // Loads 3, 2, 2: the lower of the two least loaded, then the other.
        assert_eq!(g.take(3), 1);
        assert_eq!(g.take(3), 2);
    }

    #[test]
    fn a_freed_group_is_used_again_before_a_fresh_one() {
        let mut g = GroupLoads::default();
        assert_eq!((0..3).map(|_| g.take(100)).collect::<Vec<_>>(), [0, 1, 2]);
        g.release(1);
        assert_eq!(g.take(100), 1);
        assert_eq!(g.take(100), 3);
        // Releasing a group never handed out, or one already empty, changes nothing.
        g.release(50);
        g.release(1);
        g.release(1);
        assert_eq!(g.load(1), 0);
        assert_eq!(g.take(100), 1);
    }

    #[test]
    fn zero_groups_still_gives_one() {
        let mut g = GroupLoads::default();
        assert_eq!(g.take(0), 0);
        assert_eq!(g.take(0), 0);
        assert_eq!(g.load(0), 2);
    }
}
