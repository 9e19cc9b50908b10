//! The attention checks' first try: the recomputation in f32 — the `gemm` crate's f32
//! products and the vectorized f32 exponential of `gelu.rs` — with a proven bound δ on its
//! distance to the spec's values, compared through [`Tally::feed_approx32`] (an acceptance
//! there implies the spec's acceptance). Anything else — a bound too wide to decide, a
//! non-finite input, an additive bias, a rejection — goes to the f64 recomputation of
//! `attention.rs`, then to the spec itself, which decides and words the verdict.
//!
//! ## The bound (u = 2⁻²⁴, γₙ = nu/(1 − nu); Higham, *Accuracy and Stability*, Thm 3.5)
//!
//! For one batch matrix: scale c (rounded to f32: one more rounding), d the head dimension,
//! S keys, L queries; ‖·‖ Euclidean norms of rows, |·|max the largest magnitude.
//! - **Scores.** ŝᵢⱼ = fl(fl(c)·fl(qᵢ·kⱼ)) errs from sᵢⱼ = c·qᵢ·kⱼ by at most
//!   γ_{d+3}·|c|·Σₖ|qᵢₖ||kⱼₖ| ≤ Δᵢ = γ_{d+3}·|c|·‖qᵢ‖·maxⱼ‖kⱼ‖ (Cauchy–Schwarz).
//! - **Weights.** With m̂ the row's largest allowed ŝ and R ≤ [`MAX_RANGE`] its range,
//!   t = fl(ŝ − m̂) ∈ [−R, 0] is within u·R of ŝ − m̂, and `exp_neg` is within 4u relative
//!   there (and a normal number, as is every p̂ below). So ê = exp_neg(t) is within κ₁·w of
//!   the exact w = e^{s − m̂}, κ₁ = e^{Δ + uR}·(1 + 4u) − 1.
//! - **Probabilities.** p̂ = ê·fl(1/ẑ) with ẑ = fl(Σ ê) (within γ_S of the sum): relative to
//!   p = w/Σw, |p̂ − p| ≤ κ·p with κ = (1 + κ₁)(1 + 2u)/((1 − κ₁)(1 − γ_S)) − 1.
//! - **Output** O = P V: |Ô − O| ≤ (κ + γ_S(1 + κ))·|V|max.
//! - **VJP**, with g the cotangent, Bᵢ = ‖gᵢ‖·maxⱼ‖vⱼ‖ (|dPᵢⱼ| ≤ Bᵢ, |Dᵢ| ≤ Bᵢ),
//!   Eᵢ = γ_{dv}·Bᵢ (the error of dP̂ = fl(g Vᵀ)), Cⱼ = Σᵢ pᵢⱼ ≤ Σᵢ p̂ᵢⱼ/(1 − κ):
//!   - dV = Pᵀg: |dV̂ − dV| ≤ |g|max·(κ·C + γ_L·Ĉ);
//!   - D̂ᵢ = fl(Σⱼ p̂ dP̂) within Fᵢ = (κ + γ_S(1 + κ))(Bᵢ + Eᵢ) + Eᵢ of Dᵢ;
//!   - dŜ = fl(p̂·fl(dP̂ − D̂)) within pᵢⱼ·Hᵢ of dS = p(dP − D), where
//!     Hᵢ = 2(κ + 2u(1 + κ))(Bᵢ + Eᵢ)·(1 + κ + γ_S) + Eᵢ + Fᵢ, and |dŜ| ≤ p·Gᵢ with
//!     Gᵢ = 2(1 + κ)(Bᵢ + Eᵢ)(1 + κ + γ_S)(1 + 4u);
//!   - dQ = c·dS K (c rounded, the product rounded): |dQ̂ − dQ| ≤ |c|·|K|max·maxᵢ(Hᵢ + γ_{S+3}·Gᵢ);
//!   - dK = c·dSᵀ Q: |dK̂ − dK| ≤ |c|·|Q|max·maxⱼCⱼ·maxᵢ(Hᵢ + γ_{L+3}·Gᵢ).
//!
//! Underflow: a product or sum that underflows errs by at most 2⁻¹²⁶ absolute (also where
//! subnormals are flushed), so each bound above gains the number of such roundings that
//! reach it times 2⁻¹²⁶ times what multiplies them ([`UNDER`]). Each δ is then multiplied
//! by [`MARGIN`] and raised by an absolute [`FLOOR`] (the f64 spec's own distance to exact
//! arithmetic), and a call whose κ₁ exceeds [`MAX_KAPPA`] or whose score range exceeds
//! [`MAX_RANGE`] is left to the f64 path. The f32 sums inside the gemm crate and the lanes
//! may be in any order: the bounds above hold for every order.

use super::attention::{Attention, Slices};
use super::gelu::exp_neg;
use super::pieces::Tally;
use crate::graph::AttentionMask;
use crate::providers::native_cpu::par::{gemm, Mat};
use rayon::prelude::*;
use std::borrow::Cow;

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Query rows per block (the scores of one block are `ROWS × S` f32 values).
const ROWS: usize = 64;

/// Each bound is multiplied by this (the (1 + O(u)) factors dropped above, with room).
const MARGIN: f64 = 1.05;

/// Added to each bound: products that underflow (each loses at most 2⁻¹⁴⁹) and the f64 spec's
/// own distance to exact arithmetic, both far below it for any call this path decides.
const FLOOR: f64 = 1e-30;

/// Calls whose weights' relative bound κ₁ exceeds this go to the f64 path.
const MAX_KAPPA: f64 = 1e-3;

/// The largest score range of a row this path takes: e^−60 / S is a normal f32 for any S
/// that fits in memory, so no weight or probability is subnormal.
const MAX_RANGE: f64 = 60.0;

/// The absolute error of one rounding that underflows (2⁻¹²⁶: flushed or gradual).
const UNDER: f64 = 1.0 / (1u128 << 126) as f64;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// A slice's values at f32, borrowed where they lie row-major; `None` when one is not
/// finite.
fn finite32<'a>(s: &Slices<'a>, b: usize) -> Option<Cow<'a, [f32]>> {
    let x = s.f32s(b);
    // v·0 is 0 for a finite v and NaN otherwise, or-ed in lanes
    let ok = x.chunks(16).fold(true, |ok, c| {
        ok & c.iter().fold(true, |all, &v| all & (v * 0.0 == 0.0))
    });
    ok.then_some(x)
}

/// The Euclidean norm of each `cols`-long row, at f64, raised by a relative 1e-12.
fn row_norms(x: &[f32], cols: usize) -> Vec<f64> {
    x.chunks(cols.max(1))
        .map(|r| {
            let s: f64 = r.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            s.sqrt() * (1.0 + 1e-12)
        })
        .collect()
}

fn abs_max(x: &[f32]) -> f64 {
    f64::from(x.iter().fold(0.0f32, |m, &v| m.max(v.abs())))
}

/// Sixteen lanes (a sequential fold is one dependent operation per element).
const LANES: usize = 16;

/// The largest value of `row` and the smallest that is not −inf (blocked entries are −inf).
#[inline(always)]
fn max_and_allowed_min(row: &[f32]) -> (f32, f32) {
    let (mut hi, mut lo) = ([f32::NEG_INFINITY; LANES], [f32::INFINITY; LANES]);
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            hi[l] = hi[l].max(c[l]);
            lo[l] = if c[l] == f32::NEG_INFINITY {
                lo[l]
            } else {
                lo[l].min(c[l])
            };
        }
    }
    for &x in tail {
        hi[0] = hi[0].max(x);
        lo[0] = if x == f32::NEG_INFINITY {
            lo[0]
        } else {
            lo[0].min(x)
        };
    }
    (
        hi.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)),
        lo.iter().fold(f32::INFINITY, |m, &x| m.min(x)),
    )
}

/// Σ row in lanes (any order: the bounds hold for every order).
#[inline(always)]
fn lane_sum(row: &[f32]) -> f32 {
    let mut z = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            z[l] += c[l];
        }
    }
    z.iter().sum::<f32>() + tail
}

/// Σ a·b in lanes.
#[inline(always)]
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut z = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            z[l] += x[l] * y[l];
        }
    }
    z.iter().sum::<f32>() + tail
}

/// A row's probability bound κ (see the module doc) from its score bound Δ and range R, or
/// `None` when κ₁ exceeds [`MAX_KAPPA`] or R exceeds [`MAX_RANGE`].
fn kappa(delta: f64, range: f64, s: usize) -> Option<f64> {
    let k1 = (delta + U * range).exp() * (1.0 + 4.0 * U) - 1.0;
    if !(k1 <= MAX_KAPPA && range <= MAX_RANGE) {
        return None;
    }
    Some((1.0 + k1) * (1.0 + 2.0 * U) / ((1.0 - k1) * (1.0 - gamma(s))) - 1.0)
}

impl Attention<'_> {
    /// The f32 probabilities of rows `i0..` of slice `b` from their raw products `qk`
    /// (rows × S), in place, by the spec's rules (`attention.rs`'s `probabilities_of`: the
    /// causal limit and boolean mask block, a row with nothing allowed stays all zeros).
    /// Returns each row's κ (0 for a row that attends nothing), or `None` when one is too
    /// wide; `qn` holds the rows' ‖q‖, `kmax` the largest ‖k‖.
    fn probabilities32(
        &self,
        b: usize,
        i0: usize,
        qk: &mut [f32],
        qn: &[f64],
        kmax: f64,
    ) -> Option<Vec<f64>> {
        crate::wide::wide!(self.probabilities32_of(b, i0, qk, qn, kmax))
    }

    #[inline(always)]
    fn probabilities32_of(
        &self,
        b: usize,
        i0: usize,
        qk: &mut [f32],
        qn: &[f64],
        kmax: f64,
    ) -> Option<Vec<f64>> {
        let s = self.s;
        let sc = self.scale as f32;
        let gd = gamma(self.d + 3) * self.scale.abs() * kmax;
        let under = self.d as f64 * UNDER * self.scale.abs();
        let mut kappas = Vec::with_capacity(qk.len() / s.max(1));
        for (r, row) in qk.chunks_mut(s.max(1)).enumerate() {
            let i = i0 + r;
            // scaled scores, blocked entries −inf (the spec's rules), in separate passes so
            // that each vectorizes
            row.iter_mut().for_each(|x| *x *= sc);
            if let Some(m) = self.mask_row(b, i) {
                if self.kind == AttentionMask::Boolean {
                    row.iter_mut()
                        .zip(m)
                        .for_each(|(x, &m)| *x = if m == 0.0 { f32::NEG_INFINITY } else { *x });
                }
            }
            if self.causal && i + 1 < s {
                row[i + 1..].fill(f32::NEG_INFINITY);
            }
            let (hi, lo) = max_and_allowed_min(row);
            if s == 0 || hi == f32::NEG_INFINITY {
                row.fill(0.0);
                kappas.push(0.0);
                continue;
            }
            // exp_neg(−inf) = 0: a blocked entry's weight
            row.iter_mut().for_each(|x| *x = exp_neg(*x - hi));
            let inv = 1.0 / lane_sum(row);
            row.iter_mut().for_each(|x| *x *= inv);
            kappas.push(kappa(gd * qn[r] + under, f64::from(hi) - f64::from(lo), s)?);
        }
        Some(kappas)
    }
}

/// One batch matrix's q, k and v at f32 (finite), with what the score bound needs.
struct Matrix<'a> {
    q: Cow<'a, [f32]>,
    k: Cow<'a, [f32]>,
    v: Cow<'a, [f32]>,
    /// ‖qᵢ‖ per query row, and the largest ‖kⱼ‖.
    qn: Vec<f64>,
    kmax: f64,
}

impl<'a> Matrix<'a> {
    /// Batch matrix `b` of the call; `None` when a value is not finite.
    fn read(a: &Attention<'a>, b: usize) -> Option<Matrix<'a>> {
        let (q, k, v) = (finite32(&a.q, b)?, finite32(&a.k, b)?, finite32(&a.v, b)?);
        let qn = row_norms(&q, a.d);
        let kmax = row_norms(&k, a.d).into_iter().fold(0.0, f64::max);
        Some(Matrix { q, k, v, qn, kmax })
    }

    /// The probabilities of query rows `i0..i0 + rows` into `p` (rows × S), with each row's
    /// κ; `None` when a row's bound is too wide.
    fn probabilities(&self, a: &Attention, b: usize, i0: usize, p: &mut [f32]) -> Option<Vec<f64>> {
        let (d, rows) = (a.d, p.len() / a.s.max(1));
        let q = Mat::rows(&self.q[i0 * d..], d);
        gemm(
            rows,
            a.s,
            d,
            q,
            Mat::transposed(&self.k, d),
            p,
            false,
            false,
        );
        a.probabilities32(b, i0, p, &self.qn[i0..i0 + rows], self.kmax)
    }
}

/// The forward check in f32: `Some(tally)` to accept or pass on, `None` when this path does
/// not apply (the f64 path then runs).
pub(super) fn forward(a: &Attention, out: &Slices) -> Option<Tally> {
    if a.kind == AttentionMask::AdditiveBias {
        return None;
    }
    let (l, s, dv) = (a.l, a.s, a.dv);
    let tallies: Option<Vec<Tally>> = (0..a.batch)
        .into_par_iter()
        .map(|b| {
            let m = Matrix::read(a, b)?;
            let vmax = abs_max(&m.v);
            let got = out.f32s(b);
            let mut t = Tally::default();
            let mut p = vec![0.0f32; ROWS * s];
            let mut o = vec![0.0f32; ROWS * dv];
            for i0 in (0..l).step_by(ROWS) {
                let rows = (i0 + ROWS).min(l) - i0;
                let p = &mut p[..rows * s];
                let kappas = m.probabilities(a, b, i0, p)?;
                let o = &mut o[..rows * dv];
                gemm(
                    rows,
                    dv,
                    s,
                    Mat::rows(p, s),
                    Mat::rows(&m.v, dv),
                    o,
                    false,
                    false,
                );
                let k = kappas.iter().fold(0.0, |m: f64, &x| m.max(x));
                let delta =
                    ((k + gamma(s) * (1.0 + k)) * vmax + 2.0 * s as f64 * UNDER) * MARGIN + FLOOR;
                t.feed_approx32(&got[i0 * dv..(i0 + rows) * dv], o, delta);
            }
            Some(t)
        })
        .collect();
    let mut total = Tally::default();
    tallies?.iter().for_each(|t| total.merge(t));
    Some(total)
}

/// The VJP check in f32 (q's, k's and v's gradients, each where the call has it): the three
/// tallies, or `None` when this path does not apply.
pub(super) fn vjp(a: &Attention, go: &Slices, got: &[Option<Slices>]) -> Option<[Tally; 3]> {
    if a.kind == AttentionMask::AdditiveBias {
        return None;
    }
    let (l, s, d, dv, c) = (a.l, a.s, a.d, a.dv, a.scale);
    let sc = c as f32;
    let parts: Option<Vec<[Tally; 3]>> = (0..a.batch)
        .into_par_iter()
        .map(|b| {
            let (m, g) = (Matrix::read(a, b)?, finite32(go, b)?);
            let (q, k, v) = (&m.q, &m.k, &m.v);
            let mine = |i: usize| got.get(i)?.as_ref().map(|x| x.f32s(b));
            let (got_q, got_k, got_v) = (mine(0), mine(1), mine(2));
            let gn = row_norms(&g, dv);
            let vn = row_norms(v, dv).into_iter().fold(0.0, f64::max);
            let (qabs, kabs, gabs) = (abs_max(q), abs_max(k), abs_max(&g));
            let (mut gk, mut gv) = (vec![0.0f32; s * d], vec![0.0f32; s * dv]);
            let mut colsum = vec![0.0f64; s];
            let mut tallies = [Tally::default(); 3];
            let (mut kappa_max, mut wk_max) = (0.0f64, 0.0f64);
            let mut p = vec![0.0f32; ROWS * s];
            let mut gs = vec![0.0f32; ROWS * s];
            let mut gq = vec![0.0f32; ROWS * d];
            for i0 in (0..l).step_by(ROWS) {
                let rows = (i0 + ROWS).min(l) - i0;
                let (p, gs, gq) = (&mut p[..rows * s], &mut gs[..rows * s], &mut gq[..rows * d]);
                let kappas = m.probabilities(a, b, i0, p)?;
                let gb = &g[i0 * dv..(i0 + rows) * dv];
                // gV += Pᵀ gO
                gemm(
                    s,
                    dv,
                    rows,
                    Mat::transposed(p, s),
                    Mat::rows(gb, dv),
                    &mut gv,
                    true,
                    false,
                );
                // gP = gO vᵀ; gS = P ∘ (gP − Σ_j P gP)
                gemm(
                    rows,
                    s,
                    dv,
                    Mat::rows(gb, dv),
                    Mat::transposed(v, dv),
                    gs,
                    false,
                    false,
                );
                crate::wide::wide!({
                    for (pr, gr) in p.chunks(s.max(1)).zip(gs.chunks_mut(s.max(1))) {
                        let dot = lane_dot(pr, gr);
                        gr.iter_mut()
                            .zip(pr)
                            .for_each(|(g, &p)| *g = p * (*g - dot));
                    }
                });
                for pr in p.chunks(s.max(1)) {
                    colsum
                        .iter_mut()
                        .zip(pr)
                        .for_each(|(c, &x)| *c += f64::from(x));
                }
                // gQ = c·gS k; gK += gSᵀ q (scaled at the end)
                gemm(
                    rows,
                    d,
                    s,
                    Mat::rows(gs, s),
                    Mat::rows(k, d),
                    gq,
                    false,
                    false,
                );
                gq.iter_mut().for_each(|x| *x *= sc);
                gemm(
                    s,
                    d,
                    rows,
                    Mat::transposed(gs, s),
                    Mat::rows(&q[i0 * d..], d),
                    &mut gk,
                    true,
                    false,
                );
                // the rows' bounds (module doc)
                let mut wq = 0.0f64;
                for (r, &kap) in kappas.iter().enumerate() {
                    let bi = gn[i0 + r] * vn;
                    let ei = gamma(dv) * bi + dv as f64 * UNDER;
                    let be = bi + ei;
                    // D̂'s S products may underflow
                    let fi = (kap + gamma(s) * (1.0 + kap)) * be + ei + s as f64 * UNDER;
                    let hi =
                        2.0 * (kap + 2.0 * U * (1.0 + kap)) * be * (1.0 + kap + gamma(s)) + ei + fi;
                    let spread = 2.0 * (1.0 + kap) * be * (1.0 + kap + gamma(s)) * (1.0 + 4.0 * U);
                    wq = wq.max(hi + gamma(s + 3) * spread);
                    wk_max = wk_max.max(hi + gamma(l + 3) * spread);
                    kappa_max = kappa_max.max(kap);
                }
                if let Some(x) = &got_q {
                    // underflow: each dŜ entry (times |k|), the S products and the scaling
                    let under = (s as f64 + 1.0) * UNDER * (1.0 + c.abs() * (1.0 + kabs));
                    let delta = (c.abs() * kabs * wq + under) * MARGIN + FLOOR;
                    tallies[0].feed_approx32(&x[i0 * d..(i0 + rows) * d], gq, delta);
                }
            }
            gk.iter_mut().for_each(|x| *x *= sc);
            let cmax = colsum.iter().fold(0.0f64, |m, &x| m.max(x)) * (1.0 + 1e-12);
            let c_true = cmax / (1.0 - kappa_max);
            let under = (l as f64 + 1.0) * UNDER * (1.0 + c.abs() * (1.0 + qabs));
            if let Some(x) = &got_k {
                let delta = (c.abs() * qabs * c_true * wk_max + under) * MARGIN + FLOOR;
                tallies[1].feed_approx32(x, &gk, delta);
            }
            if let Some(x) = &got_v {
                let delta =
                    (gabs * (kappa_max * c_true + gamma(l) * cmax) + under) * MARGIN + FLOOR;
                tallies[2].feed_approx32(x, &gv, delta);
            }
            Some(tallies)
        })
        .collect();
    let mut totals = [Tally::default(); 3];
    for part in parts? {
        for (t, x) in totals.iter_mut().zip(&part) {
            t.merge(x);
        }
    }
    Some(totals)
}

#[cfg(test)]
mod tests {
    use super::super::attention::{Attention, Slices};
    use super::super::pieces::Tally;
    use crate::backend::Call;
    use crate::graph::{AttentionMask, Op};
    use crate::runtime::guarded::tensor_operand;
    use crate::spec::{self, Array};
    use crate::tensor::Tensor;

    /// Values from a seed, times `scale`; one in 97 also times `outlier`.
    fn draw(shape: &[usize], seed: u64, scale: f32, outlier: f32) -> Tensor {
        let t = Tensor::randn(shape, seed).expect("randn");
        let v: Vec<f32> = t
            .to_vec()
            .iter()
            .enumerate()
            .map(|(i, x)| x * scale * if i % 97 == 0 { outlier } else { 1.0 })
            .collect();
        Tensor::from_vec(v, shape).expect("values")
    }

    fn wide(t: &Tensor) -> Array<f64> {
        Array::from_vec(
            t.shape().to_vec(),
            t.to_vec().iter().map(|&v| f64::from(v)).collect(),
        )
        .expect("array")
    }

    fn narrow(a: &Array<f64>) -> Tensor {
        Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).expect("tensor")
    }

    /// The tally's claim holds: fed the spec's own values (rounded to f32), every reference
    /// value is within the tally's slack of them (up to that rounding).
    fn holds(what: &str, t: &Tally) {
        let (err, slack, scale) = t.parts();
        assert!(
            err <= slack + scale * f64::from(f32::EPSILON),
            "{what}: the f32 recomputation is {err:e} from the spec, beyond its bound {slack:e}"
        );
    }

    /// The bounds of the module doc hold (a worst-case bound: on these inputs the observed
    /// distance is 100–500 times smaller, so this catches a gross error in a bound, such as a
    /// dropped dominant term, not a slightly low constant — the derivation is the module doc's):
    /// over random calls — batch, L ≠ S, head sizes, scale
    /// magnitudes from 0.1 to 10 (scores up to the path's range limit), no mask, boolean
    /// masks with fully blocked rows, causal, explicit scales — the f32 reference values of
    /// the output and of all three gradients are within their δ of the f64 spec; and on
    /// ordinary calls the path decides (it does not hand every call to the f64 path).
    #[test]
    fn the_f32_bounds_hold_against_the_f64_spec() {
        let session = crate::runtime::Session::new(crate::backend::BackendProfile::default_cpu());
        // a test thread of its own: installing cannot meet another session here
        let _ = crate::runtime::install(session);
        let mut decided = 0;
        for case in 0..36u64 {
            let (batch, l, s) = (
                [1, 3, 2][case as usize % 3],
                5 + (case * 13 % 70) as usize,
                3 + (case * 29 % 90) as usize,
            );
            let (d, dv) = (1 + (case * 7 % 40) as usize, 1 + (case * 5 % 33) as usize);
            // q and k from 0.1 to 3, a few of them 30 times that (scores past the path's
            // range: left to the f64 path), v with outliers of 100
            let magnitude = [0.1f32, 1.0, 0.5, 3.0][case as usize % 4];
            let outlier = if case % 6 == 5 { 30.0 } else { 1.0 };
            let (q, k, v) = (
                draw(&[batch, l, d], 10 * case + 1, magnitude, outlier),
                draw(&[batch, s, d], 10 * case + 2, magnitude, outlier),
                draw(&[batch, s, dv], 10 * case + 3, 1.0, 100.0),
            );
            let masked = case % 3 == 1;
            let mask = masked.then(|| {
                // one key in three blocked, and the first query row entirely
                let m: Vec<f32> = (0..batch * l * s)
                    .map(|i| {
                        if i % 3 == 0 || (i / s) % l == 0 {
                            0.0
                        } else {
                            1.0
                        }
                    })
                    .collect();
                Tensor::from_vec(m, &[batch, l, s]).expect("mask")
            });
            let op = Op::ScaledDotProductAttention {
                scale: (case % 5 == 4).then_some(0.3),
                causal: case % 2 == 0,
                mask: if masked {
                    AttentionMask::Boolean
                } else {
                    AttentionMask::None
                },
            };
            let mut ins = vec![q, k, v];
            ins.extend(mask);
            let arrays: Vec<Array<f64>> = ins.iter().map(wide).collect();
            let refs: Vec<&Array<f64>> = arrays.iter().collect();
            let y = spec::forward(&op, &refs).expect("spec forward");
            let gy = wide(&draw(&y.shape, 10 * case + 4, 1.0, 1.0));
            let grads = spec::vjp(&op, &refs, &y, &gy).expect("spec vjp");
            let (yt, gyt) = (narrow(&y), narrow(&gy));
            let gts: Vec<Tensor> = grads
                .iter()
                .take(3)
                .map(|g| narrow(g.as_ref().expect("gradient")))
                .collect();
            let operands: Vec<_> = ins.iter().map(tensor_operand).collect();
            let grad_ops: Vec<_> = gts.iter().map(|g| Some(tensor_operand(g))).collect();
            let call = Call {
                inputs: &operands,
                output: tensor_operand(&yt),
                cotangent: Some(tensor_operand(&gyt)),
                needs: &[true, true, true],
                grads: &grad_ops,
                seed: 1,
            };
            let a = Attention::of(&op, &call).expect("the fast path applies");
            let out = Slices::of(&call.output).expect("output");
            let go = Slices::of(call.cotangent.as_ref().expect("cotangent")).expect("cotangent");
            let got: Vec<_> = gts.iter().map(|g| Slices::of(&tensor_operand(g))).collect();
            if let Some(t) = super::forward(&a, &out) {
                holds(&format!("case {case} output"), &t);
                decided += usize::from(t.accepts());
            }
            if let Some(ts) = super::vjp(&a, &go, &got) {
                for (t, name) in ts.iter().zip(["dq", "dk", "dv"]) {
                    holds(&format!("case {case} {name}"), t);
                }
            }
        }
        assert!(
            decided >= 12,
            "the f32 path accepted only {decided} of 36 outputs"
        );
    }
}
