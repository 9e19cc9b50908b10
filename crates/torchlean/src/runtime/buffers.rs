//! The compiled executor's buffer pool: the memory side of its static plan.
//!
//! While a compiled graph runs, native kernels take their output (and scratch) buffers from
//! this thread's pool, and the executor gives every value back to the pool right after its
//! last use (liveness from the plan). From the second run on, a graph whose shapes do not
//! change allocates nothing: every buffer is one it allocated in the first run. A value
//! still referenced elsewhere (a graph output, a parameter, a view) is never recycled: only
//! a tensor that owns its storage alone can be taken back, which Rust's ownership checks.
//! Outside a compiled run the pool is absent and kernels allocate normally.

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
    pooled.unwrap_or_else(|| vec![0.0; n])
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
