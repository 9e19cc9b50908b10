//! Values at the edges of f32's range (an audit of the thirty-ninth session, special values
//! against PyTorch):
//! - the replay checkers of `strict_native_cpu` never reject a correct kernel there: a norm
//!   group with a non-finite value leaves the other groups their cancellation allowance, a
//!   sum of products whose partial sums may overflow in f32 is accepted as inf or NaN (but a
//!   wrong finite value is not), a fused chain's gradient may be the spec's f32 steps;
//! - the native kernels and the spec at f32 (`strict_cpu`) compute gradients in PyTorch's
//!   order of operations, so the profiles agree where an intermediate would overflow or
//!   underflow: a / b's gradients (no b²), log's and sqrt's (a division, not a product with
//!   the reciprocal), pow's g · (p · x^(p−1)), the norms' g · x̂.

use torchlean::backend::{Call, Device, Operand};
use torchlean::graph::Op;
use torchlean::providers::checkers::replay::{replay_forward, replay_vjp};
use torchlean::providers::native_cpu;
use torchlean::spec::{self, Array};
use torchlean::Tensor;

mod support;

fn dense<'a>(t: &'a [f32], shape: &'a [usize]) -> Operand<'a> {
    Operand {
        shape,
        strides: None,
        offset: 0,
        storage: t,
        device: Device::Cpu,
    }
}

fn tensor(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape).unwrap()
}

/// The forward checker's verdict on `y` as the result of `op` on `xs`.
fn check_forward(op: &Op, xs: &[Tensor], y: &[f32], shape: &[usize]) -> Result<(), String> {
    let vals: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
    let ins: Vec<Operand> = xs
        .iter()
        .zip(&vals)
        .map(|(t, v)| dense(v, t.shape()))
        .collect();
    replay_forward(
        op,
        &Call {
            inputs: &ins,
            output: dense(y, shape),
            cotangent: None,
            needs: &[],
            grads: &[],
            seed: 7,
        },
    )
}

/// The native kernel's gradients of `op` at `xs` for cotangent `g`, and the VJP checker's
/// verdict on them.
fn native_vjp_checked(op: &Op, xs: &[Tensor], g: &[f32]) -> (Vec<Vec<f32>>, Result<(), String>) {
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(op, &refs).unwrap();
    let gy = tensor(y.shape(), g);
    let needs = vec![true; xs.len()];
    let grads: Vec<Vec<f32>> = native_cpu::vjp(op, &refs, &y, &gy, &needs)
        .unwrap()
        .into_iter()
        .map(|g| g.map(|g| g.to_vec()).unwrap_or_default())
        .collect();
    let vals: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
    let ins: Vec<Operand> = xs
        .iter()
        .zip(&vals)
        .map(|(t, v)| dense(v, t.shape()))
        .collect();
    let (yv, gv) = (y.to_vec(), gy.to_vec());
    let gs: Vec<Option<Operand>> = grads
        .iter()
        .zip(xs)
        .map(|(g, x)| Some(dense(g, x.shape())))
        .collect();
    let verdict = replay_vjp(
        op,
        &Call {
            inputs: &ins,
            output: dense(&yv, y.shape()),
            cotangent: Some(dense(&gv, y.shape())),
            needs: &needs,
            grads: &gs,
            seed: 11,
        },
    );
    (grads, verdict)
}

/// The spec's gradients at f32 (what `strict_cpu` computes).
fn spec_vjp_f32(op: &Op, xs: &[Tensor], g: &[f32]) -> Vec<Vec<f32>> {
    let arrays: Vec<Array<f32>> = xs
        .iter()
        .map(|t| Array {
            shape: t.shape().to_vec(),
            data: t.to_vec(),
        })
        .collect();
    let refs: Vec<&Array<f32>> = arrays.iter().collect();
    let y = spec::forward(op, &refs).unwrap();
    let gy = Array {
        shape: y.shape.clone(),
        data: g.to_vec(),
    };
    spec::vjp(op, &refs, &y, &gy)
        .unwrap()
        .into_iter()
        .map(|g| g.map(|g| g.data).unwrap_or_default())
        .collect()
}

/// Equal as IEEE values, NaN equal to NaN and the sign of zero ignored.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

#[test]
fn a_norm_group_with_a_non_finite_value_leaves_the_others_their_allowance() {
    support::checked_cpu_default();
    // an ill-conditioned row (1e4 ± 1e-3: f32's rounding of the inputs moves the normalized
    // values by ~0.1, which the allowance covers) beside a row with an infinity
    let ill = [10000.0f32, 10000.0, 9999.999, 10000.001, 10000.002];
    let gamma = tensor(&[5], &[0.5, -1.0, 1.5, 2.0, 0.25]);
    let beta = tensor(&[5], &[0.1, 0.2, 0.3, 0.4, 0.5]);
    let mut rows = ill.to_vec();
    rows.extend([f32::INFINITY, 1.0, 2.0, 3.0, 4.0]);
    let op = Op::LayerNorm { eps: 1e-5 };
    let xs = [tensor(&[2, 5], &rows), gamma.clone(), beta.clone()];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&op, &refs).unwrap().to_vec();
    check_forward(&op, &xs, &y, &[2, 5])
        .unwrap_or_else(|e| panic!("a correct layer_norm rejected: {e}"));
    // the finite row is far from the f64 value (else the allowance would not matter) and a
    // corruption beyond the allowance is still caught
    let exact: Vec<f64> = {
        let x: Vec<f64> = ill.iter().map(|&v| v as f64).collect();
        let mu = x.iter().sum::<f64>() / 5.0;
        let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / 5.0;
        x.iter().map(|v| (v - mu) / (var + 1e-5).sqrt()).collect()
    };
    assert!(
        (y[0] as f64 - (exact[0] * 0.5 + 0.1)).abs() > 1e-2,
        "the row is not ill-conditioned: the test does not test"
    );
    let mut bad = y.clone();
    bad[1] += 50.0;
    assert!(check_forward(&op, &xs, &bad, &[2, 5]).is_err());

    // batch norm: the same channel beside a NaN channel
    let mut cols = vec![];
    for v in ill {
        cols.extend([v, f32::NAN]);
    }
    let op = Op::BatchNorm {
        eps: 1e-5,
        channel_axis: 1,
    };
    let xs = [
        tensor(&[5, 2], &cols),
        tensor(&[2], &[1.0, 1.0]),
        tensor(&[2], &[0.0, 0.0]),
    ];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&op, &refs).unwrap().to_vec();
    check_forward(&op, &xs, &y, &[5, 2])
        .unwrap_or_else(|e| panic!("a correct batch_norm rejected: {e}"));
}

#[test]
fn sums_of_products_that_may_overflow_in_f32_are_accepted_as_non_finite_only() {
    support::checked_cpu_default();
    // each row's exact product is 3e38 (finite); partial sums in f32 reach 6e38
    let a = [3e38f32, 3e38, -3e38, 0.0, 3e38, 3e38, -3e38, 0.0];
    let cases = [
        (
            Op::Matmul,
            vec![tensor(&[2, 4], &a), tensor(&[4, 3], &[1.0; 12])],
            vec![2usize, 3],
        ),
        (
            Op::Linear,
            vec![
                tensor(&[2, 4], &a),
                tensor(&[3, 4], &[1.0; 12]),
                tensor(&[3], &[0.0; 3]),
            ],
            vec![2, 3],
        ),
        // a 1×1 convolution over four channels: the same sums
        (
            Op::Conv2d(torchlean::graph::Conv2dGeometry::default()),
            vec![tensor(&[2, 4, 1, 1], &a), tensor(&[3, 4, 1, 1], &[1.0; 12])],
            vec![2, 3, 1, 1],
        ),
        (
            Op::SumAll,
            vec![tensor(&[4], &[3e38, 3e38, -3e38, 0.0])],
            vec![],
        ),
    ];
    for (op, xs, shape) in cases {
        let n: usize = shape.iter().product();
        for v in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            check_forward(&op, &xs, &vec![v; n], &shape).unwrap_or_else(|e| {
                panic!(
                    "{}: {v} (a correct f32 order's result) rejected: {e}",
                    op.name()
                )
            });
        }
        check_forward(&op, &xs, &vec![3e38; n], &shape)
            .unwrap_or_else(|e| panic!("{}: the exact value rejected: {e}", op.name()));
        assert!(
            check_forward(&op, &xs, &vec![1.0; n], &shape).is_err(),
            "{}: a wrong finite value accepted",
            op.name()
        );
    }
    // small terms: an infinity is still an error
    let xs = vec![tensor(&[1, 2], &[1.0, 2.0]), tensor(&[2, 1], &[3.0, 4.0])];
    assert!(check_forward(&Op::Matmul, &xs, &[f32::INFINITY], &[1, 1]).is_err());
}

#[test]
fn a_fused_chains_gradient_may_be_its_f32_steps() {
    support::checked_cpu_default();
    // x² overflows in f32 at 1e20, so sqrt's derivative 0.5 / inf = 0: every f32 evaluation
    // (the spec at f32, PyTorch) gives gradient 0 where the f64 chain gives ±1
    let op = Op::FusedUnary {
        ops: vec![Op::Pow { exponent: 2.0 }, Op::Sqrt],
    };
    let xs = [tensor(&[4], &[1e20, -1e20, 1e19, 2.0])];
    let (grads, verdict) = native_vjp_checked(&op, &xs, &[1.0; 4]);
    verdict.unwrap_or_else(|e| panic!("a correct fused chain gradient rejected: {e}"));
    assert!(same(&grads[0], &spec_vjp_f32(&op, &xs, &[1.0; 4])[0]));
}

#[test]
fn native_gradients_follow_pytorchs_order_where_intermediates_leave_f32s_range() {
    support::checked_cpu_default();
    let cases: Vec<(Op, Vec<Tensor>, Vec<f32>)> = vec![
        // (g·p) overflows at g = 3e38, underflows for a tiny g
        (
            Op::Pow { exponent: 3.0 },
            vec![tensor(&[3], &[1e-20, 1e-5, 2.0])],
            vec![3e38, 1e-40, 1.0],
        ),
        // b² overflows at 1e20 and underflows at 1e-40
        (
            Op::Div,
            vec![
                tensor(&[4], &[0.0, 1.1754944e-38, 1.0, 1.0]),
                tensor(&[4], &[1e-40, 1.1754944e-38, 1e20, 2.0]),
            ],
            vec![1.0; 4],
        ),
        // 1 / x overflows at x = 1e-40
        (Op::Log, vec![tensor(&[2], &[1e-40, 1.0])], vec![1e-3, 1.0]),
        (
            Op::Sqrt,
            vec![tensor(&[3], &[1e-44, 4.0, 2.0])],
            vec![1e-30, 1.0, 0.3],
        ),
        // g·(x − μ) overflows for rows near f32's range
        (
            Op::RmsNorm { eps: 1e-5 },
            vec![
                tensor(&[1, 5], &[3e38, 3e38, 1.0, -0.1, 0.5]),
                tensor(&[5], &[1.5, -2.0, 1.0, 0.5, 1.0]),
            ],
            vec![1.0, 2.0, -1.0, 0.5, 1.0],
        ),
        (
            Op::LayerNorm { eps: 1e-5 },
            vec![
                tensor(&[1, 4], &[3e38, -3e38, 1.0, 2.0]),
                tensor(&[4], &[1.0, 1.0, 1.0, 1.0]),
                tensor(&[4], &[0.0; 4]),
            ],
            vec![2.0, 1.0, -1.0, 0.5],
        ),
    ];
    for (op, xs, g) in cases {
        let (native, _) = native_vjp_checked(&op, &xs, &g);
        let reference = spec_vjp_f32(&op, &xs, &g);
        for (i, (n, r)) in native.iter().zip(&reference).enumerate() {
            assert!(
                same(n, r),
                "{}: gradient {i}: native {n:?}, the spec at f32 {r:?}",
                op.name()
            );
        }
    }
}
