//! Shape and view ops: `reshape`, `permute`, `broadcast_to`, `concat`, `slice`.
//!
//! In the spec every result is a fresh contiguous array; providers may return views.

use super::array::{broadcast_to, reduce_to, split_at_axis};
use super::{
    checked_numel, contiguous_strides, expect_arity, numel, payload_err, shape_err, Array,
    InputGrads,
};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    match op {
        Op::Reshape { shape } => {
            expect_arity(op, shapes, &[1])?;
            // checked: a target like [2^32, 2^32, 2] must not wrap to the input's count
            if checked_numel(shape) != Some(numel(shapes[0])) {
                return Err(shape_err(
                    op,
                    shapes,
                    match checked_numel(shape) {
                        Some(n) => format!(
                            "{} elements to reshape into {shape:?} ({n} elements)",
                            numel(shapes[0])
                        ),
                        None => format!(
                            "{} elements to reshape into {shape:?} (whose element count overflows)",
                            numel(shapes[0])
                        ),
                    },
                ));
            }
            Ok(shape.clone())
        }
        Op::Permute { axes } => {
            expect_arity(op, shapes, &[1])?;
            let rank = shapes[0].len();
            let mut seen = vec![false; rank];
            if axes.len() != rank
                || axes
                    .iter()
                    .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
            {
                return Err(payload_err(
                    op,
                    format!(
                        "axes {axes:?} are not a permutation of 0..{rank} for shape {:?}",
                        shapes[0]
                    ),
                ));
            }
            Ok(axes.iter().map(|&a| shapes[0][a]).collect())
        }
        Op::BroadcastTo { shape } => {
            expect_arity(op, shapes, &[1])?;
            match super::broadcast_shapes(shapes[0], shape) {
                Some(s) if &s == shape => Ok(shape.clone()),
                _ => Err(shape_err(
                    op,
                    shapes,
                    format!("a shape that broadcasts to {shape:?}"),
                )),
            }
        }
        Op::Concat { axis } => {
            if shapes.is_empty() {
                return Err(OpError::Arity {
                    op: op.name(),
                    expected: "at least 1".into(),
                    got: 0,
                });
            }
            let first = shapes[0];
            if *axis >= first.len() {
                return Err(shape_err(
                    op,
                    shapes,
                    format!("tensors with an axis {axis}"),
                ));
            }
            let mut out = first.to_vec();
            out[*axis] = 0;
            for s in shapes {
                let agree = s.len() == first.len()
                    && s.iter()
                        .zip(first)
                        .enumerate()
                        .all(|(d, (a, b))| d == *axis || a == b);
                if !agree {
                    return Err(shape_err(
                        op,
                        shapes,
                        format!("equal shapes except along axis {axis}"),
                    ));
                }
                out[*axis] = out[*axis].checked_add(s[*axis]).ok_or_else(|| {
                    shape_err(
                        op,
                        shapes,
                        format!("sizes along axis {axis} whose sum fits"),
                    )
                })?;
            }
            Ok(out)
        }
        Op::Slice { axis, start, end } => {
            expect_arity(op, shapes, &[1])?;
            let s = shapes[0];
            if *axis >= s.len() || start > end || *end > s[*axis] {
                return Err(shape_err(
                    op,
                    shapes,
                    format!("axis {axis} to exist with {start} <= {end} <= its size"),
                ));
            }
            let mut out = s.to_vec();
            out[*axis] = end - start;
            Ok(out)
        }
        _ => unreachable!("layout::shape called for {}", op.name()),
    }
}

/// Permutes a contiguous array.
fn permute<T: Scalar>(x: &Array<T>, axes: &[usize]) -> Array<T> {
    let out_shape: Vec<usize> = axes.iter().map(|&a| x.shape[a]).collect();
    let in_strides = contiguous_strides(&x.shape);
    let mut out = Vec::with_capacity(x.data.len());
    let mut idx = vec![0usize; axes.len()];
    for _ in 0..x.data.len() {
        let src: usize = idx.iter().zip(axes).map(|(&i, &a)| i * in_strides[a]).sum();
        out.push(x.data[src]);
        for d in (0..axes.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Array {
        shape: out_shape,
        data: out,
    }
}

pub(super) fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>], out_shape: Vec<usize>) -> Array<T> {
    match op {
        Op::Reshape { .. } => xs[0].clone().reshaped(&out_shape),
        Op::Permute { axes } => permute(xs[0], axes),
        Op::BroadcastTo { shape } => broadcast_to(xs[0], shape),
        Op::Concat { axis } => {
            let (outer, _, inner) = split_at_axis(&out_shape, *axis);
            let mut data = Vec::with_capacity(numel(&out_shape));
            for o in 0..outer {
                for x in xs {
                    let chunk = x.shape[*axis] * inner;
                    data.extend_from_slice(&x.data[o * chunk..(o + 1) * chunk]);
                }
            }
            Array {
                shape: out_shape,
                data,
            }
        }
        Op::Slice { axis, start, end } => {
            let (outer, dim, inner) = split_at_axis(&xs[0].shape, *axis);
            let mut data = Vec::with_capacity(numel(&out_shape));
            for o in 0..outer {
                let base = o * dim * inner;
                data.extend_from_slice(&xs[0].data[base + start * inner..base + end * inner]);
            }
            Array {
                shape: out_shape,
                data,
            }
        }
        _ => unreachable!("layout::forward called for {}", op.name()),
    }
}

pub(super) fn vjp<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    match op {
        Op::Reshape { .. } => vec![Some(gy.clone().reshaped(&xs[0].shape))],
        Op::Permute { axes } => {
            let mut inverse = vec![0; axes.len()];
            for (i, &a) in axes.iter().enumerate() {
                inverse[a] = i;
            }
            vec![Some(permute(gy, &inverse))]
        }
        Op::BroadcastTo { .. } => vec![Some(reduce_to(gy, &xs[0].shape))],
        Op::Concat { axis } => {
            let (outer, _, inner) = split_at_axis(&gy.shape, *axis);
            let mut grads: Vec<Vec<T>> = xs.iter().map(|x| Vec::with_capacity(x.numel())).collect();
            let mut pos = 0;
            for _ in 0..outer {
                for (g, x) in grads.iter_mut().zip(xs) {
                    let chunk = x.shape[*axis] * inner;
                    g.extend_from_slice(&gy.data[pos..pos + chunk]);
                    pos += chunk;
                }
            }
            grads
                .into_iter()
                .zip(xs)
                .map(|(data, x)| {
                    Some(Array {
                        shape: x.shape.clone(),
                        data,
                    })
                })
                .collect()
        }
        Op::Slice { axis, start, end } => {
            let (outer, dim, inner) = split_at_axis(&xs[0].shape, *axis);
            let mut g = Array::zeros(&xs[0].shape);
            let width = (end - start) * inner;
            for o in 0..outer {
                let dst = o * dim * inner + start * inner;
                g.data[dst..dst + width].copy_from_slice(&gy.data[o * width..(o + 1) * width]);
            }
            vec![Some(g)]
        }
        _ => unreachable!("layout::vjp called for {}", op.name()),
    }
}
