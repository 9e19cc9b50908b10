//! The `torchlean` command: outputs and exit codes.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_torchlean"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The 68 TorchLean backend op names (shared/reference/torchlean-ops.md).
const TORCHLEAN_OPS: &[&str] = &[
    "rand_uniform",
    "bernoulli_mask",
    "add",
    "sub",
    "mul",
    "scale",
    "abs",
    "sqrt",
    "clamp",
    "max",
    "min",
    "relu",
    "gelu",
    "sigmoid",
    "tanh",
    "softplus",
    "exp",
    "log",
    "sin",
    "cos",
    "inv",
    "safe_log",
    "log_softmax",
    "softmax",
    "sum",
    "reduce_sum",
    "reduce_mean",
    "flatten",
    "reshape",
    "permute",
    "transpose2d",
    "swap_adjacent_at_depth",
    "transpose3d_first_to_last",
    "transpose3d_last_to_first",
    "transpose3d_last_two",
    "broadcast_to",
    "concat_vectors",
    "concat_leading_axis",
    "slice_leading_axis_range",
    "gather_scalar",
    "gather_scalar_nat",
    "gather_row",
    "gather_vec_nat",
    "gather_rows_nat",
    "scatter_add_vec",
    "scatter_add_row",
    "matmul",
    "bmm",
    "linear",
    "mse_loss",
    "layer_norm",
    "batch_norm",
    "batch_norm_channel_first",
    "conv",
    "conv2d",
    "conv_transpose",
    "conv_transpose2d",
    "max_pool",
    "max_pool2d",
    "max_pool2d_pad",
    "smooth_max_pool",
    "smooth_max_pool2d",
    "avg_pool",
    "avg_pool2d",
    "avg_pool2d_pad",
    "fft_fno",
    "selective_scan",
    "scaled_dot_product_attention",
];

#[test]
fn ops_json_covers_all_68_torchlean_names_on_both_cpu_providers() {
    assert_eq!(TORCHLEAN_OPS.len(), 68);
    let (code, out, _) = run(&["ops", "--json"]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let rows = rows.as_array().expect("an array");
    for name in TORCHLEAN_OPS {
        let row = rows.iter().find(|r| {
            r["torchlean_names"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == name)
        });
        let row = row.unwrap_or_else(|| panic!("TorchLean op `{name}` is not covered"));
        let providers: Vec<&str> = row["providers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        assert!(
            providers.contains(&"reference") && providers.contains(&"native_cpu"),
            "{name}: {providers:?}"
        );
        let mut once = providers.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(
            once.len(),
            providers.len(),
            "{name}: a provider listed twice: {providers:?}"
        );
        assert!(row["name"].is_string());
    }
}

#[test]
fn quickstart_mlp_trains_and_converges() {
    let (code, out, err) = run(&["quickstart-mlp", "--steps", "200"]);
    assert_eq!(code, 0, "{err}");
    let losses: Vec<f32> = out
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .map(|l| l.split(" loss ").nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(losses.len() >= 10, "{out}");
    assert!(losses[0] / losses.last().unwrap() >= 10.0, "{out}");
}

/// `plan` and a run with the same settings give the same verdict: an eager plan plans and
/// gates an admitted composite's parts too (it accepted `composed_attention` under
/// `only:torchlean` while a run refused its `permute`), and a run names every op that
/// cannot be planned (exit 2) before any gate verdict (exit 3) — it returned the first
/// failure of either kind, in op order (the trust audit of the thirty-eighth session).
#[test]
fn plan_and_run_agree_on_composites_parts_and_on_the_verdict() {
    let only = ["--provider", "only:torchlean"];
    let checked = ["--policy", "checked-runtime"];
    let (code, out, err) = run(&[
        &[
            "plan",
            "--ops",
            "scaled_dot_product_attention",
            "--vjp",
            "none",
        ][..],
        &only,
        &checked,
    ]
    .concat());
    assert_eq!(code, 2, "{err}");
    assert!(
        out.contains("no admissible capsule for op `permute`"),
        "{out}"
    );
    let (code, _, err) = run(&[
        &["bench", "attn-fwd-causal-L32-B1", "--reps", "1"][..],
        &only,
        &checked,
    ]
    .concat());
    assert_eq!(code, 2, "{err}");
    // accepted, with the parts as rows nested under the composite
    let (code, out, err) = run(&[
        "plan",
        "--ops",
        "mse_loss",
        "--provider",
        "prefer:torchlean",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json");
    let parts: Vec<&str> = report["kernels"]
        .as_array()
        .expect("kernels")
        .iter()
        .filter(|k| k["part_of"] == "torchlean.mse_loss")
        .filter_map(|k| k["capsule"].as_str())
        .collect();
    assert!(
        parts.contains(&"native_cpu.sub") && parts.contains(&"native_cpu.sum_all"),
        "{out}"
    );
    // under strict, sdpa is rejected by the gate and mul / sum_all cannot be planned: plan
    // and run both say "planning failed" (exit 2), naming the unplannable ops
    let strict = ["--policy", "strict"];
    let (pcode, pout, perr) = run(&[
        &["plan", "--ops", "scaled_dot_product_attention,mul,sum_all"][..],
        &only,
        &strict,
    ]
    .concat());
    let (rcode, _, rerr) = run(&[
        &["bench", "attn-step-mask-L32-B1", "--reps", "1"][..],
        &only,
        &strict,
    ]
    .concat());
    assert_eq!((pcode, rcode), (2, 2), "plan: {perr}\nrun: {rerr}");
    for op in ["mul", "sum_all"] {
        let says = format!("no admissible capsule for op `{op}`");
        assert!(
            pout.contains(&says) && rerr.contains(&says),
            "{pout}\n{rerr}"
        );
    }
}

/// A `--policy` given with a TF32 profile keeps the profile's opt-in (it was dropped without
/// a word: f32 products planned, and the run went on on the CPU where the profile alone is
/// refused); under strict, which admits no TF32 capsule, it is refused.
#[test]
fn a_policy_override_keeps_or_refuses_a_profiles_tf32_opt_in() {
    let tf32 = ["--profile", "checked_cuda_tf32"];
    let (code, out, err) = run(&[
        &["plan", "--ops", "linear", "--policy", "checked-runtime"][..],
        &tf32,
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("linear -> cublas.tf32.linear"), "{out}");
    let (code, out, err) = run(&[
        &[
            "quickstart-mlp",
            "--steps",
            "1",
            "--device",
            "cpu",
            "--policy",
            "checked-runtime",
        ][..],
        &tf32,
    ]
    .concat());
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("exist on device `cuda` only"), "{err}");
    let (code, _, err) = run(&[
        &["plan", "--ops", "linear", "--policy", "strict"][..],
        &tf32,
    ]
    .concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("never admits"), "{err}");
}

/// On CUDA, attention plans the deterministic flash capsule (under `auto` and
/// `prefer:native_cuda`); `--allow-nondeterministic` plans the atomic one, and its policy's
/// name says so; the opt-in is refused where nothing could honour it (the CPU, strict).
#[test]
fn attention_on_cuda_is_deterministic_unless_the_user_opts_out() {
    let ops = [
        "plan",
        "--ops",
        "scaled_dot_product_attention",
        "--device",
        "cuda",
    ];
    for provider in ["auto", "prefer:native_cuda"] {
        let (code, out, err) = run(&[&ops[..], &["--provider", provider]].concat());
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("scaled_dot_product_attention: native_cuda.flash_attention provider="),
            "{provider}: {out}"
        );
    }
    let (code, out, err) = run(&[&ops[..], &["--allow-nondeterministic"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("scaled_dot_product_attention: native_cuda.flash_attention_atomic provider="),
        "{out}"
    );
    assert!(
        out.contains("policy=checked-runtime+nondeterministic"),
        "{out}"
    );
    assert!(out.contains("runtime=eager nondeterministic"), "{out}");
    let (code, _, err) = run(&[
        "plan",
        "--ops",
        "scaled_dot_product_attention",
        "--allow-nondeterministic",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exist on device `cuda` only"), "{err}");
    let (code, _, err) = run(&[
        &ops[..],
        &[
            "--profile",
            "strict_native_cuda",
            "--allow-nondeterministic",
        ],
    ]
    .concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("strict never plans one"), "{err}");
}

/// A library the loader finds under a CUDA library's name that is not one (here the C math
/// library copied under every name; likewise a driver too old for the build) is refused with
/// exit 2 naming the missing entry point, before any kernel: cudarc resolves each symbol at
/// its first call and panicked (exit 101, a backtrace) — found by the forty-second session's
/// audit of the flags. Skipped, saying so, where no libm is found to copy (a machine with a
/// real CUDA driver on its path would find that one first: the test sets only
/// LD_LIBRARY_PATH).
#[test]
fn a_library_that_is_not_cudas_is_refused_cleanly() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(libm) = libm else {
        eprintln!("skipped: no libm.so.6 to copy under the CUDA libraries' names");
        return;
    };
    let dir = std::env::temp_dir().join(format!("torchlean-fakecuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "libcuda.so",
        "libcuda.so.1",
        "libnvrtc.so",
        "libcublas.so",
        "libcublasLt.so",
        "libcufft.so",
    ] {
        std::fs::copy(libm, dir.join(name)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_torchlean"))
        .args(["quickstart-mlp", "--device", "cuda", "--steps", "2"])
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("the binary runs");
    let (out_s, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if err.contains("CUDA driver reports") || out_s.contains("step ") {
        eprintln!("skipped: a real CUDA driver was found before the copies");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!out_s.contains("step "), "trained anyway: {out_s}");
    assert!(
        err.contains("is not a usable one") && err.contains("lacks `cuInit`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn cuda_request_exits_2_before_any_kernel_runs() {
    for device in ["cuda", "gpu", "metal", "tpu"] {
        let (code, out, err) = run(&["quickstart-mlp", "--device", device, "--steps", "3"]);
        assert_eq!(code, 2, "{device}: {err}");
        assert!(!out.contains("step "), "{device}: trained anyway: {out}");
        // the device probe runs before planning: the refusal names what is missing
        assert!(err.contains("is not available"), "{device}: {err}");
        if device == "cuda" || device == "gpu" {
            assert!(
                err.contains("device `cuda`") && err.contains("libcuda"),
                "{err}"
            );
        } else {
            assert!(err.contains("no provider module"), "{device}: {err}");
        }
    }
    let (code, _, err) = run(&["quickstart-mlp", "--device", "quantum"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown device"), "{err}");
}

#[test]
fn strict_cpu_trains_on_the_reference_provider_and_reports_it() {
    let path = std::env::temp_dir().join(format!("torchlean-report-{}.json", std::process::id()));
    let (code, out, err) = run(&[
        "quickstart-mlp",
        "--profile",
        "strict_cpu",
        "--steps",
        "20",
        "--show-backend",
        "--report-json",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("backend report: profile=strict_cpu"),
        "{out}"
    );
    assert!(
        out.contains("linear: reference.linear provider=reference trust=verified"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    let ran: Vec<&str> = report["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["capsule"].as_str().unwrap())
        .collect();
    // the optimizer's update (Adam) is kernels of the step like the rest
    let mut ran = ran;
    ran.sort_unstable();
    assert_eq!(
        ran,
        vec![
            "reference.adam_update",
            "reference.ema_update",
            "reference.linear",
            "reference.mse_loss",
            "reference.tanh",
        ]
    );
    assert_eq!(report["verdict"], "accepted");
}

#[test]
fn native_cpu_under_strict_runs_replayed_capsules_and_composites_are_refused() {
    // strict admits native kernels only through their replay checkers, run on every call
    let (code, out, err) = run(&[
        "quickstart-mlp",
        "--profile",
        "strict_native_cpu",
        "--steps",
        "3",
        "--show-backend",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("linear: native_cpu.replayed.linear"), "{out}");
    assert!(
        out.contains("checker providers::checkers::replay::replay_forward"),
        "{out}"
    );
    assert!(out.contains("[checked, rechecked every call]"), "{out}");
    assert!(!out.contains("runtime_guard"), "{out}");
    // the composition provider rests on guards and tests: the gate refuses it under strict
    let (code, out, err) = run(&[
        "plan",
        "--provider",
        "only:torchlean",
        "--policy",
        "strict",
        "--ops",
        "mse_loss",
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("evidence_not_accepted") && out.contains("runtime_guard"),
        "{out}{err}"
    );
}

#[test]
fn plan_exit_codes() {
    assert_eq!(
        run(&[
            "plan",
            "--profile",
            "checked_cpu",
            "--ops",
            "linear,relu,mse_loss"
        ])
        .0,
        0
    );
    assert_eq!(
        run(&["plan", "--profile", "strict_cpu", "--ops", "linear,relu"]).0,
        0
    );
    // the spectral op plans cuFFT's capsule on CUDA by default, the direct sums on request
    // (planning needs no GPU)
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "checked_cuda",
        "--ops",
        "spectral_conv1d",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("spectral_conv1d: cufft.spectral_conv1d"),
        "{out}"
    );
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "checked_cuda",
        "--provider",
        "prefer:native_cuda",
        "--ops",
        "spectral_conv1d",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("spectral_conv1d: native_cuda.spectral_conv1d"),
        "{out}"
    );
    // TF32 is opt-in: the default plans cuBLAS's f32 capsule, --tf32 (or checked_cuda_tf32)
    // the TF32 one with its precision in the report, and strict never (its checkers' f32
    // bound would reject TF32 results)
    let (code, out, _) = run(&["plan", "--profile", "checked_cuda", "--ops", "linear"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("linear: cublas.linear ") && !out.contains("tf32"),
        "{out}"
    );
    for args in [
        &[
            "plan",
            "--profile",
            "checked_cuda",
            "--tf32",
            "--ops",
            "linear",
        ][..],
        &["plan", "--profile", "checked_cuda_tf32", "--ops", "linear"][..],
    ] {
        let (code, out, _) = run(args);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("linear: cublas.tf32.linear")
                && out.contains("precision=tf32")
                // the looser bound the capsule is held to is stated, not only its name
                && out.contains("declared bound (tf32): forward with TF32 products: every element within (2^-9 + gamma_k)")
                && out.contains("policy=checked-runtime+tf32"),
            "{out}"
        );
    }
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "checked_cuda",
        "--provider",
        "only:cublas",
        "--ops",
        "linear",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("linear: cublas.linear "), "{out}");
    // a static plan for a device this machine cannot run says so (CI has no GPU; where one
    // is usable the note is absent)
    let (code, _, err) = run(&["plan", "--device", "cuda", "--ops", "matmul"]);
    assert_eq!(code, 0, "{err}");
    let _ = torchlean_cuda::link(); // as the binary does: the CUDA module, then its probe
    let usable = torchlean::module::probe_for(
        torchlean::backend::Device::Cuda,
        torchlean::backend::ProviderPreference::Auto,
    )
    .is_ok();
    assert_eq!(err.contains("note: this plan is static"), !usable, "{err}");
    // strict never plans a TF32 capsule, so --tf32 under strict is refused, not ignored
    let (code, _, err) = run(&[
        "plan",
        "--profile",
        "strict_native_cuda",
        "--tf32",
        "--ops",
        "linear",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--tf32 has no effect under policy `strict`"),
        "{err}"
    );
    let (code, out, _) = run(&["plan", "--profile", "strict_native_cuda", "--ops", "linear"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("linear: cublas.replayed.linear"), "{out}");
    // a provider without a capsule for the op (cufft has only the spectral op) is refused
    // readably, naming the CUDA capsules it passed over
    let (code, out, _) = run(&[
        "plan",
        "--device",
        "cuda",
        "--provider",
        "cufft",
        "--policy",
        "checked-runtime",
        "--vjp",
        "torchlean_tape",
        "--ops",
        "conv2d",
    ]);
    assert_eq!(code, 2);
    assert!(
        out.contains("no admissible capsule for op `conv2d` on device `cuda`")
            && out.contains("native_cuda.conv2d (provider native_cuda, device cuda)"),
        "{out}"
    );
    // strict on CUDA plans the replayed capsules (planning needs no GPU), attention's flash
    // kernel included; attention's composition (test evidence on CUDA) is refused by the
    // strict policy
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "strict_native_cuda",
        "--ops",
        "linear,relu,conv2d",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("linear: cublas.replayed.linear")
            && out.contains("conv2d: native_cuda.replayed.conv2d"),
        "{out}"
    );
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "strict_native_cuda",
        "--ops",
        "scaled_dot_product_attention",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("scaled_dot_product_attention: native_cuda.replayed.flash_attention"),
        "{out}"
    );
    // asked for by name, the composition is planned and then rejected by the gate (exit 3)
    let (code, out, err) = run(&[
        "plan",
        "--profile",
        "strict_native_cuda",
        "--provider",
        "only:torchlean",
        "--ops",
        "scaled_dot_product_attention",
    ]);
    let all = format!("{out}{err}");
    assert_eq!(code, 3, "{all}");
    assert!(
        all.contains("capsule `torchlean.cuda.composed_attention`")
            && all.contains("trust_level_not_allowed"),
        "{all}"
    );
    let (code, out, err) = run(&[
        "plan",
        "--device",
        "cpu",
        "--provider",
        "only:torchlean",
        "--policy",
        "strict",
        "--vjp",
        "torchlean_tape",
        "--ops",
        "mse_loss",
    ]);
    assert_eq!(code, 3);
    assert!(
        out.contains("gate failure: evidence_not_accepted")
            && err.contains("evidence_not_accepted"),
        "{out}{err}"
    );
    let (code, out, _) = run(&[
        "plan",
        "--profile",
        "future_metal",
        "--ops",
        "add",
        "--json",
    ]);
    assert_eq!(code, 2);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verdict"], "planning_failed");
    assert_eq!(run(&["plan", "--ops", "nonsense"]).0, 2);
}

/// Without `--features libtorch`, the libtorch profiles stop before anything runs, naming
/// the missing bridge (exit 2), whatever the command.
#[cfg(not(feature = "libtorch"))]
#[test]
fn libtorch_profiles_say_the_bridge_is_not_linked() {
    for args in [
        &[
            "transformer",
            "--profile",
            "libtorch_forward_cuda",
            "--steps",
            "1",
        ][..],
        &[
            "transformer",
            "--profile",
            "libtorch_autograd_cuda",
            "--steps",
            "1",
        ][..],
        &[
            "plan",
            "--profile",
            "libtorch_autograd_cuda",
            "--ops",
            "scaled_dot_product_attention",
        ][..],
        &["quickstart-mlp", "--provider", "prefer:libtorch"][..],
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(
            err.contains("the LibTorch bridge is not linked into this build")
                && err.contains("--features libtorch"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn capsules_json_has_all_fields() {
    let (code, out, _) = run(&[
        "capsules",
        "--json",
        "--op",
        "matmul",
        "--provider",
        "native_cpu",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &v.as_array().unwrap()[0];
    for field in [
        "name",
        "op",
        "provider",
        "device",
        "spec_name",
        "trust_level",
        "supports_forward",
        "vjp_mode",
        "runtime_support",
        "shape_contract",
        "layout_contract",
        "value_contract",
        "vjp_contract",
    ] {
        assert!(!c[field].is_null(), "missing {field}");
    }
    assert_eq!(c["value_contract"]["evidence"]["evidence"], "test_suite");
    assert_eq!(c["shape_contract"]["claim"]["claim"], "shape_safety");
    assert!(c["value_contract"]["provenance"]["source"].is_string());
}

#[test]
fn quickstart_tours_run() {
    let (code, out, _) = run(&["quickstart-tensors"]);
    assert_eq!(code, 0);
    assert!(out.contains("tensor(") && out.contains("error"), "{out}");
    let (code, out, _) = run(&["quickstart-autograd"]);
    assert_eq!(code, 0);
    assert!(out.contains("dy/dx"), "{out}");
}

/// Every accepted flag is honoured or refused (exit 2), never silently ignored: `--backend`
/// only exists where both modes run, with a closed set of values; flags a workload does not
/// read are refused; a batch larger than the data (it would repeat samples) is refused.
#[test]
fn flags_are_honoured_or_refused() {
    let refused: &[&[&str]] = &[
        &[
            "run-graph",
            "g.json",
            "--inputs",
            "x",
            "--out",
            "y",
            "--backend",
            "bogus",
        ],
        &[
            "run-graph",
            "g.json",
            "--inputs",
            "x",
            "--out",
            "y",
            "--backend",
            "eager",
        ],
        &["plan", "--ops", "relu", "--backend", "compiled"],
        &["mlp", "--backend", "bogus", "--steps", "1"],
        &["quickstart-mlp", "--backend", "Compiled!", "--steps", "1"],
        &["bench", "gemm-32", "--backend", "compiled", "--reps", "1"],
        &["bench", "sdpa", "--batch-size", "4", "--reps", "1"],
        &["quickstart-mlp", "--batch-size", "5000", "--steps", "1"],
        &["mlp", "--batch-size", "100000", "--steps", "1"],
    ];
    for args in refused {
        let (code, out, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!out.contains("step 1 loss"), "{args:?} trained: {out}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if args[0] == "run-graph" && args.contains(&"eager") {
            assert!(err.contains("compiled mode only"), "{err}");
        }
    }
    let dir = std::env::temp_dir().join(format!("torchlean-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // run-graph's one mode, `--backend compiled`, is accepted (eager is refused above, with
    // the reason)
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../torchlean-onnx/tests/fixtures"
    );
    let y = dir.join("y.safetensors");
    let (code, _, err) = run(&[
        "run-graph",
        &format!("{fixtures}/mlp.onnx"),
        "--inputs",
        &format!("{fixtures}/mlp.inputs.safetensors"),
        "--out",
        y.to_str().unwrap(),
        "--backend",
        "compiled",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(y.exists());
    let report = dir.join("plan.json");
    let (code, _, err) = run(&[
        "plan",
        "--ops",
        "relu",
        "--report-json",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&report).expect("plan honours --report-json");
    assert!(text.contains("relu"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flags that a request cannot use are refused, not ignored, and the same request is treated
/// alike across commands (found by the forty-second session's audit of the flags): `plan
/// --ops` with `--grad` (a graph's backward) or `--input-shape` (an ONNX model's inputs)
/// exited 0 with the flag unread; `bench onnx:M --backend compiled` was refused though that
/// workload is compiled (run-graph accepts it); a device the target does not declare was
/// reported with "declared: cpu" whatever the build declares.
#[test]
fn flags_a_request_cannot_use_are_refused_and_alike_across_commands() {
    let (code, _, err) = run(&[
        "plan",
        "--ops",
        "linear,mse_loss",
        "--mode",
        "compiled",
        "--grad",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--grad applies to --model"), "{err}");
    let (code, _, err) = run(&["plan", "--ops", "linear", "--input-shape", "x=1,2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--input-shape applies to --model"), "{err}");
    let (code, out, err) = run(&["plan", "--ops", "linear", "--device", "rocm"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        format!("{out}{err}").contains("(declared: cpu, cuda)"),
        "{out}{err}"
    );
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../torchlean-onnx/tests/fixtures/mlp.onnx"
    );
    let workload = format!("onnx:{model}");
    let bench = |backend: &str| {
        run(&[
            "bench",
            &workload,
            "--reps",
            "1",
            "--warmup",
            "1",
            "--warmup-seconds",
            "0",
            "--backend",
            backend,
        ])
    };
    let (code, _, err) = bench("compiled");
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = bench("eager");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("runs compiled only"), "{err}");
}

/// A training bench's plan, printed before any kernel runs, names every op the steps then
/// run — the optimizer's update included (`adam_step` was gated only after the first step's
/// forward and backward had run). Eager and compiled, `mlp-step` and `transformer-step`,
/// under a profile that updates in place and one whose checkers replay the update (then
/// `adam_step` hands out its parts with `slice` and `reshape`). The forty-third session's
/// trust audit.
#[test]
fn a_bench_steps_plan_names_every_op_the_steps_run() {
    for (workload, profile, mode) in [
        ("mlp-step", "checked_cpu", "eager"),
        ("mlp-step", "checked_cpu", "compiled"),
        ("mlp-step", "strict_native_cpu", "eager"),
        ("transformer-step", "checked_cpu", "eager"),
    ] {
        let (code, out, err) = run(&[
            "bench",
            workload,
            "--reps",
            "1",
            "--warmup",
            "0",
            "--warmup-seconds",
            "0",
            "--profile",
            profile,
            "--backend",
            mode,
            "--show-backend",
        ]);
        let what = format!("{workload} {profile} {mode}");
        assert_eq!(code, 0, "{what}: {err}");
        let mut blocks = out.split("backend report:").skip(1);
        let ops = |block: &str| -> std::collections::BTreeSet<String> {
            block
                .lines()
                .filter(|l| l.contains(" provider=") && !l.starts_with(' '))
                .filter_map(|l| l.split(':').next())
                .map(str::to_string)
                .collect()
        };
        let plan = ops(blocks.next().expect("the plan"));
        let ran: std::collections::BTreeSet<String> = blocks.flat_map(ops).collect();
        assert!(!ran.is_empty(), "{what}: no report of what ran: {out}");
        let missing: Vec<&String> = ran.difference(&plan).collect();
        assert!(
            missing.is_empty(),
            "{what}: ran but not planned: {missing:?}\n{out}"
        );
        assert!(
            plan.iter()
                .any(|op| op.starts_with("adam") || op == "ema_update"),
            "{what}: no update in the plan: {plan:?}"
        );
    }
}

/// A `TORCHLEAN_*` switch set to a value it does not take is refused before the command runs
/// (exit 2, naming the variable and its values): `TORCHLEAN_NO_AVX512=yes` left AVX-512 on and
/// `TORCHLEAN_OP_TIMES=false` turned timing on, without a word (the forty-third session's CLI
/// audit). The documented values and an empty one run.
#[test]
fn environment_switches_take_only_their_values() {
    let env_run = |name: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_torchlean"))
            .arg("ops")
            .env(name, value)
            .output()
            .expect("the binary runs")
    };
    for (name, bad) in [
        ("TORCHLEAN_NO_AVX512", "yes"),
        ("TORCHLEAN_OP_TIMES", "false"),
        ("TORCHLEAN_HOT_WORKERS", "off"),
        ("TORCHLEAN_CUBLASLT", "2"),
    ] {
        let o = env_run(name, bad);
        assert_eq!(o.status.code(), Some(2), "{name}={bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(name) && err.contains(bad), "{err}");
    }
    for (name, good) in [
        ("TORCHLEAN_NO_AVX512", "1"),
        ("TORCHLEAN_OP_TIMES", "0"),
        ("TORCHLEAN_CUBLASLT", "forward"),
        ("TORCHLEAN_HOT_WORKERS", ""),
    ] {
        let o = env_run(name, good);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{name}={good}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// No contract describes a kernel that nothing backs: every contract without evidence (the
/// VJP of an op with no gradient, on every provider and device) says so in its summary
/// (30 capsules said "the VJP kernel is spec::vjp at f32" or "matches the f64 spec VJP":
/// the trust audit), and every contract with evidence keeps its own.
#[test]
fn contracts_without_evidence_claim_nothing() {
    let (code, out, err) = run(&["capsules", "--json"]);
    assert_eq!(code, 0, "{err}");
    let caps: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    let mut without = 0;
    for c in &caps {
        for key in [
            "shape_contract",
            "layout_contract",
            "value_contract",
            "vjp_contract",
        ] {
            let contract = &c[key];
            let summary = contract["summary"].as_str().unwrap_or_default();
            let none = contract["evidence"]["evidence"] == "not_provided";
            without += none as usize;
            assert_eq!(
                none,
                summary.starts_with("nothing is claimed"),
                "{} {key}: {summary}",
                c["name"]
            );
        }
    }
    assert!(
        without >= 20,
        "only {without} contracts without evidence: the scan is broken"
    );
}

/// `plan --vjp` other than the profile's is an override, and the profile is then named
/// `custom(..)` as for every other override (`--vjp none` kept the name `strict_cpu`: the
/// trust audit); the profile's own mode keeps its name.
#[test]
fn a_vjp_override_renames_the_profile_as_every_override_does() {
    let header = |vjp: &str| {
        let (code, out, err) = run(&[
            "plan",
            "--profile",
            "strict_cpu",
            "--vjp",
            vjp,
            "--ops",
            "add",
        ]);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .find(|l| l.starts_with("backend report:"))
            .unwrap_or_default()
            .to_string()
    };
    let none = header("none");
    assert!(
        none.contains("profile=custom(strict_cpu)") && none.contains("vjp=none"),
        "{none}"
    );
    let same = header("torchlean_tape");
    assert!(same.contains("profile=strict_cpu "), "{same}");
}
