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

/// The tensors `xs` as dense operands over their values `vals`.
fn operands<'a>(xs: &'a [Tensor], vals: &'a [Vec<f32>]) -> Vec<Operand<'a>> {
    xs.iter()
        .zip(vals)
        .map(|(t, v)| dense(v, t.shape()))
        .collect()
}

/// The forward checker's verdict on `y` as the result of `op` on `xs`.
fn check_forward(op: &Op, xs: &[Tensor], y: &[f32], shape: &[usize]) -> Result<(), String> {
    let vals: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
    let ins = operands(xs, &vals);
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
    let ins = operands(xs, &vals);
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

/// The tensors as the spec's f32 arrays.
fn arrays(xs: &[Tensor]) -> Vec<Array<f32>> {
    xs.iter()
        .map(|t| Array {
            shape: t.shape().to_vec(),
            data: t.to_vec(),
        })
        .collect()
}

/// The spec's gradients at f32 (what `strict_cpu` computes).
fn spec_vjp_f32(op: &Op, xs: &[Tensor], g: &[f32]) -> Vec<Vec<f32>> {
    let arrays = arrays(xs);
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

/// Average pooling over non-overlapping windows of `kernel`, no padding.
fn avg_pool(kernel: [usize; 2]) -> Op {
    Op::AvgPool2d {
        geometry: torchlean::graph::Pool2dGeometry {
            kernel,
            stride: kernel,
            padding: [0, 0],
        },
        count_include_pad: false,
    }
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
fn sums_of_products_may_be_the_infinities_some_f32_order_reaches_and_nothing_else() {
    support::checked_cpu_default();
    // row 0: [3e38, 3e38, −3e38, 0] is exactly 3e38; +inf left to right, never −inf or NaN
    let a = [3e38f32, 3e38, -3e38, 0.0];
    // row 1: [3e38, 3e38, −3e38, −3e38] is exactly 0; +inf, −inf or NaN by the order
    let b = [3e38f32, 3e38, -3e38, -3e38];
    // row 2: [1e38, 1e38, 0, 0] is 2e38 in every order: nothing non-finite
    let c = [1e38f32, 1e38, 0.0, 0.0];
    let rows: Vec<f32> = [a, b, c].concat();
    let cases = [
        (
            Op::Matmul,
            vec![tensor(&[3, 4], &rows), tensor(&[4, 1], &[1.0; 4])],
            vec![3usize, 1],
        ),
        (
            Op::Linear,
            vec![
                tensor(&[3, 4], &rows),
                tensor(&[1, 4], &[1.0; 4]),
                tensor(&[1], &[0.0]),
            ],
            vec![3, 1],
        ),
        // a 1×1 convolution over four channels: the same sums
        (
            Op::Conv2d(torchlean::graph::Conv2dGeometry::default()),
            vec![
                tensor(&[3, 4, 1, 1], &rows),
                tensor(&[1, 4, 1, 1], &[1.0; 4]),
            ],
            vec![3, 1, 1, 1],
        ),
        (
            Op::ReduceSum {
                axes: vec![1],
                keepdim: false,
            },
            vec![tensor(&[3, 4], &rows)],
            vec![3],
        ),
    ];
    let (inf, ninf, nan) = (f32::INFINITY, f32::NEG_INFINITY, f32::NAN);
    for (op, xs, shape) in cases {
        let check = |y: [f32; 3]| check_forward(&op, &xs, &y, &shape);
        let name = op.name();
        check([3e38, 0.0, 2e38]).unwrap_or_else(|e| panic!("{name}: exact values rejected: {e}"));
        for y in [
            [inf, 0.0, 2e38],
            [3e38, inf, 2e38],
            [3e38, ninf, 2e38],
            [3e38, nan, 2e38],
        ] {
            check(y).unwrap_or_else(|e| panic!("{name}: {y:?} (reachable in f32) rejected: {e}"));
        }
        for y in [
            [ninf, 0.0, 2e38],
            [nan, 0.0, 2e38],
            [3e38, 0.0, inf],
            [3e38, 0.0, nan],
            [1.0, 0.0, 2e38],
        ] {
            assert!(
                check(y).is_err(),
                "{name}: {y:?} (no f32 order gives it) accepted"
            );
        }
    }
    // the same rule for a gradient: matmul's dA = g·Bᵀ sums the cotangent's row
    let xs = [tensor(&[1, 2], &[1.0, 1.0]), tensor(&[2, 4], &[1.0; 8])];
    let g = [3e38f32, 3e38, -3e38, 0.0];
    let gb: Vec<f32> = [g, g].concat();
    let verdict = |ga: [f32; 2]| {
        let (ins, y, cot) = (
            [xs[0].to_vec(), xs[1].to_vec()],
            vec![3e38f32, 3e38, -3e38, 0.0],
            g.to_vec(),
        );
        let operands = [dense(&ins[0], &[1, 2]), dense(&ins[1], &[2, 4])];
        let grads = [Some(dense(&ga, &[1, 2])), Some(dense(&gb, &[2, 4]))];
        replay_vjp(
            &Op::Matmul,
            &Call {
                inputs: &operands,
                output: dense(&y, &[1, 4]),
                cotangent: Some(dense(&cot, &[1, 4])),
                needs: &[true, true],
                grads: &grads,
                seed: 5,
            },
        )
    };
    verdict([3e38, 3e38]).unwrap_or_else(|e| panic!("the exact gradient rejected: {e}"));
    verdict([inf, inf]).unwrap_or_else(|e| panic!("a reachable +inf gradient rejected: {e}"));
    assert!(
        verdict([ninf, inf]).is_err(),
        "an unreachable −inf gradient accepted"
    );
    assert!(
        verdict([nan, inf]).is_err(),
        "an unreachable NaN gradient accepted"
    );
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
        let (native, verdict) = native_vjp_checked(&op, &xs, &g);
        // pow's g = 3e38 overflows its exact gradient too: the kernel and the checker agree
        // on the class; every other case is finite in f32 and f64 alike
        verdict.unwrap_or_else(|e| panic!("{}: correct gradients rejected: {e}", op.name()));
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

#[test]
fn signed_zeros_follow_pytorch_where_no_shift_is_added_and_in_mses_target_gradient() {
    support::checked_cpu_default();
    // rms_norm of a −0 element: −0 · rstd · γ, no shift added (adding +0 made it +0)
    let op = Op::RmsNorm { eps: 1e-5 };
    let xs = [
        tensor(&[1, 3], &[-0.0, 1.0, 2.0]),
        tensor(&[3], &[1.0, 1.0, 1.0]),
    ];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let native = native_cpu::forward(&op, &refs).unwrap().to_vec();
    let arrays = arrays(&xs);
    let spec_y = spec::forward(&op, &arrays.iter().collect::<Vec<_>>())
        .unwrap()
        .data;
    assert!(
        native[0] == 0.0 && native[0].is_sign_negative(),
        "native {native:?}"
    );
    assert!(
        spec_y[0] == 0.0 && spec_y[0].is_sign_negative(),
        "spec {spec_y:?}"
    );
    // mse_loss at equal inputs: PyTorch's target gradient 2g(b − a)/n is +0, the input's +0
    let op = Op::MseLoss;
    let xs = [tensor(&[2], &[1.5, -2.0]), tensor(&[2], &[1.5, -2.0])];
    for grads in [
        native_vjp_checked(&op, &xs, &[1.0]).0,
        spec_vjp_f32(&op, &xs, &[1.0]),
    ] {
        for g in &grads {
            assert!(
                g.iter().all(|v| v.to_bits() == 0),
                "gradients {grads:?}: not +0"
            );
        }
    }
}

#[test]
fn cancelling_sums_in_pools_scatters_and_gathers_are_held_to_their_rounding_not_rejected() {
    support::checked_cpu_default();
    // [1e8, 1, −1e8] is 0 in f32 in any order (1 is lost against 1e8), exactly 1: a correct
    // kernel errs by γ_n·Σ|term|, which the checkers now allow per element (an audit of the
    // thirty-ninth session found these rejected under strict_native_cpu)
    let pool = avg_pool([1, 3]);
    let xs = [tensor(&[1, 1, 1, 6], &[1e8, 1.0, -1e8, 1.0, 2.0, 3.0])];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&pool, &refs).unwrap().to_vec();
    check_forward(&pool, &xs, &y, &[1, 1, 1, 2])
        .unwrap_or_else(|e| panic!("a correct avg_pool2d rejected: {e}"));
    // beyond the rounding: still caught
    assert!(check_forward(&pool, &xs, &[y[0] + 50.0, y[1]], &[1, 1, 1, 2]).is_err());
    assert!(check_forward(&pool, &xs, &[y[0], y[1] + 0.01], &[1, 1, 1, 2]).is_err());

    let scatter = Op::ScatterAdd { axis: 0 };
    let xs = [
        tensor(&[2], &[0.0, 0.0]),
        tensor(&[4], &[0.0, 0.0, 0.0, 1.0]),
        tensor(&[4], &[1e8, 1.0, -1e8, 2.0]),
    ];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&scatter, &refs).unwrap().to_vec();
    check_forward(&scatter, &xs, &y, &[2])
        .unwrap_or_else(|e| panic!("a correct scatter_add rejected: {e}"));
    assert!(check_forward(&scatter, &xs, &[y[0] + 200.0, y[1]], &[2]).is_err());
    assert!(check_forward(&scatter, &xs, &[y[0], y[1] + 0.01], &[2]).is_err());

    // an embedding-like gradient: the cotangents of a repeated index add up
    let gather = Op::Gather { axis: 0 };
    let xs = [
        tensor(&[2], &[5.0, 6.0]),
        tensor(&[4], &[0.0, 0.0, 0.0, 1.0]),
    ];
    let (grads, verdict) = native_vjp_checked(&gather, &xs, &[1e8, 1.0, -1e8, 2.0]);
    verdict.unwrap_or_else(|e| panic!("a correct gather gradient rejected: {e}"));
    assert_eq!(grads[0], vec![0.0, 2.0]);

    // a convolution with an infinity elsewhere in the call (the whole-call recomputation)
    let conv = Op::Conv2d(torchlean::graph::Conv2dGeometry::default());
    let xs = [
        tensor(&[1, 3, 1, 2], &[1e8, f32::INFINITY, 1.0, 2.0, -1e8, 3.0]),
        tensor(&[1, 3, 1, 1], &[1.0, 1.0, 1.0]),
    ];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&conv, &refs).unwrap().to_vec();
    check_forward(&conv, &xs, &y, &[1, 1, 1, 2])
        .unwrap_or_else(|e| panic!("a correct conv2d rejected: {e}"));
    assert!(check_forward(&conv, &xs, &[y[0] + 200.0, y[1]], &[1, 1, 1, 2]).is_err());

    // a window whose partial sums overflow: the kernel's NaN ([3e38, 3e38] + [−3e38, −3e38]
    // by rows) and the spec's +inf (left to right) are both reachable, −inf too, and finite
    // values within γ_n·Σ|x|/4 (≈ 1e32) of the exact 0; 1e33 is not
    let pool = avg_pool([2, 2]);
    let xs = [tensor(&[1, 1, 2, 2], &[3e38, 3e38, -3e38, -3e38])];
    for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0] {
        check_forward(&pool, &xs, &[v], &[1, 1, 1, 1])
            .unwrap_or_else(|e| panic!("avg_pool2d's {v} rejected: {e}"));
    }
    assert!(check_forward(&pool, &xs, &[1e33], &[1, 1, 1, 1]).is_err());
}

#[test]
fn batch_norms_gradient_applies_gamma_last_and_a_windows_negative_zeros_average_to_plus_zero() {
    support::checked_cpu_default();
    // a cotangent of 3e38 and γ = 1.45: g·γ overflows; PyTorch's ((g − mean g − x̂·mean(g·x̂))
    // ·rstd)·γ does not at every element — native and the spec at f32 agree, bit for bit
    let op = Op::BatchNorm {
        eps: 1e-5,
        channel_axis: 1,
    };
    let xs = [
        tensor(
            &[4, 1, 2],
            &[-1.36, -0.23, 0.78, -1.34, -0.67, 0.0, 1e-40, 1.81],
        ),
        tensor(&[1], &[1.45]),
        tensor(&[1], &[0.0]),
    ];
    let g = [-0.75, 1.12, -0.15, 0.14, 0.29, 3e38, 1.30, 0.15];
    let (native, verdict) = native_vjp_checked(&op, &xs, &g);
    let reference = spec_vjp_f32(&op, &xs, &g);
    assert!(
        same(&native[0], &reference[0]),
        "native {:?}, spec {:?}",
        native[0],
        reference[0]
    );
    assert!(
        native[0].iter().filter(|v| v.is_finite()).count() > 4,
        "the gradient overflowed: {:?}",
        native[0]
    );
    verdict.unwrap_or_else(|e| panic!("a correct batch_norm gradient rejected: {e}"));
    // avg_pool2d of −0s: +0 in the spec as in the kernel and PyTorch
    let pool = avg_pool([1, 2]);
    let xs = [tensor(&[1, 1, 1, 2], &[-0.0, -0.0])];
    let y = spec::forward(&pool, &arrays(&xs).iter().collect::<Vec<_>>())
        .unwrap()
        .data;
    assert_eq!(y[0].to_bits(), 0, "{y:?}");
}

#[test]
fn the_sums_allowance_counts_each_elements_own_terms_so_large_calls_still_catch_errors() {
    support::checked_cpu_default();
    // a gather over 100,000 indices, each data element read a few times: its gradient
    // elements sum a few cotangents each, so a 10% error in one must be caught (a bound
    // from the call's size, γ_100001 ≈ 0.006 of every cotangent, let it through)
    let (d, t) = (1000usize, 100_000usize);
    let idx: Vec<f32> = (0..t).map(|i| (i * 7 % d) as f32).collect();
    let data: Vec<f32> = (0..d).map(|i| i as f32).collect();
    let op = Op::Gather { axis: 0 };
    let xs = [tensor(&[d], &data), tensor(&[t], &idx)];
    let g: Vec<f32> = (0..t).map(|i| 1.0 + (i % 13) as f32).collect();
    let (grads, verdict) = native_vjp_checked(&op, &xs, &g);
    verdict.unwrap_or_else(|e| panic!("a correct gather gradient rejected: {e}"));
    let mut bad = grads[0].clone();
    bad[3] *= 1.1;
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&op, &refs).unwrap();
    let (d0, d1, yv) = (xs[0].to_vec(), xs[1].to_vec(), y.to_vec());
    let (sd, st) = ([d], [t]);
    let ins = [dense(&d0, &sd), dense(&d1, &st)];
    let gs = [Some(dense(&bad, &sd)), None];
    let verdict = replay_vjp(
        &op,
        &Call {
            inputs: &ins,
            output: dense(&yv, &st),
            cotangent: Some(dense(&g, &st)),
            needs: &[true, false],
            grads: &gs,
            seed: 3,
        },
    );
    assert!(
        verdict.is_err(),
        "a 10% error in one gradient element accepted"
    );

    // scatter_add of 100,000 sources over 1000 slots: dropping one slot's additions is caught
    let op = Op::ScatterAdd { axis: 0 };
    let xs = [
        tensor(&[d], &vec![0.5; d]),
        tensor(&[t], &idx),
        tensor(&[t], &g),
    ];
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = native_cpu::forward(&op, &refs).unwrap().to_vec();
    check_forward(&op, &xs, &y, &[d]).unwrap_or_else(|e| panic!("correct scatter_add: {e}"));
    let mut bad = y.clone();
    bad[3] = 0.5;
    assert!(
        check_forward(&op, &xs, &bad, &[d]).is_err(),
        "a dropped slot accepted"
    );
}

/// A convolution stride of 2^63 or more is a valid geometry (one output position along that
/// axis), but the native kernel's tap ranges took it as a negative `isize`: wrong outputs and
/// zero gradients under `checked_cpu` (the forty-third session's oracle sweep). The native
/// kernel's forward and gradients now equal the spec's at f32 within rounding.
#[test]
fn a_huge_convolution_stride_gives_the_specs_values() {
    use torchlean::graph::Conv2dGeometry;
    support::checked_cpu_default();
    for s in [1usize << 62, 1 << 63, usize::MAX - 1, usize::MAX] {
        let op = Op::Conv2d(Conv2dGeometry {
            stride: [s, 1],
            padding: [1, 0],
            dilation: [1, 1],
            groups: 1,
        });
        let draw = |n: usize, k: u64| -> Vec<f32> {
            (0..n)
                .map(|i| ((torchlean::spec::splitmix64(k + i as u64) >> 40) as f32 / 2e7) - 0.4)
                .collect()
        };
        let xs = [
            tensor(&[1, 2, 5, 4], &draw(40, 1)),
            tensor(&[3, 2, 3, 2], &draw(36, 2)),
            tensor(&[3], &draw(3, 3)),
        ];
        let refs: Vec<&Tensor> = xs.iter().collect();
        let arrays: Vec<Array<f64>> = xs
            .iter()
            .map(|t| {
                Array::from_vec(
                    t.shape().to_vec(),
                    t.to_vec().iter().map(|&v| v as f64).collect(),
                )
                .unwrap()
            })
            .collect();
        let arefs: Vec<&Array<f64>> = arrays.iter().collect();
        let want = spec::forward(&op, &arefs).unwrap();
        let y = native_cpu::forward(&op, &refs).unwrap();
        assert_eq!(y.shape(), &want.shape[..], "stride {s}");
        let close = |got: &[f32], want: &[f64], what: &str| {
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "stride {s}: {what} {i}: {g} against {w}"
                );
            }
        };
        close(&y.to_vec(), &want.data, "output");
        let gy_data = draw(y.numel(), 4);
        let gy = tensor(y.shape(), &gy_data);
        let gy64 = Array::from_vec(
            y.shape().to_vec(),
            gy_data.iter().map(|&v| v as f64).collect(),
        )
        .unwrap();
        let want_grads = spec::vjp(&op, &arefs, &want, &gy64).unwrap();
        let grads = native_cpu::vjp(&op, &refs, &y, &gy, &[true, true, true]).unwrap();
        for (j, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            let (g, w) = (g.as_ref().unwrap(), w.as_ref().unwrap());
            close(&g.to_vec(), &w.data, &format!("gradient {j}"));
        }
    }
}

/// A sum holding +inf beside finite negative terms that overflow together (`[inf, −3e38,
/// −3e38, −3e38]`) is NaN when a correct f32 kernel adds the negative terms first (the
/// native sums do, in lanes): `strict_native_cpu` rejected that NaN against the spec's +inf
/// (the oracle sweep of the forty-third session). The checkers accept it — for sums, means
/// and products — and still reject a NaN where the other sign's terms cannot overflow, and the
/// opposite infinity.
#[test]
fn an_infinite_term_beside_overflowing_terms_of_the_other_sign_may_give_nan() {
    support::checked_cpu_default();
    let big = [f32::INFINITY, -3e38, -3e38, -3e38];
    let small = [f32::INFINITY, -1e38, 5.0, -2.0];
    for op in [
        Op::SumAll,
        Op::ReduceSum {
            axes: vec![0],
            keepdim: false,
        },
        Op::ReduceMean {
            axes: vec![0],
            keepdim: false,
        },
    ] {
        let check = |xs: &[f32], y: f32| check_forward(&op, &[tensor(&[4], xs)], &[y], &[]);
        check(&big, f32::NAN).unwrap_or_else(|e| panic!("{op:?}: NaN rejected: {e}"));
        check(&big, f32::INFINITY).unwrap_or_else(|e| panic!("{op:?}: inf rejected: {e}"));
        assert!(
            check(&small, f32::NAN).is_err(),
            "{op:?}: a NaN no order gives"
        );
        assert!(
            check(&big, f32::NEG_INFINITY).is_err(),
            "{op:?}: the opposite infinity"
        );
    }
    // a product: [1, 1, 1, 1] · big
    let op = Op::Matmul;
    let xs = [tensor(&[1, 4], &[1.0; 4]), tensor(&[4, 1], &big)];
    check_forward(&op, &xs, &[f32::NAN], &[1, 1]).expect("the product's NaN");
    let xs = [tensor(&[1, 4], &[1.0; 4]), tensor(&[4, 1], &small)];
    assert!(check_forward(&op, &xs, &[f32::NAN], &[1, 1]).is_err());
}
