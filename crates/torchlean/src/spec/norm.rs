//! Normalization with batch statistics: `layer_norm` and `rms_norm` over the last axis,
//! `batch_norm` over every axis except `channel_axis` (training-mode, biased variance).
//! Running statistics for evaluation belong to the `nn` layer, not to the op.

use super::array::split_at_axis;
use super::{expect_arity, payload_err, shape_err, Array, InputGrads};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let (eps, n) = match op {
        Op::LayerNorm { eps } => (*eps, 3),
        Op::RmsNorm { eps } => (*eps, 2),
        Op::BatchNorm { eps, .. } => (*eps, 3),
        _ => unreachable!("norm::shape called for {}", op.name()),
    };
    expect_arity(op, shapes, &[n])?;
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(payload_err(
            op,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    let x = shapes[0];
    let feature = match op {
        Op::BatchNorm { channel_axis, .. } if *channel_axis < x.len() => Some(x[*channel_axis]),
        Op::BatchNorm { .. } => None,
        _ => x.last().copied(),
    };
    // batch statistics of one value per channel normalize it to 0: every output would be β
    // and no gradient would reach x (PyTorch refuses the same: "Expected more than 1 value
    // per channel when training")
    if let (Op::BatchNorm { channel_axis, .. }, Some(c)) = (op, feature) {
        let per_channel = x
            .iter()
            .enumerate()
            .filter(|&(a, _)| a != *channel_axis)
            .fold(1usize, |n, (_, &d)| n.saturating_mul(d));
        if c > 0 && per_channel == 1 {
            return Err(shape_err(
                op,
                shapes,
                "more than one value per channel (batch statistics of one value normalize it to 0, every output would be beta)",
            ));
        }
    }
    match feature {
        Some(f) if shapes[1..].iter().all(|s| *s == [f]) => Ok(x.to_vec()),
        _ => Err(shape_err(
            op,
            shapes,
            match op {
                Op::BatchNorm { channel_axis, .. } => format!(
                    "x with a channel axis {channel_axis}, and gamma/beta of shape [channels]"
                ),
                _ => "x [..., d] and affine parameters of shape [d]".to_string(),
            },
        )),
    }
}

/// The normalization groups: for each group, the flat indices of its elements; and for each
/// flat index, the index of its affine parameter.
fn groups(op: &Op, shape: &[usize]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let total: usize = shape.iter().product();
    match op {
        Op::BatchNorm { channel_axis, .. } => {
            let (outer, c, inner) = split_at_axis(shape, *channel_axis);
            let mut gs = vec![Vec::with_capacity(outer * inner); c];
            let mut param = vec![0; total];
            for o in 0..outer {
                for ch in 0..c {
                    for i in 0..inner {
                        let f = (o * c + ch) * inner + i;
                        gs[ch].push(f);
                        param[f] = ch;
                    }
                }
            }
            (gs, param)
        }
        _ => {
            let d = *shape.last().unwrap_or(&1);
            let rows = total.checked_div(d).unwrap_or(0);
            let gs = (0..rows).map(|r| (r * d..(r + 1) * d).collect()).collect();
            (gs, (0..total).map(|f| f % d.max(1)).collect())
        }
    }
}

fn eps_of<T: Scalar>(op: &Op) -> T {
    match op {
        Op::LayerNorm { eps } | Op::RmsNorm { eps } | Op::BatchNorm { eps, .. } => {
            T::c(*eps as f64)
        }
        _ => unreachable!("norm::eps_of called for {}", op.name()),
    }
}

/// A group's statistics, in the form that normalizes without overflow: x̂ = (x·s − m)·r, with
/// s = 1, m the mean and r = 1/std for ordinary groups (x̂ = (x − μ)·rstd, bit for bit), and
/// for groups whose statistics overflow `T` ([`rescaled_stats`]) s = 2⁻ᵉ and m, r the
/// statistics of the scaled values: x − μ itself overflows there (x = −3e38, μ = 2e38 in
/// f32), x·s − m does not, and x̂ is an ordinary number (|x̂| ≤ √n).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupStats<T> {
    pub mu: T,
    pub rstd: T,
    pub s: T,
}

impl<T: Scalar> GroupStats<T> {
    /// The normalized value of `v`.
    pub fn xhat(&self, v: T) -> T {
        (v * self.s - self.mu) * self.rstd
    }
    /// 1/std of the unscaled values (the factor of the input gradient).
    pub fn rstd(&self) -> T {
        self.rstd * self.s
    }
    /// The mean of the unscaled values.
    pub fn mean(&self) -> T {
        self.mu / self.s
    }
}

/// Mean and reciprocal standard deviation of a group (rms: mean 0, rstd = 1/sqrt(mean(x²)+eps)).
fn stats<T: Scalar>(op: &Op, x: &[T], g: &[usize]) -> GroupStats<T> {
    stats_of(op, g.iter().map(|&f| x[f]))
}

/// [`stats`] of one row.
fn row_stats<T: Scalar>(op: &Op, row: &[T]) -> GroupStats<T> {
    stats_of(op, row.iter().copied())
}

/// Mean and 1/std of a group's values, summed in the iterator's order (see
/// [`rescaled_stats`] for finite values whose statistics overflow `T`).
fn stats_of<T: Scalar>(op: &Op, values: impl Iterator<Item = T> + Clone) -> GroupStats<T> {
    let rms = matches!(op, Op::RmsNorm { .. });
    let (mu, var) = moments(rms, values.clone());
    let eps = eps_of::<T>(op);
    if mu.is_finite() && var.is_finite() || !values.clone().all(|v| v.is_finite()) {
        return GroupStats {
            mu,
            rstd: T::one() / (var + eps).sqrt(),
            s: T::one(),
        };
    }
    rescaled_stats(rms, eps, values)
}

/// (mean, variance) of the values (mean 0 for RMS norm), summed in the iterator's order.
///
/// The mean is taken relative to the first value, `x₀ + Σ(x − x₀)/n`: a constant group then
/// has its mean exactly (every difference is 0), so its deviations are exactly 0 and its
/// output the shift β, as PyTorch's; a plain `Σx/n` errs by a few ulps of a large mean, and
/// with ε ≪ (that error)² a constant row normalized to ±0.8 where 0 is right. Every kernel of
/// the norms computes its mean so (`shifted_mean`). The error of any f32 summation of it is
/// still within `cancellation_allowance`'s bound (below): |δμ| ≤ u·|μ| + γ_n·mean|x − x₀|.
fn moments<T: Scalar>(rms: bool, values: impl Iterator<Item = T> + Clone) -> (T, T) {
    let n = T::c(values.clone().count() as f64);
    let mu = if rms {
        T::zero()
    } else {
        shifted_mean(values.clone(), n)
    };
    let var = super::sum::sum(values.map(|v| (v - mu) * (v - mu))) / n;
    (mu, var)
}

/// `x₀ + Σ(x − x₀)/n` with x₀ the first value (0 for no values), summed in the iterator's
/// order: see [`moments`].
pub(crate) fn shifted_mean<T: Scalar>(values: impl Iterator<Item = T> + Clone, n: T) -> T {
    let Some(x0) = values.clone().next() else {
        return super::sum::sum(values) / n;
    };
    x0 + super::sum::sum(values.map(|v| v - x0)) / n
}

/// Mean and 1/std of **finite** values whose sum or sum of squared deviations overflows `T`
/// (in f32, rows of magnitude ≳ 1.8·10¹⁹: the variance was +∞, 1/std 0, and every output
/// the bias β — silently; PyTorch's kernels give NaN). The normalized values are ordinary
/// numbers, so they are computed on the values scaled by s = 2⁻ᵉ with 2ᵉ > max|v| (exact: a
/// power of two), where nothing overflows: the statistics of the scaled values, mean_s and
/// 1/√(var_s + ε·s²), and x̂ = (x·s − mean_s)/√(var_s + ε·s²) — the same quantity, rounded
/// differently (until the forty-fourth session x̂ was formed unscaled, and x − μ overflowed:
/// −inf and ±inf gradients for a row `[−3e38, 3e38 ×5]`). The f64 evaluation of f32 inputs never gets
/// here (f32's range squared fits f64), so the checkers' f64 reference is unchanged. Every
/// kernel of the norms calls this when its own statistics overflow.
pub(crate) fn rescaled_stats<T: Scalar>(
    rms: bool,
    eps: T,
    values: impl Iterator<Item = T> + Clone,
) -> GroupStats<T> {
    let big = values
        .clone()
        .fold(T::zero(), |m, v| if v.abs() > m { v.abs() } else { m });
    // 2^e > big; e ≤ 128 for f32, and 2^-e is a normal f32 down to e = 126, subnormal (still
    // exact) to 149
    let e = big.f64().log2().floor() as i32 + 1;
    let inv = T::c(2f64.powi(-e));
    let (mu, var) = moments(rms, values.map(|v| v * inv));
    GroupStats {
        mu,
        rstd: T::one() / (var + eps * inv * inv).sqrt(),
        s: inv,
    }
}

pub(super) fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>]) -> Array<T> {
    if matches!(op, Op::BatchNorm { .. }) {
        forward_groups(op, xs)
    } else {
        forward_rows(op, xs)
    }
}

/// `layer_norm`/`rms_norm` over the rows of the last axis: the arithmetic of
/// [`forward_groups`] in the same order (each row is a group, its parameters indexed by the
/// column), read from row slices instead of index lists (`rows_equal_groups` below).
fn forward_rows<T: Scalar>(op: &Op, xs: &[&Array<T>]) -> Array<T> {
    let x = xs[0];
    let d = x.shape.last().copied().unwrap_or(1);
    let mut y = Array::zeros(&x.shape);
    if d == 0 {
        return y;
    }
    for (row, out) in x.data.chunks(d).zip(y.data.chunks_mut(d)) {
        let st = row_stats(op, row);
        for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
            let xhat = st.xhat(v);
            // no shift adds nothing (PyTorch's rms_norm: −0 stays −0; adding +0 made it +0)
            let scaled = xhat * xs[1].data[j];
            *o = xs.get(2).map_or(scaled, |b| scaled + b.data[j]);
        }
    }
    y
}

fn forward_groups<T: Scalar>(op: &Op, xs: &[&Array<T>]) -> Array<T> {
    let x = xs[0];
    let (gs, param) = groups(op, &x.shape);
    let mut y = Array::zeros(&x.shape);
    for g in &gs {
        let st = stats(op, &x.data, g);
        for &f in g {
            let p = param[f];
            let xhat = st.xhat(x.data[f]);
            let scaled = xhat * xs[1].data[p];
            y.data[f] = xs.get(2).map_or(scaled, |b| scaled + b.data[p]);
        }
    }
    y
}

pub(super) fn vjp<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    if matches!(op, Op::BatchNorm { .. }) {
        vjp_groups(op, xs, gy)
    } else {
        vjp_rows(op, xs, gy)
    }
}

/// The VJP of `layer_norm`/`rms_norm` over rows: [`vjp_groups`]'s arithmetic in the same
/// order, from row slices (`rows_equal_groups` below).
fn vjp_rows<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    let (x, gamma) = (xs[0], xs[1]);
    let d = x.shape.last().copied().unwrap_or(1);
    let mut gx = Array::zeros(&x.shape);
    // the affine parameters' gradients sum over every row: cascaded, a row at a time
    let mut ggamma = super::sum::RowSums::new(gamma.numel());
    let mut gbeta = super::sum::RowSums::new(gamma.numel());
    let rms = matches!(op, Op::RmsNorm { .. });
    if d > 0 {
        let n = T::c(d as f64);
        // x̂ and g·γ of the row, each computed once (the same values at every use)
        let (mut xhat, mut gxhat) = (vec![T::zero(); d], vec![T::zero(); d]);
        for ((row, g), out) in x
            .data
            .chunks(d)
            .zip(gy.data.chunks(d))
            .zip(gx.data.chunks_mut(d))
        {
            let st = row_stats(op, row);
            let rstd = st.rstd();
            for j in 0..d {
                xhat[j] = st.xhat(row[j]);
                gxhat[j] = g[j] * gamma.data[j];
            }
            let mean_g = if rms {
                T::zero()
            } else {
                super::sum::sum(gxhat.iter().copied()) / n
            };
            let mean_gx = super::sum::sum(gxhat.iter().zip(&xhat).map(|(&a, &b)| a * b)) / n;
            for j in 0..d {
                out[j] = rstd * (gxhat[j] - mean_g - xhat[j] * mean_gx);
            }
            ggamma.push_row(|j| g[j] * xhat[j]);
            gbeta.push_row(|j| g[j]);
        }
    }
    norm_grads(gx, ggamma.totals(), gbeta.totals(), xs)
}

/// The gradients of x, γ and (when the call has β) β, from the parameters' cascaded sums
/// (each shaped as γ, `xs[1]`).
fn norm_grads<T: Scalar>(
    gx: Array<T>,
    ggamma: Vec<T>,
    gbeta: Vec<T>,
    xs: &[&Array<T>],
) -> InputGrads<T> {
    let param = |data: Vec<T>| {
        Some(Array {
            shape: xs[1].shape.clone(),
            data,
        })
    };
    let mut grads = vec![Some(gx), param(ggamma)];
    if xs.len() == 3 {
        grads.push(param(gbeta));
    }
    grads
}

fn vjp_groups<T: Scalar>(op: &Op, xs: &[&Array<T>], gy: &Array<T>) -> InputGrads<T> {
    let x = xs[0];
    let gamma = xs[1];
    let (gs, param) = groups(op, &x.shape);
    let mut gx = Array::zeros(&x.shape);
    // the affine parameters' gradients sum over every row or group member: cascaded
    let mut ggamma = super::sum::Sums::new(gamma.numel());
    let mut gbeta = super::sum::Sums::new(gamma.numel());
    let rms = matches!(op, Op::RmsNorm { .. });
    for g in &gs {
        let n = T::c(g.len() as f64);
        let st = stats(op, &x.data, g);
        let rstd = st.rstd();
        let xhat = |f: usize| st.xhat(x.data[f]);
        if let (Op::BatchNorm { .. }, Some(&first)) = (op, g.first()) {
            // a channel's γ is one value: PyTorch's order, ((g − mean g − x̂·mean(g·x̂))·rstd)·γ
            // (g·γ first overflows for a large cotangent where the gradient does not)
            let w = gamma.data[param[first]];
            let mean_g = super::sum::sum(g.iter().map(|&f| gy.data[f])) / n;
            let mean_gx = super::sum::sum(g.iter().map(|&f| gy.data[f] * xhat(f))) / n;
            for &f in g {
                gx.data[f] = (gy.data[f] - mean_g - xhat(f) * mean_gx) * rstd * w;
                ggamma.add(param[f], gy.data[f] * xhat(f));
                gbeta.add(param[f], gy.data[f]);
            }
            continue;
        }
        let gxhat = |f: usize| gy.data[f] * gamma.data[param[f]];
        let mean_g = if rms {
            T::zero()
        } else {
            super::sum::sum(g.iter().map(|&f| gxhat(f))) / n
        };
        let mean_gx = super::sum::sum(g.iter().map(|&f| gxhat(f) * xhat(f))) / n;
        for &f in g {
            gx.data[f] = rstd * (gxhat(f) - mean_g - xhat(f) * mean_gx);
            ggamma.add(param[f], gy.data[f] * xhat(f));
            gbeta.add(param[f], gy.data[f]);
        }
    }
    norm_grads(gx, ggamma.totals(), gbeta.totals(), xs)
}

/// `γ_k = k·u/(1 − k·u)` at f32's unit roundoff (Higham, *Accuracy and Stability*, §3.1).
pub(crate) fn gamma32(k: usize) -> f64 {
    let ku = k as f64 / (1u64 << 24) as f64;
    ku / (1.0 - ku).max(0.5)
}

/// The error a correct f32 kernel may add, beyond a tolerance relative to the result, when a
/// group's mean is large against its spread (cancellation in `x − μ`): per compared tensor,
/// `[y]` for the forward (`gy` None) and `[gx, gγ, gβ]` for the VJP. `layer_norm` and
/// `batch_norm` only (`rms_norm` subtracts no mean: all zeros).
///
/// Argument, per group of n elements with mean μ and σ = 1/rstd: any f32 summation of the
/// mean errs by |δμ| ≤ γ_n·Σ|x|/n ≤ γ_n·(|μ| + mean|x − μ|) (Higham Thm 3.5, the division
/// included); the second part is the ordinary conditioning that the relative tolerance
/// covers, the first is the offset's, large when |μ|/σ ≫ 1 (inputs like `randn + 1e4`). Its
/// effect e = γ_{n+1}·|μ|/σ shifts every x̂ of the group by the same constant (x − μ̂ =
/// (x − μ) − δμ) and changes the variance only at second order (Σ(d − δμ)² = Σd² + n·δμ²
/// since Σd = 0): |x̂' − x̂| ≤ δ = e·(1 + e·(1 + X)), X = max|x̂| in the group. Hence
/// y = x̂·γ + β moves by δ·max|γ|; gx = rstd·(ĝ − mean ĝ − x̂·mean(ĝ·x̂)) (ĝ = gy·γ,
/// G = max|ĝ|) by at most 2·rstd·δ·G·(X + δ); gγ_p = Σ gy·x̂ by Σ δ·|gy| over the elements
/// of parameter p; gβ by 0. Zero-mean groups get no allowance.
///
/// The cotangent's own cancellation (forty-fifth session's audit: a cotangent with a large
/// common offset, `1e5 * layer_norm(x).sum()`, rejected a correct kernel): gx's means of ĝ
/// and ĝ·x̂ are sums of n terms, whose f32 evaluation errs by γ_n·mean|ĝ| and γ_n·mean|ĝ·x̂|
/// (Higham Thm 3.5), a few more roundings for x̂ itself, the differences and the product by
/// rstd; so gx may err by γ_{n+4}·rstd·(mean|ĝ| + X·mean|ĝ·x̂|) beyond the tolerance relative
/// to gx itself (doubled for the order of evaluation), `rms_norm` without the first term (it
/// subtracts no mean). gγ_p = Σ gy·x̂ and gβ_p = Σ gy over the G groups are sums of G terms:
/// γ_{G+2}·Σ|gy·x̂| and γ_G·Σ|gy|.
pub fn cancellation_allowance(op: &Op, xs: &[&Array<f64>], gy: Option<&Array<f64>>) -> Vec<f64> {
    let zeros = super::no_allowance(xs.len(), gy);
    let mut v = offset_allowance(op, xs, gy).unwrap_or_else(|| zeros.clone());
    if let Some(gy) = gy {
        for (a, c) in v.iter_mut().zip(cotangent_allowance(op, xs, gy)) {
            *a += c;
        }
    }
    v
}

/// The cotangent's cancellation part of [`cancellation_allowance`]: `[gx, gγ, gβ]` (as many
/// as the inputs).
fn cotangent_allowance(op: &Op, xs: &[&Array<f64>], gy: &Array<f64>) -> Vec<f64> {
    let mut out = vec![0.0; xs.len()];
    let x = xs[0];
    if gy.data.len() != x.data.len() {
        return out;
    }
    let (gs, param) = groups(op, &x.shape);
    let gamma = xs.get(1).filter(|g| !g.data.is_empty());
    let centred = !matches!(op, Op::RmsNorm { .. });
    let (mut a_gg, mut a_gb) = (
        vec![0.0f64; gamma.map_or(0, |g| g.data.len())],
        vec![0.0f64; gamma.map_or(0, |g| g.data.len())],
    );
    for g in &gs {
        let st = stats(op, &x.data, g);
        let rstd = st.rstd();
        let finite = g
            .iter()
            .all(|&f| gy.data[f].is_finite() && x.data[f].is_finite());
        if !finite || !rstd.is_finite() || g.is_empty() {
            continue;
        }
        let n = g.len() as f64;
        let (mut sg, mut sgx, mut big_x) = (0.0f64, 0.0f64, 0.0f64);
        for &f in g {
            let xh = st.xhat(x.data[f]);
            let gh = gy.data[f] * gamma.map_or(1.0, |gm| gm.data[param[f]]);
            sg += gh.abs();
            sgx += (gh * xh).abs();
            big_x = big_x.max(xh.abs());
            if let Some(p) = a_gg.get_mut(param[f]) {
                *p += (gy.data[f] * xh).abs();
            }
            if let Some(p) = a_gb.get_mut(param[f]) {
                *p += gy.data[f].abs();
            }
        }
        let means = if centred { sg / n } else { 0.0 } + big_x * sgx / n;
        out[0] = f64::max(out[0], 2.0 * gamma32(g.len() + 4) * rstd * means);
    }
    let groups = gs.len();
    if let Some(o) = out.get_mut(1) {
        *o = gamma32(groups + 2) * a_gg.iter().fold(0.0f64, |m, &v| m.max(v));
    }
    if let Some(o) = out.get_mut(2) {
        *o = gamma32(groups + 1) * a_gb.iter().fold(0.0f64, |m, &v| m.max(v));
    }
    out
}

/// The mean offset's part of [`cancellation_allowance`] (`layer_norm`, `batch_norm` with
/// γ); `None` where it is zero.
fn offset_allowance(op: &Op, xs: &[&Array<f64>], gy: Option<&Array<f64>>) -> Option<Vec<f64>> {
    if matches!(op, Op::RmsNorm { .. }) || xs.len() < 2 {
        return None;
    }
    let (x, gamma) = (xs[0], xs[1]);
    let (gs, param) = groups(op, &x.shape);
    let max_gamma = gamma.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut a_y, mut a_gx) = (0.0f64, 0.0f64);
    let mut a_gg = vec![0.0f64; gamma.data.len()];
    for g in &gs {
        let st = stats(op, &x.data, g);
        let (mu, rstd) = (st.mean(), st.rstd());
        let big_x = g
            .iter()
            .fold(0.0f64, |m, &f| m.max(st.xhat(x.data[f]).abs()));
        let e = gamma32(g.len() + 1) * mu.abs() * rstd;
        let delta = e * (1.0 + e * (1.0 + big_x));
        // a group with a non-finite value has non-finite outputs and gradients (compared
        // by class): it takes no allowance and leaves the other groups theirs
        if !delta.is_finite() {
            continue;
        }
        a_y = a_y.max(delta * max_gamma);
        if let Some(gy) = gy {
            // a non-finite cotangent makes the group's input gradient and its terms'
            // parameter gradients non-finite (compared by class): they take no allowance,
            // which would be infinite and accept any finite value elsewhere
            let finite = |f: usize| gy.data[f].is_finite();
            if g.iter().all(|&f| finite(f)) {
                let big_g = g.iter().fold(0.0f64, |m, &f| {
                    m.max((gy.data[f] * gamma.data[param[f]]).abs())
                });
                a_gx = a_gx.max(2.0 * rstd * delta * big_g * (big_x + delta));
            }
            for &f in g.iter().filter(|&&f| finite(f)) {
                a_gg[param[f]] += delta * gy.data[f].abs();
            }
        }
    }
    Some(match gy {
        None => vec![a_y],
        Some(_) => {
            let mut v = vec![a_gx, a_gg.iter().fold(0.0f64, |m, &v| m.max(v))];
            v.resize(xs.len(), 0.0);
            v
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row loops compute exactly what the group loops do (the same operations in the same
    /// order), at f64 and f32, forward and VJP, with and without β, NaN and ±inf included:
    /// the same bits, except that a NaN equals any NaN (which NaN an operation on two NaN
    /// operands returns depends on their order, which the compiler may swap in a commutative
    /// product; the spec's classes — NaN, ±inf, finite values — do not).
    #[test]
    fn rows_equal_groups() {
        let mut k = 0u64;
        let mut next = || {
            k += 1;
            let z = crate::spec::splitmix64(k);
            match z % 29 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                _ => (z >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 3.0,
            }
        };
        for (rows, d) in [(1usize, 1usize), (3, 7), (5, 32), (2, 0)] {
            for op in [Op::LayerNorm { eps: 1e-5 }, Op::RmsNorm { eps: 1e-3 }] {
                let arr = |shape: &[usize], next: &mut dyn FnMut() -> f64| Array::<f64> {
                    shape: shape.to_vec(),
                    data: (0..shape.iter().product()).map(|_| next()).collect(),
                };
                let x = arr(&[rows, d], &mut next);
                let (g, b) = (arr(&[d], &mut next), arr(&[d], &mut next));
                let gy = arr(&[rows, d], &mut next);
                let same = |a: &Array<f64>, b: &Array<f64>| {
                    a.shape == b.shape
                        && a.data
                            .iter()
                            .zip(&b.data)
                            .all(|(u, v)| u.to_bits() == v.to_bits() || u.is_nan() && v.is_nan())
                };
                let n_in = if matches!(op, Op::RmsNorm { .. }) {
                    2
                } else {
                    3
                };
                let xs: Vec<&Array<f64>> = [&x, &g, &b][..n_in].to_vec();
                assert!(same(&forward_rows(&op, &xs), &forward_groups(&op, &xs)));
                let (r, w) = (vjp_rows(&op, &xs, &gy), vjp_groups(&op, &xs, &gy));
                assert_eq!(r.len(), w.len());
                for (a, b) in r.iter().zip(&w) {
                    assert!(
                        same(a.as_ref().unwrap(), b.as_ref().unwrap()),
                        "{op:?} {rows}x{d}"
                    );
                }
                // and at f32
                let narrow = |a: &Array<f64>| Array::<f32> {
                    shape: a.shape.clone(),
                    data: a.data.iter().map(|&v| v as f32).collect(),
                };
                let (x32, g32, b32, gy32) = (narrow(&x), narrow(&g), narrow(&b), narrow(&gy));
                let xs32: Vec<&Array<f32>> = [&x32, &g32, &b32][..n_in].to_vec();
                // a NaN as one canonical pattern (see above)
                let bits = |a: &Array<f32>| {
                    a.data
                        .iter()
                        .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    bits(&forward_rows(&op, &xs32)),
                    bits(&forward_groups(&op, &xs32))
                );
                let (r, w) = (vjp_rows(&op, &xs32, &gy32), vjp_groups(&op, &xs32, &gy32));
                for (a, b) in r.iter().zip(&w) {
                    assert_eq!(bits(a.as_ref().unwrap()), bits(b.as_ref().unwrap()));
                }
            }
        }
    }
}
