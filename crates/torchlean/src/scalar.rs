//! The scalar types the specification is generic over.
//!
//! The same spec code runs at `f64` (the specification used for checking) and at `f32`
//! (the `reference` provider's kernels). Only what the specs need is here.

use num_traits::{Float, FromPrimitive};
use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// A real floating-point scalar usable by the specification.
pub trait Scalar:
    Float
    + FromPrimitive
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
    + Debug
    + Default
    + Send
    + Sync
    + 'static
{
    /// Converts an `f64` constant (a payload value, π, …) to this scalar.
    fn c(v: f64) -> Self;
    /// Converts this scalar to `f64`.
    fn f64(self) -> f64;
    /// The error function (needed by exact GELU).
    fn erf(self) -> Self;
    /// The nearest integer, ties to the even one (IEEE `roundToIntegralTiesToEven`).
    fn round_half_even(self) -> Self;
}

impl Scalar for f32 {
    #[inline]
    fn c(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline]
    fn round_half_even(self) -> Self {
        f32::round_ties_even(self)
    }
}

impl Scalar for f64 {
    #[inline]
    fn c(v: f64) -> Self {
        v
    }
    #[inline]
    fn f64(self) -> f64 {
        self
    }
    #[inline]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline]
    fn round_half_even(self) -> Self {
        f64::round_ties_even(self)
    }
}

// NaN-propagating comparisons, shared by the spec and every native kernel (DESIGN §6: NaN in
// → NaN out). `f32::max`/`f64::max` and `Float::max` return the *other* operand when one is
// NaN, and `if x > 0 { x } else { 0 }` maps NaN to 0: both hide a NaN. Use these instead.
// Each is two comparisons and a select, so loops over slices still vectorize.

/// The larger of `a` and `b`, NaN when either is NaN; on a tie (`-0` vs `+0`) the first
/// operand. PyTorch's `maximum` (its scalar path; `clamp_min` and `relu` are `maximum(x, lo)`,
/// so `relu(-0) = -0` as in PyTorch eager).
#[inline(always)]
pub fn maximum<T: Float>(a: T, b: T) -> T {
    if a < b || b.is_nan() {
        b
    } else {
        a
    }
}

/// The smaller of `a` and `b`, NaN when either is NaN; on a tie the first operand.
#[inline(always)]
pub fn minimum<T: Float>(a: T, b: T) -> T {
    if a > b || b.is_nan() {
        b
    } else {
        a
    }
}

/// `x` limited to `[lo, hi]` (bounds not NaN); NaN stays NaN, as PyTorch's `clamp`.
#[inline(always)]
pub fn clamp<T: Float>(x: T, lo: T, hi: T) -> T {
    minimum(maximum(x, lo), hi)
}

/// The maximum of `xs`, NaN when any is NaN; -inf when empty.
#[inline]
pub fn max_of<T: Float>(xs: impl IntoIterator<Item = T>) -> T {
    xs.into_iter().fold(T::neg_infinity(), maximum)
}

/// Whether a later element `v` replaces the running maximum `best` in a search for the
/// *first* maximum (`argmax`, the max of a pool window): when it is larger, or when it is NaN
/// and `best` is not. NaN ranks above every number, as in PyTorch's `argmax`, so the first NaN
/// is selected and a NaN is never skipped.
#[inline(always)]
pub fn beats_max<T: Float>(v: T, best: T) -> bool {
    v > best || (v.is_nan() && !best.is_nan())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_propagates_through_the_comparison_helpers() {
        let nan = f32::NAN;
        for x in [0.0f32, -0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(maximum(nan, x).is_nan() && maximum(x, nan).is_nan());
            assert!(minimum(nan, x).is_nan() && minimum(x, nan).is_nan());
            assert!(beats_max(nan, x) && !beats_max(x, nan));
        }
        assert!(clamp(nan, -1.0, 1.0).is_nan());
        assert!(max_of([1.0f64, f64::NAN, 2.0]).is_nan());
        assert_eq!(max_of::<f64>([]), f64::NEG_INFINITY);
        // ties keep the first operand, so the sign of zero is the first one's
        assert!(maximum(-0.0f32, 0.0).is_sign_negative());
        assert!(maximum(0.0f32, -0.0).is_sign_positive());
        assert!(!beats_max(f32::NAN, f32::NAN));
        assert_eq!(clamp(5.0f32, -1.0, 1.0), 1.0);
        assert_eq!(clamp(-5.0f32, -1.0, 1.0), -1.0);
    }
}
