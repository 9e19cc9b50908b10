//! The CUDA conformance harness and GPU behaviour tests. **GPU only**: on a machine where
//! CUDA is not usable each GPU test prints that it was skipped and why, and passes; with
//! `TORCHLEAN_REQUIRE_CUDA=1` (set by scripts/gpu-check.sh on the GPU machine) a missing GPU
//! fails them instead, so a GPU run can never pass by skipping. docs/cuda.md records each
//! GPU run.
//!
//! The table is the CPU harness's (crates/torchlean/tests/common.rs), restricted to the ops
//! the CUDA module implements; values are compared with the f64 spec by the same function
//! (`common::compare`, tolerance `common::F32_TOL`), NaN and infinities included.
//!
//! `cpu_only_machine_refuses_cuda_before_any_kernel` runs where CUDA is *not* usable (CI):
//! it checks the clean refusal.

#[path = "../../torchlean/tests/common.rs"]
mod common;
mod flash_cases;

use common::{compare, draw, table, Case, Gen, F32_TOL};
use flash_cases::{fixed_case, flash_case, flash_compare, FIXED_CASES};
use torchlean::backend::{BackendProfile, Device};
use torchlean::runtime::kernel::KernelBinding;
use torchlean::runtime::{install, Session};
use torchlean::spec::{self, Array};
use torchlean::{Error, OpKind, Tensor};
use torchlean_cuda::capsules::{
    composed_ops, cublas_binding, cufft_binding, native_cuda_attention_atomic_binding,
    native_cuda_attention_binding, native_cuda_binding, native_cuda_conv_binding,
    native_cuda_fused_binding, native_cuda_optim_binding, native_cuda_reduce_binding,
    native_cuda_rows_binding, native_cuda_spectral_binding,
};
use torchlean_cuda::kernels::{
    attention, blas, conv, elementwise, fused, optim, reduce, rows, spectral,
};

/// Whether CUDA is usable; prints why not (or panics under TORCHLEAN_REQUIRE_CUDA=1).
fn gpu(test: &str) -> bool {
    torchlean_cuda::link().expect("link the CUDA module");
    match torchlean_cuda::available() {
        Ok(_) => true,
        Err(why) => {
            if std::env::var("TORCHLEAN_REQUIRE_CUDA").as_deref() == Ok("1") {
                panic!("{test}: TORCHLEAN_REQUIRE_CUDA=1 but CUDA is not usable: {why}");
            }
            eprintln!("{test}: skipped (GPU only): CUDA is not usable here: {why}; set TORCHLEAN_REQUIRE_CUDA=1 to fail instead");
            false
        }
    }
}

/// The CUDA bindings of an op's capsules, each with its provider's name: the spectral op has
/// two (cufft, native_cuda), every other op one.
fn bindings(kind: OpKind) -> Vec<(&'static str, KernelBinding)> {
    if elementwise::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_binding())]
    } else if rows::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_rows_binding())]
    } else if conv::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_conv_binding())]
    } else if spectral::KINDS.contains(&kind) {
        vec![
            ("cufft", cufft_binding()),
            ("native_cuda", native_cuda_spectral_binding()),
        ]
    } else if reduce::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_reduce_binding())]
    } else if fused::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_fused_binding())]
    } else if optim::KINDS.contains(&kind) {
        vec![("native_cuda", native_cuda_optim_binding())]
    } else if blas::KINDS.contains(&kind) {
        vec![("cublas", cublas_binding())]
    } else if attention::KINDS.contains(&kind) {
        // the fused kernel (its deterministic VJP and the atomic one), and the composition
        // (its parts run as ops of the session)
        vec![
            ("native_cuda", native_cuda_attention_binding()),
            (
                "native_cuda (atomic dQ)",
                native_cuda_attention_atomic_binding(),
            ),
            ("torchlean", torchlean::providers::composition::binding()),
        ]
    } else if composed_ops().contains(&kind) {
        // its parts run as ops of the session: a checked_cuda one is installed by the tests
        vec![("torchlean", torchlean::providers::composition::binding())]
    } else {
        vec![]
    }
}

fn on_gpu(a: &Array<f64>) -> Tensor {
    let v: Vec<f32> = a.data.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, &a.shape)
        .and_then(|t| t.to_device(Device::Cuda))
        .expect("upload")
}

/// The bits of every gradient present (read back from the device).
fn gradient_bits(gs: &[Option<Tensor>]) -> Vec<Vec<u32>> {
    gs.iter()
        .flatten()
        .map(|t| {
            let v = t.try_to_vec().expect("read back");
            v.iter().map(|x| x.to_bits()).collect()
        })
        .collect()
}

/// dQ, dK and dV of the native CPU flash VJP (another implementation, held to the spec by
/// `flash_attention.rs`) for the call `op` on `xs` with cotangent `gy`, widened to f64.
fn cpu_flash_grads(
    op: &torchlean::graph::Op,
    xs: &[Array<f64>],
    gy: &Array<f64>,
    needs: &[bool],
) -> Vec<Vec<f64>> {
    let host = |a: &Array<f64>| {
        Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).expect("host")
    };
    let cpu = torchlean::providers::native_cpu::flash_binding();
    let xs: Vec<Tensor> = xs.iter().map(host).collect();
    let refs: Vec<&Tensor> = xs.iter().collect();
    let y = (cpu.forward())(op, &refs).expect("cpu forward");
    let vjp = cpu.vjp().expect("the CPU flash VJP");
    let grads = vjp(op, &refs, &y, &host(gy), needs).expect("cpu vjp");
    grads
        .iter()
        .take(3)
        .map(|g| widen(g.as_ref().expect("a gradient")))
        .collect()
}

fn widen(t: &Tensor) -> Vec<f64> {
    t.try_to_vec()
        .expect("read back")
        .into_iter()
        .map(f64::from)
        .collect()
}

fn to_f32(a: &Array<f64>) -> Array<f32> {
    Array {
        shape: a.shape.clone(),
        data: a.data.iter().map(|&v| v as f32).collect(),
    }
}

/// The rows of the table the CUDA module covers, with their index.
fn rows() -> Vec<(usize, Case)> {
    table()
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !bindings(c.op.kind()).is_empty())
        .collect()
}

fn inputs(case: &Case, index: usize) -> Vec<Array<f64>> {
    (0..case.inputs.len())
        .map(|j| case.input(index, j))
        .collect()
}

fn check(
    failures: &mut Vec<String>,
    what: String,
    got: &Tensor,
    want: &Array<f64>,
    alt: Option<Vec<f64>>,
) {
    if got.shape() != want.shape.as_slice() {
        failures.push(format!(
            "{what}: shape {:?}, spec {:?}",
            got.shape(),
            want.shape
        ));
    } else if let Err(e) = compare(&widen(got), &want.data, alt.as_deref(), F32_TOL) {
        failures.push(format!("{what}: {e}"));
    }
}

#[test]
fn every_cuda_op_has_rows() {
    let covered: Vec<OpKind> = rows().iter().map(|(_, c)| c.op.kind()).collect();
    for k in elementwise::KINDS
        .iter()
        .chain(rows::KINDS)
        .chain(conv::KINDS)
        .chain(spectral::KINDS)
        .chain(reduce::KINDS)
        .chain(fused::KINDS)
        .chain(optim::KINDS)
        .chain(blas::KINDS)
        .chain(&composed_ops())
    {
        assert!(covered.contains(k), "no conformance row for {}", k.name());
    }
}

/// `elementwise::UNARY_KINDS` (which capsules describe the launch queue in) is exactly the
/// kinds `unary_code` maps, over every row of the table (runs without a GPU).
#[test]
fn unary_kinds_are_unary_code_s() {
    for (_, case) in rows() {
        let kind = case.op.kind();
        assert_eq!(
            elementwise::unary_code(&case.op).is_some(),
            elementwise::UNARY_KINDS.contains(&kind),
            "{}",
            kind.name()
        );
    }
}

#[test]
fn forward_matches_spec_on_the_gpu() {
    if !gpu("forward_matches_spec_on_the_gpu") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let mut failures = vec![];
    let mut ran = 0;
    for (index, case) in rows() {
        let xs = inputs(&case, index);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&case.op, &refs).expect("spec");
        let alt = case.special.then(|| {
            let x32: Vec<Array<f32>> = xs.iter().map(to_f32).collect();
            let r32: Vec<&Array<f32>> = x32.iter().collect();
            let y = spec::forward(&case.op, &r32).expect("spec at f32");
            y.data.iter().map(|&v| v as f64).collect()
        });
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        for (provider, b) in bindings(case.op.kind()) {
            let name = format!("{} [{provider}]", case.name());
            // random draws and comparisons are claimed bit-identical to the spec's (exact in f32)
            let exact = case.op.kind().is_random()
                || matches!(case.op.kind(), OpKind::Compare | OpKind::Round);
            match (b.forward())(&case.op, &tr) {
                Ok(got) if exact => {
                    let w: Vec<f32> = want.data.iter().map(|&v| v as f32).collect();
                    let g = got.try_to_vec().expect("read back");
                    // bit for bit, a NaN matching any NaN (IEEE leaves the payload that
                    // floorf and its siblings return open; round's special-value rows hold
                    // NaN inputs)
                    let differs = |(a, b): &(&f32, &f32)| {
                        a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())
                    };
                    let first = g.iter().zip(&w).find(differs);
                    if got.shape() != want.shape.as_slice() || first.is_some() {
                        failures.push(format!(
                            "{name} forward: not bit-identical to the spec's value (first: got {:?}, want {:?})",
                            first.map(|(a, _)| a),
                            first.map(|(_, b)| b)
                        ));
                    }
                }
                Ok(got) => check(
                    &mut failures,
                    format!("{name} forward"),
                    &got,
                    &want,
                    alt.clone(),
                ),
                Err(e) => failures.push(format!("{name} forward: {e}")),
            }
            ran += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("forward_matches_spec_on_the_gpu: {ran} rows passed");
}

#[test]
fn vjp_matches_spec_on_the_gpu() {
    if !gpu("vjp_matches_spec_on_the_gpu") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let mut failures = vec![];
    let mut ran = 0;
    for (index, case) in rows() {
        if !case.op.kind().differentiable() {
            continue;
        }
        let xs = inputs(&case, index);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&case.op, &refs).expect("spec");
        let gy = draw(&want.shape, Gen::Normal, 10_000 + index as u64);
        let grads = spec::vjp(&case.op, &refs, &want, &gy).expect("spec vjp");
        let alt: Option<Vec<Option<Vec<f64>>>> = case.special.then(|| {
            let x32: Vec<Array<f32>> = xs.iter().map(to_f32).collect();
            let r32: Vec<&Array<f32>> = x32.iter().collect();
            let y = spec::forward(&case.op, &r32).expect("spec at f32");
            let g = spec::vjp(&case.op, &r32, &y, &to_f32(&gy)).expect("spec vjp at f32");
            g.iter()
                .map(|g| {
                    g.as_ref()
                        .map(|g| g.data.iter().map(|&v| v as f64).collect())
                })
                .collect()
        });
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        for (provider, b) in bindings(case.op.kind()) {
            let name = format!("{} [{provider}]", case.name());
            let out = match (b.forward())(&case.op, &tr) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(format!("{name} forward (for the VJP): {e}"));
                    continue;
                }
            };
            let g = on_gpu(&gy);
            let n = tr.len();
            let mut masks = vec![vec![true; n]];
            if n > 1 {
                masks.extend((0..n).map(|j| (0..n).map(|i| i == j).collect()));
            }
            let vjp = b.vjp().expect("differentiable ops have a VJP");
            for needs in masks {
                match vjp(&case.op, &tr, &out, &g, &needs) {
                    Err(e) => failures.push(format!("{name} vjp {needs:?}: {e}")),
                    Ok(got) => {
                        for (j, w) in grads.iter().enumerate() {
                            if !needs[j] {
                                continue;
                            }
                            let what = format!("{name} vjp {needs:?} input {j}");
                            match (got.get(j).cloned().flatten(), w) {
                                (Some(gj), Some(wj)) => {
                                    let a = alt.as_ref().and_then(|a| a[j].clone());
                                    check(&mut failures, what, &gj, wj, a)
                                }
                                (None, None) => {}
                                (g, _) => failures.push(format!(
                                    "{what}: cotangent {} where the spec has {}",
                                    if g.is_some() { "present" } else { "missing" },
                                    if w.is_some() { "one" } else { "none" }
                                )),
                            }
                        }
                    }
                }
            }
            ran += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {ran} rows:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("vjp_matches_spec_on_the_gpu: {ran} rows passed");
}

#[test]
fn flash_attention_matches_the_spec_on_the_gpu() {
    if !gpu("flash_attention_matches_the_spec_on_the_gpu") {
        return;
    }
    let b = native_cuda_attention_binding();
    let atomic = native_cuda_attention_atomic_binding();
    // the deterministic VJP (dQ in slots or by the query kernel) and the opt-in atomic one
    let vjps = [
        (
            "deterministic",
            b.vjp().expect("the flash capsule has a VJP"),
        ),
        (
            "atomic",
            atomic.vjp().expect("the atomic capsule has a VJP"),
        ),
    ];
    let (mut failures, mut worst) = (vec![], (0.0f64, 0.0f64));
    // 120 random calls, then the fixed ones (whole unmasked tiles, a NaN in a row that
    // attends nothing)
    let cases = 120 + FIXED_CASES as u64;
    for case in 0..cases {
        let (op, xs) = if case < 120 {
            flash_case(5_000 + case * 101, false)
        } else {
            fixed_case((case - 120) as usize)
        };
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&op, &refs).expect("the spec accepts the call");
        let gy = draw(&want.shape, Gen::Normal, 90_000 + case);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).expect("the spec VJP");
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let what = format!(
            "case {case} {op:?} q {:?} k {:?} v {:?}",
            xs[0].shape, xs[1].shape, xs[2].shape
        );
        let y = match (b.forward())(&op, &tr) {
            Ok(y) => y,
            Err(e) => {
                failures.push(format!("{what}: forward: {e}"));
                continue;
            }
        };
        match flash_compare(&widen(&y), &want.data, 2e-4) {
            Ok(e) => worst.0 = worst.0.max(e),
            Err(e) => failures.push(format!("{what}: forward: {e}")),
        }
        // every gradient, then each input's alone (the kernels skip what is not needed); and
        // every gradient again from a copy of the output, which carries none of the row
        // statistics the forward left (the VJP recomputes them)
        let n = tr.len();
        let mut masks = vec![vec![true; n]];
        masks.extend((0..n).map(|j| (0..n).map(|i| i == j).collect::<Vec<bool>>()));
        masks.push(vec![true; n]);
        let y_copy = Tensor::from_vec(y.try_to_vec().expect("read back"), y.shape())
            .and_then(|t| t.to_device(torchlean::backend::Device::Cuda))
            .expect("copy of the output");
        let runs = masks
            .iter()
            .enumerate()
            .flat_map(|m| vjps.iter().map(move |v| (m, v)));
        for ((m, needs), (path, vjp)) in runs {
            let needs = needs.clone();
            let out = if m + 1 == masks.len() { &y_copy } else { &y };
            let what = format!("{what} ({path} VJP)");
            let got = match vjp(&op, &tr, out, &on_gpu(&gy), &needs) {
                Ok(g) => g,
                Err(e) => {
                    failures.push(format!("{what}: vjp {needs:?}: {e}"));
                    continue;
                }
            };
            for (j, w) in want_grads.iter().enumerate() {
                if !needs[j] {
                    continue;
                }
                match (got.get(j).cloned().flatten(), w) {
                    (Some(g), Some(w)) => match flash_compare(&widen(&g), &w.data, 2e-4) {
                        Ok(e) => worst.1 = worst.1.max(e),
                        Err(e) => failures.push(format!("{what}: vjp {needs:?} input {j}: {e}")),
                    },
                    (None, None) => {}
                    (g, _) => failures.push(format!(
                        "{what}: vjp input {j}: cotangent present on one side only ({})",
                        g.is_some()
                    )),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures over {cases} calls:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "flash_attention_matches_the_spec_on_the_gpu: {cases} calls, worst forward {:e}, worst VJP {:e}",
        worst.0, worst.1
    );
}

/// `native_cuda.flash_attention`'s VJP is bit-identical run to run (the capsule declares it
/// deterministic, which lets `auto` plan it): on calls where the atomic VJP adds dQ with
/// `atomicAdd` (d, dv <= 64, several key tiles per query row: L = S = 512), five runs of the
/// deterministic VJP give the same bits for dQ, dK and dV. The atomic capsule's runs are
/// compared too and only reported (equal bits there are possible, not promised).
#[test]
fn flash_attention_vjp_is_bit_identical_run_to_run() {
    use torchlean::graph::{AttentionMask, Op};
    if !gpu("flash_attention_vjp_is_bit_identical_run_to_run") {
        return;
    }
    let bits = gradient_bits;
    let mut atomic_differed = 0;
    for (c, &(mask, causal)) in [(AttentionMask::None, false), (AttentionMask::Boolean, true)]
        .iter()
        .enumerate()
    {
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal,
            mask,
        };
        let (bh, l, d) = (8, 512, 64);
        let mut xs = vec![
            draw(&[bh, l, d], Gen::Normal, 70_000 + 10 * c as u64),
            draw(&[bh, l, d], Gen::Normal, 70_001 + 10 * c as u64),
            draw(&[bh, l, d], Gen::Normal, 70_002 + 10 * c as u64),
        ];
        if mask == AttentionMask::Boolean {
            let mut m = draw(&[l, l], Gen::Normal, 70_003 + 10 * c as u64);
            for x in m.data.iter_mut() {
                *x = if *x > -0.5 { 1.0 } else { 0.0 };
            }
            xs.push(m);
        }
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let gy = on_gpu(&draw(&[bh, l, d], Gen::Normal, 70_009 + 10 * c as u64));
        let needs = [true, true, true, false];
        for (name, b, must) in [
            ("deterministic", native_cuda_attention_binding(), true),
            ("atomic", native_cuda_attention_atomic_binding(), false),
        ] {
            let y = (b.forward())(&op, &tr).expect("forward");
            let vjp = b.vjp().expect("a VJP");
            let first = bits(&vjp(&op, &tr, &y, &gy, &needs[..tr.len()]).expect("vjp"));
            assert_eq!(first.len(), 3, "dQ, dK and dV");
            for run in 1..5 {
                let again = bits(&vjp(&op, &tr, &y, &gy, &needs[..tr.len()]).expect("vjp"));
                let same = again == first;
                if must {
                    assert!(same, "case {c} ({mask:?}, causal {causal}): the {name} VJP's run {run} gave other bits than run 0");
                } else if !same {
                    atomic_differed += 1;
                }
            }
        }
    }
    eprintln!("flash_attention_vjp_is_bit_identical_run_to_run: the deterministic VJP gave the same bits in 5 runs of 2 calls; the atomic VJP's runs differed from its first in {atomic_differed} of 8");
}

/// The deterministic VJP's dQ in grouped slots (`kernels::attention_slots`: more than 16 key
/// tiles, each block of the key kernel summing two key tiles' terms into its slot before the
/// slots are added in order): L = S = 1100 (18 key tiles: 9 slots of 2) with enough batch
/// matrices for the grouped grid to fill the device, unmasked, causal and with a boolean
/// mask. Every gradient is compared with the native CPU flash VJP (another implementation,
/// itself held to the spec by `flash_attention.rs`) at the flash capsule's tolerance, and
/// repeats bit for bit; the log line gives the slot plan that ran.
#[test]
fn flash_attention_dq_in_grouped_slots_matches_the_cpu_and_repeats() {
    if !gpu("flash_attention_dq_in_grouped_slots_matches_the_cpu_and_repeats") {
        return;
    }
    // the slots, not the ordered dQ, which would take the unmasked calls
    torchlean_cuda::device::with_flash_dq_ordered(false, grouped_slots_cases);
}

fn grouped_slots_cases() {
    use torchlean::graph::{AttentionMask, Op};
    use torchlean_cuda::kernels::attention_slots::{dq_slots, DqSlots};
    let (l, d) = (1100usize, 64usize);
    let key_tiles = l.div_ceil(64);
    let resident = torchlean_cuda::device::context()
        .expect("the CUDA context")
        .flash_kv_resident;
    // the fewest batch matrices whose grouped grid fills the device once (at least 2)
    let bh = resident.div_ceil(key_tiles.div_ceil(2)).max(2);
    let plan = dq_slots(bh, key_tiles, bh * l * d, resident);
    assert_eq!(
        plan,
        Some(DqSlots { group: 2, slots: 9 }),
        "{bh} batch matrices on {resident} resident blocks"
    );
    let gpu_det = native_cuda_attention_binding();
    let (fwd, vjp) = (gpu_det.forward(), gpu_det.vjp().expect("a VJP"));
    let mut worst = 0.0f64;
    for (c, &(mask, causal)) in [
        (AttentionMask::None, false),
        (AttentionMask::None, true),
        (AttentionMask::Boolean, false),
    ]
    .iter()
    .enumerate()
    {
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal,
            mask,
        };
        let seed = 71_000 + 10 * c as u64;
        let mut xs: Vec<Array<f64>> = (0..3)
            .map(|i| draw(&[bh, l, d], Gen::Normal, seed + i))
            .collect();
        if mask == AttentionMask::Boolean {
            // about a quarter of the entries blocked, and query row 3 blocked entirely
            let mut m = draw(&[l, l], Gen::Normal, seed + 3);
            for (e, x) in m.data.iter_mut().enumerate() {
                *x = if e / l != 3 && *x > -0.67 { 1.0 } else { 0.0 };
            }
            xs.push(m);
        }
        let gy = draw(&[bh, l, d], Gen::Normal, seed + 9);
        let needs = [true, true, true, false];
        let needs = &needs[..xs.len()];
        let want = cpu_flash_grads(&op, &xs, &gy, needs);
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let y = fwd(&op, &tr).expect("gpu forward");
        let g = on_gpu(&gy);
        let first = vjp(&op, &tr, &y, &g, needs).expect("gpu vjp");
        for (j, (got, want)) in first.iter().zip(&want).enumerate() {
            let got = got.as_ref().expect("a gradient");
            match flash_compare(&widen(got), want, 2e-4) {
                Ok(e) => worst = worst.max(e),
                Err(e) => panic!("case {c} ({mask:?}, causal {causal}) gradient {j}: {e}"),
            }
        }
        let bits = gradient_bits;
        let again = vjp(&op, &tr, &y, &g, needs).expect("gpu vjp");
        assert!(
            bits(&again) == bits(&first),
            "case {c} ({mask:?}, causal {causal}): a second run gave other bits"
        );
    }
    eprintln!("flash_attention_dq_in_grouped_slots_matches_the_cpu_and_repeats: B·H = {bh}, L = S = {l}, d = {d}, plan {plan:?} on {resident} resident blocks; worst error against the CPU {worst:e}");
}

/// The deterministic VJP's dQ added in a fixed order of key tiles (the key kernel's ordered
/// mode: the key tiles visiting a query tile add there one after the other, each waiting on
/// a turn counter): unmasked and causal, L = S and L ≠ S, a head dimension that is not a multiple
/// of 4 (scalar additions), an additive bias, causal with L > S and L < S, causal with a NaN
/// (the cut applied entry by entry), boolean masks blocking whole tiles without and with the
/// causal flag, and batch matrices enough for several waves of blocks (the log line says
/// whether the key kernel split its last wave there). Every gradient is compared with the native
/// CPU flash VJP (another implementation, held to the spec by `flash_attention.rs`) at the
/// flash capsule's tolerance, a second run must give the same bits, the ordered path must
/// have run for each call (the context counts them), and with the ordered path turned off
/// (slots or the query kernel: other orders of addition) the gradients agree within the
/// same tolerance.
#[test]
fn flash_attention_ordered_dq_matches_the_cpu_and_repeats() {
    use torchlean::graph::{AttentionMask, Op};
    if !gpu("flash_attention_ordered_dq_matches_the_cpu_and_repeats") {
        return;
    }
    let cx = torchlean_cuda::device::context().expect("the CUDA context");
    let gpu_det = native_cuda_attention_binding();
    let (fwd, vjp) = (gpu_det.forward(), gpu_det.vjp().expect("a VJP"));
    let mut worst = 0.0f64;
    // (bh, l, s, d, dv, mask, causal)
    let cases = [
        (
            8usize,
            512usize,
            512usize,
            64usize,
            64usize,
            AttentionMask::None,
            false,
        ),
        (8, 512, 512, 64, 64, AttentionMask::None, true),
        (3, 300, 700, 37, 50, AttentionMask::None, false),
        (3, 700, 700, 37, 64, AttentionMask::None, true),
        (2, 200, 330, 64, 64, AttentionMask::AdditiveBias, false),
        (72, 1024, 1024, 64, 64, AttentionMask::None, false),
        (2, 900, 400, 64, 64, AttentionMask::None, true),
        (2, 400, 900, 64, 64, AttentionMask::None, true),
        // a NaN in v at key 650: the causal cut is then applied entry by entry, not by
        // skipping tiles, and every key tile visits every query tile
        (2, 700, 700, 64, 64, AttentionMask::None, true),
        // boolean masks blocking whole tiles (turns counted by the tile words)
        (4, 600, 650, 64, 64, AttentionMask::Boolean, false),
        (4, 650, 650, 64, 64, AttentionMask::Boolean, true),
    ];
    for (c, &(bh, l, s, d, dv, mask, causal)) in cases.iter().enumerate() {
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal,
            mask,
        };
        let seed = 73_000 + 10 * c as u64;
        let mut xs = vec![
            draw(&[bh, l, d], Gen::Normal, seed),
            draw(&[bh, s, d], Gen::Normal, seed + 1),
            draw(&[bh, s, dv], Gen::Normal, seed + 2),
        ];
        if mask == AttentionMask::AdditiveBias {
            xs.push(draw(&[l, s], Gen::Normal, seed + 3));
        }
        if c == 8 {
            xs[2].data[650 * dv + 3] = f64::NAN;
        }
        if mask == AttentionMask::Boolean {
            xs.push(flash_cases::tile_blocked_mask(l, s, seed + 4));
        }
        let gy = draw(&[bh, l, dv], Gen::Normal, seed + 9);
        let needs = [true, true, true, false];
        let needs = &needs[..xs.len()];
        let want = cpu_flash_grads(&op, &xs, &gy, needs);
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let g = on_gpu(&gy);
        let (first, again, other) = torchlean_cuda::device::with_flash_dq_ordered(true, || {
            let y = fwd(&op, &tr).expect("gpu forward");
            let before = cx.flash_dq_ordered_calls();
            let first = vjp(&op, &tr, &y, &g, needs).expect("gpu vjp");
            let again = vjp(&op, &tr, &y, &g, needs).expect("gpu vjp");
            assert_eq!(
                cx.flash_dq_ordered_calls(),
                before + 2,
                "case {c}: the ordered dQ did not run"
            );
            let other = torchlean_cuda::device::with_flash_dq_ordered(false, || {
                vjp(&op, &tr, &y, &g, needs).expect("gpu vjp")
            });
            (first, again, other)
        });
        for (j, want) in want.iter().enumerate() {
            for (name, got) in [("ordered", &first), ("not ordered", &other)] {
                let got = got[j].as_ref().expect("a gradient");
                match flash_compare(&widen(got), want, 2e-4) {
                    Ok(e) => worst = worst.max(e),
                    Err(e) => panic!("case {c} ({bh}×{l}×{s}, d {d}, dv {dv}, {mask:?}, causal {causal}) gradient {j}, {name}: {e}"),
                }
            }
        }
        assert!(
            gradient_bits(&again) == gradient_bits(&first),
            "case {c} ({bh}×{l}×{s}, {mask:?}, causal {causal}): a second run gave other bits"
        );
    }
    let split = torchlean_cuda::kernels::attention_split::key_split(
        72,
        16,
        16,
        cx.flash_kv_slots,
        1024,
        128,
    );
    eprintln!("flash_attention_ordered_dq_matches_the_cpu_and_repeats: {} calls, each twice with the same bits; worst error against the CPU {worst:e}; the 72×1024 call's split {split:?}", cases.len());
}

/// The cuFFT spectral op at lengths that are not powers of two (6, 100, 127, 1000) with every
/// mode kept (the Nyquist frequency included for even n) and with few, and weights whose
/// zero-frequency imaginary part is large: the spec ignores that part (sin 0 = 0), and the
/// inverse transform's input must be Hermitian there for cuFFT (the CUDA review: it was
/// written into C2R's input; the conformance rows had n in {1, 8, 16, 64} only). Forward and
/// every gradient within 1e-4·(1 + max |spec|) of the f64 spec.
#[test]
fn cufft_spectral_conv_of_any_length_matches_the_spec() {
    use torchlean::graph::Op;
    if !gpu("cufft_spectral_conv_of_any_length_matches_the_spec") {
        return;
    }
    let b = cufft_binding();
    let vjp = b.vjp().expect("a VJP");
    for (c, &(n, modes)) in [(6usize, 4usize), (100, 51), (127, 64), (1000, 12), (100, 7)]
        .iter()
        .enumerate()
    {
        let op = Op::SpectralConv1d { modes };
        let seed = 72_000 + 10 * c as u64;
        let x = draw(&[2, 3, n], Gen::Normal, seed);
        let wr = draw(&[3, 4, modes], Gen::Normal, seed + 1);
        let mut wi = draw(&[3, 4, modes], Gen::Normal, seed + 2);
        for (e, v) in wi.data.iter_mut().enumerate() {
            if e % modes == 0 {
                *v *= 100.0;
            }
        }
        let xs = [x, wr, wi];
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&op, &refs).expect("spec forward");
        let gy = draw(&want.shape, Gen::Normal, seed + 9);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).expect("spec vjp");
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let y = (b.forward())(&op, &tr).expect("cufft forward");
        flash_compare(&widen(&y), &want.data, 1e-4)
            .unwrap_or_else(|e| panic!("n {n} modes {modes}: forward: {e}"));
        let grads = vjp(&op, &tr, &y, &on_gpu(&gy), &[true, true, true]).expect("cufft vjp");
        for (j, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            let (g, w) = (
                g.as_ref().expect("a gradient"),
                w.as_ref().expect("a gradient"),
            );
            flash_compare(&widen(g), &w.data, 1e-4)
                .unwrap_or_else(|e| panic!("n {n} modes {modes}: gradient {j}: {e}"));
        }
    }
}

/// The split-TF32 tensor-core kernels (`flash_forward_mma`, `flash_bwd_kv_mma`: d, dv <= 64,
/// finite values below 2^24) hold f32-level accuracy, not TF32's: on realistic calls (normal
/// q, k, v, L = S = 256 crossing four tiles, d = dv = 64 and 32, no mask, causal, a boolean
/// padding mask) every output and gradient is within 3e-5 · (1 + max |spec|) of the f64 spec
/// — about seven times tighter than the flash capsule's tolerance. Products of inputs rounded
/// to TF32 alone (10-bit mantissas, the error of `--tf32`) miss that bound by four to eight
/// times on such calls (1.2e-4 to 2.5e-4 in a NumPy simulation of the rounding, forward and
/// dV), so the test fails if the kernels lose the split's small parts. The forward's
/// tensor-core kernel is on by default, the VJP's opt-in: with TORCHLEAN_FLASH_MMA=1
/// (scripts/gpu-sessions/gpu-sixteenth.sh sets it) the test checks both; otherwise, or below sm_80, it
/// holds whichever f32 kernels run to the same bound, and its log line says which path ran.
#[test]
fn flash_tensor_core_kernels_keep_f32_level_accuracy() {
    use torchlean::graph::{AttentionMask, Op};
    if !gpu("flash_tensor_core_kernels_keep_f32_level_accuracy") {
        return;
    }
    let b = native_cuda_attention_binding();
    let vjp = b.vjp().expect("the flash capsule has a VJP");
    let mma = torchlean_cuda::device::context_if_created().map(|c| c.flash_mma);
    let (mut failures, mut worst) = (vec![], 0.0f64);
    let calls = [
        (64, AttentionMask::None, false),
        (64, AttentionMask::None, true),
        (64, AttentionMask::Boolean, false),
        (32, AttentionMask::None, false),
    ];
    for (c, &(d, mask, causal)) in calls.iter().enumerate() {
        let (bh, l) = (2usize, 256usize);
        let seed = 7_000 + 10 * c as u64;
        let mut xs = vec![
            draw(&[bh, l, d], Gen::Normal, seed),
            draw(&[bh, l, d], Gen::Normal, seed + 1),
            draw(&[bh, l, d], Gen::Normal, seed + 2),
        ];
        if mask == AttentionMask::Boolean {
            // key padding: batch matrix m attends its first 256 - 37·(m + 1) keys
            let data = (0..bh * l * l)
                .map(|e| ((e % l) < l - 37 * (e / (l * l) + 1)) as u8 as f64)
                .collect();
            xs.push(Array::from_vec(vec![bh, l, l], data).expect("mask shape"));
        }
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal,
            mask,
        };
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&op, &refs).expect("the spec accepts the call");
        let gy = draw(&want.shape, Gen::Normal, seed + 3);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).expect("the spec VJP");
        let ts: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let tr: Vec<&Tensor> = ts.iter().collect();
        let what = format!("call {c} (d {d}, {mask:?}, causal {causal})");
        let y = (b.forward())(&op, &tr).expect("flash forward");
        match flash_compare(&widen(&y), &want.data, 3e-5) {
            Ok(e) => worst = worst.max(e),
            Err(e) => failures.push(format!("{what}: forward: {e}")),
        }
        let needs = vec![true; tr.len()];
        let got = vjp(&op, &tr, &y, &on_gpu(&gy), &needs).expect("flash VJP");
        for (j, w) in want_grads.iter().enumerate().take(3) {
            let (Some(g), Some(w)) = (got[j].as_ref(), w) else {
                failures.push(format!("{what}: gradient {j} missing"));
                continue;
            };
            match flash_compare(&widen(g), &w.data, 3e-5) {
                Ok(e) => worst = worst.max(e),
                Err(e) => failures.push(format!("{what}: gradient {j}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!(
        "flash_tensor_core_kernels_keep_f32_level_accuracy: tensor-core kernels {mma:?}, worst error {worst:e} (bound 3e-5)"
    );
    // what ptxas made of the kernels (registers per thread, local memory: spills), for the
    // GPU run's log
    if let Some(cx) = torchlean_cuda::device::context_if_created() {
        use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES as LOCAL;
        let f = &cx.functions;
        for (name, func) in [
            ("flash_forward", &f.flash_forward),
            ("flash_forward_mma", &f.flash_forward_mma),
            ("flash_bwd_kv", &f.flash_bwd_kv),
            ("flash_bwd_kv_mma", &f.flash_bwd_kv_mma),
        ] {
            eprintln!(
                "  {name}: {:?} registers, {:?} bytes of local memory",
                func.num_regs(),
                func.get_attribute(LOCAL)
            );
        }
    }
}

/// The CUDA pool's count of reads to the host (`MemoryStats::host_reads`).
fn host_reads() -> u64 {
    torchlean::module::memory_stats(Device::Cuda).expect("CUDA memory statistics")["host_reads"]
        .as_u64()
        .expect("host_reads")
}

fn checked_cuda() -> BackendProfile {
    BackendProfile::named("checked_cuda").expect("named profile")
}

/// `adam_step` on the GPU: its forward kernel and its update-many kernel give exactly the
/// CPU kernel's bits on every row of the table (the same rounding, step by step; a NaN is
/// compared as a NaN, its sign and payload bits being the hardware's); the
/// update-many kernel writes owned targets in place (same ids, same device buffers) and gives
/// shared ones new buffers, leaving the other handle's values alone.
#[test]
fn adam_step_on_the_gpu_gives_the_cpu_bits_in_place() {
    if !gpu("adam_step_on_the_gpu_gives_the_cpu_bits_in_place") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let cpu = torchlean::providers::native_cpu::binding_for(OpKind::AdamStep);
    let gpu_binding = native_cuda_optim_binding();
    let update_many = gpu_binding.update_many().expect("an update-many kernel");
    // the bits, every NaN as one pattern: a NaN's sign and payload are the hardware's (the
    // H200 writes 0x7fffffff where the CPU's arithmetic gives 0xffc00000), not a value
    let bits = |v: Vec<f32>| {
        v.into_iter()
            .map(|x| {
                if x.is_nan() {
                    f32::NAN.to_bits()
                } else {
                    x.to_bits()
                }
            })
            .collect::<Vec<_>>()
    };
    let mut ran = 0;
    for (index, case) in rows() {
        if case.op.kind() != OpKind::AdamStep {
            continue;
        }
        let name = case.name();
        let xs = inputs(&case, index);
        let host: Vec<Tensor> = xs
            .iter()
            .map(|a| Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape))
            .collect::<Result<_, _>>()
            .expect("host tensors");
        let hr: Vec<&Tensor> = host.iter().collect();
        let want = bits((cpu.forward())(&case.op, &hr).expect("cpu").to_vec());
        let dev: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        let dr: Vec<&Tensor> = dev.iter().collect();
        let got = (gpu_binding.forward())(&case.op, &dr).expect("gpu forward");
        assert_eq!(
            bits(got.try_to_vec().expect("read")),
            want,
            "{name}: forward"
        );
        // (w, m, v) updated, g read, per group
        let updated: Vec<&Tensor> = dev
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 4 < 3)
            .map(|(_, t)| t)
            .collect();
        let read: Vec<&Tensor> = dev.iter().skip(3).step_by(4).collect();
        let read_back = |ts: &[Tensor]| -> Vec<u32> {
            ts.iter()
                .flat_map(|t| bits(t.try_to_vec().expect("read")))
                .collect()
        };
        let mut owned: Vec<Tensor> = updated
            .iter()
            .map(|t| {
                t.to_cpu()
                    .and_then(|c| c.to_device(Device::Cuda))
                    .expect("copy")
            })
            .collect();
        let ids: Vec<_> = owned.iter().map(|t| t.id()).collect();
        let buffers: Vec<_> = owned
            .iter()
            .map(|t| std::sync::Arc::as_ptr(t.device_buffer().expect("device")) as *const u8)
            .collect();
        {
            let mut targets: Vec<&mut Tensor> = owned.iter_mut().collect();
            update_many(&case.op, &mut targets, &read).expect("update_many (owned)");
        }
        assert_eq!(read_back(&owned), want, "{name}: update_many (owned)");
        for ((t, id), b) in owned.iter().zip(&ids).zip(&buffers) {
            assert_eq!(t.id(), *id, "{name}: id changed");
            let now = std::sync::Arc::as_ptr(t.device_buffer().expect("device")) as *const u8;
            assert_eq!(now, *b, "{name}: not written in place");
        }
        let before: Vec<Tensor> = updated.iter().map(|t| (*t).clone()).collect();
        let before_bits = read_back(&before);
        let mut shared = before.clone();
        {
            let mut targets: Vec<&mut Tensor> = shared.iter_mut().collect();
            update_many(&case.op, &mut targets, &read).expect("update_many (shared)");
        }
        assert_eq!(read_back(&shared), want, "{name}: update_many (shared)");
        assert_eq!(
            read_back(&before),
            before_bits,
            "{name}: a shared target was written"
        );
        ran += 1;
    }
    assert!(ran >= 2, "{ran} adam_step rows");
}

/// `Tensor::rand` and a dropout mask drawn under checked_cuda equal the CPU's bit for bit.
#[test]
fn rng_draws_are_bit_identical_on_both_devices() {
    if !gpu("rng_draws_are_bit_identical_on_both_devices") {
        return;
    }
    let draw = |profile: BackendProfile| {
        install(Session::new(profile)).expect("install");
        let u = Tensor::rand(&[3, 1001], 42)
            .expect("rand")
            .try_to_vec()
            .expect("read");
        let op = torchlean::Op::BernoulliMask {
            shape: vec![777],
            keep: 0.3,
            seed: 9,
        };
        let m = torchlean::runtime::apply(op, &[])
            .expect("mask")
            .try_to_vec()
            .expect("read");
        (u, m)
    };
    let (cu, cm) = draw(BackendProfile::named("checked_cpu").expect("profile"));
    let (gu, gm) = draw(checked_cuda());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&gu), bits(&cu), "uniform draws differ");
    assert_eq!(bits(&gm), bits(&cm), "bernoulli masks differ");
    assert!(cm.contains(&0.0) && cm.contains(&1.0));
}

#[test]
fn device_mismatch_is_a_typed_error_on_the_gpu() {
    if !gpu("device_mismatch_is_a_typed_error_on_the_gpu") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let host = Tensor::from_vec(vec![1.0, 2.0], &[2]).expect("host");
    let dev = host.to_device(Device::Cuda).expect("upload");
    match host.add(&dev) {
        Err(Error::DeviceMismatch { op, detail }) => {
            assert_eq!(op, "add");
            assert!(
                detail.contains("cpu") && detail.contains("cuda"),
                "{detail}"
            );
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    // both on the host under a cuda session: refused too, never copied
    assert!(matches!(host.add(&host), Err(Error::DeviceMismatch { .. })));
}

#[test]
fn out_of_memory_is_a_typed_error_on_the_gpu() {
    if !gpu("out_of_memory_is_a_typed_error_on_the_gpu") {
        return;
    }
    let cx = torchlean_cuda::device::context().expect("context");
    // 2^40 f32 = 4 TiB: more than any GPU has
    match cx.pool.alloc(1 << 40, &"the out-of-memory test") {
        Err(Error::OutOfMemory { bytes, what }) => {
            assert_eq!(bytes, 4 << 40);
            assert!(what.contains("free"), "{what}");
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("a 4 TiB allocation succeeded"),
    }
    // the device still works afterwards
    let t = Tensor::from_vec(vec![3.0], &[1])
        .and_then(|t| t.to_device(Device::Cuda))
        .expect("upload");
    assert_eq!(t.try_to_vec().expect("read"), vec![3.0]);
}

/// A two-layer MLP forward and backward in a checked_cuda session against the same in a
/// checked_cpu session: every kernel planned, gated and reported; gradients equal.
#[test]
fn mlp_step_on_the_gpu_matches_the_cpu_and_is_reported() {
    if !gpu("mlp_step_on_the_gpu_matches_the_cpu_and_is_reported") {
        return;
    }
    let x = Tensor::randn(&[64, 32], 1).expect("x");
    let w1 = Tensor::randn(&[48, 32], 2).expect("w1");
    let b1 = Tensor::randn(&[48], 3).expect("b1");
    let w2 = Tensor::randn(&[1, 48], 4).expect("w2");
    let run = |device: Device| -> (f32, Vec<Vec<f32>>, torchlean::backend::BackendReport) {
        let profile = if device == Device::Cuda {
            checked_cuda()
        } else {
            BackendProfile::named("checked_cpu").expect("profile")
        };
        install(Session::new(profile)).expect("install");
        let on = |t: &Tensor| t.to_device(device).expect("move");
        let params: Vec<Tensor> = [&w1, &b1, &w2]
            .iter()
            .map(|t| on(t).requires_grad())
            .collect();
        let h = on(&x)
            .linear(&params[0], Some(&params[1]))
            .and_then(|h| h.relu())
            .expect("layer 1");
        let y = h.linear(&params[2], None).expect("layer 2");
        let loss = y.mul(&y).and_then(|s| s.sum_all()).expect("loss");
        let grads = loss.backward().expect("backward");
        let g: Vec<Vec<f32>> = params
            .iter()
            .map(|p| grads.get(p).expect("grad").try_to_vec().expect("read"))
            .collect();
        let report = torchlean::runtime::with_current(|s| s.report()).expect("report");
        (loss.item().expect("loss"), g, report)
    };
    let (l_cpu, g_cpu, _) = run(Device::Cpu);
    let (l_gpu, g_gpu, report) = run(Device::Cuda);
    let rel = |a: f32, b: f32| (a - b).abs() / (1.0 + b.abs());
    assert!(rel(l_gpu, l_cpu) < 1e-4, "loss {l_gpu} vs cpu {l_cpu}");
    for (gg, gc) in g_gpu.iter().zip(&g_cpu) {
        let scale = 1.0 + gc.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = gg
            .iter()
            .zip(gc)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs() / scale));
        assert!(worst < 1e-4, "gradient differs from the cpu by {worst}");
    }
    let text = report.to_text();
    for capsule in [
        "cublas.linear",
        "native_cuda.relu",
        "native_cuda.mul",
        "native_cuda.sum_all",
    ] {
        assert!(text.contains(capsule), "report lacks {capsule}:\n{text}");
    }
    let target = report.target.as_deref().expect("target line");
    assert!(
        target.contains("sm_") && target.contains("cuBLAS"),
        "{target}"
    );
    assert!(report.memory.is_some(), "memory statistics in the report");
    eprintln!("{text}");
}

/// The quickstart MLP (4-64-64-1, tanh, Adam, MSE) trained 20 steps on the GPU gives the
/// CPU's losses within 1e-4 relative; the report covers the forward, backward, gradient
/// accumulation and the optimizer's update, every kernel on the GPU.
#[test]
fn quickstart_training_on_the_gpu_matches_the_cpu() {
    if !gpu("quickstart_training_on_the_gpu_matches_the_cpu") {
        return;
    }
    use torchlean::nn::tasks::SyntheticRegression;
    use torchlean::nn::{train::train_regression, Activation, Adam, Mlp, Module};
    let run = |profile: &str| -> (Vec<f32>, torchlean::backend::BackendReport, Device) {
        let profile = BackendProfile::named(profile).expect("profile");
        let device = profile.device;
        install(Session::new(profile)).expect("install");
        let mut model = Mlp::new(&[4, 64, 64, 1], Activation::Tanh, 0).expect("model");
        model.to_device(device).expect("move the model");
        let data = SyntheticRegression::new(1024, 17).expect("data");
        let mut opt = Adam::new(0.01).expect("adam");
        let losses =
            train_regression(&mut model, &mut opt, &data, 20, 64, 0, |_| {}).expect("train");
        let report = torchlean::runtime::with_current(|s| s.report()).expect("report");
        (losses, report, model.device())
    };
    let (cpu, _, _) = run("checked_cpu");
    let (gpu_losses, report, device) = run("checked_cuda");
    assert_eq!(device, Device::Cuda, "the model stayed on the GPU");
    for (step, (g, c)) in gpu_losses.iter().zip(&cpu).enumerate() {
        assert!(
            (g - c).abs() / c.abs().max(1e-12) < 1e-4,
            "step {step}: gpu {g} vs cpu {c}"
        );
    }
    let text = report.to_text();
    for capsule in [
        "cublas.linear",
        "native_cuda.tanh",
        "native_cuda.mse_loss",
        // Adam's step: one `adam_step` call per step on a device (`foreach`'s default)
        "native_cuda.adam_step",
    ] {
        assert!(text.contains(capsule), "report lacks {capsule}:\n{text}");
    }
    assert!(
        !text.contains("provider=native_cpu") && !text.contains("provider=reference"),
        "a CPU kernel ran:\n{text}"
    );
    eprintln!("losses gpu {:?}\nlosses cpu {:?}", gpu_losses, cpu);
}

/// The quickstart MLP trained 20 steps in compiled mode on the GPU (captured once, planned
/// and gated once, replayed by the general executor over device tensors) gives the eager
/// GPU run's losses; the compiled report says which executor ran.
#[test]
fn quickstart_compiled_on_the_gpu_matches_eager() {
    if !gpu("quickstart_compiled_on_the_gpu_matches_eager") {
        return;
    }
    use torchlean::nn::tasks::SyntheticRegression;
    use torchlean::nn::train::{train_regression, train_regression_compiled};
    use torchlean::nn::{Activation, Adam, Mlp, Module};
    let profile = checked_cuda();
    let data = SyntheticRegression::new(1024, 17).expect("data");
    let model = || {
        let mut m = Mlp::new(&[4, 64, 64, 1], Activation::Tanh, 0).expect("model");
        m.to_device(Device::Cuda).expect("move the model");
        m
    };
    install(Session::new(profile.clone())).expect("install");
    let mut eager_model = model();
    let mut opt = Adam::new(0.01).expect("adam");
    let eager =
        train_regression(&mut eager_model, &mut opt, &data, 20, 64, 0, |_| {}).expect("eager");
    install(Session::new(profile.clone())).expect("install");
    let mut compiled_model = model();
    let mut opt = Adam::new(0.01).expect("adam");
    let (compiled, report) = train_regression_compiled(
        &mut compiled_model,
        &mut opt,
        &data,
        20,
        64,
        0,
        &profile,
        |_| {},
    )
    .expect("compiled");
    for (step, (c, e)) in compiled.iter().zip(&eager).enumerate() {
        assert!(
            (c - e).abs() / e.abs().max(1e-12) < 1e-4,
            "step {step}: compiled {c} vs eager {e}"
        );
    }
    let text = report.to_text();
    assert!(
        text.contains("executor:") && text.contains("cublas.linear"),
        "{text}"
    );
    eprintln!("{text}");
}

#[test]
fn cpu_only_machine_refuses_cuda_before_any_kernel() {
    torchlean_cuda::link().expect("link the CUDA module");
    if torchlean_cuda::available().is_ok() {
        eprintln!("cpu_only_machine_refuses_cuda_before_any_kernel: skipped: CUDA is usable here (this test runs on machines without it, e.g. CI)");
        return;
    }
    // planning sees the declared device; the probe refuses before the first kernel
    install(Session::new(checked_cuda())).expect("install");
    let t = Tensor::from_vec(vec![1.0], &[1]).expect("host tensor");
    match t.to_device(Device::Cuda) {
        Err(Error::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, "cuda");
            assert!(!reason.is_empty());
        }
        other => panic!("expected DeviceUnavailable, got {other:?}"),
    }
    match t.relu() {
        Err(Error::DeviceUnavailable { .. }) => {}
        other => panic!("expected DeviceUnavailable before any kernel, got {other:?}"),
    }
    let report = torchlean::runtime::with_current(|s| s.report()).expect("report");
    assert!(report.kernels.is_empty(), "no kernel ran");
}

/// Every test the CUDA capsules' evidence cites exists in the file it names (runs anywhere:
/// no GPU needed to read the registry).
#[test]
fn cuda_capsules_cite_tests_that_exist() {
    use torchlean::backend::{Obligation, Registry};
    let mut r = Registry::new();
    torchlean_cuda::capsules::register(&mut r).expect("CUDA capsules register");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for e in r.entries() {
        for o in Obligation::ALL {
            for cited in e.capsule.contract(o).evidence.cited_tests() {
                let (file, test) = cited
                    .rsplit_once("::")
                    .unwrap_or_else(|| panic!("{}: `{cited}` is not FILE::test", e.capsule.name));
                let text = std::fs::read_to_string(root.join(file))
                    .unwrap_or_else(|err| panic!("{}: cannot read {file}: {err}", e.capsule.name));
                assert!(
                    text.contains(&format!("#[test]\nfn {test}(")),
                    "{}: `{cited}` is not a test of {file}",
                    e.capsule.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "expected many cited tests, found {checked}");
}

/// Every op of the vocabulary has a CUDA capsule (native_cuda, cublas, or the `torchlean`
/// composition whose parts all have one), with a VJP where the op is differentiable (runs
/// anywhere: no GPU needed to read the registry). Which ones are compositions is listed, so
/// that the report's claim "on CUDA" says what ran.
#[test]
fn every_op_of_the_vocabulary_has_a_cuda_capsule() {
    use torchlean::backend::{Registry, VjpMode};
    let mut r = Registry::new();
    torchlean_cuda::capsules::register(&mut r).expect("CUDA capsules register");
    let mut missing = vec![];
    for &k in OpKind::ALL {
        let found = r
            .entries()
            .iter()
            .find(|e| e.capsule.op == k && e.capsule.device == Device::Cuda);
        match found {
            None => missing.push(k.name()),
            Some(e) if k.differentiable() && e.capsule.vjp_mode == VjpMode::None => {
                missing.push(k.name())
            }
            Some(_) => {}
        }
    }
    assert!(
        missing.is_empty(),
        "no CUDA capsule (or no VJP) for {missing:?}"
    );
    assert_eq!(
        composed_ops(),
        vec![
            OpKind::MseLoss,
            OpKind::ScaledDotProductAttention,
            OpKind::FusedMap,
            OpKind::Conv2dMap
        ],
        "the compositions declared on CUDA changed: update docs/cuda.md"
    );
}

/// `exact` and `|P||Q|` of C = P·Q (P m×k, Q k×n, row-major f64), batch by batch.
fn product_and_allowance(
    p: &[f64],
    q: &[f64],
    m: usize,
    k: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut a) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for l in 0..k {
            let x = p[i * k + l];
            for j in 0..n {
                let y = q[l * n + j];
                c[i * n + j] += x * y;
                a[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, a)
}

fn transpose(v: &[f64], r: usize, c: usize) -> Vec<f64> {
    let mut t = vec![0.0; v.len()];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = v[i * c + j];
        }
    }
    t
}

/// The opt-in TF32 capsules (`cublas.tf32.matmul`, `cublas.tf32.linear`): every element of
/// the forward result and of each VJP product within their declared bound,
/// (2^-9 + γ_k)·(|A||B|)_ij of the exact product; and TF32 really engaged: some element
/// lies outside the f32 capsule's bound γ_k·(|A||B|)_ij (else the capsule would claim a
/// precision it does not use).
#[test]
fn tf32_products_stay_within_their_declared_bound() {
    if !gpu("tf32_products_stay_within_their_declared_bound") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let b = torchlean_cuda::capsules::cublas_tf32_binding();
    let gamma = |k: usize| {
        let ku = k as f64 / (1u64 << 24) as f64;
        ku / (1.0 - ku)
    };
    let (m, k, n) = (64, 256, 96);
    let a = draw(&[m, k], Gen::Normal, 31);
    let w = draw(&[k, n], Gen::Normal, 32);
    let g = draw(&[m, n], Gen::Normal, 33);
    let mut beyond_f32 = 0usize;
    let mut worst = 0.0f64;
    let mut check = |what: &str, got: &[f64], exact: &[f64], allow: &[f64], k: usize| {
        for (i, ((&x, &e), &al)) in got.iter().zip(exact).zip(allow).enumerate() {
            let err = (x - e).abs();
            let bound = (2f64.powi(-9) + gamma(k)) * al + 1e-30;
            assert!(
                err <= bound,
                "{what}: element {i} off by {err:e}, declared bound {bound:e}"
            );
            worst = worst.max(err / bound);
            if err > gamma(k) * al {
                beyond_f32 += 1;
            }
        }
    };
    // matmul: C = A·W, dA = G·Wᵀ, dB = Aᵀ·G
    let (ta, tw, tg) = (on_gpu(&a), on_gpu(&w), on_gpu(&g));
    let y = (b.forward())(&torchlean::graph::Op::Matmul, &[&ta, &tw]).expect("tf32 matmul");
    let (c, al) = product_and_allowance(&a.data, &w.data, m, k, n);
    check("matmul forward", &widen(&y), &c, &al, k);
    let grads = (b.vjp().expect("vjp"))(
        &torchlean::graph::Op::Matmul,
        &[&ta, &tw],
        &y,
        &tg,
        &[true, true],
    )
    .expect("tf32 matmul vjp");
    let (da, da_al) = product_and_allowance(&g.data, &transpose(&w.data, k, n), m, n, k);
    check(
        "matmul dA",
        &widen(grads[0].as_ref().expect("dA")),
        &da,
        &da_al,
        n,
    );
    let (db, db_al) = product_and_allowance(&transpose(&a.data, m, k), &g.data, k, m, n);
    check(
        "matmul dB",
        &widen(grads[1].as_ref().expect("dB")),
        &db,
        &db_al,
        m,
    );
    // linear: y = x·Wᵀ with W [n, k]
    let wt = Array {
        shape: vec![n, k],
        data: transpose(&w.data, k, n),
    };
    let y =
        (b.forward())(&torchlean::graph::Op::Linear, &[&ta, &on_gpu(&wt)]).expect("tf32 linear");
    check("linear forward", &widen(&y), &c, &al, k);
    assert!(
        beyond_f32 > 0,
        "no element outside the f32 bound: TF32 products were not used"
    );
    eprintln!(
        "tf32_products_stay_within_their_declared_bound: worst error / bound {worst:.3}, {beyond_f32} elements outside the f32 bound"
    );
}

/// Trains `make()` for 6 steps (a new batch every step, Adam updating the parameters) twice
/// under checked_cuda in compiled mode: kernel by kernel, and replayed as a device graph.
/// Replay runs the same kernels on the same values, so every loss and every gradient must be
/// bit-identical; the report must say the graph was recorded and replayed.
fn replay_equals_kernel_by_kernel<M: torchlean::nn::Module>(
    name: &str,
    make: impl Fn() -> M,
    batch: impl Fn(u64) -> [Tensor; 2],
) {
    use torchlean::nn::{Adam, Optimizer};
    use torchlean::runtime::compiled::CompiledStep;
    let profile = checked_cuda();
    install(Session::new(profile.clone())).expect("install");
    let loss_of = |m: &M, xs: &[Tensor]| m.forward(&xs[0])?.mse_loss(&xs[1]);
    let named = |s: u64| {
        let [x, y] = batch(s);
        [("x".to_string(), x), ("y".to_string(), y)]
    };
    let mut runs = vec![];
    for replay in [false, true] {
        let mut model = make();
        model.to_device(Device::Cuda).expect("move the model");
        let params: Vec<(String, Tensor)> = model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect();
        let mut step = CompiledStep::build(&named(0), &params, |xs| loss_of(&model, xs), &profile)
            .expect("compile");
        if replay {
            step.replay_as_device_graph();
        }
        let mut opt = Adam::new(1e-2).expect("adam");
        let mut trace: Vec<Vec<f32>> = vec![];
        for s in 0..6 {
            let (loss, grads) = step
                .run_visiting(&named(s), |f| model.visit_parameters(f))
                .expect("step");
            let mut seen = loss.to_vec();
            for (_, p) in model.parameters() {
                seen.extend(grads.get(p).expect("a gradient").to_vec());
            }
            trace.push(seen);
            drop(loss);
            opt.step(&mut model, &grads).expect("update");
        }
        assert_eq!(step.replays_device_graph(), replay, "{name}");
        let text = step.report().to_text();
        if replay {
            assert!(
                text.contains("recorded once") && text.contains("(5 replays)"),
                "{name}: {text}"
            );
            // holding an output across steps is refused: the replay would rewrite it
            let (loss, grads) = step
                .run_visiting(&named(6), |f| model.visit_parameters(f))
                .expect("step");
            drop(grads);
            let err = step
                .run_visiting(&named(7), |f| model.visit_parameters(f))
                .err()
                .expect("a held output is refused");
            assert!(err.to_string().contains("still held"), "{name}: {err}");
            drop(loss);
            step.run_visiting(&named(7), |f| model.visit_parameters(f))
                .expect("a step once the output is dropped");
        }
        eprintln!("{name} (replay {replay}): {text}");
        runs.push(trace);
    }
    for (s, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert_eq!(a.len(), b.len(), "{name} step {s}");
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{name} step {s}: replay differs from kernel-by-kernel (loss {} vs {})",
            a[0], b[0]
        );
    }
}

/// [`replay_equals_kernel_by_kernel`] on an MLP (tanh, 16-64-64-4, batch 32).
fn replay_mlp(name: &str) {
    use torchlean::nn::{Activation, Mlp};
    let on = |t: Tensor| t.to_device(Device::Cuda).expect("to cuda");
    replay_equals_kernel_by_kernel(
        name,
        || Mlp::new(&[16, 64, 64, 4], Activation::Tanh, 0).expect("mlp"),
        |s| {
            [
                on(Tensor::randn(&[32, 16], 100 + s).expect("x")),
                on(Tensor::randn(&[32, 4], 200 + s).expect("y")),
            ]
        },
    );
}

/// [`replay_equals_kernel_by_kernel`] on a causal transformer encoder (2 layers, d 32, 4
/// heads, batch 4 of 16 tokens).
fn replay_transformer(name: &str) {
    use torchlean::nn::{TransformerConfig, TransformerEncoder};
    let on = |t: Tensor| t.to_device(Device::Cuda).expect("to cuda");
    let config = TransformerConfig {
        embed_dim: 32,
        heads: 4,
        ff_dim: 64,
        dropout: 0.0,
        causal: true,
    };
    replay_equals_kernel_by_kernel(
        name,
        || TransformerEncoder::new(config, 2, false, 0).expect("transformer"),
        |s| {
            [
                on(Tensor::randn(&[4, 16, 32], 300 + s).expect("x")),
                on(Tensor::randn(&[4, 16, 32], 400 + s).expect("y")),
            ]
        },
    );
}

#[test]
fn device_graph_replay_equals_kernel_by_kernel_execution() {
    if !gpu("device_graph_replay_equals_kernel_by_kernel_execution") {
        return;
    }
    let on = |t: Tensor| t.to_device(Device::Cuda).expect("to cuda");
    replay_mlp("mlp");
    // the embedding's index check runs at the next read after every replay (see the next test)
    let tokens = |s: u64| {
        let v: Vec<f32> = (0..20)
            .map(|i| ((i * 7 + s as usize * 3) % 10) as f32)
            .collect();
        on(Tensor::from_vec(v, &[4, 5]).expect("tokens"))
    };
    replay_equals_kernel_by_kernel(
        "embedding",
        || torchlean::nn::Embedding::new(10, 8, 0).expect("embedding"),
        |s| {
            [
                tokens(s),
                on(Tensor::randn(&[4, 5, 8], 500 + s).expect("y")),
            ]
        },
    );
    replay_transformer("transformer");
}

/// Layer, RMS and batch norm of finite rows whose statistics overflow f32 (|x| ~ 2^65: the
/// squared deviations pass f32's range; the variance was +inf and every output the bias β,
/// silently): the CUDA kernels rescue them as the spec does (`spec::norm::rescaled_stats`),
/// values and gradients within the conformance tolerance of the f64 spec. The CPU providers'
/// counterpart is crates/torchlean/tests/norm_overflow.rs.
#[test]
fn norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec_on_the_gpu() {
    if !gpu("norms_of_rows_whose_statistics_overflow_f32_match_the_f64_spec_on_the_gpu") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    common::check_overflowing_norms(on_gpu).unwrap_or_else(|e| panic!("{e}"));
}

/// Layer and batch norm of constant rows and channels normalize to exactly β (the mean is
/// taken relative to the first value, so a constant group's is exact), and to NaN with ε = 0,
/// gradients within the conformance tolerance of the f64 spec. The CPU providers'
/// counterpart is crates/torchlean/tests/norm_overflow.rs.
#[test]
fn constant_norm_groups_normalize_to_the_shift_on_the_gpu() {
    if !gpu("constant_norm_groups_normalize_to_the_shift_on_the_gpu") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    common::check_constant_norm_groups(on_gpu).unwrap_or_else(|e| panic!("{e}"));
}

/// Attention with head dimension 0 on the GPU, through the composition (`checked_cuda`) and
/// the fused kernels (`prefer:native_cuda`): every score is the empty dot product, so each
/// output row is the mean of the value rows (PyTorch's result; the default scale 1/√0 made it
/// NaN), causal rows the mean of the keys they see; v's gradient for a cotangent of ones is
/// the sum of the weights. The CPU's counterpart: tests/pytorch_semantics.rs.
#[test]
fn attention_with_an_empty_head_dimension_averages_the_values_on_the_gpu() {
    if !gpu("attention_with_an_empty_head_dimension_averages_the_values_on_the_gpu") {
        return;
    }
    let (l, s, dv) = (3usize, 4usize, 5usize);
    let v: Vec<f32> = (0..2 * s * dv).map(|i| (i as f32 * 0.37).sin()).collect();
    for provider in [None, Some("prefer:native_cuda")] {
        let profile = match provider {
            None => checked_cuda(),
            Some(p) => {
                BackendProfile::resolve(None, Some("cuda"), Some(p), Some("checked-runtime"))
                    .expect("profile")
            }
        };
        install(Session::new(profile)).expect("install");
        let on = |data: Vec<f32>, shape: &[usize]| {
            Tensor::from_vec(data, shape)
                .and_then(|t| t.to_device(Device::Cuda))
                .expect("upload")
                .requires_grad()
        };
        let q = on(vec![], &[1, 2, l, 0]);
        let k = on(vec![], &[1, 2, s, 0]);
        let vt = on(v.clone(), &[1, 2, s, dv]);
        for causal in [false, true] {
            let what = format!("{provider:?} causal {causal}");
            let y = q
                .scaled_dot_product_attention(&k, &vt, None, causal, None)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let grads = y.sum_all().and_then(|t| t.backward()).expect("backward");
            let gv = grads.get(&vt).expect("dv").try_to_vec().expect("read");
            let got = y.try_to_vec().expect("read");
            common::check_empty_head_attention((l, s, dv), &v, causal, &got, &gv)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
}

/// A recording captures the module's one stream: work another thread launched meanwhile
/// would be recorded instead of run, its reads refused and its buffers given to the graph.
/// The recording waits for the other threads' calls in flight and holds their new ones until
/// it ends (`exclusive.rs`): here a thread adds, multiplies (large maps and queued small
/// ones) and reads in a loop while this one records and replays compiled steps; every
/// iteration of that thread gets the CPU's bits (the maps are correctly rounded on both
/// devices), and the replays the bits of kernel-by-kernel execution.
#[test]
fn a_recording_runs_alone_while_another_thread_uses_the_gpu() {
    if !gpu("a_recording_runs_alone_while_another_thread_uses_the_gpu") {
        return;
    }
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let busy = {
        let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
        std::thread::spawn(move || -> Result<u64, String> {
            // the CPU's bits under a CPU session, then the GPU's under a CUDA one
            install(Session::new(
                BackendProfile::named("checked_cpu").map_err(|e| e.to_string())?,
            ))
            .map_err(|e| e.to_string())?;
            let pairs: Vec<(Tensor, Tensor)> = [4096usize, 16]
                .iter()
                .map(|&n| {
                    let a = Tensor::randn(&[n], 7 + n as u64).expect("a");
                    let b = Tensor::randn(&[n], 8 + n as u64).expect("b");
                    (a, b)
                })
                .collect();
            let bits = |t: &Tensor| -> Result<Vec<u32>, String> {
                Ok(t.to_cpu()
                    .map_err(|e| e.to_string())?
                    .to_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect())
            };
            let mut want = vec![];
            for (a, b) in &pairs {
                want.push(bits(
                    &a.add(b).and_then(|s| s.mul(a)).map_err(|e| e.to_string())?,
                )?);
            }
            torchlean::runtime::take().map_err(|e| e.to_string())?;
            install(Session::new(checked_cuda())).map_err(|e| e.to_string())?;
            let mut on_gpu = vec![];
            for (a, b) in &pairs {
                let ga = a.to_device(Device::Cuda).map_err(|e| e.to_string())?;
                let gb = b.to_device(Device::Cuda).map_err(|e| e.to_string())?;
                on_gpu.push((ga, gb));
            }
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for (k, (a, b)) in on_gpu.iter().enumerate() {
                    let got = a
                        .add(b)
                        .and_then(|s| s.mul(a))
                        .map_err(|e| format!("iteration {n}: {e}"))?;
                    if bits(&got).map_err(|e| format!("iteration {n}: {e}"))? != want[k] {
                        return Err(format!(
                            "iteration {n}, size {}: not the CPU's bits",
                            a.numel()
                        ));
                    }
                }
                n += 1;
                rounds.store(n, Ordering::SeqCst);
            }
            Ok(n)
        })
    };
    while rounds.load(Ordering::SeqCst) < 3 && !busy.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let before = rounds.load(Ordering::SeqCst);
    replay_mlp("mlp beside a busy thread");
    replay_transformer("transformer beside a busy thread");
    let during = rounds.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::SeqCst);
    let total = busy
        .join()
        .expect("the busy thread panicked")
        .expect("the busy thread's results");
    eprintln!("the busy thread ran {total} rounds, {during} of them during the compiled steps");
    assert!(
        during > 0,
        "the busy thread never ran beside the recordings"
    );
}

/// An index kernel's check (the invalid-index flag) runs at the next read of device values
/// to the host — directly and after every replay of a recorded step: an invalid index fails
/// that read with the spec's error (the same in both), the call itself costs no
/// synchronization, and the next valid step runs.
#[test]
fn an_invalid_index_fails_at_the_next_read_directly_and_in_a_replay() {
    if !gpu("an_invalid_index_fails_at_the_next_read_directly_and_in_a_replay") {
        return;
    }
    use torchlean::nn::{Embedding, Module};
    use torchlean::runtime::compiled::CompiledStep;
    let profile = checked_cuda();
    install(Session::new(profile.clone())).expect("install");
    let mut model = Embedding::new(10, 8, 0).expect("embedding");
    model.to_device(Device::Cuda).expect("move");
    let batch = |top: f32| {
        let v: Vec<f32> = (0..20).map(|i| (i % 10) as f32).collect();
        let mut v = v;
        v[13] = top;
        [
            (
                "x".to_string(),
                Tensor::from_vec(v, &[4, 5])
                    .expect("x")
                    .to_device(Device::Cuda)
                    .expect("x"),
            ),
            (
                "y".to_string(),
                Tensor::randn(&[4, 5, 8], 9)
                    .expect("y")
                    .to_device(Device::Cuda)
                    .expect("y"),
            ),
        ]
    };
    let params: Vec<(String, Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let mut step = CompiledStep::build(
        &batch(3.0),
        &params,
        |xs| model.forward(&xs[0])?.mse_loss(&xs[1]),
        &profile,
    )
    .expect("compile");
    step.replay_as_device_graph();
    for _ in 0..3 {
        step.run_visiting(&batch(3.0), |f| model.visit_parameters(f))
            .expect("a valid step");
    }
    assert!(step.replays_device_graph());
    let before = host_reads();
    let bad = batch(10.0);
    let launched = model
        .forward(&bad[0].1)
        .expect("the call launches without waiting for the device");
    assert_eq!(host_reads(), before, "the call read nothing");
    assert!(torchlean_cuda::graph::pending_checks() > 0);
    let direct = launched
        .try_to_vec()
        .expect_err("the next read refuses index 10")
        .to_string();
    assert_eq!(torchlean_cuda::graph::pending_checks(), 0);
    let replayed = step
        .run_visiting(&bad, |f| model.visit_parameters(f))
        .and_then(|(loss, _)| loss.try_to_vec())
        .expect_err("the read after a replay refuses index 10")
        .to_string();
    // the same error (the replay's may carry the compiled step's context around it)
    assert!(
        replayed.contains(&direct) || direct.contains(&replayed),
        "replayed: {replayed}\ndirect: {direct}"
    );
    step.run_visiting(&batch(3.0), |f| model.visit_parameters(f))
        .expect("a valid step after the refused one");
    // two replays without a read between them: the second waits for the first's checks
    // (it reuses the flag and index buffers they read), so the invalid index is not lost
    step.run_visiting(&bad, |f| model.visit_parameters(f))
        .expect("the replay launches without a read");
    let second = step
        .run_visiting(&batch(3.0), |f| model.visit_parameters(f))
        .and_then(|(loss, _)| loss.try_to_vec())
        .expect_err("the next replay reports the previous replay's invalid index")
        .to_string();
    assert!(
        second.contains(&direct) || direct.contains(&second),
        "second: {second}\ndirect: {direct}"
    );
    step.run_visiting(&batch(3.0), |f| model.visit_parameters(f))
        .and_then(|(loss, _)| loss.try_to_vec())
        .expect("a valid step after that");
    eprintln!("refused as a direct call is: {replayed}");
}

/// A training step on the GPU of a model with index kernels (an embedding: `index_select`
/// forward, `scatter_add`-style VJP) reads one value from the device, its loss, in eager and
/// in compiled mode: the index kernels' checks wait for that read instead of reading a flag
/// per call.
#[test]
fn a_training_step_with_an_embedding_reads_one_value() {
    if !gpu("a_training_step_with_an_embedding_reads_one_value") {
        return;
    }
    use torchlean::backend::ExecutionMode;
    use torchlean::nn::train::TrainStep;
    use torchlean::nn::{Adam, Embedding, Module};
    let profile = checked_cuda();
    install(Session::new(profile.clone())).expect("install");
    for mode in [ExecutionMode::Eager, ExecutionMode::Compiled] {
        let mut model = Embedding::new(10, 8, 0).expect("embedding");
        model.to_device(Device::Cuda).expect("move");
        let idx: Vec<f32> = (0..20).map(|i| ((i * 7) % 10) as f32).collect();
        let inputs = [
            (
                "x".to_string(),
                Tensor::from_vec(idx, &[4, 5])
                    .and_then(|t| t.to_device(Device::Cuda))
                    .expect("x"),
            ),
            (
                "y".to_string(),
                Tensor::randn(&[4, 5, 8], 9)
                    .and_then(|t| t.to_device(Device::Cuda))
                    .expect("y"),
            ),
        ];
        let loss_fn = |m: &dyn Module, xs: &[Tensor]| m.forward(&xs[0])?.mse_loss(&xs[1]);
        let step = TrainStep::new(mode, &model, &inputs, &loss_fn, &profile).expect("step");
        let mut opt = Adam::new(1e-2).expect("adam");
        // warm-up: the compiled step records its device graph on its second run
        let mut last = f32::INFINITY;
        for _ in 0..3 {
            last = step
                .run(&mut model, &mut opt, &inputs, &loss_fn)
                .expect("step");
        }
        let before = host_reads();
        for _ in 0..5 {
            let loss = step
                .run(&mut model, &mut opt, &inputs, &loss_fn)
                .expect("step");
            assert!(
                loss.is_finite() && loss < last,
                "{mode:?}: the loss goes down"
            );
            last = loss;
        }
        assert_eq!(
            host_reads() - before,
            5,
            "{mode:?}: one read per step (the loss), none per index kernel"
        );
        assert_eq!(torchlean_cuda::graph::pending_checks(), 0);
    }
}

/// `copy_many` (a device graph's inputs and parameters before a replay, one launch) copies
/// every pair whole — lengths that are and are not multiples of four, from 1 to 70 000
/// elements — and refuses pairs of different lengths before copying anything.
#[test]
fn copy_many_copies_every_pair_in_one_batch() {
    if !gpu("copy_many_copies_every_pair_in_one_batch") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let lens = [1usize, 3, 4, 5, 64, 1000, 4097, 70_000];
    let src: Vec<Tensor> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            Tensor::randn(&[n], 40 + i as u64)
                .and_then(|t| t.to_device(Device::Cuda))
                .expect("source")
        })
        .collect();
    let dst: Vec<Tensor> = lens
        .iter()
        .map(|&n| Tensor::zeros_on(&[n], Device::Cuda).expect("destination"))
        .collect();
    let buffers = |ts: &[Tensor]| -> Vec<std::sync::Arc<dyn torchlean::tensor::DeviceBuffer>> {
        ts.iter()
            .map(|t| t.device_buffer().expect("device").clone())
            .collect()
    };
    let (d, s) = (buffers(&dst), buffers(&src));
    let pairs: Vec<_> = d.iter().zip(&s).map(|(d, s)| (&**d, &**s)).collect();
    torchlean::module::copy_many(&pairs).expect("copy_many");
    for ((a, b), n) in dst.iter().zip(&src).zip(lens) {
        assert_eq!(
            a.to_cpu().expect("read").data().to_vec(),
            b.to_cpu().expect("read").data().to_vec(),
            "{n} elements"
        );
    }
    // a valid pair first, then 1 element into 5: refused, and the valid one not copied
    let fresh: Vec<Tensor> = (0..2)
        .map(|_| Tensor::zeros_on(&[5], Device::Cuda).expect("destination"))
        .collect();
    let f = buffers(&fresh);
    let bad = [(&*f[0], &*s[3]), (&*f[1], &*s[0])];
    assert!(
        torchlean::module::copy_many(&bad).is_err(),
        "1 element into 5 is refused"
    );
    assert_eq!(
        fresh[0].to_cpu().expect("read").data().to_vec(),
        vec![0.0; 5]
    );
}

/// The launch queue (`src/queue.rs`): every small map of the table that it takes gives the
/// bits of the same call launched on its own (the input tiled past the queue's size limit, so
/// that the call is launched directly), special values included; a chain of dependent adds
/// longer than the queue gives the CPU's bits; a queued result read by a directly launched
/// kernel (a large add), by cuBLAS (a matmul) and by the host is the value it should be.
#[test]
fn queued_maps_give_the_direct_launches_bits() {
    if !gpu("queued_maps_give_the_direct_launches_bits") {
        return;
    }
    use torchlean::graph::Op;
    use torchlean_cuda::queue::{CAPACITY, SMALL};
    assert!(
        torchlean_cuda::queue::enabled(),
        "the test needs the queue on (TORCHLEAN_LAUNCH_QUEUE unset)"
    );
    install(Session::new(checked_cuda())).expect("install");
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.try_to_vec().expect("read back");
        v.iter().map(|x| x.to_bits()).collect()
    };
    let mut failures = vec![];
    let mut compared = 0;
    for (index, case) in rows() {
        let kind = case.op.kind();
        let queued =
            elementwise::binary_code(kind).is_some() || elementwise::unary_code(&case.op).is_some();
        let xs = inputs(&case, index);
        let n = xs.first().map_or(0, |x| x.data.len());
        if !queued || n == 0 || n > SMALL || xs.iter().any(|x| x.shape != xs[0].shape) {
            continue;
        }
        let small: Vec<Tensor> = xs.iter().map(on_gpu).collect();
        // the same values repeated past SMALL elements: launched on its own
        let reps = SMALL / n + 1;
        let large: Vec<Tensor> = xs
            .iter()
            .map(|x| {
                let v: Vec<f32> = (0..reps)
                    .flat_map(|_| x.data.iter().map(|&v| v as f32))
                    .collect();
                Tensor::from_vec(v, &[n * reps])
                    .and_then(|t| t.to_device(Device::Cuda))
                    .expect("upload")
            })
            .collect();
        let got = elementwise::forward(&case.op, &small.iter().collect::<Vec<_>>());
        let direct = elementwise::forward(&case.op, &large.iter().collect::<Vec<_>>());
        match (got, direct) {
            (Ok(got), Ok(direct)) => {
                if bits(&got) != bits(&direct)[..n] {
                    failures.push(format!(
                        "{}: queued bits differ from the direct launch's",
                        case.name()
                    ));
                }
                compared += 1;
            }
            (a, b) => failures.push(format!("{}: {:?} / {:?}", case.name(), a.err(), b.err())),
        }
    }
    // a dependent chain longer than the queue: x ← x + y, 3·CAPACITY + 5 times, against the
    // CPU's f32 additions (exact IEEE sums on both)
    let (x0, y0) = (
        Tensor::randn(&[37], 71).expect("x"),
        Tensor::randn(&[37], 72).expect("y"),
    );
    let (mut x, y) = (
        x0.to_device(Device::Cuda).expect("x"),
        y0.to_device(Device::Cuda).expect("y"),
    );
    let mut want = x0.to_vec();
    for _ in 0..3 * CAPACITY + 5 {
        x = elementwise::forward(&Op::Add, &[&x, &y]).expect("add");
        want.iter_mut().zip(y0.to_vec()).for_each(|(a, b)| *a += b);
    }
    // read first by a directly launched kernel and by cuBLAS, then by the host
    let big = Tensor::ones(&[SMALL + 1])
        .and_then(|t| t.to_device(Device::Cuda))
        .expect("ones");
    let small_sum = elementwise::forward(&Op::Add, &[&x, &x]).expect("queued 2x");
    let wide = Tensor::concat(&[&small_sum, &big], 0).expect("concat");
    let wide = elementwise::forward(&Op::Add, &[&wide, &wide]).expect("direct add");
    let row = small_sum.reshape(&[1, 37]).expect("row");
    let col = Tensor::ones(&[37, 1])
        .and_then(|t| t.to_device(Device::Cuda))
        .expect("col");
    let dot = row
        .matmul(&col)
        .expect("matmul")
        .try_to_vec()
        .expect("read");
    let chain: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    if bits(&x) != chain {
        failures.push(format!(
            "a chain of {} queued adds: not the CPU's bits",
            3 * CAPACITY + 5
        ));
    }
    let wide = wide.try_to_vec().expect("read");
    let doubled: Vec<f32> = want.iter().map(|v| 4.0 * v).collect();
    if wide[..37] != doubled[..] || wide[37..].iter().any(|&v| v != 2.0) {
        failures.push("a direct launch read a queued result wrongly".into());
    }
    let sum: f64 = want.iter().map(|&v| 2.0 * f64::from(v)).sum();
    if (f64::from(dot[0]) - sum).abs() > 1e-4 * (1.0 + sum.abs()) {
        failures.push(format!(
            "cuBLAS read a queued result: {} against {sum}",
            dot[0]
        ));
    }
    assert!(
        failures.is_empty(),
        "{} failures ({compared} rows compared):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        compared > 10,
        "only {compared} rows of the table were queued maps"
    );
    eprintln!("queued_maps_give_the_direct_launches_bits: {compared} rows, the chain and the readers passed");
}

/// `TrainStep::run_queued` reads nothing on the host (the update queues behind the backward),
/// and trains exactly as `run`, which reads the loss first: the same parameters, bit for bit,
/// in eager and compiled (graph replay) mode; the deferred index checks run at the next
/// synchronization.
#[test]
fn queued_steps_read_nothing_and_train_as_read_steps_on_the_gpu() {
    if !gpu("queued_steps_read_nothing_and_train_as_read_steps_on_the_gpu") {
        return;
    }
    use torchlean::backend::ExecutionMode;
    use torchlean::nn::train::TrainStep;
    use torchlean::nn::{Adam, Embedding, Module};
    let profile = checked_cuda();
    install(Session::new(profile.clone())).expect("install");
    let on = |t: torchlean::Result<Tensor>| t.and_then(|t| t.to_device(Device::Cuda));
    let idx: Vec<f32> = (0..20).map(|i| ((i * 3) % 10) as f32).collect();
    let inputs = [
        (
            "x".to_string(),
            on(Tensor::from_vec(idx, &[4, 5])).expect("x"),
        ),
        (
            "y".to_string(),
            on(Tensor::randn(&[4, 5, 8], 2)).expect("y"),
        ),
    ];
    let loss_fn = |m: &dyn Module, xs: &[Tensor]| m.forward(&xs[0])?.mse_loss(&xs[1]);
    for mode in [ExecutionMode::Eager, ExecutionMode::Compiled] {
        let trained = |queued: bool| -> Vec<Vec<f32>> {
            let mut model = Embedding::new(10, 8, 1).expect("embedding");
            model.to_device(Device::Cuda).expect("move");
            let step = TrainStep::new(mode, &model, &inputs, &loss_fn, &profile).expect("step");
            let mut opt = Adam::new(1e-2).expect("adam");
            let before = host_reads();
            for _ in 0..4 {
                if queued {
                    step.run_queued(&mut model, &mut opt, &inputs, &loss_fn)
                        .expect("queued step");
                } else {
                    step.run(&mut model, &mut opt, &inputs, &loss_fn)
                        .expect("step");
                }
            }
            let reads = host_reads() - before;
            assert_eq!(
                reads,
                if queued { 0 } else { 4 },
                "{mode:?} queued={queued}"
            );
            torchlean::module::synchronize(Device::Cuda).expect("synchronize");
            assert_eq!(torchlean_cuda::graph::pending_checks(), 0);
            model
                .parameters()
                .iter()
                .map(|(_, p)| p.to_cpu().expect("read").data().to_vec())
                .collect()
        };
        assert_eq!(trained(false), trained(true), "{mode:?}");
    }
}

/// On the GPU a training step reads one value (the loss plus zero times every gradient's
/// sum): a non-finite loss still stops the step as `NonFiniteLoss`, and a finite loss with a
/// non-finite gradient (0 · d sqrt(x)/dx at x = 0) as `NonFiniteGradient` naming the
/// tensor, both with the parameters unchanged — as on the CPU (`nn_train.rs`).
#[test]
fn non_finite_steps_stop_on_the_gpu_as_on_the_cpu() {
    if !gpu("non_finite_steps_stop_on_the_gpu_as_on_the_cpu") {
        return;
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use torchlean::nn::{
        Activation, Adam, Config, Error as NnError, Mlp, Module, Task, TrainError, TrainOptions,
        Trainer,
    };
    for kind in ["loss", "gradient"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let task = Task::custom("non-finite-at-3", move |p: &Tensor, y: &Tensor| {
            let l = torchlean::nn::mse(p, y)?;
            // call 0 is the shape-only trace that finds the ops to plan; call 3 is step 3
            if counter.fetch_add(1, Ordering::SeqCst) != 3 {
                Ok(l)
            } else if kind == "loss" {
                l.scale(f32::NAN)
            } else {
                l.add(&p.sub(p)?.sqrt()?.sum_all()?.scale(0.0)?)
            }
        });
        let mut model = Mlp::new(&[4, 16, 1], Activation::Tanh, 1).expect("mlp");
        model.to_device(Device::Cuda).expect("move");
        let mut config = Config::new(task, Adam::new(0.01).expect("adam"));
        config.profile = Some(checked_cuda());
        let mut t = Trainer::new(model, config).expect("trainer");
        let data = torchlean::data::synthetic::regression(64, 2).expect("data");
        let opts = TrainOptions {
            steps: 10,
            batch_size: 16,
            ..Default::default()
        };
        let e = t.train(&data, &opts).expect_err("step 3 stops");
        match (&e, kind) {
            (NnError::Train(TrainError::NonFiniteLoss { step, loss, .. }), "loss") => {
                assert_eq!(*step, 3);
                assert!(loss.is_nan());
            }
            (
                NnError::Train(TrainError::NonFiniteGradient {
                    step,
                    tensor,
                    value,
                    ..
                }),
                "gradient",
            ) => {
                assert_eq!(*step, 3);
                assert!(tensor.starts_with("gradient of `"), "{tensor}");
                assert!(!value.is_finite());
            }
            (other, _) => panic!("{kind}: unexpected {other:?}"),
        }
        assert_eq!(t.step(), 2, "{kind}");
        assert!(t
            .model()
            .parameters()
            .iter()
            .all(|(_, p)| p.to_vec().iter().all(|v| v.is_finite())));
        eprintln!("{kind}: {e}");
    }
}

/// RMSprop (plain, momentum, centered), Adagrad and Adam/AdamW with amsgrad on the GPU update
/// with ops of the session (no host round trip): 20 steps of the quickstart MLP give the
/// CPU's losses within 1e-4 relative, and every update kernel in the report is a CUDA one.
#[test]
fn rmsprop_and_adagrad_on_the_gpu_match_the_cpu() {
    if !gpu("rmsprop_and_adagrad_on_the_gpu_match_the_cpu") {
        return;
    }
    use torchlean::nn::tasks::SyntheticRegression;
    use torchlean::nn::{
        train::train_regression, Activation, Adagrad, Mlp, Module, Optimizer, RmsProp,
    };
    type Make = fn() -> Box<dyn Optimizer>;
    let optimizers: Vec<(&str, Make)> = vec![
        ("rmsprop", || Box::new(RmsProp::new(0.01).expect("rmsprop"))),
        ("rmsprop momentum centered", || {
            let mut r = RmsProp::new(0.01).expect("rmsprop");
            r.momentum = 0.9;
            r.centered = true;
            r.weight_decay = 0.01;
            Box::new(r)
        }),
        ("adagrad", || Box::new(Adagrad::new(0.05).expect("adagrad"))),
        // amsgrad runs per parameter on every device (ema_update, maximum, adam_update)
        ("adam amsgrad", || {
            let mut a = torchlean::nn::Adam::new(0.01).expect("adam");
            a.amsgrad = true;
            Box::new(a)
        }),
        ("adamw amsgrad", || {
            let mut a = torchlean::nn::AdamW::new(0.01).expect("adamw");
            a.amsgrad = true;
            Box::new(a)
        }),
    ];
    for (name, make) in optimizers {
        let run = |profile: &str| -> (Vec<f32>, String) {
            let profile = BackendProfile::named(profile).expect("profile");
            let device = profile.device;
            install(Session::new(profile)).expect("install");
            let mut model = Mlp::new(&[4, 32, 1], Activation::Tanh, 0).expect("model");
            model.to_device(device).expect("move the model");
            let data = SyntheticRegression::new(512, 5).expect("data");
            let mut opt = make();
            let losses = train_regression(&mut model, opt.as_mut(), &data, 20, 32, 0, |_| {})
                .expect("train");
            let report = torchlean::runtime::with_current(|s| s.report()).expect("report");
            (losses, report.to_text())
        };
        let (cpu, _) = run("checked_cpu");
        let (gpu, text) = run("checked_cuda");
        for (step, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
            assert!(
                (g - c).abs() / c.abs().max(1e-12) < 1e-4,
                "{name} step {step}: gpu {g} vs cpu {c}"
            );
        }
        assert!(
            !text.contains("provider=native_cpu") && !text.contains("provider=reference"),
            "{name}: a CPU kernel ran:\n{text}"
        );
        eprintln!("{name}: gpu {:?}", &gpu[gpu.len() - 3..]);
    }
}

/// `cublas.linear` through cuBLASLt (bias epilogue in the forward, bias-gradient epilogue
/// in the weight gradient's product): at shapes of a transformer's projections, every
/// element of y = x·Wᵀ + b, dX, dW and db within the f32 product bound γ_k·(|A||B|)_ij (+
/// one rounding of the bias add) of the exact f64 values; the same for an unbatched
/// `cublas.matmul` (stacked rows times a shared right side) and its VJP; and cuBLASLt really
/// ran (its count of products grew), unless `TORCHLEAN_CUBLASLT` chose the classic API.
#[test]
fn cublaslt_linear_products_stay_within_the_f32_bound() {
    if !gpu("cublaslt_linear_products_stay_within_the_f32_bound") {
        return;
    }
    install(Session::new(checked_cuda())).expect("install");
    let cx = torchlean_cuda::device::context().expect("context");
    let before = cx.lt().stats();
    let b = cublas_binding();
    let gamma = |k: usize| {
        let ku = k as f64 / (1u64 << 24) as f64;
        ku / (1.0 - ku)
    };
    let ulp = 2f64.powi(-24);
    let mut worst = 0.0f64;
    for (rows, i, o, seed) in [(512, 256, 768, 41u64), (300, 64, 40, 42), (7, 5, 3, 43)] {
        let x = draw(&[rows, i], Gen::Normal, seed);
        let w = draw(&[o, i], Gen::Normal, seed + 100);
        let bias = draw(&[o], Gen::Normal, seed + 200);
        let g = draw(&[rows, o], Gen::Normal, seed + 300);
        let (tx, tw, tb, tg) = (on_gpu(&x), on_gpu(&w), on_gpu(&bias), on_gpu(&g));
        let op = torchlean::graph::Op::Linear;
        let y = (b.forward())(&op, &[&tx, &tw, &tb]).expect("linear");
        let grads = (b.vjp().expect("vjp"))(&op, &[&tx, &tw, &tb], &y, &tg, &[true; 3])
            .expect("linear vjp");
        let mut check = |what: &str, got: &Tensor, exact: &[f64], allow: &[f64], k: usize| {
            for (e, ((&v, &ex), &al)) in widen(got).iter().zip(exact).zip(allow).enumerate() {
                let err = (v - ex).abs();
                let bound = gamma(k + 1) * al + ulp * ex.abs() + 1e-30;
                assert!(
                    err <= bound,
                    "{what} [{rows}x{i} -> {o}]: element {e} off by {err:e}, bound {bound:e}"
                );
                worst = worst.max(err / bound);
            }
        };
        // y = x·Wᵀ + b: the product's allowance plus |b|
        let (mut c, mut al) = product_and_allowance(&x.data, &transpose(&w.data, o, i), rows, i, o);
        for r in 0..rows {
            for j in 0..o {
                c[r * o + j] += bias.data[j];
                al[r * o + j] += bias.data[j].abs();
            }
        }
        check("y", &y, &c, &al, i);
        let (dx, dx_al) = product_and_allowance(&g.data, &w.data, rows, o, i);
        check("dX", grads[0].as_ref().expect("dX"), &dx, &dx_al, o);
        let (dw, dw_al) = product_and_allowance(&transpose(&g.data, rows, o), &x.data, o, rows, i);
        check("dW", grads[1].as_ref().expect("dW"), &dw, &dw_al, rows);
        let ones = vec![1.0; rows];
        let (db, db_al) = product_and_allowance(&ones, &g.data, 1, rows, o);
        check("db", grads[2].as_ref().expect("db"), &db, &db_al, rows);
    }
    // matmul with a shared right side (one product over the stacked rows), forward and VJP
    let (bt, m, k, n) = (3, 40, 64, 48);
    let a = draw(&[bt, m, k], Gen::Normal, 51);
    let w = draw(&[k, n], Gen::Normal, 52);
    let g = draw(&[bt, m, n], Gen::Normal, 53);
    let (ta, tw, tg) = (on_gpu(&a), on_gpu(&w), on_gpu(&g));
    let op = torchlean::graph::Op::Matmul;
    let y = (b.forward())(&op, &[&ta, &tw]).expect("matmul");
    let grads = (b.vjp().expect("vjp"))(&op, &[&ta, &tw], &y, &tg, &[true; 2]).expect("vjp");
    let mut check = |what: &str, got: &Tensor, exact: &[f64], allow: &[f64], k: usize| {
        for (e, ((&v, &ex), &al)) in widen(got).iter().zip(exact).zip(allow).enumerate() {
            let (err, bound) = ((v - ex).abs(), gamma(k) * al + 1e-30);
            assert!(
                err <= bound,
                "matmul {what}: element {e} off by {err:e}, bound {bound:e}"
            );
            worst = worst.max(err / bound);
        }
    };
    let (c, al) = product_and_allowance(&a.data, &w.data, bt * m, k, n);
    check("C", &y, &c, &al, k);
    let (da, da_al) = product_and_allowance(&g.data, &transpose(&w.data, k, n), bt * m, n, k);
    check("dA", grads[0].as_ref().expect("dA"), &da, &da_al, n);
    let (dw, dw_al) = product_and_allowance(&transpose(&a.data, bt * m, k), &g.data, k, bt * m, n);
    check("dB", grads[1].as_ref().expect("dB"), &dw, &dw_al, bt * m);
    let after = cx.lt().stats();
    if cx.lt_products.forward && cx.lt_products.vjp {
        assert!(
            after.products >= before.products + 12,
            "cuBLASLt ran {} products for 12 asked ({} declined)",
            after.products - before.products,
            after.declined - before.declined
        );
    }
    eprintln!(
        "cublaslt_linear_products_stay_within_the_f32_bound: worst error / bound {worst:.3}; cuBLASLt products {}, declined {}",
        after.products - before.products,
        after.declined - before.declined
    );
}

/// Layout copies on the device — permute and slice, forward and VJP, over shapes whose
/// innermost axis takes the 16-byte path (dense, a multiple of 4, aligned offsets) and
/// shapes that do not — equal the host's bit for bit; a reshape (and its VJP) shares its
/// input's device buffer instead of copying it.
#[test]
fn layout_copies_and_reshape_views_match_the_host() {
    if !gpu("layout_copies_and_reshape_views_match_the_host") {
        return;
    }
    // (shape, permutation, (slice axis, start, end))
    type CopyCase = (Vec<usize>, Vec<usize>, (usize, usize, usize));
    let cases: Vec<CopyCase> = vec![
        (vec![2, 8, 4, 16], vec![0, 2, 1, 3], (3, 4, 12)),
        (vec![3, 5, 7, 6], vec![0, 2, 1, 3], (3, 1, 5)),
        (vec![4, 12, 8], vec![2, 0, 1], (2, 4, 8)),
        (vec![2, 3, 4, 8], vec![1, 0, 3, 2], (1, 1, 3)),
    ];
    for (shape, axes, (axis, start, end)) in cases {
        let x = draw(&shape, Gen::Normal, 77);
        let host = Tensor::from_vec(x.data.iter().map(|&v| v as f32).collect(), &shape)
            .expect("host tensor");
        let run = |device: Device| -> Vec<Vec<f32>> {
            let profile = if device == Device::Cuda {
                checked_cuda()
            } else {
                BackendProfile::named("checked_cpu").expect("profile")
            };
            install(Session::new(profile)).expect("install");
            let t = host.to_device(device).expect("move").requires_grad();
            let p = t.permute(&axes).expect("permute");
            let s = t.slice(axis, start, end).expect("slice");
            let loss = p
                .mul(&p)
                .and_then(|q| q.sum_all())
                .and_then(|a| s.mul(&s).and_then(|q| q.sum_all()).and_then(|b| a.add(&b)))
                .expect("loss");
            let g = loss.backward().expect("backward");
            vec![
                p.try_to_vec().expect("p"),
                s.try_to_vec().expect("s"),
                g.get(&t).expect("grad").try_to_vec().expect("g"),
            ]
        };
        let (cpu, gpu_values) = (run(Device::Cpu), run(Device::Cuda));
        for (k, (a, b)) in cpu.iter().zip(&gpu_values).enumerate() {
            let same =
                a.len() == b.len() && a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(same, "shape {shape:?}: value {k} (permute {axes:?}, slice {axis} {start}..{end}) differs from the host");
        }
    }
    install(Session::new(checked_cuda())).expect("install");
    let t = on_gpu(&draw(&[6, 10], Gen::Normal, 5)).requires_grad();
    let r = t.reshape(&[3, 20]).expect("reshape");
    assert!(
        r.shares_storage_with(&t),
        "a device reshape copied its input"
    );
    assert_eq!(r.try_to_vec().expect("r"), t.try_to_vec().expect("t"));
    let g = r.sum_all().and_then(|l| l.backward()).expect("backward");
    assert_eq!(g.get(&t).expect("grad").shape(), &[6, 10]);
}

/// The VJPs' selected zeros on the GPU (thirty-seventh session, `elementwise.cu`'s
/// `unary_grad`, `clamp_vjp`, `binary_grad_term`, and `fused.rs`'s `fused_derivative`):
/// where relu, clamp, maximum/minimum's loser, safe_log and pow 0 select, the input's
/// cotangent is exactly 0 even when the cotangent from later ops is infinite (sqrt's at 0, a
/// scale by ∞), and abs multiplies (NaN at 0) — the same gradients as `checked_cpu`, whose
/// values `crates/torchlean/tests/selected_zero_grads.rs` holds to PyTorch's. The table's
/// rows above draw finite cotangents only, so they cannot tell a selected 0 from 0 · ∞.
#[test]
fn selected_zeros_stay_zero_under_infinite_cotangents_on_the_gpu() {
    use torchlean::graph::Op;
    if !gpu("selected_zeros_stay_zero_under_infinite_cotangents_on_the_gpu") {
        return;
    }
    let x = [-2.0f32, -0.5, 0.0, 0.25, 4.0];
    let inf = f32::INFINITY;
    let un = |t: &Tensor, op: Op| t.apply(op, &[]).expect("op");
    let full = |t: &Tensor, v: f32| {
        Tensor::from_vec(vec![v; 5], &[5])
            .and_then(|c| c.to_device(t.device()))
            .expect("constant")
    };
    type Expr = Box<dyn Fn(&Tensor) -> Tensor>;
    let cases: Vec<(&str, Expr)> = vec![
        (
            "sqrt(relu(x))",
            Box::new(move |t| un(&un(t, Op::Relu), Op::Sqrt)),
        ),
        (
            "sqrt(maximum(x, 0))",
            Box::new(move |t| {
                un(
                    &t.apply(Op::Maximum, &[&full(t, 0.0)]).expect("max"),
                    Op::Sqrt,
                )
            }),
        ),
        (
            "minimum(x, 1) · inf",
            Box::new(move |t| {
                let m = t.apply(Op::Minimum, &[&full(t, 1.0)]).expect("min");
                un(&m, Op::Scale { factor: inf })
            }),
        ),
        (
            "sqrt(clamp(x, 0, 3))",
            Box::new(move |t| un(&un(t, Op::Clamp { min: 0.0, max: 3.0 }), Op::Sqrt)),
        ),
        (
            "sqrt(abs(x))",
            Box::new(move |t| un(&un(t, Op::Abs), Op::Sqrt)),
        ),
        (
            "pow(x, 0) · inf",
            Box::new(move |t| un(&un(t, Op::Pow { exponent: 0.0 }), Op::Scale { factor: inf })),
        ),
        (
            "safe_log(x, 0.1) · inf",
            Box::new(move |t| un(&un(t, Op::SafeLog { eps: 0.1 }), Op::Scale { factor: inf })),
        ),
        (
            "fused_unary [relu, sqrt]",
            Box::new(move |t| {
                un(
                    t,
                    Op::FusedUnary {
                        ops: vec![Op::Relu, Op::Sqrt],
                    },
                )
            }),
        ),
        (
            "fused_unary [clamp(0, 3), sqrt]",
            Box::new(move |t| {
                un(
                    t,
                    Op::FusedUnary {
                        ops: vec![Op::Clamp { min: 0.0, max: 3.0 }, Op::Sqrt],
                    },
                )
            }),
        ),
        (
            "fused_unary [sqrt, relu] of abs",
            Box::new(move |t| {
                un(
                    &un(t, Op::Abs),
                    Op::FusedUnary {
                        ops: vec![Op::Sqrt, Op::Relu],
                    },
                )
            }),
        ),
    ];
    let grad = |profile: BackendProfile, device: Device, f: &Expr| -> Vec<f32> {
        let before = install(Session::new(profile)).expect("install");
        let t = Tensor::from_vec(x.to_vec(), &[5])
            .and_then(|t| t.to_device(device))
            .expect("x")
            .requires_grad();
        let g = f(&t)
            .sum_all()
            .and_then(|l| l.backward())
            .expect("backward");
        let out = g.get(&t).expect("dx").try_to_vec().expect("read");
        torchlean::runtime::take().expect("take");
        if let Some(s) = before {
            install(s).expect("reinstall");
        }
        out
    };
    let mut failures = vec![];
    for (what, f) in &cases {
        let want = grad(
            BackendProfile::named("checked_cpu").expect("cpu"),
            Device::Cpu,
            f,
        );
        let got = grad(checked_cuda(), Device::Cuda, f);
        let same = got.iter().zip(&want).all(|(g, w)| {
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0)
        });
        if !same {
            failures.push(format!("d/dx Σ {what}: GPU {got:?}, CPU {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
