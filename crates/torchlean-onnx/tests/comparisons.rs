//! Comparisons and boolean logic on integer values computed at run time — the padding mask
//! of a model that reads token ids (`ids == pad`), `Not`/`And`/`Or`/`Xor` of such masks and
//! `Where` selecting by them — and comparisons of float values (`IsNaN`, `IsInf` included),
//! imported as torchlean's `compare` and checked against an independent engine (tract) on the
//! same model files.

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
}

/// Comparisons of float values computed at run time (torchlean's `compare`), `IsNaN`, `IsInf`
/// with each pair of its flags, a float value cast to bool, and the logic on them, over
/// values holding NaN, ±inf, ±0 and subnormals, against tract: every relation is IEEE's (false
/// with a NaN but `!=`, -0 == +0).
#[test]
fn float_comparisons_agree_with_tract_on_special_values() {
    let dir = std::env::temp_dir().join(format!("torchlean-fcompare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.0,
        -1.0,
        2.5,
        3.0e38,
        -3.0e38,
    ];
    let z = [0.0, -0.0, f32::NAN, 1.0, f32::INFINITY, 1e-45];
    let is_inf = |pos: i64, neg: i64| {
        with_int(
            with_int(node("i", "IsInf", &["x"], &["m"]), "detect_positive", pos),
            "detect_negative",
            neg,
        )
    };
    const BOOL: i64 = 9;
    let mut cases: Vec<(String, Vec<NodeProto>)> =
        ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]
            .iter()
            .map(|op| (op.to_string(), vec![cmp(op, "x", "z", "m"), cast("m")]))
            .collect();
    cases.push((
        "IsNaN".into(),
        vec![node("n", "IsNaN", &["x"], &["m"]), cast("m")],
    ));
    for (pos, neg) in [(1, 1), (1, 0), (0, 1), (0, 0)] {
        cases.push((
            format!("IsInf {pos}{neg}"),
            vec![is_inf(pos, neg), cast("m")],
        ));
    }
    cases.push((
        "float cast to bool".into(),
        vec![
            with_int(node("b", "Cast", &["x"], &["m"]), "to", BOOL),
            cast("m"),
        ],
    ));
    cases.push((
        "not finite, or below z".into(),
        vec![
            node("n", "IsNaN", &["x"], &["nan"]),
            is_inf(1, 1),
            cmp("Or", "nan", "m", "bad"),
            cmp("Less", "x", "z", "low"),
            cmp("Or", "bad", "low", "either"),
            node("k", "Not", &["either"], &["keep"]),
            node("w", "Where", &["keep", "x", "z"], &["y"]),
        ],
    ));
    let inputs = [
        (
            "x".to_string(),
            Tensor::from_vec(specials.to_vec(), &[2, 6]).unwrap(),
        ),
        ("z".to_string(), Tensor::from_vec(z.to_vec(), &[6]).unwrap()),
    ];
    for (what, nodes) in cases {
        let m = model(
            nodes,
            vec![],
            vec![
                value_info("x", &[2, 6], FLOAT),
                value_info("z", &[6], FLOAT),
            ],
            vec![value_info("y", &[2, 6], FLOAT)],
            13,
        );
        let (got, want) = torchlean_and_tract(&dir, &what, &m, &inputs, &profile);
        assert_eq!(bits(&got), bits(&want), "{what}");
    }
}

/// `torch.where(x > 0, x, 0.1 * x)` (a comparison of float values choosing the branch) passes
/// each branch's gradient where it is chosen and none through the comparison: the gradient of
/// Σ w·y is w where x > 0 and 0.1·w elsewhere (x = 0 included), against the rule written out.
#[test]
fn a_float_comparison_selects_the_gradient_of_its_branch() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let x: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) * 0.5).collect();
    let m = model(
        vec![
            cmp("Greater", "x", "zero", "pos"),
            node("s", "Mul", &["x", "tenth"], &["small"]),
            node("w", "Where", &["pos", "x", "small"], &["y"]),
            node("p", "Mul", &["y", "x"], &["sq"]),
            with_int(node("r", "ReduceSum", &["sq"], &["loss"]), "keepdims", 0),
        ],
        vec![floats("zero", &[], &[0.0]), floats("tenth", &[], &[0.1])],
        vec![value_info("x", &[2, 6], FLOAT)],
        vec![value_info("loss", &[], FLOAT)],
        13,
    );
    let imported = torchlean_onnx::import_model(&m, "where", &HashMap::new()).expect("imports");
    let inputs = [(
        "x".to_string(),
        Tensor::from_vec(x.clone(), &[2, 6]).unwrap(),
    )];
    let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).expect("runs");
    // loss = Σ x·where(x > 0, x, 0.1x): d/dx = 2x where x > 0, else 0.2x
    let want: Vec<f32> = x
        .iter()
        .map(|&v| if v > 0.0 { 2.0 * v } else { 2.0 * (0.1f32 * v) })
        .collect();
    let got = out["grad.x"].to_vec();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{got:?} against {want:?}"
        );
    }
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
    const INT32: i32 = 6;
    let ints32 = |name: &str, dims: &[i64], data: &[i32]| {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.dims = dims.to_vec();
        t.data_type = INT32;
        t.int32_data = data.to_vec();
        t
    };
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
        // forty-eighth session: integer arithmetic whose bound stays within 2^24
        (
            "count minus one",
            vec![
                cmp("Equal", "ids", "zero", "pad"),
                node("keep", "Not", &["pad"], &["keep"]),
                cast_to("ki", "keep", INT64, "keep_i"),
                with_int(
                    node("s", "ReduceSum", &["keep_i", "axes"], &["n"]),
                    "keepdims",
                    0,
                ),
                node("m", "Sub", &["n", "one"], &["last"]),
                cast_to("nf", "last", FLOAT, "y"),
            ],
            vec![
                ints("zero", &[], &[0]),
                ints("one", &[], &[1]),
                ints("axes", &[1], &[1]),
            ],
            vec![2],
        ),
        (
            // RoBERTa's create_position_ids_from_input_ids: (cumsum(mask) + 0) * mask + pad
            "positions from a padding mask",
            vec![
                cmp("Equal", "ids", "zero", "pad"),
                node("keep", "Not", &["pad"], &["keep"]),
                cast_to("ki", "keep", INT32, "keep_i"),
                node("c", "CumSum", &["keep_i", "axis"], &["run"]),
                node("a", "Add", &["run", "past"], &["from"]),
                node("m", "Mul", &["from", "keep_i"], &["masked"]),
                cast_to("l", "masked", INT64, "masked_l"),
                node("p", "Add", &["masked_l", "one"], &["pos"]),
                cast_to("pf", "pos", FLOAT, "y"),
            ],
            vec![
                ints("zero", &[], &[0]),
                ints("one", &[], &[1]),
                ints("axis", &[], &[1]),
                ints32("past", &[], &[0]),
            ],
            vec![2, 6],
        ),
        (
            // (tract evaluates x·x as a Square, which it has no int64 kernel for)
            "a clamped id times its double plus one",
            vec![
                node("c", "Clip", &["ids", "zero", "three"], &["c"]),
                node("d", "Add", &["c", "c"], &["d"]),
                node("sq", "Mul", &["c", "d"], &["sq"]),
                node("p", "Add", &["sq", "one"], &["p"]),
                cast_to("pf", "p", FLOAT, "y"),
            ],
            vec![
                ints("zero", &[], &[0]),
                ints("one", &[], &[1]),
                ints("three", &[], &[3]),
            ],
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

/// `torch.clamp(x, min=self.lo, max=self.hi)` with learnable bounds (Clip whose bounds are
/// float initializers): the bounds are parameters with gradients, by PyTorch 2.15's rule for
/// tensor bounds — x takes the cotangent where lo < x < hi, lo where x < lo, hi where x > hi,
/// and a tie shares it half and half (x = lo and x = hi occur below). (The import read such
/// bounds as constants and wrote no gradient for them: an audit of the forty-fifth session.)
#[test]
fn learnable_clip_bounds_take_their_gradients() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let x: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) * 0.5).collect();
    let w: Vec<f32> = (0..12).map(|i| 1.0 + i as f32).collect();
    let (lo, hi) = (-1.0f32, 1.5f32);
    let m = model(
        vec![
            node("c", "Clip", &["x", "lo", "hi"], &["y"]),
            node("p", "Mul", &["y", "w"], &["yw"]),
            with_int(node("r", "ReduceSum", &["yw"], &["loss"]), "keepdims", 0),
        ],
        vec![floats("lo", &[], &[lo]), floats("hi", &[], &[hi])],
        vec![
            value_info("x", &[2, 6], FLOAT),
            value_info("w", &[2, 6], FLOAT),
        ],
        vec![value_info("loss", &[], FLOAT)],
        13,
    );
    let imported = torchlean_onnx::import_model(&m, "clip", &HashMap::new()).expect("imports");
    let inputs = [
        (
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[2, 6]).unwrap(),
        ),
        (
            "w".to_string(),
            Tensor::from_vec(w.clone(), &[2, 6]).unwrap(),
        ),
    ];
    let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).expect("runs");
    // an element's share of a cotangent: 1 where it wins, 1/2 on a tie, else 0
    let share = |v: f32, bound: f32, beyond: bool| -> f32 {
        if v == bound {
            0.5
        } else if beyond {
            1.0
        } else {
            0.0
        }
    };
    let to_lo: f32 = x
        .iter()
        .zip(&w)
        .map(|(&v, &w)| w * share(v, lo, v < lo))
        .sum();
    let to_hi: f32 = x
        .iter()
        .zip(&w)
        .map(|(&v, &w)| w * share(v, hi, v > hi))
        .sum();
    assert_eq!(out["grad.lo"].to_vec(), vec![to_lo]);
    assert_eq!(out["grad.hi"].to_vec(), vec![to_hi]);
    let gx: Vec<f32> = x
        .iter()
        .zip(&w)
        .map(|(&v, &w)| {
            if v == lo || v == hi {
                w * 0.5
            } else if lo < v && v < hi {
                w
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(out["grad.x"].to_vec(), gx);
    let y: Vec<f32> = x.iter().map(|v| v.clamp(lo, hi)).collect();
    let loss: f32 = y.iter().zip(&w).map(|(y, w)| y * w).sum();
    assert!((out["loss"].to_vec()[0] - loss).abs() <= 1e-5 * loss.abs().max(1.0));
}
