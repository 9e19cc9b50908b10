//! The `graph` layer: which operation occurs with which payload.
//!
//! Owns the op vocabulary ([`Op`], [`OpKind`]) and, later, the SSA graph IR. It must not
//! execute anything: shape rules live in `spec`, kernels in `providers`.

mod op;

pub use op::{AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Op, OpKind, Pool2dGeometry};
