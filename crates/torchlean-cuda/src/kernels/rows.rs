//! native_cuda kernels over rows, indices and layouts: softmax and log_softmax along one axis,
//! gather along one axis and scatter_add (gather's VJP kernel adds src into a copy of x; its
//! VJP gathers the cotangent with gather's forward kernel), reshape (a device copy), and permute, slice and concat (one
//! strided-copy kernel; the VJP of a slice writes into a zeroed gradient, concat's VJP copies
//! each input's window of the cotangent), index_select (its VJP sums each
//! gradient element's selections in index order: no atomics), and layer and RMS norm over the
//! last axis (one thread per row; the affine gradients one thread per column), and selective_scan (one thread per
//! sequence, forwards and then backwards in time), with their VJPs. The CUDA source is `kernels/rows.cu`. Results are dense row-major copies, never
//! views.
//!
//! Gather checks its index values on the device: a value that is not an integer in range sets
//! a flag (and the kernel touches no memory outside its operands). The call returns without
//! waiting; the next read of device values to the host (or synchronization) fails with the
//! spec's error for that call (naming the first bad position and value) instead of handing
//! over values (`graph::check_at_next_read`).

use super::{buffer, cx, grid, launched, output, row_major, tensor, warp_grid};
use crate::device::Context;
use crate::memory::CudaBuffer;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use torchlean::graph::{Op, OpKind};
use torchlean::spec::Array;
use torchlean::{Error, OpError, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[
    OpKind::Softmax,
    OpKind::LogSoftmax,
    OpKind::Gather,
    OpKind::ScatterAdd,
    OpKind::Reshape,
    OpKind::Permute,
    OpKind::Slice,
    OpKind::Concat,
    OpKind::IndexSelect,
    OpKind::LayerNorm,
    OpKind::RmsNorm,
    OpKind::SelectiveScan,
];

/// The largest rank the gather and layout-copy kernels index (`GATHER_MAX_RANK` and
/// `COPY_MAX_RANK` in `rows.cu`).
pub const MAX_RANK: usize = 16;

/// Mirror of `struct Gather` in `rows.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Gather {
    rank: i32,
    axis: i32,
    idx_shape: [i64; MAX_RANK],
    idx_stride: [i64; MAX_RANK],
    x_stride: [i64; MAX_RANK],
    bound: i64,
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Gather {}

/// (outer, dim, inner) of `shape` around `axis`.
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

fn gather_geometry(op: &Op, x: &[usize], idx: &[usize], axis: usize) -> Result<Gather> {
    if x.len() > MAX_RANK {
        return Err(OpError::Layout {
            op: op.name(),
            shapes: vec![x.to_vec(), idx.to_vec()],
            reason: format!("native_cuda gathers over at most {MAX_RANK} axes"),
        }
        .into());
    }
    let (si, sx) = (row_major(idx), row_major(x));
    let mut g = Gather {
        rank: x.len() as i32,
        axis: axis as i32,
        bound: x[axis] as i64,
        ..Default::default()
    };
    for d in 0..x.len() {
        g.idx_shape[d] = idx[d] as i64;
        g.idx_stride[d] = si[d] as i64;
        g.x_stride[d] = sx[d] as i64;
    }
    Ok(g)
}

/// Mirror of `struct Strided` in `rows.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Strided {
    rank: i32,
    narrow: i32,
    shape: [i64; MAX_RANK],
    src_stride: [i64; MAX_RANK],
    dst_stride: [i64; MAX_RANK],
    src_offset: i64,
    dst_offset: i64,
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Strided {}

/// One strided copy: for every index i of `shape`, `dst[dst_offset + i·dst_stride] =
/// src[src_offset + i·src_stride]`.
struct CopyPlan<'a> {
    shape: &'a [usize],
    src_stride: &'a [usize],
    dst_stride: &'a [usize],
    src_offset: usize,
    dst_offset: usize,
}

/// One axis of a strided copy: (extent, source stride, destination stride).
type Axis = (usize, usize, usize);

/// The copy's axes as (extent, source stride, destination stride), without axes of extent 1
/// and with each pair of neighbours merged where both sides step through them as one axis
/// (outer stride = inner extent × inner stride, in the source and in the destination): the
/// same element pairs, fewer index divisions per element. At least one axis.
fn collapse(c: &CopyPlan) -> Vec<(usize, usize, usize)> {
    let mut axes: Vec<(usize, usize, usize)> = Vec::with_capacity(c.shape.len());
    for d in 0..c.shape.len() {
        let axis = (c.shape[d], c.src_stride[d], c.dst_stride[d]);
        if axis.0 == 1 {
            continue;
        }
        match axes.last_mut() {
            Some(outer) if outer.1 == axis.0 * axis.1 && outer.2 == axis.0 * axis.2 => {
                *outer = (outer.0 * axis.0, axis.1, axis.2);
            }
            _ => axes.push(axis),
        }
    }
    if axes.is_empty() {
        axes.push((1, 1, 1));
    }
    axes
}

/// The copy of `axes` (from [`collapse`]) in float4 units, when the innermost axis is dense on
/// both sides and of a multiple of 4 elements and every other stride and both offsets are
/// multiples of 4: the innermost extent, the other strides and the offsets divided by 4
/// address the same element pairs, four at a time (16-byte aligned on buffers that start
/// 256-byte aligned). `None` when the copy must move single elements.
fn in_float4s(
    axes: &[Axis],
    src_offset: usize,
    dst_offset: usize,
) -> Option<(Vec<Axis>, usize, usize)> {
    let (&(extent, s, t), outer) = axes.split_last()?;
    let fits = extent % 4 == 0
        && s == 1
        && t == 1
        && outer.iter().all(|&(_, s, t)| s % 4 == 0 && t % 4 == 0)
        && src_offset % 4 == 0
        && dst_offset % 4 == 0;
    if !fits {
        return None;
    }
    let mut v: Vec<(usize, usize, usize)> =
        outer.iter().map(|&(e, s, t)| (e, s / 4, t / 4)).collect();
    v.push((extent / 4, 1, 1));
    Some((v, src_offset / 4, dst_offset / 4))
}

/// Runs one strided copy of `c` from `src` into `dst`. The caller derives the strides from
/// the spec's shapes, so every address stays inside the two buffers.
fn strided_copy(op: &Op, src: &CudaBuffer, dst: &mut CudaBuffer, c: CopyPlan) -> Result<()> {
    let n: usize = c.shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    if c.shape.len() > MAX_RANK {
        return Err(OpError::Layout {
            op: op.name(),
            shapes: vec![c.shape.to_vec()],
            reason: format!("native_cuda copies layouts of at most {MAX_RANK} axes"),
        }
        .into());
    }
    let plain = collapse(&c);
    let (axes, src_offset, dst_offset, n, vec4) =
        match in_float4s(&plain, c.src_offset, c.dst_offset) {
            Some((axes, so, dof)) => (axes, so, dof, n / 4, true),
            None => (plain, c.src_offset, c.dst_offset, n, false),
        };
    let mut g = Strided {
        rank: axes.len() as i32,
        src_offset: src_offset as i64,
        dst_offset: dst_offset as i64,
        ..Default::default()
    };
    for (d, &(extent, s, t)) in axes.iter().enumerate() {
        g.shape[d] = extent as i64;
        g.src_stride[d] = s as i64;
        g.dst_stride[d] = t as i64;
    }
    // the largest address either side reaches (the caller's strides keep both in bounds)
    let last = |offset: usize, stride: fn(&Axis) -> usize| {
        axes.iter().try_fold(offset, |acc, a| {
            acc.checked_add((a.0 - 1).checked_mul(stride(a))?)
        })
    };
    let fits = |v: Option<usize>| v.is_some_and(|v| v < (1 << 31));
    g.narrow = (n < (1 << 31) && fits(last(src_offset, |a| a.1)) && fits(last(dst_offset, |a| a.2)))
        as i32;
    let in_use = cx()?;
    let cx = &*in_use;
    let n64 = n as i64;
    let kernel = if vec4 {
        &cx.functions.strided_copy4
    } else {
        &cx.functions.strided_copy
    };
    let mut l = cx.stream.launch_builder(kernel);
    l.arg(src.slice()).arg(dst.slice_mut()).arg(&n64).arg(&g);
    // SAFETY: for every index of `shape` the source and destination addresses are inside the
    // source and destination tensors (strides and offsets of their own row-major shapes, or
    // a permutation or an in-range window of them), and distinct indices write distinct
    // destination elements; in float4 units the same holds for groups of four elements,
    // 16-byte aligned (offsets and strides multiples of 4 on 256-byte aligned buffers).
    launched(op, unsafe { l.launch(grid(n)) })?;
    Ok(())
}

/// Launches `f`, one of the index_select kernels (`(src, idx, dst, bad, outer, dim, k,
/// inner)`), over `n` threads.
#[allow(clippy::too_many_arguments)]
fn launch_select(
    op: &Op,
    f: &cudarc::driver::CudaFunction,
    src: &CudaBuffer,
    idx: &CudaBuffer,
    dst: &mut CudaBuffer,
    bad: &mut CudaBuffer,
    (o, d, k, i): (usize, usize, usize, usize),
    n: usize,
) -> Result<()> {
    let in_use = cx()?;
    let cx = &*in_use;
    let (o64, d64, k64, i64_) = (o as i64, d as i64, k as i64, i as i64);
    let mut l = cx.stream.launch_builder(f);
    l.arg(src.slice())
        .arg(idx.slice())
        .arg(dst.slice_mut())
        .arg(bad.slice_mut())
        .arg(&o64)
        .arg(&d64)
        .arg(&k64)
        .arg(&i64_);
    // SAFETY: the forward's n = o·k·i threads write out[p] and read x[(o·d + s)·i + i'] for a
    // valid index s < d (checked in the kernel); the VJP's n = o·d·i threads write gx[p] and
    // read gy[(o·k + j)·i + i'] (j < k): all inside the buffers of the spec's shapes.
    launched(op, unsafe { l.launch(grid(n)) })?;
    Ok(())
}

/// (b, l, inner) of a selective scan over `x` [b, l, ...].
fn scan_dims(x: &[usize]) -> (usize, usize, usize) {
    let inner = x.get(2..).map_or(1, |r| r.iter().product());
    (
        x.first().copied().unwrap_or(0),
        x.get(1).copied().unwrap_or(0),
        inner,
    )
}

/// (rows, d) of a last-axis norm of `x`.
fn norm_rows_of(x: &[usize]) -> (usize, usize) {
    let d = x.last().copied().unwrap_or(1);
    (x.iter().product::<usize>().checked_div(d).unwrap_or(0), d)
}

/// The strides of `x` (row-major) taken in the order of `axes`.
fn permuted_strides(x: &[usize], axes: &[usize]) -> Vec<usize> {
    let sx = row_major(x);
    axes.iter().map(|&a| sx[a]).collect()
}

/// A zeroed flag buffer the gather kernels set when an index value is invalid.
fn flag(cx: &Context, op: &Op) -> Result<CudaBuffer> {
    let mut f = output(cx, op, 1)?;
    launched(op, cx.stream.memset_zeros(f.slice_mut()))?;
    Ok(f)
}

/// The spec's error for this call's index when the kernel set the flag, checked at the next
/// read of device values to the host — or, when a device graph records this call, at the
/// next read after each replay (see `graph.rs`). The kernels never touch memory outside
/// their inputs and outputs with an invalid index, so the work launched meanwhile is only
/// wasted, and no value computed from it reaches the host before the error does.
fn check_flag(op: &Op, f: CudaBuffer, x_shape: &[usize], idx: &Tensor) -> Result<()> {
    let (op, x_shape, idx) = (op.clone(), x_shape.to_vec(), idx.clone());
    crate::graph::check_at_next_read(std::sync::Arc::new(move || {
        read_flag(&op, &f, &x_shape, &idx)
    }))
}

/// Waits for the flag; when set, the spec's error for this call's index (read to the host).
fn read_flag(op: &Op, f: &CudaBuffer, x_shape: &[usize], idx: &Tensor) -> Result<()> {
    let in_use = cx()?;
    let cx = &*in_use;
    let set = launched(op, cx.stream.clone_dtoh(&f.slice().slice(0..1)))?;
    if set[0] == 0.0 {
        return Ok(());
    }
    let x = Array::<f32> {
        shape: x_shape.to_vec(),
        data: vec![0.0; torchlean::spec::numel(x_shape)],
    };
    let i = Array::<f32> {
        shape: idx.shape().to_vec(),
        data: idx.try_to_vec()?,
    };
    // scatter_add's third input (src, of the index's shape) plays no part in the check
    let src = Array::<f32> {
        shape: idx.shape().to_vec(),
        data: vec![0.0; idx.numel()],
    };
    let inputs: Vec<&Array<f32>> = match op {
        Op::ScatterAdd { .. } => vec![&x, &i, &src],
        _ => vec![&x, &i],
    };
    match torchlean::spec::forward(op, &inputs) {
        Err(e) => Err(e.into()),
        Ok(_) => Err(Error::Other(format!(
            "op `{}`: the device reported an invalid index the spec accepts",
            op.name()
        ))),
    }
}

/// The forward kernel of every op in [`KINDS`].
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    if let Op::Reshape { .. } = op {
        // a view: no copy, no kernel (`view_of`)
        return super::view_of(op, inputs[0], &shape);
    }
    let n = torchlean::spec::numel(&shape);
    let in_use = cx()?;
    let cx = &*in_use;
    let mut out = output(cx, op, n)?;
    let x = buffer(op, inputs[0])?;
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let (o, d, i) = split(&shape, *axis);
            let log = matches!(op, Op::LogSoftmax { .. }) as i32;
            if i == 1 && o > 0 && d > 0 {
                // the last axis: one warp per row, coalesced
                let (o64, d64) = (o as i64, d as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.softmax_lastdim);
                l.arg(&log)
                    .arg(x.slice())
                    .arg(out.slice_mut())
                    .arg(&o64)
                    .arg(&d64);
                // SAFETY: each row's warp reads and writes its d contiguous elements of x and
                // out, all inside the o·d elements each holds.
                launched(op, unsafe { l.launch(warp_grid(o)) })?;
            } else if o * i > 0 && d > 0 {
                let (o64, d64, i64_) = (o as i64, d as i64, i as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.softmax_rows);
                l.arg(&log)
                    .arg(x.slice())
                    .arg(out.slice_mut())
                    .arg(&o64)
                    .arg(&d64)
                    .arg(&i64_);
                // SAFETY: each of the o·i threads reads and writes its d elements of x and
                // out, all inside the o·d·i elements each holds.
                launched(op, unsafe { l.launch(grid(o * i)) })?;
            }
        }
        Op::Gather { axis } => {
            let idx = buffer(op, inputs[1])?;
            let g = gather_geometry(op, inputs[0].shape(), inputs[1].shape(), *axis)?;
            let mut bad = flag(cx, op)?;
            if n > 0 {
                let n64 = n as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.gather_forward);
                l.arg(x.slice())
                    .arg(idx.slice())
                    .arg(out.slice_mut())
                    .arg(bad.slice_mut())
                    .arg(&n64)
                    .arg(&g);
                // SAFETY: thread p reads idx[p] and, for a valid index (checked in the
                // kernel), one element of x inside its shape; writes out[p] (p < n).
                launched(op, unsafe { l.launch(grid(n)) })?;
            }
            check_flag(op, bad, inputs[0].shape(), inputs[1])?;
        }
        // out = x, then each index line adds its src values into the line of out it
        // addresses, in index order (gather's VJP kernel: distinct lines, no atomics)
        Op::ScatterAdd { axis } => {
            let (idx, src) = (buffer(op, inputs[1])?, buffer(op, inputs[2])?);
            let g = gather_geometry(op, inputs[0].shape(), inputs[1].shape(), *axis)?;
            if n > 0 {
                let from = x.slice().slice(0..n);
                let mut to = out.slice_mut().slice_mut(0..n);
                launched(op, cx.stream.memcpy_dtod(&from, &mut to))?;
            }
            let mut bad = flag(cx, op)?;
            let along = inputs[1].shape()[*axis];
            let lines = inputs[1].numel().checked_div(along).unwrap_or(0);
            if lines > 0 {
                let l64 = lines as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.gather_vjp);
                l.arg(idx.slice())
                    .arg(src.slice())
                    .arg(out.slice_mut())
                    .arg(bad.slice_mut())
                    .arg(&l64)
                    .arg(&g);
                // SAFETY: each line thread adds into the elements of out (x's shape) its
                // valid indices address (checked in the kernel); distinct lines address
                // distinct lines of out; src has the index's shape (the shape rule).
                launched(op, unsafe { l.launch(grid(lines)) })?;
            }
            check_flag(op, bad, inputs[0].shape(), inputs[1])?;
        }
        Op::Permute { axes } => {
            let src_stride = permuted_strides(inputs[0].shape(), axes);
            let dst_stride = row_major(&shape);
            let c = CopyPlan {
                shape: &shape,
                src_stride: &src_stride,
                dst_stride: &dst_stride,
                src_offset: 0,
                dst_offset: 0,
            };
            strided_copy(op, x, &mut out, c)?;
        }
        Op::Slice { axis, start, .. } => {
            let sx = row_major(inputs[0].shape());
            let dst_stride = row_major(&shape);
            let c = CopyPlan {
                shape: &shape,
                src_stride: &sx,
                dst_stride: &dst_stride,
                src_offset: start * sx[*axis],
                dst_offset: 0,
            };
            strided_copy(op, x, &mut out, c)?;
        }
        Op::Concat { axis } => {
            // each input goes to its window of the output along `axis`
            let dst_stride = row_major(&shape);
            let mut at = 0;
            for t in inputs {
                let src_stride = row_major(t.shape());
                let c = CopyPlan {
                    shape: t.shape(),
                    src_stride: &src_stride,
                    dst_stride: &dst_stride,
                    src_offset: 0,
                    dst_offset: at * dst_stride[*axis],
                };
                strided_copy(op, buffer(op, t)?, &mut out, c)?;
                at += t.shape()[*axis];
            }
        }
        Op::IndexSelect { axis } => {
            let idx = buffer(op, inputs[1])?;
            let (o, d, i) = split(inputs[0].shape(), *axis);
            let geometry = (o, d, inputs[1].numel(), i);
            let mut bad = flag(cx, op)?;
            if n > 0 {
                let f = &cx.functions.index_select_forward;
                launch_select(op, f, x, idx, &mut out, &mut bad, geometry, n)?;
            }
            check_flag(op, bad, inputs[0].shape(), inputs[1])?;
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let (rows, d) = norm_rows_of(inputs[0].shape());
            let gamma = buffer(op, inputs[1])?;
            let beta = match inputs.get(2) {
                Some(b) => Some(buffer(op, b)?),
                None => None,
            };
            if rows > 0 && d > 0 {
                let rms = matches!(op, Op::RmsNorm { .. }) as i32;
                let has_beta = beta.is_some() as i32;
                let (r64, d64) = (rows as i64, d as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.norm_rows);
                l.arg(&rms)
                    .arg(eps)
                    .arg(x.slice())
                    .arg(gamma.slice())
                    // without a beta the kernel never reads this argument
                    .arg(beta.unwrap_or(gamma).slice())
                    .arg(&has_beta)
                    .arg(out.slice_mut())
                    .arg(&r64)
                    .arg(&d64);
                // SAFETY: each row's warp reads its d elements of x and the d of gamma (and
                // beta: shapes [d], the shape guard) and writes its d elements of out.
                launched(op, unsafe { l.launch(warp_grid(rows)) })?;
            }
        }
        Op::SelectiveScan => {
            let (b, l, inner) = scan_dims(inputs[0].shape());
            let u = buffer(op, inputs[1])?;
            if b * inner > 0 && l > 0 {
                let (b64, l64, i64_) = (b as i64, l as i64, inner as i64);
                let mut k = cx.stream.launch_builder(&cx.functions.scan_forward);
                k.arg(x.slice())
                    .arg(u.slice())
                    .arg(out.slice_mut())
                    .arg(&b64)
                    .arg(&l64)
                    .arg(&i64_);
                // SAFETY: each of the b·inner sequence threads reads and writes its l elements
                // of a, u and y (equal shapes [b, l, ...]: the shape rule).
                launched(op, unsafe { k.launch(grid(b * inner)) })?;
            }
        }
        other => {
            return Err(Error::Other(format!(
                "native_cuda has no row kernel for op `{}`",
                other.name()
            )))
        }
    }
    tensor(out, &shape)
}

/// The VJP kernel of every op in [`KINDS`].
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    output_t: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let x_shape = inputs[0].shape();
    if let Op::Reshape { .. } = op {
        // the same buffer under the input's shape, as the forward
        return Ok(vec![Some(super::view_of(op, gy, x_shape)?)]);
    }
    if matches!(op, Op::Gather { .. } | Op::IndexSelect { .. }) && needs.first() != Some(&true) {
        // no gradient asked of the data operand (an index is never differentiable): no
        // result, rather than zeros a checker would take for a claimed gradient
        return Ok(vec![None, None]);
    }
    let in_use = cx()?;
    let cx = &*in_use;
    let g = buffer(op, gy)?;
    let n = inputs[0].numel();
    let mut gx = output(cx, op, n)?;
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let y = buffer(op, output_t)?;
            let (o, d, i) = split(x_shape, *axis);
            let log = matches!(op, Op::LogSoftmax { .. }) as i32;
            if i == 1 && o > 0 && d > 0 {
                let (o64, d64) = (o as i64, d as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.softmax_lastdim_vjp);
                l.arg(&log)
                    .arg(y.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(&o64)
                    .arg(&d64);
                // SAFETY: as the forward: each row's warp reads and writes its d elements.
                launched(op, unsafe { l.launch(warp_grid(o)) })?;
            } else if o * i > 0 && d > 0 {
                let (o64, d64, i64_) = (o as i64, d as i64, i as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.softmax_rows_vjp);
                l.arg(&log)
                    .arg(y.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(&o64)
                    .arg(&d64)
                    .arg(&i64_);
                // SAFETY: as the forward: each row thread reads and writes its d elements.
                launched(op, unsafe { l.launch(grid(o * i)) })?;
            }
            Ok(vec![Some(tensor(gx, x_shape)?)])
        }
        Op::Gather { axis } => {
            let idx = buffer(op, inputs[1])?;
            let g_geo = gather_geometry(op, x_shape, inputs[1].shape(), *axis)?;
            launched(op, cx.stream.memset_zeros(gx.slice_mut()))?;
            let mut bad = flag(cx, op)?;
            let along = inputs[1].shape()[*axis];
            let lines = inputs[1].numel().checked_div(along).unwrap_or(0);
            if lines > 0 {
                let l64 = lines as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.gather_vjp);
                l.arg(idx.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(bad.slice_mut())
                    .arg(&l64)
                    .arg(&g_geo);
                // SAFETY: each line thread adds into the elements of x its valid indices
                // address (checked in the kernel); distinct lines address distinct lines of x.
                launched(op, unsafe { l.launch(grid(lines)) })?;
            }
            check_flag(op, bad, x_shape, inputs[1])?;
            Ok(vec![Some(tensor(gx, x_shape)?), None])
        }
        // gx = gy; gsrc = gy gathered at the addressed positions (gather's forward kernel)
        Op::ScatterAdd { axis } => {
            let idx = buffer(op, inputs[1])?;
            let geo = gather_geometry(op, x_shape, inputs[1].shape(), *axis)?;
            if n > 0 {
                let from = g.slice().slice(0..n);
                let mut to = gx.slice_mut().slice_mut(0..n);
                launched(op, cx.stream.memcpy_dtod(&from, &mut to))?;
            }
            let m = inputs[1].numel();
            let mut gsrc = output(cx, op, m)?;
            let mut bad = flag(cx, op)?;
            if m > 0 {
                let m64 = m as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.gather_forward);
                l.arg(g.slice())
                    .arg(idx.slice())
                    .arg(gsrc.slice_mut())
                    .arg(bad.slice_mut())
                    .arg(&m64)
                    .arg(&geo);
                // SAFETY: thread p < m reads idx[p] and, for a valid index (checked in the
                // kernel), one element of gy (x's shape); writes gsrc[p].
                launched(op, unsafe { l.launch(grid(m)) })?;
            }
            check_flag(op, bad, x_shape, inputs[1])?;
            let need = |i: usize| needs.get(i).copied().unwrap_or(false);
            Ok(vec![
                need(0).then(|| tensor(gx, x_shape)).transpose()?,
                None,
                need(2)
                    .then(|| tensor(gsrc, inputs[1].shape()))
                    .transpose()?,
            ])
        }
        // the inverse copies: each element of the cotangent goes back where it came from
        Op::Permute { axes } => {
            let src_stride = row_major(gy.shape());
            let dst_stride = permuted_strides(x_shape, axes);
            let c = CopyPlan {
                shape: gy.shape(),
                src_stride: &src_stride,
                dst_stride: &dst_stride,
                src_offset: 0,
                dst_offset: 0,
            };
            strided_copy(op, g, &mut gx, c)?;
            Ok(vec![Some(tensor(gx, x_shape)?)])
        }
        Op::Slice { axis, start, .. } => {
            launched(op, cx.stream.memset_zeros(gx.slice_mut()))?;
            let sx = row_major(x_shape);
            let src_stride = row_major(gy.shape());
            let c = CopyPlan {
                shape: gy.shape(),
                src_stride: &src_stride,
                dst_stride: &sx,
                src_offset: 0,
                dst_offset: start * sx[*axis],
            };
            strided_copy(op, g, &mut gx, c)?;
            Ok(vec![Some(tensor(gx, x_shape)?)])
        }
        Op::Concat { axis } => {
            // each input's gradient is its window of the cotangent along `axis`
            let src_stride = row_major(gy.shape());
            let mut grads = Vec::with_capacity(inputs.len());
            let mut at = 0;
            for (k, t) in inputs.iter().enumerate() {
                let start = at;
                at += t.shape()[*axis];
                if !needs.get(k).copied().unwrap_or(false) {
                    grads.push(None);
                    continue;
                }
                let mut gk = output(cx, op, t.numel())?;
                let dst_stride = row_major(t.shape());
                let c = CopyPlan {
                    shape: t.shape(),
                    src_stride: &src_stride,
                    dst_stride: &dst_stride,
                    src_offset: start * src_stride[*axis],
                    dst_offset: 0,
                };
                strided_copy(op, g, &mut gk, c)?;
                grads.push(Some(tensor(gk, t.shape())?));
            }
            Ok(grads)
        }
        Op::IndexSelect { axis } => {
            let idx = buffer(op, inputs[1])?;
            let (o, d, i) = split(x_shape, *axis);
            let geometry = (o, d, inputs[1].numel(), i);
            let mut bad = flag(cx, op)?;
            if n > 0 {
                let f = &cx.functions.index_select_vjp;
                launch_select(op, f, g, idx, &mut gx, &mut bad, geometry, n)?;
            } else {
                launched(op, cx.stream.memset_zeros(gx.slice_mut()))?;
            }
            check_flag(op, bad, x_shape, inputs[1])?;
            Ok(vec![Some(tensor(gx, x_shape)?), None])
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => {
            let (rows, d) = norm_rows_of(x_shape);
            let xb = buffer(op, inputs[0])?;
            let gamma = buffer(op, inputs[1])?;
            let has_beta = inputs.len() == 3;
            // (mu, rstd, sc) per row: x̂ = (x·sc − mu)·rstd
            let mut stats = output(cx, op, 3 * rows.max(1))?;
            let mut ggamma = output(cx, op, d)?;
            let mut gbeta = output(cx, op, d)?;
            launched(op, cx.stream.memset_zeros(gx.slice_mut()))?;
            launched(op, cx.stream.memset_zeros(ggamma.slice_mut()))?;
            launched(op, cx.stream.memset_zeros(gbeta.slice_mut()))?;
            if rows > 0 && d > 0 {
                let rms = matches!(op, Op::RmsNorm { .. }) as i32;
                let (r64, d64) = (rows as i64, d as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.norm_rows_vjp);
                l.arg(&rms)
                    .arg(eps)
                    .arg(xb.slice())
                    .arg(gamma.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(stats.slice_mut())
                    .arg(&r64)
                    .arg(&d64);
                // SAFETY: each row's warp reads its d elements of x, gy and gamma, writes its
                // d elements of gx and three of stats (3·rows elements).
                launched(op, unsafe { l.launch(warp_grid(rows)) })?;
                // the affine parameters' gradients: column sums over row chunks, then the
                // chunks in order (a fixed order every run)
                let chunks = rows.div_ceil(64).clamp(1, 1024);
                let chunk = rows.div_ceil(chunks);
                let mut part = output(cx, op, chunks * d * 2)?;
                let chunk64 = chunk as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.norm_params_partial);
                l.arg(xb.slice())
                    .arg(g.slice())
                    .arg(stats.slice())
                    .arg(part.slice_mut())
                    .arg(&r64)
                    .arg(&d64)
                    .arg(&chunk64);
                let cfg = LaunchConfig {
                    grid_dim: (d.div_ceil(32) as u32, chunks as u32, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: block (bx, by) reads columns bx·32.. (< d) of rows by·chunk.. (<
                // rows) of x and gy (rows·d each) and those rows' stats, and writes
                // part[(by·d + c)·2 + {0, 1}] for its columns c < d (chunks·d·2 elements).
                launched(op, unsafe { l.launch(cfg) })?;
                let (hb, chunks64) = (has_beta as i32, chunks as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.norm_params_finish);
                l.arg(part.slice())
                    .arg(ggamma.slice_mut())
                    .arg(gbeta.slice_mut())
                    .arg(&hb)
                    .arg(&chunks64)
                    .arg(&d64);
                // SAFETY: column thread c < d reads part[(k·d + c)·2 + {0, 1}] for k < chunks
                // and writes ggamma[c] and gbeta[c] (d each).
                launched(op, unsafe { l.launch(grid(d)) })?;
            }
            let param = inputs[1].shape();
            let mut grads = vec![
                needs[0].then(|| tensor(gx, x_shape)).transpose()?,
                needs
                    .get(1)
                    .copied()
                    .unwrap_or(false)
                    .then(|| tensor(ggamma, param))
                    .transpose()?,
            ];
            if has_beta {
                grads.push(
                    needs
                        .get(2)
                        .copied()
                        .unwrap_or(false)
                        .then(|| tensor(gbeta, param))
                        .transpose()?,
                );
            }
            Ok(grads)
        }
        Op::SelectiveScan => {
            let (b, l, inner) = scan_dims(x_shape);
            let (a, y) = (buffer(op, inputs[0])?, buffer(op, output_t)?);
            let mut gu = output(cx, op, n)?;
            if b * inner > 0 && l > 0 {
                let (b64, l64, i64_) = (b as i64, l as i64, inner as i64);
                let mut k = cx.stream.launch_builder(&cx.functions.scan_vjp);
                k.arg(a.slice())
                    .arg(y.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(gu.slice_mut())
                    .arg(&b64)
                    .arg(&l64)
                    .arg(&i64_);
                // SAFETY: as the forward: each sequence thread reads a, y, gy and writes ga,
                // gu at its l positions, all of the one shape [b, l, ...].
                launched(op, unsafe { k.launch(grid(b * inner)) })?;
            }
            Ok(vec![
                needs[0].then(|| tensor(gx, x_shape)).transpose()?,
                needs
                    .get(1)
                    .copied()
                    .unwrap_or(false)
                    .then(|| tensor(gu, x_shape))
                    .transpose()?,
            ])
        }
        other => Err(Error::Other(format!(
            "native_cuda has no row VJP for op `{}`",
            other.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::{collapse, in_float4s, CopyPlan};

    /// Every (source, destination) address pair of a copy, in row-major index order.
    fn pairs(axes: &[(usize, usize, usize)], src: usize, dst: usize) -> Vec<(usize, usize)> {
        let n: usize = axes.iter().map(|a| a.0).product();
        (0..n)
            .map(|p| {
                let (mut rest, mut s, mut d) = (p, src, dst);
                for a in axes.iter().rev() {
                    let i = rest % a.0;
                    rest /= a.0;
                    s += i * a.1;
                    d += i * a.2;
                }
                (s, d)
            })
            .collect()
    }

    /// Collapsing axes keeps exactly the copy's element pairs, in order: permutations of
    /// row-major layouts (head split and merge among them), windows (slice) and axes of
    /// extent 1.
    #[test]
    fn collapsed_axes_address_the_same_element_pairs() {
        let row_major = |shape: &[usize]| -> Vec<usize> {
            let mut s = vec![1; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                s[d] = s[d + 1] * shape[d + 1];
            }
            s
        };
        // (source shape, permutation): the destination is the permuted shape, row-major
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 5, 3, 4], &[0, 2, 1, 3]),
            (&[2, 5, 3, 4], &[0, 1, 2, 3]),
            (&[3, 1, 4, 1, 2], &[0, 1, 2, 3, 4]),
            (&[3, 1, 4, 1, 2], &[2, 0, 4, 1, 3]),
            (&[6, 7], &[1, 0]),
            (&[1], &[0]),
        ];
        for (shape, perm) in cases {
            let src_rm = row_major(shape);
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let src_stride: Vec<usize> = perm.iter().map(|&p| src_rm[p]).collect();
            let dst_stride = row_major(&out_shape);
            let plan = CopyPlan {
                shape: &out_shape,
                src_stride: &src_stride,
                dst_stride: &dst_stride,
                src_offset: 3,
                dst_offset: 0,
            };
            let full: Vec<(usize, usize, usize)> = (0..out_shape.len())
                .map(|d| (out_shape[d], src_stride[d], dst_stride[d]))
                .collect();
            let merged = collapse(&plan);
            assert!(merged.len() <= full.len().max(1));
            assert_eq!(
                pairs(&merged, 3, 0),
                pairs(&full, 3, 0),
                "{shape:?} {perm:?}"
            );
        }
        // a window: columns 2..5 of a [4, 9] source into a [4, 3] destination
        let (shape, src_stride, dst_stride) = ([4usize, 3], [9usize, 1], [3usize, 1]);
        let plan = CopyPlan {
            shape: &shape,
            src_stride: &src_stride,
            dst_stride: &dst_stride,
            src_offset: 2,
            dst_offset: 0,
        };
        let full = [(4, 9, 3), (3, 1, 1)];
        assert_eq!(pairs(&collapse(&plan), 2, 0), pairs(&full, 2, 0));
        // a contiguous copy collapses to one axis
        let (shape, st) = ([2usize, 3, 4], [12usize, 4, 1]);
        let plan = CopyPlan {
            shape: &shape,
            src_stride: &st,
            dst_stride: &st,
            src_offset: 0,
            dst_offset: 0,
        };
        assert_eq!(collapse(&plan), vec![(24, 1, 1)]);
    }

    /// The float4 form of a copy addresses the same element pairs, four at a time: each of
    /// its (source, destination) pairs, times 4 plus 0..4, lists the element pairs of the
    /// plain copy in order; copies with an odd innermost extent, a strided innermost axis or
    /// an unaligned offset keep single elements.
    #[test]
    fn float4_copies_address_the_same_element_pairs() {
        // (axes, source offset, destination offset, takes the float4 path)
        type Case<'a> = (&'a [super::Axis], usize, usize, bool);
        let cases: &[Case] = &[
            // head split [2, 8, 4, 16] -> [2, 4, 8, 16], collapsed
            (
                &[(2, 512, 512), (4, 16, 128), (8, 64, 16), (16, 1, 1)],
                0,
                0,
                true,
            ),
            // a slice of columns 8..24 of rows of 32 into rows of 16
            (&[(5, 32, 16), (16, 1, 1)], 8, 0, true),
            (&[(5, 32, 16), (16, 1, 1)], 6, 0, false),
            (&[(3, 35, 42), (6, 1, 1)], 0, 0, false),
            (&[(4, 1, 4), (8, 4, 1)], 0, 0, false),
            (&[(12, 1, 1)], 4, 8, true),
        ];
        for &(axes, so, dof, expect) in cases {
            let got = in_float4s(axes, so, dof);
            assert_eq!(got.is_some(), expect, "{axes:?} offsets {so}, {dof}");
            if let Some((v, so4, do4)) = got {
                let wide: Vec<(usize, usize)> = pairs(&v, so4, do4)
                    .into_iter()
                    .flat_map(|(s, d)| (0..4).map(move |l| (4 * s + l, 4 * d + l)))
                    .collect();
                assert_eq!(wide, pairs(axes, so, dof), "{axes:?}");
            }
        }
    }
}
