//! Optimizer updates as ops (non-differentiable, elementwise over equal shapes): what an
//! optimizer computes for a parameter, on every device (`nn::adam`).
//!
//! - `ema_update(s, x)` = decay·s + weight·x, or with `square` decay·s + weight·x·x (Adam's
//!   first and second moments, RMSprop's averages), where the optimizers pass weight = 1 −
//!   decay computed in f64 and rounded once (`Op::ema_update`), as `torch.optim` computes
//!   `1 - beta` in Python's floats: in f32, 1 − 0.999 is 0.00099998713 where PyTorch's
//!   weight is 0.001, a bias of 1.3·10⁻⁵ in every second moment.
//! - `adam_update(w, m, v)` = w·shrink − step_size · m / (√v / c2_sqrt + eps) (Adam's and
//!   AdamW's parameter step, with the bias corrections folded into `step_size` and
//!   `c2_sqrt`, in the order `torch.optim`'s loops compute it).
//! - `adam_step(w₁, m₁, v₁, g₁, …, w_k, m_k, v_k, g_k)` = the concatenation, parameter after
//!   parameter, of the flattened `w'`, `m'`, `v'` where (with `gi = g + w·l2` when `l2 ≠ 0`,
//!   else `g`) `m' = ema_update(β₁, w₁)(m, gi)`, `v' = ema_update(β₂, w₂, square)(v, gi)` and
//!   `w' = adam_update(w, m', v')`: the three ops above (and Adam's L2 term, `add` of a
//!   `scale`), in the same order and rounding, for several parameters in one call.

use super::{expect_arity, payload_err, shape_err, Array};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let arity = match op {
        Op::EmaUpdate { decay, weight, .. } => {
            for (name, v) in [("decay", decay), ("weight", weight)] {
                if !(v.is_finite() && (0.0..=1.0).contains(v)) {
                    return Err(payload_err(op, format!("{name} {v} is not in [0, 1]")));
                }
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
        Op::AdamStep { .. } => return adam_step_shape(op, shapes),
        _ => unreachable!("optim::shape called for {}", op.name()),
    };
    expect_arity(op, shapes, &[arity])?;
    if shapes.iter().any(|s| *s != shapes[0]) {
        return Err(shape_err(op, shapes, "inputs of one shape"));
    }
    Ok(shapes[0].to_vec())
}

/// `adam_step`'s rule: groups of four inputs `(w, m, v, g)` of one shape each (at least one
/// group); the value is a vector of three elements per parameter element.
fn adam_step_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let Some(payload) = op.adam_step_payload() else {
        unreachable!("adam_step_shape called for {}", op.name())
    };
    let [beta1, weight1, beta2, weight2, ..] = payload;
    for (name, b) in [
        ("beta1", beta1),
        ("weight1", weight1),
        ("beta2", beta2),
        ("weight2", weight2),
    ] {
        if !(b.is_finite() && (0.0..=1.0).contains(&b)) {
            return Err(payload_err(op, format!("{name} {b} is not in [0, 1]")));
        }
    }
    if !payload.iter().all(|v| v.is_finite()) {
        return Err(payload_err(op, "every payload value must be finite"));
    }
    if shapes.is_empty() || shapes.len() % 4 != 0 {
        return Err(OpError::Arity {
            op: op.name(),
            expected: "(w, m, v, g) for each parameter: a positive multiple of 4".into(),
            got: shapes.len(),
        });
    }
    let mut total = 0usize;
    for group in shapes.chunks(4) {
        if group.iter().any(|s| *s != group[0]) {
            return Err(shape_err(
                op,
                shapes,
                "w, m, v and g of one shape for each parameter",
            ));
        }
        let n = super::numel(group[0]);
        total = n
            .checked_mul(3)
            .and_then(|n3| total.checked_add(n3))
            .ok_or_else(|| shape_err(op, shapes, "fewer than 2^64 result elements"))?;
    }
    Ok(vec![total])
}

/// `adam_step`'s payload as scalars: `[β₁, w₁, β₂, w₂, l2]` and [`adam_value`]'s constants.
pub(crate) fn adam_step_constants<T: Scalar>(op: &Op) -> Option<([T; 5], [T; 4])> {
    let [b1, w1, b2, w2, step_size, c2_sqrt, eps, shrink, l2] =
        op.adam_step_payload()?.map(|v| T::c(v as f64));
    Some(([b1, w1, b2, w2, l2], [step_size, c2_sqrt, eps, shrink]))
}

/// `adam_step`'s values for one parameter element: `(w', m', v')` from `(w, m, v, g)`, each
/// the unfused ops' value in their order (see the module doc).
#[inline]
pub(crate) fn adam_step_value<T: Scalar>(
    ([b1, w1, b2, w2, l2], c): ([T; 5], [T; 4]),
    w: T,
    m: T,
    v: T,
    g: T,
) -> [T; 3] {
    let gi = if l2 != T::zero() { g + w * l2 } else { g };
    let m1 = ema_value(b1, w1, false, m, gi);
    let v1 = ema_value(b2, w2, true, v, gi);
    [adam_value(c, w, m1, v1), m1, v1]
}

/// `ema_update`'s value for one element: decay·s + weight·x (`square`: ·x·x), the product
/// left to right, as `torch.optim` computes it (`mul_(beta).add_(g, alpha=1-beta)`,
/// `addcmul_(g, g, value=1-beta)`).
#[inline]
pub(crate) fn ema_value<T: Scalar>(decay: T, weight: T, square: bool, s: T, x: T) -> T {
    let y = if square { weight * x * x } else { weight * x };
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
    if let Some(c) = adam_step_constants(op) {
        let total: usize = inputs.chunks(4).map(|g| 3 * g[0].data.len()).sum();
        let mut out = Array::zeros(&[total]);
        let mut at = 0;
        for group in inputs.chunks(4) {
            let n = group[0].data.len();
            let (w, m, v, g) = (
                &group[0].data,
                &group[1].data,
                &group[2].data,
                &group[3].data,
            );
            for k in 0..n {
                let [w1, m1, v1] = adam_step_value(c, w[k], m[k], v[k], g[k]);
                out.data[at + k] = w1;
                out.data[at + n + k] = m1;
                out.data[at + 2 * n + k] = v1;
            }
            at += 3 * n;
        }
        return out;
    }
    let mut out = Array::zeros(&inputs[0].shape);
    if let Some(c) = adam_constants(op) {
        for (k, o) in out.data.iter_mut().enumerate() {
            let (w, m, v) = (inputs[0].data[k], inputs[1].data[k], inputs[2].data[k]);
            *o = adam_value(c, w, m, v);
        }
        return out;
    }
    match op {
        Op::EmaUpdate {
            decay,
            weight,
            square,
        } => {
            let (d, r) = (T::c(*decay as f64), T::c(*weight as f64));
            for (k, o) in out.data.iter_mut().enumerate() {
                *o = ema_value(d, r, *square, inputs[0].data[k], inputs[1].data[k]);
            }
        }
        _ => unreachable!("optim::forward called for {}", op.name()),
    }
    out
}
