//! ONNX external data: initializers whose bytes live in a file beside the model (PyTorch's
//! exporter writes `model.onnx.data` by default for `dynamo=True` exports). When a model is
//! read from a file, each such initializer's bytes are read into the tensor (`raw_data`), so
//! the import sees an ordinary model.
//!
//! The model file is untrusted input, and so are the paths it names: a `location` must be a
//! relative path of plain components inside the model's directory (no `..`, no absolute path,
//! no symbolic link leading out of it), name a regular file, and the bytes asked for must match
//! the tensor's dims and element type and lie inside that file. All external bytes together
//! are bounded by [`MAX_EXTERNAL_BYTES`]. Anything else is an error naming the initializer and
//! the file, before any byte of it is read.

use crate::constant::{dtype, sizes};
use crate::error::OnnxError;
use onnx_protobuf::{tensor_proto::DataLocation, ModelProto, TensorProto};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

/// Most bytes read from external data files for one model (with the model file's own 2 GiB).
pub const MAX_EXTERNAL_BYTES: u64 = 8 << 30;

/// Whether `t` keeps its data outside the model file.
pub fn is_external(t: &TensorProto) -> bool {
    !t.external_data.is_empty() || t.data_location.value() == DataLocation::EXTERNAL as i32
}

/// The folder of `model_path` (`.` for a bare file name).
fn model_dir(model_path: &Path) -> &Path {
    match model_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The files the external data of `model`'s initializers name (read from `model_path`),
/// resolved as [`load_external_data`] resolves them, each once: inputs of the command that
/// reads the model, which none of its outputs may overwrite. A location that does not
/// resolve is left out (reading it is refused).
pub fn external_files(model: &ModelProto, model_path: &Path) -> Vec<PathBuf> {
    let dir = model_dir(model_path);
    let mut files: Vec<PathBuf> = vec![];
    let initializers = model.graph.iter().flat_map(|g| &g.initializer);
    for t in initializers.filter(|t| is_external(t)) {
        let location = t.external_data.iter().find(|e| e.key == "location");
        if let Some(file) = location.and_then(|e| inside(dir, &e.value).ok()) {
            if !files.contains(&file) {
                files.push(file);
            }
        }
    }
    files
}

/// Reads the external data of every initializer of `model` (read from `model_path`) into the
/// initializer itself.
pub fn load_external_data(model: &mut ModelProto, model_path: &Path) -> Result<(), OnnxError> {
    let dir = model_dir(model_path);
    let shown = model_path.display().to_string();
    let mut budget = MAX_EXTERNAL_BYTES;
    let Some(graph) = model.graph.as_mut() else {
        return Ok(());
    };
    for t in graph.initializer.iter_mut().filter(|t| is_external(t)) {
        let bytes = read_one(t, dir, &mut budget).map_err(|reason| OnnxError::Model {
            path: shown.clone(),
            reason: format!("initializer `{}`: external data: {reason}", t.name),
        })?;
        t.raw_data = bytes;
        t.external_data.clear();
        t.data_location = DataLocation::DEFAULT.into();
    }
    Ok(())
}

/// The bytes of one external tensor, every check made before reading.
fn read_one(t: &TensorProto, dir: &Path, budget: &mut u64) -> Result<Vec<u8>, String> {
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let number = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("`{key}` is {v:?}, not a byte count"))
            })
            .transpose()
    };
    let location = entry("location").ok_or("no `location` entry")?;
    let file = inside(dir, location)?;
    let width = dtype::width(t.data_type)
        .ok_or_else(|| format!("element type {} is not supported", dtype::name(t.data_type)))?
        as u64;
    let count = sizes(&t.dims)?
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .ok_or("the dims' element count overflows")?;
    let want = count
        .checked_mul(width)
        .ok_or("the tensor's byte count overflows")?;
    let offset = number("offset")?.unwrap_or(0);
    if let Some(length) = number("length")? {
        if length != want {
            return Err(format!(
                "`length` {length} for dims {:?} of {width}-byte elements ({want} bytes)",
                t.dims
            ));
        }
    }
    if want > *budget {
        return Err(format!(
            "{want} bytes, past the bound of {MAX_EXTERNAL_BYTES} bytes of external data per model"
        ));
    }
    // the kind of file is checked before it is opened: opening a FIFO for reading blocks
    // until a writer comes (forever, for a hostile model), and a device never ends
    let kind = std::fs::metadata(&file).map_err(|e| format!("{location}: {e}"))?;
    if !kind.is_file() {
        return Err(format!(
            "{location} is not a regular file (a named pipe, device, socket or directory holds no tensor's bytes)"
        ));
    }
    let mut f = std::fs::File::open(&file).map_err(|e| format!("{location}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("{location}: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "{location} is not a regular file (it changed while read)"
        ));
    }
    if offset.checked_add(want).is_none_or(|end| end > meta.len()) {
        return Err(format!(
            "bytes {offset}..{} asked of {location}, which holds {}",
            offset.saturating_add(want),
            meta.len()
        ));
    }
    let n = usize::try_from(want).map_err(|_| format!("{want} bytes do not fit in memory"))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(n)
        .map_err(|_| format!("{want} bytes could not be allocated"))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("{location}: {e}"))?;
    f.take(want)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{location}: {e}"))?;
    if bytes.len() != n {
        return Err(format!("{location} ended early (it changed while read)"));
    }
    *budget -= want;
    Ok(bytes)
}

/// `location` resolved inside `dir`: relative, plain components only, and — after following
/// symbolic links — still inside `dir`.
fn inside(dir: &Path, location: &str) -> Result<PathBuf, String> {
    let rel = Path::new(location);
    if location.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!(
            "location {location:?} must be a relative path inside the model's directory (no `..`, no absolute path)"
        ));
    }
    let base = dir
        .canonicalize()
        .map_err(|e| format!("the model's directory: {e}"))?;
    let file = dir
        .join(rel)
        .canonicalize()
        .map_err(|e| format!("{location}: {e}"))?;
    if !file.starts_with(&base) {
        return Err(format!(
            "location {location:?} leads out of the model's directory (a symbolic link)"
        ));
    }
    Ok(file)
}
