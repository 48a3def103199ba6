//! The check every target runs on one candidate message (included by each target with `#[path]`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tidings_gms::message::item_len;
use tidings_gms::{GmsMessage, Item};

/// Bytes of an encoded update before its first item: tag, `seq` (u64) and item count (u32).
const UPDATE_HEADER_BYTES: usize = 1 + 8 + 4;

/// Most bytes decoding may ask of the allocator per input byte. The largest ratio the format
/// allows is one `Item` (64 bytes in memory) per 1-byte item on the wire; twice that leaves room
/// for vectors that grow by doubling. A length trusted without checking it against the bytes left
/// (say 65,536 partitions in a 30-byte message) is far beyond it.
const DECODE_ALLOC_BYTES_PER_INPUT_BYTE: usize = 2 * std::mem::size_of::<Item>();

/// Allocation allowed on top of the per-byte budget, for fixed costs on tiny inputs.
const DECODE_ALLOC_BYTES_BASE: usize = 1024;

/// The system allocator, counting the bytes asked of it so that `check` can bound what decoding
/// one input allocates (libFuzzer's `-malloc_limit_mb` only catches allocations of megabytes).
struct CountingAllocator;

/// Bytes requested so far: every allocation's size and every reallocation's new size.
static BYTES_REQUESTED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the contract;
// the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES_REQUESTED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's guarantees on `layout` are passed on as they are.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        BYTES_REQUESTED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, that is from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES_REQUESTED.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and the caller's guarantees on `new_size` are passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Every allocation of the target goes through the counter.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The bytes of an update up to its item count (tag and `seq`), taken from the encoder so that
/// the targets do not restate the private tag values.
pub fn update_prefix() -> Vec<u8> {
    let mut bytes = GmsMessage::Update {
        seq: 1,
        items: vec![Item::Commit],
    }
    .to_bytes();
    bytes.truncate(UPDATE_HEADER_BYTES - 4);
    bytes
}

/// Decodes `bytes` as one GMS message. An error is fine (it is what hostile input should get),
/// but decoding must ask the allocator for at most `DECODE_ALLOC_BYTES_PER_INPUT_BYTE` bytes per
/// input byte (plus `DECODE_ALLOC_BYTES_BASE`), accepted or not, and an accepted message must:
/// - decode again, from its own encoding, to an equal value;
/// - re-encode to exactly `bytes` (the encoding is canonical: fixed-width integers, exact
///   lengths, no padding), so no two wire forms mean the same message;
/// - for an update, take `UPDATE_HEADER_BYTES` plus the sum of `item_len` over its items,
///   which is what the GMS relies on to pack items into one datagram.
///
/// A panic inside `decode` (index out of range, overflow: the targets build with debug
/// assertions) is reported by libFuzzer itself.
pub fn check(bytes: &[u8]) {
    let requested_before = BYTES_REQUESTED.load(Ordering::Relaxed);
    let decoded = GmsMessage::decode(bytes);
    let requested = BYTES_REQUESTED.load(Ordering::Relaxed) - requested_before;
    let budget = DECODE_ALLOC_BYTES_PER_INPUT_BYTE * bytes.len() + DECODE_ALLOC_BYTES_BASE;
    assert!(
        requested <= budget,
        "decoding {} bytes asked for {requested} bytes of memory (budget {budget})",
        bytes.len()
    );
    let Ok(message) = decoded else {
        return;
    };
    let encoded = message.to_bytes();
    assert_eq!(
        GmsMessage::decode(&encoded).as_ref(),
        Ok(&message),
        "an accepted message does not survive encode and decode"
    );
    assert_eq!(encoded, bytes, "an accepted message re-encodes differently");
    if let GmsMessage::Update { items, .. } = &message {
        let items_bytes: usize = items.iter().map(item_len).sum();
        assert_eq!(
            UPDATE_HEADER_BYTES + items_bytes,
            encoded.len(),
            "item_len disagrees with the encoding"
        );
        for item in items {
            if let Item::Refused(r) = item {
                check_refusal(r);
            }
        }
    }
}

/// An accepted refusal (an update's `Item::Refused`, a log entry's `Command::Refuse`) keeps
/// its bounds: the topic name and the rule within their lengths.
fn check_refusal(r: &tidings_gms::TopicRefusal) {
    assert!(
        r.topic.len() <= tidings_gms::TOPIC_NAME_BYTES_MAX,
        "an accepted refusal's topic past TOPIC_NAME_BYTES_MAX"
    );
    assert!(
        r.rule.len() <= tidings_gms::acl::RULE_TEXT_BYTES_MAX,
        "an accepted refusal's rule past RULE_TEXT_BYTES_MAX"
    );
}

/// The allocation budget of decoding `len` input bytes.
fn budget(len: usize) -> usize {
    DECODE_ALLOC_BYTES_PER_INPUT_BYTE * len + DECODE_ALLOC_BYTES_BASE
}

/// Runs `decode` on `bytes`, asserting the allocation budget; returns what it gave.
fn counted<T>(bytes: &[u8], decode: impl FnOnce(&[u8]) -> T) -> T {
    let before = BYTES_REQUESTED.load(Ordering::Relaxed);
    let decoded = decode(bytes);
    let requested = BYTES_REQUESTED.load(Ordering::Relaxed) - before;
    assert!(
        requested <= budget(bytes.len()),
        "decoding {} bytes asked for {requested} bytes of memory (budget {})",
        bytes.len(),
        budget(bytes.len())
    );
    decoded
}

/// A replicated log entry (`decode_decision`): the same budget, and an accepted entry
/// re-encodes to exactly the input.
pub fn check_decision(bytes: &[u8]) {
    let Ok((at, decision)) = counted(bytes, tidings_gms::replica::decode_decision) else {
        return;
    };
    let mut encoded = Vec::new();
    tidings_gms::replica::encode_decision(at, &decision, &mut encoded);
    assert_eq!(encoded, bytes, "an accepted entry re-encodes differently");
    let command = match &decision {
        tidings_gms::Decision::Command(c) => Some(c),
        tidings_gms::Decision::Request { command, .. } => command.as_ref(),
        _ => None,
    };
    if let Some(tidings_gms::Command::Refuse { refusals, then, .. }) = command {
        assert!(
            refusals.len() <= tidings_gms::NAMES_PER_REQUEST_MAX,
            "an accepted refusal of more than one request's names"
        );
        assert!(
            !matches!(then.as_deref(), Some(tidings_gms::Command::Refuse { .. })),
            "an accepted refusal nested in a refusal"
        );
        refusals.iter().for_each(check_refusal);
    }
}

/// A replica-to-replica Raft message (`decode_raft`, at the default bounds): the same budget,
/// and an accepted message re-encodes to exactly the input.
pub fn check_raft(bytes: &[u8]) {
    let limits = tidings_gms::replica::RaftLimits {
        message_bytes_max: 1 << 20,
        entries_max: 1024,
    };
    let Ok(message) = counted(bytes, |b| tidings_gms::replica::decode_raft(b, limits)) else {
        return;
    };
    let mut encoded = Vec::new();
    tidings_gms::replica::encode_raft(&message, &mut encoded);
    assert_eq!(encoded, bytes, "an accepted Raft message re-encodes differently");
}

/// A replica's state file (`replica::decode_durable`), as read back by a restarted host. The
/// input is tried as it is (most inputs fail the checksum) and with its last four bytes
/// replaced by the right CRC-32, so that the body's decoder is reached. Either way the same
/// allocation budget holds, an accepted file re-encodes to exactly the input, and a replica
/// restarted from it (`Replica::restart`) starts or refuses, never panics.
pub fn check_durable(bytes: &[u8]) {
    check_durable_once(bytes);
    if let Some(body) = bytes.len().checked_sub(4).and_then(|n| bytes.get(..n)) {
        let mut fixed = body.to_vec();
        fixed.extend_from_slice(&crc32(body).to_le_bytes());
        check_durable_once(&fixed);
    }
}

fn check_durable_once(bytes: &[u8]) {
    let limits = tidings_gms::replica::DurableLimits::default();
    let Ok(file) = counted(bytes, |b| tidings_gms::replica::decode_durable(b, limits)) else {
        return;
    };
    let mut encoded = Vec::new();
    tidings_gms::replica::encode_durable(file.index, file.replicas, &file.durable, &mut encoded);
    assert_eq!(encoded, bytes, "an accepted state file re-encodes differently");
    let mut config = tidings_gms::ReplicaConfig::default();
    config.index = file.index;
    config.replicas = file.replicas;
    let _ = tidings_gms::Replica::restart(config, file.durable);
}

/// Replica datagrams as fragments (`replica::decode_fragment`) and put together
/// (`replica::Reassembly`). The input is a sequence of records, each a byte (bit 0: which of
/// two peers sent it; the rest: milliseconds that pass before it), a `u16` length and that
/// many bytes, fed to one reassembly (messages of at most 64 KiB, two in progress per peer,
/// a 1 s timeout). Decoding a fragment allocates within the budget; an accepted fragment's
/// bytes are as long as its header says; what the reassembly holds never exceeds what
/// arrived; a message it puts together is at most the bound and has the CRC-32 its fragments
/// claimed, and goes to `decode_raft` as a replica's would. Each record is also cut into
/// fragments itself, fed in reverse order to a fresh reassembly, and must come back whole.
pub fn check_fragments(bytes: &[u8]) {
    use std::time::Duration;
    use tidings_gms::replica::{
        decode_fragment, encode_fragments, FragmentLimits, FragmentStats, Reassembly,
        FRAGMENT_BYTES_MIN, FRAGMENT_HEADER_LEN,
    };
    let message_bytes_max = 64 << 10;
    let limits = FragmentLimits::new(message_bytes_max);
    let raft_limits = tidings_gms::replica::RaftLimits {
        message_bytes_max,
        entries_max: 1024,
    };
    let timeout = Duration::from_secs(1);
    let mut reassembly = Reassembly::new(2, limits, 2, timeout);
    let mut stats = FragmentStats::default();
    let mut now = tidings_proto::Time::ZERO;
    let mut arrived = 0usize;
    let mut rest = bytes;
    while let [head, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (record, next) = tail.split_at(len);
        rest = next;
        now += Duration::from_millis(u64::from(head >> 1));
        let peer = usize::from(head & 1);
        let decoded = counted(record, |b| {
            decode_fragment(b, limits).map(|f| (f.index, f.count, f.total, f.bytes.len()))
        });
        if let Ok((index, count, total, len)) = decoded {
            assert!(index < count && count >= 2, "an accepted fragment out of range");
            assert!(total as usize <= message_bytes_max, "an accepted total past the bound");
            assert_eq!(FRAGMENT_HEADER_LEN + len, record.len());
        }
        arrived += record.len();
        if let Some(whole) = reassembly.take(now, peer, record, &mut stats) {
            assert!(whole.len() <= message_bytes_max, "a message past the bound");
            let _ = tidings_gms::replica::decode_raft(&whole, raft_limits);
        }
        assert!(reassembly.bytes() <= arrived, "the reassembly holds more than arrived");
        assert!(reassembly.partials() <= 4, "more than two messages in progress per peer");
        // Any bytes, cut and put together again (in reverse order), come back whole.
        let fragments = encode_fragments(u64::from(*head), record, FRAGMENT_BYTES_MIN);
        if !fragments.is_empty() {
            let mut fresh = Reassembly::new(1, limits, 1, timeout);
            let mut s = FragmentStats::default();
            let mut got = None;
            for f in fragments.iter().rev() {
                assert!(f.len() <= FRAGMENT_BYTES_MIN, "a fragment past its size");
                got = fresh.take(now, 0, f, &mut s);
            }
            assert_eq!(got.as_deref(), Some(record), "a message cut and put together differs");
        }
    }
    reassembly.expire(now + timeout, &mut stats);
    assert_eq!(reassembly.partials(), 0, "messages in progress outlive their timeout");
}

/// CRC-32 (IEEE), bit by bit: the checksum the state file ends with, computed here without
/// the crate the codec uses.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
