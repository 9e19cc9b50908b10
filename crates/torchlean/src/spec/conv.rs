//! `conv2d` (NCHW input, OIHW weight, optional bias; stride, padding, dilation, groups) and
//! `conv_transpose2d` (weight [C_in, C_out/groups, KH, KW]; adds output padding).
//!
//! Both are written as an enumeration of *taps* — (input index, weight index, output index)
//! triples — so that forward (`y += x*w`) and VJP (`gx += gy*w`, `gw += x*gy`) read the same
//! geometry. Output sizes follow PyTorch.
//!
//! Padding is zeros that take part in the products, as PyTorch's im2col/col2im: a conv2d tap
//! whose input position is padding multiplies its weight by 0 (so an infinite weight there
//! gives NaN, IEEE), and a conv_transpose2d tap whose output position is cropped adds nothing
//! to the output but reads a zero cotangent in the VJP (`gx += 0·w`, `gw += x·0`).

use super::{expect_arity, payload_err, shape_err, Array, InputGrads, MAX_ELEMENTS};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

/// Why one spatial axis of a convolution has no output size.
enum AxisError {
    /// A size, padding, stride or dilation combination overflows or exceeds [`MAX_ELEMENTS`].
    TooLarge,
    /// The padded input is smaller than the dilated kernel (or the padding exceeds the
    /// transposed output).
    Empty,
}

/// `a + 2 * p`, bounded by [`MAX_ELEMENTS`] so that every tap index of the op (at most the
/// padded extent) fits in `isize` with room to spare.
fn padded(a: usize, p: usize) -> Result<usize, AxisError> {
    p.checked_mul(2)
        .and_then(|pp| a.checked_add(pp))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or(AxisError::TooLarge)
}

/// Extent of a dilated kernel: `d * (k - 1) + 1` (a zero-sized kernel counts as 1).
fn dilated_span(k: usize, d: usize) -> Result<usize, AxisError> {
    d.checked_mul(k.max(1) - 1)
        .and_then(|n| n.checked_add(1))
        .ok_or(AxisError::TooLarge)
}

/// Output spatial size of a convolution along one axis (PyTorch's formula, checked).
fn conv_out(size: usize, k: usize, s: usize, p: usize, d: usize) -> Result<usize, AxisError> {
    let padded = padded(size, p)?;
    let span = dilated_span(k, d)?;
    padded
        .checked_sub(span)
        .map(|e| e / s + 1)
        .ok_or(AxisError::Empty)
}

/// Output spatial size of a transposed convolution along one axis (checked): the full
/// extent `(size - 1) * s + d * (k - 1) + op + 1` must be at most [`MAX_ELEMENTS`], and the
/// padding on both sides no larger than it.
fn conv_transpose_out(
    size: usize,
    k: usize,
    s: usize,
    p: usize,
    d: usize,
    op: usize,
) -> Result<usize, AxisError> {
    let full = (size.max(1) - 1)
        .checked_mul(s)
        .and_then(|n| n.checked_add(dilated_span(k, d).ok()?))
        .and_then(|n| n.checked_add(op))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or(AxisError::TooLarge)?;
    let both = p.checked_mul(2).ok_or(AxisError::TooLarge)?;
    full.checked_sub(both).ok_or(AxisError::Empty)
}

/// Combines the two axes' results into (oh, ow) or the op's error.
fn spatial(
    op: &Op,
    shapes: &[&[usize]],
    oh: Result<usize, AxisError>,
    ow: Result<usize, AxisError>,
    empty: &str,
) -> Result<(usize, usize), OpError> {
    match (oh, ow) {
        (Ok(oh), Ok(ow)) => Ok((oh, ow)),
        (Err(AxisError::TooLarge), _) | (_, Err(AxisError::TooLarge)) => Err(payload_err(
            op,
            format!(
                "padding, stride, dilation and output padding give spatial extents beyond {MAX_ELEMENTS} (2^34) or overflow, for input shapes {shapes:?}"
            ),
        )),
        _ => Err(shape_err(op, shapes, empty)),
    }
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[2, 3])?;
    let (x, w) = (shapes[0], shapes[1]);
    if x.len() != 4 || w.len() != 4 {
        return Err(shape_err(op, shapes, "x [N, C, H, W] and a 4-D weight"));
    }
    match op {
        Op::Conv2d(g) => {
            if g.groups == 0 || g.stride.contains(&0) || g.dilation.contains(&0) {
                return Err(payload_err(
                    op,
                    format!("groups, stride and dilation must be >= 1, got {g:?}"),
                ));
            }
            let ok = x[1] % g.groups == 0
                && w[0] % g.groups == 0
                && w[1].checked_mul(g.groups) == Some(x[1])
                && (shapes.len() == 2 || shapes[2] == [w[0]]);
            if !ok {
                return Err(shape_err(op, shapes, format!(
                    "weight [O, C/groups, KH, KW] with C and O divisible by groups={} and bias [O]", g.groups)));
            }
            let oh = conv_out(x[2], w[2], g.stride[0], g.padding[0], g.dilation[0]);
            let ow = conv_out(x[3], w[3], g.stride[1], g.padding[1], g.dilation[1]);
            let (oh, ow) = spatial(
                op,
                shapes,
                oh,
                ow,
                "a padded input at least as large as the dilated kernel",
            )?;
            Ok(vec![x[0], w[0], oh, ow])
        }
        Op::ConvTranspose2d(g) => {
            if g.groups == 0 || g.stride.contains(&0) || g.dilation.contains(&0) {
                return Err(payload_err(
                    op,
                    format!("groups, stride and dilation must be >= 1, got {g:?}"),
                ));
            }
            for a in 0..2 {
                if g.output_padding[a] >= g.stride[a].max(g.dilation[a]) {
                    return Err(payload_err(
                        op,
                        "output_padding must be smaller than stride or dilation",
                    ));
                }
            }
            let cout = w[1].checked_mul(g.groups).ok_or_else(|| {
                payload_err(
                    op,
                    format!(
                        "groups={} times the weight's {} output channels overflows",
                        g.groups, w[1]
                    ),
                )
            })?;
            let ok =
                x[1] == w[0] && x[1] % g.groups == 0 && (shapes.len() == 2 || shapes[2] == [cout]);
            if !ok {
                return Err(shape_err(op, shapes, format!(
                    "weight [C_in, C_out/groups, KH, KW] with C_in = x's channels divisible by groups={} and bias [C_out]", g.groups)));
            }
            let oh = conv_transpose_out(
                x[2],
                w[2],
                g.stride[0],
                g.padding[0],
                g.dilation[0],
                g.output_padding[0],
            );
            let ow = conv_transpose_out(
                x[3],
                w[3],
                g.stride[1],
                g.padding[1],
                g.dilation[1],
                g.output_padding[1],
            );
            let empty = "a non-empty input and padding no larger than the transposed output";
            if x[2] == 0 || x[3] == 0 {
                return Err(shape_err(op, shapes, empty));
            }
            let (oh, ow) = spatial(op, shapes, oh, ow, empty)?;
            Ok(vec![x[0], cout, oh, ow])
        }
        _ => unreachable!("conv::shape called for {}", op.name()),
    }
}

/// Calls `tap(x_index, w_index, y_index)` for every multiply-accumulate of the op; `None` for
/// a position in the padding (conv2d's input, conv_transpose2d's cropped output).
fn for_each_tap(
    op: &Op,
    x: &[usize],
    w: &[usize],
    y: &[usize],
    mut tap: impl FnMut(Option<usize>, usize, Option<usize>),
) {
    let (n, (h, wd), (oh, ow), (kh, kw)) = (x[0], (x[2], x[3]), (y[2], y[3]), (w[2], w[3]));
    match op {
        Op::Conv2d(g) => {
            let (cg, og) = (x[1] / g.groups, w[0] / g.groups);
            for b in 0..n {
                for o in 0..w[0] {
                    let grp = o / og;
                    for i in 0..oh {
                        for j in 0..ow {
                            let yi = ((b * w[0] + o) * oh + i) * ow + j;
                            for c in 0..cg {
                                for p in 0..kh {
                                    for q in 0..kw {
                                        let r = (i * g.stride[0] + p * g.dilation[0]) as isize
                                            - g.padding[0] as isize;
                                        let s = (j * g.stride[1] + q * g.dilation[1]) as isize
                                            - g.padding[1] as isize;
                                        let pad =
                                            r < 0 || s < 0 || r as usize >= h || s as usize >= wd;
                                        let xi = (!pad).then(|| {
                                            ((b * x[1] + grp * cg + c) * h + r as usize) * wd
                                                + s as usize
                                        });
                                        let wi = ((o * cg + c) * kh + p) * kw + q;
                                        tap(xi, wi, Some(yi));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Op::ConvTranspose2d(g) => {
            let (cg, og) = (x[1] / g.groups, w[1]);
            for b in 0..n {
                for ci in 0..x[1] {
                    let grp = ci / cg;
                    for r in 0..h {
                        for s in 0..wd {
                            let xi = ((b * x[1] + ci) * h + r) * wd + s;
                            for oc in 0..og {
                                for p in 0..kh {
                                    for q in 0..kw {
                                        let i = (r * g.stride[0] + p * g.dilation[0]) as isize
                                            - g.padding[0] as isize;
                                        let j = (s * g.stride[1] + q * g.dilation[1]) as isize
                                            - g.padding[1] as isize;
                                        let crop =
                                            i < 0 || j < 0 || i as usize >= oh || j as usize >= ow;
                                        let yi = (!crop).then(|| {
                                            ((b * y[1] + grp * og + oc) * oh + i as usize) * ow
                                                + j as usize
                                        });
                                        let wi = ((ci * og + oc) * kh + p) * kw + q;
                                        tap(Some(xi), wi, yi);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        _ => unreachable!("conv::for_each_tap called for {}", op.name()),
    }
}

/// Output channel of flat output index `yi` for output shape `y`.
fn channel_of(yi: usize, y: &[usize]) -> usize {
    (yi / (y[2] * y[3])) % y[1]
}

pub(super) fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>], out_shape: Vec<usize>) -> Array<T> {
    let mut y = Array::zeros(&out_shape);
    if let Some(b) = xs.get(2) {
        for (yi, v) in y.data.iter_mut().enumerate() {
            *v = b.data[channel_of(yi, &out_shape)];
        }
    }
    for_each_tap(op, &xs[0].shape, &xs[1].shape, &out_shape, |xi, wi, yi| {
        if let Some(yi) = yi {
            y.data[yi] += xi.map_or(T::zero(), |xi| xs[0].data[xi]) * xs[1].data[wi];
        }
    });
    y
}

pub(super) fn vjp<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    let mut gx = Array::zeros(&xs[0].shape);
    // a weight's and a bias's gradient sum over every output position: cascaded
    let mut gw = super::sum::Sums::new(xs[1].numel());
    for_each_tap(op, &xs[0].shape, &xs[1].shape, &gy.shape, |xi, wi, yi| {
        let g = yi.map_or(T::zero(), |yi| gy.data[yi]);
        if let Some(xi) = xi {
            gx.data[xi] += g * xs[1].data[wi];
        }
        gw.add(wi, xi.map_or(T::zero(), |xi| xs[0].data[xi]) * g);
    });
    let mut grads = vec![Some(gx), Some(gw.into_array(&xs[1].shape))];
    if let Some(b) = xs.get(2) {
        let mut gb = super::sum::Sums::new(b.numel());
        for (yi, &g) in gy.data.iter().enumerate() {
            gb.add(channel_of(yi, &gy.shape), g);
        }
        grads.push(Some(gb.into_array(&b.shape)));
    }
    grads
}
