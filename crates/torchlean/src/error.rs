//! Errors of the op layer (`graph` + `spec`) and of the runtime.
//!
//! Every user mistake becomes one of these values, naming the op, the shapes involved and
//! what was expected. Library code never panics on user input.

use crate::backend::{GateFailure, KernelAudit, KernelRejection, PlanningError, RejectedPlan};
use std::fmt;
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
    /// No admissible capsule for one or more ops (one entry per op: eager planning stops at
    /// the first, a compiled graph lists every op that failed). Each entry names the op, the
    /// device and why every candidate capsule was refused.
    #[error("planning: {}", PlanningErrors(.0))]
    Planning(Vec<PlanningError>),
    /// The gate refused what was planned (see [`GateRejection::failures`]).
    #[error("gate: {0}")]
    Gate(GateRejection),
    /// No backend session on this thread and no process default: an op never runs under a
    /// policy the program did not choose.
    #[error("no backend session on this thread{thread}: an op runs only under a profile the program chose. Install one on this thread (`runtime::install(Session::new(profile))`), start the thread with `runtime::spawn` (it inherits the caller's session), or set a process-wide default once at startup (`runtime::set_process_default(profile)`)")]
    NoSession {
        /// ` (name)` of the thread, when it has one.
        thread: String,
    },
    /// A session operation was attempted while this thread's session is lent to a
    /// `runtime::with_current` closure (a tensor op, `install` or `take` inside that closure).
    #[error("session busy: `{attempted}` was called inside `runtime::with_current`'s closure, which holds this thread's session; run tensor ops and session changes outside the closure")]
    SessionBusy { attempted: &'static str },
    /// The process-wide default profile was already set to a different profile.
    #[error("process default profile is already `{current}`; it cannot be changed to `{requested}` (install a session on the thread that needs another profile)")]
    ProcessDefaultSet { current: String, requested: String },
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// The profile asks for a provider (`prefer:P`, `only:P`) that no linked module declares
    /// on its device, or whose module's probe failed: refused before any kernel runs.
    #[error("provider `{provider}` is not available on `{device}`: {reason}")]
    ProviderUnavailable {
        provider: String,
        device: String,
        reason: String,
    },
    /// An op's inputs live on different devices, or on another device than the session's
    /// profile runs on. Never resolved by an implicit copy.
    #[error("op `{op}`: {detail}; move tensors explicitly with `to_device` / `to_cpu` (torchlean never copies between devices implicitly)")]
    DeviceMismatch { op: &'static str, detail: String },
    /// A device call failed (a CUDA error, say), naming the op that launched it.
    #[error("op `{op}` on `{device}`: {reason}")]
    DeviceFailure {
        op: String,
        device: String,
        reason: String,
    },
    /// `module::link` after the set of linked modules was first read.
    #[error("provider module `{module}` linked too late: the linked modules were already read (a registry or session exists); link every module at startup, before the first session")]
    ModulesFrozen { module: &'static str },
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
    /// A node of a compiled graph failed while it ran (an index value out of range in the
    /// data, a checker's rejection): the node's id, what it computes and reads (`label`, e.g.
    /// "`index_select` of node 0 and input `ids`"), and its kernel's error.
    #[error("graph node {node} ({label}): {source}")]
    AtNode {
        node: usize,
        label: String,
        source: Box<Error>,
    },
    /// A dataset file or in-memory dataset is invalid (see [`crate::data::DataError`]).
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
}

impl Error {
    /// The error itself, under any [`Error::AtNode`] context.
    pub fn root(&self) -> &Error {
        match self {
            Error::AtNode { source, .. } => source.root(),
            e => e,
        }
    }

    /// `self` in the context of graph node `node` (an error already in a node's context
    /// keeps it).
    pub(crate) fn at_node(self, node: usize, label: impl FnOnce() -> String) -> Error {
        match self {
            e @ Error::AtNode { .. } => e,
            e => Error::AtNode {
                node,
                label: label(),
                source: Box::new(e),
            },
        }
    }
}

/// Displays planning errors one per line.
struct PlanningErrors<'a>(&'a [PlanningError]);

impl fmt::Display for PlanningErrors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// What the gate refused, kept whole so a caller can match on every failure
/// ([`GateFailure`]: which op, capsule, obligation, evidence and policy).
#[derive(Debug, Clone, PartialEq)]
pub enum GateRejection {
    /// One kernel, refused when an eager session planned its op.
    Kernel(Box<KernelRejection>),
    /// A compiled graph's plan, refused as a whole.
    Plan(Box<RejectedPlan>),
}

impl GateRejection {
    /// Every reason the gate gave (never empty).
    pub fn failures(&self) -> &[GateFailure] {
        match self {
            GateRejection::Kernel(k) => &k.failures,
            GateRejection::Plan(p) => &p.failures,
        }
    }

    /// The audits of the refused kernel(s).
    pub fn audits(&self) -> &[KernelAudit] {
        match self {
            GateRejection::Kernel(k) => std::slice::from_ref(&k.audit),
            GateRejection::Plan(p) => &p.audits,
        }
    }
}

impl fmt::Display for GateRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateRejection::Kernel(k) => write!(f, "op `{}` rejected:", k.audit.op.name())?,
            GateRejection::Plan(_) => write!(f, "rejected by the gate:")?,
        }
        for failure in self.failures() {
            write!(f, "\n  {failure}")?;
        }
        Ok(())
    }
}

/// Result alias for the runtime.
pub type Result<T> = std::result::Result<T, Error>;
