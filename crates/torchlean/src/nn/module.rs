//! The module abstraction: a forward function plus named parameters, named non-trainable
//! buffers (e.g. running statistics), a train/eval switch and a per-step RNG key. The ops a
//! module runs are not listed by hand: [`trace_ops`] finds them from the model itself with a
//! shape-only trace, so a session can plan them before anything runs.
//!
//! A container lists its children ([`Module::children`] / [`Module::children_mut`]); every
//! other method then has a default that visits the children and prefixes their names
//! (`layers.0.weight`). A leaf overrides `parameters` / `parameters_mut` (and, when it has
//! them, buffers, the training switch or the RNG key).

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A model component with named, trainable parameters.
pub trait Module {
    /// The forward function.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Named child modules (containers); leaves have none.
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }
    /// The same children, mutable, in the same order.
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        Vec::new()
    }

    /// Parameters with stable dotted names, in a fixed order (default: the children's).
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        for (prefix, child) in self.children() {
            out.extend(
                child
                    .parameters()
                    .into_iter()
                    .map(|(n, t)| (format!("{prefix}.{n}"), t)),
            );
        }
        out
    }
    /// The same parameters, mutable, in the same order.
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut out = Vec::new();
        for (prefix, child) in self.children_mut() {
            out.extend(
                child
                    .parameters_mut()
                    .into_iter()
                    .map(|(n, t)| (format!("{prefix}.{n}"), t)),
            );
        }
        out
    }
    /// Visits the parameters in [`Module::parameters`] order without building their names
    /// (the per-step path of optimizers and the compiled step). Containers and layers on hot
    /// paths override it; the default lists the named parameters.
    fn visit_parameters(&self, f: &mut dyn FnMut(&Tensor)) {
        for (_, t) in self.parameters() {
            f(t);
        }
    }
    /// The same parameters, mutable, in the same order.
    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&mut Tensor)) {
        for (_, t) in self.parameters_mut() {
            f(t);
        }
    }
    /// Moves every parameter to `device` (an explicit copy through the device's module;
    /// ids and `requires_grad` kept, so optimizer state stays attached). Layers with
    /// non-parameter state (batch norm's running statistics) keep it where it was; their ops
    /// then refuse the mixed devices with an error naming both.
    fn to_device(&mut self, device: crate::backend::Device) -> Result<()> {
        let mut result = Ok(());
        self.visit_parameters_mut(&mut |p| {
            if result.is_ok() && p.device() != device {
                result = p.to_device(device).and_then(|moved| p.assign_moved(moved));
            }
        });
        result
    }
    /// The device of the first parameter (the CPU for a model without parameters).
    fn device(&self) -> crate::backend::Device {
        let mut device = None;
        self.visit_parameters(&mut |p| {
            device.get_or_insert(p.device());
        });
        device.unwrap_or(crate::backend::Device::Cpu)
    }
    /// Total number of scalar parameters.
    fn parameter_count(&self) -> usize {
        self.parameters().iter().map(|(_, t)| t.numel()).sum()
    }

    /// Switches training mode (dropout active, batch statistics) on or off (evaluation).
    fn set_training(&mut self, training: bool) {
        for (_, child) in self.children_mut() {
            child.set_training(training);
        }
    }
    /// Sets the key that random layers (dropout) combine with their own seed, so that the
    /// randomness of a training step depends only on (seed, step).
    fn reseed(&mut self, key: u64) {
        for (_, child) in self.children_mut() {
            child.reseed(key);
        }
    }

    /// Non-trainable state saved in checkpoints (snapshots), with stable dotted names.
    fn buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (prefix, child) in self.children() {
            out.extend(
                child
                    .buffers()
                    .into_iter()
                    .map(|(n, t)| (format!("{prefix}.{n}"), t)),
            );
        }
        out
    }
    /// Replaces the buffer `name` (as listed by [`Module::buffers`]) by `value`.
    fn set_buffer(&mut self, name: &str, value: &Tensor) -> Result<()> {
        for (prefix, child) in self.children_mut() {
            if let Some(rest) = name
                .strip_prefix(prefix.as_str())
                .and_then(|r| r.strip_prefix('.'))
            {
                return child.set_buffer(rest, value);
            }
        }
        Err(unknown_buffer(name))
    }
}

/// The op uses of `f` run on `model` in a shape-only trace ([`crate::runtime::trace`]): the
/// (op, VJP mode) pairs a session must plan and gate before the model's first kernel, found
/// from the model itself (no kernel runs). The model's buffers are restored afterwards, since
/// a trace feeds placeholder values to whatever it updates (running statistics).
pub fn trace_ops<M: Module + ?Sized>(
    model: &mut M,
    f: impl FnOnce(&M) -> Result<()>,
) -> Result<crate::runtime::OpUses> {
    let buffers = model.buffers();
    let uses = crate::runtime::trace(|| f(model));
    for (name, value) in &buffers {
        model.set_buffer(name, value)?;
    }
    uses
}

/// The error for a buffer name no module owns.
pub(crate) fn unknown_buffer(name: &str) -> Error {
    Error::Other(format!("module has no buffer named `{name}`"))
}

/// A boxed module is a module (so containers and trainers can hold `Box<dyn Module>`).
impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        (**self).children()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        (**self).children_mut()
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        (**self).parameters()
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        (**self).parameters_mut()
    }
    fn visit_parameters(&self, f: &mut dyn FnMut(&Tensor)) {
        (**self).visit_parameters(f)
    }
    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&mut Tensor)) {
        (**self).visit_parameters_mut(f)
    }
    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }
    fn reseed(&mut self, key: u64) {
        (**self).reseed(key)
    }
    fn buffers(&self) -> Vec<(String, Tensor)> {
        (**self).buffers()
    }
    fn set_buffer(&mut self, name: &str, value: &Tensor) -> Result<()> {
        (**self).set_buffer(name, value)
    }
}
