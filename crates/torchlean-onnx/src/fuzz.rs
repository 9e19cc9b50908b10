//! ONNX models as a fuzz target of the campaign driver in `torchlean::fuzz`.
//!
//! Seeds: the PyTorch-exported fixtures and this crate's own exports of small graphs.
//! Mutations: structure-aware most of the time (the model is decoded, one field that the
//! importer reads is changed — an op type, an attribute, an initializer's dims or data, an
//! input's shape, a node's inputs, the opset — and re-encoded), byte-level otherwise.
//! Execution: decode, import, and for accepted models within the run budget compile under
//! `checked_cpu` and run on deterministic inputs. Invariant of an accepted model: it exports
//! again, and the export imports to a graph with the same inputs and output shapes.

use crate::{decode_model, export_model, import_model};
use onnx_protobuf::{attribute_proto::AttributeType, Message, ModelProto};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::fuzz::{
    interesting_u64, mutate_bytes, random_bytes, Executed, Refusal, Rng, Target,
};
use torchlean::runtime::compiled::CompiledGraph;
use torchlean::Tensor;

/// Accepted models with more elements than this (summed over nodes) are not run.
const RUN_BUDGET: usize = 1 << 21;

/// The ONNX fuzz target (`torchlean fuzz onnx`).
#[derive(Debug, Clone, Copy)]
pub struct OnnxTarget;

const FIXTURES: &[&[u8]] = &[
    include_bytes!("../tests/fixtures/mlp.onnx"),
    include_bytes!("../tests/fixtures/cnn.onnx"),
    include_bytes!("../tests/fixtures/encoder.onnx"),
    include_bytes!("../tests/fixtures/gru.onnx"),
    include_bytes!("../tests/fixtures/lstm.onnx"),
    include_bytes!("../tests/fixtures/embedding.onnx"),
];

impl Target for OnnxTarget {
    fn name(&self) -> &'static str {
        "onnx"
    }

    fn seeds(&self) -> torchlean::Result<Vec<Vec<u8>>> {
        Ok(FIXTURES.iter().map(|b| b.to_vec()).collect())
    }

    fn mutate(&self, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
        let seed = rng.pick(seeds).clone();
        match rng.below(10) {
            0 => random_bytes(rng, &seed[..seed.len().min(16)]),
            1 | 2 => {
                let mut bytes = seed;
                let rounds = rng.range(1, 8);
                mutate_bytes(&mut bytes, rng, rounds);
                bytes
            }
            _ => match ModelProto::parse_from_bytes(&seed) {
                Ok(mut m) => {
                    for _ in 0..rng.range(1, 4) {
                        mutate_model(&mut m, rng);
                    }
                    m.write_to_bytes().unwrap_or(seed)
                }
                Err(_) => seed,
            },
        }
    }

    fn execute(&self, input: &[u8]) -> Result<Executed, Refusal> {
        let model = decode_model(input, "fuzz").map_err(Refusal::of)?;
        let imported = import_model(&model, "fuzz", &HashMap::new()).map_err(Refusal::of)?;
        // invariant: an accepted model exports, and the export imports with the same interface
        let exported = match export_model(&imported.graph, &imported.values) {
            Ok(m) => m,
            Err(e) => {
                return Ok(Executed::Invariant(format!(
                    "an imported graph does not export: {e}"
                )))
            }
        };
        match import_model(&exported, "fuzz-export", &HashMap::new()) {
            Ok(back) => {
                let shapes = |g: &torchlean::graph::Graph| -> Vec<(String, Vec<usize>)> {
                    g.outputs
                        .iter()
                        .map(|o| (o.name.clone(), g.nodes[o.node].shape.clone()))
                        .collect()
                };
                if shapes(&back.graph) != shapes(&imported.graph)
                    || back.graph.inputs != imported.graph.inputs
                {
                    return Ok(Executed::Invariant(
                        "import of the export changed the interface".into(),
                    ));
                }
            }
            Err(e) => {
                return Ok(Executed::Invariant(format!(
                    "the export of an imported graph does not import: {e}"
                )))
            }
        }
        if imported.graph.node_elements().iter().sum::<usize>() > RUN_BUDGET {
            return Ok(Executed::AcceptedNotRun);
        }
        let inputs: Vec<(String, Tensor)> = imported
            .graph
            .inputs
            .iter()
            .map(|d| {
                let n: usize = d.shape.iter().product();
                // small non-negative integers: valid values for float inputs and token ids
                let v = (0..n).map(|i| ((i * 7919) % 13) as f32).collect();
                Tensor::from_vec(v, &d.shape).map(|t| (d.name.clone(), t))
            })
            .collect::<Result<_, _>>()
            .map_err(Refusal::of)?;
        let compiled = CompiledGraph::compile(imported.graph, &BackendProfile::default_cpu())
            .map_err(Refusal::of)?;
        compiled
            .run(|name| {
                inputs
                    .iter()
                    .chain(&imported.values)
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
            })
            .map_err(Refusal::of)?;
        Ok(Executed::Accepted)
    }
}

const OP_TYPES: &[&str] = &[
    "Relu",
    "Gemm",
    "MatMul",
    "Reshape",
    "Transpose",
    "Softmax",
    "Conv",
    "MaxPool",
    "Concat",
    "Slice",
    "Gather",
    "Unsqueeze",
    "Squeeze",
    "Expand",
    "LayerNormalization",
    "Add",
    "Where",
    "Shape",
    "ConstantOfShape",
    "Range",
    "Split",
    "ReduceMean",
    "Erf",
    "Loop",
    "Pad",
    "Resize",
    "AveragePool",
    "ConvTranspose",
    "LeakyRelu",
    "PRelu",
    "HardSwish",
    "InstanceNormalization",
    "ReduceMax",
    "ReduceLogSumExp",
    "ReduceL2",
    "GlobalMaxPool",
    "ArgMax",
    "ArgMin",
    "RNN",
    "OneHot",
    "ScatterND",
    "ScatterElements",
    "GatherND",
    "EyeLike",
    "GRU",
    "LSTM",
    "Not",
    "",
];

/// Attribute names and string values whose meaning the importer reads (modes, padding rules,
/// directions), added to or set on a node.
const ATTRIBUTE_NAMES: &[&str] = &[
    "mode",
    "auto_pad",
    "direction",
    "ceil_mode",
    "coordinate_transformation_mode",
    "nearest_mode",
    "approximate",
    "axes",
    "pads",
    "strides",
];
const STRINGS: &[&str] = &[
    "reflect",
    "edge",
    "wrap",
    "SAME_UPPER",
    "SAME_LOWER",
    "bidirectional",
    "reverse",
    "linear",
    "cubic",
    "tanh",
    "align_corners",
    "",
];

fn interesting_i64(rng: &mut Rng) -> i64 {
    match rng.below(6) {
        0 => -1,
        1 => 0,
        2 => rng.range(1, 5) as i64,
        3 => i64::MAX,
        4 => i64::MIN,
        _ => interesting_u64(rng) as i64,
    }
}

/// Changes one field of the model that the importer reads.
fn mutate_model(m: &mut ModelProto, rng: &mut Rng) {
    if rng.one_in(20) {
        if let Some(o) = m.opset_import.first_mut() {
            o.version = interesting_i64(rng);
        }
        return;
    }
    let Some(g) = m.graph.as_mut() else { return };
    match rng.below(8) {
        0 if !g.node.is_empty() => {
            let i = rng.below(g.node.len());
            g.node[i].op_type = rng.pick(OP_TYPES).to_string();
        }
        1 if !g.node.is_empty() => {
            let i = rng.below(g.node.len());
            let n = &mut g.node[i];
            if n.attribute.is_empty() || rng.one_in(3) {
                // a new attribute the importer reads, of a random kind
                let mut a = onnx_protobuf::AttributeProto::new();
                a.name = rng.pick(ATTRIBUTE_NAMES).to_string();
                if rng.one_in(2) {
                    a.type_ = AttributeType::STRING.into();
                    a.s = rng.pick(STRINGS).as_bytes().to_vec();
                } else {
                    a.type_ = AttributeType::INTS.into();
                    a.ints = (0..rng.range(1, 5)).map(|_| interesting_i64(rng)).collect();
                }
                n.attribute.push(a);
                return;
            }
            let k = rng.below(n.attribute.len());
            let a = &mut n.attribute[k];
            match rng.below(4) {
                0 => a.i = interesting_i64(rng),
                1 => {
                    if a.ints.is_empty() {
                        a.ints.push(interesting_i64(rng));
                    } else {
                        let j = rng.below(a.ints.len());
                        a.ints[j] = interesting_i64(rng);
                    }
                }
                2 => a.f = f32::from_bits(interesting_u64(rng) as u32),
                3 if rng.one_in(2) => {
                    a.type_ = AttributeType::STRING.into();
                    a.s = rng.pick(STRINGS).as_bytes().to_vec();
                }
                _ => a.type_ = AttributeType::INTS.into(),
            }
        }
        2 if !g.initializer.is_empty() => {
            let i = rng.below(g.initializer.len());
            let t = &mut g.initializer[i];
            match rng.below(4) {
                0 if !t.dims.is_empty() => {
                    let j = rng.below(t.dims.len());
                    t.dims[j] = interesting_i64(rng);
                }
                1 => t.data_type = rng.below(17) as i32,
                2 => {
                    let keep = rng.below(t.raw_data.len() + 1);
                    t.raw_data.truncate(keep);
                }
                _ => t.dims.push(rng.range(0, 3) as i64),
            }
        }
        3 if !g.input.is_empty() => {
            let i = rng.below(g.input.len());
            let shape = g.input[i]
                .type_
                .as_mut()
                .and_then(|t| match t.value.as_mut() {
                    Some(onnx_protobuf::type_proto::Value::TensorType(t)) => t.shape.as_mut(),
                    _ => None,
                });
            if let Some(s) = shape {
                if !s.dim.is_empty() {
                    let j = rng.below(s.dim.len());
                    s.dim[j].value = Some(
                        onnx_protobuf::tensor_shape_proto::dimension::Value::DimValue(
                            if rng.one_in(2) {
                                rng.range(0, 9) as i64
                            } else {
                                interesting_i64(rng)
                            },
                        ),
                    );
                }
            }
        }
        4 if g.node.len() > 1 => {
            let i = rng.below(g.node.len());
            g.node.remove(i);
        }
        5 if !g.node.is_empty() => {
            let i = rng.below(g.node.len());
            let j = rng.below(g.node.len());
            if !g.node[j].input.is_empty() && !g.node[i].output.is_empty() {
                let k = rng.below(g.node[j].input.len());
                g.node[j].input[k] = g.node[i].output[0].clone();
            }
        }
        6 if g.node.len() > 1 => {
            let i = rng.below(g.node.len());
            let j = rng.below(g.node.len());
            g.node.swap(i, j);
        }
        _ => {
            if !g.output.is_empty() {
                let i = rng.below(g.output.len());
                g.output[i].name = rng
                    .pick(&["", "x", "loss", "grad.x", "prediction"])
                    .to_string();
            }
        }
    }
}
