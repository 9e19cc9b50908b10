//! The recompute check of `gelu` (forward and VJP) with a vectorizable `erf` of proven
//! accuracy instead of the platform libm's (a call per element, the largest single cost of
//! the transformer step's checks).
//!
//! `erf` here is Abramowitz & Stegun 7.1.26 (Hastings): for x ≥ 0,
//! erf(x) = 1 − (a₁t + a₂t² + a₃t³ + a₄t⁴ + a₅t⁵)·e^(−x²) + ε(x), t = 1/(1 + p·x), with
//! |ε(x)| ≤ 1.5·10⁻⁷ for every x ≥ 0 (odd extension below 0), evaluated at f64 (its own
//! rounding ≈ 10⁻¹⁵, and `exp64`'s 4·10⁻¹⁵ relative, are inside the margin taken below).
//! So the reference values are within
//! - forward, x·Φ(x) with Φ(x) = ½(1 + erf(x/√2)): δ = 7.6·10⁻⁸·max|x| of the spec's;
//! - VJP, gy·(Φ(x) + x·φ(x)): δ = 7.6·10⁻⁸·max|gy| of the spec's,
//!
//! per chunk, and the comparison takes that slack into account ([`Tally::feed_approx`]): an
//! acceptance here implies the spec's acceptance; anything else goes to the spec's own
//! formula. A chunk with a non-finite input is compared against the spec's own formula.

use super::exp64;
use super::pieces::Tally;
use super::unary::{over_parts, CHUNK};
use crate::graph::Op;
use crate::spec::{unary, unary_derivative};

/// The bound on |ε(x)| of A&S 7.1.26.
#[cfg(test)]
const ERF_ERROR: f64 = 1.5e-7;
/// The slack per unit of max|x| (forward) or max|gy| (VJP): ½·ERF_ERROR for Φ, rounded up to
/// cover the f64 evaluation.
const SLACK: f64 = 7.6e-8;

/// Φ(x) = ½(1 + erf(x/√2)) with erf by A&S 7.1.26, and φ(x) = e^(−x²/2)/√(2π): the
/// exponential e^(−z²), z = |x|/√2, is shared by both. Branch-free.
#[inline(always)]
fn cdf_and_pdf(x: f64) -> (f64, f64) {
    const P: f64 = 0.327_591_1;
    const A: [f64; 5] = [
        0.254_829_592,
        -0.284_496_736,
        1.421_413_741,
        -1.453_152_027,
        1.061_405_429,
    ];
    let z = x.abs() * std::f64::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let e = exp64::exp(-z * z);
    let erf = (1.0 - poly * e).copysign(x);
    const INV_SQRT_2PI: f64 =
        0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
    (0.5 * (1.0 + erf), e * INV_SQRT_2PI)
}

fn finite(x: &[f32]) -> bool {
    x.iter().all(|v| v.is_finite())
}

fn max_abs(x: &[f32]) -> f64 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64
}

/// The tally of `y` against gelu(x).
pub(super) fn forward(x: &[f32], y: &[f32]) -> Tally {
    let n = x.len().min(y.len());
    over_parts(n, |lo, hi| {
        let mut t = Tally::default();
        let mut want = [0.0f64; CHUNK];
        for (xc, yc) in x[lo..hi].chunks(CHUNK).zip(y[lo..hi].chunks(CHUNK)) {
            if finite(xc) {
                for (w, &v) in want.iter_mut().zip(xc) {
                    let v = v as f64;
                    *w = v * cdf_and_pdf(v).0;
                }
                t.feed_approx(yc, &want[..xc.len()], SLACK * max_abs(xc));
            } else {
                for (w, &v) in want.iter_mut().zip(xc) {
                    *w = unary(&Op::Gelu, v as f64);
                }
                t.feed(yc, &want[..xc.len()]);
            }
        }
        t
    })
}

/// The tally of the gradient `gx` against gy·gelu'(x).
pub(super) fn vjp(x: &[f32], gy: &[f32], gx: &[f32]) -> Tally {
    let n = x.len().min(gy.len()).min(gx.len());
    over_parts(n, |lo, hi| {
        let mut t = Tally::default();
        let mut want = [0.0f64; CHUNK];
        let (x, gy, gx) = (&x[lo..hi], &gy[lo..hi], &gx[lo..hi]);
        let parts = x.chunks(CHUNK).zip(gy.chunks(CHUNK)).zip(gx.chunks(CHUNK));
        for ((xc, gc), gxc) in parts {
            if finite(xc) && finite(gc) {
                for (w, (&a, &g)) in want.iter_mut().zip(xc.iter().zip(gc)) {
                    let a = a as f64;
                    let (cdf, pdf) = cdf_and_pdf(a);
                    *w = g as f64 * (cdf + a * pdf);
                }
                t.feed_approx(gxc, &want[..xc.len()], SLACK * max_abs(gc));
            } else {
                for (w, (&a, &g)) in want.iter_mut().zip(xc.iter().zip(gc)) {
                    // the spec's derivative does not read the forward output for gelu
                    *w = g as f64 * unary_derivative(&Op::Gelu, a as f64, 0.0);
                }
                t.feed(gxc, &want[..xc.len()]);
            }
        }
        t
    })
}

#[cfg(test)]
mod tests {
    /// Φ from the approximation is within half A&S's erf bound of Φ from libm's erf (itself
    /// within an ulp) over a dense grid, and saturates to 0 and 1.
    #[test]
    fn erf_is_within_the_published_bound() {
        let mut worst = 0.0f64;
        for i in 0..=400_000 {
            let x = -8.0 + 16.0 * i as f64 / 400_000.0;
            // erf(x) = 2·Φ(x·√2) − 1; Φ's own error is half erf's
            let cdf = super::cdf_and_pdf(x * std::f64::consts::SQRT_2).0;
            let want = 0.5 * (1.0 + libm::erf(x));
            worst = worst.max((cdf - want).abs());
        }
        assert!(
            worst <= super::ERF_ERROR / 2.0,
            "largest error of Φ {worst:e}"
        );
        assert_eq!(super::cdf_and_pdf(60.0).0, 1.0);
        assert_eq!(super::cdf_and_pdf(-60.0).0, 0.0);
    }

    /// Results rounded from the spec are accepted by the fast comparison itself (not only by
    /// the spec's fallback), large inputs included; a result one element off is not.
    #[test]
    fn correct_results_are_accepted_and_a_wrong_element_is_not() {
        use crate::graph::Op;
        use crate::spec::{unary, unary_derivative};
        let x: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 2001) as f32 / 50.0 - 20.0)
            .collect();
        let y: Vec<f32> = x
            .iter()
            .map(|&v| unary(&Op::Gelu, v as f64) as f32)
            .collect();
        assert!(super::forward(&x, &y).accepts());
        let gy: Vec<f32> = x.iter().map(|&v| (v * 0.37).sin()).collect();
        let gx: Vec<f32> = x
            .iter()
            .zip(&gy)
            .map(|(&a, &g)| (g as f64 * unary_derivative(&Op::Gelu, a as f64, 0.0)) as f32)
            .collect();
        assert!(super::vjp(&x, &gy, &gx).accepts());
        let mut bad = y.clone();
        bad[1234] += 0.05;
        assert!(!super::forward(&x, &bad).accepts());
        let mut bad = gx.clone();
        bad[77] -= 0.01;
        assert!(!super::vjp(&x, &gy, &bad).accepts());
    }

    /// The VJP reference's density: φ(0) = 1/√(2π).
    #[test]
    fn the_density_is_the_standard_normal_one() {
        let want = 1.0 / (2.0 * std::f64::consts::PI).sqrt();
        assert!((super::cdf_and_pdf(0.0).1 - want).abs() < 1e-16);
        let x = -1.7f64;
        assert!((super::cdf_and_pdf(x).1 - want * (-x * x / 2.0).exp()).abs() < 1e-15);
    }
}
