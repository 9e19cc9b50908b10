//! Reading an ONNX file: size limit, protobuf decoding, and the checks that apply to the
//! model as a whole (a graph is present, the default-domain opset is one we translate).

use crate::error::OnnxError;
use onnx_protobuf::{Message, ModelProto};
use std::path::Path;

/// Largest ONNX file read (protobuf's own limit is 2 GiB; external data files, read by
/// [`crate::external`], have their own bound).
pub const MAX_MODEL_BYTES: u64 = 2 << 30;

/// The default-domain (`ai.onnx`) opset versions the importer translates. Before 13,
/// Softmax, ReduceSum, Squeeze and Unsqueeze had other semantics; ops are mapped with the
/// semantics of this range.
pub const OPSET_RANGE: std::ops::RangeInclusive<i64> = 13..=22;

/// Reads and decodes `path` (capped at [`MAX_MODEL_BYTES`]), with the external data of its
/// initializers read from the files beside it ([`crate::external`]).
pub fn read_model(path: &Path) -> Result<ModelProto, OnnxError> {
    read_model_file(path).map(|m| m.model)
}

/// A model read from its file, and the files its initializers' external data came from.
pub struct ModelFile {
    pub model: ModelProto,
    /// Every external data file read (resolved paths): inputs of the command as much as the
    /// model file, so a command checks that none of its outputs is one of them.
    pub external_files: Vec<std::path::PathBuf>,
}

/// [`read_model`], also naming the external data files read.
pub fn read_model_file(path: &Path) -> Result<ModelFile, OnnxError> {
    let shown = path.display().to_string();
    let bytes =
        torchlean::files::read_capped(path, MAX_MODEL_BYTES).map_err(|e| OnnxError::File {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
    let mut model = decode_model(&bytes, &shown)?;
    let external_files = crate::external::external_files(&model, path);
    crate::external::load_external_data(&mut model, path)?;
    Ok(ModelFile {
        model,
        external_files,
    })
}

/// Decodes a model from bytes (`name` is used in messages). protobuf's decoder bounds the
/// nesting depth (100) and checks every length against the input, so hostile bytes are a
/// decoding error, not an allocation.
pub fn decode_model(bytes: &[u8], name: &str) -> Result<ModelProto, OnnxError> {
    let model = ModelProto::parse_from_bytes(bytes).map_err(|e| OnnxError::Decode {
        path: name.to_string(),
        reason: e.to_string(),
    })?;
    if model.graph.is_none() {
        return Err(OnnxError::Model {
            path: name.to_string(),
            reason: "the model has no graph".into(),
        });
    }
    Ok(model)
}

/// The default-domain opset version the model imports, checked against [`OPSET_RANGE`].
pub fn default_opset(model: &ModelProto, name: &str) -> Result<i64, OnnxError> {
    let version = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| OnnxError::Model {
            path: name.to_string(),
            reason: "the model imports no default-domain (ai.onnx) opset".into(),
        })?;
    if !OPSET_RANGE.contains(&version) {
        return Err(OnnxError::Model {
            path: name.to_string(),
            reason: format!(
                "opset {version} is not supported (torchlean translates opsets {} to {}; re-export with opset_version in that range)",
                OPSET_RANGE.start(),
                OPSET_RANGE.end()
            ),
        });
    }
    Ok(version)
}

/// Encodes a model as protobuf bytes (the file `torchlean export --format onnx` writes).
pub fn encode_model(model: &ModelProto) -> Result<Vec<u8>, OnnxError> {
    model
        .write_to_bytes()
        .map_err(|e| OnnxError::Export(format!("protobuf encoding failed: {e}")))
}
