//! Native elementwise kernels: broadcasting n-ary maps, unary maps, and their VJPs.
//!
//! NaN handling is the spec's (`crate::spec` module doc): comparisons on values go through
//! the NaN-propagating helpers of `crate::scalar`, never `f32::max`/`min`.

use super::par::{for_chunks, for_rows};
use crate::graph::{Op, Relation};
use crate::scalar::{clamp, maximum, minimum};
use crate::spec::numel;
use crate::tensor::{Layout, Tensor};

/// Broadcast strides of an input of `shape` read as the output `out` shape.
fn bstrides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    Layout::contiguous(shape.to_vec()).broadcast(out).strides
}

/// `out[i] = f([x_k[src_k(i)] for k])` over the broadcast of the inputs to `out_shape`.
pub fn zip_map<const K: usize>(
    xs: [&[f32]; K],
    shapes: [&[usize]; K],
    out_shape: &[usize],
    f: impl Fn([f32; K]) -> f32 + Sync + Send,
) -> Vec<f32> {
    let mut out = super::par::overwritten(numel(out_shape));
    zip_map_into(xs, shapes, out_shape, &mut out, f);
    out
}

/// Elements per block of a repeated operand in [`zip_map_into`]'s row loop.
const REPEAT_BLOCK: usize = 64;

/// [`zip_map`] into `out` (of the output's element count), every element written.
pub fn zip_map_into<const K: usize>(
    xs: [&[f32]; K],
    shapes: [&[usize]; K],
    out_shape: &[usize],
    out: &mut [f32],
    f: impl Fn([f32; K]) -> f32 + Sync + Send,
) {
    if out.is_empty() {
        return;
    }
    if shapes.iter().all(|s| *s == out_shape) {
        for_chunks(out, |off, c| {
            let n = c.len();
            // re-slice to the chunk's length so the bounds checks hoist and the loop vectorizes
            let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][off..off + n]);
            for j in 0..n {
                c[j] = f(std::array::from_fn(|k| src[k][j]));
            }
        });
        return;
    }
    let strides: [Vec<usize>; K] = std::array::from_fn(|k| bstrides(shapes[k], out_shape));
    let (dims, strides) = collapse(out_shape, &strides);
    let rank = dims.len();
    let width = dims[rank - 1];
    let last: [usize; K] = std::array::from_fn(|k| strides[rank - 1][k]);
    // rows whose operands are each contiguous or one repeated value (a bias over channels,
    // a per-row scale) run as a contiguous loop over copies of the repeated values
    let unit = last.iter().all(|&l| l <= 1);
    // base offset of a row for each input
    let base_of = |row: usize| {
        let mut rem = row;
        let mut base = [0usize; K];
        for d in (0..rank - 1).rev() {
            let i = rem % dims[d];
            rem /= dims[d];
            for k in 0..K {
                base[k] += i * strides[d][k];
            }
        }
        base
    };
    if K == 2 && unit && last[0] != last[1] {
        // one operand contiguous along the row, the other one value per row (a per-channel
        // shift or scale of a CNN's batch norm): the value stays in a register
        let row_major = usize::from(last[0] == 0); // the contiguous operand
        for_rows(out, width, |row, o| {
            let base = base_of(row);
            let x = &xs[row_major][base[row_major]..base[row_major] + width];
            let v = xs[1 - row_major][base[1 - row_major]];
            if row_major == 0 {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f(std::array::from_fn(|k| if k == 0 { x } else { v }));
                }
            } else {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f(std::array::from_fn(|k| if k == 0 { v } else { x }));
                }
            }
        });
        return;
    }
    for_rows(out, width, |row, o| {
        let base = base_of(row);
        if unit {
            // the repeated values as blocks on the stack, as long as the row needs (no
            // allocation per row: a small CNN's batch-norm maps and an attention mask's adds
            // have thousands of short rows)
            let n0 = width.min(REPEAT_BLOCK);
            let mut repeated = [[0.0f32; REPEAT_BLOCK]; K];
            for k in 0..K {
                if last[k] == 0 {
                    repeated[k][..n0].fill(xs[k][base[k]]);
                }
            }
            for (b, o) in o.chunks_mut(REPEAT_BLOCK).enumerate() {
                let (start, n) = (b * REPEAT_BLOCK, o.len());
                let src: [&[f32]; K] = std::array::from_fn(|k| {
                    if last[k] == 0 {
                        &repeated[k][..n]
                    } else {
                        &xs[k][base[k] + start..base[k] + start + n]
                    }
                });
                for j in 0..n {
                    o[j] = f(std::array::from_fn(|k| src[k][j]));
                }
            }
        } else {
            for (j, v) in o.iter_mut().enumerate() {
                *v = f(std::array::from_fn(|k| xs[k][base[k] + j * last[k]]));
            }
        }
    });
}

/// The output axes with adjacent axes merged where every operand steps through them as one
/// axis (its stride on the outer axis is its inner stride times the inner size, e.g. both
/// 0 for a broadcast operand), and size-1 axes dropped; strides per axis, per operand.
/// `[32, 8, 16, 16]` against a `[8, 1, 1]` bias becomes `[32, 8, 256]`.
fn collapse<const K: usize>(
    out_shape: &[usize],
    strides: &[Vec<usize>; K],
) -> (Vec<usize>, Vec<[usize; K]>) {
    let mut dims: Vec<usize> = Vec::with_capacity(out_shape.len());
    let mut st: Vec<[usize; K]> = Vec::with_capacity(out_shape.len());
    for d in (0..out_shape.len()).rev() {
        let size = out_shape[d];
        if size == 1 {
            continue;
        }
        let s: [usize; K] = std::array::from_fn(|k| strides[k][d]);
        if let (Some(inner), Some(inner_st)) = (dims.last_mut(), st.last()) {
            if (0..K).all(|k| s[k] == inner_st[k] * *inner) {
                *inner *= size;
                continue;
            }
        }
        dims.push(size);
        st.push(s);
    }
    if dims.is_empty() {
        return (vec![1], vec![[0; K]]);
    }
    dims.reverse();
    st.reverse();
    (dims, st)
}

/// `out[i] = f(x[i])` into `out` (of `x`'s length).
pub fn map_into(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32 + Sync + Send) {
    // each chunk on 512-bit vectors where the CPU has them (`crate::wide`: the same bits)
    for_chunks(out, |off, c| {
        crate::wide::wide!({
            let n = c.len();
            for (o, &v) in c.iter_mut().zip(&x[off..off + n]) {
                *o = f(v);
            }
        })
    });
}

pub fn binary_forward(op: &Op, x: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    // fixed-size operand arrays: this runs once per op, and tiny ops are common
    let n = x.len().min(3);
    let data: [std::borrow::Cow<[f32]>; 3] = std::array::from_fn(|k| {
        x.get(k)
            .map_or(std::borrow::Cow::Borrowed(&[][..]), |t| t.data())
    });
    let slices: [&[f32]; 3] = std::array::from_fn(|k| &data[k][..]);
    let shapes: [&[usize]; 3] = std::array::from_fn(|k| x.get(k).map_or(&[][..], |t| t.shape()));
    let mut out = super::par::overwritten(numel(out_shape));
    binary_forward_into(op, &slices[..n], &shapes[..n], out_shape, &mut out);
    out
}

/// [`binary_forward`] on row-major operands `x` of `shapes`, into `out` (of `out_shape`).
pub fn binary_forward_into(
    op: &Op,
    x: &[&[f32]],
    shapes: &[&[usize]],
    out_shape: &[usize],
    out: &mut [f32],
) {
    if let Op::Where = op {
        return zip_map_into(
            [x[0], x[1], x[2]],
            [shapes[0], shapes[1], shapes[2]],
            out_shape,
            out,
            |[c, a, b]| if c != 0.0 { a } else { b },
        );
    }
    let (a, b) = (x[0], x[1]);
    let shapes = [shapes[0], shapes[1]];
    // one closure type per op, so every map is monomorphized and vectorizes
    macro_rules! zip2 {
        ($f:expr) => {
            zip_map_into([a, b], shapes, out_shape, out, $f)
        };
    }
    match op {
        Op::Add => zip2!(|[a, b]: [f32; 2]| a + b),
        Op::Sub => zip2!(|[a, b]: [f32; 2]| a - b),
        Op::Mul => zip2!(|[a, b]: [f32; 2]| a * b),
        Op::Div => zip2!(|[a, b]: [f32; 2]| a / b),
        Op::Maximum => zip2!(|[a, b]: [f32; 2]| maximum(a, b)),
        Op::Minimum => zip2!(|[a, b]: [f32; 2]| minimum(a, b)),
        Op::Compare { relation } => {
            // one closure per relation, each a branch-free select that vectorizes
            let one = |holds: bool| f32::from(u8::from(holds));
            match relation {
                Relation::Eq => zip2!(|[a, b]: [f32; 2]| one(a == b)),
                Relation::Ne => zip2!(|[a, b]: [f32; 2]| one(a != b)),
                Relation::Lt => zip2!(|[a, b]: [f32; 2]| one(a < b)),
                Relation::Le => zip2!(|[a, b]: [f32; 2]| one(a <= b)),
                Relation::Gt => zip2!(|[a, b]: [f32; 2]| one(a > b)),
                Relation::Ge => zip2!(|[a, b]: [f32; 2]| one(a >= b)),
            }
        }
        _ => unreachable!("not a binary op: {}", op.name()),
    }
}

/// The cotangents of a binary (or `where`) map: those of the inputs that `needs` marks (all
/// when it is shorter), None for the others.
pub fn binary_vjp(op: &Op, x: &[&Tensor], gy: &Tensor, needs: &[bool]) -> Vec<Option<Tensor>> {
    let g = gy.data();
    let data: Vec<_> = x.iter().map(|t| t.data()).collect();
    let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
    let shapes: Vec<&[usize]> = x.iter().map(|t| t.shape()).collect();
    // `where` gives its condition no cotangent
    let first = usize::from(matches!(op, Op::Where));
    let mut bufs: Vec<Option<Vec<f32>>> = x
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (i >= first && needs.get(i).copied().unwrap_or(true))
                .then(|| super::par::overwritten(t.numel()))
        })
        .collect();
    let mut outs: Vec<Option<&mut [f32]>> = bufs.iter_mut().map(|b| b.as_deref_mut()).collect();
    binary_vjp_into(op, &slices, &shapes, &g, gy.shape(), &mut outs);
    bufs.into_iter()
        .zip(x)
        .map(|(b, t)| b.map(|b| Tensor::from_parts(b, t.shape().to_vec())))
        .collect()
}

/// The cotangents of a binary (or `where`) map into `outs` (where `Some`, each of its input's
/// element count): the full-shape cotangent, summed down to the input's shape when it was
/// broadcast. `where`'s condition takes none (a requested one is zeros).
pub fn binary_vjp_into(
    op: &Op,
    x: &[&[f32]],
    shapes: &[&[usize]],
    g: &[f32],
    shape: &[usize],
    outs: &mut [Option<&mut [f32]>],
) {
    // cotangent `i` from its full-shape values `f(a, b, g)`, reduced to input i's shape
    macro_rules! grad {
        ($i:expr, $xs:expr, $ss:expr, $f:expr) => {
            if let Some(o) = outs[$i].as_deref_mut() {
                if shapes[$i] == shape {
                    zip_map_into($xs, $ss, shape, o, $f);
                } else {
                    let mut full = super::par::overwritten(g.len());
                    zip_map_into($xs, $ss, shape, &mut full, $f);
                    super::reduce::sum_to_shape_into(&full, shape, shapes[$i], o);
                }
            }
        };
    }
    if let Op::Where = op {
        if let Some(o) = outs[0].as_deref_mut() {
            o.fill(0.0);
        }
        let (c, sc) = (x[0], shapes[0]);
        grad!(1, [c, g], [sc, shape], |[c, g]: [f32; 2]| if c != 0.0 {
            g
        } else {
            0.0
        });
        grad!(2, [c, g], [sc, shape], |[c, g]: [f32; 2]| if c != 0.0 {
            0.0
        } else {
            g
        });
        return;
    }
    let (a, b) = (x[0], x[1]);
    let ss = [shapes[0], shapes[1], shape];
    match op {
        Op::Add | Op::Sub => {
            for i in 0..2 {
                if let Some(o) = outs[i].as_deref_mut() {
                    let negate = i == 1 && matches!(op, Op::Sub);
                    super::reduce::sum_to_shape_into(g, shape, shapes[i], o);
                    if negate && shapes[i] != shape {
                        // the spec's (PyTorch's) value is the sum of the negated terms, from
                        // +0: -sum for a nonzero sum, +0 for a zero one (an empty or all-zero
                        // sum), which 0 - sum gives and -sum does not (-0)
                        o.iter_mut().for_each(|v| *v = 0.0 - *v);
                    } else if negate {
                        o.iter_mut().for_each(|v| *v = -*v);
                    }
                }
            }
        }
        Op::Mul => {
            grad!(0, [a, b, g], ss, |[_, b, g]: [f32; 3]| g * b);
            grad!(1, [a, b, g], ss, |[a, _, g]: [f32; 3]| g * a);
        }
        Op::Div => {
            grad!(0, [a, b, g], ss, |[_, b, g]: [f32; 3]| g / b);
            // the spec's (PyTorch's) order of operations: no b², which overflows or
            // underflows in f32 where the gradient does not
            grad!(1, [a, b, g], ss, |[a, b, g]: [f32; 3]| -g * ((a / b) / b));
        }
        // the spec's rule (PyTorch's), `spec::share_grad` itself: an input's cotangent is
        // exactly 0 where the other strictly wins, the two share it on a tie, both keep it
        // at a NaN
        Op::Maximum => {
            grad!(0, [a, b, g], ss, |[a, b, g]: [f32; 3]| {
                crate::spec::share_grad(a, b, g)
            });
            grad!(1, [a, b, g], ss, |[a, b, g]: [f32; 3]| {
                crate::spec::share_grad(b, a, g)
            });
        }
        Op::Minimum => {
            grad!(0, [a, b, g], ss, |[a, b, g]: [f32; 3]| {
                crate::spec::share_grad(b, a, g)
            });
            grad!(1, [a, b, g], ss, |[a, b, g]: [f32; 3]| {
                crate::spec::share_grad(a, b, g)
            });
        }
        _ => unreachable!("not a binary op: {}", op.name()),
    }
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + vmath::erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn gelu_grad(x: f32) -> f32 {
    // e^(−x²/2) is both the density's factor and erf's e^(−u²) at u = x/√2: computed once
    let u = x * std::f32::consts::FRAC_1_SQRT_2;
    let e = vmath::exp(-u * u);
    let cdf = 0.5 * (1.0 + vmath::erf_given_exp(u, e));
    cdf + x * (e * 0.398_942_3) // 1/sqrt(2π)
}

use super::vmath::{self, sigmoid};

pub fn unary_forward(op: &Op, x: &[f32]) -> Vec<f32> {
    let mut out = super::par::overwritten(x.len());
    unary_forward_into(op, x, &mut out);
    out
}

/// [`unary_forward`] into `out` (of `x`'s length): the same table as the in-place kernel,
/// read from `x` (no copy of the input first).
pub fn unary_forward_into(op: &Op, x: &[f32], out: &mut [f32]) {
    match op {
        Op::FusedUnary { ops } => fused_chain(ops, Some(x), out),
        _ => unary_table(op, Into(x, out)),
    }
}

/// Applies a unary map (or a fused chain of them) to `w` in place.
pub fn unary_in_place(op: &Op, w: &mut [f32]) {
    match op {
        Op::FusedUnary { ops } => fused_chain(ops, None, w),
        _ => unary_table(op, InPlace(w)),
    }
}

/// Elements per block of a fused chain: every step runs over one block while it is in the
/// L1 cache.
const FUSED_BLOCK: usize = 1024;

/// A fused chain of unary maps over `out` (read from `x` when given, else in place): each step
/// is the unfused kernel's own map ([`unary_table`]) applied block by block, so the bits are
/// the unfused maps' — the spec's f32 formulas (`std`'s `tanh`, `exp`) gave other last bits
/// than the native maps (`vmath`), so a compiled run's outputs depended on whether a chain
/// was fused, i.e. on `--grad` (an audit of the thirty-eighth session).
fn fused_chain(ops: &[Op], x: Option<&[f32]>, out: &mut [f32]) {
    for_chunks(out, |off, c| {
        for (k, block) in c.chunks_mut(FUSED_BLOCK).enumerate() {
            let at = off + k * FUSED_BLOCK;
            let mut steps = ops.iter();
            if let Some(x) = x {
                let src = &x[at..at + block.len()];
                match steps.next() {
                    Some(first) => unary_table(first, Into(src, block)),
                    None => block.copy_from_slice(src),
                }
            }
            for step in steps {
                unary_table(step, InPlace(block));
            }
        }
    });
}

/// Where a unary map's values go: each closure of [`unary_table`] is monomorphized per sink,
/// so both loops are specialized to the map and vectorize.
trait MapSink {
    fn run(self, f: impl Fn(f32) -> f32 + Sync + Send);
}

/// `w[i] = f(w[i])` in fixed parallel chunks when large.
struct InPlace<'a>(&'a mut [f32]);
/// `out[i] = f(x[i])` in fixed parallel chunks when large.
struct Into<'a>(&'a [f32], &'a mut [f32]);

impl MapSink for InPlace<'_> {
    /// Through [`super::par::overwrite_each`]: no masked stores for maps such as relu.
    fn run(self, f: impl Fn(f32) -> f32 + Sync + Send) {
        for_chunks(self.0, |_, c| {
            crate::wide::wide!(super::par::overwrite_each(c, |_, v| f(v)))
        });
    }
}

impl MapSink for Into<'_> {
    fn run(self, f: impl Fn(f32) -> f32 + Sync + Send) {
        map_into(self.0, self.1, f);
    }
}

/// The one table of the native unary maps, used by the forward, in-place and
/// destination-passing kernels (the same closure for each, so the same bits).
fn unary_table(op: &Op, sink: impl MapSink) {
    match op {
        // (a chain inside a chain: the table of each step, element by element)
        Op::FusedUnary { ops } => sink.run(|v| crate::spec::fused_chain_value(ops, v)),
        Op::Neg => sink.run(|v| -v),
        Op::Abs => sink.run(f32::abs),
        Op::Sqrt => sink.run(f32::sqrt),
        Op::Exp => sink.run(vmath::exp),
        Op::Log => sink.run(f32::ln),
        Op::Sin => sink.run(f32::sin),
        Op::Cos => sink.run(f32::cos),
        Op::Tanh => sink.run(vmath::tanh),
        Op::Sigmoid => sink.run(sigmoid),
        Op::Relu => sink.run(|v| maximum(v, 0.0)),
        Op::Gelu => sink.run(gelu),
        Op::Silu => sink.run(|v| v * sigmoid(v)),
        Op::Softplus => sink.run(|v| maximum(v, 0.0) + vmath::exp(-v.abs()).ln_1p()),
        Op::Erf => sink.run(vmath::erf),
        Op::Tan => sink.run(f32::tan),
        Op::Atan => sink.run(f32::atan),
        Op::Asin => sink.run(f32::asin),
        Op::Acos => sink.run(f32::acos),
        Op::Sinh => sink.run(f32::sinh),
        Op::Cosh => sink.run(f32::cosh),
        Op::Asinh => sink.run(f32::asinh),
        Op::Acosh => sink.run(f32::acosh),
        Op::Atanh => sink.run(f32::atanh),
        Op::Inv => sink.run(|v| 1.0 / v),
        &Op::SafeLog { eps } => sink.run(move |v| maximum(v, eps).ln()),
        &Op::Scale { factor } => sink.run(move |v| v * factor),
        &Op::AddScalar { value } => sink.run(move |v| v + value),
        &Op::Clamp { min, max } => sink.run(move |v| clamp(v, min, max)),
        &Op::Pow { exponent } => sink.run(move |v| crate::spec::pow(v, exponent)),
        &Op::Round { mode } => sink.run(move |v| crate::spec::round(mode, v)),
        _ => unreachable!("not a unary op: {}", op.name()),
    }
}

/// The cotangent of a unary map's input from (x, y, gy).
pub fn unary_vjp(op: &Op, x: &[f32], y: &[f32], g: &[f32], shape: &[usize]) -> Vec<f32> {
    let mut out = super::par::overwritten(g.len());
    unary_vjp_into(op, x, y, g, shape, &mut out);
    out
}

/// [`unary_vjp`] into `out` (of `g`'s length), every element written.
pub fn unary_vjp_into(op: &Op, x: &[f32], y: &[f32], g: &[f32], shape: &[usize], out: &mut [f32]) {
    let s = [shape, shape, shape];
    // The body is expanded inside the chunk loop (no per-element closure call), so the loop
    // vectorizes even when the body is large (GELU's derivative).
    macro_rules! z {
        (|$xp:pat_param, $yp:pat_param, $gp:pat_param| $body:expr) => {{
            let _ = s;
            for_chunks(out, |off, c| {
                crate::wide::wide!({
                    let n = c.len();
                    let (xs, ys, gs) = (&x[off..off + n], &y[off..off + n], &g[off..off + n]);
                    for j in 0..n {
                        let ($xp, $yp, $gp) = (xs[j], ys[j], gs[j]);
                        c[j] = $body;
                    }
                })
            });
        }};
    }
    match *op {
        Op::Neg => map_into(g, out, |g| -g),
        Op::Abs => z!(|x, _, g| {
            if x > 0.0 {
                g
            } else if x < 0.0 {
                -g
            } else {
                // PyTorch's g · sgn(x) (the spec): NaN for an infinite or NaN g at 0 or NaN
                g * 0.0
            }
        }),
        Op::Sqrt => z!(|_, y, g| g / (2.0 * y)),
        Op::Exp => z!(|_, y, g| g * y),
        Op::Log => z!(|x, _, g| g / x),
        Op::Sin => z!(|x, _, g| g * x.cos()),
        Op::Cos => z!(|x, _, g| -g * x.sin()),
        Op::Tanh => z!(|_, y, g| g * (1.0 - y * y)),
        Op::Sigmoid => z!(|_, y, g| g * y * (1.0 - y)),
        // zero where x <= 0; a NaN passes the cotangent (the spec, PyTorch)
        Op::Relu => z!(|x, _, g| if x <= 0.0 { 0.0 } else { g }),
        Op::Gelu => z!(|x, _, g| g * gelu_grad(x)),
        Op::Silu => z!(|x, _, g| {
            let s = sigmoid(x);
            g * s * (1.0 + x * (1.0 - s))
        }),
        Op::Softplus => z!(|x, _, g| g * sigmoid(x)),
        Op::Erf => z!(|x, _, g| g * (std::f32::consts::FRAC_2_SQRT_PI * vmath::exp(-(x * x)))),
        // the spec's (PyTorch's) forms: g·(1 + y²), g / (x² + 1), g·(±1/√(1 − x²))
        Op::Tan => z!(|_, y, g| g * (1.0 + y * y)),
        Op::Atan => z!(|x, _, g| g / (x * x + 1.0)),
        Op::Asin => z!(|x, _, g| g * (1.0 / (1.0 - x * x).sqrt())),
        Op::Acos => z!(|x, _, g| g * -(1.0 / (1.0 - x * x).sqrt())),
        Op::Sinh => z!(|x, _, g| g * x.cosh()),
        Op::Cosh => z!(|x, _, g| g * x.sinh()),
        Op::Asinh => z!(|x, _, g| g * (1.0 / (x * x + 1.0).sqrt())),
        Op::Acosh => z!(|x, _, g| g * (1.0 / (x * x - 1.0).sqrt())),
        Op::Atanh => z!(|x, _, g| g / (1.0 - x * x)),
        // the spec's (PyTorch's) order: g · (−(y·y))
        Op::Inv => z!(|_, y, g| g * -(y * y)),
        Op::SafeLog { eps } => zip_map_into([x, g], [shape, shape], shape, out, move |[x, g]| {
            if x > eps {
                g / x
            } else {
                0.0
            }
        }),
        Op::Scale { factor } => map_into(g, out, move |g| g * factor),
        Op::AddScalar { .. } => out.copy_from_slice(g),
        Op::Clamp { min, max } => zip_map_into([x, g], [shape, shape], shape, out, move |[x, g]| {
            if x >= min && x <= max {
                g
            } else {
                0.0
            }
        }),
        Op::Pow { exponent } => zip_map_into([x, g], [shape, shape], shape, out, move |[x, g]| {
            if exponent == 0.0 {
                // a constant: exactly 0, whatever the cotangent (the spec, PyTorch)
                0.0
            } else {
                // the spec's (PyTorch's) order: g · (p · x^(p−1)); (g · p) first overflows or
                // underflows where the gradient does not
                g * (exponent * crate::spec::pow(x, exponent - 1.0))
            }
        }),
        // piecewise constant: exactly 0, whatever the cotangent (the spec, PyTorch)
        Op::Round { .. } => out.fill(0.0),
        _ => unreachable!("not a unary op: {}", op.name()),
    }
}

/// The cotangent of a fused chain: `g` times the chain-rule product, recomputed per element.
pub fn fused_vjp(op: &Op, x: &[f32], g: &[f32]) -> Vec<f32> {
    let Op::FusedUnary { ops } = op else {
        unreachable!("fused_vjp called for {}", op.name())
    };
    let mut out = super::par::overwritten(x.len().min(g.len()));
    fused_vjp_into(ops, x, g, &mut out);
    out
}

/// [`fused_vjp`] of the chain `ops` into `out` (of `x`'s length).
pub fn fused_vjp_into(ops: &[Op], x: &[f32], g: &[f32], out: &mut [f32]) {
    super::par::for_chunks(out, |off, c| {
        for (j, o) in c.iter_mut().enumerate() {
            *o = crate::spec::fused_chain_grad(ops, x[off + j], g[off + j]);
        }
    });
}
