//! Kernel identity: what a certificate covers and a report names.
//!
//! A function address is no identity (the compiler may merge identical functions, and an
//! address says nothing about what the function is). Instead every kernel a provider binds
//! carries a [`KernelId`]: the provider module's name for it, the slot it fills, and how it
//! was constructed. Any code can mint an ordinary identity ([`KernelId::new`]); only
//! [`super::proof`] mints the identities of kernels that *are* the specification
//! instantiated at f32, and only the crate's binding constructors may pair such an identity
//! with a function (see `runtime::kernel::KernelBinding`). So a binding that swaps one spec
//! kernel for another function, or adds an in-place or destination-passing variant, carries an
//! identity no certificate covers.
//!
//! The trust layer sees bindings only through the [`Binding`] trait: their identities, never
//! their functions. The runtime of a device recovers its own binding type by downcasting.

use serde::Serialize;
use std::any::Any;
use std::fmt;

/// Which kernel of a binding an identity names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelSlot {
    Forward,
    Vjp,
    InPlace,
    UpdateMany,
    ForwardInto,
    VjpInto,
    InPlaceInto,
}

impl KernelSlot {
    pub fn label(self) -> &'static str {
        match self {
            KernelSlot::Forward => "forward",
            KernelSlot::Vjp => "vjp",
            KernelSlot::InPlace => "in_place",
            KernelSlot::UpdateMany => "update_many",
            KernelSlot::ForwardInto => "forward_into",
            KernelSlot::VjpInto => "vjp_into",
            KernelSlot::InPlaceInto => "in_place_into",
        }
    }
}

/// How the kernel behind an identity was built (private: only `proof` mints `SpecAtF32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Construction {
    /// Ordinary code: its correctness is a matter of evidence.
    Unverified,
    /// `spec::{infer_shape, forward, vjp}` instantiated at f32 behind the reference adapter.
    SpecAtF32,
}

/// The identity of one bound kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct KernelId {
    family: &'static str,
    slot: KernelSlot,
    #[serde(skip)]
    construction: Construction,
}

impl KernelId {
    /// An ordinary identity: kernel family `family` (e.g. `native_cpu`), slot `slot`.
    pub fn new(family: &'static str, slot: KernelSlot) -> KernelId {
        KernelId {
            family,
            slot,
            construction: Construction::Unverified,
        }
    }

    pub(crate) fn with_construction(
        family: &'static str,
        slot: KernelSlot,
        construction: Construction,
    ) -> KernelId {
        KernelId {
            family,
            slot,
            construction,
        }
    }

    pub fn family(&self) -> &'static str {
        self.family
    }

    pub fn slot(&self) -> KernelSlot {
        self.slot
    }

    pub(crate) fn construction(&self) -> Construction {
        self.construction
    }
}

impl fmt::Display for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.family, self.slot.label())
    }
}

/// The executable side of a capsule as the trust layer sees it: the identities of the
/// kernels it binds. Implemented by each device runtime's binding type.
pub trait Binding: Any + Send + Sync + fmt::Debug {
    /// One identity per bound kernel (forward first), every slot that is present.
    fn kernel_ids(&self) -> Vec<KernelId>;
    /// For the runtime to recover its concrete binding type.
    fn as_any(&self) -> &dyn Any;
}
