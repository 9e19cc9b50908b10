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
    #[arg(
        long,
        default_value_t = 0.01,
        value_parser = super::examples::f32_value,
        allow_negative_numbers = true
    )]
    lr: f32,
    /// Seed of the data and the initialization.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Print a line every this many steps.
    #[arg(long, default_value_t = 20)]
    log_every: usize,
    /// Write the trained model (its forward: input `x` [batch, 4], output `y` [batch, 1])
    /// as an ONNX file at the end of the run.
    #[arg(long, value_name = "FILE.onnx")]
    export: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> CliResult {
    if a.batch_size == 0 || a.steps == 0 {
        return Err(CliError::usage("--steps and --batch-size must be positive"));
    }
    let mode = a.mode.mode();
    // the outputs must be distinct files, refused before anything runs
    let mut outputs = a.backend.report_output();
    outputs.extend(a.export.as_deref().map(|p| ("--export", p)));
    crate::check_outputs(&[], &outputs).map_err(CliError::usage)?;
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
    outln!(
        "quickstart-mlp: MLP 4-64-64-1 (tanh), {} parameters, Adam lr={}, batch {}, {} steps, {mode} mode",
        model.parameter_count(),
        a.lr,
        a.batch_size,
        a.steps
    );
    let log = |s: StepLog| outln!("step {} loss {:.6}", s.step, s.loss);
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
                out!("{}", report.to_text());
            }
            (losses, Some(report))
        }
    };
    let elapsed = start.elapsed();
    let first = losses[0];
    let last_window = &losses[losses.len().saturating_sub(10)..];
    let last = last_window.iter().sum::<f32>() / last_window.len() as f32;
    outln!(
        "summary: initial loss {first:.6}, final loss (mean of last {} steps) {last:.6}, reduction {:.1}x, {:.2} ms/step",
        last_window.len(),
        first / last,
        elapsed.as_secs_f64() * 1e3 / a.steps as f64
    );
    if let Some(path) = &a.export {
        let (x, _) = data.batch(0, a.batch_size)?;
        super::examples::export::write_captured(&capture_forward(&model, &x)?, path)?;
    }
    match compiled_report {
        Some(r) => a.backend.write_report(r, &[]),
        None => a.backend.finish_session(),
    }
}

/// The trained model's forward on the batch `x` (on the model's device), captured under the
/// command's session — its kernels are planned, gated and reported like the training's —
/// with its values brought to the host for the file.
fn capture_forward(
    model: &Mlp,
    x: &torchlean::Tensor,
) -> torchlean::Result<torchlean::runtime::capture::Captured> {
    let x = x.to_device(model.device())?;
    let params: Vec<(String, torchlean::Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let captured = torchlean::runtime::capture::capture(&[("x".into(), x)], &params, |xs| {
        Ok(vec![("y".to_string(), model.forward(&xs[0])?)])
    })?;
    let values = captured
        .values
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_cpu()?)))
        .collect::<torchlean::Result<_>>()?;
    Ok(torchlean::runtime::capture::Captured {
        graph: captured.graph,
        values,
    })
}
