//! `torchlean plan`: plan, audit and gate a list of ops, and print the verdict.

use crate::{CliError, CliResult};
use torchlean::backend::{gate_plan, plan_ops, BackendReport, ExecutionMode, PlanRequest, VjpMode};
use torchlean::graph::NodeKind;
use torchlean::runtime::session::standard_registry;
use torchlean::OpKind;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    backend: crate::backend_args::BackendArgs,
    /// VJP mode requested: none, torchlean_tape, backend_vjp, external_autograd (default: the profile's).
    #[arg(long)]
    vjp: Option<String>,
    /// Comma-separated op names (see `torchlean ops`).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "model",
        conflicts_with = "model"
    )]
    ops: Vec<String>,
    /// Plan every op of a model instead: a graph file or an ONNX model (`.onnx`), audited and
    /// gated without running it.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// With --model: the shape of an input whose ONNX shape is symbolic (NAME=D0,D1,...).
    #[arg(long = "input-shape", requires = "model")]
    input_shape: Vec<String>,
    /// Execution mode the plan is for.
    #[arg(long, default_value = "eager")]
    mode: String,
    #[arg(long)]
    json: bool,
}

/// The distinct ops of a model's graph, in node order (an ONNX model is translated first).
fn model_ops(path: &std::path::Path, input_shape: &[String]) -> Result<Vec<OpKind>, CliError> {
    let graph = if super::onnx::is_onnx(path) {
        let shapes = super::onnx::parse_input_shapes(input_shape)?;
        super::onnx::load(path, &shapes)?.0
    } else {
        if !input_shape.is_empty() {
            return Err(CliError::usage(
                "--input-shape applies to ONNX models (whose input shapes may be symbolic); a graph file declares its input shapes",
            ));
        }
        torchlean::graph::Graph::load(path).map_err(|e| CliError::usage(e.to_string()))?
    };
    let mut ops: Vec<OpKind> = vec![];
    for n in &graph.nodes {
        if let NodeKind::Op { op } | NodeKind::Vjp { op, .. } = &n.kind {
            if !ops.contains(&op.kind()) {
                ops.push(op.kind());
            }
        }
    }
    Ok(ops)
}

pub fn run(a: Args) -> CliResult {
    let reads: Vec<(&str, &std::path::Path)> =
        a.model.iter().map(|m| ("--model", m.as_path())).collect();
    a.backend.check_report_path(&reads)?;
    let mut profile = a.backend.profile()?;
    if let Some(v) = &a.vjp {
        profile.vjp = VjpMode::from_label(v).ok_or_else(|| {
            CliError::usage(format!(
                "unknown vjp mode `{v}` (none, torchlean_tape, backend_vjp, external_autograd)"
            ))
        })?;
    }
    let mode = ExecutionMode::from_label(&a.mode)
        .ok_or_else(|| CliError::usage(format!("unknown mode `{}` (eager, compiled)", a.mode)))?;
    let ops: Vec<OpKind> = match &a.model {
        Some(path) => model_ops(path, &a.input_shape)?,
        None => a
            .ops
            .iter()
            .map(|o| {
                OpKind::from_any_name(o.trim()).ok_or_else(|| {
                    CliError::usage(format!("unknown op `{o}` (see `torchlean ops`)"))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let request = PlanRequest {
        device: profile.device,
        preference: profile.preference,
        policy: profile.policy.clone(),
        vjp: profile.vjp,
        mode,
    };
    // a provider the build does not declare on the device is refused here as a run refuses it
    torchlean::module::check_declared(profile.device, profile.preference)
        .map_err(|e| CliError::usage(e.to_string()))?;
    let availability = torchlean::module::availability();
    let plan = match plan_ops(standard_registry(), &ops, &request, &availability) {
        Ok(p) => p,
        Err(errors) => {
            if a.json {
                let v = serde_json::json!({ "verdict": "planning_failed", "profile": profile.name, "planning_errors": errors, "messages": errors.iter().map(|e| e.to_string()).collect::<Vec<_>>() });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                for e in &errors {
                    println!("{e}");
                }
            }
            return Err(CliError::usage(format!(
                "planning failed for {} op(s)",
                errors.len()
            )));
        }
    };
    let (audits, groups, failures) = match gate_plan(&plan) {
        Ok(accepted) => (
            accepted
                .kernels()
                .iter()
                .map(|k| k.audit().clone())
                .collect(),
            accepted.groups().to_vec(),
            vec![],
        ),
        Err(rejected) => (rejected.audits, rejected.groups, rejected.failures),
    };
    let report = BackendReport::new(&profile, mode, audits, groups, failures);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        println!("plan:");
        for k in &plan.kernels {
            println!("  {} -> {}", k.op.name(), k.capsule().name);
        }
        print!("{}", report.to_text());
    }
    // the plan is static (registry, planner, gate): say so when the device it was made for
    // cannot run here, so an accepted verdict is not read as "this would run"
    if profile.device != torchlean::backend::Device::Cpu {
        if let Err(e) = torchlean::module::probe_for(profile.device, profile.preference) {
            eprintln!(
                "note: this plan is static (nothing was run); device `{}` is not usable on this machine, so an executing command would stop before any kernel: {e}",
                profile.device.label()
            );
        }
    }
    let failures = report.failures.clone();
    a.backend.write_report(report, &reads)?;
    if failures.is_empty() {
        Ok(())
    } else {
        let mut kinds: Vec<&str> = failures.iter().map(|f| f.kind_label()).collect();
        kinds.dedup();
        Err(CliError {
            code: 3,
            message: format!(
                "rejected by the gate: {} failure(s) ({})",
                failures.len(),
                kinds.join(", ")
            ),
        })
    }
}
