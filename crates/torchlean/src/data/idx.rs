//! IDX files (the MNIST format): magic `00 00 <type> <ndims>`, `ndims` big-endian u32
//! sizes, then big-endian values of type u8 (0x08), i8 (0x09), i16 (0x0B), i32 (0x0C),
//! f32 (0x0D) or f64 (0x0E). Sizes must account for every byte of the file exactly.

use super::dataset::Dataset;
use super::error::DataError;
use super::file;
use crate::error::Result;
use crate::tensor::Tensor;
use std::path::Path;

const FORMAT: &str = "IDX";
/// More dimensions than any real IDX file has; a header claiming more is malformed.
const MAX_DIMS: usize = 16;

fn elem_size(code: u8) -> Option<usize> {
    match code {
        0x08 | 0x09 => Some(1),
        0x0B => Some(2),
        0x0C | 0x0D => Some(4),
        0x0E => Some(8),
        _ => None,
    }
}

/// The value as written, at f64 (every IDX type is exact there).
fn decode_exact(code: u8, b: &[u8]) -> f64 {
    match code {
        0x08 => b[0] as f64,
        0x09 => b[0] as i8 as f64,
        0x0B => i16::from_be_bytes([b[0], b[1]]) as f64,
        0x0C => i32::from_be_bytes([b[0], b[1], b[2], b[3]]) as f64,
        0x0D => f32::from_be_bytes([b[0], b[1], b[2], b[3]]) as f64,
        _ => f64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

/// An IDX file's values (as f32) with its element type code.
struct Parsed {
    tensor: Tensor,
    code: u8,
}

/// Loads an IDX file as an f32 tensor of its declared shape.
pub fn load_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    load(path.as_ref(), false).map(|p| p.tensor)
}

fn load(path: &Path, class_indices: bool) -> Result<Parsed> {
    let bytes = file::read_bytes(path, FORMAT)?;
    parse(&bytes, &file::name(path), class_indices)
}

/// Parses the bytes of an IDX file (`name` is used in messages). Integer values beyond 2^24
/// (i32 files) are refused, not rounded to the nearest f32 (as safetensors' integer tensors).
pub fn parse_idx(bytes: &[u8], name: &str) -> Result<Tensor> {
    parse(bytes, name, false).map(|p| p.tensor)
}

/// [`parse_idx`]; with `class_indices`, every value must be a non-negative integer as written
/// (an f64 label 1.999999999 rounded to the f32 2 and was read as class 2).
fn parse(bytes: &[u8], name: &str, class_indices: bool) -> Result<Parsed> {
    let bad =
        |reason: String| -> crate::Error { DataError::malformed(name, FORMAT, reason).into() };
    if bytes.len() < 4 {
        return Err(bad(format!(
            "file of {} bytes is too short for the 4-byte magic",
            bytes.len()
        )));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        // name the formats this is often mistaken for
        let looks_like = if bytes.starts_with(b"\x93NUMPY") {
            " (this is an .npy file, not IDX)"
        } else if bytes.starts_with(&[0x1f, 0x8b]) {
            " (this is gzip-compressed: decompress it first, e.g. `gunzip`)"
        } else if bytes[..4]
            .iter()
            .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace())
            || bytes.starts_with(b"\xef\xbb\xbf")
        {
            " (this looks like text: a CSV file is read as CSV only when its name ends in `.csv`)"
        } else {
            ""
        };
        return Err(bad(format!(
            "bad magic {:02x} {:02x} {:02x} {:02x}: the first two bytes must be zero{looks_like}",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    let code = bytes[2];
    let size =
        elem_size(code).ok_or_else(|| bad(format!("unknown element type code 0x{code:02x}")))?;
    let ndims = bytes[3] as usize;
    if ndims == 0 || ndims > MAX_DIMS {
        return Err(bad(format!(
            "number of dimensions {ndims} must be in 1..={MAX_DIMS}"
        )));
    }
    let data_start = 4 + 4 * ndims;
    if bytes.len() < data_start {
        return Err(bad(format!(
            "truncated header: {ndims} dimensions need {data_start} bytes, the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = bytes[4..data_start]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let available = bytes.len() - data_start;
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n.checked_mul(size).is_some_and(|b| b == available))
        .ok_or_else(|| {
            bad(format!(
                "dimensions {dims:?} of {size}-byte values do not match the {available} data bytes in the file"
            ))
        })?;
    let mut data: Vec<f32> = Vec::new();
    data.try_reserve_exact(available / size).map_err(|_| {
        crate::Error::from(DataError::OutOfMemory {
            path: name.to_string(),
            format: FORMAT,
            bytes: (available / size * 4) as u64,
        })
    })?;
    const EXACT: f64 = super::finite::EXACT_F32_INTEGER;
    for (i, b) in bytes[data_start..].chunks_exact(size).enumerate() {
        let v = decode_exact(code, b);
        if code == 0x0C && v.abs() > EXACT {
            return Err(bad(format!(
                "value {v} at index {i} (byte {}) is an integer beyond 2^24, which float32 cannot hold exactly; refusing to round it",
                data_start + i * size
            )));
        }
        if class_indices && !(v >= 0.0 && v.fract() == 0.0 && v < EXACT) {
            return Err(bad(format!(
                "label {v} at index {i} is not a class index (a non-negative integer below 2^24)"
            )));
        }
        data.push(v as f32);
    }
    super::finite::refuse_non_finite(&data, data_start, size).map_err(bad)?;
    Ok(Parsed {
        tensor: Tensor::from_vec(data, &dims)?,
        code,
    })
}

/// Writes `tensor` as an IDX file of type u8 (values rounded and clamped to 0..=255) or f32.
pub fn write_idx(path: impl AsRef<Path>, tensor: &Tensor, as_u8: bool) -> Result<()> {
    let path = path.as_ref();
    let mut out = vec![0u8, 0, if as_u8 { 0x08 } else { 0x0D }];
    let rank = u8::try_from(tensor.rank())
        .ok()
        .filter(|&r| r >= 1 && r as usize <= MAX_DIMS)
        .ok_or_else(|| {
            DataError::Invalid(format!(
                "IDX needs rank 1..={MAX_DIMS}, got {}",
                tensor.rank()
            ))
        })?;
    out.push(rank);
    for &d in tensor.shape() {
        let d = u32::try_from(d)
            .map_err(|_| DataError::Invalid(format!("IDX dimension {d} exceeds u32")))?;
        out.extend_from_slice(&d.to_be_bytes());
    }
    for &v in tensor.data().iter() {
        if as_u8 {
            out.push(v.round().clamp(0.0, 255.0) as u8);
        } else {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    std::fs::write(path, out).map_err(|e| {
        DataError::Io {
            path: file::name(path),
            format: FORMAT,
            message: e.to_string(),
        }
        .into()
    })
}

/// Loads MNIST-style images [N, H, W] and labels [N] as a dataset with features
/// [N, 1, H, W] and targets [N]. With `normalize`, u8 pixels (MNIST's) are divided by 255;
/// images of any other type are read as they are (an f32 file already in [0, 1] was divided
/// again). Labels must be class indices as written (non-negative integers below 2^24).
pub fn load_mnist(
    images: impl AsRef<Path>,
    labels: impl AsRef<Path>,
    normalize: bool,
) -> Result<Dataset> {
    let (ip, lp) = (images.as_ref(), labels.as_ref());
    let Parsed { tensor: x, code } = load(ip, false)?;
    let y = load(lp, true)?.tensor;
    if x.rank() != 3 {
        return Err(DataError::malformed(
            &file::name(ip),
            FORMAT,
            format!("images must be [N, H, W], got {:?}", x.shape()),
        )
        .into());
    }
    if y.rank() != 1 || y.shape()[0] != x.shape()[0] {
        return Err(DataError::malformed(
            &file::name(lp),
            FORMAT,
            format!("labels must be [{}], got {:?}", x.shape()[0], y.shape()),
        )
        .into());
    }
    let (n, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if h == 0 || w == 0 {
        return Err(DataError::malformed(
            &file::name(ip),
            FORMAT,
            format!(
                "images of {h}×{w} pixels ({:?}): an image needs at least one",
                x.shape()
            ),
        )
        .into());
    }
    // divided, not multiplied by f32(1/255): k/255 correctly rounded, as numpy's `x / 255`
    // and torchvision's `ToTensor` give (the product is one ulp off for 126 of the 256 values)
    let divisor = if normalize && code == 0x08 {
        255.0
    } else {
        1.0
    };
    let data: Vec<f32> = x.data().iter().map(|v| v / divisor).collect();
    Dataset::new(&Tensor::from_vec(data, &[n, 1, h, w])?, &y)
}
