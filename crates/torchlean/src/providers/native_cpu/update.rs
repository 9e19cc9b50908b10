//! Kernels that update a buffer: the optimizer maps (`ema_update`, `adam_update`) and the
//! in-place kernel of every native capsule ([`forward_in_place`]).
//!
//! An update op's value has the shape of its first input (the state it updates: a moment, a
//! parameter, a gradient sum). The in-place kernel writes that value over the first input's
//! buffer when the caller's handle owns it alone (`Tensor::update_data`), which is how an
//! optimizer step or a gradient sum runs as gated ops without a new buffer per call. The
//! maps here are the same closures out of place and in place, so both give the same bits
//! (the conformance harness checks it on owned and shared inputs).

use super::elementwise;
use super::par::for_chunks;
use crate::error::{OpError, Result};
use crate::graph::{Op, OpKind};
use crate::scalar::{maximum, minimum};
use crate::tensor::Tensor;

/// `w[i] = f(w[i], [x_k[i] for k])` over equal-length buffers, in parallel chunks when large.
fn zip_in_place<const K: usize>(
    w: &mut [f32],
    xs: [&[f32]; K],
    f: impl Fn(f32, [f32; K]) -> f32 + Sync + Send,
) {
    for_chunks(w, |off, c| {
        let n = c.len();
        // re-slice to the chunk's length so the bounds checks hoist and the loop vectorizes
        let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][off..off + n]);
        // block-wise write-back: no masked stores for maps such as a maximum
        super::par::overwrite_each(c, |j, v| f(v, std::array::from_fn(|k| src[k][j])));
    });
}

/// `out[i] = f(s[i], [x_k[i] for k])`: [`zip_in_place`] over a copy-free out-of-place pass.
fn zip_into<const K: usize>(
    out: &mut [f32],
    s: &[f32],
    xs: [&[f32]; K],
    f: impl Fn(f32, [f32; K]) -> f32 + Sync + Send,
) {
    for_chunks(out, |off, c| {
        let n = c.len();
        let s = &s[off..off + n];
        let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][off..off + n]);
        for j in 0..n {
            c[j] = f(s[j], std::array::from_fn(|k| src[k][j]));
        }
    });
}

/// Where the value of an update goes: over the state's own buffer, or into another one.
enum Dest<'a> {
    InPlace(&'a mut [f32]),
    Into(&'a [f32], &'a mut [f32]),
}

/// Runs the map of `op` (an optimizer map or a same-shape binary map) with first operand
/// the state and `xs` the others, all of one length. `false` when `op` has no such map.
fn update_map(op: &Op, dest: Dest, xs: &[&[f32]]) -> bool {
    macro_rules! run {
        ($k:literal, $f:expr) => {{
            let xs: [&[f32]; $k] = match <[&[f32]; $k]>::try_from(xs) {
                Ok(xs) => xs,
                Err(_) => return false,
            };
            match dest {
                Dest::InPlace(w) => zip_in_place(w, xs, $f),
                Dest::Into(s, out) => zip_into(out, s, xs, $f),
            }
            true
        }};
    }
    match *op {
        // the same arithmetic, in the same order, as the optimizers' formulas (spec/optim.rs)
        Op::EmaUpdate {
            decay,
            square: false,
        } => run!(1, move |s, [x]| decay * s + (1.0 - decay) * x),
        Op::EmaUpdate {
            decay,
            square: true,
        } => run!(1, move |s, [x]| decay * s + (1.0 - decay) * x * x),
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => run!(2, move |w, [m, v]| w * shrink
            - step_size * m / (v.sqrt() / c2_sqrt + eps)),
        Op::Add => run!(1, |a, [b]| a + b),
        Op::Sub => run!(1, |a, [b]| a - b),
        Op::Mul => run!(1, |a, [b]| a * b),
        Op::Div => run!(1, |a, [b]| a / b),
        Op::Maximum => run!(1, |a, [b]| maximum(a, b)),
        Op::Minimum => run!(1, |a, [b]| minimum(a, b)),
        _ => false,
    }
}

/// The forward kernel of `ema_update` and `adam_update` (inputs of one shape, checked by the
/// shape guard): one parallel pass.
pub fn optim_forward(op: &Op, inputs: &[&Tensor]) -> Vec<f32> {
    let data: Vec<_> = inputs.iter().map(|t| t.host_data()).collect();
    let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
    let mut out = super::par::overwritten(slices[0].len());
    let ran = update_map(op, Dest::Into(slices[0], &mut out), &slices[1..]);
    debug_assert!(ran, "optim_forward called for {}", op.name());
    out
}

/// [`optim_forward`] into `out` over dense slices (the destination-passing kernel): `xs[0]`
/// the state, the others of its length (the shape guard checked the shapes).
pub fn optim_forward_into(op: &Op, xs: &[&[f32]], out: &mut [f32]) -> Result<()> {
    let Some((state, rest)) = xs.split_first() else {
        return Err(OpError::Arity {
            op: op.name(),
            expected: "the state and the map's other operands".into(),
            got: 0,
        }
        .into());
    };
    if update_map(op, Dest::Into(state, out), rest) {
        Ok(())
    } else {
        Err(crate::error::Error::Other(format!(
            "{}: no optimizer map for {} operands",
            op.name(),
            xs.len()
        )))
    }
}

/// The in-place kernel of the native capsules (`runtime::kernel::InPlaceKernel`): computes
/// `op(target, rest…)` into `target`. Unary maps, the optimizer maps and binary maps whose
/// other operand has `target`'s shape run over `target`'s buffer (overwritten when the
/// handle owns it alone, a copy otherwise: `Tensor::update_data`); any other op computes its
/// value with the forward kernel and `target` takes it. Same values as [`super::forward`]
/// (the conformance harness checks every op, on owned and on shared inputs).
pub fn forward_in_place(op: &Op, target: &mut Tensor, rest: &[&Tensor]) -> Result<()> {
    let out_shape = {
        let inputs = crate::runtime::kernel::update_operands(target, rest);
        let out_shape = super::guard::output_shape(op, &inputs)?;
        if out_shape != target.shape() {
            let shapes = inputs.iter().map(|t| t.shape().to_vec()).collect();
            return Err(OpError::Shape {
                op: op.name(),
                shapes,
                expected: format!(
                    "a value of the first input's shape, written over it (the value has shape {out_shape:?})"
                ),
            }
            .into());
        }
        out_shape
    };
    let kind = op.kind();
    if rest.is_empty() && (kind.is_unary_map() || kind == OpKind::FusedUnary) {
        target.update_data(|w| elementwise::unary_in_place(op, w));
        return Ok(());
    }
    let same = rest.iter().all(|t| t.shape() == out_shape.as_slice());
    if same && (kind.is_binary_map() || kind.is_optimizer_map()) {
        let data: Vec<_> = rest.iter().map(|t| t.host_data()).collect();
        let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
        let mut ran = false;
        target.update_data(|w| ran = update_map(op, Dest::InPlace(w), &slices));
        if ran {
            return Ok(());
        }
    }
    // every other op: its forward value, which the target takes
    let value = {
        let inputs = crate::runtime::kernel::update_operands(target, rest);
        super::forward(op, &inputs)?
    };
    target.assign(value)
}
