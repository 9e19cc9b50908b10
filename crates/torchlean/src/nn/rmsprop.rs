//! RMSprop as `torch.optim.RMSprop`:
//! g = ∇ + wd·w; s = α·s + (1-α)·g²; centered: a = α·a + (1-α)·g, d = sqrt(s - a²) + ε,
//! else d = sqrt(s) + ε; with momentum μ > 0: b = μ·b + g/d, w -= lr·b; else w -= lr·g/d.

use super::module::Module;
use super::optim::{
    check_lr, check_range, for_each_param, grad_of, update_elementwise, Optimizer, OptimizerState,
    ParamNames, SlotStore,
};
use crate::error::Result;
use crate::runtime::Gradients;

/// RMSprop; slots `square_avg`, plus `momentum_buffer` (momentum > 0) and `grad_avg`
/// (centered).
pub struct RmsProp {
    pub lr: f32,
    pub alpha: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub momentum: f32,
    pub centered: bool,
    steps: u64,
    store: SlotStore,
    names: ParamNames,
}

impl RmsProp {
    /// PyTorch's defaults: alpha 0.99, eps 1e-8, no weight decay, no momentum, not centered.
    pub fn new(lr: f32) -> Result<RmsProp> {
        check_lr(lr)?;
        Ok(RmsProp {
            lr,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            steps: 0,
            store: SlotStore::new("rmsprop", vec![("square_avg", 0.0)]),
            names: ParamNames::default(),
        })
    }

    fn slots(&self) -> Vec<(&'static str, f32)> {
        let mut s = vec![("square_avg", 0.0)];
        if self.momentum > 0.0 {
            s.push(("momentum_buffer", 0.0));
        }
        if self.centered {
            s.push(("grad_avg", 0.0));
        }
        s
    }
}

impl Optimizer for RmsProp {
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        check_range("RMSprop alpha", self.alpha, 0.0, 1.0, true)?;
        check_range("RMSprop momentum", self.momentum, 0.0, 1.0, true)?;
        self.store.set_slots(self.slots());
        let (lr, al, eps, wd, mom) = (
            self.lr,
            self.alpha,
            self.eps,
            self.weight_decay,
            self.momentum,
        );
        let denom = |s: f32, a: f32| (s - a * a).sqrt() + eps;
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let g = g.data();
            let shape = p.shape().to_vec();
            match store.buffers(name, &shape)? {
                [s] => p.update_data(|w| {
                    update_elementwise(w, &g, [s.as_mut_slice()], |w, g, [s]| {
                        let g = g + wd * *w;
                        *s = al * *s + (1.0 - al) * g * g;
                        *w -= lr * g / denom(*s, 0.0);
                    })
                }),
                [s, x] if mom > 0.0 => p.update_data(|w| {
                    update_elementwise(
                        w,
                        &g,
                        [s.as_mut_slice(), x.as_mut_slice()],
                        |w, g, [s, b]| {
                            let g = g + wd * *w;
                            *s = al * *s + (1.0 - al) * g * g;
                            *b = mom * *b + g / denom(*s, 0.0);
                            *w -= lr * *b;
                        },
                    )
                }),
                [s, a] => p.update_data(|w| {
                    update_elementwise(
                        w,
                        &g,
                        [s.as_mut_slice(), a.as_mut_slice()],
                        |w, g, [s, a]| {
                            let g = g + wd * *w;
                            *s = al * *s + (1.0 - al) * g * g;
                            *a = al * *a + (1.0 - al) * g;
                            *w -= lr * g / denom(*s, *a);
                        },
                    )
                }),
                [s, b, a] => p.update_data(|w| {
                    update_elementwise(
                        w,
                        &g,
                        [s.as_mut_slice(), b.as_mut_slice(), a.as_mut_slice()],
                        |w, g, [s, b, a]| {
                            let g = g + wd * *w;
                            *s = al * *s + (1.0 - al) * g * g;
                            *a = al * *a + (1.0 - al) * g;
                            *b = mom * *b + g / denom(*s, *a);
                            *w -= lr * *b;
                        },
                    )
                }),
                // the slot list built by `slots()` has one to three entries
                _ => {}
            }
            Ok(())
        })?;
        self.steps += 1;
        Ok(())
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn kind(&self) -> &'static str {
        "rmsprop"
    }
    fn export_state(&self) -> OptimizerState {
        self.store.export(self.steps)
    }
    fn import_state(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<()> {
        self.store.set_slots(self.slots());
        self.steps = self.store.import(model, state)?;
        Ok(())
    }
}
