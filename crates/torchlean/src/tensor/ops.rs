//! The op methods of [`Tensor`]: each builds an [`Op`] and runs it through the eager runtime.

use super::Tensor;
use crate::error::Result;
use crate::graph::Op;
use crate::runtime::apply;

impl Tensor {
    /// Runs `op` with `self` as the first input.
    pub fn apply(&self, op: Op, others: &[&Tensor]) -> Result<Tensor> {
        let mut inputs = Vec::with_capacity(1 + others.len());
        inputs.push(self);
        inputs.extend_from_slice(others);
        apply(op, &inputs)
    }
    pub fn add(&self, o: &Tensor) -> Result<Tensor> {
        apply(Op::Add, &[self, o])
    }
    pub fn sub(&self, o: &Tensor) -> Result<Tensor> {
        apply(Op::Sub, &[self, o])
    }
    pub fn mul(&self, o: &Tensor) -> Result<Tensor> {
        apply(Op::Mul, &[self, o])
    }
    pub fn div(&self, o: &Tensor) -> Result<Tensor> {
        apply(Op::Div, &[self, o])
    }
    pub fn matmul(&self, o: &Tensor) -> Result<Tensor> {
        apply(Op::Matmul, &[self, o])
    }
    pub fn relu(&self) -> Result<Tensor> {
        apply(Op::Relu, &[self])
    }
    pub fn sum_all(&self) -> Result<Tensor> {
        apply(Op::SumAll, &[self])
    }
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        apply(Op::MseLoss, &[self, target])
    }
    pub fn linear(&self, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        match b {
            Some(b) => apply(Op::Linear, &[self, w, b]),
            None => apply(Op::Linear, &[self, w]),
        }
    }
}
