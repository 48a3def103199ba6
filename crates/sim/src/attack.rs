//! The hostile host of [`Scenario::attacker`](crate::Scenario::attacker): one extra simulated
//! node on the same LAN as the group, with a mirror port of the switch ([`crate::world::Tap`])
//! that shows it part of everyone's traffic, as a sniffer on a shared network would see it.
//!
//! What it does, from 10% of the publishing time until half a second after publishing ends:
//!
//! - **joins without credentials**: it runs the real [`Joining`] with an identity of its own
//!   that is not on the service's allow list (with sealing off: a plain join, which the service
//!   takes, and the checker reports it);
//! - **replays** datagrams it captured (protocol and GMS datagrams alike) to the members, to
//!   the regions their headers name, and to the service, under the captured source id;
//! - **forges** data datagrams whose payload carries [`ATTACK_MARKER`] (with guessed sequence
//!   numbers, message ids and topics, in the name of the senders it saw), and token, ACK,
//!   NAK and other control datagrams (captured ones with guessed ids and senders), each with no
//!   trailer, with a trailer under the key id it sniffed and a random tag, and under a random
//!   key id; and plain GMS requests in a member's name (a leave);
//! - **keeps the keys of the regions it was removed from**: the scenario crashes one receiver
//!   ([`traitor`]) at 20% of the publishing time and hands the attacker that member's region
//!   keys (ADR 43). At once it uses each to seal forged data in the member's name for the
//!   *other* regions (a member of region A only, trying region B: refused, since B's members
//!   open B's datagrams with B's keys only). Once it sees a region's members seal under a
//!   newer key (the service makes one when it removes the node), and the members' grace for
//!   the old key ([`KEY_GRACE`](crate::gms::KEY_GRACE)) has passed with a margin for a late
//!   update, it seals forged data and control datagrams of that region under the old key,
//!   correctly, as the removed member.
//!
//! The checker fails the run if any member delivers a payload carrying the marker, delivers a
//! replayed message twice, or if the service admitted the attacker; with sealing on it also asks
//! that the members' refusal counters show each attack ([`AttackReport`]).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tidings_gms::{GmsMessage, Joining, LinkSecurity, NodeLink, Request};
use tidings_proto::{Destination, NodeId, RegionId, Time, TopicId, ViewId};
use tidings_seal::datagram::{KeyId, KeySecret, SealingKey, COUNTER_LIMIT_DEFAULT, TRAILER_LEN};
use tidings_seal::{KeyRingConfig, Mode, OpenStats, PublicKey};
use tidings_wire::{Header, Kind, Message, MessagesWriter, HEADER_LEN};

use crate::checker::PAYLOAD_ID_LEN;
use crate::gms::{from_gms, to_gms, unwrap, wrap};

/// Bytes every payload the attacker forges carries right after the payload's identity (origin
/// and message id): no genuine payload has them there (its filler is one repeated byte).
pub const ATTACK_MARKER: [u8; 8] = *b"\xa7forged\xa7";

/// Bytes of a forged payload.
const FORGED_PAYLOAD_LEN: usize = 64;

/// Captured datagrams kept for replays and forgeries (the oldest goes first).
const CAPTURED_MAX: usize = 512;

/// One datagram in this many crossing the switch is mirrored to the attacker.
pub const TAP_EVERY: u32 = 4;

/// Time between two of the attacker's rounds (each sends a handful of datagrams).
const ROUND: Duration = Duration::from_millis(2);

/// After the attacker first sees a key newer than the one it kept, how long it waits beyond the
/// members' grace before it uses the old key: a member that gets the service's update late
/// (lost and resent every 50 ms) still opens the old key until its own grace ends.
const OLD_KEY_MARGIN: Duration = Duration::from_millis(250);

/// Whether `payload` is one the attacker forged.
#[must_use]
pub fn is_forged(payload: &[u8]) -> bool {
    payload
        .get(PAYLOAD_ID_LEN..PAYLOAD_ID_LEN + ATTACK_MARKER.len())
        .is_some_and(|m| m == ATTACK_MARKER)
}

/// The receiver the scenario crashes so that the attacker holds the key of a view it was
/// removed from: the last node (a receiver, never a sender).
#[must_use]
pub fn traitor(nodes: u32) -> NodeId {
    NodeId(nodes.saturating_sub(1))
}

/// What the attacker sent and what came of it, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AttackStats {
    /// Datagrams it captured through its tap.
    pub captured: u64,
    /// GMS datagrams its join sent (hellos over its own link; plain joins with sealing off).
    pub join_datagrams: u64,
    /// Whether the service refused it (its link was told "not admitted").
    pub join_refused: bool,
    /// Whether it joined (was given a node id).
    pub joined: bool,
    /// Captured datagrams replayed.
    pub replayed: u64,
    /// Data datagrams forged with the marker, under guessed keys or none.
    pub forged_data: u64,
    /// Token, ACK, NAK and other control datagrams forged, under guessed keys or none.
    pub forged_control: u64,
    /// Forged datagrams under a random key id.
    pub forged_unknown_key: u64,
    /// Plain GMS requests forged in a member's name.
    pub forged_gms: u64,
    /// Datagrams sealed under the key of the view the removed member was removed from.
    pub old_key: u64,
    /// Forged data datagrams of one region sealed under the removed member's key of another
    /// (while that key was still current in its own region).
    pub cross_region: u64,
}

/// The attacker's outcome and what the members and the service refused, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AttackReport {
    /// What it sent.
    pub sent: AttackStats,
    /// Protocol datagrams the members refused, by cause (all members; zero with sealing off).
    pub refused: Refusals,
    /// GMS link: hellos of identities off the allow list.
    pub gms_not_admitted: u64,
    /// GMS link: plain (unsealed) GMS datagrams dropped.
    pub gms_plain_dropped: u64,
    /// GMS link: hellos unreadable or replayed, malformed link datagrams.
    pub gms_bad_hellos: u64,
    /// GMS link: sealed datagrams refused by their session (bad tag, replay).
    pub gms_refused: u64,
    /// GMS link: sealed datagrams from an address without a session.
    pub gms_no_session: u64,
    /// Members' GMS links: datagrams refused (replays, bad tags, others' sessions).
    pub members_gms_refused: u64,
}

/// Protocol datagrams refused by cause ([`OpenStats`], summed over the members).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Refusals {
    /// Too short, or not a protocol datagram.
    pub malformed: u64,
    /// Under a key id never installed.
    pub unknown_key: u64,
    /// Under a retired key (a removed member's old key, after the grace).
    pub retired_key: u64,
    /// The tag did not verify.
    pub bad_tag: u64,
    /// A counter already seen.
    pub replayed: u64,
    /// A counter behind the replay window.
    pub too_old: u64,
    /// No room for another sender under the key.
    pub senders_full: u64,
    /// The trailer's sender is not the header's.
    pub sender_mismatch: u64,
}

impl Refusals {
    /// Adds one member's counters.
    pub fn add(&mut self, o: &OpenStats) {
        self.malformed += o.malformed;
        self.unknown_key += o.unknown_key;
        self.retired_key += o.retired_key;
        self.bad_tag += o.bad_tag;
        self.replayed += o.replayed;
        self.too_old += o.too_old;
        self.senders_full += o.senders_full;
        self.sender_mismatch += o.sender_mismatch;
    }

    /// All refusals.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.malformed
            + self.unknown_key
            + self.retired_key
            + self.bad_tag
            + self.replayed
            + self.too_old
            + self.senders_full
            + self.sender_mismatch
    }
}

/// A region key a removed member kept, and what the attacker saw of its successor.
#[derive(Debug)]
struct Stolen {
    region: RegionId,
    key: SealingKey,
    id: u32,
    /// The removed member's id on the wire (the GMS's).
    sender: NodeId,
    /// When a datagram sealed under a newer key was first seen.
    newer_seen: Option<Time>,
}

/// The hostile host's state.
pub(crate) struct Attacker {
    me: NodeId,
    nodes: u32,
    gms: NodeId,
    topics: u32,
    mode: Mode,
    rng: fastrand::Rng,
    captured: VecDeque<Bytes>,
    joining: Joining,
    stolen: Vec<Stolen>,
    start: Time,
    until: Time,
    next_at: Time,
    round: u64,
    out: VecDeque<(Destination, Vec<u8>)>,
    stats: AttackStats,
}

impl std::fmt::Debug for Attacker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacker")
            .field("me", &self.me)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Where the attacker stands and what it knows at the start.
pub(crate) struct AttackerSetup {
    /// Its simulator id.
    pub(crate) me: NodeId,
    /// Protocol nodes (`0..nodes`).
    pub(crate) nodes: u32,
    /// The service's node.
    pub(crate) gms: NodeId,
    /// Topics in the run (it guesses among them).
    pub(crate) topics: u32,
    /// The group's sealing mode (a removed member knows it).
    pub(crate) mode: Mode,
    /// The service's public key, when the service admits (public: every node is configured
    /// with it).
    pub(crate) service_key: Option<PublicKey>,
    /// When it starts and stops.
    pub(crate) start: Time,
    /// When it stops.
    pub(crate) until: Time,
    /// Seeds its choices, identity and handshakes.
    pub(crate) seed: u64,
    /// The node joining the service: the real client and member code.
    pub(crate) joining: Joining,
}

impl Attacker {
    /// The attacker of `setup`; with a service key, its join runs over an admitted link with an
    /// identity of its own (not on the allow list).
    pub(crate) fn new(setup: AttackerSetup) -> Result<Attacker, String> {
        let mut rng = fastrand::Rng::with_seed(setup.seed ^ 0x4154_5441_434b);
        let mut joining = setup.joining;
        if let Some(service) = setup.service_key {
            let identity = crate::gms::seeded_identity(&mut rng)?;
            let link = NodeLink::new(
                LinkSecurity::new(identity, service),
                1,
                crate::gms::seeded_entropy(rng.u64(..)),
            );
            joining = joining.with_link(link);
        }
        Ok(Attacker {
            me: setup.me,
            nodes: setup.nodes,
            gms: setup.gms,
            topics: setup.topics.max(1),
            mode: setup.mode,
            rng,
            captured: VecDeque::with_capacity(CAPTURED_MAX),
            joining,
            stolen: Vec::new(),
            start: setup.start,
            until: setup.until,
            next_at: setup.start,
            round: 0,
            out: VecDeque::new(),
            stats: AttackStats::default(),
        })
    }

    /// What it sent so far.
    pub(crate) fn stats(&self) -> AttackStats {
        let mut s = self.stats.clone();
        s.joined = self.joining.is_joined();
        s.join_refused = matches!(
            self.joining.link_refusal(),
            Some(tidings_seal::LinkError::NotAdmitted(_))
        );
        s
    }

    /// One of the removed member's region keys, and its id on the wire (`sender`, the GMS's
    /// id), taken when it crashed.
    pub(crate) fn steal(&mut self, region: RegionId, id: u32, secret: [u8; 32], sender: NodeId) {
        if self.mode == Mode::Off {
            return;
        }
        let key = SealingKey::new(
            KeyRingConfig::default().aead,
            self.mode,
            KeyId(id),
            sender.0,
            &KeySecret::from_bytes(secret),
            COUNTER_LIMIT_DEFAULT,
        );
        self.stolen.push(Stolen {
            region,
            key,
            id,
            sender,
            newer_seen: None,
        });
    }

    /// A datagram reached the attacker: through its tap, or addressed to it (the service's
    /// answers to its join).
    pub(crate) fn handle_datagram(&mut self, now: Time, datagram: Bytes) {
        if let Some((from, body)) = unwrap(&datagram) {
            if from == self.gms {
                self.joining.handle_gms_datagram(now, 0, body);
            }
        } else {
            // The clear header says which region, the clear trailer which key sealed it.
            let region = header_region(&datagram);
            for s in &mut self.stolen {
                if s.newer_seen.is_none()
                    && region == Some(s.region)
                    && header_sender(&datagram) != Some(s.sender)
                    && trailer_key_id(&datagram).is_some_and(|id| id > s.id)
                {
                    s.newer_seen = Some(now);
                }
            }
        }
        self.stats.captured += 1;
        if self.captured.len() == CAPTURED_MAX {
            self.captured.pop_front();
        }
        self.captured.push_back(datagram);
    }

    /// Time has passed: its join's timers, and a round of attacks when one is due.
    pub(crate) fn handle_timeout(&mut self, now: Time) {
        if now >= self.start {
            self.joining.handle_timeout(now);
        }
        if now >= self.next_at && now < self.until {
            self.next_at = now + ROUND;
            self.attack(now);
        }
    }

    /// The next time it acts.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        let join = self
            .joining
            .poll_timeout()
            .map(|t| t.max(self.start))
            .filter(|_| !self.joining.is_joined());
        let attack = (self.next_at < self.until).then_some(self.next_at);
        match (join, attack) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next datagram to send, written into `buf`.
    pub(crate) fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<(Destination, usize)> {
        loop {
            let (to, bytes) = match self.joining.poll_gms_transmit() {
                Some((_, d)) => {
                    self.stats.join_datagrams += 1;
                    (Destination::Node(self.gms), wrap(self.me, &d))
                }
                None => self.out.pop_front()?,
            };
            if let Some(slot) = buf.get_mut(..bytes.len()) {
                slot.copy_from_slice(&bytes);
                return Some((to, bytes.len()));
            }
        }
    }

    /// A random protocol node.
    fn member(&mut self) -> NodeId {
        NodeId(self.rng.u32(..self.nodes.max(1)))
    }

    /// A captured datagram picked at random among those `keep` accepts.
    fn pick(&mut self, keep: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let n = self.captured.len();
        if n == 0 {
            return None;
        }
        let from = self.rng.usize(..n);
        (0..n)
            .map(|k| &self.captured[(from + k) % n])
            .find(|d| keep(d))
            .map(|d| d.to_vec())
    }

    /// Where a protocol datagram goes: its region's group or one member.
    fn destination(&mut self, datagram: &[u8]) -> Destination {
        match header_region(datagram) {
            Some(r) if self.rng.bool() => Destination::Region(r),
            _ => Destination::Node(self.member()),
        }
    }

    fn attack(&mut self, now: Time) {
        self.round += 1;
        match self.round % 4 {
            0 => self.replay(),
            1 => self.forge_data(now),
            2 => self.forge_control(),
            _ => self.forge_gms(),
        }
        self.use_old_key(now);
    }

    /// Replays a captured datagram: a protocol one to members, a GMS one (under its captured
    /// source id) to the service and to a member.
    fn replay(&mut self) {
        let Some(d) = self.pick(|_| true) else { return };
        if unwrap(&d).is_some() {
            let to = if self.rng.bool() {
                self.gms
            } else {
                self.member()
            };
            self.out.push_back((Destination::Node(to), d));
        } else {
            let to = self.destination(&d);
            self.out.push_back((to, d));
        }
        self.stats.replayed += 1;
    }

    /// A data datagram in the name of a sender it saw, carrying the marker, with guessed
    /// sequence number, message id and topic; sent without a trailer, with a trailer under the
    /// sniffed key id and a random tag, and under a random key id.
    fn forge_data(&mut self, now: Time) {
        let Some(seen) = self.pick(|d| tidings_wire::peek_kind(d) == Some(Kind::Data)) else {
            return;
        };
        let Some(header) = read_header(&seen) else {
            return;
        };
        let Some(datagram) = self.forged_data(now, &header, &seen) else {
            return;
        };
        let key_id = trailer_key_id(&seen).unwrap_or(1);
        let to = self.destination(&datagram);
        self.out.push_back((to, datagram.clone()));
        let guessed = self.with_trailer(&datagram, key_id, header.sender);
        self.out.push_back((to, guessed));
        let random_key = self.rng.u32(..);
        let unknown = self.with_trailer(&datagram, random_key, header.sender);
        self.out.push_back((to, unknown));
        self.stats.forged_data += 2;
        self.stats.forged_unknown_key += 1;
    }

    /// A data datagram with `header`, one message with a forged payload, its sequence number
    /// and id guessed from `seen` (readable unless the group encrypts).
    fn forged_data(&mut self, now: Time, header: &Header, seen: &[u8]) -> Option<Vec<u8>> {
        let field = |at: usize| -> Option<u64> {
            let b = seen.get(at..at + 8)?;
            Some(u64::from_be_bytes(b.try_into().ok()?))
        };
        let plausible = |v: Option<u64>| v.filter(|&v| v > 0 && v < 1 << 32);
        let seq = plausible(field(HEADER_LEN + 2)).unwrap_or_else(|| self.rng.u64(1..2000))
            + self.rng.u64(1..6);
        let msg_id = plausible(field(HEADER_LEN + 10)).unwrap_or_else(|| self.rng.u64(1..2000))
            + self.rng.u64(1..6);
        let topic = seen
            .get(HEADER_LEN + 26..HEADER_LEN + 30)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .filter(|t| (1..=self.topics + 3).contains(t))
            .unwrap_or_else(|| self.rng.u32(1..=self.topics));
        let origin = from_gms(header.sender).unwrap_or(header.sender);
        let mut payload = vec![0u8; FORGED_PAYLOAD_LEN];
        payload[..4].copy_from_slice(&origin.0.to_be_bytes());
        payload[4..12].copy_from_slice(&msg_id.to_be_bytes());
        payload[PAYLOAD_ID_LEN..PAYLOAD_ID_LEN + ATTACK_MARKER.len()]
            .copy_from_slice(&ATTACK_MARKER);
        let mut buf = vec![0u8; HEADER_LEN + 64 + FORGED_PAYLOAD_LEN];
        let mut w = MessagesWriter::data(&mut buf, header).ok()?;
        w.push(&Message {
            seq,
            msg_id,
            timestamp_us: now.as_nanos() / 1000,
            topic: TopicId(topic),
            payload: &payload,
        })
        .ok()?;
        let len = w.finish();
        buf.truncate(len);
        Some(buf)
    }

    /// `datagram` with a trailer under `key_id` in `sender`'s name, a random counter and a
    /// random tag.
    fn with_trailer(&mut self, datagram: &[u8], key_id: u32, sender: NodeId) -> Vec<u8> {
        let mut d = Vec::with_capacity(datagram.len() + TRAILER_LEN);
        d.extend_from_slice(datagram);
        d.extend_from_slice(&key_id.to_be_bytes());
        d.extend_from_slice(&sender.0.to_be_bytes());
        d.extend_from_slice(&self.rng.u64(..).to_be_bytes());
        let mut tag = [0u8; 16];
        self.rng.fill(&mut tag);
        d.extend_from_slice(&tag);
        d
    }

    /// A captured control datagram (token, ACK, NAK, silence, pull, DCQ, UCA ...) with guessed
    /// ids: a few bytes of its body changed, and its tag replaced; once more in another
    /// member's name; once more under a random key id.
    fn forge_control(&mut self) {
        let Some(mut d) = self.pick(|d| {
            tidings_wire::peek_kind(d).is_some_and(|k| k != Kind::Data)
                && d.len() > HEADER_LEN + TRAILER_LEN
        }) else {
            return;
        };
        let body = HEADER_LEN..d.len() - TRAILER_LEN;
        for _ in 0..self.rng.usize(1..4) {
            let at = self.rng.usize(body.clone());
            d[at] = self.rng.u8(..);
        }
        let len = d.len();
        self.rng.fill(&mut d[len - 16..]);
        let to = self.destination(&d);
        self.out.push_back((to, d.clone()));
        // In another member's name (the header's sender).
        let other = to_gms(self.member());
        d[16..20].copy_from_slice(&other.0.to_be_bytes());
        self.out.push_back((to, d.clone()));
        // Under a random key id.
        let key = self.rng.u32(..);
        d[len - TRAILER_LEN..len - TRAILER_LEN + 4].copy_from_slice(&key.to_be_bytes());
        self.out.push_back((to, d));
        self.stats.forged_control += 2;
        self.stats.forged_unknown_key += 1;
    }

    /// A plain GMS request in a member's name: that member leaves. With the admitted link the
    /// service drops it unread; without, a live member is removed and the checker says so.
    fn forge_gms(&mut self) {
        let victim = self.member();
        // A member makes a request per topic it subscribes to: its next number is small.
        let msg = GmsMessage::Request {
            req: self.rng.u64(1..32),
            body: Request::Leave,
        };
        let d = wrap(victim, &tidings_gms::frame(&msg));
        self.out.push_back((Destination::Node(self.gms), d));
        self.stats.forged_gms += 1;
    }

    /// For each region key the removed member kept: while it is current, forged data of
    /// another region sealed under it; once it should be retired everywhere, data (with the
    /// marker) and control datagrams of its region sealed correctly under it, as the removed
    /// member.
    fn use_old_key(&mut self, now: Time) {
        for k in 0..self.stolen.len() {
            let (region, sender, newer_seen) = {
                let s = &self.stolen[k];
                (s.region, s.sender, s.newer_seen)
            };
            if newer_seen.is_none() {
                self.cross_region(now, k, region, sender);
            }
            let due =
                newer_seen.is_some_and(|seen| now >= seen + crate::gms::KEY_GRACE + OLD_KEY_MARGIN);
            if !due {
                continue;
            }
            let data = self
                .pick(|d| {
                    tidings_wire::peek_kind(d) == Some(Kind::Data)
                        && header_region(d) == Some(region)
                })
                .and_then(|seen| {
                    let header = Header {
                        sender,
                        ..read_header(&seen)?
                    };
                    self.forged_data(now, &header, &seen)
                });
            let control = self
                .pick(|d| {
                    tidings_wire::peek_kind(d).is_some_and(|k| k != Kind::Data)
                        && header_region(d) == Some(region)
                        && d.len() > HEADER_LEN + TRAILER_LEN
                })
                .map(|mut d| {
                    d.truncate(d.len() - TRAILER_LEN);
                    d[16..20].copy_from_slice(&sender.0.to_be_bytes());
                    d
                });
            for d in [data, control].into_iter().flatten() {
                if let Some(buf) = self.seal_stolen(k, d) {
                    let to = self.destination(&buf);
                    self.out.push_back((to, buf));
                    self.stats.old_key += 1;
                }
            }
        }
    }

    /// A member of one region only, trying another: forged data of a region other than
    /// `region`, in the removed member's name, sealed under its key of `region`.
    fn cross_region(&mut self, now: Time, k: usize, region: RegionId, sender: NodeId) {
        let data = self
            .pick(|d| {
                tidings_wire::peek_kind(d) == Some(Kind::Data)
                    && header_region(d).is_some_and(|r| r != region)
            })
            .and_then(|seen| {
                let header = Header {
                    sender,
                    ..read_header(&seen)?
                };
                self.forged_data(now, &header, &seen)
            });
        if let Some(buf) = data.and_then(|d| self.seal_stolen(k, d)) {
            let to = self.destination(&buf);
            self.out.push_back((to, buf));
            self.stats.cross_region += 1;
        }
    }

    /// `d` sealed under stolen key `k`.
    fn seal_stolen(&mut self, k: usize, d: Vec<u8>) -> Option<Vec<u8>> {
        let stolen = self.stolen.get_mut(k)?;
        let len = d.len();
        let mut buf = d;
        buf.resize(len + TRAILER_LEN, 0);
        let n = stolen.key.seal(&mut buf, len).ok()?;
        buf.truncate(n);
        Some(buf)
    }
}

/// The clear header of a protocol datagram.
fn read_header(d: &[u8]) -> Option<Header> {
    let kind = tidings_wire::peek_kind(d)?;
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
    };
    Some(Header {
        kind,
        incarnation: u32_at(4)?,
        region: RegionId(u32_at(8)?),
        view: ViewId(u32_at(12)?),
        sender: NodeId(u32_at(16)?),
    })
}

/// The region a protocol datagram's header names.
fn header_region(d: &[u8]) -> Option<RegionId> {
    read_header(d).map(|h| h.region)
}

/// The sender a protocol datagram's header names.
fn header_sender(d: &[u8]) -> Option<NodeId> {
    read_header(d).map(|h| h.sender)
}

/// The key id of a sealed protocol datagram's trailer (meaningless for an unsealed one).
fn trailer_key_id(d: &[u8]) -> Option<u32> {
    tidings_wire::peek_kind(d)?;
    let at = d.len().checked_sub(TRAILER_LEN)?;
    if at < HEADER_LEN {
        return None;
    }
    Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::payload_for;

    #[test]
    fn forged_payloads_are_recognised_and_genuine_ones_are_not() {
        let mut p = payload_for(NodeId(3), 7, 64);
        assert!(!is_forged(&p));
        p[PAYLOAD_ID_LEN..PAYLOAD_ID_LEN + 8].copy_from_slice(&ATTACK_MARKER);
        assert!(is_forged(&p));
        assert!(!is_forged(&p[..PAYLOAD_ID_LEN + 4]));
        for id in 0..300u64 {
            assert!(!is_forged(&payload_for(NodeId(1), id, 1000)));
        }
    }
}
