//! Elementwise ops: binary maps with NumPy broadcasting, `where`, `compare` (1.0 where the
//! IEEE relation holds, else 0.0; no VJP), and unary maps.
//!
//! Domains follow IEEE: `log`/`sqrt` of a negative number is NaN, `inv(0)` is ±inf; `pow` of a
//! negative base with a non-integer exponent is NaN. `maximum`/`minimum` send the gradient of
//! a tie to the first input. `clamp` passes the gradient where `min <= x <= max`.
//!
//! NaN (module doc of [`crate::spec`]): `relu`, `clamp`, `safe_log`, `softplus`, `maximum` and
//! `minimum` return NaN for a NaN input (through [`crate::scalar::maximum`] and friends, never
//! `Float::max`). Their VJPs follow PyTorch's formulas at NaN: `relu` passes the cotangent
//! (PyTorch masks where `y <= 0`, false for NaN), `clamp`/`safe_log` pass none (PyTorch keeps
//! it where `lo <= x <= hi`, false for NaN), `maximum`/`minimum` pass it to both inputs
//! (PyTorch masks the loser where `a < b`, false for NaN), `abs` passes none (sign(NaN) = 0).
//! `relu(-0) = -0` and `clamp(-0, 0, _) = -0`, as PyTorch eager (`x < lo ? lo : x`).

use super::array::{broadcast_source_index, reduce_to};
use super::{expect_arity, payload_err, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::{clamp, maximum, minimum, Scalar};

pub(super) fn binary_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let n = if matches!(op, Op::Where) { 3 } else { 2 };
    expect_arity(op, shapes, &[n])?;
    let mut out = shapes[0].to_vec();
    for s in &shapes[1..] {
        out = super::broadcast_shapes(&out, s)
            .ok_or_else(|| shape_err(op, shapes, "shapes that broadcast together (NumPy rules)"))?;
    }
    Ok(out)
}

pub(super) fn unary_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[1])?;
    match op {
        Op::Clamp { min, max } if min.is_nan() || max.is_nan() || min > max => Err(payload_err(
            op,
            format!("clamp bounds must satisfy min <= max, got min={min} max={max}"),
        )),
        Op::SafeLog { eps } if eps.is_nan() || *eps <= 0.0 => {
            Err(payload_err(op, format!("eps must be > 0, got {eps}")))
        }
        _ => Ok(shapes[0].to_vec()),
    }
}

/// The binary map of `op` on one pair of scalars.
pub(crate) fn binary<T: Scalar>(op: &Op, a: T, b: T) -> T {
    match op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Div => a / b,
        Op::Maximum => maximum(a, b),
        Op::Minimum => minimum(a, b),
        Op::Compare { relation } => {
            if relation.holds(a, b) {
                T::one()
            } else {
                T::zero()
            }
        }
        _ => unreachable!("not a binary op: {}", op.name()),
    }
}

/// The partial of maximum or minimum for the operand that loses where `loser < winner`:
/// 0 there, 1/2 on a tie, 1 otherwise (NaN included).
fn share<T: Scalar>(loser: T, winner: T) -> T {
    if loser < winner {
        T::zero()
    } else if loser == winner {
        T::one() / (T::one() + T::one())
    } else {
        T::one()
    }
}

/// The cotangent of maximum's or minimum's operand that loses where `loser < winner`: exactly
/// 0 there (selected, as PyTorch's `masked_fill`: an infinite or NaN `g` does not make it
/// NaN), `g / 2` on a tie, `g` otherwise (NaN included).
pub(crate) fn share_grad<T: Scalar>(loser: T, winner: T, g: T) -> T {
    if loser < winner {
        T::zero()
    } else {
        g * share(loser, winner)
    }
}

/// The cotangents (of a, of b) of the binary map at (a, b) for the output cotangent `g`:
/// `g` times each partial, except maximum's and minimum's losing operand, which gets exactly 0
/// ([`share_grad`]).
pub(crate) fn binary_grads<T: Scalar>(op: &Op, a: T, b: T, g: T) -> (T, T) {
    match op {
        Op::Maximum => (share_grad(a, b, g), share_grad(b, a, g)),
        Op::Minimum => (share_grad(b, a, g), share_grad(a, b, g)),
        // PyTorch's order of operations: g / b, and -g · ((a / b) / b) (no b², which
        // overflows or underflows in f32 where the gradient does not)
        Op::Div => (g / b, -g * ((a / b) / b)),
        _ => {
            let (da, db) = binary_partials(op, a, b);
            (g * da, g * db)
        }
    }
}

/// Partial derivatives (d/da, d/db) of the binary map at (a, b).
pub(crate) fn binary_partials<T: Scalar>(op: &Op, a: T, b: T) -> (T, T) {
    let one = T::one();
    match op {
        Op::Add => (one, one),
        Op::Sub => (one, -one),
        Op::Mul => (b, a),
        Op::Div => (one / b, -a / (b * b)),
        // PyTorch's rule: each input loses its cotangent where the other strictly wins,
        // the two share it equally on a tie, and with a NaN neither comparison holds, so
        // both keep it
        Op::Maximum => (share(a, b), share(b, a)),
        Op::Minimum => (share(b, a), share(a, b)),
        _ => unreachable!("not a binary op: {}", op.name()),
    }
}

pub(super) fn binary_forward<T: Scalar>(
    op: &Op,
    xs: &[&Array<T>],
    out_shape: Vec<usize>,
) -> Array<T> {
    let maps = SourceMaps::new(xs, &out_shape);
    let at = |k: usize, i: usize| xs[k].data[maps.source(k, i)];
    Array::from_fn(&out_shape, |i| {
        if let Op::Where = op {
            if at(0, i) != T::zero() {
                at(1, i)
            } else {
                at(2, i)
            }
        } else {
            binary(op, at(0, i), at(1, i))
        }
    })
}

/// For each operand, the flat index of its element that output element `i` reads: the
/// broadcast source map, or `i` itself for an operand of the output's shape (no map built).
struct SourceMaps(Vec<Option<Vec<usize>>>);

impl SourceMaps {
    fn new<T>(xs: &[&Array<T>], out_shape: &[usize]) -> SourceMaps {
        SourceMaps(
            xs.iter()
                .map(|x| {
                    (x.shape != out_shape).then(|| broadcast_source_index(&x.shape, out_shape))
                })
                .collect(),
        )
    }
    #[inline]
    fn source(&self, k: usize, i: usize) -> usize {
        self.0[k].as_ref().map_or(i, |m| m[i])
    }
}

pub(super) fn binary_vjp<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    let maps = SourceMaps::new(xs, &gy.shape);
    let at = |k: usize, i: usize| xs[k].data[maps.source(k, i)];
    if let Op::Where = op {
        let cond = |i: usize| at(0, i) != T::zero();
        let ga = Array::from_fn(&gy.shape, |i| if cond(i) { gy.data[i] } else { T::zero() });
        let gb = Array::from_fn(&gy.shape, |i| if cond(i) { T::zero() } else { gy.data[i] });
        return vec![
            None,
            Some(reduce_to(&ga, &xs[1].shape)),
            Some(reduce_to(&gb, &xs[2].shape)),
        ];
    }
    let mut ga = Array::zeros(&gy.shape);
    let mut gb = Array::zeros(&gy.shape);
    for i in 0..gy.data.len() {
        let (da, db) = binary_grads(op, at(0, i), at(1, i), gy.data[i]);
        ga.data[i] = da;
        gb.data[i] = db;
    }
    vec![
        Some(reduce_to(&ga, &xs[0].shape)),
        Some(reduce_to(&gb, &xs[1].shape)),
    ]
}

/// The standard normal CDF and density (for exact GELU).
fn phi_cdf<T: Scalar>(x: T) -> T {
    T::c(0.5) * (T::one() + (x / T::c(std::f64::consts::SQRT_2)).erf())
}
fn phi_pdf<T: Scalar>(x: T) -> T {
    (-(x * x) / T::c(2.0)).exp() / T::c((2.0 * std::f64::consts::PI).sqrt())
}

/// The unary map of `op` at `x`.
// always inlined: a caller that knows the variant (the replay checker's `each_unary!`) gets
// the variant's formula alone, without a per-element match
#[inline(always)]
pub(crate) fn unary<T: Scalar>(op: &Op, x: T) -> T {
    let (one, zero) = (T::one(), T::zero());
    match op {
        Op::Neg => -x,
        Op::Abs => x.abs(),
        Op::Sqrt => x.sqrt(),
        Op::Exp => x.exp(),
        Op::Log => x.ln(),
        Op::Sin => x.sin(),
        Op::Cos => x.cos(),
        Op::Tanh => x.tanh(),
        Op::Sigmoid => one / (one + (-x).exp()),
        Op::Relu => maximum(x, zero),
        Op::Gelu => x * phi_cdf(x),
        Op::Silu => x / (one + (-x).exp()),
        // stable: max(x, 0) + ln(1 + exp(-|x|))
        Op::Softplus => maximum(x, zero) + (-x.abs()).exp().ln_1p(),
        Op::Erf => x.erf(),
        Op::Tan => x.tan(),
        Op::Atan => x.atan(),
        Op::Asin => x.asin(),
        Op::Acos => x.acos(),
        Op::Sinh => x.sinh(),
        Op::Cosh => x.cosh(),
        Op::Asinh => x.asinh(),
        Op::Acosh => x.acosh(),
        Op::Atanh => x.atanh(),
        Op::Inv => one / x,
        Op::SafeLog { eps } => maximum(x, T::c(*eps as f64)).ln(),
        Op::Scale { factor } => x * T::c(*factor as f64),
        Op::AddScalar { value } => x + T::c(*value as f64),
        Op::Clamp { min, max } => clamp(x, T::c(*min as f64), T::c(*max as f64)),
        Op::Pow { exponent } => pow(x, T::c(*exponent as f64)),
        Op::Round { mode } => round(*mode, x),
        _ => unreachable!("not a unary op: {}", op.name()),
    }
}

/// `x` rounded to an integer by `mode`: one exact IEEE-754 operation (`floor`, `ceil`,
/// `roundToIntegralTiesToEven`, `trunc`), so the same value at f32 and at f64 for an f32 `x`;
/// the sign of a zero result is `x`'s (`ceil(-0.4) = -0`), ±∞ and NaN pass through.
#[inline(always)]
pub fn round<T: Scalar>(mode: crate::graph::RoundMode, x: T) -> T {
    use crate::graph::RoundMode as M;
    match mode {
        M::Floor => x.floor(),
        M::Ceil => x.ceil(),
        M::HalfEven => x.round_half_even(),
        M::Trunc => x.trunc(),
    }
}

/// `x^p` as PyTorch computes it: exponent ½ is the square root and −½ its reciprocal
/// (ATen's `pow` takes those branches), IEEE `pow` otherwise. The two differ only at special
/// values — `pow(−0, ½) = +0` but `√−0 = −0`, `pow(−∞, ½) = +∞` but `√−∞ = NaN`,
/// `pow(−0, −½) = +∞` but `1/√−0 = −∞`, `pow(−∞, −½) = 0` but `1/√−∞ = NaN` — and there
/// torchlean follows PyTorch (the derivative `p·x^(p−1)` uses the same function, as
/// PyTorch's does). Every kernel of `pow` computes it this way.
#[inline(always)]
pub fn pow<T: Scalar>(x: T, p: T) -> T {
    if p == T::c(0.5) {
        x.sqrt()
    } else if p == T::c(-0.5) {
        T::one() / x.sqrt()
    } else {
        x.powf(p)
    }
}

/// Whether the unary map's VJP *selects* zero at `x` rather than multiplying by a zero
/// derivative: relu where x <= 0, clamp outside [min, max] (and at a NaN), safe_log where
/// x <= eps (and at a NaN), and pow with exponent 0 and round everywhere. There the input's cotangent
/// is exactly 0 whatever the output's (PyTorch's `where` / `masked_fill` / zeros: an infinite
/// or NaN cotangent from a later op, e.g. sqrt's at 0, does not become NaN). Everywhere else
/// the cotangent is multiplied by the derivative, so abs at 0 turns an infinite cotangent
/// into NaN (PyTorch's `grad · sgn(x)`).
#[inline(always)]
pub(crate) fn unary_selects_zero<T: Scalar>(op: &Op, x: T) -> bool {
    match op {
        Op::Relu => x <= T::zero(),
        Op::Clamp { min, max } => !(x >= T::c(*min as f64) && x <= T::c(*max as f64)),
        Op::SafeLog { eps } => !matches!(
            x.partial_cmp(&T::c(*eps as f64)),
            Some(std::cmp::Ordering::Greater)
        ),
        Op::Pow { exponent } => *exponent == 0.0,
        Op::Round { .. } => true,
        _ => false,
    }
}

/// The cotangent of the unary map's input at `x` (with `y` its value) for the output
/// cotangent `g`: 0 where the map selects it ([`unary_selects_zero`]), else `g` times the
/// derivative.
#[inline(always)]
pub(crate) fn unary_grad<T: Scalar>(op: &Op, x: T, y: T, g: T) -> T {
    if unary_selects_zero(op, x) {
        return T::zero();
    }
    match op {
        // PyTorch's order of operations: a division by x (or 2y), not a product with its
        // reciprocal, which overflows in f32 for a tiny x where the gradient does not
        Op::Log | Op::SafeLog { .. } => g / x,
        Op::Sqrt => g / (T::c(2.0) * y),
        Op::Atan => g / (x * x + T::one()),
        Op::Atanh => g / (T::one() - x * x),
        _ => g * unary_derivative(op, x, y),
    }
}

/// The derivative of the unary map at `x` (with `y` its value).
#[inline(always)]
pub(crate) fn unary_derivative<T: Scalar>(op: &Op, x: T, y: T) -> T {
    let (one, zero) = (T::one(), T::zero());
    match op {
        Op::Neg => -one,
        Op::Abs => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero
            }
        }
        Op::Sqrt => T::c(0.5) / y,
        Op::Exp => y,
        Op::Log => one / x,
        Op::Sin => x.cos(),
        Op::Cos => -x.sin(),
        Op::Tanh => one - y * y,
        Op::Sigmoid => y * (one - y),
        // PyTorch: zero where the output is <= 0; NaN passes the cotangent
        Op::Relu => {
            if x <= zero {
                zero
            } else {
                one
            }
        }
        Op::Gelu => phi_cdf(x) + x * phi_pdf(x),
        Op::Silu => {
            let s = one / (one + (-x).exp());
            s * (one + x * (one - s))
        }
        Op::Softplus => one / (one + (-x).exp()),
        // 2/√π · e^(−x²) (PyTorch's erf backward)
        Op::Erf => T::c(std::f64::consts::FRAC_2_SQRT_PI) * (-(x * x)).exp(),
        // PyTorch's backward formulas: 1 + tan², 1/(x² + 1) (a division: `unary_grad`),
        // ±1/√(1 − x²) (∞ at ±1, NaN beyond)
        Op::Tan => one + y * y,
        Op::Atan => one / (x * x + one),
        Op::Asin => one / (one - x * x).sqrt(),
        Op::Acos => -(one / (one - x * x).sqrt()),
        // PyTorch's: cosh, sinh, 1/√(x² + 1), 1/√(x² − 1), and 1/(1 − x²) (a division:
        // `unary_grad`)
        Op::Sinh => x.cosh(),
        Op::Cosh => x.sinh(),
        Op::Asinh => one / (x * x + one).sqrt(),
        Op::Acosh => one / (x * x - one).sqrt(),
        Op::Atanh => one / (one - x * x),
        Op::Inv => -(y * y),
        Op::SafeLog { eps } => {
            if x > T::c(*eps as f64) {
                one / x
            } else {
                zero
            }
        }
        Op::Scale { factor } => T::c(*factor as f64),
        Op::AddScalar { .. } => one,
        Op::Clamp { min, max } => {
            if x >= T::c(*min as f64) && x <= T::c(*max as f64) {
                one
            } else {
                zero
            }
        }
        Op::Pow { exponent } => {
            let p = T::c(*exponent as f64);
            if p == zero {
                zero
            } else {
                p * pow(x, p - one)
            }
        }
        // piecewise constant (a selected zero, see unary_selects_zero)
        Op::Round { .. } => zero,
        _ => unreachable!("not a unary op: {}", op.name()),
    }
}

pub(super) fn unary_forward<T: Scalar>(op: &Op, x: &Array<T>) -> Array<T> {
    Array {
        shape: x.shape.clone(),
        data: x.data.iter().map(|&v| unary(op, v)).collect(),
    }
}

pub(super) fn unary_vjp<T: Scalar>(
    op: &Op,
    x: &Array<T>,
    y: &Array<T>,
    gy: &Array<T>,
) -> InputGrads<T> {
    let data = (0..x.data.len())
        .map(|i| unary_grad(op, x.data[i], y.data[i], gy.data[i]))
        .collect();
    vec![Some(Array {
        shape: x.shape.clone(),
        data,
    })]
}

/// The chain of a `fused_unary` op.
fn chain(op: &Op) -> &[Op] {
    match op {
        Op::FusedUnary { ops } => ops,
        _ => unreachable!("not a fused op: {}", op.name()),
    }
}

pub(super) fn fused_shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[1])?;
    let ops = chain(op);
    if ops.is_empty() {
        return Err(payload_err(op, "a fused chain needs at least one op"));
    }
    for part in ops {
        if !part.kind().is_unary_map() {
            return Err(payload_err(
                op,
                format!("`{}` is not a unary elementwise map", part.name()),
            ));
        }
        unary_shape(part, shapes)?;
    }
    Ok(shapes[0].to_vec())
}

/// The composition of the chain's maps at `x`.
pub(crate) fn fused_chain_value<T: Scalar>(ops: &[Op], x: T) -> T {
    ops.iter().fold(x, |v, part| unary(part, v))
}

/// The cotangent of the composition's input at `x` for the output cotangent `g`: `g` times
/// the chain rule's product of the maps' derivatives (in the chain's order) — unless a map
/// selects 0 at its input ([`unary_selects_zero`]): then 0 times the product of the
/// derivatives before it (0, or NaN where one of those is infinite or NaN), as the unfused
/// VJPs give (a selected zero stays 0 after sqrt's infinite derivative at 0 further on;
/// an infinite derivative before it still makes 0 · ∞ = NaN).
pub(crate) fn fused_chain_grad<T: Scalar>(ops: &[Op], x: T, g: T) -> T {
    let mut v = x;
    let mut d = T::one();
    for part in ops {
        if unary_selects_zero(part, v) {
            return T::zero() * d;
        }
        let y = unary(part, v);
        d *= unary_derivative(part, v, y);
        v = y;
    }
    g * d
}

pub(super) fn fused_forward<T: Scalar>(op: &Op, x: &Array<T>) -> Array<T> {
    let ops = chain(op);
    Array {
        shape: x.shape.clone(),
        data: x.data.iter().map(|&v| fused_chain_value(ops, v)).collect(),
    }
}

pub(super) fn fused_vjp<T: Scalar>(op: &Op, x: &Array<T>, gy: &Array<T>) -> InputGrads<T> {
    let ops = chain(op);
    let data = x
        .data
        .iter()
        .zip(&gy.data)
        .map(|(&v, &g)| fused_chain_grad(ops, v, g))
        .collect();
    vec![Some(Array {
        shape: x.shape.clone(),
        data,
    })]
}
