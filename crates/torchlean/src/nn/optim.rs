//! The optimizer abstraction and the machinery every optimizer shares: per-parameter state
//! tensors keyed by parameter name, and their export/import as named tensors (for
//! checkpoints).
//!
//! Updates are ops of the session on every device (`ema_update`, `adam_update`, and the
//! elementwise ops), so every kernel of a training step — the update included — is planned,
//! admitted by the gate, checked where the profile's evidence says so, and listed in the
//! report. `runtime::apply_update` writes an update over its state's buffer when the kernel
//! can (the parameter, a moment), so a step allocates no new parameter or state buffers. The
//! concrete optimizers live in `sgd.rs`, `adam.rs`, `rmsprop.rs` and `adagrad.rs`.

use super::module::Module;
use crate::error::{Error, Result};
use crate::runtime::Gradients;
use crate::tensor::{Tensor, TensorId};
use std::collections::BTreeMap;

/// Updates a module's parameters from their gradients.
pub trait Optimizer {
    /// One update step. Parameters without a gradient are left unchanged.
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()>;
    /// The current learning rate.
    fn learning_rate(&self) -> f32;
    fn set_learning_rate(&mut self, lr: f32);
    /// A short stable name (`sgd`, `adam`, …) used in checkpoint tensor names.
    fn kind(&self) -> &'static str {
        "custom"
    }
    /// The op kinds [`Optimizer::step`] runs through the session for a model on `device`
    /// (with the thread's session installed: a choice between ops may depend on its plan), so
    /// that a trainer plans and gates them before the first kernel of the first step.
    /// Required (no default): an optimizer of one's own says what it runs, or — returning an
    /// empty list — accepts that its ops are planned only when its first step runs them,
    /// after that step's forward and backward kernels.
    fn update_ops(&self, device: crate::backend::Device) -> Vec<crate::graph::OpKind>;
    /// Checks the settings (public fields may hold anything) as [`Optimizer::step`] checks
    /// them, so that a run refuses them before its first kernel rather than at its first
    /// update, after that step's forward and backward kernels ([`crate::nn::Trainer`] calls
    /// it before planning). Default: nothing to check.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
    /// The optimizer and its settings in words, as a run prints them (`adam: lr 0.001,
    /// betas (0.9, 0.999), …`). Default: the kind and the learning rate.
    fn describe(&self) -> String {
        format!(
            "{}: lr {}",
            self.kind(),
            readable_number(self.learning_rate())
        )
    }
    /// The optimizer's state as named tensors `optim.<kind>.<slot>.<parameter>` plus the
    /// step count (and, for optimizers that count each parameter's steps, those counts).
    fn export_state(&self) -> OptimizerState {
        OptimizerState {
            kind: self.kind().to_string(),
            step: 0,
            tensors: Vec::new(),
            param_steps: BTreeMap::new(),
        }
    }
    /// Replaces the state by `state` after validating its kind, names and shapes against
    /// `model`; on error nothing changes.
    fn import_state(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<()> {
        let _ = model;
        if state.tensors.is_empty() && state.kind == self.kind() {
            Ok(())
        } else {
            Err(Error::Other(format!(
                "optimizer `{}` cannot import state of kind `{}`",
                self.kind(),
                state.kind
            )))
        }
    }
}

/// An optimizer's exportable state.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    pub kind: String,
    /// Number of steps taken.
    pub step: u64,
    /// Named buffers, `optim.<kind>.<slot>.<parameter name>`.
    pub tensors: Vec<(String, Tensor)>,
    /// Per parameter, the steps in which it had a gradient (as `state[p]['step']` in
    /// `torch.optim`): Adam's bias corrections and Adagrad's decayed rate count a parameter's
    /// own steps, not the optimizer's. Empty for optimizers that keep no count; a parameter
    /// with slots but no entry (a checkpoint written before the counts were kept) counts
    /// `step`.
    pub param_steps: BTreeMap<String, u64>,
}

/// A setting as a run prints it: as Rust prints it (the shortest digits that read back as
/// the same f32), in exponent form where that would be a long run of zeros (`1e30`, not a
/// 31-digit integer; `1e-8`, not `0.00000001`), as Python prints floats.
pub fn readable_number(v: f32) -> String {
    let a = v.abs();
    if a != 0.0 && a.is_finite() && !(1e-4..1e16).contains(&a) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

pub(crate) fn check_lr(lr: f32) -> Result<()> {
    // 0 is a rate (nothing moves), as torch.optim's, which refuses only a negative one;
    // infinities and NaN would make every parameter NaN at the first step
    if lr.is_finite() && lr >= 0.0 {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "learning rate must be finite and >= 0, got {lr}"
        )))
    }
}

/// At a step: the rate (set by `set_learning_rate` or a schedule) must be finite — an
/// infinite or NaN rate would make every updated parameter non-finite. Any sign is taken, as
/// torch.optim takes a rate changed in its param groups.
pub(crate) fn check_finite_lr(lr: f32) -> Result<()> {
    if lr.is_finite() {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "learning rate must be finite at a step, got {lr}"
        )))
    }
}

/// Checks that a hyperparameter lies in `[lo, hi)` (or `[lo, hi]` when `closed`).
pub(crate) fn check_range<T>(what: &str, v: T, lo: T, hi: T, closed: bool) -> Result<()>
where
    T: Copy + PartialOrd + Into<f64> + std::fmt::Display,
{
    let ok = v.into().is_finite() && v >= lo && (v < hi || (closed && v == hi));
    if ok {
        Ok(())
    } else {
        let close = if closed { ']' } else { ')' };
        Err(Error::Other(format!(
            "{what} must be in [{lo}, {hi}{close}, got {v}"
        )))
    }
}

/// The dotted names of a model's parameters, resolved once and reused while the model's
/// parameters are the same tensors (by identity; an in-place update keeps it). Building the
/// names costs a string per parameter and per container level, which is a visible share of
/// a small model's step.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParamNames {
    ids: Vec<TensorId>,
    names: Vec<String>,
    scratch: Vec<TensorId>,
}

impl ParamNames {
    /// The names of `model`'s parameters, in visiting order.
    pub(crate) fn resolve(&mut self, model: &dyn Module) -> &[String] {
        let scratch = &mut self.scratch;
        scratch.clear();
        model.visit_parameters(&mut |t| scratch.push(t.id()));
        if self.scratch != self.ids {
            self.names = model.parameters().into_iter().map(|(n, _)| n).collect();
            std::mem::swap(&mut self.ids, &mut self.scratch);
        }
        &self.names
    }
}

/// Calls `f(name, parameter)` for every parameter of `model` in order (`names` from
/// [`ParamNames::resolve`] on the same model); stops at the first error.
pub(crate) fn for_each_param(
    names: &[String],
    model: &mut dyn Module,
    mut f: impl FnMut(&str, &mut Tensor) -> Result<()>,
) -> Result<()> {
    let (mut i, mut result) = (0, Ok(()));
    model.visit_parameters_mut(&mut |p| {
        if result.is_ok() {
            result = match names.get(i) {
                Some(name) => f(name, p),
                None => Err(Error::Other(
                    "optimizer: the model's parameters changed during the step".into(),
                )),
            };
        }
        i += 1;
    });
    result
}

/// Replaces `p`'s values by `update(p)`, computed by ops of the session with the tape off
/// (an update that reads the weight in several ops: RMSprop, Adagrad).
pub(crate) fn update_by_ops(
    p: &mut Tensor,
    update: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let w = p.detach();
    let new = crate::runtime::no_grad(|| update(&w))?;
    p.assign(new)
}

/// The state buffers of one parameter.
#[derive(Debug, Clone)]
struct ParamSlots {
    shape: Vec<usize>,
    bufs: Vec<Vec<f32>>,
}

/// Per-parameter state ("slots"), keyed by parameter name: imported state as host buffers
/// until the parameter's next update, live state as tensors on the parameter's device, which
/// The slots that accumulate squares (never negative): checked when state is imported.
const NON_NEGATIVE_SLOTS: [&str; 3] = ["exp_avg_sq", "square_avg", "sum"];

/// the update ops read and write.
#[derive(Debug, Clone)]
pub(crate) struct SlotStore {
    kind: &'static str,
    /// Slot names and their initial values.
    slots: Vec<(&'static str, f32)>,
    imported: BTreeMap<String, ParamSlots>,
    live: BTreeMap<String, Vec<Tensor>>,
    /// Per parameter, the steps in which it was updated.
    steps: BTreeMap<String, u64>,
    /// Whether the optimizer counts each parameter's steps ([`SlotStore::counting`]: Adam's
    /// and Adagrad's formulas use them). A store that does not keeps no counts, written or
    /// read: SGD and RMSprop resumed from a checkpoint wrote every parameter's count as the
    /// loaded step, forever (a resumed run's file differed from a straight run's, and stated a
    /// count that was false; an audit of the thirty-seventh session).
    counts_steps: bool,
}

impl SlotStore {
    pub(crate) fn new(kind: &'static str, slots: Vec<(&'static str, f32)>) -> SlotStore {
        SlotStore {
            kind,
            slots,
            imported: BTreeMap::new(),
            live: BTreeMap::new(),
            steps: BTreeMap::new(),
            counts_steps: false,
        }
    }

    /// [`SlotStore::new`] for an optimizer whose update uses each parameter's own step count
    /// ([`SlotStore::next_step`], [`SlotStore::commit_step`]).
    pub(crate) fn counting(kind: &'static str, slots: Vec<(&'static str, f32)>) -> SlotStore {
        SlotStore {
            counts_steps: true,
            ..SlotStore::new(kind, slots)
        }
    }

    /// The step number the next update of parameter `name` takes (1 for its first) —
    /// PyTorch's per-parameter `step`, so that a parameter without a gradient in early steps
    /// (frozen, or unused by some batches) gets the bias correction of its own first step,
    /// not of the optimizer's. Counted by [`SlotStore::commit_step`] once the update ran.
    pub(crate) fn next_step(&self, name: &str) -> u64 {
        self.steps.get(name).copied().unwrap_or(0).saturating_add(1)
    }

    /// Records that parameter `name` took step `t` (from [`SlotStore::next_step`]): an update
    /// that failed is not counted.
    pub(crate) fn commit_step(&mut self, name: &str, t: u64) {
        self.steps.insert(name.to_string(), t);
    }

    /// Redefines the slot list (when hyperparameters change which buffers exist); existing
    /// state is dropped if the list changes.
    pub(crate) fn set_slots(&mut self, slots: Vec<(&'static str, f32)>) {
        if slots != self.slots {
            self.slots = slots;
            self.imported.clear();
            self.live.clear();
            self.steps.clear();
        }
    }

    /// The slots of parameter `p` named `name`, on `p`'s device: created from the imported
    /// state when a checkpoint's state was imported, else at their initial values.
    pub(crate) fn slots(&mut self, name: &str, p: &Tensor) -> Result<&mut [Tensor]> {
        let bufs = match self.live.entry(name.to_string()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let shape = p.shape().to_vec();
                let host = self.imported.remove(name);
                let mut bufs = Vec::with_capacity(self.slots.len());
                for (k, &(_, init)) in self.slots.iter().enumerate() {
                    let values = match &host {
                        Some(h) if h.shape == shape => h.bufs[k].clone(),
                        _ => vec![init; p.numel()],
                    };
                    bufs.push(Tensor::from_vec(values, &shape)?.to_device(p.device())?);
                }
                e.insert(bufs)
            }
        };
        if bufs.first().is_some_and(|b| b.shape() != p.shape()) {
            return Err(Error::Other(format!(
                "optimizer `{}`: parameter `{name}` changed shape to {:?}",
                self.kind,
                p.shape()
            )));
        }
        Ok(bufs)
    }

    /// The live slots of parameter `name`, if it has any (see [`SlotStore::slots`]).
    pub(crate) fn slots_of(&mut self, name: &str) -> Option<&mut [Tensor]> {
        self.live.get_mut(name).map(|b| b.as_mut_slice())
    }

    /// The state as named tensors (device slots read to the host: see `Tensor::to_vec`).
    pub(crate) fn export(&self, step: u64) -> OptimizerState {
        let mut tensors = Vec::new();
        for (pname, bufs) in &self.live {
            for ((slot, _), buf) in self.slots.iter().zip(bufs) {
                if let Ok(t) = Tensor::from_vec(buf.to_vec(), buf.shape()) {
                    tensors.push((format!("optim.{}.{slot}.{pname}", self.kind), t));
                }
            }
        }
        for (pname, p) in &self.imported {
            for ((slot, _), buf) in self.slots.iter().zip(&p.bufs) {
                // the buffer was created with the element count of `shape`
                if let Ok(t) = Tensor::from_vec(buf.clone(), &p.shape) {
                    tensors.push((format!("optim.{}.{slot}.{pname}", self.kind), t));
                }
            }
        }
        OptimizerState {
            kind: self.kind.to_string(),
            step,
            tensors,
            param_steps: self.steps.clone(),
        }
    }

    /// Validates `state` against the slot list and `model`'s parameters, then replaces the
    /// buffers; returns the step count. On error nothing changes.
    pub(crate) fn import(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<u64> {
        let err =
            |reason: String| Error::Other(format!("optimizer `{}` state: {reason}", self.kind));
        if state.kind != self.kind {
            return Err(err(format!("has kind `{}`", state.kind)));
        }
        let shapes: BTreeMap<String, Vec<usize>> = model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect();
        let prefix = format!("optim.{}.", self.kind);
        let mut found: BTreeMap<String, Vec<Option<Vec<f32>>>> = BTreeMap::new();
        for (name, t) in &state.tensors {
            let rest = name
                .strip_prefix(&prefix)
                .ok_or_else(|| err(format!("tensor `{name}` does not start with `{prefix}`")))?;
            let (k, pname) = self
                .slots
                .iter()
                .enumerate()
                .find_map(|(k, (slot, _))| {
                    rest.strip_prefix(slot)
                        .and_then(|r| r.strip_prefix('.'))
                        .map(|p| (k, p))
                })
                .ok_or_else(|| {
                    let known: Vec<&str> = self.slots.iter().map(|s| s.0).collect();
                    if known.is_empty() {
                        return err(format!(
                            "tensor `{name}` is state this {} optimizer does not keep (configured as it is, it keeps none: e.g. SGD without momentum); configure it as the run that saved the file was (the same --momentum)",
                            self.kind
                        ));
                    }
                    err(format!(
                        "tensor `{name}` names no known slot (known: {known:?})"
                    ))
                })?;
            let shape = shapes.get(pname).ok_or_else(|| {
                err(format!(
                    "tensor `{name}` is for unknown parameter `{pname}`"
                ))
            })?;
            if t.shape() != shape.as_slice() {
                return Err(err(format!(
                    "tensor `{name}` has shape {:?}, parameter `{pname}` has {shape:?}",
                    t.shape()
                )));
            }
            // sums of squares (Adam's second moment, RMSprop's and Adagrad's accumulators) are
            // never negative: a negative one is a corrupted file, whose square root would be
            // NaN at the next update (it was accepted, and the run failed steps later with the
            // file named as the "last good checkpoint")
            if NON_NEGATIVE_SLOTS.contains(&self.slots[k].0) {
                if let Some((i, v)) = t.to_vec().into_iter().enumerate().find(|(_, v)| *v < 0.0) {
                    return Err(err(format!(
                        "tensor `{name}` holds {v} at element {i}; a sum of squares is never negative"
                    )));
                }
            }
            let entry = found
                .entry(pname.to_string())
                .or_insert_with(|| vec![None; self.slots.len()]);
            if entry[k].replace(t.to_vec()).is_some() {
                return Err(err(format!("tensor `{name}` appears twice")));
            }
        }
        let mut steps = BTreeMap::new();
        for (pname, &t) in &state.param_steps {
            if !shapes.contains_key(pname) {
                return Err(err(format!(
                    "a step count is kept for unknown parameter `{pname}`"
                )));
            }
            // a count and the slots are made by the same update: a count without slots (or
            // slots with a count of 0, below) would apply one step's bias correction to
            // another step's moments
            if !found.contains_key(pname) {
                return Err(err(format!(
                    "parameter `{pname}` has a step count ({t}) but no slots"
                )));
            }
            if t == 0 {
                return Err(err(format!(
                    "parameter `{pname}` has slots and a step count of 0"
                )));
            }
            if t > state.step {
                return Err(err(format!(
                    "parameter `{pname}` took {t} steps, more than the optimizer's {}",
                    state.step
                )));
            }
            steps.insert(pname.clone(), t);
        }
        let mut params = BTreeMap::new();
        for (pname, bufs) in found {
            let bufs: Option<Vec<Vec<f32>>> = bufs.into_iter().collect();
            let bufs = bufs
                .ok_or_else(|| err(format!("parameter `{pname}` is missing some of its slots")))?;
            let shape = shapes.get(&pname).cloned().unwrap_or_default();
            // state written before the counts were kept: every updated parameter took every step
            if self.counts_steps {
                steps.entry(pname.clone()).or_insert(state.step);
            }
            params.insert(pname, ParamSlots { shape, bufs });
        }
        self.imported = params;
        // counts in a file of an optimizer that keeps none (written by a resumed run before
        // the thirty-seventh session) were validated above and are dropped
        self.steps = if self.counts_steps {
            steps
        } else {
            BTreeMap::new()
        };
        // live slots are rebuilt from the imported buffers on their next use
        self.live.clear();
        Ok(state.step)
    }
}

/// The gradient of a parameter, checked against its element count.
pub(crate) fn grad_of<'g>(
    name: &str,
    p: &Tensor,
    grads: &'g Gradients,
) -> Result<Option<&'g Tensor>> {
    let Some(g) = grads.get(p) else {
        return Ok(None);
    };
    if g.numel() != p.numel() {
        return Err(Error::Other(format!(
            "gradient of `{name}` has {} elements, the parameter {}",
            g.numel(),
            p.numel()
        )));
    }
    Ok(Some(g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Activation, Mlp};

    #[test]
    fn parameter_names_follow_the_model_they_are_resolved_for() {
        let small = Mlp::new(&[2, 3, 1], Activation::Tanh, 0).unwrap();
        let large = Mlp::new(&[2, 3, 3, 1], Activation::Tanh, 0).unwrap();
        let want =
            |m: &Mlp| -> Vec<String> { m.parameters().into_iter().map(|(n, _)| n).collect() };
        let mut names = ParamNames::default();
        assert_eq!(names.resolve(&small), want(&small).as_slice());
        assert_eq!(names.resolve(&large), want(&large).as_slice());
        assert_eq!(names.resolve(&small), want(&small).as_slice());
        // an in-place update keeps the identities, so the cached names stay valid
        let mut m = Mlp::new(&[2, 3, 1], Activation::Tanh, 1).unwrap();
        names.resolve(&m);
        let ids = names.ids.clone();
        m.visit_parameters_mut(&mut |p| p.update_data(|w| w.iter_mut().for_each(|v| *v += 1.0)));
        names.resolve(&m);
        assert_eq!(names.ids, ids);
    }
}
