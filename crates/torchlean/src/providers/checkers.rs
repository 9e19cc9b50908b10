//! Executable replay checkers, run on every call of the kernels whose capsules cite them.
//!
//! `canonical_layout` — claim: the kernel's result is a canonical row-major tensor of the
//! shape the spec's shape rule assigns. Soundness: the checker compares the result's shape
//! with `spec::infer_shape` of the actual input shapes and verifies the result is contiguous
//! with offset 0 and exactly `numel(shape)` elements of storage, so acceptance implies the
//! claim for this call (no float assumptions are involved: the check is on integers).
//! Mutation tests in tests/trust.rs feed it results of a wrong shape and of a non-canonical
//! layout and expect rejection.

use crate::error::{Error, Result};
use crate::graph::Op;
use crate::spec::numel;
use crate::tensor::Tensor;

/// Checks that `result` is canonical row-major with exactly `expected_shape`.
pub fn canonical_layout(op: &Op, result: &Tensor, expected_shape: &[usize]) -> Result<()> {
    let l = result.layout();
    let canonical = l.shape == expected_shape
        && l.offset == 0
        && result.is_contiguous()
        && result.storage_len() == numel(expected_shape);
    if canonical {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "checker canonical_layout rejected op `{}`: result has shape {:?} strides {:?} offset {} over {} stored elements; expected a canonical row-major tensor of shape {:?}",
            op.name(), l.shape, l.strides, l.offset, result.storage_len(), expected_shape
        )))
    }
}
