//! Datagram keys derived from a secret the membership service keeps (ADR 43): one key per
//! region and key id, so that the service hands each node only the keys of its regions.

use ring::hkdf;

use crate::datagram::KEY_LEN;

/// The HKDF salt of region keys: the scheme's name and version.
const REGION_KEY_SALT: &[u8] = b"tidings region key 1";

/// The key of `region` under key id `id`: HKDF-SHA256 with `master` (the service's secret,
/// 32 bytes of entropy it never sends) as input key material, and the service's
/// `incarnation`, the region and the id (each big-endian) as info. Distinct
/// (incarnation, region, id) give independent keys; the same inputs give the same key, so
/// every replica of the service hands out the same one.
#[must_use]
pub fn derive_region_key(
    master: &[u8; KEY_LEN],
    incarnation: u32,
    region: u32,
    id: u32,
) -> [u8; KEY_LEN] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, REGION_KEY_SALT).extract(master);
    let mut info = [0u8; 12];
    info[..4].copy_from_slice(&incarnation.to_be_bytes());
    info[4..8].copy_from_slice(&region.to_be_bytes());
    info[8..].copy_from_slice(&id.to_be_bytes());
    let parts = [&info[..]];
    let mut out = [0u8; KEY_LEN];
    // A 32-byte output is far below HKDF-SHA256's limit (255 * 32 bytes): neither step fails.
    if let Ok(okm) = prk.expand(&parts, OutLen) {
        let _ = okm.fill(&mut out);
    }
    out
}

/// The output length of [`derive_region_key`], as ring's HKDF wants it.
struct OutLen;

impl hkdf::KeyType for OutLen {
    fn len(&self) -> usize {
        KEY_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_every_input_and_repeat_for_the_same() {
        let m = [7u8; 32];
        let k = derive_region_key(&m, 1, 2, 3);
        assert_eq!(k, derive_region_key(&m, 1, 2, 3));
        assert_ne!(k, [0u8; 32]);
        for other in [
            derive_region_key(&[8u8; 32], 1, 2, 3),
            derive_region_key(&m, 9, 2, 3),
            derive_region_key(&m, 1, 9, 3),
            derive_region_key(&m, 1, 2, 9),
            // Fields do not slide into each other.
            derive_region_key(&m, 1, 3, 2),
        ] {
            assert_ne!(k, other);
        }
    }

    /// RFC 5869-style check against ring's HMAC, computed by hand: PRK = HMAC(salt, IKM),
    /// OKM = HMAC(PRK, info || 0x01).
    #[test]
    fn matches_hkdf_by_hand() {
        use ring::hmac;
        let m = [3u8; 32];
        let prk = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, REGION_KEY_SALT), &m);
        let mut msg = Vec::new();
        msg.extend_from_slice(&5u32.to_be_bytes());
        msg.extend_from_slice(&6u32.to_be_bytes());
        msg.extend_from_slice(&7u32.to_be_bytes());
        msg.push(1);
        let okm = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, prk.as_ref()), &msg);
        assert_eq!(&derive_region_key(&m, 5, 6, 7)[..], okm.as_ref());
    }
}
