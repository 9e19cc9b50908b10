//! Typed errors of the `nn` layer: checkpoints and training. Both convert into
//! [`crate::Error`] (variants `Checkpoint` and `Train`).

use thiserror::Error;

/// A checkpoint could not be written, read, or applied to a model.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CheckpointError {
    #[error("checkpoint `{path}`: cannot {action}: {message}")]
    Io {
        path: String,
        action: &'static str,
        message: String,
    },
    #[error("checkpoint `{path}` is not a valid safetensors file: {reason}")]
    Format { path: String, reason: String },
    #[error("checkpoint `{path}` is corrupted: {reason}")]
    Corrupted { path: String, reason: String },
    #[error("checkpoint `{path}` does not match the model: {reason}")]
    Mismatch { path: String, reason: String },
}

/// Training could not start or stopped.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum TrainError {
    #[error("dtype `{0}` is not supported: the runtime computes in float32")]
    UnsupportedDtype(&'static str),
    #[error("non-finite loss {loss} at step {step}; training stopped before updating the parameters{}", checkpoint_note(.last_checkpoint))]
    NonFiniteLoss {
        /// The 1-based number of the step that failed.
        step: u64,
        loss: f32,
        last_checkpoint: Option<String>,
    },
    #[error("non-finite gradient norm {norm} at step {step}; training stopped before updating the parameters{}", checkpoint_note(.last_checkpoint))]
    NonFiniteGradient {
        /// The 1-based number of the step that failed.
        step: u64,
        norm: f32,
        last_checkpoint: Option<String>,
    },
    #[error("training configuration: {0}")]
    Config(String),
}

fn checkpoint_note(path: &Option<String>) -> String {
    match path {
        Some(p) => format!(" (last good checkpoint: `{p}`)"),
        None => String::new(),
    }
}
