//! The `torchlean` command. Each subcommand lives in `commands/`; logic a library user would
//! also need lives in the `torchlean` crate.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 usage or planning error, 3 rejected by the gate.

mod backend_args;
mod commands;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// A failure with its exit code.
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub fn usage(m: impl Into<String>) -> Self {
        CliError {
            code: 2,
            message: m.into(),
        }
    }
    pub fn runtime(m: impl Into<String>) -> Self {
        CliError {
            code: 1,
            message: m.into(),
        }
    }
}

impl From<torchlean::Error> for CliError {
    fn from(e: torchlean::Error) -> Self {
        let code = match &e {
            torchlean::Error::Planning(_) | torchlean::Error::DeviceUnavailable { .. } => 2,
            torchlean::Error::Gate(_) => 3,
            _ => 1,
        };
        CliError {
            code,
            message: e.to_string(),
        }
    }
}

pub type CliResult = Result<(), CliError>;

#[derive(Parser)]
#[command(
    name = "torchlean",
    version,
    about = "A deep-learning runtime where every kernel that runs was planned, audited and admitted by an explicit trust policy."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every op with its TorchLean names and the providers implementing it.
    Ops(commands::ops::Args),
    /// List the capsule registry.
    Capsules(commands::capsules::Args),
    /// Plan, audit and gate a list of ops; print the verdict (exit 0 accepted, 2 planning failed, 3 rejected).
    Plan(commands::plan::Args),
    /// A guided tour of tensors.
    QuickstartTensors,
    /// A guided tour of the eager tape autograd.
    QuickstartAutograd,
    /// Train a small MLP on a deterministic synthetic regression task.
    QuickstartMlp(commands::quickstart_mlp::Args),
    /// Run a benchmark workload.
    Bench(commands::bench::Args),
    /// Capture a model and write its graph (torchlean.ir.v1 JSON or DOT) and parameters.
    Export(commands::graph_files::ExportArgs),
    /// Run a graph file: named inputs in, named outputs (and gradients with --grad) out.
    RunGraph(commands::graph_files::RunGraphArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ops(a) => commands::ops::run(a),
        Command::Capsules(a) => commands::capsules::run(a),
        Command::Plan(a) => commands::plan::run(a),
        Command::QuickstartTensors => commands::quickstart_tour::tensors(),
        Command::QuickstartAutograd => commands::quickstart_tour::autograd(),
        Command::QuickstartMlp(a) => commands::quickstart_mlp::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Export(a) => commands::graph_files::export(a),
        Command::RunGraph(a) => commands::graph_files::run_graph(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
