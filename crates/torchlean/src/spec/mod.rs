//! The `spec` layer: the mathematical meaning of every op.
//!
//! For each op: its shape rule ([`infer_shape`]), its forward ([`forward`]) and its VJP
//! ([`vjp`]), written for clarity over contiguous row-major [`Array`]s and generic over the
//! [`Scalar`] type. Instantiated at `f64` it is the specification every provider is checked
//! against; instantiated at `f32` it *is* the `reference` provider's kernel.
//!
//! This layer knows nothing about devices, providers, tapes or the trust machinery.
//!
//! # Special values (docs/numerics.md)
//!
//! - **NaN in → NaN out**: every output that depends on a NaN input is NaN wherever PyTorch
//!   gives NaN — `relu`, `clamp`, `maximum`, `minimum`, `safe_log`, `softplus`, a max-pool or
//!   smooth-max-pool window, a softmax row, a norm group, every sum it enters. Comparisons go
//!   through the NaN-propagating helpers of [`crate::scalar`] (`maximum`, `minimum`, `clamp`,
//!   `max_of`, `beats_max`); `Float::max`/`min`, `f64::max` and `if x > 0 { x } else { 0 }`
//!   drop a NaN and are not used on values. `argmax` ranks NaN above every number (the first
//!   NaN wins), as PyTorch's.
//! - **±inf as IEEE** (inf - inf, 0 · inf and inf / inf are NaN), except where PyTorch defines a
//!   limit: the smooth max pool shifts by 0 when its window maximum is infinite (as
//!   `logsumexp`), so +inf in a window gives +inf.
//! - **-0 / +0 as PyTorch**: `relu(-0) = -0` and `clamp(-0, 0, _) = -0` (`x < lo ? lo : x`);
//!   `maximum`/`minimum` keep the first operand on a tie.
//! - **VJPs at NaN follow PyTorch's formulas** (a mask whose comparison is false at NaN):
//!   `relu` passes the cotangent, `clamp`, `safe_log` and `abs` pass zero, `maximum`/`minimum`
//!   pass it to both inputs, max pooling to the window's first NaN. The forward is NaN there
//!   anyway, so a loss built on it is NaN.

// Index loops mirror the mathematical definitions; iterator chains would obscure them.
#![allow(clippy::needless_range_loop)]

mod array;
mod attention_allowance;
mod conv;
mod conv2d_map;
mod elementwise;
pub mod flash;
mod fused_map;
mod index;
mod layout;
mod linalg;
mod norm;
pub(crate) use norm::{gamma32, rescaled_stats, GroupStats};
mod optim;
mod pool;
mod random;
mod reduce;
mod scan_allowance;
mod softmax;
mod special;
mod spectral_allowance;
pub(crate) use special::twiddle;
pub mod sum;

pub use array::{
    broadcast_shapes, check_shape, checked_contiguous_strides, checked_numel, contiguous_strides,
    numel, Array, MAX_ELEMENTS, MAX_WORK,
};
pub(crate) use array::{check_arrays, reduce_to};
pub use elementwise::round;
pub(crate) use elementwise::{
    binary, binary_grads, fused_chain_grad, fused_chain_value, pow, share_grad, unary,
    unary_derivative, unary_grad,
};
pub use linalg::{matmul_dims, MatmulDims};
pub(crate) use optim::{
    adam_constants, adam_step_constants, adam_step_value, adam_value, ema_value,
};

/// The unary map `op` at `x` in f32: the spec instantiated at f32, which is the reference
/// kernel's formula; `None` when `op` is not a unary map. Import-time evaluation (the ONNX
/// importer's constant folding) computes with it, so that a folded value is the one the
/// graph would have computed (the stable forms included: softplus never overflows).
pub fn unary_f32(op: &Op, x: f32) -> Option<f32> {
    op.kind().is_unary_map().then(|| unary(op, x))
}
pub use conv2d_map::is_epilogue_step;
pub use fused_map::side_count as fused_map_sides;
pub(crate) use pool::smooth_shift;
pub use random::{splitmix64, stream_bits, stream_key, uniform_from_bits};

use crate::error::OpError;
use crate::graph::{Op, OpKind};
use crate::scalar::Scalar;

/// Gradients of one op's inputs; `None` for inputs that carry no gradient
/// (index tensors, boolean masks, conditions).
pub type InputGrads<T> = Vec<Option<Array<T>>>;

/// The scale attention's scores carry when the call gives none: 1/√d for head dimension d. At
/// d = 0 every score is the empty dot product, 0, whatever it is scaled by — so 1 there
/// instead of 1/√0 = ∞, whose product with that 0 was NaN everywhere (PyTorch's kernels give
/// the uniform weights of zero scores, the mean of the values). Every provider takes it from
/// here.
pub fn default_attention_scale(d: usize) -> f64 {
    if d == 0 {
        1.0
    } else {
        1.0 / (d as f64).sqrt()
    }
}

/// The shape rule of `op` applied to its input shapes: the output shape, or why the inputs
/// are invalid. Every provider uses this same rule.
///
/// Size arithmetic is checked: every input shape and the output shape must be valid
/// ([`check_shape`]: at most [`MAX_ELEMENTS`] elements, strides that fit), and each rule
/// refuses payloads whose sizes would overflow or whose work would exceed [`MAX_WORK`]. A
/// result is therefore a correct shape or a typed error, never a wrapped value.
pub fn infer_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    for s in shapes {
        check_shape(op.name(), s)?;
    }
    let out = family_shape(op, shapes)?;
    check_shape(op.name(), &out).map_err(|_| {
        shape_err(
            op,
            shapes,
            format!(
                "an output of at most {MAX_ELEMENTS} elements (2^34) with strides that fit; the payload asks for {out:?}"
            ),
        )
    })?;
    Ok(out)
}

/// The per-family shape rule (inputs already validated by [`infer_shape`]).
fn family_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    use OpKind as K;
    match op.kind() {
        K::RandUniform | K::BernoulliMask => random::shape(op, shapes),
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where | K::Compare => {
            elementwise::binary_shape(op, shapes)
        }
        K::Softmax | K::LogSoftmax => softmax::shape(op, shapes),
        K::SumAll | K::ReduceSum | K::ReduceMean | K::Argmax => reduce::shape(op, shapes),
        K::Reshape | K::Permute | K::BroadcastTo | K::Concat | K::Slice => {
            layout::shape(op, shapes)
        }
        K::IndexSelect | K::Gather | K::ScatterAdd => index::shape(op, shapes),
        K::Matmul | K::Linear | K::MseLoss => linalg::shape(op, shapes),
        K::LayerNorm | K::RmsNorm | K::BatchNorm => norm::shape(op, shapes),
        K::Conv2d | K::ConvTranspose2d => conv::shape(op, shapes),
        K::MaxPool2d | K::AvgPool2d | K::SmoothMaxPool2d => pool::shape(op, shapes),
        K::SpectralConv1d | K::SelectiveScan | K::ScaledDotProductAttention => {
            special::shape(op, shapes)
        }
        K::FusedUnary => elementwise::fused_shape(op, shapes),
        K::FusedMap => fused_map::shape(op, shapes),
        K::Conv2dMap => conv2d_map::shape(op, shapes),
        K::EmaUpdate | K::AdamUpdate | K::AdamStep => optim::shape(op, shapes),
        _ => elementwise::unary_shape(op, shapes),
    }
}

/// The forward value of `op` on `inputs`.
pub fn forward<T: Scalar>(op: &Op, inputs: &[&Array<T>]) -> Result<Array<T>, OpError> {
    check_arrays(op.name(), inputs)?;
    let shapes: Vec<&[usize]> = inputs.iter().map(|a| a.shape.as_slice()).collect();
    let out_shape = infer_shape(op, &shapes)?;
    use OpKind as K;
    // An empty result has no element to compute; its loops over the other axes (which may
    // be huge beside a zero, e.g. [2^40, 0]) are skipped. Index ops still validate their
    // indices.
    if numel(&out_shape) == 0 && !matches!(op.kind(), K::IndexSelect | K::Gather | K::ScatterAdd) {
        return Ok(Array::zeros(&out_shape));
    }
    match op.kind() {
        K::RandUniform | K::BernoulliMask => random::forward(op, out_shape),
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where | K::Compare => {
            Ok(elementwise::binary_forward(op, inputs, out_shape))
        }
        K::Softmax | K::LogSoftmax => Ok(softmax::forward(op, inputs[0])),
        K::SumAll | K::ReduceSum | K::ReduceMean | K::Argmax => {
            Ok(reduce::forward(op, inputs[0], out_shape))
        }
        K::Reshape | K::Permute | K::BroadcastTo | K::Concat | K::Slice => {
            Ok(layout::forward(op, inputs, out_shape))
        }
        K::IndexSelect | K::Gather | K::ScatterAdd => index::forward(op, inputs, out_shape),
        K::Matmul | K::Linear | K::MseLoss => Ok(linalg::forward(op, inputs, out_shape)),
        K::LayerNorm | K::RmsNorm | K::BatchNorm => Ok(norm::forward(op, inputs)),
        K::Conv2d | K::ConvTranspose2d => Ok(conv::forward(op, inputs, out_shape)),
        K::MaxPool2d | K::AvgPool2d | K::SmoothMaxPool2d => {
            Ok(pool::forward(op, inputs[0], out_shape))
        }
        K::SpectralConv1d | K::SelectiveScan | K::ScaledDotProductAttention => {
            Ok(special::forward(op, inputs, out_shape))
        }
        K::FusedUnary => Ok(elementwise::fused_forward(op, inputs[0])),
        K::FusedMap => fused_map::forward(op, inputs),
        K::Conv2dMap => conv2d_map::forward(op, inputs),
        K::EmaUpdate | K::AdamUpdate | K::AdamStep => Ok(optim::forward(op, inputs)),
        _ => Ok(elementwise::unary_forward(op, inputs[0])),
    }
}

/// The error a correct f32 kernel may add to each compared tensor beyond a tolerance
/// relative to that tensor's values, where the op cancels terms larger than its result: a
/// sum of large terms of small total, a normalization of a group whose mean is large against
/// its spread. `[output]` for the forward (`grad_out` None), one per input for the VJP; zeros
/// for ops without such cancellation. The replay checkers add it to their declared bound
/// (docs/assurance.md); each argument is written beside its formula.
pub fn cancellation_allowance(
    op: &Op,
    inputs: &[&Array<f64>],
    grad_out: Option<&Array<f64>>,
) -> Vec<f64> {
    use OpKind as K;
    let none = no_allowance(inputs.len(), grad_out);
    match op.kind() {
        K::LayerNorm | K::BatchNorm | K::RmsNorm => {
            norm::cancellation_allowance(op, inputs, grad_out)
        }
        K::Softmax | K::LogSoftmax => match (inputs.first(), grad_out) {
            (Some(x), Some(gy)) if finite_call(inputs, Some(gy)) => {
                vec![softmax::cancellation_allowance(op, x, gy)]
            }
            _ => none,
        },
        K::SumAll | K::ReduceSum | K::ReduceMean if grad_out.is_none() => inputs
            .first()
            .map_or(none, |x| vec![reduce::cancellation_allowance(op, x)]),
        // (an error here means shapes the checked kernel's call already failed on: no
        // allowance, which can only reject)
        K::Conv2dMap => conv2d_map::cancellation_allowance(op, inputs, grad_out).unwrap_or(none),
        K::ScaledDotProductAttention => {
            attention_allowance::cancellation_allowance(op, inputs, grad_out)
        }
        K::SpectralConv1d => spectral_allowance::cancellation_allowance(op, inputs, grad_out),
        K::SelectiveScan if finite_call(inputs, grad_out) => {
            scan_allowance::cancellation_allowance(inputs, grad_out)
        }
        _ => none,
    }
}

/// No allowance: `[0]` for the forward (`gy` None), a zero per input for the VJP.
fn no_allowance<T>(inputs: usize, gy: Option<T>) -> Vec<f64> {
    vec![0.0; if gy.is_some() { inputs } else { 1 }]
}

/// Whether a call's inputs and cotangent are all finite: the cancellation allowances bound
/// finite calls only (a non-finite result is compared by class; an infinite allowance would
/// accept anything).
fn finite_call(xs: &[&Array<f64>], gy: Option<&Array<f64>>) -> bool {
    let finite = |a: &Array<f64>| a.data.iter().all(|v| v.is_finite());
    xs.iter().all(|a| finite(a)) && gy.is_none_or(finite)
}

/// The vector-Jacobian product of `op`: given the inputs, the forward output and the
/// cotangent `grad_out` of the output, the cotangent of each input.
pub fn vjp<T: Scalar>(
    op: &Op,
    inputs: &[&Array<T>],
    output: &Array<T>,
    grad_out: &Array<T>,
) -> Result<InputGrads<T>, OpError> {
    check_arrays(op.name(), inputs)?;
    check_arrays(op.name(), &[output, grad_out])?;
    let shapes: Vec<&[usize]> = inputs.iter().map(|a| a.shape.as_slice()).collect();
    let out_shape = infer_shape(op, &shapes)?;
    if grad_out.shape != out_shape || output.shape != out_shape {
        return Err(OpError::Shape {
            op: op.name(),
            shapes: vec![output.shape.clone(), grad_out.shape.clone()],
            expected: format!("output and its gradient of shape {out_shape:?}"),
        });
    }
    // an empty result depends on no input element: zero gradients, without the loops over
    // the other axes (which may be huge beside a zero)
    if numel(&out_shape) == 0 {
        if let Some(has) = empty_result_gradients(op, inputs.len()) {
            return Ok(inputs
                .iter()
                .zip(has)
                .map(|(x, h)| h.then(|| Array::zeros(&x.shape)))
                .collect());
        }
    }
    use OpKind as K;
    match op.kind() {
        K::RandUniform
        | K::BernoulliMask
        | K::Argmax
        | K::Compare
        | K::EmaUpdate
        | K::AdamUpdate
        | K::AdamStep => Err(OpError::NotDifferentiable { op: op.name() }),
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where => {
            Ok(elementwise::binary_vjp(op, inputs, grad_out))
        }
        K::Softmax | K::LogSoftmax => Ok(softmax::vjp(op, output, grad_out)),
        K::SumAll | K::ReduceSum | K::ReduceMean => Ok(reduce::vjp(op, inputs[0], grad_out)),
        K::Reshape | K::Permute | K::BroadcastTo | K::Concat | K::Slice => {
            Ok(layout::vjp(op, inputs, grad_out))
        }
        K::IndexSelect | K::Gather | K::ScatterAdd => index::vjp(op, inputs, grad_out),
        K::Matmul | K::Linear | K::MseLoss => Ok(linalg::vjp(op, inputs, grad_out)),
        K::LayerNorm | K::RmsNorm | K::BatchNorm => Ok(norm::vjp(op, inputs, grad_out)),
        K::Conv2d | K::ConvTranspose2d => Ok(conv::vjp(op, inputs, grad_out)),
        K::MaxPool2d | K::AvgPool2d | K::SmoothMaxPool2d => {
            Ok(pool::vjp(op, inputs[0], output, grad_out))
        }
        K::SpectralConv1d | K::SelectiveScan | K::ScaledDotProductAttention => {
            Ok(special::vjp(op, inputs, output, grad_out))
        }
        K::FusedUnary => Ok(elementwise::fused_vjp(op, inputs[0], grad_out)),
        K::FusedMap => fused_map::vjp(op, inputs, grad_out),
        K::Conv2dMap => conv2d_map::vjp(op, inputs, grad_out),
        _ => Ok(elementwise::unary_vjp(op, inputs[0], output, grad_out)),
    }
}

/// Checks the number of inputs of `op`.
pub(crate) fn expect_arity(op: &Op, shapes: &[&[usize]], allowed: &[usize]) -> Result<(), OpError> {
    if allowed.contains(&shapes.len()) {
        Ok(())
    } else {
        let expected = allowed
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" or ");
        Err(OpError::Arity {
            op: op.name(),
            expected,
            got: shapes.len(),
        })
    }
}

/// Builds a shape error for `op`.
pub(crate) fn shape_err(op: &Op, shapes: &[&[usize]], expected: impl Into<String>) -> OpError {
    OpError::Shape {
        op: op.name(),
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        expected: expected.into(),
    }
}

/// Builds a payload error for `op`.
/// Which inputs of `op` have a gradient (zeros) when its result is empty, for the ops whose
/// loops would otherwise walk the other axes of an empty result; `None` for the others (their
/// VJPs handle empty results themselves). Shared by the spec and the native kernels.
pub(crate) fn empty_result_gradients(op: &Op, inputs: usize) -> Option<Vec<bool>> {
    use OpKind as K;
    let every = matches!(
        op.kind(),
        K::Softmax
            | K::LogSoftmax
            | K::Reshape
            | K::Permute
            | K::BroadcastTo
            | K::Concat
            | K::Slice
            | K::Matmul
            | K::Linear
            | K::ScaledDotProductAttention
    );
    // a boolean attention mask (input 3) has no gradient
    let boolean_mask = matches!(
        op,
        Op::ScaledDotProductAttention {
            mask: crate::graph::AttentionMask::Boolean,
            ..
        }
    );
    every.then(|| (0..inputs).map(|i| !(boolean_mask && i == 3)).collect())
}

pub(crate) fn payload_err(op: &Op, reason: impl Into<String>) -> OpError {
    OpError::Payload {
        op: op.name(),
        reason: reason.into(),
    }
}
