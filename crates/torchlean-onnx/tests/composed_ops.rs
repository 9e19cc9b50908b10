//! ONNX operators torchlean composes from its own ops (forty-fifth session): `DepthToSpace`
//! (both modes), `SpaceToDepth`, `Tile` and `Sign` against an independent engine (tract) on
//! the same files, and `NegativeLogLikelihoodLoss` (weights, `ignore_index`, every reduction)
//! against its definition written out here. `SoftmaxCrossEntropyLoss`, `Celu` and the same
//! layout operators as PyTorch exports them are held to PyTorch's values and gradients by the
//! `extras` fixture (tests/pytorch_fixtures.rs).

mod common;

use common::*;
use onnx_protobuf::NodeProto;
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;
const INT64: i32 = 7;

/// A model's name, nodes, input dims and output dims.
type Case = (&'static str, Vec<NodeProto>, Vec<i64>, Vec<i64>);

#[test]
fn layout_operators_and_sign_agree_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-composed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let d2s = |mode: &str| {
        with_string(
            with_int(node("d", "DepthToSpace", &["x"], &["y"]), "blocksize", 2),
            "mode",
            mode,
        )
    };
    let cases: Vec<Case> = vec![
        (
            "depth to space DCR",
            vec![d2s("DCR")],
            vec![1, 8, 2, 3],
            vec![1, 2, 4, 6],
        ),
        (
            "depth to space CRD",
            vec![d2s("CRD")],
            vec![1, 8, 2, 3],
            vec![1, 2, 4, 6],
        ),
        (
            "space to depth",
            vec![with_int(
                node("s", "SpaceToDepth", &["x"], &["y"]),
                "blocksize",
                2,
            )],
            vec![2, 2, 4, 6],
            vec![2, 8, 2, 3],
        ),
        (
            "tile",
            vec![node("t", "Tile", &["x", "reps"], &["y"])],
            vec![2, 3],
            vec![4, 9],
        ),
        (
            "sign",
            vec![node("s", "Sign", &["x"], &["y"])],
            vec![2, 6],
            vec![2, 6],
        ),
    ];
    for (what, nodes, dims, out_dims) in cases {
        let m = model(
            nodes,
            vec![ints("reps", &[2], &[2, 3])],
            vec![value_info("x", &dims, FLOAT)],
            vec![value_info("y", &out_dims, FLOAT)],
            13,
        );
        let n: i64 = dims.iter().product();
        let mut x: Vec<f32> = (0..n).map(|i| (i as f32 - 5.0) * 0.75).collect();
        if what == "sign" {
            x[1] = f32::NAN;
            x[2] = -0.0;
            x[3] = f32::NEG_INFINITY;
            x[4] = 1e-45;
        }
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let inputs = [("x".to_string(), Tensor::from_vec(x, &shape).unwrap())];
        let (got, want) = torchlean_and_tract(&dir, what, &m, &inputs, &profile);
        assert_eq!(bits(&got), bits(&want), "{what}");
    }
}

/// NegativeLogLikelihoodLoss over log-probabilities [4, 3] with class weights and
/// `ignore_index` 2, each reduction, and the gradient of the mean: the definition, written
/// out — loss_i = −w[t_i]·x[i, t_i] (0 where t_i is ignored), mean = Σ loss / Σ w[t_i] over the
/// counted entries, ∂mean/∂x[i, t_i] = −w[t_i] / Σ w.
#[test]
fn negative_log_likelihood_follows_its_definition() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let x: Vec<f32> = (0..12).map(|i| -0.3 * (1 + i % 5) as f32).collect();
    let t = [0i64, 2, 1, 1];
    let w = [0.5f32, 2.0, 1.5];
    let counted: Vec<usize> = (0..4).filter(|&i| t[i] != 2).collect();
    let term = |i: usize| -w[t[i] as usize] * x[i * 3 + t[i] as usize];
    let total: f32 = counted.iter().map(|&i| term(i)).sum();
    let wsum: f32 = counted.iter().map(|&i| w[t[i] as usize]).sum();
    for reduction in ["none", "sum", "mean"] {
        let loss = with_int(
            with_string(
                node(
                    "l",
                    "NegativeLogLikelihoodLoss",
                    &["x", "t", "w"],
                    &["loss"],
                ),
                "reduction",
                reduction,
            ),
            "ignore_index",
            2,
        );
        let out_dims: Vec<i64> = if reduction == "none" { vec![4] } else { vec![] };
        let m = model(
            vec![loss],
            vec![floats("w", &[3], &w)],
            vec![
                value_info("x", &[4, 3], FLOAT),
                value_info("t", &[4], INT64),
            ],
            vec![value_info("loss", &out_dims, FLOAT)],
            13,
        );
        let imported = torchlean_onnx::import_model(&m, reduction, &HashMap::new())
            .unwrap_or_else(|e| panic!("{reduction}: {e}"));
        let inputs = [
            (
                "x".to_string(),
                Tensor::from_vec(x.clone(), &[4, 3]).unwrap(),
            ),
            (
                "t".to_string(),
                Tensor::from_vec(t.iter().map(|&v| v as f32).collect(), &[4]).unwrap(),
            ),
        ];
        let grad = reduction == "mean";
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, grad)
            .unwrap_or_else(|e| panic!("{reduction}: {e}"));
        let got = out["loss"].to_vec();
        let want: Vec<f32> = match reduction {
            "none" => (0..4)
                .map(|i| if t[i] == 2 { 0.0 } else { term(i) })
                .collect(),
            "sum" => vec![total],
            _ => vec![total / wsum],
        };
        for (g, v) in got.iter().zip(&want) {
            assert!(
                (g - v).abs() <= 1e-6 * (1.0 + v.abs()),
                "{reduction}: {got:?} against {want:?}"
            );
        }
        if grad {
            let gx = out["grad.x"].to_vec();
            for i in 0..4 {
                for c in 0..3 {
                    let v = if t[i] != 2 && c == t[i] as usize {
                        -w[c] / wsum
                    } else {
                        0.0
                    };
                    assert!((gx[i * 3 + c] - v).abs() <= 1e-6, "grad.x {gx:?}");
                }
            }
        }
    }
}

/// `Einsum` (`torch.einsum`) against tract on the same files: batched products (attention's
/// `bhid,bhjd->bhij`), a transpose, sums, outer and inner products, `...`, the implicit
/// output (labels occurring once, alphabetical), three operands; a diagonal (a label repeated
/// within an operand) is refused naming it. (tract 0.23 reads `ij->` and an implicit output
/// with `...` otherwise than numpy and PyTorch; the implicit `...ij,...jk` is checked equal to
/// the explicit `...ij,...jk->...ik`, numpy's rule, and `ij->` to the sum.)
#[test]
fn einsum_agrees_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-einsum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let cases: [(&str, &[&[usize]]); 10] = [
        ("bhid,bhjd->bhij", &[&[2, 3, 4, 5], &[2, 3, 6, 5]]),
        ("ij,jk", &[&[3, 4], &[4, 5]]),
        ("ij->ji", &[&[3, 4]]),
        ("ij->j", &[&[3, 4]]),
        ("i,j->ij", &[&[3], &[4]]),
        ("bi,bi->b", &[&[3, 5], &[3, 5]]),
        ("...ij,...jk->...ik", &[&[2, 3, 4, 5], &[2, 3, 5, 6]]),
        ("bij,bjk,bkl->bil", &[&[2, 3, 4], &[2, 4, 5], &[2, 5, 6]]),
        ("nchw,oc->nohw", &[&[2, 3, 4, 5], &[6, 3]]),
        ("ijk,ikl->jl", &[&[2, 3, 4], &[2, 4, 5]]),
    ];
    for (k, (eq, shapes)) in cases.iter().enumerate() {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let node = with_string(node("e", "Einsum", &refs, &["y"]), "equation", eq);
        let inputs_vi = names
            .iter()
            .zip(shapes.iter())
            .map(|(n, s)| {
                let d: Vec<i64> = s.iter().map(|&v| v as i64).collect();
                value_info(n, &d, FLOAT)
            })
            .collect();
        // the output's rank is not needed by either engine: declared without dims
        let mut out = value_info("y", &[], FLOAT);
        out.type_ = Default::default();
        let m = model(vec![node], vec![], inputs_vi, vec![out], 13);
        let inputs: Vec<(String, Tensor)> = names
            .iter()
            .zip(shapes.iter())
            .enumerate()
            .map(|(i, (n, s))| {
                let count: usize = s.iter().product();
                let v: Vec<f32> = (0..count)
                    .map(|j| ((j * 7 + i * 3 + k) % 11) as f32 * 0.25 - 1.0)
                    .collect();
                (n.clone(), Tensor::from_vec(v, s).unwrap())
            })
            .collect();
        let (got, want) = torchlean_and_tract(&dir, &format!("einsum{k}"), &m, &inputs, &profile);
        assert_close(eq, &got, &want, 1e-6);
    }
    // numpy's rules where tract differs: the implicit output keeps `...` first; `ij->` sums
    let run1 = |eq: &str, shapes: &[&[usize]]| -> Vec<f32> {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut out = value_info("y", &[], FLOAT);
        out.type_ = Default::default();
        let vis = names
            .iter()
            .zip(shapes)
            .map(|(n, s)| value_info(n, &s.iter().map(|&v| v as i64).collect::<Vec<_>>(), FLOAT))
            .collect();
        let m = model(
            vec![with_string(
                node("e", "Einsum", &refs, &["y"]),
                "equation",
                eq,
            )],
            vec![],
            vis,
            vec![out],
            13,
        );
        let inputs: Vec<(String, Tensor)> = names
            .iter()
            .zip(shapes)
            .map(|(n, s)| {
                let c: usize = s.iter().product();
                let v = (0..c).map(|j| (j % 7) as f32 - 3.0).collect();
                (n.clone(), Tensor::from_vec(v, s).unwrap())
            })
            .collect();
        let imported = torchlean_onnx::import_model(&m, eq, &HashMap::new()).unwrap();
        run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap()["y"].to_vec()
    };
    let shapes: [&[usize]; 2] = [&[2, 3, 4, 5], &[2, 3, 5, 6]];
    assert_eq!(
        run1("...ij,...jk", &shapes),
        run1("...ij,...jk->...ik", &shapes)
    );
    let total: f32 = (0..12).map(|j| (j % 7) as f32 - 3.0).sum();
    assert_eq!(run1("ij->", &[&[3, 4]]), vec![total]);
    let m = model(
        vec![with_string(
            node("e", "Einsum", &["x"], &["y"]),
            "equation",
            "ii->i",
        )],
        vec![],
        vec![value_info("x", &[3, 3], FLOAT)],
        vec![value_info("y", &[3], FLOAT)],
        13,
    );
    let e = torchlean_onnx::import_model(&m, "diag", &HashMap::new())
        .err()
        .expect("a diagonal is refused")
        .to_string();
    assert!(e.contains("diagonal"), "{e}");
}

/// Found by the forty-fifth session's audit of the new operators: an ignored entry's loss was
/// zeroed by a product, so a -inf score of class 0 (which an ignored label is read as) made
/// the loss NaN (0·inf), and a batch whose every label is ignored had NaN gradients; ignored
/// entries are now selected away. The loss is the definition's over the counted entries; with
/// every label ignored the mean is NaN (0/0, as PyTorch's) and every gradient exactly 0.
#[test]
fn ignored_labels_pass_no_nan_and_no_gradient() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let loss_node = with_int(
        node("l", "SoftmaxCrossEntropyLoss", &["x", "t"], &["loss"]),
        "ignore_index",
        -100,
    );
    let m = model(
        vec![loss_node],
        vec![],
        vec![
            value_info("x", &[3, 4], FLOAT),
            value_info("t", &[3], INT64),
        ],
        vec![value_info("loss", &[], FLOAT)],
        13,
    );
    let x: Vec<f32> = (0..12)
        .map(|i| {
            if i % 4 == 0 {
                f32::NEG_INFINITY
            } else {
                (i % 5) as f32 * 0.5 - 1.0
            }
        })
        .collect();
    let run = |labels: [f32; 3]| {
        let imported = torchlean_onnx::import_model(&m, "ce", &HashMap::new()).unwrap();
        let inputs = [
            (
                "x".to_string(),
                Tensor::from_vec(x.clone(), &[3, 4]).unwrap(),
            ),
            (
                "t".to_string(),
                Tensor::from_vec(labels.to_vec(), &[3]).unwrap(),
            ),
        ];
        run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap()
    };
    let out = run([1.0, -100.0, 2.0]);
    // −log softmax(x_i)[t_i], averaged over the two counted rows (f64)
    let nll = |row: usize, t: usize| -> f64 {
        let r: Vec<f64> = (0..4).map(|c| x[row * 4 + c] as f64).collect();
        let m = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + r.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        lse - r[t]
    };
    let want = (nll(0, 1) + nll(2, 2)) / 2.0;
    let got = out["loss"].to_vec()[0] as f64;
    assert!((got - want).abs() < 1e-6, "{got} against {want}");
    assert!(out["grad.x"].to_vec().iter().all(|v| v.is_finite()));
    let all = run([-100.0; 3]);
    assert!(all["loss"].to_vec()[0].is_nan());
    assert!(
        all["grad.x"].to_vec().iter().all(|&v| v == 0.0),
        "{:?}",
        all["grad.x"].to_vec()
    );
}

/// A float64 value compared with a float64 constant that float32 rounds is refused: the
/// import holds float64 values as float32, and x = f32(0.1) satisfies `x.double() > 0.1`
/// but not `x > f32(0.1)` (an audit of the forty-fifth session); a constant float32 holds
/// exactly (0.5) is compared as it is.
#[test]
fn float64_comparisons_with_inexact_constants_are_refused() {
    const DOUBLE: i64 = 11;
    let compare_with = |c: f64| {
        let mut t = floats("c", &[], &[0.0]);
        t.data_type = DOUBLE as i32;
        t.float_data.clear();
        t.double_data = vec![c];
        model(
            vec![
                with_int(node("d", "Cast", &["x"], &["xd"]), "to", DOUBLE),
                node("g", "Greater", &["xd", "c"], &["m"]),
                with_int(node("f", "Cast", &["m"], &["y"]), "to", FLOAT as i64),
            ],
            vec![t],
            vec![value_info("x", &[3], FLOAT)],
            vec![value_info("y", &[3], FLOAT)],
            13,
        )
    };
    let e = torchlean_onnx::import_model(&compare_with(0.1), "inexact", &HashMap::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("float32 does not hold exactly"), "{e}");
    let imported =
        torchlean_onnx::import_model(&compare_with(0.5), "exact", &HashMap::new()).unwrap();
    let inputs = [(
        "x".to_string(),
        Tensor::from_vec(vec![0.25, 0.5, 0.75], &[3]).unwrap(),
    )];
    let profile = BackendProfile::named("checked_cpu").unwrap();
    let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
    assert_eq!(out["y"].to_vec(), vec![0.0, 0.0, 1.0]);
}

/// A float64 constant that float32 rounds, moved by an exact operator into a float64 value
/// (`Where(m, x.double(), 0.1)`), is still that rounded constant: a graph output of it is
/// refused (written as F64 it would be 0.10000000149 where PyTorch gives 0.1; the forty-
/// seventh session's review), and so is a comparison of it downstream; with 0.5, which float32
/// holds, the output imports.
#[test]
fn float64_values_holding_inexact_constants_are_not_outputs_or_compared() {
    const DOUBLE: i64 = 11;
    let model_with = |c: f64, compare: bool| {
        let mut t = floats("c", &[], &[0.0]);
        t.data_type = DOUBLE as i32;
        t.float_data.clear();
        t.double_data = vec![c];
        let mut nodes = vec![
            with_int(node("d", "Cast", &["x"], &["xd"]), "to", DOUBLE),
            node("p", "Greater", &["xd", "xd"], &["m"]),
            node("w", "Where", &["m", "xd", "c"], &["y"]),
        ];
        let mut out = value_info("y", &[3], DOUBLE as i32);
        if compare {
            nodes.push(node("g", "Less", &["y", "xd"], &["b"]));
            nodes.push(with_int(
                node("f", "Cast", &["b"], &["z"]),
                "to",
                FLOAT as i64,
            ));
            out = value_info("z", &[3], FLOAT);
        }
        model(
            nodes,
            vec![t],
            vec![value_info("x", &[3], FLOAT)],
            vec![out],
            13,
        )
    };
    for compare in [false, true] {
        let e = torchlean_onnx::import_model(&model_with(0.1, compare), "inexact", &HashMap::new())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("float32 does not hold exactly"),
            "{compare}: {e}"
        );
        let imported =
            torchlean_onnx::import_model(&model_with(0.5, compare), "exact", &HashMap::new());
        assert!(
            imported.is_ok(),
            "{compare}: {:?}",
            imported.err().map(|e| e.to_string())
        );
    }
}

/// `CumSum` (`torch.cumsum`) by doubling steps, plain, `exclusive` and `reverse`, along each
/// axis of a [3, 7] value, against tract (within the rounding of the additions' other order).
#[test]
fn cumsum_agrees_with_tract() {
    let dir = std::env::temp_dir().join(format!("torchlean-cumsum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let x: Vec<f32> = (0..21).map(|i| ((i * 5) % 9) as f32 * 0.75 - 2.0).collect();
    let inputs = [("x".to_string(), Tensor::from_vec(x, &[3, 7]).unwrap())];
    for axis in [0i64, 1, -1] {
        for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let n = with_int(
                with_int(
                    node("c", "CumSum", &["x", "axis"], &["y"]),
                    "exclusive",
                    exclusive,
                ),
                "reverse",
                reverse,
            );
            let m = model(
                vec![n],
                vec![ints("axis", &[], &[axis])],
                vec![value_info("x", &[3, 7], FLOAT)],
                vec![value_info("y", &[3, 7], FLOAT)],
                13,
            );
            let what = format!("cumsum {axis} {exclusive}{reverse}");
            let (got, want) = torchlean_and_tract(&dir, &what, &m, &inputs, &profile);
            assert_close(&what, &got, &want, 1e-6);
        }
    }
}

/// `Floor`, `Ceil`, `Round` (ties to even) and a run-time `Cast` to int64 and back
/// (truncation toward zero: `x.long().float()`) against tract, bit for bit, on ties, near
/// ties, signed zeros, values beyond 2^23 (already integers) and, for the three rounding
/// operators, NaN and infinities (which ONNX leaves undefined for a cast to an integer). Then
/// torchlean's own `round` with every mode exported to ONNX (`trunc` as Where(x < 0, Ceil,
/// Floor)) and run by tract: the same bits again.
#[test]
fn rounding_and_integer_casts_agree_with_tract() {
    use torchlean::graph::{Graph, NodeKind, OutputDecl, RoundMode, ValueDecl};
    let dir = std::env::temp_dir().join(format!("torchlean-rounding-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let finite: Vec<f32> = vec![
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        -0.4,
        -0.0,
        0.0,
        0.499_999_97,
        -0.500_000_06,
        8_388_607.5,
        -8_388_609.0,
        1e8,
        -3.75,
        7.25,
    ];
    let mut special = finite.clone();
    special.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-45]);
    let cast = |to: i64, name: &str, from: &str, out: &str| {
        with_int(node(name, "Cast", &[from], &[out]), "to", to)
    };
    let cases: Vec<(&str, Vec<NodeProto>, &Vec<f32>)> = vec![
        ("floor", vec![node("f", "Floor", &["x"], &["y"])], &special),
        ("ceil", vec![node("c", "Ceil", &["x"], &["y"])], &special),
        ("round", vec![node("r", "Round", &["x"], &["y"])], &special),
        (
            "cast to int64 and back",
            vec![
                cast(INT64 as i64, "to_int", "x", "i"),
                cast(FLOAT as i64, "to_float", "i", "y"),
            ],
            &finite,
        ),
    ];
    for (what, nodes, x) in cases {
        let n = x.len() as i64;
        let m = model(
            nodes,
            vec![],
            vec![value_info("x", &[n], FLOAT)],
            vec![value_info("y", &[n], FLOAT)],
            13,
        );
        let inputs = [(
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[x.len()]).unwrap(),
        )];
        let (got, want) = torchlean_and_tract(&dir, what, &m, &inputs, &profile);
        assert_eq!(bits(&got), bits(&want), "{what}: {got:?} vs {want:?}");
    }
    // torchlean's round, every mode, exported and run by tract
    for mode in RoundMode::ALL {
        let mut g = Graph::new();
        g.inputs.push(ValueDecl {
            name: "x".into(),
            shape: vec![special.len()],
        });
        let xn = g
            .push(NodeKind::Input { name: "x".into() }, vec![])
            .unwrap();
        let y = g
            .push(
                NodeKind::Op {
                    op: torchlean::Op::Round { mode },
                },
                vec![xn],
            )
            .unwrap();
        g.outputs.push(OutputDecl {
            name: "y".into(),
            node: y,
        });
        let inputs = [(
            "x".to_string(),
            Tensor::from_vec(special.clone(), &[special.len()]).unwrap(),
        )];
        let ours = run_graph(g.clone(), &[], &inputs, &profile, false).unwrap()["y"].to_vec();
        let bytes =
            torchlean_onnx::model::encode_model(&torchlean_onnx::export_model(&g, &[]).unwrap())
                .unwrap();
        let path = dir.join(format!("export_{}.onnx", mode.label()));
        std::fs::write(&path, &bytes).unwrap();
        let theirs = tract_run(&path, &inputs).remove(0);
        assert_eq!(bits(&ours), bits(&theirs), "{}", mode.label());
        // and the spec's meaning, element by element
        let spec: Vec<f32> = special
            .iter()
            .map(|&v| torchlean::spec::round(mode, v as f64) as f32)
            .collect();
        assert_eq!(
            bits(&ours),
            bits(&spec),
            "{} against the spec",
            mode.label()
        );
    }
}

/// `TopK` (`torch.topk`; `torch.sort` exports as a `TopK` over the whole axis), largest and
/// smallest, over rows with ties, ±∞, −0/+0 and NaN, against tract: the values bit for bit
/// and the indices exactly; then a gradient through the values reaches exactly the chosen
/// elements (PyTorch's topk backward).
#[test]
fn topk_agrees_with_tract_and_differentiates_the_chosen_elements() {
    let dir = std::env::temp_dir().join(format!("torchlean-topk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let inf = f32::INFINITY;
    // rows of 6: ties, infinities of both signs, signed zeros; (tract's order for NaN is
    // not PyTorch's, so NaN rows are checked below against PyTorch's rule)
    let x: Vec<f32> = vec![
        3.0, 1.0, 3.0, -2.0, 0.5, 1.0, //
        -inf, 2.0, -inf, inf, 0.0, -0.0, //
        5.0, 4.0, 3.0, 2.0, 1.0, 0.0, //
        -1.0, -1.0, -1.0, -1.0, 7.0, -1.0,
    ];
    for (largest, k) in [(1, 3), (0, 3), (1, 6), (0, 6), (1, 1)] {
        let topk = with_int(
            with_int(
                node("t", "TopK", &["x", "k"], &["y", "i"]),
                "largest",
                largest,
            ),
            "axis",
            -1,
        );
        let m = model(
            vec![topk],
            vec![ints("k", &[1], &[k])],
            vec![value_info("x", &[4, 6], FLOAT)],
            vec![
                value_info("y", &[4, k], FLOAT),
                value_info("i", &[4, k], INT64),
            ],
            13,
        );
        let what = format!("topk largest {largest} k {k}");
        let inputs = [(
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[4, 6]).unwrap(),
        )];
        let (got, want) = torchlean_and_tract(&dir, &what, &m, &inputs, &profile);
        assert_eq!(bits(&got), bits(&want), "{what}: {got:?} vs {want:?}");
        // the indices: each row's chosen positions hold the values, in order, and ties
        // are taken in index order
        let imported = torchlean_onnx::import_model(&m, &what, &HashMap::new()).unwrap();
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
        let idx = out["i"].to_vec();
        for r in 0..4 {
            let row = &idx[r * k as usize..(r + 1) * k as usize];
            for (j, &p) in row.iter().enumerate() {
                let v = x[r * 6 + p as usize];
                assert_eq!(v.to_bits(), got[r * k as usize + j].to_bits(), "{what}");
                if j > 0 && v == x[r * 6 + row[j - 1] as usize] {
                    assert!(p > row[j - 1], "{what}: ties in index order: {row:?}");
                }
            }
        }
    }
    // NaN ranks above every number (PyTorch): first among the largest, last among the
    // smallest
    let row = vec![2.0, f32::NAN, -1.0, f32::NAN, 5.0];
    for (largest, want_idx) in [
        (1, [1.0, 3.0, 4.0, 0.0, 2.0]),
        (0, [2.0, 0.0, 4.0, 1.0, 3.0]),
    ] {
        let topk = with_int(
            node("t", "TopK", &["x", "k"], &["y", "i"]),
            "largest",
            largest,
        );
        let m = model(
            vec![topk],
            vec![ints("k", &[1], &[5])],
            vec![value_info("x", &[5], FLOAT)],
            vec![value_info("y", &[5], FLOAT), value_info("i", &[5], INT64)],
            13,
        );
        let inputs = [(
            "x".to_string(),
            Tensor::from_vec(row.clone(), &[5]).unwrap(),
        )];
        let imported = torchlean_onnx::import_model(&m, "nan", &HashMap::new()).unwrap();
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
        assert_eq!(out["i"].to_vec(), want_idx.to_vec(), "largest {largest}");
    }
    // the gradient of Σ w·topk(x, 2) reaches exactly the two chosen elements
    let topk = node("t", "TopK", &["x", "k"], &["v", "i"]);
    let m = model(
        vec![
            topk,
            node("m", "Mul", &["v", "w"], &["p"]),
            with_int(node("s", "ReduceSum", &["p"], &["loss"]), "keepdims", 0),
        ],
        vec![ints("k", &[1], &[2]), floats("w", &[2], &[3.0, -5.0])],
        vec![value_info("x", &[6], FLOAT)],
        vec![value_info("loss", &[], FLOAT)],
        13,
    );
    let x = vec![0.5, 4.0, -1.0, 4.0, 2.0, 0.0];
    let inputs = [("x".to_string(), Tensor::from_vec(x, &[6]).unwrap())];
    let imported = torchlean_onnx::import_model(&m, "grad", &HashMap::new()).unwrap();
    let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap();
    assert_eq!(out["grad.x"].to_vec(), vec![0.0, 3.0, 0.0, -5.0, 0.0, 0.0]);
    // the indices are int64: an integer mean of them (ONNX truncates: 1, where float32 gives
    // 1.5) is refused like any integer arithmetic at run time (the forty-sixth session's
    // review: it was computed in float)
    let m = model(
        vec![
            node("t", "TopK", &["x", "k"], &["v", "i"]),
            with_int(node("r", "ReduceMean", &["i"], &["y"]), "keepdims", 0),
        ],
        vec![ints("k", &[1], &[2])],
        vec![value_info("x", &[6], FLOAT)],
        vec![value_info("y", &[], INT64)],
        13,
    );
    let e = match torchlean_onnx::import_model(&m, "mean", &HashMap::new()) {
        Ok(_) => panic!("an integer mean of TopK's indices was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("ReduceMean"), "{e}");
}

/// `TopK` of an int64 input (integer scores, token ids) selects exactly — its parts compare,
/// negate and gather — so it is admitted (it was refused as integer arithmetic at run time),
/// and its values stay int64: the largest and the smallest against a stable sort of the rows
/// (ties in index order), at the edge of float32's exact integers; integer arithmetic on the
/// values (a mean) is still refused.
#[test]
fn topk_of_integers_selects_exactly_and_keeps_them_integers() {
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let x: Vec<i64> = vec![7, -3, 7, 100, 0, 16_777_216, -16_777_216, 5, 5, 1];
    for largest in [1, 0] {
        let topk = with_int(
            node("t", "TopK", &["x", "k"], &["v", "i"]),
            "largest",
            largest,
        );
        let m = model(
            vec![topk],
            vec![ints("k", &[1], &[3])],
            vec![value_info("x", &[2, 5], INT64)],
            vec![
                value_info("v", &[2, 3], INT64),
                value_info("i", &[2, 3], INT64),
            ],
            13,
        );
        let imported = torchlean_onnx::import_model(&m, "int topk", &HashMap::new()).unwrap();
        let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let inputs = [("x".to_string(), Tensor::from_vec(xs, &[2, 5]).unwrap())];
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, false).unwrap();
        for r in 0..2 {
            let mut order: Vec<usize> = (0..5).collect();
            // a stable sort: equal keys keep index order
            order.sort_by_key(|&j| {
                if largest == 1 {
                    -x[r * 5 + j]
                } else {
                    x[r * 5 + j]
                }
            });
            let want_i: Vec<f32> = order[..3].iter().map(|&j| j as f32).collect();
            let want_v: Vec<f32> = order[..3].iter().map(|&j| x[r * 5 + j] as f32).collect();
            assert_eq!(
                out["i"].to_vec()[r * 3..r * 3 + 3],
                want_i[..],
                "largest {largest} row {r}"
            );
            assert_eq!(
                out["v"].to_vec()[r * 3..r * 3 + 3],
                want_v[..],
                "largest {largest} row {r}"
            );
        }
    }
    let m = model(
        vec![
            node("t", "TopK", &["x", "k"], &["v", "i"]),
            with_int(node("r", "ReduceMean", &["v"], &["y"]), "keepdims", 0),
        ],
        vec![ints("k", &[1], &[2])],
        vec![value_info("x", &[5], INT64)],
        vec![value_info("y", &[], INT64)],
        13,
    );
    let e = match torchlean_onnx::import_model(&m, "mean", &HashMap::new()) {
        Ok(_) => panic!("an integer mean of TopK's values was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("ReduceMean"), "{e}");
}

/// A standalone `Erf` (not the exact-GELU pattern, which becomes `gelu`) imports as
/// torchlean's `erf` op (it was refused as an unknown operator): values against tract (to
/// 1e-6: its erf is an approximation) and against the f64 spec (libm's erf): within 1e-6
/// relative below 0.4 (the native kernel's Maclaurin series) and 5e-7 absolute above
/// (Abramowitz–Stegun 7.1.26 in f32: about 3e-7 near 0.49), ±∞ to ±1, −0 to −0, NaN through; the gradient of Σ w·erf(x)
/// against 2/√π·e^(−x²)·w in f64 (PyTorch's erf backward), under `strict_native_cpu`, whose
/// recompute checker replays both.
#[test]
fn a_standalone_erf_imports_and_differentiates() {
    let dir = std::env::temp_dir().join(format!("torchlean-erf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let x: Vec<f32> = vec![
        -3.5, -1.2, -0.41, -0.39, -1e-3, -0.0, 0.0, 1e-30, 0.2, 0.43, 0.45, 0.47, 0.49, 0.5, 0.9,
        1.7, 2.6, 4.0, 9.0,
    ];
    let n = x.len() as i64;
    let m = model(
        vec![node("e", "Erf", &["x"], &["y"])],
        vec![],
        vec![value_info("x", &[n], FLOAT)],
        vec![value_info("y", &[n], FLOAT)],
        13,
    );
    let inputs = [(
        "x".to_string(),
        Tensor::from_vec(x.clone(), &[x.len()]).unwrap(),
    )];
    let (got, want) = torchlean_and_tract(&dir, "erf", &m, &inputs, &profile);
    for ((g, w), v) in got.iter().zip(&want).zip(&x) {
        let exact = torchlean::scalar::Scalar::erf(*v as f64);
        assert!(
            (*g as f64 - exact).abs() <= 2.4e-7,
            "erf({v}) = {g}, libm {exact}"
        );
        // tract's own erf is an approximation good to about 5e-7 here
        assert!((g - w).abs() <= 1e-6, "erf({v}) = {g}, tract {w}");
    }
    assert_eq!(got[5].to_bits(), (-0.0f32).to_bits(), "erf(-0) is -0");
    // special values and the gradient
    let xs = vec![f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -0.7, 0.3, 1.9];
    let w = [2.0f32, -1.0, 0.5, 1.5, -3.0, 0.25];
    let m = model(
        vec![
            node("e", "Erf", &["x"], &["y"]),
            node("m", "Mul", &["y", "w"], &["p"]),
            with_int(node("s", "ReduceSum", &["p"], &["loss"]), "keepdims", 0),
        ],
        vec![floats("w", &[6], &w)],
        vec![value_info("x", &[6], FLOAT)],
        vec![value_info("loss", &[], FLOAT), value_info("y", &[6], FLOAT)],
        13,
    );
    let imported = torchlean_onnx::import_model(&m, "erf grad", &HashMap::new()).unwrap();
    let inputs = [("x".to_string(), Tensor::from_vec(xs.clone(), &[6]).unwrap())];
    let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap();
    let y = out["y"].to_vec();
    assert_eq!((y[0], y[1]), (-1.0, 1.0));
    assert!(y[2].is_nan());
    let gx = out["grad.x"].to_vec();
    assert_eq!((gx[0], gx[1]), (0.0, 0.0), "no gradient at ±∞");
    assert!(gx[2].is_nan(), "NaN passes");
    for i in 3..6 {
        let v = xs[i] as f64;
        let want = std::f64::consts::FRAC_2_SQRT_PI * (-v * v).exp() * w[i] as f64;
        assert!(
            (gx[i] as f64 - want).abs() <= 1e-6 * want.abs(),
            "d erf at {v}: {} vs {want}",
            gx[i]
        );
    }
}

/// `Tan`, `Atan`, `Asin`, `Acos` and `Sinh`, `Cosh`, `Asinh`, `Acosh`, `Atanh` import as
/// torchlean's ops (they were refused as unknown operators): values against tract and the
/// f64 spec (the library functions), and the gradient of Σ w·f(x) against PyTorch's backward
/// formulas evaluated in f64 — 1 + tan², 1/(x² + 1), ±1/√(1 − x²), cosh, sinh, 1/√(x² ± 1),
/// 1/(1 − x²) — under `strict_native_cpu` (its recompute checker replays both); outside
/// [−1, 1] asin, acos and atanh are NaN, and at ±1 their gradients infinite (atanh ±∞ there;
/// beyond, its gradient is PyTorch's finite g / (1 − x²)).
#[test]
fn trigonometric_maps_import_and_differentiate() {
    let dir = std::env::temp_dir().join(format!("torchlean-trig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = BackendProfile::named("strict_native_cpu").expect("profile");
    let x: Vec<f32> = vec![-0.93, -0.5, -0.0, 0.0, 0.1, 0.37, 0.71, 0.99];
    let w: Vec<f32> = vec![1.5, -2.0, 0.5, 1.0, 3.0, -0.25, 0.75, -1.0];
    type F = fn(f64) -> f64;
    let cases: [(&str, F, F); 9] = [
        ("Tan", f64::tan, |v| 1.0 + v.tan() * v.tan()),
        ("Atan", f64::atan, |v| 1.0 / (v * v + 1.0)),
        ("Asin", f64::asin, |v| 1.0 / (1.0 - v * v).sqrt()),
        ("Acos", f64::acos, |v| -1.0 / (1.0 - v * v).sqrt()),
        ("Sinh", f64::sinh, f64::cosh),
        ("Cosh", f64::cosh, f64::sinh),
        ("Asinh", f64::asinh, |v| 1.0 / (v * v + 1.0).sqrt()),
        // acosh's domain starts at 1: its inputs are shifted below
        ("Acosh", f64::acosh, |v| 1.0 / (v * v - 1.0).sqrt()),
        ("Atanh", f64::atanh, |v| 1.0 / (1.0 - v * v)),
    ];
    for (op, f, df) in cases {
        let x: Vec<f32> = if op == "Acosh" {
            x.iter().map(|v| 2.0 + v).collect()
        } else {
            x.clone()
        };
        let m = model(
            vec![
                node("f", op, &["x"], &["y"]),
                node("m", "Mul", &["y", "w"], &["p"]),
                with_int(node("s", "ReduceSum", &["p"], &["loss"]), "keepdims", 0),
            ],
            vec![floats("w", &[8], &w)],
            vec![value_info("x", &[8], FLOAT)],
            vec![value_info("y", &[8], FLOAT), value_info("loss", &[], FLOAT)],
            13,
        );
        let inputs = [("x".to_string(), Tensor::from_vec(x.clone(), &[8]).unwrap())];
        let (got, want) = torchlean_and_tract(&dir, op, &m, &inputs, &profile);
        for ((g, t), v) in got.iter().zip(&want).take(8).zip(&x) {
            let exact = f(*v as f64);
            let ulp = 2.0 * f32::EPSILON as f64 * exact.abs().max(f32::MIN_POSITIVE as f64);
            assert!(
                (*g as f64 - exact).abs() <= ulp,
                "{op}({v}) = {g}, f64 {exact}"
            );
            assert!(
                (g - t).abs() <= 1e-6 * t.abs().max(1.0),
                "{op}({v}) = {g}, tract {t}"
            );
        }
        if !matches!(op, "Acos" | "Cosh" | "Acosh") {
            // the odd functions keep the sign of zero
            assert_eq!(got[2].to_bits(), (-0.0f32).to_bits(), "{op}(-0)");
        }
        let imported = torchlean_onnx::import_model(&m, op, &HashMap::new()).unwrap();
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap();
        let gx = out["grad.x"].to_vec();
        for i in 0..8 {
            let want = df(x[i] as f64) * w[i] as f64;
            assert!(
                // 1 − x² cancels near ±1 in f32 (PyTorch's formula as well): 2e-5 relative
                (gx[i] as f64 - want).abs() <= 2e-5 * want.abs().max(1e-30),
                "d{op} at {}: {} vs {want}",
                x[i],
                gx[i]
            );
        }
    }
    // outside the domain: NaN values; at ±1 an infinite gradient (PyTorch's)
    for op in ["Asin", "Acos", "Atanh"] {
        let m = model(
            vec![
                node("f", op, &["x"], &["y"]),
                with_int(node("s", "ReduceSum", &["y"], &["loss"]), "keepdims", 0),
            ],
            vec![],
            vec![value_info("x", &[3], FLOAT)],
            vec![value_info("loss", &[], FLOAT), value_info("y", &[3], FLOAT)],
            13,
        );
        let imported = torchlean_onnx::import_model(&m, op, &HashMap::new()).unwrap();
        let inputs = [(
            "x".to_string(),
            Tensor::from_vec(vec![1.0, -1.0, 1.5], &[3]).unwrap(),
        )];
        let out = run_graph(imported.graph, &imported.values, &inputs, &profile, true).unwrap();
        let (y, gx) = (out["y"].to_vec(), out["grad.x"].to_vec());
        if op == "Atanh" {
            assert_eq!(
                (y[0], y[1]),
                (f32::INFINITY, f32::NEG_INFINITY),
                "{op}: {y:?}"
            );
        } else {
            assert!(y[0].is_finite() && y[1].is_finite(), "{op}: {y:?}");
        }
        assert!(y[2].is_nan(), "{op}: {y:?}");
        let sign = if op == "Acos" { -1.0 } else { 1.0 };
        assert_eq!(
            (gx[0], gx[1]),
            (sign * f32::INFINITY, sign * f32::INFINITY),
            "{op}"
        );
        if op == "Atanh" {
            // PyTorch's g / (1 − x²) is finite beyond the domain, where the value is NaN
            assert_eq!(gx[2], 1.0 / (1.0 - 1.5f32 * 1.5), "{op}");
        } else {
            assert!(gx[2].is_nan(), "{op}");
        }
    }
}
