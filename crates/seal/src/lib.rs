//! Security building blocks of tidings, sans-IO.
//!
//! - [`datagram`]: sealed protocol datagrams. A [`SealingKey`] appends a trailer (key id, sender,
//!   counter, AEAD tag) to a datagram in place; a [`KeyRing`] opens them, refusing forged,
//!   replayed, unknown-key and retired-key datagrams, each counted by cause. Nothing allocates
//!   per datagram.
//! - [`link`]: admission to the membership service. A Noise IK handshake over `snow` lets the
//!   service admit only identities on its allowed list and lets a node check the service's key;
//!   after it, a [`Session`] carries GMS datagrams encrypted with explicit nonces and a replay
//!   window.
//! - [`derive`]: the per-region datagram keys the membership service derives from its secret.
//! - [`identity`]: node identities (X25519 key pairs), their file format (mode 0600), and the
//!   allowed-identities file.
//!
//! Keys and randomness are inputs: datagram keys and the handshake's ephemeral keys come from
//! the caller, so the simulator can replay a run from its seed; a real host draws them with
//! [`os_random`]. Only [`Identity::generate`] (for `tidings keygen`) reads the operating
//! system's RNG itself. `docs/security.md` states the threat model.

pub mod datagram;
pub mod derive;
pub mod identity;
pub mod link;
pub mod window;

pub use datagram::{
    Aead, KeyError, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, OpenError, OpenStats, Opened,
    Origin, SealError, SealingKey,
};
pub use derive::derive_region_key;
pub use identity::{AllowList, Identity, IdentityError, PublicKey};
pub use link::{Answer, Initiator, LinkError, Responder, ResponderStats, Session, SessionStats};
pub use window::ReplayWindow;

/// `N` bytes from the operating system's cryptographic RNG, for hosts: datagram keys
/// ([`KeySecret::from_bytes`]) and the handshake's entropy. `None` if the RNG failed.
#[must_use]
pub fn os_random<const N: usize>() -> Option<[u8; N]> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes)
}
