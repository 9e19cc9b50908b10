//! The capsules of the LibTorch module, on `cuda` and on `cpu`:
//!
//! | capsule | value | VJP | vjp mode |
//! |---|---|---|---|
//! | `libtorch.sdpa_forward` | LibTorch (trusted boundary) | torchlean's composition VJP through its tape (parts planned and gated) | `backend_vjp` |
//! | `libtorch.sdpa_autograd` | LibTorch (trusted boundary) | LibTorch's autograd (trusted boundary) | `external_autograd` |
//!
//! Shape: the shared shape guard (`spec::infer_shape`); layout: [`crate::guard::libtorch_inputs`]
//! (both run before every call). Trust level `trusted_external`: admitted only by
//! `allow-trusted-runtime` (the libtorch profiles). The LibTorch version is read at run time
//! by the probe (the report's target line). Beside the trusted boundary, the conformance
//! tests of `tests/libtorch_conformance.rs` compare both capsules with the f64 spec (on the
//! CPU here, on CUDA on the GPU machine); they are named in the summaries, not cited as
//! evidence, because the default suite (CI) never builds this crate.

use torchlean::backend::{
    ContractClaim, ContractDescriptor, Device, Evidence, KernelCapsule, Precision, Provenance,
    Provider, Registry, RegistryError, RuntimeSupport, TensorLayout, TrustLevel, VjpMode,
};
use torchlean::graph::OpKind;
use torchlean::providers::composition;
use torchlean::runtime::kernel::KernelBinding;

/// The tests that compare these capsules with the f64 spec (run by
/// `scripts/libtorch-gpu-check.sh`'s bundle on the GPU machine and by `cargo test` in this
/// crate on the CPU).
pub const TESTS: &[&str] = &[
    "crates/torchlean-libtorch/tests/libtorch_conformance.rs::forward_matches_spec",
    "crates/torchlean-libtorch/tests/libtorch_conformance.rs::vjps_match_spec",
];

/// The test that compares the composition's VJP (the forward bridge's backward rule) with
/// the f64 spec on `device`: the conformance harness on the CPU, the GPU-only conformance
/// test of the CUDA module on `cuda`.
pub fn composition_vjp_test(device: Device) -> &'static str {
    match device {
        Device::Cuda => {
            "crates/torchlean-cuda/tests/gpu_only_conformance.rs::vjp_matches_spec_on_the_gpu"
        }
        _ => "crates/torchlean/tests/conformance.rs::composition_vjp_matches_spec",
    }
}

/// The boundary LibTorch's forward value rests on.
pub const VALUE_BOUNDARY: &str = "LibTorch at::scaled_dot_product_attention (float32, boolean mask or additive bias passed as its attn_mask; version read at run time), with the bridge's mask combination, zeroing of fully blocked rows and NaN for all -inf bias rows (crates/torchlean-libtorch/src/bridge.rs)";
/// The boundary LibTorch's autograd VJP rests on.
pub const VJP_BOUNDARY: &str = "LibTorch autograd of at::scaled_dot_product_attention (torch::autograd::grad of sum(y * cotangent); version read at run time)";

const OP: OpKind = OpKind::ScaledDotProductAttention;

fn spec() -> String {
    format!("spec::{}", OP.name())
}

fn here(symbol: &str) -> Provenance {
    Provenance {
        source: Some("crates/torchlean-libtorch/src/bridge.rs".into()),
        symbol: Some(symbol.into()),
        library: Some("LibTorch (PyTorch 2.11, through tch 0.24)".into()),
        version: Some("read at run time: the report's target line".into()),
    }
}

fn d(
    claim: ContractClaim,
    summary: String,
    evidence: Evidence,
    p: Provenance,
) -> ContractDescriptor {
    ContractDescriptor {
        claim,
        summary,
        evidence,
        provenance: p,
    }
}

/// The capsule `name` on `device` with VJP mode `mode` (`backend_vjp`: torchlean's
/// composition VJP; `external_autograd`: LibTorch's).
fn capsule(name: &str, device: Device, mode: VjpMode) -> KernelCapsule {
    let external = mode == VjpMode::ExternalAutograd;
    let tests = TESTS.join(", ");
    let vjp_contract = if external {
        d(
            ContractClaim::VjpRefinement {
                op: OP,
                spec: format!("{}.vjp", spec()),
                mode,
            },
            format!("LibTorch's autograd owns the local backward: the forward is re-run on LibTorch leaves and differentiated by LibTorch; a fully blocked row passes no gradient (masked_fill); compared with the f64 spec VJP by {tests} (not cited: outside the default suite)"),
            Evidence::TrustedBoundary {
                boundary: VJP_BOUNDARY.into(),
            },
            here("sdpa_autograd_vjp"),
        )
    } else {
        d(
            ContractClaim::VjpRefinement {
                op: OP,
                spec: format!("{}.vjp", spec()),
                mode,
            },
            "torchlean's own backward rule: the composition's VJP (matmul, hard-masked softmax, matmul) re-run on the tape, its parts planned and gated under the same profile".into(),
            Evidence::TestSuite {
                tests: vec![composition_vjp_test(device).into()],
            },
            Provenance::source("crates/torchlean/src/providers/composition.rs", "vjp"),
        )
    };
    KernelCapsule {
        name: if device == Device::Cuda {
            name.to_string()
        } else {
            format!("{name}.{}", device.label())
        },
        op: OP,
        provider: Provider::Libtorch,
        device,
        spec_name: spec(),
        trust_level: TrustLevel::TrustedExternal,
        supports_forward: true,
        vjp_mode: mode,
        runtime_support: RuntimeSupport::Eager,
        // LibTorch may pick a non-deterministic SDPA backend on CUDA
        deterministic: device == Device::Cpu,
        parts: if external {
            vec![]
        } else {
            composition::parts(OP).to_vec()
        },
        precision: Precision::F32,
        shape_contract: d(
            ContractClaim::ShapeSafety { op: OP },
            "every call validates input shapes with spec::infer_shape".into(),
            Evidence::RuntimeGuard {
                guard: torchlean::guard!(torchlean::providers::native_cpu::guard::shape_rule),
            },
            here("sdpa_forward"),
        ),
        layout_contract: d(
            ContractClaim::LayoutCompatibility {
                op: OP,
                layout: TensorLayout::CanonicalTensor,
            },
            "inputs on one device (cpu or cuda) inside their storage, read row-major and copied into dense LibTorch tensors".into(),
            Evidence::RuntimeGuard {
                guard: torchlean::guard!(crate::guard::libtorch_inputs),
            },
            here("to_tch"),
        ),
        value_contract: d(
            ContractClaim::ValueRefinement { op: OP, spec: spec() },
            format!("LibTorch computes the value; the bridge gives masks the spec's meaning (boolean mask and causal combined; a fully blocked row outputs zeros); compared with the f64 spec by {tests} (not cited: outside the default suite)"),
            Evidence::TrustedBoundary {
                boundary: VALUE_BOUNDARY.into(),
            },
            here("sdpa_forward"),
        ),
        vjp_contract,
    }
}

/// The forward-bridge capsule on `device` (`libtorch.sdpa_forward` on cuda,
/// `libtorch.sdpa_forward.cpu` on the CPU).
pub fn sdpa_forward_capsule(device: Device) -> KernelCapsule {
    capsule("libtorch.sdpa_forward", device, VjpMode::BackendVjp)
}

/// The external-autograd capsule on `device`.
pub fn sdpa_autograd_capsule(device: Device) -> KernelCapsule {
    capsule("libtorch.sdpa_autograd", device, VjpMode::ExternalAutograd)
}

/// LibTorch's forward, torchlean's composition VJP.
pub fn forward_binding() -> KernelBinding {
    KernelBinding::new(
        "libtorch",
        crate::bridge::sdpa_forward,
        Some(composition::vjp),
    )
}

/// LibTorch's forward and LibTorch's autograd.
pub fn autograd_binding() -> KernelBinding {
    KernelBinding::new(
        "libtorch",
        crate::bridge::sdpa_forward,
        Some(crate::bridge::sdpa_autograd_vjp),
    )
}

/// Registers the four capsules (cuda first, then cpu; the forward bridge before the
/// external-autograd one).
pub fn register(r: &mut Registry) -> Result<(), RegistryError> {
    for device in [Device::Cuda, Device::Cpu] {
        r.register(sdpa_forward_capsule(device), forward_binding())?;
        r.register(sdpa_autograd_capsule(device), autograd_binding())?;
    }
    Ok(())
}
