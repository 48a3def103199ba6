//! A set of topics tested once per message delivered: a bit per topic id below
//! [`DENSE_IDS`], a sorted set above.

use std::collections::BTreeSet;

use tidings_wire::TopicId;

/// Topic ids below this have a bit each (8 KiB at most); the service numbers topics from 1 up, so
/// ids past it are rare.
const DENSE_IDS: u32 = 1 << 16;

/// The topics a node delivers ([`Membership::subscriptions`](crate::membership::Membership)),
/// kept beside that set for a test per message that costs a load and a mask, where the set's
/// look-up walks a tree of as many keys as the node has subscriptions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TopicBits {
    /// Bit `id % 64` of word `id / 64` for the ids below [`DENSE_IDS`]; grown to the largest.
    dense: Vec<u64>,
    /// The ids from [`DENSE_IDS`] up.
    sparse: BTreeSet<TopicId>,
}

impl TopicBits {
    /// The bits of `topics`.
    pub(crate) fn from_set(topics: &BTreeSet<TopicId>) -> TopicBits {
        let mut bits = TopicBits::default();
        for &t in topics {
            bits.set(t, true);
        }
        bits
    }

    /// Puts `topic` in (`on`) or takes it out.
    pub(crate) fn set(&mut self, topic: TopicId, on: bool) {
        if topic.0 >= DENSE_IDS {
            if on {
                self.sparse.insert(topic);
            } else {
                self.sparse.remove(&topic);
            }
            return;
        }
        let (word, bit) = ((topic.0 / 64) as usize, topic.0 % 64);
        if word >= self.dense.len() {
            if !on {
                return;
            }
            self.dense.resize(word + 1, 0);
        }
        if on {
            self.dense[word] |= 1 << bit;
        } else {
            self.dense[word] &= !(1 << bit);
        }
    }

    /// Whether `topic` is in.
    pub(crate) fn contains(&self, topic: TopicId) -> bool {
        if topic.0 >= DENSE_IDS {
            return self.sparse.contains(&topic);
        }
        self.dense
            .get((topic.0 / 64) as usize)
            .is_some_and(|w| w & (1 << (topic.0 % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_set_it_follows() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut set = BTreeSet::new();
        let mut bits = TopicBits::default();
        for _ in 0..20_000 {
            let t = TopicId(match rng.u8(..4) {
                0 => rng.u32(DENSE_IDS - 64..DENSE_IDS + 64),
                1 => rng.u32(..),
                _ => rng.u32(..200),
            });
            let on = rng.bool();
            if on {
                set.insert(t);
            } else {
                set.remove(&t);
            }
            bits.set(t, on);
        }
        assert!(TopicBits::from_set(&set).dense.len() <= bits.dense.len());
        for t in (0..300)
            .chain(DENSE_IDS - 70..DENSE_IDS + 70)
            .map(TopicId)
            .chain(set.iter().copied())
        {
            assert_eq!(bits.contains(t), set.contains(&t), "{t:?}");
            assert_eq!(
                TopicBits::from_set(&set).contains(t),
                set.contains(&t),
                "{t:?}"
            );
        }
        assert!(!TopicBits::default().contains(TopicId(0)));
        assert!(!TopicBits::default().contains(TopicId(u32::MAX)));
    }
}
