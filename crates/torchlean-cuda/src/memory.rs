//! Device memory: [`CudaBuffer`] (the module's [`DeviceBuffer`]) and the caching allocator.
//!
//! Freed buffers go back to a pool keyed by their rounded size; the next request of that size
//! reuses one, so a warm training loop makes no device allocation per op. Statistics (live and
//! peak bytes, driver allocations, cache hits) are reported in the backend report's JSON.
//! Out of memory: the pool is emptied and the allocation tried once more; a second failure
//! is [`torchlean::Error::OutOfMemory`] naming the bytes asked for and the bytes free.
//!
//! **Device graphs** (`graph.rs`): while a graph is being recorded, allocations come from
//! the graph's own free buffers or the cache, never from the driver (an allocation would be
//! recorded into the graph). The recorder first fills the cache to a census of a real run
//! (the most buffers of each size live at once); a request the cache still cannot serve is
//! counted as a miss and fails, and the recorder reserves the missing buffers and records
//! again. A buffer handed out while
//! recording belongs to that graph: dropped, it returns to the graph's free list, never to
//! the cache, so no other tensor can get memory that a replay writes. When the graph is
//! dropped, its buffers go back to the cache.
//!
//! Owns: allocation, reuse and statistics. Must not launch kernels (a read to the host has
//! the launch queue launched first: `queue.rs`).

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
    /// Bytes held free by recorded device graphs (their static buffers not in use).
    pub graph_bytes: usize,
    /// Reads of device values to the host through `DeviceBuffer::read` (each waits for the
    /// stream). Not counted: explicit synchronizations, and the index kernels' pending
    /// checks, which copy a 4-byte flag each once the stream is idle (a flag found set reads
    /// the call's index through `read`, counted).
    pub host_reads: u64,
}

impl MemoryStats {
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "live_bytes": self.live_bytes,
            "peak_bytes": self.peak_bytes,
            "cached_bytes": self.cached_bytes,
            "device_allocations": self.device_allocations,
            "cache_hits": self.cache_hits,
            "graph_bytes": self.graph_bytes,
            "host_reads": self.host_reads,
        })
    }
}

type FreeLists = HashMap<usize, Vec<CudaSlice<f32>>>;

#[derive(Default)]
struct PoolState {
    free: FreeLists,
    stats: MemoryStats,
    /// The free buffers of each live device graph, by graph id.
    graphs: HashMap<u64, FreeLists>,
    /// The graph being recorded, if any.
    recording: Option<u64>,
    /// Requests the cache could not serve while recording: bucket → count.
    misses: HashMap<usize, usize>,
    /// While a census runs: per bucket, the buffers it allocated that are live, and the
    /// most that were live at once.
    census: Option<HashMap<usize, (usize, usize)>>,
    next_graph: u64,
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
    /// out-of-memory error; formatted only then).
    pub fn alloc(
        self: &Arc<Pool>,
        len: usize,
        what: &dyn std::fmt::Display,
    ) -> torchlean::Result<CudaBuffer> {
        let cap = rounded(len);
        let bytes = cap * 4;
        let (reused, home, counted) = {
            let mut s = self.lock();
            let home = s.recording;
            let counted = match s.census.as_mut() {
                Some(c) => {
                    let e = c.entry(cap).or_default();
                    e.0 += 1;
                    e.1 = e.1.max(e.0);
                    true
                }
                None => false,
            };
            let own = home
                .and_then(|g| s.graphs.get_mut(&g))
                .and_then(|f| f.get_mut(&cap))
                .and_then(Vec::pop);
            if own.is_some() {
                s.stats.graph_bytes -= bytes;
                (own, home, counted)
            } else {
                let slice = s.free.get_mut(&cap).and_then(|v| v.pop());
                if slice.is_some() {
                    s.stats.cache_hits += 1;
                    s.stats.cached_bytes -= bytes;
                } else if home.is_some() {
                    *s.misses.entry(cap).or_default() += 1;
                    return Err(torchlean::Error::DeviceFailure {
                        op: what.to_string(),
                        device: "cuda".into(),
                        reason: format!(
                            "no cached buffer of {bytes} bytes while recording a device graph"
                        ),
                    });
                }
                (slice, home, counted)
            }
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
            home,
            counted,
            attachment: std::sync::OnceLock::new(),
        })
    }

    /// Starts counting, per bucket, the most buffers live at once among those allocated from
    /// now on (a run before a recording: see `graph.rs`).
    pub(crate) fn begin_census(&self) {
        self.lock().census = Some(HashMap::new());
    }

    /// Stops counting; returns bucket → the most buffers that were live at once.
    pub(crate) fn end_census(&self) -> HashMap<usize, usize> {
        let census = self.lock().census.take().unwrap_or_default();
        census
            .into_iter()
            .map(|(cap, (_, peak))| (cap, peak))
            .collect()
    }

    /// Allocates buffers into the cache until it holds at least `count` free buffers of each
    /// bucket (so that a recording of a run with that census needs nothing from the driver).
    pub(crate) fn fill_cache(&self, counts: &HashMap<usize, usize>) -> torchlean::Result<()> {
        for (&cap, &count) in counts {
            let held = self.lock().free.get(&cap).map_or(0, Vec::len);
            let missing = count.saturating_sub(held);
            self.reserve(&HashMap::from([(cap, missing)]))?;
        }
        Ok(())
    }

    /// Starts recording a device graph: allocations from now on belong to it. Returns its id.
    pub(crate) fn begin_recording(&self) -> u64 {
        let mut s = self.lock();
        s.next_graph += 1;
        let id = s.next_graph;
        s.graphs.insert(id, FreeLists::new());
        s.recording = Some(id);
        s.misses.clear();
        id
    }

    /// Stops recording; returns the requests the cache could not serve (bucket → count).
    pub(crate) fn end_recording(&self) -> HashMap<usize, usize> {
        let mut s = self.lock();
        s.recording = None;
        std::mem::take(&mut s.misses)
    }

    /// Puts `count` new buffers of each bucket in the cache (for a recording that missed).
    pub(crate) fn reserve(&self, misses: &HashMap<usize, usize>) -> torchlean::Result<()> {
        for (&cap, &count) in misses {
            for _ in 0..count {
                let slice = self.fresh(cap, &"a device graph's buffers")?;
                let mut s = self.lock();
                s.stats.cached_bytes += cap * 4;
                s.free.entry(cap).or_default().push(slice);
            }
        }
        Ok(())
    }

    /// Gives graph `id`'s free buffers back to the cache (the graph is gone); its buffers
    /// still in use go to the cache when dropped.
    pub(crate) fn forget_graph(&self, id: u64) {
        let mut s = self.lock();
        if let Some(lists) = s.graphs.remove(&id) {
            for (cap, slices) in lists {
                s.stats.graph_bytes -= cap * 4 * slices.len();
                s.stats.cached_bytes += cap * 4 * slices.len();
                s.free.entry(cap).or_default().extend(slices);
            }
        }
    }

    fn fresh(&self, cap: usize, what: &dyn std::fmt::Display) -> torchlean::Result<CudaSlice<f32>> {
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

    fn give_back(&self, slice: CudaSlice<f32>, home: Option<u64>, counted: bool) {
        let cap = slice.len();
        let mut s = self.lock();
        s.stats.live_bytes -= cap * 4;
        if let Some(e) = s
            .census
            .as_mut()
            .filter(|_| counted)
            .and_then(|c| c.get_mut(&cap))
        {
            e.0 = e.0.saturating_sub(1);
        }
        let state = &mut *s;
        match home.and_then(|g| state.graphs.get_mut(&g)) {
            Some(lists) => {
                state.stats.graph_bytes += cap * 4;
                lists.entry(cap).or_default().push(slice);
            }
            None => {
                state.stats.cached_bytes += cap * 4;
                state.free.entry(cap).or_default().push(slice);
            }
        }
    }
}

/// `len` f32 elements of device memory from the pool (the pool's bucket may be larger).
pub struct CudaBuffer {
    /// Always `Some` until dropped (taken by `Drop` to return it to the pool).
    slice: Option<CudaSlice<f32>>,
    len: usize,
    pool: Arc<Pool>,
    /// The device graph that owns this buffer (allocated while it was recorded), if any.
    home: Option<u64>,
    /// Whether it was allocated during a census (see [`Pool::begin_census`]).
    counted: bool,
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
            self.pool.give_back(s, self.home, self.counted);
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
        // the queued calls (one of which may write this buffer) run before the copy, which
        // `context` does; its guard keeps a recording on another thread from starting
        // before the copy is done (and waits for one to end)
        let _in_use = crate::device::context()?;
        crate::graph::refuse_while_recording("read to host")?;
        let stream = &self.pool.stream;
        let view = self.slice().slice(0..self.len);
        self.pool.lock().stats.host_reads += 1;
        let values = stream
            .clone_dtoh(&view)
            .map_err(|e| crate::device::failure("read to host", e))?;
        // the stream is synchronized now: the checks of the calls launched before this read
        // (an invalid index) fail it rather than hand over values computed after them
        crate::graph::run_pending()?;
        Ok(values)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
