//! Gather and scatter with index tensors (integral f32 values).
//!
//! - `index_select{axis}(x, idx)`: `idx` is 1-D; picks slices of `x` along `axis`
//!   (embedding lookup, gather_row, gather_rows_nat, …).
//! - `gather{axis}(x, idx)`: PyTorch `gather`: `idx` has the rank of `x`, output has its shape,
//!   `out[..i..] = x[..idx[..i..]..]` along `axis`.
//! - `scatter_add{axis}(base, idx, src)`: PyTorch `scatter_add`: `idx` and `src` share a shape.
//!
//! An index that is not an integer in range is an error naming the position and the bound.
//! Index tensors receive no gradient.

use super::{contiguous_strides, expect_arity, numel, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

/// Validates one index value.
pub(crate) fn to_index(op: &Op, v: f64, position: usize, bound: usize) -> Result<usize, OpError> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && (v as usize) < bound {
        Ok(v as usize)
    } else {
        Err(OpError::Index {
            op: op.name(),
            value: v as f32,
            position,
            bound,
        })
    }
}

fn axis_of(op: &Op) -> usize {
    match op {
        Op::IndexSelect { axis } | Op::Gather { axis } | Op::ScatterAdd { axis } => *axis,
        _ => unreachable!("index::axis_of called for {}", op.name()),
    }
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let axis = axis_of(op);
    match op {
        Op::IndexSelect { .. } => {
            expect_arity(op, shapes, &[2])?;
            if axis >= shapes[0].len() || shapes[1].len() != 1 {
                return Err(shape_err(
                    op,
                    shapes,
                    format!("x with an axis {axis} and a 1-D index"),
                ));
            }
            let mut out = shapes[0].to_vec();
            out[axis] = shapes[1][0];
            Ok(out)
        }
        Op::Gather { .. } | Op::ScatterAdd { .. } => {
            let n = if matches!(op, Op::Gather { .. }) {
                2
            } else {
                3
            };
            expect_arity(op, shapes, &[n])?;
            let (x, idx) = (shapes[0], shapes[1]);
            let ok = axis < x.len()
                && idx.len() == x.len()
                && idx
                    .iter()
                    .zip(x)
                    .enumerate()
                    .all(|(d, (i, s))| d == axis || i <= s)
                && (n == 2 || shapes[2] == idx);
            if !ok {
                return Err(shape_err(
                    op,
                    shapes,
                    format!(
                        "an index of the same rank as x, no larger than x off axis {axis}{}",
                        if n == 3 {
                            ", and src of the index's shape"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            Ok(if n == 2 { idx.to_vec() } else { x.to_vec() })
        }
        _ => unreachable!("index::shape called for {}", op.name()),
    }
}

/// For each element of an index tensor of `idx_shape`, the flat position in a tensor of
/// `x_shape` that it addresses along `axis`.
fn addressed_positions<T: Scalar>(
    op: &Op,
    x_shape: &[usize],
    idx: &Array<T>,
    axis: usize,
) -> Result<Vec<usize>, OpError> {
    let xs = contiguous_strides(x_shape);
    let mut pos = Vec::with_capacity(idx.numel());
    let mut multi = vec![0usize; idx.shape.len()];
    for (flat, &v) in idx.data.iter().enumerate() {
        let target = to_index(op, v.f64(), flat, x_shape[axis])?;
        let p: usize = multi
            .iter()
            .enumerate()
            .map(|(d, &i)| if d == axis { target * xs[d] } else { i * xs[d] })
            .sum();
        pos.push(p);
        for d in (0..multi.len()).rev() {
            multi[d] += 1;
            if multi[d] < idx.shape[d] {
                break;
            }
            multi[d] = 0;
        }
    }
    Ok(pos)
}

/// Validated indices of a 1-D index tensor.
fn select_indices<T: Scalar>(op: &Op, idx: &Array<T>, bound: usize) -> Result<Vec<usize>, OpError> {
    idx.data
        .iter()
        .enumerate()
        .map(|(p, v)| to_index(op, v.f64(), p, bound))
        .collect()
}

pub(super) fn forward<T: Scalar>(
    op: &Op,
    xs: &[&Array<T>],
    out_shape: Vec<usize>,
) -> Result<Array<T>, OpError> {
    let axis = axis_of(op);
    let x = xs[0];
    match op {
        Op::IndexSelect { .. } => {
            let sel = select_indices(op, xs[1], x.shape[axis])?;
            let (outer, dim, inner) = super::array::split_at_axis(&x.shape, axis);
            let mut data = Vec::with_capacity(numel(&out_shape));
            for o in 0..outer {
                for &s in &sel {
                    let base = o * dim * inner + s * inner;
                    data.extend_from_slice(&x.data[base..base + inner]);
                }
            }
            Ok(Array {
                shape: out_shape,
                data,
            })
        }
        Op::Gather { .. } => {
            let pos = addressed_positions(op, &x.shape, xs[1], axis)?;
            Ok(Array {
                shape: out_shape,
                data: pos.into_iter().map(|p| x.data[p]).collect(),
            })
        }
        Op::ScatterAdd { .. } => {
            let pos = addressed_positions(op, &x.shape, xs[1], axis)?;
            let mut out = x.clone();
            for (i, p) in pos.into_iter().enumerate() {
                out.data[p] += xs[2].data[i];
            }
            Ok(out)
        }
        _ => unreachable!("index::forward called for {}", op.name()),
    }
}

pub(super) fn vjp<T: Scalar>(
    op: &Op,
    xs: &[&Array<T>],
    gy: &Array<T>,
) -> Result<InputGrads<T>, OpError> {
    let axis = axis_of(op);
    let x = xs[0];
    match op {
        Op::IndexSelect { .. } => {
            let sel = select_indices(op, xs[1], x.shape[axis])?;
            let (outer, dim, inner) = super::array::split_at_axis(&x.shape, axis);
            // a row selected many times (a frequent token) sums many cotangents: cascaded
            let mut g = super::sum::Sums::new(x.numel());
            for o in 0..outer {
                for (k, &s) in sel.iter().enumerate() {
                    for i in 0..inner {
                        g.add(
                            o * dim * inner + s * inner + i,
                            gy.data[(o * sel.len() + k) * inner + i],
                        );
                    }
                }
            }
            Ok(vec![Some(g.into_array(&x.shape)), None])
        }
        Op::Gather { .. } => {
            let pos = addressed_positions(op, &x.shape, xs[1], axis)?;
            let mut g = super::sum::Sums::new(x.numel());
            for (i, p) in pos.into_iter().enumerate() {
                g.add(p, gy.data[i]);
            }
            Ok(vec![Some(g.into_array(&x.shape)), None])
        }
        Op::ScatterAdd { .. } => {
            let pos = addressed_positions(op, &x.shape, xs[1], axis)?;
            let gsrc = Array {
                shape: xs[2].shape.clone(),
                data: pos.into_iter().map(|p| gy.data[p]).collect(),
            };
            Ok(vec![Some(gy.clone()), None, Some(gsrc)])
        }
        _ => unreachable!("index::vjp called for {}", op.name()),
    }
}
