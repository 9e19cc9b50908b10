//! ONNX `Trilu` (PyTorch's exporter writes a causal mask as `Trilu` of a constant): folded at
//! import on a constant, `where(triangle, x, 0)` on a computed value; both against the
//! operator's definition written out here (keep element (i, j) of the last two axes when
//! j − i ≥ k for `upper=1`, j − i ≤ k for `upper=0`, else 0).

mod common;

use common::{constant, floats, ints, model, node, run_graph, value_info as vi, with_int};
use onnx_protobuf::NodeProto;
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;

/// The definition, on a row-major [.., rows, cols] tensor.
fn trilu(x: &[f32], rows: usize, cols: usize, upper: bool, k: i64) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(e, &v)| {
            let (i, j) = ((e / cols) % rows, e % cols);
            let d = j as i64 - i as i64;
            if (upper && d >= k) || (!upper && d <= k) {
                v
            } else {
                0.0
            }
        })
        .collect()
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// `y = x + Trilu(c)` with c a `Constant` and `z = Trilu(x)` with x the input, for every
/// `upper` and a few diagonals, against the definition (values of x include NaN and ±inf
/// outside and inside the triangle).
#[test]
fn trilu_of_constants_and_of_computed_values_follows_the_definition() {
    let (rows, cols) = (3usize, 4usize);
    let x: Vec<f32> = (0..2 * rows * cols)
        .map(|i| match i % 7 {
            0 => f32::NAN,
            3 => f32::INFINITY,
            5 => f32::NEG_INFINITY,
            _ => i as f32 * 0.5 - 3.0,
        })
        .collect();
    let c: Vec<f32> = (0..2 * rows * cols).map(|i| i as f32 + 1.0).collect();
    for upper in [0, 1] {
        for k in [-2i64, -1, 0, 1, 3, 1 << 40] {
            let m = model(
                vec![
                    constant("c", floats("c", &[2, 3, 4], &c)),
                    constant("k", ints("k", &[], &[k])),
                    with_int(node("tc", "Trilu", &["c", "k"], &["tc"]), "upper", upper),
                    node("add", "Add", &["x", "tc"], &["y"]),
                    with_int(node("tx", "Trilu", &["x", "k"], &["z"]), "upper", upper),
                ],
                vec![],
                vec![vi("x", &[2, 3, 4], FLOAT)],
                vec![vi("y", &[2, 3, 4], FLOAT), vi("z", &[2, 3, 4], FLOAT)],
                18,
            );
            let imported = torchlean_onnx::import_model(&m, "trilu", &HashMap::new())
                .unwrap_or_else(|e| panic!("upper {upper}, k {k}: {e}"));
            let inputs = vec![(
                "x".to_string(),
                Tensor::from_vec(x.clone(), &[2, 3, 4]).expect("shape"),
            )];
            let p = BackendProfile::named("checked_cpu").expect("profile");
            let out =
                run_graph(imported.graph, &imported.values, &inputs, &p, false).expect("runs");
            let tc = trilu(&c, rows, cols, upper == 1, k);
            let want_y: Vec<f32> = x.iter().zip(&tc).map(|(a, b)| a + b).collect();
            let want_z = trilu(&x, rows, cols, upper == 1, k);
            assert!(
                same(&out["y"].to_vec(), &want_y),
                "constant, upper {upper}, k {k}"
            );
            assert!(
                same(&out["z"].to_vec(), &want_z),
                "computed, upper {upper}, k {k}"
            );
        }
    }
}

#[test]
fn trilu_of_a_vector_or_with_several_diagonals_is_refused() {
    // Trilu on an input of `dims`, after `nodes`; the import's refusal
    let refusal = |mut nodes: Vec<NodeProto>, dims: &[i64]| {
        nodes.push(node("t", "Trilu", &["x", "k"], &["y"]));
        let m = model(
            nodes,
            vec![],
            vec![vi("x", dims, FLOAT)],
            vec![vi("y", dims, FLOAT)],
            18,
        );
        torchlean_onnx::import_model(&m, "t", &HashMap::new())
            .err()
            .expect("refused")
            .to_string()
    };
    let k = |v: &[i64]| constant("k", ints("k", &[v.len() as i64], v));
    let e = refusal(vec![k(&[0])], &[4]);
    assert!(e.contains("rank 1"), "{e}");
    let e = refusal(vec![k(&[0, 1])], &[2, 2]);
    assert!(e.contains("one integer"), "{e}");
}
