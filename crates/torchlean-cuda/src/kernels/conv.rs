//! native_cuda kernels for `conv2d`, `conv_transpose2d`, `max_pool2d`, `avg_pool2d`, `smooth_max_pool2d`,
//! `batch_norm` (training-mode statistics, one block per channel) and `mse_loss`, with their
//! VJPs. The CUDA source is `kernels/conv.cu`.
//!
//! Direct kernels, written for correctness and determinism, not yet tuned: one thread per
//! output element for the forwards, one thread per input element for the input gradients
//! (summing the taps that land on it: no atomics), and one block per weight (or bias)
//! element for the parameter gradients (a fixed tree over a fixed split of the batch and
//! output positions). Padding takes part in conv2d's products as zeros, as the spec says.

use super::{buffer, cx, grid, launched, needed_grad, output, tensor, BLOCK};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use torchlean::graph::{Op, OpKind, Pool2dGeometry};
use torchlean::{Error, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[
    OpKind::Conv2d,
    OpKind::ConvTranspose2d,
    OpKind::MaxPool2d,
    OpKind::AvgPool2d,
    OpKind::SmoothMaxPool2d,
    OpKind::BatchNorm,
    OpKind::MseLoss,
];

/// Mirror of `struct Conv` in `conv.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Conv {
    n: i64,
    cin: i64,
    h: i64,
    w: i64,
    cout: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    groups: i64,
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Conv {}

/// Mirror of `struct Pool` in `conv.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Pool {
    nc: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Pool {}

/// One block of [`BLOCK`] threads per item, for `items` items (grid-stride over blocks).
fn blocks(items: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (items.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The geometry of a conv2d call (shapes already accepted by the shape rule, so every
/// dimension is positive where it divides and the output shape is the spec's).
fn conv_geometry(op: &Op, x: &[usize], w: &[usize], y: &[usize]) -> Result<Conv> {
    let (stride, padding, dilation, groups) = match op {
        Op::Conv2d(g) => (g.stride, g.padding, g.dilation, g.groups),
        Op::ConvTranspose2d(g) => (g.stride, g.padding, g.dilation, g.groups),
        other => {
            return Err(Error::Other(format!(
                "not a convolution: `{}`",
                other.name()
            )))
        }
    };
    let i = |v: usize| v as i64;
    Ok(Conv {
        n: i(x[0]),
        cin: i(x[1]),
        h: i(x[2]),
        w: i(x[3]),
        cout: i(y[1]),
        oh: i(y[2]),
        ow: i(y[3]),
        kh: i(w[2]),
        kw: i(w[3]),
        sh: i(stride[0]),
        sw: i(stride[1]),
        ph: i(padding[0]),
        pw: i(padding[1]),
        dh: i(dilation[0]),
        dw: i(dilation[1]),
        groups: i(groups.max(1)),
    })
}

/// The (forward, input-gradient, weight-gradient) kernels of a convolution op.
fn conv_kernels<'c>(
    cx: &'c crate::device::Context,
    op: &Op,
) -> (
    &'c cudarc::driver::CudaFunction,
    &'c cudarc::driver::CudaFunction,
    &'c cudarc::driver::CudaFunction,
) {
    let f = &cx.functions;
    match op {
        Op::ConvTranspose2d(_) => (
            &f.conv_transpose2d_forward,
            &f.conv_transpose2d_grad_input,
            &f.conv_transpose2d_grad_weight,
        ),
        _ => (
            &f.conv2d_forward,
            &f.conv2d_grad_input,
            &f.conv2d_grad_weight,
        ),
    }
}

/// (outer, channels, inner) of `x` around its channel axis.
fn channels(x: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = x[..axis].iter().product();
    let inner = x[axis + 1..].iter().product();
    (outer, x[axis], inner)
}

fn pool_geometry(g: &Pool2dGeometry, x: &[usize], y: &[usize]) -> Pool {
    let i = |v: usize| v as i64;
    Pool {
        nc: i(x[0] * x[1]),
        h: i(x[2]),
        w: i(x[3]),
        oh: i(y[2]),
        ow: i(y[3]),
        kh: i(g.kernel[0]),
        kw: i(g.kernel[1]),
        sh: i(g.stride[0]),
        sw: i(g.stride[1]),
        ph: i(g.padding[0]),
        pw: i(g.padding[1]),
    }
}

/// The pooling mode of `conv.cu`, its beta (smooth max only) and the geometry of a pooling
/// op.
fn pool_mode(op: &Op) -> Result<(i32, f32, &Pool2dGeometry)> {
    match op {
        Op::MaxPool2d(g) => Ok((0, 1.0, g)),
        Op::AvgPool2d {
            geometry,
            count_include_pad,
        } => Ok((if *count_include_pad { 2 } else { 1 }, 1.0, geometry)),
        Op::SmoothMaxPool2d { geometry, beta } => Ok((3, *beta, geometry)),
        other => Err(Error::Other(format!(
            "native_cuda has no pooling kernel for `{}`",
            other.name()
        ))),
    }
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
    match op {
        Op::Conv2d(_) | Op::ConvTranspose2d(_) => {
            let w = buffer(op, inputs[1])?;
            let bias = match inputs.get(2) {
                Some(b) => Some(buffer(op, b)?),
                None => None,
            };
            let g = conv_geometry(op, inputs[0].shape(), inputs[1].shape(), &shape)?;
            if n > 0 {
                let has_bias = bias.is_some() as i32;
                let mut l = cx.stream.launch_builder(conv_kernels(cx, op).0);
                l.arg(x.slice())
                    .arg(w.slice())
                    // without a bias the kernel never reads this argument
                    .arg(bias.unwrap_or(w).slice())
                    .arg(&has_bias)
                    .arg(out.slice_mut())
                    .arg(&g);
                // SAFETY: each output thread reads x inside [n, cin, h, w] (taps outside are
                // padding or land elsewhere, not read), w inside its shape ([cout, cin/groups,
                // kh, kw] or, transposed, [cin, cout/groups, kh, kw]) and bias[co < cout]
                // (the shape rule checked the shapes), and writes its own output element.
                launched(op, unsafe { l.launch(grid(n)) })?;
            }
        }
        Op::MaxPool2d(_) | Op::AvgPool2d { .. } | Op::SmoothMaxPool2d { .. } => {
            let (mode, beta, geometry) = pool_mode(op)?;
            let g = pool_geometry(geometry, inputs[0].shape(), &shape);
            if n > 0 {
                let mut l = cx.stream.launch_builder(&cx.functions.pool2d_forward);
                l.arg(&mode)
                    .arg(&beta)
                    .arg(x.slice())
                    .arg(out.slice_mut())
                    .arg(&g);
                // SAFETY: each output thread reads the real elements of its window (inside
                // [nc, h, w]) and writes its own output element.
                launched(op, unsafe { l.launch(grid(n)) })?;
            }
        }
        Op::BatchNorm { eps, channel_axis } => {
            let (o, c, i) = channels(inputs[0].shape(), *channel_axis);
            let gamma = buffer(op, inputs[1])?;
            let beta = match inputs.get(2) {
                Some(b) => Some(buffer(op, b)?),
                None => None,
            };
            if n > 0 {
                let has_beta = beta.is_some() as i32;
                let (o64, c64, i64_) = (o as i64, c as i64, i as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.batch_norm_forward);
                l.arg(x.slice())
                    .arg(gamma.slice())
                    // without a beta the kernel never reads this argument
                    .arg(beta.unwrap_or(gamma).slice())
                    .arg(&has_beta)
                    .arg(out.slice_mut())
                    .arg(&o64)
                    .arg(&c64)
                    .arg(&i64_)
                    .arg(eps);
                // SAFETY: block ch < c reads channel ch's outer·inner elements of x (shape
                // [outer, c, inner]) and gamma[ch] (beta[ch]): shapes [c] by the shape rule;
                // it writes those elements of y.
                launched(op, unsafe { l.launch(blocks(c)) })?;
            }
        }
        Op::MseLoss => {
            // the mean of (a - b)², summed in a fixed order over many blocks (0/0 = NaN for
            // no elements, as the spec)
            let b = buffer(op, inputs[1])?;
            let n = inputs[0].numel();
            let terms = super::SumTerms::SquaredDifferences(x, b);
            super::deterministic_sum(cx, op, terms, n, n as f32, &mut out)?;
        }
        other => {
            return Err(Error::Other(format!(
                "native_cuda has no conv or pool kernel for op `{}`",
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
    let in_use = cx()?;
    let cx = &*in_use;
    let g = buffer(op, gy)?;
    let x = buffer(op, inputs[0])?;
    let x_shape = inputs[0].shape();
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    match op {
        Op::Conv2d(_) | Op::ConvTranspose2d(_) => {
            let w = buffer(op, inputs[1])?;
            let geo = conv_geometry(op, x_shape, inputs[1].shape(), output_t.shape())?;
            let (_, grad_input, grad_weight) = conv_kernels(cx, op);
            let mut grads = Vec::with_capacity(inputs.len());
            grads.push(needed_grad(op, needs, 0, inputs[0], |gx| {
                let mut l = cx.stream.launch_builder(grad_input);
                l.arg(g.slice())
                    .arg(w.slice())
                    .arg(gx.slice_mut())
                    .arg(&geo);
                // SAFETY: each input thread reads the output gradients and weights of the
                // taps landing on it (indices checked against oh, ow, kh, kw) and writes its
                // own element.
                launched(op, unsafe { l.launch(grid(inputs[0].numel())) })
            })?);
            grads.push(needed_grad(op, needs, 1, inputs[1], |gw| {
                let mut l = cx.stream.launch_builder(grad_weight);
                l.arg(x.slice())
                    .arg(g.slice())
                    .arg(gw.slice_mut())
                    .arg(&geo);
                // SAFETY: each block owns one weight element (grid-stride over all of them),
                // reads x inside its shape (padding is not read) and gy inside [n, cout, oh,
                // ow], and its thread 0 writes that element.
                launched(op, unsafe { l.launch(blocks(inputs[1].numel())) })
            })?);
            if let Some(bias) = inputs.get(2) {
                grads.push(needed_grad(op, needs, 2, bias, |gb| {
                    let mut l = cx.stream.launch_builder(&cx.functions.conv2d_grad_bias);
                    l.arg(g.slice()).arg(gb.slice_mut()).arg(&geo);
                    // SAFETY: each block owns one output channel (cout = the bias's length,
                    // the shape rule), reads its gy elements and writes gb[co].
                    launched(op, unsafe { l.launch(blocks(bias.numel())) })
                })?);
            }
            Ok(grads)
        }
        Op::MaxPool2d(_) | Op::AvgPool2d { .. } | Op::SmoothMaxPool2d { .. } => {
            let (mode, beta, geometry) = pool_mode(op)?;
            let geo = pool_geometry(geometry, x_shape, output_t.shape());
            let nx = inputs[0].numel();
            let y = buffer(op, output_t)?;
            let mut gx = output(cx, op, nx)?;
            if nx > 0 {
                let mut l = cx.stream.launch_builder(&cx.functions.pool2d_vjp);
                l.arg(&mode)
                    .arg(&beta)
                    .arg(x.slice())
                    .arg(y.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(&geo);
                // SAFETY: each input thread reads the windows that hold it (window indices
                // clamped to [0, oh) x [0, ow), their real elements inside [nc, h, w]) and
                // writes its own element.
                launched(op, unsafe { l.launch(grid(nx)) })?;
            }
            Ok(vec![Some(tensor(gx, x_shape)?)])
        }
        Op::BatchNorm { eps, channel_axis } => {
            let (o, c, i) = channels(x_shape, *channel_axis);
            let gamma = buffer(op, inputs[1])?;
            let nx = inputs[0].numel();
            let mut gx = output(cx, op, nx)?;
            let (mut ggamma, mut gbeta) = (output(cx, op, c)?, output(cx, op, c)?);
            if nx > 0 {
                let (o64, c64, i64_) = (o as i64, c as i64, i as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.batch_norm_vjp);
                l.arg(x.slice())
                    .arg(gamma.slice())
                    .arg(g.slice())
                    .arg(gx.slice_mut())
                    .arg(ggamma.slice_mut())
                    .arg(gbeta.slice_mut())
                    .arg(&o64)
                    .arg(&c64)
                    .arg(&i64_)
                    .arg(eps);
                // SAFETY: block ch < c reads channel ch's elements of x and gy and gamma[ch],
                // writes those elements of gx and ggamma[ch], gbeta[ch] (buffers of c).
                launched(op, unsafe { l.launch(blocks(c)) })?;
            } else {
                // no element: the statistics' gradients are sums of nothing
                launched(op, cx.stream.memset_zeros(ggamma.slice_mut()))?;
                launched(op, cx.stream.memset_zeros(gbeta.slice_mut()))?;
            }
            let param = inputs[1].shape();
            let mut grads = vec![
                need(0).then(|| tensor(gx, x_shape)).transpose()?,
                need(1).then(|| tensor(ggamma, param)).transpose()?,
            ];
            if inputs.len() == 3 {
                grads.push(need(2).then(|| tensor(gbeta, param)).transpose()?);
            }
            Ok(grads)
        }
        Op::MseLoss => {
            let b = buffer(op, inputs[1])?;
            let m = inputs[0].numel();
            let (mut ga, mut gb) = (output(cx, op, m)?, output(cx, op, m)?);
            if m > 0 {
                let m64 = m as i64;
                let mut l = cx.stream.launch_builder(&cx.functions.mse_vjp);
                l.arg(x.slice())
                    .arg(b.slice())
                    .arg(g.slice())
                    .arg(ga.slice_mut())
                    .arg(gb.slice_mut())
                    .arg(&m64);
                // SAFETY: element threads read a[i], b[i] (i < m) and the scalar gy, and
                // write ga[i], gb[i].
                launched(op, unsafe { l.launch(grid(m)) })?;
            }
            Ok(vec![
                need(0).then(|| tensor(ga, x_shape)).transpose()?,
                need(1).then(|| tensor(gb, x_shape)).transpose()?,
            ])
        }
        other => Err(Error::Other(format!(
            "native_cuda has no conv or pool VJP for op `{}`",
            other.name()
        ))),
    }
}
