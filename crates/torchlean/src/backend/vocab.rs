//! The closed vocabularies of the trust layer, each with stable snake_case labels.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! labeled_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),* }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            /// The stable label.
            pub fn label(self) -> &'static str {
                match self { $($name::$variant => $label),* }
            }
            /// Parses a stable label.
            pub fn from_label(s: &str) -> Option<$name> {
                match s { $($label => Some($name::$variant),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.label())
            }
        }
    };
}

labeled_enum!(
    /// Hardware targets. Only `cpu` (and `cuda`, when a CUDA provider is linked) can run.
    Device {
        Cpu => "cpu", Cuda => "cuda", Rocm => "rocm", Metal => "metal", Wasm => "wasm",
        Tpu => "tpu", Trainium => "trainium", Custom => "custom", External => "external",
    }
);

impl Device {
    /// Parses a device name or one of its aliases (gpu, amd, mps, webgpu, xla, neuron).
    pub fn parse(s: &str) -> Option<Device> {
        let canonical = match s {
            "gpu" => "cuda",
            "amd" => "rocm",
            "mps" => "metal",
            "webgpu" => "wasm",
            "xla" => "tpu",
            "neuron" => "trainium",
            other => other,
        };
        Device::from_label(canonical)
    }
}

labeled_enum!(
    /// The arithmetic a kernel's products use: IEEE f32, or TF32 (inputs rounded to a 10-bit
    /// mantissa on tensor cores, f32 accumulation), whose declared error bound is looser. A
    /// TF32 capsule is planned only when the policy opts in (`--tf32`).
    Precision { F32 => "f32", Tf32 => "tf32" }
);

labeled_enum!(
    /// Implementation families.
    Provider {
        Reference => "reference", Torchlean => "torchlean", NativeCpu => "native_cpu",
        NativeCuda => "native_cuda", Cublas => "cublas", Cudnn => "cudnn", Cufft => "cufft",
        Libtorch => "libtorch", Nccl => "nccl", Aten => "aten", Mps => "mps", Webgpu => "webgpu",
        Xla => "xla", Neuron => "neuron", CustomChip => "custom_chip", External => "external",
    }
);

labeled_enum!(
    /// The trust level a capsule declares (validated against its evidence).
    TrustLevel { Verified => "verified", Checked => "checked", Fuzzed => "fuzzed", TrustedExternal => "trusted_external" }
);

labeled_enum!(
    /// Who owns the local derivative of an op.
    VjpMode {
        /// No gradient requested or provided.
        None => "none",
        /// The runtime records the node and applies the spec's backward rule.
        TorchleanTape => "torchlean_tape",
        /// The runtime owns the tape; the provider computes the local VJP.
        BackendVjp => "backend_vjp",
        /// The external runtime owns the local autograd.
        ExternalAutograd => "external_autograd",
    }
);

labeled_enum!(
    /// Where a capsule may be used.
    RuntimeSupport { Eager => "eager", TestOnly => "test_only", PlannerOnly => "planner_only", NotWired => "not_wired" }
);

labeled_enum!(
    /// Named tensor layouts that layout contracts refer to.
    TensorLayout { CanonicalTensor => "canonical_tensor", FlatRowMajor => "flat_row_major", LibtorchCudaView => "libtorch_cuda_view" }
);

labeled_enum!(
    /// The seven kinds of evidence.
    EvidenceKind {
        Theorem => "theorem", Checker => "checker", RuntimeGuard => "runtime_guard", TestSuite => "test_suite",
        FuzzOracle => "fuzz_oracle", TrustedBoundary => "trusted_boundary", NotProvided => "not_provided",
    }
);

labeled_enum!(
    /// Audit outcome of one obligation.
    Disposition { Proved => "proved", Checked => "checked", Guarded => "guarded", Tested => "tested", Fuzzed => "fuzzed", Trusted => "trusted", Missing => "missing" }
);

labeled_enum!(
    /// Execution mode.
    ExecutionMode { Eager => "eager", Compiled => "compiled" }
);

labeled_enum!(
    /// Acceptance policies (custom policies are built with `AcceptancePolicy::custom`).
    PolicyName { Strict => "strict", CheckedRuntime => "checked-runtime", AllowTrustedRuntime => "allow-trusted-runtime", Custom => "custom" }
);

impl EvidenceKind {
    /// The disposition an obligation with this evidence receives.
    pub fn disposition(self) -> Disposition {
        match self {
            EvidenceKind::Theorem => Disposition::Proved,
            EvidenceKind::Checker => Disposition::Checked,
            EvidenceKind::RuntimeGuard => Disposition::Guarded,
            EvidenceKind::TestSuite => Disposition::Tested,
            EvidenceKind::FuzzOracle => Disposition::Fuzzed,
            EvidenceKind::TrustedBoundary => Disposition::Trusted,
            EvidenceKind::NotProvided => Disposition::Missing,
        }
    }
}
