//! Normalizations of finite rows whose statistics overflow f32. Values of magnitude ~2⁶⁵
//! (≈ 3.7·10¹⁹) square past f32's range, so the variance computed in f32 was +∞, 1/std 0, and
//! every output silently the bias β (PyTorch's kernels give NaN). The normalized values are
//! ordinary numbers: each CPU provider — the spec at f32, the native kernels, and the native
//! kernels under their replay checkers — must give the f64 spec's values and gradients
//! (which never overflow for f32 inputs) within the conformance tolerance. The CUDA kernels'
//! counterpart: `gpu_only_conformance.rs::norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec_on_the_gpu`.

mod common;
use common::{check_overflowing_norms, cpu_profiles};
use torchlean::runtime::{self, Session};
use torchlean::Tensor;

#[test]
fn norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec() {
    for (name, profile) in cpu_profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        check_overflowing_norms(|a| {
            Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).unwrap()
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}
