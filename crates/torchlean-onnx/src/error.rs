//! Typed errors of the ONNX translation.

use thiserror::Error;

/// One node (or initializer, input or output) that cannot be translated, with what is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The node's name (or the value's name when the node has none).
    pub name: String,
    /// The ONNX op type (`initializer`, `input`, `output` for values).
    pub op_type: String,
    /// What torchlean would need to translate it.
    pub reason: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.name, self.op_type, self.reason)
    }
}

#[derive(Debug, Error)]
pub enum OnnxError {
    /// The file could not be read (missing, too large, not a regular file).
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    /// The bytes are not an ONNX model (protobuf decoding failed).
    #[error("{path}: not an ONNX model: {reason}")]
    Decode { path: String, reason: String },
    /// The model is decodable but not translatable as a whole (no graph, opset out of range).
    #[error("{path}: {reason}")]
    Model { path: String, reason: String },
    /// Every node (and value) that cannot be translated.
    #[error("{path}: {} unsupported node(s):\n{}", .list.len(), list_lines(.list))]
    Unsupported {
        path: String,
        list: Vec<Unsupported>,
    },
    /// A value supplied for an input of an imported model that the model's declared type
    /// does not admit (a fraction for an int64 input).
    #[error("input `{name}`: {reason}")]
    Input { name: String, reason: String },
    /// A torchlean graph that cannot be written as ONNX.
    #[error("export: {0}")]
    Export(String),
}

fn list_lines(list: &[Unsupported]) -> String {
    list.iter()
        .map(|u| format!("  - {u}"))
        .collect::<Vec<_>>()
        .join("\n")
}
