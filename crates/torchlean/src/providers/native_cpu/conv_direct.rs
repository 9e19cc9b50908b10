//! Direct forward conv2d for small, stride-1 convolutions: no im2col matrix.
//!
//! A CNN's early layers (one to a few dozen input channels, 3×3 kernels, images of 8–32
//! pixels a side) make products that are too small for the GEMM crate: the im2col path
//! writes a column matrix `kernel taps` times the size of the input and then packs it again,
//! and measured here on the imported CNN's two convolutions (batch 32, 1→8 channels at 16×16
//! and 8→16 at 8×8) both cost more than the multiply-adds. This kernel reads each image once
//! into a zero-bordered copy and accumulates register blocks of [`OB`] output channels ×
//! [`SLOTS`] vectors of [`LANE`] output positions directly from it: per kernel tap, one load
//! per vector, one vector of the output channel's weight (stored once per lane, so no
//! broadcast) per output channel, `OB · SLOTS` fused multiply-adds.
//!
//! Every output is `bias + Σ_taps w · x` summed in tap order (input channel, kernel row,
//! kernel column), whichever block, task or thread computes it, so results do not depend on
//! the batch size or the thread count. Padding taps read zeros (the spec multiplies the
//! weight by the zero padding too).
//!
//! An [`Epilogue`] (a `conv2d_map`'s per-channel add, sub, mul and relu steps) runs over each
//! image's output planes as soon as they are written, while they are in L1: the same f32
//! operations, in the same order, as the native maps would apply to the stored conv result,
//! so the same bits, without the separate pass over the whole output (measured on the
//! imported CNN's layers, applying the steps to the register blocks instead cost more: the
//! registers spilled around the per-step dispatch).
//!
//! Owns: the direct path's arithmetic, buffers and split over threads. Must not decide when
//! it applies (conv.rs does, from the geometry alone).

use super::par;
use crate::graph::SideOperand;
use rayon::prelude::*;

/// The binary maps an epilogue step may apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EpilogueOp {
    Add,
    Sub,
    Mul,
}

/// One step of an [`Epilogue`].
#[derive(Clone, Debug)]
pub(super) enum EpilogueStep {
    /// `y ⊕ v[c]` (`Right`) or `v[c] ⊕ y` (`Left`), `v[c]` the side's value for output
    /// channel `c` (numbered over every group).
    Side {
        op: EpilogueOp,
        at: SideOperand,
        per_channel: Vec<f32>,
    },
    /// `maximum(y, 0)`, the native relu.
    Relu,
}

/// Steps applied to every output, in order (none: a plain conv).
pub(super) type Epilogue = [EpilogueStep];

/// Applies `epilogue` to the output plane of channel `ch`: the batch-norm form in one pass
/// ([`affine_form`]), any other epilogue step by step over the values.
fn finish_plane(epilogue: &Epilogue, ch: usize, plane: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    if let Some(form) = affine_form(epilogue) {
        let (a, b, c) = (form.a[ch], form.b[ch], form.c[ch]);
        let rest = affine_plane_avx2(plane, [a, b, c], form.relu);
        for y in rest.iter_mut() {
            let v = (*y - a) * b + c;
            *y = if form.relu {
                crate::scalar::maximum(v, 0.0)
            } else {
                v
            };
        }
        return;
    }
    finish_values(epilogue, ch, plane);
}

/// The batch-norm epilogue `(y − a)·b + c`, then relu if `relu`: each value per channel.
struct AffineForm<'e> {
    a: &'e [f32],
    b: &'e [f32],
    c: &'e [f32],
    relu: bool,
}

/// `epilogue` as [`AffineForm`], when it is exactly sub, mul and add of right-hand sides,
/// optionally followed by relu (a CNN's batch norm as the importer writes it).
fn affine_form(epilogue: &Epilogue) -> Option<AffineForm<'_>> {
    let side = |i: usize, want: EpilogueOp| match epilogue.get(i)? {
        EpilogueStep::Side {
            op,
            at: SideOperand::Right,
            per_channel,
        } if *op == want => Some(&per_channel[..]),
        _ => None,
    };
    let relu = match epilogue.len() {
        3 => false,
        4 if matches!(epilogue[3], EpilogueStep::Relu) => true,
        _ => return None,
    };
    Some(AffineForm {
        a: side(0, EpilogueOp::Sub)?,
        b: side(1, EpilogueOp::Mul)?,
        c: side(2, EpilogueOp::Add)?,
        relu,
    })
}

/// [`affine_form`]'s pass over the whole vectors of a plane: `(y − a)·b + c` as three
/// separate roundings (no fused multiply-add: the unfused maps' bits), relu as `max(0, v)`
/// (v where v is NaN or either is zero, as `maximum(v, 0)`). Returns the remainder (fewer
/// than eight values) it left.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
fn affine_plane_avx2(plane: &mut [f32], [a, b, c]: [f32; 3], relu: bool) -> &mut [f32] {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_mul_ps, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_storeu_ps, _mm256_sub_ps,
    };
    let mut vectors = plane.chunks_exact_mut(LANE);
    // SAFETY: AVX is enabled for the whole build (cfg); set1 and setzero only make register
    // values, and each load and store reads or writes one chunk of exactly LANE = 8 f32s.
    unsafe {
        let (va, vb, vc, zero) = (
            _mm256_set1_ps(a),
            _mm256_set1_ps(b),
            _mm256_set1_ps(c),
            _mm256_setzero_ps(),
        );
        for v in &mut vectors {
            let y = _mm256_loadu_ps(v.as_ptr());
            let mut r = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(y, va), vb), vc);
            if relu {
                r = _mm256_max_ps(zero, r);
            }
            _mm256_storeu_ps(v.as_mut_ptr(), r);
        }
    }
    vectors.into_remainder()
}

/// Applies `epilogue` to `values` of channel `ch`, step by step (each step's operation chosen
/// once; every element stored).
fn finish_values(epilogue: &Epilogue, ch: usize, plane: &mut [f32]) {
    #[inline(always)]
    fn each(plane: &mut [f32], f: impl Fn(f32) -> f32) {
        for x in plane.iter_mut() {
            *x = f(*x);
        }
    }
    use EpilogueOp::{Add, Mul, Sub};
    use SideOperand::{Left, Right};
    for step in epilogue {
        match step {
            EpilogueStep::Relu => each(plane, |y| crate::scalar::maximum(y, 0.0)),
            EpilogueStep::Side {
                op,
                at,
                per_channel,
            } => {
                let c = per_channel[ch];
                match (op, at) {
                    (Add, Right) => each(plane, |y| y + c),
                    (Add, Left) => each(plane, |y| c + y),
                    (Sub, Right) => each(plane, |y| y - c),
                    (Sub, Left) => each(plane, |y| c - y),
                    (Mul, Right) => each(plane, |y| y * c),
                    (Mul, Left) => each(plane, |y| c * y),
                }
            }
        }
    }
}

/// Output positions per vector (AVX2's eight lanes; the build targets x86-64-v3).
const LANE: usize = 8;

/// Output channels per register block.
const OB: usize = 4;

/// Vectors of output positions per register block: `OB · SLOTS` = 12 accumulators, plus the
/// `SLOTS` input loads and a weight vector, fill AVX2's 16 vector registers. Measured on the
/// imported CNN's two layers (batch 32, two threads) with the register loop of
/// [`accumulate_avx2`]: 4 × 3 took 18 and 38 µs, 4 × 2 22 and 47, 6 × 2 26 and 45, 2 × 4 22
/// and 48, 8 × 1 30 and 73.
const SLOTS: usize = 3;

/// The most kernel taps per output (input channels per group × kernel height × width) this
/// path takes: above that, the im2col path's GEMM blocks for the caches and wins.
pub(super) const MAX_TAPS: usize = 288;

/// The most packed weight values (all groups) this path builds per call: a weight is stored
/// once per lane ([`packed_len`]), so a layer with very many output channels stays on the
/// im2col path instead of allocating eight copies of its weights.
pub(super) const MAX_PACKED: usize = 1 << 20;

/// Packed weight values of one group: [`OB`]-channel blocks × taps × [`OB`] × [`LANE`].
pub(super) fn packed_len(other: usize, taps: usize) -> usize {
    other
        .div_ceil(OB)
        .saturating_mul(taps)
        .saturating_mul(OB * LANE)
}

/// Multiply-adds a parallel task gets at least (several images per task for small images).
const TASK_MACS: usize = 1 << 16;

/// The geometry of a stride-1, dilation-1 conv2d, per group.
#[derive(Clone, Copy, Debug)]
pub(super) struct Direct {
    pub groups: usize,
    /// Input channels per group.
    pub cg: usize,
    /// Output channels per group.
    pub other: usize,
    pub img: [usize; 2],
    pub out: [usize; 2],
    pub k: [usize; 2],
    pub pad: [usize; 2],
}

impl Direct {
    /// Kernel taps per output.
    fn taps(&self) -> usize {
        self.cg * self.k[0] * self.k[1]
    }
    /// Vectors per output row.
    fn slots_per_row(&self) -> usize {
        self.out[1].div_ceil(LANE)
    }
    /// Width of a padded row: every vector's loads for every kernel column stay inside it.
    fn wid(&self) -> usize {
        self.slots_per_row() * LANE + self.k[1] - 1
    }
    /// Rows of a padded plane (`img + 2·pad` for a stride-1 output).
    fn rows(&self) -> usize {
        self.out[0] + self.k[0] - 1
    }
    fn plane(&self) -> usize {
        self.rows() * self.wid()
    }

    /// Writes one group's input planes (`img`, [cg, ih, iw]) with their zero border into
    /// `padded` ([cg, rows, wid]); taps beyond the border (the last vector's spare lanes)
    /// read zeros too.
    fn pad_into(&self, img: &[f32], padded: &mut [f32]) {
        padded.fill(0.0);
        let (ih, iw) = (self.img[0], self.img[1]);
        if ih * iw == 0 {
            return;
        }
        let (wid, plane) = (self.wid(), self.plane());
        // rows of the image that land inside the padded plane (all of them for an output
        // of at least one row: rows = ih + 2·pad)
        let keep_rows = ih.min(self.rows().saturating_sub(self.pad[0]));
        let keep_cols = iw.min(wid.saturating_sub(self.pad[1]));
        for (src, dst) in img
            .chunks_exact(ih * iw)
            .zip(padded.chunks_exact_mut(plane))
        {
            for (r, s) in src.chunks_exact(iw).take(keep_rows).enumerate() {
                let at = (r + self.pad[0]) * wid + self.pad[1];
                dst[at..at + keep_cols].copy_from_slice(&s[..keep_cols]);
            }
        }
    }

    /// The weights of one group ([other, cg, kh, kw]) as blocks of [`OB`] output channels,
    /// tap-major within a block (`[block][tap][OB]`), zero for the channels past `other`.
    fn pack_weights(&self, w: &[f32]) -> Vec<f32> {
        let taps = self.taps();
        let mut packed = vec![0.0; packed_len(self.other, taps)];
        for (o, wo) in w.chunks_exact(taps).take(self.other).enumerate() {
            let block = &mut packed[(o / OB) * taps * OB * LANE..];
            for (t, v) in wo.iter().enumerate() {
                let at = (t * OB + o % OB) * LANE;
                block[at..at + LANE].fill(*v);
            }
        }
        packed
    }
}

/// `y = epilogue(conv2d(x, w) + bias)` for `x` [n, groups·cg, ih, iw], `w`
/// [groups·other, cg, kh, kw], `y` [n, groups·other, oh, ow] (every element written); each
/// side step of `epilogue` holds one value per output channel.
pub(super) fn forward(
    d: &Direct,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    epilogue: &Epilogue,
    y: &mut [f32],
) {
    let out_plane = d.out[0] * d.out[1];
    let per_out = d.groups * d.other * out_plane;
    let per_in = d.groups * d.cg * d.img[0] * d.img[1];
    if per_out == 0 {
        return;
    }
    let taps = d.taps();
    let packed: Vec<Vec<f32>> = (0..d.groups)
        .map(|g| d.pack_weights(&w[g * d.other * taps..(g + 1) * d.other * taps]))
        .collect();
    let prepared = Prepared::new(d);
    let image_macs = (per_out * taps).max(1);
    let per_task = (TASK_MACS / image_macs).max(1);
    y.par_chunks_mut(per_out)
        .enumerate()
        .with_min_len(per_task)
        .for_each(|(b, yb)| {
            let xb = &x[b * per_in..(b + 1) * per_in];
            par::with_scratch(d.cg * d.plane(), |padded| {
                for (g, yg) in yb.chunks_exact_mut(d.other * out_plane).enumerate() {
                    let img = d.cg * d.img[0] * d.img[1];
                    d.pad_into(&xb[g * img..(g + 1) * img], padded);
                    let bias_g = bias.map(|b| &b[g * d.other..(g + 1) * d.other]);
                    group(&prepared, padded, &packed[g], bias_g, yg);
                    if !epilogue.is_empty() {
                        for (o, plane) in yg.chunks_exact_mut(out_plane).enumerate() {
                            finish_plane(epilogue, g * d.other + o, plane);
                        }
                    }
                }
            });
        });
}

/// What every register block of a call reads: the geometry in the form the loops use.
struct Prepared {
    /// Each tap's offset in the padded planes from a vector's start, in tap order.
    offsets: Vec<usize>,
    /// The largest of `offsets` (0 when there are none).
    max_offset: usize,
    /// Per vector of output positions, in order: the offset of its first tap in a padded
    /// plane, its offset in an output plane, and how many of its lanes are positions.
    vectors: Vec<Vector>,
    /// Output channels per group, and positions per output channel plane.
    other: usize,
    out_plane: usize,
}

#[derive(Clone, Copy)]
struct Vector {
    start: usize,
    out: usize,
    lanes: usize,
}

impl Prepared {
    fn new(d: &Direct) -> Prepared {
        let (plane, wid, (kh, kw)) = (d.plane(), d.wid(), (d.k[0], d.k[1]));
        let mut offsets = Vec::with_capacity(d.taps());
        for c in 0..d.cg {
            for kp in 0..kh {
                for kq in 0..kw {
                    offsets.push(c * plane + kp * wid + kq);
                }
            }
        }
        let ow = d.out[1];
        let vectors = (0..d.out[0])
            .flat_map(|i| {
                (0..d.slots_per_row()).map(move |v| Vector {
                    start: i * wid + v * LANE,
                    out: i * ow + v * LANE,
                    lanes: (ow - v * LANE).min(LANE),
                })
            })
            .collect();
        Prepared {
            max_offset: offsets.iter().copied().max().unwrap_or(0),
            offsets,
            vectors,
            other: d.other,
            out_plane: d.out[0] * ow,
        }
    }
}

/// One group of one image: every output channel block over every vector of positions.
fn group(p: &Prepared, padded: &[f32], packed: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
    let slots = p.vectors.len();
    let per_block = p.offsets.len() * OB * LANE;
    for (blk, wb) in packed.chunks_exact(per_block).enumerate() {
        let o0 = blk * OB;
        let init: [f32; OB] =
            std::array::from_fn(|r| bias.and_then(|b| b.get(o0 + r)).copied().unwrap_or(0.0));
        let mut t = 0;
        while t < slots {
            t += match slots - t {
                left if left >= SLOTS => block::<SLOTS>(p, padded, wb, init, t, o0, y),
                left if left >= 2 => block::<2>(p, padded, wb, init, t, o0, y),
                _ => block::<1>(p, padded, wb, init, t, o0, y),
            };
        }
    }
}

/// The sums of one register block: `init[r] + Σ_taps w · x` for output channel `o0 + r` and the
/// `LANE` positions of each vector starting at `starts[s]`, accumulated tap by tap in order.
/// On x86-64 with AVX2 and FMA (the build's target level) the accumulators live in vector
/// registers ([`accumulate_avx2`]); elsewhere, or if a load could leave `padded` or `wb`,
/// the portable loop computes the same fused multiply-adds in the same order.
#[inline(always)]
fn accumulate<const S: usize>(
    p: &Prepared,
    padded: &[f32],
    wb: &[f32],
    init: [f32; OB],
    starts: [usize; S],
) -> [[[f32; LANE]; S]; OB] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        let loads_in_bounds = starts
            .iter()
            .all(|&s| s + p.max_offset + LANE <= padded.len())
            && wb.len() >= p.offsets.len() * OB * LANE;
        if loads_in_bounds {
            // SAFETY: every load below reads LANE values at `padded[start + off]` with
            // `off <= max_offset` (Prepared::new computes it as the largest offset) and
            // `start + max_offset + LANE <= padded.len()` (checked just above), or at
            // `wb[t * OB * LANE + r * LANE]` for tap t < offsets.len() and r < OB, inside
            // `wb` by the second check; AVX2 and FMA are enabled for the whole build (cfg).
            return unsafe { accumulate_avx2::<S>(&p.offsets, padded, wb, init, starts) };
        }
    }
    let mut acc: [[[f32; LANE]; S]; OB] = std::array::from_fn(|r| [[init[r]; LANE]; S]);
    for (&off, wv) in p.offsets.iter().zip(wb.chunks_exact(OB * LANE)) {
        let xs: [[f32; LANE]; S] = std::array::from_fn(|s| {
            let mut v = [0.0; LANE];
            v.copy_from_slice(&padded[starts[s] + off..starts[s] + off + LANE]);
            v
        });
        for (accr, wr) in acc.iter_mut().zip(wv.chunks_exact(LANE)) {
            for (a, x) in accr.iter_mut().zip(&xs) {
                for l in 0..LANE {
                    a[l] = wr[l].mul_add(x[l], a[l]);
                }
            }
        }
    }
    acc
}

/// [`accumulate`]'s tap loop in AVX2 registers: per tap, `S` unaligned input loads, `OB`
/// weight loads and `OB · S` fused multiply-adds (`w · x + acc`, as `f32::mul_add`).
///
/// # Safety
/// Every `padded[starts[s] + off .. + LANE]` (off in `offsets`) and every
/// `wb[t · OB · LANE .. (t + 1) · OB · LANE]` (t < `offsets.len()`) must be in bounds.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
unsafe fn accumulate_avx2<const S: usize>(
    offsets: &[usize],
    padded: &[f32],
    wb: &[f32],
    init: [f32; OB],
    starts: [usize; S],
) -> [[[f32; LANE]; S]; OB] {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps,
    };
    let mut acc: [[__m256; S]; OB] = std::array::from_fn(|r| [_mm256_set1_ps(init[r]); S]);
    let (x, mut w) = (padded.as_ptr(), wb.as_ptr());
    for &off in offsets {
        let xs: [__m256; S] = std::array::from_fn(|s| _mm256_loadu_ps(x.add(starts[s] + off)));
        for (r, accr) in acc.iter_mut().enumerate() {
            let wr = _mm256_loadu_ps(w.add(r * LANE));
            for (a, xv) in accr.iter_mut().zip(&xs) {
                *a = _mm256_fmadd_ps(wr, *xv, *a);
            }
        }
        w = w.add(OB * LANE);
    }
    let mut out = [[[0.0; LANE]; S]; OB];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (v, av) in o.iter_mut().zip(a) {
            _mm256_storeu_ps(v.as_mut_ptr(), *av);
        }
    }
    out
}

/// The register block: output channels `o0..o0 + OB` × vectors `t..t + S`, accumulated from
/// `init` over every tap in order, then written to the group's output `y` [other, oh, ow]
/// (the channels that exist, each vector's valid positions). Returns `S`.
#[inline(always)]
fn block<const S: usize>(
    p: &Prepared,
    padded: &[f32],
    wb: &[f32],
    init: [f32; OB],
    t: usize,
    o0: usize,
    y: &mut [f32],
) -> usize {
    let at: [Vector; S] = std::array::from_fn(|s| p.vectors[t + s]);
    let starts: [usize; S] = std::array::from_fn(|s| at[s].start);
    let acc = accumulate::<S>(p, padded, wb, init, starts);
    let out_plane = p.out_plane;
    for (r, accr) in acc.iter().enumerate() {
        let o = o0 + r;
        if o >= p.other {
            break;
        }
        let plane = &mut y[o * out_plane..(o + 1) * out_plane];
        for (v, vec) in accr.iter().zip(&at) {
            let o = vec.out;
            if vec.lanes == LANE {
                // a whole vector: one store
                plane[o..o + LANE].copy_from_slice(v);
            } else {
                for (dst, src) in plane[o..o + vec.lanes].iter_mut().zip(v) {
                    *dst = *src;
                }
            }
        }
    }
    S
}
