//! `torchlean fuzz`: long fuzzing campaigns over every untrusted input (issue 13).
//!
//! File formats (`graph`, `safetensors`, `checkpoint`, `npy`, `idx`, `csv`, `onnx`, or
//! `files` for all seven in turn) run in-process through the library's fuzzer
//! (`torchlean::fuzz`; ONNX models through `torchlean_onnx::fuzz`'s target). The
//! `flags` format fuzzes the command line: it spawns this binary with mutated argument
//! vectors (extreme numbers, unknown values and flags, repeated and dropped flags, swapped
//! subcommands) in a scratch directory, under an address-space limit and a timeout, and
//! checks that every run ends with exit code 0, 1, 2 or 3 — never a panic (101), another
//! code, or a signal. A flags run spawns a process per input, so campaigns are far shorter.
//!
//! Exit code: 0 when nothing was found, 1 when there were findings (saved under
//! `--findings`), 2 for bad flags.

use crate::{CliError, CliResult};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchlean::fuzz::{run_campaign, Campaign, Executed, Format, Rng, Target};

#[derive(clap::Args)]
pub struct Args {
    /// graph, safetensors, checkpoint, npy, idx, csv, onnx, files (all seven in turn) or flags.
    #[arg(long)]
    format: String,
    /// Mutated inputs per format (the seed files run in addition).
    #[arg(long, default_value_t = 10_000)]
    iterations: u64,
    /// Campaign seed: input i of a campaign depends only on (seed, i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// An input that takes longer than this many seconds is a finding (file formats).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    time_bound: f64,
    /// End the process when one in-process input runs this many seconds (a hang; the input
    /// is saved first), or, for `flags`, kill a run after this many seconds.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    timeout: f64,
    /// Directory findings are saved to.
    #[arg(long, default_value = "fuzz-findings")]
    findings: PathBuf,
    /// Print progress every this many inputs (0: only the summary).
    #[arg(long, default_value_t = 0)]
    progress: u64,
    /// Run one saved input of `--format` and print its outcome instead of a campaign (the
    /// campaign's flags are refused beside it: they would be ignored).
    #[arg(
        long,
        conflicts_with_all = ["iterations", "seed", "time_bound", "timeout", "findings", "progress"]
    )]
    replay: Option<PathBuf>,
}

fn seconds(what: &str, v: f64) -> Result<Duration, CliError> {
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(CliError::usage(format!(
            "{what} must be a number of seconds in (0, 86400], got {v}"
        )))
    }
}

pub fn run(a: Args) -> CliResult {
    let time_bound = seconds("--time-bound", a.time_bound)?;
    let timeout = seconds("--timeout", a.timeout)?;
    if a.format == "flags" {
        if a.replay.is_some() {
            return Err(CliError::usage("--replay is for file formats"));
        }
        return flags(&a, timeout);
    }
    let all = || -> Vec<Arc<dyn Target>> {
        let mut v: Vec<Arc<dyn Target>> = Format::ALL
            .iter()
            .map(|f| Arc::new(*f) as Arc<dyn Target>)
            .collect();
        v.push(Arc::new(torchlean_onnx::fuzz::OnnxTarget));
        v
    };
    let formats: Vec<Arc<dyn Target>> = match a.format.as_str() {
        "files" => all(),
        f => vec![all().into_iter().find(|t| t.name() == f).ok_or_else(|| {
            CliError::usage(format!(
                "unknown format `{f}` (graph, safetensors, checkpoint, npy, idx, csv, onnx, files, flags)"
            ))
        })?],
    };
    if let Some(path) = &a.replay {
        let [format] = &formats[..] else {
            return Err(CliError::usage("--replay needs one format"));
        };
        let bytes = torchlean::files::read_capped(path, 1 << 30)
            .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
        torchlean::runtime::install(torchlean::runtime::Session::new(
            torchlean::backend::BackendProfile::default_cpu(),
        ))?;
        let start = Instant::now();
        let r = format.execute(&bytes);
        let secs = start.elapsed().as_secs_f64();
        return match r {
            Ok(Executed::Invariant(m)) => Err(CliError::runtime(format!(
                "invariant broken ({secs:.3} s): {m}"
            ))),
            Ok(e) => {
                outln!("{e:?} ({secs:.3} s)");
                Ok(())
            }
            Err(r) => {
                outln!("refused ({secs:.3} s): {}\n  class: {}", r.message, r.class);
                Ok(())
            }
        };
    }
    // findings are saved under --findings: a path that exists and is not a folder is refused
    // now, not when the first finding cannot be saved
    if a.findings.exists() && !a.findings.is_dir() {
        return Err(CliError::usage(format!(
            "--findings {}: that is not a folder (findings are saved as files in it)",
            a.findings.display()
        )));
    }
    let mut findings = 0;
    for format in formats {
        let c = Campaign {
            format: Arc::clone(&format),
            iterations: a.iterations,
            seed: a.seed,
            time_bound,
            hard_timeout: Some(timeout.max(time_bound)),
            findings_dir: Some(a.findings.clone()),
            progress_every: a.progress,
        };
        let report = run_campaign(&c, |r| {
            eprintln!(
                "  {}: {} inputs, {:.0}/s, findings {}",
                format.name(),
                r.inputs,
                r.inputs as f64 / r.seconds.max(1e-9),
                r.finding_count()
            )
        })?;
        out!("{}", report.to_text());
        findings += report.finding_count();
    }
    if findings > 0 {
        return Err(CliError::runtime(format!(
            "{findings} finding(s), saved under {}",
            a.findings.display()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// flags
// ---------------------------------------------------------------------------------------

/// Flags whose value is a file the command reads (only these may name `/dev/zero`).
const INPUT_FLAGS: &[&str] = &["--data", "--labels", "--load", "--inputs"];

/// Valid command lines (relative paths name files in the scratch directory).
fn flag_seeds() -> Vec<Vec<&'static str>> {
    let v: &[&[&str]] = &[
        &["ops"],
        &["ops", "--json"],
        &["capsules", "--op", "matmul"],
        &[
            "capsules",
            "--json",
            "--device",
            "cpu",
            "--provider",
            "native_cpu",
        ],
        &[
            "plan",
            "--profile",
            "checked_cpu",
            "--ops",
            "linear,relu,mse_loss",
        ],
        &[
            "plan",
            "--ops",
            "matmul,softmax",
            "--mode",
            "compiled",
            "--vjp",
            "torchlean_tape",
            "--json",
        ],
        &[
            "plan",
            "--ops",
            "matmul",
            "--provider",
            "only:native_cpu",
            "--policy",
            "strict",
        ],
        &["quickstart-tensors"],
        &["quickstart-autograd"],
        &[
            "quickstart-mlp",
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--log-every",
            "1",
        ],
        &[
            "quickstart-mlp",
            "--steps",
            "2",
            "--lr",
            "0.1",
            "--backend",
            "compiled",
            "--show-backend",
        ],
        &[
            "export",
            "--model",
            "mlp",
            "--out",
            "e.json",
            "--params",
            "e.safetensors",
            "--batch-size",
            "4",
        ],
        &["export", "--format", "dot", "--seed", "3"],
        &[
            "run-graph",
            "mlp.json",
            "--params",
            "mlp.safetensors",
            "--inputs",
            "x.safetensors",
            "--out",
            "y.safetensors",
            "--grad",
        ],
        &[
            "run-graph",
            "mlp.json",
            "--params",
            "mlp.safetensors",
            "--inputs",
            "x.safetensors",
            "--out",
            "y.safetensors",
            "--report-json",
            "r.json",
        ],
        &[
            "mlp", "--steps", "2", "--data", "data.csv", "--save", "m.ckpt", "--hidden", "4",
        ],
        &[
            "mlp", "--steps", "2", "--data", "data.csv", "--load", "ck.ckpt", "--hidden", "4",
        ],
        &[
            "mlp",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--log",
            "l.jsonl",
            "--plot",
            "p.png",
        ],
        &[
            "cnn",
            "--steps",
            "1",
            "--data",
            "train-images-idx3-ubyte",
            "--width",
            "2",
            "--batch-size",
            "4",
        ],
        &[
            "mlp",
            "--steps",
            "1",
            "--data",
            "train-images-idx3-ubyte",
            "--labels",
            "train-labels-idx1-ubyte",
            "--classes",
            "3",
        ],
        &["quickstart-cnn", "--steps", "1", "--width", "2"],
        &[
            "transformer",
            "--steps",
            "1",
            "--data",
            "text.txt",
            "--context",
            "8",
            "--sample-len",
            "4",
            "--batch-size",
            "2",
        ],
        &["autoencoder", "--steps", "1", "--batch-size", "4"],
        &[
            "fno1d",
            "--steps",
            "1",
            "--width",
            "4",
            "--modes",
            "2",
            "--batch-size",
            "2",
        ],
        &[
            "rnn",
            "--steps",
            "1",
            "--cell",
            "lstm",
            "--hidden",
            "4",
            "--batch-size",
            "2",
        ],
        &[
            "bench",
            "gemm-16",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--warmup-seconds",
            "0.01",
        ],
        // the optimizers' settings flags
        &[
            "mlp",
            "--steps",
            "2",
            "--hidden",
            "4",
            "--optimizer",
            "adamw",
            "--betas",
            "0.8,0.95",
            "--eps",
            "1e-6",
            "--amsgrad",
        ],
        &[
            "rnn",
            "--steps",
            "1",
            "--hidden",
            "4",
            "--batch-size",
            "2",
            "--optimizer",
            "rmsprop",
            "--alpha",
            "0.9",
            "--centered",
            "--momentum",
            "0.5",
        ],
        &[
            "mlp",
            "--steps",
            "2",
            "--hidden",
            "4",
            "--optimizer",
            "sgd",
            "--momentum",
            "0.9",
            "--nesterov=true",
            "--weight-decay",
            "0.01",
        ],
        &[
            "mlp",
            "--steps",
            "2",
            "--hidden",
            "4",
            "--optimizer",
            "adagrad",
            "--lr-decay",
            "0.1",
            "--eps",
            "1e-10",
        ],
        &["mlp", "--help"],
    ];
    v.iter().map(|s| s.to_vec()).collect()
}

const SUBCOMMANDS: &[&str] = &[
    "ops",
    "capsules",
    "plan",
    "quickstart-tensors",
    "quickstart-autograd",
    "quickstart-mlp",
    "bench",
    "export",
    "run-graph",
    "quickstart-cnn",
    "mlp",
    "cnn",
    "transformer",
    "autoencoder",
    "fno1d",
    "rnn",
    "help",
    "nonexistent",
];

const FLAGS: &[&str] = &[
    "--profile",
    "--device",
    "--provider",
    "--policy",
    "--show-backend",
    "--report-json",
    "--backend",
    "--steps",
    "--lr",
    "--seed",
    "--batch-size",
    "--log-every",
    "--save",
    "--save-every",
    "--load",
    "--log",
    "--plot",
    "--data",
    "--labels",
    "--classes",
    "--hidden",
    "--width",
    "--modes",
    "--cell",
    "--context",
    "--stride",
    "--dropout",
    "--sample-len",
    "--ops",
    "--vjp",
    "--mode",
    "--json",
    "--op",
    "--model",
    "--format",
    "--out",
    "--params",
    "--example-inputs",
    "--inputs",
    "--grad",
    "--reps",
    "--warmup",
    "--warmup-seconds",
    "--bogus",
    "-h",
    "--version",
    "--",
    "-",
];

const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "-1e308",
    "1e39",
    "1e-45",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "0.0",
    "-0",
    "1.5",
    "0x10",
    "",
    " ",
    "abc",
    "\u{e9}\u{202e}",
    "cpu",
    "cuda",
    "gpu",
    "tpu",
    "strict",
    "checked-runtime",
    "allow-trusted-runtime",
    "only:native_cpu",
    "prefer:reference",
    "only:",
    "only:nope",
    "auto",
    "eager",
    "compiled",
    "checked_cpu",
    "strict_cpu",
    "checked_cuda",
    "libtorch_cpu",
    "gru",
    "lstm",
    "mlp",
    "json",
    "dot",
    "torchlean_tape",
    "backend_vjp",
    "none",
    "matmul",
    "linear,relu",
    ",",
    "relu,,relu",
    "gemm-0",
    "gemm-1",
    "gemm-100000",
    "sdpa",
    "tiny-ops",
    "mlp.json",
    "data.csv",
    "bad.csv",
    "x.safetensors",
    "mlp.safetensors",
    "ck.ckpt",
    "text.txt",
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "missing.file",
    "dir",
    "empty",
    "out.bin",
    "--steps",
    "-5",
];

/// Files the seed command lines read (never overwritten: an output flag naming one writes
/// `o.bin` instead, so every run sees the same inputs).
const SEED_FILES: &[&str] = &[
    "mlp.json",
    "mlp.safetensors",
    "x.safetensors",
    "data.csv",
    "bad.csv",
    "empty",
    "text.txt",
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "ck.ckpt",
];

/// Flags that write the file they name.
const OUTPUT_FLAGS: &[&str] = &[
    "--save",
    "--log",
    "--plot",
    "--report-json",
    "--out",
    "--example-inputs",
    "--params",
];

/// Values of the type `flag` takes, at their edges (so that a mutation gets past clap).
fn typed_values(flag: &str) -> &'static [&'static str] {
    match flag {
        "--steps" | "--batch-size" | "--log-every" | "--save-every" | "--classes" | "--hidden"
        | "--width" | "--modes" | "--context" | "--stride" | "--sample-len" | "--reps"
        | "--warmup" | "--seed" => &[
            "0",
            "1",
            "2",
            "3",
            "5",
            "64",
            "1000",
            "65536",
            "1000000",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
            "-1",
        ],
        "--lr" | "--dropout" | "--warmup-seconds" => &[
            "0", "-0", "1e-45", "0.5", "1", "0.999999", "1e39", "nan", "inf", "-inf", "1e308", "2",
            "-1",
        ],
        "--data" | "--labels" | "--load" | "--inputs" => SEED_FILES,
        "--profile" => &[
            "strict_cpu",
            "checked_cpu",
            "checked_cuda",
            "libtorch_cpu",
            "future_x",
            "",
            "strict_native_cpu",
        ],
        "--device" => &[
            "cpu", "cuda", "gpu", "rocm", "metal", "wasm", "tpu", "custom", "external", "CPU",
        ],
        "--provider" => &[
            "auto",
            "prefer:native_cpu",
            "only:native_cpu",
            "only:reference",
            "prefer:",
            "only:cuda",
            "first:x",
        ],
        "--policy" => &[
            "strict",
            "checked-runtime",
            "allow-trusted-runtime",
            "lenient",
        ],
        "--backend" | "--mode" => &["eager", "compiled", "graph"],
        "--cell" => &["gru", "lstm", "rnn"],
        "--vjp" => &[
            "none",
            "torchlean_tape",
            "backend_vjp",
            "external_autograd",
            "x",
        ],
        "--ops" | "--op" => &[
            "matmul",
            "linear,relu,mse_loss",
            "conv2d,max_pool2d",
            "fused_unary",
            ",",
            "nope",
            "softmax,softmax",
        ],
        "--model" => &["mlp", "cnn"],
        "--format" => &["json", "dot", "yaml"],
        _ => VALUES,
    }
}

/// The scratch directory's files: a graph with its parameters and inputs, a CSV file, IDX
/// images and labels, a text, a checkpoint of `mlp --data data.csv --hidden 4`, and junk.
fn prepare(dir: &Path, exe: &Path) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::runtime(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir.join("dir")).map_err(io)?;
    let run = |args: &[&str]| -> Result<(), CliError> {
        let s = Command::new(exe)
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| CliError::runtime(format!("cannot run {}: {e}", exe.display())))?;
        if !s.success() {
            return Err(CliError::runtime(format!(
                "preparing the flags seeds: `{}` failed: {s}",
                args.join(" ")
            )));
        }
        Ok(())
    };
    run(&[
        "export",
        "--out",
        "mlp.json",
        "--params",
        "mlp.safetensors",
        "--example-inputs",
        "x.safetensors",
        "--batch-size",
        "4",
    ])?;
    let mut csv = String::from("a,b,label\n");
    for i in 0..20 {
        csv.push_str(&format!(
            "{},{},{}\n",
            (i % 5) as f32 * 0.3,
            (i % 3) as f32 - 1.0,
            i % 2
        ));
    }
    std::fs::write(dir.join("data.csv"), csv).map_err(io)?;
    std::fs::write(dir.join("bad.csv"), "a,b\n1,2,3\nnan,1\n").map_err(io)?;
    std::fs::write(dir.join("empty"), "").map_err(io)?;
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(8);
    std::fs::write(dir.join("text.txt"), text).map_err(io)?;
    let images = torchlean::Tensor::from_vec(
        (0..12 * 64).map(|i| (i * 37 % 256) as f32).collect(),
        &[12, 8, 8],
    )?;
    torchlean::data::write_idx(dir.join("train-images-idx3-ubyte"), &images, true)?;
    let labels = torchlean::Tensor::from_vec((0..12).map(|i| (i % 3) as f32).collect(), &[12])?;
    torchlean::data::write_idx(dir.join("train-labels-idx1-ubyte"), &labels, true)?;
    run(&[
        "mlp", "--steps", "2", "--data", "data.csv", "--hidden", "4", "--save", "ck.ckpt",
    ])?;
    Ok(())
}

/// A mutation of a seed command line.
fn mutate_argv(rng: &mut Rng) -> Vec<String> {
    let seeds = flag_seeds();
    let mut argv: Vec<String> = rng.pick(&seeds).iter().map(|s| s.to_string()).collect();
    for _ in 0..rng.range(1, 3) {
        let len = argv.len();
        match rng.below(12) {
            0..=3 if len > 1 => {
                // a value replaced: mostly by one of the flag's type
                let i = rng.range(1, len - 1);
                argv[i] = if rng.one_in(10) {
                    "9".repeat(rng.range(30, 3000))
                } else if rng.one_in(3) {
                    rng.pick(VALUES).to_string()
                } else {
                    rng.pick(typed_values(&argv[i - 1])).to_string()
                };
            }
            4 if len > 1 => {
                // a flag with its value repeated
                let i = rng.range(1, len - 1);
                let j = (i + 2).min(len);
                let chunk: Vec<String> = argv[i..j].to_vec();
                argv.extend(chunk);
            }
            5 if len > 1 => {
                argv.remove(rng.range(1, len - 1));
            }
            6 => {
                let at = rng.range(1.min(len), len);
                let flag = rng.pick(FLAGS).to_string();
                let value = rng.pick(typed_values(&flag)).to_string();
                argv.insert(at, value);
                argv.insert(at, flag);
            }
            7 if len > 0 => argv[0] = rng.pick(SUBCOMMANDS).to_string(),
            8 if len > 2 => {
                let (i, j) = (rng.range(1, len - 1), rng.range(1, len - 1));
                argv.swap(i, j);
            }
            9 if len > 1 => {
                // --flag value -> --flag=value
                let i = rng.range(1, len - 1);
                if argv[i].starts_with("--") && i + 1 < len {
                    let v = argv.remove(i + 1);
                    argv[i] = format!("{}={v}", argv[i]);
                }
            }
            10 => {
                let i = rng.range(1.min(len), len);
                let f = rng.pick(INPUT_FLAGS).to_string();
                argv.insert(i, "/dev/zero".into());
                argv.insert(i, f);
            }
            _ => {
                let n = *rng.pick(&[2usize, 10, 500]);
                for _ in 0..n {
                    argv.push(
                        rng.pick(&["--show-backend", "--json", "--grad", "-h"])
                            .to_string(),
                    );
                }
            }
        }
    }
    sanitize(argv)
}

/// Keeps every run inside its scratch directory: a value naming an absolute path or
/// leaving the directory is replaced, except `/dev/zero` and `/dev/null` right after a flag
/// that only reads its file; a flag that writes may not name a seed file.
fn sanitize(argv: Vec<String>) -> Vec<String> {
    // `--params` writes under `export` and reads under `run-graph`
    let export = argv.first().is_some_and(|c| c == "export");
    let writes = |f: &str| OUTPUT_FLAGS.contains(&f) && (f != "--params" || export);
    let mut out: Vec<String> = Vec::with_capacity(argv.len());
    for a in argv {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (Some(f.to_string()), v.to_string()),
            _ => (None, a.clone()),
        };
        let reader = match &flag {
            Some(f) => INPUT_FLAGS.contains(&f.as_str()),
            None => out
                .last()
                .is_some_and(|p| INPUT_FLAGS.contains(&p.as_str())),
        };
        let risky = value.contains('/')
            || value.contains("..")
            || value.contains('\0')
            || value.starts_with('~');
        let allowed = reader && (value == "/dev/zero" || value == "/dev/null");
        let writer = match &flag {
            Some(f) => writes(f),
            None => out.last().is_some_and(|p| writes(p)),
        };
        let value = if risky && !allowed {
            "junk".to_string()
        } else if writer && SEED_FILES.contains(&value.as_str()) {
            "o.bin".to_string()
        } else {
            value
        };
        out.push(match flag {
            Some(f) => format!("{f}={value}"),
            None => value,
        });
    }
    out
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Exit(i32),
    Signal(i32),
    Timeout,
}

fn spawn(
    exe: &Path,
    dir: &Path,
    argv: &[String],
    timeout: Duration,
) -> Result<(Ending, String, f64), CliError> {
    let err_path = dir.join(".stderr");
    let err = std::fs::File::create(&err_path)
        .map_err(|e| CliError::runtime(format!("{}: {e}", err_path.display())))?;
    let mut cmd = Command::new(exe);
    cmd.args(argv)
        .current_dir(dir)
        .env("RAYON_NUM_THREADS", "2")
        .env_remove("TORCHLEAN_PROFILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // `setrlimit`, which is async-signal-safe; it allocates nothing and takes no locks.
        unsafe {
            cmd.pre_exec(|| {
                // 4 GiB of address space: a size the flags ask for beyond it is refused by
                // the allocator (an error), instead of paging the shared machine
                let limit = libc::rlimit {
                    rlim_cur: 4 << 30,
                    rlim_max: 4 << 30,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::runtime(format!("cannot run {}: {e}", exe.display())))?;
    let ending = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                #[cfg(unix)]
                {
                    use std::os::unix::process::ExitStatusExt;
                    if let Some(sig) = status.signal() {
                        break Ending::Signal(sig);
                    }
                }
                break Ending::Exit(status.code().unwrap_or(-1));
            }
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Ending::Timeout;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(CliError::runtime(format!("waiting for a run: {e}"))),
        }
    };
    let stderr = std::fs::read(&err_path).unwrap_or_default();
    Ok((
        ending,
        String::from_utf8_lossy(&stderr).into_owned(),
        start.elapsed().as_secs_f64(),
    ))
}

fn quote(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let short: String = a.chars().take(60).collect();
            let short = if short.len() < a.len() {
                format!("{short}…({} chars)", a.chars().count())
            } else {
                short
            };
            if short.is_empty() || short.contains([' ', '"', '\'', '\t']) {
                format!("{short:?}")
            } else {
                short
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn flags(a: &Args, timeout: Duration) -> CliResult {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::runtime(format!("cannot find this binary: {e}")))?;
    let dir = std::env::temp_dir().join(format!("torchlean-fuzz-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    prepare(&dir, &exe)?;
    let start = Instant::now();
    let mut counts: BTreeMap<Ending, u64> = BTreeMap::new();
    let mut findings: Vec<String> = Vec::new();
    let mut timeouts: Vec<String> = Vec::new();
    let mut slowest = (0.0f64, String::new());
    let seeds = flag_seeds().len() as u64;
    for i in 0..seeds + a.iterations {
        // the seed command lines first, unmutated
        let argv: Vec<String> = if i < seeds {
            flag_seeds()[i as usize]
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            mutate_argv(&mut Rng::for_input(a.seed, i - seeds))
        };
        let (ending, stderr, secs) = spawn(&exe, &dir, &argv, timeout)?;
        *counts.entry(ending).or_default() += 1;
        if secs > slowest.0 && ending != Ending::Timeout {
            slowest = (secs, quote(&argv));
        }
        let panicked = stderr.contains("panicked at");
        let finding = match ending {
            Ending::Exit(0..=3) if !panicked => None,
            Ending::Timeout => {
                timeouts.push(quote(&argv));
                None
            }
            e => Some(format!(
                "{e:?}: torchlean {}\n    {}",
                quote(&argv),
                stderr.lines().last().unwrap_or("")
            )),
        };
        if i < seeds && ending != Ending::Exit(0) {
            findings.push(format!(
                "seed command line failed ({ending:?}): torchlean {}\n    {}",
                quote(&argv),
                stderr.trim()
            ));
        } else if let Some(f) = finding {
            findings.push(f);
        }
        if a.progress > 0 && (i + 1) % a.progress == 0 {
            eprintln!(
                "  flags: {} runs, {:.1}/s, findings {}",
                i + 1,
                (i + 1) as f64 / start.elapsed().as_secs_f64(),
                findings.len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let total: u64 = counts.values().sum();
    let secs = start.elapsed().as_secs_f64();
    outln!("flags: {total} runs ({seeds} seed command lines) in {secs:.1} s ({:.1}/s), slowest {:.2} s: torchlean {}", total as f64 / secs, slowest.0, slowest.1);
    let list: Vec<String> = counts
        .iter()
        .map(|(e, n)| match e {
            Ending::Exit(c) => format!("exit {c}: {n}"),
            Ending::Signal(s) => format!("signal {s}: {n}"),
            Ending::Timeout => format!("timeout ({:?}): {n}", timeout),
        })
        .collect();
    outln!("  endings: {}", list.join(", "));
    for t in timeouts.iter().take(10) {
        outln!("  timeout: torchlean {t}");
    }
    for f in &findings {
        outln!("  FINDING {f}");
    }
    if !findings.is_empty() {
        let _ = std::fs::create_dir_all(&a.findings);
        let _ = std::fs::write(
            a.findings.join(format!("flags-{}.txt", a.seed)),
            findings.join("\n"),
        );
        return Err(CliError::runtime(format!("{} finding(s)", findings.len())));
    }
    Ok(())
}
