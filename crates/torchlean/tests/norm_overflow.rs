//! Normalizations of finite rows whose statistics overflow f32. Values of magnitude ~2⁶⁵
//! (≈ 3.7·10¹⁹) square past f32's range, so the variance computed in f32 was +∞, 1/std 0, and
//! every output silently the bias β (PyTorch's kernels give NaN). The normalized values are
//! ordinary numbers: each CPU provider — the spec at f32, the native kernels, and the native
//! kernels under their replay checkers — must give the f64 spec's values and gradients
//! (which never overflow for f32 inputs) within the conformance tolerance. The CUDA kernels'
//! counterpart: `gpu_only_conformance.rs::norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec_on_the_gpu`.

mod common;
use common::{check_constant_norm_groups, check_overflowing_norms, cpu_profiles};
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

/// Constant rows and channels normalize to exactly β (their mean is exact), and to NaN with
/// ε = 0, on every CPU provider (`common::check_constant_norm_groups`; found by the
/// forty-second session's strict-profile audit: −0.839 for a row of 10000.3, where PyTorch
/// gives 0). The CUDA kernels' counterpart:
/// `gpu_only_conformance.rs::constant_norm_groups_normalize_to_the_shift_on_the_gpu`.
#[test]
fn constant_groups_normalize_to_the_shift_on_every_cpu_provider() {
    for (name, profile) in cpu_profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        check_constant_norm_groups(|a| {
            Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).unwrap()
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}
