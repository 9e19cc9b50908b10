//! An independent ONNX engine (tract) runs the same fixture files; torchlean's outputs of the
//! imported graphs agree with it.

mod common;

use common::*;
use torchlean::backend::BackendProfile;

#[test]
fn tract_and_torchlean_agree_on_the_pytorch_fixtures() {
    // tract 0.23 cannot analyse `masked`'s IsInf(Cast(x, to=DOUBLE)) → Or (PyTorch's export of
    // `torch.isinf`: "no super type for Bool and F64") and has no SoftmaxCrossEntropyLoss
    // (`extras`); onnxruntime runs both, and tests/pytorch_fixtures.rs holds them to
    // PyTorch's own values. tract's RNN computes tanh whatever `activations` says, and `elman`
    // has relu layers: tests/lowered_forms.rs checks a tanh RNN against tract. tract 0.23
    // cannot analyse `indexing`'s CumSum of a ConstantOfShape ("Failed analyse for node
    // /net/CumSum"); onnxruntime runs it (checked when the fixture was made)
    for model in FIXTURES
        .iter()
        .filter(|m| !matches!(**m, "masked" | "extras" | "elman" | "indexing"))
    {
        let path = fixture(&format!("{model}.onnx"));
        let inputs = load_values(&format!("{model}.inputs.safetensors"));
        let theirs = tract_run(&path, &inputs);
        let (graph, values) = import_fixture(model);
        let names: Vec<String> = graph.outputs.iter().map(|o| o.name.clone()).collect();
        let ours = run_graph(
            graph,
            &values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap();
        for (name, t) in names.iter().zip(&theirs) {
            assert_close(&format!("{model}: {name}"), &ours[name].to_vec(), t, 2e-5);
        }
    }
}

/// The GRU variants the PyTorch fixture does not exercise (`linear_before_reset=0`,
/// `layout=1`, an initial state, no bias), built by hand and run by tract and by torchlean.
#[test]
fn gru_variants_agree_with_tract() {
    use onnx_protobuf::{
        attribute_proto::AttributeType, AttributeProto, GraphProto, Message, ModelProto, NodeProto,
        OperatorSetIdProto, TensorProto,
    };
    fn weights(name: &str, dims: &[usize], seed: usize) -> TensorProto {
        let n: usize = dims.iter().product();
        let mut t = TensorProto::new();
        t.name = name.into();
        t.dims = dims.iter().map(|&d| d as i64).collect();
        t.data_type = 1;
        t.float_data = (0..n)
            .map(|i| (((i * 37 + seed * 101) % 23) as f32 - 11.0) / 20.0)
            .collect();
        t
    }
    fn int_attr(name: &str, v: i64) -> AttributeProto {
        let mut a = AttributeProto::new();
        a.name = name.into();
        a.type_ = AttributeType::INT.into();
        a.i = v;
        a
    }
    let (steps, batch, input, hidden) = (5, 3, 4, 6);
    for (before_reset, layout, with_bias, with_h0) in
        [(0, 0, true, false), (1, 1, true, true), (0, 1, false, true)]
    {
        let x_dims = if layout == 0 {
            [steps, batch, input]
        } else {
            [batch, steps, input]
        };
        let h_dims = if layout == 0 {
            [1, batch, hidden]
        } else {
            [batch, 1, hidden]
        };
        let y_dims = if layout == 0 {
            vec![steps, 1, batch, hidden]
        } else {
            vec![batch, steps, 1, hidden]
        };
        let mut node = NodeProto::new();
        node.op_type = "GRU".into();
        node.name = "gru".into();
        node.input = vec![
            "x".into(),
            "w".into(),
            "r".into(),
            if with_bias { "b".into() } else { String::new() },
            String::new(),
            if with_h0 { "h0".into() } else { String::new() },
        ];
        node.output = vec!["y".into(), "y_h".into()];
        node.attribute = vec![
            int_attr("hidden_size", hidden as i64),
            int_attr("linear_before_reset", before_reset),
            int_attr("layout", layout),
        ];
        let mut g = GraphProto::new();
        g.node = vec![node];
        g.initializer = vec![
            weights("w", &[1, 3 * hidden, input], 1),
            weights("r", &[1, 3 * hidden, hidden], 2),
        ];
        if with_bias {
            g.initializer.push(weights("b", &[1, 6 * hidden], 3));
        }
        g.input = vec![torchlean_onnx::export::value_info("x", &x_dims)];
        if with_h0 {
            g.input
                .push(torchlean_onnx::export::value_info("h0", &h_dims));
        }
        g.output = vec![
            torchlean_onnx::export::value_info("y", &y_dims),
            torchlean_onnx::export::value_info("y_h", &h_dims),
        ];
        let mut m = ModelProto::new();
        m.ir_version = 8;
        let mut o = OperatorSetIdProto::new();
        o.version = 14;
        m.opset_import.push(o);
        m.graph = Some(g).into();
        let bytes = m.write_to_bytes().unwrap();
        let path = std::env::temp_dir().join(format!(
            "torchlean-gru-{before_reset}-{layout}-{with_bias}-{with_h0}-{}.onnx",
            std::process::id()
        ));
        std::fs::write(&path, &bytes).unwrap();
        let mut inputs = vec![(
            "x".to_string(),
            torchlean::Tensor::uniform(&x_dims, -1.0, 1.0, 11).unwrap(),
        )];
        if with_h0 {
            inputs.push((
                "h0".to_string(),
                torchlean::Tensor::uniform(&h_dims, -1.0, 1.0, 12).unwrap(),
            ));
        }
        let theirs = tract_run(&path, &inputs);
        let _ = std::fs::remove_file(&path);
        let imported =
            torchlean_onnx::import_model(&m, "gru", &std::collections::HashMap::new()).unwrap();
        let ours = run_graph(
            imported.graph,
            &imported.values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap();
        let what = format!(
            "GRU linear_before_reset={before_reset} layout={layout} bias={with_bias} h0={with_h0}"
        );
        assert_close(&format!("{what}: y"), &ours["y"].to_vec(), &theirs[0], 1e-5);
        assert_close(
            &format!("{what}: y_h"),
            &ours["y_h"].to_vec(),
            &theirs[1],
            1e-5,
        );
    }
}

/// The Erf forms of GELU that exporters write (scaling by Div or Mul, the halving on the
/// sum, on x or on the product, operands in either order) import as torchlean's `gelu`
/// and agree with tract's evaluation of the same nodes; a near miss keeps its `Erf` and is
/// refused.
#[test]
fn erf_gelu_forms_import_as_gelu() {
    use onnx_protobuf::{
        GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    };
    fn scalar(name: &str, v: f32) -> TensorProto {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 1;
        t.float_data = vec![v];
        t
    }
    fn node(op: &str, inputs: &[&str], out: &str) -> NodeProto {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = out.into();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = vec![out.into()];
        n
    }
    let sqrt2 = std::f32::consts::SQRT_2;
    let forms: Vec<(&str, f32, Vec<NodeProto>)> = vec![
        (
            "div, 0.5 on the sum",
            sqrt2,
            vec![
                node("Div", &["x", "k"], "s"),
                node("Erf", &["s"], "e"),
                node("Add", &["e", "one"], "p"),
                node("Mul", &["half", "p"], "h"),
                node("Mul", &["x", "h"], "y"),
            ],
        ),
        (
            "mul by 1/sqrt2, 0.5 on x",
            1.0 / sqrt2,
            vec![
                node("Mul", &["k", "x"], "s"),
                node("Erf", &["s"], "e"),
                node("Add", &["one", "e"], "p"),
                node("Mul", &["x", "half"], "h"),
                node("Mul", &["h", "p"], "y"),
            ],
        ),
        (
            "0.5 on the product",
            sqrt2,
            vec![
                node("Div", &["x", "k"], "s"),
                node("Erf", &["s"], "e"),
                node("Add", &["e", "one"], "p"),
                node("Mul", &["x", "p"], "h"),
                node("Mul", &["h", "half"], "y"),
            ],
        ),
        (
            "near miss: 0.25 instead of 0.5",
            sqrt2,
            vec![
                node("Div", &["x", "k"], "s"),
                node("Erf", &["s"], "e"),
                node("Add", &["e", "one"], "p"),
                node("Mul", &["x", "p"], "h"),
                node("Mul", &["h", "quarter"], "y"),
            ],
        ),
    ];
    // each form as written, then with one constant of a higher rank than x's (one element:
    // ONNX broadcasting gives the result that rank, [1, 3, 7]; the fused GELU gave [3, 7])
    let raised: Vec<_> = forms
        .iter()
        .filter(|(what, ..)| !what.starts_with("near miss"))
        .flat_map(|f| [("k", 3), ("one", 3), ("half", 4)].map(|r| (f.clone(), Some(r))))
        .collect();
    let forms = forms.into_iter().map(|f| (f, None)).chain(raised);
    let x = torchlean::Tensor::uniform(&[3, 7], -4.0, 4.0, 9).unwrap();
    for ((what, k, nodes), raise) in forms {
        let what = &match raise {
            Some((name, rank)) => format!("{what}, `{name}` of rank {rank}"),
            None => what.to_string(),
        };
        let mut g = GraphProto::new();
        g.node = nodes;
        g.initializer = vec![
            scalar("k", k),
            scalar("one", 1.0),
            scalar("half", 0.5),
            scalar("quarter", 0.25),
        ];
        let mut y_dims = vec![3, 7];
        if let Some((name, rank)) = raise {
            for t in g.initializer.iter_mut().filter(|t| t.name == name) {
                t.dims = vec![1; rank];
            }
            y_dims = [vec![1; rank - 2], y_dims].concat();
        }
        g.input = vec![torchlean_onnx::export::value_info("x", &[3, 7])];
        g.output = vec![torchlean_onnx::export::value_info("y", &y_dims)];
        let mut m = ModelProto::new();
        m.ir_version = 8;
        let mut o = OperatorSetIdProto::new();
        o.version = 17;
        m.opset_import.push(o);
        m.graph = Some(g).into();
        let imported = torchlean_onnx::import_model(&m, what, &Default::default());
        let imported = imported.unwrap_or_else(|e| panic!("{what}: {e}"));
        let has =
            |op: torchlean::Op| {
                imported.graph.nodes.iter().any(
                    |n| matches!(&n.kind, torchlean::graph::NodeKind::Op { op: o } if *o == op),
                )
            };
        // a near miss is not the GELU: its nodes stay, the Erf as torchlean's `erf` (it was
        // refused before the forty-seventh session), and it computes the same as tract
        let near_miss = what.starts_with("near miss");
        assert_eq!(has(torchlean::Op::Gelu), !near_miss, "{what}: gelu node");
        assert_eq!(has(torchlean::Op::Erf), near_miss, "{what}: erf node");
        let path = std::env::temp_dir().join(format!(
            "torchlean-gelu-{}-{}.onnx",
            what.len(),
            std::process::id()
        ));
        std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
        let inputs = vec![("x".to_string(), x.clone())];
        let theirs = tract_run(&path, &inputs);
        let _ = std::fs::remove_file(&path);
        let ours = run_graph(
            imported.graph,
            &imported.values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap();
        assert_eq!(ours["y"].shape(), &y_dims[..], "{what}");
        // the near miss's erf: both sides' approximations (tract's about 5e-7, the native
        // kernel's about 3e-7) times |x| <= 4
        let tol = if near_miss { 5e-6 } else { 1e-6 };
        assert_close(what, &ours["y"].to_vec(), &theirs[0], tol);
    }
}
