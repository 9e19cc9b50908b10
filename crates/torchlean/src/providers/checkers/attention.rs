//! The recompute check of `scaled_dot_product_attention`, with the products at f64 through
//! the `gemm` crate instead of the spec's scalar loops (after the f32 recomputation of
//! `attention32.rs`, whose acceptance is final, did not accept).
//!
//! The spec (`spec::special`) evaluates attention one query row at a time with scalar dot
//! products: at f64 that costs more than the f32 kernel it checks (on the transformer step
//! it was a fifth of the whole check). This module computes the same quantities — scores,
//! the hard-masked softmax, the output, and for the VJP the four gradient products — with the
//! mask, causal rule and softmax written exactly as the spec writes them, and the five matrix
//! products (`q kᵀ`, `P v`, `Pᵀ gO`, `gO vᵀ`, `gS k`, `gSᵀ q`) done by the `gemm` crate at
//! f64, blocked over [`ROWS`] query rows (and the softmax's exponentials by the vectorizable
//! `exp64`, within 4e-15 relative of `f64::exp`) so that no `L × S` matrix of a whole call is held,
//! and in parallel over the batch × head slices.
//!
//! What differs from the spec is the order of the f64 sums inside a product (the spec's
//! order is not part of it either: the difference is at most γ_n·Σ|a||b| at f64, n the
//! product's inner length) and the exponential (4e-15 relative): together about 1e-13 of the
//! values compared, against a bound of 2e-4, so a verdict can differ from the spec's only for
//! a result within that much of the bound. The
//! comparison is the same [`Tally`] as the other fast paths: an acceptance here is the
//! whole-call check's acceptance; anything else answers `None` and the whole-call check (the
//! spec itself) decides and names the element. Calls with a non-finite input (found as each
//! slice is read) also answer `None`: the spec's NaN and infinity rules (a fully blocked row ignores a NaN in `v`, …) are
//! left to the spec.
//!
//! What the check trusts beyond the spec: the `gemm` crate's f64 products (its f64
//! micro-kernels; the f32 kernels being checked use its f32 ones).

use super::exp64;
use super::layout::last_address;
use super::pieces::Tally;
use super::recompute::dense_slice;
use crate::backend::{Call, Operand};
use crate::graph::{AttentionMask, Op};
use crate::providers::native_cpu::par::{gemm, Mat};
use crate::providers::native_cpu::vmath::all_finite;
use crate::scalar::{max_of, maximum};
use crate::spec::{contiguous_strides, infer_shape, numel};
use rayon::prelude::*;
use std::borrow::Cow;

/// Query rows per block (the scores of one block are `ROWS × S` values at f64).
const ROWS: usize = 64;

/// The spec's softmax of one row of scores in place: a blocked entry (-inf) gives
/// exp(-inf) = 0, as the spec's explicit zero. The maximum and the sum run in eight lanes (a
/// sequential fold is one dependent operation per element); the sum's order is not the
/// spec's: an f64 rounding difference (about 1e-16 relative), far below the check's
/// tolerance.
#[inline(always)]
fn softmax_in_place(row: &mut [f64]) {
    const LANES: usize = 8;
    let chunks = row.chunks_exact(LANES);
    let mut mx = [max_of(chunks.remainder().iter().copied()); LANES];
    for c in chunks {
        for l in 0..LANES {
            mx[l] = maximum(mx[l], c[l]);
        }
    }
    let mx = max_of(mx);
    row.iter_mut().for_each(|x| *x = exp64::exp(*x - mx));
    let chunks = row.chunks_exact(LANES);
    let mut z = [0.0f64; LANES];
    z[0] = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            z[l] += c[l];
        }
    }
    let z: f64 = z.iter().sum();
    row.iter_mut().for_each(|x| *x /= z);
}

/// An operand of shape `[..., rows, cols]` read one batch slice at a time, at f64, through its
/// strides (a head-split view needs no copy of the whole tensor first: each slice is read by
/// the thread that checks it, into a buffer that stays in cache).
pub(super) struct Slices<'a> {
    storage: &'a [f32],
    /// The storage index of element (0, 0) of each batch slice.
    starts: Vec<usize>,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Slices<'a> {
    /// The slices of `o`, when its rank is at least 2 and every address it names lies inside
    /// its storage.
    pub(super) fn of(o: &Operand<'a>) -> Option<Slices<'a>> {
        let r = o.shape.len();
        if r < 2 {
            return None;
        }
        let strides = o
            .strides
            .map_or_else(|| contiguous_strides(o.shape), |s| s.to_vec());
        if numel(o.shape) > 0 && last_address(o.shape, &strides, o.offset)? >= o.storage.len() {
            return None;
        }
        let batch = &o.shape[..r - 2];
        let starts = (0..numel(batch))
            .map(|b| {
                let (mut rest, mut at) = (b, o.offset);
                for ax in (0..r - 2).rev() {
                    at += rest % batch[ax] * strides[ax];
                    rest /= batch[ax];
                }
                at
            })
            .collect();
        Some(Slices {
            storage: o.storage,
            starts,
            rows: o.shape[r - 2],
            cols: o.shape[r - 1],
            row_stride: strides[r - 2],
            col_stride: strides[r - 1],
        })
    }

    /// Slice `b`, row-major at f64; `None` when one of its values is not finite.
    fn read(&self, b: usize) -> Option<Vec<f64>> {
        let out = self.read_as(b, |v| v as f64);
        // v·0 is 0 for a finite v and NaN otherwise: or-ed over lanes, without an early exit
        // (a short-circuiting scan does not vectorize)
        let finite = out.chunks(16).fold(true, |ok, c| {
            ok & c.iter().fold(true, |all, &v| all & (v * 0.0 == 0.0))
        });
        finite.then_some(out)
    }

    /// Slice `b`, row-major, each element converted by `f` (a result read where it lies: a
    /// head-interleaved output or gradient needs no copy of the whole tensor).
    fn read_as<T>(&self, b: usize, f: impl Fn(f32) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        if self.cols > 0 {
            for i in 0..self.rows {
                let row = self.starts[b] + i * self.row_stride;
                if self.col_stride == 1 {
                    out.extend(self.storage[row..row + self.cols].iter().map(|&v| f(v)));
                } else {
                    let at = |j: usize| f(self.storage[row + j * self.col_stride]);
                    out.extend((0..self.cols).map(at));
                }
            }
        }
        out
    }

    /// Slice `b` as f32, borrowed where it is stored row-major in one run, else read.
    pub(super) fn f32s(&self, b: usize) -> Cow<'a, [f32]> {
        let n = self.rows * self.cols;
        let run = self.col_stride == 1 && (self.rows <= 1 || self.row_stride == self.cols);
        match self.storage.get(self.starts[b]..self.starts[b] + n) {
            Some(d) if run => Cow::Borrowed(d),
            _ => Cow::Owned(self.read_as(b, |v| v)),
        }
    }

    /// Whether these are `batch` slices of `rows × cols`.
    fn is(&self, batch: usize, rows: usize, cols: usize) -> bool {
        (self.starts.len(), self.rows, self.cols) == (batch, rows, cols)
    }
}

/// One call's operands (q, k, v read slice by slice), with its geometry.
pub(super) struct Attention<'a> {
    pub(super) q: Slices<'a>,
    pub(super) k: Slices<'a>,
    pub(super) v: Slices<'a>,
    /// The mask, and whether it is one `[L, S]` matrix shared by every batch slice.
    mask: Option<(&'a [f32], bool)>,
    pub(super) kind: AttentionMask,
    pub(super) causal: bool,
    pub(super) scale: f64,
    pub(super) batch: usize,
    pub(super) l: usize,
    pub(super) s: usize,
    pub(super) d: usize,
    pub(super) dv: usize,
}

impl<'a> Attention<'a> {
    /// The call's operands when the fast path applies: the spec's shape rule accepts the
    /// call and gives the output's shape, the mask is dense, every input finite.
    pub(super) fn of(op: &Op, call: &Call<'a>) -> Option<Attention<'a>> {
        let Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } = op
        else {
            return None;
        };
        let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
        if infer_shape(op, &shapes).ok()?.as_slice() != call.output.shape {
            return None;
        }
        let (qs, ks, vs) = (shapes.first()?, shapes.get(1)?, shapes.get(2)?);
        let r = qs.len();
        if r < 2 || ks.len() != r || vs.len() != r || ks[..r - 2] != qs[..r - 2] {
            return None;
        }
        let (q, k, v) = (
            Slices::of(&call.inputs[0])?,
            Slices::of(&call.inputs[1])?,
            Slices::of(&call.inputs[2])?,
        );
        let (l, d, s, dv) = (qs[r - 2], qs[r - 1], ks[r - 2], vs[r - 1]);
        let kind = *mask;
        let mask = match kind {
            AttentionMask::None => None,
            _ => {
                let m = call.inputs.get(3)?;
                let shared = m.shape.len() == 2;
                if m.shape.len() != r && !shared {
                    return None;
                }
                Some((dense_slice(m).filter(|x| all_finite(x))?, shared))
            }
        };
        Some(Attention {
            q,
            k,
            v,
            mask,
            kind,
            causal: *causal,
            scale: scale.map_or(crate::spec::default_attention_scale(d), |v| v as f64),
            batch: numel(&qs[..r - 2]),
            l,
            s,
            d,
            dv,
        })
    }

    /// Row `i`'s mask entries (of batch slice `b`), when there is a mask.
    pub(super) fn mask_row(&self, b: usize, i: usize) -> Option<&'a [f32]> {
        self.mask.map(|(m, shared)| {
            let row = if shared { i } else { b * self.l + i };
            &m[row * self.s..(row + 1) * self.s]
        })
    }

    /// The attention probabilities of query rows `i0..i0 + rows` of slice `b`, from the raw
    /// products `qk` (rows × S): the spec's rule entry by entry (`spec::special`'s
    /// `Scores::at` and `attention_row`). Returns whether each row has a key it may attend
    /// to; a fully blocked row is left all zeros.
    fn probabilities(&self, b: usize, i0: usize, qk: &mut [f64]) -> Vec<bool> {
        crate::wide::wide!(self.probabilities_of(b, i0, qk))
    }

    /// [`Self::probabilities`]' body: a plain loop, so that all of it is compiled inside the
    /// AVX-512 function (an iterator adapter's closure may be compiled apart).
    #[inline(always)]
    fn probabilities_of(&self, b: usize, i0: usize, qk: &mut [f64]) -> Vec<bool> {
        let s = self.s;
        let mut attends = Vec::with_capacity(qk.len() / s.max(1));
        for (r, row) in qk.chunks_mut(s.max(1)).enumerate() {
            let i = i0 + r;
            let Some(m) = self.mask_row(b, i) else {
                // no mask: the scaled scores, the causal rule blocking j > i (a row always
                // keeps j = 0), then the softmax below
                for x in row.iter_mut() {
                    *x *= self.scale;
                }
                if self.causal && i + 1 < s {
                    row[i + 1..].fill(f64::NEG_INFINITY);
                }
                if s > 0 {
                    softmax_in_place(row);
                }
                attends.push(s > 0);
                continue;
            };
            let mut any = false;
            for (j, x) in row.iter_mut().enumerate() {
                let mj = m[j] as f64;
                let blocked =
                    (self.causal && j > i) || (self.kind == AttentionMask::Boolean && mj == 0.0);
                if blocked {
                    *x = f64::NEG_INFINITY;
                    continue;
                }
                any = true;
                *x *= self.scale;
                if self.kind == AttentionMask::AdditiveBias {
                    *x += mj;
                }
            }
            if any {
                softmax_in_place(row);
            } else {
                row.fill(0.0);
            }
            attends.push(any);
        }
        attends
    }

    /// q, k and v of slice `b` at f64; `None` when one holds a non-finite value.
    fn slice(&self, b: usize) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        Some((self.q.read(b)?, self.k.read(b)?, self.v.read(b)?))
    }

    /// The probabilities of rows `i0..i1` of a slice whose q and k are `q`, `k`.
    fn block(&self, b: usize, i0: usize, i1: usize, q: &[f64], k: &[f64]) -> Vec<f64> {
        let (s, d) = (self.s, self.d);
        let mut p = vec![0.0; (i1 - i0) * s];
        gemm(
            i1 - i0,
            s,
            d,
            Mat::rows(&q[i0 * d..], d),
            Mat::transposed(k, d),
            &mut p,
            false,
            false,
        );
        self.probabilities(b, i0, &mut p);
        p
    }
}

/// The forward check; `None`: not applicable, or not accepted (the whole-call check decides).
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    let a = Attention::of(op, call)?;
    let (l, s, dv) = (a.l, a.s, a.dv);
    let out = Slices::of(&call.output).filter(|o| o.is(a.batch, l, dv))?;
    // first in f32 with a proven bound (attention32.rs); what it does not accept, at f64
    if super::attention32::forward(&a, &out).is_some_and(|t| t.accepts()) {
        return Some(Ok(()));
    }
    let tallies: Option<Vec<Tally>> = (0..a.batch)
        .into_par_iter()
        .map(|b| {
            let (q, k, v) = a.slice(b)?;
            let (q, k, v) = (&q[..], &k[..], &v[..]);
            let mut t = Tally::default();
            let got = out.f32s(b);
            for i0 in (0..l).step_by(ROWS) {
                let i1 = (i0 + ROWS).min(l);
                let p = a.block(b, i0, i1, q, k);
                let mut o = vec![0.0; (i1 - i0) * dv];
                gemm(
                    i1 - i0,
                    dv,
                    s,
                    Mat::rows(&p, s),
                    Mat::rows(v, dv),
                    &mut o,
                    false,
                    false,
                );
                t.feed(&got[i0 * dv..i1 * dv], &o);
            }
            Some(t)
        })
        .collect();
    let mut total = Tally::default();
    tallies?.iter().for_each(|t| total.merge(t));
    total.accepts().then_some(Ok(()))
}

/// What one batch slice of the VJP check found.
struct SliceGrads {
    /// Tallies of the q, k and v gradients (and of a full-rank bias's gradient).
    tallies: [Tally; 4],
    /// This slice's gradient of a shared `[L, S]` bias (summed over slices by the caller).
    shared_bias: Option<Vec<f64>>,
}

/// The VJP check; `None`: not applicable, or not accepted (the whole-call check decides).
pub(super) fn vjp(op: &Op, call: &Call) -> Option<Result<(), String>> {
    let a = Attention::of(op, call)?;
    let go = Slices::of(call.cotangent.as_ref()?)?;
    if (go.starts.len(), go.rows, go.cols) != (a.batch, a.l, a.dv) {
        return None;
    }
    let n_grads = if a.kind == AttentionMask::AdditiveBias {
        4
    } else {
        3
    };
    if call.grads.len() != call.inputs.len() {
        return None;
    }
    // a gradient the spec has is dense and of its input's shape, or absent where the
    // input needed none
    // q's, k's and v's gradients read slice by slice where they lie (stored like their
    // inputs, perhaps head-interleaved); the additive bias's, dense
    let mut got: Vec<Option<Slices>> = Vec::with_capacity(3);
    let mut bias_got: Option<&[f32]> = None;
    for (i, (g, x)) in call.grads.iter().zip(call.inputs).take(n_grads).enumerate() {
        match g {
            Some(g) if g.shape == x.shape && i < 3 => got.push(Some(Slices::of(g)?)),
            Some(g) if g.shape == x.shape => bias_got = Some(dense_slice(g)?),
            None if call.needs.get(i) != Some(&true) => got.push(None),
            _ => return None,
        }
    }
    let sizes = [(a.l, a.d), (a.s, a.d), (a.s, a.dv)];
    if got
        .iter()
        .zip(sizes)
        .any(|(g, (r, c))| g.as_ref().is_some_and(|g| !g.is(a.batch, r, c)))
    {
        return None;
    }
    // first in f32 with a proven bound (attention32.rs); what it does not accept, at f64
    if n_grads == 3
        && super::attention32::vjp(&a, &go, &got).is_some_and(|ts| ts.iter().all(Tally::accepts))
    {
        return Some(Ok(()));
    }
    let feed = |t: &mut Tally, got: &Option<Cow<[f32]>>, lo: usize, hi: usize, want: &[f64]| {
        if let Some(g) = got {
            t.feed(&g[lo..hi], want);
        }
    };
    let feed_bias = |t: &mut Tally, lo: usize, hi: usize, want: &[f64]| {
        if let Some(g) = bias_got {
            t.feed(&g[lo..hi], want);
        }
    };
    let shared_bias = a.mask.is_some_and(|(_, shared)| shared);
    let (l, s, d, dv, sc) = (a.l, a.s, a.d, a.dv, a.scale);
    let slices: Option<Vec<SliceGrads>> = (0..a.batch)
        .into_par_iter()
        .map(|b| {
            let (q, k, v) = a.slice(b)?;
            let (q, k, v) = (&q[..], &k[..], &v[..]);
            let go = go.read(b)?;
            let mine = |i: usize| got.get(i)?.as_ref().map(|g| g.f32s(b));
            let (got_q, got_k, got_v) = (mine(0), mine(1), mine(2));
            let (mut gk, mut gv) = (vec![0.0; s * d], vec![0.0; s * dv]);
            let mut tallies = [Tally::default(); 4];
            let mut bias =
                (a.kind == AttentionMask::AdditiveBias && shared_bias).then(|| vec![0.0; l * s]);
            for i0 in (0..l).step_by(ROWS) {
                let i1 = (i0 + ROWS).min(l);
                let rows = i1 - i0;
                let p = a.block(b, i0, i1, q, k);
                let g = &go[i0 * dv..i1 * dv];
                // gV += Pᵀ gO (a fully blocked row of P is zero: it passes nothing)
                let pt = Mat::transposed(&p, s);
                gemm(s, dv, rows, pt, Mat::rows(g, dv), &mut gv, true, false);
                // gP = gO vᵀ; gS = P ∘ (gP − Σ_j P gP), zero on fully blocked rows
                let mut gs = vec![0.0; rows * s];
                let vt = Mat::transposed(v, dv);
                gemm(rows, s, dv, Mat::rows(g, dv), vt, &mut gs, false, false);
                for (pr, gr) in p.chunks(s).zip(gs.chunks_mut(s)) {
                    let dot: f64 = pr.iter().zip(gr.iter()).map(|(x, y)| x * y).sum();
                    gr.iter_mut()
                        .zip(pr)
                        .for_each(|(g, &p)| *g = p * (*g - dot));
                }
                // gQ = sc·gS k (this block's rows), gK += sc·gSᵀ q
                let mut gq = vec![0.0; rows * d];
                gemm(
                    rows,
                    d,
                    s,
                    Mat::rows(&gs, s),
                    Mat::rows(k, d),
                    &mut gq,
                    false,
                    false,
                );
                gq.iter_mut().for_each(|x| *x *= sc);
                feed(&mut tallies[0], &got_q, i0 * d, i1 * d, &gq);
                let qb = Mat::rows(&q[i0 * d..], d);
                let mut gk_part = vec![0.0; s * d];
                let gst = Mat::transposed(&gs, s);
                gemm(s, d, rows, gst, qb, &mut gk_part, false, false);
                gk.iter_mut().zip(&gk_part).for_each(|(a, x)| *a += sc * x);
                match &mut bias {
                    Some(acc) => acc[i0 * s..i1 * s].copy_from_slice(&gs),
                    None if n_grads == 4 => {
                        feed_bias(&mut tallies[3], (b * l + i0) * s, (b * l + i1) * s, &gs)
                    }
                    None => {}
                }
            }
            feed(&mut tallies[1], &got_k, 0, s * d, &gk);
            feed(&mut tallies[2], &got_v, 0, s * dv, &gv);
            Some(SliceGrads {
                tallies,
                shared_bias: bias,
            })
        })
        .collect();
    let slices = slices?;
    let mut totals = [Tally::default(); 4];
    for sl in &slices {
        for (t, x) in totals.iter_mut().zip(&sl.tallies) {
            t.merge(x);
        }
    }
    if a.kind == AttentionMask::AdditiveBias && shared_bias {
        let mut sum = vec![0.0; l * s];
        for part in slices.iter().filter_map(|x| x.shared_bias.as_ref()) {
            sum.iter_mut().zip(part).for_each(|(a, x)| *a += x);
        }
        feed_bias(&mut totals[3], 0, l * s, &sum);
    }
    totals
        .iter()
        .take(n_grads)
        .all(Tally::accepts)
        .then_some(Ok(()))
}

#[cfg(test)]
mod tests {
    use crate::backend::Call;
    use crate::graph::{AttentionMask, Op};
    use crate::providers::native_cpu;
    use crate::runtime::guarded::tensor_operand;
    use crate::tensor::Tensor;

    /// The fast path applies to head-split views (q, k, v permuted out of [B, L, H, D], as
    /// `nn::attention` makes them) and accepts the native kernel's results; a gradient one
    /// element off is not accepted here (the whole-call check then decides).
    #[test]
    fn attention_fast_path_reads_strided_operands_and_accepts_correct_calls() {
        let session = crate::runtime::Session::new(crate::backend::BackendProfile::default_cpu());
        // a test thread of its own: installing cannot meet another session here
        let _ = crate::runtime::install(session);
        let heads = |seed| {
            Tensor::randn(&[2, 24, 3, 8], seed)
                .unwrap()
                .permute(&[0, 2, 1, 3])
                .unwrap()
        };
        let (q, k, v) = (heads(1), heads(2), heads(3));
        assert!(!q.is_contiguous(), "the test needs strided operands");
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: true,
            mask: AttentionMask::None,
        };
        let y = native_cpu::forward(&op, &[&q, &k, &v]).unwrap();
        let gy = Tensor::randn(y.shape(), 4).unwrap();
        let grads = native_cpu::vjp(&op, &[&q, &k, &v], &y, &gy, &[true; 3]).unwrap();
        let ins = [tensor_operand(&q), tensor_operand(&k), tensor_operand(&v)];
        let forward = Call {
            inputs: &ins,
            output: tensor_operand(&y),
            cotangent: None,
            needs: &[],
            grads: &[],
            seed: 1,
        };
        assert_eq!(super::forward(&op, &forward), Some(Ok(())));
        let gs: Vec<_> = grads
            .iter()
            .map(|g| g.as_ref().map(tensor_operand))
            .collect();
        let vjp = Call {
            cotangent: Some(tensor_operand(&gy)),
            needs: &[true; 3],
            grads: &gs,
            ..forward
        };
        assert_eq!(super::vjp(&op, &vjp), Some(Ok(())));
        let mut bad = grads[1].as_ref().unwrap().to_vec();
        bad[17] += 0.05;
        let bad = Tensor::from_vec(bad, grads[1].as_ref().unwrap().shape()).unwrap();
        let gs = [gs[0], Some(tensor_operand(&bad)), gs[2]];
        assert_eq!(super::vjp(&op, &Call { grads: &gs, ..vjp }), None);
        // a NaN in a strided input: the fast path does not decide (the spec does)
        let mut with_nan = Tensor::randn(&[2, 24, 3, 8], 1).unwrap().to_vec();
        with_nan[100] = f32::NAN;
        let q_nan = Tensor::from_vec(with_nan, &[2, 24, 3, 8])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap();
        let ins = [
            tensor_operand(&q_nan),
            tensor_operand(&k),
            tensor_operand(&v),
        ];
        let call = Call {
            inputs: &ins,
            ..forward
        };
        assert_eq!(super::forward(&op, &call), None);
    }
}
