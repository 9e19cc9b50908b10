//! The `nn` layer: modules with named parameters, optimizers, and the built-in tasks.
//!
//! Model code is written once against [`Tensor`](crate::Tensor) ops; it never names a device
//! or provider — those are the session's business (chapter 3.2.8).

mod linear;
mod module;
mod optim;
pub mod tasks;
pub mod train;

pub use linear::{Activation, Linear, Mlp};
pub use module::Module;
pub use optim::{Adam, Optimizer, Sgd};
