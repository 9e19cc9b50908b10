//! Comparisons and boolean logic on integer values computed at run time — the padding mask
//! of a model that reads token ids (`ids == pad`), `Not`/`And`/`Or`/`Xor` of such masks and
//! `Where` selecting by them — imported exactly with float ops and checked against an
//! independent engine (tract) on the same model files; comparisons of float values are
//! refused naming the node.

mod common;

use common::*;
use onnx_protobuf::{Message, NodeProto, TensorProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;
const INT64: i32 = 7;

/// The model: int64 inputs `ids` [2, 6] and `other` [6], float input `x` [2, 6], the nodes,
/// and the float output `y` [2, 6].
fn build(nodes: Vec<NodeProto>, inits: Vec<TensorProto>) -> onnx_protobuf::ModelProto {
    model(
        nodes,
        inits,
        vec![
            value_info("ids", &[2, 6], INT64),
            value_info("other", &[6], INT64),
            value_info("x", &[2, 6], FLOAT),
        ],
        vec![value_info("y", &[2, 6], FLOAT)],
        13,
    )
}

fn cast(from: &str) -> NodeProto {
    with_int(node("cast", "Cast", &[from], &["y"]), "to", FLOAT as i64)
}

fn cmp(op: &str, a: &str, b: &str, out: &str) -> NodeProto {
    node(out, op, &[a, b], &[out])
}

#[test]
fn integer_comparisons_and_logic_agree_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let zero = || ints("zero", &[], &[0]);
    let two = || ints("two", &[], &[2]);
    let row = || ints("row", &[1, 6], &[0, 1, 2, 3, 4, 5]);
    let cases: Vec<(&str, Vec<NodeProto>, Vec<TensorProto>)> = vec![
        (
            "equal",
            vec![cmp("Equal", "ids", "zero", "m"), cast("m")],
            vec![zero()],
        ),
        (
            "less, broadcast",
            vec![cmp("Less", "ids", "other", "m"), cast("m")],
            vec![],
        ),
        (
            "greater",
            vec![cmp("Greater", "ids", "row", "m"), cast("m")],
            vec![row()],
        ),
        (
            "less or equal",
            vec![cmp("LessOrEqual", "ids", "two", "m"), cast("m")],
            vec![two()],
        ),
        (
            "greater or equal",
            vec![cmp("GreaterOrEqual", "other", "ids", "m"), cast("m")],
            vec![],
        ),
        (
            "not, and, or, xor",
            vec![
                cmp("Equal", "ids", "zero", "pad"),
                node("keep", "Not", &["pad"], &["keep"]),
                cmp("Less", "ids", "two", "small"),
                cmp("And", "keep", "small", "both"),
                cmp("Or", "both", "pad", "either"),
                cmp("Xor", "either", "small", "m"),
                cast("m"),
            ],
            vec![zero(), two()],
        ),
        (
            "where by a padding mask",
            vec![
                cmp("Equal", "ids", "zero", "pad"),
                node("w", "Where", &["pad", "minus", "x"], &["y"]),
            ],
            vec![zero(), floats("minus", &[], &[-1e9])],
        ),
    ];
    // ids in 0..5 (zeros included), other 0..5
    let ids: Vec<f32> = (0..12).map(|i| ((i * 7 + 3) % 5) as f32).collect();
    let other: Vec<f32> = (0..6).map(|i| ((i * 3 + 1) % 5) as f32).collect();
    let inputs = [
        ("ids".to_string(), Tensor::from_vec(ids, &[2, 6]).unwrap()),
        ("other".to_string(), Tensor::from_vec(other, &[6]).unwrap()),
        (
            "x".to_string(),
            Tensor::from_vec(values(12, 3), &[2, 6]).unwrap(),
        ),
    ];
    for (what, nodes, inits) in cases {
        let m = build(nodes, inits);
        let path = dir.join(format!("{}.onnx", what.replace([' ', ','], "_")));
        std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
        let want = tract_run(&path, &inputs).remove(0);
        let imported = torchlean_onnx::import_model(&m, what, &HashMap::new())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(out["y"].to_vec(), want, "{what}");
    }
    // a comparison of float values is refused, naming the operator
    let m = build(
        vec![cmp("Less", "x", "zero_f", "m"), cast("m")],
        vec![floats("zero_f", &[], &[0.0])],
    );
    let e = torchlean_onnx::import_model(&m, "float", &HashMap::new())
        .err()
        .expect("a float comparison is refused")
        .to_string();
    assert!(e.contains("Less") && e.contains("float values"), "{e}");
}

/// No gradient reaches an integer input through a comparison (PyTorch's integer tensors have
/// none): `loss = Σ w · (ids OP 2)` for each comparison gives ∂loss/∂ids = 0 and ∂loss/∂w the
/// mask. (With clamp(d, 0, 1), whose gradient passes at its bounds, `Greater` and `Less`
/// reported a gradient for `ids` wherever the difference was 0 or 1 — found by the
/// forty-second session's audit.)
#[test]
fn no_gradient_reaches_an_integer_input_through_a_comparison() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let ids: Vec<f32> = (0..12).map(|i| ((i * 7 + 3) % 5) as f32).collect();
    let w = values(12, 5);
    for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"] {
        let m = model(
            vec![
                cmp(op, "ids", "two", "m"),
                with_int(node("c", "Cast", &["m"], &["mf"]), "to", FLOAT as i64),
                node("p", "Mul", &["mf", "w"], &["p"]),
                with_int(node("s", "ReduceSum", &["p"], &["loss"]), "keepdims", 0),
            ],
            vec![ints("two", &[], &[2])],
            vec![
                value_info("ids", &[2, 6], INT64),
                value_info("w", &[2, 6], FLOAT),
            ],
            vec![value_info("loss", &[], FLOAT)],
            13,
        );
        let imported = torchlean_onnx::import_model(&m, op, &HashMap::new())
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        let inputs = [
            (
                "ids".to_string(),
                Tensor::from_vec(ids.clone(), &[2, 6]).unwrap(),
            ),
            (
                "w".to_string(),
                Tensor::from_vec(w.clone(), &[2, 6]).unwrap(),
            ),
        ];
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true)
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        let mask: Vec<f32> = ids
            .iter()
            .map(|&v| {
                let r = match op {
                    "Equal" => v == 2.0,
                    "Less" => v < 2.0,
                    "Greater" => v > 2.0,
                    "LessOrEqual" => v <= 2.0,
                    _ => v >= 2.0,
                };
                if r {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        assert_eq!(out["grad.w"].to_vec(), mask, "{op}: gradient of w");
        if let Some(g) = out.get("grad.ids") {
            assert!(
                g.to_vec().iter().all(|&v| v == 0.0),
                "{op}: gradient of ids {:?}",
                g.to_vec()
            );
        }
    }
}

/// A model's name, nodes, initializers and output dims.
type Case = (&'static str, Vec<NodeProto>, Vec<TensorProto>, Vec<i64>);

/// Integer arithmetic that float32 computes exactly because an operand is a boolean — the
/// count `mask.sum(-1)` (a sum of zeros and ones), `ids * attention_mask` — and an integer
/// mask cast to bool (`~attention_mask.bool()`, i.e. x != 0), as PyTorch exports them,
/// against tract.
#[test]
fn boolean_counts_products_and_casts_agree_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-boolint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let cast_to = |name: &str, from: &str, to: i32, out: &str| {
        with_int(node(name, "Cast", &[from], &[out]), "to", to as i64)
    };
    const BOOL: i32 = 9;
    let cases: Vec<Case> = vec![
        (
            "count of non-padding ids",
            vec![
                cmp("Equal", "ids", "zero", "pad"),
                node("keep", "Not", &["pad"], &["keep"]),
                cast_to("ki", "keep", INT64, "keep_i"),
                with_int(
                    node("s", "ReduceSum", &["keep_i", "axes"], &["n"]),
                    "keepdims",
                    0,
                ),
                cast_to("nf", "n", FLOAT, "y"),
            ],
            vec![ints("zero", &[], &[0]), ints("axes", &[1], &[1])],
            vec![2],
        ),
        (
            "ids times a mask",
            vec![
                cmp("Less", "ids", "three", "small"),
                cast_to("si", "small", INT64, "small_i"),
                node("p", "Mul", &["ids", "small_i"], &["p"]),
                cast_to("pf", "p", FLOAT, "y"),
            ],
            vec![ints("three", &[], &[3])],
            vec![2, 6],
        ),
        (
            "an integer mask cast to bool, negated",
            vec![
                cast_to("b", "ids", BOOL, "nz"),
                node("n", "Not", &["nz"], &["z"]),
                cast_to("zf", "z", FLOAT, "y"),
            ],
            vec![],
            vec![2, 6],
        ),
    ];
    let ids: Vec<f32> = (0..12).map(|i| ((i * 7 + 3) % 5) as f32).collect();
    let inputs = [("ids".to_string(), Tensor::from_vec(ids, &[2, 6]).unwrap())];
    for (what, nodes, inits, out_dims) in cases {
        let m = model(
            nodes,
            inits,
            vec![value_info("ids", &[2, 6], INT64)],
            vec![value_info("y", &out_dims, FLOAT)],
            13,
        );
        let path = dir.join(format!("{}.onnx", what.replace([' ', ','], "_")));
        std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
        let want = tract_run(&path, &inputs).remove(0);
        let imported = torchlean_onnx::import_model(&m, what, &HashMap::new())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(out["y"].to_vec(), want, "{what}");
    }
}
