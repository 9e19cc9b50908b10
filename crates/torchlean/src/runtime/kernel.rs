//! The executable side of a capsule: the kernel functions a provider binds to it.
//!
//! Kernels take the op (with its payload) and input tensors of any layout, validate what they
//! need (their runtime guards), and return a new untracked tensor. VJP kernels receive the
//! inputs, the forward output, the output's cotangent and which inputs need a gradient
//! (`needs[i]`), and return one cotangent per input: `None` for inputs that take no gradient,
//! and allowed (not required) for inputs whose `needs[i]` is false.

use crate::error::Result;
use crate::graph::Op;
use crate::tensor::Tensor;

/// Computes an op's forward value.
pub type ForwardKernel = fn(&Op, &[&Tensor]) -> Result<Tensor>;
/// Computes an op's local VJP.
pub type VjpKernel = fn(&Op, &[&Tensor], &Tensor, &Tensor, &[bool]) -> Result<Vec<Option<Tensor>>>;

/// Computes a one-input op, taking the input by value so that it may overwrite its buffer
/// (when the caller held the only reference). Must give the same values as the forward kernel.
pub type InPlaceKernel = fn(&Op, Tensor) -> Result<Tensor>;

/// The kernels bound to one capsule.
#[derive(Clone, Copy)]
pub struct KernelBinding {
    pub forward: ForwardKernel,
    pub vjp: Option<VjpKernel>,
    /// Optional in-place variant, used by the compiled executor where the input's last use is
    /// this op.
    pub in_place: Option<InPlaceKernel>,
}

impl std::fmt::Debug for KernelBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KernelBinding {{ forward: {:#x}, vjp: {} }}",
            self.forward as usize,
            if self.vjp.is_some() { "bound" } else { "none" }
        )
    }
}
