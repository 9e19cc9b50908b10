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

    /// Decodes an initializer or a `Constant` node's tensor. Element counts are checked
    /// against the dims before anything is allocated; external data and data types without
    /// an f32, i64 or bool reading are refused.
    pub fn from_proto(t: &TensorProto) -> Fold<Const> {
        if !t.external_data.is_empty() || t.data_location.value() == 1 {
            return Err("the tensor's data is stored outside the model file (external data); re-export with external_data=False".into());
        }
        let dims = sizes(&t.dims)?;
        let n = numel(&dims)?;
        let raw = &t.raw_data;
        let width = match t.data_type {
            dtype::FLOAT | dtype::INT32 => 4,
            dtype::INT64 | dtype::DOUBLE => 8,
            dtype::BOOL => 1,
            other => {
                return Err(format!(
                    "{} tensors are not supported (float32, float64, int32, int64 and bool are)",
                    dtype::name(other)
                ))
            }
        };
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
        let data = match t.data_type {
            dtype::FLOAT if raw.is_empty() => Data::F32(t.float_data.clone()),
            dtype::FLOAT => Data::F32(
                chunks(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            dtype::DOUBLE if raw.is_empty() => {
                Data::F32(t.double_data.iter().map(|&v| v as f32).collect())
            }
            dtype::DOUBLE => Data::F32(
                chunks(8)
                    .map(|c| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(c);
                        f64::from_le_bytes(b) as f32
                    })
                    .collect(),
            ),
            dtype::INT64 if raw.is_empty() => Data::I64(t.int64_data.clone()),
            dtype::INT64 => Data::I64(
                chunks(8)
                    .map(|c| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(c);
                        i64::from_le_bytes(b)
                    })
                    .collect(),
            ),
            dtype::INT32 if raw.is_empty() => {
                Data::I64(t.int32_data.iter().map(|&v| v as i64).collect())
            }
            dtype::INT32 => Data::I64(
                chunks(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                    .collect(),
            ),
            dtype::BOOL if raw.is_empty() => {
                Data::Bool(t.int32_data.iter().map(|&v| v != 0).collect())
            }
            _ => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
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

    /// The single element of a one-element constant, as f32.
    pub fn scalar(&self) -> Option<f32> {
        (self.len() == 1).then(|| self.floats()[0])
    }

    fn same_kind(&self, data: Data, dims: Vec<usize>) -> Const {
        Const { dims, data }
    }

    /// Picks elements by flat index (the common core of gather, slice, transpose, expand).
    fn pick(&self, index: &[usize], dims: Vec<usize>) -> Const {
        let data = match &self.data {
            Data::F32(v) => Data::F32(index.iter().map(|&i| v[i]).collect()),
            Data::I64(v) => Data::I64(index.iter().map(|&i| v[i]).collect()),
            Data::Bool(v) => Data::Bool(index.iter().map(|&i| v[i]).collect()),
        };
        self.same_kind(data, dims)
    }

    pub fn reshaped(&self, dims: Vec<usize>) -> Fold<Const> {
        if numel(&dims)? != self.len() {
            return Err(format!(
                "cannot reshape {} elements to {dims:?}",
                self.len()
            ));
        }
        Ok(Const {
            dims,
            data: self.data.clone(),
        })
    }

    /// Converts to an ONNX data type (`Cast`).
    pub fn cast(&self, to: i32) -> Fold<Const> {
        let data = match to {
            dtype::FLOAT | dtype::DOUBLE => Data::F32(self.floats()),
            dtype::INT64 | dtype::INT32 => Data::I64(match &self.data {
                Data::F32(v) => v.iter().map(|&x| x.trunc() as i64).collect(),
                _ => self.ints()?,
            }),
            dtype::BOOL => Data::Bool(self.floats().iter().map(|&x| x != 0.0).collect()),
            other => return Err(format!("cast to {} is not supported", dtype::name(other))),
        };
        Ok(self.same_kind(data, self.dims.clone()))
    }

    /// Concatenation along `axis` (all parts of one kind).
    pub fn concat(parts: &[&Const], axis: usize) -> Fold<Const> {
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
        dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
        let floats = parts.iter().any(|p| matches!(p.data, Data::F32(_)));
        let mut f = vec![];
        let mut i = vec![];
        for o in 0..outer {
            for p in parts {
                let run = p.dims[axis] * inner;
                if floats {
                    f.extend_from_slice(&p.floats()[o * run..(o + 1) * run]);
                } else {
                    i.extend_from_slice(&p.ints()?[o * run..(o + 1) * run]);
                }
            }
        }
        Ok(Const {
            dims,
            data: if floats { Data::F32(f) } else { Data::I64(i) },
        })
    }

    /// `Gather` along `axis` with integer indices (negative ones count from the end).
    pub fn gather(&self, axis: usize, index: &Const) -> Fold<Const> {
        let rank = self.dims.len();
        if axis >= rank {
            return Err(format!("Gather axis {axis} of a rank-{rank} tensor"));
        }
        let n = self.dims[axis];
        let idx = index
            .ints()?
            .into_iter()
            .map(|i| normalize_index(i, n))
            .collect::<Fold<Vec<usize>>>()?;
        let outer: usize = self.dims[..axis].iter().product();
        let inner: usize = self.dims[axis + 1..].iter().product();
        let mut flat = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &k in &idx {
                flat.extend((0..inner).map(|i| (o * n + k) * inner + i));
            }
        }
        let mut dims = self.dims[..axis].to_vec();
        dims.extend_from_slice(&index.dims);
        dims.extend_from_slice(&self.dims[axis + 1..]);
        Ok(self.pick(&flat, dims))
    }

    /// `Slice` with per-axis (start, end, step), already clamped by [`slice_range`].
    pub fn slice(&self, ranges: &[(usize, Vec<usize>)]) -> Const {
        let mut kept: Vec<Vec<usize>> = self.dims.iter().map(|&d| (0..d).collect()).collect();
        for (axis, keep) in ranges {
            kept[*axis] = keep.clone();
        }
        let dims: Vec<usize> = kept.iter().map(|k| k.len()).collect();
        let strides = strides(&self.dims);
        let mut flat = vec![0usize];
        for (a, keep) in kept.iter().enumerate() {
            let stride = strides[a];
            flat = flat
                .iter()
                .flat_map(|&base| keep.iter().map(move |&k| base + k * stride))
                .collect();
        }
        self.pick(&flat, dims)
    }

    /// Axis permutation (`perm` a permutation of the axes, checked by the caller).
    pub fn transpose(&self, perm: &[usize]) -> Const {
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        let src = strides(&self.dims);
        let mut flat = vec![0usize];
        for &p in perm {
            let stride = src[p];
            flat = flat
                .iter()
                .flat_map(|&base| (0..self.dims[p]).map(move |k| base + k * stride))
                .collect();
        }
        self.pick(&flat, dims)
    }

    /// Broadcast to `dims` (which must be a broadcast of this shape).
    pub fn broadcast(&self, dims: &[usize]) -> Fold<Const> {
        numel(dims)?;
        if broadcast_shapes(&self.dims, dims)? != dims {
            return Err(format!("{:?} does not broadcast to {dims:?}", self.dims));
        }
        let offset = dims.len() - self.dims.len();
        let src = strides(&self.dims);
        let mut flat = vec![0usize];
        for (a, &d) in dims.iter().enumerate() {
            let (size, stride) = if a < offset {
                (1, 0)
            } else {
                (self.dims[a - offset], src[a - offset])
            };
            let stride = if size == 1 { 0 } else { stride };
            flat = flat
                .iter()
                .flat_map(|&base| (0..d).map(move |k| base + k * stride))
                .collect();
        }
        Ok(self.pick(&flat, dims.to_vec()))
    }

    /// An elementwise binary op with NumPy broadcasting: floats if either side is float,
    /// else integers (checked), with bool results for comparisons.
    pub fn binary(&self, other: &Const, op: Binary) -> Fold<Const> {
        let dims = broadcast_shapes(&self.dims, &other.dims)?;
        let a = self.broadcast(&dims)?;
        let b = other.broadcast(&dims)?;
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
                        p.checked_div(q)
                            .ok_or("integer division by zero at import time".to_string())
                    })
                    .collect::<Fold<_>>()?,
                ),
                Binary::Equal => Data::Bool(z.map(|(p, q)| p == q).collect()),
                Binary::Less => Data::Bool(z.map(|(p, q)| p < q).collect()),
                Binary::Greater => Data::Bool(z.map(|(p, q)| p > q).collect()),
            }
        };
        Ok(Const { dims, data })
    }

    /// A float map (`Sqrt`, `Neg`, `Reciprocal`, ...) or an integer one where defined.
    pub fn map(&self, f32_op: fn(f32) -> f32, i64_op: Option<fn(i64) -> i64>) -> Const {
        let data = match (&self.data, i64_op) {
            (Data::I64(v), Some(g)) => Data::I64(v.iter().map(|&x| g(x)).collect()),
            _ => Data::F32(self.floats().into_iter().map(f32_op).collect()),
        };
        self.same_kind(data, self.dims.clone())
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

/// The indices ONNX `Slice` keeps on an axis of length `n` (starts and ends clamped as the
/// operator specifies, any non-zero step).
pub fn slice_range(start: i64, end: i64, step: i64, n: usize) -> Fold<Vec<usize>> {
    if step == 0 {
        return Err("Slice with step 0".into());
    }
    let n = n as i64;
    let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
    let fix = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
    let mut out = vec![];
    if step > 0 {
        let (s, e) = (clamp(fix(start), 0, n), clamp(fix(end), 0, n));
        let mut i = s;
        while i < e {
            out.push(i as usize);
            i += step;
        }
    } else {
        let (s, e) = (clamp(fix(start), -1, n - 1), clamp(fix(end), -1, n - 1));
        let mut i = s;
        while i > e {
            out.push(i as usize);
            i += step;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_ranges_follow_the_onnx_clamping_rules() {
        assert_eq!(slice_range(0, i64::MAX, 1, 4).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(slice_range(-1, i64::MAX, 1, 4).unwrap(), vec![3]);
        assert_eq!(slice_range(i64::MIN, -2, 1, 4).unwrap(), vec![0, 1]);
        assert_eq!(slice_range(-1, i64::MIN, -1, 4).unwrap(), vec![3, 2, 1, 0]);
        assert_eq!(slice_range(1, 4, 2, 4).unwrap(), vec![1, 3]);
        assert!(slice_range(0, 1, 0, 4).is_err());
    }

    #[test]
    fn constants_gather_transpose_and_broadcast_like_numpy() {
        let t = Const::f32(vec![2, 3], vec![0., 1., 2., 3., 4., 5.]);
        let g = t
            .gather(
                1,
                &Const {
                    dims: vec![],
                    data: Data::I64(vec![-1]),
                },
            )
            .unwrap();
        assert_eq!((g.dims.clone(), g.floats()), (vec![2], vec![2., 5.]));
        let tr = t.transpose(&[1, 0]);
        assert_eq!(tr.floats(), vec![0., 3., 1., 4., 2., 5.]);
        let b = Const::f32(vec![3], vec![1., 2., 3.])
            .broadcast(&[2, 3])
            .unwrap();
        assert_eq!(b.floats(), vec![1., 2., 3., 1., 2., 3.]);
        let s = Const::i64s(vec![4, 256])
            .binary(&Const::i64s(vec![2]), Binary::Mul)
            .unwrap();
        assert_eq!(s.ints().unwrap(), vec![8, 512]);
        assert!(Const::i64s(vec![i64::MAX])
            .binary(&Const::i64s(vec![2]), Binary::Mul)
            .is_err());
    }
}
