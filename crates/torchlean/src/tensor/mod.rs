//! f32 tensors: shared storage (host memory or a device buffer, see [`storage`]) plus a
//! strided [`Layout`], and the autograd links.
//!
//! A `Tensor` is a cheap handle (`Arc`). Views share storage. A tensor lives on one device
//! ([`Tensor::device`]); moving it is explicit ([`Tensor::to_device`], [`Tensor::to_cpu`]), and
//! an op whose inputs live on different devices is an error, never an implicit copy. Tensors are immutable through
//! the public API; optimizers update parameters in place only when they hold the sole
//! reference (see [`Tensor::update_data`]), otherwise they copy.
//!
//! The op methods (`add`, `matmul`, …) live in `ops.rs` and all go through the eager runtime,
//! which runs only kernels the trust gate accepted.

mod creation;
mod display;
pub mod io;
mod layout;
mod ops;
pub mod storage;

pub use layout::Layout;
pub use storage::{DType, DeviceBuffer};

use crate::backend::Device;
use storage::Storage;

use crate::error::{Error, Result};
use crate::runtime::autograd::GradNode;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Hashes a [`TensorId`] with one multiplication. Ids are a process counter, never chosen by
/// an adversary, so SipHash's protection buys nothing, and its cost was a visible share of a
/// small model's training step (the tape and gradient stores look ids up per op).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A hash map keyed by tensor identity.
pub type IdMap<V> = std::collections::HashMap<TensorId, V, std::hash::BuildHasherDefault<IdHasher>>;
/// A hash set of tensor identities.
pub type IdSet = std::collections::HashSet<TensorId, std::hash::BuildHasherDefault<IdHasher>>;

/// Unique identity of a tensor handle (gradients are keyed by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) struct TensorImpl {
    id: TensorId,
    storage: Storage,
    layout: Layout,
    requires_grad: bool,
    grad_fn: Option<GradNode>,
}

/// The last handle of a large storage gives its buffer to the runtime's storage cache, so
/// the next kernel output of that size reuses it (see `runtime::buffers`).
impl Drop for TensorImpl {
    fn drop(&mut self) {
        if let Storage::Host(storage) = &mut self.storage {
            if storage.len() >= crate::runtime::buffers::CACHE_MIN_ELEMENTS {
                if let Some(v) = Arc::get_mut(storage) {
                    crate::runtime::buffers::cache_release(std::mem::take(v));
                }
            }
        }
    }
}

/// An f32 tensor on the CPU or on a device a linked module provides.
#[derive(Clone)]
pub struct Tensor(Arc<TensorImpl>);

impl Tensor {
    /// A contiguous tensor owning `data` (length already checked by the caller).
    pub(crate) fn from_parts(data: Vec<f32>, shape: Vec<usize>) -> Tensor {
        debug_assert_eq!(data.len(), crate::spec::numel(&shape));
        Tensor::from_storage(Arc::new(data), Layout::contiguous(shape))
    }

    /// An empty vector standing in for a tensor whose handle was handed over for a moment
    /// (an optimizer taking a parameter out of its model to update it in place).
    pub(crate) fn placeholder() -> Tensor {
        Tensor::from_parts(Vec::new(), vec![0])
    }

    /// A tensor over existing storage with a given layout (a view).
    pub(crate) fn from_storage(storage: Arc<Vec<f32>>, layout: Layout) -> Tensor {
        Tensor::from_any_storage(Storage::Host(storage), layout)
    }

    /// A contiguous tensor over a whole device buffer. For device modules' kernels: the
    /// buffer must hold exactly `shape`'s element count (checked).
    pub fn from_device_buffer(buffer: Arc<dyn DeviceBuffer>, shape: &[usize]) -> Result<Tensor> {
        let layout = Layout::try_contiguous(shape.to_vec())?;
        if layout.numel() != buffer.len() {
            return Err(Error::Creation(format!(
                "device buffer of {} elements cannot hold shape {shape:?} ({} elements)",
                buffer.len(),
                layout.numel()
            )));
        }
        Ok(Tensor::from_any_storage(Storage::Device(buffer), layout))
    }

    fn from_any_storage(storage: Storage, layout: Layout) -> Tensor {
        Tensor(Arc::new(TensorImpl {
            id: TensorId::fresh(),
            storage,
            layout,
            requires_grad: false,
            grad_fn: None,
        }))
    }

    /// A view of this tensor's storage with another layout.
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        Tensor::from_any_storage(self.0.storage.clone(), layout)
    }

    pub(crate) fn with_grad_fn(self, node: GradNode) -> Tensor {
        let inner = TensorImpl {
            id: self.0.id,
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            requires_grad: false,
            grad_fn: Some(node),
        };
        Tensor(Arc::new(inner))
    }

    pub(crate) fn grad_fn(&self) -> Option<&GradNode> {
        self.0.grad_fn.as_ref()
    }

    /// The storage, if this handle is its only owner and sees all of it (for buffer reuse).
    pub(crate) fn into_storage(self) -> Option<Vec<f32>> {
        let mut inner = Arc::try_unwrap(self.0).ok()?;
        let Storage::Host(storage) = &mut inner.storage else {
            return None;
        };
        if inner.grad_fn.is_some() || !inner.layout.is_contiguous() || inner.layout.offset != 0 {
            return None;
        }
        if storage.len() != inner.layout.numel() {
            return None;
        }
        Arc::get_mut(storage).map(std::mem::take)
    }

    /// The whole underlying host storage (views address part of it through their layout);
    /// empty for a tensor on a device, whose elements are not in host memory.
    pub(crate) fn storage_slice(&self) -> &[f32] {
        self.0.storage.host()
    }

    /// The device buffer under this tensor (`None` on the host), for device modules' kernels.
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match &self.0.storage {
            Storage::Device(b) => Some(b),
            Storage::Host(_) => None,
        }
    }

    /// Whether this handle is the only one on its storage: no clone, view or tape node of it
    /// is alive elsewhere (a device graph's outputs are rewritten in place by the next replay).
    pub(crate) fn is_sole_handle(&self) -> bool {
        Arc::strong_count(&self.0) == 1 && self.0.storage.handles() == 1
    }

    /// Whether this handle alone holds its storage, dense row-major from offset 0 over all of
    /// it: a device module's kernel may then write the buffer in place (an update of several
    /// tensors, `runtime::kernel::UpdateManyKernel`). Takes `&mut self`, so that no other
    /// handle of it can appear while the caller writes.
    pub fn owns_storage_alone(&mut self) -> bool {
        self.is_sole_handle()
            && self.0.layout.is_contiguous()
            && self.0.layout.offset == 0
            && self.0.storage.len() == self.0.layout.numel()
    }

    /// The device the elements live on.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.storage.dtype()
    }

    /// The same values on `device`: this tensor when already there, else an explicit copy
    /// through the linked module that owns the device (an error naming what is missing when
    /// none is linked or its probe fails). The copy is a new leaf, not recorded on the tape;
    /// it keeps the `requires_grad` flag of a leaf (so parameters can be moved).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        crate::runtime::capture::note_host_access(self, "to_device");
        if self.device() == device {
            return Ok(self.clone());
        }
        let host = self.to_cpu()?;
        let out = if device == Device::Cpu {
            host
        } else {
            let buffer = crate::module::upload(device, &host.host_data())?;
            Tensor::from_device_buffer(buffer, self.shape())?
        };
        Ok(if self.0.requires_grad {
            out.requires_grad()
        } else {
            out
        })
    }

    /// The same values in host memory (this tensor when already there): the explicit,
    /// fallible host read of a device tensor.
    pub fn to_cpu(&self) -> Result<Tensor> {
        match &self.0.storage {
            Storage::Host(_) => Ok(self.clone()),
            Storage::Device(b) => {
                let all = b.read()?;
                let mut v = Vec::new();
                self.0.layout.gather_into_unchecked(&all, &mut v);
                Ok(Tensor::from_parts(v, self.shape().to_vec()))
            }
        }
    }

    /// The elements in row-major order, on any device (the fallible form of
    /// [`Tensor::to_vec`]).
    pub fn try_to_vec(&self) -> Result<Vec<f32>> {
        crate::runtime::capture::note_host_access(self, "to_vec");
        Ok(self.to_cpu()?.host_data().into_owned())
    }

    /// Identity of this handle.
    pub fn id(&self) -> TensorId {
        self.0.id
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.layout.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// The strided layout.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// Whether the elements are dense and row-major in storage.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// Whether two tensors share storage (one is a view of the other).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        self.0.storage.same(&other.0.storage)
    }

    /// The elements in row-major order, borrowed when contiguous, copied otherwise.
    /// During a graph capture, reading a traced value here is refused (see
    /// [`crate::runtime::capture`]); kernels read their inputs through `host_data`.
    ///
    /// A tensor on a device is read to the host here (a blocking copy). Prefer the explicit,
    /// fallible [`Tensor::to_cpu`] / [`Tensor::try_to_vec`] for device tensors.
    ///
    /// # Panics
    /// When the read of a device tensor fails: a driver or hardware fault, or an earlier
    /// call's check that waited for this read (an invalid index given to a CUDA index kernel
    /// is reported at the next read); `try_to_vec` returns either as an error.
    pub fn data(&self) -> Cow<'_, [f32]> {
        crate::runtime::capture::note_host_access(self, "data");
        self.host_data()
    }

    /// The elements in row-major order, for kernels and runtime code (no capture check).
    /// A device tensor is read (see [`Tensor::data`] for the one panic).
    pub(crate) fn host_data(&self) -> Cow<'_, [f32]> {
        let l = &self.0.layout;
        let storage = match &self.0.storage {
            Storage::Host(v) => v.as_slice(),
            Storage::Device(_) => return Cow::Owned(self.device_read_or_panic()),
        };
        if l.is_contiguous() {
            Cow::Borrowed(&storage[l.offset..l.offset + l.numel()])
        } else {
            let mut out = Vec::new();
            l.gather_into_unchecked(storage, &mut out);
            Cow::Owned(out)
        }
    }

    fn device_read_or_panic(&self) -> Vec<f32> {
        match self.to_cpu() {
            Ok(t) => t.host_data().into_owned(),
            // documented on `data`: a device fault, not a caller's mistake
            Err(e) => panic!(
                "reading a {} tensor of shape {:?} to the host failed: {e} (use try_to_vec to handle this)",
                self.device(),
                self.shape()
            ),
        }
    }

    /// The elements in row-major order (a device tensor is read to the host; see
    /// [`Tensor::data`] for the one panic and [`Tensor::try_to_vec`] for the fallible form).
    pub fn to_vec(&self) -> Vec<f32> {
        crate::runtime::capture::note_host_access(self, "to_vec");
        self.host_data().into_owned()
    }

    /// A contiguous tensor with the same values (this one if already contiguous).
    /// Not recorded on the tape: use it on values, not inside differentiated code.
    pub fn contiguous(&self) -> Tensor {
        crate::runtime::capture::note_host_access(self, "contiguous");
        // device tensors are always dense: device kernels and uploads produce contiguous
        // buffers and the view ops that make strided layouts run on the host only
        if self.is_contiguous() || self.device_buffer().is_some() {
            self.clone()
        } else {
            self.host_copy()
        }
    }

    /// A canonical host copy of this host tensor's elements, into a buffer from the storage
    /// cache (already mapped), which the new tensor gives back when dropped.
    fn host_copy(&self) -> Tensor {
        let mut v = crate::runtime::buffers::take_overwritten(self.numel());
        v.clear();
        self.0
            .layout
            .gather_into_unchecked(self.storage_slice(), &mut v);
        Tensor::from_parts(v, self.shape().to_vec())
    }

    /// This tensor if it is canonical (row-major from offset 0 over a storage of exactly its
    /// elements), else a canonical copy. "Contiguous" is weaker: a dense slice of a larger
    /// storage is contiguous but shares that storage; kernels whose results the contracts
    /// declare canonical (every VJP's gradients) return this form.
    pub fn canonical(&self) -> Tensor {
        let host_canonical = self.device_buffer().is_none()
            && self.is_contiguous()
            && self.0.layout.offset == 0
            && self.storage_slice().len() == self.numel();
        if host_canonical || self.device_buffer().is_some() {
            return self.clone();
        }
        self.host_copy()
    }

    /// The element at a multi-index.
    pub fn get(&self, index: &[usize]) -> Result<f32> {
        crate::runtime::capture::note_host_access(self, "get");
        let l = &self.0.layout;
        if index.len() != l.shape.len() || index.iter().zip(&l.shape).any(|(i, d)| i >= d) {
            return Err(Error::OutOfBounds {
                index: index.to_vec(),
                shape: l.shape.clone(),
            });
        }
        match &self.0.storage {
            Storage::Host(v) => Ok(v[l.position(index)]),
            Storage::Device(b) => Ok(b.read()?[l.position(index)]),
        }
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::Other(format!(
                "item: expected a tensor with one element, got shape {:?}",
                self.shape()
            )));
        }
        crate::runtime::capture::note_host_access(self, "item");
        if self.device_buffer().is_some() {
            return Ok(self.to_cpu()?.host_data()[0]);
        }
        Ok(self.host_data()[0])
    }

    /// Whether gradients flow to this tensor (a leaf marked by [`Tensor::requires_grad`] or
    /// the result of a recorded op).
    pub fn is_tracked(&self) -> bool {
        self.0.requires_grad || self.0.grad_fn.is_some()
    }

    /// Whether this is a leaf that asked for gradients.
    pub fn requires_grad_flag(&self) -> bool {
        self.0.requires_grad
    }

    /// This tensor's values as a leaf that requires gradients (same storage). A tensor that
    /// already takes part in gradients — a leaf that requires them, or the result of a
    /// recorded op — is returned as it is, as PyTorch's `requires_grad_()` leaves it: cutting
    /// a recorded result off the tape here gave its inputs no gradient. An untracked tensor
    /// becomes a new leaf with its own id, so two leaves made from handles of one tensor
    /// (two layers built from one loaded weight) get a gradient each, not one shared entry.
    pub fn requires_grad(self) -> Tensor {
        if self.is_tracked() {
            return self;
        }
        let inner = TensorImpl {
            id: TensorId::fresh(),
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            requires_grad: true,
            grad_fn: None,
        };
        Tensor(Arc::new(inner))
    }

    /// The same values cut from the tape: a new untracked handle sharing storage.
    pub fn detach(&self) -> Tensor {
        crate::runtime::capture::note_host_access(self, "detach");
        self.view(self.0.layout.clone())
    }

    /// The op that produced this tensor and the provider/capsule that ran it, if recorded.
    pub fn producer(&self) -> Option<(&crate::graph::Op, &str)> {
        self.0.grad_fn.as_ref().map(|n| (&n.op, n.capsule()))
    }

    /// Replaces this handle's values by `values` (same shape and device), keeping its id and
    /// `requires_grad` flag and dropping any tape link: how optimizers write an update that
    /// was computed out of place by ops (`runtime::apply_update`).
    pub fn assign(&mut self, values: Tensor) -> Result<()> {
        if values.shape() != self.shape() || values.device() != self.device() {
            return Err(Error::Other(format!(
                "assign: a {} tensor of shape {:?} cannot take values of shape {:?} on {}",
                self.device(),
                self.shape(),
                values.shape(),
                values.device()
            )));
        }
        self.take_storage_of(&values);
        Ok(())
    }

    /// Takes `other`'s storage and layout, keeping this handle's id and `requires_grad` flag
    /// and dropping its tape link.
    fn take_storage_of(&mut self, other: &Tensor) {
        let inner = TensorImpl {
            id: self.0.id,
            storage: other.0.storage.clone(),
            layout: other.0.layout.clone(),
            requires_grad: self.0.requires_grad,
            grad_fn: None,
        };
        self.0 = Arc::new(inner);
    }

    /// Replaces this handle's storage by `moved`'s, a copy of its values on another device
    /// (same shape), keeping its id and flags: how a model's parameters move.
    pub(crate) fn assign_moved(&mut self, moved: Tensor) -> Result<()> {
        if moved.shape() != self.shape() {
            return Err(Error::Other(format!(
                "to_device: moved a tensor of shape {:?} into one of shape {:?}",
                moved.shape(),
                self.shape()
            )));
        }
        self.take_storage_of(&moved);
        Ok(())
    }

    /// Updates the values in place when this handle owns its storage alone and is contiguous,
    /// otherwise replaces the storage by an updated copy. The id and grad flag are kept.
    /// Used by optimizers on parameters between steps. A host function over host memory: on
    /// a device tensor the values make a round trip through the host (see
    /// [`Tensor::data`] for the one panic), and the result is stored back on the device.
    pub fn update_data(&mut self, f: impl FnOnce(&mut [f32])) {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            if inner.layout.is_contiguous()
                && inner.layout.offset == 0
                && inner.storage.len() == inner.layout.numel()
            {
                if let Storage::Host(storage) = &mut inner.storage {
                    if let Some(data) = Arc::get_mut(storage) {
                        f(data);
                        return;
                    }
                }
            }
        }
        let mut data = self.host_data().into_owned();
        f(&mut data);
        let storage = match self.device() {
            Device::Cpu => Storage::Host(Arc::new(data)),
            device => match crate::module::upload(device, &data) {
                Ok(b) => Storage::Device(b),
                // documented above: a device fault, not a caller's mistake
                Err(e) => panic!("writing an updated {device} tensor back failed: {e}"),
            },
        };
        let inner = TensorImpl {
            id: self.0.id,
            storage,
            layout: Layout::contiguous(self.shape().to_vec()),
            requires_grad: self.0.requires_grad,
            grad_fn: None,
        };
        self.0 = Arc::new(inner);
    }
}
