//! Tensors known at import time, and the import-time evaluation of the shape arithmetic that
//! exporters emit (`Shape → Gather → Concat → Reshape`, `Constant → Sqrt → Div`, ...).
//!
//! Only values that do not depend on a graph input or a parameter are evaluated here: an
//! initializer stays a parameter (its gradient is part of what `--grad` reports), so nothing
//! that flows from one is folded. Float values are computed in f32, as the model's runtime
//! would, and integers in i64 with checked arithmetic.

use onnx_protobuf::TensorProto;
use torchlean::graph::MAX_NODE_ELEMENTS;

/// ONNX `TensorProto.DataType` codes the importer reads.
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const DOUBLE: i32 = 11;

    /// Bytes per element of the types the importer reads (stored raw or externally).
    pub fn width(code: i32) -> Option<usize> {
        match code {
            FLOAT | INT32 => Some(4),
            INT64 | DOUBLE => Some(8),
            BOOL => Some(1),
            _ => None,
        }
    }

    /// A readable name for a data type code.
    pub fn name(code: i32) -> String {
        match code {
            1 => "float32".into(),
            2 => "uint8".into(),
            3 => "int8".into(),
            4 => "uint16".into(),
            5 => "int16".into(),
            6 => "int32".into(),
            7 => "int64".into(),
            8 => "string".into(),
            9 => "bool".into(),
            10 => "float16".into(),
            11 => "float64".into(),
            12 => "uint32".into(),
            13 => "uint64".into(),
            16 => "bfloat16".into(),
            c => format!("data type {c}"),
        }
    }
}

/// The elements of a constant.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

/// A tensor known at import time.
#[derive(Debug, Clone, PartialEq)]
pub struct Const {
    pub dims: Vec<usize>,
    pub data: Data,
}

type Fold<T> = Result<T, String>;

/// Room for `n` decoded values, reserved fallibly (`runtime::buffers::try_with_capacity`:
/// also refused when the system reports less memory available than asked).
fn reserved<T>(n: usize) -> Fold<Vec<T>> {
    torchlean::runtime::buffers::try_with_capacity(n, "an initializer's values")
        .map_err(|e| e.to_string())
}

/// `n` decoded values in a vector reserved fallibly.
fn decoded<T>(n: usize, values: impl Iterator<Item = T>) -> Fold<Vec<T>> {
    let mut v = reserved(n)?;
    v.extend(values);
    Ok(v)
}

/// `n` float64 values narrowed to f32 ([`narrow`]), in a vector reserved fallibly.
fn decoded_narrowed(n: usize, values: impl Iterator<Item = f64>) -> Fold<Vec<f32>> {
    let mut v = reserved(n)?;
    for (i, x) in values.enumerate() {
        v.push(narrow(x, i)?);
    }
    Ok(v)
}

/// The most elements the import-time evaluation may compute, all constants of one import
/// together (2^26: at most 512 MiB of i64, 256 MiB of f32). Every constant is counted
/// against it before its elements are allocated. The shape arithmetic exporters emit is a
/// few dozen elements; the largest legitimate constants (a causal mask, a position table)
/// are a few million. Initializers and `Constant` tensors are not counted: their size is
/// bounded by the file's.
pub const MAX_CONSTANT_ELEMENTS: usize = 1 << 26;

/// What is left of [`MAX_CONSTANT_ELEMENTS`] in one import.
#[derive(Debug, Default)]
pub struct Budget {
    used: std::cell::Cell<usize>,
}

impl Budget {
    /// Counts a constant of shape `dims` against the budget, before it is allocated; returns
    /// its element count.
    pub fn take(&self, dims: &[usize]) -> Fold<usize> {
        let n = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                format!("the constant of shape {dims:?} evaluated at import time would have more than 2^64 elements")
            })?;
        let total = self.used.get().saturating_add(n);
        if total > MAX_CONSTANT_ELEMENTS {
            return Err(format!(
                "the constant of shape {dims:?} evaluated at import time would have {n} elements, \
                 bringing the import's constants to {total}, above the limit of \
                 {MAX_CONSTANT_ELEMENTS} (2^26) elements"
            ));
        }
        self.used.set(total);
        Ok(n)
    }

    /// Elements counted so far.
    pub fn used(&self) -> usize {
        self.used.get()
    }
}

/// An empty vector with room for `n` elements, or an error when the allocation fails.
fn room<T>(n: usize) -> Fold<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        format!("cannot allocate {n} elements for a constant evaluated at import time")
    })?;
    Ok(v)
}

/// `data` rebuilt from the same variant by `$f(values)`, where `$f` is generic over the
/// element type (each arm is expanded with its own type).
macro_rules! per_kind {
    ($data:expr, $v:ident => $e:expr) => {
        match $data {
            Data::F32($v) => Data::F32($e),
            Data::I64($v) => Data::I64($e),
            Data::Bool($v) => Data::Bool($e),
        }
    };
}

/// The elements of `src` at `base + Σ_a k_a · steps[a]` for every multi-index `k` of `dims`,
/// in row-major order, computed as they are copied (no index list). The caller guarantees
/// that every such offset lies in `src` and has counted the output against the budget.
fn walk<T: Copy>(src: &[T], dims: &[usize], base: isize, steps: &[isize]) -> Fold<Vec<T>> {
    let n: usize = dims.iter().product();
    let mut out = room(n)?;
    if n == 0 {
        return Ok(out);
    }
    let Some((&inner, outer_dims)) = dims.split_last() else {
        // rank 0: the one element at `base`
        out.push(src[base as usize]);
        return Ok(out);
    };
    let inner_step = steps[outer_dims.len()];
    let mut idx = vec![0usize; outer_dims.len()];
    let mut offset = base;
    loop {
        let mut o = offset;
        for _ in 0..inner {
            // invariant: the caller's offsets lie in `src` (checked ranges and strides)
            out.push(src[o as usize]);
            o += inner_step;
        }
        // the next row: an odometer over the outer axes
        let mut a = outer_dims.len();
        loop {
            if a == 0 {
                return Ok(out);
            }
            a -= 1;
            idx[a] += 1;
            offset += steps[a];
            if idx[a] < outer_dims[a] {
                break;
            }
            offset -= steps[a] * outer_dims[a] as isize;
            idx[a] = 0;
        }
    }
}

fn numel(dims: &[usize]) -> Fold<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_NODE_ELEMENTS)
        .ok_or_else(|| format!("a tensor of shape {dims:?} is larger than 2^31 elements"))
}

/// ONNX dims (i64) as sizes, refusing negative ones and more than 2^31 elements.
pub fn sizes(dims: &[i64]) -> Fold<Vec<usize>> {
    let out = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d} in {dims:?}")))
        .collect::<Fold<Vec<usize>>>()?;
    numel(&out)?;
    Ok(out)
}

/// A float64 value as f32, refusing a finite value beyond the f32 range (it would become an
/// infinity; the graph-file reader refuses such payloads the same way). Finite values that
/// only round, infinities and NaN convert as they are.
fn narrow(v: f64, i: usize) -> Fold<f32> {
    let x = v as f32;
    if x.is_infinite() && v.is_finite() {
        return Err(format!(
            "float64 element {i} is {v:e}, outside the range of f32 (torchlean computes in float32; it would become an infinity)"
        ));
    }
    Ok(x)
}

/// Whether `t` holds float64 values that float32 does not hold exactly (0.1, 1/3): the import
/// narrows them, which changes a comparison of a float64 value with them (`x.double() > 0.1`
/// holds for x = f32(0.1), not for the narrowed constant).
pub fn rounds_doubles(t: &TensorProto) -> bool {
    let inexact = |v: f64| v.is_finite() && (v as f32) as f64 != v;
    if t.data_type != dtype::DOUBLE {
        return false;
    }
    if t.raw_data.is_empty() {
        t.double_data.iter().any(|&v| inexact(v))
    } else {
        t.raw_data.chunks_exact(8).any(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            inexact(f64::from_le_bytes(b))
        })
    }
}

impl Const {
    pub fn f32(dims: Vec<usize>, v: Vec<f32>) -> Const {
        Const {
            dims,
            data: Data::F32(v),
        }
    }

    pub fn i64s(v: Vec<i64>) -> Const {
        Const {
            dims: vec![v.len()],
            data: Data::I64(v),
        }
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ONNX data type this constant holds (float32, int64 or bool: the types the
    /// import computes in).
    pub fn dtype(&self) -> i32 {
        match self.data {
            Data::F32(_) => dtype::FLOAT,
            Data::I64(_) => dtype::INT64,
            Data::Bool(_) => dtype::BOOL,
        }
    }

    /// Decodes an initializer or a `Constant` node's tensor. Element counts are checked
    /// against the dims before anything is allocated; external data and data types without
    /// an f32, i64 or bool reading are refused, and so are float64 values beyond the f32
    /// range.
    pub fn from_proto(t: &TensorProto) -> Fold<Const> {
        if crate::external::is_external(t) {
            // initializers' external data is read with the model file (`read_model`); a model
            // decoded from bytes, or a Constant node's tensor, has no file to read it from
            return Err("the tensor's data is stored outside the model (external data), which is read only for the initializers of a model loaded from its file; re-export with external_data=False".into());
        }
        let dims = sizes(&t.dims)?;
        let n = numel(&dims)?;
        let raw = &t.raw_data;
        let width = dtype::width(t.data_type).ok_or_else(|| {
            format!(
                "{} tensors are not supported (float32, float64, int32, int64 and bool are)",
                dtype::name(t.data_type)
            )
        })?;
        let stored = if raw.is_empty() {
            match t.data_type {
                dtype::FLOAT => t.float_data.len(),
                dtype::INT32 | dtype::BOOL => t.int32_data.len(),
                dtype::INT64 => t.int64_data.len(),
                _ => t.double_data.len(),
            }
        } else if raw.len() % width == 0 {
            raw.len() / width
        } else {
            usize::MAX
        };
        if stored != n {
            return Err(format!(
                "the tensor declares shape {dims:?} ({n} elements) but holds {} bytes / values of {}",
                if raw.is_empty() { stored } else { raw.len() },
                dtype::name(t.data_type)
            ));
        }
        let chunks = |w: usize| raw.chunks_exact(w);
        let word4 = |c: &[u8]| [c[0], c[1], c[2], c[3]];
        let word8 = |c: &[u8]| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            b
        };
        // every decoded copy is reserved fallibly: a large initializer (up to the external
        // data's bound) the process cannot hold is an error naming it, not an abort
        let data = match t.data_type {
            dtype::FLOAT if raw.is_empty() => Data::F32(decoded(n, t.float_data.iter().copied())?),
            dtype::FLOAT => Data::F32(decoded(n, chunks(4).map(|c| f32::from_le_bytes(word4(c))))?),
            dtype::DOUBLE if raw.is_empty() => {
                Data::F32(decoded_narrowed(n, t.double_data.iter().copied())?)
            }
            dtype::DOUBLE => Data::F32(decoded_narrowed(
                n,
                chunks(8).map(|c| f64::from_le_bytes(word8(c))),
            )?),
            dtype::INT64 if raw.is_empty() => Data::I64(decoded(n, t.int64_data.iter().copied())?),
            dtype::INT64 => Data::I64(decoded(n, chunks(8).map(|c| i64::from_le_bytes(word8(c))))?),
            dtype::INT32 if raw.is_empty() => {
                Data::I64(decoded(n, t.int32_data.iter().map(|&v| v as i64))?)
            }
            dtype::INT32 => Data::I64(decoded(
                n,
                chunks(4).map(|c| i32::from_le_bytes(word4(c)) as i64),
            )?),
            dtype::BOOL if raw.is_empty() => {
                Data::Bool(decoded(n, t.int32_data.iter().map(|&v| v != 0))?)
            }
            _ => Data::Bool(decoded(n, raw.iter().map(|&b| b != 0))?),
        };
        Ok(Const { dims, data })
    }

    /// The elements as i64 (integers and bools; floats only when integral).
    pub fn ints(&self) -> Fold<Vec<i64>> {
        match &self.data {
            Data::I64(v) => Ok(v.clone()),
            Data::Bool(v) => Ok(v.iter().map(|&b| b as i64).collect()),
            Data::F32(v) => v
                .iter()
                .map(|&x| {
                    if x.fract() == 0.0 && x.abs() < 9.0e15 {
                        Ok(x as i64)
                    } else {
                        Err(format!("expected integers, found {x}"))
                    }
                })
                .collect(),
        }
    }

    /// The elements as f32 (a graph constant's values).
    pub fn floats(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Data::Bool(v) => v.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect(),
        }
    }

    /// [`Const::floats`] in a vector reserved fallibly (an initializer's values, which may be
    /// as large as the external data's bound, become a tensor through this).
    pub fn try_floats(&self) -> Fold<Vec<f32>> {
        match &self.data {
            Data::F32(v) => decoded(v.len(), v.iter().copied()),
            Data::I64(v) => decoded(v.len(), v.iter().map(|&x| x as f32)),
            Data::Bool(v) => decoded(v.len(), v.iter().map(|&b| if b { 1.0 } else { 0.0 })),
        }
    }

    /// The single element of a one-element constant, as f32.
    pub fn scalar(&self) -> Option<f32> {
        (self.len() == 1).then(|| self.floats()[0])
    }

    /// The elements at `base + Σ k_a · steps[a]` over the multi-indices of `dims` (the common
    /// core of slice, transpose and broadcast), counted against the budget first.
    fn strided(
        &self,
        dims: Vec<usize>,
        base: isize,
        steps: &[isize],
        budget: &Budget,
    ) -> Fold<Const> {
        budget.take(&dims)?;
        let data = per_kind!(&self.data, v => walk(v, &dims, base, steps)?);
        Ok(Const { dims, data })
    }

    pub fn reshaped(&self, dims: Vec<usize>, budget: &Budget) -> Fold<Const> {
        if numel(&dims)? != self.len() {
            return Err(format!(
                "cannot reshape {} elements to {dims:?}",
                self.len()
            ));
        }
        budget.take(&dims)?;
        Ok(Const {
            dims,
            data: self.data.clone(),
        })
    }

    /// Converts to an ONNX data type (`Cast`). A conversion to an integer type of NaN, an
    /// infinity or a value outside the target type's range (undefined in ONNX; 0 or
    /// saturation in practice) is refused.
    pub fn cast(&self, to: i32, budget: &Budget) -> Fold<Const> {
        budget.take(&self.dims)?;
        let data = match to {
            dtype::FLOAT | dtype::DOUBLE => Data::F32(self.floats()),
            dtype::INT64 | dtype::INT32 => {
                // [lo, hi) of the target type, exact in f64
                let (lo, hi) = if to == dtype::INT32 {
                    (-(2f64.powi(31)), 2f64.powi(31))
                } else {
                    (-(2f64.powi(63)), 2f64.powi(63))
                };
                let refuse = |x: &dyn std::fmt::Display, i: usize| {
                    format!(
                        "Cast of element {i} ({x}) to {}: NaN, infinite or outside the range of the integer type (ONNX leaves the result undefined)",
                        dtype::name(to)
                    )
                };
                Data::I64(match &self.data {
                    Data::F32(v) => v
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            let t = (x as f64).trunc();
                            if t.is_nan() || t < lo || t >= hi {
                                Err(refuse(&x, i))
                            } else {
                                Ok(t as i64)
                            }
                        })
                        .collect::<Fold<_>>()?,
                    // integers are compared as integers: i64::MAX rounds to 2^63 in f64
                    // (the slice end `x[a:]` exports as Cast(int64 9223372036854775807))
                    Data::I64(v) => v
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            if to == dtype::INT32 && i32::try_from(x).is_err() {
                                Err(refuse(&x, i))
                            } else {
                                Ok(x)
                            }
                        })
                        .collect::<Fold<_>>()?,
                    Data::Bool(_) => self.ints()?,
                })
            }
            dtype::BOOL => Data::Bool(self.floats().iter().map(|&x| x != 0.0).collect()),
            other => return Err(format!("cast to {} is not supported", dtype::name(other))),
        };
        Ok(Const {
            dims: self.dims.clone(),
            data,
        })
    }

    /// Concatenation along `axis` (all parts of one kind). Each part is converted once.
    pub fn concat(parts: &[&Const], axis: usize, budget: &Budget) -> Fold<Const> {
        let first = parts.first().ok_or("Concat of no tensors")?;
        let rank = first.dims.len();
        if axis >= rank
            || parts.iter().any(|p| {
                p.dims.len() != rank || (0..rank).any(|a| a != axis && p.dims[a] != first.dims[a])
            })
        {
            return Err(format!(
                "Concat along axis {axis} of shapes {:?}",
                parts.iter().map(|p| p.dims.clone()).collect::<Vec<_>>()
            ));
        }
        let outer: usize = first.dims[..axis].iter().product();
        let inner: usize = first.dims[axis + 1..].iter().product();
        let mut dims = first.dims.clone();
        dims[axis] = parts
            .iter()
            .try_fold(0usize, |n, p| n.checked_add(p.dims[axis]))
            .ok_or("Concat: the axis length overflows")?;
        let n = budget.take(&dims)?;
        fn join<T: Copy>(parts: &[Vec<T>], runs: &[usize], outer: usize, n: usize) -> Fold<Vec<T>> {
            let mut out = room(n)?;
            for o in 0..outer {
                for (p, &run) in parts.iter().zip(runs) {
                    out.extend_from_slice(&p[o * run..(o + 1) * run]);
                }
            }
            Ok(out)
        }
        let runs: Vec<usize> = parts.iter().map(|p| p.dims[axis] * inner).collect();
        let data = if parts.iter().any(|p| matches!(p.data, Data::F32(_))) {
            let conv: Vec<Vec<f32>> = parts.iter().map(|p| p.floats()).collect();
            Data::F32(join(&conv, &runs, outer, n)?)
        } else {
            let conv = parts.iter().map(|p| p.ints()).collect::<Fold<Vec<_>>>()?;
            Data::I64(join(&conv, &runs, outer, n)?)
        };
        Ok(Const { dims, data })
    }

    /// `Gather` along `axis` with integer indices (negative ones count from the end).
    pub fn gather(&self, axis: usize, index: &Const, budget: &Budget) -> Fold<Const> {
        let rank = self.dims.len();
        if axis >= rank {
            return Err(format!("Gather axis {axis} of a rank-{rank} tensor"));
        }
        let n = self.dims[axis];
        let mut dims = self.dims[..axis].to_vec();
        dims.extend_from_slice(&index.dims);
        dims.extend_from_slice(&self.dims[axis + 1..]);
        let total = budget.take(&dims)?;
        let idx = index
            .ints()?
            .into_iter()
            .map(|i| normalize_index(i, n))
            .collect::<Fold<Vec<usize>>>()?;
        let outer: usize = self.dims[..axis].iter().product();
        let inner: usize = self.dims[axis + 1..].iter().product();
        fn pick<T: Copy>(
            v: &[T],
            idx: &[usize],
            outer: usize,
            n: usize,
            inner: usize,
            total: usize,
        ) -> Fold<Vec<T>> {
            let mut out = room(total)?;
            for o in 0..outer {
                for &k in idx {
                    let at = (o * n + k) * inner;
                    out.extend_from_slice(&v[at..at + inner]);
                }
            }
            Ok(out)
        }
        let data = per_kind!(&self.data, v => pick(v, &idx, outer, n, inner, total)?);
        Ok(Const { dims, data })
    }

    /// `Slice` with per-axis ranges from [`slice_range`] (axes not listed are kept whole).
    pub fn slice(&self, ranges: &[(usize, Stride)], budget: &Budget) -> Fold<Const> {
        let src = strides(&self.dims);
        let mut dims = self.dims.clone();
        let mut steps: Vec<isize> = src.iter().map(|&s| s as isize).collect();
        let mut base = 0isize;
        for &(axis, r) in ranges {
            if axis >= dims.len() || (r.len > 0 && r.last() >= self.dims[axis]) {
                return Err(format!(
                    "Slice of axis {axis} of shape {:?}: range {r:?} outside it",
                    self.dims
                ));
            }
            dims[axis] = r.len;
            if r.len > 0 {
                base += (r.start * src[axis]) as isize;
            }
            steps[axis] = r.step as isize * src[axis] as isize;
        }
        self.strided(dims, base, &steps, budget)
    }

    /// Axis permutation (`perm` a permutation of the axes, checked by the caller).
    pub fn transpose(&self, perm: &[usize], budget: &Budget) -> Fold<Const> {
        let src = strides(&self.dims);
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        let steps: Vec<isize> = perm.iter().map(|&p| src[p] as isize).collect();
        self.strided(dims, 0, &steps, budget)
    }

    /// Broadcast to `dims` (which must be a broadcast of this shape).
    pub fn broadcast(&self, dims: &[usize], budget: &Budget) -> Fold<Const> {
        if broadcast_shapes(&self.dims, dims)? != dims {
            return Err(format!("{:?} does not broadcast to {dims:?}", self.dims));
        }
        let offset = dims.len() - self.dims.len();
        let src = strides(&self.dims);
        let steps: Vec<isize> = (0..dims.len())
            .map(|a| {
                if a < offset || self.dims[a - offset] == 1 {
                    0
                } else {
                    src[a - offset] as isize
                }
            })
            .collect();
        self.strided(dims.to_vec(), 0, &steps, budget)
    }

    /// This constant broadcast to `dims`, borrowed when it already has that shape.
    fn widened<'a>(&'a self, dims: &[usize], budget: &Budget) -> Fold<std::borrow::Cow<'a, Const>> {
        if self.dims == dims {
            Ok(std::borrow::Cow::Borrowed(self))
        } else {
            Ok(std::borrow::Cow::Owned(self.broadcast(dims, budget)?))
        }
    }

    /// An elementwise binary op with NumPy broadcasting: floats if either side is float,
    /// else integers (checked), with bool results for comparisons.
    pub fn binary(&self, other: &Const, op: Binary, budget: &Budget) -> Fold<Const> {
        let dims = broadcast_shapes(&self.dims, &other.dims)?;
        let a = self.widened(&dims, budget)?;
        let b = other.widened(&dims, budget)?;
        budget.take(&dims)?;
        let floats = matches!(a.data, Data::F32(_)) || matches!(b.data, Data::F32(_));
        let data = if floats {
            let (x, y) = (a.floats(), b.floats());
            let z = x.iter().zip(&y).map(|(&p, &q)| (p, q));
            match op {
                Binary::Add => Data::F32(z.map(|(p, q)| p + q).collect()),
                Binary::Sub => Data::F32(z.map(|(p, q)| p - q).collect()),
                Binary::Mul => Data::F32(z.map(|(p, q)| p * q).collect()),
                Binary::Div => Data::F32(z.map(|(p, q)| p / q).collect()),
                Binary::Equal => Data::Bool(z.map(|(p, q)| p == q).collect()),
                Binary::Less => Data::Bool(z.map(|(p, q)| p < q).collect()),
                Binary::Greater => Data::Bool(z.map(|(p, q)| p > q).collect()),
                Binary::LessOrEqual => Data::Bool(z.map(|(p, q)| p <= q).collect()),
                Binary::GreaterOrEqual => Data::Bool(z.map(|(p, q)| p >= q).collect()),
            }
        } else {
            let (x, y) = (a.ints()?, b.ints()?);
            let overflow = || format!("integer overflow in {op:?} at import time");
            let z = x.iter().zip(&y).map(|(&p, &q)| (p, q));
            match op {
                Binary::Add => Data::I64(
                    z.map(|(p, q)| p.checked_add(q).ok_or_else(overflow))
                        .collect::<Fold<_>>()?,
                ),
                Binary::Sub => Data::I64(
                    z.map(|(p, q)| p.checked_sub(q).ok_or_else(overflow))
                        .collect::<Fold<_>>()?,
                ),
                Binary::Mul => Data::I64(
                    z.map(|(p, q)| p.checked_mul(q).ok_or_else(overflow))
                        .collect::<Fold<_>>()?,
                ),
                // ONNX integer division truncates
                Binary::Div => Data::I64(
                    z.map(|(p, q)| {
                        p.checked_div(q).ok_or_else(|| {
                            if q == 0 {
                                "integer division by zero at import time".to_string()
                            } else {
                                // i64::MIN / -1: the one quotient beyond int64
                                overflow()
                            }
                        })
                    })
                    .collect::<Fold<_>>()?,
                ),
                Binary::Equal => Data::Bool(z.map(|(p, q)| p == q).collect()),
                Binary::Less => Data::Bool(z.map(|(p, q)| p < q).collect()),
                Binary::Greater => Data::Bool(z.map(|(p, q)| p > q).collect()),
                Binary::LessOrEqual => Data::Bool(z.map(|(p, q)| p <= q).collect()),
                Binary::GreaterOrEqual => Data::Bool(z.map(|(p, q)| p >= q).collect()),
            }
        };
        Ok(Const { dims, data })
    }

    /// The product over `axes` (sorted, distinct, in range), kept as axes of length 1 with
    /// `keepdim`: integers in checked i64, floats in f32 in index order. ONNX `ReduceProd`
    /// of a constant (a legacy exporter's element count of a `Shape` for `torch.var`).
    pub fn reduce_product(&self, axes: &[usize], keepdim: bool, budget: &Budget) -> Fold<Const> {
        // which axes are reduced, as a mask (`axes.contains` per axis cost rank · |axes|)
        let mut reduced = vec![false; self.dims.len()];
        for &a in axes {
            if let Some(r) = reduced.get_mut(a) {
                *r = true;
            }
        }
        let kept: Vec<usize> = self
            .dims
            .iter()
            .zip(&reduced)
            .map(|(&d, &r)| if r { 1 } else { d })
            .collect();
        let n_out = budget.take(&kept)?;
        // each input element's output position by an odometer over the axes longer than 1
        // (an axis of length 1 moves nothing): O(1) amortized per element, whatever the rank
        // (recomputing the position axis by axis cost n·rank, a minute for a 16 KB model of
        // rank 2020)
        let out_strides = strides(&kept);
        let moving: Vec<(usize, usize)> = (0..self.dims.len())
            .filter(|&a| self.dims[a] > 1)
            .map(|a| {
                let step = if reduced[a] { 0 } else { out_strides[a] };
                (self.dims[a], step)
            })
            .collect();
        let mut targets = Vec::with_capacity(self.len());
        let mut index = vec![0usize; moving.len()];
        let mut at = 0usize;
        for _ in 0..self.len() {
            targets.push(at);
            for (k, &(len, step)) in moving.iter().enumerate().rev() {
                index[k] += 1;
                at += step;
                if index[k] < len {
                    break;
                }
                index[k] = 0;
                at -= step * len;
            }
        }
        let target = |i: usize| targets[i];
        let data = match &self.data {
            Data::I64(v) => {
                let mut out = vec![1i64; n_out];
                for (i, &x) in v.iter().enumerate() {
                    let o = &mut out[target(i)];
                    *o = o.checked_mul(x).ok_or_else(|| {
                        "integer overflow in ReduceProd at import time".to_string()
                    })?;
                }
                Data::I64(out)
            }
            _ => {
                let mut out = vec![1f32; n_out];
                for (i, x) in self.floats().into_iter().enumerate() {
                    out[target(i)] *= x;
                }
                Data::F32(out)
            }
        };
        let dims = if keepdim {
            kept
        } else {
            (0..self.dims.len())
                .filter(|&a| !reduced[a])
                .map(|a| self.dims[a])
                .collect()
        };
        Ok(Const { dims, data })
    }

    /// A float map (`Sqrt`, `Neg`, `Reciprocal`, ...), or an integer one where defined
    /// (`None` from it is an overflow, refused).
    pub fn map(
        &self,
        f32_op: impl Fn(f32) -> f32,
        i64_op: Option<fn(i64) -> Option<i64>>,
        budget: &Budget,
    ) -> Fold<Const> {
        budget.take(&self.dims)?;
        let data = match (&self.data, i64_op) {
            (Data::I64(v), Some(g)) => Data::I64(
                v.iter()
                    .map(|&x| g(x).ok_or_else(|| format!("integer overflow at import time ({x})")))
                    .collect::<Fold<_>>()?,
            ),
            _ => Data::F32(self.floats().into_iter().map(f32_op).collect()),
        };
        Ok(Const {
            dims: self.dims.clone(),
            data,
        })
    }
}

/// The binary ops evaluated at import time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
}

/// Row-major strides.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * dims[a + 1];
    }
    s
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Fold<Vec<usize>> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank {
                a[i + a.len() - rank]
            } else {
                1
            };
            let db = if i + b.len() >= rank {
                b[i + b.len() - rank]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
            }
        })
        .collect()
}

/// An index into an axis of length `n`, negative ones counting from the end.
pub fn normalize_index(i: i64, n: usize) -> Fold<usize> {
    let n_i = n as i64;
    let j = if i < 0 { i + n_i } else { i };
    if (0..n_i).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!("index {i} out of range for an axis of length {n}"))
    }
}

/// An axis of a rank-`rank` tensor, negative ones counting from the end.
pub fn normalize_axis(axis: i64, rank: usize) -> Fold<usize> {
    normalize_index(axis, rank).map_err(|_| format!("axis {axis} out of range for rank {rank}"))
}

/// The indices ONNX `Slice` keeps on one axis: `start`, `start + step`, ... (`len` of them),
/// described, not listed (an axis may be 2^31 long).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    pub start: usize,
    pub step: i64,
    pub len: usize,
}

impl Stride {
    /// The last index kept (meaningful when `len > 0`).
    pub fn last(&self) -> usize {
        (self.start as i128 + (self.len as i128 - 1) * self.step as i128) as usize
    }

    /// The indices kept, in order.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).map(|k| (self.start as i128 + k as i128 * self.step as i128) as usize)
    }
}

/// The range ONNX `Slice` keeps on an axis of length `n` (starts and ends clamped as the
/// operator specifies, any non-zero step).
pub fn slice_range(start: i64, end: i64, step: i64, n: usize) -> Fold<Stride> {
    if step == 0 {
        return Err("Slice with step 0".into());
    }
    let n = n as i128;
    let clamp = |v: i128, lo: i128, hi: i128| v.max(lo).min(hi);
    let fix = |v: i64| {
        let v = v as i128;
        if v < 0 {
            v + n
        } else {
            v
        }
    };
    let step_w = step as i128;
    let (s, len) = if step > 0 {
        let (s, e) = (clamp(fix(start), 0, n), clamp(fix(end), 0, n));
        (
            s,
            if e > s {
                (e - s + step_w - 1) / step_w
            } else {
                0
            },
        )
    } else {
        let (s, e) = (clamp(fix(start), -1, n - 1), clamp(fix(end), -1, n - 1));
        (
            s,
            if s > e {
                (s - e - step_w - 1) / -step_w
            } else {
                0
            },
        )
    };
    Ok(Stride {
        start: if len > 0 { s as usize } else { 0 },
        step,
        // at most n (≤ usize::MAX)
        len: len as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reduce_product` against the product computed element by element from each index
    /// (the definition), over shapes with axes of length 1 among longer ones, every subset of
    /// axes, with and without `keepdim`; and a rank-2020 constant (16 axes of 2 among 2004
    /// of 1) reduces without visiting every axis for every element.
    #[test]
    fn reduce_product_is_the_product_over_the_reduced_axes() {
        for dims in [
            vec![2usize, 1, 3],
            vec![1, 4, 1, 2, 3],
            vec![3],
            vec![2, 2, 1, 1, 2],
        ] {
            let n: usize = dims.iter().product();
            let values: Vec<i64> = (0..n as i64).map(|v| v % 5 + 1).collect();
            let c = Const {
                dims: dims.clone(),
                data: Data::I64(values.clone()),
            };
            let rank = dims.len();
            for mask in 1..(1u32 << rank) {
                let axes: Vec<usize> = (0..rank).filter(|a| mask >> a & 1 == 1).collect();
                for keepdim in [true, false] {
                    let got = c
                        .reduce_product(&axes, keepdim, &Budget::default())
                        .unwrap();
                    let kept: Vec<usize> = (0..rank)
                        .map(|a| if axes.contains(&a) { 1 } else { dims[a] })
                        .collect();
                    let (ins, outs) = (strides(&dims), strides(&kept));
                    let mut want = vec![1i64; kept.iter().product()];
                    for (i, v) in values.iter().enumerate() {
                        let o: usize = (0..rank)
                            .filter(|a| !axes.contains(a))
                            .map(|a| (i / ins[a]) % dims[a] * outs[a])
                            .sum();
                        want[o] *= v;
                    }
                    assert_eq!(got.data, Data::I64(want), "{dims:?} {axes:?}");
                    let shape: Vec<usize> = if keepdim {
                        kept
                    } else {
                        (0..rank)
                            .filter(|a| !axes.contains(a))
                            .map(|a| dims[a])
                            .collect()
                    };
                    assert_eq!(got.dims, shape);
                }
            }
        }
        let mut dims = vec![2usize; 16];
        dims.extend(vec![1; 2004]);
        let c = Const {
            data: Data::I64(vec![1; 1 << 16]),
            dims,
        };
        let all: Vec<usize> = (0..2020).collect();
        let got = c.reduce_product(&all, false, &Budget::default()).unwrap();
        assert_eq!((got.dims, got.data), (vec![], Data::I64(vec![1])));
    }

    #[test]
    fn slice_ranges_follow_the_onnx_clamping_rules() {
        let kept = |s, e, st, n| {
            slice_range(s, e, st, n)
                .unwrap()
                .indices()
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(0, i64::MAX, 1, 4), vec![0, 1, 2, 3]);
        assert_eq!(kept(-1, i64::MAX, 1, 4), vec![3]);
        assert_eq!(kept(i64::MIN, -2, 1, 4), vec![0, 1]);
        assert_eq!(kept(-1, i64::MIN, -1, 4), vec![3, 2, 1, 0]);
        assert_eq!(kept(1, 4, 2, 4), vec![1, 3]);
        assert_eq!(kept(3, 0, -2, 4), vec![3, 1]);
        assert_eq!(kept(0, 4, i64::MAX, 4), vec![0]);
        assert_eq!(kept(3, -5, i64::MIN, 4), vec![3]);
        assert_eq!(kept(2, 1, 1, 4), Vec::<usize>::new());
        assert!(slice_range(0, 1, 0, 4).is_err());
        // an axis of 2^31 is described, not listed
        let big = slice_range(0, i64::MAX, 1, 1 << 31).unwrap();
        assert_eq!((big.start, big.len), (0, 1 << 31));
    }

    /// The strided copies (slice, transpose, broadcast) against index arithmetic written out
    /// directly, on a 3-D tensor with steps of both signs.
    #[test]
    fn strided_copies_match_direct_index_arithmetic() {
        let budget = Budget::default();
        let dims = [3usize, 4, 5];
        let t = Const::f32(dims.to_vec(), (0..60).map(|v| v as f32).collect());
        let at = |i: usize, j: usize, k: usize| (i * 20 + j * 5 + k) as f32;
        let r1 = slice_range(-1, i64::MIN, -2, 3).unwrap(); // 2, 0
        let r2 = slice_range(1, 5, 2, 5).unwrap(); // 1, 3
        let s = t.slice(&[(0, r1), (2, r2)], &budget).unwrap();
        assert_eq!(s.dims, vec![2, 4, 2]);
        let mut want = vec![];
        for i in [2, 0] {
            for j in 0..4 {
                for k in [1, 3] {
                    want.push(at(i, j, k));
                }
            }
        }
        assert_eq!(s.floats(), want);
        let p = t.transpose(&[2, 0, 1], &budget).unwrap();
        assert_eq!(p.dims, vec![5, 3, 4]);
        let mut want = vec![];
        for k in 0..5 {
            for i in 0..3 {
                for j in 0..4 {
                    want.push(at(i, j, k));
                }
            }
        }
        assert_eq!(p.floats(), want);
        let row = Const::f32(vec![1, 5], (0..5).map(|v| v as f32).collect());
        let b = row.broadcast(&[2, 3, 5], &budget).unwrap();
        assert_eq!(
            b.floats(),
            (0..6)
                .flat_map(|_| 0..5)
                .map(|v| v as f32)
                .collect::<Vec<_>>()
        );
        let scalar = Const::f32(vec![], vec![7.0]);
        assert_eq!(scalar.transpose(&[], &budget).unwrap().floats(), vec![7.0]);
    }

    #[test]
    fn the_budget_refuses_before_allocating() {
        let budget = Budget::default();
        // a [1, 2^16] table gathered by 2^16 indices would be 2^32 elements
        let table = Const::f32(vec![1, 1 << 16], vec![0.0; 1 << 16]);
        let index = Const {
            dims: vec![1 << 16],
            data: Data::I64(vec![0; 1 << 16]),
        };
        let e = table.gather(0, &index, &budget).unwrap_err();
        assert!(
            e.contains("4294967296 elements") && e.contains("2^26"),
            "{e}"
        );
        let e = Const::f32(vec![1], vec![1.0])
            .broadcast(&[1 << 31], &budget)
            .unwrap_err();
        assert!(e.contains("2147483648 elements"), "{e}");
        // the limit is on all constants together
        let half = Const::f32(vec![1], vec![1.0]);
        half.broadcast(&[MAX_CONSTANT_ELEMENTS / 2], &budget)
            .unwrap();
        half.broadcast(&[MAX_CONSTANT_ELEMENTS / 2], &budget)
            .unwrap();
        assert!(half.broadcast(&[1], &budget).is_err());
    }

    #[test]
    fn concat_converts_each_part_once_and_interleaves_rows() {
        let budget = Budget::default();
        let a = Const::f32(vec![2, 2], vec![1., 2., 3., 4.]);
        let b = Const {
            dims: vec![2, 1],
            data: Data::I64(vec![9, 8]),
        };
        let c = Const::concat(&[&a, &b], 1, &budget).unwrap();
        assert_eq!(c.dims, vec![2, 3]);
        assert_eq!(c.floats(), vec![1., 2., 9., 3., 4., 8.]);
        // 2^20 rows of two parts: linear work (quadratic took minutes)
        let rows = Const::f32(vec![1 << 20, 1], vec![1.0; 1 << 20]);
        let start = std::time::Instant::now();
        let big = Const::concat(&[&rows, &rows], 1, &budget).unwrap();
        assert_eq!(big.dims, vec![1 << 20, 2]);
        assert!(start.elapsed().as_secs() < 20);
    }

    #[test]
    fn float64_beyond_f32_and_casts_without_an_integer_are_refused() {
        let mut t = TensorProto::new();
        t.dims = vec![2];
        t.data_type = dtype::DOUBLE;
        t.double_data = vec![1.5, 1e300];
        let e = Const::from_proto(&t).unwrap_err();
        assert!(e.contains("element 1") && e.contains("1e300"), "{e}");
        // a finite value that rounds is kept; so is an infinity (representable)
        t.double_data = vec![0.1, f64::INFINITY];
        let c = Const::from_proto(&t).unwrap();
        assert_eq!(c.floats(), vec![0.1f32, f32::INFINITY]);
        let budget = Budget::default();
        let cast = |v: f32, to| Const::f32(vec![1], vec![v]).cast(to, &budget);
        assert_eq!(cast(-2.7, dtype::INT64).unwrap().ints().unwrap(), vec![-2]);
        for bad in [f32::NAN, f32::INFINITY, 3e30, -1e19] {
            assert!(cast(bad, dtype::INT64).is_err(), "{bad}");
        }
        assert!(cast(3e9, dtype::INT32).is_err());
        assert_eq!(
            cast(3e9, dtype::INT64).unwrap().ints().unwrap(),
            vec![3_000_000_000]
        );
        // integers keep every value of the target type, its ends included (PyTorch's exporter
        // writes `x[a:]`'s end as Cast(int64 i64::MAX), which rounds to 2^63 in f64)
        let ints = |v: Vec<i64>, to| Const::i64s(v).cast(to, &budget);
        let ends = vec![i64::MAX, i64::MIN, 0, -1];
        assert_eq!(
            ints(ends.clone(), dtype::INT64).unwrap().ints().unwrap(),
            ends
        );
        let ends32 = vec![i32::MAX as i64, i32::MIN as i64];
        assert_eq!(
            ints(ends32.clone(), dtype::INT32).unwrap().ints().unwrap(),
            ends32
        );
        for bad in [i32::MAX as i64 + 1, i32::MIN as i64 - 1, i64::MAX] {
            assert!(ints(vec![bad], dtype::INT32).is_err(), "{bad}");
        }
    }

    #[test]
    fn constants_gather_transpose_and_broadcast_like_numpy() {
        let t = Const::f32(vec![2, 3], vec![0., 1., 2., 3., 4., 5.]);
        let budget = Budget::default();
        let g = t
            .gather(
                1,
                &Const {
                    dims: vec![],
                    data: Data::I64(vec![-1]),
                },
                &budget,
            )
            .unwrap();
        assert_eq!((g.dims.clone(), g.floats()), (vec![2], vec![2., 5.]));
        let tr = t.transpose(&[1, 0], &budget).unwrap();
        assert_eq!(tr.floats(), vec![0., 3., 1., 4., 2., 5.]);
        let b = Const::f32(vec![3], vec![1., 2., 3.])
            .broadcast(&[2, 3], &budget)
            .unwrap();
        assert_eq!(b.floats(), vec![1., 2., 3., 1., 2., 3.]);
        let s = Const::i64s(vec![4, 256])
            .binary(&Const::i64s(vec![2]), Binary::Mul, &budget)
            .unwrap();
        assert_eq!(s.ints().unwrap(), vec![8, 512]);
        assert!(Const::i64s(vec![i64::MAX])
            .binary(&Const::i64s(vec![2]), Binary::Mul, &budget)
            .is_err());
    }
}
