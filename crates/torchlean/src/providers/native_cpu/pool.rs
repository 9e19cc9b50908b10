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

/// Whether the plane's windows are the common 2×2, stride 2, no padding: every window then
/// lies inside the plane (oh = ⌊h/2⌋, ow = ⌊w/2⌋), and the 2×2 loops below replace the
/// general window walk (which spent most of a small CNN's inference in per-window range
/// arithmetic). They compare and add in the general loops' order — the same first
/// maximum, the same sums bit for bit.
fn is_2x2(pl: &Plane) -> bool {
    let g = &pl.g;
    g.kernel == [2, 2]
        && g.stride == [2, 2]
        && g.padding == [0, 0]
        && 2 * pl.oh <= pl.h
        && 2 * pl.ow <= pl.w
}

/// The in-window offset (0..4, row-major) of the first maximum of (a, b; c, d), as
/// [`first_max`] finds it, and its value. Branch-free (`beats_max` with non-short-circuit
/// operators, so the compiler selects instead of branching on data: a max pool's
/// comparisons are unpredictable); a caller that uses only the value loses the index work.
#[inline(always)]
fn first_max_2x2(v: [f32; 4]) -> (usize, f32) {
    let (mut best, mut bv) = (0usize, v[0]);
    for (k, &x) in v.iter().enumerate().skip(1) {
        let take = (x > bv) | (x.is_nan() & !bv.is_nan());
        best = if take { k } else { best };
        bv = if take { x } else { bv };
    }
    (best, bv)
}

/// The two input rows under output row `i` of a 2×2 plane (`2·ow` values each).
#[inline]
fn rows_2x2<'a>(xp: &'a [f32], pl: &Plane, i: usize) -> (&'a [f32], &'a [f32]) {
    let (r0, r1) = (2 * i * pl.w, (2 * i + 1) * pl.w);
    (&xp[r0..r0 + 2 * pl.ow], &xp[r1..r1 + 2 * pl.ow])
}

/// Max or average pooling of one 2×2 plane (see [`is_2x2`]).
fn forward_2x2(max: bool, xp: &[f32], yp: &mut [f32], pl: &Plane) {
    for i in 0..pl.oh {
        let (top, bottom) = rows_2x2(xp, pl, i);
        let out = &mut yp[i * pl.ow..(i + 1) * pl.ow];
        for ((y, t), b) in out
            .iter_mut()
            .zip(top.chunks_exact(2))
            .zip(bottom.chunks_exact(2))
        {
            let v = [t[0], t[1], b[0], b[1]];
            *y = if max {
                first_max_2x2(v).1
            } else {
                // `window_sum`'s order: each row summed from 0, rows added to a sum from 0
                let s = 0.0 + ((0.0 + v[0]) + v[1]);
                (s + ((0.0 + v[2]) + v[3])) / 4.0
            };
        }
    }
}

/// Whether every plane is tiled exactly by 2×2 windows in groups of four (h = 2·oh,
/// w = 2·ow, ow a multiple of 4): then output row `r` of the whole tensor (all planes stacked)
/// reads input rows `2r` and `2r + 1`, and four consecutive outputs read eight consecutive
/// values of each, which [`forward_2x2_flat`] takes eight outputs at a time.
fn is_flat_2x2(pl: &Plane) -> bool {
    is_2x2(pl) && pl.h == 2 * pl.oh && pl.w == 2 * pl.ow && pl.ow % 4 == 0
}

/// Max or average 2×2 pooling of the whole tensor `x` into `y` (see [`is_flat_2x2`]), eight
/// outputs per step in AVX2 registers: the same operations as [`forward_2x2`], lane by lane
/// (the first maximum in top-left, top-right, bottom-left, bottom-right order with
/// `first_max_2x2`'s NaN rule; the average summed in `window_sum`'s order). Returns whether it
/// ran (false without AVX2 or if `x` is not `4 · y.len()` values).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
fn forward_2x2_flat(max: bool, x: &[f32], y: &mut [f32], ow: usize) -> bool {
    use std::arch::x86_64::*;
    if ow == 0 || ow % 4 != 0 || y.len() % 8 != 0 || x.len() != 4 * y.len() {
        return false;
    }
    let w = 2 * ow;
    // the input offset of the top-left value of the next output quad (four outputs), at
    // output row r, column c: 2r · w + 2c, advanced quad by quad (no division per step)
    let (mut r, mut c) = (0, 0);
    let mut next_quad = || {
        let at = 2 * r * w + 2 * c;
        c += 4;
        if c == ow {
            (r, c) = (r + 1, 0);
        }
        at
    };
    for j in (0..y.len()).step_by(8) {
        let (a, b) = (next_quad(), next_quad());
        // SAFETY: quad q's values lie in rows 2r and 2r + 1 at columns 2c..2c + 8, with
        // r < y.len() / ow (so 2r + 1 < 2 · rows, x holding 2 · rows rows of w values, as
        // checked above: x.len() = 4 · y.len() = 2 · rows · w) and 2c + 8 <= w; the store
        // writes y[j..j + 8], j + 8 <= y.len() (a multiple of 8). AVX2 is enabled for the
        // whole build (cfg).
        unsafe {
            let p = x.as_ptr();
            let (t0, t1) = (_mm256_loadu_ps(p.add(a)), _mm256_loadu_ps(p.add(b)));
            let (b0, b1) = (_mm256_loadu_ps(p.add(a + w)), _mm256_loadu_ps(p.add(b + w)));
            // even and odd columns: windows (0, 1, 4, 5, 2, 3, 6, 7) in lane order
            const EVEN: i32 = 0b10_00_10_00;
            const ODD: i32 = 0b11_01_11_01;
            let v = [
                _mm256_shuffle_ps::<EVEN>(t0, t1),
                _mm256_shuffle_ps::<ODD>(t0, t1),
                _mm256_shuffle_ps::<EVEN>(b0, b1),
                _mm256_shuffle_ps::<ODD>(b0, b1),
            ];
            let r = if max {
                let mut best = v[0];
                for &x in &v[1..] {
                    let greater = _mm256_cmp_ps::<_CMP_GT_OQ>(x, best);
                    let x_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
                    let best_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(best, best);
                    let take = _mm256_or_ps(greater, _mm256_andnot_ps(best_nan, x_nan));
                    best = _mm256_blendv_ps(best, x, take);
                }
                best
            } else {
                let z = _mm256_setzero_ps();
                let s = _mm256_add_ps(z, _mm256_add_ps(_mm256_add_ps(z, v[0]), v[1]));
                let bottom = _mm256_add_ps(_mm256_add_ps(z, v[2]), v[3]);
                _mm256_div_ps(_mm256_add_ps(s, bottom), _mm256_set1_ps(4.0))
            };
            // back to window order: 64-bit pairs (0, 2, 1, 3)
            let r = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(r)));
            _mm256_storeu_ps(y.as_mut_ptr().add(j), r);
        }
    }
    true
}

/// Without AVX2 the per-plane loops do every window.
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2")))]
fn forward_2x2_flat(_max: bool, _x: &[f32], _y: &mut [f32], _ow: usize) -> bool {
    false
}

/// The VJP of [`forward_2x2`] into the zeroed plane gradient `gp`.
fn vjp_2x2(max: bool, xp: &[f32], gyp: &[f32], gp: &mut [f32], pl: &Plane) {
    for i in 0..pl.oh {
        let (top, bottom) = rows_2x2(xp, pl, i);
        for j in 0..pl.ow {
            let g = gyp[i * pl.ow + j];
            let at = |k: usize| (2 * i + k / 2) * pl.w + 2 * j + k % 2;
            if max {
                let v = [top[2 * j], top[2 * j + 1], bottom[2 * j], bottom[2 * j + 1]];
                gp[at(first_max_2x2(v).0)] += g;
            } else {
                let v = g / 4.0;
                for k in 0..4 {
                    gp[at(k)] += v;
                }
            }
        }
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
    let fast = is_2x2(&pl);
    let max = matches!(op, Op::MaxPool2d(_));
    if (max || matches!(op, Op::AvgPool2d { .. })) && is_flat_2x2(&pl) && y.len() % 8 == 0 {
        // whole output rows per task, a multiple of 8 of them (so every task's outputs are a
        // multiple of 8): output row r reads input rows 2r and 2r + 1, 4 · ow values
        let rows = (PAR_THRESHOLD / 4 / pl.ow).next_multiple_of(8).max(8);
        let chunk = rows * pl.ow;
        let ran = if y.len() < PAR_THRESHOLD {
            forward_2x2_flat(max, &xd, &mut y, pl.ow)
        } else {
            y.par_chunks_mut(chunk)
                .zip(xd.par_chunks(4 * chunk))
                .map(|(yc, xc)| forward_2x2_flat(max, xc, yc, pl.ow))
                .reduce(|| true, |a, b| a && b)
        };
        if ran {
            return y;
        }
    }
    planes(&mut y, ohw, |p, yp| {
        let xp = &xd[p * hw..(p + 1) * hw];
        match op {
            Op::MaxPool2d(_) | Op::AvgPool2d { .. } if fast => {
                forward_2x2(matches!(op, Op::MaxPool2d(_)), xp, yp, &pl)
            }
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
    let fast = is_2x2(&pl);
    planes(&mut gx, hw, |p, gp| {
        let xp = &xd[p * hw..(p + 1) * hw];
        let (yp, gyp) = (&yd[p * ohw..(p + 1) * ohw], &gyd[p * ohw..(p + 1) * ohw]);
        match op {
            Op::MaxPool2d(_) | Op::AvgPool2d { .. } if fast => {
                vjp_2x2(matches!(op, Op::MaxPool2d(_)), xp, gyp, gp, &pl)
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2×2 loops give the general window walk's values bit for bit — forward and VJP,
    /// max and average — on planes with odd sizes (an unread last row and column), ties,
    /// signed zeros, NaNs and infinities.
    #[test]
    fn the_2x2_loops_equal_the_general_window_walk_bit_for_bit() {
        let special = [
            0.0,
            -0.0,
            1.0,
            1.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -2.5,
        ];
        for (h, w) in [(2, 2), (4, 6), (5, 7), (9, 4)] {
            let pl = Plane {
                h,
                w,
                oh: h / 2,
                ow: w / 2,
                g: Pool2dGeometry::square(2),
            };
            assert!(is_2x2(&pl));
            let mut state = (h * 31 + w) as u64;
            let mut next = || {
                state = crate::spec::splitmix64(state);
                state
            };
            let xp: Vec<f32> = (0..h * w)
                .map(|_| match next() % 4 {
                    0 => special[(next() % 8) as usize],
                    _ => (next() % 7) as f32 - 3.0,
                })
                .collect();
            let gyp: Vec<f32> = (0..pl.oh * pl.ow)
                .map(|_| (next() % 9) as f32 - 4.5)
                .collect();
            for max in [true, false] {
                let op = if max {
                    Op::MaxPool2d(pl.g)
                } else {
                    Op::AvgPool2d {
                        geometry: pl.g,
                        count_include_pad: true,
                    }
                };
                let mut fast = vec![7.0; pl.oh * pl.ow];
                forward_2x2(max, &xp, &mut fast, &pl);
                let mut general = vec![7.0; pl.oh * pl.ow];
                pl.for_each_window(|o, rows, cols| {
                    general[o] = if max {
                        first_max(&xp, w, rows, cols).map_or(f32::NEG_INFINITY, |f| xp[f])
                    } else {
                        window_sum(&xp, w, rows, cols) / divisor(&op, &pl.g, rows, cols)
                    };
                });
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&general), "forward {op:?} {h}x{w}");
                let mut gfast = vec![0.0; h * w];
                vjp_2x2(max, &xp, &gyp, &mut gfast, &pl);
                let mut ggeneral = vec![0.0; h * w];
                pl.for_each_window(|o, rows, cols| {
                    if max {
                        if let Some(f) = first_max(&xp, w, rows, cols) {
                            ggeneral[f] += gyp[o];
                        }
                    } else {
                        let v = gyp[o] / divisor(&op, &pl.g, rows, cols);
                        for r in rows.0..rows.1 {
                            for a in &mut ggeneral[r * w + cols.0..r * w + cols.1] {
                                *a += v;
                            }
                        }
                    }
                });
                assert_eq!(bits(&gfast), bits(&ggeneral), "vjp {op:?} {h}x{w}");
            }
        }
    }

    /// The whole-tensor 2×2 path gives the per-plane loop's values bit for bit, max and
    /// average, over several stacked planes of widths 4 to 16 (quads that cross output rows
    /// and planes) with ties, signed zeros, NaNs and infinities.
    #[test]
    fn the_flat_2x2_path_equals_the_per_plane_loop_bit_for_bit() {
        let special = [0.0, -0.0, 1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        for (planes, oh, ow) in [(3, 2, 4), (2, 4, 8), (5, 1, 12), (2, 3, 16), (1, 1, 4)] {
            let (h, w) = (2 * oh, 2 * ow);
            let pl = Plane {
                h,
                w,
                oh,
                ow,
                g: Pool2dGeometry::square(2),
            };
            assert!(is_flat_2x2(&pl));
            let mut state = (planes * 131 + ow) as u64;
            let mut next = || {
                state = crate::spec::splitmix64(state);
                state
            };
            let x: Vec<f32> = (0..planes * h * w)
                .map(|_| match next() % 3 {
                    0 => special[(next() % 6) as usize],
                    _ => (next() % 5) as f32 - 2.0,
                })
                .collect();
            for max in [true, false] {
                let mut per_plane = vec![7.0; planes * oh * ow];
                for (xp, yp) in x
                    .chunks_exact(h * w)
                    .zip(per_plane.chunks_exact_mut(oh * ow))
                {
                    forward_2x2(max, xp, yp, &pl);
                }
                let mut flat = vec![7.0; planes * oh * ow];
                let ran = forward_2x2_flat(max, &x, &mut flat, ow);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if flat.len() % 8 == 0 && cfg!(target_feature = "avx2") {
                    assert!(ran, "{planes} planes of {oh}x{ow}");
                }
                if ran {
                    assert_eq!(
                        bits(&flat),
                        bits(&per_plane),
                        "max {max}, {planes}x{oh}x{ow}"
                    );
                }
            }
        }
    }

    /// Through `forward`, a tensor large enough to split over threads (whole output rows per
    /// task) gives the per-plane loop's values bit for bit.
    #[test]
    fn the_parallel_flat_2x2_path_equals_the_per_plane_loop() {
        let (planes, h, w) = (20, 64, 104);
        let x: Vec<f32> = (0..planes * h * w)
            .map(|i| match i % 37 {
                0 => f32::NAN,
                1 => -0.0,
                _ => ((i * 7919) % 1001) as f32 / 100.0 - 5.0,
            })
            .collect();
        let t = Tensor::from_vec(x.clone(), &[1, planes, h, w]).unwrap();
        let g = Pool2dGeometry::square(2);
        let pl = Plane {
            h,
            w,
            oh: h / 2,
            ow: w / 2,
            g,
        };
        assert!(planes * pl.oh * pl.ow >= PAR_THRESHOLD);
        for max in [true, false] {
            let op = if max {
                Op::MaxPool2d(g)
            } else {
                Op::AvgPool2d {
                    geometry: g,
                    count_include_pad: true,
                }
            };
            let got = forward(&op, &t, &[1, planes, pl.oh, pl.ow]);
            let mut want = vec![7.0; planes * pl.oh * pl.ow];
            for (xp, yp) in x
                .chunks_exact(h * w)
                .zip(want.chunks_exact_mut(pl.oh * pl.ow))
            {
                forward_2x2(max, xp, yp, &pl);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "max {max}");
        }
    }
}
