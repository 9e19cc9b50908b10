//! Normalizations of finite rows whose statistics overflow f32. Values of magnitude ~2⁶⁵
//! (≈ 3.7·10¹⁹) square past f32's range, so the variance computed in f32 was +∞, 1/std 0, and
//! every output silently the bias β (PyTorch's kernels give NaN). The normalized values are
//! ordinary numbers: each CPU provider — the spec at f32, the native kernels, and the native
//! kernels under their replay checkers — must give the f64 spec's values and gradients
//! (which never overflow for f32 inputs) within the conformance tolerance. The CUDA kernels'
//! counterpart: `gpu_only_conformance.rs::norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec_on_the_gpu`.

mod common;
use common::{
    apply_norm, compare, cpu_profiles, overflowing_norm_cases, overflowing_norm_inputs, F32_TOL,
};
use torchlean::runtime::{self, Session};
use torchlean::spec::{self, Array};
use torchlean::Tensor;

fn tensor(a: &Array<f64>) -> Tensor {
    Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).unwrap()
}

fn widen(t: &Tensor) -> Vec<f64> {
    t.to_vec().iter().map(|&v| v as f64).collect()
}

#[test]
fn norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec() {
    for (name, profile) in cpu_profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        for (op, shape, arity) in overflowing_norm_cases() {
            for offset in [0.0, 2f64.powi(66)] {
                let (inputs, w) = overflowing_norm_inputs(&op, &shape, arity, offset);
                let refs: Vec<&Array<f64>> = inputs.iter().collect();
                let want = spec::forward(&op, &refs).unwrap();
                let want_g = spec::vjp(&op, &refs, &want, &w).unwrap();
                let ts: Vec<Tensor> = inputs.iter().map(|a| tensor(a).requires_grad()).collect();
                let tr: Vec<&Tensor> = ts.iter().collect();
                let what = format!("{name}: {} {shape:?} offset {offset:e}", op.name());
                let y = apply_norm(&op, &tr).unwrap_or_else(|e| panic!("{what}: {e}"));
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
                    compare(&widen(got), &want_j.data, None, F32_TOL)
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
