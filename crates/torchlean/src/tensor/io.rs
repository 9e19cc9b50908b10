//! Named tensors in safetensors files (readable by the Python `safetensors` package and
//! PyTorch). Files are untrusted: the whole header is validated against the file's real size
//! by the `safetensors` crate before any tensor is built, only little-endian f32 is accepted,
//! and the file size is bounded before it is read.

use super::Tensor;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Largest safetensors file this runtime reads (8 GiB).
pub const MAX_FILE_BYTES: u64 = 8 << 30;

fn io_err(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{}: {what}: {e}", path.display()))
}

/// Reads every tensor of a safetensors file, in file order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, "cannot open", e))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(io_err(
            path,
            "file too large",
            format!("{} bytes > {MAX_FILE_BYTES}", meta.len()),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(path, "cannot read", e))?;
    parse_safetensors(path, &bytes)
}

/// Parses safetensors bytes (`path` names the source in errors).
pub fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| io_err(path, "not a valid safetensors file", format!("{e:?}")))?;
    let mut out = Vec::new();
    let mut entries = st.tensors();
    // file order: by data offset
    entries.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    for (name, view) in entries {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(io_err(
                path,
                &format!("tensor `{name}`"),
                format!("dtype {:?} is not supported (only F32)", view.dtype()),
            ));
        }
        let data: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let t = Tensor::from_vec(data, view.shape())
            .map_err(|e| io_err(path, &format!("tensor `{name}`"), e))?;
        out.push((name, t));
    }
    Ok(out)
}

/// Writes named tensors (f32, little-endian) atomically: a temporary file in the same
/// directory is written, flushed to disk, and renamed over `path`, then the directory is
/// synced; a crash leaves either the old file or the new one, never a torn one.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
                t.shape().to_vec(),
            )
        })
        .collect();
    let views = data
        .iter()
        .map(|(n, bytes, shape)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| io_err(path, "cannot encode", format!("{e:?}")))?;
    let bytes = safetensors::serialize(views, &metadata)
        .map_err(|e| io_err(path, "cannot encode", format!("{e:?}")))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| io_err(path, "invalid path", "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all(); // best effort: not every platform can sync a directory
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, "cannot write", e));
    }
    Ok(())
}
