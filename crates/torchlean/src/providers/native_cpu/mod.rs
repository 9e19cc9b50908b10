//! The `native_cpu` provider: fast f32 kernels for the CPU.
//!
//! Matrix products go through the `gemm` crate (AVX-512 with the `x86-v4` feature, rayon
//! threads); elementwise maps and reductions run in fixed-size parallel chunks above a size
//! threshold; results are deterministic run to run. View ops return views.
//!
//! Evidence (capsule module [`register`]): shape and layout by runtime guards
//! ([`guard::shape_rule`], [`guard::host_inputs_in_bounds`]), which the runtime runs before
//! every call (structural: the evidence holds the functions); value and VJP by
//! the conformance harness (tests/conformance.rs), which compares every kernel with the f64
//! spec on random inputs. Trust level: `checked`.

mod conv;
mod conv_direct;
mod conv_map;
mod dense;
mod elementwise;
mod flash;
mod flash_small;
mod fused_map;
pub mod guard;
mod heads;
mod index;
mod layout;
mod linalg;
mod norm;
pub(crate) mod par;
mod pool;
mod reduce;
mod special;
mod strided;
mod update;
pub mod vmath;

use super::capsules::{descriptor, layout_claim, shape_claim, spec_name, value_claim, vjp_claim};
use crate::backend::{
    Device, Evidence, KernelCapsule, Provenance, Provider, Registry, RegistryError, RuntimeSupport,
    TrustLevel, VjpMode,
};
use crate::error::Result;
use crate::graph::{Op, OpKind};
use crate::runtime::kernel::KernelBinding;
use crate::spec::{stream_bits, stream_key, uniform_from_bits};
use crate::tensor::Tensor;
use rayon::prelude::*;
pub use update::forward_in_place;

fn tensor(data: Vec<f32>, shape: Vec<usize>) -> Tensor {
    Tensor::from_parts(data, shape)
}

fn random(op: &Op, n: usize) -> Vec<f32> {
    let (seed, keep) = match op {
        Op::RandUniform { seed, .. } => (*seed, None),
        Op::BernoulliMask { seed, keep, .. } => (*seed, Some(*keep as f64)),
        _ => unreachable!("random called for {}", op.name()),
    };
    let key = stream_key(seed);
    let draw = |i: usize| {
        let u = uniform_from_bits(stream_bits(key, i));
        match keep {
            None => u as f32,
            Some(p) => (u < p) as u8 as f32,
        }
    };
    if n < par::PAR_THRESHOLD {
        (0..n).map(draw).collect()
    } else {
        (0..n).into_par_iter().map(draw).collect()
    }
}

/// The native forward kernel (bound to every native capsule).
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let out_shape = guard::output_shape(op, inputs)?;
    crate::runtime::buffers::check_output(op.name(), crate::spec::numel(&out_shape))?;
    use OpKind as K;
    // an empty result has no element to compute: its loops over the other axes (which may
    // be huge beside a zero, e.g. [2^40, 0]) are skipped; index ops still check indices
    if crate::spec::numel(&out_shape) == 0
        && !matches!(op.kind(), K::IndexSelect | K::Gather | K::ScatterAdd)
    {
        return Ok(tensor(Vec::new(), out_shape));
    }
    let data = match op.kind() {
        K::RandUniform | K::BernoulliMask => random(op, crate::spec::numel(&out_shape)),
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where | K::Compare => {
            elementwise::binary_forward(op, inputs, &out_shape)
        }
        K::Softmax | K::LogSoftmax => reduce::softmax_forward(op, inputs[0]),
        K::SumAll | K::ReduceSum | K::ReduceMean | K::Argmax => {
            reduce::forward(op, inputs[0], &out_shape)
        }
        K::Reshape | K::Permute | K::BroadcastTo | K::Concat | K::Slice => {
            return Ok(layout::forward(op, inputs, &out_shape))
        }
        K::IndexSelect | K::Gather | K::ScatterAdd => {
            return index::forward(op, inputs, &out_shape)
        }
        K::Matmul | K::Linear | K::MseLoss => linalg::forward(op, inputs, &out_shape),
        K::LayerNorm | K::RmsNorm | K::BatchNorm => norm::forward(op, inputs),
        K::Conv2d | K::ConvTranspose2d => conv::forward(op, inputs, &out_shape),
        K::MaxPool2d | K::AvgPool2d | K::SmoothMaxPool2d => {
            pool::forward(op, inputs[0], &out_shape)
        }
        K::SpectralConv1d | K::SelectiveScan | K::ScaledDotProductAttention => {
            special::forward(op, inputs, &out_shape)
        }
        K::EmaUpdate | K::AdamUpdate => update::optim_forward(op, inputs),
        K::AdamStep => update::adam_step_forward(op, inputs)?,
        K::FusedMap => match op {
            Op::FusedMap { steps } => fused_map::forward(steps, inputs, &out_shape),
            _ => unreachable!("the kind is fused_map"),
        },
        K::Conv2dMap => conv_map::forward(op, inputs, &out_shape),
        _ => elementwise::unary_forward(op, &inputs[0].host_data()),
    };
    Ok(tensor(data, out_shape))
}

/// The gradients of an op whose result is empty (it depends on no input element): zeros for
/// each input that has one (`spec::empty_result_gradients`, shared with the spec) and needs
/// it, without the kernels' loops over the other axes (which may be huge beside a zero).
/// `None` for the ops whose kernels handle empty results themselves.
fn empty_result_grads(op: &Op, inputs: &[&Tensor], needs: &[bool]) -> Option<Vec<Option<Tensor>>> {
    let has = crate::spec::empty_result_gradients(op, inputs.len())?;
    Some(
        inputs
            .iter()
            .zip(has)
            .enumerate()
            .map(|(i, (x, has))| {
                let need = has && needs.get(i).copied().unwrap_or(true);
                need.then(|| tensor(vec![0.0; x.numel()], x.shape().to_vec()))
            })
            .collect(),
    )
}

/// What every native VJP kernel checks first: the call's shapes, that its gradients can be
/// allocated (a large cotangent that cannot be is an error, not an abort); and, for an empty
/// result, its gradients (zeros, without the loops: `Some`).
fn vjp_prologue(
    op: &Op,
    inputs: &[&Tensor],
    grad_out: &Tensor,
    needs: &[bool],
) -> Result<Option<Vec<Option<Tensor>>>> {
    guard::output_shape(op, inputs)?;
    crate::runtime::buffers::check_gradients(op.name(), inputs, Some(needs))?;
    Ok(if grad_out.numel() == 0 {
        empty_result_grads(op, inputs, needs)
    } else {
        None
    })
}

/// The native VJP kernel (bound to every differentiable native capsule).
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    grad_out: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    if let Some(grads) = vjp_prologue(op, inputs, grad_out, needs)? {
        return Ok(grads);
    }
    use OpKind as K;
    Ok(match op.kind() {
        K::RandUniform
        | K::BernoulliMask
        | K::Argmax
        | K::Compare
        | K::EmaUpdate
        | K::AdamUpdate
        | K::AdamStep => {
            return Err(crate::error::OpError::NotDifferentiable { op: op.name() }.into())
        }
        K::Add | K::Sub | K::Mul | K::Div | K::Maximum | K::Minimum | K::Where => {
            elementwise::binary_vjp(op, inputs, grad_out, needs)
        }
        K::Softmax | K::LogSoftmax => vec![Some(tensor(
            reduce::softmax_vjp(op, output, grad_out),
            inputs[0].shape().to_vec(),
        ))],
        K::SumAll | K::ReduceSum | K::ReduceMean => {
            vec![Some(reduce::vjp(op, inputs[0], grad_out))]
        }
        K::Reshape | K::Permute | K::BroadcastTo | K::Concat | K::Slice => {
            layout::vjp(op, inputs, grad_out)
        }
        K::IndexSelect | K::Gather | K::ScatterAdd => index::vjp(op, inputs, grad_out)?,
        K::Matmul | K::Linear | K::MseLoss => linalg::vjp(op, inputs, grad_out, needs),
        K::LayerNorm | K::RmsNorm | K::BatchNorm => norm::vjp(op, inputs, grad_out),
        K::Conv2d | K::ConvTranspose2d => conv::vjp(op, inputs, grad_out, needs),
        K::MaxPool2d | K::AvgPool2d | K::SmoothMaxPool2d => vec![Some(tensor(
            pool::vjp(op, inputs[0], output, grad_out),
            inputs[0].shape().to_vec(),
        ))],
        K::SpectralConv1d | K::SelectiveScan | K::ScaledDotProductAttention => {
            special::vjp(op, inputs, output, grad_out)
        }
        K::FusedMap => match op {
            Op::FusedMap { steps } => fused_map::vjp(steps, inputs, grad_out)?,
            _ => unreachable!("the kind is fused_map"),
        },
        K::Conv2dMap => conv_map::vjp(op, inputs, grad_out, needs)?,
        K::FusedUnary => {
            let g = elementwise::fused_vjp(op, &inputs[0].data(), &grad_out.data());
            vec![Some(tensor(g, inputs[0].shape().to_vec()))]
        }
        _ => {
            let x = inputs[0].data();
            let g = unary_grad(op, &x, output, grad_out);
            vec![Some(tensor(g, inputs[0].shape().to_vec()))]
        }
    })
}

fn unary_grad(op: &Op, x: &[f32], y: &Tensor, g: &Tensor) -> Vec<f32> {
    elementwise::unary_vjp(op, x, &y.data(), &g.data(), y.shape())
}

/// Attention's payload for a flash kernel (CPU or CUDA: their capsules are bound to that op
/// alone), a typed error for any other op.
pub fn flash_payload(op: &Op) -> Result<(Option<f32>, bool, crate::graph::AttentionMask)> {
    op.attention_payload().ok_or_else(|| {
        crate::error::OpError::Payload {
            op: op.name(),
            reason: "the flash-attention kernel computes scaled_dot_product_attention only".into(),
        }
        .into()
    })
}

/// The forward kernel of `native_cpu.flash_attention` (`flash.rs`).
pub fn flash_forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    flash_payload(op)?;
    let out_shape = guard::output_shape(op, inputs)?;
    crate::runtime::buffers::check_output(op.name(), crate::spec::numel(&out_shape))?;
    if crate::spec::numel(&out_shape) == 0 {
        return Ok(tensor(Vec::new(), out_shape));
    }
    // stored head-interleaved when the query is (the heads' merge is then a view)
    let interleave = out_shape.len() == 4 && heads::interleaved(inputs[0]);
    let data = flash::forward(op, inputs, &out_shape, interleave);
    Ok(heads::tensor(data, out_shape, interleave))
}

/// The VJP kernel of `native_cpu.flash_attention` (recomputing, `flash.rs`).
pub fn flash_vjp(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    grad_out: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    flash_payload(op)?;
    if let Some(grads) = vjp_prologue(op, inputs, grad_out, needs)? {
        return Ok(grads);
    }
    Ok(flash::vjp(op, inputs, output, grad_out))
}

/// The binding of `native_cpu.flash_attention`.
pub fn flash_binding() -> KernelBinding {
    KernelBinding::new("native_cpu", flash_forward, Some(flash_vjp))
}

/// The tests that hold the flash kernel to the spec (and to the other native capsule).
pub const FLASH_TESTS: &[&str] = &[
    "tests/flash_attention.rs::native_flash_kernel_matches_the_spec",
    "tests/flash_attention.rs::native_flash_kernel_equals_the_native_sdpa_kernel",
    "tests/flash_attention.rs::native_flash_kernel_reads_strided_operands_in_place",
    "tests/flash_attention.rs::native_flash_kernel_skips_only_keys_the_mask_blocks_for_a_whole_tile",
    "tests/flash_attention.rs::native_flash_kernel_stores_results_like_its_head_split_inputs",
];

/// `native_cpu.flash_attention`: the second native capsule of `scaled_dot_product_attention`
/// (tiled, online softmax, no L×S matrix; `flash.rs`), with the flash tests as evidence.
pub fn flash_capsule() -> KernelCapsule {
    let op = OpKind::ScaledDotProductAttention;
    let here =
        |sym: &str| Provenance::source("crates/torchlean/src/providers/native_cpu/flash.rs", sym);
    let tests = Evidence::TestSuite {
        tests: FLASH_TESTS.iter().map(|s| s.to_string()).collect(),
    };
    let base = capsule(op);
    KernelCapsule {
        name: "native_cpu.flash_attention".into(),
        value_contract: descriptor(
            value_claim(op),
            "tiled attention with an online softmax; matches the f64 spec (and the native SDPA kernel) on random shapes, masks and tile-crossing sizes",
            tests.clone(),
            here("forward"),
        ),
        vjp_contract: descriptor(
            vjp_claim(op, base.vjp_mode),
            "recomputing tiled VJP (log-sum-exp pass, then the gradient products per tile); matches the f64 spec VJP on the same inputs",
            tests,
            here("vjp"),
        ),
        ..base
    }
}

/// The tensor kernels shared by every native CPU capsule.
pub fn binding() -> KernelBinding {
    KernelBinding::new("native_cpu", forward, Some(vjp)).with_in_place(forward_in_place)
}

/// The binding of the native CPU capsule of `op`: the shared tensor kernels, plus the
/// destination-passing ones where the op has them.
pub fn binding_for(op: OpKind) -> KernelBinding {
    let b = binding().with_dense(dense::kernels(op));
    match op {
        OpKind::AdamStep => b.with_update_many(update::adam_step_in_place),
        _ => b,
    }
}

/// The destination-passing kernels of the native capsule of `op`, if any (for the
/// conformance harness, which checks them against the tensor kernels).
pub fn dense_kernels(op: OpKind) -> Option<crate::runtime::kernel::DenseKernels> {
    dense::kernels(op)
}

/// The names of the conformance tests that back value and VJP claims.
pub const VALUE_TESTS: &[&str] = &[
    "tests/conformance.rs::native_cpu_forward_matches_spec",
    "tests/conformance.rs::native_cpu_in_place_matches_forward",
    "tests/conformance.rs::native_cpu_dense_kernels_match_the_tensor_kernels",
    "tests/conformance.rs::native_cpu_update_many_matches_forward",
];
pub const VJP_TESTS: &[&str] = &[
    "tests/conformance.rs::native_cpu_vjp_matches_spec",
    "tests/conformance.rs::native_cpu_dense_kernels_match_the_tensor_kernels",
];

/// The native capsule of one op.
pub fn capsule(op: OpKind) -> KernelCapsule {
    let here =
        |sym: &str| Provenance::source("crates/torchlean/src/providers/native_cpu/mod.rs", sym);
    let vjp_mode = if op.differentiable() {
        VjpMode::BackendVjp
    } else {
        VjpMode::None
    };
    let tests = |t: &[&str]| Evidence::TestSuite {
        tests: t.iter().map(|s| s.to_string()).collect(),
    };
    KernelCapsule {
        name: format!("native_cpu.{}", op.name()),
        op,
        provider: Provider::NativeCpu,
        device: Device::Cpu,
        spec_name: spec_name(op),
        trust_level: TrustLevel::Checked,
        supports_forward: true,
        vjp_mode,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: vec![],
        precision: crate::backend::Precision::F32,
        shape_contract: descriptor(
            shape_claim(op),
            "every call validates input shapes with spec::infer_shape",
            Evidence::RuntimeGuard {
                guard: crate::guard!(guard::shape_rule),
            },
            here("forward"),
        ),
        layout_contract: descriptor(
            layout_claim(op),
            "every input is in host memory and its strided layout stays inside its storage; kernels read it in row-major order",
            Evidence::RuntimeGuard {
                guard: crate::guard!(guard::host_inputs_in_bounds),
            },
            here("forward"),
        ),
        value_contract: descriptor(
            value_claim(op),
            "matches the f64 spec on the conformance harness's random inputs",
            tests(VALUE_TESTS),
            here("forward"),
        ),
        vjp_contract: descriptor(
            vjp_claim(op, vjp_mode),
            "matches the f64 spec VJP on the conformance harness's random inputs",
            if op.differentiable() {
                tests(VJP_TESTS)
            } else {
                Evidence::NotProvided
            },
            here("vjp"),
        ),
    }
}

/// The mutation tests of the replay checkers (each feeds corrupted results and expects a
/// rejection).
pub const REPLAY_MUTATION_TESTS: &[&str] = &[
    "tests/replay.rs::product_checker_rejects_corrupted_products",
    "tests/replay.rs::recompute_checker_rejects_corrupted_results",
    "tests/replay.rs::vjp_checkers_reject_corrupted_or_missing_gradients",
    "tests/replay.rs::fast_paths_agree_with_the_whole_call_check",
    "tests/replay.rs::view_results_are_checked_by_their_layout_and_elements",
    "tests/replay.rs::convolution_checker_accepts_kernels_and_rejects_corruptions",
];

/// The replayed native capsule of one op: the same kernels, every obligation discharged by a
/// checker that the runtime runs after every call (shape and layout by `canonical_layout`,
/// value and VJP by the replay checkers). Admitted by `strict` (profile `strict_native_cpu`).
pub fn replayed_capsule(op: OpKind) -> KernelCapsule {
    use super::checkers::replay;
    let here =
        |sym: &str| Provenance::source("crates/torchlean/src/providers/native_cpu/mod.rs", sym);
    let view_op = matches!(
        op,
        OpKind::Reshape | OpKind::Permute | OpKind::BroadcastTo | OpKind::Concat | OpKind::Slice
    );
    let layout_checker = || {
        Evidence::Checker {
        checker: if view_op {
            crate::checker!(super::checkers::view_layout)
        } else {
            crate::checker!(super::checkers::canonical_layout)
        },
        soundness: if view_op {
            "accepted => the result has exactly the shape spec::infer_shape assigns to this call's inputs and a strided layout inside its storage (a view); each gradient of its input's shape and dense: offset 0, exactly numel elements, the row-major strides of its axes in some order (integer check)"
        } else {
            "accepted => the result (or each gradient) has exactly the shape spec::infer_shape assigns to this call's inputs (its input's shape), dense row-major from offset 0 over exactly numel elements (integer check)"
        }
        .into(),
        mutation_tests: if view_op {
            vec![
                "tests/trust.rs::layout_checker_rejects_wrong_shape".into(),
                "tests/trust.rs::dense_layout_checker_rejects_overlaps_gaps_and_offsets".into(),
            ]
        } else {
            vec![
                "tests/trust.rs::layout_checker_rejects_wrong_shape".into(),
                "tests/trust.rs::layout_checker_rejects_non_canonical_view".into(),
            ]
        },
    }
    };
    let replay_checker = |checker, soundness: &str| Evidence::Checker {
        checker,
        soundness: soundness.to_string(),
        mutation_tests: REPLAY_MUTATION_TESTS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    let base = capsule(op);
    KernelCapsule {
        name: format!("native_cpu.replayed.{}", op.name()),
        trust_level: TrustLevel::Verified,
        shape_contract: descriptor(
            shape_claim(op),
            "every result's shape is checked against spec::infer_shape of the call's inputs",
            layout_checker(),
            here("forward"),
        ),
        layout_contract: descriptor(
            layout_claim(op),
            "every result is checked canonical row-major",
            layout_checker(),
            here("forward"),
        ),
        value_contract: descriptor(
            value_claim(op),
            "every call replayed: Freivalds product check (matmul, linear, conv2d, conv_transpose2d) or f64 spec recomputation",
            replay_checker(crate::checker!(replay::replay_forward), replay::FORWARD_SOUNDNESS),
            here("forward"),
        ),
        vjp_contract: descriptor(
            vjp_claim(op, base.vjp_mode),
            "every VJP call replayed: Freivalds for the product and convolution gradients, f64 spec VJP otherwise",
            if op.differentiable() {
                replay_checker(crate::checker!(replay::replay_vjp), replay::VJP_SOUNDNESS)
            } else {
                Evidence::NotProvided
            },
            here("vjp"),
        ),
        ..base
    }
}

/// The replayed capsule of the flash kernel: the replay checkers of attention, and its
/// results checked dense rather than row-major (the output is stored like the query, each
/// gradient like its input: head-interleaved for a head split, see `heads.rs`).
pub fn replayed_flash_capsule() -> KernelCapsule {
    let op = OpKind::ScaledDotProductAttention;
    let here =
        |sym: &str| Provenance::source("crates/torchlean/src/providers/native_cpu/flash.rs", sym);
    let dense = || {
        Evidence::Checker {
        checker: crate::checker!(super::checkers::dense_layout),
        soundness: "accepted => the result (or each gradient) has exactly the shape spec::infer_shape assigns to this call's inputs (its input's shape), and is dense: offset 0, exactly numel elements of storage, strides the row-major strides of its axes in some order, so every element is stored once (integer check)".into(),
        mutation_tests: vec![
            "tests/trust.rs::dense_layout_checker_rejects_overlaps_gaps_and_offsets".into(),
            "tests/trust.rs::layout_checker_rejects_wrong_shape".into(),
        ],
    }
    };
    let base = replayed_capsule(op);
    KernelCapsule {
        name: "native_cpu.replayed.flash_attention".into(),
        shape_contract: descriptor(
            shape_claim(op),
            "every result's shape is checked against spec::infer_shape of the call's inputs",
            dense(),
            here("forward"),
        ),
        layout_contract: descriptor(
            layout_claim(op),
            "every result is checked dense (stored like the query; gradients like their inputs)",
            dense(),
            here("forward"),
        ),
        ..base
    }
}

/// Registers a native capsule (test evidence) for every op.
pub fn register(r: &mut Registry) -> std::result::Result<(), RegistryError> {
    // the flash kernel before the materializing one: `auto` and `only:native_cpu` plan it
    // for attention (the other stays registered: the equality tests compare the two)
    r.register(flash_capsule(), flash_binding())?;
    for &op in OpKind::ALL {
        r.register(capsule(op), binding_for(op))?;
    }
    Ok(())
}

/// Registers a replayed native capsule (checker evidence) for every op.
pub fn register_replayed(r: &mut Registry) -> std::result::Result<(), RegistryError> {
    // the flash kernel first, as in `register`: strict_native_cpu runs the kernels
    // checked_cpu runs, so the checkers are the only difference between the two
    r.register(replayed_flash_capsule(), flash_binding())?;
    for &op in OpKind::ALL {
        r.register(replayed_capsule(op), binding_for(op))?;
    }
    Ok(())
}
