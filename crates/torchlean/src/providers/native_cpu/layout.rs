//! Native shape ops. `reshape` (where the strides allow: `Layout::reshaped`), `permute`,
//! `broadcast_to` and `slice` return views that share storage; `concat` copies.

use super::reduce::{split, sum_to_shape};
use crate::graph::Op;
use crate::tensor::{Layout, Tensor};

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Tensor {
    match op {
        // a view where the strides allow one (splitting the heads off a slice of a fused
        // projection), else a contiguous copy
        Op::Reshape { .. } => match x[0].layout().reshaped(out_shape) {
            Some(l) => x[0].view(l),
            None => {
                let src = x[0].contiguous();
                let offset = src.layout().offset;
                src.view(Layout {
                    offset,
                    ..Layout::contiguous(out_shape.to_vec())
                })
            }
        },
        Op::Permute { axes } => x[0].view(x[0].layout().permuted(axes)),
        Op::BroadcastTo { shape } => x[0].view(x[0].layout().broadcast(shape)),
        Op::Slice { axis, start, end } => x[0].view(x[0].layout().sliced(*axis, *start, *end)),
        Op::Concat { axis } => {
            let (outer, _, inner) = split(out_shape, *axis);
            let parts: Vec<_> = x.iter().map(|t| t.data()).collect();
            // drawn like every kernel output (a fresh buffer is page faults, call after call)
            let mut data = super::par::overwritten(crate::spec::numel(out_shape));
            let mut at = 0;
            for o in 0..outer {
                for (p, t) in parts.iter().zip(x) {
                    let chunk = t.shape()[*axis] * inner;
                    data[at..at + chunk].copy_from_slice(&p[o * chunk..(o + 1) * chunk]);
                    at += chunk;
                }
            }
            Tensor::from_parts(data, out_shape.to_vec())
        }
        _ => unreachable!("layout::forward called for {}", op.name()),
    }
}

pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor) -> Vec<Option<Tensor>> {
    match op {
        // gradients are dense (the VJP layout contract; row-major but for permute's): a view
        // of the cotangent's storage (a slice of a concat's cotangent, say) is copied out
        Op::Reshape { .. } => {
            let g = gy.canonical();
            vec![Some(g.view(Layout::contiguous(x[0].shape().to_vec())))]
        }
        Op::Permute { axes } => {
            let mut inverse = vec![0; axes.len()];
            for (i, &a) in axes.iter().enumerate() {
                inverse[a] = i;
            }
            let g = gy.view(gy.layout().permuted(&inverse));
            // a dense cotangent gives a dense gradient with no copy (its axes in another
            // order: the VJP of a head merge hands the attention VJP its cotangent as it
            // lies); anything else is copied out row-major
            let dense = gy.device() == crate::backend::Device::Cpu
                && g.layout().is_dense_in(g.storage_slice().len());
            vec![Some(if dense { g } else { g.canonical() })]
        }
        Op::BroadcastTo { .. } => vec![Some(sum_to_shape(&gy.data(), gy.shape(), x[0].shape()))],
        Op::Slice { axis, start, end } => {
            let (outer, dim, inner) = split(x[0].shape(), *axis);
            let g = gy.data();
            let width = (end - start) * inner;
            let mut out = super::par::zeroed(x[0].numel());
            for o in 0..outer {
                let dst = (o * dim + start) * inner;
                out[dst..dst + width].copy_from_slice(&g[o * width..(o + 1) * width]);
            }
            vec![Some(Tensor::from_parts(out, x[0].shape().to_vec()))]
        }
        Op::Concat { axis } => {
            let mut start = 0;
            x.iter()
                .map(|t| {
                    let n = t.shape()[*axis];
                    let g = gy
                        .view(gy.layout().sliced(*axis, start, start + n))
                        .canonical();
                    start += n;
                    Some(g)
                })
                .collect()
        }
        _ => unreachable!("layout::vjp called for {}", op.name()),
    }
}
