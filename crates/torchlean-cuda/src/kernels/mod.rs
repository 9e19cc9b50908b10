//! The module's kernels over device tensors: [`elementwise`], [`fused`], [`reduce`], [`rows`],
//! [`conv`], [`spectral`], [`attention`] and [`optim`] (native_cuda, NVRTC-compiled `.cu` sources) and [`blas`] (cuBLAS products).
//!
//! Every kernel takes the op and device tensors, reads the execution context
//! ([`crate::device::context`]: stream, cuBLAS handle, functions, allocator), launches on the
//! one stream and returns new device tensors without waiting. The guards cited by the
//! capsules ([`crate::guard`]) have already run; kernels re-check what they index with.

pub mod attention;
pub mod attention_slots;
pub mod attention_split;
pub mod blas;
pub mod conv;
pub mod elementwise;
pub mod fft;
pub mod fused;
pub mod optim;
pub mod reduce;
pub mod rows;
pub mod spectral;

use crate::device::{context, failure, Context};
use crate::memory::CudaBuffer;
use cudarc::driver::LaunchConfig;
use std::sync::Arc;
use torchlean::graph::Op;
use torchlean::tensor::DeviceBuffer;
use torchlean::{Error, Result, Tensor};

/// Threads per block of the grid-stride kernels.
pub const BLOCK: u32 = 256;

/// A grid-stride launch over `n` elements.
pub fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch of the one-warp-per-row kernels over `rows` rows (8 warps per block; the kernels
/// take rows in a warp-uniform grid-stride loop, so any grid covers them).
pub fn warp_grid(rows: usize) -> LaunchConfig {
    let blocks = rows.div_ceil(8).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What [`deterministic_sum`] adds up.
pub enum SumTerms<'a> {
    /// `x[i]`.
    Values(&'a CudaBuffer),
    /// `(x[i] - y[i])²`.
    SquaredDifferences(&'a CudaBuffer, &'a CudaBuffer),
}

/// `out[0] = (Σ terms over n elements) / divisor`, over many blocks in a fixed order (the
/// `sum_partial` / `sum_finish` kernels): each of at most 1024 blocks sums a fixed chunk,
/// then one block adds the chunk sums in a fixed tree, so the result is the same every run.
pub fn deterministic_sum(
    cx: &Context,
    op: &Op,
    terms: SumTerms,
    n: usize,
    divisor: f32,
    out: &mut CudaBuffer,
) -> Result<()> {
    use cudarc::driver::PushKernelArg;
    let parts = n.div_ceil(8192).clamp(1, 1024);
    let chunk = n.div_ceil(parts).max(1);
    let mut part = output(cx, op, parts)?;
    let (mode, x, y) = match terms {
        SumTerms::Values(x) => (0i32, x, x),
        SumTerms::SquaredDifferences(x, y) => (1i32, x, y),
    };
    let (n64, chunk64, parts64) = (n as i64, chunk as i64, parts as i64);
    let mut l = cx.stream.launch_builder(&cx.functions.sum_partial);
    l.arg(&mode)
        .arg(x.slice())
        .arg(y.slice())
        .arg(part.slice_mut())
        .arg(&n64)
        .arg(&chunk64);
    let cfg = LaunchConfig {
        grid_dim: (parts as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: block b reads elements [b·chunk, min(n, (b+1)·chunk)) of x (and y, same length
    // n: the callers' shape rules), all < n, and writes part[b] (b < parts, its length).
    launched(op, unsafe { l.launch(cfg) })?;
    let mut l = cx.stream.launch_builder(&cx.functions.sum_finish);
    l.arg(part.slice())
        .arg(out.slice_mut())
        .arg(&parts64)
        .arg(&divisor);
    let one = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: one block of 256 threads (the kernel's shared array) reads part[0..parts) and
    // writes out[0].
    launched(op, unsafe { l.launch(one) })?;
    Ok(())
}

/// The module's buffer under a device tensor (an error naming the op when the tensor is not
/// a dense CUDA tensor of this module).
pub fn buffer<'t>(op: &Op, t: &'t Tensor) -> Result<&'t CudaBuffer> {
    let refuse = |reason: String| {
        Error::from(torchlean::OpError::Layout {
            op: op.name(),
            shapes: vec![t.shape().to_vec()],
            reason,
        })
    };
    let b = t
        .device_buffer()
        .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
        .ok_or_else(|| refuse(format!("input on `{}` is not a cuda tensor", t.device())))?;
    if !t.is_contiguous() || t.layout().offset != 0 || b.len() < t.numel() {
        return Err(refuse(
            "native_cuda kernels read dense row-major buffers from offset 0".into(),
        ));
    }
    Ok(b)
}

/// `x`'s dense device buffer under `shape` (as many elements): no copy, no kernel, as
/// PyTorch's `view` — `reshape` and its VJP, and a VJP whose value is its cotangent exactly
/// (add's, sub's first operand's). Whoever writes a buffer in place checks first that no
/// other handle shares it (`Tensor::is_sole_handle`, the device graphs' outputs), so a view
/// is never written through behind its other owner's back.
pub fn view_of(op: &Op, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    buffer(op, x)?; // a dense CUDA tensor from offset 0
    match x.device_buffer().filter(|b| b.len() == x.numel()) {
        Some(b) => Tensor::from_device_buffer(Arc::clone(b), shape),
        None => Err(torchlean::OpError::Layout {
            op: op.name(),
            shapes: vec![x.shape().to_vec(), shape.to_vec()],
            reason: "a view on the device covers a whole dense buffer".into(),
        }
        .into()),
    }
}

/// "op `add`": how an op's output is named in an out-of-memory error (formatted only then).
struct OpRequest<'a>(&'a Op);

impl std::fmt::Display for OpRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op `{}`", self.0.name())
    }
}

/// A fresh output buffer of `n` elements for `op`.
pub fn output(cx: &Context, op: &Op, n: usize) -> Result<CudaBuffer> {
    cx.pool.alloc(n, &OpRequest(op))
}

/// The gradient of input `i` (of tensor `x`'s shape) when `needs[i]`: a fresh buffer that
/// `fill` writes (not called for an empty input); `None` when the input needs none.
pub fn needed_grad<T>(
    op: &Op,
    needs: &[bool],
    i: usize,
    x: &Tensor,
    fill: impl FnOnce(&mut CudaBuffer) -> Result<T>,
) -> Result<Option<Tensor>> {
    if !needs.get(i).copied().unwrap_or(false) {
        return Ok(None);
    }
    let mut b = output(&*cx()?, op, x.numel())?;
    if x.numel() > 0 {
        fill(&mut b)?;
    }
    Ok(Some(tensor(b, x.shape())?))
}

/// A device tensor over `b`.
pub fn tensor(b: CudaBuffer, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_device_buffer(Arc::new(b), shape)
}

/// The row-major strides of `shape` (in elements).
pub fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The context, as kernels see it.
pub fn cx() -> Result<crate::device::Cx> {
    context()
}

/// Maps a launch or library error to a device failure naming `op`.
pub fn launched<T, E: std::fmt::Display>(op: &Op, r: std::result::Result<T, E>) -> Result<T> {
    r.map_err(|e| failure(op.name(), e))
}
