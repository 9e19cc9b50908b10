//! A batch of matrices read where it lies: the operands of the attention kernels.
//!
//! A tensor of shape `[..batch, rows, width]` is a stack of row-major matrices. When its last
//! axis is dense (stride 1) every row is a contiguous run of `width` floats, wherever the
//! rows and the batch matrices sit in the storage: a head of a permuted `[B, T, H, D]`
//! projection, a third of a fused q/k/v projection, a mask broadcast over heads. [`Operand`]
//! reads such a tensor in place (batch matrix `bi`'s row `i` at `offsets[bi] + i·rs`), so
//! the attention kernels need no copy to split heads; any other layout (a transposed last
//! axis, rows repeated by a zero stride, a device tensor) is gathered once into a dense
//! copy and read the same way.
//!
//! Owns: the addressing of one operand. Must not know what the kernels compute.

use super::par::Mat;
use crate::backend::Device;
use crate::tensor::Tensor;
use std::borrow::Cow;

/// A `[..batch, rows, width]` tensor as `batch` matrices of `rows` × `width`.
pub(super) struct Operand<'a> {
    data: Cow<'a, [f32]>,
    /// Where each batch matrix's first row starts in `data`.
    offsets: Vec<usize>,
    /// The distance between consecutive rows.
    rs: usize,
    rows: usize,
    width: usize,
}

impl<'a> Operand<'a> {
    /// Reads `t` (rank ≥ 2) in place when its rows are contiguous runs in host memory, else a
    /// dense copy of it. A tensor of rank < 2 is read as one matrix of one row.
    pub(super) fn new(t: &'a Tensor) -> Operand<'a> {
        Operand::read(t, false)
    }

    /// As [`Operand::new`], for an operand read only row by row ([`Operand::row`], never as
    /// a product operand): rows repeated by a zero stride (a mask broadcast over query rows)
    /// are read in place too.
    pub(super) fn rows_only(t: &'a Tensor) -> Operand<'a> {
        Operand::read(t, true)
    }

    fn read(t: &'a Tensor, repeated_rows: bool) -> Operand<'a> {
        let shape = t.shape();
        let r = shape.len();
        let width = shape.last().copied().unwrap_or(1);
        let rows = if r >= 2 { shape[r - 2] } else { 1 };
        let batch: usize = shape[..r.saturating_sub(2)].iter().product();
        let layout = t.layout();
        let strides = &layout.strides;
        let dense_rows = r >= 2 && (width <= 1 || strides[r - 1] == 1);
        // a zero row stride (rows broadcast) would hand the product kernels aliased rows
        let distinct_rows = r >= 2 && (repeated_rows || rows <= 1 || strides[r - 2] != 0);
        if t.device() == Device::Cpu && dense_rows && distinct_rows && t.numel() > 0 {
            let batch_shape = &shape[..r - 2];
            let batch_strides = &strides[..r - 2];
            let offsets = (0..batch)
                .map(|bi| {
                    // unravel bi over the batch axes (row-major) and sum index × stride
                    let mut rest = bi;
                    let mut at = layout.offset;
                    for (&n, &st) in batch_shape.iter().zip(batch_strides).rev() {
                        at += (rest % n) * st;
                        rest /= n;
                    }
                    at
                })
                .collect();
            return Operand {
                data: Cow::Borrowed(t.storage_slice()),
                offsets,
                rs: if rows <= 1 { width } else { strides[r - 2] },
                rows,
                width,
            };
        }
        Operand {
            data: t.host_data(),
            offsets: (0..batch).map(|bi| bi * rows * width).collect(),
            rs: width,
            rows,
            width,
        }
    }

    /// Batch matrix `bi`.
    pub(super) fn matrix(&self, bi: usize) -> Rows<'_> {
        Rows {
            data: self.data.get(self.offsets[bi]..).unwrap_or(&[]),
            rs: self.rs,
            width: self.width,
        }
    }

    /// Row `i` of batch matrix `bi`.
    pub(super) fn row(&self, bi: usize, i: usize) -> &[f32] {
        self.matrix(bi).row(i)
    }

    /// Whether every element of batch matrix `bi` is finite.
    pub(super) fn finite(&self, bi: usize) -> bool {
        let m = self.matrix(bi);
        (0..self.rows).all(|i| super::vmath::all_finite(m.row(i)))
    }

    /// Batch matrix `bi` as a dense row-major slice, borrowed when its rows lie back to back
    /// and no row is to be zeroed, else a copy with the rows where `zero` holds set to zeros.
    pub(super) fn dense_or_zeroing(&self, bi: usize, zero: &[bool]) -> Cow<'_, [f32]> {
        let n = self.rows * self.width;
        let back_to_back = self.rows <= 1 || self.rs == self.width;
        match self.data.get(self.offsets[bi]..self.offsets[bi] + n) {
            Some(d) if back_to_back && !zero.iter().any(|&z| z) => Cow::Borrowed(d),
            _ => Cow::Owned(self.dense_zeroing(bi, zero)),
        }
    }

    /// Batch matrix `bi` as a dense row-major copy with the rows where `zero` holds set to
    /// zeros.
    pub(super) fn dense_zeroing(&self, bi: usize, zero: &[bool]) -> Vec<f32> {
        let m = self.matrix(bi);
        let mut out = Vec::with_capacity(self.rows * self.width);
        for i in 0..self.rows {
            if zero.get(i).copied().unwrap_or(false) {
                out.extend(std::iter::repeat_n(0.0, self.width));
            } else {
                out.extend_from_slice(m.row(i));
            }
        }
        out
    }
}

/// One matrix of an [`Operand`] (or a dense buffer): row `i` is `data[i·rs..][..width]`.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    data: &'a [f32],
    rs: usize,
    width: usize,
}

impl<'a> Rows<'a> {
    /// A dense row-major matrix of rows `width` wide.
    pub(super) fn dense(data: &'a [f32], width: usize) -> Rows<'a> {
        Rows {
            data,
            rs: width,
            width,
        }
    }

    /// The storage from row `row` on (empty past the end: only a product with a zero
    /// extent reads it then).
    fn rows_from(&self, row: usize) -> &'a [f32] {
        self.data.get(row * self.rs..).unwrap_or(&[])
    }

    /// Rows `row..` as a matrix operand (rows × width).
    pub(super) fn mat(&self, row: usize) -> Mat<'a> {
        Mat {
            data: self.rows_from(row),
            rs: self.rs,
            cs: 1,
        }
    }

    /// The transpose of rows `row..` (read as width × rows).
    pub(super) fn mat_t(&self, row: usize) -> Mat<'a> {
        Mat {
            data: self.rows_from(row),
            rs: 1,
            cs: self.rs,
        }
    }

    /// Rows `row..` as a matrix of their own.
    pub(super) fn rows_on(&self, row: usize) -> Rows<'a> {
        Rows {
            data: self.rows_from(row),
            rs: self.rs,
            width: self.width,
        }
    }

    /// Row `i`.
    pub(super) fn row(&self, i: usize) -> &'a [f32] {
        &self.rows_from(i)[..self.width]
    }
}
