//! Gradient clipping by global norm (`torch.nn.utils.clip_grad_norm_`).

use super::module::Module;
use crate::error::{Error, Result};
use crate::runtime::Gradients;

/// The L2 norm of the gradients of all of `model`'s parameters together. A tensor listed
/// under several names (tied weights) counts once, as in PyTorch, whose `model.parameters()`
/// lists each tensor once.
///
/// Computed by ops of the session (each gradient's `mul` by itself and `sum_all`, the sums
/// added: planned, gated, checked where the profile says so, and reported), in f32 as
/// PyTorch; one value is read to the host, whatever the device. When the sum of squares
/// overflows f32 (finite gradients above about 1.8e19), it is recomputed on the gradients
/// scaled by 2^-100 (exact), and the norm scaled back on the host.
pub fn global_grad_norm(model: &dyn Module, grads: &Gradients) -> Result<f32> {
    let sq = sum_of_squares(model, grads, 1.0)?;
    if sq.is_finite() || sq.is_nan() {
        return Ok(sq.sqrt() as f32);
    }
    const DOWN: f32 = 1.0 / (1u128 << 100) as f32; // 2^-100, exact in f32
    let scaled = sum_of_squares(model, grads, DOWN)?;
    Ok((scaled.sqrt() / DOWN as f64) as f32)
}

/// Σ over the model's distinct parameters of Σ (factor·g)², by ops of the session, read as
/// one value (0 when no parameter has a gradient).
fn sum_of_squares(model: &dyn Module, grads: &Gradients, factor: f32) -> Result<f64> {
    let mut seen = std::collections::HashSet::new();
    let mut total: Option<crate::Tensor> = None;
    crate::runtime::no_grad(|| -> Result<()> {
        for (_, p) in model.parameters() {
            if !seen.insert(p.id()) {
                continue;
            }
            let Some(g) = grads.get(p) else { continue };
            let g = if factor == 1.0 {
                g.clone()
            } else {
                g.scale(factor)?
            };
            let sq = g.mul(&g)?.sum_all()?;
            total = Some(match total.take() {
                None => sq,
                Some(t) => t.add(&sq)?,
            });
        }
        Ok(())
    })?;
    Ok(match total {
        None => 0.0,
        Some(t) => t.try_to_vec()?.first().copied().unwrap_or(0.0) as f64,
    })
}

/// Scales the gradients so that their global norm is at most `max_norm`: by
/// `max_norm / (norm + 1e-6)` (in f32) whenever that coefficient is below 1, as PyTorch's
/// `clamp(max_norm / (norm + 1e-6), max=1)` — so a norm within 1e-6 below `max_norm` is
/// scaled a little too, and a tiny `max_norm` scales gradients whose norm equals it. Returns
/// the norm before clipping. A non-finite norm leaves the gradients unchanged (the caller
/// decides; PyTorch would make them NaN or zero).
pub fn clip_grad_norm(model: &dyn Module, grads: &mut Gradients, max_norm: f32) -> Result<f32> {
    // +inf clips nothing (as PyTorch's); 0 or a negative bound, which PyTorch takes (zeroing
    // or reversing every gradient), is refused as a mistake
    if max_norm.is_nan() || max_norm <= 0.0 {
        return Err(Error::Other(format!(
            "clip_grad_norm: max_norm must be > 0 (+inf clips nothing), got {max_norm}"
        )));
    }
    let norm = global_grad_norm(model, grads)?;
    let coefficient = max_norm / (norm + 1e-6);
    if norm.is_finite() && coefficient < 1.0 {
        grads.scale(coefficient)?;
    }
    Ok(norm)
}
