//! A deterministic, structure-aware fuzzer for every untrusted file format the runtime reads
//! (issue 13): graph JSON, safetensors (parameters and inputs), checkpoints, NPY, IDX and CSV.
//!
//! Each [`Format`] starts from valid seed files the library writes itself (a captured graph,
//! `encode_safetensors`, `save_checkpoint`, `save_npy`, `write_idx`, CSV text), mutates them
//! with mutations that know the format's structure (JSON values and keys, safetensors headers
//! and offsets, NPY header dicts, IDX dims and type codes, CSV fields and delimiters) plus
//! plain byte-level mutations and random bytes, and runs every input through the library's
//! entry point in-process ([`Format::execute`]). The contract checked (docs/reliability.md):
//! every input ends in success or a typed error within a time bound — never a panic, an
//! abort or a hang — and an accepted input satisfies the format's invariants (round trips,
//! element counts that match shapes, finite values where the loader promises them), which is
//! how a silently wrapped size would show.
//!
//! Input `i` of a campaign with seed `s` depends only on `(s, i)`, so a finding is reproduced
//! by its bytes alone ([`Format::execute`]) or by rerunning the same `(s, i)`.
//!
//! The `torchlean fuzz` subcommand drives long campaigns (and fuzzes the CLI's flags by
//! spawning the binary); `tests/fuzz.rs` runs a short campaign of every format.

mod mutate;
mod targets;

pub use mutate::{interesting_u64, mutate_bytes, random_bytes, Rng};
pub use targets::{sample_graph, sample_op};

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An untrusted input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// `torchlean.ir.v1` graph JSON (`Graph::from_json`; small accepted graphs are compiled
    /// and run, half of them with backward derivation).
    Graph,
    /// Safetensors files of parameters and inputs (`tensor::io::parse_safetensors`).
    Safetensors,
    /// Checkpoints (`nn::parse_checkpoint`, then `nn::apply_checkpoint` to a small MLP and an
    /// optimizer chosen by the input's hash).
    Checkpoint,
    /// NumPy `.npy` (`data::parse_npy`).
    Npy,
    /// IDX / MNIST (`data::parse_idx`).
    Idx,
    /// Numeric CSV (`data::parse_csv` with options chosen by the input's hash).
    Csv,
}

impl Format {
    /// Every file format.
    pub const ALL: &'static [Format] = &[
        Format::Graph,
        Format::Safetensors,
        Format::Checkpoint,
        Format::Npy,
        Format::Idx,
        Format::Csv,
    ];

    /// The stable name (`graph`, `safetensors`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Format::Graph => "graph",
            Format::Safetensors => "safetensors",
            Format::Checkpoint => "checkpoint",
            Format::Npy => "npy",
            Format::Idx => "idx",
            Format::Csv => "csv",
        }
    }

    /// The format named `name`.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// Valid seed files of this format, written by the library itself.
    pub fn seeds(self) -> crate::Result<Vec<Vec<u8>>> {
        targets::seeds(self)
    }

    /// A mutation of `seeds` (structure-aware most of the time, byte-level or random bytes
    /// otherwise), drawn from `rng`.
    pub fn mutate(self, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
        targets::mutate(self, seeds, rng)
    }

    /// Runs `input` through the library's entry point for this format. `Err` carries the
    /// typed error (an ordinary outcome); a violated invariant of an accepted
    /// input is `Ok(Executed::Invariant(..))`. Panics propagate (the campaign catches them).
    pub fn execute(self, input: &[u8]) -> Result<Executed, Refusal> {
        targets::execute(self, input)
    }
}

/// An untrusted input format the campaign driver can fuzz. [`Format`] covers the formats
/// this crate reads; a crate that reads another format (the ONNX importer) implements this
/// trait and runs the same driver, so its campaigns have the same contract and report.
pub trait Target: Send + Sync + std::fmt::Debug {
    /// The stable name (used in reports and findings' file names).
    fn name(&self) -> &'static str;
    /// Valid seed files, written by the library itself.
    fn seeds(&self) -> crate::Result<Vec<Vec<u8>>>;
    /// A mutation of `seeds` drawn from `rng`.
    fn mutate(&self, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8>;
    /// Runs `input` through the entry point (see [`Format::execute`] for the contract).
    fn execute(&self, input: &[u8]) -> Result<Executed, Refusal>;
}

impl Target for Format {
    fn name(&self) -> &'static str {
        Format::name(*self)
    }
    fn seeds(&self) -> crate::Result<Vec<Vec<u8>>> {
        Format::seeds(*self)
    }
    fn mutate(&self, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
        Format::mutate(*self, seeds, rng)
    }
    fn execute(&self, input: &[u8]) -> Result<Executed, Refusal> {
        Format::execute(*self, input)
    }
}

/// A typed error an input was refused with.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// [`error_class`] of the error.
    pub class: String,
    /// The error's message.
    pub message: String,
}

impl Refusal {
    /// The refusal carrying error `e`.
    pub fn of<E: std::fmt::Debug + std::fmt::Display>(e: E) -> Refusal {
        Refusal {
            class: error_class(&format!("{e:?}")),
            message: e.to_string(),
        }
    }
}

/// What an input that was not refused did.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    /// Accepted (and, for graphs, compiled and run).
    Accepted,
    /// Accepted, but not run: a graph whose declared sizes or pooling windows exceed the
    /// fuzzer's run budget (it was still parsed, validated and round-tripped).
    AcceptedNotRun,
    /// Accepted, but the result breaks an invariant (a finding).
    Invariant(String),
}

/// The outcome class of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Accepted (graphs: compiled and run).
    Accepted,
    /// Accepted, too large to run under the fuzzer's budget.
    AcceptedNotRun,
    /// Refused with a typed error.
    Refused,
    /// Panicked (a finding).
    Panic,
    /// Took longer than the time bound (a finding).
    Slow,
    /// Accepted with a broken invariant (a finding).
    Invariant,
}

impl Outcome {
    /// Whether this outcome is a bug.
    pub fn is_finding(self) -> bool {
        matches!(self, Outcome::Panic | Outcome::Slow | Outcome::Invariant)
    }

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::AcceptedNotRun => "accepted_not_run",
            Outcome::Refused => "refused",
            Outcome::Panic => "panic",
            Outcome::Slow => "slow",
            Outcome::Invariant => "invariant",
        }
    }
}

/// One finding: the input that caused it and what happened.
#[derive(Debug, Clone)]
pub struct Finding {
    pub iteration: u64,
    pub outcome: Outcome,
    pub message: String,
    pub seconds: f64,
    /// Where the input was saved (when the campaign has a findings directory).
    pub saved: Option<PathBuf>,
}

/// How to run a campaign.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// What is fuzzed (a [`Format`] or another crate's [`Target`]).
    pub format: Arc<dyn Target>,
    /// Number of mutated inputs (the seeds themselves are run first, in addition).
    pub iterations: u64,
    pub seed: u64,
    /// An input slower than this is a [`Outcome::Slow`] finding.
    pub time_bound: Duration,
    /// A watchdog ends the process (exit code 70) when one input runs longer than this,
    /// after saving it: a real hang cannot be interrupted in-process. `None`: no watchdog.
    pub hard_timeout: Option<Duration>,
    /// Where findings are saved (`<format>-<seed>-<iteration>-<outcome>.bin` and `.txt`).
    pub findings_dir: Option<PathBuf>,
    /// Called every this many inputs with the report so far (0: never).
    pub progress_every: u64,
}

impl Campaign {
    /// A campaign of `iterations` inputs of `format` from `seed`: time bound 1 s, no
    /// watchdog, no findings directory.
    pub fn new(format: impl Target + 'static, iterations: u64, seed: u64) -> Campaign {
        Campaign {
            format: Arc::new(format),
            iterations,
            seed,
            time_bound: Duration::from_secs(1),
            hard_timeout: None,
            findings_dir: None,
            progress_every: 0,
        }
    }
}

/// The result of a campaign.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The name of the fuzzed format.
    pub format: Option<&'static str>,
    /// Inputs run (seeds included).
    pub inputs: u64,
    pub outcomes: BTreeMap<Outcome, u64>,
    /// Refusals by [`error_class`].
    pub refusals: BTreeMap<String, u64>,
    /// Every finding (inputs saved for the first 100).
    pub findings: Vec<Finding>,
    pub seconds: f64,
    /// The slowest input's time and iteration.
    pub slowest: (f64, u64),
    /// Total bytes of the inputs run.
    pub bytes: u64,
}

impl Report {
    pub fn count(&self, o: Outcome) -> u64 {
        self.outcomes.get(&o).copied().unwrap_or(0)
    }

    /// Number of findings.
    pub fn finding_count(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|(o, _)| o.is_finding())
            .map(|(_, n)| n)
            .sum()
    }

    /// A few lines for a terminal.
    pub fn to_text(&self) -> String {
        let name = self.format.unwrap_or("?");
        // the seeds run as iterations u64::MAX - k (`run`): named as seed k
        let slowest = match u64::MAX - self.slowest.1 {
            k if k < 1 << 20 => format!("seed {k}"),
            _ => format!("input {}", self.slowest.1),
        };
        let mut s = format!(
            "{name}: {} inputs in {:.1} s ({:.0}/s, {:.1} MB), slowest {:.3} s ({slowest})\n",
            self.inputs,
            self.seconds,
            self.inputs as f64 / self.seconds.max(1e-9),
            self.bytes as f64 / 1e6,
            self.slowest.0,
        );
        let counts: Vec<String> = [
            Outcome::Accepted,
            Outcome::AcceptedNotRun,
            Outcome::Refused,
            Outcome::Panic,
            Outcome::Slow,
            Outcome::Invariant,
        ]
        .iter()
        .map(|o| format!("{} {}", o.name(), self.count(*o)))
        .collect();
        s.push_str(&format!("  outcomes: {}\n", counts.join(", ")));
        let mut classes: Vec<(&String, &u64)> = self.refusals.iter().collect();
        classes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        s.push_str(&format!("  refusal classes: {}\n", classes.len()));
        for (c, n) in classes.iter().take(12) {
            s.push_str(&format!("    {n:>9}  {c}\n"));
        }
        for f in self.findings.iter().take(20) {
            s.push_str(&format!(
                "  FINDING input {} {} ({:.3} s): {}{}\n",
                f.iteration,
                f.outcome.name(),
                f.seconds,
                f.message.lines().next().unwrap_or(""),
                f.saved
                    .as_ref()
                    .map(|p| format!(" [saved {}]", p.display()))
                    .unwrap_or_default()
            ));
        }
        s
    }
}

/// The class of a refusal for the histogram, from the error's `Debug` form: the chain of
/// variant and struct names outside string literals (`InFile/ShapeMismatch`), then the first
/// words of the last string literal with digits blanked (for errors whose detail is a
/// message, such as `Data/Malformed`).
pub fn error_class(debug: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    let mut last_string = String::new();
    let mut chars = debug.chars().peekable();
    let mut word = String::new();
    while let Some(c) = chars.next() {
        if c == '"' {
            let mut lit = String::new();
            while let Some(d) = chars.next() {
                match d {
                    '\\' => {
                        chars.next();
                    }
                    '"' => break,
                    d => lit.push(d),
                }
            }
            last_string = lit;
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if word.starts_with(|w: char| w.is_ascii_uppercase()) && !names.contains(&word) {
            names.push(std::mem::take(&mut word));
        }
        word.clear();
    }
    let detail: Vec<String> = last_string
        .split_whitespace()
        .take(8)
        .map(|w| {
            w.chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .take(24)
                .collect()
        })
        .collect();
    let mut class = names.join("/");
    if !detail.is_empty() {
        class.push_str(": ");
        class.push_str(&detail.join(" "));
    }
    class
}

thread_local! {
    /// The message of the last panic on this thread (set by the campaign's hook).
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// Whether this thread is running a target (its panics are recorded, not printed).
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs one input, catching panics; returns the outcome, a message (a refusal's class) and
/// the seconds taken.
fn run_one(format: &dyn Target, input: &[u8]) -> (Outcome, String, f64) {
    let start = Instant::now();
    IN_TARGET.with(|t| t.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| format.execute(input)));
    IN_TARGET.with(|t| t.set(false));
    let secs = start.elapsed().as_secs_f64();
    match r {
        Ok(Ok(Executed::Accepted)) => (Outcome::Accepted, String::new(), secs),
        Ok(Ok(Executed::AcceptedNotRun)) => (Outcome::AcceptedNotRun, String::new(), secs),
        Ok(Ok(Executed::Invariant(m))) => (Outcome::Invariant, m, secs),
        Ok(Err(r)) => (Outcome::Refused, r.class, secs),
        Err(payload) => {
            let msg = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            (Outcome::Panic, msg, secs)
        }
    }
}

/// The watchdog's view of the input in progress.
struct Current {
    started_ms: AtomicU64,
    iteration: AtomicU64,
    input: Mutex<Vec<u8>>,
    done: AtomicBool,
}

fn save(
    dir: &Path,
    format: &'static str,
    seed: u64,
    iteration: u64,
    o: Outcome,
    input: &[u8],
    msg: &str,
) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).ok()?;
    let stem = format!("{format}-{seed}-{iteration}-{}", o.name());
    let bin = dir.join(format!("{stem}.bin"));
    std::fs::write(&bin, input).ok()?;
    std::fs::write(dir.join(format!("{stem}.txt")), msg).ok()?;
    Some(bin)
}

/// Runs a campaign: the seeds (iterations `u64::MAX - k`, which must all be accepted; a
/// refused seed is reported as an invariant finding), then `iterations` mutated inputs.
/// Installs a panic hook that records panics instead of printing them for the duration,
/// and an eager session on this thread (restoring both afterwards).
pub fn run_campaign(c: &Campaign, mut progress: impl FnMut(&Report)) -> crate::Result<Report> {
    let seeds = c.format.seeds()?;
    let previous_session = crate::runtime::install(crate::runtime::Session::new(
        crate::backend::BackendProfile::default_cpu(),
    ))?;
    type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;
    let previous: Arc<Hook> = Arc::new(std::panic::take_hook());
    let outer = Arc::clone(&previous);
    std::panic::set_hook(Box::new(move |info| {
        if IN_TARGET.with(|t| t.get()) {
            let msg = format!("{info}");
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(msg));
        } else {
            outer(info)
        }
    }));
    let epoch = Instant::now();
    let current = Arc::new(Current {
        started_ms: AtomicU64::new(u64::MAX),
        iteration: AtomicU64::new(0),
        input: Mutex::new(Vec::new()),
        done: AtomicBool::new(false),
    });
    let watchdog = c.hard_timeout.map(|limit| {
        let current = Arc::clone(&current);
        let (format, seed, dir) = (c.format.name(), c.seed, c.findings_dir.clone());
        std::thread::spawn(move || {
            while !current.done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let started = current.started_ms.load(Ordering::Relaxed);
                let now = epoch.elapsed().as_millis() as u64;
                if started != u64::MAX && now.saturating_sub(started) > limit.as_millis() as u64 {
                    let it = current.iteration.load(Ordering::Relaxed);
                    let input = current.input.lock().map(|g| g.clone()).unwrap_or_default();
                    let saved = dir.as_ref().and_then(|d| {
                        save(
                            d,
                            format,
                            seed,
                            it,
                            Outcome::Slow,
                            &input,
                            "hang: killed by the watchdog",
                        )
                    });
                    eprintln!(
                        "fuzz {}: HANG: input {it} has run for more than {:?}; saved to {:?}",
                        format, limit, saved
                    );
                    std::process::exit(70);
                }
            }
        })
    });
    let mut report = Report {
        format: Some(c.format.name()),
        ..Report::default()
    };
    let record = |report: &mut Report, iteration: u64, input: &[u8], is_seed: bool| {
        if c.hard_timeout.is_some() {
            if let Ok(mut g) = current.input.lock() {
                g.clear();
                g.extend_from_slice(input);
            }
            current.iteration.store(iteration, Ordering::Relaxed);
            current
                .started_ms
                .store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        let (mut outcome, mut msg, secs) = run_one(c.format.as_ref(), input);
        current.started_ms.store(u64::MAX, Ordering::Relaxed);
        if is_seed && outcome == Outcome::Refused {
            outcome = Outcome::Invariant;
            msg = format!("a seed file was refused: {msg}");
        }
        if outcome == Outcome::Refused {
            *report.refusals.entry(msg.clone()).or_default() += 1;
        }
        if !outcome.is_finding() && secs > c.time_bound.as_secs_f64() && !is_seed {
            msg = format!("took {secs:.3} s (bound {:?})", c.time_bound);
            outcome = Outcome::Slow;
        }
        *report.outcomes.entry(outcome).or_default() += 1;
        report.inputs += 1;
        report.bytes += input.len() as u64;
        if secs > report.slowest.0 {
            report.slowest = (secs, iteration);
        }
        if outcome.is_finding() {
            let saved = if report.findings.len() < 100 {
                c.findings_dir
                    .as_ref()
                    .and_then(|d| save(d, c.format.name(), c.seed, iteration, outcome, input, &msg))
            } else {
                None
            };
            report.findings.push(Finding {
                iteration,
                outcome,
                message: msg,
                seconds: secs,
                saved,
            });
        }
    };
    for (k, s) in seeds.iter().enumerate() {
        record(&mut report, u64::MAX - k as u64, s, true);
    }
    for i in 0..c.iterations {
        let mut rng = Rng::for_input(c.seed, i);
        let input = c.format.mutate(&seeds, &mut rng);
        record(&mut report, i, &input, false);
        if c.progress_every > 0 && (i + 1) % c.progress_every == 0 {
            report.seconds = epoch.elapsed().as_secs_f64();
            progress(&report);
        }
    }
    report.seconds = epoch.elapsed().as_secs_f64();
    current.done.store(true, Ordering::Relaxed);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    drop(std::panic::take_hook());
    if let Ok(hook) = Arc::try_unwrap(previous) {
        std::panic::set_hook(hook);
    }
    match previous_session {
        Some(s) => {
            crate::runtime::install(s)?;
        }
        None => {
            crate::runtime::take()?;
        }
    }
    Ok(report)
}

/// The input `iteration` of a campaign of `format` with `seed` (to reproduce a finding).
pub fn input_of(format: &dyn Target, seed: u64, iteration: u64) -> crate::Result<Vec<u8>> {
    let seeds = format.seeds()?;
    Ok(format.mutate(&seeds, &mut Rng::for_input(seed, iteration)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_classes_are_variant_paths() {
        assert_eq!(
            error_class(
                r#"InFile { path: "x", source: ShapeMismatch { node: 3, reason: "the inferred shape is [2]" } }"#
            ),
            "InFile/ShapeMismatch: the inferred shape is [#]"
        );
        assert_eq!(error_class(r#"Other("x")"#), "Other: x");
    }
}
