//! Native pool kernels: direct window loops over clipped (unpadded) window ranges, one
//! N*C plane per parallel task. The max (and the smooth max's shift) is the first maximum
//! of the window in row-major order, NaN ranking above every number, as in the spec; backward scatters stay inside the
//! plane, so every gradient element is written by exactly one task in a fixed order.

use super::par::PAR_THRESHOLD;
use crate::graph::{Op, Pool2dGeometry};
use crate::tensor::Tensor;
use rayon::prelude::*;

fn geometry(op: &Op) -> Pool2dGeometry {
    match op {
        Op::MaxPool2d(g)
        | Op::AvgPool2d { geometry: g, .. }
        | Op::SmoothMaxPool2d { geometry: g, .. } => *g,
        _ => unreachable!("pool::geometry called for {}", op.name()),
    }
}

/// Plane geometry: input (h, w), output (oh, ow), and the pool window.
#[derive(Clone, Copy)]
struct Plane {
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    g: Pool2dGeometry,
}

impl Plane {
    fn new(op: &Op, x: &[usize], y: &[usize]) -> Self {
        Plane {
            h: x[2],
            w: x[3],
            oh: y[2],
            ow: y[3],
            g: geometry(op),
        }
    }

    /// The clipped half-open range of input coordinates covered by output index `o` on
    /// axis `a` (extent `n`).
    fn range(&self, a: usize, o: usize, n: usize) -> (usize, usize) {
        let start = o * self.g.stride[a];
        let lo = start.saturating_sub(self.g.padding[a]).min(n);
        let hi = (start + self.g.kernel[a])
            .saturating_sub(self.g.padding[a])
            .min(n);
        (lo, hi.max(lo))
    }

    /// Calls `f(o, rows, cols)` for every output position `o` of the plane with its clipped
    /// window.
    fn for_each_window(&self, mut f: impl FnMut(usize, (usize, usize), (usize, usize))) {
        for i in 0..self.oh {
            let rows = self.range(0, i, self.h);
            for j in 0..self.ow {
                f(i * self.ow + j, rows, self.range(1, j, self.w));
            }
        }
    }
}

/// The flat in-plane index of the first maximum of a window (row-major; a NaN ranks above
/// every number, so the first NaN is the maximum: `crate::scalar::beats_max`), or `None` for
/// an empty window.
fn first_max(x: &[f32], w: usize, rows: (usize, usize), cols: (usize, usize)) -> Option<usize> {
    if rows.0 >= rows.1 || cols.0 >= cols.1 {
        return None;
    }
    let mut best = rows.0 * w + cols.0;
    let mut bv = x[best];
    for r in rows.0..rows.1 {
        for (s, &v) in x[r * w + cols.0..r * w + cols.1].iter().enumerate() {
            if crate::scalar::beats_max(v, bv) {
                best = r * w + cols.0 + s;
                bv = v;
            }
        }
    }
    Some(best)
}

fn window_sum(x: &[f32], w: usize, rows: (usize, usize), cols: (usize, usize)) -> f32 {
    let mut s = 0.0f32;
    for r in rows.0..rows.1 {
        s += x[r * w + cols.0..r * w + cols.1].iter().sum::<f32>();
    }
    s
}

/// The divisor of an average window.
fn divisor(op: &Op, g: &Pool2dGeometry, rows: (usize, usize), cols: (usize, usize)) -> f32 {
    match op {
        Op::AvgPool2d {
            count_include_pad: true,
            ..
        } => (g.kernel[0] * g.kernel[1]) as f32,
        _ => ((rows.1 - rows.0) * (cols.1 - cols.0)) as f32,
    }
}

/// Runs `f(plane_index, out_plane)` over chunks of `out` of length `per`, in parallel when
/// large.
fn planes(out: &mut [f32], per: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if per == 0 {
        return;
    }
    if out.len() < PAR_THRESHOLD {
        out.chunks_mut(per).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

pub fn forward(op: &Op, x: &Tensor, out_shape: &[usize]) -> Vec<f32> {
    let pl = Plane::new(op, x.shape(), out_shape);
    let xd = x.data();
    let (hw, ohw) = (pl.h * pl.w, pl.oh * pl.ow);
    let mut y = super::par::zeroed(out_shape.iter().product());
    planes(&mut y, ohw, |p, yp| {
        let xp = &xd[p * hw..(p + 1) * hw];
        match op {
            Op::MaxPool2d(_) => pl.for_each_window(|o, rows, cols| {
                yp[o] = first_max(xp, pl.w, rows, cols).map_or(f32::NEG_INFINITY, |f| xp[f]);
            }),
            Op::AvgPool2d { .. } => pl.for_each_window(|o, rows, cols| {
                yp[o] = window_sum(xp, pl.w, rows, cols) / divisor(op, &pl.g, rows, cols);
            }),
            Op::SmoothMaxPool2d { beta, .. } => {
                let b = *beta;
                pl.for_each_window(|o, rows, cols| {
                    let Some(f) = first_max(xp, pl.w, rows, cols) else {
                        yp[o] = f32::NEG_INFINITY;
                        return;
                    };
                    // the spec's shift: the max when finite, else 0 (+inf gives +inf)
                    let m = crate::spec::smooth_shift(xp[f]);
                    let mut s = 0.0f32;
                    for r in rows.0..rows.1 {
                        for v in &xp[r * pl.w + cols.0..r * pl.w + cols.1] {
                            s += super::vmath::exp(b * (v - m));
                        }
                    }
                    yp[o] = m + s.ln() / b;
                });
            }
            _ => unreachable!("pool::forward called for {}", op.name()),
        }
    });
    y
}

pub fn vjp(op: &Op, x: &Tensor, y: &Tensor, gy: &Tensor) -> Vec<f32> {
    let pl = Plane::new(op, x.shape(), y.shape());
    let (xd, yd, gyd) = (x.data(), y.data(), gy.data());
    let (hw, ohw) = (pl.h * pl.w, pl.oh * pl.ow);
    let mut gx = super::par::zeroed(xd.len());
    planes(&mut gx, hw, |p, gp| {
        let xp = &xd[p * hw..(p + 1) * hw];
        let (yp, gyp) = (&yd[p * ohw..(p + 1) * ohw], &gyd[p * ohw..(p + 1) * ohw]);
        match op {
            Op::MaxPool2d(_) => pl.for_each_window(|o, rows, cols| {
                if let Some(f) = first_max(xp, pl.w, rows, cols) {
                    gp[f] += gyp[o];
                }
            }),
            Op::AvgPool2d { .. } => pl.for_each_window(|o, rows, cols| {
                let v = gyp[o] / divisor(op, &pl.g, rows, cols);
                for r in rows.0..rows.1 {
                    for a in &mut gp[r * pl.w + cols.0..r * pl.w + cols.1] {
                        *a += v;
                    }
                }
            }),
            Op::SmoothMaxPool2d { beta, .. } => {
                let b = *beta;
                pl.for_each_window(|o, rows, cols| {
                    // d y / d x_f = exp(beta (x_f - y)): the softmax weight of x_f
                    let (g, yo) = (gyp[o], yp[o]);
                    for r in rows.0..rows.1 {
                        let span = r * pl.w + cols.0..r * pl.w + cols.1;
                        for (a, v) in gp[span.clone()].iter_mut().zip(&xp[span]) {
                            *a += g * super::vmath::exp(b * (v - yo));
                        }
                    }
                });
            }
            _ => unreachable!("pool::vjp called for {}", op.name()),
        }
    });
    gx
}
