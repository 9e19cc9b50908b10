//! Optimizers. Updates are plain f32 arithmetic on parameter storage (in place when the
//! parameter is not shared), outside the op graph — like PyTorch's fused optimizer loops.

use super::module::Module;
use crate::error::{Error, Result};
use crate::runtime::Gradients;
use rayon::prelude::*;

/// Elements per parallel task of an update (fixed, so results do not depend on threads).
const CHUNK: usize = 1 << 14;

/// Applies `f(w, g, a, b)` chunk by chunk over a parameter, its gradient and two state
/// buffers of the same length, in parallel for large parameters.
fn update_chunks(
    w: &mut [f32],
    g: &[f32],
    a: &mut [f32],
    b: &mut [f32],
    f: impl Fn(&mut [f32], &[f32], &mut [f32], &mut [f32]) + Sync + Send,
) {
    if w.len() < 2 * CHUNK {
        f(w, g, a, b);
    } else {
        w.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(a.par_chunks_mut(CHUNK))
            .zip(b.par_chunks_mut(CHUNK))
            .for_each(|(((w, g), a), b)| f(w, g, a, b));
    }
}

/// Updates a module's parameters from their gradients.
pub trait Optimizer {
    /// One update step. Parameters without a gradient are left unchanged.
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()>;
    /// The current learning rate.
    fn learning_rate(&self) -> f32;
    fn set_learning_rate(&mut self, lr: f32);
}

fn check_lr(lr: f32) -> Result<()> {
    if lr.is_finite() && lr > 0.0 {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "learning rate must be finite and > 0, got {lr}"
        )))
    }
}

/// Stochastic gradient descent with optional momentum and weight decay.
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    velocity: Vec<Vec<f32>>,
}

impl Sgd {
    pub fn new(lr: f32, momentum: f32, weight_decay: f32) -> Result<Sgd> {
        check_lr(lr)?;
        Ok(Sgd {
            lr,
            momentum,
            weight_decay,
            velocity: vec![],
        })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        let params = model.parameters_mut();
        if self.velocity.len() != params.len() {
            self.velocity = params.iter().map(|(_, p)| vec![0.0; p.numel()]).collect();
        }
        let (lr, mom, wd) = (self.lr, self.momentum, self.weight_decay);
        for ((_, p), vel) in params.into_iter().zip(&mut self.velocity) {
            let Some(g) = grads.get(p) else { continue };
            let g = g.data();
            let sgd = |w: &mut [f32], g: &[f32], vel: &mut [f32]| {
                for ((w, &g), v) in w.iter_mut().zip(g).zip(vel.iter_mut()) {
                    let gi = g + wd * *w;
                    *v = mom * *v + gi;
                    *w -= lr * if mom != 0.0 { *v } else { gi };
                }
            };
            p.update_data(|w| {
                if w.len() < 2 * CHUNK {
                    sgd(w, &g, vel);
                } else {
                    w.par_chunks_mut(CHUNK)
                        .zip(g.par_chunks(CHUNK))
                        .zip(vel.par_chunks_mut(CHUNK))
                        .for_each(|((w, g), v)| sgd(w, g, v));
                }
            });
        }
        Ok(())
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
}

/// Adam (Kingma & Ba), with bias correction, as in `torch.optim.Adam`.
pub struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    step: u32,
    moments: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Adam {
    pub fn new(lr: f32) -> Result<Adam> {
        check_lr(lr)?;
        Ok(Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 0,
            moments: vec![],
        })
    }
}

impl Optimizer for Adam {
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        let params = model.parameters_mut();
        if self.moments.len() != params.len() {
            self.moments = params
                .iter()
                .map(|(_, p)| (vec![0.0; p.numel()], vec![0.0; p.numel()]))
                .collect();
        }
        self.step += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.step as i32);
        let c2 = 1.0 - b2.powi(self.step as i32);
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        for ((_, p), (m, v)) in params.into_iter().zip(&mut self.moments) {
            let Some(g) = grads.get(p) else { continue };
            let g = g.data();
            let (step, inv_c2) = (lr / c1, 1.0 / c2);
            p.update_data(|w| {
                update_chunks(w, &g, m, v, |w, g, m, v| {
                    for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut())
                    {
                        let gi = g + wd * *w;
                        *m = b1 * *m + (1.0 - b1) * gi;
                        *v = b2 * *v + (1.0 - b2) * gi * gi;
                        *w -= step * *m / ((*v * inv_c2).sqrt() + eps);
                    }
                })
            });
        }
        Ok(())
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
}
