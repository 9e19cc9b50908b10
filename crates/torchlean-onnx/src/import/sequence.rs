//! ONNX sequences where the import can resolve them. PyTorch's dynamo exporter, with its
//! optimizer off, writes `Tensor.split`/`chunk` (nanoGPT's `qkv.split(C, 2)`, LSTM cells'
//! gate chunks) as `SplitToSequence` followed by `SequenceAt` at constant positions: the
//! sequence is held at import as the list of its parts (slices), and `SequenceAt` picks one.
//! Other sequence operators, and positions computed at run time, are refused.

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, reshape};
use super::{Builder, Value};
use crate::constant::{normalize_axis, Stride};
use torchlean::graph::Op;

type Map<T> = Result<T, String>;

/// The parts of `SplitToSequence(x, split?)` along `axis`: without `split`, one part per
/// element (the axis removed with `keepdims=0`); a scalar `split` gives parts of that size, the
/// last one shorter; a 1-D `split` gives the sizes, which must sum to the axis.
pub(super) fn split_to_sequence(
    b: &mut Builder,
    a: &Attrs,
    inputs: &[Option<Value>],
) -> Map<Vec<Value>> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let axis = normalize_axis(a.int("axis", 0)?, shape.len())?;
    let keepdims = a.int("keepdims", 1)? != 0;
    let len = shape[axis];
    let (sizes, squeeze) = match opt(inputs, 1) {
        None => (vec![1; len], !keepdims),
        Some(v) => {
            let given = b.ints(v, "split")?;
            let scalar = b.known(v).is_some_and(|c| c.dims.is_empty());
            if scalar {
                let chunk = usize::try_from(given[0])
                    .ok()
                    .filter(|&c| c > 0)
                    .ok_or_else(|| format!("SplitToSequence chunk size {}", given[0]))?;
                let n = len.div_ceil(chunk);
                ((0..n).map(|i| chunk.min(len - i * chunk)).collect(), false)
            } else {
                let sizes = given
                    .iter()
                    .map(|&s| usize::try_from(s))
                    .collect::<Result<Vec<usize>, _>>()
                    .map_err(|_| format!("SplitToSequence sizes {given:?}: a size is negative"))?;
                if sizes.iter().try_fold(0usize, |n, &s| n.checked_add(s)) != Some(len) {
                    return Err(format!(
                        "SplitToSequence sizes {given:?} do not sum to the axis length {len}"
                    ));
                }
                (sizes, false)
            }
        }
    };
    let mut parts = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for s in sizes {
        let part = match b.folded(x) {
            Some(c) => konst(c.slice(
                &[(
                    axis,
                    Stride {
                        start,
                        step: 1,
                        len: s,
                    },
                )],
                &b.budget,
            )?),
            None => b.op_on(
                Op::Slice {
                    axis,
                    start,
                    end: start + s,
                },
                &[x],
            )?,
        };
        parts.push(if squeeze {
            let mut dims = b.shape(&part);
            dims.remove(axis);
            reshape(b, &part, dims)?
        } else {
            part
        });
        start += s;
    }
    Ok(parts)
}

/// The position of `SequenceAt` (known at import, negative counted from the end) in a
/// sequence of `n` parts.
pub(super) fn position(b: &Builder, pos: &Value, n: usize) -> Map<usize> {
    let p = b
        .known(pos)
        .and_then(|c| c.ints().ok())
        .filter(|v| v.len() == 1)
        .ok_or("SequenceAt's position must be one integer known at import")?[0];
    crate::constant::normalize_index(p, n)
        .map_err(|_| format!("SequenceAt position {p} in a sequence of {n} tensors"))
}
