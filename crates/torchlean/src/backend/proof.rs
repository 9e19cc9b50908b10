//! The only place where theorem evidence can be minted.
//!
//! Rust carries no proof terms, so "theorem" means: the claim holds for all inputs *by
//! construction*, and this small module checked the construction before issuing a
//! [`Certificate`]. The one construction recognized today is the `reference` provider's: its
//! bound forward and VJP kernels are the `spec` functions instantiated at f32 (behind a
//! layout adapter), and its shape rule is `spec::infer_shape`, which `spec::forward` applies.
//! `Certificate` has private fields and no public constructor, `Default` or `Deserialize`.

use super::capsule::ContractClaim;
use crate::providers::reference::{spec_forward_f32, spec_vjp_f32};
use crate::runtime::kernel::{ForwardKernel, KernelBinding, VjpKernel};
use serde::Serialize;

/// Proof that a claim holds by construction for one bound kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Certificate {
    claim: ContractClaim,
    construction: &'static str,
    #[serde(skip)]
    forward_addr: usize,
}

impl Certificate {
    /// The claim this certificate proves.
    pub fn claim(&self) -> &ContractClaim {
        &self.claim
    }

    /// Whether the certificate was issued for exactly this binding.
    pub fn covers(&self, binding: &KernelBinding) -> bool {
        self.forward_addr == binding.forward as usize
    }
}

const SPEC_AT_F32: &str =
    "the bound kernel is spec::{infer_shape, forward, vjp} instantiated at f32";

/// Issues a certificate for a shape, value or VJP claim of a kernel that *is* the spec at f32.
/// Returns `None` (no theorem) for any other binding or for a layout claim.
pub fn certify_spec_instantiation(
    claim: ContractClaim,
    binding: &KernelBinding,
) -> Option<Certificate> {
    let spec_forward = spec_forward_f32 as ForwardKernel as usize;
    let spec_vjp = spec_vjp_f32 as VjpKernel as usize;
    let is_spec = binding.forward as usize == spec_forward
        && binding.vjp.map(|v| v as usize) == Some(spec_vjp);
    let provable = !matches!(claim, ContractClaim::LayoutCompatibility { .. });
    (is_spec && provable).then_some(Certificate {
        claim,
        construction: SPEC_AT_F32,
        forward_addr: binding.forward as usize,
    })
}
