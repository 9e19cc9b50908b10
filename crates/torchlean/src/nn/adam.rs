//! Adam (Kingma & Ba) with L2 weight decay, as `torch.optim.Adam`, and AdamW (decoupled
//! weight decay, Loshchilov & Hutter), as `torch.optim.AdamW`:
//! AdamW first shrinks w by (1 - lr·wd); Adam adds wd·w to the gradient. Then
//! m = β₁m + (1-β₁)g, v = β₂v + (1-β₂)g², w -= (lr / (1-β₁ᵗ)) · m / (sqrt(v) / sqrt(1-β₂ᵗ) + ε),
//! t the parameter's own step count (the steps in which it had a gradient), as PyTorch.
//! With `amsgrad` (as `torch.optim`'s), the step divides by the running maximum of v
//! (`max_exp_avg_sq = maximum(max_exp_avg_sq, v)`) instead of v.
//!
//! The constants are computed as `torch.optim` computes them, in f64 (Python's floats) and
//! rounded once to f32: the betas are f64, and so are 1 − β, the bias corrections, the step
//! size and AdamW's 1 − lr·wd. In f32 arithmetic 1 − 0.999 is 1.3·10⁻⁵ off PyTorch's weight,
//! and Adam's normalized steps amplified that into a 2·10⁻³ relative loss difference after
//! 100 steps of a GRU (docs/numerics.md).

use super::module::Module;
use super::optim::{
    check_lr, check_range, for_each_param, grad_of, Optimizer, OptimizerState, ParamNames,
    SlotStore,
};
use crate::backend::Device;
use crate::error::Result;
use crate::graph::Op;
use crate::runtime::{apply_update, apply_update_many, Gradients};
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
            store: SlotStore::counting(kind, slots(false)),
            names: ParamNames::default(),
        }
    }

    fn step(
        &mut self,
        model: &mut dyn Module,
        grads: &Gradients,
        settings: Settings,
    ) -> Result<()> {
        let hyper = settings.checked()?;
        let (foreach, amsgrad) = (settings.foreach, settings.amsgrad);
        // counted once nothing refuses the step; saturating: a count loaded at u64::MAX
        // stays there (every formula that reads it is at its limit long before), never
        // wraps to 0
        self.steps = self.steps.saturating_add(1);
        // the state of the step (its slots change with amsgrad: a change clears the state,
        // as for RMSprop's momentum)
        self.store.set_slots(slots(amsgrad));
        // as `torch.optim.Adam`'s `foreach` (see `fused`)
        if !amsgrad && fused(foreach, model.device()) {
            self.step_fused(model, grads, hyper)
        } else {
            self.step_per_parameter(model, grads, hyper)
        }
    }

    /// On the CPU: per parameter, the moments (`ema_update`), then the step (`adam_update`),
    /// one pass each, each written over its state's buffer when the kernel can
    /// (`apply_update`), and checked tile by tile while in cache under a checking profile
    /// (runtime/tiled.rs).
    fn step_per_parameter(
        &mut self,
        model: &mut dyn Module,
        grads: &Gradients,
        h: Hyper,
    ) -> Result<()> {
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        for_each_param(names, model, |name, p| {
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let t = store.next_step(name);
            let (step_size, c2_sqrt) = h.corrections(t);
            let (m, v, max_v) = match store.slots(name, p)? {
                [m, v] => (m, v, None),
                [m, v, max_v] => (m, v, Some(max_v)),
                _ => return Ok(()), // invariant: Adam has two slots, three with amsgrad
            };
            crate::runtime::no_grad(|| -> Result<()> {
                // L2 decay (Adam) reads the weight before the step; AdamW's shrink is applied
                // by the step (one of the two is neutral)
                let gi = if h.l2 != 0.0 {
                    g.add(&p.detach().scale(h.l2)?)?
                } else {
                    g.clone()
                };
                apply_update(Op::ema_update(h.b1, false), m, &[&gi])?;
                apply_update(Op::ema_update(h.b2, true), v, &[&gi])?;
                let step = Op::AdamUpdate {
                    step_size,
                    c2_sqrt,
                    eps: h.eps,
                    shrink: h.shrink,
                };
                match max_v {
                    // amsgrad: the step divides by the running maximum of v
                    Some(max_v) => {
                        apply_update(Op::Maximum, max_v, &[v])?;
                        apply_update(step, p, &[m, max_v])
                    }
                    None => apply_update(step, p, &[m, v]),
                }
            })?;
            store.commit_step(name, t);
            Ok(())
        })
    }

    /// On a device: every parameter with a gradient in one `adam_step` call per step count
    /// (one call in a step where all were updated together): one kernel launch updates every
    /// `(w, m, v)` in place, where three launches per parameter would each cost a launch's
    /// latency (216 for the 6-layer transformer). The same values as the per-parameter ops
    /// (the op is their fusion, spec/optim.rs). The parameters and their moments leave the
    /// model and the store for the call, so that each handle owns its buffer alone and the
    /// kernel may write it in place, and go back whatever the outcome.
    fn step_fused(&mut self, model: &mut dyn Module, grads: &Gradients, h: Hyper) -> Result<()> {
        struct Taken<'g> {
            index: usize,
            t: u64,
            w: Tensor,
            m: Tensor,
            v: Tensor,
            g: &'g Tensor,
        }
        let names = self.names.resolve(&*model);
        let store = &mut self.store;
        let mut taken: Vec<Taken> = Vec::new();
        let mut index = 0;
        let took = for_each_param(names, model, |name, p| {
            let at = index;
            index += 1;
            let Some(g) = grad_of(name, p, grads)? else {
                return Ok(());
            };
            let t = store.next_step(name);
            let [m, v] = store.slots(name, p)? else {
                return Ok(()); // invariant: Adam has two slots
            };
            let (m, v) = (hand_over(m), hand_over(v));
            taken.push(Taken {
                index: at,
                t,
                w: hand_over(p),
                m,
                v,
                g,
            });
            Ok(())
        });
        // the step counts whose call ran, and the first failure (later counts are not run)
        let (mut updated, mut failed) = (Vec::new(), None);
        if took.is_ok() {
            let mut counts: Vec<u64> = taken.iter().map(|x| x.t).collect();
            counts.sort_unstable();
            counts.dedup();
            for t in counts {
                let (step_size, c2_sqrt) = h.corrections(t);
                let op = Op::AdamStep {
                    beta1: h.b1 as f32,
                    weight1: (1.0 - h.b1) as f32,
                    beta2: h.b2 as f32,
                    weight2: (1.0 - h.b2) as f32,
                    step_size,
                    c2_sqrt,
                    eps: h.eps,
                    shrink: h.shrink,
                    l2: h.l2,
                };
                let mut targets: Vec<&mut Tensor> = Vec::new();
                let mut rest: Vec<&Tensor> = Vec::new();
                for x in taken.iter_mut().filter(|x| x.t == t) {
                    targets.extend([&mut x.w, &mut x.m, &mut x.v]);
                    rest.push(x.g);
                }
                match crate::runtime::no_grad(|| apply_update_many(op, &mut targets, &rest)) {
                    Ok(()) => updated.push(t),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        // every taken tensor goes back, whether or not its update ran
        let mut back = taken.into_iter().peekable();
        let mut index = 0;
        let mut returned: Vec<(String, u64, Tensor, Tensor)> = Vec::new();
        let put = for_each_param(names, model, |name, p| {
            if back.peek().is_some_and(|x| x.index == index) {
                if let Some(x) = back.next() {
                    *p = x.w;
                    returned.push((name.to_string(), x.t, x.m, x.v));
                }
            }
            index += 1;
            Ok(())
        });
        for (name, t, m, v) in returned {
            if let Some([ms, vs]) = store.slots_of(&name) {
                *ms = m;
                *vs = v;
            }
            if updated.contains(&t) {
                store.commit_step(&name, t);
            }
        }
        took?;
        put?;
        failed.map_or(Ok(()), Err)
    }
}

/// What a step is asked to do: the optimizer's public fields at that step.
#[derive(Debug, Clone, Copy)]
struct Settings {
    lr: f32,
    betas: (f64, f64),
    eps: f32,
    weight_decay: f32,
    /// AdamW's decay (decoupled) or Adam's (L2, added to the gradient).
    decoupled: bool,
    foreach: Option<bool>,
    amsgrad: bool,
}

impl Settings {
    /// The step's constants, or the reason the settings cannot be honoured (checked at every
    /// step, the fields being public, and by `Optimizer::validate` before a run's first
    /// kernel).
    fn checked(self) -> Result<Hyper> {
        let Settings {
            lr,
            betas: (b1, b2),
            eps,
            weight_decay: wd,
            decoupled,
            foreach,
            amsgrad,
        } = self;
        check_range("Adam beta1", b1, 0.0, 1.0, false)?;
        check_range("Adam beta2", b2, 0.0, 1.0, false)?;
        // as torch.optim: a negative eps or weight decay is refused (the fields are public,
        // so they are checked where they are used)
        check_range("Adam eps", eps, 0.0, f32::INFINITY, false)?;
        check_range("Adam weight decay", wd, 0.0, f32::INFINITY, false)?;
        let (l2, shrink) = if decoupled {
            (0.0, (1.0 - lr as f64 * wd as f64) as f32)
        } else {
            (wd, 1.0)
        };
        let hyper = Hyper {
            lr,
            b1,
            b2,
            eps,
            l2,
            shrink,
        };
        // the step size lr / (1 − β₁ᵗ) is largest at t = 1: finite there, finite for every
        // step (an overflow was reported as an invalid payload of op `adam_step`)
        let (first, _) = hyper.corrections(1);
        if !first.is_finite() {
            return Err(crate::error::Error::Other(format!(
                "Adam: learning rate {lr} divided by the bias correction 1 − β₁ = {} gives the step size {first}, which is not finite; use a smaller learning rate",
                (1.0 - b1) as f32
            )));
        }
        if !shrink.is_finite() {
            return Err(crate::error::Error::Other(format!(
                "AdamW: the decoupled decay factor 1 − lr·weight_decay = 1 − {lr}·{wd} is not finite in f32; use a smaller learning rate or weight decay"
            )));
        }
        if amsgrad && foreach == Some(true) {
            return Err(crate::error::Error::Other(
                "Adam: amsgrad runs per parameter (ema_update, maximum, adam_update); the fused adam_step has no amsgrad form, so foreach = Some(true) cannot be honoured: use None or Some(false)".into(),
            ));
        }
        Ok(hyper)
    }
}

/// The hyperparameters of one Adam step.
#[derive(Clone, Copy)]
struct Hyper {
    lr: f32,
    b1: f64,
    b2: f64,
    eps: f32,
    /// Adam's L2 decay, added to the gradient (0 for AdamW).
    l2: f32,
    /// AdamW's decoupled decay factor 1 − lr·wd (1 for Adam).
    shrink: f32,
}

impl Hyper {
    /// The bias corrections of a parameter's own step count `t` (`SlotStore::next_step`):
    /// the step size lr / (1 − β₁ᵗ) and √(1 − β₂ᵗ), computed in f64 and rounded once, as
    /// `torch.optim` computes them from Python's floats.
    fn corrections(&self, t: u64) -> (f32, f32) {
        let t = t.min(i32::MAX as u64) as i32;
        let c1 = 1.0 - self.b1.powi(t);
        let step_size = self.lr as f64 / c1;
        (step_size as f32, (1.0 - self.b2.powi(t)).sqrt() as f32)
    }
}

/// Adam's state slots: the moments, and with `amsgrad` the running maximum of the second
/// (PyTorch's state names).
fn slots(amsgrad: bool) -> Vec<(&'static str, f32)> {
    let mut s = vec![("exp_avg", 0.0), ("exp_avg_sq", 0.0)];
    if amsgrad {
        s.push(("max_exp_avg_sq", 0.0));
    }
    s
}

/// `t`'s handle, leaving an empty placeholder in its place: the caller then holds the only
/// handle the owner had (an in-place kernel may write its buffer) and puts it back.
fn hand_over(t: &mut Tensor) -> Tensor {
    std::mem::replace(t, Tensor::placeholder())
}

/// Adam with optional L2 weight decay (added to the gradient).
pub struct Adam {
    pub lr: f32,
    /// β₁, in f64 as Python's floats: the optimizer computes 1 − β₁ and 1 − β₁ᵗ from it in
    /// f64 and rounds them once (module doc).
    pub beta1: f64,
    /// β₂, in f64 (as `beta1`).
    pub beta2: f64,
    pub eps: f32,
    pub weight_decay: f32,
    /// As `torch.optim`'s `foreach`: `Some(true)` updates every parameter of a step in one
    /// `adam_step` op (one kernel launch), `Some(false)` runs three ops per parameter
    /// (`ema_update` twice, `adam_update`); `None` (the default) picks the first on a device,
    /// and on the CPU when the session runs `adam_step` in place (no checker replays it:
    /// `runtime::updates_in_place`), else the second. Both give the same bits (spec/optim.rs).
    pub foreach: Option<bool>,
    /// As `torch.optim`'s `amsgrad`: divide by the running maximum of the second moment
    /// (state slot `max_exp_avg_sq`). Runs per parameter (`ema_update`, `maximum`,
    /// `adam_update`): `foreach = Some(true)` is refused with it. Default false.
    pub amsgrad: bool,
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
            foreach: None,
            amsgrad: false,
            core: AdamCore::new("adam"),
        })
    }
}

/// Whether a step runs `adam_step` over every parameter at once (else `ema_update` and
/// `adam_update` per parameter): `foreach` when set; by default on a device (where each launch
/// costs latency) and on the CPU when that op runs in place under the thread's session (one
/// pass over each parameter's w, m, v and g instead of three: mlp-step 3.35 → 3.03 ms); per
/// parameter on the CPU under a profile whose checkers replay the update, where the
/// per-parameter maps' checks run tile by tile in cache (runtime/tiled.rs) and the fused op
/// would be computed and checked out of place.
fn fused(foreach: Option<bool>, device: Device) -> bool {
    foreach.unwrap_or_else(|| {
        device != Device::Cpu || crate::runtime::updates_in_place(crate::graph::OpKind::AdamStep)
    })
}

/// The ops a step runs on `device` (see [`Optimizer::update_ops`]): `adam_step` (with the
/// `slice`s and `reshape`s that hand each parameter its part when the op is not written in
/// place), or `ema_update` and `adam_update`.
fn adam_ops(foreach: Option<bool>, amsgrad: bool, device: Device) -> Vec<crate::graph::OpKind> {
    use crate::graph::OpKind as K;
    if amsgrad {
        vec![K::EmaUpdate, K::Maximum, K::AdamUpdate]
    } else if !fused(foreach, device) {
        vec![K::EmaUpdate, K::AdamUpdate]
    } else if crate::runtime::updates_in_place(K::AdamStep) {
        vec![K::AdamStep]
    } else {
        vec![K::AdamStep, K::Slice, K::Reshape]
    }
}

/// The `Optimizer` implementation of Adam and AdamW, which differ only in how weight decay
/// is applied (`decoupled`) and in their kind label.
macro_rules! adam_optimizer {
    ($ty:ident, $kind:literal, $decoupled:literal) => {
        impl $ty {
            /// What a step is asked to do, from the public fields.
            fn settings(&self) -> Settings {
                Settings {
                    lr: self.lr,
                    betas: (self.beta1, self.beta2),
                    eps: self.eps,
                    weight_decay: self.weight_decay,
                    decoupled: $decoupled,
                    foreach: self.foreach,
                    amsgrad: self.amsgrad,
                }
            }
        }

        impl Optimizer for $ty {
            fn step(&mut self, model: &mut dyn Module, grads: &Gradients) -> Result<()> {
                self.core.step(model, grads, self.settings())
            }
            fn validate(&self) -> Result<()> {
                self.settings().checked().map(|_| ())
            }
            fn describe(&self) -> String {
                format!(
                    "{}: lr {}, betas ({}, {}), eps {:e}, weight decay {}{}",
                    $kind,
                    super::optim::readable_number(self.lr),
                    self.beta1,
                    self.beta2,
                    self.eps,
                    super::optim::readable_number(self.weight_decay),
                    if self.amsgrad { ", amsgrad" } else { "" }
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
            fn update_ops(&self, device: Device) -> Vec<crate::graph::OpKind> {
                adam_ops(self.foreach, self.amsgrad, device)
            }
            fn export_state(&self) -> OptimizerState {
                self.core.store.export(self.core.steps)
            }
            fn import_state(&mut self, model: &dyn Module, state: &OptimizerState) -> Result<()> {
                self.core.store.set_slots(slots(self.amsgrad));
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
    /// β₁, in f64 as Python's floats: the optimizer computes 1 − β₁ and 1 − β₁ᵗ from it in
    /// f64 and rounds them once (module doc).
    pub beta1: f64,
    /// β₂, in f64 (as `beta1`).
    pub beta2: f64,
    pub eps: f32,
    pub weight_decay: f32,
    /// As `torch.optim`'s `foreach`: `Some(true)` updates every parameter of a step in one
    /// `adam_step` op (one kernel launch), `Some(false)` runs three ops per parameter
    /// (`ema_update` twice, `adam_update`); `None` (the default) picks the first on a device,
    /// and on the CPU when the session runs `adam_step` in place (no checker replays it:
    /// `runtime::updates_in_place`), else the second. Both give the same bits (spec/optim.rs).
    pub foreach: Option<bool>,
    /// As `torch.optim`'s `amsgrad`: divide by the running maximum of the second moment
    /// (state slot `max_exp_avg_sq`). Runs per parameter (`ema_update`, `maximum`,
    /// `adam_update`): `foreach = Some(true)` is refused with it. Default false.
    pub amsgrad: bool,
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
            foreach: None,
            amsgrad: false,
            core: AdamCore::new("adamw"),
        })
    }
}

adam_optimizer!(AdamW, "adamw", true);
