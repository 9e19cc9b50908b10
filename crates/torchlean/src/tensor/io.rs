//! Named tensors in safetensors files (readable by the Python `safetensors` package and
//! PyTorch). Files are untrusted: the whole header is validated against the file's real size
//! by the `safetensors` crate before any tensor is built, F32 values are read as they are
//! and I64, I32 and BOOL ones as f32 (integers exactly up to 2^24, refused beyond), every
//! other dtype refused, and the file size is bounded before it is read (devices are refused, pipes read up to the
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
        e => io_err(path, "cannot read", e.reason()),
    })?;
    parse_safetensors(path, &bytes)
}

/// The elements of a stored tensor as f32: F32 as is; BOOL as 0/1 and I64/I32 as the same
/// integers, which f32 holds exactly up to 2^24 (a mask or token ids saved from PyTorch
/// without a cast). A larger integer, or another dtype, is an error naming the tensor: a
/// value is never rounded silently.
fn f32_elements(
    path: &Path,
    name: &str,
    dtype: safetensors::Dtype,
    bytes: &[u8],
) -> Result<Vec<f32>> {
    use safetensors::Dtype;
    let width = match dtype {
        Dtype::F32 | Dtype::I32 => 4,
        Dtype::I64 => 8,
        Dtype::BOOL => 1,
        other => {
            return Err(io_err(
                path,
                &format!("tensor `{name}`"),
                format!(
                    "dtype {other:?} is not supported (F32; BOOL, I64 and I32 are read as f32)"
                ),
            ))
        }
    };
    let mut data: Vec<f32> = crate::runtime::buffers::try_with_capacity(
        bytes.len() / width,
        &format!("tensor `{name}` of {}", path.display()),
    )?;
    let exact = |i: usize, v: i64| -> Result<f32> {
        if v.unsigned_abs() <= 1 << 24 {
            Ok(v as f32)
        } else {
            Err(io_err(
                path,
                &format!("tensor `{name}`"),
                format!("element {i} is {v}: integers are read as f32, exact only up to 2^24 in magnitude"),
            ))
        }
    };
    for (i, b) in bytes.chunks_exact(width).enumerate() {
        data.push(match dtype {
            Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Dtype::I32 => exact(i, i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)?,
            Dtype::I64 => exact(
                i,
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            )?,
            // BOOL: safetensors stores one byte, 0 or 1
            _ => match b[0] {
                0 => 0.0,
                1 => 1.0,
                v => {
                    return Err(io_err(
                        path,
                        &format!("tensor `{name}`"),
                        format!("element {i} of a BOOL tensor is the byte {v} (0 or 1 expected)"),
                    ))
                }
            },
        });
    }
    Ok(data)
}

/// The format a file that is not safetensors often is, named (or nothing).
fn mistaken_format(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(b"\x93NUMPY") {
        " (this is an .npy file: write the tensors with safetensors, e.g. `safetensors.numpy.save_file`)"
    } else if bytes.starts_with(b"PK\x03\x04") {
        " (this is a zip archive, e.g. an .npz or a torch.save file: write the tensors with safetensors)"
    } else if bytes.starts_with(&[0x1f, 0x8b]) {
        " (this is gzip-compressed: decompress it first)"
    } else if bytes.starts_with(&[0x08]) && bytes.get(1).is_some_and(|&b| b != 0) {
        // ONNX models are protobuf messages starting with field 1 (ir_version) as a varint
        " (this may be an ONNX model: pass it as the graph, not as values)"
    } else {
        ""
    }
}

/// What a safetensors parse error means, in words (the crate displays its variant's name:
/// `InvalidHeaderDeserialization`, `MetadataIncompleteBuffer`).
pub(crate) fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::InvalidHeader => "the header is not UTF-8 text".into(),
        E::InvalidHeaderStart => "the header does not start with `{` (a JSON object)".into(),
        E::InvalidHeaderDeserialization | E::JsonError(_) => {
            "the header is not a JSON object of tensor entries (dtype, shape, data_offsets)".into()
        }
        E::HeaderTooLarge => "the declared header length is above the format's 100 MB".into(),
        E::HeaderTooSmall => "the file is shorter than the 8-byte header length".into(),
        E::InvalidHeaderLength => {
            "the declared header length runs past the end of the file".into()
        }
        E::TensorInvalidInfo => {
            "a tensor's byte range does not match its shape and dtype".into()
        }
        E::InvalidOffset(name) => format!(
            "tensor `{name}`'s data_offsets are invalid (overlapping, out of order, or past the data)"
        ),
        E::MetadataIncompleteBuffer => {
            "the tensors' byte ranges do not cover the data exactly (bytes missing or left over)"
                .into()
        }
        E::ValidationOverflow => "a tensor's shape overflows the size arithmetic".into(),
        other => format!("{other:?}"),
    }
}

/// Parses safetensors bytes (`path` names the source in errors).
pub fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| {
        io_err(
            path,
            "not a valid safetensors file",
            format!("{}{}", describe(&e), mistaken_format(bytes)),
        )
    })?;
    let mut out = Vec::new();
    let mut entries = st.tensors();
    // file order: by data offset
    entries.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    for (name, view) in entries {
        let data = f32_elements(path, &name, view.dtype(), view.data())?;
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
    let bytes =
        safetensors_bytes(tensors, metadata).map_err(|e| io_err(path, "cannot encode", e))?;
    crate::files::write_atomic(path, &bytes).map_err(|e| io_err(path, "cannot write", e))
}

/// The bytes [`write_safetensors`] writes (for a caller that writes several files as one:
/// `files::write_atomic_all`).
pub fn safetensors_bytes(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> std::result::Result<Vec<u8>, String> {
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
    encode_safetensors(&views, &metadata)
}

#[cfg(test)]
mod tests {
    use super::parse_safetensors;
    use std::path::Path;

    /// A safetensors file of one tensor `t` with `dtype`, `shape` and raw little-endian bytes.
    fn file(dtype: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
        let header = format!(
            r#"{{"t":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[0,{}]}}}}"#,
            data.len()
        );
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn bool_and_integer_tensors_read_as_exact_f32() {
        let read = |bytes: Vec<u8>| parse_safetensors(Path::new("t"), &bytes);
        let b = read(file("BOOL", &[4], &[1, 0, 0, 1])).unwrap();
        assert_eq!(b[0].1.to_vec(), vec![1.0, 0.0, 0.0, 1.0]);
        let ints: Vec<u8> = [-3i64, 16_777_216, 7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            read(file("I64", &[3], &ints)).unwrap()[0].1.to_vec(),
            vec![-3.0, 16_777_216.0, 7.0]
        );
        let ints: Vec<u8> = [5i32, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            read(file("I32", &[2], &ints)).unwrap()[0].1.to_vec(),
            vec![5.0, -9.0]
        );
        // never rounded: 2^24 + 1 has no f32; a BOOL byte other than 0/1 is malformed
        let big: Vec<u8> = (16_777_217i64).to_le_bytes().to_vec();
        let e = read(file("I64", &[1], &big)).unwrap_err().to_string();
        assert!(e.contains("exact only up to 2^24"), "{e}");
        let e = read(file("BOOL", &[2], &[1, 2])).unwrap_err().to_string();
        assert!(e.contains("the byte 2"), "{e}");
        let e = read(file("F16", &[1], &[0, 0])).unwrap_err().to_string();
        assert!(e.contains("F16 is not supported"), "{e}");
    }
}
