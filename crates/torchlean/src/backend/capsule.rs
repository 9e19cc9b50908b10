//! Kernel capsules: the declared description of one kernel and its four contracts.
//!
//! A capsule is data declared *before* planning by a provider's capsule module. Each contract
//! descriptor is a structured claim, a human summary, the evidence for the claim, and the
//! provenance of the code (which is never evidence).

use super::proof::Certificate;
use super::vocab::{
    Device, EvidenceKind, Provider, RuntimeSupport, TensorLayout, TrustLevel, VjpMode,
};
use crate::graph::OpKind;
use serde::Serialize;

/// The four obligations of a capsule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Obligation {
    Shape,
    Layout,
    Value,
    Vjp,
}

impl Obligation {
    pub const ALL: [Obligation; 4] = [
        Obligation::Shape,
        Obligation::Layout,
        Obligation::Value,
        Obligation::Vjp,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Obligation::Shape => "shape",
            Obligation::Layout => "layout",
            Obligation::Value => "value",
            Obligation::Vjp => "vjp",
        }
    }
}

/// The structured claim an obligation makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum ContractClaim {
    ShapeSafety {
        op: OpKind,
    },
    LayoutCompatibility {
        op: OpKind,
        layout: TensorLayout,
    },
    ValueRefinement {
        op: OpKind,
        spec: String,
    },
    VjpRefinement {
        op: OpKind,
        spec: String,
        mode: VjpMode,
    },
}

impl ContractClaim {
    /// Which obligation slot this claim belongs in.
    pub fn obligation(&self) -> Obligation {
        match self {
            ContractClaim::ShapeSafety { .. } => Obligation::Shape,
            ContractClaim::LayoutCompatibility { .. } => Obligation::Layout,
            ContractClaim::ValueRefinement { .. } => Obligation::Value,
            ContractClaim::VjpRefinement { .. } => Obligation::Vjp,
        }
    }

    /// The op the claim is about.
    pub fn op(&self) -> OpKind {
        match self {
            ContractClaim::ShapeSafety { op }
            | ContractClaim::LayoutCompatibility { op, .. }
            | ContractClaim::ValueRefinement { op, .. }
            | ContractClaim::VjpRefinement { op, .. } => *op,
        }
    }

    /// A one-line rendering for reports.
    pub fn render(&self) -> String {
        match self {
            ContractClaim::ShapeSafety { op } => format!("shape_safety({})", op.name()),
            ContractClaim::LayoutCompatibility { op, layout } => {
                format!("layout_compatibility({}, {})", op.name(), layout)
            }
            ContractClaim::ValueRefinement { op, spec } => {
                format!("value_refinement({}, {})", op.name(), spec)
            }
            ContractClaim::VjpRefinement { op, spec, mode } => {
                format!("vjp_refinement({}, {}, {})", op.name(), spec, mode)
            }
        }
    }
}

/// The evidence for a claim. Names in `checker`, `runtime_guard`, `test_suite` and
/// `fuzz_oracle` must resolve to real functions and tests (enforced by a registry test).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "evidence", rename_all = "snake_case")]
pub enum Evidence {
    /// Holds for all inputs by construction; the certificate can only be minted by
    /// `backend::proof` after it checked the construction.
    Theorem {
        statement: String,
        certificate: Certificate,
    },
    /// An executable checker run on every call, with its soundness statement.
    Checker {
        checker: String,
        soundness: String,
        mutation_tests: Vec<String>,
    },
    /// Validation performed at the execution boundary.
    RuntimeGuard {
        guard: String,
    },
    /// A differential or regression test suite.
    TestSuite {
        tests: Vec<String>,
    },
    /// Sampled differential testing.
    FuzzOracle {
        oracle: String,
    },
    /// Code whose correctness is assumed.
    TrustedBoundary {
        boundary: String,
    },
    NotProvided,
}

impl Evidence {
    pub fn kind(&self) -> EvidenceKind {
        match self {
            Evidence::Theorem { .. } => EvidenceKind::Theorem,
            Evidence::Checker { .. } => EvidenceKind::Checker,
            Evidence::RuntimeGuard { .. } => EvidenceKind::RuntimeGuard,
            Evidence::TestSuite { .. } => EvidenceKind::TestSuite,
            Evidence::FuzzOracle { .. } => EvidenceKind::FuzzOracle,
            Evidence::TrustedBoundary { .. } => EvidenceKind::TrustedBoundary,
            Evidence::NotProvided => EvidenceKind::NotProvided,
        }
    }

    /// The names this evidence cites (tests, checkers, guards), for the existence check.
    pub fn cited_names(&self) -> Vec<&str> {
        match self {
            Evidence::Checker {
                checker,
                mutation_tests,
                ..
            } => std::iter::once(checker.as_str())
                .chain(mutation_tests.iter().map(|s| s.as_str()))
                .collect(),
            Evidence::RuntimeGuard { guard } => vec![guard.as_str()],
            Evidence::TestSuite { tests } => tests.iter().map(|s| s.as_str()).collect(),
            Evidence::FuzzOracle { oracle } => vec![oracle.as_str()],
            _ => vec![],
        }
    }

    /// A short rendering for reports.
    pub fn render(&self) -> String {
        match self {
            Evidence::Theorem { statement, .. } => format!("theorem: {statement}"),
            Evidence::Checker { checker, .. } => format!("checker {checker} (recheck every call)"),
            Evidence::RuntimeGuard { guard } => format!("runtime_guard {guard}"),
            Evidence::TestSuite { tests } => format!("test_suite {}", tests.join(", ")),
            Evidence::FuzzOracle { oracle } => format!("fuzz_oracle {oracle}"),
            Evidence::TrustedBoundary { boundary } => format!("trusted_boundary {boundary}"),
            Evidence::NotProvided => "not_provided".to_string(),
        }
    }
}

/// Where the code came from. Never evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Provenance {
    pub source: Option<String>,
    pub symbol: Option<String>,
    pub library: Option<String>,
    pub version: Option<String>,
}

impl Provenance {
    /// Provenance of code in this crate.
    pub fn source(file: &str, symbol: &str) -> Self {
        Provenance {
            source: Some(file.to_string()),
            symbol: Some(symbol.to_string()),
            library: Some("torchlean".to_string()),
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
        }
    }
}

/// One contract: claim + summary + evidence + provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContractDescriptor {
    pub claim: ContractClaim,
    pub summary: String,
    pub evidence: Evidence,
    pub provenance: Provenance,
}

/// The declared description of one kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelCapsule {
    pub name: String,
    pub op: OpKind,
    pub provider: Provider,
    pub device: Device,
    pub spec_name: String,
    pub trust_level: TrustLevel,
    pub supports_forward: bool,
    pub vjp_mode: VjpMode,
    pub runtime_support: RuntimeSupport,
    /// Whether results are bit-identical run to run (reductions are deterministic by default).
    pub deterministic: bool,
    pub shape_contract: ContractDescriptor,
    pub layout_contract: ContractDescriptor,
    pub value_contract: ContractDescriptor,
    pub vjp_contract: ContractDescriptor,
}

impl KernelCapsule {
    /// The descriptor in the slot of `obligation`.
    pub fn contract(&self, obligation: Obligation) -> &ContractDescriptor {
        match obligation {
            Obligation::Shape => &self.shape_contract,
            Obligation::Layout => &self.layout_contract,
            Obligation::Value => &self.value_contract,
            Obligation::Vjp => &self.vjp_contract,
        }
    }
}
