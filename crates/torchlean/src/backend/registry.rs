//! The registry of capsules, validated before anything is planned.
//!
//! Registration rejects: a descriptor whose claim belongs in another slot (a value claim in the
//! shape field), a claim about another op, a VJP claim naming a mode other than the capsule's,
//! a duplicate capsule name, a declared trust level its evidence does not support, and theorem
//! evidence whose certificate was issued for another claim or does not cover every kernel the
//! binding carries, and evidence that cites nothing (an empty test list, a checker without
//! mutation tests). Bindings are opaque here: only their kernel identities are read.

use super::capsule::{Evidence, KernelCapsule, Obligation};
use super::identity::Binding;
use super::vocab::{EvidenceKind, TrustLevel, VjpMode};
use crate::graph::OpKind;
use std::sync::Arc;
use thiserror::Error;

/// Why a capsule was refused by the registry.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegistryError {
    #[error("capsule `{capsule}`: the {slot} field holds a {found} claim")]
    MisplacedClaim {
        capsule: String,
        slot: &'static str,
        found: &'static str,
    },
    #[error("capsule `{capsule}`: the {slot} claim is about op `{claimed}`, but the capsule is for `{op}`")]
    WrongOp {
        capsule: String,
        slot: &'static str,
        claimed: &'static str,
        op: &'static str,
    },
    #[error("capsule `{capsule}`: the vjp claim names mode `{claimed}`, but the capsule declares `{declared}`")]
    VjpModeMismatch {
        capsule: String,
        claimed: VjpMode,
        declared: VjpMode,
    },
    #[error("capsule `{capsule}` is already registered")]
    Duplicate { capsule: String },
    #[error("capsule `{capsule}`: trust level `{level}` is not supported by {slot} evidence `{evidence}`")]
    TrustNotSupported {
        capsule: String,
        level: TrustLevel,
        slot: &'static str,
        evidence: EvidenceKind,
    },
    #[error("capsule `{capsule}`: the {slot} theorem's certificate does not cover this claim and kernel")]
    CertificateMismatch { capsule: String, slot: &'static str },
    #[error(
        "capsule `{capsule}`: a capsule without forward support cannot be registered for execution"
    )]
    NoForward { capsule: String },
    #[error("capsule `{capsule}`: vjp mode `{mode}` needs a bound VJP kernel")]
    MissingVjpKernel { capsule: String, mode: VjpMode },
    #[error("capsule `{capsule}`: the {slot} evidence is {reason}, which backs nothing")]
    EmptyEvidence {
        capsule: String,
        slot: &'static str,
        reason: &'static str,
    },
}

/// A capsule with the kernels bound to it.
#[derive(Debug)]
pub struct RegisteredCapsule {
    pub capsule: KernelCapsule,
    pub(crate) binding: Box<dyn Binding>,
}

/// The evidence kinds a declared trust level may rest on.
pub fn trust_supports(level: TrustLevel, evidence: EvidenceKind) -> bool {
    use EvidenceKind as E;
    let rank = |e: EvidenceKind| match e {
        E::Theorem | E::Checker => 0,
        E::RuntimeGuard | E::TestSuite => 1,
        E::FuzzOracle => 2,
        E::TrustedBoundary => 3,
        E::NotProvided => 4,
    };
    let allowed = match level {
        TrustLevel::Verified => 0,
        TrustLevel::Checked => 1,
        TrustLevel::Fuzzed => 2,
        TrustLevel::TrustedExternal => 3,
    };
    rank(evidence) <= allowed
}

/// Validates one capsule against its bound kernels.
pub fn validate(capsule: &KernelCapsule, binding: &dyn Binding) -> Result<(), RegistryError> {
    let name = || capsule.name.clone();
    let kernel_ids = binding.kernel_ids();
    let has_vjp = kernel_ids
        .iter()
        .any(|k| k.slot() == super::identity::KernelSlot::Vjp);
    if !capsule.supports_forward {
        return Err(RegistryError::NoForward { capsule: name() });
    }
    for slot in Obligation::ALL {
        let d = capsule.contract(slot);
        let found = d.claim.obligation();
        if found != slot {
            return Err(RegistryError::MisplacedClaim {
                capsule: name(),
                slot: slot.label(),
                found: found.label(),
            });
        }
        if d.claim.op() != capsule.op {
            return Err(RegistryError::WrongOp {
                capsule: name(),
                slot: slot.label(),
                claimed: d.claim.op().name(),
                op: capsule.op.name(),
            });
        }
        if let super::capsule::ContractClaim::VjpRefinement { mode, .. } = &d.claim {
            if *mode != capsule.vjp_mode {
                return Err(RegistryError::VjpModeMismatch {
                    capsule: name(),
                    claimed: *mode,
                    declared: capsule.vjp_mode,
                });
            }
        }
        if let Some(reason) = d.evidence.emptiness() {
            return Err(RegistryError::EmptyEvidence {
                capsule: name(),
                slot: slot.label(),
                reason,
            });
        }
        if let Evidence::Theorem { certificate, .. } = &d.evidence {
            if certificate.claim() != &d.claim || !certificate.covers(&kernel_ids) {
                return Err(RegistryError::CertificateMismatch {
                    capsule: name(),
                    slot: slot.label(),
                });
            }
        }
        let forward_only_vjp = slot == Obligation::Vjp
            && (capsule.vjp_mode == VjpMode::None || !capsule.op.differentiable());
        if !forward_only_vjp && !trust_supports(capsule.trust_level, d.evidence.kind()) {
            return Err(RegistryError::TrustNotSupported {
                capsule: name(),
                level: capsule.trust_level,
                slot: slot.label(),
                evidence: d.evidence.kind(),
            });
        }
    }
    if matches!(
        capsule.vjp_mode,
        VjpMode::TorchleanTape | VjpMode::BackendVjp
    ) && capsule.op.differentiable()
        && !has_vjp
    {
        return Err(RegistryError::MissingVjpKernel {
            capsule: name(),
            mode: capsule.vjp_mode,
        });
    }
    Ok(())
}

/// All registered capsules, in registration order (which breaks ties in planning).
#[derive(Debug, Default)]
pub struct Registry {
    entries: Vec<Arc<RegisteredCapsule>>,
}

impl Registry {
    pub fn new() -> Self {
        Registry::default()
    }

    /// Validates and adds a capsule.
    pub fn register(
        &mut self,
        capsule: KernelCapsule,
        binding: impl Binding,
    ) -> Result<(), RegistryError> {
        if self.entries.iter().any(|e| e.capsule.name == capsule.name) {
            return Err(RegistryError::Duplicate {
                capsule: capsule.name,
            });
        }
        validate(&capsule, &binding)?;
        self.entries.push(Arc::new(RegisteredCapsule {
            capsule,
            binding: Box::new(binding),
        }));
        Ok(())
    }

    /// Every registered capsule.
    pub fn entries(&self) -> &[Arc<RegisteredCapsule>] {
        &self.entries
    }

    /// The capsules for one op, in registry order.
    pub fn for_op(&self, op: OpKind) -> impl Iterator<Item = &Arc<RegisteredCapsule>> {
        self.entries.iter().filter(move |e| e.capsule.op == op)
    }

    /// Looks a capsule up by name.
    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredCapsule>> {
        self.entries.iter().find(|e| e.capsule.name == name)
    }
}
