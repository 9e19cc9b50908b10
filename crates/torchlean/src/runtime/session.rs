//! The eager session: the backend choices of this thread, and the per-op cache of accepted
//! kernels.
//!
//! Every op run eagerly goes through [`apply`]: the session plans the op's kind under its
//! profile (VJP `none` when nothing is recorded, the profile's tape mode otherwise), audits
//! and gates it, caches the [`AcceptedKernel`] per (op kind, recording), and runs only the
//! kernel bound to it. The first use of each kernel is remembered, so the report of a run
//! lists the capsule that actually ran each op. Before its first kernel a session probes the
//! device (see [`super::probe`]).

use super::autograd;
use super::probe;
use crate::backend::{
    gate_kernel, plan_op, AcceptedKernel, Availability, BackendProfile, BackendReport,
    ExecutionMode, KernelAudit, PlanRequest, Registry, Target, VjpMode,
};
use crate::error::{Error, Result};
use crate::graph::{Op, OpKind};
use crate::tensor::Tensor;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

/// The registry of every capsule module linked into this build (built once).
pub fn standard_registry() -> &'static Arc<Registry> {
    static REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Arc::new(crate::providers::standard_registry()))
}

struct Slot {
    kernel: Arc<AcceptedKernel>,
    ran: bool,
}

/// The backend configuration and kernel cache of eager execution on one thread.
pub struct Session {
    profile: BackendProfile,
    registry: Arc<Registry>,
    availability: Availability,
    /// Indexed by `OpKind::index() * 2 + recording`.
    cache: Vec<Option<Slot>>,
    probed: bool,
}

impl Session {
    /// A session for `profile` over the standard registry.
    pub fn new(profile: BackendProfile) -> Session {
        Session::with_registry(profile, Arc::clone(standard_registry()))
    }

    /// A session over a custom registry.
    pub fn with_registry(profile: BackendProfile, registry: Arc<Registry>) -> Session {
        Session {
            profile,
            registry,
            availability: Availability::declared(&Target::host()),
            cache: (0..OpKind::ALL.len() * 2).map(|_| None).collect(),
            probed: false,
        }
    }

    pub fn profile(&self) -> &BackendProfile {
        &self.profile
    }

    fn request(&self, recording: bool) -> PlanRequest {
        PlanRequest {
            device: self.profile.device,
            preference: self.profile.preference,
            policy: self.profile.policy.clone(),
            vjp: if recording {
                self.profile.vjp
            } else {
                VjpMode::None
            },
            mode: ExecutionMode::Eager,
        }
    }

    /// Plans and gates one op kind (cached).
    fn accepted(&mut self, kind: OpKind, recording: bool) -> Result<(Arc<AcceptedKernel>, bool)> {
        let slot = kind.index() * 2 + recording as usize;
        if let Some(s) = &self.cache[slot] {
            return Ok((Arc::clone(&s.kernel), s.ran));
        }
        let request = self.request(recording);
        let planned = plan_op(&self.registry, kind, &request, &self.availability)
            .map_err(|e| Error::Planning(e.to_string()))?;
        let accepted = gate_kernel(&planned, &request).map_err(|r| {
            Error::Gate(format!(
                "op `{}` rejected:\n  {}",
                kind.name(),
                r.failures
                    .iter()
                    .map(|f| f.to_string())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ))
        })?;
        if !self.probed {
            probe::probe(self.profile.device)?;
            self.probed = true;
        }
        let kernel = Arc::new(accepted);
        self.cache[slot] = Some(Slot {
            kernel: Arc::clone(&kernel),
            ran: false,
        });
        Ok((kernel, false))
    }

    /// Plans and gates every kind in `ops` for a training (recording) and an inference use,
    /// before anything runs; returns the report of that plan or the first error.
    pub fn preplan(&mut self, ops: &[OpKind], recording: bool) -> Result<BackendReport> {
        let mut audits = Vec::new();
        for &k in ops {
            let (kernel, _) = self.accepted(k, recording && k.differentiable())?;
            audits.push(kernel.audit().clone());
        }
        Ok(BackendReport::new(
            &self.profile,
            ExecutionMode::Eager,
            audits,
            vec![],
            vec![],
        ))
    }

    /// The report of what ran in this session: one row per (op, capsule) actually executed.
    pub fn report(&self) -> BackendReport {
        let mut audits: Vec<KernelAudit> = Vec::new();
        for s in self.cache.iter().flatten().filter(|s| s.ran) {
            let a = s.kernel.audit();
            if !audits.iter().any(|b| {
                b.op == a.op
                    && b.capsule == a.capsule
                    && b.vjp_mode == a.vjp_mode
                    && b.obligations == a.obligations
            }) {
                audits.push(a.clone());
            }
        }
        audits.sort_by_key(|a| a.op);
        BackendReport::new(&self.profile, ExecutionMode::Eager, audits, vec![], vec![])
    }
}

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

/// Installs `session` as this thread's eager session, returning the previous one.
pub fn install(session: Session) -> Option<Session> {
    SESSION.with(|s| s.borrow_mut().replace(session))
}

/// Removes and returns this thread's session.
pub fn take() -> Option<Session> {
    SESSION.with(|s| s.borrow_mut().take())
}

/// Runs `f` with this thread's session (created with the default `checked_cpu` profile if none
/// is installed).
pub fn with_current<R>(f: impl FnOnce(&mut Session) -> R) -> R {
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        let session = s.get_or_insert_with(|| Session::new(BackendProfile::default_cpu()));
        f(session)
    })
}

/// Runs one op eagerly: plan + gate (cached), run the accepted kernel, record the tape.
pub fn apply(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let kind = op.kind();
    // A differentiable op on tracked inputs needs a VJP-capable kernel; during a graph capture
    // every op is recorded (the compiled executor plans VJPs itself).
    let recording = kind.differentiable()
        && autograd::grad_enabled()
        && (inputs.iter().any(|t| t.is_tracked()) || autograd::capturing());
    if autograd::in_capture_model_code()
        && !autograd::grad_enabled()
        && inputs.iter().any(|t| t.is_tracked())
    {
        // model code cutting a traced value from the tape while capturing (refused there)
        for t in inputs {
            super::capture::note_host_access(t, &format!("{} under no_grad", kind.name()));
        }
    }
    let (kernel, ran) = with_current(|s| s.accepted(kind, recording))?;
    let out = super::guarded::run_forward(&kernel, &op, inputs)?;
    if !ran {
        with_current(|s| {
            if let Some(slot) = s.cache[kind.index() * 2 + recording as usize].as_mut() {
                slot.ran = true;
            }
        });
    }
    Ok(if recording || autograd::capturing() {
        autograd::record(op, inputs, out, kernel)
    } else {
        out
    })
}
