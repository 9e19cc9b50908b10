//! Normalizations of finite rows whose statistics overflow f32. Values of magnitude ~2⁶⁵
//! (≈ 3.7·10¹⁹) square past f32's range, so the variance computed in f32 was +∞, 1/std 0, and
//! every output silently the bias β (PyTorch's kernels give NaN). The normalized values are
//! ordinary numbers: each CPU provider — the spec at f32, the native kernels, and the native
//! kernels under their replay checkers — must give the f64 spec's values and gradients
//! (which never overflow for f32 inputs) within the conformance tolerance.

mod common;
use common::{compare, draw, Gen, F32_TOL};
use torchlean::backend::BackendProfile;
use torchlean::graph::Op;
use torchlean::runtime::{self, Session};
use torchlean::spec::{self, Array};
use torchlean::Tensor;

fn profiles() -> Vec<(&'static str, BackendProfile)> {
    let only = |p: &str| {
        BackendProfile::resolve(None, Some("cpu"), Some(p), Some("checked-runtime"))
            .expect("a CPU profile")
    };
    vec![
        ("only:reference", only("only:reference")),
        ("only:native_cpu", only("only:native_cpu")),
        (
            "strict_native_cpu",
            BackendProfile::named("strict_native_cpu").expect("named profile"),
        ),
    ]
}

/// Normal draws scaled by 2^65, plus `offset` (values stay f32-exact multiples of the scale).
fn huge(shape: &[usize], key: u64, offset: f64) -> Array<f64> {
    let mut a = draw(shape, Gen::Normal, key);
    for v in &mut a.data {
        *v = ((*v * 2f64.powi(65) + offset) as f32) as f64;
    }
    a
}

fn tensor(a: &Array<f64>) -> Tensor {
    Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).unwrap()
}

fn widen(t: &Tensor) -> Vec<f64> {
    t.to_vec().iter().map(|&v| v as f64).collect()
}

#[test]
fn norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec() {
    let cases: Vec<(Op, Vec<usize>, usize)> = vec![
        (Op::LayerNorm { eps: 1e-5 }, vec![4, 40], 3),
        (Op::RmsNorm { eps: 1e-6 }, vec![5, 33], 2),
        (
            Op::BatchNorm {
                eps: 1e-5,
                channel_axis: 1,
            },
            vec![2, 3, 4, 5],
            3,
        ),
    ];
    for (name, profile) in profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        for (op, shape, arity) in &cases {
            for offset in [0.0, 2f64.powi(66)] {
                let params = if matches!(op, Op::BatchNorm { .. }) {
                    vec![shape[1]]
                } else {
                    vec![*shape.last().unwrap()]
                };
                let mut inputs = vec![huge(shape, 1, offset)];
                for j in 1..*arity {
                    inputs.push(draw(&params, Gen::Normal, 10 + j as u64));
                }
                let refs: Vec<&Array<f64>> = inputs.iter().collect();
                let want = spec::forward(op, &refs).unwrap();
                let w = draw(shape, Gen::Normal, 99);
                let want_g = spec::vjp(op, &refs, &want, &w).unwrap();
                let ts: Vec<Tensor> = inputs.iter().map(|a| tensor(a).requires_grad()).collect();
                let tr: Vec<&Tensor> = ts.iter().collect();
                let y = match op {
                    Op::LayerNorm { eps } => tr[0].layer_norm(tr[1], tr[2], *eps),
                    Op::RmsNorm { eps } => tr[0].rms_norm(tr[1], *eps),
                    Op::BatchNorm { eps, channel_axis } => {
                        tr[0].batch_norm(tr[1], tr[2], *eps, *channel_axis)
                    }
                    _ => unreachable!(),
                }
                .unwrap_or_else(|e| panic!("{name}: {}: {e}", op.name()));
                let what = format!("{name}: {} {shape:?} offset {offset:e}", op.name());
                compare(&widen(&y), &want.data, None, F32_TOL)
                    .unwrap_or_else(|e| panic!("{what}: forward: {e}"));
                let grads = y
                    .mul(&tensor(&w))
                    .and_then(|p| p.sum_all())
                    .and_then(|l| l.backward())
                    .unwrap_or_else(|e| panic!("{what}: backward: {e}"));
                for (j, t) in ts.iter().enumerate() {
                    let want_j = want_g[j].as_ref().expect("a spec cotangent");
                    let got = grads.get(t).expect("a gradient");
                    compare(&widen(&got), &want_j.data, None, F32_TOL)
                        .unwrap_or_else(|e| panic!("{what}: gradient of input {j}: {e}"));
                }
            }
        }
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}
