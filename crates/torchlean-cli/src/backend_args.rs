//! The backend flags shared by every command that runs a model.

use crate::{CliError, CliResult};
use clap::Args;
use torchlean::backend::{BackendProfile, BackendReport, ExecutionMode};
use torchlean::runtime::Session;

/// The execution mode flag, flattened only into the commands that honour it (a command that
/// cannot run both modes does not accept `--backend` at all: clap refuses it, exit 2; except
/// `run-graph`, which names its one mode: `--backend compiled` is accepted and `eager`
/// refused with the reason).
#[derive(Args, Debug, Clone, Default)]
pub struct ModeArgs {
    /// Execution mode: eager (tape) or compiled (capture once, plan and gate once, replay).
    /// Default: eager.
    #[arg(long = "backend", value_enum)]
    pub backend: Option<ModeChoice>,
}

/// The values of `--backend`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChoice {
    Eager,
    Compiled,
}

impl ModeArgs {
    /// The chosen mode (eager when unset).
    pub fn mode(&self) -> ExecutionMode {
        match self.backend {
            None | Some(ModeChoice::Eager) => ExecutionMode::Eager,
            Some(ModeChoice::Compiled) => ExecutionMode::Compiled,
        }
    }
}

/// The profile and report flags shared by every command that plans or runs kernels.
#[derive(Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// Named backend profile (strict_cpu, checked_cpu, strict_native_cpu, checked_cuda,
    /// checked_cuda_tf32, strict_native_cuda, libtorch_*, future_*: docs/trust-model.md and
    /// README).
    #[arg(long)]
    pub profile: Option<String>,
    /// Device: cpu, cuda (alias gpu), rocm, metal, wasm, tpu, trainium, custom, external.
    #[arg(long)]
    pub device: Option<String>,
    /// Provider preference: auto, prefer:P or only:P (a bare P means only:P).
    #[arg(long)]
    pub provider: Option<String>,
    /// Trust policy: strict, checked-runtime or allow-trusted-runtime.
    #[arg(long)]
    pub policy: Option<String>,
    /// Allow (and prefer) capsules whose products use TF32 (cuBLAS's tensor-core mode: a
    /// looser declared error bound, shown in the report). Off by default.
    #[arg(long)]
    pub tf32: bool,
    /// Allow (and prefer) capsules whose results are not bit-reproducible run to run
    /// (native_cuda.flash_attention_atomic: its VJP adds dQ with atomics, faster than the
    /// default deterministic one). Off by default (then every planned kernel is deterministic),
    /// except under the libtorch_*_cuda profiles, which opt in.
    #[arg(long)]
    pub allow_nondeterministic: bool,
    /// Print the backend report (plan, evidence, verdict): the training examples print the
    /// report of what ran after their first step (and the executor at the end), `plan` and
    /// the other commands the plan before any kernel runs.
    #[arg(long)]
    pub show_backend: bool,
    /// Write the JSON report to this path: what actually ran (for `plan`, which runs nothing,
    /// the plan).
    #[arg(long)]
    pub report_json: Option<String>,
}

/// A profile that names provider `libtorch` (prefer:libtorch, only:libtorch — the two
/// libtorch profiles) needs the LibTorch bridge, which this binary links only when built
/// with `--features libtorch`: without it, a usage error (exit 2) before anything runs.
fn refuse_unlinked_libtorch(p: &BackendProfile) -> Result<(), CliError> {
    use torchlean::backend::{Provider, ProviderPreference};
    let names_libtorch = matches!(
        p.preference,
        ProviderPreference::Prefer(Provider::Libtorch)
            | ProviderPreference::Only(Provider::Libtorch)
    );
    if names_libtorch && !cfg!(feature = "libtorch") {
        return Err(CliError::usage(format!(
            "profile `{}` asks for provider `libtorch`, but the LibTorch bridge is not linked into this build of torchlean: rebuild with `cargo build --release -p torchlean-cli --features libtorch` against PyTorch 2.11 (docs/libtorch.md)",
            p.name
        )));
    }
    Ok(())
}

/// An opt-in flag's capsules exist on `cuda` only and carry no replay checker: on another
/// device, or under a strict policy, nothing could honour the flag, so it is refused (never
/// silently ignored). `what` says what the flag selects ("… exist"), `strict_why` why strict
/// never plans it.
fn cuda_opt_in(p: &BackendProfile, what: &str, strict_why: &str) -> Result<(), CliError> {
    if p.device != torchlean::backend::Device::Cuda {
        return Err(CliError::usage(format!(
            "{what} on device `cuda` only (this profile runs on `{}`)",
            p.device.label()
        )));
    }
    if p.policy.name.starts_with("strict") {
        let flag = what.split_whitespace().next().unwrap_or_default();
        return Err(CliError::usage(format!(
            "{flag} has no effect under policy `{}`: {strict_why}",
            p.policy.name
        )));
    }
    Ok(())
}

impl BackendArgs {
    pub fn profile(&self) -> Result<BackendProfile, CliError> {
        let p = BackendProfile::resolve(
            self.profile.as_deref(),
            self.device.as_deref(),
            self.provider.as_deref(),
            self.policy.as_deref(),
        )
        .map_err(CliError::usage)?;
        refuse_unlinked_libtorch(&p)?;
        let mut p = p;
        if self.allow_nondeterministic {
            cuda_opt_in(
                &p,
                "--allow-nondeterministic admits kernels that add with atomics, which exist",
                "no nondeterministic capsule has a replay checker, so strict never plans one; use the checked-runtime policy (e.g. --profile checked_cuda)",
            )?;
            p = p.with_nondeterministic();
        }
        if self.tf32 {
            cuda_opt_in(
                &p,
                "--tf32 selects cuBLAS's TF32 tensor-core products, which exist",
                "no TF32 capsule has a replay checker (the checkers' f32 bound would reject TF32 results), so strict never plans one; use the checked-runtime policy (e.g. --profile checked_cuda_tf32)",
            )?;
            p = p.with_tf32();
        }
        Ok(p)
    }

    /// Installs an eager session for the profile on this thread: every tensor the command
    /// builds (models, data) is made under the profile the user chose.
    /// The device is probed first, so that a command on a device this machine lacks stops
    /// before it prints anything about the run (its header, its data) — not after.
    pub fn install_session(&self) -> CliResult {
        let profile = self.profile()?;
        torchlean::runtime::probe::probe_for(profile.device, profile.preference)?;
        torchlean::runtime::install(Session::new(profile))?;
        Ok(())
    }

    /// Installs an eager session for the profile and plans + gates every op `workload` runs
    /// before any kernel runs (exit 2 when planning fails, 3 when the gate rejects). The ops
    /// are found by running `workload` once in a shape-only trace (no kernel runs; values are
    /// placeholders), so `workload` should build what it needs and run one step. In compiled
    /// mode every differentiable op is planned recorded, as a graph capture runs them.
    /// Prints the report if asked.
    pub fn start_session(
        &self,
        mode: ExecutionMode,
        workload: impl FnOnce() -> torchlean::Result<()>,
    ) -> CliResult {
        self.start_training_session(mode, workload, Vec::new)
    }

    /// [`BackendArgs::start_session`] for a training loop: also plans and gates the op kinds
    /// `beside` lists — the optimizer's update (`Optimizer::update_ops`), asked with the
    /// session installed since its choice of ops may depend on the session's plan — before
    /// any kernel runs.
    pub fn start_training_session(
        &self,
        mode: ExecutionMode,
        workload: impl FnOnce() -> torchlean::Result<()>,
        beside: impl FnOnce() -> Vec<torchlean::graph::OpKind>,
    ) -> CliResult {
        let mut uses = torchlean::runtime::trace(workload)?;
        if mode == ExecutionMode::Compiled {
            uses = uses.all_recorded();
        }
        torchlean::runtime::install(Session::new(self.profile()?))?;
        uses.extend(&torchlean::runtime::OpUses::from_kinds(&beside(), false));
        let report = torchlean::runtime::with_current(|s| s.preplan(&uses))??;
        if self.show_backend {
            if mode == ExecutionMode::Compiled {
                // the session's header says `mode=eager`: say why before it
                outln!("plan before the first kernel, of the eager session (the setup, and what runs outside the compiled step, such as an optimizer's update); the compiled step's own report (mode=compiled) is printed once it has run:");
            }
            out!("{}", report.to_text());
        }
        Ok(())
    }

    /// Writes the report of what ran, if asked, for a command that read no file (`reads`
    /// of [`BackendArgs::write_report`]).
    pub fn finish_session(&self) -> CliResult {
        self.write_report(torchlean::runtime::with_current(|s| s.report())?, &[])
    }

    /// Refuses a `--report-json` path that is the same file as one of the command's inputs
    /// (`reads`: flag and path): writing the report would destroy it. Commands call it before
    /// they run; [`BackendArgs::write_report`] calls it again.
    pub fn check_report_path(&self, reads: &[(&str, &std::path::Path)]) -> CliResult {
        crate::check_outputs(reads, &self.report_output()).map_err(CliError::usage)
    }

    /// `--report-json` as a (flag, path) output (none when not given), for the output checks
    /// of `files::check_distinct_outputs`.
    pub fn report_output(&self) -> Vec<(&str, &std::path::Path)> {
        self.report_json
            .iter()
            .map(|p| ("--report-json", std::path::Path::new(p)))
            .collect()
    }

    /// Writes the report to `--report-json`, if given — never over one of the command's
    /// inputs (`reads`, see [`BackendArgs::check_report_path`]).
    pub fn write_report(
        &self,
        report: BackendReport,
        reads: &[(&str, &std::path::Path)],
    ) -> CliResult {
        self.check_report_path(reads)?;
        if let Some(path) = &self.report_json {
            write_report_json(path, &report)?;
        }
        Ok(())
    }
}

/// Writes `report` as JSON to `path` as every output file is written
/// (`torchlean::files::write_atomic`): a regular file replaced atomically, a device or pipe
/// written through, and a descriptor path (`/dev/stdout`, `/dev/fd/N`) written through that
/// descriptor — never reopened with truncation over what the shell redirected there.
pub fn write_report_json(path: &str, report: &BackendReport) -> CliResult {
    let text = serde_json::to_string_pretty(&report.to_json())
        .map_err(|e| CliError::runtime(e.to_string()))?;
    torchlean::files::write_atomic(std::path::Path::new(path), format!("{text}\n").as_bytes())
        .map_err(|e| CliError::runtime(format!("cannot write report to {path}: {e}")))
}
