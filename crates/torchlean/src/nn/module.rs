//! The module abstraction: a forward function plus named parameters.

use crate::error::Result;
use crate::tensor::Tensor;

/// A model component with named, trainable parameters.
pub trait Module {
    /// The forward function.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Parameters with stable dotted names, in a fixed order.
    fn parameters(&self) -> Vec<(String, &Tensor)>;
    /// The same parameters, mutable, in the same order.
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)>;
    /// Total number of scalar parameters.
    fn parameter_count(&self) -> usize {
        self.parameters().iter().map(|(_, t)| t.numel()).sum()
    }
}
