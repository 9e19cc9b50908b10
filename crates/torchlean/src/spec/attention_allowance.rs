//! The error a correct f32 attention kernel may make beyond the checkers' tolerance relative
//! to the result (`2e-4·(1 + max|spec|)`), when the result is small against the terms it is
//! computed from: the attention part of [`super::cancellation_allowance`].
//!
//! Two effects are not covered by a tolerance relative to the result. **Large scores**: an
//! f32 score c·q·k errs by about γ_d·|c|·‖q‖·‖k‖, which is large when the scores are (inputs
//! of magnitude 30 at d = 8, say), and the probabilities then move by a factor up to e^{2Δ}.
//! **Cancellation in the VJP**: dS = P∘(dP − D), with D = Σ P·dP (or rowsum(dO∘O), the flash
//! form) the same number summed in another order: where P is nearly one-hot, dP − D is a
//! difference of two nearly equal numbers of size ‖dO‖·‖V‖, so dQ and dK err by
//! u·‖dO‖·‖V‖·|c|·|K| while their exact value is about 0 (found by the forty-second session's
//! audit: a saturated softmax with |v| ≈ 100 had dQ rejected at −5.5e-4 against an exact 0,
//! where PyTorch's own f32 result errs by 9.5e-4).
//!
//! ## The bound (u = 2⁻²⁴, γₙ = nu/(1 − nu); Higham, *Accuracy and Stability*, Thm 3.5)
//!
//! A running error bound, per element, from the exact (f64) quantities of this call: c the
//! scale, d and dv the head dimensions, S keys, L queries, p the probabilities, g the
//! cotangent, dPᵢⱼ = gᵢ·vⱼ, Mᵢⱼ = Σ|gᵢ||vⱼ|, Dᵢ = Σⱼ pᵢⱼ dPᵢⱼ, Oᵢ = Σⱼ pᵢⱼ vⱼ.
//! - scores: each errs by at most Δᵢ = γ_{d+4}·maxⱼ(|c|·Σₖ|qᵢₖ||kⱼₖ| + |biasᵢⱼ|) (the
//!   product, the scale, the bias added);
//! - probabilities: |p̂ − p| ≤ κᵢ·p with κᵢ = e^{2Δᵢ}·(1 + γ_{S/4+8})/(1 − γ_{S+2}) − 1 (the
//!   exponential within a few ulps, one rescaling per tile of an online softmax — at most
//!   S/4 of them —, the normalizing sum);
//! - output: |Ôᵢ꜀ − Oᵢ꜀| ≤ ΔOᵢ꜀ = (κᵢ + γ_{S+2}(1 + κᵢ))·Σⱼ pᵢⱼ|vⱼ꜀|;
//! - D̂ᵢ, summed as Σⱼ p̂ dP̂: κᵢ(Wᵢ + |Dᵢ|) + γ_{S+2}(1 + κᵢ)Σⱼ p|dP| + (1 + κᵢ)γ_{dv+2}Σⱼ p·M
//!   (Wᵢ = Σⱼ pᵢⱼ|dPᵢⱼ − Dᵢ|; the errors of p̂ sum to at most κᵢ), or as rowsum(dO∘Ô) (the flash
//!   form): Σ꜀|gᵢ꜀|ΔOᵢ꜀ + γ_{dv+2}Σ꜀|gᵢ꜀|(|Oᵢ꜀| + ΔOᵢ꜀) — the larger of the two, errDᵢ;
//! - dSᵢⱼ = p(dP − D) computed as p̂·fl(dP̂ − D̂) errs by
//!   eᵢⱼ = pᵢⱼ[κᵢ|dPᵢⱼ − Dᵢ| + (1 + κᵢ)(γ_{dv+2}Mᵢⱼ + errDᵢ)(1 + 2u) + 2u(1 + κᵢ)|dPᵢⱼ − Dᵢ|];
//! - dQᵢ꜀ = c·Σⱼ dSᵢⱼ kⱼ꜀: |c|·Σⱼ eᵢⱼ|kⱼ꜀| + γ_{S+3}·|c|·Σⱼ(|dSᵢⱼ| + eᵢⱼ)|kⱼ꜀|;
//! - dKⱼ꜀ = c·Σᵢ dSᵢⱼ qᵢ꜀: |c|·Σᵢ eᵢⱼ|qᵢ꜀| + γ_{L+3}·|c|·Σᵢ(|dSᵢⱼ| + eᵢⱼ)|qᵢ꜀|;
//! - dVⱼ꜀ = Σᵢ pᵢⱼ gᵢ꜀: Σᵢ (κᵢ + γ_{L+2}(1 + κᵢ))·pᵢⱼ|gᵢ꜀|;
//! - an additive mask's gradient is dS itself: eᵢⱼ per element, and for a mask shared by the
//!   B batch matrices (shape [L, S]) the sum over them, Σ_b e + γ_{B+1}·Σ_b(|dS| + e) (the
//!   mask's allowance was 0 until the forty-fourth session's audit: `strict_native_cpu`
//!   rejected a correct mask gradient of a padded query row, −0.5489 against −0.5563).
//!
//! Where κᵢ ≥ 1 the scores' rounding alone can move the probabilities by a factor of two or
//! more (inputs of magnitude 10³, a diverging run): any distribution over the row's keys is
//! within a correct kernel's reach, and the row takes the trivial bounds instead — p̂ ≤ 1,
//! Σ p̂ = 1, Ô in the hull of the values (|Ô − O| ≤ 2·maxⱼ|vⱼ꜀|), |dP̂ − D̂| ≤ 2·bmᵢ with
//! bmᵢ = max(maxⱼ(|dPᵢⱼ| + γ_{dv+2}Mᵢⱼ), (1 + γ_{dv+2})·Σ꜀|gᵢ꜀|·maxⱼ|vⱼ꜀|). Such a call is
//! accepted for almost any result: it is ill-conditioned in f32, not wrong (`checked_cpu`
//! computes the same values; the forty-second session's audit found `strict_native_cpu`
//! stopping the transformer example at `--lr 100`, where the other profiles train on).
//!
//! Each tensor's allowance is its largest element bound times [`MARGIN`] (the second-order
//! terms dropped). On ordinary inputs this is of the order of the relative tolerance; where
//! the softmax saturates or the values are large against the result it is what lets a
//! correct kernel pass. A call with a non-finite input or cotangent gets no allowance (its
//! non-finite results are compared by class; an infinite allowance would accept anything).
//! Computing it costs about one more evaluation of the spec's VJP: the checkers ask for it
//! only when a tensor's comparison without it failed.

use super::array::Array;
use super::numel;
use super::special::{attention_row, Scores};
use crate::graph::{AttentionMask, Op};

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Each bound is multiplied by this (the (1 + O(u)) factors dropped above, with room).
const MARGIN: f64 = 1.25;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu).max(0.5)
}

/// `[O]` for the forward (`gy` None), `[dQ, dK, dV]` (and an additive mask's) for the VJP.
pub(super) fn cancellation_allowance(
    op: &Op,
    xs: &[&Array<f64>],
    gy: Option<&Array<f64>>,
) -> Vec<f64> {
    let zeros = super::no_allowance(xs.len(), gy);
    let Some((scale, causal, mask)) = op.attention_payload() else {
        return zeros;
    };
    if xs.len() < 3 || !super::finite_call(xs, gy) {
        return zeros;
    }
    let (q, k, v) = (xs[0], xs[1], xs[2]);
    let r = q.shape.len();
    if r < 2 || k.shape.len() != r || v.shape.len() != r {
        return zeros;
    }
    let (l, d, s, dv) = (
        q.shape[r - 2],
        q.shape[r - 1],
        k.shape[r - 2],
        v.shape[r - 1],
    );
    let scores = Scores::new(xs, scale, causal, mask);
    let c = scores.scale().abs();
    let bias = (mask == AttentionMask::AdditiveBias).then(|| xs[3]);
    let mut a = [0.0f64; 5];
    let batches = numel(&q.shape[..r - 2]);
    // a mask shared by every batch matrix: its gradient sums their dS (element bounds summed)
    let shared = bias.is_some_and(|m| m.shape.len() <= 2);
    let (mut mask_err, mut mask_mag) = (vec![0.0f64; l * s], vec![0.0f64; l * s]);
    for b in 0..batches {
        let slice = Slice {
            q: &q.data[b * l * d..(b + 1) * l * d],
            k: &k.data[b * s * d..(b + 1) * s * d],
            v: &v.data[b * s * dv..(b + 1) * s * dv],
            g: gy.map(|g| &g.data[b * l * dv..(b + 1) * l * dv]),
            bias: bias.map(|m| {
                if m.shape.len() > 2 {
                    &m.data[b * l * s..(b + 1) * l * s]
                } else {
                    &m.data[..l * s]
                }
            }),
            dims: (l, s, d, dv),
            c,
        };
        let got = slice.bounds(
            |i| attention_row(&scores, b, i),
            |i, j| scores.at(b, i, j).is_some(),
            (&mut mask_err, &mut mask_mag),
        );
        for (m, x) in a.iter_mut().zip(got) {
            *m = m.max(x);
        }
    }
    let out = |x: f64| if x.is_finite() { x * MARGIN } else { 0.0 };
    match gy {
        None => vec![out(a[0])],
        Some(_) => {
            let mut v: Vec<f64> = a[1..4].iter().map(|&x| out(x)).collect();
            v.resize(xs.len(), 0.0);
            if bias.is_some() && xs.len() > 3 {
                v[3] = out(if shared {
                    let g = gamma(batches + 1);
                    mask_err
                        .iter()
                        .zip(&mask_mag)
                        .map(|(e, m)| e + g * m)
                        .fold(0.0f64, f64::max)
                } else {
                    a[4]
                });
            }
            v
        }
    }
}

/// One batch matrix of the call.
struct Slice<'a> {
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    g: Option<&'a [f64]>,
    /// The additive bias, [L, S].
    bias: Option<&'a [f64]>,
    /// (L, S, d, dv).
    dims: (usize, usize, usize, usize),
    c: f64,
}

impl Slice<'_> {
    /// The largest element bound of [O, dQ, dK, dV, dS] (the gradients' 0 without a
    /// cotangent), `probs(i)` the exact probabilities of row i (`None`: every key blocked);
    /// each dS element's bound and |dS| + bound are also added into `mask` ([L, S] each: a
    /// shared mask's gradient sums them over the batch matrices).
    fn bounds(
        &self,
        probs: impl Fn(usize) -> Option<Vec<f64>>,
        open: impl Fn(usize, usize) -> bool,
        mask: (&mut [f64], &mut [f64]),
    ) -> [f64; 5] {
        let (mask_err, mask_mag) = mask;
        let (l, s, d, dv) = self.dims;
        let (gs, gl, gdv) = (gamma(s + 2), gamma(l + 2), gamma(dv + 2));
        fn row(x: &[f64], i: usize, w: usize) -> &[f64] {
            &x[i * w..(i + 1) * w]
        }
        let mut out = [0.0f64; 5];
        // dK's and dV's element bounds, accumulated over the rows
        let mut dk = vec![0.0f64; s * d];
        let mut dvb = vec![0.0f64; s * dv];
        let mut e = vec![0.0f64; s];
        let mut ds = vec![0.0f64; s];
        for i in 0..l {
            let Some(p) = probs(i) else { continue };
            let qi = row(self.q, i, d);
            // the keys row i sees (a probability that underflows to 0 in f64 is still one)
            let keys: Vec<usize> = (0..s).filter(|&j| open(i, j)).collect();
            let score_mag = keys
                .iter()
                .map(|&j| {
                    let dot: f64 = qi
                        .iter()
                        .zip(row(self.k, j, d))
                        .map(|(x, y)| (x * y).abs())
                        .sum();
                    self.c * dot + self.bias.map_or(0.0, |m| m[i * s + j].abs())
                })
                .fold(0.0f64, f64::max);
            let delta = gamma(d + 4) * score_mag;
            let kappa = (2.0 * delta).exp() * (1.0 + gamma(s / 4 + 8)) / (1.0 - gs) - 1.0;
            // scores so large that their f32 rounding moves the probabilities by a factor of
            // two or more: any distribution over the row's keys is within a correct kernel's
            // reach, and the bounds below fall back to the trivial ones (p̂ ≤ 1, Σ p̂ = 1)
            let lost = kappa.is_nan() || kappa >= 1.0;
            // the output: Σⱼ p|v| per column
            let mut pv = vec![0.0f64; dv];
            let mut o = vec![0.0f64; dv];
            let mut v_max = vec![0.0f64; dv];
            for &j in &keys {
                let vj = row(self.v, j, dv);
                for (mx, &x) in v_max.iter_mut().zip(vj) {
                    *mx = mx.max(x.abs());
                }
                for ((a, oc), &x) in pv.iter_mut().zip(o.iter_mut()).zip(vj) {
                    *a += p[j] * x.abs();
                    *oc += p[j] * x;
                }
            }
            let d_o: Vec<f64> = if lost {
                v_max.iter().map(|&mx| 2.0 * mx).collect()
            } else {
                pv.iter()
                    .map(|a| (kappa + gs * (1.0 + kappa)) * a)
                    .collect()
            };
            out[0] = out[0].max(d_o.iter().fold(0.0f64, |m, &x| m.max(x)));
            let Some(g) = self.g else { continue };
            let gi = row(g, i, dv);
            // dP, M, D, W
            let mut dp = vec![0.0f64; s];
            let mut m = vec![0.0f64; s];
            for &j in &keys {
                let vj = row(self.v, j, dv);
                dp[j] = gi.iter().zip(vj).map(|(x, y)| x * y).sum();
                m[j] = gi.iter().zip(vj).map(|(x, y)| (x * y).abs()).sum();
            }
            let dd: f64 = (0..s).map(|j| p[j] * dp[j]).sum();
            let w: f64 = (0..s).map(|j| p[j] * (dp[j] - dd).abs()).sum();
            let sum_form = kappa * (w + dd.abs())
                + gs * (1.0 + kappa) * (0..s).map(|j| p[j] * dp[j].abs()).sum::<f64>()
                + (1.0 + kappa) * gdv * (0..s).map(|j| p[j] * m[j]).sum::<f64>();
            let rowsum_form: f64 = (0..dv)
                .map(|cc| gi[cc].abs() * (d_o[cc] + gdv * (o[cc].abs() + d_o[cc])))
                .sum();
            let err_d = sum_form.max(rowsum_form);
            for j in 0..s {
                ds[j] = p[j] * (dp[j] - dd).abs();
            }
            if lost {
                // |dP̂ − D̂| ≤ 2·bm (D̂ a weighted mean of the dP̂ or rowsum(dO∘Ô), Ô in the
                // values' hull): |dŜ| ≤ p̂·2bm with p̂ ≤ 1 and Σ p̂ = 1
                let hull: f64 = gi.iter().zip(&v_max).map(|(x, mx)| x.abs() * mx).sum();
                let bm = keys
                    .iter()
                    .map(|&j| dp[j].abs() + gdv * m[j])
                    .fold(0.0f64, f64::max)
                    .max(hull * (1.0 + gdv));
                let t = 2.0 * bm * (1.0 + 4.0 * U);
                // dS itself (an additive mask's gradient): |dŜ| ≤ t
                for &j in &keys {
                    out[4] = out[4].max(t + ds[j]);
                    mask_err[i * s + j] += t + ds[j];
                    mask_mag[i * s + j] += t + 2.0 * ds[j];
                }
                for cc in 0..d {
                    let (mut k_max, mut exact) = (0.0f64, 0.0f64);
                    for &j in &keys {
                        let kj = self.k[j * d + cc].abs();
                        k_max = k_max.max(kj);
                        exact += ds[j] * kj;
                    }
                    out[1] = out[1].max(self.c * ((1.0 + gamma(s + 3)) * t * k_max + exact));
                }
                for &j in &keys {
                    let dkj = &mut dk[j * d..(j + 1) * d];
                    for (acc, &x) in dkj.iter_mut().zip(qi) {
                        *acc += self.c * (1.0 + gamma(l + 3)) * (t + ds[j]) * x.abs();
                    }
                    let dvj = &mut dvb[j * dv..(j + 1) * dv];
                    for (acc, &x) in dvj.iter_mut().zip(gi) {
                        *acc += (1.0 + gl) * (1.0 + p[j]) * x.abs();
                    }
                }
                continue;
            }
            for j in 0..s {
                let diff = (dp[j] - dd).abs();
                e[j] = p[j]
                    * (kappa * diff
                        + (1.0 + kappa) * (gdv * m[j] + err_d) * (1.0 + 2.0 * U)
                        + 2.0 * U * (1.0 + kappa) * diff);
            }
            // dS itself (an additive mask's gradient)
            for &j in &keys {
                out[4] = out[4].max(e[j]);
                mask_err[i * s + j] += e[j];
                mask_mag[i * s + j] += ds[j] + e[j];
            }
            // dQ's row i; dK's and dV's contributions of row i
            for cc in 0..d {
                let (mut er, mut mag) = (0.0f64, 0.0f64);
                for &j in &keys {
                    let kj = self.k[j * d + cc].abs();
                    er += e[j] * kj;
                    mag += (ds[j] + e[j]) * kj;
                }
                out[1] = out[1].max(self.c * (er + gamma(s + 3) * mag));
            }
            for &j in &keys {
                let dkj = &mut dk[j * d..(j + 1) * d];
                for (acc, &x) in dkj.iter_mut().zip(qi) {
                    *acc += self.c * (e[j] + gamma(l + 3) * (ds[j] + e[j])) * x.abs();
                }
                let dvj = &mut dvb[j * dv..(j + 1) * dv];
                for (acc, &x) in dvj.iter_mut().zip(gi) {
                    *acc += (kappa + gl * (1.0 + kappa)) * p[j] * x.abs();
                }
            }
        }
        let largest = |x: &[f64]| x.iter().fold(0.0f64, |m, &v| m.max(v));
        out[2] = largest(&dk);
        out[3] = largest(&dvb);
        out
    }
}
