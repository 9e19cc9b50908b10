//! `Resize` in `nearest`, `linear` and `cubic` mode (PyTorch's `nn.Upsample` / `F.interpolate` with
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
//! f64 until the thirty-seventh session; an audit against onnxruntime).
//!
//! One exception: `nearest` with the output size given (`sizes`, PyTorch's export of
//! `F.interpolate(size=…)`) picks its source index from the exact rational coordinate
//! ([`exact_source`]): the scale is then the ratio `out / in` itself, not an f32 number. In
//! f32, 35 → 5 `asymmetric` + `floor` computes 1 / (5/35 in f32) = 6.9999997 and reads input
//! 6 where PyTorch (and the ONNX reference evaluator, in f64) read 7; and `round_prefer_*`
//! missed half-way points (7 → 4: 2 / (4/7 in f32) = 3.4999998, where onnxruntime and the
//! reference evaluator take 3.5 as half-way). docs/onnx.md has the sweeps behind this choice.
//!
//! `cubic` (forty-eighth session; PyTorch's `bicubic`): four taps per output with Keys'
//! weights ([`cubic_taps`]), the last axis first. Refused: `exclude_outside=1`,
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

/// The exact source coordinate of output position `o` when the output size was given
/// (`sizes`): the scale is the ratio `out / n` itself, so the coordinate is the rational
/// `num / den` (`den > 0`) of the operator's definition, with no rounding.
fn exact_source(mode: &str, o: usize, n: usize, out: usize) -> Map<(i128, i128)> {
    let (o, n, out) = (o as i128, n as i128, out as i128);
    Ok(match mode {
        "asymmetric" => (o * n, out),
        "half_pixel" => ((2 * o + 1) * n - out, 2 * out),
        "pytorch_half_pixel" if out > 1 => ((2 * o + 1) * n - out, 2 * out),
        "pytorch_half_pixel" => (0, 1),
        "tf_half_pixel_for_nn" => ((2 * o + 1) * n, 2 * out),
        "align_corners" if out > 1 => (o * (n - 1), out - 1),
        "align_corners" => (0, 1),
        other => {
            return Err(format!(
                "Resize with coordinate_transformation_mode={other}"
            ))
        }
    })
}

/// [`nearest`] on an exact coordinate `num / den`: the half-way test is an integer test.
fn nearest_exact((num, den): (i128, i128), rule: &str, n: usize) -> Map<usize> {
    let floor = num.div_euclid(den);
    let rest = 2 * num.rem_euclid(den); // 2·(x − ⌊x⌋)·den, in [0, 2·den)
    let i = match rule {
        "round_prefer_floor" if rest <= den => floor,
        "round_prefer_ceil" if rest < den => floor,
        "round_prefer_floor" | "round_prefer_ceil" => floor + 1,
        "floor" => floor,
        "ceil" if rest == 0 => floor,
        "ceil" => floor + 1,
        other => return Err(format!("Resize with nearest_mode={other}")),
    };
    Ok(i.clamp(0, n as i128 - 1) as usize)
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
    let coeff_a = a.float("cubic_coeff_a", -0.75)?;
    // read, and irrelevant to the modes supported (tf_crop_and_resize's)
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
    if !matches!(mode.as_str(), "nearest" | "linear" | "cubic") {
        return Err(format!("Resize mode `{mode}` (nearest, linear and cubic)"));
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
    // per axis: the output size, the scale, and whether the size was given (`sizes`)
    let mut target: Vec<(usize, f32, bool)> = shape.iter().map(|&n| (n, 1.0, false)).collect();
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
                target[ax] = (out as usize, f, false);
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
                target[ax] = (out, scale, true);
            }
        }
        _ => return Err("Resize needs exactly one of scales and sizes".into()),
    }
    let mut y = x.clone();
    // cubic runs the last axis first, as PyTorch's bicubic kernel (each row along x, then
    // the four rows along y); the other modes in order
    let mut order: Vec<usize> = (0..rank).collect();
    if mode == "cubic" {
        order.reverse();
    }
    for ax in order {
        let (out, scale, sized) = target[ax];
        let n = shape[ax];
        if out == n && (scale == 1.0 || n <= 1) {
            continue; // every mode maps each position to itself
        }
        if n == 0 || out == 0 {
            return Err(format!("Resize of axis {ax} from {n} to {out} elements"));
        }
        // the index lists and weights: 3 per output for nearest and linear, 8 for cubic
        b.budget.take(&[out, if mode == "cubic" { 8 } else { 3 }])?;
        let coords = || {
            (0..out)
                .map(|o| source(&transform, o, n, out, scale))
                .collect::<Map<Vec<f64>>>()
        };
        if mode == "nearest" {
            // from `sizes`, the coordinate is exact (module doc); from f32 `scales`, it is
            // onnxruntime's f32 value
            let picks = if sized {
                (0..out)
                    .map(|o| nearest_exact(exact_source(&transform, o, n, out)?, &rule, n))
                    .collect::<Map<Vec<usize>>>()?
            } else {
                coords()?
                    .iter()
                    .map(|&c| nearest(c, &rule, n))
                    .collect::<Map<Vec<usize>>>()?
            };
            y = pick(b, &y, ax, &picks)?;
            continue;
        }
        let at = |v: Vec<f32>| {
            let mut dims = vec![1; rank];
            dims[ax] = out;
            konst(Const::f32(dims, v))
        };
        if mode == "cubic" {
            let (taps, weights) = cubic_taps(&coords()?, n, coeff_a);
            let mut sum: Option<Value> = None;
            for (tap, w) in taps.into_iter().zip(weights) {
                let xk = pick(b, &y, ax, &tap)?;
                let term = b.op_on(Op::Mul, &[&xk, &at(w)])?;
                sum = Some(match sum {
                    None => term,
                    Some(s) => b.op_on(Op::Add, &[&s, &term])?,
                });
            }
            y = sum.ok_or("Resize cubic: no taps")?;
            continue;
        }
        let (mut lo, mut hi, mut w) = (vec![], vec![], vec![]);
        for c in coords()? {
            let c = (c as f32).clamp(0.0, (n - 1) as f32);
            let i0 = c.floor() as usize;
            lo.push(i0);
            hi.push((i0 + 1).min(n - 1));
            w.push(c - i0 as f32);
        }
        let x0 = pick(b, &y, ax, &lo)?;
        let x1 = pick(b, &y, ax, &hi)?;
        let w0 = at(w.iter().map(|w| 1.0 - w).collect());
        let left = b.op_on(Op::Mul, &[&x0, &w0])?;
        let right = b.op_on(Op::Mul, &[&x1, &at(w)])?;
        y = b.op_on(Op::Add, &[&left, &right])?;
    }
    Ok(y)
}

/// `cubic`: for each output's source coordinate c, the four input positions ⌊c⌋ − 1 … ⌊c⌋ + 2
/// clamped to the axis (the border repeated, as PyTorch's bicubic and onnxruntime with
/// `exclude_outside=0`), and their weights by Keys' cubic convolution with coefficient `a`
/// (−0.75: PyTorch's), computed in f32 with PyTorch's formulas (`cubic_convolution1/2` of
/// t + 1, t, 1 − t, 2 − t, t = c − ⌊c⌋). The coordinate is not clamped first (PyTorch's
/// `area_pixel_compute_source_index` with `cubic`). Per tap: the index list and the weights.
fn cubic_taps(coords: &[f64], n: usize, a: f32) -> (Vec<Vec<usize>>, Vec<Vec<f32>>) {
    let near = |x: f32| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    let mut taps: Vec<Vec<usize>> = (0..4).map(|_| Vec::with_capacity(coords.len())).collect();
    let mut weights: Vec<Vec<f32>> = (0..4).map(|_| Vec::with_capacity(coords.len())).collect();
    for &c in coords {
        let c = c as f32;
        let base = c.floor();
        let t = c - base;
        let w = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)];
        for k in 0..4 {
            let i = (base as i64 - 1 + k as i64).clamp(0, n as i64 - 1) as usize;
            taps[k].push(i);
            weights[k].push(w[k]);
        }
    }
    (taps, weights)
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
    use super::{exact_source, nearest, nearest_exact, source};

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

    #[test]
    fn exact_coordinates_decide_half_way_points_and_integers() {
        // 7 → 4, output 2: 2·7/4 = 3.5 exactly
        let c = exact_source("asymmetric", 2, 7, 4).unwrap();
        assert_eq!(c.0 * 2, 7 * c.1);
        assert_eq!(nearest_exact(c, "round_prefer_ceil", 7).unwrap(), 4);
        assert_eq!(nearest_exact(c, "round_prefer_floor", 7).unwrap(), 3);
        // half_pixel 4 → 8, output 0: −0.25 clamps to 0; output 7: 3.25
        assert_eq!(exact_source("half_pixel", 0, 4, 8).unwrap(), (-4, 16));
        assert_eq!(nearest_exact((-4, 16), "floor", 4).unwrap(), 0);
        assert_eq!(nearest_exact((52, 16), "ceil", 4).unwrap(), 3);
        // an integer coordinate is its own ceiling
        assert_eq!(nearest_exact((14, 2), "ceil", 35).unwrap(), 7);
    }
}
