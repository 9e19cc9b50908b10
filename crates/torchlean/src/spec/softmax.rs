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

/// The error a correct f32 VJP kernel may add to the input gradient beyond a tolerance
/// relative to that gradient, from the cotangent's cancellation (forty-fifth session's audit:
/// a cotangent with a large common offset — a constant 1e6 — or a long row made the check
/// reject a correct kernel). Per row of n entries, with p = softmax(x):
/// - softmax, gx = p·(g − Σ g·p): Σ g·p errs by γ_n·Σ|g|·p (Higham Thm 3.5), the difference by
///   u·(|g| + |Σ g·p|), the product and p itself by a few more roundings: within
///   γ_{n+4}·max p·(max|g| + Σ|g|·p);
/// - log_softmax, gx = g − e^y·Σ g: Σ g errs by γ_n·Σ|g|, e^y by a few roundings relative,
///   the difference by u·(|g| + p·|Σ g|): within γ_{n+4}·(max|g| + max p·Σ|g|).
///
/// The maximum over rows, doubled for the order of evaluation. Finite calls only (the caller
/// checks).
pub(super) fn cancellation_allowance(op: &Op, x: &Array<f64>, gy: &Array<f64>) -> f64 {
    if gy.shape != x.shape {
        return 0.0;
    }
    let p = forward(&Op::Softmax { axis: axis_of(op) }, x);
    let (outer, dim, inner) = split_at_axis(&x.shape, axis_of(op));
    let log = matches!(op, Op::LogSoftmax { .. });
    let gamma = super::gamma32(dim + 4);
    let mut a = 0.0f64;
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * dim * inner + j * inner + i;
            let (mut max_p, mut max_g, mut sum_g, mut sum_gp) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for j in 0..dim {
                let (g, q) = (gy.data[at(j)].abs(), p.data[at(j)]);
                max_p = max_p.max(q);
                max_g = max_g.max(g);
                sum_g += g;
                sum_gp += g * q;
            }
            let row = if log {
                max_g + max_p * sum_g
            } else {
                max_p * (max_g + sum_gp)
            };
            a = a.max(2.0 * gamma * row);
        }
    }
    if a.is_finite() {
        a
    } else {
        0.0
    }
}
