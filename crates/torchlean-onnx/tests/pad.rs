//! ONNX `Pad` in `constant` mode (PyTorch's `F.pad`, `nn.ZeroPad2d`, `nn.ConstantPad*d`):
//! imported as `slice` (negative amounts crop) and `concat` with blocks of the constant,
//! checked against Pad's definition written out here (an output index maps back to the input
//! index minus the leading amount, or holds the constant), with the `axes` input of opset 18,
//! and the gradient of `loss = Σ y²` against its definition (2·w where w is kept, 0 where it
//! is cropped); the modes and operands it cannot honour are refused.

mod common;

use common::{floats, ints, model, node, run_graph, value_info as vi, values, with_int};
use onnx_protobuf::{attribute_proto::AttributeType, AttributeProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;

const FLOAT: i32 = 1;

/// Pad's definition: output extent n + before + after per axis; output index o reads input
/// index o − before when that lies in [0, n), else holds `value`.
fn reference(x: &[f32], dims: &[usize], pads: &[(i64, i64)], value: f32) -> (Vec<f32>, Vec<usize>) {
    let out: Vec<usize> = dims
        .iter()
        .zip(pads)
        .map(|(&n, &(b, a))| (n as i64 + b + a) as usize)
        .collect();
    let total: usize = out.iter().product();
    let mut y = Vec::with_capacity(total);
    for flat in 0..total {
        let (mut rem, mut src, mut inside) = (flat, 0usize, true);
        let mut stride = 1usize;
        let mut offsets = vec![0usize; dims.len()];
        for ax in (0..dims.len()).rev() {
            let o = rem % out[ax];
            rem /= out[ax];
            let i = o as i64 - pads[ax].0;
            if i < 0 || i >= dims[ax] as i64 {
                inside = false;
            } else {
                offsets[ax] = i as usize;
            }
        }
        if inside {
            for ax in (0..dims.len()).rev() {
                src += offsets[ax] * stride;
                stride *= dims[ax];
            }
            y.push(x[src]);
        } else {
            y.push(value);
        }
    }
    (y, out)
}

fn string_attr(name: &str, v: &str) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRING.into();
    a.s = v.as_bytes().to_vec();
    a
}

#[test]
fn constant_pad_follows_its_definition_forward_and_backward() {
    // (dims, pads as (begin, end) per axis, value, opset-18 axes input)
    type Case = (Vec<usize>, Vec<(i64, i64)>, f32, Option<Vec<i64>>);
    let cases: Vec<Case> = vec![
        (
            vec![2, 3, 4, 5],
            vec![(0, 0), (0, 1), (1, 2), (-1, 1)],
            0.5,
            None,
        ),
        (
            vec![2, 3, 4, 5],
            vec![(0, 0), (0, 0), (1, 1), (1, 1)],
            0.0,
            None,
        ),
        (vec![3, 6], vec![(0, 0), (2, -2)], -1.25, Some(vec![-1])),
        (vec![4, 7], vec![(-1, -2), (3, 0)], 2.0, None),
    ];
    for (case, (dims, pads, value, axes)) in cases.into_iter().enumerate() {
        let n: usize = dims.iter().product();
        let x = values(n, 11 + case as u64);
        let d64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        // the pads input lists the named axes' begins, then their ends
        let named: Vec<usize> = match &axes {
            Some(a) => a
                .iter()
                .map(|&ax| (ax + dims.len() as i64) as usize % dims.len())
                .collect(),
            None => (0..dims.len()).collect(),
        };
        let mut pad_list: Vec<i64> = named.iter().map(|&ax| pads[ax].0).collect();
        pad_list.extend(named.iter().map(|&ax| pads[ax].1));
        let (want, out_dims) = reference(&x, &dims, &pads, value);
        let o64: Vec<i64> = out_dims.iter().map(|&d| d as i64).collect();
        let mut pad_inputs = vec!["w", "pads", "value"];
        let mut inits = vec![
            floats("w", &d64, &x),
            ints("pads", &[pad_list.len() as i64], &pad_list),
            floats("value", &[], &[value]),
        ];
        if let Some(a) = &axes {
            pad_inputs.push("axes");
            inits.push(ints("axes", &[a.len() as i64], a));
        }
        let m = model(
            vec![
                node("pad", "Pad", &pad_inputs, &["y"]),
                node("sq", "Mul", &["y", "y"], &["y2"]),
                with_int(node("sum", "ReduceSum", &["y2"], &["loss"]), "keepdims", 0),
            ],
            inits,
            vec![],
            vec![vi("y", &o64, FLOAT), vi("loss", &[], FLOAT)],
            if axes.is_some() { 18 } else { 13 },
        );
        let imported = torchlean_onnx::import_model(&m, "pad", &HashMap::new())
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        // d(Σ y²)/dw = 2·w where w reaches y, 0 where it was cropped
        let kept = |flat: usize| {
            let mut rem = flat;
            (0..dims.len()).rev().all(|ax| {
                let i = (rem % dims[ax]) as i64;
                rem /= dims[ax];
                i >= -pads[ax].0.min(0) && i < dims[ax] as i64 + pads[ax].1.min(0)
            })
        };
        let want_grad: Vec<f32> = (0..n)
            .map(|f| if kept(f) { 2.0 * x[f] } else { 0.0 })
            .collect();
        for profile in ["checked_cpu", "strict_native_cpu"] {
            let p = BackendProfile::named(profile).expect("profile");
            let out = run_graph(imported.graph.clone(), &imported.values, &[], &p, true)
                .unwrap_or_else(|e| panic!("case {case} {profile}: {e}"));
            assert_eq!(out["y"].shape(), &out_dims[..], "case {case} {profile}");
            assert_eq!(out["y"].to_vec(), want, "case {case} {profile}: y");
            common::assert_close(
                &format!("case {case} {profile} grad.w"),
                &out["grad.w"].to_vec(),
                &want_grad,
                1e-6,
            );
        }
    }
}

#[test]
fn pads_it_cannot_honour_are_refused_with_the_reason() {
    let refused =
        |pad: onnx_protobuf::NodeProto, extra: Vec<onnx_protobuf::TensorProto>, opset: i64| {
            let mut inits = vec![floats("w", &[2, 3], &values(6, 5))];
            inits.extend(extra);
            let m = model(
                vec![pad],
                inits,
                vec![vi("x", &[2, 3], FLOAT)],
                vec![vi("y", &[2, 3], FLOAT)],
                opset,
            );
            match torchlean_onnx::import_model(&m, "pad", &HashMap::new()) {
                Ok(_) => panic!("imported"),
                Err(e) => e.to_string(),
            }
        };
    // `wrap` exists from opset 19; `reflect` by the axis length or more is undefined
    let mut wrap = node("p", "Pad", &["w", "pads"], &["y"]);
    wrap.attribute.push(string_attr("mode", "wrap"));
    let e = refused(wrap, vec![ints("pads", &[4], &[0, 1, 0, 1])], 13);
    assert!(e.contains("Pad mode `wrap` in opset 13"), "{e}");
    let mut reflect = node("p", "Pad", &["w", "pads"], &["y"]);
    reflect.attribute.push(string_attr("mode", "reflect"));
    let e = refused(reflect, vec![ints("pads", &[4], &[0, 3, 0, 0])], 13);
    assert!(e.contains("each amount must be below the length"), "{e}");
    // a constant value computed at run time
    let e = refused(
        node("p", "Pad", &["w", "pads", "x"], &["y"]),
        vec![ints("pads", &[4], &[0, 1, 0, 1])],
        13,
    );
    assert!(e.contains("constant_value computed at run time"), "{e}");
    // more cropped than the axis holds
    let e = refused(
        node("p", "Pad", &["w", "pads"], &["y"]),
        vec![ints("pads", &[4], &[0, -2, 0, -2])],
        13,
    );
    assert!(e.contains("crops 4 of the 3 elements"), "{e}");
    // hostile amounts: the most negative and the largest i64
    let e = refused(
        node("p", "Pad", &["w", "pads"], &["y"]),
        vec![ints("pads", &[4], &[0, i64::MIN, 0, i64::MIN])],
        13,
    );
    assert!(e.contains("crops"), "{e}");
    let e = refused(
        node("p", "Pad", &["w", "pads"], &["y"]),
        vec![ints("pads", &[4], &[i64::MAX, 0, 0, 0])],
        13,
    );
    assert!(e.contains("limit") || e.contains("2^64"), "{e}");
    // a block past the import's constant budget
    let e = refused(
        node("p", "Pad", &["w", "pads"], &["y"]),
        vec![ints("pads", &[4], &[0, 0, 1 << 40, 0])],
        13,
    );
    assert!(e.contains("limit"), "{e}");
    // pads of the wrong length, a repeated axis
    let e = refused(
        node("p", "Pad", &["w", "pads"], &["y"]),
        vec![ints("pads", &[2], &[1, 1])],
        13,
    );
    assert!(e.contains("2 pads for 2 axes"), "{e}");
    let e = refused(
        node("p", "Pad", &["w", "pads", "", "axes"], &["y"]),
        vec![
            ints("pads", &[4], &[1, 1, 1, 1]),
            ints("axes", &[2], &[1, -1]),
        ],
        18,
    );
    assert!(e.contains("repeated axis"), "{e}");
}
