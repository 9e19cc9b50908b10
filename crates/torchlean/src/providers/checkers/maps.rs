//! The recompute check of the binary maps (`add`, `sub`, `mul`, `div`, `maximum`,
//! `minimum`) whose operands all have the output's shape, and of the reductions' fast paths,
//! over dense slices, as `unary.rs` does for the unary maps. (The optimizer maps have their
//! own per-element check: `optim.rs`.)
//!
//! Each output is recomputed with the spec's own scalar formula (`spec::binary`) at f64 and
//! compared through a [`Tally`]; one match arm per variant specializes the formula, so the
//! loop runs without a per-element match. The values are the spec's exactly, so the verdict
//! is the whole-call check's (an element the tally does not accept goes to the whole-call
//! check, which words the rejection).
//!
//! First, every result is compared with the same formula evaluated in f32 ([`exactly`]):
//! one correctly rounded f32 operation, that value is within 2^-24 relative of the exact one
//! (or overflows where the spec at f32 does), so the tally would accept it: the same
//! verdict, as ReLU's exact path (`unary.rs`).

use super::pieces::Tally;
use super::unary::{exactly, over_parts, CHUNK};
use crate::backend::Call;
use crate::graph::Op;
use crate::spec::{binary, binary_partials};

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

/// The tally of the call's result, when `op` is one of this module's maps and every operand
/// is dense with the output's shape; `None` otherwise (another path decides).
pub(super) fn forward(op: &Op, call: &Call) -> Option<Tally> {
    let y = &call.output;
    if call.inputs.iter().any(|x| x.shape != y.shape) {
        return None;
    }
    let dense = super::recompute::dense_slice;
    let xs: Vec<&[f32]> = call.inputs.iter().map(dense).collect::<Option<_>>()?;
    let y = dense(y)?;
    if xs.iter().any(|x| x.len() != y.len()) {
        return None;
    }
    // each arm: the f32 evaluation first (see the module doc), then the f64 tally
    macro_rules! check {
        ($k:literal, $f32:expr, $f64:expr) => {{
            let xs = <[&[f32]; $k]>::try_from(xs.as_slice()).ok()?;
            if exactly(xs, y, $f32) {
                return Some(Tally::default());
            }
            Some(tally(xs, y, $f64))
        }};
    }
    macro_rules! binary_map {
        ($op:expr) => {
            check!(
                2,
                |[a, b]: [f32; 2]| binary(&$op, a, b),
                |[a, b]: [f64; 2]| binary(&$op, a, b)
            )
        };
    }
    match *op {
        Op::Add => binary_map!(Op::Add),
        Op::Sub => binary_map!(Op::Sub),
        Op::Mul => binary_map!(Op::Mul),
        Op::Div => binary_map!(Op::Div),
        Op::Maximum => binary_map!(Op::Maximum),
        Op::Minimum => binary_map!(Op::Minimum),
        _ => None,
    }
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
                    tally([a, b, gy], g, |[x, y, c]| c * binary_partials(op, x, y).0)
                } else {
                    tally([a, b, gy], g, |[x, y, c]| c * binary_partials(op, x, y).1)
                });
            }
            None if call.needs.get(i) != Some(&true) => {}
            _ => return None,
        }
    }
    Some(tallies)
}
