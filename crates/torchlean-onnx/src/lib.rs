//! ONNX in and out: models that PyTorch (or any exporter) wrote become torchlean graphs, and
//! torchlean graphs become ONNX models that other runtimes load.
//!
//! This crate owns the translation only. It reads an ONNX file as untrusted input (size
//! limit, strict decoding, every tensor's element count checked against its data before
//! anything is allocated), maps each node onto the op vocabulary of `torchlean::graph`
//! (decomposing ONNX composites into several ops), and checks the shapes ONNX declares
//! against the shapes torchlean infers. It never plans, audits, gates or runs anything: an
//! imported model is an ordinary [`torchlean::graph::Graph`] plus its values, and from there
//! the caller compiles it under a profile like any graph file, so every kernel an ONNX model
//! runs is planned and admitted by the same policy as everything else.
//!
//! - [`model`]: reading and decoding the file, the opset check.
//! - [`constant`]: tensors known at import time (initializers, `Constant` nodes, shapes) and
//!   the import-time evaluation of the shape arithmetic exporters emit.
//! - [`import`]: node-by-node mapping, with every unsupported node collected (not only the
//!   first) so that a user sees the whole list at once.
//! - [`export`]: a torchlean graph as an ONNX model (opset 20).
//! - [`fuzz`]: ONNX files as a target of the fuzz campaign driver (`torchlean fuzz onnx`).
//!
//! The supported operators and the round-trip guarantees are in docs/onnx.md.

pub mod constant;
pub mod error;
pub mod export;
pub mod external;
pub mod fuzz;
pub mod import;
pub mod model;

pub use error::{OnnxError, Unsupported};
pub use export::{export_model, refusal as export_refusal, EXPORT_OPSET};
pub use import::{import_model, supported_operators, Imported, InputLimit};
pub use model::{decode_model, read_model, read_model_file, ModelFile, OPSET_RANGE};
