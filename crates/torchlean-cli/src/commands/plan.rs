//! `torchlean plan`: plan, audit and gate a list of ops, and print the verdict.

use crate::{CliError, CliResult};
use torchlean::backend::PlanningError;
use torchlean::backend::{gate_plan, plan_ops, BackendReport, ExecutionMode, PlanRequest, VjpMode};
use torchlean::graph::{append_backward, Graph, NodeKind};
use torchlean::runtime::compiled::{plan_graph, CompileError};
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
    /// Execution mode the plan is for (default: `compiled` with --model, which is how
    /// `run-graph` runs a model; `eager` with --ops). With --model, `compiled` plans the graph
    /// as a compiled run executes it: lowered first (fused element-wise chains and
    /// convolution epilogues on the CPU), a composite's parts nested under it, so the plan
    /// names the run's capsules; `eager` plans each op of the graph as the eager session
    /// would.
    #[arg(long)]
    mode: Option<String>,
    /// With --model and --mode compiled: plan the graph with its backward appended, as
    /// `run-graph --grad` runs it (the VJP nodes of the output named `loss`, or the only
    /// one-element output). An eager plan audits every op's VJP under the profile's VJP mode.
    #[arg(long, requires = "model")]
    grad: bool,
    /// Print the plan (or the planning failure) as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// A model's graph (an ONNX model is translated first; `writes`, the command's outputs, may
/// not be one of its external data files).
fn load_model(
    path: &std::path::Path,
    input_shape: &[String],
    writes: &[(&str, &std::path::Path)],
) -> Result<(Graph, Vec<String>), CliError> {
    Ok(if super::onnx::is_onnx(path) {
        let shapes = super::onnx::parse_input_shapes(input_shape)?;
        let imported = super::onnx::load(path, &shapes, writes)?;
        let outside = super::onnx::outside_gate(&imported.evaluated_at_import);
        (imported.graph, outside)
    } else {
        if !input_shape.is_empty() {
            return Err(CliError::usage(
                "--input-shape applies to ONNX models (whose input shapes may be symbolic); a graph file declares its input shapes",
            ));
        }
        (
            Graph::load(path).map_err(|e| CliError::usage(e.to_string()))?,
            vec![],
        )
    })
}

/// The distinct ops of a graph, in node order.
fn graph_ops(graph: &Graph) -> Vec<OpKind> {
    let mut ops: Vec<OpKind> = vec![];
    for n in &graph.nodes {
        if let NodeKind::Op { op } | NodeKind::Vjp { op, .. } = &n.kind {
            if !ops.contains(&op.kind()) {
                ops.push(op.kind());
            }
        }
    }
    ops
}

/// Prints planning errors (text or JSON) and returns the command's error.
fn planning_failed(errors: &[PlanningError], profile: &str, json: bool) -> CliError {
    if json {
        let v = serde_json::json!({ "verdict": "planning_failed", "profile": profile, "planning_errors": errors, "messages": errors.iter().map(|e| e.to_string()).collect::<Vec<_>>() });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for e in errors {
            outln!("{e}");
        }
    }
    CliError::usage(format!("planning failed for {} op(s)", errors.len()))
}

pub fn run(a: Args) -> CliResult {
    let reads: Vec<(&str, &std::path::Path)> =
        a.model.iter().map(|m| ("--model", m.as_path())).collect();
    a.backend.check_report_path(&reads)?;
    let writes = a.backend.report_output();
    let mut profile = a.backend.profile()?;
    if let Some(v) = &a.vjp {
        let vjp = VjpMode::from_label(v).ok_or_else(|| {
            CliError::usage(format!(
                "unknown vjp mode `{v}` (none, torchlean_tape, backend_vjp, external_autograd)"
            ))
        })?;
        // another VJP mode than the profile's is an override like --policy's: the profile
        // is then named `custom(..)`, as for every other override (it kept its name: the
        // trust audit)
        if vjp != profile.vjp && !profile.name.starts_with("custom(") {
            profile.name = format!("custom({})", profile.name);
        }
        profile.vjp = vjp;
    }
    // a model's plan is by default the plan of its run (run-graph runs compiled only: an
    // eager default named `sigmoid`, `tanh`, `mul` where the run used `fused_map`)
    let label = a.mode.clone().unwrap_or_else(|| {
        if a.model.is_some() {
            "compiled"
        } else {
            "eager"
        }
        .into()
    });
    let mode = ExecutionMode::from_label(&label)
        .ok_or_else(|| CliError::usage(format!("unknown mode `{label}` (eager, compiled)")))?;
    if a.grad && mode != ExecutionMode::Compiled {
        return Err(CliError::usage(
            "--grad applies to --mode compiled (the backward a compiled run appends); an eager plan already audits every op's VJP under the profile's VJP mode (--vjp)",
        ));
    }
    // flags that only a model's graph reads are refused with an op list, not ignored
    if a.model.is_none() {
        if a.grad {
            return Err(CliError::usage(
                "--grad applies to --model (the backward a compiled run appends to a graph's loss); an --ops list has no graph: each op's VJP is audited under the profile's VJP mode (--vjp)",
            ));
        }
        if !a.input_shape.is_empty() {
            return Err(CliError::usage(
                "--input-shape applies to --model (an ONNX model's inputs); an --ops list has no inputs",
            ));
        }
    }
    // a provider the build does not declare on the device is refused here as a run refuses it
    torchlean::module::check_declared(profile.device, profile.preference)
        .map_err(|e| CliError::usage(e.to_string()))?;
    // what an ONNX import computed before the plan (BackendReport::outside_gate)
    let mut outside_gate = vec![];
    let report = match (&a.model, mode) {
        (Some(path), ExecutionMode::Compiled) => {
            let (mut graph, outside) = load_model(path, &a.input_shape, &writes)?;
            outside_gate = outside;
            if a.grad {
                let loss = graph
                    .loss_output()
                    .map_err(|e| CliError::usage(format!("--grad: {e}")))?
                    .to_string();
                append_backward(&mut graph, &loss, None)
                    .map_err(|e| CliError::usage(e.to_string()))?;
            }
            // exactly what compiling it for a run decides (lowering, plan, gate, parts)
            let report = match plan_graph(graph, &profile, standard_registry()) {
                Ok(planned) => planned.report(&profile),
                Err(CompileError::Planning(errors)) => {
                    return Err(planning_failed(&errors, &profile.name, a.json))
                }
                Err(CompileError::Rejected(r)) => {
                    let r = *r;
                    BackendReport::new(&profile, mode, r.audits, r.groups, r.failures)
                }
                Err(e) => return Err(CliError::usage(e.to_string())),
            };
            if !a.json {
                outln!("plan:");
                for k in report.kernels.iter().filter(|k| k.part_of.is_none()) {
                    outln!("  {} -> {}", k.op.name(), k.capsule);
                }
            }
            report
        }
        _ => {
            let ops: Vec<OpKind> = match &a.model {
                Some(path) => {
                    let (graph, outside) = load_model(path, &a.input_shape, &writes)?;
                    outside_gate = outside;
                    graph_ops(&graph)
                }
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
            let availability = torchlean::module::availability();
            let plan = plan_ops(standard_registry(), &ops, &request, &availability)
                .map_err(|errors| planning_failed(&errors, &profile.name, a.json))?;
            // an admitted composite's parts are planned and gated under the same profile, as
            // a run plans them before its first kernel (runtime::Session::preplan): a plan that
            // accepted `composed_attention` while its `permute` had no admissible capsule
            // said "accepted" where the run refused
            // (a composite the gate refuses is refused for itself: its parts would never run)
            let mut parts: Vec<(OpKind, String)> = Vec::new();
            for k in &plan.kernels {
                if torchlean::backend::gate_kernel(k, &request).is_err() {
                    continue;
                }
                for &p in &k.capsule().parts {
                    let entry = (p, k.capsule().name.clone());
                    if !parts.contains(&entry) {
                        parts.push(entry);
                    }
                }
            }
            let part_ops: Vec<OpKind> = parts.iter().map(|(p, _)| *p).collect();
            let part_plan = if part_ops.is_empty() {
                None
            } else {
                Some(
                    plan_ops(standard_registry(), &part_ops, &request, &availability)
                        .map_err(|errors| planning_failed(&errors, &profile.name, a.json))?,
                )
            };
            let (mut audits, mut groups, mut failures) = gated(&plan);
            if let Some(pp) = &part_plan {
                let (part_audits, part_groups, part_failures) = gated(pp);
                for (mut audit, (_, composite)) in part_audits.into_iter().zip(&parts) {
                    audit.part_of = Some(composite.clone());
                    audits.push(audit);
                }
                groups.extend(part_groups);
                failures.extend(part_failures);
            }
            if !a.json {
                outln!("plan:");
                for k in &plan.kernels {
                    outln!("  {} -> {}", k.op.name(), k.capsule().name);
                }
                for (k, (_, composite)) in part_plan.iter().flat_map(|pp| &pp.kernels).zip(&parts) {
                    outln!(
                        "    {} -> {} (part of {composite})",
                        k.op.name(),
                        k.capsule().name
                    );
                }
            }
            BackendReport::new(&profile, mode, audits, groups, failures)
        }
    };
    let report = report.with_outside_gate(outside_gate);
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        out!("{}", report.to_text());
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

/// The gate's verdict on `plan` as report parts: every kernel's audit, the groups, and the
/// failures (none when accepted).
fn gated(
    plan: &torchlean::backend::ExecutionPlan,
) -> (
    Vec<torchlean::backend::KernelAudit>,
    Vec<torchlean::backend::LoweredGroup>,
    Vec<torchlean::backend::GateFailure>,
) {
    match gate_plan(plan) {
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
    }
}
