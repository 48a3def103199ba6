//! Packet formats of the tidings region protocol.
//!
//! Every packet starts with a [`Header`] followed by a body whose layout depends on the [`Kind`].
//! All integers are big-endian. The header (20 bytes, wire version 2) is `magic u16 ("TD"),
//! version u8, kind u8, incarnation u32, region u32, view u32, sender u32`. The incarnation is
//! the membership service's (drawn when a service starts without state, kept by its replicas
//! and its data directory): a service restarted without its state numbers regions, views and
//! topics again from the start, and the incarnation is what tells its packets from those of
//! the views it lost, so a node drops every packet whose incarnation is not its own
//! ([`peek_incarnation`], before parsing). Nodes without a service use 0.
//!
//! Reading: [`Packet::parse`] checks the whole packet once (every count and length against the
//! bytes actually present, no trailing garbage) and returns views that borrow the buffer; iterating a
//! view afterwards cannot fail and nothing is allocated. Writing: the writers ([`MessagesWriter`],
//! [`TokenWriter`] and the `write_*` functions) encode straight into a caller-supplied buffer at
//! the moment a socket can send, as docs/design.md section 4 describes.
//!
//! Layouts (byte offsets within the body, after the 20-byte header):
//!
//! | kind | body |
//! | --- | --- |
//! | Data | count u16, then `count` messages |
//! | Retransmit | origin u32, count u16, then `count` messages |
//! | Silence | last_seq u64, timestamp_us u64, acked_upto u64 |
//! | Token | level u8, ring u16, round u64, count u16, then `count` records |
//! | Ack | origin u32, stable_upto u64 |
//! | Nak, Pull | origin u32, count u16, then `count` ranges |
//! | TokenAck | level u8, ring u16, round u64 |
//! | Dcq | seq u64, position_us u64 |
//! | Uca | origin u32, seq u64, min_nonrec_rate_milli u32, min_rec_rate_milli u32 |
//!
//! A message is `seq u64, msg_id u64, timestamp_us u64, topic u32, len u16, payload[len]`; a range
//! is `start u64, len u32`; a token record is `origin u32, stable_upto u64, agg_contiguous u64,
//! agg_max u64, prev_contiguous u64, prev_max u64, n_missing_all u8, n_lost u8, n_prev_missing u8`
//! followed by the three range lists in that order.

#![forbid(unsafe_code)]

mod codec;
mod ids;

pub use codec::{
    peek_incarnation, peek_kind, peek_region, stamp_incarnation, write_ack, write_dcq,
    write_ranges, write_silence, write_token_ack, write_uca, Body, BufferFull, DecodeError, Header,
    Kind, Message, MessagesIter, MessagesView, MessagesWriter, Packet, Priority, RangesIter,
    RangesView, Record, RecordView, RecordsIter, Silence, TokenView, TokenWriter, HEADER_LEN,
    MAGIC, MESSAGE_HEADER_LEN, RANGE_LEN, RECORD_FIXED_LEN, VERSION,
};
pub use ids::{MsgId, NodeId, RegionId, SeqNo, SeqRange, TopicId, ViewId};
