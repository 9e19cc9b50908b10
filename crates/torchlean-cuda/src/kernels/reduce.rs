//! native_cuda reductions over axes and their adjoint, broadcasting: `reduce_sum` and
//! `reduce_mean` (each output element sums its positions in a fixed order; the mean of
//! nothing is NaN, as the spec), `broadcast_to` (its VJP is the same reduction), and the
//! non-differentiable `argmax` (first maximum, NaN first). The CUDA kernels (`reduce_to`,
//! `expand`, `argmax_rows`) live in `kernels/elementwise.cu` beside the broadcast and
//! reduction walks they share with the binary maps.

use super::elementwise::{bcast, reduce_geometry};
use super::{buffer, cx, grid, launched, output, tensor};
use crate::memory::CudaBuffer;
use cudarc::driver::PushKernelArg;
use torchlean::graph::{Op, OpKind};
use torchlean::{Error, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[
    OpKind::ReduceSum,
    OpKind::ReduceMean,
    OpKind::BroadcastTo,
    OpKind::Argmax,
];

/// `shape` with the reduced `axes` kept as 1.
fn kept(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if axes.contains(&d) { 1 } else { n })
        .collect()
}

/// The divisor of a reduction: the number of reduced elements for a mean, else 1.
fn divisor(op: &Op, x: &[usize]) -> f32 {
    match op {
        Op::ReduceMean { axes, .. } => axes.iter().map(|&a| x[a]).product::<usize>() as f32,
        _ => 1.0,
    }
}

/// Sums `big` (shape `big_shape`) down to `own` (a shape it broadcasts from), divided by
/// `div`, into `out` (numel(own) elements).
fn reduce_into(
    op: &Op,
    big: &CudaBuffer,
    big_shape: &[usize],
    own: &[usize],
    div: f32,
    out: &mut CudaBuffer,
) -> Result<()> {
    let n = torchlean::spec::numel(own);
    if n == 0 {
        return Ok(());
    }
    let r = reduce_geometry(op, own, big_shape)?;
    let in_use = cx()?;
    let cx = &*in_use;
    let n64 = n as i64;
    let mut l = cx.stream.launch_builder(&cx.functions.reduce_to);
    l.arg(big.slice())
        .arg(out.slice_mut())
        .arg(&n64)
        .arg(&r)
        .arg(&div);
    // SAFETY: thread j < numel(own) reads the positions of `big` that broadcast from element j
    // (inside big's row-major shape: the walk's strides are big's own) and writes out[j].
    launched(op, unsafe { l.launch(grid(n)) })?;
    Ok(())
}

/// Broadcasts `small` (shape `small_shape`) to `shape`, divided by `div`, into `out`.
fn expand_into(
    op: &Op,
    small: &CudaBuffer,
    small_shape: &[usize],
    shape: &[usize],
    div: f32,
    out: &mut CudaBuffer,
) -> Result<()> {
    let n = torchlean::spec::numel(shape);
    if n == 0 {
        return Ok(());
    }
    let in_use = cx()?;
    let cx = &*in_use;
    let g = bcast(op, small_shape, small_shape, shape)?;
    let n64 = n as i64;
    let mut l = cx.stream.launch_builder(&cx.functions.expand);
    l.arg(small.slice())
        .arg(out.slice_mut())
        .arg(&n64)
        .arg(&g)
        .arg(&div);
    // SAFETY: thread i < numel(shape) reads the element of `small` position i broadcasts from
    // (strides of small's own shape, 0 on broadcast axes) and writes out[i].
    launched(op, unsafe { l.launch(grid(n)) })?;
    Ok(())
}

/// The forward kernel of every op in [`KINDS`].
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let n = torchlean::spec::numel(&shape);
    let in_use = cx()?;
    let cx = &*in_use;
    let mut out = output(cx, op, n)?;
    let x = buffer(op, inputs[0])?;
    let xs = inputs[0].shape();
    match op {
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            reduce_into(op, x, xs, &kept(xs, axes), divisor(op, xs), &mut out)?;
        }
        Op::BroadcastTo { .. } => expand_into(op, x, xs, &shape, 1.0, &mut out)?,
        Op::Argmax { axis } => {
            let outer: usize = xs[..*axis].iter().product();
            let inner: usize = xs[axis + 1..].iter().product();
            if n > 0 {
                let (o, d, i) = (outer as i64, xs[*axis] as i64, inner as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.argmax_rows);
                l.arg(x.slice())
                    .arg(out.slice_mut())
                    .arg(&o)
                    .arg(&d)
                    .arg(&i);
                // SAFETY: each of the outer·inner row threads reads its dim elements of x
                // and writes one output element (n = outer·inner).
                launched(op, unsafe { l.launch(grid(n)) })?;
            }
        }
        other => {
            return Err(Error::Other(format!(
                "native_cuda has no reduction kernel for op `{}`",
                other.name()
            )))
        }
    }
    tensor(out, &shape)
}

/// The VJP kernel of the differentiable ops in [`KINDS`].
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    gy: &Tensor,
    _needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let in_use = cx()?;
    let cx = &*in_use;
    let g = buffer(op, gy)?;
    let xs = inputs[0].shape();
    let mut gx = output(cx, op, inputs[0].numel())?;
    match op {
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } => {
            expand_into(op, g, &kept(xs, axes), xs, divisor(op, xs), &mut gx)?;
        }
        Op::BroadcastTo { .. } => reduce_into(op, g, gy.shape(), xs, 1.0, &mut gx)?,
        other => {
            return Err(Error::Other(format!(
                "native_cuda has no reduction VJP for op `{}`",
                other.name()
            )))
        }
    }
    Ok(vec![Some(tensor(gx, xs)?)])
}
