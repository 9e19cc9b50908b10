//! A minimal training loop for the quickstart regression MLP (kept for the quickstart command;
//! the general trainer is [`super::Trainer`]).

use super::error::Result;
use super::module::Module;
use super::optim::Optimizer;
use super::tasks::SyntheticRegression;
use crate::backend::{BackendProfile, BackendReport, ExecutionMode};
use crate::runtime::compiled::CompiledStep;
use crate::tensor::Tensor;

/// One logged step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLog {
    pub step: usize,
    pub loss: f32,
}

/// Trains `model` on `data` with MSE for `steps` steps; calls `log` every `log_every` steps
/// (and on the first and last). Returns the loss of every step.
pub fn train_regression(
    model: &mut dyn Module,
    optimizer: &mut dyn Optimizer,
    data: &SyntheticRegression,
    steps: usize,
    batch_size: usize,
    log_every: usize,
    mut log: impl FnMut(StepLog),
) -> Result<Vec<f32>> {
    // grown as the steps run: reserving `steps` up front let `--steps 4294967296` abort the
    // process on a 16 GiB allocation before the first step (found by the flags fuzzer)
    let mut losses = Vec::with_capacity(steps.min(1 << 16));
    // batches are made on the host and moved to the model's device explicitly
    let device = model.device();
    for step in 0..steps {
        let (x, y) = data.batch(step, batch_size)?;
        let (x, y) = (x.to_device(device)?, y.to_device(device)?);
        let loss = model.forward(&x)?.mse_loss(&y)?;
        let grads = loss.backward()?;
        let value = loss.item()?;
        drop(loss);
        // a non-finite loss stops training, before an update with it (as every trainer)
        super::step::check_loss(value, step as u64 + 1)?;
        optimizer.step(model, &grads)?;
        losses.push(value);
        if step == 0 || step + 1 == steps || (log_every > 0 && (step + 1) % log_every == 0) {
            log(StepLog {
                step: step + 1,
                loss: value,
            });
        }
    }
    Ok(losses)
}

/// A loss built from a model and named inputs (in the order they were given).
pub type LossFn<'a> = &'a dyn Fn(&dyn Module, &[Tensor]) -> crate::Result<Tensor>;

/// One training step — forward, loss, backward, optimizer update — in either execution mode.
/// Eager records the tape on every step; compiled captures the forward and loss once (for
/// the example inputs' shapes), derives the backward graph from the VJP rules, plans and gates
/// the whole graph once, and then runs only the accepted graph plan. The optimizer update
/// stays outside the graph in both modes. Same model code, same losses.
pub struct TrainStep {
    compiled: Option<CompiledStep>,
    /// Steps run so far (named by a non-finite loss's error).
    runs: std::sync::atomic::AtomicU64,
}

impl TrainStep {
    /// Prepares a step for `mode` (capturing with `example` inputs when compiled).
    pub fn new(
        mode: ExecutionMode,
        model: &dyn Module,
        example: &[(String, Tensor)],
        loss_fn: LossFn,
        profile: &BackendProfile,
    ) -> Result<TrainStep> {
        let compiled = match mode {
            ExecutionMode::Eager => None,
            ExecutionMode::Compiled => {
                let params: Vec<(String, Tensor)> = model
                    .parameters()
                    .into_iter()
                    .map(|(n, t)| (n, t.clone()))
                    .collect();
                let mut step =
                    CompiledStep::build(example, &params, |xs| loss_fn(model, xs), profile)?;
                // `run` drops the loss and the gradients before it returns
                step.replay_as_device_graph();
                Some(step)
            }
        };
        Ok(TrainStep {
            compiled,
            runs: Default::default(),
        })
    }

    /// The compiled graph (compiled mode only).
    pub fn compiled_graph(&self) -> Option<&crate::runtime::compiled::CompiledGraph> {
        self.compiled.as_ref().map(|c| c.compiled())
    }

    /// The compiled plan's report (compiled mode only), its executor line saying whether the
    /// step is replayed as a device graph, followed by the kernels that ran eagerly on this
    /// thread's session (the optimizer's update, which runs outside the compiled plan, among
    /// them), so that the report covers every kernel of the step.
    pub fn compiled_report(&self) -> Option<BackendReport> {
        let mut report = self.compiled.as_ref().map(CompiledStep::report)?;
        if let Ok(eager) = crate::runtime::with_current(|s| s.report()) {
            report.add_eager_kernels(eager);
        }
        Some(report)
    }

    /// Runs one step on `inputs` and returns the loss. The loss is read (on a device: the
    /// host waits for the forward and backward, and runs the checks their kernels deferred,
    /// e.g. of gathered indices) before the optimizer updates the parameters, so a step whose
    /// checks fail leaves the parameters unchanged — as does a step whose loss is not finite,
    /// which fails with `TrainError::NonFiniteLoss` instead of updating with it.
    pub fn run(
        &self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        inputs: &[(String, Tensor)],
        loss_fn: LossFn,
    ) -> Result<f32> {
        self.run_then(model, optimizer, inputs, loss_fn, true)
            .map(|loss| loss.unwrap_or(f32::NAN))
    }

    /// Runs one step on `inputs` — forward, loss, backward, update — without reading the
    /// loss: on a device the whole step stays queued behind the work launched before it (the
    /// host does not wait for the backward before it launches the update), as a PyTorch
    /// step that never calls `.item()`. The checks the step's kernels defer run at the next
    /// read or synchronization, so one that fails is reported after the update ran; use
    /// [`Self::run`] where the parameters must not change on such a step.
    pub fn run_queued(
        &self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        inputs: &[(String, Tensor)],
        loss_fn: LossFn,
    ) -> Result<()> {
        self.run_then(model, optimizer, inputs, loss_fn, false)
            .map(drop)
    }

    /// The step, reading the loss before the update when `read`; on the host with the compute
    /// pool's other workers kept awake for its kernels (`runtime::hot_workers`).
    fn run_then(
        &self,
        model: &mut dyn Module,
        optimizer: &mut dyn Optimizer,
        inputs: &[(String, Tensor)],
        loss_fn: LossFn,
        read: bool,
    ) -> Result<Option<f32>> {
        let device = model.device();
        crate::runtime::hot_workers::with_hot_workers_on(device, || {
            let (loss, grads) = match &self.compiled {
                None => {
                    let xs: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
                    let loss = loss_fn(model, &xs)?;
                    let grads = loss.backward()?;
                    (loss, grads)
                }
                Some(step) => step.run_visiting(inputs, |f| model.visit_parameters(f))?,
            };
            let step = 1 + self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let value = if read { Some(loss.item()?) } else { None };
            if let Some(v) = value {
                super::step::check_loss(v, step)?;
            }
            // an eager loss holds the tape, and the tape the parameters: dropped before the
            // update, which can then write over each parameter's buffer instead of copying it
            let loss = self.compiled.as_ref().map(|_| loss);
            optimizer.step(model, &grads)?;
            if let Some(step) = &self.compiled {
                // the step's buffers come back for the next run
                step.compiled().give_back(grads.into_tensors().chain(loss));
            }
            Ok(value)
        })
    }
}

fn mse(model: &dyn Module, xs: &[Tensor]) -> crate::Result<Tensor> {
    model.forward(&xs[0])?.mse_loss(&xs[1])
}

/// [`train_regression`] in compiled mode; also returns the report of the compiled plan.
#[allow(clippy::too_many_arguments)] // mirrors `train_regression` plus the profile
pub fn train_regression_compiled(
    model: &mut dyn Module,
    optimizer: &mut dyn Optimizer,
    data: &SyntheticRegression,
    steps: usize,
    batch_size: usize,
    log_every: usize,
    profile: &BackendProfile,
    mut log: impl FnMut(StepLog),
) -> Result<(Vec<f32>, BackendReport)> {
    // batches are made on the host and moved to the model's device explicitly
    let device = model.device();
    let named = |(x, y): (Tensor, Tensor)| -> Result<[(String, Tensor); 2]> {
        Ok([
            ("x".to_string(), x.to_device(device)?),
            ("y".to_string(), y.to_device(device)?),
        ])
    };
    let step = TrainStep::new(
        ExecutionMode::Compiled,
        model,
        &named(data.batch(0, batch_size)?)?,
        &mse,
        profile,
    )?;
    // grown as the steps run: reserving `steps` up front let `--steps 4294967296` abort the
    // process on a 16 GiB allocation before the first step (found by the flags fuzzer)
    let mut losses = Vec::with_capacity(steps.min(1 << 16));
    for s in 0..steps {
        losses.push(step.run(model, optimizer, &named(data.batch(s, batch_size)?)?, &mse)?);
        if s == 0 || s + 1 == steps || (log_every > 0 && (s + 1) % log_every == 0) {
            log(StepLog {
                step: s + 1,
                loss: losses[s],
            });
        }
    }
    let report = step
        .compiled_report()
        .ok_or_else(|| crate::error::Error::Other("compiled step without a plan".into()))?;
    Ok((losses, report))
}
