//! The checked encodings of the replicated service: log entries ([`Decision`]s with their time),
//! the Raft messages between replicas, and a replica's state file ([`Durable`]) (ADR 32).
//!
//! Same layout rules as [`crate::message`]: a tag byte, fields in order, integers
//! little-endian, every length checked against its bound and against the bytes left before
//! anything is allocated, so any input decodes to a value or an `Err`, never a panic.

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot};
use tidings_proto::Time;
use tidings_wire::{NodeId, RegionId};

use super::Durable;
use crate::acl::{AclAction, TopicRefusal, RULE_TEXT_BYTES_MAX};
use crate::message::{
    put_addr, put_len, put_names, put_string, put_string_max, put_u32, put_u64, DecodeError,
    Reader, NAMES_PER_REQUEST_MAX,
};
use crate::service::{Command, Decision, RemoveCause};

/// Version tag that starts every log entry.
const ENTRY_V1: u8 = 1;
/// Version tag that starts every replica-to-replica datagram.
const RAFT_V1: u8 = 0x52;

const D_COMMAND: u8 = 1;
const D_REQUEST_NONE: u8 = 2;
const D_REQUEST: u8 = 3;
const D_ACKED: u8 = 4;

const C_JOIN: u8 = 1;
const C_SUBSCRIBE: u8 = 2;
const C_SUBSCRIBE_MANY: u8 = 3;
const C_UNSUBSCRIBE: u8 = 4;
const C_UNSUBSCRIBE_MANY: u8 = 5;
const C_ADVERTISE: u8 = 6;
const C_ADVERTISE_MANY: u8 = 7;
const C_UNADVERTISE: u8 = 8;
const C_REMOVE: u8 = 9;
const C_INCARNATE: u8 = 10;
const C_DATAGRAM_KEY: u8 = 11;
const C_METRICS_AT: u8 = 12;
const C_REFUSE: u8 = 13;
const C_RENEW_REGION_KEY: u8 = 14;

/// Most voters (or learners) a snapshot's configuration lists.
const VOTERS_MAX: usize = 64;

/// Appends the encoding of a log entry: the leader's time and its decision.
pub fn encode_decision(at: Time, decision: &Decision, out: &mut Vec<u8>) {
    out.push(ENTRY_V1);
    put_u64(out, at.as_nanos());
    match decision {
        Decision::Command(cmd) => {
            out.push(D_COMMAND);
            encode_command(cmd, out);
        }
        Decision::Request {
            node,
            req,
            command: None,
        } => {
            out.push(D_REQUEST_NONE);
            put_u32(out, node.0);
            put_u64(out, *req);
        }
        Decision::Request {
            node,
            req,
            command: Some(cmd),
        } => {
            out.push(D_REQUEST);
            put_u32(out, node.0);
            put_u64(out, *req);
            encode_command(cmd, out);
        }
        Decision::Acked { node, upto } => {
            out.push(D_ACKED);
            put_u32(out, node.0);
            put_u64(out, *upto);
        }
    }
}

/// Decodes one log entry that must fill `buf` exactly.
pub fn decode_decision(buf: &[u8]) -> Result<(Time, Decision), DecodeError> {
    let mut r = Reader { buf };
    if r.u8()? != ENTRY_V1 {
        return Err(DecodeError::Invalid);
    }
    let at = Time::from_nanos(r.u64()?);
    let decision = match r.u8()? {
        D_COMMAND => Decision::Command(decode_command(&mut r)?),
        D_REQUEST_NONE => Decision::Request {
            node: NodeId(r.u32()?),
            req: r.u64()?,
            command: None,
        },
        D_REQUEST => Decision::Request {
            node: NodeId(r.u32()?),
            req: r.u64()?,
            command: Some(decode_command(&mut r)?),
        },
        D_ACKED => Decision::Acked {
            node: NodeId(r.u32()?),
            upto: r.u64()?,
        },
        t => return Err(DecodeError::Tag(t)),
    };
    if !r.buf.is_empty() {
        return Err(DecodeError::Trailing);
    }
    Ok((at, decision))
}

fn encode_command(cmd: &Command, out: &mut Vec<u8>) {
    let named = |out: &mut Vec<u8>, tag: u8, node: NodeId, name: &str| {
        out.push(tag);
        put_u32(out, node.0);
        put_string(out, name);
    };
    let many = |out: &mut Vec<u8>, tag: u8, node: NodeId, names: &[String]| {
        put_names(out, tag, names);
        put_u32(out, node.0);
    };
    match cmd {
        Command::Join { nonce, addr } => {
            out.push(C_JOIN);
            put_u64(out, *nonce);
            put_addr(out, *addr);
        }
        Command::Subscribe { node, name } => named(out, C_SUBSCRIBE, *node, name),
        Command::Unsubscribe { node, name } => named(out, C_UNSUBSCRIBE, *node, name),
        Command::Advertise { node, name } => named(out, C_ADVERTISE, *node, name),
        Command::Unadvertise { node, name } => named(out, C_UNADVERTISE, *node, name),
        Command::SubscribeMany { node, names } => many(out, C_SUBSCRIBE_MANY, *node, names),
        Command::UnsubscribeMany { node, names } => many(out, C_UNSUBSCRIBE_MANY, *node, names),
        Command::AdvertiseMany { node, names } => many(out, C_ADVERTISE_MANY, *node, names),
        Command::Remove { node, cause } => {
            out.push(C_REMOVE);
            put_u32(out, node.0);
            out.push(match cause {
                RemoveCause::Left => 0,
                RemoveCause::HeartbeatTimeout => 1,
                RemoveCause::Suspected => 2,
                RemoveCause::Unresponsive => 3,
            });
        }
        Command::Incarnate { incarnation } => {
            out.push(C_INCARNATE);
            put_u32(out, *incarnation);
        }
        Command::DatagramKey { id, secret } => {
            out.push(C_DATAGRAM_KEY);
            put_u32(out, *id);
            out.extend_from_slice(&secret.0);
        }
        Command::RenewRegionKey { region, id } => {
            out.push(C_RENEW_REGION_KEY);
            put_u32(out, region.0);
            put_u32(out, *id);
        }
        Command::MetricsAt { node, addr } => {
            out.push(C_METRICS_AT);
            put_u32(out, node.0);
            put_addr(out, *addr);
        }
        Command::Refuse {
            node,
            refusals,
            then,
        } => {
            out.push(C_REFUSE);
            put_u32(out, node.0);
            // At most one request's names (validated where the leader decides it).
            let refusals = &refusals[..refusals.len().min(NAMES_PER_REQUEST_MAX)];
            put_len(out, refusals.len());
            for r in refusals {
                put_string(out, &r.topic);
                out.push(match r.action {
                    AclAction::Publish => 0,
                    AclAction::Subscribe => 1,
                });
                put_string_max(out, &r.rule, RULE_TEXT_BYTES_MAX);
            }
            match then.as_deref() {
                // One level: a nested refusal is encoded as none (the leader never makes one).
                None | Some(Command::Refuse { .. }) => out.push(0),
                Some(cmd) => {
                    out.push(1);
                    encode_command(cmd, out);
                }
            }
        }
    }
}

fn decode_command(r: &mut Reader<'_>) -> Result<Command, DecodeError> {
    decode_command_in(r, false)
}

/// A command; `inner` when it is a [`Command::Refuse`]'s `then`, which may not be a refusal
/// itself (refused before reading further, so hostile input cannot nest them deeply).
fn decode_command_in(r: &mut Reader<'_>, inner: bool) -> Result<Command, DecodeError> {
    Ok(match r.u8()? {
        C_JOIN => Command::Join {
            nonce: r.u64()?,
            addr: r.addr()?,
        },
        tag @ (C_SUBSCRIBE | C_UNSUBSCRIBE | C_ADVERTISE | C_UNADVERTISE) => {
            let node = NodeId(r.u32()?);
            let name = r.string()?;
            match tag {
                C_SUBSCRIBE => Command::Subscribe { node, name },
                C_UNSUBSCRIBE => Command::Unsubscribe { node, name },
                C_ADVERTISE => Command::Advertise { node, name },
                _ => Command::Unadvertise { node, name },
            }
        }
        tag @ (C_SUBSCRIBE_MANY | C_UNSUBSCRIBE_MANY | C_ADVERTISE_MANY) => {
            // Each name takes at least its 2-byte length.
            let n = r.len(NAMES_PER_REQUEST_MAX, 2)?;
            let names: Vec<String> = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
            let node = NodeId(r.u32()?);
            match tag {
                C_SUBSCRIBE_MANY => Command::SubscribeMany { node, names },
                C_UNSUBSCRIBE_MANY => Command::UnsubscribeMany { node, names },
                _ => Command::AdvertiseMany { node, names },
            }
        }
        C_REMOVE => Command::Remove {
            node: NodeId(r.u32()?),
            cause: match r.u8()? {
                0 => RemoveCause::Left,
                1 => RemoveCause::HeartbeatTimeout,
                2 => RemoveCause::Suspected,
                3 => RemoveCause::Unresponsive,
                t => return Err(DecodeError::Tag(t)),
            },
        },
        C_INCARNATE => Command::Incarnate {
            incarnation: r.u32()?,
        },
        C_DATAGRAM_KEY => {
            let id = r.u32()?;
            let mut secret = [0u8; 32];
            secret.copy_from_slice(r.take(32)?);
            Command::DatagramKey {
                id,
                secret: crate::message::WireKey(secret),
            }
        }
        C_RENEW_REGION_KEY => Command::RenewRegionKey {
            region: RegionId(r.u32()?),
            id: r.u32()?,
        },
        C_METRICS_AT => Command::MetricsAt {
            node: NodeId(r.u32()?),
            addr: r.addr()?,
        },
        C_REFUSE if inner => return Err(DecodeError::Invalid),
        C_REFUSE => {
            let node = NodeId(r.u32()?);
            // Each refusal takes at least its two lengths and its action byte.
            let n = r.len(NAMES_PER_REQUEST_MAX, 5)?;
            let mut refusals = Vec::with_capacity(n);
            for _ in 0..n {
                let topic = r.string()?;
                let action = match r.u8()? {
                    0 => AclAction::Publish,
                    1 => AclAction::Subscribe,
                    t => return Err(DecodeError::Tag(t)),
                };
                let rule = r.string_max(RULE_TEXT_BYTES_MAX)?;
                refusals.push(TopicRefusal {
                    topic,
                    action,
                    rule,
                });
            }
            let then = match r.u8()? {
                0 => None,
                1 => Some(Box::new(decode_command_in(r, true)?)),
                t => return Err(DecodeError::Tag(t)),
            };
            Command::Refuse {
                node,
                refusals,
                then,
            }
        }
        t => return Err(DecodeError::Tag(t)),
    })
}

/// The Raft message types that travel between replicas. The others are a node's own inputs
/// (`MsgHup` starts an election, `MsgBeat` a heartbeat round ...): one arriving from the
/// network is refused, never stepped.
const REMOTE_TYPES: [MessageType; 10] = [
    MessageType::MsgAppend,
    MessageType::MsgAppendResponse,
    MessageType::MsgRequestVote,
    MessageType::MsgRequestVoteResponse,
    MessageType::MsgSnapshot,
    MessageType::MsgHeartbeat,
    MessageType::MsgHeartbeatResponse,
    MessageType::MsgTimeoutNow,
    MessageType::MsgRequestPreVote,
    MessageType::MsgRequestPreVoteResponse,
];

/// Bounds of a replica-to-replica message on decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaftLimits {
    /// Largest datagram accepted, in bytes (the snapshot included).
    pub message_bytes_max: usize,
    /// Most log entries in one message.
    pub entries_max: usize,
}

/// Appends the encoding of a Raft message (only the fields raft-rs uses between replicas of a
/// fixed configuration; priorities and conf changes are not used).
pub fn encode_raft(m: &Message, out: &mut Vec<u8>) {
    out.push(RAFT_V1);
    out.push(m.get_msg_type() as u8);
    for v in [
        m.to,
        m.from,
        m.term,
        m.log_term,
        m.index,
        m.commit,
        m.commit_term,
        m.request_snapshot,
        m.reject_hint,
    ] {
        put_u64(out, v);
    }
    out.push(u8::from(m.reject));
    put_len(out, m.entries.len());
    for e in m.get_entries() {
        put_u64(out, e.term);
        put_u64(out, e.index);
        put_bytes(out, e.get_data());
    }
    put_bytes(out, m.get_context());
    if m.has_snapshot() {
        out.push(1);
        let s = m.get_snapshot();
        let md = s.get_metadata();
        put_u64(out, md.index);
        put_u64(out, md.term);
        let cs = md.get_conf_state();
        put_len(out, cs.voters.len());
        for v in &cs.voters {
            put_u64(out, *v);
        }
        put_bytes(out, s.get_data());
    } else {
        out.push(0);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

fn bytes_field(r: &mut Reader<'_>, max: usize) -> Result<bytes::Bytes, DecodeError> {
    let n = r.len(max, 1)?;
    Ok(bytes::Bytes::copy_from_slice(r.take(n)?))
}

/// Decodes one replica-to-replica message that must fill `buf` exactly, within `limits`.
pub fn decode_raft(buf: &[u8], limits: RaftLimits) -> Result<Message, DecodeError> {
    if buf.len() > limits.message_bytes_max {
        return Err(DecodeError::TooLong);
    }
    let mut r = Reader { buf };
    if r.u8()? != RAFT_V1 {
        return Err(DecodeError::Invalid);
    }
    let tag = r.u8()?;
    let Some(&msg_type) = REMOTE_TYPES.iter().find(|t| **t as u8 == tag) else {
        return Err(DecodeError::Tag(tag));
    };
    let mut m = Message::default();
    m.set_msg_type(msg_type);
    m.to = r.u64()?;
    m.from = r.u64()?;
    m.term = r.u64()?;
    m.log_term = r.u64()?;
    m.index = r.u64()?;
    m.commit = r.u64()?;
    m.commit_term = r.u64()?;
    m.request_snapshot = r.u64()?;
    m.reject_hint = r.u64()?;
    m.reject = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError::Invalid),
    };
    // Each entry takes at least its term, index and data length.
    let n = r.len(limits.entries_max, 20)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryNormal);
        e.term = r.u64()?;
        e.index = r.u64()?;
        e.data = bytes_field(&mut r, limits.message_bytes_max)?;
        entries.push(e);
    }
    m.set_entries(entries.into());
    m.context = bytes_field(&mut r, limits.message_bytes_max)?;
    match r.u8()? {
        0 => {}
        1 => {
            let mut s = Snapshot::default();
            let md = s.mut_metadata();
            md.index = r.u64()?;
            md.term = r.u64()?;
            let voters = r.len(VOTERS_MAX, 8)?;
            let mut cs = ConfState::default();
            for _ in 0..voters {
                cs.voters.push(r.u64()?);
            }
            md.set_conf_state(cs);
            s.data = bytes_field(&mut r, limits.message_bytes_max)?;
            m.set_snapshot(s);
        }
        _ => return Err(DecodeError::Invalid),
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::Trailing);
    }
    Ok(m)
}

/// The first bytes of a replica's state file ([`encode_durable`]).
pub const DURABLE_MAGIC: [u8; 4] = *b"TGRS";
/// The state file format this build writes and reads.
pub const DURABLE_VERSION: u8 = 2;
/// Magic, version, and the CRC-32 at the end.
const DURABLE_FRAME_BYTES: usize = DURABLE_MAGIC.len() + 1 + 4;

const ENTRY_NORMAL: u8 = 0;
const ENTRY_CONF_CHANGE: u8 = 1;
const ENTRY_CONF_CHANGE_V2: u8 = 2;

/// Bounds of a replica's state file on decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurableLimits {
    /// Largest file accepted, in bytes. Default 256 MiB.
    pub bytes_max: usize,
    /// Most log entries. Default 1,048,576.
    pub entries_max: usize,
}

impl Default for DurableLimits {
    fn default() -> Self {
        DurableLimits {
            bytes_max: 256 << 20,
            entries_max: 1 << 20,
        }
    }
}

/// A replica's state file, decoded: which replica of how many wrote it, and its [`Durable`].
#[derive(Clone, Debug)]
pub struct DurableFile {
    /// The index of the replica that wrote it.
    pub index: usize,
    /// How many replicas its service has.
    pub replicas: usize,
    /// What it kept.
    pub durable: Durable,
}

/// Why a replica's state file was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurableError {
    /// The file is longer than the bound.
    #[error("{len} bytes, beyond the bound of {max} bytes")]
    TooLong {
        /// The file's length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The file is too short to hold even its header and checksum.
    #[error("truncated ({0} bytes)")]
    Truncated(usize),
    /// The file does not start with [`DURABLE_MAGIC`].
    #[error("not a replica state file (bad magic)")]
    Magic,
    /// A format version this build does not read.
    #[error("format version {0} is not supported (this build reads version 2)")]
    Version(u8),
    /// The CRC-32 at the end does not match the bytes before it.
    #[error(
        "checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is corrupt"
    )]
    Checksum {
        /// The checksum the file ends with.
        stored: u32,
        /// The checksum of the bytes before it.
        computed: u32,
    },
    /// The body does not decode.
    #[error("undecodable: {0}")]
    Body(#[from] DecodeError),
    /// The body decodes but no replica could have kept it (a log with a gap, a commit beyond
    /// the log, a snapshot of another configuration ...).
    #[error("inconsistent: {0}")]
    Inconsistent(&'static str),
}

/// Appends the state file of replica `index` of `replicas`: [`DURABLE_MAGIC`], the version
/// byte, the body (the replica's index and count, Raft's hard state, the snapshot with its
/// metadata, the log entries after it), and a CRC-32 of everything before it, little-endian.
pub fn encode_durable(index: usize, replicas: usize, durable: &Durable, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&DURABLE_MAGIC);
    out.push(DURABLE_VERSION);
    put_u32(out, u32::try_from(index).unwrap_or(u32::MAX));
    put_u32(out, u32::try_from(replicas).unwrap_or(u32::MAX));
    let hs = &durable.hard_state;
    put_u64(out, hs.term);
    put_u64(out, hs.vote);
    put_u64(out, hs.commit);
    let s = &durable.snapshot;
    let md = s.get_metadata();
    put_u64(out, md.index);
    put_u64(out, md.term);
    let voters = &md.get_conf_state().voters;
    put_len(out, voters.len());
    for v in voters {
        put_u64(out, *v);
    }
    put_bytes(out, s.get_data());
    put_len(out, durable.entries.len());
    for e in &durable.entries {
        out.push(match e.get_entry_type() {
            EntryType::EntryNormal => ENTRY_NORMAL,
            EntryType::EntryConfChange => ENTRY_CONF_CHANGE,
            EntryType::EntryConfChangeV2 => ENTRY_CONF_CHANGE_V2,
        });
        put_u64(out, e.term);
        put_u64(out, e.index);
        put_bytes(out, e.get_data());
        put_bytes(out, e.get_context());
    }
    let crc = crc32fast::hash(out.get(start..).unwrap_or_default());
    put_u32(out, crc);
}

/// Decodes a replica's state file that must fill `buf` exactly, within `limits`. The file is
/// untrusted: every length is bounded, the checksum is checked before the body is read, and a
/// state that decodes must also be one a replica could have kept ([`Durable`]'s consistency:
/// a contiguous log after the snapshot, the commit within it, the snapshot's voters those of
/// `replicas`), so [`Replica::restart`](super::Replica::restart) takes it without panicking.
pub fn decode_durable(buf: &[u8], limits: DurableLimits) -> Result<DurableFile, DurableError> {
    if buf.len() > limits.bytes_max {
        return Err(DurableError::TooLong {
            len: buf.len(),
            max: limits.bytes_max,
        });
    }
    if buf.len() < DURABLE_FRAME_BYTES {
        return Err(DurableError::Truncated(buf.len()));
    }
    let (framed, crc) = buf.split_at(buf.len() - 4);
    let (magic, rest) = framed.split_at(DURABLE_MAGIC.len());
    if magic != DURABLE_MAGIC {
        return Err(DurableError::Magic);
    }
    let (&version, body) = rest
        .split_first()
        .ok_or(DurableError::Truncated(buf.len()))?;
    if version != DURABLE_VERSION {
        return Err(DurableError::Version(version));
    }
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let computed = crc32fast::hash(framed);
    if stored != computed {
        return Err(DurableError::Checksum { stored, computed });
    }
    let mut r = Reader { buf: body };
    let index = r.u32()? as usize;
    let replicas = r.u32()? as usize;
    if replicas == 0 || replicas > super::REPLICAS_MAX || index >= replicas {
        return Err(DurableError::Inconsistent(
            "replica index and count out of range",
        ));
    }
    let hard_state = HardState {
        term: r.u64()?,
        vote: r.u64()?,
        commit: r.u64()?,
        ..HardState::default()
    };
    let mut snapshot = Snapshot::default();
    let (md_index, md_term) = (r.u64()?, r.u64()?);
    let voters = r.len(VOTERS_MAX, 8)?;
    let mut cs = ConfState::default();
    for _ in 0..voters {
        cs.voters.push(r.u64()?);
    }
    // No snapshot yet is one without metadata, as a fresh replica holds it.
    if md_index != 0 || md_term != 0 || !cs.voters.is_empty() {
        let md = snapshot.mut_metadata();
        md.index = md_index;
        md.term = md_term;
        md.set_conf_state(cs);
    }
    snapshot.data = bytes_field(&mut r, limits.bytes_max)?;
    // Each entry takes at least its type, term, index and two lengths.
    let n = r.len(limits.entries_max, 25)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let mut e = Entry::default();
        e.set_entry_type(match r.u8()? {
            ENTRY_NORMAL => EntryType::EntryNormal,
            ENTRY_CONF_CHANGE => EntryType::EntryConfChange,
            ENTRY_CONF_CHANGE_V2 => EntryType::EntryConfChangeV2,
            t => return Err(DecodeError::Tag(t).into()),
        });
        e.term = r.u64()?;
        e.index = r.u64()?;
        e.data = bytes_field(&mut r, limits.bytes_max)?;
        e.context = bytes_field(&mut r, limits.bytes_max)?;
        entries.push(e);
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::Trailing.into());
    }
    let durable = Durable {
        hard_state,
        snapshot,
        entries,
    };
    durable
        .check(replicas)
        .map_err(DurableError::Inconsistent)?;
    Ok(DurableFile {
        index,
        replicas,
        durable,
    })
}
