//! Named tensors in safetensors files (readable by the Python `safetensors` package and
//! PyTorch). Files are untrusted: the whole header is validated against the file's real size
//! by the `safetensors` crate before any tensor is built, only little-endian f32 is accepted,
//! and the file size is bounded before it is read (devices are refused, pipes read up to the
//! bound: [`crate::files::read_capped`]).

use super::Tensor;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Largest safetensors file this runtime reads (8 GiB).
pub const MAX_FILE_BYTES: u64 = 8 << 30;

fn io_err(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{}: {what}: {e}", path.display()))
}

/// Reads every tensor of a safetensors file, in file order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let bytes = crate::files::read_capped(path, MAX_FILE_BYTES).map_err(|e| match e {
        crate::files::FileError::OutOfMemory { bytes } => Error::OutOfMemory {
            what: format!("reading {}", path.display()),
            bytes,
        },
        e => io_err(path, "cannot read", e),
    })?;
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
        let mut data: Vec<f32> = crate::runtime::buffers::try_with_capacity(
            view.data().len() / 4,
            &format!("tensor `{name}` of {}", path.display()),
        )?;
        data.extend(
            view.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        let t = Tensor::from_vec(data, view.shape())
            .map_err(|e| io_err(path, &format!("tensor `{name}`"), e))?;
        out.push((name, t));
    }
    Ok(out)
}

/// The bytes of a safetensors file holding `tensors` (name, shape, little-endian f32 bytes)
/// and `metadata`, byte for byte the same for the same tensors and metadata: tensors are laid
/// out in name order and the header (including `__metadata__`) is written with sorted keys
/// (the `safetensors` crate takes the metadata as a `HashMap` and writes it in that map's
/// random order, so two saves of one model differed). Duplicate names are refused.
pub(crate) fn encode_safetensors(
    tensors: &[(&str, &[usize], &[u8])],
    metadata: &BTreeMap<String, String>,
) -> std::result::Result<Vec<u8>, String> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| tensors[a].0.cmp(tensors[b].0));
    let mut header: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__",
            serde_json::to_value(metadata).map_err(|e| e.to_string())?,
        );
    }
    let mut offset = 0usize;
    for &i in &order {
        let (name, shape, bytes) = tensors[i];
        if name == "__metadata__" {
            return Err("a tensor may not be named `__metadata__`".into());
        }
        let numel = crate::spec::checked_numel(shape)
            .ok_or_else(|| format!("tensor `{name}`: shape {shape:?} is too large"))?;
        if numel.checked_mul(4) != Some(bytes.len()) {
            return Err(format!(
                "tensor `{name}`: {} bytes for shape {shape:?}",
                bytes.len()
            ));
        }
        let end = offset + bytes.len();
        let info =
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]});
        if header.insert(name, info).is_some() {
            return Err(format!("two tensors are named `{name}`"));
        }
        offset = end;
    }
    let mut head = serde_json::to_string(&header)
        .map_err(|e| e.to_string())?
        .into_bytes();
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut out = Vec::new();
    out.try_reserve_exact(8 + head.len() + offset)
        .map_err(|_| format!("out of memory: {} bytes", 8 + head.len() + offset))?;
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for &i in &order {
        out.extend_from_slice(tensors[i].2);
    }
    Ok(out)
}

/// Writes named tensors (f32, little-endian) atomically ([`crate::files::write_atomic`]): a
/// temporary file in the same directory is written, flushed to disk, and renamed over
/// `path`, then the directory is synced; a crash leaves either the old file or the new one,
/// never a torn one. The bytes depend only on the tensors and the metadata
/// ([`encode_safetensors`]).
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let data: Vec<(&str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.as_str(),
                t.shape().to_vec(),
                t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views: Vec<(&str, &[usize], &[u8])> = data
        .iter()
        .map(|(n, s, b)| (*n, s.as_slice(), b.as_slice()))
        .collect();
    let metadata: BTreeMap<String, String> = metadata.unwrap_or_default().into_iter().collect();
    let bytes =
        encode_safetensors(&views, &metadata).map_err(|e| io_err(path, "cannot encode", e))?;
    crate::files::write_atomic(path, &bytes).map_err(|e| io_err(path, "cannot write", e))
}
