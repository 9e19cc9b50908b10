//! Partial sums that leave f32's range: which non-finite results a correct f32 kernel can
//! give for a sum of finite terms whose exact value may be finite.
//!
//! A kernel that sums n finite terms in f32, in any order and grouping, forms partial sums
//! of subsets of them. A partial sum rounds to +inf only if its exact value reaches
//! [`OVERFLOW`] (the rounding boundary above `f32::MAX`), and every partial sum is at most
//! the sum `pos` of the positive terms times 1 + γ_n (Higham, Thm 3.5: each addition's
//! rounding is relative), so +inf is reachable only if `pos·(1 + γ_n) ≥ OVERFLOW`; likewise
//! −inf with the negative terms' magnitude `neg`; NaN needs both (inf − inf). Any other
//! non-finite result is wrong: `[1e38, 1e38]` cannot give NaN, `[2e38, 2e38]` cannot give
//! −inf. Used by the product checker's exact recomputation and by the recompute checker
//! for the ops whose elements are sums of products (an audit of the thirty-ninth session:
//! `[3e38, 3e38, −3e38, 0]·1` is inf left to right, exactly 3e38).

/// The smallest magnitude that rounds to ±inf in f32 (round to nearest: `f32::MAX` plus half
/// its ulp, 2^103, ties going to the even "mantissa" of 2^128).
pub(super) const OVERFLOW: f64 = f32::MAX as f64 + (1u128 << 103) as f64;

/// γ_n at f32's unit roundoff (the spec's: Higham §3.1).
pub(super) use crate::spec::gamma32 as gamma;

/// Whether `got` is a non-finite value that a correct f32 summation of `n` finite terms
/// (the positive ones adding up to `pos`, the negative ones to `-neg`) can give. False for a
/// finite `got` and when `pos` or `neg` is not finite (a non-finite term: the exact class
/// rule applies).
pub(super) fn reachable(got: f64, pos: f64, neg: f64, n: usize) -> bool {
    // one sign's terms hold an infinity (the exact sum is that infinity): a correct kernel
    // gives it, or NaN where the other sign's finite terms can overflow first (inf − inf)
    match (pos.is_infinite(), neg.is_infinite()) {
        (true, false) => return nan_beside_an_infinity(got, neg, n),
        (false, true) => return nan_beside_an_infinity(got, pos, n),
        _ => {}
    }
    if got.is_finite() || !pos.is_finite() || !neg.is_finite() {
        return false;
    }
    let grow = 1.0 + gamma(n.max(1));
    let (up, down) = (pos * grow >= OVERFLOW, neg * grow >= OVERFLOW);
    if got.is_nan() {
        up && down
    } else if got > 0.0 {
        up
    } else {
        down
    }
}

/// Whether `got` is the NaN that a correct f32 summation of `n` terms gives when the terms of
/// one sign include an infinity and those of the other sign, all finite, add up to
/// `other` in magnitude: their partial sum can reach the opposite infinity first. (The
/// infinity itself is the exact class, which the callers accept apart.) A found case: `[inf,
/// −3e38, −3e38, −3e38]` summed in several lanes is NaN (the oracle sweep of the forty-third
/// session).
pub(super) fn nan_beside_an_infinity(got: f64, other: f64, n: usize) -> bool {
    got.is_nan() && other.is_finite() && other * (1.0 + gamma(n.max(1))) >= OVERFLOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boundary_is_where_f32_rounds_to_infinity() {
        assert_eq!((OVERFLOW as f32), f32::INFINITY);
        let below = f64::from_bits(OVERFLOW.to_bits() - 1);
        assert_eq!(below as f32, f32::MAX);
    }

    #[test]
    fn only_the_infinities_some_order_can_reach_are_accepted() {
        // [3e38, 3e38, −3e38]: +inf left to right, never −inf or NaN
        assert!(reachable(f64::INFINITY, 6e38, 3e38, 3));
        assert!(!reachable(f64::NEG_INFINITY, 6e38, 3e38, 3));
        assert!(!reachable(f64::NAN, 6e38, 3e38, 3));
        // [3e38, 3e38, −3e38, −3e38]: either infinity, or NaN
        for v in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            assert!(reachable(v, 6e38, 6e38, 4));
        }
        // [1e38, 1e38]: no partial sum overflows
        for v in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            assert!(!reachable(v, 2e38, 0.0, 2));
        }
        // finite values, and the infinity of an infinite term, are not this rule's business
        assert!(!reachable(1.0, 6e38, 6e38, 4));
        assert!(!reachable(f64::INFINITY, f64::INFINITY, 0.0, 4));
        // [inf, −3e38, −3e38, −3e38]: NaN where the negative terms overflow first
        assert!(reachable(f64::NAN, f64::INFINITY, 9e38, 4));
        assert!(!reachable(f64::NEG_INFINITY, f64::INFINITY, 9e38, 4));
        // [inf, −1e38]: never NaN; [inf, −inf]: the class rule (NaN exactly)
        assert!(!reachable(f64::NAN, f64::INFINITY, 1e38, 2));
        assert!(!reachable(f64::NAN, f64::INFINITY, f64::INFINITY, 2));
    }
}
