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

use crate::backend::{Registry, RegistryError};

/// Registers the CPU module's capsules (see [`crate::module::CpuModule`]), in
/// planning-tiebreak order: native CPU first (fast, `checked`), then the reference
/// (`verified`, theorems), then the replayed native capsules (`verified`, replay checkers),
/// then compositions.
pub fn register_cpu(r: &mut Registry) -> Result<(), RegistryError> {
    native_cpu::register(r)?;
    reference::register(r)?;
    // after the reference: under `strict` with `auto`, theorems come before replay checkers;
    // `only:native_cpu` (profile strict_native_cpu) selects these
    native_cpu::register_replayed(r)?;
    composition::register(r)
}

/// The registry of every provider module linked into this process (the CPU module, and
/// whatever the program linked with [`crate::module::link`]).
pub fn standard_registry() -> Registry {
    // Invariant: `module::link` built this same registry before accepting each module (and
    // the CPU module's capsules are validated by tests/trust.rs), so it cannot fail here.
    crate::module::build_registry().expect("linked modules' capsules were validated at link")
}
