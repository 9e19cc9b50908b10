//! Strided layouts: how a tensor's elements sit in its storage.
//!
//! Views (reshape of a contiguous tensor, permute, slice, broadcast) change only the layout;
//! [`Layout::gather_into`] materializes any layout into a contiguous buffer.

use crate::spec::{contiguous_strides, numel};

/// Shape, strides (in elements; 0 for broadcast axes) and offset into the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    /// The contiguous row-major layout of `shape`.
    pub fn contiguous(shape: Vec<usize>) -> Self {
        let strides = contiguous_strides(&shape);
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether elements are stored densely in row-major order (strides of size-1 axes ignored).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Storage position of a multi-index (unchecked: callers validate bounds).
    pub fn position(&self, index: &[usize]) -> usize {
        self.offset
            + index
                .iter()
                .zip(&self.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    /// Copies the elements in row-major order of this layout from `storage` into `out`.
    pub fn gather_into(&self, storage: &[f32], out: &mut Vec<f32>) {
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

    /// The layout of a permutation of the axes (a view).
    pub fn permuted(&self, axes: &[usize]) -> Layout {
        Layout {
            shape: axes.iter().map(|&a| self.shape[a]).collect(),
            strides: axes.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        }
    }

    /// The layout of a broadcast to `shape` (a view: broadcast axes get stride 0).
    pub fn broadcast(&self, shape: &[usize]) -> Layout {
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

    /// The layout of `start..end` along `axis` (a view).
    pub fn sliced(&self, axis: usize, start: usize, end: usize) -> Layout {
        let mut shape = self.shape.clone();
        shape[axis] = end - start;
        Layout {
            shape,
            strides: self.strides.clone(),
            offset: self.offset + start * self.strides[axis],
        }
    }
}
