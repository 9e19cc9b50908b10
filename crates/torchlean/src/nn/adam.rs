//! Adam (Kingma & Ba) with L2 weight decay, as `torch.optim.Adam`, and AdamW (decoupled
//! weight decay, Loshchilov & Hutter), as `torch.optim.AdamW`:
//! AdamW first shrinks w by (1 - lr·wd); Adam adds wd·w to the gradient. Then
//! m = β₁m + (1-β₁)g, v = β₂v + (1-β₂)g², w -= (lr / (1-β₁ᵗ)) · m / (sqrt(v) / sqrt(1-β₂ᵗ) + ε),
//! t the parameter's own step count (the steps in which it had a gradient), as PyTorch.

use super::module::Module;
use super::optim::{
    check_lr, check_range, for_each_param, grad_of, Optimizer, OptimizerState, ParamNames,
    SlotStore,
};
use crate::error::Result;
use crate::graph::Op;
use crate::runtime::{apply_update, Gradients};

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
            // as ops of the session (planned, gated, checked where the profile says so, and
            // reported), on every device: the moments (`ema_update`), then the step
            // (`adam_update`), one pass each, each written over its state's buffer when the
            // kernel can (`apply_update`)
            let [m, v] = store.slots(name, p)? else {
                return Ok(()); // invariant: Adam has two slots
            };
            crate::runtime::no_grad(|| -> Result<()> {
                // L2 decay (Adam) reads the weight before the step; AdamW's shrink is applied
                // by the step (one of the two is neutral)
                let gi = if l2 != 0.0 {
                    g.add(&p.detach().scale(l2)?)?
                } else {
                    g.clone()
                };
                let ema = |decay, square| Op::EmaUpdate { decay, square };
                apply_update(ema(b1, false), m, &[&gi])?;
                apply_update(ema(b2, true), v, &[&gi])?;
                let step = Op::AdamUpdate {
                    step_size,
                    c2_sqrt,
                    eps,
                    shrink,
                };
                apply_update(step, p, &[m, v])
            })?;
            store.commit_step(name, t);
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
