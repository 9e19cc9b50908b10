//! The flash kernel's forward over at most [`SMALL_KEYS`] keys: attention over a handful of
//! tokens (an imported encoder's ten keys of eight features per head, a 64-token training
//! sequence), where packing and dispatching tile products through the GEMM crate costs more
//! than their arithmetic. One pass covers every key, so no online rescaling is needed.
//!
//! The keys are transposed once per batch matrix into rows of `sp` (S rounded up to
//! [`LANE`]); scores and outputs are then register blocks of up to [`ROWS`] query rows ×
//! a few lanes of columns, so that several independent accumulation chains run side by side
//! (one chain is bound by the FMA latency: with one per row the sixteenth session measured
//! the transformer-step's 64-key attention at about 15 GFLOP/s, and an eight-wide head, an
//! imported encoder's, has only one lane block per row). Every lane sums its terms in index order,
//! so an output does not depend on the block it was computed in. Every key is visited (a
//! blocked key's zero weight times its value row, as the spec's sum), and the special rows
//! come out as in the tiled path: zeros for a fully blocked row, NaN for a row with a NaN
//! score or with no finite score.
//!
//! Owns: the small path's arithmetic and buffers. Must not decide when it applies nor how
//! work is split over threads (flash.rs does both).

use super::special::{scale_and_mask, Attention};
use super::strided::Rows as Matrix;
use super::vmath;

/// Up to this many keys the forward takes this path.
pub(super) const SMALL_KEYS: usize = 64;

/// Lanes of a register block's column group.
const LANE: usize = 8;

/// Query rows per register block: with 16 columns, 8 accumulators, 2 loads of keys or values
/// and 4 broadcasts per step of the sum (inside AVX2's 16 vector registers).
const ROWS: usize = 4;

/// Buffers of [`forward_small`], reused across the batch matrices one task computes.
#[derive(Default)]
pub(super) struct Scratch {
    /// The keys transposed, `d` rows of `sp`.
    kt: Vec<f32>,
    /// The tile's scores, then probabilities, rows of `sp`.
    p: Vec<f32>,
    /// Per row: 1 / the sum of its probabilities.
    inv: Vec<f32>,
    /// Per row: the value of every output of a row whose output is fixed (zeros for a fully
    /// blocked row, NaN), None for a row computed from its probabilities.
    special: Vec<Option<f32>>,
}

impl Scratch {
    /// Grows the buffers to at least these lengths (never shrinks, never clears).
    fn fit(&mut self, kt: usize, p: usize, rows: usize) {
        grow(&mut self.kt, kt, 0.0);
        grow(&mut self.p, p, 0.0);
        grow(&mut self.inv, rows, 0.0);
        grow(&mut self.special, rows, None);
    }
}

/// Grows `v` to at least `n` elements (never shrinks).
fn grow<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// The forward of query rows `rows` of batch matrix `bi` into `out` (rows × dv), in three
/// passes over the tile's rows: (1) the scores against every key, scaled, masked and
/// causally cut as the tiled path's `tile_scores`, minus each row's maximum; (2) one
/// exponential over the whole tile (many rows of a few keys vectorize as one long row, not a
/// short one at a time); (3) each row's sum and the weighted sum of the value rows. On
/// 512-bit vectors where the CPU has them (`crate::wide`: the same bits).
pub(super) fn forward_small(
    at: &Attention,
    bi: usize,
    rows: std::ops::Range<usize>,
    operands: (Matrix, Matrix, Matrix),
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    crate::wide::wide!(forward_small_body(at, bi, rows, operands, scratch, out))
}

#[inline(always)]
fn forward_small_body(
    at: &Attention,
    bi: usize,
    rows: std::ops::Range<usize>,
    (q, k, v): (Matrix, Matrix, Matrix),
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    let (s, d, dv) = (at.s, at.d, at.dv);
    let sp = s.div_ceil(LANE) * LANE;
    let n = rows.len();
    scratch.fit(d * sp, n * sp, n);
    let Scratch {
        kt,
        p,
        inv,
        special,
    } = scratch;
    // the padding columns s..sp of `kt` keep whatever they held: the scores they give are
    // overwritten with -inf below
    for j in 0..s {
        for (c, &x) in k.row(j).iter().enumerate() {
            kt[c * sp + j] = x;
        }
    }
    let p = &mut p[..n * sp];
    let q = q.rows_on(rows.start);
    let mut r0 = 0;
    while r0 < n {
        if n - r0 >= ROWS {
            score_rows::<ROWS, 16>(q, r0, kt, sp, p);
            r0 += ROWS;
        } else {
            score_rows::<1, 32>(q, r0, kt, sp, p);
            r0 += 1;
        }
    }
    for (r, pr) in p.chunks_mut(sp.max(1)).enumerate() {
        let i = rows.start + r;
        pr[s..].fill(f32::NEG_INFINITY);
        let row = &mut pr[..s];
        scale_and_mask(row, at.scale, at.mask, at.extra_row(bi, i));
        if at.causal && i + 1 < s {
            row[i + 1..].fill(f32::NEG_INFINITY);
        }
        let mx = vmath::max(row);
        special[r] = if at.fully_blocked(bi, i) {
            Some(0.0)
        } else if mx.is_nan() || mx == f32::NEG_INFINITY {
            Some(f32::NAN)
        } else {
            row.iter_mut().for_each(|x| *x -= mx);
            None
        };
        if special[r].is_some() {
            pr.fill(f32::NEG_INFINITY);
        }
    }
    vmath::exp_in_place(p);
    for (z, pr) in inv.iter_mut().zip(p.chunks(sp.max(1))) {
        // NaN where 1 / sum is not finite: that row's outputs are NaN, as the spec's
        let x = 1.0 / vmath::sum(&pr[..s]);
        *z = if x.is_finite() { x } else { f32::NAN };
    }
    let mut r0 = 0;
    while r0 < n {
        if n - r0 >= ROWS {
            weighted_rows::<ROWS, 16>(p, (sp, s), r0, v, inv, out, dv);
            r0 += ROWS;
        } else {
            weighted_rows::<1, 32>(p, (sp, s), r0, v, inv, out, dv);
            r0 += 1;
        }
    }
    for (o, fixed) in out.chunks_mut(dv.max(1)).zip(&special[..n]) {
        if let Some(value) = fixed {
            o.fill(*value);
        }
    }
}

/// The raw scores of query rows `r0 .. r0 + R` (rows of `q`) against the transposed keys
/// `kt` (rows of `sp`) into the same rows of `p`: blocks of `W` columns, then of [`LANE`].
#[inline(always)]
fn score_rows<const R: usize, const W: usize>(
    q: Matrix,
    r0: usize,
    kt: &[f32],
    sp: usize,
    p: &mut [f32],
) {
    let qs: [&[f32]; R] = std::array::from_fn(|r| q.row(r0 + r));
    let mut jb = 0;
    while jb + W <= sp {
        score_block::<R, W>(&qs, kt, sp, jb, &mut p[r0 * sp..]);
        jb += W;
    }
    while jb < sp {
        score_block::<R, LANE>(&qs, kt, sp, jb, &mut p[r0 * sp..]);
        jb += LANE;
    }
}

/// Columns `jb .. jb + W` of [`score_rows`]; `p` from row `r0` on.
#[inline(always)]
fn score_block<const R: usize, const W: usize>(
    qs: &[&[f32]; R],
    kt: &[f32],
    sp: usize,
    jb: usize,
    p: &mut [f32],
) {
    let acc = block::<R, W>(qs, |c| &kt[c * sp..], jb);
    for (r, ar) in acc.iter().enumerate() {
        p[r * sp + jb..][..W].copy_from_slice(ar);
    }
}

/// The register block both products are made of: `acc[r][l] = Σ_k a[r][k] · b(k)[c0 + l]`
/// for the R rows of `a` and W columns from `c0`, each lane summing over `k` in order.
#[inline(always)]
fn block<'b, const R: usize, const W: usize>(
    a: &[&[f32]; R],
    b: impl Fn(usize) -> &'b [f32],
    c0: usize,
) -> [[f32; W]; R] {
    let mut acc = [[0.0f32; W]; R];
    #[allow(clippy::needless_range_loop)] // k indexes R rows of `a` and selects b's row at once
    for k in 0..a[0].len() {
        // the operands first, then only arithmetic: a bounds check between the
        // multiply-adds keeps the compiler from turning the lanes into vector instructions
        let w: [f32; R] = std::array::from_fn(|r| a[r][k]);
        let br = &b(k)[c0..][..W];
        for (ar, &wr) in acc.iter_mut().zip(&w) {
            for l in 0..W {
                ar[l] = wr.mul_add(br[l], ar[l]);
            }
        }
    }
    acc
}

/// The outputs of rows `r0 .. r0 + R`: each row's probabilities (`p`, rows of `sp`, the first
/// `s` read) times the value rows, times the row's `inv` (NaN stays NaN), into `out` (rows of
/// `dv`): blocks of `W` columns, then of [`LANE`], then the last columns one row at a time.
#[inline(always)]
fn weighted_rows<const R: usize, const W: usize>(
    p: &[f32],
    (sp, s): (usize, usize),
    r0: usize,
    v: Matrix,
    inv: &[f32],
    out: &mut [f32],
    dv: usize,
) {
    let ps: [&[f32]; R] = std::array::from_fn(|r| &p[(r0 + r) * sp..][..s]);
    let mut c0 = 0;
    while c0 + W <= dv {
        weighted_block::<R, W>(&ps, v, c0, &inv[r0..], &mut out[r0 * dv..], dv);
        c0 += W;
    }
    while c0 + LANE <= dv {
        weighted_block::<R, LANE>(&ps, v, c0, &inv[r0..], &mut out[r0 * dv..], dv);
        c0 += LANE;
    }
    if c0 < dv {
        // the last columns, fewer than a lane
        for (r, pr) in ps.iter().enumerate() {
            let mut a = [0.0f32; LANE];
            for (j, &w) in pr.iter().enumerate() {
                for (al, &y) in a.iter_mut().zip(&v.row(j)[c0..dv]) {
                    *al = w.mul_add(y, *al);
                }
            }
            let o = &mut out[(r0 + r) * dv + c0..(r0 + r + 1) * dv];
            for (x, &al) in o.iter_mut().zip(&a) {
                *x = al * inv[r0 + r];
            }
        }
    }
}

/// Columns `c0 .. c0 + W` of [`weighted_rows`]; `inv` and `out` from row `r0` on.
#[inline(always)]
fn weighted_block<const R: usize, const W: usize>(
    ps: &[&[f32]; R],
    v: Matrix,
    c0: usize,
    inv: &[f32],
    out: &mut [f32],
    dv: usize,
) {
    let acc = block::<R, W>(ps, |j| v.row(j), c0);
    for (r, ar) in acc.iter().enumerate() {
        for (x, &al) in out[r * dv + c0..][..W].iter_mut().zip(ar) {
            *x = al * inv[r];
        }
    }
}
