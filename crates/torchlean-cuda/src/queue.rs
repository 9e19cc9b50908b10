//! The launch queue: small element-wise calls run many to a launch.
//!
//! Launching a kernel costs the host microseconds (about 4.7 µs back to back on the H200
//! machine, docs/BENCHMARKS.md), far more than the work of a 16-element add. So the forward
//! calls of the same-shape binary maps (add, sub, mul, div, maximum, minimum) and of the unary
//! maps whose output has at most [`SMALL`] elements are not launched one by one: each call
//! allocates its output at once, appends one entry to the queue (its inputs and output are
//! held by the queue until the launch is queued) and returns. One launch of `queued_maps`
//! (`kernels/elementwise.cu`: one block, the calls in queue order with a barrier between
//! them, the same per-element functions as `binary_same` and `unary_forward`, hence the same
//! bits) runs up to [`CAPACITY`] of them; a queue of one call is launched as it would have been
//! without the queue (a table costs a copy from host memory, which only several calls repay).
//!
//! **Order.** Queued calls must run before anything queued on the stream after them. The
//! queue is launched:
//! - by [`crate::device::context`], which every kernel, copy, upload, graph recording and
//!   timing span goes through before it touches the stream (the queue's own calls take
//!   [`crate::device::context_for_queue`], which does not launch it);
//! - before every read of device values to the host ([`crate::memory::CudaBuffer`]'s `read`),
//!   every synchronization, the end of every timing span, every graph replay, and before a
//!   graph recorder starts capturing (after its census run);
//! - when it holds [`CAPACITY`] calls.
//!
//! So the stream runs the queued calls before any later work, and a value computed by a
//! queued call is never read before it is written. Buffers stay valid: the queue holds the
//! tensors of its calls, so none of their memory returns to the pool (and to another tensor)
//! before the launch that uses it is queued; from then on the stream orders every reuse
//! after it. Nothing is queued while a device graph is recorded (the table is a copy from host
//! memory, which a graph cannot contain), and `TORCHLEAN_LAUNCH_QUEUE=0` turns the queue off
//! (every call launched at once). A failed launch of the queue is an error naming the queued
//! calls, returned to whatever launched the queue.
//!
//! Owns: the queue and its launch. Must not plan, gate or choose kernels: it only runs, later
//! and together, calls that `kernels::elementwise` was asked to run.

use crate::device::{failure, Context};
use crate::kernels::{buffer, output, tensor};
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use std::sync::OnceLock;
use torchlean::graph::Op;
use torchlean::{Result, Tensor};

/// The largest output (in elements) of a queued call: one block of [`THREADS`] threads runs
/// it in at most 8 steps, about what a launch of its own would take.
pub const SMALL: usize = 2048;

/// The most calls one launch runs.
pub const CAPACITY: usize = 256;

/// 32-bit words per call in the table (kernels/elementwise.cu's `QUEUE_WORDS`).
pub const WORDS: usize = 10;

/// Threads of the queue's one block.
const THREADS: u32 = 256;

/// Whether calls are queued (`TORCHLEAN_LAUNCH_QUEUE=0`: never).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHLEAN_LAUNCH_QUEUE").as_deref() != Ok("0"))
}

/// One queued call.
#[derive(Clone, Copy)]
struct Entry {
    /// `Some(p)`: a unary map with parameter p; `None`: a binary map.
    unary: Option<f32>,
    /// Its opcode (`binary_opcode` or `unary_code`).
    code: u16,
    /// Its element count (at most [`SMALL`]).
    n: u32,
    /// Device addresses of its inputs (b = a for a unary map) and output.
    a: u64,
    b: u64,
    out: u64,
}

impl Entry {
    fn words(&self) -> [f32; WORDS] {
        table_entry(self.unary, self.code, self.n, [self.a, self.b, self.out])
    }
}

/// One call's [`WORDS`] words in `queued_maps`' table, as f32 bit patterns (the pool's
/// buffers hold f32): `kind << 16 | code` (kind 1 for a unary map, whose parameter is
/// `unary`), the parameter, n, then the addresses of a, b and out, low word first. Public for
/// the CPU emulation's test of the kernel (`tests/emulated_queue.rs`).
pub fn table_entry(unary: Option<f32>, code: u16, n: u32, addresses: [u64; 3]) -> [f32; WORDS] {
    let w = f32::from_bits;
    let kind = u32::from(unary.is_some());
    let [a, b, out] = addresses.map(|x| [w(x as u32), w((x >> 32) as u32)]);
    [
        w(kind << 16 | u32::from(code)),
        unary.unwrap_or(0.0),
        w(n),
        a[0],
        a[1],
        b[0],
        b[1],
        out[0],
        out[1],
        0.0,
    ]
}

/// The calls queued and not yet launched.
#[derive(Default)]
pub struct LaunchQueue {
    entries: Vec<Entry>,
    /// The inputs and outputs of the queued calls, alive until their launch is queued.
    held: Vec<Tensor>,
    /// The queued calls' op names, in order (for an error).
    ops: Vec<&'static str>,
}

impl LaunchQueue {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The call of `op` on `inputs` (output shape `shape`) queued, when the queue takes it:
/// `Ok(None)` when it does not (the caller launches it at once).
pub fn forward(op: &Op, inputs: &[&Tensor], shape: &[usize]) -> Result<Option<Tensor>> {
    use crate::kernels::elementwise::{binary_opcode, unary_code};
    let n = torchlean::spec::numel(shape);
    if n == 0 || n > SMALL || !enabled() || crate::graph::is_recording() {
        return Ok(None);
    }
    let same = |t: &&Tensor| t.shape() == shape;
    let (unary, code) = match (binary_opcode(op), unary_code(op)) {
        (Some(code), _) if inputs.len() == 2 && inputs.iter().all(same) => (None, code),
        (None, Some((code, p))) if inputs.len() == 1 && inputs.iter().all(same) => (Some(p), code),
        _ => return Ok(None),
    };
    let Ok(code) = u16::try_from(code) else {
        return Ok(None);
    };
    let in_use = crate::device::context_for_queue()?;
    let cx = &*in_use;
    let a = buffer(op, inputs[0])?;
    let b = match inputs.get(1) {
        Some(t) => buffer(op, t)?,
        None => a,
    };
    let out = output(cx, op, n)?;
    let address = |x: &crate::memory::CudaBuffer| x.slice().device_ptr(&cx.stream).0;
    let entry = Entry {
        unary,
        code,
        // n <= SMALL
        n: n as u32,
        a: address(a),
        b: address(b),
        out: address(&out),
    };
    let out = tensor(out, shape)?;
    let mut q = cx.queue();
    q.entries.push(entry);
    q.held.extend(inputs.iter().map(|t| (*t).clone()));
    q.held.push(out.clone());
    q.ops.push(op.name());
    if q.entries.len() >= CAPACITY {
        launch(cx, &mut q)?;
    }
    Ok(Some(out))
}

/// Launches the queued calls (nothing when none is queued) and empties the queue. One call
/// alone is launched as it would have been without the queue (`binary_same` or
/// `unary_forward`): a table costs a copy from the host, which only several calls repay.
pub fn launch(cx: &Context, q: &mut LaunchQueue) -> Result<()> {
    if q.is_empty() {
        return Ok(());
    }
    let entries = std::mem::take(&mut q.entries);
    let held = std::mem::take(&mut q.held);
    let ops = std::mem::take(&mut q.ops);
    match entries.as_slice() {
        [one] => launch_one(cx, one),
        _ => launch_table(cx, &entries),
    }
    .map_err(|e| failure(&describe(&ops), e))?;
    // after the launch is queued: from now on the stream orders any reuse of these buffers
    // after it
    drop(held);
    Ok(())
}

/// One call, by the kernel that runs it without the queue.
fn launch_one(cx: &Context, e: &Entry) -> std::result::Result<(), String> {
    let (code, n) = (i32::from(e.code), i64::from(e.n));
    let f = match e.unary {
        None => &cx.functions.binary_same,
        Some(_) => &cx.functions.unary_forward,
    };
    let mut l = cx.stream.launch_builder(f);
    l.arg(&code);
    let p = e.unary.unwrap_or(0.0);
    match e.unary {
        None => l.arg(&e.a).arg(&e.b),
        Some(_) => l.arg(&p).arg(&e.a),
    };
    l.arg(&e.out).arg(&n);
    // SAFETY: the addresses are those of live pool buffers of at least n elements (`buffer`
    // checked the inputs, `output` allocated the output), held by the caller until the
    // launch is queued; device pointers are passed as their 64-bit values, the kernels'
    // (int, [float,] const float*, [const float*,] float*, long long) parameters.
    unsafe { l.launch(crate::kernels::grid((e.n as usize).div_ceil(4))) }
        .map(drop)
        .map_err(|err| err.to_string())
}

/// Several calls, by one launch of `queued_maps` over a table copied to the device.
fn launch_table(cx: &Context, entries: &[Entry]) -> std::result::Result<(), String> {
    let words: Vec<f32> = entries.iter().flat_map(Entry::words).collect();
    let count = i32::try_from(entries.len()).map_err(|e| e.to_string())?;
    let mut table = cx
        .pool
        .alloc(words.len(), &"the launch queue's table")
        .map_err(|e| e.to_string())?;
    cx.stream
        .memcpy_htod(&words, &mut table.slice_mut().slice_mut(0..words.len()))
        .map_err(|e| e.to_string())?;
    let mut l = cx.stream.launch_builder(&cx.functions.queued_maps);
    l.arg(table.slice()).arg(&count);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the table holds `count` entries of WORDS words; each names buffers of the pool
    // holding at least its n elements (`buffer` checked the inputs, `output` allocated the
    // output), held by the caller until the launch is queued. The table returns to the pool
    // when dropped below, and is reused only by work queued on the stream after this launch.
    unsafe { l.launch(cfg) }
        .map(drop)
        .map_err(|e| e.to_string())
}

/// How the report's target line describes the queue.
pub fn description() -> String {
    if enabled() {
        format!("queued (outputs of at most {SMALL} elements, up to {CAPACITY} calls per launch; TORCHLEAN_LAUNCH_QUEUE=0: one launch each)")
    } else {
        "one launch each (TORCHLEAN_LAUNCH_QUEUE=0)".into()
    }
}

/// "3 queued element-wise calls (add ×2, mul)".
fn describe(ops: &[&str]) -> String {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for &op in ops {
        match runs.iter_mut().find(|(name, _)| *name == op) {
            Some((_, k)) => *k += 1,
            None => runs.push((op, 1)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|(name, k)| match k {
            1 => name.to_string(),
            _ => format!("{name} ×{k}"),
        })
        .collect();
    format!(
        "{} queued element-wise calls ({})",
        ops.len(),
        parts.join(", ")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_error_names_the_queued_calls() {
        assert_eq!(
            super::describe(&["add", "mul", "add"]),
            "3 queued element-wise calls (add ×2, mul)"
        );
    }
}
