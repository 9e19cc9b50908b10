//! Helpers shared by capsule modules to declare descriptors.

use crate::backend::{
    ContractClaim, ContractDescriptor, Evidence, Provenance, TensorLayout, VjpMode,
};
use crate::graph::OpKind;

/// The spec name of an op (documentation, not a proof link).
pub fn spec_name(op: OpKind) -> String {
    format!("spec::{}", op.name())
}

pub fn shape_claim(op: OpKind) -> ContractClaim {
    ContractClaim::ShapeSafety { op }
}

pub fn layout_claim(op: OpKind) -> ContractClaim {
    ContractClaim::LayoutCompatibility {
        op,
        layout: TensorLayout::CanonicalTensor,
    }
}

pub fn value_claim(op: OpKind) -> ContractClaim {
    ContractClaim::ValueRefinement {
        op,
        spec: spec_name(op),
    }
}

pub fn vjp_claim(op: OpKind, mode: VjpMode) -> ContractClaim {
    ContractClaim::VjpRefinement {
        op,
        spec: format!("{}.vjp", spec_name(op)),
        mode,
    }
}

/// A contract. With no evidence (`Evidence::NotProvided`: the VJP of an op without a
/// gradient, the only use) the summary says so instead of describing a kernel that nothing
/// backs (a capsule listing said "the VJP kernel is spec::vjp at f32" for argmax: the trust
/// audit).
pub fn descriptor(
    claim: ContractClaim,
    summary: impl Into<String>,
    evidence: Evidence,
    provenance: Provenance,
) -> ContractDescriptor {
    let summary = if matches!(evidence, Evidence::NotProvided) {
        NO_EVIDENCE_SUMMARY.to_string()
    } else {
        summary.into()
    };
    ContractDescriptor {
        claim,
        summary,
        evidence,
        provenance,
    }
}

/// The summary of a contract without evidence.
pub const NO_EVIDENCE_SUMMARY: &str =
    "nothing is claimed: no evidence (the op has no gradient; no VJP runs)";
