//! `TopK` (`torch.topk`, and `torch.sort`, which PyTorch exports as a `TopK` over the whole
//! axis) written with torchlean's ops: k rounds, each picking one element per row with
//! `argmax` and marking it taken.
//!
//! Round j, over the elements not yet taken (`taken`, 0/1, the axis' length; `blocked` also
//! holds NaN when the smallest are asked for, so that NaN comes last):
//! - `key = where(blocked, −∞, ±x)` and `m = key[argmax(key)]`: the round's extreme value
//!   (`argmax` ranks NaN above everything, as PyTorch's `topk` does);
//! - `cand = ((key == m) or (key ≠ key)) · (1 − blocked)`: the elements not blocked that hold
//!   it — an element equal to −∞ is told apart from a taken one, which a −∞ mask alone would
//!   not do;
//! - for the smallest, where no element is left but NaN (`cand` empty), the NaNs;
//! - `index = argmax(cand)`: the first of them (ties in index order: ONNX's rule, as
//!   onnxruntime and `torch.sort`; PyTorch's CPU `torch.topk` orders ties otherwise), and
//!   `value = gather(x, index)`, through which the gradient
//!   reaches exactly the chosen element (PyTorch's topk backward scatters it there).
//!
//! Values and indices are concatenated along the axis; the indices are integers (what reads
//! them must be exact on integers). Each round is a dozen ops over the input's shape, so `k`
//! is bounded ([`MAX_K`]); a larger `k` is refused, naming the bound.

use super::ops::{arg, konst, reshape, Map};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::{Op, Relation};

/// The most rounds (`k`) a `TopK` may ask for.
pub const MAX_K: usize = 256;

pub(super) fn topk(
    b: &mut Builder,
    axis: i64,
    largest: bool,
    inputs: &[Option<Value>],
) -> Map<(Value, Value)> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    if shape.is_empty() {
        return Err("TopK of a 0-d value (ONNX requires rank >= 1)".into());
    }
    let axis = crate::constant::normalize_axis(axis, shape.len())?;
    let k = match b.ints(arg(inputs, 1)?, "K")?[..] {
        [k] if k >= 0 => k as usize,
        ref other => {
            return Err(format!(
                "TopK's K must be one non-negative value, got {other:?}"
            ))
        }
    };
    let n = shape[axis];
    if k > n {
        return Err(format!("TopK's K = {k} exceeds the axis' {n} elements"));
    }
    if k > MAX_K {
        return Err(format!(
            "TopK with K = {k}: torchlean composes it from {k} rounds of argmax and takes at most {MAX_K}"
        ));
    }
    let mut kept = shape.clone();
    kept[axis] = 1;
    if k == 0 {
        let mut empty = shape.clone();
        empty[axis] = 0;
        let none = konst(Const::f32(empty, vec![]));
        return Ok((none.clone(), none));
    }
    // positions along the axis, broadcast over the others
    let mut iota_dims = vec![1; shape.len()];
    iota_dims[axis] = n;
    let iota = konst(Const::f32(iota_dims, (0..n).map(|i| i as f32).collect()));
    let scalar = |v: f32| konst(Const::f32(vec![], vec![v]));
    let (one, minus_inf) = (scalar(1.0), scalar(f32::NEG_INFINITY));
    let cmp = |b: &mut Builder, relation, l: &Value, r: &Value| {
        b.op_on(Op::Compare { relation }, &[l, r])
    };
    let nan = cmp(b, Relation::Ne, x, x)?;
    let signed = if largest {
        x.clone()
    } else {
        b.op_on(Op::Neg, &[x])?
    };
    // the first element per row (`argmax` over `v` kept as an axis of one) and its value
    let first = |b: &mut Builder, v: &Value| -> Map<(Value, Value)> {
        let i = b.op_on(Op::Argmax { axis }, &[v])?;
        let i = reshape(b, &i, kept.clone())?;
        let at = b.op_on(Op::Gather { axis }, &[v, &i])?;
        Ok((i, at))
    };
    let mut taken = b.op_on(Op::Scale { factor: 0.0 }, &[&nan])?;
    let (mut values, mut indices) = (vec![], vec![]);
    for _ in 0..k {
        let blocked = if largest {
            taken.clone()
        } else {
            b.op_on(Op::Maximum, &[&taken, &nan])?
        };
        let open = b.op_on(Op::Sub, &[&one, &blocked])?;
        let key = b.op_on(Op::Where, &[&blocked, &minus_inf, &signed])?;
        let (_, m) = first(b, &key)?;
        let equal = cmp(b, Relation::Eq, &key, &m)?;
        let is_nan = cmp(b, Relation::Ne, &key, &key)?;
        let holds = b.op_on(Op::Maximum, &[&equal, &is_nan])?;
        let mut cand = b.op_on(Op::Mul, &[&holds, &open])?;
        if !largest {
            // only NaNs left: they come last, in index order
            let (_, any) = first(b, &cand)?;
            let none = b.op_on(Op::Sub, &[&one, &any])?;
            let untaken = b.op_on(Op::Sub, &[&one, &taken])?;
            let nans = b.op_on(Op::Mul, &[&nan, &untaken])?;
            let nans = b.op_on(Op::Mul, &[&nans, &none])?;
            cand = b.op_on(Op::Add, &[&cand, &nans])?;
        }
        let (index, _) = first(b, &cand)?;
        values.push(b.op_on(Op::Gather { axis }, &[x, &index])?);
        let hit = cmp(b, Relation::Eq, &iota, &index)?;
        taken = b.op_on(Op::Add, &[&taken, &hit])?;
        indices.push(index);
    }
    let join = |b: &mut Builder, parts: &[Value]| -> Map<Value> {
        if parts.len() == 1 {
            return Ok(parts[0].clone());
        }
        let refs: Vec<&Value> = parts.iter().collect();
        b.op_on(Op::Concat { axis }, &refs)
    };
    let values = join(b, &values)?;
    let indices = join(b, &indices)?;
    Ok((values, indices))
}
