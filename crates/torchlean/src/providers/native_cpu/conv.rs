//! Native conv kernels: im2col + GEMM.
//!
//! `conv2d` lowers every (batch image, group) pair to one product
//! `y[og, OH*OW] = W_g[og, cg*KH*KW] @ col[cg*KH*KW, OH*OW]`, where `col` is the im2col
//! unfolding of the group's input channels. The VJP reuses the same unfolding:
//! `gW_g += gy @ col^T` and `gcol = W_g^T @ gy`, folded back with col2im.
//!
//! `conv_transpose2d` is the adjoint of a conv2d that maps the transposed output (OH, OW) to
//! the input (H, W) with the same stride / padding / dilation: its forward is
//! `col = W_g^T @ x` folded with col2im into the output, and its VJPs unfold `gy` with im2col.
//!
//! The forward conv2d of a batch unfolds several images side by side into one column matrix
//! (as many as make about [`BATCH_MACS`] multiply-adds, from a zero-padded copy of each
//! image) and runs one product per such group, the groups in parallel: a small image's own
//! product would cost more to set up than to run. Otherwise batch images run in parallel
//! (rayon, GEMM single-threaded inside); a single image uses GEMM's own threads. Every
//! output element is the same sum either way (tested bit for bit). Weight gradients are
//! accumulated per image and then summed in batch order, so results are bit-identical run
//! to run and across thread counts.

use super::par::{gemm, Mat};
use crate::graph::Op;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// The geometry of one im2col unfolding: an image of `channels` planes of `img` size,
/// unfolded for a kernel of size `k` into `out` positions.
#[derive(Clone, Copy)]
struct Unfold {
    channels: usize,
    img: [usize; 2],
    out: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
}

impl Unfold {
    /// Rows of the column matrix (channels * KH * KW).
    fn rows(&self) -> usize {
        self.channels * self.k[0] * self.k[1]
    }
    /// Columns of the column matrix (output positions).
    fn cols(&self) -> usize {
        self.out[0] * self.out[1]
    }
    /// Elements of one image.
    fn img_len(&self) -> usize {
        self.channels * self.img[0] * self.img[1]
    }
    /// The output positions `o` in `0..out[a]` whose tap `kk` lands inside the image along
    /// axis `a` (input coordinate `o * stride + kk * dil - pad`), as a half-open range, and
    /// the (signed) offset `kk * dil - pad`.
    fn valid(&self, a: usize, kk: usize) -> (usize, usize, isize) {
        // in i128: a stride of 2^63 or more (a valid geometry: one output position) wrapped
        // negative as an isize and emptied the range
        let off = (kk * self.dil[a]) as isize - self.pad[a] as isize;
        let (o, s) = (off as i128, self.stride[a].max(1) as i128);
        let lo = if o >= 0 { 0 } else { (-o + s - 1) / s };
        let room = self.img[a] as i128 - o; // need o * s < room
        let hi = if room <= 0 { 0 } else { (room + s - 1) / s };
        let hi = hi.min(self.out[a] as i128);
        // both within 0..=out[a]: usize
        (lo.min(hi) as usize, hi as usize, off)
    }

    /// Unfolds `img` (row-major [channels, img]) into `col` ([rows, cols]); every element of
    /// `col` is written (padding taps are zero).
    fn im2col(&self, img: &[f32], col: &mut [f32]) {
        let (ih, iw) = (self.img[0], self.img[1]);
        let ow = self.out[1];
        let p = self.cols();
        let mut row = 0;
        for c in 0..self.channels {
            let plane = &img[c * ih * iw..(c + 1) * ih * iw];
            for kp in 0..self.k[0] {
                let (ilo, ihi, roff) = self.valid(0, kp);
                for kq in 0..self.k[1] {
                    let (jlo, jhi, coff) = self.valid(1, kq);
                    let dst = &mut col[row * p..(row + 1) * p];
                    row += 1;
                    if jlo >= jhi || ilo >= ihi {
                        dst.fill(0.0);
                        continue;
                    }
                    dst[..ilo * ow].fill(0.0);
                    dst[ihi * ow..].fill(0.0);
                    for i in ilo..ihi {
                        let r = (i * self.stride[0]) as isize + roff;
                        let src = &plane[r as usize * iw..(r as usize + 1) * iw];
                        let d = &mut dst[i * ow..(i + 1) * ow];
                        d[..jlo].fill(0.0);
                        d[jhi..].fill(0.0);
                        let s0 = (jlo * self.stride[1]) as isize + coff;
                        let s0 = s0 as usize;
                        if self.stride[1] == 1 {
                            d[jlo..jhi].copy_from_slice(&src[s0..s0 + (jhi - jlo)]);
                        } else {
                            let st = self.stride[1];
                            for (t, v) in d[jlo..jhi].iter_mut().enumerate() {
                                *v = src[s0 + t * st];
                            }
                        }
                    }
                }
            }
        }
    }

    /// The image's planes with `pad` zeros around them: [channels, img + 2·pad].
    fn padded_len(&self) -> usize {
        self.channels * (self.img[0] + 2 * self.pad[0]) * (self.img[1] + 2 * self.pad[1])
    }

    /// Writes `img` with its zero border into `padded` (length [`Unfold::padded_len`]).
    fn pad_into(&self, img: &[f32], padded: &mut [f32]) {
        let (ih, iw) = (self.img[0], self.img[1]);
        let (ph, pw) = (self.pad[0], self.pad[1]);
        let w = iw + 2 * pw;
        let plane = (ih + 2 * ph) * w;
        if ih * iw == 0 {
            padded.fill(0.0); // an empty image: only its border (the taps read zeros)
            return;
        }
        for (src, dst) in img
            .chunks_exact(ih * iw)
            .zip(padded.chunks_exact_mut(plane))
        {
            dst[..ph * w].fill(0.0);
            dst[(ph + ih) * w..].fill(0.0);
            for (s, d) in src.chunks_exact(iw).zip(dst[ph * w..].chunks_exact_mut(w)) {
                d[..pw].fill(0.0);
                d[pw..pw + iw].copy_from_slice(s);
                d[pw + iw..].fill(0.0);
            }
        }
    }

    /// [`Unfold::im2col`] from the zero-padded image (`padded`, as [`Unfold::pad_into`]
    /// writes it), into rows `ld` apart (row r is `col[r * ld..r * ld + cols]`: one image's
    /// columns among several side by side): every tap reads inside it, so each output row is one
    /// copy (stride 1) or one strided read, with no per-row bounds or zero fills. Small
    /// images have rows of 8 or 16 values, where a `memcpy` call and two clipped fills per
    /// row cost more than the copy itself.
    fn im2col_padded(&self, padded: &[f32], col: &mut [f32], ld: usize) {
        let w = self.img[1] + 2 * self.pad[1];
        let plane = (self.img[0] + 2 * self.pad[0]) * w;
        let (oh, ow) = (self.out[0], self.out[1]);
        let p = self.cols();
        let mut row = 0;
        for c in 0..self.channels {
            let src = &padded[c * plane..(c + 1) * plane];
            for kp in 0..self.k[0] {
                for kq in 0..self.k[1] {
                    let dst = &mut col[row * ld..row * ld + p];
                    row += 1;
                    for (i, d) in dst.chunks_exact_mut(ow.max(1)).take(oh).enumerate() {
                        let start = (i * self.stride[0] + kp * self.dil[0]) * w + kq * self.dil[1];
                        if self.stride[1] == 1 {
                            copy_short(d, &src[start..start + ow]);
                        } else {
                            let st = self.stride[1];
                            for (t, v) in d.iter_mut().enumerate() {
                                *v = src[start + t * st];
                            }
                        }
                    }
                }
            }
        }
    }

    /// The adjoint of [`Unfold::im2col`]: adds every element of `col` into its image position
    /// (padding taps are dropped).
    fn col2im(&self, col: &[f32], img: &mut [f32]) {
        let (ih, iw) = (self.img[0], self.img[1]);
        let (ow, p) = (self.out[1], self.cols());
        let mut row = 0;
        for c in 0..self.channels {
            let plane = &mut img[c * ih * iw..(c + 1) * ih * iw];
            for kp in 0..self.k[0] {
                let (ilo, ihi, roff) = self.valid(0, kp);
                for kq in 0..self.k[1] {
                    let (jlo, jhi, coff) = self.valid(1, kq);
                    let src = &col[row * p..(row + 1) * p];
                    row += 1;
                    if jlo >= jhi {
                        continue;
                    }
                    for i in ilo..ihi {
                        let r = ((i * self.stride[0]) as isize + roff) as usize;
                        let d = &mut plane[r * iw..(r + 1) * iw];
                        let s = &src[i * ow + jlo..i * ow + jhi];
                        let s0 = ((jlo * self.stride[1]) as isize + coff) as usize;
                        if self.stride[1] == 1 {
                            for (a, b) in d[s0..s0 + s.len()].iter_mut().zip(s) {
                                *a += b;
                            }
                        } else {
                            let st = self.stride[1];
                            for (t, b) in s.iter().enumerate() {
                                d[s0 + t * st] += b;
                            }
                        }
                    }
                }
            }
        }
    }

    /// True when the column matrix equals the image itself (1x1 kernel, stride 1, no
    /// padding, same size).
    fn is_identity(&self) -> bool {
        self.k == [1, 1] && self.stride == [1, 1] && self.pad == [0, 0] && self.img == self.out
    }
}

/// `dst.copy_from_slice(src)` for short rows, in blocks of eight values the compiler keeps
/// in registers instead of a `memcpy` call per row.
#[inline]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    if dst.len() > 64 {
        dst.copy_from_slice(src);
        return;
    }
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let block: [f32; 8] = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        a.copy_from_slice(&block);
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a = *b;
    }
}

/// The per-op geometry: `groups`, the unfolding of one group of the "image" side (conv2d:
/// input x; conv_transpose2d: output y), and the channels per group on the other side.
struct Geometry {
    groups: usize,
    /// Unfolding of one group's channels of the image side.
    unfold: Unfold,
    /// Channels per group on the GEMM side (conv2d: output channels per group; transpose:
    /// input channels per group).
    other: usize,
}

fn geometry(op: &Op, x: &[usize], w: &[usize], y: &[usize]) -> Geometry {
    match op {
        Op::Conv2d(g) => Geometry {
            groups: g.groups,
            unfold: Unfold {
                channels: x[1] / g.groups,
                img: [x[2], x[3]],
                out: [y[2], y[3]],
                k: [w[2], w[3]],
                stride: g.stride,
                pad: g.padding,
                dil: g.dilation,
            },
            other: w[0] / g.groups,
        },
        Op::ConvTranspose2d(g) => Geometry {
            groups: g.groups,
            unfold: Unfold {
                channels: w[1],
                img: [y[2], y[3]],
                out: [x[2], x[3]],
                k: [w[2], w[3]],
                stride: g.stride,
                pad: g.padding,
                dil: g.dilation,
            },
            other: x[1] / g.groups,
        },
        _ => unreachable!("conv geometry called for {}", op.name()),
    }
}

/// Runs `f(b, chunk, threads)` over the per-image chunks of `out` (length `per`): in parallel
/// (single-threaded GEMM inside) when there is more than one image, else with GEMM threads.
fn per_image(out: &mut [f32], per: usize, f: impl Fn(usize, &mut [f32], bool) + Sync + Send) {
    if per == 0 {
        return;
    }
    if out.len() / per > 1 {
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(b, c)| f(b, c, false));
    } else {
        out.chunks_mut(per)
            .enumerate()
            .for_each(|(b, c)| f(b, c, true));
    }
}

/// Fills every channel plane of `out` ([channels, plane]) with the channel's bias.
fn fill_bias(out: &mut [f32], plane: usize, bias: Option<&[f32]>) {
    match bias {
        Some(b) if plane > 0 => {
            for (ch, v) in out.chunks_mut(plane).zip(b) {
                ch.fill(*v);
            }
        }
        _ => out.fill(0.0),
    }
}

pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    direct_forward(op, x, out_shape, &[]).unwrap_or_else(|| forward_unfolded(op, x, out_shape))
}

/// `epilogue(conv2d(x))` through the direct path ([`super::conv_direct`]) when the geometry
/// takes it, `None` otherwise.
pub(super) fn direct_forward(
    op: &Op,
    x: &[&Tensor],
    out_shape: &[usize],
    epilogue: &super::conv_direct::Epilogue,
) -> Option<Vec<f32>> {
    let g = geometry(op, x[0].shape(), x[1].shape(), out_shape);
    let d = direct(op, &g)?;
    let (xd, wd) = (x[0].data(), x[1].data());
    let bias = x.get(2).map(|b| b.data());
    let mut y = super::par::overwritten(out_shape.iter().product());
    super::conv_direct::forward(&d, &xd, &wd, bias.as_deref(), epilogue, &mut y);
    Some(y)
}

/// The forward through im2col and the GEMM crate (every geometry).
fn forward_unfolded(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let g = geometry(op, x[0].shape(), x[1].shape(), out_shape);
    let (xd, wd) = (x[0].data(), x[1].data());
    let bias = x.get(2).map(|b| b.data());
    let bias = bias.as_deref();
    let u = g.unfold;
    let (kr, p) = (u.rows(), u.cols());
    let out_plane = out_shape[2] * out_shape[3];
    let per_out = out_shape[1] * out_plane;
    let per_in = x[0].shape()[1] * x[0].shape()[2] * x[0].shape()[3];
    let is_conv = matches!(op, Op::Conv2d(_));
    if is_conv && !u.is_identity() && out_shape[0] > 1 && per_out > 0 {
        let mut y = super::par::overwritten(out_shape[0] * per_out);
        let per_image_macs = (g.groups * g.other * p * kr).max(1);
        let nb = (BATCH_MACS / per_image_macs).clamp(1, out_shape[0]);
        conv2d_images_side_by_side(&g, &xd, &wd, bias, per_in, &mut y, out_plane, nb);
        return y;
    }
    let mut y = super::par::zeroed(out_shape[0] * per_out);
    per_image(&mut y, per_out, |b, yb, threads| {
        fill_bias(yb, out_plane, bias);
        let xb = &xd[b * per_in..(b + 1) * per_in];
        let mut col = super::par::zeroed(if u.is_identity() { 0 } else { kr * p });
        for grp in 0..g.groups {
            if is_conv {
                // y_g [other, p] += W_g [other, kr] @ col [kr, p]
                let wg = &wd[grp * g.other * kr..(grp + 1) * g.other * kr];
                let xg = &xb[grp * u.img_len()..(grp + 1) * u.img_len()];
                let colm: &[f32] = if u.is_identity() {
                    xg
                } else {
                    u.im2col(xg, &mut col);
                    &col
                };
                let yg = &mut yb[grp * g.other * p..(grp + 1) * g.other * p];
                gemm(
                    g.other,
                    p,
                    kr,
                    Mat::rows(wg, kr),
                    Mat::rows(colm, p),
                    yg,
                    true,
                    threads,
                );
            } else {
                // col [kr, p] = W_g^T [kr, other] @ x_g [other, p]; y_g += col2im(col)
                let wg = &wd[grp * g.other * kr..(grp + 1) * g.other * kr];
                let xg = &xb[grp * g.other * p..(grp + 1) * g.other * p];
                let yg = &mut yb[grp * u.img_len()..(grp + 1) * u.img_len()];
                if u.is_identity() {
                    gemm(
                        kr,
                        p,
                        g.other,
                        Mat::transposed(wg, kr),
                        Mat::rows(xg, p),
                        yg,
                        true,
                        threads,
                    );
                } else {
                    gemm(
                        kr,
                        p,
                        g.other,
                        Mat::transposed(wg, kr),
                        Mat::rows(xg, p),
                        &mut col,
                        false,
                        threads,
                    );
                    u.col2im(&col, yg);
                }
            }
        }
    });
    y
}

/// The direct path's geometry when a forward conv2d takes it (conv_direct.rs): stride 1,
/// dilation 1, a kernel wider than one tap, between 1 and [`super::conv_direct::MAX_TAPS`]
/// taps per output, and packed weights of at most [`super::conv_direct::MAX_PACKED`]
/// values. Decided from the geometry alone, so a given image gives the same bits in any
/// batch.
fn direct(op: &Op, g: &Geometry) -> Option<super::conv_direct::Direct> {
    let u = g.unfold;
    let packed = g
        .groups
        .saturating_mul(super::conv_direct::packed_len(g.other, u.rows()));
    let small = (1..=super::conv_direct::MAX_TAPS).contains(&u.rows())
        && packed <= super::conv_direct::MAX_PACKED;
    (matches!(op, Op::Conv2d(_))
        && u.stride == [1, 1]
        && u.dil == [1, 1]
        && !u.is_identity()
        && small)
        .then_some(super::conv_direct::Direct {
            groups: g.groups,
            cg: u.channels,
            other: g.other,
            img: u.img,
            out: u.out,
            k: u.k,
            pad: u.pad,
        })
}

/// Multiply-adds per batch of images that a forward conv2d unfolds side by side into one
/// column matrix (and one product): enough to amortize the product's setup and packing,
/// small enough to stay in the caches. Derived from the geometry only, never from the
/// thread count, so results do not depend on the machine's threads.
const BATCH_MACS: usize = 1 << 18;

/// Forward conv2d of several images per product: the images of each batch of `nb` (chosen
/// by [`BATCH_MACS`]) are unfolded side by side (`col` [kr, nb·p]), multiplied once
/// (`z` [other, nb·p] = W_g @ col), and `z`'s rows are written to each image's output
/// channels with the bias added. A small image (a CNN's 16×16 planes) makes a product of a
/// few thousand multiply-adds per image, which costs more to set up than to run. Each output
/// element is the same sum of products as one image's product computes (then + bias, as the
/// per-image path's accumulation onto the bias); batches run in parallel.
#[allow(clippy::too_many_arguments)]
fn conv2d_images_side_by_side(
    g: &Geometry,
    xd: &[f32],
    wd: &[f32],
    bias: Option<&[f32]>,
    per_in: usize,
    y: &mut [f32],
    out_plane: usize,
    nb: usize,
) {
    let u = g.unfold;
    let (kr, p) = (u.rows(), u.cols());
    let per_out = g.groups * g.other * p;
    let images = y.len() / per_out;
    let run = |c: usize, ys: &mut [f32]| {
        let b0 = c * nb;
        let n = ys.len() / per_out;
        let ld = n * p;
        super::par::with_scratch((kr + g.other) * ld + u.padded_len(), |scratch| {
            let (col, rest) = scratch.split_at_mut(kr * ld);
            let (z, padded) = rest.split_at_mut(g.other * ld);
            for grp in 0..g.groups {
                if kr == 0 {
                    // no input channel (or an empty window): every sum is empty, 0 — and
                    // there is no patch matrix to unfold into (slicing the empty one past
                    // its end panicked for a batch of two)
                    z.fill(0.0);
                } else {
                    for i in 0..n {
                        let xb = &xd[(b0 + i) * per_in..(b0 + i + 1) * per_in];
                        let xg = &xb[grp * u.img_len()..(grp + 1) * u.img_len()];
                        u.pad_into(xg, padded);
                        u.im2col_padded(padded, &mut col[i * p..], ld);
                    }
                    let wg = &wd[grp * g.other * kr..(grp + 1) * g.other * kr];
                    gemm(
                        g.other,
                        ld,
                        kr,
                        Mat::rows(wg, kr),
                        Mat::rows(col, ld),
                        z,
                        false,
                        false,
                    );
                }
                for (i, yb) in ys.chunks_mut(per_out).enumerate() {
                    let yg = &mut yb[grp * g.other * p..(grp + 1) * g.other * p];
                    for (o, dst) in yg.chunks_mut(out_plane).enumerate() {
                        let src = &z[o * ld + i * p..o * ld + (i + 1) * p];
                        match bias {
                            Some(b) => {
                                let bv = b[grp * g.other + o];
                                for (d, s) in dst.iter_mut().zip(src) {
                                    *d = bv + s;
                                }
                            }
                            None => dst.copy_from_slice(src),
                        }
                    }
                }
            }
        });
    };
    if images > nb {
        y.par_chunks_mut(nb * per_out)
            .enumerate()
            .for_each(|(c, ys)| run(c, ys));
    } else {
        run(0, y);
    }
}

/// Skips the input cotangent when `needs[0]` is false (e.g. the first layer of a network).
pub fn vjp(op: &Op, x: &[&Tensor], gy: &Tensor, needs: &[bool]) -> Vec<Option<Tensor>> {
    let need_x = needs.first().copied().unwrap_or(true);
    let g = geometry(op, x[0].shape(), x[1].shape(), gy.shape());
    let (xd, wd, gyd) = (x[0].data(), x[1].data(), gy.data());
    let u = g.unfold;
    let (kr, p) = (u.rows(), u.cols());
    let (xs, ys) = (x[0].shape(), gy.shape());
    let per_in = xs[1] * xs[2] * xs[3];
    let per_out = ys[1] * ys[2] * ys[3];
    let wlen = wd.len();
    let is_conv = matches!(op, Op::Conv2d(_));
    let mut gx = super::par::zeroed(xd.len());

    // One image: writes its gx chunk and returns its weight-gradient contribution.
    let image = |b: usize, gxb: &mut [f32], threads: bool| -> Vec<f32> {
        let mut gw = super::par::zeroed(wlen);
        let xb = &xd[b * per_in..(b + 1) * per_in];
        let gyb = &gyd[b * per_out..(b + 1) * per_out];
        let mut col = super::par::zeroed(if u.is_identity() { 0 } else { kr * p });
        for grp in 0..g.groups {
            let wg = &wd[grp * g.other * kr..(grp + 1) * g.other * kr];
            let gwg = &mut gw[grp * g.other * kr..(grp + 1) * g.other * kr];
            if is_conv {
                let xg = &xb[grp * u.img_len()..(grp + 1) * u.img_len()];
                let gyg = &gyb[grp * g.other * p..(grp + 1) * g.other * p];
                let gxg = &mut gxb[grp * u.img_len()..(grp + 1) * u.img_len()];
                if u.is_identity() {
                    // gW_g [other, kr] = gy_g [other, p] @ x_g^T [p, kr]; gx_g = W_g^T @ gy_g
                    gemm(
                        g.other,
                        kr,
                        p,
                        Mat::rows(gyg, p),
                        Mat::transposed(xg, p),
                        gwg,
                        false,
                        threads,
                    );
                    if need_x {
                        gemm(
                            kr,
                            p,
                            g.other,
                            Mat::transposed(wg, kr),
                            Mat::rows(gyg, p),
                            gxg,
                            false,
                            threads,
                        );
                    }
                } else {
                    u.im2col(xg, &mut col);
                    gemm(
                        g.other,
                        kr,
                        p,
                        Mat::rows(gyg, p),
                        Mat::transposed(&col, p),
                        gwg,
                        false,
                        threads,
                    );
                    if need_x {
                        gemm(
                            kr,
                            p,
                            g.other,
                            Mat::transposed(wg, kr),
                            Mat::rows(gyg, p),
                            &mut col,
                            false,
                            threads,
                        );
                        u.col2im(&col, gxg);
                    }
                }
            } else {
                let xg = &xb[grp * g.other * p..(grp + 1) * g.other * p];
                let gyg = &gyb[grp * u.img_len()..(grp + 1) * u.img_len()];
                let gxg = &mut gxb[grp * g.other * p..(grp + 1) * g.other * p];
                let colm: &[f32] = if u.is_identity() {
                    gyg
                } else {
                    u.im2col(gyg, &mut col);
                    &col
                };
                // gx_g [other, p] = W_g [other, kr] @ col [kr, p]
                if need_x {
                    gemm(
                        g.other,
                        p,
                        kr,
                        Mat::rows(wg, kr),
                        Mat::rows(colm, p),
                        gxg,
                        false,
                        threads,
                    );
                }
                // gW_g [other, kr] = x_g [other, p] @ col^T [p, kr]
                gemm(
                    g.other,
                    kr,
                    p,
                    Mat::rows(xg, p),
                    Mat::transposed(colm, p),
                    gwg,
                    false,
                    threads,
                );
            }
        }
        gw
    };

    let n = xs[0];
    let mut gw = super::par::zeroed(wlen);
    if per_in == 0 {
        // no input elements: gx is empty; gw still needs every image's contribution
        let mut empty: [f32; 0] = [];
        for b in 0..n {
            add_into(&mut gw, &image(b, &mut empty, true));
        }
    } else if n > 1 {
        // the images in blocks of a few, each block's weight gradients computed in parallel
        // and added in image order: at most `block` weight-sized parts live at once (one per
        // image of the batch did — a batch of 32 held 32 copies of a 26 MB weight, 3× the
        // memory of PyTorch's step: the fifty-first session's CLI audit). The sum's order
        // is the images', as before, so the bits are the same for any block size.
        let block = (2 * rayon::current_num_threads()).max(2);
        for (k, images) in gx.chunks_mut(per_in * block).enumerate() {
            let parts: Vec<Vec<f32>> = images
                .par_chunks_mut(per_in)
                .enumerate()
                .map(|(i, c)| image(k * block + i, c, false))
                .collect();
            for part in &parts {
                add_into(&mut gw, part);
            }
        }
    } else {
        for (b, c) in gx.chunks_mut(per_in).enumerate() {
            add_into(&mut gw, &image(b, c, true));
        }
    }

    let mut grads = vec![
        need_x.then(|| Tensor::from_parts(gx, xs.to_vec())),
        Some(Tensor::from_parts(gw, x[1].shape().to_vec())),
    ];
    if let Some(bias) = x.get(2) {
        let (ch, plane) = (ys[1], ys[2] * ys[3]);
        let mut gb = vec![0.0f64; ch];
        if plane > 0 {
            for (i, pl) in gyd.chunks(plane).enumerate() {
                gb[i % ch.max(1)] += pl.iter().map(|&v| v as f64).sum::<f64>();
            }
        }
        let gb: Vec<f32> = gb.into_iter().map(|v| v as f32).collect();
        grads.push(Some(Tensor::from_parts(gb, bias.shape().to_vec())));
    }
    grads
}

fn add_into(acc: &mut [f32], part: &[f32]) {
    for (a, b) in acc.iter_mut().zip(part) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Conv2dGeometry;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = crate::spec::splitmix64(seed.wrapping_add(i as u64));
                (crate::spec::uniform_from_bits(h) * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// The side-by-side forward (any number of images per product, a last batch left over)
    /// gives every image exactly the bits of a one-image call, which takes the per-image
    /// path: padding, stride, dilation, groups, with and without a bias.
    #[test]
    fn images_side_by_side_equal_one_image_calls_bit_for_bit() {
        let geometries = [
            (
                Conv2dGeometry {
                    padding: [1, 1],
                    ..Default::default()
                },
                [2, 3, 3],
                8,
            ),
            (
                Conv2dGeometry {
                    stride: [2, 2],
                    padding: [1, 0],
                    ..Default::default()
                },
                [3, 4, 2],
                7,
            ),
            (
                Conv2dGeometry {
                    stride: [1, 2],
                    padding: [2, 1],
                    dilation: [2, 1],
                    groups: 2,
                },
                [4, 6, 3],
                9,
            ),
            (
                Conv2dGeometry {
                    padding: [2, 1],
                    ..Default::default()
                },
                [2, 3, 3],
                4,
            ),
        ];
        for (k, (geom, [cin, cout, kw], h)) in geometries.into_iter().enumerate() {
            let images = 5;
            // the last geometry runs on images with no rows (every tap reads the padding)
            let rows = if k == 3 { 0 } else { h };
            let x = values(images * cin * rows * (h + 1), 10 + k as u64);
            let w = values(cout * (cin / geom.groups) * 3 * kw, 20 + k as u64);
            let b = values(cout, 30 + k as u64);
            let op = Op::Conv2d(geom);
            let xt = Tensor::from_parts(x.clone(), vec![images, cin, rows, h + 1]);
            let wt = Tensor::from_parts(w, vec![cout, cin / geom.groups, 3, kw]);
            let bt = Tensor::from_parts(b, vec![cout]);
            let out = crate::spec::infer_shape(&op, &[xt.shape(), wt.shape(), bt.shape()])
                .expect("valid geometry");
            let per_in = cin * rows * (h + 1);
            for with_bias in [true, false] {
                let args: Vec<&Tensor> = if with_bias {
                    vec![&xt, &wt, &bt]
                } else {
                    vec![&xt, &wt]
                };
                let mut one_shape = out.clone();
                one_shape[0] = 1;
                let per_out: usize = one_shape.iter().product();
                let mut singles = Vec::new();
                for i in 0..images {
                    let xi = Tensor::from_parts(
                        x[i * per_in..(i + 1) * per_in].to_vec(),
                        vec![1, cin, rows, h + 1],
                    );
                    let mut a = args.clone();
                    a[0] = &xi;
                    singles.extend(forward_unfolded(&op, &a, &one_shape));
                }
                let g = geometry(&op, xt.shape(), wt.shape(), &out);
                let bias = with_bias.then(|| bt.data());
                for nb in [1, 2, images] {
                    let mut y = vec![f32::NAN; images * per_out];
                    conv2d_images_side_by_side(
                        &g,
                        &xt.data(),
                        &wt.data(),
                        bias.as_deref(),
                        per_in,
                        &mut y,
                        out[2] * out[3],
                        nb,
                    );
                    let same = y
                        .iter()
                        .zip(&singles)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "geometry {k}, bias {with_bias}, {nb} images per product"
                    );
                }
            }
        }
    }

    /// The direct path (stride 1, dilation 1, small kernels) against the im2col path over
    /// geometries that reach its corners: outputs narrower and wider than a vector, rows
    /// that end mid-vector, channel counts that end mid-block, padding wider than the
    /// kernel, groups, one-row kernels, no bias; within the error bound of two f32 sums of
    /// the same terms. And a batch gives each image the bits of a one-image call.
    #[test]
    fn the_direct_path_matches_im2col_and_is_batch_invariant() {
        // (groups, cin, cout, h, w, kh, kw, pad_h, pad_w)
        let cases = [
            (1, 1, 8, 16, 16, 3, 3, 1, 1),
            (1, 8, 16, 8, 8, 3, 3, 1, 1),
            (1, 3, 5, 7, 13, 3, 3, 1, 1),
            (1, 2, 7, 5, 21, 5, 3, 2, 1),
            (2, 4, 6, 6, 9, 3, 2, 4, 0),
            (1, 32, 9, 4, 4, 3, 3, 1, 1),
            (3, 3, 3, 9, 1, 1, 3, 0, 2),
        ];
        for (k, &(groups, cin, cout, h, w, kh, kw, ph, pw)) in cases.iter().enumerate() {
            let geom = Conv2dGeometry {
                padding: [ph, pw],
                groups,
                ..Default::default()
            };
            let op = Op::Conv2d(geom);
            let images = 3;
            let x = values(images * cin * h * w, 40 + k as u64);
            let wv = values(cout * (cin / groups) * kh * kw, 50 + k as u64);
            let xt = Tensor::from_parts(x.clone(), vec![images, cin, h, w]);
            let wt = Tensor::from_parts(wv, vec![cout, cin / groups, kh, kw]);
            let bt = Tensor::from_parts(values(cout, 60 + k as u64), vec![cout]);
            let out = crate::spec::infer_shape(&op, &[xt.shape(), wt.shape(), bt.shape()])
                .expect("valid geometry");
            let g = geometry(&op, xt.shape(), wt.shape(), &out);
            assert!(direct(&op, &g).is_some(), "case {k} takes the direct path");
            let taps = (cin / groups) * kh * kw;
            for with_bias in [true, false] {
                let args: Vec<&Tensor> = if with_bias {
                    vec![&xt, &wt, &bt]
                } else {
                    vec![&xt, &wt]
                };
                let direct_y = forward(&op, &args, &out);
                let unfolded = forward_unfolded(&op, &args, &out);
                // |error| of each f32 sum ≤ taps·u·Σ|terms| ≤ taps·u·(taps + 1) (|values| ≤ 1)
                let bound = 2.0 * (taps + 1) as f32 * (taps + 1) as f32 * f32::EPSILON;
                for (i, (a, b)) in direct_y.iter().zip(&unfolded).enumerate() {
                    assert!(
                        (a - b).abs() <= bound,
                        "case {k}, bias {with_bias}, element {i}: {a} vs {b}"
                    );
                }
                let per_in = cin * h * w;
                let mut one = out.clone();
                one[0] = 1;
                let per_out: usize = one.iter().product();
                for i in 0..images {
                    let xi = Tensor::from_parts(
                        x[i * per_in..(i + 1) * per_in].to_vec(),
                        vec![1, cin, h, w],
                    );
                    let mut a = args.clone();
                    a[0] = &xi;
                    let single = forward(&op, &a, &one);
                    let same = single
                        .iter()
                        .zip(&direct_y[i * per_out..(i + 1) * per_out])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "case {k}, bias {with_bias}, image {i}");
                }
            }
        }
    }

    /// Geometries with no kernel taps (no input channels, a kernel row of zero width) have
    /// outputs (the bias); they stay on the im2col path, which gives the bias, instead of
    /// dividing the packed weights into zero-length blocks. A very wide layer too.
    #[test]
    fn convolutions_without_taps_or_with_huge_weights_skip_the_direct_path() {
        let geom = Conv2dGeometry {
            padding: [1, 1],
            ..Default::default()
        };
        let op = Op::Conv2d(geom);
        for (x, w) in [
            (vec![1, 0, 5, 5], vec![4, 0, 3, 3]),
            (vec![1, 1, 4, 4], vec![2, 1, 0, 3]),
        ] {
            let xt = Tensor::from_parts(values(x.iter().product(), 1), x.clone());
            let wt = Tensor::from_parts(values(w.iter().product(), 2), w.clone());
            let bt = Tensor::from_parts(values(w[0], 3), vec![w[0]]);
            let out = crate::spec::infer_shape(&op, &[xt.shape(), wt.shape(), bt.shape()])
                .expect("valid geometry");
            assert!(out.iter().product::<usize>() > 0, "{x:?} {w:?}: {out:?}");
            let g = geometry(&op, xt.shape(), wt.shape(), &out);
            assert!(direct(&op, &g).is_none(), "{x:?} {w:?}");
            let y = forward(&op, &[&xt, &wt, &bt], &out);
            let plane = out[2] * out[3];
            for (o, ch) in y.chunks(plane).enumerate() {
                assert!(ch.iter().all(|v| *v == bt.data()[o]), "{x:?} {w:?}");
            }
        }
        let wide = Geometry {
            groups: 1,
            unfold: Unfold {
                channels: 32,
                img: [8, 8],
                out: [8, 8],
                k: [3, 3],
                stride: [1, 1],
                pad: [1, 1],
                dil: [1, 1],
            },
            other: 1 << 16,
        };
        assert!(direct(&op, &wide).is_none());
    }
}
