//! `matmul` (2-D or batched, with a shared 2-D side), `linear` (`x @ w^T + b`) and `mse_loss`.

use super::{expect_arity, numel, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

/// The geometry of a (batched) matrix product: `batch` products of [m, k] x [k, n]; an operand
/// without batch axes is shared by every product.
pub struct MatmulDims {
    pub batch: usize,
    pub a_batched: bool,
    pub b_batched: bool,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// The geometry and output shape of `matmul` on operands of these shapes (`None` when the
/// shapes do not multiply).
pub fn matmul_dims(a: &[usize], b: &[usize]) -> Option<(MatmulDims, Vec<usize>)> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return None;
    }
    let (ab, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let batch_shape = if ab == bb || bb.is_empty() {
        ab
    } else if ab.is_empty() {
        bb
    } else {
        return None;
    };
    let mut out = batch_shape.to_vec();
    out.extend([m, n]);
    let dims = MatmulDims {
        batch: numel(batch_shape),
        a_batched: !ab.is_empty(),
        b_batched: !bb.is_empty(),
        m,
        k,
        n,
    };
    Some((dims, out))
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    match op {
        Op::Matmul => {
            expect_arity(op, shapes, &[2])?;
            matmul_dims(shapes[0], shapes[1])
                .map(|(_, s)| s)
                .ok_or_else(|| {
                    shape_err(
                        op,
                        shapes,
                        "a [..., m, k] and b [..., k, n] with equal batch dims, or one side 2-D",
                    )
                })
        }
        Op::Linear => {
            expect_arity(op, shapes, &[2, 3])?;
            let (x, w) = (shapes[0], shapes[1]);
            let ok = !x.is_empty()
                && w.len() == 2
                && x[x.len() - 1] == w[1]
                && (shapes.len() == 2 || shapes[2] == [w[0]]);
            if !ok {
                return Err(shape_err(
                    op,
                    shapes,
                    "x [..., in], weight [out, in] and optional bias [out]",
                ));
            }
            let mut out = x.to_vec();
            // invariant: the check above rejected an empty (rank-0) x
            *out.last_mut().expect("x is non-empty, checked above") = w[0];
            Ok(out)
        }
        Op::MseLoss => {
            expect_arity(op, shapes, &[2])?;
            if shapes[0] != shapes[1] {
                return Err(shape_err(
                    op,
                    shapes,
                    "prediction and target of the same shape",
                ));
            }
            Ok(vec![])
        }
        _ => unreachable!("linalg::shape called for {}", op.name()),
    }
}

/// Plain triple-loop product of an [m, k] and a [k, n] block; `bt` reads b as [n, k].
fn mm<T: Scalar>(a: &[T], b: &[T], m: usize, k: usize, n: usize, bt: bool) -> Vec<T> {
    let mut c = vec![T::zero(); m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::zero();
            for p in 0..k {
                let bv = if bt { b[j * k + p] } else { b[p * n + j] };
                acc += a[i * k + p] * bv;
            }
            c[i * n + j] = acc;
        }
    }
    c
}

/// Transposes an [r, c] block.
fn transpose<T: Scalar>(a: &[T], r: usize, c: usize) -> Vec<T> {
    let mut t = vec![T::zero(); r * c];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = a[i * c + j];
        }
    }
    t
}

pub(super) fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>], out_shape: Vec<usize>) -> Array<T> {
    match op {
        Op::Matmul => {
            // invariant: the shape rule (run before every kernel) accepted these dims
            let (d, _) =
                matmul_dims(&xs[0].shape, &xs[1].shape).expect("shape rule checked the dims");
            let mut data = Vec::with_capacity(numel(&out_shape));
            for bi in 0..d.batch {
                let a = if d.a_batched {
                    &xs[0].data[bi * d.m * d.k..(bi + 1) * d.m * d.k]
                } else {
                    &xs[0].data[..]
                };
                let b = if d.b_batched {
                    &xs[1].data[bi * d.k * d.n..(bi + 1) * d.k * d.n]
                } else {
                    &xs[1].data[..]
                };
                data.extend(mm(a, b, d.m, d.k, d.n, false));
            }
            Array {
                shape: out_shape,
                data,
            }
        }
        Op::Linear => {
            let (inp, outf) = (xs[1].shape[1], xs[1].shape[0]);
            let rows = numel(&xs[0].shape[..xs[0].shape.len() - 1]);
            let mut data = mm(&xs[0].data, &xs[1].data, rows, inp, outf, true);
            if let Some(b) = xs.get(2) {
                for r in 0..rows {
                    for o in 0..outf {
                        data[r * outf + o] += b.data[o];
                    }
                }
            }
            Array {
                shape: out_shape,
                data,
            }
        }
        Op::MseLoss => {
            let n = T::c(xs[0].numel() as f64);
            let s: T = super::sum::sum(
                xs[0]
                    .data
                    .iter()
                    .zip(&xs[1].data)
                    .map(|(&a, &b)| (a - b) * (a - b)),
            );
            Array {
                shape: out_shape,
                data: vec![s / n],
            }
        }
        _ => unreachable!("linalg::forward called for {}", op.name()),
    }
}

pub(super) fn vjp<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    match op {
        Op::Matmul => {
            // invariant: the shape rule (run before every kernel) accepted these dims
            let (d, _) =
                matmul_dims(&xs[0].shape, &xs[1].shape).expect("shape rule checked the dims");
            let mut ga = Array::zeros(&xs[0].shape);
            let mut gb = Array::zeros(&xs[1].shape);
            for bi in 0..d.batch {
                let (ao, bo) = (
                    if d.a_batched { bi * d.m * d.k } else { 0 },
                    if d.b_batched { bi * d.k * d.n } else { 0 },
                );
                let a = &xs[0].data[ao..ao + d.m * d.k];
                let b = &xs[1].data[bo..bo + d.k * d.n];
                let g = &gy.data[bi * d.m * d.n..(bi + 1) * d.m * d.n];
                // dA = G B^T ; dB = A^T G
                let da = mm(g, b, d.m, d.n, d.k, true);
                let db = mm(&transpose(a, d.m, d.k), g, d.k, d.m, d.n, false);
                for (dst, v) in ga.data[ao..ao + d.m * d.k].iter_mut().zip(da) {
                    *dst += v;
                }
                for (dst, v) in gb.data[bo..bo + d.k * d.n].iter_mut().zip(db) {
                    *dst += v;
                }
            }
            vec![Some(ga), Some(gb)]
        }
        Op::Linear => {
            let (inp, outf) = (xs[1].shape[1], xs[1].shape[0]);
            let rows = numel(&xs[0].shape[..xs[0].shape.len() - 1]);
            let gx = mm(&gy.data, &xs[1].data, rows, outf, inp, false);
            let gw = mm(
                &transpose(&gy.data, rows, outf),
                &xs[0].data,
                outf,
                rows,
                inp,
                false,
            );
            let mut grads = vec![
                Some(Array {
                    shape: xs[0].shape.clone(),
                    data: gx,
                }),
                Some(Array {
                    shape: xs[1].shape.clone(),
                    data: gw,
                }),
            ];
            if xs.len() == 3 {
                let mut gb = super::sum::Sums::new(outf);
                for r in 0..rows {
                    for o in 0..outf {
                        gb.add(o, gy.data[r * outf + o]);
                    }
                }
                grads.push(Some(gb.into_array(&[outf])));
            }
            grads
        }
        Op::MseLoss => {
            let scale = T::c(2.0) * gy.data[0] / T::c(xs[0].numel() as f64);
            let ga = Array::from_fn(&xs[0].shape, |i| scale * (xs[0].data[i] - xs[1].data[i]));
            // PyTorch's: the same value as −ga, but +0 (not −0) where the inputs are equal
            let gb = Array::from_fn(&xs[0].shape, |i| scale * (xs[1].data[i] - xs[0].data[i]));
            vec![Some(ga), Some(gb)]
        }
        _ => unreachable!("linalg::vjp called for {}", op.name()),
    }
}
