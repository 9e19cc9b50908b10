//! One training step, kept behind a small trait ([`StepExecutor`]) so the trainer's execution
//! backend can be swapped: the eager step (forward, loss, tape backward, optional clipping,
//! optimizer update) and the compiled step (the same forward and loss captured once per input
//! shape, backward derived from the VJP rules, planned and gated once, replayed every step).

use super::clip::clip_grad_norm;
use super::config::ExecutionBackend;
use super::error::Result;
use super::error::TrainError;
use super::loss::Task;
use super::module::Module;
use super::optim::Optimizer;
use crate::backend::BackendProfile;
use crate::tensor::Tensor;

/// What a step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutput {
    pub loss: f32,
    /// The global gradient norm before clipping, when clipping is on.
    pub grad_norm: Option<f32>,
}

/// Executes one training step on a batch.
pub trait StepExecutor {
    /// The backend's name, for messages.
    fn name(&self) -> &'static str;
    /// Forward, loss, backward, update. A non-finite loss or gradient norm stops the step
    /// before the parameters change (error naming `step`, the 1-based step number).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        task: &Task,
        inputs: &Tensor,
        targets: &Tensor,
        clip: Option<f32>,
        step: u64,
    ) -> Result<StepOutput>;
    /// The report of the plan this executor built itself (the compiled step's graph plan,
    /// once built); `None` when it plans through the installed session (eager).
    fn plan_report(&self) -> Option<crate::backend::BackendReport> {
        None
    }
}

/// The eager (tape) step.
#[derive(Debug, Default, Clone, Copy)]
pub struct EagerStep;

impl StepExecutor for EagerStep {
    fn name(&self) -> &'static str {
        "eager"
    }
    fn run(
        &mut self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        task: &Task,
        inputs: &Tensor,
        targets: &Tensor,
        clip: Option<f32>,
        step: u64,
    ) -> Result<StepOutput> {
        // the CPU kernels' parallel splits find the pool's other workers awake
        crate::runtime::hot_workers::with_hot_workers_on(model.device(), || {
            let loss = task.loss(&model.forward(inputs)?, targets)?;
            let grads = loss.backward()?;
            let (value, grads_finite) = loss_and_finite(&*model, &loss, &grads)?;
            check_loss(value, step)?;
            drop(loss);
            finish(model, optimizer, grads, (value, grads_finite), clip, step)
        })
    }
}

/// A non-finite loss stops the step before the parameters change.
pub(crate) fn check_loss(value: f32, step: u64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(TrainError::NonFiniteLoss {
            step,
            loss: value,
            last_checkpoint: None,
        }
        .into())
    }
}

fn non_finite_gradient(step: u64, tensor: String, value: f32) -> super::error::Error {
    TrainError::NonFiniteGradient {
        step,
        tensor,
        value,
        last_checkpoint: None,
    }
    .into()
}

/// Shared tail of a step: check the gradients, clip, update.
fn finish(
    model: &mut dyn Module,
    optimizer: &mut dyn Optimizer,
    grads: crate::runtime::Gradients,
    loss: (f32, bool),
    clip: Option<f32>,
    step: u64,
) -> Result<StepOutput> {
    finish_keep(model, optimizer, grads, loss, clip, step).map(|(out, _)| out)
}

/// The loss value, and whether every gradient element is known to be finite, from one read.
/// On a device: `loss + Σ sum_all(g · 0)`, computed there with ops of the session (planned and
/// gated), is the loss exactly when every gradient element is finite (it adds zeros) and NaN
/// otherwise, so a step reads one value; only when that value is not finite is the loss read
/// apart, to tell a non-finite loss from a non-finite gradient. On the host: the loss, and
/// `false` (the gradients are scanned where they are).
fn loss_and_finite(
    model: &dyn Module,
    loss: &Tensor,
    grads: &crate::runtime::Gradients,
) -> Result<(f32, bool)> {
    if model.device() == crate::backend::Device::Cpu {
        return Ok((loss.item()?, false));
    }
    let probe = crate::runtime::no_grad(|| -> Result<Tensor> {
        let mut total = loss.detach();
        for (_, p) in model.parameters() {
            if let Some(g) = grads.get(p) {
                total = total.add(&g.scale(0.0)?.sum_all()?)?;
            }
        }
        Ok(total)
    })?;
    let value = probe.item()?;
    if value.is_finite() {
        return Ok((value, true));
    }
    // the loss or a gradient is not finite: the loss itself says which
    Ok((loss.item()?, false))
}

/// [`finish`], handing the gradients back (the compiled step recycles their buffers).
fn finish_keep(
    model: &mut dyn Module,
    optimizer: &mut dyn Optimizer,
    mut grads: crate::runtime::Gradients,
    (value, grads_finite): (f32, bool),
    clip: Option<f32>,
    step: u64,
) -> Result<(StepOutput, crate::runtime::Gradients)> {
    // every step, clipping or not: a NaN that relu hid from the loss still reaches a
    // gradient, and an update with it would poison the parameters. On a device the check
    // came with the loss's read (`loss_and_finite`); the gradients are scanned on the host
    // only there, or when that read found something not finite (to name the tensor).
    for (name, p) in model.parameters().into_iter().filter(|_| !grads_finite) {
        if let Some(g) = grads.get(p) {
            if let Some(&value) = g.data().iter().find(|v| !v.is_finite()) {
                return Err(non_finite_gradient(
                    step,
                    format!("gradient of `{name}`"),
                    value,
                ));
            }
        }
    }
    let grad_norm = match clip {
        Some(max) => {
            let norm = clip_grad_norm(&*model, &mut grads, max)?;
            if !norm.is_finite() {
                return Err(non_finite_gradient(
                    step,
                    "global gradient norm".into(),
                    norm,
                ));
            }
            Some(norm)
        }
        None => None,
    };
    optimizer.step(model, &grads)?;
    Ok((
        StepOutput {
            loss: value,
            grad_norm,
        },
        grads,
    ))
}

/// The compiled step: captures the model's forward and the task's loss on the first batch
/// (again whenever the batch shape changes), derives the backward graph, plans and gates it
/// once under the profile, then runs only the accepted graph plan. Models whose forward has
/// side effects outside the graph are refused: seeded random ops (dropout draws a new mask
/// each step in eager mode, a captured graph would freeze one) and buffers updated during
/// training (BatchNorm's running statistics).
pub struct CompiledStepExecutor {
    profile: BackendProfile,
    graph: Option<(
        Vec<usize>,
        Vec<usize>,
        crate::runtime::compiled::CompiledStep,
    )>,
}

impl CompiledStepExecutor {
    pub fn new(profile: &BackendProfile) -> Self {
        CompiledStepExecutor {
            profile: profile.clone(),
            graph: None,
        }
    }

    /// The report of the compiled plan, once built (its executor line says whether the step
    /// is replayed as a device graph).
    pub fn report(&self) -> Option<crate::backend::BackendReport> {
        self.graph.as_ref().map(|(_, _, s)| s.report())
    }
}

impl StepExecutor for CompiledStepExecutor {
    fn name(&self) -> &'static str {
        "compiled"
    }
    fn plan_report(&self) -> Option<crate::backend::BackendReport> {
        self.report()
    }
    fn run(
        &mut self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        task: &Task,
        inputs: &Tensor,
        targets: &Tensor,
        clip: Option<f32>,
        step: u64,
    ) -> Result<StepOutput> {
        use crate::runtime::compiled::CompiledStep;
        let named = [
            ("inputs".to_string(), inputs.clone()),
            ("targets".to_string(), targets.clone()),
        ];
        let fresh =
            !matches!(&self.graph, Some((a, b, _)) if a == inputs.shape() && b == targets.shape());
        if fresh {
            if !model.buffers().is_empty() {
                return Err(TrainError::Config("compiled mode: this model updates buffers (e.g. BatchNorm running statistics) outside the graph; train it in eager mode".into()).into());
            }
            // a model that draws random numbers is refused from a shape-only trace, before
            // the capture runs its kernels (a check of the captured graph ran them first)
            let uses = super::module::trace_ops(model, |m| {
                task.loss(&m.forward(inputs)?, targets).map(drop)
            })?;
            if uses.uses().iter().any(|(k, _)| k.is_random()) {
                return Err(TrainError::Config("compiled mode: the model draws random numbers (e.g. dropout) each step; a captured graph would reuse one draw, so train it in eager mode".into()).into());
            }
            let params: Vec<(String, Tensor)> = model
                .parameters()
                .into_iter()
                .map(|(n, t)| (n, t.clone()))
                .collect();
            let m: &dyn Module = model;
            let mut built = CompiledStep::build(
                &named,
                &params,
                |xs| task.loss(&m.forward(&xs[0])?, &xs[1]),
                &self.profile,
            )?;
            // `run` below hands the loss and the gradients back before the next step
            built.replay_as_device_graph();
            self.graph = Some((inputs.shape().to_vec(), targets.shape().to_vec(), built));
        }
        let Some((_, _, compiled)) = &self.graph else {
            unreachable!("the compiled step was built just above")
        };
        let (loss, grads) = compiled.run_visiting(&named, |f| model.visit_parameters(f))?;
        let (value, grads_finite) = loss_and_finite(&*model, &loss, &grads)?;
        check_loss(value, step)?;
        let grads = finish_keep(model, optimizer, grads, (value, grads_finite), clip, step)?;
        // the step's buffers come back for the next run
        compiled
            .compiled()
            .give_back(grads.1.into_tensors().chain([loss]));
        Ok(grads.0)
    }
}

/// The step executor of a backend under `profile` (the profile is what a compiled executor
/// plans its captured graph with; the eager executor plans through the installed session).
pub fn executor_for(
    backend: ExecutionBackend,
    profile: &BackendProfile,
) -> Result<Box<dyn StepExecutor>> {
    match backend {
        ExecutionBackend::Eager => Ok(Box::new(EagerStep)),
        ExecutionBackend::Compiled => Ok(Box::new(CompiledStepExecutor::new(profile))),
    }
}
