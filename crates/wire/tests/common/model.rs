//! An owned mirror of every packet kind, the oracle every parse result is checked against, and the
//! framing of the fuzz targets.
//!
//! This file depends on `tidings-wire` and `std` only: the integration tests include it as
//! `common::model`, and each fuzz target under `fuzz/fuzz_targets/` includes it with `#[path]`, so
//! the fuzzers, the corpus replay and the property tests share one oracle.

use tidings_wire::{
    peek_kind, write_ack, write_dcq, write_ranges, write_silence, write_token_ack, write_uca, Body,
    BufferFull, DecodeError, Header, Kind, Message, MessagesView, MessagesWriter, NodeId, Packet,
    RangesView, Record, RecordView, RegionId, SeqRange, Silence, TokenWriter, TopicId, ViewId,
    HEADER_LEN, MAGIC, MESSAGE_HEADER_LEN, RANGE_LEN, RECORD_FIXED_LEN, VERSION,
};

/// Fixed body lengths from the layout table of the crate docs (private constants in the crate).
pub(crate) const DATA_FIXED_LEN: usize = 2;
pub(crate) const RETRANSMIT_FIXED_LEN: usize = 4 + 2;
pub(crate) const SILENCE_LEN: usize = 3 * 8;
pub(crate) const TOKEN_FIXED_LEN: usize = 1 + 2 + 8 + 2;
pub(crate) const ACK_LEN: usize = 4 + 8;
pub(crate) const TOKEN_ACK_LEN: usize = 1 + 2 + 8;
pub(crate) const RANGES_FIXED_LEN: usize = 4 + 2;

/// An owned message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedMessage {
    pub(crate) seq: u64,
    pub(crate) msg_id: u64,
    pub(crate) timestamp_us: u64,
    pub(crate) topic: TopicId,
    pub(crate) payload: Vec<u8>,
}

impl OwnedMessage {
    pub(crate) fn as_message(&self) -> Message<'_> {
        Message {
            seq: self.seq,
            msg_id: self.msg_id,
            timestamp_us: self.timestamp_us,
            topic: self.topic,
            payload: &self.payload,
        }
    }

    pub(crate) fn from_view(m: &Message<'_>) -> Self {
        OwnedMessage {
            seq: m.seq,
            msg_id: m.msg_id,
            timestamp_us: m.timestamp_us,
            topic: m.topic,
            payload: m.payload.to_vec(),
        }
    }

    pub(crate) fn wire_len(&self) -> usize {
        MESSAGE_HEADER_LEN + self.payload.len()
    }
}

/// An owned token record.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    pub(crate) fn as_record(&self) -> Record<'_> {
        Record {
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

    pub(crate) fn from_view(r: &RecordView<'_>) -> Self {
        OwnedRecord {
            origin: r.origin,
            stable_upto: r.stable_upto,
            agg_contiguous: r.agg_contiguous,
            agg_max: r.agg_max,
            prev_contiguous: r.prev_contiguous,
            prev_max: r.prev_max,
            missing_all: ranges_from_view(&r.missing_all),
            lost: ranges_from_view(&r.lost),
            prev_missing: ranges_from_view(&r.prev_missing),
        }
    }

    pub(crate) fn wire_len(&self) -> usize {
        RECORD_FIXED_LEN
            + RANGE_LEN * (self.missing_all.len() + self.lost.len() + self.prev_missing.len())
    }
}

/// An owned packet body; one variant per [`Kind`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum OwnedBody {
    Data(Vec<OwnedMessage>),
    Retransmit {
        origin: NodeId,
        messages: Vec<OwnedMessage>,
    },
    Silence(Silence),
    Token {
        level: u8,
        ring: u16,
        round: u64,
        records: Vec<OwnedRecord>,
    },
    Ack {
        origin: NodeId,
        stable_upto: u64,
    },
    Nak {
        origin: NodeId,
        ranges: Vec<SeqRange>,
    },
    Pull {
        origin: NodeId,
        ranges: Vec<SeqRange>,
    },
    TokenAck {
        level: u8,
        ring: u16,
        round: u64,
    },
    Dcq {
        seq: u64,
        position_us: u64,
    },
    Uca {
        origin: NodeId,
        seq: u64,
        nonrec: u32,
        rec: u32,
    },
}

impl OwnedBody {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            OwnedBody::Data(_) => Kind::Data,
            OwnedBody::Retransmit { .. } => Kind::Retransmit,
            OwnedBody::Silence(_) => Kind::Silence,
            OwnedBody::Token { .. } => Kind::Token,
            OwnedBody::Ack { .. } => Kind::Ack,
            OwnedBody::Nak { .. } => Kind::Nak,
            OwnedBody::Pull { .. } => Kind::Pull,
            OwnedBody::TokenAck { .. } => Kind::TokenAck,
            OwnedBody::Dcq { .. } => Kind::Dcq,
            OwnedBody::Uca { .. } => Kind::Uca,
        }
    }
}

/// An owned packet. `header.kind` always equals `body.kind()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedPacket {
    pub(crate) header: Header,
    pub(crate) body: OwnedBody,
}

/// Collects a ranges view, checking that its `len` and `is_empty` agree with iteration.
pub(crate) fn ranges_from_view(view: &RangesView<'_>) -> Vec<SeqRange> {
    let out: Vec<SeqRange> = view.iter().collect();
    assert_eq!(
        view.len(),
        out.len(),
        "RangesView::len disagrees with iteration"
    );
    assert_eq!(view.is_empty(), out.is_empty(), "RangesView::is_empty");
    out
}

/// Collects a messages view, checking that its `len` and `is_empty` agree with iteration.
pub(crate) fn messages_from_view(view: &MessagesView<'_>) -> Vec<OwnedMessage> {
    let out: Vec<OwnedMessage> = view.iter().map(|m| OwnedMessage::from_view(&m)).collect();
    assert_eq!(
        view.len(),
        out.len(),
        "MessagesView::len disagrees with iteration"
    );
    assert_eq!(view.is_empty(), out.is_empty(), "MessagesView::is_empty");
    out
}

impl OwnedPacket {
    /// Copies every field out of a parsed packet, iterating every view to its end.
    pub(crate) fn from_view(p: &Packet<'_>) -> Self {
        let body = match p.body {
            Body::Data(m) => OwnedBody::Data(messages_from_view(&m)),
            Body::Retransmit { origin, messages } => OwnedBody::Retransmit {
                origin,
                messages: messages_from_view(&messages),
            },
            Body::Silence(s) => OwnedBody::Silence(s),
            Body::Token(t) => {
                let records: Vec<OwnedRecord> =
                    t.records().map(|r| OwnedRecord::from_view(&r)).collect();
                assert_eq!(
                    t.len(),
                    records.len(),
                    "TokenView::len disagrees with iteration"
                );
                assert_eq!(t.is_empty(), records.is_empty(), "TokenView::is_empty");
                OwnedBody::Token {
                    level: t.level,
                    ring: t.ring,
                    round: t.round,
                    records,
                }
            }
            Body::Ack {
                origin,
                stable_upto,
            } => OwnedBody::Ack {
                origin,
                stable_upto,
            },
            Body::Nak { origin, ranges } => OwnedBody::Nak {
                origin,
                ranges: ranges_from_view(&ranges),
            },
            Body::Pull { origin, ranges } => OwnedBody::Pull {
                origin,
                ranges: ranges_from_view(&ranges),
            },
            Body::TokenAck { level, ring, round } => OwnedBody::TokenAck { level, ring, round },
            Body::Dcq { seq, position_us } => OwnedBody::Dcq { seq, position_us },
            Body::Uca {
                origin,
                seq,
                min_nonrec_rate_milli,
                min_rec_rate_milli,
            } => OwnedBody::Uca {
                origin,
                seq,
                nonrec: min_nonrec_rate_milli,
                rec: min_rec_rate_milli,
            },
        };
        assert_eq!(
            p.header.kind,
            body.kind(),
            "body variant disagrees with header kind"
        );
        OwnedPacket {
            header: p.header,
            body,
        }
    }

    /// Length of the encoding, computed from the layout table rather than by the writers.
    pub(crate) fn wire_len(&self) -> usize {
        HEADER_LEN
            + match &self.body {
                OwnedBody::Data(ms) => {
                    DATA_FIXED_LEN + ms.iter().map(OwnedMessage::wire_len).sum::<usize>()
                }
                OwnedBody::Retransmit { messages, .. } => {
                    RETRANSMIT_FIXED_LEN
                        + messages.iter().map(OwnedMessage::wire_len).sum::<usize>()
                }
                OwnedBody::Silence(_) => SILENCE_LEN,
                OwnedBody::Token { records, .. } => {
                    TOKEN_FIXED_LEN + records.iter().map(OwnedRecord::wire_len).sum::<usize>()
                }
                OwnedBody::Ack { .. } => ACK_LEN,
                OwnedBody::TokenAck { .. } => TOKEN_ACK_LEN,
                OwnedBody::Dcq { .. } => 16,
                OwnedBody::Uca { .. } => 20,
                OwnedBody::Nak { ranges, .. } | OwnedBody::Pull { ranges, .. } => {
                    RANGES_FIXED_LEN + RANGE_LEN * ranges.len()
                }
            }
    }

    /// Encodes with the crate's writers. Fails if any part (message, record, range) does not fit.
    pub(crate) fn encode(&self, buf: &mut [u8]) -> Result<usize, BufferFull> {
        let h = &self.header;
        match &self.body {
            OwnedBody::Data(ms) => {
                let mut w = MessagesWriter::data(buf, h)?;
                for m in ms {
                    w.push(&m.as_message())?;
                }
                Ok(w.finish())
            }
            OwnedBody::Retransmit { origin, messages } => {
                let mut w = MessagesWriter::retransmit(buf, h, *origin)?;
                for m in messages {
                    w.push(&m.as_message())?;
                }
                Ok(w.finish())
            }
            OwnedBody::Silence(s) => write_silence(buf, h, s),
            OwnedBody::Token {
                level,
                ring,
                round,
                records,
            } => {
                let mut w = TokenWriter::new(buf, h, *level, *ring, *round)?;
                for r in records {
                    w.push(&r.as_record())?;
                }
                Ok(w.finish())
            }
            OwnedBody::Ack {
                origin,
                stable_upto,
            } => write_ack(buf, h, *origin, *stable_upto),
            OwnedBody::TokenAck { level, ring, round } => {
                write_token_ack(buf, h, *level, *ring, *round)
            }
            OwnedBody::Dcq { seq, position_us } => write_dcq(buf, h, *seq, *position_us),
            OwnedBody::Uca {
                origin,
                seq,
                nonrec,
                rec,
            } => write_uca(buf, h, *origin, *seq, *nonrec, *rec),
            OwnedBody::Nak { origin, ranges } | OwnedBody::Pull { origin, ranges } => {
                let (len, fit) = write_ranges(buf, h, self.body.kind(), *origin, ranges)?;
                if fit == ranges.len() {
                    Ok(len)
                } else {
                    Err(BufferFull)
                }
            }
        }
    }

    /// Encodes into a buffer of exactly [`OwnedPacket::wire_len`] bytes, which must be filled.
    pub(crate) fn encode_to_vec(&self) -> Vec<u8> {
        let mut buf = vec![0u8; self.wire_len()];
        let len = self
            .encode(&mut buf)
            .expect("writers refused a buffer of exactly the packet's length");
        assert_eq!(
            len,
            buf.len(),
            "writer length disagrees with the layout table"
        );
        buf
    }
}

/// Whether an error is one that the header alone decides (and `peek_kind` therefore sees).
fn is_header_error(e: &DecodeError) -> bool {
    matches!(
        e,
        DecodeError::TooShort
            | DecodeError::BadMagic
            | DecodeError::BadVersion(_)
            | DecodeError::UnknownKind(_)
    )
}

/// The oracle for any bytes: parses them, checks that `peek_kind` agrees, iterates every view to
/// its end, and checks that an accepted packet re-encodes with the writers to exactly the same
/// bytes (the encoding is canonical). Panics on any disagreement.
pub(crate) fn check_bytes(bytes: &[u8]) -> Result<OwnedPacket, DecodeError> {
    let parsed = Packet::parse(bytes);
    let peeked = peek_kind(bytes);
    match &parsed {
        Ok(p) => assert_eq!(
            peeked,
            Some(p.header.kind),
            "peek_kind disagrees with parse"
        ),
        Err(e) => {
            assert_eq!(
                is_header_error(e),
                peeked.is_none(),
                "peek_kind {peeked:?} disagrees with parse error {e:?}"
            );
            match e {
                DecodeError::TooShort => assert!(bytes.len() < HEADER_LEN),
                DecodeError::Trailing(n) => {
                    assert!(*n > 0 && *n <= bytes.len() - HEADER_LEN, "Trailing({n})");
                }
                _ => assert!(bytes.len() >= HEADER_LEN, "{e:?} on a short buffer"),
            }
        }
    }
    let packet = parsed?;
    let owned = OwnedPacket::from_view(&packet);
    let again = owned.encode_to_vec();
    assert!(
        again == bytes,
        "accepted packet is not canonical:\n input {bytes:02x?}\n again {again:02x?}"
    );
    Ok(owned)
}

/// The header every framed fuzz target puts in front of its input.
pub(crate) fn fuzz_header(kind: Kind) -> Header {
    Header {
        kind,
        incarnation: 0x0A0B_0C0D,
        region: RegionId(0x0102_0304),
        view: ViewId(7),
        sender: NodeId(42),
    }
}

/// Encodes a header by hand from the layout in the crate docs (independently of the writers).
pub(crate) fn header_bytes(h: &Header) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    out[2] = VERSION;
    out[3] = h.kind as u8;
    out[4..8].copy_from_slice(&h.incarnation.to_be_bytes());
    out[8..12].copy_from_slice(&h.region.0.to_be_bytes());
    out[12..16].copy_from_slice(&h.view.0.to_be_bytes());
    out[16..20].copy_from_slice(&h.sender.0.to_be_bytes());
    out
}

/// One fuzz target: which parser entry point it aims at and how it frames its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The input is a whole packet.
    Packet,
    /// The input is the body of a token (a valid token header is put in front).
    Token,
    /// The first byte picks Data (even) or Retransmit (odd); the rest is the body.
    Messages,
    /// The first byte picks Nak (even) or Pull (odd); the rest is the body.
    Ranges,
}

impl Target {
    pub(crate) const ALL: [Target; 4] = [
        Target::Packet,
        Target::Token,
        Target::Messages,
        Target::Ranges,
    ];

    /// The fuzz target's name, which is also its corpus directory.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Target::Packet => "parse_packet",
            Target::Token => "parse_token",
            Target::Messages => "parse_messages",
            Target::Ranges => "parse_ranges",
        }
    }

    /// The packet kind the framing gives an input (`None` for whole packets).
    pub(crate) fn kind(self, input: &[u8]) -> Option<Kind> {
        let odd = input.first().is_some_and(|b| b & 1 == 1);
        match self {
            Target::Packet => None,
            Target::Token => Some(Kind::Token),
            Target::Messages => Some(if odd { Kind::Retransmit } else { Kind::Data }),
            Target::Ranges => Some(if odd { Kind::Pull } else { Kind::Nak }),
        }
    }

    /// Turns a fuzz input into the bytes handed to `Packet::parse`.
    pub(crate) fn frame(self, input: &[u8]) -> Vec<u8> {
        let body = match self {
            Target::Packet => return input.to_vec(),
            Target::Token => input,
            Target::Messages | Target::Ranges => input.get(1..).unwrap_or(&[]),
        };
        let kind = self.kind(input).expect("framed targets have a kind");
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&header_bytes(&fuzz_header(kind)));
        out.extend_from_slice(body);
        out
    }

    /// The fuzz input that frames to `packet`, a valid packet of a kind this target accepts
    /// written with [`fuzz_header`]; `None` if this target cannot produce it.
    pub(crate) fn unframe(self, packet: &[u8]) -> Option<Vec<u8>> {
        let kind = peek_kind(packet)?;
        if self != Target::Packet && packet[..HEADER_LEN] != header_bytes(&fuzz_header(kind)) {
            return None;
        }
        let body = &packet[HEADER_LEN..];
        let selector = |odd: bool| {
            let mut v = vec![u8::from(odd)];
            v.extend_from_slice(body);
            Some(v)
        };
        match (self, kind) {
            (Target::Packet, _) => Some(packet.to_vec()),
            (Target::Token, Kind::Token) => Some(body.to_vec()),
            (Target::Messages, Kind::Data) | (Target::Ranges, Kind::Nak) => selector(false),
            (Target::Messages, Kind::Retransmit) | (Target::Ranges, Kind::Pull) => selector(true),
            _ => None,
        }
    }

    /// What each fuzz target runs: frame, then the full oracle; a framed packet that parses must
    /// have the kind the framing chose.
    pub(crate) fn run(self, input: &[u8]) -> Result<OwnedPacket, DecodeError> {
        let bytes = self.frame(input);
        let result = check_bytes(&bytes);
        if let (Ok(p), Some(kind)) = (&result, self.kind(input)) {
            assert_eq!(p.header.kind, kind, "framed packet changed kind");
        }
        if self != Target::Packet {
            // The framing always writes a valid header, so no header error is possible.
            assert!(
                !result.as_ref().is_err_and(is_header_error),
                "framed header rejected: {result:?}"
            );
        }
        result
    }
}
