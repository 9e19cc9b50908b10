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

pub fn descriptor(
    claim: ContractClaim,
    summary: impl Into<String>,
    evidence: Evidence,
    provenance: Provenance,
) -> ContractDescriptor {
    ContractDescriptor {
        claim,
        summary: summary.into(),
        evidence,
        provenance,
    }
}
