//! Newtypes for the identities and counters carried on the wire.

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub struct $name(pub $inner);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_newtype!(
    /// A node (one process running the engine), numbered by the membership service.
    NodeId(u32)
);
id_newtype!(
    /// A topic (group), numbered by the membership service.
    TopicId(u32)
);
id_newtype!(
    /// A region: the nodes whose subscription sets are identical.
    RegionId(u32)
);
id_newtype!(
    /// The epoch of a region view.
    ViewId(u32)
);
id_newtype!(
    /// A sequence number in one stream (one sender into one region view). Starts at 1; 0 means
    /// "nothing".
    SeqNo(u64)
);
id_newtype!(
    /// A per-sender message id, the same in every region the message is sent to. Starts at 1.
    MsgId(u64)
);

impl SeqNo {
    /// The sequence number after this one.
    #[must_use]
    pub fn next(self) -> SeqNo {
        SeqNo(self.0 + 1)
    }
}

/// An inclusive-exclusive range of sequence numbers `[start, start + len)` as carried in NAKs,
/// pull requests and token records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqRange {
    /// First sequence number in the range.
    pub start: u64,
    /// Number of sequence numbers in the range (at least 1 on the wire).
    pub len: u32,
}

impl SeqRange {
    /// One past the last sequence number of the range.
    #[must_use]
    pub fn end(self) -> u64 {
        self.start + u64::from(self.len)
    }

    /// Whether `seq` lies in the range.
    #[must_use]
    pub fn contains(self, seq: u64) -> bool {
        seq >= self.start && seq < self.end()
    }
}
