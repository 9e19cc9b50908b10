//! Optimizer updates as ops (non-differentiable, elementwise over equal shapes): what an
//! optimizer computes for a parameter, on every device (`nn::adam`).
//!
//! - `ema_update(s, x)` = decay·s + (1 − decay)·x, or with `square` decay·s + (1 − decay)·x·x
//!   (Adam's first and second moments).
//! - `adam_update(w, m, v)` = w·shrink − step_size · m / (√v / c2_sqrt + eps) (Adam's and
//!   AdamW's parameter step, with the bias corrections folded into `step_size` and
//!   `c2_sqrt`, in the order `torch.optim`'s loops compute it).

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

/// `ema_update`'s value for one element: decay·s + (1 − decay)·x (`square`: ·x·x), the
/// product left to right, as the optimizers compute it.
#[inline]
pub(crate) fn ema_value<T: Scalar>(decay: T, square: bool, s: T, x: T) -> T {
    let rest = T::one() - decay;
    let y = if square { rest * x * x } else { rest * x };
    decay * s + y
}

/// `adam_update`'s value for one element: w·shrink − step_size · m / (√v / c2_sqrt + eps).
#[inline]
pub(crate) fn adam_value<T: Scalar>(
    [step_size, c2_sqrt, eps, shrink]: [T; 4],
    w: T,
    m: T,
    v: T,
) -> T {
    w * shrink - step_size * m / (v.sqrt() / c2_sqrt + eps)
}

/// `adam_update`'s payload as scalars, in [`adam_value`]'s order.
pub(crate) fn adam_constants<T: Scalar>(op: &Op) -> Option<[T; 4]> {
    match *op {
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => Some([step_size, c2_sqrt, eps, shrink].map(|v| T::c(v as f64))),
        _ => None,
    }
}

pub(super) fn forward<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Array<T> {
    let mut out = Array::zeros(&inputs[0].shape);
    if let Some(c) = adam_constants(op) {
        for (k, o) in out.data.iter_mut().enumerate() {
            let (w, m, v) = (inputs[0].data[k], inputs[1].data[k], inputs[2].data[k]);
            *o = adam_value(c, w, m, v);
        }
        return out;
    }
    match op {
        Op::EmaUpdate { decay, square } => {
            let d = T::c(*decay as f64);
            for (k, o) in out.data.iter_mut().enumerate() {
                *o = ema_value(d, *square, inputs[0].data[k], inputs[1].data[k]);
            }
        }
        _ => unreachable!("optim::forward called for {}", op.name()),
    }
    out
}
