//! The only place where theorem evidence can be minted.
//!
//! Rust carries no proof terms, so "theorem" means: the claim holds for all inputs *by
//! construction*, and this small module checked the construction before issuing a
//! [`Certificate`]. The one construction recognized today is the `reference` provider's: its
//! bound forward and VJP kernels are the `spec` functions instantiated at f32 (behind a
//! layout adapter), and its shape rule is `spec::infer_shape`, which `spec::forward` applies.
//!
//! The construction is recorded in the kernels' identities ([`KernelId`]): this module alone
//! mints identities of construction "spec at f32" ([`spec_instantiation_id`], crate-private),
//! and within the crate only `KernelBinding::spec_instantiation` (runtime/kernel.rs), called
//! by `providers/reference.rs`, pairs them with functions. A certificate covers a binding
//! only when **every** kernel the binding carries — forward, VJP, in-place and
//! destination-passing variants — has such an identity and the binding's identities are the
//! ones the certificate was issued for. `Certificate` has private fields and no public
//! constructor, `Default` or `Deserialize`. This module imports neither providers nor the
//! runtime.

use super::capsule::ContractClaim;
use super::identity::{Construction, KernelId, KernelSlot};
use serde::Serialize;

/// Proof that a claim holds by construction for the kernels of one binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Certificate {
    claim: ContractClaim,
    construction: &'static str,
    kernels: Vec<KernelId>,
}

impl Certificate {
    /// The claim this certificate proves.
    pub fn claim(&self) -> &ContractClaim {
        &self.claim
    }

    /// The kernels it was issued for.
    pub fn kernels(&self) -> &[KernelId] {
        &self.kernels
    }

    /// Whether the certificate covers a binding with exactly these kernel identities (every
    /// one of them by construction).
    pub fn covers(&self, kernels: &[KernelId]) -> bool {
        let mut mine = self.kernels.clone();
        let mut theirs = kernels.to_vec();
        mine.sort_by_key(|k| k.slot());
        theirs.sort_by_key(|k| k.slot());
        mine == theirs && all_spec(&theirs)
    }
}

fn all_spec(kernels: &[KernelId]) -> bool {
    !kernels.is_empty()
        && kernels.iter().any(|k| k.slot() == KernelSlot::Forward)
        && kernels
            .iter()
            .all(|k| k.construction() == Construction::SpecAtF32)
}

const SPEC_AT_F32: &str =
    "every bound kernel is spec::{infer_shape, forward, vjp} instantiated at f32";

/// The identity of a kernel that is the spec at f32 (for `KernelBinding::spec_instantiation`
/// only).
pub(crate) fn spec_instantiation_id(slot: KernelSlot) -> KernelId {
    KernelId::with_construction("reference", slot, Construction::SpecAtF32)
}

/// Issues a certificate for a shape, value or VJP claim of a binding whose every kernel is
/// the spec at f32. Returns `None` (no theorem) for any other binding or for a layout claim.
pub fn certify_spec_instantiation(
    claim: ContractClaim,
    kernels: &[KernelId],
) -> Option<Certificate> {
    let provable = !matches!(claim, ContractClaim::LayoutCompatibility { .. });
    (provable && all_spec(kernels)).then(|| Certificate {
        claim,
        construction: SPEC_AT_F32,
        kernels: kernels.to_vec(),
    })
}
