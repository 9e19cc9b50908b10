//! Optimizer updates as ops (non-differentiable, elementwise over equal shapes): what an
//! optimizer computes for a parameter on a device, where no host loop can touch the memory.
//!
//! - `ema_update(s, x)` = decay·s + (1 − decay)·x, or with `square` decay·s + (1 − decay)·x·x
//!   (Adam's first and second moments).
//! - `adam_update(w, m, v)` = w·shrink − step_size · m / (√v / c2_sqrt + eps) (Adam's and
//!   AdamW's parameter step, with the bias corrections folded into `step_size` and
//!   `c2_sqrt`, exactly as the CPU optimizer's host loop computes it).

use super::{expect_arity, payload_err, shape_err, Array};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let arity = match op {
        Op::EmaUpdate { decay, .. } => {
            if !(decay.is_finite() && (0.0..=1.0).contains(decay)) {
                return Err(payload_err(op, format!("decay {decay} is not in [0, 1]")));
            }
            2
        }
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => {
            if ![step_size, c2_sqrt, eps, shrink]
                .iter()
                .all(|v| v.is_finite())
            {
                return Err(payload_err(op, "every payload value must be finite"));
            }
            3
        }
        _ => unreachable!("optim::shape called for {}", op.name()),
    };
    expect_arity(op, shapes, &[arity])?;
    if shapes.iter().any(|s| *s != shapes[0]) {
        return Err(shape_err(op, shapes, "inputs of one shape"));
    }
    Ok(shapes[0].to_vec())
}

pub(super) fn forward<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Array<T> {
    let mut out = Array::zeros(&inputs[0].shape);
    match op {
        Op::EmaUpdate { decay, square } => {
            let d = T::c(*decay as f64);
            let rest = T::one() - d;
            for (k, o) in out.data.iter_mut().enumerate() {
                let x = inputs[1].data[k];
                // (1 − decay)·x·x, left to right, as the optimizers' loops
                let y = if *square { rest * x * x } else { rest * x };
                *o = d * inputs[0].data[k] + y;
            }
        }
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => {
            let (step, c2, eps, shrink) = (
                T::c(*step_size as f64),
                T::c(*c2_sqrt as f64),
                T::c(*eps as f64),
                T::c(*shrink as f64),
            );
            for (k, o) in out.data.iter_mut().enumerate() {
                let (w, m, v) = (inputs[0].data[k], inputs[1].data[k], inputs[2].data[k]);
                *o = w * shrink - step * m / (v.sqrt() / c2 + eps);
            }
        }
        _ => unreachable!("optim::forward called for {}", op.name()),
    }
    out
}
