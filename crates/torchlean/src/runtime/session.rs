//! The eager session: the backend choices of this thread, and the per-op cache of accepted
//! kernels.
//!
//! Every op run eagerly goes through [`apply`]: the session plans the op's kind under its
//! profile (VJP `none` when nothing is recorded, the profile's tape mode otherwise), audits
//! and gates it, caches the [`AcceptedKernel`] per (op kind, recording), and runs only the
//! kernel bound to it. The first use of each kernel is remembered, so the report of a run
//! lists the capsule that actually ran each op. Before its first kernel a session probes the
//! device (see [`super::probe`]).
//!
//! **No op runs under a policy the program did not choose.** A thread has a session only
//! when one was installed on it ([`install`]), when it was started by [`spawn`] (which forks
//! the caller's session: same profile and registry, and what runs there is reported in the
//! caller's report), or when the program set a process-wide default profile explicitly at
//! startup ([`set_process_default`]; a session created from it says so in its report).
//! Otherwise an op is an [`Error::NoSession`] naming these fixes — there is no silent default.
//!
//! [`with_current`] lends the thread's session to a closure; anything in that closure that
//! needs the session again (a tensor op, [`install`], [`take`], a nested [`with_current`]) is
//! an [`Error::SessionBusy`], never a panic.

use super::autograd;
use super::probe;
use super::trace::OpUses;
use crate::backend::{
    gate_kernel, plan_op, AcceptedKernel, Availability, BackendProfile, BackendReport, Device,
    ExecutionMode, KernelAudit, PlanRequest, Registry, VjpMode,
};
use crate::error::{Error, GateRejection, Result};
use crate::graph::{Op, OpKind};
use crate::tensor::Tensor;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};

/// The registry of every capsule module linked into this build (built once).
pub fn standard_registry() -> &'static Arc<Registry> {
    static REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Arc::new(crate::providers::standard_registry()))
}

struct Slot {
    kernel: Arc<AcceptedKernel>,
    ran: bool,
    /// The composite capsules this kernel already ran as a part of (logged once each).
    ran_in: Vec<String>,
}

/// Where a session's profile came from (shown in its report when it is not an explicit
/// install).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOrigin {
    /// Built by the program and installed ([`install`], or a trainer's own session).
    Installed,
    /// Created on a thread without a session from the profile the program set with
    /// [`set_process_default`].
    ProcessDefault,
}

/// The backend configuration and kernel cache of eager execution on one thread.
pub struct Session {
    profile: BackendProfile,
    registry: Arc<Registry>,
    availability: Availability,
    /// Indexed by `OpKind::index() * 2 + recording`.
    cache: Vec<Option<Slot>>,
    /// What the device probe found (set before the first kernel).
    probed: Option<String>,
    origin: SessionOrigin,
    /// The audit of every kernel that ran, shared with the sessions forked from this one
    /// (so the report of a run covers the threads it started).
    ran: Arc<Mutex<Vec<KernelAudit>>>,
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
            availability: crate::module::availability(),
            cache: (0..OpKind::ALL.len() * 2).map(|_| None).collect(),
            probed: None,
            origin: SessionOrigin::Installed,
            ran: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A session for another thread of the same run: the same profile, registry and origin,
    /// its own kernel cache, and one record of what ran (this session's [`Session::report`]
    /// includes what runs under the fork).
    pub fn fork(&self) -> Session {
        Session {
            profile: self.profile.clone(),
            registry: Arc::clone(&self.registry),
            availability: self.availability.clone(),
            cache: (0..OpKind::ALL.len() * 2).map(|_| None).collect(),
            probed: self.probed.clone(),
            origin: self.origin,
            ran: Arc::clone(&self.ran),
        }
    }

    pub fn profile(&self) -> &BackendProfile {
        &self.profile
    }

    /// Where this session's profile came from.
    pub fn origin(&self) -> SessionOrigin {
        self.origin
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
            .map_err(|e| Error::Planning(vec![e]))?;
        let accepted = gate_kernel(&planned, &request)
            .map_err(|r| Error::Gate(GateRejection::Kernel(Box::new(r))))?;
        if self.probed.is_none() {
            self.probed =
                Some(probe::probe_for(self.profile.device, self.profile.preference)?.detail);
        }
        let kernel = Arc::new(accepted);
        self.cache[slot] = Some(Slot {
            kernel: Arc::clone(&kernel),
            ran: false,
            ran_in: Vec::new(),
        });
        Ok((kernel, false))
    }

    /// Remembers that the kernel accepted for (kind, recording) ran as a part of the
    /// composite capsule `composite` (for the report, where it is a row nested under it).
    fn mark_ran_part(&mut self, kind: OpKind, recording: bool, composite: &str) {
        if let Some(slot) = self.cache[kind.index() * 2 + recording as usize].as_mut() {
            if slot.ran_in.iter().any(|c| c == composite) {
                return;
            }
            slot.ran_in.push(composite.to_string());
            let mut audit = slot.kernel.audit().clone();
            audit.part_of = Some(composite.to_string());
            // a poisoned log only means another thread panicked while pushing
            let mut ran = self.ran.lock().unwrap_or_else(|p| p.into_inner());
            if !ran.contains(&audit) {
                ran.push(audit);
            }
        }
    }

    /// Remembers that the kernel accepted for (kind, recording) ran (for the report).
    fn mark_ran(&mut self, kind: OpKind, recording: bool) {
        if let Some(slot) = self.cache[kind.index() * 2 + recording as usize].as_mut() {
            if !slot.ran {
                slot.ran = true;
                let audit = slot.kernel.audit().clone();
                // a poisoned log only means another thread panicked while pushing
                let mut ran = self.ran.lock().unwrap_or_else(|p| p.into_inner());
                ran.push(audit);
            }
        }
    }

    /// Plans and gates every (op, recording) use in `uses` — what a shape-only trace of the
    /// model recorded ([`super::trace::trace`]) — before anything runs; returns the report
    /// of that plan or the first error.
    pub fn preplan(&mut self, uses: &OpUses) -> Result<BackendReport> {
        // the device first: a machine without it is told what is missing, whatever the plan
        if self.probed.is_none() {
            self.probed =
                Some(probe::probe_for(self.profile.device, self.profile.preference)?.detail);
        }
        // every op that cannot be planned is named at once, before any gate verdict: a
        // planning failure (exit 2 in the CLI) is reported as `torchlean plan` reports it,
        // whatever the order of the ops, and never hidden behind another op's rejection
        let unplannable = self.planning_errors(uses);
        if !unplannable.is_empty() {
            return Err(Error::Planning(unplannable));
        }
        let mut audits = Vec::new();
        for &(k, recording) in uses.uses() {
            if k == OpKind::Slice
                && recording
                && !uses.captured()
                && self.profile.device == crate::backend::Device::Cpu
            {
                // the eager backward pass places host slices' cotangents with `concat`
                // (runtime/slice_pieces.rs): planned and gated before the first kernel too —
                // and only where it can run (a compiled graph differentiates with its own
                // VJP nodes; a device tensor takes the slice's own VJP): the plan lists no
                // kernel the run never calls
                let (concat, _) = self.accepted(OpKind::Concat, false)?;
                crate::backend::merge_row(&mut audits, concat.audit());
            }
            let (kernel, _) = self.accepted(k, recording)?;
            let composite = kernel.capsule().name.clone();
            let parts = kernel.capsule().parts.clone();
            crate::backend::merge_row(&mut audits, kernel.audit());
            // a composite's parts run through this session: planned and gated now, before
            // the first kernel (its VJP re-runs them recording)
            for p in parts {
                for rec in [false, recording && p.differentiable()] {
                    let (part, _) = self.accepted(p, rec)?;
                    let mut a = part.audit().clone();
                    a.part_of = Some(composite.clone());
                    crate::backend::merge_row(&mut audits, &a);
                }
            }
        }
        Ok(self.with_origin(BackendReport::new(
            &self.profile,
            ExecutionMode::Eager,
            audits,
            vec![],
            vec![],
        )))
    }

    /// The planning errors of `uses` and of the parts of the composites they plan and the
    /// gate admits, each once.
    fn planning_errors(&self, uses: &OpUses) -> Vec<crate::backend::PlanningError> {
        let mut errors = Vec::new();
        let mut note = |r: std::result::Result<_, crate::backend::PlanningError>| match r {
            Ok(planned) => Some(planned),
            Err(e) => {
                if !errors.contains(&e) {
                    errors.push(e);
                }
                None
            }
        };
        for &(k, recording) in uses.uses() {
            let request = self.request(recording);
            let plan = |kind| plan_op(&self.registry, kind, &request, &self.availability);
            if k == OpKind::Slice && recording {
                let request = self.request(false);
                note(plan_op(
                    &self.registry,
                    OpKind::Concat,
                    &request,
                    &self.availability,
                ));
            }
            let Some(planned) = note(plan(k)) else {
                continue;
            };
            // a composite the gate refuses is refused for itself (exit 3): its parts, which
            // would never run, are not planned
            if gate_kernel(&planned, &request).is_err() {
                continue;
            }
            for p in planned.capsule().parts.clone() {
                for rec in [false, recording && p.differentiable()] {
                    let request = self.request(rec);
                    note(plan_op(&self.registry, p, &request, &self.availability));
                }
            }
        }
        errors
    }

    fn with_origin(&self, mut report: BackendReport) -> BackendReport {
        if self.origin == SessionOrigin::ProcessDefault {
            report.session = Some("process_default".into());
        }
        report.target = self.probed.clone();
        report.memory = crate::module::memory_stats(self.profile.device);
        report
    }

    /// What the device probe found (`None` before the first kernel was admitted).
    pub fn probe_detail(&self) -> Option<&str> {
        self.probed.as_deref()
    }

    /// The report of what ran in this session (and the sessions forked from it): one row
    /// per (op, capsule) actually executed; the kernels a composite ran for its parts are
    /// rows nested under the composite (`part_of`).
    pub fn report(&self) -> BackendReport {
        let mut audits: Vec<KernelAudit> = Vec::new();
        let ran = self.ran.lock().unwrap_or_else(|p| p.into_inner());
        for a in ran.iter() {
            crate::backend::merge_row(&mut audits, a);
        }
        drop(ran);
        let audits = nest_parts(audits);
        self.with_origin(BackendReport::new(
            &self.profile,
            ExecutionMode::Eager,
            audits,
            vec![],
            vec![],
        ))
    }
}

/// Rows sorted by op, each composite followed by the rows of its parts (sorted by op); part
/// rows whose composite has no row (not expected) come last.
fn nest_parts(mut audits: Vec<KernelAudit>) -> Vec<KernelAudit> {
    audits.sort_by_key(|a| a.op);
    let (parts, tops): (Vec<KernelAudit>, Vec<KernelAudit>) =
        audits.into_iter().partition(|a| a.part_of.is_some());
    let mut placed = vec![false; parts.len()];
    let mut out = Vec::with_capacity(tops.len() + parts.len());
    for top in tops {
        let name = top.capsule.clone();
        out.push(top);
        for (p, done) in parts.iter().zip(placed.iter_mut()) {
            if !*done && p.part_of.as_deref() == Some(name.as_str()) {
                out.push(p.clone());
                *done = true;
            }
        }
    }
    out.extend(
        parts
            .into_iter()
            .zip(placed)
            .filter(|(_, done)| !done)
            .map(|(p, _)| p),
    );
    out
}

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

static PROCESS_DEFAULT: OnceLock<BackendProfile> = OnceLock::new();

/// Sets the profile that threads without a session use, once for the process (a program
/// calls it at startup; it is never set implicitly). Setting the same profile again is a
/// no-op; another profile is [`Error::ProcessDefaultSet`]. Sessions created from it are
/// reported with `session=process_default`.
pub fn set_process_default(profile: BackendProfile) -> Result<()> {
    let current = PROCESS_DEFAULT.get_or_init(|| profile.clone());
    if *current == profile {
        Ok(())
    } else {
        Err(Error::ProcessDefaultSet {
            current: current.name.clone(),
            requested: profile.name,
        })
    }
}

/// The process-wide default profile, if the program set one.
pub fn process_default() -> Option<&'static BackendProfile> {
    PROCESS_DEFAULT.get()
}

/// Installs `session` as this thread's eager session, returning the previous one
/// ([`Error::SessionBusy`] inside a [`with_current`] closure).
pub fn install(session: Session) -> Result<Option<Session>> {
    SESSION.with(|s| {
        let mut s = s.try_borrow_mut().map_err(|_| Error::SessionBusy {
            attempted: "install",
        })?;
        Ok(s.replace(session))
    })
}

/// Removes and returns this thread's session ([`Error::SessionBusy`] inside a
/// [`with_current`] closure).
pub fn take() -> Result<Option<Session>> {
    SESSION.with(|s| {
        let mut s = s
            .try_borrow_mut()
            .map_err(|_| Error::SessionBusy { attempted: "take" })?;
        Ok(s.take())
    })
}

/// Whether this thread has a session installed (the process default does not count).
pub fn has_session() -> bool {
    SESSION.with(|s| s.try_borrow().map(|s| s.is_some()).unwrap_or(true))
}

/// Runs `f` with this thread's session. A thread without one gets a session of the process
/// default profile when the program set one ([`set_process_default`]); otherwise this is
/// [`Error::NoSession`]. Inside `f` the session is lent: a tensor op, [`install`], [`take`]
/// or another `with_current` there is [`Error::SessionBusy`].
pub fn with_current<R>(f: impl FnOnce(&mut Session) -> R) -> Result<R> {
    SESSION.with(|cell| {
        let mut slot = cell.try_borrow_mut().map_err(|_| Error::SessionBusy {
            attempted: "a tensor op or `with_current`",
        })?;
        let session = match &mut *slot {
            Some(session) => session,
            empty => {
                let profile = process_default().ok_or_else(|| Error::NoSession {
                    thread: std::thread::current()
                        .name()
                        .map(|n| format!(" (`{n}`)"))
                        .unwrap_or_default(),
                })?;
                let mut session = Session::new(profile.clone());
                session.origin = SessionOrigin::ProcessDefault;
                empty.insert(session)
            }
        };
        Ok(f(session))
    })
}

/// A fork of this thread's session (see [`Session::fork`]), for a thread the caller starts
/// itself (e.g. a rayon pool: install it at the start of each task's thread).
pub fn fork_current() -> Result<Session> {
    with_current(|s| s.fork())
}

/// Starts a thread that runs `f` under a fork of the caller's session: the same profile
/// and registry, reported in the caller's report. [`Error::NoSession`] when the caller has
/// none (and no process default is set).
pub fn spawn<F, R>(f: F) -> Result<std::thread::JoinHandle<R>>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let session = fork_current()?;
    std::thread::Builder::new()
        .spawn(move || {
            // a fresh thread has no session and nothing borrowing it
            let _ = install(session);
            f()
        })
        .map_err(|e| Error::Other(format!("cannot start a thread: {e}")))
}

/// Refuses inputs on different devices, or on another device than the session's profile
/// runs on (`device`): an error naming both, never an implicit copy.
pub(crate) fn check_devices(op: &'static str, device: Device, inputs: &[&Tensor]) -> Result<()> {
    let Some(first) = inputs.first() else {
        return Ok(());
    };
    let d0 = first.device();
    if let Some((i, t)) = inputs.iter().enumerate().find(|(_, t)| t.device() != d0) {
        return Err(Error::DeviceMismatch {
            op,
            detail: format!("input 0 is on `{d0}` and input {i} on `{}`", t.device()),
        });
    }
    if d0 != device {
        return Err(Error::DeviceMismatch {
            op,
            detail: format!(
                "the inputs are on `{d0}`, but the session's profile runs on `{device}`"
            ),
        });
    }
    Ok(())
}

/// Runs an update eagerly: `target := op(target, rest…)`, for an op whose value has the
/// target's shape (an optimizer map, a gradient sum, a scaling). Planned, gated, guarded,
/// checked and reported like [`apply`], never recorded on the tape: the target keeps its
/// handle (id, `requires_grad` flag) and loses any tape link.
///
/// When the accepted kernel has an in-place variant and no checker must replay the call,
/// the value is written over the target's buffer (when the target's handle owns it alone,
/// else into a copy: other handles never see the write). Otherwise the forward kernel
/// computes the value (its checkers replay the call on the untouched inputs) and the target
/// takes it. In a shape-only trace the op is recorded and the target is left as it was.
pub fn apply_update(op: Op, target: &mut Tensor, rest: &[&Tensor]) -> Result<()> {
    let kind = op.kind();
    let Some((kernel, ran, device)) =
        admit_update(&op, &super::kernel::update_operands(target, rest))?
    else {
        return Ok(());
    };
    let binding = super::kernel::cpu_binding(&kernel)?;
    let checked = !kernel.checkers(crate::backend::Phase::Forward).is_empty();
    match binding.in_place() {
        Some(in_place) if !checked && device == Device::Cpu => {
            super::guarded::run_in_place(&kernel, &op, in_place, target, rest)?;
        }
        _ => {
            let value = {
                let inputs = super::kernel::update_operands(target, rest);
                super::guarded::run_forward(&kernel, &op, &inputs)?
            };
            if value.shape() != target.shape() {
                return Err(crate::error::OpError::Shape {
                    op: op.name(),
                    shapes: vec![target.shape().to_vec(), value.shape().to_vec()],
                    expected: "an update whose value has the shape of its target (the first input)"
                        .into(),
                }
                .into());
            }
            target.assign(value)?;
        }
    }
    note_ran(kind, false, ran)
}

/// Runs an update of several tensors eagerly (an op with [`OpKind::update_groups`], e.g.
/// `adam_step`: a whole optimizer step): `targets` and `rest` grouped as
/// [`super::kernel::UpdateManyKernel`] says. Planned, gated, guarded, checked and reported
/// like [`apply_update`], never recorded on the tape; each target keeps its handle.
///
/// When the accepted kernel has an update-many variant and no checker must replay the call,
/// that kernel writes every target (in place where its handle owns its buffer alone): one
/// launch on a device. Under checkers that decompose over tiles (`runtime/tiled.rs`: the
/// replay checkers) a call on host tensors runs by tiles, each tile checked as it is
/// computed, and the targets take new buffers once every tile was accepted. Otherwise the
/// forward kernel computes the value (its checkers replay the call on the untouched inputs)
/// and each target takes its part of it through the session's `slice` and `reshape` ops
/// ([`take_parts`]). In a shape-only trace the op is
/// recorded and the targets are left as they were.
pub fn apply_update_many(op: Op, targets: &mut [&mut Tensor], rest: &[&Tensor]) -> Result<()> {
    let kind = op.kind();
    let inputs = super::kernel::update_many_operands(&op, targets, rest)?;
    let Some((kernel, ran, _)) = admit_update(&op, &inputs)? else {
        return Ok(());
    };
    let binding = super::kernel::cpu_binding(&kernel)?;
    let checked = !kernel.checkers(crate::backend::Phase::Forward).is_empty();
    match binding.update_many() {
        Some(update_many) if !checked => {
            super::guarded::run_update_many(&kernel, &op, update_many, targets, rest)?;
        }
        _ => {
            let by_tiles =
                super::guarded::run_update_many_by_tiles(&kernel, &binding, &op, targets, rest);
            match by_tiles {
                Some(done) => done?,
                None => {
                    let value = {
                        let inputs = super::kernel::update_many_operands(&op, targets, rest)?;
                        super::guarded::run_forward(&kernel, &op, &inputs)?
                    };
                    take_parts(&op, targets, &value)?;
                }
            }
        }
    }
    note_ran(kind, false, ran)
}

/// Whether this thread's session runs `kind` (an op that updates several tensors) in place:
/// its accepted kernel has an update-many variant and no checker must replay the call. What
/// `Adam`'s default `foreach` asks on the CPU. False when there is no session or the op
/// cannot be planned or admitted under it (nothing is reported: only kernels that ran are).
/// (Under replay checkers an update of several host tensors runs by tiles, checked as it is
/// computed, into new buffers: one pass, but its kernel, its check and the copy into the new
/// buffers cost more than the per-parameter maps' tiled checks on mlp-step — docs/ops.md.)
pub fn updates_in_place(kind: OpKind) -> bool {
    let accepted = with_current(|s| s.accepted(kind, false));
    match accepted {
        Ok(Ok((k, _))) => {
            k.checkers(crate::backend::Phase::Forward).is_empty()
                && super::kernel::cpu_binding(&k).is_ok_and(|b| b.update_many().is_some())
        }
        _ => false,
    }
}

/// Gives each target of an update of several tensors its part of the op's value (the
/// targets' flattened values side by side, in order): the session's `slice` and `reshape`
/// ops, planned, gated and checked like any op (on the CPU, views of the value).
pub(crate) fn take_parts(op: &Op, targets: &mut [&mut Tensor], value: &Tensor) -> Result<()> {
    let want: usize = targets.iter().map(|t| t.numel()).sum();
    if value.shape() != [want] {
        return Err(crate::error::OpError::Shape {
            op: op.name(),
            shapes: vec![value.shape().to_vec()],
            expected: format!("the updated tensors' {want} elements side by side, as one vector"),
        }
        .into());
    }
    let parts = super::no_grad(|| -> Result<Vec<Tensor>> {
        let mut at = 0;
        let mut parts = Vec::with_capacity(targets.len());
        for t in targets.iter() {
            let n = t.numel();
            let shape: Vec<isize> = t.shape().iter().map(|&d| d as isize).collect();
            parts.push(value.slice(0, at, at + n)?.reshape(&shape)?);
            at += n;
        }
        Ok(parts)
    })?;
    for (t, part) in targets.iter_mut().zip(parts) {
        t.assign(part)?;
    }
    Ok(())
}

/// What an update call runs under: the accepted kernel of its op (planned and gated, cached),
/// whether it ran before, and the profile's device, after the inputs' devices are checked
/// against it. `None` in a shape-only trace, which records the call instead.
fn admit_update(
    op: &Op,
    inputs: &[&Tensor],
) -> Result<Option<(Arc<AcceptedKernel>, bool, Device)>> {
    if super::trace::intercept(op, inputs)?.is_some() {
        return Ok(None);
    }
    let (kernel, ran, device) = with_current(|s| {
        s.accepted(op.kind(), false)
            .map(|(k, r)| (k, r, s.profile.device))
    })??;
    check_devices(op.name(), device, inputs)?;
    Ok(Some((kernel, ran, device)))
}

/// Logs that the accepted kernel of `(kind, recording)` ran (once per session, or once per
/// composite it ran inside): what the report lists.
fn note_ran(kind: OpKind, recording: bool, ran: bool) -> Result<()> {
    let as_part = super::guarded::with_running_composite(|c| {
        c.map(|name| with_current(|s| s.mark_ran_part(kind, recording, name)))
    });
    match as_part {
        Some(marked) => marked?,
        None if !ran => with_current(|s| s.mark_ran(kind, recording))?,
        None => {}
    }
    Ok(())
}

/// Runs one op eagerly: plan + gate (cached), run the accepted kernel, record the tape.
pub fn apply(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    // a shape-only trace records the op and returns zeros of its shape: no kernel runs
    if let Some(out) = super::trace::intercept(&op, inputs)? {
        return Ok(out);
    }
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
    let (kernel, ran, device) = with_current(|s| {
        s.accepted(kind, recording)
            .map(|(k, r)| (k, r, s.profile.device))
    })??;
    check_devices(op.name(), device, inputs)?;
    let out = super::guarded::run_forward(&kernel, &op, inputs)?;
    note_ran(kind, recording, ran)?;
    Ok(if recording || autograd::capturing() {
        autograd::record(op, inputs, out, kernel)
    } else {
        out
    })
}
