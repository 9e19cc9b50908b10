//! `torchlean bench`: timed workloads (median and spread after warm-up), with the backend
//! report of the run.

use crate::backend_args::BackendArgs;
use crate::{CliError, CliResult};
use std::time::Instant;
use torchlean::nn::{Activation, Adam, Mlp, Module, Optimizer};
use torchlean::{no_grad, OpKind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// gemm-256 | gemm-1024 | gemm-2048 | mlp-step | tiny-ops | tiny-ops-tape
    workload: String,
    #[command(flatten)]
    backend: BackendArgs,
    /// Timed repetitions (after warm-up).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Warm-up: at least this many untimed runs, and at least `--warmup-seconds` of them.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 0.5)]
    warmup_seconds: f64,
    #[arg(long)]
    json: bool,
}

/// Median, min and max of the timed repetitions, in seconds.
fn stats(mut t: Vec<f64>) -> (f64, f64, f64) {
    t.sort_by(|a, b| a.total_cmp(b));
    (t[t.len() / 2], t[0], t[t.len() - 1])
}

fn time(
    warmup: (usize, f64),
    reps: usize,
    mut f: impl FnMut() -> Result<(), CliError>,
) -> Result<Vec<f64>, CliError> {
    let start = Instant::now();
    let mut done = 0;
    while done < warmup.0 || start.elapsed().as_secs_f64() < warmup.1 {
        f()?;
        done += 1;
    }
    (0..reps)
        .map(|_| {
            let s = Instant::now();
            f()?;
            Ok(s.elapsed().as_secs_f64())
        })
        .collect()
}

pub fn run(a: Args) -> CliResult {
    if a.reps == 0 {
        return Err(CliError::usage("--reps must be positive"));
    }
    let (times, unit_scale, unit, extra): (Vec<f64>, f64, &str, serde_json::Value) =
        match a.workload.as_str() {
            w if w.starts_with("gemm-") => {
                let n: usize = w[5..]
                    .parse()
                    .map_err(|_| CliError::usage(format!("bad gemm size in `{w}`")))?;
                a.backend.start_session(&[OpKind::Matmul], false)?;
                let x = Tensor::randn(&[n, n], 1)?;
                let y = Tensor::randn(&[n, n], 2)?;
                let t = time((a.warmup, a.warmup_seconds), a.reps, || {
                    no_grad(|| x.matmul(&y)).map(|_| ()).map_err(Into::into)
                })?;
                let gflops = 2.0 * (n as f64).powi(3) / stats(t.clone()).0 / 1e9;
                (
                    t,
                    1e3,
                    "ms",
                    serde_json::json!({ "n": n, "gflops": gflops }),
                )
            }
            "mlp-step" => {
                let mut model = Mlp::new(&[784, 512, 512, 10], Activation::Relu, 0)?;
                a.backend.start_session(
                    &[
                        OpKind::Linear,
                        OpKind::Relu,
                        OpKind::LogSoftmax,
                        OpKind::Gather,
                        OpKind::Reshape,
                        OpKind::SumAll,
                        OpKind::Scale,
                        OpKind::Neg,
                    ],
                    true,
                )?;
                let x = Tensor::randn(&[128, 784], 3)?;
                let labels: Vec<f32> = (0..128).map(|i| (i % 10) as f32).collect();
                let y = Tensor::from_vec(labels, &[128])?;
                let mut opt = Adam::new(1e-3)?;
                let t = time((a.warmup, a.warmup_seconds), a.reps, || {
                    let loss = model.forward(&x)?.cross_entropy(&y)?;
                    let g = loss.backward()?;
                    drop(loss);
                    opt.step(&mut model, &g)?;
                    Ok(())
                })?;
                (
                    t,
                    1e3,
                    "ms",
                    serde_json::json!({ "batch": 128, "layers": [784, 512, 512, 10] }),
                )
            }
            "tiny-ops" | "tiny-ops-tape" => {
                let tape = a.workload == "tiny-ops-tape";
                a.backend.start_session(&[OpKind::Add], tape)?;
                let x = Tensor::randn(&[16], 4)?;
                let x = if tape { x.requires_grad() } else { x };
                let y = Tensor::randn(&[16], 5)?;
                let t = time((a.warmup, a.warmup_seconds), a.reps, || {
                    for _ in 0..1000 {
                        std::hint::black_box(x.add(&y)?);
                    }
                    Ok(())
                })?;
                // per-op microseconds: the timed unit is 1000 ops
                (
                    t,
                    1e3,
                    "us/op",
                    serde_json::json!({ "ops_per_rep": 1000, "tape": tape }),
                )
            }
            other => {
                return Err(CliError::usage(format!(
                    "unknown workload `{other}` (gemm-N, mlp-step, tiny-ops, tiny-ops-tape)"
                )))
            }
        };
    let (median, min, max) = stats(times);
    let report = torchlean::runtime::with_current(|s| s.report());
    if a.json {
        let v = serde_json::json!({
            "workload": a.workload, "unit": unit, "median": median * unit_scale, "min": min * unit_scale, "max": max * unit_scale,
            "reps": a.reps, "warmup": a.warmup, "details": extra, "backend_report": report.to_json(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "{}: median {:.4} {unit} (min {:.4}, max {:.4}) over {} reps; {extra}",
            a.workload,
            median * unit_scale,
            min * unit_scale,
            max * unit_scale,
            a.reps
        );
        print!("{}", report.to_text());
    }
    a.backend.finish_session()
}
