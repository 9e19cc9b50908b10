//! Where an op's VJP *selects* zero (relu below 0, clamp outside its range, maximum's and
//! minimum's losing operand, safe_log below eps, pow with exponent 0), the input's cotangent
//! is exactly 0 even when the cotangent arriving from later ops is infinite or NaN — PyTorch's
//! `where` / `masked_fill` rules; where the VJP *multiplies* by a zero derivative (abs at 0:
//! `g · sgn(x)`), an infinite cotangent gives NaN, as in PyTorch. An audit of the thirty-seventh
//! session found `Σ sqrt(maximum(x, 0))` giving NaN gradients on every profile and
//! `Σ sqrt(relu(x))` NaN under `strict_cpu` (the f64 spec multiplied), while
//! `strict_native_cpu`'s checker refused the native kernel's correct 0.
//!
//! The expected values are PyTorch 2.x's (`torch.autograd` on the same expressions, float32),
//! for the reference provider (`strict_cpu`), the native kernels (`checked_cpu`) and the
//! native kernels behind replay checkers (`strict_native_cpu`); the fused chain is checked
//! against the same values.

use torchlean::backend::BackendProfile;
use torchlean::graph::Op;
use torchlean::runtime::{self, Session};
use torchlean::Tensor;

const X: [f32; 5] = [-2.0, -0.5, 0.0, 0.25, 4.0];
const PROFILES: [&str; 3] = ["strict_cpu", "checked_cpu", "strict_native_cpu"];

fn under<R>(profile: &str, f: impl FnOnce() -> R) -> R {
    let before = runtime::install(Session::new(BackendProfile::named(profile).unwrap())).unwrap();
    let r = f();
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    r
}

/// The gradient of Σ f(x) at [`X`].
fn grad_of(profile: &str, f: impl Fn(&Tensor) -> Tensor) -> Vec<f32> {
    under(profile, || {
        let x = Tensor::from_vec(X.to_vec(), &[5]).unwrap().requires_grad();
        let loss = f(&x).apply(Op::SumAll, &[]).unwrap();
        loss.backward().unwrap().get(&x).unwrap().to_vec()
    })
}

fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(g, w)| {
            (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs().max(1.0) || g == w
        })
}

fn un(x: &Tensor, op: Op) -> Tensor {
    x.apply(op, &[]).unwrap()
}

#[test]
fn selected_zeros_stay_zero_under_infinite_cotangents_on_every_cpu_profile() {
    let inf = f32::INFINITY;
    let zero = |x: &Tensor| Tensor::from_vec(vec![0.0; 5], x.shape()).unwrap();
    type Case = (&'static str, Box<dyn Fn(&Tensor) -> Tensor>, Vec<f32>);
    let cases: Vec<Case> = vec![
        (
            "sqrt(relu(x))",
            Box::new(|x| un(&un(x, Op::Relu), Op::Sqrt)),
            vec![0.0, 0.0, 0.0, 1.0, 0.25],
        ),
        (
            "sqrt(maximum(x, 0))",
            Box::new(move |x| un(&x.apply(Op::Maximum, &[&zero(x)]).unwrap(), Op::Sqrt)),
            vec![0.0, 0.0, inf, 1.0, 0.25],
        ),
        (
            "minimum(x, 1) · inf: the loser (x = 4) is exactly 0",
            Box::new(move |x| {
                let one = Tensor::from_vec(vec![1.0; 5], x.shape()).unwrap();
                un(
                    &x.apply(Op::Minimum, &[&one]).unwrap(),
                    Op::Scale { factor: inf },
                )
            }),
            vec![inf, inf, inf, inf, 0.0],
        ),
        (
            "sqrt(clamp(x, 0, 3))",
            Box::new(|x| un(&un(x, Op::Clamp { min: 0.0, max: 3.0 }), Op::Sqrt)),
            vec![0.0, 0.0, inf, 1.0, 0.0],
        ),
        (
            "sqrt(abs(x)): abs multiplies (NaN at 0)",
            Box::new(|x| un(&un(x, Op::Abs), Op::Sqrt)),
            vec![-0.353_553_38, -0.707_106_77, f32::NAN, 1.0, 0.25],
        ),
        (
            "pow(x, 0) · inf",
            Box::new(move |x| un(&un(x, Op::Pow { exponent: 0.0 }), Op::Scale { factor: inf })),
            vec![0.0; 5],
        ),
        (
            "safe_log(x, 0.1) · inf (0 below eps; not a PyTorch op: the same rule)",
            Box::new(move |x| un(&un(x, Op::SafeLog { eps: 0.1 }), Op::Scale { factor: inf })),
            vec![0.0, 0.0, 0.0, inf, inf],
        ),
        (
            "fused_unary [relu, sqrt]",
            Box::new(|x| {
                un(
                    x,
                    Op::FusedUnary {
                        ops: vec![Op::Relu, Op::Sqrt],
                    },
                )
            }),
            vec![0.0, 0.0, 0.0, 1.0, 0.25],
        ),
        (
            "fused_unary [sqrt, relu]: 0 · sqrt'(0) = NaN, as unfused",
            Box::new(|x| {
                un(
                    &un(x, Op::Abs),
                    Op::FusedUnary {
                        ops: vec![Op::Sqrt, Op::Relu],
                    },
                )
            }),
            vec![-0.353_553_38, -0.707_106_77, f32::NAN, 1.0, 0.25],
        ),
    ];
    for profile in PROFILES {
        for (what, f, want) in &cases {
            let got = grad_of(profile, f);
            assert!(
                same(&got, want),
                "{profile}: d/dx Σ {what}: {got:?}, PyTorch {want:?}"
            );
        }
    }
}
