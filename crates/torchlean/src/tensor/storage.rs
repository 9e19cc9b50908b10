//! Where a tensor's elements live: host memory, or a buffer on a device that a linked provider
//! module manages (DESIGN §7).
//!
//! The core crate knows no device API. A device module (e.g. `torchlean-cuda`) implements
//! [`DeviceBuffer`] for its memory and hands such buffers out from its kernels and from
//! [`crate::module::ProviderModule::upload`]; the runtime passes them through opaquely. Host
//! reads of device memory are explicit ([`DeviceBuffer::read`], `Tensor::to_cpu`,
//! `Tensor::try_to_vec`) and fallible. Nothing here copies between devices implicitly.

use crate::backend::Device;
use crate::error::Result;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

/// The element type of a storage. Only `f32` is implemented; the tag exists so that bf16 and
/// f16 storage can be added without another redesign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F32,
}

impl DType {
    /// The stable label.
    pub fn label(self) -> &'static str {
        match self {
            DType::F32 => "f32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A buffer of elements in a device's memory, owned by the module that made it.
///
/// Dropping the last handle returns the memory to the module (its allocator decides what
/// that means). `read` is the only way its values reach the host.
pub trait DeviceBuffer: Send + Sync + std::fmt::Debug + 'static {
    /// The device the memory is on.
    fn device(&self) -> Device;
    /// The element type.
    fn dtype(&self) -> DType;
    /// The number of elements.
    fn len(&self) -> usize;
    /// Whether the buffer has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies every element to host memory, waiting for the work that writes the buffer (the
    /// one synchronization point between device and host).
    fn read(&self) -> Result<Vec<f32>>;
    /// For the owning module's kernels, which downcast to their own buffer type.
    fn as_any(&self) -> &dyn Any;
}

/// A tensor's storage: host memory or a device buffer.
#[derive(Debug, Clone)]
pub(crate) enum Storage {
    Host(Arc<Vec<f32>>),
    Device(Arc<dyn DeviceBuffer>),
}

impl Storage {
    pub(crate) fn device(&self) -> Device {
        match self {
            Storage::Host(_) => Device::Cpu,
            Storage::Device(b) => b.device(),
        }
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            Storage::Host(_) => DType::F32,
            Storage::Device(b) => b.dtype(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Storage::Host(v) => v.len(),
            Storage::Device(b) => b.len(),
        }
    }

    /// The host elements (empty for device storage, which has none on the host).
    pub(crate) fn host(&self) -> &[f32] {
        match self {
            Storage::Host(v) => v,
            Storage::Device(_) => &[],
        }
    }

    /// How many storage handles (tensors and views) share this memory.
    pub(crate) fn handles(&self) -> usize {
        match self {
            Storage::Host(a) => Arc::strong_count(a),
            Storage::Device(b) => Arc::strong_count(b),
        }
    }

    pub(crate) fn same(&self, other: &Storage) -> bool {
        match (self, other) {
            (Storage::Host(a), Storage::Host(b)) => Arc::ptr_eq(a, b),
            (Storage::Device(a), Storage::Device(b)) => {
                std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            _ => false,
        }
    }
}
