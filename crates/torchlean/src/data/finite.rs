//! The one rule for non-finite values in loaded data: refused, naming where (see the module
//! doc of `data`).

/// The largest magnitude up to which every integer is exact in f32 (2^24): integer values
/// beyond it are refused by every reader rather than rounded (NPY, IDX, CSV class labels;
/// safetensors' integer tensors likewise).
pub(super) const EXACT_F32_INTEGER: f64 = 16_777_216.0;

/// Checks that every decoded value is finite; otherwise a message naming the first bad
/// element and its byte offset (`data_start` + index × `elem_size`) in the file.
pub(super) fn refuse_non_finite(
    values: &[f32],
    data_start: usize,
    elem_size: usize,
) -> Result<(), String> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(format!(
            "element {i} (byte offset {}) reads as {} in float32: non-finite values (NaN, inf, or beyond the float32 range) are refused",
            i.saturating_mul(elem_size).saturating_add(data_start),
            values[i]
        )),
    }
}

/// The first non-finite value of `values`, as (sample, position within the sample), for
/// in-memory datasets whose samples have `width` values.
pub(super) fn first_non_finite(values: &[f32], width: usize) -> Option<(usize, usize, f32)> {
    let i = values.iter().position(|v| !v.is_finite())?;
    let w = width.max(1);
    Some((i / w, i % w, values[i]))
}
