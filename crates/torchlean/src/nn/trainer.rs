//! The trainer: runs training steps on a dataset under its own backend session, with a
//! learning-rate schedule, gradient clipping, logging, periodic atomic checkpoints and
//! resume; plus prediction and evaluation.
//!
//! The trainer installs its [`Session`] on the calling thread for the duration of each call
//! (restoring the previous one afterwards), plans the model's and the loss's ops before the
//! first kernel runs — the ops are found by a shape-only trace of the model's forward and
//! loss on the first batch ([`trace_ops`]), so a refusal always comes before the first
//! kernel — and can return the report of what ran ([`Trainer::report`]). A batch,
//! the learning rate and every dropout mask depend only on (seed, step), so a run resumed
//! from a checkpoint continues exactly as an uninterrupted one.

use super::checkpoint::{
    apply_checkpoint, check_tag, read_checkpoint, save_checkpoint_noted, CheckpointContents,
    CheckpointInfo,
};
use super::config::{Config, DType, SaveOptions, TrainOptions};
use super::error::TrainError;
use super::error::{Error, Result};
use super::init::derive_seed;
use super::loss::Task;
use super::module::{trace_ops, Module};
use super::optim::Optimizer;
use super::schedule::LrSchedule;
use super::step::{executor_for, StepExecutor};
use crate::backend::{BackendProfile, BackendReport};
use crate::data::Dataset;
use crate::runtime::{self, Session};
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// One log entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogEntry {
    /// The step number after this step (1-based, global across resumes).
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: Option<f32>,
}

/// What a `train` call did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSummary {
    /// Global step before the first step of this call (after loading a checkpoint).
    pub start_step: u64,
    /// Global step after the last step.
    pub end_step: u64,
    /// The loss of every step of this call.
    pub losses: Vec<f32>,
    pub logs: Vec<LogEntry>,
    /// The last checkpoint written by this call.
    pub last_checkpoint: Option<PathBuf>,
}

/// Loss (and accuracy for classification) over a dataset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean loss over samples (batch losses weighted by batch size).
    pub loss: f32,
    pub accuracy: Option<f32>,
    pub samples: usize,
}

/// Runs `f` with `slot`'s session installed on this thread; puts it back (and restores the
/// previous session) afterwards, also on error or panic. Fails (running nothing) inside a
/// `runtime::with_current` closure, which holds the thread's session.
fn with_session<R>(
    slot: &mut Option<Session>,
    profile: &BackendProfile,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    struct Restore<'a> {
        slot: &'a mut Option<Session>,
        previous: Option<Session>,
    }
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            // the install below succeeded, so nothing holds the thread's session here
            *self.slot = runtime::take().ok().flatten();
            if let Some(p) = self.previous.take() {
                let _ = runtime::install(p);
            }
        }
    }
    let session = slot.take().unwrap_or_else(|| Session::new(profile.clone()));
    let previous = match runtime::install(session) {
        Ok(previous) => previous,
        Err(e) => {
            // the session went nowhere: keep it for the next call
            *slot = Some(Session::new(profile.clone()));
            return Err(e.into());
        }
    };
    let _restore = Restore { slot, previous };
    f()
}

/// Trains a model.
pub struct Trainer<M: Module> {
    model: M,
    task: Task,
    optimizer: Box<dyn Optimizer>,
    step_fn: Box<dyn StepExecutor>,
    profile: BackendProfile,
    session: Option<Session>,
    schedule: Option<LrSchedule>,
    clip: Option<f32>,
    seed: u64,
    step: u64,
    planned: [bool; 2],
    /// See `Config::checkpoint_tag`.
    checkpoint_tag: Option<String>,
    /// See `Config::checkpoint_notes`.
    checkpoint_notes: Vec<(String, String)>,
}

impl<M: Module> Trainer<M> {
    /// Checks the configuration (dtype, backend, profile, schedule, clipping) and prepares a
    /// session for the resolved profile; nothing runs yet.
    pub fn new(model: M, config: Config) -> Result<Trainer<M>> {
        if config.dtype != DType::F32 {
            return Err(TrainError::UnsupportedDtype(config.dtype.label()).into());
        }
        let profile = config.resolved_profile()?;
        let step_fn = executor_for(config.backend, &profile)?;
        if let Some(s) = &config.schedule {
            s.validate()
                .map_err(|e| TrainError::Config(e.to_string()))?;
        }
        if let Some(c) = config.clip_grad_norm {
            // as `clip_grad_norm`: +inf clips nothing
            if c.is_nan() || c <= 0.0 {
                return Err(TrainError::Config(format!(
                    "clip_grad_norm must be > 0 (+inf clips nothing), got {c}"
                ))
                .into());
            }
        }
        Ok(Trainer {
            model,
            task: config.task,
            optimizer: config.optimizer,
            step_fn,
            session: Some(Session::new(profile.clone())),
            profile,
            schedule: config.schedule,
            clip: config.clip_grad_norm,
            seed: config.seed,
            step: 0,
            planned: [false; 2],
            checkpoint_tag: config.checkpoint_tag,
            checkpoint_notes: config.checkpoint_notes,
        })
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    pub fn into_model(self) -> M {
        self.model
    }

    /// Captures the model's evaluation forward on `x` (input `x`, output `output`) for
    /// export: evaluation mode (`set_training(false)`: dropout off, batch norm on its running
    /// statistics, as [`Trainer::evaluate`]), under this trainer's session and profile on its
    /// device — the capture's kernels are admitted like the training's and listed in the
    /// trainer's report. The values come back on the host. The model stays in evaluation
    /// mode until the next training step.
    pub fn capture_forward(
        &mut self,
        x: &Tensor,
        output: &str,
    ) -> Result<crate::runtime::capture::Captured> {
        let Trainer {
            model,
            profile,
            session,
            ..
        } = self;
        let device = profile.device;
        let captured = with_session(session, profile, || {
            model.to_device(device)?;
            model.set_training(false);
            let x = x.to_device(device)?;
            let params: Vec<(String, Tensor)> = model
                .parameters()
                .into_iter()
                .map(|(n, t)| (n, t.clone()))
                .collect();
            let inputs = [("x".to_string(), x)];
            Ok(crate::runtime::capture::capture(&inputs, &params, |xs| {
                Ok(vec![(output.to_string(), model.forward(&xs[0])?)])
            })?)
        })?;
        let values = captured
            .values
            .into_iter()
            .map(|(n, t)| Ok((n, t.to_cpu()?)))
            .collect::<Result<_>>()?;
        Ok(crate::runtime::capture::Captured {
            graph: captured.graph,
            values,
        })
    }

    pub fn optimizer(&self) -> &dyn Optimizer {
        self.optimizer.as_ref()
    }

    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The resolved backend profile.
    pub fn profile(&self) -> &BackendProfile {
        &self.profile
    }

    /// Steps taken so far (restored by loading a checkpoint).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The report of every (op, capsule) that ran under this trainer's session.
    pub fn report(&self) -> Option<BackendReport> {
        self.session.as_ref().map(Session::report)
    }

    /// The report of the plan the step executor built itself — the compiled step's graph plan
    /// (after the first step) — followed by the kernels that ran eagerly in this trainer's
    /// session (the optimizer's update, clipping, evaluation), so that it covers every kernel
    /// that ran (it listed the graph plan alone, without the updates); `None` for eager
    /// training, whose kernels are all in [`Trainer::report`].
    pub fn step_report(&self) -> Option<BackendReport> {
        let mut report = self.step_fn.plan_report()?;
        if let Some(eager) = self.report() {
            report.add_eager_kernels(eager);
        }
        Some(report)
    }

    /// Plans and gates (once per mode, in the installed session) every op that the model's
    /// forward and the loss run on `inputs`/`targets`, found by a shape-only trace (no kernel
    /// runs before a refusal). Training traces with the tape on (and, for a compiled step,
    /// every differentiable op recorded, as capture records them); evaluation under
    /// `no_grad`, in evaluation mode, with the accuracy when the task has one.
    #[allow(clippy::too_many_arguments)] // the trace's inputs, and the ops planned beside it
    fn preplan(
        model: &mut M,
        task: &Task,
        planned: &mut [bool; 2],
        compiled: bool,
        training: bool,
        inputs: &Tensor,
        targets: Option<&Tensor>,
        beside: &[crate::graph::OpKind],
    ) -> Result<()> {
        if planned[training as usize] {
            return Ok(());
        }
        model.set_training(training);
        let traced = trace_ops(model, |m| {
            let _grad = runtime::NoGradGuard::set(training);
            let pred = m.forward(inputs)?;
            if let Some(y) = targets {
                task.loss(&pred, y)?;
                if !training {
                    task.accuracy(&pred, y)?;
                }
            }
            Ok(())
        });
        model.set_training(true);
        let mut uses = traced?;
        if compiled && training {
            uses = uses.all_recorded();
        }
        uses.extend(&runtime::OpUses::from_kinds(beside, false));
        runtime::with_current(|s| s.preplan(&uses))??;
        planned[training as usize] = true;
        Ok(())
    }

    /// Saves parameters, buffers, optimizer state and the step to `path` (atomically).
    pub fn save_checkpoint(&self, path: impl AsRef<Path>) -> Result<()> {
        save_checkpoint_noted(
            path,
            &self.model,
            Some(self.optimizer.as_ref()),
            self.step,
            self.checkpoint_tag.as_deref(),
            &self.checkpoint_notes,
        )
    }

    /// Restores parameters, buffers, optimizer state and the step from `path` (the file must
    /// hold state for this trainer's optimizer; for parameters only, use
    /// [`load_checkpoint`](super::load_checkpoint) on [`Trainer::model_mut`] with `None`).
    pub fn load_checkpoint(&mut self, path: impl AsRef<Path>) -> Result<CheckpointInfo> {
        let path = path.as_ref();
        let contents = read_checkpoint(path)?;
        self.load_checkpoint_contents(contents, &path.display().to_string())
    }

    /// [`Trainer::load_checkpoint`] from a checkpoint already read and verified
    /// ([`crate::nn::read_checkpoint`], [`crate::nn::checkpoint::parse_checkpoint`]), `name`
    /// naming its source in errors: for a caller that reads the file once (a pipe can be
    /// read only once) and looks at its metadata first.
    pub fn load_checkpoint_contents(
        &mut self,
        contents: CheckpointContents,
        name: &str,
    ) -> Result<CheckpointInfo> {
        let name = name.to_string();
        check_tag(&contents, &name, self.checkpoint_tag.as_deref())?;
        let info = apply_checkpoint(
            contents,
            &name,
            &mut self.model,
            Some(self.optimizer.as_mut()),
        )?;
        self.step = info.step;
        Ok(info)
    }

    /// Trains for `options.steps` steps (see [`TrainOptions`]).
    pub fn train(&mut self, data: &Dataset, options: &TrainOptions) -> Result<TrainSummary> {
        self.train_with(data, options, |_| {})
    }

    /// Like [`Trainer::train`], calling `on_log` with every log entry as it is made.
    pub fn train_with(
        &mut self,
        data: &Dataset,
        options: &TrainOptions,
        mut on_log: impl FnMut(&LogEntry),
    ) -> Result<TrainSummary> {
        if options.batch_size == 0 {
            return Err(TrainError::Config("batch_size must be positive".into()).into());
        }
        if data.is_empty() {
            return Err(TrainError::Config("the training dataset is empty".into()).into());
        }
        if options.batch_size > data.len() {
            // a batch would hold some samples twice: a different objective than the user asked
            return Err(TrainError::Config(format!(
                "batch size {} exceeds the {} training samples (a batch would repeat samples); use at most {}",
                options.batch_size,
                data.len(),
                data.len()
            ))
            .into());
        }
        if let Some(path) = &options.load {
            self.load_checkpoint(path)?;
        }
        let Trainer {
            model,
            task,
            optimizer,
            step_fn,
            profile,
            session,
            schedule,
            clip,
            seed,
            step,
            planned,
            checkpoint_tag,
            checkpoint_notes,
        } = self;
        let compiled = step_fn.name() == "compiled";
        // the step counter never wraps: a resumed run whose last step would not fit is refused
        // before anything runs (a checkpoint may record any step up to u64::MAX)
        if step.checked_add(options.steps as u64).is_none() {
            return Err(TrainError::Config(format!(
                "{} more steps after step {} exceed the step counter's range ({}): the checkpoint's step is not one a run can continue from",
                options.steps,
                *step,
                u64::MAX
            ))
            .into());
        }
        // the optimizer's settings (public fields) are refused now, not at the first update
        // after that step's forward and backward kernels
        if options.steps > 0 {
            optimizer
                .validate()
                .map_err(|e| TrainError::Config(format!("optimizer {}: {e}", optimizer.kind())))?;
        }
        // the model lives on the profile's device; batches are made on the host and moved
        let device = profile.device;
        with_session(session, profile, || {
            model.to_device(device)?;
            let mut sampler = data.sampler(
                options.batch_size,
                derive_seed(*seed, 0xDA7A),
                options.shuffle,
            )?;
            if options.steps > 0 && !planned[1] {
                let (x, y) = data.gather(&sampler.indices(*step)?)?;
                let (x, y) = (x.to_device(device)?, y.to_device(device)?);
                // the ops of a step beside the model's: the optimizer's update, the tape's
                // gradient sums, clipping's norm and scaling, and on a device the finiteness
                // probe read with the loss (`step::loss_and_finite`) — planned and gated now,
                // not when step 1 first runs them after its forward and backward kernels
                use crate::graph::OpKind as K;
                let mut beside = optimizer.update_ops(device);
                beside.push(K::Add);
                if clip.is_some() {
                    beside.extend([K::Mul, K::SumAll, K::Scale]);
                }
                if device != crate::backend::Device::Cpu {
                    beside.extend([K::Scale, K::SumAll]);
                }
                Self::preplan(model, task, planned, compiled, true, &x, Some(&y), &beside)?;
            }
            model.set_training(true);
            let mut summary = TrainSummary {
                start_step: *step,
                end_step: *step,
                losses: Vec::with_capacity(options.steps.min(1 << 16)),
                logs: Vec::new(),
                last_checkpoint: None,
            };
            let mut last_good = options.load.clone();
            let save = |path: &std::path::PathBuf,
                        model: &dyn Module,
                        optimizer: &dyn Optimizer,
                        step: u64| {
                save_checkpoint_noted(
                    path,
                    model,
                    Some(optimizer),
                    step,
                    checkpoint_tag.as_deref(),
                    checkpoint_notes,
                )
            };
            for i in 0..options.steps {
                let s = *step;
                if let Some(sch) = schedule.as_ref() {
                    // a valid schedule may still leave f32 (a step schedule growing by
                    // gamma > 1; 0 · inf): refused before the step, never applied
                    let lr = sch.lr_at(s as usize);
                    if !lr.is_finite() {
                        return Err(TrainError::Config(format!(
                            "the learning-rate schedule gives {lr} at step {s}: a rate must be finite"
                        ))
                        .into());
                    }
                    optimizer.set_learning_rate(lr);
                }
                model.reseed(derive_seed(*seed, s));
                let (x, y) = data.gather(&sampler.indices(s)?)?;
                let (x, y) = (x.to_device(device)?, y.to_device(device)?);
                let out = step_fn
                    .run(model, optimizer.as_mut(), task, &x, &y, *clip, s + 1)
                    .map_err(|e| with_checkpoint(e, &last_good))?;
                *step += 1;
                summary.end_step = *step;
                summary.losses.push(out.loss);
                let last = i + 1 == options.steps;
                let every = options.log_every as u64;
                if i == 0 || last || (every > 0 && *step % every == 0) {
                    let entry = LogEntry {
                        step: *step,
                        loss: out.loss,
                        lr: optimizer.learning_rate(),
                        grad_norm: out.grad_norm,
                    };
                    on_log(&entry);
                    summary.logs.push(entry);
                }
                if let Some(SaveOptions { path, every }) = &options.save {
                    if last || (*every > 0 && *step % *every as u64 == 0) {
                        save(path, &*model, optimizer.as_ref(), *step)?;
                        summary.last_checkpoint = Some(path.clone());
                        last_good = Some(path.clone());
                    }
                }
            }
            // no step: what was loaded is saved as it is (a re-save: another path, or a
            // version-1 checkpoint written again as version 2), never silently nothing
            if let (0, Some(SaveOptions { path, .. })) = (options.steps, &options.save) {
                save(path, &*model, optimizer.as_ref(), *step)?;
                summary.last_checkpoint = Some(path.clone());
            }
            Ok(summary)
        })
    }

    /// The model's output on `inputs`, in evaluation mode and without recording a tape (the
    /// model is back in training mode afterwards).
    pub fn predict(&mut self, inputs: &Tensor) -> Result<Tensor> {
        let Trainer {
            model,
            task,
            profile,
            session,
            planned,
            ..
        } = self;
        let device = profile.device;
        with_session(session, profile, || {
            model.to_device(device)?;
            let inputs = &inputs.to_device(device)?;
            // the loss is not run here: plan the forward only (evaluate plans the rest)
            let mut forward_only = [planned[0], true];
            Self::preplan(
                model,
                task,
                &mut forward_only,
                false,
                false,
                inputs,
                None,
                &[],
            )?;
            model.set_training(false);
            let out = runtime::no_grad(|| model.forward(inputs));
            model.set_training(true);
            Ok(out?)
        })
    }

    /// Mean loss (and accuracy for classification) over `data`, in batches, in evaluation
    /// mode and without recording a tape (the model is back in training mode afterwards).
    pub fn evaluate(&mut self, data: &Dataset, batch_size: usize) -> Result<Evaluation> {
        if data.is_empty() || batch_size == 0 {
            return Err(TrainError::Config(
                "evaluation needs a non-empty dataset and a positive batch size".into(),
            )
            .into());
        }
        let Trainer {
            model,
            task,
            profile,
            session,
            planned,
            ..
        } = self;
        let device = profile.device;
        with_session(session, profile, || {
            model.to_device(device)?;
            let mut batches = Vec::new();
            for (x, y) in data.batches(batch_size, None)? {
                batches.push((x.to_device(device)?, y.to_device(device)?));
            }
            if let Some((x, y)) = batches.first() {
                Self::preplan(model, task, planned, false, false, x, Some(y), &[])?;
            }
            model.set_training(false);
            let result = runtime::no_grad(|| -> Result<Evaluation> {
                let (mut loss, mut correct, mut n) = (0f64, 0f64, 0usize);
                let mut has_acc = false;
                for (x, y) in batches {
                    let b = x.shape()[0];
                    let pred = model.forward(&x)?;
                    loss += task.loss(&pred, &y)?.item()? as f64 * b as f64;
                    if let Some(a) = task.accuracy(&pred, &y)? {
                        has_acc = true;
                        correct += a as f64 * b as f64;
                    }
                    n += b;
                }
                Ok(Evaluation {
                    loss: (loss / n as f64) as f32,
                    accuracy: has_acc.then(|| (correct / n as f64) as f32),
                    samples: n,
                })
            });
            model.set_training(true);
            result
        })
    }
}

/// A training failure (a non-finite loss or gradient) that names no checkpoint, naming
/// `earlier` — the checkpoint the failed call started from, which a caller that trains in
/// several calls knows and the call does not (the CLI's `--show-backend` split, `--load`) —
/// as the last good one; any other error unchanged.
pub fn with_earlier_checkpoint(e: Error, earlier: Option<&PathBuf>) -> Error {
    match (&e, earlier) {
        (
            Error::Train(
                TrainError::NonFiniteLoss {
                    last_checkpoint: None,
                    ..
                }
                | TrainError::NonFiniteGradient {
                    last_checkpoint: None,
                    ..
                },
            ),
            Some(p),
        ) => with_checkpoint(e, &Some(p.clone())),
        _ => e,
    }
}

/// Adds the last good checkpoint to a non-finite-loss or -gradient error.
fn with_checkpoint(e: Error, last: &Option<PathBuf>) -> Error {
    let path = last.as_ref().map(|p| p.display().to_string());
    match e {
        Error::Train(TrainError::NonFiniteLoss { step, loss, .. }) => TrainError::NonFiniteLoss {
            step,
            loss,
            last_checkpoint: path,
        }
        .into(),
        Error::Train(TrainError::NonFiniteGradient {
            step,
            tensor,
            value,
            ..
        }) => TrainError::NonFiniteGradient {
            step,
            tensor,
            value,
            last_checkpoint: path,
        }
        .into(),
        other => other,
    }
}
