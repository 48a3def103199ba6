//! Round trips through the writers and `Packet::parse` for every packet kind, the writers'
//! behaviour on buffers that are too small, and their count limits.

mod common;

use common::model::{
    check_bytes, header_bytes, OwnedBody, OwnedMessage, OwnedPacket, OwnedRecord, ACK_LEN,
    DATA_FIXED_LEN, RANGES_FIXED_LEN, RETRANSMIT_FIXED_LEN, SILENCE_LEN, TOKEN_FIXED_LEN,
};
use common::strategies::{self as st, ALL_KINDS};
use proptest::prelude::*;
use tidings_wire::{
    peek_kind, write_ack, write_ranges, write_silence, Body, BufferFull, Header, Kind, Message,
    MessagesWriter, NodeId, Packet, Priority, Record, RegionId, SeqRange, TokenWriter, TopicId,
    ViewId, HEADER_LEN, MESSAGE_HEADER_LEN, RANGE_LEN, RECORD_FIXED_LEN,
};

/// Filler for output buffers: any byte a writer touches beyond what it reports shows up.
const FILL: u8 = 0xA5;

/// A header of any kind: the writers must overwrite the kind with their own.
fn any_header() -> impl Strategy<Value = Header> {
    st::kind().prop_flat_map(st::header)
}

fn with_kind(h: Header, kind: Kind) -> Header {
    Header { kind, ..h }
}

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

/// Checks what every successful write must satisfy: the reported length is the layout length,
/// nothing past it was touched, the header bytes follow the layout, `peek_kind` sees the kind,
/// and the parsed packet equals `want` field by field.
fn check_written(buf: &[u8], len: usize, want: &OwnedPacket) -> Result<(), TestCaseError> {
    prop_assert_eq!(len, want.wire_len(), "reported length");
    prop_assert!(
        buf[len..].iter().all(|&b| b == FILL),
        "wrote past the reported length"
    );
    let bytes = &buf[..len];
    prop_assert_eq!(&bytes[..HEADER_LEN], &header_bytes(&want.header)[..]);
    prop_assert_eq!(peek_kind(bytes), Some(want.header.kind));
    prop_assert_eq!(check_bytes(bytes), Ok(want.clone()));
    Ok(())
}

fn collect_messages<'a>(view: impl Iterator<Item = Message<'a>>) -> Vec<Message<'a>> {
    view.collect()
}

fn as_messages(msgs: &[OwnedMessage]) -> Vec<Message<'_>> {
    msgs.iter().map(OwnedMessage::as_message).collect()
}

#[test]
fn layout_constants_match_the_documented_fields() {
    // magic u16, version u8, kind u8, incarnation u32, region u32, view u32, sender u32
    assert_eq!(HEADER_LEN, 2 + 1 + 1 + 4 + 4 + 4 + 4);
    // seq u64, msg_id u64, timestamp_us u64, topic u32, len u16
    assert_eq!(MESSAGE_HEADER_LEN, 8 + 8 + 8 + 4 + 2);
    // start u64, len u32
    assert_eq!(RANGE_LEN, 8 + 4);
    // origin u32, five u64, three u8 counts
    assert_eq!(RECORD_FIXED_LEN, 4 + 5 * 8 + 3);
}

#[test]
fn kind_bytes_and_priorities() {
    let expected = [
        (1, Kind::Data, Priority::Data),
        (2, Kind::Retransmit, Priority::Recovery),
        (3, Kind::Silence, Priority::Data),
        (4, Kind::Token, Priority::Control),
        (5, Kind::Ack, Priority::Control),
        (6, Kind::Nak, Priority::Control),
        (7, Kind::Pull, Priority::Recovery),
        (8, Kind::TokenAck, Priority::Control),
        (9, Kind::Dcq, Priority::Control),
        (10, Kind::Uca, Priority::Control),
    ];
    for b in 0..=u8::MAX {
        let want = expected.iter().find(|e| e.0 == b);
        assert_eq!(Kind::from_u8(b), want.map(|e| e.1), "byte {b}");
    }
    for (b, kind, priority) in expected {
        assert_eq!(kind as u8, b);
        assert_eq!(kind.priority(), priority, "{kind:?}");
    }
    assert!(Priority::Control < Priority::Recovery && Priority::Recovery < Priority::Data);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn data_round_trip(h in any_header(), msgs in st::messages(8, 80), slack in 0usize..16) {
        let want = OwnedPacket {
            header: with_kind(h, Kind::Data),
            body: OwnedBody::Data(msgs.clone()),
        };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let mut w = MessagesWriter::data(&mut buf, &h).unwrap();
        for m in &msgs {
            prop_assert!(w.fits(m.payload.len()));
            w.push(&m.as_message()).unwrap();
        }
        prop_assert_eq!(w.count(), msgs.len());
        let len = w.finish();
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let Body::Data(view) = p.body else {
            return Err(fail(format!("not data: {:?}", p.body)));
        };
        prop_assert_eq!(view.len(), msgs.len());
        prop_assert_eq!(view.is_empty(), msgs.is_empty());
        prop_assert_eq!(collect_messages(view.iter()), as_messages(&msgs));
    }

    #[test]
    fn retransmit_round_trip(
        h in any_header(),
        origin in any::<u32>(),
        msgs in st::messages(8, 80),
        slack in 0usize..16,
    ) {
        let origin = NodeId(origin);
        let want = OwnedPacket {
            header: with_kind(h, Kind::Retransmit),
            body: OwnedBody::Retransmit { origin, messages: msgs.clone() },
        };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let mut w = MessagesWriter::retransmit(&mut buf, &h, origin).unwrap();
        for m in &msgs {
            w.push(&m.as_message()).unwrap();
        }
        prop_assert_eq!(w.count(), msgs.len());
        let len = w.finish();
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let Body::Retransmit { origin: got_origin, messages } = p.body else {
            return Err(fail(format!("not a retransmission: {:?}", p.body)));
        };
        prop_assert_eq!(got_origin, origin);
        prop_assert_eq!(messages.len(), msgs.len());
        prop_assert_eq!(collect_messages(messages.iter()), as_messages(&msgs));
    }

    #[test]
    fn silence_round_trip(h in any_header(), s in st::silence(), slack in 0usize..16) {
        let want = OwnedPacket { header: with_kind(h, Kind::Silence), body: OwnedBody::Silence(s) };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let len = write_silence(&mut buf, &h, &s).unwrap();
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let Body::Silence(got) = p.body else {
            return Err(fail(format!("not silence: {:?}", p.body)));
        };
        prop_assert_eq!(got.last_seq, s.last_seq);
        prop_assert_eq!(got.timestamp_us, s.timestamp_us);
        prop_assert_eq!(got.acked_upto, s.acked_upto);
    }

    #[test]
    fn token_round_trip(
        h in any_header(),
        level in any::<u8>(),
        ring in any::<u16>(),
        round in st::edgy_u64(),
        records in proptest::collection::vec(st::record(4), 0..=5),
        slack in 0usize..16,
    ) {
        let want = OwnedPacket {
            header: with_kind(h, Kind::Token),
            body: OwnedBody::Token { level, ring, round, records: records.clone() },
        };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let mut w = TokenWriter::new(&mut buf, &h, level, ring, round).unwrap();
        for r in &records {
            let before = w.remaining();
            w.push(&r.as_record()).unwrap();
            prop_assert_eq!(before - w.remaining(), r.as_record().wire_len());
        }
        prop_assert_eq!(w.remaining(), slack);
        let len = w.finish();
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let Body::Token(t) = p.body else {
            return Err(fail(format!("not a token: {:?}", p.body)));
        };
        prop_assert_eq!((t.level, t.ring, t.round), (level, ring, round));
        prop_assert_eq!(t.len(), records.len());
        prop_assert_eq!(t.is_empty(), records.is_empty());
        let mut got = t.records();
        for r in &records {
            let g = got.next().ok_or_else(|| fail("too few records"))?;
            prop_assert_eq!(g.origin, r.origin);
            prop_assert_eq!(g.stable_upto, r.stable_upto);
            prop_assert_eq!(g.agg_contiguous, r.agg_contiguous);
            prop_assert_eq!(g.agg_max, r.agg_max);
            prop_assert_eq!(g.prev_contiguous, r.prev_contiguous);
            prop_assert_eq!(g.prev_max, r.prev_max);
            prop_assert_eq!(g.missing_all.iter().collect::<Vec<_>>(), r.missing_all.clone());
            prop_assert_eq!(g.lost.iter().collect::<Vec<_>>(), r.lost.clone());
            prop_assert_eq!(g.prev_missing.iter().collect::<Vec<_>>(), r.prev_missing.clone());
            prop_assert_eq!(g.missing_all.len(), r.missing_all.len());
            prop_assert_eq!(g.lost.len(), r.lost.len());
            prop_assert_eq!(g.prev_missing.len(), r.prev_missing.len());
        }
        prop_assert!(got.next().is_none(), "more records than written");
    }

    #[test]
    fn ack_round_trip(
        h in any_header(),
        origin in any::<u32>(),
        stable_upto in st::edgy_u64(),
        slack in 0usize..16,
    ) {
        let origin = NodeId(origin);
        let want = OwnedPacket {
            header: with_kind(h, Kind::Ack),
            body: OwnedBody::Ack { origin, stable_upto },
        };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let len = write_ack(&mut buf, &h, origin, stable_upto).unwrap();
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let Body::Ack { origin: got_origin, stable_upto: got_stable } = p.body else {
            return Err(fail(format!("not an ACK: {:?}", p.body)));
        };
        prop_assert_eq!(got_origin, origin);
        prop_assert_eq!(got_stable, stable_upto);
    }

    #[test]
    fn nak_and_pull_round_trip(
        h in any_header(),
        pull in any::<bool>(),
        origin in any::<u32>(),
        ranges in st::ranges(20),
        slack in 0usize..16,
    ) {
        let origin = NodeId(origin);
        let kind = if pull { Kind::Pull } else { Kind::Nak };
        let body = if pull {
            OwnedBody::Pull { origin, ranges: ranges.clone() }
        } else {
            OwnedBody::Nak { origin, ranges: ranges.clone() }
        };
        let want = OwnedPacket { header: with_kind(h, kind), body };
        let mut buf = vec![FILL; want.wire_len() + slack];
        let (len, fit) = write_ranges(&mut buf, &h, kind, origin, &ranges).unwrap();
        prop_assert_eq!(fit, ranges.len());
        check_written(&buf, len, &want)?;

        let p = Packet::parse(&buf[..len]).unwrap();
        prop_assert_eq!(p.header, want.header);
        let (got_origin, view) = match p.body {
            Body::Nak { origin, ranges } if !pull => (origin, ranges),
            Body::Pull { origin, ranges } if pull => (origin, ranges),
            other => return Err(fail(format!("wrong body for {kind:?}: {other:?}"))),
        };
        prop_assert_eq!(got_origin, origin);
        prop_assert_eq!(view.len(), ranges.len());
        prop_assert_eq!(view.is_empty(), ranges.is_empty());
        prop_assert_eq!(view.iter().collect::<Vec<_>>(), ranges);
    }

    #[test]
    fn any_packet_round_trips_and_peek_kind_agrees(p in st::packet()) {
        let bytes = p.encode_to_vec();
        prop_assert_eq!(peek_kind(&bytes), Some(p.header.kind));
        prop_assert_eq!(Packet::parse(&bytes).map(|q| q.header), Ok(p.header));
        prop_assert_eq!(check_bytes(&bytes), Ok(p));
    }

    #[test]
    fn messages_writer_never_writes_a_partial_message(
        h in any_header(),
        retransmit in any::<bool>(),
        msgs in st::messages(12, 120),
        cap in 0usize..1200,
    ) {
        let origin = NodeId(9);
        let fixed = HEADER_LEN + if retransmit { RETRANSMIT_FIXED_LEN } else { DATA_FIXED_LEN };
        let mut buf = vec![FILL; cap];
        let started = if retransmit {
            MessagesWriter::retransmit(&mut buf, &h, origin)
        } else {
            MessagesWriter::data(&mut buf, &h)
        };
        let mut w = match started {
            Ok(w) => w,
            Err(BufferFull) => {
                prop_assert!(cap < fixed, "refused to start in {cap} bytes");
                return Ok(());
            }
        };
        prop_assert!(cap >= fixed, "started a packet in {cap} bytes");
        // Push every message; a refused one must leave no trace, and later smaller ones may fit.
        let mut used = fixed;
        let mut accepted = Vec::new();
        for m in &msgs {
            let fits = used + m.wire_len() <= cap;
            prop_assert_eq!(w.fits(m.payload.len()), fits);
            match w.push(&m.as_message()) {
                Ok(()) => {
                    prop_assert!(fits, "accepted a message that does not fit");
                    used += m.wire_len();
                    accepted.push(m.clone());
                }
                Err(BufferFull) => prop_assert!(!fits, "refused a message that fits"),
            }
            prop_assert_eq!(w.count(), accepted.len());
        }
        let len = w.finish();
        let h = with_kind(h, if retransmit { Kind::Retransmit } else { Kind::Data });
        let body = if retransmit {
            OwnedBody::Retransmit { origin, messages: accepted }
        } else {
            OwnedBody::Data(accepted)
        };
        check_written(&buf, len, &OwnedPacket { header: h, body })?;
    }

    #[test]
    fn token_writer_never_writes_a_partial_record(
        h in any_header(),
        records in proptest::collection::vec(st::record(6), 0..=8),
        cap in 0usize..1200,
    ) {
        let fixed = HEADER_LEN + TOKEN_FIXED_LEN;
        let mut buf = vec![FILL; cap];
        let mut w = match TokenWriter::new(&mut buf, &h, 2, 3, 4) {
            Ok(w) => w,
            Err(BufferFull) => {
                prop_assert!(cap < fixed, "refused to start in {cap} bytes");
                return Ok(());
            }
        };
        prop_assert!(cap >= fixed, "started a token in {cap} bytes");
        let mut used = fixed;
        let mut accepted = Vec::new();
        for r in &records {
            prop_assert_eq!(w.remaining(), cap - used);
            let fits = used + r.wire_len() <= cap;
            match w.push(&r.as_record()) {
                Ok(()) => {
                    prop_assert!(fits, "accepted a record that does not fit");
                    used += r.wire_len();
                    accepted.push(r.clone());
                }
                Err(BufferFull) => prop_assert!(!fits, "refused a record that fits"),
            }
        }
        let len = w.finish();
        let want = OwnedPacket {
            header: with_kind(h, Kind::Token),
            body: OwnedBody::Token { level: 2, ring: 3, round: 4, records: accepted },
        };
        check_written(&buf, len, &want)?;
    }

    #[test]
    fn write_ranges_reports_how_many_fit(
        h in any_header(),
        pull in any::<bool>(),
        ranges in st::ranges(60),
        cap in 0usize..800,
    ) {
        let kind = if pull { Kind::Pull } else { Kind::Nak };
        let origin = NodeId(77);
        let fixed = HEADER_LEN + RANGES_FIXED_LEN;
        let mut buf = vec![FILL; cap];
        let (len, fit) = match write_ranges(&mut buf, &h, kind, origin, &ranges) {
            Ok(r) => r,
            Err(BufferFull) => {
                prop_assert!(cap < fixed, "refused to start in {cap} bytes");
                prop_assert!(buf.iter().all(|&b| b == FILL), "wrote before refusing");
                return Ok(());
            }
        };
        prop_assert!(cap >= fixed, "wrote a packet into {cap} bytes");
        prop_assert_eq!(fit, ranges.len().min((cap - fixed) / RANGE_LEN));
        let ranges = ranges[..fit].to_vec();
        let body = if pull {
            OwnedBody::Pull { origin, ranges }
        } else {
            OwnedBody::Nak { origin, ranges }
        };
        check_written(&buf, len, &OwnedPacket { header: with_kind(h, kind), body })?;
    }

    #[test]
    fn fixed_size_writers_need_exactly_their_length(
        h in any_header(),
        s in st::silence(),
        stable_upto in any::<u64>(),
        cap in 0usize..(HEADER_LEN + SILENCE_LEN + 8),
    ) {
        let mut buf = vec![FILL; cap];
        let silence = write_silence(&mut buf, &h, &s);
        if cap >= HEADER_LEN + SILENCE_LEN {
            let want = OwnedPacket {
                header: with_kind(h, Kind::Silence),
                body: OwnedBody::Silence(s),
            };
            check_written(&buf, silence.unwrap(), &want)?;
        } else {
            prop_assert_eq!(silence, Err(BufferFull));
        }

        let mut buf = vec![FILL; cap];
        let ack = write_ack(&mut buf, &h, NodeId(5), stable_upto);
        if cap >= HEADER_LEN + ACK_LEN {
            let want = OwnedPacket {
                header: with_kind(h, Kind::Ack),
                body: OwnedBody::Ack { origin: NodeId(5), stable_upto },
            };
            check_written(&buf, ack.unwrap(), &want)?;
        } else {
            prop_assert_eq!(ack, Err(BufferFull));
        }
    }
}

fn test_header() -> Header {
    Header {
        kind: Kind::Data,
        incarnation: 4,
        region: RegionId(1),
        view: ViewId(2),
        sender: NodeId(3),
    }
}

fn ranges_n(n: usize) -> Vec<SeqRange> {
    (0..n as u64)
        .map(|i| SeqRange {
            start: 1 + 10 * i,
            len: 3,
        })
        .collect()
}

fn parse_owned(bytes: &[u8]) -> OwnedPacket {
    check_bytes(bytes).expect("writer output must parse")
}

#[test]
fn token_range_lists_hold_at_most_255_ranges() {
    let full = ranges_n(255);
    let over = ranges_n(256);
    let rec = |missing_all: Vec<SeqRange>, lost: Vec<SeqRange>, prev_missing: Vec<SeqRange>| {
        OwnedRecord {
            origin: NodeId(4),
            stable_upto: 1,
            agg_contiguous: 2,
            agg_max: 3,
            prev_contiguous: 4,
            prev_max: 5,
            missing_all,
            lost,
            prev_missing,
        }
    };
    let ok = rec(full.clone(), full.clone(), full.clone());
    let too_long = [
        rec(over.clone(), vec![], vec![]),
        rec(vec![], over.clone(), vec![]),
        rec(vec![], vec![], over.clone()),
    ];
    let mut buf = vec![FILL; 64 * 1024];
    let mut w = TokenWriter::new(&mut buf, &test_header(), 0, 1, 2).unwrap();
    for bad in &too_long {
        let before = w.remaining();
        assert_eq!(w.push(&bad.as_record()), Err(BufferFull));
        assert_eq!(w.remaining(), before);
    }
    w.push(&ok.as_record()).unwrap();
    let len = w.finish();
    assert!(buf[len..].iter().all(|&b| b == FILL));
    let got = parse_owned(&buf[..len]);
    let OwnedBody::Token { records, .. } = got.body else {
        panic!("not a token: {got:?}")
    };
    assert_eq!(records, vec![ok]);
}

#[test]
fn messages_writer_holds_at_most_u16_max_messages() {
    let n = usize::from(u16::MAX);
    let mut buf = vec![0u8; HEADER_LEN + DATA_FIXED_LEN + (n + 1) * MESSAGE_HEADER_LEN];
    let mut w = MessagesWriter::data(&mut buf, &test_header()).unwrap();
    let msg = |i: usize| Message {
        seq: i as u64 + 1,
        msg_id: i as u64 + 1,
        timestamp_us: 0,
        topic: TopicId(0),
        payload: &[],
    };
    for i in 0..n {
        w.push(&msg(i)).unwrap();
    }
    assert!(!w.fits(0), "room is left but the count is full");
    assert_eq!(w.push(&msg(n)), Err(BufferFull));
    assert_eq!(w.count(), n);
    let len = w.finish();
    assert_eq!(len, buf.len() - MESSAGE_HEADER_LEN);
    let p = Packet::parse(&buf[..len]).unwrap();
    let Body::Data(view) = p.body else {
        panic!("not data")
    };
    assert_eq!(view.len(), n);
    assert!(view.iter().enumerate().all(|(i, m)| m == msg(i)));
    assert_eq!(view.iter().count(), n);
}

#[test]
fn payload_longer_than_u16_max_is_refused() {
    let big = vec![7u8; usize::from(u16::MAX) + 1];
    let mut buf = vec![FILL; 2 * big.len()];
    let mut w = MessagesWriter::data(&mut buf, &test_header()).unwrap();
    let m = Message {
        seq: 1,
        msg_id: 1,
        timestamp_us: 1,
        topic: TopicId(1),
        payload: &big,
    };
    assert!(!w.fits(big.len()));
    assert_eq!(w.push(&m), Err(BufferFull));
    let max = Message {
        payload: &big[1..],
        ..m
    };
    assert!(w.fits(max.payload.len()));
    w.push(&max).unwrap();
    let len = w.finish();
    let got = parse_owned(&buf[..len]);
    assert_eq!(
        got.body,
        OwnedBody::Data(vec![OwnedMessage::from_view(&max)])
    );
}

#[test]
fn write_ranges_holds_at_most_u16_max_ranges() {
    let ranges = ranges_n(usize::from(u16::MAX) + 10);
    let mut buf = vec![0u8; HEADER_LEN + RANGES_FIXED_LEN + ranges.len() * RANGE_LEN];
    let (len, fit) = write_ranges(&mut buf, &test_header(), Kind::Nak, NodeId(1), &ranges).unwrap();
    assert_eq!(fit, usize::from(u16::MAX));
    let got = parse_owned(&buf[..len]);
    assert_eq!(
        got.body,
        OwnedBody::Nak {
            origin: NodeId(1),
            ranges: ranges[..fit].to_vec()
        }
    );
}

#[test]
fn token_writer_holds_at_most_u16_max_records() {
    let n = usize::from(u16::MAX);
    let mut buf = vec![0u8; HEADER_LEN + TOKEN_FIXED_LEN + (n + 1) * RECORD_FIXED_LEN];
    let mut w = TokenWriter::new(&mut buf, &test_header(), 1, 1, 1).unwrap();
    let rec = |i: usize| Record {
        origin: NodeId(i as u32),
        stable_upto: 0,
        agg_contiguous: 0,
        agg_max: 0,
        prev_contiguous: 0,
        prev_max: 0,
        missing_all: &[],
        lost: &[],
        prev_missing: &[],
    };
    for i in 0..n {
        w.push(&rec(i)).unwrap();
    }
    assert_eq!(w.remaining(), RECORD_FIXED_LEN);
    assert_eq!(w.push(&rec(n)), Err(BufferFull));
    let len = w.finish();
    let p = Packet::parse(&buf[..len]).unwrap();
    let Body::Token(t) = p.body else {
        panic!("not a token")
    };
    assert_eq!(t.len(), n);
    assert!(t
        .records()
        .enumerate()
        .all(|(i, r)| r.origin == NodeId(i as u32)));
}

#[test]
fn every_kind_has_a_generated_round_trip() {
    // Guards the strategies: `st::packet_of` must produce the requested kind.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    for kind in ALL_KINDS {
        let p = st::packet_of(kind)
            .new_tree(&mut runner)
            .expect("strategy")
            .current();
        assert_eq!(p.header.kind, kind);
        assert_eq!(p.body.kind(), kind);
        assert_eq!(parse_owned(&p.encode_to_vec()), p);
    }
}
