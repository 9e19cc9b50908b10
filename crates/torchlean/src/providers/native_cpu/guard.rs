//! Runtime guards of the native CPU kernels, run on every call at the execution boundary.

use crate::error::Result;
use crate::graph::Op;
use crate::spec;
use crate::tensor::Tensor;

/// Shape guard: validates the inputs with the shared shape rule and returns the output shape.
/// Every native forward kernel calls it before touching data.
pub fn output_shape(op: &Op, inputs: &[&Tensor]) -> Result<Vec<usize>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    Ok(spec::infer_shape(op, &shapes)?)
}

/// Layout guard: native kernels read every input through `Tensor::data`, which yields the
/// elements in canonical row-major order whatever the strided layout (copying when needed).
/// Returns the row-major elements of each input.
pub fn row_major_inputs<'a>(inputs: &'a [&Tensor]) -> Vec<std::borrow::Cow<'a, [f32]>> {
    inputs.iter().map(|t| t.data()).collect()
}
