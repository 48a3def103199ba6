//! Encoding and checked decoding of every packet kind.

use crate::ids::{NodeId, RegionId, SeqRange, TopicId, ViewId};

/// The first two bytes of every tidings packet ("TD").
pub const MAGIC: u16 = 0x5444;
/// The wire version this crate reads and writes (2: the header carries the incarnation).
pub const VERSION: u8 = 2;
/// Bytes in the common header.
pub const HEADER_LEN: usize = 20;
/// Where the incarnation lies in the header: right after the kind, so that a node drops a
/// packet of another incarnation before it reads anything else.
const INCARNATION_AT: usize = 4;
/// Where the header's region starts.
const REGION_AT: usize = 8;
/// Bytes in front of each message payload inside a data or retransmission packet.
pub const MESSAGE_HEADER_LEN: usize = 30;
/// Bytes in one encoded [`SeqRange`].
pub const RANGE_LEN: usize = 12;
/// Bytes in a token record before its three range lists.
pub const RECORD_FIXED_LEN: usize = 47;

const DATA_FIXED_LEN: usize = 2;
const RETRANSMIT_FIXED_LEN: usize = 6;
const SILENCE_LEN: usize = 24;
const TOKEN_FIXED_LEN: usize = 13;
const ACK_LEN: usize = 12;
const TOKEN_ACK_LEN: usize = 11;
const DCQ_LEN: usize = 16;
const UCA_LEN: usize = 20;
const RANGES_FIXED_LEN: usize = 6;

/// What a packet is; the fourth byte of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Messages multicast by their sender into a region.
    Data = 1,
    /// Messages resent by a peer (push or pull) or by the sender (after a NAK).
    Retransmit = 2,
    /// Heartbeat of an idle stream: the last sequence number sent, for tail-loss detection.
    Silence = 3,
    /// A token of one ring of the recovery hierarchy.
    Token = 4,
    /// Aggregate acknowledgement from a region leader to a sender.
    Ack = 5,
    /// Ranges the whole region lost, from the region leader to the sender.
    Nak = 6,
    /// A request for retransmission of ranges, from a receiver to a peer or to the sender.
    Pull = 7,
    /// The next ring member confirms it received a token (a missing confirmation makes the
    /// holder resend the token and, after some tries, suspect the member).
    TokenAck = 8,
    /// Gryphon's downstream congestion query: a sender asks its regions how they keep up.
    Dcq = 9,
    /// Gryphon's upstream congestion alert: the slowest doubt horizon rates below a node, on
    /// their way to the sender.
    Uca = 10,
}

impl Kind {
    /// The kind for a header byte, if it is one.
    #[must_use]
    pub fn from_u8(value: u8) -> Option<Kind> {
        Some(match value {
            1 => Kind::Data,
            2 => Kind::Retransmit,
            3 => Kind::Silence,
            4 => Kind::Token,
            5 => Kind::Ack,
            6 => Kind::Nak,
            7 => Kind::Pull,
            8 => Kind::TokenAck,
            9 => Kind::Dcq,
            10 => Kind::Uca,
            _ => return None,
        })
    }

    /// The class in which a received packet of this kind is processed (paper 000, Fig. 12):
    /// tokens and control first, then recovery, then data.
    #[must_use]
    pub fn priority(self) -> Priority {
        match self {
            Kind::Token | Kind::TokenAck | Kind::Ack | Kind::Nak | Kind::Dcq | Kind::Uca => {
                Priority::Control
            }
            Kind::Pull | Kind::Retransmit => Priority::Recovery,
            Kind::Data | Kind::Silence => Priority::Data,
        }
    }
}

/// Processing and sending classes, most urgent first (ordering is by urgency).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Tokens, ACKs, NAKs.
    Control = 0,
    /// Pull requests and retransmissions.
    Recovery = 1,
    /// New data and silence.
    Data = 2,
}

/// The kind of a packet from its header alone, without validating the body; used to sort a batch
/// of received datagrams by priority before any is processed.
#[must_use]
pub fn peek_kind(buf: &[u8]) -> Option<Kind> {
    if buf.len() < HEADER_LEN || buf[0..2] != MAGIC.to_be_bytes() || buf[2] != VERSION {
        return None;
    }
    Kind::from_u8(buf[3])
}

/// The incarnation in a packet's header, without validating anything else (`None` if the bytes
/// are too short to hold a header): a node compares it with its own before it parses.
#[must_use]
pub fn peek_incarnation(buf: &[u8]) -> Option<u32> {
    let bytes = buf.get(INCARNATION_AT..INCARNATION_AT + 4)?;
    (buf.len() >= HEADER_LEN).then(|| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// The region in a packet's header, without validating anything else (`None` if the bytes are
/// too short to hold a header): a sealed node picks the region's key by it before opening.
#[must_use]
pub fn peek_region(buf: &[u8]) -> Option<RegionId> {
    let bytes = buf.get(REGION_AT..REGION_AT + 4)?;
    (buf.len() >= HEADER_LEN)
        .then(|| RegionId(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])))
}

/// Writes `incarnation` into the header of the encoded packet `buf` (a no-op on bytes too short
/// to hold a header): a node stamps its incarnation on every datagram as it leaves, whatever
/// wrote it.
pub fn stamp_incarnation(buf: &mut [u8], incarnation: u32) {
    if buf.len() >= HEADER_LEN {
        buf[INCARNATION_AT..INCARNATION_AT + 4].copy_from_slice(&incarnation.to_be_bytes());
    }
}

/// Why bytes were not a valid packet. A peer's bad packet is counted and dropped, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the common header.
    #[error("packet shorter than the {HEADER_LEN}-byte header")]
    TooShort,
    /// The magic bytes are not "TD".
    #[error("bad magic")]
    BadMagic,
    /// A wire version this build does not speak.
    #[error("unsupported wire version {0}")]
    BadVersion(u8),
    /// A kind byte that names no packet kind.
    #[error("unknown packet kind {0}")]
    UnknownKind(u8),
    /// A count or length points past the end of the packet.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// Bytes left after the last field the counts describe.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// A field with a value no correct peer sends (empty range, overflowing range, ...).
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// The buffer given to a writer has no room for what was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("buffer full")]
pub struct BufferFull;

/// The common header of every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the body is.
    pub kind: Kind,
    /// The incarnation of the membership service whose views the sender runs: a node drops
    /// packets of another incarnation (a service restarted without its state numbers regions,
    /// views and topics again, so only this tells its packets from the old ones). 0 for nodes
    /// without a service.
    pub incarnation: u32,
    /// The region the packet belongs to.
    pub region: RegionId,
    /// The region view the packet belongs to.
    pub view: ViewId,
    /// The node that put this packet on the wire (for data and silence: the stream's origin).
    pub sender: NodeId,
}

/// One message inside a data or retransmission packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// Sequence number in the stream (origin, region view).
    pub seq: u64,
    /// Per-sender message id, identical in every region the message was sent to.
    pub msg_id: u64,
    /// Sender timestamp in microseconds of the sender's clock (Gryphon's tick).
    pub timestamp_us: u64,
    /// The topic the message was published on.
    pub topic: TopicId,
    /// The application payload.
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// Bytes this message occupies inside a packet.
    #[must_use]
    pub fn wire_len(&self) -> usize {
        MESSAGE_HEADER_LEN + self.payload.len()
    }
}

/// The body of a silence heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Silence {
    /// Highest sequence number the origin has sent in this stream (0 if none).
    pub last_seq: u64,
    /// Sender time of the heartbeat in microseconds.
    pub timestamp_us: u64,
    /// Highest sequence number the origin knows to be stable; lets the region leader resend a
    /// lost ACK.
    pub acked_upto: u64,
}

/// A token record to write: per-sender recovery state as described in the crate docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'r> {
    /// The stream's origin (sender).
    pub origin: NodeId,
    /// Highest sequence number known stable in the whole region (sent down for cleanup).
    pub stable_upto: u64,
    /// Minimum, over the members visited this round, of what each has contiguously.
    pub agg_contiguous: u64,
    /// Maximum sequence number any visited member knows to exist.
    pub agg_max: u64,
    /// The previous holder's own contiguous prefix (for neighbour comparison).
    pub prev_contiguous: u64,
    /// The previous holder's highest known sequence number.
    pub prev_max: u64,
    /// Level 0: sequence numbers missing at every member visited so far.
    pub missing_all: &'r [SeqRange],
    /// Level 1 and up: sequence numbers lost by all members of their caching partition.
    /// Level 0: empty, the previous holder takes pushes of anything in `prev_missing`; else it
    /// is recovering and asks the next member to push only the gaps named here that
    /// `prev_missing` lists (it pulls the others elsewhere; tidings' ADR 13). The same bytes at
    /// every level; only the meaning differs.
    pub lost: &'r [SeqRange],
    /// The previous holder's own missing ranges above `prev_contiguous`.
    pub prev_missing: &'r [SeqRange],
}

impl Record<'_> {
    /// Bytes this record occupies inside a token.
    #[must_use]
    pub fn wire_len(&self) -> usize {
        RECORD_FIXED_LEN
            + RANGE_LEN * (self.missing_all.len() + self.lost.len() + self.prev_missing.len())
    }
}

/// A validated packet borrowing its buffer.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// The common header.
    pub header: Header,
    /// The kind-specific body.
    pub body: Body<'a>,
}

/// The validated body of a packet.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    /// Messages from their origin (the header's sender).
    Data(MessagesView<'a>),
    /// Messages of stream `origin` resent by the header's sender.
    Retransmit {
        /// The stream's origin.
        origin: NodeId,
        /// The messages.
        messages: MessagesView<'a>,
    },
    /// Heartbeat of the header sender's stream.
    Silence(Silence),
    /// A token.
    Token(TokenView<'a>),
    /// Aggregate acknowledgement for stream `origin`.
    Ack {
        /// The stream's origin (the receiver of the ACK).
        origin: NodeId,
        /// Everything up to and including this sequence number is stable in the region.
        stable_upto: u64,
    },
    /// Ranges of stream `origin` that the region lost.
    Nak {
        /// The stream's origin.
        origin: NodeId,
        /// The ranges.
        ranges: RangesView<'a>,
    },
    /// Ranges of stream `origin` that the header's sender asks to be resent.
    Pull {
        /// The stream's origin.
        origin: NodeId,
        /// The ranges.
        ranges: RangesView<'a>,
    },
    /// A congestion query from the header's sender (the stream's origin).
    Dcq {
        /// Query sequence number, increasing.
        seq: u64,
        /// The sender's current position in its stream, microseconds of its clock.
        position_us: u64,
    },
    /// A congestion alert about stream `origin`, answering query `seq`.
    Uca {
        /// The stream's origin.
        origin: NodeId,
        /// The query answered.
        seq: u64,
        /// Slowest smoothed doubt horizon rate of a receiver that is not recovering, in
        /// thousandths of tick-seconds per second (`u32::MAX`: none).
        min_nonrec_rate_milli: u32,
        /// The same for recovering receivers.
        min_rec_rate_milli: u32,
    },
    /// The header's sender received token `round` of ring `ring` at `level`.
    TokenAck {
        /// Level of the ring.
        level: u8,
        /// Index of the ring within its level.
        ring: u16,
        /// The round received.
        round: u64,
    },
}

/// A bounds-checked cursor. Every read returns `None` past the end, so no read can panic.
#[derive(Clone, Copy, Debug)]
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    fn message(&mut self) -> Option<Message<'a>> {
        let seq = self.u64()?;
        let msg_id = self.u64()?;
        let timestamp_us = self.u64()?;
        let topic = TopicId(self.u32()?);
        let len = self.u16()?;
        let payload = self.bytes(usize::from(len))?;
        Some(Message {
            seq,
            msg_id,
            timestamp_us,
            topic,
            payload,
        })
    }

    fn range(&mut self) -> Option<SeqRange> {
        Some(SeqRange {
            start: self.u64()?,
            len: self.u32()?,
        })
    }
}

impl<'a> Packet<'a> {
    /// Validates `buf` as one whole packet. Never panics, never allocates.
    pub fn parse(buf: &'a [u8]) -> Result<Packet<'a>, DecodeError> {
        let mut r = Reader::new(buf);
        let header = parse_header(&mut r)?;
        let body = match header.kind {
            Kind::Data => {
                let count = r.u16().ok_or(DecodeError::Truncated("data count"))?;
                Body::Data(MessagesView::validate(&mut r, count)?)
            }
            Kind::Retransmit => {
                let origin = NodeId(r.u32().ok_or(DecodeError::Truncated("origin"))?);
                let count = r.u16().ok_or(DecodeError::Truncated("retransmit count"))?;
                Body::Retransmit {
                    origin,
                    messages: MessagesView::validate(&mut r, count)?,
                }
            }
            Kind::Silence => {
                let t = DecodeError::Truncated("silence");
                let last_seq = r.u64().ok_or(t)?;
                let timestamp_us = r.u64().ok_or(t)?;
                let acked_upto = r.u64().ok_or(t)?;
                if acked_upto > last_seq {
                    return Err(DecodeError::Invalid("silence acked beyond last"));
                }
                Body::Silence(Silence {
                    last_seq,
                    timestamp_us,
                    acked_upto,
                })
            }
            Kind::Token => Body::Token(TokenView::validate(&mut r)?),
            Kind::Ack => {
                let t = DecodeError::Truncated("ack");
                let origin = NodeId(r.u32().ok_or(t)?);
                let stable_upto = r.u64().ok_or(t)?;
                Body::Ack {
                    origin,
                    stable_upto,
                }
            }
            Kind::Dcq => {
                let t = DecodeError::Truncated("dcq");
                let seq = r.u64().ok_or(t)?;
                let position_us = r.u64().ok_or(t)?;
                Body::Dcq { seq, position_us }
            }
            Kind::Uca => {
                let t = DecodeError::Truncated("uca");
                let origin = NodeId(r.u32().ok_or(t)?);
                let seq = r.u64().ok_or(t)?;
                let min_nonrec_rate_milli = r.u32().ok_or(t)?;
                let min_rec_rate_milli = r.u32().ok_or(t)?;
                Body::Uca {
                    origin,
                    seq,
                    min_nonrec_rate_milli,
                    min_rec_rate_milli,
                }
            }
            Kind::TokenAck => {
                let t = DecodeError::Truncated("token ack");
                let level = r.u8().ok_or(t)?;
                let ring = r.u16().ok_or(t)?;
                let round = r.u64().ok_or(t)?;
                Body::TokenAck { level, ring, round }
            }
            Kind::Nak | Kind::Pull => {
                let t = DecodeError::Truncated("ranges");
                let origin = NodeId(r.u32().ok_or(t)?);
                let count = r.u16().ok_or(t)?;
                let ranges = RangesView::validate(&mut r, usize::from(count))?;
                if header.kind == Kind::Nak {
                    Body::Nak { origin, ranges }
                } else {
                    Body::Pull { origin, ranges }
                }
            }
        };
        if r.remaining() != 0 {
            return Err(DecodeError::Trailing(r.remaining()));
        }
        Ok(Packet { header, body })
    }
}

fn parse_header(r: &mut Reader<'_>) -> Result<Header, DecodeError> {
    if r.remaining() < HEADER_LEN {
        return Err(DecodeError::TooShort);
    }
    let short = DecodeError::TooShort;
    if r.u16().ok_or(short)? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = r.u8().ok_or(short)?;
    if version != VERSION {
        return Err(DecodeError::BadVersion(version));
    }
    let kind_byte = r.u8().ok_or(short)?;
    let kind = Kind::from_u8(kind_byte).ok_or(DecodeError::UnknownKind(kind_byte))?;
    let incarnation = r.u32().ok_or(short)?;
    let region = RegionId(r.u32().ok_or(short)?);
    let view = ViewId(r.u32().ok_or(short)?);
    let sender = NodeId(r.u32().ok_or(short)?);
    Ok(Header {
        kind,
        incarnation,
        region,
        view,
        sender,
    })
}

/// The validated messages of a data or retransmission packet.
#[derive(Clone, Copy, Debug)]
pub struct MessagesView<'a> {
    bytes: &'a [u8],
    count: u16,
}

impl<'a> MessagesView<'a> {
    fn validate(r: &mut Reader<'a>, count: u16) -> Result<Self, DecodeError> {
        let start = r.pos;
        for _ in 0..count {
            let m = r.message().ok_or(DecodeError::Truncated("message"))?;
            if m.seq == 0 || m.msg_id == 0 {
                return Err(DecodeError::Invalid("zero sequence number or message id"));
            }
        }
        Ok(MessagesView {
            bytes: &r.buf[start..r.pos],
            count,
        })
    }

    /// Number of messages.
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether there are no messages.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Offset of the first message's first byte within the packet buffer is not exposed; this
    /// iterates the messages in packet order.
    #[must_use]
    pub fn iter(&self) -> MessagesIter<'a> {
        MessagesIter {
            r: Reader::new(self.bytes),
            left: self.count,
        }
    }
}

/// Iterator over validated messages.
#[derive(Clone, Debug)]
pub struct MessagesIter<'a> {
    r: Reader<'a>,
    left: u16,
}

impl<'a> Iterator for MessagesIter<'a> {
    type Item = Message<'a>;

    fn next(&mut self) -> Option<Message<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Validated at parse time; `None` here would only end iteration early.
        self.r.message()
    }
}

/// Validated sequence-number ranges.
#[derive(Clone, Copy, Debug)]
pub struct RangesView<'a> {
    bytes: &'a [u8],
}

impl<'a> RangesView<'a> {
    fn validate(r: &mut Reader<'a>, count: usize) -> Result<Self, DecodeError> {
        let start = r.pos;
        for _ in 0..count {
            let range = r.range().ok_or(DecodeError::Truncated("range"))?;
            if range.len == 0 || range.start == 0 {
                return Err(DecodeError::Invalid("empty range or sequence number 0"));
            }
            if range.start.checked_add(u64::from(range.len)).is_none() {
                return Err(DecodeError::Invalid("range overflows"));
            }
        }
        Ok(RangesView {
            bytes: &r.buf[start..r.pos],
        })
    }

    /// Number of ranges.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len() / RANGE_LEN
    }

    /// Whether there are no ranges.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Iterates the ranges in packet order.
    #[must_use]
    pub fn iter(&self) -> RangesIter<'a> {
        RangesIter {
            r: Reader::new(self.bytes),
        }
    }
}

/// Iterator over validated ranges.
#[derive(Clone, Debug)]
pub struct RangesIter<'a> {
    r: Reader<'a>,
}

impl Iterator for RangesIter<'_> {
    type Item = SeqRange;

    fn next(&mut self) -> Option<SeqRange> {
        self.r.range()
    }
}

/// A validated token.
#[derive(Clone, Copy, Debug)]
pub struct TokenView<'a> {
    /// Level of the ring in the recovery hierarchy (0 = partition ring).
    pub level: u8,
    /// Index of the ring within its level.
    pub ring: u16,
    /// Round number, increased by the ring's leader for every token it releases.
    pub round: u64,
    records: &'a [u8],
    count: u16,
}

impl<'a> TokenView<'a> {
    fn validate(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let t = DecodeError::Truncated("token");
        let level = r.u8().ok_or(t)?;
        let ring = r.u16().ok_or(t)?;
        let round = r.u64().ok_or(t)?;
        let count = r.u16().ok_or(t)?;
        let start = r.pos;
        for _ in 0..count {
            let record = read_record(r).ok_or(DecodeError::Truncated("token record"))?;
            for list in [record.missing_all, record.lost, record.prev_missing] {
                RangesView::validate(&mut Reader::new(list.bytes), list.len())?;
            }
            if record.agg_contiguous > record.agg_max || record.prev_contiguous > record.prev_max {
                return Err(DecodeError::Invalid("token record contiguous beyond max"));
            }
        }
        Ok(TokenView {
            level,
            ring,
            round,
            records: &r.buf[start..r.pos],
            count,
        })
    }

    /// Number of records.
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Whether the token carries no record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Iterates the records in packet order.
    #[must_use]
    pub fn records(&self) -> RecordsIter<'a> {
        RecordsIter {
            r: Reader::new(self.records),
            left: self.count,
        }
    }
}

/// A validated token record.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    /// See [`Record::origin`].
    pub origin: NodeId,
    /// See [`Record::stable_upto`].
    pub stable_upto: u64,
    /// See [`Record::agg_contiguous`].
    pub agg_contiguous: u64,
    /// See [`Record::agg_max`].
    pub agg_max: u64,
    /// See [`Record::prev_contiguous`].
    pub prev_contiguous: u64,
    /// See [`Record::prev_max`].
    pub prev_max: u64,
    /// See [`Record::missing_all`].
    pub missing_all: RangesView<'a>,
    /// See [`Record::lost`].
    pub lost: RangesView<'a>,
    /// See [`Record::prev_missing`].
    pub prev_missing: RangesView<'a>,
}

fn read_record<'a>(r: &mut Reader<'a>) -> Option<RecordView<'a>> {
    let origin = NodeId(r.u32()?);
    let stable_upto = r.u64()?;
    let agg_contiguous = r.u64()?;
    let agg_max = r.u64()?;
    let prev_contiguous = r.u64()?;
    let prev_max = r.u64()?;
    let n_missing_all = usize::from(r.u8()?);
    let n_lost = usize::from(r.u8()?);
    let n_prev_missing = usize::from(r.u8()?);
    let mut list = |n: usize| {
        Some(RangesView {
            bytes: r.bytes(n * RANGE_LEN)?,
        })
    };
    let missing_all = list(n_missing_all)?;
    let lost = list(n_lost)?;
    let prev_missing = list(n_prev_missing)?;
    Some(RecordView {
        origin,
        stable_upto,
        agg_contiguous,
        agg_max,
        prev_contiguous,
        prev_max,
        missing_all,
        lost,
        prev_missing,
    })
}

/// Iterator over validated token records.
#[derive(Clone, Debug)]
pub struct RecordsIter<'a> {
    r: Reader<'a>,
    left: u16,
}

impl<'a> Iterator for RecordsIter<'a> {
    type Item = RecordView<'a>;

    fn next(&mut self) -> Option<RecordView<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        read_record(&mut self.r)
    }
}

/// A cursor writing into a caller-supplied buffer.
#[derive(Debug)]
struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), BufferFull> {
        let end = self.pos.checked_add(bytes.len()).ok_or(BufferFull)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(BufferFull)?
            .copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    fn header(&mut self, header: &Header) -> Result<(), BufferFull> {
        if self.remaining() < HEADER_LEN {
            return Err(BufferFull);
        }
        self.put(&MAGIC.to_be_bytes())?;
        self.put(&[VERSION, header.kind as u8])?;
        self.put(&header.incarnation.to_be_bytes())?;
        self.put(&header.region.0.to_be_bytes())?;
        self.put(&header.view.0.to_be_bytes())?;
        self.put(&header.sender.0.to_be_bytes())
    }

    fn range(&mut self, range: SeqRange) -> Result<(), BufferFull> {
        self.put(&range.start.to_be_bytes())?;
        self.put(&range.len.to_be_bytes())
    }

    fn patch_u16(&mut self, at: usize, value: u16) {
        self.buf[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }
}

fn with_kind(header: &Header, kind: Kind) -> Header {
    Header { kind, ..*header }
}

/// Packs messages into a data or retransmission packet.
#[derive(Debug)]
pub struct MessagesWriter<'a> {
    w: Writer<'a>,
    count_at: usize,
    count: u16,
}

impl<'a> MessagesWriter<'a> {
    /// Starts a data packet (the header's kind is set to [`Kind::Data`]).
    pub fn data(buf: &'a mut [u8], header: &Header) -> Result<Self, BufferFull> {
        let mut w = Writer::new(buf);
        if w.remaining() < HEADER_LEN + DATA_FIXED_LEN {
            return Err(BufferFull);
        }
        w.header(&with_kind(header, Kind::Data))?;
        let count_at = w.pos;
        w.put(&0u16.to_be_bytes())?;
        Ok(MessagesWriter {
            w,
            count_at,
            count: 0,
        })
    }

    /// Starts a retransmission of stream `origin` (the header's kind is set to
    /// [`Kind::Retransmit`]).
    pub fn retransmit(
        buf: &'a mut [u8],
        header: &Header,
        origin: NodeId,
    ) -> Result<Self, BufferFull> {
        let mut w = Writer::new(buf);
        if w.remaining() < HEADER_LEN + RETRANSMIT_FIXED_LEN {
            return Err(BufferFull);
        }
        w.header(&with_kind(header, Kind::Retransmit))?;
        w.put(&origin.0.to_be_bytes())?;
        let count_at = w.pos;
        w.put(&0u16.to_be_bytes())?;
        Ok(MessagesWriter {
            w,
            count_at,
            count: 0,
        })
    }

    /// Whether a message with a payload of `payload_len` bytes still fits.
    #[must_use]
    pub fn fits(&self, payload_len: usize) -> bool {
        self.count < u16::MAX
            && payload_len <= usize::from(u16::MAX)
            && MESSAGE_HEADER_LEN + payload_len <= self.w.remaining()
    }

    /// Appends one message, or fails without writing anything.
    pub fn push(&mut self, message: &Message<'_>) -> Result<(), BufferFull> {
        if !self.fits(message.payload.len()) {
            return Err(BufferFull);
        }
        let len = u16::try_from(message.payload.len()).map_err(|_| BufferFull)?;
        self.w.put(&message.seq.to_be_bytes())?;
        self.w.put(&message.msg_id.to_be_bytes())?;
        self.w.put(&message.timestamp_us.to_be_bytes())?;
        self.w.put(&message.topic.0.to_be_bytes())?;
        self.w.put(&len.to_be_bytes())?;
        self.w.put(message.payload)?;
        self.count += 1;
        Ok(())
    }

    /// Messages written so far.
    #[must_use]
    pub fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// Completes the packet and returns its length.
    #[must_use]
    pub fn finish(mut self) -> usize {
        let (at, count) = (self.count_at, self.count);
        self.w.patch_u16(at, count);
        self.w.pos
    }
}

/// Writes a token: its fixed part, then records pushed one by one.
#[derive(Debug)]
pub struct TokenWriter<'a> {
    w: Writer<'a>,
    count_at: usize,
    count: u16,
}

impl<'a> TokenWriter<'a> {
    /// Starts a token (the header's kind is set to [`Kind::Token`]).
    pub fn new(
        buf: &'a mut [u8],
        header: &Header,
        level: u8,
        ring: u16,
        round: u64,
    ) -> Result<Self, BufferFull> {
        let mut w = Writer::new(buf);
        if w.remaining() < HEADER_LEN + TOKEN_FIXED_LEN {
            return Err(BufferFull);
        }
        w.header(&with_kind(header, Kind::Token))?;
        w.put(&[level])?;
        w.put(&ring.to_be_bytes())?;
        w.put(&round.to_be_bytes())?;
        let count_at = w.pos;
        w.put(&0u16.to_be_bytes())?;
        Ok(TokenWriter {
            w,
            count_at,
            count: 0,
        })
    }

    /// Appends a record, or fails without writing anything. Each range list holds at most 255
    /// ranges.
    pub fn push(&mut self, record: &Record<'_>) -> Result<(), BufferFull> {
        let lens = [
            record.missing_all.len(),
            record.lost.len(),
            record.prev_missing.len(),
        ];
        if self.count == u16::MAX
            || lens.iter().any(|&n| n > usize::from(u8::MAX))
            || record.wire_len() > self.w.remaining()
        {
            return Err(BufferFull);
        }
        self.w.put(&record.origin.0.to_be_bytes())?;
        for v in [
            record.stable_upto,
            record.agg_contiguous,
            record.agg_max,
            record.prev_contiguous,
            record.prev_max,
        ] {
            self.w.put(&v.to_be_bytes())?;
        }
        // Each length is at most 255, checked above.
        self.w.put(&[lens[0] as u8, lens[1] as u8, lens[2] as u8])?;
        for list in [record.missing_all, record.lost, record.prev_missing] {
            for &range in list {
                self.w.range(range)?;
            }
        }
        self.count += 1;
        Ok(())
    }

    /// Bytes still free.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.w.remaining()
    }

    /// Completes the token and returns its length.
    #[must_use]
    pub fn finish(mut self) -> usize {
        let (at, count) = (self.count_at, self.count);
        self.w.patch_u16(at, count);
        self.w.pos
    }
}

/// Writes a silence heartbeat and returns its length.
pub fn write_silence(
    buf: &mut [u8],
    header: &Header,
    silence: &Silence,
) -> Result<usize, BufferFull> {
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + SILENCE_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, Kind::Silence))?;
    w.put(&silence.last_seq.to_be_bytes())?;
    w.put(&silence.timestamp_us.to_be_bytes())?;
    w.put(&silence.acked_upto.to_be_bytes())?;
    Ok(w.pos)
}

/// Writes an aggregate ACK and returns its length.
pub fn write_ack(
    buf: &mut [u8],
    header: &Header,
    origin: NodeId,
    stable_upto: u64,
) -> Result<usize, BufferFull> {
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + ACK_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, Kind::Ack))?;
    w.put(&origin.0.to_be_bytes())?;
    w.put(&stable_upto.to_be_bytes())?;
    Ok(w.pos)
}

/// Writes a congestion query and returns its length.
pub fn write_dcq(
    buf: &mut [u8],
    header: &Header,
    seq: u64,
    position_us: u64,
) -> Result<usize, BufferFull> {
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + DCQ_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, Kind::Dcq))?;
    w.put(&seq.to_be_bytes())?;
    w.put(&position_us.to_be_bytes())?;
    Ok(w.pos)
}

/// Writes a congestion alert and returns its length.
pub fn write_uca(
    buf: &mut [u8],
    header: &Header,
    origin: NodeId,
    seq: u64,
    min_nonrec_rate_milli: u32,
    min_rec_rate_milli: u32,
) -> Result<usize, BufferFull> {
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + UCA_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, Kind::Uca))?;
    w.put(&origin.0.to_be_bytes())?;
    w.put(&seq.to_be_bytes())?;
    w.put(&min_nonrec_rate_milli.to_be_bytes())?;
    w.put(&min_rec_rate_milli.to_be_bytes())?;
    Ok(w.pos)
}

/// Writes a token acknowledgement and returns its length.
pub fn write_token_ack(
    buf: &mut [u8],
    header: &Header,
    level: u8,
    ring: u16,
    round: u64,
) -> Result<usize, BufferFull> {
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + TOKEN_ACK_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, Kind::TokenAck))?;
    w.put(&[level])?;
    w.put(&ring.to_be_bytes())?;
    w.put(&round.to_be_bytes())?;
    Ok(w.pos)
}

/// Writes a NAK or pull request (`kind` must be [`Kind::Nak`] or [`Kind::Pull`]) with as many of
/// `ranges` as fit; returns the length and how many ranges were written.
pub fn write_ranges(
    buf: &mut [u8],
    header: &Header,
    kind: Kind,
    origin: NodeId,
    ranges: &[SeqRange],
) -> Result<(usize, usize), BufferFull> {
    debug_assert!(matches!(kind, Kind::Nak | Kind::Pull));
    let mut w = Writer::new(buf);
    if w.remaining() < HEADER_LEN + RANGES_FIXED_LEN {
        return Err(BufferFull);
    }
    w.header(&with_kind(header, kind))?;
    w.put(&origin.0.to_be_bytes())?;
    let count_at = w.pos;
    w.put(&0u16.to_be_bytes())?;
    let fit = (w.remaining() / RANGE_LEN)
        .min(ranges.len())
        .min(usize::from(u16::MAX));
    for &range in &ranges[..fit] {
        w.range(range)?;
    }
    // `fit` is at most u16::MAX.
    w.patch_u16(count_at, fit as u16);
    Ok((w.pos, fit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: Kind) -> Header {
        Header {
            kind,
            incarnation: 0xA1B2_C3D4,
            region: RegionId(7),
            view: ViewId(3),
            sender: NodeId(9),
        }
    }

    #[test]
    fn data_round_trip() {
        let mut buf = [0u8; 200];
        let mut w = MessagesWriter::data(&mut buf, &header(Kind::Data)).unwrap();
        let a = Message {
            seq: 1,
            msg_id: 10,
            timestamp_us: 5,
            topic: TopicId(2),
            payload: b"hi",
        };
        let b = Message {
            seq: 2,
            msg_id: 11,
            timestamp_us: 6,
            topic: TopicId(3),
            payload: b"",
        };
        w.push(&a).unwrap();
        w.push(&b).unwrap();
        let len = w.finish();
        let p = Packet::parse(&buf[..len]).unwrap();
        assert_eq!(p.header, header(Kind::Data));
        let Body::Data(m) = p.body else {
            panic!("not data")
        };
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![a, b]);
    }

    #[test]
    fn writer_refuses_what_does_not_fit() {
        let mut buf = [0u8; HEADER_LEN + DATA_FIXED_LEN + MESSAGE_HEADER_LEN + 3];
        let mut w = MessagesWriter::data(&mut buf, &header(Kind::Data)).unwrap();
        let m = Message {
            seq: 1,
            msg_id: 1,
            timestamp_us: 0,
            topic: TopicId(0),
            payload: b"abcd",
        };
        assert_eq!(w.push(&m), Err(BufferFull));
        assert_eq!(w.count(), 0);
        let m = Message {
            payload: b"abc",
            ..m
        };
        w.push(&m).unwrap();
        let len = w.finish();
        assert_eq!(len, buf.len());
    }

    #[test]
    fn rejects_truncation_and_trailing_bytes() {
        let mut buf = [0u8; 100];
        let (len, n) = write_ranges(
            &mut buf,
            &header(Kind::Pull),
            Kind::Pull,
            NodeId(1),
            &[SeqRange { start: 5, len: 2 }],
        )
        .unwrap();
        assert_eq!(n, 1);
        assert!(Packet::parse(&buf[..len]).is_ok());
        assert_eq!(
            Packet::parse(&buf[..len - 1]).unwrap_err(),
            DecodeError::Truncated("range")
        );
        assert_eq!(
            Packet::parse(&buf[..len + 1]).unwrap_err(),
            DecodeError::Trailing(1)
        );
        assert_eq!(Packet::parse(&buf[..3]).unwrap_err(), DecodeError::TooShort);
    }

    #[test]
    fn token_round_trip() {
        let mut buf = [0u8; 400];
        let mut w = TokenWriter::new(&mut buf, &header(Kind::Token), 1, 4, 99).unwrap();
        let r1 = [SeqRange { start: 3, len: 1 }];
        let r2 = [
            SeqRange { start: 8, len: 4 },
            SeqRange { start: 20, len: 1 },
        ];
        let rec = Record {
            origin: NodeId(5),
            stable_upto: 1,
            agg_contiguous: 2,
            agg_max: 30,
            prev_contiguous: 2,
            prev_max: 25,
            missing_all: &r1,
            lost: &[],
            prev_missing: &r2,
        };
        w.push(&rec).unwrap();
        let len = w.finish();
        let p = Packet::parse(&buf[..len]).unwrap();
        let Body::Token(t) = p.body else {
            panic!("not a token")
        };
        assert_eq!((t.level, t.ring, t.round, t.len()), (1, 4, 99, 1));
        let got = t.records().next().unwrap();
        assert_eq!(got.origin, NodeId(5));
        assert_eq!(got.missing_all.iter().collect::<Vec<_>>(), r1);
        assert!(got.lost.is_empty());
        assert_eq!(got.prev_missing.iter().collect::<Vec<_>>(), r2);
    }
}
