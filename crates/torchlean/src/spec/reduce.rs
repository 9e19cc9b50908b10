//! Reductions: `sum_all` (to a scalar), `reduce_sum`/`reduce_mean` over a set of axes, and the
//! non-differentiable `argmax` (first maximum, as an f32 index).
//!
//! The mean over zero elements is NaN (0/0, IEEE); the sum over zero elements is 0;
//! `argmax` over an empty axis is an error. `argmax` ranks NaN above every number (the first
//! NaN wins), as PyTorch's.

use super::array::{broadcast_to, split_at_axis};
use super::{expect_arity, numel, payload_err, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::{beats_max, Scalar};

fn check_axes(op: &Op, shapes: &[&[usize]], axes: &[usize]) -> Result<(), OpError> {
    let rank = shapes[0].len();
    if axes.is_empty() {
        return Err(payload_err(
            op,
            "axes must not be empty (use sum_all to reduce everything)",
        ));
    }
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(shape_err(
                op,
                shapes,
                format!("a tensor with axis {a} (rank > {a})"),
            ));
        }
        if axes[..i].contains(&a) {
            return Err(payload_err(
                op,
                format!("axis {a} is listed twice in {axes:?}"),
            ));
        }
    }
    Ok(())
}

/// Output shape of reducing `axes` of `shape`.
pub(crate) fn reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate() {
        if axes.contains(&d) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(n);
        }
    }
    out
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[1])?;
    match op {
        Op::SumAll => Ok(vec![]),
        Op::ReduceSum { axes, keepdim } | Op::ReduceMean { axes, keepdim } => {
            check_axes(op, shapes, axes)?;
            Ok(reduced_shape(shapes[0], axes, *keepdim))
        }
        Op::Argmax { axis } => {
            check_axes(op, shapes, &[*axis])?;
            if shapes[0][*axis] == 0 {
                return Err(shape_err(op, shapes, format!("a non-empty axis {axis}")));
            }
            // the index is an f32, exact only up to 2^24: a longer axis would round the
            // index of its last elements (an ONNX argmax written as int64 said so exactly)
            if shapes[0][*axis] > (1 << 24) + 1 {
                return Err(shape_err(
                    op,
                    shapes,
                    format!(
                        "axis {axis} of at most 2^24 + 1 elements (the index is a float32, exact only up to 2^24)"
                    ),
                ));
            }
            Ok(reduced_shape(shapes[0], &[*axis], false))
        }
        _ => unreachable!("reduce::shape called for {}", op.name()),
    }
}

/// Sums `x` over `axes` into `out_shape` (with or without kept dims: same flat layout),
/// each output's terms in flat order, cascaded (`spec::sum`).
fn sum_axes<T: Scalar>(x: &Array<T>, axes: &[usize]) -> Vec<T> {
    let keep = reduced_shape(&x.shape, axes, true);
    let mut out = super::sum::Sums::new(numel(&keep));
    for (i, src) in super::array::broadcast_source_index(&keep, &x.shape)
        .into_iter()
        .enumerate()
    {
        out.add(src, x.data[i]);
    }
    out.totals()
}

pub(super) fn forward<T: Scalar>(op: &Op, x: &Array<T>, out_shape: Vec<usize>) -> Array<T> {
    match op {
        Op::SumAll => Array {
            shape: out_shape,
            data: vec![super::sum::sum(x.data.iter().copied())],
        },
        Op::ReduceSum { axes, .. } => Array {
            shape: out_shape,
            data: sum_axes(x, axes),
        },
        Op::ReduceMean { axes, .. } => {
            let count = T::c(axes.iter().map(|&a| x.shape[a]).product::<usize>() as f64);
            Array {
                shape: out_shape,
                data: sum_axes(x, axes).into_iter().map(|v| v / count).collect(),
            }
        }
        Op::Argmax { axis } => {
            let (outer, dim, inner) = split_at_axis(&x.shape, *axis);
            let mut data = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let mut best = 0;
                    for j in 1..dim {
                        let v = x.data[o * dim * inner + j * inner + i];
                        let b = x.data[o * dim * inner + best * inner + i];
                        if beats_max(v, b) {
                            best = j;
                        }
                    }
                    data.push(T::c(best as f64));
                }
            }
            Array {
                shape: out_shape,
                data,
            }
        }
        _ => unreachable!("reduce::forward called for {}", op.name()),
    }
}

pub(super) fn vjp<T: Scalar>(op: &Op, x: &Array<T>, gy: &Array<T>) -> InputGrads<T> {
    let g = match op {
        Op::SumAll => Array::from_fn(&x.shape, |_| gy.data[0]),
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            let keep = reduced_shape(&x.shape, axes, true);
            let mut g = broadcast_to(&gy.clone().reshaped(&keep), &x.shape);
            if let Op::ReduceMean { .. } = op {
                let count = T::c(axes.iter().map(|&a| x.shape[a]).product::<usize>() as f64);
                g.data.iter_mut().for_each(|v| *v /= count);
            }
            g
        }
        _ => unreachable!("reduce::vjp called for {}", op.name()),
    };
    vec![Some(g)]
}

/// The error a correct f32 kernel may make in a sum that cancels (`sum_all`, `reduce_sum`,
/// `reduce_mean`), beyond a tolerance relative to the result: any summation order of n terms
/// errs by at most γ_{n−1}·Σ|x| (Higham Thm 3.5; a mean divides both sides by n), which
/// exceeds a relative tolerance of the result when the terms are large against their sum.
/// The largest over the outputs; 0 for other ops.
pub fn cancellation_allowance(op: &Op, x: &Array<f64>) -> f64 {
    let out_shape = match op {
        Op::SumAll => vec![],
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            reduced_shape(&x.shape, axes, false)
        }
        _ => return 0.0,
    };
    let n = x.data.len().checked_div(numel(&out_shape)).unwrap_or(0);
    if n < 2 {
        return 0.0;
    }
    let abs = Array {
        shape: x.shape.clone(),
        data: x.data.iter().map(|v| v.abs()).collect(),
    };
    let magnitudes = forward(op, &abs, out_shape);
    let worst = magnitudes
        .data
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, &v| m.max(v));
    super::norm::gamma32(n - 1) * worst
}

#[cfg(test)]
mod tests {
    use crate::graph::Op;

    /// argmax's index is a float32: exact up to 2^24, so an axis may hold 2^24 + 1 elements
    /// (indices 0..=2^24) and no more — at 2^24 + 2 the last index, 2^24 + 1, would round to
    /// 2^24 (written as an int64 by run-graph, it would claim a neighbour's position).
    #[test]
    fn argmax_axes_stop_where_float32_indices_stop_being_exact() {
        let op = Op::Argmax { axis: 1 };
        let n = (1usize << 24) + 1;
        assert_eq!(crate::spec::infer_shape(&op, &[&[2, n]]).unwrap(), vec![2]);
        assert_eq!(((n - 1) as f32) as usize, n - 1, "the last index is exact");
        assert_ne!((n as f32) as usize, n, "one more would not be");
        let e = crate::spec::infer_shape(&op, &[&[2, n + 1]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2^24 + 1") && e.contains("argmax"), "{e}");
    }
}
