//! A sliding replay window over 64-bit counters.

/// Default width of a replay window, in counters: wide enough for the reordering a node sees
/// when it processes a received batch by priority (control, recovery, then data) and for
/// multicast and unicast paths of one sender that overtake each other.
pub const WINDOW_BITS_DEFAULT: usize = 1024;
/// The widest window accepted (bits); bounds the memory a key ring preallocates per sender.
pub const WINDOW_BITS_MAX: usize = 1 << 16;

/// Why a counter was refused by a [`ReplayWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The counter was accepted before.
    Replayed,
    /// The counter is older than the window reaches: it cannot be told from a replay.
    TooOld,
}

/// Which of the last `width` counters below the highest one were seen, as in IPsec and
/// WireGuard: counters above the highest are new, counters more than `width - 1` below it are
/// refused as too old. The storage is allocated once, at creation; checking and accepting
/// never allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The highest counter accepted, valid when `any`.
    highest: u64,
    /// Whether any counter was accepted.
    any: bool,
    /// Bit `d` (word `d / 64`, bit `d % 64`) is set when counter `highest - d` was accepted.
    bits: Box<[u64]>,
}

impl ReplayWindow {
    /// A window of `width_bits` counters, rounded up to a multiple of 64 and clamped to
    /// `64..=`[`WINDOW_BITS_MAX`].
    #[must_use]
    pub fn new(width_bits: usize) -> ReplayWindow {
        let words = width_bits.clamp(64, WINDOW_BITS_MAX).div_ceil(64);
        ReplayWindow {
            highest: 0,
            any: false,
            bits: vec![0; words].into_boxed_slice(),
        }
    }

    /// Counters the window remembers below and including the highest.
    #[must_use]
    pub fn width(&self) -> usize {
        self.bits.len() * 64
    }

    /// The highest counter accepted, if any.
    #[must_use]
    pub fn highest(&self) -> Option<u64> {
        self.any.then_some(self.highest)
    }

    /// Whether `counter` would be accepted; changes nothing (check before authenticating,
    /// accept after).
    pub fn check(&self, counter: u64) -> Result<(), Refusal> {
        if !self.any || counter > self.highest {
            return Ok(());
        }
        let distance = self.highest - counter;
        if distance >= self.width() as u64 {
            return Err(Refusal::TooOld);
        }
        // distance < width <= WINDOW_BITS_MAX, so the index fits.
        let d = distance as usize;
        if self.bits[d / 64] & (1 << (d % 64)) != 0 {
            Err(Refusal::Replayed)
        } else {
            Ok(())
        }
    }

    /// Records `counter` as seen, after it was checked and authenticated.
    pub fn accept(&mut self, counter: u64) -> Result<(), Refusal> {
        self.check(counter)?;
        if !self.any {
            self.any = true;
            self.highest = counter;
            self.bits.fill(0);
            self.bits[0] = 1;
            return Ok(());
        }
        if counter > self.highest {
            self.shift(counter - self.highest);
            self.highest = counter;
            self.bits[0] |= 1;
        } else {
            let d = (self.highest - counter) as usize;
            self.bits[d / 64] |= 1 << (d % 64);
        }
        Ok(())
    }

    /// Moves every bit `by` places towards the old end (the highest counter grows by `by`).
    fn shift(&mut self, by: u64) {
        let n = self.bits.len();
        if by >= self.width() as u64 {
            self.bits.fill(0);
            return;
        }
        let words = (by / 64) as usize;
        let bits = (by % 64) as u32;
        for i in (0..n).rev() {
            let value = if i >= words {
                let src = i - words;
                let high = self.bits[src] << bits;
                let low = if bits > 0 && src > 0 {
                    self.bits[src - 1] >> (64 - bits)
                } else {
                    0
                };
                high | low
            } else {
                0
            };
            self.bits[i] = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_window_accepts_anything_once() {
        let mut w = ReplayWindow::new(128);
        assert_eq!(w.accept(5), Ok(()));
        assert_eq!(w.accept(5), Err(Refusal::Replayed));
        assert_eq!(w.accept(0), Ok(()));
        assert_eq!(w.accept(0), Err(Refusal::Replayed));
        assert_eq!(w.highest(), Some(5));
    }

    #[test]
    fn edges_of_the_window() {
        let mut w = ReplayWindow::new(64);
        assert_eq!(w.width(), 64);
        w.accept(100).unwrap();
        // 100 - 63 is the oldest counter still inside.
        assert_eq!(w.check(37), Ok(()));
        assert_eq!(w.check(36), Err(Refusal::TooOld));
        w.accept(37).unwrap();
        assert_eq!(w.check(37), Err(Refusal::Replayed));
        // Moving the top by one pushes 37 out: now too old rather than replayed.
        w.accept(101).unwrap();
        assert_eq!(w.check(37), Err(Refusal::TooOld));
        assert_eq!(w.check(38), Ok(()));
    }

    #[test]
    fn shifts_across_words_keep_bits() {
        let mut w = ReplayWindow::new(256);
        for c in [0u64, 1, 63, 64, 65, 127] {
            w.accept(c).unwrap();
        }
        w.accept(200).unwrap();
        for c in [0u64, 1, 63, 64, 65, 127, 200] {
            assert_eq!(w.check(c), Err(Refusal::Replayed), "{c}");
        }
        for c in [2u64, 62, 66, 128, 199] {
            assert_eq!(w.check(c), Ok(()), "{c}");
        }
        w.accept(200 + 255).unwrap();
        assert_eq!(w.check(200), Err(Refusal::Replayed));
        assert_eq!(w.check(199), Err(Refusal::TooOld));
        w.accept(10_000).unwrap();
        assert_eq!(w.check(200 + 255), Err(Refusal::TooOld));
        assert_eq!(w.check(9_999), Ok(()));
    }

    #[test]
    fn extreme_counters() {
        let mut w = ReplayWindow::new(64);
        w.accept(u64::MAX).unwrap();
        assert_eq!(w.check(u64::MAX), Err(Refusal::Replayed));
        assert_eq!(w.check(0), Err(Refusal::TooOld));
        assert_eq!(ReplayWindow::new(0).width(), 64);
        assert_eq!(ReplayWindow::new(usize::MAX).width(), WINDOW_BITS_MAX);
    }
}
