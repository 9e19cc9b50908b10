//! cuFFT plumbing for the `cufft` capsule of `spectral_conv1d`: batched 1-D real transforms
//! (R2C, C2R) on the module's stream, their plans cached per (length, batch, direction), and
//! the two glue kernels (`fft_take`, `fft_put` in `kernels/spectral.cu`) that move between
//! cuFFT's interleaved half spectra and the planar first-m frequencies the spectral kernels
//! read and write. What the transforms compute is spelled out in `spectral.rs`.
//!
//! IEEE classes: an FFT combines the terms in another order than the spec's direct sum, so
//! on a signal holding an infinity it can give NaN where the spec keeps ±inf, or the other
//! way round (seen on the H200 on 2026-12-01 in the VJP rows with special values). So each
//! transform flags the rows whose input holds a NaN or an infinity (`rows_nonfinite`) and
//! sums those rows again directly (`spectral::direct` restricted to the flagged rows), on the
//! device, after cuFFT: finite rows are cuFFT's, the others follow the spec's classes. And
//! the Nyquist frequency's imaginary part, exactly 0 in an FFT but 1.2e-16-scaled in the spec
//! (its sin(fl(π))), is summed as the spec sums it: a later product with an infinity (the
//! VJP's weight gradient) then has the spec's class (0·inf is NaN, 1e-16·inf is inf).

use super::{cx, grid, launched, output};
use crate::memory::CudaBuffer;
use cudarc::cufft::{sys, CudaFft};
use cudarc::driver::PushKernelArg;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use torchlean::graph::Op;
use torchlean::{Error, Result};

/// Plans by (n, rows, inverse). A plan belongs to the module's one stream.
type Plans = Mutex<HashMap<(usize, usize, bool), Arc<CudaFft>>>;

static PLANS: OnceLock<Plans> = OnceLock::new();

fn as_i32(op: &Op, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::Other(format!(
            "op `{}`: cuFFT takes a {what} below 2^31, got {v}",
            op.name()
        ))
    })
}

/// The plan of `rows` transforms of length `n` (R2C, or C2R when `inverse`).
fn plan(op: &Op, n: usize, rows: usize, inverse: bool) -> Result<Arc<CudaFft>> {
    let plans = PLANS.get_or_init(Default::default);
    // a poisoned lock only means another thread panicked while inserting: the map is intact
    let mut plans = plans.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = plans.get(&(n, rows, inverse)) {
        return Ok(Arc::clone(p));
    }
    let kind = if inverse {
        sys::cufftType::CUFFT_C2R
    } else {
        sys::cufftType::CUFFT_R2C
    };
    let p = CudaFft::plan_1d(
        as_i32(op, "length", n)?,
        kind,
        as_i32(op, "batch", rows)?,
        cx()?.stream.clone(),
    )
    .map(Arc::new)
    .map_err(|e| super::super::device::failure(op.name(), format!("cuFFT plan: {e:?}")))?;
    plans.insert((n, rows, inverse), Arc::clone(&p));
    Ok(p)
}

/// Half-spectrum scratch for `rows` signals of length `n`: (n/2 + 1) complex values each,
/// stored as interleaved f32 pairs.
fn half_spectra(op: &Op, rows: usize, n: usize) -> Result<CudaBuffer> {
    output(&*cx()?, op, 2 * rows * (n / 2 + 1))
}

fn complex<'b>(
    op: &Op,
    b: &'b mut CudaBuffer,
    len: usize,
) -> Result<cudarc::driver::CudaViewMut<'b, sys::float2>> {
    // SAFETY: float2 is two f32 (8 bytes; device allocations are 256-byte aligned), and
    // transmute_mut checks that `len` of them fit in the buffer (`half_spectra` sizes it so).
    unsafe { b.slice_mut().transmute_mut::<sys::float2>(len) }.ok_or_else(|| {
        Error::Other(format!(
            "op `{}`: a half-spectrum buffer smaller than {len} complex values",
            op.name()
        ))
    })
}

/// The first `m` frequencies (planar re, im: rows × m) of the real DFT of `rows` signals of
/// `n` points, each times irfft_scale(k) when `scaled` (`spectral_dft`'s result, by cuFFT).
pub fn dft(
    op: &Op,
    x: &CudaBuffer,
    (outr, outi): (&mut CudaBuffer, &mut CudaBuffer),
    (rows, n, m): (usize, usize, usize),
    scaled: bool,
) -> Result<()> {
    if rows * m == 0 {
        return Ok(());
    }
    let nf = n / 2 + 1;
    let mut z = half_spectra(op, rows, n)?;
    let p = plan(op, n, rows, false)?;
    p.exec_r2c(x.slice(), &mut complex(op, &mut z, rows * nf)?)
        .map_err(|e| super::super::device::failure(op.name(), format!("cuFFT R2C: {e:?}")))?;
    let in_use = cx()?;
    let cx = &*in_use;
    let (r64, n64, m64, s) = (rows as i64, n as i64, m as i64, scaled as i32);
    let mut l = cx.stream.launch_builder(&cx.functions.fft_take);
    l.arg(z.slice())
        .arg(x.slice())
        .arg(outr.slice_mut())
        .arg(outi.slice_mut())
        .arg(&r64)
        .arg(&n64)
        .arg(&m64)
        .arg(&s);
    // SAFETY: thread p < rows·m reads the interleaved pair (row, k) of z (rows·(n/2+1)
    // pairs, k < m <= n/2 + 1 by the shape rule) and, for the Nyquist frequency, row `row`
    // of x (rows·n), and writes element p of both outputs (rows·m each, sized by the
    // caller).
    launched(op, unsafe { l.launch(grid(rows * m)) })?;
    let flags = nonfinite_rows(op, &[x], rows, n)?;
    super::spectral::direct(
        op,
        false,
        (x, None),
        (outr, Some(outi)),
        (rows, n, m),
        scaled,
        Some(&flags),
    )
}

/// One flag per row (1.0 where a row of any of `parts`, `len` values each, holds a NaN or an
/// infinity, else 0.0).
fn nonfinite_rows(op: &Op, parts: &[&CudaBuffer], rows: usize, len: usize) -> Result<CudaBuffer> {
    let in_use = cx()?;
    let cx = &*in_use;
    let mut flags = output(cx, op, rows)?;
    let (r64, l64) = (rows as i64, len as i64);
    for (i, part) in parts.iter().enumerate() {
        let accumulate = (i > 0) as i32;
        let mut l = cx.stream.launch_builder(&cx.functions.rows_nonfinite);
        l.arg(part.slice())
            .arg(flags.slice_mut())
            .arg(&r64)
            .arg(&l64)
            .arg(&accumulate);
        // SAFETY: thread `row` < rows reads row `row` of `part` (rows·len values, sized by
        // the caller) and writes flags[row] (rows values).
        launched(op, unsafe { l.launch(grid(rows)) })?;
    }
    Ok(flags)
}

/// `spectral_idft`'s result by cuFFT: rows × n real values Σ_{k<m} f_k (yr cos θ − yi sin θ),
/// f_k = irfft_scale(k) when `scaled`, else 1.
pub fn idft(
    op: &Op,
    (yr, yi): (&CudaBuffer, &CudaBuffer),
    out: &mut CudaBuffer,
    (rows, n, m): (usize, usize, usize),
    scaled: bool,
) -> Result<()> {
    if rows * n == 0 {
        return Ok(());
    }
    let nf = n / 2 + 1;
    let mut z = half_spectra(op, rows, n)?;
    let in_use = cx()?;
    let cx = &*in_use;
    let (r64, n64, m64, s) = (rows as i64, n as i64, m as i64, scaled as i32);
    let mut l = cx.stream.launch_builder(&cx.functions.fft_put);
    l.arg(yr.slice())
        .arg(yi.slice())
        .arg(z.slice_mut())
        .arg(&r64)
        .arg(&n64)
        .arg(&m64)
        .arg(&s);
    // SAFETY: thread p < rows·(n/2+1) reads (row, k < m) of yr and yi (rows·m each) and
    // writes the interleaved pair p of z (rows·(n/2+1) pairs).
    launched(op, unsafe { l.launch(grid(rows * nf)) })?;
    let p = plan(op, n, rows, true)?;
    // C2R overwrites its input: z is this call's scratch
    p.exec_c2r(&mut complex(op, &mut z, rows * nf)?, out.slice_mut())
        .map_err(|e| super::super::device::failure(op.name(), format!("cuFFT C2R: {e:?}")))?;
    let flags = nonfinite_rows(op, &[yr, yi], rows, m)?;
    super::spectral::direct(
        op,
        true,
        (yr, Some(yi)),
        (out, None),
        (rows, n, m),
        scaled,
        Some(&flags),
    )
}
