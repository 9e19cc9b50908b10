//! The ONNX operator table: each supported operator as torchlean ops (or an import-time
//! evaluation when every operand is a constant). docs/onnx.md lists the same table.

use super::attrs::Attrs;
use super::integer::is_boolean;
use super::{Builder, Value};
use crate::constant::{
    broadcast_shapes, dtype, normalize_axis, normalize_index, slice_range, Binary, Const, Data,
};
use std::rc::Rc;
use torchlean::graph::{Op, Relation, RoundMode};

pub(super) type Map<T> = Result<T, String>;

/// Every operator type the table maps.
const KNOWN: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumSum",
    "DepthToSpace",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "EyeLike",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GRU",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "LSTM",
    "MatMul",
    "Max",
    "MaxPool",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "NegativeLogLikelihoodLoss",
    "Neg",
    "Not",
    "OneHot",
    "Or",
    "Pad",
    "Pow",
    "PRelu",
    "Range",
    "Reciprocal",
    "RNN",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "Round",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shape",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tan",
    "Tanh",
    "Tile",
    "TopK",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Where",
    "Xor",
];

pub fn is_known(op_type: &str) -> bool {
    KNOWN.contains(&op_type)
}

/// The supported operator types (for docs and listings).
pub fn supported_operators() -> &'static [&'static str] {
    KNOWN
}

pub(super) fn konst(c: Const) -> Value {
    Value::Const(Rc::new(c))
}

/// Input `i`, which the operator requires.
pub(super) fn arg(inputs: &[Option<Value>], i: usize) -> Map<&Value> {
    inputs
        .get(i)
        .and_then(Option::as_ref)
        .ok_or_else(|| format!("input {i} is required"))
}

pub(super) fn opt(inputs: &[Option<Value>], i: usize) -> Option<&Value> {
    inputs.get(i).and_then(Option::as_ref)
}

/// Operators of the table that the default domain introduced after opset 13 (the oldest
/// the importer reads), with the opset that introduced them.
const INTRODUCED: &[(&str, i64)] = &[
    ("HardSwish", 14),
    ("Trilu", 14),
    ("CastLike", 15),
    ("LayerNormalization", 17),
    ("Mish", 18),
    ("Gelu", 20),
];

/// Refuses a node of the model whose operator its declared opset does not have yet (the
/// importer's own rewrites, such as the Erf GELU pattern's `Gelu`, are not checked).
pub fn check_introduced(op: &str, opset: i64) -> Map<()> {
    match INTRODUCED.iter().find(|(o, _)| *o == op) {
        Some(&(_, since)) if opset < since => Err(format!(
            "`{op}` exists from opset {since}; the model declares opset {opset}"
        )),
        _ => Ok(()),
    }
}

/// Maps one node; returns its output values in order.
pub fn map(b: &mut Builder, op: &str, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let one = |v: Value| Ok(vec![v]);
    match op {
        "Constant" => one(konst(a.constant_value()?)),
        "Identity" => one(arg(inputs, 0)?.clone()),
        "Dropout" => {
            // inference (or ratio 0): the identity; a training-mode dropout with a ratio is not
            a.int("seed", 0)?;
            let ratio = match opt(inputs, 1) {
                Some(r) => b
                    .known(r)
                    .and_then(|c| c.scalar())
                    .ok_or("Dropout's ratio must be a constant")?,
                None => 0.5,
            };
            let training = match opt(inputs, 2) {
                Some(t) => {
                    b.known(t)
                        .and_then(|c| c.scalar())
                        .ok_or("Dropout's training_mode must be a constant")?
                        != 0.0
                }
                None => false,
            };
            if training && ratio != 0.0 {
                return Err(
                    "training-mode Dropout with a non-zero ratio (export in eval mode)".into(),
                );
            }
            one(arg(inputs, 0)?.clone())
        }
        "Cast" | "CastLike" => {
            let x = arg(inputs, 0)?;
            // `saturate` (float8 targets only) exists from opset 19
            if b.opset >= 19 {
                a.int("saturate", 1)?;
            }
            // CastLike is Cast to the element type of its second input: a constant's, an
            // initializer's (as the file declares it), or a node's (integers for the values
            // the import tracks as integral, else float32)
            let to = if op == "Cast" {
                a.int("to", 0)? as i32
            } else {
                b.elem_type(arg(inputs, 1)?)
            };
            // an initializer cast to a non-float type is data (a mask, indices), not a
            // parameter: it is evaluated here like a constant
            let known = match x {
                Value::Param(_) if to != dtype::FLOAT && to != dtype::DOUBLE => b.known(x),
                _ => b.folded(x),
            };
            match known {
                Some(c) => one(konst(c.cast(to, &b.budget)?)),
                // a float value cast to float: itself; an integer or boolean node cast to
                // float is a float value from here on, so it gets a node of its own (a
                // same-shape reshape, a view) outside the integer sets, which are keyed by
                // node: sharing the node kept `mask.float().sum()` an integer (its division
                // refused) and made `CastLike(0.5, that)` truncate 0.5 to 0 (an audit of the
                // forty-fourth session)
                // a float value cast to float64: the same float32 numbers, which only what
                // is exact on them may read (`integer::check_double`; PyTorch's export of
                // `torch.isinf`)
                None if to == dtype::DOUBLE
                    && !matches!(x, Value::Node(id) if b.integral.contains(id) || b.boolean.contains(id)) =>
                {
                    one(x.clone())
                }
                None if to == dtype::FLOAT => match x {
                    Value::Node(id) if b.integral.contains(id) || b.boolean.contains(id) => {
                        let shape = b.shape(x);
                        one(Value::Node(b.op(Op::Reshape { shape }, vec![*id])?))
                    }
                    _ => one(x.clone()),
                },
                // an integer input cast to an integer type: already its integer values
                None if matches!(x, Value::Node(id) if b.integral.contains(id))
                    && matches!(to, dtype::INT64 | dtype::INT32) =>
                {
                    one(x.clone())
                }
                // a float value cast to an integer type: truncated toward zero (ONNX's and
                // PyTorch's `.long()`), exactly — the truncation of a float32 is a float32
                // integer, which int64 holds — and integral from here on, so only what is
                // exact on integers may read it (`integer.rs`; a gather over computed indices,
                // `(x * n).long()` bucketing); + 0 makes a -0 (from -0.5 .. -0) the integer 0,
                // which has no sign (0.0 after a cast back, as in ONNX). A NaN or infinity,
                // which ONNX leaves undefined, stays itself (docs/onnx.md)
                None if matches!(to, dtype::INT64 | dtype::INT32) => {
                    let id = b.node(x)?;
                    let t = b.op(
                        Op::Round {
                            mode: RoundMode::Trunc,
                        },
                        vec![id],
                    )?;
                    let t = b.op(Op::AddScalar { value: 0.0 }, vec![t])?;
                    b.integral.insert(t);
                    one(Value::Node(t))
                }
                // a boolean value cast to bool (the exporter's Cast of a bool mask input):
                // itself
                None if matches!(x, Value::Node(id) if b.boolean.contains(id))
                    && to == dtype::BOOL =>
                {
                    one(x.clone())
                }
                // any other value cast to bool: x != 0, exactly, NaN true as in ONNX and
                // PyTorch (`~attention_mask.bool()` of an int64 mask input, `x.bool()`)
                None if to == dtype::BOOL => {
                    let zero = konst(Const::f32(vec![], vec![0.0]));
                    one(compare(b, Relation::Ne, x, &zero)?)
                }
                None => Err(format!(
                    "casting a computed value to {} (torchlean's tensors are float32)",
                    dtype::name(to)
                )),
            }
        }
        "Shape" => {
            let shape = b.shape(arg(inputs, 0)?);
            let rank = shape.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
            // `start` and `end` exist from opset 15 (before, they stay unread: refused)
            let (start, end) = if b.opset >= 15 {
                (clampi(a.int("start", 0)?), clampi(a.int("end", rank)?))
            } else {
                (0, rank as usize)
            };
            let dims: Vec<i64> = shape[start..end.max(start)]
                .iter()
                .map(|&d| d as i64)
                .collect();
            one(konst(Const::i64s(dims)))
        }
        "Size" => {
            let n: usize = b.shape(arg(inputs, 0)?).iter().product();
            one(konst(Const {
                dims: vec![],
                data: Data::I64(vec![n as i64]),
            }))
        }
        "ConstantOfShape" => {
            let dims = crate::constant::sizes(&b.ints(arg(inputs, 0)?, "shape")?)?;
            let fill = match a.get_tensor_value()? {
                Some(c) => c,
                None => Const::f32(vec![1], vec![0.0]),
            };
            if fill.len() != 1 {
                return Err(format!(
                    "ConstantOfShape's `value` must hold one element, it has shape {:?}",
                    fill.dims
                ));
            }
            let n = b.budget.take(&dims)?;
            let data = match &fill.data {
                Data::F32(v) => Data::F32(vec![v[0]; n]),
                Data::I64(v) => Data::I64(vec![v[0]; n]),
                Data::Bool(v) => Data::Bool(vec![v[0]; n]),
            };
            one(konst(Const { dims, data }))
        }
        "Range" => {
            let get = |i: usize| -> Map<Rc<Const>> {
                b.known(arg(inputs, i)?)
                    .ok_or_else(|| "Range of computed values".to_string())
            };
            let (s, l, d) = (get(0)?, get(1)?, get(2)?);
            if [&s, &l, &d].iter().any(|c| c.len() != 1) {
                return Err("Range's start, limit and delta must be scalars".into());
            }
            match (&s.data, &l.data, &d.data) {
                (Data::I64(s), Data::I64(l), Data::I64(d)) => {
                    let (s, l, d) = (s[0], l[0], d[0]);
                    if d == 0 {
                        return Err("Range with delta 0".into());
                    }
                    // ceil((limit − start) / delta), clamped at 0, in i128 (no overflow for
                    // any i64 operands), then bounded
                    let (mut span, mut step) = (l as i128 - s as i128, d as i128);
                    if step < 0 {
                        (span, step) = (-span, -step);
                    }
                    let n = if span <= 0 {
                        0
                    } else {
                        (span + step - 1) / step
                    };
                    let n = i64::try_from(n).map_err(|_| "Range too long".to_string())?;
                    crate::constant::sizes(&[n])?;
                    b.budget.take(&[n as usize])?;
                    let values = (0..n)
                        .map(|k| {
                            k.checked_mul(d)
                                .and_then(|v| v.checked_add(s))
                                .ok_or_else(|| "Range overflows int64".to_string())
                        })
                        .collect::<Map<Vec<i64>>>()?;
                    one(konst(Const::i64s(values)))
                }
                _ => {
                    let (s, l, d) = (s.floats()[0], l.floats()[0], d.floats()[0]);
                    let n = ((l - s) / d).ceil();
                    if !n.is_finite() {
                        return Err(format!("Range({s}, {l}, {d}) has no finite length"));
                    }
                    let n = n.max(0.0).min(i64::MAX as f32) as i64;
                    crate::constant::sizes(&[n])?;
                    let n = b.budget.take(&[n as usize])?;
                    one(konst(Const::f32(
                        vec![n],
                        (0..n).map(|k| s + k as f32 * d).collect(),
                    )))
                }
            }
        }
        "Add" | "Sub" | "Mul" | "Div" => binary(b, op, inputs),
        "Mod" => {
            let fmod = a.int("fmod", 0)?;
            let (x, y) = (arg(inputs, 0)?, arg(inputs, 1)?);
            match (b.folded(x), b.folded(y)) {
                (Some(x), Some(y)) => one(konst(fold_mod(&x, &y, fmod, &b.budget)?)),
                _ => Err(
                    "`Mod` of values computed at run time (torchlean has no remainder op; only constants are evaluated, at import)"
                        .into(),
                ),
            }
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
            let (x, y) = (arg(inputs, 0)?, arg(inputs, 1)?);
            let (bin, relation) = match op {
                "Equal" => (Binary::Equal, Relation::Eq),
                "Less" => (Binary::Less, Relation::Lt),
                "Greater" => (Binary::Greater, Relation::Gt),
                "LessOrEqual" => (Binary::LessOrEqual, Relation::Le),
                _ => (Binary::GreaterOrEqual, Relation::Ge),
            };
            match (b.folded(x), b.folded(y)) {
                (Some(x), Some(y)) => one(konst(x.binary(&y, bin, &b.budget)?)),
                _ => one(compare(b, relation, x, y)?),
            }
        }
        "IsNaN" => {
            // NaN is the one value unequal to itself
            let x = arg(inputs, 0)?;
            one(compare(b, Relation::Ne, x, x)?)
        }
        "IsInf" => {
            let x = arg(inputs, 0)?;
            let (pos, neg) = (
                a.int("detect_positive", 1)? != 0,
                a.int("detect_negative", 1)? != 0,
            );
            let inf = |v: f32| konst(Const::f32(vec![], vec![v]));
            one(match (pos, neg) {
                (true, true) => {
                    let m = b.op_on(Op::Abs, &[x])?;
                    compare(b, Relation::Eq, &m, &inf(f32::INFINITY))?
                }
                (true, false) => compare(b, Relation::Eq, x, &inf(f32::INFINITY))?,
                (false, true) => compare(b, Relation::Eq, x, &inf(f32::NEG_INFINITY))?,
                // detects nothing: x < x is false everywhere, NaN included
                (false, false) => compare(b, Relation::Lt, x, x)?,
            })
        }
        "And" | "Or" | "Xor" => {
            let (x, y) = (arg(inputs, 0)?, arg(inputs, 1)?);
            match (b.folded(x), b.folded(y)) {
                (Some(cx), Some(cy)) => {
                    let (dims, cs) = broadcast_all(&[cx, cy], &b.budget)?;
                    let (p, q) = (cs[0].floats(), cs[1].floats());
                    let v = p
                        .iter()
                        .zip(&q)
                        .map(|(&p, &q)| {
                            let (p, q) = (p != 0.0, q != 0.0);
                            match op {
                                "And" => p && q,
                                "Or" => p || q,
                                _ => p != q,
                            }
                        })
                        .collect();
                    one(konst(Const {
                        dims,
                        data: Data::Bool(v),
                    }))
                }
                _ if is_boolean(b, x) && is_boolean(b, y) => {
                    // on 0/1 values: and = x·y, or = max(x, y), xor = |x − y| (exact)
                    let v = match op {
                        "And" => b.op_on(Op::Mul, &[x, y])?,
                        "Or" => b.op_on(Op::Maximum, &[x, y])?,
                        _ => {
                            let d = b.op_on(Op::Sub, &[x, y])?;
                            b.op_on(Op::Abs, &[&d])?
                        }
                    };
                    one(mark_boolean(b, v))
                }
                _ => Err(format!("`{op}` of values that are not booleans (a boolean input, a comparison of integers, or logic on them)")),
            }
        }
        "Not" => match b.folded(arg(inputs, 0)?) {
            Some(c) => {
                b.budget.take(&c.dims)?;
                one(konst(not_const(&c)))
            }
            // a boolean input, a comparison of integers, logic on them (or what only moves
            // their elements), held as 0/1: 1 − x
            None if matches!(arg(inputs, 0)?, Value::Node(id) if b.boolean.contains(id)) => {
                let v = one_minus(b, arg(inputs, 0)?)?;
                one(mark_boolean(b, v))
            }
            None => Err("`Not` of a computed value that is not a boolean (a boolean input, a comparison of integers, or logic on them)".into()),
        },
        "Where" => {
            let (c, x, y) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
            if let (Some(c), Some(x), Some(y)) = (b.folded(c), b.folded(x), b.folded(y)) {
                let dims = broadcast_shapes(&broadcast_shapes(&c.dims, &x.dims)?, &y.dims)?;
                let (c, x, y) = (
                    c.broadcast(&dims, &b.budget)?,
                    x.broadcast(&dims, &b.budget)?,
                    y.broadcast(&dims, &b.budget)?,
                );
                b.budget.take(&dims)?;
                let v = c
                    .floats()
                    .iter()
                    .zip(x.floats())
                    .zip(y.floats())
                    .map(|((&c, x), y)| if c != 0.0 { x } else { y })
                    .collect();
                return one(konst(Const::f32(dims, v)));
            }
            one(b.op_on(Op::Where, &[c, x, y])?)
        }
        "Trilu" => trilu(b, a, inputs).map(|v| vec![v]),
        "Neg" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Abs" | "Relu" | "Tanh" | "Sigmoid"
        | "Sin" | "Cos" | "Softplus" | "Erf" | "Tan" | "Atan" | "Asin" | "Acos" | "Sinh"
        | "Cosh" | "Asinh" | "Acosh" | "Atanh" => {
            unary(b, op, arg(inputs, 0)?).map(|v| vec![v])
        }
        "Gelu" => match a.string("approximate", "none")?.as_str() {
            "none" => one(b.op_on(Op::Gelu, &[arg(inputs, 0)?])?),
            "tanh" => one(gelu_tanh(b, arg(inputs, 0)?)?),
            other => Err(format!("Gelu with approximate=\"{other}\"")),
        },
        "Pow" => {
            let x = arg(inputs, 0)?;
            // a computed or learnable exponent of a base positive by construction (GeM
            // pooling's `x.clamp(min=eps).pow(p)` and `.pow(1. / p)`): exp(e · ln x), so the
            // exponent takes its gradient (x^e · ln x, PyTorch's)
            let e = arg(inputs, 1)?;
            let learnable = matches!(e, Value::Param(_)) && b.elem_type(e) == dtype::FLOAT;
            // (a constant base takes `constant_base_power`'s exact ln c)
            if (learnable || matches!(e, Value::Node(_)))
                && matches!(x, Value::Node(_))
                && super::sign::positive(b, x)
            {
                let log = b.op_on(Op::Log, &[x])?;
                let scaled = b.op_on(Op::Mul, &[&log, e])?;
                return one(b.op_on(Op::Exp, &[&scaled])?);
            }
            let exponent = b
                .known(arg(inputs, 1)?)
                .and_then(|c| c.scalar().map(|e| (e, c.dims.clone())));
            // both known: evaluated at import, elementwise in f64 and rounded once
            // (`10000 ** (arange / d)`, RoPE's and DETR's frequencies, where the exporter
            // leaves the arange as a node of constants)
            if let (Some(c), Some(k)) = (b.folded(x), b.folded(arg(inputs, 1)?)) {
                let dims = broadcast_shapes(&c.dims, &k.dims)?;
                let (c, k) = (c.broadcast(&dims, &b.budget)?, k.broadcast(&dims, &b.budget)?);
                b.budget.take(&dims)?;
                if let (Data::I64(cs), Data::I64(ks)) = (&c.data, &k.data) {
                    // integers stay integers, exactly (ONNX's integer Pow)
                    let v = cs
                        .iter()
                        .zip(ks)
                        .map(|(&c, &k)| {
                            u32::try_from(k)
                                .ok()
                                .and_then(|k| c.checked_pow(k))
                                .ok_or_else(|| format!("Pow of the integer constants {c} and {k} (a negative exponent or an int64 overflow)"))
                        })
                        .collect::<Map<Vec<i64>>>()?;
                    return one(konst(Const {
                        dims,
                        data: Data::I64(v),
                    }));
                }
                let v = c
                    .floats()
                    .iter()
                    .zip(k.floats())
                    .map(|(&c, k)| (c as f64).powf(k as f64) as f32)
                    .collect();
                return one(konst(Const::f32(dims, v)));
            }
            let Some((e, e_dims)) = exponent else {
                if b.known(arg(inputs, 1)?).is_some() {
                    return Err(
                        "Pow with a non-scalar exponent (a constant exponent must be one number)"
                            .into(),
                    );
                }
                return one(constant_base_power(b, x, arg(inputs, 1)?)?);
            };
            let y = b.op_on(Op::Pow { exponent: e }, &[x])?;
            // a one-element exponent of higher rank broadcasts x up to its rank (leading
            // axes of extent 1), as numpy and ONNX do
            let x_dims = b.shape(x);
            if e_dims.len() > x_dims.len() {
                let mut out = vec![1; e_dims.len() - x_dims.len()];
                out.extend_from_slice(&x_dims);
                one(reshape(b, &y, out)?)
            } else {
                one(y)
            }
        }
        "Max" | "Min" => {
            let all: Vec<&Value> = inputs.iter().flatten().collect();
            let folded: Option<Vec<Rc<Const>>> = all.iter().map(|v| b.folded(v)).collect();
            if let Some(cs) = folded {
                return one(konst(fold_extremum(&cs, op == "Max", &b.budget)?));
            }
            // max(x, 0) with the zero a constant (the dynamo exporter's `x.clamp(min=0)`): `relu`,
            // the same values (−0 and NaN kept) without a gradient at x = 0 — PyTorch 2.15's
            // clamp — where `maximum` passed it at the tie (`d.clamp(min=0).sqrt()`: NaN
            // gradients; the forty-eighth session's audit)
            if let (true, [x, z]) = (op == "Max", all.as_slice()) {
                for (x, z) in [(*x, *z), (*z, *x)] {
                    let zero = b
                        .folded(z)
                        .is_some_and(|c| c.floats().iter().all(|&v| v == 0.0));
                    let keeps_shape =
                        broadcast_shapes(&b.shape(x), &b.shape(z)).ok() == Some(b.shape(x));
                    if zero && keeps_shape && b.folded(x).is_none() {
                        return one(b.op_on(Op::Relu, &[x])?);
                    }
                }
            }
            let mut acc = arg(inputs, 0)?.clone();
            for v in inputs.iter().skip(1).flatten() {
                let op = if op == "Max" {
                    Op::Maximum
                } else {
                    Op::Minimum
                };
                acc = b.op_on(op, &[&acc, v])?;
            }
            one(acc)
        }
        "Clip" => {
            // a bound computed at run time or held by a float initializer (a learnable
            // `torch.clamp(x, max=self.p)`): max with lo, then min with hi, as ONNX defines
            // Clip, so the bound takes its gradient (read as a constant, it silently had
            // none: an audit of the forty-fifth session)
            let runtime = |i: usize| {
                opt(inputs, i).is_some_and(|v| {
                    matches!(v, Value::Node(_))
                        || matches!(v, Value::Param(_)) && b.folded(v).is_none()
                })
            };
            if runtime(1) || runtime(2) {
                // maximum(x, lo), then minimum(·, hi): ONNX's Clip, and PyTorch 2.15's clamp
                // with tensor bounds — a tie shares the gradient half and half between x and
                // the bound, a NaN x stays NaN; a bound not given is ONNX's default, ±f32::MAX
                // (as the constant bounds': an infinite x becomes ±3.4e38)
                let mut y = arg(inputs, 0)?.clone();
                let sides = [
                    (1, Op::Maximum, (f32::MIN, f32::INFINITY)),
                    (2, Op::Minimum, (f32::NEG_INFINITY, f32::MAX)),
                ];
                for (i, op, (min, max)) in sides {
                    y = match opt(inputs, i) {
                        Some(bound) => b.op_on(op, &[&y, bound])?,
                        None => b.op_on(Op::Clamp { min, max }, &[&y])?,
                    };
                }
                return one(y);
            }
            let bound = |i: usize, d: f32| -> Map<f32> {
                match opt(inputs, i) {
                    None => Ok(d),
                    Some(v) => b
                        .known(v)
                        .and_then(|c| c.scalar())
                        .ok_or_else(|| "Clip bounds must be constants".to_string()),
                }
            };
            let (lo, hi) = (bound(1, f32::MIN)?, bound(2, f32::MAX)?);
            for (what, v) in [("min", lo), ("max", hi)] {
                if v.is_nan() {
                    return Err(format!("Clip's {what} bound is NaN"));
                }
            }
            if lo > hi {
                return Err(format!("Clip with min {lo} above max {hi}"));
            }
            // a constant is clipped at import (exporters' index arithmetic on constants:
            // 1-D interpolation's source positions)
            if let Some(c) = b.folded(arg(inputs, 0)?) {
                let f = move |v: f32| if v.is_nan() { v } else { v.max(lo).min(hi) };
                let i: Option<fn(i64) -> Option<i64>> = None;
                let clipped = match &c.data {
                    // integers against float bounds: exactly, in f64 (i64 → f64 is exact below 2^53)
                    Data::I64(v) => {
                        b.budget.take(&c.dims)?;
                        let out = v
                            .iter()
                            .map(|&x| (x as f64).max(lo as f64).min(hi as f64) as i64)
                            .collect();
                        Const {
                            dims: c.dims.clone(),
                            data: Data::I64(out),
                        }
                    }
                    _ => c.map(f, i, &b.budget)?,
                };
                return one(konst(clipped));
            }
            // a lower bound of exactly 0 (`clamp(min=0)`, `relu6`) through `relu` first: the
            // same values (relu(x) = max(x, 0), −0 and NaN kept), and no gradient at x = 0 —
            // PyTorch 2.15's clamp, relu6 and hardtanh rule — where `clamp` alone passes it;
            // `d.clamp(min=0).sqrt()` (pairwise distances, exactly 0 on the diagonal) had
            // inf · 1 = NaN gradients everywhere (the forty-eighth session's audit)
            let x = match lo == 0.0 {
                true => b.op_on(Op::Relu, &[arg(inputs, 0)?])?,
                false => arg(inputs, 0)?.clone(),
            };
            one(b.op_on(Op::Clamp { min: lo, max: hi }, &[&x])?)
        }
        "Softmax" | "LogSoftmax" => {
            let x = arg(inputs, 0)?;
            let axis = normalize_axis(a.int("axis", -1)?, b.shape(x).len())?;
            let op = if op == "Softmax" {
                Op::Softmax { axis }
            } else {
                Op::LogSoftmax { axis }
            };
            one(b.op_on(op, &[x])?)
        }
        "Transpose" => {
            let x = arg(inputs, 0)?;
            let rank = b.shape(x).len();
            let perm = match a.ints("perm")? {
                // the operator defines perm as axes in [0, rank): a negative entry is not a
                // Python-style index there (onnxruntime and the checker refuse it too)
                Some(p) if p.iter().any(|&v| v < 0) => {
                    return Err(format!(
                        "Transpose perm {p:?} has a negative entry (the operator's perm lists axes in [0, {rank}))"
                    ))
                }
                Some(p) => p
                    .iter()
                    .map(|&p| normalize_axis(p, rank))
                    .collect::<Map<Vec<_>>>()?,
                None => (0..rank).rev().collect(),
            };
            let mut sorted = perm.clone();
            sorted.sort_unstable();
            if sorted != (0..rank).collect::<Vec<_>>() {
                return Err(format!(
                    "perm {perm:?} is not a permutation of the {rank} axes"
                ));
            }
            match b.folded(x) {
                Some(c) => one(konst(c.transpose(&perm, &b.budget)?)),
                _ => one(b.op_on(Op::Permute { axes: perm }, &[x])?),
            }
        }
        "Reshape" => {
            let x = arg(inputs, 0)?;
            // `allowzero` exists from opset 14: before, it stays unread and is refused
            let allowzero = b.opset >= 14 && a.int("allowzero", 0)? != 0;
            let spec = b.ints(arg(inputs, 1)?, "shape")?;
            let dims = reshape_dims(&b.shape(x), &spec, allowzero)?;
            reshape(b, x, dims).map(|v| vec![v])
        }
        "Flatten" => {
            let x = arg(inputs, 0)?;
            let shape = b.shape(x);
            let axis = match a.int("axis", 1)? {
                v if v < 0 => v + shape.len() as i64,
                v => v,
            };
            if !(0..=shape.len() as i64).contains(&axis) {
                return Err(format!(
                    "Flatten axis out of range for rank {}",
                    shape.len()
                ));
            }
            let axis = axis as usize;
            let dims = vec![
                shape[..axis].iter().product(),
                shape[axis..].iter().product(),
            ];
            reshape(b, x, dims).map(|v| vec![v])
        }
        "Squeeze" | "Unsqueeze" => {
            let x = arg(inputs, 0)?;
            let shape = b.shape(x);
            let axes = match opt(inputs, 1) {
                Some(v) => Some(b.ints(v, "axes")?),
                None => None,
            };
            let dims = if op == "Squeeze" {
                match axes {
                    None => shape.iter().copied().filter(|&d| d != 1).collect(),
                    Some(axes) => {
                        let axes = axes
                            .iter()
                            .map(|&ax| normalize_axis(ax, shape.len()))
                            .collect::<Map<Vec<_>>>()?;
                        if axes.iter().any(|&ax| shape[ax] != 1) {
                            return Err(format!(
                                "Squeeze of axes {axes:?} of shape {shape:?}: not all of size 1"
                            ));
                        }
                        shape
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| !axes.contains(i))
                            .map(|(_, &d)| d)
                            .collect()
                    }
                }
            } else {
                let given = axes.ok_or("Unsqueeze needs axes")?;
                let rank = shape.len() + given.len();
                let axes = given
                    .iter()
                    .map(|&ax| normalize_axis(ax, rank))
                    .collect::<Map<Vec<_>>>()?;
                let mut unique = axes.clone();
                unique.sort_unstable();
                unique.dedup();
                if unique.len() != axes.len() {
                    return Err(format!(
                        "Unsqueeze axes {given:?} of a rank-{} tensor repeat an axis",
                        shape.len()
                    ));
                }
                let mut rest = shape.iter();
                (0..rank)
                    .map(|i| {
                        if axes.contains(&i) {
                            1
                        } else {
                            *rest.next().unwrap_or(&1)
                        }
                    })
                    .collect()
            };
            reshape(b, x, dims).map(|v| vec![v])
        }
        "Expand" => {
            let x = arg(inputs, 0)?;
            let spec = crate::constant::sizes(&b.ints(arg(inputs, 1)?, "shape")?)?;
            let dims = broadcast_shapes(&b.shape(x), &spec)?;
            match b.folded(x) {
                Some(c) => one(konst(c.broadcast(&dims, &b.budget)?)),
                None if dims == b.shape(x) => one(x.clone()),
                None => one(b.op_on(Op::BroadcastTo { shape: dims }, &[x])?),
            }
        }
        "Concat" => {
            let parts: Vec<&Value> = inputs.iter().flatten().collect();
            let rank = b.shape(parts.first().ok_or("Concat of no inputs")?).len();
            let axis = normalize_axis(a.int("axis", 0)?, rank)?;
            let folded: Option<Vec<Rc<Const>>> = parts.iter().map(|p| b.folded(p)).collect();
            match folded {
                Some(cs) => one(konst(Const::concat(
                    &cs.iter().map(|c| c.as_ref()).collect::<Vec<_>>(),
                    axis,
                    &b.budget,
                )?)),
                None => one(b.op_on(Op::Concat { axis }, &parts)?),
            }
        }
        "Gather" => {
            let (x, idx) = (arg(inputs, 0)?, arg(inputs, 1)?);
            let shape = b.shape(x);
            let axis = normalize_axis(a.int("axis", 0)?, shape.len())?;
            let Some(index) = b.known(idx) else {
                // indices computed at run time (token ids): index_select over the flattened
                // indices, which must lie in [0, n) (checked by the kernel). ONNX types them
                // as integers: an integer input, or elements moved from one.
                if !matches!(idx, Value::Node(id) if b.integral.contains(id)) {
                    return Err("Gather indices computed from float values (ONNX requires integer indices: an integer input or values moved from one)".into());
                }
                let ishape = b.shape(idx);
                let count: usize = ishape.iter().product();
                let flat = reshape(b, idx, vec![count])?;
                let flat = wrap_negative(b, &flat, shape[axis])?;
                let picked = b.op_on(Op::IndexSelect { axis }, &[x, &flat])?;
                let mut out_shape = shape[..axis].to_vec();
                out_shape.extend_from_slice(&ishape);
                out_shape.extend_from_slice(&shape[axis + 1..]);
                return one(reshape(b, &picked, out_shape)?);
            };
            if let Some(c) = b.folded(x) {
                return one(konst(c.gather(axis, &index, &b.budget)?));
            }
            let picks = index
                .ints()?
                .into_iter()
                .map(|i| normalize_index(i, shape[axis]))
                .collect::<Map<Vec<_>>>()?;
            let mut out_shape = shape[..axis].to_vec();
            out_shape.extend_from_slice(&index.dims);
            out_shape.extend_from_slice(&shape[axis + 1..]);
            let picked = super::pad::pick(b, x, axis, &picks)?;
            reshape(b, &picked, out_shape).map(|v| vec![v])
        }
        "GatherElements" => {
            // torch.gather: out[.., i, ..] = x[.., index[.., i, ..], ..] along `axis`; the
            // output has the index's shape (the shape rule of `gather` refuses the rest). What
            // torchlean's export writes for `gather`, so its exports import again.
            let (x, idx) = (arg(inputs, 0)?, arg(inputs, 1)?);
            let rank = b.shape(x).len();
            let axis = normalize_axis(a.int("axis", 0)?, rank)?;
            let n = b.shape(x).get(axis).copied().unwrap_or(0);
            let index = element_indices(b, "GatherElements", idx, n)?;
            one(b.op_on(Op::Gather { axis }, &[x, &index])?)
        }
        "Slice" => slice(b, inputs).map(|v| vec![v]),
        "Pad" => super::pad::pad(b, a, inputs).map(|v| vec![v]),
        "Split" => split(b, a, inputs),
        "ReduceMean" | "ReduceSum" => {
            let x = arg(inputs, 0)?;
            let keepdim = a.int("keepdims", 1)? != 0;
            let axes = reduction_axes(b, op, a, inputs, b.shape(x).len())?;
            if axes.is_empty() {
                // noop_with_empty_axes, or every axis of a 0-d value: the sum or mean of one
                // value is itself
                return one(x.clone());
            }
            let op = if op == "ReduceMean" {
                Op::ReduceMean { axes, keepdim }
            } else {
                Op::ReduceSum { axes, keepdim }
            };
            one(b.op_on(op, &[x])?)
        }
        "ReduceProd" => {
            // a constant's product (shape arithmetic) is evaluated at import; over computed
            // values, a pairwise product of slices (`composite::product`)
            let x = arg(inputs, 0)?;
            let keepdim = a.int("keepdims", 1)? != 0;
            let Some(c) = b.folded(x) else {
                let rank = b.shape(x).len();
                let axes = reduction_axes(b, op, a, inputs, rank)?;
                if axes.is_empty() {
                    return one(x.clone());
                }
                return one(super::composite::product(b, x, &axes, keepdim)?);
            };
            let axes = reduction_axes(b, op, a, inputs, c.dims.len())?;
            if axes.is_empty() {
                return one(konst((*c).clone()));
            }
            one(konst(c.reduce_product(&axes, keepdim, &b.budget)?))
        }
        "GlobalAveragePool" => {
            let x = arg(inputs, 0)?;
            let rank = b.shape(x).len();
            if rank < 3 {
                return Err("GlobalAveragePool of a tensor of rank < 3".into());
            }
            one(b.op_on(
                Op::ReduceMean {
                    axes: (2..rank).collect(),
                    keepdim: true,
                },
                &[x],
            )?)
        }
        "MatMul" => matmul(b, arg(inputs, 0)?, arg(inputs, 1)?).map(|v| vec![v]),
        "Gemm" => gemm(b, a, inputs).map(|v| vec![v]),
        "Conv" => super::window::conv(b, a, inputs).map(|v| vec![v]),
        "ConvTranspose" => super::window::conv_transpose(b, a, inputs).map(|v| vec![v]),
        "MaxPool" | "AveragePool" => {
            super::window::pool(b, op, a, arg(inputs, 0)?).map(|v| vec![v])
        }
        "BatchNormalization" => batch_norm(b, a, inputs).map(|v| vec![v]),
        "LayerNormalization" => layer_norm(b, a, inputs),
        op if super::composite::is_activation(op) => {
            one(super::composite::activation(b, op, a, inputs)?)
        }
        "ReduceL1" | "ReduceL2" | "ReduceSumSquare" => {
            one(super::composite::norm_reduction(b, op, a, inputs)?)
        }
        "InstanceNormalization" => one(super::composite::instance_norm(b, a, inputs)?),
        "ReduceMax" | "ReduceMin" | "ReduceLogSumExp" | "GlobalMaxPool" => {
            one(super::composite::max_reduction(b, op, a, inputs)?)
        }
        "ArgMax" | "ArgMin" => one(arg_extreme(b, op, a, inputs)?),
        "Resize" => one(super::resize::resize(b, a, inputs)?),
        "SoftmaxCrossEntropyLoss" | "NegativeLogLikelihoodLoss" => {
            super::loss::nll(b, op, a, inputs)
        }
        "Tile" => tile(b, inputs).map(|v| vec![v]),
        "CumSum" => cumsum(b, a, inputs).map(|v| vec![v]),
        "Einsum" => {
            let equation = a.string("equation", "")?;
            one(super::einsum::einsum(b, &equation, inputs)?)
        }
        "DepthToSpace" | "SpaceToDepth" => depth_space(b, op, a, inputs).map(|v| vec![v]),
        "TopK" => {
            let (largest, axis) = (a.int("largest", 1)? != 0, a.int("axis", -1)?);
            // every order is sorted here (ONNX leaves `sorted = 0`'s order open)
            a.int("sorted", 1)?;
            let (values, indices) = super::topk::topk(b, axis, largest, inputs)?;
            if let Value::Node(id) = indices {
                b.integral.insert(id);
            }
            Ok(vec![values, indices])
        }
        "Floor" | "Ceil" | "Round" => {
            // exact (each result is a float32 integer), zero gradient as PyTorch's; Round
            // rounds half to even, as ONNX and torch.round
            one(unary(b, op, arg(inputs, 0)?)?)
        }
        "Sign" => {
            // 1 above 0, -1 below, 0 at ±0, NaN at NaN (as numpy, onnxruntime and tract;
            // PyTorch's sign(NaN) is 0), with no gradient anywhere (PyTorch's is 0): the NaN
            // is x·0, whose gradient is 0
            let x = arg(inputs, 0)?;
            // a constant's sign at import (exporters compute indices from constants through
            // it: `AdaptiveAvgPool`'s and 1-D interpolation's window bounds, which stayed
            // run-time values of unknown magnitude and were refused)
            if let Some(c) = b.folded(x) {
                let f = |v: f32| {
                    if v > 0.0 {
                        1.0
                    } else if v < 0.0 {
                        -1.0
                    } else if v == 0.0 {
                        0.0
                    } else {
                        v
                    }
                };
                let i: Option<fn(i64) -> Option<i64>> = Some(|v: i64| Some(v.signum()));
                return one(konst(c.map(f, i, &b.budget)?));
            }
            let zero = konst(Const::f32(vec![], vec![0.0]));
            let (gt, lt, ne) = (Relation::Gt, Relation::Lt, Relation::Ne);
            let above = b.op_on(Op::Compare { relation: gt }, &[x, &zero])?;
            let below = b.op_on(Op::Compare { relation: lt }, &[x, &zero])?;
            let s = b.op_on(Op::Sub, &[&above, &below])?;
            let nan = b.op_on(Op::Compare { relation: ne }, &[x, x])?;
            let nan_value = b.op_on(Op::Scale { factor: 0.0 }, &[x])?;
            one(b.op_on(Op::Where, &[&nan, &nan_value, &s])?)
        }
        "RNN" => super::recurrent::rnn(b, a, inputs),
        "EyeLike" => one(super::scatter::eye_like(b, a, inputs)?),
        "GatherND" => one(super::scatter::gather_nd(b, a, inputs)?),
        "ScatterND" => one(super::scatter::scatter_nd(b, a, inputs)?),
        "ScatterElements" => one(super::scatter::scatter_elements(b, a, inputs)?),
        "OneHot" => one(super::scatter::one_hot(b, a, inputs)?),
        "GRU" => super::recurrent::gru(b, a, inputs),
        "LSTM" => super::recurrent::lstm(b, a, inputs),
        _ => Err(format!("no torchlean mapping for `{op}`")),
    }
}

/// Whether `v` holds integers (int64/int32/bool: an integer or boolean input, a value the
/// import tracks as integral, an integer constant or initializer).
/// 1 − x (exact for the 0/1 values of a boolean): `Not`, and the comparisons' forms.
fn one_minus(b: &mut Builder, x: &Value) -> Map<Value> {
    let neg = b.op_on(Op::Scale { factor: -1.0 }, &[x])?;
    b.op_on(Op::AddScalar { value: 1.0 }, &[&neg])
}

/// `Pow(c, e)` with a computed exponent `e` and a positive scalar constant base `c`
/// (`2.0 ** x`, `10000 ** (i / d)` over computed i): exp(e · ln c), ln c computed in f64 and
/// rounded once; the gradient is `exp`'s times ln c, PyTorch's `result · log(base)`. The value
/// is within a few ulps times |e · ln c| of the correctly rounded power (PyTorch's `pow` is
/// within an ulp). c = 1 is 1 everywhere (as IEEE `pow(1, ±inf)`), with no gradient. A
/// computed base, a base of several elements, and a base ≤ 0, infinite or NaN are refused:
/// exp(e · ln x) is NaN where `pow` is defined for negative bases and integer exponents, and
/// its gradient is wrong at x = 0. A float initializer base is a parameter (below).
fn constant_base_power(b: &mut Builder, base: &Value, e: &Value) -> Map<Value> {
    // a float initializer holding the base is a parameter: exp(e · log(base)) through the
    // graph's `log`, so that it takes its gradient (e · base^(e − 1), PyTorch's), if its
    // value is one positive finite number
    if let Value::Param(name) = base {
        let value = b
            .initializers
            .get(name)
            .filter(|c| matches!(c.data, Data::F32(_)))
            .and_then(|c| c.scalar());
        if let Some(c) = value {
            if !(c.is_finite() && c > 0.0) {
                return Err(format!(
                    "Pow with the base `{name}` = {c} and a computed exponent (a positive finite base is required)"
                ));
            }
            let log = b.op_on(Op::Log, &[base])?;
            let scaled = b.op_on(Op::Mul, &[e, &log])?;
            return b.op_on(Op::Exp, &[&scaled]);
        }
    }
    let c = b
        .known(base)
        .and_then(|c| c.scalar())
        .ok_or("Pow with a computed exponent and a computed or non-scalar base (only a positive constant base is supported: exp(e · ln c))")?;
    if !(c.is_finite() && c > 0.0) {
        return Err(format!(
            "Pow with the base {c} and a computed exponent (a positive finite base is required)"
        ));
    }
    let e_dims = b.shape(e);
    let out_dims = broadcast_shapes(&b.shape(base), &e_dims)?;
    let y = if c == 1.0 {
        let count = b.budget.take(&out_dims)?;
        return Ok(konst(Const::f32(out_dims, vec![1.0; count])));
    } else {
        let scaled = b.op_on(
            Op::Scale {
                factor: (c as f64).ln() as f32,
            },
            &[e],
        )?;
        b.op_on(Op::Exp, &[&scaled])?
    };
    if out_dims != e_dims {
        return reshape(b, &y, out_dims);
    }
    Ok(y)
}

/// The indices of an element-wise index operator (`GatherElements`, `ScatterElements`) along
/// an axis of `n`: constant ones with negative entries counted from the end (ONNX), as f32
/// values; run-time integers through [`wrap_negative`] (the kernel checks the range); float
/// values refused.
pub(super) fn element_indices(b: &mut Builder, op: &str, idx: &Value, n: usize) -> Map<Value> {
    match b.known(idx) {
        Some(c) => {
            let picks = c
                .ints()?
                .into_iter()
                .map(|i| normalize_index(i, n).map(|p| p as f32))
                .collect::<Map<Vec<f32>>>()?;
            Ok(konst(Const::f32(c.dims.clone(), picks)))
        }
        None if matches!(idx, Value::Node(id) if b.integral.contains(id)) => wrap_negative(b, idx, n),
        None => Err(format!(
            "{op} indices computed from float values (ONNX requires integer indices: an integer input or values moved from one)"
        )),
    }
}

/// Run-time integer indices with ONNX's negative ones counted from the end: i + n·(i < 0),
/// exact on float32 integers. What is still outside [0, n) — below −n, or n and above — the
/// index kernel refuses at run time (negative indices were refused there too until the
/// forty-eighth session, where ONNX's Gather takes them).
pub(super) fn wrap_negative(b: &mut Builder, idx: &Value, n: usize) -> Map<Value> {
    let zero = konst(Const::f32(vec![], vec![0.0]));
    let negative = b.op_on(
        Op::Compare {
            relation: Relation::Lt,
        },
        &[idx, &zero],
    )?;
    let shift = b.op_on(Op::Scale { factor: n as f32 }, &[&negative])?;
    let wrapped = b.op_on(Op::Add, &[idx, &shift])?;
    if let Value::Node(id) = &wrapped {
        b.integral.insert(*id);
    }
    Ok(wrapped)
}

/// Marks a computed value as a boolean held as 0/1 (and an integer value).
fn mark_boolean(b: &mut Builder, v: Value) -> Value {
    if let Value::Node(id) = &v {
        b.boolean.insert(*id);
        b.integral.insert(*id);
    }
    v
}

/// The negation of a boolean constant.
fn not_const(c: &Const) -> Const {
    Const {
        dims: c.dims.clone(),
        data: Data::Bool(c.floats().iter().map(|&v| v == 0.0).collect()),
    }
}

/// A comparison computed at run time: torchlean's `compare` (1 where the IEEE relation holds,
/// else 0; exact for floats and for the integers float32 holds), a boolean of the graph
/// (`Not`, `And`, `Or`, `Xor` and `Where` take it) with no gradient, as PyTorch's boolean
/// results: `torch.where(x > 0, ...)`, `masked_fill(x < t, ...)`, a padding mask from token
/// ids (`ids == pad`), a causal mask from position indices, `isnan`/`isinf` (`IsNaN` as
/// x ≠ x, `IsInf` as |x| = ∞).
fn compare(b: &mut Builder, relation: Relation, x: &Value, y: &Value) -> Map<Value> {
    let v = b.op_on(Op::Compare { relation }, &[x, y])?;
    Ok(mark_boolean(b, v))
}

/// ArgMax / ArgMin: torchlean's `argmax` (of −x for ArgMin) along `axis` — the first of
/// tied extremes, a NaN ranked above every number (PyTorch's `argmax`/`argmin`) —, the axis
/// kept as 1 with `keepdims` (the default). The indices are an integer value of the graph
/// (a `Gather` may take them). `select_last_index = 1` is refused.
fn arg_extreme(b: &mut Builder, op: &str, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    if shape.is_empty() {
        return Err(format!("{op} of a 0-d value (ONNX requires rank >= 1)"));
    }
    let axis = normalize_axis(a.int("axis", 0)?, shape.len())?;
    let keep = a.int("keepdims", 1)? != 0;
    if a.int("select_last_index", 0)? != 0 {
        return Err(format!(
            "{op} with select_last_index = 1 (the last of tied extremes): torchlean's argmax picks the first"
        ));
    }
    if shape[axis] == 0 {
        return Err(format!("{op} over the empty axis {axis} of {shape:?}"));
    }
    let src = if op == "ArgMin" {
        b.op_on(Op::Neg, &[x])?
    } else {
        x.clone()
    };
    let m = b.op_on(Op::Argmax { axis }, &[&src])?;
    if keep {
        let mut dims = shape;
        dims[axis] = 1;
        reshape(b, &m, dims)
    } else {
        Ok(m)
    }
}

impl Attrs<'_> {
    /// `ConstantOfShape`'s optional `value` tensor.
    fn get_tensor_value(&self) -> Map<Option<Const>> {
        match self.tensor("value")? {
            Some(t) => Const::from_proto(t).map(Some),
            None => Ok(None),
        }
    }
}

/// The axes a reduction node names, sorted and distinct. The model's opset decides the
/// form: ReduceSum takes `axes` as an input and has `noop_with_empty_axes` from opset 13, the
/// other reductions from opset 18 (before, `axes` is an attribute); an attribute or input of
/// the other form stays unread and is refused. No axes means every axis; empty when
/// `noop_with_empty_axes` asks for no reduction or the value is 0-d.
pub(super) fn reduction_axes(
    b: &Builder,
    op: &str,
    a: &Attrs,
    inputs: &[Option<Value>],
    rank: usize,
) -> Map<Vec<usize>> {
    let new_form = op == "ReduceSum" || b.opset >= 18;
    let noop = new_form && a.int("noop_with_empty_axes", 0)? != 0;
    let axes = if new_form {
        opt(inputs, 1).map(|v| b.ints(v, "axes")).transpose()?
    } else {
        if inputs.len() > 1 {
            return Err(format!(
                "{op} in opset {} takes `axes` as an attribute, not as an input (the input form is opset 18's)",
                b.opset
            ));
        }
        a.ints("axes")?
    };
    let mut axes = match axes {
        Some(ax) if !ax.is_empty() => ax
            .iter()
            .map(|&ax| normalize_axis(ax, rank))
            .collect::<Map<Vec<_>>>()?,
        _ if noop || rank == 0 => vec![],
        _ => (0..rank).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    Ok(axes)
}

/// GELU's tanh approximation as ONNX (opset 20) and PyTorch (`approximate="tanh"`) define it,
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, op by op (torchlean's `gelu` is the erf form).
fn gelu_tanh(b: &mut Builder, x: &Value) -> Map<Value> {
    let cube = b.op_on(Op::Pow { exponent: 3.0 }, &[x])?;
    let cube = b.op_on(Op::Scale { factor: 0.044715 }, &[&cube])?;
    let inner = b.op_on(Op::Add, &[x, &cube])?;
    let inner = b.op_on(
        Op::Scale {
            factor: (2.0 / std::f32::consts::PI).sqrt(),
        },
        &[&inner],
    )?;
    let t = b.op_on(Op::Tanh, &[&inner])?;
    let t = b.op_on(Op::AddScalar { value: 1.0 }, &[&t])?;
    let half = b.op_on(Op::Scale { factor: 0.5 }, &[x])?;
    b.op_on(Op::Mul, &[&half, &t])
}

fn unary(b: &mut Builder, op: &str, x: &Value) -> Map<Value> {
    let op = match op {
        "Neg" => Op::Neg,
        "Sqrt" => Op::Sqrt,
        "Reciprocal" => Op::Inv,
        "Exp" => Op::Exp,
        "Log" => Op::Log,
        "Abs" => Op::Abs,
        "Relu" => Op::Relu,
        "Tanh" => Op::Tanh,
        "Sigmoid" => Op::Sigmoid,
        "Sin" => Op::Sin,
        "Cos" => Op::Cos,
        "Erf" => Op::Erf,
        "Tan" => Op::Tan,
        "Atan" => Op::Atan,
        "Asin" => Op::Asin,
        "Acos" => Op::Acos,
        "Sinh" => Op::Sinh,
        "Cosh" => Op::Cosh,
        "Asinh" => Op::Asinh,
        "Acosh" => Op::Acosh,
        "Atanh" => Op::Atanh,
        "Floor" => Op::Round {
            mode: RoundMode::Floor,
        },
        "Ceil" => Op::Round {
            mode: RoundMode::Ceil,
        },
        "Round" => Op::Round {
            mode: RoundMode::HalfEven,
        },
        _ => Op::Softplus,
    };
    if let Some(c) = b.folded(x) {
        // folded with the reference kernel's own formula (the spec at f32: stable softplus,
        // sigmoid), so a folded value is the one the graph would compute
        let f = |v: f32| torchlean::spec::unary_f32(&op, v).unwrap_or(f32::NAN);
        let i: Option<fn(i64) -> Option<i64>> = match op {
            Op::Neg => Some(i64::checked_neg),
            Op::Abs => Some(i64::checked_abs),
            // an integer is its own floor, ceiling and rounding
            Op::Round { .. } => Some(Some),
            _ => None,
        };
        return Ok(konst(c.map(f, i, &b.budget)?));
    }
    b.op_on(op, &[x])
}

/// Add/Sub/Mul/Div. A one-element constant on a side whose shape it does not widen becomes
/// a scalar op (`scale`, `add_scalar`: the same f32 operation, no constant tensor).
fn binary(b: &mut Builder, op: &str, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let (x, y) = (arg(inputs, 0)?, arg(inputs, 1)?);
    if let (Some(cx), Some(cy)) = (b.folded(x), b.folded(y)) {
        let bin = match op {
            "Add" => Binary::Add,
            "Sub" => Binary::Sub,
            "Mul" => Binary::Mul,
            _ => Binary::Div,
        };
        return Ok(vec![konst(cx.binary(&cy, bin, &b.budget)?)]);
    }
    let (sx, sy) = (b.shape(x), b.shape(y));
    let scalar_of = |v: &Value, other: &[usize], own: &[usize]| {
        b.folded(v)
            .filter(|c| own.len() <= other.len() && matches!(c.data, Data::F32(_)))
            .and_then(|c| c.scalar())
    };
    let out = match (op, scalar_of(y, &sx, &sy), scalar_of(x, &sy, &sx)) {
        ("Mul", Some(c), _) => b.op_on(Op::Scale { factor: c }, &[x])?,
        ("Mul", _, Some(c)) => b.op_on(Op::Scale { factor: c }, &[y])?,
        ("Add", Some(c), _) => b.op_on(Op::AddScalar { value: c }, &[x])?,
        ("Add", _, Some(c)) => b.op_on(Op::AddScalar { value: c }, &[y])?,
        // x − c = x + (−c) exactly in IEEE arithmetic
        ("Sub", Some(c), _) => b.op_on(Op::AddScalar { value: -c }, &[x])?,
        _ => {
            let op = match op {
                "Add" => Op::Add,
                "Sub" => Op::Sub,
                "Mul" => Op::Mul,
                _ => Op::Div,
            };
            b.op_on(op, &[x, y])?
        }
    };
    Ok(vec![out])
}

/// The operands of a folded binary op broadcast to their common shape (counted against the
/// budget).
fn broadcast_all(
    cs: &[Rc<Const>],
    budget: &crate::constant::Budget,
) -> Map<(Vec<usize>, Vec<Const>)> {
    let mut dims: Vec<usize> = vec![];
    for c in cs {
        dims = broadcast_shapes(&dims, &c.dims)?;
    }
    let wide = cs
        .iter()
        .map(|c| {
            if c.dims == dims {
                Ok(c.as_ref().clone())
            } else {
                c.broadcast(&dims, budget)
            }
        })
        .collect::<Map<Vec<Const>>>()?;
    budget.take(&dims)?;
    Ok((dims, wide))
}

/// `Max`/`Min` of constants (shape arithmetic such as `max(1, n)`): in i64 when every operand
/// is an integer, else in f32 with NaN winning (torchlean's `maximum`/`minimum`).
fn fold_extremum(cs: &[Rc<Const>], max: bool, budget: &crate::constant::Budget) -> Map<Const> {
    let (dims, wide) = broadcast_all(cs, budget)?;
    if wide.iter().any(|c| matches!(c.data, Data::Bool(_))) {
        return Err("Max/Min of boolean values".into());
    }
    if wide.iter().all(|c| matches!(c.data, Data::I64(_))) {
        let cols = wide.iter().map(|c| c.ints()).collect::<Map<Vec<_>>>()?;
        let n: usize = dims.iter().product();
        let v = (0..n)
            .map(|i| {
                let it = cols.iter().map(|c| c[i]);
                if max { it.max() } else { it.min() }.unwrap_or(0)
            })
            .collect();
        return Ok(Const {
            dims,
            data: Data::I64(v),
        });
    }
    let cols: Vec<Vec<f32>> = wide.iter().map(|c| c.floats()).collect();
    let n: usize = dims.iter().product();
    let pick = |p: f32, q: f32| {
        if p.is_nan() || q.is_nan() {
            f32::NAN
        } else if (q > p) == max && q != p {
            q
        } else {
            p
        }
    };
    let v = (0..n)
        .map(|i| cols.iter().map(|c| c[i]).reduce(pick).unwrap_or(f32::NAN))
        .collect();
    Ok(Const::f32(dims, v))
}

/// ONNX `Mod` of constants (PyTorch's exporter writes one in `nn.TransformerEncoderLayer`'s
/// shape checks). Integers, in i64: `fmod=0` takes the sign of the divisor (Python's `%`),
/// `fmod=1` the sign of the dividend (C's `fmod`); a zero divisor is refused. Floats, in
/// f32, need `fmod=1` (the spec's rule) and are C's `fmod` (NaN for a zero divisor).
fn fold_mod(x: &Const, y: &Const, fmod: i64, budget: &crate::constant::Budget) -> Map<Const> {
    if !matches!(fmod, 0 | 1) {
        return Err(format!("Mod with fmod={fmod} (0 or 1)"));
    }
    if matches!(x.data, Data::Bool(_)) || matches!(y.data, Data::Bool(_)) {
        return Err("Mod of boolean values".into());
    }
    let floats = matches!(x.data, Data::F32(_)) || matches!(y.data, Data::F32(_));
    if floats && fmod == 0 {
        return Err(
            "Mod of floating-point values with fmod=0 (ONNX requires fmod=1 for them)".into(),
        );
    }
    let (dims, wide) = broadcast_all(&[Rc::new(x.clone()), Rc::new(y.clone())], budget)?;
    if floats {
        let (p, q) = (wide[0].floats(), wide[1].floats());
        // Rust's `%` on floats is C's fmod
        let v = p.iter().zip(&q).map(|(a, b)| a % b).collect();
        return Ok(Const::f32(dims, v));
    }
    let (p, q) = (wide[0].ints()?, wide[1].ints()?);
    let v = p
        .iter()
        .zip(&q)
        .map(|(&a, &d)| {
            if d == 0 {
                return Err(format!("Mod of {a} by zero at import time"));
            }
            // wrapping: i64::MIN % −1 is 0 (the only case that overflows)
            let r = a.wrapping_rem(d);
            Ok(if fmod == 0 && r != 0 && (r < 0) != (d < 0) {
                r + d
            } else {
                r
            })
        })
        .collect::<Map<Vec<i64>>>()?;
    Ok(Const {
        dims,
        data: Data::I64(v),
    })
}

/// ONNX `Reshape`'s target: 0 copies the input's dim (unless `allowzero`), −1 is inferred.
fn reshape_dims(shape: &[usize], spec: &[i64], allowzero: bool) -> Map<Vec<usize>> {
    let total: usize = shape.iter().product();
    let mut dims = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                dims.push(1);
            }
            0 if !allowzero => dims.push(
                *shape
                    .get(i)
                    .ok_or("Reshape copies a dim the input does not have")?,
            ),
            d if d >= 0 => dims.push(d as usize),
            _ => return Err(format!("Reshape to {spec:?}: bad dimension {d}")),
        }
    }
    crate::constant::sizes(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
    if let Some(i) = infer {
        let known: usize = dims.iter().product();
        if known == 0 || total % known != 0 {
            return Err(format!(
                "Reshape of {shape:?} to {spec:?}: cannot infer the -1"
            ));
        }
        dims[i] = total / known;
    }
    if dims.iter().product::<usize>() != total {
        return Err(format!(
            "Reshape of {shape:?} ({total} elements) to {dims:?}"
        ));
    }
    Ok(dims)
}

pub(super) fn reshape(b: &mut Builder, x: &Value, dims: Vec<usize>) -> Map<Value> {
    if let Some(c) = b.folded(x) {
        return Ok(konst(c.reshaped(dims, &b.budget)?));
    }
    if b.shape(x) == dims {
        return Ok(x.clone());
    }
    b.op_on(Op::Reshape { shape: dims }, &[x])
}

fn slice(b: &mut Builder, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let starts = b.ints(arg(inputs, 1)?, "starts")?;
    let ends = b.ints(arg(inputs, 2)?, "ends")?;
    let axes = match opt(inputs, 3) {
        Some(v) => b.ints(v, "axes")?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match opt(inputs, 4) {
        Some(v) => b.ints(v, "steps")?,
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice's starts, ends, axes and steps differ in length".into());
    }
    let mut ranges: Vec<(usize, crate::constant::Stride)> = vec![];
    for i in 0..starts.len() {
        let axis = normalize_axis(axes[i], shape.len())?;
        if ranges.iter().any(|(a, _)| *a == axis) {
            return Err(format!("Slice axes {axes:?} repeat axis {axis}"));
        }
        ranges.push((
            axis,
            slice_range(starts[i], ends[i], steps[i], shape[axis])?,
        ));
    }
    if let Some(c) = b.folded(x) {
        return Ok(konst(c.slice(&ranges, &b.budget)?));
    }
    let mut out = x.clone();
    for (axis, keep) in &ranges {
        if keep.len == shape[*axis] && keep.step == 1 {
            continue;
        }
        if keep.step != 1 {
            // strided or reversed: the kept positions as an index list
            let picks: Vec<usize> = keep.indices().collect();
            out = super::pad::pick(b, &out, *axis, &picks)?;
            continue;
        }
        out = b.op_on(
            Op::Slice {
                axis: *axis,
                start: keep.start,
                end: keep.start + keep.len,
            },
            &[&out],
        )?;
    }
    Ok(out)
}

fn split(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let axis = normalize_axis(a.int("axis", 0)?, shape.len())?;
    let len = shape[axis];
    // `num_outputs` exists from opset 18; before, the parts are as many as the node's
    // outputs, and equal
    let outputs = a.output_count();
    let sizes: Vec<usize> = match opt(inputs, 1) {
        Some(v) => split_sizes(&b.ints(v, "split")?, len, "Split")?,
        None if b.opset >= 18 => {
            let n = a.int("num_outputs", 0)?;
            if n <= 0 {
                return Err("Split without `split` sizes needs num_outputs".into());
            }
            if n as usize != outputs {
                return Err(format!(
                    "Split with num_outputs={n} but {outputs} output(s)"
                ));
            }
            let n = n as usize;
            let chunk = len.div_ceil(n);
            let sizes: Vec<usize> = (0..n)
                .map(|i| chunk.min(len.saturating_sub(i * chunk)))
                .collect();
            // parts of ⌈len/n⌉ with a shorter (possibly empty) last one, as onnxruntime
            // splits them (3, 3, 3, 0 for 4 parts of 9); a count whose parts would overrun
            // the axis (2, 2, 2 and −1 for 4 parts of 5) is refused, as onnxruntime refuses it
            if chunk * (n - 1) > len {
                return Err(format!(
                    "Split of an axis of length {len} into num_outputs={n} parts of {chunk}: the last part would have a negative length ({len} − {} · {chunk})",
                    n - 1
                ));
            }
            sizes
        }
        None => {
            if outputs == 0 || len % outputs != 0 {
                return Err(format!(
                    "Split of an axis of length {len} into {outputs} equal parts (opset {} needs equal parts, or `split` sizes)",
                    b.opset
                ));
            }
            vec![len / outputs; outputs]
        }
    };
    split_parts(b, x, axis, &sizes)
}

/// Explicit split sizes: non-negative and summing to the axis length `len`.
pub(super) fn split_sizes(given: &[i64], len: usize, op: &str) -> Map<Vec<usize>> {
    let sizes = given
        .iter()
        .map(|&s| usize::try_from(s))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| format!("{op} sizes {given:?}: a size is negative"))?;
    if sizes.iter().try_fold(0usize, |n, &s| n.checked_add(s)) != Some(len) {
        return Err(format!(
            "{op} sizes {given:?} do not sum to the axis length {len}"
        ));
    }
    Ok(sizes)
}

/// `x` cut along `axis` into consecutive parts of `sizes` (slices; a constant is sliced at
/// import).
pub(super) fn split_parts(
    b: &mut Builder,
    x: &Value,
    axis: usize,
    sizes: &[usize],
) -> Map<Vec<Value>> {
    let mut start = 0;
    let mut outs = vec![];
    for &s in sizes {
        let range = crate::constant::Stride {
            start,
            step: 1,
            len: s,
        };
        outs.push(match b.folded(x) {
            Some(c) => konst(c.slice(&[(axis, range)], &b.budget)?),
            None => b.op_on(
                Op::Slice {
                    axis,
                    start,
                    end: start + s,
                },
                &[x],
            )?,
        });
        start += s;
    }
    Ok(outs)
}

/// NumPy matmul: 1-D operands are promoted and their axis removed after; batch dims broadcast.
fn matmul(b: &mut Builder, x: &Value, y: &Value) -> Map<Value> {
    let (sx, sy) = (b.shape(x), b.shape(y));
    if sx.is_empty() || sy.is_empty() {
        return Err("MatMul of a scalar".into());
    }
    let x2 = if sx.len() == 1 {
        reshape(b, x, vec![1, sx[0]])?
    } else {
        x.clone()
    };
    let y2 = if sy.len() == 1 {
        reshape(b, y, vec![sy[0], 1])?
    } else {
        y.clone()
    };
    let (mut ax, mut ay) = (b.shape(&x2), b.shape(&y2));
    let (mut x2, mut y2) = (x2, y2);
    if ax.len() > 2 && ay.len() > 2 && ax[..ax.len() - 2] != ay[..ay.len() - 2] {
        let batch = broadcast_shapes(&ax[..ax.len() - 2], &ay[..ay.len() - 2])?;
        let widen = |s: &[usize]| [batch.as_slice(), &s[s.len() - 2..]].concat();
        let (wx, wy) = (widen(&ax), widen(&ay));
        if wx != ax {
            x2 = b.op_on(Op::BroadcastTo { shape: wx.clone() }, &[&x2])?;
        }
        if wy != ay {
            y2 = b.op_on(Op::BroadcastTo { shape: wy.clone() }, &[&y2])?;
        }
        (ax, ay) = (wx, wy);
    }
    let _ = (&ax, &ay);
    let out = b.op_on(Op::Matmul, &[&x2, &y2])?;
    // drop exactly the promoted axes: y's (the last) when y was 1-D, x's (the second to
    // last of the product) when x was 1-D
    let mut dims = b.shape(&out);
    let rank = dims.len();
    if sx.len() == 1 && sy.len() == 1 {
        dims.truncate(rank - 2);
    } else if sy.len() == 1 {
        dims.pop();
    } else if sx.len() == 1 {
        dims.remove(rank - 2);
    }
    reshape(b, &out, dims)
}

/// `alpha · A' · B' + beta · C`: a `linear` when B is transposed (PyTorch's layout).
fn gemm(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    if b.shape(x).len() != 2 || b.shape(w).len() != 2 {
        return Err(format!(
            "Gemm of shapes {:?} and {:?}: both operands must be 2-D",
            b.shape(x),
            b.shape(w)
        ));
    }
    let (alpha, beta) = (a.float("alpha", 1.0)?, a.float("beta", 1.0)?);
    let (ta, tb) = (a.int("transA", 0)? != 0, a.int("transB", 0)? != 0);
    let x = if ta {
        b.op_on(Op::Permute { axes: vec![1, 0] }, &[x])?
    } else {
        x.clone()
    };
    // linear wants the weight as [out, in]: B as given when transB, else transposed
    let w = if tb {
        w.clone()
    } else {
        b.op_on(Op::Permute { axes: vec![1, 0] }, &[w])?
    };
    // beta = 0 ignores C entirely (onnxruntime, and PyTorch's addmm: an infinite or NaN C
    // must not become 0·∞ = NaN). alpha = 0 is not analogous: onnxruntime computes 0·(A·B),
    // NaN where A·B is infinite or NaN, and so does the import.
    let c = opt(inputs, 2).filter(|_| beta != 0.0);
    let n = b.shape(&w)[0];
    let fused_bias = c.filter(|c| beta == 1.0 && alpha == 1.0 && b.shape(c) == [n]);
    let mut out = match fused_bias {
        Some(c) => b.op_on(Op::Linear, &[&x, &w, c])?,
        None => b.op_on(Op::Linear, &[&x, &w])?,
    };
    if alpha != 1.0 {
        out = b.op_on(Op::Scale { factor: alpha }, &[&out])?;
    }
    if let (Some(c), None) = (c, fused_bias) {
        let c = if beta != 1.0 {
            b.op_on(Op::Scale { factor: beta }, &[c])?
        } else {
            c.clone()
        };
        out = b.op_on(Op::Add, &[&out, &c])?;
    }
    Ok(out)
}

/// Inference-mode batch norm: `x · gain + shift` with `gain = scale / √(var + eps)` and
/// `shift = bias − mean · gain` per channel (axis 1), computed in the graph from the
/// statistics and affine parameters, which stay parameters (their gradients are reported).
fn batch_norm(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    // `training_mode` exists from opset 14 (before, it stays unread: refused)
    if b.opset >= 14 && a.int("training_mode", 0)? != 0 {
        return Err("training_mode=1 (export in eval mode)".into());
    }
    let eps = a.float("epsilon", 1e-5)?;
    a.float("momentum", 0.9)?; // only used in training mode
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    if shape.len() < 2 {
        return Err("BatchNormalization of a tensor of rank < 2".into());
    }
    let c = shape[1];
    let per_channel: Vec<usize> = std::iter::once(c)
        .chain(std::iter::repeat_n(1, shape.len() - 2))
        .collect();
    let mut column = |v: &Value| -> Map<Value> {
        if b.shape(v) != [c] {
            return Err(format!(
                "BatchNormalization parameters must have shape [{c}]"
            ));
        }
        reshape(b, v, per_channel.clone())
    };
    let (scale, bias, mean, var) = (
        column(arg(inputs, 1)?)?,
        column(arg(inputs, 2)?)?,
        column(arg(inputs, 3)?)?,
        column(arg(inputs, 4)?)?,
    );
    // per channel gain = scale / √(var + eps); y = (x − mean) · gain + bias. Not the folded
    // x · gain + (bias − mean · gain), one pass fewer: its gradients with respect to the
    // scale and the mean are differences of two large sums when |mean| ≫ the spread of x
    // (1.4% off PyTorch's with mean 1000 and variance 0.01: found by a PyTorch-oracle audit)
    let var_eps = b.op_on(Op::AddScalar { value: eps }, &[&var])?;
    let std = b.op_on(Op::Sqrt, &[&var_eps])?;
    let inv_std = b.op_on(Op::Inv, &[&std])?;
    let gain = b.op_on(Op::Mul, &[&scale, &inv_std])?;
    let centered = b.op_on(Op::Sub, &[x, &mean])?;
    let scaled = b.op_on(Op::Mul, &[&centered, &gain])?;
    b.op_on(Op::Add, &[&scaled, &bias])
}

/// Trilu: the lower (`upper=0`) or upper (`upper=1`, the default) triangle of the last two
/// axes, from diagonal `k` (input 1, default 0), the rest zero. Evaluated at import on a
/// constant (PyTorch's exporter builds a causal mask as `Trilu` of a constant); on a
/// computed value, `where(triangle, x, 0)` with the triangle a constant [rows, cols] mask —
/// a select, so a NaN or an infinity outside the triangle gives 0 as Trilu does.
fn trilu(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let upper = a.int("upper", 1)? != 0;
    let k = match inputs.get(1).and_then(Option::as_ref) {
        Some(kv) => match b.ints(kv, "Trilu k")?.as_slice() {
            [k] => *k,
            other => {
                return Err(format!(
                    "Trilu k must be one integer, got {} values",
                    other.len()
                ))
            }
        },
        None => 0,
    };
    let dims = b.shape(x);
    let rank = dims.len();
    if rank < 2 {
        return Err(format!(
            "Trilu of a tensor of rank {rank} (it needs at least 2)"
        ));
    }
    let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
    // element e of a [.., rows, cols] tensor is kept when its column minus its row is on the
    // kept side of k (in i128: no overflow whatever k and the sizes are)
    let keep = move |e: usize| {
        let (i, j) = ((e / cols.max(1)) % rows.max(1), e % cols.max(1));
        let d = j as i128 - i as i128;
        if upper {
            d >= k as i128
        } else {
            d <= k as i128
        }
    };
    if let Some(c) = b.folded(x) {
        b.budget.take(&c.dims)?;
        let data = match &c.data {
            Data::F32(v) => Data::F32(
                v.iter()
                    .enumerate()
                    .map(|(e, &x)| if keep(e) { x } else { 0.0 })
                    .collect(),
            ),
            Data::I64(v) => Data::I64(
                v.iter()
                    .enumerate()
                    .map(|(e, &x)| if keep(e) { x } else { 0 })
                    .collect(),
            ),
            Data::Bool(v) => Data::Bool(v.iter().enumerate().map(|(e, &x)| x && keep(e)).collect()),
        };
        return Ok(konst(Const {
            dims: c.dims.clone(),
            data,
        }));
    }
    b.budget.take(&[rows, cols])?;
    let mask = (0..rows * cols).map(|e| keep(e) as u8 as f32).collect();
    let mask = konst(Const::f32(vec![rows, cols], mask));
    let zero = konst(Const::f32(vec![1], vec![0.0]));
    b.op_on(Op::Where, &[&mask, x, &zero])
}

/// LayerNormalization over the trailing axes from `axis` (torchlean's layer_norm normalizes
/// the last axis: other trailing spans are flattened into it and restored).
fn layer_norm(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let axis = normalize_axis(a.int("axis", -1)?, shape.len())?;
    let eps = a.float("epsilon", 1e-5)?;
    if a.int("stash_type", 1)? != 1 {
        return Err("stash_type other than float32".into());
    }
    let d: usize = shape[axis..].iter().product();
    let flat = |b: &mut Builder, v: &Value| -> Map<Value> {
        let s = b.shape(v);
        // the normalized shape itself, up to leading ones ([5, 4] for [4, 5] held the same
        // count and was read transposed; onnxruntime refuses it)
        let strip =
            |x: &[usize]| -> Vec<usize> { x.iter().copied().skip_while(|&n| n == 1).collect() };
        if strip(&s) != strip(&shape[axis..]) || s.len() > shape.len() - axis {
            return Err(format!("LayerNormalization scale/bias of shape {s:?} for normalized shape {:?} (broadcast affine parameters are not supported)", &shape[axis..]));
        }
        reshape(b, v, vec![d])
    };
    let scale = flat(b, arg(inputs, 1)?)?;
    let bias = match opt(inputs, 2) {
        Some(v) => flat(b, v)?,
        None => {
            b.budget.take(&[d])?;
            konst(Const::f32(vec![d], vec![0.0; d]))
        }
    };
    let rows: Vec<usize> = shape[..axis].iter().copied().chain([d]).collect();
    let x2 = reshape(b, x, rows)?;
    let y = b.op_on(Op::LayerNorm { eps }, &[&x2, &scale, &bias])?;
    Ok(vec![reshape(b, &y, shape)?])
}

/// `Tile(x, repeats)` with constant repeats: x reshaped with an axis of 1 before each of its
/// axes, broadcast to the repeats there, and merged back — the output's index i along an axis
/// reads x at i mod n, as ONNX's Tile (`Tensor.repeat`); the gradient sums the copies.
fn tile(b: &mut Builder, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let reps = b.ints(arg(inputs, 1)?, "repeats")?;
    if reps.len() != shape.len() || reps.iter().any(|&r| r < 0) {
        return Err(format!(
            "Tile of {shape:?} by repeats {reps:?} (one non-negative repeat per axis)"
        ));
    }
    let mut split = Vec::with_capacity(2 * shape.len());
    let mut wide = Vec::with_capacity(2 * shape.len());
    let mut out = Vec::with_capacity(shape.len());
    for (&n, &r) in shape.iter().zip(&reps) {
        let r = usize::try_from(r).map_err(|_| format!("Tile repeat {r} out of range"))?;
        split.extend([1, n]);
        wide.extend([r, n]);
        out.push(
            r.checked_mul(n)
                .ok_or_else(|| format!("Tile of {shape:?} by {reps:?} overflows"))?,
        );
    }
    let y = reshape(b, x, split)?;
    let y = b.op_on(Op::BroadcastTo { shape: wide }, &[&y])?;
    reshape(b, &y, out)
}

/// `DepthToSpace` (`F.pixel_shuffle`: mode CRD; DCR the default) and `SpaceToDepth`
/// (`F.pixel_unshuffle` is exported otherwise) on [N, C, H, W] with `blocksize` b: a reshape,
/// a permute and a reshape, moving every element once (the gradient moves it back).
fn depth_space(b: &mut Builder, op: &str, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let k = a.int("blocksize", 0)?;
    let mode = if op == "DepthToSpace" {
        a.string("mode", "DCR")?
    } else {
        String::new()
    };
    let [n, c, h, w] = shape[..] else {
        return Err(format!(
            "{op} of a rank-{} value (it takes [N, C, H, W])",
            shape.len()
        ));
    };
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| format!("{op} with blocksize {k} (it must be at least 1)"))?;
    let kk = k * k;
    let (split, axes, out) = if op == "DepthToSpace" {
        if c % kk != 0 {
            return Err(format!(
                "DepthToSpace of {c} channels by blocksize {k} ({c} is not a multiple of {kk})"
            ));
        }
        let c2 = c / kk;
        let out = vec![n, c2, h * k, w * k];
        match mode.as_str() {
            "DCR" => (vec![n, k, k, c2, h, w], vec![0, 3, 4, 1, 5, 2], out),
            "CRD" => (vec![n, c2, k, k, h, w], vec![0, 1, 4, 2, 5, 3], out),
            m => return Err(format!("DepthToSpace with mode \"{m}\"")),
        }
    } else {
        if h % k != 0 || w % k != 0 {
            return Err(format!(
                "SpaceToDepth of {h}×{w} by blocksize {k} (not multiples)"
            ));
        }
        (
            vec![n, c, h / k, k, w / k, k],
            vec![0, 3, 5, 1, 2, 4],
            vec![n, c * kk, h / k, w / k],
        )
    };
    let y = reshape(b, x, split)?;
    let y = b.op_on(Op::Permute { axes }, &[&y])?;
    reshape(b, &y, out)
}

/// `CumSum(x, axis)` (`torch.cumsum`) by ⌈log₂ n⌉ doubling steps (Hillis and Steele): y +=
/// y shifted by 1, 2, 4, ... along the axis (a `slice` and a `concat` with zeros), so each
/// output is the sum of its prefix (with `reverse`, its suffix; with `exclusive`, x is shifted
/// by one first). Each step is exact data movement and one `add`: the sums' rounding differs
/// from a sequential scan's only in the order of the additions; the gradient is the
/// composition's (the reverse scan of the cotangent).
fn cumsum(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let axis = b.ints(arg(inputs, 1)?, "axis")?;
    let [axis] = axis[..] else {
        return Err(format!("CumSum's axis must be one value, got {axis:?}"));
    };
    let axis = crate::constant::normalize_axis(axis, shape.len())?;
    let (exclusive, reverse) = (a.int("exclusive", 0)? != 0, a.int("reverse", 0)? != 0);
    let n = shape[axis];
    // y shifted by d along the axis toward the end (or, reversed, the start), zeros entering
    let shift = |b: &mut Builder, y: &Value, d: usize| -> Map<Value> {
        let mut zdims = shape.clone();
        zdims[axis] = d;
        let count = b.budget.take(&zdims)?;
        let zeros = konst(Const::f32(zdims, vec![0.0; count]));
        let (start, end) = if reverse { (d, n) } else { (0, n - d) };
        let kept = b.op_on(Op::Slice { axis, start, end }, &[y])?;
        let parts: [&Value; 2] = if reverse {
            [&kept, &zeros]
        } else {
            [&zeros, &kept]
        };
        b.op_on(Op::Concat { axis }, &parts)
    };
    if n == 0 {
        return Ok(x.clone());
    }
    // an integer constant (exporters' index arithmetic: `diagonal`'s positions) is summed
    // at import, exactly in checked i64
    if let Some(c) = b.folded(x).filter(|c| matches!(c.data, Data::I64(_))) {
        let v = c.ints()?;
        b.budget.take(&shape)?;
        let inner: usize = shape[axis + 1..].iter().product();
        let mut out = vec![0i64; v.len()];
        for start in (0..v.len()).filter(|i| (i / inner) % n == 0) {
            let mut run = 0i64;
            for step in 0..n {
                let j = if reverse { n - 1 - step } else { step };
                let at = start + j * inner;
                let next = run
                    .checked_add(v[at])
                    .ok_or("CumSum of constants overflows int64")?;
                out[at] = if exclusive { run } else { next };
                run = next;
            }
        }
        return Ok(konst(Const {
            dims: shape,
            data: Data::I64(out),
        }));
    }
    let mut y = if exclusive {
        shift(b, x, 1)?
    } else {
        x.clone()
    };
    let mut d = 1;
    while d < n {
        let s = shift(b, &y, d)?;
        y = b.op_on(Op::Add, &[&y, &s])?;
        d *= 2;
    }
    Ok(y)
}
