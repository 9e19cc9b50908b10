//! ONNX sequences where the import can resolve them. PyTorch's dynamo exporter, with its
//! optimizer off, writes `Tensor.split`/`chunk` (nanoGPT's `qkv.split(C, 2)`, LSTM cells'
//! gate chunks) as `SplitToSequence` followed by `SequenceAt` at constant positions: the
//! sequence is held at import as the list of its parts (slices), and `SequenceAt` picks one.
//! Other sequence operators, and positions computed at run time, are refused.

use super::attrs::Attrs;
use super::ops::{arg, opt, reshape, split_parts, split_sizes};
use super::{Builder, Value};
use crate::constant::normalize_axis;

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
                let sizes = split_sizes(&given, len, "SplitToSequence")?;
                (sizes, false)
            }
        }
    };
    let parts = split_parts(b, x, axis, &sizes)?;
    if !squeeze {
        return Ok(parts);
    }
    parts
        .iter()
        .map(|part| {
            let mut dims = b.shape(part);
            dims.remove(axis);
            reshape(b, part, dims)
        })
        .collect()
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
