//! Structural guards and checkers: evidence that *is* the function that runs.
//!
//! A [`Guard`] or [`Checker`] in a capsule's evidence holds the function itself; its printed
//! name is taken from the function's path by the [`guard!`](crate::guard) and
//! [`checker!`](crate::checker) macros, so a citation cannot name one function and run
//! another. The runtime — eager path, general graph executor and dense executor alike —
//! calls exactly the guards and checkers the accepted capsule's evidence holds, on every
//! call ([`super::AcceptedKernel::guards`], [`super::AcceptedKernel::checkers`]): a provider
//! cannot cite a guard that does not run.
//!
//! Guards see the *metadata* of the operands before a kernel runs (shape, strides, offset,
//! storage length, device); checkers see this call's operands and results, values included,
//! after it ran. Both are pure functions; this module only describes them (the trust layer
//! never calls them).

use super::vocab::Device;
use crate::error::OpError;
use crate::graph::Op;
use serde::{Serialize, Serializer};
use std::fmt;

/// One operand of a kernel call as a guard or checker sees it.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub shape: &'a [usize],
    /// `None`: dense row-major from `offset`.
    pub strides: Option<&'a [usize]>,
    pub offset: usize,
    /// The whole storage the operand addresses (host memory).
    pub storage: &'a [f32],
    pub device: Device,
}

/// The call a checker replays: inputs and output, and for a VJP the cotangent, which inputs
/// needed a gradient and the gradients the kernel returned (one per input, `None` where it
/// returned none). `seed` keys the checker's random draws: the runtime draws it per call from
/// a per-thread stream that kernels never see.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub inputs: &'a [Operand<'a>],
    pub output: Operand<'a>,
    pub cotangent: Option<Operand<'a>>,
    pub needs: &'a [bool],
    pub grads: &'a [Option<Operand<'a>>],
    pub seed: u64,
}

/// When a guard or checker applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Calls of the forward kernel (and its in-place and destination-passing variants).
    Forward,
    /// Calls of the VJP kernel (and its destination-passing variant).
    Vjp,
}

/// A guard: checks the operands of a call before the kernel runs. A refusal is an op error
/// (naming the op, the shapes and what was expected), which the runtime returns as is: a
/// caller's mistake caught by a guard is the same typed error as one caught anywhere else.
pub type GuardFn = fn(&Op, &[Operand]) -> Result<(), OpError>;
/// A checker: accepts or rejects a call after the kernel ran.
pub type CheckerFn = fn(&Op, &Call) -> Result<(), String>;

/// A runtime guard: its name (the function's path) and the function.
#[derive(Clone, Copy)]
pub struct Guard {
    name: &'static str,
    run: GuardFn,
}

impl Guard {
    /// Use the [`guard!`](crate::guard) macro, which derives the name from the function.
    #[doc(hidden)]
    pub fn from_parts(name: &'static str, run: GuardFn) -> Guard {
        Guard { name, run }
    }
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Runs the guard (the runtime calls this; the trust layer never does).
    pub fn check(&self, op: &Op, inputs: &[Operand]) -> Result<(), OpError> {
        (self.run)(op, inputs)
    }
}

/// A replay checker: its name (the function's path) and the function.
#[derive(Clone, Copy)]
pub struct Checker {
    name: &'static str,
    run: CheckerFn,
}

impl Checker {
    /// Use the [`checker!`](crate::checker) macro, which derives the name from the function.
    #[doc(hidden)]
    pub fn from_parts(name: &'static str, run: CheckerFn) -> Checker {
        Checker { name, run }
    }
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Runs the checker (the runtime calls this; the trust layer never does).
    pub fn check(&self, op: &Op, call: &Call) -> Result<(), String> {
        (self.run)(op, call)
    }
}

macro_rules! named_fn_impls {
    ($t:ty) => {
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name)
            }
        }
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.name == other.name && std::ptr::fn_addr_eq(self.run, other.run)
            }
        }
        impl Eq for $t {}
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name)
            }
        }
    };
}
named_fn_impls!(Guard);
named_fn_impls!(Checker);

/// The printed name of a function item: its path without the crate prefix.
#[doc(hidden)]
pub fn function_name<F>(f: &F) -> &'static str {
    let full = std::any::type_name_of_val(f);
    full.strip_prefix("torchlean::").unwrap_or(full)
}

/// A [`Guard`](crate::backend::Guard) from a function path; its name is the function's.
#[macro_export]
macro_rules! guard {
    ($f:path) => {
        $crate::backend::Guard::from_parts(
            $crate::backend::function_name(&$f),
            $f as $crate::backend::GuardFn,
        )
    };
}

/// A [`Checker`](crate::backend::Checker) from a function path; its name is the function's.
#[macro_export]
macro_rules! checker {
    ($f:path) => {
        $crate::backend::Checker::from_parts(
            $crate::backend::function_name(&$f),
            $f as $crate::backend::CheckerFn,
        )
    };
}
