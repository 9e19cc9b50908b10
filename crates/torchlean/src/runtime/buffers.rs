//! The compiled executor's buffer pool: the memory side of its static plan.
//!
//! While a compiled graph runs, native kernels take their output (and scratch) buffers from
//! this thread's pool, and the executor gives every value back to the pool right after its
//! last use (liveness from the plan). From the second run on, a graph whose shapes do not
//! change allocates nothing: every buffer is one it allocated in the first run. A value
//! still referenced elsewhere (a graph output, a parameter, a view) is never recycled: only
//! a tensor that owns its storage alone can be taken back, which Rust's ownership checks.
//! Outside a compiled run the pool is absent; kernels then take large buffers from the
//! storage cache below, and allocate otherwise.
//!
//! **Storage cache** (eager mode; like PyTorch's caching allocator): when the last tensor
//! handle of a storage of at least [`CACHE_MIN_ELEMENTS`] elements is dropped, its buffer is
//! kept (up to [`CACHE_MAX_BYTES`] in all, by element count) instead of being returned to the
//! system allocator, and the next kernel output of that element count reuses it. Without it,
//! every large intermediate of an eager step was a fresh mapping from the kernel: page
//! faults and kernel zeroing took a fifth to a third of a transformer training step, and the
//! share moved with the allocator's heap state from build to build. [`release_cached`]
//! empties the cache.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

/// Counters of one pool (for tests and reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out from the pool.
    pub reused: u64,
    /// Buffers that had to be allocated.
    pub allocated: u64,
    /// Buffers given back.
    pub recycled: u64,
}

/// Free buffers by length.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: HashMap<usize, Vec<Vec<f32>>>,
    stats: PoolStats,
}

impl BufferPool {
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Takes back the buffer of a tensor that owns it alone (e.g. a gradient the caller is
    /// done with), so the next run reuses it.
    pub fn give_back(&mut self, t: Tensor) {
        if let Some(v) = t.into_storage() {
            self.stats.recycled += 1;
            self.free.entry(v.len()).or_default().push(v);
        }
    }
}

thread_local! {
    static ACTIVE: RefCell<Option<BufferPool>> = const { RefCell::new(None) };
}

/// Storages at least this large (in f32 elements, 64 KiB) go to the storage cache when freed;
/// smaller ones are cheap for the system allocator.
pub const CACHE_MIN_ELEMENTS: usize = 1 << 14;
/// The most bytes the storage cache keeps.
pub const CACHE_MAX_BYTES: usize = 256 << 20;

#[derive(Default)]
struct StorageCache {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

static CACHE: Mutex<Option<StorageCache>> = Mutex::new(None);

/// Keeps a freed storage for reuse (dropped instead when the cache is full).
pub(crate) fn cache_release(v: Vec<f32>) {
    let bytes = v.capacity() * std::mem::size_of::<f32>();
    if let Ok(mut guard) = CACHE.lock() {
        let cache = guard.get_or_insert_with(StorageCache::default);
        if cache.bytes + bytes <= CACHE_MAX_BYTES {
            cache.bytes += bytes;
            cache.free.entry(v.len()).or_default().push(v);
        }
    }
}

fn cache_take(n: usize) -> Option<Vec<f32>> {
    if n < CACHE_MIN_ELEMENTS {
        return None;
    }
    let mut guard = CACHE.lock().ok()?;
    let cache = guard.as_mut()?;
    let v = cache.free.get_mut(&n)?.pop()?;
    cache.bytes -= v.capacity() * std::mem::size_of::<f32>();
    Some(v)
}

/// Returns every buffer held by the storage cache to the system allocator; returns the
/// number of bytes released.
pub fn release_cached() -> usize {
    CACHE
        .lock()
        .ok()
        .and_then(|mut g| g.take())
        .map_or(0, |c| c.bytes)
}

/// Bytes currently held by the storage cache.
pub fn cached_bytes() -> usize {
    CACHE
        .lock()
        .ok()
        .and_then(|g| g.as_ref().map(|c| c.bytes))
        .unwrap_or(0)
}

/// Kernel outputs of at least this many bytes (64 MiB) are checked before the kernel runs
/// ([`check_output`]); smaller ones are not worth an extra allocation.
pub const CHECKED_OUTPUT_BYTES: u64 = 64 << 20;

fn oom(what: &str, bytes: u64) -> Error {
    Error::OutOfMemory {
        what: what.to_string(),
        bytes,
    }
}

/// An empty vector with room for `n` values, reserved fallibly: a request the process has no
/// memory for is an [`Error::OutOfMemory`] naming `what` and the bytes, not an abort.
///
/// Without a limit, Linux overcommits: a reservation of more than the machine has succeeds,
/// and touching its pages gets the process killed (or swaps it to a halt). So a request of
/// [`CHECKED_OUTPUT_BYTES`] or more that exceeds what the system reports it can still give
/// (`MemAvailable` + `SwapFree`, read from /proc/meminfo at each such request) is refused
/// the same way, before anything is reserved.
pub fn try_with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    if bytes >= CHECKED_OUTPUT_BYTES && system_available().is_some_and(|avail| bytes > avail) {
        return Err(oom(what, bytes));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| oom(what, bytes))?;
    Ok(v)
}

/// `n` copies of `value`, allocated fallibly (see [`try_with_capacity`]).
pub fn try_filled(n: usize, value: f32, what: &str) -> Result<Vec<f32>> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// Checks, before a kernel runs, that an output of `n` f32 elements can be allocated: an
/// output of [`CHECKED_OUTPUT_BYTES`] or more is reserved fallibly and released (a kernel
/// allocates its output infallibly, deep inside, where an allocation failure aborts the
/// process). Under a memory limit (`ulimit -v`, a cgroup without overcommit) a request
/// beyond it becomes an [`Error::OutOfMemory`] naming the op and the bytes.
/// Without a limit, the system's available memory bounds it (see [`try_with_capacity`]).
pub fn check_output(op: &str, n: usize) -> Result<()> {
    let bytes = (n as u64).saturating_mul(4);
    if bytes < CHECKED_OUTPUT_BYTES {
        return Ok(());
    }
    if cache_has(n) {
        return Ok(());
    }
    let probe: Vec<f32> = try_with_capacity(n, &format!("the output of op `{op}`"))?;
    drop(probe);
    Ok(())
}

/// [`check_output`] for the cotangents a VJP kernel is about to allocate: one of each input's
/// size where `needs[i]` (every input when `needs` is `None`, for kernels that compute all).
pub fn check_gradients(
    op: &str,
    inputs: &[&crate::tensor::Tensor],
    needs: Option<&[bool]>,
) -> Result<()> {
    for (i, t) in inputs.iter().enumerate() {
        if needs.is_none_or(|n| n.get(i).copied().unwrap_or(true)) {
            check_output(&format!("{op} (gradient of input {i})"), t.numel())?;
        }
    }
    Ok(())
}

/// The bytes the system can still give a process (Linux: `MemAvailable` + `SwapFree` from
/// /proc/meminfo), when known.
pub fn system_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib.saturating_mul(1024))
    };
    Some(field("MemAvailable:")?.saturating_add(field("SwapFree:").unwrap_or(0)))
}

fn cache_has(n: usize) -> bool {
    CACHE
        .lock()
        .ok()
        .and_then(|g| {
            g.as_ref()
                .map(|c| c.free.get(&n).is_some_and(|v| !v.is_empty()))
        })
        .unwrap_or(false)
}

/// A zero-filled buffer of `n` elements: from the active pool when there is one.
pub(crate) fn take_zeroed(n: usize) -> Vec<f32> {
    take(n, true)
}

/// A buffer of `n` elements for a kernel that writes every element before reading any: from
/// the active pool when there is one, then with the stale values of its previous use (no
/// zero fill); freshly allocated ones are zeroed.
pub(crate) fn take_overwritten(n: usize) -> Vec<f32> {
    take(n, false)
}

fn take(n: usize, zero: bool) -> Vec<f32> {
    let pooled = ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        let pool = a.as_mut()?;
        match pool.free.get_mut(&n).and_then(Vec::pop) {
            Some(mut v) => {
                pool.stats.reused += 1;
                if zero {
                    v.fill(0.0);
                }
                Some(v)
            }
            None => {
                pool.stats.allocated += 1;
                None
            }
        }
    });
    if let Some(v) = pooled {
        return v;
    }
    match cache_take(n) {
        Some(mut v) => {
            if zero {
                v.fill(0.0);
            }
            v
        }
        None => vec![0.0; n],
    }
}

/// Gives a tensor's buffer back to the active pool if the tensor owns it alone.
pub(crate) fn recycle(t: Tensor) {
    if let Some(v) = t.into_storage() {
        ACTIVE.with(|a| {
            if let Some(pool) = a.borrow_mut().as_mut() {
                pool.stats.recycled += 1;
                pool.free.entry(v.len()).or_default().push(v);
            }
        });
    }
}

/// Whether a compiled run's buffer pool is active on this thread.
pub(crate) fn pool_active() -> bool {
    ACTIVE.with(|a| a.try_borrow().map(|a| a.is_some()).unwrap_or(true))
}

/// Makes `pool` this thread's active pool until dropped, then puts it back.
pub(crate) struct ActivePool<'a> {
    home: &'a Mutex<BufferPool>,
}

impl<'a> ActivePool<'a> {
    pub(crate) fn enter(home: &'a Mutex<BufferPool>) -> ActivePool<'a> {
        let pool = std::mem::take(&mut *home.lock().unwrap_or_else(|e| e.into_inner()));
        ACTIVE.with(|a| *a.borrow_mut() = Some(pool));
        ActivePool { home }
    }
}

impl Drop for ActivePool<'_> {
    fn drop(&mut self) {
        if let Some(pool) = ACTIVE.with(|a| a.borrow_mut().take()) {
            *self.home.lock().unwrap_or_else(|e| e.into_inner()) = pool;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request for more than the system can still give is refused before anything is
    /// reserved, with what it was for and the bytes: under Linux's default overcommit a
    /// reservation a little above `MemAvailable` succeeds, and the pages it would touch get
    /// the process killed instead (found by a hostile-input audit: a 1 KB graph asking for
    /// outputs of 8 GiB each took the whole machine).
    #[test]
    fn a_request_beyond_the_available_memory_is_refused() {
        let Some(avail) = system_available() else {
            eprintln!("skipped: the system does not report its available memory");
            return;
        };
        let n = (avail / 4 + (64 << 20)) as usize; // 256 MiB more than available
        match try_with_capacity::<f32>(n, "a test buffer") {
            Err(Error::OutOfMemory { what, bytes }) => {
                assert_eq!(what, "a test buffer");
                assert_eq!(bytes, n as u64 * 4);
            }
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("{} bytes reserved with {avail} available", n * 4),
        }
        // small requests never read /proc/meminfo's verdict
        assert!(try_with_capacity::<f32>(1024, "small").is_ok());
    }
}
