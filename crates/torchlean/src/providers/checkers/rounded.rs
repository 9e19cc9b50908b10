//! The check of the maps that are one correctly rounded IEEE-754 operation per element —
//! the binary maps over operands of the output's shape (`add`, `sub`, `mul`, `div`,
//! `maximum`, `minimum`) and the unary maps `neg`, `abs`, `relu`, `clamp`, `round`, `sqrt`, `inv`,
//! `scale`, `add_scalar` — against half a unit in the last place per element.
//!
//! Each element of such a call is one IEEE-754 operation on f32 values (or an exact
//! selection), correctly rounded (round to nearest) by every kernel the replayed capsules
//! bind: the native CPU loops, and the CUDA kernels, which NVRTC compiles without fast-math
//! (IEEE division and square root; a single operation leaves nothing to contract). So instead of the recompute tolerance
//! 2e-4·(1 + max|spec|) of the whole call, each element is accepted when it is
//! - the spec's operation evaluated in f32, bit for bit (a NaN where that is NaN), or
//! - of the f64 spec's non-finite class, or
//! - within **half an ulp** of the f64 spec's value `exact`: half the spacing of the f32
//!   values around it, 2^(e − 24) for 2^e ≤ |exact| < 2^(e+1), 2⁻¹⁵⁰ in the subnormal range
//!   (round to nearest errs by at most that; the f64 value is exact for `add`, `sub`, `mul`,
//!   `maximum`, `minimum` of f32 operands in range, and within 2⁻⁵³ relative for `div`,
//!   covered by a factor 1 + 2⁻²⁸). The other neighbour of an exact tie is within it too.
//!
//! A correct kernel is never rejected; a result one ulp or more from the correctly rounded
//! value (away from the exact one; or the neighbour of a value that is not a tie) is. The verdict is per element, so it decomposes over tiles and
//! the whole-call check is the same check. Broadcast calls (a bias added along rows) keep the
//! recompute tolerance (`maps.rs`, `pieces.rs`).
//!
//! `compare` (1.0 where the relation holds, else 0.0) is checked exactly, broadcast or not:
//! [`compare_exactly`].
//!
//! Cost: the whole call is compared with the f32 operation first (`exactly`, vectorized); only
//! a call with another element is walked element by element.

use super::recompute::{class, dense_values};
use super::unary::exactly;
use crate::backend::Call;
use crate::graph::Op;
use crate::spec::{binary, unary};

/// Half the smallest positive f32 (2⁻¹⁵⁰): the rounding error bound in the subnormal range.
const HALF_TINY: f64 = 7.006_492_321_624_085e-46;

/// The element bound around the f64 value `exact`: half the spacing of the f32 values around
/// it (2^(e − 24) for 2^e ≤ |exact| < 2^(e+1) in the normal range, 2⁻¹⁵⁰ in the subnormal
/// range), raised by 2⁻²⁸ relative for the f64 value's own rounding (a quotient).
fn bound(exact: f64) -> f64 {
    let a = exact.abs();
    let half_ulp = if a < f32::MIN_POSITIVE as f64 {
        HALF_TINY
    } else {
        // the binary exponent of a normal f64, from its bits
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        2f64.powi(e - 24)
    };
    half_ulp * (1.0 + 1.0 / (1u64 << 28) as f64)
}

/// The verdict on a binary map whose operands all have the output's shape; `None` for any
/// other call (another check decides).
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if let Op::Compare { .. } = op {
        return Some(compare_exactly(op, call));
    }
    if op.kind().is_unary_map() {
        return unary_forward(op, call);
    }
    if !op.kind().is_binary_map() || call.inputs.len() != 2 {
        return None;
    }
    let y = &call.output;
    if call.inputs.iter().any(|x| x.shape != y.shape) {
        return None;
    }
    let (a, b, y) = (
        dense_values(&call.inputs[0]),
        dense_values(&call.inputs[1]),
        dense_values(y),
    );
    if a.len() != y.len() || b.len() != y.len() {
        return Some(Err("operands and result of different lengths".into()));
    }
    // the spec's operation, one arm per op (a constant op: the f32 comparison's loop has no
    // per-element match)
    // the spec's operation, one arm per op (a constant op: the f32 comparison's loop has no
    // per-element match)
    macro_rules! with {
        ($op:expr) => {
            verdict(
                op,
                first_outside(
                    [&a, &b],
                    &y,
                    |[x, z]| binary(&$op, x, z),
                    |[x, z]| {
                        let exact = binary(&$op, x, z);
                        (exact, bound(exact))
                    },
                ),
            )
        };
    }
    Some(match op {
        Op::Add => with!(Op::Add),
        Op::Sub => with!(Op::Sub),
        Op::Mul => with!(Op::Mul),
        Op::Div => with!(Op::Div),
        Op::Maximum => with!(Op::Maximum),
        Op::Minimum => with!(Op::Minimum),
        _ => return None,
    })
}

/// The verdict on a `compare` call (broadcast or not): each element exactly the spec's 0 or 1.
/// The relation of two f32 values is exact in f64 (the conversion is), so a correct kernel
/// gives the spec's value bit for bit; anything else — another value, a -0, a NaN, a flipped
/// answer — is rejected.
fn compare_exactly(op: &Op, call: &Call) -> Result<(), String> {
    use super::recompute::array;
    let xs: Vec<crate::spec::Array<f64>> = call.inputs.iter().map(array).collect();
    let refs: Vec<&crate::spec::Array<f64>> = xs.iter().collect();
    let want =
        crate::spec::forward(op, &refs).map_err(|e| format!("the spec refuses the call: {e}"))?;
    if want.shape != call.output.shape {
        return Err(format!(
            "result shape {:?}, the spec gives {:?}",
            call.output.shape, want.shape
        ));
    }
    let got = dense_values(&call.output);
    match (got.iter().zip(&want.data)).position(|(&g, &w)| (g as f64).to_bits() != w.to_bits()) {
        None if got.len() == want.data.len() => Ok(()),
        None => Err("result of another length than the spec's".into()),
        Some(i) => Err(format!(
            "element {i} is {:e}, the spec's {} is {} (exact: allowed 0)",
            got[i],
            op.name(),
            want.data[i]
        )),
    }
}

/// Whether an element `got` is accepted: it is the f32 formula's value `f32v` bit for bit (a
/// NaN where that is NaN), of the f64 value `want`'s non-finite class, or within `bound` of
/// it — the per-element rule of this module and of `optim.rs`.
pub(super) fn accepts(got: f32, f32v: f32, want: f64, bound: f64) -> bool {
    if got.to_bits() == f32v.to_bits() || (got.is_nan() && f32v.is_nan()) {
        return true;
    }
    let g = got as f64;
    if g.is_finite() && want.is_finite() {
        (g - want).abs() <= bound
    } else {
        class(g) == class(want)
    }
}

/// An element outside its bound.
pub(super) struct Outside<const K: usize> {
    pub i: usize,
    pub x: [f32; K],
    pub got: f32,
    pub f32v: f32,
    pub want: f64,
    pub bound: f64,
}

/// The first element of `y` that [`accepts`] refuses, of a map of the operands `xs`: `f32v`
/// its formula in f32, `reference` its f64 value and bound. The whole call is compared with
/// `f32v` first (vectorized); only a call with another element is walked element by element.
pub(super) fn first_outside<const K: usize>(
    xs: [&[f32]; K],
    y: &[f32],
    f32v: impl Fn([f32; K]) -> f32 + Sync,
    reference: impl Fn([f64; K]) -> (f64, f64),
) -> Option<Outside<K>> {
    if exactly(xs, y, &f32v) {
        return None;
    }
    (0..y.len()).find_map(|i| {
        let x: [f32; K] = std::array::from_fn(|k| xs[k][i]);
        let (got, fv) = (y[i], f32v(x));
        let (want, bound) = reference(x.map(f64::from));
        (!accepts(got, fv, want, bound)).then_some(Outside {
            i,
            x,
            got,
            f32v: fv,
            want,
            bound,
        })
    })
}

/// The verdict on a call of `op` from its first element outside the bound.
fn verdict<const K: usize>(op: &Op, outside: Option<Outside<K>>) -> Result<(), String> {
    match outside {
        None => Ok(()),
        Some(o) => Err(format!(
            "element {} is {:e}: {} of {:?} is {:e} (correctly rounded {:e}); allowed {:e} (half an ulp)",
            o.i,
            o.got,
            op.name(),
            o.x,
            o.want,
            o.f32v,
            o.bound
        )),
    }
}

/// The unary maps that are one correctly rounded operation, or exact, per element: `neg`,
/// `abs`, `relu`, `clamp`, `round` (exact), `sqrt`, `inv` (1/x), `scale` (x·factor), `add_scalar`
/// (x + value); over an input of the output's shape. `None` for any other call.
fn unary_forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    let (x, y) = (call.inputs.first()?, &call.output);
    if call.inputs.len() != 1 || x.shape != y.shape {
        return None;
    }
    let (x, y) = (dense_values(x), dense_values(y));
    if x.len() != y.len() {
        return Some(Err("operand and result of different lengths".into()));
    }
    // the spec's formula of a constant op (no per-element match)
    macro_rules! with {
        ($op:expr) => {
            verdict(
                op,
                first_outside(
                    [&x],
                    &y,
                    |[v]| unary($op, v),
                    |[v]| {
                        let exact = unary($op, v);
                        (exact, bound(exact))
                    },
                ),
            )
        };
    }
    Some(match *op {
        Op::Neg => with!(&Op::Neg),
        Op::Abs => with!(&Op::Abs),
        Op::Relu => with!(&Op::Relu),
        Op::Sqrt => with!(&Op::Sqrt),
        Op::Inv => with!(&Op::Inv),
        Op::Scale { factor } => with!(&Op::Scale { factor }),
        Op::AddScalar { value } => with!(&Op::AddScalar { value }),
        Op::Clamp { min, max } => with!(&Op::Clamp { min, max }),
        Op::Round { mode } => with!(&Op::Round { mode }),
        _ => return None,
    })
}
