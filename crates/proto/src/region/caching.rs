//! Cooperative caching (paper 000 section 2): the caching partition of `seq` is
//! `((seq - 1) / cache_block_msgs) mod partitions`; only its members keep `seq` after delivery,
//! until the region reports it stable. A receiver missing `seq` asks a random member of that
//! partition.

use tidings_wire::NodeId;

use super::RegionState;

/// Which partition caches which sequence number: blocks of `block` sequence numbers, round-robin
/// over the partitions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CachingRule {
    pub(super) my_partition: usize,
    pub(super) partitions: usize,
    pub(super) block: u64,
}

impl CachingRule {
    /// The partition caching `seq`.
    pub(crate) fn partition_of(&self, seq: u64) -> usize {
        ((seq.saturating_sub(1) / self.block) % self.partitions as u64) as usize
    }

    /// Whether this node's partition caches `seq`.
    pub(crate) fn caches(&self, seq: u64) -> bool {
        self.partition_of(seq) == self.my_partition
    }
}

impl RegionState {
    /// The partition that caches `seq`.
    pub(crate) fn caching_partition(&self, seq: u64) -> usize {
        self.caching_rule().partition_of(seq)
    }

    /// Whether this node caches `seq`.
    #[cfg(test)]
    pub(crate) fn caches(&self, seq: u64) -> bool {
        self.caching_rule().caches(seq)
    }

    pub(crate) fn caching_rule(&self) -> CachingRule {
        CachingRule {
            my_partition: self.my_partition,
            partitions: self.partitions.len().max(1),
            block: self.cache_block,
        }
    }

    /// A random member of the caching partition of `seq` other than this node.
    pub(crate) fn random_cacher(&self, seq: u64, rng: &mut fastrand::Rng) -> Option<NodeId> {
        let members = &self.partitions[self.caching_partition(seq)];
        let others = members.len() - usize::from(members.contains(&self.me));
        if others == 0 {
            return None;
        }
        let pick = rng.usize(..others);
        members.iter().copied().filter(|&m| m != self.me).nth(pick)
    }
}
