//! 2-D pooling over NCHW input: `max_pool2d` (padding never wins), `avg_pool2d` (divisor is
//! the full window with `count_include_pad`, else the valid count), and `smooth_max_pool2d`
//! (`(1/beta) ln Σ exp(beta x)` over the valid window). Padding may be at most half the
//! kernel, so every window holds at least one real element. The max gradient goes to the
//! first maximum of its window.
//!
//! NaN: a window holding a NaN has max NaN (the first NaN is its maximum, as in PyTorch's
//! argmax; PyTorch's CPU max-pool routes the gradient to the window's *last* NaN instead) and
//! smooth max NaN. The smooth max shifts by the window maximum when it is finite and by 0
//! otherwise (PyTorch's `logsumexp`), so a window holding +inf gives +inf and an all -inf
//! window gives -inf, as the formula's limit.

use super::{expect_arity, payload_err, shape_err, Array, InputGrads, MAX_ELEMENTS, MAX_WORK};
use crate::error::OpError;
use crate::graph::{Op, Pool2dGeometry};
use crate::scalar::{beats_max, Scalar};

pub(crate) fn geometry(op: &Op) -> Pool2dGeometry {
    match op {
        Op::MaxPool2d(g)
        | Op::AvgPool2d { geometry: g, .. }
        | Op::SmoothMaxPool2d { geometry: g, .. } => *g,
        _ => unreachable!("pool::geometry called for {}", op.name()),
    }
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[1])?;
    let g = geometry(op);
    // `2 * padding <= kernel`, written so that it cannot wrap (padding 2^63 would double to 0)
    if g.kernel.contains(&0)
        || g.stride.contains(&0)
        || (0..2).any(|a| g.padding[a] > g.kernel[a] / 2)
    {
        return Err(payload_err(
            op,
            format!(
                "kernel and stride must be >= 1 and padding at most half the kernel, got {g:?}"
            ),
        ));
    }
    if let Op::SmoothMaxPool2d { beta, .. } = op {
        if !(*beta > 0.0 && beta.is_finite()) {
            return Err(payload_err(
                op,
                format!("beta must be finite and > 0, got {beta}"),
            ));
        }
    }
    let x = shapes[0];
    if x.len() != 4 || x[2] == 0 || x[3] == 0 {
        return Err(shape_err(
            op,
            shapes,
            "x [N, C, H, W] with H, W >= 1 (so that every window holds a real element)",
        ));
    }
    // The padded input, at most MAX_ELEMENTS per axis (so every tap index fits in isize);
    // padding <= kernel / 2 above bounds it by size + kernel, so this only fails when the
    // kernel itself is beyond any real input.
    let padded = |a: usize| {
        g.padding[a]
            .checked_mul(2)
            .and_then(|pp| x[2 + a].checked_add(pp))
            .filter(|&n| n <= MAX_ELEMENTS)
    };
    let (Some(ph), Some(pw)) = (padded(0), padded(1)) else {
        return Err(payload_err(
            op,
            format!("kernel {:?} and padding {:?} give a padded input beyond {MAX_ELEMENTS} (2^34) elements per axis", g.kernel, g.padding),
        ));
    };
    // A window larger than the padded input is refused (as PyTorch does).
    let out =
        |padded: usize, a: usize| padded.checked_sub(g.kernel[a]).map(|e| e / g.stride[a] + 1);
    let (Some(oh), Some(ow)) = (out(ph, 0), out(pw, 1)) else {
        return Err(shape_err(
            op,
            shapes,
            format!(
                "a padded input at least as large as the kernel {:?} (padding {:?})",
                g.kernel, g.padding
            ),
        ));
    };
    // The window is the one loop factor that comes from the payload alone: bound the taps
    // of one window and of the whole op (output elements x window taps), checked, so that a
    // payload cannot make any provider's work unbounded (the reference visits every tap, and
    // avg_pool2d's count_include_pad divisor is this product).
    let work = g.kernel[0].checked_mul(g.kernel[1]).and_then(|taps| {
        [x[0], x[1], oh, ow]
            .iter()
            .try_fold(taps, |n, &d| n.checked_mul(d))
    });
    match work {
        Some(w) if w <= MAX_WORK => Ok(vec![x[0], x[1], oh, ow]),
        _ => Err(payload_err(
            op,
            format!(
                "kernel {:?} on input {x:?} needs more than {MAX_WORK} (2^34) window taps (output elements x kernel area); use a smaller window or a reduction",
                g.kernel
            ),
        )),
    }
}

/// For every output element: the flat input indices of its window's real (unpadded) elements.
fn windows(g: &Pool2dGeometry, x: &[usize], y: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::with_capacity(y.iter().product());
    for nc in 0..x[0] * x[1] {
        for i in 0..y[2] {
            for j in 0..y[3] {
                let mut win = Vec::new();
                for p in 0..g.kernel[0] {
                    for q in 0..g.kernel[1] {
                        let r = (i * g.stride[0] + p) as isize - g.padding[0] as isize;
                        let s = (j * g.stride[1] + q) as isize - g.padding[1] as isize;
                        if r >= 0 && s >= 0 && (r as usize) < x[2] && (s as usize) < x[3] {
                            win.push((nc * x[2] + r as usize) * x[3] + s as usize);
                        }
                    }
                }
                out.push(win);
            }
        }
    }
    out
}

fn divisor<T: Scalar>(op: &Op, win: &[usize]) -> T {
    match op {
        Op::AvgPool2d {
            geometry,
            count_include_pad: true,
        } => T::c((geometry.kernel[0] * geometry.kernel[1]) as f64),
        _ => T::c(win.len() as f64),
    }
}

fn first_max<T: Scalar>(x: &[T], win: &[usize]) -> usize {
    let mut best = win[0];
    for &f in &win[1..] {
        if beats_max(x[f], x[best]) {
            best = f;
        }
    }
    best
}

/// The shift of a smooth max (log-sum-exp) from its window maximum: the maximum when finite,
/// else 0 (so +inf and all -inf windows give their limits, not inf - inf = NaN); NaN stays NaN.
pub(crate) fn smooth_shift<T: Scalar>(m: T) -> T {
    if m.is_infinite() {
        T::zero()
    } else {
        m
    }
}

pub(super) fn forward<T: Scalar>(op: &Op, x: &Array<T>, out_shape: Vec<usize>) -> Array<T> {
    let ws = windows(&geometry(op), &x.shape, &out_shape);
    let data = ws
        .iter()
        .map(|win| match op {
            Op::MaxPool2d(_) => x.data[first_max(&x.data, win)],
            // the spec's sum (a sum of −0s is +0, as PyTorch's; the iterator's starts at −0)
            Op::AvgPool2d { .. } => {
                super::sum::sum(win.iter().map(|&f| x.data[f])) / divisor(op, win)
            }
            Op::SmoothMaxPool2d { beta, .. } => {
                let b = T::c(*beta as f64);
                let m = smooth_shift(x.data[first_max(&x.data, win)]);
                m + win
                    .iter()
                    .map(|&f| (b * (x.data[f] - m)).exp())
                    .sum::<T>()
                    .ln()
                    / b
            }
            _ => unreachable!("pool::forward called for {}", op.name()),
        })
        .collect();
    Array {
        shape: out_shape,
        data,
    }
}

pub(super) fn vjp<T: Scalar>(op: &Op, x: &Array<T>, y: &Array<T>, gy: &Array<T>) -> InputGrads<T> {
    let ws = windows(&geometry(op), &x.shape, &y.shape);
    let mut gx = Array::zeros(&x.shape);
    for (o, win) in ws.iter().enumerate() {
        match op {
            Op::MaxPool2d(_) => gx.data[first_max(&x.data, win)] += gy.data[o],
            Op::AvgPool2d { .. } => {
                let d: T = divisor(op, win);
                for &f in win {
                    gx.data[f] += gy.data[o] / d;
                }
            }
            Op::SmoothMaxPool2d { beta, .. } => {
                // d/dx_f = exp(beta (x_f - y)): the softmax weight of x_f in its window
                let b = T::c(*beta as f64);
                for &f in win {
                    gx.data[f] += gy.data[o] * (b * (x.data[f] - y.data[o])).exp();
                }
            }
            _ => unreachable!("pool::vjp called for {}", op.name()),
        }
    }
    vec![Some(gx)]
}
