//! Optimizers. Updates are plain f32 arithmetic on parameter storage (in place when the
//! parameter is not shared), outside the op graph — like PyTorch's fused optimizer loops.

use super::module::Module;
use crate::error::{Error, Result};
use crate::runtime::Gradients;

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
        for ((_, p), vel) in params.into_iter().zip(&mut self.velocity) {
            let Some(g) = grads.get(p) else { continue };
            let g = g.to_vec();
            let (lr, mom, wd) = (self.lr, self.momentum, self.weight_decay);
            p.update_data(|w| {
                for i in 0..w.len() {
                    let gi = g[i] + wd * w[i];
                    vel[i] = mom * vel[i] + gi;
                    w[i] -= lr * if mom != 0.0 { vel[i] } else { gi };
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
            p.update_data(|w| {
                for i in 0..w.len() {
                    let gi = g[i] + wd * w[i];
                    m[i] = b1 * m[i] + (1.0 - b1) * gi;
                    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                    let mhat = m[i] / c1;
                    let vhat = v[i] / c2;
                    w[i] -= lr * mhat / (vhat.sqrt() + eps);
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
