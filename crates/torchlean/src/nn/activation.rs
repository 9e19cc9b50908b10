//! Activation layers: [`Activation`] as a parameter-free module, and softmax / log-softmax
//! over an axis.

use super::linear::Activation;
use super::module::Module;
use crate::error::Result;
use crate::tensor::Tensor;

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.apply(x)
    }
}

/// Softmax over `axis` (negative counts from the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softmax {
    pub axis: isize,
}

impl Module for Softmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.softmax(self.axis)
    }
}

/// Log-softmax over `axis` (negative counts from the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSoftmax {
    pub axis: isize,
}

impl Module for LogSoftmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.log_softmax(self.axis)
    }
}
