//! Graph files: export → run-graph reproduces the in-process run; malformed graph and
//! safetensors files are rejected cleanly (exit 2, a readable message, no panic).

use std::path::{Path, PathBuf};
use std::process::Command;
use torchlean::nn::tasks::SyntheticRegression;
use torchlean::nn::{Activation, Mlp, Module};
use torchlean::tensor::io::read_safetensors;
use torchlean::Tensor;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_torchlean"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("torchlean-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn p(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn export(d: &Dir) {
    let (code, _, err) = run(&[
        "export",
        "--model",
        "mlp",
        "--out",
        &d.p("g.json"),
        "--params",
        &d.p("p.st"),
        "--example-inputs",
        &d.p("x.st"),
        "--batch-size",
        "8",
        "--seed",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
}

fn get<'a>(v: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &v.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no `{name}`"))
        .1
}

#[test]
fn export_then_run_graph_reproduces_the_in_process_run() {
    let d = Dir::new("roundtrip");
    export(&d);
    let (code, _, err) = run(&[
        "run-graph",
        &d.p("g.json"),
        "--params",
        &d.p("p.st"),
        "--inputs",
        &d.p("x.st"),
        "--out",
        &d.p("y.st"),
        "--grad",
    ]);
    assert_eq!(code, 0, "{err}");
    let out = read_safetensors(Path::new(&d.p("y.st"))).unwrap();
    // the same model, data and seed, run eagerly in process, under the profile the command
    // used (checked_cpu), chosen here explicitly
    torchlean::runtime::install(torchlean::runtime::Session::new(
        torchlean::backend::BackendProfile::default_cpu(),
    ))
    .unwrap();
    let model = Mlp::new(
        &[SyntheticRegression::FEATURES, 64, 64, 1],
        Activation::Tanh,
        3,
    )
    .unwrap();
    let (x, y) = SyntheticRegression::new(1024, 20)
        .unwrap()
        .batch(0, 8)
        .unwrap();
    let x = x.requires_grad();
    let y = y.requires_grad();
    let pred = model.forward(&x).unwrap();
    let loss = pred.mse_loss(&y).unwrap();
    let grads = loss.backward().unwrap();
    assert_eq!(get(&out, "prediction").to_vec(), pred.to_vec());
    assert_eq!(get(&out, "loss").to_vec(), loss.to_vec());
    for (name, p) in model.parameters() {
        assert_eq!(
            get(&out, &format!("grad.{name}")).to_vec(),
            grads.get(p).unwrap().to_vec(),
            "grad.{name}"
        );
    }
    assert_eq!(
        get(&out, "grad.x").to_vec(),
        grads.get(&x).unwrap().to_vec()
    );
    assert_eq!(
        get(&out, "grad.y").to_vec(),
        grads.get(&y).unwrap().to_vec()
    );
}

/// Applies `edit` to the exported graph JSON, runs it, and expects exit 2 with `expect`.
fn rejects_graph(tag: &str, edit: impl Fn(&mut serde_json::Value), expect: &str) {
    let d = Dir::new(tag);
    export(&d);
    let mut g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.p("g.json")).unwrap()).unwrap();
    edit(&mut g);
    std::fs::write(d.p("bad.json"), serde_json::to_string(&g).unwrap()).unwrap();
    let (code, _, err) = run(&[
        "run-graph",
        &d.p("bad.json"),
        "--params",
        &d.p("p.st"),
        "--inputs",
        &d.p("x.st"),
        "--out",
        &d.p("y.st"),
    ]);
    assert_eq!(code, 2, "{tag}: {err}");
    assert!(err.contains(expect), "{tag}: expected `{expect}` in: {err}");
    assert!(!err.contains("panicked"), "{tag}: {err}");
}

fn first_op(g: &mut serde_json::Value) -> &mut serde_json::Value {
    g["nodes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|n| n["kind"] == "op")
        .unwrap()
}

#[test]
fn unknown_op_is_rejected() {
    rejects_graph(
        "unknown-op",
        |g| first_op(g)["op"]["op"] = "frobnicate".into(),
        "unknown variant `frobnicate`",
    );
}

#[test]
fn cycle_is_rejected() {
    rejects_graph(
        "cycle",
        |g| {
            let n = first_op(g);
            let id = n["id"].clone();
            n["parents"][0] = id;
        },
        "is not an earlier node (cycle or out of range)",
    );
}

#[test]
fn parent_out_of_range_is_rejected() {
    rejects_graph(
        "parent-range",
        |g| first_op(g)["parents"][0] = 9999.into(),
        "parent 9999 is not an earlier node",
    );
}

#[test]
fn shape_mismatch_is_rejected() {
    rejects_graph(
        "shape",
        |g| first_op(g)["shape"] = serde_json::json!([8, 63]),
        "declared shape [8, 63], but the inferred shape is [8, 64]",
    );
    rejects_graph(
        "arity",
        |g| first_op(g)["parents"].as_array_mut().unwrap().truncate(1),
        "expected 2 or 3 input(s), got 1",
    );
}

#[test]
fn dtype_mismatch_is_rejected() {
    rejects_graph(
        "dtype",
        |g| first_op(g)["dtype"] = "f64".into(),
        "dtype `f64` is not supported",
    );
}

#[test]
fn absurd_sizes_are_rejected_before_allocation() {
    rejects_graph(
        "huge",
        |g| {
            g["inputs"][0]["shape"] = serde_json::json!([1u64 << 40, 4]);
            g["nodes"][0]["shape"] = serde_json::json!([1u64 << 40, 4]);
        },
        "too large",
    );
    rejects_graph(
        "format",
        |g| g["format"] = "torchlean.ir.v0".into(),
        "format is `torchlean.ir.v0`",
    );
    rejects_graph(
        "undeclared",
        |g| g["nodes"][0]["name"] = "nope".into(),
        "undeclared input `nope`",
    );
}

#[test]
fn missing_or_misshapen_values_are_rejected() {
    let d = Dir::new("values");
    export(&d);
    // parameters file without the parameters: the graph names them
    let (code, _, err) = run(&[
        "run-graph",
        &d.p("g.json"),
        "--params",
        &d.p("x.st"),
        "--inputs",
        &d.p("x.st"),
        "--out",
        &d.p("y.st"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing parameter `layers.0.weight`"), "{err}");
    // inputs of the wrong shape
    torchlean::tensor::io::write_safetensors(
        Path::new(&d.p("bad.st")),
        &[
            ("x".into(), Tensor::zeros(&[3, 4]).unwrap()),
            ("y".into(), Tensor::zeros(&[8, 1]).unwrap()),
        ],
        None,
    )
    .unwrap();
    let (code, _, err) = run(&[
        "run-graph",
        &d.p("g.json"),
        "--params",
        &d.p("p.st"),
        "--inputs",
        &d.p("bad.st"),
        "--out",
        &d.p("y.st"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("`x` has shape [3, 4], the graph declares [8, 4]"),
        "{err}"
    );
}

#[test]
fn broken_safetensors_files_are_rejected() {
    let d = Dir::new("st");
    export(&d);
    let good = std::fs::read(d.p("p.st")).unwrap();
    let try_params = |bytes: &[u8], expect: &str| {
        std::fs::write(d.p("bad.st"), bytes).unwrap();
        let (code, _, err) = run(&[
            "run-graph",
            &d.p("g.json"),
            "--params",
            &d.p("bad.st"),
            "--inputs",
            &d.p("x.st"),
            "--out",
            &d.p("y.st"),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(expect) && !err.contains("panicked"),
            "expected `{expect}`: {err}"
        );
    };
    // truncated data: offsets point beyond the real size
    try_params(&good[..good.len() - 10], "not a valid safetensors file");
    // a header length larger than the file
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    try_params(&huge, "not a valid safetensors file");
    // empty file
    try_params(&[], "not a valid safetensors file");
    // a valid file whose F64 tensor holds a value float32 does not (0.1)
    let header = br#"{"layers.0.weight":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
    let mut f64_file = (header.len() as u64).to_le_bytes().to_vec();
    f64_file.extend_from_slice(header);
    f64_file.extend_from_slice(&0.1f64.to_le_bytes());
    try_params(&f64_file, "float32 does not hold exactly");
    // a dtype torchlean does not read
    let header = br#"{"layers.0.weight":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}}"#;
    let mut f8_file = (header.len() as u64).to_le_bytes().to_vec();
    f8_file.extend_from_slice(header);
    f8_file.push(0);
    try_params(&f8_file, "dtype F8_E5M2 is not supported");
    // a graph file that is not JSON
    std::fs::write(d.p("junk.json"), b"\x00\x01 not json").unwrap();
    let (code, _, err) = run(&[
        "run-graph",
        &d.p("junk.json"),
        "--inputs",
        &d.p("x.st"),
        "--out",
        &d.p("y.st"),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("not a torchlean.ir.v1 graph"), "{err}");
}

#[test]
fn compiled_and_eager_quickstart_print_the_same_losses() {
    let (c1, eager, _) = run(&["quickstart-mlp", "--steps", "60", "--backend", "eager"]);
    let (c2, compiled, err) = run(&[
        "quickstart-mlp",
        "--steps",
        "60",
        "--backend",
        "compiled",
        "--show-backend",
    ]);
    assert_eq!((c1, c2), (0, 0), "{err}");
    let losses = |s: &str| -> Vec<f32> {
        s.lines()
            .filter_map(|l| l.strip_prefix("step "))
            .map(|l| l.split(" loss ").nth(1).unwrap().parse().unwrap())
            .collect()
    };
    let (e, c) = (losses(&eager), losses(&compiled));
    assert_eq!(e.len(), c.len());
    for (a, b) in e.iter().zip(&c) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "eager {a} vs compiled {b}");
    }
    assert!(
        compiled.contains("mode=compiled") && compiled.contains("group: singleton"),
        "the compiled plan's report is shown: {compiled}"
    );
}

/// Renames every declaration and node reference of `from` to `to` in a graph JSON.
fn rename(g: &mut serde_json::Value, from: &str, to: &str) {
    for list in ["inputs", "parameters", "outputs"] {
        for d in g[list].as_array_mut().unwrap() {
            if d["name"] == from {
                d["name"] = to.into();
            }
        }
    }
    for n in g["nodes"].as_array_mut().unwrap() {
        if n["name"] == from {
            n["name"] = to.into();
        }
    }
}

/// `grad.` names are generated by backward derivation: a parameter called `grad.seed` was once
/// silently replaced by 1.0, an input of that name refused as "not supplied". User graphs
/// may not use the namespace at all.
#[test]
fn reserved_gradient_names_are_refused() {
    for (tag, kind_list) in [
        ("reserved-param", "parameters"),
        ("reserved-input", "inputs"),
    ] {
        rejects_graph(
            tag,
            |g| {
                let from = g[kind_list][0]["name"].as_str().unwrap().to_string();
                rename(g, &from, "grad.seed");
            },
            "reserved prefix `grad.`",
        );
    }
    rejects_graph(
        "reserved-output",
        |g| {
            let from = g["outputs"][0]["name"].as_str().unwrap().to_string();
            rename(g, &from, "grad.x");
        },
        "reserved prefix `grad.`",
    );
}

/// `--grad` on a loss that no input reaches differentiably (through argmax) wrote the loss
/// alone and exited 0; now it is refused with the reason. A loss some inputs reach writes
/// their gradients and names the others.
#[test]
fn grad_of_a_loss_no_input_reaches_is_refused_and_unreached_inputs_are_named() {
    let d = Dir::new("grad-unreached");
    let graph = |loss: &str| {
        format!(
            r#"{{"format": "torchlean.ir.v1", "inputs": [{{"name": "x", "shape": [4]}}, {{"name": "i", "shape": [4]}}], "parameters": [],
            "nodes": [{{"kind": "input", "name": "x", "shape": [4], "id": 0, "dtype": "f32", "parents": []}},
                      {{"kind": "input", "name": "i", "shape": [4], "id": 1, "dtype": "f32", "parents": []}},
                      {loss}],
            "outputs": [{{"name": "loss", "node": 2}}]}}"#
        )
    };
    std::fs::write(
        d.p("argmax.json"),
        graph(r#"{"kind": "op", "op": {"op": "argmax", "axis": 0}, "parents": [0], "shape": [], "id": 2, "dtype": "f32"}"#),
    )
    .unwrap();
    std::fs::write(
        d.p("sum.json"),
        graph(r#"{"kind": "op", "op": {"op": "sum_all"}, "parents": [0], "shape": [], "id": 2, "dtype": "f32"}"#),
    )
    .unwrap();
    let x = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.0], &[4]).unwrap();
    let i = Tensor::from_vec(vec![0.0, 1.0, 2.0, 3.0], &[4]).unwrap();
    torchlean::tensor::io::write_safetensors(
        Path::new(&d.p("in.st")),
        &[("x".to_string(), x), ("i".to_string(), i)],
        None,
    )
    .unwrap();
    let run_grad = |g: &str| {
        run(&[
            "run-graph",
            &d.p(g),
            "--inputs",
            &d.p("in.st"),
            "--out",
            &d.p("out.st"),
            "--grad",
        ])
    };
    let (code, _, err) = run_grad("argmax.json");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("does not depend differentiably on any input"),
        "{err}"
    );
    let (code, _, err) = run_grad("sum.json");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("does not depend differentiably on i "),
        "{err}"
    );
    let out = read_safetensors(Path::new(&d.p("out.st"))).unwrap();
    assert_eq!(get(&out, "grad.x").to_vec(), vec![1.0; 4]);
    assert!(out.iter().all(|(n, _)| n != "grad.i"));
}

/// The capsules of a report JSON, in order: (op, capsule, composite it is a part of).
fn report_kernels(path: &str) -> Vec<(String, String, Option<String>)> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["op"].as_str().unwrap().to_string(),
                k["capsule"].as_str().unwrap().to_string(),
                k["part_of"].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[test]
fn a_compiled_plan_names_the_capsules_a_compiled_run_reports() {
    // the convolutional model's graph is lowered before it runs (fused epilogues); the plan
    // must be of the lowered graph, with and without the backward run-graph appends
    let d = Dir::new("plan-compiled");
    for model in ["mlp", "cnn"] {
        let (g, p, x) = (
            d.p(&format!("{model}.json")),
            d.p(&format!("{model}.st")),
            d.p(&format!("{model}.x.st")),
        );
        let (code, _, err) = run(&[
            "export",
            "--model",
            model,
            "--out",
            &g,
            "--params",
            &p,
            "--example-inputs",
            &x,
        ]);
        assert_eq!(code, 0, "{err}");
        let grads: &[&[&str]] = if model == "mlp" {
            &[&[], &["--grad"]]
        } else {
            &[&[]]
        };
        for grad in grads {
            let (plan_json, run_json, out) = (d.p("plan.json"), d.p("run.json"), d.p("o.st"));
            // a model's plan is compiled by default (as run-graph runs it): with and
            // without `--mode compiled`, the same kernels as the run
            let mut plan = vec!["plan", "--model", &g, "--report-json", &plan_json];
            plan.extend_from_slice(grad);
            let (code, _, err) = run(&plan);
            assert_eq!(code, 0, "{err}");
            let by_default = report_kernels(&plan_json);
            plan.extend_from_slice(&["--mode", "compiled"]);
            let (code, _, err) = run(&plan);
            assert_eq!(code, 0, "{err}");
            let mut exec = vec![
                "run-graph",
                &g,
                "--params",
                &p,
                "--inputs",
                &x,
                "--out",
                &out,
                "--report-json",
                &run_json,
            ];
            exec.extend_from_slice(grad);
            let (code, _, err) = run(&exec);
            assert_eq!(code, 0, "{err}");
            let (planned, ran) = (report_kernels(&plan_json), report_kernels(&run_json));
            assert!(!planned.is_empty());
            assert_eq!(planned, ran, "{model} {grad:?}");
            assert_eq!(by_default, ran, "{model} {grad:?}: the default plan");
            if model == "cnn" {
                assert!(planned.iter().any(|k| k.0 == "conv2d_map"), "{planned:?}");
            }
        }
    }
    let (code, _, err) = run(&[
        "plan",
        "--model",
        &d.p("mlp.json"),
        "--mode",
        "eager",
        "--grad",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--grad applies to --mode compiled"), "{err}");
}

/// A Clip bound held by an initializer that is also a parameter elsewhere (`y = Clip(x, lo) +
/// lo`, lo = -1 in the file, x = -2, -1.5, ..., 2): the bound is read at run time (a
/// `compare` and a `where`, forty-fifth session), so a value given with `--params` reaches
/// both uses. Until then the import read the bound as a constant, and the model was refused
/// with `--params` and `--grad` (forty-third session's ONNX audit).
#[test]
fn an_initializer_used_as_a_clip_bound_and_a_parameter_is_replaced_in_both_uses() {
    let d = Dir::new("baked-initializer");
    let fx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/clip_bound_shared"
    );
    let (model, inputs, params) = (
        format!("{fx}.onnx"),
        format!("{fx}.inputs.safetensors"),
        format!("{fx}.params.safetensors"),
    );
    let out = d.p("y.safetensors");
    let y = |extra: &[&str]| {
        let mut args = vec!["run-graph", &model, "--inputs", &inputs, "--out", &out];
        args.extend_from_slice(extra);
        let (code, _, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        read_safetensors(Path::new(&out))
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == "y")
            .expect("output y")
            .1
            .to_vec()
    };
    // the file's lo = -1: max(x, -1) + (-1)
    let file = y(&[]);
    assert_eq!((file[0], file[file.len() - 1]), (-2.0, 1.0), "{file:?}");
    // the params file's lo = -0.5, in both uses: max(x, -0.5) + (-0.5)
    let given = y(&["--params", &params]);
    assert_eq!((given[0], given[given.len() - 1]), (-1.0, 1.5), "{given:?}");
}

/// An ONNX graph input that an initializer backs (`b`, legal in ONNX) is a parameter here: a
/// tensor for it in `--inputs` is pointed to `--params` (it was refused as "a shape was given
/// for an input the model does not have": the ONNX audit).
#[test]
fn a_tensor_for_an_initializer_backed_input_is_pointed_to_params() {
    let d = Dir::new("input-initializer");
    let fx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/input_with_initializer"
    );
    let (model, inputs) = (format!("{fx}.onnx"), format!("{fx}.inputs.safetensors"));
    let out = d.p("y.safetensors");
    let (code, _, err) = run(&["run-graph", &model, "--inputs", &inputs, "--out", &out]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`b`") && err.contains("--params"), "{err}");
    assert!(!err.contains("a shape was given"), "{err}");
}

/// A safetensors file's tensors as (name → (dtype label, shape, raw bytes)), read from its
/// header without torchlean's reader (which converts every dtype to f32).
fn raw_safetensors(path: &str) -> std::collections::BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let offsets: Vec<usize> = v["data_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_u64().unwrap() as usize)
                .collect();
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            let dtype = v["dtype"].as_str().unwrap().to_string();
            (
                k.clone(),
                (dtype, shape, data[offsets[0]..offsets[1]].to_vec()),
            )
        })
        .collect()
}

/// `run-graph` writes each output of an ONNX model in the element type the model declares —
/// argmax and topk indices int64, a comparison bool, a cast int32, a cast float64 — as
/// PyTorch returns them (`torch.testing.assert_close` compares dtypes); they were all written
/// as float32. The expected file holds PyTorch's own outputs in PyTorch's dtypes
/// (scripts/make-typed-outputs-fixture.py): the integer, boolean and float64 ones must match
/// byte for byte, the float32 sum to rounding. An integer-declared output whose value is not
/// an integer (a NaN cast to int32, which ONNX leaves undefined) is a runtime error naming
/// the output and the element, never a wrapped or invented integer.
#[test]
fn run_graph_writes_each_output_in_the_type_the_model_declares() {
    let d = Dir::new("typed-outputs");
    let fx = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/typed_outputs");
    let (model, inputs) = (format!("{fx}.onnx"), format!("{fx}.inputs.safetensors"));
    let out = d.p("y.safetensors");
    let (code, _, err) = run(&["run-graph", &model, "--inputs", &inputs, "--out", &out]);
    assert_eq!(code, 0, "{err}");
    let got = raw_safetensors(&out);
    let want = raw_safetensors(&format!("{fx}.expected.safetensors"));
    assert_eq!(got.len(), want.len());
    for (name, (dtype, shape, bytes)) in &want {
        let (g_dtype, g_shape, g_bytes) = &got[name];
        assert_eq!((g_dtype, g_shape), (dtype, shape), "{name}");
        if dtype == "F32" {
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            for (a, b) in f(g_bytes).iter().zip(f(bytes)) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{name}: {a} vs {b}"
                );
            }
        } else {
            assert_eq!(g_bytes, bytes, "{name} ({dtype})");
        }
    }
    // a NaN input: floor(NaN · 4) cast to int32 has no integer value to write
    let x = read_safetensors(Path::new(&inputs)).unwrap();
    let mut v = x[0].1.to_vec();
    v[7] = f32::NAN;
    let nan_inputs = d.p("nan.safetensors");
    torchlean::tensor::io::write_safetensors(
        Path::new(&nan_inputs),
        &[("x".into(), Tensor::from_vec(v, x[0].1.shape()).unwrap())],
        None,
    )
    .unwrap();
    let (code, _, err) = run(&[
        "run-graph",
        &model,
        "--inputs",
        &nan_inputs,
        "--out",
        &d.p("n.st"),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`quarters`") && err.contains("element 7") && err.contains("I32"),
        "{err}"
    );
    assert!(!Path::new(&d.p("n.st")).exists());
}
