//! Kernel capsules: the declared description of one kernel and its four contracts.
//!
//! A capsule is data declared *before* planning by a provider's capsule module. Each contract
//! descriptor is a structured claim, a human summary, the evidence for the claim, and the
//! provenance of the code (which is never evidence).

use super::guard::{Checker, Guard, Phase};
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

/// The evidence for a claim. Guards and checkers are held as functions, which the runtime
/// calls on every call (structural); the tests of `test_suite` and a checker's mutation tests
/// must be real `#[test]`s that the suite runs (checked against the test binaries' own
/// `--list` by tests/trust.rs); empty citations are refused by the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "evidence", rename_all = "snake_case")]
pub enum Evidence {
    /// Holds for all inputs by construction; the certificate can only be minted by
    /// `backend::proof` after it checked the construction.
    Theorem {
        statement: String,
        certificate: Certificate,
    },
    /// An executable checker the runtime runs after every call, with its soundness
    /// statement and the tests that show it rejects faulty results.
    Checker {
        checker: Checker,
        soundness: String,
        mutation_tests: Vec<String>,
    },
    /// Validation the runtime performs before every call, at the execution boundary.
    RuntimeGuard {
        guard: Guard,
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

    /// The tests this evidence cites (a test suite, a checker's mutation tests), for the
    /// check that each is a real test of the suite.
    pub fn cited_tests(&self) -> Vec<&str> {
        match self {
            Evidence::Checker { mutation_tests, .. } => {
                mutation_tests.iter().map(|s| s.as_str()).collect()
            }
            Evidence::TestSuite { tests } => tests.iter().map(|s| s.as_str()).collect(),
            _ => vec![],
        }
    }

    /// Why this evidence cites nothing that could stand behind it, if so: an empty test
    /// list, a checker without mutation tests or soundness statement, an empty name.
    pub fn emptiness(&self) -> Option<&'static str> {
        match self {
            Evidence::TestSuite { tests } if tests.is_empty() => Some("a test suite of no tests"),
            Evidence::TestSuite { tests } if tests.iter().any(|t| t.trim().is_empty()) => {
                Some("a test suite citing an empty test name")
            }
            Evidence::Checker { mutation_tests, .. } if mutation_tests.is_empty() => {
                Some("a checker without mutation tests")
            }
            Evidence::Checker { soundness, .. } if soundness.trim().is_empty() => {
                Some("a checker without a soundness statement")
            }
            Evidence::Checker { checker, .. } if checker.name().is_empty() => {
                Some("a checker without a name")
            }
            Evidence::RuntimeGuard { guard } if guard.name().is_empty() => {
                Some("a guard without a name")
            }
            Evidence::FuzzOracle { oracle } if oracle.trim().is_empty() => {
                Some("a fuzz oracle without a name")
            }
            Evidence::TrustedBoundary { boundary } if boundary.trim().is_empty() => {
                Some("a trusted boundary without a name")
            }
            Evidence::Theorem { statement, .. } if statement.trim().is_empty() => {
                Some("a theorem without a statement")
            }
            _ => None,
        }
    }

    /// A short rendering for reports.
    pub fn render(&self) -> String {
        match self {
            Evidence::Theorem { statement, .. } => format!("theorem: {statement}"),
            Evidence::Checker { checker, .. } => {
                format!("checker {} (recheck every call)", checker.name())
            }
            Evidence::RuntimeGuard { guard } => format!("runtime_guard {}", guard.name()),
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
    /// The ops a composite kernel runs as parts (empty for ordinary kernels). They are
    /// planned and gated under the same profile as the composite, before any kernel runs,
    /// and reported as rows nested under it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<OpKind>,
    /// The arithmetic of its products (f32 for every capsule but the opt-in TF32 ones).
    pub precision: super::Precision,
    pub shape_contract: ContractDescriptor,
    pub layout_contract: ContractDescriptor,
    pub value_contract: ContractDescriptor,
    pub vjp_contract: ContractDescriptor,
}

impl KernelCapsule {
    /// The contracts whose guards and checkers apply in `phase`: shape, layout and value for
    /// forward calls; shape, layout and VJP for VJP calls.
    fn phase_contracts(&self, phase: Phase) -> [&ContractDescriptor; 3] {
        match phase {
            Phase::Forward => [
                &self.shape_contract,
                &self.layout_contract,
                &self.value_contract,
            ],
            Phase::Vjp => [
                &self.shape_contract,
                &self.layout_contract,
                &self.vjp_contract,
            ],
        }
    }

    /// The guards the runtime runs before every call of `phase` (in contract order).
    pub fn guards(&self, phase: Phase) -> Vec<Guard> {
        self.phase_contracts(phase)
            .iter()
            .filter_map(|d| match &d.evidence {
                Evidence::RuntimeGuard { guard } => Some(*guard),
                _ => None,
            })
            .fold(Vec::new(), |mut v: Vec<Guard>, g| {
                // one call per distinct guard, however many contracts cite it
                if !v.contains(&g) {
                    v.push(g);
                }
                v
            })
    }

    /// The checkers the runtime runs after every call of `phase` (in contract order).
    pub fn checkers(&self, phase: Phase) -> Vec<Checker> {
        self.phase_contracts(phase)
            .iter()
            .filter_map(|d| match &d.evidence {
                Evidence::Checker { checker, .. } => Some(*checker),
                _ => None,
            })
            .fold(Vec::new(), |mut v: Vec<Checker>, c| {
                if !v.contains(&c) {
                    v.push(c);
                }
                v
            })
    }

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
