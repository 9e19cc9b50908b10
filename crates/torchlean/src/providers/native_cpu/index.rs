//! Native gather/scatter kernels. Index values are validated exactly as the spec does.

use super::reduce::split;
use crate::error::{OpError, Result};
use crate::graph::Op;
use crate::spec::contiguous_strides;
use crate::tensor::Tensor;

fn index(op: &Op, v: f32, position: usize, bound: usize) -> Result<usize> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && (v as usize) < bound {
        Ok(v as usize)
    } else {
        Err(OpError::Index {
            op: op.name(),
            value: v,
            position,
            bound,
        }
        .into())
    }
}

/// Flat positions in x (of `x_shape`) addressed by each element of `idx` along `axis`.
fn positions(op: &Op, x_shape: &[usize], idx: &Tensor, axis: usize) -> Result<Vec<usize>> {
    positions_of(op, x_shape, &idx.data(), idx.shape(), axis)
}

/// [`positions`] for index values `idx` of shape `ishape`.
fn positions_of(
    op: &Op,
    x_shape: &[usize],
    idx: &[f32],
    ishape: &[usize],
    axis: usize,
) -> Result<Vec<usize>> {
    let xs = contiguous_strides(x_shape);
    let istr = contiguous_strides(ishape);
    idx.iter()
        .enumerate()
        .map(|(flat, &v)| {
            let target = index(op, v, flat, x_shape[axis])?;
            let mut p = 0;
            for d in 0..ishape.len() {
                let i = if d == axis {
                    target
                } else {
                    (flat / istr[d]) % ishape[d]
                };
                p += i * xs[d];
            }
            Ok(p)
        })
        .collect()
}

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Result<Tensor> {
    let data = x[0].data();
    let out = match op {
        Op::IndexSelect { axis } => {
            let (outer, dim, inner) = split(x[0].shape(), *axis);
            let sel: Vec<usize> = x[1]
                .data()
                .iter()
                .enumerate()
                .map(|(p, &v)| index(op, v, p, dim))
                .collect::<Result<_>>()?;
            let mut out = Vec::with_capacity(outer * sel.len() * inner);
            for o in 0..outer {
                for &s in &sel {
                    out.extend_from_slice(&data[(o * dim + s) * inner..(o * dim + s + 1) * inner]);
                }
            }
            out
        }
        Op::Gather { axis } => {
            let mut out = super::par::overwritten(crate::spec::numel(out_shape));
            let idx = x[1].data();
            gather_into(
                op,
                (&data, x[0].shape()),
                (&idx, x[1].shape()),
                *axis,
                &mut out,
            )?;
            out
        }
        Op::ScatterAdd { axis } => {
            let pos = positions(op, x[0].shape(), x[1], *axis)?;
            let src = x[2].data();
            let mut out = data.into_owned();
            for (i, p) in pos.into_iter().enumerate() {
                out[p] += src[i];
            }
            out
        }
        _ => unreachable!("index::forward called for {}", op.name()),
    };
    Ok(Tensor::from_parts(out, out_shape.to_vec()))
}

pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let g = gy.data();
    let shape = x[0].shape().to_vec();
    match op {
        Op::IndexSelect { axis } => {
            let (outer, dim, inner) = split(&shape, *axis);
            let sel: Vec<usize> = x[1]
                .data()
                .iter()
                .enumerate()
                .map(|(p, &v)| index(op, v, p, dim))
                .collect::<Result<_>>()?;
            let mut out = super::par::zeroed(x[0].numel());
            for o in 0..outer {
                for (k, &s) in sel.iter().enumerate() {
                    let src = &g[(o * sel.len() + k) * inner..(o * sel.len() + k + 1) * inner];
                    for (d, &v) in out[(o * dim + s) * inner..(o * dim + s + 1) * inner]
                        .iter_mut()
                        .zip(src)
                    {
                        *d += v;
                    }
                }
            }
            Ok(vec![Some(Tensor::from_parts(out, shape)), None])
        }
        Op::Gather { axis } => {
            let mut out = super::par::overwritten(x[0].numel());
            let idx = x[1].data();
            gather_vjp_into(op, &shape, (&idx, x[1].shape()), *axis, &g, &mut out)?;
            Ok(vec![Some(Tensor::from_parts(out, shape)), None])
        }
        Op::ScatterAdd { axis } => {
            let gsrc = positions(op, &shape, x[1], *axis)?
                .into_iter()
                .map(|p| g[p])
                .collect();
            Ok(vec![
                Some(gy.canonical()),
                None,
                Some(Tensor::from_parts(gsrc, x[2].shape().to_vec())),
            ])
        }
        _ => unreachable!("index::vjp called for {}", op.name()),
    }
}

/// `gather` of `x` (of `x_shape`) at `idx` (of `ishape`) along `axis`, into `out`.
pub fn gather_into(
    op: &Op,
    (x, x_shape): (&[f32], &[usize]),
    (idx, ishape): (&[f32], &[usize]),
    axis: usize,
    out: &mut [f32],
) -> Result<()> {
    let pos = positions_of(op, x_shape, idx, ishape, axis)?;
    for (o, p) in out.iter_mut().zip(pos) {
        *o = x[p];
    }
    Ok(())
}

/// The cotangent of `gather`'s source: `g` scattered (added) to the gathered positions of a
/// zero buffer `out` of the source's shape, in index order (as the tensor VJP).
pub fn gather_vjp_into(
    op: &Op,
    x_shape: &[usize],
    (idx, ishape): (&[f32], &[usize]),
    axis: usize,
    g: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let pos = positions_of(op, x_shape, idx, ishape, axis)?;
    out.fill(0.0);
    for (i, p) in pos.into_iter().enumerate() {
        out[p] += g[i];
    }
    Ok(())
}
