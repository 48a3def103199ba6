//! The credit policy of section II, as pure functions of integers.
//!
//! A task's credit for one period is `share * period_ns`; running an event costs its measured
//! duration. Credits are quantized into `bucket_count` priority levels (bucket 0 holds the most
//! credit) plus one last bucket for tasks whose credit is used up.

/// The credit, in nanoseconds, that a task with `share` receives at the start of each period.
///
/// At least 1 ns, so that after a reset every task has credit and the reset is not repeated
/// (a task with none would make the best task look exhausted again at once).
pub(crate) fn full_credit_ns(share: f64, period_ns: u64) -> i64 {
    let credit = (share * period_ns as f64).round();
    // `share` is validated to (0, 1] and `period_ns` to below 2^61, so this cannot overflow.
    (credit as i64).max(1)
}

/// The bucket a task with `credit_ns` left belongs in: `0` for the most credit, `bucket_count - 1`
/// for the least positive credit, and `bucket_count` (the exhausted bucket) for none.
///
/// Level `k` (1..=N) covers credits in `((k-1) T/N, k T/N]`; credits above `T` (possible after a
/// share was raised) share the top level.
pub(crate) fn bucket_for_credit(credit_ns: i64, period_ns: u64, bucket_count: usize) -> usize {
    if credit_ns <= 0 {
        return bucket_count;
    }
    let levels = bucket_count as i128;
    let period = i128::from(period_ns);
    let level = (i128::from(credit_ns) * levels + period - 1) / period;
    let level = level.clamp(1, levels);
    // `level` is in 1..=bucket_count, so the difference fits in usize.
    bucket_count - level as usize
}

/// Whether `share` is acceptable: finite and in `(0, 1]`.
pub(crate) fn share_is_valid(share: f64) -> bool {
    share.is_finite() && share > 0.0 && share <= 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 10_000_000;

    #[test]
    fn full_credit_is_share_of_period() {
        assert_eq!(full_credit_ns(0.5, T), 5_000_000);
        assert_eq!(full_credit_ns(1.0, T), 10_000_000);
        assert_eq!(full_credit_ns(1e-12, T), 1, "never zero");
    }

    #[test]
    fn buckets_are_100_us_wide_by_default() {
        assert_eq!(bucket_for_credit(10_000_000, T, 100), 0);
        assert_eq!(bucket_for_credit(9_900_001, T, 100), 0);
        assert_eq!(bucket_for_credit(9_900_000, T, 100), 1);
        assert_eq!(bucket_for_credit(100_000, T, 100), 99);
        assert_eq!(bucket_for_credit(1, T, 100), 99);
        assert_eq!(bucket_for_credit(0, T, 100), 100);
        assert_eq!(bucket_for_credit(-5, T, 100), 100);
        assert_eq!(
            bucket_for_credit(i64::MAX, T, 100),
            0,
            "overflowing credit clamps"
        );
    }

    #[test]
    fn more_credit_never_means_a_worse_bucket() {
        let mut last = usize::MAX;
        for credit in (-1_000..=10_001_000).step_by(997) {
            let bucket = bucket_for_credit(credit, T, 100);
            assert!(
                bucket <= last,
                "credit {credit} went to bucket {bucket} after {last}"
            );
            last = bucket;
        }
    }

    #[test]
    fn shares_outside_zero_one_are_invalid() {
        for bad in [0.0, -0.1, 1.0001, f64::NAN, f64::INFINITY] {
            assert!(!share_is_valid(bad), "{bad}");
        }
        for good in [1e-9, 0.5, 1.0] {
            assert!(share_is_valid(good), "{good}");
        }
    }
}
