//! The recompute check of [`super::recompute`] for ops that only move data (`reshape`,
//! `permute`, `slice`, `broadcast_to`), done exactly at f32.
//!
//! The spec of such an op copies elements: every output element is one input element, and
//! the spec's VJP (for `reshape`, `permute` and `slice`) places every cotangent element in
//! one gradient position, zeros elsewhere. A value converted to f64 and back is unchanged, so
//! a kernel result that equals the moved elements exactly (NaN where the moved value is NaN)
//! is what the whole-call check accepts at zero error. This module compares exactly and
//! answers `Some(Ok(()))` only then; anything else answers `None`, and the caller runs the
//! whole-call check, which decides and names the element.
//!
//! The expected elements are read through the view layout that the op defines on its
//! input's own layout (computed here from the op's definition, not taken from the tensor
//! code under check). When the kernel returned a view of its input's very storage with
//! exactly that layout, every element is the moved one by construction and no element is
//! read: the forward check of a view op is O(rank).

use crate::backend::{Call, Operand};
use crate::graph::Op;
use crate::spec::contiguous_strides;

/// A strided view over a storage: `shape`, `strides` (in elements) and `offset`.
#[derive(Clone, PartialEq, Debug)]
struct View {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl View {
    fn of(o: &Operand) -> View {
        View {
            shape: o.shape.to_vec(),
            strides: o
                .strides
                .map(<[usize]>::to_vec)
                .unwrap_or_else(|| contiguous_strides(o.shape)),
            offset: o.offset,
        }
    }
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Strides that differ only on axes of length ≤ 1 address the same elements.
    fn same_elements(&self, other: &View) -> bool {
        self.shape == other.shape
            && self.offset == other.offset
            && self
                .shape
                .iter()
                .zip(self.strides.iter().zip(&other.strides))
                .all(|(&d, (a, b))| d <= 1 || a == b)
    }
    fn is_contiguous(&self) -> bool {
        self.same_elements(&View {
            strides: contiguous_strides(&self.shape),
            ..self.clone()
        })
    }
    /// True when every element the view addresses lies in a storage of `len` elements.
    fn fits(&self, len: usize) -> bool {
        self.numel() == 0
            || last_address(&self.shape, &self.strides, self.offset).is_some_and(|l| l < len)
    }
    fn read(&self, storage: &[f32]) -> Option<Vec<f32>> {
        read_view(&self.shape, &self.strides, self.offset, storage)
    }
}

/// The view's address map in normal form: axes of extent 1 dropped, and each axis merged
/// into the one inside it when its stride is that axis's stride times its extent (the two
/// then step through one arithmetic run). Two views of one storage with the same offset and
/// the same normal form address the same element at every row-major position (each is the
/// same mixed-radix affine map of the flat index): a reshape between them moves nothing.
fn normal_form(v: &View) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(v.shape.len());
    for (&d, &s) in v.shape.iter().zip(&v.strides).rev() {
        if d == 1 {
            continue;
        }
        match out.last_mut() {
            Some((inner_d, inner_s)) if inner_s.checked_mul(*inner_d) == Some(s) => {
                *inner_d *= d;
            }
            _ => out.push((d, s)),
        }
    }
    out
}

/// Whether `y` is a view of `x`'s own storage that addresses, at every row-major position,
/// the element the op moves there: nothing to compare.
fn same_storage_view(op: &Op, x: (&View, &[f32]), y: (&View, &[f32])) -> bool {
    let shares = std::ptr::eq(x.1.as_ptr(), y.1.as_ptr()) && x.1.len() == y.1.len();
    if !shares || !y.0.fits(y.1.len()) || !x.0.fits(x.1.len()) {
        return false;
    }
    match (op, view_of(op, x.0)) {
        (_, Some(e)) => e.same_elements(y.0),
        // a reshape of a strided input (a head split of a slice): the same address map
        (Op::Reshape { .. }, None) => {
            x.0.numel() == y.0.numel()
                && x.0.offset == y.0.offset
                && normal_form(x.0) == normal_form(y.0)
        }
        _ => false,
    }
}

/// The largest storage index a strided view of a non-empty shape addresses (`None` on
/// overflow, or when the strides do not match the rank).
pub(super) fn last_address(shape: &[usize], strides: &[usize], offset: usize) -> Option<usize> {
    if strides.len() != shape.len() {
        return None;
    }
    shape.iter().zip(strides).try_fold(offset, |a, (&d, &s)| {
        a.checked_add(d.checked_sub(1)?.checked_mul(s)?)
    })
}

/// The elements of a strided view in row-major order of its shape, read row by row along
/// the last axis (each row's start advanced like an odometer over the outer axes); `None`
/// when the view addresses past its storage.
pub(super) fn read_view(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    storage: &[f32],
) -> Option<Vec<f32>> {
    read_view_as(shape, strides, offset, storage, |v| v)
}

/// [`read_view`], each element converted by `f` as it is read (one pass, one allocation).
pub(super) fn read_view_as<T>(
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    storage: &[f32],
    f: impl Fn(f32) -> T,
) -> Option<Vec<T>> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Some(Vec::new());
    }
    if last_address(shape, strides, offset)? >= storage.len() {
        return None;
    }
    let rank = shape.len();
    if rank == 0 {
        return Some(vec![f(storage[offset])]);
    }
    let (len, step) = (shape[rank - 1], strides[rank - 1]);
    let mut out = Vec::with_capacity(n);
    row_starts(shape, [(strides, offset), (strides, offset)], |start, _| {
        if step == 1 {
            out.extend(storage[start..start + len].iter().map(|&v| f(v)));
        } else {
            out.extend((0..len).map(|j| f(storage[start + j * step])));
        }
        true
    });
    Some(out)
}

/// Calls `f(start_a, start_b)` with the storage index where each innermost row begins in two
/// views of `shape` (strides and offsets `a`, `b`), in row-major order, while it returns true;
/// false when `f` stopped the walk. `shape` has at least one axis and no empty one.
fn row_starts(
    shape: &[usize],
    [(sa, oa), (sb, ob)]: [(&[usize], usize); 2],
    mut f: impl FnMut(usize, usize) -> bool,
) -> bool {
    let rank = shape.len();
    let rows: usize = shape[..rank - 1].iter().product();
    let mut idx = vec![0usize; rank - 1];
    let (mut a, mut b) = (oa, ob);
    for _ in 0..rows {
        if !f(a, b) {
            return false;
        }
        for ax in (0..rank - 1).rev() {
            idx[ax] += 1;
            a += sa[ax];
            b += sb[ax];
            if idx[ax] < shape[ax] {
                break;
            }
            a -= idx[ax] * sa[ax];
            b -= idx[ax] * sb[ax];
            idx[ax] = 0;
        }
    }
    true
}

/// The view the op defines on an input of view `x` (for `reshape`, only of a contiguous
/// input; the elements of any reshape are the input's in row-major order, see [`moved`]).
fn view_of(op: &Op, x: &View) -> Option<View> {
    match op {
        Op::Permute { axes } => {
            if axes.len() != x.shape.len() {
                return None;
            }
            Some(View {
                shape: axes
                    .iter()
                    .map(|&a| x.shape.get(a).copied())
                    .collect::<Option<_>>()?,
                strides: axes.iter().map(|&a| x.strides[a]).collect(),
                offset: x.offset,
            })
        }
        Op::Slice { axis, start, end } => {
            let (&len, &stride) = (x.shape.get(*axis)?, x.strides.get(*axis)?);
            if start > end || *end > len {
                return None;
            }
            let mut shape = x.shape.clone();
            shape[*axis] = end - start;
            Some(View {
                shape,
                strides: x.strides.clone(),
                offset: x.offset + if end > start { start * stride } else { 0 },
            })
        }
        Op::Reshape { shape } if x.is_contiguous() => {
            (shape.iter().product::<usize>() == x.numel()).then(|| View {
                shape: shape.clone(),
                strides: contiguous_strides(shape),
                offset: x.offset,
            })
        }
        Op::BroadcastTo { shape } => {
            let lead = shape.len().checked_sub(x.shape.len())?;
            let mut strides = vec![0; lead];
            for (i, (&d, &s)) in x.shape.iter().zip(&x.strides).enumerate() {
                match shape[lead + i] {
                    t if t == d => strides.push(s),
                    _ if d == 1 => strides.push(0),
                    _ => return None,
                }
            }
            Some(View {
                shape: shape.clone(),
                strides,
                offset: x.offset,
            })
        }
        _ => None,
    }
}

/// The spec's elements of the op applied to `x`, row-major.
fn moved(op: &Op, x: &Operand) -> Option<Vec<f32>> {
    let xv = View::of(x);
    match (op, view_of(op, &xv)) {
        (_, Some(v)) => v.read(x.storage),
        (Op::Reshape { shape }, None) if shape.iter().product::<usize>() == xv.numel() => {
            xv.read(x.storage)
        }
        _ => None,
    }
}

/// Equal, or both NaN.
#[inline(always)]
fn equal_or_nan(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Whether `f(a[i], b[i])` for every i of two slices of one length, with eight lanes of
/// "failed" flags (a short-circuiting test per element does not vectorize).
fn all_pairs(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> bool) -> bool {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .all(|(&x, &y)| f(x, y));
    let mut failed = [0u32; 8];
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            failed[l] |= !f(x[l], y[l]) as u32;
        }
    }
    tail && failed.iter().all(|&v| v == 0)
}

/// Equal, or both NaN, element by element.
fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && all_pairs(got, want, equal_or_nan)
}

fn is_movement(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Permute { .. } | Op::Slice { .. } | Op::BroadcastTo { .. }
    )
}

/// The forward check of a data-movement op; `None`: the whole-call check decides.
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if let Op::Concat { axis } = op {
        return concat(*axis, call);
    }
    if !is_movement(op) || call.inputs.len() != 1 {
        return None;
    }
    let (x, y) = (&call.inputs[0], &call.output);
    let (xv, yv) = (View::of(x), View::of(y));
    // a view of the input's own storage with exactly the op's layout: nothing to compare
    if same_storage_view(op, (&xv, x.storage), (&yv, y.storage)) {
        return Some(Ok(()));
    }
    let expected = view_of(op, &xv);
    // the result against the input read through the op's view, row by row in place; a
    // reshape of a non-contiguous input against the input's elements in its own row-major
    // order (a reshape keeps that order), read from a contiguous result
    let pair = match (&expected, op) {
        (Some(e), _) if e.shape == yv.shape => Some((e.clone(), yv.clone())),
        (None, Op::Reshape { .. }) if yv.is_contiguous() && yv.numel() == xv.numel() => {
            let flat = View {
                shape: xv.shape.clone(),
                strides: contiguous_strides(&xv.shape),
                offset: yv.offset,
            };
            Some((xv, flat))
        }
        _ => None,
    };
    if let Some((a, b)) = pair {
        if a.fits(x.storage.len()) && b.fits(y.storage.len()) {
            return zip_rows(&a, x.storage, &b, y.storage, equal_or_nan).then_some(Ok(()));
        }
    }
    let want = moved(op, x)?;
    let got = yv.read(y.storage)?;
    same(&got, &want).then_some(Ok(()))
}

/// The VJP check of `reshape`, `permute` and `slice`: the gradient read through the op's
/// view equals the cotangent, and (for `slice`) every gradient element outside the slice is
/// zero; `None`: the whole-call check decides.
pub(super) fn vjp(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if !matches!(
        op,
        Op::Reshape { .. } | Op::Permute { .. } | Op::Slice { .. }
    ) || call.inputs.len() != 1
    {
        return None;
    }
    let (x, cot) = (&call.inputs[0], call.cotangent.as_ref()?);
    let g = call.grads.first()?.as_ref()?;
    if g.shape != x.shape {
        return None;
    }
    let (gv, cv) = (View::of(g), View::of(cot));
    // the gradient a view of the cotangent's own storage, each position holding the
    // cotangent element the op moves there (a reshape's or permute's VJP that moved
    // nothing): nothing to compare (a slice's VJP also writes zeros: never a view)
    if !matches!(op, Op::Slice { .. })
        && same_storage_view(op, (&gv, g.storage), (&cv, cot.storage))
    {
        return Some(Ok(()));
    }
    // the gradient's elements at the positions the op moves, in the cotangent's order,
    // compared in place row by row when the op defines a view on the gradient's layout
    match view_of(op, &gv) {
        Some(pv)
            if pv.shape == cv.shape && pv.fits(g.storage.len()) && cv.fits(cot.storage.len()) =>
        {
            if !zip_rows(&pv, g.storage, &cv, cot.storage, equal_or_nan) {
                return None;
            }
        }
        _ => {
            let placed = moved(op, g)?;
            if !same(&placed, &cv.read(cot.storage)?) {
                return None;
            }
        }
    }
    if let Op::Slice { axis, start, end } = op {
        // the rest of the gradient is zero: the slices before `start` and after `end`
        let len = *gv.shape.get(*axis)?;
        for (lo, hi) in [(0, *start), (*end, len)] {
            let rest = Op::Slice {
                axis: *axis,
                start: lo,
                end: hi,
            };
            let rv = view_of(&rest, &gv)?;
            if !rv.fits(g.storage.len())
                || !zip_rows(&rv, g.storage, &rv, g.storage, |a, _| a == 0.0)
            {
                return None;
            }
        }
    }
    Some(Ok(()))
}

/// The forward check of `concat` along `axis`: each input equals its block of the result
/// exactly (NaN where it is NaN), compared in place; `None`: the whole-call check decides.
fn concat(axis: usize, call: &Call) -> Option<Result<(), String>> {
    let y = View::of(&call.output);
    if axis >= y.shape.len() || !y.fits(call.output.storage.len()) {
        return None;
    }
    let mut start = 0;
    for x in call.inputs {
        let xv = View::of(x);
        let n = *xv.shape.get(axis)?;
        let block = view_of(
            &Op::Slice {
                axis,
                start,
                end: start.checked_add(n)?,
            },
            &y,
        )?;
        if block.shape != xv.shape
            || !xv.fits(x.storage.len())
            || !zip_rows(&xv, x.storage, &block, call.output.storage, equal_or_nan)
        {
            return None;
        }
        start += n;
    }
    (start == y.shape[axis]).then_some(Ok(()))
}

/// Whether `f(a, b)` holds for every pair of elements at the same index of two views of one
/// shape (`a` over `sa`, `b` over `sb`, both inside their storages: the callers check
/// `fits`), walked row by row in row-major order without copying either.
fn zip_rows(a: &View, sa: &[f32], b: &View, sb: &[f32], f: impl Fn(f32, f32) -> bool) -> bool {
    let n = a.numel();
    if n == 0 {
        return true;
    }
    let rank = a.shape.len();
    if rank == 0 {
        return f(sa[a.offset], sb[b.offset]);
    }
    let len = a.shape[rank - 1];
    let (step_a, step_b) = (a.strides[rank - 1], b.strides[rank - 1]);
    let views = [(&a.strides[..], a.offset), (&b.strides[..], b.offset)];
    row_starts(&a.shape, views, |start_a, start_b| {
        if step_a == 1 && step_b == 1 {
            all_pairs(&sa[start_a..start_a + len], &sb[start_b..start_b + len], &f)
        } else {
            (0..len).all(|j| f(sa[start_a + j * step_a], sb[start_b + j * step_b]))
        }
    })
}
