//! Blocks that received datagrams are copied into, so that each becomes a slice of a shared
//! block and a steady flow allocates nothing: the runtime's receive path and a sealed
//! [`Member`](crate::Member)'s opening use them.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// Size of the blocks received datagrams are copied into. Each datagram becomes a `Bytes` slice
/// of a block (payloads handed to the protocol and the application share it; nothing else is
/// copied). 256 KiB: about 180 full datagrams or 250 of 1048 bytes.
const ARENA_BYTES: usize = 256 * 1024;
/// Most filled blocks the arena keeps for reuse (see [`BlockArena`]): 128 blocks, 32 MiB, about
/// 0.2 s of 1000-byte messages at 160 MB/s, longer than the protocol holds received messages
/// (until they are stable, a few token rounds). A block beyond it is let go: freed when its last
/// slice is dropped.
const ARENA_BLOCKS_RETAINED_MAX: usize = 128;
/// Retained blocks examined for reuse when the current block is full: a block pinned by a
/// long-held slice (a cached message) is passed over and looked at again later.
pub const ARENA_REUSE_PROBES: usize = 4;

/// The blocks received datagrams are copied into, recycled so that a steady flow of datagrams
/// allocates nothing.
///
/// Datagrams are appended to the current block and split off as `Bytes` slices. When it is
/// full, the block is *retired*: its handle (the empty tail of the block, which shares the block
/// with the slices) is kept, oldest first. A retired block is reusable as soon as every slice of
/// it has been dropped (delivered, no longer cached): `BytesMut::try_reclaim` then takes the
/// whole block back without allocating. So in steady state the arena cycles through as many
/// blocks as the protocol and the application hold at once, and allocates only when that number
/// grows. The current block itself is reused in place if all its slices are gone.
///
/// What can still allocate: a burst that holds more blocks than ever before (each new block is
/// one allocation, then kept), and more than [`ARENA_BLOCKS_RETAINED_MAX`] blocks held at once
/// (then the oldest handles are let go). A slice held for long (a message in the cooperative
/// cache of a stream that stays unstable) pins its whole block; the arena passes over it.
#[derive(Debug)]
pub struct BlockArena {
    current: BytesMut,
    /// Filled blocks, oldest first (each the empty tail handle of its block).
    retired: VecDeque<BytesMut>,
    /// Blocks allocated so far (the first included).
    blocks_allocated: u64,
}

impl BlockArena {
    /// An arena with one block.
    #[must_use]
    pub fn new() -> BlockArena {
        BlockArena {
            current: BytesMut::with_capacity(ARENA_BYTES),
            retired: VecDeque::with_capacity(ARENA_BLOCKS_RETAINED_MAX),
            blocks_allocated: 1,
        }
    }

    /// Copies `datagram` into the current block and returns it as shared bytes.
    pub fn keep(&mut self, datagram: &[u8]) -> Bytes {
        self.keep_mut(datagram).freeze()
    }

    /// Copies `datagram` into the current block and returns it as bytes of its own to write
    /// (opened in place, then frozen).
    pub fn keep_mut(&mut self, datagram: &[u8]) -> BytesMut {
        if self.current.capacity() < datagram.len() {
            self.next_block(datagram.len());
        }
        self.current.extend_from_slice(datagram);
        self.current.split()
    }

    /// Blocks allocated so far, the first included.
    #[must_use]
    pub fn blocks_allocated(&self) -> u64 {
        self.blocks_allocated
    }

    /// Makes room for `len` bytes: the current block again, a retired block, or a new one.
    fn next_block(&mut self, len: usize) {
        if len <= ARENA_BYTES {
            // Every slice of the current block is gone: start it over.
            if self.current.try_reclaim(ARENA_BYTES) {
                return;
            }
            for _ in 0..ARENA_REUSE_PROBES.min(self.retired.len()) {
                let Some(mut block) = self.retired.pop_front() else {
                    break;
                };
                if block.try_reclaim(ARENA_BYTES) {
                    let full = std::mem::replace(&mut self.current, block);
                    self.retired.push_back(full);
                    return;
                }
                // Still in use: look at it again after the others.
                self.retired.push_back(block);
            }
        }
        let full = std::mem::replace(
            &mut self.current,
            BytesMut::with_capacity(ARENA_BYTES.max(len)),
        );
        self.blocks_allocated += 1;
        if self.retired.len() >= ARENA_BLOCKS_RETAINED_MAX {
            // Let the oldest go: its block is freed when its last slice is dropped.
            self.retired.pop_front();
        }
        self.retired.push_back(full);
    }
}

impl Default for BlockArena {
    fn default() -> BlockArena {
        BlockArena::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_once_their_slices_are_dropped() {
        let mut arena = BlockArena::new();
        let datagram = [7u8; 1000];
        // Two blocks' worth, all dropped at once: the current block and the retired one cycle.
        for _ in 0..3 {
            let kept: Vec<Bytes> = (0..2 * ARENA_BYTES / 1000)
                .map(|_| arena.keep(&datagram))
                .collect();
            assert!(kept.iter().all(|b| b[..] == datagram[..]));
        }
        assert_eq!(
            arena.blocks_allocated, 2,
            "no new block after the first round"
        );
        // Slices dropped as they go: the current block is reused in place.
        let before = arena.blocks_allocated;
        for _ in 0..10 * ARENA_BYTES / 1000 {
            drop(arena.keep(&datagram));
        }
        assert_eq!(arena.blocks_allocated, before);
    }

    #[test]
    fn a_pinned_block_is_passed_over() {
        let mut arena = BlockArena::new();
        let datagram = [1u8; 1000];
        let pinned = arena.keep(&datagram);
        let per_block = ARENA_BYTES / 1000;
        for _ in 0..20 * per_block {
            drop(arena.keep(&datagram));
        }
        // The pinned block stays retired; one more block serves everything else.
        assert_eq!(arena.blocks_allocated, 2);
        assert_eq!(pinned[..], datagram[..]);
        // A datagram larger than a block gets its own.
        let big = vec![2u8; ARENA_BYTES + 1];
        assert_eq!(arena.keep(&big).len(), big.len());
    }
}
