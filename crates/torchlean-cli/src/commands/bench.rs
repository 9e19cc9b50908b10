//! `torchlean bench`: timed workloads (median and spread after warm-up), with the backend
//! report of the run.

use crate::backend_args::{BackendArgs, ModeArgs};
use crate::{CliError, CliResult};
use std::time::Instant;
use torchlean::backend::{Device, ExecutionMode};
use torchlean::graph::AttentionMask;
use torchlean::nn::train::TrainStep;
use torchlean::nn::{
    Activation, Adam, Mlp, Module, Optimizer, TransformerConfig, TransformerEncoder,
};
use torchlean::{no_grad, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// gemm-N (e.g. gemm-1024) | add-N (e.g. add-268435456) | mlp-step | mlp-big-step | quickstart-step | transformer-step | transformer-big-step | sdpa | attn-{fwd,step}-{none,mask,causal}[-L<n>][-B<n>] (flash attention, B=8 H=16 L=2048 D=64 unless given) | tiny-ops | tiny-ops-tape | onnx:MODEL.onnx (inference of an imported model, compiled)
    workload: String,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    mode: ModeArgs,
    /// Timed repetitions (after warm-up).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Warm-up: at least this many untimed runs, and at least `--warmup-seconds` of them.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Warm-up: at least this many seconds of untimed runs (and at least `--warmup` runs).
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    warmup_seconds: f64,
    /// Print the result as one JSON object (times, median, the workload's parameters, the
    /// backend report) instead of a line of text.
    #[arg(long)]
    json: bool,
    /// Batch size of the training-step workloads (default: 128 for mlp-step, 16 for quickstart-step).
    #[arg(long)]
    batch_size: Option<usize>,
    /// With onnx:MODEL: the shape of an input whose ONNX shape is symbolic (repeatable):
    /// NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shape: Vec<String>,
}

/// Median (of an even count, the mean of the two middle times, as
/// bench/pytorch/bench.py's), min and max of the timed repetitions, in seconds.
fn stats(mut t: Vec<f64>) -> (f64, f64, f64) {
    t.sort_by(|a, b| a.total_cmp(b));
    let n = t.len();
    let median = if n % 2 == 1 {
        t[n / 2]
    } else {
        (t[n / 2 - 1] + t[n / 2]) / 2.0
    };
    (median, t[0], t[n - 1])
}

/// Times `f` on `device`: each repetition ends when the device finished its work (a
/// device runs asynchronously; the CPU synchronizes trivially).
fn time(
    warmup: (usize, f64),
    reps: usize,
    device: Device,
    mut f: impl FnMut() -> Result<(), CliError>,
) -> Result<Vec<f64>, CliError> {
    let mut run = || -> Result<(), CliError> {
        f()?;
        torchlean::module::synchronize(device)?;
        Ok(())
    };
    let start = Instant::now();
    let mut done = 0;
    while done < warmup.0 || start.elapsed().as_secs_f64() < warmup.1 {
        run()?;
        done += 1;
    }
    // the per-capsule table (TORCHLEAN_OP_TIMES) covers the timed repetitions only
    drop(torchlean::runtime::op_times::take());
    (0..reps)
        .map(|_| {
            let s = Instant::now();
            run()?;
            Ok(s.elapsed().as_secs_f64())
        })
        .collect()
}

/// The N of a `gemm-N` or `add-N` workload: a positive integer.
fn size_of(workload: &str, prefix: &str, what: &str) -> Result<usize, CliError> {
    match workload[prefix.len()..].parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CliError::usage(format!(
            "bad {what} in `{workload}`: expected {prefix}N with N a positive integer"
        ))),
    }
}

/// The longest warm-up `--warmup-seconds` asks for.
const MAX_WARMUP_SECONDS: f64 = 3600.0;

pub fn run(a: Args) -> CliResult {
    // an imported model's file is the one input a workload reads
    let model = a.workload.strip_prefix("onnx:").map(std::path::Path::new);
    if model.is_some_and(|m| m.as_os_str().is_empty()) {
        return Err(CliError::usage(
            "workload `onnx:` names no model: give its path, e.g. onnx:model.onnx",
        ));
    }
    let reads: Vec<(&str, &std::path::Path)> =
        model.map(|m| ("the model", m)).into_iter().collect();
    a.backend.check_report_path(&reads)?;
    if model.is_none() && !a.input_shape.is_empty() {
        return Err(CliError::usage(
            "--input-shape applies to onnx:MODEL workloads (an input whose ONNX shape is symbolic)",
        ));
    }
    if a.reps == 0 {
        return Err(CliError::usage("--reps must be positive"));
    }
    // an infinite warm-up never ends, nor does one of 1e300 s, and NaN compares false
    // everywhere: a warm-up is at most an hour
    if !(a.warmup_seconds.is_finite() && (0.0..=MAX_WARMUP_SECONDS).contains(&a.warmup_seconds)) {
        return Err(CliError::usage(format!(
            "--warmup-seconds must be between 0 and {MAX_WARMUP_SECONDS} (an hour), got {}",
            // 1e300 as 1e300, not as its 301 digits
            if a.warmup_seconds.abs() < 1e9 {
                a.warmup_seconds.to_string()
            } else {
                format!("{:e}", a.warmup_seconds)
            }
        )));
    }
    // a timing of no work is not a benchmark
    if a.batch_size == Some(0) {
        return Err(CliError::usage("--batch-size must be positive"));
    }
    // flags that only some workloads read are refused by the others, never ignored
    let step_workload = matches!(
        a.workload.as_str(),
        "mlp-step" | "quickstart-step" | "mlp-big-step"
    );
    let transformer = matches!(
        a.workload.as_str(),
        "transformer-step" | "transformer-big-step"
    );
    // an imported model's inference is compiled: `--backend compiled` says what it runs (as
    // run-graph accepts it), eager is refused
    let onnx = a.workload.starts_with("onnx:");
    if onnx && a.mode.backend == Some(crate::backend_args::ModeChoice::Eager) {
        return Err(CliError::usage(format!(
            "workload `{}` runs compiled only (an imported model's inference, as run-graph)",
            a.workload
        )));
    }
    if a.mode.backend.is_some() && !(step_workload || transformer || onnx) {
        return Err(CliError::usage(format!(
            "--backend is not used by workload `{}` (only mlp-step, mlp-big-step, quickstart-step, transformer-step and transformer-big-step run in both modes)",
            a.workload
        )));
    }
    if a.batch_size.is_some() && !step_workload {
        return Err(CliError::usage(format!(
            "--batch-size is not used by workload `{}` (only mlp-step, mlp-big-step and quickstart-step)",
            a.workload
        )));
    }
    // the inputs of the device workloads are made on the host and moved explicitly
    let device = a.backend.profile()?.device;
    let on = move |t: Tensor| t.to_device(device);
    let device_workload = a.workload.starts_with("gemm-")
        || a.workload.starts_with("add-")
        || a.workload.starts_with("tiny-ops")
        || a.workload.starts_with("attn-")
        || step_workload
        || transformer;
    if device != Device::Cpu && !device_workload {
        return Err(CliError::usage(format!(
            "workload `{}` runs on the cpu only for now (on {device}: gemm-N, add-N, tiny-ops, tiny-ops-tape, mlp-step, mlp-big-step, quickstart-step, transformer-step, transformer-big-step)",
            a.workload
        )));
    }
    let mut compiled_report = None;
    let (times, unit_scale, unit, extra): (Vec<f64>, f64, &str, serde_json::Value) = match a
        .workload
        .as_str()
    {
        w if w.starts_with("gemm-") => {
            let n = size_of(w, "gemm-", "matrix size")?;
            let setup = || -> torchlean::Result<(Tensor, Tensor)> {
                Ok((on(Tensor::randn(&[n, n], 1)?)?, on(Tensor::randn(&[n, n], 2)?)?))
            };
            a.backend.start_session(ExecutionMode::Eager, || {
                let (x, y) = setup()?;
                no_grad(|| x.matmul(&y)).map(drop)
            })?;
            let (x, y) = setup()?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
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
        "mlp-step" | "quickstart-step" | "mlp-big-step" => {
            let mode = a.mode.mode();
            let quick = a.workload == "quickstart-step";
            let big = a.workload == "mlp-big-step";
            let batch = a
                .batch_size
                .unwrap_or(if quick { 16 } else if big { 4096 } else { 128 });
            let sizes: &[usize] = if quick {
                &[4, 64, 64, 1]
            } else if big {
                &[784, 2048, 2048, 10]
            } else {
                &[784, 512, 512, 10]
            };
            let act = if quick {
                Activation::Tanh
            } else {
                Activation::Relu
            };
            let setup = || -> torchlean::Result<(Mlp, Tensor, Tensor)> {
                let model = Mlp::new(sizes, act, 0)?;
                let x = Tensor::randn(&[batch, sizes[0]], 3)?;
                let y = if quick {
                    Tensor::randn(&[batch, 1], 4)?
                } else {
                    Tensor::from_vec((0..batch).map(|i| (i % 10) as f32).collect(), &[batch])?
                };
                Ok((model, x, y))
            };
            let loss_fn = move |m: &dyn Module, xs: &[Tensor]| -> torchlean::Result<Tensor> {
                let out = m.forward(&xs[0])?;
                if quick {
                    out.mse_loss(&xs[1])
                } else {
                    out.cross_entropy(&xs[1])
                }
            };
            start_step_session(&a, mode, device, || {
                let (model, x, y) = setup()?;
                loss_fn(&model, &[x, y]).map(drop)
            })?;
            let (mut model, x, y) = setup()?;
            model.to_device(device)?;
            let inputs = [("x".to_string(), on(x)?), ("y".to_string(), on(y)?)];
            let step = TrainStep::new(mode, &model, &inputs, &loss_fn, &a.backend.profile()?)?;
            let mut opt = Adam::new(1e-3)?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
                // no host read of the loss mid-step, as PyTorch's bench step (which never
                // calls `.item()`): the update queues behind the backward on a device
                step.run_queued(&mut model, &mut opt, &inputs, &loss_fn)?;
                Ok(())
            })?;
            compiled_report = step.compiled_report();
            (
                t,
                1e3,
                "ms",
                serde_json::json!({ "batch": batch, "layers": sizes, "mode": mode.label(), "loss_read_each_step": false }),
            )
        }
        "transformer-step" | "transformer-big-step" => {
            // pre-norm encoder, GELU FFN, Adam, MSE on the output. transformer-step: 2 layers,
            // d=128, 4 heads, FFN 512, L=64, batch 16; transformer-big-step (issue 11's GPU
            // workload): 6 layers, d=512, 8 heads, FFN 2048, L=512, batch 16
            let mode = a.mode.mode();
            let big = a.workload == "transformer-big-step";
            let (layers, d, heads, ff, l, batch) = if big {
                (6, 512, 8, 2048, 512, 16)
            } else {
                (2, 128, 4, 512, 64, 16)
            };
            let config = TransformerConfig {
                embed_dim: d,
                heads,
                ff_dim: ff,
                dropout: 0.0,
                causal: false,
            };
            let setup = || -> torchlean::Result<(TransformerEncoder, Tensor, Tensor)> {
                Ok((
                    TransformerEncoder::new(config, layers, false, 0)?,
                    Tensor::randn(&[batch, l, d], 3)?,
                    Tensor::randn(&[batch, l, d], 4)?,
                ))
            };
            let loss_fn = |m: &dyn Module, xs: &[Tensor]| -> torchlean::Result<Tensor> {
                m.forward(&xs[0])?.mse_loss(&xs[1])
            };
            start_step_session(&a, mode, device, || {
                let (model, x, target) = setup()?;
                loss_fn(&model, &[x, target]).map(drop)
            })?;
            let (mut model, x, target) = setup()?;
            model.to_device(device)?;
            let inputs = [("x".to_string(), on(x)?), ("y".to_string(), on(target)?)];
            let step = TrainStep::new(mode, &model, &inputs, &loss_fn, &a.backend.profile()?)?;
            let mut opt = Adam::new(1e-3)?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
                // no host read of the loss mid-step, as PyTorch's bench step (which never
                // calls `.item()`): the update queues behind the backward on a device
                step.run_queued(&mut model, &mut opt, &inputs, &loss_fn)?;
                Ok(())
            })?;
            compiled_report = step.compiled_report();
            (
                t,
                1e3,
                "ms",
                serde_json::json!({ "layers": layers, "d": d, "heads": heads, "ff": ff, "L": l, "batch": batch, "mode": mode.label(), "loss_read_each_step": false }),
            )
        }
        "sdpa" => {
            // B=4 H=8 L=512 D=64 with a boolean (causal-pattern) mask, forward + backward
            let (b, h, l, d) = (4, 8, 512, 64);
            let setup = || -> torchlean::Result<[Tensor; 5]> {
                Ok([
                    Tensor::randn(&[b, h, l, d], 6)?.requires_grad(),
                    Tensor::randn(&[b, h, l, d], 7)?.requires_grad(),
                    Tensor::randn(&[b, h, l, d], 8)?.requires_grad(),
                    lower_triangular_mask(l)?,
                    Tensor::randn(&[b, h, l, d], 9)?,
                ])
            };
            let forward = |[q, k, v, mask, g]: &[Tensor; 5]| -> torchlean::Result<Tensor> {
                q.scaled_dot_product_attention(
                    k,
                    v,
                    Some((mask, AttentionMask::Boolean)),
                    false,
                    None,
                )?
                .mul(g)?
                .sum_all()
            };
            a.backend
                .start_session(ExecutionMode::Eager, || forward(&setup()?).map(drop))?;
            let inputs = setup()?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
                std::hint::black_box(forward(&inputs)?.backward()?);
                Ok(())
            })?;
            (
                t,
                1e3,
                "ms",
                serde_json::json!({ "B": b, "H": h, "L": l, "D": d, "mask": "boolean" }),
            )
        }
        w if w.starts_with("attn-") => {
            let spec = AttnWorkload::parse(w)?;
            let AttnWorkload {
                backward,
                mask,
                causal,
                b,
                h,
                l,
                d,
            } = spec;
            let setup = || -> torchlean::Result<Vec<Tensor>> {
                let mut v = vec![
                    on(Tensor::randn(&[b, h, l, d], 6)?)?,
                    on(Tensor::randn(&[b, h, l, d], 7)?)?,
                    on(Tensor::randn(&[b, h, l, d], 8)?)?,
                    on(Tensor::randn(&[b, h, l, d], 9)?)?,
                ];
                if mask {
                    // the sdpa workload's pattern: a lower-triangular boolean [L, L] mask
                    v.push(on(lower_triangular_mask(l)?)?);
                }
                Ok(v)
            };
            let forward = |t: &[Tensor], grad: bool| -> torchlean::Result<Tensor> {
                let (q, k, v) = if grad {
                    (
                        t[0].detach().requires_grad(),
                        t[1].detach().requires_grad(),
                        t[2].detach().requires_grad(),
                    )
                } else {
                    (t[0].clone(), t[1].clone(), t[2].clone())
                };
                let m = t.get(4).map(|m| (m, AttentionMask::Boolean));
                q.scaled_dot_product_attention(&k, &v, m, causal, None)
            };
            // forward + backward: the gradient of sum(attention · g)
            let objective = |t: &[Tensor]| -> torchlean::Result<Tensor> {
                if backward {
                    forward(t, true)?.mul(&t[3])?.sum_all()
                } else {
                    no_grad(|| forward(t, false))
                }
            };
            let run = |t: &[Tensor]| -> torchlean::Result<()> {
                let y = objective(t)?;
                if backward {
                    std::hint::black_box(y.backward()?);
                } else {
                    std::hint::black_box(y);
                }
                Ok(())
            };
            // the session is planned from the ops a traced objective uses (the trace records
            // no backward; the tape's VJPs are planned with their forwards)
            a.backend
                .start_session(ExecutionMode::Eager, || objective(&setup()?).map(drop))?;
            let inputs = setup()?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
                run(&inputs)?;
                Ok(())
            })?;
            (
                t,
                1e3,
                "ms",
                serde_json::json!({ "B": b, "H": h, "L": l, "D": d, "mask": if mask { "boolean" } else { "none" }, "causal": causal, "backward": backward, "memory": torchlean::module::memory_stats(device) }),
            )
        }
        w if w.starts_with("add-") => {
            let n = size_of(w, "add-", "element count")?;
            let setup = || -> torchlean::Result<(Tensor, Tensor)> {
                Ok((on(Tensor::randn(&[n], 1)?)?, on(Tensor::randn(&[n], 2)?)?))
            };
            a.backend.start_session(ExecutionMode::Eager, || {
                let (x, y) = setup()?;
                no_grad(|| x.add(&y)).map(drop)
            })?;
            let (x, y) = setup()?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
                no_grad(|| x.add(&y)).map(|_| ()).map_err(Into::into)
            })?;
            // bytes read and written: two inputs and one output of n f32
            let gbps = 12.0 * n as f64 / stats(t.clone()).0 / 1e9;
            (
                t,
                1e3,
                "ms",
                serde_json::json!({ "n": n, "gb_per_s": gbps }),
            )
        }
        "tiny-ops" | "tiny-ops-tape" => {
            let tape = a.workload == "tiny-ops-tape";
            let setup = || -> torchlean::Result<(Tensor, Tensor)> {
                let x = on(Tensor::randn(&[16], 4)?)?;
                let x = if tape { x.requires_grad() } else { x };
                Ok((x, on(Tensor::randn(&[16], 5)?)?))
            };
            a.backend.start_session(ExecutionMode::Eager, || {
                let (x, y) = setup()?;
                x.add(&y).map(drop)
            })?;
            let (x, y) = setup()?;
            let t = time((a.warmup, a.warmup_seconds), a.reps, device, || {
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
        w if w.starts_with("onnx:") => {
            let (t, report, extra) = onnx_inference(&a, std::path::Path::new(&w[5..]))?;
            compiled_report = Some(report);
            (t, 1e3, "ms", extra)
        }
        other => {
            return Err(CliError::usage(format!(
                "unknown workload `{other}` (onnx:MODEL.onnx, gemm-N, add-N, mlp-step, mlp-big-step, quickstart-step, transformer-step, transformer-big-step, sdpa, attn-{{fwd,step}}-{{none,mask,causal}}[-L<n>][-B<n>], tiny-ops, tiny-ops-tape)"
            )))
        }
    };
    let (median, min, max) = stats(times);
    let report = match compiled_report {
        Some(r) => r,
        None => torchlean::runtime::with_current(|s| s.report())?,
    };
    if torchlean::runtime::op_times::enabled() {
        // TORCHLEAN_OP_TIMES: where the time went, per capsule (synchronized, so slower)
        eprintln!("kernel time per capsule over the {} timed repetitions (TORCHLEAN_OP_TIMES; composites include their parts):", a.reps);
        for r in torchlean::runtime::op_times::take() {
            eprintln!(
                "  {:>10.3} ms {:>7} calls  {} {}",
                r.total.as_secs_f64() * 1e3,
                r.calls,
                r.capsule,
                r.phase
            );
        }
    }
    if a.json {
        let v = serde_json::json!({
            "workload": a.workload, "unit": unit, "median": median * unit_scale, "min": min * unit_scale, "max": max * unit_scale,
            "reps": a.reps, "warmup": a.warmup, "details": extra, "backend_report": report.to_json(),
        });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        outln!(
            "{}: median {:.4} {unit} (min {:.4}, max {:.4}) over {} reps; {extra}",
            a.workload,
            median * unit_scale,
            min * unit_scale,
            max * unit_scale,
            a.reps
        );
        out!("{}", report.to_text());
    }
    a.backend.write_report(report, &reads)
}

/// The attention workloads' boolean mask: `[L, L]`, 1 on and below the diagonal (built by a
/// checked, fallible creation: L comes from the workload's name).
fn lower_triangular_mask(l: usize) -> torchlean::Result<Tensor> {
    Tensor::from_fn(&[l, l], |i| ((i % l) <= (i / l)) as u8 as f32)
}

/// An attention workload: `attn-{fwd|step}-{none|mask|causal}[-L<n>][-B<n>]` — forward only
/// or forward + backward of q, k, v [B, 16, L, 64] (default B = 8, L = 2048: issue 12's GPU
/// figure), without a mask, with a boolean lower-triangular [L, L] mask, or `causal`.
struct AttnWorkload {
    backward: bool,
    mask: bool,
    causal: bool,
    b: usize,
    h: usize,
    l: usize,
    d: usize,
}

impl AttnWorkload {
    fn parse(w: &str) -> Result<AttnWorkload, CliError> {
        let bad = || {
            CliError::usage(format!(
                "bad attention workload `{w}`: expected attn-{{fwd|step}}-{{none|mask|causal}}[-L<n>][-B<n>]"
            ))
        };
        let mut parts = w.split('-').skip(1);
        let backward = match parts.next() {
            Some("fwd") => false,
            Some("step") => true,
            _ => return Err(bad()),
        };
        let (mask, causal) = match parts.next() {
            Some("none") => (false, false),
            Some("mask") => (true, false),
            Some("causal") => (false, true),
            _ => return Err(bad()),
        };
        let mut spec = AttnWorkload {
            backward,
            mask,
            causal,
            b: 8,
            h: 16,
            l: 2048,
            d: 64,
        };
        // each of -L and -B at most once (a repeated one took the last value silently)
        let (mut seen_l, mut seen_b) = (false, false);
        for p in parts {
            let n = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad);
            match (p.get(..1), p.get(1..)) {
                (Some("L"), Some(v)) if !seen_l => (spec.l, seen_l) = (n(v)?, true),
                (Some("B"), Some(v)) if !seen_b => (spec.b, seen_b) = (n(v)?, true),
                _ => return Err(bad()),
            }
        }
        Ok(spec)
    }
}

/// Inference of an imported ONNX model in compiled mode (its memory plan applies), on
/// deterministic inputs of the model's declared shapes.
fn onnx_inference(
    a: &Args,
    path: &std::path::Path,
) -> Result<
    (
        Vec<f64>,
        torchlean::backend::BackendReport,
        serde_json::Value,
    ),
    CliError,
> {
    let writes = a.backend.report_output();
    let shapes = super::onnx::parse_input_shapes(&a.input_shape)?;
    let imported = super::onnx::load(path, &shapes, &writes)?;
    let integer = |name: &str| imported.integer_inputs.iter().any(|(n, _)| n == name);
    // inputs the model declares as integers (token ids, positions, flags) get zeros, an
    // index valid for any table: uniform values would be refused as indices
    let inputs: Vec<(String, Tensor)> = imported
        .graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let value = if integer(&d.name) {
                eprintln!(
                    "note: bench: input `{}` is declared as an integer; it is filled with zeros",
                    d.name
                );
                Tensor::zeros(&d.shape)?
            } else {
                Tensor::uniform(&d.shape, -1.0, 1.0, 7 + i as u64)?
            };
            Ok((d.name.clone(), value))
        })
        .collect::<torchlean::Result<_>>()?;
    let (graph, values) = (imported.graph, imported.values);
    let nodes = graph.nodes.len();
    let profile = a.backend.profile()?;
    a.backend.install_session()?;
    let compiled = torchlean::runtime::compiled::CompiledGraph::compile(graph, &profile)
        .map_err(|e| CliError::from(torchlean::Error::from(e)))?;
    let lookup = |name: &str| {
        inputs
            .iter()
            .chain(&values)
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    };
    let t = time((a.warmup, a.warmup_seconds), a.reps, Device::Cpu, || {
        let out = compiled.run(lookup)?;
        compiled.give_back(out.into_iter().map(|(_, t)| t));
        Ok(())
    })?;
    let extra = serde_json::json!({ "model": path.display().to_string(), "nodes": nodes, "mode": "compiled" });
    Ok((t, compiled.ran_report(), extra))
}

/// Installs a training step's session: `workload` (setup, forward and loss) traced, and the
/// step's optimizer update (Adam, as the steps run it) planned and gated with it, before any
/// kernel runs. The update's ops are asked under the installed session (they depend on its
/// profile: in place, or handed out by slices).
fn start_step_session(
    a: &Args,
    mode: ExecutionMode,
    device: Device,
    workload: impl FnOnce() -> torchlean::Result<()>,
) -> CliResult {
    let planned = Adam::new(1e-3)?;
    a.backend
        .start_training_session(mode, workload, || planned.update_ops(device))
}
