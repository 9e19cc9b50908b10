//! Audit, acceptance policies and the gate.
//!
//! Audit turns a planned kernel's four contracts into obligation reports with dispositions.
//! The gate applies a policy and returns either an accepted value — [`AcceptedKernel`] or
//! [`AcceptedGraphPlan`] — or the structured list of failures. Accepted ⇔ the failure list is
//! empty: both gate functions compute [`gate_failures`] and build the accepted value only
//! when it is empty (property-tested in tests/trust.rs).
//!
//! The accepted types have private fields, no public constructor, no `Default`, no
//! `Deserialize`, and expose their capsule only by shared reference:
//!
//! ```compile_fail
//! // Building one by hand does not compile: the fields are private.
//! let k = torchlean::backend::AcceptedKernel { entry: todo!(), audit: todo!(), policy: todo!() };
//! ```
//!
//! ```compile_fail
//! // There is no Deserialize implementation.
//! let k: torchlean::backend::AcceptedKernel = serde_json::from_str("{}").unwrap();
//! ```
//!
//! ```compile_fail
//! // The capsule cannot be mutated through an accepted kernel.
//! fn forge(k: &mut torchlean::backend::AcceptedKernel) {
//!     k.capsule().trust_level = torchlean::backend::TrustLevel::Verified;
//! }
//! ```
//!
//! ```compile_fail
//! // Nor can a graph plan be built or defaulted.
//! let p: torchlean::backend::AcceptedGraphPlan = Default::default();
//! ```

use super::capsule::{ContractClaim, KernelCapsule, Obligation};
use super::guard::{Checker, Guard, Phase};
use super::identity::Binding;
use super::planner::{
    request_refusal, ExecutionPlan, LoweredGroup, PlanRequest, PlannedKernel, Refusal,
};
use super::registry::RegisteredCapsule;
use super::vocab::{
    Device, Disposition, EvidenceKind, PolicyName, Provider, RuntimeSupport, TrustLevel, VjpMode,
};
use crate::graph::OpKind;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// Which evidence and trust levels a run accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AcceptancePolicy {
    pub name: String,
    pub evidence: Vec<EvidenceKind>,
    pub trust_levels: Vec<TrustLevel>,
    /// Whether capsules with reduced-precision products (TF32) may be planned; off unless the
    /// user opts in (`--tf32`, or a `*_tf32` profile), and then preferred where one exists.
    #[serde(default)]
    pub allow_tf32: bool,
    /// Whether capsules that are not bit-reproducible run to run (e.g. a VJP that adds with
    /// atomics) may be planned; off unless the user opts in (`--allow-nondeterministic`, or
    /// a profile that names it), and then preferred where one exists.
    #[serde(default)]
    pub allow_nondeterministic: bool,
}

impl AcceptancePolicy {
    /// A named policy (not `custom`).
    pub fn named(name: PolicyName) -> Option<AcceptancePolicy> {
        use EvidenceKind as E;
        use TrustLevel as T;
        let (evidence, trust) = match name {
            PolicyName::Strict => (vec![E::Theorem, E::Checker], vec![T::Verified]),
            PolicyName::CheckedRuntime => (
                vec![
                    E::Theorem,
                    E::Checker,
                    E::RuntimeGuard,
                    E::TestSuite,
                    E::FuzzOracle,
                ],
                vec![T::Verified, T::Checked, T::Fuzzed],
            ),
            PolicyName::AllowTrustedRuntime => (
                vec![
                    E::Theorem,
                    E::Checker,
                    E::RuntimeGuard,
                    E::TestSuite,
                    E::FuzzOracle,
                    E::TrustedBoundary,
                ],
                vec![T::Verified, T::Checked, T::Fuzzed, T::TrustedExternal],
            ),
            PolicyName::Custom => return None,
        };
        Some(AcceptancePolicy {
            name: name.label().to_string(),
            evidence,
            trust_levels: trust,
            allow_tf32: false,
            allow_nondeterministic: false,
        })
    }

    /// Parses a policy name: strict, checked-runtime, allow-trusted-runtime.
    pub fn parse(s: &str) -> Result<AcceptancePolicy, String> {
        PolicyName::from_label(s)
            .and_then(AcceptancePolicy::named)
            .ok_or_else(|| {
                format!(
                    "unknown policy `{s}` (use strict, checked-runtime or allow-trusted-runtime)"
                )
            })
    }

    /// A custom policy.
    pub fn custom(evidence: Vec<EvidenceKind>, trust_levels: Vec<TrustLevel>) -> AcceptancePolicy {
        AcceptancePolicy {
            name: "custom".into(),
            evidence,
            trust_levels,
            allow_tf32: false,
            allow_nondeterministic: false,
        }
    }

    /// This policy with TF32 capsules allowed (and preferred); its name says so.
    pub fn with_tf32(mut self) -> AcceptancePolicy {
        if !self.allow_tf32 {
            self.allow_tf32 = true;
            self.name.push_str("+tf32");
        }
        self
    }

    /// This policy with nondeterministic capsules allowed (and preferred); its name says so.
    pub fn with_nondeterministic(mut self) -> AcceptancePolicy {
        if !self.allow_nondeterministic {
            self.allow_nondeterministic = true;
            self.name.push_str("+nondeterministic");
        }
        self
    }

    pub fn allows_evidence(&self, e: EvidenceKind) -> bool {
        self.evidence.contains(&e)
    }

    pub fn allows_trust(&self, t: TrustLevel) -> bool {
        self.trust_levels.contains(&t)
    }
}

/// The audit of one obligation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObligationReport {
    pub obligation: Obligation,
    pub claim: ContractClaim,
    pub evidence: EvidenceKind,
    pub evidence_detail: String,
    pub disposition: Disposition,
    /// False only for the VJP obligation when no gradient is requested or the op has none.
    pub required: bool,
    /// Checker evidence: a replay checker judges the kernel's result on every call.
    pub recheck_every_call: bool,
    /// The evidence runs on every call: a runtime guard (before the kernel) or a checker
    /// (after it). Tests and proofs are discharged once, when the plan is gated.
    pub runs_every_call: bool,
}

/// The audit of one planned kernel: its identity and its four obligation reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelAudit {
    pub op: OpKind,
    pub capsule: String,
    pub provider: Provider,
    pub device: Device,
    pub trust_level: TrustLevel,
    pub vjp_mode: VjpMode,
    pub runtime_support: RuntimeSupport,
    pub deterministic: bool,
    /// The arithmetic of its products (`tf32` only for an opted-in reduced-precision capsule).
    pub precision: super::Precision,
    /// For a reduced-precision capsule (`precision` other than f32): its value contract's
    /// statement, which declares the looser error bound it is held to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_bound: Option<Box<str>>,
    pub obligations: Vec<ObligationReport>,
    /// For the part of a composite kernel: the composite's capsule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part_of: Option<String>,
}

/// Audits a capsule for a session requesting `vjp`.
pub fn audit(capsule: &KernelCapsule, vjp: VjpMode) -> KernelAudit {
    let vjp_required = vjp != VjpMode::None && capsule.op.differentiable();
    let obligations = Obligation::ALL
        .iter()
        .map(|&o| {
            let d = capsule.contract(o);
            let kind = d.evidence.kind();
            ObligationReport {
                obligation: o,
                claim: d.claim.clone(),
                evidence: kind,
                evidence_detail: d.evidence.render(),
                disposition: kind.disposition(),
                required: o != Obligation::Vjp || vjp_required,
                recheck_every_call: kind == EvidenceKind::Checker,
                runs_every_call: matches!(kind, EvidenceKind::Checker | EvidenceKind::RuntimeGuard),
            }
        })
        .collect();
    KernelAudit {
        op: capsule.op,
        capsule: capsule.name.clone(),
        provider: capsule.provider,
        device: capsule.device,
        trust_level: capsule.trust_level,
        vjp_mode: capsule.vjp_mode,
        runtime_support: capsule.runtime_support,
        deterministic: capsule.deterministic,
        precision: capsule.precision,
        declared_bound: (capsule.precision != super::Precision::F32)
            .then(|| capsule.value_contract.summary.clone().into_boxed_str()),
        obligations,
        part_of: None,
    }
}

/// One reason the gate refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "failure", rename_all = "snake_case")]
pub enum GateFailure {
    EvidenceNotAccepted {
        op: OpKind,
        capsule: String,
        obligation: Obligation,
        evidence: EvidenceKind,
        policy: String,
    },
    TrustLevelNotAllowed {
        op: OpKind,
        capsule: String,
        level: TrustLevel,
        policy: String,
    },
    /// The planned kernel is not admissible for the plan's request (the gate re-checks what
    /// the planner checked: a plan is data and may have been edited).
    NotAdmissible {
        op: OpKind,
        capsule: String,
        refusal: Refusal,
    },
    /// The planned kernel's capsule implements another op than the one planned.
    WrongOp {
        op: OpKind,
        capsule: String,
        capsule_op: OpKind,
    },
}

impl GateFailure {
    /// A stable label of the failure kind.
    pub fn kind_label(&self) -> &'static str {
        match self {
            GateFailure::EvidenceNotAccepted { .. } => "evidence_not_accepted",
            GateFailure::TrustLevelNotAllowed { .. } => "trust_level_not_allowed",
            GateFailure::NotAdmissible { .. } => "not_admissible",
            GateFailure::WrongOp { .. } => "wrong_op",
        }
    }
}

impl fmt::Display for GateFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateFailure::EvidenceNotAccepted { op, capsule, obligation, evidence, policy } => write!(
                f,
                "evidence_not_accepted: op `{}` capsule `{capsule}`: {} evidence `{evidence}` is not accepted by policy `{policy}`",
                op.name(),
                obligation.label()
            ),
            GateFailure::TrustLevelNotAllowed { op, capsule, level, policy } => write!(
                f,
                "trust_level_not_allowed: op `{}` capsule `{capsule}`: trust level `{level}` is not allowed by policy `{policy}`",
                op.name()
            ),
            GateFailure::NotAdmissible { op, capsule, refusal } => write!(
                f,
                "not_admissible: op `{}` capsule `{capsule}`: {refusal}",
                op.name()
            ),
            GateFailure::WrongOp { op, capsule, capsule_op } => write!(
                f,
                "wrong_op: op `{}` was planned with capsule `{capsule}`, which implements `{}`",
                op.name(),
                capsule_op.name()
            ),
        }
    }
}

/// The failures of one audited kernel under a policy (empty ⇔ acceptable).
pub fn gate_failures(audit: &KernelAudit, policy: &AcceptancePolicy) -> Vec<GateFailure> {
    let mut failures = Vec::new();
    if !policy.allows_trust(audit.trust_level) {
        failures.push(GateFailure::TrustLevelNotAllowed {
            op: audit.op,
            capsule: audit.capsule.clone(),
            level: audit.trust_level,
            policy: policy.name.clone(),
        });
    }
    for o in audit.obligations.iter().filter(|o| o.required) {
        if !policy.allows_evidence(o.evidence) {
            failures.push(GateFailure::EvidenceNotAccepted {
                op: audit.op,
                capsule: audit.capsule.clone(),
                obligation: o.obligation,
                evidence: o.evidence,
                policy: policy.name.clone(),
            });
        }
    }
    failures
}

/// The gate's re-check of a planned kernel against the request it was planned for.
fn admissibility_failures(planned: &PlannedKernel, request: &PlanRequest) -> Vec<GateFailure> {
    let c = planned.capsule();
    let mut failures = Vec::new();
    if c.op != planned.op {
        failures.push(GateFailure::WrongOp {
            op: planned.op,
            capsule: c.name.clone(),
            capsule_op: c.op,
        });
    }
    if let Some(refusal) = request_refusal(c, request) {
        failures.push(GateFailure::NotAdmissible {
            op: planned.op,
            capsule: c.name.clone(),
            refusal,
        });
    }
    failures
}

/// Permission to run one kernel: obtainable only from [`gate_kernel`] or [`gate_plan`].
/// Carries the guards and checkers its capsule's evidence holds, which the runtime runs on
/// every call.
#[derive(Debug)]
pub struct AcceptedKernel {
    entry: Arc<RegisteredCapsule>,
    audit: KernelAudit,
    policy: AcceptancePolicy,
    guards: [Vec<Guard>; 2],
    checkers: [Vec<Checker>; 2],
}

fn accepted(
    entry: &Arc<RegisteredCapsule>,
    audit: KernelAudit,
    policy: &AcceptancePolicy,
) -> AcceptedKernel {
    let c = &entry.capsule;
    AcceptedKernel {
        entry: Arc::clone(entry),
        audit,
        policy: policy.clone(),
        guards: [c.guards(Phase::Forward), c.guards(Phase::Vjp)],
        checkers: [c.checkers(Phase::Forward), c.checkers(Phase::Vjp)],
    }
}

impl AcceptedKernel {
    pub fn capsule(&self) -> &KernelCapsule {
        &self.entry.capsule
    }
    pub fn audit(&self) -> &KernelAudit {
        &self.audit
    }
    pub fn policy(&self) -> &AcceptancePolicy {
        &self.policy
    }
    /// The kernels bound to the accepted capsule (opaque here): what the runtime runs.
    pub fn binding(&self) -> &dyn Binding {
        &*self.entry.binding
    }
    /// The guards to run before every call of `phase`.
    pub fn guards(&self, phase: Phase) -> &[Guard] {
        &self.guards[phase as usize]
    }
    /// The checkers to run after every call of `phase`.
    pub fn checkers(&self, phase: Phase) -> &[Checker] {
        &self.checkers[phase as usize]
    }
}

/// The gate's refusal of one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRejection {
    pub audit: KernelAudit,
    pub failures: Vec<GateFailure>,
}

/// Applies the request's policy to one planned kernel, after re-checking that the kernel is
/// admissible for the request.
pub fn gate_kernel(
    planned: &PlannedKernel,
    request: &PlanRequest,
) -> Result<AcceptedKernel, KernelRejection> {
    let a = audit(planned.capsule(), request.vjp);
    let mut failures = admissibility_failures(planned, request);
    failures.extend(gate_failures(&a, &request.policy));
    if failures.is_empty() {
        Ok(accepted(&planned.entry, a, &request.policy))
    } else {
        Err(KernelRejection { audit: a, failures })
    }
}

/// Permission to run a whole plan: obtainable only from [`gate_plan`].
#[derive(Debug)]
pub struct AcceptedGraphPlan {
    kernels: Vec<AcceptedKernel>,
    groups: Vec<LoweredGroup>,
}

impl AcceptedGraphPlan {
    pub fn kernels(&self) -> &[AcceptedKernel] {
        &self.kernels
    }
    pub fn groups(&self) -> &[LoweredGroup] {
        &self.groups
    }
}

/// A plan the gate refused, kept for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedPlan {
    pub audits: Vec<KernelAudit>,
    pub groups: Vec<LoweredGroup>,
    pub failures: Vec<GateFailure>,
}

/// Applies the plan's policy to every kernel of the plan.
pub fn gate_plan(plan: &ExecutionPlan) -> Result<AcceptedGraphPlan, RejectedPlan> {
    let policy = &plan.request.policy;
    let audits: Vec<KernelAudit> = plan
        .kernels
        .iter()
        .map(|k| audit(k.capsule(), plan.request.vjp))
        .collect();
    let failures: Vec<GateFailure> = plan
        .kernels
        .iter()
        .zip(&audits)
        .flat_map(|(k, a)| {
            let mut f = admissibility_failures(k, &plan.request);
            f.extend(gate_failures(a, policy));
            f
        })
        .collect();
    let groups = plan.lower();
    if failures.is_empty() {
        let kernels = plan
            .kernels
            .iter()
            .zip(audits)
            .map(|(k, a)| accepted(&k.entry, a, policy))
            .collect();
        Ok(AcceptedGraphPlan { kernels, groups })
    } else {
        Err(RejectedPlan {
            audits,
            groups,
            failures,
        })
    }
}
