//! Kernels for `spectral_conv1d` and its VJP (CUDA source `kernels/spectral.cu`): a DFT on the
//! first `modes` frequencies, complex channel mixing, and the normalized inverse real FFT.
//! Two capsules share this file and differ only in how the transforms are computed
//! ([`Dft`]): `native_cuda.spectral_conv1d` sums the spec's direct DFT (O(n·modes) per
//! signal, the spec's own angles), `cufft.spectral_conv1d` calls cuFFT's real transforms
//! (O(n log n), `fft.rs`); the mixing kernels are the same.
//!
//! Forward: x [B, Ci, N] → (Xr, Xi) [B, Ci, m] → (Yr, Yi) [B, Co, m] → y [B, Co, N].
//! VJP: gy → scaled DFT (gYr, gYi) → the mixing's cotangents (of X, and of the weights,
//! summed over the batch) → unscaled inverse DFT of gX → gx.

use super::{buffer, cx, fft, grid, launched, output, tensor};
use crate::memory::CudaBuffer;
use cudarc::driver::PushKernelArg;
use torchlean::graph::{Op, OpKind};
use torchlean::{Error, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[OpKind::SpectralConv1d];

/// (b, ci, n, co, m) of a call whose shapes the shape rule accepted.
fn dims(op: &Op, x: &[usize], w: &[usize]) -> Result<(usize, usize, usize, usize, usize)> {
    match op {
        Op::SpectralConv1d { modes } => Ok((x[0], x[1], x[2], w[1], *modes)),
        other => Err(Error::Other(format!(
            "native_cuda has no spectral kernel for `{}`",
            other.name()
        ))),
    }
}

/// How the transforms are computed.
#[derive(Clone, Copy)]
pub enum Dft {
    /// The spec's direct sums (`spectral_dft`, `spectral_idft`): native_cuda.
    Direct,
    /// cuFFT's batched real transforms (`fft.rs`): cufft.
    Cufft,
}

/// One transform (DFT: `a` → (`o1`, `o2`); inverse: (`a`, `b`) → `o1`) over `rows` signals
/// of `n` points and `m` frequencies.
#[allow(clippy::too_many_arguments)]
fn transform(
    op: &Op,
    dft: Dft,
    inverse: bool,
    ins: (&CudaBuffer, Option<&CudaBuffer>),
    outs: (&mut CudaBuffer, Option<&mut CudaBuffer>),
    rows: usize,
    n: usize,
    m: usize,
    scaled: bool,
) -> Result<()> {
    if let Dft::Cufft = dft {
        let dims = (rows, n, m);
        return match (inverse, ins, outs) {
            (false, (a, _), (o1, Some(o2))) => fft::dft(op, a, (o1, o2), dims, scaled),
            (true, (a, Some(b)), (o1, _)) => fft::idft(op, (a, b), o1, dims, scaled),
            _ => Err(Error::Other(format!(
                "op `{}`: a transform called without both planar halves",
                op.name()
            ))),
        };
    }
    direct(op, inverse, ins, outs, (rows, n, m), scaled, None)
}

/// The direct sums (`spectral_dft`, or `spectral_idft` when `inverse`), on every row, or only
/// on the rows whose flag in `only` is nonzero.
pub(super) fn direct(
    op: &Op,
    inverse: bool,
    ins: (&CudaBuffer, Option<&CudaBuffer>),
    outs: (&mut CudaBuffer, Option<&mut CudaBuffer>),
    (rows, n, m): (usize, usize, usize),
    scaled: bool,
    only: Option<&CudaBuffer>,
) -> Result<()> {
    let in_use = cx()?;
    let cx = &*in_use;
    let (r64, n64, m64, s) = (rows as i64, n as i64, m as i64, scaled as i32);
    let threads = rows * if inverse { n } else { m };
    if threads == 0 {
        return Ok(());
    }
    let f = if inverse {
        &cx.functions.spectral_idft
    } else {
        &cx.functions.spectral_dft
    };
    let mut l = cx.stream.launch_builder(f);
    l.arg(ins.0.slice());
    if let Some(b) = ins.1 {
        l.arg(b.slice());
    }
    l.arg(outs.0.slice_mut());
    if let Some(o) = outs.1 {
        l.arg(o.slice_mut());
    }
    l.arg(&r64).arg(&n64).arg(&m64).arg(&s);
    // a null pointer: every row
    let everything = 0u64;
    match only {
        Some(flags) => l.arg(flags.slice()),
        None => l.arg(&everything),
    };
    // SAFETY: the DFT's rows·m threads read a row of n inputs and write element p < rows·m
    // of both outputs; the inverse's rows·n threads read a row of m frequencies (two
    // buffers) and write element p < rows·n; `only`, when given, holds one flag per row;
    // the caller sized every buffer so.
    launched(op, unsafe { l.launch(grid(threads)) })?;
    Ok(())
}

/// The three complex channel mixings (forward Y = Σ_i X·W; the cotangents of X and of W).
#[derive(Clone, Copy)]
enum Mix {
    Forward,
    InputGradient,
    WeightGradient,
}

/// One mixing kernel over planar complex operands `(a, b)` into `out`, for sizes (batch,
/// ci, co, m): forward reads X [b, ci, m] and W [ci, co, m] into Y [b, co, m]; the input
/// gradient reads gY [b, co, m] and W into gX [b, ci, m]; the weight gradient reads gY and
/// X (summed over the batch) into gW [ci, co, m].
fn mix(
    op: &Op,
    which: Mix,
    ((ar, ai), (br, bi)): ((&CudaBuffer, &CudaBuffer), (&CudaBuffer, &CudaBuffer)),
    (or, oi): (&mut CudaBuffer, &mut CudaBuffer),
    (b, ci, co, m): (usize, usize, usize, usize),
) -> Result<()> {
    let in_use = cx()?;
    let cx = &*in_use;
    let (f, total) = match which {
        Mix::Forward => (&cx.functions.spectral_mix, b * co * m),
        Mix::InputGradient => (&cx.functions.spectral_mix_vjp_x, b * ci * m),
        Mix::WeightGradient => (&cx.functions.spectral_mix_vjp_w, ci * co * m),
    };
    if total == 0 {
        return Ok(());
    }
    let (b64, ci64, co64, m64) = (b as i64, ci as i64, co as i64, m as i64);
    let mut l = cx.stream.launch_builder(f);
    l.arg(ar.slice())
        .arg(ai.slice())
        .arg(br.slice())
        .arg(bi.slice())
        .arg(or.slice_mut())
        .arg(oi.slice_mut())
        .arg(&b64)
        .arg(&ci64)
        .arg(&co64)
        .arg(&m64);
    // SAFETY: each of the `total` threads reads one row of its two planar complex operands
    // and writes one element of both outputs, all inside the [b, ci, m], [ci, co, m] and
    // [b, co, m] buffers the callers allocated for these sizes (the shape rule's).
    launched(op, unsafe { l.launch(grid(total)) })?;
    Ok(())
}

/// The forward kernel of `native_cuda.spectral_conv1d`.
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    forward_with(op, inputs, Dft::Direct)
}

/// The forward kernel of `cufft.spectral_conv1d`.
pub fn forward_fft(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    forward_with(op, inputs, Dft::Cufft)
}

/// The VJP kernel of `native_cuda.spectral_conv1d`.
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    vjp_with(op, inputs, output, gy, needs, Dft::Direct)
}

/// The VJP kernel of `cufft.spectral_conv1d`.
pub fn vjp_fft(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    vjp_with(op, inputs, output, gy, needs, Dft::Cufft)
}

fn forward_with(op: &Op, inputs: &[&Tensor], dft: Dft) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let (b, ci, n, co, m) = dims(op, inputs[0].shape(), inputs[1].shape())?;
    let in_use = cx()?;
    let cx = &*in_use;
    let (x, wr, wi) = (
        buffer(op, inputs[0])?,
        buffer(op, inputs[1])?,
        buffer(op, inputs[2])?,
    );
    let (mut xr, mut xi) = (output(cx, op, b * ci * m)?, output(cx, op, b * ci * m)?);
    let (mut yr, mut yi) = (output(cx, op, b * co * m)?, output(cx, op, b * co * m)?);
    let mut out = output(cx, op, b * co * n)?;
    transform(
        op,
        dft,
        false,
        (x, None),
        (&mut xr, Some(&mut xi)),
        b * ci,
        n,
        m,
        false,
    )?;
    mix(
        op,
        Mix::Forward,
        ((&xr, &xi), (wr, wi)),
        (&mut yr, &mut yi),
        (b, ci, co, m),
    )?;
    transform(
        op,
        dft,
        true,
        (&yr, Some(&yi)),
        (&mut out, None),
        b * co,
        n,
        m,
        true,
    )?;
    tensor(out, &shape)
}

fn vjp_with(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    gy: &Tensor,
    needs: &[bool],
    dft: Dft,
) -> Result<Vec<Option<Tensor>>> {
    let (b, ci, n, co, m) = dims(op, inputs[0].shape(), inputs[1].shape())?;
    let in_use = cx()?;
    let cx = &*in_use;
    let (x, wr, wi, g) = (
        buffer(op, inputs[0])?,
        buffer(op, inputs[1])?,
        buffer(op, inputs[2])?,
        buffer(op, gy)?,
    );
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    // the cotangent of the inverse transform: a scaled DFT of gy
    let (mut gr, mut gi) = (output(cx, op, b * co * m)?, output(cx, op, b * co * m)?);
    transform(
        op,
        dft,
        false,
        (g, None),
        (&mut gr, Some(&mut gi)),
        b * co,
        n,
        m,
        true,
    )?;
    let mut grads = vec![None, None, None];
    if need(0) {
        let (mut gxr, mut gxi) = (output(cx, op, b * ci * m)?, output(cx, op, b * ci * m)?);
        mix(
            op,
            Mix::InputGradient,
            ((&gr, &gi), (wr, wi)),
            (&mut gxr, &mut gxi),
            (b, ci, co, m),
        )?;
        let mut gx = output(cx, op, b * ci * n)?;
        transform(
            op,
            dft,
            true,
            (&gxr, Some(&gxi)),
            (&mut gx, None),
            b * ci,
            n,
            m,
            false,
        )?;
        grads[0] = Some(tensor(gx, inputs[0].shape())?);
    }
    if need(1) || need(2) {
        let (mut xr, mut xi) = (output(cx, op, b * ci * m)?, output(cx, op, b * ci * m)?);
        transform(
            op,
            dft,
            false,
            (x, None),
            (&mut xr, Some(&mut xi)),
            b * ci,
            n,
            m,
            false,
        )?;
        let (mut gwr, mut gwi) = (output(cx, op, ci * co * m)?, output(cx, op, ci * co * m)?);
        mix(
            op,
            Mix::WeightGradient,
            ((&gr, &gi), (&xr, &xi)),
            (&mut gwr, &mut gwi),
            (b, ci, co, m),
        )?;
        let w_shape = inputs[1].shape();
        grads[1] = need(1).then(|| tensor(gwr, w_shape)).transpose()?;
        grads[2] = need(2).then(|| tensor(gwi, w_shape)).transpose()?;
    }
    Ok(grads)
}
