//! The product checks' inner loops: several matrix–vector products in one pass over a
//! matrix, in f32 lanes that each sum at most [`BLOCK`] products before they are added into
//! f64 (the rounding `freivalds.rs` bounds and allows for).
//!
//! Two shapes of pass: [`dots`], a row of the matrix against `N` vectors (the row is read
//! once for all of them), and [`column_block`], `BLOCK` stored rows of a transposed matrix
//! scaled by `N` weights each and summed into its output elements. Each has an AVX2/FMA
//! path for the checks' `N = 3` (the allowance's absolute values and two random vectors),
//! with its accumulators in registers, and a portable path that computes the same sums in
//! the same order for everything else. The two paths differ only in the order in which
//! a lane's f32 sum is split: both keep at most `BLOCK` products per f32 sum, which is all
//! the error bound assumes.
//!
//! Must not: sum more than `BLOCK` products in one f32 lane, or read outside the slices.

use super::freivalds::BLOCK;

/// Lanes of one f32 vector register (AVX2).
const L: usize = 8;

/// Elements per span of [`dots`]: two lane sets take alternate chunks of `L`, `BLOCK`
/// chunks each.
const SPAN: usize = 2 * L * BLOCK;

/// `f_s(x)`: |x| for the first vector when `ABS`, else x.
#[inline(always)]
fn f<const ABS: bool>(s: usize, x: f32) -> f32 {
    if ABS && s == 0 {
        x.abs()
    } else {
        x
    }
}

/// `[Σ f_0(a_i)·v_0i, Σ a_i·v_1i, …]` (f_0 = |·| when `ABS`) in one pass over `a`; each
/// `v[s]` holds at least `a.len()` elements. Two sets of eight f32 lanes per vector take
/// alternate chunks of eight elements (independent FMA chains), each lane summing `BLOCK`
/// products per span before it is added into an f64 lane; the tail is summed at f64.
pub(super) fn dots<const N: usize, const ABS: bool>(a: &[f32], v: &[&[f32]; N]) -> [f64; N] {
    let n = a.len();
    let v: [&[f32]; N] = std::array::from_fn(|s| &v[s][..n]);
    let whole = n / SPAN * SPAN;
    let mut wide = [0.0f64; N];
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if N == 3 && ABS {
        // SAFETY: AVX2 and FMA are enabled for the whole build (cfg); `a` and every `v[s]`
        // hold exactly n >= whole elements (sliced above), and the kernel reads the first
        // `whole` of each.
        let d = unsafe { dots3_avx2(&a[..whole], [v[0], v[1], v[2]]) };
        wide[..3].copy_from_slice(&d);
    } else {
        portable_dots::<N, ABS>(&a[..whole], &v, &mut wide);
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    portable_dots::<N, ABS>(&a[..whole], &v, &mut wide);
    std::array::from_fn(|s| {
        let tail: f64 = a[whole..]
            .iter()
            .zip(&v[s][whole..])
            .map(|(&x, &y)| f::<ABS>(s, x) as f64 * y as f64)
            .sum();
        wide[s] + tail
    })
}

/// [`dots`] over whole spans, portably.
fn portable_dots<const N: usize, const ABS: bool>(a: &[f32], v: &[&[f32]; N], wide: &mut [f64; N]) {
    for at in (0..a.len()).step_by(SPAN) {
        let mut acc = [[[0.0f32; L]; 2]; N];
        for c in 0..BLOCK {
            for (h, lanes) in (0..2).map(|h| (h, (2 * c + h) * L + at)) {
                for (s, acc) in acc.iter_mut().enumerate() {
                    for l in 0..L {
                        acc[h][l] = f::<ABS>(s, a[lanes + l]).mul_add(v[s][lanes + l], acc[h][l]);
                    }
                }
            }
        }
        for (w, acc) in wide.iter_mut().zip(&acc) {
            *w += acc.iter().flatten().map(|&x| x as f64).sum::<f64>();
        }
    }
}

/// [`dots`] for three vectors (|·| on the first) over whole spans.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `a.len()` must be a multiple of [`SPAN`] and each
/// `v[s]` must hold at least `a.len()` elements.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
unsafe fn dots3_avx2(a: &[f32], v: [&[f32]; 3]) -> [f64; 3] {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let mut wide = [_mm256_setzero_pd(); 6];
    let (pa, p0, p1, p2) = (a.as_ptr(), v[0].as_ptr(), v[1].as_ptr(), v[2].as_ptr());
    for at in (0..a.len()).step_by(SPAN) {
        let mut acc = [_mm256_setzero_ps(); 6];
        for c in 0..BLOCK {
            for h in 0..2 {
                let k = at + (2 * c + h) * L;
                // SAFETY (loads): k + L <= a.len() <= len of each v[s] (caller's contract)
                let x = _mm256_loadu_ps(pa.add(k));
                let ax = _mm256_andnot_ps(sign, x);
                acc[h] = _mm256_fmadd_ps(ax, _mm256_loadu_ps(p0.add(k)), acc[h]);
                acc[2 + h] = _mm256_fmadd_ps(x, _mm256_loadu_ps(p1.add(k)), acc[2 + h]);
                acc[4 + h] = _mm256_fmadd_ps(x, _mm256_loadu_ps(p2.add(k)), acc[4 + h]);
            }
        }
        for s in 0..3 {
            for h in 0..2 {
                let r = acc[2 * s + h];
                let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(r));
                let hi = _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1));
                wide[2 * s] = _mm256_add_pd(wide[2 * s], lo);
                wide[2 * s + 1] = _mm256_add_pd(wide[2 * s + 1], hi);
            }
        }
    }
    std::array::from_fn(|s| {
        let mut lanes = [0.0f64; 8];
        // SAFETY: each store writes four f64s into an array of eight
        _mm256_storeu_pd(lanes.as_mut_ptr(), wide[2 * s]);
        _mm256_storeu_pd(lanes.as_mut_ptr().add(4), wide[2 * s + 1]);
        lanes.iter().sum()
    })
}

/// `o[s][i − lo] += Σ_u f_s(block[u][i])·w[s][u]` for i in `lo..hi` (f_0 = |·| when
/// `ABS`): each element's at most `BLOCK` products summed in one f32 lane, then added into
/// f64. Every `block[u]` holds at least `hi` elements and `o[s]` at least `hi − lo`.
pub(super) fn column_block<const N: usize, const ABS: bool>(
    block: &[&[f32]],
    w: &[[f32; BLOCK]; N],
    lo: usize,
    hi: usize,
    o: &mut [Vec<f64>; N],
) {
    debug_assert!(block.len() <= BLOCK);
    let n = hi.saturating_sub(lo);
    let whole = n / (2 * L) * (2 * L);
    let fits = block.iter().all(|r| r.len() >= hi) && o.iter().all(|o| o.len() >= n);
    let mut done = 0;
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    if N == 3 && ABS && fits {
        let ws = [w[0], w[1], w[2]];
        let outs = [o[0].as_mut_ptr(), o[1].as_mut_ptr(), o[2].as_mut_ptr()];
        // SAFETY: AVX2 and FMA are enabled for the whole build (cfg); every row holds at
        // least `hi` elements and every output at least `n` (checked: `fits`), the three
        // outputs are distinct vectors, and the kernel reads rows at lo..lo + whole and
        // writes outputs at 0..whole.
        unsafe { column_block3_avx2(block, &ws, lo, whole, outs) };
        done = whole;
    }
    let _ = fits;
    for i in done..n {
        for (s, o) in o.iter_mut().enumerate() {
            let mut lane = 0.0f32;
            for (u, row) in block.iter().enumerate() {
                lane = f::<ABS>(s, row[lo + i]).mul_add(w[s][u], lane);
            }
            o[i] += lane as f64;
        }
    }
}

/// [`column_block`] for three weights per row (|·| on the first) over the first `whole`
/// output elements, sixteen at a time in registers.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `whole` must be a multiple of 16, every row must hold
/// at least `lo + whole` elements, and every output must point to at least `whole` f64s
/// that nothing else accesses during the call.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
unsafe fn column_block3_avx2(
    block: &[&[f32]],
    w: &[[f32; BLOCK]; 3],
    lo: usize,
    whole: usize,
    o: [*mut f64; 3],
) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    for i in (0..whole).step_by(2 * L) {
        let mut acc = [_mm256_setzero_ps(); 6];
        for (u, row) in block.iter().enumerate() {
            // SAFETY (loads): lo + i + 16 <= lo + whole <= row.len() (caller's contract)
            let p = row.as_ptr().add(lo + i);
            let (w0, w1, w2) = (
                _mm256_set1_ps(w[0][u]),
                _mm256_set1_ps(w[1][u]),
                _mm256_set1_ps(w[2][u]),
            );
            for h in 0..2 {
                let x = _mm256_loadu_ps(p.add(h * L));
                acc[h] = _mm256_fmadd_ps(_mm256_andnot_ps(sign, x), w0, acc[h]);
                acc[2 + h] = _mm256_fmadd_ps(x, w1, acc[2 + h]);
                acc[4 + h] = _mm256_fmadd_ps(x, w2, acc[4 + h]);
            }
        }
        for (s, out) in o.iter().enumerate() {
            // SAFETY (outputs): i + 16 <= whole, within the output (caller's contract)
            let q = out.add(i);
            for h in 0..2 {
                let r = acc[2 * s + h];
                let lo4 = _mm256_cvtps_pd(_mm256_castps256_ps128(r));
                let hi4 = _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1));
                let at = q.add(h * L);
                _mm256_storeu_pd(at, _mm256_add_pd(_mm256_loadu_pd(at), lo4));
                _mm256_storeu_pd(at.add(4), _mm256_add_pd(_mm256_loadu_pd(at.add(4)), hi4));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = crate::spec::splitmix64(seed.wrapping_add(i as u64));
                (h % 20_001) as f32 / 1000.0 - 10.0
            })
            .collect()
    }

    /// Each f32 lane sums at most BLOCK products: the computed sums are within
    /// γ_8·Σ|terms| (+ the f64 slack) of the exact ones, for lengths with and without a
    /// tail, on the vectorized (N = 3, |·| first) and the portable (N = 2) paths.
    #[test]
    fn dots_are_within_the_blocked_rounding_bound() {
        let u = 1.0 / (1u64 << 24) as f64;
        let g8 = 8.0 * u / (1.0 - 8.0 * u);
        for n in [0, 5, 127, 128, 129, 784, 1000] {
            let a = data(n, 1);
            let vs: Vec<Vec<f32>> = (0..3).map(|s| data(n, 10 + s)).collect();
            let three = dots::<3, true>(&a, &[&vs[0], &vs[1], &vs[2]]);
            let two = dots::<2, false>(&a, &[&vs[1], &vs[2]]);
            for s in 0..3 {
                let f = |x: f32| if s == 0 { x.abs() } else { x } as f64;
                let exact: f64 = a.iter().zip(&vs[s]).map(|(&x, &y)| f(x) * y as f64).sum();
                let mag: f64 = a
                    .iter()
                    .zip(&vs[s])
                    .map(|(&x, &y)| (x as f64 * y as f64).abs())
                    .sum();
                let bound = g8 * mag * (1.0 + 1e-9) + 1e-12;
                assert!((three[s] - exact).abs() <= bound, "n={n} s={s}");
                if s > 0 {
                    assert!((two[s - 1] - exact).abs() <= bound, "portable n={n} s={s}");
                }
            }
        }
    }

    /// Data where the blocking decides the error: 2^24 at the first eight positions of every
    /// span and 1.0 elsewhere, so each f32 lane that starts at 2^24 loses every 1.0 it adds
    /// (ties to even). With at most eight products per lane a span loses 8·7 = 56 against a
    /// bound of γ₈·8·2^24 ≈ 64; a lane summing sixteen products would lose 8·15 = 120.
    #[test]
    fn dots_sum_at_most_eight_products_per_f32_lane() {
        let u = 1.0 / (1u64 << 24) as f64;
        let g8 = 8.0 * u / (1.0 - 8.0 * u);
        let n = 4 * SPAN;
        let a: Vec<f32> = (0..n)
            .map(|i| if i % SPAN < 8 { 16_777_216.0 } else { 1.0 })
            .collect();
        let ones = vec![1.0f32; n];
        let exact: f64 = a.iter().map(|&x| x as f64).sum();
        let three = dots::<3, true>(&a, &[&ones, &ones, &ones]);
        let two = dots::<2, false>(&a, &[&ones, &ones]);
        for d in three.iter().chain(&two) {
            assert!(
                exact - d > 0.0,
                "the data must make f32 sums lose: {d} vs {exact}"
            );
            assert!((d - exact).abs() <= g8 * exact, "{d} vs {exact}");
        }
    }

    /// The column pass against exact sums, for ranges with and without a tail and a short
    /// last block.
    #[test]
    fn column_blocks_are_within_the_blocked_rounding_bound() {
        let u = 1.0 / (1u64 << 24) as f64;
        let g8 = 8.0 * u / (1.0 - 8.0 * u);
        let width = 100;
        for (rows, lo, hi) in [(8, 0, 100), (5, 3, 90), (8, 16, 48), (3, 7, 8)] {
            let m = data(rows * width, 2);
            let block: Vec<&[f32]> = m.chunks_exact(width).collect();
            let w: [[f32; BLOCK]; 3] = std::array::from_fn(|s| {
                let d = data(BLOCK, 20 + s as u64);
                std::array::from_fn(|u| if u < rows { d[u] } else { 0.0 })
            });
            let mut o: [Vec<f64>; 3] = std::array::from_fn(|_| vec![0.5; hi - lo]);
            column_block::<3, true>(&block, &w, lo, hi, &mut o);
            for s in 0..3 {
                for i in 0..hi - lo {
                    let f = |x: f32| if s == 0 { x.abs() } else { x } as f64;
                    let terms: Vec<f64> = (0..rows)
                        .map(|u| f(block[u][lo + i]) * w[s][u] as f64)
                        .collect();
                    let exact = 0.5 + terms.iter().sum::<f64>();
                    let mag: f64 = terms.iter().map(|t| t.abs()).sum();
                    assert!(
                        (o[s][i] - exact).abs() <= g8 * mag + 1e-12,
                        "rows={rows} lo={lo} hi={hi} s={s} i={i}"
                    );
                }
            }
        }
    }
}
