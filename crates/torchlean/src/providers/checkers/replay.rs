//! The replay checkers that let fast native kernels pass the `strict` policy: the kernel runs,
//! then a checker replays this call's actual inputs and results and accepts or rejects.
//!
//! - [`replay_forward`] checks a forward result: `matmul` and `linear` by a Freivalds-style
//!   randomized product check against a rigorous float32 bound (see `freivalds.rs`),
//!   `conv2d` and `conv_transpose2d` by the same check on their unfolded operands (see
//!   `conv.rs`); every other op by recomputing every output with the f64 spec against the
//!   declared bound (see `recompute.rs`).
//! - [`replay_vjp`] checks the gradients of a VJP call the same way (the gradients of
//!   `matmul`, `linear` and the convolutions by Freivalds, every other VJP by recomputation).
//!
//! The random vectors come from the call's `seed`, which the runtime draws per call from a
//! per-thread stream the kernels never see. docs/assurance.md states each checker's
//! soundness, its argument and its cost.

use super::{conv, freivalds, recompute};
use crate::backend::Call;
use crate::graph::{Op, OpKind};

/// Random ±1 vectors per product check (a result above the bound escapes with probability
/// at most 2^-VECTORS).
pub const VECTORS: usize = 2;

/// Soundness statement of [`replay_forward`] (shown in reports).
pub const FORWARD_SOUNDNESS: &str = "matmul/linear, and conv2d/conv_transpose2d as products of their unfolded operands: a correct f32 kernel is never rejected (its error is within gamma_k*|A||B| for any summation order, Higham Thm 3.5, and the check's own f32-lane rounding eps_i is bounded and allowed for); an element error above T_i = (1+1e-5)(gamma_k*(|A||B|1)_i + 2 eps_i) + floor, about 1.2 gamma_k times its row's summed |A||B|, is accepted with probability <= 2^-2 (two random +-1 vectors; docs/assurance.md). The binary maps add/sub/mul/div/maximum/minimum over operands of the output's shape, and the unary maps neg/abs/relu/clamp/sqrt/inv/scale/add_scalar: accepted => each element the f32 operation's value bit for bit, or of the f64 value's non-finite class, or within half an ulp of the f64 value (2^(e-24) at its binary exponent e, 2^-150 subnormal; times 1+2^-28): one correctly rounded IEEE operation is never rejected (checkers/rounded.rs). compare: accepted => each element exactly the spec's 0 or 1, broadcast or not (checkers/rounded.rs). Non-finite operands: every element recomputed exactly, of the exact sum's class and within gamma_k*(|A||B|)_ij, or an infinity or NaN that a correct f32 summation reaches in some order (+inf only where the positive terms' sum times 1+gamma_n reaches f32's overflow boundary 2^128-2^103, -inf likewise for the negative terms, NaN only where both do: checkers/overflow.rs). Other ops: every output recomputed with the f64 spec; accepted => each element of the spec's class (NaN/inf exactly where the spec has them; for the sums of terms - conv2d/conv_transpose2d recomputed, avg_pool2d, sum_all, reduce_sum, reduce_mean, scatter_add, and the gradients of the products, pools, gather and index_select - also the infinities or NaN of that overflow rule, and, finite, within gamma_{n+1}*sum|term| + (n+1)*2^-126 of the f64 value beyond the bound below, sum|term| from the spec on the inputs' magnitudes, n the element's own count of terms from the spec on ones (a mean's reduced count, a pool's window); a chain of maps may instead be within the bound of the spec run at f32 step by step) and within 2e-4*(1+max|spec|) + A of it, A the cancellation allowance (0 except sums, gamma_{n-1}*sum|x|, layer/batch norm of groups whose mean is large against their spread, from gamma_{n+1}*|mean|/std, attention's running bound of the scores' rounding and of the cancellation in dS = P(dP - D) (trivial bounds where the scores' rounding alone moves a probability by 2x), and conv2d_map's conv sums, gamma_{K+1}*max(|w||x|+|b|)*prod max|mul side|, and spectral_conv1d's sums of twiddled products, 2*gamma_K*max sum|term| with K = n + Ci + 2m + 8 (spec/spectral_allowance.rs), and selective_scan's recurrence, gamma_{2L+3} times the scan of magnitudes (spec/scan_allowance.rs): spec::cancellation_allowance); for the optimizer maps ema_update and adam_update (and adam_step, their fusion over several parameters, each part of its value), accepted => each element bit-identical to the spec's formula evaluated in f32 in its written order (the reference provider's value), or of the f64 spec's non-finite class, or within gamma_K*M + K*2^-149 of the f64 spec, M the sum of the magnitudes of the formula's terms at that element and K the roundings of any f32 evaluation of it (ema_update 6, adam_update 8 where v >= 0, c2 > 0, eps >= 0 and 0 elsewhere; adam_step m' 8 and v' 10 with g + w*l2, w' as adam_update of the result's own m' and v'): a correct f32 kernel is never rejected (checkers/optim.rs)";

/// Soundness statement of [`replay_vjp`] (shown in reports).
pub const VJP_SOUNDNESS: &str = "matmul/linear and convolution gradients (input, weight, bias) as products: Freivalds against T_i (as for the forward); non-finite operands as for the forward (the overflow rule included); other VJPs: every gradient element recomputed with the f64 spec VJP; accepted => of the spec's class (the gradients of the sums of terms - convolutions recomputed, avg_pool2d, gather, index_select, and the gradients of the operands add, sub, mul, where and broadcast_to broadcast - also the forward's overflow rule, and, finite, within gamma_{n+1}*sum|term| + (n+1)*2^-126 of the f64 value beyond the bound below, n the element's own count of terms from the spec VJP on ones; fused chains: also the spec at f32 step by step) and within 2e-4*(1+max|spec|) + A (A as for the forward: layer/batch norm gradients of offset groups; attention's dQ, dK, dV and additive-mask running bounds; spectral_conv1d's input and weight gradients, 2*gamma_K*max sum|term| (K + B for the weights); softmax/log_softmax and layer/batch/rms norm gradients, the cotangent sums' rounding, gamma_{n+4} times the row's magnitudes (spec/softmax.rs, spec/norm.rs); selective_scan's gradients, the reverse recurrence's, gamma_{2L+3} times its magnitudes (spec/scan_allowance.rs); conv2d_map's input, weight and bias gradients, gamma_{n+1+steps}*max of the conv products over |gz|, its side gradients 0, so on cancelling sums a side gradient or a relu mask near zero can reject a correct kernel); a gradient missing where the spec has one is rejected";

/// The whole-call check of a forward result, without the piecewise fast paths of
/// `pieces.rs` and `unary.rs` and without the convolutions' product check (`conv.rs`), which
/// recompute every element instead: the reference those paths are tested against
/// (tests/replay.rs::fast_paths_agree_with_the_whole_call_check).
pub fn replay_forward_whole(op: &Op, call: &Call) -> Result<(), String> {
    if degenerate(call) {
        return recompute::whole_forward(op, call);
    }
    match op.kind() {
        OpKind::Matmul => freivalds::matmul_forward(call),
        OpKind::Linear => freivalds::linear_forward(call),
        _ => recompute::whole_forward(op, call),
    }
}

/// The whole-call check of a VJP call (see [`replay_forward_whole`]).
pub fn replay_vjp_whole(op: &Op, call: &Call) -> Result<(), String> {
    if degenerate(call) {
        return recompute::whole_vjp(op, call);
    }
    match op.kind() {
        OpKind::Matmul => freivalds::matmul_vjp(call),
        OpKind::Linear => freivalds::linear_vjp(call),
        _ => recompute::whole_vjp(op, call),
    }
}

/// Whether the call has an empty operand (an axis of extent 0 in an input or the output):
/// the product checks and the attention check assume nonempty matrices, and the spec's
/// recomputation of such a call is exact and costs at most one pass over the output.
fn degenerate(call: &Call) -> bool {
    let empty = |shape: &[usize]| shape.contains(&0);
    call.inputs.iter().any(|o| empty(o.shape)) || empty(call.output.shape)
}

/// Checks the forward result of a call.
pub fn replay_forward(op: &Op, call: &Call) -> Result<(), String> {
    if degenerate(call) {
        return recompute::whole_forward(op, call);
    }
    match op.kind() {
        OpKind::Matmul => freivalds::matmul_forward(call),
        OpKind::Linear => freivalds::linear_forward(call),
        OpKind::Conv2d | OpKind::ConvTranspose2d => conv::forward(op, call),
        _ => recompute::forward(op, call),
    }
}

/// Checks the gradients of a VJP call.
pub fn replay_vjp(op: &Op, call: &Call) -> Result<(), String> {
    if degenerate(call) {
        return recompute::whole_vjp(op, call);
    }
    match op.kind() {
        OpKind::Matmul => freivalds::matmul_vjp(call),
        OpKind::Linear => freivalds::linear_vjp(call),
        OpKind::Conv2d | OpKind::ConvTranspose2d => conv::vjp(op, call),
        _ => recompute::vjp(op, call),
    }
}
