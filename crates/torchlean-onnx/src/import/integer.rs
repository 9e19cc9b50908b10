//! Integer-typed values computed at run time. torchlean's tensors are float32: an int64/int32
//! graph input is read as float32 integers (of magnitude at most 2^24, checked by
//! `Imported::check_inputs`), and what only moves, selects or negates its elements holds the
//! same integers. Other arithmetic on it is float arithmetic where ONNX specifies integer
//! arithmetic: `Div` truncates (7 / 2 = 3, not 3.5), `ReduceMean`'s integer mean truncates —
//! those are refused, naming the node —, and sums and products are exact in int64 but in
//! float32 only while every value is at most 2^24 (4097 · 4097 = 16785409 rounds to
//! 16785408). So the import carries, for each integer value, a **bound on its magnitude**
//! derived from how it was made (an int64 input: 2^24; a boolean: 1; the sum of n booleans:
//! n; an argmax over n elements: n; a constant: its largest element; a sum: the sum of its
//! operands' bounds; a product: their product), and admits `Add`, `Sub`, `Mul`, `ReduceSum`
//! and `CumSum` of integers exactly when the bound of the result, which bounds every
//! intermediate value of any float32 evaluation of it too, is at most 2^24 — where float32
//! holds every integer, so each operation is exact. Otherwise the node is refused, naming
//! the bound. Constants are evaluated at import in i64, exactly (`crate::constant`).
//!
//! The import tracks which ONNX values are integer-typed by the ONNX type rules (graph inputs
//! as declared, `Cast`/`CastLike` to their target, the element-moving operators like their
//! data operand), by name: a `Cast` of an integer input to float is a float value (float
//! arithmetic on it is what the model asks for), even though it is the same graph node.

use super::{Builder, Value};
use crate::constant::{dtype, Data};
use std::collections::{HashMap, HashSet};

/// The largest magnitude up to which float32 holds every integer (2^24).
pub(super) const EXACT_LIMIT: f64 = 16_777_216.0;

/// The smallest limit the import may set on the integer inputs' magnitudes to admit
/// arithmetic on them (2^20: token ids, lengths and positions stay far below it).
const LOWEST_INPUT_LIMIT: f64 = 1_048_576.0;

/// A bound on the magnitudes of an integer value's elements, affine in the limit `L` on the
/// integer graph inputs' magnitudes: |v| ≤ `per_input`·L + `fixed`. The inputs themselves are
/// `L` (2^24 unless arithmetic on them asked for less: [`InputLimit`]), so `lengths − 1` is
/// L + 1, admitted once L ≤ 2^24 − 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Bound {
    per_input: f64,
    fixed: f64,
}

impl Bound {
    pub(super) const INPUT: Bound = Bound {
        per_input: 1.0,
        fixed: 0.0,
    };
    fn fixed(v: f64) -> Bound {
        Bound {
            per_input: 0.0,
            fixed: v,
        }
    }
    /// The bound's value under the input limit `limit`.
    fn at(self, limit: f64) -> f64 {
        if self.per_input == 0.0 {
            self.fixed
        } else {
            self.per_input * limit + self.fixed
        }
    }
    fn add(self, o: Bound) -> Bound {
        Bound {
            per_input: self.per_input + o.per_input,
            fixed: self.fixed + o.fixed,
        }
    }
    /// The product's bound: affine while one factor does not depend on the inputs, else
    /// evaluated at the largest limit (2^24).
    fn mul(self, o: Bound) -> Bound {
        // a factor bounded by 0 makes the product 0, an unknown (infinite) bound on the
        // other side included: never the NaN of 0 · inf
        let times = |a: f64, b: f64| if a == 0.0 || b == 0.0 { 0.0 } else { a * b };
        match (self.per_input == 0.0, o.per_input == 0.0) {
            (true, _) => Bound {
                per_input: times(o.per_input, self.fixed),
                fixed: times(o.fixed, self.fixed),
            },
            (_, true) => o.mul(self),
            _ => Bound::fixed(times(self.at(EXACT_LIMIT), o.at(EXACT_LIMIT))),
        }
    }
    fn times(self, n: f64) -> Bound {
        self.mul(Bound::fixed(n))
    }
    /// A bound of both (for every limit ≥ 0).
    fn max(self, o: Bound) -> Bound {
        Bound {
            per_input: self.per_input.max(o.per_input),
            fixed: self.fixed.max(o.fixed),
        }
    }
}

/// The limit on the integer graph inputs' magnitudes: 2^24, or lower where arithmetic on
/// them is exact in float32 only below it (`lengths − 1`: 2^24 − 1), with the node that
/// asked for it. `Imported::check_inputs` holds the inputs to it at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct InputLimit {
    pub limit: f64,
    /// The node (its name and operator) that lowered the limit, if one did.
    pub set_by: Option<(String, String)>,
}

impl Default for InputLimit {
    fn default() -> InputLimit {
        InputLimit {
            limit: EXACT_LIMIT,
            set_by: None,
        }
    }
}

/// The integer-typed values computed at run time, by ONNX name, each with a bound on the
/// magnitude of its elements (infinite where none is known: a float cast to int).
pub(super) type IntegerBounds = HashMap<String, Bound>;

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
    "GatherND",
    "Greater",
    "GreaterOrEqual",
    "Identity",
    "Less",
    "LessOrEqual",
    "Max",
    "Min",
    "Neg",
    "Not",
    // selects one of two constant values by comparing the indices: its bound is theirs
    "OneHot",
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

/// The bound on the magnitude of `v` (the ONNX value `name`) if it holds integers: a
/// run-time value the import tracks as integer-typed, a boolean (0/1), an integer constant or
/// integer initializer (its largest element).
fn bound_of(b: &Builder, typed: &IntegerBounds, name: &str, v: &Value) -> Option<Bound> {
    let largest = |c: &crate::constant::Const| match &c.data {
        Data::I64(xs) => Some(Bound::fixed(
            xs.iter().fold(0f64, |m, &x| m.max((x as f64).abs())),
        )),
        Data::Bool(_) => Some(Bound::fixed(1.0)),
        _ => None,
    };
    match v {
        Value::Node(_) if is_boolean(b, v) => Some(Bound::fixed(1.0)),
        Value::Node(_) => typed.get(name).copied(),
        Value::Const(c) => largest(c),
        Value::Param(p) if is_integer_type(b.elem_type(v)) => Some(
            b.initializers
                .get(p)
                .and_then(|c| largest(c))
                .unwrap_or(Bound::fixed(f64::INFINITY)),
        ),
        Value::Param(_) => None,
    }
}

/// Whether `v` (the ONNX value `name`) holds integers.
fn holds_integers(b: &Builder, typed: &IntegerBounds, name: &str, v: &Value) -> bool {
    match v {
        // booleans are integers only where ONNX types them so (a Cast to int), as before
        Value::Node(_) => typed.contains_key(name),
        _ => bound_of(b, typed, name, v).is_some(),
    }
}

fn elements(b: &Builder, v: &Value) -> f64 {
    b.shape(v).iter().product::<usize>() as f64
}

/// For the integer arithmetic float32 computes exactly below 2^24 (`Add`, `Sub`, `Mul`,
/// `ReduceSum`, `CumSum` with every data operand integer or boolean): the bound on its result's
/// magnitude, which also bounds every partial result of any order of evaluation (a partial sum
/// is at most the sum of magnitudes). `None` for every other node.
fn arithmetic_bound(
    b: &Builder,
    typed: &IntegerBounds,
    op: &str,
    names: &[String],
    inputs: &[Option<Value>],
) -> Option<Bound> {
    let operand = |i: usize| -> Option<Bound> {
        let v = inputs.get(i)?.as_ref()?;
        bound_of(b, typed, names.get(i)?, v)
    };
    let any_integer = (0..inputs.len().min(2)).any(|i| {
        is_data(op, i)
            && matches!((names.get(i), inputs.get(i)), (Some(n), Some(Some(v))) if holds_integers(b, typed, n, v))
    });
    let x = inputs.first()?.as_ref()?;
    match op {
        "Add" | "Sub" if any_integer => Some(operand(0)?.add(operand(1)?)),
        "Mul" if any_integer || (is_boolean(b, x) && operand(1).is_some()) => {
            Some(operand(0)?.mul(operand(1)?))
        }
        // a sum over the elements of one output's slice: at most that count times the bound
        "ReduceSum" | "CumSum" if any_integer || is_boolean(b, x) => {
            Some(operand(0)?.times(elements(b, x)))
        }
        _ => None,
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
        "ReduceSumSquare" | "ReduceL1" | "MatMul" | "Gemm" => "ONNX computes it exactly in int64, float32 holds integers exactly only up to 2^24 (4097 · 4097 = 16785409 would round to 16785408), and the values are not known at import".into(),
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

/// The refusal of a node `op` that computes on integer-typed values at run time (`outs` are
/// its results: a node whose results are all constants was evaluated at import, exactly).
#[allow(clippy::too_many_arguments)]
pub(super) fn check(
    b: &Builder,
    typed: &IntegerBounds,
    limit: &mut InputLimit,
    node: &str,
    op: &str,
    names: &[String],
    inputs: &[Option<Value>],
    outs: &[Value],
) -> Result<(), String> {
    if EXACT.contains(&op) || !outs.iter().any(|v| matches!(v, Value::Node(_))) {
        return Ok(());
    }
    if let Some(affine) = arithmetic_bound(b, typed, op, names, inputs) {
        if affine.at(limit.limit) <= EXACT_LIMIT {
            return Ok(());
        }
        // exact once the integer inputs are held to a lower limit, not too low: lower it
        // (`lengths − 1`: the inputs held to 2^24 − 1 at run time, naming this node)
        if affine.per_input > 0.0 && affine.fixed.is_finite() {
            let needed = ((EXACT_LIMIT - affine.fixed) / affine.per_input).floor();
            if needed >= LOWEST_INPUT_LIMIT {
                limit.limit = needed;
                limit.set_by = Some((node.to_string(), op.to_string()));
                return Ok(());
            }
        }
        let bound = affine.at(limit.limit);
        let operands: Vec<String> = names
            .iter()
            .zip(inputs)
            .enumerate()
            .filter(|(i, _)| is_data(op, *i))
            .filter_map(|(_, (n, v))| {
                let bound = bound_of(b, typed, n, v.as_ref()?)?.at(limit.limit);
                Some(format!("`{n}` at most {}", show_bound(bound)))
            })
            .collect();
        return Err(format!(
            "`{op}` of integer values computed at run time ({}): its result may reach {} in magnitude, past 2^24 = 16777216, where float32 stops holding every integer (ONNX computes it exactly in int64; torchlean's tensors are float32), and would stay past it unless the integer inputs were held below 2^20. Bounds come from how each value is made: an int64 input up to 2^24, a boolean 1, a sum of n booleans n, an argmax over n elements n; cast to float in the model where float arithmetic is meant",
            operands.join(", "),
            show_bound(bound)
        ));
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

fn show_bound(bound: f64) -> String {
    if bound.is_finite() {
        format!("{bound}")
    } else {
        "an unknown magnitude (a float value cast to an integer)".into()
    }
}

/// The bound on the magnitude of output `out` of node `op` if it is integer-typed (ONNX's
/// type rules: `Cast`'s target, `CastLike`'s second input, otherwise the data operands'
/// type), `None` if it is not.
pub(super) fn output_bound(
    b: &Builder,
    typed: &IntegerBounds,
    op: &str,
    to: Option<i64>,
    names: &[String],
    inputs: &[Option<Value>],
    out: &Value,
) -> Option<Bound> {
    if !matches!(out, Value::Node(_)) {
        return None;
    }
    let data =
        |i: usize| -> Option<Bound> { bound_of(b, typed, names.get(i)?, inputs.get(i)?.as_ref()?) };
    // a cast to an integer type keeps an integer or boolean operand's bound; a float operand
    // truncated may be any integer float32 holds
    let cast = || Some(data(0).unwrap_or(Bound::fixed(f64::INFINITY)));
    let first_elements = || Some(Bound::fixed(elements(b, inputs.first()?.as_ref()?)));
    match op {
        "Cast" => {
            cast().filter(|_| to.is_some_and(|t| i32::try_from(t).is_ok_and(is_integer_type)))
        }
        // indices, whatever the operand's type
        "ArgMax" | "ArgMin" => first_elements(),
        // TopK's indices (its second output), which the import marks integral, and its
        // values where the input holds integers (they are selected elements of it)
        "TopK" => match out {
            Value::Node(id)
                if b.integral.contains(id) && !holds_integers_at(b, typed, names, inputs, 0) =>
            {
                first_elements()
            }
            _ if holds_integers_at(b, typed, names, inputs, 0) => {
                data(0).map(|d| d.max(first_elements().unwrap_or(Bound::fixed(0.0))))
            }
            _ => None,
        },
        // the larger of the two values where they are integers (a float one-hot is float)
        "OneHot" => data(2),
        _ if arithmetic_bound(b, typed, op, names, inputs).is_some() => {
            arithmetic_bound(b, typed, op, names, inputs)
        }
        "CastLike" => match (names.get(1), inputs.get(1).and_then(Option::as_ref)) {
            (Some(n), Some(Value::Node(_))) if typed.contains_key(n) => cast(),
            (_, Some(v @ (Value::Const(_) | Value::Param(_))))
                if is_integer_type(b.elem_type(v)) =>
            {
                cast()
            }
            _ => None,
        },
        _ if EXACT.contains(&op) => {
            let integers: Vec<usize> = (0..inputs.len())
                .filter(|&i| is_data(op, i) && holds_integers_at(b, typed, names, inputs, i))
                .collect();
            if integers.is_empty() {
                return None;
            }
            if COMPARISONS.contains(&op) || matches!(op, "And" | "Or" | "Xor" | "Not") {
                return Some(Bound::fixed(1.0));
            }
            // a clip to [lo, hi] (both given): the larger of their magnitudes
            if op == "Clip" {
                if let (Some(lo), Some(hi)) = (data(1), data(2)) {
                    return Some(lo.max(hi));
                }
            }
            // what moves, selects, clamps or negates elements keeps its data operands'
            // largest bound (`Pad`'s fill value, `Range`'s ends and a one-sided `Clip`'s
            // bound — which can raise a value — are operands too)
            let all = matches!(op, "Pad" | "Range" | "Clip");
            (0..inputs.len())
                .filter(|&i| all || integers.contains(&i))
                .map(|i| data(i).unwrap_or(Bound::fixed(if all { 0.0 } else { f64::INFINITY })))
                .reduce(Bound::max)
        }
        _ => None,
    }
}

fn holds_integers_at(
    b: &Builder,
    typed: &IntegerBounds,
    names: &[String],
    inputs: &[Option<Value>],
    i: usize,
) -> bool {
    matches!((names.get(i), inputs.get(i)), (Some(n), Some(Some(v))) if holds_integers(b, typed, n, v))
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
