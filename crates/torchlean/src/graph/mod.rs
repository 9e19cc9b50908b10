//! The `graph` layer: which operation occurs with which payload.
//!
//! Owns the op vocabulary ([`Op`], [`OpKind`]), the SSA graph IR ([`Graph`], format
//! `torchlean.ir.v1`) with its well-formedness check, the derivation of backward graphs from
//! the VJP rules ([`append_backward`]), and graph rendering. It must not execute anything:
//! shape rules come from `spec`, kernels from `providers`, execution from `runtime`.

mod autodiff;
mod dot;
mod fuse;
mod ir;
mod op;

pub use autodiff::{append_backward, depends_on_leaves, SEED};
pub use dot::to_dot;
pub use fuse::{fuse_conv_epilogues, fuse_elementwise, FusedChain};
pub use ir::{
    check_user_name, Graph, GraphError, Node, NodeKind, OutputDecl, ValueDecl, FORMAT,
    MAX_GRAPH_BYTES, MAX_NODES, MAX_NODE_ELEMENTS, RESERVED_PREFIX,
};
pub use op::{
    AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, FusedStep, Op, OpKind, Pool2dGeometry,
    Relation, RoundMode, SideOperand,
};
