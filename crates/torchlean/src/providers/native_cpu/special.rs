//! Native special kernels.
//!
//! - `spectral_conv1d`: a truncated real DFT as one GEMM against a twiddle table
//!   `T [2M, N]` (rows `cos(2πkt/N)` then `-sin(2πkt/N)`, angles reduced exactly in f64,
//!   exact at the multiples of π/2),
//!   the complex channel mix as direct loops, and the normalized inverse as a second GEMM
//!   against the same table. The VJP uses the adjoint products.
//! - `selective_scan`: a loop over time vectorized across the trailing elements, one batch
//!   element per parallel task; the VJP runs the adjoint recurrence backwards.
//! - `scaled_dot_product_attention`: per batch matrix, `S = scale Q K^T` by GEMM, masked row
//!   softmax (blocked entries exactly zero, fully blocked rows all zero), `O = P V` by GEMM;
//!   the VJP recomputes `P`. Batch matrices run in parallel; the shared-bias gradient is
//!   summed in batch order, so results are deterministic.

use super::par::{for_rows, gemm, Mat, PAR_THRESHOLD};
use super::strided::Operand;
use crate::graph::{AttentionMask, Op};
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    match op {
        Op::SpectralConv1d { modes } => spectral_forward(*modes, x, out_shape),
        Op::SelectiveScan => scan_forward(x),
        Op::ScaledDotProductAttention { .. } => attention_forward(op, x, out_shape),
        _ => unreachable!("special::forward called for {}", op.name()),
    }
}

pub fn vjp(op: &Op, x: &[&Tensor], y: &Tensor, gy: &Tensor) -> Vec<Option<Tensor>> {
    match op {
        Op::SpectralConv1d { modes } => spectral_vjp(*modes, x, gy),
        Op::SelectiveScan => scan_vjp(x, y, gy),
        Op::ScaledDotProductAttention { .. } => attention_vjp(op, x, gy),
        _ => unreachable!("special::vjp called for {}", op.name()),
    }
}

// ---------------------------------------------------------------------------------------
// spectral_conv1d

/// Twiddle table `[2m, n]`: row `k < m` is `cos(2πkt/n)`, row `m + k` is `-sin(2πkt/n)`.
fn twiddles(m: usize, n: usize) -> Vec<f32> {
    let mut t = super::par::zeroed(2 * m * n);
    for k in 0..m {
        for s in 0..n {
            // exact at the multiples of π/2: no sine at DC and Nyquist (`spec::twiddle`)
            let (cos, sin) = crate::spec::twiddle(k, s, n);
            t[k * n + s] = cos as f32;
            t[(m + k) * n + s] = -sin as f32;
        }
    }
    t
}

/// `c_k / n` of the normalized real inverse DFT (0 for an empty signal).
fn inverse_weights(m: usize, n: usize) -> Vec<f32> {
    (0..m)
        .map(|k| {
            if n == 0 {
                return 0.0;
            }
            let c = if k == 0 || (n % 2 == 0 && k == n / 2) {
                1.0
            } else {
                2.0
            };
            (c / n as f64) as f32
        })
        .collect()
}

/// Truncated DFT of `rows` signals of length `n`: `[rows, 2m]` (real parts, then imaginary).
fn rdft(x: &[f32], rows: usize, n: usize, m: usize, table: &[f32]) -> Vec<f32> {
    let mut out = super::par::zeroed(rows * 2 * m);
    gemm(
        rows,
        2 * m,
        n,
        Mat::rows(x, n),
        Mat::transposed(table, n),
        &mut out,
        false,
        true,
    );
    out
}

fn spectral_dims(x: &[&Tensor]) -> (usize, usize, usize, usize) {
    let (xs, ws) = (x[0].shape(), x[1].shape());
    (xs[0], xs[1], xs[2], ws[1])
}

fn spectral_forward(m: usize, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let (b, ci, n, co) = spectral_dims(x);
    let (xd, wr, wi) = (x[0].data(), x[1].data(), x[2].data());
    let table = twiddles(m, n);
    let cw = inverse_weights(m, n);
    let xf = rdft(&xd, b * ci, n, m, &table);
    // Z [b*co, 2m] = c_k/n * (Y_r | Y_i), Y_k[o] = Σ_i X_k[i] W_k[i, o]
    let mut z = super::par::zeroed(b * co * 2 * m);
    for_rows(&mut z, 2 * m, |row, zr| {
        let (bb, o) = (row / co, row % co);
        let (yr, yi) = zr.split_at_mut(m);
        for i in 0..ci {
            let xrow = &xf[(bb * ci + i) * 2 * m..(bb * ci + i + 1) * 2 * m];
            let (ar, ai) = xrow.split_at(m);
            let w = (i * co + o) * m;
            let (wrr, wir) = (&wr[w..w + m], &wi[w..w + m]);
            for k in 0..m {
                yr[k] += ar[k] * wrr[k] - ai[k] * wir[k];
                yi[k] += ar[k] * wir[k] + ai[k] * wrr[k];
            }
        }
        for k in 0..m {
            yr[k] *= cw[k];
            yi[k] *= cw[k];
        }
    });
    let mut y = super::par::zeroed(out_shape.iter().product());
    gemm(
        b * co,
        n,
        2 * m,
        Mat::rows(&z, 2 * m),
        Mat::rows(&table, n),
        &mut y,
        false,
        true,
    );
    y
}

fn spectral_vjp(m: usize, x: &[&Tensor], gy: &Tensor) -> Vec<Option<Tensor>> {
    let (b, ci, n, co) = spectral_dims(x);
    let (xd, wr, wi, gyd) = (x[0].data(), x[1].data(), x[2].data(), gy.data());
    let table = twiddles(m, n);
    let cw = inverse_weights(m, n);
    let xf = rdft(&xd, b * ci, n, m, &table);
    // cotangent of Y: c_k/n * DFT(gy)
    let mut gf = rdft(&gyd, b * co, n, m, &table);
    if m > 0 {
        for row in gf.chunks_mut(2 * m) {
            for k in 0..m {
                row[k] *= cw[k];
                row[m + k] *= cw[k];
            }
        }
    }
    // cotangent of X [b*ci, 2m]
    let mut gxf = super::par::zeroed(b * ci * 2 * m);
    for_rows(&mut gxf, 2 * m, |row, out| {
        let (bb, i) = (row / ci, row % ci);
        let (gxr, gxi) = out.split_at_mut(m);
        for o in 0..co {
            let grow = &gf[(bb * co + o) * 2 * m..(bb * co + o + 1) * 2 * m];
            let (gr, gi) = grow.split_at(m);
            let w = (i * co + o) * m;
            let (wrr, wir) = (&wr[w..w + m], &wi[w..w + m]);
            for k in 0..m {
                gxr[k] += gr[k] * wrr[k] + gi[k] * wir[k];
                gxi[k] += gi[k] * wrr[k] - gr[k] * wir[k];
            }
        }
    });
    let mut gx = super::par::zeroed(xd.len());
    gemm(
        b * ci,
        n,
        2 * m,
        Mat::rows(&gxf, 2 * m),
        Mat::rows(&table, n),
        &mut gx,
        false,
        true,
    );
    // weight cotangents, rows (i, o): [ci*co, 2m] (real, then imaginary)
    let mut gw = super::par::zeroed(ci * co * 2 * m);
    for_rows(&mut gw, 2 * m, |row, out| {
        let (i, o) = (row / co, row % co);
        let (gwr, gwi) = out.split_at_mut(m);
        for bb in 0..b {
            let xrow = &xf[(bb * ci + i) * 2 * m..(bb * ci + i + 1) * 2 * m];
            let grow = &gf[(bb * co + o) * 2 * m..(bb * co + o + 1) * 2 * m];
            let ((ar, ai), (gr, gi)) = (xrow.split_at(m), grow.split_at(m));
            for k in 0..m {
                gwr[k] += gr[k] * ar[k] + gi[k] * ai[k];
                gwi[k] += gi[k] * ar[k] - gr[k] * ai[k];
            }
        }
    });
    let (mut gwr, mut gwi) = (
        Vec::with_capacity(ci * co * m),
        Vec::with_capacity(ci * co * m),
    );
    if m > 0 {
        for row in gw.chunks(2 * m) {
            gwr.extend_from_slice(&row[..m]);
            gwi.extend_from_slice(&row[m..]);
        }
    }
    vec![
        Some(Tensor::from_parts(gx, x[0].shape().to_vec())),
        Some(Tensor::from_parts(gwr, x[1].shape().to_vec())),
        Some(Tensor::from_parts(gwi, x[2].shape().to_vec())),
    ]
}

// ---------------------------------------------------------------------------------------
// selective_scan

/// (batch, length, trailing elements) of a scan input.
fn scan_dims(x: &Tensor) -> (usize, usize, usize) {
    let s = x.shape();
    (s[0], s[1], s[2..].iter().product())
}

/// Runs `f(batch_index, chunk)` over chunks of `out` of length `per`, in parallel when large.
fn per_batch(out: &mut [f32], per: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if per == 0 {
        return;
    }
    if out.len() < PAR_THRESHOLD {
        out.chunks_mut(per).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

fn scan_forward(x: &[&Tensor]) -> Vec<f32> {
    let (_, l, inner) = scan_dims(x[0]);
    let (a, u) = (x[0].data(), x[1].data());
    let per = l * inner;
    let mut y = super::par::zeroed(a.len());
    per_batch(&mut y, per, |bb, yb| {
        let (ab, ub) = (&a[bb * per..(bb + 1) * per], &u[bb * per..(bb + 1) * per]);
        // t = 0: h = a_0 * 0 + u_0
        for ((h, &av), &uv) in yb[..inner].iter_mut().zip(&ab[..inner]).zip(&ub[..inner]) {
            *h = av * 0.0 + uv;
        }
        for t in 1..l {
            let (prev, cur) = yb[(t - 1) * inner..(t + 1) * inner].split_at_mut(inner);
            let (at, ut) = (
                &ab[t * inner..(t + 1) * inner],
                &ub[t * inner..(t + 1) * inner],
            );
            for (((h, &p), &av), &uv) in cur.iter_mut().zip(prev.iter()).zip(at).zip(ut) {
                *h = av * p + uv;
            }
        }
    });
    y
}

fn scan_vjp(x: &[&Tensor], y: &Tensor, gy: &Tensor) -> Vec<Option<Tensor>> {
    let (_, l, inner) = scan_dims(x[0]);
    let (a, yd, g) = (x[0].data(), y.data(), gy.data());
    let per = l * inner;
    // gu_t = gy_t + a_{t+1} gu_{t+1} (gu_{L-1} = gy_{L-1})
    let mut gu = super::par::zeroed(a.len());
    per_batch(&mut gu, per, |bb, gb| {
        let (ab, gyb) = (&a[bb * per..(bb + 1) * per], &g[bb * per..(bb + 1) * per]);
        let last = (l - 1) * inner; // l >= 1 since per > 0
        gb[last..].copy_from_slice(&gyb[last..]);
        for t in (0..l - 1).rev() {
            let (cur, next) = gb[t * inner..(t + 2) * inner].split_at_mut(inner);
            let (an, gt) = (
                &ab[(t + 1) * inner..(t + 2) * inner],
                &gyb[t * inner..(t + 1) * inner],
            );
            for (((c, &nx), &av), &gv) in cur.iter_mut().zip(next.iter()).zip(an).zip(gt) {
                *c = gv + nx * av;
            }
        }
    });
    // ga_t = gu_t * h_{t-1} (0 at t = 0)
    let mut ga = super::par::zeroed(a.len());
    per_batch(&mut ga, per, |bb, gb| {
        let (gub, yb) = (&gu[bb * per..(bb + 1) * per], &yd[bb * per..(bb + 1) * per]);
        for t in 1..l {
            let r = t * inner..(t + 1) * inner;
            for ((o, &s), &h) in gb[r.clone()]
                .iter_mut()
                .zip(&gub[r])
                .zip(&yb[(t - 1) * inner..t * inner])
            {
                *o = s * h;
            }
        }
    });
    let shape = x[0].shape().to_vec();
    vec![
        Some(Tensor::from_parts(ga, shape.clone())),
        Some(Tensor::from_parts(gu, shape)),
    ]
}

// ---------------------------------------------------------------------------------------
// scaled_dot_product_attention

/// Per-batch-matrix geometry and masking of an attention call (shared with the flash kernel,
/// `flash.rs`).
pub(super) struct Attention<'a> {
    pub(super) batch: usize,
    pub(super) l: usize,
    pub(super) s: usize,
    pub(super) d: usize,
    pub(super) dv: usize,
    pub(super) scale: f32,
    pub(super) causal: bool,
    pub(super) mask: AttentionMask,
    /// The fourth input (boolean mask or additive bias), if any, read in place.
    extra: Option<Operand<'a>>,
    /// Whether `extra` has one [L, S] matrix per batch matrix (else one shared).
    pub(super) per_batch: bool,
}

impl<'a> Attention<'a> {
    pub(super) fn new(op: &Op, x: &[&'a Tensor]) -> Self {
        let Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } = op
        else {
            unreachable!("attention called for {}", op.name())
        };
        let (qs, ks, vs) = (x[0].shape(), x[1].shape(), x[2].shape());
        let r = qs.len();
        let d = qs[r - 1];
        Attention {
            batch: qs[..r - 2].iter().product(),
            l: qs[r - 2],
            s: ks[r - 2],
            d,
            dv: vs[r - 1],
            scale: scale.unwrap_or(crate::spec::default_attention_scale(d) as f32),
            causal: *causal,
            mask: *mask,
            extra: x.get(3).map(|m| Operand::rows_only(m)),
            per_batch: x.get(3).is_some_and(|m| m.rank() > 2),
        }
    }

    /// Row `i` (S wide) of the mask or bias that batch matrix `bi` reads, if there is one.
    pub(super) fn extra_row(&self, bi: usize, i: usize) -> Option<&[f32]> {
        let m = self.extra.as_ref()?;
        Some(m.row(if self.per_batch { bi } else { 0 }, i))
    }

    /// The keys that some row of `rows` (of batch matrix `bi`) may attend, as one range: every
    /// key outside it is blocked for each of these rows, by the boolean mask (zero; NaN is
    /// nonzero, so it may attend) or the causal cut, so its weight is exactly 0 in all of
    /// them. Empty when every row is fully blocked. Without a boolean mask: every key up to
    /// the causal cut. The flash kernel visits only these keys when every value is finite (a
    /// zero weight times a finite value adds nothing): a padding mask's padded keys, a causal
    /// pattern given as a mask, a block-sparse mask's empty blocks.
    pub(super) fn key_span(
        &self,
        bi: usize,
        rows: &std::ops::Range<usize>,
    ) -> std::ops::Range<usize> {
        let cut = |i: usize| self.causal_cut(i);
        // the last row's cut: every row's is at most it
        let end = if self.causal {
            rows.end.min(self.s)
        } else {
            self.s
        };
        if self.mask != AttentionMask::Boolean || self.extra.is_none() {
            return 0..end;
        }
        // the first allowed key over the rows, and one past the last
        let (mut lo, mut hi) = (self.s, 0);
        for i in rows.clone() {
            let Some(m) = self.extra_row(bi, i) else {
                return 0..end;
            };
            let allowed = &m[..cut(i)];
            if let Some(first) = first_nonzero(&allowed[..lo.min(allowed.len())]) {
                lo = first;
            }
            if hi < allowed.len() {
                if let Some(last) = last_nonzero(&allowed[hi..]) {
                    hi += last + 1;
                }
            }
        }
        if lo < hi {
            lo..hi
        } else {
            0..0
        }
    }

    /// How many keys row `i` may see before the mask: up to the causal cut, or all of them.
    pub(super) fn causal_cut(&self, i: usize) -> usize {
        if self.causal {
            (i + 1).min(self.s)
        } else {
            self.s
        }
    }

    /// Whether query row `i` of batch matrix `bi` has every key blocked (by the boolean mask
    /// and the causal cut): its output is zeros and it passes no gradient.
    pub(super) fn fully_blocked(&self, bi: usize, i: usize) -> bool {
        let allowed = self.causal_cut(i);
        match (self.mask, self.extra_row(bi, i)) {
            (AttentionMask::Boolean, Some(m)) => m[..allowed].iter().all(|&k| k == 0.0),
            _ => allowed == 0,
        }
    }

    /// The attention probabilities `P [L, S]` of batch matrix `bi`, and which rows are fully
    /// blocked (by the boolean mask and the causal cut; such a row of `P` is all zeros). A row
    /// whose allowed scores are all -inf (an additive bias) is not blocked: it is NaN, as in
    /// the spec.
    fn probs(&self, bi: usize, q: &[f32], k: &[f32]) -> (Vec<f32>, Vec<bool>) {
        let (l, s, d) = (self.l, self.s, self.d);
        let qb = &q[bi * l * d..(bi + 1) * l * d];
        let kb = &k[bi * s * d..(bi + 1) * s * d];
        let mut p = super::par::zeroed(l * s);
        let mut blocked = vec![s == 0; l];
        gemm(
            l,
            s,
            d,
            Mat::rows(qb, d),
            Mat::transposed(kb, d),
            &mut p,
            false,
            false,
        );
        if s == 0 {
            return (p, blocked);
        }
        for (i, row) in p.chunks_mut(s).enumerate() {
            let extra = self.extra_row(bi, i);
            // branch-free passes (they vectorize): scale fused with the bias or boolean mask,
            // then the causal cut, the max, exp fused with the sum, and the normalization
            let scale = self.scale;
            scale_and_mask(row, scale, self.mask, extra);
            if self.causal && i + 1 < s {
                row[i + 1..].fill(f32::NEG_INFINITY);
            }
            let allowed = self.causal_cut(i);
            let all_blocked = match (self.mask, extra) {
                (AttentionMask::Boolean, Some(m)) => m[..allowed].iter().all(|&k| k == 0.0),
                _ => allowed == 0,
            };
            if all_blocked {
                row.fill(0.0); // every entry blocked: a zero row, no gradient
                blocked[i] = true;
                continue;
            }
            // NaN when a score is NaN (the whole row is then NaN, as the spec)
            let mx = super::vmath::max(row);
            // vmath::exp underflows to exactly 0 for blocked (-inf) scores: no branch needed
            let z = super::vmath::exp_shifted_sum(row, mx);
            let inv = 1.0 / z;
            for v in row.iter_mut() {
                *v *= inv;
            }
        }
        (p, blocked)
    }
}

/// Lanes per step of the mask scans (a whole step is tested at once, so it vectorizes).
const SCAN: usize = 16;

/// Whether an element of `m` is nonzero (NaN is).
fn any_nonzero(m: &[f32]) -> bool {
    m.iter().fold(false, |any, &k| any | (k != 0.0))
}

/// The index of the first nonzero (NaN included) element of `m`.
fn first_nonzero(m: &[f32]) -> Option<usize> {
    let step = m.chunks(SCAN).position(any_nonzero)?;
    let at = step * SCAN;
    m[at..].iter().position(|&k| k != 0.0).map(|p| at + p)
}

/// The index of the last nonzero (NaN included) element of `m`.
fn last_nonzero(m: &[f32]) -> Option<usize> {
    let step = m.chunks(SCAN).rposition(any_nonzero)?;
    let at = step * SCAN;
    m[at..].iter().rposition(|&k| k != 0.0).map(|p| at + p)
}

/// Scales a row of raw scores and applies its mask row: the additive bias added, a boolean
/// mask's blocked entries set to -inf.
#[inline]
pub(super) fn scale_and_mask(
    row: &mut [f32],
    scale: f32,
    mask: AttentionMask,
    extra: Option<&[f32]>,
) {
    match (mask, extra) {
        (AttentionMask::AdditiveBias, Some(m)) => {
            row.iter_mut().zip(m).for_each(|(v, b)| *v = *v * scale + b)
        }
        (AttentionMask::Boolean, Some(m)) => row.iter_mut().zip(m).for_each(|(v, &keep)| {
            *v = if keep != 0.0 {
                *v * scale
            } else {
                f32::NEG_INFINITY
            }
        }),
        _ => row.iter_mut().for_each(|v| *v *= scale),
    }
}

/// [`scale_and_mask`], returning the row's maximum afterwards: from the same pass without a
/// mask row (`vmath::map_max`), from a second pass over the row with one (a map that reads
/// the mask row by index does not vectorize: the fused pass was 15% slower on the masked
/// attention benchmark). The same values either way.
#[inline(always)]
pub(super) fn scale_and_mask_max(
    row: &mut [f32],
    scale: f32,
    mask: AttentionMask,
    extra: Option<&[f32]>,
) -> f32 {
    match (mask, extra) {
        (AttentionMask::AdditiveBias | AttentionMask::Boolean, Some(_)) => {
            scale_and_mask(row, scale, mask, extra);
            super::vmath::max(row)
        }
        _ => super::vmath::map_max(row, |v, _| v * scale),
    }
}

/// Zeros the rows (of width `w`) of `m` that belong to fully blocked query rows: a product
/// with a zero row of `P` is 0 · NaN = NaN when the other factor holds NaN, but a fully
/// blocked row outputs zeros and passes no gradient whatever the inputs hold (DESIGN §4).
pub(super) fn zero_blocked_rows(m: &mut [f32], w: usize, blocked: &[bool]) {
    if w == 0 {
        return;
    }
    for (row, _) in m.chunks_mut(w).zip(blocked).filter(|(_, &b)| b) {
        row.fill(0.0);
    }
}

/// `m` (rows of width `w`) with the fully blocked rows zeroed: borrowed when none is.
pub(super) fn without_blocked_rows<'m>(
    m: &'m [f32],
    w: usize,
    blocked: &[bool],
) -> std::borrow::Cow<'m, [f32]> {
    if blocked.iter().any(|&b| b) {
        let mut c = m.to_vec();
        zero_blocked_rows(&mut c, w, blocked);
        std::borrow::Cow::Owned(c)
    } else {
        std::borrow::Cow::Borrowed(m)
    }
}

fn attention_forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let (q, k, v) = (x[0].data(), x[1].data(), x[2].data());
    let at = Attention::new(op, x);
    let (l, s, dv) = (at.l, at.s, at.dv);
    let mut out = super::par::zeroed(out_shape.iter().product());
    let per = l * dv;
    if per == 0 {
        return out;
    }
    let one = |bi: usize, ob: &mut [f32], threads: bool| {
        let (p, blocked) = at.probs(bi, &q, &k);
        let vb = &v[bi * s * dv..(bi + 1) * s * dv];
        gemm(
            l,
            dv,
            s,
            Mat::rows(&p, s),
            Mat::rows(vb, dv),
            ob,
            false,
            threads,
        );
        zero_blocked_rows(ob, dv, &blocked);
    };
    if at.batch > 1 {
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(bi, ob)| one(bi, ob, false));
    } else {
        out.chunks_mut(per)
            .enumerate()
            .for_each(|(bi, ob)| one(bi, ob, true));
    }
    out
}

/// Gradients of one batch matrix: (gq [L, D], gk [S, D], gv [S, Dv], gs [L, S]).
pub(super) type BatchGrads = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn attention_vjp(op: &Op, x: &[&Tensor], gy: &Tensor) -> Vec<Option<Tensor>> {
    let (q, k, v, go) = (x[0].data(), x[1].data(), x[2].data(), gy.data());
    let at = Attention::new(op, x);
    let (l, s, d, dv) = (at.l, at.s, at.d, at.dv);
    let one = |bi: usize, threads: bool| -> BatchGrads {
        let (p, blocked) = at.probs(bi, &q, &k);
        // a fully blocked row takes no part in any product (not even as 0 · NaN)
        let gob = without_blocked_rows(&go[bi * l * dv..(bi + 1) * l * dv], dv, &blocked);
        let gob = &gob[..];
        let vb = &v[bi * s * dv..(bi + 1) * s * dv];
        let qb = without_blocked_rows(&q[bi * l * d..(bi + 1) * l * d], d, &blocked);
        let qb = &qb[..];
        let kb = &k[bi * s * d..(bi + 1) * s * d];
        // gV [S, Dv] = P^T gO
        let mut gv = super::par::zeroed(s * dv);
        gemm(
            s,
            dv,
            l,
            Mat::transposed(&p, s),
            Mat::rows(gob, dv),
            &mut gv,
            false,
            threads,
        );
        // gP [L, S] = gO V^T; gS = P * (gP - rowsum(gP * P))
        let mut gs = super::par::zeroed(l * s);
        gemm(
            l,
            s,
            dv,
            Mat::rows(gob, dv),
            Mat::transposed(vb, dv),
            &mut gs,
            false,
            threads,
        );
        if s > 0 {
            for (gr, pr) in gs.chunks_mut(s).zip(p.chunks(s)) {
                let dot = super::vmath::sum_zip(gr, pr, |a, b| a * b);
                for (g, &pv) in gr.iter_mut().zip(pr) {
                    *g = pv * (*g - dot);
                }
            }
            zero_blocked_rows(&mut gs, s, &blocked);
        }
        // gQ = scale gS K; gK = scale gS^T Q
        let mut gq = super::par::zeroed(l * d);
        gemm(
            l,
            d,
            s,
            Mat::rows(&gs, s),
            Mat::rows(kb, d),
            &mut gq,
            false,
            threads,
        );
        let mut gk = super::par::zeroed(s * d);
        gemm(
            s,
            d,
            l,
            Mat::transposed(&gs, s),
            Mat::rows(qb, d),
            &mut gk,
            false,
            threads,
        );
        zero_blocked_rows(&mut gq, d, &blocked);
        for g in gq.iter_mut().chain(gk.iter_mut()) {
            *g *= at.scale;
        }
        (gq, gk, gv, gs)
    };
    per_batch_grads(x, &at, one, false)
}

/// The gradients of a call from `one(batch matrix, threads)`: batch matrices in parallel
/// (one thread each), or a single one with threaded products; then [`assemble`]d.
///
/// With `like_inputs`, the gradients of q, k and v are each stored like their input (head-
/// interleaved when it is, see `super::heads`); otherwise row-major.
pub(super) fn per_batch_grads(
    x: &[&Tensor],
    at: &Attention,
    one: impl Fn(usize, bool) -> BatchGrads + Sync,
    like_inputs: bool,
) -> Vec<Option<Tensor>> {
    let parts: Vec<BatchGrads> = if at.batch > 1 {
        (0..at.batch)
            .into_par_iter()
            .map(|bi| one(bi, false))
            .collect()
    } else {
        (0..at.batch).map(|bi| one(bi, true)).collect()
    };
    assemble(x, at, &parts, like_inputs)
}

/// `parts` one after the other in a buffer of `n` elements drawn like a kernel output (from
/// the storage cache when one of that size is free: a fresh allocation of a gradient this
/// size is page faults and kernel zeroing, call after call).
fn concat<'a>(n: usize, parts: impl Iterator<Item = &'a [f32]>) -> Vec<f32> {
    let parts: Vec<&[f32]> = parts.collect();
    let len = parts.first().map_or(0, |p| p.len());
    if len > 0 && parts.iter().all(|p| p.len() == len) && parts.len() * len == n {
        // parts of one length filling the buffer (every batch matrix's gradient): copied by
        // several threads
        let mut out = super::par::overwritten(n);
        out.par_chunks_mut(len)
            .zip(parts.par_iter())
            .for_each(|(o, p)| o.copy_from_slice(p));
        return out;
    }
    let mut out = super::par::overwritten(n);
    let mut at = 0;
    for p in parts {
        if out.len() < at + p.len() {
            out.resize(at + p.len(), 0.0);
        }
        out[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    out.truncate(at);
    out
}

/// The gradients of an attention call from each batch matrix's (gq, gk, gv, gs): q, k and v
/// concatenated, the additive bias's summed over the batch matrices that share it (a boolean
/// mask gets none).
pub(super) fn assemble(
    x: &[&Tensor],
    at: &Attention,
    parts: &[BatchGrads],
    like_inputs: bool,
) -> Vec<Option<Tensor>> {
    let (l, s) = (at.l, at.s);
    let extra_len = x.get(3).map_or(0, |m| m.numel());
    let grad = |input: &Tensor, part: fn(&BatchGrads) -> &[f32]| {
        let shape = input.shape().to_vec();
        let rows = parts.iter().map(part);
        if like_inputs && super::heads::interleaved(input) {
            let data = super::heads::placed(&shape, rows);
            Some(super::heads::tensor(data, shape, true))
        } else {
            Some(Tensor::from_parts(concat(input.numel(), rows), shape))
        }
    };
    let mut grads = vec![
        grad(x[0], |p| &p.0),
        grad(x[1], |p| &p.1),
        grad(x[2], |p| &p.2),
    ];
    match at.mask {
        AttentionMask::None => {}
        AttentionMask::Boolean => grads.push(None),
        AttentionMask::AdditiveBias => {
            let mut gb = super::par::zeroed(extra_len);
            if at.per_batch {
                for (o, (_, _, _, gs)) in gb.chunks_mut((l * s).max(1)).zip(parts) {
                    o.copy_from_slice(gs);
                }
            } else {
                for (_, _, _, gs) in parts {
                    for (o, g) in gb.iter_mut().zip(gs) {
                        *o += g;
                    }
                }
            }
            let shape = x.get(3).map_or_else(|| vec![l, s], |m| m.shape().to_vec());
            grads.push(Some(Tensor::from_parts(gb, shape)));
        }
    }
    grads
}
