//! The executable side of a capsule: the kernel functions a provider binds to it.
//!
//! Kernels take the op (with its payload) and input tensors of any layout, validate what they
//! need (their runtime guards), and return a new untracked tensor. VJP kernels receive the
//! inputs, the forward output, the output's cotangent and which inputs need a gradient
//! (`needs[i]`), and return one cotangent per input: `None` for inputs that take no gradient,
//! and allowed (not required) for inputs whose `needs[i]` is false.
//!
//! A capsule may also bind *destination-passing* variants (`forward_into`, `vjp_into`,
//! `in_place_into`) over dense row-major slices. The compiled executor uses them when every
//! node of a plan has one: it then owns all buffers (its static memory plan) and creates no
//! tensors between the graph's inputs and outputs. They must compute exactly what the tensor
//! kernels compute (the native provider implements the tensor kernels on top of them, and the
//! conformance harness runs them on stale, garbage-filled buffers).

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

/// A dense row-major operand of a destination-passing kernel.
#[derive(Debug, Clone, Copy)]
pub struct Dense<'a> {
    pub data: &'a [f32],
    pub shape: &'a [usize],
}

impl Dense<'_> {
    /// A placeholder (no elements, rank 0) for fixed-size operand arrays.
    pub const EMPTY: Dense<'static> = Dense {
        data: &[],
        shape: &[],
    };
}

/// Computes an op's forward value into `out` (the output's element count), writing every
/// element (its previous contents are arbitrary).
pub type ForwardIntoKernel = fn(&Op, &[Dense], &mut [f32]) -> Result<()>;
/// Computes an op's local VJP into the buffers of the inputs that need a cotangent:
/// `(op, inputs, output, cotangent, outs)` with `outs[i]` `Some` (of input i's element count,
/// every element written) exactly where input i needs one.
pub type VjpIntoKernel = fn(&Op, &[Dense], Dense, Dense, &mut [Option<&mut [f32]>]) -> Result<()>;
/// Computes a one-input op over its input's buffer, in place.
pub type InPlaceIntoKernel = fn(&Op, &[usize], &mut [f32]) -> Result<()>;

/// The destination-passing kernels of a capsule (all three, or none).
#[derive(Clone, Copy)]
pub struct DenseKernels {
    pub forward_into: ForwardIntoKernel,
    /// `None` when the op is not differentiable.
    pub vjp_into: Option<VjpIntoKernel>,
    /// `Some` for one-input maps that may overwrite their input.
    pub in_place_into: Option<InPlaceIntoKernel>,
}

/// The kernels bound to one capsule.
#[derive(Clone, Copy)]
pub struct KernelBinding {
    pub forward: ForwardKernel,
    pub vjp: Option<VjpKernel>,
    /// Optional in-place variant, used by the compiled executor where the input's last use is
    /// this op.
    pub in_place: Option<InPlaceKernel>,
    /// Optional destination-passing variants (see the module documentation).
    pub dense: Option<DenseKernels>,
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
