//! An independent ONNX engine (tract) runs the same fixture files; torchlean's outputs of the
//! imported graphs agree with it.

mod common;

use common::*;
use torchlean::backend::BackendProfile;
use tract_onnx::prelude::*;

fn tract_run(path: &std::path::Path, inputs: &[(String, torchlean::Tensor)]) -> Vec<Vec<f32>> {
    let model = tract_onnx::onnx()
        .model_for_path(path)
        .expect("tract reads the model");
    let names: Vec<String> = model
        .input_outlets()
        .unwrap()
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect();
    let plan = model.into_optimized().unwrap().into_runnable().unwrap();
    let feed: TVec<TValue> = names
        .iter()
        .map(|n| {
            let t = &inputs.iter().find(|(k, _)| k == n).expect("input given").1;
            let a = tract_ndarray::ArrayD::from_shape_vec(t.shape().to_vec(), t.to_vec()).unwrap();
            Tensor::from(a).into()
        })
        .collect();
    plan.run(feed)
        .expect("tract runs the model")
        .iter()
        .map(|v| {
            v.to_plain_array_view::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect()
        })
        .collect()
}

#[test]
fn tract_and_torchlean_agree_on_the_pytorch_fixtures() {
    for model in ["mlp", "cnn", "encoder", "gru"] {
        let path = fixture(&format!("{model}.onnx"));
        let inputs = load_values(&format!("{model}.inputs.safetensors"));
        let theirs = tract_run(&path, &inputs);
        let (graph, values) = import_fixture(model);
        let names: Vec<String> = graph.outputs.iter().map(|o| o.name.clone()).collect();
        let ours = run_graph(
            graph,
            &values,
            &inputs,
            &BackendProfile::default_cpu(),
            false,
        )
        .unwrap();
        for (name, t) in names.iter().zip(&theirs) {
            assert_close(&format!("{model}: {name}"), &ours[name].to_vec(), t, 2e-5);
        }
    }
}
