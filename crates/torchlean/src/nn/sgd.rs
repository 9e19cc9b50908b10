//! Stochastic gradient descent with momentum, Nesterov momentum and (L2) weight decay, as
//! `torch.optim.SGD` with dampening 0:
//! g = ∇ + wd·w; b = μ·b + g (b starts at 0, so b₁ = g); d = g + μ·b (Nesterov) or b (μ > 0)
//! or g (μ = 0); w -= lr·d.

use super::module::Module;
use super::optim::{
    check_finite_lr, check_lr, check_range, for_each_param, grad_of, readable_number, Optimizer,
    OptimizerState, ParamNames, SlotStore,
};
use crate::error::{Error, Result};
use crate::graph::Op;
use crate::runtime::{apply_update, Gradients};

/// SGD; the momentum buffer slot is `momentum_buffer` (present when momentum > 0).
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    steps: u64,
    store: SlotStore,
    names: ParamNames,
}

impl Sgd {
    pub fn new(lr: f32, momentum: f32, weight_decay: f32) -> Result<Sgd> {
        check_lr(lr)?;
        check_range("SGD momentum", momentum, 0.0, 1.0, true)?;
        check_range("SGD weight decay", weight_decay, 0.0, f32::INFINITY, false)?;
        Ok(Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov: false,
            steps: 0,
            store: SlotStore::new("sgd", vec![]),
            names: ParamNames::default(),
        })
    }

    /// Turns Nesterov momentum on or off (needs momentum > 0).
    pub fn with_nesterov(mut self, on: bool) -> Result<Sgd> {
        if on && self.momentum <= 0.0 {
            return Err(Error::Other(
                "SGD: Nesterov momentum requires momentum > 0".into(),
            ));
        }
        self.nesterov = on;
        Ok(self)
    }

    fn slots(&self) -> Vec<(&'static str, f32)> {
        if self.momentum != 0.0 {
            vec![("momentum_buffer", 0.0)]
        } else {
            vec![]
        }
    }
}

impl Optimizer for Sgd {
    fn update_ops(&self, _device: crate::backend::Device) -> Vec<crate::graph::OpKind> {
        use crate::graph::OpKind as K;
        // weight decay and momentum: `add` and `scale`; the step: `scale` and `sub`
        vec![K::Add, K::Scale, K::Sub]
    }
    fn validate(&self) -> Result<()> {
        check_finite_lr(self.lr)?;
        // the public fields are checked where they are used (`new` checked its arguments)
        check_range("SGD momentum", self.momentum, 0.0, 1.0, true)?;
        check_range(
            "SGD weight decay",
            self.weight_decay,
            0.0,
            f32::INFINITY,
            false,
        )?;
        if self.nesterov && self.momentum == 0.0 {
            return Err(Error::Other(
                "SGD: Nesterov momentum requires momentum > 0".into(),
            ));
        }
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "sgd: lr {}, momentum {}, weight decay {}{}",
            readable_number(self.lr),
            self.momentum,
            readable_number(self.weight_decay),
            if self.nesterov { ", nesterov" } else { "" }
        )
    }
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        self.validate()?;
        self.store.set_slots(self.slots());
        let (lr, mom, wd, nesterov) = (self.lr, self.momentum, self.weight_decay, self.nesterov);
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            // as ops of the session (planned, gated, checked where the profile says so, and
            // reported), on every device; the momentum buffer and the weight are written over
            // their buffers when the kernels can (`apply_update`)
            let bufs = store.slots(name, p)?;
            crate::runtime::no_grad(|| -> Result<()> {
                let gi = if wd != 0.0 {
                    g.add(&p.detach().scale(wd)?)?
                } else {
                    g.clone()
                };
                let d = match bufs.first_mut() {
                    Some(b) => {
                        // b = momentum·b + g
                        apply_update(Op::Scale { factor: mom }, b, &[])?;
                        apply_update(Op::Add, b, &[&gi])?;
                        if nesterov {
                            gi.add(&b.scale(mom)?)?
                        } else {
                            b.clone()
                        }
                    }
                    None => gi,
                };
                let step = d.scale(lr)?;
                drop(d);
                apply_update(Op::Sub, p, &[&step])
            })?;
            Ok(())
        })?;
        // saturating: a count loaded at u64::MAX stays there (every formula that reads it
        // is at its limit long before), never wraps to 0
        self.steps = self.steps.saturating_add(1);
        Ok(())
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn kind(&self) -> &'static str {
        "sgd"
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
