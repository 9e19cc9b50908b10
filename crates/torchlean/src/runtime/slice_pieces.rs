//! The tape's one rewrite of a VJP: the cotangents of several slices of one tensor along one
//! axis are placed by one `concat`, instead of one zero-padded gradient per slice summed by
//! `add`.
//!
//! A multi-head layer slices q, k and v off one fused projection; the VJP of each slice is a
//! gradient of the whole projection's shape, zero outside the slice, and the tape adds the
//! three. Their sum is the three cotangents side by side (zeros where no slice reads), which
//! one `concat` writes in one pass. The backward pass ([`super::autograd`]) holds a slice's
//! cotangent here instead of running the slice's VJP, and when it reaches the sliced tensor
//! (every consumer done: reverse topological order) it places what it holds with the
//! session's `concat` op — planned, gated, checked where the profile says so, and reported
//! like every op. The value is the spec's: the slice VJP's zero padding summed over disjoint
//! ranges is exactly that concatenation (an f32 sum with zeros is exact). A cotangent that
//! cannot be placed with the others (another axis, an overlapping range, a device tensor, a
//! leaf's gradient) takes the slice's own VJP, as before.
//!
//! Owns: which cotangents are held and how they are placed. Must not run kernels other than
//! through the session.

use super::autograd::no_grad;
use crate::backend::Device;
use crate::error::Result;
use crate::graph::Op;
use crate::tensor::{IdMap, Tensor};

/// The cotangents held for one sliced tensor: slices `start..end` along `axis`.
struct Held {
    axis: usize,
    shape: Vec<usize>,
    parts: Vec<(usize, usize, Tensor)>,
}

/// The held cotangents of one backward pass, by sliced tensor.
#[derive(Default)]
pub(crate) struct Pending {
    held: IdMap<Held>,
}

impl Pending {
    /// Holds `g`, the cotangent of `x.slice(axis, start, end)`, when it can be placed with
    /// those held for `x` (same axis, a range disjoint from theirs, host tensors); false when
    /// the caller must run the slice's VJP.
    pub(crate) fn hold(
        &mut self,
        x: &Tensor,
        axis: usize,
        start: usize,
        end: usize,
        g: &Tensor,
    ) -> bool {
        let shape = x.shape();
        if x.device() != Device::Cpu
            || g.device() != Device::Cpu
            || axis >= shape.len()
            || start >= end
            || end > shape[axis]
        {
            return false;
        }
        let fits = g.shape().len() == shape.len()
            && g.shape()
                .iter()
                .zip(shape)
                .enumerate()
                .all(
                    |(i, (&a, &b))| {
                        if i == axis {
                            a == end - start
                        } else {
                            a == b
                        }
                    },
                );
        if !fits {
            return false;
        }
        let held = self.held.entry(x.id()).or_insert_with(|| Held {
            axis,
            shape: shape.to_vec(),
            parts: Vec::new(),
        });
        if held.axis != axis || held.parts.iter().any(|&(s, e, _)| start < e && s < end) {
            return false;
        }
        held.parts.push((start, end, g.clone()));
        true
    }

    /// The cotangents held for `t`, placed in one tensor of `t`'s shape (zeros between
    /// them) by the session's `concat`; `None` when none are held.
    pub(crate) fn take(&mut self, t: &Tensor) -> Result<Option<Tensor>> {
        let Some(mut held) = self.held.remove(&t.id()) else {
            return Ok(None);
        };
        held.parts.sort_by_key(|p| p.0);
        let axis = held.axis;
        let gap = |len: usize| {
            let mut shape = held.shape.clone();
            shape[axis] = len;
            Tensor::zeros(&shape)
        };
        let mut parts = Vec::with_capacity(2 * held.parts.len() + 1);
        let mut at = 0;
        for (start, end, g) in held.parts.iter() {
            if *start > at {
                parts.push(gap(start - at)?);
            }
            parts.push(g.clone());
            at = *end;
        }
        if at < held.shape[axis] {
            parts.push(gap(held.shape[axis] - at)?);
        }
        if parts.len() == 1 {
            return Ok(parts.pop());
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        no_grad(|| super::apply(Op::Concat { axis }, &refs)).map(Some)
    }
}
