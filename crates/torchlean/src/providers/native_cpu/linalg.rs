//! Native matrix products through the `gemm` crate, and the MSE loss.

use super::par::{gemm, Mat, CHUNK, PAR_THRESHOLD};
use crate::graph::Op;
use crate::runtime::kernel::Dense;
use crate::spec::{matmul_dims, numel};
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::borrow::Cow;

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    match op {
        Op::Matmul => {
            // invariant: the shape rule (run before every kernel) accepted these dims
            let (d, _) = matmul_dims(x[0].shape(), x[1].shape()).expect("guard checked the dims");
            let (a, b) = (x[0].data(), x[1].data());
            let mut c = super::par::zeroed(numel(out_shape));
            if !d.b_batched {
                // a: [batch*m, k] @ b: [k, n] in one product
                gemm(
                    d.batch * d.m,
                    d.n,
                    d.k,
                    Mat::rows(&a, d.k),
                    Mat::rows(&b, d.n),
                    &mut c,
                    false,
                    true,
                );
            } else {
                for bi in 0..d.batch {
                    let ao = if d.a_batched { bi * d.m * d.k } else { 0 };
                    let bo = bi * d.k * d.n;
                    gemm(
                        d.m,
                        d.n,
                        d.k,
                        Mat::rows(&a[ao..], d.k),
                        Mat::rows(&b[bo..], d.n),
                        &mut c[bi * d.m * d.n..],
                        false,
                        true,
                    );
                }
            }
            c
        }
        Op::Linear => {
            let data: Vec<_> = x.iter().map(|t| t.data()).collect();
            let dense: Vec<Dense> = dense_views(x, &data);
            let mut y = super::par::overwritten(numel(out_shape));
            linear_into(&dense, &mut y);
            y
        }
        Op::MseLoss => vec![mse_value(&x[0].data(), &x[1].data())],
        _ => unreachable!("linalg::forward called for {}", op.name()),
    }
}

pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor, needs: &[bool]) -> Vec<Option<Tensor>> {
    let need = |i: usize| needs.get(i).copied().unwrap_or(true);
    let g = gy.data();
    match op {
        Op::Matmul => {
            // invariant: the shape rule (run before every kernel) accepted these dims
            let (d, _) = matmul_dims(x[0].shape(), x[1].shape()).expect("guard checked the dims");
            let (a, b) = (x[0].data(), x[1].data());
            let (mk, kn, mn) = (d.m * d.k, d.k * d.n, d.m * d.n);
            let ga = need(0).then(|| {
                let mut ga = super::par::zeroed(x[0].numel());
                if !d.b_batched {
                    // gA [bm, k] = gY [bm, n] @ B^T
                    gemm(
                        d.batch * d.m,
                        d.k,
                        d.n,
                        Mat::rows(&g, d.n),
                        Mat::transposed(&b, d.n),
                        &mut ga,
                        false,
                        true,
                    );
                } else {
                    for bi in 0..d.batch {
                        let ao = if d.a_batched { bi * mk } else { 0 };
                        let acc = !d.a_batched && bi > 0;
                        gemm(
                            d.m,
                            d.k,
                            d.n,
                            Mat::rows(&g[bi * mn..], d.n),
                            Mat::transposed(&b[bi * kn..], d.n),
                            &mut ga[ao..],
                            acc,
                            true,
                        );
                    }
                }
                Tensor::from_parts(ga, x[0].shape().to_vec())
            });
            let gb = need(1).then(|| {
                let mut gb = super::par::zeroed(x[1].numel());
                if !d.b_batched {
                    // gB [k, n] = A^T [k, bm] @ gY [bm, n]
                    gemm(
                        d.k,
                        d.n,
                        d.batch * d.m,
                        Mat::transposed(&a, d.k),
                        Mat::rows(&g, d.n),
                        &mut gb,
                        false,
                        true,
                    );
                } else {
                    for bi in 0..d.batch {
                        let ao = if d.a_batched { bi * mk } else { 0 };
                        gemm(
                            d.k,
                            d.n,
                            d.m,
                            Mat::transposed(&a[ao..], d.k),
                            Mat::rows(&g[bi * mn..], d.n),
                            &mut gb[bi * kn..],
                            false,
                            true,
                        );
                    }
                }
                Tensor::from_parts(gb, x[1].shape().to_vec())
            });
            vec![ga, gb]
        }
        Op::Linear => {
            let data: Vec<_> = x.iter().map(|t| t.data()).collect();
            let dense: Vec<Dense> = dense_views(x, &data);
            let mut bufs: Vec<Option<Vec<f32>>> = x
                .iter()
                .enumerate()
                .map(|(i, t)| need(i).then(|| super::par::overwritten(t.numel())))
                .collect();
            let mut outs: Vec<Option<&mut [f32]>> =
                bufs.iter_mut().map(|b| b.as_deref_mut()).collect();
            linear_vjp_into(&dense, &g, &mut outs);
            bufs.into_iter()
                .zip(x)
                .map(|(b, t)| b.map(|b| Tensor::from_parts(b, t.shape().to_vec())))
                .collect()
        }
        Op::MseLoss => {
            let (a, b) = (x[0].data(), x[1].data());
            let mut ga = super::par::overwritten(a.len());
            let mut gb = super::par::overwritten(b.len());
            mse_vjp_into(&a, &b, g[0], &mut [Some(&mut ga), Some(&mut gb)]);
            vec![
                Some(Tensor::from_parts(ga, x[0].shape().to_vec())),
                Some(Tensor::from_parts(gb, x[1].shape().to_vec())),
            ]
        }
        _ => unreachable!("linalg::vjp called for {}", op.name()),
    }
}

/// Dense views of tensors whose row-major elements are `data`.
fn dense_views<'a>(x: &'a [&Tensor], data: &'a [Cow<'a, [f32]>]) -> Vec<Dense<'a>> {
    x.iter()
        .zip(data)
        .map(|(t, d)| Dense {
            data: d,
            shape: t.shape(),
        })
        .collect()
}

/// `y = x @ Wᵀ (+ b)` for `x` [.., in], `W` [out, in], `b` [out]; `y` has rows·out elements.
pub fn linear_into(x: &[Dense], y: &mut [f32]) {
    let (outf, inp) = (x[1].shape[0], x[1].shape[1]);
    let rows = numel(&x[0].shape[..x[0].shape.len() - 1]);
    gemm(
        rows,
        outf,
        inp,
        Mat::rows(x[0].data, inp),
        Mat::transposed(x[1].data, inp),
        y,
        false,
        true,
    );
    if let Some(b) = x.get(2) {
        for row in y.chunks_mut(outf.max(1)) {
            for (v, bv) in row.iter_mut().zip(b.data) {
                *v += bv;
            }
        }
    }
}

/// The cotangents of `linear` into `outs` (x, W and b where `Some`), from the output's
/// cotangent `g` [rows, out]. The bias cotangent sums the rows in order.
pub fn linear_vjp_into(x: &[Dense], g: &[f32], outs: &mut [Option<&mut [f32]>]) {
    let (outf, inp) = (x[1].shape[0], x[1].shape[1]);
    let rows = numel(&x[0].shape[..x[0].shape.len() - 1]);
    if let Some(gx) = outs.get_mut(0).and_then(|o| o.as_deref_mut()) {
        gemm(
            rows,
            inp,
            outf,
            Mat::rows(g, outf),
            Mat::rows(x[1].data, inp),
            gx,
            false,
            true,
        );
    }
    if let Some(gw) = outs.get_mut(1).and_then(|o| o.as_deref_mut()) {
        gemm(
            outf,
            inp,
            rows,
            Mat::transposed(g, outf),
            Mat::rows(x[0].data, inp),
            gw,
            false,
            true,
        );
    }
    if let Some(gb) = outs.get_mut(2).and_then(|o| o.as_deref_mut()) {
        super::reduce::column_sums_into(g, outf, gb);
    }
}

/// The mean of squared differences (in parallel partial sums above the threshold).
pub fn mse_value(a: &[f32], b: &[f32]) -> f32 {
    let sq = |(a, b): (&[f32], &[f32])| super::vmath::sum_zip(a, b, |x, y| (x - y) * (x - y));
    let s: f32 = if a.len() < PAR_THRESHOLD {
        sq((a, b))
    } else {
        let partials: Vec<f32> = a
            .par_chunks(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .map(sq)
            .collect();
        super::vmath::pairwise(partials)
    };
    s / a.len() as f32
}

/// The cotangents of `mse_loss(a, b)` for the scalar cotangent `g`: `2g/n·(a - b)` and its
/// negation, into `outs` where `Some`.
pub fn mse_vjp_into(a: &[f32], b: &[f32], g: f32, outs: &mut [Option<&mut [f32]>]) {
    let scale = 2.0 * g / a.len() as f32;
    if let Some(ga) = outs.get_mut(0).and_then(|o| o.as_deref_mut()) {
        for ((o, x), y) in ga.iter_mut().zip(a).zip(b) {
            *o = scale * (x - y);
        }
    }
    if let Some(gb) = outs.get_mut(1).and_then(|o| o.as_deref_mut()) {
        for ((o, x), y) in gb.iter_mut().zip(a).zip(b) {
            // PyTorch's: −ga's value, +0 where x = y
            *o = scale * (y - x);
        }
    }
}
