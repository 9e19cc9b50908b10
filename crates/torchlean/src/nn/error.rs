//! Typed errors of the `nn` layer: checkpoints and training, and [`Error`], what the layer's
//! training and checkpoint functions return: one of those, or an error of the core runtime
//! below (a tensor op, planning, the gate). The core [`crate::Error`] knows nothing of this
//! layer; the conversion goes one way, upward.

use thiserror::Error;

/// An error of a training or checkpoint function: the `nn` layer's own, or the core
/// runtime's underneath.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A tensor op, planning, the gate or a kernel failed (see [`crate::Error`]).
    #[error(transparent)]
    Core(#[from] crate::Error),
    /// A checkpoint could not be written, read or applied.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Training stopped or could not start.
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// The result of the `nn` layer's training and checkpoint functions.
pub type Result<T> = std::result::Result<T, Error>;

impl From<crate::data::DataError> for Error {
    fn from(e: crate::data::DataError) -> Self {
        Error::Core(e.into())
    }
}

/// A checkpoint could not be written, read, or applied to a model.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CheckpointError {
    #[error("checkpoint `{path}`: cannot {action}: {message}")]
    Io {
        path: String,
        action: &'static str,
        message: String,
    },
    #[error("checkpoint `{path}` is not a torchlean checkpoint this build reads: {reason}")]
    Format { path: String, reason: String },
    #[error("checkpoint `{path}` is corrupted: {reason}")]
    Corrupted { path: String, reason: String },
    #[error("checkpoint `{path}` does not match the model: {reason}")]
    Mismatch { path: String, reason: String },
    /// A checkpoint is never written with a non-finite value in it (a file read back with
    /// one is `Corrupted`).
    #[error("checkpoint `{path}`: tensor `{tensor}` holds the non-finite value {value} at element {index}; refusing to store it")]
    NonFinite {
        path: String,
        tensor: String,
        index: usize,
        value: f32,
    },
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
    #[error("non-finite value {value} in the {tensor} at step {step}; training stopped before updating the parameters{}", checkpoint_note(.last_checkpoint))]
    NonFiniteGradient {
        /// The 1-based number of the step that failed.
        step: u64,
        /// The first non-finite tensor, e.g. "gradient of `0.weight`" or "global gradient
        /// norm" (parameters in the model's order).
        tensor: String,
        /// The first non-finite value found in it.
        value: f32,
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
