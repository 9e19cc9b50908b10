//! The LibTorch capsules against the f64 spec (`torchlean::spec`), forward and VJP, over
//! random shapes, boolean masks (`[L, S]` and full, broadcast over the batch; fully blocked
//! rows), additive masks (-inf entries, rows entirely -inf: NaN in the spec), causal (also with a mask, and L != S) and explicit scales; then the capsules
//! planned and run through eager sessions of the libtorch profiles' shape.
//!
//! Every test runs on the CPU (LibTorch's CPU kernels) and, where CUDA is usable (LibTorch
//! sees a GPU and the CUDA module can run), on `cuda`; without one it prints that the CUDA
//! half was skipped, and **fails** instead under `TORCHLEAN_REQUIRE_CUDA=1` (set by
//! `libtorch-bin/run.sh` on the GPU machine).

use std::sync::Once;
use torchlean::backend::{
    AcceptancePolicy, BackendProfile, Device, Obligation, PolicyName, Provider, ProviderPreference,
    VjpMode,
};
use torchlean::graph::{AttentionMask, Op};
use torchlean::runtime::kernel::KernelBinding;
use torchlean::runtime::{install, take, with_current, Session};
use torchlean::spec::{self, splitmix64, Array};
use torchlean::Tensor;
use torchlean_libtorch::capsules::{autograd_binding, forward_binding};

/// Relative tolerance against the f64 spec (float32 kernels, sums of a few dozen terms).
const TOL: f64 = 2e-4;

fn link() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        torchlean_cuda::link().expect("link the CUDA module");
        torchlean_libtorch::link().expect("link the LibTorch module");
    });
}

/// The devices to test: the CPU, and `cuda` where both LibTorch and the CUDA module can use
/// a GPU (else a printed skip, or a failure under TORCHLEAN_REQUIRE_CUDA=1).
fn devices(test: &str) -> Vec<Device> {
    link();
    let mut v = vec![Device::Cpu];
    // the bridge loads LibTorch's CUDA library itself before its first CUDA call; here too
    let loaded = torchlean_libtorch::probe::load_cuda();
    let why = match (tch::Cuda::is_available(), torchlean_cuda::available()) {
        (false, _) if loaded.is_err() => format!(
            "LibTorch's CUDA library is not loaded: {}",
            loaded.err().unwrap_or_default()
        ),
        (true, Ok(_)) => {
            v.push(Device::Cuda);
            return v;
        }
        (false, _) => "LibTorch finds no CUDA device".to_string(),
        (true, Err(e)) => format!("the CUDA module cannot run: {e}"),
    };
    if std::env::var("TORCHLEAN_REQUIRE_CUDA").as_deref() == Ok("1") {
        panic!("{test}: TORCHLEAN_REQUIRE_CUDA=1 but {why}");
    }
    eprintln!("{test}: CUDA half skipped: {why}; set TORCHLEAN_REQUIRE_CUDA=1 to fail instead");
    v
}

/// A session that prefers LibTorch on `device` under allow-trusted-runtime, opted into
/// nondeterministic capsules (LibTorch's CUDA SDPA is declared so), recording in mode `vjp`
/// (the libtorch profiles' shape, on any device).
fn session(device: Device, vjp: VjpMode) -> Session {
    Session::new(BackendProfile::custom(
        device,
        ProviderPreference::Prefer(Provider::Libtorch),
        AcceptancePolicy::named(PolicyName::AllowTrustedRuntime)
            .expect("named policy")
            .with_nondeterministic(),
        vjp,
    ))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// One attention call: the op and its inputs at f64.
struct Case {
    name: String,
    op: Op,
    inputs: Vec<Array<f64>>,
}

fn array(rng: &mut Rng, shape: &[usize]) -> Array<f64> {
    let n: usize = shape.iter().product();
    Array::from_vec(shape.to_vec(), (0..n).map(|_| rng.uniform()).collect()).expect("shape")
}

/// Random cases: batch dims of rank 0..2, L and S in 1..6 (L != S included), D and Dv in
/// 1..5; masks none / [L, S] / full, with fully blocked rows; causal; explicit scales.
fn cases() -> Vec<Case> {
    let mut rng = Rng(0x5eed);
    let mut out = Vec::new();
    for i in 0..48 {
        let batch: Vec<usize> = (0..rng.below(3)).map(|_| 1 + rng.below(3)).collect();
        let (l, s, d, dv) = (
            1 + rng.below(6),
            1 + rng.below(6),
            1 + rng.below(5),
            1 + rng.below(5),
        );
        let causal = i % 3 == 1;
        let scale = (i % 4 == 2).then(|| 0.25 + rng.uniform().abs() as f32);
        let mask_kind = match i % 5 {
            0 => AttentionMask::None,
            3 => AttentionMask::AdditiveBias,
            _ => AttentionMask::Boolean,
        };
        let shape = |last: &[usize]| -> Vec<usize> { batch.iter().chain(last).copied().collect() };
        let mut inputs = vec![
            array(&mut rng, &shape(&[l, d])),
            array(&mut rng, &shape(&[s, d])),
            array(&mut rng, &shape(&[s, dv])),
        ];
        let mut mask_desc = "none".to_string();
        if mask_kind == AttentionMask::Boolean {
            // [L, S] (broadcast over the batch) or the full shape
            let mshape = if i % 2 == 0 {
                vec![l, s]
            } else {
                shape(&[l, s])
            };
            let n: usize = mshape.iter().product();
            let mut m: Vec<f64> = (0..n).map(|_| (rng.below(3) != 0) as u8 as f64).collect();
            // block every key of query row 0 (and of row l-1 in every other case): fully
            // blocked rows, whose output is zero and which pass no gradient
            for (row, chunk) in m.chunks_mut(s).enumerate() {
                if row % l == 0 || (i % 2 == 1 && row % l == l - 1) {
                    chunk.iter_mut().for_each(|x| *x = 0.0);
                }
            }
            mask_desc = format!("{mshape:?} with fully blocked rows");
            inputs.push(Array::from_vec(mshape, m).expect("mask shape"));
        } else if mask_kind == AttentionMask::AdditiveBias {
            // [L, S] or the full shape; about one entry in four -inf, and in every other
            // case query row 0 entirely -inf (a NaN row in the spec: 0/0)
            let mshape = if i % 2 == 0 {
                vec![l, s]
            } else {
                shape(&[l, s])
            };
            let mut b = array(&mut rng, &mshape);
            let whole_row = i % 2 == 1;
            for (e, x) in b.data.iter_mut().enumerate() {
                let row = (e / s) % l;
                if rng.below(4) == 0 || (whole_row && row == 0) {
                    *x = f64::NEG_INFINITY;
                }
            }
            mask_desc = format!(
                "additive {mshape:?}{}",
                if whole_row { " with a -inf row" } else { "" }
            );
            inputs.push(b);
        }
        out.push(Case {
            name: format!(
                "case {i}: q {:?} k {:?} v {:?}, mask {mask_desc}, causal {causal}, scale {scale:?}",
                inputs[0].shape, inputs[1].shape, inputs[2].shape
            ),
            op: Op::ScaledDotProductAttention {
                scale,
                causal,
                mask: mask_kind,
            },
            inputs,
        });
    }
    out
}

fn tensor(a: &Array<f64>, device: Device) -> Tensor {
    let v: Vec<f32> = a.data.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, &a.shape)
        .and_then(|t| t.to_device(device))
        .expect("tensor on the device")
}

fn compare(what: &str, got: &Tensor, want: &Array<f64>) {
    assert_eq!(got.shape(), want.shape.as_slice(), "{what}: shape");
    let got = got.try_to_vec().expect("read back");
    let scale = want
        .data
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want.data).enumerate() {
        // NaN exactly where the spec has NaN (a row of an additive bias that is all -inf)
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else {
            ((g as f64) - w).abs() <= TOL * scale
        };
        assert!(ok, "{what}: element {i}: got {g}, spec {w}");
    }
}

/// The spec's value and VJP of a case for cotangent `gy`.
fn spec_of(c: &Case, gy: &Array<f64>) -> (Array<f64>, Vec<Option<Array<f64>>>) {
    let refs: Vec<&Array<f64>> = c.inputs.iter().collect();
    let y = spec::forward(&c.op, &refs).expect("spec forward");
    let g = spec::vjp(&c.op, &refs, &y, gy).expect("spec vjp");
    (y, g)
}

fn check_vjp(what: &str, binding: KernelBinding, c: &Case, device: Device) {
    let mut rng = Rng(0xc0de ^ c.inputs[0].data.len() as u64);
    let ins: Vec<Tensor> = c.inputs.iter().map(|a| tensor(a, device)).collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let y = (binding.forward())(&c.op, &refs).expect("forward");
    let gy = array(&mut rng, y.shape());
    let (_, want) = spec_of(c, &gy);
    let needs = vec![true; refs.len()];
    let vjp = binding.vjp().expect("a VJP kernel");
    let got = vjp(&c.op, &refs, &y, &tensor(&gy, device), &needs).expect("vjp");
    assert_eq!(got.len(), want.len(), "{what}: one cotangent per input");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        match (g, w) {
            (Some(g), Some(w)) => compare(&format!("{what}: d input {i}"), g, w),
            (None, None) => {}
            _ => panic!("{what}: input {i}: gradient presence differs from the spec's"),
        }
    }
}

#[test]
fn forward_matches_spec() {
    for device in devices("forward_matches_spec") {
        install(session(device, VjpMode::TorchleanTape)).expect("install");
        let mut rng = Rng(7);
        for c in cases() {
            let ins: Vec<Tensor> = c.inputs.iter().map(|a| tensor(a, device)).collect();
            let refs: Vec<&Tensor> = ins.iter().collect();
            let y = torchlean_libtorch::bridge::sdpa_forward(&c.op, &refs).expect("forward");
            let gy = array(&mut rng, y.shape());
            let (want, _) = spec_of(&c, &gy);
            compare(&format!("{device} {}", c.name), &y, &want);
        }
        take().expect("take");
    }
}

#[test]
fn vjps_match_spec() {
    for device in devices("vjps_match_spec") {
        // the forward bridge's VJP is the composition's: its parts run through the session
        install(session(device, VjpMode::TorchleanTape)).expect("install");
        for c in cases() {
            check_vjp(
                &format!("{device} sdpa_forward {}", c.name),
                forward_binding(),
                &c,
                device,
            );
            check_vjp(
                &format!("{device} sdpa_autograd {}", c.name),
                autograd_binding(),
                &c,
                device,
            );
        }
        take().expect("take");
    }
}

#[test]
fn fully_blocked_rows_are_zero_and_pass_no_gradient() {
    for device in devices("fully_blocked_rows_are_zero_and_pass_no_gradient") {
        install(session(device, VjpMode::TorchleanTape)).expect("install");
        let mut rng = Rng(11);
        let (l, s, d) = (3, 4, 2);
        let q = array(&mut rng, &[1, l, d]);
        let k = array(&mut rng, &[1, s, d]);
        let v = array(&mut rng, &[1, s, d]);
        // row 1 fully blocked; the others attend
        let m = Array::from_vec(
            vec![l, s],
            vec![1., 0., 1., 1., 0., 0., 0., 0., 1., 1., 0., 1.],
        )
        .expect("mask");
        let c = Case {
            name: "blocked row".into(),
            op: Op::ScaledDotProductAttention {
                scale: None,
                causal: false,
                mask: AttentionMask::Boolean,
            },
            inputs: vec![q, k, v, m],
        };
        let ins: Vec<Tensor> = c.inputs.iter().map(|a| tensor(a, device)).collect();
        let refs: Vec<&Tensor> = ins.iter().collect();
        for binding in [forward_binding(), autograd_binding()] {
            let y = (binding.forward())(&c.op, &refs).expect("forward");
            let yv = y.try_to_vec().expect("read");
            assert!(yv.iter().all(|x| x.is_finite()), "{device}: no NaN: {yv:?}");
            assert_eq!(&yv[d..2 * d], &[0.0, 0.0], "{device}: blocked row is zero");
            // a cotangent only on the blocked row: no gradient anywhere
            let mut g = vec![0.0f32; l * d];
            g[d..2 * d].copy_from_slice(&[1.0, -2.0]);
            let gy = Tensor::from_vec(g, &[1, l, d])
                .and_then(|t| t.to_device(device))
                .expect("cotangent");
            let grads =
                (binding.vjp().expect("vjp"))(&c.op, &refs, &y, &gy, &[true; 4]).expect("vjp");
            for (i, g) in grads.iter().take(3).enumerate() {
                let g = g.as_ref().expect("q, k, v take gradients");
                let gv = g.try_to_vec().expect("read");
                assert!(
                    gv.iter().all(|&x| x == 0.0),
                    "{device}: input {i} got {gv:?} from a blocked row"
                );
            }
            assert!(grads[3].is_none(), "the boolean mask takes no gradient");
        }
        take().expect("take");
    }
}

/// Through eager sessions: the attention row plans the forward bridge under the tape and
/// the external-autograd capsule under external autograd (the rest of the step plans other
/// providers), both give the spec's value and gradients, and the report shows the trusted
/// boundary and the LibTorch version (target line).
#[test]
fn sessions_plan_and_run_the_bridges() {
    for device in devices("sessions_plan_and_run_the_bridges") {
        for (vjp, capsule) in [
            (VjpMode::TorchleanTape, "libtorch.sdpa_forward"),
            (VjpMode::ExternalAutograd, "libtorch.sdpa_autograd"),
        ] {
            install(session(device, vjp)).expect("install");
            let c = &cases()[1];
            let ins: Vec<Tensor> = c
                .inputs
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let t = tensor(a, device);
                    if i < 3 {
                        t.requires_grad()
                    } else {
                        t
                    }
                })
                .collect();
            let Op::ScaledDotProductAttention {
                scale,
                causal,
                mask,
            } = c.op
            else {
                unreachable!("cases are attention calls")
            };
            let mask = (mask == AttentionMask::Boolean).then(|| (&ins[3], mask));
            let y = ins[0]
                .scaled_dot_product_attention(&ins[1], &ins[2], mask, causal, scale)
                .expect("attention");
            // a second op after it: planned on another provider (LibTorch bridges attention only)
            let loss = y.mul(&y).and_then(|t| t.sum_all()).expect("loss");
            let grads = loss.backward().expect("backward");
            let refs: Vec<&Array<f64>> = c.inputs.iter().collect();
            let want_y = spec::forward(&c.op, &refs).expect("spec");
            let gy = Array::from_vec(
                want_y.shape.clone(),
                want_y.data.iter().map(|x| 2.0 * x).collect(),
            )
            .expect("cotangent");
            let (_, want) = spec_of(c, &gy);
            compare(&format!("{device} {capsule} value"), &y, &want_y);
            for i in 0..3 {
                let g = grads.get(&ins[i]).expect("gradient of q, k, v");
                compare(
                    &format!("{device} {capsule} d input {i}"),
                    g,
                    want[i].as_ref().expect("spec gradient"),
                );
            }
            let report = with_current(|s| s.report()).expect("report");
            let row = report
                .kernels
                .iter()
                .find(|k| k.op == torchlean::OpKind::ScaledDotProductAttention)
                .expect("attention row");
            let suffix = if device == Device::Cpu { ".cpu" } else { "" };
            assert_eq!(row.capsule, format!("{capsule}{suffix}"));
            assert_eq!(row.vjp_mode, vjp_mode_of(capsule));
            let text = report.to_text();
            assert!(
                text.contains("trusted_boundary LibTorch"),
                "the value row names the boundary:\n{text}"
            );
            assert!(
                report
                    .kernels
                    .iter()
                    .any(|k| k.op == torchlean::OpKind::Mul && k.provider != Provider::Libtorch),
                "{text}"
            );
            let target = report.target.clone().unwrap_or_default();
            assert!(
                target.contains("libtorch 2.11"),
                "the probe names the LibTorch version: {target}"
            );
            take().expect("take");
        }
    }
}

fn vjp_mode_of(capsule: &str) -> VjpMode {
    if capsule.ends_with("autograd") {
        VjpMode::ExternalAutograd
    } else {
        VjpMode::BackendVjp
    }
}

/// Every test the capsules' evidence cites is a `#[test]` of the file it names, and the
/// tests named in their summaries are tests of this binary (by its own `--list`).
#[test]
fn capsules_cite_tests_that_exist() {
    use torchlean::backend::Registry;
    let mut r = Registry::new();
    torchlean_libtorch::capsules::register(&mut r).expect("capsules register");
    // the repository root (the GPU bundle carries copies of the cited files: run.sh sets
    // TORCHLEAN_REPO_ROOT to them)
    let root = std::env::var_os("TORCHLEAN_REPO_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let mut checked = 0;
    for e in r.entries() {
        for o in Obligation::ALL {
            for cited in e.capsule.contract(o).evidence.cited_tests() {
                let (file, test) = cited.rsplit_once("::").expect("FILE::test");
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
    assert_eq!(
        checked, 2,
        "one cited VJP test per forward-bridge capsule (cuda, cpu)"
    );
    let me = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(me)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("list own tests");
    let listed = String::from_utf8_lossy(&out.stdout);
    for t in torchlean_libtorch::capsules::TESTS {
        let name = t.rsplit_once("::").map(|(_, n)| n).unwrap_or(t);
        assert!(
            listed.lines().any(|l| l == format!("{name}: test")),
            "`{t}` is not a test of this binary"
        );
    }
}

/// The pip wheel is a CUDA build: its CUDA library loads (no GPU needed) and registers
/// LibTorch's CUDA backend, which then answers the CUDA runtime version (without it, LibTorch
/// refuses the query: "without ATen_cuda library"). Without this load, LibTorch would see no
/// GPU on the GPU machine (the linker drops libtorch_cuda from the binaries). LibTorch
/// caches its CUDA hooks at the first CUDA query, so the load must come first: `link` does it.
#[test]
fn libtorch_cuda_loads_and_registers_its_backend() {
    let quiet = |f: fn() -> i64| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = std::panic::catch_unwind(f);
        std::panic::set_hook(hook);
        r
    };
    link();
    torchlean_libtorch::probe::load_cuda().expect("libtorch_cuda loads");
    let v = quiet(tch::utils::version_cudart).expect("LibTorch's CUDA backend is registered");
    assert!(v >= 12000, "CUDA runtime version {v}");
}
