//! The check of the optimizer updates — `ema_update`, `adam_update` and `adam_step` — against
//! a bound per element, not per call.
//!
//! The recompute checks of the other ops accept an error up to 2·10⁻⁴·(1 + max|spec|) over
//! what they compare. For an optimizer's state that is coarse where the values are small
//! (Adam's second moments are often ~10⁻⁶, below the absolute floor of 2·10⁻⁴: a corrupted
//! moment passed), and it is needless: these maps are a handful of f32 operations per
//! element whose rounding is bounded element by element. So each element of the result is
//! accepted when
//! - it is the spec's formula evaluated in f32, in the spec's order, bit for bit (the
//!   reference provider's value; a NaN where that value is NaN), or
//! - it is within `B = γ_K·M + K·2⁻¹⁴⁹` of the f64 spec's value, where `M` is the sum of the
//!   magnitudes of the formula's terms (computed at f64 from the call's inputs), `γ_K =
//!   K·u/(1 − K·u)` with u = 2⁻²⁴, and `K` counts the roundings any f32 evaluation of the
//!   formula may make on a path from an input to the result (in any association, with or
//!   without fused multiply-adds; each one errs by at most u relative, or 2⁻¹⁵⁰ absolute
//!   in the subnormal range), or
//! - both it and the f64 spec's value are the same non-finite class (NaN, +inf, −inf).
//!
//! The terms and their counts (Higham, *Accuracy and Stability*, §3.1, for products and
//! sums of terms; a rounded quantity entering a product carries its relative error along):
//! - `ema_update`: `d·s + r·x` (`·x` with `square`), d and r the op's payload (exact): one
//!   rounding on `d·s`, at most two on `r·x·x`, one for the sum: four; K = 6 keeps two in
//!   reserve (a kernel that derives r from d itself, as before the weight was a payload,
//!   errs by that much more), M = |d·s| + |r·x(·x)|.
//! - `adam_update`: `w·c − a·m / (√v / c₂ + ε)`: the quotient q carries √v, the division by
//!   c₂, the addition of ε (two non-negative terms: no cancellation, so the denominator's
//!   relative error stays that of its parts), a·m and the division: six roundings on q, one
//!   on w·c, one for the difference: K = 8, M = |w·c| + |q|. The argument needs v ≥ 0, c₂ >
//!   0 and ε ≥ 0 (Adam's own values); outside that domain B = 0 (only the f32 formula's value
//!   or a matching class is accepted).
//! - `adam_step`, per parameter element with gᵢ = g + w·l2 (two roundings, |error| ≤ γ₂·G,
//!   G = |g| + |w·l2|): m′ as `ema_update` with gᵢ, K = 6 + 2 → 8 on M = |β₁m| + |w₁|·G;
//!   v′ with gᵢ·gᵢ (its relative error doubled), K = 10 on M = |β₂v| + |w₂|·G²; w′ as
//!   `adam_update` of (w, m′, v′) — the result's own m′ and v′, each held to its bound above:
//!   the three per-parameter ops' guarantees chained, as `strict_native_cpu` checks them
//!   when they run apart.
//!
//! The f64 spec's own error (a few ulps of f64 on M) is covered by a relative slack of 2⁻⁴⁰
//! of M. The verdict is per element, so it decomposes over tiles (`runtime/tiled.rs`).
//!
//! The per-element rule and its walk are `rounded.rs`'s (`accepts`, `first_outside`): every
//! call is first compared with the f32 formula over whole slices (vectorized); only a call
//! with some other element is walked element by element.

use super::recompute::dense_values;
use super::rounded::{accepts, first_outside, Outside};
use super::unary::exactly_parts;
use crate::backend::Call;
use crate::graph::Op;
use crate::spec::{
    adam_constants, adam_step_constants, adam_step_value, adam_value, ema_value, infer_shape,
};

const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The smallest positive f32 (2⁻¹⁴⁹): twice the absolute error of one rounding into the
/// subnormal range.
const TINY: f64 = 1.401_298_464_324_817e-45;
/// The f64 spec's own error, relative to the sum of magnitudes.
const SPEC_SLACK: f64 = 1.0 / (1u64 << 40) as f64;

fn gamma(k: u32) -> f64 {
    let ku = k as f64 * U;
    ku / (1.0 - ku)
}

/// The bound for `k` roundings over terms of magnitude sum `m`.
fn bound(k: u32, m: f64) -> f64 {
    (gamma(k) + SPEC_SLACK) * m + k as f64 * TINY
}

/// The rejection of element `i` of `part`.
fn rejected(part: &str, i: usize, got: f32, f32v: f32, want: f64, b: f64) -> String {
    format!(
        "{part} element {i} is {got:e}: the spec gives {want:e} (its f32 formula {f32v:e}); allowed {b:e} per element (the rounding of the formula's terms)"
    )
}

/// The verdict on a map's result from its first element outside the bound.
fn verdict<const K: usize>(outside: Option<Outside<K>>) -> Result<(), String> {
    match outside {
        None => Ok(()),
        Some(o) => Err(rejected("result", o.i, o.got, o.f32v, o.want, o.bound)),
    }
}

/// `ema_update`'s element bound: K = 6 on |d·s| + |r·x(·x)|.
fn ema_bound(decay: f64, weight: f64, square: bool, s: f64, x: f64) -> f64 {
    let xx = if square { x * x } else { x };
    bound(6, (decay * s).abs() + (weight * xx).abs())
}

/// `adam_update`'s element bound on (w, m, v): K = 8 on |w·c| + |q|; 0 outside the domain
/// of the argument (v ≥ 0, c₂ > 0, ε ≥ 0).
fn adam_bound([step, c2, eps, shrink]: [f64; 4], w: f64, m: f64, v: f64) -> f64 {
    if !(v >= 0.0 && c2 > 0.0 && eps >= 0.0) {
        return 0.0;
    }
    let q = step * m / (v.sqrt() / c2 + eps);
    bound(8, (w * shrink).abs() + q.abs())
}

/// The verdict on a call of an optimizer update; `None` for another op.
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if !matches!(
        op,
        Op::EmaUpdate { .. } | Op::AdamUpdate { .. } | Op::AdamStep { .. }
    ) {
        return None;
    }
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    let want_shape = match infer_shape(op, &shapes) {
        Ok(s) => s,
        Err(e) => return Some(Err(format!("the spec refuses the call: {e}"))),
    };
    if want_shape.as_slice() != call.output.shape {
        return Some(Err(format!(
            "result shape {:?}, the spec gives {want_shape:?}",
            call.output.shape
        )));
    }
    let xs: Vec<_> = call.inputs.iter().map(dense_values).collect();
    let y = dense_values(&call.output);
    let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
    if matches!(op, Op::AdamStep { .. }) {
        return Some(adam_step(op, &xs, &y));
    }
    if xs.iter().any(|x| x.len() != y.len()) {
        return Some(Err("operands and result of different lengths".into()));
    }
    Some(match *op {
        // `square` as a constant, so that the f32 comparison's loop has no branch
        Op::EmaUpdate {
            decay,
            weight,
            square,
        } if square => ema::<true>((decay, weight), [xs[0], xs[1]], &y),
        Op::EmaUpdate { decay, weight, .. } => ema::<false>((decay, weight), [xs[0], xs[1]], &y),
        Op::AdamUpdate { .. } => {
            let (c32, c64) = (adam_constants::<f32>(op)?, adam_constants::<f64>(op)?);
            verdict(first_outside(
                [xs[0], xs[1], xs[2]],
                &y,
                |[w, m, v]| adam_value(c32, w, m, v),
                |[w, m, v]| (adam_value(c64, w, m, v), adam_bound(c64, w, m, v)),
            ))
        }
        _ => return None,
    })
}

/// `ema_update` (`SQUARE`: of x·x) against its bound.
fn ema<const SQUARE: bool>(
    (decay, weight): (f32, f32),
    xs: [&[f32]; 2],
    y: &[f32],
) -> Result<(), String> {
    let (d64, r64) = (decay as f64, weight as f64);
    verdict(first_outside(
        xs,
        y,
        |[s, x]| ema_value(decay, weight, SQUARE, s, x),
        |[s, x]| {
            (
                ema_value(d64, r64, SQUARE, s, x),
                ema_bound(d64, r64, SQUARE, s, x),
            )
        },
    ))
}

/// `adam_step`: per parameter, the three parts against their bounds (module doc).
fn adam_step(op: &Op, xs: &[&[f32]], y: &[f32]) -> Result<(), String> {
    let (Some(c32), Some(c64)) = (
        adam_step_constants::<f32>(op),
        adam_step_constants::<f64>(op),
    ) else {
        return Err("not an adam_step payload".into());
    };
    let ([b1, w1, b2, w2, l2], ac) = c64;
    let mut at = 0;
    for (p, group) in xs.chunks(4).enumerate() {
        let n = group[0].len();
        if group.len() != 4 || group.iter().any(|x| x.len() != n) || y.len() < at + 3 * n {
            return Err(format!(
                "parameter {p}: operands and result of different lengths"
            ));
        }
        let parts = [
            &y[at..at + n],
            &y[at + n..at + 2 * n],
            &y[at + 2 * n..at + 3 * n],
        ];
        let xs4 = [group[0], group[1], group[2], group[3]];
        let f32v = |[w, m, v, g]: [f32; 4]| adam_step_value(c32, w, m, v, g);
        if !exactly_parts(xs4, parts, f32v) {
            let outside = (0..n).find_map(|i| {
                let x = [xs4[0][i], xs4[1][i], xs4[2][i], xs4[3][i]];
                let [w, m, v, g] = x.map(f64::from);
                let fv = f32v(x);
                let gi = if l2 != 0.0 { g + w * l2 } else { g };
                let big_g = g.abs() + (w * l2).abs();
                // m′ and v′ against the spec at f64
                let m1 = ema_value(b1, w1, false, m, gi);
                let v1 = ema_value(b2, w2, true, v, gi);
                let bm = bound(8, (b1 * m).abs() + (w1 * big_g).abs());
                let bv = bound(10, (b2 * v).abs() + (w2 * big_g * big_g).abs());
                let (gm, gv) = (parts[1][i], parts[2][i]);
                if !accepts(gm, fv[1], m1, bm) {
                    return Some(rejected(
                        &format!("parameter {p}: m′"),
                        i,
                        gm,
                        fv[1],
                        m1,
                        bm,
                    ));
                }
                if !accepts(gv, fv[2], v1, bv) {
                    return Some(rejected(
                        &format!("parameter {p}: v′"),
                        i,
                        gv,
                        fv[2],
                        v1,
                        bv,
                    ));
                }
                // w′ as adam_update of (w, m′, v′): the result's own moments
                let (gm, gv) = (gm as f64, gv as f64);
                let want = adam_value(ac, w, gm, gv);
                let b = adam_bound(ac, w, gm, gv);
                let gw = parts[0][i];
                (!accepts(gw, fv[0], want, b))
                    .then(|| rejected(&format!("parameter {p}: w′"), i, gw, fv[0], want, b))
            });
            if let Some(reason) = outside {
                return Err(reason);
            }
        }
        at += 3 * n;
    }
    if at == y.len() {
        Ok(())
    } else {
        Err(format!(
            "the result has {} elements, the parameters {at}",
            y.len()
        ))
    }
}
