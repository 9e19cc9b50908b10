//! The capsules of the CUDA module: `native_cuda.*` (NVRTC kernels of this crate),
//! `cublas.*` and `cufft.*` (NVIDIA's libraries), each with its four contracts and evidence.
//!
//! Evidence: shape by the shared shape guard, layout by [`crate::guard::cuda_inputs_dense`]
//! (both run before every call); value and VJP by the GPU conformance tests, which compare
//! every kernel with the f64 spec **on a GPU only** — their file name says so
//! (`tests/gpu_only_conformance.rs`), they print that they were skipped on a machine
//! without CUDA and fail instead under `TORCHLEAN_REQUIRE_CUDA=1`; docs/cuda.md records each
//! GPU run. cuBLAS and cuFFT are NVIDIA's code: their provenance names the library (with the
//! same (GPU-only) conformance tests beside it), and its version is read at run time (the
//! report's target line). Trust: `checked` for all three: the libraries are admitted by
//! `checked-runtime` on the strength of the same conformance suite as the native kernels,
//! never as `verified` (docs/cuda.md, "Evidence on CUDA"). `cufft.spectral_conv1d` is
//! registered before `native_cuda.spectral_conv1d`, so `auto` plans it (O(n log n) against
//! the direct sums' O(n·modes)); `prefer:native_cuda` picks the other.
//!
//! Each of those kernels is registered a second time as a *replayed* capsule
//! (`native_cuda.replayed.*`, `cublas.replayed.*`: [`replayed_capsule`]): the same kernel,
//! trust `verified` because every obligation is discharged by a checker run after every
//! call (on host copies of the call's device tensors). Profile `strict_native_cuda` plans
//! those; `checked_cuda` plans the tested ones.

use crate::kernels::{attention, blas, conv, elementwise, fused, optim, reduce, rows, spectral};
use torchlean::backend::{
    ContractClaim, ContractDescriptor, Device, Evidence, KernelCapsule, Provenance, Provider,
    Registry, RegistryError, RuntimeSupport, TensorLayout, TrustLevel, VjpMode,
};
use torchlean::graph::OpKind;
use torchlean::runtime::kernel::KernelBinding;

/// The GPU-only tests that back value claims.
pub const VALUE_TESTS: &[&str] =
    &["crates/torchlean-cuda/tests/gpu_only_conformance.rs::forward_matches_spec_on_the_gpu"];
/// The GPU-only tests that back VJP claims.
pub const VJP_TESTS: &[&str] =
    &["crates/torchlean-cuda/tests/gpu_only_conformance.rs::vjp_matches_spec_on_the_gpu"];

fn spec_name(op: OpKind) -> String {
    format!("spec::{}", op.name())
}

fn here(file: &str, symbol: &str) -> Provenance {
    Provenance {
        source: Some(format!("crates/torchlean-cuda/src/{file}")),
        symbol: Some(symbol.to_string()),
        library: Some("torchlean-cuda".into()),
        version: Some(env!("CARGO_PKG_VERSION").into()),
    }
}

/// A contract (no evidence: the summary says so, as every provider's).
fn d(claim: ContractClaim, summary: &str, evidence: Evidence, p: Provenance) -> ContractDescriptor {
    torchlean::providers::capsules::descriptor(claim, summary, evidence, p)
}

fn tests(t: &[&str]) -> Evidence {
    Evidence::TestSuite {
        tests: t.iter().map(|s| s.to_string()).collect(),
    }
}

fn capsule(op: OpKind, provider: Provider, file: &str) -> KernelCapsule {
    let vjp_mode = if op.differentiable() {
        VjpMode::BackendVjp
    } else {
        VjpMode::None
    };
    // cuBLAS and cuFFT are NVIDIA's code: the provenance names the library (version read at
    // run time, in the report's target line); what backs their value claims is the same GPU
    // conformance suite as the native kernels' (see the module docs)
    let library = match provider {
        Provider::Cublas => Some((
            "cublasLtMatmul for single products (f32 compute; linear's bias and bias gradient in the epilogues), cublasSgemm / cublasSgemmStridedBatched for batched and accumulating ones, and where TORCHLEAN_CUBLASLT=0 or cuBLASLt declines a shape",
            "cuBLAS and cuBLASLt (NVIDIA)",
        )),
        Provider::Cufft => Some((
            "cufftExecR2C / cufftExecC2R (batched 1-D real transforms)",
            "cuFFT (NVIDIA)",
        )),
        _ => None,
    };
    let provenance = |symbol: &str| match library {
        Some((calls, name)) => Provenance {
            source: Some(format!("crates/torchlean-cuda/src/{file}")),
            symbol: Some(format!("{symbol} -> {calls}")),
            library: Some(name.into()),
            version: Some("read at run time: the report's target line".into()),
        },
        None => here(file, symbol),
    };
    let vjp_evidence = if op.differentiable() {
        tests(VJP_TESTS)
    } else {
        Evidence::NotProvided
    };
    KernelCapsule {
        name: format!("{}.{}", provider.label(), op.name()),
        op,
        provider,
        device: Device::Cuda,
        spec_name: spec_name(op),
        trust_level: TrustLevel::Checked,
        supports_forward: true,
        vjp_mode,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: vec![],
        precision: torchlean::backend::Precision::F32,
        shape_contract: d(
            ContractClaim::ShapeSafety { op },
            "every call validates input shapes with spec::infer_shape",
            Evidence::RuntimeGuard {
                guard: torchlean::guard!(torchlean::providers::native_cpu::guard::shape_rule),
            },
            here(file, "forward"),
        ),
        layout_contract: d(
            ContractClaim::LayoutCompatibility {
                op,
                layout: TensorLayout::CanonicalTensor,
            },
            "every input is a dense row-major CUDA tensor from offset 0",
            Evidence::RuntimeGuard {
                guard: torchlean::guard!(crate::guard::cuda_inputs_dense),
            },
            here(file, "forward"),
        ),
        value_contract: d(
            ContractClaim::ValueRefinement {
                op,
                spec: spec_name(op),
            },
            "matches the f64 spec on the conformance table's inputs, on a GPU (GPU-only test; skipped without CUDA)",
            tests(VALUE_TESTS),
            provenance("forward"),
        ),
        vjp_contract: d(
            ContractClaim::VjpRefinement {
                op,
                spec: format!("{}.vjp", spec_name(op)),
                mode: vjp_mode,
            },
            "matches the f64 spec VJP on the conformance table's inputs, on a GPU (GPU-only test; skipped without CUDA)",
            vjp_evidence,
            provenance("vjp"),
        ),
    }
}

/// The replayed capsule of a CUDA capsule: the same kernels, every obligation discharged by a
/// checker the runtime runs after every call — the CPU's replay checkers, on host copies of
/// the call's device tensors (`runtime::guarded`: one device read per checked tensor, so a
/// synchronization per call: slow, and disclosed as such in docs/cuda.md). Admitted by
/// `strict` (profile `strict_native_cuda`).
pub fn replayed_capsule(base: KernelCapsule) -> KernelCapsule {
    use torchlean::providers::checkers::{canonical_layout, replay};
    let op = base.op;
    let mutation_tests = |extra: &[&str]| -> Vec<String> {
        torchlean::providers::native_cpu::REPLAY_MUTATION_TESTS
            .iter()
            .map(|t| format!("crates/torchlean/{t}"))
            .chain(extra.iter().map(|t| t.to_string()))
            .collect()
    };
    let layout = || {
        Evidence::Checker {
        checker: torchlean::checker!(canonical_layout),
        soundness: "accepted => the result (or each gradient) has exactly the shape spec::infer_shape assigns to this call's inputs, dense row-major from offset 0 over exactly numel elements (integer check of the device tensor's own layout over its host copy)".into(),
        mutation_tests: vec![
            "crates/torchlean/tests/trust.rs::layout_checker_rejects_wrong_shape".into(),
            "crates/torchlean/tests/trust.rs::layout_checker_rejects_non_canonical_view".into(),
        ],
    }
    };
    let with = |c: &ContractDescriptor, summary: &str, evidence: Evidence| {
        d(c.claim.clone(), summary, evidence, c.provenance.clone())
    };
    KernelCapsule {
        name: format!("{}.replayed.{}", base.provider.label(), op.name()),
        trust_level: TrustLevel::Verified,
        shape_contract: with(
            &base.shape_contract,
            "every result's shape is checked against spec::infer_shape of the call's inputs",
            layout(),
        ),
        layout_contract: with(
            &base.layout_contract,
            "every result is checked canonical row-major",
            layout(),
        ),
        value_contract: with(
            &base.value_contract,
            "every call replayed on host copies: Freivalds product check (matmul, linear, convolutions) or f64 spec recomputation",
            Evidence::Checker {
                checker: torchlean::checker!(replay::replay_forward),
                soundness: replay::FORWARD_SOUNDNESS.into(),
                mutation_tests: mutation_tests(&[]),
            },
        ),
        vjp_contract: with(
            &base.vjp_contract,
            "every VJP call replayed on host copies: Freivalds for the product and convolution gradients, f64 spec VJP otherwise",
            if op.differentiable() {
                Evidence::Checker {
                    checker: torchlean::checker!(replay::replay_vjp),
                    soundness: replay::VJP_SOUNDNESS.into(),
                    mutation_tests: mutation_tests(&[]),
                }
            } else {
                Evidence::NotProvided
            },
        ),
        ..base
    }
}

/// The native_cuda capsule of `op` (one of [`elementwise::KINDS`], [`rows::KINDS`],
/// [`conv::KINDS`], [`spectral::KINDS`], [`reduce::KINDS`] or [`fused::KINDS`]).
pub fn native_cuda_capsule(op: OpKind) -> KernelCapsule {
    let file = if rows::KINDS.contains(&op) {
        "kernels/rows.rs"
    } else if conv::KINDS.contains(&op) {
        "kernels/conv.rs"
    } else if spectral::KINDS.contains(&op) {
        "kernels/spectral.rs"
    } else if reduce::KINDS.contains(&op) {
        "kernels/reduce.rs"
    } else if fused::KINDS.contains(&op) {
        "kernels/fused.rs"
    } else if optim::KINDS.contains(&op) {
        "kernels/optim.rs"
    } else {
        "kernels/elementwise.rs"
    };
    let mut c = capsule(op, Provider::NativeCuda, file);
    if optim::KINDS.contains(&op) {
        // its update-many kernel (the one Adam runs) is held to the forward kernel's bits
        c.value_contract.evidence = tests(&[VALUE_TESTS[0], OPTIM_TEST]);
    }
    let queued = elementwise::binary_code(op).is_some()
        || op == OpKind::Compare
        || elementwise::UNARY_KINDS.contains(&op);
    if queued {
        // small calls run through the launch queue (`queue.rs`), held to the direct
        // launch's bits
        c.value_contract.summary = format!(
            "{}; calls of at most {} elements (same-shape binary maps, unary maps) wait in the launch queue and run, in order, up to {} per launch of `queued_maps`, with the direct kernel's per-element function (held to its bits by a GPU-only test)",
            c.value_contract.summary,
            crate::queue::SMALL,
            crate::queue::CAPACITY
        );
        c.value_contract.evidence = tests(&[VALUE_TESTS[0], QUEUE_TEST]);
    }
    c
}

/// The GPU-only test of the launch queue: queued maps give the bits of the same calls
/// launched one by one, a dependent chain longer than the queue the CPU's, and kernels,
/// cuBLAS and the host read queued results correctly.
pub const QUEUE_TEST: &str =
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::queued_maps_give_the_direct_launches_bits";

/// The GPU-only test of `adam_step`'s kernels: the forward and the update-many kernel give
/// the CPU kernel's bits, in place on owned targets, into new buffers for shared ones.
pub const OPTIM_TEST: &str =
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::adam_step_on_the_gpu_gives_the_cpu_bits_in_place";

/// The tests that hold the flash-attention kernels to the spec (random shapes crossing the
/// tiles and chunks, every mask kind, causal, fully blocked rows, non-finite values): on the
/// GPU (GPU-only), beside the conformance table's attention rows, and the same kernel source
/// under a CPU emulation of CUDA's threads (runs everywhere a C++ compiler is).
pub const FLASH_TESTS: &[&str] = &[
    "crates/torchlean-cuda/tests/emulated_flash.rs::flash_kernels_match_the_spec_under_cpu_emulation",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::flash_attention_matches_the_spec_on_the_gpu",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::flash_tensor_core_kernels_keep_f32_level_accuracy",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::forward_matches_spec_on_the_gpu",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::vjp_matches_spec_on_the_gpu",
];

/// `native_cuda.flash_attention`: FlashAttention-2-style fused attention (no L×S matrix in
/// device memory, recomputing VJP with dQ summed in a fixed order — in slots, by a kernel
/// per query tile, or, opt-in, added in turns by the key kernel: bit-identical run to run;
/// `kernels/attention.rs`, `kernels/attention_slots.rs`), registered before the
/// composition: `auto`,
/// `prefer:native_cuda` and (replayed) `strict_native_cuda` plan it.
pub fn flash_capsule() -> KernelCapsule {
    flash_capsule_with(
        "native_cuda.flash_attention",
        FLASH_DETERMINISM_TESTS,
        "recomputing tiled VJP (row statistics, then dK/dV by a kernel per key tile; dQ added by the same kernel in turns, key tile after key tile, where it runs one chunk of each head dimension (TORCHLEAN_FLASH_DQ_ORDERED=0: not), else into at most 16 slots added in order, else by a kernel per query tile; every sum in a fixed order: bit-identical run to run; with the opt-in TORCHLEAN_FLASH_MMA=1 and d, dv <= 64 and every |q|, |k|, |v|, |O|, |dO| < 2^24, the key kernel's products in split-TF32 on tensor cores); matches the f64 spec VJP on the same inputs (GPU-only tests, skipped without CUDA; and the CPU emulation of both dQ paths), and two runs give the same bits (GPU-only test)",
        true,
    )
}

/// `native_cuda.flash_attention_atomic`: the same forward, and a VJP whose key kernel also
/// adds dQ with `atomicAdd` when d, dv <= 64 (two L×S×d products fewer than the
/// deterministic VJP, in an order that varies from run to run). Declared nondeterministic:
/// planned only under a policy that opts in (`--allow-nondeterministic`), then before the
/// deterministic capsule.
pub fn flash_atomic_capsule() -> KernelCapsule {
    flash_capsule_with(
        "native_cuda.flash_attention_atomic",
        &[],
        "recomputing tiled VJP (row statistics, then dK/dV per key tile; dQ added atomically by the same kernel when d, dv <= 64 — an order that varies from run to run —, else by a kernel per query tile; with the opt-in TORCHLEAN_FLASH_MMA=1 and d, dv <= 64 and every |q|, |k|, |v|, |O|, |dO| < 2^24, the key kernel's five products in split-TF32 on tensor cores); matches the f64 spec VJP on the same inputs (GPU-only tests, skipped without CUDA; and the CPU emulation, both dQ paths)",
        false,
    )
}

/// The GPU tests that hold the deterministic flash VJP bit-identical run to run, each of its
/// dQ paths (the default, the grouped slots, the opt-in ordered additions) against the CPU.
const FLASH_DETERMINISM_TESTS: &[&str] = &[
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::flash_attention_vjp_is_bit_identical_run_to_run",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::flash_attention_dq_in_grouped_slots_matches_the_cpu_and_repeats",
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::flash_attention_ordered_dq_matches_the_cpu_and_repeats",
];

fn flash_capsule_with(
    name: &str,
    vjp_tests: &[&'static str],
    vjp_summary: &str,
    deterministic: bool,
) -> KernelCapsule {
    let op = OpKind::ScaledDotProductAttention;
    let base = capsule(op, Provider::NativeCuda, "kernels/attention.rs");
    let with = |d: &ContractDescriptor, summary: &str, extra: &[&'static str]| {
        let names: Vec<&'static str> = FLASH_TESTS.iter().chain(extra).copied().collect();
        ContractDescriptor {
            summary: summary.into(),
            evidence: tests(&names),
            ..d.clone()
        }
    };
    KernelCapsule {
        name: name.into(),
        value_contract: with(
            &base.value_contract,
            "tiled attention with an online softmax (on sm_80+ with d, dv <= 64 and every |q|, |k|, |v| < 2^24, its two products in split-TF32 on tensor cores: three TF32 products per f32 product, each within about 2^-20 |a||b|, f32 sums; otherwise, or with TORCHLEAN_FLASH_MMA=0, f32 FMA products; the report's target line says which); matches the f64 spec on random shapes crossing the tiles, every mask kind, causal, fully blocked rows and non-finite values, and on the conformance table's rows (GPU-only tests, skipped without CUDA; and the same source under a CPU emulation of its threads)",
            &[],
        ),
        vjp_contract: with(&base.vjp_contract, vjp_summary, vjp_tests),
        deterministic,
        ..base
    }
}

/// The binding of `native_cuda.flash_attention` (deterministic VJP).
pub fn native_cuda_attention_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", attention::forward, Some(attention::vjp))
}

/// The binding of `native_cuda.flash_attention_atomic` (dQ added atomically).
pub fn native_cuda_attention_atomic_binding() -> KernelBinding {
    KernelBinding::new(
        "native_cuda",
        attention::forward,
        Some(attention::vjp_atomic),
    )
}

/// The cufft capsule of `op` (one of [`spectral::KINDS`]).
pub fn cufft_capsule(op: OpKind) -> KernelCapsule {
    capsule(op, Provider::Cufft, "kernels/spectral.rs")
}

/// The binding of the cufft capsules (the spectral kernels with cuFFT's transforms).
pub fn cufft_binding() -> KernelBinding {
    KernelBinding::new("cufft", spectral::forward_fft, Some(spectral::vjp_fft))
}

/// The GPU-only test that backs the TF32 capsules' value and VJP claims (their own, looser
/// bound).
pub const TF32_TESTS: &[&str] = &[
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::tf32_products_stay_within_their_declared_bound",
];

/// The declared error bound of a TF32 product (shown in the report).
pub const TF32_BOUND: &str = "every element within (2^-9 + gamma_k) * (|A||B|)_ij of the exact product: each input rounded to TF32's 10-bit mantissa (relative error <= 2^-10 even if truncated), products accumulated in f32 (gamma_k, k the inner dimension); about 1000x the f32 capsule's bound";

/// The opt-in TF32 capsule of `op` (one of [`blas::KINDS`]): cuBLAS with
/// `CUBLAS_TF32_TENSOR_OP_MATH`, its own declared bound, planned only under a policy that
/// opted into TF32 (`--tf32`, `checked_cuda_tf32`). No replayed twin: the replay checkers'
/// f32 bound would (rightly) reject TF32 results, so `strict` never runs TF32.
pub fn cublas_tf32_capsule(op: OpKind) -> KernelCapsule {
    let base = cublas_capsule(op);
    let with = |d: &ContractDescriptor, what: &str| ContractDescriptor {
        summary: format!(
            "{what} with TF32 products: {TF32_BOUND} (GPU-only test; skipped without CUDA)"
        ),
        evidence: tests(TF32_TESTS),
        ..d.clone()
    };
    let vjp_contract = if op.differentiable() {
        with(&base.vjp_contract, "VJP products")
    } else {
        base.vjp_contract.clone()
    };
    KernelCapsule {
        name: format!("cublas.tf32.{}", op.name()),
        precision: torchlean::backend::Precision::Tf32,
        value_contract: with(&base.value_contract, "forward"),
        vjp_contract,
        ..base
    }
}

/// The binding of the TF32 capsules.
pub fn cublas_tf32_binding() -> KernelBinding {
    KernelBinding::new("cublas", blas::forward_tf32, Some(blas::vjp_tf32))
}

/// The GPU-only test that holds the cuBLASLt products (linear's bias epilogues, unbatched
/// matmuls, forward and VJP) to the f32 product bound at larger shapes than the table's.
pub const CUBLASLT_TEST: &str =
    "crates/torchlean-cuda/tests/gpu_only_conformance.rs::cublaslt_linear_products_stay_within_the_f32_bound";

/// The cublas capsule of `op` (one of [`blas::KINDS`]): the conformance table's tests and
/// the cuBLASLt products' test back its value and VJP claims.
pub fn cublas_capsule(op: OpKind) -> KernelCapsule {
    let mut c = capsule(op, Provider::Cublas, "kernels/blas.rs");
    c.value_contract.evidence = tests(&[VALUE_TESTS[0], CUBLASLT_TEST]);
    c.vjp_contract.evidence = tests(&[VJP_TESTS[0], CUBLASLT_TEST]);
    c
}

/// The binding of the native_cuda kernels.
pub fn native_cuda_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", elementwise::forward, Some(elementwise::vjp))
}

/// The binding of the native_cuda optimizer step over several parameters (not
/// differentiable: no VJP), with its update-many kernel.
pub fn native_cuda_optim_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", optim::forward, None).with_update_many(optim::update_many)
}

/// The binding of the native_cuda row, index and layout kernels.
pub fn native_cuda_rows_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", rows::forward, Some(rows::vjp))
}

/// The binding of the native_cuda convolution, pooling and loss kernels.
pub fn native_cuda_conv_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", conv::forward, Some(conv::vjp))
}

/// The binding of the native_cuda spectral kernels.
pub fn native_cuda_spectral_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", spectral::forward, Some(spectral::vjp))
}

/// The binding of the native_cuda reductions over axes and broadcasting.
pub fn native_cuda_reduce_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", reduce::forward, Some(reduce::vjp))
}

/// The binding of the native_cuda fused unary chains.
pub fn native_cuda_fused_binding() -> KernelBinding {
    KernelBinding::new("native_cuda", fused::forward, Some(fused::vjp))
}

/// The binding of the cuBLAS kernels.
pub fn cublas_binding() -> KernelBinding {
    KernelBinding::new("cublas", blas::forward, Some(blas::vjp))
}

/// The compositions this module declares on `cuda`: those whose parts all have a CUDA
/// capsule here.
pub fn composed_ops() -> Vec<OpKind> {
    torchlean::providers::composition::OPS
        .iter()
        .copied()
        .filter(|&op| {
            torchlean::providers::composition::parts(op)
                .iter()
                .all(|p| {
                    elementwise::KINDS.contains(p)
                        || rows::KINDS.contains(p)
                        || conv::KINDS.contains(p)
                        || spectral::KINDS.contains(p)
                        || reduce::KINDS.contains(p)
                        || fused::KINDS.contains(p)
                        || blas::KINDS.contains(p)
                })
        })
        .collect()
}

/// The `torchlean` composition capsule of `op` on `cuda` (its parts run as CUDA ops of the
/// session).
pub fn composition_capsule(op: OpKind) -> KernelCapsule {
    torchlean::providers::composition::capsule_on(
        op,
        Device::Cuda,
        torchlean::providers::composition::ComposedOn {
            layout_guard: torchlean::guard!(crate::guard::cuda_inputs_dense),
            layout_summary:
                "inputs are dense row-major CUDA tensors; the parts run as CUDA ops of the session",
            value_test: VALUE_TESTS[0],
            vjp_test: VJP_TESTS[0],
        },
    )
}

/// Registers every capsule of the module (native_cuda first — cufft before it for the
/// spectral op —, then cublas, then native_cuda.flash_attention, then the compositions, then
/// the opt-in native_cuda.flash_attention_atomic, then the replayed native_cuda, cufft and
/// cublas capsules of `strict_native_cuda`).
pub fn register(r: &mut Registry) -> Result<(), RegistryError> {
    register_checked(r)?;
    for &op in elementwise::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_binding(),
        )?;
    }
    for &op in rows::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_rows_binding(),
        )?;
    }
    for &op in conv::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_conv_binding(),
        )?;
    }
    for &op in spectral::KINDS {
        r.register(replayed_capsule(cufft_capsule(op)), cufft_binding())?;
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_spectral_binding(),
        )?;
    }
    for &op in reduce::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_reduce_binding(),
        )?;
    }
    for &op in fused::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_fused_binding(),
        )?;
    }
    for &op in optim::KINDS {
        r.register(
            replayed_capsule(native_cuda_capsule(op)),
            native_cuda_optim_binding(),
        )?;
    }
    for &op in blas::KINDS {
        r.register(replayed_capsule(cublas_capsule(op)), cublas_binding())?;
    }
    r.register(
        KernelCapsule {
            name: "native_cuda.replayed.flash_attention".into(),
            ..replayed_capsule(flash_capsule())
        },
        native_cuda_attention_binding(),
    )?;
    Ok(())
}

/// The capsules with test evidence (admitted by `checked-runtime`) and the compositions.
fn register_checked(r: &mut Registry) -> Result<(), RegistryError> {
    for &op in elementwise::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_binding())?;
    }
    for &op in rows::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_rows_binding())?;
    }
    for &op in conv::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_conv_binding())?;
    }
    for &op in spectral::KINDS {
        r.register(cufft_capsule(op), cufft_binding())?;
        r.register(native_cuda_capsule(op), native_cuda_spectral_binding())?;
    }
    for &op in reduce::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_reduce_binding())?;
    }
    for &op in fused::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_fused_binding())?;
    }
    for &op in optim::KINDS {
        r.register(native_cuda_capsule(op), native_cuda_optim_binding())?;
    }
    for &op in blas::KINDS {
        r.register(cublas_capsule(op), cublas_binding())?;
        r.register(cublas_tf32_capsule(op), cublas_tf32_binding())?;
    }
    // the fused attention before the composition, so that `auto` plans it: faster on the
    // GPU (docs/BENCHMARKS.md), memory linear in L, and — with dQ in slots added in order
    // or by the query kernel (kernels::attention_slots) — bit-identical run to run, as the
    // composition
    r.register(flash_capsule(), native_cuda_attention_binding())?;
    for op in composed_ops() {
        r.register(
            composition_capsule(op),
            torchlean::providers::composition::binding(),
        )?;
    }
    // refused unless the policy opts into nondeterministic capsules, and then planned first
    // (the planner sorts it ahead): a choice of reproducibility the user makes, not the
    // planner
    r.register(
        flash_atomic_capsule(),
        native_cuda_attention_atomic_binding(),
    )?;
    Ok(())
}
