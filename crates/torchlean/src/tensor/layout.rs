//! Strided layouts: how a tensor's elements sit in its storage.
//!
//! Views (reshape of a contiguous tensor, permute, slice, broadcast) change only the layout;
//! [`Layout::gather_into`] materializes any layout into a contiguous buffer.
//!
//! The public methods check their arguments (ranks, axes, bounds, sizes) and return a typed
//! error instead of indexing out of bounds, underflowing or wrapping. The runtime's own
//! callers, whose arguments the op's shape rule has already validated, use the crate-private
//! unchecked forms.

use crate::error::OpError;
use crate::spec::{check_shape, contiguous_strides, numel};

/// Shape, strides (in elements; 0 for broadcast axes) and offset into the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    /// The contiguous row-major layout of `shape`.
    ///
    /// For a valid shape (every tensor's; see [`crate::spec::check_shape`]). The strides of a
    /// shape beyond the size limit saturate instead of wrapping, and [`Layout::validate`]
    /// refuses the result; [`Layout::try_contiguous`] reports the error up front.
    pub fn contiguous(shape: Vec<usize>) -> Self {
        let strides = contiguous_strides(&shape);
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    /// The contiguous row-major layout of `shape`, or an error when the shape exceeds the
    /// size limit or its strides overflow (e.g. `(0, 2^40, 2^40)`).
    pub fn try_contiguous(shape: Vec<usize>) -> Result<Self, OpError> {
        check_shape("layout", &shape)?;
        Ok(Layout::contiguous(shape))
    }

    /// Number of elements (saturating at `usize::MAX` for a shape beyond the size limit).
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether elements are stored densely in row-major order (strides of size-1 axes ignored).
    pub fn is_contiguous(&self) -> bool {
        if self.shape.len() != self.strides.len() {
            return false;
        }
        let mut expected: usize = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            // a product that overflows belongs to no valid layout (checked, never wrapped)
            match expected.checked_mul(d) {
                Some(e) => expected = e,
                None => return false,
            }
        }
        true
    }

    /// Whether this layout stores every element of its shape exactly once from offset 0 over
    /// a storage of `storage_len` elements, its axes in some order (row-major, or a
    /// permutation of it: a head-interleaved attention tensor). Strides of size-1 axes are
    /// ignored.
    pub fn is_dense_in(&self, storage_len: usize) -> bool {
        if self.shape.len() != self.strides.len() || self.offset != 0 {
            return false;
        }
        let mut axes: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d > 1)
            .map(|(&d, &s)| (s, d))
            .collect();
        axes.sort_unstable();
        let mut expected = 1usize;
        for (s, d) in axes {
            if s != expected {
                return false;
            }
            match expected.checked_mul(d) {
                Some(e) => expected = e,
                None => return false,
            }
        }
        expected == storage_len && self.numel() == storage_len
    }

    /// Checks that this layout is well formed over a storage of `storage_len` elements:
    /// shape and strides of equal rank, a valid shape, and every element's position (computed
    /// without overflow) inside the storage.
    pub fn validate(&self, storage_len: usize) -> Result<(), OpError> {
        let err = |expected: String| OpError::Shape {
            op: "layout",
            shapes: vec![self.shape.clone(), self.strides.clone()],
            expected,
        };
        if self.shape.len() != self.strides.len() {
            return Err(err("strides of the shape's rank".into()));
        }
        check_shape("layout", &self.shape)?;
        match self.last_position() {
            None => Ok(()), // no elements: nothing is read
            Some(Some(last)) if last < storage_len => Ok(()),
            Some(_) => Err(err(format!(
                "offset {} and strides that keep every element inside a storage of {storage_len} elements",
                self.offset
            ))),
        }
    }

    /// The largest storage position of any element: `None` without elements, `Some(None)`
    /// when it overflows.
    fn last_position(&self) -> Option<Option<usize>> {
        if self.shape.contains(&0) {
            return None;
        }
        Some(
            self.shape
                .iter()
                .zip(&self.strides)
                .try_fold(self.offset, |acc, (&d, &s)| {
                    (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
                }),
        )
    }

    /// Storage position of a multi-index, or `None` when the index has the wrong rank, is
    /// out of bounds, or its position overflows.
    pub fn try_position(&self, index: &[usize]) -> Option<usize> {
        if index.len() != self.shape.len()
            || self.strides.len() != self.shape.len()
            || index.iter().zip(&self.shape).any(|(i, d)| i >= d)
        {
            return None;
        }
        index
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&i, &s)| {
                i.checked_mul(s).and_then(|x| acc.checked_add(x))
            })
    }

    /// Storage position of a multi-index (unchecked: for runtime code whose indices are in
    /// bounds of a layout that fits its storage).
    pub(crate) fn position(&self, index: &[usize]) -> usize {
        self.offset
            + index
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    /// Copies the elements in row-major order of this layout from `storage` into `out`, or
    /// refuses a layout that does not fit `storage` ([`Layout::validate`]).
    pub fn gather_into(&self, storage: &[f32], out: &mut Vec<f32>) -> Result<(), OpError> {
        self.validate(storage.len())?;
        self.gather_into_unchecked(storage, out);
        Ok(())
    }

    /// [`Layout::gather_into`] for a tensor's own layout, which fits its storage by
    /// construction.
    pub(crate) fn gather_into_unchecked(&self, storage: &[f32], out: &mut Vec<f32>) {
        let n = self.numel();
        out.reserve(n);
        if n == 0 {
            return;
        }
        if self.is_contiguous() {
            out.extend_from_slice(&storage[self.offset..self.offset + n]);
            return;
        }
        let rank = self.shape.len();
        let (last, last_stride) = (self.shape[rank - 1], self.strides[rank - 1]);
        let rows = n / last;
        let mut idx = vec![0usize; rank - 1];
        for _ in 0..rows {
            let base = self.offset
                + idx
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            if last_stride == 1 {
                out.extend_from_slice(&storage[base..base + last]);
            } else {
                out.extend((0..last).map(|j| storage[base + j * last_stride]));
            }
            for d in (0..rank - 1).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// The layout of a permutation of the axes (a view), or an error when `axes` is not a
    /// permutation of `0..rank`.
    pub fn try_permuted(&self, axes: &[usize]) -> Result<Layout, OpError> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        if axes.len() != rank
            || self.strides.len() != rank
            || axes
                .iter()
                .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
        {
            return Err(OpError::Payload {
                op: "permute",
                reason: format!(
                    "axes {axes:?} are not a permutation of 0..{rank} for shape {:?}",
                    self.shape
                ),
            });
        }
        Ok(self.permuted(axes))
    }

    /// [`Layout::try_permuted`] for axes the shape rule has validated.
    pub(crate) fn permuted(&self, axes: &[usize]) -> Layout {
        Layout {
            shape: axes.iter().map(|&a| self.shape[a]).collect(),
            strides: axes.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        }
    }

    /// The layout of a reshape to `shape` (same element count) as a view of the same
    /// storage, when one exists: each run of axes that are contiguous with one another may be
    /// split or merged (PyTorch's `view` rule); `None` when the reshape needs a copy (e.g.
    /// merging the axes of a transposed matrix). Splitting the last axis of a slice of a
    /// fused projection into heads is a view.
    pub(crate) fn reshaped(&self, shape: &[usize]) -> Option<Layout> {
        if numel(shape) != self.numel() || self.strides.len() != self.shape.len() {
            return None;
        }
        if self.numel() == 0 || self.is_contiguous() {
            return Some(Layout {
                offset: self.offset,
                ..Layout::contiguous(shape.to_vec())
            });
        }
        let (old, old_strides) = (&self.shape, &self.strides);
        let mut strides = vec![0usize; shape.len()];
        // walk the old axes from the last, closing a chunk where the next axis up is not
        // contiguous with it; the new axes of that chunk take strides inside it
        let mut view_d = shape.len();
        let mut chunk_base = *old_strides.last()?;
        let (mut old_count, mut new_count) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            old_count *= old[d];
            let chunk_ends =
                d == 0 || (old[d - 1] != 1 && old_strides[d - 1] != old_count * chunk_base);
            if chunk_ends {
                while view_d > 0 && (new_count < old_count || shape[view_d - 1] == 1) {
                    strides[view_d - 1] = new_count * chunk_base;
                    new_count *= shape[view_d - 1];
                    view_d -= 1;
                }
                if new_count != old_count {
                    return None;
                }
                if d > 0 {
                    chunk_base = old_strides[d - 1];
                    old_count = 1;
                    new_count = 1;
                }
            }
        }
        (view_d == 0).then(|| Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// The layout of a broadcast to `shape` (a view: broadcast axes get stride 0), or an
    /// error when this layout does not broadcast to `shape` (NumPy rules) or the target is
    /// beyond the size limit.
    pub fn try_broadcast(&self, shape: &[usize]) -> Result<Layout, OpError> {
        let fits = self.strides.len() == self.shape.len()
            && crate::spec::broadcast_shapes(&self.shape, shape).as_deref() == Some(shape);
        if !fits {
            return Err(OpError::Shape {
                op: "broadcast_to",
                shapes: vec![self.shape.clone()],
                expected: format!("a shape that broadcasts to {shape:?}"),
            });
        }
        check_shape("broadcast_to", shape)?;
        Ok(self.broadcast(shape))
    }

    /// [`Layout::try_broadcast`] for a target the shape rule has validated.
    pub(crate) fn broadcast(&self, shape: &[usize]) -> Layout {
        let extra = shape.len() - self.shape.len();
        let mut strides = vec![0; shape.len()];
        for d in 0..self.shape.len() {
            strides[d + extra] = if self.shape[d] == 1 && shape[d + extra] != 1 {
                0
            } else {
                self.strides[d]
            };
        }
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    /// The layout of `start..end` along `axis` (a view), or an error unless
    /// `axis < rank` and `start <= end <= size of axis` (and the new offset fits).
    pub fn try_sliced(&self, axis: usize, start: usize, end: usize) -> Result<Layout, OpError> {
        let ok = axis < self.shape.len()
            && self.strides.len() == self.shape.len()
            && start <= end
            && end <= self.shape[axis]
            && start
                .checked_mul(self.strides[axis])
                .and_then(|x| x.checked_add(self.offset))
                .is_some();
        if !ok {
            return Err(OpError::Shape {
                op: "slice",
                shapes: vec![self.shape.clone()],
                expected: format!("axis {axis} to exist with {start} <= {end} <= its size"),
            });
        }
        Ok(self.sliced(axis, start, end))
    }

    /// [`Layout::try_sliced`] for a range the shape rule has validated.
    pub(crate) fn sliced(&self, axis: usize, start: usize, end: usize) -> Layout {
        let mut shape = self.shape.clone();
        shape[axis] = end - start;
        Layout {
            shape,
            strides: self.strides.clone(),
            offset: self.offset + start * self.strides[axis],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Layout;

    #[test]
    fn dense_layouts_store_every_element_once_from_offset_zero() {
        let l = |shape: &[usize], strides: &[usize], offset| Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        };
        assert!(l(&[2, 3, 4], &[12, 4, 1], 0).is_dense_in(24));
        assert!(
            l(&[2, 3, 4], &[12, 1, 3], 0).is_dense_in(24),
            "axes 1, 2 swapped"
        );
        assert!(
            l(&[2, 1, 4], &[4, 99, 1], 0).is_dense_in(8),
            "size-1 stride ignored"
        );
        assert!(!l(&[2, 3, 4], &[12, 4, 1], 1).is_dense_in(25), "offset");
        assert!(
            !l(&[2, 3, 4], &[12, 4, 1], 0).is_dense_in(30),
            "longer storage"
        );
        assert!(!l(&[2, 3, 4], &[24, 4, 1], 0).is_dense_in(48), "a gap");
        assert!(!l(&[2, 3, 4], &[12, 3, 1], 0).is_dense_in(24), "overlap");
        assert!(
            !l(&[2, 3, 4], &[4, 4, 1], 0).is_dense_in(24),
            "one stride twice"
        );
    }

    fn gather(l: &Layout, storage: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        l.gather_into(storage, &mut out).unwrap();
        out
    }

    /// Every reshape that `reshaped` calls a view reads, in row-major order, exactly the
    /// elements of the source in row-major order (the meaning of a reshape), over views
    /// made by permutes and slices of a few storages and every factorization of their sizes
    /// tried; and the views it must find are found.
    #[test]
    fn a_reshape_view_reads_the_elements_in_row_major_order() {
        let storage: Vec<f32> = (0..720).map(|v| v as f32).collect();
        let base = Layout::contiguous(vec![4, 5, 6, 6]);
        let mut sources = vec![base.clone()];
        for axes in [[0, 2, 1, 3], [3, 2, 1, 0], [1, 0, 2, 3], [0, 1, 3, 2]] {
            sources.push(base.permuted(&axes));
        }
        for axis in 0..4 {
            sources.push(base.sliced(axis, 1, 3));
            sources.push(base.permuted(&[0, 2, 1, 3]).sliced(axis, 0, 2));
        }
        sources.push(base.sliced(3, 2, 4).permuted(&[1, 0, 2, 3]));
        let targets = |n: usize| -> Vec<Vec<usize>> {
            let mut out = vec![vec![n], vec![1, n], vec![n, 1]];
            for a in 1..=n {
                if n % a == 0 {
                    out.push(vec![a, n / a]);
                    for b in 1..=n / a {
                        if (n / a) % b == 0 {
                            out.push(vec![a, b, n / a / b]);
                            out.push(vec![a, 1, b, n / a / b]);
                        }
                    }
                }
            }
            out
        };
        let mut views = 0;
        for src in &sources {
            let want = gather(src, &storage);
            for shape in targets(src.numel()) {
                if let Some(l) = src.reshaped(&shape) {
                    assert_eq!(l.shape, shape);
                    assert_eq!(gather(&l, &storage), want, "{src:?} -> {shape:?}");
                    views += 1;
                }
            }
        }
        assert!(views > 100, "only {views} views");
        // splitting the last axis of a slice (heads of a fused projection) is a view ...
        let qkv = Layout::contiguous(vec![2, 3, 12]).sliced(2, 4, 8);
        let heads = qkv.reshaped(&[2, 3, 2, 2]).expect("a view");
        assert_eq!(heads.strides, vec![36, 12, 2, 1]);
        assert_eq!(heads.offset, 4);
        // ... merging the axes of a transpose is not
        let t = Layout::contiguous(vec![3, 4]).permuted(&[1, 0]);
        assert!(t.reshaped(&[12]).is_none());
        assert!(t.reshaped(&[4, 3, 1]).is_some());
    }
}
