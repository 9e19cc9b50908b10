//! Indexing operators that PyTorch's exporter writes for Python indexing and one-hot codes,
//! lowered to torchlean's `index_select`, `scatter_add`, `concat`, `compare` and `where`:
//!
//! - `GatherND` (`diagonal`, advanced indexing with several index tensors) with indices known
//!   at import: the indexed leading axes flattened into one, the addressed rows picked.
//! - `ScatterND` (`x[:, 1:3] = v`, `index_put`) with indices known at import: without a
//!   reduction each addressed row of the flattened data is replaced by its update (one
//!   `index_select` over the data and the updates side by side: the data's gradient is zero
//!   where a row was replaced, the update's is the cotangent of its row, as PyTorch's
//!   `index_put`); with `reduction="add"` (`index_put(accumulate=True)`) a `scatter_add`.
//! - `ScatterElements` (`torch.scatter`, `scatter_add`): with `reduction="add"` torchlean's
//!   `scatter_add` (indices known at import, or integers computed at run time, which the
//!   kernel checks); without a reduction, indices known at import that address distinct
//!   elements: the elements they address take the source's values (`where` over a constant
//!   mask), the others keep the data's.
//! - `OneHot` (`F.one_hot`): a comparison of the indices with each class, `where` of the
//!   two values; negative indices count from the end, indices outside [-depth, depth) give a
//!   row of the "off" value (ONNX's rule; PyTorch refuses them).
//! - `EyeLike` (`diagonal`'s mask): a constant of the input's (static) shape.
//!
//! Duplicate indices in a replacing scatter are refused: ONNX leaves the result undefined,
//! and PyTorch's gradient would reach every duplicate where a replacement reaches one.

use super::attrs::Attrs;
use super::ops::{arg, element_indices, konst, reshape, wrap_negative};
use super::{Builder, Value};
use crate::constant::{dtype, normalize_axis, normalize_index, strides, Const, Data};
use std::collections::HashSet;
use torchlean::graph::{Op, Relation};

type Map<T> = Result<T, String>;

/// `EyeLike(x)`: ones on diagonal `k` of a 2-D shape, zeros elsewhere, in `dtype` (or x's
/// type): a constant, since torchlean shapes are static.
pub fn eye_like(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let dims = b.shape(x);
    let k = a.int("k", 0)?;
    let ty = a.int("dtype", i64::from(b.elem_type(x)))?;
    let [rows, cols] = dims[..] else {
        return Err(format!(
            "EyeLike of a {}-D input (2-D is required)",
            dims.len()
        ));
    };
    b.budget.take(&dims)?;
    let on = |i: usize, j: usize| j as i64 - i as i64 == k;
    let cells = (0..rows).flat_map(|i| (0..cols).map(move |j| (i, j)));
    let data = match i32::try_from(ty) {
        Ok(dtype::INT64 | dtype::INT32) => Data::I64(cells.map(|(i, j)| on(i, j) as i64).collect()),
        Ok(dtype::BOOL) => Data::Bool(cells.map(|(i, j)| on(i, j)).collect()),
        Ok(dtype::FLOAT | dtype::DOUBLE) => {
            Data::F32(cells.map(|(i, j)| on(i, j) as u8 as f32).collect())
        }
        _ => {
            return Err(format!(
                "EyeLike dtype {ty} (float, double, int32, int64 or bool are supported)"
            ))
        }
    };
    Ok(konst(Const { dims, data }))
}

/// The indices operand of a GatherND/ScatterND as flat row numbers of the data's first `k`
/// axes (negative entries counted from the end), with the index tuples' shape (the indices'
/// shape without its last axis) and `k`.
fn linear_rows(
    b: &Builder,
    op: &str,
    data: &[usize],
    indices: &Value,
) -> Map<(Vec<usize>, Vec<usize>, usize)> {
    let c = b.known(indices).ok_or_else(|| {
        format!(
            "{op} with indices computed at run time (only indices known at import are supported)"
        )
    })?;
    let (tuples, k) = match c.dims.split_last() {
        Some((&k, tuples)) if k >= 1 && k <= data.len() => (tuples.to_vec(), k),
        _ => {
            return Err(format!(
            "{op} indices of shape {:?} for data of shape {data:?}: the last axis must be 1 to {}",
            c.dims,
            data.len()
        ))
        }
    };
    let lead = &data[..k];
    let st = strides(lead);
    let ints = c.ints()?;
    let rows = ints
        .chunks(k)
        .map(|t| {
            t.iter()
                .zip(lead)
                .zip(&st)
                .map(|((&i, &n), &s)| normalize_index(i, n).map(|p| p * s))
                .sum::<Map<usize>>()
        })
        .collect::<Map<Vec<usize>>>()?;
    Ok((rows, tuples, k))
}

/// `x` reshaped to [rows of its first `k` axes, its other axes...].
fn flatten_lead(b: &mut Builder, x: &Value, k: usize) -> Map<(Value, Vec<usize>)> {
    let dims = b.shape(x);
    let mut flat = vec![dims[..k].iter().product()];
    flat.extend_from_slice(&dims[k..]);
    Ok((reshape(b, x, flat)?, dims[k..].to_vec()))
}

/// `GatherND` with `batch_dims = 0` and indices known at import.
pub fn gather_nd(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    if a.int("batch_dims", 0)? != 0 {
        return Err("GatherND with batch_dims (only 0 is supported)".into());
    }
    let (x, indices) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let dims = b.shape(x);
    if b.known(indices).is_none() {
        return gather_nd_at_run_time(b, x, indices);
    }
    let (rows, mut out, k) = linear_rows(b, "GatherND", &dims, indices)?;
    let (flat, rest) = flatten_lead(b, x, k)?;
    let picked = super::pad::pick(b, &flat, 0, &rows)?;
    out.extend_from_slice(&rest);
    reshape(b, &picked, out)
}

/// A scatter's `reduction` attribute, which exists from opset 16 (before, it is left unread
/// and so refused as an unknown attribute).
fn reduction(b: &Builder, a: &Attrs) -> Map<String> {
    if b.opset >= 16 {
        a.string("reduction", "none")
    } else {
        Ok("none".into())
    }
}

/// `GatherND` with integer indices computed at run time (`x[idx]`, `logits[arange(B),
/// labels]`): per indexed axis j, the index column (negative ones plus the axis length, by a
/// comparison), checked against the axis by an `index_select` from the constant table
/// 0..n_j — which refuses an index outside it at run time, as every index kernel does, so an
/// index past its own axis can never alias another element — then the row number Σ iⱼ·strideⱼ
/// (exact: every partial sum is below the rows' count, at most 2^24) picks the row of the
/// flattened data.
fn gather_nd_at_run_time(b: &mut Builder, x: &Value, indices: &Value) -> Map<Value> {
    if !matches!(indices, Value::Node(id) if b.integral.contains(id)) {
        return Err(
            "GatherND indices computed from float values (ONNX requires integer indices)".into(),
        );
    }
    let dims = b.shape(x);
    let ishape = b.shape(indices);
    let (tuples, k) = match ishape.split_last() {
        Some((&k, tuples)) if k >= 1 && k <= dims.len() => (tuples.to_vec(), k),
        _ => {
            return Err(format!(
                "GatherND indices of shape {ishape:?} for data of shape {dims:?}: the last axis must be 1 to {}",
                dims.len()
            ))
        }
    };
    let rows: usize = dims[..k].iter().product();
    if rows > 1 << 24 {
        return Err(format!(
            "GatherND over {rows} rows of the indexed axes (indices are float32: at most 2^24)"
        ));
    }
    let count: usize = tuples.iter().product();
    let st = strides(&dims[..k]);
    let mut linear: Option<Value> = None;
    for j in 0..k {
        let n = dims[j];
        let col = b.op_on(
            Op::Slice {
                axis: ishape.len() - 1,
                start: j,
                end: j + 1,
            },
            &[indices],
        )?;
        let col = reshape(b, &col, vec![count])?;
        let wrapped = wrap_negative(b, &col, n)?;
        b.budget.take(&[n])?;
        let table = konst(Const::f32(vec![n], (0..n).map(|i| i as f32).collect()));
        let checked = b.op_on(Op::IndexSelect { axis: 0 }, &[&table, &wrapped])?;
        let term = b.op_on(
            Op::Scale {
                factor: st[j] as f32,
            },
            &[&checked],
        )?;
        linear = Some(match linear {
            None => term,
            Some(acc) => b.op_on(Op::Add, &[&acc, &term])?,
        });
    }
    let linear = linear.ok_or("GatherND without an indexed axis")?;
    let (flat, rest) = flatten_lead(b, x, k)?;
    let picked = b.op_on(Op::IndexSelect { axis: 0 }, &[&flat, &linear])?;
    let mut out = tuples;
    out.extend_from_slice(&rest);
    reshape(b, &picked, out)
}

/// `ScatterND` with indices known at import, `reduction` none or add.
pub fn scatter_nd(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let reduction = reduction(b, a)?;
    let (x, indices, updates) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    let dims = b.shape(x);
    let (rows, tuples, k) = linear_rows(b, "ScatterND", &dims, indices)?;
    let mut want = tuples.clone();
    want.extend_from_slice(&dims[k..]);
    if b.shape(updates) != want {
        return Err(format!(
            "ScatterND updates of shape {:?}: expected {want:?} (the index tuples' shape, then the data's axes after the indexed ones)",
            b.shape(updates)
        ));
    }
    let (flat, rest) = flatten_lead(b, x, k)?;
    let n = dims[..k].iter().product::<usize>();
    let mut upd_flat = vec![rows.len()];
    upd_flat.extend_from_slice(&rest);
    let upd = reshape(b, updates, upd_flat)?;
    let result = match reduction.as_str() {
        "none" => {
            // one index list over the data's rows and the updates' (float32 indices: at most
            // 2^24 positions), counted against the import's constant budget
            if n.saturating_add(rows.len()) > 1 << 24 {
                return Err(format!(
                    "ScatterND over {n} rows of the indexed axes (at most 2^24 rows and updates together)"
                ));
            }
            b.budget.take(&[n])?;
            let mut sel: Vec<usize> = (0..n).collect();
            let mut seen = HashSet::new();
            for (j, &r) in rows.iter().enumerate() {
                if !seen.insert(r) {
                    return Err(format!(
                        "ScatterND without a reduction writes row {r} of the indexed axes twice (ONNX leaves duplicate indices undefined)"
                    ));
                }
                sel[r] = n + j;
            }
            let both = b.op_on(Op::Concat { axis: 0 }, &[&flat, &upd])?;
            super::pad::pick(b, &both, 0, &sel)?
        }
        "add" => {
            // each update row's index broadcast along the row: scatter_add over axis 0
            let per_row: usize = rest.iter().product();
            let mut idx_dims = vec![rows.len()];
            idx_dims.extend_from_slice(&rest);
            b.budget.take(&idx_dims)?;
            let idx = rows
                .iter()
                .flat_map(|&r| std::iter::repeat_n(r as f32, per_row))
                .collect();
            let idx = konst(Const::f32(idx_dims, idx));
            b.op_on(Op::ScatterAdd { axis: 0 }, &[&flat, &idx, &upd])?
        }
        other => {
            return Err(format!(
                "ScatterND reduction `{other}` (none and add are supported)"
            ))
        }
    };
    reshape(b, &result, dims)
}

/// `ScatterElements` (`torch.scatter` / `scatter_add`), reduction none or add.
pub fn scatter_elements(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let reduction = reduction(b, a)?;
    let (x, idx, src) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    let dims = b.shape(x);
    let axis = normalize_axis(a.int("axis", 0)?, dims.len())?;
    let (ishape, sshape) = (b.shape(idx), b.shape(src));
    let fits = ishape.len() == dims.len()
        && sshape == ishape
        && ishape
            .iter()
            .zip(&dims)
            .enumerate()
            .all(|(d, (i, n))| d == axis || i <= n);
    if !fits {
        return Err(format!(
            "ScatterElements of data {dims:?} with indices {ishape:?} and updates {sshape:?}: the indices need the data's rank, no larger extents off axis {axis}, and the updates' shape"
        ));
    }
    let n = dims.get(axis).copied().unwrap_or(0);
    let index = element_indices(b, "ScatterElements", idx, n)?;
    match reduction.as_str() {
        "add" => b.op_on(Op::ScatterAdd { axis }, &[x, &index, src]),
        "none" => {
            let Value::Const(c) = &index else {
                return Err("ScatterElements without a reduction needs indices known at import (with indices computed at run time, duplicates could not be told apart from a sum)".into());
            };
            let xs = strides(&dims);
            let is = strides(&ishape);
            let picks = c.floats();
            b.budget.take(&dims)?;
            let mut mask = vec![false; dims.iter().product()];
            for (flat, &p) in picks.iter().enumerate() {
                let pos: usize = ishape
                    .iter()
                    .enumerate()
                    .map(|(d, _)| {
                        let i = if d == axis {
                            p as usize
                        } else {
                            flat / is[d] % ishape[d]
                        };
                        i * xs[d]
                    })
                    .sum();
                if std::mem::replace(&mut mask[pos], true) {
                    return Err(format!(
                        "ScatterElements without a reduction writes element {pos} twice (ONNX leaves duplicate indices undefined)"
                    ));
                }
            }
            b.budget.take(&dims)?;
            let zeros = konst(Const::f32(dims.clone(), vec![0.0; mask.len()]));
            let placed = b.op_on(Op::ScatterAdd { axis }, &[&zeros, &index, src])?;
            let mask = konst(Const {
                dims,
                data: Data::Bool(mask),
            });
            b.op_on(Op::Where, &[&mask, &placed, x])
        }
        other => Err(format!(
            "ScatterElements reduction `{other}` (none and add are supported)"
        )),
    }
}

/// `OneHot(indices, depth, values)` along `axis`.
pub fn one_hot(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let (idx, depth, values) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    // depth: an integer, or a float holding one (ONNX casts it to int64), read exactly
    let depth_c = b
        .known(depth)
        .filter(|c| c.len() == 1)
        .ok_or("OneHot's depth must be one number known at import")?;
    let depth = match &depth_c.data {
        Data::I64(v) => v[0] as f64,
        _ => depth_c.floats()[0] as f64,
    };
    if !(depth >= 1.0 && depth.fract() == 0.0 && depth <= (1u32 << 24) as f64) {
        return Err(format!(
            "OneHot depth {depth} (a whole number from 1 to 2^24 is required)"
        ));
    }
    let depth = depth as usize;
    let pair = b
        .known(values)
        .filter(|c| c.len() == 2)
        .ok_or("OneHot's values must be two numbers known at import ([off, on])")?;
    // integer values are written as float32 data: exact only up to 2^24
    if let Data::I64(v) = &pair.data {
        if let Some(big) = v.iter().find(|x| x.unsigned_abs() > 1 << 24) {
            return Err(format!(
                "OneHot value {big} is read as data beyond 2^24 (torchlean's tensors are float32)"
            ));
        }
    }
    let pair = pair.floats();
    let (off, on) = (pair[0], pair[1]);
    let ishape = b.shape(idx);
    let rank = ishape.len() + 1;
    let axis = normalize_axis(a.int("axis", -1)?, rank)?;
    // indices known at import are cast to int64 as ONNX says (a float truncates toward zero);
    // computed ones must be integers already
    let truncated;
    let idx = match b.known(idx) {
        Some(c) => {
            // exactly, in f64: an index outside [-depth, depth) becomes `depth`, which no
            // class equals (an int64 beyond 2^24 rounded to f32 could have)
            let exact: Vec<f64> = match &c.data {
                Data::I64(v) => v.iter().map(|&i| i as f64).collect(),
                _ => c.floats().iter().map(|&v| (v as f64).trunc()).collect(),
            };
            let d = depth as f64;
            let t = exact
                .iter()
                .map(|&v| if v >= -d && v < d { v as f32 } else { d as f32 })
                .collect();
            truncated = konst(Const::f32(c.dims.clone(), t));
            &truncated
        }
        None if matches!(idx, Value::Node(id) if b.integral.contains(id)) => idx,
        None => {
            return Err(
                "OneHot indices computed from float values (ONNX requires integer indices)".into(),
            )
        }
    };
    // the indices with a unit axis at `axis`, compared with 0..depth and with -depth..0 along it
    let mut unit = ishape.clone();
    unit.insert(axis, 1);
    let idx = reshape(b, idx, unit)?;
    let mut class_dims = vec![1; rank];
    class_dims[axis] = depth;
    b.budget.take(&[2, depth])?;
    let classes = |shift: f32| {
        konst(Const::f32(
            class_dims.clone(),
            (0..depth).map(|c| c as f32 - shift).collect(),
        ))
    };
    let (up, down) = (classes(0.0), classes(depth as f32));
    let hit = b.op_on(
        Op::Compare {
            relation: Relation::Eq,
        },
        &[&idx, &up],
    )?;
    let wrapped = b.op_on(
        Op::Compare {
            relation: Relation::Eq,
        },
        &[&idx, &down],
    )?;
    // (at most one of the two holds: the classes differ by depth)
    let hit = b.op_on(Op::Add, &[&hit, &wrapped])?;
    let on = konst(Const::f32(vec![], vec![on]));
    let off = konst(Const::f32(vec![], vec![off]));
    b.op_on(Op::Where, &[&hit, &on, &off])
}
