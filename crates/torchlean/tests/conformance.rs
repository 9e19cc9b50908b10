//! The conformance harness (DESIGN §6): one table (tests/common.rs), every op × provider.
//!
//! For every row: provider forward vs the f64 spec; provider VJP vs the f64 spec VJP; and the
//! f64 spec VJP vs central finite differences of the f64 spec forward. The special-value rows
//! (tests/common.rs) run the first two with NaN, ±inf, ±0 and subnormals in the inputs: NaN
//! must appear exactly where the spec's is, infinities exactly where the spec's are and of
//! their sign, finite values within the usual tolerance ([`compare`]).

mod common;

mod support;
use common::{cases, draw, table, uncovered_kinds, Case};
use torchlean::runtime::kernel::KernelBinding;
use torchlean::spec::{self, Array};
use torchlean::{providers, Op, OpKind, Tensor};

/// Relative error bound for f32 kernels against the f64 spec: max |a-b| / (1 + max |b|).
const F32_TOL: f64 = 2e-4;
/// Bound for the f64 spec VJP against central differences.
const FD_TOL: f64 = 1e-5;

/// The kind of a value: NaN, an infinity (of a sign) or finite.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Class {
    Nan,
    Inf(bool),
    Finite,
}

fn class(v: f64) -> Class {
    if v.is_nan() {
        Class::Nan
    } else if v.is_infinite() {
        Class::Inf(v > 0.0)
    } else {
        Class::Finite
    }
}

/// Compares a provider's values `got` with the f64 spec's `want`, rounded to f32 (the range
/// the provider computes in). Every element must be of the spec's class — NaN exactly where
/// the spec is NaN, ±inf exactly where the spec's infinity of that sign is — and finite
/// elements within `tol` of the spec relative to 1 + the largest finite |spec value| (the
/// error reported). A NaN never passes as a small error.
///
/// `alt`, when given, is the spec run at f32 (the reference kernel) on the same inputs. Where
/// it lands in another class than the f64 spec — an intermediate that overflows or
/// underflows in f32 only, such as `b * b` for a subnormal `b` — either result is accepted.
fn compare(got: &[f64], want: &[f64], alt: Option<&[f64]>, tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} values, spec {}", got.len(), want.len()));
    }
    let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| if v.abs() > m { v.abs() } else { m });
    let mut err = 0.0f64;
    let mut bad = vec![];
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let near = |w: f64| match (class(g), class(w)) {
            (Class::Finite, Class::Finite) => Some((g - w).abs() / scale),
            (a, b) if a == b => Some(0.0),
            _ => None,
        };
        let e = match (near(w), alt.map(|a| a[k])) {
            (Some(e), _) => Some(e),
            (None, Some(a)) if class(a) != class(w) => near(a),
            (None, _) => None,
        };
        match e {
            Some(e) if e <= tol => err = if e > err { e } else { err },
            Some(e) => bad.push(format!("[{k}] {g} vs spec {w} (error {e:e})")),
            None => bad.push(format!("[{k}] {g} vs spec {w}")),
        }
    }
    if bad.is_empty() {
        Ok(err)
    } else {
        let n = bad.len();
        bad.truncate(4);
        Err(format!("{n} elements differ: {}", bad.join(", ")))
    }
}

fn inputs_of(case: &Case, index: usize) -> Vec<Array<f64>> {
    (0..case.inputs.len())
        .map(|j| case.input(index, j))
        .collect()
}

/// `a` rounded to f32, as the spec's scalar.
fn to_f32(a: &Array<f64>) -> Array<f32> {
    Array {
        shape: a.shape.clone(),
        data: a.data.iter().map(|&v| v as f32).collect(),
    }
}

fn widen(a: &Array<f32>) -> Vec<f64> {
    a.data.iter().map(|&v| v as f64).collect()
}

/// Values equal bit for bit, except that any NaN equals any NaN (two kernels on one path).
fn same_values(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn to_tensor(a: &Array<f64>) -> Tensor {
    Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape)
        .expect("shape matches data")
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    t.to_vec().into_iter().map(f64::from).collect()
}

fn providers_under_test() -> Vec<(&'static str, KernelBinding)> {
    vec![
        ("reference", providers::reference::binding()),
        ("native_cpu", providers::native_cpu::binding()),
        ("torchlean", providers::composition::binding()),
    ]
}

/// Which rows a provider implements.
fn all_ops(_: &Case) -> bool {
    true
}

/// The composition provider's rows. Its attention is not checked on special values: it
/// blocks entries with a finite score of -1e30 and multiplies by the mask, so a row whose
/// allowed scores are all -inf, or a NaN in `v` beside a fully blocked row, differs from the
/// spec (known, left for the composition's owner; docs/numerics.md).
fn composed(case: &Case) -> bool {
    let kind = case.op.kind();
    providers::composition::OPS.contains(&kind)
        && !(case.special && kind == OpKind::ScaledDotProductAttention)
}

/// A cotangent for the output of a case.
fn cotangent(shape: &[usize], index: usize) -> Array<f64> {
    draw(shape, common::Gen::Normal, 10_000 + index as u64)
}

fn check_forward(provider: &str, binding: &KernelBinding, supports: fn(&Case) -> bool) {
    let mut failures = vec![];
    for (i, case) in table().iter().enumerate().filter(|(_, c)| supports(c)) {
        let xs = inputs_of(case, i);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&case.op, &refs)
            .unwrap_or_else(|e| panic!("spec rejected {}: {e}", case.name()));
        let alt = case.special.then(|| {
            let x32: Vec<Array<f32>> = xs.iter().map(to_f32).collect();
            let r32: Vec<&Array<f32>> = x32.iter().collect();
            widen(&spec::forward(&case.op, &r32).expect("spec at f32"))
        });
        let ts: Vec<Tensor> = xs.iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        match (binding.forward())(&case.op, &tr) {
            Err(e) => failures.push(format!("{}: {e}", case.name())),
            Ok(got) => {
                if got.shape() != want.shape.as_slice() {
                    failures.push(format!(
                        "{}: shape {:?} != spec {:?}",
                        case.name(),
                        got.shape(),
                        want.shape
                    ));
                } else {
                    let exact =
                        case.op.kind().is_random() || case.op.kind() == torchlean::OpKind::Argmax;
                    let tol = if exact { 0.0 } else { F32_TOL };
                    if let Err(e) = compare(&to_f64(&got), &want.data, alt.as_deref(), tol) {
                        failures.push(format!("{}: forward: {e}", case.name()));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{provider} forward mismatches:\n{}",
        failures.join("\n")
    );
}

fn check_vjp(provider: &str, binding: &KernelBinding, supports: fn(&Case) -> bool) {
    let vjp = binding.vjp().expect("provider binds a VJP kernel");
    let mut failures = vec![];
    for (i, case) in table().iter().enumerate().filter(|(_, c)| supports(c)) {
        if !case.op.kind().differentiable() {
            continue;
        }
        let xs = inputs_of(case, i);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let y = spec::forward(&case.op, &refs).expect("spec forward");
        let gy = cotangent(&y.shape, i);
        let want = spec::vjp(&case.op, &refs, &y, &gy).expect("spec vjp");
        let alt: Option<Vec<Option<Vec<f64>>>> = case.special.then(|| {
            let x32: Vec<Array<f32>> = xs.iter().map(to_f32).collect();
            let r32: Vec<&Array<f32>> = x32.iter().collect();
            let y32 = spec::forward(&case.op, &r32).expect("spec at f32");
            let g32 = spec::vjp(&case.op, &r32, &y32, &to_f32(&gy)).expect("spec vjp at f32");
            g32.iter().map(|g| g.as_ref().map(widen)).collect()
        });
        let ts: Vec<Tensor> = xs.iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let out = (binding.forward())(&case.op, &tr).expect("forward");
        match vjp(&case.op, &tr, &out, &to_tensor(&gy), &vec![true; tr.len()]) {
            Err(e) => failures.push(format!("{}: {e}", case.name())),
            Ok(got) => {
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    match (g, w) {
                        (None, None) => {}
                        (Some(g), Some(w)) => {
                            let a = alt.as_ref().and_then(|a| a[j].as_deref());
                            let res = compare(&to_f64(g), &w.data, a, F32_TOL);
                            if g.shape() != w.shape.as_slice() || res.is_err() {
                                failures.push(format!(
                                    "{} input {j}: vjp: {} (shape {:?} vs {:?})",
                                    case.name(),
                                    res.err().unwrap_or_default(),
                                    g.shape(),
                                    w.shape
                                ));
                            }
                        }
                        _ => failures.push(format!(
                            "{} input {j}: gradient presence differs from the spec",
                            case.name()
                        )),
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{provider} vjp mismatches:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_op_has_a_conformance_row() {
    support::checked_cpu_default();
    assert!(
        uncovered_kinds().is_empty(),
        "ops without a conformance row: {:?}",
        uncovered_kinds()
    );
}

#[test]
fn reference_forward_matches_spec() {
    support::checked_cpu_default();
    check_forward("reference", &providers::reference::binding(), all_ops);
}

#[test]
fn reference_vjp_matches_spec() {
    support::checked_cpu_default();
    check_vjp("reference", &providers::reference::binding(), all_ops);
}

#[test]
fn native_cpu_forward_matches_spec() {
    support::checked_cpu_default();
    check_forward("native_cpu", &providers::native_cpu::binding(), all_ops);
}

#[test]
fn native_cpu_vjp_matches_spec() {
    support::checked_cpu_default();
    check_vjp("native_cpu", &providers::native_cpu::binding(), all_ops);
}

#[test]
fn composition_forward_matches_spec() {
    support::checked_cpu_default();
    check_forward("torchlean", &providers::composition::binding(), composed);
}

#[test]
fn composition_vjp_matches_spec() {
    support::checked_cpu_default();
    check_vjp("torchlean", &providers::composition::binding(), composed);
}

#[test]
fn every_provider_under_test_is_registered() {
    support::checked_cpu_default();
    let registry = torchlean::runtime::session::standard_registry();
    for (name, _) in providers_under_test() {
        assert!(
            registry
                .entries()
                .iter()
                .any(|e| e.capsule.provider.label() == name),
            "{name} has no capsules"
        );
    }
}

#[test]
fn spec_vjp_matches_finite_differences() {
    support::checked_cpu_default();
    let mut failures = vec![];
    for (i, case) in cases().iter().enumerate() {
        if !case.op.kind().differentiable() {
            continue;
        }
        let xs = inputs_of(case, i);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let y = spec::forward(&case.op, &refs).expect("spec forward");
        let w = cotangent(&y.shape, i);
        let grads = spec::vjp(&case.op, &refs, &y, &w).expect("spec vjp");
        let loss = |inputs: &[Array<f64>]| -> f64 {
            let r: Vec<&Array<f64>> = inputs.iter().collect();
            let out = spec::forward(&case.op, &r).expect("spec forward");
            out.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
        };
        for (j, g) in grads.iter().enumerate() {
            let Some(g) = g else { continue };
            let n = xs[j].data.len();
            // all coordinates when small, else a deterministic sample of 12
            let coords: Vec<usize> = if n <= 24 {
                (0..n).collect()
            } else {
                (0..12).map(|k| (k * 7919 + i) % n).collect()
            };
            for k in coords {
                let h = 1e-6 * (1.0 + xs[j].data[k].abs());
                let mut plus = xs.clone();
                plus[j].data[k] += h;
                let mut minus = xs.clone();
                minus[j].data[k] -= h;
                let fd = (loss(&plus) - loss(&minus)) / (2.0 * h);
                let err = (fd - g.data[k]).abs() / (1.0 + g.data[k].abs());
                if err > FD_TOL {
                    failures.push(format!(
                        "{} input {j} coord {k}: vjp {} vs finite difference {fd} (err {err:e})",
                        case.name(),
                        g.data[k]
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "spec VJP disagrees with finite differences:\n{}",
        failures.join("\n")
    );
}

/// Skipping an input's cotangent (`needs[i] == false`) leaves the other cotangents unchanged.
#[test]
fn native_cpu_vjp_skipping_unneeded_inputs_keeps_the_others() {
    support::checked_cpu_default();
    let vjp = providers::native_cpu::binding()
        .vjp()
        .expect("native binds a VJP");
    for (i, case) in table().iter().enumerate().filter(|(_, c)| {
        matches!(
            c.op.kind(),
            OpKind::Matmul | OpKind::Linear | OpKind::Conv2d | OpKind::ConvTranspose2d
        )
    }) {
        let xs: Vec<Tensor> = inputs_of(case, i).iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let out = (providers::native_cpu::binding().forward())(&case.op, &tr).unwrap();
        let gy = to_tensor(&cotangent(out.shape(), i));
        let all = vjp(&case.op, &tr, &out, &gy, &vec![true; tr.len()]).unwrap();
        let mut needs = vec![true; tr.len()];
        needs[0] = false;
        let some = vjp(&case.op, &tr, &out, &gy, &needs).unwrap();
        for j in 1..tr.len() {
            let (a, b) = (
                all[j].as_ref().map(|t| t.to_vec()),
                some[j].as_ref().map(|t| t.to_vec()),
            );
            assert!(
                a.is_some() == b.is_some()
                    && same_values(&a.unwrap_or_default(), &b.unwrap_or_default()),
                "{} input {j}",
                case.name()
            );
        }
    }
}

/// The native in-place kernel gives exactly the forward kernel's values on every unary row.
#[test]
fn native_cpu_in_place_matches_forward() {
    support::checked_cpu_default();
    let binding = providers::native_cpu::binding();
    let in_place = binding.in_place().expect("native binds an in-place kernel");
    let mut checked = 0;
    for (i, case) in table()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.op.kind().is_unary_map() || c.op.kind() == OpKind::FusedUnary)
    {
        let x = to_tensor(&inputs_of(case, i)[0]);
        let want = (binding.forward())(&case.op, &[&x]).unwrap().to_vec();
        let owned = Tensor::from_vec(x.to_vec(), x.shape()).unwrap();
        let got = in_place(&case.op, owned).unwrap();
        assert!(same_values(&got.to_vec(), &want), "{}", case.name());
        // a shared input is not overwritten
        let before = x.to_vec();
        let shared = x.clone();
        let _ = in_place(&case.op, shared).unwrap();
        assert!(same_values(&x.to_vec(), &before), "{}", case.name());
        checked += 1;
    }
    assert!(checked > 120, "{checked}");
}

/// The native destination-passing kernels (used by the compiled executor's dense path) give
/// exactly the tensor kernels' values, on output buffers filled with garbage beforehand (so a
/// kernel that skips an element is caught), for every subset of needed cotangents.
#[test]
fn native_cpu_dense_kernels_match_the_tensor_kernels() {
    support::checked_cpu_default();
    use torchlean::runtime::kernel::Dense;
    let binding = providers::native_cpu::binding();
    let vjp = binding.vjp().expect("native binds a VJP");
    // finite, so a skipped element is caught even where the right value is NaN
    let garbage = |n: usize| vec![-1.234_5e33f32; n];
    let mut checked = 0;
    for (i, case) in table().iter().enumerate() {
        let Some(dense) = providers::native_cpu::dense_kernels(case.op.kind()) else {
            continue;
        };
        let xs: Vec<Tensor> = inputs_of(case, i).iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let data: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
        let views: Vec<Dense> = xs
            .iter()
            .zip(&data)
            .map(|(t, d)| Dense {
                data: d,
                shape: t.shape(),
            })
            .collect();
        let want = (binding.forward())(&case.op, &tr).unwrap();
        let mut got = garbage(want.numel());
        (dense.forward_into)(&case.op, &views, &mut got).unwrap();
        assert!(
            same_values(&got, &want.to_vec()),
            "forward_into {}",
            case.name()
        );
        if let Some(in_place) = dense.in_place_into {
            let mut buf = data[0].clone();
            in_place(&case.op, xs[0].shape(), &mut buf).unwrap();
            assert!(
                same_values(&buf, &want.to_vec()),
                "in_place_into {}",
                case.name()
            );
        }
        let Some(vjp_into) = dense.vjp_into else {
            continue;
        };
        let gy = to_tensor(&cotangent(want.shape(), i));
        let (yd, gd) = (want.to_vec(), gy.to_vec());
        let (y, g) = (
            Dense {
                data: &yd,
                shape: want.shape(),
            },
            Dense {
                data: &gd,
                shape: gy.shape(),
            },
        );
        let all = vjp(&case.op, &tr, &want, &gy, &vec![true; tr.len()]).unwrap();
        for mask in 1u32..(1 << tr.len()) {
            let mut bufs: Vec<Option<Vec<f32>>> = xs
                .iter()
                .enumerate()
                .map(|(j, t)| (mask >> j & 1 == 1).then(|| garbage(t.numel())))
                .collect();
            let mut outs: Vec<Option<&mut [f32]>> =
                bufs.iter_mut().map(|b| b.as_deref_mut()).collect();
            vjp_into(&case.op, &views, y, g, &mut outs).unwrap();
            for (j, b) in bufs.iter().enumerate() {
                if let Some(b) = b {
                    // an input the tensor VJP gives no cotangent (an index) gets zeros
                    let w = all[j]
                        .as_ref()
                        .map_or_else(|| vec![0.0; b.len()], |w| w.to_vec());
                    assert!(same_values(b, &w), "vjp_into {} input {j}", case.name());
                }
            }
        }
        checked += 1;
    }
    assert!(checked > 120, "{checked}");
}

/// Dense kernels refuse operands whose slices do not match their shapes.
#[test]
fn native_cpu_dense_kernels_check_their_buffers() {
    support::checked_cpu_default();
    use torchlean::runtime::kernel::Dense;
    let dense = providers::native_cpu::dense_kernels(OpKind::Tanh).expect("tanh has dense kernels");
    let x = [1.0f32, 2.0, 3.0];
    let op = torchlean::graph::Op::Tanh;
    let short = Dense {
        data: &x[..2],
        shape: &[3],
    };
    assert!((dense.forward_into)(&op, &[short], &mut [0.0; 3]).is_err());
    let ok = Dense {
        data: &x,
        shape: &[3],
    };
    let err = (dense.forward_into)(&op, &[ok], &mut [0.0; 2]).unwrap_err();
    assert!(
        err.to_string().contains("output buffer has 2 elements"),
        "{err}"
    );
}

/// One regression row of [`nan_is_never_dropped`]: an op, its inputs (data, shape), the
/// expected output, and optionally the expected cotangents for an all-ones output cotangent.
struct NanRow {
    op: Op,
    inputs: Vec<(Vec<f32>, Vec<usize>)>,
    want: Vec<f32>,
    grads: Option<Vec<Vec<f32>>>,
}

/// NaN where `want` is NaN and only there; other values within 1e-6 relative, and a zero of
/// the same sign as `want`'s.
fn matches_exactly(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| {
            if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if w == 0.0 {
                g.to_bits() == w.to_bits()
            } else {
                g == w || (g - w).abs() <= 1e-6 * (1.0 + w.abs())
            }
        })
}

/// Issue 13 item 2, "NaN disappears": relu(NaN) was 0, clamp(NaN) its lower bound,
/// maximum/minimum(NaN, x) = x, safe_log(NaN) = ln(eps), and max_pool2d skipped a NaN in its
/// window, on both providers (PyTorch propagates NaN in every one). Every row fails on that
/// code; each runs on reference and native_cpu (tensor kernels, and the native dense and
/// in-place kernels where the op has them).
#[test]
fn nan_is_never_dropped() {
    const N: f32 = f32::NAN;
    // 40 elements (more than one 16-lane chunk): NaN at 0, 17 and 39, -0 at 5
    let x: Vec<f32> = (0..40)
        .map(|i| match i {
            0 | 17 | 39 => N,
            5 => -0.0,
            _ => (i as f32 - 20.0) * 0.1,
        })
        .collect();
    let map = |f: &dyn Fn(f32) -> f32| {
        x.iter()
            .map(|&v| if v.is_nan() { N } else { f(v) })
            .collect::<Vec<_>>()
    };
    let relu_grad: Vec<f32> = x
        .iter()
        .map(|&v| if v <= 0.0 { 0.0 } else { 1.0 })
        .collect();
    let rows = vec![
        NanRow {
            op: Op::Relu,
            inputs: vec![(x.clone(), vec![40])],
            // relu(-0) = -0, as PyTorch eager
            want: map(&|v| if v < 0.0 { 0.0 } else { v }),
            // PyTorch masks where the output is <= 0: a NaN passes the cotangent
            grads: Some(vec![relu_grad]),
        },
        NanRow {
            op: Op::Clamp {
                min: -0.5,
                max: 0.7,
            },
            inputs: vec![(x.clone(), vec![40])],
            want: map(&|v| v.clamp(-0.5, 0.7)),
            grads: Some(vec![x
                .iter()
                .map(|&v| if (-0.5..=0.7).contains(&v) { 1.0 } else { 0.0 })
                .collect()]),
        },
        NanRow {
            op: Op::Maximum,
            inputs: vec![
                (vec![N, 1.0, N, f32::NEG_INFINITY, 2.0], vec![5]),
                (vec![1.0, N, N, N, 3.0], vec![5]),
            ],
            want: vec![N, N, N, N, 3.0],
            // with a NaN neither input strictly wins: both keep the cotangent (PyTorch)
            grads: Some(vec![vec![1.0, 1.0, 1.0, 1.0, 0.0], vec![1.0; 5]]),
        },
        NanRow {
            op: Op::Minimum,
            inputs: vec![
                (vec![N, 1.0, N, f32::INFINITY, 2.0], vec![5]),
                (vec![1.0, N, N, N, 3.0], vec![5]),
            ],
            want: vec![N, N, N, N, 2.0],
            grads: Some(vec![vec![1.0; 5], vec![1.0, 1.0, 1.0, 1.0, 0.0]]),
        },
        NanRow {
            op: Op::SafeLog { eps: 1e-3 },
            inputs: vec![(vec![N, -1.0, 1.0, 0.0], vec![4])],
            want: vec![N, 1e-3f32.ln(), 0.0, 1e-3f32.ln()],
            grads: Some(vec![vec![0.0, 0.0, 1.0, 0.0]]),
        },
        NanRow {
            op: Op::MaxPool2d(torchlean::graph::Pool2dGeometry::square(2)),
            // windows {1, NaN, 3, 4}, {5, 6, 7, 8}, {9, 1, 2, NaN}: NaN first and last
            inputs: vec![(
                vec![1.0, N, 5.0, 6.0, 9.0, 1.0, 3.0, 4.0, 7.0, 8.0, 2.0, N],
                vec![1, 1, 2, 6],
            )],
            want: vec![N, 8.0, N],
            // the gradient goes to the window's first maximum, a NaN ranking highest
            grads: Some(vec![vec![
                0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0,
            ]]),
        },
    ];
    let mut failures: Vec<String> = vec![];
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    let native = providers::native_cpu::binding();
    for (name, binding) in [
        ("reference", providers::reference::binding()),
        ("native_cpu", native),
    ] {
        for row in &rows {
            let ts: Vec<Tensor> = row
                .inputs
                .iter()
                .map(|(d, s)| Tensor::from_vec(d.clone(), s).unwrap())
                .collect();
            let tr: Vec<&Tensor> = ts.iter().collect();
            let y = (binding.forward())(&row.op, &tr).unwrap();
            check(
                matches_exactly(&y.to_vec(), &row.want),
                format!(
                    "{name} {}: {:?}, want {:?}",
                    row.op.name(),
                    y.to_vec(),
                    row.want
                ),
            );
            if let Some(grads) = &row.grads {
                let ones = Tensor::from_vec(vec![1.0; y.numel()], y.shape()).unwrap();
                let vjp = binding.vjp().expect("a VJP kernel");
                let got = vjp(&row.op, &tr, &y, &ones, &vec![true; tr.len()]).unwrap();
                for (j, want) in grads.iter().enumerate() {
                    let g = got[j].as_ref().expect("a cotangent").to_vec();
                    check(
                        matches_exactly(&g, want),
                        format!(
                            "{name} {} input {j}: cotangent {g:?}, want {want:?}",
                            row.op.name()
                        ),
                    );
                }
            }
        }
    }
    // the native destination-passing and in-place variants
    for row in &rows {
        let Some(dense) = providers::native_cpu::dense_kernels(row.op.kind()) else {
            continue;
        };
        let views: Vec<torchlean::runtime::kernel::Dense> = row
            .inputs
            .iter()
            .map(|(d, s)| torchlean::runtime::kernel::Dense { data: d, shape: s })
            .collect();
        let mut out = vec![0.0; row.want.len()];
        (dense.forward_into)(&row.op, &views, &mut out).unwrap();
        check(
            matches_exactly(&out, &row.want),
            format!("forward_into {}", row.op.name()),
        );
        if let Some(in_place) = dense.in_place_into {
            let mut buf = row.inputs[0].0.clone();
            in_place(&row.op, &row.inputs[0].1, &mut buf).unwrap();
            check(
                matches_exactly(&buf, &row.want),
                format!("in_place_into {}", row.op.name()),
            );
            let t = Tensor::from_vec(row.inputs[0].0.clone(), &row.inputs[0].1).unwrap();
            let got = (native.in_place().expect("in-place kernel"))(&row.op, t).unwrap();
            check(
                matches_exactly(&got.to_vec(), &row.want),
                format!("in_place {}", row.op.name()),
            );
        }
    }
    assert!(failures.is_empty(), "NaN dropped:\n{}", failures.join("\n"));
}
