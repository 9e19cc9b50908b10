//! `softmax` and `log_softmax` along one axis (max-shifted for stability).
//!
//! As PyTorch's: a row holding NaN is all NaN; a row holding +inf, or all -inf, is all NaN
//! (inf - inf in the shift).

use super::array::split_at_axis;
use super::{expect_arity, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::{max_of, Scalar};

fn axis_of(op: &Op) -> usize {
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => *axis,
        _ => unreachable!("softmax::axis_of called for {}", op.name()),
    }
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[1])?;
    let axis = axis_of(op);
    if axis >= shapes[0].len() {
        return Err(shape_err(
            op,
            shapes,
            format!("a tensor with more than {axis} axes (axis {axis})"),
        ));
    }
    Ok(shapes[0].to_vec())
}

pub(super) fn forward<T: Scalar>(op: &Op, x: &Array<T>) -> Array<T> {
    let (outer, dim, inner) = split_at_axis(&x.shape, axis_of(op));
    let log = matches!(op, Op::LogSoftmax { .. });
    let mut y = Array::zeros(&x.shape);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * dim * inner + j * inner + i;
            let m = max_of((0..dim).map(|j| x.data[at(j)]));
            let z: T = super::sum::sum((0..dim).map(|j| (x.data[at(j)] - m).exp()));
            for j in 0..dim {
                y.data[at(j)] = if log {
                    x.data[at(j)] - m - z.ln()
                } else {
                    (x.data[at(j)] - m).exp() / z
                };
            }
        }
    }
    y
}

pub(super) fn vjp<T: Scalar>(op: &Op, y: &Array<T>, gy: &Array<T>) -> InputGrads<T> {
    let (outer, dim, inner) = split_at_axis(&y.shape, axis_of(op));
    let log = matches!(op, Op::LogSoftmax { .. });
    let mut gx = Array::zeros(&y.shape);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * dim * inner + j * inner + i;
            if log {
                // d/dx = gy - softmax * sum(gy)
                let s: T = super::sum::sum((0..dim).map(|j| gy.data[at(j)]));
                for j in 0..dim {
                    gx.data[at(j)] = gy.data[at(j)] - y.data[at(j)].exp() * s;
                }
            } else {
                // d/dx = y * (gy - sum(gy * y))
                let s: T = super::sum::sum((0..dim).map(|j| gy.data[at(j)] * y.data[at(j)]));
                for j in 0..dim {
                    gx.data[at(j)] = y.data[at(j)] * (gy.data[at(j)] - s);
                }
            }
        }
    }
    vec![Some(gx)]
}
