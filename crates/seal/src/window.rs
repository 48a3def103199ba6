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
/// refused as too old. The bitmap is indexed by the counter itself (bit `c % width`), so moving
/// the highest counter up clears only the bits of the counters it passes: accepting the next
/// counter touches one word, not the whole window. The storage is allocated once, at creation;
/// checking and accepting never allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The highest counter accepted, valid when `any`.
    highest: u64,
    /// Whether any counter was accepted.
    any: bool,
    /// Bit `c % 64` of word `(c / 64) % words` is set when counter `c` (within the window) was
    /// accepted; the number of words is a power of two.
    bits: Box<[u64]>,
}

impl ReplayWindow {
    /// A window of `width_bits` counters, rounded up to a power of two and clamped to
    /// `64..=`[`WINDOW_BITS_MAX`].
    #[must_use]
    pub fn new(width_bits: usize) -> ReplayWindow {
        let words = width_bits
            .clamp(64, WINDOW_BITS_MAX)
            .next_power_of_two()
            .div_ceil(64);
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

    /// The word and bit mask of `counter`.
    fn slot(&self, counter: u64) -> (usize, u64) {
        // The number of words is a power of two, so the mask takes the word index modulo it;
        // the result is below the number of words and fits a usize.
        let word = ((counter / 64) & (self.bits.len() as u64 - 1)) as usize;
        (word, 1 << (counter % 64))
    }

    /// Whether `counter` would be accepted; changes nothing (check before authenticating,
    /// accept after).
    pub fn check(&self, counter: u64) -> Result<(), Refusal> {
        if !self.any || counter > self.highest {
            return Ok(());
        }
        if self.highest - counter >= self.width() as u64 {
            return Err(Refusal::TooOld);
        }
        let (word, mask) = self.slot(counter);
        if self.bits[word] & mask != 0 {
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
            self.bits.fill(0);
            self.highest = counter;
        } else if counter > self.highest {
            self.clear_above_highest(counter);
            self.highest = counter;
        }
        let (word, mask) = self.slot(counter);
        self.bits[word] |= mask;
        Ok(())
    }

    /// Clears the bits of the counters `highest + 1 ..= new_highest`: they still hold counters
    /// a window's width older, which fall out of the window as the highest moves up.
    fn clear_above_highest(&mut self, new_highest: u64) {
        if new_highest - self.highest >= self.width() as u64 {
            self.bits.fill(0);
            return;
        }
        // `highest < new_highest`, so neither addition below overflows.
        let mut counter = self.highest + 1;
        loop {
            let (word, _) = self.slot(counter);
            // The bits of `counter ..= min(the last counter of its word, new_highest)`.
            let first = counter % 64;
            let span = (new_highest - counter).min(63 - first) + 1;
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << first
            };
            self.bits[word] &= !mask;
            if new_highest - counter < span {
                return;
            }
            counter += span;
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

    /// The window against a plain model: a set of accepted counters and the rule that a
    /// counter more than `width - 1` below the highest is too old.
    fn agrees_with_the_model(width: usize, counters: &[u64]) {
        let mut window = ReplayWindow::new(width);
        let width = window.width() as u64;
        let mut seen = std::collections::BTreeSet::new();
        let mut highest: Option<u64> = None;
        for &c in counters {
            let expected = match highest {
                Some(h) if c <= h && h - c >= width => Err(Refusal::TooOld),
                _ if seen.contains(&c) => Err(Refusal::Replayed),
                _ => Ok(()),
            };
            assert_eq!(window.check(c), expected, "check {c} after {highest:?}");
            assert_eq!(window.accept(c), expected, "accept {c} after {highest:?}");
            if expected.is_ok() {
                seen.insert(c);
                highest = Some(highest.map_or(c, |h| h.max(c)));
            }
            assert_eq!(window.highest(), highest);
        }
    }

    proptest::proptest! {
        #[test]
        fn matches_a_set_of_accepted_counters(
            width in 0usize..300,
            start in proptest::prelude::any::<u64>(),
            steps in proptest::collection::vec((0u64..400, proptest::prelude::any::<bool>()), 1..200),
        ) {
            // Counters wander up and down around a start, crossing words and the window's edge.
            let mut c = start;
            let counters: Vec<u64> = steps
                .iter()
                .map(|&(step, up)| {
                    c = if up { c.saturating_add(step) } else { c.saturating_sub(step) };
                    c
                })
                .collect();
            agrees_with_the_model(width, &counters);
        }
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
