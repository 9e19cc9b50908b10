//! `torchlean quickstart-mlp`: train a small MLP on the synthetic regression task.

use crate::backend_args::{BackendArgs, ModeArgs};
use crate::{CliError, CliResult};
use std::time::Instant;
use torchlean::backend::ExecutionMode;
use torchlean::nn::tasks::SyntheticRegression;
use torchlean::nn::train::{train_regression, train_regression_compiled, StepLog};
use torchlean::nn::{Activation, Adam, Mlp, Module, Optimizer};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    mode: ModeArgs,
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f32,
    /// Seed of the data and the initialization.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Print a line every this many steps.
    #[arg(long, default_value_t = 20)]
    log_every: usize,
}

pub fn run(a: Args) -> CliResult {
    if a.batch_size == 0 || a.steps == 0 {
        return Err(CliError::usage("--steps and --batch-size must be positive"));
    }
    let mode = a.mode.mode();
    let setup = || -> torchlean::Result<(Mlp, SyntheticRegression)> {
        let model = Mlp::new(
            &[SyntheticRegression::FEATURES, 64, 64, 1],
            Activation::Tanh,
            a.seed,
        )?;
        Ok((
            model,
            SyntheticRegression::new(1024, a.seed.wrapping_add(17))?,
        ))
    };
    let mut opt = Adam::new(a.lr).map_err(|e| CliError::usage(e.to_string()))?;
    let device = a.backend.profile()?.device;
    // every op of the setup and of a step (the optimizer's update included) is planned and
    // gated before any kernel runs
    a.backend.start_training_session(
        mode,
        || {
            let (model, data) = setup()?;
            let (x, y) = data.batch(0, a.batch_size)?;
            model.forward(&x)?.mse_loss(&y)?;
            Ok(())
        },
        || opt.update_ops(device),
    )?;
    let (mut model, data) = setup()?;
    // the model is built on the host and moved to the profile's device explicitly; the
    // training loop moves each batch to the model's device
    model.to_device(device)?;
    println!(
        "quickstart-mlp: MLP 4-64-64-1 (tanh), {} parameters, Adam lr={}, batch {}, {} steps, {mode} mode",
        model.parameter_count(),
        a.lr,
        a.batch_size,
        a.steps
    );
    let log = |s: StepLog| println!("step {} loss {:.6}", s.step, s.loss);
    let start = Instant::now();
    let (losses, compiled_report) = match mode {
        ExecutionMode::Eager => (
            train_regression(
                &mut model,
                &mut opt,
                &data,
                a.steps,
                a.batch_size,
                a.log_every,
                log,
            )?,
            None,
        ),
        ExecutionMode::Compiled => {
            let profile = a.backend.profile()?;
            let (losses, report) = train_regression_compiled(
                &mut model,
                &mut opt,
                &data,
                a.steps,
                a.batch_size,
                a.log_every,
                &profile,
                log,
            )?;
            if a.backend.show_backend {
                print!("{}", report.to_text());
            }
            (losses, Some(report))
        }
    };
    let elapsed = start.elapsed();
    let first = losses[0];
    let last_window = &losses[losses.len().saturating_sub(10)..];
    let last = last_window.iter().sum::<f32>() / last_window.len() as f32;
    println!(
        "summary: initial loss {first:.6}, final loss (mean of last {} steps) {last:.6}, reduction {:.1}x, {:.2} ms/step",
        last_window.len(),
        first / last,
        elapsed.as_secs_f64() * 1e3 / a.steps as f64
    );
    match compiled_report {
        Some(r) => a.backend.write_report(r, &[]),
        None => a.backend.finish_session(),
    }
}
