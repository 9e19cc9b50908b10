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
}
