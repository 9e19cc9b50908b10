//! One training step, kept behind a small trait ([`StepExecutor`]) so the trainer's execution
//! backend can be swapped: the eager step (forward, loss, tape backward, optional clipping,
//! optimizer update) is implemented here; the compiled backend is reported as unavailable
//! until it is wired into [`executor_for`].

use super::clip::clip_grad_norm;
use super::config::ExecutionBackend;
use super::error::TrainError;
use super::loss::Task;
use super::module::Module;
use super::optim::Optimizer;
use crate::backend::BackendProfile;
use crate::error::Result;
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
        let loss = task.loss(&model.forward(inputs)?, targets)?;
        let value = loss.item()?;
        if !value.is_finite() {
            return Err(TrainError::NonFiniteLoss {
                step,
                loss: value,
                last_checkpoint: None,
            }
            .into());
        }
        let mut grads = loss.backward()?;
        drop(loss);
        let grad_norm = match clip {
            Some(max) => {
                let norm = clip_grad_norm(&*model, &mut grads, max)?;
                if !norm.is_finite() {
                    return Err(TrainError::NonFiniteGradient {
                        step,
                        norm,
                        last_checkpoint: None,
                    }
                    .into());
                }
                Some(norm)
            }
            None => None,
        };
        optimizer.step(model, &grads)?;
        Ok(StepOutput {
            loss: value,
            grad_norm,
        })
    }
}

/// The step executor of a backend under `profile` (the profile is what a compiled executor
/// plans its captured graph with; the eager executor plans through the installed session).
pub fn executor_for(
    backend: ExecutionBackend,
    profile: &BackendProfile,
) -> Result<Box<dyn StepExecutor>> {
    let _ = profile;
    match backend {
        ExecutionBackend::Eager => Ok(Box::new(EagerStep)),
        ExecutionBackend::Compiled => Err(TrainError::CompiledUnavailable.into()),
    }
}
