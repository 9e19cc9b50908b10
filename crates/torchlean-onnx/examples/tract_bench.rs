//! Times tract's inference of an ONNX model on deterministic inputs of its declared shapes
//! (the third column of scripts/bench-onnx.sh); prints JSON.
//!
//!     cargo run --release -p torchlean-onnx --example tract_bench -- MODEL.onnx [REPS]

use std::time::Instant;
use tract_onnx::prelude::*;

fn main() -> TractResult<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: tract_bench MODEL.onnx [REPS]");
        std::process::exit(2)
    };
    let reps: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(20);
    // the declared input shapes, read by torchlean's importer (concrete in the bench models)
    let imported = torchlean_onnx::import_model(
        &torchlean_onnx::read_model(std::path::Path::new(path))?,
        path,
        &Default::default(),
    )?;
    let shapes: Vec<Vec<usize>> = imported
        .graph
        .inputs
        .iter()
        .map(|d| d.shape.clone())
        .collect();
    let model = tract_onnx::onnx().model_for_path(path)?;
    let plan = model.into_optimized()?.into_runnable()?;
    let inputs: TVec<TValue> = shapes
        .iter()
        .map(|s| {
            let n: usize = s.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 13) as f32 / 6.5 - 1.0)
                .collect();
            Ok(Tensor::from(tract_ndarray::ArrayD::from_shape_vec(s.clone(), v)?).into())
        })
        .collect::<TractResult<_>>()?;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 0.5 {
        plan.run(inputs.clone())?;
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            plan.run(inputs.clone()).map(|_| t.elapsed().as_secs_f64())
        })
        .collect::<TractResult<_>>()?;
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"engine\": \"tract 0.23\", \"model\": \"{path}\", \"median\": {}, \"min\": {}, \"unit\": \"ms\"}}",
        times[times.len() / 2] * 1e3,
        times[0] * 1e3
    );
    Ok(())
}
