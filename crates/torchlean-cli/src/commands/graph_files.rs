//! `torchlean export` and `torchlean run-graph`: graph files in and out.

use crate::backend_args::{BackendArgs, ModeChoice};
use crate::{CliError, CliResult};
use std::path::PathBuf;
use torchlean::backend::BackendProfile;
use torchlean::graph::{append_backward, to_dot, Graph, SEED};
use torchlean::nn::tasks::SyntheticRegression;
use torchlean::nn::{Activation, Mlp, Module};
use torchlean::runtime::capture::capture;
use torchlean::runtime::compiled::CompiledGraph;
use torchlean::runtime::Session;
use torchlean::tensor::io::{read_safetensors, write_safetensors_as, StoredDtype};
use torchlean::Tensor;

#[derive(clap::Args)]
pub struct ExportArgs {
    /// The model to capture: mlp (the quickstart MLP with its MSE loss), cnn (the small CNN
    /// on 8x8 images, forward), transformer (a 2-block causal encoder, d=32, forward).
    #[arg(long, default_value = "mlp")]
    model: String,
    /// json (torchlean.ir.v1), dot, or onnx (opset 20; needs --out).
    #[arg(long, default_value = "json")]
    format: String,
    /// Write the graph here (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write parameters and constants to this safetensors file.
    #[arg(long)]
    params: Option<PathBuf>,
    /// Write the example inputs used for capture to this safetensors file.
    #[arg(long)]
    example_inputs: Option<PathBuf>,
    /// Batch size of the example inputs the model is captured on (the graph's input shape).
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Seed of the model's initial parameters and of the example inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A captured model: its graph with parameter values, and the example inputs used.
struct Exported {
    captured: torchlean::runtime::capture::Captured,
    inputs: Vec<(String, Tensor)>,
}

fn named_parameters(m: &dyn Module) -> Vec<(String, Tensor)> {
    m.parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect()
}

/// The quickstart MLP with its MSE loss (outputs `prediction` and `loss`).
fn capture_mlp(batch: usize, seed: u64) -> Result<Exported, CliError> {
    let model = Mlp::new(
        &[SyntheticRegression::FEATURES, 64, 64, 1],
        Activation::Tanh,
        seed,
    )?;
    let data = SyntheticRegression::new(1024, seed.wrapping_add(17))?;
    let (x, y) = data.batch(0, batch)?;
    let inputs = vec![("x".to_string(), x), ("y".to_string(), y)];
    let captured = capture(&inputs, &named_parameters(&model), |xs| {
        let prediction = model.forward(&xs[0])?;
        let loss = prediction.mse_loss(&xs[1])?;
        Ok(vec![
            ("prediction".into(), prediction),
            ("loss".into(), loss),
        ])
    })?;
    Ok(Exported { captured, inputs })
}

/// A forward-only capture of `model` on `x` (output `logits` or `y`).
fn capture_forward(model: &dyn Module, x: Tensor, output: &str) -> Result<Exported, CliError> {
    let inputs = vec![("x".to_string(), x)];
    let captured = capture(&inputs, &named_parameters(model), |xs| {
        Ok(vec![(output.to_string(), model.forward(&xs[0])?)])
    })?;
    Ok(Exported { captured, inputs })
}

pub fn export(a: ExportArgs) -> CliResult {
    if a.batch_size == 0 {
        return Err(CliError::usage("--batch-size must be positive"));
    }
    let writes: Vec<(&str, &std::path::Path)> = [
        ("--out", a.out.as_deref()),
        ("--params", a.params.as_deref()),
        ("--example-inputs", a.example_inputs.as_deref()),
    ]
    .into_iter()
    .filter_map(|(flag, p)| p.map(|p| (flag, p)))
    .collect();
    crate::check_outputs(&[], &writes).map_err(CliError::usage)?;
    // export has no backend flags: it captures under `checked_cpu`, installed here explicitly
    torchlean::runtime::install(Session::new(BackendProfile::default_cpu()))?;
    let (b, seed) = (a.batch_size, a.seed);
    let exported = match a.model.as_str() {
        "mlp" => capture_mlp(b, seed)?,
        "cnn" => {
            let model = torchlean::nn::models::small_cnn(1, 8, 4, 8, seed)?;
            let x = Tensor::uniform(&[b, 1, 8, 8], -1.0, 1.0, seed.wrapping_add(1))?;
            capture_forward(&model, x, "logits")?
        }
        "transformer" => {
            let config = torchlean::nn::TransformerConfig {
                embed_dim: 32,
                heads: 4,
                ff_dim: 64,
                dropout: 0.0,
                causal: true,
            };
            let model = torchlean::nn::TransformerEncoder::new(config, 2, true, seed)?;
            let x = Tensor::uniform(&[b, 16, 32], -1.0, 1.0, seed.wrapping_add(1))?;
            capture_forward(&model, x, "y")?
        }
        m => {
            return Err(CliError::usage(format!(
                "unknown model `{m}` (available: mlp, cnn, transformer)"
            )))
        }
    };
    let Exported { captured, inputs } = exported;
    let bytes = match a.format.as_str() {
        "json" => serde_json::to_string_pretty(&captured.graph)
            .map_err(|e| CliError::runtime(e.to_string()))?
            .into_bytes(),
        "dot" => to_dot(&captured.graph).into_bytes(),
        "onnx" => {
            if a.out.is_none() {
                return Err(CliError::usage(
                    "--format onnx writes a binary file: give --out",
                ));
            }
            let model = torchlean_onnx::export_model(&captured.graph, &captured.values)
                .map_err(|e| CliError::usage(e.to_string()))?;
            torchlean_onnx::model::encode_model(&model)
                .map_err(|e| CliError::runtime(e.to_string()))?
        }
        f => {
            return Err(CliError::usage(format!(
                "unknown format `{f}` (json, dot, onnx)"
            )))
        }
    };
    // the graph, its parameters and the example inputs are written as one: a failure leaves
    // none of them (the graph was written before a failing --params)
    let encode = |t: &[(String, torchlean::Tensor)]| {
        torchlean::tensor::io::safetensors_bytes(t, None).map_err(CliError::runtime)
    };
    let mut encoded: Vec<(&std::path::Path, Vec<u8>)> = Vec::new();
    if let Some(p) = &a.params {
        encoded.push((p, encode(&captured.values)?));
    }
    if let Some(p) = &a.example_inputs {
        encoded.push((p, encode(&inputs)?));
    }
    let mut writes: Vec<(&std::path::Path, &[u8])> = Vec::new();
    if let Some(p) = &a.out {
        writes.push((p, &bytes));
    }
    writes.extend(encoded.iter().map(|(p, b)| (*p, b.as_slice())));
    torchlean::files::write_atomic_all(&writes)
        .map_err(|e| CliError::runtime(format!("cannot write: {e}")))?;
    match &a.out {
        None => outln!("{}", String::from_utf8_lossy(&bytes)),
        Some(p) => {
            // say what was written, as run-graph and import do
            let mut what = vec![format!(
                "wrote the {} graph ({} nodes) to {}",
                a.format,
                captured.graph.nodes.len(),
                p.display()
            )];
            what.extend(a.params.as_ref().map(|p| {
                format!(
                    "{} parameter and constant tensor(s) to {}",
                    captured.values.len(),
                    p.display()
                )
            }));
            what.extend(
                a.example_inputs
                    .as_ref()
                    .map(|p| format!("the example inputs to {}", p.display())),
            );
            outln!("{}", what.join(", "));
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct RunGraphArgs {
    /// The graph file (torchlean.ir.v1 JSON), or an ONNX model (`.onnx`: translated on load,
    /// its initializers as parameters).
    graph: PathBuf,
    /// Parameters and constants (safetensors). With an ONNX model, values given here replace
    /// the model's initializers of the same name.
    #[arg(long)]
    params: Option<PathBuf>,
    /// Named inputs (safetensors).
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write the named outputs (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Also write `grad.<name>` for every input and parameter: gradients of the scalar output
    /// (the output named `loss`, or the only one-element output).
    #[arg(long)]
    grad: bool,
    /// Execution mode: compiled, the only mode of a graph file or ONNX model (a captured graph,
    /// planned and gated once); `eager` is refused with the reason.
    #[arg(long = "backend", value_enum)]
    mode: Option<ModeChoice>,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run_graph(a: RunGraphArgs) -> CliResult {
    if a.mode == Some(ModeChoice::Eager) {
        return Err(CliError::usage(
            "run-graph runs a captured graph, which executes in compiled mode only: --backend eager \
             is not available here (omit --backend, or pass --backend compiled; the examples' \
             commands run eager)",
        ));
    }
    let usage = |e: torchlean::Error| CliError::usage(e.to_string());
    let report_json = a.backend.report_json.as_deref().map(std::path::Path::new);
    let mut reads = vec![("the graph", a.graph.as_path()), ("--inputs", &a.inputs)];
    reads.extend(a.params.as_deref().map(|p| ("--params", p)));
    let mut writes = vec![("--out", a.out.as_path())];
    writes.extend(report_json.map(|p| ("--report-json", p)));
    crate::check_outputs(&reads, &writes).map_err(CliError::usage)?;
    let inputs = read_safetensors(&a.inputs).map_err(usage)?;
    // the file is read capped, parsed strictly and validated by the library
    let super::onnx::LoadedModel {
        mut graph,
        values: mut params,
        baked,
        constants,
        output_dtypes,
        outside_gate,
    } = if super::onnx::is_onnx(&a.graph) {
        super::onnx::load_for_inputs(&a.graph, &inputs, &writes)?
    } else {
        super::onnx::LoadedModel {
            graph: Graph::load(&a.graph).map_err(|e| CliError::usage(e.to_string()))?,
            values: vec![],
            baked: vec![],
            constants: vec![],
            output_dtypes: vec![],
            outside_gate: vec![],
        }
    };
    // float initializers the import read only as constants (a Pow exponent, a Resize scale):
    // ONNX does not say whether one was a learnable parameter, so --grad says it writes no
    // gradient for them rather than leaving one out in silence
    if a.grad && !constants.is_empty() {
        eprintln!(
            "note: --grad: the initializer(s) {constants:?} are read as import-time constants (an operand the import must know, such as a Pow exponent); they are not parameters of the graph, and no `grad.` value is written for them"
        );
    }
    // an ONNX initializer that the import read as a constant in some uses (a Clip bound, a
    // Pow exponent) and is a parameter in others: another value, or its gradient, would
    // reach only the parameter's uses (the file's value stays in the others)
    if a.grad && !baked.is_empty() {
        return Err(CliError::usage(format!(
            "--grad: the model's initializer(s) {baked:?} are parameters in some uses and were read \
             as import-time constants in others (an operand the import must know, such as a Clip \
             bound or a Pow exponent), so their gradients would miss those uses"
        )));
    }
    if let Some(p) = &a.params {
        for (name, t) in read_safetensors(p).map_err(usage)? {
            if baked.contains(&name) {
                return Err(CliError::usage(format!(
                    "--params: `{name}` was read as an import-time constant in some of its uses \
                     (an operand the import must know, such as a Clip bound or a Pow exponent), \
                     so those uses would keep the model's value; it cannot be replaced"
                )));
            }
            match params.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = t,
                None => params.push((name, t)),
            }
        }
    }
    if a.grad {
        let loss = graph
            .loss_output()
            .map_err(|e| CliError::usage(format!("--grad: {e}")))?
            .to_string();
        let added =
            append_backward(&mut graph, &loss, None).map_err(|e| CliError::usage(e.to_string()))?;
        // gradients asked for are written, or the command says why not (an argmax loss wrote
        // the loss alone, exit 0)
        if added.is_empty() {
            return Err(CliError::usage(format!(
                "--grad: output `{loss}` does not depend differentiably on any input or parameter (every path to it passes an op without a gradient, such as argmax, or a constant), so there is no gradient to write"
            )));
        }
        let missing: Vec<&str> = graph
            .inputs
            .iter()
            .chain(&graph.parameters)
            .map(|d| d.name.as_str())
            .filter(|n| *n != SEED && !added.iter().any(|g| g.strip_prefix("grad.") == Some(*n)))
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "note: --grad: output `{loss}` does not depend differentiably on {} (no gradient written for {})",
                missing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            );
        }
    }
    // every declared value must be supplied, with its declared shape, before anything runs
    for d in graph.inputs.iter().chain(&graph.parameters) {
        if d.name == SEED {
            continue;
        }
        let is_input = graph.inputs.iter().any(|i| i.name == d.name);
        let source = if is_input { &inputs } else { &params };
        match source.iter().find(|(n, _)| *n == d.name) {
            None => {
                return Err(CliError::usage(format!(
                    "missing {} `{}` (shape {:?})",
                    if is_input { "input" } else { "parameter" },
                    d.name,
                    d.shape
                )))
            }
            Some((_, t)) if t.shape() != d.shape.as_slice() => {
                return Err(CliError::usage(format!(
                    "`{}` has shape {:?}, the graph declares {:?}",
                    d.name,
                    t.shape(),
                    d.shape
                )))
            }
            _ => {}
        }
    }
    check_value_names(&graph, &inputs, &params, super::onnx::is_onnx(&a.graph))?;
    let profile = a.backend.profile()?;
    // the session of this profile (device uploads and the compiled run's eager parts)
    a.backend.install_session()?;
    let compiled = CompiledGraph::compile(graph, &profile)
        .map_err(|e| CliError::from(torchlean::Error::from(e)))?;
    if a.backend.show_backend {
        let report = compiled.report().clone();
        out!(
            "{}",
            report.with_outside_gate(outside_gate.clone()).to_text()
        );
    }
    // values go to the profile's device explicitly (an op never moves them: an input left on
    // the host is refused by the first kernel), and the outputs come back explicitly
    let device = profile.device;
    let place = |list: Vec<(String, Tensor)>| -> Result<Vec<(String, Tensor)>, CliError> {
        list.into_iter()
            .map(|(n, t)| Ok((n, t.to_device(device)?)))
            .collect()
    };
    let (inputs, params) = (place(inputs)?, place(params)?);
    let seed = match compiled.graph().parameters.iter().find(|p| p.name == SEED) {
        Some(p) => {
            let n = p.shape.iter().product();
            Some(Tensor::from_vec(vec![1.0; n], &p.shape)?.to_device(device)?)
        }
        None => None,
    };
    // each name is looked up where it was validated: inputs in --inputs, parameters in
    // --params (check_value_names refused a name given in the wrong file or in both)
    let outputs = compiled.run(|name| {
        if name == SEED {
            return seed.clone();
        }
        let is_input = compiled.graph().inputs.iter().any(|i| i.name == name);
        let source = if is_input { &inputs } else { &params };
        source
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    })?;
    // each output in the type the model declares for it (an ONNX model's int64 indices,
    // boolean comparisons), as PyTorch and onnxruntime return it; float32 otherwise
    let outputs = outputs
        .into_iter()
        .map(|(n, t)| {
            let dtype = output_dtypes
                .iter()
                .find(|(o, _)| *o == n)
                .map_or(StoredDtype::F32, |(_, d)| *d);
            Ok((n, t.to_cpu()?, dtype))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    write_safetensors_as(&a.out, &outputs, None)?;
    if let Some(path) = &a.backend.report_json {
        crate::backend_args::write_report_json(
            path,
            &compiled.ran_report().with_outside_gate(outside_gate),
        )?;
    }
    outln!("wrote {} output(s) to {}", outputs.len(), a.out.display());
    Ok(())
}

/// Every tensor given must name a value of the graph, in the file for its kind: a name in
/// `--inputs` that is no input (a parameter, or a typo) and a name in `--params` that is no
/// parameter are refused, all of them listed — a value is never silently ignored nor
/// taken from the other file.
fn check_value_names(
    graph: &Graph,
    inputs: &[(String, Tensor)],
    params: &[(String, Tensor)],
    onnx: bool,
) -> CliResult {
    let is_input = |n: &str| graph.inputs.iter().any(|d| d.name == n);
    let is_param = |n: &str| n != SEED && graph.parameters.iter().any(|d| d.name == n);
    let mut problems = Vec::new();
    // a name from a file is shown escaped (a hostile file's control characters must not
    // reach the terminal)
    let shown = torchlean::data::printable;
    for (name, _) in inputs.iter().filter(|(n, _)| !is_input(n)) {
        let n = &shown(name);
        problems.push(if is_param(name) {
            format!("`{n}` in --inputs is a parameter of the graph: give it in --params")
        } else {
            format!("`{n}` in --inputs is not an input of the graph")
        });
    }
    for (name, _) in params.iter().filter(|(n, _)| !is_param(n)) {
        let n = &shown(name);
        problems.push(if is_input(name) {
            format!("`{n}` in --params is an input of the graph: give it in --inputs")
        } else if onnx {
            format!("`{n}` in --params is not a parameter of the graph (an ONNX initializer that the import reads as a constant — a shape, an exponent, indices, a bound — cannot be replaced)")
        } else {
            format!("`{n}` in --params is not a parameter of the graph")
        });
    }
    if problems.is_empty() {
        return Ok(());
    }
    let names = |list: &[torchlean::graph::ValueDecl]| {
        list.iter()
            .filter(|d| d.name != SEED)
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(CliError::usage(format!(
        "{}\n(the graph's inputs: {}; its parameters: {})",
        problems.join("\n"),
        names(&graph.inputs),
        names(&graph.parameters)
    )))
}
