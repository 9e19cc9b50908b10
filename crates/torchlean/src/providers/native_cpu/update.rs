//! Kernels that update a buffer: the optimizer maps (`ema_update`, `adam_update`) and the
//! in-place kernel of every native capsule ([`forward_in_place`]).
//!
//! An update op's value has the shape of its first input (the state it updates: a moment, a
//! parameter, a gradient sum). The in-place kernel writes that value over the first input's
//! buffer when the caller's handle owns it alone (`Tensor::update_data`), which is how an
//! optimizer step or a gradient sum runs as gated ops without a new buffer per call. The
//! maps here are the same closures out of place and in place, so both give the same bits
//! (the conformance harness checks it on owned and shared inputs).

use super::elementwise;
use super::par::{for_chunks, CHUNK, PAR_THRESHOLD};
use crate::error::{OpError, Result};
use crate::graph::{Op, OpKind};
use crate::scalar::{maximum, minimum};
use crate::spec::{adam_step_constants, adam_step_value};
use crate::tensor::Tensor;
use rayon::prelude::*;

/// `w[i] = f(w[i], [x_k[i] for k])` over equal-length buffers, in parallel chunks when large.
fn zip_in_place<const K: usize>(
    w: &mut [f32],
    xs: [&[f32]; K],
    f: impl Fn(f32, [f32; K]) -> f32 + Sync + Send,
) {
    for_chunks(w, |off, c| {
        let n = c.len();
        // re-slice to the chunk's length so the bounds checks hoist and the loop vectorizes
        let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][off..off + n]);
        // block-wise write-back: no masked stores for maps such as a maximum
        super::par::overwrite_each(c, |j, v| f(v, std::array::from_fn(|k| src[k][j])));
    });
}

/// `out[i] = f(s[i], [x_k[i] for k])`: [`zip_in_place`] over a copy-free out-of-place pass.
fn zip_into<const K: usize>(
    out: &mut [f32],
    s: &[f32],
    xs: [&[f32]; K],
    f: impl Fn(f32, [f32; K]) -> f32 + Sync + Send,
) {
    for_chunks(out, |off, c| {
        let n = c.len();
        let s = &s[off..off + n];
        let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][off..off + n]);
        for j in 0..n {
            c[j] = f(s[j], std::array::from_fn(|k| src[k][j]));
        }
    });
}

/// Where the value of an update goes: over the state's own buffer, or into another one.
enum Dest<'a> {
    InPlace(&'a mut [f32]),
    Into(&'a [f32], &'a mut [f32]),
}

/// Runs the map of `op` (an optimizer map or a same-shape binary map) with first operand
/// the state and `xs` the others, all of one length. `false` when `op` has no such map.
fn update_map(op: &Op, dest: Dest, xs: &[&[f32]]) -> bool {
    macro_rules! run {
        ($k:literal, $f:expr) => {{
            let xs: [&[f32]; $k] = match <[&[f32]; $k]>::try_from(xs) {
                Ok(xs) => xs,
                Err(_) => return false,
            };
            match dest {
                Dest::InPlace(w) => zip_in_place(w, xs, $f),
                Dest::Into(s, out) => zip_into(out, s, xs, $f),
            }
            true
        }};
    }
    match *op {
        // the same arithmetic, in the same order, as the optimizers' formulas (spec/optim.rs)
        Op::EmaUpdate {
            decay,
            weight,
            square: false,
        } => run!(1, move |s, [x]| decay * s + weight * x),
        Op::EmaUpdate {
            decay,
            weight,
            square: true,
        } => run!(1, move |s, [x]| decay * s + weight * x * x),
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => run!(2, move |w, [m, v]| w * shrink
            - step_size * m / (v.sqrt() / c2_sqrt + eps)),
        Op::Add => run!(1, |a, [b]| a + b),
        Op::Sub => run!(1, |a, [b]| a - b),
        Op::Mul => run!(1, |a, [b]| a * b),
        Op::Div => run!(1, |a, [b]| a / b),
        Op::Maximum => run!(1, |a, [b]| maximum(a, b)),
        Op::Minimum => run!(1, |a, [b]| minimum(a, b)),
        _ => false,
    }
}

/// The forward kernel of `ema_update` and `adam_update` (inputs of one shape, checked by the
/// shape guard): one parallel pass.
pub fn optim_forward(op: &Op, inputs: &[&Tensor]) -> Vec<f32> {
    let data: Vec<_> = inputs.iter().map(|t| t.host_data()).collect();
    let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
    let mut out = super::par::overwritten(slices[0].len());
    let ran = update_map(op, Dest::Into(slices[0], &mut out), &slices[1..]);
    debug_assert!(ran, "optim_forward called for {}", op.name());
    out
}

/// [`optim_forward`] into `out` over dense slices (the destination-passing kernel): `xs[0]`
/// the state, the others of its length (the shape guard checked the shapes).
pub fn optim_forward_into(op: &Op, xs: &[&[f32]], out: &mut [f32]) -> Result<()> {
    let Some((state, rest)) = xs.split_first() else {
        return Err(OpError::Arity {
            op: op.name(),
            expected: "the state and the map's other operands".into(),
            got: 0,
        }
        .into());
    };
    if update_map(op, Dest::Into(state, out), rest) {
        Ok(())
    } else {
        Err(crate::error::Error::Other(format!(
            "{}: no optimizer map for {} operands",
            op.name(),
            xs.len()
        )))
    }
}

/// `(w, m, v) := adam_step(w, m, v, g)` element by element over one parameter's buffers (the
/// spec's formula at f32: the unfused ops' rounding, spec/optim.rs), in parallel chunks when
/// large. The caller checked the four lengths equal (the shape rule).
fn adam_step_over(c: ([f32; 5], [f32; 4]), w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
    let run = |w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]| {
        let n = w.len();
        // re-sliced to one length so the bounds checks hoist
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        for k in 0..n {
            let [w1, m1, v1] = adam_step_value(c, w[k], m[k], v[k], g[k]);
            w[k] = w1;
            m[k] = m1;
            v[k] = v1;
        }
    };
    if w.len() < PAR_THRESHOLD {
        run(w, m, v, g);
        return;
    }
    w.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((w, m), v), g)| run(w, m, v, g));
}

/// `adam_step`'s payload, or a typed error for another op.
fn adam_step_payload(op: &Op) -> Result<([f32; 5], [f32; 4])> {
    adam_step_constants::<f32>(op).ok_or_else(|| {
        OpError::Payload {
            op: op.name(),
            reason: "this kernel computes adam_step only".into(),
        }
        .into()
    })
}

/// The forward kernel's value of `adam_step` (shapes already checked by the caller's shape
/// rule): each parameter's `w'`, `m'`, `v'` side by side ([`adam_step_forward_into`]).
pub fn adam_step_forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<f32>> {
    let total = inputs.chunks(4).map(|g| 3 * g[0].numel()).sum();
    let data: Vec<_> = inputs.iter().map(|t| t.host_data()).collect();
    let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
    let mut out = super::par::overwritten(total);
    adam_step_forward_into(op, &slices, &mut out)?;
    Ok(out)
}

/// [`adam_step_forward`] into `out` over dense slices (the destination-passing kernel, which
/// the runtime runs by tiles under a replay checker): for each parameter `(w, m, v, g)` of
/// `xs`, its `w'`, `m'`, `v'` side by side in `out` (the in-place kernel's formula, so the
/// kernels give the same bits). Lengths are checked before anything is written.
pub fn adam_step_forward_into(op: &Op, xs: &[&[f32]], out: &mut [f32]) -> Result<()> {
    let c = adam_step_payload(op)?;
    let total: usize = xs.chunks(4).map(|g| 3 * g[0].len()).sum();
    let whole = xs.len() % 4 == 0
        && xs
            .chunks(4)
            .all(|g| g.iter().all(|s| s.len() == g[0].len()));
    if !whole || out.len() != total {
        return Err(OpError::Arity {
            op: op.name(),
            expected: format!(
                "(w, m, v, g) of one length for each parameter, and {total} output elements (got {})",
                out.len()
            ),
            got: xs.len(),
        }
        .into());
    }
    let mut free = &mut out[..];
    for group in xs.chunks(4) {
        let n = group[0].len();
        let (seg, tail) = free.split_at_mut(3 * n);
        free = tail;
        let (ws, mv) = seg.split_at_mut(n);
        let (ms, vs) = mv.split_at_mut(n);
        adam_step_into(c, [group[0], group[1], group[2], group[3]], [ws, ms, vs]);
    }
    Ok(())
}

/// `(w', m', v') = adam_step(w, m, v, g)` element by element into separate buffers (the
/// formula of [`adam_step_over`], so the same bits), in parallel chunks when large. The
/// caller checked the seven lengths equal.
fn adam_step_into(c: ([f32; 5], [f32; 4]), x: [&[f32]; 4], out: [&mut [f32]; 3]) {
    let run = |[w, m, v, g]: [&[f32]; 4], [wo, mo, vo]: [&mut [f32]; 3]| {
        let n = wo.len();
        // re-sliced to one length so the bounds checks hoist
        let (w, m, v, g, mo, vo) = (
            &w[..n],
            &m[..n],
            &v[..n],
            &g[..n],
            &mut mo[..n],
            &mut vo[..n],
        );
        for k in 0..n {
            let [w1, m1, v1] = adam_step_value(c, w[k], m[k], v[k], g[k]);
            wo[k] = w1;
            mo[k] = m1;
            vo[k] = v1;
        }
    };
    let [wo, mo, vo] = out;
    if wo.len() < PAR_THRESHOLD {
        run(x, [wo, mo, vo]);
        return;
    }
    let [w, m, v, g] = x;
    wo.par_chunks_mut(CHUNK)
        .zip(mo.par_chunks_mut(CHUNK))
        .zip(vo.par_chunks_mut(CHUNK))
        .zip(w.par_chunks(CHUNK).zip(m.par_chunks(CHUNK)))
        .zip(v.par_chunks(CHUNK).zip(g.par_chunks(CHUNK)))
        .for_each(|((((wo, mo), vo), (w, m)), (v, g))| run([w, m, v, g], [wo, mo, vo]));
}

/// The update-many kernel of `native_cpu.adam_step` (`runtime::kernel::UpdateManyKernel`):
/// every parameter's `(w, m, v)` updated in one pass over its buffers, each written in place
/// when its handle owns it alone (`Tensor::update_data`, else into a copy). The whole call's
/// shapes are checked before anything is written.
pub fn adam_step_in_place(op: &Op, targets: &mut [&mut Tensor], rest: &[&Tensor]) -> Result<()> {
    let c = adam_step_payload(op)?;
    {
        let inputs = crate::runtime::kernel::update_many_operands(op, targets, rest)?;
        super::guard::output_shape(op, &inputs)?;
    }
    for (group, g) in targets.chunks_mut(3).zip(rest) {
        let [w, m, v] = group else {
            unreachable!("update_many_operands checked whole groups of three")
        };
        let g = g.host_data();
        w.update_data(|wd| {
            m.update_data(|md| v.update_data(|vd| adam_step_over(c, wd, md, vd, &g)))
        });
    }
    Ok(())
}

/// The in-place kernel of the native capsules (`runtime::kernel::InPlaceKernel`): computes
/// `op(target, rest…)` into `target`. Unary maps, the optimizer maps and binary maps whose
/// other operand has `target`'s shape run over `target`'s buffer (overwritten when the
/// handle owns it alone, a copy otherwise: `Tensor::update_data`); any other op computes its
/// value with the forward kernel and `target` takes it. Same values as [`super::forward`]
/// (the conformance harness checks every op, on owned and on shared inputs).
pub fn forward_in_place(op: &Op, target: &mut Tensor, rest: &[&Tensor]) -> Result<()> {
    let out_shape = {
        let inputs = crate::runtime::kernel::update_operands(target, rest);
        let out_shape = super::guard::output_shape(op, &inputs)?;
        if out_shape != target.shape() {
            let shapes = inputs.iter().map(|t| t.shape().to_vec()).collect();
            return Err(OpError::Shape {
                op: op.name(),
                shapes,
                expected: format!(
                    "a value of the first input's shape, written over it (the value has shape {out_shape:?})"
                ),
            }
            .into());
        }
        out_shape
    };
    let kind = op.kind();
    if rest.is_empty() && (kind.is_unary_map() || kind == OpKind::FusedUnary) {
        target.update_data(|w| elementwise::unary_in_place(op, w));
        return Ok(());
    }
    let same = rest.iter().all(|t| t.shape() == out_shape.as_slice());
    if same && (kind.is_binary_map() || kind.is_optimizer_map()) {
        let data: Vec<_> = rest.iter().map(|t| t.host_data()).collect();
        let slices: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
        let mut ran = false;
        target.update_data(|w| ran = update_map(op, Dest::InPlace(w), &slices));
        if ran {
            return Ok(());
        }
    }
    // every other op: its forward value, which the target takes
    let value = {
        let inputs = crate::runtime::kernel::update_operands(target, rest);
        super::forward(op, &inputs)?
    };
    target.assign(value)
}
