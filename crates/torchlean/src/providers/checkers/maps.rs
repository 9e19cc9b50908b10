//! Fast recompute paths over dense slices: the VJPs of the binary maps and `mse_loss` whose
//! operands all have the output's shape, and the reductions' forward (`reduction_forward`).
//! (The binary maps' forward is checked per element in `rounded.rs`, the optimizer maps' in
//! `optim.rs`.)
//!
//! Each value is recomputed with the spec's own scalar formula at f64 and compared through a
//! [`Tally`]; one match arm per variant specializes the formula, so the loop runs without a
//! per-element match. The values are the spec's exactly, so the verdict is the whole-call
//! check's (an element the tally does not accept goes to the whole-call check, which words
//! the rejection).

use super::pieces::Tally;
use super::unary::{exactly, over_parts, CHUNK};
use crate::backend::Call;
use crate::graph::Op;
use crate::spec::binary_grads;

/// The tally of `y` against `want(x, y)` of the inputs `xs` (all of `y`'s length), element
/// by element.
fn tally_with<const K: usize>(
    xs: [&[f32]; K],
    y: &[f32],
    want: impl Fn([f32; K], f32) -> f64 + Sync,
) -> Tally {
    over_parts(y.len(), |lo, hi| {
        let mut t = Tally::default();
        let mut refs = [0.0f64; CHUNK];
        let mut at = lo;
        for yc in y[lo..hi].chunks(CHUNK) {
            let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][at..at + yc.len()]);
            for (j, w) in refs[..yc.len()].iter_mut().enumerate() {
                *w = want(std::array::from_fn(|k| src[k][j]), yc[j]);
            }
            t.feed(yc, &refs[..yc.len()]);
            at += yc.len();
        }
        t
    })
}

/// The tally of `y` against `f` of the inputs `xs` at f64.
fn tally<const K: usize>(xs: [&[f32]; K], y: &[f32], f: impl Fn([f64; K]) -> f64 + Sync) -> Tally {
    tally_with(xs, y, |x, _| f(x.map(|v| v as f64)))
}

/// The tallies of a VJP call's gradients, for the ops whose VJP is an elementwise map of
/// same-shaped operands: the binary maps (`ga = gy·∂a`, `gb = gy·∂b` with the spec's
/// partials, [`binary_vjp`]) and `mse_loss` (`ga = 2·gy/n · (a − b)`, `gb = −ga`, the spec's
/// expressions in its order). `None` when another path decides: another op, an operand that
/// is not dense, or a gradient missing (the whole-call check words that rejection).
pub(super) fn vjp(op: &Op, call: &Call) -> Option<Vec<Tally>> {
    if op.kind().is_binary_map() {
        return binary_vjp(op, call);
    }
    if !matches!(op, Op::MseLoss) || call.inputs.len() != 2 || call.grads.len() != 2 {
        return None;
    }
    let dense = super::recompute::dense_slice;
    let (a, b) = (dense(&call.inputs[0])?, dense(&call.inputs[1])?);
    let gy = dense(call.cotangent.as_ref()?)?;
    if a.len() != b.len() || gy.len() != 1 || call.inputs[0].shape != call.inputs[1].shape {
        return None;
    }
    let scale = 2.0 * gy[0] as f64 / a.len() as f64;
    let mut tallies = Vec::with_capacity(2);
    for (i, g) in call.grads.iter().enumerate() {
        match g {
            Some(g) if g.shape == call.inputs[i].shape => {
                let g = dense(g)?;
                // gb = −ga: the sign flip is exact
                let sign = if i == 0 { 1.0 } else { -1.0 };
                tallies.push(tally([a, b], g, |[x, y]| sign * (scale * (x - y))));
            }
            None if call.needs.get(i) != Some(&true) => {}
            _ => return None,
        }
    }
    Some(tallies)
}

/// The tally of an `mse_loss` result: Σ(a − b)²/n at f64 in the spec's order (a sequential
/// sum), streamed over the two dense operands without f64 copies. `None` for other ops or
/// operands that are not dense and same-shaped.
pub(super) fn reduction_forward(op: &Op, call: &Call) -> Option<Tally> {
    if !matches!(op, Op::MseLoss) || call.inputs.len() != 2 {
        return None;
    }
    let dense = super::recompute::dense_slice;
    let (a, b, y) = (
        dense(&call.inputs[0])?,
        dense(&call.inputs[1])?,
        dense(&call.output)?,
    );
    if call.inputs[0].shape != call.inputs[1].shape || a.len() != b.len() || y.len() != 1 {
        return None;
    }
    let s: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &z)| (x as f64 - z as f64) * (x as f64 - z as f64))
        .sum();
    let mut t = Tally::default();
    t.feed(y, &[s / a.len() as f64]);
    Some(t)
}

/// [`vjp`] of a binary map whose operands and cotangent all have one shape (no broadcast, so
/// no sum over broadcast axes): each gradient element is the spec's `gy · partial(a, b)`.
fn binary_vjp(op: &Op, call: &Call) -> Option<Vec<Tally>> {
    let dense = super::recompute::dense_slice;
    let gy_op = call.cotangent.as_ref()?;
    if call.inputs.len() != 2
        || call.grads.len() != 2
        || call.inputs.iter().any(|x| x.shape != gy_op.shape)
    {
        return None;
    }
    let (a, b, gy) = (
        dense(&call.inputs[0])?,
        dense(&call.inputs[1])?,
        dense(gy_op)?,
    );
    if a.len() != gy.len() || b.len() != gy.len() {
        return None;
    }
    // add and sub: the partials are ±1, so the spec's gradient is ±gy exactly in both
    // precisions; a gradient equal to it (==) has error 0
    let sign = |i: usize| match (op, i) {
        (Op::Add, _) | (Op::Sub, 0) => Some(1.0f32),
        (Op::Sub, _) => Some(-1.0f32),
        _ => None,
    };
    let mut tallies = Vec::with_capacity(2);
    for (i, g) in call.grads.iter().enumerate() {
        match g {
            Some(g) if g.shape == gy_op.shape => {
                let g = dense(g)?;
                if g.len() != gy.len() {
                    return None;
                }
                if let Some(s) = sign(i) {
                    if exactly([gy], g, |[c]: [f32; 1]| s * c) {
                        tallies.push(Tally::default());
                        continue;
                    }
                }
                tallies.push(if i == 0 {
                    tally([a, b, gy], g, |[x, y, c]| binary_grads(op, x, y, c).0)
                } else {
                    tally([a, b, gy], g, |[x, y, c]| binary_grads(op, x, y, c).1)
                });
            }
            None if call.needs.get(i) != Some(&true) => {}
            _ => return None,
        }
    }
    Some(tallies)
}
