//! The `runtime` layer: storage and tensors (in `tensor`), the eager session, the tape, the
//! device probe. It runs only kernels carried by an accepted value from the gate and never
//! chooses a provider itself.

pub mod autograd;
pub mod buffers;
pub mod capture;
pub mod compiled;
pub mod compute_threads;
mod dense_plan;
pub mod device_graph;
pub(crate) mod guarded;
pub mod hot_workers;
pub mod kernel;
pub mod op_times;
pub mod probe;
pub mod session;
mod slice_pieces;
mod tiled;
pub mod trace;

#[cfg(feature = "fault-injection")]
pub use guarded::fault;

pub use autograd::{grad_enabled, no_grad, Gradients, NoGradGuard};
pub use compute_threads::on_compute_threads;
pub use session::{
    apply, apply_update, apply_update_many, fork_current, has_session, install, process_default,
    set_process_default, spawn, take, updates_in_place, with_current, Session, SessionOrigin,
};
pub use trace::{trace, OpUses};
