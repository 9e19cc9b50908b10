//! `Resize` in `nearest` and `linear` mode (PyTorch's `nn.Upsample` / `F.interpolate` with
//! `nearest`, `linear`, `bilinear`, `trilinear`), one axis at a time: each output position's
//! source coordinate is computed at import by the operator's
//! `coordinate_transformation_mode`, then
//! - `nearest`: the source index after `nearest_mode`, clamped to the axis — read by
//!   [`pick`] (`index_select` with a constant index list);
//! - `linear`: the coordinate clamped to [0, n − 1], its two neighbours read by [`pick`] and
//!   weighted by constant vectors (`(1 − w)·x[i₀] + w·x[i₁]`), as onnxruntime and PyTorch do.
//!
//! Coordinates, output sizes from scales, and linear weights are computed in f32, in
//! onnxruntime's order of operations (`x / scale`, `(x + 0.5) / scale − 0.5`, …, with `scale`
//! the f32 attribute or `out / in` in f32): in f64, a coordinate that f32 rounds onto an
//! integer (asymmetric, scale 0.6: 3 / 0.6f is exactly 5 in f32, 4.99999985… in f64) floored
//! to the index below, a different source pixel than onnxruntime's and PyTorch's (computed in
//! f64 until the thirty-seventh session; an audit against onnxruntime). Refused: `cubic`,
//! `tf_crop_and_resize` and `half_pixel_symmetric`, `antialias`, a `keep_aspect_ratio_policy`
//! other than `stretch`, scales or sizes computed at run time.

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, Map};
use super::pad::pick;
use super::{Builder, Value};
use crate::constant::{normalize_axis, Const};
use torchlean::graph::Op;

/// The source coordinate of output position `o` on an axis of `n` inputs resized to `out`
/// with `scale`.
fn source(mode: &str, o: usize, n: usize, out: usize, scale: f32) -> Map<f64> {
    let o = o as f32;
    let c: f32 = match mode {
        "half_pixel" => (o + 0.5) / scale - 0.5,
        "pytorch_half_pixel" if out > 1 => (o + 0.5) / scale - 0.5,
        "pytorch_half_pixel" => 0.0,
        "align_corners" if out > 1 => o * (n as f32 - 1.0) / (out as f32 - 1.0),
        "align_corners" => 0.0,
        "asymmetric" => o / scale,
        "tf_half_pixel_for_nn" => (o + 0.5) / scale,
        other => {
            return Err(format!(
                "Resize with coordinate_transformation_mode={other}"
            ))
        }
    };
    Ok(c as f64)
}

/// The nearest input index to coordinate `x` by `nearest_mode`, clamped to `0..n`.
fn nearest(x: f64, rule: &str, n: usize) -> Map<usize> {
    let i = match rule {
        "round_prefer_floor" if x.fract().abs() == 0.5 => x.floor(),
        "round_prefer_ceil" if x.fract().abs() == 0.5 => x.ceil(),
        "round_prefer_floor" | "round_prefer_ceil" => x.round(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        other => return Err(format!("Resize with nearest_mode={other}")),
    };
    Ok(i.clamp(0.0, (n - 1) as f64) as usize)
}

pub(super) fn resize(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let x = arg(inputs, 0)?;
    let shape = b.shape(x);
    let rank = shape.len();
    let mode = a.string("mode", "nearest")?;
    let transform = a.string("coordinate_transformation_mode", "half_pixel")?;
    let rule = a.string("nearest_mode", "round_prefer_floor")?;
    // read, and irrelevant to nearest and linear (cubic's and tf_crop_and_resize's)
    a.float("cubic_coeff_a", -0.75)?;
    a.float("extrapolation_value", 0.0)?;
    if a.int("exclude_outside", 0)? != 0 {
        return Err("Resize with exclude_outside=1".into());
    }
    if b.opset >= 18 {
        if a.int("antialias", 0)? != 0 {
            return Err("Resize with antialias=1".into());
        }
        let policy = a.string("keep_aspect_ratio_policy", "stretch")?;
        if policy != "stretch" {
            return Err(format!("Resize with keep_aspect_ratio_policy={policy}"));
        }
    }
    if mode != "nearest" && mode != "linear" {
        return Err(format!("Resize mode `{mode}` (nearest and linear)"));
    }
    let axes: Vec<usize> = match (b.opset >= 18)
        .then(|| a.ints("axes"))
        .transpose()?
        .flatten()
    {
        Some(ax) => ax
            .iter()
            .map(|&v| normalize_axis(v, rank))
            .collect::<Map<_>>()?,
        None => (0..rank).collect(),
    };
    if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
        return Err(format!("Resize with a repeated axis in {axes:?}"));
    }
    // scales or sizes: one of them, known at import (an empty tensor counts as absent)
    let known = |i: usize| -> Map<Option<std::rc::Rc<Const>>> {
        match opt(inputs, i) {
            None => Ok(None),
            Some(v) => match b.known(v) {
                Some(c) if c.dims.iter().product::<usize>() == 0 => Ok(None),
                Some(c) => Ok(Some(c)),
                None => Err(format!(
                    "Resize's {} computed at run time (only constants)",
                    if i == 2 { "scales" } else { "sizes" }
                )),
            },
        }
    };
    let (scales, sizes) = (known(2)?, known(3)?);
    let mut target: Vec<(usize, f32)> = shape.iter().map(|&n| (n, 1.0)).collect();
    match (scales, sizes) {
        (Some(s), None) => {
            let s = s.floats();
            one_per_axis("scales", s.len(), axes.len())?;
            for (&ax, &f) in axes.iter().zip(s.iter()) {
                if !(f.is_finite() && f > 0.0) {
                    return Err(format!("Resize scale {f} (a positive number)"));
                }
                // onnxruntime's output size: the f32 product, truncated
                let out = ((shape[ax] as f32 * f) as f64).floor();
                if out > (1u64 << 31) as f64 {
                    return Err(format!("Resize of axis {ax} to {out} elements"));
                }
                target[ax] = (out as usize, f);
            }
        }
        (None, Some(z)) => {
            let z = z.ints()?;
            one_per_axis("sizes", z.len(), axes.len())?;
            for (&ax, &n) in axes.iter().zip(z.iter()) {
                let out = usize::try_from(n).map_err(|_| format!("Resize size {n}"))?;
                let scale = if shape[ax] == 0 {
                    1.0
                } else {
                    out as f32 / shape[ax] as f32
                };
                target[ax] = (out, scale);
            }
        }
        _ => return Err("Resize needs exactly one of scales and sizes".into()),
    }
    let mut y = x.clone();
    for (ax, &(out, scale)) in target.iter().enumerate() {
        let n = shape[ax];
        if out == n && (scale == 1.0 || n <= 1) {
            continue; // every mode maps each position to itself
        }
        if n == 0 || out == 0 {
            return Err(format!("Resize of axis {ax} from {n} to {out} elements"));
        }
        b.budget.take(&[out, 3])?;
        let coords = (0..out)
            .map(|o| source(&transform, o, n, out, scale))
            .collect::<Map<Vec<f64>>>()?;
        if mode == "nearest" {
            let picks = coords
                .iter()
                .map(|&c| nearest(c, &rule, n))
                .collect::<Map<Vec<usize>>>()?;
            y = pick(b, &y, ax, &picks)?;
            continue;
        }
        let (mut lo, mut hi, mut w) = (vec![], vec![], vec![]);
        for c in coords {
            let c = (c as f32).clamp(0.0, (n - 1) as f32);
            let i0 = c.floor() as usize;
            lo.push(i0);
            hi.push((i0 + 1).min(n - 1));
            w.push(c - i0 as f32);
        }
        let at = |v: Vec<f32>| {
            let mut dims = vec![1; rank];
            dims[ax] = out;
            konst(Const::f32(dims, v))
        };
        let x0 = pick(b, &y, ax, &lo)?;
        let x1 = pick(b, &y, ax, &hi)?;
        let w0 = at(w.iter().map(|w| 1.0 - w).collect());
        let left = b.op_on(Op::Mul, &[&x0, &w0])?;
        let right = b.op_on(Op::Mul, &[&x1, &at(w)])?;
        y = b.op_on(Op::Add, &[&left, &right])?;
    }
    Ok(y)
}

/// Resize's scales or sizes give one value per resized axis.
fn one_per_axis(what: &str, given: usize, axes: usize) -> Result<(), String> {
    if given == axes {
        Ok(())
    } else {
        Err(format!("Resize with {given} {what} for {axes} axes"))
    }
}

#[cfg(test)]
mod tests {
    use super::{nearest, source};

    #[test]
    fn coordinates_follow_the_onnx_definitions() {
        // upsampling 4 → 8 (scale 2): half_pixel maps output 0 to −0.25, 7 to 3.25
        assert_eq!(source("half_pixel", 0, 4, 8, 2.0).unwrap(), -0.25);
        assert_eq!(source("half_pixel", 7, 4, 8, 2.0).unwrap(), 3.25);
        assert_eq!(source("align_corners", 7, 4, 8, 2.0).unwrap(), 3.0);
        assert_eq!(source("asymmetric", 5, 4, 8, 2.0).unwrap(), 2.5);
        assert_eq!(source("pytorch_half_pixel", 0, 4, 1, 0.25).unwrap(), 0.0);
        assert_eq!(nearest(2.5, "round_prefer_floor", 4).unwrap(), 2);
        assert_eq!(nearest(2.5, "round_prefer_ceil", 4).unwrap(), 3);
        assert_eq!(nearest(-0.25, "round_prefer_floor", 4).unwrap(), 0);
        assert_eq!(nearest(3.9, "ceil", 4).unwrap(), 3);
    }
}
