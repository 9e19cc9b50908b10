//! The recompute check of `gelu` (forward and VJP) with a vectorizable `erf` of proven
//! accuracy instead of the platform libm's (a call per element, the largest single cost of
//! the transformer step's checks), evaluated in f32 lanes.
//!
//! `erf` here is Abramowitz & Stegun 7.1.26 (Hastings): for x ≥ 0,
//! erf(x) = 1 − (a₁t + a₂t² + a₃t³ + a₄t⁴ + a₅t⁵)·e^(−x²) + ε(x), t = 1/(1 + p·x), with
//! |ε(x)| ≤ 1.5·10⁻⁷ for every x ≥ 0 (odd extension below 0), so Φ(x) = ½(1 + erf(x/√2))
//! is within 7.5·10⁻⁸ of the true Φ.
//!
//! Its evaluation in f32 (unit roundoff u = 2⁻²⁴), for t ∈ (0, 1]: z from one product
//! with a rounded constant (2u), t from one product, one addition and one division, with
//! P rounded (relative error ≤ 6u); the Horner polynomial's own rounding
//! ≤ γ₁₀·Σ|aᵢ|tⁱ ≤ 45u, its rounded coefficients ≤ 5u, and t's error carried through it
//! ≤ 6u·Σ i·|aᵢ| ≤ 98u (Σ|aᵢ| = 4.48, Σ i·|aᵢ| = 16.2); e^(−z²) by [`exp_neg`] within 4u
//! relative, and the rounding of z² moves poly·e^(−z²) by at most 5u·z²·e^(−z²) ≤ 2u; the
//! product poly·e and the last three operations 4u. So the erf part errs by at most 158u
//! and |Φ₃₂ − Φ| ≤ 7.5·10⁻⁸ + ½·158u + u < 5·10⁻⁶; likewise x·φ(x) is within 12u of its
//! value (|x·φ(x)| ≤ 0.25). The reference values are therefore within
//! - forward, x·Φ(x): δ = [`SLACK`]·max|x| of the spec's;
//! - VJP, gy·(Φ(x) + x·φ(x)): δ = [`SLACK`]·max|gy| of the spec's,
//!
//! per chunk, with [`SLACK`] = 10⁻⁵ (twice the bound above), and the comparison
//! takes that slack into account ([`Tally::feed_approx32`]): an acceptance here implies the
//! spec's acceptance; anything else goes to the spec's own formula. A chunk with a
//! non-finite input is compared against the spec's own formula. The test below measures the
//! f32 evaluation against libm's `erf` over a dense grid (its error is far below the bound).

use super::pieces::Tally;
use super::unary::{over_parts, CHUNK};
use crate::graph::Op;
use crate::providers::native_cpu::vmath::all_finite;
use crate::spec::{unary, unary_derivative};

/// The bound on |ε(x)| of A&S 7.1.26.
#[cfg(test)]
const ERF_ERROR: f64 = 1.5e-7;
/// The slack per unit of max|x| (forward) or max|gy| (VJP): the f32 evaluation's error bound
/// (module doc), with a margin of two.
const SLACK: f64 = 1e-5;

/// e^v for v ≤ 0, in f32 and branch-free (0 below −87, where e^v < 1.7·10⁻³⁸): v = n·ln2 + r
/// with n the nearest integer to v/ln2 (Cody–Waite: `LN2_HI` has 9 significant bits, so
/// n·LN2_HI is exact), e^r by its Taylor polynomial of degree 7 (|r| ≤ 0.35: remainder
/// < 8·10⁻⁹ relative), 2ⁿ from bits (n ∈ [−126, 0]: a normal number). Relative error below
/// 4u: r's rounding ≤ 1u of e^r, the Horner evaluation ≤ 3u at |r| = 0.35 (≤ 2u nearer 0),
/// the final product 1u (the test measures it against libm within 4u).
#[inline(always)]
pub(super) fn exp_neg(v: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 0.693359375 exactly (9 significant bits)
    const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
    const LN2_LO: f32 = -2.121_944_4e-4;
    // round to nearest with the 1.5·2^23 trick (no call to floor)
    const SHIFT: f32 = 12_582_912.0;
    let vc = v.max(-87.0);
    let shifted = vc * LOG2E + SHIFT;
    let n = shifted - SHIFT;
    let r = (vc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^n from the bits of `shifted`: its low mantissa bits hold 2^22 + n, and the shift by
    // 23 keeps (n + 127) mod 2^9 as sign and exponent, n + 127 ∈ [1, 127] here (an `as`
    // conversion to an integer saturates, which does not vectorize)
    let scale = f32::from_bits(shifted.to_bits().wrapping_add(127) << 23);
    if v < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// Φ(x) = ½(1 + erf(x/√2)) with erf by A&S 7.1.26, and φ(x) = e^(−x²/2)/√(2π), in f32: the
/// exponential e^(−z²), z = |x|/√2, is shared by both. Branch-free.
#[inline(always)]
fn cdf_and_pdf(x: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let e = exp_neg(-(z * z));
    let erf = (1.0 - poly * e).copysign(x);
    const INV_SQRT_2PI: f32 =
        0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
    (0.5 * (1.0 + erf), e * INV_SQRT_2PI)
}

/// The largest |value| of finite values, in eight lanes.
fn max_abs(x: &[f32]) -> f64 {
    let mut lanes = [0.0f32; 8];
    let blocks = x.chunks_exact(8);
    let tail = blocks
        .remainder()
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()));
    for b in blocks {
        for l in 0..8 {
            let a = b[l].abs();
            lanes[l] = if a > lanes[l] { a } else { lanes[l] };
        }
    }
    lanes.iter().fold(tail, |m, &v| m.max(v)) as f64
}

/// The tally of `y` against gelu(x).
pub(super) fn forward(x: &[f32], y: &[f32]) -> Tally {
    let n = x.len().min(y.len());
    over_parts(n, |lo, hi| {
        crate::wide::wide!({
            let mut t = Tally::default();
            let mut near = [0.0f32; CHUNK];
            let mut want = [0.0f64; CHUNK];
            for (xc, yc) in x[lo..hi].chunks(CHUNK).zip(y[lo..hi].chunks(CHUNK)) {
                if all_finite(xc) {
                    for (w, &v) in near.iter_mut().zip(xc) {
                        *w = v * cdf_and_pdf(v).0;
                    }
                    t.feed_approx32(yc, &near[..xc.len()], SLACK * max_abs(xc));
                } else {
                    for (w, &v) in want.iter_mut().zip(xc) {
                        *w = unary(&Op::Gelu, v as f64);
                    }
                    t.feed(yc, &want[..xc.len()]);
                }
            }
            t
        })
    })
}

/// The tally of the gradient `gx` against gy·gelu'(x).
pub(super) fn vjp(x: &[f32], gy: &[f32], gx: &[f32]) -> Tally {
    let n = x.len().min(gy.len()).min(gx.len());
    over_parts(n, |lo, hi| {
        crate::wide::wide!({
            let mut t = Tally::default();
            let mut near = [0.0f32; CHUNK];
            let mut want = [0.0f64; CHUNK];
            let (x, gy, gx) = (&x[lo..hi], &gy[lo..hi], &gx[lo..hi]);
            let parts = x.chunks(CHUNK).zip(gy.chunks(CHUNK)).zip(gx.chunks(CHUNK));
            for ((xc, gc), gxc) in parts {
                if all_finite(xc) && all_finite(gc) {
                    for (w, (&a, &g)) in near.iter_mut().zip(xc.iter().zip(gc)) {
                        let (cdf, pdf) = cdf_and_pdf(a);
                        *w = g * (cdf + a * pdf);
                    }
                    t.feed_approx32(gxc, &near[..xc.len()], SLACK * max_abs(gc));
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
    })
}

#[cfg(test)]
mod tests {
    /// Φ and φ in f32 are within the module's bound of Φ from libm's erf (itself within an
    /// ulp) over a dense grid — measured far below it: the assertion keeps a factor four —
    /// and Φ saturates to 0 and 1; the f32 exponential is within 4u of libm's.
    #[test]
    fn erf_is_within_the_published_bound() {
        let (mut worst_cdf, mut worst_pdf) = (0.0f64, 0.0f64);
        for i in 0..=400_000 {
            let x = -12.0 + 24.0 * i as f64 / 400_000.0;
            let (cdf, pdf) = super::cdf_and_pdf(x as f32);
            let xf = x as f32 as f64;
            let want = 0.5 * (1.0 + libm::erf(xf * std::f64::consts::FRAC_1_SQRT_2));
            let want_pdf = (-xf * xf / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            worst_cdf = worst_cdf.max((cdf as f64 - want).abs());
            worst_pdf = worst_pdf.max((xf * (pdf as f64 - want_pdf)).abs());
        }
        println!("largest error of Φ {worst_cdf:e}, of x·φ {worst_pdf:e}");
        assert!(
            (super::ERF_ERROR / 100.0..=super::SLACK / 4.0).contains(&worst_cdf),
            "largest error of Φ {worst_cdf:e}"
        );
        assert!(
            worst_pdf <= super::SLACK / 4.0,
            "largest error of x·φ {worst_pdf:e}"
        );
        assert_eq!(super::cdf_and_pdf(60.0).0, 1.0);
        assert_eq!(super::cdf_and_pdf(-60.0).0, 0.0);
        let u = f32::EPSILON as f64 / 2.0;
        for i in 0..=200_000 {
            let v = -90.0 * i as f64 / 200_000.0;
            let got = super::exp_neg(v as f32) as f64;
            let want = (v as f32 as f64).exp();
            if want >= f32::MIN_POSITIVE as f64 * 2.0 {
                assert!(
                    (got - want).abs() <= 4.0 * u * want,
                    "exp({v}) = {got}, not {want}"
                );
            } else {
                assert!(
                    got.abs() <= f32::MIN_POSITIVE as f64 * 2.0,
                    "exp({v}) = {got}"
                );
            }
        }
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
        let u = f32::EPSILON as f64 / 2.0;
        assert!((super::cdf_and_pdf(0.0).1 as f64 - want).abs() <= 2.0 * u * want);
        let x = -1.7f32;
        let at = want * (-(x as f64) * (x as f64) / 2.0).exp();
        assert!((super::cdf_and_pdf(x).1 as f64 - at).abs() <= 8.0 * u * at);
    }
}
