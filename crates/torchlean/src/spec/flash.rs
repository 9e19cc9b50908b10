//! Flash attention as a specification: scaled dot-product attention computed tile by tile
//! with an online softmax (forward), and its VJP recomputed tile by tile from the rows'
//! log-sum-exp (FlashAttention-2's backward), over the same op and masks as
//! `scaled_dot_product_attention` (`spec::special`). It never forms a whole L×S matrix: per
//! query tile it walks the key tiles, keeping a running maximum, a running normalizer and a
//! running output per row.
//!
//! Mask semantics are the SDPA spec's: a blocked entry (boolean mask 0, or `causal` with key
//! after query) contributes exactly zero; an additive mask adds to the score; a row whose every
//! key is blocked gives zeros and passes no gradient. The tests
//! (`tests/flash_attention.rs`) hold this definition equal to the SDPA spec, forward and VJP,
//! over random shapes, masks (fully blocked rows and causal included) and tile sizes — the
//! counterpart of TorchLean's `flashAttention_eq_scaledDotProductAttention`, here as tested
//! evidence, not a proof.

use super::special::Scores;
use super::{infer_shape, numel, payload_err, reduce_to, Array, InputGrads};
use crate::error::OpError;
use crate::graph::{AttentionMask, Op};
use crate::scalar::Scalar;

/// Query rows and key columns per tile.
#[derive(Clone, Copy, Debug)]
pub struct Tiles {
    pub queries: usize,
    pub keys: usize,
}

/// The sizes of one call: batch (product of the leading dims), L, S, d, dv.
struct Geometry {
    batch: usize,
    l: usize,
    s: usize,
    d: usize,
    dv: usize,
}

/// The call's sizes and scores (the SDPA spec's own, `special::Scores`), after the SDPA shape
/// rule accepted its shapes (an error otherwise, or for another op).
fn geometry<'a, T: Scalar>(
    op: &Op,
    xs: &'a [&'a Array<T>],
) -> Result<(Geometry, Scores<'a, T>, AttentionMask), OpError> {
    let Op::ScaledDotProductAttention {
        scale,
        causal,
        mask,
    } = op
    else {
        return Err(payload_err(
            op,
            "flash attention computes scaled_dot_product_attention only",
        ));
    };
    let shapes: Vec<&[usize]> = xs.iter().map(|a| a.shape.as_slice()).collect();
    infer_shape(op, &shapes)?;
    if let Some(bad) = xs.iter().find(|a| a.data.len() != numel(&a.shape)) {
        return Err(payload_err(
            op,
            format!(
                "an array of shape {:?} holds {} values",
                bad.shape,
                bad.data.len()
            ),
        ));
    }
    let r = xs[0].shape.len();
    let g = Geometry {
        batch: numel(&xs[0].shape[..r - 2]),
        l: xs[0].shape[r - 2],
        s: xs[1].shape[r - 2],
        d: xs[0].shape[r - 1],
        dv: xs[2].shape[r - 1],
    };
    Ok((g, Scores::new(xs, *scale, *causal, *mask), *mask))
}

/// The output and each row's maximum score and normalizer (`None` for a fully blocked row),
/// by tiles.
pub type Forward<T> = (Array<T>, Vec<Option<(T, T)>>);

/// The output and each row's maximum score m and normalizer z = Σ exp(s − m) (`None` for a
/// fully blocked row), by tiles; an error for another op or shapes the SDPA shape rule
/// refuses. The pair, not the log-sum-exp m + ln z: where |m| dwarfs ln z (a row whose every
/// score is near f32::MIN, an additive padding mask) the sum rounds to m.
pub fn forward<T: Scalar>(op: &Op, xs: &[&Array<T>], tiles: Tiles) -> Result<Forward<T>, OpError> {
    let (g, scores, _) = geometry(op, xs)?;
    let (tq, tk) = (tiles.queries.max(1), tiles.keys.max(1));
    let mut out_shape = xs[0].shape.clone();
    let r = out_shape.len();
    out_shape[r - 1] = g.dv;
    let mut y = Array::zeros(&out_shape);
    let mut stats = vec![None; g.batch * g.l];
    for b in 0..g.batch {
        for q0 in (0..g.l).step_by(tq) {
            let rows = q0..(q0 + tq).min(g.l);
            // running state per row of the query tile: max, normalizer, unnormalized output
            let mut m = vec![T::neg_infinity(); rows.len()];
            let mut z = vec![T::zero(); rows.len()];
            let mut acc = vec![T::zero(); rows.len() * g.dv];
            for k0 in (0..g.s).step_by(tk) {
                for (ri, i) in rows.clone().enumerate() {
                    let scores: Vec<(usize, T)> = (k0..(k0 + tk).min(g.s))
                        .filter_map(|j| scores.at(b, i, j).map(|v| (j, v)))
                        .collect();
                    if scores.is_empty() {
                        continue;
                    }
                    let tile_max = scores
                        .iter()
                        .fold(T::neg_infinity(), |a, &(_, v)| crate::scalar::maximum(a, v));
                    let m_new = crate::scalar::maximum(m[ri], tile_max);
                    // rescale what was accumulated under the old maximum
                    let shrink = if m[ri] == T::neg_infinity() {
                        T::zero()
                    } else {
                        (m[ri] - m_new).exp()
                    };
                    z[ri] *= shrink;
                    let row = &mut acc[ri * g.dv..(ri + 1) * g.dv];
                    row.iter_mut().for_each(|a| *a *= shrink);
                    for (j, v) in scores {
                        let p = (v - m_new).exp();
                        z[ri] += p;
                        let vj = &xs[2].data[(b * g.s + j) * g.dv..(b * g.s + j + 1) * g.dv];
                        for (a, &x) in row.iter_mut().zip(vj) {
                            *a += p * x;
                        }
                    }
                    m[ri] = m_new;
                }
            }
            for (ri, i) in rows.enumerate() {
                if m[ri] == T::neg_infinity() {
                    continue; // every key blocked: zeros, and no gradient
                }
                let out = &mut y.data[(b * g.l + i) * g.dv..(b * g.l + i + 1) * g.dv];
                for (o, &a) in out.iter_mut().zip(&acc[ri * g.dv..(ri + 1) * g.dv]) {
                    *o = a / z[ri];
                }
                stats[b * g.l + i] = Some((m[ri], z[ri]));
            }
        }
    }
    Ok((y, stats))
}

/// The VJP, by tiles, recomputing each probability from the row's maximum and normalizer:
/// with p = exp(s − m) / z and D = dO·O per row, dV += p·dO, dS = p·(dO·v − D), dQ += scale·dS·k,
/// dK += scale·dS·q, and (additive mask) dMask = dS.
pub fn vjp<T: Scalar>(
    op: &Op,
    xs: &[&Array<T>],
    gy: &Array<T>,
    tiles: Tiles,
) -> Result<InputGrads<T>, OpError> {
    let (g, scores, mask) = geometry(op, xs)?;
    let (tq, tk) = (tiles.queries.max(1), tiles.keys.max(1));
    let (y, stats) = forward(op, xs, tiles)?;
    if gy.shape != y.shape || gy.data.len() != y.data.len() {
        return Err(payload_err(
            op,
            format!(
                "the output gradient has shape {:?}, the output {:?}",
                gy.shape, y.shape
            ),
        ));
    }
    let mut gq = Array::zeros(&xs[0].shape);
    let mut gk = Array::zeros(&xs[1].shape);
    let mut gv = Array::zeros(&xs[2].shape);
    let mut gmask = Array::zeros(&[g.batch, g.l, g.s]);
    for b in 0..g.batch {
        for k0 in (0..g.s).step_by(tk) {
            for q0 in (0..g.l).step_by(tq) {
                for i in q0..(q0 + tq).min(g.l) {
                    let Some((m_i, z_i)) = stats[b * g.l + i] else {
                        continue;
                    };
                    let row = (b * g.l + i) * g.dv..(b * g.l + i + 1) * g.dv;
                    let (go, oi) = (&gy.data[row.clone()], &y.data[row]);
                    let d_i: T = go.iter().zip(oi).map(|(&a, &c)| a * c).sum();
                    for j in k0..(k0 + tk).min(g.s) {
                        let Some(sij) = scores.at(b, i, j) else {
                            continue;
                        };
                        let p = (sij - m_i).exp() / z_i;
                        let vj = b * g.s + j;
                        let vrow = &xs[2].data[vj * g.dv..(vj + 1) * g.dv];
                        let dp: T = go.iter().zip(vrow).map(|(&a, &c)| a * c).sum();
                        for (gvc, &o) in gv.data[vj * g.dv..(vj + 1) * g.dv].iter_mut().zip(go) {
                            *gvc += p * o;
                        }
                        let ds = p * (dp - d_i);
                        gmask.data[(b * g.l + i) * g.s + j] = ds;
                        let qi = (b * g.l + i) * g.d..(b * g.l + i + 1) * g.d;
                        let kj = (b * g.s + j) * g.d..(b * g.s + j + 1) * g.d;
                        for c in 0..g.d {
                            gq.data[qi.start + c] += scores.scale() * ds * xs[1].data[kj.start + c];
                            gk.data[kj.start + c] += scores.scale() * ds * xs[0].data[qi.start + c];
                        }
                    }
                }
            }
        }
    }
    let mut grads = vec![Some(gq), Some(gk), Some(gv)];
    match mask {
        AttentionMask::None => {}
        AttentionMask::Boolean => grads.push(None),
        AttentionMask::AdditiveBias => {
            let shape = &xs[3].shape;
            grads.push(Some(if shape.len() == 2 {
                reduce_to(&gmask, &[1, g.l, g.s]).reshaped(shape)
            } else {
                gmask.reshaped(shape)
            }));
        }
    }
    Ok(grads)
}
