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
//! bits) runs up to [`CAPACITY`] of them.
//!
//! **Order.** Queued calls must run before anything queued on the stream after them. The
//! queue is launched:
//! - by [`crate::device::context`], which every kernel, copy, upload, graph recording and
//!   timing span goes through before it touches the stream (the queue's own calls take
//!   [`crate::device::context_for_queue`], which does not launch it);
//! - before every read of device values to the host ([`crate::memory::CudaBuffer`]'s `read`),
//!   every synchronization and the end of every timing span;
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
const WORDS: usize = 10;

/// Threads of the queue's one block.
const THREADS: u32 = 256;

/// Whether calls are queued (`TORCHLEAN_LAUNCH_QUEUE=0`: never).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHLEAN_LAUNCH_QUEUE").as_deref() != Ok("0"))
}

/// The calls queued and not yet launched.
#[derive(Default)]
pub struct LaunchQueue {
    /// [`WORDS`] words per call, as f32 bit patterns (the pool's buffers hold f32).
    words: Vec<f32>,
    /// The inputs and outputs of the queued calls, alive until their launch is queued.
    held: Vec<Tensor>,
    /// The queued calls' op names, in order (for an error).
    ops: Vec<&'static str>,
}

impl LaunchQueue {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// The call of `op` on `inputs` (output shape `shape`) queued, when the queue takes it:
/// `Ok(None)` when it does not (the caller launches it at once).
pub fn forward(op: &Op, inputs: &[&Tensor], shape: &[usize]) -> Result<Option<Tensor>> {
    use crate::kernels::elementwise::{binary_code, unary_code};
    let n = torchlean::spec::numel(shape);
    if n == 0 || n > SMALL || !enabled() || crate::graph::is_recording() {
        return Ok(None);
    }
    let same = |t: &&Tensor| t.shape() == shape;
    let (kind, code, param) = match (binary_code(op.kind()), unary_code(op)) {
        (Some(code), _) if inputs.len() == 2 && inputs.iter().all(same) => (0u32, code, 0.0f32),
        (None, Some((code, p))) if inputs.len() == 1 && inputs.iter().all(same) => (1, code, p),
        _ => return Ok(None),
    };
    let Ok(code) = u16::try_from(code) else {
        return Ok(None);
    };
    let cx = crate::device::context_for_queue()?;
    let a = buffer(op, inputs[0])?;
    let b = match inputs.get(1) {
        Some(t) => buffer(op, t)?,
        None => a,
    };
    let out = output(cx, op, n)?;
    let address = |x: &crate::memory::CudaBuffer| x.slice().device_ptr(&cx.stream).0;
    let (pa, pb, po) = (address(a), address(b), address(&out));
    let out = tensor(out, shape)?;
    let mut q = cx.queue();
    let word = |w: u32| f32::from_bits(w);
    let entry: [f32; WORDS] = [
        word(kind << 16 | u32::from(code)),
        param,
        // n <= SMALL
        word(n as u32),
        word(pa as u32),
        word((pa >> 32) as u32),
        word(pb as u32),
        word((pb >> 32) as u32),
        word(po as u32),
        word((po >> 32) as u32),
        0.0,
    ];
    q.words.extend(entry);
    q.held.extend(inputs.iter().map(|t| (*t).clone()));
    q.held.push(out.clone());
    q.ops.push(op.name());
    if q.ops.len() >= CAPACITY {
        launch(cx, &mut q)?;
    }
    Ok(Some(out))
}

/// Launches the queued calls (nothing when none is queued) and empties the queue.
pub fn launch(cx: &Context, q: &mut LaunchQueue) -> Result<()> {
    if q.is_empty() {
        return Ok(());
    }
    let words = std::mem::take(&mut q.words);
    let held = std::mem::take(&mut q.held);
    let ops = std::mem::take(&mut q.ops);
    let what = describe(&ops);
    let count = i32::try_from(ops.len()).map_err(|e| failure(&what, e))?;
    let mut table = cx.pool.alloc(words.len(), "the launch queue's table")?;
    cx.stream
        .memcpy_htod(&words, &mut table.slice_mut().slice_mut(0..words.len()))
        .map_err(|e| failure(&what, e))?;
    let mut l = cx.stream.launch_builder(&cx.functions.queued_maps);
    l.arg(table.slice()).arg(&count);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the table holds `count` entries of WORDS words; each names buffers of the pool
    // holding at least its n elements (`buffer` checked the inputs, `output` allocated the
    // output), kept alive by `held` until the launch is queued; after that the stream orders
    // any reuse of their memory after this kernel. The table itself returns to the pool when
    // dropped below, and is likewise reused only by work queued after this launch.
    unsafe { l.launch(cfg) }.map_err(|e| failure(&what, e))?;
    drop(held);
    Ok(())
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
