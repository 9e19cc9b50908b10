//! ONNX models exported by PyTorch (scripts/make-onnx-fixtures.py) import and run under
//! several profiles, and their outputs and parameter gradients match what PyTorch computed
//! for the same inputs (stored beside each model).

mod common;

use common::*;
use torchlean::backend::BackendProfile;

const PROFILES: &[&str] = &["checked_cpu", "strict_cpu", "strict_native_cpu"];

/// Every fixture under every CPU profile matches PyTorch's stored values: outputs and, with
/// `grad`, the parameter gradients (`grad.<name>`).
fn fixtures_match_pytorch(grad: bool) {
    for model in FIXTURES {
        let (graph, values) = import_fixture(model);
        let inputs = load_values(&format!("{model}.inputs.safetensors"));
        let expected = load_values(&format!("{model}.expected.safetensors"));
        for profile in PROFILES {
            let p = BackendProfile::named(profile).unwrap();
            let out = run_graph(graph.clone(), &values, &inputs, &p, grad)
                .unwrap_or_else(|e| panic!("{model} under {profile}: {e}"));
            for (name, want) in expected
                .iter()
                .filter(|(n, _)| grad || !n.starts_with("grad."))
            {
                let got = out
                    .get(name)
                    .unwrap_or_else(|| panic!("{model} under {profile}: no output `{name}`"));
                assert_close(
                    &format!("{model} under {profile}: {name}"),
                    &got.to_vec(),
                    &want.to_vec(),
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn pytorch_fixtures_match_pytorch_forward_and_gradients_under_every_cpu_profile() {
    fixtures_match_pytorch(true);
}

/// Inference graphs (no `--grad`) are where compiled mode fuses (elementwise chains, and the
/// CNN's convolutions with their batch norm and ReLU into `conv2d_map`): the forward outputs
/// match PyTorch's under every profile there too, the fused capsules planned and gated by each
/// (the replayed `conv2d_map` under strict_native_cpu).
#[test]
fn pytorch_fixtures_match_pytorch_forward_without_gradients_under_every_cpu_profile() {
    fixtures_match_pytorch(false);
}

#[test]
fn gradients_reach_the_initializers_under_their_pytorch_names() {
    // every parameter PyTorch has a gradient for is a parameter of the imported graph
    for model in FIXTURES {
        let (graph, _) = import_fixture(model);
        let expected = load_values(&format!("{model}.expected.safetensors"));
        for (name, _) in expected.iter().filter(|(n, _)| n.starts_with("grad.")) {
            let param = &name["grad.".len()..];
            assert!(
                graph.parameters.iter().any(|p| p.name == param),
                "{model}: `{param}` is not a parameter of the imported graph"
            );
        }
    }
}

/// `encoder_ts` is `nn.TransformerEncoderLayer` as the TorchScript exporter writes it
/// (`dynamo=False`): its attention's shape checks compute a `Mod` from `Constant`s only, which
/// the import evaluates (it was refused: "no torchlean mapping for `Mod`"). The file must
/// hold that node for the fixture to test it; its values against PyTorch's are checked with
/// the other fixtures above (onnxruntime 1.32 agrees with PyTorch on it within 4.8e-7, checked
/// when the fixture was made).
#[test]
fn the_torchscript_encoder_fixture_has_a_constant_mod_and_imports() {
    let m = torchlean_onnx::read_model(&fixture("encoder_ts.onnx")).expect("readable");
    let g = m.graph.as_ref().expect("a graph");
    assert!(g.node.iter().any(|n| n.op_type == "Mod"));
    let (graph, _) = import_fixture("encoder_ts");
    assert_eq!(graph.outputs.len(), 2);
}
