//! The planner: for each op of a request, the first admissible capsule — or a planning error
//! that lists every candidate and the first reason it was refused. Never a fallback: a
//! request that cannot be honoured stops here.
//!
//! Admissibility (DESIGN §3): supports forward; runtime support fits the mode; device matches;
//! provider matches the preference; the VJP mode fits the session (an external-autograd
//! session under `prefer:P` lets the ops P does not bridge keep the tape); the provider is available
//! on the target; and, when the planner is choosing among providers (`auto`, `prefer:P`), the
//! capsule's trust level is one the policy allows. Under `only:P` the user pinned the
//! provider, so the trust level is left to the gate, which then reports exactly which
//! obligations fail. Among admissible capsules: preferred provider first, then registry order.

use super::gate::AcceptancePolicy;
use super::registry::{RegisteredCapsule, Registry};
use super::target::Availability;
use super::vocab::{Device, ExecutionMode, Provider, RuntimeSupport, TrustLevel, VjpMode};
use crate::graph::OpKind;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// Which providers the user allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderPreference {
    Auto,
    Prefer(Provider),
    Only(Provider),
}

impl ProviderPreference {
    /// Parses `auto`, `prefer:P` or `only:P` (a bare `P` means `only:P`).
    pub fn parse(s: &str) -> Result<ProviderPreference, String> {
        let provider = |p: &str| {
            Provider::from_label(p).ok_or_else(|| {
                let known: Vec<&str> = Provider::ALL.iter().map(|p| p.label()).collect();
                format!("unknown provider `{p}` (known: {})", known.join(", "))
            })
        };
        match s.split_once(':') {
            None if s == "auto" => Ok(ProviderPreference::Auto),
            None => provider(s).map(ProviderPreference::Only),
            Some(("prefer", p)) => provider(p).map(ProviderPreference::Prefer),
            Some(("only", p)) => provider(p).map(ProviderPreference::Only),
            Some((k, _)) => Err(format!(
                "unknown provider preference `{k}` (use auto, prefer:P or only:P)"
            )),
        }
    }

    pub fn label(&self) -> String {
        match self {
            ProviderPreference::Auto => "auto".into(),
            ProviderPreference::Prefer(p) => format!("prefer:{p}"),
            ProviderPreference::Only(p) => format!("only:{p}"),
        }
    }
}

/// Everything a plan depends on besides the ops.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRequest {
    pub device: Device,
    pub preference: ProviderPreference,
    pub policy: AcceptancePolicy,
    /// `none` in no-grad sessions; the tape mode when gradients are recorded.
    pub vjp: VjpMode,
    pub mode: ExecutionMode,
}

/// Why one candidate capsule was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    ForwardNotSupported,
    RuntimeSupport {
        declared: RuntimeSupport,
        mode: ExecutionMode,
    },
    WrongDevice {
        capsule_device: Device,
        requested: Device,
    },
    ProviderNotPreferred {
        provider: Provider,
        only: Provider,
    },
    VjpMode {
        capsule_mode: VjpMode,
        requested: VjpMode,
    },
    TrustLevelNotAllowed {
        level: TrustLevel,
        policy: String,
    },
    /// A reduced-precision (TF32) capsule under a policy that did not opt in.
    PrecisionNotAllowed {
        precision: super::Precision,
        policy: String,
    },
    /// A capsule whose results are not bit-reproducible run to run, under a policy that did
    /// not opt in.
    NondeterministicNotAllowed {
        policy: String,
    },
    NotAvailable {
        provider: Provider,
        device: Device,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ForwardNotSupported => write!(f, "it does not support forward execution"),
            Refusal::RuntimeSupport { declared, mode } => write!(
                f,
                "runtime support is `{declared}`, but {mode} execution needs `eager`"
            ),
            Refusal::WrongDevice {
                capsule_device,
                requested,
            } => write!(
                f,
                "wrong device: it runs on `{capsule_device}`, the request is for `{requested}`"
            ),
            Refusal::ProviderNotPreferred { provider, only } => write!(
                f,
                "provider `{provider}` is not preferred (only:{only} was requested)"
            ),
            Refusal::VjpMode {
                capsule_mode,
                requested,
            } => write!(
                f,
                "vjp mode `{capsule_mode}` does not fit the session's `{requested}`"
            ),
            Refusal::TrustLevelNotAllowed { level, policy } => write!(
                f,
                "trust level `{level}` is not allowed by policy `{policy}`"
            ),
            Refusal::PrecisionNotAllowed { precision, policy } => write!(
                f,
                "its products use `{precision}` (a looser declared error bound), which policy `{policy}` did not opt into (--tf32)"
            ),
            Refusal::NondeterministicNotAllowed { policy } => write!(
                f,
                "its results are not bit-reproducible run to run (e.g. it adds with atomics), which policy `{policy}` did not opt into (--allow-nondeterministic)"
            ),
            Refusal::NotAvailable { provider, device } => write!(
                f,
                "provider `{provider}` is not available for `{device}` on this target"
            ),
        }
    }
}

/// One refused candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CandidateRefusal {
    pub capsule: String,
    pub provider: Provider,
    pub device: Device,
    pub refusal: Refusal,
}

/// No capsule could be planned for an op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanningError {
    pub op: OpKind,
    pub device: Device,
    pub device_declared: bool,
    /// The devices the target declares (named when `device` is not one of them).
    pub declared_devices: Vec<Device>,
    pub candidates: Vec<CandidateRefusal>,
}

impl fmt::Display for PlanningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no admissible capsule for op `{}` on device `{}`",
            self.op.name(),
            self.device
        )?;
        if !self.device_declared {
            write!(
                f,
                "\n  device `{}` is not available on this target (declared: {})",
                self.device,
                self.declared_devices
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        if self.candidates.is_empty() {
            write!(f, "\n  no capsule is registered for `{}`", self.op.name())?;
        }
        for c in &self.candidates {
            write!(
                f,
                "\n  - {} (provider {}, device {}): {}",
                c.capsule, c.provider, c.device, c.refusal
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanningError {}

/// The capsule chosen for one op.
#[derive(Debug, Clone)]
pub struct PlannedKernel {
    pub op: OpKind,
    pub(crate) entry: Arc<RegisteredCapsule>,
}

impl PlannedKernel {
    pub fn capsule(&self) -> &super::capsule::KernelCapsule {
        &self.entry.capsule
    }
}

/// The first reason `entry` is not admissible for `op` under `request`, if any.
pub fn refusal(
    entry: &RegisteredCapsule,
    request: &PlanRequest,
    availability: &Availability,
) -> Option<Refusal> {
    let c = &entry.capsule;
    if let Some(r) = request_refusal(c, request) {
        return Some(r);
    }
    if !availability.has_provider(c.provider, c.device) {
        return Some(Refusal::NotAvailable {
            provider: c.provider,
            device: c.device,
        });
    }
    None
}

/// The reasons of [`refusal`] that depend only on the capsule and the request (not on the
/// target): the gate re-checks them for every planned kernel, so that a hand-edited plan
/// cannot pass.
pub fn request_refusal(
    c: &super::capsule::KernelCapsule,
    request: &PlanRequest,
) -> Option<Refusal> {
    if !c.supports_forward {
        return Some(Refusal::ForwardNotSupported);
    }
    if c.runtime_support != RuntimeSupport::Eager {
        return Some(Refusal::RuntimeSupport {
            declared: c.runtime_support,
            mode: request.mode,
        });
    }
    if c.device != request.device {
        return Some(Refusal::WrongDevice {
            capsule_device: c.device,
            requested: request.device,
        });
    }
    // the opt-ins after the device: a capsule of another device is refused for that, not
    // for an opt-in that this device could not honour
    if c.precision != super::Precision::F32 && !request.policy.allow_tf32 {
        return Some(Refusal::PrecisionNotAllowed {
            precision: c.precision,
            policy: request.policy.name.clone(),
        });
    }
    if !c.deterministic && !request.policy.allow_nondeterministic {
        return Some(Refusal::NondeterministicNotAllowed {
            policy: request.policy.name.clone(),
        });
    }
    if let ProviderPreference::Only(p) = request.preference {
        if c.provider != p {
            return Some(Refusal::ProviderNotPreferred {
                provider: c.provider,
                only: p,
            });
        }
    }
    let tape = matches!(c.vjp_mode, VjpMode::TorchleanTape | VjpMode::BackendVjp);
    let vjp_fits = match request.vjp {
        VjpMode::None => true,
        _ if !c.op.differentiable() => true,
        VjpMode::TorchleanTape => tape,
        // external autograd is asked of the preferred provider: under `prefer:P` an op that
        // another provider runs (P has no external-autograd capsule for it) keeps the
        // torchlean tape, so a whole model trains with P owning the backward of the ops it
        // bridges (profile libtorch_autograd_cuda); P's own capsules and every capsule under
        // `auto` or `only:P` must match exactly
        VjpMode::ExternalAutograd => {
            c.vjp_mode == VjpMode::ExternalAutograd
                || (tape
                    && matches!(request.preference, ProviderPreference::Prefer(p) if p != c.provider))
        }
        exact => c.vjp_mode == exact,
    };
    if !vjp_fits {
        return Some(Refusal::VjpMode {
            capsule_mode: c.vjp_mode,
            requested: request.vjp,
        });
    }
    if !matches!(request.preference, ProviderPreference::Only(_))
        && !request.policy.allows_trust(c.trust_level)
    {
        return Some(Refusal::TrustLevelNotAllowed {
            level: c.trust_level,
            policy: request.policy.name.clone(),
        });
    }
    None
}

/// Plans one op.
pub fn plan_op(
    registry: &Registry,
    op: OpKind,
    request: &PlanRequest,
    availability: &Availability,
) -> Result<PlannedKernel, PlanningError> {
    let mut admissible = Vec::new();
    let mut candidates = Vec::new();
    for entry in registry.for_op(op) {
        match refusal(entry, request, availability) {
            None => admissible.push(entry),
            Some(r) => candidates.push(CandidateRefusal {
                capsule: entry.capsule.name.clone(),
                provider: entry.capsule.provider,
                device: entry.capsule.device,
                refusal: r,
            }),
        }
    }
    // an opted-in TF32 capsule comes first (under the provider preference below)
    if request.policy.allow_tf32 {
        admissible.sort_by_key(|e| e.capsule.precision == super::Precision::F32);
    }
    // so does an opted-in nondeterministic capsule (faster: why one would opt in)
    if request.policy.allow_nondeterministic {
        admissible.sort_by_key(|e| e.capsule.deterministic);
    }
    // an external-autograd session takes an external-autograd capsule wherever one is
    // admissible (the tape capsules admitted beside it are for the other ops)
    if request.vjp == VjpMode::ExternalAutograd {
        admissible.sort_by_key(|e| e.capsule.vjp_mode != VjpMode::ExternalAutograd);
    }
    if let ProviderPreference::Prefer(p) = request.preference {
        if let Some(e) = admissible.iter().find(|e| e.capsule.provider == p) {
            return Ok(PlannedKernel {
                op,
                entry: Arc::clone(e),
            });
        }
    }
    // under only:P several capsules of P may be admissible: the first whose trust level the
    // policy allows (so a strict run finds P's checker-backed capsule), else the first (the
    // gate then reports exactly which obligations fail)
    let allowed = admissible
        .iter()
        .find(|e| request.policy.allows_trust(e.capsule.trust_level));
    match allowed.or(admissible.first()) {
        Some(e) => Ok(PlannedKernel {
            op,
            entry: Arc::clone(e),
        }),
        None => Err(PlanningError {
            op,
            device: request.device,
            device_declared: availability.has_device(request.device),
            declared_devices: availability.devices.iter().copied().collect(),
            candidates,
        }),
    }
}

/// How planned kernels are grouped for audit and scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    Singleton,
    /// Adjacent nodes with the same capsule, audited and scheduled together. Not fusion: each
    /// node still runs its own kernel.
    Coalesced,
}

/// One lowered group: node indices sharing a capsule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoweredGroup {
    pub kind: GroupKind,
    pub capsule: String,
    pub nodes: Vec<usize>,
}

/// A plan for a sequence (or graph, in node order) of ops.
#[derive(Debug, Clone)]
pub struct ExecutionPlan {
    pub request: PlanRequest,
    pub kernels: Vec<PlannedKernel>,
}

impl ExecutionPlan {
    /// Groups adjacent kernels with the same capsule.
    pub fn lower(&self) -> Vec<LoweredGroup> {
        let mut groups: Vec<LoweredGroup> = Vec::new();
        for (i, k) in self.kernels.iter().enumerate() {
            match groups.last_mut() {
                Some(g) if g.capsule == k.capsule().name => {
                    g.nodes.push(i);
                    g.kind = GroupKind::Coalesced;
                }
                _ => groups.push(LoweredGroup {
                    kind: GroupKind::Singleton,
                    capsule: k.capsule().name.clone(),
                    nodes: vec![i],
                }),
            }
        }
        groups
    }
}

/// Plans every op, or returns the planning errors of those that failed.
pub fn plan_ops(
    registry: &Registry,
    ops: &[OpKind],
    request: &PlanRequest,
    availability: &Availability,
) -> Result<ExecutionPlan, Vec<PlanningError>> {
    let mut kernels = Vec::new();
    let mut errors = Vec::new();
    for &op in ops {
        match plan_op(registry, op, request, availability) {
            Ok(k) => kernels.push(k),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(ExecutionPlan {
            request: request.clone(),
            kernels,
        })
    } else {
        Err(errors)
    }
}
