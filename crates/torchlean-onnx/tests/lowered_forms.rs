//! Operator forms the import lowers onto other ops — `Pad` in `reflect`/`edge`/`wrap` mode
//! and `Slice` steps (an index list read by `index_select`), windows whose pads differ between
//! the ends (`auto_pad` SAME_UPPER/SAME_LOWER, explicit asymmetric pads, `ceil_mode`: the op's
//! symmetric padding plus constant blocks, or a slice of a transposed convolution's output),
//! GELU's tanh form (op by op), a reduction of a 0-d value and shape arithmetic on integer
//! initializers — checked against an independent engine (tract) on the same model file, and
//! their gradients against central differences of tract's outputs (these maps are linear or
//! piecewise linear in the input, so the differences are exact up to rounding).

mod common;

use common::*;
use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto, Message, NodeProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;

fn with_string(mut n: NodeProto, name: &str, v: &str) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRING.into();
    a.s = v.as_bytes().to_vec();
    n.attribute.push(a);
    n
}

/// One case: nodes reading the input `x` of `dims` and writing `y`, with initializers.
struct Case {
    what: &'static str,
    nodes: Vec<NodeProto>,
    inits: Vec<onnx_protobuf::TensorProto>,
    dims: Vec<usize>,
    opset: i64,
}

fn case(
    what: &'static str,
    nodes: Vec<NodeProto>,
    inits: Vec<onnx_protobuf::TensorProto>,
    dims: &[usize],
    opset: i64,
) -> Case {
    Case {
        what,
        nodes,
        inits,
        dims: dims.to_vec(),
        opset,
    }
}

/// A declared float value of unstated shape (torchlean infers it, tract too).
fn open(name: &str) -> onnx_protobuf::ValueInfoProto {
    let mut v = value_info(name, &[], FLOAT);
    if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) =
        v.type_.mut_or_insert_default().value.as_mut()
    {
        t.shape = None.into();
    }
    v
}

/// The model of `c`; with `with_loss`, also `loss = ReduceSum(y · cot)`, `cot` a second input.
fn build(c: &Case, with_loss: bool) -> onnx_protobuf::ModelProto {
    let dims: Vec<i64> = c.dims.iter().map(|&d| d as i64).collect();
    let mut nodes = c.nodes.clone();
    let mut inputs = vec![value_info("x", &dims, FLOAT)];
    let mut outputs = vec![open("y")];
    if with_loss {
        inputs.push(open("cot"));
        nodes.push(node("yc", "Mul", &["y", "cot"], &["yc"]));
        nodes.push(with_int(
            node("loss", "ReduceSum", &["yc"], &["loss"]),
            "keepdims",
            0,
        ));
        outputs.push(open("loss"));
    }
    model(nodes, c.inits.clone(), inputs, outputs, c.opset)
}

fn tract_y(c: &Case, x: &Tensor, dir: &std::path::Path) -> Vec<f32> {
    let path = dir.join(format!("{}.onnx", c.what.replace([' ', '/'], "_")));
    std::fs::write(&path, build(c, false).write_to_bytes().unwrap()).unwrap();
    tract_run(&path, &[("x".into(), x.clone())]).remove(0)
}

/// Each case's `y` against tract's on the same model file, and the gradient of
/// `Σ y · cot` along a direction against central differences of tract's outputs.
fn agree_with_tract(cases: &[Case], dir: &std::path::Path) {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    for c in cases {
        let x = Tensor::from_vec(values(c.dims.iter().product(), 7), &c.dims).unwrap();
        let want = tract_y(c, &x, dir);
        let ny = want.len();
        let cot = values(ny, 11);
        // the shape torchlean infers for y (its element count must be tract's)
        let y_shape = {
            let plain = torchlean_onnx::import_model(&build(c, false), c.what, &HashMap::new())
                .unwrap_or_else(|e| panic!("{}: {e}", c.what));
            let out = run_graph(
                plain.graph,
                &plain.values,
                &[("x".into(), x.clone())],
                &profile,
                false,
            )
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
            out["y"].shape().to_vec()
        };
        let shapes = HashMap::from([("cot".to_string(), y_shape.clone())]);
        let imported = torchlean_onnx::import_model(&build(c, true), c.what, &shapes)
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let cot_t = Tensor::from_vec(cot.clone(), &y_shape).unwrap();
        let out = run_graph(
            imported.graph,
            &imported.values,
            &[("x".into(), x.clone()), ("cot".into(), cot_t)],
            &profile,
            true,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        assert_close(c.what, &out["y"].to_vec(), &want, 1e-5);
        // the gradient along a direction u against (L(x + hu) − L(x − hu)) / 2h by tract
        let u = values(x.numel(), 13);
        let grad = out["grad.x"].to_vec();
        let along: f64 = grad
            .iter()
            .zip(&u)
            .map(|(g, u)| *g as f64 * *u as f64)
            .sum();
        let h = 1e-3f32;
        let shifted = |sign: f32| {
            let xs: Vec<f32> = x
                .to_vec()
                .iter()
                .zip(&u)
                .map(|(a, b)| a + sign * h * b)
                .collect();
            let xs = Tensor::from_vec(xs, &c.dims).unwrap();
            let y = tract_y(c, &xs, dir);
            y.iter()
                .zip(&cot)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
        };
        let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * h as f64);
        let mag: f64 = grad
            .iter()
            .zip(&u)
            .map(|(g, u)| (*g as f64 * *u as f64).abs())
            .sum();
        assert!(
            (along - fd).abs() <= 1e-3 * mag.max(1.0),
            "{}: gradient along u {along}, finite differences {fd}",
            c.what
        );
    }
}

#[test]
fn lowered_forms_agree_with_tract_values_and_gradients() {
    let dir = std::env::temp_dir().join(format!("torchlean-lowered-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pad = |mode: &str, pads: &[i64], dims: &[usize]| {
        let n = with_string(node("p", "Pad", &["x", "pads"], &["y"]), "mode", mode);
        case(
            "pad",
            vec![n],
            vec![ints("pads", &[pads.len() as i64], pads)],
            dims,
            13,
        )
    };
    let slice = |what, starts: &[i64], ends: &[i64], axes: &[i64], steps: &[i64]| {
        let k = starts.len() as i64;
        case(
            what,
            vec![node("s", "Slice", &["x", "st", "en", "ax", "sp"], &["y"])],
            vec![
                ints("st", &[k], starts),
                ints("en", &[k], ends),
                ints("ax", &[k], axes),
                ints("sp", &[k], steps),
            ],
            &[5, 7],
            13,
        )
    };
    let conv = |what, attrs: Vec<(&str, Vec<i64>)>, auto_pad: Option<&str>, k: [i64; 2]| {
        let mut n = node("c", "Conv", &["x", "w", "b"], &["y"]);
        for (name, v) in attrs {
            n = with_ints(n, name, &v);
        }
        if let Some(a) = auto_pad {
            n = with_string(n, "auto_pad", a);
        }
        let w = values((4 * 3 * k[0] * k[1]) as usize, 3);
        case(
            what,
            vec![n],
            vec![
                floats("w", &[4, 3, k[0], k[1]], &w),
                floats("b", &[4], &values(4, 4)),
            ],
            &[2, 3, 7, 6],
            17,
        )
    };
    let pool = |what,
                op: &str,
                attrs: Vec<(&str, Vec<i64>)>,
                ints_: Vec<(&str, i64)>,
                auto_pad: Option<&str>| {
        let mut n = node("p", op, &["x"], &["y"]);
        for (name, v) in attrs {
            n = with_ints(n, name, &v);
        }
        for (name, v) in ints_ {
            n = with_int(n, name, v);
        }
        if let Some(a) = auto_pad {
            n = with_string(n, "auto_pad", a);
        }
        case(what, vec![n], vec![], &[2, 3, 7, 8], 17)
    };
    let cases = vec![
        pad("reflect", &[1, 2, 3, 1], &[4, 5]),
        pad("edge", &[2, 0, 1, 3], &[4, 5]),
        pad("reflect", &[0, 0, 2, 1, 0, 0, 1, 2], &[2, 3, 4, 5]),
        pad("edge", &[0, 0, 3, 0, 0, 0, 0, 2], &[2, 3, 1, 5]),
        slice("slice step 2", &[0], &[7], &[1], &[2]),
        slice("slice reversed", &[-1], &[i64::MIN], &[1], &[-1]),
        slice("slice two axes", &[4, 1], &[0, 7], &[0, 1], &[-2, 3]),
        conv("conv same_upper", vec![], Some("SAME_UPPER"), [3, 2]),
        conv(
            "conv same_lower",
            vec![("strides", vec![2, 2])],
            Some("SAME_LOWER"),
            [4, 3],
        ),
        conv(
            "conv asymmetric pads",
            vec![("pads", vec![0, 2, 1, 0])],
            None,
            [3, 3],
        ),
        pool(
            "maxpool ceil_mode",
            "MaxPool",
            vec![("kernel_shape", vec![3, 3]), ("strides", vec![2, 2])],
            vec![("ceil_mode", 1)],
            None,
        ),
        pool(
            "maxpool same_upper",
            "MaxPool",
            vec![("kernel_shape", vec![2, 3]), ("strides", vec![2, 2])],
            vec![],
            Some("SAME_UPPER"),
        ),
        pool(
            "avgpool asymmetric, counting the padding",
            "AveragePool",
            vec![("kernel_shape", vec![3, 3]), ("pads", vec![1, 0, 0, 2])],
            vec![("count_include_pad", 1)],
            None,
        ),
        {
            let n = with_ints(
                with_ints(
                    node("t", "ConvTranspose", &["x", "w"], &["y"]),
                    "strides",
                    &[2, 2],
                ),
                "pads",
                &[0, 1, 1, 2],
            );
            case(
                "conv_transpose asymmetric pads",
                vec![n],
                vec![floats("w", &[3, 2, 3, 3], &values(54, 5))],
                &[2, 3, 4, 5],
                17,
            )
        },
        // ReduceProd of constants, evaluated at import: the legacy exporter's element
        // count for `torch.var` (Shape → Gather → ReduceProd → Cast → Div), with the axes
        // as an attribute (opset 17) and as an input (opset 18); and an integer constant's
        // product along one axis, kept as an axis of length 1
        case(
            "reduce_prod of a shape",
            vec![
                node("s", "Shape", &["x"], &["s"]),
                node("g", "Gather", &["s", "last2"], &["g"]),
                with_int(node("p", "ReduceProd", &["g"], &["n"]), "keepdims", 0),
                with_int(node("c", "Cast", &["n"], &["nf"]), "to", FLOAT as i64),
                node("d", "Div", &["x", "nf"], &["y"]),
            ],
            vec![ints("last2", &[2], &[1, 2])],
            &[2, 3, 4],
            17,
        ),
        case(
            "reduce_prod with axes as an input",
            vec![
                node("p", "ReduceProd", &["k", "ax"], &["kp"]),
                with_int(node("c", "Cast", &["kp"], &["kf"]), "to", FLOAT as i64),
                node("a", "Add", &["x", "kf"], &["y"]),
            ],
            vec![
                ints("k", &[2, 3], &[5, -2, 3, 7, 1, -1]),
                ints("ax", &[1], &[-1]),
            ],
            &[2, 4],
            18,
        ),
    ];
    agree_with_tract(&cases, &dir);
    std::fs::remove_dir_all(&dir).ok();
}

/// `Gelu(approximate="tanh")` (opset 20) against its definition in f64,
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))); a reduction of a 0-d value is the value; a
/// reshape target computed from `Shape` and an integer initializer (`[-1]`, as exporters
/// store it) folds at import.
#[test]
fn gelu_tanh_zero_rank_reductions_and_integer_initializers() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let run = |c: &Case, x: &Tensor| {
        let m = torchlean_onnx::import_model(&build(c, false), c.what, &HashMap::new())
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        run_graph(
            m.graph,
            &m.values,
            &[("x".into(), x.clone())],
            &profile,
            false,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.what))
        .remove("y")
        .unwrap()
    };
    let gelu = case(
        "gelu tanh",
        vec![with_string(
            node("g", "Gelu", &["x"], &["y"]),
            "approximate",
            "tanh",
        )],
        vec![],
        &[4, 50],
        20,
    );
    let x: Vec<f32> = values(200, 21).iter().map(|v| v * 6.0).collect();
    let y = run(&gelu, &Tensor::from_vec(x.clone(), &[4, 50]).unwrap()).to_vec();
    let want: Vec<f32> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            let k = (2.0 / std::f64::consts::PI).sqrt();
            (0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh())) as f32
        })
        .collect();
    assert_close("gelu tanh", &y, &want, 1e-6);

    for (op, opset) in [("ReduceSum", 13), ("ReduceMean", 17)] {
        let c = case(
            "0-d",
            vec![node("r", op, &["x"], &["y"])],
            vec![],
            &[],
            opset,
        );
        let y = run(&c, &Tensor::from_vec(vec![-2.5], &[]).unwrap());
        assert_eq!(
            (y.shape().to_vec(), y.to_vec()),
            (vec![], vec![-2.5]),
            "{op}"
        );
    }

    let c = case(
        "shape arithmetic",
        vec![
            node("s", "Shape", &["x"], &["s"]),
            node("g", "Gather", &["s", "zero"], &["b"]),
            node("u", "Unsqueeze", &["b", "ax"], &["b1"]),
            with_int(node("c", "Concat", &["b1", "minus1"], &["ns"]), "axis", 0),
            node("r", "Reshape", &["x", "ns"], &["y"]),
        ],
        vec![
            ints("zero", &[], &[0]),
            ints("ax", &[1], &[0]),
            ints("minus1", &[1], &[-1]),
        ],
        &[2, 3, 4],
        17,
    );
    let y = run(&c, &Tensor::from_vec(values(24, 1), &[2, 3, 4]).unwrap());
    assert_eq!(y.shape(), &[2, 12]);
}

/// The activations, norm reductions, instance norm and resizes the import writes with other
/// ops (import/composite.rs, import/resize.rs) against tract, values and gradients.
#[test]
fn composite_operators_agree_with_tract_values_and_gradients() {
    let dir = std::env::temp_dir().join(format!("torchlean-composite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unary = |what: &'static str, op: &str, floats_: Vec<(&str, f32)>, opset| {
        let mut n = node("a", op, &["x"], &["y"]);
        for (name, v) in floats_ {
            let mut at = AttributeProto::new();
            at.name = name.into();
            at.type_ = AttributeType::FLOAT.into();
            at.f = v;
            n.attribute.push(at);
        }
        case(what, vec![n], vec![], &[3, 4, 5], opset)
    };
    let resize = |what: &'static str, mode: &str, transform: &str, scales: &[f32]| {
        let n = with_string(
            with_string(node("r", "Resize", &["x", "", "sc"], &["y"]), "mode", mode),
            "coordinate_transformation_mode",
            transform,
        );
        case(
            what,
            vec![n],
            vec![floats("sc", &[4], scales)],
            &[2, 3, 5, 6],
            13,
        )
    };
    // Y of a recurrence over x [S=5, N=2, I=3], hidden 4, with biases
    let rnn = |what: &'static str, op: &str, direction: &str, gates: i64| {
        let dirs = if direction == "bidirectional" { 2 } else { 1 };
        let n = with_string(
            with_int(
                node("r", op, &["x", "w", "r", "b"], &["y"]),
                "hidden_size",
                4,
            ),
            "direction",
            direction,
        );
        let (g, d) = (gates * 4, dirs as usize);
        case(
            what,
            vec![n],
            vec![
                floats("w", &[dirs, g, 3], &values(d * g as usize * 3, 31)),
                floats("r", &[dirs, g, 4], &values(d * g as usize * 4, 32)),
                floats("b", &[dirs, 2 * g], &values(d * 2 * g as usize, 33)),
            ],
            &[5, 2, 3],
            14,
        )
    };
    let cases = vec![
        unary("leaky_relu", "LeakyRelu", vec![("alpha", 0.2)], 16),
        unary("elu", "Elu", vec![("alpha", 0.7)], 13),
        unary("selu", "Selu", vec![], 13),
        unary(
            "hard_sigmoid",
            "HardSigmoid",
            vec![("alpha", 0.3), ("beta", 0.4)],
            13,
        ),
        unary("hard_swish", "HardSwish", vec![], 14),
        unary("softsign", "Softsign", vec![], 13),
        case(
            "prelu",
            vec![node("p", "PRelu", &["x", "s"], &["y"])],
            vec![floats("s", &[4, 1], &[0.1, -0.2, 0.3, 0.5])],
            &[3, 4, 5],
            16,
        ),
        case(
            "reduce_l2",
            vec![with_int(
                with_ints(node("r", "ReduceL2", &["x"], &["y"]), "axes", &[1]),
                "keepdims",
                0,
            )],
            vec![],
            &[3, 4, 5],
            13,
        ),
        case(
            "reduce_l1",
            vec![with_ints(
                node("r", "ReduceL1", &["x"], &["y"]),
                "axes",
                &[0, 2],
            )],
            vec![],
            &[3, 4, 5],
            13,
        ),
        case(
            "reduce_sum_square",
            vec![node("r", "ReduceSumSquare", &["x", "ax"], &["y"])],
            vec![ints("ax", &[1], &[-1])],
            &[3, 4, 5],
            18,
        ),
        case(
            "instance_norm",
            vec![node("i", "InstanceNormalization", &["x", "s", "b"], &["y"])],
            vec![
                floats("s", &[3], &[0.5, 1.5, -1.0]),
                floats("b", &[3], &[0.1, 0.0, -0.3]),
            ],
            &[2, 3, 4, 5],
            13,
        ),
        case(
            "reduce_max",
            vec![with_int(
                with_ints(node("r", "ReduceMax", &["x"], &["y"]), "axes", &[2]),
                "keepdims",
                0,
            )],
            vec![],
            &[3, 4, 7],
            13,
        ),
        case(
            "reduce_min",
            vec![with_ints(
                node("r", "ReduceMin", &["x"], &["y"]),
                "axes",
                &[0, 2],
            )],
            vec![],
            &[3, 4, 5],
            13,
        ),
        // forty-eighth session: a product over computed values (pairwise slices and muls)
        case(
            "reduce_prod",
            vec![with_ints(
                node("r", "ReduceProd", &["x"], &["y"]),
                "axes",
                &[1],
            )],
            vec![],
            &[3, 7, 2],
            13,
        ),
        // forty-eighth session: a constant base to a computed power, exp(x · ln c)
        case(
            "pow_constant_base",
            vec![node("p", "Pow", &["c", "x"], &["y"])],
            vec![floats("c", &[], &[2.5])],
            &[3, 4],
            13,
        ),
        case(
            "reduce_prod_all",
            vec![with_int(
                node("r", "ReduceProd", &["x"], &["y"]),
                "keepdims",
                0,
            )],
            vec![],
            &[2, 3],
            13,
        ),
        case(
            "reduce_log_sum_exp",
            vec![node("r", "ReduceLogSumExp", &["x", "ax"], &["y"])],
            vec![ints("ax", &[1], &[1])],
            &[3, 5, 4],
            18,
        ),
        case(
            "global_max_pool",
            vec![node("g", "GlobalMaxPool", &["x"], &["y"])],
            vec![],
            &[2, 3, 5, 3],
            13,
        ),
        rnn("rnn bidirectional", "RNN", "bidirectional", 1),
        rnn("gru bidirectional", "GRU", "bidirectional", 3),
        rnn("lstm bidirectional", "LSTM", "bidirectional", 4),
        resize(
            "resize nearest asymmetric",
            "nearest",
            "asymmetric",
            &[1.0, 1.0, 2.0, 2.0],
        ),
        resize(
            "resize nearest half_pixel",
            "nearest",
            "half_pixel",
            &[1.0, 1.0, 1.5, 0.5],
        ),
        resize(
            "resize linear half_pixel",
            "linear",
            "half_pixel",
            &[1.0, 1.0, 2.0, 2.0],
        ),
        resize(
            "resize linear align_corners",
            "linear",
            "align_corners",
            &[1.0, 1.0, 1.6, 3.0],
        ),
        resize(
            "resize linear pytorch_half_pixel",
            "linear",
            "pytorch_half_pixel",
            &[1.0, 1.0, 0.6, 2.0],
        ),
    ];
    agree_with_tract(&cases, &dir);
    std::fs::remove_dir_all(&dir).ok();
}

/// A `reverse` recurrence is the second direction of a `bidirectional` one with the same
/// weights there (tract 0.23 runs `direction="reverse"` differently from onnxruntime and the
/// ONNX reference evaluator, which agree with torchlean within 1.5e-7 — checked by hand on
/// 2026-12-04 —, so it is not the reference here; the bidirectional form is checked against
/// tract above).
#[test]
fn a_reverse_recurrence_is_the_second_half_of_a_bidirectional_one() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let x = Tensor::from_vec(values(30, 41), &[5, 2, 3]).unwrap();
    for (op, gates) in [("RNN", 1usize), ("GRU", 3), ("LSTM", 4)] {
        let g = gates * 4;
        let weights = |dirs: usize, seed_of: &dyn Fn(usize) -> u64| {
            let stack = |cols: usize, salt: u64| -> Vec<f32> {
                (0..dirs)
                    .flat_map(|d| values(g * cols, seed_of(d) + salt))
                    .collect()
            };
            vec![
                floats("w", &[dirs as i64, g as i64, 3], &stack(3, 0)),
                floats("r", &[dirs as i64, g as i64, 4], &stack(4, 100)),
                floats("b", &[dirs as i64, 2 * g as i64], &stack(2, 200)),
            ]
        };
        let run = |direction: &str, inits: Vec<onnx_protobuf::TensorProto>| {
            let n = with_string(
                with_int(
                    node("r", op, &["x", "w", "r", "b"], &["y"]),
                    "hidden_size",
                    4,
                ),
                "direction",
                direction,
            );
            let c = case("rnn", vec![n], inits, &[5, 2, 3], 14);
            let m = torchlean_onnx::import_model(&build(&c, false), op, &HashMap::new()).unwrap();
            run_graph(
                m.graph,
                &m.values,
                &[("x".into(), x.clone())],
                &profile,
                false,
            )
            .unwrap()
            .remove("y")
            .unwrap()
        };
        // direction 1 of the bidirectional node holds the reverse node's weights (seed 7)
        let both = run("bidirectional", weights(2, &|d| if d == 0 { 3 } else { 7 }));
        let rev = run("reverse", weights(1, &|_| 7));
        assert_eq!(both.shape(), &[5, 2, 2, 4]);
        let second: Vec<f32> = both
            .to_vec()
            .chunks(8)
            .skip(1)
            .step_by(2)
            .flatten()
            .copied()
            .collect();
        assert_eq!(second, rev.to_vec(), "{op}");
        assert_ne!(
            both.to_vec()
                .chunks(8)
                .step_by(2)
                .flatten()
                .copied()
                .collect::<Vec<f32>>(),
            rev.to_vec(),
            "{op}: the forward half differs"
        );
    }
}

/// The lowered LeakyRelu, PRelu, Elu and Selu have PyTorch's gradient at exactly 0 (its
/// backward formulas take the x <= 0 branch there: the slope, α, γ·α), and their usual one on
/// either side; before the thirty-seventh session both terms of the lowering had a zero
/// gradient at 0 (an audit against PyTorch).
#[test]
fn activation_gradients_at_zero_are_pytorchs() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let attr = |mut n: NodeProto, name: &str, v: f32| {
        let mut at = AttributeProto::new();
        at.name = name.into();
        at.type_ = AttributeType::FLOAT.into();
        at.f = v;
        n.attribute.push(at);
        n
    };
    let (selu_alpha, selu_gamma) = (1.673_263_2f32, 1.050_701f32);
    // (case, the gradient at -1, 0, 1 of Σ y)
    let cases = vec![
        (
            case(
                "leaky",
                vec![attr(node("a", "LeakyRelu", &["x"], &["y"]), "alpha", 0.2)],
                vec![],
                &[3],
                16,
            ),
            [0.2, 0.2, 1.0],
        ),
        (
            case(
                "prelu",
                vec![node("p", "PRelu", &["x", "s"], &["y"])],
                vec![floats("s", &[1], &[0.3])],
                &[3],
                16,
            ),
            [0.3, 0.3, 1.0],
        ),
        (
            case(
                "elu",
                vec![attr(node("a", "Elu", &["x"], &["y"]), "alpha", 0.7)],
                vec![],
                &[3],
                13,
            ),
            [0.7 * (-1.0f32).exp(), 0.7, 1.0],
        ),
        (
            case(
                "selu",
                vec![node("a", "Selu", &["x"], &["y"])],
                vec![],
                &[3],
                13,
            ),
            [
                selu_gamma * selu_alpha * (-1.0f32).exp(),
                selu_gamma * selu_alpha,
                selu_gamma,
            ],
        ),
    ];
    for (c, want) in cases {
        let out = with_unit_cotangent(&c, vec![-1.0, 0.0, 1.0], &profile);
        assert_close(c.what, &out["grad.x"].to_vec(), &want, 1e-6);
    }
}

/// Runs `Resize` nearest over `x = [0, 1, …, n − 1]` on the last axis of [1, 1, 1, n], with
/// the given coordinate transform and rounding, and an f32 `scales` or int64 `sizes` input.
fn resize_nearest_picks(
    n: usize,
    transform: &str,
    rule: &str,
    scale: Option<f32>,
    size: i64,
) -> Vec<f32> {
    let (inputs, init) = match scale {
        Some(s) => (["x", "", "sc", ""], floats("sc", &[4], &[1.0, 1.0, 1.0, s])),
        None => (["x", "", "", "sz"], ints("sz", &[4], &[1, 1, 1, size])),
    };
    let k = if scale.is_some() { 3 } else { 4 };
    let r = node("r", "Resize", &inputs[..k], &["y"]);
    let r = with_string(
        with_string(r, "mode", "nearest"),
        "coordinate_transformation_mode",
        transform,
    );
    let m = model(
        vec![with_string(r, "nearest_mode", rule)],
        vec![init],
        vec![value_info("x", &[1, 1, 1, n as i64], FLOAT)],
        vec![open("y")],
        13,
    );
    let imported = torchlean_onnx::import_model(&m, "resize", &HashMap::new()).unwrap();
    let x = Tensor::from_vec((0..n).map(|v| v as f32).collect(), &[1, 1, 1, n]).unwrap();
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let out = run_graph(
        imported.graph,
        &imported.values,
        &[("x".into(), x)],
        &profile,
        false,
    )
    .unwrap();
    out["y"].to_vec()
}

/// `Resize` nearest with the asymmetric transform and `floor` (PyTorch's `nearest` export) at a
/// scale that is not a power of two: the source index is onnxruntime's, computed in f32 —
/// output 3 of 10 → 6 at scale 0.6 reads input 5 (3 / 0.6f rounds to exactly 5 in f32; in f64
/// it is 4.9999998, and torchlean read input 4 before the thirty-seventh session). The
/// expected picks are onnxruntime 1.32's output on this model (an audit of that session).
#[test]
fn resize_nearest_coordinates_are_onnxruntimes() {
    assert_eq!(
        resize_nearest_picks(10, "asymmetric", "floor", Some(0.6), 0),
        vec![0.0, 1.0, 3.0, 5.0, 6.0, 8.0]
    );
}

/// `Resize` nearest with the output size given (`sizes`, as PyTorch exports
/// `F.interpolate(size=…)`) reads the source pixel of the exact coordinate. The expected picks
/// come from outside torchlean: PyTorch 2.15's `F.interpolate(mode="nearest")` for 35 → 5
/// (onnxruntime 1.32 reads 6, 13, 27 there: 1 / (5/35 in f32) is 6.9999997), and
/// onnxruntime 1.32 and the ONNX reference evaluator for the half-way points of 7 → 4
/// `round_prefer_ceil` (2·7/4 = 3.5 exactly; torchlean read input 3 before this session, from
/// the f32 quotient 3.4999998) and 11 → 13 `tf_half_pixel_for_nn` `round_prefer_floor`
/// (output 6: 13·11/26 = 5.5).
#[test]
fn resize_nearest_from_sizes_reads_the_exact_coordinate() {
    let as_f32 = |v: &[usize]| v.iter().map(|&i| i as f32).collect::<Vec<_>>();
    assert_eq!(
        resize_nearest_picks(35, "asymmetric", "floor", None, 5),
        as_f32(&[0, 7, 14, 21, 28])
    );
    assert_eq!(
        resize_nearest_picks(7, "asymmetric", "round_prefer_ceil", None, 4),
        as_f32(&[0, 2, 4, 5])
    );
    assert_eq!(
        resize_nearest_picks(7, "asymmetric", "round_prefer_ceil", None, 2),
        as_f32(&[0, 4])
    );
    assert_eq!(
        resize_nearest_picks(11, "tf_half_pixel_for_nn", "round_prefer_floor", None, 13),
        as_f32(&[0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10])
    );
}

/// Token ids that pass through `Clip`, `Abs` or `Max` before a `Gather` are still integer
/// indices (ONNX's type rules; docs/onnx.md lists them as keeping values integer): the
/// lookup runs, on the clipped ids (`Embedding(ids.clamp(0, 9))`, as PyTorch exports it, was
/// refused as "indices computed from float values" before the thirty-seventh session).
#[test]
fn ids_through_clip_abs_and_max_index_a_gather() {
    const INT64: i32 = 7;
    let table: Vec<f32> = (0..40).map(|v| v as f32).collect();
    let ids = [12.0f32, -1.0, 3.0, 9.0];
    type Case = (
        &'static str,
        Vec<NodeProto>,
        Vec<onnx_protobuf::TensorProto>,
        Vec<usize>,
    );
    let cases: Vec<Case> = vec![
        (
            "clip",
            vec![
                node("c", "Clip", &["ids", "lo", "hi"], &["j"]),
                node("g", "Gather", &["emb", "j"], &["y"]),
            ],
            vec![ints("lo", &[], &[0]), ints("hi", &[], &[9])],
            vec![9, 0, 3, 9],
        ),
        (
            "abs",
            vec![
                node("a", "Abs", &["ids"], &["j0"]),
                node("c", "Clip", &["j0", "lo", "hi"], &["j"]),
                node("g", "Gather", &["emb", "j"], &["y"]),
            ],
            vec![ints("lo", &[], &[0]), ints("hi", &[], &[9])],
            vec![9, 1, 3, 9],
        ),
        (
            "max",
            // one bound a Constant node, the other an integer initializer (read as a
            // constant: it was refused as data)
            vec![
                constant("zero", ints("zero_t", &[1], &[0])),
                node("m", "Max", &["ids", "zero"], &["j0"]),
                node("c", "Min", &["j0", "nine"], &["j"]),
                node("g", "Gather", &["emb", "j"], &["y"]),
            ],
            vec![ints("nine", &[1], &[9])],
            vec![9, 0, 3, 9],
        ),
    ];
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    for (what, nodes, mut inits, rows) in cases {
        inits.push(floats("emb", &[10, 4], &table));
        let m = model(
            nodes,
            inits,
            vec![value_info("ids", &[4], INT64)],
            vec![open("y")],
            13,
        );
        let imported = torchlean_onnx::import_model(&m, what, &HashMap::new())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let x = Tensor::from_vec(ids.to_vec(), &[4]).unwrap();
        let out = run_graph(
            imported.graph,
            &imported.values,
            &[("ids".into(), x)],
            &profile,
            false,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| table[4 * r..4 * r + 4].to_vec())
            .collect();
        assert_eq!(out["y"].to_vec(), want, "{what}");
    }
}

/// ArgMax / ArgMin (torchlean's `argmax`, of −x for ArgMin; `keepdims` both ways, negative
/// axes, ties resolved to the first index as ONNX's `select_last_index = 0` says), and a
/// classifier head's pattern — `Gather` of a table by the argmax of the logits — against
/// tract on the same model files, inputs quantized so that rows hold ties. The indices are
/// cast to float for the comparison (tract's outputs are read as f32).
#[test]
fn arg_extremes_agree_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-argmax-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let arg = |op: &str, axis: i64, keep: i64| {
        vec![
            with_int(
                with_int(node("a", op, &["x"], &["i"]), "axis", axis),
                "keepdims",
                keep,
            ),
            with_int(node("c", "Cast", &["i"], &["y"]), "to", FLOAT as i64),
        ]
    };
    let table = floats("table", &[5, 3], &values(15, 5));
    let gather = vec![
        with_int(
            with_int(node("a", "ArgMax", &["x"], &["i"]), "axis", 1),
            "keepdims",
            0,
        ),
        node("g", "Gather", &["table", "i"], &["y"]),
    ];
    let cases = [
        case(
            "argmax axis 1 kept",
            arg("ArgMax", 1, 1),
            vec![],
            &[3, 5, 4],
            13,
        ),
        case(
            "argmax axis -1 dropped",
            arg("ArgMax", -1, 0),
            vec![],
            &[3, 5, 4],
            13,
        ),
        case(
            "argmin axis 0 kept",
            arg("ArgMin", 0, 1),
            vec![],
            &[3, 5, 4],
            13,
        ),
        case(
            "argmin axis -2 dropped",
            arg("ArgMin", -2, 0),
            vec![],
            &[3, 5, 4],
            13,
        ),
        case("gather by argmax", gather, vec![table], &[4, 5], 13),
    ];
    for c in &cases {
        // values in {-1, -2/3, …, 1}: most rows hold ties
        let x: Vec<f32> = values(c.dims.iter().product(), 7)
            .iter()
            .map(|v| (v * 3.0).round() / 3.0)
            .collect();
        let x = Tensor::from_vec(x, &c.dims).unwrap();
        let want = tract_y(c, &x, &dir);
        let imported = torchlean_onnx::import_model(&build(c, false), c.what, &HashMap::new())
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let out = run_graph(
            imported.graph,
            &imported.values,
            &[("x".into(), x.clone())],
            &profile,
            false,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        assert_eq!(out["y"].to_vec(), want, "{}", c.what);
    }
    // `select_last_index = 1` is refused, naming the node's operator
    let last = case(
        "last",
        vec![with_int(
            node("a", "ArgMax", &["x"], &["y"]),
            "select_last_index",
            1,
        )],
        vec![],
        &[3, 4],
        13,
    );
    let e = torchlean_onnx::import_model(&build(&last, false), "last", &HashMap::new())
        .err()
        .expect("select_last_index = 1 is refused")
        .to_string();
    assert!(e.contains("select_last_index"), "{e}");
}

/// MaxPool edge cases found by the forty-fourth session's audit against PyTorch and
/// onnxruntime: with `ceil_mode=1` a padded input shorter than the kernel by less than a
/// stride has one window (`nn.MaxPool1d(3, 2, ceil_mode=True)` on 2 values: their maximum;
/// it was refused), and a window of the begin padding and −∞ values sends its gradient to the
/// first value, as PyTorch's max pool with `padding=1` does — padding never wins (the begin
/// padding was a −∞ block before the input, which won that window and dropped its gradient).
#[test]
fn max_pool_ceil_windows_and_begin_padding_follow_pytorch() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let pool = |kernel: i64, stride: i64, pads: [i64; 4], ceil: i64| {
        let n = with_ints(
            with_ints(
                node("p", "MaxPool", &["x"], &["y"]),
                "kernel_shape",
                &[1, kernel],
            ),
            "strides",
            &[1, stride],
        );
        with_int(with_ints(n, "pads", &pads), "ceil_mode", ceil)
    };
    let run = |c: &Case, x: Vec<f32>, cot: Vec<f32>| {
        let n = cot.len();
        let shapes = HashMap::from([("cot".to_string(), vec![1, 1, 1, n])]);
        let imported = torchlean_onnx::import_model(&build(c, true), c.what, &shapes)
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let x = Tensor::from_vec(x, &c.dims).unwrap();
        let cot = Tensor::from_vec(cot, &[1, 1, 1, n]).unwrap();
        let out = run_graph(
            imported.graph,
            &imported.values,
            &[("x".into(), x), ("cot".into(), cot)],
            &profile,
            true,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        (out["y"].to_vec(), out["grad.x"].to_vec())
    };
    // kernel 3, stride 2, ceil_mode over 2 values: one window, their maximum
    let c = case(
        "ceil short",
        vec![pool(3, 2, [0, 0, 0, 0], 1)],
        vec![],
        &[1, 1, 1, 2],
        13,
    );
    let (y, g) = run(&c, vec![-0.5, 0.25], vec![2.0]);
    assert_eq!((y, g), (vec![0.25], vec![0.0, 2.0]));
    // pads: one at the begin of the width, none at the end; windows [pad, x0], [x1, x2],
    // and x0, x1 are −∞: the first window's gradient goes to x0
    let c = case(
        "begin pad",
        vec![pool(2, 2, [0, 1, 0, 0], 0)],
        vec![],
        &[1, 1, 1, 4],
        13,
    );
    let ninf = f32::NEG_INFINITY;
    let (y, g) = run(&c, vec![ninf, ninf, 5.0, 1.0], vec![3.0, 7.0]);
    assert_eq!(y, vec![ninf, 5.0]);
    assert_eq!(g, vec![3.0, 0.0, 7.0, 0.0]);
}

/// HardSigmoid and HardSwish at their kinks (x = ±3 for PyTorch's coefficients) have
/// PyTorch 2.15's gradients: `hardsigmoid_backward` passes g/6 only strictly inside (−3, 3),
/// `hardswish_backward` gives 0 at x ≤ −3, g·(x/3 + 1/2) strictly inside, g at x ≥ 3. Their
/// `clamp` lowering passed the gradient at the bounds (hardswish −0.5 and 1.5 at ∓3; the
/// forty-eighth session's audit).
#[test]
fn hard_activation_gradients_at_their_kinks_are_pytorchs() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let mut hs = node("h", "HardSigmoid", &["x"], &["y"]);
    for (name, v) in [("alpha", 1.0f32 / 6.0), ("beta", 0.5)] {
        let mut at = AttributeProto::new();
        at.name = name.into();
        at.type_ = AttributeType::FLOAT.into();
        at.f = v;
        hs.attribute.push(at);
    }
    let xs = [-4.0f32, -3.0, -1.5, 0.0, 3.0, 4.0];
    let sixth = 1.0f32 / 6.0;
    let cases = [
        (
            case("hardsigmoid", vec![hs], vec![], &[6], 13),
            xs.map(|x| if x > -3.0 && x < 3.0 { sixth } else { 0.0 }),
        ),
        (
            case(
                "hardswish",
                vec![node("h", "HardSwish", &["x"], &["y"])],
                vec![],
                &[6],
                14,
            ),
            xs.map(|x| {
                if x <= -3.0 {
                    0.0
                } else if x < 3.0 {
                    x / 3.0 + 0.5
                } else {
                    1.0
                }
            }),
        ),
    ];
    for (c, want) in cases {
        let out = with_unit_cotangent(&c, xs.to_vec(), &profile);
        assert_close(c.what, &out["grad.x"].to_vec(), &want, 1e-6);
    }
}

/// `x.clamp(min=0)` as either exporter writes it — `Clip(x, 0)` (TorchScript) or `Max(x, 0)`
/// (dynamo) — passes no gradient at x = 0, as PyTorch 2.15's clamp: `d.clamp(min=0).sqrt()`
/// (pairwise distances, exactly 0 on the diagonal) got inf · 1 = NaN gradients everywhere (the
/// forty-eighth session's audit); and a Pow of two constants (`10000 ** (arange / d)`) is
/// evaluated at import.
#[test]
fn a_clamp_at_zero_passes_no_gradient_into_sqrt() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let xs = [0.0f32, 4.0, 1.0, -1.0];
    // (a Constant node, as exporters write `clamp(min=0)`'s bound; a float initializer is a
    // learnable bound, whose tie shares the gradient as PyTorch's tensor-bound clamp)
    let zero = || floats("", &[], &[0.0]);
    let cases = [
        case(
            "clip",
            vec![
                constant("z", zero()),
                node("c", "Clip", &["x", "z"], &["c"]),
                node("s", "Sqrt", &["c"], &["y"]),
            ],
            vec![],
            &[4],
            13,
        ),
        case(
            "max",
            vec![
                constant("z", zero()),
                node("c", "Max", &["z", "x"], &["c"]),
                node("s", "Sqrt", &["c"], &["y"]),
            ],
            vec![],
            &[4],
            13,
        ),
    ];
    for c in cases {
        let out = with_unit_cotangent(&c, xs.to_vec(), &profile);
        assert_close(c.what, &out["y"].to_vec(), &[0.0, 2.0, 1.0, 0.0], 0.0);
        assert_close(
            c.what,
            &out["grad.x"].to_vec(),
            &[0.0, 0.25, 0.5, 0.0],
            1e-7,
        );
    }
    // a Pow of constants is a constant
    let m = model(
        vec![
            constant("base", floats("", &[], &[10000.0])),
            constant("e", floats("", &[3], &[0.0, 0.25, 0.5])),
            node("p", "Pow", &["base", "e"], &["f"]),
            node("y", "Mul", &["x", "f"], &["y"]),
        ],
        vec![],
        vec![value_info("x", &[3], FLOAT)],
        vec![open("y")],
        17,
    );
    let imported = torchlean_onnx::import_model(&m, "pow", &HashMap::new()).unwrap();
    assert!(
        imported.graph.nodes.iter().all(|n| !matches!(
            &n.kind,
            torchlean::graph::NodeKind::Op {
                op: torchlean::graph::Op::Pow { .. }
            }
        )),
        "the constants' Pow was not folded"
    );
    let out = run_graph(
        imported.graph,
        &imported.values,
        &[("x".into(), Tensor::from_vec(vec![1.0; 3], &[3]).unwrap())],
        &profile,
        false,
    )
    .unwrap();
    assert_close(
        "pow of constants",
        &out["y"].to_vec(),
        &[1.0, 10.0, 100.0],
        1e-6,
    );
}

/// Runs case `c` (built with a cotangent input `cot`) on the 1-D `x` with a cotangent of ones,
/// returning its outputs and `grad.x`: the gradient of Σ y.
fn with_unit_cotangent(c: &Case, x: Vec<f32>, profile: &BackendProfile) -> HashMap<String, Tensor> {
    let n = x.len();
    let shapes = HashMap::from([("cot".to_string(), vec![n])]);
    let imported = torchlean_onnx::import_model(&build(c, true), c.what, &shapes)
        .unwrap_or_else(|e| panic!("{}: {e}", c.what));
    let x = Tensor::from_vec(x, &[n]).unwrap();
    let cot = Tensor::from_vec(vec![1.0; n], &[n]).unwrap();
    run_graph(
        imported.graph,
        &imported.values,
        &[("x".into(), x), ("cot".into(), cot)],
        profile,
        true,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", c.what))
}

/// A learnable exponent of a base positive by construction (GeM pooling's
/// `x.clamp(min=eps).pow(p)`) is exp(p · ln x), a parameter of the graph: the values are
/// x^p, the gradients p·x^(p−1) for x (none below the clamp) and Σ x^p · ln x for p, against
/// the f64 formulas (PyTorch's pow and its backward); of a base of unknown sign the exponent
/// stays a constant read at import (listed in `constant_initializers`, no gradient).
#[test]
fn a_learnable_exponent_of_a_positive_base_takes_its_gradient() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let (eps, p) = (1e-6f32, 2.5f32);
    let gem = case(
        "gem",
        vec![
            constant("eps", floats("eps", &[], &[eps])),
            node("c", "Clip", &["x", "eps"], &["xc"]),
            node("p", "Pow", &["xc", "p"], &["y"]),
        ],
        vec![floats("p", &[1], &[p])],
        &[6],
        13,
    );
    let xs = vec![-1.0f32, 0.5, 2.0, 3.0, 1e-8, 4.0];
    let out = with_unit_cotangent(&gem, xs.clone(), &profile);
    let clamped: Vec<f64> = xs.iter().map(|&x| (x as f64).max(eps as f64)).collect();
    let want_y: Vec<f32> = clamped.iter().map(|&x| x.powf(p as f64) as f32).collect();
    assert_close("gem y", &out["y"].to_vec(), &want_y, 1e-5);
    let want_gx: Vec<f32> = xs
        .iter()
        .zip(&clamped)
        .map(|(&x, &c)| {
            if x > eps {
                (p as f64 * c.powf(p as f64 - 1.0)) as f32
            } else {
                0.0
            }
        })
        .collect();
    assert_close("gem grad.x", &out["grad.x"].to_vec(), &want_gx, 1e-5);
    let want_gp: f64 = clamped.iter().map(|&c| c.powf(p as f64) * c.ln()).sum();
    assert_close(
        "gem grad.p",
        &out["grad.p"].to_vec(),
        &[want_gp as f32],
        1e-5,
    );
    // a base of unknown sign: the exponent is read as a constant, as before
    let plain = case(
        "plain",
        vec![node("p", "Pow", &["x", "p"], &["y"])],
        vec![floats("p", &[1], &[2.0])],
        &[6],
        13,
    );
    let imported = torchlean_onnx::import_model(
        &build(&plain, true),
        plain.what,
        &HashMap::from([("cot".to_string(), vec![6])]),
    )
    .unwrap();
    assert_eq!(imported.constant_initializers, vec!["p".to_string()]);
}

/// The sign analysis walks each node once and has no depth limit: a chain of 200 `y + y`
/// (each node reached twice) over a positive clamp is positive, so the learnable exponent
/// above it is a parameter (the first version re-walked shared nodes — 2^64 visits before
/// its depth limit of 64, which would also have called the chain unknown).
#[test]
fn the_sign_analysis_is_linear_in_the_graph() {
    let mut nodes = vec![
        constant("eps", floats("eps", &[], &[1e-6])),
        node("c", "Clip", &["x", "eps"], &["y0"]),
    ];
    let names: Vec<String> = (0..=200).map(|i| format!("y{i}")).collect();
    for i in 1..=200 {
        nodes.push(node(
            &names[i],
            "Add",
            &[&names[i - 1], &names[i - 1]],
            &[&names[i]],
        ));
    }
    nodes.push(node("p", "Pow", &["y200", "p"], &["y"]));
    let deep = case("deep", nodes, vec![floats("p", &[1], &[2.0])], &[4], 13);
    let imported = torchlean_onnx::import_model(
        &build(&deep, true),
        deep.what,
        &HashMap::from([("cot".to_string(), vec![4])]),
    )
    .unwrap();
    assert!(
        imported.constant_initializers.is_empty(),
        "p is a parameter"
    );
}
