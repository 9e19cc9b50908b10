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

fn decode(code: u8, b: &[u8]) -> f32 {
    match code {
        0x08 => b[0] as f32,
        0x09 => b[0] as i8 as f32,
        0x0B => i16::from_be_bytes([b[0], b[1]]) as f32,
        0x0C => i32::from_be_bytes([b[0], b[1], b[2], b[3]]) as f32,
        0x0D => f32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        _ => f64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32,
    }
}

/// Loads an IDX file as an f32 tensor of its declared shape.
pub fn load_idx(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = file::read_bytes(path, FORMAT)?;
    parse_idx(&bytes, &file::name(path))
}

/// Parses the bytes of an IDX file (`name` is used in messages).
pub fn parse_idx(bytes: &[u8], name: &str) -> Result<Tensor> {
    let bad =
        |reason: String| -> crate::Error { DataError::malformed(name, FORMAT, reason).into() };
    if bytes.len() < 4 {
        return Err(bad(format!(
            "file of {} bytes is too short for the 4-byte magic",
            bytes.len()
        )));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "bad magic {:02x} {:02x} {:02x} {:02x}: the first two bytes must be zero",
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
    let data: Vec<f32> = bytes[data_start..]
        .chunks_exact(size)
        .map(|b| decode(code, b))
        .collect();
    super::finite::refuse_non_finite(&data, data_start, size).map_err(bad)?;
    Tensor::from_vec(data, &dims)
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
/// [N, 1, H, W] (divided by 255 when `normalize`) and targets [N].
pub fn load_mnist(
    images: impl AsRef<Path>,
    labels: impl AsRef<Path>,
    normalize: bool,
) -> Result<Dataset> {
    let (ip, lp) = (images.as_ref(), labels.as_ref());
    let x = load_idx(ip)?;
    let y = load_idx(lp)?;
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
    let scale = if normalize { 1.0 / 255.0 } else { 1.0 };
    let data: Vec<f32> = x.data().iter().map(|v| v * scale).collect();
    Dataset::new(&Tensor::from_vec(data, &[n, 1, h, w])?, &y)
}
