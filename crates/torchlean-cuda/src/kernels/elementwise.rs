//! native_cuda elementwise kernels: broadcasting binary maps (add, sub, mul, div, maximum,
//! minimum) and `where` with their reduced cotangents, the comparisons (`compare`, no VJP), unary maps (GELU, SiLU, softplus, pow and safe_log
//! among them) with their VJPs, the deterministic
//! `sum_all`, the counter-based random draws (bit-identical to the CPU's), and the
//! optimizer updates `ema_update` / `adam_update` (rounded step by step like the CPU's loops:
//! no contraction into fused multiply-adds).
//! The CUDA source is `kernels/elementwise.cu`; opcodes here match its `#define`s.

use super::{buffer, cx, grid, launched, output, row_major, tensor};
use cudarc::driver::{DeviceRepr, PushKernelArg};
use torchlean::graph::{Op, OpKind};
use torchlean::{Error, OpError, Result, Tensor};

/// The largest rank the broadcast kernels index (`MAX_RANK` in the `.cu` source).
pub const MAX_RANK: usize = 16;

/// Mirror of `struct Bcast` in `elementwise.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Bcast {
    rank: i32,
    shape: [i64; MAX_RANK],
    a_stride: [i64; MAX_RANK],
    b_stride: [i64; MAX_RANK],
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Bcast {}

/// Mirror of `struct Reduce` in `elementwise.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct Reduce {
    rank: i32,
    own_shape: [i64; MAX_RANK],
    out_stride: [i64; MAX_RANK],
    red_shape: [i64; MAX_RANK],
}
// SAFETY: plain `repr(C)` integers laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Reduce {}

/// The binary ops of this file, by opcode.
pub fn binary_code(kind: OpKind) -> Option<i32> {
    Some(match kind {
        OpKind::Add => 0,
        OpKind::Sub => 1,
        OpKind::Mul => 2,
        OpKind::Div => 3,
        OpKind::Maximum => 4,
        OpKind::Minimum => 5,
        _ => return None,
    })
}

/// The opcode of a binary map or a comparison of this file (a comparison's relation is its
/// payload, so this reads the op, where [`binary_code`] reads the kind of the
/// differentiable maps).
pub fn binary_opcode(op: &Op) -> Option<i32> {
    use torchlean::graph::Relation as R;
    match op {
        Op::Compare { relation } => Some(match relation {
            R::Eq => 6,
            R::Ne => 7,
            R::Lt => 8,
            R::Le => 9,
            R::Gt => 10,
            R::Ge => 11,
        }),
        _ => binary_code(op.kind()),
    }
}

/// The unary maps of this file: opcode and scalar parameter.
pub fn unary_code(op: &Op) -> Option<(i32, f32)> {
    Some(match op {
        Op::Neg => (0, 0.0),
        Op::Exp => (1, 0.0),
        Op::Sin => (2, 0.0),
        Op::Cos => (3, 0.0),
        Op::Tanh => (4, 0.0),
        Op::Sigmoid => (5, 0.0),
        Op::Relu => (6, 0.0),
        Op::Scale { factor } => (7, *factor),
        Op::AddScalar { value } => (8, *value),
        Op::Sqrt => (9, 0.0),
        Op::Log => (10, 0.0),
        Op::Inv => (11, 0.0),
        Op::Abs => (12, 0.0),
        Op::Gelu => (13, 0.0),
        Op::Silu => (14, 0.0),
        Op::Softplus => (15, 0.0),
        Op::Pow { exponent } => (16, *exponent),
        Op::SafeLog { eps } => (17, *eps),
        // 18 is fused_unary's clamp; the mode is the parameter (elementwise.cu's U_ROUND)
        Op::Round { mode } => (19, round_mode_code(*mode)),
        Op::Erf => (20, 0.0),
        Op::Tan => (21, 0.0),
        Op::Atan => (22, 0.0),
        Op::Asin => (23, 0.0),
        Op::Acos => (24, 0.0),
        Op::Sinh => (25, 0.0),
        Op::Cosh => (26, 0.0),
        Op::Asinh => (27, 0.0),
        Op::Acosh => (28, 0.0),
        Op::Atanh => (29, 0.0),
        _ => return None,
    })
}

/// The parameter of `U_ROUND` in elementwise.cu: 0 floor, 1 ceil, 2 half-even, 3 trunc.
fn round_mode_code(mode: torchlean::graph::RoundMode) -> f32 {
    use torchlean::graph::RoundMode as M;
    match mode {
        M::Floor => 0.0,
        M::Ceil => 1.0,
        M::HalfEven => 2.0,
        M::Trunc => 3.0,
    }
}

/// The kinds of [`unary_code`]'s ops (kept beside it: a kind listed here that it does not
/// map, or the reverse, fails `tests/gpu_only_conformance.rs::unary_kinds_are_unary_code_s`, which runs without
/// a GPU).
pub const UNARY_KINDS: &[OpKind] = &[
    OpKind::Neg,
    OpKind::Exp,
    OpKind::Sin,
    OpKind::Cos,
    OpKind::Tanh,
    OpKind::Sigmoid,
    OpKind::Relu,
    OpKind::Scale,
    OpKind::AddScalar,
    OpKind::Sqrt,
    OpKind::Log,
    OpKind::Inv,
    OpKind::Abs,
    OpKind::Gelu,
    OpKind::Silu,
    OpKind::Softplus,
    OpKind::Pow,
    OpKind::SafeLog,
    OpKind::Round,
    OpKind::Erf,
    OpKind::Tan,
    OpKind::Atan,
    OpKind::Asin,
    OpKind::Acos,
    OpKind::Sinh,
    OpKind::Cosh,
    OpKind::Asinh,
    OpKind::Acosh,
    OpKind::Atanh,
];

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[
    OpKind::Add,
    OpKind::Sub,
    OpKind::Mul,
    OpKind::Div,
    OpKind::Maximum,
    OpKind::Minimum,
    OpKind::Where,
    OpKind::Compare,
    OpKind::Neg,
    OpKind::Exp,
    OpKind::Sin,
    OpKind::Cos,
    OpKind::Tanh,
    OpKind::Sigmoid,
    OpKind::Relu,
    OpKind::Scale,
    OpKind::AddScalar,
    OpKind::Sqrt,
    OpKind::Log,
    OpKind::Inv,
    OpKind::Abs,
    OpKind::Gelu,
    OpKind::Silu,
    OpKind::Softplus,
    OpKind::Pow,
    OpKind::SafeLog,
    OpKind::Round,
    OpKind::Erf,
    OpKind::Tan,
    OpKind::Atan,
    OpKind::Asin,
    OpKind::Acos,
    OpKind::Sinh,
    OpKind::Cosh,
    OpKind::Asinh,
    OpKind::Acosh,
    OpKind::Atanh,
    OpKind::SumAll,
    OpKind::Clamp,
    OpKind::RandUniform,
    OpKind::BernoulliMask,
    OpKind::EmaUpdate,
    OpKind::AdamUpdate,
];

/// `shape` left-padded with ones to `rank`.
fn padded(shape: &[usize], rank: usize) -> Vec<usize> {
    let mut p = vec![1; rank - shape.len()];
    p.extend_from_slice(shape);
    p
}

pub(super) fn rank_error(op: &Op, shapes: &[&[usize]]) -> Error {
    OpError::Layout {
        op: op.name(),
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        reason: format!("native_cuda broadcasts over at most {MAX_RANK} axes"),
    }
    .into()
}

/// The same map from output positions to operand elements over as few axes as it needs:
/// `out` and the `operands` broadcasting to it (each left-padded to `out`'s rank), without
/// the output's axes of extent 1, and with each run of adjacent axes merged into one where
/// every operand either spans all of them or broadcasts over all of them. Row-major order is
/// kept (a merged axis walks its axes' positions in the same order), so a kernel indexing the
/// result reads the same elements in the same order; a rank-10 `broadcast_to` of GQA's
/// `repeat_interleave` ([1, 2, 1, 2, 1, 1, 1, 5, 1, 2]) indexes 3 axes.
pub(super) fn coalesce(out: &[usize], operands: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let r = out.len();
    let padded: Vec<Vec<usize>> = operands.iter().map(|s| padded(s, r)).collect();
    let mut shape: Vec<usize> = Vec::with_capacity(r);
    let mut dims: Vec<Vec<usize>> = vec![Vec::with_capacity(r); operands.len()];
    let mut last_spans: Vec<bool> = Vec::new();
    for d in (0..r).filter(|&d| out[d] != 1) {
        let spans: Vec<bool> = padded.iter().map(|p| p[d] != 1).collect();
        if let Some(extent) = shape.last_mut().filter(|_| spans == last_spans) {
            *extent *= out[d];
            for (dim, &span) in dims.iter_mut().zip(&spans) {
                if let Some(e) = dim.last_mut().filter(|_| span) {
                    *e *= out[d];
                }
            }
        } else {
            shape.push(out[d]);
            for (dim, &span) in dims.iter_mut().zip(&spans) {
                dim.push(if span { out[d] } else { 1 });
            }
            last_spans = spans;
        }
    }
    (shape, dims)
}

pub(super) fn bcast(op: &Op, a: &[usize], b: &[usize], out: &[usize]) -> Result<Bcast> {
    let (shape, dims) = coalesce(out, &[a, b]);
    let r = shape.len();
    if r > MAX_RANK {
        return Err(rank_error(op, &[a, b]));
    }
    let mut g = Bcast {
        rank: r as i32,
        ..Default::default()
    };
    let (pa, pb) = (&dims[0], &dims[1]);
    let (sa, sb) = (row_major(pa), row_major(pb));
    for d in 0..r {
        g.shape[d] = shape[d] as i64;
        g.a_stride[d] = if pa[d] == 1 { 0 } else { sa[d] as i64 };
        g.b_stride[d] = if pb[d] == 1 { 0 } else { sb[d] as i64 };
    }
    Ok(g)
}

/// The geometry of summing an output of shape `out` down to `own`, a shape that broadcasts
/// to it (over [`coalesce`]d axes).
pub(super) fn reduce_geometry(op: &Op, own: &[usize], out: &[usize]) -> Result<Reduce> {
    let (shape, dims) = coalesce(out, &[own]);
    let r = shape.len();
    if r > MAX_RANK {
        return Err(rank_error(op, &[out, own]));
    }
    let p = &dims[0];
    let so = row_major(&shape);
    let mut g = Reduce {
        rank: r as i32,
        ..Default::default()
    };
    for d in 0..r {
        g.own_shape[d] = p[d] as i64;
        g.out_stride[d] = so[d] as i64;
        g.red_shape[d] = if p[d] == 1 { shape[d] as i64 } else { 1 };
    }
    Ok(g)
}

fn out_shape(op: &Op, inputs: &[&Tensor]) -> Result<Vec<usize>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    Ok(torchlean::spec::infer_shape(op, &shapes)?)
}

/// The forward kernel of every op in [`KINDS`].
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shape = out_shape(op, inputs)?;
    // a small map waits in the launch queue, to run with others in one launch
    if let Some(queued) = crate::queue::forward(op, inputs, &shape)? {
        return Ok(queued);
    }
    let n = torchlean::spec::numel(&shape);
    let in_use = cx()?;
    let cx = &*in_use;
    let mut out = output(cx, op, n)?;
    let n64 = n as i64;
    if n == 0 {
        return tensor(out, &shape);
    }
    if let Some(code) = binary_opcode(op) {
        let (a, b) = (buffer(op, inputs[0])?, buffer(op, inputs[1])?);
        let same = inputs[0].shape() == shape.as_slice() && inputs[1].shape() == shape.as_slice();
        if same {
            let mut l = cx.stream.launch_builder(&cx.functions.binary_same);
            l.arg(&code)
                .arg(a.slice())
                .arg(b.slice())
                .arg(out.slice_mut())
                .arg(&n64);
            // SAFETY: the kernel reads n elements of a and b and writes n of out, each
            // buffer holding at least n (checked by `buffer` and the allocation).
            launched(op, unsafe { l.launch(grid(n.div_ceil(4))) })?;
        } else {
            let g = bcast(op, inputs[0].shape(), inputs[1].shape(), &shape)?;
            let mut l = cx.stream.launch_builder(&cx.functions.binary_bcast);
            l.arg(&code)
                .arg(a.slice())
                .arg(b.slice())
                .arg(out.slice_mut())
                .arg(&n64)
                .arg(&g);
            // SAFETY: `g` maps each of the n output positions to an element inside a and b
            // (strides of their own shapes, 0 on broadcast axes).
            launched(op, unsafe { l.launch(grid(n)) })?;
        }
    } else if let Op::Where = op {
        let (c, a, b) = (
            buffer(op, inputs[0])?,
            buffer(op, inputs[1])?,
            buffer(op, inputs[2])?,
        );
        let gca = bcast(op, inputs[0].shape(), inputs[1].shape(), &shape)?;
        let gb = bcast(op, inputs[2].shape(), inputs[2].shape(), &shape)?;
        let mut l = cx.stream.launch_builder(&cx.functions.where_forward);
        l.arg(c.slice())
            .arg(a.slice())
            .arg(b.slice())
            .arg(out.slice_mut())
            .arg(&n64)
            .arg(&gca)
            .arg(&gb);
        // SAFETY: `gca` and `gb` map each of the n output positions to an element inside c,
        // a and b (strides of their own shapes, 0 on broadcast axes); n elements written.
        launched(op, unsafe { l.launch(grid(n)) })?;
    } else if let Some((code, p)) = unary_code(op) {
        let x = buffer(op, inputs[0])?;
        let mut l = cx.stream.launch_builder(&cx.functions.unary_forward);
        l.arg(&code)
            .arg(&p)
            .arg(x.slice())
            .arg(out.slice_mut())
            .arg(&n64);
        // SAFETY: n elements read from x (of n) and written to out (of n), four at a time
        // through 16-byte accesses of the 256-byte aligned buffers, the tail one by one.
        launched(op, unsafe { l.launch(grid(n.div_ceil(4))) })?;
    } else if let Op::RandUniform { seed, .. } | Op::BernoulliMask { seed, .. } = op {
        let (bernoulli, keep) = match op {
            Op::BernoulliMask { keep, .. } => (1i32, f64::from(*keep)),
            _ => (0i32, 0.0f64),
        };
        // the kernel draws element i from splitmix64(key + i), key the seed's stream key
        let key = torchlean::spec::stream_key(*seed);
        let mut l = cx.stream.launch_builder(&cx.functions.random_fill);
        l.arg(&key)
            .arg(&bernoulli)
            .arg(&keep)
            .arg(out.slice_mut())
            .arg(&n64);
        // SAFETY: writes n elements of out (of n).
        launched(op, unsafe { l.launch(grid(n)) })?;
    } else if let Op::EmaUpdate {
        decay,
        weight,
        square,
    } = op
    {
        let (s, x) = (buffer(op, inputs[0])?, buffer(op, inputs[1])?);
        let sq = *square as i32;
        let mut l = cx.stream.launch_builder(&cx.functions.ema_update);
        l.arg(decay)
            .arg(weight)
            .arg(&sq)
            .arg(s.slice())
            .arg(x.slice())
            .arg(out.slice_mut())
            .arg(&n64);
        // SAFETY: n elements read from s and x (equal shapes: the shape guard) and written.
        launched(op, unsafe { l.launch(grid(n)) })?;
    } else if let Op::AdamUpdate {
        step_size,
        c2_sqrt,
        eps,
        shrink,
    } = op
    {
        let (w, m, v) = (
            buffer(op, inputs[0])?,
            buffer(op, inputs[1])?,
            buffer(op, inputs[2])?,
        );
        let mut l = cx.stream.launch_builder(&cx.functions.adam_update);
        l.arg(step_size)
            .arg(c2_sqrt)
            .arg(eps)
            .arg(shrink)
            .arg(w.slice())
            .arg(m.slice())
            .arg(v.slice())
            .arg(out.slice_mut())
            .arg(&n64);
        // SAFETY: n elements read from w, m, v (equal shapes: the shape guard) and written.
        launched(op, unsafe { l.launch(grid(n)) })?;
    } else if let Op::Clamp { min, max } = op {
        let x = buffer(op, inputs[0])?;
        let mut l = cx.stream.launch_builder(&cx.functions.clamp_forward);
        l.arg(x.slice())
            .arg(out.slice_mut())
            .arg(&n64)
            .arg(min)
            .arg(max);
        // SAFETY: n elements read from x (of n) and written to out (of n).
        launched(op, unsafe { l.launch(grid(n)) })?;
    } else if op.kind() == OpKind::SumAll {
        let x = buffer(op, inputs[0])?;
        let terms = super::SumTerms::Values(x);
        super::deterministic_sum(cx, op, terms, inputs[0].numel(), 1.0, &mut out)?;
    } else {
        return Err(Error::Other(format!(
            "native_cuda has no elementwise kernel for op `{}`",
            op.name()
        )));
    }
    tensor(out, &shape)
}

/// The VJP kernel of every differentiable op in [`KINDS`].
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    output_t: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let shape = out_shape(op, inputs)?;
    let in_use = cx()?;
    let cx = &*in_use;
    let g = buffer(op, gy)?;
    if let Some(code) = binary_code(op.kind()) {
        let (a, b) = (buffer(op, inputs[0])?, buffer(op, inputs[1])?);
        let geo = bcast(op, inputs[0].shape(), inputs[1].shape(), &shape)?;
        let same = inputs[0].shape() == shape.as_slice() && inputs[1].shape() == shape.as_slice();
        let mut grads = Vec::with_capacity(2);
        for which in 0..2usize {
            if !needs[which] {
                grads.push(None);
                continue;
            }
            let own = inputs[which].shape();
            if same && matches!((op.kind(), which), (OpKind::Add, _) | (OpKind::Sub, 0)) {
                // the partial is exactly 1: the gradient is the cotangent itself (gy · 1 = gy
                // for every float), shared rather than copied
                grads.push(Some(super::view_of(op, gy, own)?));
                continue;
            }
            let n_own = inputs[which].numel();
            let mut out = output(cx, op, n_own)?;
            if n_own > 0 && same {
                // no broadcasting: one term per element, no index walk
                let (which32, n64) = (which as i32, n_own as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.binary_grad_same);
                l.arg(&code)
                    .arg(&which32)
                    .arg(a.slice())
                    .arg(b.slice())
                    .arg(g.slice())
                    .arg(out.slice_mut())
                    .arg(&n64);
                // SAFETY: a, b, gy and out all hold n_own elements (the output's shape);
                // thread i reads element i of each and writes out[i].
                launched(op, unsafe { l.launch(grid(n_own)) })?;
            } else if n_own > 0 {
                let red = reduce_geometry(op, own, &shape)?;
                let (which32, n64) = (which as i32, n_own as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.binary_grad);
                l.arg(&code)
                    .arg(&which32)
                    .arg(a.slice())
                    .arg(b.slice())
                    .arg(g.slice())
                    .arg(out.slice_mut())
                    .arg(&n64)
                    .arg(&geo)
                    .arg(&red);
                // SAFETY: thread j writes out[j] (j < n_own) and reads output positions of
                // the output's shape, mapped into a and b by `geo` as in the forward.
                launched(op, unsafe { l.launch(grid(n_own)) })?;
            }
            grads.push(Some(tensor(out, own)?));
        }
        return Ok(grads);
    }
    if let Op::Where = op {
        let c = buffer(op, inputs[0])?;
        let gc = bcast(op, inputs[0].shape(), inputs[0].shape(), &shape)?;
        // the condition gets no gradient (the spec's)
        let mut grads = vec![None];
        for which in 0..2usize {
            let input = which + 1;
            if !needs.get(input).copied().unwrap_or(false) {
                grads.push(None);
                continue;
            }
            let own = inputs[input].shape();
            let n_own = inputs[input].numel();
            let mut out = output(cx, op, n_own)?;
            if n_own > 0 {
                let red = reduce_geometry(op, own, &shape)?;
                let (which32, n64) = (which as i32, n_own as i64);
                let mut l = cx.stream.launch_builder(&cx.functions.where_grad);
                l.arg(&which32)
                    .arg(c.slice())
                    .arg(g.slice())
                    .arg(out.slice_mut())
                    .arg(&n64)
                    .arg(&gc)
                    .arg(&red);
                // SAFETY: thread j writes out[j] (j < n_own) and reads output positions of
                // the output's shape, mapped into c by `gc` as in the forward.
                launched(op, unsafe { l.launch(grid(n_own)) })?;
            }
            grads.push(Some(tensor(out, own)?));
        }
        return Ok(grads);
    }
    let x = buffer(op, inputs[0])?;
    let n = inputs[0].numel();
    let n64 = n as i64;
    let mut out = output(cx, op, n)?;
    if let Some((code, p)) = unary_code(op) {
        let y = buffer(op, output_t)?;
        if n > 0 {
            let mut l = cx.stream.launch_builder(&cx.functions.unary_vjp);
            l.arg(&code)
                .arg(&p)
                .arg(x.slice())
                .arg(y.slice())
                .arg(g.slice())
                .arg(out.slice_mut())
                .arg(&n64);
            // SAFETY: n elements read from x, y, gy (each of n) and written to out, four at
            // a time through 16-byte accesses of the 256-byte aligned buffers.
            launched(op, unsafe { l.launch(grid(n.div_ceil(4))) })?;
        }
    } else if let Op::Clamp { min, max } = op {
        if n > 0 {
            let mut l = cx.stream.launch_builder(&cx.functions.clamp_vjp);
            l.arg(x.slice())
                .arg(g.slice())
                .arg(out.slice_mut())
                .arg(&n64)
                .arg(min)
                .arg(max);
            // SAFETY: n elements read from x and gy (each of n) and written to out.
            launched(op, unsafe { l.launch(grid(n)) })?;
        }
    } else if op.kind() == OpKind::SumAll {
        if n > 0 {
            let mut l = cx.stream.launch_builder(&cx.functions.fill_from);
            l.arg(g.slice()).arg(out.slice_mut()).arg(&n64);
            // SAFETY: reads gy[0] (gy has one element) and writes n elements of out.
            launched(op, unsafe { l.launch(grid(n)) })?;
        }
    } else {
        return Err(Error::Other(format!(
            "native_cuda has no elementwise VJP for op `{}`",
            op.name()
        )));
    }
    Ok(vec![Some(tensor(out, inputs[0].shape())?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operand offsets a `Bcast` gives output position `pos` (`bcast_index` in the source).
    fn offsets(g: &Bcast, pos: i64) -> (i64, i64) {
        let (mut rem, mut ia, mut ib) = (pos, 0, 0);
        for d in (0..g.rank as usize).rev() {
            let c = rem % g.shape[d];
            rem /= g.shape[d];
            ia += c * g.a_stride[d];
            ib += c * g.b_stride[d];
        }
        (ia, ib)
    }

    /// The output positions a `Reduce` sums into operand element j, in order (`reduce_base`
    /// and `reduce_pos` in the source).
    fn summed(r: &Reduce, j: i64) -> Vec<i64> {
        let rank = r.rank as usize;
        let (mut rem, mut base) = (j, 0);
        for d in (0..rank).rev() {
            base += rem % r.own_shape[d] * r.out_stride[d];
            rem /= r.own_shape[d];
        }
        let count: i64 = r.red_shape[..rank].iter().product();
        (0..count)
            .map(|t| {
                let (mut trem, mut pos) = (t, base);
                for d in (0..rank).rev() {
                    pos += trem % r.red_shape[d] * r.out_stride[d];
                    trem /= r.red_shape[d];
                }
                pos
            })
            .collect()
    }

    /// Coalescing keeps the map: every output position reads the elements it read over the
    /// uncoalesced axes, and each operand element sums the same positions in the same order
    /// (so results are bit for bit those of the uncoalesced walk), for shapes of every rank
    /// up to 14 with axes of extent 1 (or 0) and broadcasts anywhere.
    #[test]
    fn coalesced_axes_index_the_same_elements_in_the_same_order() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let op = Op::Add;
        for _ in 0..400 {
            let rank = 1 + next(14) as usize;
            // an axis of extent 0 now and then (an empty output: nothing read or summed)
            let out: Vec<usize> = (0..rank)
                .map(|_| [1, 1, 2, 3, 1, 1, 2, 3, 1, 0][next(10) as usize])
                .collect();
            let operand = |next: &mut dyn FnMut(u64) -> u64| -> Vec<usize> {
                let drop = next(rank as u64 + 1) as usize;
                out[drop..]
                    .iter()
                    .map(|&e| if next(2) == 0 { 1 } else { e })
                    .collect()
            };
            let (a, b) = (operand(&mut next), operand(&mut next));
            // the uncoalesced geometry, built as before coalescing
            let (pa, pb) = (padded(&a, rank), padded(&b, rank));
            let (sa, sb) = (row_major(&pa), row_major(&pb));
            let mut plain = Bcast {
                rank: rank as i32,
                ..Default::default()
            };
            for d in 0..rank {
                plain.shape[d] = out[d] as i64;
                plain.a_stride[d] = if pa[d] == 1 { 0 } else { sa[d] as i64 };
                plain.b_stride[d] = if pb[d] == 1 { 0 } else { sb[d] as i64 };
            }
            let g = bcast(&op, &a, &b, &out).unwrap();
            assert!(g.rank as usize <= rank);
            let n: usize = out.iter().product();
            for pos in 0..n as i64 {
                assert_eq!(
                    offsets(&g, pos),
                    offsets(&plain, pos),
                    "{out:?} {a:?} {b:?}"
                );
            }
            let so = row_major(&out);
            let mut plain_red = Reduce {
                rank: rank as i32,
                ..Default::default()
            };
            for d in 0..rank {
                plain_red.own_shape[d] = pa[d] as i64;
                plain_red.out_stride[d] = so[d] as i64;
                plain_red.red_shape[d] = if pa[d] == 1 { out[d] as i64 } else { 1 };
            }
            let red = reduce_geometry(&op, &a, &out).unwrap();
            for j in 0..a.iter().product::<usize>() as i64 {
                assert_eq!(summed(&red, j), summed(&plain_red, j), "{out:?} {a:?}");
            }
        }
    }

    /// GQA's `repeat_interleave` export broadcasts over ten axes: three after coalescing.
    #[test]
    fn a_rank_ten_broadcast_indexes_three_axes() {
        let out = [1, 2, 1, 2, 1, 1, 1, 5, 1, 2];
        let from = [1, 2, 1, 1, 1, 1, 1, 5, 1, 2];
        let g = bcast(&Op::Add, &from, &from, &out).unwrap();
        assert_eq!(g.rank, 3, "[2 | 2 (broadcast) | 5·2]");
    }
}
