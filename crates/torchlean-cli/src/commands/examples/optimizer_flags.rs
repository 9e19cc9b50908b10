//! The optimizer flags of the training examples and the optimizer they build.
//!
//! `--optimizer` picks one of `torch.optim`'s five; the other flags set its settings under
//! `torch.optim`'s names, with its defaults for what no flag sets. A flag the chosen optimizer
//! has no use for is refused, not ignored. Every setting a run used is written into its
//! checkpoints' notes, and a resumed run continues with the checkpoint's settings unless a
//! flag says otherwise (each announced); a flag that would add or remove buffers of the
//! optimizer's state (momentum, `amsgrad`, `centered`) is refused on resume, since the
//! checkpoint's state holds, or lacks, them. The settings are checked before the first
//! kernel runs (exit 2), and the run prints the optimizer as it was built
//! (`Optimizer::describe`, after the run's header).

use super::{f32_value, unit_closed, CommonArgs};
use crate::CliError;

/// The optimizers an example can train with (`torch.optim`'s names).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerChoice {
    Adam,
    Adamw,
    Sgd,
    Rmsprop,
    Adagrad,
}

impl OptimizerChoice {
    /// The optimizer kind a checkpoint records (`Optimizer::kind`).
    fn from_kind(kind: &str) -> Option<OptimizerChoice> {
        use OptimizerChoice as O;
        [O::Adam, O::Adamw, O::Sgd, O::Rmsprop, O::Adagrad]
            .into_iter()
            .find(|o| o.kind() == kind)
    }

    fn kind(self) -> &'static str {
        match self {
            OptimizerChoice::Adam => "adam",
            OptimizerChoice::Adamw => "adamw",
            OptimizerChoice::Sgd => "sgd",
            OptimizerChoice::Rmsprop => "rmsprop",
            OptimizerChoice::Adagrad => "adagrad",
        }
    }
}

/// The optimizer flags (flattened into every example's flags).
#[derive(clap::Args, Debug, Clone)]
pub struct OptimizerFlags {
    /// Optimizer, with PyTorch's defaults for what no flag sets (default: the example's;
    /// after `--load`, the checkpoint's).
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerChoice>,
    /// Momentum of `sgd` and `rmsprop` (default 0).
    #[arg(long, value_parser = unit_closed, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// Weight decay: L2 (added to the gradient) for adam, sgd, rmsprop and adagrad,
    /// decoupled for adamw (default 0; adamw 0.01).
    #[arg(long, value_parser = f32_value, allow_negative_numbers = true)]
    pub weight_decay: Option<f32>,
    /// β₁ and β₂ of adam and adamw, as `B1,B2` (default 0.9,0.999), each in [0, 1); kept as
    /// typed (double precision), as torch.optim keeps Python's floats.
    #[arg(long, value_parser = betas_value, value_name = "B1,B2", allow_hyphen_values = true)]
    pub betas: Option<(f64, f64)>,
    /// The ε added to the denominator, >= 0: adam, adamw and rmsprop (default 1e-8),
    /// adagrad (default 1e-10).
    #[arg(long, value_parser = f32_value, allow_negative_numbers = true)]
    pub eps: Option<f32>,
    /// adam and adamw: AMSGrad, dividing by the running maximum of the second moment
    /// (`--amsgrad=false` says off explicitly; default off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub amsgrad: Option<bool>,
    /// sgd: Nesterov momentum, which needs `--momentum` > 0 (`--nesterov=false` says off
    /// explicitly; default off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub nesterov: Option<bool>,
    /// rmsprop: the smoothing constant α of the squared-gradient average (default 0.99), in
    /// [0, 1]; kept as typed (double precision).
    #[arg(long, value_parser = alpha_value, allow_negative_numbers = true)]
    pub alpha: Option<f64>,
    /// rmsprop: centered, normalizing by the gradient's estimated variance
    /// (`--centered=false` says off explicitly; default off).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub centered: Option<bool>,
    /// adagrad: the learning-rate decay (default 0), >= 0.
    #[arg(long, value_parser = f32_value, allow_negative_numbers = true)]
    pub lr_decay: Option<f32>,
}

/// A value in [0, 1) or [0, 1] (`closed`) read at double precision, as typed.
fn unit_f64(s: &str, closed: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("`{}` is not a number: {e}", s.trim()))?;
    let inside = v >= 0.0 && if closed { v <= 1.0 } else { v < 1.0 };
    if inside {
        Ok(v)
    } else {
        let range = if closed { "[0, 1]" } else { "[0, 1)" };
        Err(format!("must be in {range}, got {}", s.trim()))
    }
}

/// `--betas B1,B2`: two values in [0, 1).
fn betas_value(s: &str) -> Result<(f64, f64), String> {
    let parts: Vec<&str> = s.split(',').collect();
    let [b1, b2] = parts[..] else {
        return Err(format!(
            "expected two values B1,B2 (e.g. 0.9,0.999), got `{}`",
            s.trim()
        ));
    };
    let one = |which: &str, v: &str| unit_f64(v, false).map_err(|e| format!("{which} {e}"));
    Ok((one("beta1", b1)?, one("beta2", b2)?))
}

/// `--alpha`: a value in [0, 1].
fn alpha_value(s: &str) -> Result<f64, String> {
    unit_f64(s, true)
}

/// The settings of the run's optimizer, each from its flag or from the `--load` checkpoint's
/// notes (`None`: neither, the optimizer's default).
#[derive(Debug, Clone, Copy)]
struct Resolved {
    momentum: Option<f32>,
    weight_decay: Option<f32>,
    betas: Option<(f64, f64)>,
    eps: Option<f32>,
    amsgrad: Option<bool>,
    nesterov: Option<bool>,
    alpha: Option<f64>,
    centered: Option<bool>,
    lr_decay: Option<f32>,
}

/// The note keys of the settings, each with what a checkpoint's note must parse as.
const NOTES: [(&str, NoteKind); 10] = [
    ("momentum", NoteKind::Number),
    ("weight_decay", NoteKind::Number),
    ("beta1", NoteKind::Number),
    ("beta2", NoteKind::Number),
    ("eps", NoteKind::Number),
    ("amsgrad", NoteKind::Bool),
    ("nesterov", NoteKind::Bool),
    ("alpha", NoteKind::Number),
    ("centered", NoteKind::Bool),
    ("lr_decay", NoteKind::Number),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoteKind {
    Number,
    Bool,
}

impl CommonArgs {
    /// Refuses a `--load` checkpoint whose optimizer notes do not parse (a number that is
    /// not one, a flag that is not `true` or `false`).
    pub(super) fn check_optimizer_notes(&self) -> Result<(), CliError> {
        for (key, kind) in NOTES {
            let Some(v) = self.saved(&torchlean::nn::note_key(key)) else {
                continue;
            };
            let ok = match kind {
                NoteKind::Number => v.parse::<f64>().is_ok(),
                NoteKind::Bool => v.parse::<bool>().is_ok(),
            };
            if !ok {
                return Err(CliError::usage(format!(
                    "--load {}: its `{}` is `{}`, not {}",
                    self.load_display(),
                    torchlean::nn::note_key(key),
                    torchlean::nn::shown_metadata(&v),
                    if kind == NoteKind::Bool {
                        "true or false"
                    } else {
                        "a number"
                    }
                )));
            }
        }
        Ok(())
    }

    /// Each setting from its flag, else from the checkpoint (announced when `announce`).
    fn resolved(&self, announce: bool) -> Resolved {
        let f = &self.optim;
        let b1 = self.flag_or_saved(f.betas.map(|b| b.0), "beta1", "--betas", announce);
        let b2 = self.flag_or_saved(f.betas.map(|b| b.1), "beta2", "--betas", announce);
        Resolved {
            momentum: self.flag_or_saved(f.momentum, "momentum", "--momentum", announce),
            weight_decay: self.flag_or_saved(
                f.weight_decay,
                "weight_decay",
                "--weight-decay",
                announce,
            ),
            betas: b1.zip(b2),
            eps: self.flag_or_saved(f.eps, "eps", "--eps", announce),
            amsgrad: self.flag_or_saved(f.amsgrad, "amsgrad", "--amsgrad", announce),
            nesterov: self.flag_or_saved(f.nesterov, "nesterov", "--nesterov", announce),
            alpha: self.flag_or_saved(f.alpha, "alpha", "--alpha", announce),
            centered: self.flag_or_saved(f.centered, "centered", "--centered", announce),
            lr_decay: self.flag_or_saved(f.lr_decay, "lr_decay", "--lr-decay", announce),
        }
    }

    /// The notes a checkpoint of this run records: every setting given or resumed.
    pub(super) fn optimizer_notes(&self) -> Vec<(String, String)> {
        let r = self.resolved(false);
        let mut notes = vec![];
        let mut note = |key: &str, v: Option<String>| {
            if let Some(v) = v {
                notes.push((key.to_string(), v));
            }
        };
        note("momentum", r.momentum.map(|v| v.to_string()));
        note("weight_decay", r.weight_decay.map(|v| v.to_string()));
        note("beta1", r.betas.map(|b| b.0.to_string()));
        note("beta2", r.betas.map(|b| b.1.to_string()));
        note("eps", r.eps.map(|v| v.to_string()));
        note("amsgrad", r.amsgrad.map(|v| v.to_string()));
        note("nesterov", r.nesterov.map(|v| v.to_string()));
        note("alpha", r.alpha.map(|v| v.to_string()));
        note("centered", r.centered.map(|v| v.to_string()));
        note("lr_decay", r.lr_decay.map(|v| v.to_string()));
        notes
    }

    /// A resume that would add or remove buffers of the checkpoint's optimizer state: the
    /// flag `flag` set to `new` where the checkpoint's run had `saved` (both "on" when
    /// `on` says so).
    fn refuse_state_change(
        &self,
        choice: OptimizerChoice,
        flag: &str,
        (saved, new): (String, String),
        (saved_on, new_on): (bool, bool),
        buffers: &str,
    ) -> Result<(), CliError> {
        if saved_on == new_on {
            return Ok(());
        }
        let setting = flag.trim_start_matches('-');
        Err(CliError::usage(format!(
            "{flag} {new}: the checkpoint {} was trained by {} with {setting} {saved}, and its \
             optimizer state {} {buffers}; a resume cannot turn {setting} {} (leave {flag} out \
             to keep {saved}, or start a new run)",
            self.load_display(),
            choice.kind(),
            if saved_on { "holds" } else { "has no" },
            if new_on { "on" } else { "off" },
        )))
    }

    /// The optimizer of the run: `--optimizer` (else the `--load` checkpoint's kind, else
    /// `default`) with the learning rate `lr` and the settings' flags (else the checkpoint's
    /// notes, else torch.optim's defaults), checked before any kernel runs; a flag the
    /// optimizer has no use for is refused rather than ignored.
    pub fn optimizer(
        &self,
        default: OptimizerChoice,
        lr: f32,
    ) -> Result<Box<dyn torchlean::nn::Optimizer>, CliError> {
        use torchlean::nn::{Adagrad, Adam, AdamW, Optimizer, RmsProp, Sgd};
        use OptimizerChoice as O;
        let saved = self.saved_choice();
        // a checkpoint's optimizer state (and its notes) belong to the optimizer that saved
        // it: another one named by --optimizer cannot resume from it (the message blamed
        // --momentum, which the user had not given)
        if let (Some(asked), Some(had), Some(path)) = (self.optim.optimizer, saved, &self.load) {
            if asked != had {
                return Err(CliError::usage(format!(
                    "--optimizer {}: the checkpoint {} holds the state of optimizer {} (its moments and settings belong to it); resume with --optimizer {} or without --optimizer",
                    asked.kind(),
                    path.display(),
                    had.kind(),
                    had.kind()
                )));
            }
        }
        let choice = self.optim.optimizer.or(saved).unwrap_or(default);
        let r = self.resolved(true);
        // a flag the optimizer has no use for (the checkpoint's notes are its optimizer's)
        let uses: [(bool, &str, &[O]); 8] = [
            (r.momentum.is_some(), "--momentum", &[O::Sgd, O::Rmsprop]),
            (r.betas.is_some(), "--betas", &[O::Adam, O::Adamw]),
            (
                r.eps.is_some(),
                "--eps",
                &[O::Adam, O::Adamw, O::Rmsprop, O::Adagrad],
            ),
            (r.amsgrad.is_some(), "--amsgrad", &[O::Adam, O::Adamw]),
            (r.nesterov.is_some(), "--nesterov", &[O::Sgd]),
            (r.alpha.is_some(), "--alpha", &[O::Rmsprop]),
            (r.centered.is_some(), "--centered", &[O::Rmsprop]),
            (r.lr_decay.is_some(), "--lr-decay", &[O::Adagrad]),
        ];
        for (set, flag, applies) in uses {
            if set && !applies.contains(&choice) {
                let names: Vec<&str> = applies.iter().map(|o| o.kind()).collect();
                let names = match names.split_last() {
                    Some((last, rest)) if !rest.is_empty() => {
                        format!("{} and {last}", rest.join(", "))
                    }
                    _ => names.join(""),
                };
                return Err(CliError::usage(format!(
                    "{flag} applies to {names}; the optimizer is {}",
                    choice.kind()
                )));
            }
        }
        self.refuse_resumed_state_changes(choice)?;
        let momentum = r.momentum.unwrap_or(0.0);
        if r.nesterov == Some(true) && momentum == 0.0 {
            return Err(CliError::usage(
                "--nesterov needs --momentum > 0 (Nesterov momentum is a kind of momentum)",
            ));
        }
        let err =
            |e: torchlean::Error| CliError::usage(format!("--optimizer {}: {e}", choice.kind()));
        let wd = r.weight_decay;
        for (flag, v) in [
            ("--weight-decay", wd),
            ("--eps", r.eps),
            ("--lr-decay", r.lr_decay),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(CliError::usage(format!(
                    "{flag} must be finite and >= 0, got {v}"
                )));
            }
        }
        if !(momentum.is_finite() && (0.0..=1.0).contains(&momentum)) {
            return Err(CliError::usage(format!(
                "--momentum must be in [0, 1], got {momentum}"
            )));
        }
        let optimizer: Box<dyn Optimizer> = match choice {
            O::Adam | O::Adamw => {
                let (b1, b2) = r.betas.unwrap_or((0.9, 0.999));
                let eps = r.eps.unwrap_or(1e-8);
                let amsgrad = r.amsgrad.unwrap_or(false);
                if choice == O::Adam {
                    let mut o = Adam::new(lr).map_err(err)?;
                    (o.beta1, o.beta2, o.eps, o.amsgrad) = (b1, b2, eps, amsgrad);
                    o.weight_decay = wd.unwrap_or(0.0);
                    Box::new(o)
                } else {
                    let mut o = AdamW::with_weight_decay(lr, wd.unwrap_or(0.01)).map_err(err)?;
                    (o.beta1, o.beta2, o.eps, o.amsgrad) = (b1, b2, eps, amsgrad);
                    Box::new(o)
                }
            }
            O::Sgd => Box::new(
                Sgd::new(lr, momentum, wd.unwrap_or(0.0))
                    .and_then(|o| o.with_nesterov(r.nesterov.unwrap_or(false)))
                    .map_err(err)?,
            ),
            O::Rmsprop => {
                let mut o = RmsProp::new(lr).map_err(err)?;
                o.momentum = momentum;
                o.weight_decay = wd.unwrap_or(0.0);
                o.alpha = r.alpha.unwrap_or(o.alpha);
                o.eps = r.eps.unwrap_or(o.eps);
                o.centered = r.centered.unwrap_or(false);
                Box::new(o)
            }
            O::Adagrad => {
                let mut o = Adagrad::new(lr).map_err(err)?;
                o.weight_decay = wd.unwrap_or(0.0);
                o.lr_decay = r.lr_decay.unwrap_or(0.0);
                o.eps = r.eps.unwrap_or(o.eps);
                Box::new(o)
            }
        };
        optimizer.validate().map_err(err)?;
        Ok(optimizer)
    }

    /// The `--load` checkpoint's optimizer (`None` without one).
    fn saved_choice(&self) -> Option<OptimizerChoice> {
        OptimizerChoice::from_kind(&self.saved(torchlean::nn::KEY_OPTIM)?)
    }

    /// A resume whose flags would add or remove buffers of the checkpoint's optimizer state
    /// (momentum, amsgrad, centered) is refused naming the flag. Only SGD's momentum buffer
    /// is created on the next step, as PyTorch's is, so SGD may turn momentum on; the other
    /// changes failed on the state's slots, a message about buffers the user never named
    /// (the CLI audit).
    fn refuse_resumed_state_changes(&self, choice: OptimizerChoice) -> Result<(), CliError> {
        if self.load.is_none() {
            return Ok(());
        }
        let f = &self.optim;
        if let Some(new) = f.momentum {
            let old = self.saved_value::<f32>("momentum").unwrap_or(0.0);
            let sgd_starts = choice == OptimizerChoice::Sgd && old == 0.0;
            if !sgd_starts {
                self.refuse_state_change(
                    choice,
                    "--momentum",
                    (old.to_string(), new.to_string()),
                    (old != 0.0, new != 0.0),
                    "momentum buffers",
                )?;
            }
        }
        let switches = [
            (
                "--amsgrad",
                f.amsgrad,
                self.saved_value::<bool>("amsgrad"),
                "the running maximum of the second moment (max_exp_avg_sq)",
            ),
            (
                "--centered",
                f.centered,
                self.saved_value::<bool>("centered"),
                "the gradient averages (grad_avg)",
            ),
        ];
        for (flag, given, saved, buffers) in switches {
            if let Some(new) = given {
                let old = saved.unwrap_or(false);
                self.refuse_state_change(
                    choice,
                    flag,
                    (old.to_string(), new.to_string()),
                    (old, new),
                    buffers,
                )?;
            }
        }
        Ok(())
    }
}
