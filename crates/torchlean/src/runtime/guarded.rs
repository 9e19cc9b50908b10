//! Running the guards and checkers an accepted kernel's evidence holds, on every call.
//!
//! Every kernel call of the runtime — the eager path, the tape's backward pass, the general
//! graph executor and the dense executor — goes through these functions: the guards of the
//! call's phase before the kernel, the checkers after it. What runs is exactly what the
//! capsule's evidence holds ([`AcceptedKernel::guards`], [`AcceptedKernel::checkers`]).

use crate::backend::{AcceptedKernel, Call, Device, Operand, Phase};
use crate::error::{Error, Result};
use crate::graph::Op;
use crate::tensor::Tensor;

/// The operand view of a tensor (its metadata, its device, and its whole storage when that
/// is host memory; empty for a device tensor).
pub(crate) fn tensor_operand(t: &Tensor) -> Operand<'_> {
    let l = t.layout();
    Operand {
        shape: &l.shape,
        strides: Some(&l.strides),
        offset: l.offset,
        storage: t.storage_slice(),
        device: t.device(),
    }
}

/// The operand view of a dense row-major buffer.
pub(crate) fn dense_operand<'a>(data: &'a [f32], shape: &'a [usize]) -> Operand<'a> {
    Operand {
        shape,
        strides: None,
        offset: 0,
        storage: data,
        device: Device::Cpu,
    }
}

/// Runs the guards of `phase` on the call's operands (a refusal is the guard's op error).
pub(crate) fn guard(k: &AcceptedKernel, phase: Phase, op: &Op, inputs: &[Operand]) -> Result<()> {
    for g in k.guards(phase) {
        g.check(op, inputs)?;
    }
    Ok(())
}

/// Runs the guards of `phase` on tensor operands (building their views only when needed).
pub(crate) fn guard_tensors(
    k: &AcceptedKernel,
    phase: Phase,
    op: &Op,
    inputs: &[&Tensor],
) -> Result<()> {
    // a host view (a broadcast, a transpose) that a kernel copies into row-major order
    // before it reads it needs as much memory as an output of its size: probed like one
    // (`buffers::check_output`), so a copy the machine cannot hold is an out-of-memory error,
    // not an abort inside the kernel
    for (i, t) in inputs.iter().enumerate() {
        if t.device() == Device::Cpu && !t.is_contiguous() {
            super::buffers::check_output(
                &format!("{} (a row-major copy of input {i})", op.name()),
                t.numel(),
            )?;
        }
    }
    if k.guards(phase).is_empty() {
        return Ok(());
    }
    let operands: Vec<Operand> = inputs.iter().map(|t| tensor_operand(t)).collect();
    guard(k, phase, op, &operands)
}

thread_local! {
    /// The per-thread stream of checker seeds (started from the process's random hasher
    /// keys, so kernels cannot predict a checker's draws).
    static CHECK_SEED: std::cell::Cell<u64> = std::cell::Cell::new({
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        h.finish()
    });
}

/// The next checker seed of this thread.
pub(crate) fn next_seed() -> u64 {
    CHECK_SEED.with(|s| {
        let v = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(v);
        crate::spec::splitmix64(v)
    })
}

/// Runs the checkers of `phase` on a completed call.
pub(crate) fn check(k: &AcceptedKernel, phase: Phase, op: &Op, call: &Call) -> Result<()> {
    for c in k.checkers(phase) {
        c.check(op, call).map_err(|reason| Error::CheckerRejected {
            op: op.name(),
            capsule: k.capsule().name.clone(),
            checker: c.name(),
            reason,
        })?;
    }
    Ok(())
}

/// A host copy of `t` when it lives in device memory (checkers read host values: a device
/// read, so a synchronization, per checked call; docs/cuda.md); `None` for host memory.
fn host_copy(t: &Tensor) -> Result<Option<Tensor>> {
    if t.device() == Device::Cpu {
        Ok(None)
    } else {
        t.to_cpu().map(Some)
    }
}

/// The operand a checker reads for `t`: its own view for host memory; for a device tensor,
/// its own shape, strides and offset over the host copy of its elements (so a device result
/// that is not dense from offset 0 does not line up with its copy, and the layout and value
/// checkers reject it).
fn checked_operand<'a>(t: &'a Tensor, copy: &'a Option<Tensor>) -> Operand<'a> {
    match copy {
        None => tensor_operand(t),
        Some(h) => {
            let l = t.layout();
            Operand {
                shape: &l.shape,
                strides: Some(&l.strides),
                offset: l.offset,
                storage: h.storage_slice(),
                device: t.device(),
            }
        }
    }
}

/// Runs the forward checkers on a tensor call.
pub(crate) fn check_forward(
    k: &AcceptedKernel,
    op: &Op,
    inputs: &[&Tensor],
    out: &Tensor,
) -> Result<()> {
    if k.checkers(Phase::Forward).is_empty() {
        return Ok(());
    }
    let copies = inputs
        .iter()
        .map(|t| host_copy(t))
        .collect::<Result<Vec<_>>>()?;
    let out_copy = host_copy(out)?;
    let operands: Vec<Operand> = inputs
        .iter()
        .zip(&copies)
        .map(|(t, c)| checked_operand(t, c))
        .collect();
    let call = Call {
        inputs: &operands,
        output: checked_operand(out, &out_copy),
        cotangent: None,
        needs: &[],
        grads: &[],
        seed: next_seed(),
    };
    check(k, Phase::Forward, op, &call)
}

/// Runs the VJP checkers on a tensor call.
pub(crate) fn check_vjp(
    k: &AcceptedKernel,
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    cotangent: &Tensor,
    needs: &[bool],
    grads: &[Option<Tensor>],
) -> Result<()> {
    if k.checkers(Phase::Vjp).is_empty() {
        return Ok(());
    }
    let copies = inputs
        .iter()
        .map(|t| host_copy(t))
        .collect::<Result<Vec<_>>>()?;
    let (out_copy, cot_copy) = (host_copy(output)?, host_copy(cotangent)?);
    let grad_copies = grads
        .iter()
        .map(|g| g.as_ref().map(host_copy).transpose().map(Option::flatten))
        .collect::<Result<Vec<_>>>()?;
    let operands: Vec<Operand> = inputs
        .iter()
        .zip(&copies)
        .map(|(t, c)| checked_operand(t, c))
        .collect();
    let grads: Vec<Option<Operand>> = grads
        .iter()
        .zip(&grad_copies)
        .map(|(g, c)| g.as_ref().map(|g| checked_operand(g, c)))
        .collect();
    let call = Call {
        inputs: &operands,
        output: checked_operand(output, &out_copy),
        cotangent: Some(checked_operand(cotangent, &cot_copy)),
        needs,
        grads: &grads,
        seed: next_seed(),
    };
    check(k, Phase::Vjp, op, &call)
}

/// Runs a VJP kernel of the CPU binding of `k` between its guards and checkers.
pub(crate) fn run_vjp(
    k: &AcceptedKernel,
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    cotangent: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let binding = super::kernel::cpu_binding(k)?;
    let vjp = binding.vjp().ok_or_else(|| {
        Error::Autograd(format!(
            "capsule `{}` for op `{}` has no VJP kernel",
            k.capsule().name,
            op.name()
        ))
    })?;
    guard_tensors(k, Phase::Vjp, op, inputs)?;
    // a pointwise call with checkers runs and is checked tile by tile (runtime/tiled.rs)
    let tiled = {
        let _kernel = super::autograd::KernelScope::enter();
        super::tiled::vjp(k, &binding, op, inputs, output, cotangent, needs)
    };
    if let Some(grads) = tiled {
        return grads.map(|g| requested(g, needs));
    }
    let grads = {
        let _kernel = super::autograd::KernelScope::enter();
        let _composite = CompositeScope::enter(k);
        let name = &k.capsule().name;
        super::op_times::timed(name, "vjp", output.device(), || {
            vjp(op, inputs, output, cotangent, needs)
        })?
    };
    let grads = requested(grads, needs);
    #[cfg(feature = "fault-injection")]
    let grads = fault::after_vjp(vjp, op, inputs, output, cotangent, needs, grads)?;
    let checks = || check_vjp(k, op, inputs, output, cotangent, needs, &grads);
    if k.checkers(Phase::Vjp).is_empty() {
        checks()?;
    } else {
        super::op_times::timed(&k.capsule().name, "vjp checks", output.device(), checks)?;
    }
    Ok(grads)
}

/// `grads` without the gradients of inputs `needs` did not ask for. A VJP kernel may compute
/// more than it was asked (native_cuda's index kernels wrote zeros for an operand without a
/// gradient), and such a value is no result of the call: neither the checkers nor the tape
/// see it (a checker compared those zeros with the spec's gradient and rejected a correct
/// call: the forty-ninth session's GPU run).
fn requested(mut grads: Vec<Option<Tensor>>, needs: &[bool]) -> Vec<Option<Tensor>> {
    for (i, g) in grads.iter_mut().enumerate() {
        if !needs.get(i).copied().unwrap_or(false) {
            *g = None;
        }
    }
    grads
}

thread_local! {
    /// The composite capsules whose kernels are running on this thread, innermost last.
    static COMPOSITES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a composite capsule's kernel is running on this thread.
pub(crate) fn composite_running() -> bool {
    COMPOSITES.with(|c| c.try_borrow().map(|c| !c.is_empty()).unwrap_or(true))
}

/// While alive, the ops this thread applies are parts of the composite capsule of `k` (when
/// it has parts): the session's report nests them under it.
struct CompositeScope(bool);

impl CompositeScope {
    fn enter(k: &AcceptedKernel) -> CompositeScope {
        let composite = !k.capsule().parts.is_empty();
        if composite {
            COMPOSITES.with(|c| c.borrow_mut().push(k.capsule().name.clone()));
        }
        CompositeScope(composite)
    }
}

impl Drop for CompositeScope {
    fn drop(&mut self) {
        if self.0 {
            COMPOSITES.with(|c| c.borrow_mut().pop());
        }
    }
}

/// `f` of the innermost composite capsule running on this thread, if any.
pub(crate) fn with_running_composite<R>(f: impl FnOnce(Option<&str>) -> R) -> R {
    COMPOSITES.with(|c| f(c.borrow().last().map(String::as_str)))
}

/// Runs the forward kernel of the CPU binding of `k` between its guards and checkers.
pub(crate) fn run_forward(k: &AcceptedKernel, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let binding = super::kernel::cpu_binding(k)?;
    guard_tensors(k, Phase::Forward, op, inputs)?;
    // a pointwise call with checkers runs and is checked tile by tile (runtime/tiled.rs)
    let tiled = {
        let _kernel = super::autograd::KernelScope::enter();
        super::tiled::forward(k, &binding, op, inputs)
    };
    if let Some(out) = tiled {
        return out;
    }
    let out = {
        let _kernel = super::autograd::KernelScope::enter();
        let _composite = CompositeScope::enter(k);
        let device = inputs.first().map_or(Device::Cpu, |t| t.device());
        super::op_times::timed(&k.capsule().name, "forward", device, || {
            (binding.forward())(op, inputs)
        })?
    };
    #[cfg(feature = "fault-injection")]
    let out = fault::after_forward(binding.forward(), op, inputs, out)?;
    let checks = || check_forward(k, op, inputs, &out);
    if k.checkers(Phase::Forward).is_empty() {
        checks()?;
    } else {
        super::op_times::timed(&k.capsule().name, "forward checks", out.device(), checks)?;
    }
    Ok(out)
}

/// Runs the in-place kernel `in_place` of the CPU binding of `k` after its guards:
/// `op(target, rest…)` written into `target` (see `runtime::kernel::InPlaceKernel`). Only
/// for kernels whose evidence holds no forward checker: a checker replays the call on its
/// inputs, which this kernel overwrites, so callers run checked kernels by [`run_forward`].
pub(crate) fn run_in_place(
    k: &AcceptedKernel,
    op: &Op,
    in_place: super::kernel::InPlaceKernel,
    target: &mut Tensor,
    rest: &[&Tensor],
) -> Result<()> {
    refuse_checked_in_place(k)?;
    {
        let inputs = super::kernel::update_operands(target, rest);
        guard_tensors(k, Phase::Forward, op, &inputs)?;
    }
    // a fault-injection build counts and corrupts calls in `run_forward`: while a campaign
    // runs there, an update is computed out of place (the same values: the conformance
    // harness holds in-place kernels to the forward kernel's bits) so that it is counted
    // and can be injected like every other call
    #[cfg(feature = "fault-injection")]
    if fault::active() {
        let value = {
            let inputs = super::kernel::update_operands(target, rest);
            run_forward(k, op, &inputs)?
        };
        return target.assign(value);
    }
    let _kernel = super::autograd::KernelScope::enter();
    let _composite = CompositeScope::enter(k);
    let device = target.device();
    super::op_times::timed(&k.capsule().name, "forward", device, || {
        in_place(op, target, rest)
    })
}

/// An in-place call of a kernel with forward checkers is refused: they replay the call on
/// its inputs, which the kernel would have overwritten.
fn refuse_checked_in_place(k: &AcceptedKernel) -> Result<()> {
    if k.checkers(Phase::Forward).is_empty() {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "capsule `{}`: an in-place call would overwrite the inputs its checkers replay",
            k.capsule().name
        )))
    }
}

/// Runs the update-many kernel `update_many` of the CPU binding of `k` after its guards over
/// the call's operands (see `runtime::kernel::UpdateManyKernel`). As [`run_in_place`]: only
/// for kernels whose evidence holds no forward checker, and in a fault-injection campaign the
/// value is computed out of place (by [`run_forward`], counted and injectable) and each
/// target takes its part by `slice`/`reshape` ops, as under a checking profile.
pub(crate) fn run_update_many(
    k: &AcceptedKernel,
    op: &Op,
    update_many: super::kernel::UpdateManyKernel,
    targets: &mut [&mut Tensor],
    rest: &[&Tensor],
) -> Result<()> {
    refuse_checked_in_place(k)?;
    {
        let inputs = super::kernel::update_many_operands(op, targets, rest)?;
        guard_tensors(k, Phase::Forward, op, &inputs)?;
    }
    #[cfg(feature = "fault-injection")]
    if fault::active() {
        let value = {
            let inputs = super::kernel::update_many_operands(op, targets, rest)?;
            run_forward(k, op, &inputs)?
        };
        // the parts go to the targets as under a checking profile (`take_parts`), so that
        // both profiles of a campaign make the same calls
        return super::session::take_parts(op, targets, &value);
    }
    let _kernel = super::autograd::KernelScope::enter();
    let _composite = CompositeScope::enter(k);
    let device = targets.first().map_or(Device::Cpu, |t| t.device());
    super::op_times::timed(&k.capsule().name, "forward", device, || {
        update_many(op, targets, rest)
    })
}

/// Runs an update of several tensors under the forward checkers of `k` by tiles
/// (`runtime/tiled.rs`: each tile computed by the capsule's destination-passing kernel and
/// checked while in cache; the targets take their new values only when every tile was
/// accepted), after the guards over the whole call. `None` when the call does not qualify:
/// the caller computes the whole value and checks it ([`run_forward`]).
pub(crate) fn run_update_many_by_tiles(
    k: &AcceptedKernel,
    binding: &super::kernel::KernelBinding,
    op: &Op,
    targets: &mut [&mut Tensor],
    rest: &[&Tensor],
) -> Option<Result<()>> {
    if !super::tiled::updates_many_by_tiles(k, binding, op.kind()) {
        return None;
    }
    let guarded = super::kernel::update_many_operands(op, targets, rest)
        .and_then(|inputs| guard_tensors(k, Phase::Forward, op, &inputs));
    if let Err(e) = guarded {
        return Some(Err(e));
    }
    let _kernel = super::autograd::KernelScope::enter();
    super::tiled::update_many(k, binding, op, targets, rest)
}

/// Fault injection (cargo feature `fault-injection`, off by default): corrupts the result of
/// one chosen kernel call after the kernel and before the checkers, to measure what the
/// checkers and the runtime catch (`examples/fault_injection.rs`, docs/assurance.md).
///
/// A thread-local plan is armed with a [`fault::Target`] — an op kind, a phase, which of its
/// calls on this thread (0-based), a [`fault::FaultClass`] and a seed — and fires on exactly
/// that call of [`run_forward`] or [`run_vjp`] (the eager path, the tape's backward pass and
/// the compiled executor's general path, and in-place calls, which run out of place while
/// a plan is armed or calls are counted; not the dense executor). After
/// it fires the plan is spent; [`fault::disarm`] returns what was injected, with copies of
/// the call's inputs and of the clean and corrupted results so that a harness can measure
/// the fault against a checker's declared bound.
#[cfg(feature = "fault-injection")]
pub mod fault {
    use crate::backend::Phase;
    use crate::error::Result;
    use crate::graph::{Op, OpKind};
    use crate::runtime::kernel::{ForwardKernel, VjpKernel};
    use crate::spec::splitmix64;
    use crate::tensor::Tensor;
    use std::cell::RefCell;

    /// The ways a kernel's result is corrupted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum FaultClass {
        /// The sign bit of one random element flipped.
        SignBit,
        /// One random exponent bit (23..=30) of one random element flipped.
        ExponentBit,
        /// One random high mantissa bit (12..=22: a change of 2^-12..2^-1 of the element's
        /// binade) of one random element flipped.
        HighMantissaBit,
        /// One random low mantissa bit (0..=11: a change below 2^-12 of the element's
        /// binade, under the recompute tolerance) of one random element flipped.
        LowMantissaBit,
        /// The kernel re-run with one operand (of rank >= 2, both last dims > 1) read
        /// transposed: its last two axes swapped and re-laid in its own shape.
        TransposedOperand,
        /// The rows (last axis) of one result cyclically shifted by one (elements, when
        /// the result has a single row).
        RowsShifted,
        /// Every element of every result multiplied by 1 + 1e-3 (in f32).
        Scaled,
        /// One random element of one result set to NaN.
        OneNan,
        /// One gradient (of an input that needs one) replaced by zeros: that input's
        /// gradient contribution dropped (VJP calls only).
        GradientDropped,
    }

    impl FaultClass {
        pub const ALL: &'static [FaultClass] = &[
            FaultClass::SignBit,
            FaultClass::ExponentBit,
            FaultClass::HighMantissaBit,
            FaultClass::LowMantissaBit,
            FaultClass::TransposedOperand,
            FaultClass::RowsShifted,
            FaultClass::Scaled,
            FaultClass::OneNan,
            FaultClass::GradientDropped,
        ];

        pub fn name(self) -> &'static str {
            match self {
                FaultClass::SignBit => "bit flip: sign",
                FaultClass::ExponentBit => "bit flip: exponent",
                FaultClass::HighMantissaBit => "bit flip: high mantissa (12-22)",
                FaultClass::LowMantissaBit => "bit flip: low mantissa (0-11)",
                FaultClass::TransposedOperand => "transposed operand",
                FaultClass::RowsShifted => "rows shifted by one",
                FaultClass::Scaled => "scaled by 1+1e-3",
                FaultClass::OneNan => "one NaN",
                FaultClass::GradientDropped => "gradient contribution dropped",
            }
        }

        /// Whether the class applies to calls of `phase`.
        pub fn applies_to(self, phase: Phase) -> bool {
            self != FaultClass::GradientDropped || phase == Phase::Vjp
        }
    }

    /// Which call to corrupt, and how.
    #[derive(Debug, Clone, Copy)]
    pub struct Target {
        pub op: OpKind,
        pub phase: Phase,
        /// Fire on this call (0-based) of `op` in `phase` on this thread after arming.
        pub occurrence: usize,
        pub class: FaultClass,
        pub seed: u64,
    }

    /// A fault that was injected: the call (inputs copied) and its clean and corrupted
    /// results (forward: the output; VJP: one entry per input, `None` where no gradient).
    #[derive(Debug, Clone)]
    pub struct Injection {
        pub target: Target,
        pub op: Op,
        /// What was done (element, bit, operand).
        pub detail: String,
        pub inputs: Vec<Tensor>,
        /// VJP calls: the forward output and the cotangent.
        pub output: Option<Tensor>,
        pub cotangent: Option<Tensor>,
        pub needs: Vec<bool>,
        pub clean: Vec<Option<Tensor>>,
        pub corrupted: Vec<Option<Tensor>>,
    }

    /// What an armed plan did.
    #[derive(Debug, Clone)]
    pub enum Effect {
        /// The target call ran and its result was corrupted.
        Injected(Box<Injection>),
        /// The target call ran, but the class does not apply to it (e.g. no operand to
        /// transpose, a single-element result to shift); its result was left alone.
        NotApplicable(String),
    }

    enum State {
        Off,
        Counting(Vec<(OpKind, Phase, usize)>),
        Armed { target: Target, seen: usize },
        Fired(Effect),
    }

    thread_local! {
        static STATE: RefCell<State> = const { RefCell::new(State::Off) };
    }

    /// Arms a plan on this thread (replacing any other).
    pub fn arm(target: Target) {
        STATE.with(|s| *s.borrow_mut() = State::Armed { target, seen: 0 });
    }

    /// Disarms this thread's plan; what it did (`None`: the target call was never reached).
    pub fn disarm() -> Option<Effect> {
        match STATE.with(|s| std::mem::replace(&mut *s.borrow_mut(), State::Off)) {
            State::Fired(e) => Some(e),
            _ => None,
        }
    }

    /// Starts counting this thread's guarded kernel calls per (op, phase), injecting nothing.
    pub fn start_counting() {
        STATE.with(|s| *s.borrow_mut() = State::Counting(Vec::new()));
    }

    /// Stops counting; the calls seen per (op, phase), in first-call order.
    pub fn stop_counting() -> Vec<(OpKind, Phase, usize)> {
        match STATE.with(|s| std::mem::replace(&mut *s.borrow_mut(), State::Off)) {
            State::Counting(v) => v,
            _ => Vec::new(),
        }
    }

    /// Whether this thread counts calls or has a plan armed.
    pub(crate) fn active() -> bool {
        STATE.with(|s| matches!(&*s.borrow(), State::Counting(_) | State::Armed { .. }))
    }

    /// Whether this call is the target (and so the plan fires now).
    fn fires(op: OpKind, phase: Phase) -> Option<Target> {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            match &mut *s {
                State::Counting(v) => {
                    match v.iter_mut().find(|(o, p, _)| *o == op && *p == phase) {
                        Some(e) => e.2 += 1,
                        None => v.push((op, phase, 1)),
                    }
                    None
                }
                State::Armed { target, seen } if target.op == op && target.phase == phase => {
                    if *seen == target.occurrence {
                        Some(*target)
                    } else {
                        *seen += 1;
                        None
                    }
                }
                _ => None,
            }
        })
    }

    fn fired(e: Effect) {
        STATE.with(|s| *s.borrow_mut() = State::Fired(e));
    }

    /// A deterministic stream of draws from the target's seed.
    struct Draws(u64, u64);

    impl Draws {
        fn below(&mut self, n: usize) -> usize {
            self.1 += 1;
            ((splitmix64(self.0 ^ splitmix64(self.1)) as u128 * n as u128) >> 64) as usize
        }
    }

    fn copy(t: &Tensor) -> Result<Tensor> {
        Tensor::from_vec(t.host_data().into_owned(), t.shape())
    }

    /// `t` with its last two axes read transposed (row-major data of the swapped matrix,
    /// laid out in `t`'s own shape); `None` when that changes nothing structurally.
    fn transposed(t: &Tensor) -> Result<Option<Tensor>> {
        let s = t.shape();
        if s.len() < 2 || s[s.len() - 1] < 2 || s[s.len() - 2] < 2 {
            return Ok(None);
        }
        let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
        let v = t.host_data();
        let mut out = Vec::with_capacity(v.len());
        for m in v.chunks_exact(r * c) {
            // element (i, j) read where a column-major r×c matrix would hold it (the
            // transpose, for a square one)
            for i in 0..r {
                for j in 0..c {
                    out.push(m[j * r + i]);
                }
            }
        }
        Tensor::from_vec(out, s).map(Some)
    }

    /// Corrupts `results` in place (one of `Some` entries, or all for `Scaled`); the
    /// description, or `None` when the class does not apply.
    fn corrupt_values(
        class: FaultClass,
        d: &mut Draws,
        results: &mut [Option<Vec<f32>>],
        shapes: &[Vec<usize>],
    ) -> Option<String> {
        let present: Vec<usize> = (0..results.len())
            .filter(|&i| results[i].as_ref().is_some_and(|v| !v.is_empty()))
            .collect();
        if present.is_empty() {
            return None;
        }
        if class == FaultClass::Scaled {
            for v in results.iter_mut().flatten() {
                v.iter_mut().for_each(|x| *x *= 1.0 + 1e-3);
            }
            return Some("every element scaled by 1+1e-3".into());
        }
        let which = present[d.below(present.len())];
        let v = results[which].as_mut()?;
        let n = v.len();
        match class {
            FaultClass::SignBit
            | FaultClass::ExponentBit
            | FaultClass::HighMantissaBit
            | FaultClass::LowMantissaBit => {
                let bit = match class {
                    FaultClass::SignBit => 31,
                    FaultClass::ExponentBit => 23 + d.below(8),
                    FaultClass::HighMantissaBit => 12 + d.below(11),
                    _ => d.below(12),
                };
                let e = d.below(n);
                let before = v[e];
                v[e] = f32::from_bits(before.to_bits() ^ (1 << bit));
                Some(format!(
                    "result {which} element {e}: bit {bit} flipped, {before:e} -> {:e}",
                    v[e]
                ))
            }
            FaultClass::OneNan => {
                let e = d.below(n);
                v[e] = f32::NAN;
                Some(format!("result {which} element {e} set to NaN"))
            }
            FaultClass::RowsShifted => {
                if n < 2 {
                    return None;
                }
                let s = &shapes[which];
                let w = s.last().copied().unwrap_or(1).max(1);
                let w = if n / w >= 2 { w } else { 1 };
                v.rotate_left(w);
                Some(format!(
                    "result {which}: rows of {w} shifted up by one (cyclically)"
                ))
            }
            FaultClass::GradientDropped => {
                v.iter_mut().for_each(|x| *x = 0.0);
                Some(format!("gradient {which} replaced by zeros"))
            }
            FaultClass::Scaled | FaultClass::TransposedOperand => None,
        }
    }

    fn to_tensors(
        vals: Vec<Option<Vec<f32>>>,
        shapes: &[Vec<usize>],
    ) -> Result<Vec<Option<Tensor>>> {
        vals.into_iter()
            .zip(shapes)
            .map(|(v, s)| v.map(|v| Tensor::from_vec(v, s)).transpose())
            .collect()
    }

    /// Called by [`super::run_forward`] after the kernel, before the checkers.
    pub(crate) fn after_forward(
        kernel: ForwardKernel,
        op: &Op,
        inputs: &[&Tensor],
        out: Tensor,
    ) -> Result<Tensor> {
        let Some(target) = fires(op.kind(), Phase::Forward) else {
            return Ok(out);
        };
        let mut d = Draws(target.seed, 0);
        let corrupted = if target.class == FaultClass::TransposedOperand {
            let mut candidates = Vec::new();
            for (i, x) in inputs.iter().enumerate() {
                if let Some(t) = transposed(x)? {
                    candidates.push((i, t));
                }
            }
            if candidates.is_empty() {
                fired(Effect::NotApplicable(
                    "no operand of rank >= 2 to transpose".into(),
                ));
                return Ok(out);
            }
            let (i, t) = candidates.swap_remove(d.below(candidates.len()));
            let mut xs: Vec<&Tensor> = inputs.to_vec();
            xs[i] = &t;
            let y = {
                let _kernel = super::super::autograd::KernelScope::enter();
                kernel(op, &xs)?
            };
            Some((
                format!("kernel re-run with operand {i} transposed"),
                copy(&y)?,
            ))
        } else {
            let shapes = vec![out.shape().to_vec()];
            let mut vals = vec![Some(out.host_data().into_owned())];
            match corrupt_values(target.class, &mut d, &mut vals, &shapes) {
                None => None,
                Some(detail) => {
                    let t = to_tensors(vals, &shapes)?.pop().flatten();
                    t.map(|t| (detail, t))
                }
            }
        };
        let Some((detail, bad)) = corrupted else {
            fired(Effect::NotApplicable(format!(
                "{} does not apply to a result of shape {:?}",
                target.class.name(),
                out.shape()
            )));
            return Ok(out);
        };
        fired(Effect::Injected(Box::new(Injection {
            target,
            op: op.clone(),
            detail,
            inputs: inputs.iter().map(|t| copy(t)).collect::<Result<_>>()?,
            output: None,
            cotangent: None,
            needs: Vec::new(),
            clean: vec![Some(copy(&out)?)],
            corrupted: vec![Some(bad.clone())],
        })));
        Ok(bad)
    }

    /// Called by [`super::run_vjp`] after the kernel, before the checkers.
    pub(crate) fn after_vjp(
        kernel: VjpKernel,
        op: &Op,
        inputs: &[&Tensor],
        output: &Tensor,
        cotangent: &Tensor,
        needs: &[bool],
        grads: Vec<Option<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        let Some(target) = fires(op.kind(), Phase::Vjp) else {
            return Ok(grads);
        };
        let mut d = Draws(target.seed, 0);
        let shapes: Vec<Vec<usize>> = grads
            .iter()
            .zip(inputs)
            .map(|(g, x)| {
                g.as_ref()
                    .map_or(x.shape().to_vec(), |g| g.shape().to_vec())
            })
            .collect();
        let corrupted: Option<(String, Vec<Option<Tensor>>)> =
            if target.class == FaultClass::TransposedOperand {
                // the inputs and the cotangent are the VJP kernel's operands
                let mut candidates = Vec::new();
                for (i, x) in inputs.iter().chain([&cotangent]).enumerate() {
                    if let Some(t) = transposed(x)? {
                        candidates.push((i, t));
                    }
                }
                if candidates.is_empty() {
                    None
                } else {
                    let (i, t) = candidates.swap_remove(d.below(candidates.len()));
                    let mut xs: Vec<&Tensor> = inputs.to_vec();
                    let cot = if i == inputs.len() {
                        &t
                    } else {
                        xs[i] = &t;
                        cotangent
                    };
                    let gs = {
                        let _kernel = super::super::autograd::KernelScope::enter();
                        super::requested(kernel(op, &xs, output, cot, needs)?, needs)
                    };
                    let what = if i == inputs.len() {
                        "the cotangent".to_string()
                    } else {
                        format!("operand {i}")
                    };
                    let gs = gs
                        .iter()
                        .map(|g| g.as_ref().map(copy).transpose())
                        .collect::<Result<_>>()?;
                    Some((format!("VJP kernel re-run with {what} transposed"), gs))
                }
            } else {
                let mut vals: Vec<Option<Vec<f32>>> = grads
                    .iter()
                    .map(|g| g.as_ref().map(|g| g.host_data().into_owned()))
                    .collect();
                match corrupt_values(target.class, &mut d, &mut vals, &shapes) {
                    None => None,
                    Some(detail) => Some((detail, to_tensors(vals, &shapes)?)),
                }
            };
        let Some((detail, bad)) = corrupted else {
            fired(Effect::NotApplicable(format!(
                "{} does not apply to this VJP call",
                target.class.name()
            )));
            return Ok(grads);
        };
        fired(Effect::Injected(Box::new(Injection {
            target,
            op: op.clone(),
            detail,
            inputs: inputs.iter().map(|t| copy(t)).collect::<Result<_>>()?,
            output: Some(copy(output)?),
            cotangent: Some(copy(cotangent)?),
            needs: needs.to_vec(),
            clean: grads
                .iter()
                .map(|g| g.as_ref().map(copy).transpose())
                .collect::<Result<_>>()?,
            corrupted: bad.clone(),
        })));
        Ok(bad)
    }
}
