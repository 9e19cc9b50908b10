//! `torchlean plan`: plan, audit and gate a list of ops, and print the verdict.

use crate::{CliError, CliResult};
use torchlean::backend::{gate_plan, plan_ops, BackendReport, ExecutionMode, PlanRequest, VjpMode};
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
    #[arg(long, value_delimiter = ',', required = true)]
    ops: Vec<String>,
    /// Execution mode the plan is for.
    #[arg(long, default_value = "eager")]
    mode: String,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> CliResult {
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
    let ops: Vec<OpKind> = a
        .ops
        .iter()
        .map(|o| {
            OpKind::from_name(o.trim())
                .ok_or_else(|| CliError::usage(format!("unknown op `{o}` (see `torchlean ops`)")))
        })
        .collect::<Result<_, _>>()?;
    let request = PlanRequest {
        device: profile.device,
        preference: profile.preference,
        policy: profile.policy.clone(),
        vjp: profile.vjp,
        mode,
    };
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
    let failures = report.failures.clone();
    a.backend.write_report(report)?;
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
