//! Native matrix products through the `gemm` crate, and the MSE loss.

use super::par::{gemm, Mat, CHUNK, PAR_THRESHOLD};
use super::reduce::sum_to_shape;
use crate::graph::Op;
use crate::spec::{matmul_dims, numel};
use crate::tensor::Tensor;
use rayon::prelude::*;

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
            let (outf, inp) = (x[1].shape()[0], x[1].shape()[1]);
            let rows = numel(&x[0].shape()[..x[0].rank() - 1]);
            let (xd, w) = (x[0].data(), x[1].data());
            let mut y = super::par::zeroed(rows * outf);
            gemm(
                rows,
                outf,
                inp,
                Mat::rows(&xd, inp),
                Mat::transposed(&w, inp),
                &mut y,
                false,
                true,
            );
            if let Some(b) = x.get(2) {
                let b = b.data();
                for row in y.chunks_mut(outf.max(1)) {
                    for (v, bv) in row.iter_mut().zip(b.iter()) {
                        *v += bv;
                    }
                }
            }
            y
        }
        Op::MseLoss => {
            let (a, b) = (x[0].data(), x[1].data());
            let sq = |(a, b): (&[f32], &[f32])| {
                a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>()
            };
            let s: f32 = if a.len() < PAR_THRESHOLD {
                sq((&a, &b))
            } else {
                let partials: Vec<f32> = a
                    .par_chunks(CHUNK)
                    .zip(b.par_chunks(CHUNK))
                    .map(sq)
                    .collect();
                partials.iter().sum()
            };
            vec![s / a.len() as f32]
        }
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
            let (outf, inp) = (x[1].shape()[0], x[1].shape()[1]);
            let rows = numel(&x[0].shape()[..x[0].rank() - 1]);
            let (xd, w) = (x[0].data(), x[1].data());
            let gx = need(0).then(|| {
                let mut gx = super::par::zeroed(rows * inp);
                gemm(
                    rows,
                    inp,
                    outf,
                    Mat::rows(&g, outf),
                    Mat::rows(&w, inp),
                    &mut gx,
                    false,
                    true,
                );
                Tensor::from_parts(gx, x[0].shape().to_vec())
            });
            let gw = need(1).then(|| {
                let mut gw = super::par::zeroed(outf * inp);
                gemm(
                    outf,
                    inp,
                    rows,
                    Mat::transposed(&g, outf),
                    Mat::rows(&xd, inp),
                    &mut gw,
                    false,
                    true,
                );
                Tensor::from_parts(gw, x[1].shape().to_vec())
            });
            let mut grads = vec![gx, gw];
            if x.len() == 3 {
                grads.push(need(2).then(|| sum_to_shape(&g, &[rows, outf], &[outf])));
            }
            grads
        }
        Op::MseLoss => {
            let (a, b) = (x[0].data(), x[1].data());
            let scale = 2.0 * g[0] / a.len() as f32;
            let ga: Vec<f32> = a
                .iter()
                .zip(b.iter())
                .map(|(x, y)| scale * (x - y))
                .collect();
            let gb = ga.iter().map(|v| -v).collect();
            vec![
                Some(Tensor::from_parts(ga, x[0].shape().to_vec())),
                Some(Tensor::from_parts(gb, x[1].shape().to_vec())),
            ]
        }
        _ => unreachable!("linalg::vjp called for {}", op.name()),
    }
}
