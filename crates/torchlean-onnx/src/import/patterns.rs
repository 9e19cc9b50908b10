//! Subgraphs that exporters emit for one torchlean op, recognized before the node walk.
//!
//! PyTorch exports the exact GELU at opsets before 20 as
//! `x · (0.5 · (Erf(x / √2) + 1))` — five nodes around an `Erf`. When every intermediate value of that shape is read only inside it (and
//! is not a graph output), the five nodes are replaced by one `Gelu` node producing the
//! last one's output, which maps to torchlean's `gelu` (the same function, x·Φ(x)). The
//! accepted forms: the scaling as `Div(x, √2)` or `Mul(x, 1/√2)`, operands of `Add`/`Mul`
//! in either order, and the halving applied to the sum, to x, or to their product.
//! Anything else keeps its nodes (an `Erf` is then torchlean's `erf` op, and the nodes around
//! it their own ops: the same function, in more kernels). A constant
//! of rank above 0 (one element, e.g. `[1, 1, 1]`) broadcasts the nodes' result to its rank
//! where x's is lower; the replacement then multiplies `Gelu(x)` by a one-element 1.0 of
//! that rank, so that the result's shape is the nodes' own.

use crate::constant::Const;
use onnx_protobuf::{attribute_proto::AttributeType, GraphProto, NodeProto};
use std::collections::{HashMap, HashSet};

/// The doc string of nodes this module writes in place of the model's (their operator may
/// be newer than the model's opset: the importer's own form, not the model's).
pub(super) const REWRITTEN: &str = "torchlean: rewritten by the importer";

/// The graph's nodes with every recognized GELU subgraph replaced by one `Gelu` node.
pub fn fuse_gelu(g: &GraphProto) -> Vec<NodeProto> {
    let producer: HashMap<&str, usize> = g
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for n in &g.node {
        for i in &n.input {
            *readers.entry(i.as_str()).or_default() += 1;
        }
    }
    for o in &g.output {
        *readers.entry(o.name.as_str()).or_default() += 1;
    }
    let scalar = |name: &str| -> Option<f32> {
        if let Some(t) = g.initializer.iter().find(|t| t.name == name) {
            return Const::from_proto(t).ok()?.scalar();
        }
        let n = &g.node[*producer.get(name)?];
        if n.op_type != "Constant" || n.attribute.len() != 1 {
            return None;
        }
        let a = &n.attribute[0];
        match a.name.as_str() {
            "value" if a.type_.value() == AttributeType::TENSOR as i32 => {
                Const::from_proto(a.t.as_ref()?).ok()?.scalar()
            }
            "value_float" => Some(a.f),
            _ => None,
        }
    };
    // the rank of the one-element constant `name` (ONNX broadcasting prepends its extra
    // axes to the result: a [1, 1, 1] constant makes a [3, 7] x's GELU [1, 3, 7])
    let rank = |name: &str| -> usize {
        if let Some(t) = g.initializer.iter().find(|t| t.name == name) {
            return t.dims.len();
        }
        producer
            .get(name)
            .and_then(|&i| g.node[i].attribute.first())
            .and_then(|a| a.t.as_ref())
            .map_or(0, |t| t.dims.len())
    };
    let near = |v: Option<f32>, want: f32| v.is_some_and(|v| (v - want).abs() <= 1e-6 * want.abs());
    // the node producing `name`, if it is an `op` read exactly once
    let only = |name: &str, op: &str| -> Option<usize> {
        let i = *producer.get(name)?;
        (g.node[i].op_type == op && readers.get(name) == Some(&1)).then_some(i)
    };
    // for a binary node: (the operand that is the scalar `want`, the other one)
    let with_scalar = |n: &NodeProto, want: f32| -> Option<String> {
        match n.input.as_slice() {
            [a, b] if near(scalar(b), want) => Some(a.clone()),
            [a, b] if near(scalar(a), want) => Some(b.clone()),
            _ => None,
        }
    };
    let mut replaced: HashSet<usize> = HashSet::new();
    let mut at: HashMap<usize, Vec<NodeProto>> = HashMap::new();
    for (e, erf) in g.node.iter().enumerate() {
        if erf.op_type != "Erf" || erf.input.len() != 1 || erf.output.len() != 1 {
            continue;
        }
        let Some(found) = (|| {
            // s = x / √2 (or x · 1/√2)
            let s = only(&erf.input[0], "Div").or_else(|| only(&erf.input[0], "Mul"))?;
            let sn = &g.node[s];
            let x = if sn.op_type == "Div" {
                match sn.input.as_slice() {
                    [x, k] if near(scalar(k), std::f32::consts::SQRT_2) => x.clone(),
                    _ => return None,
                }
            } else {
                with_scalar(sn, std::f32::consts::FRAC_1_SQRT_2)?
            };
            // p = erf + 1: its single reader
            let p = g
                .node
                .iter()
                .position(|n| n.op_type == "Add" && n.input.contains(&erf.output[0]))?;
            if readers.get(erf.output[0].as_str()) != Some(&1)
                || with_scalar(&g.node[p], 1.0)? != erf.output[0]
            {
                return None;
            }
            let p_out = g.node[p].output.first()?.clone();
            // the halving and the product with x, in one of three arrangements
            let reader_of = |name: &str| -> Option<usize> {
                (readers.get(name) == Some(&1)).then_some(())?;
                g.node
                    .iter()
                    .position(|n| n.op_type == "Mul" && n.input.iter().any(|i| i == name))
            };
            let m1 = reader_of(&p_out)?;
            let other = |n: &NodeProto, this: &str| -> Option<String> {
                match n.input.as_slice() {
                    [a, b] if a == this => Some(b.clone()),
                    [a, b] if b == this => Some(a.clone()),
                    _ => None,
                }
            };
            let o1 = other(&g.node[m1], &p_out)?;
            let m1_out = g.node[m1].output.first()?.clone();
            let (middle, last) = if near(scalar(&o1), 0.5) {
                // 0.5·p, then x·(0.5·p)
                let m2 = reader_of(&m1_out)?;
                (m1, (m2, other(&g.node[m2], &m1_out)? == x))
            } else if o1 == x {
                // x·p, then (x·p)·0.5
                let m2 = reader_of(&m1_out)?;
                (m1, (m2, near(scalar(&other(&g.node[m2], &m1_out)?), 0.5)))
            } else {
                // (0.5·x)·p: o1 must be 0.5·x, read only here
                let h = only(&o1, "Mul")?;
                (h, (m1, with_scalar(&g.node[h], 0.5)? == x))
            };
            let (last, ok) = last;
            ok.then_some((vec![s, e, p, middle, last], x, last))
        })() else {
            continue;
        };
        let (nodes, x, last) = found;
        if nodes.iter().any(|i| replaced.contains(i)) {
            continue;
        }
        let out = match g.node[last].output.first() {
            Some(o) => o.clone(),
            None => continue,
        };
        // the highest rank among the pattern's constants: above 0, the result is GELU(x)
        // broadcast with a one-element tensor of that rank, as the nodes' own broadcasting
        let raised = nodes
            .iter()
            .flat_map(|&i| g.node[i].input.iter())
            .filter(|name| scalar(name).is_some())
            .map(|name| rank(name))
            .max()
            .unwrap_or(0);
        let mut gelu = NodeProto::new();
        gelu.op_type = "Gelu".into();
        gelu.doc_string = REWRITTEN.into();
        gelu.name = format!("{} (Erf GELU pattern)", g.node[last].name);
        gelu.input = vec![x];
        replaced.extend(nodes);
        let mut fused = Vec::new();
        if raised == 0 {
            gelu.output = vec![out];
        } else {
            // × a one-element 1.0 of the constants' rank: exact (x · 1 = x for every f32,
            // NaN and ±inf included), and the product's broadcasting is the nodes' own
            let value = format!("{out} (Erf GELU pattern, before broadcasting)");
            let one = format!("{out} (Erf GELU pattern, 1 of rank {raised})");
            gelu.output = vec![value.clone()];
            let mut c = NodeProto::new();
            c.op_type = "Constant".into();
            c.output = vec![one.clone()];
            let mut t = onnx_protobuf::TensorProto::new();
            t.dims = vec![1; raised];
            t.data_type = onnx_protobuf::tensor_proto::DataType::FLOAT as i32;
            t.float_data = vec![1.0];
            let mut a = onnx_protobuf::AttributeProto::new();
            a.name = "value".into();
            a.type_ = AttributeType::TENSOR.into();
            a.t = Some(t).into();
            c.attribute = vec![a];
            let mut m = NodeProto::new();
            m.op_type = "Mul".into();
            m.name = format!("{} (Erf GELU pattern, broadcast)", g.node[last].name);
            m.input = vec![value, one];
            m.output = vec![out];
            fused.extend([c, m]);
        }
        fused.insert(0, gelu);
        at.insert(last, fused);
    }
    g.node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| match at.remove(&i) {
            Some(fused) => fused,
            None if replaced.contains(&i) => vec![],
            None => vec![n.clone()],
        })
        .collect()
}
