//! Shared by the ONNX tests: the fixture files, running an imported graph under a profile,
//! comparing tensors with a tolerance relative to the reference's scale, and building small
//! models from the protobuf types.
#![allow(dead_code)]

use onnx_protobuf::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use std::collections::HashMap;
use std::path::PathBuf;
use torchlean::backend::BackendProfile;
use torchlean::graph::{append_backward, Graph, SEED};
use torchlean::runtime::compiled::CompiledGraph;
use torchlean::tensor::io::read_safetensors;
use torchlean::Tensor;

/// The PyTorch-exported models in tests/fixtures (scripts/make-onnx-fixtures.py).
pub const FIXTURES: &[&str] = &[
    "mlp",
    "cnn",
    "encoder",
    "gru",
    "lstm",
    "embedding",
    "attention",
    "upsample",
    "encoder_ts",
    "masked",
    "extras",
    "ranked",
    "elman",
    "indexing",
    "bicubic",
];

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn load_values(name: &str) -> Vec<(String, Tensor)> {
    read_safetensors(&fixture(name)).expect("fixture safetensors")
}

pub fn import_fixture(model: &str) -> (Graph, Vec<(String, Tensor)>) {
    let m = torchlean_onnx::read_model(&fixture(&format!("{model}.onnx"))).expect("readable");
    let imported = torchlean_onnx::import_model(&m, model, &HashMap::new()).expect("importable");
    (imported.graph, imported.values)
}

/// Runs `graph` compiled under `profile`; with `grad`, also the gradients of `loss`
/// (`grad.<name>`, as `run-graph --grad` writes them).
pub fn run_graph(
    mut graph: Graph,
    values: &[(String, Tensor)],
    inputs: &[(String, Tensor)],
    profile: &BackendProfile,
    grad: bool,
) -> Result<HashMap<String, Tensor>, torchlean::Error> {
    if grad {
        let loss = graph.loss_output().expect("a loss output").to_string();
        append_backward(&mut graph, &loss, None).expect("backward");
    }
    let seed_shape = graph
        .parameters
        .iter()
        .find(|p| p.name == SEED)
        .map(|p| p.shape.clone());
    let compiled = CompiledGraph::compile(graph, profile)?;
    let out = compiled.run(|name| {
        if name == SEED {
            let shape = seed_shape.clone()?;
            let n = shape.iter().product();
            return Tensor::from_vec(vec![1.0; n], &shape).ok();
        }
        inputs
            .iter()
            .chain(values)
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    })?;
    Ok(out.into_iter().collect())
}

/// max |a − b| ≤ tol · max(1, max |b|), elementwise over equal element counts.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: element counts differ");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs() as f64));
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0f64, f64::max);
    assert!(
        err <= tol * scale,
        "{what}: max |difference| {err:.3e} above {tol:.1e} x scale {scale:.3e}"
    );
}

/// A node `name` of type `op` reading `inputs` and writing `outputs` (no attributes).
pub fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    let mut n = NodeProto::new();
    n.name = name.into();
    n.op_type = op.into();
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    n
}

/// A model of one graph with `nodes`, initializers, declared inputs and outputs, importing
/// the default domain at `opset`.
pub fn model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    opset: i64,
) -> ModelProto {
    let mut g = GraphProto::new();
    g.node = nodes;
    g.initializer = inits;
    g.input = inputs;
    g.output = outputs;
    let mut m = ModelProto::new();
    m.ir_version = 8;
    let mut o = OperatorSetIdProto::new();
    o.version = opset;
    m.opset_import.push(o);
    m.graph = Some(g).into();
    m
}

/// A declared value `name` of element type `elem` and shape `dims`; a negative extent is
/// the symbolic dimension `batch`.
pub fn value_info(name: &str, dims: &[i64], elem: i32) -> ValueInfoProto {
    let mut shape = TensorShapeProto::new();
    for &d in dims {
        let mut dim = tensor_shape_proto::Dimension::new();
        dim.value = Some(if d >= 0 {
            tensor_shape_proto::dimension::Value::DimValue(d)
        } else {
            tensor_shape_proto::dimension::Value::DimParam("batch".into())
        });
        shape.dim.push(dim);
    }
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = elem;
    tensor.shape = Some(shape).into();
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(tensor));
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v.type_ = Some(ty).into();
    v
}

/// An INT attribute `name` = `v` added to `n`.
pub fn with_int(mut n: NodeProto, name: &str, v: i64) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INT.into();
    a.i = v;
    n.attribute.push(a);
    n
}

/// A STRING attribute `name` = `v` added to `n`.
pub fn with_string(mut n: NodeProto, name: &str, v: &str) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::STRING.into();
    a.s = v.as_bytes().to_vec();
    n.attribute.push(a);
    n
}

pub fn with_ints(mut n: NodeProto, name: &str, v: &[i64]) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INTS.into();
    a.ints = v.to_vec();
    n.attribute.push(a);
    n
}

pub fn with_tensor(mut n: NodeProto, name: &str, t: TensorProto) -> NodeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::TENSOR.into();
    a.t = Some(t).into();
    n.attribute.push(a);
    n
}

pub fn ints(name: &str, dims: &[i64], data: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.dims = dims.to_vec();
    t.data_type = 7; // INT64
    t.int64_data = data.to_vec();
    t
}

pub fn floats(name: &str, dims: &[i64], data: &[f32]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.dims = dims.to_vec();
    t.data_type = 1; // FLOAT
    t.float_data = data.to_vec();
    t
}

/// A `Constant` node named `out` producing `t`.
pub fn constant(out: &str, t: TensorProto) -> NodeProto {
    with_tensor(node(out, "Constant", &[], &[out]), "value", t)
}

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let z = torchlean::spec::splitmix64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Runs the model file with tract (an independent ONNX engine) on `inputs`; its outputs in
/// order, as f32.
/// The model `m` (written to `dir` as `what`.onnx) run on `inputs` by torchlean (imported,
/// forward only, under `profile`: its output `y`) and by tract (its first output).
pub fn torchlean_and_tract(
    dir: &std::path::Path,
    what: &str,
    m: &onnx_protobuf::ModelProto,
    inputs: &[(String, Tensor)],
    profile: &BackendProfile,
) -> (Vec<f32>, Vec<f32>) {
    use onnx_protobuf::Message;
    let path = dir.join(format!("{}.onnx", what.replace([' ', ',', '>', '.'], "_")));
    std::fs::write(&path, m.write_to_bytes().unwrap()).unwrap();
    let want = tract_run(&path, inputs).remove(0);
    let imported = torchlean_onnx::import_model(m, what, &HashMap::new())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = run_graph(imported.graph, &imported.values, inputs, profile, false)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    (out["y"].to_vec(), want)
}

/// The bit patterns of `v` (NaN compared as bits).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn tract_run(path: &std::path::Path, inputs: &[(String, torchlean::Tensor)]) -> Vec<Vec<f32>> {
    use tract_onnx::prelude::*;
    use tract_onnx::tract_hir::infer::Factoid;
    let model = tract_onnx::onnx()
        .model_for_path(path)
        .expect("tract reads the model");
    // each input with the element type the model declares (token ids are int64 in the
    // model and float32 integers in torchlean's inputs file)
    let names: Vec<(String, Option<DatumType>)> = model
        .input_outlets()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let dt = model.input_fact(i).unwrap().datum_type.concretize();
            (model.node(o.node).name.clone(), dt)
        })
        .collect();
    let plan = model.into_optimized().unwrap().into_runnable().unwrap();
    let feed: TVec<TValue> = names
        .iter()
        .map(|(n, dt)| {
            let t = &inputs.iter().find(|(k, _)| k == n).expect("input given").1;
            let a = tract_ndarray::ArrayD::from_shape_vec(t.shape().to_vec(), t.to_vec()).unwrap();
            let t = tract_onnx::prelude::Tensor::from(a);
            match dt {
                Some(dt) if *dt != f32::datum_type() => {
                    t.cast_to_dt(*dt).unwrap().into_owned().into()
                }
                _ => t.into(),
            }
        })
        .collect();
    // each output as f32 (an integer output, such as TopK's indices, converted)
    plan.run(feed)
        .expect("tract runs the model")
        .iter()
        .map(|v| {
            let v = v.cast_to::<f32>().expect("a numeric output");
            v.to_plain_array_view::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect()
        })
        .collect()
}
