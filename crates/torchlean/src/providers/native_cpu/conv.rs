//! Native conv kernels.

use crate::graph::Op;
use crate::tensor::Tensor;

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let _ = (op, x, out_shape);
    unimplemented!()
}

pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor) -> Vec<Option<Tensor>> {
    let _ = (op, x, gy);
    unimplemented!()
}
