//! Integer-typed values computed at run time. torchlean's tensors are float32: an int64/int32
//! graph input is read as float32 integers (exact up to 2^24, checked by
//! `Imported::check_inputs`), and what only moves, selects or negates its elements holds the
//! same integers. Any other arithmetic on it would silently become float arithmetic where
//! ONNX specifies integer arithmetic: `Div` truncates (7 / 2 = 3, not 3.5), `ReduceMean`'s
//! integer mean truncates, and sums and products are exact in int64 but not in float32 past
//! 2^24 (4097 · 4097 = 16785409 rounds to 16785408). Such a node is refused, naming it;
//! constants are evaluated at import in i64, exactly (`crate::constant`).
//!
//! The import tracks which ONNX values are integer-typed by the ONNX type rules (graph inputs
//! as declared, `Cast`/`CastLike` to their target, the element-moving operators like their
//! data operand), by name: a `Cast` of an integer input to float is a float value (float
//! arithmetic on it is what the model asks for), even though it is the same graph node.

use super::{Builder, Value};
use crate::constant::{dtype, Data};
use std::collections::HashSet;

/// Operators whose float32 result on integers is exactly ONNX's integer result (for values
/// within 2^24): they move, select, compare, clamp or negate elements, never combine them.
const EXACT: &[&str] = &[
    "Abs",
    "And",
    "ArgMax",
    "ArgMin",
    "Cast",
    "CastLike",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Dropout",
    "Equal",
    "Expand",
    "Flatten",
    "Gather",
    "GatherElements",
    "Greater",
    "GreaterOrEqual",
    "Identity",
    "Less",
    "LessOrEqual",
    "Max",
    "Min",
    "Neg",
    "Not",
    "Or",
    "Pad",
    "Range",
    "ReduceMax",
    "ReduceMin",
    "Relu",
    "Reshape",
    "Shape",
    "Size",
    "Slice",
    "Split",
    // composed from comparisons, argmax, negation and gathers: selection, exact on integers
    "TopK",
    "Squeeze",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Where",
    "Xor",
];

/// Whether input `i` of `op` is one of its data operands (as opposed to axes, shapes,
/// indices, sizes, exponents or a condition, which are integers by the operator's signature).
fn is_data(op: &str, i: usize) -> bool {
    match op {
        "Where" => i == 1 || i == 2,
        "Concat"
        | "Equal"
        | "Less"
        | "Greater"
        | "LessOrEqual"
        | "GreaterOrEqual"
        | "And"
        | "Or"
        | "Xor"
        | "Max"
        | "Min"
        | "Add"
        | "Sub"
        | "Mul"
        | "Div"
        | "Mod"
        | "MatMul"
        | "Gemm"
        | "PRelu"
        | "LayerNormalization"
        | "BatchNormalization"
        | "InstanceNormalization"
        | "Conv"
        | "ConvTranspose" => true,
        "RNN" | "GRU" | "LSTM" => i != 4,
        _ => i == 0,
    }
}

fn is_integer_type(ty: i32) -> bool {
    matches!(ty, dtype::INT32 | dtype::INT64)
}

/// Whether `v` (the ONNX value `name`) holds integers: a run-time value the import tracks as
/// integer-typed, or an integer constant.
fn holds_integers(b: &Builder, typed: &HashSet<String>, name: &str, v: &Value) -> bool {
    match v {
        Value::Node(_) => typed.contains(name),
        Value::Const(c) => matches!(c.data, Data::I64(_)),
        Value::Param(_) => is_integer_type(b.elem_type(v)),
    }
}

/// Why ONNX's integer result differs from float32's, for the message.
fn difference(op: &str) -> String {
    match op {
        "Div" => "ONNX's integer division truncates: 7 / 2 is 3, float32 gives 3.5".into(),
        "Mod" => "ONNX's integer remainder is not float32's".into(),
        "ReduceMean" | "GlobalAveragePool" => {
            "ONNX's integer mean truncates: the mean of 1 and 2 is 1, float32 gives 1.5".into()
        }
        "Add" | "Sub" | "Mul" | "ReduceSum" | "ReduceSumSquare" | "ReduceL1" | "MatMul"
        | "Gemm" => "ONNX computes it exactly in int64, float32 holds integers exactly only up to 2^24 (4097 · 4097 = 16785409 would round to 16785408), and the values are not known at import".into(),
        _ => format!("ONNX's `{op}` on integers is not float32's (or is not defined for them)"),
    }
}

/// Whether `v` holds booleans as 0/1 (a boolean input, a comparison, logic on them, a
/// boolean constant).
pub(super) fn is_boolean(b: &Builder, v: &Value) -> bool {
    match v {
        Value::Node(id) => b.boolean.contains(id),
        Value::Const(c) => matches!(c.data, Data::Bool(_)),
        Value::Param(_) => b.elem_type(v) == dtype::BOOL,
    }
}

/// Integer arithmetic that float32 computes exactly because an operand is boolean: the sum
/// of at most 2^24 zeros and ones (`mask.sum(-1)`: every partial sum is an integer at most
/// 2^24), and a product by a boolean (`ids * attention_mask`: 0 or the integer itself).
fn exact_on_booleans(
    b: &Builder,
    typed: &HashSet<String>,
    op: &str,
    names: &[String],
    inputs: &[Option<Value>],
) -> bool {
    let at = |i: usize| inputs.get(i).and_then(Option::as_ref);
    match op {
        // the running sums of booleans: integers at most the axis's length
        "ReduceSum" | "CumSum" => at(0).is_some_and(|v| {
            is_boolean(b, v) && (b.shape(v).iter().product::<usize>() as f64) <= 16_777_216.0
        }),
        "Mul" => match (at(0), at(1), names.first(), names.get(1)) {
            (Some(x), Some(y), Some(nx), Some(ny)) => {
                let int = |n: &str, v: &Value| holds_integers(b, typed, n, v);
                (is_boolean(b, x) && int(ny, y)) || (is_boolean(b, y) && int(nx, x))
            }
            _ => false,
        },
        _ => false,
    }
}

/// The refusal of a node `op` that computes on integer-typed values at run time (`outs` are
/// its results: a node whose results are all constants was evaluated at import, exactly).
pub(super) fn check(
    b: &Builder,
    typed: &HashSet<String>,
    op: &str,
    names: &[String],
    inputs: &[Option<Value>],
    outs: &[Value],
) -> Result<(), String> {
    if EXACT.contains(&op)
        || !outs.iter().any(|v| matches!(v, Value::Node(_)))
        || exact_on_booleans(b, typed, op, names, inputs)
    {
        return Ok(());
    }
    let integer = names.iter().zip(inputs).enumerate().find(|(i, (n, v))| {
        is_data(op, *i) && v.as_ref().is_some_and(|v| holds_integers(b, typed, n, v))
    });
    match integer {
        None => Ok(()),
        Some((_, (name, _))) => Err(format!(
            "`{op}` of the integer value `{name}` computed at run time: {}; torchlean's tensors are float32 (cast the value to float in the model where float arithmetic is meant)",
            difference(op)
        )),
    }
}

/// Whether output value `out` of node `op` is integer-typed (ONNX's type rules: `Cast`'s
/// target, `CastLike`'s second input, otherwise the data operands' type).
pub(super) fn output_is_integer(
    b: &Builder,
    typed: &HashSet<String>,
    op: &str,
    to: Option<i64>,
    names: &[String],
    inputs: &[Option<Value>],
    out: &Value,
) -> bool {
    if !matches!(out, Value::Node(_)) {
        return false;
    }
    match op {
        "Cast" => to.is_some_and(|t| i32::try_from(t).is_ok_and(is_integer_type)),
        // indices, whatever the operand's type
        "ArgMax" | "ArgMin" => true,
        // TopK's indices (its second output), which the import marks integral, and its
        // values where the input holds integers (they are selected elements of it)
        "TopK" => {
            matches!(out, Value::Node(id) if b.integral.contains(id))
                || matches!((names.first(), inputs.first()), (Some(n), Some(Some(v))) if holds_integers(b, typed, n, v))
        }
        _ if exact_on_booleans(b, typed, op, names, inputs) => true,
        "CastLike" => match (names.get(1), inputs.get(1).and_then(Option::as_ref)) {
            (Some(n), Some(Value::Node(_))) => typed.contains(n),
            (_, Some(v)) => is_integer_type(b.elem_type(v)),
            _ => false,
        },
        _ if EXACT.contains(&op) => names.iter().zip(inputs).enumerate().any(|(i, (n, v))| {
            is_data(op, i) && v.as_ref().is_some_and(|v| holds_integers(b, typed, n, v))
        }),
        _ => false,
    }
}

/// The comparison operators (their result is a boolean).
const COMPARISONS: &[&str] = &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];

/// The operators that are exact on float64 values which hold float32 numbers (a `Cast` of a
/// float32 value to float64): they move, select, compare, classify or negate elements, so
/// their float32 result is the float64 one. PyTorch's exporter writes `torch.isinf(x)` (and
/// `nan_to_num`) as `IsInf(Cast(x, to=DOUBLE))`.
fn exact_on_doubles(op: &str) -> bool {
    matches!(op, "IsInf" | "IsNaN") || (EXACT.contains(&op) && !matches!(op, "Cast" | "CastLike"))
}

/// The refusal of a node `op` that computes in float64 on a value the import holds as float32
/// (`double` the float64-typed names): only [`exact_on_doubles`] operators and casts may read
/// one (a node whose results are all constants was evaluated at import).
pub(super) fn check_double(
    double: &HashSet<String>,
    inexact: &HashSet<String>,
    op: &str,
    names: &[String],
    outs: &[Value],
) -> Result<(), String> {
    // a float64 value compared with a float64 constant that float32 rounds: the narrowed
    // constant can change the answer (x = f32(0.1): `x.double() > 0.1` holds, `x > f32(0.1)`
    // does not; an audit of the forty-fifth session)
    if COMPARISONS.contains(&op) && names.iter().any(|n| double.contains(n)) {
        if let Some(c) = names.iter().find(|n| inexact.contains(*n)) {
            return Err(format!(
                "`{op}` of a float64 value with the float64 constant `{c}`, which float32 does not hold exactly: torchlean holds float64 values as float32 and rounding the constant could change the comparison"
            ));
        }
    }
    if exact_on_doubles(op)
        || matches!(op, "Cast" | "CastLike")
        || !outs.iter().any(|v| matches!(v, Value::Node(_)))
    {
        return Ok(());
    }
    match names.iter().enumerate().find(|(i, n)| is_data(op, *i) && double.contains(*n)) {
        None => Ok(()),
        Some((_, name)) => Err(format!(
            "`{op}` of the float64 value `{name}`: arithmetic in float64, where torchlean's tensors are float32 (a float64 cast is followed only by comparisons, IsInf, IsNaN and ops that move or select elements)"
        )),
    }
}

/// Whether output `out` of node `op` is float64-typed: a `Cast` to DOUBLE, a `CastLike` of a
/// float64 value, or an exact operator that moves or selects a float64 data operand (not a
/// comparison or a classification, whose result is a boolean).
pub(super) fn output_is_double(
    double: &HashSet<String>,
    op: &str,
    to: Option<i64>,
    names: &[String],
    out: &Value,
) -> bool {
    let boolean = COMPARISONS.contains(&op)
        || matches!(
            op,
            "IsInf"
                | "IsNaN"
                | "Not"
                | "And"
                | "Or"
                | "Xor"
                | "ArgMax"
                | "ArgMin"
                | "Shape"
                | "Size"
        );
    if !matches!(out, Value::Node(_)) || boolean {
        return false;
    }
    match op {
        "Cast" => to == Some(i64::from(dtype::DOUBLE)),
        "CastLike" => names.get(1).is_some_and(|n| double.contains(n)),
        _ if exact_on_doubles(op) => names
            .iter()
            .enumerate()
            .any(|(i, n)| is_data(op, i) && double.contains(n)),
        _ => false,
    }
}
