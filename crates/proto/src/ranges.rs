//! Sorted, disjoint, non-adjacent lists of sequence-number ranges, as carried in token records,
//! NAKs and pull requests. Every operation takes a cap and keeps the lowest ranges when it must
//! drop some, so a truncated list still only claims what is true (a subset of the exact answer).

use tidings_wire::SeqRange;

/// Appends `[start, end)` to a sorted list whose last range ends at or before `start`, merging
/// with the last range when adjacent. Returns false (and appends nothing) if the list is full.
pub(crate) fn push_range(out: &mut Vec<SeqRange>, start: u64, end: u64, cap: usize) -> bool {
    if start >= end {
        return true;
    }
    if let Some(last) = out.last_mut() {
        debug_assert!(last.end() <= start, "ranges must be pushed in order");
        if last.end() == start {
            let len = end - last.start;
            if let Ok(len) = u32::try_from(len) {
                last.len = len;
                return true;
            }
        }
    }
    if out.len() >= cap {
        return false;
    }
    let mut at = start;
    while at < end {
        if out.len() >= cap {
            return false;
        }
        let len = u32::try_from(end - at).unwrap_or(u32::MAX);
        out.push(SeqRange { start: at, len });
        at += u64::from(len);
    }
    true
}

/// The intersection of two sorted lists, at most `cap` ranges.
pub(crate) fn intersect(a: &[SeqRange], b: &[SeqRange], cap: usize, out: &mut Vec<SeqRange>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end().min(b[j].end());
        if start < end && !push_range(out, start, end, cap) {
            return;
        }
        if a[i].end() < b[j].end() {
            i += 1;
        } else {
            j += 1;
        }
    }
}

/// The union of two sorted lists, at most `cap` ranges (the lowest ones).
pub(crate) fn union(a: &[SeqRange], b: &[SeqRange], cap: usize, out: &mut Vec<SeqRange>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    let mut current: Option<(u64, u64)> = None;
    loop {
        let next = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.start <= y.start => {
                i += 1;
                *x
            }
            (Some(_), Some(y)) => {
                j += 1;
                *y
            }
            (Some(x), None) => {
                i += 1;
                *x
            }
            (None, Some(y)) => {
                j += 1;
                *y
            }
            (None, None) => break,
        };
        match current {
            Some((s, e)) if next.start <= e => current = Some((s, e.max(next.end()))),
            Some((s, e)) => {
                if !push_range(out, s, e, cap) {
                    return;
                }
                current = Some((next.start, next.end()));
            }
            None => current = Some((next.start, next.end())),
        }
    }
    if let Some((s, e)) = current {
        push_range(out, s, e, cap);
    }
}

/// Whether `seq` is in the sorted list.
pub(crate) fn contains(list: &[SeqRange], seq: u64) -> bool {
    let idx = list.partition_point(|r| r.end() <= seq);
    list.get(idx).is_some_and(|r| r.contains(seq))
}

/// Keeps only the sequence numbers of `list` whose caching partition is `partition` (block-wise
/// round-robin over `partitions`), as single ranges per block, at most `cap` ranges.
pub(crate) fn filter_partition(
    list: &[SeqRange],
    partition: usize,
    partitions: usize,
    block: u64,
    cap: usize,
    out: &mut Vec<SeqRange>,
) {
    out.clear();
    let partitions = partitions.max(1) as u64;
    let block = block.max(1);
    let cycle = partitions * block;
    for r in list {
        // Walk the blocks that intersect the range; each block belongs to one partition.
        let mut at = r.start;
        while at < r.end() {
            let block_index = (at - 1) / block;
            let block_end = (block_index + 1) * block + 1;
            let end = block_end.min(r.end());
            if block_index % partitions == partition as u64 {
                if !push_range(out, at, end, cap) {
                    return;
                }
                at = end;
            } else {
                // Jump to the next block of `partition`.
                let wanted = partition as u64;
                let current = block_index % partitions;
                let skip = (wanted + partitions - current) % partitions;
                at = (block_index + skip) * block + 1;
                if skip == 0 {
                    at += cycle;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn to_set(list: &[SeqRange]) -> BTreeSet<u64> {
        list.iter().flat_map(|r| r.start..r.end()).collect()
    }

    fn from_set(set: &BTreeSet<u64>) -> Vec<SeqRange> {
        let mut out = Vec::new();
        for &s in set {
            assert!(push_range(&mut out, s, s + 1, usize::MAX));
        }
        out
    }

    fn is_canonical(list: &[SeqRange]) -> bool {
        list.windows(2).all(|w| w[0].end() < w[1].start) && list.iter().all(|r| r.len > 0)
    }

    proptest! {
        #[test]
        fn set_operations_match_sets(
            a in proptest::collection::btree_set(1u64..200, 0..60),
            b in proptest::collection::btree_set(1u64..200, 0..60),
            cap in 1usize..20,
        ) {
            let (la, lb) = (from_set(&a), from_set(&b));
            prop_assert!(is_canonical(&la));
            let mut out = Vec::new();
            intersect(&la, &lb, usize::MAX, &mut out);
            prop_assert!(is_canonical(&out));
            prop_assert_eq!(to_set(&out), a.intersection(&b).copied().collect::<BTreeSet<_>>());
            union(&la, &lb, usize::MAX, &mut out);
            prop_assert!(is_canonical(&out));
            prop_assert_eq!(to_set(&out), a.union(&b).copied().collect::<BTreeSet<_>>());
            // Capped results claim only true members.
            intersect(&la, &lb, cap, &mut out);
            prop_assert!(out.len() <= cap);
            prop_assert!(to_set(&out).is_subset(&a.intersection(&b).copied().collect()));
            union(&la, &lb, cap, &mut out);
            prop_assert!(out.len() <= cap);
            prop_assert!(to_set(&out).is_subset(&a.union(&b).copied().collect()));
            for s in 0..210 {
                prop_assert_eq!(contains(&la, s), a.contains(&s));
            }
        }

        #[test]
        fn filter_keeps_exactly_the_partition(
            a in proptest::collection::btree_set(1u64..300, 0..80),
            partitions in 1usize..7,
            block in 1u64..5,
        ) {
            let la = from_set(&a);
            for p in 0..partitions {
                let mut out = Vec::new();
                filter_partition(&la, p, partitions, block, usize::MAX, &mut out);
                let want: BTreeSet<u64> = a
                    .iter()
                    .copied()
                    .filter(|s| ((s - 1) / block) % partitions as u64 == p as u64)
                    .collect();
                prop_assert_eq!(to_set(&out), want);
            }
        }
    }
}
