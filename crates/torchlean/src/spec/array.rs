//! Contiguous row-major arrays and the broadcasting helpers the specs share.

use crate::error::OpError;
use crate::scalar::Scalar;

/// A contiguous row-major array: the value type of the specification.
#[derive(Debug, Clone, PartialEq)]
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// Number of elements of a shape (1 for the scalar shape `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of a contiguous array of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d;
    }
    strides
}

impl<T: Scalar> Array<T> {
    /// Builds an array, checking that `data` has exactly `numel(shape)` elements.
    pub fn from_vec(shape: Vec<usize>, data: Vec<T>) -> Result<Self, OpError> {
        if numel(&shape) != data.len() {
            return Err(OpError::Shape {
                op: "array",
                shapes: vec![shape.clone()],
                expected: format!("{} elements of data, got {}", numel(&shape), data.len()),
            });
        }
        Ok(Array { shape, data })
    }

    /// An array of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Array {
            shape: shape.to_vec(),
            data: vec![T::zero(); numel(shape)],
        }
    }

    /// An array whose flat element `i` is `f(i)`.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> T) -> Self {
        Array {
            shape: shape.to_vec(),
            data: (0..numel(shape)).map(f).collect(),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Converts every element to another scalar type.
    pub fn cast<U: Scalar>(&self) -> Array<U> {
        Array {
            shape: self.shape.clone(),
            data: self.data.iter().map(|v| U::c(v.f64())).collect(),
        }
    }

    /// Same data, another shape of equal size (internal use: sizes are known to agree).
    pub(crate) fn reshaped(mut self, shape: &[usize]) -> Self {
        debug_assert_eq!(numel(shape), self.data.len());
        self.shape = shape.to_vec();
        self
    }
}

/// NumPy broadcasting of two shapes, or `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// For every flat index of `out_shape`, the flat index of the broadcast source of `in_shape`.
pub(crate) fn broadcast_source_index(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let offset = out_shape.len() - in_shape.len();
    let in_strides = contiguous_strides(in_shape);
    let mut map = Vec::with_capacity(numel(out_shape));
    let mut idx = vec![0usize; out_shape.len()];
    for _ in 0..numel(out_shape) {
        let mut src = 0;
        for (d, &i) in idx.iter().enumerate().skip(offset) {
            if in_shape[d - offset] != 1 {
                src += i * in_strides[d - offset];
            }
        }
        map.push(src);
        // advance the multi-index
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    map
}

/// Sums `g` (of a broadcast shape) back down to `shape`: the VJP of broadcasting.
pub fn reduce_to<T: Scalar>(g: &Array<T>, shape: &[usize]) -> Array<T> {
    if g.shape == shape {
        return g.clone();
    }
    let mut out = Array::zeros(shape);
    for (i, src) in broadcast_source_index(shape, &g.shape)
        .into_iter()
        .enumerate()
    {
        out.data[src] += g.data[i];
    }
    out
}

/// Broadcasts `a` to `shape` (which must be a valid broadcast target).
pub(crate) fn broadcast_to<T: Scalar>(a: &Array<T>, shape: &[usize]) -> Array<T> {
    if a.shape == shape {
        return a.clone();
    }
    let data = broadcast_source_index(&a.shape, shape)
        .into_iter()
        .map(|s| a.data[s])
        .collect();
    Array {
        shape: shape.to_vec(),
        data,
    }
}

/// Splits `shape` around `axis` into (outer, dim, inner) element counts.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = numel(&shape[..axis]);
    let inner = numel(&shape[axis + 1..]);
    (outer, shape[axis], inner)
}
