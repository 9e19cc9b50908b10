//! The recompute check of unary maps, over dense slices.
//!
//! Each output (or gradient) element is recomputed with the spec's own scalar formula
//! (`spec::unary`, `spec::unary_derivative`) at f64, and compared through a [`Tally`]. The
//! only thing this module adds is dispatch: [`each_unary!`] rebuilds the op as a value of its
//! variant inside one match arm per variant, so the (inlined) spec formula is specialized to
//! that variant and the loop runs without a per-element match. The values are the spec's
//! exactly, so the verdict is the whole-call check's (tests/trust.rs holds both to the same
//! mutations). ReLU, exact in f32, is first compared with its exact value (see
//! [`relu_exact_forward`]).

use super::pieces::Tally;
use crate::graph::Op;
use crate::spec::{unary, unary_grad};

/// Elements recomputed per stack buffer.
pub(super) const CHUNK: usize = 256;

/// Elements per parallel part (calls of at least two parts run on the rayon pool).
const PART: usize = 1 << 15;

/// The merged tallies of `part(lo, hi)` over parts of `n` elements, in parallel when large.
pub(super) fn over_parts(n: usize, part: impl Fn(usize, usize) -> Tally + Sync) -> Tally {
    use rayon::prelude::*;
    let mut t = Tally::default();
    if n < 2 * PART {
        return part(0, n);
    }
    let tallies: Vec<Tally> = (0..n.div_ceil(PART))
        .into_par_iter()
        .map(|c| part(c * PART, ((c + 1) * PART).min(n)))
        .collect();
    for p in &tallies {
        t.merge(p);
    }
    t
}

/// Runs `$body` with `$o` bound to a copy of `$op` built from its own variant (a constant
/// discriminant), or evaluates `$other` for an op that is not a unary map.
macro_rules! each_unary {
    ($op:expr, $o:ident => $body:expr, $other:expr) => {
        match $op {
            Op::Neg => {
                let $o = &Op::Neg;
                $body
            }
            Op::Abs => {
                let $o = &Op::Abs;
                $body
            }
            Op::Sqrt => {
                let $o = &Op::Sqrt;
                $body
            }
            Op::Exp => {
                let $o = &Op::Exp;
                $body
            }
            Op::Log => {
                let $o = &Op::Log;
                $body
            }
            Op::Sin => {
                let $o = &Op::Sin;
                $body
            }
            Op::Cos => {
                let $o = &Op::Cos;
                $body
            }
            Op::Tanh => {
                let $o = &Op::Tanh;
                $body
            }
            Op::Sigmoid => {
                let $o = &Op::Sigmoid;
                $body
            }
            Op::Relu => {
                let $o = &Op::Relu;
                $body
            }
            Op::Gelu => {
                let $o = &Op::Gelu;
                $body
            }
            Op::Silu => {
                let $o = &Op::Silu;
                $body
            }
            Op::Softplus => {
                let $o = &Op::Softplus;
                $body
            }
            Op::Erf => {
                let $o = &Op::Erf;
                $body
            }
            Op::Tan => {
                let $o = &Op::Tan;
                $body
            }
            Op::Atan => {
                let $o = &Op::Atan;
                $body
            }
            Op::Asin => {
                let $o = &Op::Asin;
                $body
            }
            Op::Acos => {
                let $o = &Op::Acos;
                $body
            }
            Op::Sinh => {
                let $o = &Op::Sinh;
                $body
            }
            Op::Cosh => {
                let $o = &Op::Cosh;
                $body
            }
            Op::Asinh => {
                let $o = &Op::Asinh;
                $body
            }
            Op::Acosh => {
                let $o = &Op::Acosh;
                $body
            }
            Op::Atanh => {
                let $o = &Op::Atanh;
                $body
            }
            Op::Inv => {
                let $o = &Op::Inv;
                $body
            }
            Op::SafeLog { eps } => {
                let $o = &Op::SafeLog { eps: *eps };
                $body
            }
            Op::Scale { factor } => {
                let $o = &Op::Scale { factor: *factor };
                $body
            }
            Op::AddScalar { value } => {
                let $o = &Op::AddScalar { value: *value };
                $body
            }
            Op::Clamp { min, max } => {
                let $o = &Op::Clamp {
                    min: *min,
                    max: *max,
                };
                $body
            }
            Op::Pow { exponent } => {
                let $o = &Op::Pow {
                    exponent: *exponent,
                };
                $body
            }
            Op::Round { mode } => {
                let $o = &Op::Round { mode: *mode };
                $body
            }
            _ => $other,
        }
    };
}

/// Whether `y[i] == f(xs[·][i])` for every i (f32 `==`: a NaN is never equal), in parallel
/// parts when large. Each block of eight elements keeps eight u32 lanes of "unequal" flags,
/// which vectorizes eight wide with `f` (a boolean fold packed the comparisons four wide,
/// halving the rate of the optimizer maps' divisions).
/// The inputs hold at least `y`'s length.
pub(super) fn exactly<const K: usize>(
    xs: [&[f32]; K],
    y: &[f32],
    f: impl Fn([f32; K]) -> f32 + Sync,
) -> bool {
    use rayon::prelude::*;
    const L: usize = 8;
    let part = |lo: usize, hi: usize| {
        let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][lo..hi]);
        let y = &y[lo..hi];
        let whole = y.len() / L * L;
        let mut diff = [0u32; L];
        for (b, yc) in y[..whole].chunks_exact(L).enumerate() {
            let at = b * L;
            let blk: [&[f32]; K] = std::array::from_fn(|k| &src[k][at..at + L]);
            for l in 0..L {
                diff[l] |= (f(std::array::from_fn(|k| blk[k][l])) != yc[l]) as u32;
            }
        }
        let tail = (whole..y.len()).all(|j| f(std::array::from_fn(|k| src[k][j])) == y[j]);
        tail && diff.iter().all(|&d| d == 0)
    };
    let n = y.len();
    if n < 2 * PART {
        return part(0, n);
    }
    (0..n.div_ceil(PART))
        .into_par_iter()
        .all(|c| part(c * PART, ((c + 1) * PART).min(n)))
}

/// [`exactly`] for a map with `P` results per element: whether `ys[p][i] == f(xs[·][i])[p]`
/// for every i and p (f32 `==`). The values are computed [`CHUNK`] elements at a time into
/// arrays (a plain loop, which vectorizes as the kernels' own loops do), then compared.
pub(super) fn exactly_parts<const K: usize, const P: usize>(
    xs: [&[f32]; K],
    ys: [&[f32]; P],
    f: impl Fn([f32; K]) -> [f32; P] + Sync,
) -> bool {
    use rayon::prelude::*;
    let n = ys[0].len();
    if xs.iter().any(|x| x.len() < n) || ys.iter().any(|y| y.len() != n) {
        return false;
    }
    let part = |lo: usize, hi: usize| {
        let mut want = [[0.0f32; CHUNK]; P];
        let mut at = lo;
        while at < hi {
            let len = CHUNK.min(hi - at);
            let src: [&[f32]; K] = std::array::from_fn(|k| &xs[k][at..at + len]);
            for i in 0..len {
                let v = f(std::array::from_fn(|k| src[k][i]));
                for p in 0..P {
                    want[p][i] = v[p];
                }
            }
            let same = (0..P).all(|p| {
                let got = &ys[p][at..at + len];
                // a bitwise-or of "differs" flags over the chunk (no early exit: vectorizes)
                !got.iter()
                    .zip(&want[p][..len])
                    .fold(false, |d, (a, b)| d | (a != b))
            });
            if !same {
                return false;
            }
            at += len;
        }
        true
    };
    if n < 2 * PART {
        return part(0, n);
    }
    (0..n.div_ceil(PART))
        .into_par_iter()
        .all(|c| part(c * PART, ((c + 1) * PART).min(n)))
}

/// ReLU's outputs and gradients are exact in f32: the spec's max(x, 0) is x or 0, and its
/// g·relu'(x) is g·1 or g·0, each representable. When every element equals that value
/// (compared with `==`, so a NaN anywhere goes on to the full tally), the error is zero and
/// the call is accepted without the f64 recomputation: the verdict the tally would give
/// (an error of 0 is within every bound), at the cost of one comparison per element.
/// Anything else (a NaN, a wrong element) is decided by the tally as before.
fn relu_exact_forward(x: &[f32], y: &[f32]) -> bool {
    x.len() == y.len() && exactly([x], y, |[x]| if x <= 0.0 { 0.0 } else { x })
}

/// [`relu_exact_forward`] for the gradient: gx = gy where x > 0 (or NaN: the spec passes
/// the cotangent), gy·0 elsewhere.
fn relu_exact_vjp(x: &[f32], gy: &[f32], gx: &[f32]) -> bool {
    x.len() == gx.len()
        && gy.len() == gx.len()
        && exactly([x, gy], gx, |[x, g]| if x <= 0.0 { 0.0 } else { g })
}

/// The tally of `y` against the spec's `op(x)`; `None` when `op` is not a unary map.
pub(super) fn forward(op: &Op, x: &[f32], y: &[f32]) -> Option<Tally> {
    if let Op::Gelu = op {
        return Some(super::gelu::forward(x, y));
    }
    if matches!(op, Op::Relu) && relu_exact_forward(x, y) {
        return Some(Tally::default());
    }
    let n = x.len().min(y.len());
    each_unary!(op, _o => (), return None);
    // the match runs once per part; each arm's loop is specialized to its variant
    Some(over_parts(n, |lo, hi| {
        each_unary!(op, o => {
        let mut t = Tally::default();
        let mut want = [0.0f64; CHUNK];
        for (xc, yc) in x[lo..hi].chunks(CHUNK).zip(y[lo..hi].chunks(CHUNK)) {
            for (w, &v) in want.iter_mut().zip(xc) {
                *w = unary(o, v as f64);
            }
            t.feed(yc, &want[..xc.len()]);
        }
        t
    }, Tally::rejecting())
    }))
}

/// The tally of the gradient `gx` against the spec's `gy · op'(x, y)` (y the forward
/// output, as the spec's VJP takes it); `None` when `op` is not a unary map.
pub(super) fn vjp(op: &Op, x: &[f32], y: &[f32], gy: &[f32], gx: &[f32]) -> Option<Tally> {
    if let Op::Gelu = op {
        return Some(super::gelu::vjp(x, gy, gx));
    }
    if matches!(op, Op::Relu) && relu_exact_vjp(x, gy, gx) {
        return Some(Tally::default());
    }
    let n = x.len().min(y.len()).min(gy.len()).min(gx.len());
    each_unary!(op, _o => (), return None);
    Some(over_parts(n, |lo, hi| {
        each_unary!(op, o => {
        let mut t = Tally::default();
        let mut want = [0.0f64; CHUNK];
        let (x, y, gy, gx) = (&x[lo..hi], &y[lo..hi], &gy[lo..hi], &gx[lo..hi]);
        let parts = x.chunks(CHUNK).zip(y.chunks(CHUNK)).zip(gy.chunks(CHUNK).zip(gx.chunks(CHUNK)));
        for ((xc, yc), (gc, gxc)) in parts {
            for (w, ((&a, &b), &g)) in want.iter_mut().zip(xc.iter().zip(yc).zip(gc)) {
                *w = unary_grad(o, a as f64, b as f64, g as f64);
            }
            t.feed(gxc, &want[..xc.len()]);
        }
        t
    }, Tally::rejecting())
    }))
}
