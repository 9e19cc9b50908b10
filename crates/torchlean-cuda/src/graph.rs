//! Device graphs: recording the work of a closure as a CUDA Graph and replaying it.
//!
//! [`record`] puts the module's stream in capture mode (thread-local: a call on this thread
//! that would synchronize or allocate from the driver fails instead of running), lets the
//! pool hand out only cached buffers and keep them for the graph (`memory.rs`), runs the
//! closure — whose kernels are recorded, not executed — and instantiates the result. Before
//! recording, the closure runs once for real under a census of the pool (the most buffers of
//! each size live at once), and the cache is filled to that census, so the recording finds
//! every buffer it asks for; a recording that still missed one (the closure allocated
//! differently the second time) reserves what it missed and records again.
//!
//! Work that moves values between host and device (a copy to the host, an upload from
//! pageable host memory) is refused while recording ([`refuse_while_recording`]), so such a
//! plan fails to record, with a reason, instead of recording a copy of stale host memory. A
//! kernel that checks its call on the host after the device ran it (the index kernels'
//! invalid-index flag) hands the check to [`check_at_next_read`]: the check runs at the next
//! read of device values to the host (or explicit synchronization), which waits for the
//! device anyway — so a call costs no synchronization of its own, and a training step on the
//! device still reads one value. While recording, the check is kept by the graph instead and
//! handed to the same pending list after every replay, so a replay with an invalid index
//! fails with the same error as a direct call, at the same point (the next read).
//!
//! Owns: capture mode, instantiation, replay. Must not plan, gate or choose kernels.

use crate::device::{context, failure};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use torchlean::module::DeviceGraph;

/// Whether a graph is being recorded now.
static RECORDING: AtomicBool = AtomicBool::new(false);

/// A check of a call, run on the host after the device ran the call (it may read device
/// memory: it runs when the stream has been synchronized anyway).
pub type Check = Arc<dyn Fn() -> torchlean::Result<()> + Send + Sync>;

/// The checks handed over while the current graph is recorded.
static DEFERRED: Mutex<Vec<Check>> = Mutex::new(Vec::new());

/// The checks of calls launched since the last read to the host, in launch order.
static PENDING: Mutex<Vec<Check>> = Mutex::new(Vec::new());

/// The most checks kept pending: a program that launches more index kernels than this
/// without reading anything runs them then (one synchronization per this many calls).
pub const MAX_PENDING: usize = 256;

fn locked(list: &'static Mutex<Vec<Check>>) -> std::sync::MutexGuard<'static, Vec<Check>> {
    // a poisoned list only means a panic while pushing; the list itself is whole
    list.lock().unwrap_or_else(|p| p.into_inner())
}

fn deferred() -> std::sync::MutexGuard<'static, Vec<Check>> {
    locked(&DEFERRED)
}

/// Hands `check` to the next read of device values to the host ([`run_pending`]), or, while
/// a graph is being recorded, to every replay of that graph (each replay then hands it to
/// the next read). Runs the pending checks now when [`MAX_PENDING`] are waiting.
pub fn check_at_next_read(check: Check) -> torchlean::Result<()> {
    if RECORDING.load(Ordering::Acquire) {
        deferred().push(check);
        return Ok(());
    }
    pend(std::iter::once(check))
}

fn pend(checks: impl IntoIterator<Item = Check>) -> torchlean::Result<()> {
    let full = {
        let mut pending = locked(&PENDING);
        pending.extend(checks);
        pending.len() >= MAX_PENDING
    };
    if full {
        run_pending()
    } else {
        Ok(())
    }
}

/// How many checks wait for the next read.
pub fn pending_checks() -> usize {
    locked(&PENDING).len()
}

/// Runs the pending checks in launch order, after the stream was synchronized (a read to the
/// host or an explicit synchronization): the first failing check's error, and the list is
/// empty afterwards either way. A failure is reported once, at that read — not sticky: work
/// launched before the read already ran on the invalid call's output (a training step reads
/// its loss before the optimizer update, so a step with an invalid index updates nothing),
/// and a later read returns values again.
pub fn run_pending() -> torchlean::Result<()> {
    let checks = std::mem::take(&mut *locked(&PENDING));
    checks.iter().try_for_each(|check| check())
}

/// How many times a recording is retried after reserving the buffers it missed.
const ATTEMPTS: usize = 8;

/// Whether a graph is being recorded now (its work does not run while it is recorded).
pub fn is_recording() -> bool {
    RECORDING.load(Ordering::Acquire)
}

/// An error for `op` when it would read device values on the host (or upload pageable host
/// memory) while a graph is being recorded: such work cannot be part of a replay.
pub fn refuse_while_recording(op: &str) -> torchlean::Result<()> {
    if RECORDING.load(Ordering::Acquire) {
        return Err(torchlean::Error::DeviceFailure {
            op: op.to_string(),
            device: "cuda".into(),
            reason: "it moves values between host and device, which a device graph cannot record"
                .into(),
        });
    }
    Ok(())
}

/// A recorded, instantiated graph and the buffers it owns.
pub struct RecordedGraph {
    /// Declared before `id`'s release so that it is destroyed first.
    graph: CudaGraph,
    nodes: usize,
    id: u64,
    pool: Arc<crate::memory::Pool>,
    /// The checks of recorded calls, handed to the next read after every replay.
    checks: Vec<Check>,
}

// SAFETY: a CUgraphExec may be used from any thread as long as uses do not overlap; every use
// goes through `&mut self` (`replay`) or `Drop`, which Rust serializes.
unsafe impl Send for RecordedGraph {}

impl Drop for RecordedGraph {
    fn drop(&mut self) {
        // `graph` is dropped after this body runs; no replay can follow, and a replay already
        // launched is ordered before any later use of these buffers on the one stream
        self.pool.forget_graph(self.id);
    }
}

impl RecordedGraph {
    /// Whether a check of this graph (from an earlier replay) still waits for a read.
    fn checks_pending(&self) -> bool {
        let pending = locked(&PENDING);
        self.checks
            .iter()
            .any(|c| pending.iter().any(|p| Arc::ptr_eq(c, p)))
    }
}

impl DeviceGraph for RecordedGraph {
    fn settle(&mut self) -> torchlean::Result<()> {
        // the checks of the previous replay read its flag and index buffers — graph inputs
        // among them (an index tensor given to the graph as is): they run before the caller
        // rewrites those inputs, or they would judge the next step's indices
        if self.checks_pending() {
            run_pending()?;
        }
        Ok(())
    }
    fn replay(&mut self) -> torchlean::Result<()> {
        // a replay reuses the recorded flag and index buffers (and zeroes the flag): the
        // checks of the previous replay must run before this one overwrites what they read
        self.settle()?;
        // calls waiting in the launch queue come first on the stream (`context` launches
        // them); the guard keeps a recording on another thread from starting meanwhile
        let _in_use = context()?;
        self.graph
            .launch()
            .map_err(|e| failure("device graph replay", e))?;
        pend(self.checks.iter().cloned())
    }
    fn describe(&self) -> String {
        format!("a CUDA Graph of {} nodes", self.nodes)
    }
}

/// Resets the recording flag and the pool's recording state however `work` ends.
struct Recording<'a> {
    pool: &'a crate::memory::Pool,
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        RECORDING.store(false, Ordering::Release);
        self.pool.end_recording();
    }
}

/// Records the device work `work` launches (see the module docs).
pub fn record(work: &mut dyn FnMut() -> torchlean::Result<()>) -> torchlean::Result<RecordedGraph> {
    // every other thread's use of the context waits until this recording ends (its work
    // would otherwise be recorded, its reads refused, its buffers the graph's)
    let _alone = crate::exclusive::Exclusive::begin()?;
    let in_use = context()?;
    let cx = &*in_use;
    cx.pool.begin_census();
    let ran = work();
    let census = cx.pool.end_census();
    ran?;
    cx.pool.fill_cache(&census)?;
    // the census run's small maps may wait in the launch queue: their launch (a copy of its
    // table from host memory) cannot be part of the graph
    cx.launch_queued()?;
    for _ in 0..ATTEMPTS {
        let id = cx.pool.begin_recording();
        deferred().clear();
        let guard = Recording { pool: &cx.pool };
        RECORDING.store(true, Ordering::Release);
        let began = cx
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        if let Err(e) = began {
            drop(guard);
            cx.pool.forget_graph(id);
            return Err(failure("device graph recording", e));
        }
        let ran = work();
        let ended = cx.stream.end_capture(CUgraphInstantiate_flags(0));
        // the guard clears the recording flag and the pool's recording state
        let misses = cx.pool.end_recording();
        drop(guard);
        let checks = std::mem::take(&mut *deferred());
        if !misses.is_empty() {
            drop(checks);
            drop(ended);
            cx.pool.forget_graph(id);
            cx.pool.reserve(&misses)?;
            continue;
        }
        let graph = match (ran, ended) {
            (Ok(()), Ok(Some(graph))) => graph,
            (Err(e), _) => {
                cx.pool.forget_graph(id);
                return Err(e);
            }
            (Ok(()), Err(e)) => {
                cx.pool.forget_graph(id);
                return Err(failure("device graph recording", e));
            }
            (Ok(()), Ok(None)) => {
                cx.pool.forget_graph(id);
                return Err(failure("device graph recording", "nothing was recorded"));
            }
        };
        let mut nodes = 0usize;
        // SAFETY: `graph` holds a live CUgraph; a null node array asks only for the count,
        // written to `nodes`, a valid out pointer.
        unsafe {
            cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes)
        };
        graph
            .upload()
            .map_err(|e| failure("device graph upload", e))?;
        return Ok(RecordedGraph {
            graph,
            nodes,
            id,
            pool: Arc::clone(&cx.pool),
            checks,
        });
    }
    Err(failure(
        "device graph recording",
        format!("the buffer cache still missed buffers after {ATTEMPTS} reservations"),
    ))
}
