//! `conv2d_map`: a conv2d followed by an epilogue of elementwise steps over its result (the
//! steps of a `fused_map`, limited to `add`, `sub` and `mul` with a side input and `relu`).
//! Its meaning is the composition of its two parts, so the shape rule, the forward and the
//! VJP are those of `conv2d` and of `fused_map`, applied one after the other (the VJP
//! recomputes the conv's result and runs the parts' VJPs backwards).
//!
//! The steps are limited so that the replay checker can bound how an error of the conv's sums
//! reaches the result (each step is 1-Lipschitz or scales by its side value): see
//! [`cancellation_allowance`].

use super::{expect_arity, payload_err, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::{FusedStep, Op, OpKind};
use crate::scalar::Scalar;

/// The two parts of `op`: the conv2d, and the fused map over its result.
pub(crate) fn parts(op: &Op) -> (Op, Op) {
    match op {
        Op::Conv2dMap { geometry, steps } => (
            Op::Conv2d(*geometry),
            Op::FusedMap {
                steps: steps.clone(),
            },
        ),
        _ => unreachable!("not a conv2d_map op: {}", op.name()),
    }
}

/// Whether `step` may be a step of a `conv2d_map` epilogue.
pub fn is_epilogue_step(step: &FusedStep) -> bool {
    match step.side {
        Some(_) => matches!(step.op.kind(), OpKind::Add | OpKind::Sub | OpKind::Mul),
        None => step.op.kind() == OpKind::Relu,
    }
}

/// The number of the conv's inputs among `n` inputs of `op` (2, or 3 with a bias).
fn conv_inputs(op: &Op, n: usize) -> usize {
    let sides = match op {
        Op::Conv2dMap { steps, .. } => super::fused_map_sides(steps),
        _ => 0,
    };
    n.saturating_sub(sides)
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let Op::Conv2dMap { steps, .. } = op else {
        unreachable!("not a conv2d_map op: {}", op.name())
    };
    if let Some(bad) = steps.iter().find(|s| !is_epilogue_step(s)) {
        return Err(payload_err(
            op,
            format!(
                "step `{}`{} is not an epilogue step: add, sub or mul with a side input, or relu without one",
                bad.op.name(),
                if bad.side.is_some() { " with a side input" } else { "" }
            ),
        ));
    }
    let sides = super::fused_map_sides(steps);
    expect_arity(op, shapes, &[2 + sides, 3 + sides])?;
    let (conv, map) = parts(op);
    let k = conv_inputs(op, shapes.len());
    let z = super::infer_shape(&conv, &shapes[..k])
        .map_err(|e| shape_err(op, shapes, format!("a valid conv2d: {e}")))?;
    let mut map_shapes: Vec<&[usize]> = vec![&z];
    map_shapes.extend_from_slice(&shapes[k..]);
    super::infer_shape(&map, &map_shapes)
        .map_err(|e| shape_err(op, shapes, format!("a valid epilogue: {e}")))
}

/// The conv's result.
fn conv_value<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Result<Array<T>, OpError> {
    let k = conv_inputs(op, inputs.len());
    super::forward(&parts(op).0, &inputs[..k])
}

pub(super) fn forward<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Result<Array<T>, OpError> {
    let z = conv_value(op, inputs)?;
    let k = conv_inputs(op, inputs.len());
    let mut map_inputs = vec![&z];
    map_inputs.extend_from_slice(&inputs[k..]);
    super::forward(&parts(op).1, &map_inputs)
}

pub(super) fn vjp<T: Scalar>(
    op: &Op,
    inputs: &[&Array<T>],
    grad_out: &Array<T>,
) -> Result<InputGrads<T>, OpError> {
    let (conv, map) = parts(op);
    let k = conv_inputs(op, inputs.len());
    let z = super::forward(&conv, &inputs[..k])?;
    let mut map_inputs = vec![&z];
    map_inputs.extend_from_slice(&inputs[k..]);
    let y = super::forward(&map, &map_inputs)?;
    let mut map_grads = super::vjp(&map, &map_inputs, &y, grad_out)?.into_iter();
    let gz = map_grads
        .next()
        .flatten()
        .ok_or_else(|| payload_err(op, "the epilogue gives no gradient for the conv's result"))?;
    let conv_grads = super::vjp(&conv, &inputs[..k], &z, &gz)?;
    Ok(conv_grads.into_iter().chain(map_grads).collect())
}

/// `|a|`, elementwise.
fn abs_of(a: &Array<f64>) -> Array<f64> {
    Array {
        shape: a.shape.clone(),
        data: a.data.iter().map(|v| v.abs()).collect(),
    }
}

/// The error a correct f32 kernel may add beyond the replay checkers' relative tolerance:
/// the conv's sums carry up to `γ_{K+1}·(|w|·|x| + |b|)` (K taps per output, any summation
/// order: Higham Thm 3.5), an error that relu and the add and sub steps pass on unchanged and
/// a mul step scales by its side's value; the steps' own roundings are relative to their
/// values and within the tolerance — unless a later add or sub cancels an intermediate much
/// larger than the result, which (as for `fused_map`) can make the check reject a correct
/// kernel, never accept a wrong one. Forward: `[γ_{K+1}·max(|w|·|x| + |b|)·Π max|mul side|]`.
/// VJP: the conv's gradients are products of the cotangent `gz` that reaches the conv (the
/// spec's, at f64) with `|w|` or `|x|` (`γ_{n+1+s}`, n the longest such sum, s the steps:
/// each rounds `gz` once at most); the side inputs' gradients as the fused map's (0).
/// Maxima are over finite values (an element that is ±inf or NaN is compared by its class),
/// and an allowance that is not finite is 0: it can then only reject.
pub(super) fn cancellation_allowance(
    op: &Op,
    inputs: &[&Array<f64>],
    grad_out: Option<&Array<f64>>,
) -> Result<Vec<f64>, OpError> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|a| a.shape.as_slice()).collect();
    super::infer_shape(op, &shapes)?;
    let (conv, map) = parts(op);
    let Op::Conv2dMap { steps, .. } = op else {
        unreachable!("parts checked the op")
    };
    let k = conv_inputs(op, inputs.len());
    let abs: Vec<Array<f64>> = inputs[..k].iter().map(|a| abs_of(a)).collect();
    let abs_refs: Vec<&Array<f64>> = abs.iter().collect();
    let w = &inputs[1].shape;
    let taps = w.get(1..).map_or(0, |s| s.iter().product::<usize>());
    let max = |a: &Array<f64>| {
        a.data
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()))
    };
    let finite_or_zero = |a: f64| if a.is_finite() { a } else { 0.0 };
    match grad_out {
        None => {
            let sums = super::forward(&conv, &abs_refs)?;
            let mut scale = 1.0;
            let mut side = k;
            for s in steps {
                if s.side.is_some() {
                    if s.op.kind() == OpKind::Mul {
                        scale *= max(inputs[side]);
                    }
                    side += 1;
                }
            }
            Ok(vec![finite_or_zero(
                super::norm::gamma32(taps + 1) * max(&sums) * scale,
            )])
        }
        Some(g) => {
            let z = super::forward(&conv, &inputs[..k])?;
            let mut map_inputs = vec![&z];
            map_inputs.extend_from_slice(&inputs[k..]);
            let y = super::forward(&map, &map_inputs)?;
            let gz = super::vjp(&map, &map_inputs, &y, g)?
                .into_iter()
                .next()
                .flatten()
                .ok_or_else(|| payload_err(op, "the epilogue gives no gradient"))?;
            let sums = super::vjp(&conv, &abs_refs, &z, &abs_of(&gz))?;
            let z_shape = &z.shape;
            let positions = z_shape.first().copied().unwrap_or(1)
                * z_shape.get(2..).map_or(1, |s| s.iter().product::<usize>());
            let per_input = z_shape.get(1).copied().unwrap_or(1)
                * w.get(2..).map_or(1, |s| s.iter().product::<usize>());
            let gamma = super::norm::gamma32(positions.max(per_input) + 1 + steps.len());
            Ok(sums
                .iter()
                .map(|s| s.as_ref().map_or(0.0, |s| finite_or_zero(gamma * max(s))))
                .chain(std::iter::repeat(0.0))
                .take(inputs.len())
                .collect())
        }
    }
}
