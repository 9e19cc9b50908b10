//! Vectorizable f32 transcendental functions for the native kernels.
//!
//! Branch-free (selects only), so loops over slices auto-vectorize, unlike calls into the
//! platform libm. Accuracy (checked by the tests below against f64 `std` over dense grids):
//! `exp` ≤ 3e-7 relative for normal results (subnormal ones, below -87.3, within that plus
//! 2^-149); `tanh` ≤ 3e-7 absolute; `sigmoid` ≤ 3e-7 absolute; `erf` ≤ 5e-7 absolute. `exp`
//! is +inf exactly where e^x exceeds f32::MAX (above 88.7228) and exactly 0 below -104, so a
//! masked score of -1e30 still contributes exactly zero.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // e^x overflows above ln(f32::MAX) = 88.7228 and is below the smallest subnormal
    // (2^-149) under -103.97; the clamp only keeps n in range, the factors below give
    // every value in between, subnormals and the last binade below f32::MAX included
    let xc = x.clamp(-104.0, 88.75);
    // round to nearest with the 1.5·2^23 trick: no call to floorf, so loops vectorize on SSE2
    const SHIFT: f32 = 12_582_912.0;
    let shifted = xc * LOG2E + SHIFT;
    let n = shifted - SHIFT;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // degree-6 Taylor polynomial of e^r on |r| <= ln2/2 (truncation < 1.2e-7 relative)
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n (in [-151, 129]) as an integer from the bits of `shifted` (= SHIFT + n exactly: its
    // ulp is 1), and 2^n as two normal factors 2^(n - n/2) · 2^(n/2): a single 2^n is not a
    // normal float for n = 128 (e^x in [2^127.5, f32::MAX]) nor below -126 (subnormal
    // results). Integer-only, so it vectorizes (`n as i32` is a saturating conversion that
    // LLVM scalarizes lane by lane).
    let ni = (shifted.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let half = ni >> 1;
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32) << 23);
    // p · 2^(n - n/2) is exact (a normal float); the last factor rounds once
    let y = p * pow2(ni - half) * pow2(half);
    if x < -104.0 {
        0.0
    } else if x > 88.75 {
        f32::INFINITY
    } else {
        y
    }
}

/// tanh(x): a short odd series near 0, (1 - e^{-2|x|}) / (1 + e^{-2|x|}) elsewhere.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let series = x
        * (1.0
            + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))));
    let t = exp(-2.0 * a);
    let far = ((1.0 - t) / (1.0 + t)).copysign(x);
    if a < 0.3 {
        series
    } else {
        far
    }
}

/// 1 / (1 + e^{-x}).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// erf(x): its Maclaurin series below 0.4 (where the formula below cancels), Abramowitz–Stegun
/// 7.1.26 above (absolute error ≤ 1.5e-7 in exact arithmetic).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    erf_given_exp(x, exp(-x * x))
}

/// [`erf`] with e^(−x²) given by the caller (`gelu`'s derivative computes it once for its
/// density term as well).
#[inline(always)]
pub fn erf_given_exp(x: f32, exp_neg_x2: f32) -> f32 {
    let a = x.abs();
    let x2 = x * x;
    let series = std::f32::consts::FRAC_2_SQRT_PI
        * x
        * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0)))));
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let far = (1.0 - poly * exp_neg_x2).copysign(x);
    if a < 0.4 {
        series
    } else {
        far
    }
}

const LANES: usize = 16;

/// The sum of the lanes as a tree (halves added pairwise: four dependent vector adds, not
/// fifteen dependent scalar ones, which on rows of a few dozen elements, a layer norm's or a
/// softmax's, cost more than the lanes' own sums). A fixed order, so still deterministic.
#[inline(always)]
fn reduce_lanes(mut a: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            a[i] += a[i + w];
        }
        w /= 2;
    }
    a[0]
}

/// Elements of one block of a long sum: each of the 16 lanes adds 64 of them in order.
///
/// A lane that ran over a whole row would add n/16 terms one after another: on 262 144
/// values near 100 (a mean over a long row) that erred by 1.2·10⁻⁶ relative, 15 ulps of the
/// result, where PyTorch's cascaded sums err by about one. So a sum longer than a block is
/// the sum of its blocks' lane sums, added pairwise ([`pairwise`]): the error bound is
/// (64 + 4 + ⌈log2(n / 1024)⌉)·u times the sum of magnitudes, and a row of at most one block
/// keeps the plain lane sum's bits.
pub const SUM_BLOCK: usize = LANES * 64;

/// The pairwise sum of partial sums given in order, +0 for none: the spec's cascade with
/// blocks of one value (`spec::sum::cascade_with`), a binary counter whose level i holds
/// the sum of 2^i values. (Each value here is a lane sum, which starts from +0: never -0,
/// so the cascade's `0 + v` at a block's start changes no bit.)
pub fn pairwise(values: impl IntoIterator<Item = f32>) -> f32 {
    crate::spec::sum::cascade_with(values, 0.0, |a, b| a + b, 1)
}

/// Σ f(x[i], y[i], z[i]) over the common length: 16 independent accumulators (fixed order,
/// so deterministic; it vectorizes, unlike a sequential fold), over blocks of at most
/// [`SUM_BLOCK`] elements whose sums are added pairwise. The shorter forms below pass the
/// same slice again for unused operands.
#[inline(always)]
pub fn sum_zip3(x: &[f32], y: &[f32], z: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = x.len().min(y.len()).min(z.len());
    if n <= SUM_BLOCK {
        return lane_sum_zip3(&x[..n], &y[..n], &z[..n], &f);
    }
    pairwise((0..n).step_by(SUM_BLOCK).map(|lo| {
        let hi = (lo + SUM_BLOCK).min(n);
        lane_sum_zip3(&x[lo..hi], &y[lo..hi], &z[lo..hi], &f)
    }))
}

/// One block of [`sum_zip3`] (operands of one length): the lanes, their tree, the tail.
#[inline(always)]
fn lane_sum_zip3(x: &[f32], y: &[f32], z: &[f32], f: &impl Fn(f32, f32, f32) -> f32) -> f32 {
    let n = x.len();
    let mut acc = [0.0f32; LANES];
    let (xc, yc, zc) = (
        x.chunks_exact(LANES),
        y.chunks_exact(LANES),
        z.chunks_exact(LANES),
    );
    let tail = n - xc.remainder().len();
    for ((a, b), c) in xc.zip(yc).zip(zc) {
        for k in 0..LANES {
            acc[k] += f(a[k], b[k], c[k]);
        }
    }
    let rest: f32 = (tail..n).map(|i| f(x[i], y[i], z[i])).sum();
    reduce_lanes(acc) + rest
}

/// Σ f(x[i]) ([`sum_zip3`]'s order).
#[inline(always)]
pub fn sum_map(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    sum_zip3(x, x, x, |a, _, _| f(a))
}

/// Σ f(x[i], y[i]) ([`sum_zip3`]'s order).
#[inline(always)]
pub fn sum_zip(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    sum_zip3(x, y, y, |a, b, _| f(a, b))
}

/// Sum with 16 independent accumulators over blocks added pairwise ([`sum_zip3`]'s order:
/// deterministic, and it vectorizes, unlike a sequential fold).
#[inline]
pub fn sum(x: &[f32]) -> f32 {
    sum_map(x, |v| v)
}

/// Maximum with 64 independent lanes (four blocks of 16, so that four comparison chains run
/// at once: one chain waits on its own compare-and-blend each block, which made a row's
/// maximum a tenth of the CPU flash attention's time), NaN when any element is NaN (a lane
/// that meets a NaN keeps it: [`crate::scalar::maximum`]); -inf for an empty slice. The last
/// elements (a whole row when rows are shorter than a block: attention over ten keys) go
/// through one block padded with -inf and the lanes meet as a tree, so a short row is a few
/// vector operations, not a scalar fold. Used as a softmax's shift: on a tie between -0 and
/// +0 either may be returned (a maximum is exact otherwise, so the lanes' order changes no
/// other bit). Inlined into its callers, so that it runs on their vectors (`crate::wide`).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    use crate::scalar::maximum;
    let mut acc = [[f32::NEG_INFINITY; LANES]; 4];
    let mut wide = x.chunks_exact(4 * LANES);
    for c in &mut wide {
        for (j, a) in acc.iter_mut().enumerate() {
            for (a, &v) in a.iter_mut().zip(&c[j * LANES..(j + 1) * LANES]) {
                *a = maximum(*a, v);
            }
        }
    }
    let mut chunks = wide.remainder().chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc[0].iter_mut().zip(c) {
            *a = maximum(*a, v);
        }
    }
    let rest = chunks.remainder();
    let mut block = [f32::NEG_INFINITY; LANES];
    block[..rest.len()].copy_from_slice(rest);
    meet(acc, block)
}

/// Whether every element of `x` is finite: a branch-free pass (16 lanes collecting whether
/// an element's exponent is all ones), where `iter().all(is_finite)` stops at the first
/// non-finite element but compares one element at a time.
#[inline]
pub fn all_finite(x: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    let mut acc = [0u32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a |= u32::from(v.to_bits() & EXP == EXP);
        }
    }
    chunks.remainder().iter().all(|v| v.is_finite()) && acc.iter().all(|&a| a == 0)
}

/// The maximum of four chains' lanes and a last block: lane by lane, then as a tree.
#[inline(always)]
fn meet([a0, a1, a2, a3]: [[f32; LANES]; 4], block: [f32; LANES]) -> f32 {
    use crate::scalar::maximum;
    let mut acc = block;
    for k in 0..LANES {
        acc[k] = maximum(
            maximum(acc[k], a0[k]),
            maximum(maximum(a1[k], a2[k]), a3[k]),
        );
    }
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] = maximum(acc[i], acc[i + w]);
        }
        w /= 2;
    }
    acc[0]
}

/// Replaces every `x[i]` by `f(x[i], i)` and returns the maximum of the results as [`max`]
/// does (64 lanes in four chains, NaN when any result is NaN, -inf for an empty slice; on a
/// tie between -0 and +0 either): a map and the maximum of what it wrote in one pass.
#[inline(always)]
pub fn map_max(x: &mut [f32], f: impl Fn(f32, usize) -> f32) -> f32 {
    use crate::scalar::maximum;
    let mut acc = [[f32::NEG_INFINITY; LANES]; 4];
    let mut i = 0;
    let mut wide = x.chunks_exact_mut(4 * LANES);
    for c in &mut wide {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, (a, v)) in a
                .iter_mut()
                .zip(&mut c[j * LANES..(j + 1) * LANES])
                .enumerate()
            {
                *v = f(*v, i + j * LANES + l);
                *a = maximum(*a, *v);
            }
        }
        i += 4 * LANES;
    }
    let mut chunks = wide.into_remainder().chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (l, (a, v)) in acc[0].iter_mut().zip(c.iter_mut()).enumerate() {
            *v = f(*v, i + l);
            *a = maximum(*a, *v);
        }
        i += LANES;
    }
    // the last elements (a causally cut row of a few keys) mapped one by one, their maximum
    // through one block padded with -inf
    let mut block = [f32::NEG_INFINITY; LANES];
    for (l, (v, b)) in chunks
        .into_remainder()
        .iter_mut()
        .zip(&mut block)
        .enumerate()
    {
        *v = f(*v, i + l);
        *b = *v;
    }
    meet(acc, block)
}

/// Replaces every `x` by `exp(x)` (one vectorized pass).
#[inline]
pub fn exp_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = exp(*v);
    }
}

/// Replaces every `x` by `exp(x - shift)` and returns their sum (16 lanes over blocks added
/// pairwise, as [`sum_zip3`]: a fixed order).
/// On a CPU with AVX-512 the same operations run on 512-bit vectors ([`crate::wide`]): the
/// same bits, twice the lanes per instruction.
#[inline]
pub fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
    crate::wide::wide!(exp_shifted_sum_body(x, shift))
}

#[inline(always)]
fn exp_shifted_sum_body(x: &mut [f32], shift: f32) -> f32 {
    if x.len() <= SUM_BLOCK {
        return exp_shifted_block(x, shift);
    }
    // a long row (a softmax over many classes): blocks added pairwise, as [`sum_zip3`]
    pairwise(
        x.chunks_mut(SUM_BLOCK)
            .map(|block| exp_shifted_block(block, shift)),
    )
}

/// One block of [`exp_shifted_sum_body`].
#[inline(always)]
fn exp_shifted_block(x: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c.iter_mut()) {
            *v = exp(*v - shift);
            *a += *v;
        }
    }
    // the tail (a whole row when rows are shorter than a block: attention over ten keys)
    // through one padded block, so it is vectorized too; the same values, summed in order
    let rest = chunks.into_remainder();
    let mut block = [0.0f32; LANES];
    block[..rest.len()].copy_from_slice(rest);
    for b in block.iter_mut() {
        *b = exp(*b - shift);
    }
    rest.copy_from_slice(&block[..rest.len()]);
    let tail: f32 = rest.iter().fold(0.0, |t, &v| t + v);
    reduce_lanes(acc) + tail
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn exp_shifted_sum_matches_two_passes() {
        for n in [0usize, 1, 15, 16, 33, 512] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37) % 19) as f32 * 0.25 - 2.0)
                .collect();
            let mut a = x.clone();
            let z = super::exp_shifted_sum(&mut a, 1.5);
            let b: Vec<f32> = x.iter().map(|&v| super::exp(v - 1.5)).collect();
            assert_eq!(a, b);
            assert!((z - super::sum(&b)).abs() <= 1e-6 * z.abs().max(1.0));
        }
    }

    /// `n` values near 100 (a mean's worst case: every term the same sign and size) from a
    /// fixed generator started at `seed` (the long-sum tests here and in `reduce.rs`).
    pub(crate) fn near_hundred(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = crate::spec::splitmix64(s);
                100.0 + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect()
    }

    #[test]
    fn long_sums_stay_within_the_blocked_pairwise_bound() {
        let u = f64::from(f32::EPSILON) / 2.0;
        for n in [1024usize, 1025, 4096 + 7, 100_000, 1 << 22] {
            let x = near_hundred(n, 0x9e37_79b9_7f4a_7c15);
            let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
            let levels = (n as f64 / super::SUM_BLOCK as f64).log2().ceil().max(0.0);
            let bound = (64.0 + 4.0 + levels + 1.0) * u * exact;
            for got in [
                super::sum(&x),
                super::sum_map(&x, |v| v),
                super::sum_zip(&x, &x, |a, _| a),
            ] {
                let err = (f64::from(got) - exact).abs();
                assert!(
                    err <= bound,
                    "n {n}: error {err:e} over the bound {bound:e}"
                );
            }
            // the softmax pass sums the same way
            let mut y = x.clone();
            let z = super::exp_shifted_sum(&mut y, 100.0);
            let exact_z: f64 = y.iter().map(|&v| f64::from(v)).sum();
            assert!((f64::from(z) - exact_z).abs() <= (64.0 + 4.0 + levels + 1.0) * u * exact_z);
        }
        // what the blocks buy: 2^22 terms near 100 (16 lanes of 2^18 terms each, left to
        // right, erred by 3.1e-6 relative here) now err by less than 10^-7
        let x = near_hundred(1 << 22, 0x9e37_79b9_7f4a_7c15);
        let exact: f64 = x.iter().map(|&v| f64::from(v)).sum();
        let rel = (f64::from(super::sum(&x)) - exact).abs() / exact;
        assert!(rel < 1e-7, "relative error {rel:e}");
    }

    #[test]
    fn pairwise_adds_like_the_spec_cascade_of_its_values() {
        // partial sums pushed one by one: the spec's cascade with blocks of one value is a
        // binary counter too; integers add exactly in any order, and the order is checked
        // on values where it matters against a direct binary-tree sum
        for n in [0usize, 1, 2, 3, 7, 8, 9, 100] {
            let v: Vec<f32> = (0..n).map(|i| (i as f32 + 1.0) * 0.1).collect();
            let mut tree = v.clone();
            // the counter's total for n = 2^k is the balanced tree
            if n.is_power_of_two() {
                while tree.len() > 1 {
                    tree = tree.chunks(2).map(|c| c[0] + c[1]).collect();
                }
                assert_eq!(super::pairwise(v.iter().copied()), tree[0], "n {n}");
            }
            let ints: Vec<f32> = (0..n).map(|i| i as f32).collect();
            assert_eq!(
                super::pairwise(ints.iter().copied()),
                ints.iter().sum::<f32>()
            );
        }
    }

    #[test]
    fn lane_sum_and_max_match_sequential() {
        for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 100, 130, 1000] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
            assert_eq!(
                super::sum(&x),
                x.iter().sum::<f32>(),
                "integers sum exactly in any order"
            );
            assert_eq!(
                super::max(&x),
                x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            );
        }
    }

    #[test]
    fn map_max_maps_every_element_and_returns_the_maximum_of_the_results() {
        for n in [0usize, 1, 15, 16, 17, 63, 64, 65, 100, 130, 1000] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
            let mut y = x.clone();
            let m = super::map_max(&mut y, |v, i| v * 0.5 + (i % 7) as f32);
            let want: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| v * 0.5 + (i % 7) as f32)
                .collect();
            assert_eq!(y, want, "n={n}");
            assert_eq!(m, want.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            for at in 0..n {
                let mut z = x.clone();
                z[at] = f32::NAN;
                assert!(super::map_max(&mut z, |v, _| v).is_nan(), "n={n} at={at}");
            }
        }
    }

    #[test]
    fn all_finite_finds_a_non_finite_element_anywhere() {
        for n in [0usize, 1, 15, 16, 17, 40, 100] {
            let x: Vec<f32> = (0..n).map(|i| i as f32 - 7.5).collect();
            assert!(super::all_finite(&x), "n={n}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in 0..n {
                    let mut y = x.clone();
                    y[at] = bad;
                    assert!(!super::all_finite(&y), "n={n} at={at} {bad}");
                }
            }
        }
        assert!(super::all_finite(&[
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE / 4.0,
            -0.0
        ]));
    }

    #[test]
    fn lane_max_propagates_nan_from_any_lane_and_the_tail() {
        for n in [1usize, 15, 16, 17, 40, 64, 80, 130] {
            for at in 0..n {
                let mut x: Vec<f32> = (0..n).map(|i| i as f32).collect();
                x[at] = f32::NAN;
                assert!(super::max(&x).is_nan(), "n={n} at={at}");
            }
        }
    }

    use super::*;

    fn grid() -> impl Iterator<Item = f32> {
        (-200_000..=200_000)
            .map(|i| i as f32 * 1e-4)
            .chain([1e-30, -1e-30, 0.0, -0.0, 50.0, -50.0, 87.0, -87.0])
    }

    #[test]
    fn exp_matches_std() {
        for x in grid() {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-105.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    /// The ends of the range, where 2^n alone is not a normal float: the last binade below
    /// f32::MAX (e^x for x in [88.03, 88.7228]: inf before the two-factor scaling) and the
    /// subnormal results (0 before), each against f64's e^x rounded to f32.
    #[test]
    fn exp_is_finite_up_to_f32_max_and_subnormal_below_the_normal_range() {
        let steps = 200_000;
        for i in 0..=steps {
            let x = 87.0f32 + 1.8 * i as f32 / steps as f32;
            let want = (x as f64).exp();
            let got = exp(x);
            if want > f32::MAX as f64 * (1.0 + 3e-7) {
                assert_eq!(got, f32::INFINITY, "exp({x})");
            } else if want < f32::MAX as f64 * (1.0 - 3e-7) {
                assert!(got.is_finite(), "exp({x}) = {got}, want {want}");
                assert!((got as f64 - want).abs() <= 3e-7 * want, "exp({x}) = {got}");
            }
        }
        let tiny = f32::from_bits(1) as f64; // 2^-149
        for i in 0..=steps {
            let x = -104.0f32 + 17.0 * i as f32 / steps as f32;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!(
                (got - want).abs() <= tiny + 3e-7 * want,
                "exp({x}) = {got:e}, want {want:e}"
            );
        }
        assert!(
            exp(-100.0) > 0.0,
            "a subnormal, as f64's e^-100 rounded to f32"
        );
        assert!(exp(88.72) < f32::INFINITY);
    }

    #[test]
    fn tanh_sigmoid_erf_match_std() {
        for x in grid() {
            let xd = x as f64;
            assert!((tanh(x) as f64 - xd.tanh()).abs() <= 3e-7, "tanh({x})");
            assert!(
                (sigmoid(x) as f64 - 1.0 / (1.0 + (-xd).exp())).abs() <= 3e-7,
                "sigmoid({x})"
            );
            assert!((erf(x) as f64 - libm::erf(xd)).abs() <= 5e-7, "erf({x})");
        }
        assert_eq!(tanh(1e30), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
        assert_eq!(sigmoid(-1e30), 0.0);
    }
}
