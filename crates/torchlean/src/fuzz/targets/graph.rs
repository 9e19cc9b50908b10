//! Graph files (`torchlean.ir.v1`): seeds from every op and the MLP, a mutator that edits
//! the JSON structure, and the run of an accepted graph under its invariants.

use super::{fnv, ramp, sample_op, set, values, with_session, Res};
use crate::backend::BackendProfile;
use crate::fuzz::mutate::{
    interesting_u64, mutate_bytes, mutate_json, mutate_json_text, Rng, STRINGS,
};
use crate::fuzz::{Executed, Refusal};
use crate::graph::{append_backward, Graph, NodeKind, Op, OpKind, OutputDecl, ValueDecl, SEED};
use crate::nn::{Activation, Mlp, Module};
use crate::runtime::compiled::CompiledGraph;
use crate::tensor::Tensor;
use serde_json::Value;
use std::collections::BTreeMap;

/// Graphs whose nodes hold more elements than this in all are validated but not run.
const RUN_ELEMENTS: usize = 1 << 15;
/// Nor are graphs with more nodes than this.
const RUN_NODES: usize = 4096;
/// Nor graphs with a pooling node of more output elements × window taps than this.
const RUN_POOL_WORK: u128 = 1 << 22;

/// The leaves seed graphs draw their op inputs from: (name, shape, kind).
const LEAVES: &[(&str, &[usize], u8)] = &[
    ("x", &[2, 3, 4, 4], 0),
    ("m", &[4, 6], 0),
    ("t", &[2, 4, 8], 0),
    ("q", &[2, 2, 4, 8], 0),
    ("i", &[2], 0),
    ("w", &[4, 3, 3, 3], 1),
    ("w2", &[5, 6], 1),
    ("b", &[5], 1),
    ("wt", &[3, 2, 3, 3], 1),
    ("sw", &[4, 3, 2], 1),
    ("v", &[6], 2),
    ("s", &[1], 2),
];

fn leaf_graph(used: &[usize]) -> Option<(Graph, Vec<usize>)> {
    let mut g = Graph::new();
    let mut ids = vec![usize::MAX; LEAVES.len()];
    for &l in used {
        if ids[l] != usize::MAX {
            continue;
        }
        let (name, shape, kind) = LEAVES[l];
        let decl = ValueDecl {
            name: name.into(),
            shape: shape.to_vec(),
        };
        let node = match kind {
            0 => {
                g.inputs.push(decl);
                NodeKind::Input { name: name.into() }
            }
            1 => {
                g.parameters.push(decl);
                NodeKind::Parameter { name: name.into() }
            }
            _ => {
                g.parameters.push(decl);
                NodeKind::Constant { name: name.into() }
            }
        };
        ids[l] = g.push(node, vec![]).ok()?;
    }
    Some((g, ids))
}

/// The first tuple of leaves (up to three, or three of one leaf and a mask) `op` accepts.
fn parents_for(op: &Op) -> Option<Vec<usize>> {
    let n = LEAVES.len();
    let shapes: Vec<&[usize]> = LEAVES.iter().map(|l| l.1).collect();
    let ok = |ps: &[usize]| {
        let s: Vec<&[usize]> = ps.iter().map(|&p| shapes[p]).collect();
        crate::spec::infer_shape(op, &s).is_ok()
    };
    let mut tuples: Vec<Vec<usize>> = vec![vec![]];
    tuples.extend((0..n).map(|a| vec![a]));
    tuples.extend((0..n * n).map(|k| vec![k / n, k % n]));
    tuples.extend((0..n * n * n).map(|k| vec![k / (n * n), (k / n) % n, k % n]));
    tuples.extend((0..n * n).map(|k| vec![k / n, k / n, k / n, k % n]));
    tuples.into_iter().find(|t| ok(t))
}

/// A graph of `op` over its leaves, with outputs `y` and, when differentiable, `loss`.
fn op_graph(op: &Op, parents: &[usize]) -> Option<Graph> {
    let (mut g, ids) = leaf_graph(parents)?;
    let ps: Vec<usize> = parents.iter().map(|&p| ids[p]).collect();
    let y = g.push(NodeKind::Op { op: op.clone() }, ps).ok()?;
    g.outputs.push(OutputDecl {
        name: "y".into(),
        node: y,
    });
    if op.kind().differentiable() {
        let loss = g.push(NodeKind::Op { op: Op::SumAll }, vec![y]).ok()?;
        g.outputs.push(OutputDecl {
            name: "loss".into(),
            node: loss,
        });
        if append_backward(&mut g.clone(), "loss", None).is_err() {
            g.outputs.pop();
        }
    }
    Some(g)
}

/// A small graph of one typical op of `kind` ([`super::sample_op`]) over inputs, parameters
/// and constants of fixed shapes, with output `y` (and `loss`, its sum, when the op is
/// differentiable); `None` when no combination of those shapes suits the op. For tests that
/// hold a per-kind rule (e.g. which ops ONNX export refuses) to what a graph of it does.
pub fn sample_graph(kind: OpKind) -> Option<Graph> {
    let op = sample_op(kind);
    op_graph(&op, &parents_for(&op)?)
}

/// A derived graph as a user may write it (vjp nodes included): the names backward
/// derivation generated (`grad.seed`, `grad.x`) moved out of the reserved namespace.
fn user_names(mut g: Graph) -> Graph {
    let rename = |n: &mut String| {
        if let Some(rest) = n.strip_prefix(crate::graph::RESERVED_PREFIX) {
            *n = format!("d_{rest}");
        }
    };
    g.parameters.iter_mut().for_each(|d| rename(&mut d.name));
    g.inputs.iter_mut().for_each(|d| rename(&mut d.name));
    g.outputs.iter_mut().for_each(|o| rename(&mut o.name));
    for n in &mut g.nodes {
        match &mut n.kind {
            NodeKind::Input { name }
            | NodeKind::Parameter { name }
            | NodeKind::Constant { name } => rename(name),
            _ => {}
        }
    }
    g
}

fn mlp_graph_seeds() -> Res<Vec<Graph>> {
    with_session(|| {
        let model = Mlp::new(&[3, 8, 2], Activation::Tanh, 1)?;
        let x = ramp(&[4, 3], 0.1)?;
        let y = ramp(&[4, 2], 0.2)?;
        let params: Vec<(String, Tensor)> = model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect();
        let captured =
            crate::runtime::capture::capture(&[("x".into(), x), ("y".into(), y)], &params, |xs| {
                let p = model.forward(&xs[0])?;
                let loss = p.mse_loss(&xs[1])?;
                Ok(vec![("prediction".into(), p), ("loss".into(), loss)])
            })?;
        let mut backward = captured.graph.clone();
        append_backward(&mut backward, "loss", None)
            .map_err(|e| crate::Error::Other(e.to_string()))?;
        Ok(vec![captured.graph, user_names(backward)])
    })
}

pub(super) fn graph_seeds() -> Res<Vec<Vec<u8>>> {
    let mut graphs = mlp_graph_seeds()?;
    let mut catalog: Vec<(Op, Vec<usize>)> = Vec::new();
    for &kind in OpKind::ALL {
        let op = sample_op(kind);
        let Some(parents) = parents_for(&op) else {
            continue;
        };
        let Some(g) = op_graph(&op, &parents) else {
            continue;
        };
        let bytes = serde_json::to_vec(&g).map_err(|e| crate::Error::Other(e.to_string()))?;
        // only ops this build compiles and runs become seeds
        if !matches!(execute_graph(&bytes), Ok(Executed::Accepted)) {
            continue;
        }
        let mut with_grad = g.clone();
        if with_grad.output("loss").is_some()
            && append_backward(&mut with_grad, "loss", None).is_ok()
        {
            graphs.push(user_names(with_grad));
        }
        graphs.push(g);
        catalog.push((op, parents));
    }
    // every op in one graph
    let used: Vec<usize> = (0..LEAVES.len()).collect();
    let (mut g, ids) = leaf_graph(&used)
        .ok_or_else(|| crate::Error::Other("fuzz seeds: the leaf graph is invalid".into()))?;
    for (k, (op, parents)) in catalog.iter().enumerate() {
        let ps = parents.iter().map(|&p| ids[p]).collect();
        if let Ok(y) = g.push(NodeKind::Op { op: op.clone() }, ps) {
            g.outputs.push(OutputDecl {
                name: format!("y{k}"),
                node: y,
            });
        }
    }
    graphs.push(g);
    graphs
        .iter()
        .enumerate()
        .map(|(k, g)| {
            if k % 3 == 0 {
                serde_json::to_vec_pretty(g)
            } else {
                serde_json::to_vec(g)
            }
            .map_err(|e| crate::Error::Other(e.to_string()))
        })
        .collect()
}

const GRAPH_KEYS: &[&str] = &[
    "format",
    "inputs",
    "parameters",
    "nodes",
    "outputs",
    "name",
    "shape",
    "id",
    "kind",
    "op",
    "input",
    "parents",
    "dtype",
    "node",
    "axis",
    "axes",
    "keepdim",
    "eps",
    "factor",
    "value",
    "min",
    "max",
    "exponent",
    "seed",
    "keep",
    "start",
    "end",
    "stride",
    "padding",
    "dilation",
    "groups",
    "output_padding",
    "kernel",
    "geometry",
    "count_include_pad",
    "beta",
    "modes",
    "scale",
    "causal",
    "mask",
    "ops",
    "channel_axis",
];

/// The graph mutator: JSON mutations of any value, plus graph-aware ones (ops replaced by
/// another kind's op, parents rewired, nodes swapped, kinds and shapes changed), then
/// sometimes text-level mutations.
pub(super) fn mutate_graph(seed: &[u8], seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let Ok(mut doc) = serde_json::from_slice::<Value>(seed) else {
        let mut b = seed.to_vec();
        mutate_bytes(&mut b, rng, 4);
        return b;
    };
    let mut strings: Vec<&str> = STRINGS.to_vec();
    strings.extend(OpKind::ALL.iter().map(|k| k.name()));
    for _ in 0..rng.range(1, 4) {
        let nodes = doc["nodes"].as_array().map_or(0, Vec::len);
        match rng.below(10) {
            0 | 1 if nodes > 0 => {
                // replace an op (payload and all) by another kind's
                let i = rng.below(nodes);
                let kind = *rng.pick(OpKind::ALL);
                let mut op = serde_json::to_value(sample_op(kind)).unwrap_or(Value::Null);
                if rng.one_in(2) {
                    mutate_json(&mut op, rng, &strings, GRAPH_KEYS);
                }
                let i = i.to_string();
                set(&mut doc, &["nodes", &i, "op"], op);
                if rng.one_in(3) {
                    set(&mut doc, &["nodes", &i, "kind"], Value::String("op".into()));
                }
            }
            2 if nodes > 0 => {
                let i = rng.below(nodes);
                let k = rng.range(0, 4);
                let parents: Vec<Value> = (0..k)
                    .map(|_| {
                        if rng.one_in(8) {
                            Value::Number(interesting_u64(rng).into())
                        } else {
                            Value::Number((rng.below(i + 2) as u64).into())
                        }
                    })
                    .collect();
                set(
                    &mut doc,
                    &["nodes", &i.to_string(), "parents"],
                    Value::Array(parents),
                );
            }
            3 if nodes > 1 => {
                let (i, j) = (rng.below(nodes), rng.below(nodes));
                if let Some(a) = doc["nodes"].as_array_mut() {
                    a.swap(i, j);
                    if rng.one_in(2) {
                        // keep ids in order so the swap reaches shape inference
                        for (k, n) in a.iter_mut().enumerate() {
                            set(n, &["id"], Value::Number((k as u64).into()));
                        }
                    }
                }
            }
            4 if nodes > 0 => {
                // a node's shape taken from another node, or scaled
                let (i, j) = (rng.below(nodes), rng.below(nodes));
                let s = doc["nodes"][j]["shape"].clone();
                set(&mut doc, &["nodes", &i.to_string(), "shape"], s);
            }
            5 if nodes > 0 => {
                // a graph from another seed's nodes (structure splicing)
                let other = rng.pick(seeds);
                if let Ok(o) = serde_json::from_slice::<Value>(other) {
                    if let Some(on) = o["nodes"].as_array().filter(|a| !a.is_empty()) {
                        let i = rng.below(nodes);
                        let n = on[rng.below(on.len())].clone();
                        set(&mut doc, &["nodes", &i.to_string()], n);
                    }
                }
            }
            _ => mutate_json(&mut doc, rng, &strings, GRAPH_KEYS),
        }
    }
    if rng.one_in(3) {
        repair(&mut doc);
    }
    let mut text = if rng.one_in(3) {
        serde_json::to_vec_pretty(&doc)
    } else {
        serde_json::to_vec(&doc)
    }
    .unwrap_or_default();
    if rng.one_in(4) {
        for _ in 0..rng.range(1, 3) {
            mutate_json_text(&mut text, rng, GRAPH_KEYS);
        }
    }
    text
}

/// Makes a mutated graph consistent again where it can, so that mutated payloads reach
/// compilation and kernels: when the document reads as a graph, ids are renumbered and
/// every node's shape is re-inferred (`Graph::push`); the graph ends before the first node
/// that does not infer, and outputs past the end are dropped.
fn repair(doc: &mut Value) {
    let Ok(g) = serde_json::from_value::<Graph>(doc.clone()) else {
        return;
    };
    let mut fixed = Graph {
        nodes: vec![],
        outputs: vec![],
        ..g.clone()
    };
    for n in g.nodes {
        if fixed.push(n.kind, n.parents).is_err() {
            break;
        }
    }
    let len = fixed.nodes.len();
    fixed.outputs = g.outputs.into_iter().filter(|o| o.node < len).collect();
    if let Ok(v) = serde_json::to_value(&fixed) {
        *doc = v;
    }
}

/// Whether an accepted graph is small enough to compile and run here.
fn runnable(g: &Graph) -> bool {
    if g.nodes.len() > RUN_NODES {
        return false;
    }
    // the fuzzer supplies a value for every declaration, used or not
    let total: usize = g
        .nodes
        .iter()
        .map(|n| &n.shape)
        .chain(g.inputs.iter().chain(&g.parameters).map(|d| &d.shape))
        .map(|s| crate::spec::checked_numel(s).unwrap_or(usize::MAX))
        .fold(0usize, |a, b| a.saturating_add(b));
    if total > RUN_ELEMENTS {
        return false;
    }
    g.nodes.iter().all(|n| {
        let geometry = match &n.kind {
            NodeKind::Op { op } | NodeKind::Vjp { op, .. } => match op {
                Op::MaxPool2d(g) => Some(g),
                Op::AvgPool2d { geometry, .. } | Op::SmoothMaxPool2d { geometry, .. } => {
                    Some(geometry)
                }
                _ => None,
            },
            _ => None,
        };
        // a vjp node's shape is its input's: bound by the larger of input and output
        let elements = n
            .parents
            .iter()
            .filter_map(|&p| g.nodes.get(p))
            .map(|p| crate::spec::checked_numel(&p.shape).unwrap_or(usize::MAX))
            .chain([crate::spec::checked_numel(&n.shape).unwrap_or(usize::MAX)])
            .max()
            .unwrap_or(0);
        geometry.is_none_or(|g| {
            (elements as u128) * (g.kernel[0] as u128) * (g.kernel[1] as u128) <= RUN_POOL_WORK
        })
    })
}

pub(super) fn execute_graph(input: &[u8]) -> Result<Executed, Refusal> {
    let g = Graph::from_json(input, "fuzz.json").map_err(Refusal::of)?;
    // an accepted graph writes back to the same text
    let text = match serde_json::to_string(&g) {
        Ok(t) => t,
        Err(e) => {
            return Ok(Executed::Invariant(format!(
                "an accepted graph does not serialize: {e}"
            )))
        }
    };
    match Graph::from_json(text.as_bytes(), "round trip") {
        Ok(g2) if serde_json::to_string(&g2).ok().as_deref() == Some(text.as_str()) => {}
        Ok(_) => {
            return Ok(Executed::Invariant(
                "the graph changes in a write/read round trip".into(),
            ))
        }
        Err(e) => {
            return Ok(Executed::Invariant(format!(
                "an accepted graph, written back, is refused: {e}"
            )))
        }
    }
    let mut g = g;
    if g.output("loss").is_some() && fnv(input) & 1 == 1 {
        let loss = g.loss_output().map_err(Refusal::of)?.to_string();
        append_backward(&mut g, &loss, None).map_err(Refusal::of)?;
    }
    if !runnable(&g) {
        return Ok(Executed::AcceptedNotRun);
    }
    let mut supplied: BTreeMap<String, Tensor> = BTreeMap::new();
    for d in g.inputs.iter().chain(&g.parameters) {
        let t = if d.name == SEED {
            Tensor::full(&d.shape, 1.0)
        } else {
            values(&d.shape)
        };
        supplied.insert(d.name.clone(), t.map_err(Refusal::of)?);
    }
    let declared: Vec<(String, Vec<usize>)> = g
        .outputs
        .iter()
        .map(|o| (o.name.clone(), g.nodes[o.node].shape.clone()))
        .collect();
    let compiled =
        CompiledGraph::compile(g, &BackendProfile::default_cpu()).map_err(Refusal::of)?;
    let outputs = compiled
        .run(|name| supplied.get(name).cloned())
        .map_err(Refusal::of)?;
    let got: Vec<(String, Vec<usize>)> = outputs
        .iter()
        .map(|(n, t)| (n.clone(), t.shape().to_vec()))
        .collect();
    let mut want = declared;
    want.sort();
    let mut got_sorted = got;
    got_sorted.sort();
    if want != got_sorted {
        return Ok(Executed::Invariant(format!(
            "outputs {got_sorted:?} differ from the declared {want:?}"
        )));
    }
    Ok(Executed::Accepted)
}
