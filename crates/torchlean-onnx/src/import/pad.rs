//! `Pad` in every ONNX mode, `Slice` steps on computed values, and the two lowerings they
//! share with the window operators: blocks of a constant concatenated before and after an
//! axis ([`constant_blocks`]; the windows' asymmetric pads use it too), and a constant list
//! of positions read along an axis ([`pick`]: `reflect`, `edge`, `wrap`, strided and
//! reversed slices). Both are differentiable the way the operator is: `concat` hands the
//! input exactly its own cotangent, `index_select` adds each output's cotangent to the
//! position it was read from (a position read twice gets both).

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, Map};
use super::{Builder, Value};
use crate::constant::{normalize_axis, Const};
use torchlean::graph::Op;

/// Index tensors are float32: positions up to 2^24 are exact.
const MAX_PICKED_AXIS: usize = 1 << 24;

/// `x` at the positions `picks` along `axis`, in that order: `x` itself when `picks` is
/// every position in order, a `slice` when it is one ascending run, else `index_select`
/// with the positions as a constant index vector. The caller has bounded `picks` (the
/// constant budget for lists it computes from amounts or sizes, the axis or the file for the
/// others).
pub(super) fn pick(b: &mut Builder, x: &Value, axis: usize, picks: &[usize]) -> Map<Value> {
    let n = b.shape(x)[axis];
    let run = picks.windows(2).all(|w| w[1] == w[0] + 1);
    if run {
        let start = picks.first().copied().unwrap_or(0);
        if start == 0 && picks.len() == n {
            return Ok(x.clone());
        }
        let end = start + picks.len();
        return b.op_on(Op::Slice { axis, start, end }, &[x]);
    }
    if n > MAX_PICKED_AXIS {
        return Err(format!(
            "reading positions of an axis of {n} elements by an index list (index tensors are float32: at most 2^24 positions)"
        ));
    }
    let index = konst(Const::f32(
        vec![picks.len()],
        picks.iter().map(|&k| k as f32).collect(),
    ));
    b.op_on(Op::IndexSelect { axis }, &[x, &index])
}

/// `x` with `before` and `after` elements of `value` concatenated along `axis` (blocks of
/// the constant, counted against the import's constant budget).
pub(super) fn constant_blocks(
    b: &mut Builder,
    x: &Value,
    axis: usize,
    (before, after): (usize, usize),
    value: f32,
) -> Map<Value> {
    if before == 0 && after == 0 {
        return Ok(x.clone());
    }
    let block = |k: usize| -> Map<Value> {
        let mut dims = b.shape(x).to_vec();
        dims[axis] = k;
        let count = b.budget.take(&dims)?;
        Ok(konst(Const::f32(dims, vec![value; count])))
    };
    let head = (before > 0).then(|| block(before)).transpose()?;
    let tail = (after > 0).then(|| block(after)).transpose()?;
    let parts: Vec<&Value> = head.iter().chain([x]).chain(tail.iter()).collect();
    b.op_on(Op::Concat { axis }, &parts)
}

/// How a non-constant `Pad` mode fills position `p` (may lie outside `0..n`) of an axis of
/// `n ≥ 1` elements: the source position it copies.
fn source(mode: &str, p: i64, n: i64) -> i64 {
    match mode {
        // mirrored about the first and last elements, which are not repeated (numpy's
        // `reflect`): period 2(n − 1)
        "reflect" if n > 1 => {
            let period = 2 * (n - 1);
            let m = p.rem_euclid(period);
            if m < n {
                m
            } else {
                period - m
            }
        }
        "reflect" => 0,
        "edge" => p.clamp(0, n - 1),
        // "wrap": periodic
        _ => p.rem_euclid(n),
    }
}

/// `Pad` (PyTorch's `F.pad`, `nn.ZeroPad2d`, `nn.ConstantPad*d`, `nn.ReflectionPad*d`,
/// `nn.ReplicationPad*d`, `nn.CircularPad*d`). `constant` mode: per axis, a negative amount
/// crops (`slice`), then a positive one concatenates blocks of the constant before and after.
/// `reflect`, `edge` and (from opset 18, one before ONNX's 19: PyTorch writes it there) `wrap`: the padded axis is a constant list of source
/// positions read by [`pick`]; their amounts must be non-negative, and `reflect`'s below the
/// axis length (as PyTorch and onnxruntime require). Pads, axes and the value must be known
/// at import.
pub(super) fn pad(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let mode = a.string("mode", "constant")?;
    let mode = mode.as_str();
    match mode {
        "constant" | "reflect" | "edge" => {}
        // `wrap` exists from opset 19; PyTorch's dynamo exporter writes it at opset 18 for
        // circular padding too, and onnxruntime runs that: accepted from 18, its meaning being
        // unambiguous (the forty-eighth session's audit)
        "wrap" if b.opset >= 18 => {}
        _ => {
            return Err(format!(
                "Pad mode `{mode}` in opset {} (constant, reflect, edge; wrap from opset 18, where PyTorch's exporter writes it)",
                b.opset
            ))
        }
    }
    let x = arg(inputs, 0)?;
    let rank = b.shape(x).len();
    let pads = b.ints(arg(inputs, 1)?, "pads")?;
    let axes: Vec<usize> = match opt(inputs, 3) {
        Some(_) if b.opset < 18 => {
            return Err(format!(
                "Pad's `axes` input exists from opset 18; the model declares opset {}",
                b.opset
            ))
        }
        Some(v) => b
            .ints(v, "axes")?
            .into_iter()
            .map(|ax| normalize_axis(ax, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "Pad with {} pads for {} axes (expected begins then ends: 2 per axis)",
            pads.len(),
            axes.len()
        ));
    }
    if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        return Err(format!("Pad with a repeated axis in {axes:?}"));
    }
    let value = match opt(inputs, 2) {
        None => 0.0,
        Some(_) if mode != "constant" => {
            return Err(format!("Pad mode `{mode}` with a constant_value"))
        }
        Some(v) => b
            .known(v)
            .and_then(|c| c.scalar())
            .ok_or("Pad's constant_value computed at run time (only a constant scalar)")?,
    };
    let mut out = x.clone();
    for (i, &axis) in axes.iter().enumerate() {
        let (before, after) = (pads[i], pads[i + axes.len()]);
        let n = b.shape(&out)[axis] as i64;
        if mode != "constant" {
            out = pad_by_positions(b, &out, axis, mode, (before, after), n)?;
            continue;
        }
        // a negative amount removes elements from that end
        let (start, end) = (
            before.min(0).saturating_neg(),
            n.saturating_add(after.min(0)),
        );
        if start > end {
            // the amounts as given (in i128: no saturation, whatever the i64 amounts are)
            let crop = -(before.min(0) as i128) - (after.min(0) as i128);
            return Err(format!(
                "Pad crops {crop} of the {n} elements of axis {axis} (pads begin {before}, end {after})"
            ));
        }
        if start > 0 || end < n {
            out = b.op_on(
                Op::Slice {
                    axis,
                    start: start as usize,
                    end: end as usize,
                },
                &[&out],
            )?;
        }
        let amount = |k: i64| usize::try_from(k.max(0)).map_err(|_| format!("Pad amount {k}"));
        out = constant_blocks(b, &out, axis, (amount(before)?, amount(after)?), value)?;
    }
    Ok(out)
}

/// One axis of a `reflect`, `edge` or `wrap` pad: the positions `-before..n + after` mapped
/// to their sources.
fn pad_by_positions(
    b: &mut Builder,
    x: &Value,
    axis: usize,
    mode: &str,
    (before, after): (i64, i64),
    n: i64,
) -> Map<Value> {
    if before == 0 && after == 0 {
        return Ok(x.clone());
    }
    if before < 0 || after < 0 {
        return Err(format!(
            "Pad mode `{mode}` with a negative amount ({before}, {after}) on axis {axis}"
        ));
    }
    if n == 0 {
        return Err(format!("Pad mode `{mode}` of the empty axis {axis}"));
    }
    if mode == "reflect" && (before >= n || after >= n) {
        return Err(format!(
            "Pad mode `reflect` by ({before}, {after}) on axis {axis} of {n} elements (each amount must be below the length)"
        ));
    }
    let total = n
        .checked_add(before)
        .and_then(|t| t.checked_add(after))
        .ok_or_else(|| format!("Pad amounts ({before}, {after}) overflow"))?;
    b.budget.take(&[total as usize])?;
    let picks: Vec<usize> = (-before..n + after)
        .map(|p| source(mode, p, n) as usize)
        .collect();
    pick(b, x, axis, &picks)
}

#[cfg(test)]
mod tests {
    use super::source;

    #[test]
    fn pad_sources_follow_numpy() {
        // numpy.pad([0, 1, 2, 3], (3, 3), mode) read as source positions
        let row = |mode| (-3..7).map(|p| source(mode, p, 4)).collect::<Vec<_>>();
        assert_eq!(row("reflect"), vec![3, 2, 1, 0, 1, 2, 3, 2, 1, 0]);
        assert_eq!(row("edge"), vec![0, 0, 0, 0, 1, 2, 3, 3, 3, 3]);
        assert_eq!(row("wrap"), vec![1, 2, 3, 0, 1, 2, 3, 0, 1, 2]);
        assert_eq!(source("reflect", -2, 1), 0);
    }
}
