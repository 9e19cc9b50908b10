//! Special values where IEEE-754 and PyTorch part ways, with PyTorch's own results as the
//! reference (PyTorch 2.11 and 2.15 agree on every value here; they were printed by
//! `torch.pow` and its autograd, not by this code), on every CPU provider: the spec at f32
//! (`only:reference`), the native kernels, and the native kernels under their replay
//! checkers (`strict_native_cpu`, whose f64 spec must agree too or it would refuse them).

mod common;
use common::{check_empty_head_attention, cpu_profiles as profiles};
use torchlean::runtime::{self, Session};
use torchlean::Tensor;

/// Bit-level equality, a NaN matching any NaN.
fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// `pow(x, p)` and its gradient against PyTorch's (`torch.pow`, whose kernels take the square
/// root for p = ½ and its reciprocal for p = −½: `pow(−0, ½) = −0`, `pow(−∞, ½) = NaN`,
/// `pow(−0, −½) = −∞`), at −∞, −0, +0, 4, +∞, −4.
#[test]
fn pow_at_special_values_follows_pytorch() {
    let inf = f32::INFINITY;
    let x = [-inf, -0.0, 0.0, 4.0, inf, -4.0];
    let nan = f32::NAN;
    // (exponent, PyTorch's values, PyTorch's gradients for a cotangent of ones)
    let cases: [(f32, [f32; 6], [f32; 6]); 3] = [
        (
            0.5,
            [nan, -0.0, 0.0, 2.0, inf, nan],
            [nan, -inf, inf, 0.25, 0.0, nan],
        ),
        (
            -0.5,
            [nan, -inf, inf, 0.5, 0.0, nan],
            [-0.0, -inf, -inf, -0.0625, -0.0, nan],
        ),
        (
            1.5,
            [inf, 0.0, 0.0, 8.0, inf, nan],
            [nan, -0.0, 0.0, 3.0, inf, nan],
        ),
    ];
    for (name, profile) in profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        for (p, want_y, want_g) in cases {
            let t = Tensor::from_vec(x.to_vec(), &[6]).unwrap().requires_grad();
            let y = t.pow(p).unwrap();
            let got_y = y.to_vec();
            let grads = y.sum_all().unwrap().backward().unwrap();
            let got_g = grads.get(&t).unwrap().to_vec();
            for k in 0..6 {
                assert!(
                    same(got_y[k], want_y[k]),
                    "{name}: pow({}, {p}) = {} (PyTorch {})",
                    x[k],
                    got_y[k],
                    want_y[k]
                );
                assert!(
                    same(got_g[k], want_g[k]),
                    "{name}: d/dx pow(x, {p}) at {} = {} (PyTorch {})",
                    x[k],
                    got_g[k],
                    want_g[k]
                );
            }
        }
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}

/// Attention with head dimension 0: every score is the empty dot product, 0, so the weights
/// are uniform and each output row the mean of the value rows (PyTorch's
/// `scaled_dot_product_attention` gives exactly that). The default scale 1/√0 = ∞ times that
/// 0 made every output NaN. Gradients: q and k are empty; v's is 1/S per query for a
/// cotangent of ones.
#[test]
fn attention_with_an_empty_head_dimension_averages_the_values() {
    let (l, s, dv) = (3usize, 4usize, 5usize);
    let v: Vec<f32> = (0..2 * s * dv).map(|i| (i as f32 * 0.37).sin()).collect();
    for (name, profile) in profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        let q = Tensor::from_vec(vec![], &[1, 2, l, 0])
            .unwrap()
            .requires_grad();
        let k = Tensor::from_vec(vec![], &[1, 2, s, 0])
            .unwrap()
            .requires_grad();
        let vt = Tensor::from_vec(v.clone(), &[1, 2, s, dv])
            .unwrap()
            .requires_grad();
        for causal in [false, true] {
            let y = q
                .scaled_dot_product_attention(&k, &vt, None, causal, None)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let grads = y.sum_all().unwrap().backward().unwrap();
            let gv = grads.get(&vt).unwrap().to_vec();
            check_empty_head_attention((l, s, dv), &v, causal, &y.to_vec(), &gv)
                .unwrap_or_else(|e| panic!("{name} causal {causal}: {e}"));
            assert_eq!(grads.get(&q).unwrap().numel(), 0);
        }
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}

/// The gradient of `a - b` for a broadcast `b` sums the negated cotangents, as PyTorch does
/// (each term −g, summed from +0), on every CPU provider: with no terms (a is empty) or only
/// zero ones it is +0, where negating the sum gave −0 on the native kernels. PyTorch 2.15
/// prints +0 in all three cases below.
#[test]
fn a_broadcast_subtrahends_gradient_sums_negated_terms() {
    // (a's shape, the cotangent's per-row factor: a multiplier of a - b before the sum)
    let cases: [(&[usize], Option<[f32; 2]>); 3] = [
        (&[0, 3], None),
        (&[2, 3], Some([0.0, 0.0])),
        (&[2, 3], Some([0.0, -0.0])),
    ];
    for (name, profile) in profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        for (a_shape, factor) in cases {
            let n: usize = a_shape.iter().product();
            let a = Tensor::from_vec(vec![1.0; n], a_shape)
                .unwrap()
                .requires_grad();
            let b = Tensor::from_vec(vec![1.0; 3], &[1, 3])
                .unwrap()
                .requires_grad();
            let mut y = a.sub(&b).unwrap();
            if let Some(f) = factor {
                y = y
                    .mul(&Tensor::from_vec(f.to_vec(), &[2, 1]).unwrap())
                    .unwrap();
            }
            let grads = y.sum_all().unwrap().backward().unwrap();
            let gb = grads.get(&b).unwrap().to_vec();
            for v in gb {
                assert!(
                    same(v, 0.0),
                    "{name}: a {a_shape:?}, factor {factor:?}: d/db = {v:?} (PyTorch +0)"
                );
            }
        }
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}
