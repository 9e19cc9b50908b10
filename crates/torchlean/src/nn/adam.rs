//! Adam (Kingma & Ba) with L2 weight decay, as `torch.optim.Adam`, and AdamW (decoupled
//! weight decay, Loshchilov & Hutter), as `torch.optim.AdamW`:
//! AdamW first shrinks w by (1 - lr·wd); Adam adds wd·w to the gradient. Then
//! m = β₁m + (1-β₁)g, v = β₂v + (1-β₂)g², w -= (lr / (1-β₁ᵗ)) · m / (sqrt(v) / sqrt(1-β₂ᵗ) + ε),
//! t the parameter's own step count (the steps in which it had a gradient), as PyTorch.

use super::module::Module;
use super::optim::{
    check_lr, check_range, for_each_param, grad_of, update_by_ops, update_elementwise, Optimizer,
    OptimizerState, ParamNames, SlotStore,
};
use crate::error::Result;
use crate::graph::Op;
use crate::runtime::{apply, Gradients};
use crate::tensor::Tensor;

/// The update shared by Adam and AdamW.
struct AdamCore {
    steps: u64,
    store: SlotStore,
    names: ParamNames,
}

impl AdamCore {
    fn new(kind: &'static str) -> AdamCore {
        AdamCore {
            steps: 0,
            store: SlotStore::new(kind, vec![("exp_avg", 0.0), ("exp_avg_sq", 0.0)]),
            names: ParamNames::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        model: &mut dyn Module,
        grads: &Gradients,
        lr: f32,
        (b1, b2): (f32, f32),
        eps: f32,
        wd: f32,
        decoupled: bool,
    ) -> Result<()> {
        check_range("Adam beta1", b1, 0.0, 1.0, false)?;
        check_range("Adam beta2", b2, 0.0, 1.0, false)?;
        self.steps += 1;
        // the bias corrections of a parameter's own step count (`SlotStore::advance`)
        let corrections = |t: u64| {
            let t = t.min(i32::MAX as u64) as i32;
            let c1 = 1.0 - b1.powi(t);
            (lr / c1, (1.0 - b2.powi(t)).sqrt())
        };
        let (l2, shrink) = if decoupled {
            (0.0, 1.0 - lr * wd)
        } else {
            (wd, 1.0)
        };
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let t = store.next_step(name);
            let (step_size, c2_sqrt) = corrections(t);
            if p.device() != crate::backend::Device::Cpu {
                // on a device, as ops of the session (planned, gated, reported): the moments
                // (`ema_update`), then the step (`adam_update`), one pass each, the same
                // arithmetic as the loop below
                let [m, v] = store.device_buffers(name, p)? else {
                    return Ok(()); // invariant: Adam has two slots
                };
                let (m1, v1) = crate::runtime::no_grad(|| -> Result<(Tensor, Tensor)> {
                    // L2 decay (Adam) reads the weight before the step; AdamW's shrink is
                    // applied by the step (one of the two is neutral)
                    let gi = if l2 != 0.0 {
                        g.add(&p.detach().scale(l2)?)?
                    } else {
                        g.clone()
                    };
                    let m1 = apply(
                        Op::EmaUpdate {
                            decay: b1,
                            square: false,
                        },
                        &[m, &gi],
                    )?;
                    let v1 = apply(
                        Op::EmaUpdate {
                            decay: b2,
                            square: true,
                        },
                        &[v, &gi],
                    )?;
                    Ok((m1, v1))
                })?;
                let step = Op::AdamUpdate {
                    step_size,
                    c2_sqrt,
                    eps,
                    shrink,
                };
                update_by_ops(p, |w| apply(step, &[w, &m1, &v1]))?;
                *m = m1;
                *v = v1;
                store.commit_step(name, t);
                return Ok(());
            }
            let g = g.data();
            let shape = p.shape().to_vec();
            if let [m, v] = store.buffers(name, &shape)? {
                p.update_data(|w| {
                    update_elementwise(
                        w,
                        &g,
                        [m.as_mut_slice(), v.as_mut_slice()],
                        |w, g, [m, v]| {
                            *w *= shrink;
                            let gi = g + l2 * *w;
                            *m = b1 * *m + (1.0 - b1) * gi;
                            *v = b2 * *v + (1.0 - b2) * gi * gi;
                            *w -= step_size * *m / (v.sqrt() / c2_sqrt + eps);
                        },
                    )
                });
                store.commit_step(name, t);
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Adam with optional L2 weight decay (added to the gradient).
pub struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    core: AdamCore,
}

impl Adam {
    /// Adam with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    pub fn new(lr: f32) -> Result<Adam> {
        check_lr(lr)?;
        Ok(Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            core: AdamCore::new("adam"),
        })
    }
}

/// The `Optimizer` implementation of Adam and AdamW, which differ only in how weight decay
/// is applied (`decoupled`) and in their kind label.
macro_rules! adam_optimizer {
    ($ty:ident, $kind:literal, $decoupled:literal) => {
        impl Optimizer for $ty {
            fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
                let betas = (self.beta1, self.beta2);
                self.core.step(
                    model,
                    grads,
                    self.lr,
                    betas,
                    self.eps,
                    self.weight_decay,
                    $decoupled,
                )
            }
            fn learning_rate(&self) -> f32 {
                self.lr
            }
            fn set_learning_rate(&mut self, lr: f32) {
                self.lr = lr;
            }
            fn kind(&self) -> &'static str {
                $kind
            }
            fn export_state(&self) -> OptimizerState {
                self.core.store.export(self.core.steps)
            }
            fn import_state(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<()> {
                self.core.steps = self.core.store.import(model, state)?;
                Ok(())
            }
        }
    };
}

adam_optimizer!(Adam, "adam", false);

/// AdamW: Adam with decoupled weight decay.
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    core: AdamCore,
}

impl AdamW {
    /// AdamW with PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: f32) -> Result<AdamW> {
        AdamW::with_weight_decay(lr, 0.01)
    }

    pub fn with_weight_decay(lr: f32, weight_decay: f32) -> Result<AdamW> {
        check_lr(lr)?;
        check_range(
            "AdamW weight decay",
            weight_decay,
            0.0,
            f32::INFINITY,
            false,
        )?;
        Ok(AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            core: AdamCore::new("adamw"),
        })
    }
}

adam_optimizer!(AdamW, "adamw", true);
