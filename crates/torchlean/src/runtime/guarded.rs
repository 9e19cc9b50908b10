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

/// The operand view of a tensor (its metadata and whole storage).
pub(crate) fn tensor_operand(t: &Tensor) -> Operand<'_> {
    let l = t.layout();
    Operand {
        shape: &l.shape,
        strides: Some(&l.strides),
        offset: l.offset,
        storage: t.storage_slice(),
        device: Device::Cpu,
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
    let operands: Vec<Operand> = inputs.iter().map(|t| tensor_operand(t)).collect();
    let call = Call {
        inputs: &operands,
        output: tensor_operand(out),
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
    let operands: Vec<Operand> = inputs.iter().map(|t| tensor_operand(t)).collect();
    let grads: Vec<Option<Operand>> = grads
        .iter()
        .map(|g| g.as_ref().map(tensor_operand))
        .collect();
    let call = Call {
        inputs: &operands,
        output: tensor_operand(output),
        cotangent: Some(tensor_operand(cotangent)),
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
    let grads = {
        let _kernel = super::autograd::KernelScope::enter();
        vjp(op, inputs, output, cotangent, needs)?
    };
    check_vjp(k, op, inputs, output, cotangent, needs, &grads)?;
    Ok(grads)
}

/// Runs the forward kernel of the CPU binding of `k` between its guards and checkers.
pub(crate) fn run_forward(k: &AcceptedKernel, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let binding = super::kernel::cpu_binding(k)?;
    guard_tensors(k, Phase::Forward, op, inputs)?;
    let out = {
        let _kernel = super::autograd::KernelScope::enter();
        (binding.forward())(op, inputs)?
    };
    check_forward(k, op, inputs, &out)?;
    Ok(out)
}
