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
//! - [`identity`]: node identities (X25519 key pairs), their file format (mode 0600), and the
//!   allowed-identities file.
//!
//! Keys and randomness are inputs: datagram keys come from the caller (the membership service
//! draws them from the host's RNG); only [`Identity::generate`] and the handshake's ephemeral
//! keys read the operating system's RNG. `docs/security.md` states the threat model.

pub mod datagram;
pub mod identity;
pub mod link;
pub mod window;

pub use datagram::{
    Aead, KeyError, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, OpenError, OpenStats, Opened,
    Origin, SealError, SealingKey,
};
pub use identity::{AllowList, Identity, IdentityError, PublicKey};
pub use link::{Answer, Initiator, LinkError, Responder, ResponderStats, Session, SessionStats};
pub use window::ReplayWindow;
