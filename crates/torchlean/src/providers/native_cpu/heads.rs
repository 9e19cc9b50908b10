//! Attention tensors with their heads interleaved: a logical `[B, H, L, D]` tensor stored as
//! `[B, L, H, D]` (strides `L·H·D, D, H·D, 1`, offset 0, exactly `B·H·L·D` elements).
//!
//! A multi-head layer splits its heads off a `[B, L, H·D]` projection by a reshape and a
//! permute (views), and merges them back by the inverse permute and a reshape. When the
//! flash kernel's output is stored head-interleaved, the merge's permute gives a contiguous
//! view and its reshape is a view too: no copy; when the VJP's gradients for q, k and v are
//! stored like the inputs they belong to, the split's permute VJP is a view as well. The
//! rule (as PyTorch's SDPA): a result takes the memory order of the input it belongs to
//! (the output: the query's) when that input is itself head-interleaved; otherwise it is
//! row-major. Either way the result is dense: every element stored exactly once, which the
//! replayed capsule's `dense_layout` checker verifies on every call.
//!
//! Owns: the choice of order and the placement of a batch matrix's rows. Must not know what
//! the kernels compute.

use crate::backend::Device;
use crate::tensor::{Layout, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// Whether `t` is a `[B, H, L, D]` host tensor stored with its L axis outside its H axis
/// (a head split of a `[B, L, H·D]` tensor), with more than one head and more than one row.
pub(super) fn interleaved(t: &Tensor) -> bool {
    let (s, strides) = (t.shape(), &t.layout().strides);
    t.device() == Device::Cpu && s.len() == 4 && s[1] > 1 && s[2] > 1 && strides[1] < strides[2]
}

/// The head-interleaved layout of a `[B, H, L, D]` shape.
fn layout(shape: &[usize]) -> Layout {
    let (h, l, d) = (shape[1], shape[2], shape[3]);
    Layout {
        shape: shape.to_vec(),
        strides: vec![l * h * d, d, h * d, 1],
        offset: 0,
    }
}

/// A tensor of `shape` over `data`, row-major or (`interleave`, rank 4) head-interleaved.
pub(super) fn tensor(data: Vec<f32>, shape: Vec<usize>, interleave: bool) -> Tensor {
    if interleave && shape.len() == 4 {
        Tensor::from_storage(Arc::new(data), layout(&shape))
    } else {
        Tensor::from_parts(data, shape)
    }
}

/// The batch matrices `parts` (each `L × W` row-major, in batch order) placed in a buffer of
/// `shape` ([B, H, L, W]) stored head-interleaved, drawn like a kernel output; one task per
/// batch index (its H heads' rows fill one contiguous block of the buffer).
pub(super) fn placed<'a>(shape: &[usize], parts: impl Iterator<Item = &'a [f32]>) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let (h, l, w) = (shape[1], shape[2], shape[3]);
    let mut out = super::par::overwritten(n);
    if n == 0 || w == 0 {
        return out;
    }
    let parts: Vec<&[f32]> = parts.collect();
    // invariant of the callers: one L × W part per batch matrix (every element written once)
    debug_assert!(parts.len() * l * w == n && parts.iter().all(|p| p.len() == l * w));
    out.par_chunks_mut(l * h * w)
        .zip(parts.par_chunks(h))
        .for_each(|(block, heads)| {
            for (hi, p) in heads.iter().enumerate() {
                for (i, row) in p.chunks_exact(w).enumerate() {
                    // row i of head hi of batch index b: element ((b·L + i)·H + hi)·W, here
                    // counted from the block's start b·L·H·W
                    let at = (i * h + hi) * w;
                    block[at..at + w].copy_from_slice(row);
                }
            }
        });
    out
}
