//! Token records in memory: the lists a token carries per sender, reused from token to token
//! (their storage is pooled in the outbox), and their wire form.

use tidings_wire::{NodeId, RecordView, SeqRange};

use crate::outbox::Outbox;

/// A token record in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnedRecord {
    pub(crate) origin: NodeId,
    pub(crate) stable_upto: u64,
    pub(crate) agg_contiguous: u64,
    pub(crate) agg_max: u64,
    pub(crate) prev_contiguous: u64,
    pub(crate) prev_max: u64,
    pub(crate) missing_all: Vec<SeqRange>,
    pub(crate) lost: Vec<SeqRange>,
    pub(crate) prev_missing: Vec<SeqRange>,
}

impl OwnedRecord {
    /// A record whose (empty) lists come from `out`'s pool, so filling them reuses storage.
    fn with_pooled_lists(out: &mut Outbox) -> Self {
        OwnedRecord {
            missing_all: out.take_range_list(),
            lost: out.take_range_list(),
            prev_missing: out.take_range_list(),
            ..Default::default()
        }
    }

    /// Overwrites this record with `v`, keeping the lists' storage.
    fn assign_view(&mut self, v: &RecordView<'_>) {
        self.origin = v.origin;
        self.stable_upto = v.stable_upto;
        self.agg_contiguous = v.agg_contiguous;
        self.agg_max = v.agg_max;
        self.prev_contiguous = v.prev_contiguous;
        self.prev_max = v.prev_max;
        self.missing_all.clear();
        self.missing_all.extend(v.missing_all.iter());
        self.lost.clear();
        self.lost.extend(v.lost.iter());
        self.prev_missing.clear();
        self.prev_missing.extend(v.prev_missing.iter());
    }

    pub(crate) fn as_wire(&self) -> tidings_wire::Record<'_> {
        tidings_wire::Record {
            origin: self.origin,
            stable_upto: self.stable_upto,
            agg_contiguous: self.agg_contiguous,
            agg_max: self.agg_max,
            prev_contiguous: self.prev_contiguous,
            prev_max: self.prev_max,
            missing_all: &self.missing_all,
            lost: &self.lost,
            prev_missing: &self.prev_missing,
        }
    }
}

/// The `n`-th record of `records`, appended if `records` is shorter (every field is to be
/// overwritten: records are reused from token to token, lists and all).
pub(super) fn record_slot<'a>(
    records: &'a mut Vec<OwnedRecord>,
    n: usize,
    out: &mut Outbox,
) -> &'a mut OwnedRecord {
    while records.len() <= n {
        records.push(OwnedRecord::with_pooled_lists(out));
    }
    &mut records[n]
}

/// Shortens `records` to `len`, handing the lists of the records cut off back to `out`'s pool.
pub(super) fn truncate_records(records: &mut Vec<OwnedRecord>, len: usize, out: &mut Outbox) {
    while records.len() > len {
        if let Some(r) = records.pop() {
            out.recycle_range_list(r.missing_all);
            out.recycle_range_list(r.lost);
            out.recycle_range_list(r.prev_missing);
        }
    }
}

/// Overwrites `records` with the records of a token that arrived, reusing their storage.
pub(crate) fn assign_records<'v>(
    records: &mut Vec<OwnedRecord>,
    views: impl Iterator<Item = RecordView<'v>>,
    out: &mut Outbox,
) {
    let mut n = 0;
    for v in views {
        record_slot(records, n, out).assign_view(&v);
        n += 1;
    }
    truncate_records(records, n, out);
}

/// A token in memory: which ring, which round, the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedToken {
    pub(crate) level: u8,
    pub(crate) ring: u16,
    pub(crate) round: u64,
    pub(crate) records: Vec<OwnedRecord>,
}
