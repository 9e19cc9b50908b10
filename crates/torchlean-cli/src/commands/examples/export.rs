//! `--export PATH.onnx`: the trained model written as an ONNX file at the end of a run.
//!
//! What is written is the model's evaluation forward (dropout off, batch norm on its running
//! statistics), captured by the trainer under the run's own session and profile on one batch
//! of the training data (`--batch-size` samples, fewer when the data has fewer: the file's
//! input shape is that batch's), with its weights as initializers: input `x`, output `y`.
//! `torchlean run-graph FILE` and any ONNX runtime run it. A model with an op ONNX export
//! does not cover (the FNO's `spectral_conv1d`) is refused with the op's name before the
//! training starts ([`check_exportable`]: a shape-only trace of the forward, no kernel run).

use super::lib_err;
use crate::CliError;
use std::path::Path;
use torchlean::data::Dataset;
use torchlean::nn::{Module, Trainer};

/// The first `batch_size` training samples (all of them when fewer): the captured batch.
fn export_batch(train: &Dataset, batch_size: usize) -> Result<torchlean::Tensor, CliError> {
    let rows = batch_size.clamp(1, train.len().max(1));
    Ok(train.range(0, rows).map_err(lib_err)?.0)
}

/// Refuses `--export` before anything runs when the model's evaluation forward uses an op
/// ONNX export does not write (a shape-only trace: no kernel runs).
pub fn check_exportable<M: Module>(
    trainer: &mut Trainer<M>,
    train: &Dataset,
    batch_size: usize,
) -> Result<(), CliError> {
    let x = export_batch(train, batch_size)?;
    let model = trainer.model_mut();
    model.set_training(false);
    let uses = torchlean::nn::trace_ops(model, |m| m.forward(&x).map(drop));
    model.set_training(true);
    for &(kind, _) in uses.map_err(lib_err)?.uses() {
        if let Some(why) = torchlean_onnx::export_refusal(kind) {
            return Err(CliError::usage(format!(
                "--export: the model's `{}` {why}; nothing was run",
                kind.name()
            )));
        }
    }
    Ok(())
}

/// Writes the model of `trainer` to `path` as ONNX (module doc).
pub fn write_onnx<M: Module>(
    trainer: &mut Trainer<M>,
    train: &Dataset,
    batch_size: usize,
    path: &Path,
) -> Result<(), CliError> {
    let x = export_batch(train, batch_size)?;
    let captured = trainer.capture_forward(&x, "y").map_err(lib_err)?;
    write_captured(&captured, path)
}

/// Writes a captured forward (input `x`, output `y`, its values on the host) to `path` as
/// ONNX and says so on stdout.
pub fn write_captured(
    captured: &torchlean::runtime::capture::Captured,
    path: &Path,
) -> Result<(), CliError> {
    let model = torchlean_onnx::export_model(&captured.graph, &captured.values)
        .map_err(|e| CliError::usage(format!("--export: {e}")))?;
    let bytes = torchlean_onnx::model::encode_model(&model)
        .map_err(|e| CliError::runtime(format!("--export: {e}")))?;
    torchlean::files::write_atomic(path, &bytes)
        .map_err(|e| CliError::runtime(format!("cannot write {}: {e}", path.display())))?;
    let declared = |d: &[torchlean::graph::ValueDecl]| -> String {
        d.iter()
            .map(|v| format!("`{}` {:?}", v.name, v.shape))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let outputs: Vec<String> = captured
        .graph
        .outputs
        .iter()
        .map(|o| {
            let shape = captured.graph.nodes.get(o.node).map(|n| n.shape.clone());
            format!("`{}` {:?}", o.name, shape.unwrap_or_default())
        })
        .collect();
    outln!(
        "exported the trained model to {} (ONNX opset 20; input {}, output {})",
        path.display(),
        declared(&captured.graph.inputs),
        outputs.join(", ")
    );
    Ok(())
}
