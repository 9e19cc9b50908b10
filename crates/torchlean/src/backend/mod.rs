//! The trust layer: capsules, evidence, registry, target and availability, planner, lowering,
//! audit, gate, accepted plans, profiles and reports.
//!
//! **Data and pure functions only.** This layer decides *whether* a kernel may run and
//! records *why*; it never runs a kernel, a guard or a checker, and never touches device
//! memory. It imports neither `providers` nor `runtime`: kernel bindings pass through it as
//! opaque values ([`Binding`]: only their [`KernelId`]s are visible) from the providers'
//! capsule modules to the runtime, which runs only what an [`AcceptedKernel`] or
//! [`AcceptedGraphPlan`] carries, together with the [`Guard`]s and [`Checker`]s its
//! evidence holds.
//!
//! The pipeline (chapter 3.2.7): [`Target`] → [`Availability`] → [`Registry`] + planner
//! ([`plan_op`], [`plan_ops`]) → audit ([`audit`]) → gate ([`gate_kernel`], [`gate_plan`]) →
//! accepted values → [`BackendReport`].

mod capsule;
mod gate;
mod guard;
mod identity;
mod planner;
mod profile;
pub mod proof;
mod registry;
mod report;
pub(crate) use report::merge_row;
mod target;
mod vocab;

pub use capsule::{
    ContractClaim, ContractDescriptor, Evidence, KernelCapsule, Obligation, Provenance,
};
pub use gate::{
    audit, gate_failures, gate_kernel, gate_plan, AcceptancePolicy, AcceptedGraphPlan,
    AcceptedKernel, GateFailure, KernelAudit, KernelRejection, ObligationReport, RejectedPlan,
};
pub use guard::{function_name, Call, Checker, CheckerFn, Guard, GuardFn, Operand, Phase};
pub use identity::{Binding, KernelId, KernelSlot};
pub use planner::{
    plan_op, plan_ops, refusal, request_refusal, CandidateRefusal, ExecutionPlan, GroupKind,
    LoweredGroup, PlanRequest, PlannedKernel, PlanningError, ProviderPreference, Refusal,
};
pub use profile::BackendProfile;
pub use registry::{trust_supports, validate, RegisteredCapsule, Registry, RegistryError};
pub use report::BackendReport;
pub use target::{Availability, Target};
pub use vocab::{
    Device, Disposition, EvidenceKind, ExecutionMode, PolicyName, Precision, Provider,
    RuntimeSupport, TensorLayout, TrustLevel, VjpMode,
};
