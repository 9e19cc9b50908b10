//! Hostile input to the `torchlean` command (issue 13, items 8, 9, 11, 12): sizes beyond
//! memory fail as errors (exit 1 or 2 with a message naming the bytes), never as an abort;
//! devices and oversized files are refused instead of read until memory runs out; graph
//! files with unknown fields are refused; a closed output pipe ends the command quietly.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_torchlean");

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("torchlean-hostile-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn p(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary in `dir` under `ulimit -v` (about 2 GB of address space): returns the
/// exit code (None when a signal ended it) and stderr.
fn run_limited(dir: &str, args: &str) -> (Option<i32>, String) {
    let out = Command::new("bash")
        .current_dir(dir)
        .arg("-c")
        .arg(format!("ulimit -v 2000000; exec '{BIN}' {args}"))
        .output()
        .expect("bash runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Exit 1 or 2 with an `error:` line containing each of `expect`; never a signal (abort).
fn assert_fails_cleanly(what: &str, (code, err): (Option<i32>, String), expect: &[&str]) {
    assert!(
        matches!(code, Some(1) | Some(2)),
        "{what}: expected exit 1 or 2, got {code:?} (None = killed by a signal, e.g. an abort on a failed allocation); stderr:\n{err}"
    );
    assert!(err.starts_with("error: "), "{what}: {err}");
    for e in expect {
        assert!(err.contains(e), "{what}: expected `{e}` in: {err}");
    }
    assert!(!err.contains("panicked"), "{what}: {err}");
}

fn empty_safetensors(path: &str) {
    let mut bytes = 8u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}      ");
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_model_too_large_for_memory_is_an_error_naming_the_bytes() {
    let d = Dir::new("hidden");
    // 100000 x 100000 f32 = 40 GB
    assert_fails_cleanly(
        "mlp --hidden 100000",
        run_limited(&d.p(""), "mlp --hidden 100000 --steps 1"),
        &["out of memory", "40000000000 bytes"],
    );
}

/// An output path with a trailing slash names a folder: refused before the run (exit 2), not
/// after it (exit 1, the training lost).
#[test]
fn an_output_path_ending_in_a_slash_is_refused_before_the_run() {
    let d = Dir::new("trailing");
    std::fs::write(d.p("a.ck"), b"x").unwrap();
    for args in ["mlp --steps 3 --save new/", "mlp --steps 3 --save a.ck/"] {
        let (code, err) = run_limited(&d.p(""), args);
        assert_eq!(code, Some(2), "{args}: {err}");
        assert!(err.contains("that is a folder"), "{args}: {err}");
    }
}

/// A layer larger than the size rule (2^34 elements) is a usage error (exit 2) whichever
/// layer it is: the mlp's linear weight and the cnn's convolution weight alike.
#[test]
fn a_layer_beyond_the_size_rule_is_a_usage_error() {
    let d = Dir::new("sizerule");
    for args in [
        "mlp --hidden 100000000 --steps 1",
        "cnn --width 100000 --steps 1",
    ] {
        let (code, err) = run_limited(&d.p(""), args);
        assert_eq!(code, Some(2), "{args}: {err}");
        assert!(err.contains("17179869184"), "{args}: {err}");
    }
}

#[test]
fn an_absurd_batch_size_is_refused() {
    let d = Dir::new("batch");
    assert_fails_cleanly(
        "mlp --batch-size 1e12",
        run_limited(&d.p(""), "mlp --batch-size 1000000000000 --steps 1"),
        &["batch size 1000000000000"],
    );
}

#[test]
fn a_huge_csv_label_does_not_size_the_model() {
    let d = Dir::new("label");
    std::fs::write(d.p("big.csv"), "1,2,0\n3,4,50000000\n").unwrap();
    assert_fails_cleanly(
        "CSV label 50,000,000",
        run_limited(&d.p(""), "mlp --data big.csv --steps 1"),
        &["line 2, column 3: label `50000000` is not a class index"],
    );
    // a class index (below 2^24) above the class limit: the limit is named
    std::fs::write(d.p("two-million.csv"), "1,2,0\n3,4,2000000\n").unwrap();
    assert_fails_cleanly(
        "CSV label 2,000,000",
        run_limited(&d.p(""), "mlp --data two-million.csv --steps 1"),
        &["label 2000000 of sample 1", "limit of 1000000 classes"],
    );
    // the flag is named when it is the flag that is too large (the label was blamed)
    std::fs::write(d.p("small.csv"), "1,2,0\n3,4,1\n").unwrap();
    assert_fails_cleanly(
        "--classes 50,000,001",
        run_limited(
            &d.p(""),
            "mlp --data small.csv --classes 50000001 --steps 1",
        ),
        &["--classes 50000001 exceeds the limit of 1000000"],
    );
}

#[test]
fn a_huge_random_op_is_an_error_naming_the_bytes() {
    let d = Dir::new("rand");
    // 2^31 elements: within the graph's node limit, beyond the process's memory
    let graph = serde_json::json!({
        "format": "torchlean.ir.v1", "inputs": [], "parameters": [],
        "nodes": [{"id": 0, "kind": "op", "op": {"op": "rand_uniform", "shape": [2147483648u64], "seed": 1},
                   "parents": [], "shape": [2147483648u64], "dtype": "f32"}],
        "outputs": [{"name": "r", "node": 0}]
    });
    std::fs::write(d.p("rand.json"), graph.to_string()).unwrap();
    empty_safetensors(&d.p("none.safetensors"));
    assert_fails_cleanly(
        "rand_uniform of 2^31 elements",
        run_limited(
            &d.p(""),
            "run-graph rand.json --inputs none.safetensors --out r.safetensors",
        ),
        &["out of memory", "8589934592 bytes"],
    );
}

#[test]
fn devices_are_refused_as_graphs_inputs_and_checkpoints() {
    let d = Dir::new("devzero");
    let (graph, x) = (d.p("mlp.json"), d.p("x.safetensors"));
    let export = Command::new(BIN)
        .args(["export", "--out", &graph, "--example-inputs", &x])
        .output()
        .unwrap();
    assert!(export.status.success());
    assert_fails_cleanly(
        "/dev/zero as the graph",
        run_limited(
            &d.p(""),
            "run-graph /dev/zero --inputs x.safetensors --out y.safetensors",
        ),
        &["/dev/zero", "not a regular file"],
    );
    assert_fails_cleanly(
        "/dev/zero as --inputs",
        run_limited(
            &d.p(""),
            "run-graph mlp.json --inputs /dev/zero --out y.safetensors",
        ),
        &["/dev/zero", "not a regular file"],
    );
    assert_fails_cleanly(
        "/dev/zero as --load",
        run_limited(&d.p(""), "mlp --load /dev/zero --steps 1"),
        &["/dev/zero", "not a regular file"],
    );
    std::os::unix::fs::symlink("/dev/zero", d.p("zero.csv")).unwrap();
    assert_fails_cleanly(
        "/dev/zero as --data",
        run_limited(&d.p(""), "mlp --data zero.csv --steps 1"),
        &["zero.csv", "not a regular file"],
    );
}

#[test]
fn a_pipe_is_read_up_to_the_graph_limit() {
    let d = Dir::new("pipe");
    empty_safetensors(&d.p("none.safetensors"));
    // an endless pipe as the graph file: refused at the 256 MiB limit, not read forever
    let (code, err) = run_limited(
        &d.p(""),
        "run-graph <(yes) --inputs none.safetensors --out y.safetensors",
    );
    assert_fails_cleanly(
        "endless pipe",
        (code, err),
        &["exceeds the limit of 268435456"],
    );
}

/// Graph files with a field the format does not have are refused (exit 2), wherever it is.
#[test]
fn unknown_fields_in_graph_files_are_refused() {
    let d = Dir::new("fields");
    let (graph, x) = (d.p("mlp.json"), d.p("x.safetensors"));
    let export = Command::new(BIN)
        .args(["export", "--out", &graph, "--example-inputs", &x])
        .output()
        .unwrap();
    assert!(export.status.success());
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&graph).unwrap()).unwrap();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "top level",
            Box::new(|g| {
                g["comment"] = "hi".into();
            }),
            "unknown field `comment`",
        ),
        (
            "input decl",
            Box::new(|g| {
                g["inputs"][0]["dtype"] = "f32".into();
            }),
            "unknown field `dtype`",
        ),
        (
            "output decl",
            Box::new(|g| {
                g["outputs"][0]["shape"] = serde_json::json!([1]);
            }),
            "unknown field `shape`",
        ),
        (
            "node",
            Box::new(|g| {
                g["nodes"][0]["grad"] = true.into();
            }),
            "unknown field `grad`",
        ),
        (
            "input node with an op",
            Box::new(|g| {
                g["nodes"][0]["op"] = serde_json::json!({"op": "relu"});
            }),
            "has no field `op`",
        ),
        (
            "op node with a name",
            Box::new(|g| {
                first_op(g)["name"] = "x".into();
            }),
            "has no field `name`",
        ),
        (
            // the safetensors metadata key: computed, then not writable (exit 1 after the
            // run) before the thirty-seventh session
            "an output named __metadata__",
            Box::new(|g| {
                g["outputs"][0]["name"] = "__metadata__".into();
            }),
            "safetensors format's metadata key",
        ),
        (
            "payload of a payload-free op",
            Box::new(|g| {
                first_op(g)["op"]["dim"] = 0.into();
            }),
            "unknown field `dim`",
        ),
    ];
    for (what, edit, expect) in cases {
        let mut g = base.clone();
        edit(&mut g);
        let path = d.p("edited.json");
        std::fs::write(&path, g.to_string()).unwrap();
        let out = Command::new(BIN)
            .args([
                "run-graph",
                &path,
                "--inputs",
                &x,
                "--out",
                &d.p("y.safetensors"),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(expect), "{what}: expected `{expect}` in {err}");
    }
}

fn first_op(g: &mut serde_json::Value) -> &mut serde_json::Value {
    g["nodes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|n| n["kind"] == "op")
        .unwrap()
}

/// The reader of our output goes away before we print: the command ends quietly (killed by
/// SIGPIPE like `cat`, or exit 0), never with a panic message and exit 101.
/// Runs the binary with `args` whose stdout's reader is gone before the first line: its exit
/// status and stderr.
fn with_closed_stdout(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // close the read end before the child writes
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (child.wait().unwrap(), err)
}

#[test]
fn a_closed_output_pipe_ends_printing_commands_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [
        &["capsules", "--json"][..],
        &["capsules"][..],
        &["ops", "--json"][..],
        &["ops"][..],
        &["plan", "--ops", "linear,relu,mse_loss"][..],
        &["export", "--model", "mlp"][..],
        &["quickstart-tensors"][..],
    ] {
        let (status, err) = with_closed_stdout(args);
        assert!(
            status.success() || status.signal() == Some(13),
            "{args:?}: {status:?}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// Runs the binary (no memory limit): exit code and stderr.
fn run_plain(dir: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Found by a hostile-input audit: values given in the wrong file, or naming nothing, were
/// used or dropped silently; an output path equal to an input destroyed the input; a
/// symbolic link, a device or a pipe given as an output was replaced by a regular file (as
/// root, `--out /dev/null` replaced the device node); flags that only make sense with
/// another one were ignored.
#[test]
fn misnamed_values_clobbering_outputs_and_ignored_flags_are_refused() {
    let d = Dir::new("names");
    let dir = d.0.to_string_lossy().into_owned();
    let run_graph = |inputs: &str, out: &str| {
        run_plain(
            &dir,
            &[
                "run-graph",
                "g.json",
                "--params",
                "p.st",
                "--inputs",
                inputs,
                "--out",
                out,
            ],
        )
    };
    let (code, err) = run_plain(
        &dir,
        &[
            "export",
            "--out",
            "g.json",
            "--params",
            "p.st",
            "--example-inputs",
            "x.st",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    // a parameter named in --inputs (it used to override the one in --params)
    let io = torchlean::tensor::io::read_safetensors;
    let mut shadow = io(std::path::Path::new(&d.p("x.st"))).unwrap();
    let params = io(std::path::Path::new(&d.p("p.st"))).unwrap();
    shadow.push(params[0].clone());
    let shadow_path = d.p("shadow.st");
    torchlean::tensor::io::write_safetensors(std::path::Path::new(&shadow_path), &shadow, None)
        .unwrap();
    let (code, err) = run_graph("shadow.st", "o.st");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is a parameter of the graph: give it in --params"),
        "{err}"
    );
    // an output that is an input
    let before = std::fs::read(d.p("x.st")).unwrap();
    let (code, err) = run_graph("x.st", "x.st");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is the same file as --inputs"), "{err}");
    assert_eq!(
        std::fs::read(d.p("x.st")).unwrap(),
        before,
        "the input is intact"
    );
    // a symbolic link given as --out stays a link, its target receives the outputs
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("target.st", d.p("link.st")).unwrap();
        let (code, err) = run_graph("x.st", "link.st");
        assert_eq!(code, Some(0), "{err}");
        let meta = std::fs::symlink_metadata(d.p("link.st")).unwrap();
        assert!(meta.file_type().is_symlink());
        assert!(std::fs::metadata(d.p("target.st")).unwrap().len() > 0);
    }
    // flags that would be ignored
    for (args, expect) in [
        (
            &["mlp", "--steps", "1", "--save-every", "1"][..],
            "--save-every needs --save",
        ),
        (
            &["mlp", "--steps", "1", "--classes", "5"][..],
            "--classes describes a data file",
        ),
        (
            &["mlp", "--steps", "1", "--tf32"][..],
            "exist on device `cuda` only",
        ),
        // an output whose folder does not exist: refused before training (it trained, then
        // failed to write)
        (
            &["mlp", "--steps", "1", "--save", "no-such-folder/x.ckpt"][..],
            "the folder no-such-folder does not exist",
        ),
        (
            &[
                "mlp",
                "--steps",
                "1",
                "--report-json",
                "no-such-folder/r.json",
            ][..],
            "the folder no-such-folder does not exist",
        ),
        // plan refuses a provider the build does not declare on the device, as a run does
        // (it planned native_cpu and said accepted)
        (
            &["plan", "--provider", "prefer:cublas", "--ops", "linear"][..],
            "no provider module linked into this build declares it there",
        ),
        // the same opt-in through a profile, moved to the CPU (it ran, its policy naming TF32)
        (
            &[
                "mlp",
                "--steps",
                "1",
                "--profile",
                "checked_cuda_tf32",
                "--device",
                "cpu",
            ][..],
            "exist on device `cuda` only",
        ),
        (
            &["bench", "mlp-step", "--reps", "1", "--batch-size", "0"][..],
            "--batch-size must be positive",
        ),
        (
            &[
                "bench",
                "mlp-step",
                "--reps",
                "1",
                "--warmup-seconds",
                "inf",
            ][..],
            "--warmup-seconds must be between 0 and 3600",
        ),
        // finite but never ending (it hung)
        (
            &[
                "bench",
                "mlp-step",
                "--reps",
                "1",
                "--warmup-seconds",
                "1e300",
            ][..],
            "--warmup-seconds must be between 0 and 3600",
        ),
        // the report written over the model it planned (it was, exit 0)
        (
            &["plan", "--model", "g.json", "--report-json", "g.json"][..],
            "--report-json g.json is the same file as --model g.json",
        ),
        (&["bench", "gemm-0"][..], "positive integer"),
        (
            &["plan", "--model", "g.json", "--input-shape", "x=1,2"][..],
            "--input-shape applies to ONNX models",
        ),
    ] {
        let (code, err) = run_plain(&dir, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

/// Found by the thirty-fourth session's audit: `quickstart-mlp` exited 0 after its loss
/// became NaN (every other trainer stops, exit 1), and `transformer --stride usize::MAX`
/// panicked on a window start that wrapped.
#[test]
fn a_diverging_quickstart_stops_and_a_huge_stride_is_one_window() {
    let d = Dir::new("diverge");
    let dir = d.0.to_string_lossy().into_owned();
    let (code, err) = run_plain(&dir, &["quickstart-mlp", "--steps", "5", "--lr", "1e30"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("non-finite loss"), "{err}");
    let stride = usize::MAX.to_string();
    let (code, err) = run_plain(&dir, &["transformer", "--steps", "2", "--stride", &stride]);
    assert_eq!(code, Some(0), "{err}");
}

/// A text too short for one training window is refused naming the flag that sets the window
/// (`--context`), not the library's parameter (`seq_len`), exit 2.
#[test]
fn a_text_shorter_than_the_context_names_the_flag() {
    let d = Dir::new("short-text");
    let dir = d.0.to_string_lossy().into_owned();
    std::fs::write(d.0.join("one.txt"), "x").unwrap();
    std::fs::write(d.0.join("eight.txt"), "abcdefgh").unwrap();
    for (file, context) in [("one.txt", "8"), ("eight.txt", "8")] {
        let (code, err) = run_plain(
            &dir,
            &[
                "transformer",
                "--data",
                file,
                "--context",
                context,
                "--steps",
                "1",
            ],
        );
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("--context 8") && !err.contains("seq_len"),
            "{err}"
        );
    }
    // nine characters hold one window of 8 and its target
    std::fs::write(d.0.join("nine.txt"), "abcdefghi").unwrap();
    let (code, err) = run_plain(
        &dir,
        &[
            "transformer",
            "--data",
            "nine.txt",
            "--context",
            "8",
            "--steps",
            "1",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
}

/// A text that starts with a UTF-8 byte-order mark trains exactly as the same text without
/// it (the mark became a vocabulary character, changing the model and every loss); so does
/// the text saved with Windows line ends (`\r\n`; Python's text mode reads `\n`: the `\r`
/// was a vocabulary character until the forty-fourth session).
#[test]
fn a_byte_order_mark_is_not_part_of_the_text() {
    let d = Dir::new("bom");
    let dir = d.0.to_string_lossy().into_owned();
    let text = "the quick brown fox\njumps over the lazy dog.\n".repeat(8);
    std::fs::write(d.0.join("plain.txt"), &text).unwrap();
    std::fs::write(d.0.join("bom.txt"), format!("\u{feff}{text}")).unwrap();
    std::fs::write(d.0.join("crlf.txt"), text.replace('\n', "\r\n")).unwrap();
    let losses = |file: &str| {
        let out = Command::new(BIN)
            .args([
                "transformer",
                "--data",
                file,
                "--steps",
                "3",
                "--context",
                "8",
                "--log-every",
                "1",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("step "))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let (a, b) = (losses("plain.txt"), losses("bom.txt"));
    assert!(!a.is_empty());
    assert_eq!(a, b);
    assert_eq!(a, losses("crlf.txt"), "CRLF line ends");
}

/// IDX images state their height and width: 8×32 images were reshaped to 16×16 for the CNN
/// (the same number of values), silently. Refused; 16×16 images of the same bytes train.
#[test]
fn non_square_idx_images_are_not_reshaped_into_squares() {
    let d = Dir::new("nonsquare");
    let dir = d.0.to_string_lossy().into_owned();
    let idx = |dims: &[u32], values: usize| {
        let mut b = vec![0u8, 0, 0x08, dims.len() as u8];
        for &x in dims {
            b.extend_from_slice(&x.to_be_bytes());
        }
        b.extend((0..values).map(|i| (i * 37 % 256) as u8));
        b
    };
    std::fs::write(d.0.join("wide-images.idx"), idx(&[8, 8, 32], 8 * 256)).unwrap();
    std::fs::write(d.0.join("square-images.idx"), idx(&[8, 16, 16], 8 * 256)).unwrap();
    let labels: Vec<u8> = [0u8, 0, 0x08, 1, 0, 0, 0, 8]
        .into_iter()
        .chain((0..8).map(|i| (i % 2) as u8))
        .collect();
    std::fs::write(d.0.join("labels.idx"), labels).unwrap();
    let cnn = |images: &str| {
        run_plain(
            &dir,
            &[
                "cnn",
                "--data",
                images,
                "--labels",
                "labels.idx",
                "--steps",
                "1",
                "--batch-size",
                "4",
            ],
        )
    };
    let (code, err) = cnn("wide-images.idx");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("square") && err.contains("[1, 8, 32]"),
        "{err}"
    );
    let (code, err) = cnn("square-images.idx");
    assert_eq!(code, Some(0), "{err}");
}

/// Found by an ONNX audit: every output flag accepted the model's external data file (it
/// was compared with the `.onnx` file only), so `run-graph m.onnx --out m.onnx.data` wrote
/// safetensors over the weights and later runs read its header as weights (exit 0 both
/// times); an external data location naming a FIFO blocked forever at open; a model whose
/// integer inputs were filled with uniform floats could not be benchmarked.
#[test]
fn an_onnx_models_external_data_is_an_input_no_output_may_overwrite() {
    let d = Dir::new("external");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    for f in ["external.onnx", "external.onnx.data"] {
        std::fs::copy(format!("{fixtures}/{f}"), d.p(f)).unwrap();
    }
    let weights = std::fs::read(d.p("external.onnx.data")).unwrap();
    let x = torchlean::Tensor::from_vec((0..8).map(|v| v as f32).collect(), &[2, 4]).unwrap();
    torchlean::tensor::io::write_safetensors(
        std::path::Path::new(&d.p("x.st")),
        &[("x".to_string(), x)],
        None,
    )
    .unwrap();
    let dir = d.0.to_string_lossy().into_owned();
    let data = "external.onnx.data";
    let commands: [&[&str]; 5] = [
        &["import", "external.onnx", "--out", data, "--params", "p.st"],
        &[
            "import",
            "external.onnx",
            "--out",
            "g.json",
            "--params",
            data,
        ],
        &[
            "run-graph",
            "external.onnx",
            "--inputs",
            "x.st",
            "--out",
            data,
        ],
        &["plan", "--model", "external.onnx", "--report-json", data],
        &[
            "bench",
            "onnx:external.onnx",
            "--reps",
            "1",
            "--report-json",
            data,
        ],
    ];
    for args in commands {
        let (code, err) = run_plain(&dir, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("the model's external data"), "{args:?}: {err}");
        assert_eq!(std::fs::read(d.p(data)).unwrap(), weights, "{args:?}");
    }
    // the model itself runs, with its weights: y = x·W + b (onnxruntime's values)
    let (code, err) = run_plain(
        &dir,
        &[
            "run-graph",
            "external.onnx",
            "--inputs",
            "x.st",
            "--out",
            "y.st",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let y = torchlean::tensor::io::read_safetensors(std::path::Path::new(&d.p("y.st"))).unwrap();
    let y = y.iter().find(|(n, _)| n == "y").unwrap().1.to_vec();
    let ort = [4.7, 3.8000002, 7.4, 11.900001, 12.6, 17.8];
    for (a, b) in y.iter().zip(ort) {
        assert!((a - b).abs() <= 1e-5, "{y:?}");
    }
}

#[test]
fn an_external_data_fifo_is_refused_without_blocking() {
    let d = Dir::new("fifo");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    std::fs::copy(format!("{fixtures}/external.onnx"), d.p("external.onnx")).unwrap();
    let made = Command::new("mkfifo")
        .arg(d.p("external.onnx.data"))
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo is not available here");
        return;
    }
    let dir = d.0.to_string_lossy().into_owned();
    // `timeout` ends the command if it blocks (the old code opened the FIFO first)
    let out = Command::new("timeout")
        .current_dir(&dir)
        .args(["20", BIN, "plan", "--model", "external.onnx"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a regular file"), "{err}");
}

/// A 141-byte model naming 1 GiB of external data (a sparse file: no disk used): the bytes
/// are read fallibly, and so is every decoded copy of them (they were copied infallibly, and
/// a 4 GiB file aborted the process). Under a 2 GB address-space limit the import is an
/// out-of-memory error, never a signal.
#[test]
fn decoding_a_large_external_initializer_is_fallible() {
    let d = Dir::new("sparse");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    std::fs::copy(format!("{fixtures}/sparse.onnx"), d.p("sparse.onnx")).unwrap();
    std::fs::File::create(d.p("big.bin"))
        .unwrap()
        .set_len(4 << 28)
        .unwrap();
    let dir = d.0.to_string_lossy().into_owned();
    assert_fails_cleanly(
        "plan --model sparse.onnx",
        run_limited(&dir, "plan --model sparse.onnx"),
        &["memory"],
    );
}

/// Found by a documentation audit (thirty-sixth session): `--load` from a named pipe hung
/// forever (the checkpoint's metadata was read first, draining the pipe, then the load opened
/// it again) — it is now read once, and a resumed run from a pipe equals one from the file;
/// an IDX images file's labels, found by name without `--labels`, could be overwritten by
/// `--save` (and destroyed, exit 0); an output naming a folder failed (exit 1) only after the
/// run. Each refusal comes before the first step.
#[test]
fn a_checkpoint_pipe_loads_and_derived_inputs_and_folders_are_not_outputs() {
    let d = Dir::new("load-pipe");
    let dir = d.0.to_string_lossy().into_owned();
    let ok = |args: &[&str]| -> String {
        let out = Command::new(BIN)
            .current_dir(&dir)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let steps = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("step "))
            .map(String::from)
            .collect()
    };
    ok(&["mlp", "--steps", "4", "--save", "ck.safetensors"]);
    let from_file = steps(&ok(&["mlp", "--load", "ck.safetensors", "--steps", "3"]));
    let made = Command::new("mkfifo").arg(d.p("ck.pipe")).status();
    if made.is_ok_and(|s| s.success()) {
        // the writer runs beside the command; `timeout` ends a command that blocks
        let writer = Command::new("bash")
            .current_dir(&dir)
            .arg("-c")
            .arg("cat ck.safetensors > ck.pipe")
            .spawn()
            .unwrap();
        let out = Command::new("timeout")
            .current_dir(&dir)
            .args(["60", BIN, "mlp", "--load", "ck.pipe", "--steps", "3"])
            .output()
            .unwrap();
        let _ = writer.wait_with_output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "--load from a pipe: {err}");
        assert_eq!(steps(&String::from_utf8_lossy(&out.stdout)), from_file);
    } else {
        eprintln!("skipped the pipe: mkfifo is not available here");
    }
    // an IDX pair found by name
    let mut images = vec![0, 0, 8, 3, 0, 0, 0, 20, 0, 0, 0, 4, 0, 0, 0, 4];
    images.extend((0..20 * 16).map(|i| (i * 37 % 256) as u8));
    let mut labels = vec![0, 0, 8, 1, 0, 0, 0, 20];
    labels.extend((0..20).map(|i| (i % 2) as u8));
    std::fs::write(d.p("t-images-idx3-ubyte"), &images).unwrap();
    std::fs::write(d.p("t-labels-idx1-ubyte"), &labels).unwrap();
    std::fs::create_dir_all(d.p("a-folder")).unwrap();
    for args in [
        &[
            "mlp",
            "--data",
            "t-images-idx3-ubyte",
            "--save",
            "t-labels-idx1-ubyte",
        ][..],
        &[
            "mlp",
            "--data",
            "t-images-idx3-ubyte",
            "--log",
            "t-labels-idx1-ubyte",
        ][..],
        &["mlp", "--save", "a-folder"][..],
        &["mlp", "--plot", "a-folder"][..],
        &["export", "--out", "a-folder"][..],
    ] {
        let out = Command::new(BIN)
            .current_dir(&dir)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("step "),
            "{args:?} trained before refusing"
        );
    }
    assert_eq!(std::fs::read(d.p("t-labels-idx1-ubyte")).unwrap(), labels);
}

/// A classifier's checkpoint remembers its classes' names: loading it for data whose label
/// column names the classes otherwise (class 1 was `dog`, is now `zebra`) is refused with both
/// lists — it evaluated at 0.125 accuracy, exit 0, before (an audit of the thirty-seventh
/// session) — while the same names load.
#[test]
fn a_checkpoint_of_other_class_names_is_refused() {
    let d = Dir::new("class-names");
    let mut rows = String::new();
    for i in 0..40 {
        let (x, name) = if i % 2 == 0 {
            (-2.0, "cat")
        } else {
            (2.0, "dog")
        };
        rows.push_str(&format!("{},{},{name}\n", x + (i % 7) as f32 * 0.1, i % 3));
    }
    std::fs::write(d.p("catdog.csv"), &rows).unwrap();
    std::fs::write(
        d.p("dogzebra.csv"),
        rows.replace("dog", "zebra").replace("cat", "dog"),
    )
    .unwrap();
    let ck = d.p("cd.ck");
    let mlp = |data: &str, steps: &str, ck_flag: &str| {
        let data = d.p(data);
        run_plain(
            &d.p(""),
            &["mlp", "--data", &data, "--steps", steps, ck_flag, &ck],
        )
    };
    let (code, err) = mlp("catdog.csv", "3", "--save");
    assert_eq!(code, Some(0), "{err}");
    assert_fails_cleanly(
        "other class names",
        mlp("dogzebra.csv", "0", "--load"),
        &["0 = \"cat\", 1 = \"dog\"", "0 = \"dog\", 1 = \"zebra\""],
    );
    let (code, err) = mlp("catdog.csv", "0", "--load");
    assert_eq!(code, Some(0), "the same names load: {err}");
}

/// A command asked to write files outlives a closed stdout: `mlp --save … | head -1` writes
/// its checkpoint, export and report whole (the run ended at the first line it could not
/// print, writing none of them, before the thirty-seventh session), exit 0; without output
/// files it still ends at once, quietly (SIGPIPE), as `cat` does.
#[test]
fn a_closed_stdout_does_not_lose_the_files_a_run_writes() {
    use std::os::unix::process::ExitStatusExt;
    let d = Dir::new("closed-stdout-files");
    let (ck, onnx, report) = (d.p("m.ck"), d.p("m.onnx"), d.p("r.json"));
    let run = with_closed_stdout;
    let (status, err) = run(&[
        "mlp",
        "--steps",
        "30",
        "--log-every",
        "1",
        "--save",
        &ck,
        "--export",
        &onnx,
        "--report-json",
        &report,
    ]);
    assert!(status.success(), "{status:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for f in [&ck, &onnx, &report] {
        assert!(
            std::fs::metadata(f).map(|m| m.len() > 0).unwrap_or(false),
            "{f} was not written"
        );
    }
    let (status, err) = run(&["mlp", "--steps", "30", "--log-every", "1"]);
    assert_eq!(status.signal(), Some(13), "{status:?}: {err}");
}

/// Outputs named by a descriptor path are written through the descriptor: `--save
/// /dev/stdout` appended to a file (`>>`) appends (it replaced the file by the checkpoint),
/// `--log /dev/stdout` redirected to a file keeps the printed lines beside the log's (it
/// truncated the file at another offset), an output to a process substitution's pipe works,
/// and `--save /dev/stdin` is refused before the run (it overwrote the file the shell read
/// from). An audit of the thirty-seventh session.
#[test]
fn descriptor_paths_are_written_through_their_descriptor() {
    let d = Dir::new("descriptor-paths");
    let sh = |script: &str| {
        Command::new("bash")
            .current_dir(&d.0)
            .arg("-c")
            .arg(script)
            .env("TL", BIN)
            .output()
            .expect("bash runs")
    };
    let o = sh(r#"echo PRECIOUS > app.txt; "$TL" mlp --steps 3 --save /dev/stdout >> app.txt"#);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let app = std::fs::read(d.0.join("app.txt")).unwrap();
    assert!(
        app.starts_with(b"PRECIOUS\nmlp: "),
        "{:?}",
        String::from_utf8_lossy(&app[..40])
    );
    assert!(
        app.windows(13).any(|w| w == b"__metadata__\""),
        "no checkpoint appended"
    );

    let o = sh(r#""$TL" mlp --steps 3 --log-every 1 --log /dev/stdout > run.log"#);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = std::fs::read_to_string(d.0.join("run.log")).unwrap();
    let steps = log.lines().filter(|l| l.starts_with("step ")).count();
    let json: Vec<&str> = log.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!((steps, json.len()), (3, 3), "{log}");
    for l in json {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{l}: {e}"));
    }

    // --report-json the same way (it truncated what the shell redirected: forty-third
    // session's audit), for a training example and for run-graph
    let o =
        sh(r#"echo PRECIOUS > rep.txt; "$TL" mlp --steps 3 --report-json /dev/stdout >> rep.txt"#);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep = std::fs::read_to_string(d.0.join("rep.txt")).unwrap();
    assert!(rep.starts_with("PRECIOUS\nmlp: "), "{rep}");
    let at = rep.find("\n{").expect("the report follows the run's lines") + 1;
    let end = rep.rfind('}').expect("the report ends") + 1;
    serde_json::from_str::<serde_json::Value>(&rep[at..end])
        .unwrap_or_else(|e| panic!("{e}: {rep}"));
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../torchlean-onnx/tests/fixtures"
    );
    let o = sh(&format!(
        r#""$TL" run-graph {fixtures}/cnn.onnx --inputs {fixtures}/cnn.inputs.safetensors --out y.safetensors --report-json /dev/stdout > graph.txt"#
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = std::fs::read_to_string(d.0.join("graph.txt")).unwrap();
    let end = out.rfind('}').expect("a report") + 1;
    serde_json::from_str::<serde_json::Value>(&out[out.find('{').unwrap()..end])
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(out[end..].contains("wrote 2 output(s)"), "{out}");

    let o = sh(r#""$TL" mlp --steps 3 --export >(wc -c > size.txt); sleep 0.5"#);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let size: u64 = std::fs::read_to_string(d.0.join("size.txt"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(size > 1000, "{size} bytes through the pipe");

    let o = sh(r#"echo KEEP > in.txt; "$TL" mlp --steps 3 --save /dev/stdin < in.txt"#);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("standard input"), "{err}");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("step"),
        "it trained first"
    );
    assert_eq!(
        std::fs::read_to_string(d.0.join("in.txt")).unwrap(),
        "KEEP\n"
    );
}

/// Small consistencies from the thirty-seventh session's audit: a graph file that starts with
/// a UTF-8 byte-order mark is read like the CSV and text files that may (it was refused as
/// not JSON), an attention workload naming `-L` twice is refused (the last one was taken
/// silently), and `bench onnx:` without a path says so.
#[test]
fn a_graph_with_a_byte_order_mark_reads_and_a_repeated_workload_size_is_refused() {
    let d = Dir::new("bom");
    let (graph, x, params) = (d.p("g.json"), d.p("x.safetensors"), d.p("p.safetensors"));
    let o = Command::new(BIN)
        .args([
            "export",
            "--out",
            &graph,
            "--params",
            &params,
            "--example-inputs",
            &x,
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(std::fs::read(&graph).unwrap());
    let bom = d.p("bom.json");
    std::fs::write(&bom, bytes).unwrap();
    let run = |g: &str, out: &str| {
        let o = Command::new(BIN)
            .args([
                "run-graph",
                g,
                "--params",
                &params,
                "--inputs",
                &x,
                "--out",
                out,
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    assert_eq!(run(&bom, &d.p("a.st")), run(&graph, &d.p("b.st")));
    let (code, err) = run_plain(
        &d.p(""),
        &["bench", "attn-fwd-none-L64-L128", "--reps", "1"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad attention workload"), "{err}");
    // and `onnx:` without a path names the problem (the message showed a blank file name)
    let (code, err) = run_plain(&d.p(""), &["bench", "onnx:"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("names no model"), "{err}");
}

/// A float flag whose decimal value is nonzero and finite but outside float32's range is
/// refused naming that (exit 2), not parsed to 0 or infinity and then refused for a value
/// the user never typed (`--lr 1e-46` was "learning rate must be finite and > 0, got 0");
/// values inside the range, subnormal ones included, are taken.
#[test]
fn float_flags_outside_float32s_range_are_refused_as_typed() {
    let d = Dir::new("f32range");
    let dir = d.0.to_string_lossy().into_owned();
    for (flag, value) in [
        ("--lr", "1e-46"),
        ("--lr", "3.5e38"),
        ("--momentum", "1e-50"),
        ("--weight-decay", "-4e38"),
    ] {
        let arg = format!("{flag}={value}");
        let (code, err) = run_plain(&dir, &["mlp", "--steps", "1", &arg]);
        assert_eq!(code, Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains("outside float32's range") && err.contains(value),
            "{flag} {value}: {err}"
        );
    }
    let (code, err) = run_plain(
        &dir,
        &["transformer", "--steps", "1", "--dropout", "1e-300"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("outside float32's range"), "{err}");
    let (code, err) = run_plain(&dir, &["quickstart-mlp", "--steps", "1", "--lr", "1e-46"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("outside float32's range"), "{err}");
    let (code, err) = run_plain(&dir, &["quickstart-mlp", "--steps", "1", "--lr", "1e-40"]);
    assert_eq!(
        code,
        Some(0),
        "a subnormal learning rate is a learning rate: {err}"
    );
    // ranges are checked on the value as typed, before rounding to f32 (the forty-third
    // session's audit: --momentum 1.00000001 ran as 1, --dropout 0.99999999 was "got 1")
    let (code, err) = run_plain(
        &dir,
        &[
            "mlp",
            "--steps",
            "1",
            "--optimizer",
            "sgd",
            "--momentum",
            "1.00000001",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("[0, 1]") && err.contains("1.00000001"),
        "{err}"
    );
    let (code, err) = run_plain(
        &dir,
        &["transformer", "--steps", "1", "--dropout", "0.99999999"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("0.99999999") && err.contains("rounds to 1"),
        "{err}"
    );
    // a negative value reaches the flag's own check (clap said "unexpected argument '-0'
    // found" until the forty-fourth session)
    for args in [
        &["mlp", "--steps", "1", "--lr", "-1"][..],
        &["mlp", "--steps", "1", "--weight-decay", "-0.1"],
        &[
            "mlp",
            "--steps",
            "1",
            "--optimizer",
            "sgd",
            "--momentum",
            "-0.5",
        ],
        &["transformer", "--steps", "1", "--dropout", "-0.1"],
        &["quickstart-mlp", "--steps", "1", "--lr", "-0.01"],
    ] {
        let (code, err) = run_plain(&dir, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            !err.contains("unexpected argument") && err.contains(args[args.len() - 1]),
            "{args:?}: {err}"
        );
    }
}

/// Found by the forty-fifth session's hostile-input audit: a text of tens of thousands of
/// distinct characters sized the character model's output layer by them (every Unicode
/// character: 9.4 GB); a truncated checkpoint was described by the parser's variant name
/// (`MetadataIncompleteBuffer`); `fuzz --findings` named a regular file and ran; a tensor
/// name's control characters reached the terminal.
#[test]
fn vocabulary_checkpoint_findings_and_names_are_refused_readably() {
    let d = Dir::new("audit45");
    let text: String = (0x4e00u32..0x4e00 + 70_000)
        .filter_map(char::from_u32)
        .collect();
    std::fs::write(d.p("wide.txt"), text).unwrap();
    let (code, err) = run_plain(
        &d.p(""),
        &["transformer", "--data", "wide.txt", "--steps", "1"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("distinct characters") && err.contains("65536"),
        "{err}"
    );

    // a checkpoint cut short
    let (code, err) = run_plain(&d.p(""), &["mlp", "--steps", "1", "--save", "m.ckpt"]);
    assert_eq!(code, Some(0), "{err}");
    let bytes = std::fs::read(d.p("m.ckpt")).unwrap();
    std::fs::write(d.p("cut.ckpt"), &bytes[..bytes.len() / 2]).unwrap();
    let (code, err) = run_plain(&d.p(""), &["mlp", "--load", "cut.ckpt", "--steps", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        !err.contains("MetadataIncompleteBuffer") && err.contains("byte ranges"),
        "{err}"
    );

    std::fs::write(d.p("notdir"), b"x").unwrap();
    let (code, err) = run_plain(
        &d.p(""),
        &[
            "fuzz",
            "--format",
            "npy",
            "--iterations",
            "1",
            "--findings",
            "notdir",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a folder"), "{err}");
}
