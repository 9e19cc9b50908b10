//! native_cuda's optimizer step over several parameters: `adam_step` (spec/optim.rs), one
//! launch of `adam_step_many` (`kernels/elementwise.cu`) for every parameter of a step.
//!
//! Two kernels share the launch: [`forward`] writes the op's value (each parameter's `w'`,
//! `m'`, `v'` side by side in a new vector: what checkers replay), and [`update_many`] writes
//! each parameter's `(w, m, v)` over its own buffer when its handle owns it alone, else into
//! a new buffer that the handle then takes (`runtime::kernel::UpdateManyKernel`). Per
//! parameter the kernel reads a row of a table of device addresses (uploaded per call into a
//! pool buffer, as `copy_many`'s), so one launch covers any number of parameters.

use super::{buffer, cx, launched, output, tensor};
use crate::device::Context;
use crate::memory::CudaBuffer;
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use torchlean::graph::{Op, OpKind};
use torchlean::runtime::kernel::update_many_operands;
use torchlean::{OpError, Result, Tensor};

/// The ops of this file.
pub const KINDS: &[OpKind] = &[OpKind::AdamStep];

/// `adam_step`'s payload in the kernel's argument order, or a typed error for another op.
fn payload(op: &Op) -> Result<[f32; 9]> {
    op.adam_step_payload().ok_or_else(|| {
        OpError::Payload {
            op: op.name(),
            reason: "this kernel computes adam_step only".into(),
        }
        .into()
    })
}

/// One parameter's row of the table: the addresses of w, m, v, g (read) and w', m', v'
/// (written), and its length.
type Row = [u64; 8];

/// Launches `adam_step_many` over `rows` (each row's addresses live buffers of this module
/// that the caller holds until this returns: the launch is queued by then, and freed buffers
/// return to the pool, which reuses them only for later work on the same stream).
fn launch(cx: &Context, op: &Op, rows: &[Row]) -> Result<()> {
    let Some(longest) = rows.iter().map(|r| r[7]).max() else {
        return Ok(());
    };
    let count = u32::try_from(rows.len())
        .ok()
        .filter(|&c| c <= 65_535)
        .ok_or_else(|| {
            crate::device::failure(
                op.name(),
                format!("{} parameters in one call (at most 65535)", rows.len()),
            )
        })?;
    // each 64-bit word as two f32 bit patterns: the pool's buffers hold f32
    let words: Vec<f32> = rows
        .iter()
        .flatten()
        .flat_map(|w| [f32::from_bits(*w as u32), f32::from_bits((*w >> 32) as u32)])
        .collect();
    let mut table = cx.pool.alloc(words.len(), &"adam_step's table")?;
    launched(
        op,
        cx.stream
            .memcpy_htod(&words, &mut table.slice_mut().slice_mut(0..words.len())),
    )?;
    crate::graph::refuse_while_recording(op.name())?;
    let [b1, w1, b2, w2, step_size, c2_sqrt, eps, shrink, l2] = payload(op)?;
    let blocks = (longest as usize).div_ceil(4 * 256).clamp(1, 264) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, count, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = cx.stream.launch_builder(&cx.functions.adam_step_many);
    l.arg(table.slice())
        .arg(&b1)
        .arg(&w1)
        .arg(&b2)
        .arg(&w2)
        .arg(&step_size)
        .arg(&c2_sqrt)
        .arg(&eps)
        .arg(&shrink)
        .arg(&l2);
    // SAFETY: row y of the table holds the addresses of live buffers of this module (held by
    // the caller until the launch is queued) of at least row[7] elements each (checked by
    // `buffer` against the shape rule's equal shapes, or allocated at that length); block
    // row y reads and writes elements [0, row[7]) of its own row's buffers, an element by one
    // thread, so a write over its own read is safe; no two rows write one buffer (each
    // target is its own tensor's sole buffer or a new one; the forward's rows write disjoint
    // ranges of one new vector).
    launched(op, unsafe { l.launch(cfg) }).map(drop)
}

/// The device address of `b`'s element `offset`; its guard goes to `held`, which the caller
/// keeps until the launch is queued (as `copy_many` does).
fn address<'a>(
    cx: &'a Context,
    b: &'a CudaBuffer,
    offset: usize,
    held: &mut Vec<cudarc::driver::SyncOnDrop<'a>>,
) -> u64 {
    let (p, sync) = b.slice().device_ptr(&cx.stream);
    held.push(sync);
    p + 4 * offset as u64
}

/// The forward kernel: `adam_step`'s value, each parameter's `w'`, `m'`, `v'` side by side.
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    payload(op)?;
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let in_use = cx()?;
    let cx = &*in_use;
    let out = output(cx, op, torchlean::spec::numel(&shape))?;
    let mut rows = Vec::with_capacity(inputs.len() / 4);
    let mut held = Vec::with_capacity(inputs.len() / 4 * 7);
    let mut at = 0;
    for group in inputs.chunks(4) {
        let n = group[0].numel();
        let mut row: Row = [0; 8];
        for (k, t) in group.iter().enumerate() {
            row[k] = address(cx, buffer(op, t)?, 0, &mut held);
        }
        for k in 0..3 {
            row[4 + k] = address(cx, &out, at + k * n, &mut held);
        }
        row[7] = n as u64;
        at += 3 * n;
        if n > 0 {
            rows.push(row);
        }
    }
    launch(cx, op, &rows)?;
    drop(held);
    tensor(out, &shape)
}

/// The update-many kernel: every parameter's `(w, m, v)` written over its own buffer where
/// its handle owns it alone, else into a new buffer the handle takes. The call's shapes and
/// payload are checked (the op's shape rule) before anything is written.
pub fn update_many(op: &Op, targets: &mut [&mut Tensor], rest: &[&Tensor]) -> Result<()> {
    payload(op)?;
    {
        let inputs = update_many_operands(op, targets, rest)?;
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
        torchlean::spec::infer_shape(op, &shapes)?;
    }
    let in_use = cx()?;
    let cx = &*in_use;
    // a new buffer for each target another handle shares (written, then taken)
    let mut fresh: Vec<Option<CudaBuffer>> = Vec::with_capacity(targets.len());
    for t in targets.iter_mut() {
        fresh.push(if t.owns_storage_alone() {
            None
        } else {
            Some(output(cx, op, t.numel())?)
        });
    }
    let mut rows = Vec::with_capacity(rest.len());
    let mut held = Vec::with_capacity(rest.len() * 7);
    for (k, g) in rest.iter().enumerate() {
        let group = &targets[3 * k..3 * k + 3];
        let n = g.numel();
        let mut row: Row = [0; 8];
        for (j, t) in group.iter().enumerate() {
            let read = buffer(op, t)?;
            row[j] = address(cx, read, 0, &mut held);
            row[4 + j] = match &fresh[3 * k + j] {
                Some(b) => address(cx, b, 0, &mut held),
                None => row[j],
            };
        }
        row[3] = address(cx, buffer(op, g)?, 0, &mut held);
        row[7] = n as u64;
        if n > 0 {
            rows.push(row);
        }
    }
    launch(cx, op, &rows)?;
    drop(held);
    for (t, b) in targets.iter_mut().zip(fresh) {
        if let Some(b) = b {
            let shape = t.shape().to_vec();
            t.assign(tensor(b, &shape)?)?;
        }
    }
    Ok(())
}
