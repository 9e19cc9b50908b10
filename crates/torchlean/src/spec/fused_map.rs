//! `fused_map`: a chain of elementwise steps over one value, its side operands broadcast
//! onto the value's shape. Its meaning is the composition of its parts, so the shape rule,
//! the forward and the VJP are those of the parts, applied step by step (the VJP recomputes
//! the intermediate values and runs the parts' VJPs backwards).

use super::{expect_arity, payload_err, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::{FusedStep, Op, SideOperand};
use crate::scalar::Scalar;

fn steps(op: &Op) -> &[FusedStep] {
    match op {
        Op::FusedMap { steps } => steps,
        _ => unreachable!("not a fused_map op: {}", op.name()),
    }
}

/// The number of side inputs `steps` reads (one per binary step).
pub fn side_count(steps: &[FusedStep]) -> usize {
    steps.iter().filter(|s| s.side.is_some()).count()
}

/// The operands of a binary step in its order: the running value and the side input.
fn ordered<'a, T>(side: SideOperand, value: &'a T, other: &'a T) -> [&'a T; 2] {
    match side {
        SideOperand::Right => [value, other],
        SideOperand::Left => [other, value],
    }
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let steps = steps(op);
    if steps.is_empty() {
        return Err(payload_err(op, "a fused map needs at least one step"));
    }
    expect_arity(op, shapes, &[1 + side_count(steps)])?;
    let value = shapes[0];
    let mut sides = shapes[1..].iter();
    for step in steps {
        let kind = step.op.kind();
        match step.side {
            None if kind.is_unary_map() => {
                super::infer_shape(&step.op, &[value]).map_err(|e| in_step(op, shapes, e))?;
            }
            Some(side) if kind.is_binary_map() => {
                // invariant: the arity check above gave one shape per side step
                let s = sides.next().expect("one side input per binary step");
                let out = super::infer_shape(&step.op, &ordered(side, &value, s).map(|x| *x))
                    .map_err(|e| in_step(op, shapes, e))?;
                if out != value {
                    return Err(shape_err(
                        op,
                        shapes,
                        format!(
                            "side inputs that broadcast onto the value's shape {value:?} \
                             (`{}` with a side of shape {s:?} gives {out:?})",
                            step.op.name()
                        ),
                    ));
                }
            }
            _ => {
                return Err(payload_err(
                    op,
                    format!(
                        "step `{}` must be a unary map without a side input or a binary map \
                         (add, sub, mul, div, maximum, minimum) with one",
                        step.op.name()
                    ),
                ))
            }
        }
    }
    Ok(value.to_vec())
}

/// A step's shape error as the fused op's (it names the fused op, the step and why).
fn in_step(op: &Op, shapes: &[&[usize]], e: OpError) -> OpError {
    shape_err(op, shapes, format!("steps whose shapes are valid: {e}"))
}

/// The value after each step: `values[0]` is the input, `values[i + 1]` step i's result.
fn values<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Result<Vec<Array<T>>, OpError> {
    let mut values = vec![inputs[0].clone()];
    let mut sides = inputs[1..].iter();
    for step in steps(op) {
        // invariant: the last value exists (the input at least)
        let v = values.last().expect("the input is the first value");
        let next = match step.side {
            None => super::forward(&step.op, &[v])?,
            Some(side) => {
                let s = sides
                    .next()
                    .ok_or_else(|| payload_err(op, "missing side input"))?;
                super::forward(&step.op, &ordered(side, v, *s))?
            }
        };
        values.push(next);
    }
    Ok(values)
}

pub(super) fn forward<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Result<Array<T>, OpError> {
    let mut values = values(op, inputs)?;
    // invariant: `values` holds the input and one value per step
    Ok(values.pop().expect("at least the input"))
}

pub(super) fn vjp<T: Scalar>(
    op: &Op,
    inputs: &[&Array<T>],
    grad_out: &Array<T>,
) -> Result<InputGrads<T>, OpError> {
    let steps = steps(op);
    let values = values(op, inputs)?;
    let mut side_grads: Vec<Option<Array<T>>> = vec![None; inputs.len() - 1];
    let mut side = side_count(steps);
    let mut g = grad_out.clone();
    for (i, step) in steps.iter().enumerate().rev() {
        let (x, y) = (&values[i], &values[i + 1]);
        match step.side {
            None => {
                let mut grads = super::vjp(&step.op, &[x], y, &g)?;
                g = grads
                    .swap_remove(0)
                    .ok_or_else(|| payload_err(op, "no gradient"))?;
            }
            Some(at) => {
                side -= 1;
                let s = inputs[1 + side];
                let grads = super::vjp(&step.op, &ordered(at, x, s), y, &g)?;
                let [a, b]: [Option<Array<T>>; 2] = grads
                    .try_into()
                    .map_err(|_| payload_err(op, "a binary step gives two gradients"))?;
                let (gv, gs) = match at {
                    SideOperand::Right => (a, b),
                    SideOperand::Left => (b, a),
                };
                side_grads[side] = gs;
                g = gv.ok_or_else(|| payload_err(op, "no gradient"))?;
            }
        }
    }
    Ok(std::iter::once(Some(g)).chain(side_grads).collect())
}
