//! The native provider's destination-passing kernels (`forward_into`, `vjp_into`,
//! `in_place_into`) for the ops small dense training graphs are made of: `linear`,
//! `mse_loss`, the unary maps and fused unary chains, fused maps, the binary maps and `where` (with
//! broadcasting), the optimizer maps and `adam_step`, and the cross-entropy pieces (`softmax`, `log_softmax`, `gather`,
//! `reshape`, `sum_all`). The tensor kernels of these ops
//! are implemented on top of the same functions (`linalg::linear_into`,
//! `reduce::softmax_forward_into`, `index::gather_into`, ...), so the conformance harness's
//! checks of the tensor kernels exercise this code; it also runs these entry points directly
//! on garbage-filled buffers. (`reshape` is a view among tensors and a copy here; `sum_all`
//! and `reshape`'s cotangents are a fill and a copy, as in their tensor VJPs.)
//!
//! Guards: every call validates the operand shapes with the shared shape rule and checks
//! that every slice has its shape's element count before touching data.

use super::{elementwise, index, linalg, reduce};
use crate::error::{Error, Result};
use crate::graph::{Op, OpKind};
use crate::runtime::kernel::{Dense, DenseKernels};
use crate::spec::{infer_shape, numel};
use crate::tensor::Tensor;

/// The destination-passing kernels of `op`, when the native provider has them.
pub fn kernels(op: OpKind) -> Option<DenseKernels> {
    use OpKind as K;
    let unary = op.is_unary_map() || op == K::FusedUnary;
    let others = matches!(
        op,
        K::Linear
            | K::MseLoss
            | K::Reshape
            | K::SumAll
            | K::Softmax
            | K::LogSoftmax
            | K::Gather
            | K::Add
            | K::Sub
            | K::Mul
            | K::Div
            | K::Maximum
            | K::Minimum
            | K::Where
    );
    if op.is_optimizer_map() || op == K::AdamStep {
        // not differentiable; run by tiles under a replay checker (runtime/tiled.rs)
        return Some(DenseKernels {
            forward_into,
            vjp_into: None,
            in_place_into: None,
        });
    }
    if op == K::Compare {
        // not differentiable: a forward only
        return Some(DenseKernels {
            forward_into,
            vjp_into: None,
            in_place_into: None,
        });
    }
    if op == K::FusedMap {
        return Some(DenseKernels {
            forward_into,
            vjp_into: Some(vjp_into),
            in_place_into: None,
        });
    }
    (unary || others).then_some(DenseKernels {
        forward_into,
        vjp_into: Some(vjp_into),
        in_place_into: unary.then_some(in_place_into as _),
    })
}

fn mismatch(op: &Op, what: String) -> Error {
    Error::Other(format!("{}: {what}", op.name()))
}

/// Shape guard: the shape rule on the operands' shapes, and each slice's element count.
fn guard(op: &Op, x: &[Dense]) -> Result<Vec<usize>> {
    let shapes: Vec<&[usize]> = x.iter().map(|d| d.shape).collect();
    let out = infer_shape(op, &shapes)?;
    for (i, d) in x.iter().enumerate() {
        if d.data.len() != numel(d.shape) {
            return Err(mismatch(
                op,
                format!(
                    "operand {i} has {} elements, its shape {:?} needs {}",
                    d.data.len(),
                    d.shape,
                    numel(d.shape)
                ),
            ));
        }
    }
    Ok(out)
}

fn check_len(op: &Op, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(mismatch(
            op,
            format!("{what} buffer has {got} elements, expected {want}"),
        ))
    }
}

/// The forward value of `op` into `out`.
pub fn forward_into(op: &Op, x: &[Dense], out: &mut [f32]) -> Result<()> {
    let shape = guard(op, x)?;
    check_len(op, "output", out.len(), numel(&shape))?;
    match op {
        Op::Linear => linalg::linear_into(x, out),
        Op::MseLoss => out[0] = linalg::mse_value(x[0].data, x[1].data),
        // a reshape's elements, row-major, are its input's
        Op::Reshape { .. } => out.copy_from_slice(x[0].data),
        Op::SumAll => out[0] = reduce::sum_all(x[0].data),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => {
            reduce::softmax_forward_into(op, x[0].data, x[0].shape, out)
        }
        Op::Gather { axis } => index::gather_into(
            op,
            (x[0].data, x[0].shape),
            (x[1].data, x[1].shape),
            *axis,
            out,
        )?,
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Maximum
        | Op::Minimum
        | Op::Where
        | Op::Compare { .. } => {
            let (data, shapes) = operands(x);
            elementwise::binary_forward_into(op, &data[..x.len()], &shapes[..x.len()], &shape, out)
        }
        Op::FusedMap { steps } => {
            let data: Vec<&[f32]> = x.iter().map(|d| d.data).collect();
            let shapes: Vec<&[usize]> = x.iter().map(|d| d.shape).collect();
            super::fused_map::forward_into(steps, &data, &shapes, &shape, out)
        }
        Op::EmaUpdate { .. } | Op::AdamUpdate { .. } => {
            let data: Vec<&[f32]> = x.iter().map(|d| d.data).collect();
            super::update::optim_forward_into(op, &data, out)?
        }
        Op::AdamStep { .. } => {
            let data: Vec<&[f32]> = x.iter().map(|d| d.data).collect();
            super::update::adam_step_forward_into(op, &data, out)?
        }
        _ => elementwise::unary_forward_into(op, x[0].data, out),
    }
    Ok(())
}

/// The slices and shapes of up to three operands (binary maps and `where`).
fn operands<'a>(x: &[Dense<'a>]) -> ([&'a [f32]; 3], [&'a [usize]; 3]) {
    let mut data: [&[f32]; 3] = [&[]; 3];
    let mut shapes: [&[usize]; 3] = [&[]; 3];
    for (k, d) in x.iter().take(3).enumerate() {
        data[k] = d.data;
        shapes[k] = d.shape;
    }
    (data, shapes)
}

/// The cotangents of `op`'s inputs into `outs` (where `Some`).
pub fn vjp_into(
    op: &Op,
    x: &[Dense],
    y: Dense,
    g: Dense,
    outs: &mut [Option<&mut [f32]>],
) -> Result<()> {
    let shape = guard(op, x)?;
    check_len(op, "output", y.data.len(), numel(&shape))?;
    check_len(op, "cotangent", g.data.len(), numel(&shape))?;
    check_len(op, "cotangent list", outs.len(), x.len())?;
    for (o, d) in outs.iter().zip(x) {
        if let Some(o) = o {
            check_len(op, "input cotangent", o.len(), d.data.len())?;
        }
    }
    match op {
        // the tensor VJP (the parts' native VJPs over recomputed values) on copies: fusion
        // never takes a value a backward pass reads, so this runs only for graphs that
        // hold a fused map themselves
        Op::FusedMap { steps } => {
            let tensor = |d: &Dense| Tensor::from_vec(d.data.to_vec(), d.shape);
            let xs = x.iter().map(tensor).collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Tensor> = xs.iter().collect();
            let grads = super::fused_map::vjp(steps, &refs, &tensor(&g)?)?;
            for (o, gi) in outs.iter_mut().zip(grads) {
                if let (Some(o), Some(gi)) = (o.as_deref_mut(), gi) {
                    o.copy_from_slice(&gi.data());
                }
            }
        }
        Op::Reshape { .. } => {
            if let Some(o) = outs[0].as_deref_mut() {
                o.copy_from_slice(g.data);
            }
        }
        Op::SumAll => {
            if let Some(o) = outs[0].as_deref_mut() {
                o.fill(g.data[0]);
            }
        }
        Op::Softmax { .. } | Op::LogSoftmax { .. } => {
            if let Some(o) = outs[0].as_deref_mut() {
                reduce::softmax_vjp_into(op, y.data, y.shape, g.data, o);
            }
        }
        Op::Gather { axis } => {
            if let Some(o) = outs[0].as_deref_mut() {
                index::gather_vjp_into(op, x[0].shape, (x[1].data, x[1].shape), *axis, g.data, o)?;
            }
            // indices take no gradient: a requested cotangent is zero (as the general
            // executor fills a missing one)
            if let Some(o) = outs[1].as_deref_mut() {
                o.fill(0.0);
            }
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Maximum | Op::Minimum | Op::Where => {
            let (data, shapes) = operands(x);
            let n = x.len();
            elementwise::binary_vjp_into(op, &data[..n], &shapes[..n], g.data, g.shape, outs)
        }
        Op::Linear => linalg::linear_vjp_into(x, g.data, outs),
        Op::MseLoss => linalg::mse_vjp_into(x[0].data, x[1].data, g.data[0], outs),
        Op::FusedUnary { ops } => {
            if let Some(o) = outs[0].as_deref_mut() {
                elementwise::fused_vjp_into(ops, x[0].data, g.data, o);
            }
        }
        _ => {
            if let Some(o) = outs[0].as_deref_mut() {
                elementwise::unary_vjp_into(op, x[0].data, y.data, g.data, x[0].shape, o);
            }
        }
    }
    Ok(())
}

/// A unary map (or fused chain) over `buf` (of shape `shape`) in place.
pub fn in_place_into(op: &Op, shape: &[usize], buf: &mut [f32]) -> Result<()> {
    guard(op, &[Dense { data: buf, shape }])?;
    elementwise::unary_in_place(op, buf);
    Ok(())
}
