//! Errors of the op layer (`graph` + `spec`) and of the runtime.
//!
//! Every user mistake becomes one of these values, naming the op, the shapes involved and
//! what was expected. Library code never panics on user input.

use thiserror::Error;

/// A mistake in how an op was applied: wrong arity, shapes, payload or index values.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum OpError {
    #[error("op `{op}`: expected {expected} input(s), got {got}")]
    Arity {
        op: &'static str,
        expected: String,
        got: usize,
    },
    #[error("op `{op}`: input shapes {shapes:?} are invalid: expected {expected}")]
    Shape {
        op: &'static str,
        shapes: Vec<Vec<usize>>,
        expected: String,
    },
    #[error("op `{op}`: invalid payload: {reason}")]
    Payload { op: &'static str, reason: String },
    #[error("op `{op}`: invalid index value {value} at position {position}: expected an integer in [0, {bound})")]
    Index {
        op: &'static str,
        value: f32,
        position: usize,
        bound: usize,
    },
    #[error("op `{op}` is not differentiable")]
    NotDifferentiable { op: &'static str },
    /// An operand's layout or placement is unusable (refused by a layout guard).
    #[error("op `{op}`: operands of shapes {shapes:?} refused: {reason}")]
    Layout {
        op: &'static str,
        shapes: Vec<Vec<usize>>,
        reason: String,
    },
}

/// Errors raised by tensors, the eager runtime and the providers.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error("tensor creation: {0}")]
    Creation(String),
    #[error("element access: index {index:?} is out of bounds for shape {shape:?}")]
    OutOfBounds {
        index: Vec<usize>,
        shape: Vec<usize>,
    },
    #[error("autograd: {0}")]
    Autograd(String),
    #[error("provider `{provider}` has no kernel for op `{op}`")]
    NoKernel {
        provider: &'static str,
        op: &'static str,
    },
    /// A checker cited by the accepted capsule's evidence rejected a call's result.
    #[error(
        "checker `{checker}` of capsule `{capsule}` rejected the result of op `{op}`: {reason}"
    )]
    CheckerRejected {
        op: &'static str,
        capsule: String,
        checker: &'static str,
        reason: String,
    },
    #[error("planning: {0}")]
    Planning(String),
    #[error("gate: {0}")]
    Gate(String),
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// Model code read a traced value on the host, or cut it from the tape, while a graph was
    /// being captured: the compiled graph would replay this run's data as a constant.
    #[error("capture: `{access}` of a traced value ({producer}) during graph capture; a compiled graph would freeze this run's value into a constant. Keep the value in tensor ops instead (e.g. pass an ids tensor straight to `index_select`, build masks with `where_`/comparisons), or run this model in eager mode")]
    CaptureLeak {
        /// The host read or tape cut (`data`, `to_vec`, `item`, `get`, `detach`, `contiguous`,
        /// or an op run under `no_grad`).
        access: String,
        /// What produced the value: an op name, or an input/parameter of the captured function.
        producer: String,
    },
    /// A large allocation failed (the process is out of memory or under a memory limit): the
    /// request is refused with what it was for and how many bytes it asked for, instead of
    /// aborting the process.
    #[error("out of memory: {what} needs {bytes} bytes, which could not be allocated")]
    OutOfMemory { what: String, bytes: u64 },
    #[error("{0}")]
    Other(String),
    /// A dataset file or in-memory dataset is invalid (see [`crate::data::DataError`]).
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// A checkpoint could not be written, read or applied (see [`crate::nn::CheckpointError`]).
    #[error(transparent)]
    Checkpoint(#[from] crate::nn::CheckpointError),
    /// Training stopped or could not start (see [`crate::nn::TrainError`]).
    #[error(transparent)]
    Train(#[from] crate::nn::TrainError),
}

/// Result alias for the runtime.
pub type Result<T> = std::result::Result<T, Error>;
