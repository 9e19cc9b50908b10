//! Per format: valid seed files written by the library, structure-aware mutators, and the
//! entry point each input runs through with the invariants an accepted input must meet.

use super::mutate::{
    interesting_u64, mutate_bytes, mutate_json, mutate_json_text, poison_f32, random_bytes, Rng,
    STRINGS,
};
use super::{Executed, Format, Refusal};
use crate::backend::BackendProfile;
use crate::data::{parse_csv, parse_idx, parse_npy, CsvOptions, Header, LabelColumn};
use crate::graph::{
    append_backward, AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Graph, NodeKind, Op,
    OpKind, OutputDecl, Pool2dGeometry, ValueDecl, SEED,
};
use crate::nn::{Activation, Adam, AdamW, Mlp, Module, Optimizer, Sgd};
use crate::runtime::compiled::CompiledGraph;
use crate::tensor::Tensor;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Graphs whose nodes hold more elements than this in all are validated but not run.
const RUN_ELEMENTS: usize = 1 << 15;
/// Nor are graphs with more nodes than this.
const RUN_NODES: usize = 4096;
/// Nor graphs with a pooling node of more output elements × window taps than this.
const RUN_POOL_WORK: u128 = 1 << 22;

type Res<T> = crate::Result<T>;

/// A typical op of `kind` with small payload values (the graph mutator's replacement ops,
/// and the per-op seed graphs). Lists every kind, so a new op joins the fuzzer.
pub fn sample_op(kind: OpKind) -> Op {
    use OpKind as K;
    let pool = Pool2dGeometry {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [1, 0],
    };
    match kind {
        K::RandUniform => Op::RandUniform {
            shape: vec![2, 3],
            seed: 7,
        },
        K::BernoulliMask => Op::BernoulliMask {
            shape: vec![2, 3],
            keep: 0.5,
            seed: 7,
        },
        K::Add => Op::Add,
        K::Sub => Op::Sub,
        K::Mul => Op::Mul,
        K::Div => Op::Div,
        K::Maximum => Op::Maximum,
        K::Minimum => Op::Minimum,
        K::Where => Op::Where,
        K::Neg => Op::Neg,
        K::Abs => Op::Abs,
        K::Sqrt => Op::Sqrt,
        K::Exp => Op::Exp,
        K::Log => Op::Log,
        K::Sin => Op::Sin,
        K::Cos => Op::Cos,
        K::Tanh => Op::Tanh,
        K::Sigmoid => Op::Sigmoid,
        K::Relu => Op::Relu,
        K::Gelu => Op::Gelu,
        K::Silu => Op::Silu,
        K::Softplus => Op::Softplus,
        K::Inv => Op::Inv,
        K::SafeLog => Op::SafeLog { eps: 1e-6 },
        K::Scale => Op::Scale { factor: 2.0 },
        K::AddScalar => Op::AddScalar { value: 1.0 },
        K::Clamp => Op::Clamp {
            min: -1.0,
            max: 1.0,
        },
        K::Pow => Op::Pow { exponent: 2.0 },
        K::EmaUpdate => Op::EmaUpdate {
            decay: 0.9,
            square: true,
        },
        K::AdamUpdate => Op::AdamUpdate {
            step_size: 1e-3,
            c2_sqrt: 0.5,
            eps: 1e-8,
            shrink: 1.0,
        },
        K::AdamStep => Op::AdamStep {
            beta1: 0.9,
            beta2: 0.999,
            step_size: 1e-3,
            c2_sqrt: 0.5,
            eps: 1e-8,
            shrink: 1.0,
            l2: 0.0,
        },
        K::Softmax => Op::Softmax { axis: 1 },
        K::LogSoftmax => Op::LogSoftmax { axis: 1 },
        K::SumAll => Op::SumAll,
        K::ReduceSum => Op::ReduceSum {
            axes: vec![1],
            keepdim: false,
        },
        K::ReduceMean => Op::ReduceMean {
            axes: vec![0, 1],
            keepdim: true,
        },
        K::Argmax => Op::Argmax { axis: 1 },
        K::Reshape => Op::Reshape { shape: vec![6, 4] },
        K::Permute => Op::Permute { axes: vec![1, 0] },
        K::BroadcastTo => Op::BroadcastTo {
            shape: vec![2, 4, 6],
        },
        K::Concat => Op::Concat { axis: 0 },
        K::Slice => Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        K::IndexSelect => Op::IndexSelect { axis: 0 },
        K::Gather => Op::Gather { axis: 0 },
        K::ScatterAdd => Op::ScatterAdd { axis: 0 },
        K::Matmul => Op::Matmul,
        K::Linear => Op::Linear,
        K::MseLoss => Op::MseLoss,
        K::LayerNorm => Op::LayerNorm { eps: 1e-5 },
        K::RmsNorm => Op::RmsNorm { eps: 1e-5 },
        K::BatchNorm => Op::BatchNorm {
            eps: 1e-5,
            channel_axis: 1,
        },
        K::Conv2d => Op::Conv2d(Conv2dGeometry {
            padding: [1, 0],
            ..Conv2dGeometry::default()
        }),
        K::ConvTranspose2d => Op::ConvTranspose2d(ConvTranspose2dGeometry {
            stride: [2, 1],
            ..ConvTranspose2dGeometry::default()
        }),
        K::MaxPool2d => Op::MaxPool2d(pool),
        K::AvgPool2d => Op::AvgPool2d {
            geometry: pool,
            count_include_pad: true,
        },
        K::SmoothMaxPool2d => Op::SmoothMaxPool2d {
            geometry: pool,
            beta: 2.0,
        },
        K::SpectralConv1d => Op::SpectralConv1d { modes: 2 },
        K::SelectiveScan => Op::SelectiveScan,
        K::ScaledDotProductAttention => Op::ScaledDotProductAttention {
            scale: None,
            causal: true,
            mask: AttentionMask::None,
        },
        K::FusedUnary => Op::FusedUnary {
            ops: vec![Op::Relu, Op::Scale { factor: 0.5 }, Op::Exp],
        },
        K::FusedMap => {
            let step = |op, side| crate::graph::FusedStep { op, side };
            Op::FusedMap {
                steps: vec![
                    step(Op::Sub, Some(crate::graph::SideOperand::Right)),
                    step(Op::Relu, None),
                    step(Op::Mul, Some(crate::graph::SideOperand::Left)),
                ],
            }
        }
        K::Conv2dMap => {
            let step = |op, side| crate::graph::FusedStep { op, side };
            Op::Conv2dMap {
                geometry: Conv2dGeometry {
                    padding: [1, 1],
                    ..Conv2dGeometry::default()
                },
                steps: vec![
                    step(Op::Sub, Some(crate::graph::SideOperand::Right)),
                    step(Op::Mul, Some(crate::graph::SideOperand::Left)),
                    step(Op::Relu, None),
                ],
            }
        }
    }
}

/// FNV-1a of `bytes` (choices an input makes for itself, such as `--grad`).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Runs `f` on this thread with an eager session (the one installed, or a `default_cpu`
/// one for the duration).
fn with_session<R>(f: impl FnOnce() -> Res<R>) -> Res<R> {
    if crate::runtime::has_session() {
        return f();
    }
    crate::runtime::install(crate::runtime::Session::new(BackendProfile::default_cpu()))?;
    let r = f();
    crate::runtime::take()?;
    r
}

/// A scratch directory for seed files, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Res<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "torchlean-fuzz-seeds-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d)
            .map_err(|e| crate::Error::Other(format!("{}: {e}", d.display())))?;
        Ok(Scratch(d))
    }
    fn read(&self, name: &str) -> Res<Vec<u8>> {
        std::fs::read(self.0.join(name)).map_err(|e| crate::Error::Other(e.to_string()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic small values: 0, 1, 0, 1, ... (valid indices, masks and divisors of both
/// kinds).
fn values(shape: &[usize]) -> Res<Tensor> {
    let n = crate::spec::checked_numel(shape).unwrap_or(0);
    Tensor::from_vec((0..n).map(|i| (i % 2) as f32).collect(), shape)
}

fn ramp(shape: &[usize], scale: f32) -> Res<Tensor> {
    let n = crate::spec::checked_numel(shape).unwrap_or(0);
    Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 7) % 11) as f32 * scale - 0.5)
            .collect(),
        shape,
    )
}

pub(super) fn seeds(format: Format) -> Res<Vec<Vec<u8>>> {
    match format {
        Format::Graph => with_session(graph_seeds),
        Format::Safetensors => safetensors_seeds(),
        Format::Checkpoint => checkpoint_seeds(),
        Format::Npy => npy_seeds(),
        Format::Idx => idx_seeds(),
        Format::Csv => Ok(csv_seeds()),
    }
}

pub(super) fn mutate(format: Format, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let seed = rng.pick(seeds).clone();
    // a few inputs of every format are not derived from the structure at all
    match rng.below(100) {
        0..=4 => {
            let prefix: &[u8] = match format {
                Format::Graph => br#"{"format":"torchlean.ir.v1","#,
                Format::Safetensors | Format::Checkpoint => &seed[..seed.len().min(8)],
                Format::Npy => b"\x93NUMPY\x01\x00",
                Format::Idx => &[0, 0, 8, 1],
                Format::Csv => b"a,b\n",
            };
            return random_bytes(rng, prefix);
        }
        5..=16 => {
            let mut b = seed;
            let rounds = rng.range(1, 8);
            mutate_bytes(&mut b, rng, rounds);
            return b;
        }
        17..=20 if seeds.len() > 1 => {
            // splice two seeds
            let other = rng.pick(seeds);
            let (a, b) = (rng.below(seed.len() + 1), rng.below(other.len() + 1));
            let mut out = seed[..a].to_vec();
            out.extend_from_slice(&other[b..]);
            return out;
        }
        _ => {}
    }
    match format {
        Format::Graph => mutate_graph(&seed, seeds, rng),
        Format::Safetensors => mutate_safetensors(&seed, rng, false),
        Format::Checkpoint => mutate_safetensors(&seed, rng, true),
        Format::Npy => mutate_npy(&seed, rng),
        Format::Idx => mutate_idx(&seed, rng),
        Format::Csv => mutate_csv(&seed, rng),
    }
}

pub(super) fn execute(format: Format, input: &[u8]) -> Result<Executed, Refusal> {
    match format {
        Format::Graph => execute_graph(input),
        Format::Safetensors => execute_safetensors(input),
        Format::Checkpoint => execute_checkpoint(input),
        Format::Npy => {
            let t = parse_npy(input, "fuzz.npy").map_err(Refusal::of)?;
            Ok(check_loaded(&t))
        }
        Format::Idx => {
            let t = parse_idx(input, "fuzz.idx").map_err(Refusal::of)?;
            Ok(check_loaded(&t))
        }
        Format::Csv => execute_csv(input),
    }
}

/// A loaded data tensor: its element count matches its shape, and its values are finite
/// (every data loader refuses non-finite values).
fn check_loaded(t: &Tensor) -> Executed {
    let data = t.data();
    match crate::spec::checked_numel(t.shape()) {
        Some(n) if n == data.len() => {}
        n => {
            return Executed::Invariant(format!(
                "shape {:?} has {n:?} elements, the data {}",
                t.shape(),
                data.len()
            ))
        }
    }
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Executed::Invariant(format!("non-finite value {} at {i} was accepted", data[i]));
    }
    Executed::Accepted
}

// ---------------------------------------------------------------------------------------
// graphs
// ---------------------------------------------------------------------------------------

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

fn graph_seeds() -> Res<Vec<Vec<u8>>> {
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

/// The value at `path` in `v` (object keys, or array indices written as numbers), creating
/// the last key of an object; `None` where the document has another shape (mutated
/// documents may have any shape: indexing with `[]` would panic).
fn slot<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    let mut cur = v;
    for (k, key) in path.iter().enumerate() {
        let last = k + 1 == path.len();
        cur = match cur {
            Value::Object(o) => {
                if last {
                    o.entry(key.to_string()).or_insert(Value::Null)
                } else {
                    o.get_mut(*key)?
                }
            }
            Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Sets the value at `path` (see [`slot`]) when the document has that shape.
fn set(v: &mut Value, path: &[&str], new: Value) {
    if let Some(x) = slot(v, path) {
        *x = new;
    }
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
fn mutate_graph(seed: &[u8], seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
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

fn execute_graph(input: &[u8]) -> Result<Executed, Refusal> {
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

// ---------------------------------------------------------------------------------------
// safetensors and checkpoints
// ---------------------------------------------------------------------------------------

fn encode(tensors: &[(String, Tensor)], metadata: &BTreeMap<String, String>) -> Res<Vec<u8>> {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.shape().to_vec(),
                t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views: Vec<(&str, &[usize], &[u8])> = data
        .iter()
        .map(|(n, s, b)| (n.as_str(), s.as_slice(), b.as_slice()))
        .collect();
    crate::tensor::io::encode_safetensors(&views, metadata).map_err(crate::Error::Other)
}

fn safetensors_seeds() -> Res<Vec<Vec<u8>>> {
    let model = Mlp::new(&[3, 8, 2], Activation::Tanh, 1)?;
    let params: Vec<(String, Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let mut meta = BTreeMap::new();
    meta.insert("producer".to_string(), "torchlean".to_string());
    Ok(vec![
        encode(&params, &BTreeMap::new())?,
        encode(&params, &meta)?,
        encode(
            &[
                ("x".into(), ramp(&[4, 3], 0.1)?),
                ("y".into(), ramp(&[4, 2], 0.2)?),
            ],
            &BTreeMap::new(),
        )?,
        encode(
            &[
                ("scalar".into(), ramp(&[], 1.0)?),
                ("empty".into(), Tensor::zeros(&[0, 3])?),
                ("cube".into(), ramp(&[2, 2, 2], 0.5)?),
            ],
            &meta,
        )?,
    ])
}

/// A small model and one step of `opt` on it (so the optimizer has state).
fn stepped(opt: Option<&mut dyn Optimizer>) -> Res<Mlp> {
    let mut model = Mlp::new(&[3, 5, 2], Activation::Tanh, 3)?;
    if let Some(opt) = opt {
        let x = ramp(&[4, 3], 0.1)?;
        let y = ramp(&[4, 2], 0.2)?;
        let g = model.forward(&x)?.mse_loss(&y)?.backward()?;
        opt.step(&mut model, &g)?;
    }
    Ok(model)
}

/// A checkpoint-writing error as the core error the seed generator reports.
fn core_err(e: crate::nn::Error) -> crate::Error {
    match e {
        crate::nn::Error::Core(c) => c,
        other => crate::Error::Other(other.to_string()),
    }
}

fn checkpoint_seeds() -> Res<Vec<Vec<u8>>> {
    with_session(|| {
        let dir = Scratch::new()?;
        let path = dir.0.join("c.ckpt");
        let mut out = Vec::new();
        let model = stepped(None)?;
        crate::nn::save_checkpoint(&path, &model, None, 0).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut adam = Adam::new(0.01)?;
        let model = stepped(Some(&mut adam))?;
        crate::nn::save_checkpoint(&path, &model, Some(&adam), 12345).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut sgd = Sgd::new(0.1, 0.9, 0.0)?;
        let model = stepped(Some(&mut sgd))?;
        crate::nn::save_checkpoint(&path, &model, Some(&sgd), 7).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut adamw = AdamW::new(0.01)?;
        let model = stepped(Some(&mut adamw))?;
        crate::nn::save_checkpoint(&path, &model, Some(&adamw), u64::MAX).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        Ok(out)
    })
}

/// A safetensors file taken apart: its header and its data.
fn split_safetensors(b: &[u8]) -> Option<(Value, Vec<u8>)> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
    let end = n.checked_add(8).filter(|&e| e <= b.len())?;
    let header = serde_json::from_slice(&b[8..end]).ok()?;
    Some((header, b[end..].to_vec()))
}

fn join_safetensors(header: &Value, data: &[u8], pad: bool) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap_or_default();
    if pad {
        h.resize(h.len().next_multiple_of(8), b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// Sets the checkpoint checksum of `file` to the one its tensors have (so that a mutation
/// reaches the checks behind the checksum); unchanged when it does not parse.
fn fix_checksum(file: &[u8]) -> Option<Vec<u8>> {
    let st = safetensors::SafeTensors::deserialize(file).ok()?;
    let mut raw: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, view) in st.iter() {
        raw.insert(
            name.to_string(),
            (view.shape().to_vec(), view.data().to_vec()),
        );
    }
    let sum = crate::nn::checkpoint::checksum(
        raw.iter()
            .map(|(n, (s, b))| (n.as_str(), s.as_slice(), b.as_slice())),
    );
    let (mut header, data) = split_safetensors(file)?;
    let meta = header
        .as_object_mut()?
        .entry("__metadata__")
        .or_insert_with(|| Value::Object(Default::default()));
    meta.as_object_mut()?.insert(
        crate::nn::checkpoint::KEY_CHECKSUM.to_string(),
        Value::String(format!("{sum:016x}")),
    );
    Some(join_safetensors(&header, &data, true))
}

const ST_KEYS: &[&str] = &[
    "dtype",
    "shape",
    "data_offsets",
    "__metadata__",
    "format",
    "version",
    "step",
    "optim.kind",
    "optim.step",
    "checksum.fnv1a64",
    "0.weight",
    "0.bias",
    "x",
];

/// A shape of the same element count as `shape` (another factorization), or an edge shape.
fn reshape_dims(shape: &[u64], rng: &mut Rng) -> Vec<u64> {
    let n: u64 = shape.iter().product();
    match rng.below(8) {
        0 => vec![n],
        1 => vec![1, n, 1],
        2 => shape.iter().rev().copied().collect(),
        3 => vec![],
        4 => vec![0, interesting_u64(rng)],
        5 => {
            let mut s = shape.to_vec();
            if let Some(d) = s.first_mut() {
                *d = interesting_u64(rng);
            }
            s
        }
        6 => vec![1 << 32, 1 << 32, n.max(1)],
        _ => (0..rng.range(0, 40)).map(|_| rng.below(3) as u64).collect(),
    }
}

/// Safetensors mutations: the header's dtypes, shapes, offsets (extremes, swapped between
/// tensors, overlapping), names and metadata; the data (poisoned values, truncation,
/// extension); the length prefix; checkpoints sometimes get a recomputed checksum.
fn mutate_safetensors(seed: &[u8], rng: &mut Rng, checkpoint: bool) -> Vec<u8> {
    let Some((mut header, mut data)) = split_safetensors(seed) else {
        let mut b = seed.to_vec();
        mutate_bytes(&mut b, rng, 4);
        return b;
    };
    let names: Vec<String> = header
        .as_object()
        .map(|o| o.keys().filter(|k| *k != "__metadata__").cloned().collect())
        .unwrap_or_default();
    let mut prefix: Option<u64> = None;
    for _ in 0..rng.range(1, 3) {
        let name = if names.is_empty() {
            String::from("x")
        } else {
            rng.pick(&names).clone()
        };
        match rng.below(12) {
            0 => {
                let d = [
                    "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL",
                    "F8_E4M3", "U64", "f32", "", "C64",
                ][rng.below(15)];
                set(&mut header, &[&name, "dtype"], Value::String(d.into()));
            }
            1 => {
                let shape: Vec<u64> = header[&name]["shape"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                let dims = serde_json::json!(reshape_dims(&shape, rng));
                set(&mut header, &[&name, "shape"], dims);
            }
            2 => {
                let offs = &header[&name]["data_offsets"];
                let (a, b) = (offs[0].as_u64().unwrap_or(0), offs[1].as_u64().unwrap_or(0));
                let new = match rng.below(6) {
                    0 => serde_json::json!([b, a]),
                    1 => serde_json::json!([a, interesting_u64(rng)]),
                    2 => serde_json::json!([interesting_u64(rng), b]),
                    3 => serde_json::json!([a, b.saturating_add(4)]),
                    4 => serde_json::json!([a.saturating_sub(4), b]),
                    _ => serde_json::json!([a]),
                };
                set(&mut header, &[&name, "data_offsets"], new);
            }
            3 if names.len() > 1 => {
                // swap or share offsets between two tensors
                let other = rng.pick(&names).clone();
                let o = header[&other]["data_offsets"].clone();
                if rng.one_in(2) {
                    let mine = header[&name]["data_offsets"].clone();
                    set(&mut header, &[&other, "data_offsets"], mine);
                }
                set(&mut header, &[&name, "data_offsets"], o);
            }
            4 => {
                // a tensor under another name (duplicate entry, reserved names)
                let e = header[&name].clone();
                let new = [
                    "__metadata__",
                    "grad.x",
                    "",
                    "optim.adam.m.0.weight",
                    "0.weight ",
                    "é",
                    "optim.",
                    "x",
                ][rng.below(8)];
                set(&mut header, &[new], e);
                if rng.one_in(2) {
                    if let Some(o) = header.as_object_mut() {
                        o.remove(&name);
                    }
                }
            }
            5 => {
                let key = [
                    "format",
                    "version",
                    "step",
                    "optim.kind",
                    "optim.step",
                    "checksum.fnv1a64",
                    "producer",
                ][rng.below(7)];
                let v = [
                    "",
                    "-1",
                    "18446744073709551616",
                    "18446744073709551615",
                    "abc",
                    "adam",
                    "sgd",
                    "adamw",
                    "rmsprop",
                    "adagrad",
                    "custom",
                    "torchlean.checkpoint",
                    "2",
                    "0000000000000000",
                    "1 ",
                    "+5",
                ][rng.below(16)];
                if rng.one_in(6) {
                    set(&mut header, &["__metadata__"], serde_json::json!({key: 1}));
                } else {
                    set(&mut header, &["__metadata__", key], Value::String(v.into()));
                }
            }
            6 => {
                let le = true;
                poison_f32(&mut data, rng, le);
            }
            7 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(0u8, rng.range(1, 64)));
                }
            }
            8 => mutate_bytes(&mut data, rng, 2),
            9 => prefix = Some(interesting_u64(rng)),
            _ => mutate_json(&mut header, rng, STRINGS, ST_KEYS),
        }
    }
    let mut out = join_safetensors(&header, &data, !rng.one_in(4));
    if let Some(p) = prefix {
        out[..8].copy_from_slice(&p.to_le_bytes());
    } else if checkpoint && !rng.one_in(3) {
        if let Some(fixed) = fix_checksum(&out) {
            out = fixed;
        }
    }
    if rng.one_in(6) {
        // text-level header mutation (duplicate keys, wild numbers), length kept consistent
        if let Some(n) = out
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
        {
            if n.checked_add(8).is_some_and(|e| e <= out.len()) {
                let mut h = out[8..8 + n].to_vec();
                mutate_json_text(&mut h, rng, ST_KEYS);
                let mut o = (h.len() as u64).to_le_bytes().to_vec();
                o.extend_from_slice(&h);
                o.extend_from_slice(&out[8 + n..]);
                out = o;
            }
        }
    }
    out
}

fn execute_safetensors(input: &[u8]) -> Result<Executed, Refusal> {
    let tensors = crate::tensor::io::parse_safetensors(Path::new("fuzz.safetensors"), input)
        .map_err(Refusal::of)?;
    for (n, t) in &tensors {
        if crate::spec::checked_numel(t.shape()) != Some(t.data().len()) {
            return Ok(Executed::Invariant(format!(
                "tensor `{n}` of shape {:?} holds {} values",
                t.shape(),
                t.data().len()
            )));
        }
    }
    // an accepted file writes back and reads back to the same tensors
    let bytes = match encode(&tensors, &BTreeMap::new()) {
        Ok(b) => b,
        Err(e) => {
            return Ok(Executed::Invariant(format!(
                "accepted tensors do not encode: {e}"
            )))
        }
    };
    let back = match crate::tensor::io::parse_safetensors(Path::new("round trip"), &bytes) {
        Ok(b) => b,
        Err(e) => return Ok(Executed::Invariant(format!("re-encoded file refused: {e}"))),
    };
    let key = |ts: &[(String, Tensor)]| {
        let mut v: Vec<(String, Vec<usize>, Vec<u32>)> = ts
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.shape().to_vec(),
                    t.data().iter().map(|x| x.to_bits()).collect(),
                )
            })
            .collect();
        v.sort();
        v
    };
    if key(&tensors) != key(&back) {
        return Ok(Executed::Invariant(
            "tensors change in a write/read round trip".into(),
        ));
    }
    Ok(Executed::Accepted)
}

fn execute_checkpoint(input: &[u8]) -> Result<Executed, Refusal> {
    let contents = crate::nn::parse_checkpoint(input, "fuzz.ckpt").map_err(Refusal::of)?;
    let expected: BTreeMap<String, Vec<u32>> = contents
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.data().iter().map(|v| v.to_bits()).collect()))
        .collect();
    // the optimizer the file names (an unknown one: chosen by the input's hash)
    let kind = contents.metadata.get("optim.kind").cloned();
    let choice = match kind.as_deref() {
        None => 0,
        Some("adam") => 1,
        Some("sgd") => 2,
        Some("adamw") => 3,
        Some(_) => fnv(input) % 4,
    };
    let mut model = match Mlp::new(&[3, 5, 2], Activation::Tanh, 9) {
        Ok(m) => m,
        Err(e) => return Ok(Executed::Invariant(format!("model: {e}"))),
    };
    let mut adam;
    let mut sgd;
    let mut adamw;
    let opt: Option<&mut dyn Optimizer> = match choice {
        1 => {
            adam = Adam::new(0.01).map_err(Refusal::of)?;
            Some(&mut adam)
        }
        2 => {
            sgd = Sgd::new(0.1, 0.9, 0.0).map_err(Refusal::of)?;
            Some(&mut sgd)
        }
        3 => {
            adamw = AdamW::new(0.01).map_err(Refusal::of)?;
            Some(&mut adamw)
        }
        _ => None,
    };
    crate::nn::apply_checkpoint(contents, "fuzz.ckpt", &mut model, opt).map_err(Refusal::of)?;
    for (n, p) in model.parameters() {
        let got: Vec<u32> = p.data().iter().map(|v| v.to_bits()).collect();
        if expected.get(&n) != Some(&got) {
            return Ok(Executed::Invariant(format!(
                "parameter `{n}` does not hold the file's values after loading"
            )));
        }
    }
    Ok(Executed::Accepted)
}

// ---------------------------------------------------------------------------------------
// NPY
// ---------------------------------------------------------------------------------------

/// The bytes of an `.npy` file: format `major.minor`, the header dict text (padded with
/// spaces and a newline), the data.
fn npy_bytes(major: u8, minor: u8, dict: &str, data: &[u8], pad: bool) -> Vec<u8> {
    let mut header = dict.to_string();
    let pre = if major == 1 { 10 } else { 12 };
    if pad {
        while (pre + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
    }
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, minor]);
    if major == 1 {
        out.extend_from_slice(&(header.len().min(u16::MAX as usize) as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn npy_dict(descr: &str, fortran: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
}

fn npy_seeds() -> Res<Vec<Vec<u8>>> {
    let dir = Scratch::new()?;
    let mut out = Vec::new();
    for (k, shape) in [&[3usize, 4][..], &[5], &[2, 3, 2], &[1, 1]]
        .iter()
        .enumerate()
    {
        let p = dir.0.join(format!("{k}.npy"));
        crate::data::save_npy(&p, &ramp(shape, 0.25)?)?;
        out.push(dir.read(&format!("{k}.npy"))?);
    }
    let f8: Vec<u8> = (0..6)
        .flat_map(|i| (i as f64 * 1.5).to_le_bytes())
        .collect();
    out.push(npy_bytes(
        2,
        0,
        &npy_dict("<f8", "False", "(2, 3)"),
        &f8,
        true,
    ));
    let i4: Vec<u8> = (0..4i32).flat_map(|i| (i - 2).to_le_bytes()).collect();
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<i4", "False", "(4,)"),
        &i4,
        true,
    ));
    let i8: Vec<u8> = (0..4)
        .flat_map(|i| (i as i64 * 1000).to_le_bytes())
        .collect();
    out.push(npy_bytes(
        3,
        0,
        &npy_dict("<i8", "False", "(2, 2)"),
        &i8,
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("|u1", "False", "(2, 4)"),
        &[0, 1, 2, 3, 250, 251, 252, 255],
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<f4", "False", "(0, 3)"),
        &[],
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<f4", "False", "()"),
        &1.5f32.to_le_bytes(),
        false,
    ));
    Ok(out)
}

fn dtype_size(descr: &str) -> usize {
    match descr {
        "<f8" | "<i8" => 8,
        "|u1" | "<u1" => 1,
        _ => 4,
    }
}

/// NPY mutations: the dict's descr, fortran_order and shape (extremes, other
/// factorizations, syntax), its keys and syntax; the version; the header length field; the
/// data (poisoned values, truncation, extension).
fn mutate_npy(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let text = String::from_utf8_lossy(seed);
    let between = |a: &str, b: &str| -> Option<String> {
        let s = text.find(a)? + a.len();
        let e = text[s..].find(b)? + s;
        Some(text[s..e].to_string())
    };
    let mut descr = between("'descr': '", "'").unwrap_or_else(|| "<f4".into());
    let mut fortran = "False".to_string();
    let mut shape = between("'shape': ", "), ")
        .map(|s| s + ")")
        .unwrap_or_else(|| "(1,)".into());
    let (mut major, mut minor) = (seed.get(6).copied().unwrap_or(1), 0u8);
    let hl = if major == 1 { 10 } else { 12 };
    let header_len = if major == 1 {
        seed.get(8..10)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize)
    } else {
        seed.get(8..12)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut data = seed.get(hl + header_len..).unwrap_or_default().to_vec();
    let mut dict_edit: Option<u8> = None;
    let mut len_field: Option<u64> = None;
    let mut pad = true;
    for _ in 0..rng.range(1, 3) {
        match rng.below(11) {
            0 => {
                descr = [
                    "<f4", "<f8", "<i4", "<i8", "|u1", "<u1", ">f4", ">i8", "<f2", "|b1", "<c8",
                    "O", "", "<f16", "<U3", "|S4", "<f4'", "f4",
                ][rng.below(18)]
                .into()
            }
            1 => {
                fortran = ["True", "False", "true", "1", "None", "", "Falsey"][rng.below(7)].into()
            }
            2 => {
                // another factorization of the data, or extremes
                let n = (data.len() / dtype_size(&descr)) as u64;
                let dims: Vec<String> = match rng.below(6) {
                    0 => vec![n.to_string()],
                    1 => vec!["1".into(), n.to_string(), "1".into()],
                    2 => vec![interesting_u64(rng).to_string(), "0".into()],
                    3 => (0..rng.range(2, 5))
                        .map(|_| interesting_u64(rng).to_string())
                        .collect(),
                    4 => vec!["-1".into(), n.to_string()],
                    _ => (0..rng.range(30, 36)).map(|_| "1".to_string()).collect(),
                };
                shape = match rng.below(5) {
                    0 => format!("[{}]", dims.join(", ")),
                    1 => format!("({})", dims.join(",")),
                    _ if dims.len() == 1 => format!("({},)", dims[0]),
                    _ => format!("({})", dims.join(", ")),
                };
            }
            3 => {
                shape = [
                    "()",
                    "(,)",
                    "(1,,)",
                    "(",
                    ")",
                    "(3L,)",
                    "(1.5,)",
                    "(0x10,)",
                    "(-0,)",
                    "(18446744073709551616,)",
                    "(   4   ,   )",
                    "((2,),)",
                    "(2, 'a')",
                ][rng.below(13)]
                .into()
            }
            4 => dict_edit = Some(rng.below(8) as u8),
            5 => {
                major = *rng.pick(&[0u8, 1, 2, 3, 4, 255]);
                minor = *rng.pick(&[0u8, 1, 255]);
            }
            6 => len_field = Some(interesting_u64(rng)),
            7 => {
                if descr == "<f8" {
                    // f64 values beyond the f32 range become infinities
                    let n = data.len() / 8;
                    if n > 0 {
                        let i = rng.below(n) * 8;
                        let v = *rng.pick(&[f64::NAN, f64::INFINITY, 1e300, -1e39, 3.5e38, 1e-320]);
                        data[i..i + 8].copy_from_slice(&v.to_le_bytes());
                    }
                } else {
                    poison_f32(&mut data, rng, true);
                }
            }
            8 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(0x41u8, rng.range(1, 16)));
                }
            }
            9 => pad = !pad,
            _ => mutate_bytes(&mut data, rng, 1),
        }
    }
    let mut dict = npy_dict(&descr, &fortran, &shape);
    match dict_edit {
        Some(0) => dict = dict.replace("'fortran_order': False, ", ""),
        Some(1) => dict = dict.replace("{", "{'descr': '<f8', "),
        Some(2) => dict = dict.replace("}", "'extra': 1, }"),
        Some(3) => dict = dict.replace('\'', "\""),
        Some(4) => dict = dict.replace("{", "").replace("}", ""),
        Some(5) => dict.push_str(" junk"),
        Some(6) => dict = dict.replace("'descr'", "'d\u{e9}scr'"),
        Some(_) => {
            let mut b = dict.into_bytes();
            mutate_bytes(&mut b, rng, 1);
            dict = String::from_utf8_lossy(&b).into_owned();
        }
        None => {}
    }
    let mut out = npy_bytes(major.clamp(1, 3), minor, &dict, &data, pad);
    out[6] = major;
    if let Some(l) = len_field {
        if major == 1 {
            out[8..10].copy_from_slice(&(l as u16).to_le_bytes());
        } else if out.len() >= 12 {
            out[8..12].copy_from_slice(&(l as u32).to_le_bytes());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// IDX
// ---------------------------------------------------------------------------------------

fn idx_bytes(code: u8, ndims: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, code, ndims];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn idx_seeds() -> Res<Vec<Vec<u8>>> {
    let dir = Scratch::new()?;
    let mut out = Vec::new();
    let images = Tensor::from_vec((0..36).map(|i| (i * 7 % 256) as f32).collect(), &[4, 3, 3])?;
    crate::data::write_idx(dir.0.join("a.idx"), &images, true)?;
    out.push(dir.read("a.idx")?);
    crate::data::write_idx(dir.0.join("b.idx"), &ramp(&[5, 2], 0.3)?, false)?;
    out.push(dir.read("b.idx")?);
    let labels = Tensor::from_vec(vec![0.0, 1.0, 2.0, 1.0], &[4])?;
    crate::data::write_idx(dir.0.join("c.idx"), &labels, true)?;
    out.push(dir.read("c.idx")?);
    out.push(idx_bytes(0x09, 1, &[4], &[0, 1, 0x80, 0xff]));
    let i16s: Vec<u8> = [-3i16, 0, 300, 32767]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0B, 2, &[2, 2], &i16s));
    let i32s: Vec<u8> = [-3i32, 0, 70000]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0C, 1, &[3], &i32s));
    let f64s: Vec<u8> = [0.5f64, -2.0]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0E, 2, &[1, 2], &f64s));
    Ok(out)
}

/// IDX mutations: type code, dimension count (also disagreeing with the dims given), dims
/// (extremes, other factorizations of the data), the magic's zero bytes, the data.
fn mutate_idx(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    if seed.len() < 4 {
        return seed.to_vec();
    }
    let (mut code, mut ndims) = (seed[2], seed[3]);
    let start = (4 + 4 * ndims as usize).min(seed.len());
    let mut dims: Vec<u32> = seed[4..start]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut data = seed[start..].to_vec();
    let mut magic = [0u8, 0];
    for _ in 0..rng.range(1, 3) {
        match rng.below(9) {
            0 => code = *rng.pick(&[0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0x0A, 0x0F, 0xff]),
            1 => ndims = *rng.pick(&[0u8, 1, 2, 3, 4, 15, 16, 17, 32, 255]),
            2 => {
                let size = match code {
                    0x08 | 0x09 => 1,
                    0x0B => 2,
                    0x0E => 8,
                    _ => 4,
                };
                let n = (data.len() / size) as u32;
                dims = match rng.below(5) {
                    0 => vec![n],
                    1 => vec![1, n, 1],
                    2 => vec![0, u32::MAX],
                    3 => vec![u32::MAX, u32::MAX, u32::MAX],
                    _ => vec![65536, 65536],
                };
                if rng.one_in(3) {
                    ndims = dims.len() as u8;
                }
            }
            3 => {
                let i = rng.below(dims.len().max(1));
                if let Some(d) = dims.get_mut(i) {
                    *d = interesting_u64(rng) as u32;
                }
            }
            4 => {
                if rng.one_in(2) {
                    dims.push(rng.below(3) as u32);
                } else {
                    dims.pop();
                }
                if !rng.one_in(3) {
                    ndims = dims.len() as u8;
                }
            }
            5 => magic = [rng.next_u64() as u8 % 2, rng.next_u64() as u8 % 2],
            6 => {
                if code == 0x0E {
                    let n = data.len() / 8;
                    if n > 0 {
                        let i = rng.below(n) * 8;
                        let v = *rng.pick(&[f64::NAN, f64::NEG_INFINITY, 1e300, 3.5e38]);
                        data[i..i + 8].copy_from_slice(&v.to_be_bytes());
                    }
                } else {
                    poison_f32(&mut data, rng, false);
                }
            }
            7 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(7u8, rng.range(1, 16)));
                }
            }
            _ => mutate_bytes(&mut data, rng, 1),
        }
    }
    let mut out = idx_bytes(code, ndims, &dims, &data);
    out[0] = magic[0];
    out[1] = magic[1];
    out
}

// ---------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------

/// The directive a CSV input may start with, choosing the parse options:
/// `#torchlean-fuzz header=auto|present|absent label=first|last|<index>|name:<column>
/// delimiter=<char>`. Without it, the defaults (`CsvOptions::default()`).
const CSV_DIRECTIVE: &str = "#torchlean-fuzz ";

fn csv_options(text: &str) -> (CsvOptions, &str) {
    let mut o = CsvOptions::default();
    let Some(rest) = text.strip_prefix(CSV_DIRECTIVE) else {
        return (o, text);
    };
    let (line, body) = rest.split_once('\n').unwrap_or((rest, ""));
    for tok in line.split(' ') {
        match tok.split_once('=') {
            Some(("header", "present")) => o.header = Header::Present,
            Some(("header", "absent")) => o.header = Header::Absent,
            Some(("label", "first")) => o.label = LabelColumn::First,
            Some(("label", v)) if v.starts_with("name:") => {
                o.label = LabelColumn::Name(v["name:".len()..].to_string())
            }
            Some(("label", v)) => {
                if let Ok(i) = v.parse() {
                    o.label = LabelColumn::Index(i)
                }
            }
            Some(("delimiter", v)) => {
                if let Some(c) = v.chars().next() {
                    o.delimiter = c;
                }
            }
            _ => {}
        }
    }
    (o, body)
}

fn csv_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let row = |i: usize, cols: usize, sep: &str| -> String {
        let mut f: Vec<String> = (0..cols - 1)
            .map(|c| format!("{}", ((i * 7 + c * 3) % 13) as f32 * 0.25 - 1.0))
            .collect();
        f.push(format!("{}", i % 3));
        f.join(sep)
    };
    let body = |cols: usize, rows: usize, sep: &str| -> String {
        (0..rows).map(|i| row(i, cols, sep) + "\n").collect()
    };
    out.push(format!("a,b,label\n{}", body(3, 6, ",")));
    out.push(body(4, 12, ","));
    out.push(format!(
        "{CSV_DIRECTIVE}header=present label=name:y delimiter=;\nx1;y;x2\n{}",
        body(3, 5, ";")
    ));
    out.push(format!(
        "{CSV_DIRECTIVE}label=first delimiter=\t\n{}",
        body(5, 4, "\t")
    ));
    out.push("\"f1\",\"f2\",\"class\"\r\n\"1.5\",\" -2e3 \",\"1\"\r\n\r\n4,5e-3,0\r\n".to_string());
    out.push(format!(
        "{CSV_DIRECTIVE}header=absent label=0\n{}",
        body(2, 3, ",")
    ));
    out.into_iter().map(String::into_bytes).collect()
}

const CSV_FIELDS: &[&str] = &[
    "",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "infinity",
    "1e39",
    "-1e39",
    "3.4028236e38",
    "1e-46",
    "-0",
    "0x10",
    "1_0",
    "\u{663}",
    "\u{2212}1",
    "\"1\"",
    "\"1",
    "1\"",
    "'1'",
    " 1 ",
    "1e",
    "e5",
    "+5",
    ".5",
    "5.",
    "1,5",
    "50000000",
    "1e9",
    "4294967296",
    "-1",
    "0.5",
    "label",
    "x",
    "\u{feff}1",
    "\"\"",
    "\"a,b\"",
    "1;2",
    "\t",
    "9999999999999999999999999999999999999999",
];

/// CSV mutations: fields replaced (non-finite, huge, malformed, quoted, unicode), rows made
/// ragged, duplicated, dropped, swapped or multiplied, delimiters and line ends changed, a
/// BOM or a header inserted, the options directive rewritten.
fn mutate_csv(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let text = String::from_utf8_lossy(seed).into_owned();
    let (directive, body) = match text.strip_prefix(CSV_DIRECTIVE) {
        Some(r) => {
            let (d, b) = r.split_once('\n').unwrap_or((r, ""));
            (Some(d.to_string()), b.to_string())
        }
        None => (None, text.clone()),
    };
    let mut directive = directive;
    let sep = if body.contains('\t') {
        '\t'
    } else if body.contains(';') {
        ';'
    } else {
        ','
    };
    let mut rows: Vec<Vec<String>> = body
        .split('\n')
        .map(|l| l.split(sep).map(str::to_string).collect())
        .collect();
    let mut out_sep = sep.to_string();
    let mut eol = "\n".to_string();
    let mut bom = false;
    for _ in 0..rng.range(1, 4) {
        let r = rng.below(rows.len().max(1));
        match rng.below(14) {
            0..=3 => {
                if let Some(row) = rows.get_mut(r) {
                    if !row.is_empty() {
                        let c = rng.below(row.len());
                        row[c] = if rng.one_in(8) {
                            "9".repeat(rng.range(40, 400))
                        } else {
                            rng.pick(CSV_FIELDS).to_string()
                        };
                    }
                }
            }
            4 => {
                if let Some(row) = rows.get_mut(r) {
                    let at = rng.below(row.len() + 1);
                    row.insert(at, rng.pick(CSV_FIELDS).to_string());
                }
            }
            5 => {
                if let Some(row) = rows.get_mut(r) {
                    if !row.is_empty() {
                        let at = rng.below(row.len());
                        row.remove(at);
                    }
                }
            }
            6 if !rows.is_empty() => {
                let copy = rows[r].clone();
                for _ in 0..*rng.pick(&[1usize, 2, 100, 2000]) {
                    rows.push(copy.clone());
                }
            }
            7 if !rows.is_empty() => {
                rows.remove(r);
            }
            8 if rows.len() > 1 => {
                let o = rng.below(rows.len());
                rows.swap(r, o);
            }
            9 => out_sep = [",", ";", "\t", " ", "|", ",,", "\u{e9}", ""][rng.below(8)].to_string(),
            10 => eol = ["\n", "\r\n", "\r", "\n\n", "\n \n"][rng.below(5)].to_string(),
            11 => bom = !bom,
            12 => {
                let header: Vec<String> = (0..rng.range(1, 6))
                    .map(|_| rng.pick(CSV_FIELDS).to_string())
                    .collect();
                rows.insert(0, header);
            }
            _ => {
                let header = ["auto", "present", "absent"][rng.below(3)];
                let label = match rng.below(5) {
                    0 => "first".to_string(),
                    1 => "last".to_string(),
                    2 => interesting_u64(rng).to_string(),
                    3 => rng.below(6).to_string(),
                    _ => format!(
                        "name:{}",
                        rng.pick(&["label", "y", "a", "", "class", "nope"])
                    ),
                };
                let delim =
                    [",", ";", "\t", " ", "|", "\"", "\u{e9}", "1", "-", ".", "e"][rng.below(11)];
                directive = Some(format!("header={header} label={label} delimiter={delim}"));
            }
        }
    }
    let mut s = String::new();
    if bom {
        s.push('\u{feff}');
    }
    if let Some(d) = &directive {
        s.push_str(CSV_DIRECTIVE);
        s.push_str(d);
        s.push('\n');
    }
    let lines: Vec<String> = rows.iter().map(|r| r.join(&out_sep)).collect();
    s.push_str(&lines.join(&eol));
    let mut b = s.into_bytes();
    if rng.one_in(10) {
        mutate_bytes(&mut b, rng, 1);
    }
    b
}

fn execute_csv(input: &[u8]) -> Result<Executed, Refusal> {
    // as `load_csv`: the bytes must be UTF-8 text
    let text = std::str::from_utf8(input).map_err(Refusal::of)?;
    let (options, body) = csv_options(text);
    let ds = parse_csv(body, "fuzz.csv", &options).map_err(Refusal::of)?;
    let (f, t) = (
        ds.features().map_err(Refusal::of)?,
        ds.targets().map_err(Refusal::of)?,
    );
    let width: usize = ds.feature_shape().iter().product();
    if f.numel() != ds.len() * width || t.numel() != ds.len() || ds.is_empty() {
        return Ok(Executed::Invariant(format!(
            "{} samples of {:?}, but {} feature and {} target values",
            ds.len(),
            ds.feature_shape(),
            f.numel(),
            t.numel()
        )));
    }
    if let Executed::Invariant(m) = check_loaded(&f) {
        return Ok(Executed::Invariant(m));
    }
    if let Executed::Invariant(m) = check_loaded(&t) {
        return Ok(Executed::Invariant(m));
    }
    // the dataset operations a trainer applies next work on what was accepted
    let shuffled = ds.shuffled(fnv(input));
    let split = ds.split(ds.len() / 2);
    if let Err(e) = shuffled.and(split) {
        return Ok(Executed::Invariant(format!(
            "an accepted dataset cannot be split: {e}"
        )));
    }
    Ok(Executed::Accepted)
}
