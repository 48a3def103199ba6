//! Sealed protocol datagrams: an AEAD trailer behind the protocol's clear header.
//!
//! A sealed datagram is the protocol datagram followed by a 32-byte trailer:
//!
//! ```text
//! | header (20, clear) | payload (clear or encrypted) | key id u32 | sender u32 | counter u64 | tag (16) |
//! ```
//!
//! Integers are big-endian. The nonce is `sender || counter` (12 bytes): every member of a view
//! shares the view's key, and each seals only under its own sender id with its own counter, so a
//! nonce never repeats under one key. The trailer's fields are not associated data: its sender
//! and counter are the nonce, and its key id picks the key, so changing any of them changes the
//! nonce or the key and the tag fails (ADR 46).
//!
//! - [`Mode::Encrypt`]: the payload is encrypted in place and the header is the associated
//!   data, so a receiver can still route on the header before it opens the datagram.
//! - [`Mode::Authenticate`]: nothing is hidden. With AES-256-GCM the tag is that of encrypting
//!   the header and the payload with no associated data, computed by the sender and again by
//!   the receiver over a scratch copy whose ciphertext is then dropped
//!   ([`authentication_tag`]); with ChaCha20-Poly1305, header and payload are the associated
//!   data of an empty message.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use ring::aead::{self, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use zeroize::Zeroize;

use crate::window::{Refusal, ReplayWindow, WINDOW_BITS_DEFAULT, WINDOW_BITS_MAX};

/// Bytes of the clear protocol header in front of every datagram (`tidings_wire::HEADER_LEN`):
/// never encrypted, so receivers can route before opening.
pub const CLEAR_HEADER_LEN: usize = 20;
/// Where the clear header holds its sender (`tidings_wire::Header::sender`, big-endian u32): the
/// node that put the datagram on the wire, which is the node that sealed it.
pub const HEADER_SENDER_OFFSET: usize = 16;
/// Bytes of a datagram key.
pub const KEY_LEN: usize = 32;
/// Bytes of the AEAD tag.
pub const TAG_LEN: usize = 16;
/// Bytes of the trailer's fields in front of the tag: key id, sender, counter.
pub const TRAILER_FIELDS_LEN: usize = 16;
/// Bytes a sealed datagram has more than the plain one.
pub const TRAILER_LEN: usize = TRAILER_FIELDS_LEN + TAG_LEN;
/// Default number of datagrams one sender may seal under one key before it must be replaced
/// (2^32). AES-GCM's bounds call for a new key well before 2^48 blocks under it; with 2^32
/// datagrams per sender and a few hundred senders per view the total stays far below, and at a
/// million datagrams a second the limit is an hour and ten minutes away. Views change keys more
/// often than that in practice; [`SealingKey::needs_rotation`] asks for one ahead of the limit.
pub const COUNTER_LIMIT_DEFAULT: u64 = 1 << 32;

/// Identifies a datagram key within a cluster; chosen by the membership service (unique over the
/// keys it hands out, e.g. from a counter), carried in clear in every sealed datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u32);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{}", self.0)
    }
}

/// How protocol datagrams are protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Not at all: no trailer, anyone on the network can inject and read.
    Off,
    /// Every byte authenticated, nothing hidden: outsiders cannot forge or replay, but can read.
    Authenticate,
    /// As `Authenticate`, and the payload (everything behind the header) encrypted.
    Encrypt,
}

impl Mode {
    /// Bytes this mode adds to each datagram.
    #[must_use]
    pub fn overhead(self) -> usize {
        match self {
            Mode::Off => 0,
            Mode::Authenticate | Mode::Encrypt => TRAILER_LEN,
        }
    }

    /// The name used in configuration files and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Authenticate => "authenticate",
            Mode::Encrypt => "encrypt",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`Mode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown security mode {0:?} (off, authenticate, encrypt)")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Mode, UnknownMode> {
        match s {
            "off" => Ok(Mode::Off),
            "authenticate" => Ok(Mode::Authenticate),
            "encrypt" => Ok(Mode::Encrypt),
            _ => Err(UnknownMode(s.to_owned())),
        }
    }
}

/// The AEAD that seals datagrams; one per cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aead {
    /// AES-256-GCM: fastest where the CPU has AES and carry-less multiply instructions.
    Aes256Gcm,
    /// ChaCha20-Poly1305: constant-time in software, for CPUs without AES instructions.
    ChaCha20Poly1305,
}

impl Aead {
    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Aead::Aes256Gcm => &aead::AES_256_GCM,
            Aead::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// The 32 secret bytes of a datagram key, made by the caller from a cryptographic RNG (the
/// membership service) and wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySecret([u8; KEY_LEN]);

impl KeySecret {
    /// The secret from its bytes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> KeySecret {
        KeySecret(bytes)
    }

    /// The bytes, e.g. to send them to a member over the authenticated GMS link.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl Drop for KeySecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySecret(..)")
    }
}

fn ring_key(aead: Aead, secret: &KeySecret) -> LessSafeKey {
    // Both algorithms take exactly KEY_LEN bytes, so this cannot fail.
    match UnboundKey::new(aead.algorithm(), &secret.0) {
        Ok(key) => LessSafeKey::new(key),
        Err(_) => unreachable!("AES-256-GCM and ChaCha20-Poly1305 keys are 32 bytes"),
    }
}

fn nonce(sender: u32, counter: u64) -> Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[..4].copy_from_slice(&sender.to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Why a datagram was not sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The datagram is shorter than the clear header.
    #[error("datagram shorter than the {CLEAR_HEADER_LEN}-byte header")]
    TooShort,
    /// The buffer has no room for the trailer behind the datagram.
    #[error("no room for the {TRAILER_LEN}-byte trailer")]
    NoRoom,
    /// The key sealed as many datagrams as its limit allows: a new key is needed.
    #[error("key {0} reached its counter limit: rotate the key")]
    CounterExhausted(KeyId),
}

/// The tag of `buf[..len]` in [`Mode::Authenticate`].
///
/// With AES-256-GCM it is the tag of encrypting the datagram (header and payload) with no
/// associated data: the datagram is copied into `scratch`, encrypted there, and the ciphertext
/// dropped. GCM's tag over associated data alone (GMAC) would do, but ring folds associated
/// data one block at a time, several times slower than its bulk path over ciphertext (ADRs 40
/// and 46). Forging this tag is forging a GCM ciphertext for the same nonce and length; the
/// receiver's recomputation under a nonce already used sends nothing, so no keystream is
/// exposed. With ChaCha20-Poly1305, whose associated data takes the bulk path, the datagram is
/// the associated data of an empty message. `scratch` grows to the largest datagram seen and
/// is kept, so a steady flow allocates nothing.
fn authentication_tag(
    key: &LessSafeKey,
    aead: Aead,
    nonce: Nonce,
    datagram: &[u8],
    scratch: &mut Vec<u8>,
) -> Option<Tag> {
    match aead {
        Aead::Aes256Gcm => {
            scratch.clear();
            scratch.extend_from_slice(datagram);
            key.seal_in_place_separate_tag(nonce, Aad::empty(), scratch)
                .ok()
        }
        Aead::ChaCha20Poly1305 => key
            .seal_in_place_separate_tag(nonce, Aad::from(datagram), &mut [])
            .ok(),
    }
}

/// Whether two tags are equal, in time that does not depend on where they differ.
fn tags_equal(a: &[u8], b: &[u8]) -> bool {
    let differ = a
        .iter()
        .zip(b)
        .fold(u8::from(a.len() != b.len()), |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(differ) == 0
}

/// One sender's key for sealing datagrams: the view's key, this node's id and its counter.
pub struct SealingKey {
    id: KeyId,
    sender: u32,
    mode: Mode,
    aead: Aead,
    key: LessSafeKey,
    /// Where [`Mode::Authenticate`] encrypts a copy of the datagram for its tag.
    scratch: Vec<u8>,
    next: u64,
    limit: u64,
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealingKey")
            .field("id", &self.id)
            .field("sender", &self.sender)
            .field("mode", &self.mode)
            .field("next", &self.next)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl SealingKey {
    /// A key sealing in `mode` as `sender` (the node id), with counters from 0 up to
    /// `counter_limit` (exclusive; [`COUNTER_LIMIT_DEFAULT`] unless there is a reason).
    /// A sender must never get two sealing keys with the same secret and sender id: the
    /// counters would repeat. [`Mode::Off`] gives a key that leaves datagrams as they are.
    #[must_use]
    pub fn new(
        aead: Aead,
        mode: Mode,
        id: KeyId,
        sender: u32,
        secret: &KeySecret,
        counter_limit: u64,
    ) -> SealingKey {
        SealingKey {
            id,
            sender,
            mode,
            aead,
            key: ring_key(aead, secret),
            scratch: Vec::new(),
            next: 0,
            limit: counter_limit,
        }
    }

    /// The key's id.
    #[must_use]
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The mode it seals in.
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Datagrams sealed so far (the next counter).
    #[must_use]
    pub fn sealed(&self) -> u64 {
        self.next
    }

    /// Datagrams it may still seal.
    #[must_use]
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.next)
    }

    /// Whether three quarters of the counter limit are used: time to ask the membership service
    /// for a new key, before sealing fails.
    #[must_use]
    pub fn needs_rotation(&self) -> bool {
        self.mode != Mode::Off && self.next >= self.limit - self.limit / 4
    }

    /// Seals the datagram `buf[..len]` in place and returns its sealed length
    /// (`len + mode.overhead()`); `buf` must have that room. Allocates nothing, except in
    /// [`Mode::Authenticate`] with AES-256-GCM the first time a datagram is longer than any
    /// before (the scratch copy grows).
    pub fn seal(&mut self, buf: &mut [u8], len: usize) -> Result<usize, SealError> {
        if len < CLEAR_HEADER_LEN || len > buf.len() {
            return Err(SealError::TooShort);
        }
        if self.mode == Mode::Off {
            return Ok(len);
        }
        let sealed_len = len + TRAILER_LEN;
        if buf.len() < sealed_len {
            return Err(SealError::NoRoom);
        }
        if self.next >= self.limit {
            return Err(SealError::CounterExhausted(self.id));
        }
        let counter = self.next;
        let fields_end = len + TRAILER_FIELDS_LEN;
        buf[len..len + 4].copy_from_slice(&self.id.0.to_be_bytes());
        buf[len + 4..len + 8].copy_from_slice(&self.sender.to_be_bytes());
        buf[len + 8..fields_end].copy_from_slice(&counter.to_be_bytes());
        let nonce = nonce(self.sender, counter);
        let tag = match self.mode {
            Mode::Authenticate => {
                authentication_tag(&self.key, self.aead, nonce, &buf[..len], &mut self.scratch)
            }
            _ => {
                let (header, payload) = buf[..len].split_at_mut(CLEAR_HEADER_LEN);
                self.key
                    .seal_in_place_separate_tag(nonce, Aad::from(&*header), payload)
                    .ok()
            }
        };
        // ring fails only past its per-call length limit (far beyond any datagram).
        let Some(tag) = tag else {
            return Err(SealError::NoRoom);
        };
        buf[fields_end..sealed_len].copy_from_slice(tag.as_ref());
        self.next += 1;
        Ok(sealed_len)
    }
}

/// Why a received datagram was refused. Each is counted in [`OpenStats`]; the datagram is
/// dropped before the protocol sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Too short to hold the header and the trailer.
    #[error("datagram too short to be sealed")]
    Malformed,
    /// No key with this id is installed (forged, from another cluster, or a view not yet
    /// installed here).
    #[error("unknown key {0}")]
    UnknownKey(KeyId),
    /// The key belongs to a view that ended: typically a removed member still sending.
    #[error("key {0} is retired")]
    RetiredKey(KeyId),
    /// The tag does not verify: forged, corrupted, or sealed with another key or mode.
    #[error("bad tag")]
    BadTag,
    /// This sender's counter was seen before under this key.
    #[error("replayed datagram")]
    Replayed,
    /// This sender's counter is older than the replay window reaches.
    #[error("datagram older than the replay window")]
    TooOld,
    /// The key already holds its maximum number of senders.
    #[error("too many senders under one key")]
    SendersFull,
    /// The trailer's sender is not the header's (with [`KeyRingConfig::header_sender`]).
    #[error("trailer and header name different senders")]
    SenderMismatch,
}

/// Counters of a [`KeyRing`], one per outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenStats {
    /// Datagrams opened (authenticated, not replayed).
    pub opened: u64,
    /// [`OpenError::Malformed`].
    pub malformed: u64,
    /// [`OpenError::UnknownKey`].
    pub unknown_key: u64,
    /// [`OpenError::RetiredKey`].
    pub retired_key: u64,
    /// [`OpenError::BadTag`].
    pub bad_tag: u64,
    /// [`OpenError::Replayed`].
    pub replayed: u64,
    /// [`OpenError::TooOld`].
    pub too_old: u64,
    /// [`OpenError::SendersFull`].
    pub senders_full: u64,
    /// [`OpenError::SenderMismatch`].
    pub sender_mismatch: u64,
}

impl OpenStats {
    /// Counts one outcome of opening: a ring counts its own; a holder of several rings (one
    /// per region) counts into one total, and counts refusals made before any ring (no key
    /// for the datagram's region: [`OpenError::UnknownKey`]).
    pub fn count(&mut self, result: &Result<Opened, OpenError>) {
        let c = match result {
            Ok(_) => &mut self.opened,
            Err(OpenError::Malformed) => &mut self.malformed,
            Err(OpenError::UnknownKey(_)) => &mut self.unknown_key,
            Err(OpenError::RetiredKey(_)) => &mut self.retired_key,
            Err(OpenError::BadTag) => &mut self.bad_tag,
            Err(OpenError::Replayed) => &mut self.replayed,
            Err(OpenError::TooOld) => &mut self.too_old,
            Err(OpenError::SendersFull) => &mut self.senders_full,
            Err(OpenError::SenderMismatch) => &mut self.sender_mismatch,
        };
        *c += 1;
    }

    /// Datagrams refused, all causes.
    #[must_use]
    pub fn refused(&self) -> u64 {
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

/// Who sealed an opened datagram, as authenticated by its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The key it was sealed with.
    pub key: KeyId,
    /// The sender id in the trailer; the host requires it to equal the header's sender.
    pub sender: u32,
    /// The sender's counter under the key.
    pub counter: u64,
}

/// An opened datagram: the protocol datagram is `buf[..len]`, decrypted in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of the protocol datagram (the trailer removed).
    pub len: usize,
    /// Who sealed it; `None` in [`Mode::Off`].
    pub origin: Option<Origin>,
}

/// Limits and algorithms of a [`KeyRing`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRingConfig {
    /// How datagrams are protected; every key of the ring uses it.
    pub mode: Mode,
    /// The AEAD.
    pub aead: Aead,
    /// Keys installed at once, at most (default 8: a node keeps a ring per region, ADR 43,
    /// holding the region's current key and the previous ones still in their grace).
    pub keys_max: usize,
    /// Senders per key, at most (default 256: the members of a region view). A sender's
    /// replay window is allocated when its first datagram under the key opens (with the
    /// defaults, 128 bytes and a 40-byte entry), so a key costs what its senders use.
    pub senders_max: usize,
    /// Width of each sender's replay window in counters, rounded up to a power of two (default
    /// [`WINDOW_BITS_DEFAULT`], at most [`WINDOW_BITS_MAX`]).
    pub window_bits: usize,
    /// Retired key ids remembered, to tell a retired key from an unknown one (default 256).
    pub retired_max: usize,
    /// Require the trailer's sender to equal the header's (at [`HEADER_SENDER_OFFSET`]), so
    /// the protocol can trust the header's sender (default true: every tidings datagram is
    /// sealed by the node its header names).
    pub header_sender: bool,
}

impl Default for KeyRingConfig {
    fn default() -> KeyRingConfig {
        KeyRingConfig {
            mode: Mode::Encrypt,
            aead: Aead::Aes256Gcm,
            keys_max: 8,
            senders_max: 256,
            window_bits: WINDOW_BITS_DEFAULT,
            retired_max: 256,
            header_sender: true,
        }
    }
}

/// A setting of [`KeyRingConfig`] out of range, or a key that cannot be installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `keys_max`, `senders_max` or `retired_max` is zero, or `window_bits` is not in
    /// `64..=WINDOW_BITS_MAX`.
    #[error("key ring limits out of range")]
    Config,
    /// `keys_max` keys are installed.
    #[error("key ring full")]
    Full,
    /// A key with this id is installed.
    #[error("key {0} is installed")]
    Installed(KeyId),
    /// The id was retired; ids are never reused.
    #[error("key {0} was retired")]
    Retired(KeyId),
}

impl KeyRingConfig {
    /// Checks the limits.
    pub fn validate(&self) -> Result<(), KeyError> {
        if self.keys_max == 0
            || self.senders_max == 0
            || self.retired_max == 0
            || !(64..=WINDOW_BITS_MAX).contains(&self.window_bits)
        {
            return Err(KeyError::Config);
        }
        Ok(())
    }
}

/// One installed key: its cipher and its senders' replay windows.
struct OpenKey {
    id: KeyId,
    key: LessSafeKey,
    /// Each sender seen under the key and its replay window, sorted by sender; at most
    /// `senders_max`, added when a sender's first datagram opens.
    senders: Vec<(u32, ReplayWindow)>,
}

/// The receiving side: the keys a node accepts, by id, each with a replay window per sender.
/// Opening allocates only for a sender's first datagram under a key (its replay window) and,
/// in [`Mode::Authenticate`] with AES-256-GCM, for a datagram longer than any before (the
/// scratch copy grows): a steady flow allocates nothing.
pub struct KeyRing {
    config: KeyRingConfig,
    /// Sorted by id.
    keys: Vec<OpenKey>,
    retired: VecDeque<KeyId>,
    stats: OpenStats,
    /// Where [`Mode::Authenticate`] encrypts a copy of the datagram for its tag.
    scratch: Vec<u8>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("config", &self.config)
            .field("keys", &self.keys.iter().map(|k| k.id).collect::<Vec<_>>())
            .field("retired", &self.retired)
            .field("stats", &self.stats)
            .finish()
    }
}

impl KeyRing {
    /// An empty ring.
    pub fn new(config: KeyRingConfig) -> Result<KeyRing, KeyError> {
        config.validate()?;
        Ok(KeyRing {
            keys: Vec::with_capacity(config.keys_max),
            retired: VecDeque::with_capacity(config.retired_max),
            stats: OpenStats::default(),
            scratch: Vec::new(),
            config,
        })
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &KeyRingConfig {
        &self.config
    }

    /// Counters by outcome.
    #[must_use]
    pub fn stats(&self) -> &OpenStats {
        &self.stats
    }

    /// Whether key `id` is installed.
    #[must_use]
    pub fn contains(&self, id: KeyId) -> bool {
        self.find(id).is_ok()
    }

    /// Installed keys.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is installed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn find(&self, id: KeyId) -> Result<usize, usize> {
        self.keys.binary_search_by_key(&id, |k| k.id)
    }

    /// Installs key `id` (a view's key, received from the membership service).
    pub fn install(&mut self, id: KeyId, secret: &KeySecret) -> Result<(), KeyError> {
        if self.retired.contains(&id) {
            return Err(KeyError::Retired(id));
        }
        let at = match self.find(id) {
            Ok(_) => return Err(KeyError::Installed(id)),
            Err(at) => at,
        };
        if self.keys.len() >= self.config.keys_max {
            return Err(KeyError::Full);
        }
        self.keys.insert(
            at,
            OpenKey {
                id,
                key: ring_key(self.config.aead, secret),
                senders: Vec::new(),
            },
        );
        Ok(())
    }

    /// Retires key `id` (its view ended): its datagrams are refused as
    /// [`OpenError::RetiredKey`] from now on. Returns whether it was installed.
    pub fn retire(&mut self, id: KeyId) -> bool {
        let was = match self.find(id) {
            Ok(at) => {
                self.keys.remove(at);
                true
            }
            Err(_) => false,
        };
        if !self.retired.contains(&id) {
            if self.retired.len() >= self.config.retired_max {
                self.retired.pop_front();
            }
            self.retired.push_back(id);
        }
        was
    }

    /// Opens the sealed datagram `buf` in place (decrypting its payload in
    /// [`Mode::Encrypt`]); on success the protocol datagram is `buf[..opened.len]`. Counts the
    /// outcome. Allocates only as [`KeyRing`] says; on failure the buffer's payload is
    /// unspecified.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Opened, OpenError> {
        let result = self.open_inner(buf);
        self.stats.count(&result);
        result
    }

    fn open_inner(&mut self, buf: &mut [u8]) -> Result<Opened, OpenError> {
        if self.config.mode == Mode::Off {
            if buf.len() < CLEAR_HEADER_LEN {
                return Err(OpenError::Malformed);
            }
            return Ok(Opened {
                len: buf.len(),
                origin: None,
            });
        }
        let Some(len) = buf.len().checked_sub(TRAILER_LEN) else {
            return Err(OpenError::Malformed);
        };
        if len < CLEAR_HEADER_LEN {
            return Err(OpenError::Malformed);
        }
        let fields_end = len + TRAILER_FIELDS_LEN;
        let key_id = KeyId(be_u32(&buf[len..len + 4]));
        let sender = be_u32(&buf[len + 4..len + 8]);
        let mut counter_bytes = [0u8; 8];
        counter_bytes.copy_from_slice(&buf[len + 8..fields_end]);
        let counter = u64::from_be_bytes(counter_bytes);
        if self.config.header_sender
            && be_u32(&buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4]) != sender
        {
            return Err(OpenError::SenderMismatch);
        }
        let mut tag_bytes = [0u8; TAG_LEN];
        tag_bytes.copy_from_slice(&buf[fields_end..]);

        let Ok(at) = self.find(key_id) else {
            return Err(if self.retired.contains(&key_id) {
                OpenError::RetiredKey(key_id)
            } else {
                OpenError::UnknownKey(key_id)
            });
        };
        let key = &mut self.keys[at];
        let slot = key.senders.binary_search_by_key(&sender, |s| s.0);
        if let Ok(i) = slot {
            key.senders[i].1.check(counter).map_err(refusal)?;
        }
        let nonce = nonce(sender, counter);
        let verified = match self.config.mode {
            Mode::Authenticate => authentication_tag(
                &key.key,
                self.config.aead,
                nonce,
                &buf[..len],
                &mut self.scratch,
            )
            .is_some_and(|expected| tags_equal(expected.as_ref(), &tag_bytes)),
            _ => {
                let (header, payload) = buf[..len].split_at_mut(CLEAR_HEADER_LEN);
                key.key
                    .open_in_place_separate_tag(
                        nonce,
                        Aad::from(&*header),
                        Tag::from(tag_bytes),
                        payload,
                        0..,
                    )
                    .is_ok()
            }
        };
        if !verified {
            return Err(OpenError::BadTag);
        }
        let window = match slot {
            Ok(i) => &mut key.senders[i].1,
            Err(i) => {
                if key.senders.len() >= self.config.senders_max {
                    return Err(OpenError::SendersFull);
                }
                key.senders
                    .insert(i, (sender, ReplayWindow::new(self.config.window_bits)));
                &mut key.senders[i].1
            }
        };
        window.accept(counter).map_err(refusal)?;
        Ok(Opened {
            len,
            origin: Some(Origin {
                key: key_id,
                sender,
                counter,
            }),
        })
    }
}

fn refusal(r: Refusal) -> OpenError {
    match r {
        Refusal::Replayed => OpenError::Replayed,
        Refusal::TooOld => OpenError::TooOld,
    }
}

fn be_u32(bytes: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[..4]);
    u32::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; 32] = [7; 32];
    /// The clear header's length, in front of every test payload.
    const H: usize = CLEAR_HEADER_LEN;

    fn ring(mode: Mode, aead: Aead) -> KeyRing {
        let mut ring = KeyRing::new(KeyRingConfig {
            mode,
            aead,
            senders_max: 4,
            window_bits: 64,
            ..KeyRingConfig::default()
        })
        .unwrap();
        ring.install(KeyId(1), &KeySecret::from_bytes(SECRET))
            .unwrap();
        ring
    }

    fn sealer(mode: Mode, aead: Aead, sender: u32) -> SealingKey {
        SealingKey::new(
            aead,
            mode,
            KeyId(1),
            sender,
            &KeySecret::from_bytes(SECRET),
            COUNTER_LIMIT_DEFAULT,
        )
    }

    /// A datagram whose header (incarnation 1, region 2, view 3) names sender 9.
    fn datagram(payload: &[u8]) -> Vec<u8> {
        let mut d = b"TD\x02\x01\0\0\0\x01\0\0\0\x02\0\0\0\x03\0\0\0\x09".to_vec();
        d.extend_from_slice(payload);
        d.resize(d.len() + TRAILER_LEN, 0);
        d
    }

    #[test]
    fn round_trip_every_mode_and_aead() {
        for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
            for mode in [Mode::Off, Mode::Authenticate, Mode::Encrypt] {
                let mut s = sealer(mode, aead, 9);
                let mut r = ring(mode, aead);
                let mut buf = datagram(b"hello world");
                let plain = buf[..H + 11].to_vec();
                let n = s.seal(&mut buf, H + 11).unwrap();
                assert_eq!(n, H + 11 + mode.overhead());
                if mode == Mode::Encrypt {
                    assert_ne!(&buf[H..H + 11], b"hello world");
                }
                assert_eq!(&buf[..H], &plain[..H], "header stays clear");
                let opened = r.open(&mut buf[..n]).unwrap();
                assert_eq!(opened.len, H + 11);
                assert_eq!(&buf[..H + 11], &plain[..]);
                if mode != Mode::Off {
                    assert_eq!(
                        opened.origin,
                        Some(Origin {
                            key: KeyId(1),
                            sender: 9,
                            counter: 0
                        })
                    );
                }
            }
        }
    }

    /// With AES-256-GCM an authenticated datagram carries the tag of encrypting its header and
    /// payload with no associated data, and its payload stays clear.
    #[test]
    fn authenticate_sends_the_tag_of_the_encrypted_datagram_in_clear() {
        let payload = b"sent in clear, tagged as if encrypted";
        let mut auth = datagram(payload);
        let len = auth.len() - TRAILER_LEN;
        sealer(Mode::Authenticate, Aead::Aes256Gcm, 9)
            .seal(&mut auth, len)
            .unwrap();
        assert_eq!(&auth[H..len], payload);
        let mut copy = auth[..len].to_vec();
        let expected = ring_key(Aead::Aes256Gcm, &KeySecret::from_bytes(SECRET))
            .seal_in_place_separate_tag(nonce(9, 0), Aad::empty(), &mut copy)
            .unwrap();
        assert_eq!(&auth[len + TRAILER_FIELDS_LEN..], expected.as_ref());
        let mut ring = ring(Mode::Authenticate, Aead::Aes256Gcm);
        let opened = ring.open(&mut auth.clone()).unwrap();
        assert_eq!(opened.len, len);
        auth[H] ^= 1;
        let mut fresh = super::tests::ring(Mode::Authenticate, Aead::Aes256Gcm);
        assert_eq!(fresh.open(&mut auth), Err(OpenError::BadTag));
    }

    /// The trailer's fields are not associated data, yet none of them can be changed: the
    /// sender and the counter are the nonce, and the key id picks the key.
    #[test]
    fn trailer_fields_are_bound_by_nonce_and_key() {
        for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
            for mode in [Mode::Authenticate, Mode::Encrypt] {
                let mut s = sealer(mode, aead, 9);
                let mut buf = datagram(b"bound");
                let n = s.seal(&mut buf, H + 5).unwrap();
                let sealed = buf[..n].to_vec();
                let mut r = KeyRing::new(KeyRingConfig {
                    mode,
                    aead,
                    header_sender: false,
                    ..KeyRingConfig::default()
                })
                .unwrap();
                r.install(KeyId(1), &KeySecret::from_bytes(SECRET)).unwrap();
                r.install(KeyId(2), &KeySecret::from_bytes([8; 32]))
                    .unwrap();
                let fields = H + 5;
                let mut other_key = sealed.clone();
                other_key[fields..fields + 4].copy_from_slice(&2u32.to_be_bytes());
                assert_eq!(r.open(&mut other_key), Err(OpenError::BadTag), "{mode}");
                let mut other_sender = sealed.clone();
                other_sender[fields + 4..fields + 8].copy_from_slice(&8u32.to_be_bytes());
                assert_eq!(r.open(&mut other_sender), Err(OpenError::BadTag), "{mode}");
                let mut other_counter = sealed.clone();
                other_counter[fields + 15] = 1;
                assert_eq!(r.open(&mut other_counter), Err(OpenError::BadTag), "{mode}");
                assert!(r.open(&mut sealed.clone()).is_ok(), "{mode}");
            }
        }
    }

    #[test]
    fn refusals_by_cause() {
        let mut s = sealer(Mode::Encrypt, Aead::Aes256Gcm, 9);
        let mut r = ring(Mode::Encrypt, Aead::Aes256Gcm);
        let mut buf = datagram(b"x");
        let n = s.seal(&mut buf, H + 1).unwrap();
        let sealed = buf[..n].to_vec();
        assert!(r.open(&mut buf[..n]).is_ok());
        let mut again = sealed.clone();
        assert_eq!(r.open(&mut again), Err(OpenError::Replayed));
        let mut fresh = datagram(b"x");
        let n2 = s.seal(&mut fresh, H + 1).unwrap();
        let mut flipped = fresh[..n2].to_vec();
        flipped[H] ^= 1;
        assert_eq!(r.open(&mut flipped), Err(OpenError::BadTag));
        assert_eq!(
            r.open(&mut [0u8; H + TRAILER_LEN - 1]),
            Err(OpenError::Malformed)
        );
        let mut other = sealed.clone();
        other[H + 1..H + 5].copy_from_slice(&5u32.to_be_bytes());
        assert_eq!(r.open(&mut other), Err(OpenError::UnknownKey(KeyId(5))));
        assert!(r.retire(KeyId(1)));
        let mut late = sealed.clone();
        assert_eq!(r.open(&mut late), Err(OpenError::RetiredKey(KeyId(1))));
        assert_eq!(
            r.install(KeyId(1), &KeySecret::from_bytes(SECRET)),
            Err(KeyError::Retired(KeyId(1)))
        );
        let st = r.stats();
        assert_eq!(
            (
                st.opened,
                st.replayed,
                st.bad_tag,
                st.malformed,
                st.unknown_key,
                st.retired_key
            ),
            (1, 1, 1, 1, 1, 1)
        );
        assert_eq!(st.refused(), 5);
    }

    #[test]
    fn modes_and_aeads_do_not_mix() {
        let mut buf = datagram(b"payload");
        let n = sealer(Mode::Authenticate, Aead::Aes256Gcm, 9)
            .seal(&mut buf, H + 7)
            .unwrap();
        let sealed = buf[..n].to_vec();
        let mut a = sealed.clone();
        assert_eq!(
            ring(Mode::Encrypt, Aead::Aes256Gcm).open(&mut a),
            Err(OpenError::BadTag)
        );
        let mut b = sealed.clone();
        assert_eq!(
            ring(Mode::Authenticate, Aead::ChaCha20Poly1305).open(&mut b),
            Err(OpenError::BadTag)
        );
    }

    #[test]
    fn trailer_sender_must_be_the_header_sender() {
        // A member sealing in another member's name with its own id in the trailer.
        let mut s = sealer(Mode::Authenticate, Aead::Aes256Gcm, 4);
        let mut r = ring(Mode::Authenticate, Aead::Aes256Gcm);
        let mut buf = datagram(b"forged");
        let n = s.seal(&mut buf, H + 6).unwrap();
        assert_eq!(r.open(&mut buf[..n]), Err(OpenError::SenderMismatch));
        assert_eq!(r.stats().sender_mismatch, 1);
        // Without the check, the host sees the trailer's sender and compares it itself.
        let mut r = KeyRing::new(KeyRingConfig {
            mode: Mode::Authenticate,
            header_sender: false,
            ..KeyRingConfig::default()
        })
        .unwrap();
        r.install(KeyId(1), &KeySecret::from_bytes(SECRET)).unwrap();
        assert_eq!(r.open(&mut buf[..n]).unwrap().origin.unwrap().sender, 4);
    }

    #[test]
    fn counter_limit_asks_for_rotation() {
        let mut s = SealingKey::new(
            Aead::Aes256Gcm,
            Mode::Authenticate,
            KeyId(3),
            1,
            &KeySecret::from_bytes(SECRET),
            4,
        );
        let mut buf = datagram(b"");
        for _ in 0..3 {
            s.seal(&mut buf, H).unwrap();
        }
        assert!(s.needs_rotation());
        assert_eq!(s.remaining(), 1);
        s.seal(&mut buf, H).unwrap();
        assert_eq!(
            s.seal(&mut buf, H),
            Err(SealError::CounterExhausted(KeyId(3)))
        );
        let err = SealError::CounterExhausted(KeyId(3)).to_string();
        assert!(err.contains("rotate"), "{err}");
    }

    #[test]
    fn seal_checks_lengths() {
        let mut s = sealer(Mode::Encrypt, Aead::Aes256Gcm, 1);
        assert_eq!(
            s.seal(&mut [0u8; H + TRAILER_LEN], H - 1),
            Err(SealError::TooShort)
        );
        assert_eq!(
            s.seal(&mut [0u8; H + TRAILER_LEN], H + TRAILER_LEN + 1),
            Err(SealError::TooShort)
        );
        assert_eq!(
            s.seal(&mut [0u8; H + TRAILER_LEN - 1], H),
            Err(SealError::NoRoom)
        );
        assert_eq!(s.seal(&mut [0u8; H + TRAILER_LEN], H), Ok(H + TRAILER_LEN));
    }

    #[test]
    fn senders_are_bounded_and_tracked_apart() {
        let mut r = ring(Mode::Authenticate, Aead::Aes256Gcm);
        for sender in 0..5u32 {
            let mut s = sealer(Mode::Authenticate, Aead::Aes256Gcm, sender);
            let mut buf = datagram(b"abc");
            buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4]
                .copy_from_slice(&sender.to_be_bytes());
            let n = s.seal(&mut buf, H + 3).unwrap();
            let got = r.open(&mut buf[..n]);
            if sender < 4 {
                assert!(got.is_ok(), "{sender}");
            } else {
                assert_eq!(got, Err(OpenError::SendersFull));
            }
        }
        assert_eq!(r.stats().senders_full, 1);
    }

    #[test]
    fn ring_limits() {
        assert_eq!(
            KeyRing::new(KeyRingConfig {
                window_bits: 63,
                ..KeyRingConfig::default()
            })
            .err(),
            Some(KeyError::Config)
        );
        let mut r = KeyRing::new(KeyRingConfig {
            keys_max: 1,
            ..KeyRingConfig::default()
        })
        .unwrap();
        let k = KeySecret::from_bytes(SECRET);
        r.install(KeyId(1), &k).unwrap();
        assert_eq!(r.install(KeyId(1), &k), Err(KeyError::Installed(KeyId(1))));
        assert_eq!(r.install(KeyId(2), &k), Err(KeyError::Full));
        assert!(!r.retire(KeyId(9)));
        let mut buf = [0u8; 64];
        buf[32..36].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(r.open(&mut buf), Err(OpenError::RetiredKey(KeyId(9))));
        assert_eq!("encrypt".parse::<Mode>(), Ok(Mode::Encrypt));
        assert!("plain".parse::<Mode>().is_err());
        assert_eq!(format!("{:?}", k), "KeySecret(..)");
    }
}
