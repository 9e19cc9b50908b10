//! Adagrad as `torch.optim.Adagrad`:
//! g = ∇ + wd·w; s += g²; w -= lr / (1 + (t-1)·lr_decay) · g / (sqrt(s) + ε).

use super::module::Module;
use super::optim::{
    check_lr, check_range, for_each_param, grad_of, update_elementwise, Optimizer, OptimizerState,
    ParamNames, SlotStore,
};
use crate::error::Result;
use crate::runtime::Gradients;

/// Adagrad; slot `sum` (starting at `initial_accumulator_value`).
pub struct Adagrad {
    pub lr: f32,
    pub lr_decay: f32,
    pub weight_decay: f32,
    pub eps: f32,
    initial_accumulator_value: f32,
    steps: u64,
    store: SlotStore,
    names: ParamNames,
}

impl Adagrad {
    /// PyTorch's defaults: no lr decay, no weight decay, accumulator 0, eps 1e-10.
    pub fn new(lr: f32) -> Result<Adagrad> {
        Adagrad::with_initial_accumulator(lr, 0.0)
    }

    pub fn with_initial_accumulator(lr: f32, initial: f32) -> Result<Adagrad> {
        check_lr(lr)?;
        check_range(
            "Adagrad initial accumulator",
            initial,
            0.0,
            f32::INFINITY,
            false,
        )?;
        Ok(Adagrad {
            lr,
            lr_decay: 0.0,
            weight_decay: 0.0,
            eps: 1e-10,
            initial_accumulator_value: initial,
            steps: 0,
            store: SlotStore::new("adagrad", vec![("sum", initial)]),
            names: ParamNames::default(),
        })
    }
}

impl Optimizer for Adagrad {
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        check_range("Adagrad lr decay", self.lr_decay, 0.0, f32::INFINITY, false)?;
        self.store
            .set_slots(vec![("sum", self.initial_accumulator_value)]);
        self.steps += 1;
        let clr = self.lr / (1.0 + (self.steps - 1) as f32 * self.lr_decay);
        let (wd, eps) = (self.weight_decay, self.eps);
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let g = g.data();
            let shape = p.shape().to_vec();
            if let [s] = store.buffers(name, &shape)? {
                p.update_data(|w| {
                    update_elementwise(w, &g, [s.as_mut_slice()], |w, g, [s]| {
                        let g = g + wd * *w;
                        *s += g * g;
                        *w -= clr * g / (s.sqrt() + eps);
                    })
                });
            }
            Ok(())
        })?;
        Ok(())
    }
    fn learning_rate(&self) -> f32 {
        self.lr
    }
    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn kind(&self) -> &'static str {
        "adagrad"
    }
    fn export_state(&self) -> OptimizerState {
        self.store.export(self.steps)
    }
    fn import_state(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<()> {
        self.steps = self.store.import(model, state)?;
        Ok(())
    }
}
