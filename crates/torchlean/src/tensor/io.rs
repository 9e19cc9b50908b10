//! Named tensors in safetensors files (readable by the Python `safetensors` package and
//! PyTorch). Files are untrusted: the whole header is validated against the file's real size
//! by the `safetensors` crate before any tensor is built, F32 values are read as they are
//! and F16, BF16, F64, the integer and the boolean dtypes as the same values in f32 (refused
//! where f32 does not hold a value exactly: [`f32_elements`]), every other dtype (F8) refused, and the file size is bounded before it is read (devices are refused, pipes read up to the
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

/// The elements of a stored tensor as f32, each exactly the stored value: F32 as is; F16 and
/// BF16 widened (exact); F64 when the value is a float32 number (a `.double()` of float32
/// data, or an F64 output `run-graph` wrote), refused otherwise; BOOL as 0/1 and the integer
/// types (I8–I64, U8–U64) as the same integers, which f32 holds exactly up to 2^24 (a mask,
/// token ids or uint8 pixels saved from PyTorch without a cast). A value f32 does not hold,
/// or another dtype, is an error naming the tensor and the element: a value is never rounded
/// silently.
fn f32_elements(
    path: &Path,
    name: &str,
    dtype: safetensors::Dtype,
    bytes: &[u8],
) -> Result<Vec<f32>> {
    use safetensors::Dtype;
    let bad = |why: String| io_err(path, &format!("tensor `{name}`"), why);
    let width = match dtype {
        Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
        Dtype::F16 | Dtype::BF16 | Dtype::I16 | Dtype::U16 => 2,
        Dtype::I8 | Dtype::U8 | Dtype::BOOL => 1,
        other => {
            return Err(bad(format!(
                "dtype {other:?} is not supported (F32; F16, BF16, F64 holding float32 numbers, BOOL and the integer types are read as the same values in f32)"
            )))
        }
    };
    let mut data: Vec<f32> = crate::runtime::buffers::try_with_capacity(
        bytes.len() / width,
        &format!("tensor `{name}` of {}", path.display()),
    )?;
    let integer = |i: usize, v: i128| -> Result<f32> {
        if v.unsigned_abs() <= 1 << 24 {
            Ok(v as f32)
        } else {
            Err(bad(format!(
                "element {i} is {v}: integers are read as f32, exact only up to 2^24 in magnitude"
            )))
        }
    };
    for (i, b) in bytes.chunks_exact(width).enumerate() {
        let mut x = [0u8; 8];
        x[..width].copy_from_slice(b);
        let (b2, b4) = ([x[0], x[1]], [x[0], x[1], x[2], x[3]]);
        data.push(match dtype {
            Dtype::F32 => f32::from_le_bytes(b4),
            Dtype::F16 => half::f16::from_le_bytes(b2).to_f32(),
            Dtype::BF16 => half::bf16::from_le_bytes(b2).to_f32(),
            Dtype::F64 => {
                let v = f64::from_le_bytes(x);
                let narrowed = v as f32;
                if narrowed as f64 != v && !v.is_nan() {
                    return Err(bad(format!(
                        "element {i} of an F64 tensor is {v:e}, which float32 does not hold exactly; torchlean computes in float32 and refuses to round it (store the tensor as float32: `t.float()`)"
                    )));
                }
                narrowed
            }
            Dtype::I64 => integer(i, i64::from_le_bytes(x) as i128)?,
            Dtype::U64 => integer(i, u64::from_le_bytes(x) as i128)?,
            Dtype::I32 => integer(i, i32::from_le_bytes(b4) as i128)?,
            Dtype::U32 => integer(i, u32::from_le_bytes(b4) as i128)?,
            Dtype::I16 => i16::from_le_bytes(b2) as f32,
            Dtype::U16 => u16::from_le_bytes(b2) as f32,
            Dtype::I8 => x[0] as i8 as f32,
            Dtype::U8 => x[0] as f32,
            // BOOL: safetensors stores one byte, 0 or 1
            _ => match x[0] {
                0 => 0.0,
                1 => 1.0,
                v => {
                    return Err(bad(format!(
                        "element {i} of a BOOL tensor is the byte {v} (0 or 1 expected)"
                    )))
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
    let typed: Vec<(&str, StoredDtype, &[usize], &[u8])> = tensors
        .iter()
        .map(|&(n, s, b)| (n, StoredDtype::F32, s, b))
        .collect();
    encode_typed(&typed, metadata)
}

/// [`encode_safetensors`] with each tensor's stored element type (its bytes already in it).
fn encode_typed(
    tensors: &[(&str, StoredDtype, &[usize], &[u8])],
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
        let (name, dtype, shape, bytes) = tensors[i];
        if name == "__metadata__" {
            return Err("a tensor may not be named `__metadata__`".into());
        }
        let numel = crate::spec::checked_numel(shape)
            .ok_or_else(|| format!("tensor `{name}`: shape {shape:?} is too large"))?;
        if numel.checked_mul(dtype.width()) != Some(bytes.len()) {
            return Err(format!(
                "tensor `{name}`: {} bytes for shape {shape:?} of {}",
                bytes.len(),
                dtype.label()
            ));
        }
        let end = offset + bytes.len();
        let info = serde_json::json!({"dtype": dtype.label(), "shape": shape, "data_offsets": [offset, end]});
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
        out.extend_from_slice(tensors[i].3);
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
    let typed: Vec<(String, Tensor, StoredDtype)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.clone(), StoredDtype::F32))
        .collect();
    safetensors_bytes_as(&typed, metadata)
}

/// The element type a tensor is written in. torchlean computes in f32; a value a model
/// declares as an integer, a boolean or a float64 (an ONNX graph's `argmax` indices, a
/// comparison, a `Cast`) is written in that type, as PyTorch and onnxruntime return it, when
/// every element is exactly a value of the type ([`stored_bytes`]) — never rounded or
/// wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredDtype {
    F32,
    F64,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    Bool,
}

impl StoredDtype {
    /// The safetensors dtype label.
    pub fn label(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F64 => "F64",
            StoredDtype::I64 => "I64",
            StoredDtype::I32 => "I32",
            StoredDtype::I16 => "I16",
            StoredDtype::I8 => "I8",
            StoredDtype::U64 => "U64",
            StoredDtype::U32 => "U32",
            StoredDtype::U16 => "U16",
            StoredDtype::U8 => "U8",
            StoredDtype::Bool => "BOOL",
        }
    }

    /// Bytes per element.
    pub fn width(self) -> usize {
        match self {
            StoredDtype::F64 | StoredDtype::I64 | StoredDtype::U64 => 8,
            StoredDtype::F32 | StoredDtype::I32 | StoredDtype::U32 => 4,
            StoredDtype::I16 | StoredDtype::U16 => 2,
            StoredDtype::I8 | StoredDtype::U8 | StoredDtype::Bool => 1,
        }
    }

    /// The integer range of an integer type, as f64 bounds `[lo, hi)` (every bound is a
    /// power of two, exact in f64); `None` for the float and boolean types.
    fn integer_range(self) -> Option<(f64, f64)> {
        let two = |e: i32| 2f64.powi(e);
        match self {
            StoredDtype::I64 => Some((-two(63), two(63))),
            StoredDtype::I32 => Some((-two(31), two(31))),
            StoredDtype::I16 => Some((-two(15), two(15))),
            StoredDtype::I8 => Some((-two(7), two(7))),
            StoredDtype::U64 => Some((0.0, two(64))),
            StoredDtype::U32 => Some((0.0, two(32))),
            StoredDtype::U16 => Some((0.0, two(16))),
            StoredDtype::U8 => Some((0.0, two(8))),
            _ => None,
        }
    }
}

/// The little-endian bytes of `values` stored as `dtype`. F32 is as is and F64 the exact
/// widening; an integer type takes each value only if it is a finite integer within the
/// type's range, BOOL only 0 or 1 — anything else is an error naming the element, never a
/// rounded, wrapped or truncated value.
pub fn stored_bytes(values: &[f32], dtype: StoredDtype) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(values.len() * dtype.width())
        .map_err(|_| format!("out of memory: {} bytes", values.len() * dtype.width()))?;
    for (i, &v) in values.iter().enumerate() {
        let refuse = |what: &str| {
            format!(
                "element {i} is {v:e}, which is not {what} (torchlean computes in float32 and writes a value as {} only when it is exactly one)",
                dtype.label()
            )
        };
        match dtype {
            StoredDtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            StoredDtype::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
            StoredDtype::Bool => match v {
                // -0.0 == 0.0: a negative zero is the boolean false
                0.0 => out.push(0),
                1.0 => out.push(1),
                _ => return Err(refuse("0 or 1")),
            },
            _ => {
                // invariant: every type but F32, F64 and BOOL has a range (handled above)
                let (lo, hi) = dtype.integer_range().unwrap_or((0.0, 0.0));
                let x = v as f64;
                if !x.is_finite() || x.fract() != 0.0 {
                    return Err(refuse("an integer"));
                }
                if x < lo || x >= hi {
                    return Err(refuse(&format!("within the type's range [{lo:e}, {hi:e})")));
                }
                let bytes = if lo < 0.0 {
                    (x as i64).to_le_bytes()
                } else {
                    (x as u64).to_le_bytes()
                };
                out.extend_from_slice(&bytes[..dtype.width()]);
            }
        }
    }
    Ok(out)
}

/// [`safetensors_bytes`] with each tensor's element type ([`stored_bytes`]: a value the type
/// does not hold exactly is an error naming the tensor and the element).
pub fn safetensors_bytes_as(
    tensors: &[(String, Tensor, StoredDtype)],
    metadata: Option<HashMap<String, String>>,
) -> std::result::Result<Vec<u8>, String> {
    let data: Vec<(&str, StoredDtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t, d)| {
            let bytes = stored_bytes(&t.data(), *d).map_err(|e| format!("tensor `{n}`: {e}"))?;
            Ok((n.as_str(), *d, t.shape().to_vec(), bytes))
        })
        .collect::<std::result::Result<_, String>>()?;
    let views: Vec<(&str, StoredDtype, &[usize], &[u8])> = data
        .iter()
        .map(|(n, d, s, b)| (*n, *d, s.as_slice(), b.as_slice()))
        .collect();
    let metadata: BTreeMap<String, String> = metadata.unwrap_or_default().into_iter().collect();
    encode_typed(&views, &metadata)
}

/// [`write_safetensors`] with each tensor's element type ([`safetensors_bytes_as`]).
pub fn write_safetensors_as(
    path: &Path,
    tensors: &[(String, Tensor, StoredDtype)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let bytes =
        safetensors_bytes_as(tensors, metadata).map_err(|e| io_err(path, "cannot encode", e))?;
    crate::files::write_atomic(path, &bytes).map_err(|e| io_err(path, "cannot write", e))
}

#[cfg(test)]
mod tests {
    use super::{parse_safetensors, stored_bytes, StoredDtype as D};
    use std::path::Path;

    /// Integer and boolean types take exactly their values (two's complement, little-endian,
    /// checked against Rust's own integer encodings) and refuse everything else — a fraction,
    /// NaN, an infinity, a value one past the range — naming the element; F64 widens exactly.
    #[test]
    fn stored_types_take_exact_values_and_refuse_the_rest() {
        let le = |v: Vec<Vec<u8>>| v.concat();
        assert_eq!(
            stored_bytes(&[-128.0, 127.0, -1.0], D::I8).unwrap(),
            le(vec![
                (-128i8).to_le_bytes().to_vec(),
                127i8.to_le_bytes().to_vec(),
                (-1i8).to_le_bytes().to_vec()
            ])
        );
        assert_eq!(stored_bytes(&[255.0, -0.0], D::U8).unwrap(), vec![255, 0]);
        assert_eq!(
            stored_bytes(&[-32768.0, 65535.0], D::I16).map_err(|e| e.contains("element 1")),
            Err(true)
        );
        assert_eq!(
            stored_bytes(&[-2f32.powi(63), 2f32.powi(62)], D::I64).unwrap(),
            le(vec![
                i64::MIN.to_le_bytes().to_vec(),
                (1i64 << 62).to_le_bytes().to_vec()
            ])
        );
        assert_eq!(
            stored_bytes(&[2f32.powi(31) - 128.0, -2f32.powi(31)], D::I32).unwrap(),
            le(vec![
                (i32::MAX - 127).to_le_bytes().to_vec(),
                i32::MIN.to_le_bytes().to_vec()
            ])
        );
        assert_eq!(
            stored_bytes(&[2f32.powi(32) - 256.0], D::U32).unwrap(),
            (u32::MAX - 255).to_le_bytes().to_vec()
        );
        assert_eq!(
            stored_bytes(&[1.0, 0.0, -0.0], D::Bool).unwrap(),
            vec![1, 0, 0]
        );
        assert_eq!(
            stored_bytes(&[0.1, -3.25e38], D::F64).unwrap(),
            le(vec![
                (0.1f32 as f64).to_le_bytes().to_vec(),
                (-3.25e38f32 as f64).to_le_bytes().to_vec()
            ])
        );
        for (values, dtype, what) in [
            (vec![1.0, 2.5], D::I64, "element 1 is 2.5e0"),
            (vec![f32::NAN], D::I32, "not an integer"),
            (vec![f32::INFINITY], D::I64, "not an integer"),
            (vec![2f32.powi(63)], D::I64, "range"),
            (vec![2f32.powi(31)], D::I32, "range"),
            (vec![256.0], D::U8, "range"),
            (vec![-1.0], D::U64, "range"),
            (vec![128.0], D::I8, "range"),
            (vec![0.0, 2.0], D::Bool, "0 or 1"),
            (vec![f32::NAN], D::Bool, "0 or 1"),
        ] {
            let e = stored_bytes(&values, dtype).unwrap_err();
            assert!(
                e.contains(what) && e.contains(dtype.label()),
                "{dtype:?} {values:?}: {e}"
            );
        }
    }

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
        let e = read(file("F8_E4M3", &[1], &[0])).unwrap_err().to_string();
        assert!(e.contains("F8_E4M3 is not supported"), "{e}");
    }

    /// The other float and integer dtypes are read as the same values (checked against the
    /// `half` crate's and Rust's own encodings); an F64 value float32 does not hold is
    /// refused, not rounded, and so is an integer beyond 2^24.
    #[test]
    fn wider_and_narrower_dtypes_read_exactly_or_not_at_all() {
        let read = |bytes: Vec<u8>| parse_safetensors(Path::new("t"), &bytes);
        let le = |v: &[&[u8]]| v.concat();
        let h = [
            half::f16::from_f32(-1.5),
            half::f16::MAX,
            half::f16::MIN_POSITIVE_SUBNORMAL,
        ];
        let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        let want: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        assert_eq!(read(file("F16", &[3], &bytes)).unwrap()[0].1.to_vec(), want);
        let b = [
            half::bf16::from_f32(3.0e38),
            half::bf16::from_f32(-0.0078125),
        ];
        let bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let want: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            read(file("BF16", &[2], &bytes)).unwrap()[0].1.to_vec(),
            want
        );
        let exact = [0.1f32 as f64, -1e30f32 as f64, f64::INFINITY];
        let bytes: Vec<u8> = exact.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = read(file("F64", &[3], &bytes)).unwrap()[0].1.to_vec();
        assert_eq!(got, vec![0.1f32, -1e30, f32::INFINITY]);
        let nan = read(file("F64", &[1], &f64::NAN.to_le_bytes())).unwrap()[0]
            .1
            .to_vec();
        assert!(nan[0].is_nan());
        let e = read(file(
            "F64",
            &[2],
            &le(&[&1.0f64.to_le_bytes(), &0.1f64.to_le_bytes()]),
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("element 1") && e.contains("does not hold exactly"),
            "{e}"
        );
        let ints = le(&[&(-7i8).to_le_bytes(), &[200u8]]);
        assert_eq!(
            read(file("I8", &[1], &ints[..1])).unwrap()[0].1.to_vec(),
            vec![-7.0]
        );
        assert_eq!(
            read(file("U8", &[1], &ints[1..])).unwrap()[0].1.to_vec(),
            vec![200.0]
        );
        let b16 = le(&[&(-32768i16).to_le_bytes(), &65535u16.to_le_bytes()]);
        assert_eq!(
            read(file("I16", &[1], &b16[..2])).unwrap()[0].1.to_vec(),
            vec![-32768.0]
        );
        assert_eq!(
            read(file("U16", &[1], &b16[2..])).unwrap()[0].1.to_vec(),
            vec![65535.0]
        );
        let u = le(&[
            &(1u32 << 24).to_le_bytes(),
            &((1u32 << 24) + 1).to_le_bytes(),
        ]);
        assert_eq!(
            read(file("U32", &[1], &u[..4])).unwrap()[0].1.to_vec(),
            vec![16_777_216.0]
        );
        assert!(read(file("U32", &[1], &u[4..])).is_err());
        let e = read(file("U64", &[1], &u64::MAX.to_le_bytes()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2^24") && e.contains(&u64::MAX.to_string()),
            "{e}"
        );
    }
}
