//! Native `fused_map`: a chain of elementwise steps over one value in one pass (a CNN's
//! batch norm — shift, scale and bias per channel — with the ReLU after it: one pass over the
//! activation instead of four).
//!
//! The output is cut into rows over which every side input is either one value (a
//! per-channel shift over a channel's plane) or a contiguous run (a bias over the last
//! axis); each row is computed in blocks of [`BLOCK`] values that stay in L1 while every step
//! runs over them. A unary step is the native unary map (`elementwise::unary_in_place`) and a
//! binary step the native binary map's scalar function, so each element goes through the
//! same f32 operations, in the same order, as the unfused kernels: the same bits.
//!
//! Owns: the fused pass and its row split. Must not decide what is fused (graph/fuse.rs does).

use super::elementwise::unary_forward_into;
use super::par::{CHUNK, PAR_THRESHOLD};
use crate::graph::{FusedStep, Op, SideOperand};
use crate::scalar::{maximum, minimum};
use crate::tensor::{Layout, Tensor};
use rayon::prelude::*;

/// Values per block of a row.
const BLOCK: usize = 256;

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
        // the longest run of trailing axes over which every side is one value or contiguous
        'axes: for d in (0..out_shape.len()).rev() {
            if out_shape[d] != 1 {
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
    let rows = Rows::new(out_shape, &shapes[1..]);
    let value = x[0];
    let width = rows.width;
    if width == 0 {
        return;
    }
    // whole rows per task, about CHUNK values each
    let per_task = (CHUNK / width).max(1) * width;
    let task = |first_row: usize, o: &mut [f32]| {
        let mut at = rows.cursor(first_row);
        let mut scratch = [[0.0f32; BLOCK]; 2];
        for (r, row) in o.chunks_mut(width).enumerate() {
            if r > 0 {
                at.advance();
            }
            let start = (first_row + r) * width;
            for (b, block) in row.chunks_mut(BLOCK).enumerate() {
                let (off, n) = (b * BLOCK, block.len());
                // step i reads the value (i = 0) or scratch block (i + 1) % 2, which step
                // i - 1 wrote, and writes scratch block i % 2, or the output (the last step)
                let mut k = 0;
                for (i, step) in steps.iter().enumerate() {
                    let (first, second) = scratch.split_at_mut(1);
                    let (read, write) = if i % 2 == 0 {
                        (&second[0], &mut first[0])
                    } else {
                        (&first[0], &mut second[0])
                    };
                    let input: &[f32] = if i == 0 {
                        &value[start + off..start + off + n]
                    } else {
                        &read[..n]
                    };
                    let dst: &mut [f32] = if i + 1 == steps.len() {
                        &mut *block
                    } else {
                        &mut write[..n]
                    };
                    match step.side {
                        None => unary_forward_into(&step.op, input, dst),
                        Some(side_at) => {
                            let base = at.bases[k];
                            let side = match rows.along[k] {
                                Along::Constant => Operand::Value(x[1 + k][base]),
                                Along::Contiguous => {
                                    Operand::Run(&x[1 + k][base + off..base + off + n])
                                }
                            };
                            binary_step(&step.op, input, dst, side, side_at);
                            k += 1;
                        }
                    }
                }
            }
        }
    };
    if out.len() < PAR_THRESHOLD {
        task(0, out);
    } else {
        out.par_chunks_mut(per_task)
            .enumerate()
            .for_each(|(t, o)| task(t * (per_task / width), o));
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
