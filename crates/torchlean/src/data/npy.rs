//! NumPy `.npy` files (format versions 1.0, 2.0 and 3.0), read as f32 tensors the way
//! `numpy.load(f).astype(np.float32)` reads them: floats `f2`, `f4`, `f8`, signed integers
//! `i1`–`i8`, unsigned `u1`–`u8` and booleans `b1`, in either byte order (`<`, `>`, `=` or
//! `|`, and no mark: native, little-endian here), in C or Fortran order (`np.save(x.T)`
//! writes a Fortran-ordered file; its values are put back in C order). Integers beyond 2^24
//! are refused rather than rounded. And an f32 writer.
//!
//! The header is parsed strictly (a Python dict literal with exactly the keys `descr`,
//! `fortran_order`, `shape`; `shape` a tuple, `(3,)` — `(3)` is the integer 3 in Python);
//! the declared size must equal the bytes after the header before anything is allocated for
//! the values. Versions other than 1.0, 2.0 and 3.0 are refused (1.1 and 2.5 were read).

use super::dataset::Dataset;
use super::error::DataError;
use super::file;
use crate::error::Result;
use crate::tensor::Tensor;
use std::path::Path;

const FORMAT: &str = "NPY";
const MAGIC: &[u8] = b"\x93NUMPY";

/// Element kinds the reader accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    Uint,
    Bool,
}

/// An element type: kind, size in bytes, byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dtype {
    kind: Kind,
    size: usize,
    big_endian: bool,
}

impl Dtype {
    fn parse(descr: &str) -> std::result::Result<Dtype, String> {
        let unsupported = || {
            format!(
                "dtype `{descr}` is not supported (expected a float f2/f4/f8, an integer \
                 i1/i2/i4/i8/u1/u2/u4/u8 or a boolean b1, with a byte order <, >, = or |)"
            )
        };
        let (big_endian, code) = match descr.as_bytes().first() {
            Some(b'<' | b'=' | b'|') => (false, &descr[1..]),
            Some(b'>') => (true, &descr[1..]),
            _ => (false, descr),
        };
        let (kind, size) = match code {
            "f2" => (Kind::Float, 2),
            "f4" => (Kind::Float, 4),
            "f8" => (Kind::Float, 8),
            "i1" => (Kind::Int, 1),
            "i2" => (Kind::Int, 2),
            "i4" => (Kind::Int, 4),
            "i8" => (Kind::Int, 8),
            "u1" => (Kind::Uint, 1),
            "u2" => (Kind::Uint, 2),
            "u4" => (Kind::Uint, 4),
            "u8" => (Kind::Uint, 8),
            "b1" => (Kind::Bool, 1),
            _ => return Err(unsupported()),
        };
        Ok(Dtype {
            kind,
            size,
            big_endian,
        })
    }

    fn is_integer(self) -> bool {
        self.kind != Kind::Float
    }

    /// The value as written, at f64 (exact for every type but 64-bit integers beyond 2^53,
    /// which are refused anyway: beyond 2^24), or the reason a byte is not a value.
    fn decode(self, b: &[u8]) -> std::result::Result<f64, String> {
        let mut x = [0u8; 8];
        x[..self.size].copy_from_slice(&b[..self.size]);
        if self.big_endian {
            x[..self.size].reverse();
        }
        let (s2, s4) = ([x[0], x[1]], [x[0], x[1], x[2], x[3]]);
        Ok(match (self.kind, self.size) {
            (Kind::Float, 2) => half::f16::from_le_bytes(s2).to_f64(),
            (Kind::Float, 4) => f32::from_le_bytes(s4) as f64,
            (Kind::Float, _) => f64::from_le_bytes(x),
            (Kind::Int, 1) => x[0] as i8 as f64,
            (Kind::Int, 2) => i16::from_le_bytes(s2) as f64,
            (Kind::Int, 4) => i32::from_le_bytes(s4) as f64,
            (Kind::Int, _) => i64::from_le_bytes(x) as f64,
            (Kind::Uint, 1) => x[0] as f64,
            (Kind::Uint, 2) => u16::from_le_bytes(s2) as f64,
            (Kind::Uint, 4) => u32::from_le_bytes(s4) as f64,
            (Kind::Uint, _) => u64::from_le_bytes(x) as f64,
            (Kind::Bool, _) => match x[0] {
                0 | 1 => x[0] as f64,
                v => return Err(format!("a boolean byte {v} (numpy writes 0 and 1)")),
            },
        })
    }
}

/// The parsed header dict.
struct Header {
    descr: String,
    fortran: bool,
    shape: Vec<usize>,
}

/// A strict parser of the header's Python dict literal.
struct DictParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> DictParser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && (self.s[self.i] as char).is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "expected `{}` at header byte {}",
                c as char, self.i
            ))
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        self.ws();
        let q = *self.s.get(self.i).ok_or("unexpected end of header")?;
        if q != b'\'' && q != b'"' {
            return Err(format!(
                "expected a quoted string at header byte {}",
                self.i
            ));
        }
        let start = self.i + 1;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == q)
            .ok_or("unterminated string in header")?;
        self.i = start + len + 1;
        Ok(String::from_utf8_lossy(&self.s[start..start + len]).into_owned())
    }
    /// The next token, up to a delimiter (`,`, `)`, `}`, `:` or whitespace), so that a
    /// message shows what stood there (`'3'`, `+3`, `3L`).
    fn word(&mut self) -> String {
        self.ws();
        let start = self.i;
        while self.i < self.s.len()
            && !matches!(self.s[self.i], b',' | b')' | b'}' | b':')
            && !(self.s[self.i] as char).is_ascii_whitespace()
        {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
    fn shape(&mut self) -> std::result::Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(b')') {
                return Ok(dims);
            }
            let w = self.word();
            let d: usize = w
                .parse()
                .map_err(|_| format!("shape entry `{w}` is not a non-negative integer"))?;
            dims.push(d);
            if dims.len() > 32 {
                return Err("shape has more than 32 dimensions".into());
            }
            if !self.eat(b',') {
                self.expect(b')')?;
                if dims.len() == 1 {
                    // Python reads `(3)` as the integer 3: numpy refuses it as a shape
                    return Err(format!(
                        "shape `({d})` is not a tuple (a one-dimensional shape is written `({d},)`)"
                    ));
                }
                return Ok(dims);
            }
        }
    }
    fn parse(mut self) -> std::result::Result<Header, String> {
        self.expect(b'{')?;
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        loop {
            if self.eat(b'}') {
                break;
            }
            let key = self.string()?;
            self.expect(b':')?;
            match key.as_str() {
                "descr" => descr = Some(self.string()?),
                "fortran_order" => {
                    fortran = Some(match self.word().as_str() {
                        "True" => true,
                        "False" => false,
                        w => return Err(format!("fortran_order must be True or False, got `{w}`")),
                    })
                }
                "shape" => shape = Some(self.shape()?),
                k => return Err(format!("unexpected header key `{k}`")),
            }
            if !self.eat(b',') {
                self.expect(b'}')?;
                break;
            }
        }
        self.ws();
        if self.i != self.s.len() {
            return Err("trailing bytes after the header dict".into());
        }
        Ok(Header {
            descr: descr.ok_or("header has no `descr`")?,
            fortran: fortran.ok_or("header has no `fortran_order`")?,
            shape: shape.ok_or("header has no `shape`")?,
        })
    }
}

/// Loads an `.npy` file as an f32 tensor.
pub fn load_npy(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = file::read_bytes(path, FORMAT)?;
    parse_npy(&bytes, &file::name(path))
}

/// Parses the bytes of an `.npy` file (`name` is used in messages).
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<Tensor> {
    let bad =
        |reason: String| -> crate::Error { DataError::malformed(name, FORMAT, reason).into() };
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad(
            "missing the \\x93NUMPY magic (not an .npy file or truncated)".into(),
        ));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        2 | 3 => return Err(bad("truncated header length".into())),
        _ => return Err(bad(format!("unsupported format version {major}.{minor}"))),
    };
    if minor != 0 {
        return Err(bad(format!(
            "unsupported format version {major}.{minor} (1.0, 2.0 and 3.0 exist)"
        )));
    }
    let data_start = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "header declares {header_len} bytes but the file has only {} after the preamble",
                bytes.len() - start
            ))
        })?;
    let header = DictParser {
        s: &bytes[start..data_start],
        i: 0,
    }
    .parse()
    .map_err(|e| bad(format!("invalid header: {e}")))?;
    let dtype = Dtype::parse(&header.descr).map_err(bad)?;
    let available = bytes.len() - data_start;
    let numel = header
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n.checked_mul(dtype.size).is_some_and(|b| b == available))
        .ok_or_else(|| {
            bad(format!(
                "shape {:?} of {} does not match the {available} data bytes in the file",
                header.shape, header.descr
            ))
        })?;
    // one pass: integers beyond 2^24 are refused, not rounded to the nearest f32 (as
    // safetensors' and IDX's integer values): <i4 2^24 + 1 was read as 2^24
    let mut data: Vec<f32> = Vec::with_capacity(numel);
    for (i, b) in bytes[data_start..].chunks_exact(dtype.size).enumerate() {
        let at = data_start + i * dtype.size;
        let v = dtype
            .decode(b)
            .map_err(|e| bad(format!("value at index {i} (byte {at}) is {e}")))?;
        if dtype.is_integer() && v.abs() > super::finite::EXACT_F32_INTEGER {
            return Err(bad(format!(
                "value at index {i} (byte {at}) is an integer beyond 2^24, which float32 cannot hold exactly; refusing to round it",
            )));
        }
        data.push(v as f32);
    }
    debug_assert_eq!(data.len(), numel);
    super::finite::refuse_non_finite(&data, data_start, dtype.size).map_err(bad)?;
    if header.fortran {
        data = fortran_to_c(&data, &header.shape);
    }
    Tensor::from_vec(data, &header.shape)
}

/// The values of a Fortran-ordered array (first index fastest) in C order (last index
/// fastest): element (i₀, …, iₖ) sits at Σ iⱼ·(d₀·…·dⱼ₋₁) in the file.
fn fortran_to_c(data: &[f32], shape: &[usize]) -> Vec<f32> {
    if shape.iter().filter(|&&d| d > 1).count() <= 1 {
        return data.to_vec(); // one axis of extent > 1: both orders are the same
    }
    // Fortran strides: the C strides of the reversed shape, reversed
    let reversed: Vec<usize> = shape.iter().rev().copied().collect();
    let mut strides = crate::spec::contiguous_strides(&reversed);
    strides.reverse();
    let mut out = Vec::with_capacity(data.len());
    let mut index = vec![0usize; shape.len()];
    for _ in 0..data.len() {
        out.push(
            data[index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        // the next C-order index: the last axis fastest
        for j in (0..shape.len()).rev() {
            index[j] += 1;
            if index[j] < shape[j] {
                break;
            }
            index[j] = 0;
        }
    }
    out
}

/// Loads features and targets from two `.npy` files with a common leading axis.
pub fn load_npy_dataset(features: impl AsRef<Path>, targets: impl AsRef<Path>) -> Result<Dataset> {
    Dataset::new(&load_npy(features)?, &load_npy(targets)?)
}

/// Writes `tensor` as a version 1.0 `<f4` C-order `.npy` file.
pub fn save_npy(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let dims: Vec<String> = tensor.shape().iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * tensor.numel());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // the padded header of a tensor of rank <= usize fits easily in u16 for realistic ranks
    let len = u16::try_from(header.len())
        .map_err(|_| DataError::Invalid(format!("npy header too long for shape {shape}")))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in tensor.data().iter() {
        out.extend_from_slice(&v.to_le_bytes());
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
