//! Admission to the membership service and the GMS link's datagram transport.
//!
//! A node (the initiator) and the service (the responder) run the Noise handshake
//! [`PATTERN`] (`Noise_IK_25519_ChaChaPoly_BLAKE2s`) with `snow`: the node knows the service's
//! static key beforehand (from its configuration), so the handshake takes one round trip, and
//! the service learns the node's static key from the first message and admits it only if it is on
//! its [`AllowList`]. The second message answers in both cases, authenticated by the service's
//! key: admitted, or refused. Every datagram starts with [`LINK_MAGIC`] and a type byte:
//!
//! ```text
//! hello      | "TGS\x01" | 1 | Noise IK message 1 (104 bytes; payload: stamp u64)  |
//! welcome    | "TGS\x01" | 2 | Noise IK message 2 (49 bytes; payload: 1 admitted, 0 refused) |
//! unreadable | "TGS\x01" | 3 |   (clear notice: the service could not read the hello)
//! data       | "TGS\x01" | 4 | nonce u64 | ciphertext and tag                      |
//! ```
//!
//! The hello carries a stamp (e.g. the node's wall clock in microseconds) that must grow from
//! one hello of an identity to the next, as WireGuard's TAI64N timestamp: a replayed hello
//! cannot make the service start a new session in place of the node's. After the handshake,
//! data datagrams carry an explicit nonce (`snow`'s `StatelessTransportState`), so they may be
//! lost or reordered as UDP does, and each side refuses a nonce twice with a [`ReplayWindow`].

use std::collections::BTreeMap;
use std::fmt;

use crate::identity::{AllowList, Identity, PublicKey};
use crate::window::{Refusal, ReplayWindow};

/// The Noise protocol of the admission handshake.
pub const PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// Bound into the handshake hash, so a handshake of another protocol or version never
/// completes with ours.
pub const PROLOGUE: &[u8] = b"tidings admission 1";
/// The first bytes of every link datagram: unlike the protocol's "TD" and the plain GMS
/// framing, so one socket carries all three.
pub const LINK_MAGIC: [u8; 4] = *b"TGS\x01";
/// Bytes of a hello datagram.
pub const HELLO_LEN: usize = LINK_MAGIC.len() + 1 + 32 + 48 + 8 + 16;
/// Bytes of a welcome datagram.
pub const WELCOME_LEN: usize = LINK_MAGIC.len() + 1 + 32 + 1 + 16;
/// Bytes of an unreadable notice.
pub const UNREADABLE_LEN: usize = LINK_MAGIC.len() + 1;
/// The unreadable notice: a service sends it for a hello it cannot read (the node has a wrong
/// service key) and for a data datagram of an address it has no session with (the service
/// restarted, or the session was replaced). Not authenticated: a hint to start a handshake again.
pub const UNREADABLE_NOTICE: [u8; UNREADABLE_LEN] = [
    LINK_MAGIC[0],
    LINK_MAGIC[1],
    LINK_MAGIC[2],
    LINK_MAGIC[3],
    UNREADABLE,
];
/// Bytes a data datagram has more than its payload.
pub const DATA_OVERHEAD: usize = LINK_MAGIC.len() + 1 + 8 + 16;
/// Largest link datagram (the largest UDP payload over IPv4).
pub const DATAGRAM_BYTES_MAX: usize = 65_507;
/// Largest payload of a data datagram.
pub const PAYLOAD_BYTES_MAX: usize = DATAGRAM_BYTES_MAX - DATA_OVERHEAD;
/// Width of a session's replay window, in nonces.
pub const SESSION_WINDOW_BITS: usize = 1024;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const UNREADABLE: u8 = 3;
const DATA: u8 = 4;

/// Bytes of randomness one side of a handshake consumes (its ephemeral key).
pub const ENTROPY_LEN: usize = 32;

/// `snow`'s primitives, except that the randomness is the caller's: the ephemeral key of one
/// handshake, drawn by the host (the operating system's RNG) or by the simulator's seed.
struct InputEntropy(std::sync::Mutex<Option<[u8; ENTROPY_LEN]>>);

/// Hands out its bytes once; a second request fails rather than repeat them.
struct OneShot(Option<zeroize::Zeroizing<[u8; ENTROPY_LEN]>>);

impl snow::types::Random for OneShot {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        match self.0.take() {
            Some(bytes) if dest.len() <= ENTROPY_LEN => {
                dest.copy_from_slice(&bytes[..dest.len()]);
                Ok(())
            }
            _ => Err(snow::Error::Rng),
        }
    }
}

impl snow::resolvers::CryptoResolver for InputEntropy {
    fn resolve_rng(&self) -> Option<Box<dyn snow::types::Random>> {
        let bytes = self.0.lock().ok()?.take().map(zeroize::Zeroizing::new);
        Some(Box::new(OneShot(bytes)))
    }
    fn resolve_dh(&self, choice: &snow::params::DHChoice) -> Option<Box<dyn snow::types::Dh>> {
        snow::resolvers::DefaultResolver.resolve_dh(choice)
    }
    fn resolve_hash(
        &self,
        choice: &snow::params::HashChoice,
    ) -> Option<Box<dyn snow::types::Hash>> {
        snow::resolvers::DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(
        &self,
        choice: &snow::params::CipherChoice,
    ) -> Option<Box<dyn snow::types::Cipher>> {
        snow::resolvers::DefaultResolver.resolve_cipher(choice)
    }
}

fn builder<'a>(entropy: [u8; ENTROPY_LEN]) -> snow::Builder<'a> {
    snow::Builder::with_resolver(
        params(),
        Box::new(InputEntropy(std::sync::Mutex::new(Some(entropy)))),
    )
}

pub(crate) fn params() -> snow::params::NoiseParams {
    match PATTERN.parse() {
        Ok(p) => p,
        Err(_) => unreachable!("PATTERN is a valid Noise protocol name"),
    }
}

/// Why a handshake or transport datagram was refused. Each is counted by the side that saw it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Not a link datagram of the expected type, or of the wrong length.
    #[error("malformed link datagram")]
    Malformed,
    /// The service refused this identity: it is not on the service's allowed list. The answer is
    /// authenticated by the service's key.
    #[error("identity {0} is not admitted by the service: add it to the allowed identities")]
    NotAdmitted(PublicKey),
    /// The answer does not come from the service key configured here (or the service said it
    /// could not read the hello, which it does when the node holds another key for it): check
    /// the service public key in the node's configuration. An attacker can also send this, so
    /// the host keeps waiting for the real answer until its handshake times out.
    #[error("the service's answer does not match the service key configured here")]
    WrongServiceKey,
    /// The service could not read a hello: sealed for another service key, or forged.
    #[error("hello not readable with this service's key")]
    Unreadable,
    /// A hello whose stamp is not newer than the last one of the same identity: a replay.
    #[error("replayed hello")]
    ReplayedHello,
    /// A data datagram whose tag does not verify.
    #[error("bad tag")]
    BadTag,
    /// A data datagram whose nonce was seen before, or is older than the window.
    #[error("replayed datagram")]
    Replayed,
    /// The payload is larger than [`PAYLOAD_BYTES_MAX`] or the output buffer is too small.
    #[error("payload or buffer size out of range")]
    Size,
    /// The session used all its nonces: run a new handshake.
    #[error("session nonces exhausted: run a new handshake")]
    Exhausted,
    /// The handshake already finished.
    #[error("handshake already finished")]
    Finished,
    /// `snow` failed where it should not (a bug or a broken RNG).
    #[error("noise: {0}")]
    Noise(String),
}

fn noise(e: snow::Error) -> LinkError {
    LinkError::Noise(e.to_string())
}

fn typed(datagram: &[u8], kind: u8) -> Option<&[u8]> {
    let rest = datagram.strip_prefix(&LINK_MAGIC)?;
    let (&t, body) = rest.split_first()?;
    (t == kind).then_some(body)
}

/// Whether `datagram` is a link datagram (any type), so a host can tell it from the protocol's
/// and the plain GMS's on a shared socket.
#[must_use]
pub fn is_link_datagram(datagram: &[u8]) -> bool {
    datagram.starts_with(&LINK_MAGIC)
}

/// The node's side of a handshake in progress.
pub struct Initiator {
    state: Option<snow::HandshakeState>,
    own: PublicKey,
}

impl fmt::Debug for Initiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Initiator")
            .field("own", &self.own)
            .field("finished", &self.state.is_none())
            .finish()
    }
}

impl Initiator {
    /// Starts a handshake of `identity` with the service whose key is `service`, writing the
    /// hello into `out` (at least [`HELLO_LEN`] bytes); returns the initiator and the hello's
    /// length. `stamp` must grow from one hello of this identity to the next (a clock in
    /// microseconds does); each retry sends a new hello from a new initiator. `entropy` must be
    /// fresh random bytes for every call ([`crate::os_random`] on a real host, the seeded RNG
    /// in the simulator): they become the handshake's ephemeral key.
    pub fn start(
        identity: &Identity,
        service: &PublicKey,
        stamp: u64,
        entropy: [u8; ENTROPY_LEN],
        out: &mut [u8],
    ) -> Result<(Initiator, usize), LinkError> {
        if out.len() < HELLO_LEN {
            return Err(LinkError::Size);
        }
        let mut state = builder(entropy)
            .local_private_key(identity.private())
            .and_then(|b| b.remote_public_key(&service.0))
            .and_then(|b| b.prologue(PROLOGUE))
            .and_then(snow::Builder::build_initiator)
            .map_err(noise)?;
        out[..LINK_MAGIC.len()].copy_from_slice(&LINK_MAGIC);
        out[LINK_MAGIC.len()] = HELLO;
        let n = state
            .write_message(
                &stamp.to_be_bytes(),
                &mut out[LINK_MAGIC.len() + 1..HELLO_LEN],
            )
            .map_err(noise)?;
        debug_assert_eq!(LINK_MAGIC.len() + 1 + n, HELLO_LEN);
        Ok((
            Initiator {
                state: Some(state),
                own: *identity.public(),
            },
            HELLO_LEN,
        ))
    }

    /// Reads the service's answer. `Ok` is an admitted session. [`LinkError::NotAdmitted`] is
    /// final (the answer is authenticated). Any other error leaves the handshake as it was, so
    /// a forged or stray datagram does not stop the real answer from being read.
    pub fn finish(&mut self, datagram: &[u8]) -> Result<Session, LinkError> {
        let Some(state) = self.state.as_mut() else {
            return Err(LinkError::Finished);
        };
        if datagram.len() == UNREADABLE_LEN && typed(datagram, UNREADABLE).is_some() {
            return Err(LinkError::WrongServiceKey);
        }
        let Some(body) = typed(datagram, WELCOME) else {
            return Err(LinkError::Malformed);
        };
        if datagram.len() != WELCOME_LEN {
            return Err(LinkError::Malformed);
        }
        let mut verdict = [0u8; 1];
        match state.read_message(body, &mut verdict) {
            Ok(1) => {}
            Ok(_) => return Err(LinkError::Malformed),
            Err(_) => return Err(LinkError::WrongServiceKey),
        }
        let Some(state) = self.state.take() else {
            return Err(LinkError::Finished);
        };
        match verdict[0] {
            1 => Session::new(state),
            _ => Err(LinkError::NotAdmitted(self.own)),
        }
    }
}

/// Counters of a [`Responder`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponderStats {
    /// Hellos admitted (a session started).
    pub admitted: u64,
    /// Hellos of identities not on the allowed list (answered with a refusal).
    pub refused: u64,
    /// Hellos that could not be read (answered with an unreadable notice).
    pub unreadable: u64,
    /// Hellos whose stamp was not newer than the identity's last (dropped).
    pub replayed: u64,
    /// Datagrams that were not hellos of the right length (dropped).
    pub malformed: u64,
}

/// What a [`Responder`] did with a hello.
#[derive(Debug)]
pub struct Answer {
    /// Bytes of the reply written to the output buffer, 0 when nothing is sent.
    pub reply_len: usize,
    /// The admitted session, or why there is none.
    pub outcome: Result<Session, LinkError>,
}

/// The service's side: admits the identities on its allowed list.
pub struct Responder {
    identity: Identity,
    allowed: AllowList,
    /// The last stamp of each admitted identity (at most one entry per allowed identity).
    stamps: BTreeMap<PublicKey, u64>,
    stats: ResponderStats,
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("identity", &self.identity)
            .field("allowed", &self.allowed.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Responder {
    /// A responder with the service's `identity` admitting `allowed`.
    #[must_use]
    pub fn new(identity: Identity, allowed: AllowList) -> Responder {
        Responder {
            identity,
            allowed,
            stamps: BTreeMap::new(),
            stats: ResponderStats::default(),
        }
    }

    /// Counters by outcome.
    #[must_use]
    pub fn stats(&self) -> &ResponderStats {
        &self.stats
    }

    /// The service's public key, which nodes configure.
    #[must_use]
    pub fn public(&self) -> &PublicKey {
        self.identity.public()
    }

    /// Replaces the allowed list; sessions already admitted are the host's to end.
    pub fn set_allowed(&mut self, allowed: AllowList) {
        self.stamps.retain(|k, _| allowed.contains(k));
        self.allowed = allowed;
    }

    /// Handles a hello, writing the reply (if any) into `out` (at least [`WELCOME_LEN`]
    /// bytes). The host sends `out[..reply_len]` to the hello's source address and, when the
    /// outcome is a session, keeps it for that address (replacing an older one). `entropy`
    /// must be fresh random bytes for every call, as for [`Initiator::start`].
    pub fn handle_hello(
        &mut self,
        datagram: &[u8],
        entropy: [u8; ENTROPY_LEN],
        out: &mut [u8],
    ) -> Answer {
        let answer = self.hello(datagram, entropy, out);
        let counter = match &answer.outcome {
            Ok(_) => &mut self.stats.admitted,
            Err(LinkError::NotAdmitted(_)) => &mut self.stats.refused,
            Err(LinkError::Unreadable) => &mut self.stats.unreadable,
            Err(LinkError::ReplayedHello) => &mut self.stats.replayed,
            Err(_) => &mut self.stats.malformed,
        };
        *counter += 1;
        answer
    }

    fn hello(&mut self, datagram: &[u8], entropy: [u8; ENTROPY_LEN], out: &mut [u8]) -> Answer {
        let refuse = |e| Answer {
            reply_len: 0,
            outcome: Err(e),
        };
        let Some(body) = typed(datagram, HELLO) else {
            return refuse(LinkError::Malformed);
        };
        if datagram.len() != HELLO_LEN || out.len() < WELCOME_LEN {
            return refuse(LinkError::Malformed);
        }
        let state = builder(entropy)
            .local_private_key(self.identity.private())
            .and_then(|b| b.prologue(PROLOGUE))
            .and_then(snow::Builder::build_responder);
        let mut state = match state {
            Ok(s) => s,
            Err(e) => return refuse(noise(e)),
        };
        let mut stamp = [0u8; 8];
        match state.read_message(body, &mut stamp) {
            Ok(8) => {}
            Ok(_) => return refuse(LinkError::Malformed),
            Err(_) => {
                out[..LINK_MAGIC.len()].copy_from_slice(&LINK_MAGIC);
                out[LINK_MAGIC.len()] = UNREADABLE;
                return Answer {
                    reply_len: UNREADABLE_LEN,
                    outcome: Err(LinkError::Unreadable),
                };
            }
        }
        let Some(peer) = state.get_remote_static().and_then(PublicKey::from_slice) else {
            return refuse(LinkError::Malformed);
        };
        let admitted = self.allowed.contains(&peer);
        if admitted {
            let stamp = u64::from_be_bytes(stamp);
            if self.stamps.get(&peer).is_some_and(|&last| stamp <= last) {
                return refuse(LinkError::ReplayedHello);
            }
            self.stamps.insert(peer, stamp);
        }
        out[..LINK_MAGIC.len()].copy_from_slice(&LINK_MAGIC);
        out[LINK_MAGIC.len()] = WELCOME;
        let verdict = [u8::from(admitted)];
        match state.write_message(&verdict, &mut out[LINK_MAGIC.len() + 1..WELCOME_LEN]) {
            Ok(n) => debug_assert_eq!(LINK_MAGIC.len() + 1 + n, WELCOME_LEN),
            Err(e) => return refuse(noise(e)),
        }
        let outcome = if admitted {
            Session::new(state)
        } else {
            Err(LinkError::NotAdmitted(peer))
        };
        Answer {
            reply_len: WELCOME_LEN,
            outcome,
        }
    }
}

/// Counters of a [`Session`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Datagrams sealed.
    pub sealed: u64,
    /// Datagrams opened.
    pub opened: u64,
    /// Datagrams refused: not a data datagram, or sizes out of range.
    pub malformed: u64,
    /// Datagrams refused: bad tag.
    pub bad_tag: u64,
    /// Datagrams refused: replayed or older than the window.
    pub replayed: u64,
}

/// An admitted link: datagrams encrypted and authenticated both ways, with explicit nonces so
/// that loss and reordering are harmless, and a replay window on receipt.
pub struct Session {
    transport: snow::StatelessTransportState,
    peer: PublicKey,
    next_nonce: u64,
    window: ReplayWindow,
    stats: SessionStats,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("peer", &self.peer)
            .field("next_nonce", &self.next_nonce)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Session {
    fn new(state: snow::HandshakeState) -> Result<Session, LinkError> {
        let peer = state
            .get_remote_static()
            .and_then(PublicKey::from_slice)
            .ok_or(LinkError::Malformed)?;
        let transport = state.into_stateless_transport_mode().map_err(noise)?;
        Ok(Session {
            transport,
            peer,
            next_nonce: 0,
            window: ReplayWindow::new(SESSION_WINDOW_BITS),
            stats: SessionStats::default(),
        })
    }

    /// The other side's static key: the node's identity on the service's side, the service's
    /// key on the node's.
    #[must_use]
    pub fn peer(&self) -> &PublicKey {
        &self.peer
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// Seals `payload` (at most [`PAYLOAD_BYTES_MAX`] bytes) into `out` (at least
    /// `payload.len() + DATA_OVERHEAD` bytes); returns the datagram's length.
    pub fn seal(&mut self, payload: &[u8], out: &mut [u8]) -> Result<usize, LinkError> {
        let len = payload.len() + DATA_OVERHEAD;
        if payload.len() > PAYLOAD_BYTES_MAX || out.len() < len {
            return Err(LinkError::Size);
        }
        // snow refuses u64::MAX; stop one short.
        if self.next_nonce == u64::MAX {
            return Err(LinkError::Exhausted);
        }
        let nonce = self.next_nonce;
        let head = LINK_MAGIC.len() + 1;
        out[..LINK_MAGIC.len()].copy_from_slice(&LINK_MAGIC);
        out[LINK_MAGIC.len()] = DATA;
        out[head..head + 8].copy_from_slice(&nonce.to_be_bytes());
        let n = self
            .transport
            .write_message(nonce, payload, &mut out[head + 8..len])
            .map_err(noise)?;
        debug_assert_eq!(head + 8 + n, len);
        self.next_nonce += 1;
        self.stats.sealed += 1;
        Ok(len)
    }

    /// Opens a data datagram into `out` (at least `datagram.len() - DATA_OVERHEAD` bytes);
    /// returns the payload's length. Counts every refusal.
    pub fn open(&mut self, datagram: &[u8], out: &mut [u8]) -> Result<usize, LinkError> {
        let result = self.open_inner(datagram, out);
        let counter = match &result {
            Ok(_) => &mut self.stats.opened,
            Err(LinkError::BadTag) => &mut self.stats.bad_tag,
            Err(LinkError::Replayed) => &mut self.stats.replayed,
            Err(_) => &mut self.stats.malformed,
        };
        *counter += 1;
        result
    }

    fn open_inner(&mut self, datagram: &[u8], out: &mut [u8]) -> Result<usize, LinkError> {
        let Some(body) = typed(datagram, DATA) else {
            return Err(LinkError::Malformed);
        };
        if datagram.len() < DATA_OVERHEAD || datagram.len() > DATAGRAM_BYTES_MAX {
            return Err(LinkError::Malformed);
        }
        let payload_len = datagram.len() - DATA_OVERHEAD;
        if out.len() < payload_len {
            return Err(LinkError::Size);
        }
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&body[..8]);
        let nonce = u64::from_be_bytes(nonce);
        self.window.check(nonce).map_err(|_| LinkError::Replayed)?;
        let n = self
            .transport
            .read_message(nonce, &body[8..], &mut out[..payload_len])
            .map_err(|_| LinkError::BadTag)?;
        self.window.accept(nonce).map_err(|r| match r {
            Refusal::Replayed | Refusal::TooOld => LinkError::Replayed,
        })?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Cluster {
        service: Identity,
        node: Identity,
        responder: Responder,
    }

    fn cluster(admit: bool) -> Cluster {
        let service = Identity::generate().unwrap();
        let node = Identity::generate().unwrap();
        let mut allowed = AllowList::new();
        if admit {
            allowed.insert(*node.public(), "node-1");
        }
        let responder = Responder::new(service.clone(), allowed);
        Cluster {
            service,
            node,
            responder,
        }
    }

    fn handshake(c: &mut Cluster, stamp: u64) -> (Result<Session, LinkError>, Answer) {
        let mut hello = [0u8; HELLO_LEN];
        let (mut init, n) = Initiator::start(
            &c.node,
            c.service.public(),
            stamp,
            [stamp as u8; 32],
            &mut hello,
        )
        .unwrap();
        let mut reply = [0u8; WELCOME_LEN];
        let answer = c.responder.handle_hello(&hello[..n], [9; 32], &mut reply);
        (init.finish(&reply[..answer.reply_len]), answer)
    }

    #[test]
    fn full_handshake_and_transport() {
        let mut c = cluster(true);
        let (node, answer) = handshake(&mut c, 1);
        let mut node = node.unwrap();
        let mut service = answer.outcome.unwrap();
        assert_eq!(node.peer(), c.service.public());
        assert_eq!(service.peer(), c.node.public());
        let mut wire = [0u8; 256];
        let mut plain = [0u8; 256];
        for i in 0..3u8 {
            let n = node.seal(&[i; 40], &mut wire).unwrap();
            assert_eq!(n, 40 + DATA_OVERHEAD);
            assert_eq!(service.open(&wire[..n], &mut plain), Ok(40));
            assert_eq!(plain[..40], [i; 40]);
            let n = service.seal(b"view 7", &mut wire).unwrap();
            assert_eq!(node.open(&wire[..n], &mut plain), Ok(6));
        }
        // Reordered: an older nonce still in the window is accepted once.
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        let na = node.seal(b"a", &mut a).unwrap();
        let nb = node.seal(b"b", &mut b).unwrap();
        assert_eq!(service.open(&b[..nb], &mut plain), Ok(1));
        assert_eq!(service.open(&a[..na], &mut plain), Ok(1));
        assert_eq!(service.open(&a[..na], &mut plain), Err(LinkError::Replayed));
        assert_eq!(c.responder.stats().admitted, 1);
        assert_eq!(service.stats().replayed, 1);
    }

    #[test]
    fn handshakes_are_a_function_of_their_inputs() {
        let c = cluster(true);
        let hello = |entropy| {
            let mut out = [0u8; HELLO_LEN];
            Initiator::start(&c.node, c.service.public(), 1, entropy, &mut out).unwrap();
            out
        };
        // The simulator replays a run from its seed: same inputs, same bytes.
        assert_eq!(hello([1; 32]), hello([1; 32]));
        assert_ne!(hello([1; 32]), hello([2; 32]));
        let a = crate::os_random::<32>().unwrap();
        assert_ne!(a, crate::os_random::<32>().unwrap());
    }

    #[test]
    fn refused_identity_gets_an_authenticated_refusal() {
        let mut c = cluster(false);
        let (node, answer) = handshake(&mut c, 1);
        assert_eq!(
            answer.outcome.err(),
            Some(LinkError::NotAdmitted(*c.node.public()))
        );
        let err = node.unwrap_err();
        assert_eq!(err, LinkError::NotAdmitted(*c.node.public()));
        assert!(err.to_string().contains("not admitted"), "{err}");
        assert_eq!(c.responder.stats().refused, 1);
    }

    #[test]
    fn wrong_service_key_is_reported() {
        let mut c = cluster(true);
        // The node holds another key for the service: the service cannot read the hello.
        let impostor = Identity::generate().unwrap();
        let mut hello = [0u8; HELLO_LEN];
        let (mut init, n) =
            Initiator::start(&c.node, impostor.public(), 1, [1; 32], &mut hello).unwrap();
        let mut reply = [0u8; WELCOME_LEN];
        let answer = c.responder.handle_hello(&hello[..n], [9; 32], &mut reply);
        assert_eq!(answer.outcome.err(), Some(LinkError::Unreadable));
        assert_eq!(
            init.finish(&reply[..answer.reply_len]).err(),
            Some(LinkError::WrongServiceKey)
        );
        // An impostor service answering in the real one's place: its welcome does not verify.
        let (mut init, n) =
            Initiator::start(&c.node, c.service.public(), 2, [2; 32], &mut hello).unwrap();
        let mut allowed = AllowList::new();
        allowed.insert(*c.node.public(), "");
        let mut fake = Responder::new(impostor, allowed);
        let answer = fake.handle_hello(&hello[..n], [9; 32], &mut reply);
        assert_eq!(answer.outcome.err(), Some(LinkError::Unreadable));
        assert_eq!(
            init.finish(&reply[..answer.reply_len]).err(),
            Some(LinkError::WrongServiceKey)
        );
        // The real answer still completes the same handshake afterwards.
        let answer = c.responder.handle_hello(&hello[..n], [9; 32], &mut reply);
        assert!(answer.outcome.is_ok());
        assert!(init.finish(&reply[..answer.reply_len]).is_ok());
        assert_eq!(
            init.finish(&reply[..answer.reply_len]).err(),
            Some(LinkError::Finished)
        );
    }

    #[test]
    fn replayed_hello_and_tampering() {
        let mut c = cluster(true);
        let mut hello = [0u8; HELLO_LEN];
        let (mut init, n) =
            Initiator::start(&c.node, c.service.public(), 10, [10; 32], &mut hello).unwrap();
        let mut reply = [0u8; WELCOME_LEN];
        let first = c.responder.handle_hello(&hello[..n], [9; 32], &mut reply);
        let reply_len = first.reply_len;
        let mut service = first.outcome.unwrap();
        let again = c
            .responder
            .handle_hello(&hello[..n], [8; 32], &mut [0u8; WELCOME_LEN]);
        assert_eq!(
            (again.reply_len, again.outcome.err()),
            (0, Some(LinkError::ReplayedHello))
        );
        // A tampered welcome is refused and the genuine one still accepted.
        let mut bad = reply;
        bad[10] ^= 0x40;
        assert_eq!(init.finish(&bad).err(), Some(LinkError::WrongServiceKey));
        let mut node = init.finish(&reply[..reply_len]).unwrap();
        // Tampered data: every byte flipped in turn is refused.
        let mut wire = [0u8; 64];
        let n = node.seal(b"subscribe", &mut wire).unwrap();
        let mut out = [0u8; 64];
        for i in 0..n {
            let mut t = wire;
            t[i] ^= 1;
            assert!(service.open(&t[..n], &mut out).is_err(), "byte {i}");
        }
        assert_eq!(service.open(&wire[..n], &mut out), Ok(9));
        // A tampered hello.
        let mut h = hello;
        h[40] ^= 1;
        let a = c.responder.handle_hello(&h, [7; 32], &mut reply);
        assert_eq!(a.outcome.err(), Some(LinkError::Unreadable));
        let a = c.responder.handle_hello(&h[..50], [6; 32], &mut reply);
        assert_eq!(a.outcome.err(), Some(LinkError::Malformed));
        assert_eq!(
            node.seal(&[0; PAYLOAD_BYTES_MAX + 1], &mut [0u8; 8]),
            Err(LinkError::Size)
        );
        assert_eq!(c.responder.stats().unreadable, 1);
        assert_eq!(c.responder.stats().malformed, 1);
    }
}
