//! Adagrad as `torch.optim.Adagrad`:
//! g = ∇ + wd·w; s += g²; w -= lr / (1 + (t-1)·lr_decay) · g / (sqrt(s) + ε), t the
//! parameter's own step count (the steps in which it had a gradient), as PyTorch.

use super::module::Module;
use super::optim::{
    check_finite_lr, check_lr, check_range, for_each_param, grad_of, readable_number,
    update_by_ops, Optimizer, OptimizerState, ParamNames, SlotStore,
};
use crate::error::Result;
use crate::runtime::Gradients;
use crate::tensor::Tensor;

/// One Adagrad update of `w` by `g` with accumulator `s` as ops of the session: the module
/// doc's formula, term by term, with `(clr, wd, eps)` the step's decayed learning
/// rate, weight decay and epsilon. Returns the new weight and the new accumulator.
fn update_with_ops(
    w: &Tensor,
    g: &Tensor,
    s: &Tensor,
    (clr, wd, eps): (f32, f32, f32),
) -> Result<(Tensor, Tensor)> {
    let gi = if wd != 0.0 {
        g.add(&w.scale(wd)?)?
    } else {
        g.clone()
    };
    let s1 = s.add(&gi.mul(&gi)?)?;
    let w1 = w.sub(&gi.scale(clr)?.div(&s1.sqrt()?.add_scalar(eps)?)?)?;
    Ok((w1, s1))
}

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
            store: SlotStore::counting("adagrad", vec![("sum", initial)]),
            names: ParamNames::default(),
        })
    }
}

impl Optimizer for Adagrad {
    fn update_ops(&self, _device: crate::backend::Device) -> Vec<crate::graph::OpKind> {
        use crate::graph::OpKind as K;
        // `update_with_ops`, term by term
        vec![
            K::Add,
            K::Scale,
            K::Mul,
            K::Sqrt,
            K::AddScalar,
            K::Div,
            K::Sub,
        ]
    }
    fn validate(&self) -> Result<()> {
        check_finite_lr(self.lr)?;
        // the public fields are checked where they are used, as torch.optim's constructor
        // checks its arguments (a negative eps or weight decay moved parameters uphill)
        check_range("Adagrad lr decay", self.lr_decay, 0.0, f32::INFINITY, false)?;
        check_range("Adagrad eps", self.eps, 0.0, f32::INFINITY, false)?;
        check_range(
            "Adagrad weight decay",
            self.weight_decay,
            0.0,
            f32::INFINITY,
            false,
        )?;
        check_range(
            "Adagrad initial accumulator",
            self.initial_accumulator_value,
            0.0,
            f32::INFINITY,
            false,
        )
    }
    fn describe(&self) -> String {
        format!(
            "adagrad: lr {}, lr decay {}, eps {:e}, weight decay {}, initial accumulator {}",
            readable_number(self.lr),
            readable_number(self.lr_decay),
            self.eps,
            readable_number(self.weight_decay),
            readable_number(self.initial_accumulator_value)
        )
    }
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        self.validate()?;
        self.store
            .set_slots(vec![("sum", self.initial_accumulator_value)]);
        // saturating: a count loaded at u64::MAX stays there (every formula that reads it
        // is at its limit long before), never wraps to 0
        self.steps = self.steps.saturating_add(1);
        // the decayed rate of a parameter's own step count (`SlotStore::advance`)
        let (lr, lr_decay) = (self.lr, self.lr_decay);
        // in f64 and rounded once, as torch.optim computes `lr / (1 + (step - 1) * lr_decay)`
        // in Python's floats (in f32 the rate was off by an ulp at some steps)
        let rate =
            |t: u64| (lr as f64 / (1.0 + t.saturating_sub(1) as f64 * lr_decay as f64)) as f32;
        let (wd, eps) = (self.weight_decay, self.eps);
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let t = store.next_step(name);
            let clr = rate(t);
            // as ops of the session on every device (planned, gated, checked where the
            // profile says so, and reported): see `update_with_ops`
            let bufs = store.slots(name, p)?;
            let mut new = None;
            update_by_ops(p, |w| {
                let (w1, s1) = update_with_ops(w, g, &bufs[0], (clr, wd, eps))?;
                new = Some(s1);
                Ok(w1)
            })?;
            if let (Some(b), Some(s1)) = (bufs.first_mut(), new) {
                *b = s1;
            }
            store.commit_step(name, t);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendProfile;
    use crate::runtime::{install, Session};

    /// The ops form of the update (what a device runs) against an f64 evaluation of the
    /// documented formula, three steps with a decaying learning rate and weight decay.
    #[test]
    fn the_ops_update_matches_the_formula() {
        // a session for this thread's ops; the previous one (none) is dropped
        let _ = install(Session::new(BackendProfile::default_cpu()));
        let n = 6;
        let w0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.53).cos()).collect();
        let mut w = Tensor::from_vec(w0.clone(), &[n]).unwrap();
        let mut s = Tensor::full(&[n], 0.1).unwrap();
        let mut rw: Vec<f64> = w0.iter().map(|&x| x as f64).collect();
        let mut rs = vec![0.1f32 as f64; n];
        for t in 0..3 {
            let g: Vec<f32> = (0..n).map(|i| ((i + 2 * t) as f32 * 0.9).sin()).collect();
            let clr = 0.1 / (1.0 + t as f32 * 0.5);
            let gt = Tensor::from_vec(g.clone(), &[n]).unwrap();
            let (w1, s1) = update_with_ops(&w, &gt, &s, (clr, 0.05, 1e-10)).unwrap();
            (w, s) = (w1, s1);
            for i in 0..n {
                let gi = g[i] as f64 + 0.05f32 as f64 * rw[i];
                rs[i] += gi * gi;
                rw[i] -= clr as f64 * gi / (rs[i].sqrt() + 1e-10);
            }
            for (i, (&a, &b)) in w.to_vec().iter().zip(&rw).enumerate() {
                assert!(
                    (a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "step {t} element {i}: {a} vs {b}"
                );
            }
        }
    }
}
