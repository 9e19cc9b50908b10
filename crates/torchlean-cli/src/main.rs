//! The `torchlean` command. Each subcommand lives in `commands/`; logic a library user would
//! also need lives in the `torchlean` crate.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 usage or planning error, 3 rejected by the gate.

#[macro_use]
mod stdout;
mod backend_args;
mod commands;
mod environment;

/// `torchlean::files::check_distinct_outputs` for a command's (flag, path) inputs and
/// outputs; a command with outputs also outlives a closed stdout (`stdout.rs`), so that
/// they are written whole.
pub fn check_outputs(
    inputs: &[(&str, &std::path::Path)],
    outputs: &[(&str, &std::path::Path)],
) -> Result<(), String> {
    torchlean::files::check_distinct_outputs(inputs, outputs)?;
    if !outputs.is_empty() {
        stdout::keep_running_for_files();
    }
    Ok(())
}

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

/// The exit code of a core runtime error (a tensor that cannot be created from the arguments
/// given, e.g. a batch larger than the task's data, is a usage error; so is an index value
/// out of range in the data a graph reads, as every other invalid input, docs/ir-format.md).
fn core_code(e: &torchlean::Error) -> u8 {
    match e.root() {
        torchlean::Error::Planning(_)
        | torchlean::Error::DeviceUnavailable { .. }
        | torchlean::Error::ProviderUnavailable { .. }
        | torchlean::Error::Op(torchlean::OpError::Index { .. })
        | torchlean::Error::Creation(_) => 2,
        torchlean::Error::Gate(_) => 3,
        _ => 1,
    }
}

impl From<torchlean::Error> for CliError {
    fn from(e: torchlean::Error) -> Self {
        CliError {
            code: core_code(&e),
            message: e.to_string(),
        }
    }
}

impl From<torchlean::nn::Error> for CliError {
    fn from(e: torchlean::nn::Error) -> Self {
        let code = match &e {
            torchlean::nn::Error::Core(c) => core_code(c),
            torchlean::nn::Error::Train(torchlean::nn::TrainError::Config(_)) => 2,
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
    /// Plan, audit and gate a list of ops or a model (graph file or ONNX); print the verdict (exit 0 accepted, 2 planning failed, 3 rejected).
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
    /// Translate an ONNX model into a graph file and its parameters.
    Import(commands::onnx::ImportArgs),
    /// Run a graph file or an ONNX model: named inputs in, named outputs (and gradients with --grad) out.
    RunGraph(commands::graph_files::RunGraphArgs),
    /// Train a small CNN on synthetic 8x8 images (4 classes).
    QuickstartCnn(commands::examples::classify::QuickstartCnnArgs),
    /// Train an MLP classifier (synthetic XOR quadrants, or --data CSV / IDX).
    Mlp(commands::examples::classify::MlpArgs),
    /// Train a small CNN classifier (synthetic images, or --data CSV / IDX).
    Cnn(commands::examples::classify::CnnArgs),
    /// Train a character-level transformer language model on a text file and sample from it.
    Transformer(commands::examples::transformer::Args),
    /// Train an MLP autoencoder on a low-dimensional manifold.
    Autoencoder(commands::examples::autoencoder::Args),
    /// Train a 1-D Fourier neural operator on the heat equation.
    Fno1d(commands::examples::fno1d::Args),
    /// Train a GRU or LSTM sequence regressor.
    Rnn(commands::examples::rnn::Args),
    /// Fuzz the untrusted inputs: graph, safetensors, checkpoint, npy, idx and csv files
    /// in-process, or the command line's flags (exit 1 when something was found).
    Fuzz(commands::fuzz::Args),
}

fn main() -> ExitCode {
    // the CUDA provider module, linked before anything reads the registry; it loads CUDA
    // only when a cuda profile is probed, so this costs nothing on a CPU-only machine
    if let Err(e) = torchlean_cuda::link() {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    // the LibTorch bridge, when built with `--features libtorch` (after the CUDA module,
    // whose `cuda` memory its capsules read)
    #[cfg(feature = "libtorch")]
    if let Err(e) = torchlean_libtorch::link() {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    if let Err(e) = environment::check() {
        eprintln!("error: {}", e.message);
        return ExitCode::from(e.code);
    }
    let run = move || dispatch(cli.command);
    // the whole command runs on a compute-pool thread, so that each op's parallel split
    // keeps half of the work on the calling thread instead of waking the pool and sleeping
    // (torchlean::runtime::compute_threads); no session exists yet to move.
    // TORCHLEAN_COMPUTE_THREADS=0 runs it on the main thread (for comparisons)
    let result = if std::env::var("TORCHLEAN_COMPUTE_THREADS").as_deref() == Ok("0") {
        run()
    } else {
        torchlean::runtime::on_compute_threads(run).unwrap_or_else(|e| Err(e.into()))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

/// Runs one parsed command.
fn dispatch(command: Command) -> Result<(), CliError> {
    match command {
        Command::Ops(a) => commands::ops::run(a),
        Command::Capsules(a) => commands::capsules::run(a),
        Command::Plan(a) => commands::plan::run(a),
        Command::QuickstartTensors => commands::quickstart_tour::tensors(),
        Command::QuickstartAutograd => commands::quickstart_tour::autograd(),
        Command::QuickstartMlp(a) => commands::quickstart_mlp::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Export(a) => commands::graph_files::export(a),
        Command::RunGraph(a) => commands::graph_files::run_graph(a),
        Command::Import(a) => commands::onnx::import(a),
        Command::QuickstartCnn(a) => commands::examples::classify::quickstart_cnn(a),
        Command::Mlp(a) => commands::examples::classify::mlp(a),
        Command::Cnn(a) => commands::examples::classify::cnn(a),
        Command::Transformer(a) => commands::examples::transformer::run_cmd(a),
        Command::Autoencoder(a) => commands::examples::autoencoder::run_cmd(a),
        Command::Fno1d(a) => commands::examples::fno1d::run_cmd(a),
        Command::Rnn(a) => commands::examples::rnn::run_cmd(a),
        Command::Fuzz(a) => commands::fuzz::run(a),
    }
}
