//! Shape-only tracing: which ops a computation runs, found without running any kernel.
//!
//! While [`trace`] runs its closure, every op that reaches the eager runtime
//! ([`super::apply`]) is recorded as an (op kind, recording) use and answered with a
//! zero-filled tensor of the shape the op's shape rule gives (`spec::infer_shape`): nothing
//! is planned, gated or run, so a profile that refuses one of the ops refuses it before the
//! first kernel of the real run. "Recording" is decided the way the eager session decides
//! it — a differentiable op, grad mode on, and an input that is tracked (a parameter, or an
//! output of a recorded op of this trace) — so the uses are exactly the (kind, VJP mode)
//! pairs the session will plan; the backward pass runs the VJP kernels of the same accepted
//! capsules.
//!
//! Values inside a trace are placeholders: code that reads them on the host sees zeros.
//! Ops run by a kernel itself (a composition provider's parts) are not reached, since no
//! kernel runs; they are planned when the composed kernel first runs.

use crate::error::Result;
use crate::graph::{Op, OpKind};
use crate::tensor::{IdSet, Tensor};
use std::cell::RefCell;

/// The op uses a trace recorded: (kind, recording), in first-use order, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpUses {
    uses: Vec<(OpKind, bool)>,
    /// The recorded ops are captured into a compiled graph ([`OpUses::all_recorded`]), whose
    /// own VJP nodes differentiate them: the eager tape's backward, and the `concat` it
    /// places slices' cotangents with (runtime/slice_pieces.rs), never run for them.
    captured: bool,
}

impl OpUses {
    /// Builds a use list by hand (each kind with the given recording flag).
    pub fn from_kinds(kinds: &[OpKind], recording: bool) -> OpUses {
        let mut out = OpUses::default();
        for &k in kinds {
            out.push(k, recording && k.differentiable());
        }
        out
    }

    /// The (kind, recording) pairs.
    pub fn uses(&self) -> &[(OpKind, bool)] {
        &self.uses
    }

    /// Whether these are the uses of a graph capture ([`OpUses::all_recorded`]).
    pub fn captured(&self) -> bool {
        self.captured
    }

    /// The distinct kinds used.
    pub fn kinds(&self) -> Vec<OpKind> {
        let mut out: Vec<OpKind> = Vec::new();
        for &(k, _) in &self.uses {
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    pub fn contains(&self, kind: OpKind) -> bool {
        self.uses.iter().any(|&(k, _)| k == kind)
    }

    pub fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// Adds the uses of `other` not already here.
    pub fn extend(&mut self, other: &OpUses) {
        for &(k, r) in &other.uses {
            self.push(k, r);
        }
    }

    /// These uses with every differentiable op also recorded: what a graph capture plans
    /// (it records every op, tracked inputs or not).
    pub fn all_recorded(&self) -> OpUses {
        let mut out = self.clone();
        out.captured = true;
        for &(k, _) in &self.uses {
            if k.differentiable() {
                out.push(k, true);
            }
        }
        out
    }

    fn push(&mut self, kind: OpKind, recording: bool) {
        if !self.uses.contains(&(kind, recording)) {
            self.uses.push((kind, recording));
        }
    }
}

struct State {
    uses: OpUses,
    /// Outputs of recorded ops of this trace (tracked in the real run).
    tracked: IdSet,
}

thread_local! {
    static TRACE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// Runs `f` in shape-only mode on this thread and returns the op uses it made (an error of
/// `f`, e.g. a shape mismatch, is returned as is). No kernel runs and no session is needed.
/// Model state that `f` changes through interior mutability (running statistics) sees
/// placeholder values: snapshot and restore it around the trace.
pub fn trace<R>(f: impl FnOnce() -> Result<R>) -> Result<OpUses> {
    struct Restore(Option<State>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            TRACE.with(|t| *t.borrow_mut() = previous);
        }
    }
    let previous = TRACE.with(|t| {
        t.borrow_mut().replace(State {
            uses: OpUses::default(),
            tracked: IdSet::default(),
        })
    });
    let restore = Restore(previous);
    let result = f();
    let state = TRACE.with(|t| t.borrow_mut().take());
    drop(restore);
    result?;
    Ok(state.map(|s| s.uses).unwrap_or_default())
}

/// Whether a shape-only trace is running on this thread.
pub fn tracing() -> bool {
    TRACE.with(|t| t.borrow().is_some())
}

/// In a trace: records `op` and returns a zero tensor of its output shape. Outside one:
/// `None` (the op runs normally).
pub(crate) fn intercept(op: &Op, inputs: &[&Tensor]) -> Result<Option<Tensor>> {
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        let Some(state) = t.as_mut() else {
            return Ok(None);
        };
        let kind = op.kind();
        let recording = kind.differentiable()
            && super::autograd::grad_enabled()
            && inputs
                .iter()
                .any(|x| x.is_tracked() || state.tracked.contains(&x.id()));
        let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape()).collect();
        let shape = crate::spec::infer_shape(op, &shapes)?;
        let out = Tensor::zeros(&shape)?;
        if recording {
            state.tracked.insert(out.id());
        }
        state.uses.push(kind, recording);
        Ok(Some(out))
    })
}
