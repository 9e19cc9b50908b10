//! Contiguous row-major arrays and the broadcasting helpers the specs share.

use crate::error::OpError;
use crate::scalar::Scalar;

/// A contiguous row-major array: the value type of the specification.
#[derive(Debug, Clone, PartialEq)]
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// Largest element count of any tensor, op output or intermediate size (2^34 f32 = 64 GiB).
///
/// A shape is *valid* when the product of its non-zero dims is at most this bound (see
/// [`check_shape`]): then its element count and every contiguous stride fit in `usize` with
/// room to spare, whatever the order of its dims. Larger requests are refused with a typed
/// error instead of being attempted or wrapped (docs/reliability.md, "Size limits").
pub const MAX_ELEMENTS: usize = 1 << 34;

/// Largest amount of work (multiply-adds or window taps) a payload may add on top of the
/// sizes of real tensors: a pooling op's output elements times its window's taps. The
/// window is the one loop factor that comes from a payload alone, so it is bounded here.
pub const MAX_WORK: usize = 1 << 34;

/// Number of elements of a shape (1 for the scalar shape `[]`), or `None` when the product
/// overflows `usize`. A shape with a zero dim has 0 elements, whatever its other dims.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Number of elements of a shape (1 for the scalar shape `[]`).
///
/// Exact for every valid shape (every tensor's and every op output's). For a shape whose
/// element count overflows `usize` the result saturates at `usize::MAX` — never a wrapped,
/// small value; use [`checked_numel`] or [`check_shape`] to get an error instead.
pub fn numel(shape: &[usize]) -> usize {
    checked_numel(shape).unwrap_or(usize::MAX)
}

/// The product of the non-zero dims of `shape`: the bound on its element count *and* on
/// every contiguous stride (an empty axis multiplies the strides of the axes before it by
/// 0 only in the element count). `None` on overflow.
fn extent(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Validates a shape against [`MAX_ELEMENTS`]: the product of its non-zero dims must be at
/// most the bound (so the element count and the strides fit; `(0, 2^40, 2^40)` is refused
/// like `(2^40, 2^40)`: its strides do not fit). Returns the element count. `op` names the
/// op or call that asked, for the error.
pub fn check_shape(op: &'static str, shape: &[usize]) -> Result<usize, OpError> {
    match extent(shape) {
        Some(e) if e <= MAX_ELEMENTS => Ok(numel(shape)),
        _ => Err(OpError::Shape {
            op,
            shapes: vec![shape.to_vec()],
            expected: format!(
                "at most {MAX_ELEMENTS} elements (2^34), counting an empty axis as 1 so that every stride fits"
            ),
        }),
    }
}

/// Row-major strides of a contiguous array of `shape`, or `None` when a stride overflows.
pub fn checked_contiguous_strides(shape: &[usize]) -> Option<Vec<usize>> {
    let mut strides = vec![0; shape.len()];
    let mut acc: usize = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        if i > 0 {
            acc = acc.checked_mul(shape[i])?;
        }
    }
    Some(strides)
}

/// Row-major strides of a contiguous array of `shape`.
///
/// Exact for every valid shape ([`check_shape`]). For a shape whose strides overflow, the
/// strides saturate at `usize::MAX` (never a wrapped value that would alias other elements);
/// use [`checked_contiguous_strides`] to get `None` instead.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc: usize = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
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
    ///
    /// # Panics
    /// Like `vec!`, when the shape's element count does not fit in memory (the spec's
    /// entry points only build arrays of shapes [`check_shape`] accepted).
    pub fn zeros(shape: &[usize]) -> Self {
        Array {
            shape: shape.to_vec(),
            data: vec![T::zero(); numel(shape)],
        }
    }

    /// An array whose flat element `i` is `f(i)`.
    ///
    /// # Panics
    /// Like [`Array::zeros`], when the element count does not fit in memory.
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

/// Checks arrays an op is given: each shape valid ([`check_shape`]) and each holding exactly
/// its shape's element count. An [`Array`]'s fields are public, so one built by hand may
/// disagree with itself; the spec's entry points check before any element is indexed.
pub(crate) fn check_arrays<T>(op: &'static str, arrays: &[&Array<T>]) -> Result<(), OpError> {
    for a in arrays {
        let n = check_shape(op, &a.shape)?;
        if n != a.data.len() {
            return Err(OpError::Shape {
                op,
                shapes: vec![a.shape.clone()],
                expected: format!(
                    "an array of {n} elements (its shape's count), got {} elements of data",
                    a.data.len()
                ),
            });
        }
    }
    Ok(())
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
pub(crate) fn reduce_to<T: Scalar>(g: &Array<T>, shape: &[usize]) -> Array<T> {
    if g.shape == shape {
        return g.clone();
    }
    let mut out = super::sum::Sums::new(shape.iter().product());
    for (i, src) in broadcast_source_index(shape, &g.shape)
        .into_iter()
        .enumerate()
    {
        out.add(src, g.data[i]);
    }
    out.into_array(shape)
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
