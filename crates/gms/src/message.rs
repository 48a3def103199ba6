//! The messages between the GMS and its clients, and their checked binary encoding.
//!
//! Layout: one tag byte, then the fields in order, integers little-endian, strings and lists
//! prefixed by a `u16` (strings) or `u32` (lists) length. Decoding checks every length against the
//! bytes left and against the bounds below, so a malformed message is an `Err`, never a panic,
//! and never allocates more than the message's own size.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tidings_proto::RegionView;

use crate::acl::{AclAction, TopicRefusal, RULE_TEXT_BYTES_MAX};
use tidings_wire::{NodeId, RegionId, TopicId, ViewId};

/// Longest topic name, in bytes.
pub const TOPIC_NAME_BYTES_MAX: usize = 256;
/// Most members of one region view on the wire.
pub const REGION_MEMBERS_MAX: usize = 65_536;
/// Most topics of one region view, or regions of one topic, on the wire.
pub const LIST_MAX: usize = 65_536;
/// Most update items in one [`GmsMessage::Update`].
pub const ITEMS_PER_UPDATE_MAX: usize = 4096;
/// Most names in one [`Request::SubscribeMany`] or [`Request::AdvertiseMany`]: 128 names of at most
/// [`TOPIC_NAME_BYTES_MAX`] bytes keep the request within 33 KB, one datagram.
pub const NAMES_PER_REQUEST_MAX: usize = 128;

/// How the members of a region are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RegionAddress {
    /// One IP multicast group (IPv4 address and UDP port) from the configured pool.
    Multicast {
        /// The IPv4 group address.
        group: [u8; 4],
        /// The UDP port.
        port: u16,
    },
    /// No multicast address: senders fan out by unicast to the members of the view.
    Unicast,
}

/// A region view as the GMS issues it: the protocol's view plus how to reach the region.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GmsRegionView {
    /// The view (members in partitions, ring order, epoch, topics).
    pub view: RegionView,
    /// The region's address.
    pub address: RegionAddress,
}

/// What a client asks of the GMS (sent reliably, in order, as [`GmsMessage::Request`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Subscribe to the topic of this name (created if new).
    Subscribe(String),
    /// Subscribe to each of these topics (at most [`NAMES_PER_REQUEST_MAX`]): one view change for
    /// all of them, where one request per topic makes a node that subscribes to thousands pay
    /// a view change (linear in its region's topics) per topic.
    SubscribeMany(Vec<String>),
    /// Unsubscribe from the topic of this name.
    Unsubscribe(String),
    /// Unsubscribe from each of these topics (at most [`NAMES_PER_REQUEST_MAX`]): one view
    /// change for all of them, where one request per topic moves the node through a region
    /// per topic, each a view change of the streams in it.
    UnsubscribeMany(Vec<String>),
    /// Declare that this node publishes on the topic of this name: it is then told the regions
    /// the topic spans, member or not.
    Advertise(String),
    /// [`Advertise`](Request::Advertise) each of these topics (at most
    /// [`NAMES_PER_REQUEST_MAX`]), in one update of the node's membership.
    AdvertiseMany(Vec<String>),
    /// Withdraw an [`Advertise`](Request::Advertise).
    Unadvertise(String),
    /// This node's ring neighbour seems dead (missed tokens or heartbeats).
    Suspect(NodeId),
    /// Leave the system.
    Leave,
    /// Where this node serves its metrics (`GET /metrics`), or `None` when it serves none: kept
    /// in the member table (replicated like the rest of it) so that operators' tools find the
    /// members' endpoints through the service.
    MetricsAt(Option<SocketAddr>),
    /// The region key of this id ([`Item::RegionKey`]) has sealed three quarters of what one
    /// sender may seal under it (`SealingKey::needs_rotation`): the service replaces it if it
    /// is still its region's current key (ids are unique over all regions).
    RenewDatagramKey(u32),
}

/// One element of a node's update stream. A [`Commit`](Item::Commit) ends each consistent batch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Item {
    /// The id the GMS gave a topic this node subscribed to or advertised.
    TopicBound {
        /// The topic's name.
        name: String,
        /// Its id.
        topic: TopicId,
    },
    /// A new or newer view of a region this node is in or publishes to.
    Region(GmsRegionView),
    /// A region this node no longer needs to know (it left it, or the region is gone).
    RegionGone(RegionId),
    /// The regions a topic this node publishes on now spans.
    TopicRegions {
        /// The topic.
        topic: TopicId,
        /// Its regions.
        regions: Vec<RegionId>,
    },
    /// This node no longer publishes on (or the system no longer has) this topic.
    TopicGone(TopicId),
    /// Where a node that appears in this node's region views (as a member, or as a publisher of
    /// one of their topics) receives datagrams. Sent once per node, before the first view that
    /// needs it.
    NodeAddress {
        /// The node.
        node: NodeId,
        /// Its unicast data address.
        addr: SocketAddr,
    },
    /// The end of a batch: the membership is consistent; use it.
    Commit,
    /// This node was removed (declared failed, or it left). Rejoin to take part again.
    Removed,
    /// The key that seals the protocol datagrams of `region` from now on (ADR 43; sent only
    /// to the nodes sent the region's view, over their encrypted GMS link): seal with it at
    /// once, and open with the region's previous key for a grace period. Ids are nonzero and
    /// grow with every key the service makes, over all regions. A node loses a region's key
    /// with its view ([`RegionGone`](Item::RegionGone)).
    RegionKey {
        /// The region whose datagrams (by their header's region) the key seals.
        region: RegionId,
        /// The key's id, carried in clear in every datagram sealed with it.
        id: u32,
        /// Its secret.
        secret: WireKey,
    },
    /// The service's access rules refused this node's subscription to, or advertisement of,
    /// a topic (`GmsConfig::acl`): the node is not in the topic's regions and does not
    /// publish on it. The topic name is at most [`TOPIC_NAME_BYTES_MAX`] bytes, the rule at
    /// most [`RULE_TEXT_BYTES_MAX`](crate::acl::RULE_TEXT_BYTES_MAX).
    Refused(TopicRefusal),
}

/// The 32 secret bytes of a datagram key inside an update item: printed redacted, so a debug
/// log of the update stream never shows a key.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireKey(pub [u8; 32]);

impl std::fmt::Debug for WireKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WireKey(..)")
    }
}

/// A message between a client and the GMS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GmsMessage {
    /// Client to GMS: please give me a node id. `nonce` identifies the joiner until then.
    Join {
        /// The joiner's random nonce.
        nonce: u64,
        /// Where the joiner receives protocol datagrams, if it says. A host may fill in the
        /// source address of the datagram instead (see `tidings_runtime`).
        addr: Option<SocketAddr>,
    },
    /// GMS to joiner: your node id, and the service's incarnation, which the protocol node
    /// writes in every packet (packets of another incarnation are dropped).
    Welcome {
        /// The joiner's nonce.
        nonce: u64,
        /// The node id given.
        node: NodeId,
        /// The service's incarnation (nonzero).
        incarnation: u32,
    },
    /// Client to GMS: request number `req` (1, 2, 3 ... per node).
    Request {
        /// The request's sequence number.
        req: u64,
        /// The request.
        body: Request,
    },
    /// GMS to client: requests up to `upto` are applied.
    RequestAck {
        /// Highest request applied.
        upto: u64,
    },
    /// Client to GMS: I am alive.
    Heartbeat,
    /// GMS to client: items `seq`, `seq + 1` ... of the node's update stream (numbered 1, 2, 3
    /// ... per node), packed into one datagram. `seq` 0 is outside the stream: a lone
    /// [`Item::Removed`] told to a node the GMS no longer keeps a stream for.
    Update {
        /// The sequence number of the first item.
        seq: u64,
        /// The items, in stream order (1..=[`ITEMS_PER_UPDATE_MAX`]).
        items: Vec<Item>,
    },
    /// Client to GMS: update items up to `upto` are received.
    Ack {
        /// Highest item received in order.
        upto: u64,
    },
    /// GMS to joiner: `nonce` is already a member's (the `Join` came from another address);
    /// draw another and join again.
    NonceTaken {
        /// The joiner's nonce.
        nonce: u64,
    },
    /// GMS to client: a ring neighbour suspects you; answer at once (with a
    /// [`Heartbeat`](GmsMessage::Heartbeat)). Sent a few times over the suspicion timeout, so
    /// that a live node is not removed for two lost heartbeats.
    Probe,
    /// Replicated GMS leader to client: `msg`, sent by the leader of Raft term `term` (ADR 32).
    /// A client refuses what comes stamped with a term older than one it has seen, so a
    /// deposed leader's late updates and views are never used. `msg` is never itself stamped.
    Stamped {
        /// The term of the leader that sent it.
        term: u64,
        /// The message.
        msg: Box<GmsMessage>,
    },
    /// Replicated GMS follower to client: I do not serve clients; the leader of term `term` is
    /// replica `leader`, if known.
    Redirect {
        /// The latest term this replica knows.
        term: u64,
        /// The index of the leader replica (`0..replicas`), if known.
        leader: Option<u32>,
    },
}

/// Why a message failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ended early.
    #[error("message truncated")]
    Truncated,
    /// Bytes left over after the message.
    #[error("trailing bytes")]
    Trailing,
    /// Unknown tag byte.
    #[error("unknown tag {0}")]
    Tag(u8),
    /// A length beyond its bound.
    #[error("length beyond bound")]
    TooLong,
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// A field with an impossible value (empty partition, zero id ...).
    #[error("invalid field")]
    Invalid,
}

/// A checked cursor over untrusted bytes (shared with the replica codec).
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A list length, checked against `max` and against the bytes left (each element takes at
    /// least `elem_bytes_min`), so a forged length cannot make us allocate.
    pub(crate) fn len(&mut self, max: usize, elem_bytes_min: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(elem_bytes_min) > self.buf.len() {
            return Err(DecodeError::TooLong);
        }
        Ok(n)
    }
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        self.string_max(TOPIC_NAME_BYTES_MAX)
    }
    /// A string of at most `max` bytes.
    pub(crate) fn string_max(&mut self, max: usize) -> Result<String, DecodeError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(DecodeError::TooLong);
        }
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Utf8)
    }
    pub(crate) fn addr(&mut self) -> Result<Option<SocketAddr>, DecodeError> {
        let ip = match self.u8()? {
            ADDR_NONE => return Ok(None),
            ADDR_V4 => {
                let b = self.take(4)?;
                IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            }
            ADDR_V6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(self.take(16)?);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            t => return Err(DecodeError::Tag(t)),
        };
        Ok(Some(SocketAddr::new(ip, self.u16()?)))
    }
    fn ids(&mut self, max: usize) -> Result<Vec<u32>, DecodeError> {
        let n = self.len(max, 4)?;
        (0..n).map(|_| self.u32()).collect()
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}
/// A request's tag and its list of names (at most [`NAMES_PER_REQUEST_MAX`]: validated at the
/// API, cut here so that the encoder stays total).
pub(crate) fn put_names(out: &mut Vec<u8>, tag: u8, names: &[String]) {
    out.push(tag);
    let names = &names[..names.len().min(NAMES_PER_REQUEST_MAX)];
    put_len(out, names.len());
    for n in names {
        put_string(out, n);
    }
}

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    put_string_max(out, s, TOPIC_NAME_BYTES_MAX);
}

/// A string cut to at most `max` bytes (at most `u16::MAX`).
pub(crate) fn put_string_max(out: &mut Vec<u8>, s: &str, max: usize) {
    // Names are validated at the API (`TOPIC_NAME_BYTES_MAX`); truncating here keeps the encoder
    // total. A truncated multi-byte character would fail decoding, which is counted, not a panic.
    let b = &s.as_bytes()[..s.len().min(max).min(usize::from(u16::MAX))];
    put_u16(out, b.len() as u16);
    out.extend_from_slice(b);
}

const T_JOIN: u8 = 1;
const T_WELCOME: u8 = 2;
const T_REQUEST: u8 = 3;
const T_REQUEST_ACK: u8 = 4;
const T_HEARTBEAT: u8 = 5;
const T_UPDATE: u8 = 6;
const T_ACK: u8 = 7;
const T_PROBE: u8 = 8;
const T_NONCE_TAKEN: u8 = 9;
const T_STAMPED: u8 = 10;
const T_REDIRECT: u8 = 11;

const R_SUBSCRIBE: u8 = 1;
const R_UNSUBSCRIBE: u8 = 2;
const R_ADVERTISE: u8 = 3;
const R_UNADVERTISE: u8 = 4;
const R_SUSPECT: u8 = 5;
const R_LEAVE: u8 = 6;
const R_SUBSCRIBE_MANY: u8 = 7;
const R_ADVERTISE_MANY: u8 = 8;
const R_UNSUBSCRIBE_MANY: u8 = 9;
const R_METRICS_AT: u8 = 10;
const R_RENEW_DATAGRAM_KEY: u8 = 11;

const I_TOPIC_BOUND: u8 = 1;
const I_REGION: u8 = 2;
const I_REGION_GONE: u8 = 3;
const I_TOPIC_REGIONS: u8 = 4;
const I_TOPIC_GONE: u8 = 5;
const I_COMMIT: u8 = 6;
const I_REMOVED: u8 = 7;
const I_NODE_ADDRESS: u8 = 8;
// 9 was the one group-wide datagram key of ADR 40, which the service no longer sends.
const I_REFUSED: u8 = 10;
const I_REGION_KEY: u8 = 11;

const ACTION_PUBLISH: u8 = 0;
const ACTION_SUBSCRIBE: u8 = 1;

const ADDR_NONE: u8 = 0;
const ADDR_V4: u8 = 4;
const ADDR_V6: u8 = 6;

const A_UNICAST: u8 = 0;
const A_MULTICAST: u8 = 1;

impl GmsMessage {
    /// Appends the encoding of the message to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            GmsMessage::Join { nonce, addr } => {
                out.push(T_JOIN);
                put_u64(out, *nonce);
                put_addr(out, *addr);
            }
            GmsMessage::Welcome {
                nonce,
                node,
                incarnation,
            } => {
                out.push(T_WELCOME);
                put_u64(out, *nonce);
                put_u32(out, node.0);
                put_u32(out, *incarnation);
            }
            GmsMessage::Request { req, body } => {
                out.push(T_REQUEST);
                put_u64(out, *req);
                match body {
                    Request::Subscribe(n) => {
                        out.push(R_SUBSCRIBE);
                        put_string(out, n);
                    }
                    Request::SubscribeMany(names) => put_names(out, R_SUBSCRIBE_MANY, names),
                    Request::AdvertiseMany(names) => put_names(out, R_ADVERTISE_MANY, names),
                    Request::UnsubscribeMany(names) => {
                        put_names(out, R_UNSUBSCRIBE_MANY, names);
                    }
                    Request::Unsubscribe(n) => {
                        out.push(R_UNSUBSCRIBE);
                        put_string(out, n);
                    }
                    Request::Advertise(n) => {
                        out.push(R_ADVERTISE);
                        put_string(out, n);
                    }
                    Request::Unadvertise(n) => {
                        out.push(R_UNADVERTISE);
                        put_string(out, n);
                    }
                    Request::MetricsAt(addr) => {
                        out.push(R_METRICS_AT);
                        put_addr(out, *addr);
                    }
                    Request::RenewDatagramKey(id) => {
                        out.push(R_RENEW_DATAGRAM_KEY);
                        put_u32(out, *id);
                    }
                    Request::Suspect(node) => {
                        out.push(R_SUSPECT);
                        put_u32(out, node.0);
                    }
                    Request::Leave => out.push(R_LEAVE),
                }
            }
            GmsMessage::RequestAck { upto } => {
                out.push(T_REQUEST_ACK);
                put_u64(out, *upto);
            }
            GmsMessage::Heartbeat => out.push(T_HEARTBEAT),
            GmsMessage::Update { seq, items } => {
                out.push(T_UPDATE);
                put_u64(out, *seq);
                put_len(out, items.len());
                for item in items {
                    encode_item(item, out);
                }
            }
            GmsMessage::Ack { upto } => {
                out.push(T_ACK);
                put_u64(out, *upto);
            }
            GmsMessage::Probe => out.push(T_PROBE),
            GmsMessage::NonceTaken { nonce } => {
                out.push(T_NONCE_TAKEN);
                put_u64(out, *nonce);
            }
            GmsMessage::Stamped { term, msg } => {
                out.push(T_STAMPED);
                put_u64(out, *term);
                msg.encode(out);
            }
            GmsMessage::Redirect { term, leader } => {
                out.push(T_REDIRECT);
                put_u64(out, *term);
                match leader {
                    None => out.push(0),
                    Some(i) => {
                        out.push(1);
                        put_u32(out, *i);
                    }
                }
            }
        }
    }

    /// The encoding as a new vector.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }

    /// Decodes one message that must fill `buf` exactly.
    pub fn decode(buf: &[u8]) -> Result<GmsMessage, DecodeError> {
        let mut r = Reader { buf };
        if r.buf.first() == Some(&T_STAMPED) {
            r.u8()?;
            let term = r.u64()?;
            // One level only: a stamped message inside is refused, so decoding never recurses.
            if r.buf.first() == Some(&T_STAMPED) {
                return Err(DecodeError::Invalid);
            }
            let msg = Box::new(GmsMessage::decode(r.buf)?);
            return Ok(GmsMessage::Stamped { term, msg });
        }
        let msg = match r.u8()? {
            T_JOIN => GmsMessage::Join {
                nonce: r.u64()?,
                addr: r.addr()?,
            },
            T_WELCOME => GmsMessage::Welcome {
                nonce: r.u64()?,
                node: NodeId(r.u32()?),
                incarnation: r.u32()?,
            },
            T_REQUEST => {
                let req = r.u64()?;
                let body = match r.u8()? {
                    R_SUBSCRIBE => Request::Subscribe(r.string()?),
                    tag @ (R_SUBSCRIBE_MANY | R_ADVERTISE_MANY | R_UNSUBSCRIBE_MANY) => {
                        // Each name takes at least its 2-byte length.
                        let n = r.len(NAMES_PER_REQUEST_MAX, 2)?;
                        let names = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
                        match tag {
                            R_SUBSCRIBE_MANY => Request::SubscribeMany(names),
                            R_ADVERTISE_MANY => Request::AdvertiseMany(names),
                            _ => Request::UnsubscribeMany(names),
                        }
                    }
                    R_UNSUBSCRIBE => Request::Unsubscribe(r.string()?),
                    R_ADVERTISE => Request::Advertise(r.string()?),
                    R_UNADVERTISE => Request::Unadvertise(r.string()?),
                    R_SUSPECT => Request::Suspect(NodeId(r.u32()?)),
                    R_LEAVE => Request::Leave,
                    // A fixed-size address (at most 19 bytes), checked against the bytes left.
                    R_METRICS_AT => Request::MetricsAt(r.addr()?),
                    R_RENEW_DATAGRAM_KEY => Request::RenewDatagramKey(r.u32()?),
                    t => return Err(DecodeError::Tag(t)),
                };
                GmsMessage::Request { req, body }
            }
            T_REQUEST_ACK => GmsMessage::RequestAck { upto: r.u64()? },
            T_HEARTBEAT => GmsMessage::Heartbeat,
            T_UPDATE => {
                let seq = r.u64()?;
                // Each item takes at least its tag byte.
                let n = r.len(ITEMS_PER_UPDATE_MAX, 1)?;
                if n == 0 {
                    return Err(DecodeError::Invalid);
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(decode_item(&mut r)?);
                }
                GmsMessage::Update { seq, items }
            }
            T_ACK => GmsMessage::Ack { upto: r.u64()? },
            T_PROBE => GmsMessage::Probe,
            T_NONCE_TAKEN => GmsMessage::NonceTaken { nonce: r.u64()? },
            T_REDIRECT => {
                let term = r.u64()?;
                let leader = match r.u8()? {
                    0 => None,
                    1 => Some(r.u32()?),
                    t => return Err(DecodeError::Tag(t)),
                };
                GmsMessage::Redirect { term, leader }
            }
            t => return Err(DecodeError::Tag(t)),
        };
        if !r.buf.is_empty() {
            return Err(DecodeError::Trailing);
        }
        Ok(msg)
    }
}

fn encode_item(item: &Item, out: &mut Vec<u8>) {
    match item {
        Item::TopicBound { name, topic } => {
            out.push(I_TOPIC_BOUND);
            put_string(out, name);
            put_u32(out, topic.0);
        }
        Item::Region(v) => {
            out.push(I_REGION);
            put_u32(out, v.view.region.0);
            put_u32(out, v.view.view.0);
            put_u32(out, v.view.base.0);
            put_len(out, v.view.topics.len());
            for t in &v.view.topics {
                put_u32(out, t.0);
            }
            put_len(out, v.view.partitions.len());
            for p in &v.view.partitions {
                put_len(out, p.len());
                for n in p {
                    put_u32(out, n.0);
                }
            }
            match v.address {
                RegionAddress::Unicast => out.push(A_UNICAST),
                RegionAddress::Multicast { group, port } => {
                    out.push(A_MULTICAST);
                    out.extend_from_slice(&group);
                    put_u16(out, port);
                }
            }
        }
        Item::RegionGone(r) => {
            out.push(I_REGION_GONE);
            put_u32(out, r.0);
        }
        Item::TopicRegions { topic, regions } => {
            out.push(I_TOPIC_REGIONS);
            put_u32(out, topic.0);
            put_len(out, regions.len());
            for r in regions {
                put_u32(out, r.0);
            }
        }
        Item::TopicGone(t) => {
            out.push(I_TOPIC_GONE);
            put_u32(out, t.0);
        }
        Item::NodeAddress { node, addr } => {
            out.push(I_NODE_ADDRESS);
            put_u32(out, node.0);
            put_addr(out, Some(*addr));
        }
        Item::Commit => out.push(I_COMMIT),
        Item::Removed => out.push(I_REMOVED),
        Item::RegionKey { region, id, secret } => {
            out.push(I_REGION_KEY);
            put_u32(out, region.0);
            put_u32(out, *id);
            out.extend_from_slice(&secret.0);
        }
        Item::Refused(r) => {
            out.push(I_REFUSED);
            put_string(out, &r.topic);
            out.push(match r.action {
                AclAction::Publish => ACTION_PUBLISH,
                AclAction::Subscribe => ACTION_SUBSCRIBE,
            });
            put_string_max(out, &r.rule, RULE_TEXT_BYTES_MAX);
        }
    }
}

/// The encoded size of an item, in bytes (for packing updates into datagrams).
#[must_use]
pub fn item_len(item: &Item) -> usize {
    let mut v = Vec::new();
    encode_item(item, &mut v);
    v.len()
}

pub(crate) fn put_addr(out: &mut Vec<u8>, addr: Option<SocketAddr>) {
    match addr {
        None => out.push(ADDR_NONE),
        Some(SocketAddr::V4(a)) => {
            out.push(ADDR_V4);
            out.extend_from_slice(&a.ip().octets());
            put_u16(out, a.port());
        }
        Some(SocketAddr::V6(a)) => {
            out.push(ADDR_V6);
            out.extend_from_slice(&a.ip().octets());
            put_u16(out, a.port());
        }
    }
}

fn decode_item(r: &mut Reader<'_>) -> Result<Item, DecodeError> {
    Ok(match r.u8()? {
        I_TOPIC_BOUND => Item::TopicBound {
            name: r.string()?,
            topic: TopicId(r.u32()?),
        },
        I_REGION => {
            let region = RegionId(r.u32()?);
            let view = ViewId(r.u32()?);
            let base = ViewId(r.u32()?);
            if base > view {
                return Err(DecodeError::Invalid);
            }
            let topics = r.ids(LIST_MAX)?.into_iter().map(TopicId).collect();
            // Each partition takes at least its 4-byte length.
            let parts = r.len(REGION_MEMBERS_MAX, 4)?;
            let mut partitions = Vec::with_capacity(parts);
            let mut members = 0usize;
            for _ in 0..parts {
                let p: Vec<NodeId> = r.ids(REGION_MEMBERS_MAX)?.into_iter().map(NodeId).collect();
                if p.is_empty() {
                    return Err(DecodeError::Invalid);
                }
                members += p.len();
                partitions.push(p);
            }
            if members > REGION_MEMBERS_MAX || partitions.is_empty() {
                return Err(DecodeError::Invalid);
            }
            let address = match r.u8()? {
                A_UNICAST => RegionAddress::Unicast,
                A_MULTICAST => {
                    let g = r.take(4)?;
                    RegionAddress::Multicast {
                        group: [g[0], g[1], g[2], g[3]],
                        port: r.u16()?,
                    }
                }
                t => return Err(DecodeError::Tag(t)),
            };
            Item::Region(GmsRegionView {
                view: RegionView {
                    region,
                    view,
                    base,
                    topics,
                    partitions,
                },
                address,
            })
        }
        I_REGION_GONE => Item::RegionGone(RegionId(r.u32()?)),
        I_TOPIC_REGIONS => Item::TopicRegions {
            topic: TopicId(r.u32()?),
            regions: r.ids(LIST_MAX)?.into_iter().map(RegionId).collect(),
        },
        I_TOPIC_GONE => Item::TopicGone(TopicId(r.u32()?)),
        I_NODE_ADDRESS => {
            let node = NodeId(r.u32()?);
            let addr = r.addr()?.ok_or(DecodeError::Invalid)?;
            Item::NodeAddress { node, addr }
        }
        I_COMMIT => Item::Commit,
        I_REMOVED => Item::Removed,
        I_REGION_KEY => {
            let region = RegionId(r.u32()?);
            let id = r.u32()?;
            // Region ids and key ids start at 1.
            if region.0 == 0 || id == 0 {
                return Err(DecodeError::Invalid);
            }
            let mut secret = [0u8; 32];
            secret.copy_from_slice(r.take(32)?);
            Item::RegionKey {
                region,
                id,
                secret: WireKey(secret),
            }
        }
        I_REFUSED => {
            let topic = r.string()?;
            let action = match r.u8()? {
                ACTION_PUBLISH => AclAction::Publish,
                ACTION_SUBSCRIBE => AclAction::Subscribe,
                t => return Err(DecodeError::Tag(t)),
            };
            Item::Refused(TopicRefusal {
                topic,
                action,
                rule: r.string_max(RULE_TEXT_BYTES_MAX)?,
            })
        }
        t => return Err(DecodeError::Tag(t)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<GmsMessage> {
        vec![
            GmsMessage::Join {
                nonce: 7,
                addr: None,
            },
            GmsMessage::Join {
                nonce: 8,
                addr: Some("127.0.0.1:7000".parse().expect("address")),
            },
            GmsMessage::Welcome {
                nonce: 7,
                node: NodeId(3),
                incarnation: 0xdead_beef,
            },
            GmsMessage::Request {
                req: 1,
                body: Request::Subscribe("prices/eu".into()),
            },
            GmsMessage::Request {
                req: 2,
                body: Request::Suspect(NodeId(9)),
            },
            GmsMessage::Request {
                req: 4,
                body: Request::SubscribeMany(vec!["a".into(), "prices/us".into(), "b/c".into()]),
            },
            GmsMessage::Request {
                req: 3,
                body: Request::Leave,
            },
            GmsMessage::Request {
                req: 5,
                body: Request::AdvertiseMany(vec!["x".into(), "y/z".into()]),
            },
            GmsMessage::Request {
                req: 6,
                body: Request::UnsubscribeMany(vec!["a".into(), "b/c".into()]),
            },
            GmsMessage::Request {
                req: 7,
                body: Request::MetricsAt(Some("127.0.0.1:9464".parse().expect("address"))),
            },
            GmsMessage::Request {
                req: 8,
                body: Request::MetricsAt(None),
            },
            GmsMessage::Request {
                req: 10,
                body: Request::RenewDatagramKey(7),
            },
            GmsMessage::RequestAck { upto: 3 },
            GmsMessage::Heartbeat,
            GmsMessage::Probe,
            GmsMessage::NonceTaken { nonce: 77 },
            GmsMessage::Ack { upto: 12 },
            GmsMessage::Update {
                seq: 4,
                items: vec![Item::Region(GmsRegionView {
                    view: RegionView {
                        region: RegionId(2),
                        view: ViewId(5),
                        base: ViewId(3),
                        topics: vec![TopicId(1), TopicId(4)],
                        partitions: vec![vec![NodeId(1), NodeId(2)], vec![NodeId(3)]],
                    },
                    address: RegionAddress::Multicast {
                        group: [239, 1, 0, 2],
                        port: 7000,
                    },
                })],
            },
            GmsMessage::Update {
                seq: 5,
                items: vec![
                    Item::TopicRegions {
                        topic: TopicId(1),
                        regions: vec![RegionId(2), RegionId(3)],
                    },
                    Item::NodeAddress {
                        node: NodeId(4),
                        addr: "[::1]:9000".parse().expect("address"),
                    },
                    Item::RegionKey {
                        region: RegionId(3),
                        id: 7,
                        secret: WireKey([0xa5; 32]),
                    },
                    Item::Refused(TopicRefusal {
                        topic: "market.eu".into(),
                        action: AclAction::Publish,
                        rule: "rule 2 (deny publish east-1 market.*)".into(),
                    }),
                    Item::Refused(TopicRefusal {
                        topic: "news".into(),
                        action: AclAction::Subscribe,
                        rule: "no rule allows".into(),
                    }),
                    Item::Commit,
                ],
            },
        ]
    }

    #[test]
    fn round_trips() {
        for m in samples() {
            assert_eq!(GmsMessage::decode(&m.to_bytes()), Ok(m));
        }
    }

    #[test]
    fn truncations_and_trailing_bytes_are_errors() {
        for m in samples() {
            let b = m.to_bytes();
            for cut in 0..b.len() {
                assert!(GmsMessage::decode(&b[..cut]).is_err());
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(GmsMessage::decode(&longer), Err(DecodeError::Trailing));
        }
    }

    #[test]
    fn forged_lengths_do_not_allocate() {
        // A region claiming 4 billion topics in a 20-byte message.
        let mut b = vec![T_UPDATE];
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.push(I_REGION);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(GmsMessage::decode(&b), Err(DecodeError::TooLong));
    }

    #[test]
    fn a_batch_of_subscriptions_is_capped() {
        let request = |n: u32| {
            let mut b = vec![T_REQUEST];
            b.extend_from_slice(&1u64.to_le_bytes());
            b.push(R_SUBSCRIBE_MANY);
            b.extend_from_slice(&n.to_le_bytes());
            for _ in 0..n {
                b.extend_from_slice(&1u16.to_le_bytes());
                b.push(b'x');
            }
            b
        };
        let max = NAMES_PER_REQUEST_MAX as u32;
        assert!(GmsMessage::decode(&request(max)).is_ok());
        assert_eq!(
            GmsMessage::decode(&request(max + 1)),
            Err(DecodeError::TooLong)
        );
        // A count the bytes cannot hold.
        let mut forged = request(0);
        forged.truncate(forged.len() - 4);
        forged.extend_from_slice(&100u32.to_le_bytes());
        assert_eq!(GmsMessage::decode(&forged), Err(DecodeError::TooLong));
    }

    #[test]
    fn a_metrics_address_is_checked() {
        let request = |tail: &[u8]| {
            let mut b = vec![T_REQUEST];
            b.extend_from_slice(&1u64.to_le_bytes());
            b.push(R_METRICS_AT);
            b.extend_from_slice(tail);
            b
        };
        let v4 = [ADDR_V4, 127, 0, 0, 1, 0x24, 0xfc];
        assert_eq!(
            GmsMessage::decode(&request(&v4)),
            Ok(GmsMessage::Request {
                req: 1,
                body: Request::MetricsAt(Some("127.0.0.1:64548".parse().expect("address"))),
            })
        );
        // An address cut short, an unknown address kind, bytes after it.
        assert_eq!(
            GmsMessage::decode(&request(&v4[..5])),
            Err(DecodeError::Truncated)
        );
        assert_eq!(GmsMessage::decode(&request(&[9])), Err(DecodeError::Tag(9)));
        assert_eq!(
            GmsMessage::decode(&request(&[ADDR_NONE, 0])),
            Err(DecodeError::Trailing)
        );
    }

    #[test]
    fn a_refusal_is_bounded() {
        let item = |topic: usize, action: u8, rule: usize| {
            let mut b = vec![T_UPDATE];
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
            b.push(I_REFUSED);
            b.extend_from_slice(&(topic as u16).to_le_bytes());
            b.extend(std::iter::repeat_n(b't', topic));
            b.push(action);
            b.extend_from_slice(&(rule as u16).to_le_bytes());
            b.extend(std::iter::repeat_n(b'r', rule));
            b
        };
        assert!(GmsMessage::decode(&item(TOPIC_NAME_BYTES_MAX, 1, RULE_TEXT_BYTES_MAX)).is_ok());
        assert_eq!(
            GmsMessage::decode(&item(TOPIC_NAME_BYTES_MAX + 1, 1, 1)),
            Err(DecodeError::TooLong)
        );
        assert_eq!(
            GmsMessage::decode(&item(1, 0, RULE_TEXT_BYTES_MAX + 1)),
            Err(DecodeError::TooLong)
        );
        assert_eq!(GmsMessage::decode(&item(1, 2, 1)), Err(DecodeError::Tag(2)));
        // A rule claiming more bytes than the message holds.
        let mut cut = item(1, 0, 10);
        cut.truncate(cut.len() - 1);
        assert_eq!(GmsMessage::decode(&cut), Err(DecodeError::Truncated));
        // The encoder cuts an over-long rule to the bound, so what it sends decodes.
        let long = GmsMessage::Update {
            seq: 1,
            items: vec![Item::Refused(TopicRefusal {
                topic: "t".into(),
                action: AclAction::Subscribe,
                rule: "r".repeat(RULE_TEXT_BYTES_MAX * 2),
            })],
        };
        let Ok(GmsMessage::Update { items, .. }) = GmsMessage::decode(&long.to_bytes()) else {
            panic!("an over-long rule does not decode");
        };
        assert!(matches!(&items[0], Item::Refused(r) if r.rule.len() == RULE_TEXT_BYTES_MAX));
    }

    #[test]
    fn a_region_key_is_fixed_length_and_checked() {
        let item = |region: u32, id: u32, secret: usize| {
            let mut b = vec![T_UPDATE];
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&1u32.to_le_bytes());
            b.push(I_REGION_KEY);
            b.extend_from_slice(&region.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
            b.extend(std::iter::repeat_n(0x5a, secret));
            b
        };
        assert_eq!(
            GmsMessage::decode(&item(4, 9, 32)),
            Ok(GmsMessage::Update {
                seq: 1,
                items: vec![Item::RegionKey {
                    region: RegionId(4),
                    id: 9,
                    secret: WireKey([0x5a; 32]),
                }],
            })
        );
        assert_eq!(
            GmsMessage::decode(&item(4, 9, 31)),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            GmsMessage::decode(&item(4, 9, 33)),
            Err(DecodeError::Trailing)
        );
        assert_eq!(
            GmsMessage::decode(&item(0, 9, 32)),
            Err(DecodeError::Invalid)
        );
        assert_eq!(
            GmsMessage::decode(&item(4, 0, 32)),
            Err(DecodeError::Invalid)
        );
        // The tag of the group-wide key of ADR 40 is not an item any more.
        let mut old = item(4, 9, 32);
        old[13] = 9;
        assert_eq!(GmsMessage::decode(&old), Err(DecodeError::Tag(9)));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = GmsMessage::decode(&bytes);
        }

        #[test]
        fn mutated_messages_never_panic(i in 0usize..15, at in 0usize..64, byte in any::<u8>()) {
            let mut b = samples()[i].to_bytes();
            let at = at % b.len();
            b[at] = byte;
            if let Ok(m) = GmsMessage::decode(&b) {
                // Whatever decodes re-encodes to a message that decodes the same.
                prop_assert_eq!(GmsMessage::decode(&m.to_bytes()), Ok(m));
            }
        }
    }
}
