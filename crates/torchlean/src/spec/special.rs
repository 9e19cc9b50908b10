//! Special ops: the FNO spectral layer, the diagonal selective scan, and scaled dot-product
//! attention with TorchLean's boolean-mask semantics.
//!
//! - `spectral_conv1d{modes}(x [B,Ci,N], wr [Ci,Co,M], wi [Ci,Co,M])`, M = modes <= N/2+1:
//!   X = rfft(x) over the last axis; Y_k = Σ_i X_k[i] W_k[i,o] (complex) for k < M, 0 above;
//!   y = irfft(Y, n = N) normalized by 1/N. Written here as an explicit real-linear map (a
//!   direct DFT), so the spec is plain sums of cosines and sines.
//! - `selective_scan(a [B,L,...], u [B,L,...])`: h_t = a_t * h_{t-1} + u_t along axis 1, h_{-1} = 0.
//! - `scaled_dot_product_attention(q [...,L,D], k [...,S,D], v [...,S,Dv] [, mask])`:
//!   softmax(scale q k^T (+ bias)) v; scale defaults to 1/sqrt(D); `causal` blocks j > i;
//!   a boolean mask (nonzero = may attend, shape [L,S] or [...,L,S]) gives a blocked entry
//!   exactly zero weight; a row with every entry blocked outputs zeros (and passes no gradient),
//!   whatever `v` holds. NaN: a NaN score makes its row NaN; an allowed row whose scores are
//!   all -inf (an additive bias) is NaN (0/0, PyTorch's softmax); a NaN in `v` reaches every
//!   row that is not fully blocked (weight 0 times NaN, as PyTorch's `P @ V`).

use super::{expect_arity, numel, payload_err, reduce_to, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::{AttentionMask, Op};
use crate::scalar::{max_of, Scalar};

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    match op {
        Op::SpectralConv1d { modes } => {
            expect_arity(op, shapes, &[3])?;
            let (x, wr, wi) = (shapes[0], shapes[1], shapes[2]);
            if x.len() != 3 || wr.len() != 3 || wr != wi || wr[0] != x[1] || wr[2] != *modes {
                return Err(shape_err(
                    op,
                    shapes,
                    format!("x [B, Ci, N] and real/imaginary weights [Ci, Co, {modes}]"),
                ));
            }
            if *modes == 0 || *modes > x[2] / 2 + 1 {
                return Err(payload_err(
                    op,
                    format!(
                        "modes must be in 1..={} for length {}, got {modes}",
                        x[2] / 2 + 1,
                        x[2]
                    ),
                ));
            }
            Ok(vec![x[0], wr[1], x[2]])
        }
        Op::SelectiveScan => {
            expect_arity(op, shapes, &[2])?;
            if shapes[0].len() < 2 || shapes[0] != shapes[1] {
                return Err(shape_err(
                    op,
                    shapes,
                    "decay a and input u of the same shape [B, L, ...]",
                ));
            }
            Ok(shapes[0].to_vec())
        }
        Op::ScaledDotProductAttention { scale, mask, .. } => {
            let n = if *mask == AttentionMask::None { 3 } else { 4 };
            expect_arity(op, shapes, &[n])?;
            if let Some(s) = scale {
                if !s.is_finite() {
                    return Err(payload_err(op, format!("scale must be finite, got {s}")));
                }
            }
            let (q, k, v) = (shapes[0], shapes[1], shapes[2]);
            let r = q.len();
            let ok = r >= 2
                && k.len() == r
                && v.len() == r
                && q[..r - 2] == k[..r - 2]
                && q[..r - 2] == v[..r - 2]
                && q[r - 1] == k[r - 1]
                && k[r - 2] == v[r - 2];
            if !ok {
                return Err(shape_err(
                    op,
                    shapes,
                    "q [..., L, D], k [..., S, D], v [..., S, Dv] with equal leading dims",
                ));
            }
            if n == 4 {
                let m = shapes[3];
                let (l, s) = (q[r - 2], k[r - 2]);
                let mut full = q[..r - 2].to_vec();
                full.extend([l, s]);
                if m != [l, s] && m != full.as_slice() {
                    return Err(shape_err(
                        op,
                        shapes,
                        format!("a mask of shape [{l}, {s}] or {full:?} (the Tensor API broadcasts any other broadcastable mask there first; in a graph, a broadcast_to node does)"),
                    ));
                }
            }
            let mut out = q.to_vec();
            out[r - 1] = v[r - 1];
            Ok(out)
        }
        _ => unreachable!("special::shape called for {}", op.name()),
    }
}

/// Weight c_k of frequency k in the real inverse DFT of length n.
pub(super) fn irfft_weight(k: usize, n: usize) -> f64 {
    if k == 0 || (n % 2 == 0 && k == n / 2) {
        1.0
    } else {
        2.0
    }
}

/// (cos θ, sin θ) of θ = 2πkt/n, the angle reduced exactly (kt mod n) and evaluated in f64,
/// exact at the multiples of π/2: the sine is exactly 0 at the DC and Nyquist frequencies, so
/// the imaginary parts there take no part in the real inverse and get a gradient of exactly 0,
/// as in `torch.fft.irfft` (an f32 angle gave sin(π) = −8.7e-8 in the spec at f32, and a
/// Nyquist weight of 1e6 leaked 8.8e-3 relative into `strict_cpu`'s output: an audit of the
/// forty-fourth session). Shared by the spec and the native kernels' twiddle table.
pub(crate) fn twiddle(k: usize, t: usize, n: usize) -> (f64, f64) {
    let r = (k * t) % n;
    match (4 * r).checked_rem(n) {
        Some(0) => match 4 * r / n {
            0 => (1.0, 0.0),
            1 => (0.0, 1.0),
            2 => (-1.0, 0.0),
            _ => (0.0, -1.0),
        },
        _ => {
            let th = 2.0 * std::f64::consts::PI * r as f64 / n as f64;
            (th.cos(), th.sin())
        }
    }
}

/// [`twiddle`] in `T`.
fn angle<T: Scalar>(k: usize, t: usize, n: usize) -> (T, T) {
    let (c, s) = twiddle(k, t, n);
    (T::c(c), T::c(s))
}

/// Forward DFT of x [B, Ci, N] on the first `m` frequencies: (Xr, Xi), each [B, Ci, m].
fn rdft<T: Scalar>(x: &Array<T>, m: usize) -> (Vec<T>, Vec<T>) {
    let (b, ci, n) = (x.shape[0], x.shape[1], x.shape[2]);
    let mut xr = vec![T::zero(); b * ci * m];
    let mut xi = vec![T::zero(); b * ci * m];
    for row in 0..b * ci {
        for k in 0..m {
            for t in 0..n {
                let (cos, sin) = angle::<T>(k, t, n);
                xr[row * m + k] += x.data[row * n + t] * cos;
                xi[row * m + k] -= x.data[row * n + t] * sin;
            }
        }
    }
    (xr, xi)
}

/// `Σ a_i·b_i` over four interleaved partial sums (the order of a sum is not part of the
/// spec; four independent sums keep the loop from waiting on each addition).
fn dot<T: Scalar>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::zero(); 4];
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: T = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(&x, &y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// The scores of one attention call (shared by this module's SDPA and by `spec::flash`):
/// q [..., L, d] against k [..., S, d], scaled, with the mask and the causal rule.
pub(super) struct Scores<'a, T> {
    xs: &'a [&'a Array<T>],
    l: usize,
    s: usize,
    d: usize,
    scale: T,
    causal: bool,
    mask: AttentionMask,
}

impl<'a, T: Scalar> Scores<'a, T> {
    /// The scores of an SDPA call (its payload) whose shapes the shape rule accepted.
    pub(super) fn new(
        xs: &'a [&'a Array<T>],
        scale: Option<f32>,
        causal: bool,
        mask: AttentionMask,
    ) -> Scores<'a, T> {
        let r = xs[0].shape.len();
        let (l, d, s) = (xs[0].shape[r - 2], xs[0].shape[r - 1], xs[1].shape[r - 2]);
        Scores {
            xs,
            l,
            s,
            d,
            scale: T::c(scale.map_or(super::default_attention_scale(d), |v| v as f64)),
            causal,
            mask,
        }
    }

    /// The factor the scores carry (the call's scale, or 1/√d).
    pub(super) fn scale(&self) -> T {
        self.scale
    }

    /// The score of query `i` against key `j` in batch `b`, or `None` when the entry is
    /// blocked (causal, or a boolean mask's 0).
    pub(super) fn at(&self, b: usize, i: usize, j: usize) -> Option<T> {
        let (l, s, d) = (self.l, self.s, self.d);
        let mask_at = || {
            let m = self.xs[3];
            m.data[if m.shape.len() > 2 {
                (b * l + i) * s + j
            } else {
                i * s + j
            }]
        };
        if (self.causal && j > i) || (self.mask == AttentionMask::Boolean && mask_at() == T::zero())
        {
            return None;
        }
        let q = &self.xs[0].data[(b * l + i) * d..(b * l + i + 1) * d];
        let k = &self.xs[1].data[(b * s + j) * d..(b * s + j + 1) * d];
        let mut v = self.scale * dot(q, k);
        if self.mask == AttentionMask::AdditiveBias {
            v += mask_at();
        }
        Some(v)
    }
}

/// Attention probabilities of one query row, or `None` when every key is blocked.
pub(super) fn attention_row<T: Scalar>(scores: &Scores<T>, bi: usize, i: usize) -> Option<Vec<T>> {
    let mut row = vec![T::neg_infinity(); scores.s];
    let mut any = false;
    for (j, score) in row.iter_mut().enumerate() {
        if let Some(v) = scores.at(bi, i, j) {
            *score = v;
            any = true;
        }
    }
    if !any {
        return None;
    }
    let scores = row;
    let mx = max_of(scores.iter().copied());
    let e: Vec<T> = scores
        .iter()
        .map(|&v| {
            if v == T::neg_infinity() {
                T::zero()
            } else {
                (v - mx).exp()
            }
        })
        .collect();
    let z: T = super::sum::sum(e.iter().copied());
    Some(e.into_iter().map(|v| v / z).collect())
}

pub(super) fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>], out_shape: Vec<usize>) -> Array<T> {
    let mut y = Array::zeros(&out_shape);
    match op {
        Op::SpectralConv1d { modes } => {
            let m = *modes;
            let (b, ci, n, co) = (
                xs[0].shape[0],
                xs[0].shape[1],
                xs[0].shape[2],
                xs[1].shape[1],
            );
            let (xr, xi) = rdft(xs[0], m);
            for bb in 0..b {
                for o in 0..co {
                    for k in 0..m {
                        let (mut yr, mut yi) = (T::zero(), T::zero());
                        for i in 0..ci {
                            let (ar, ai) = (xr[(bb * ci + i) * m + k], xi[(bb * ci + i) * m + k]);
                            let (wr, wi) = (
                                xs[1].data[(i * co + o) * m + k],
                                xs[2].data[(i * co + o) * m + k],
                            );
                            yr += ar * wr - ai * wi;
                            yi += ar * wi + ai * wr;
                        }
                        let c = T::c(irfft_weight(k, n) / n as f64);
                        for t in 0..n {
                            let (cos, sin) = angle::<T>(k, t, n);
                            y.data[(bb * co + o) * n + t] += c * (yr * cos - yi * sin);
                        }
                    }
                }
            }
        }
        Op::SelectiveScan => {
            let l = xs[0].shape[1];
            let inner = numel(&xs[0].shape[2..]);
            for bb in 0..xs[0].shape[0] {
                for e in 0..inner {
                    let mut h = T::zero();
                    for t in 0..l {
                        let f = (bb * l + t) * inner + e;
                        h = xs[0].data[f] * h + xs[1].data[f];
                        y.data[f] = h;
                    }
                }
            }
        }
        Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } => {
            let scores = Scores::new(xs, *scale, *causal, *mask);
            let r = xs[0].shape.len();
            let (l, s, dv) = (xs[0].shape[r - 2], xs[1].shape[r - 2], xs[2].shape[r - 1]);
            for bi in 0..numel(&xs[0].shape[..r - 2]) {
                for i in 0..l {
                    if let Some(p) = attention_row(&scores, bi, i) {
                        let out = &mut y.data[(bi * l + i) * dv..(bi * l + i + 1) * dv];
                        for (j, &pj) in p.iter().enumerate() {
                            let vj = &xs[2].data[(bi * s + j) * dv..(bi * s + j + 1) * dv];
                            for (o, &v) in out.iter_mut().zip(vj) {
                                *o += pj * v;
                            }
                        }
                    }
                }
            }
        }
        _ => unreachable!("special::forward called for {}", op.name()),
    }
    y
}

pub(super) fn vjp<T: Scalar>(
    op: &Op,
    xs: &[&Array<T>],
    y: &Array<T>,
    gy: &Array<T>,
) -> InputGrads<T> {
    match op {
        Op::SpectralConv1d { modes } => {
            let m = *modes;
            let (b, ci, n, co) = (
                xs[0].shape[0],
                xs[0].shape[1],
                xs[0].shape[2],
                xs[1].shape[1],
            );
            let (xr, xi) = rdft(xs[0], m);
            // cotangents of Y (per batch, out channel, frequency)
            let mut gyr = vec![T::zero(); b * co * m];
            let mut gyi = vec![T::zero(); b * co * m];
            for row in 0..b * co {
                for k in 0..m {
                    let c = T::c(irfft_weight(k, n) / n as f64);
                    for t in 0..n {
                        let (cos, sin) = angle::<T>(k, t, n);
                        gyr[row * m + k] += c * gy.data[row * n + t] * cos;
                        gyi[row * m + k] -= c * gy.data[row * n + t] * sin;
                    }
                }
            }
            let mut gx = Array::zeros(&xs[0].shape);
            let mut gwr = Array::zeros(&xs[1].shape);
            let mut gwi = Array::zeros(&xs[2].shape);
            for bb in 0..b {
                for i in 0..ci {
                    for k in 0..m {
                        let (mut gxr, mut gxi) = (T::zero(), T::zero());
                        let (ar, ai) = (xr[(bb * ci + i) * m + k], xi[(bb * ci + i) * m + k]);
                        for o in 0..co {
                            let w = (i * co + o) * m + k;
                            let (wr, wi) = (xs[1].data[w], xs[2].data[w]);
                            let (gr, gi) = (gyr[(bb * co + o) * m + k], gyi[(bb * co + o) * m + k]);
                            gxr += gr * wr + gi * wi;
                            gxi += gi * wr - gr * wi;
                            gwr.data[w] += gr * ar + gi * ai;
                            gwi.data[w] += gi * ar - gr * ai;
                        }
                        for t in 0..n {
                            let (cos, sin) = angle::<T>(k, t, n);
                            gx.data[(bb * ci + i) * n + t] += gxr * cos - gxi * sin;
                        }
                    }
                }
            }
            vec![Some(gx), Some(gwr), Some(gwi)]
        }
        Op::SelectiveScan => {
            let l = xs[0].shape[1];
            let inner = numel(&xs[0].shape[2..]);
            let mut ga = Array::zeros(&xs[0].shape);
            let mut gu = Array::zeros(&xs[0].shape);
            for bb in 0..xs[0].shape[0] {
                for e in 0..inner {
                    let mut carry = T::zero(); // cotangent flowing into h_t from h_{t+1}
                    for t in (0..l).rev() {
                        let f = (bb * l + t) * inner + e;
                        let s = gy.data[f] + carry;
                        gu.data[f] = s;
                        ga.data[f] = if t > 0 {
                            s * y.data[f - inner]
                        } else {
                            T::zero()
                        };
                        carry = s * xs[0].data[f];
                    }
                }
            }
            vec![Some(ga), Some(gu)]
        }
        Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } => {
            let scores = Scores::new(xs, *scale, *causal, *mask);
            let r = xs[0].shape.len();
            let (l, d, s, dv) = (
                xs[0].shape[r - 2],
                xs[0].shape[r - 1],
                xs[1].shape[r - 2],
                xs[2].shape[r - 1],
            );
            let sc = scores.scale();
            let batch = numel(&xs[0].shape[..r - 2]);
            let mut gq = Array::zeros(&xs[0].shape);
            let mut gk = Array::zeros(&xs[1].shape);
            let mut gv = Array::zeros(&xs[2].shape);
            let mut gbias_full = Array::zeros(&[batch, l, s]);
            for bi in 0..batch {
                for i in 0..l {
                    let Some(p) = attention_row(&scores, bi, i) else {
                        continue;
                    };
                    let go = &gy.data[(bi * l + i) * dv..(bi * l + i + 1) * dv];
                    let gp: Vec<T> = (0..s)
                        .map(|j| dot(go, &xs[2].data[(bi * s + j) * dv..(bi * s + j + 1) * dv]))
                        .collect();
                    let dot = dot(&p, &gp);
                    let qi = &xs[0].data[(bi * l + i) * d..(bi * l + i + 1) * d];
                    let gqi = &mut gq.data[(bi * l + i) * d..(bi * l + i + 1) * d];
                    for j in 0..s {
                        let gvj = &mut gv.data[(bi * s + j) * dv..(bi * s + j + 1) * dv];
                        for (g, &o) in gvj.iter_mut().zip(go) {
                            *g += p[j] * o;
                        }
                        let gs = p[j] * (gp[j] - dot);
                        gbias_full.data[(bi * l + i) * s + j] = gs;
                        let kj = &xs[1].data[(bi * s + j) * d..(bi * s + j + 1) * d];
                        let gkj = &mut gk.data[(bi * s + j) * d..(bi * s + j + 1) * d];
                        for ((gqc, &k), (gkc, &q)) in
                            gqi.iter_mut().zip(kj).zip(gkj.iter_mut().zip(qi))
                        {
                            *gqc += sc * gs * k;
                            *gkc += sc * gs * q;
                        }
                    }
                }
            }
            let mut grads = vec![Some(gq), Some(gk), Some(gv)];
            match mask {
                AttentionMask::None => {}
                AttentionMask::Boolean => grads.push(None),
                AttentionMask::AdditiveBias => {
                    let g = if xs[3].shape.len() == 2 {
                        reduce_to(&gbias_full, &[1, l, s]).reshaped(&xs[3].shape)
                    } else {
                        gbias_full.reshaped(&xs[3].shape)
                    };
                    grads.push(Some(g));
                }
            }
            grads
        }
        _ => unreachable!("special::vjp called for {}", op.name()),
    }
}
