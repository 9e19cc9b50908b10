//! The conformance harness (DESIGN §6): one table (tests/common.rs), every op × provider.
//!
//! For every row: provider forward vs the f64 spec; provider VJP vs the f64 spec VJP; and the
//! f64 spec VJP vs central finite differences of the f64 spec forward.

mod common;

mod support;
use common::{cases, draw, uncovered_kinds, Case};
use torchlean::runtime::kernel::KernelBinding;
use torchlean::spec::{self, Array};
use torchlean::{providers, OpKind, Tensor};

/// Relative error bound for f32 kernels against the f64 spec: max |a-b| / (1 + max |b|).
const F32_TOL: f64 = 2e-4;
/// Bound for the f64 spec VJP against central differences.
const FD_TOL: f64 = 1e-5;

fn max_rel_err(a: &[f64], b: &[f64]) -> f64 {
    let scale = 1.0 + b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| {
        if x.is_nan() && y.is_nan() {
            m
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

fn inputs_of(case: &Case, index: usize) -> Vec<Array<f64>> {
    case.inputs
        .iter()
        .enumerate()
        .map(|(j, (s, g))| draw(s, *g, (index * 16 + j) as u64))
        .collect()
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
fn all_ops(_: OpKind) -> bool {
    true
}

fn composed(op: OpKind) -> bool {
    providers::composition::OPS.contains(&op)
}

/// A cotangent for the output of a case.
fn cotangent(shape: &[usize], index: usize) -> Array<f64> {
    draw(shape, common::Gen::Normal, 10_000 + index as u64)
}

fn check_forward(provider: &str, binding: &KernelBinding, supports: fn(OpKind) -> bool) {
    let mut failures = vec![];
    for (i, case) in cases()
        .iter()
        .enumerate()
        .filter(|(_, c)| supports(c.op.kind()))
    {
        let xs = inputs_of(case, i);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&case.op, &refs)
            .unwrap_or_else(|e| panic!("spec rejected {}: {e}", case.name()));
        let ts: Vec<Tensor> = xs.iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        match (binding.forward)(&case.op, &tr) {
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
                    let err = max_rel_err(&to_f64(&got), &want.data);
                    let exact =
                        case.op.kind().is_random() || case.op.kind() == torchlean::OpKind::Argmax;
                    if (exact && err != 0.0) || err > F32_TOL {
                        failures.push(format!("{}: forward error {err:e}", case.name()));
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

fn check_vjp(provider: &str, binding: &KernelBinding, supports: fn(OpKind) -> bool) {
    let vjp = binding.vjp.expect("provider binds a VJP kernel");
    let mut failures = vec![];
    for (i, case) in cases()
        .iter()
        .enumerate()
        .filter(|(_, c)| supports(c.op.kind()))
    {
        if !case.op.kind().differentiable() {
            continue;
        }
        let xs = inputs_of(case, i);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let y = spec::forward(&case.op, &refs).expect("spec forward");
        let gy = cotangent(&y.shape, i);
        let want = spec::vjp(&case.op, &refs, &y, &gy).expect("spec vjp");
        let ts: Vec<Tensor> = xs.iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let out = (binding.forward)(&case.op, &tr).expect("forward");
        match vjp(&case.op, &tr, &out, &to_tensor(&gy), &vec![true; tr.len()]) {
            Err(e) => failures.push(format!("{}: {e}", case.name())),
            Ok(got) => {
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    match (g, w) {
                        (None, None) => {}
                        (Some(g), Some(w)) => {
                            let err = max_rel_err(&to_f64(g), &w.data);
                            if g.shape() != w.shape.as_slice() || err > F32_TOL {
                                failures.push(format!(
                                    "{} input {j}: vjp error {err:e} (shape {:?} vs {:?})",
                                    case.name(),
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
        .vjp
        .expect("native binds a VJP");
    for (i, case) in cases().iter().enumerate().filter(|(_, c)| {
        matches!(
            c.op.kind(),
            OpKind::Matmul | OpKind::Linear | OpKind::Conv2d | OpKind::ConvTranspose2d
        )
    }) {
        let xs: Vec<Tensor> = inputs_of(case, i).iter().map(to_tensor).collect();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let out = (providers::native_cpu::binding().forward)(&case.op, &tr).unwrap();
        let gy = to_tensor(&cotangent(out.shape(), i));
        let all = vjp(&case.op, &tr, &out, &gy, &vec![true; tr.len()]).unwrap();
        let mut needs = vec![true; tr.len()];
        needs[0] = false;
        let some = vjp(&case.op, &tr, &out, &gy, &needs).unwrap();
        for j in 1..tr.len() {
            assert_eq!(
                all[j].as_ref().map(|t| t.to_vec()),
                some[j].as_ref().map(|t| t.to_vec()),
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
    let in_place = binding.in_place.expect("native binds an in-place kernel");
    let mut checked = 0;
    for (i, case) in cases()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.op.kind().is_unary_map() || c.op.kind() == OpKind::FusedUnary)
    {
        let x = to_tensor(&inputs_of(case, i)[0]);
        let want = (binding.forward)(&case.op, &[&x]).unwrap().to_vec();
        let owned = Tensor::from_vec(x.to_vec(), x.shape()).unwrap();
        let got = in_place(&case.op, owned).unwrap();
        assert_eq!(got.to_vec(), want, "{}", case.name());
        // a shared input is not overwritten
        let shared = x.clone();
        let _ = in_place(&case.op, shared).unwrap();
        assert_eq!(
            x.to_vec(),
            to_f64(&x).iter().map(|&v| v as f32).collect::<Vec<_>>()
        );
        checked += 1;
    }
    assert!(checked > 60, "{checked}");
}

/// The native destination-passing kernels (used by the compiled executor's dense path) give
/// exactly the tensor kernels' values, on output buffers filled with garbage beforehand (so a
/// kernel that skips an element is caught), for every subset of needed cotangents.
#[test]
fn native_cpu_dense_kernels_match_the_tensor_kernels() {
    support::checked_cpu_default();
    use torchlean::runtime::kernel::Dense;
    let binding = providers::native_cpu::binding();
    let vjp = binding.vjp.expect("native binds a VJP");
    let garbage = |n: usize| vec![f32::NAN; n];
    let mut checked = 0;
    for (i, case) in cases().iter().enumerate() {
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
        let want = (binding.forward)(&case.op, &tr).unwrap();
        let mut got = garbage(want.numel());
        (dense.forward_into)(&case.op, &views, &mut got).unwrap();
        assert_eq!(got, want.to_vec(), "forward_into {}", case.name());
        if let Some(in_place) = dense.in_place_into {
            let mut buf = data[0].clone();
            in_place(&case.op, xs[0].shape(), &mut buf).unwrap();
            assert_eq!(buf, want.to_vec(), "in_place_into {}", case.name());
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
                    assert_eq!(b, &w, "vjp_into {} input {j}", case.name());
                }
            }
        }
        checked += 1;
    }
    assert!(checked > 60, "{checked}");
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
