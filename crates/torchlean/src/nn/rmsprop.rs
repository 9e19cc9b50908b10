//! RMSprop as `torch.optim.RMSprop`:
//! g = ∇ + wd·w; s = α·s + (1-α)·g²; centered: a = α·a + (1-α)·g, d = sqrt(s - a²) + ε,
//! else d = sqrt(s) + ε; with momentum μ > 0: b = μ·b + g/d, w -= lr·b; else w -= lr·g/d.

use super::module::Module;
use super::optim::{
    check_finite_lr, check_lr, check_range, for_each_param, grad_of, readable_number,
    update_by_ops, Optimizer, OptimizerState, ParamNames, SlotStore,
};
use crate::error::Result;
use crate::graph::Op;
use crate::runtime::{apply, Gradients};
use crate::tensor::Tensor;

/// The hyperparameters of one step.
#[derive(Debug, Clone, Copy)]
struct Hyper {
    lr: f32,
    alpha: f64,
    eps: f32,
    wd: f32,
    momentum: f32,
}

/// One RMSprop update of `w` by `g` as ops of the session: the module doc's formula, term by
/// term, left to right. `bufs` are the slots in `RmsProp::slots` order (square_avg, then
/// momentum_buffer when momentum > 0, then grad_avg when centered). Returns the new weight
/// and the new slots, in the same order.
fn update_with_ops(
    w: &Tensor,
    g: &Tensor,
    bufs: &[Tensor],
    h: Hyper,
) -> Result<(Tensor, Vec<Tensor>)> {
    let gi = if h.wd != 0.0 {
        g.add(&w.scale(h.wd)?)?
    } else {
        g.clone()
    };
    let ema = |b: &Tensor, square: bool| apply(Op::ema_update(h.alpha, square), &[b, &gi]);
    let (momentum, centered) = match bufs.len() {
        1 => (false, false),
        2 => (h.momentum > 0.0, h.momentum <= 0.0),
        _ => (true, true),
    };
    let s1 = ema(&bufs[0], true)?;
    let a1 = if centered {
        Some(ema(&bufs[bufs.len() - 1], false)?)
    } else {
        None
    };
    let spread = match &a1 {
        Some(a) => s1.sub(&a.mul(a)?)?,
        None => s1.clone(),
    };
    let denom = spread.sqrt()?.add_scalar(h.eps)?;
    let mut slots = vec![s1];
    let w1 = if momentum {
        let b1 = bufs[1].scale(h.momentum)?.add(&gi.div(&denom)?)?;
        let w1 = w.sub(&b1.scale(h.lr)?)?;
        slots.push(b1);
        w1
    } else {
        // (lr·g) / d, as `torch.optim.RMSprop` orders it
        w.sub(&gi.scale(h.lr)?.div(&denom)?)?
    };
    slots.extend(a1);
    Ok((w1, slots))
}

/// RMSprop; slots `square_avg`, plus `momentum_buffer` (momentum > 0) and `grad_avg`
/// (centered).
pub struct RmsProp {
    pub lr: f32,
    /// The smoothing constant α, in f64 as Python's floats: 1 − α is computed in f64 and
    /// rounded once, as `torch.optim.RMSprop` computes it.
    pub alpha: f64,
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
    fn update_ops(&self, _device: crate::backend::Device) -> Vec<crate::graph::OpKind> {
        use crate::graph::OpKind as K;
        // `update_with_ops`, term by term
        let mut ops = vec![
            K::Add,
            K::Scale,
            K::EmaUpdate,
            K::Sqrt,
            K::AddScalar,
            K::Div,
            K::Sub,
        ];
        if self.centered {
            ops.push(K::Mul);
        }
        ops
    }
    fn validate(&self) -> Result<()> {
        check_finite_lr(self.lr)?;
        // the public fields are checked where they are used, as torch.optim's constructor
        // checks its arguments (a negative eps or weight decay moved parameters uphill)
        check_range("RMSprop alpha", self.alpha, 0.0, 1.0, true)?;
        check_range("RMSprop momentum", self.momentum, 0.0, 1.0, true)?;
        check_range("RMSprop eps", self.eps, 0.0, f32::INFINITY, false)?;
        check_range(
            "RMSprop weight decay",
            self.weight_decay,
            0.0,
            f32::INFINITY,
            false,
        )
    }
    fn describe(&self) -> String {
        format!(
            "rmsprop: lr {}, alpha {}, eps {:e}, weight decay {}, momentum {}{}",
            readable_number(self.lr),
            self.alpha,
            self.eps,
            readable_number(self.weight_decay),
            self.momentum,
            if self.centered { ", centered" } else { "" }
        )
    }
    fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
        self.validate()?;
        self.store.set_slots(self.slots());
        let (lr, al, eps, wd, mom) = (
            self.lr,
            self.alpha,
            self.eps,
            self.weight_decay,
            self.momentum,
        );
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        let hyper = Hyper {
            lr,
            alpha: al,
            eps,
            wd,
            momentum: mom,
        };
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            // as ops of the session on every device (planned, gated, checked where the
            // profile says so, and reported): see `update_with_ops`
            let bufs = store.slots(name, p)?;
            let mut new = vec![];
            update_by_ops(p, |w| {
                let (w1, slots) = update_with_ops(w, g, bufs, hyper)?;
                new = slots;
                Ok(w1)
            })?;
            for (b, n) in bufs.iter_mut().zip(new) {
                *b = n;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendProfile;
    use crate::runtime::{install, Session};

    /// The ops form of the update (what a device runs) against an f64 evaluation of the
    /// documented formula, three steps, every slot layout, with and without weight decay.
    #[test]
    fn the_ops_update_matches_the_formula() {
        // a session for this thread's ops; the previous one (none) is dropped
        let _ = install(Session::new(BackendProfile::default_cpu()));
        let n = 7;
        let w0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let grad = |t: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 3 + t) as f32 * 0.71).cos() * 0.5)
                .collect()
        };
        for (momentum, centered, wd) in [
            (0.0, false, 0.0),
            (0.9, false, 0.1),
            (0.0, true, 0.0),
            (0.9, true, 0.1),
        ] {
            let h = Hyper {
                lr: 0.01,
                alpha: 0.99,
                eps: 1e-8,
                wd,
                momentum,
            };
            let slots = 1 + (momentum > 0.0) as usize + centered as usize;
            let mut w = Tensor::from_vec(w0.clone(), &[n]).unwrap();
            let mut bufs = vec![Tensor::zeros(&[n]).unwrap(); slots];
            let (mut rw, mut rs, mut rb, mut ra) = (
                w0.iter().map(|&x| x as f64).collect::<Vec<f64>>(),
                vec![0.0f64; n],
                vec![0.0f64; n],
                vec![0.0f64; n],
            );
            for t in 0..3 {
                let g = grad(t);
                let gt = Tensor::from_vec(g.clone(), &[n]).unwrap();
                let (w1, b1) = update_with_ops(&w, &gt, &bufs, h).unwrap();
                w = w1;
                bufs = b1;
                let (lr, al, eps, wd, mom) =
                    (0.01f64, 0.99f64, 1e-8f64, wd as f64, momentum as f64);
                for i in 0..n {
                    let gi = g[i] as f64 + wd * rw[i];
                    rs[i] = al * rs[i] + (1.0 - al) * gi * gi;
                    if centered {
                        ra[i] = al * ra[i] + (1.0 - al) * gi;
                    }
                    let d = (rs[i] - ra[i] * ra[i]).sqrt() + eps;
                    if mom > 0.0 {
                        rb[i] = mom * rb[i] + gi / d;
                        rw[i] -= lr * rb[i];
                    } else {
                        rw[i] -= lr * gi / d;
                    }
                }
                for (i, (&a, &b)) in w.to_vec().iter().zip(&rw).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs()),
                        "momentum {momentum} centered {centered} wd {wd} step {t} element {i}: {a} vs {b}"
                    );
                }
            }
            assert_eq!(bufs.len(), slots);
        }
    }
}
