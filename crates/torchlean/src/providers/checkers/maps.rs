//! The recompute check of the elementwise maps whose operands all have the output's shape —
//! the binary maps (`add`, `sub`, `mul`, `div`, `maximum`, `minimum`) and the optimizer maps
//! (`ema_update`, `adam_update`, and `adam_step`, their fusion over several parameters) —
//! over dense slices, as `unary.rs` does for the unary maps.
//!
//! Each output is recomputed with the spec's own scalar formula (`spec::binary`,
//! `spec::ema_value`, `spec::adam_value`) at f64 and compared through a [`Tally`]; one match
//! arm per variant specializes the formula, so the loop runs without a per-element match.
//! The values are the spec's exactly, so the verdict is the whole-call check's (an element
//! the tally does not accept goes to the whole-call check, which words the rejection).
//!
//! First, every result is compared with the same formula evaluated in f32, in the spec's
//! written order ([`exactly`]); when all are bit-identical the call is accepted without the
//! f64 pass:
//! - for a binary map, one correctly rounded f32 operation, that value is within 2^-24
//!   relative of the exact one (or overflows where the spec at f32 does), so the tally would
//!   accept it: the same verdict, as ReLU's exact path (`unary.rs`);
//! - for `ema_update` and `adam_update` it is the spec's own formula instantiated at f32 —
//!   the reference provider's value, bit for bit — which their declared bound admits
//!   besides the f64 tolerance (`replay::FORWARD_SOUNDNESS`, docs/assurance.md): an
//!   optimizer's update is defined as f32 arithmetic in this order, as `torch.optim`'s loops.
//!   A result that differs in any bit is held to the f64 tolerance.
//!
//! Before this path these calls went through the piecewise spec evaluation (an f64 array per
//! piece and operand): about 3.6 ns per element of an optimizer update on this machine.

use super::pieces::Tally;
use super::unary::{exactly, exactly_parts, over_parts, CHUNK};
use crate::backend::Call;
use crate::graph::Op;
use crate::spec::{
    adam_constants, adam_step_constants, adam_step_value, adam_value, binary, binary_partials,
    ema_value,
};

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

/// [`tally`] for the optimizer maps, whose declared bound is per element: an element equal
/// to the spec's formula evaluated in f32 is compared with itself (error 0), any other with
/// the f64 spec. So a call is accepted when each element is the f32 formula's value or
/// within the tolerance of the f64 spec — a verdict that decomposes over parts of the call
/// (runtime/tiled.rs): the f32 formula's own rounding can exceed the tolerance where its
/// terms cancel, and a whole-call "all bit-identical, or all within tolerance" would reject
/// a call whose parts are each accepted.
fn tally_either<const K: usize>(
    xs: [&[f32]; K],
    y: &[f32],
    f32_formula: impl Fn([f32; K]) -> f32 + Sync,
    f64_formula: impl Fn([f64; K]) -> f64 + Sync,
) -> Tally {
    tally_with(xs, y, |x, got| {
        if f32_formula(x) == got {
            got as f64
        } else {
            f64_formula(x.map(|v| v as f64))
        }
    })
}

/// The tally of the call's result, when `op` is one of this module's maps and every operand
/// is dense with the output's shape; `None` otherwise (another path decides).
pub(super) fn forward(op: &Op, call: &Call) -> Option<Tally> {
    if matches!(op, Op::AdamStep { .. }) {
        return adam_step(op, call);
    }
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
    // the optimizer maps: the f32 formula's value or the f64 tolerance, element by element
    macro_rules! check_either {
        ($k:literal, $f32:expr, $f64:expr) => {{
            let xs = <[&[f32]; $k]>::try_from(xs.as_slice()).ok()?;
            if exactly(xs, y, $f32) {
                return Some(Tally::default());
            }
            Some(tally_either(xs, y, $f32, $f64))
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
        Op::EmaUpdate { decay, square } => {
            let (d32, d64) = (decay, decay as f64);
            if square {
                check_either!(
                    2,
                    |[s, x]: [f32; 2]| ema_value(d32, true, s, x),
                    |[s, x]: [f64; 2]| ema_value(d64, true, s, x)
                )
            } else {
                check_either!(
                    2,
                    |[s, x]: [f32; 2]| ema_value(d32, false, s, x),
                    |[s, x]: [f64; 2]| ema_value(d64, false, s, x)
                )
            }
        }
        Op::AdamUpdate { .. } => {
            let (c32, c64) = (adam_constants::<f32>(op)?, adam_constants::<f64>(op)?);
            check_either!(
                3,
                |[w, m, v]: [f32; 3]| adam_value(c32, w, m, v),
                |[w, m, v]: [f64; 3]| adam_value(c64, w, m, v)
            )
        }
        _ => None,
    }
}

/// The tally of an `adam_step` result: each parameter's `w'`, `m'` and `v'` parts against the
/// spec's values of its `(w, m, v, g)`, element by element the f32 formula's value or the f64
/// spec's tolerance, as the optimizer maps ([`tally_either`]). `None` when an operand is not
/// dense or the call's shapes are not the op's (the whole-call check words that).
fn adam_step(op: &Op, call: &Call) -> Option<Tally> {
    let (c32, c64) = (
        adam_step_constants::<f32>(op)?,
        adam_step_constants::<f64>(op)?,
    );
    let dense = super::recompute::dense_slice;
    let y = dense(&call.output)?;
    if call.inputs.is_empty() || call.inputs.len() % 4 != 0 || call.output.shape.len() != 1 {
        return None;
    }
    let mut tally = Tally::default();
    let mut at = 0;
    for group in call.inputs.chunks(4) {
        if group.iter().any(|x| x.shape != group[0].shape) {
            return None;
        }
        let xs: [&[f32]; 4] = [
            dense(&group[0])?,
            dense(&group[1])?,
            dense(&group[2])?,
            dense(&group[3])?,
        ];
        let n = xs[0].len();
        if xs.iter().any(|x| x.len() != n) || y.len() < at + 3 * n {
            return None;
        }
        let parts = [
            &y[at..at + n],
            &y[at + n..at + 2 * n],
            &y[at + 2 * n..at + 3 * n],
        ];
        // first the f32 formula over the whole parameter: every value bit-identical to it is
        // the verdict the tally below would give (each compared with itself: error 0)
        if exactly_parts(xs, parts, |[w, m, v, g]| adam_step_value(c32, w, m, v, g)) {
            at += 3 * n;
            continue;
        }
        // each element's three values computed once: the f32 formula's where the result
        // equals it (compared with itself), else the f64 spec's (`tally_either`'s rule)
        let t = over_parts(n, |lo, hi| {
            let mut t = Tally::default();
            let mut refs = [[0.0f64; CHUNK]; 3];
            let mut k = lo;
            while k < hi {
                let len = CHUNK.min(hi - k);
                for i in k..k + len {
                    let j = i - k;
                    let x = [xs[0][i], xs[1][i], xs[2][i], xs[3][i]];
                    let narrow = adam_step_value(c32, x[0], x[1], x[2], x[3]);
                    let mut wide = None;
                    for p in 0..3 {
                        refs[p][j] = if narrow[p] == parts[p][i] {
                            narrow[p] as f64
                        } else {
                            wide.get_or_insert_with(|| {
                                let w = x.map(f64::from);
                                adam_step_value(c64, w[0], w[1], w[2], w[3])
                            })[p]
                        };
                    }
                }
                for p in 0..3 {
                    t.feed(&parts[p][k..k + len], &refs[p][..len]);
                }
                k += len;
            }
            t
        });
        tally.merge(&t);
        at += 3 * n;
    }
    (at == y.len()).then_some(tally)
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
