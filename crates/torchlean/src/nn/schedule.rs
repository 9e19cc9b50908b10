//! Learning-rate schedules as pure functions of the (0-based) step: constant, step decay,
//! cosine annealing, and linear warmup composed with any base schedule.

use crate::error::{Error, Result};

/// A learning-rate schedule; [`LrSchedule::lr_at`] gives the rate of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum LrSchedule {
    /// `lr` at every step.
    Constant { lr: f32 },
    /// `base · gamma^floor(step / step_size)` (`torch.optim.lr_scheduler.StepLR`), in f64
    /// as Python's floats: a gamma held in f32 (0.9 as 0.899999976) drifted from PyTorch's
    /// rate by 2.6e-8 per decay, past 1e-5 relative after about 400 decays.
    Step {
        base: f32,
        step_size: usize,
        gamma: f64,
    },
    /// `min + (base - min) · (1 + cos(π · step / total)) / 2` for step < total, then `min`
    /// held. Equal to `torch.optim.lr_scheduler.CosineAnnealingLR(T_max=total, eta_min=min)`
    /// up to step `total`; after it PyTorch's keeps following the cosine (the rate rises back
    /// towards `base` over the next `total` steps), this one stays at `min`.
    Cosine {
        base: f32,
        min_lr: f32,
        total_steps: usize,
    },
    /// Linear warmup over `steps` steps: `then(0) · (step + 1) / steps` for step < steps,
    /// then `then(step - steps)` (the base schedule starts after the warmup).
    Warmup { steps: usize, then: Box<LrSchedule> },
}

impl LrSchedule {
    pub fn constant(lr: f32) -> LrSchedule {
        LrSchedule::Constant { lr }
    }

    pub fn step(base: f32, step_size: usize, gamma: f64) -> LrSchedule {
        LrSchedule::Step {
            base,
            step_size,
            gamma,
        }
    }

    pub fn cosine(base: f32, min_lr: f32, total_steps: usize) -> LrSchedule {
        LrSchedule::Cosine {
            base,
            min_lr,
            total_steps,
        }
    }

    /// This schedule preceded by a linear warmup of `steps` steps.
    pub fn with_warmup(self, steps: usize) -> LrSchedule {
        LrSchedule::Warmup {
            steps,
            then: Box::new(self),
        }
    }

    /// The learning rate at `step` (0-based).
    pub fn lr_at(&self, step: usize) -> f32 {
        match self {
            LrSchedule::Constant { lr } => *lr,
            LrSchedule::Step {
                base,
                step_size,
                gamma,
            } => {
                let k = step / (*step_size).max(1);
                (*base as f64 * gamma.powf(k as f64)) as f32
            }
            LrSchedule::Cosine {
                base,
                min_lr,
                total_steps,
            } => {
                if step >= *total_steps {
                    return *min_lr;
                }
                let c = (std::f64::consts::PI * step as f64 / *total_steps as f64).cos();
                (*min_lr as f64 + (*base as f64 - *min_lr as f64) * (1.0 + c) / 2.0) as f32
            }
            LrSchedule::Warmup { steps, then } => {
                if step < *steps {
                    (then.lr_at(0) as f64 * (step + 1) as f64 / *steps as f64) as f32
                } else {
                    then.lr_at(step - steps)
                }
            }
        }
    }

    /// Checks the parameters: rates finite and >= 0 (a rate of 0 trains nothing, as
    /// PyTorch's), positive step sizes and totals, gamma finite and >= 0 (above 1 the rate
    /// grows, as StepLR's may), warmup >= 1 step. As PyTorch's schedulers, a cosine's
    /// `min_lr` may exceed its base (the rate then rises).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Other(format!("learning-rate schedule: {what}")));
        let rate = |v: f32| v.is_finite() && v >= 0.0;
        match self {
            LrSchedule::Constant { lr } if !rate(*lr) => {
                bad(format!("lr must be finite and >= 0, got {lr}"))
            }
            LrSchedule::Step {
                base,
                step_size,
                gamma,
            } if !rate(*base) || *step_size == 0 || !(gamma.is_finite() && *gamma >= 0.0) => bad(format!(
                "step schedule needs base >= 0, step_size >= 1, gamma finite and >= 0, got {base}, {step_size}, {gamma}"
            )),
            LrSchedule::Cosine {
                base,
                min_lr,
                total_steps,
            } if !(rate(*base) && rate(*min_lr)) || *total_steps == 0 => bad(format!(
                "cosine schedule needs base >= 0, min_lr >= 0, total_steps >= 1, got {base}, {min_lr}, {total_steps}"
            )),
            LrSchedule::Warmup { steps: 0, .. } => bad("warmup needs at least one step".into()),
            LrSchedule::Warmup { then, .. } => then.validate(),
            _ => Ok(()),
        }
    }
}
