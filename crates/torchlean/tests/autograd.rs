//! Eager tape autograd: composite gradients against finite differences and against another
//! provider, accumulation, no_grad, detach, determinism.

mod support;
use torchlean::backend::BackendProfile;
use torchlean::nn::tasks::SyntheticRegression;
use torchlean::nn::train::train_regression;
use torchlean::nn::{Activation, Adam, Mlp, Module};
use torchlean::runtime::{self, Session};
use torchlean::{no_grad, Gradients, Tensor};

fn with_profile<R>(provider: &str, f: impl FnOnce() -> R) -> R {
    let profile =
        BackendProfile::resolve(None, Some("cpu"), Some(provider), Some("checked-runtime"))
            .unwrap();
    let before = runtime::install(Session::new(profile)).unwrap();
    let r = f();
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    r
}

/// f(w) = mean(softmax(tanh(x @ w) * c, axis 1) ⊙ t): a composite of several ops.
fn composite(x: &Tensor, w: &Tensor, c: &Tensor, t: &Tensor) -> Tensor {
    x.matmul(w)
        .unwrap()
        .tanh()
        .unwrap()
        .mul(c)
        .unwrap()
        .softmax(1)
        .unwrap()
        .mul(t)
        .unwrap()
        .mean_all()
        .unwrap()
}

#[test]
fn composite_gradient_matches_finite_differences_on_both_providers() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[4, 3], 1).unwrap();
    let c = Tensor::randn(&[5], 2).unwrap();
    let t = Tensor::randn(&[4, 5], 3).unwrap();
    let w0 = Tensor::randn(&[3, 5], 4).unwrap().to_vec();
    let mut per_provider = vec![];
    for provider in ["only:reference", "only:native_cpu"] {
        let g = with_profile(provider, || {
            let w = Tensor::from_vec(w0.clone(), &[3, 5])
                .unwrap()
                .requires_grad();
            let grads = composite(&x, &w, &c, &t).backward().unwrap();
            grads.get(&w).unwrap().to_vec()
        });
        // central differences in f32 (smooth function, loose tolerance)
        let h = 1e-2f32;
        for k in 0..w0.len() {
            let eval = |d: f32| {
                let mut w = w0.clone();
                w[k] += d;
                with_profile(provider, || {
                    composite(&x, &Tensor::from_vec(w, &[3, 5]).unwrap(), &c, &t)
                        .item()
                        .unwrap()
                })
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            assert!(
                (fd - g[k]).abs() < 2e-3 + 2e-2 * fd.abs(),
                "{provider} coord {k}: tape {} vs fd {fd}",
                g[k]
            );
        }
        per_provider.push(g);
    }
    for (a, b) in per_provider[0].iter().zip(&per_provider[1]) {
        assert!(
            (a - b).abs() < 1e-5 + 1e-4 * a.abs(),
            "reference {a} vs native {b}"
        );
    }
}

#[test]
fn multiple_paths_and_passes_accumulate() {
    support::checked_cpu_default();
    let x = Tensor::from_vec(vec![1.0, -2.0, 3.0], &[3])
        .unwrap()
        .requires_grad();
    // y = sum(x*x + x): dy/dx = 2x + 1 (two paths through x)
    let y = x.mul(&x).unwrap().add(&x).unwrap().sum_all().unwrap();
    let g = y.backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec(), vec![3.0, -3.0, 7.0]);
    let mut acc = Gradients::default();
    y.backward_into(&mut acc).unwrap();
    y.backward_into(&mut acc).unwrap();
    assert_eq!(acc.get(&x).unwrap().to_vec(), vec![6.0, -6.0, 14.0]);
}

#[test]
fn no_grad_and_detach_cut_the_tape() {
    support::checked_cpu_default();
    let x = Tensor::from_vec(vec![2.0, 3.0], &[2])
        .unwrap()
        .requires_grad();
    let z = no_grad(|| x.mul(&x)).unwrap();
    assert!(!z.is_tracked() && z.producer().is_none());
    // y = sum(x * detach(x)): gradient is detach(x), not 2x
    let y = x.mul(&x.detach()).unwrap().sum_all().unwrap();
    assert_eq!(
        y.backward().unwrap().get(&x).unwrap().to_vec(),
        vec![2.0, 3.0]
    );
    // a leaf that does not require grad receives nothing
    let c = Tensor::from_vec(vec![1.0, 1.0], &[2]).unwrap();
    let g = x.mul(&c).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(g.get(&c).is_none() && g.get(&x).is_some());
}

#[test]
fn gradients_flow_through_views() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[2, 3], 9).unwrap().requires_grad();
    let y = x
        .transpose(0, 1)
        .unwrap()
        .slice(0, 1, 3)
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .sum_all()
        .unwrap();
    let g = y.backward().unwrap().get(&x).unwrap().to_vec();
    assert_eq!(g, vec![0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
}

#[test]
fn views_share_storage_and_read_correctly() {
    support::checked_cpu_default();
    let a = Tensor::arange(0.0, 6.0, 1.0)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let t = a.transpose(0, 1).unwrap();
    assert!(t.shares_storage_with(&a) && !t.is_contiguous());
    assert_eq!(t.to_vec(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let s = a.slice(1, 1, 3).unwrap();
    assert!(s.shares_storage_with(&a));
    assert_eq!(s.to_vec(), vec![1.0, 2.0, 4.0, 5.0]);
    assert_eq!(a.get(&[1, 2]).unwrap(), 5.0);
    assert_eq!(t.get(&[2, 1]).unwrap(), 5.0);
    let b = Tensor::from_vec(vec![1.0, 2.0], &[2, 1])
        .unwrap()
        .broadcast_to(&[2, 3])
        .unwrap();
    assert_eq!(b.to_vec(), vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
}

fn train(provider: &str, seed: u64) -> Vec<f32> {
    with_profile(provider, || {
        let mut model = Mlp::new(&[4, 16, 1], Activation::Tanh, seed).unwrap();
        let mut opt = Adam::new(0.01).unwrap();
        let data = SyntheticRegression::new(256, seed + 1).unwrap();
        train_regression(&mut model, &mut opt, &data, 30, 32, 0, |_| {}).unwrap()
    })
}

#[test]
fn training_is_deterministic_and_providers_agree() {
    support::checked_cpu_default();
    let a = train("only:native_cpu", 5);
    let b = train("only:native_cpu", 5);
    assert_eq!(a, b, "same seed, same bits");
    let r = train("only:reference", 5);
    for (x, y) in a.iter().zip(&r) {
        assert!(
            (x - y).abs() < 1e-4 * (1.0 + y.abs()),
            "native {x} vs reference {y}"
        );
    }
}

#[test]
fn quickstart_mlp_converges_tenfold_in_200_steps() {
    support::checked_cpu_default();
    let losses = with_profile("auto", || {
        let mut model = Mlp::new(
            &[SyntheticRegression::FEATURES, 64, 64, 1],
            Activation::Tanh,
            0,
        )
        .unwrap();
        let mut opt = Adam::new(0.01).unwrap();
        let data = SyntheticRegression::new(1024, 17).unwrap();
        assert_eq!(model.parameter_count(), 4 * 64 + 64 + 64 * 64 + 64 + 64 + 1);
        train_regression(&mut model, &mut opt, &data, 200, 64, 0, |_| {}).unwrap()
    });
    let last: f32 = losses[190..].iter().sum::<f32>() / 10.0;
    assert!(
        losses[0] / last >= 10.0,
        "loss fell only from {} to {last}",
        losses[0]
    );
}

#[test]
fn rng_is_counter_based_and_seeded() {
    support::checked_cpu_default();
    let a = Tensor::rand(&[1000], 7).unwrap().to_vec();
    assert_eq!(a, Tensor::rand(&[1000], 7).unwrap().to_vec());
    assert_ne!(a, Tensor::rand(&[1000], 8).unwrap().to_vec());
    // element i is the spec's: the top 24 bits of splitmix64(stream_key(seed) + i) over 2^24
    let key = torchlean::spec::stream_key(7);
    for (i, v) in a.iter().enumerate() {
        let bits = torchlean::spec::splitmix64(key.wrapping_add(i as u64));
        assert_eq!(*v as f64, (bits >> 40) as f64 / 16_777_216.0);
    }
    // and a draw is not a shift of the draw of a nearby seed (keyed by the seed itself,
    // element i of seed k was element 0 of seed k + i)
    assert_ne!(a[5], Tensor::rand(&[1], 12).unwrap().to_vec()[0]);
    assert_ne!(&a[1..], &Tensor::rand(&[999], 8).unwrap().to_vec()[..]);
    let mean = a.iter().sum::<f32>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05 && a.iter().all(|v| (0.0..1.0).contains(v)));
    let n = Tensor::randn(&[20000], 3).unwrap().to_vec();
    let m = n.iter().sum::<f32>() / n.len() as f32;
    let var = n.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / n.len() as f32;
    assert!(
        m.abs() < 0.03 && (var - 1.0).abs() < 0.05,
        "mean {m} var {var}"
    );
    let x = Tensor::ones(&[10000]).unwrap();
    let kept = x.dropout(0.25, 1).unwrap().to_vec();
    let frac = kept.iter().filter(|&&v| v != 0.0).count() as f32 / 10000.0;
    assert!(
        (frac - 0.75).abs() < 0.02
            && kept
                .iter()
                .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6)
    );
}

#[test]
fn display_shows_values_shape_and_producer() {
    support::checked_cpu_default();
    let a = Tensor::from_vec(vec![1.0, 2.5], &[2]).unwrap();
    assert_eq!(a.to_string(), "tensor([1.0000, 2.5000], shape=[2])");
    let b = a.clone().requires_grad().relu().unwrap();
    assert!(b.to_string().contains("grad_fn=relu<"), "{b}");
    let big = Tensor::zeros(&[2000]).unwrap().to_string();
    assert!(big.contains("...") && big.len() < 200);
}

/// `y.backward_with(&g)` is the vector-Jacobian product: the gradients of Σ y ⊙ g, checked
/// against central finite differences of that objective (f64 spec values are not needed: the
/// objective is smooth and the step is large enough for f32), and it refuses a cotangent of
/// another shape with a typed error.
#[test]
fn backward_with_is_the_vector_jacobian_product() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[3, 4], 11).unwrap();
    let w0 = Tensor::randn(&[4, 5], 12).unwrap().scale(0.5).unwrap();
    let g = Tensor::randn(&[3, 5], 13).unwrap();
    let f = |w: &Tensor| x.matmul(w).unwrap().tanh().unwrap();
    let w = w0.detach().requires_grad();
    let grads = f(&w).backward_with(&g).unwrap();
    let got = grads.get(&w).expect("a gradient for w").to_vec();
    let base = w0.to_vec();
    let objective = |v: &[f32]| -> f64 {
        let wt = Tensor::from_vec(v.to_vec(), &[4, 5]).unwrap();
        let y = f(&wt).to_vec();
        y.iter()
            .zip(g.to_vec())
            .map(|(a, b)| *a as f64 * b as f64)
            .sum()
    };
    for (i, &gi) in got.iter().enumerate() {
        let h = 1e-2f32;
        let (mut up, mut down) = (base.clone(), base.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (objective(&up) - objective(&down)) / (2.0 * h as f64);
        assert!(
            (gi as f64 - fd).abs() <= 2e-3 * (1.0 + fd.abs()),
            "element {i}: backward_with {gi}, finite difference {fd}"
        );
    }
    let wrong = Tensor::randn(&[5, 3], 14).unwrap();
    let w = w0.detach().requires_grad();
    assert!(f(&w).backward_with(&wrong).is_err());
}

/// maximum and minimum at ties, NaN and strict wins, against PyTorch's derivative formula
/// (derivatives.yaml: `self: where(self == other, grad / 2, grad).masked_fill_(self < other,
/// 0)`, the mirror image for `other`), worked out by hand here: on a tie each input gets half
/// the cotangent, -0 and +0 tie, a NaN passes it to both. Earlier versions sent all of a
/// tie's cotangent to the first input (found by a PyTorch-oracle audit).
#[test]
fn maximum_and_minimum_share_the_gradient_on_ties_as_pytorch_does() {
    let a_vals = [1.0f32, 2.0, 3.0, -0.0, f32::NAN, 5.0];
    let b_vals = [1.0f32, 1.0, 4.0, 0.0, 1.0, f32::NAN];
    let g = [1.0f32, 2.0, 4.0, 8.0, 16.0, 32.0];
    // PyTorch's gradients (a, b) for maximum and minimum
    let max_a = [0.5f32, 2.0, 0.0, 4.0, 16.0, 32.0];
    let max_b = [0.5f32, 0.0, 4.0, 4.0, 16.0, 32.0];
    let min_a = [0.5f32, 0.0, 4.0, 4.0, 16.0, 32.0];
    let min_b = [0.5f32, 2.0, 0.0, 4.0, 16.0, 32.0];
    for provider in ["reference", "native_cpu"] {
        with_profile(&format!("only:{provider}"), || {
            for (name, want) in [("maximum", (max_a, max_b)), ("minimum", (min_a, min_b))] {
                let a = Tensor::from_vec(a_vals.to_vec(), &[6])
                    .unwrap()
                    .requires_grad();
                let b = Tensor::from_vec(b_vals.to_vec(), &[6])
                    .unwrap()
                    .requires_grad();
                let w = Tensor::from_vec(g.to_vec(), &[6]).unwrap();
                let y = if name == "maximum" {
                    a.maximum(&b)
                } else {
                    a.minimum(&b)
                }
                .unwrap();
                let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
                assert_eq!(
                    grads.get(&a).unwrap().to_vec(),
                    want.0,
                    "{provider} {name} d/da"
                );
                assert_eq!(
                    grads.get(&b).unwrap().to_vec(),
                    want.1,
                    "{provider} {name} d/db"
                );
            }
        });
    }
}

/// The tape places the cotangents of slices of one tensor along one axis with one `concat`
/// (runtime/slice_pieces.rs) instead of each slice's zero-padded VJP and the adds. The
/// gradients equal the hand-computed ones — each position receives the sum over the
/// slices that read it of that slice's weight, times 3 (h = 3x) — for slices that
/// partition the axis, leave gaps, overlap, mix axes, cover the whole axis, and for slices
/// of a leaf (the slice's own VJP); `concat` ran when the slices were placed, and was
/// planned by `preplan` from the traced uses.
#[test]
fn slices_of_one_tensor_take_their_cotangents_side_by_side() {
    use torchlean::graph::OpKind;
    type Slices = Vec<(usize, usize, usize)>; // (axis, start, end)
    let cases: Vec<(&str, Slices, bool)> = vec![
        ("partition", vec![(1, 0, 3), (1, 3, 5), (1, 5, 9)], true),
        ("gaps", vec![(1, 5, 7), (1, 0, 2)], true),
        ("overlap", vec![(1, 0, 4), (1, 2, 6)], true),
        ("mixed axes", vec![(1, 0, 4), (0, 1, 3), (1, 4, 9)], true),
        ("whole axis", vec![(1, 0, 9)], true),
        ("slices of a leaf", vec![(1, 0, 3), (1, 3, 9)], false),
    ];
    let shape = [4usize, 9];
    for (what, slices, through_h) in cases {
        let before =
            runtime::install(Session::new(BackendProfile::named("checked_cpu").unwrap())).unwrap();
        let x = Tensor::randn(&shape, 11).unwrap().requires_grad();
        let h = if through_h {
            x.scale(3.0).unwrap()
        } else {
            x.clone()
        };
        let mut expected = vec![0.0f32; 36];
        let mut loss: Option<Tensor> = None;
        for (k, &(axis, start, end)) in slices.iter().enumerate() {
            let mut s = shape.to_vec();
            s[axis] = end - start;
            let c = Tensor::randn(&s, 100 + k as u64).unwrap();
            let cv = c.to_vec();
            for i in 0..s[0] {
                for j in 0..s[1] {
                    let (xi, xj) = if axis == 0 {
                        (i + start, j)
                    } else {
                        (i, j + start)
                    };
                    let factor = if through_h { 3.0 } else { 1.0 };
                    expected[xi * 9 + xj] += factor * cv[i * s[1] + j];
                }
            }
            let term = h
                .slice(axis, start, end)
                .unwrap()
                .mul(&c)
                .unwrap()
                .sum_all()
                .unwrap();
            loss = Some(match loss {
                None => term,
                Some(l) => l.add(&term).unwrap(),
            });
        }
        let grads = loss.unwrap().backward().unwrap();
        let got = grads.get(&x).unwrap().to_vec();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!(
                (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                "{what}: gradient {i} is {g}, expected {e}"
            );
        }
        let report = runtime::take().unwrap().unwrap().report();
        let ran_concat = report.kernels.iter().any(|k| k.op == OpKind::Concat);
        let placed = through_h && what != "whole axis";
        assert_eq!(ran_concat, placed, "{what}: concat ran = {ran_concat}");
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
    // preplan: a recorded slice plans concat before the first kernel
    let mut session = Session::new(BackendProfile::named("checked_cpu").unwrap());
    let uses = runtime::trace(|| {
        let x = Tensor::randn(&shape, 1).unwrap().requires_grad();
        x.scale(2.0)?.slice(1, 0, 3)?.sum_all()
    })
    .unwrap();
    let planned = session.preplan(&uses).unwrap();
    assert!(planned.kernels.iter().any(|k| k.op == OpKind::Concat));
}

/// `requires_grad()` follows PyTorch's `requires_grad_()`: on a tensor already in the
/// gradient (a recorded result) it changes nothing — it cut the result off the tape, so its
/// inputs got no gradient — and each untracked handle it is called on becomes its own leaf
/// (two leaves made from handles of one tensor shared one gradient entry). Values from
/// PyTorch 2.15: `x = tensor([1., 2.], requires_grad=True); z = (x * 3).requires_grad_();
/// (z * z).sum().backward()` gives `x.grad = [18., 36.]`.
#[test]
fn requires_grad_keeps_a_recorded_result_on_the_tape_and_makes_distinct_leaves() {
    support::checked_cpu_default();
    let x = Tensor::from_vec(vec![1.0, 2.0], &[2])
        .unwrap()
        .requires_grad();
    let z = x.scale(3.0).unwrap().requires_grad();
    let g = z.mul(&z).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec(), vec![18.0, 36.0]);
    // a leaf asked again stays the same leaf
    let again = x.clone().requires_grad();
    assert_eq!(again.id(), x.id());

    let w = Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap();
    let (a, b) = (w.clone().requires_grad(), w.clone().requires_grad());
    assert_ne!(a.id(), b.id());
    let loss = a
        .mul(&a)
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&b.sum_all().unwrap())
        .unwrap();
    let g = loss.backward().unwrap();
    assert_eq!(g.get(&a).unwrap().to_vec(), vec![2.0, 4.0]);
    assert_eq!(g.get(&b).unwrap().to_vec(), vec![1.0, 1.0]);
}

/// `flatten_from` refuses a start axis past the last one, as `torch.flatten` does (it
/// appended an axis of size 1); a 0-d tensor flattens to `[1]`.
#[test]
fn flatten_from_refuses_a_start_axis_out_of_range() {
    support::checked_cpu_default();
    let t = Tensor::zeros(&[2, 3, 4]).unwrap();
    assert_eq!(t.flatten_from(1).unwrap().shape(), &[2, 12]);
    assert_eq!(t.flatten_from(2).unwrap().shape(), &[2, 3, 4]);
    assert!(t.flatten_from(3).is_err());
    assert!(Tensor::zeros(&[2, 3]).unwrap().flatten_from(2).is_err());
    assert_eq!(Tensor::scalar(5.0).flatten_from(0).unwrap().shape(), &[1]);
}
