//! Hostile and malformed ONNX models from the importer audit (FINDINGS F2-F4, F7-F11): each
//! is built here with the crate's protobuf types, and each test failed before its fix.
//! Expected values come from NumPy (computed once, written as literals) or from the
//! definition written out in f64.

mod common;

use common::{
    assert_close, constant, floats, ints, model, node, run_graph, value_info as vi, with_int,
    with_ints, with_tensor,
};
use onnx_protobuf::{ModelProto, TensorProto, ValueInfoProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;
use torchlean_onnx::{import_model, Imported, OnnxError};

const FLOAT: i32 = 1;
const INT32: i32 = 6;
const INT64: i32 = 7;
const DOUBLE: i32 = 11;

/// A graph output without a declared shape (torchlean's inference is what is checked).
fn out(name: &str) -> ValueInfoProto {
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v
}

fn import(m: &ModelProto) -> Result<Imported, OnnxError> {
    import_model(m, "test.onnx", &HashMap::new())
}

/// The refusal list (node name, op type, reason) of a model that must not import.
fn refused(m: &ModelProto) -> Vec<(String, String, String)> {
    match import(m) {
        Err(OnnxError::Unsupported { list, .. }) => list
            .into_iter()
            .map(|u| (u.name, u.op_type, u.reason))
            .collect(),
        Err(e) => panic!("expected the unsupported list, got {e}"),
        Ok(_) => panic!("expected a refusal"),
    }
}

/// The one refusal of a model, which must name `name` and `op` and say `says`.
fn refused_once(m: &ModelProto, name: &str, op: &str, says: &[&str]) {
    let list = refused(m);
    assert_eq!(list.len(), 1, "{list:?}");
    let (n, o, reason) = &list[0];
    assert_eq!((n.as_str(), o.as_str()), (name, op), "{list:?}");
    for s in says {
        assert!(reason.contains(s), "`{s}` not in: {reason}");
    }
}

/// Imports and runs a model under the reference profile.
fn run(m: &ModelProto, inputs: &[(&str, &[usize], &[f32])]) -> HashMap<String, Tensor> {
    let imported = import(m).unwrap_or_else(|e| panic!("importable: {e}"));
    let inputs: Vec<(String, Tensor)> = inputs
        .iter()
        .map(|(n, s, v)| (n.to_string(), Tensor::from_vec(v.to_vec(), s).unwrap()))
        .collect();
    let profile = BackendProfile::named("strict_cpu").unwrap();
    run_graph(imported.graph, &imported.values, &inputs, &profile, false).expect("runs")
}

// ---------------------------------------------------------------- F2, F3: constant budget

/// Files of a few hundred bytes asked the import-time evaluator for 8 TiB (Gather), 8-16 GB
/// (ConstantOfShape, Expand, Range) and aborted the process: each is now refused, before
/// allocating, naming the node, its op type and the element count.
#[test]
fn import_time_constants_are_bounded_before_allocating() {
    let value_i64 = ints("", &[1], &[0]);
    let big = (1i64 << 31) - 1;
    // Gather of a [1, 65536] table by 65536 indices: 2^32 elements
    let gather = model(
        vec![
            constant("tshape", ints("", &[2], &[1, 65536])),
            node("table", "ConstantOfShape", &["tshape"], &["table"]),
            constant("ishape", ints("", &[1], &[65536])),
            with_tensor(
                node("idx", "ConstantOfShape", &["ishape"], &["idx"]),
                "value",
                value_i64.clone(),
            ),
            node("huge_gather", "Gather", &["table", "idx"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(
        &gather,
        "huge_gather",
        "Gather",
        &["4294967296 elements", "2^26"],
    );
    // ConstantOfShape [2^31 - 1]
    let cos = model(
        vec![
            constant("s", ints("", &[1], &[big])),
            node("fill", "ConstantOfShape", &["s"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&cos, "fill", "ConstantOfShape", &["2147483647 elements"]);
    // Expand of a one-element constant to [2^31 - 1]
    let expand = model(
        vec![
            constant("c", floats("", &[1], &[1.0])),
            constant("s", ints("", &[1], &[big])),
            node("wide", "Expand", &["c", "s"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&expand, "wide", "Expand", &["2147483647 elements"]);
    // float Range(0, 2.1e9, 1)
    let range = model(
        vec![
            constant("a", floats("", &[], &[0.0])),
            constant("l", floats("", &[], &[2.1e9])),
            constant("d", floats("", &[], &[1.0])),
            node("long", "Range", &["a", "l", "d"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&range, "long", "Range", &["2^26"]);
    // a Slice of an input declared [2^31] describes its range, it does not list it
    let slice = model(
        vec![
            constant("st", ints("", &[1], &[1])),
            constant("en", ints("", &[1], &[i64::MAX])),
            node("tail", "Slice", &["x", "st", "en"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[1 << 31], FLOAT)],
        vec![out("y")],
        17,
    );
    let imported = import(&slice).expect("a slice of a large input imports");
    let y = imported.graph.output("y").unwrap();
    assert_eq!(imported.graph.nodes[y].shape, vec![(1 << 31) - 1]);
}

/// ConstantOfShape([2^20, 1]) concatenated with itself: each part was converted once per
/// row (quadratic: 8 TB of copies at this size, the audit's 1M-row file hung); now linear.
#[test]
fn concat_of_constants_is_linear_in_its_size() {
    let m = model(
        vec![
            constant("s", ints("", &[2], &[1 << 20, 1])),
            node("d", "ConstantOfShape", &["s"], &["d"]),
            with_int(node("cat", "Concat", &["d", "d"], &["c"]), "axis", 1),
            node("shape", "Shape", &["c"], &["y_shape"]),
            constant("i", ints("", &[], &[0])),
            node("n", "Gather", &["y_shape", "i"], &["rows"]),
            constant("two", ints("", &[], &[2])),
            node("m", "Mul", &["rows", "two"], &["doubled"]),
            with_int(
                node("back", "Cast", &["doubled"], &["f"]),
                "to",
                FLOAT as i64,
            ),
            node("y", "Add", &["x", "f"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[1], FLOAT)],
        vec![out("y")],
        17,
    );
    let out = run(&m, &[("x", &[1], &[1.0])]);
    assert_eq!(out["y"].to_vec(), vec![1.0 + 2.0 * (1 << 20) as f32]);
}

// ---------------------------------------------------------------- F4: node limit

fn recurrent(op: &str, steps: i64, gates: i64) -> ModelProto {
    model(
        vec![node("rnn", op, &["x", "w", "r"], &["y"])],
        vec![
            floats("w", &[1, gates, 1], &vec![0.5; gates as usize]),
            floats("r", &[1, gates, 1], &vec![0.5; gates as usize]),
        ],
        vec![vi("x", &[steps, 1, 1], FLOAT)],
        vec![out("y")],
        17,
    )
}

/// A 300-byte GRU/LSTM over S = 2,000,000 steps was unrolled to millions of nodes (3.4 GB,
/// then an abort) before validation refused it: now it is refused before the first step.
#[test]
fn recurrent_unrolling_is_refused_past_the_node_limit() {
    for (op, gates) in [("GRU", 3), ("LSTM", 4)] {
        refused_once(
            &recurrent(op, 2_000_000, gates),
            "rnn",
            op,
            &["2000000 steps", "graph limit of 1048576"],
        );
        // a short sequence still imports
        assert!(import(&recurrent(op, 3, gates)).is_ok(), "{op}");
    }
}

// ---------------------------------------------------------------- F7: CastLike

/// CastLike to an int64 initializer was a float cast (a silent identity): it is now Cast
/// with the target's type. A constant is truncated (ONNX: toward zero); a computed float is
/// refused exactly as `Cast(to=INT64)` refuses it; an integer input passes.
#[test]
fn castlike_casts_to_the_type_of_an_initializer_or_node() {
    let xs = [2.7f32, -1.5, 0.4];
    let folded = model(
        vec![
            constant("c", floats("", &[3], &xs)),
            node("ci", "CastLike", &["c", "like"], &["ci"]),
            with_int(node("cf", "Cast", &["ci"], &["cf"]), "to", FLOAT as i64),
            node("y", "Add", &["x", "cf"], &["y"]),
        ],
        vec![ints("like", &[1], &[0])],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    let got = run(&folded, &[("x", &[3], &[0.0, 0.0, 0.0])]);
    let want: Vec<f32> = xs.iter().map(|v| v.trunc()).collect();
    assert_eq!(got["y"].to_vec(), want);
    // the audit's model: a float input CastLike an int64 initializer
    let computed = model(
        vec![
            node("to_int", "CastLike", &["x", "like"], &["xi"]),
            with_int(node("back", "Cast", &["xi"], &["y"]), "to", FLOAT as i64),
        ],
        vec![ints("like", &[1], &[0])],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    // a float value computed at run time cast to int64 is truncated toward zero (forty-sixth
    // session: it was refused), and -0.4 gives the integer 0, which has no sign
    let x = [2.7f32, -1.5, -0.4];
    let truncated: Vec<u32> = [2.0f32, -1.0, 0.0].iter().map(|v| v.to_bits()).collect();
    let bits =
        |t: &torchlean::Tensor| -> Vec<u32> { t.to_vec().iter().map(|v| v.to_bits()).collect() };
    let got = run(&computed, &[("x", &[3], &x)]);
    assert_eq!(bits(&got["y"]), truncated);
    let cast = model(
        vec![
            with_int(node("to_int", "Cast", &["x"], &["xi"]), "to", INT64 as i64),
            with_int(node("back", "Cast", &["xi"], &["y"]), "to", FLOAT as i64),
        ],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    let got = run(&cast, &[("x", &[3], &x)]);
    assert_eq!(bits(&got["y"]), truncated);
    // like a node: an integer input is already integers; like a float node: a float cast
    let mut like_int32 = ints("like32", &[1], &[0]);
    like_int32.data_type = INT32;
    like_int32.int64_data.clear();
    like_int32.int32_data = vec![0];
    // (`a` is integers: cast to float before the `Add`, which refuses integer arithmetic)
    let nodes = model(
        vec![
            node("a", "CastLike", &["ids", "like32"], &["a"]),
            node("b", "CastLike", &["x", "x"], &["b"]),
            with_int(node("af", "Cast", &["a"], &["af"]), "to", FLOAT as i64),
            node("y", "Add", &["af", "b"], &["y"]),
        ],
        vec![like_int32],
        vec![vi("ids", &[3], INT64), vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    let got = run(
        &nodes,
        &[
            ("ids", &[3], &[1.0, 2.0, 3.0]),
            ("x", &[3], &[0.5, 0.5, 0.5]),
        ],
    );
    assert_eq!(got["y"].to_vec(), vec![1.5, 2.5, 3.5]);
    // CastLike exists from opset 15
    let old = model(
        vec![node("cl", "CastLike", &["x", "x"], &["y"])],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        14,
    );
    refused_once(&old, "cl", "CastLike", &["opset 15"]);
}

// ---------------------------------------------------------------- F8: MatMul ranks

/// NumPy's matmul: 1-D · 1-D is a 0-d scalar (was [1]); 1-D × N-D and N-D × 1-D drop
/// exactly the promoted axis. Shapes and values are NumPy's.
#[test]
fn matmul_of_one_dimensional_operands_follows_numpy() {
    // (shape of a, a, shape of b, b, NumPy's result shape, NumPy's result)
    type Case = (
        &'static [usize],
        Vec<f32>,
        &'static [usize],
        Vec<f32>,
        Vec<usize>,
        Vec<f32>,
    );
    let cases: [Case; 4] = [
        // np.array([1,2,3]) @ np.array([4,-5,6]) -> shape (), 12
        (
            &[3],
            vec![1., 2., 3.],
            &[3],
            vec![4., -5., 6.],
            vec![],
            vec![12.],
        ),
        // [1,2,3] @ (arange(24).reshape(2,3,4) - 7) -> (2, 4)
        (
            &[3],
            vec![1., 2., 3.],
            &[2, 3, 4],
            (0..24).map(|v| v as f32 - 7.0).collect(),
            vec![2, 4],
            vec![-10., -4., 2., 8., 62., 68., 74., 80.],
        ),
        // (arange(24).reshape(2,4,3) * 0.5) @ [4,-5,6] -> (2, 4)
        (
            &[2, 4, 3],
            (0..24).map(|v| v as f32 * 0.5).collect(),
            &[3],
            vec![4., -5., 6.],
            vec![2, 4],
            vec![3.5, 11., 18.5, 26., 33.5, 41., 48.5, 56.],
        ),
        // arange(6).reshape(2,3) @ arange(12).reshape(3,4) -> (2, 4)
        (
            &[2, 3],
            (0..6).map(|v| v as f32).collect(),
            &[3, 4],
            (0..12).map(|v| v as f32).collect(),
            vec![2, 4],
            vec![20., 23., 26., 29., 56., 68., 80., 92.],
        ),
    ];
    for (sa, a, sb, b, shape, want) in cases {
        let dims = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
        let m = model(
            vec![node("mm", "MatMul", &["a", "b"], &["y"])],
            vec![],
            vec![vi("a", &dims(sa), FLOAT), vi("b", &dims(sb), FLOAT)],
            vec![out("y")],
            17,
        );
        let got = run(&m, &[("a", sa, &a), ("b", sb, &b)]);
        assert_eq!(got["y"].shape(), shape.as_slice(), "{sa:?} x {sb:?}");
        assert_close(&format!("{sa:?} x {sb:?}"), &got["y"].to_vec(), &want, 1e-6);
    }
}

// ---------------------------------------------------------------- F9: stable folding

/// Softplus of a constant 100 folded to inf (exp then ln_1p); the folded unary maps now use
/// the reference kernel's formulas. Reference: the stable forms in f64.
#[test]
fn folded_unary_maps_do_not_overflow() {
    let cs = [100.0f32, -100.0, 0.0, 20.0, -20.0, 88.0, 89.0];
    for (op, f) in [
        (
            "Softplus",
            (|v: f64| v.max(0.0) + (-v.abs()).exp().ln_1p()) as fn(f64) -> f64,
        ),
        ("Sigmoid", |v: f64| 1.0 / (1.0 + (-v).exp())),
    ] {
        let m = model(
            vec![
                constant("c", floats("", &[cs.len() as i64], &cs)),
                node("f", op, &["c"], &["s"]),
                node("y", "Add", &["x", "s"], &["y"]),
            ],
            vec![],
            vec![vi("x", &[cs.len() as i64], FLOAT)],
            vec![out("y")],
            17,
        );
        let got = run(&m, &[("x", &[cs.len()], &[0.0; 7])])["y"].to_vec();
        let want: Vec<f32> = cs.iter().map(|&v| f(v as f64) as f32).collect();
        assert!(got.iter().all(|v| v.is_finite()), "{op}: {got:?}");
        assert_close(op, &got, &want, 1e-6);
    }
}

// ---------------------------------------------------------------- F10: ranges

/// A float64 initializer of 1e300 became +inf silently; it is refused, naming it (finite
/// values that only round are fine). A Cast of NaN or 3e30 to int64 gave 0 / saturation;
/// it is refused at import.
#[test]
fn values_beyond_their_target_type_are_refused() {
    let mut w = TensorProto::new();
    w.name = "w".into();
    w.dims = vec![2];
    w.data_type = DOUBLE;
    w.double_data = vec![0.1, 1e300];
    let m = model(
        vec![node("y", "Add", &["x", "w"], &["y"])],
        vec![w.clone()],
        vec![vi("x", &[2], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(
        &m,
        "w",
        "initializer",
        &["1e300", "outside the range of f32"],
    );
    // raw (little-endian) bytes are read the same way
    w.raw_data = w.double_data.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.double_data.clear();
    let m = model(
        vec![node("y", "Add", &["x", "w"], &["y"])],
        vec![w],
        vec![vi("x", &[2], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&m, "w", "initializer", &["1e300"]);
    for bad in [f32::NAN, 3e30, f32::NEG_INFINITY] {
        let m = model(
            vec![
                constant("c", floats("", &[2], &[1.5, bad])),
                with_int(node("to_int", "Cast", &["c"], &["i"]), "to", INT64 as i64),
                with_int(node("back", "Cast", &["i"], &["f"]), "to", FLOAT as i64),
                node("y", "Add", &["x", "f"], &["y"]),
            ],
            vec![],
            vec![vi("x", &[2], FLOAT)],
            vec![out("y")],
            17,
        );
        refused_once(&m, "to_int", "Cast", &["element 1", "int64"]);
    }
}

/// An input declared int64 fed 1.5 was used as 1.5; the values bound to an integer input
/// are now checked (run-graph refuses them, exit 2).
#[test]
fn integer_inputs_must_receive_integers() {
    // (the ids cast to float first: an `Add` of int64 values is refused, docs/onnx.md)
    let m = model(
        vec![
            with_int(node("f", "Cast", &["ids"], &["idsf"]), "to", FLOAT as i64),
            node("y", "Add", &["x", "idsf"], &["y"]),
        ],
        vec![],
        vec![vi("ids", &[3], INT64), vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    let imported = import(&m).unwrap();
    assert_eq!(imported.integer_inputs, vec![("ids".to_string(), INT64)]);
    let t = |v: Vec<f32>| Tensor::from_vec(v, &[3]).unwrap();
    let fractional = [
        ("x".to_string(), t(vec![0.5, 0.5, 0.5])),
        ("ids".to_string(), t(vec![1.0, 2.5, 3.0])),
    ];
    let e = imported.check_inputs(&fractional).unwrap_err().to_string();
    assert!(
        e.contains("`ids`") && e.contains("int64") && e.contains("element 1 is 2.5"),
        "{e}"
    );
    for bad in [f32::NAN, 3e7, -f32::INFINITY] {
        let inputs = [("ids".to_string(), t(vec![1.0, bad, 3.0]))];
        assert!(imported.check_inputs(&inputs).is_err(), "{bad}");
    }
    let fine = [
        ("x".to_string(), t(vec![0.5, 0.5, 0.5])),
        ("ids".to_string(), t(vec![-1.0, 0.0, 16_777_216.0])),
    ];
    imported.check_inputs(&fine).unwrap();
}

/// A boolean input (a padding mask, as PyTorch exports `src_key_padding_mask`) is read as
/// float32 0/1: `Where` selects by it and `Not` is 1 − m, against their definitions; any
/// other value is refused for it, and `Not` of a non-boolean value stays refused.
#[test]
fn boolean_inputs_are_masks_of_zeros_and_ones() {
    const BOOL: i32 = 9;
    let m = model(
        vec![
            node("w", "Where", &["mask", "x", "zero"], &["w"]),
            node("n", "Not", &["mask"], &["n"]),
            node("u", "Unsqueeze", &["n", "ax"], &["nu"]),
            node("f", "Cast", &["nu"], &["nf"]),
        ],
        vec![floats("zero", &[], &[0.0]), ints("ax", &[1], &[0])],
        vec![vi("mask", &[3], BOOL), vi("x", &[3], FLOAT)],
        vec![out("w"), out("nf")],
        17,
    );
    let m = {
        let mut m = m;
        let g = m.graph.as_mut().unwrap();
        let cast = g.node.iter_mut().find(|n| n.name == "f").unwrap();
        let mut a = onnx_protobuf::AttributeProto::new();
        a.name = "to".into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
        a.i = 1;
        cast.attribute.push(a);
        m
    };
    let imported = import(&m).unwrap();
    assert_eq!(imported.integer_inputs, vec![("mask".to_string(), BOOL)]);
    let t = |v: Vec<f32>| Tensor::from_vec(v, &[3]).unwrap();
    let inputs = [
        ("mask".to_string(), t(vec![1.0, 0.0, 1.0])),
        ("x".to_string(), t(vec![2.5, -1.0, 4.0])),
    ];
    imported.check_inputs(&inputs).unwrap();
    let profile = BackendProfile::named("checked_cpu").unwrap();
    let outs = run_graph(
        imported.graph.clone(),
        &imported.values,
        &inputs,
        &profile,
        false,
    )
    .unwrap();
    assert_eq!(outs["w"].to_vec(), vec![2.5, 0.0, 4.0]);
    assert_eq!(outs["nf"].to_vec(), vec![0.0, 1.0, 0.0]);
    let half = [("mask".to_string(), t(vec![1.0, 0.5, 0.0]))];
    let e = imported.check_inputs(&half).unwrap_err().to_string();
    assert!(
        e.contains("element 1 is 0.5") && e.contains("0 or 1"),
        "{e}"
    );
    // Not of an int64 input is not a boolean op: refused
    let m = model(
        vec![node("n", "Not", &["ids"], &["n"])],
        vec![],
        vec![vi("ids", &[3], INT64)],
        vec![out("n")],
        17,
    );
    let e = import(&m).err().expect("refused").to_string();
    assert!(
        e.contains("`Not` of a computed value that is not a boolean"),
        "{e}"
    );
}

// ---------------------------------------------------------------- F11: malformed graphs

#[test]
fn names_are_defined_once() {
    // two nodes write `t`
    let non_ssa = model(
        vec![
            node("first", "Relu", &["x"], &["t"]),
            node("second", "Neg", &["x"], &["t"]),
            node("y", "Abs", &["t"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&non_ssa, "second", "Neg", &["writes `t`", "earlier output"]);
    // a node output redefines a graph input
    let shadow_input = model(
        vec![node("r", "Relu", &["x"], &["x"])],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![out("x")],
        17,
    );
    refused_once(&shadow_input, "r", "Relu", &["writes `x`", "graph input"]);
    // a node output shadows an initializer
    let shadow_init = model(
        vec![
            node("n", "Neg", &["x"], &["w"]),
            node("y", "Add", &["x", "w"], &["y"]),
        ],
        vec![floats("w", &[3], &[1.0, 2.0, 3.0])],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&shadow_init, "n", "Neg", &["writes `w`", "initializer"]);
    // two initializers named `w`
    let dup_init = model(
        vec![node("y", "Add", &["x", "w"], &["y"])],
        vec![
            floats("w", &[3], &[1.0, 2.0, 3.0]),
            floats("w", &[3], &[4.0, 5.0, 6.0]),
        ],
        vec![vi("x", &[3], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&dup_init, "w", "initializer", &["two initializers"]);
    // one node writing the same name twice
    let twice = model(
        vec![
            constant("s", ints("", &[2], &[1, 2])),
            with_int(node("sp", "Split", &["x", "s"], &["a", "a"]), "axis", 0),
        ],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![out("a")],
        17,
    );
    refused_once(&twice, "sp", "Split", &["writes `a`"]);
}

#[test]
fn malformed_operands_are_refused_naming_the_node() {
    let x3 = || vec![vi("x", &[3], FLOAT)];
    let unsq = |axes: &[i64]| {
        model(
            vec![
                constant("ax", ints("", &[axes.len() as i64], axes)),
                node("u", "Unsqueeze", &["x", "ax"], &["y"]),
            ],
            vec![],
            x3(),
            vec![out("y")],
            17,
        )
    };
    refused_once(&unsq(&[0, 0]), "u", "Unsqueeze", &["repeat"]);
    refused_once(&unsq(&[0, -3]), "u", "Unsqueeze", &["repeat"]);
    refused_once(&unsq(&[3]), "u", "Unsqueeze", &["out of range"]);
    let split = |sizes: &[i64]| {
        model(
            vec![
                constant("s", ints("", &[sizes.len() as i64], sizes)),
                node("sp", "Split", &["x", "s"], &["a", "b"]),
            ],
            vec![],
            x3(),
            vec![out("a"), out("b")],
            17,
        )
    };
    refused_once(&split(&[-1, 4]), "sp", "Split", &["negative"]);
    refused_once(&split(&[1, 1]), "sp", "Split", &["do not sum"]);
    let mut two = ints("", &[2], &[5, 6]);
    two.name.clear();
    let cos = model(
        vec![
            constant("s", ints("", &[1], &[3])),
            with_tensor(
                node("fill", "ConstantOfShape", &["s"], &["c"]),
                "value",
                two,
            ),
        ],
        vec![],
        vec![],
        vec![out("c")],
        17,
    );
    refused_once(&cos, "fill", "ConstantOfShape", &["one element"]);
    let slice = model(
        vec![
            constant("st", ints("", &[2], &[0, 1])),
            constant("en", ints("", &[2], &[2, 3])),
            constant("ax", ints("", &[2], &[0, 0])),
            node("sl", "Slice", &["x", "st", "en", "ax"], &["y"]),
        ],
        vec![],
        x3(),
        vec![out("y")],
        17,
    );
    refused_once(&slice, "sl", "Slice", &["repeat axis 0"]);
}

/// Attributes and operand forms exist from the opset that introduced them: the model's
/// declared opset decides (ReduceMean's `noop_with_empty_axes` was honoured in opset 13).
#[test]
fn opset_dependent_forms_follow_the_declared_opset() {
    let a = [0.0f32, 1., 2., 3., 4., 5.];
    let reduce = |op: &str, opset: i64, noop: Option<i64>, axes_input: bool| {
        let mut n = node(
            "red",
            op,
            if axes_input { &["x", "ax"] } else { &["x"] },
            &["y"],
        );
        n = with_int(n, "keepdims", 0);
        if let Some(v) = noop {
            n = with_int(n, "noop_with_empty_axes", v);
        }
        model(
            vec![constant("ax", ints("", &[1], &[1])), n],
            vec![],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    // opset 13 ReduceMean has no noop_with_empty_axes: refused (it was read: identity)
    refused_once(
        &reduce("ReduceMean", 13, Some(1), false),
        "red",
        "ReduceMean",
        &["noop_with_empty_axes"],
    );
    // ... and takes axes as an attribute, not as an input
    refused_once(
        &reduce("ReduceMean", 13, None, true),
        "red",
        "ReduceMean",
        &["attribute"],
    );
    // opset 13 ReduceMean without axes: the mean of everything (NumPy: 2.5, shape ())
    let got = run(
        &reduce("ReduceMean", 13, None, false),
        &[("x", &[2, 3], &a)],
    );
    assert_eq!(
        (got["y"].shape().to_vec(), got["y"].to_vec()),
        (vec![], vec![2.5])
    );
    // opset 18: noop_with_empty_axes exists; with no axes it is the identity
    let got = run(
        &reduce("ReduceMean", 18, Some(1), false),
        &[("x", &[2, 3], &a)],
    );
    assert_eq!(got["y"].to_vec(), a.to_vec());
    // ReduceSum has both from opset 13: axes [1] -> [3, 12]
    let got = run(
        &reduce("ReduceSum", 13, Some(1), true),
        &[("x", &[2, 3], &a)],
    );
    assert_eq!(got["y"].to_vec(), vec![3.0, 12.0]);
    // an `axes` attribute where the opset takes an input is refused, not ignored
    let attr_axes = |op: &str, opset: i64| {
        model(
            vec![with_ints(node("red", op, &["x"], &["y"]), "axes", &[1])],
            vec![],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    refused_once(&attr_axes("ReduceSum", 13), "red", "ReduceSum", &["axes"]);
    refused_once(&attr_axes("ReduceMean", 18), "red", "ReduceMean", &["axes"]);
    assert!(import(&attr_axes("ReduceMean", 17)).is_ok());
    // Split: `num_outputs` exists from opset 18; before, equal parts, one per output
    let split = |opset: i64, num: Option<i64>| {
        let mut n = node("sp", "Split", &["x"], &["p", "q"]);
        if let Some(k) = num {
            n = with_int(n, "num_outputs", k);
        }
        model(
            vec![n],
            vec![],
            vec![vi("x", &[4], FLOAT)],
            vec![out("p"), out("q")],
            opset,
        )
    };
    refused_once(&split(13, Some(2)), "sp", "Split", &["num_outputs"]);
    let got = run(&split(13, None), &[("x", &[4], &[1., 2., 3., 4.])]);
    assert_eq!(
        (got["p"].to_vec(), got["q"].to_vec()),
        (vec![1., 2.], vec![3., 4.])
    );
    assert!(import(&split(18, Some(2))).is_ok());
    refused_once(&split(18, Some(3)), "sp", "Split", &["num_outputs=3"]);
    // Shape's start/end exist from opset 15
    let shape = |opset: i64| {
        model(
            vec![
                with_int(node("sh", "Shape", &["x"], &["s"]), "start", 1),
                with_int(node("c", "Cast", &["s"], &["f"]), "to", FLOAT as i64),
                node("y", "Add", &["x", "f"], &["y"]),
            ],
            vec![],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    refused_once(&shape(14), "sh", "Shape", &["start"]);
    // from opset 15: the dims from axis 1 on, [3]
    let got = run(&shape(15), &[("x", &[2, 3], &a)]);
    assert_eq!(got["y"].to_vec(), vec![3., 4., 5., 6., 7., 8.]);
}

/// A model whose output is its input (no node) imports; its export must not write the
/// input's name a second time (an Identity onto `x`: the fuzz campaign found that the
/// export of such a model no longer imported once names had to be defined once).
#[test]
fn an_output_that_is_an_input_exports_as_valid_ssa() {
    let m = model(
        vec![],
        vec![],
        vec![vi("x", &[3], FLOAT)],
        vec![vi("x", &[3], FLOAT)],
        17,
    );
    let imported = import(&m).unwrap();
    let exported = torchlean_onnx::export_model(&imported.graph, &imported.values).unwrap();
    let g = exported.graph.as_ref().unwrap();
    assert!(g.node.iter().all(|n| !n.output.contains(&"x".to_string())));
    let back = import(&exported).expect("the export imports");
    assert_eq!(back.graph.inputs, imported.graph.inputs);
}

// ------------------------------------------------ PyTorch-oracle audit: BatchNorm, Pow rank

/// Eval-mode BatchNormalization was imported as x·gain + (bias − mean·gain): with a running
/// mean far from the data's spread the scale's gradient came out as the difference of two
/// large sums (1.4% off PyTorch's with mean 1000, variance 0.01). Now (x − mean)·gain + bias;
/// the gradient is checked against the definition evaluated in f64.
#[test]
fn batch_norm_gradients_are_accurate_with_a_large_running_mean() {
    let (c, hw) = (2usize, 6usize);
    let mean = [1000.0f32, -250.0];
    let var = [0.01f32, 0.04];
    let scale = [1.5f32, -0.75];
    let bias = [0.25f32, 2.0];
    let eps = 1e-5f32;
    let x: Vec<f32> = (0..c * hw)
        .map(|i| mean[i / hw] + ((i * 7 % 11) as f32 - 5.0) * 0.03)
        .collect();
    let w: Vec<f32> = (0..c * hw)
        .map(|i| ((i * 5 % 7) as f32 - 3.0) * 0.5)
        .collect();
    let mut reduce = node("sum", "ReduceSum", &["weighted"], &["loss"]);
    reduce = with_int(reduce, "keepdims", 0);
    let m = model(
        vec![
            node(
                "bn",
                "BatchNormalization",
                &["x", "scale", "bias", "mean", "var"],
                &["y"],
            ),
            node("mul", "Mul", &["y", "w"], &["weighted"]),
            reduce,
        ],
        vec![
            floats("scale", &[2], &scale),
            floats("bias", &[2], &bias),
            floats("mean", &[2], &mean),
            floats("var", &[2], &var),
            floats("w", &[1, 2, 2, 3], &w),
        ],
        vec![vi("x", &[1, 2, 2, 3], FLOAT)],
        vec![out("loss")],
        18,
    );
    let imported = import(&m).unwrap_or_else(|e| panic!("importable: {e}"));
    let inputs = vec![(
        "x".to_string(),
        Tensor::from_vec(x.clone(), &[1, 2, 2, 3]).unwrap(),
    )];
    let profile = BackendProfile::named("checked_cpu").unwrap();
    let outs = run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap();
    let grad = outs
        .iter()
        .find(|(k, _)| k.ends_with("scale") && k.contains("grad"))
        .map(|(_, t)| t.to_vec())
        .unwrap_or_else(|| panic!("a gradient of `scale` among {:?}", outs.keys()));
    // d loss / d scale_c = Σ w·(x − mean_c) / √(var_c + eps), in f64
    let want: Vec<f32> = (0..c)
        .map(|ch| {
            let inv = 1.0 / (var[ch] as f64 + eps as f64).sqrt();
            (ch * hw..(ch + 1) * hw)
                .map(|i| w[i] as f64 * (x[i] as f64 - mean[ch] as f64) * inv)
                .sum::<f64>() as f32
        })
        .collect();
    assert_close("d loss / d scale", &grad, &want, 1e-5);
}

/// A one-element exponent of higher rank than the base broadcasts the base up to its rank,
/// as every other binary op does (Pow took it as a plain scalar and kept the base's shape).
#[test]
fn pow_with_a_higher_rank_exponent_broadcasts() {
    let m = model(
        vec![
            constant("e", floats("e", &[1, 1, 1, 1], &[2.0])),
            node("pow", "Pow", &["x", "e"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[2, 3, 4], FLOAT)],
        vec![out("y")],
        18,
    );
    let x: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
    let y = &run(&m, &[("x", &[2, 3, 4], &x)])["y"];
    assert_eq!(y.shape(), &[1, 2, 3, 4]);
    let want: Vec<f32> = x.iter().map(|v| v * v).collect();
    assert_close("x^2", &y.to_vec(), &want, 1e-6);
}

/// `x[1:]` as PyTorch's (dynamo) exporter writes it: the slice's end is the int64 constant
/// i64::MAX passed through `Cast(to=INT64)`. The cast's range check compared integers in
/// f64, where i64::MAX rounds to 2^63, and refused the model (oracle run of session 14).
#[test]
fn slice_to_the_end_through_a_cast_of_i64_max_imports_and_runs() {
    // x[1:] with the end cast to `to`
    let tail = |to: i32| {
        model(
            vec![
                constant("e64", ints("", &[1], &[i64::MAX])),
                with_int(node("cast", "Cast", &["e64"], &["e"]), "to", to as i64),
                constant("s", ints("", &[1], &[1])),
                node("tail", "Slice", &["x", "s", "e"], &["y"]),
            ],
            vec![],
            vec![vi("x", &[4, 3], FLOAT)],
            vec![out("y")],
            18,
        )
    };
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let y = run(&tail(INT64), &[("x", &[4, 3], &x)]);
    assert_eq!(y["y"].shape(), &[3, 3]);
    assert_eq!(y["y"].to_vec(), x[3..].to_vec());
    // a cast of i64::MAX to int32 stays refused (out of that type's range)
    let m32 = tail(INT32);
    refused_once(&m32, "cast", "Cast", &["outside the range"]);
}

/// LayerNormalization's scale and bias must have the normalized shape (up to leading ones): a
/// [5, 4] scale over a normalized [4, 5] held the same count and was read transposed, and a
/// flat [20] was accepted — onnxruntime refuses both (the forty-third session's ONNX audit).
/// [4, 5] still imports.
#[test]
fn layer_norm_affine_parameters_must_have_the_normalized_shape() {
    let ln = |dims: &[i64]| {
        let n: i64 = dims.iter().product();
        model(
            vec![with_int(
                node("ln", "LayerNormalization", &["x", "s"], &["y"]),
                "axis",
                -2,
            )],
            vec![floats("s", dims, &vec![1.0; n as usize])],
            vec![vi("x", &[2, 4, 5], FLOAT)],
            vec![out("y")],
            17,
        )
    };
    refused_once(
        &ln(&[5, 4]),
        "ln",
        "LayerNormalization",
        &["[5, 4]", "[4, 5]"],
    );
    refused_once(&ln(&[20]), "ln", "LayerNormalization", &["[20]"]);
    import(&ln(&[4, 5])).unwrap_or_else(|e| panic!("[4, 5]: {e}"));
}

/// Operators and forms a model's opset does not have yet are refused naming the opset:
/// HardSwish and Trilu (14), Mish (18), Gelu (20), Reshape's `allowzero` (14) and Pad's
/// `axes` input (18) ran below them, where onnxruntime refuses the model as invalid (the
/// forty-third session's ONNX audit). At their opsets they import.
#[test]
fn operators_and_forms_newer_than_the_models_opset_are_refused() {
    let unary = |op: &str, opset: i64| {
        model(
            vec![node("n", op, &["x"], &["y"])],
            vec![],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    for (op, since) in [("HardSwish", 14), ("Mish", 18), ("Gelu", 20), ("Trilu", 14)] {
        refused_once(
            &unary(op, since - 1),
            "n",
            op,
            &["opset", &since.to_string()],
        );
        import(&unary(op, since)).unwrap_or_else(|e| panic!("{op} at {since}: {e}"));
    }
    let reshape = |opset: i64| {
        model(
            vec![with_int(
                node("r", "Reshape", &["x", "s"], &["y"]),
                "allowzero",
                0,
            )],
            vec![ints("s", &[1], &[6])],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    refused_once(&reshape(13), "r", "Reshape", &["allowzero"]);
    import(&reshape(14)).unwrap_or_else(|e| panic!("allowzero at 14: {e}"));
    let pad = |opset: i64| {
        model(
            vec![node("p", "Pad", &["x", "pads", "", "axes"], &["y"])],
            vec![ints("pads", &[2], &[1, 1]), ints("axes", &[1], &[1])],
            vec![vi("x", &[2, 3], FLOAT)],
            vec![out("y")],
            opset,
        )
    };
    refused_once(&pad(13), "p", "Pad", &["opset 18"]);
    import(&pad(18)).unwrap_or_else(|e| panic!("Pad axes at 18: {e}"));
}
