//! End-to-end tests of the training examples through the built `torchlean` binary: each
//! example reaches its stated threshold from its defaults, checkpoints resume exactly, bad
//! checkpoints and data files exit 2 (files untouched), the JSON log and the PNG plot are
//! written, `--device cuda` fails before training, and compiled mode matches eager.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn torchlean(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_torchlean"))
        .args(args)
        .output()
        .expect("run the torchlean binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `step N loss X` lines (stdout is a pipe, so the plain form is printed).
fn step_lines(o: &Output) -> Vec<String> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(str::to_string)
        .collect()
}

fn parse_step(line: &str) -> (u64, f32) {
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((w.len(), w[0], w[2]), (4, "step", "loss"), "{line}");
    (w[1].parse().unwrap(), w[3].parse().unwrap())
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchlean-examples-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn assert_reaches(args: &[&str], steps: u64) {
    let o = torchlean(args);
    assert_eq!(code(&o), 0, "{args:?}\n{}\n{}", stdout(&o), stderr(&o));
    let lines = step_lines(&o);
    assert!(!lines.is_empty(), "{}", stdout(&o));
    let (last_step, last_loss) = parse_step(lines.last().unwrap());
    assert_eq!(last_step, steps);
    assert!(last_loss.is_finite());
    let out = stdout(&o);
    let summary = out
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary line:\n{out}"));
    assert!(
        summary.contains("threshold: ")
            && summary.ends_with(" reached")
            && !summary.contains("NOT"),
        "{args:?}: {summary}"
    );
}

#[test]
fn quickstart_cnn_reaches_its_threshold() {
    assert_reaches(&["quickstart-cnn"], 150);
}

#[test]
fn cnn_reaches_its_threshold() {
    assert_reaches(&["cnn", "--log-every", "50"], 150);
}

#[test]
fn mlp_reaches_its_threshold() {
    assert_reaches(&["mlp"], 300);
}

#[test]
fn transformer_reaches_its_threshold_and_samples() {
    let args = ["transformer", "--log-every", "100", "--sample-len", "30"];
    assert_reaches(&args, 400);
    // the greedy sample is deterministic: run it once more with fewer steps to check format
    let o = torchlean(&["transformer", "--steps", "2", "--sample-len", "30"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("sample (greedy): \""))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no sample:\n{}", stdout(&o)));
    assert!(line.len() > 30, "{line}");
}

#[test]
fn autoencoder_reaches_its_threshold() {
    assert_reaches(&["autoencoder"], 400);
}

#[test]
fn fno1d_reaches_its_threshold() {
    assert_reaches(&["fno1d"], 250);
}

#[test]
fn rnn_gru_and_lstm_reach_their_thresholds() {
    assert_reaches(&["rnn", "--cell", "gru"], 250);
    assert_reaches(&["rnn", "--cell", "lstm"], 250);
}

/// Steps 11..20 of an uninterrupted run equal 10 steps resumed from the checkpoint of step 10.
fn resumes_exactly(example: &[&str], name: &str) {
    resumes_exactly_with(example, &[], name)
}

/// [`resumes_exactly`], with `saved_flags` given to the uninterrupted run and to the one that
/// saves, and not to the resumed one (which must take them from the checkpoint).
fn resumes_exactly_with(example: &[&str], saved_flags: &[&str], name: &str) {
    let dir = scratch(name);
    let ck = dir.join("a.ckpt");
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = example.to_vec();
        a.extend_from_slice(&["--log-every", "1"]);
        a.extend_from_slice(extra);
        let o = torchlean(&a);
        assert_eq!(code(&o), 0, "{a:?}\n{}", stderr(&o));
        step_lines(&o)
    };
    let full = with(&[&["--steps", "20"], saved_flags].concat());
    let first = with(&[&["--steps", "10", "--save", s(&ck)], saved_flags].concat());
    assert_eq!(first, full[..10]);
    let resumed = with(&["--steps", "10", "--load", s(&ck)]);
    assert_eq!(
        resumed,
        full[10..],
        "resumed run differs from the uninterrupted one"
    );
    assert_eq!(parse_step(&resumed[0]).0, 11);
}

/// A resumed run without `--lr` continues with the learning rate of the run that saved (it
/// took the example's default, so `--lr 0.05` then `--load` trained at 0.01).
#[test]
fn a_resumed_run_keeps_the_checkpoints_learning_rate() {
    resumes_exactly_with(&["mlp"], &["--lr", "0.05"], "resume-lr");
    resumes_exactly_with(
        &["transformer", "--sample-len", "0"],
        &["--lr", "0.001"],
        "resume-lr-lm",
    );
}

/// A resumed run without `--batch-size` continues with the checkpoint's batch size, on which
/// each step's batch depends (it took the example's default and trained on other batches,
/// exit 0 — found by the forty-second session's round-trip audit).
#[test]
fn a_resumed_run_keeps_the_checkpoints_batch_size() {
    resumes_exactly_with(&["mlp"], &["--batch-size", "24"], "resume-batch");
    resumes_exactly_with(&["cnn"], &["--batch-size", "12"], "resume-batch-cnn");
    // the transformer's window stride and dropout shape its batches too: a checkpoint of
    // other ones records them in its tag, and a resume with the defaults is refused
    resumes_exactly_with(
        &["transformer", "--sample-len", "0", "--stride", "7"],
        &[],
        "resume-stride",
    );
    let dir = scratch("resume-stride-refused");
    let ck = dir.join("s.ckpt");
    let o = torchlean(&[
        "transformer",
        "--steps",
        "2",
        "--sample-len",
        "0",
        "--stride",
        "7",
        "--save",
        s(&ck),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = torchlean(&[
        "transformer",
        "--steps",
        "2",
        "--sample-len",
        "0",
        "--load",
        s(&ck),
    ]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    assert!(stderr(&o).contains("stride 7"), "{}", stderr(&o));
}

/// A CSV file's label column: by default the column the header names `label` when it is not
/// the last (Kaggle's MNIST layout, whose last pixel was read as the label: 3 "classes" of
/// pixel values here), `--label-column` to choose; an empty choice, or one without --data,
/// is refused.
#[test]
fn the_label_column_follows_the_header_or_the_flag() {
    let dir = scratch("label-column");
    let data = dir.join("k.csv");
    let mut rows = String::from("label,p0,p1,p2\n");
    for i in 0..40 {
        let c = i % 4;
        rows.push_str(&format!("{c},{},{},{}\n", c * 10, 5 - c, i % 3));
    }
    std::fs::write(&data, rows).unwrap();
    let header = |extra: &[&str]| {
        let args = [&["mlp", "--data", s(&data), "--steps", "2"][..], extra].concat();
        let o = torchlean(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        let out = stdout(&o);
        out.lines()
            .find(|l| l.starts_with("mlp: "))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        header(&[]).contains("(40 samples, 4 classes)"),
        "{}",
        header(&[])
    );
    assert!(header(&["--label-column", "label"]).contains("4 classes"));
    assert!(header(&["--label-column", "0"]).contains("4 classes"));
    // the last column (values 0, 1, 2) read as the label: what the default did before
    assert!(header(&["--label-column", "last"]).contains("3 classes"));
    let o = torchlean(&["mlp", "--data", s(&data), "--label-column", ""]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = torchlean(&["mlp", "--label-column", "label"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("needs --data"), "{}", stderr(&o));
}

/// `--steps 0 --load A --save B` writes B (it wrote nothing, exit 0), and B resumes exactly
/// as A does: the model, the optimizer's state, the step and the notes all carried over.
#[test]
fn saving_a_loaded_checkpoint_without_training_writes_it_whole() {
    let dir = scratch("resave");
    let (a, b) = (dir.join("a.ckpt"), dir.join("b.ckpt"));
    let run = |extra: &[&str]| {
        let args = [
            &["mlp", "--optimizer", "adam", "--log-every", "1"][..],
            extra,
        ]
        .concat();
        let o = torchlean(&args);
        assert_eq!(code(&o), 0, "{args:?}\n{}", stderr(&o));
        step_lines(&o)
    };
    run(&["--steps", "10", "--seed", "2", "--save", s(&a)]);
    let none = run(&["--steps", "0", "--load", s(&a), "--save", s(&b)]);
    assert!(none.is_empty());
    assert!(b.exists(), "--steps 0 --save wrote nothing");
    let from_a = run(&["--steps", "5", "--load", s(&a)]);
    let from_b = run(&["--steps", "5", "--load", s(&b)]);
    assert_eq!(from_a.len(), 5);
    assert_eq!(from_a, from_b);
}

/// The seed chose a data file's held-out rows: a checkpoint evaluated without `--seed` uses
/// its own (the held-out figures are the training run's, on the same rows), resumes with its
/// batch order, and another `--seed` is refused (it evaluated a model that had memorized
/// random labels on its training rows: "held-out accuracy" 0.92 where its own split gave
/// chance).
#[test]
fn a_checkpoint_keeps_its_seed_and_refuses_another() {
    resumes_exactly_with(&["mlp"], &["--seed", "3"], "resume-seed");
    let dir = scratch("seed-holdout");
    let data = dir.join("d.csv");
    // random labels: what the model knows of its training rows says nothing of the others
    let mut rows = String::from("a,b,label\n");
    let mut x = 12345u64;
    for _ in 0..300 {
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let (a, b, c) = (next() % 1000, next() % 1000, next() % 3);
        rows.push_str(&format!("{a},{b},{c}\n"));
    }
    std::fs::write(&data, rows).unwrap();
    let ck = dir.join("m.ckpt");
    let summary = |o: &Output| {
        let out = stdout(o);
        let line = out
            .lines()
            .find(|l| l.starts_with("summary:"))
            .unwrap_or_default();
        // "held-out loss L, held-out accuracy A" (then the step count and time)
        let from = line.find("held-out loss").unwrap_or(line.len());
        let to = line[from..]
            .find(" steps in")
            .map_or(line.len(), |e| from + e);
        line[from..to]
            .rsplit_once(", ")
            .map_or("", |(kept, _)| kept)
            .to_string()
    };
    let base = ["mlp", "--data", s(&data), "--hidden", "64"];
    let trained = torchlean(
        &[
            &base[..],
            &["--steps", "200", "--seed", "7", "--save", s(&ck)],
        ]
        .concat(),
    );
    assert_eq!(code(&trained), 0, "{}", stderr(&trained));
    let evaluated = torchlean(&[&base[..], &["--steps", "0", "--load", s(&ck)]].concat());
    assert_eq!(code(&evaluated), 0, "{}", stderr(&evaluated));
    assert!(stdout(&evaluated).contains("note: seed 7 from the checkpoint"));
    // the same held-out rows: the same held-out loss and accuracy as the run that saved
    assert!(!summary(&trained).is_empty(), "{}", stdout(&trained));
    assert_eq!(summary(&evaluated), summary(&trained));
    let other = torchlean(
        &[
            &base[..],
            &["--steps", "0", "--load", s(&ck), "--seed", "8"],
        ]
        .concat(),
    );
    assert_eq!(code(&other), 2);
    assert!(
        stderr(&other).contains("--seed 8 differs from the seed 7"),
        "{}",
        stderr(&other)
    );
    let same = torchlean(
        &[
            &base[..],
            &["--steps", "0", "--load", s(&ck), "--seed", "7"],
        ]
        .concat(),
    );
    assert_eq!(code(&same), 0, "{}", stderr(&same));
    // the same rows in another order choose other held-out rows under the same seed: refused
    // (the forty-sixth session's audit: a shuffled copy scored 0.91 "held out" against 0.48),
    // unless --new-data says so
    let text = std::fs::read_to_string(&data).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1..].reverse();
    let reordered = dir.join("reordered.csv");
    std::fs::write(&reordered, lines.join("\n") + "\n").unwrap();
    let base = ["mlp", "--data", s(&reordered), "--hidden", "64"];
    let moved = torchlean(&[&base[..], &["--steps", "0", "--load", s(&ck)]].concat());
    assert_eq!(code(&moved), 2, "{}", stdout(&moved));
    assert!(
        stderr(&moved).contains("--data differs from the data")
            && stderr(&moved).contains("--new-data"),
        "{}",
        stderr(&moved)
    );
    let asked = torchlean(&[&base[..], &["--steps", "0", "--load", s(&ck), "--new-data"]].concat());
    assert_eq!(code(&asked), 0, "{}", stderr(&asked));
    assert!(stdout(&asked).contains("note: --new-data"));
}

/// The model the last update leaves is checked: an update that makes every output
/// non-finite (finite but huge weights) exits 1 naming the step, without an accuracy over NaN
/// scores and without writing the export (it exited 0 with an all-NaN ONNX file: the
/// forty-sixth session's audit), also where nothing is held out (the transformer).
#[test]
fn a_last_update_that_diverges_exits_1_and_exports_nothing() {
    let dir = scratch("diverged");
    let onnx = dir.join("m.onnx");
    for args in [
        &["mlp", "--optimizer", "sgd", "--lr", "3e38", "--steps", "1"][..],
        &[
            "transformer",
            "--optimizer",
            "sgd",
            "--lr",
            "1e38",
            "--steps",
            "1",
        ],
    ] {
        let o = torchlean(&[args, &["--export", s(&onnx)]].concat());
        assert_eq!(code(&o), 1, "{args:?}: {}\n{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o).contains("the model after step 1 gives non-finite outputs"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!stdout(&o).contains("accuracy 0."), "{}", stdout(&o));
        assert!(!onnx.exists(), "{args:?}: the export was written");
    }
}

/// `--show-backend` runs one step apart (to print what ran); that changes nothing in what is
/// saved or named: a resumed run's save due at a multiple of --save-every is written, and a
/// later failure names the checkpoint the first step wrote (both differed: the forty-sixth
/// session's audit).
#[test]
fn show_backend_saves_and_names_checkpoints_as_the_plain_run() {
    let dir = scratch("show-backend-saves");
    let start = dir.join("start.ckpt");
    assert_eq!(
        code(&torchlean(&["mlp", "--steps", "4", "--save", s(&start)])),
        0
    );
    for show in [false, true] {
        let ck = dir.join(format!("resumed-{show}.ckpt"));
        let mut args = vec![
            "mlp",
            "--load",
            s(&start),
            "--steps",
            "3",
            "--save",
            s(&ck),
            "--save-every",
            "5",
            "--lr",
            "1e30",
        ];
        if show {
            args.push("--show-backend");
        }
        let o = torchlean(&args);
        assert_eq!(code(&o), 1, "{}", stderr(&o));
        assert!(
            ck.is_file(),
            "show {show}: the save due at step 5 was skipped"
        );
        assert!(
            stderr(&o).contains(&format!("resumed-{show}.ckpt")),
            "show {show}: {}",
            stderr(&o)
        );
    }
    let ck = dir.join("every-step.ckpt");
    let o = torchlean(&[
        "mlp",
        "--steps",
        "3",
        "--save",
        s(&ck),
        "--save-every",
        "1",
        "--lr",
        "1e30",
        "--show-backend",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("every-step.ckpt"), "{}", stderr(&o));
}

/// `--optimizer`, `--momentum` and `--weight-decay` choose torch.optim's optimizers; a
/// resumed run takes the checkpoint's optimizer and its flags unless they are given again.
#[test]
fn the_optimizer_flags_choose_the_optimizer_and_a_resumed_run_keeps_it() {
    resumes_exactly_with(
        &["mlp"],
        &[
            "--optimizer",
            "sgd",
            "--momentum",
            "0.9",
            "--lr",
            "0.05",
            "--weight-decay",
            "0.001",
        ],
        "resume-sgd",
    );
    resumes_exactly_with(
        &["rnn"],
        &["--optimizer", "rmsprop", "--lr", "0.002"],
        "resume-rms",
    );
    // the choices differ (each is its own update rule), and each trains
    let mut last = vec![];
    for o in ["adam", "adamw", "sgd", "rmsprop", "adagrad"] {
        let out = torchlean(&["mlp", "--steps", "30", "--lr", "0.05", "--optimizer", o]);
        assert_eq!(code(&out), 0, "{o}: {}", stderr(&out));
        let lines = step_lines(&out);
        let (first, end) = (parse_step(&lines[0]).1, parse_step(lines.last().unwrap()).1);
        assert!(end < first, "{o}: {first} -> {end}");
        last.push(end);
    }
    for i in 0..last.len() {
        for j in 0..i {
            assert_ne!(last[i], last[j], "{last:?}");
        }
    }
    // a flag the optimizer has no use for is refused, not ignored
    for (args, expect) in [
        (
            &["--optimizer", "adam", "--momentum", "0.9"][..],
            "--momentum applies to sgd and rmsprop",
        ),
        (
            &["--weight-decay=-1"][..],
            "--weight-decay must be finite and >= 0",
        ),
        (
            &["--optimizer", "sgd", "--momentum", "1.5"][..],
            "must be in [0, 1], got 1.5",
        ),
    ] {
        let out = torchlean(&[&["mlp", "--steps", "1"], args].concat());
        assert_eq!(code(&out), 2, "{args:?}");
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
    }
}

/// Each optimizer's settings flags (torch.optim's names) reach the optimizer the run prints
/// and trains with, and a resumed run keeps them; a flag the optimizer has no use for, a
/// value outside torch.optim's range, and a resume that would add or remove buffers of the
/// optimizer's state are refused before the first step.
#[test]
fn the_optimizer_settings_flags_reach_the_optimizer_and_a_resumed_run_keeps_them() {
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--optimizer",
                "adam",
                "--betas",
                "0.8,0.95",
                "--eps",
                "1e-6",
                "--amsgrad",
            ],
            "optimizer adam: lr 0.01, betas (0.8, 0.95), eps 1e-6, weight decay 0, amsgrad",
        ),
        (
            &["--optimizer", "sgd", "--momentum", "0.9", "--nesterov"],
            "optimizer sgd: lr 0.01, momentum 0.9, weight decay 0, nesterov",
        ),
        (
            &[
                "--optimizer",
                "rmsprop",
                "--alpha",
                "0.9",
                "--centered",
                "--eps",
                "1e-6",
            ],
            "optimizer rmsprop: lr 0.01, alpha 0.9, eps 1e-6, weight decay 0, momentum 0, centered",
        ),
        (
            &[
                "--optimizer",
                "adagrad",
                "--lr-decay",
                "0.5",
                "--eps",
                "1e-3",
            ],
            "optimizer adagrad: lr 0.01, lr decay 0.5, eps 1e-3",
        ),
    ];
    let losses = |args: &[&str]| {
        let out = torchlean(&[&["mlp", "--steps", "8", "--log-every", "1"], args].concat());
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        (stdout(&out), step_lines(&out))
    };
    for (i, (flags, line)) in cases.iter().enumerate() {
        let (text, with) = losses(flags);
        assert!(text.contains(line), "{flags:?}: {text}");
        // each setting changes the update: the run with only `--optimizer X` differs
        let (_, plain) = losses(&flags[..2]);
        assert_ne!(
            with, plain,
            "{flags:?}: the settings did not reach the optimizer"
        );
        resumes_exactly_with(&["mlp"], flags, &format!("resume-settings-{i}"));
    }
    let dir = scratch("settings-refused");
    let ck = dir.join("a.ckpt");
    let saved = torchlean(&[
        "mlp",
        "--steps",
        "2",
        "--optimizer",
        "rmsprop",
        "--centered",
        "--save",
        s(&ck),
    ]);
    assert_eq!(code(&saved), 0, "{}", stderr(&saved));
    let ams = dir.join("b.ckpt");
    let saved = torchlean(&["mlp", "--steps", "2", "--amsgrad", "--save", s(&ams)]);
    assert_eq!(code(&saved), 0, "{}", stderr(&saved));
    for (args, expect) in [
        (
            &["--optimizer", "sgd", "--betas", "0.9,0.99"][..],
            "--betas applies to adam and adamw; the optimizer is sgd",
        ),
        (
            &["--optimizer", "adam", "--nesterov"][..],
            "--nesterov applies to sgd",
        ),
        (
            &["--optimizer", "adam", "--alpha", "0.9"][..],
            "--alpha applies to rmsprop",
        ),
        (
            &["--optimizer", "sgd", "--eps", "1e-3"][..],
            "--eps applies to adam, adamw, rmsprop and adagrad",
        ),
        (
            &["--optimizer", "sgd", "--nesterov"][..],
            "--nesterov needs --momentum > 0",
        ),
        (&["--betas", "0.9,1"][..], "beta2 must be in [0, 1), got 1"),
        (&["--betas", "0.9"][..], "expected two values B1,B2"),
        (
            &["--optimizer", "rmsprop", "--alpha", "1.5"][..],
            "must be in [0, 1], got 1.5",
        ),
        (&["--eps=-1"][..], "--eps must be finite and >= 0, got -1"),
        (
            &["--optimizer", "adagrad", "--lr-decay=-0.1"][..],
            "--lr-decay must be finite and >= 0",
        ),
        (
            &["--load", s(&ck), "--centered=false"][..],
            "a resume cannot turn centered off",
        ),
        (
            &["--load", s(&ams), "--amsgrad=false"][..],
            "max_exp_avg_sq",
        ),
    ] {
        let out = torchlean(&[&["mlp", "--steps", "1"], args].concat());
        assert_eq!(code(&out), 2, "{args:?}");
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
        assert!(
            !stdout(&out).contains("step 1 loss"),
            "{args:?}: a step ran"
        );
    }
}

#[test]
fn rnn_resumes_from_a_checkpoint() {
    resumes_exactly(&["rnn", "--cell", "lstm"], "resume-rnn");
}

#[test]
fn transformer_resumes_from_a_checkpoint_with_its_schedule() {
    resumes_exactly(&["transformer", "--sample-len", "0"], "resume-lm");
}

#[test]
fn corrupted_or_mismatched_checkpoints_exit_2_and_stay_unchanged() {
    let dir = scratch("corrupt");
    let good = dir.join("good.ckpt");
    let o = torchlean(&["mlp", "--steps", "3", "--save", s(&good)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let bytes = std::fs::read(&good).unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut tail = bytes.clone();
    let n = tail.len();
    tail[n - 5] ^= 0xff; // tensor data: caught by the checksum
    cases.push(("data", tail));
    let mut head = bytes.clone();
    head[20] = b'#'; // header
    cases.push(("header", head));
    cases.push(("truncated", bytes[..bytes.len() / 2].to_vec()));
    for (what, content) in cases {
        let p = dir.join(format!("{what}.ckpt"));
        std::fs::write(&p, &content).unwrap();
        let o = torchlean(&["mlp", "--steps", "3", "--load", s(&p), "--save", s(&p)]);
        assert_eq!(code(&o), 2, "{what}: {}", stderr(&o));
        assert!(stderr(&o).contains("checkpoint"), "{what}: {}", stderr(&o));
        assert!(step_lines(&o).is_empty(), "{what}: trained anyway");
        assert_eq!(std::fs::read(&p).unwrap(), content, "{what}: file changed");
    }
    // a checkpoint of another model
    let o = torchlean(&["mlp", "--hidden", "8", "--steps", "3", "--load", s(&good)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("does not match"), "{}", stderr(&o));
    // of another example: refused before anything is printed as this run's (the
    // checkpoint's learning rate and batch size were announced as this run's, then refused)
    for example in ["cnn", "rnn", "autoencoder", "fno1d"] {
        let o = torchlean(&[example, "--steps", "1", "--load", s(&good)]);
        assert_eq!(code(&o), 2, "{example}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("saved by model `mlp`, this run is model `"),
            "{example}: {}",
            stderr(&o)
        );
        assert_eq!(stdout(&o), "", "{example}: printed before the refusal");
    }
}

#[test]
fn non_finite_loss_exits_1_naming_the_step_and_the_last_checkpoint() {
    let dir = scratch("nan");
    let ck = dir.join("n.ckpt");
    let o = torchlean(&[
        "mlp",
        "--lr",
        "1e30",
        "--steps",
        "20",
        "--save",
        s(&ck),
        "--save-every",
        "1",
    ]);
    assert_eq!(code(&o), 1, "{}\n{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("non-finite loss") && err.contains("at step "),
        "{err}"
    );
    assert!(err.contains("n.ckpt"), "{err}");
    assert!(ck.is_file());
}

#[test]
fn log_writes_json_lines_and_plot_writes_a_png() {
    let dir = scratch("log");
    let (log, png) = (dir.join("log.jsonl"), dir.join("loss.png"));
    let o = torchlean(&[
        "autoencoder",
        "--steps",
        "25",
        "--log-every",
        "10",
        "--log",
        s(&log),
        "--plot",
        s(&png),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = std::fs::read_to_string(&log).unwrap();
    let entries: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    let steps: Vec<u64> = entries
        .iter()
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 10, 20, 25]);
    let printed: Vec<u64> = step_lines(&o).iter().map(|l| parse_step(l).0).collect();
    assert_eq!(printed, steps);
    for e in &entries {
        assert!(e["loss"].as_f64().unwrap().is_finite());
        assert!(e["lr"].as_f64().unwrap() > 0.0);
        assert!(e["elapsed_s"].as_f64().unwrap() >= 0.0);
    }
    let png = std::fs::read(&png).unwrap();
    assert!(png.len() > 100);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn device_cuda_exits_2_before_training() {
    let o = torchlean(&["cnn", "--device", "cuda", "--steps", "5"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(step_lines(&o).is_empty(), "{}", stdout(&o));
    assert!(!stdout(&o).contains("summary:"));
    // every example refuses before it says anything about a run that will not happen (its
    // header, its data): the device is probed first
    for example in [
        "quickstart-mlp",
        "quickstart-cnn",
        "mlp",
        "cnn",
        "transformer",
        "autoencoder",
        "fno1d",
        "rnn",
    ] {
        let o = torchlean(&[example, "--device", "cuda", "--steps", "5"]);
        assert_eq!(code(&o), 2, "{example}: {}", stderr(&o));
        assert_eq!(stdout(&o), "", "{example} printed before refusing");
        assert!(
            stderr(&o).contains("device `cuda`"),
            "{example}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn unknown_flags_exit_2() {
    assert_eq!(code(&torchlean(&["mlp", "--no-such-flag"])), 2);
    assert_eq!(code(&torchlean(&["rnn", "--cell", "tanh"])), 2);
    assert_eq!(code(&torchlean(&["mlp", "--steps", "0"])), 2);
}

#[test]
fn compiled_matches_eager_and_refuses_dropout() {
    // every example command: a graph that froze data (the first batch's token ids, say)
    // departs from eager within a few steps, so 30 steps of every one must agree
    let examples: [&[&str]; 9] = [
        &["quickstart-mlp"],
        &["quickstart-cnn"],
        &["mlp"],
        &["cnn"],
        &["transformer"],
        &["autoencoder"],
        &["fno1d"],
        &["rnn", "--cell", "gru"],
        &["rnn", "--cell", "lstm"],
    ];
    for example in examples {
        let run = |backend: &str| {
            let mut a = example.to_vec();
            a.extend_from_slice(&["--steps", "30", "--log-every", "1", "--backend", backend]);
            let o = torchlean(&a);
            assert_eq!(code(&o), 0, "{a:?} {}", stderr(&o));
            step_lines(&o)
        };
        let eager = run("eager");
        let compiled = run("compiled");
        assert_eq!(eager.len(), 30, "{example:?}");
        assert_eq!(compiled.len(), 30, "{example:?}");
        for (e, c) in eager.iter().zip(&compiled) {
            let ((se, le), (sc, lc)) = (parse_step(e), parse_step(c));
            assert_eq!(se, sc);
            assert!(
                (le - lc).abs() <= 1e-5 * le.abs().max(1.0),
                "{example:?}: {e} vs {c}"
            );
        }
    }
    let o = torchlean(&[
        "transformer",
        "--backend",
        "compiled",
        "--dropout",
        "0.1",
        "--steps",
        "3",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("eager mode"), "{}", stderr(&o));
    assert!(step_lines(&o).is_empty());
}

#[test]
fn show_backend_prints_the_report_and_report_json_is_written() {
    let dir = scratch("report");
    for backend in ["eager", "compiled"] {
        let json = dir.join(format!("{backend}.json"));
        let o = torchlean(&[
            "autoencoder",
            "--steps",
            "3",
            "--log-every",
            "1",
            "--backend",
            backend,
            "--show-backend",
            "--report-json",
            s(&json),
        ]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = stdout(&o);
        let report = out.find("backend report:").expect("report printed");
        assert!(out[report..].contains(&format!("mode={backend}")), "{out}");
        assert!(
            report < out.find("step 2 ").unwrap(),
            "report after training started"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["mode"], backend);
        assert!(!v["kernels"].as_array().unwrap().is_empty());
    }
    // splitting off the first step for the report changes no loss
    let plain = torchlean(&["autoencoder", "--steps", "3", "--log-every", "1"]);
    let shown = torchlean(&[
        "autoencoder",
        "--steps",
        "3",
        "--log-every",
        "1",
        "--show-backend",
    ]);
    assert_eq!(step_lines(&plain), step_lines(&shown));
}

/// An IDX file of u8 values.
fn idx_u8(path: &Path, dims: &[u32], data: &[u8]) {
    let mut b = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

#[test]
fn user_data_files_train_and_bad_ones_exit_2() {
    let dir = scratch("data");
    // a good CSV (header, label last): two separable classes
    let mut csv = String::from("a,b,label\n");
    for i in 0..60 {
        let x = (i as f32) / 60.0;
        csv += &format!("{x},{},{}\n", 1.0 - x, (i % 2));
    }
    let good = dir.join("good.csv");
    std::fs::write(&good, &csv).unwrap();
    let o = torchlean(&["mlp", "--data", s(&good), "--steps", "5"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("threshold: none stated"),
        "{}",
        stdout(&o)
    );

    // a header with numbers for names (pandas' integer column labels): refused by the
    // default detection (the same first line could be a defective data row), read with
    // --csv-header present; --csv-header on an IDX file or without --data is refused
    let numbered = dir.join("numbered.csv");
    std::fs::write(&numbered, csv.replacen("a,b,label", "0,1,label", 1)).unwrap();
    let o = torchlean(&["mlp", "--data", s(&numbered), "--steps", "3"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--csv-header"), "{}", stderr(&o));
    let o = torchlean(&[
        "mlp",
        "--data",
        s(&numbered),
        "--steps",
        "3",
        "--csv-header",
        "present",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("60 samples"), "{}", stdout(&o));
    let o = torchlean(&["mlp", "--steps", "3", "--csv-header", "absent"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));

    // good IDX images 8x8 with the labels sibling, for the CNN
    let n = 20u32;
    let images = dir.join("t-images-idx3-ubyte");
    let pixels: Vec<u8> = (0..n * 64).map(|i| (i * 7 % 256) as u8).collect();
    idx_u8(&images, &[n, 8, 8], &pixels);
    let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
    idx_u8(&dir.join("t-labels-idx1-ubyte"), &[n], &labels);
    let o = torchlean(&["cnn", "--data", s(&images), "--steps", "3"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("3 classes"), "{}", stdout(&o));
    let o = torchlean(&["mlp", "--data", s(&images), "--steps", "3"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = torchlean(&[
        "mlp",
        "--data",
        s(&images),
        "--steps",
        "3",
        "--csv-header",
        "auto",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));

    let write = |name: &str, content: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p
    };
    let bad: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&write("bad.csv", b"1,2,0\n3,x,1\n")).into(),
            ],
            "CSV",
        ),
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&write("empty.csv", b"")).into(),
            ],
            "",
        ),
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&write("frac.csv", b"1,2,0.5\n3,4,1\n")).into(),
            ],
            "label",
        ),
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&write("neg.csv", b"1,2,-1\n3,4,1\n")).into(),
            ],
            "label",
        ),
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&good).into(),
                "--classes".into(),
                "1".into(),
            ],
            "at least 2 classes",
        ),
        (
            vec![
                "mlp".into(),
                "--data".into(),
                s(&dir.join("missing.csv")).into(),
            ],
            "missing.csv",
        ),
        (
            vec!["cnn".into(), "--data".into(), s(&good).into()],
            "square",
        ),
        (
            vec![
                "cnn".into(),
                "--data".into(),
                s(&write("x-images-idx3-ubyte", b"\x00\x00\x08\x03garbage")).into(),
            ],
            "",
        ),
        (
            vec![
                "cnn".into(),
                "--data".into(),
                s(&write("noname.idx", b"\x00\x00\x08\x03")).into(),
            ],
            "--labels",
        ),
        (
            vec![
                "cnn".into(),
                "--data".into(),
                s(&images).into(),
                "--classes".into(),
                "2".into(),
            ],
            "out of range",
        ),
        (
            vec![
                "transformer".into(),
                "--data".into(),
                s(&write("short.txt", b"ab")).into(),
            ],
            "",
        ),
        (
            vec![
                "transformer".into(),
                "--data".into(),
                s(&write("bin.txt", b"\xff\xfe\x00abc")).into(),
            ],
            "UTF-8",
        ),
        (
            vec![
                "transformer".into(),
                "--data".into(),
                s(&dir.join("missing.txt")).into(),
            ],
            "missing.txt",
        ),
    ];
    for (args, needle) in bad {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = torchlean(&a);
        assert_eq!(code(&o), 2, "{a:?}: {}\n{}", stdout(&o), stderr(&o));
        assert!(step_lines(&o).is_empty(), "{a:?}");
        assert!(stderr(&o).starts_with("error: "), "{a:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{a:?}: {}", stderr(&o));
    }
    // labels out of range in the IDX labels file itself (label 9, --classes 4)
    let images2 = dir.join("u-images-idx3-ubyte");
    idx_u8(&images2, &[4, 8, 8], &pixels[..256]);
    idx_u8(&dir.join("u-labels-idx1-ubyte"), &[4], &[0, 1, 9, 2]);
    let o = torchlean(&["cnn", "--data", s(&images2), "--classes", "4"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    // label count that does not match the images
    idx_u8(&dir.join("u-labels-idx1-ubyte"), &[3], &[0, 1, 2]);
    let o = torchlean(&["cnn", "--data", s(&images2)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// The replay checkers do not change results: quickstart-mlp, mlp and transformer print the
/// same loss at every step under `strict_native_cpu` (native kernels, every call replayed)
/// as under `checked_cpu`.
#[test]
fn strict_native_cpu_trains_to_the_checked_cpu_losses() {
    let examples: [&[&str]; 3] = [&["quickstart-mlp"], &["mlp"], &["transformer"]];
    for example in examples {
        let run = |profile: &str| {
            let mut a = example.to_vec();
            a.extend_from_slice(&["--steps", "12", "--profile", profile, "--log-every", "1"]);
            let o = torchlean(&a);
            assert_eq!(code(&o), 0, "{a:?} {}", stderr(&o));
            step_lines(&o)
        };
        let checked = run("checked_cpu");
        let strict = run("strict_native_cpu");
        assert_eq!(checked.len(), 12, "{example:?}");
        assert_eq!(checked, strict, "{example:?}");
    }
}

/// A CSV written as iris usually is (a header, the class by name in the last column) trains:
/// the names are numbered in sorted order and the mapping is printed.
#[test]
fn a_csv_with_class_names_trains_and_prints_the_numbering() {
    let dir = scratch("class-names");
    let mut csv = String::from("a,b,species\n");
    for i in 0..30 {
        let (name, x) = [("virginica", 2.0), ("setosa", -2.0), ("versicolor", 0.0)][i % 3];
        csv.push_str(&format!("{},{},{name}\n", x + 0.01 * i as f32, -x));
    }
    let path = dir.join("named.csv");
    std::fs::write(&path, csv).unwrap();
    let o = torchlean(&["mlp", "--data", s(&path), "--steps", "60", "--lr", "0.05"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("classes from the label column's names (sorted): 0 = setosa, 1 = versicolor, 2 = virginica"),
        "{out}"
    );
    assert!(out.contains("3 classes"), "{out}");
    assert!(out.contains("held-out accuracy 1.0000"), "{out}");
}

/// tract's outputs (an independent ONNX engine) for the file `file` on input `x` (int64 when
/// `ids`).
fn tract_y(file: &Path, x: &torchlean::Tensor, ids: bool) -> Vec<f32> {
    use tract_onnx::prelude::*;
    let model = tract_onnx::onnx()
        .model_for_path(file)
        .expect("tract reads the exported file")
        .into_optimized()
        .unwrap()
        .into_runnable()
        .unwrap();
    let shape = x.shape().to_vec();
    let input: Tensor = if ids {
        let v: Vec<i64> = x.to_vec().iter().map(|&f| f as i64).collect();
        tract_ndarray::ArrayD::from_shape_vec(shape, v)
            .unwrap()
            .into()
    } else {
        tract_ndarray::ArrayD::from_shape_vec(shape, x.to_vec())
            .unwrap()
            .into()
    };
    let out = model.run(tvec!(input.into())).unwrap();
    out[0]
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .copied()
        .collect()
}

/// `run-graph` and tract (an independent ONNX engine) compute the same `y` from `x` on the
/// exported `file`; returns tract's.
fn run_graph_agrees_with_tract(
    d: &Path,
    file: &Path,
    x: &torchlean::Tensor,
    ids: bool,
    what: &str,
) -> Vec<f32> {
    let (inputs, out) = (d.join("in.safetensors"), d.join("out.safetensors"));
    // (token ids as exact f32 integers: run-graph converts them to the declared int64)
    torchlean::tensor::io::write_safetensors(&inputs, &[("x".to_string(), x.clone())], None)
        .unwrap();
    let o = torchlean(&[
        "run-graph",
        s(file),
        "--inputs",
        s(&inputs),
        "--out",
        s(&out),
    ]);
    assert_eq!(code(&o), 0, "{what}: {}", stderr(&o));
    let got = torchlean::tensor::io::read_safetensors(&out).unwrap();
    let y = &got.iter().find(|(n, _)| n == "y").expect("output y").1;
    let want = tract_y(file, x, ids);
    assert_eq!(y.numel(), want.len(), "{what}");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in y.to_vec().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}: y[{i}] {g} vs tract {w}"
        );
    }
    want
}

/// `quickstart-mlp --export` writes the model it trained: tract, on the file, computes what
/// the same model trained through the library (the documented setup: MLP 4-64-64-1 tanh
/// from the seed, Adam, the synthetic task of seed + 17) computes on the first batch; the
/// file is that of the run's own forward, under its session (run-graph agrees).
#[test]
fn quickstart_mlp_exports_the_model_it_trained() {
    use torchlean::nn::{Activation, Adam, Mlp, Module};
    let d = scratch("export-quickstart");
    let file = d.join("q.onnx");
    let o = torchlean(&[
        "quickstart-mlp",
        "--steps",
        "7",
        "--seed",
        "3",
        "--batch-size",
        "16",
        "--export",
        s(&file),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("input `x` [16, 4]"), "{}", stdout(&o));
    let profile = torchlean::backend::BackendProfile::named("checked_cpu").unwrap();
    torchlean::runtime::install(torchlean::runtime::Session::new(profile)).unwrap();
    let mut model = Mlp::new(&[4, 64, 64, 1], Activation::Tanh, 3).unwrap();
    let data = torchlean::nn::tasks::SyntheticRegression::new(1024, 20).unwrap();
    let mut opt = Adam::new(0.01).unwrap();
    torchlean::nn::train::train_regression(&mut model, &mut opt, &data, 7, 16, 0, |_| {}).unwrap();
    let (x, _) = data.batch(0, 16).unwrap();
    let want = model.forward(&x).unwrap().to_vec();
    let got = run_graph_agrees_with_tract(&d, &file, &x, false, "quickstart-mlp");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "y[{i}] {g} vs {w}");
    }
    // and an untrained model is not that
    let fresh = Mlp::new(&[4, 64, 64, 1], Activation::Tanh, 3).unwrap();
    let before = fresh.forward(&x).unwrap().to_vec();
    assert!(before.iter().zip(&want).any(|(b, w)| (b - w).abs() > 1e-3));
}

/// `--export` writes the trained model: the file written at the end of a run is the one
/// exported from its checkpoint with `--load … --steps 0` (byte for byte) and not one of a
/// model trained fewer steps, and tract (an independent ONNX engine) computes on it what
/// `run-graph` does, for every example whose ops export (the transformer's input is int64
/// token ids; dropout is off: a random op would be refused); fno1d, whose spectral
/// convolution has no ONNX form, is refused before its first step.
#[test]
fn export_writes_the_trained_model_as_onnx() {
    let d = scratch("export");
    let text = d.join("t.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(30),
    )
    .unwrap();
    let cases: [(&str, &[&str], bool); 5] = [
        ("mlp", &[], false),
        ("cnn", &[], false),
        ("autoencoder", &[], false),
        ("rnn", &["--cell", "lstm"], false),
        ("transformer", &["--data", s(&text)], true),
    ];
    for (example, extra, ids) in cases {
        let (ck, a, b, early) = (
            d.join(format!("{example}.ck")),
            d.join(format!("{example}-a.onnx")),
            d.join(format!("{example}-b.onnx")),
            d.join(format!("{example}-early.onnx")),
        );
        let run = |args: &[&str]| {
            let mut all = vec![example];
            all.extend_from_slice(extra);
            all.extend_from_slice(args);
            let o = torchlean(&all);
            assert_eq!(code(&o), 0, "{all:?}\n{}\n{}", stdout(&o), stderr(&o));
            o
        };
        let o = run(&["--steps", "6", "--save", s(&ck), "--export", s(&a)]);
        assert!(
            stdout(&o).contains("exported the trained model to"),
            "{}",
            stdout(&o)
        );
        run(&["--load", s(&ck), "--steps", "0", "--export", s(&b)]);
        run(&["--steps", "2", "--export", s(&early)]);
        let bytes = std::fs::read(&a).unwrap();
        assert_eq!(
            bytes,
            std::fs::read(&b).unwrap(),
            "{example}: export after --load differs"
        );
        assert_ne!(
            bytes,
            std::fs::read(&early).unwrap(),
            "{example}: 2 and 6 steps export alike"
        );
        // an input of the declared shape: run-graph and tract on the same file
        let shape: Vec<usize> = {
            let text = stdout(&o);
            let at = text.find("input `x` [").expect("input shape printed") + "input `x` [".len();
            text[at..text[at..].find(']').unwrap() + at]
                .split(", ")
                .map(|n| n.parse().unwrap())
                .collect()
        };
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|i| {
                if ids {
                    (i % 7) as f32
                } else {
                    ((i * 37 % 101) as f32 / 50.0) - 1.0
                }
            })
            .collect();
        let x = torchlean::Tensor::from_vec(values, &shape).unwrap();
        run_graph_agrees_with_tract(&d, &a, &x, ids, example);
    }
    let o = torchlean(&["fno1d", "--steps", "3", "--export", s(&d.join("f.onnx"))]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    assert!(stderr(&o).contains("spectral_conv1d"), "{}", stderr(&o));
    assert!(
        step_lines(&o).is_empty(),
        "fno1d trained before refusing: {}",
        stdout(&o)
    );
    assert!(!d.join("f.onnx").exists());
}

/// The report of a run lists the kernels the command itself ran to build its data (the
/// autoencoder's manifold: `matmul`, `scale`, `tanh` under the run's profile), which were
/// gated but missing from the report (an audit of the thirty-sixth session).
#[test]
fn the_report_lists_the_kernels_that_built_the_data() {
    let d = scratch("data-kernels");
    let report = d.join("r.json");
    let o = torchlean(&[
        "autoencoder",
        "--steps",
        "2",
        "--profile",
        "strict_native_cpu",
        "--report-json",
        s(&report),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = std::fs::read_to_string(&report).unwrap();
    for capsule in ["native_cpu.replayed.matmul", "native_cpu.replayed.scale"] {
        assert!(
            text.contains(&format!("\"{capsule}\"")),
            "{capsule} missing: {text}"
        );
    }
}

/// `--show-backend` (which runs the first step apart, to print the report of what ran) changes
/// nothing else: the same steps logged to stdout and to `--log`, the same checkpoint with
/// `--save-every 1` (the split run skipped step 1's save and logged step 2 besides before the
/// thirty-seventh session).
#[test]
fn show_backend_changes_nothing_saved_or_logged() {
    let d = scratch("show-backend-split");
    let run = |tag: &str, show: bool| {
        let (ck, log) = (d.join(format!("{tag}.ck")), d.join(format!("{tag}.log")));
        let mut args = vec![
            "mlp",
            "--steps",
            "5",
            "--log-every",
            "3",
            "--save-every",
            "1",
            "--save",
            s(&ck),
            "--log",
            s(&log),
        ];
        if show {
            args.push("--show-backend");
        }
        let o = torchlean(&args);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        (
            step_lines(&o),
            std::fs::read_to_string(&log).unwrap(),
            std::fs::read(&ck).unwrap(),
        )
    };
    let (plain_steps, plain_log, plain_ck) = run("plain", false);
    let (shown_steps, shown_log, shown_ck) = run("shown", true);
    assert_eq!(plain_steps, shown_steps);
    let steps = |log: &str| -> Vec<u64> {
        log.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(steps(&plain_log), vec![1, 3, 5]);
    assert_eq!(steps(&shown_log), steps(&plain_log));
    assert_eq!(plain_ck, shown_ck, "the checkpoints differ");
}

/// An evaluation-only run (`--load … --steps 0 --show-backend`) prints the report of the
/// kernels the evaluation ran: it printed a header with no rows (the report "after the
/// first step", of which there was none), while `--report-json` listed them. The forty-third
/// session's trust audit.
#[test]
fn an_evaluation_only_run_shows_the_kernels_it_ran() {
    let d = scratch("eval-only-report");
    let ck = d.join("m.ck");
    let o = torchlean(&["mlp", "--steps", "2", "--save", s(&ck)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let json = d.join("r.json");
    let o = torchlean(&[
        "mlp",
        "--load",
        s(&ck),
        "--steps",
        "0",
        "--show-backend",
        "--report-json",
        s(&json),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let shown: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" provider=") && !l.starts_with("backend report"))
        .collect();
    assert!(shown.iter().any(|l| l.starts_with("linear:")), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["kernels"].as_array().map_or(0, |a| a.len());
    assert_eq!(
        shown.len(),
        rows,
        "the text shows {} rows, the JSON {rows}: {out}",
        shown.len()
    );
}

/// One report row per kernel in a training run's report: the autoencoder's `tanh`, called
/// under `no_grad` by its data generation and on the tape by training, was two rows, and the
/// transformer's composite attention under `prefer:torchlean` listed its parts twice, the
/// second time after the optimizer's rows (an audit of the forty-fourth session). Each
/// (op, capsule, composite) appears once, and a part row follows its composite's row or
/// another part of it. The evaluation-only header says no compiled step ran.
#[test]
fn a_training_report_lists_each_kernel_once_with_parts_under_their_composite() {
    let d = scratch("report-rows");
    for (example, extra) in [
        ("autoencoder", &["--backend", "eager"][..]),
        ("autoencoder", &["--backend", "compiled"][..]),
        (
            "transformer",
            &["--backend", "compiled", "--provider", "prefer:torchlean"][..],
        ),
        (
            "transformer",
            &["--backend", "eager", "--provider", "prefer:torchlean"][..],
        ),
    ] {
        let json = d.join("r.json");
        let mut args = vec![example, "--steps", "2", "--report-json", s(&json)];
        args.extend_from_slice(extra);
        let o = torchlean(&args);
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let rows = report["kernels"].as_array().unwrap();
        let key = |r: &serde_json::Value| format!("{} {} {}", r["op"], r["capsule"], r["part_of"]);
        let mut seen = std::collections::HashSet::new();
        for (i, r) in rows.iter().enumerate() {
            assert!(seen.insert(key(r)), "{args:?}: row {i} repeats {}", key(r));
            if let Some(c) = r["part_of"].as_str() {
                let before = &rows[i - 1];
                assert!(
                    before["capsule"].as_str() == Some(c) || before["part_of"].as_str() == Some(c),
                    "{args:?}: part row {i} ({}) is not under its composite {c}",
                    key(r)
                );
            }
        }
    }
    // an evaluation-only run under --backend compiled runs no compiled step: the header says so
    let ck = d.join("a.ck");
    let o = torchlean(&["autoencoder", "--steps", "1", "--save", s(&ck)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = torchlean(&[
        "autoencoder",
        "--load",
        s(&ck),
        "--steps",
        "0",
        "--backend",
        "compiled",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("eager evaluation (no compiled step to run)"),
        "{}",
        stdout(&o)
    );
}

/// A run resumed from a checkpoint saves the file a straight run saves, byte for byte, for
/// every optimizer: SGD and RMSprop, which keep no per-parameter step counts, wrote every
/// parameter's count as the loaded step after a resume (an audit of the thirty-seventh
/// session: the weights and moments were right, the file stated false counts).
#[test]
fn a_resumed_run_saves_the_straight_runs_checkpoint() {
    let d = scratch("resume-bytes");
    for (opt, extra) in [
        ("sgd", &["--momentum", "0.9"][..]),
        ("rmsprop", &["--momentum", "0.9"][..]),
        ("adam", &[][..]),
        ("adagrad", &[][..]),
    ] {
        let (full, half, resumed) = (
            d.join(format!("{opt}-full.ck")),
            d.join(format!("{opt}-half.ck")),
            d.join(format!("{opt}-resumed.ck")),
        );
        let run = |args: &[&str]| {
            let mut all = vec!["mlp", "--optimizer", opt];
            all.extend_from_slice(extra);
            all.extend_from_slice(args);
            let o = torchlean(&all);
            assert_eq!(code(&o), 0, "{all:?}: {}", stderr(&o));
        };
        run(&["--steps", "4", "--save", s(&full)]);
        run(&["--steps", "2", "--save", s(&half)]);
        run(&["--steps", "2", "--load", s(&half), "--save", s(&resumed)]);
        assert_eq!(
            std::fs::read(&full).unwrap(),
            std::fs::read(&resumed).unwrap(),
            "{opt}: the resumed run's checkpoint differs from the straight run's"
        );
    }
}

/// A checkpoint trained on a data file records it (features per sample, classes): resuming
/// it without `--data` trained and evaluated on the synthetic data instead, exit 0 (the
/// forty-third session's CLI audit), and a synthetic checkpoint loaded with `--data` of the
/// same shape did the reverse. Both are refused; the same data resumes.
#[test]
fn a_checkpoint_of_a_data_file_resumes_only_on_data_of_its_shape() {
    let d = scratch("data-tag");
    let csv = d.join("xy.csv");
    let rows: String = (0..40)
        .map(|i| {
            let (x, y) = ((i % 7) as f32 / 7.0 - 0.5, (i % 5) as f32 / 5.0 - 0.5);
            format!("{x},{y},{}\n", (x * y > 0.0) as u8)
        })
        .collect();
    std::fs::write(&csv, rows).unwrap();
    let (file_ck, synth_ck) = (d.join("file.ck"), d.join("synth.ck"));
    let o = torchlean(&[
        "mlp",
        "--data",
        s(&csv),
        "--steps",
        "2",
        "--save",
        s(&file_ck),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = torchlean(&["mlp", "--steps", "2", "--save", s(&synth_ck)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = torchlean(&["mlp", "--load", s(&file_ck), "--steps", "1"]);
    assert_ne!(
        code(&o),
        0,
        "resumed a data file's checkpoint on the synthetic data"
    );
    assert!(stderr(&o).contains("data file"), "{}", stderr(&o));
    let o = torchlean(&[
        "mlp",
        "--data",
        s(&csv),
        "--load",
        s(&synth_ck),
        "--steps",
        "1",
    ]);
    assert_ne!(code(&o), 0, "resumed a synthetic checkpoint on a data file");
    let o = torchlean(&[
        "mlp",
        "--data",
        s(&csv),
        "--load",
        s(&file_ck),
        "--steps",
        "1",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A run that fails after kernels ran (here SGD's rate 1e30 makes the second step's loss
/// NaN) still writes the report asked for: `--report-json` lists the kernels that ran and
/// `--show-backend` prints them (a failed run wrote none: the trust audit); exit 1 as before.
/// Its verdict is `stopped`, with the reason: a report of a run that did not finish said
/// `accepted`, also after a planning refusal (the fifty-first session's trust audit). And
/// settings the optimizer cannot honour (Adam's step size lr / (1 − β₁) overflowing f32) are
/// refused before any kernel (they failed at the first update, after its forward and
/// backward kernels).
#[test]
fn a_failed_run_still_reports_what_ran() {
    let d = scratch("failed-report");
    let json = d.join("r.json");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&json).expect("a report")).unwrap()
    };
    let o = torchlean(&[
        "mlp",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
        "--steps",
        "5",
        "--show-backend",
        "--report-json",
        s(&json),
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("non-finite loss"), "{}", stderr(&o));
    let report = read();
    let kernels = report["kernels"].as_array().map_or(0, |a| a.len());
    assert!(kernels > 0, "{report}");
    assert_eq!(report["verdict"], "stopped", "{report}");
    assert!(
        report["stopped"]
            .as_str()
            .is_some_and(|w| w.contains("non-finite loss")),
        "{report}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("before the failure")
            && out.contains("linear:")
            && out.contains("verdict=stopped"),
        "{out}"
    );
    // a planning refusal: no kernel ran, and the report does not say accepted
    std::fs::remove_file(&json).unwrap();
    let o = torchlean(&[
        "mlp",
        "--steps",
        "2",
        "--provider",
        "only:torchlean",
        "--policy",
        "checked-runtime",
        "--report-json",
        s(&json),
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let report = read();
    assert_eq!(report["verdict"], "stopped", "{report}");
    assert_eq!(report["kernels"].as_array().map_or(1, |a| a.len()), 0);
    assert!(
        report["stopped"]
            .as_str()
            .is_some_and(|w| w.contains("no admissible capsule")),
        "{report}"
    );
    // settings refused before any kernel: no step, no report of kernels
    std::fs::remove_file(&json).unwrap();
    let o = torchlean(&[
        "mlp",
        "--lr",
        "3e38",
        "--steps",
        "5",
        "--report-json",
        s(&json),
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("step size"), "{}", stderr(&o));
    assert!(!stdout(&o).contains("step 1 loss"), "{}", stdout(&o));
}

/// A data file of fewer than 10 samples holds none out: the summary calls its evaluation the
/// training set's and says nothing was held out (it said "held-out loss / accuracy" of the
/// rows the model had trained on: the CLI audit); ten samples or more keep "held-out".
#[test]
fn a_file_too_small_to_hold_out_is_not_called_held_out() {
    let d = scratch("small-holdout");
    let small = d.join("small.csv");
    std::fs::write(
        &small,
        "a,b,label\n0.1,0.2,0\n0.3,0.4,1\n0.5,0.1,0\n0.9,0.7,1\n",
    )
    .unwrap();
    let o = torchlean(&["mlp", "--data", s(&small), "--steps", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let summary = stdout(&o)
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_default()
        .to_string();
    assert!(!summary.contains("held-out loss"), "{summary}");
    assert!(
        summary.contains("training-set accuracy") && summary.contains("nothing held out"),
        "{summary}"
    );
    let big = d.join("big.csv");
    let rows: String = (0..20)
        .map(|i| format!("{},{},{}\n", i as f32 / 20.0, 0.5, i % 2))
        .collect();
    std::fs::write(&big, format!("a,b,label\n{rows}")).unwrap();
    let o = torchlean(&["mlp", "--data", s(&big), "--steps", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("held-out accuracy"), "{}", stdout(&o));
}

/// `--momentum` on a resume that turns momentum on or off is refused naming the flag and the
/// checkpoint's value, except SGD's 0 → m (its buffers start on the next step, as PyTorch's);
/// it failed on the optimizer state's slots with messages about buffers (RMSprop 0 → 0.5,
/// either → 0), and the note said the flag overrides the checkpoint (the CLI audit). Another
/// nonzero momentum resumes.
#[test]
fn a_resume_cannot_turn_momentum_on_or_off_except_sgds_start() {
    let d = scratch("momentum-resume");
    let ck = |name: &str, opt: &str, m: &str| {
        let p = d.join(name);
        let o = torchlean(&[
            "mlp",
            "--steps",
            "2",
            "--optimizer",
            opt,
            "--momentum",
            m,
            "--save",
            s(&p),
        ]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        p
    };
    let (sgd0, sgd9, rms0, rms5) = (
        ck("sgd0.ck", "sgd", "0"),
        ck("sgd9.ck", "sgd", "0.9"),
        ck("rms0.ck", "rmsprop", "0"),
        ck("rms5.ck", "rmsprop", "0.5"),
    );
    let resume = |p: &std::path::Path, m: &str| {
        torchlean(&["mlp", "--steps", "1", "--load", s(p), "--momentum", m])
    };
    for (p, m, ok) in [
        (&sgd0, "0.9", true),
        (&sgd9, "0.5", true),
        (&sgd9, "0", false),
        (&rms0, "0.5", false),
        (&rms5, "0", false),
        (&rms5, "0.3", true),
    ] {
        let o = resume(p, m);
        if ok {
            assert_eq!(code(&o), 0, "{} {m}: {}", p.display(), stderr(&o));
        } else {
            assert_eq!(code(&o), 2, "{} {m}: {}", p.display(), stderr(&o));
            assert!(
                stderr(&o).contains("--momentum") && stderr(&o).contains("cannot turn momentum"),
                "{}",
                stderr(&o)
            );
        }
    }
}

/// Parameters loaded with `--load` were computed by earlier runs, whose kernels a report
/// cannot list: the report says which profiles trained them (checkpoints record the
/// profiles and the step each took over), so a strict resume of a checked run does not
/// look verified end to end (it listed only `reference.*` rows: the trust audit). A run
/// without `--load` says nothing of the kind.
#[test]
fn a_resumed_runs_report_names_the_profiles_that_trained_its_parameters() {
    let d = scratch("profile-history");
    let (ck1, ck2, json) = (d.join("1.ckpt"), d.join("2.ckpt"), d.join("r.json"));
    let run = |args: &[&str]| {
        let o = torchlean(&[&["mlp", "--steps", "3"], args].concat());
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let fresh = run(&[
        "--profile",
        "checked_cpu",
        "--save",
        s(&ck1),
        "--report-json",
        s(&json),
    ]);
    assert!(fresh.get("outside_gate").is_none(), "{fresh}");
    let resumed = run(&[
        "--profile",
        "strict_cpu",
        "--load",
        s(&ck1),
        "--save",
        s(&ck2),
        "--report-json",
        s(&json),
    ]);
    let line = resumed["outside_gate"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("3 steps: checked_cpu [checked-runtime] from step 0"),
        "{resumed}"
    );
    let again = run(&["--load", s(&ck2), "--report-json", s(&json)]);
    let line = again["outside_gate"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains(
            "6 steps: checked_cpu [checked-runtime] from step 0; strict_cpu [strict] from step 3"
        ),
        "{again}"
    );
}
