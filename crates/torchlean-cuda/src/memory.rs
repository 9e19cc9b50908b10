//! Device memory: [`CudaBuffer`] (the module's [`DeviceBuffer`]) and the caching allocator.
//!
//! Freed buffers go back to a pool keyed by their rounded size; the next request of that size
//! reuses one, so a warm training loop makes no device allocation per op. Statistics (live and
//! peak bytes, driver allocations, cache hits) are reported in the backend report's JSON.
//! Out of memory: the pool is emptied and the allocation tried once more; a second failure
//! is [`torchlean::Error::OutOfMemory`] naming the bytes asked for and the bytes free.
//!
//! Owns: allocation, reuse and statistics. Must not launch kernels.

use cudarc::driver::{CudaSlice, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use torchlean::backend::Device;
use torchlean::tensor::{DType, DeviceBuffer};

/// Allocation granularity in elements (1 KiB): sizes are rounded up to a multiple, so that
/// buffers of nearby sizes share a pool bucket.
const GRANULE: usize = 256;

/// Statistics of the caching allocator.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryStats {
    /// Bytes held by live buffers.
    pub live_bytes: usize,
    /// The largest `live_bytes` seen.
    pub peak_bytes: usize,
    /// Bytes held in the pool for reuse.
    pub cached_bytes: usize,
    /// Allocations served by the driver.
    pub device_allocations: u64,
    /// Allocations served from the pool.
    pub cache_hits: u64,
}

impl MemoryStats {
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "live_bytes": self.live_bytes,
            "peak_bytes": self.peak_bytes,
            "cached_bytes": self.cached_bytes,
            "device_allocations": self.device_allocations,
            "cache_hits": self.cache_hits,
        })
    }
}

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<CudaSlice<f32>>>,
    stats: MemoryStats,
}

/// The caching allocator of one device (shared by every buffer it handed out).
pub struct Pool {
    stream: Arc<CudaStream>,
    state: Mutex<PoolState>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({:?})", self.stats())
    }
}

fn rounded(n: usize) -> usize {
    n.max(1).div_ceil(GRANULE) * GRANULE
}

impl Pool {
    pub fn new(stream: Arc<CudaStream>) -> Arc<Pool> {
        Arc::new(Pool {
            stream,
            state: Mutex::new(PoolState::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // a poisoned pool only means another thread panicked while holding it
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// A buffer of `len` elements with arbitrary contents (`what` names the request in an
    /// out-of-memory error).
    pub fn alloc(self: &Arc<Pool>, len: usize, what: &str) -> torchlean::Result<CudaBuffer> {
        let cap = rounded(len);
        let bytes = cap * 4;
        let reused = {
            let mut s = self.lock();
            let slice = s.free.get_mut(&cap).and_then(|v| v.pop());
            if slice.is_some() {
                s.stats.cache_hits += 1;
                s.stats.cached_bytes -= bytes;
            }
            slice
        };
        let slice = match reused {
            Some(s) => s,
            None => self.fresh(cap, what)?,
        };
        {
            let mut s = self.lock();
            s.stats.live_bytes += bytes;
            s.stats.peak_bytes = s.stats.peak_bytes.max(s.stats.live_bytes);
        }
        Ok(CudaBuffer {
            slice: Some(slice),
            len,
            pool: Arc::clone(self),
            attachment: std::sync::OnceLock::new(),
        })
    }

    fn fresh(&self, cap: usize, what: &str) -> torchlean::Result<CudaSlice<f32>> {
        // SAFETY: the contents are uninitialized device memory; every kernel of this module
        // writes all `len` elements of an output before anything reads them.
        let first = unsafe { self.stream.alloc::<f32>(cap) };
        let slice = match first {
            Ok(s) => s,
            Err(_) => {
                // give the pool's memory back to the driver and try once more
                self.release_cache();
                // SAFETY: as above.
                unsafe { self.stream.alloc::<f32>(cap) }.map_err(|e| {
                    let free = self
                        .stream
                        .context()
                        .mem_get_info()
                        .map(|(free, _)| format!("{free} bytes free on the device"))
                        .unwrap_or_else(|_| "free memory unknown".into());
                    torchlean::Error::OutOfMemory {
                        what: format!("a cuda buffer for {what} ({free}; driver: {e})"),
                        bytes: (cap * 4) as u64,
                    }
                })?
            }
        };
        self.lock().stats.device_allocations += 1;
        Ok(slice)
    }

    /// Frees every pooled buffer.
    pub fn release_cache(&self) {
        let mut s = self.lock();
        s.free.clear();
        s.stats.cached_bytes = 0;
    }

    fn give_back(&self, slice: CudaSlice<f32>) {
        let cap = slice.len();
        let mut s = self.lock();
        s.stats.live_bytes -= cap * 4;
        s.stats.cached_bytes += cap * 4;
        s.free.entry(cap).or_default().push(slice);
    }
}

/// `len` f32 elements of device memory from the pool (the pool's bucket may be larger).
pub struct CudaBuffer {
    /// Always `Some` until dropped (taken by `Drop` to return it to the pool).
    slice: Option<CudaSlice<f32>>,
    len: usize,
    pool: Arc<Pool>,
    /// What the kernel that wrote this buffer left for its VJP (set at most once).
    attachment: std::sync::OnceLock<Attachment>,
}

/// Values a forward kernel computed beside its output for the VJP of the same call (flash
/// attention's row statistics), under a key naming that call: a VJP uses them only when its
/// own call has the same key, and recomputes them otherwise.
pub struct Attachment {
    pub key: u64,
    pub values: Box<CudaBuffer>,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} f32)", self.len)
    }
}

impl CudaBuffer {
    /// The device memory (its first `len` elements are the buffer's).
    pub fn slice(&self) -> &CudaSlice<f32> {
        // invariant: `slice` is Some until Drop
        self.slice.as_ref().expect("live buffer")
    }

    pub fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        // invariant: `slice` is Some until Drop
        self.slice.as_mut().expect("live buffer")
    }

    /// Leaves `values` for the VJP of the call named `key` (ignored if one is already set).
    pub fn attach(&self, key: u64, values: CudaBuffer) {
        let _ = self.attachment.set(Attachment {
            key,
            values: Box::new(values),
        });
    }

    /// The values left for the call named `key`, if this buffer holds them.
    pub fn attached(&self, key: u64) -> Option<&CudaBuffer> {
        self.attachment
            .get()
            .filter(|a| a.key == key)
            .map(|a| &*a.values)
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Some(s) = self.slice.take() {
            self.pool.give_back(s);
        }
    }
}

impl DeviceBuffer for CudaBuffer {
    fn device(&self) -> Device {
        Device::Cuda
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self) -> torchlean::Result<Vec<f32>> {
        let stream = &self.pool.stream;
        let view = self.slice().slice(0..self.len);
        stream
            .clone_dtoh(&view)
            .map_err(|e| crate::device::failure("read to host", e))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
