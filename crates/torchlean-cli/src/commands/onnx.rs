//! `torchlean import`, and the ONNX side of `run-graph` and `plan --model`: an ONNX file is
//! translated by `torchlean-onnx` into an ordinary graph plus values, and from there it is
//! planned, gated and run like any graph file.

use crate::{CliError, CliResult};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use torchlean::graph::Graph;
use torchlean::tensor::io::StoredDtype;
use torchlean::Tensor;

/// Whether `path` names an ONNX model (by its extension) rather than a graph file.
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// `--input-shape NAME=D0,D1,...` values, parsed.
pub fn parse_input_shapes(specs: &[String]) -> Result<HashMap<String, Vec<usize>>, CliError> {
    let mut out = HashMap::new();
    for s in specs {
        let (name, dims) = s
            .split_once('=')
            .filter(|(name, _)| !name.trim().is_empty())
            .ok_or_else(|| {
                CliError::usage(format!(
                    "--input-shape `{s}`: expected NAME=D0,D1,... (a non-empty input name)"
                ))
            })?;
        let dims = if dims.trim().is_empty() {
            vec![]
        } else {
            dims.split(',')
                .map(|d| d.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CliError::usage(format!("--input-shape `{s}`: {e}")))?
        };
        if out.insert(name.to_string(), dims).is_some() {
            return Err(CliError::usage(format!(
                "--input-shape gives `{name}` twice"
            )));
        }
    }
    Ok(out)
}

/// Reads an ONNX model file and refuses, before anything is written, an output of the
/// command that is one of the files the model's external data came from (`writes`: the
/// command's (flag, path) outputs; the model file itself the caller checked).
fn read_checked(
    path: &Path,
    writes: &[(&str, &Path)],
) -> Result<torchlean_onnx::ModelFile, CliError> {
    let file = torchlean_onnx::read_model_file(path).map_err(|e| CliError::usage(e.to_string()))?;
    let reads: Vec<(&str, &Path)> = file
        .external_files
        .iter()
        .map(|f| ("the model's external data", f.as_path()))
        .collect();
    crate::check_outputs(&reads, writes).map_err(CliError::usage)?;
    Ok(file)
}

/// Reads and translates an ONNX model; every failure is a usage error (exit 2) listing every
/// unsupported node. `writes` are the command's outputs (see [`read_checked`]).
pub fn load(
    path: &Path,
    input_shapes: &HashMap<String, Vec<usize>>,
    writes: &[(&str, &Path)],
) -> Result<torchlean_onnx::Imported, CliError> {
    let model = read_checked(path, writes)?.model;
    torchlean_onnx::import_model(&model, &path.display().to_string(), input_shapes)
        .map_err(|e| CliError::usage(e.to_string()))
}

/// Translates an ONNX model for `run-graph`: inputs whose ONNX shape is symbolic take the
/// shape of the tensor supplied for them, and the values supplied for inputs the model
/// declares as integers must be integers (a usage error otherwise).
/// [`load_for_inputs`]'s model.
pub struct LoadedModel {
    pub graph: Graph,
    /// Its parameters and constants.
    pub values: Vec<(String, Tensor)>,
    /// The parameters whose initializer the import also read as a constant
    /// (`Imported::baked_parameters`).
    pub baked: Vec<String>,
    /// The float initializers read only as constants (`Imported::constant_initializers`).
    pub constants: Vec<String>,
    /// The outputs' declared element types other than float32 (`Imported::output_dtypes`).
    pub output_dtypes: Vec<(String, StoredDtype)>,
    /// What the import computed outside the gate ([`outside_gate`] of
    /// `Imported::evaluated_at_import`).
    pub outside_gate: Vec<String>,
}

/// The report's line for the float arithmetic an import evaluated on constants
/// (`Imported::evaluated_at_import`): done by the importer before any plan, with the
/// reference kernels' float32 formulas, so no kernel row covers it. Empty when there was
/// none.
pub fn outside_gate(evaluated: &[(String, usize)]) -> Vec<String> {
    if evaluated.is_empty() {
        return vec![];
    }
    let ops: Vec<String> = evaluated
        .iter()
        .map(|(op, n)| format!("{op} ×{n}"))
        .collect();
    vec![format!(
        "the ONNX import evaluated {} on constants in float32 (the reference kernels' formulas), before planning: not planned, gated or checked, and listed in no kernel row",
        ops.join(", ")
    )]
}

pub fn load_for_inputs(
    path: &Path,
    inputs: &[(String, Tensor)],
    writes: &[(&str, &Path)],
) -> Result<LoadedModel, CliError> {
    let usage = |e: torchlean_onnx::OnnxError| CliError::usage(e.to_string());
    let model = read_checked(path, writes)?.model;
    // the model's inputs, without those an initializer backs (older IR versions list them
    // as inputs too): a tensor given for one of these is a parameter, which the value-name
    // check then points to --params (the import took it for a shape of an input the model
    // does not have: the ONNX audit)
    let declared: Vec<&str> = model
        .graph
        .as_ref()
        .map(|g| {
            g.input
                .iter()
                .map(|i| i.name.as_str())
                .filter(|n| !g.initializer.iter().any(|t| t.name == *n))
                .collect()
        })
        .unwrap_or_default();
    let shapes: HashMap<String, Vec<usize>> = inputs
        .iter()
        .filter(|(n, _)| declared.contains(&n.as_str()))
        .map(|(n, t)| (n.clone(), t.shape().to_vec()))
        .collect();
    let imported = torchlean_onnx::import_model(&model, &path.display().to_string(), &shapes)
        .map_err(usage)?;
    // an input the model declares as an integer must receive integers
    imported.check_inputs(inputs).map_err(usage)?;
    Ok(LoadedModel {
        graph: imported.graph,
        values: imported.values,
        baked: imported.baked_parameters,
        constants: imported.constant_initializers,
        output_dtypes: imported.output_dtypes,
        outside_gate: outside_gate(&imported.evaluated_at_import),
    })
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Write the graph (torchlean.ir.v1 JSON) here.
    #[arg(long)]
    out: PathBuf,
    /// Write the parameters (the model's initializers) and constants here (safetensors).
    #[arg(long)]
    params: PathBuf,
    /// The shape of an input whose ONNX shape is symbolic (repeatable): NAME=D0,D1,...
    #[arg(long = "input-shape")]
    input_shape: Vec<String>,
}

pub fn import(a: ImportArgs) -> CliResult {
    crate::check_outputs(
        &[("the model", &a.model)],
        &[("--out", &a.out), ("--params", &a.params)],
    )
    .map_err(CliError::usage)?;
    let imported = load(
        &a.model,
        &parse_input_shapes(&a.input_shape)?,
        &[("--out", &a.out), ("--params", &a.params)],
    )?;
    let outside = outside_gate(&imported.evaluated_at_import);
    let (graph, values) = (imported.graph, imported.values);
    let text =
        serde_json::to_string_pretty(&graph).map_err(|e| CliError::runtime(e.to_string()))?;
    let params =
        torchlean::tensor::io::safetensors_bytes(&values, None).map_err(CliError::runtime)?;
    // the graph and its parameters are written as one: a failure leaves neither (the graph
    // was written before a failing --params)
    torchlean::files::write_atomic_all(&[(&a.out, text.as_bytes()), (&a.params, &params)])
        .map_err(|e| CliError::runtime(format!("cannot write: {e}")))?;
    outln!(
        "imported {}: {} node(s), {} input(s), {} parameter(s) and constant(s), {} output(s)",
        a.model.display(),
        graph.nodes.len(),
        graph.inputs.len(),
        graph.parameters.len(),
        graph.outputs.len()
    );
    // the written constants hold values the import computed: a later run of the graph
    // reads them as data, so this is where it is said
    for line in outside {
        outln!("note: {line} (written as constants)");
    }
    Ok(())
}
