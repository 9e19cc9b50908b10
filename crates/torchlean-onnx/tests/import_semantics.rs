//! Import semantics at the edges an audit (thirty-fifth session) found wrong or unclear:
//! log-sum-exp rows with infinities, Gemm with beta 0, integer arithmetic on run-time values,
//! non-finite activation coefficients, recurrent `activations` and empty sequences,
//! generated constant names, oversized `--input-shape` dims, Pad/Clip/Split refusals, and
//! constant folding of Mod, Max and Min. Models are built with the crate's protobuf types;
//! each test failed before its fix. Expected values
//! come from PyTorch 2.15 or NumPy (computed once with the commands quoted, written as
//! literals), from onnxruntime 1.32 (CPU, graph optimizations off: quoted likewise), or from
//! the ONNX definition.

mod common;

use common::{
    constant, floats, ints, model, node, run_graph, value_info as vi, with_int, with_ints,
};
use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto, ModelProto, NodeProto};
use onnx_protobuf::{TensorProto, ValueInfoProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;
use torchlean_onnx::{import_model, Imported, OnnxError};

const FLOAT: i32 = 1;
const INT64: i32 = 7;

fn out(name: &str) -> ValueInfoProto {
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v
}

fn with_float(mut n: NodeProto, name: &str, v: f32) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::FLOAT.into();
    a.f = v;
    n.attribute.push(a);
    n
}

fn with_strings(mut n: NodeProto, name: &str, v: &[&str]) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRINGS.into();
    a.strings = v.iter().map(|s| s.as_bytes().to_vec()).collect();
    n.attribute.push(a);
    n
}

fn import(m: &ModelProto) -> Result<Imported, OnnxError> {
    import_model(m, "test.onnx", &HashMap::new())
}

/// The one refusal of a model: it names `name` and `op` and its reason says every `says`.
fn refused_once(m: &ModelProto, name: &str, op: &str, says: &[&str]) {
    let list = match import(m) {
        Err(OnnxError::Unsupported { list, .. }) => list,
        Err(e) => panic!("expected the unsupported list, got {e}"),
        Ok(_) => panic!("expected a refusal of `{name}`"),
    };
    assert_eq!(list.len(), 1, "{list:?}");
    let u = &list[0];
    assert_eq!(
        (u.name.as_str(), u.op_type.as_str()),
        (name, op),
        "{list:?}"
    );
    for s in says {
        assert!(u.reason.contains(s), "`{s}` not in: {}", u.reason);
    }
}

/// Imports and runs a model under the reference profile; output `name` as a vector.
fn run(m: &ModelProto, inputs: &[(&str, &[usize], &[f32])], name: &str) -> Vec<f32> {
    let imported = import(m).unwrap_or_else(|e| panic!("importable: {e}"));
    let inputs: Vec<(String, Tensor)> = inputs
        .iter()
        .map(|(n, s, v)| (n.to_string(), Tensor::from_vec(v.to_vec(), s).unwrap()))
        .collect();
    let profile = BackendProfile::named("strict_cpu").unwrap();
    let outs = run_graph(imported.graph, &imported.values, &inputs, &profile, false).expect("runs");
    outs[name].to_vec()
}

/// Equal as IEEE values, NaN equal to NaN, within `tol` for finite ones.
fn assert_values(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        let same = (g.is_nan() && w.is_nan())
            || (g.is_infinite() && g == w)
            || (w.is_finite() && (g - w).abs() <= tol * w.abs().max(1.0));
        assert!(same, "{what}: got {got:?}, want {want:?}");
    }
}

// ------------------------------------------------------------ F4: ReduceLogSumExp at ±∞

/// A row holding +∞ gave NaN (∞ − ∞ in the shift), a row of −∞ NaN too; PyTorch gives +∞
/// and −∞. `torch.logsumexp(torch.tensor([[1, inf, 2], [1, 2, 3], [-inf]*3, [nan, 1, 2],
/// [1000, 1000, -inf]]), 1)` = [inf, 3.4076058864593506, -inf, nan, 1000.6931762695312];
/// onnxruntime gives the same for the first three (the audit's case pt_logsumexp_inf).
#[test]
fn logsumexp_of_rows_with_infinities_is_pytorchs() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let x = [
        1.0, inf, 2.0, 1.0, 2.0, 3.0, -inf, -inf, -inf, nan, 1.0, 2.0, 1000.0, 1000.0, -inf,
    ];
    let m = model(
        vec![with_int(
            with_ints(node("lse", "ReduceLogSumExp", &["x"], &["y"]), "axes", &[1]),
            "keepdims",
            0,
        )],
        vec![],
        vec![vi("x", &[5, 3], FLOAT)],
        vec![out("y")],
        17,
    );
    let got = run(&m, &[("x", &[5, 3], &x)], "y");
    assert_values(
        "logsumexp",
        &got,
        &[inf, 3.407_606, -inf, nan, 1_000.693_2],
        1e-6,
    );
}

// ------------------------------------------------------------------ F5: Gemm with beta 0

/// `Gemm(beta=0)` must ignore C (onnxruntime, and PyTorch's `addmm(C, a, B, beta=0)`, which
/// exports as this node); an infinite and a NaN C gave NaN everywhere (0·∞). A·B of these
/// values is [[4, -1], [10, -1]] (NumPy: `A @ B`).
#[test]
fn gemm_with_beta_zero_ignores_c() {
    let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = floats("b", &[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, -1.0]);
    for (c, alpha) in [
        (floats("c", &[1, 2], &[f32::INFINITY, f32::NAN]), 1.0),
        (floats("c", &[2], &[f32::NAN, f32::NEG_INFINITY]), 2.0),
    ] {
        let gemm = with_float(node("g", "Gemm", &["a", "b", "c"], &["y"]), "beta", 0.0);
        let m = model(
            vec![with_float(gemm, "alpha", alpha)],
            vec![b.clone(), c],
            vec![vi("a", &[2, 3], FLOAT)],
            vec![out("y")],
            17,
        );
        let got = run(&m, &[("a", &[2, 3], &a)], "y");
        let want: Vec<f32> = [4.0, -1.0, 10.0, -1.0].iter().map(|v| v * alpha).collect();
        assert_values("gemm beta 0", &got, &want, 0.0);
    }
}

/// A bool input cast to bool is itself (PyTorch's TorchScript exporter writes that Cast for
/// `nn.MultiheadAttention(key_padding_mask=<bool>)`, which was refused as "casting a computed
/// value to bool"); cast on to float it reads 0 and 1.
#[test]
fn a_bool_input_cast_to_bool_is_itself() {
    const BOOL: i32 = 9;
    let m = model(
        vec![
            with_int(node("c", "Cast", &["m"], &["mb"]), "to", BOOL as i64),
            with_int(node("f", "Cast", &["mb"], &["mf"]), "to", FLOAT as i64),
            node("a", "Add", &["x", "mf"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[2, 2], FLOAT), vi("m", &[2, 2], BOOL)],
        vec![out("y")],
        17,
    );
    let got = run(
        &m,
        &[
            ("x", &[2, 2], &[0.5, 1.5, -2.0, 4.0]),
            ("m", &[2, 2], &[1.0, 0.0, 0.0, 1.0]),
        ],
        "y",
    );
    assert_values("bool cast", &got, &[1.5, 1.5, -2.0, 5.0], 0.0);
}

// --------------------------------------------- F6: integer arithmetic at run time refused

/// Int64 values computed at run time went through float32 arithmetic: `Div` gave 3.5 where
/// ONNX and onnxruntime give 3 ([7, -7, 9, 1] / [2, 2, 4, 3] = [3, -3, 2, 0] in onnxruntime),
/// `ReduceMean` 2.5 where onnxruntime gives 2, `Mul` 16785408 for 4097·4097 = 16785409.
/// Each is refused naming the node; the same arithmetic after a `Cast` to float is float
/// arithmetic (what the model asks for) and runs; on constants it is evaluated exactly, in
/// i64, at import.
#[test]
fn integer_arithmetic_on_values_computed_at_run_time_is_refused() {
    let ab = || vec![vi("a", &[4], INT64), vi("b", &[4], INT64)];
    let div = model(
        vec![node("d", "Div", &["a", "b"], &["y"])],
        vec![],
        ab(),
        vec![out("y")],
        17,
    );
    refused_once(&div, "d", "Div", &["integer value `a`", "truncates"]);
    // an integer constant divisor, and the quotient cast to float after
    let div_cast = model(
        vec![
            constant("two", ints("", &[], &[2])),
            node("d", "Div", &["a", "two"], &["q"]),
            with_int(node("c", "Cast", &["q"], &["y"]), "to", FLOAT as i64),
        ],
        vec![],
        vec![vi("a", &[4], INT64)],
        vec![out("y")],
        17,
    );
    refused_once(&div_cast, "d", "Div", &["truncates"]);
    // through an element-moving op the value is still an integer
    let mean = model(
        vec![
            node("t", "Unsqueeze", &["a", "ax"], &["u"]),
            with_int(node("m", "ReduceMean", &["u"], &["y"]), "keepdims", 0),
        ],
        vec![ints("ax", &[1], &[0])],
        vec![vi("a", &[4], INT64)],
        vec![out("y")],
        17,
    );
    refused_once(
        &mean,
        "m",
        "ReduceMean",
        &["integer value `u`", "mean truncates"],
    );
    let mul = model(
        vec![node("p", "Mul", &["a", "b"], &["y"])],
        vec![],
        ab(),
        vec![out("y")],
        17,
    );
    refused_once(&mul, "p", "Mul", &["2^24", "16777216", "281474976710656"]);
    // an int64 input minus one (`lengths - 1`) may reach 2^24 + 1 with inputs up to 2^24: it
    // is admitted by holding the integer inputs to 2^24 - 1 at run time, the refusal of a
    // larger value naming the node (forty-ninth session; the forty-eighth refused it)
    let minus_one = model(
        vec![node("p", "Sub", &["a", "one"], &["y"])],
        vec![ints("one", &[], &[1])],
        vec![vi("a", &[4], INT64)],
        vec![out("y")],
        17,
    );
    let imported = import(&minus_one).expect("lengths - 1 imports");
    assert_eq!(imported.integer_input_limit.limit, 16_777_215.0);
    let a = |v: f32| {
        vec![(
            "a".to_string(),
            Tensor::from_vec(vec![1.0, -v, 3.0, v], &[4]).unwrap(),
        )]
    };
    imported
        .check_inputs(&a(16_777_215.0))
        .expect("within the lowered limit");
    let e = imported
        .check_inputs(&a(16_777_216.0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("at most 16777215") && e.contains("node `p` (`Sub`)"),
        "{e}"
    );
    // times 100 would need inputs below 2^24 / 100 < 2^20: refused with the bound
    let times_100 = model(
        vec![node("p", "Mul", &["a", "hundred"], &["y"])],
        vec![ints("hundred", &[], &[100])],
        vec![vi("a", &[4], INT64)],
        vec![out("y")],
        17,
    );
    refused_once(
        &times_100,
        "p",
        "Mul",
        &["may reach 1677721600", "`a` at most 16777216", "below 2^20"],
    );
    // a float cast to int has no known bound
    let cast_sum = model(
        vec![
            with_int(node("c", "Cast", &["f"], &["i"]), "to", INT64 as i64),
            node("p", "Add", &["i", "i"], &["y"]),
        ],
        vec![],
        vec![vi("f", &[4], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&cast_sum, "p", "Add", &["unknown magnitude"]);
    // a one-sided clip can raise a boolean's bound: 0/1 clipped below at 3000 is 3000, its
    // square (9·10⁶) stays within 2^24, its cube does not
    let raised = model(
        vec![
            node("e", "Equal", &["a", "one"], &["m"]),
            with_int(node("c", "Cast", &["m"], &["mi"]), "to", INT64 as i64),
            node("k", "Clip", &["mi", "lo"], &["k"]),
            node("s", "Mul", &["k", "k"], &["sq"]),
            node("t", "Mul", &["sq", "k"], &["y"]),
        ],
        vec![ints("one", &[], &[1]), ints("lo", &[], &[3000])],
        vec![vi("a", &[4], INT64)],
        vec![out("y")],
        17,
    );
    refused_once(&raised, "t", "Mul", &["may reach 27000000000"]);
    // a ReduceMean of an integer constant is not folded: refused as well
    let const_mean = model(
        vec![
            constant("k", ints("", &[2], &[1, 2])),
            node("m", "ReduceMean", &["k"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&const_mean, "m", "ReduceMean", &["integer value `k`"]);

    // after a Cast to float: float division, 7 / 2 = 3.5 (onnxruntime: [3.5, -3.5, 2.25,
    // 0.33333334] for Cast(a) / Cast(b))
    let float_div = model(
        vec![
            with_int(node("ca", "Cast", &["a"], &["fa"]), "to", FLOAT as i64),
            with_int(node("cb", "Cast", &["b"], &["fb"]), "to", FLOAT as i64),
            node("d", "Div", &["fa", "fb"], &["y"]),
        ],
        vec![],
        ab(),
        vec![out("y")],
        17,
    );
    let got = run(
        &float_div,
        &[
            ("a", &[4], &[7.0, -7.0, 9.0, 1.0]),
            ("b", &[4], &[2.0, 2.0, 4.0, 3.0]),
        ],
        "y",
    );
    assert_values("float div", &got, &[3.5, -3.5, 2.25, 1.0 / 3.0], 1e-7);
    // element moves and negation keep working on integer inputs
    let neg = model(
        vec![
            node("n", "Neg", &["a"], &["na"]),
            node("mx", "Max", &["na", "b"], &["y"]),
        ],
        vec![],
        ab(),
        vec![out("y")],
        17,
    );
    let got = run(
        &neg,
        &[
            ("a", &[4], &[7.0, -7.0, 9.0, 1.0]),
            ("b", &[4], &[2.0, 2.0, 4.0, 3.0]),
        ],
        "y",
    );
    assert_values("max(-a, b)", &got, &[2.0, 7.0, 4.0, 3.0], 0.0);
    // constants: integer division truncates, in i64 ([7, -7, 9, 1] / [2, 2, 4, 3] as
    // onnxruntime: [3, -3, 2, 0])
    let folded = model(
        vec![
            constant("p", ints("", &[4], &[7, -7, 9, 1])),
            constant("q", ints("", &[4], &[2, 2, 4, 3])),
            node("d", "Div", &["p", "q"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    assert_values(
        "folded div",
        &run(&folded, &[], "y"),
        &[3.0, -3.0, 2.0, 0.0],
        0.0,
    );
}

// ----------------------------------------------- F7: non-finite activation coefficients

/// `LeakyRelu` with alpha NaN or ∞ and `Elu` with alpha NaN gave NaN for every element
/// (NaN·0 in the zero term of the lowering); onnxruntime gives x for x > 0. Refused, naming
/// the coefficient.
#[test]
fn non_finite_activation_coefficients_are_refused() {
    for (op, alpha, shown) in [
        ("LeakyRelu", f32::NAN, "alpha=NaN"),
        ("LeakyRelu", f32::INFINITY, "alpha=inf"),
        ("Elu", f32::NAN, "alpha=NaN"),
        ("Selu", f32::NEG_INFINITY, "alpha=-inf"),
    ] {
        let m = model(
            vec![with_float(node("act", op, &["x"], &["y"]), "alpha", alpha)],
            vec![],
            vec![vi("x", &[4], FLOAT)],
            vec![out("y")],
            17,
        );
        refused_once(&m, "act", op, &[shown, "non-finite"]);
    }
}

// -------------------------------------------------- F8, F13: GRU/LSTM activations, length 0

fn gru_model(attrs: impl Fn(NodeProto) -> NodeProto, steps: i64, direction: &str) -> ModelProto {
    let dirs = if direction == "bidirectional" { 2 } else { 1 };
    let (h, i) = (4usize, 3usize);
    let w = common::values(dirs * 3 * h * i, 1);
    let r = common::values(dirs * 3 * h * h, 2);
    let b = common::values(dirs * 6 * h, 3);
    let mut n = node("gru", "GRU", &["x", "W", "R", "B"], &["", "y"]);
    let mut d = AttributeProto::new();
    d.name = "direction".into();
    d.type_ = AttributeType::STRING.into();
    d.s = direction.as_bytes().to_vec();
    n.attribute.push(d);
    let n = with_int(attrs(n), "hidden_size", h as i64);
    let dirs = dirs as i64;
    model(
        vec![n],
        vec![
            floats("W", &[dirs, 3 * h as i64, i as i64], &w),
            floats("R", &[dirs, 3 * h as i64, h as i64], &r),
            floats("B", &[dirs, 6 * h as i64], &b),
        ],
        vec![vi("x", &[steps, 2, i as i64], FLOAT)],
        vec![out("y")],
        17,
    )
}

/// `activations` is a STRINGS attribute; it was read as INTS ("type code 8, expected INTS")
/// even when it spells out the defaults, as tf2onnx-style exporters write them
/// (onnxruntime runs both the audit's gru_act_default_named and gru_act). The defaults are
/// accepted (case-insensitively, as onnxruntime) and give the same values as no attribute;
/// other lists are refused naming them.
#[test]
fn recurrent_activations_attribute_is_read_as_strings() {
    let x = common::values(3 * 2 * 3, 9);
    let run_gru = |m: &ModelProto| run(m, &[("x", &[3, 2, 3], &x)], "y");
    let plain = run_gru(&gru_model(|n| n, 3, "forward"));
    let named = run_gru(&gru_model(
        |n| with_strings(n, "activations", &["Sigmoid", "Tanh"]),
        3,
        "forward",
    ));
    assert_values(
        "GRU with the default activations named",
        &named,
        &plain,
        0.0,
    );
    let both = run_gru(&gru_model(
        |n| with_strings(n, "activations", &["sigmoid", "TANH", "Sigmoid", "tanh"]),
        3,
        "bidirectional",
    ));
    let both_plain = run_gru(&gru_model(|n| n, 3, "bidirectional"));
    assert_values("bidirectional GRU", &both, &both_plain, 0.0);
    let other = gru_model(
        |n| with_strings(n, "activations", &["Tanh", "Tanh"]),
        3,
        "forward",
    );
    refused_once(&other, "gru", "GRU", &["\"Tanh\", \"Tanh\"", "Sigmoid"]);
    // the LSTM defaults are three per direction
    let mut lstm = node("lstm", "LSTM", &["x", "W", "R"], &["", "y"]);
    lstm = with_int(
        with_strings(lstm, "activations", &["Sigmoid", "Tanh", "Tanh"]),
        "hidden_size",
        2,
    );
    let lstm_model = model(
        vec![lstm],
        vec![
            floats("W", &[1, 8, 3], &common::values(24, 4)),
            floats("R", &[1, 8, 2], &common::values(16, 5)),
        ],
        vec![vi("x", &[3, 2, 3], FLOAT)],
        vec![out("y")],
        17,
    );
    assert!(import(&lstm_model).is_ok());
}

/// An `RNN` node (refused as an unknown operator until the forty-eighth session) against its
/// equation h' = f(x Wᵀ + Wb + h Rᵀ + Rb) evaluated here in f64, for each activation and for a
/// bidirectional node whose directions use different ones (the second runs from the last
/// step to the first). Activations outside Tanh/Relu/Sigmoid, or not one per direction, are
/// refused naming the list.
#[test]
fn rnn_follows_its_equation_with_each_activation() {
    let (steps, n, i, h) = (3usize, 2usize, 3usize, 4usize);
    let x = common::values(steps * n * i, 9);
    let rnn_model = |acts: &[&str], dirs: usize| {
        let direction = if dirs == 2 {
            "bidirectional"
        } else {
            "forward"
        };
        let mut node = node("rnn", "RNN", &["x", "W", "R", "B"], &["y"]);
        node = with_int(
            with_strings(node, "activations", acts),
            "hidden_size",
            h as i64,
        );
        let mut d = AttributeProto::new();
        d.name = "direction".into();
        d.type_ = AttributeType::STRING.into();
        d.s = direction.as_bytes().to_vec();
        node.attribute.push(d);
        let (dd, hh, ii) = (dirs as i64, h as i64, i as i64);
        model(
            vec![node],
            vec![
                floats("W", &[dd, hh, ii], &common::values(dirs * h * i, 1)),
                floats("R", &[dd, hh, hh], &common::values(dirs * h * h, 2)),
                floats("B", &[dd, 2 * hh], &common::values(dirs * 2 * h, 3)),
            ],
            vec![vi("x", &[steps as i64, n as i64, ii], FLOAT)],
            vec![out("y")],
            14,
        )
    };
    // Y [S, D, N, H] in f64 from the node's own weights
    let reference = |acts: &[&str]| -> Vec<f32> {
        let dirs = acts.len();
        let (w, r, b) = (
            common::values(dirs * h * i, 1),
            common::values(dirs * h * h, 2),
            common::values(dirs * 2 * h, 3),
        );
        let mut y = vec![0f32; steps * dirs * n * h];
        for (d, act) in acts.iter().enumerate() {
            let f = |v: f64| match *act {
                "Tanh" => v.tanh(),
                "Relu" => v.max(0.0),
                _ => 1.0 / (1.0 + (-v).exp()),
            };
            let mut state = vec![0f64; n * h];
            let order: Vec<usize> = if d == 0 {
                (0..steps).collect()
            } else {
                (0..steps).rev().collect()
            };
            for t in order {
                let mut next = vec![0f64; n * h];
                for bi in 0..n {
                    for k in 0..h {
                        let mut v = b[d * 2 * h + k] as f64 + b[d * 2 * h + h + k] as f64;
                        for j in 0..i {
                            v += x[(t * n + bi) * i + j] as f64 * w[(d * h + k) * i + j] as f64;
                        }
                        for j in 0..h {
                            v += state[bi * h + j] * r[(d * h + k) * h + j] as f64;
                        }
                        next[bi * h + k] = f(v);
                    }
                }
                state = next;
                for bi in 0..n {
                    for k in 0..h {
                        y[((t * dirs + d) * n + bi) * h + k] = state[bi * h + k] as f32;
                    }
                }
            }
        }
        y
    };
    for acts in [
        &["Tanh"][..],
        &["Relu"],
        &["sigmoid"],
        &["Relu", "Tanh"],
        &["Tanh", "Relu"],
    ] {
        let got = run(
            &rnn_model(acts, acts.len()),
            &[("x", &[steps, n, i], &x)],
            "y",
        );
        let canonical: Vec<&str> = acts
            .iter()
            .map(|a| if *a == "sigmoid" { "Sigmoid" } else { a })
            .collect();
        assert_values(&format!("RNN {acts:?}"), &got, &reference(&canonical), 1e-5);
    }
    refused_once(
        &rnn_model(&["Softsign"], 1),
        "rnn",
        "RNN",
        &["\"Softsign\"", "Tanh, Relu, Sigmoid"],
    );
    refused_once(
        &rnn_model(&["Tanh"], 2),
        "rnn",
        "RNN",
        &["one per direction (2)"],
    );
}

/// A GRU or LSTM over 0 steps reported an internal `concat` error; onnxruntime aborts the
/// process on it (the audit's gru_seq0: "terminate called without an active exception").
/// Refused with the node's name and the reason.
#[test]
fn recurrence_over_zero_steps_is_refused_readably() {
    let m = gru_model(|n| n, 0, "forward");
    refused_once(&m, "gru", "GRU", &["sequence of length 0"]);
}

// --------------------------------------------------- F10: generated constant names

/// An initializer named `onnx.const.1` (the importer's own prefix) collided with the first
/// generated constant ("parameter `onnx.const.1` is declared twice"); onnxruntime runs the
/// model. z = x · init + [1, 2, 3, 4] by the definition of Mul and Add.
#[test]
fn generated_constant_names_avoid_the_models_names() {
    let init = [2.0, -1.0, 0.5, 3.0];
    let m = model(
        vec![
            node("mul", "Mul", &["x", "onnx.const.1"], &["y"]),
            constant("onnx.const.2", floats("", &[4], &[1.0, 2.0, 3.0, 4.0])),
            node("add", "Add", &["y", "onnx.const.2"], &["z"]),
        ],
        vec![floats("onnx.const.1", &[1, 4], &init)],
        vec![vi("x", &[1, 4], FLOAT)],
        vec![out("z")],
        17,
    );
    let got = run(&m, &[("x", &[1, 4], &[1.0, 2.0, 3.0, 4.0])], "z");
    assert_values("x · init + c", &got, &[3.0, 0.0, 4.5, 16.0], 0.0);
    let imported = import(&m).unwrap();
    assert!(imported
        .graph
        .parameters
        .iter()
        .any(|p| p.name == "onnx.const.1"));
}

// ---------------------------------------------------- F12: given dims beyond i64

/// `--input-shape x=18446744073709551615,4` was reported as "negative dimension -1": the
/// given dims were cast with `as i64`. The message names the value given.
#[test]
fn a_given_dimension_beyond_i64_is_named_as_given() {
    let m = model(
        vec![node("n", "Neg", &["x"], &["y"])],
        vec![],
        vec![vi("x", &[-1, 4], FLOAT)],
        vec![out("y")],
        17,
    );
    let shapes = HashMap::from([("x".to_string(), vec![usize::MAX, 4])]);
    let e = import_model(&m, "test.onnx", &shapes)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("18446744073709551615"), "{e}");
    assert!(!e.contains("negative"), "{e}");
}

// --------------------------------------------- F13: Pad, Clip and Split messages

/// `Pad` with −2^62 at both ends reported "crops 9223372036854775807" (a saturated sum); a
/// NaN `Clip` bound printed "min=-340282350000000000000000000000000000000 max=NaN"; `Split`
/// into num_outputs=4 of a length of 5 gave parts 2, 2, 1, 0 where onnxruntime refuses
/// ("Invalid num_outputs value of 4. Split sizes would produce a negative final split"); of
/// a length of 9 onnxruntime 1.32 gives parts 3, 3, 3, 0, and so does the import.
#[test]
fn pad_clip_and_split_refusals_say_what_was_given() {
    let big = -(1i64 << 62);
    let pad = model(
        vec![node("p", "Pad", &["x", "pads"], &["y"])],
        vec![ints("pads", &[4], &[0, big, 0, big])],
        vec![vi("x", &[2, 5], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(
        &pad,
        "p",
        "Pad",
        &["crops 9223372036854775808 of the 5", "-4611686018427387904"],
    );
    let clip = model(
        vec![
            constant("hi", floats("", &[], &[f32::NAN])),
            node("c", "Clip", &["x", "", "hi"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[2, 5], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&clip, "c", "Clip", &["max bound is NaN"]);
    let split = model(
        vec![with_int(
            with_int(node("s", "Split", &["x"], &["a", "b", "c", "d"]), "axis", 1),
            "num_outputs",
            4,
        )],
        vec![],
        vec![vi("x", &[2, 5], FLOAT)],
        vec![out("a"), out("b"), out("c"), out("d")],
        18,
    );
    refused_once(&split, "s", "Split", &["num_outputs=4", "negative length"]);
    let split9 = model(
        vec![with_int(
            with_int(node("s", "Split", &["x"], &["a", "b", "c", "d"]), "axis", 1),
            "num_outputs",
            4,
        )],
        vec![],
        vec![vi("x", &[2, 9], FLOAT)],
        vec![out("a"), out("b"), out("c"), out("d")],
        18,
    );
    let graph = import(&split9).expect("4 parts of 9 import").graph;
    let widths: Vec<usize> = graph
        .outputs
        .iter()
        .map(|o| graph.nodes[o.node].shape[1])
        .collect();
    assert_eq!(widths, [3, 3, 3, 0]);
    let x: Vec<f32> = (0..18).map(|v| v as f32).collect();
    assert_eq!(
        run(&split9, &[("x", &[2, 9], &x)], "c"),
        [6.0, 7.0, 8.0, 15.0, 16.0, 17.0]
    );
}

// ------------------------------------------------------ F13: Mod of constants folded

/// `Mod` computed only from constants (PyTorch's TorchScript export of
/// `nn.TransformerEncoderLayer` has one) was refused as an unknown operator. It is evaluated
/// at import: integers with `fmod=0` take the divisor's sign, `fmod=1` the dividend's, floats
/// need `fmod=1`. NumPy: `np.mod([7, -7, 7, -7, 0, -2**63], [3, 3, -3, -3, 5, -1])` =
/// [1, 2, -2, -1, 0, 0], `np.fmod([7, -7, 7, -7, 0], [3, 3, -3, -3, 5])` = [1, -1, 1, -1, 0],
/// `np.fmod(float32([5.5, -5.5, 1]), float32([2, 2, 0]))` = [1.5, -1.5, nan].
#[test]
fn mod_of_constants_is_evaluated_at_import() {
    let fold = |a: TensorProto, b: TensorProto, fmod: i64| {
        let m = model(
            vec![
                constant("a", a),
                constant("b", b),
                with_int(node("m", "Mod", &["a", "b"], &["y"]), "fmod", fmod),
            ],
            vec![],
            vec![],
            vec![out("y")],
            17,
        );
        let imported = import(&m).unwrap_or_else(|e| panic!("importable: {e}"));
        // evaluated: the output is a stored constant, no op computes it
        assert!(imported
            .graph
            .nodes
            .iter()
            .all(|n| !matches!(n.kind, torchlean::graph::NodeKind::Op { .. })));
        run(&m, &[], "y")
    };
    let got = fold(
        ints("", &[6], &[7, -7, 7, -7, 0, i64::MIN]),
        ints("", &[6], &[3, 3, -3, -3, 5, -1]),
        0,
    );
    assert_values("fmod=0", &got, &[1.0, 2.0, -2.0, -1.0, 0.0, 0.0], 0.0);
    let got = fold(
        ints("", &[5], &[7, -7, 7, -7, 0]),
        ints("", &[5], &[3, 3, -3, -3, 5]),
        1,
    );
    assert_values("fmod=1", &got, &[1.0, -1.0, 1.0, -1.0, 0.0], 0.0);
    let got = fold(
        floats("", &[3], &[5.5, -5.5, 1.0]),
        floats("", &[1], &[2.0]),
        1,
    );
    assert_values("float fmod", &got, &[1.5, -1.5, 1.0], 0.0);
    // refused: a zero integer divisor, floats with fmod=0, a Mod of a run-time value
    let zero = model(
        vec![
            constant("a", ints("", &[1], &[3])),
            constant("b", ints("", &[1], &[0])),
            node("m", "Mod", &["a", "b"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&zero, "m", "Mod", &["by zero"]);
    let float0 = model(
        vec![
            constant("a", floats("", &[1], &[3.0])),
            constant("b", floats("", &[1], &[2.0])),
            node("m", "Mod", &["a", "b"], &["y"]),
        ],
        vec![],
        vec![],
        vec![out("y")],
        17,
    );
    refused_once(&float0, "m", "Mod", &["fmod=0"]);
    let runtime = model(
        vec![
            constant("b", floats("", &[1], &[2.0])),
            with_int(node("m", "Mod", &["x", "b"], &["y"]), "fmod", 1),
        ],
        vec![],
        vec![vi("x", &[2], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&runtime, "m", "Mod", &["computed at run time"]);
}

/// `Max`/`Min` of constants are evaluated at import too (in i64 for integers), so their
/// result can be a shape: Reshape of x [2, 6] to Max([3, 1], [1, 4]) = [3, 4].
#[test]
fn max_and_min_of_constants_are_evaluated_at_import() {
    let m = model(
        vec![
            constant("p", ints("", &[2], &[3, 1])),
            constant("q", ints("", &[2], &[1, 4])),
            node("mx", "Max", &["p", "q"], &["shape"]),
            node("r", "Reshape", &["x", "shape"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[2, 6], FLOAT)],
        vec![out("y")],
        17,
    );
    let imported = import(&m).unwrap_or_else(|e| panic!("importable: {e}"));
    let y = imported.graph.outputs[0].node;
    assert_eq!(imported.graph.nodes[y].shape, vec![3, 4]);
}

/// Integer division of constants is folded exactly (truncating); the one quotient beyond
/// int64, `i64::MIN / -1`, is refused as an overflow (it was reported as a division by
/// zero), and a zero divisor as a division by zero.
#[test]
fn integer_division_of_constants_overflows_and_divides_by_zero_readably() {
    let div = |a: i64, b: i64| {
        model(
            vec![
                constant("a", ints("", &[1], &[a])),
                constant("b", ints("", &[1], &[b])),
                node("d", "Div", &["a", "b"], &["q"]),
                with_int(node("c", "Cast", &["q"], &["y"]), "to", FLOAT as i64),
            ],
            vec![],
            vec![],
            vec![out("y")],
            17,
        )
    };
    refused_once(&div(i64::MIN, -1), "d", "Div", &["overflow"]);
    refused_once(&div(7, 0), "d", "Div", &["division by zero"]);
    assert_eq!(run(&div(-7, 2), &[], "y"), [-3.0]);
}

// ------------------------------------------------- a float Cast of an integer value is float

/// `Cast(int64 → float)` of an integer or boolean value is a float value: a masked mean
/// `(x·keep).sum(1) / keep.sum(1)` with `keep = (ids != 0).float()` runs (it was refused as
/// "Div of the integer value", the cast sharing the integer's graph node), and
/// `CastLike(0.5, ids.float())` keeps 0.5 (it was truncated to 0: `Clip` then clamped at 0,
/// silently; onnxruntime 1.32 gives the values below). An audit of the forty-fourth session.
#[test]
fn a_float_cast_of_an_integer_value_computes_in_float() {
    const BOOL: i32 = 9;
    // masked mean over the last axis: rows [1, 2, 3] with ids [5, 0, 7] → (1 + 3) / 2 = 2,
    // and [4, 5, 6] with ids [0, 0, 9] → 6
    let masked_mean = model(
        vec![
            constant("zero", ints("", &[], &[0])),
            node("ne0", "Equal", &["ids", "zero"], &["eq"]),
            node("not", "Not", &["eq"], &["keep_b"]),
            with_int(
                node("c", "Cast", &["keep_b"], &["keep"]),
                "to",
                FLOAT as i64,
            ),
            node("m", "Mul", &["x", "keep"], &["xk"]),
            with_int(
                node("s1", "ReduceSum", &["xk", "ax"], &["num"]),
                "keepdims",
                0,
            ),
            with_int(
                node("s2", "ReduceSum", &["keep", "ax"], &["den"]),
                "keepdims",
                0,
            ),
            node("d", "Div", &["num", "den"], &["y"]),
        ],
        vec![ints("ax", &[1], &[1])],
        vec![vi("x", &[2, 3], FLOAT), vi("ids", &[2, 3], INT64)],
        vec![out("y")],
        17,
    );
    let y = run(
        &masked_mean,
        &[
            ("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            ("ids", &[2, 3], &[5.0, 0.0, 7.0, 0.0, 0.0, 9.0]),
        ],
        "y",
    );
    assert_values("masked mean", &y, &[2.0, 6.0], 1e-6);
    // CastLike of a float scalar to a float cast of int64 ids: Clip, Max and Where keep it
    let ids: &[f32] = &[0.0, 1.0, 2.0, -1.0, 5.0, 3.0];
    let mask: &[f32] = &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
    for (op, scalar, want) in [
        ("Clip", 0.5f32, [0.5f32, 1.0, 2.0, 0.5, 5.0, 3.0]),
        ("Max", 2.75, [2.75, 2.75, 2.75, 2.75, 5.0, 3.0]),
        ("Min", 2.75, [0.0, 1.0, 2.0, -1.0, 2.75, 2.75]),
        ("Where", 0.5, [0.0, 0.5, 2.0, 0.5, 0.5, 3.0]),
    ] {
        let last = match op {
            "Where" => node("w", "Where", &["m", "idsf", "c2"], &["y"]),
            _ => node("w", op, &["idsf", "c2"], &["y"]),
        };
        let m = model(
            vec![
                with_int(node("c", "Cast", &["ids"], &["idsf"]), "to", FLOAT as i64),
                constant("s", floats("", &[], &[scalar])),
                node("cl", "CastLike", &["s", "idsf"], &["c2"]),
                last,
            ],
            vec![],
            if op == "Where" {
                vec![vi("ids", &[2, 3], INT64), vi("m", &[2, 3], BOOL)]
            } else {
                vec![vi("ids", &[2, 3], INT64)]
            },
            vec![out("y")],
            18,
        );
        let mut inputs: Vec<(&str, &[usize], &[f32])> = vec![("ids", &[2, 3], ids)];
        if op == "Where" {
            inputs.push(("m", &[2, 3], mask));
        }
        assert_values(op, &run(&m, &inputs, "y"), &want, 0.0);
    }
}

// ------------------------------ forty-eighth session: If on constants, scatters, OneHot

/// An `If` node with `then` and `else` branches each computing `x · factor` (a branch reads
/// the outer scope's `x`, as exporters' branches do).
fn if_model(
    cond: NodeProto,
    then_factor: f32,
    else_factor: f32,
    inputs: Vec<ValueInfoProto>,
) -> ModelProto {
    let branch = |name: &str, factor: f32| {
        let mut g = onnx_protobuf::GraphProto::new();
        g.name = name.into();
        g.node = vec![
            constant(&format!("{name}_k"), floats("", &[], &[factor])),
            node(
                &format!("{name}_mul"),
                "Mul",
                &["x", &format!("{name}_k")],
                &[&format!("{name}_y")],
            ),
        ];
        g.output = vec![out(&format!("{name}_y"))];
        let mut a = AttributeProto::new();
        a.name = format!("{name}_branch");
        a.type_ = AttributeType::GRAPH.into();
        a.g = Some(g).into();
        a
    };
    let mut iff = node("choice", "If", &["c"], &["y"]);
    iff.attribute = vec![branch("then", then_factor), branch("else", else_factor)];
    model(vec![cond, iff], vec![], inputs, vec![out("y")], 17)
}

/// PyTorch's exporter writes `If` nodes over shapes (`Tensor.tile`, `diagonal`): an `If`
/// whose condition is known at import is its chosen branch (was: refused as an unknown
/// operator); one on a value computed at run time is refused as control flow.
#[test]
fn an_if_on_a_constant_is_its_branch_and_one_on_a_computed_value_is_refused() {
    let x = [1.0f32, -2.0, 3.0];
    for (truth, factor) in [(1, 10.0f32), (0, -0.5)] {
        let cond = constant("c", {
            let mut t = ints("", &[], &[truth]);
            t.data_type = 9; // BOOL
            t.int32_data = vec![truth as i32];
            t.int64_data.clear();
            t
        });
        let m = if_model(cond, 10.0, -0.5, vec![vi("x", &[3], FLOAT)]);
        let got = run(&m, &[("x", &[3], &x)], "y");
        let want: Vec<f32> = x.iter().map(|v| v * factor).collect();
        assert_values(&format!("If({truth})"), &got, &want, 0.0);
    }
    let computed = node("gt", "Greater", &["x", "zero"], &["c0"]);
    let mut m = if_model(computed, 1.0, 2.0, vec![vi("x", &[3], FLOAT)]);
    m.graph.as_mut().unwrap().node[1].input = vec!["c0".into()];
    m.graph
        .as_mut()
        .unwrap()
        .initializer
        .push(floats("zero", &[], &[0.0]));
    refused_once(
        &m,
        "choice",
        "If",
        &["computed at run time", "control flow"],
    );
    // a condition held by a bool initializer is known at import too (it was reported as
    // computed at run time)
    let mut init = if_model(
        node("n", "Identity", &["x"], &["unused"]),
        3.0,
        5.0,
        vec![vi("x", &[3], FLOAT)],
    );
    let g = init.graph.as_mut().unwrap();
    g.node.remove(0);
    let mut t = ints("c", &[], &[0]);
    t.data_type = 9; // BOOL
    t.int32_data = vec![0];
    t.int64_data.clear();
    g.initializer.push(t);
    let got = run(&init, &[("x", &[3], &x)], "y");
    let want: Vec<f32> = x.iter().map(|v| v * 5.0).collect();
    assert_values("If(initializer false)", &got, &want, 0.0);
}

/// `OneHot` against ONNX's definition: index i sets position i (negative counted from the
/// end), an index outside [-depth, depth) gives a row of the off value; the values' order is
/// [off, on]. A replacing ScatterND that writes a row twice, and a replacing ScatterElements
/// with indices computed at run time, are refused (ONNX leaves duplicates undefined; PyTorch's
/// exporter writes `index_put(accumulate=True)` with repeated indices as such a ScatterND).
#[test]
fn one_hot_follows_onnx_and_ambiguous_scatters_are_refused() {
    let idx = [0.0f32, 3.0, -1.0, 4.0, -5.0, 2.0];
    let m = model(
        vec![node("oh", "OneHot", &["i", "depth", "vals"], &["y"])],
        vec![ints("depth", &[], &[4]), floats("vals", &[2], &[-1.0, 7.0])],
        vec![vi("i", &[6], INT64)],
        vec![out("y")],
        17,
    );
    let got = run(&m, &[("i", &[6], &idx)], "y");
    let mut want = vec![-1.0f32; 6 * 4];
    for (r, &i) in idx.iter().enumerate() {
        let i = i as i64;
        if (-4..4).contains(&i) {
            want[r * 4 + i.rem_euclid(4) as usize] = 7.0;
        }
    }
    assert_values("OneHot", &got, &want, 0.0);
    let dup = model(
        vec![node("s", "ScatterND", &["x", "at", "u"], &["y"])],
        vec![ints("at", &[2, 1], &[1, 1])],
        vec![vi("x", &[3, 2], FLOAT), vi("u", &[2, 2], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&dup, "s", "ScatterND", &["row 1", "twice"]);
    let runtime = model(
        vec![with_int(
            node("s", "ScatterElements", &["x", "at", "u"], &["y"]),
            "axis",
            1,
        )],
        vec![],
        vec![
            vi("x", &[2, 3], FLOAT),
            vi("at", &[2, 1], INT64),
            vi("u", &[2, 1], FLOAT),
        ],
        vec![out("y")],
        17,
    );
    refused_once(&runtime, "s", "ScatterElements", &["known at import"]);
    // float indices known at import are cast to int64 (truncated) as ONNX says, and integer
    // values beyond 2^24 refused (float32 would round them; a review of the session)
    let float_idx = model(
        vec![node("oh", "OneHot", &["i", "depth", "vals"], &["y"])],
        vec![
            floats("i", &[3], &[1.5, 0.0, -1.2]),
            floats("depth", &[], &[3.0]),
            floats("vals", &[2], &[0.0, 1.0]),
        ],
        vec![],
        vec![out("y")],
        17,
    );
    let got = run(&float_idx, &[], "y");
    assert_values(
        "OneHot of float indices",
        &got,
        &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        0.0,
    );
    let big = model(
        vec![node("oh", "OneHot", &["i", "depth", "vals"], &["y"])],
        vec![
            ints("depth", &[], &[3]),
            ints("vals", &[2], &[0, 16_777_217]),
        ],
        vec![vi("i", &[2], INT64)],
        vec![out("y")],
        17,
    );
    refused_once(&big, "oh", "OneHot", &["16777217", "beyond 2^24"]);
    // a replacing ScatterND over 2^31 − 1 (empty) rows: refused before its index list is
    // built (it allocated 16 GB and aborted)
    let huge = model(
        vec![node("s", "ScatterND", &["x", "at", "u"], &["y"])],
        vec![ints("at", &[1, 1], &[0])],
        vec![vi("x", &[2_147_483_647, 0], FLOAT), vi("u", &[1, 0], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&huge, "s", "ScatterND", &["at most 2^24"]);
    // indices wider than the data off the axis: refused by shape, not a panic
    let wide = model(
        vec![node("s", "ScatterElements", &["x", "at", "u"], &["y"])],
        vec![ints("at", &[1, 5], &[0, 0, 0, 0, 0])],
        vec![vi("x", &[2, 3], FLOAT), vi("u", &[1, 5], FLOAT)],
        vec![out("y")],
        17,
    );
    refused_once(&wide, "s", "ScatterElements", &["no larger extents"]);
}

/// AveragePool whose divisor torchlean's op cannot give — `ceil_mode` partial windows (with
/// and without counting the pads) and pads that differ between the ends without counting
/// them — against the definition evaluated here in f64: each window's sum over the input's
/// positions, divided by the count of the input's positions in it, plus the declared pads'
/// with `count_include_pad` (PyTorch's and onnxruntime's divisor). Refused until the
/// forty-eighth session.
#[test]
fn average_pools_with_partial_windows_divide_as_pytorch() {
    let (h, w) = (5usize, 6usize);
    let x = common::values(h * w, 21);
    // (kernel, stride, pads [top, left, bottom, right], ceil, count_include_pad)
    let cases = [
        (3usize, 2usize, [1usize, 1, 1, 1], true, false),
        (3, 2, [1, 1, 1, 1], true, true),
        (2, 2, [0, 0, 0, 0], true, false),
        (3, 1, [0, 1, 1, 0], false, false),
    ];
    for (k, s, pads, ceil, cip) in cases {
        let mut n = node("p", "AveragePool", &["x"], &["y"]);
        n = with_ints(n, "kernel_shape", &[k as i64, k as i64]);
        n = with_ints(n, "strides", &[s as i64, s as i64]);
        n = with_ints(n, "pads", &pads.map(|p| p as i64));
        n = with_int(
            with_int(n, "ceil_mode", ceil as i64),
            "count_include_pad",
            cip as i64,
        );
        let m = model(
            vec![n],
            vec![],
            vec![vi("x", &[1, 1, h as i64, w as i64], FLOAT)],
            vec![out("y")],
            17,
        );
        let got = run(&m, &[("x", &[1, 1, h, w], &x)], "y");
        // per axis: the output count and each window's [start, end) in the padded frame
        let outs = |size: usize, lo: usize, hi: usize| {
            let span = size + lo + hi;
            let n = if ceil {
                (span - k).div_ceil(s) + 1
            } else {
                (span - k) / s + 1
            };
            // the last window starts inside the input or its begin padding
            if ceil && (n - 1) * s >= size + lo {
                n - 1
            } else {
                n
            }
        };
        let (oh, ow) = (outs(h, pads[0], pads[2]), outs(w, pads[1], pads[3]));
        let mut want = vec![];
        for i in 0..oh {
            for j in 0..ow {
                let (mut sum, mut count) = (0f64, 0usize);
                for a in i * s..i * s + k {
                    for b in j * s..j * s + k {
                        let inside_h = a >= pads[0] && a < pads[0] + h;
                        let inside_w = b >= pads[1] && b < pads[1] + w;
                        if inside_h && inside_w {
                            sum += x[(a - pads[0]) * w + (b - pads[1])] as f64;
                        }
                        let counted = if cip {
                            a < pads[0] + h + pads[2] && b < pads[1] + w + pads[3]
                        } else {
                            inside_h && inside_w
                        };
                        count += counted as usize;
                    }
                }
                want.push((sum / count as f64) as f32);
            }
        }
        assert_values(
            &format!("AveragePool k{k} s{s} pads {pads:?} ceil {ceil} cip {cip}"),
            &got,
            &want,
            2e-6,
        );
    }
}

/// `SplitToSequence` + `SequenceAt` (what the dynamo exporter writes for `split`/`chunk`
/// without its optimizer; refused as unknown operators until the forty-eighth session): a
/// scalar split makes parts of that size (the last shorter), no split one part per element
/// (`keepdims=0` removes the axis); positions count from the end when negative.
#[test]
fn split_to_sequence_parts_are_read_by_position() {
    let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
    let m = model(
        vec![
            with_int(
                node("s", "SplitToSequence", &["x", "two"], &["seq"]),
                "axis",
                1,
            ),
            node("a", "SequenceAt", &["seq", "last"], &["tail"]),
            node("b", "SequenceAt", &["seq", "first"], &["head"]),
            with_int(
                with_int(node("e", "SplitToSequence", &["x"], &["rows"]), "axis", 0),
                "keepdims",
                0,
            ),
            node("c", "SequenceAt", &["rows", "first"], &["row0"]),
        ],
        vec![
            ints("two", &[], &[2]),
            ints("last", &[], &[-1]),
            ints("first", &[], &[0]),
        ],
        vec![vi("x", &[2, 5], FLOAT)],
        vec![out("tail"), out("head"), out("row0")],
        18,
    );
    let imported = import(&m).unwrap_or_else(|e| panic!("importable: {e}"));
    let inputs = vec![("x".to_string(), Tensor::from_vec(x, &[2, 5]).unwrap())];
    let profile = BackendProfile::named("checked_cpu").unwrap();
    let outs = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
    // x = [[0..5], [5..10]]: parts of 2 along axis 1 are [0,1|5,6], [2,3|7,8], [4|9]
    assert_eq!(outs["tail"].shape(), &[2, 1]);
    assert_eq!(outs["tail"].to_vec(), vec![4.0, 9.0]);
    assert_eq!(outs["head"].to_vec(), vec![0.0, 1.0, 5.0, 6.0]);
    assert_eq!(outs["row0"].shape(), &[5]);
    assert_eq!(outs["row0"].to_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0]);
    // a position past the end is refused, naming it
    let mut bad = m.clone();
    bad.graph.as_mut().unwrap().initializer[1] = ints("last", &[], &[3]);
    refused_once(&bad, "a", "SequenceAt", &["position 3", "3 tensors"]);
}

/// `Sign` and `Clip` of constants are evaluated at import, so that index arithmetic on
/// constants stays constant: the dynamo exporter computes `AdaptiveAvgPool`'s windows and 1-D
/// interpolation's source positions that way, and the `GatherND` reading them was refused as
/// reading indices computed at run time (the forty-eighth session's audit).
#[test]
fn sign_and_clip_of_constants_keep_indices_constant() {
    let m = model(
        vec![
            constant("k", floats("", &[3], &[-1.5, 5.0, 2.0])),
            constant("lo", floats("", &[], &[0.0])),
            constant("hi", floats("", &[], &[3.0])),
            node("c", "Clip", &["k", "lo", "hi"], &["kc"]),
            node("s", "Sign", &["k"], &["ks"]),
            node("a", "Add", &["kc", "ks"], &["pos"]),
            with_int(node("i", "Cast", &["pos"], &["ip"]), "to", INT64 as i64),
            constant("ax", ints("", &[1], &[-1])),
            node("u", "Unsqueeze", &["ip", "ax"], &["idx"]),
            node("g", "GatherND", &["x", "idx"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[5], FLOAT)],
        vec![out("y")],
        17,
    );
    // clip → [0, 3, 2]; sign → [-1, 1, 1]; positions [-1, 4, 3]: x[-1] = x[4], x[4], x[3]
    let x = [10.0f32, 11.0, 12.0, 13.0, 14.0];
    let got = run(&m, &[("x", &[5], &x)], "y");
    assert_values(
        "GatherND at constant positions",
        &got,
        &[14.0, 14.0, 13.0],
        0.0,
    );
}

/// `GatherND` with integer indices computed at run time (`x[idx]`, `logits[arange(B), labels]`;
/// refused before the forty-eighth session): negative indices count from the end of their own
/// axis, and an index past its axis is an error at run time — never another element's row
/// (index 4 on an axis of 4 would otherwise read the next row's first element).
#[test]
fn gather_nd_reads_run_time_indices_per_axis() {
    let m = model(
        vec![node("g", "GatherND", &["x", "i"], &["y"])],
        vec![],
        vec![vi("x", &[3, 4], FLOAT), vi("i", &[2, 2], INT64)],
        vec![out("y")],
        17,
    );
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let got = run(
        &m,
        &[("x", &[3, 4], &x), ("i", &[2, 2], &[0.0, -1.0, 2.0, 1.0])],
        "y",
    );
    assert_values("GatherND at run time", &got, &[3.0, 9.0], 0.0);
    let imported = import(&m).unwrap();
    let inputs = vec![
        ("x".to_string(), Tensor::from_vec(x, &[3, 4]).unwrap()),
        (
            "i".to_string(),
            Tensor::from_vec(vec![0.0, 4.0, 1.0, 0.0], &[2, 2]).unwrap(),
        ),
    ];
    let profile = BackendProfile::named("checked_cpu").unwrap();
    let e = run_graph(imported.graph, &imported.values, &inputs, &profile, false)
        .expect_err("an index past its axis is refused");
    assert!(e.to_string().contains("invalid index value 4"), "{e}");
}

/// Run-time integer indices of `Gather` and `GatherElements` count from the end when
/// negative, as ONNX says (`x[-1]` of computed positions; the kernel refused them before the
/// forty-eighth session); one below −n is still refused.
#[test]
fn run_time_gather_indices_count_negative_ones_from_the_end() {
    let x: Vec<f32> = (0..20).map(|v| v as f32).collect();
    let gather = model(
        vec![with_int(
            node("g", "Gather", &["x", "i"], &["y"]),
            "axis",
            0,
        )],
        vec![],
        vec![vi("x", &[4, 5], FLOAT), vi("i", &[2], INT64)],
        vec![out("y")],
        17,
    );
    let got = run(
        &gather,
        &[("x", &[4, 5], &x), ("i", &[2], &[-1.0, 0.0])],
        "y",
    );
    let want: Vec<f32> = (15..20).chain(0..5).map(|v| v as f32).collect();
    assert_values("Gather at -1, 0", &got, &want, 0.0);
    let elements = model(
        vec![with_int(
            node("g", "GatherElements", &["x", "i"], &["y"]),
            "axis",
            1,
        )],
        vec![],
        vec![vi("x", &[4, 5], FLOAT), vi("i", &[4, 1], INT64)],
        vec![out("y")],
        17,
    );
    let got = run(
        &elements,
        &[("x", &[4, 5], &x), ("i", &[4, 1], &[-1.0, 0.0, -5.0, 2.0])],
        "y",
    );
    assert_values("GatherElements", &got, &[4.0, 5.0, 10.0, 17.0], 0.0);
    let imported = import(&gather).unwrap();
    let inputs = vec![
        ("x".to_string(), Tensor::from_vec(x, &[4, 5]).unwrap()),
        (
            "i".to_string(),
            Tensor::from_vec(vec![-5.0, 0.0], &[2]).unwrap(),
        ),
    ];
    let profile = BackendProfile::named("checked_cpu").unwrap();
    run_graph(imported.graph, &imported.values, &inputs, &profile, false)
        .expect_err("an index below -n is refused");
}

/// Float arithmetic the import evaluates on constants (here `y = x + sqrt(exp(c))`) is
/// listed by operator in `Imported::evaluated_at_import` — it runs before any plan, so a
/// run's report says it apart (the trust audit: a strict run reported only the `add`) —
/// while exact moves and shape arithmetic on constants (`Reshape` of a constant by a shape,
/// `Neg`) are not, and a model without folding lists nothing.
#[test]
fn float_arithmetic_evaluated_at_import_is_listed_by_operator() {
    let m = model(
        vec![
            constant("c", floats("c", &[3], &[0.5, 1.0, 2.0])),
            node("e", "Exp", &["c"], &["ce"]),
            node("s", "Sqrt", &["ce"], &["cs"]),
            node("n", "Neg", &["cs"], &["cn"]),
            constant("shape", ints("shape", &[2], &[1, 3])),
            node("r", "Reshape", &["cn", "shape"], &["cr"]),
            node("a", "Add", &["x", "cr"], &["y"]),
        ],
        vec![],
        vec![vi("x", &[2, 3], FLOAT)],
        vec![vi("y", &[2, 3], FLOAT)],
        17,
    );
    let imported = import(&m).expect("imports");
    assert_eq!(
        imported.evaluated_at_import,
        vec![("Exp".to_string(), 1), ("Sqrt".to_string(), 1)]
    );
    // the values are the constants' f32 arithmetic: y = x − sqrt(exp(c))
    let x = Tensor::from_vec(vec![0.0; 6], &[2, 3]).unwrap();
    let profile = BackendProfile::named("strict_cpu").unwrap();
    let inputs = [("x".to_string(), x)];
    let outs = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
    let y = outs["y"].data();
    for (i, c) in [0.5f32, 1.0, 2.0].iter().enumerate() {
        assert_eq!(y[i], -(c.exp().sqrt()), "{y:?}");
    }
    let plain = model(
        vec![node("a", "Add", &["x", "x"], &["y"])],
        vec![],
        vec![vi("x", &[2, 3], FLOAT)],
        vec![vi("y", &[2, 3], FLOAT)],
        17,
    );
    assert!(import(&plain)
        .expect("imports")
        .evaluated_at_import
        .is_empty());
}
