//! `Packet::parse` on hostile input: arbitrary bytes, mutated, truncated and extended valid
//! packets. It must never panic, and whatever it accepts must re-encode with the writers to exactly
//! the same bytes (the encoding is canonical), which `check_bytes` asserts for every input here.

mod common;

use common::model::{check_bytes, header_bytes, OwnedBody, OwnedMessage, OwnedPacket, OwnedRecord};
use common::strategies as st;
use proptest::collection::vec;
use proptest::prelude::*;
use tidings_wire::{
    DecodeError, Header, Kind, NodeId, Packet, RegionId, SeqRange, Silence, TopicId, ViewId,
    HEADER_LEN,
};

/// One edit of a packet's bytes; positions are taken modulo the current length.
#[derive(Clone, Debug)]
enum Edit {
    Set(usize, u8),
    FlipBit(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    /// Overwrites up to 8 bytes with 0x00 or 0xFF (count and length fields at their extremes).
    Extreme(usize, u8, bool),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Edit::FlipBit(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Remove),
        (any::<usize>(), 1u8..=8, any::<bool>()).prop_map(|(i, n, ff)| Edit::Extreme(i, n, ff)),
    ]
}

fn apply(bytes: &mut Vec<u8>, edit: &Edit) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    let len = bytes.len();
    match *edit {
        Edit::Set(i, b) if len > 0 => bytes[at(i, len)] = b,
        Edit::FlipBit(i, bit) if len > 0 => bytes[at(i, len)] ^= 1 << bit,
        Edit::Insert(i, b) => bytes.insert(at(i, len + 1), b),
        Edit::Remove(i) if len > 0 => {
            bytes.remove(at(i, len));
        }
        Edit::Extreme(i, n, ff) if len > 0 => {
            let start = at(i, len);
            let end = (start + usize::from(n)).min(len);
            bytes[start..end].fill(if ff { 0xFF } else { 0x00 });
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes(bytes in vec(any::<u8>(), 0..300)) {
        let _ = check_bytes(&bytes);
    }

    #[test]
    fn arbitrary_body_behind_a_valid_header(
        h in st::kind().prop_flat_map(st::header),
        body in vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = header_bytes(&h).to_vec();
        bytes.extend_from_slice(&body);
        let result = check_bytes(&bytes);
        if let Ok(p) = &result {
            prop_assert_eq!(p.header, h);
        } else {
            let e = result.unwrap_err();
            let body_error = matches!(
                e,
                DecodeError::Truncated(_) | DecodeError::Trailing(_) | DecodeError::Invalid(_)
            );
            prop_assert!(body_error, "a valid header was rejected: {:?}", e);
        }
    }

    #[test]
    fn mutated_valid_packets(p in st::packet(), edits in vec(edit(), 1..6)) {
        let mut bytes = p.encode_to_vec();
        for e in &edits {
            apply(&mut bytes, e);
        }
        let _ = check_bytes(&bytes);
    }

    #[test]
    fn valid_packets_with_any_kind_byte(p in st::packet()) {
        let mut bytes = p.encode_to_vec();
        for kind in 0..=u8::MAX {
            bytes[3] = kind;
            let result = check_bytes(&bytes);
            if Kind::from_u8(kind).is_none() {
                prop_assert_eq!(result, Err(DecodeError::UnknownKind(kind)));
            } else if kind == p.header.kind as u8 {
                prop_assert_eq!(result, Ok(p.clone()));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_strict_prefix_is_rejected(p in st::packet()) {
        let bytes = p.encode_to_vec();
        for cut in 0..bytes.len() {
            let result = check_bytes(&bytes[..cut]);
            if cut < HEADER_LEN {
                prop_assert_eq!(result, Err(DecodeError::TooShort), "cut at {}", cut);
            } else {
                prop_assert!(
                    matches!(result, Err(DecodeError::Truncated(_))),
                    "cut at {} of {}: {:?}", cut, bytes.len(), result
                );
            }
        }
        prop_assert_eq!(check_bytes(&bytes), Ok(p));
    }

    #[test]
    fn appended_bytes_are_trailing(p in st::packet(), extra in vec(any::<u8>(), 1..64)) {
        let mut bytes = p.encode_to_vec();
        bytes.extend_from_slice(&extra);
        prop_assert_eq!(check_bytes(&bytes), Err(DecodeError::Trailing(extra.len())));
    }
}

fn header(kind: Kind) -> Header {
    Header {
        kind,
        incarnation: 5,
        region: RegionId(1),
        view: ViewId(2),
        sender: NodeId(3),
    }
}

fn msg(seq: u64, msg_id: u64) -> OwnedMessage {
    OwnedMessage {
        seq,
        msg_id,
        timestamp_us: 5,
        topic: TopicId(6),
        payload: b"x".to_vec(),
    }
}

fn record(agg: (u64, u64), prev: (u64, u64), lost: Vec<SeqRange>) -> OwnedRecord {
    OwnedRecord {
        origin: NodeId(8),
        stable_upto: 1,
        agg_contiguous: agg.0,
        agg_max: agg.1,
        prev_contiguous: prev.0,
        prev_max: prev.1,
        missing_all: vec![SeqRange { start: 3, len: 1 }],
        lost,
        prev_missing: vec![],
    }
}

fn range(start: u64, len: u32) -> SeqRange {
    SeqRange { start, len }
}

fn packet(body: OwnedBody) -> OwnedPacket {
    OwnedPacket {
        header: header(body.kind()),
        body,
    }
}

fn token(records: Vec<OwnedRecord>) -> OwnedBody {
    OwnedBody::Token {
        level: 0,
        ring: 0,
        round: 1,
        records,
    }
}

/// The writers do not validate field values; the parser must reject what no correct peer sends
/// and accept the values just inside each bound.
#[test]
fn field_values_at_their_bounds() {
    let invalid = |s: &'static str| Err(DecodeError::Invalid(s));
    let zero = "zero sequence number or message id";
    let empty = "empty range or sequence number 0";
    let cases: Vec<(OwnedBody, Result<(), DecodeError>)> = vec![
        (OwnedBody::Data(vec![msg(1, 1)]), Ok(())),
        (OwnedBody::Data(vec![msg(1, 1), msg(0, 1)]), invalid(zero)),
        (OwnedBody::Data(vec![msg(1, 0)]), invalid(zero)),
        (
            OwnedBody::Retransmit {
                origin: NodeId(1),
                messages: vec![msg(0, 0)],
            },
            invalid(zero),
        ),
        (
            OwnedBody::Silence(Silence {
                last_seq: 4,
                timestamp_us: 0,
                acked_upto: 4,
            }),
            Ok(()),
        ),
        (
            OwnedBody::Silence(Silence {
                last_seq: 4,
                timestamp_us: 0,
                acked_upto: 5,
            }),
            invalid("silence acked beyond last"),
        ),
        (
            OwnedBody::Nak {
                origin: NodeId(1),
                ranges: vec![range(u64::MAX - 1, 1), range(1, u32::MAX)],
            },
            Ok(()),
        ),
        (
            OwnedBody::Nak {
                origin: NodeId(1),
                ranges: vec![range(u64::MAX, 1)],
            },
            invalid("range overflows"),
        ),
        (
            OwnedBody::Pull {
                origin: NodeId(1),
                ranges: vec![range(u64::MAX - u64::from(u32::MAX) + 1, u32::MAX)],
            },
            invalid("range overflows"),
        ),
        (
            OwnedBody::Pull {
                origin: NodeId(1),
                ranges: vec![range(5, 1), range(0, 1)],
            },
            invalid(empty),
        ),
        (
            OwnedBody::Pull {
                origin: NodeId(1),
                ranges: vec![range(5, 0)],
            },
            invalid(empty),
        ),
        (token(vec![record((5, 5), (6, 6), vec![])]), Ok(())),
        (
            token(vec![record((6, 5), (6, 6), vec![])]),
            invalid("token record contiguous beyond max"),
        ),
        (
            token(vec![record((5, 5), (7, 6), vec![])]),
            invalid("token record contiguous beyond max"),
        ),
        (
            token(vec![
                record((1, 2), (1, 2), vec![range(9, 9)]),
                record((1, 2), (1, 2), vec![range(9, 0)]),
            ]),
            invalid(empty),
        ),
    ];
    for (body, expected) in cases {
        let p = packet(body);
        let bytes = p.encode_to_vec();
        let got = check_bytes(&bytes);
        match expected {
            Ok(()) => assert_eq!(got, Ok(p)),
            Err(e) => assert_eq!(got, Err(e), "{p:?}"),
        }
    }
}

#[test]
fn header_errors() {
    let good = packet(OwnedBody::Ack {
        origin: NodeId(1),
        stable_upto: 2,
    })
    .encode_to_vec();
    assert!(Packet::parse(&good).is_ok());
    let with = |i: usize, b: u8| {
        let mut v = good.clone();
        v[i] = b;
        check_bytes(&v)
    };
    assert_eq!(with(0, b'X'), Err(DecodeError::BadMagic));
    assert_eq!(with(1, b'X'), Err(DecodeError::BadMagic));
    assert_eq!(with(2, 0), Err(DecodeError::BadVersion(0)));
    assert_eq!(with(2, 1), Err(DecodeError::BadVersion(1)));
    assert_eq!(with(2, 3), Err(DecodeError::BadVersion(3)));
    assert_eq!(with(3, 0), Err(DecodeError::UnknownKind(0)));
    assert_eq!(with(3, 11), Err(DecodeError::UnknownKind(11)));
    assert_eq!(
        check_bytes(&good[..HEADER_LEN - 1]),
        Err(DecodeError::TooShort)
    );
    assert_eq!(check_bytes(&[]), Err(DecodeError::TooShort));
    // Any incarnation parses (a node compares it with its own), and is read without parsing.
    assert_eq!(tidings_wire::peek_incarnation(&good), Some(5));
    let mut other = good.clone();
    tidings_wire::stamp_incarnation(&mut other, 0xFEED_F00D);
    assert_eq!(tidings_wire::peek_incarnation(&other), Some(0xFEED_F00D));
    assert_eq!(
        Packet::parse(&other).map(|p| p.header.incarnation),
        Ok(0xFEED_F00D)
    );
    assert_eq!(other[8..], good[8..]);
    assert_eq!(
        tidings_wire::peek_incarnation(&good[..HEADER_LEN - 1]),
        None
    );
    // The region is read without parsing too (a sealed node picks its key by it).
    assert_eq!(
        tidings_wire::peek_region(&good),
        Packet::parse(&good).ok().map(|p| p.header.region)
    );
    assert_eq!(tidings_wire::peek_region(&good[..HEADER_LEN - 1]), None);
    assert_eq!(tidings_wire::peek_region(&[]), None);
    let mut short = good[..HEADER_LEN - 1].to_vec();
    tidings_wire::stamp_incarnation(&mut short, 1);
    assert_eq!(short, good[..HEADER_LEN - 1]);
    // A bad magic in a short buffer is still "too short": length is checked first.
    assert_eq!(check_bytes(&[0xFF; 4]), Err(DecodeError::TooShort));
}
