//! Replica-to-replica messages larger than one datagram travel in numbered fragments, and are
//! put together again at the receiving replica (ADR 32, item 12).
//!
//! A message of at most [`ReplicaConfig::fragment_bytes`](super::ReplicaConfig::fragment_bytes)
//! bytes leaves whole ([`encode_raft`](super::encode_raft)'s bytes, which start with another
//! tag). A larger one (a snapshot of a large service state, an append of one huge entry) is cut
//! into `count >= 2` fragments, each a datagram of at most `fragment_bytes`:
//!
//! ```text
//! FRAGMENT_TAG  message (u64)  index (u32)  count (u32)  total (u32)  crc (u32)  bytes
//! ```
//!
//! integers little-endian; `message` numbers the sender's fragmented messages, `total` is the
//! whole message's length and `crc` its CRC-32. The layout is fixed by `total` and `count`:
//! every fragment carries `chunk = ceil(total / count)` bytes, the last one the rest, so a
//! receiver checks each fragment's length and never trusts an offset. The receiver
//! ([`Reassembly`]) keeps, per peer, at most `partials_max` messages in progress, each at most
//! `message_bytes_max` bytes, stored as the fragments arrive (nothing is allocated from a
//! claimed length), and drops a message whose fragments stop coming for a timeout the host's
//! `handle_timeout` drives. Losing a fragment loses the message; Raft sends it again.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_proto::Time;

/// The tag of a fragment (a whole Raft message starts with another, `0x52`).
pub const FRAGMENT_TAG: u8 = 0x46;

/// Bytes of a fragment's header: tag, message id, index, count, total length, CRC-32.
pub const FRAGMENT_HEADER_LEN: usize = 1 + 8 + 4 + 4 + 4 + 4;

/// The smallest fragment size a replica may be configured with (so that a message of
/// `message_bytes_max` is a bounded number of fragments).
pub const FRAGMENT_BYTES_MIN: usize = 1024;

/// The default fragment size: the largest UDP payload over IPv4 (65,507 bytes) less the 4-byte
/// magic a socket host puts before every replica datagram (the runtime's `REPLICA_MAGIC`).
pub const FRAGMENT_BYTES_DEFAULT: usize = 65_507 - 4;

/// Why a datagram is not a well-formed fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    /// Shorter than a fragment's header, or not tagged as a fragment.
    #[error("not a fragment")]
    NotFragment,
    /// A count below 2 or above the bound, or an index not below the count.
    #[error("fragment index or count out of range")]
    OutOfRange,
    /// A total length above the bound, or one that `count` fragments cannot carry.
    #[error("fragment total length out of range")]
    Total,
    /// The fragment's bytes are not as long as its index, count and total say.
    #[error("fragment length does not match its header")]
    Length,
}

/// Bounds a receiver holds fragments to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentLimits {
    /// Largest whole message, in bytes.
    pub message_bytes_max: usize,
    /// Most fragments of one message.
    pub fragments_max: usize,
}

impl FragmentLimits {
    /// The bounds for messages of at most `message_bytes_max` bytes cut into fragments of at
    /// least [`FRAGMENT_BYTES_MIN`] bytes.
    #[must_use]
    pub fn new(message_bytes_max: usize) -> FragmentLimits {
        FragmentLimits {
            message_bytes_max,
            fragments_max: message_bytes_max
                .div_ceil(FRAGMENT_BYTES_MIN - FRAGMENT_HEADER_LEN)
                .max(2),
        }
    }
}

/// A fragment's header, and its share of the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// The message's number at its sender.
    pub message: u64,
    /// This fragment's place, `0..count`.
    pub index: u32,
    /// How many fragments the message is cut into (at least 2).
    pub count: u32,
    /// The whole message's length in bytes.
    pub total: u32,
    /// The whole message's CRC-32.
    pub crc: u32,
    /// This fragment's bytes.
    pub bytes: &'a [u8],
}

/// The bytes fragment `index` of a message of `total` bytes in `count` fragments carries: where
/// they start and how many they are, or `None` if `count` fragments cannot carry `total` bytes
/// each non-empty.
fn share(total: u32, count: u32, index: u32) -> Option<(usize, usize)> {
    let (total, count, index) = (u64::from(total), u64::from(count), u64::from(index));
    if count == 0 || index >= count {
        return None;
    }
    let chunk = total.div_ceil(count);
    // The last fragment must carry at least one byte.
    if (count - 1).checked_mul(chunk)? >= total {
        return None;
    }
    let start = index * chunk;
    let len = chunk.min(total - start);
    Some((usize::try_from(start).ok()?, usize::try_from(len).ok()?))
}

/// Cuts `message` (the sender's `id`-th fragmented message) into fragments of at most
/// `fragment_bytes` bytes each, header included. Empty if the message fits one datagram of
/// `fragment_bytes` (send it whole), is longer than `u32::MAX`, or `fragment_bytes` leaves no
/// room after the header.
#[must_use]
pub fn encode_fragments(id: u64, message: &[u8], fragment_bytes: usize) -> Vec<Vec<u8>> {
    let room = fragment_bytes.saturating_sub(FRAGMENT_HEADER_LEN);
    let Ok(total) = u32::try_from(message.len()) else {
        return Vec::new();
    };
    if message.len() <= fragment_bytes || room == 0 {
        return Vec::new();
    }
    let Ok(count) = u32::try_from(message.len().div_ceil(room)) else {
        return Vec::new();
    };
    let crc = crc32fast::hash(message);
    (0..count)
        .filter_map(|index| {
            let (start, len) = share(total, count, index)?;
            let bytes = message.get(start..start + len)?;
            let mut f = Vec::with_capacity(FRAGMENT_HEADER_LEN + len);
            f.push(FRAGMENT_TAG);
            f.extend_from_slice(&id.to_le_bytes());
            f.extend_from_slice(&index.to_le_bytes());
            f.extend_from_slice(&count.to_le_bytes());
            f.extend_from_slice(&total.to_le_bytes());
            f.extend_from_slice(&crc.to_le_bytes());
            f.extend_from_slice(bytes);
            Some(f)
        })
        .collect()
}

/// Decodes one fragment, checking its header against `limits` and its length against its
/// header. Allocates nothing.
pub fn decode_fragment(
    datagram: &[u8],
    limits: FragmentLimits,
) -> Result<Fragment<'_>, FragmentError> {
    let (Some(header), Some(bytes)) = (
        datagram.get(..FRAGMENT_HEADER_LEN),
        datagram.get(FRAGMENT_HEADER_LEN..),
    ) else {
        return Err(FragmentError::NotFragment);
    };
    if header[0] != FRAGMENT_TAG {
        return Err(FragmentError::NotFragment);
    }
    let u32_at =
        |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&header[1..9]);
    let (index, count, total, crc) = (u32_at(9), u32_at(13), u32_at(17), u32_at(21));
    if count < 2 || count as usize > limits.fragments_max || index >= count {
        return Err(FragmentError::OutOfRange);
    }
    if total as usize > limits.message_bytes_max {
        return Err(FragmentError::Total);
    }
    let (_, len) = share(total, count, index).ok_or(FragmentError::Total)?;
    if bytes.len() != len {
        return Err(FragmentError::Length);
    }
    Ok(Fragment {
        message: u64::from_le_bytes(id),
        index,
        count,
        total,
        crc,
        bytes,
    })
}

/// Counters of fragmentation at one replica (sent and received).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FragmentStats {
    /// Messages sent in fragments.
    pub messages_fragmented: u64,
    /// Fragments sent.
    pub fragments_sent: u64,
    /// Fragments received and kept for their message.
    pub fragments_received: u64,
    /// Messages put together from their fragments (and handed on).
    pub messages_reassembled: u64,
    /// Fragments dropped as malformed: a bad header, a count, index or total out of range, a
    /// length that does not match.
    pub malformed: u64,
    /// Fragments received again (dropped).
    pub duplicate: u64,
    /// Fragments whose count, total or CRC-32 disagree with the message in progress under the
    /// same number (the peer restarted and numbers its messages again): the message in progress
    /// is dropped and a new one started from the fragment.
    pub inconsistent: u64,
    /// Messages whose fragments were all received but whose CRC-32 is wrong (dropped).
    pub corrupt: u64,
    /// Messages in progress dropped because a peer started more than `partials_max`.
    pub evicted: u64,
    /// Messages in progress dropped because no fragment of theirs arrived for the timeout.
    pub expired: u64,
}

/// One message in progress.
#[derive(Debug)]
struct Partial {
    message: u64,
    count: u32,
    total: u32,
    crc: u32,
    /// When its last fragment arrived.
    heard: Time,
    /// The fragments so far, by index (memory grows with what arrived, not with `total`).
    parts: BTreeMap<u32, Vec<u8>>,
}

/// Puts messages together from their fragments, per peer, with bounded memory.
#[derive(Debug)]
pub struct Reassembly {
    limits: FragmentLimits,
    partials_max: usize,
    timeout: Duration,
    /// By peer index: the messages in progress, oldest first.
    peers: Vec<Vec<Partial>>,
}

impl Reassembly {
    /// A reassembly for `peers` peers (indices `0..peers`), at most `partials_max` messages in
    /// progress per peer, each dropped if no fragment of it arrived for `timeout`.
    #[must_use]
    pub fn new(
        peers: usize,
        limits: FragmentLimits,
        partials_max: usize,
        timeout: Duration,
    ) -> Reassembly {
        Reassembly {
            limits,
            partials_max: partials_max.max(1),
            timeout,
            peers: (0..peers).map(|_| Vec::new()).collect(),
        }
    }

    /// Takes a fragment from peer `from`; the whole message once its last fragment is in.
    /// Anything bad is counted in `stats` and dropped.
    pub fn take(
        &mut self,
        now: Time,
        from: usize,
        datagram: &[u8],
        stats: &mut FragmentStats,
    ) -> Option<Vec<u8>> {
        let Some(partials) = self.peers.get_mut(from) else {
            stats.malformed += 1;
            return None;
        };
        let f = match decode_fragment(datagram, self.limits) {
            Ok(f) => f,
            Err(_) => {
                stats.malformed += 1;
                return None;
            }
        };
        let timeout = self.timeout;
        let before = partials.len();
        partials.retain(|p| now.saturating_duration_since(p.heard) < timeout);
        stats.expired += (before - partials.len()) as u64;
        let at = match partials.iter().position(|p| p.message == f.message) {
            Some(at)
                if (partials[at].count, partials[at].total, partials[at].crc)
                    == (f.count, f.total, f.crc) =>
            {
                at
            }
            found => {
                if let Some(at) = found {
                    stats.inconsistent += 1;
                    partials.remove(at);
                }
                if partials.len() >= self.partials_max {
                    partials.remove(0);
                    stats.evicted += 1;
                }
                partials.push(Partial {
                    message: f.message,
                    count: f.count,
                    total: f.total,
                    crc: f.crc,
                    heard: now,
                    parts: BTreeMap::new(),
                });
                partials.len() - 1
            }
        };
        let p = &mut partials[at];
        if p.parts.contains_key(&f.index) {
            stats.duplicate += 1;
            return None;
        }
        p.parts.insert(f.index, f.bytes.to_vec());
        p.heard = now;
        stats.fragments_received += 1;
        if p.parts.len() < p.count as usize {
            return None;
        }
        let p = partials.remove(at);
        // Every fragment's length was checked against the layout: they add up to `total`.
        let mut whole = Vec::with_capacity(p.parts.values().map(Vec::len).sum());
        for part in p.parts.values() {
            whole.extend_from_slice(part);
        }
        if whole.len() != p.total as usize || crc32fast::hash(&whole) != p.crc {
            stats.corrupt += 1;
            return None;
        }
        stats.messages_reassembled += 1;
        Some(whole)
    }

    /// Drops the messages whose last fragment arrived `timeout` ago or longer.
    pub fn expire(&mut self, now: Time, stats: &mut FragmentStats) {
        let timeout = self.timeout;
        for partials in &mut self.peers {
            let before = partials.len();
            partials.retain(|p| now.saturating_duration_since(p.heard) < timeout);
            stats.expired += (before - partials.len()) as u64;
        }
    }

    /// Messages in progress, from every peer.
    #[must_use]
    pub fn partials(&self) -> usize {
        self.peers.iter().map(Vec::len).sum()
    }

    /// Bytes held in messages in progress, from every peer.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.peers
            .iter()
            .flatten()
            .flat_map(|p| p.parts.values())
            .map(Vec::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS_BYTES: usize = 1 << 20;

    fn limits() -> FragmentLimits {
        FragmentLimits::new(LIMITS_BYTES)
    }

    fn message(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    fn reassembly() -> Reassembly {
        Reassembly::new(3, limits(), 2, Duration::from_secs(1))
    }

    fn at(ms: u64) -> Time {
        Time::ZERO + Duration::from_millis(ms)
    }

    /// A fragment with a header of our choosing.
    fn forged(id: u64, index: u32, count: u32, total: u32, crc: u32, len: usize) -> Vec<u8> {
        let mut f = vec![FRAGMENT_TAG];
        f.extend_from_slice(&id.to_le_bytes());
        for v in [index, count, total, crc] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend(std::iter::repeat_n(7u8, len));
        f
    }

    #[test]
    fn messages_round_trip_at_sizes_around_the_boundary() {
        let size = 1024;
        let room = size - FRAGMENT_HEADER_LEN;
        for len in [
            0,
            1,
            size - 1,
            size,
            size + 1,
            2 * room - 1,
            2 * room,
            2 * room + 1,
            3 * room,
            10 * room + 17,
            LIMITS_BYTES,
        ] {
            let m = message(len, len as u64);
            let frags = encode_fragments(9, &m, size);
            if len <= size {
                assert!(frags.is_empty(), "{len} fits one datagram");
                continue;
            }
            assert_eq!(frags.len(), len.div_ceil(room), "{len}");
            assert!(frags.iter().all(|f| f.len() <= size), "{len}");
            let mut r = reassembly();
            let mut stats = FragmentStats::default();
            let mut got = None;
            for f in &frags {
                assert!(got.is_none(), "{len}: whole before the last fragment");
                got = r.take(at(0), 1, f, &mut stats);
            }
            assert_eq!(got.as_deref(), Some(&m[..]), "{len}");
            assert_eq!(stats.messages_reassembled, 1);
            assert_eq!(stats.fragments_received, frags.len() as u64);
            assert_eq!(r.partials(), 0);
            assert_eq!(r.bytes(), 0);
        }
    }

    #[test]
    fn reordered_duplicated_and_lost_fragments() {
        let m = message(20_000, 1);
        let mut frags = encode_fragments(5, &m, 1500);
        assert!(frags.len() > 10);
        fastrand::Rng::with_seed(3).shuffle(&mut frags);
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        // Every fragment twice, shuffled: the message comes out once, duplicates are counted.
        let mut twice: Vec<&Vec<u8>> = frags.iter().chain(frags.iter()).collect();
        fastrand::Rng::with_seed(4).shuffle(&mut twice);
        let wholes: Vec<Vec<u8>> = twice
            .iter()
            .filter_map(|f| r.take(at(0), 0, f, &mut stats))
            .collect();
        // After the message completed, its late duplicates start a new partial.
        assert_eq!(wholes.first(), Some(&m));
        assert!(stats.duplicate > 0, "{stats:?}");
        r.expire(at(2000), &mut stats);
        assert_eq!(r.partials(), 0);
        // One fragment lost: no message, and the partial expires after the timeout.
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        for f in &frags[1..] {
            assert_eq!(r.take(at(10), 2, f, &mut stats), None);
        }
        assert_eq!(r.partials(), 1);
        assert!(r.bytes() > 0);
        r.expire(at(1009), &mut stats);
        assert_eq!(r.partials(), 1);
        r.expire(at(1010), &mut stats);
        assert_eq!((r.partials(), stats.expired), (0, 1));
        // The lost fragment arriving late starts a partial of its own, which never completes.
        assert_eq!(r.take(at(1020), 2, &frags[0], &mut stats), None);
        assert_eq!(r.partials(), 1);
    }

    #[test]
    fn the_timeout_runs_from_the_last_fragment() {
        let m = message(5000, 2);
        let frags = encode_fragments(1, &m, 1100);
        assert_eq!(frags.len(), 5);
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        let mut got = None;
        // A fragment every 900 ms: 3.6 s in all, never a second of silence.
        for (i, f) in frags.iter().enumerate() {
            r.expire(at(900 * i as u64), &mut stats);
            got = r.take(at(900 * i as u64), 0, f, &mut stats);
        }
        assert_eq!(got, Some(m));
        assert_eq!(stats.expired, 0);
    }

    #[test]
    fn messages_from_different_peers_and_interleaved_are_kept_apart() {
        let a = message(5000, 1);
        let b = message(7000, 2);
        let fa = encode_fragments(1, &a, 1100);
        let fb = encode_fragments(1, &b, 1100);
        let fc = encode_fragments(2, &b, 1100);
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        let mut out = Vec::new();
        let longest = fa.len().max(fb.len());
        for i in 0..longest {
            for (peer, frags) in [(0, &fa), (1, &fb), (0, &fc)] {
                if let Some(f) = frags.get(i) {
                    out.extend(r.take(at(0), peer, f, &mut stats).map(|m| (peer, m)));
                }
            }
        }
        assert_eq!(out.len(), 3);
        assert!(out.contains(&(0, a)));
        assert!(out.contains(&(1, b.clone())));
        assert!(out.contains(&(0, b)));
        assert_eq!(stats.inconsistent + stats.corrupt + stats.malformed, 0);
    }

    #[test]
    fn malicious_fragments_are_counted_and_dropped() {
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        let l = limits();
        let cases: Vec<(Vec<u8>, FragmentError)> = vec![
            (Vec::new(), FragmentError::NotFragment),
            (
                vec![FRAGMENT_TAG; FRAGMENT_HEADER_LEN - 1],
                FragmentError::NotFragment,
            ),
            (
                forged(1, 0, 2, 10, 0, 5)[1..].to_vec(),
                FragmentError::NotFragment,
            ),
            // count 0, count 1, index >= count.
            (forged(1, 0, 0, 10, 0, 5), FragmentError::OutOfRange),
            (forged(1, 0, 1, 10, 0, 10), FragmentError::OutOfRange),
            (forged(1, 2, 2, 10, 0, 5), FragmentError::OutOfRange),
            (forged(1, u32::MAX, 3, 10, 0, 5), FragmentError::OutOfRange),
            // More fragments than the bound.
            (
                forged(1, 0, l.fragments_max as u32 + 1, u32::MAX, 0, 0),
                FragmentError::OutOfRange,
            ),
            // Total above the bound, and totals the count cannot carry.
            (
                forged(1, 0, 2, LIMITS_BYTES as u32 + 1, 0, 5),
                FragmentError::Total,
            ),
            (forged(1, 0, 2, u32::MAX, 0, 5), FragmentError::Total),
            (forged(1, 0, 3, 2, 0, 1), FragmentError::Total),
            (forged(1, 0, 4, 5, 0, 2), FragmentError::Total),
            // Lengths that do not match the layout.
            (forged(1, 0, 2, 10, 0, 4), FragmentError::Length),
            (forged(1, 1, 2, 10, 0, 6), FragmentError::Length),
            (forged(1, 0, 2, 10, 0, 0), FragmentError::Length),
        ];
        for (bytes, err) in &cases {
            assert_eq!(decode_fragment(bytes, l), Err(*err), "{bytes:?}");
            assert_eq!(r.take(at(0), 0, bytes, &mut stats), None);
        }
        assert_eq!(stats.malformed, cases.len() as u64);
        // A peer outside the table.
        assert_eq!(
            r.take(at(0), 3, &forged(1, 0, 2, 10, 0, 5), &mut stats),
            None
        );
        assert_eq!(stats.malformed, cases.len() as u64 + 1);
        assert_eq!(r.partials(), 0);
    }

    #[test]
    fn inconsistent_totals_and_wrong_checksums_lose_the_message() {
        let m = message(3000, 7);
        let frags = encode_fragments(4, &m, 1100);
        assert_eq!(frags.len(), 3);
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        assert_eq!(r.take(at(0), 0, &frags[0], &mut stats), None);
        // The same number with another total: the partial starts over from it.
        let other = encode_fragments(4, &message(4000, 8), 1100);
        assert_eq!(r.take(at(0), 0, &other[1], &mut stats), None);
        assert_eq!(stats.inconsistent, 1);
        assert_eq!(r.partials(), 1);
        assert_eq!(r.take(at(0), 0, &frags[1], &mut stats), None);
        assert_eq!(stats.inconsistent, 2);
        assert_eq!(r.take(at(0), 0, &frags[2], &mut stats), None);
        assert_eq!(r.take(at(0), 0, &frags[0], &mut stats), Some(m.clone()));
        // A fragment whose bytes were altered: every header agrees, the checksum does not.
        let mut bad = frags.clone();
        let last = bad[1].len() - 1;
        bad[1][last] ^= 1;
        let got: Vec<_> = bad
            .iter()
            .filter_map(|f| r.take(at(0), 0, f, &mut stats))
            .collect();
        assert!(got.is_empty());
        assert_eq!(stats.corrupt, 1);
        assert_eq!(r.partials(), 0);
    }

    #[test]
    fn a_peer_holds_at_most_partials_max_messages_in_progress() {
        let mut r = reassembly();
        let mut stats = FragmentStats::default();
        // Forged first fragments of many large messages: each keeps only what arrived.
        let total = LIMITS_BYTES as u32;
        let count = (LIMITS_BYTES / 1000) as u32;
        let len = share(total, count, 0).map(|(_, l)| l).unwrap_or(0);
        for id in 0..100 {
            assert_eq!(
                r.take(at(0), 1, &forged(id, 0, count, total, 0, len), &mut stats),
                None
            );
        }
        assert_eq!(r.partials(), 2);
        assert_eq!(stats.evicted, 98);
        assert!(r.bytes() <= 2 * len, "{}", r.bytes());
        // Another peer's message still goes through.
        let m = message(5000, 1);
        let got: Vec<_> = encode_fragments(1, &m, 1100)
            .iter()
            .filter_map(|f| r.take(at(0), 2, f, &mut stats))
            .collect();
        assert_eq!(got, vec![m]);
    }

    #[test]
    fn random_and_mutated_fragments_never_panic() {
        let mut rng = fastrand::Rng::with_seed(11);
        let mut r = Reassembly::new(2, FragmentLimits::new(64 << 10), 3, Duration::from_secs(1));
        let mut stats = FragmentStats::default();
        let frags = encode_fragments(1, &message(10_000, 1), 1024);
        for step in 0..20_000u64 {
            let mut f = frags[rng.usize(..frags.len())].clone();
            for _ in 0..rng.usize(..4) {
                let i = rng.usize(..f.len());
                f[i] = rng.u8(..);
            }
            if rng.bool() {
                f.truncate(rng.usize(..=f.len()));
            }
            let _ = r.take(at(step / 10), rng.usize(..3), &f, &mut stats);
        }
        assert!(r.partials() <= 6);
        assert!(
            stats.malformed > 0 && stats.fragments_received > 0,
            "{stats:?}"
        );
    }
}
