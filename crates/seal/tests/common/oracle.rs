//! The fuzz oracles, shared by the cargo-fuzz targets (`fuzz/`, included with `#[path]`) and the
//! stable hostile-input test (`tests/hostile.rs`). Any panic is a finding.

use tidings_seal::datagram::{
    CLEAR_HEADER_LEN, COUNTER_LIMIT_DEFAULT, HEADER_SENDER_OFFSET, TRAILER_LEN,
};
use tidings_seal::link::{HELLO_LEN, WELCOME_LEN};
use tidings_seal::{
    AllowList, Identity, Initiator, KeyId, KeyRing, KeyRingConfig, KeySecret, Mode, Responder,
    SealingKey,
};

/// Opens arbitrary bytes with a ring holding key 1 (the first byte picks the mode and AEAD):
/// nothing opens unless the bytes are a genuine datagram, which random input never is; then
/// seals a genuine datagram of the same size and checks it opens after the hostile one.
pub(crate) fn open_any(data: &[u8]) {
    let (selector, bytes) = data.split_first().unwrap_or((&0, &[]));
    let mode = if selector & 1 == 0 {
        Mode::Authenticate
    } else {
        Mode::Encrypt
    };
    let aead = if selector & 2 == 0 {
        tidings_seal::Aead::Aes256Gcm
    } else {
        tidings_seal::Aead::ChaCha20Poly1305
    };
    let secret = KeySecret::from_bytes([0x11; 32]);
    let mut ring = KeyRing::new(KeyRingConfig {
        mode,
        aead,
        senders_max: 2,
        window_bits: 64,
        ..KeyRingConfig::default()
    })
    .expect("valid config");
    ring.install(KeyId(1), &secret).expect("empty ring");
    ring.retire(KeyId(2));
    let mut hostile = bytes.to_vec();
    assert!(ring.open(&mut hostile).is_err(), "random bytes opened");
    assert_eq!(ring.stats().refused(), 1);

    let mut key = SealingKey::new(aead, mode, KeyId(1), 5, &secret, COUNTER_LIMIT_DEFAULT);
    let len = bytes.len().max(CLEAR_HEADER_LEN);
    let mut buf = vec![0u8; len + TRAILER_LEN];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[HEADER_SENDER_OFFSET..HEADER_SENDER_OFFSET + 4].copy_from_slice(&5u32.to_be_bytes());
    let original = buf[..len].to_vec();
    let n = key.seal(&mut buf, len).expect("room");
    let opened = ring.open(&mut buf[..n]).expect("genuine datagram opens");
    assert_eq!(&buf[..opened.len], &original[..]);
}

/// Feeds arbitrary bytes to each handshake and transport entry point: the responder's hello
/// handler, an initiator waiting for a welcome, and both ends of an admitted session. None may
/// panic or accept them; the genuine exchange still completes afterwards.
pub(crate) fn handshake_any(data: &[u8], service: &Identity, node: &Identity) {
    let mut allowed = AllowList::new();
    allowed.insert(*node.public(), "node");
    let mut responder = Responder::new(service.clone(), allowed);
    let mut reply = [0u8; WELCOME_LEN];
    let answer = responder.handle_hello(data, [3; 32], &mut reply);
    assert!(answer.outcome.is_err(), "random hello admitted");

    let mut hello = [0u8; HELLO_LEN];
    let (mut init, n) =
        Initiator::start(node, service.public(), 1, [4; 32], &mut hello).expect("hello");
    assert!(init.finish(data).is_err(), "random welcome accepted");
    let answer = responder.handle_hello(&hello[..n], [5; 32], &mut reply);
    let mut at_service = answer.outcome.expect("admitted");
    let mut at_node = init.finish(&reply[..answer.reply_len]).expect("welcomed");

    let mut out = vec![0u8; data.len() + 64];
    assert!(
        at_service.open(data, &mut out).is_err(),
        "random data opened"
    );
    assert!(at_node.open(data, &mut out).is_err(), "random data opened");
    let mut wire = vec![0u8; data.len() + 64];
    let len = at_node.seal(data, &mut wire).expect("fits");
    assert_eq!(at_service.open(&wire[..len], &mut out), Ok(data.len()));
    assert_eq!(&out[..data.len()], data);
}
