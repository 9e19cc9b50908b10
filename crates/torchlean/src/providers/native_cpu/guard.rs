//! Runtime guards of the native CPU kernels (and of the compositions): the functions their
//! capsules' evidence holds, which the runtime calls before every kernel call (see
//! `backend::guard`). Each can reject: a guard that cannot fail is not a guard.

use crate::backend::{Device, Operand};
use crate::error::{OpError, Result};
use crate::graph::Op;
use crate::spec;
use crate::tensor::Tensor;

/// Shape guard: the inputs' shapes satisfy the op's shared shape rule (`spec::infer_shape`).
pub fn shape_rule(op: &Op, inputs: &[Operand]) -> std::result::Result<(), OpError> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|o| o.shape).collect();
    spec::infer_shape(op, &shapes).map(|_| ())
}

/// Layout guard: every input lives in host memory and its layout addresses only elements of
/// its storage (a view whose strides or offset run past its storage, or a dense buffer shorter
/// than its shape, is refused before a kernel reads it).
pub fn host_inputs_in_bounds(op: &Op, inputs: &[Operand]) -> std::result::Result<(), OpError> {
    let refuse = |reason: String| OpError::Layout {
        op: op.name(),
        shapes: inputs.iter().map(|o| o.shape.to_vec()).collect(),
        reason,
    };
    for (i, o) in inputs.iter().enumerate() {
        if o.device != Device::Cpu {
            return Err(refuse(format!(
                "input {i} is on device `{}`, not the host",
                o.device
            )));
        }
        let numel = o
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| refuse(format!("input {i}: shape {:?} overflows", o.shape)))?;
        if numel == 0 {
            continue;
        }
        let last = match o.strides {
            None => numel - 1,
            Some(strides) => {
                if strides.len() != o.shape.len() {
                    return Err(refuse(format!(
                        "input {i}: {} strides for a rank-{} shape",
                        strides.len(),
                        o.shape.len()
                    )));
                }
                o.shape
                    .iter()
                    .zip(strides)
                    .try_fold(0usize, |a, (&d, &s)| a.checked_add((d - 1).checked_mul(s)?))
                    .ok_or_else(|| refuse(format!("input {i}: strided extent overflows")))?
            }
        };
        let end = o.offset.checked_add(last);
        if end.is_none_or(|e| e >= o.storage.len()) {
            return Err(refuse(format!(
                "input {i} (strides {:?}, offset {}) addresses past its storage of {} elements",
                o.strides,
                o.offset,
                o.storage.len()
            )));
        }
    }
    Ok(())
}

/// The output shape of a kernel call (the kernels' own computation of it; the cited shape
/// guard [`shape_rule`] has already run).
pub fn output_shape(op: &Op, inputs: &[&Tensor]) -> Result<Vec<usize>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    Ok(spec::infer_shape(op, &shapes)?)
}
