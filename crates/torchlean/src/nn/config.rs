//! The trainer's configuration: task, optimizer, dtype, execution backend, device / backend
//! profile / trust policy, seed, learning-rate schedule and gradient clipping; and the
//! options of one `train` call.

use super::error::Result;
use super::error::TrainError;
use super::loss::Task;
use super::optim::Optimizer;
use super::schedule::LrSchedule;
use crate::backend::{AcceptancePolicy, BackendProfile, Device};
use std::path::PathBuf;

/// How training steps execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionBackend {
    /// Define-by-run: every op planned, gated and recorded on the tape as it runs.
    Eager,
    /// Capture once, plan once, replay (not wired into the trainer in this build).
    Compiled,
}

/// The element type training computes in. Only `F32` is supported: float32 is the runtime
/// dtype on every device (DESIGN §4); the others are declared and rejected readably.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
}

impl DType {
    pub fn label(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
        }
    }
}

/// Everything a [`Trainer`](super::Trainer) needs besides the model.
pub struct Config {
    pub task: Task,
    pub optimizer: Box<dyn Optimizer>,
    pub dtype: DType,
    pub backend: ExecutionBackend,
    /// Device override (applied on top of `profile`).
    pub device: Option<Device>,
    /// Backend profile (default: the device's default profile, `checked_cpu` on CPU).
    pub profile: Option<BackendProfile>,
    /// Trust-policy override (applied on top of `profile`).
    pub policy: Option<AcceptancePolicy>,
    /// Seed of batch shuffling and dropout masks.
    pub seed: u64,
    /// Learning rate per step (the optimizer's own rate when `None`).
    pub schedule: Option<LrSchedule>,
    /// Clip gradients to this global norm before each update.
    pub clip_grad_norm: Option<f32>,
    /// What the model is beyond its parameter shapes (an example's name, the vocabulary it
    /// was trained on): written into checkpoints as metadata `model`; a checkpoint that
    /// records a different one is refused on load (two models with the same shapes, e.g. a
    /// character model of another text, would load silently otherwise).
    pub checkpoint_tag: Option<String>,
    /// Entries written into every checkpoint the trainer saves, as metadata `note.<key>`:
    /// what a resumed run should know that the parameters and optimizer state do not hold
    /// (the examples write the base learning rate, `note.lr`, which `--load` reuses).
    pub checkpoint_notes: Vec<(String, String)>,
}

impl Config {
    /// Eager f32 training on the default CPU profile with seed 0, no schedule, no clipping.
    pub fn new(task: Task, optimizer: impl Optimizer + 'static) -> Config {
        Config::with_boxed_optimizer(task, Box::new(optimizer))
    }

    /// [`Config::new`] with an optimizer chosen at run time.
    pub fn with_boxed_optimizer(task: Task, optimizer: Box<dyn Optimizer>) -> Config {
        Config {
            task,
            optimizer,
            dtype: DType::F32,
            backend: ExecutionBackend::Eager,
            device: None,
            profile: None,
            policy: None,
            seed: 0,
            schedule: None,
            clip_grad_norm: None,
            checkpoint_tag: None,
            checkpoint_notes: Vec::new(),
        }
    }

    /// The backend profile these choices resolve to; a profile changed by the device or
    /// policy override is named `custom(<base>)`.
    pub fn resolved_profile(&self) -> Result<BackendProfile> {
        let mut p = match (&self.profile, self.device) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => BackendProfile::resolve(None, Some(d.label()), None, None)
                .map_err(TrainError::Config)?,
            (None, None) => BackendProfile::default_cpu(),
        };
        let mut overridden = false;
        if let Some(d) = self.device {
            overridden |= d != p.device;
            p.device = d;
        }
        if let Some(pol) = &self.policy {
            overridden |= *pol != p.policy;
            p.policy = pol.clone();
        }
        if overridden {
            p.name = format!("custom({})", p.name);
        }
        Ok(p)
    }
}

/// Where and how often to save checkpoints while training.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveOptions {
    pub path: PathBuf,
    /// Save every this many steps (0 = only at the end); always also at the end.
    pub every: usize,
}

/// The options of one [`Trainer::train`](super::Trainer::train) call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainOptions {
    /// Number of steps this call runs (continuing from the trainer's current step).
    pub steps: usize,
    pub batch_size: usize,
    /// Record a log entry every this many steps (and on the first and last); 0 = only those.
    pub log_every: usize,
    pub save: Option<SaveOptions>,
    /// Checkpoint to resume from before the first step (parameters, optimizer, step).
    pub load: Option<PathBuf>,
    /// Shuffle the samples each epoch (seeded); in order otherwise.
    pub shuffle: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            steps: 100,
            batch_size: 32,
            log_every: 10,
            save: None,
            load: None,
            shuffle: true,
        }
    }
}
