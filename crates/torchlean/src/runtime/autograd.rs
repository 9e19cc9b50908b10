//! Eager tape autograd: define-by-run, parent links.
//!
//! Every recorded result holds a [`GradNode`]: the op with its payload, its input tensors
//! (the parent links), its forward output, and the accepted kernel that ran it — whose bound
//! VJP the backward pass applies. `backward()` walks the links from a scalar in reverse
//! topological order and returns a [`Gradients`] store keyed by leaf tensor. Accumulation
//! across several paths happens inside one pass; accumulation across passes (micro-batches)
//! is [`Gradients::accumulate`] or [`Tensor::backward_into`].

use crate::backend::AcceptedKernel;
use crate::error::{Error, Result};
use crate::graph::Op;
use crate::tensor::{IdMap, IdSet, Tensor, TensorId};
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    /// How many kernels are running on this thread (a kernel reads its inputs on the host;
    /// that is not model code leaking a traced value out of a capture).
    static KERNEL_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether model code (not a kernel) is running inside a graph capture on this thread,
/// whatever the grad mode: the moment where reading a traced value on the host, or cutting
/// it from the tape, would freeze this run's data into the captured graph.
pub(crate) fn in_capture_model_code() -> bool {
    CAPTURING.with(|c| c.get()) && KERNEL_DEPTH.with(|d| d.get()) == 0
}

/// Marks a kernel as running until dropped (see [`in_capture_model_code`]).
pub(crate) struct KernelScope;

impl KernelScope {
    pub(crate) fn enter() -> KernelScope {
        KERNEL_DEPTH.with(|d| d.set(d.get() + 1));
        KernelScope
    }
}

impl Drop for KernelScope {
    fn drop(&mut self) {
        KERNEL_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Whether a graph capture has been started on this thread (whatever the grad mode).
pub(crate) fn capture_started() -> bool {
    CAPTURING.with(|c| c.get())
}

/// Whether a graph capture is in progress on this thread (every op is recorded while grad
/// mode is on, differentiable or not; kernels that compose other ops turn grad mode off, so
/// their parts are not captured).
pub(crate) fn capturing() -> bool {
    CAPTURING.with(|c| c.get()) && grad_enabled()
}

/// Turns capture mode on until dropped (and grad mode on).
pub(crate) struct CaptureGuard {
    previous: bool,
    _grad: NoGradGuard,
}

impl CaptureGuard {
    pub(crate) fn new() -> CaptureGuard {
        CaptureGuard {
            previous: CAPTURING.with(|c| c.replace(true)),
            _grad: NoGradGuard::set(true),
        }
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(self.previous));
    }
}

/// Whether ops on this thread currently record the tape.
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode when dropped.
pub struct NoGradGuard {
    previous: bool,
}

impl NoGradGuard {
    /// Disables recording until the guard is dropped.
    pub fn new() -> NoGradGuard {
        NoGradGuard::set(false)
    }

    /// Sets the grad mode (on or off) until the guard is dropped.
    pub fn set(enabled: bool) -> NoGradGuard {
        let previous = GRAD_ENABLED.with(|g| g.replace(enabled));
        NoGradGuard { previous }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        NoGradGuard::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Runs `f` without recording the tape (and so with VJP mode `none`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

/// One recorded op.
pub(crate) struct GradNode {
    pub(crate) op: Op,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) output: Tensor,
    pub(crate) kernel: Arc<AcceptedKernel>,
}

impl GradNode {
    /// Name of the capsule that ran this node.
    pub(crate) fn capsule(&self) -> &str {
        &self.kernel.capsule().name
    }
}

/// Attaches a tape node to a fresh kernel output.
pub(crate) fn record(
    op: Op,
    inputs: &[&Tensor],
    out: Tensor,
    kernel: Arc<AcceptedKernel>,
) -> Tensor {
    let node = GradNode {
        op,
        inputs: inputs.iter().map(|t| (*t).clone()).collect(),
        output: out.detach(),
        kernel,
    };
    out.with_grad_fn(node)
}

/// Gradients of leaf tensors, keyed by tensor identity.
#[derive(Default, Clone)]
pub struct Gradients {
    map: IdMap<Tensor>,
}

impl Gradients {
    /// The gradient of a leaf, if it received one.
    pub fn get(&self, t: &Tensor) -> Option<&Tensor> {
        self.map.get(&t.id())
    }

    /// The gradient of a leaf by id.
    pub fn get_id(&self, id: TensorId) -> Option<&Tensor> {
        self.map.get(&id)
    }

    /// Number of leaves with a gradient.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Sets the gradient of `leaf` (used by the compiled executor, whose gradients come from
    /// graph outputs), replacing any previous one.
    pub fn insert(&mut self, leaf: &Tensor, grad: Tensor) {
        self.map.insert(leaf.id(), grad);
    }

    /// The stored gradients (consumes the store).
    pub fn into_tensors(self) -> impl Iterator<Item = Tensor> {
        self.map.into_values()
    }

    /// Multiplies every stored gradient by `factor` (gradient clipping, loss scaling): the
    /// session's `scale` op on each (planned, gated and reported; written over the
    /// gradient's buffer when the kernel can). A failure is returned.
    /// The gradients are scaled in the order their leaves were created (by id), not the
    /// map's hash order, so that the calls of a step come in the same order on every run.
    pub fn scale(&mut self, factor: f32) -> Result<()> {
        let mut ids: Vec<TensorId> = self.map.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(g) = self.map.get_mut(&id) {
                no_grad(|| crate::runtime::apply_update(Op::Scale { factor }, g, &[]))?;
            }
        }
        Ok(())
    }

    /// Adds every gradient of `other` into this store (gradient accumulation).
    pub fn accumulate(&mut self, other: Gradients) -> Result<()> {
        for (id, g) in other.map {
            add_into(&mut self.map, id, g)?;
        }
        Ok(())
    }
}

/// Adds a cotangent into the store (equal shapes: the session's `add` op).
fn add_into(map: &mut IdMap<Tensor>, id: TensorId, g: Tensor) -> Result<()> {
    match map.remove(&id) {
        None => {
            map.insert(id, g);
        }
        Some(prev) => {
            if prev.shape() != g.shape() {
                return Err(Error::Autograd(format!(
                    "gradient shapes disagree for one tensor: {:?} vs {:?}",
                    prev.shape(),
                    g.shape()
                )));
            }
            // the session's `add` op (planned, gated, checked where the profile says so, and
            // reported), off the tape, written over `prev`'s buffer when the kernel can
            let mut sum = prev;
            no_grad(|| crate::runtime::apply_update(Op::Add, &mut sum, &[&g]))?;
            map.insert(id, sum);
        }
    }
    Ok(())
}

/// Reverse topological order of the recorded tensors reachable from `root`.
fn reverse_topological(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = IdSet::default();
    // iterative post-order DFS: (tensor, children pushed?)
    let mut stack = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        if let Some(node) = t.grad_fn() {
            let inputs = node.inputs.clone();
            stack.push((t, true));
            for i in inputs {
                if i.grad_fn().is_some() && !seen.contains(&i.id()) {
                    stack.push((i, false));
                }
            }
        }
    }
    order.reverse();
    order
}

impl Tensor {
    /// Backpropagates from this one-element tensor; returns the gradients of every leaf that
    /// requires gradients and contributed to it.
    pub fn backward(&self) -> Result<Gradients> {
        let mut grads = Gradients::default();
        self.backward_into(&mut grads)?;
        Ok(grads)
    }

    /// Backpropagates and adds the gradients into `grads` (accumulation across passes).
    pub fn backward_into(&self, grads: &mut Gradients) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward needs a one-element (scalar) output, got shape {:?}",
                self.shape()
            )));
        }
        // the seed lives where the output does (an explicit upload for a device output)
        let seed = Tensor::from_parts(vec![1.0], self.shape().to_vec()).to_device(self.device())?;
        self.backward_seeded(seed, grads)
    }

    /// The vector-Jacobian product from this (any-shaped) output: backpropagates `cotangent`
    /// (the gradient of some objective with respect to this tensor: same shape and device)
    /// and returns the gradients of the leaves. `t.backward_with(&g)` gives what
    /// `t.mul(&g)?.sum_all()?.backward()` gives, without the product and the sum.
    pub fn backward_with(&self, cotangent: &Tensor) -> Result<Gradients> {
        if cotangent.shape() != self.shape() || cotangent.device() != self.device() {
            return Err(Error::Autograd(format!(
                "backward_with: a cotangent of shape {:?} on {} for an output of shape {:?} on {}",
                cotangent.shape(),
                cotangent.device(),
                self.shape(),
                self.device()
            )));
        }
        let mut grads = Gradients::default();
        self.backward_seeded(cotangent.detach(), &mut grads)?;
        Ok(grads)
    }

    fn backward_seeded(&self, seed: Tensor, grads: &mut Gradients) -> Result<()> {
        if !self.is_tracked() {
            return Err(Error::Autograd(
                "backward from a tensor that does not require gradients (nothing was recorded)"
                    .into(),
            ));
        }
        let mut pending: IdMap<Tensor> = IdMap::default();
        pending.insert(self.id(), seed.clone());
        let mut pieces = super::slice_pieces::Pending::default();
        let mut leaves = Gradients::default();
        if self.requires_grad_flag() {
            leaves.map.insert(self.id(), seed.clone());
        }
        for t in reverse_topological(self) {
            let Some(node) = t.grad_fn() else { continue };
            // the cotangents of slices of `t` along one axis, placed by one concat
            if let Some(placed) = pieces.take(&t)? {
                add_into(&mut pending, t.id(), placed)?;
            }
            let Some(g) = pending.remove(&t.id()) else {
                continue;
            };
            let input = node.inputs.first();
            if let (Op::Slice { axis, start, end }, Some(x), 1) =
                (&node.op, input, node.inputs.len())
            {
                if x.is_tracked()
                    && !x.requires_grad_flag()
                    && pieces.hold(x, *axis, *start, *end, &g)
                {
                    continue;
                }
            }
            let inputs: Vec<&Tensor> = node.inputs.iter().collect();
            let needs: Vec<bool> = node.inputs.iter().map(|t| t.is_tracked()).collect();
            let input_grads =
                super::guarded::run_vjp(&node.kernel, &node.op, &inputs, &node.output, &g, &needs)?;
            for (input, gi) in node.inputs.iter().zip(input_grads) {
                let Some(gi) = gi else { continue };
                if !input.is_tracked() {
                    continue;
                }
                if gi.shape() != input.shape() {
                    return Err(Error::Autograd(format!(
                        "VJP of `{}` (capsule `{}`) returned a gradient of shape {:?} for an input of shape {:?}",
                        node.op.name(), node.capsule(), gi.shape(), input.shape()
                    )));
                }
                if input.requires_grad_flag() {
                    add_into(&mut leaves.map, input.id(), gi)?;
                } else {
                    add_into(&mut pending, input.id(), gi)?;
                }
            }
        }
        grads.accumulate(leaves)
    }
}
