//! Proptest strategies for valid owned packets: every value generated here is one the parser
//! must accept (sequence numbers and message ids non-zero, ranges non-empty and not overflowing,
//! `acked_upto <= last_seq`, contiguous never beyond max).

use proptest::collection::vec;
use proptest::prelude::*;
use tidings_wire::{Header, Kind, NodeId, RegionId, SeqRange, Silence, TopicId, ViewId};

use super::model::{OwnedBody, OwnedMessage, OwnedPacket, OwnedRecord};

/// Any u64, with the boundaries drawn often.
pub(crate) fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        1 => 0u64..=300,
        1 => Just(u64::MAX),
        1 => (u64::MAX - 300)..=u64::MAX,
    ]
}

/// A non-zero u64 (sequence numbers, message ids), with the boundaries drawn often.
pub(crate) fn nonzero_u64() -> impl Strategy<Value = u64> {
    edgy_u64().prop_map(|v| v.max(1))
}

/// Two values `(low, high)` with `low <= high`.
pub(crate) fn ordered_pair() -> impl Strategy<Value = (u64, u64)> {
    (edgy_u64(), edgy_u64()).prop_map(|(a, b)| (a.min(b), a.max(b)))
}

pub(crate) fn header(kind: Kind) -> impl Strategy<Value = Header> {
    (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
        move |(incarnation, region, view, sender)| Header {
            kind,
            incarnation,
            region: RegionId(region),
            view: ViewId(view),
            sender: NodeId(sender),
        },
    )
}

pub(crate) fn payload(max_len: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max_len)
}

pub(crate) fn message(max_payload: usize) -> impl Strategy<Value = OwnedMessage> {
    (
        nonzero_u64(),
        nonzero_u64(),
        edgy_u64(),
        any::<u32>(),
        payload(max_payload),
    )
        .prop_map(|(seq, msg_id, timestamp_us, topic, payload)| OwnedMessage {
            seq,
            msg_id,
            timestamp_us,
            topic: TopicId(topic),
            payload,
        })
}

pub(crate) fn messages(
    max_count: usize,
    max_payload: usize,
) -> impl Strategy<Value = Vec<OwnedMessage>> {
    vec(message(max_payload), 0..=max_count)
}

/// A range the parser accepts: `start >= 1`, `len >= 1`, `start + len` does not overflow.
pub(crate) fn range() -> impl Strategy<Value = SeqRange> {
    let len = prop_oneof![
        2 => 1u32..=64,
        1 => Just(u32::MAX),
        1 => 1u32..=u32::MAX,
    ];
    (len, edgy_u64()).prop_map(|(len, start)| SeqRange {
        start: start.clamp(1, u64::MAX - u64::from(len)),
        len,
    })
}

pub(crate) fn ranges(max_count: usize) -> impl Strategy<Value = Vec<SeqRange>> {
    vec(range(), 0..=max_count)
}

pub(crate) fn record(max_ranges: usize) -> impl Strategy<Value = OwnedRecord> {
    (
        any::<u32>(),
        edgy_u64(),
        ordered_pair(),
        ordered_pair(),
        ranges(max_ranges),
        ranges(max_ranges),
        ranges(max_ranges),
    )
        .prop_map(
            |(origin, stable_upto, agg, prev, missing_all, lost, prev_missing)| OwnedRecord {
                origin: NodeId(origin),
                stable_upto,
                agg_contiguous: agg.0,
                agg_max: agg.1,
                prev_contiguous: prev.0,
                prev_max: prev.1,
                missing_all,
                lost,
                prev_missing,
            },
        )
}

pub(crate) fn silence() -> impl Strategy<Value = Silence> {
    (ordered_pair(), edgy_u64()).prop_map(|((acked_upto, last_seq), timestamp_us)| Silence {
        last_seq,
        timestamp_us,
        acked_upto,
    })
}

/// A valid body of `kind`, sized for quick tests.
pub(crate) fn body(kind: Kind) -> BoxedStrategy<OwnedBody> {
    let origin = any::<u32>().prop_map(NodeId);
    match kind {
        Kind::Data => messages(8, 80).prop_map(OwnedBody::Data).boxed(),
        Kind::Retransmit => (origin, messages(8, 80))
            .prop_map(|(origin, messages)| OwnedBody::Retransmit { origin, messages })
            .boxed(),
        Kind::Silence => silence().prop_map(OwnedBody::Silence).boxed(),
        Kind::Token => (any::<u8>(), any::<u16>(), edgy_u64(), vec(record(4), 0..=5))
            .prop_map(|(level, ring, round, records)| OwnedBody::Token {
                level,
                ring,
                round,
                records,
            })
            .boxed(),
        Kind::Ack => (origin, edgy_u64())
            .prop_map(|(origin, stable_upto)| OwnedBody::Ack {
                origin,
                stable_upto,
            })
            .boxed(),
        Kind::Nak => (origin, ranges(20))
            .prop_map(|(origin, ranges)| OwnedBody::Nak { origin, ranges })
            .boxed(),
        Kind::Pull => (origin, ranges(20))
            .prop_map(|(origin, ranges)| OwnedBody::Pull { origin, ranges })
            .boxed(),
        Kind::TokenAck => (any::<u8>(), any::<u16>(), edgy_u64())
            .prop_map(|(level, ring, round)| OwnedBody::TokenAck { level, ring, round })
            .boxed(),
        Kind::Dcq => (edgy_u64(), edgy_u64())
            .prop_map(|(seq, position_us)| OwnedBody::Dcq { seq, position_us })
            .boxed(),
        Kind::Uca => (origin, edgy_u64(), any::<u32>(), any::<u32>())
            .prop_map(|(origin, seq, nonrec, rec)| OwnedBody::Uca {
                origin,
                seq,
                nonrec,
                rec,
            })
            .boxed(),
    }
}

pub(crate) const ALL_KINDS: [Kind; 10] = [
    Kind::Data,
    Kind::Retransmit,
    Kind::Silence,
    Kind::Token,
    Kind::Ack,
    Kind::Nak,
    Kind::Pull,
    Kind::TokenAck,
    Kind::Dcq,
    Kind::Uca,
];

pub(crate) fn kind() -> impl Strategy<Value = Kind> {
    proptest::sample::select(ALL_KINDS.to_vec())
}

/// A valid packet of `kind`.
pub(crate) fn packet_of(kind: Kind) -> impl Strategy<Value = OwnedPacket> {
    (header(kind), body(kind)).prop_map(|(header, body)| OwnedPacket { header, body })
}

/// A valid packet of any kind.
pub(crate) fn packet() -> impl Strategy<Value = OwnedPacket> {
    kind().prop_flat_map(packet_of)
}
