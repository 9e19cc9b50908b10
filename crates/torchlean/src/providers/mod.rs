//! The `providers` layer: executable kernels, grouped by implementation family.
//!
//! Each provider contributes a *capsule module*: a function that registers its capsules with
//! the kernels bound to them. Providers compute values; they never decide whether they may
//! run — that is the gate's job.
//!
//! - [`reference`]: the `spec` functions instantiated at f32. Slow and obviously right.
//! - [`native_cpu`]: fast f32 kernels (GEMM through the `gemm` crate, rayon parallelism).
//! - [`composition`]: the `torchlean` provider: ops built from other ops.

pub mod capsules;
pub mod checkers;
pub mod composition;
pub mod native_cpu;
pub mod reference;

use crate::backend::Registry;

/// Registers every capsule module linked into this build, in planning-tiebreak order:
/// native CPU first (fast, `checked`), then the reference (`verified`, theorems), then the
/// replayed native capsules (`verified`, replay checkers), then compositions.
pub fn standard_registry() -> Registry {
    let mut r = Registry::new();
    // The built-in modules are validated by tests/trust.rs; a failure here is a programming
    // error in a capsule declaration, not a user error.
    native_cpu::register(&mut r).expect("native_cpu capsules are valid");
    reference::register(&mut r).expect("reference capsules are valid");
    // after the reference: under `strict` with `auto`, theorems come before replay checkers;
    // `only:native_cpu` (profile strict_native_cpu) selects these
    native_cpu::register_replayed(&mut r).expect("replayed native capsules are valid");
    composition::register(&mut r).expect("composition capsules are valid");
    r
}
