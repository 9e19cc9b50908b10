//! torchlean graphs exported as ONNX: tract (an independent engine) loads them and computes
//! the same outputs as torchlean, and importing an exported model gives the same outputs
//! again (import ∘ export).

mod common;

use common::*;
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::nn::{Activation, Mlp, Module, TransformerConfig, TransformerEncoder};
use torchlean::runtime::capture::capture;
use torchlean::Tensor;
use tract_onnx::prelude::*;

/// A captured forward graph, its parameter values and its example inputs.
type Captured = (
    torchlean::graph::Graph,
    Vec<(String, Tensor)>,
    Vec<(String, Tensor)>,
);

fn captured(model: &dyn Module, x: Tensor) -> Captured {
    torchlean::runtime::install(torchlean::runtime::Session::new(
        BackendProfile::default_cpu(),
    ))
    .unwrap();
    let params: Vec<(String, Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let inputs = vec![("x".to_string(), x)];
    let c = capture(&inputs, &params, |xs| {
        Ok(vec![("y".into(), model.forward(&xs[0])?)])
    })
    .unwrap();
    (c.graph, c.values, inputs)
}

fn tract_outputs(bytes: &[u8], x: &Tensor) -> Vec<f32> {
    let model = tract_onnx::onnx()
        .model_for_read(&mut &bytes[..])
        .expect("tract reads the export");
    let plan = model.into_optimized().unwrap().into_runnable().unwrap();
    let a = tract_ndarray::ArrayD::from_shape_vec(x.shape().to_vec(), x.to_vec()).unwrap();
    let out = plan
        .run(tvec!(tract_onnx::prelude::Tensor::from(a).into()))
        .unwrap();
    out[0]
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

#[test]
fn exported_example_models_run_in_tract_and_survive_import() {
    let config = TransformerConfig {
        embed_dim: 32,
        heads: 4,
        ff_dim: 64,
        dropout: 0.0,
        causal: true,
    };
    let models: Vec<(&str, Box<dyn Module>, Tensor)> = vec![
        (
            "mlp",
            Box::new(Mlp::new(&[5, 16, 16, 3], Activation::Tanh, 1).unwrap()),
            Tensor::uniform(&[4, 5], -1.0, 1.0, 2).unwrap(),
        ),
        (
            "cnn",
            Box::new(torchlean::nn::models::small_cnn(1, 8, 4, 8, 3).unwrap()),
            Tensor::uniform(&[2, 1, 8, 8], -1.0, 1.0, 4).unwrap(),
        ),
        (
            "transformer",
            Box::new(TransformerEncoder::new(config, 2, true, 5).unwrap()),
            Tensor::uniform(&[2, 16, 32], -1.0, 1.0, 6).unwrap(),
        ),
    ];
    for (name, model, x) in models {
        let (graph, values, inputs) = captured(model.as_ref(), x.clone());
        let ours = run_graph(
            graph.clone(),
            &values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap()["y"]
            .to_vec();
        let onnx = torchlean_onnx::export_model(&graph, &values).unwrap();
        let bytes = torchlean_onnx::model::encode_model(&onnx).unwrap();
        assert_close(
            &format!("{name}: tract on the export"),
            &tract_outputs(&bytes, &x),
            &ours,
            1e-5,
        );
        let decoded = torchlean_onnx::decode_model(&bytes, name).unwrap();
        let back = torchlean_onnx::import_model(&decoded, name, &HashMap::new()).unwrap();
        let again = run_graph(
            back.graph,
            &back.values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap()["y"]
            .to_vec();
        assert_close(
            &format!("{name}: import of the export"),
            &again,
            &ours,
            1e-5,
        );
    }
}

#[test]
fn ops_without_an_onnx_counterpart_are_refused_by_name() {
    let mut g = torchlean::graph::Graph::new();
    g.inputs.push(torchlean::graph::ValueDecl {
        name: "x".into(),
        shape: vec![4],
    });
    let x = g
        .push(
            torchlean::graph::NodeKind::Input { name: "x".into() },
            vec![],
        )
        .unwrap();
    let n = g
        .push(
            torchlean::graph::NodeKind::Op {
                op: torchlean::Op::BernoulliMask {
                    shape: vec![4],
                    keep: 0.5,
                    seed: 1,
                },
            },
            vec![],
        )
        .unwrap();
    let y = g
        .push(
            torchlean::graph::NodeKind::Op {
                op: torchlean::Op::Mul,
            },
            vec![x, n],
        )
        .unwrap();
    g.outputs.push(torchlean::graph::OutputDecl {
        name: "y".into(),
        node: y,
    });
    let e = torchlean_onnx::export_model(&g, &[])
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("bernoulli_mask") && e.contains("random source"),
        "{e}"
    );
}

/// `export_refusal` (what a caller checks from a model's op kinds before running anything:
/// the training commands' `--export`) names exactly the kinds `export_model` refuses, with
/// the same reason: a one-op graph of every kind of the vocabulary is exported.
#[test]
fn export_refusal_names_exactly_the_kinds_export_refuses() {
    let mut checked = 0;
    let mut refused = Vec::new();
    for &kind in torchlean::OpKind::ALL {
        let Some(g) = torchlean::fuzz::sample_graph(kind) else {
            continue;
        };
        let values: Vec<(String, Tensor)> = g
            .parameters
            .iter()
            .map(|d| (d.name.clone(), Tensor::full(&d.shape, 0.5).unwrap()))
            .collect();
        let got = torchlean_onnx::export_model(&g, &values);
        match (torchlean_onnx::export_refusal(kind), got) {
            (None, Ok(_)) => {}
            (Some(why), Err(e)) => {
                let e = e.to_string();
                assert!(e.contains(why) && e.contains(kind.name()), "{kind:?}: {e}");
                refused.push(kind);
            }
            (None, Err(e)) => panic!("{kind:?}: export refused it ({e}), export_refusal did not"),
            (Some(why), Ok(_)) => panic!("{kind:?}: export_refusal says `{why}`, export wrote it"),
        }
        checked += 1;
    }
    assert!(checked >= 50, "only {checked} kinds had a sample graph");
    assert!(
        refused.contains(&torchlean::OpKind::SpectralConv1d),
        "{refused:?}"
    );
}

/// Every PyTorch fixture imported, exported and imported again computes the same outputs
/// (the attention fixture's causal mask, dropped for the causal flag on the first import,
/// and its exported constants named like the import's own, included).
#[test]
fn imported_pytorch_fixtures_survive_export_and_import() {
    for model in FIXTURES {
        let (graph, values) = import_fixture(model);
        let inputs = load_values(&format!("{model}.inputs.safetensors"));
        let p = BackendProfile::default_cpu();
        let first = run_graph(graph.clone(), &values, &inputs, &p, false)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
        let onnx = torchlean_onnx::export_model(&graph, &values)
            .unwrap_or_else(|e| panic!("{model}: export: {e}"));
        let bytes = torchlean_onnx::model::encode_model(&onnx).unwrap();
        let decoded = torchlean_onnx::decode_model(&bytes, model).unwrap();
        let back = torchlean_onnx::import_model(&decoded, model, &HashMap::new())
            .unwrap_or_else(|e| panic!("{model}: import of the export: {e}"));
        let again = run_graph(back.graph, &back.values, &inputs, &p, false)
            .unwrap_or_else(|e| panic!("{model}: run of the re-import: {e}"));
        for (name, want) in &first {
            let got = again
                .get(name)
                .unwrap_or_else(|| panic!("{model}: the re-import lacks `{name}`"));
            assert_close(
                &format!("{model}: {name} after export and import"),
                &got.to_vec(),
                &want.to_vec(),
                1e-5,
            );
        }
    }
}

/// `gather` (torch.gather) exports as ONNX `GatherElements`, which the import did not read:
/// a graph with it did not survive export and import. Now the import maps `GatherElements`
/// to `gather` — run-time integer indices as they are, constant ones with negative indices
/// counted from the end (ONNX) — checked against `out[i][j] = x[i][idx[i][j]]` computed here.
#[test]
fn gather_survives_export_and_import_and_negative_constant_indices_count_from_the_end() {
    use torchlean::graph::{Graph, NodeKind, OutputDecl, ValueDecl};
    torchlean::runtime::install(torchlean::runtime::Session::new(
        BackendProfile::default_cpu(),
    ))
    .ok();
    let x: Vec<f32> = (0..12).map(|v| v as f32 * 0.5 - 2.0).collect();
    let idx: Vec<f32> = vec![3.0, 0.0, 1.0, 1.0, 2.0, 0.0];
    let expect = |idx: &[i64]| -> Vec<f32> {
        (0..3)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| x[i * 4 + idx[i * 2 + j].rem_euclid(4) as usize])
            .collect()
    };
    // torchlean graph → ONNX → torchlean graph
    let mut g = Graph::new();
    for (name, shape) in [("x", vec![3, 4]), ("idx", vec![3, 2])] {
        g.inputs.push(ValueDecl {
            name: name.into(),
            shape,
        });
    }
    let xn = g
        .push(NodeKind::Input { name: "x".into() }, vec![])
        .unwrap();
    let ix = g
        .push(NodeKind::Input { name: "idx".into() }, vec![])
        .unwrap();
    let y = g
        .push(
            NodeKind::Op {
                op: torchlean::Op::Gather { axis: 1 },
            },
            vec![xn, ix],
        )
        .unwrap();
    g.outputs.push(OutputDecl {
        name: "y".into(),
        node: y,
    });
    let inputs = vec![
        (
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[3, 4]).unwrap(),
        ),
        (
            "idx".to_string(),
            Tensor::from_vec(idx.clone(), &[3, 2]).unwrap(),
        ),
    ];
    let profile = BackendProfile::default_cpu();
    let ours = run_graph(g.clone(), &[], &inputs, &profile, false).unwrap()["y"].to_vec();
    let want = expect(&idx.iter().map(|&v| v as i64).collect::<Vec<_>>());
    assert_eq!(ours, want);
    let bytes =
        torchlean_onnx::model::encode_model(&torchlean_onnx::export_model(&g, &[]).unwrap())
            .unwrap();
    let decoded = torchlean_onnx::decode_model(&bytes, "gather").unwrap();
    let back = torchlean_onnx::import_model(&decoded, "gather", &HashMap::new()).unwrap();
    let again =
        run_graph(back.graph, &back.values, &inputs, &profile, false).unwrap()["y"].to_vec();
    assert_eq!(again, want, "import of the export");
    // constant indices with negative entries (ONNX: counted from the end)
    let neg: Vec<i64> = vec![-1, 0, 1, -3, 2, -4];
    let m = model(
        vec![with_int(
            node("g", "GatherElements", &["x", "i"], &["y"]),
            "axis",
            1,
        )],
        vec![ints("i", &[3, 2], &neg)],
        vec![value_info("x", &[3, 4], 1)],
        vec![value_info("y", &[3, 2], 1)],
        13,
    );
    let imported = torchlean_onnx::import_model(&m, "neg", &HashMap::new()).unwrap();
    let got = run_graph(
        imported.graph,
        &imported.values,
        &inputs[..1],
        &profile,
        false,
    )
    .unwrap()["y"]
        .to_vec();
    assert_eq!(got, expect(&neg));
}

/// The exporter's generated names (`const_N`, `ints_N`, `mul_N`, …) avoid the graph's own:
/// a parameter named `const_1` made two initializers of one name (the checker refuses the
/// file; onnxruntime silently used the last). Every value is named once, and tract computes
/// what torchlean computes.
#[test]
fn generated_names_avoid_the_graphs_own_names() {
    use torchlean::graph::{Graph, NodeKind, OutputDecl, ValueDecl};
    torchlean::runtime::install(torchlean::runtime::Session::new(
        BackendProfile::default_cpu(),
    ))
    .ok();
    let mut g = Graph::new();
    g.inputs.push(ValueDecl {
        name: "x".into(),
        shape: vec![2],
    });
    let x = g
        .push(NodeKind::Input { name: "x".into() }, vec![])
        .unwrap();
    let mut values = vec![];
    let mut y = x;
    for k in 1..=4 {
        let name = format!("const_{k}");
        g.parameters.push(ValueDecl {
            name: name.clone(),
            shape: vec![2],
        });
        values.push((
            name.clone(),
            Tensor::from_vec(vec![k as f32, -0.5], &[2]).unwrap(),
        ));
        let p = g.push(NodeKind::Parameter { name }, vec![]).unwrap();
        let m = g
            .push(
                NodeKind::Op {
                    op: torchlean::Op::Mul,
                },
                vec![y, p],
            )
            .unwrap();
        y = g
            .push(
                NodeKind::Op {
                    op: torchlean::Op::Scale { factor: 1.5 },
                },
                vec![m],
            )
            .unwrap();
    }
    g.outputs.push(OutputDecl {
        name: "mul_1".into(),
        node: y,
    });
    let model = torchlean_onnx::export_model(&g, &values).unwrap();
    let graph = model.graph.as_ref().unwrap();
    let mut seen = std::collections::HashSet::new();
    let defined = graph
        .input
        .iter()
        .map(|i| i.name.clone())
        .chain(graph.initializer.iter().map(|t| t.name.clone()))
        .chain(graph.node.iter().flat_map(|n| n.output.clone()));
    for name in defined {
        assert!(seen.insert(name.clone()), "`{name}` is defined twice");
    }
    let x = Tensor::from_vec(vec![0.25, 2.0], &[2]).unwrap();
    let inputs = vec![("x".to_string(), x.clone())];
    let ours = run_graph(g, &values, &inputs, &BackendProfile::default_cpu(), false).unwrap()
        ["mul_1"]
        .to_vec();
    let bytes = torchlean_onnx::model::encode_model(&model).unwrap();
    assert_close("tract", &tract_outputs(&bytes, &x), &ours, 1e-6);
}
