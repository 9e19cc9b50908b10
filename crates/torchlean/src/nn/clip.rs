//! Gradient clipping by global norm (`torch.nn.utils.clip_grad_norm_`).

use super::module::Module;
use crate::error::{Error, Result};
use crate::runtime::Gradients;

/// The L2 norm of the gradients of all of `model`'s parameters together (in f64). A tensor
/// listed under several names (tied weights) counts once, as in PyTorch, whose
/// `model.parameters()` lists each tensor once.
pub fn global_grad_norm(model: &dyn Module, grads: &Gradients) -> f32 {
    let mut sq = 0f64;
    let mut seen = std::collections::HashSet::new();
    for (_, p) in model.parameters() {
        if !seen.insert(p.id()) {
            continue;
        }
        if let Some(g) = grads.get(p) {
            sq += g
                .data()
                .iter()
                .map(|&v| (v as f64) * (v as f64))
                .sum::<f64>();
        }
    }
    sq.sqrt() as f32
}

/// Scales the gradients so that their global norm is at most `max_norm`: by
/// `max_norm / (norm + 1e-6)` when the norm exceeds `max_norm`, as PyTorch. Returns the norm
/// before clipping. A non-finite norm leaves the gradients unchanged (the caller decides).
pub fn clip_grad_norm(model: &dyn Module, grads: &mut Gradients, max_norm: f32) -> Result<f32> {
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::Other(format!(
            "clip_grad_norm: max_norm must be finite and > 0, got {max_norm}"
        )));
    }
    let norm = global_grad_norm(model, grads);
    if norm.is_finite() && norm > max_norm {
        grads.scale(max_norm / (norm + 1e-6))?;
    }
    Ok(norm)
}
