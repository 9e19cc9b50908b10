//! torchlean: a deep-learning runtime implementing the TorchLean backend model.
//!
//! Every op that runs was chosen by an explicit plan and admitted by an explicit policy; a
//! run can report which implementation ran each op and what evidence backs it.
//!
//! Layers (docs/architecture.md): [`spec`] (the meaning of ops), [`graph`] (the op
//! vocabulary), [`backend`] (the trust layer: data and pure functions), [`providers`]
//! (kernels and their capsule modules), [`module`] (how provider modules and devices are
//! linked), [`runtime`] + [`tensor`] (storage, eager session, tape), [`nn`] (models and
//! training).

pub mod backend;
pub mod data;
pub mod error;
pub mod files;
pub mod fuzz;
pub mod graph;
pub mod hash;
pub mod module;
pub mod nn;
pub mod providers;
pub mod runtime;
pub mod scalar;
pub mod spec;
pub mod tensor;
pub mod wide;

pub use error::{Error, OpError, Result};
pub use graph::{Op, OpKind};
pub use runtime::{no_grad, Gradients};
pub use tensor::Tensor;
