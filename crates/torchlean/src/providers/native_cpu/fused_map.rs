//! Native `fused_map`: a chain of elementwise steps over one value in one pass (a CNN's
//! batch norm — shift, scale and bias per channel — with the ReLU after it: one pass over the
//! activation instead of four).
//!
//! The output is cut into rows over which every side input is either one value (a
//! per-channel shift over a channel's plane) or a contiguous run (a bias over the last
//! axis), and computed in blocks of [`BLOCK`] values that stay in L1 while every step runs
//! over them: several whole rows per block when rows are shorter (a side's per-row values are
//! then laid out in a side buffer of the block's length: with an 8×8 plane per row, per-row
//! blocks cost more in calls than in arithmetic), else one row in blocks. A unary step is the
//! native unary map (`elementwise::unary_forward_into`) and a binary step the native binary
//! map's scalar function, so each element goes through the same f32 operations, in the same
//! order, as the unfused kernels: the same bits. Steps write every element of a scratch
//! block (never in place: an in-place max with 0 compiles to masked stores, slow on AMD).
//!
//! Owns: the fused pass and its row split. Must not decide what is fused (graph/fuse.rs does).

use super::elementwise::unary_forward_into;
use super::par::{CHUNK, PAR_THRESHOLD};
use crate::graph::{FusedStep, Op, SideOperand};
use crate::scalar::{maximum, minimum};
use crate::tensor::{Layout, Tensor};
use rayon::prelude::*;

/// Values per block of a row.
const BLOCK: usize = 512;

/// How a side input varies along a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Along {
    /// One value per row.
    Constant,
    /// The row's values, contiguous.
    Contiguous,
}

/// The split of an output of `out_shape` into rows for sides of `side_shapes`: the row
/// width, each side's class along a row, and its broadcast strides over the leading axes.
struct Rows {
    width: usize,
    lead: Vec<usize>,
    along: Vec<Along>,
    strides: Vec<Vec<usize>>,
}

impl Rows {
    fn new(out_shape: &[usize], side_shapes: &[&[usize]]) -> Rows {
        let strides: Vec<Vec<usize>> = side_shapes
            .iter()
            .map(|s| Layout::contiguous(s.to_vec()).broadcast(out_shape).strides)
            .collect();
        let mut along: Vec<Option<Along>> = vec![None; side_shapes.len()];
        let (mut width, mut split) = (1usize, out_shape.len());
        // the longest run of trailing axes over which every side is one value or contiguous,
        // and rows of at most CHUNK values once a row has an axis (so a large tensor whose
        // sides all match it, or are scalars, still has rows to split over threads)
        'axes: for d in (0..out_shape.len()).rev() {
            if out_shape[d] != 1 {
                if width > 1 && width.saturating_mul(out_shape[d]) > CHUNK {
                    break 'axes;
                }
                let mut next = along.clone();
                for (k, a) in next.iter_mut().enumerate() {
                    let class = match strides[k][d] {
                        0 => Along::Constant,
                        s if s == width => Along::Contiguous,
                        _ => break 'axes,
                    };
                    match a {
                        Some(c) if *c != class => break 'axes,
                        _ => *a = Some(class),
                    }
                }
                along = next;
                width *= out_shape[d];
            }
            split = d;
        }
        Rows {
            width,
            lead: out_shape[..split].to_vec(),
            along: along
                .into_iter()
                .map(|a| a.unwrap_or(Along::Constant))
                .collect(),
            strides: strides.into_iter().map(|s| s[..split].to_vec()).collect(),
        }
    }

    /// Each side's offset at the start of row `row`, and a cursor that steps them row by
    /// row (no division per row).
    fn cursor(&self, row: usize) -> Cursor<'_> {
        let mut idx = vec![0; self.lead.len()];
        let mut rem = row;
        for d in (0..self.lead.len()).rev() {
            idx[d] = rem % self.lead[d];
            rem /= self.lead[d];
        }
        let bases = self
            .strides
            .iter()
            .map(|st| idx.iter().zip(st).map(|(i, s)| i * s).sum())
            .collect();
        Cursor {
            rows: self,
            idx,
            bases,
        }
    }
}

/// The multi-index of a row over the leading axes and each side's offset there.
struct Cursor<'a> {
    rows: &'a Rows,
    idx: Vec<usize>,
    bases: Vec<usize>,
}

impl Cursor<'_> {
    /// Moves to the next row.
    fn advance(&mut self) {
        let lead = &self.rows.lead;
        for d in (0..lead.len()).rev() {
            self.idx[d] += 1;
            for (b, st) in self.bases.iter_mut().zip(&self.rows.strides) {
                *b += st[d];
            }
            if self.idx[d] < lead[d] {
                return;
            }
            // carry: back to 0 on this axis, one step on the next outer one
            for (b, st) in self.bases.iter_mut().zip(&self.rows.strides) {
                *b -= lead[d] * st[d];
            }
            self.idx[d] = 0;
        }
    }
}

/// One side input's values for a block: one value, or a contiguous run.
#[derive(Clone, Copy)]
enum Operand<'a> {
    Value(f32),
    Run(&'a [f32]),
}

/// `dst[j] = f(src[j], side)` (`Right`) or `f(side, src[j])` (`Left`) over a block (every
/// element written: no masked stores, which AMD cores run slowly).
#[inline(always)]
fn apply(
    src: &[f32],
    dst: &mut [f32],
    side: Operand,
    at: SideOperand,
    f: impl Fn(f32, f32) -> f32,
) {
    let pairs = dst.iter_mut().zip(src);
    match (side, at) {
        (Operand::Value(s), SideOperand::Right) => pairs.for_each(|(d, &x)| *d = f(x, s)),
        (Operand::Value(s), SideOperand::Left) => pairs.for_each(|(d, &x)| *d = f(s, x)),
        (Operand::Run(s), SideOperand::Right) => {
            pairs.zip(s).for_each(|((d, &x), &s)| *d = f(x, s))
        }
        (Operand::Run(s), SideOperand::Left) => pairs.zip(s).for_each(|((d, &x), &s)| *d = f(s, x)),
    }
}

/// A binary step over a block, with the native binary maps' functions.
fn binary_step(op: &Op, src: &[f32], dst: &mut [f32], side: Operand, at: SideOperand) {
    match op {
        Op::Add => apply(src, dst, side, at, |a, b| a + b),
        Op::Sub => apply(src, dst, side, at, |a, b| a - b),
        Op::Mul => apply(src, dst, side, at, |a, b| a * b),
        Op::Div => apply(src, dst, side, at, |a, b| a / b),
        Op::Maximum => apply(src, dst, side, at, maximum),
        Op::Minimum => apply(src, dst, side, at, minimum),
        _ => unreachable!("the shape rule admits binary maps only: {}", op.name()),
    }
}

/// The fused map of `steps` over `x` ([value, sides...], row-major, the value of
/// `out_shape`) into `out` (every element written).
pub fn forward_into(
    steps: &[FusedStep],
    x: &[&[f32]],
    shapes: &[&[usize]],
    out_shape: &[usize],
    out: &mut [f32],
) {
    // an empty output has nothing to compute (and its rows' axes may hold a 0, which the
    // cursor's index arithmetic would divide by)
    if out.is_empty() {
        return;
    }
    let rows = Rows::new(out_shape, &shapes[1..]);
    let value = x[0];
    let width = rows.width;
    if let Some(aff) = Affine::of(steps, &rows.along) {
        let task = |first_row: usize, o: &mut [f32]| {
            let mut at = rows.cursor(first_row);
            for (r, row) in o.chunks_mut(width).enumerate() {
                if r > 0 {
                    at.advance();
                }
                let start = (first_row + r) * width;
                let side = |k: usize| x[1 + k][at.bases[k]];
                aff.row(&value[start..start + width], row, side);
            }
        };
        return by_rows(out, width, task);
    }
    let sides = rows.along.len();
    // rows per block: whole rows when they are shorter than a block (a side's per-row values
    // are then laid out in a side buffer), else one row in blocks of BLOCK values
    let group = (BLOCK / width).max(1);
    let task = |first_row: usize, o: &mut [f32]| {
        let mut at = rows.cursor(first_row);
        let mut scratch = [[0.0f32; BLOCK]; 2];
        let mut side_bufs = vec![[0.0f32; BLOCK]; if group > 1 { sides } else { 0 }];
        if group > 1 {
            for (g, block) in o.chunks_mut(group * width).enumerate() {
                let start = (first_row + g * group) * width;
                let n = block.len();
                for r in 0..n / width {
                    if g + r > 0 {
                        at.advance();
                    }
                    for (k, buf) in side_bufs.iter_mut().enumerate() {
                        let seg = &mut buf[r * width..(r + 1) * width];
                        let base = at.bases[k];
                        match rows.along[k] {
                            Along::Constant => seg.fill(x[1 + k][base]),
                            Along::Contiguous => seg.copy_from_slice(&x[1 + k][base..base + width]),
                        }
                    }
                }
                let operands: Vec<Operand> =
                    side_bufs.iter().map(|b| Operand::Run(&b[..n])).collect();
                run_steps(
                    steps,
                    &value[start..start + n],
                    block,
                    &operands,
                    &mut scratch,
                );
            }
            return;
        }
        for (r, row) in o.chunks_mut(width).enumerate() {
            if r > 0 {
                at.advance();
            }
            let start = (first_row + r) * width;
            for (b, block) in row.chunks_mut(BLOCK).enumerate() {
                let (off, n) = (b * BLOCK, block.len());
                let operands: Vec<Operand> = (0..sides)
                    .map(|k| {
                        let base = at.bases[k];
                        match rows.along[k] {
                            Along::Constant => Operand::Value(x[1 + k][base]),
                            Along::Contiguous => {
                                Operand::Run(&x[1 + k][base + off..base + off + n])
                            }
                        }
                    })
                    .collect();
                let input = &value[start + off..start + off + n];
                run_steps(steps, input, block, &operands, &mut scratch);
            }
        }
    };
    by_rows(out, width, task)
}

/// Runs `task(first_row, rows)` over `out` ([rows, width]) on whole rows, about [`CHUNK`]
/// values per task, in parallel when large.
fn by_rows(out: &mut [f32], width: usize, task: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let per_task = (CHUNK / width).max(1) * width;
    if out.len() < PAR_THRESHOLD {
        task(0, out);
    } else {
        out.par_chunks_mut(per_task)
            .enumerate()
            .for_each(|(t, o)| task(t * (per_task / width), o));
    }
}

/// The batch-norm epilogue, `((x − a) · b) + c` or `(x · b) + c`, then optionally a ReLU,
/// with one value per row for every side input: one loop over the row with the steps'
/// operations in order (each rounded to f32 as the steps round it; no fused multiply-add),
/// instead of a pass per step. The steps' own kernels would store every intermediate value.
#[derive(Clone, Copy)]
struct Affine {
    shift: bool,
    relu: bool,
}

impl Affine {
    fn of(steps: &[FusedStep], along: &[Along]) -> Option<Affine> {
        if along.iter().any(|a| *a != Along::Constant) {
            return None;
        }
        let right = |s: &FusedStep, op: Op| s.op == op && s.side == Some(SideOperand::Right);
        let (shift, rest) = match steps {
            [first, rest @ ..] if right(first, Op::Sub) => (true, rest),
            _ => (false, steps),
        };
        let relu = match rest {
            [m, a] if right(m, Op::Mul) && right(a, Op::Add) => false,
            [m, a, r] if right(m, Op::Mul) && right(a, Op::Add) => {
                if r.side.is_some() || r.op != Op::Relu {
                    return None;
                }
                true
            }
            _ => return None,
        };
        Some(Affine { shift, relu })
    }

    /// One row: `side(k)` is side input k's value for the row.
    fn row(self, x: &[f32], out: &mut [f32], side: impl Fn(usize) -> f32) {
        fn each(x: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
            out.iter_mut().zip(x).for_each(|(o, &v)| *o = f(v));
        }
        match (self.shift, self.relu) {
            (true, relu) => {
                let (a, b, c) = (side(0), side(1), side(2));
                if relu {
                    each(x, out, |v| maximum(((v - a) * b) + c, 0.0))
                } else {
                    each(x, out, |v| ((v - a) * b) + c)
                }
            }
            (false, relu) => {
                let (b, c) = (side(0), side(1));
                if relu {
                    each(x, out, |v| maximum((v * b) + c, 0.0))
                } else {
                    each(x, out, |v| (v * b) + c)
                }
            }
        }
    }
}

/// The steps over one block: `input` (the value's elements) to `out`, side input k's values
/// in `sides[k]`. Step i reads the input (i = 0) or scratch block (i + 1) % 2, which step
/// i - 1 wrote, and writes scratch block i % 2, or `out` (the last step).
fn run_steps(
    steps: &[FusedStep],
    input: &[f32],
    out: &mut [f32],
    sides: &[Operand],
    scratch: &mut [[f32; BLOCK]; 2],
) {
    let n = out.len();
    let mut k = 0;
    for (i, step) in steps.iter().enumerate() {
        let (first, second) = scratch.split_at_mut(1);
        let (read, write) = if i % 2 == 0 {
            (&second[0], &mut first[0])
        } else {
            (&first[0], &mut second[0])
        };
        let src: &[f32] = if i == 0 { input } else { &read[..n] };
        let dst: &mut [f32] = if i + 1 == steps.len() {
            &mut *out
        } else {
            &mut write[..n]
        };
        match step.side {
            None => unary_forward_into(&step.op, src, dst),
            Some(at) => {
                binary_step(&step.op, src, dst, sides[k], at);
                k += 1;
            }
        }
    }
}

/// [`forward_into`] over tensors, into a new buffer.
pub fn forward(steps: &[FusedStep], inputs: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let data: Vec<_> = inputs.iter().map(|t| t.data()).collect();
    let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let mut out = super::par::overwritten(crate::spec::numel(out_shape));
    forward_into(steps, &slices, &shapes, out_shape, &mut out);
    out
}

/// The VJP of the chain: the native kernels of its parts, run backwards over the recomputed
/// intermediate values (the gradient of every side input, and of the value).
pub fn vjp(
    steps: &[FusedStep],
    inputs: &[&Tensor],
    grad_out: &Tensor,
) -> crate::error::Result<Vec<Option<Tensor>>> {
    let mut values = vec![inputs[0].clone()];
    let mut k = 0;
    for step in steps {
        // invariant: `values` starts with the input
        let v = values.last().expect("the input is the first value");
        let next = match step.side {
            None => super::forward(&step.op, &[v])?,
            Some(at) => {
                k += 1;
                super::forward(&step.op, &ordered(at, v, inputs[k]))?
            }
        };
        values.push(next);
    }
    let mut side_grads: Vec<Option<Tensor>> = vec![None; inputs.len() - 1];
    let mut g = grad_out.clone();
    for (i, step) in steps.iter().enumerate().rev() {
        let (x, y) = (&values[i], &values[i + 1]);
        let grads = match step.side {
            None => super::vjp(&step.op, &[x], y, &g, &[true])?,
            Some(at) => {
                let side = inputs[k];
                let mut grads = super::vjp(&step.op, &ordered(at, x, side), y, &g, &[true; 2])?;
                if at == SideOperand::Left {
                    grads.swap(0, 1);
                }
                side_grads[k - 1] = grads.pop().flatten();
                k -= 1;
                grads
            }
        };
        g = grads.into_iter().next().flatten().ok_or_else(|| {
            crate::error::Error::Other(format!("fused_map: `{}` gave no gradient", step.op.name()))
        })?;
    }
    Ok(std::iter::once(Some(g)).chain(side_grads).collect())
}

/// A binary step's operands in its order.
fn ordered<'a>(at: SideOperand, value: &'a Tensor, side: &'a Tensor) -> [&'a Tensor; 2] {
    match at {
        SideOperand::Right => [value, side],
        SideOperand::Left => [side, value],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused kernel gives the unfused native kernels' values bit for bit: the batch-norm
    /// epilogue's four forms (one loop per row) and chains on the general path (a bias, left
    /// operands, a same-shape side, several rows per block, rows longer than a block), on
    /// values with NaNs, infinities and signed zeros.
    #[test]
    fn fused_maps_equal_their_unfused_steps_bit_for_bit() {
        use SideOperand::{Left as L, Right as R};
        let st = |op: Op, side: Option<SideOperand>| FusedStep { op, side };
        let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40];
        let draw = |shape: &[usize], seed: u64| {
            let mut state = seed;
            let n: usize = shape.iter().product();
            let data = (0..n)
                .map(|_| {
                    state = crate::spec::splitmix64(state);
                    match state % 11 {
                        0 => special[(state >> 8) as usize % special.len()],
                        _ => ((state >> 16) % 2001) as f32 / 250.0 - 4.0,
                    }
                })
                .collect();
            Tensor::from_vec(data, shape).unwrap()
        };
        let bn = |shift: bool, relu: bool| {
            let mut steps = vec![];
            if shift {
                steps.push(st(Op::Sub, Some(R)));
            }
            steps.push(st(Op::Mul, Some(R)));
            steps.push(st(Op::Add, Some(R)));
            if relu {
                steps.push(st(Op::Relu, None));
            }
            steps
        };
        let per_channel: Vec<usize> = vec![6, 1, 1];
        // (steps, value shape, side shapes)
        type Case = (Vec<FusedStep>, Vec<usize>, Vec<Vec<usize>>);
        let mut cases: Vec<Case> = vec![];
        for shift in [true, false] {
            for relu in [true, false] {
                let sides = if shift { 3 } else { 2 };
                cases.push((
                    bn(shift, relu),
                    vec![3, 6, 5, 7],
                    vec![per_channel.clone(); sides],
                ));
            }
        }
        cases.push((
            vec![
                st(Op::Add, Some(R)),
                st(Op::Tanh, None),
                st(Op::Div, Some(L)),
            ],
            vec![4, 9, 33],
            vec![vec![33], vec![9, 1]],
        ));
        cases.push((
            vec![
                st(Op::Maximum, Some(L)),
                st(Op::Relu, None),
                st(Op::Sub, Some(L)),
            ],
            vec![2, 700],
            vec![vec![2, 700], vec![1]],
        ));
        cases.push((
            vec![
                st(Op::Mul, Some(R)),
                st(Op::Minimum, Some(R)),
                st(Op::Exp, None),
            ],
            vec![3, 2, 1100],
            vec![vec![2, 1], vec![1100]],
        ));
        // same-shape and scalar sides over a large tensor: rows capped at CHUNK values, split
        // over threads
        cases.push((
            vec![
                st(Op::Add, Some(R)),
                st(Op::Relu, None),
                st(Op::Mul, Some(L)),
            ],
            vec![3, 5, 7000],
            vec![vec![3, 5, 7000], vec![]],
        ));
        for (i, (steps, shape, side_shapes)) in cases.into_iter().enumerate() {
            let x = draw(&shape, 7 + i as u64);
            let sides: Vec<Tensor> = side_shapes
                .iter()
                .enumerate()
                .map(|(k, s)| draw(s, 100 * i as u64 + k as u64))
                .collect();
            let mut inputs = vec![&x];
            inputs.extend(sides.iter());
            let fused = Tensor::from_vec(forward(&steps, &inputs, &shape), &shape).unwrap();
            let mut v = x.clone();
            let mut k = 0;
            for step in &steps {
                v = match step.side {
                    None => super::super::forward(&step.op, &[&v]).unwrap(),
                    Some(at) => {
                        let s = &sides[k];
                        k += 1;
                        let args = match at {
                            R => [&v, s],
                            L => [s, &v],
                        };
                        super::super::forward(&step.op, &args).unwrap()
                    }
                };
            }
            let bits = |t: &Tensor| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fused), bits(&v), "case {i}: {steps:?}");
        }
    }

    /// An empty output (a zero-size leading axis under a row that is not empty) computes
    /// nothing and does not divide by its zero axis.
    #[test]
    fn an_empty_output_is_left_alone() {
        let steps = [
            FusedStep {
                op: Op::Add,
                side: Some(SideOperand::Right),
            },
            FusedStep {
                op: Op::Relu,
                side: None,
            },
        ];
        let b = [1.0, 2.0];
        forward_into(&steps, &[&[], &b], &[&[0, 2], &[2]], &[0, 2], &mut []);
    }
}
