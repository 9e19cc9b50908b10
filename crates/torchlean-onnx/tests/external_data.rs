//! ONNX external data (PyTorch's `dynamo=True` exporter writes `model.onnx.data` by
//! default): a model whose initializers live in a file beside it imports and runs exactly as
//! the same model with the bytes inline, and tract (which reads external data itself) agrees;
//! the locations, offsets and lengths a hostile file could give are refused, naming the
//! initializer, before anything is read.

mod common;

use common::*;
use onnx_protobuf::{tensor_proto::DataLocation, Message, StringStringEntryProto, TensorProto};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;

fn fresh_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchlean-external-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `t` with its float data moved to `location` at `offset` (the bytes are returned, to be
/// written there by the caller).
fn externalize(t: &mut TensorProto, location: &str, offset: usize) -> Vec<u8> {
    let bytes: Vec<u8> = t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect();
    t.float_data.clear();
    t.data_location = DataLocation::EXTERNAL.into();
    let entry = |k: &str, v: String| {
        let mut e = StringStringEntryProto::new();
        e.key = k.into();
        e.value = v;
        e
    };
    t.external_data = vec![
        entry("location", location.into()),
        entry("offset", offset.to_string()),
        entry("length", bytes.len().to_string()),
    ];
    bytes
}

/// y = x·W + b, W [4, 3] and b [3] as initializers.
fn linear_model(w: TensorProto, b: TensorProto) -> onnx_protobuf::ModelProto {
    model(
        vec![
            node("mm", "MatMul", &["x", "w"], &["xw"]),
            node("add", "Add", &["xw", "b"], &["y"]),
        ],
        vec![w, b],
        vec![value_info("x", &[2, 4], FLOAT)],
        vec![value_info("y", &[2, 3], FLOAT)],
        17,
    )
}

fn run(path: &Path, x: &Tensor) -> Result<Vec<f32>, String> {
    let m = torchlean_onnx::read_model(path).map_err(|e| e.to_string())?;
    let imported =
        torchlean_onnx::import_model(&m, "external", &HashMap::new()).map_err(|e| e.to_string())?;
    let profile = BackendProfile::named("checked_cpu").expect("profile");
    let out = run_graph(
        imported.graph,
        &imported.values,
        &[("x".into(), x.clone())],
        &profile,
        false,
    )
    .map_err(|e| e.to_string())?;
    Ok(out["y"].to_vec())
}

#[test]
fn external_initializers_run_as_the_inline_model() {
    let dir = fresh_dir("same");
    let (w, b) = (
        floats("w", &[4, 3], &values(12, 1)),
        floats("b", &[3], &values(3, 2)),
    );
    let x = Tensor::from_vec(values(8, 3), &[2, 4]).unwrap();
    let inline_path = dir.join("inline.onnx");
    std::fs::write(
        &inline_path,
        linear_model(w.clone(), b.clone()).write_to_bytes().unwrap(),
    )
    .unwrap();
    // both tensors in one data file, b first and W after a gap (offsets are honoured)
    let (mut we, mut be) = (w.clone(), b.clone());
    let b_bytes = externalize(&mut be, "weights.bin", 0);
    let w_bytes = externalize(&mut we, "weights.bin", 64);
    let mut data = b_bytes;
    data.resize(64, 0xAB);
    data.extend(w_bytes);
    std::fs::write(dir.join("weights.bin"), data).unwrap();
    let ext_path = dir.join("external.onnx");
    std::fs::write(&ext_path, linear_model(we, be).write_to_bytes().unwrap()).unwrap();

    let (inline, external) = (run(&inline_path, &x).unwrap(), run(&ext_path, &x).unwrap());
    assert_eq!(inline, external);
    let theirs = tract_run(&ext_path, &[("x".into(), x.clone())]).remove(0);
    assert_close("external vs tract", &external, &theirs, 1e-6);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn hostile_external_data_is_refused_before_reading() {
    let dir = fresh_dir("hostile");
    std::fs::write(dir.join("ok.bin"), vec![0u8; 48]).unwrap();
    let x = Tensor::from_vec(values(8, 3), &[2, 4]).unwrap();
    let b = floats("b", &[3], &values(3, 2));
    let refused = |edit: &dyn Fn(&mut TensorProto), tag: &str| -> String {
        let mut w = floats("w", &[4, 3], &values(12, 1));
        externalize(&mut w, "ok.bin", 0);
        edit(&mut w);
        let path = dir.join(format!("{tag}.onnx"));
        std::fs::write(&path, linear_model(w, b.clone()).write_to_bytes().unwrap()).unwrap();
        let e = run(&path, &x).expect_err(tag);
        assert!(e.contains("initializer `w`"), "{tag}: {e}");
        e
    };
    let set = |key: &'static str, v: &'static str| {
        move |t: &mut TensorProto| {
            t.external_data
                .iter_mut()
                .find(|e| e.key == key)
                .unwrap()
                .value = v.into();
        }
    };
    assert!(refused(&set("location", "../ok.bin"), "parent").contains("relative path inside"));
    assert!(refused(&set("location", "/etc/passwd"), "absolute").contains("relative path inside"));
    assert!(refused(&set("location", "sub/../ok.bin"), "dotdot").contains("relative path inside"));
    assert!(refused(&set("location", ""), "empty").contains("relative path inside"));
    assert!(refused(&set("location", "missing.bin"), "missing").contains("missing.bin"));
    assert!(refused(&set("offset", "8"), "past the end").contains("which holds 48"));
    assert!(refused(&set("offset", "-1"), "negative").contains("not a byte count"));
    assert!(refused(&set("length", "40"), "length").contains("48 bytes"));
    let huge = |t: &mut TensorProto| t.dims = vec![1 << 20, 1 << 20, 1 << 20];
    let e = refused(&huge, "huge");
    assert!(e.contains("larger than 2^31 elements"), "{e}");
    let no_location = |t: &mut TensorProto| t.external_data.retain(|e| e.key != "location");
    assert!(refused(&no_location, "no location").contains("no `location`"));
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    assert!(refused(&set("location", "adir"), "directory").contains("not a regular file"));
    #[cfg(unix)]
    {
        let outside = fresh_dir("outside");
        std::fs::write(outside.join("secret.bin"), vec![0u8; 48]).unwrap();
        std::os::unix::fs::symlink(outside.join("secret.bin"), dir.join("link.bin")).unwrap();
        assert!(refused(&set("location", "link.bin"), "symlink").contains("leads out"));
        std::fs::remove_dir_all(&outside).ok();
    }
    // a model decoded from bytes has no directory: its external data stays refused
    let mut w = floats("w", &[4, 3], &values(12, 1));
    externalize(&mut w, "ok.bin", 0);
    let m = linear_model(w, b.clone());
    let e = torchlean_onnx::import_model(&m, "bytes", &HashMap::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("external data"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
