//! The throughput model of section II: weighted max-min fair rates.
//!
//! With shares `v_i`, offered rates `s_i` and a total capacity `R_max`, define
//! `u_i = s_i / sum_j s_j` and `x_i = v_i / u_i`. Then
//!
//! ```text
//! r_i = min(s_i, v_i * (R_max - sum_{x_j > x_i} r_j) / (1 - sum_{x_j > x_i} v_j))
//! ```
//!
//! evaluated in decreasing order of `x`: a task gets its share of what the less speculative
//! tasks (higher `x`) left. Shares are normalised to sum to one first, since the scheduler only
//! uses their ratios.

/// Expected service rates `r_i` (same unit as `offered` and `capacity`) for tasks with `shares`
/// (any non-negative weights) and `offered` rates, on a scheduler whose total rate is `capacity`.
///
/// Returns an empty vector for empty input; panics if the slices differ in length (a caller bug).
pub fn expected_rates(shares: &[f64], offered: &[f64], capacity: f64) -> Vec<f64> {
    assert_eq!(shares.len(), offered.len(), "one share per offered rate");
    let n = shares.len();
    let share_total: f64 = shares.iter().sum();
    let offered_total: f64 = offered.iter().sum();
    if n == 0 || share_total <= 0.0 || offered_total <= 0.0 {
        return vec![0.0; n];
    }
    let v: Vec<f64> = shares.iter().map(|s| s / share_total).collect();
    // x_i = v_i / u_i; a task offering nothing has x = infinity and gets nothing.
    let x: Vec<f64> = (0..n)
        .map(|i| {
            if offered[i] > 0.0 {
                v[i] * offered_total / offered[i]
            } else {
                f64::INFINITY
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let mut rates = vec![0.0; n];
    let mut start = 0;
    // Tasks with equal x are all "not higher" than each other: they see the same remainder.
    let mut served_higher = 0.0;
    let mut share_higher = 0.0;
    while start < n {
        let mut end = start;
        while end < n && x[order[end]] == x[order[start]] {
            end += 1;
        }
        let remaining_share = 1.0 - share_higher;
        let remaining_rate = (capacity - served_higher).max(0.0);
        for &i in &order[start..end] {
            let fair = if remaining_share > 1e-12 {
                v[i] * remaining_rate / remaining_share
            } else {
                remaining_rate
            };
            rates[i] = offered[i].min(fair).max(0.0);
        }
        for &i in &order[start..end] {
            served_higher += rates[i];
            share_higher += v[i];
        }
        start = end;
    }
    rates
}

/// The relative error of section IV-C: `|predicted - measured| / |measured|` (Euclidean norms).
/// Zero when both are zero.
pub fn relative_error(predicted: &[f64], measured: &[f64]) -> f64 {
    assert_eq!(predicted.len(), measured.len(), "vectors of the same tasks");
    let distance: f64 = predicted
        .iter()
        .zip(measured)
        .map(|(p, m)| (p - m) * (p - m))
        .sum::<f64>()
        .sqrt();
    let magnitude: f64 = measured.iter().map(|m| m * m).sum::<f64>().sqrt();
    if magnitude == 0.0 {
        if distance == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        distance / magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: &[f64], b: &[f64], tolerance: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tolerance)
    }

    #[test]
    fn paper_worked_example() {
        let rates = expected_rates(&[0.5, 0.3, 0.2], &[4000.0, 6000.0, 5000.0], 10_000.0);
        assert!(close(&rates, &[4000.0, 3600.0, 2400.0], 1e-9), "{rates:?}");
    }

    #[test]
    fn below_capacity_everyone_gets_what_it_offers() {
        let rates = expected_rates(&[0.1, 0.9], &[300.0, 200.0], 1000.0);
        assert!(close(&rates, &[300.0, 200.0], 1e-9), "{rates:?}");
    }

    #[test]
    fn all_backlogged_get_their_shares() {
        let rates = expected_rates(&[2.0, 1.0, 1.0], &[1e9, 1e9, 1e9], 1000.0);
        assert!(close(&rates, &[500.0, 250.0, 250.0], 1e-6), "{rates:?}");
    }

    #[test]
    fn relative_error_is_normalised_by_the_measurement() {
        assert_eq!(relative_error(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((relative_error(&[3.0, 4.0], &[0.0, 5.0]) - 0.6324555320336759).abs() < 1e-12);
        assert_eq!(relative_error(&[0.0], &[0.0]), 0.0);
    }

    /// Weighted max-min by progressive filling, written independently of the formula: raise a
    /// common "rate per unit of share" level until every task is capped by its demand or the
    /// capacity runs out.
    fn water_filling(shares: &[f64], offered: &[f64], capacity: f64) -> Vec<f64> {
        let total: f64 = shares.iter().sum();
        let v: Vec<f64> = shares.iter().map(|s| s / total).collect();
        let n = v.len();
        let mut rates = vec![0.0; n];
        let mut frozen = vec![false; n];
        let mut left = capacity;
        loop {
            let active: Vec<usize> = (0..n).filter(|&i| !frozen[i]).collect();
            if active.is_empty() || left <= 1e-12 {
                return rates;
            }
            let weight: f64 = active.iter().map(|&i| v[i]).sum();
            // The level at which the first active task reaches its demand.
            let level = active
                .iter()
                .map(|&i| (offered[i] - rates[i]) / v[i])
                .fold(f64::INFINITY, f64::min);
            let step = level.min(left / weight);
            for &i in &active {
                rates[i] += step * v[i];
                if offered[i] - rates[i] <= 1e-9 * offered[i].max(1.0) {
                    frozen[i] = true;
                }
            }
            left -= step * weight;
        }
    }

    fn config() -> impl Strategy<Value = (Vec<f64>, Vec<f64>, f64)> {
        (1usize..12).prop_flat_map(|n| {
            (
                proptest::collection::vec(0.01f64..1.0, n),
                proptest::collection::vec(1.0f64..10_000.0, n),
                100.0f64..50_000.0,
            )
        })
    }

    proptest! {
        #[test]
        fn formula_is_weighted_max_min((shares, offered, capacity) in config()) {
            let rates = expected_rates(&shares, &offered, capacity);
            let total: f64 = rates.iter().sum();
            let offered_total: f64 = offered.iter().sum();
            let tolerance = 1e-6 * capacity.max(offered_total);
            // Never more than offered, never more than the capacity, and work-conserving.
            for (r, s) in rates.iter().zip(&offered) {
                prop_assert!(*r <= s + tolerance && *r >= 0.0);
            }
            prop_assert!(total <= capacity + tolerance);
            prop_assert!((total - capacity.min(offered_total)).abs() <= tolerance,
                "total {total} capacity {capacity} offered {offered_total}");
            // A task held below its demand has the highest rate per unit of share.
            let share_total: f64 = shares.iter().sum();
            let norm = |i: usize| rates[i] / (shares[i] / share_total);
            for i in 0..rates.len() {
                if rates[i] < offered[i] - tolerance {
                    for (j, share) in shares.iter().enumerate() {
                        prop_assert!(norm(i) >= norm(j) - tolerance / (share / share_total),
                            "bottlenecked task {i} gets less per share than {j}");
                    }
                }
            }
            // And it agrees with an independent progressive-filling computation.
            let filled = water_filling(&shares, &offered, capacity);
            for (a, b) in rates.iter().zip(&filled) {
                prop_assert!((a - b).abs() <= tolerance, "{rates:?} vs {filled:?}");
            }
        }
    }
}
