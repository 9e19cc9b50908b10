//! A minimal training loop for the quickstart regression MLP (the full Trainer comes with the
//! models issue).

use super::module::Module;
use super::optim::Optimizer;
use super::tasks::SyntheticRegression;
use crate::error::Result;

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
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let (x, y) = data.batch(step, batch_size)?;
        let loss = model.forward(&x)?.mse_loss(&y)?;
        let grads = loss.backward()?;
        let value = loss.item()?;
        drop(loss);
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
