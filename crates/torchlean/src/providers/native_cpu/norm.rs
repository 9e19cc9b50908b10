//! Native normalization kernels: row-parallel layer/RMS norm, channel-wise batch norm.
//! Statistics are computed in f32 with two passes (mean, then centred variance).

use super::par::for_rows;
use super::reduce::split;
use super::vmath;
use crate::graph::Op;
use crate::spec::GroupStats;
use crate::tensor::Tensor;

fn eps(op: &Op) -> f32 {
    match op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } | Op::BatchNorm { eps, .. } => *eps,
        _ => unreachable!("norm::eps called for {}", op.name()),
    }
}

/// The statistics of a row that has none to rescue: x̂ = (x − μ)·rstd.
fn plain(mu: f32, rstd: f32) -> GroupStats<f32> {
    GroupStats { mu, rstd, s: 1.0 }
}

/// (mean, 1/std) of a row; RMS norm has mean 0. Lane-parallel sums (they vectorize). The
/// mean relative to the row's first value, as the spec's (`spec::norm::moments`: a constant
/// row's mean exact). Rows whose statistics overflow take the spec's rescue, x̂ computed on
/// scaled values (`spec::norm::GroupStats`).
fn row_stats(row: &[f32], rms: bool, eps: f32) -> GroupStats<f32> {
    let n = row.len() as f32;
    let mu = match row.first() {
        Some(&x0) if !rms => x0 + vmath::sum_map(row, |v| v - x0) / n,
        _ => 0.0,
    };
    let var = vmath::sum_map(row, |v| (v - mu) * (v - mu)) / n;
    if !(mu.is_finite() && var.is_finite()) && row.iter().all(|v| v.is_finite()) {
        // finite values whose statistics overflowed f32: the spec's rescue
        return crate::spec::rescaled_stats(rms, eps, row.iter().copied());
    }
    plain(mu, 1.0 / (var + eps).sqrt())
}

/// The (mean, 1/std) of every row of width `d` (rows in parallel when large).
fn all_row_stats(xd: &[f32], d: usize, rms: bool, eps: f32) -> Vec<GroupStats<f32>> {
    use rayon::prelude::*;
    if xd.len() < super::par::PAR_THRESHOLD {
        return xd
            .chunks(d.max(1))
            .map(|row| row_stats(row, rms, eps))
            .collect();
    }
    xd.par_chunks(d.max(1))
        .map(|row| row_stats(row, rms, eps))
        .collect()
}

/// Rows per block of the parameter gradients' column sums (fixed, so the sums' order does
/// not depend on the thread count).
const PARAM_ROWS: usize = 64;

/// The column sums of layer/RMS norm's parameter gradients, (Σ_r g·x̂, Σ_r g): partial sums
/// over fixed blocks of [`PARAM_ROWS`] rows (in parallel when large), added pairwise.
fn param_grads(xd: &[f32], g: &[f32], stats: &[GroupStats<f32>], d: usize) -> (Vec<f32>, Vec<f32>) {
    use rayon::prelude::*;
    let block = |b: usize| {
        let (mut gg, mut gb) = (vec![0.0f32; d], vec![0.0f32; d]);
        let rows = b * PARAM_ROWS..((b + 1) * PARAM_ROWS).min(stats.len());
        for r in rows {
            let st = stats[r];
            let (row, gr) = (&xd[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
            for j in 0..d {
                // x̂ first, as the spec: g·(x − μ) overflows for rows near f32's range
                gg[j] += gr[j] * st.xhat(row[j]);
                gb[j] += gr[j];
            }
        }
        (gg, gb)
    };
    let blocks = stats.len().div_ceil(PARAM_ROWS);
    let parts: Vec<(Vec<f32>, Vec<f32>)> = if xd.len() < super::par::PAR_THRESHOLD {
        (0..blocks).map(block).collect()
    } else {
        (0..blocks).into_par_iter().map(block).collect()
    };
    // the blocks' partial sums added pairwise (a balanced tree, adjacent blocks first): no
    // long left-to-right sum over many blocks; up to three blocks the same additions as in
    // order. Added to +0 at the end, as a sum starts from +0 (a column of -0s sums to +0).
    let mut level = parts;
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        let mut it = level.into_iter();
        while let Some((mut ag, mut ab)) = it.next() {
            if let Some((bg, bb)) = it.next() {
                ag.iter_mut().zip(&bg).for_each(|(a, b)| *a += b);
                ab.iter_mut().zip(&bb).for_each(|(a, b)| *a += b);
            }
            next.push((ag, ab));
        }
        level = next;
    }
    let (mut gg, mut gb) = (vec![0.0f32; d], vec![0.0f32; d]);
    if let Some((pg, pb)) = level.pop() {
        gg.iter_mut().zip(&pg).for_each(|(a, b)| *a += b);
        gb.iter_mut().zip(&pb).for_each(|(a, b)| *a += b);
    }
    (gg, gb)
}

pub fn forward(op: &Op, x: &[&Tensor]) -> Vec<f32> {
    let (xd, gamma) = (x[0].data(), x[1].data());
    let beta = x.get(2).map(|b| b.data());
    let e = eps(op);
    // every element is written below (each row, or each channel's elements)
    let mut y = super::par::overwritten(xd.len());
    match op {
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let d = *x[0].shape().last().unwrap_or(&1);
            let rms = matches!(op, Op::RmsNorm { .. });
            let gamma = &gamma[..d];
            // no shift adds nothing, as the spec (rms_norm's −0 stays −0, as PyTorch's)
            let shift = beta.as_ref().map(|b| &b[..d]);
            for_rows(&mut y, d, |r, out| {
                let row = &xd[r * d..(r + 1) * d];
                let GroupStats { mu, rstd, s } = row_stats(row, rms, e);
                // x·s is x itself for s = 1 (every row but the rescued ones)
                match shift {
                    Some(shift) => {
                        for (((o, &x), &g), &b) in out.iter_mut().zip(row).zip(gamma).zip(shift) {
                            *o = (x * s - mu) * rstd * g + b;
                        }
                    }
                    None => {
                        for ((o, &x), &g) in out.iter_mut().zip(row).zip(gamma) {
                            *o = (x * s - mu) * rstd * g;
                        }
                    }
                }
            });
        }
        Op::BatchNorm { channel_axis, .. } => {
            let (outer, c, inner) = split(x[0].shape(), *channel_axis);
            for ch in 0..c {
                let st = channel_stats(&xd, outer, c, inner, ch, e);
                let (g, b) = (gamma[ch], beta.as_ref().map(|b| b[ch]));
                for o in 0..outer {
                    let base = (o * c + ch) * inner;
                    for i in 0..inner {
                        let scaled = st.xhat(xd[base + i]) * g;
                        y[base + i] = b.map_or(scaled, |b| scaled + b);
                    }
                }
            }
        }
        _ => unreachable!("norm::forward called for {}", op.name()),
    }
    y
}

/// Σ f over a channel's N·H·W terms (`n`, in `parts` of H·W): left to right up to
/// [`vmath::SUM_BLOCK`] terms (the spec's order up to its 32-term blocks, bit for bit), else
/// each part in lanes and the parts added pairwise (no long left-to-right sum: a channel of
/// 64 images of 32×32 is 65 536 terms).
fn channel_sum<'a>(
    parts: impl Iterator<Item = &'a [f32]>,
    n: usize,
    f: impl Fn(f32) -> f32 + Copy,
) -> f32 {
    if n <= vmath::SUM_BLOCK {
        parts.fold(0.0f32, |s, p| s + p.iter().map(|&x| f(x)).sum::<f32>())
    } else {
        vmath::pairwise(parts.map(|p| vmath::sum_map(p, f)))
    }
}

fn channel_stats(
    xd: &[f32],
    outer: usize,
    c: usize,
    inner: usize,
    ch: usize,
    eps: f32,
) -> GroupStats<f32> {
    let n = (outer * inner) as f32;
    // relative to the channel's first value, as the spec's mean (a constant channel's exact)
    let x0 = if n > 0.0 { xd[ch * inner] } else { 0.0 };
    let parts = || (0..outer).map(|o| &xd[(o * c + ch) * inner..(o * c + ch + 1) * inner]);
    let s = channel_sum(parts(), outer * inner, |x| x - x0);
    let mu = x0 + s / n;
    let v = channel_sum(parts(), outer * inner, |x| (x - mu) * (x - mu));
    let channel = || {
        (0..outer).flat_map(move |o| {
            xd[(o * c + ch) * inner..(o * c + ch + 1) * inner]
                .iter()
                .copied()
        })
    };
    if !(mu.is_finite() && v.is_finite()) && channel().all(|x| x.is_finite()) {
        // finite values whose statistics overflowed f32: the spec's rescue
        return crate::spec::rescaled_stats(false, eps, channel());
    }
    plain(mu, 1.0 / (v / n + eps).sqrt())
}

pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor) -> Vec<Option<Tensor>> {
    let (xd, gamma, g) = (x[0].data(), x[1].data(), gy.data());
    let e = eps(op);
    // every element of gx is written below (each row, or each channel's elements)
    let mut gx = super::par::overwritten(xd.len());
    let mut ggamma = super::par::zeroed(gamma.len());
    let mut gbeta = super::par::zeroed(gamma.len());
    match op {
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let d = *x[0].shape().last().unwrap_or(&1);
            let rms = matches!(op, Op::RmsNorm { .. });
            let stats = all_row_stats(&xd, d, rms, e);
            for_rows(&mut gx, d, |r, out| {
                let (row, gr) = (&xd[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
                let st = stats[r];
                let GroupStats { mu, rstd: r_s, s } = st;
                let rstd = st.rstd();
                let mg = vmath::sum_zip(gr, &gamma, |g, w| g * w);
                let mgx = vmath::sum_zip3(gr, &gamma, row, |g, w, x| g * w * ((x * s - mu) * r_s));
                let (mg, mgx) = (if rms { 0.0 } else { mg / d as f32 }, mgx / d as f32);
                for j in 0..d {
                    let xh = (row[j] * s - mu) * r_s;
                    out[j] = rstd * (gr[j] * gamma[j] - mg - xh * mgx);
                }
            });
            // parameter gradients: column sums over fixed row blocks (deterministic)
            (ggamma, gbeta) = param_grads(&xd, &g, &stats, d);
        }
        Op::BatchNorm { channel_axis, .. } => {
            let (outer, c, inner) = split(x[0].shape(), *channel_axis);
            let n = (outer * inner) as f32;
            for ch in 0..c {
                let st = channel_stats(&xd, outer, c, inner, ch, e);
                let rstd = st.rstd();
                // the channel's sums over N·H·W elements accumulate in f64: in f32, left to
                // right, a cotangent with a large mean lost ~50× PyTorch's accuracy in the
                // bias and input gradients (an audit of the thirty-eighth session)
                let (mut sg64, mut sgx64) = (0.0f64, 0.0f64);
                for o in 0..outer {
                    let base = (o * c + ch) * inner;
                    for i in 0..inner {
                        let gi = g[base + i];
                        sg64 += gi as f64;
                        sgx64 += (gi * st.xhat(xd[base + i])) as f64;
                    }
                }
                let (sg, sgx) = (sg64 as f32, sgx64 as f32);
                ggamma[ch] = sgx;
                gbeta[ch] = sg;
                // the spec's (PyTorch's) order: γ last (g·γ first overflows for a large
                // cotangent where the gradient does not)
                let (mg, mgx, w) = (sg / n, sgx / n, gamma[ch]);
                for o in 0..outer {
                    let base = (o * c + ch) * inner;
                    for i in 0..inner {
                        let xh = st.xhat(xd[base + i]);
                        gx[base + i] = (g[base + i] - mg - xh * mgx) * rstd * w;
                    }
                }
            }
        }
        _ => unreachable!("norm::vjp called for {}", op.name()),
    }
    let mut grads = vec![
        Some(Tensor::from_parts(gx, x[0].shape().to_vec())),
        Some(Tensor::from_parts(ggamma, x[1].shape().to_vec())),
    ];
    if x.len() == 3 {
        grads.push(Some(Tensor::from_parts(gbeta, x[2].shape().to_vec())));
    }
    grads
}
