//! Native reductions, softmax and argmax. Every sum runs in a fixed order (rows in
//! parallel; a row in 16 lanes over blocks added pairwise, `vmath::sum`; the total sum over
//! fixed chunks, their partials added pairwise; sums over leading or middle axes cascaded
//! per output as the spec's), so results are deterministic, and no long sum is added left
//! to right (whose error grows with its length: a mean of 262 144 values near 100 was off
//! by 15 ulps).

use super::par::{for_rows, CHUNK, PAR_THRESHOLD};
use crate::graph::Op;
use crate::spec::numel;
use crate::tensor::{Layout, Tensor};
use rayon::prelude::*;

/// Sums `data` of shape `from` down to the broadcast-compatible shape `to` (the VJP of
/// broadcasting, and the core of `reduce_sum`).
pub fn sum_to_shape(data: &[f32], from: &[usize], to: &[usize]) -> Tensor {
    let mut out = super::par::overwritten(numel(to));
    sum_to_shape_into(data, from, to, &mut out);
    Tensor::from_parts(out, to.to_vec())
}

/// `out[j]` = the sum over the rows of `data` (rows of `width`) of column j, each column a
/// cascade sum in the spec's order (`spec::sum`: rows added in blocks of 32, the blocks'
/// sums pairwise), so a bias gradient over a large batch errs by O(log rows)·u rather than
/// O(rows)·u. Vectorized across the columns.
pub fn column_sums_into(data: &[f32], width: usize, out: &mut [f32]) {
    let block_rows = crate::spec::sum::BLOCK;
    let mut levels: Vec<Option<Vec<f32>>> = Vec::new();
    let mut block = vec![0.0f32; width];
    let mut in_block = 0;
    for row in data.chunks_exact(width.max(1)) {
        for (b, &v) in block.iter_mut().zip(row) {
            *b += v;
        }
        in_block += 1;
        if in_block == block_rows {
            let mut carry = std::mem::replace(&mut block, vec![0.0f32; width]);
            in_block = 0;
            let mut level = 0;
            loop {
                if level == levels.len() {
                    levels.push(None);
                }
                match levels[level].take() {
                    Some(older) => {
                        // older + carry, element by element (addition commutes exactly)
                        for (c, o) in carry.iter_mut().zip(&older) {
                            *c += *o;
                        }
                        level += 1;
                    }
                    None => {
                        levels[level] = Some(carry);
                        break;
                    }
                }
            }
        }
    }
    out.fill(0.0);
    let mut any = false;
    for s in levels.iter().rev().flatten() {
        for (o, &v) in out.iter_mut().zip(s) {
            *o = if any { *o + v } else { v };
        }
        any = true;
    }
    if in_block > 0 {
        for (o, &v) in out.iter_mut().zip(&block) {
            *o = if any { *o + v } else { v };
        }
    }
}

/// [`sum_to_shape`] into `out` (of `to`'s element count), every element written.
pub fn sum_to_shape_into(data: &[f32], from: &[usize], to: &[usize], out: &mut [f32]) {
    if from == to {
        out.copy_from_slice(data);
        return;
    }
    let n_out = numel(to);
    let extra = from.len() - to.len();
    // keep-dim view of the target inside `from`'s rank
    let mut keep: Vec<usize> = vec![1; extra];
    keep.extend_from_slice(to);
    out.fill(0.0);
    // fast path: reduce only leading axes -> column sums over rows of width n_out
    let lead = keep
        .iter()
        .zip(from)
        .take_while(|(k, f)| **k == 1 && **f != 1)
        .count();
    if keep[lead..] == from[lead..] && n_out == 1 {
        // a total (a mean loss over every axis): one vectorized sum, not a chain of
        // dependent one-element additions
        out[0] = super::vmath::sum(data);
        return;
    }
    if keep[lead..] == from[lead..] && n_out > 0 {
        column_sums_into(data, n_out, out);
        return;
    }
    // fast path: reduce only trailing axes -> row sums
    let kept = keep.iter().zip(from).take_while(|(k, f)| k == f).count();
    if keep[kept..].iter().all(|&k| k == 1) {
        let width = numel(&from[kept..]);
        if width > 0 {
            for_rows(out, 1, |i, o| {
                o[0] = super::vmath::sum(&data[i * width..(i + 1) * width])
            });
        }
        return;
    }
    // reduce only a contiguous run of middle axes: each outer block's rows of `inner`
    // elements fed to cascaded column sums (the spec's order, vectorized over the row)
    let reduced_run = keep[kept..].iter().take_while(|&&k| k == 1).count();
    if kept > 0 && keep[kept + reduced_run..] == from[kept + reduced_run..] {
        let mid = numel(&from[kept..kept + reduced_run]);
        let inner = numel(&from[kept + reduced_run..]);
        if mid > 0 && inner > 0 {
            for (o, out_row) in out.chunks_mut(inner).enumerate() {
                let mut sums = crate::spec::sum::RowSums::<f32>::new(inner);
                for m in 0..mid {
                    let row = &data[(o * mid + m) * inner..(o * mid + m + 1) * inner];
                    sums.push_row(|j| row[j]);
                }
                out_row.copy_from_slice(&sums.totals());
            }
        }
        return;
    }
    // general: scatter-add through the broadcast layout of the target, each output's terms
    // cascaded (`spec::sum`'s order) rather than added left to right
    let mut sums = crate::spec::sum::Sums::<f32>::new(n_out);
    let target = Layout::contiguous(keep).broadcast(from);
    let mut idx = vec![0usize; from.len()];
    for &v in data {
        sums.add(target.position(&idx), v);
        for d in (0..from.len()).rev() {
            idx[d] += 1;
            if idx[d] < from[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out.copy_from_slice(&sums.totals());
}

/// Deterministic sum of all elements (fixed chunks, their partial sums added pairwise).
pub fn sum_all(data: &[f32]) -> f32 {
    if data.len() < PAR_THRESHOLD {
        return super::vmath::sum(data);
    }
    let partials: Vec<f32> = data.par_chunks(CHUNK).map(super::vmath::sum).collect();
    super::vmath::pairwise(partials)
}

fn keepdim_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if axes.contains(&d) { 1 } else { n })
        .collect()
}

pub fn forward(op: &Op, x: &Tensor, out_shape: &[usize]) -> Vec<f32> {
    let data = x.data();
    match op {
        Op::SumAll => vec![sum_all(&data)],
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            let s = sum_to_shape(&data, x.shape(), &keepdim_shape(x.shape(), axes)).to_vec();
            if let Op::ReduceMean { .. } = op {
                let count = axes.iter().map(|&a| x.shape()[a]).product::<usize>() as f32;
                s.into_iter().map(|v| v / count).collect()
            } else {
                s
            }
        }
        Op::Argmax { axis } => {
            let (outer, dim, inner) = split(x.shape(), *axis);
            let mut out = super::par::zeroed(numel(out_shape));
            for o in 0..outer {
                for i in 0..inner {
                    let at = |j: usize| data[(o * dim + j) * inner + i];
                    let mut best = 0;
                    for j in 1..dim {
                        if crate::scalar::beats_max(at(j), at(best)) {
                            best = j;
                        }
                    }
                    out[o * inner + i] = best as f32;
                }
            }
            out
        }
        _ => unreachable!("reduce::forward called for {}", op.name()),
    }
}

pub fn vjp(op: &Op, x: &Tensor, gy: &Tensor) -> Tensor {
    let shape = x.shape().to_vec();
    match op {
        Op::SumAll => {
            // a cached buffer, filled on both threads (a fresh one faults in every page)
            let mut out = super::par::overwritten(numel(&shape));
            let g = gy.data()[0];
            super::par::for_chunks(&mut out, |_, c| c.fill(g));
            Tensor::from_parts(out, shape)
        }
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            let keep = keepdim_shape(&shape, axes);
            let g = gy.data();
            let scale = if let Op::ReduceMean { .. } = op {
                1.0 / axes.iter().map(|&a| shape[a]).product::<usize>() as f32
            } else {
                1.0
            };
            let out = super::elementwise::zip_map([&g], [&keep], &shape, |[v]| v * scale);
            Tensor::from_parts(out, shape)
        }
        _ => unreachable!("reduce::vjp called for {}", op.name()),
    }
}

/// (outer, dim, inner) around `axis`.
pub fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        numel(&shape[..axis]),
        shape[axis],
        numel(&shape[axis + 1..]),
    )
}

/// Softmax / log-softmax along `axis`.
pub fn softmax_forward(op: &Op, x: &Tensor) -> Vec<f32> {
    let data = x.data();
    let mut out = super::par::overwritten(data.len());
    softmax_forward_into(op, &data, x.shape(), &mut out);
    out
}

/// [`softmax_forward`] of `data` (of `shape`) into `out`, every element written.
pub fn softmax_forward_into(op: &Op, data: &[f32], shape: &[usize], out: &mut [f32]) {
    let (axis, log) = match op {
        Op::Softmax { axis } => (*axis, false),
        Op::LogSoftmax { axis } => (*axis, true),
        _ => unreachable!("softmax_forward called for {}", op.name()),
    };
    let (outer, dim, inner) = split(shape, axis);
    if inner == 1 {
        for_rows(out, dim, |r, o| {
            softmax_row(&data[r * dim..(r + 1) * dim], o, log)
        });
    } else {
        let mut row = super::par::zeroed(dim);
        let mut res = super::par::zeroed(dim);
        for oi in 0..outer {
            for i in 0..inner {
                for j in 0..dim {
                    row[j] = data[(oi * dim + j) * inner + i];
                }
                softmax_row(&row, &mut res, log);
                for j in 0..dim {
                    out[(oi * dim + j) * inner + i] = res[j];
                }
            }
        }
    }
}

fn softmax_row(x: &[f32], out: &mut [f32], log: bool) {
    let m = super::vmath::max(x);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = super::vmath::exp(v - m);
    }
    let z = super::vmath::sum(out);
    if log {
        let lz = z.ln();
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v - m - lz;
        }
    } else {
        let inv = 1.0 / z;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

pub fn softmax_vjp(op: &Op, y: &Tensor, gy: &Tensor) -> Vec<f32> {
    let (yd, gd) = (y.data(), gy.data());
    let mut out = super::par::overwritten(yd.len());
    softmax_vjp_into(op, &yd, y.shape(), &gd, &mut out);
    out
}

/// [`softmax_vjp`] from the output `yd` (of `shape`) and its cotangent `gd`, into `out`.
pub fn softmax_vjp_into(op: &Op, yd: &[f32], shape: &[usize], gd: &[f32], out: &mut [f32]) {
    let (axis, log) = match op {
        Op::Softmax { axis } => (*axis, false),
        Op::LogSoftmax { axis } => (*axis, true),
        _ => unreachable!("softmax_vjp called for {}", op.name()),
    };
    let (outer, dim, inner) = split(shape, axis);
    let row_vjp =
        |yr: &dyn Fn(usize) -> f32, gr: &dyn Fn(usize) -> f32, o: &mut dyn FnMut(usize, f32)| {
            if log {
                let s: f32 = (0..dim).map(gr).sum();
                for j in 0..dim {
                    o(j, gr(j) - super::vmath::exp(yr(j)) * s);
                }
            } else {
                let s: f32 = (0..dim).map(|j| gr(j) * yr(j)).sum();
                for j in 0..dim {
                    o(j, yr(j) * (gr(j) - s));
                }
            }
        };
    if inner == 1 {
        // contiguous rows: slice loops and lane-parallel sums (no per-element calls)
        for_rows(out, dim, |r, o| {
            let (yr, gr) = (&yd[r * dim..(r + 1) * dim], &gd[r * dim..(r + 1) * dim]);
            if log {
                let s = super::vmath::sum(gr);
                for ((o, &g), &y) in o.iter_mut().zip(gr).zip(yr) {
                    *o = g - super::vmath::exp(y) * s;
                }
            } else {
                let s = super::vmath::sum_zip(gr, yr, |g, y| g * y);
                for ((o, &g), &y) in o.iter_mut().zip(gr).zip(yr) {
                    *o = y * (g - s);
                }
            }
        });
    } else {
        for oi in 0..outer {
            for i in 0..inner {
                let at = |j: usize| (oi * dim + j) * inner + i;
                row_vjp(&|j| yd[at(j)], &|j| gd[at(j)], &mut |j, v| out[at(j)] = v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Each output of a sum over `from` down to `to` against its f64 sum: within 10^-7
    /// relative wherever an output sums 65 536 terms. Left to right (the scatter path a
    /// middle or non-contiguous reduction took before) erred by up to 1.2·10⁻⁵.
    fn assert_long_sums_are_accurate(from: &[usize], to: &[usize]) {
        let data = super::super::vmath::tests::near_hundred(crate::spec::numel(from), 7);
        let got = super::sum_to_shape(&data, from, to).to_vec();
        // the f64 sums, each element added to the output its index maps to (the target's
        // axes, padded with leading 1s, read at index 0 where they are 1)
        let mut keep = vec![1usize; from.len() - to.len()];
        keep.extend_from_slice(to);
        let mut want = vec![0.0f64; crate::spec::numel(to)];
        let mut idx = vec![0usize; from.len()];
        for &v in &data {
            let pos = idx
                .iter()
                .zip(&keep)
                .fold(0, |p, (&i, &k)| p * k + if k == 1 { 0 } else { i });
            want[pos] += f64::from(v);
            for d in (0..from.len()).rev() {
                idx[d] += 1;
                if idx[d] < from[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let rel = (f64::from(g) - w).abs() / w.abs();
            assert!(
                rel < 1e-7,
                "{from:?} -> {to:?}, output {i}: {g} against {w} ({rel:e})"
            );
        }
    }

    #[test]
    fn long_sums_over_middle_trailing_and_scattered_axes_are_accurate() {
        assert_long_sums_are_accurate(&[2, 1 << 16, 3], &[2, 1, 3]); // a middle axis
        assert_long_sums_are_accurate(&[3, 1 << 16], &[3, 1]); // a row
        assert_long_sums_are_accurate(&[256, 3, 256], &[1, 3, 1]); // axes 0 and 2
        assert_long_sums_are_accurate(&[1 << 16, 3], &[3]); // the leading axis
        assert_long_sums_are_accurate(&[1 << 10, 1 << 10], &[]); // every axis
    }

    /// Each column is the spec's cascade sum of that column, bit for bit, at every row count
    /// around the block and level boundaries.
    #[test]
    fn column_sums_are_the_spec_cascade_of_each_column() {
        let width = 5;
        for rows in [0, 1, 31, 32, 33, 64, 65, 96, 127, 128, 129, 1000, 4097] {
            let data: Vec<f32> = (0..rows * width)
                .map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 37.0 + 100.0)
                .collect();
            let mut out = vec![f32::NAN; width];
            super::column_sums_into(&data, width, &mut out);
            for (j, &got) in out.iter().enumerate() {
                let want = crate::spec::sum::sum((0..rows).map(|r| data[r * width + j]));
                assert_eq!(got.to_bits(), want.to_bits(), "rows {rows}, column {j}");
            }
        }
    }
}
