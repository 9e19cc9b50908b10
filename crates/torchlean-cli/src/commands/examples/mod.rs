//! The training examples (`quickstart-cnn`, `mlp`, `cnn`, `transformer`, `autoencoder`,
//! `fno1d`, `rnn`): one file per example builds its data, model and optimizer; this module
//! holds what they share — the flags, the train-and-report loop, progress output, the JSON
//! step log, the loss plot and the mapping of library errors to exit codes.
//!
//! Exit codes: 0 ok (also when the stated threshold is missed: the summary says so), 1 runtime
//! failure (e.g. a non-finite loss; the last good checkpoint is named), 2 usage or planning
//! error (bad flags, bad or unreadable data or checkpoint files, an unavailable device, a model
//! that compiled mode refuses), 3 rejected by the gate.

pub mod autoencoder;
pub mod classify;
pub mod data_files;
pub mod export;
pub mod fno1d;
mod glyphs;
pub mod optimizer_flags;
pub mod plot;
pub mod rnn;
pub mod transformer;

use crate::backend_args::{BackendArgs, ModeArgs};
use crate::{CliError, CliResult};
pub use optimizer_flags::{OptimizerChoice, OptimizerFlags};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use torchlean::backend::{BackendReport, ExecutionMode};
use torchlean::data::Dataset;
use torchlean::nn::{
    CheckpointError, Config, Evaluation, ExecutionBackend, LogEntry, Module, SaveOptions,
    TrainError, TrainOptions, TrainSummary, Trainer,
};

/// A float flag read as f32 — refused when its decimal value is finite and nonzero but
/// outside f32's range, where parsing would round it to 0 or to infinity and the check that
/// follows would report a value the user never typed (`--lr 1e-46` was refused as "got 0").
pub fn f32_value(s: &str) -> Result<f32, String> {
    let bad = |e: std::num::ParseFloatError| format!("`{s}` is not a number: {e}");
    // the value as f32 parses it (one rounding of the decimal), the range from f64
    let v: f32 = s.trim().parse().map_err(bad)?;
    let wide: f64 = s.trim().parse().map_err(bad)?;
    if wide.is_finite() && wide != 0.0 && (v == 0.0 || v.is_infinite()) {
        return Err(format!(
            "{s} is outside float32's range (magnitudes from about 1.4e-45 to 3.4e38): it would be {v}"
        ));
    }
    Ok(v)
}

/// A float flag in [0, 1] (`--momentum`), checked on the value as typed before it is rounded
/// to f32 (`1.00000001` rounds to 1 and was accepted).
pub fn unit_closed(s: &str) -> Result<f32, String> {
    in_unit(s, true)
}

/// A float flag in [0, 1) (`--dropout`), checked on the value as typed (`0.99999999` rounds
/// to 1 and was refused as "got 1").
pub fn unit_half_open(s: &str) -> Result<f32, String> {
    in_unit(s, false)
}

fn in_unit(s: &str, closed: bool) -> Result<f32, String> {
    let v = f32_value(s)?;
    let wide: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("`{s}` is not a number: {e}"))?;
    let inside = wide >= 0.0 && if closed { wide <= 1.0 } else { wide < 1.0 };
    if !inside {
        let range = if closed { "[0, 1]" } else { "[0, 1)" };
        return Err(format!("must be in {range}, got {}", s.trim()));
    }
    // a typed value below 1 that rounds to 1 in f32 (0.99999999) is refused in [0, 1)
    if !closed && v >= 1.0 {
        return Err(format!(
            "{} rounds to 1 in float32, outside [0, 1)",
            s.trim()
        ));
    }
    Ok(v)
}

/// The flags every example takes. Unset `--steps`, `--lr` and `--batch-size` take the
/// example's defaults (listed in each command's help).
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub mode: ModeArgs,
    /// Training steps of this run (after `--load`, steps continue from the checkpoint's step).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Learning rate.
    // negative numbers reach the parser (its range message), not clap's "unexpected
    // argument '-1'"
    #[arg(long, value_parser = f32_value, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Seed offset: added to the example's data and initialization seeds; also the seed of
    /// batch shuffling and of a data file's held-out split. Default 0 (the documented
    /// defaults), or with --load the checkpoint's: another one is refused, since it would
    /// evaluate on the checkpoint's training rows.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Samples per batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Log (print, and write to `--log`) every this many steps, plus the first and last.
    #[arg(long, default_value_t = 10)]
    pub log_every: usize,
    /// Save a checkpoint (parameters, optimizer state, step) here at the end, atomically.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// With `--save`, also save every this many steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: usize,
    /// Resume from this checkpoint before the first step (it must come from the same
    /// example with the same model flags). A corrupted or mismatched file exits 2.
    #[arg(long)]
    pub load: Option<PathBuf>,
    /// Write one JSON object per logged step: {"step", "loss", "lr", "elapsed_s"}.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Draw the loss of every step of this run as a PNG line plot.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the trained model as an ONNX file (opset 20, weights as initializers) at the
    /// end: its evaluation forward (dropout off), captured on the first `--batch-size`
    /// training samples, so the file's input shape is that batch's. Input `x`, output `y`;
    /// `torchlean run-graph FILE` and onnxruntime run it. With `--load` and `--steps 0`, the
    /// checkpoint's model is exported without training. A model with an op ONNX cannot
    /// express (fno1d's `spectral_conv1d`) is refused before the first step (exit 2).
    #[arg(long)]
    pub export: Option<PathBuf>,
    #[command(flatten)]
    pub optim: OptimizerFlags,
    /// The `--load` checkpoint, read and verified once when first asked for (`None` without
    /// `--load`): its metadata sets up the run, its contents are loaded from the same read
    /// (a pipe can be read only once), as a code and message when it could not be read.
    #[arg(skip)]
    loaded: std::sync::OnceLock<Option<Result<torchlean::nn::CheckpointContents, (u8, String)>>>,
}

/// A loss as printed: −0 (a cross-entropy whose every log-probability rounded to 0) as 0,
/// which "-0.000000" would hide from a reader.
fn shown(loss: f32) -> f32 {
    loss + 0.0
}

/// The checkpoint note listing the profiles that trained its parameters
/// (`CommonArgs::profile_history`).
const PROFILES_NOTE: &str = "profiles";

/// A profile as a checkpoint's history records it: its name and policy.
fn trainer_profile_label(config: &Config) -> String {
    match &config.profile {
        Some(p) => format!("{} [{}]", p.name, p.policy.name),
        None => "default".into(),
    }
}

/// The example's defaults for the unset flags.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub steps: usize,
    pub lr: f32,
    pub batch_size: usize,
}

/// The resolved hyper-parameters an example builds with.
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub steps: usize,
    pub lr: f32,
    pub batch_size: usize,
    /// `--seed`, to be added to the example's own seeds.
    pub seed: u64,
    /// Whether the seed is known to be the run's: given, or recorded by the `--load`
    /// checkpoint (a checkpoint written before seeds were recorded leaves it unknown, and a
    /// checkpoint saved from it then records none rather than a seed it never had).
    pub seed_known: bool,
}

impl CommonArgs {
    /// The `--load` checkpoint, read and verified on first use (`None` without `--load`); a
    /// file that cannot be read or verified is the error its load would give (exit 2).
    pub fn checkpoint(&self) -> Result<Option<&torchlean::nn::CheckpointContents>, CliError> {
        let loaded = self.loaded.get_or_init(|| {
            let path = self.load.as_deref()?;
            Some(torchlean::nn::read_checkpoint(path).map_err(|e| {
                let e = lib_err(e);
                (e.code, e.message)
            }))
        });
        match loaded {
            None => Ok(None),
            Some(Ok(c)) => Ok(Some(c)),
            Some(Err((code, message))) => Err(CliError {
                code: *code,
                message: message.clone(),
            }),
        }
    }

    /// A metadata entry of the `--load` checkpoint (`None` without one, or when it cannot be
    /// read: [`CommonArgs::hyper`] reports that before anything else asks).
    fn saved(&self, key: &str) -> Option<String> {
        self.checkpoint().ok()??.metadata.get(key).cloned()
    }

    /// A setting a resumed run continues with when its flag is not given: the value the
    /// `--load` checkpoint's run used (its `note.<key>`), as PyTorch's optimizer state
    /// restores `lr`, `momentum` and `weight_decay`. (A note that does not parse is refused
    /// by [`CommonArgs::hyper`].)
    fn saved_value<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.saved(&torchlean::nn::note_key(key))?.parse::<T>().ok()
    }

    /// Refuses a `--load` checkpoint that cannot be read, that another example saved (before
    /// any of its notes is printed as this run's), or whose notes are not numbers.
    fn check_checkpoint(&self, example: &str) -> Result<(), CliError> {
        let Some(c) = self.checkpoint()? else {
            return Ok(());
        };
        torchlean::nn::check_tag_example(c, &self.load_display(), example).map_err(lib_err)?;
        if c.metadata.get("version").map(String::as_str) == Some("1") {
            eprintln!(
                "note: --load {}: a version-1 checkpoint, whose checksum covers its tensors but not its metadata (step, learning rate, seed, optimizer kind); saving it again (--save) writes version 2",
                self.load_display()
            );
        }
        let key = torchlean::nn::note_key("lr");
        if let Some(v) = c.metadata.get(&key) {
            if v.parse::<f32>().is_err() {
                return Err(CliError::usage(format!(
                    "--load {}: its `{key}` is `{}`, not a number",
                    self.load_display(),
                    torchlean::nn::shown_metadata(v)
                )));
            }
        }
        self.check_optimizer_notes()
    }

    /// The flag's value, else the checkpoint's (printed once, where the run is set up, when
    /// `announce` is on).
    fn flag_or_saved<T: std::str::FromStr + std::fmt::Display>(
        &self,
        given: Option<T>,
        key: &str,
        flag: &str,
        announce: bool,
    ) -> Option<T> {
        given.or_else(|| {
            let v = self.saved_value::<T>(key)?;
            if announce {
                outln!("note: {key} {v} from the checkpoint ({flag} overrides it)");
            }
            Some(v)
        })
    }

    /// The `--load` checkpoint's batch size (its `note.batch_size`), announced: a resumed run
    /// continues with the batches the uninterrupted run would have drawn, which depend on it
    /// (the batch of step t is a function of the seed, t, B and N; docs/architecture.md). A
    /// resume without `--batch-size` fell back to the example's default and trained on other
    /// batches, exit 0 (an audit of the forty-second session). `--batch-size` overrides it.
    fn saved_batch_size(&self) -> Result<Option<usize>, CliError> {
        let key = torchlean::nn::note_key("batch_size");
        let Some(v) = self.saved(&key) else {
            return Ok(None);
        };
        match v.parse::<usize>() {
            Ok(b) if b > 0 => {
                outln!("note: batch size {b} from the checkpoint (--batch-size overrides it)");
                Ok(Some(b))
            }
            _ => Err(CliError::usage(format!(
                "--load {}: its `{key}` is `{}`, not a positive batch size",
                self.load_display(),
                torchlean::nn::shown_metadata(&v)
            ))),
        }
    }

    /// `--seed`, or the `--load` checkpoint's (its `note.seed`), else 0. The seed chose the
    /// checkpoint's held-out rows (a data file's fifth, or the synthetic data itself) and its
    /// batch order, so a `--seed` other than the checkpoint's is refused: evaluating under it
    /// would count training rows as held out (an audit of the thirty-eighth session: a model
    /// that memorized random labels scored 0.92 "held out" under another seed, 0.43 under its
    /// own). A checkpoint without the note (written before it existed) takes the flag as given.
    /// Also says whether the seed is known to be the run's ([`Hyper::seed_known`]).
    fn seed(&self) -> Result<(u64, bool), CliError> {
        let key = torchlean::nn::note_key("seed");
        let saved = match self.saved(&key) {
            Some(v) => Some(v.parse::<u64>().map_err(|_| {
                CliError::usage(format!(
                    "--load {}: its `{key}` is `{}`, not a seed",
                    self.load_display(),
                    torchlean::nn::shown_metadata(&v)
                ))
            })?),
            None => None,
        };
        match (self.seed, saved) {
            (Some(given), Some(saved)) if given != saved => Err(CliError::usage(format!(
                "--seed {given} differs from the seed {saved} of the --load checkpoint {}: the seed chose the held-out rows and the batch order of the run that wrote it, so another one would evaluate on its training rows (leave --seed out to use the checkpoint's)",
                self.load_display()
            ))),
            (Some(given), _) => Ok((given, true)),
            (None, Some(saved)) => {
                if saved != 0 {
                    outln!("note: seed {saved} from the checkpoint");
                }
                Ok((saved, true))
            }
            (None, None) => {
                if self.load.is_some() {
                    outln!(
                        "note: the checkpoint records no seed (it was written before seeds were recorded); using 0, whose held-out rows may not be its run's (--seed gives that run's seed)"
                    );
                }
                Ok((0, self.load.is_none()))
            }
        }
    }

    /// The profiles that trained the `--load` checkpoint's parameters, from its note
    /// [`PROFILES_NOTE`] (`profile [policy] from step N; …`), plus this run's `label` from the
    /// checkpoint's step: what a checkpoint of this run records.
    fn profile_history(&self, label: &str) -> String {
        let step = self.checkpoint_step();
        let this = format!("{label} from step {step}");
        match (self.saved(&torchlean::nn::note_key(PROFILES_NOTE)), step) {
            (_, 0) => this,
            // a resume under the profile that trained the last steps continues that
            // segment: its checkpoint is the straight run's, byte for byte
            (Some(h), _)
                if h.rsplit("; ")
                    .next()
                    .and_then(|last| last.rsplit_once(" from step "))
                    .is_some_and(|(profile, _)| profile == label) =>
            {
                h
            }
            (Some(h), _) => format!("{h}; {this}"),
            (None, _) => format!("unrecorded (a checkpoint written before profiles were recorded) from step 0; {this}"),
        }
    }

    /// The report's line for the parameters a `--load` checkpoint brought: trained by earlier
    /// runs (under the profiles its note records), whose kernels are not in this run's report.
    /// Empty without `--load` or for a checkpoint of step 0.
    fn earlier_training(&self) -> Vec<String> {
        let step = self.checkpoint_step();
        if step == 0 {
            return vec![];
        }
        let history = self
            .saved(&torchlean::nn::note_key(PROFILES_NOTE))
            .map(|h| torchlean::nn::shown_metadata(&h))
            .unwrap_or_else(|| "profiles not recorded (an older checkpoint)".into());
        vec![format!(
            "the parameters loaded from --load {} were trained by earlier runs ({step} steps: {history}); their kernels are not in this report",
            self.load_display()
        )]
    }

    /// The `--load` checkpoint's step (0 without one).
    fn checkpoint_step(&self) -> u64 {
        self.checkpoint()
            .ok()
            .flatten()
            .and_then(|c| c.metadata.get("step"))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    }

    /// The `--load` path, for messages.
    fn load_display(&self) -> String {
        self.load
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// The flags of example `example` resolved against `d`, validated.
    pub fn hyper(&self, d: Defaults, example: &str) -> Result<Hyper, CliError> {
        self.check_checkpoint(example)?;
        let lr = match self.lr {
            Some(lr) => lr,
            None => self.flag_or_saved(None, "lr", "--lr", true).unwrap_or(d.lr),
        };
        let (seed, seed_known) = self.seed()?;
        let h = Hyper {
            steps: self.steps.unwrap_or(d.steps),
            lr,
            batch_size: match self.batch_size {
                Some(b) => b,
                None => self.saved_batch_size()?.unwrap_or(d.batch_size),
            },
            seed,
            seed_known,
        };
        if h.batch_size == 0 {
            return Err(CliError::usage("--batch-size must be positive"));
        }
        if h.steps == 0 && self.load.is_none() {
            return Err(CliError::usage(
                "--steps must be positive (--steps 0 is for a checkpoint given by --load: evaluated, and exported with --export, without training)",
            ));
        }
        if h.steps == 0 && self.plot.is_some() {
            return Err(CliError::usage(
                "--plot draws the losses of the run's steps: give --steps > 0",
            ));
        }
        if !(h.lr.is_finite() && h.lr > 0.0) {
            let source = if self.lr.is_some() {
                "--lr"
            } else {
                "the learning rate (the --load checkpoint's `note.lr`)"
            };
            return Err(CliError::usage(format!(
                "{source} must be finite and > 0, got {}",
                h.lr
            )));
        }
        if self.save_every > 0 && self.save.is_none() {
            return Err(CliError::usage(
                "--save-every needs --save (the checkpoint file to write)",
            ));
        }
        self.check_files(&[])?;
        Ok(h)
    }

    /// Refuses output files that would overwrite an input (`data`: the example's data files,
    /// and `--load`) or each other. `--save` may name the `--load` checkpoint: a resumed run
    /// saves where it started.
    pub fn check_files(&self, data: &[(&str, &Path)]) -> Result<(), CliError> {
        let report = self.backend.report_json.as_deref().map(Path::new);
        let logs: Vec<(&str, &Path)> = [
            ("--log", self.log.as_deref()),
            ("--plot", self.plot.as_deref()),
            ("--report-json", report),
            ("--export", self.export.as_deref()),
        ]
        .into_iter()
        .filter_map(|(flag, p)| p.map(|p| (flag, p)))
        .collect();
        let mut reads = data.to_vec();
        reads.extend(self.load.as_deref().map(|p| ("--load", p)));
        let mut outputs: Vec<(&str, &Path)> = self
            .save
            .as_deref()
            .map(|p| ("--save", p))
            .into_iter()
            .collect();
        outputs.extend(logs.iter().copied());
        // the checkpoint against the data files and the other outputs; the logs also
        // against the checkpoint being loaded
        crate::check_outputs(data, &outputs)
            .and_then(|()| crate::check_outputs(&reads, &logs))
            .map_err(CliError::usage)
    }
}

/// What an example is expected to reach (stated in its summary line).
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// Held-out accuracy at least this.
    AccuracyAtLeast(f32),
    /// Held-out mean squared error below `factor` times the variance of the held-out targets.
    RelativeMseBelow { factor: f32, variance: f32 },
    /// Mean of the last `window` training losses below `threshold`.
    MeanLastLossBelow { window: usize, threshold: f32 },
    /// No stated threshold (user data).
    None,
}

/// A ready example: model, configuration (task, optimizer, schedule, clipping; the runner
/// sets backend, profile and seed) and data.
pub struct Setup<M: Module> {
    pub name: &'static str,
    /// One line describing model and data.
    pub description: String,
    pub model: M,
    pub config: Config,
    pub train: Dataset,
    /// Evaluated after training (held-out data); `None` for no evaluation.
    pub test: Option<Dataset>,
    pub goal: Goal,
}

/// Maps a library error to an exit code: user input (data files, checkpoints to read,
/// training configuration such as a model compiled mode refuses) is a usage error (2); a
/// non-finite loss or a failed write is a runtime failure (1); planning 2, gate 3.
pub fn lib_err(e: impl Into<torchlean::nn::Error>) -> CliError {
    use torchlean::nn::Error as E;
    let e = e.into();
    let usage = match &e {
        E::Core(c) => matches!(
            c.root(),
            torchlean::Error::Data(_) | torchlean::Error::Creation(_)
        ),
        E::Checkpoint(CheckpointError::Io { action, .. }) => *action == "read",
        E::Checkpoint(CheckpointError::NonFinite { .. }) => false,
        E::Checkpoint(_) => true,
        E::Train(TrainError::NonFiniteLoss { .. } | TrainError::NonFiniteGradient { .. }) => false,
        E::Train(_) => true,
    };
    if usage {
        CliError::usage(e.to_string())
    } else {
        CliError::from(e)
    }
}

/// Progress output: a bar on a terminal, plain `step N loss X` lines otherwise.
enum Progress {
    Bar(indicatif::ProgressBar),
    Plain,
}

impl Progress {
    fn new(steps: usize) -> Progress {
        if !std::io::stdout().is_terminal() {
            return Progress::Plain;
        }
        let bar = indicatif::ProgressBar::new(steps as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} steps  loss {msg}  {per_sec}  eta {eta}",
        ) {
            bar.set_style(style);
        }
        Progress::Bar(bar)
    }

    fn log(&self, done_in_run: u64, e: &LogEntry) {
        match self {
            Progress::Bar(b) => {
                b.set_position(done_in_run);
                b.set_message(format!("{:.6}", shown(e.loss)));
            }
            Progress::Plain => outln!("step {} loss {:.6}", e.step, shown(e.loss)),
        }
    }

    fn println(&self, text: &str) {
        match self {
            Progress::Bar(b) => b.suspend(|| out!("{text}")),
            Progress::Plain => out!("{text}"),
        }
    }

    fn finish(&self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

/// The `--log` JSON-lines writer; the first write error is kept and reported after training.
struct StepLog {
    out: Option<BufWriter<Box<dyn Write>>>,
    path: Option<PathBuf>,
    error: Option<std::io::Error>,
}

impl StepLog {
    fn open(path: &Option<PathBuf>) -> Result<StepLog, CliError> {
        let out = match path {
            Some(p) => Some(BufWriter::new(torchlean::files::create_output(p).map_err(
                |e| CliError::usage(format!("cannot create log file {}: {e}", p.display())),
            )?)),
            None => None,
        };
        Ok(StepLog {
            out,
            path: path.clone(),
            error: None,
        })
    }

    fn write(&mut self, e: &LogEntry, elapsed_s: f64) {
        let (Some(out), None) = (&mut self.out, &self.error) else {
            return;
        };
        let line = serde_json::json!({
            "step": e.step,
            "loss": e.loss,
            "lr": e.lr,
            "elapsed_s": elapsed_s,
        });
        if let Err(err) = writeln!(out, "{line}") {
            self.error = Some(err);
        }
    }

    fn finish(mut self) -> CliResult {
        if let Some(out) = &mut self.out {
            if self.error.is_none() {
                if let Err(err) = out.flush() {
                    self.error = Some(err);
                }
            }
        }
        match (self.error, &self.path) {
            (Some(e), Some(p)) => Err(CliError::runtime(format!(
                "cannot write log file {}: {e}",
                p.display()
            ))),
            _ => Ok(()),
        }
    }
}

/// The report of what ran: the compiled step's plan in compiled mode, else the kernels that
/// ran in the trainer's session.
pub(super) fn what_ran<M: Module>(
    args: &CommonArgs,
    trainer: &Trainer<M>,
) -> Result<BackendReport, CliError> {
    let mut report = trainer
        .step_report()
        .or_else(|| trainer.report())
        .ok_or_else(|| CliError::runtime("no backend report is available"))?;
    // what the command itself ran under the session it installed (an example that computes
    // its data with ops: the autoencoder's manifold), under the same profile
    if let Ok(command) = torchlean::runtime::with_current(|s| s.report()) {
        report.add_eager_kernels(command);
    }
    // the loaded parameters were computed by earlier runs, whose kernels this report cannot
    // list: it says which profiles trained them (the trust audit: a strict resume of a
    // checked run showed only verified rows)
    Ok(report.with_outside_gate(args.earlier_training()))
}

/// Whether the model's outputs on the first training batch are all finite (the check of
/// the model the last update left, where nothing is held out: the transformer).
fn outputs_finite<M: Module>(
    trainer: &mut Trainer<M>,
    train: &Dataset,
    batch_size: usize,
) -> Result<bool, CliError> {
    let (x, _) = train
        .range(0, batch_size.clamp(1, train.len()))
        .map_err(lib_err)?;
    let y = trainer.predict(&x).map_err(lib_err)?;
    let y = y.to_cpu().map_err(lib_err)?;
    Ok(y.data().iter().all(|v| v.is_finite()))
}

/// The report of what ran before a run failed, where one was asked for: printed with
/// `--show-backend`, written to `--report-json` (the trust audit: a failed run wrote none).
/// Best effort: the run's own error is what the command reports.
fn report_after_failure<M: Module>(args: &CommonArgs, trainer: &Trainer<M>, reason: &str) {
    if !args.backend.show_backend && args.backend.report_json.is_none() {
        return;
    }
    let Ok(report) = what_ran(args, trainer) else {
        return;
    };
    let report = report.stopped_by(reason);
    if args.backend.show_backend {
        outln!("backend report of what ran before the failure:");
        outln!("{}", report.to_text());
    }
    let load: Vec<(&str, &Path)> = args.load.iter().map(|p| ("--load", p.as_path())).collect();
    if let Err(e) = args.backend.write_report(report, &load) {
        eprintln!("note: the report could not be written: {}", e.message);
    }
}

/// Trains `setup` under the common flags, printing progress and a one-line summary, and
/// writes the log, plot and backend report when asked. Returns the trainer, for examples
/// that do more with the trained model (e.g. generate a sample).
pub fn run<M: Module>(
    args: &CommonArgs,
    mut hyper: Hyper,
    setup: Setup<M>,
) -> Result<Trainer<M>, CliError> {
    let Setup {
        name,
        description,
        model,
        mut config,
        train,
        test,
        goal,
    } = setup;
    if train.is_empty() {
        return Err(CliError::usage("the training dataset is empty"));
    }
    // an explicit --batch-size larger than the data is refused by the trainer (a batch would
    // repeat samples); the example's default shrinks to the data, and says so
    if args.batch_size.is_none() && hyper.batch_size > train.len() {
        outln!(
            "note: the default batch size {} exceeds the {} training samples; using {}",
            hyper.batch_size,
            train.len(),
            train.len()
        );
        hyper.batch_size = train.len();
    }
    let mode = args.mode.mode();
    config.backend = match mode {
        ExecutionMode::Eager => ExecutionBackend::Eager,
        ExecutionMode::Compiled => ExecutionBackend::Compiled,
    };
    config.profile = Some(args.backend.profile()?);
    config.seed = hyper.seed;
    // checkpoints say which example (and, where the example adds it, which data: the
    // transformer's vocabulary) they come from; --load refuses another one
    config.checkpoint_tag = Some(match config.checkpoint_tag.take() {
        Some(t) => format!("{name}; {t}"),
        None => name.to_string(),
    });
    // the base learning rate and the optimizer's flags, which a resumed run reuses unless
    // given again
    config
        .checkpoint_notes
        .push(("lr".to_string(), hyper.lr.to_string()));
    // the profiles that trained the parameters, this run's appended (CommonArgs::earlier_training)
    config.checkpoint_notes.push((
        PROFILES_NOTE.to_string(),
        args.profile_history(&trainer_profile_label(&config)),
    ));
    // the batch size, on which each step's batch depends (CommonArgs::saved_batch_size)
    config
        .checkpoint_notes
        .push(("batch_size".to_string(), hyper.batch_size.to_string()));
    // the seed, which chose the held-out rows: --load refuses another (CommonArgs::seed);
    // none when it is not known (a checkpoint that recorded none, loaded without --seed)
    if hyper.seed_known {
        config
            .checkpoint_notes
            .push(("seed".to_string(), hyper.seed.to_string()));
    }
    config.checkpoint_notes.extend(args.optimizer_notes());
    let params = model.parameter_count();
    let mut trainer = Trainer::new(model, config).map_err(lib_err)?;
    if args.export.is_some() {
        export::check_exportable(&mut trainer, &train, hyper.batch_size)?;
    }
    // no training step: the evaluation forward runs eager whatever --backend asked (the
    // compiled step is a training step), and the header says so
    let mode_text = if hyper.steps == 0 && mode == ExecutionMode::Compiled {
        "eager evaluation (no compiled step to run)".to_string()
    } else {
        format!("{mode} mode")
    };
    outln!(
        "{name}: {description}; {params} parameters, lr {}, batch {}, {} steps, {mode_text}, profile {}",
        torchlean::nn::readable_number(hyper.lr),
        hyper.batch_size,
        hyper.steps,
        trainer.profile().name
    );
    outln!("optimizer {}", trainer.optimizer().describe());
    // the checkpoint as read once by `CommonArgs::checkpoint` (whose metadata set up the
    // run): loaded from that read, never opened a second time (a pipe has been drained)
    if let (Some(contents), Some(path)) = (args.checkpoint()?, &args.load) {
        trainer
            .load_checkpoint_contents(contents.clone(), &path.display().to_string())
            .map_err(lib_err)?;
    }
    let mut step_log = StepLog::open(&args.log)?;
    let save = args.save.as_ref().map(|p| SaveOptions {
        path: p.clone(),
        every: args.save_every,
    });
    let options = TrainOptions {
        steps: hyper.steps,
        batch_size: hyper.batch_size,
        log_every: args.log_every,
        save,
        load: None,
        shuffle: true,
    };
    // With --show-backend, one step runs first so that the printed report is the one of the
    // kernels (or compiled plan) that actually ran; batches, learning rates and masks depend
    // only on (seed, step), so splitting the run changes no loss — nor what is saved and
    // logged: the first part saves only where the whole run would (its one step, global step
    // s0 + 1, a multiple of --save-every: the trainer saves by global step; `every == 1`
    // alone skipped the save due at step 5 of a run resumed at 4 with --save-every 5, an
    // audit of the forty-sixth session), a failure in the second part names the checkpoint
    // the first part wrote, and the second part's first step is logged only where the whole
    // run would log it (below; both differed before the thirty-seventh session).
    let split = args.backend.show_backend && hyper.steps > 1;
    let first_global = trainer.step() + 1;
    let parts: Vec<TrainOptions> = if split {
        vec![
            TrainOptions {
                steps: 1,
                save: options
                    .save
                    .clone()
                    .filter(|s| s.every > 0 && first_global % s.every as u64 == 0),
                ..options.clone()
            },
            TrainOptions {
                steps: hyper.steps - 1,
                load: None,
                ..options
            },
        ]
    } else {
        vec![options]
    };
    let progress = Progress::new(hyper.steps);
    let start = Instant::now();
    let mut losses = Vec::with_capacity(hyper.steps.min(1 << 16));
    let mut first_step = None;
    // the number of this run's first step (a resumed run continues the checkpoint's count)
    let run_first_step = trainer.step() + 1;
    // the step the second part of a split run starts with (logged as its first step)
    let resumed_at = trainer.step() + 2;
    let end_step = trainer.step() + hyper.steps as u64;
    let every = args.log_every as u64;
    // the checkpoint a failure names when the failing part saved none: the last one an
    // earlier part wrote, else --load's
    let mut earlier: Option<PathBuf> = args.load.clone().filter(|p| p.is_file());
    for (i, part) in parts.iter().enumerate() {
        let result = trainer.train_with(&train, part, |e: &LogEntry| {
            let whole_run_logs =
                e.step != resumed_at || e.step == end_step || (every > 0 && e.step % every == 0);
            if split && i == 1 && !whole_run_logs {
                return;
            }
            let first = *first_step.get_or_insert(e.step.saturating_sub(1));
            progress.log(e.step - first, e);
            step_log.write(e, start.elapsed().as_secs_f64());
        });
        let summary: TrainSummary = match result {
            Ok(s) => s,
            Err(e) => {
                progress.finish();
                // keep what was logged so far
                let _ = step_log.finish();
                // and say what ran before the failure (a checker's rejection, a non-finite
                // loss): the report asked for, printed or written, as on success
                let err = lib_err(torchlean::nn::with_earlier_checkpoint(e, earlier.as_ref()));
                report_after_failure(args, &trainer, &err.message);
                return Err(err);
            }
        };
        if let Some(p) = &summary.last_checkpoint {
            earlier = Some(p.clone());
        }
        losses.extend_from_slice(&summary.losses);
        // (with no step the report is printed after the evaluation, what ran then)
        if i == 0 && args.backend.show_backend && hyper.steps > 0 {
            progress.println(&what_ran(args, &trainer)?.to_text());
        }
    }
    progress.finish();
    if args.backend.show_backend {
        // the compiled step's executor line changes once its device graph is recorded
        if let Some(e) = trainer.step_report().and_then(|r| r.executor) {
            outln!("executor at the end: {e}");
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    step_log.finish()?;

    let eval: Option<Evaluation> = match &test {
        Some(t) => Some(
            trainer
                .evaluate(t, hyper.batch_size.max(64))
                .map_err(lib_err)?,
        ),
        None => None,
    };
    if args.backend.show_backend && hyper.steps == 0 {
        // an evaluation-only run (`--load … --steps 0`): the kernels the evaluation ran (the
        // report printed after a first step would have no rows)
        outln!("{}", what_ran(args, &trainer)?.to_text());
    }
    let n = losses.len();
    let final_loss = losses.last().copied().unwrap_or(f32::NAN);
    let mut parts_text = vec![if n == 0 {
        "no training step (the loaded checkpoint evaluated)".to_string()
    } else {
        format!("final train loss {:.6}", shown(final_loss))
    }];
    // a data file of fewer than 10 samples holds none out (data_files::holdout): its
    // evaluation is of the training samples, and the summary says so (it said "held-out")
    let on_train = test.as_ref().is_some_and(|t| {
        t.len() == train.len()
            && t.features().map(|f| f.to_vec()).ok() == train.features().map(|f| f.to_vec()).ok()
            && t.targets().map(|f| f.to_vec()).ok() == train.targets().map(|f| f.to_vec()).ok()
    });
    let which = if on_train { "training-set" } else { "held-out" };
    if let Some(ev) = &eval {
        parts_text.push(format!("{which} loss {:.6}", shown(ev.loss)));
        // (no accuracy of a non-finite model: an argmax over NaN scores is the first class)
        if let Some(a) = ev.accuracy.filter(|_| ev.loss.is_finite()) {
            parts_text.push(format!("{which} accuracy {a:.4}"));
        }
        if on_train {
            parts_text.push("nothing held out (fewer than 10 samples)".to_string());
        }
    }
    let verdict = |ok: bool| if ok { "reached" } else { "NOT reached" };
    let goal_text = match (goal, &eval) {
        (
            Goal::AccuracyAtLeast(t),
            Some(Evaluation {
                accuracy: Some(a), ..
            }),
        ) => format!("threshold: {which} accuracy >= {t} {}", verdict(*a >= t)),
        (Goal::RelativeMseBelow { factor, variance }, Some(ev)) => {
            let rel = ev.loss / variance;
            parts_text.push(format!("relative mse {rel:.5}"));
            format!(
                "threshold: relative mse < {factor} {}",
                verdict(rel < factor)
            )
        }
        (Goal::MeanLastLossBelow { .. }, _) if n == 0 => {
            "threshold: not judged (it is on the training losses, and no step ran)".to_string()
        }
        (Goal::MeanLastLossBelow { window, threshold }, _) => {
            let w = &losses[n.saturating_sub(window)..];
            let mean = w.iter().sum::<f32>() / w.len().max(1) as f32;
            parts_text.push(format!("mean of last {} losses {mean:.4}", w.len()));
            if w.len() < window {
                // a mean over fewer losses is another test (a resumed run's verdict differed
                // from the uninterrupted one's at the same step: an audit of the forty-second
                // session)
                format!(
                    "threshold: mean of last {window} losses < {threshold} not judged (this run logged {})",
                    w.len()
                )
            } else {
                format!(
                    "threshold: mean of last {window} losses < {threshold} {}",
                    verdict(mean < threshold)
                )
            }
        }
        _ => "threshold: none stated for this data".to_string(),
    };
    outln!(
        "summary: {name}: {}, {} steps in {elapsed:.2} s ({:.1} steps/s); {goal_text}",
        parts_text.join(", "),
        n,
        n as f64 / elapsed.max(1e-9)
    );
    if let Some(p) = &args.plot {
        plot::write_loss_plot(p, &losses, run_first_step)?;
    }
    // The model the last update left is checked too: the non-finite check of training reads
    // each step's loss *before* its update, so a last update that made every output NaN or
    // infinite (finite but huge weights) exited 0 with "held-out loss NaN", an accuracy of
    // argmax over NaN, an all-NaN ONNX export and a sample of one repeated token (an audit of
    // the forty-sixth session). Now that is a runtime failure before anything is exported.
    let finite_outputs = match &eval {
        Some(ev) => ev.loss.is_finite(),
        None => outputs_finite(&mut trainer, &train, hyper.batch_size)?,
    };
    if !finite_outputs {
        let held = match &eval {
            Some(ev) => format!("its {which} loss is {}", shown(ev.loss)),
            None => "its outputs on a training batch are not all finite".to_string(),
        };
        let saved = match (&args.save, n) {
            (Some(p), 1..) => format!(
                "; the checkpoint `{}` written at the last step holds that model",
                p.display()
            ),
            _ => String::new(),
        };
        let err = CliError::runtime(format!(
            "{name}: the model after step {} gives non-finite outputs ({held}): {}{saved}; nothing was exported (a lower --lr keeps the updates finite)",
            trainer.step(),
            if n == 0 {
                "the loaded checkpoint diverges on this data"
            } else {
                "the last update diverged"
            }
        ));
        report_after_failure(args, &trainer, &err.message);
        return Err(err);
    }
    if let Some(p) = &args.export {
        export::write_onnx(&mut trainer, &train, hyper.batch_size, p)?;
    }
    let load: Vec<(&str, &Path)> = args.load.iter().map(|p| ("--load", p.as_path())).collect();
    args.backend
        .write_report(what_ran(args, &trainer)?, &load)?;
    Ok(trainer)
}

/// Population variance of a tensor's values.
pub fn variance(t: &torchlean::Tensor) -> f32 {
    let v = t.to_vec();
    if v.is_empty() {
        return 0.0;
    }
    let m = v.iter().sum::<f32>() / v.len() as f32;
    v.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / v.len() as f32
}
