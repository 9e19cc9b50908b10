//! The importer's attention pattern (`import/attention.rs`): `MatMul(Mul(q, s), Mul(kᵀ, s))`,
//! an additive mask, `Softmax` and `MatMul` with v become one `scaled_dot_product_attention`
//! node, which computes what the nodes compute; a pattern whose intermediate value is read
//! elsewhere stays node by node. The reference is the same model imported node by node (the
//! softmax also a graph output, so nothing is absorbed), whose kernels are each
//! conformance-tested against the spec.

mod common;

use common::{
    assert_close, constant, floats, import_fixture, model, node, run_graph, value_info as vi,
    with_int,
};
use onnx_protobuf::ModelProto;
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::graph::{AttentionMask, Graph, NodeKind, OpKind};
use torchlean::Tensor;

const FLOAT: i32 = 1;

/// q [2,3,5,4], kᵀ [2,3,4,6], v [2,3,6,4], a key-padding mask [2,1,1,6]; with
/// `softmax_out`, the softmax's value is also a graph output.
fn attention_model(softmax_out: bool) -> ModelProto {
    // the scale as PyTorch's exporter writes it: a `Constant` node (an initializer would be
    // a trainable parameter, and its product a `mul`)
    let nodes = vec![
        constant("s", floats("s", &[], &[0.707_106_77])),
        node("mq", "Mul", &["q", "s"], &["qs"]),
        node("mk", "Mul", &["kt", "s"], &["ks"]),
        node("qk", "MatMul", &["qs", "ks"], &["scores"]),
        node("mask", "Add", &["scores", "bias"], &["masked"]),
        with_int(node("sm", "Softmax", &["masked"], &["p"]), "axis", -1),
        node("pv", "MatMul", &["p", "v"], &["y"]),
    ];
    let mut outputs = vec![vi("y", &[2, 3, 5, 4], FLOAT)];
    if softmax_out {
        outputs.push(vi("p", &[2, 3, 5, 6], FLOAT));
    }
    model(
        nodes,
        vec![],
        vec![
            vi("q", &[2, 3, 5, 4], FLOAT),
            vi("kt", &[2, 3, 4, 6], FLOAT),
            vi("v", &[2, 3, 6, 4], FLOAT),
            vi("bias", &[2, 1, 1, 6], FLOAT),
        ],
        outputs,
        18,
    )
}

fn kinds(g: &Graph) -> Vec<OpKind> {
    g.nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Op { op } => Some(op.kind()),
            _ => None,
        })
        .collect()
}

/// The payload (scale, causal, mask) of every attention node of `g`.
fn attention_payloads(g: &Graph) -> Vec<(Option<f32>, bool, AttentionMask)> {
    g.nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Op { op } => op.attention_payload(),
            _ => None,
        })
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed * 97);
            ((h >> 8) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn run(m: &ModelProto, bias: &[f32]) -> HashMap<String, Tensor> {
    let imported = torchlean_onnx::import_model(m, "attention", &HashMap::new()).expect("imports");
    let t = |v: Vec<f32>, s: &[usize]| Tensor::from_vec(v, s).expect("shape");
    let inputs = vec![
        ("q".to_string(), t(values(120, 1), &[2, 3, 5, 4])),
        ("kt".to_string(), t(values(144, 2), &[2, 3, 4, 6])),
        ("v".to_string(), t(values(144, 3), &[2, 3, 6, 4])),
        ("bias".to_string(), t(bias.to_vec(), &[2, 1, 1, 6])),
    ];
    let p = BackendProfile::named("checked_cpu").expect("profile");
    run_graph(imported.graph, &imported.values, &inputs, &p, false).expect("runs")
}

#[test]
fn the_pattern_imports_as_one_attention_node_and_the_reader_of_an_intermediate_keeps_the_nodes() {
    let fused = torchlean_onnx::import_model(&attention_model(false), "a", &HashMap::new())
        .expect("imports")
        .graph;
    let ks = kinds(&fused);
    assert_eq!(
        ks.iter()
            .filter(|k| **k == OpKind::ScaledDotProductAttention)
            .count(),
        1,
        "{ks:?}"
    );
    assert!(
        !ks.contains(&OpKind::Softmax) && !ks.contains(&OpKind::Matmul),
        "{ks:?}"
    );
    let attention = fused.nodes.iter().find_map(|n| match &n.kind {
        NodeKind::Op { op } => op.attention_payload(),
        _ => None,
    });
    let (scale, causal, mask) = attention.expect("an attention node");
    assert!((scale.expect("explicit scale") - 0.5).abs() < 1e-6);
    assert!(!causal && mask == AttentionMask::AdditiveBias);

    let kept = torchlean_onnx::import_model(&attention_model(true), "a", &HashMap::new())
        .expect("imports")
        .graph;
    let ks = kinds(&kept);
    assert!(!ks.contains(&OpKind::ScaledDotProductAttention), "{ks:?}");
    assert_eq!(ks.iter().filter(|k| **k == OpKind::Matmul).count(), 2);
}

#[test]
fn the_attention_node_computes_what_the_nodes_compute_masked_and_fully_masked_rows_included() {
    // the second sequence pads its last two keys; the first attends everything
    let mut bias = vec![0.0f32; 12];
    bias[10] = f32::NEG_INFINITY;
    bias[11] = f32::NEG_INFINITY;
    let fused = run(&attention_model(false), &bias);
    let nodes = run(&attention_model(true), &bias);
    let (a, b) = (fused["y"].to_vec(), nodes["y"].to_vec());
    assert!(a.iter().all(|v| v.is_finite()));
    assert_close("masked keys", &a, &b, 1e-6);

    // every key of the second sequence masked: softmax's 0/0 gives NaN rows both ways
    let mut bias = vec![0.0f32; 12];
    bias[6..].fill(f32::NEG_INFINITY);
    let (a, b) = (
        run(&attention_model(false), &bias)["y"].to_vec(),
        run(&attention_model(true), &bias)["y"].to_vec(),
    );
    let half = a.len() / 2;
    assert!(a[half..].iter().all(|v| v.is_nan()) && b[half..].iter().all(|v| v.is_nan()));
    assert_close("unmasked sequence", &a[..half], &b[..half], 1e-6);
}

#[test]
fn pytorchs_encoder_layer_imports_its_attention_as_one_node() {
    // the fixture's outputs and gradients against PyTorch's: tests/pytorch_fixtures.rs
    let (graph, _) = import_fixture("encoder");
    let ks = kinds(&graph);
    assert_eq!(
        ks.iter()
            .filter(|k| **k == OpKind::ScaledDotProductAttention)
            .count(),
        1
    );
    assert!(!ks.contains(&OpKind::Softmax), "{ks:?}");
}

#[test]
fn pytorchs_sdpa_with_a_float_mask_and_causal_imports_as_two_attention_nodes() {
    // `F.scaled_dot_product_attention` with an additive mask, then with is_causal (exported
    // with a `Trilu` constant): outputs and gradients against PyTorch's in
    // tests/pytorch_fixtures.rs
    let (graph, _) = import_fixture("attention");
    let ks = kinds(&graph);
    let attention = attention_payloads(&graph);
    assert_eq!(attention.len(), 2, "{ks:?}");
    assert!(!ks.contains(&OpKind::Softmax), "{ks:?}");
    for (scale, _, _) in &attention {
        // the exporter scales q and k by √(1/√8) each
        assert!((scale.expect("explicit") - 8f32.sqrt().recip()).abs() < 1e-6);
    }
    // the float mask stays an additive bias; the exporter's causal mask (f32::MIN above the
    // diagonal) becomes the causal flag, and its constant is gone
    assert!(!attention[0].1 && attention[0].2 == AttentionMask::AdditiveBias);
    assert!(attention[1].1 && attention[1].2 == AttentionMask::None);
    assert_eq!(graph.parameters.len(), 6, "{:?}", graph.parameters);
}

/// q [2,3,5,4] against kᵀ [2,3,4,6] with a constant [5, 6] mask: `block` above the
/// diagonal (j > i), 0 elsewhere, with `off` added to entry (0, 0).
fn constant_mask_model(block: f32, off: f32, softmax_out: bool) -> ModelProto {
    let mut mask = vec![0.0f32; 30];
    for i in 0..5 {
        for j in (i + 1)..6 {
            mask[i * 6 + j] = block;
        }
    }
    mask[0] += off;
    let m = constant("m", floats("m", &[5, 6], &mask));
    let mut outputs = vec![vi("y", &[2, 3, 5, 4], FLOAT)];
    if softmax_out {
        outputs.push(vi("p", &[2, 3, 5, 6], FLOAT));
    }
    model(
        vec![
            m,
            node("qk", "MatMul", &["q", "kt"], &["scores"]),
            node("mask", "Add", &["scores", "m"], &["masked"]),
            with_int(node("sm", "Softmax", &["masked"], &["p"]), "axis", -1),
            node("pv", "MatMul", &["p", "v"], &["y"]),
        ],
        vec![],
        vec![
            vi("q", &[2, 3, 5, 4], FLOAT),
            vi("kt", &[2, 3, 4, 6], FLOAT),
            vi("v", &[2, 3, 6, 4], FLOAT),
        ],
        outputs,
        18,
    )
}

#[test]
fn a_constant_causal_mask_becomes_the_causal_flag_and_computes_what_the_nodes_compute() {
    let t = |v: Vec<f32>, s: &[usize]| Tensor::from_vec(v, s).expect("shape");
    let inputs = vec![
        ("q".to_string(), t(values(120, 1), &[2, 3, 5, 4])),
        ("kt".to_string(), t(values(144, 2), &[2, 3, 4, 6])),
        ("v".to_string(), t(values(144, 3), &[2, 3, 6, 4])),
    ];
    let p = BackendProfile::named("checked_cpu").expect("profile");
    let run = |m: &ModelProto| {
        let imported = torchlean_onnx::import_model(m, "a", &HashMap::new()).expect("imports");
        let payload = imported.graph.nodes.iter().find_map(|n| match &n.kind {
            NodeKind::Op { op } => op.attention_payload(),
            _ => None,
        });
        let out = run_graph(imported.graph, &imported.values, &inputs, &p, false).expect("runs");
        (payload, out["y"].to_vec())
    };
    for block in [f32::NEG_INFINITY, f32::MIN] {
        let (fused, y) = run(&constant_mask_model(block, 0.0, false));
        assert_eq!(
            fused,
            Some((Some(1.0), true, AttentionMask::None)),
            "{block}"
        );
        let (kept, want) = run(&constant_mask_model(block, 0.0, true));
        assert_eq!(kept, None, "the softmax is an output: node by node");
        assert_close("causal", &y, &want, 1e-6);
    }
    // not the causal mask (one allowed entry shifted, or a finite "large negative" block):
    // an additive bias, still the nodes' values
    for (block, off) in [(f32::NEG_INFINITY, 0.5), (-1e4, 0.0)] {
        let (fused, y) = run(&constant_mask_model(block, off, false));
        assert_eq!(fused, Some((Some(1.0), false, AttentionMask::AdditiveBias)));
        let (_, want) = run(&constant_mask_model(block, off, true));
        assert_close("additive", &y, &want, 1e-6);
    }
}

/// `F.scaled_dot_product_attention` with a boolean mask, as PyTorch exports it: the mask as
/// `Where(mask, 0, -inf)` added to the scores and the "safe softmax" `Where(IsNaN(p), 0, p)`
/// after the softmax (a fully blocked row gives zeros). It imports as one attention node
/// reading the mask itself (`mask: boolean`, whose fully blocked rows are zeros with no
/// gradient, as the safe form's); outputs and gradients against PyTorch's, a fully blocked
/// query row included, in tests/pytorch_fixtures.rs (fixture `masked`).
#[test]
fn pytorchs_sdpa_with_a_boolean_mask_imports_as_one_attention_node_reading_the_mask() {
    let (graph, _) = import_fixture("masked");
    let ks = kinds(&graph);
    let attention = attention_payloads(&graph);
    assert_eq!(attention.len(), 1, "{ks:?}");
    assert_eq!(attention[0].2, AttentionMask::Boolean, "{ks:?}");
    assert!(!ks.contains(&OpKind::Softmax), "{ks:?}");
    // the model's own comparisons (where(h > 0), masked_fill, isnan/isinf) stay
    assert!(ks.contains(&OpKind::Compare), "{ks:?}");
}
