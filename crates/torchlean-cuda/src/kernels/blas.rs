//! cuBLAS products: `matmul` (batched, with a shared side) and `linear`, forward and VJP —
//! single products through cuBLASLt where the context says so ([`crate::lt`]: linear's bias
//! epilogues, and unbatched matmuls), batched and accumulating ones through the classic API —
//! in f32 with cuBLAS's default math mode (no TF32: the products round like f32 GEMM) — or,
//! for the opt-in `cublas.tf32.*` capsules ([`forward_tf32`], [`vjp_tf32`]), with
//! `CUBLAS_TF32_TENSOR_OP_MATH`: inputs rounded to TF32 on tensor cores, f32 accumulation.
//! The math mode is set on the shared handle before every product, under its lock, so one
//! capsule's mode never leaks into another's call.
//!
//! torchlean tensors are row-major and cuBLAS is column-major: a row-major [r, c] matrix is
//! a column-major [c, r] one, so row-major C = op(A)·op(B) is computed as column-major
//! Cᵀ = op(B)ᵀ·op(A)ᵀ (see [`row_gemm`]).

use super::{buffer, cx, grid, launched, output, tensor};
use crate::device::Context;
use cudarc::cublas::sys::cublasOperation_t as Trans;
use cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use torchlean::graph::{Op, OpKind};
use torchlean::{Error, OpError, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[OpKind::Matmul, OpKind::Linear];

/// One row-major product (or `batch` of them) C[m, n] = op(A)[m, k] · op(B)[k, n] with
/// `beta` times the old C added; `ta`: A is stored [k, m]; `tb`: B is stored [n, k];
/// strides are per product in elements (0: shared by every product).
struct RowGemm {
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    beta: f32,
    batch: usize,
    stride_a: usize,
    stride_b: usize,
    stride_c: usize,
}

impl RowGemm {
    /// One product C[m, n] = op(A)·op(B), overwriting C.
    fn one(m: usize, n: usize, k: usize, ta: bool, tb: bool) -> RowGemm {
        RowGemm {
            m,
            n,
            k,
            ta,
            tb,
            beta: 0.0,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        }
    }

    /// `batch` such products at these per-product strides (0: an operand shared by all).
    fn batched(self, batch: usize, stride_a: usize, stride_b: usize, stride_c: usize) -> RowGemm {
        RowGemm {
            batch,
            stride_a,
            stride_b,
            stride_c,
            ..self
        }
    }
}

fn int(op: &Op, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::from(OpError::Payload {
            op: op.name(),
            reason: format!("dimension {v} exceeds cuBLAS's 32-bit sizes"),
        })
    })
}

fn row_gemm<A: DevicePtr<f32>, B: DevicePtr<f32>>(
    cx: &Context,
    op: &Op,
    g: RowGemm,
    a: &A,
    b: &B,
    c: &mut CudaSlice<f32>,
) -> Result<()> {
    if g.m == 0 || g.n == 0 || g.batch == 0 {
        return Ok(());
    }
    if g.k == 0 {
        // an empty inner dimension: the product is zero
        if g.beta == 0.0 {
            return launched(op, cx.stream.memset_zeros(c));
        }
        return Ok(());
    }
    let t = |x: bool| {
        if x {
            Trans::CUBLAS_OP_T
        } else {
            Trans::CUBLAS_OP_N
        }
    };
    let cfg = GemmConfig {
        transa: t(g.tb),
        transb: t(g.ta),
        m: int(op, g.n)?,
        n: int(op, g.m)?,
        k: int(op, g.k)?,
        alpha: 1.0f32,
        lda: int(op, if g.tb { g.k } else { g.n })?,
        ldb: int(op, if g.ta { g.m } else { g.k })?,
        beta: g.beta,
        ldc: int(op, g.n)?,
    };
    let blas = cx.blas();
    let mode = if TF32.with(|t| t.get()) {
        cudarc::cublas::sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
    } else {
        cudarc::cublas::sys::cublasMath_t::CUBLAS_DEFAULT_MATH
    };
    // SAFETY: the handle is live and held under the context's lock for this whole call.
    let status = unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.0.handle(), mode) };
    if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(crate::device::failure(
            op.name(),
            format!("cublasSetMathMode: {status:?}"),
        ));
    }
    if g.batch == 1 {
        // SAFETY: B, A and C hold at least k·n, m·k and m·n elements (shapes checked by the
        // guard and the allocation), and the leading dimensions match those layouts.
        launched(op, unsafe { blas.0.gemm(cfg, b, a, c) })
    } else {
        let cfg = StridedBatchedConfig {
            gemm: cfg,
            batch_size: int(op, g.batch)?,
            stride_a: g.stride_b as i64,
            stride_b: g.stride_a as i64,
            stride_c: g.stride_c as i64,
        };
        // SAFETY: as above, for `batch` products at the given strides (0 for a shared
        // operand), each inside its buffer.
        launched(op, unsafe { blas.0.gemm_strided_batched(cfg, b, a, c) })
    }
}

/// One product of `g` (a single one, overwriting C) through cuBLASLt with `epilogue`, its
/// vector at `bias` (see [`crate::lt::Epilogue`]: for row-major C = op(A)·op(B), `Bias` adds
/// a vector over C's columns, `BiasGradB` writes the sums of op(A) over the inner
/// dimension). `Ok(false)`: not run — the TF32 capsules, a batched or accumulating product,
/// or a shape cuBLASLt has no algorithm for; the caller runs the classic API instead.
fn lt_gemm(
    cx: &Context,
    op: &Op,
    g: &RowGemm,
    (a, b, c): (&CudaSlice<f32>, &CudaSlice<f32>, &mut CudaSlice<f32>),
    epilogue: crate::lt::Epilogue,
    bias: cudarc::driver::sys::CUdeviceptr,
) -> Result<bool> {
    if TF32.with(|t| t.get()) || g.batch != 1 || g.beta != 0.0 || g.m == 0 || g.n == 0 || g.k == 0 {
        return Ok(false);
    }
    // row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ (as `row_gemm`)
    let shape = crate::lt::Shape {
        m: g.n as u64,
        n: g.m as u64,
        k: g.k as u64,
        ta: g.tb,
        tb: g.ta,
    };
    let (pa, _ra) = b.device_ptr(&cx.stream);
    let (pb, _rb) = a.device_ptr(&cx.stream);
    let (pc, _rc) = c.device_ptr_mut(&cx.stream);
    let stream = cx.stream.cu_stream() as cudarc::cublaslt::sys::cudaStream_t;
    // SAFETY: A, B and C hold m·k, k·n and m·n elements of dense row-major storage (shapes
    // checked by the guard and the allocation), the bias vector (when the epilogue has one)
    // the length the epilogue addresses (the callers pass linear's bias or its gradient,
    // of C's column count), and every use is ordered on the module's one stream.
    let ran = unsafe { cx.lt().matmul(stream, shape, epilogue, pa, pb, pc, bias) };
    ran.map_err(|e| crate::device::failure(op.name(), e))
}

/// One plain product of `g` over whole buffers: through cuBLASLt when `lt` (the context's
/// choice for this phase) and cuBLASLt takes it, else the classic API.
fn product(
    cx: &Context,
    op: &Op,
    g: RowGemm,
    (a, b, c): (&CudaSlice<f32>, &CudaSlice<f32>, &mut CudaSlice<f32>),
    lt: bool,
) -> Result<()> {
    if lt && lt_gemm(cx, op, &g, (a, b, &mut *c), crate::lt::Epilogue::Plain, 0)? {
        return Ok(());
    }
    row_gemm(cx, op, g, a, b, c)
}

fn dims(op: &Op, a: &[usize], b: &[usize]) -> Result<torchlean::spec::MatmulDims> {
    torchlean::spec::matmul_dims(a, b)
        .map(|(d, _)| d)
        .ok_or_else(|| {
            OpError::Shape {
                op: op.name(),
                shapes: vec![a.to_vec(), b.to_vec()],
                expected: "a [..., m, k] and b [..., k, n] with equal batch dims, or one side 2-D"
                    .into(),
            }
            .into()
        })
}

thread_local! {
    /// Whether this thread's current cuBLAS call belongs to a `cublas.tf32.*` capsule.
    static TF32: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with TF32 products on this thread (reset afterwards, also on an error).
fn in_tf32<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            TF32.with(|t| t.set(false));
        }
    }
    TF32.with(|t| t.set(true));
    let _reset = Reset;
    f()
}

/// The forward kernel of the `cublas.tf32.*` capsules.
pub fn forward_tf32(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    in_tf32(|| forward(op, inputs))
}

/// The VJP kernel of the `cublas.tf32.*` capsules.
pub fn vjp_tf32(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    in_tf32(|| vjp(op, inputs, output, gy, needs))
}

/// The forward kernel of `matmul` and `linear`.
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let in_use = cx()?;
    let cx = &*in_use;
    let mut out = output(cx, op, torchlean::spec::numel(&shape))?;
    let (a, b) = (buffer(op, inputs[0])?, buffer(op, inputs[1])?);
    match op.kind() {
        OpKind::Matmul => {
            let d = dims(op, inputs[0].shape(), inputs[1].shape())?;
            let g = if d.b_batched {
                let stride_a = if d.a_batched { d.m * d.k } else { 0 };
                RowGemm::one(d.m, d.n, d.k, false, false).batched(
                    d.batch,
                    stride_a,
                    d.k * d.n,
                    d.m * d.n,
                )
            } else {
                // a shared B: one product over the stacked rows of A
                RowGemm::one(d.batch * d.m, d.n, d.k, false, false)
            };
            let operands = (a.slice(), b.slice(), out.slice_mut());
            product(cx, op, g, operands, cx.lt_products.forward)?;
        }
        OpKind::Linear => {
            let (o, i) = (inputs[1].shape()[0], inputs[1].shape()[1]);
            let rows = inputs[0]
                .numel()
                .checked_div(i)
                .unwrap_or_else(|| torchlean::spec::numel(&shape) / o.max(1));
            let g = RowGemm::one(rows, o, i, false, true);
            let fused = cx.lt_products.forward && {
                let (epilogue, bias) = match inputs.get(2) {
                    Some(t) => {
                        let (p, _record) = buffer(op, t)?.slice().device_ptr(&cx.stream);
                        (crate::lt::Epilogue::Bias, p)
                    }
                    None => (crate::lt::Epilogue::Plain, 0),
                };
                let operands = (a.slice(), b.slice(), out.slice_mut());
                lt_gemm(cx, op, &g, operands, epilogue, bias)?
            };
            if !fused {
                row_gemm(cx, op, g, a.slice(), b.slice(), out.slice_mut())?;
            }
            if !fused && inputs.len() == 3 && rows * o > 0 {
                let bias = buffer(op, inputs[2])?;
                let (r64, c64) = (rows as i64, o as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.add_row_bias);
                l.arg(out.slice_mut()).arg(bias.slice()).arg(&r64).arg(&c64);
                // SAFETY: rows·o elements of out updated, bias read at index < o.
                launched(op, unsafe { l.launch(grid(rows * o)) })?;
            }
        }
        other => {
            return Err(Error::Other(format!(
                "cublas has no kernel for op `{}`",
                other.name()
            )))
        }
    }
    tensor(out, &shape)
}

/// The VJP kernel of `matmul` and `linear`: dA = dC·Bᵀ, dB = Aᵀ·dC (summed over the
/// products that share an operand, in a fixed order), and for linear's bias the column sums
/// of dC.
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let in_use = cx()?;
    let cx = &*in_use;
    let (a, b) = (buffer(op, inputs[0])?, buffer(op, inputs[1])?);
    let g = buffer(op, gy)?;
    let mut grads: Vec<Option<Tensor>> = vec![None; inputs.len()];
    match op.kind() {
        OpKind::Matmul => {
            let d = dims(op, inputs[0].shape(), inputs[1].shape())?;
            let (m, k, n) = (d.m, d.k, d.n);
            if needs[0] {
                let mut da = output(cx, op, inputs[0].numel())?;
                if d.a_batched && !d.b_batched {
                    // stacked rows: dA[batch·m, k] = dC[batch·m, n] · Bᵀ
                    let gg = RowGemm::one(d.batch * m, k, n, false, true);
                    let operands = (g.slice(), b.slice(), da.slice_mut());
                    product(cx, op, gg, operands, cx.lt_products.vjp)?;
                } else if d.a_batched {
                    let gg =
                        RowGemm::one(m, k, n, false, true).batched(d.batch, m * n, k * n, m * k);
                    row_gemm(cx, op, gg, g.slice(), b.slice(), da.slice_mut())?;
                } else {
                    // a shared A: dA = Σ_b dC_b · B_bᵀ, accumulated product by product (no
                    // product for an empty batch: dC and B hold nothing to read, dA is zero)
                    for i in 0..d.batch {
                        let gv = g.slice().slice(i * m * n..);
                        let bv = b.slice().slice(if d.b_batched { i * k * n } else { 0 }..);
                        let gg = RowGemm {
                            beta: if i == 0 { 0.0 } else { 1.0 },
                            ..RowGemm::one(m, k, n, false, true)
                        };
                        row_gemm(cx, op, gg, &gv, &bv, da.slice_mut())?;
                    }
                    if d.batch == 0 {
                        launched(op, cx.stream.memset_zeros(da.slice_mut()))?;
                    }
                }
                grads[0] = Some(tensor(da, inputs[0].shape())?);
            }
            if needs[1] {
                let mut db = output(cx, op, inputs[1].numel())?;
                if d.b_batched {
                    let stride_a = if d.a_batched { m * k } else { 0 };
                    let gg =
                        RowGemm::one(k, n, m, true, false).batched(d.batch, stride_a, m * n, k * n);
                    row_gemm(cx, op, gg, a.slice(), g.slice(), db.slice_mut())?;
                } else {
                    // a shared B: dB[k, n] = A_stackedᵀ[k, batch·m] · dC[batch·m, n]
                    let rows = if d.a_batched { d.batch * m } else { m };
                    let gg = RowGemm::one(k, n, rows, true, false);
                    let operands = (a.slice(), g.slice(), db.slice_mut());
                    product(cx, op, gg, operands, cx.lt_products.vjp)?;
                }
                grads[1] = Some(tensor(db, inputs[1].shape())?);
            }
        }
        OpKind::Linear => {
            let (o, i) = (inputs[1].shape()[0], inputs[1].shape()[1]);
            let rows = gy.numel() / o.max(1);
            let lt = cx.lt_products.vjp;
            let plain = crate::lt::Epilogue::Plain;
            if needs[0] {
                let mut dx = output(cx, op, inputs[0].numel())?;
                let gg = RowGemm::one(rows, i, o, false, false);
                product(cx, op, gg, (g.slice(), b.slice(), dx.slice_mut()), lt)?;
                grads[0] = Some(tensor(dx, inputs[0].shape())?);
            }
            let wants_db = inputs.len() == 3 && needs[2];
            let mut db = if wants_db {
                Some(output(cx, op, o)?)
            } else {
                None
            };
            // the bias gradient (column sums of dY) fused into dW's product when both are
            // needed: dW = dYᵀ·X sums over the same rows
            let mut db_done = false;
            if needs[1] {
                let mut dw = output(cx, op, inputs[1].numel())?;
                let gg = RowGemm::one(o, i, rows, true, false);
                let (epilogue, bias) = match db.as_mut() {
                    Some(v) => {
                        let (p, _record) = v.slice_mut().device_ptr_mut(&cx.stream);
                        (crate::lt::Epilogue::BiasGradB, p)
                    }
                    None => (plain, 0),
                };
                let operands = (g.slice(), a.slice(), dw.slice_mut());
                let fused = lt && lt_gemm(cx, op, &gg, operands, epilogue, bias)?;
                if !fused {
                    row_gemm(cx, op, gg, g.slice(), a.slice(), dw.slice_mut())?;
                }
                db_done = fused && db.is_some();
                grads[1] = Some(tensor(dw, inputs[1].shape())?);
            }
            if let Some(mut db) = db.take() {
                if o > 0 && !db_done {
                    let (r64, c64) = (rows as i64, o as i64);
                    let mut l = cx.stream.launch_builder(&cx.functions.sum_rows);
                    l.arg(g.slice()).arg(db.slice_mut()).arg(&r64).arg(&c64);
                    let cfg = cudarc::driver::LaunchConfig {
                        grid_dim: (o.div_ceil(32) as u32, 1, 1),
                        block_dim: (32, 32, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: blocks of 32 x 32 threads (the kernel's shared array) read
                    // rows·o elements of dC and write o elements of db.
                    launched(op, unsafe { l.launch(cfg) })?;
                }
                grads[2] = Some(tensor(db, inputs[2].shape())?);
            }
        }
        other => {
            return Err(Error::Other(format!(
                "cublas has no VJP for op `{}`",
                other.name()
            )))
        }
    }
    Ok(grads)
}
