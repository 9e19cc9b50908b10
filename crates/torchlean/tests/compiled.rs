//! Compiled mode: capture → plan → gate → execute, against eager execution.

mod support;
use torchlean::backend::BackendProfile;
use torchlean::graph::{append_backward, Graph, NodeKind};
use torchlean::nn::tasks::SyntheticRegression;
use torchlean::nn::{Activation, Adam, Mlp, Module, Optimizer};
use torchlean::runtime::capture::capture;
use torchlean::runtime::compiled::{CompiledGraph, CompiledStep};
use torchlean::{Gradients, Tensor};

fn named_params(m: &Mlp) -> Vec<(String, Tensor)> {
    m.parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect()
}

#[test]
fn captured_graph_is_well_formed_and_reruns_the_forward() {
    support::checked_cpu_default();
    let model = Mlp::new(&[4, 8, 1], Activation::Tanh, 1).unwrap();
    let x = Tensor::randn(&[5, 4], 2).unwrap();
    let eager = model.forward(&x).unwrap().to_vec();
    let c = capture(&[("x".into(), x.clone())], &named_params(&model), |xs| {
        Ok(vec![("y".into(), model.forward(&xs[0])?)])
    })
    .unwrap();
    c.graph.validate().unwrap();
    let ops: Vec<&str> = c
        .graph
        .nodes
        .iter()
        .filter_map(|n| {
            if let NodeKind::Op { op } = &n.kind {
                Some(op.name())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(ops, vec!["linear", "tanh", "linear"]);
    let compiled = CompiledGraph::compile(c.graph.clone(), &BackendProfile::default_cpu()).unwrap();
    let values = c.values.clone();
    let out = compiled
        .run(|n| {
            if n == "x" {
                Some(x.clone())
            } else {
                values.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone())
            }
        })
        .unwrap();
    assert_eq!(
        out[0].1.to_vec(),
        eager,
        "same kernels, same order: same bits"
    );
    // JSON round trip keeps the graph identical
    let json = serde_json::to_string(&c.graph).unwrap();
    let back: Graph = serde_json::from_str(&json).unwrap();
    assert_eq!(back, c.graph);
}

fn train(compiled: bool, steps: usize) -> Vec<f32> {
    let mut model = Mlp::new(
        &[SyntheticRegression::FEATURES, 64, 64, 1],
        Activation::Tanh,
        0,
    )
    .unwrap();
    let mut opt = Adam::new(0.01).unwrap();
    let data = SyntheticRegression::new(1024, 17).unwrap();
    let profile = BackendProfile::default_cpu();
    let mut step: Option<CompiledStep> = None;
    let mut losses = vec![];
    for s in 0..steps {
        let (x, y) = data.batch(s, 16).unwrap();
        let (loss, grads) = if compiled {
            if step.is_none() {
                let inputs = [("x".to_string(), x.clone()), ("y".to_string(), y.clone())];
                let m = &model;
                step = Some(
                    CompiledStep::build(
                        &inputs,
                        &named_params(m),
                        |xs| m.forward(&xs[0])?.mse_loss(&xs[1]),
                        &profile,
                    )
                    .unwrap(),
                );
            }
            let params = model.parameters();
            let (loss, named) = step
                .as_ref()
                .unwrap()
                .run(
                    &[("x".into(), x), ("y".into(), y)],
                    &params
                        .iter()
                        .map(|(n, t)| (n.clone(), *t))
                        .collect::<Vec<_>>(),
                )
                .unwrap();
            let mut g = Gradients::default();
            for (n, t) in &params {
                if let Some((_, gt)) = named.iter().find(|(k, _)| k == n) {
                    g.insert(t, gt.clone());
                }
            }
            (loss.item().unwrap(), g)
        } else {
            let loss = model.forward(&x).unwrap().mse_loss(&y).unwrap();
            (loss.item().unwrap(), loss.backward().unwrap())
        };
        opt.step(&mut model, &grads).unwrap();
        losses.push(loss);
    }
    losses
}

#[test]
fn compiled_and_eager_training_give_the_same_losses() {
    support::checked_cpu_default();
    let e = train(false, 40);
    let c = train(true, 40);
    for (i, (a, b)) in e.iter().zip(&c).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1e-6),
            "step {i}: eager {a} vs compiled {b}"
        );
    }
    // training makes progress: the last ten batches' mean loss is below the first ten's (one
    // batch of 16 against another is noise)
    let mean = |l: &[f32]| l.iter().sum::<f32>() / l.len() as f32;
    assert!(mean(&e[30..]) < mean(&e[..10]), "{e:?}");
}

#[test]
fn backward_graph_has_vjp_nodes_and_gradient_outputs() {
    support::checked_cpu_default();
    let model = Mlp::new(&[3, 4, 1], Activation::Relu, 3).unwrap();
    let x = Tensor::randn(&[2, 3], 4).unwrap();
    let y = Tensor::randn(&[2, 1], 5).unwrap();
    let mut c = capture(
        &[("x".into(), x), ("y".into(), y)],
        &named_params(&model),
        |xs| {
            Ok(vec![(
                "loss".into(),
                model.forward(&xs[0])?.mse_loss(&xs[1])?,
            )])
        },
    )
    .unwrap();
    let names = append_backward(&mut c.graph, "loss", None).unwrap();
    c.graph.validate().unwrap();
    for p in [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
        "x",
        "y",
    ] {
        assert!(names.contains(&format!("grad.{p}")), "{names:?}");
    }
    assert!(c
        .graph
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Vjp { .. })));
}

#[test]
fn compiled_plan_is_gated_and_rejected_plans_are_kept() {
    support::checked_cpu_default();
    let model = Mlp::new(&[3, 4, 1], Activation::Relu, 3).unwrap();
    let x = Tensor::randn(&[2, 3], 4).unwrap();
    let c = capture(&[("x".into(), x)], &named_params(&model), |xs| {
        Ok(vec![("y".into(), model.forward(&xs[0])?)])
    })
    .unwrap();
    // native kernels carry tests (checked) or replay checkers (strict): a policy that admits
    // theorems only refuses both
    let theorems_only = BackendProfile::custom(
        torchlean::backend::Device::Cpu,
        torchlean::backend::ProviderPreference::Only(torchlean::backend::Provider::NativeCpu),
        torchlean::backend::AcceptancePolicy::custom(
            vec![torchlean::backend::EvidenceKind::Theorem],
            vec![torchlean::backend::TrustLevel::Verified],
        ),
        torchlean::backend::VjpMode::TorchleanTape,
    );
    match CompiledGraph::compile(c.graph.clone(), &theorems_only) {
        Err(torchlean::runtime::compiled::CompileError::Rejected(r)) => {
            assert!(!r.failures.is_empty() && !r.audits.is_empty())
        }
        other => panic!("expected a gate rejection, got {:?}", other.err()),
    }
    let cuda = BackendProfile::named("checked_cuda").unwrap();
    assert!(matches!(
        CompiledGraph::compile(c.graph.clone(), &cuda),
        Err(torchlean::runtime::compiled::CompileError::Planning(_))
    ));
    let strict = BackendProfile::named("strict_cpu").unwrap();
    let ok = CompiledGraph::compile(c.graph, &strict).unwrap();
    assert!(ok
        .report()
        .kernels
        .iter()
        .all(|k| k.capsule.starts_with("reference.")));
    assert_eq!(
        ok.report().mode,
        torchlean::backend::ExecutionMode::Compiled
    );
}

#[test]
fn elementwise_chains_are_fused_with_their_own_capsule_and_match_the_parts() {
    support::checked_cpu_default();
    let w = Tensor::randn(&[4, 4], 11).unwrap();
    let x = Tensor::randn(&[3, 4], 12).unwrap();
    let parts =
        |t: &Tensor| -> torchlean::Result<Tensor> { t.exp()?.tanh()?.scale(2.0)?.add_scalar(-0.5) };
    let eager = parts(&x.matmul(&w).unwrap()).unwrap().to_vec();
    let c = capture(
        &[("x".into(), x.clone())],
        &[("w".into(), w.clone())],
        |xs| Ok(vec![("y".into(), parts(&xs[0].matmul(&w)?)?)]),
    )
    .unwrap();
    let (fused, chains) = torchlean::graph::fuse_elementwise(&c.graph).unwrap();
    assert_eq!(chains.len(), 1);
    assert_eq!(chains[0].replaced.len(), 4, "exp, tanh, scale, add_scalar");
    assert_eq!(fused.nodes.len(), c.graph.nodes.len() - 3);
    fused.validate().unwrap();
    let compiled = CompiledGraph::compile(c.graph.clone(), &BackendProfile::default_cpu()).unwrap();
    let report = compiled.report().to_text();
    assert!(
        report.contains("fused_unary: native_cpu.fused_unary"),
        "{report}"
    );
    let out = compiled
        .run(|n| {
            if n == "x" {
                Some(x.clone())
            } else {
                Some(w.clone())
            }
        })
        .unwrap();
    // the fused kernel runs each step through the unfused kernel's own map: the same bits
    // (it evaluated the spec's f32 formulas, whose tanh and exp differ from the native maps'
    // in the last bits, so a compiled run's outputs depended on whether a chain was fused)
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out[0].1.to_vec()), bits(&eager), "fused vs parts");
}

/// Every native unary map in a fused chain gives the unfused maps' bits, on a small tensor and
/// on one large enough to be split across threads, as a compiled step computes them (fused)
/// and as eager mode does (op by op).
#[test]
fn fused_unary_chains_give_the_unfused_maps_bits() {
    support::checked_cpu_default();
    for (n, seed) in [(37usize, 41u64), (300 * 301, 42)] {
        let x = Tensor::randn(&[n], seed).unwrap().scale(3.0).unwrap();
        let chain = |t: &Tensor| -> torchlean::Result<Tensor> {
            t.tanh()?
                .exp()?
                .sigmoid()?
                .gelu()?
                .softplus()?
                .silu()?
                .sin()?
                .add_scalar(-0.25)?
                .abs()?
                .sqrt()
        };
        let eager = chain(&x).unwrap().to_vec();
        let c = capture(&[("x".into(), x.clone())], &[], |xs| {
            Ok(vec![("y".into(), chain(&xs[0])?)])
        })
        .unwrap();
        let compiled =
            CompiledGraph::compile(c.graph.clone(), &BackendProfile::default_cpu()).unwrap();
        let report = compiled.report().to_text();
        assert!(report.contains("native_cpu.fused_unary"), "{report}");
        let out = compiled.run(|_| Some(x.clone())).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out[0].1.to_vec()), bits(&eager), "n = {n}");
    }
}

/// Compiles `graph` under `default_cpu`, checks that its report holds `row`, runs it on `x`
/// and `leaves`, and compares every output with `eager`'s bit for bit.
fn compiled_equals_eager_bit_for_bit(
    graph: &Graph,
    row: &str,
    x: &Tensor,
    leaves: &[(String, Tensor)],
    eager: &[Tensor],
) {
    let compiled = CompiledGraph::compile(graph.clone(), &BackendProfile::default_cpu()).unwrap();
    let report = compiled.report().to_text();
    assert!(report.contains(row), "{report}");
    let out = compiled
        .run(|n| {
            if n == "x" {
                Some(x.clone())
            } else {
                leaves.iter().find(|(m, _)| m == n).map(|(_, t)| t.clone())
            }
        })
        .unwrap();
    for ((name, got), want) in out.iter().zip(eager) {
        let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got), bits(want), "output {name}");
    }
}

/// A batch norm's shift, scale and bias with a ReLU after a convolution (the imported CNN's
/// pattern) fuse into one `fused_map` node over the conv output with the three per-channel
/// operands as side inputs; the per-channel gain's own chain fuses too; compiled mode gives
/// eager mode's values bit for bit (the fused kernel runs the native maps' operations in
/// order); a value needed twice (x - t used by both operands of a product) stays unfused.
#[test]
fn broadcast_binary_chains_fuse_into_a_fused_map_and_match_eager_bit_for_bit() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[4, 3, 6, 6], 21).unwrap();
    let w = Tensor::randn(&[5, 3, 3, 3], 22).unwrap();
    let mean = Tensor::randn(&[5, 1, 1], 23).unwrap();
    let var = Tensor::randn(&[5, 1, 1], 24).unwrap().abs().unwrap();
    let scale = Tensor::randn(&[5, 1, 1], 25).unwrap();
    let bias = Tensor::randn(&[5, 1, 1], 26).unwrap();
    let t = Tensor::randn(&[4, 5, 4, 4], 27).unwrap();
    let conv = torchlean::graph::Op::Conv2d(torchlean::graph::Conv2dGeometry::default());
    let forward = |x: &Tensor, w: &Tensor, p: &[Tensor]| -> torchlean::Result<Vec<Tensor>> {
        let y = x.apply(conv.clone(), &[w])?;
        let gain = p[1].add_scalar(1e-5)?.sqrt()?.inv()?.mul(&p[2])?;
        let bn = y.sub(&p[0])?.mul(&gain)?.add(&p[3])?.relu()?;
        let d = bn.sub(&p[4])?;
        Ok(vec![bn, d.mul(&d)?])
    };
    let params = [mean, var, scale, bias, t];
    let eager = forward(&x, &w, &params).unwrap();
    let names = ["mean", "var", "scale", "bias", "t"];
    let mut leaves: Vec<(String, Tensor)> = vec![("w".into(), w.clone())];
    leaves.extend(
        names
            .iter()
            .zip(&params)
            .map(|(n, p)| (n.to_string(), p.clone())),
    );
    let c = capture(&[("x".into(), x.clone())], &leaves, |xs| {
        let ps: Vec<Tensor> = names
            .iter()
            .map(|n| leaves.iter().find(|(m, _)| m == n).unwrap().1.clone())
            .collect();
        let out = forward(&xs[0], &w, &ps)?;
        Ok(vec![
            ("bn".into(), out[0].clone()),
            ("sq".into(), out[1].clone()),
        ])
    })
    .unwrap();
    let (fused, chains) = torchlean::graph::fuse_elementwise(&c.graph).unwrap();
    fused.validate().unwrap();
    let maps: Vec<&torchlean::graph::Op> = fused
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Op { op } if op.kind().name() == "fused_map" => Some(op),
            _ => None,
        })
        .collect();
    // the gain's chain (add_scalar, sqrt, inv, mul by the scale) and the batch norm's
    // (sub, mul, add, relu); `bn` is an output, so `d` and the product stay unfused
    assert_eq!(maps.len(), 2, "{chains:?}");
    assert_eq!(chains.iter().map(|c| c.replaced.len()).sum::<usize>(), 8);
    compiled_equals_eager_bit_for_bit(
        &c.graph,
        "fused_map: native_cpu.fused_map",
        &x,
        &leaves,
        &eager,
    );
}

/// A conv2d whose value only feeds its epilogue merges with it into one `conv2d_map` node:
/// a batch norm and ReLU (after elementwise fusion, one `fused_map`), a lone ReLU, a residual
/// sum of two convs (the first conv takes the sum, the other stays a side input); a conv whose
/// value is an output, or feeds a non-epilogue step (tanh), stays a conv2d. Compiled mode
/// (conv2d_map's capsule) gives eager mode's values bit for bit.
#[test]
fn convs_merge_with_their_epilogues_and_match_eager_bit_for_bit() {
    support::checked_cpu_default();
    use torchlean::graph::{Conv2dGeometry, Op};
    let g1 = Conv2dGeometry {
        padding: [1, 1],
        ..Conv2dGeometry::default()
    };
    let x = Tensor::randn(&[2, 3, 6, 6], 31).unwrap();
    let names = ["w1", "w2", "w3", "w4", "w5", "m", "s", "b"];
    let shapes: [&[usize]; 8] = [
        &[4, 3, 3, 3],
        &[4, 4, 3, 3],
        &[4, 4, 3, 3],
        &[4, 4, 3, 3],
        &[4, 4, 3, 3],
        &[4, 1, 1],
        &[4, 1, 1],
        &[4, 1, 1],
    ];
    let leaves: Vec<(String, Tensor)> = names
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (n, s))| (n.to_string(), Tensor::randn(s, 40 + i as u64).unwrap()))
        .collect();
    let p = |n: &str| leaves.iter().find(|(m, _)| m == n).unwrap().1.clone();
    let forward = |x: &Tensor, p: &dyn Fn(&str) -> Tensor| -> torchlean::Result<Vec<Tensor>> {
        let conv = |x: &Tensor, w: &str| x.apply(Op::Conv2d(g1), &[&p(w)]);
        // batch norm + relu
        let a = conv(x, "w1")?
            .sub(&p("m"))?
            .mul(&p("s"))?
            .add(&p("b"))?
            .relu()?;
        // a lone relu
        let r = conv(&a, "w2")?.relu()?;
        // a residual sum of two convs
        let sum = conv(&r, "w3")?.add(&conv(&r, "w4")?)?;
        // a conv feeding tanh (no epilogue step), and one whose value is an output
        let t = conv(&sum, "w5")?.tanh()?;
        let out = conv(&t, "w5")?;
        Ok(vec![t, out])
    };
    let eager = forward(&x, &p).unwrap();
    let c = capture(&[("x".into(), x.clone())], &leaves, |xs| {
        let out = forward(&xs[0], &p)?;
        Ok(vec![
            ("t".into(), out[0].clone()),
            ("out".into(), out[1].clone()),
        ])
    })
    .unwrap();
    let (chains, _) = torchlean::graph::fuse_elementwise(&c.graph).unwrap();
    let (fused, merged) = torchlean::graph::fuse_conv_epilogues(&chains).unwrap();
    fused.validate().unwrap();
    let count = |name: &str| {
        fused
            .nodes
            .iter()
            .filter(|n| matches!(&n.kind, NodeKind::Op { op } if op.kind().name() == name))
            .count()
    };
    assert_eq!(merged.len(), 3, "{merged:?}");
    assert_eq!(count("conv2d_map"), 3);
    assert_eq!(
        count("conv2d"),
        3,
        "w4 (a side of the residual sum), w5 twice"
    );
    compiled_equals_eager_bit_for_bit(
        &c.graph,
        "conv2d_map: native_cpu.conv2d_map",
        &x,
        &leaves,
        &eager,
    );
}

#[test]
fn training_graphs_keep_the_intermediates_their_backward_needs() {
    support::checked_cpu_default();
    let model = Mlp::new(&[3, 4, 1], Activation::Tanh, 3).unwrap();
    let x = Tensor::randn(&[2, 3], 4).unwrap();
    let y = Tensor::randn(&[2, 1], 5).unwrap();
    let mut c = capture(
        &[("x".into(), x), ("y".into(), y)],
        &named_params(&model),
        |xs| {
            Ok(vec![(
                "loss".into(),
                model.forward(&xs[0])?.tanh()?.exp()?.mse_loss(&xs[1])?,
            )])
        },
    )
    .unwrap();
    // forward only: tanh → exp fuses
    assert_eq!(
        torchlean::graph::fuse_elementwise(&c.graph)
            .unwrap()
            .1
            .len(),
        1
    );
    // with the backward graph, the vjp nodes read tanh's output: nothing fuses
    append_backward(&mut c.graph, "loss", None).unwrap();
    assert!(torchlean::graph::fuse_elementwise(&c.graph)
        .unwrap()
        .1
        .is_empty());
}

/// Batch `s` (16 rows) of `data` as a regression step's named inputs.
fn batch(data: &SyntheticRegression, s: usize) -> [(String, Tensor); 2] {
    let (x, y) = data.batch(s, 16).unwrap();
    [("x".to_string(), x), ("y".to_string(), y)]
}

/// The regression loss of the training-step tests.
fn mse(m: &dyn Module, xs: &[Tensor]) -> torchlean::Result<Tensor> {
    m.forward(&xs[0])?.mse_loss(&xs[1])
}

/// A training step of `model` on `data`'s batches in `mode`, under the default CPU profile.
fn regression_step(
    mode: torchlean::backend::ExecutionMode,
    model: &Mlp,
    data: &SyntheticRegression,
) -> torchlean::nn::train::TrainStep {
    torchlean::nn::train::TrainStep::new(
        mode,
        model,
        &batch(data, 0),
        &mse,
        &BackendProfile::default_cpu(),
    )
    .unwrap()
}

#[test]
fn compiled_steps_reuse_their_buffers_after_the_first() {
    support::checked_cpu_default();
    use torchlean::backend::ExecutionMode;
    let mut model = Mlp::new(&[4, 32, 32, 1], Activation::Tanh, 0).unwrap();
    let data = SyntheticRegression::new(256, 1).unwrap();
    let step = regression_step(ExecutionMode::Compiled, &model, &data);
    let mut opt = Adam::new(0.01).unwrap();
    step.run(&mut model, &mut opt, &batch(&data, 0), &mse)
        .unwrap();
    let first = step.compiled_graph().unwrap().pool_stats();
    assert!(first.allocated > 0 && first.recycled > 0, "{first:?}");
    for s in 1..6 {
        step.run(&mut model, &mut opt, &batch(&data, s), &mse)
            .unwrap();
    }
    let later = step.compiled_graph().unwrap().pool_stats();
    assert_eq!(
        later.allocated, first.allocated,
        "no new buffers after the first run: {later:?}"
    );
    assert!(later.reused >= 5 * first.allocated / 2, "{later:?}");
}

/// A compiled step's report covers the whole step: the compiled plan's kernels and the
/// optimizer's update, which runs eagerly outside the plan (`TrainStep::compiled_report`).
#[test]
fn the_compiled_step_report_lists_the_optimizer_update() {
    use torchlean::backend::ExecutionMode;
    let data = SyntheticRegression::new(64, 3).unwrap();
    let (capsules, executor) = std::thread::spawn(move || {
        torchlean::runtime::install(torchlean::runtime::Session::new(
            BackendProfile::default_cpu(),
        ))
        .unwrap();
        let mut model = Mlp::new(&[4, 8, 1], Activation::Tanh, 2).unwrap();
        let step = regression_step(ExecutionMode::Compiled, &model, &data);
        let mut opt = Adam::new(0.01).unwrap();
        step.run(&mut model, &mut opt, &batch(&data, 0), &mse)
            .unwrap();
        let report = step.compiled_report().unwrap();
        let capsules: Vec<String> = report.kernels.iter().map(|k| k.capsule.clone()).collect();
        (capsules, format!("{:?}", report.executor))
    })
    .join()
    .unwrap();
    assert!(
        capsules.iter().any(|c| c == "native_cpu.adam_step"),
        "{capsules:?}"
    );
    assert!(
        capsules.iter().any(|c| c.ends_with(".linear")),
        "{capsules:?}"
    );
    assert!(!executor.is_empty());
}

/// `run_queued` (no host read of the loss before the update) trains exactly as `run`, in both
/// modes: the same parameters, bit for bit, after several steps.
#[test]
fn queued_steps_update_the_parameters_exactly_as_read_steps() {
    support::checked_cpu_default();
    use torchlean::backend::ExecutionMode;
    let data = SyntheticRegression::new(256, 2).unwrap();
    for mode in [ExecutionMode::Eager, ExecutionMode::Compiled] {
        let trained = |queued: bool| -> Vec<Vec<f32>> {
            let mut model = Mlp::new(&[4, 16, 16, 1], Activation::Tanh, 5).unwrap();
            let step = regression_step(mode, &model, &data);
            let mut opt = Adam::new(0.01).unwrap();
            for s in 0..4 {
                let inputs = batch(&data, s);
                if queued {
                    step.run_queued(&mut model, &mut opt, &inputs, &mse)
                        .unwrap();
                } else {
                    step.run(&mut model, &mut opt, &inputs, &mse).unwrap();
                }
            }
            model
                .parameters()
                .iter()
                .map(|(_, p)| p.data().to_vec())
                .collect()
        };
        let (read, queued) = (trained(false), trained(true));
        let initial = Mlp::new(&[4, 16, 16, 1], Activation::Tanh, 5).unwrap();
        assert_ne!(
            initial.parameters()[0].1.data().to_vec(),
            read[0],
            "{mode:?}: the steps changed the parameters"
        );
        assert_eq!(read, queued, "{mode:?}");
    }
}

/// The quickstart MLP's training graph runs on the dense path (static buffers shared by
/// liveness), and its loss and gradients are bit-identical to the eager tape's, run after run.
#[test]
fn dense_path_matches_the_eager_tape_exactly_and_reuses_buffers() {
    support::checked_cpu_default();
    let model = Mlp::new(&[4, 16, 16, 1], Activation::Tanh, 7).unwrap();
    let params = named_params(&model);
    let (x, y) = (
        Tensor::randn(&[8, 4], 8).unwrap(),
        Tensor::randn(&[8, 1], 9).unwrap(),
    );
    let inputs = [("x".to_string(), x.clone()), ("y".to_string(), y.clone())];
    let step = CompiledStep::build(
        &inputs,
        &params,
        |xs| model.forward(&xs[0])?.mse_loss(&xs[1]),
        &BackendProfile::default_cpu(),
    )
    .unwrap();
    let graph = step.compiled();
    let buffers = graph.dense_buffers().expect("every node has dense kernels");
    let computed = graph
        .graph()
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, NodeKind::Op { .. } | NodeKind::Vjp { .. }))
        .count();
    assert!(
        buffers < computed,
        "{buffers} buffers for {computed} values"
    );
    let report = graph.report().to_text();
    assert!(report.contains("executor: dense"), "{report}");

    let eager_loss = model.forward(&x).unwrap().mse_loss(&y).unwrap();
    let eager_grads = eager_loss.backward().unwrap();
    let param_tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
    for _ in 0..3 {
        let (loss, grads) = step.run_ordered(&inputs, &param_tensors).unwrap();
        assert_eq!(loss.to_vec(), eager_loss.to_vec());
        for ((name, p), g) in params.iter().zip(&grads) {
            let g = g.as_ref().expect("every parameter has a gradient");
            assert_eq!(
                g.to_vec(),
                eager_grads.get(p).unwrap().to_vec(),
                "gradient of {name}"
            );
        }
        graph.give_back(grads.into_iter().flatten().chain([loss]));
    }
    // a graph with an op the native provider has no dense kernels for (reduce_sum) runs on
    // the general executor, and says which capsule kept it off the dense one
    let general = CompiledStep::build(
        &inputs,
        &params,
        |xs| model.forward(&xs[0])?.sum(&[0, 1], false),
        &BackendProfile::default_cpu(),
    )
    .unwrap();
    assert!(general.compiled().dense_buffers().is_none());
    let report = general.compiled().report().to_text();
    assert!(
        report.contains("executor: general") && report.contains("native_cpu.reduce_sum"),
        "{report}"
    );
}

/// A forward-only (inference) graph on the dense path: the activation's input dies there, so
/// it runs in place in that buffer; the output matches eager exactly, run after run.
#[test]
fn dense_inference_graph_runs_maps_in_place_and_matches_eager() {
    support::checked_cpu_default();
    let model = Mlp::new(&[4, 16, 16, 3], Activation::Tanh, 5).unwrap();
    let x = Tensor::randn(&[6, 4], 6).unwrap();
    let eager = model.forward(&x).unwrap().to_vec();
    let c = capture(&[("x".into(), x.clone())], &named_params(&model), |xs| {
        Ok(vec![("y".into(), model.forward(&xs[0])?)])
    })
    .unwrap();
    let compiled = CompiledGraph::compile(c.graph.clone(), &BackendProfile::default_cpu()).unwrap();
    // linear, tanh, linear, tanh, linear: each tanh's input dies there, so it runs in place
    let buffers = compiled.dense_buffers().expect("dense path");
    assert!(buffers <= 3, "{buffers} buffers");
    let report = compiled.report().to_text();
    assert!(report.contains("dense: 5 steps (2 in place)"), "{report}");
    let params = named_params(&model);
    for _ in 0..3 {
        let out = compiled
            .run(|n| {
                if n == "x" {
                    Some(x.clone())
                } else {
                    params.iter().find(|(p, _)| p == n).map(|(_, t)| t.clone())
                }
            })
            .unwrap();
        assert_eq!(out[0].1.to_vec(), eager);
    }
}

/// A classifier's training graph (cross-entropy: log_softmax, gather, reshape, sum_all, ...)
/// runs on the dense path, with loss and gradients bit-identical to the eager tape's.
#[test]
fn dense_cross_entropy_graph_matches_the_eager_tape_exactly() {
    support::checked_cpu_default();
    let model = Mlp::new(&[5, 12, 4], Activation::Relu, 3).unwrap();
    let params = named_params(&model);
    let x = Tensor::randn(&[9, 5], 4).unwrap();
    let y = Tensor::from_vec((0..9).map(|i| (i % 4) as f32).collect(), &[9]).unwrap();
    let inputs = [("x".to_string(), x.clone()), ("y".to_string(), y.clone())];
    let step = CompiledStep::build(
        &inputs,
        &params,
        |xs| model.forward(&xs[0])?.cross_entropy(&xs[1]),
        &BackendProfile::default_cpu(),
    )
    .unwrap();
    let report = step.compiled().report().to_text();
    assert!(report.contains("executor: dense"), "{report}");
    let eager_loss = model.forward(&x).unwrap().cross_entropy(&y).unwrap();
    let eager_grads = eager_loss.backward().unwrap();
    let param_tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
    let (loss, grads) = step.run_ordered(&inputs, &param_tensors).unwrap();
    assert_eq!(loss.to_vec(), eager_loss.to_vec());
    for ((name, p), g) in params.iter().zip(&grads) {
        assert_eq!(
            g.as_ref().expect("gradient").to_vec(),
            eager_grads.get(p).unwrap().to_vec(),
            "gradient of {name}"
        );
    }
}

/// A graph with binary maps (a residual add, a product) and values read twice (so the
/// backward graph adds cotangents) runs on the dense path and matches the eager tape.
#[test]
fn dense_residual_graph_matches_the_eager_tape() {
    support::checked_cpu_default();
    let model = Mlp::new(&[4, 8, 4], Activation::Tanh, 11).unwrap();
    let params = named_params(&model);
    let x = Tensor::randn(&[6, 4], 12).unwrap();
    let y = Tensor::randn(&[6, 4], 13).unwrap();
    let inputs = [("x".to_string(), x.clone()), ("y".to_string(), y.clone())];
    let loss_of = |m: &Mlp, x: &Tensor, y: &Tensor| -> torchlean::Result<Tensor> {
        let h = m.forward(x)?;
        h.add(x)?.mul(&h)?.mse_loss(y)
    };
    let step = CompiledStep::build(
        &inputs,
        &params,
        |xs| loss_of(&model, &xs[0], &xs[1]),
        &BackendProfile::default_cpu(),
    )
    .unwrap();
    let report = step.compiled().report().to_text();
    assert!(report.contains("executor: dense"), "{report}");
    let eager_loss = loss_of(&model, &x, &y).unwrap();
    let eager_grads = eager_loss.backward().unwrap();
    let param_tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
    let (loss, grads) = step.run_ordered(&inputs, &param_tensors).unwrap();
    assert_eq!(loss.to_vec(), eager_loss.to_vec());
    for ((name, p), g) in params.iter().zip(&grads) {
        let want = eager_grads.get(p).unwrap().to_vec();
        for (a, b) in g.as_ref().expect("gradient").to_vec().iter().zip(&want) {
            // cotangents that meet are added in node order here, tape order in eager
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{name}: {a} vs {b}"
            );
        }
    }
}

/// Model code that reads a traced value on the host (or cuts it from the tape) while a graph
/// is captured would freeze this run's data into the graph: every such access is refused,
/// naming the access, and untraced data (a mask built from constants) is still accepted.
#[test]
fn capture_refuses_host_reads_of_traced_values() {
    support::checked_cpu_default();
    use torchlean::Error;
    let x = Tensor::randn(&[2, 3], 7).unwrap();
    type Leak = fn(&Tensor) -> torchlean::Result<Tensor>;
    let leaks: [(&str, Leak); 7] = [
        ("to_vec", |t| Tensor::from_vec(t.to_vec(), &[2, 3])),
        ("data", |t| Tensor::from_vec(t.data().to_vec(), &[2, 3])),
        ("item", |t| {
            t.sum_all()?.item().and_then(|v| Tensor::full(&[2, 3], v))
        }),
        ("get", |t| Tensor::full(&[2, 3], t.get(&[0, 0])?)),
        ("detach", |t| t.relu()?.detach().add(t)),
        ("contiguous", |t| Ok(t.permute(&[1, 0])?.contiguous())),
        ("under no_grad", |t| {
            torchlean::runtime::no_grad(|| t.exp())?.add(t)
        }),
    ];
    for (access, leak) in leaks {
        let r = capture(&[("x".into(), x.clone())], &[], |xs| {
            Ok(vec![("y".into(), leak(&xs[0])?)])
        });
        match r {
            Err(e @ Error::CaptureLeak { .. }) => {
                assert!(e.to_string().contains(access), "{access}: {e}")
            }
            Err(e) => panic!("{access}: wrong error {e}"),
            Ok(_) => panic!("{access}: a host read of a traced value was captured"),
        }
    }
    // a constant built from data (not from a traced value) is fine, and so is reading
    // the inputs outside the capture
    let c = capture(&[("x".into(), x.clone())], &[], |xs| {
        let bias = Tensor::full(&[2, 3], 0.5)?;
        Ok(vec![("y".into(), xs[0].add(&bias)?)])
    })
    .unwrap();
    assert_eq!(c.values.len(), 1, "the bias became a named constant");
    assert_eq!(x.to_vec().len(), 6);
}

/// An embedding in a compiled graph reads each call's ids (they were once frozen into the
/// graph as the first batch's constant).
#[test]
fn compiled_embedding_reads_each_calls_ids() {
    support::checked_cpu_default();
    use torchlean::nn::Embedding;
    let emb = Embedding::new(10, 4, 3).unwrap();
    let params: Vec<(String, Tensor)> = emb
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let first = Tensor::from_vec(vec![1.0, 2.0, 3.0], &[1, 3]).unwrap();
    let c = capture(&[("ids".into(), first)], &params, |xs| {
        Ok(vec![("y".into(), emb.forward(&xs[0])?)])
    })
    .unwrap();
    let compiled = CompiledGraph::compile(c.graph, &BackendProfile::default_cpu()).unwrap();
    let second = Tensor::from_vec(vec![7.0, 0.0, 9.0], &[1, 3]).unwrap();
    let out = compiled
        .run(|n| {
            if n == "ids" {
                Some(second.clone())
            } else {
                params.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone())
            }
        })
        .unwrap();
    assert_eq!(out[0].1.to_vec(), emb.forward(&second).unwrap().to_vec());
}

/// The `grad.` namespace belongs to backward derivation: capture and `append_backward` refuse
/// user names in it (a parameter `grad.seed` was once silently replaced by 1.0), and
/// capture's constant names never collide with a parameter called `const.N`.
#[test]
fn generated_names_never_collide_with_user_names() {
    support::checked_cpu_default();
    use torchlean::graph::GraphError;
    let x = Tensor::randn(&[2, 2], 1).unwrap();
    let w = Tensor::randn(&[2, 2], 2).unwrap().requires_grad();
    let e = capture(
        &[("x".into(), x.clone())],
        &[("grad.seed".into(), w.clone())],
        |xs| Ok(vec![("y".into(), xs[0].mul(&w)?.sum_all()?)]),
    )
    .err()
    .expect("a reserved parameter name is refused");
    assert!(e.to_string().contains("reserved prefix"), "{e}");
    let c = capture(
        &[("x".into(), x.clone())],
        &[("const.1".into(), w.clone())],
        |xs| {
            let k = Tensor::full(&[2, 2], 3.0)?;
            Ok(vec![("loss".into(), xs[0].mul(&w)?.add(&k)?.sum_all()?)])
        },
    )
    .unwrap();
    let names: Vec<&str> = c.graph.parameters.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_ne!(names[0], names[1], "{names:?}");
    let mut g = c.graph.clone();
    g.inputs[0].name = "grad.x".into();
    assert!(matches!(
        append_backward(&mut g, "loss", None),
        Err(GraphError::ReservedName { .. })
    ));
}

/// A compiled plan's report lists every part a composite may run (planned and gated with
/// it); the report of what ran lists the parts its calls ran: a `torchlean.fused_map` over
/// exp, mul and tanh ran those three, not every element-wise map (a known gap of the
/// thirty-fourth session's audit). Runs on two threads at once log into one report.
#[test]
fn a_compiled_report_of_what_ran_names_the_parts_a_composite_ran() {
    use std::collections::BTreeSet;
    support::checked_cpu_default();
    let x = Tensor::randn(&[5, 3], 21).unwrap();
    let y = Tensor::randn(&[5, 3], 22).unwrap();
    let chain = |a: &Tensor, b: &Tensor| -> torchlean::Result<Tensor> { a.exp()?.mul(b)?.tanh() };
    let want = chain(&x, &y).unwrap().to_vec();
    let c = capture(
        &[("x".into(), x.clone()), ("y".into(), y.clone())],
        &[],
        |xs| Ok(vec![("z".into(), chain(&xs[0], &xs[1])?)]),
    )
    .unwrap();
    let prefer_composite =
        BackendProfile::resolve(None, Some("cpu"), Some("prefer:torchlean"), None).unwrap();
    let compiled = std::sync::Arc::new(CompiledGraph::compile(c.graph, &prefer_composite).unwrap());
    let parts_of = |r: &torchlean::backend::BackendReport| -> BTreeSet<String> {
        r.kernels
            .iter()
            .filter(|k| k.part_of.as_deref() == Some("torchlean.fused_map"))
            .map(|k| k.op.name().to_string())
            .collect()
    };
    let planned = parts_of(compiled.report());
    assert!(
        planned.contains("sin") && planned.contains("exp"),
        "{planned:?}"
    );
    assert!(
        parts_of(&compiled.ran_report()).is_empty(),
        "nothing ran yet"
    );
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (compiled, x, y) = (compiled.clone(), x.clone(), y.clone());
            std::thread::spawn(move || {
                compiled
                    .run(|n| Some(if n == "x" { x.clone() } else { y.clone() }))
                    .map(|o| o[0].1.to_vec())
            })
        })
        .collect();
    for r in runs {
        let got = r.join().unwrap().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
    let ran = compiled.ran_report();
    assert!(ran
        .kernels
        .iter()
        .any(|k| k.capsule == "torchlean.fused_map"));
    let want_parts: BTreeSet<String> = ["exp", "mul", "tanh"].map(String::from).into();
    assert_eq!(parts_of(&ran), want_parts);
    // each part row follows its composite's row
    let text = ran.to_text();
    let composite_at = text
        .find("fused_map: torchlean.fused_map")
        .expect("composite row");
    let part_at = text
        .find("(part of torchlean.fused_map) tanh:")
        .expect("part row");
    assert!(composite_at < part_at, "{text}");
}

/// A graph's own op keeps its row when a composite of the same graph lists the same capsule
/// as a part: `scale` after `mse_loss` (whose parts include `scale`) was reported only as a
/// part of the composite, in the plan and in the report of what ran.
#[test]
fn a_graphs_op_keeps_its_row_beside_a_composites_part_of_the_same_capsule() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[4, 3], 1).unwrap();
    let y = Tensor::randn(&[4, 3], 2).unwrap();
    let c = capture(
        &[("x".into(), x.clone()), ("y".into(), y.clone())],
        &[],
        |xs| Ok(vec![("loss".into(), xs[0].mse_loss(&xs[1])?.scale(2.0)?)]),
    )
    .unwrap();
    let profile =
        BackendProfile::resolve(None, Some("cpu"), Some("prefer:torchlean"), None).unwrap();
    let compiled = CompiledGraph::compile(c.graph, &profile).unwrap();
    compiled
        .run(|n| Some(if n == "x" { x.clone() } else { y.clone() }))
        .unwrap();
    for report in [compiled.report().clone(), compiled.ran_report()] {
        let scale: Vec<Option<&str>> = report
            .kernels
            .iter()
            .filter(|k| k.op == torchlean::OpKind::Scale)
            .map(|k| k.part_of.as_deref())
            .collect();
        assert!(
            scale.contains(&None),
            "no row of the graph's own scale: {scale:?}"
        );
        assert!(scale.contains(&Some("torchlean.mse_loss")), "{scale:?}");
    }
}

/// Every kernel a composite runs for its parts — forward, and the VJP that re-runs them on
/// the tape (whose gradient sums are `add`s) — is one of the parts it declares, so the plan
/// that gates the declared parts gated whatever runs (`mse_loss` ran an undeclared `add`).
/// Eager, under `prefer:torchlean`, with a boolean mask, causal attention and an additive
/// bias.
#[test]
fn composites_run_only_the_parts_they_declare() {
    use torchlean::graph::{AttentionMask, OpKind};
    use torchlean::providers::composition;
    let profile =
        BackendProfile::resolve(None, Some("cpu"), Some("prefer:torchlean"), None).unwrap();
    torchlean::runtime::install(torchlean::runtime::Session::new(profile)).unwrap();
    let run = || -> torchlean::Result<()> {
        let x = Tensor::randn(&[3, 4], 1)?.requires_grad();
        let y = Tensor::randn(&[3, 4], 2)?;
        x.mse_loss(&y)?.backward()?;
        let (q, k, v) = (
            Tensor::randn(&[2, 3, 5, 4], 3)?.requires_grad(),
            Tensor::randn(&[2, 3, 6, 4], 4)?.requires_grad(),
            Tensor::randn(&[2, 3, 6, 4], 5)?.requires_grad(),
        );
        let keep = Tensor::from_fn(&[5, 6], |i| ((i * 7) % 3 != 0) as u8 as f32)?;
        let bias = Tensor::randn(&[5, 6], 6)?.requires_grad();
        for (mask, causal) in [
            (None, false),
            (Some((&keep, AttentionMask::Boolean)), true),
            (Some((&bias, AttentionMask::AdditiveBias)), false),
        ] {
            q.scaled_dot_product_attention(&k, &v, mask, causal, None)?
                .sum_all()?
                .backward()?;
        }
        Ok(())
    };
    let result = run();
    let report = torchlean::runtime::take().unwrap().unwrap().report();
    result.unwrap();
    let mut seen = 0;
    for row in &report.kernels {
        let Some(composite) = &row.part_of else {
            continue;
        };
        let of = report
            .kernels
            .iter()
            .find(|k| &k.capsule == composite && k.part_of.is_none())
            .unwrap_or_else(|| panic!("no row for the composite {composite}"));
        assert!(
            composition::parts(of.op).contains(&row.op),
            "{composite} ran `{}`, which it does not declare ({:?})",
            row.op.name(),
            composition::parts(of.op)
        );
        seen += 1;
    }
    let composites: Vec<OpKind> = report
        .kernels
        .iter()
        .filter(|k| k.capsule.starts_with("torchlean."))
        .map(|k| k.op)
        .collect();
    assert!(
        composites.contains(&OpKind::MseLoss)
            && composites.contains(&OpKind::ScaledDotProductAttention)
            && seen > 10,
        "{composites:?}, {seen} part rows"
    );
}

/// A composite kernel's parts are planned and gated under the compiled plan's profile before
/// any kernel runs, reported as rows nested under it, and run under that profile whatever
/// session the running thread has (they once ran under the thread's session).
#[test]
fn composite_parts_are_planned_gated_reported_and_run_under_the_plan() {
    use std::sync::Arc;
    use torchlean::backend::{BackendProfile, Registry};
    use torchlean::providers::{composition, native_cpu};
    support::checked_cpu_default();
    let x = Tensor::randn(&[4, 3], 1).unwrap();
    let y = Tensor::randn(&[4, 3], 2).unwrap();
    let c = capture(
        &[("x".into(), x.clone()), ("y".into(), y.clone())],
        &[],
        |xs| Ok(vec![("loss".into(), xs[0].tanh()?.mse_loss(&xs[1])?)]),
    )
    .unwrap();
    let prefer_composite =
        BackendProfile::resolve(None, Some("cpu"), Some("prefer:torchlean"), None).unwrap();
    let compiled = CompiledGraph::compile(c.graph.clone(), &prefer_composite).unwrap();
    let report = compiled.report();
    assert!(report
        .kernels
        .iter()
        .any(|k| k.capsule == "torchlean.mse_loss"));
    let parts: Vec<&str> = report
        .kernels
        .iter()
        .filter(|k| k.part_of.as_deref() == Some("torchlean.mse_loss"))
        .map(|k| k.op.name())
        .collect();
    for p in ["sub", "mul", "sum_all", "scale"] {
        assert!(parts.contains(&p), "part {p} missing from {parts:?}");
    }
    assert!(report
        .to_text()
        .contains("(part of torchlean.mse_loss) sub:"));
    // run on a thread whose session could plan none of the parts (cuda is not available)
    let want = x.tanh().unwrap().mse_loss(&y).unwrap().to_vec();
    let got = std::thread::spawn(move || {
        torchlean::runtime::install(torchlean::runtime::Session::new(
            BackendProfile::named("checked_cuda").unwrap(),
        ))
        .unwrap();
        let out = compiled
            .run(|n| {
                if n == "x" {
                    Some(x.clone())
                } else {
                    Some(y.clone())
                }
            })
            .map(|o| o[0].1.to_vec());
        // the thread's own session is back afterwards
        assert_eq!(
            torchlean::runtime::with_current(|s| s.profile().name.clone()).unwrap(),
            "checked_cuda"
        );
        out
    })
    .join()
    .unwrap()
    .unwrap();
    assert!((got[0] - want[0]).abs() <= 1e-6 * want[0].abs().max(1.0));
    // a part with no admissible capsule refuses the plan at compile time
    let mut r = Registry::new();
    for &op in torchlean::OpKind::ALL {
        if op != torchlean::OpKind::Sub {
            r.register(native_cpu::capsule(op), native_cpu::binding_for(op))
                .unwrap();
        }
    }
    for &op in composition::OPS {
        r.register(composition::capsule(op), composition::binding())
            .unwrap();
    }
    match CompiledGraph::compile_with_registry(c.graph, &prefer_composite, &Arc::new(r)) {
        Err(torchlean::runtime::compiled::CompileError::Planning(errors)) => {
            assert!(
                errors.iter().any(|e| e.op == torchlean::OpKind::Sub),
                "{errors:?}"
            )
        }
        other => panic!(
            "expected a planning error for the part, got {:?}",
            other.err()
        ),
    }
}

/// On the host, asking a compiled step for device-graph replay changes nothing: the step
/// runs kernel by kernel, outputs held across steps stay valid (they are never rewritten),
/// and the report says nothing about a device graph.
#[test]
fn device_graph_replay_is_inert_on_the_host() {
    support::checked_cpu_default();
    let model = Mlp::new(&[4, 8, 1], Activation::Tanh, 1).unwrap();
    let data = SyntheticRegression::new(64, 3).unwrap();
    let named = |s: usize| {
        let (x, y) = data.batch(s, 8).unwrap();
        [("x".to_string(), x), ("y".to_string(), y)]
    };
    let profile = BackendProfile::default_cpu();
    let m = &model;
    let plain = CompiledStep::build(
        &named(0),
        &named_params(m),
        |xs| m.forward(&xs[0])?.mse_loss(&xs[1]),
        &profile,
    )
    .unwrap();
    let mut asked = CompiledStep::build(
        &named(0),
        &named_params(m),
        |xs| m.forward(&xs[0])?.mse_loss(&xs[1]),
        &profile,
    )
    .unwrap();
    asked.replay_as_device_graph();
    let mut held = vec![];
    for s in 0..4 {
        let (a, _) = plain
            .run_visiting(&named(s), |f| model.visit_parameters(f))
            .unwrap();
        let (b, _) = asked
            .run_visiting(&named(s), |f| model.visit_parameters(f))
            .unwrap();
        assert_eq!(a.to_vec(), b.to_vec(), "step {s}");
        held.push((s, b));
    }
    // every held loss still has its own step's value
    for (s, b) in &held {
        let (a, _) = plain
            .run_visiting(&named(*s), |f| model.visit_parameters(f))
            .unwrap();
        assert_eq!(a.to_vec(), b.to_vec(), "held loss of step {s}");
    }
    assert!(!asked.replays_device_graph());
    let text = asked.report().to_text();
    assert!(!text.contains("device graph"), "{text}");
}
