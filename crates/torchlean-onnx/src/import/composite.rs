//! ONNX operators with no torchlean op of their own, written with the ops torchlean has:
//! the activations PyTorch's exporter writes for `nn.LeakyReLU`, `nn.PReLU`, `nn.ELU`,
//! `nn.SELU`, `nn.Hardsigmoid`, `nn.Hardswish`, `nn.Mish` and `nn.Softsign`; the reductions
//! `ReduceL1`, `ReduceL2` and `ReduceSumSquare` (`torch.linalg.vector_norm`, `F.normalize`);
//! `ReduceMax`, `ReduceMin`, `ReduceLogSumExp` and `GlobalMaxPool` (`amax`, `amin`,
//! `logsumexp`, `nn.AdaptiveMaxPool2d(1)`) by a tournament of `maximum`s;
//! and `InstanceNormalization` (`nn.InstanceNorm*d`, and `nn.GroupNorm`, which the exporter
//! writes as one over reshaped groups). Each is the operator's definition op by op, so its
//! gradient is the composition's; where that differs from PyTorch's hand-written backward
//! (only at isolated points) the docs say so (docs/onnx.md).

use super::attrs::Attrs;
use super::ops::{arg, konst, reduction_axes, reshape, Map};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::Op;

/// Whether `op` is one of this module's activations.
pub(super) fn is_activation(op: &str) -> bool {
    matches!(
        op,
        "LeakyRelu"
            | "PRelu"
            | "Elu"
            | "Celu"
            | "Selu"
            | "HardSigmoid"
            | "HardSwish"
            | "Mish"
            | "Softsign"
    )
}

fn scale(b: &mut Builder, x: &Value, factor: f32) -> Map<Value> {
    b.op_on(Op::Scale { factor }, &[x])
}

/// −min(x, 0) (= relu(−x), exactly): the negative part, as a non-negative value. Taken as
/// `−clamp(x, −∞, 0)`, whose gradient passes at exactly 0 (clamp keeps its bounds), so that
/// LeakyRelu, PRelu, Elu and Selu have PyTorch's gradient there (the slope, α, γ·α): as
/// `relu(−x)` both of their terms had a zero gradient at 0 (an audit of the thirty-seventh
/// session).
fn negative_part(b: &mut Builder, x: &Value) -> Map<Value> {
    let below = b.op_on(
        Op::Clamp {
            min: f32::NEG_INFINITY,
            max: 0.0,
        },
        &[x],
    )?;
    scale(b, &below, -1.0)
}

/// relu(x) − slope·relu(−x): x where x > 0, slope·x elsewhere (exactly: one of the two terms
/// is zero). Its gradient at exactly 0 is the slope, as PyTorch's ([`negative_part`]).
/// `LeakyRelu` is the same with a constant slope (`scale`).
fn leaky(b: &mut Builder, x: &Value, slope: &Value) -> Map<Value> {
    let pos = b.op_on(Op::Relu, &[x])?;
    let neg = negative_part(b, x)?;
    let neg = b.op_on(Op::Mul, &[&neg, slope])?;
    b.op_on(Op::Sub, &[&pos, &neg])
}

/// relu(x) + α·(exp(−relu(−x)) − 1): x where x > 0, α(eˣ − 1) elsewhere (eˣ − 1 rather than
/// expm1: within one ulp of α near 0); its gradient at exactly 0 is α, as PyTorch's
/// ([`negative_part`]).
fn elu(b: &mut Builder, x: &Value, alpha: f32) -> Map<Value> {
    scaled_elu(b, x, alpha, 1.0)
}

/// relu(x) + α·(exp(s·min(x, 0)) − 1): `elu` with the input scale s = 1/α of `Celu`
/// (`nn.CELU`: x where x > 0, α(e^(x/α) − 1) elsewhere), s = 1 for `Elu`.
fn scaled_elu(b: &mut Builder, x: &Value, alpha: f32, s: f32) -> Map<Value> {
    let pos = b.op_on(Op::Relu, &[x])?;
    let neg = negative_part(b, x)?;
    let neg = scale(b, &neg, -s)?;
    let e = b.op_on(Op::Exp, &[&neg])?;
    let e = b.op_on(Op::AddScalar { value: -1.0 }, &[&e])?;
    let e = scale(b, &e, alpha)?;
    b.op_on(Op::Add, &[&pos, &e])
}

/// clamp(α·x + β, 0, 1), taken as 1 − relu(1 − relu(y)), y = α·x + β: the gradient at the
/// kinks (y = 0 and y = 1) is 0, PyTorch's `hardsigmoid` and `hardswish` rule (ONNX's
/// HardSigmoid and HardSwish come from them unambiguously, unlike `Clip`); as a `clamp`,
/// which passes the gradient at its bounds, it was α at x = ±3 (hardswish: −0.5 and 1.5
/// where PyTorch gives 0 and 1; the forty-eighth session's audit). The value is exact
/// outside (0, 1) and for y ≥ 1/2, within 2⁻²⁵ absolute below (1 − y rounds once).
fn hard_sigmoid(b: &mut Builder, x: &Value, alpha: f32, beta: f32) -> Map<Value> {
    let y = scale(b, x, alpha)?;
    let y = b.op_on(Op::AddScalar { value: beta }, &[&y])?;
    let up = b.op_on(Op::Relu, &[&y])?;
    let room = scale(b, &up, -1.0)?;
    let room = b.op_on(Op::AddScalar { value: 1.0 }, &[&room])?;
    let room = b.op_on(Op::Relu, &[&room])?;
    let below = scale(b, &room, -1.0)?;
    b.op_on(Op::AddScalar { value: 1.0 }, &[&below])
}

pub(super) fn activation(
    b: &mut Builder,
    op: &str,
    a: &Attrs,
    inputs: &[Option<Value>],
) -> Map<Value> {
    let x = arg(inputs, 0)?;
    // a non-finite coefficient would reach the zero term of the lowering (NaN · 0, ∞ · 0)
    // and make every element NaN: refused, naming it
    let coef = |name: &str, default: f32| -> Map<f32> {
        let v = a.float(name, default)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(format!(
                "{op} with {name}={v}: a non-finite {name} is not supported"
            ))
        }
    };
    match op {
        "LeakyRelu" => {
            let alpha = coef("alpha", 0.01)?;
            let pos = b.op_on(Op::Relu, &[x])?;
            let neg = negative_part(b, x)?;
            let neg = scale(b, &neg, alpha)?;
            b.op_on(Op::Sub, &[&pos, &neg])
        }
        // the slope broadcasts to x (a learned parameter: it gets its gradient)
        "PRelu" => leaky(b, x, arg(inputs, 1)?),
        "Elu" => elu(b, x, coef("alpha", 1.0)?),
        "Celu" => {
            let alpha = coef("alpha", 1.0)?;
            if alpha == 0.0 {
                return Err("Celu with alpha=0 (it divides by alpha)".into());
            }
            scaled_elu(b, x, alpha, 1.0 / alpha)
        }
        "Selu" => {
            let y = elu(b, x, coef("alpha", 1.673_263_2)?)?;
            scale(b, &y, coef("gamma", 1.050_701)?)
        }
        "HardSigmoid" => hard_sigmoid(b, x, coef("alpha", 0.2)?, coef("beta", 0.5)?),
        "HardSwish" => {
            let h = hard_sigmoid(b, x, 1.0 / 6.0, 0.5)?;
            b.op_on(Op::Mul, &[x, &h])
        }
        "Mish" => {
            let s = b.op_on(Op::Softplus, &[x])?;
            let t = b.op_on(Op::Tanh, &[&s])?;
            b.op_on(Op::Mul, &[x, &t])
        }
        // x / (1 + |x|)
        _ => {
            let d = b.op_on(Op::Abs, &[x])?;
            let d = b.op_on(Op::AddScalar { value: 1.0 }, &[&d])?;
            b.op_on(Op::Div, &[x, &d])
        }
    }
}

/// `ReduceL1` (Σ|x|), `ReduceL2` (√Σx², whose gradient at a zero vector is NaN where
/// PyTorch's norm gives 0) and `ReduceSumSquare` (Σx²), with `ReduceSum`'s axes rules of the
/// model's opset (an `axes` input from opset 18, an attribute before).
pub(super) fn norm_reduction(
    b: &mut Builder,
    op: &str,
    a: &Attrs,
    inputs: &[Option<Value>],
) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let rank = b.shape(x).len();
    let keepdim = a.int("keepdims", 1)? != 0;
    let axes = reduction_axes(b, op, a, inputs, rank)?;
    let terms = match op {
        "ReduceL1" => b.op_on(Op::Abs, &[x])?,
        _ => b.op_on(Op::Mul, &[x, x])?,
    };
    let sum = if axes.is_empty() {
        terms // no axis reduced: each element's own term
    } else {
        b.op_on(Op::ReduceSum { axes, keepdim }, &[&terms])?
    };
    if op == "ReduceL2" {
        b.op_on(Op::Sqrt, &[&sum])
    } else {
        Ok(sum)
    }
}

/// `InstanceNormalization`: each (sample, channel) of x [N, C, ...] normalized over its
/// spatial elements (`layer_norm` over the flattened spatial axis, its own affine neutral),
/// then `· scale[c] + bias[c]` (parameters: they get their gradients).
pub(super) fn instance_norm(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    if shape.len() < 3 {
        return Err(format!(
            "InstanceNormalization of a rank-{} input (expected [N, C, D1, ...])",
            shape.len()
        ));
    }
    let eps = a.float("epsilon", 1e-5)?;
    let (n, c) = (shape[0], shape[1]);
    let d: usize = shape[2..].iter().product();
    for (i, what) in [(1, "scale"), (2, "B")] {
        let s = b.shape(arg(inputs, i)?);
        if s != [c] {
            return Err(format!(
                "InstanceNormalization {what} of shape {s:?} for {c} channels"
            ));
        }
    }
    b.budget.take(&[2 * d])?;
    let ones = konst(Const::f32(vec![d], vec![1.0; d]));
    let zeros = konst(Const::f32(vec![d], vec![0.0; d]));
    let rows = reshape(b, x, vec![n, c, d])?;
    let normed = b.op_on(Op::LayerNorm { eps }, &[&rows, &ones, &zeros])?;
    let per_channel = |b: &mut Builder, v: &Value| reshape(b, v, vec![c, 1]);
    let (gain, bias) = (
        per_channel(b, arg(inputs, 1)?)?,
        per_channel(b, arg(inputs, 2)?)?,
    );
    let y = b.op_on(Op::Mul, &[&normed, &gain])?;
    let y = b.op_on(Op::Add, &[&y, &bias])?;
    reshape(b, &y, shape)
}

/// The maximum of `x` along `axis` (kept as extent 1): halves compared by `maximum` until one
/// element is left — ⌈log₂ n⌉ rounds of `slice`, `maximum` (and a `concat` of an odd one out),
/// so its gradient reaches the element that won every round; equal ones share it as
/// `maximum` does, a half per round they tie (PyTorch's `amax` splits it evenly among all
/// equal maxima). NaN wins, as in `amax`.
fn max_along(b: &mut Builder, x: &Value, axis: usize) -> Map<Value> {
    let mut cur = x.clone();
    let n = b.shape(x)[axis];
    if n == 0 {
        return Err(format!("a max-reduction over the empty axis {axis}"));
    }
    let mut len = n;
    while len > 1 {
        let half = len / 2;
        let part = |b: &mut Builder, start: usize, end: usize, v: &Value| {
            b.op_on(Op::Slice { axis, start, end }, &[v])
        };
        let lo = part(b, 0, half, &cur)?;
        let hi = part(b, half, 2 * half, &cur)?;
        let mut next = b.op_on(Op::Maximum, &[&lo, &hi])?;
        if len % 2 == 1 {
            let rest = part(b, 2 * half, len, &cur)?;
            next = b.op_on(Op::Concat { axis }, &[&next, &rest])?;
        }
        cur = next;
        len = half + len % 2;
    }
    Ok(cur)
}

/// `ReduceMax`, `ReduceMin` (−max(−x)) and `ReduceLogSumExp` (m + log Σ exp(x − m), m the
/// max clamped to the finite f32 range: no overflow, and +∞, −∞ and NaN rows give +∞, −∞
/// and NaN as PyTorch's `logsumexp`), and
/// `GlobalMaxPool` (the max over the spatial axes, kept), by [`max_along`] on each axis.
pub(super) fn max_reduction(
    b: &mut Builder,
    op: &str,
    a: &Attrs,
    inputs: &[Option<Value>],
) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let rank = shape.len();
    let (axes, keepdim) = if op == "GlobalMaxPool" {
        if rank < 3 {
            return Err("GlobalMaxPool of a tensor of rank < 3".into());
        }
        ((2..rank).collect::<Vec<_>>(), true)
    } else {
        (
            reduction_axes(b, op, a, inputs, rank)?,
            a.int("keepdims", 1)? != 0,
        )
    };
    let src = if op == "ReduceMin" {
        scale(b, x, -1.0)?
    } else {
        x.clone()
    };
    let mut m = src.clone();
    for &axis in &axes {
        m = max_along(b, &m, axis)?;
    }
    let mut y = match op {
        "ReduceMin" => scale(b, &m, -1.0)?,
        "ReduceLogSumExp" if !axes.is_empty() => {
            // the shift clamped to the finite range: a row holding +∞ gives
            // MAX + log(∞) = +∞ (not ∞ − ∞), a row of −∞ gives MIN + log(0) = −∞, a NaN
            // stays NaN — PyTorch's `logsumexp` and onnxruntime; finite rows are unchanged
            let m = b.op_on(
                Op::Clamp {
                    min: f32::MIN,
                    max: f32::MAX,
                },
                &[&m],
            )?;
            let shifted = b.op_on(Op::Sub, &[x, &m])?;
            let e = b.op_on(Op::Exp, &[&shifted])?;
            let s = b.op_on(
                Op::ReduceSum {
                    axes: axes.clone(),
                    keepdim: true,
                },
                &[&e],
            )?;
            let l = b.op_on(Op::Log, &[&s])?;
            b.op_on(Op::Add, &[&m, &l])?
        }
        _ => m,
    };
    if !keepdim && !axes.is_empty() {
        let dims: Vec<usize> = (0..rank)
            .filter(|d| !axes.contains(d))
            .map(|d| shape[d])
            .collect();
        y = reshape(b, &y, dims)?;
    }
    Ok(y)
}

/// `ReduceProd` over computed values: along each reduced axis, a pairwise product of its two
/// halves (an odd element carried to the next level) until one element is left — ⌈log₂ n⌉
/// levels of `slice`s and a `mul`. Each product is rounded once, in another association than
/// PyTorch's (ulp-level differences); the gradient is `mul`'s — the product of the other
/// factors — which is what PyTorch's `prod` backward gives, zeros included, without
/// dividing. An empty axis gives 1 (PyTorch's product of nothing).
pub(super) fn product(b: &mut Builder, x: &Value, axes: &[usize], keepdim: bool) -> Map<Value> {
    let mut y = x.clone();
    for &axis in axes {
        let n = b.shape(&y)[axis];
        if n == 0 {
            let mut dims = b.shape(&y);
            dims[axis] = 1;
            let count = b.budget.take(&dims)?;
            y = super::ops::konst(crate::constant::Const::f32(dims, vec![1.0; count]));
            continue;
        }
        let mut len = n;
        while len > 1 {
            let half = len / 2;
            let part = |b: &mut Builder, y: &Value, start: usize, end: usize| {
                b.op_on(Op::Slice { axis, start, end }, &[y])
            };
            let lo = part(b, &y, 0, half)?;
            let hi = part(b, &y, half, 2 * half)?;
            let mut next = b.op_on(Op::Mul, &[&lo, &hi])?;
            if len % 2 == 1 {
                let odd = part(b, &y, 2 * half, len)?;
                next = b.op_on(Op::Concat { axis }, &[&next, &odd])?;
            }
            y = next;
            len = half + len % 2;
        }
    }
    if keepdim {
        return Ok(y);
    }
    let dims: Vec<usize> = b
        .shape(&y)
        .iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, &e)| e)
        .collect();
    super::ops::reshape(b, &y, dims)
}
