//! Pointwise calls under a replay checker run and are checked tile by tile
//! (`runtime/tiled.rs`): the values are those of the unchecked profile, bit for bit, and a
//! wrong element is rejected with its tile named, in the forward pass, the backward pass, an
//! optimizer update (whose target is then left as it was) and an update of several tensors
//! (`adam_step`: every target left as it was).

use std::sync::Arc;
use torchlean::backend::{BackendProfile, Registry};
use torchlean::graph::{Op, OpKind};
use torchlean::providers::native_cpu;
use torchlean::runtime::kernel::{Dense, DenseKernels, KernelBinding};
use torchlean::runtime::{self, Session};
use torchlean::{Error, Result, Tensor};

/// Larger than two tiles (2 · 16384), and not a multiple of one.
const N: usize = 100_000;
/// Where the faulty kernels below go wrong: element 70000, in tile 65536..81920.
const MARK_AT: usize = 70_000;
const MARK: f32 = 7.0;

fn ramp(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn with_profile<R>(name: &str, registry: Option<Arc<Registry>>, f: impl FnOnce() -> R) -> R {
    let profile = BackendProfile::named(name).unwrap();
    let session = match registry {
        Some(r) => Session::with_registry(profile, r),
        None => Session::new(profile),
    };
    let before = runtime::install(session).unwrap();
    let out = f();
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    out
}

/// Forward values and gradients of relu, gelu and a same-shape mul, and two optimizer
/// updates, over N elements.
fn pointwise_values() -> Vec<Vec<f32>> {
    let x = Tensor::from_vec(ramp(N, 1), &[N]).unwrap().requires_grad();
    let w = Tensor::from_vec(ramp(N, 2), &[N]).unwrap().requires_grad();
    let y = x.relu().unwrap().mul(&w).unwrap().gelu().unwrap();
    let loss = y.mul(&y).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gx = grads.get(&x).unwrap().to_vec();
    let mut m = Tensor::from_vec(ramp(N, 3), &[N]).unwrap();
    runtime::apply_update(
        Op::ema_update(0.9, false),
        &mut m,
        &[&Tensor::from_vec(gx.clone(), &[N]).unwrap()],
    )
    .unwrap();
    let mut v = Tensor::from_vec(ramp(N, 4).iter().map(|a| a * a).collect(), &[N]).unwrap();
    let mut p = Tensor::from_vec(ramp(N, 5), &[N]).unwrap();
    runtime::apply_update(
        Op::AdamUpdate {
            step_size: 1e-3,
            c2_sqrt: 0.3,
            eps: 1e-8,
            shrink: 1.0,
        },
        &mut p,
        &[&m, &v],
    )
    .unwrap();
    runtime::apply_update(
        Op::ema_update(0.999, true),
        &mut v,
        &[&Tensor::from_vec(gx.clone(), &[N]).unwrap()],
    )
    .unwrap();
    let mut values = vec![
        y.to_vec(),
        gx,
        grads.get(&w).unwrap().to_vec(),
        m.to_vec(),
        p.to_vec(),
        v.to_vec(),
    ];
    values.extend(adam_step_values());
    values
}

/// `adam_step` with L2 decay over two parameters, one of N elements (several tiles and a
/// partial one) and one smaller than a tile.
fn adam_step_op() -> Op {
    Op::AdamStep {
        beta1: 0.9,
        weight1: 0.1,
        beta2: 0.999,
        weight2: 0.001,
        step_size: 1e-3,
        c2_sqrt: 0.3,
        eps: 1e-8,
        shrink: 1.0,
        l2: 0.01,
    }
}

/// The two parameters' (w, m, v) and gradients of [`adam_step_values`], from `seed`.
fn adam_step_operands(seed: u32) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut state = Vec::new();
    let mut grads = Vec::new();
    for (i, n) in [N, 1000].into_iter().enumerate() {
        let s = seed + 10 * i as u32;
        state.push(Tensor::from_vec(ramp(n, s), &[n]).unwrap());
        state.push(Tensor::from_vec(ramp(n, s + 1), &[n]).unwrap());
        let v: Vec<f32> = ramp(n, s + 2).iter().map(|a| a * a).collect();
        state.push(Tensor::from_vec(v, &[n]).unwrap());
        grads.push(Tensor::from_vec(ramp(n, s + 3), &[n]).unwrap());
    }
    (state, grads)
}

/// The six updated tensors of one `adam_step` call.
fn adam_step_values() -> Vec<Vec<f32>> {
    let (mut state, grads) = adam_step_operands(20);
    let mut targets: Vec<&mut Tensor> = state.iter_mut().collect();
    let rest: Vec<&Tensor> = grads.iter().collect();
    runtime::apply_update_many(adam_step_op(), &mut targets, &rest).unwrap();
    state.iter().map(|t| t.to_vec()).collect()
}

#[test]
fn tiled_checks_leave_every_value_as_the_unchecked_profile_computes_it() {
    let checked = with_profile("checked_cpu", None, pointwise_values);
    let strict = with_profile("strict_native_cpu", None, pointwise_values);
    assert_eq!(checked.len(), strict.len());
    for (i, (c, s)) in checked.iter().zip(&strict).enumerate() {
        assert!(c.len() == N || c.len() == 1000, "result {i}: {}", c.len());
        assert_eq!(c.len(), s.len(), "result {i}");
        let same = c.iter().zip(s).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "result {i} differs between checked_cpu and strict_native_cpu"
        );
    }
}

/// `values` with `wrong(v)` in place of each element whose `marker` element is MARK.
fn patched(values: &mut [f32], marker: &[f32], wrong: impl Fn(f32) -> f32) {
    for (v, &m) in values.iter_mut().zip(marker) {
        if m == MARK {
            *v = wrong(*v);
        }
    }
}

/// A tensor's values patched as [`patched`] does.
fn patched_tensor(t: &Tensor, marker: &Tensor, wrong: impl Fn(f32) -> f32) -> Result<Tensor> {
    let mut v = t.to_vec();
    patched(&mut v, &marker.to_vec(), wrong);
    Tensor::from_vec(v, t.shape())
}

/// Native relu, except that an input equal to MARK gives MARK + 0.5.
fn faulty_forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    patched_tensor(&native_cpu::forward(op, inputs)?, inputs[0], |_| MARK + 0.5)
}

fn faulty_forward_into(op: &Op, x: &[Dense], out: &mut [f32]) -> Result<()> {
    let native = native_cpu::binding_for(OpKind::Relu)
        .dense()
        .expect("relu has dense kernels");
    (native.forward_into)(op, x, out)?;
    patched(out, x[0].data, |_| MARK + 0.5);
    Ok(())
}

/// Native relu's VJP, except that the gradient at an input equal to MARK is doubled.
fn faulty_vjp(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    cotangent: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let mut grads = native_cpu::vjp(op, inputs, output, cotangent, needs)?;
    if let Some(Some(g)) = grads.first_mut() {
        *g = patched_tensor(g, inputs[0], |g| 2.0 * g)?;
    }
    Ok(grads)
}

fn faulty_vjp_into(
    op: &Op,
    x: &[Dense],
    y: Dense,
    g: Dense,
    outs: &mut [Option<&mut [f32]>],
) -> Result<()> {
    let native = native_cpu::binding_for(OpKind::Relu)
        .dense()
        .and_then(|d| d.vjp_into)
        .expect("relu has a dense VJP");
    native(op, x, y, g, outs)?;
    if let Some(o) = outs[0].as_deref_mut() {
        patched(o, x[0].data, |g| 2.0 * g);
    }
    Ok(())
}

/// Native `ema_update`, except that a state equal to MARK gives MARK + 0.5 (tensor and
/// destination-passing kernels alike).
fn faulty_ema(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    patched_tensor(&native_cpu::forward(op, inputs)?, inputs[0], |_| MARK + 0.5)
}

fn faulty_ema_into(op: &Op, x: &[Dense], out: &mut [f32]) -> Result<()> {
    let native = native_cpu::binding_for(OpKind::EmaUpdate)
        .dense()
        .expect("ema_update has dense kernels");
    (native.forward_into)(op, x, out)?;
    patched(out, x[0].data, |_| MARK + 0.5);
    Ok(())
}

/// An optimizer update computed wrong in one element is rejected by tiles, and the state it
/// would have replaced is left as it was.
#[test]
fn a_wrong_update_is_rejected_and_leaves_its_target_untouched() {
    let mut r = Registry::new();
    for &op in OpKind::ALL {
        let binding = if op == OpKind::EmaUpdate {
            KernelBinding::new("faulty_ema", faulty_ema, None).with_dense(Some(DenseKernels {
                forward_into: faulty_ema_into,
                vjp_into: None,
                in_place_into: None,
            }))
        } else {
            native_cpu::binding_for(op)
        };
        r.register(native_cpu::replayed_capsule(op), binding)
            .unwrap();
    }
    let state: Vec<f32> = {
        let mut v = ramp(N, 12);
        v[MARK_AT] = MARK;
        v
    };
    let msg = with_profile("strict_native_cpu", Some(Arc::new(r)), || {
        let mut m = Tensor::from_vec(state.clone(), &[N]).unwrap();
        let g = Tensor::from_vec(ramp(N, 13), &[N]).unwrap();
        let ema = Op::ema_update(0.9, false);
        let msg = rejection(runtime::apply_update(ema, &mut m, &[&g]));
        assert_eq!(m.to_vec(), state, "a rejected update changed its target");
        msg
    });
    assert!(
        msg.contains("elements 65536..81920 of 100000 (checked by tiles"),
        "{msg}"
    );
}

/// Native `adam_step`, except that a first moment equal to MARK gives a parameter of
/// MARK + 0.5 (tensor and destination-passing kernels alike: each parameter's w' comes first
/// in its part of the value).
fn faulty_adam_step(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let mut value = native_cpu::forward(op, inputs)?.to_vec();
    let mut at = 0;
    for group in inputs.chunks(4) {
        let n = group[0].numel();
        patched(&mut value[at..at + n], &group[1].to_vec(), |_| MARK + 0.5);
        at += 3 * n;
    }
    Tensor::from_vec(value, &[at])
}

fn faulty_adam_step_into(op: &Op, x: &[Dense], out: &mut [f32]) -> Result<()> {
    let native = native_cpu::binding_for(OpKind::AdamStep)
        .dense()
        .expect("adam_step has dense kernels");
    (native.forward_into)(op, x, out)?;
    let mut at = 0;
    for group in x.chunks(4) {
        let n = group[0].data.len();
        patched(&mut out[at..at + n], group[1].data, |_| MARK + 0.5);
        at += 3 * n;
    }
    Ok(())
}

/// An update of several tensors computed wrong in one element of one parameter is rejected
/// by tiles, naming the parameter and the tile, and every tensor it would have updated — the
/// wrong parameter's and the other's — is left as it was.
#[test]
fn a_wrong_update_of_several_tensors_is_rejected_and_leaves_every_target_untouched() {
    let mut r = Registry::new();
    for &op in OpKind::ALL {
        let binding = if op == OpKind::AdamStep {
            KernelBinding::new("faulty_adam_step", faulty_adam_step, None).with_dense(Some(
                DenseKernels {
                    forward_into: faulty_adam_step_into,
                    vjp_into: None,
                    in_place_into: None,
                },
            ))
        } else {
            native_cpu::binding_for(op)
        };
        r.register(native_cpu::replayed_capsule(op), binding)
            .unwrap();
    }
    let registry = Arc::new(r);
    // the unmarked call is accepted: the faulty kernels are native elsewhere
    let clean = with_profile(
        "strict_native_cpu",
        Some(registry.clone()),
        adam_step_values,
    );
    let want = with_profile("checked_cpu", None, adam_step_values);
    assert_eq!(clean, want, "the unmarked call differs from checked_cpu's");
    let msg = with_profile("strict_native_cpu", Some(registry), || {
        let (mut state, grads) = adam_step_operands(20);
        // the first moment of the first parameter, marked
        let mut m = state[1].to_vec();
        m[MARK_AT] = MARK;
        state[1] = Tensor::from_vec(m, &[N]).unwrap();
        let before: Vec<Vec<f32>> = state.iter().map(|t| t.to_vec()).collect();
        let mut targets: Vec<&mut Tensor> = state.iter_mut().collect();
        let rest: Vec<&Tensor> = grads.iter().collect();
        let msg = rejection(runtime::apply_update_many(
            adam_step_op(),
            &mut targets,
            &rest,
        ));
        let after: Vec<Vec<f32>> = state.iter().map(|t| t.to_vec()).collect();
        assert_eq!(after, before, "a rejected update changed a target");
        msg
    });
    assert!(
        msg.contains("group 0 of 2: elements 65536..81920 of 100000 (checked by tiles"),
        "{msg}"
    );
}

/// The replayed native registry with relu bound to the faulty kernels (forward or VJP).
fn registry_with_faulty_relu(forward: bool) -> Arc<Registry> {
    let mut r = Registry::new();
    for &op in OpKind::ALL {
        let binding = if op != OpKind::Relu {
            native_cpu::binding_for(op)
        } else if forward {
            KernelBinding::new("faulty_relu", faulty_forward, Some(native_cpu::vjp)).with_dense(
                Some(DenseKernels {
                    forward_into: faulty_forward_into,
                    vjp_into: native_cpu::binding_for(OpKind::Relu)
                        .dense()
                        .and_then(|d| d.vjp_into),
                    in_place_into: None,
                }),
            )
        } else {
            KernelBinding::new("faulty_relu", native_cpu::forward, Some(faulty_vjp)).with_dense(
                Some(DenseKernels {
                    forward_into: native_cpu::binding_for(OpKind::Relu)
                        .dense()
                        .expect("relu has dense kernels")
                        .forward_into,
                    vjp_into: Some(faulty_vjp_into),
                    in_place_into: None,
                }),
            )
        };
        r.register(native_cpu::replayed_capsule(op), binding)
            .unwrap();
    }
    Arc::new(r)
}

fn marked(n: usize) -> Tensor {
    let mut v = ramp(n, 9);
    v[MARK_AT.min(n - 1)] = MARK;
    Tensor::from_vec(v, &[n]).unwrap().requires_grad()
}

fn rejection(r: Result<impl Sized>) -> String {
    match r {
        Err(e @ Error::CheckerRejected { .. }) => e.to_string(),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("the faulty kernel's result was accepted"),
    }
}

#[test]
fn a_wrong_element_is_rejected_with_its_tile_named() {
    let tile = "elements 65536..81920 of 100000 (checked by tiles";
    // forward, large: by tiles
    let msg = with_profile(
        "strict_native_cpu",
        Some(registry_with_faulty_relu(true)),
        || rejection(marked(N).relu()),
    );
    assert!(msg.contains(tile) && msg.contains("relu"), "{msg}");
    // forward, small: the whole call (no tile named), still rejected
    let msg = with_profile(
        "strict_native_cpu",
        Some(registry_with_faulty_relu(true)),
        || rejection(marked(1000).relu()),
    );
    assert!(!msg.contains("checked by tiles"), "{msg}");
    // backward, large
    let msg = with_profile(
        "strict_native_cpu",
        Some(registry_with_faulty_relu(false)),
        || {
            let x = marked(N);
            let y = x.relu().unwrap();
            rejection(y.mul(&y).unwrap().sum_all().unwrap().backward())
        },
    );
    assert!(msg.contains(tile), "{msg}");
}
