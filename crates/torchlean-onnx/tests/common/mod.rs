//! Shared by the ONNX tests: the fixture files, running an imported graph under a profile,
//! and comparing tensors with a tolerance relative to the reference's scale.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use torchlean::backend::BackendProfile;
use torchlean::graph::{append_backward, Graph, SEED};
use torchlean::runtime::compiled::CompiledGraph;
use torchlean::tensor::io::read_safetensors;
use torchlean::Tensor;

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
