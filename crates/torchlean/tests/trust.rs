//! The trust layer's behaviours, one test per statement of the chapter (issue 3 "Tests").

mod support;
use proptest::prelude::*;
use std::sync::Arc;
use torchlean::backend::*;
use torchlean::error::GateRejection;
use torchlean::graph::Op;
use torchlean::providers::capsules::{
    descriptor, layout_claim, shape_claim, value_claim, vjp_claim,
};
use torchlean::providers::{checkers, native_cpu, reference};
use torchlean::runtime::session::standard_registry;
use torchlean::runtime::{self, Session};
use torchlean::{Error, OpKind, Tensor};

fn cpu_availability() -> Availability {
    Availability::declared(&Target::host())
}

fn request(preference: ProviderPreference, policy: &str, vjp: VjpMode) -> PlanRequest {
    PlanRequest {
        device: Device::Cpu,
        preference,
        policy: AcceptancePolicy::parse(policy).unwrap(),
        vjp,
        mode: ExecutionMode::Eager,
    }
}

/// A native-style capsule for `op` whose four descriptors all carry `evidence`.
fn capsule_with(
    op: OpKind,
    name: &str,
    provider: Provider,
    trust: TrustLevel,
    vjp: VjpMode,
    evidence: Evidence,
) -> KernelCapsule {
    let p = Provenance::default();
    KernelCapsule {
        name: name.into(),
        op,
        provider,
        device: Device::Cpu,
        spec_name: format!("spec::{}", op.name()),
        trust_level: trust,
        supports_forward: true,
        vjp_mode: vjp,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: vec![],
        precision: torchlean::backend::Precision::F32,
        shape_contract: descriptor(shape_claim(op), "s", evidence.clone(), p.clone()),
        layout_contract: descriptor(layout_claim(op), "l", evidence.clone(), p.clone()),
        value_contract: descriptor(value_claim(op), "v", evidence.clone(), p.clone()),
        vjp_contract: descriptor(vjp_claim(op, vjp), "j", evidence, p),
    }
}

fn guard() -> Evidence {
    Evidence::RuntimeGuard {
        guard: torchlean::guard!(native_cpu::guard::shape_rule),
    }
}

#[test]
fn misplaced_evidence_is_rejected() {
    support::checked_cpu_default();
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.shape_contract.claim = value_claim(OpKind::Sin); // a value claim in the shape field
    let err = Registry::new()
        .register(c, native_cpu::binding())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::MisplacedClaim {
                slot: "shape",
                found: "value",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn descriptor_for_another_op_is_rejected() {
    support::checked_cpu_default();
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.value_contract.claim = value_claim(OpKind::Cos);
    let err = Registry::new()
        .register(c, native_cpu::binding())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::WrongOp {
                claimed: "cos",
                op: "sin",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn vjp_descriptor_naming_another_mode_is_rejected() {
    support::checked_cpu_default();
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.vjp_contract.claim = vjp_claim(OpKind::Sin, VjpMode::ExternalAutograd);
    let err = Registry::new()
        .register(c, native_cpu::binding())
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::VjpModeMismatch { .. }),
        "{err}"
    );
}

#[test]
fn duplicate_capsule_identity_is_rejected() {
    support::checked_cpu_default();
    let mut r = Registry::new();
    r.register(native_cpu::capsule(OpKind::Sin), native_cpu::binding())
        .unwrap();
    let err = r
        .register(native_cpu::capsule(OpKind::Sin), native_cpu::binding())
        .unwrap_err();
    assert!(matches!(err, RegistryError::Duplicate { .. }), "{err}");
}

#[test]
fn trust_level_unsupported_by_evidence_is_rejected() {
    support::checked_cpu_default();
    // `verified` resting on tests and guards
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.trust_level = TrustLevel::Verified;
    let err = Registry::new()
        .register(c, native_cpu::binding())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::TrustNotSupported {
                level: TrustLevel::Verified,
                ..
            }
        ),
        "{err}"
    );
    // `checked` resting on a trusted boundary
    let c = capsule_with(
        OpKind::Sin,
        "x.sin",
        Provider::Torchlean,
        TrustLevel::Checked,
        VjpMode::BackendVjp,
        Evidence::TrustedBoundary {
            boundary: "libm".into(),
        },
    );
    assert!(matches!(
        Registry::new().register(c, native_cpu::binding()),
        Err(RegistryError::TrustNotSupported { .. })
    ));
}

#[test]
fn theorem_certificate_cannot_be_moved_to_another_kernel_or_claim() {
    support::checked_cpu_default();
    // the reference value theorem pasted onto the native kernel
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.value_contract.evidence = reference::capsule(OpKind::Sin).value_contract.evidence;
    let err = Registry::new()
        .register(c, native_cpu::binding())
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::CertificateMismatch { slot: "value", .. }
        ),
        "{err}"
    );
    // a reference theorem for another claim
    let mut c = reference::capsule(OpKind::Sin);
    c.value_contract.evidence = reference::capsule(OpKind::Sin).shape_contract.evidence;
    assert!(matches!(
        Registry::new().register(c, reference::binding()),
        Err(RegistryError::CertificateMismatch { .. })
    ));
    // a certificate is never issued for a non-spec binding
    assert!(proof::certify_spec_instantiation(
        value_claim(OpKind::Sin),
        &native_cpu::binding().kernel_ids()
    )
    .is_none());
}

#[test]
fn standard_registry_is_valid_and_complete() {
    support::checked_cpu_default();
    let r = standard_registry();
    for &op in OpKind::ALL {
        for p in [Provider::Reference, Provider::NativeCpu] {
            assert!(
                r.for_op(op).any(|e| e.capsule.provider == p),
                "{} lacks a {p} capsule",
                op.name()
            );
        }
    }
}

/// The `#[test]`s a test binary of this crate runs, by its own `--list` (the binary named
/// `stem-HASH` beside this one; the newest when several builds left copies).
fn listed_tests(stem: &str) -> std::collections::HashSet<String> {
    let me = std::env::current_exe().expect("the test binary knows its path");
    let dir = me.parent().expect("the test binary lives in a directory");
    let binary = std::fs::read_dir(dir)
        .expect("the deps directory is readable")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.strip_prefix(stem)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| {
            panic!("no test binary `{stem}-*` beside {me:?}: run the whole suite (cargo test --release --workspace)")
        });
    let out = std::process::Command::new(&binary)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("the test binary runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect()
}

/// Every test cited as evidence (test suites, checkers' mutation tests) is a `#[test]` that
/// the suite really runs: it is listed by its test binary's own `--list` (not found by
/// searching the source for `fn name(`, which a comment or a helper would satisfy).
#[test]
fn every_cited_test_is_run_by_the_suite() {
    let mut listed: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    let mut checked = 0;
    for e in standard_registry().entries() {
        for o in Obligation::ALL {
            for name in e.capsule.contract(o).evidence.cited_tests() {
                let (file, test) = name.rsplit_once("::").unwrap_or_else(|| {
                    panic!(
                        "{}: evidence test `{name}` is not tests/FILE.rs::test",
                        e.capsule.name
                    )
                });
                let stem = file
                    .strip_prefix("tests/")
                    .and_then(|f| f.strip_suffix(".rs"))
                    .unwrap_or_else(|| panic!("{}: `{file}` is not a test file", e.capsule.name));
                let tests = listed
                    .entry(stem.to_string())
                    .or_insert_with(|| listed_tests(stem));
                assert!(
                    tests.contains(test),
                    "{}: `{name}` is not a test of the suite (its binary lists {} tests)",
                    e.capsule.name,
                    tests.len()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "expected many cited tests, found {checked}");
}

#[test]
fn unsupported_device_is_a_planning_error_never_a_fallback() {
    support::checked_cpu_default();
    let mut req = request(
        ProviderPreference::Auto,
        "checked-runtime",
        VjpMode::TorchleanTape,
    );
    req.device = Device::Cuda;
    let err = plan_op(standard_registry(), OpKind::Sin, &req, &cpu_availability()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("no admissible capsule for op `sin` on device `cuda`"),
        "{msg}"
    );
    assert!(err
        .candidates
        .iter()
        .all(|c| matches!(c.refusal, Refusal::WrongDevice { .. })));
    assert_eq!(
        err.candidates.len(),
        3,
        "every candidate (native, reference, replayed native) is listed with its reason"
    );
    // and in the eager runtime: no kernel runs, the op returns the planning error
    let before =
        runtime::install(Session::new(BackendProfile::named("checked_cuda").unwrap())).unwrap();
    let r = Tensor::ones(&[2]).unwrap().sin();
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    assert!(matches!(r, Err(Error::Planning(_))), "{r:?}");
}

#[test]
fn unsupported_provider_is_a_planning_error() {
    support::checked_cpu_default();
    let req = request(
        ProviderPreference::Only(Provider::Cublas),
        "allow-trusted-runtime",
        VjpMode::None,
    );
    let err = plan_op(
        standard_registry(),
        OpKind::Matmul,
        &req,
        &cpu_availability(),
    )
    .unwrap_err();
    assert!(
        err.candidates.iter().all(|c| matches!(
            c.refusal,
            Refusal::ProviderNotPreferred {
                only: Provider::Cublas,
                ..
            }
        )),
        "{err}"
    );
}

#[test]
fn strict_rejects_guards_and_tests() {
    support::checked_cpu_default();
    let req = request(
        ProviderPreference::Only(Provider::NativeCpu),
        "strict",
        VjpMode::TorchleanTape,
    );
    // the native capsule alone (the standard registry also has its replayed twin, which
    // strict admits)
    let mut r = Registry::new();
    r.register(
        native_cpu::capsule(OpKind::Matmul),
        native_cpu::binding_for(OpKind::Matmul),
    )
    .unwrap();
    let planned = plan_op(&r, OpKind::Matmul, &req, &cpu_availability()).unwrap();
    let rejection = gate_kernel(&planned, &req).unwrap_err();
    let kinds: Vec<EvidenceKind> = rejection
        .failures
        .iter()
        .filter_map(|f| match f {
            GateFailure::EvidenceNotAccepted { evidence, .. } => Some(*evidence),
            _ => None,
        })
        .collect();
    assert!(
        kinds.contains(&EvidenceKind::RuntimeGuard) && kinds.contains(&EvidenceKind::TestSuite),
        "{kinds:?}"
    );
    assert!(rejection
        .failures
        .iter()
        .any(|f| matches!(f, GateFailure::TrustLevelNotAllowed { .. })));
}

#[test]
fn strict_accepts_the_reference_theorems_and_checker() {
    support::checked_cpu_default();
    let req = request(ProviderPreference::Auto, "strict", VjpMode::TorchleanTape);
    let planned = plan_op(
        standard_registry(),
        OpKind::Matmul,
        &req,
        &cpu_availability(),
    )
    .unwrap();
    assert_eq!(
        planned.capsule().provider,
        Provider::Reference,
        "auto under strict skips checked capsules"
    );
    let accepted = gate_kernel(&planned, &req).unwrap();
    let d: Vec<Disposition> = accepted
        .audit()
        .obligations
        .iter()
        .map(|o| o.disposition)
        .collect();
    assert_eq!(
        d,
        vec![
            Disposition::Proved,
            Disposition::Checked,
            Disposition::Proved,
            Disposition::Proved
        ]
    );
    assert!(accepted.audit().obligations[1].recheck_every_call);
}

#[test]
fn checked_runtime_accepts_guards_and_tests() {
    support::checked_cpu_default();
    let req = request(
        ProviderPreference::Auto,
        "checked-runtime",
        VjpMode::TorchleanTape,
    );
    let planned = plan_op(
        standard_registry(),
        OpKind::Matmul,
        &req,
        &cpu_availability(),
    )
    .unwrap();
    assert_eq!(
        planned.capsule().provider,
        Provider::NativeCpu,
        "registry order prefers native_cpu"
    );
    let accepted = gate_kernel(&planned, &req).unwrap();
    assert!(accepted
        .audit()
        .obligations
        .iter()
        .any(|o| o.disposition == Disposition::Guarded));
    assert!(accepted
        .audit()
        .obligations
        .iter()
        .any(|o| o.disposition == Disposition::Tested));
    // guards run before every call, tests were discharged once: the report says which
    // (its JSON said no obligation but a checker's ran on every call: the trust audit)
    for o in &accepted.audit().obligations {
        assert_eq!(
            o.runs_every_call,
            matches!(o.disposition, Disposition::Guarded | Disposition::Checked),
            "{o:?}"
        );
    }
}

#[test]
fn trusted_boundaries_need_allow_trusted_runtime() {
    support::checked_cpu_default();
    let mut r = Registry::new();
    let c = capsule_with(
        OpKind::Sin,
        "torchlean.sin_libm",
        Provider::Torchlean,
        TrustLevel::TrustedExternal,
        VjpMode::BackendVjp,
        Evidence::TrustedBoundary {
            boundary: "the platform libm".into(),
        },
    );
    r.register(c, native_cpu::binding()).unwrap();
    for (policy, ok) in [
        ("strict", false),
        ("checked-runtime", false),
        ("allow-trusted-runtime", true),
    ] {
        let req = request(
            ProviderPreference::Only(Provider::Torchlean),
            policy,
            VjpMode::TorchleanTape,
        );
        let planned = plan_op(&r, OpKind::Sin, &req, &cpu_availability()).unwrap();
        let verdict = gate_kernel(&planned, &req);
        assert_eq!(verdict.is_ok(), ok, "policy {policy}");
        if let Ok(k) = verdict {
            let report = BackendReport::new(
                &BackendProfile::default_cpu(),
                ExecutionMode::Eager,
                vec![k.audit().clone()],
                vec![],
                vec![],
            );
            assert_eq!(report.trusted_external_ops, vec!["sin".to_string()]);
            assert!(
                !report.to_text().contains("[proved]"),
                "a trusted row is never called proved"
            );
        }
    }
}

#[test]
fn forward_only_capsule_is_refused_in_training_but_allowed_for_inference() {
    support::checked_cpu_default();
    let mut r = Registry::new();
    let mut c = native_cpu::capsule(OpKind::Sin);
    c.name = "fast.sin_forward_only".into();
    c.vjp_mode = VjpMode::None;
    c.vjp_contract = descriptor(
        vjp_claim(OpKind::Sin, VjpMode::None),
        "no vjp",
        Evidence::NotProvided,
        Provenance::default(),
    );
    r.register(c, native_cpu::binding()).unwrap();
    let train = request(
        ProviderPreference::Auto,
        "checked-runtime",
        VjpMode::TorchleanTape,
    );
    let err = plan_op(&r, OpKind::Sin, &train, &cpu_availability()).unwrap_err();
    assert!(
        matches!(
            err.candidates[0].refusal,
            Refusal::VjpMode {
                capsule_mode: VjpMode::None,
                ..
            }
        ),
        "{err}"
    );
    let infer = request(ProviderPreference::Auto, "checked-runtime", VjpMode::None);
    assert!(plan_op(&r, OpKind::Sin, &infer, &cpu_availability()).is_ok());
}

#[test]
fn random_sources_need_no_vjp_in_training() {
    support::checked_cpu_default();
    let req = request(ProviderPreference::Auto, "strict", VjpMode::TorchleanTape);
    let planned = plan_op(
        standard_registry(),
        OpKind::BernoulliMask,
        &req,
        &cpu_availability(),
    )
    .unwrap();
    assert_eq!(planned.capsule().vjp_mode, VjpMode::None);
    let accepted = gate_kernel(&planned, &req).unwrap();
    assert!(!accepted.audit().obligations[3].required);
}

#[test]
fn only_and_prefer_ordering() {
    support::checked_cpu_default();
    let a = cpu_availability();
    let pick = |pref| {
        plan_op(
            standard_registry(),
            OpKind::Add,
            &request(pref, "checked-runtime", VjpMode::TorchleanTape),
            &a,
        )
        .unwrap()
        .capsule()
        .provider
    };
    assert_eq!(pick(ProviderPreference::Auto), Provider::NativeCpu);
    assert_eq!(
        pick(ProviderPreference::Prefer(Provider::Reference)),
        Provider::Reference
    );
    assert_eq!(
        pick(ProviderPreference::Only(Provider::Reference)),
        Provider::Reference
    );
    // prefer falls through to the others when the preferred provider has no capsule
    assert_eq!(
        pick(ProviderPreference::Prefer(Provider::Cublas)),
        Provider::NativeCpu
    );
}

#[test]
fn future_profiles_fail_planning_readably() {
    support::checked_cpu_default();
    for p in BackendProfile::all_named()
        .into_iter()
        .filter(|p| p.name.starts_with("future_"))
    {
        let req = PlanRequest {
            device: p.device,
            preference: p.preference,
            policy: p.policy.clone(),
            vjp: p.vjp,
            mode: ExecutionMode::Eager,
        };
        let err = plan_op(
            standard_registry(),
            OpKind::Matmul,
            &req,
            &cpu_availability(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("on device `{}`", p.device))
                && msg.contains("is not available on this target"),
            "{}: {msg}",
            p.name
        );
    }
}

#[test]
fn report_lists_the_capsule_that_actually_ran() {
    support::checked_cpu_default();
    let before = runtime::take().unwrap();
    runtime::install(Session::new(BackendProfile::named("strict_cpu").unwrap())).unwrap();
    let x = Tensor::randn(&[3, 4], 1).unwrap().requires_grad();
    let y = x.sin().unwrap().sum_all().unwrap();
    let _ = y.backward().unwrap();
    assert_eq!(y.producer().unwrap().1, "reference.sum_all");
    let report = runtime::with_current(|s| s.report()).unwrap();
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    let ran: Vec<(&str, &str)> = report
        .kernels
        .iter()
        .map(|k| (k.op.name(), k.capsule.as_str()))
        .collect();
    assert_eq!(
        ran,
        vec![("sin", "reference.sin"), ("sum_all", "reference.sum_all")]
    );
    assert!(report
        .to_text()
        .contains("sin: reference.sin provider=reference trust=verified"));
}

/// An operand over `storage` with an explicit layout.
fn operand<'a>(
    shape: &'a [usize],
    strides: &'a [usize],
    offset: usize,
    storage: &'a [f32],
) -> Operand<'a> {
    Operand {
        shape,
        strides: Some(strides),
        offset,
        storage,
        device: Device::Cpu,
    }
}

/// A layout checker's verdict on a relu call of `input` against what the kernel returned.
fn relu_verdict(
    checker: fn(&Op, &Call) -> Result<(), String>,
    input: Operand,
    output: Operand,
) -> Result<(), String> {
    let inputs = [input];
    let call = Call {
        inputs: &inputs,
        output,
        cotangent: None,
        needs: &[],
        grads: &[],
        seed: 0,
    };
    checker(&Op::Relu, &call)
}

/// The layout checker replays a relu call of a [2, 3] input against what the kernel returned.
fn layout_verdict(output: Operand) -> Result<(), String> {
    let storage = [0.0f32; 6];
    relu_verdict(
        checkers::canonical_layout,
        operand(&[2, 3], &[3, 1], 0, &storage),
        output,
    )
}

#[test]
fn layout_checker_rejects_wrong_shape() {
    let s6 = [0.0f32; 6];
    assert!(layout_verdict(operand(&[2, 3], &[3, 1], 0, &s6)).is_ok());
    assert!(layout_verdict(operand(&[3, 2], &[2, 1], 0, &s6)).is_err());
    assert!(layout_verdict(operand(&[6], &[1], 0, &s6)).is_err());
    let s5 = [0.0f32; 5];
    assert!(
        layout_verdict(operand(&[2, 3], &[3, 1], 0, &s5)).is_err(),
        "short storage"
    );
}

#[test]
fn layout_checker_rejects_non_canonical_view() {
    let s6 = [0.0f32; 6];
    assert!(
        layout_verdict(operand(&[2, 3], &[1, 2], 0, &s6)).is_err(),
        "a transposed layout is not canonical"
    );
    let s12 = [0.0f32; 12];
    assert!(
        layout_verdict(operand(&[2, 3], &[3, 1], 3, &s12)).is_err(),
        "an offset view over larger storage is not canonical"
    );
}

/// The dense layout checker (the replayed flash capsule's: results stored in some axis
/// order) accepts a row-major and a head-interleaved [2, 3, 4, 5] result, and rejects
/// overlapping strides, gaps, an offset, short or long storage and a wrong shape.
#[test]
fn dense_layout_checker_rejects_overlaps_gaps_and_offsets() {
    let storage = vec![0.0f32; 120];
    let shape = [2usize, 3, 4, 5];
    let input = operand(&shape, &[60, 20, 5, 1], 0, &storage);
    let verdict = |output: Operand| relu_verdict(checkers::dense_layout, input, output);
    let big = vec![0.0f32; 240];
    assert!(verdict(operand(&shape, &[60, 20, 5, 1], 0, &storage)).is_ok());
    assert!(
        verdict(operand(&shape, &[60, 5, 15, 1], 0, &storage)).is_ok(),
        "heads interleaved ([2, 4, 3, 5] in memory)"
    );
    for (what, strides, offset, stored) in [
        (
            "overlapping rows",
            [60usize, 20, 4, 1],
            0usize,
            &storage[..],
        ),
        ("a gap between rows", [120, 40, 10, 1], 0, &big[..]),
        ("two axes with one stride", [60, 5, 5, 1], 0, &storage[..]),
        ("an offset", [60, 20, 5, 1], 1, &big[..]),
        ("storage too long", [60, 20, 5, 1], 0, &big[..]),
        ("storage too short", [60, 20, 5, 1], 0, &storage[..119]),
    ] {
        assert!(
            verdict(operand(&shape, &strides, offset, stored)).is_err(),
            "{what}"
        );
    }
    assert!(
        verdict(operand(&[2, 3, 20], &[60, 20, 1], 0, &storage)).is_err(),
        "a wrong shape"
    );
}

/// A certificate covers every kernel a binding carries, identified by kernel identities that
/// only `backend::proof` mints: the reference theorems do not pass with the spec forward and
/// another VJP, nor with an added in-place or destination-passing variant.
#[test]
fn certificates_cover_every_kernel_of_the_binding() {
    use torchlean::runtime::kernel::KernelBinding;
    let op = OpKind::Relu;
    let forged = KernelBinding::new(
        "reference",
        reference::spec_forward_f32,
        Some(native_cpu::vjp),
    );
    let spec_both = KernelBinding::new(
        "reference",
        reference::spec_forward_f32,
        Some(reference::spec_vjp_f32),
    );
    let with_in_place = reference::binding().with_in_place(native_cpu::forward_in_place);
    let with_dense = reference::binding().with_dense(native_cpu::dense_kernels(op));
    for (what, b) in [
        ("spec forward + another vjp", forged),
        ("the spec functions bound by public code", spec_both),
        ("an added in-place kernel", with_in_place),
        ("added destination-passing kernels", with_dense),
    ] {
        let err = Registry::new()
            .register(reference::capsule(op), b)
            .unwrap_err();
        assert!(
            matches!(err, RegistryError::CertificateMismatch { .. }),
            "{what}: {err}"
        );
    }
    Registry::new()
        .register(reference::capsule(op), reference::binding())
        .expect("the reference binding is covered");
}

/// Evidence that cites nothing is refused by the registry.
#[test]
fn empty_evidence_is_refused() {
    let empty_tests = Evidence::TestSuite { tests: vec![] };
    let blank_test = Evidence::TestSuite {
        tests: vec![" ".into()],
    };
    let no_mutation_tests = Evidence::Checker {
        checker: torchlean::checker!(checkers::canonical_layout),
        soundness: "accepted => canonical".into(),
        mutation_tests: vec![],
    };
    let no_soundness = Evidence::Checker {
        checker: torchlean::checker!(checkers::canonical_layout),
        soundness: "".into(),
        mutation_tests: vec!["tests/trust.rs::layout_checker_rejects_wrong_shape".into()],
    };
    for (what, e) in [
        ("empty test list", empty_tests),
        ("blank test name", blank_test),
        ("checker without mutation tests", no_mutation_tests),
        ("checker without soundness", no_soundness),
    ] {
        let mut c = native_cpu::capsule(OpKind::Sin);
        c.value_contract.evidence = e;
        let err = Registry::new()
            .register(c, native_cpu::binding())
            .unwrap_err();
        assert!(
            matches!(err, RegistryError::EmptyEvidence { slot: "value", .. }),
            "{what}: {err}"
        );
    }
}

/// The gate re-checks every planned kernel against the plan's request: a plan edited after
/// planning (its request, or a kernel swapped in from another plan) does not pass.
#[test]
fn the_gate_does_not_trust_an_edited_plan() {
    let req = request(
        ProviderPreference::Auto,
        "checked-runtime",
        VjpMode::TorchleanTape,
    );
    let r = standard_registry();
    let plan = plan_ops(r, &[OpKind::Sin, OpKind::Exp], &req, &cpu_availability()).unwrap();
    assert!(gate_plan(&plan).is_ok());
    // the request now pins the reference provider, but the kernels are native
    let mut edited = plan.clone();
    edited.request.preference = ProviderPreference::Only(Provider::Reference);
    let rejected = gate_plan(&edited).unwrap_err();
    assert!(
        rejected
            .failures
            .iter()
            .any(|f| f.kind_label() == "not_admissible"),
        "{:?}",
        rejected.failures
    );
    // a kernel of another op swapped in
    let mut swapped = plan.clone();
    swapped.kernels[0].op = OpKind::Exp;
    let rejected = gate_plan(&swapped).unwrap_err();
    assert!(rejected
        .failures
        .iter()
        .any(|f| f.kind_label() == "wrong_op"));
    // the single-kernel gate re-checks too
    let mut k = plan.kernels[0].clone();
    k.op = OpKind::Cos;
    assert!(gate_kernel(&k, &req).is_err());
    let mut inference = req.clone();
    inference.device = Device::Cuda;
    assert!(gate_kernel(&plan.kernels[0], &inference).is_err());
}

fn always_refuses(op: &Op, _inputs: &[Operand]) -> Result<(), torchlean::OpError> {
    Err(torchlean::OpError::Payload {
        op: op.name(),
        reason: "this guard refuses every call".into(),
    })
}

/// A registry with native capsules for every op except relu, whose capsule cites a guard that
/// refuses every call; add is bound without destination-passing kernels, so a graph that
/// uses it runs on the general executor, and one that does not on the dense executor.
fn registry_with_refusing_relu_guard() -> Arc<Registry> {
    let mut r = Registry::new();
    for &op in OpKind::ALL {
        if op == OpKind::Relu {
            let mut c = native_cpu::capsule(op);
            c.layout_contract.evidence = Evidence::RuntimeGuard {
                guard: torchlean::guard!(always_refuses),
            };
            r.register(c, native_cpu::binding_for(op)).unwrap();
        } else if op == OpKind::Add {
            r.register(native_cpu::capsule(op), native_cpu::binding())
                .unwrap();
        } else {
            r.register(native_cpu::capsule(op), native_cpu::binding_for(op))
                .unwrap();
        }
    }
    Arc::new(r)
}

/// Guards are structural: a capsule citing a guard that refuses every call is refused on
/// every call in the three execution paths (eager, and backward on the tape; the compiled
/// general executor; the compiled dense executor), with the guard named by its function.
#[test]
fn a_cited_guard_runs_on_every_call_in_every_execution_path() {
    use torchlean::graph::{Graph, NodeKind, OutputDecl, ValueDecl};
    use torchlean::runtime::compiled::CompiledGraph;
    let registry = registry_with_refusing_relu_guard();
    // a compiled run's error names the graph node around the guard's (`Error::AtNode`)
    let refused = |r: torchlean::Result<Vec<(String, Tensor)>>, path: &str| match r {
        Err(e) if matches!(e.root(), Error::Op(_)) => {
            assert!(
                e.to_string().contains("this guard refuses every call"),
                "{path}: {e}"
            );
            assert_eq!(
                path != "eager",
                matches!(e, Error::AtNode { .. }),
                "{path}: {e}"
            );
        }
        Err(e) => panic!("{path}: wrong error {e}"),
        Ok(_) => panic!("{path}: the guard did not run"),
    };
    // eager: every call, not only the first
    let previous = runtime::install(Session::with_registry(
        BackendProfile::default_cpu(),
        Arc::clone(&registry),
    ))
    .unwrap();
    let x = Tensor::randn(&[4], 1).unwrap();
    for _ in 0..3 {
        refused(x.relu().map(|t| vec![("y".into(), t)]), "eager");
    }
    assert!(x.exp().is_ok(), "other capsules run");
    runtime::take().unwrap();
    if let Some(p) = previous {
        runtime::install(p).unwrap();
    }
    // compiled: relu alone runs on the dense executor, relu then add on the general one
    let graph = |with_add: bool| {
        let mut g = Graph::new();
        g.inputs.push(ValueDecl {
            name: "x".into(),
            shape: vec![4],
        });
        let input = g
            .push(NodeKind::Input { name: "x".into() }, vec![])
            .unwrap();
        let mut y = g.push(NodeKind::Op { op: Op::Relu }, vec![input]).unwrap();
        if with_add {
            // relu's value read twice: elementwise fusion leaves relu its own node (`y + x`
            // would fuse relu and add into one fused_map, with no relu capsule to refuse)
            y = g.push(NodeKind::Op { op: Op::Add }, vec![y, y]).unwrap();
        }
        g.outputs.push(OutputDecl {
            name: "y".into(),
            node: y,
        });
        g
    };
    for (with_add, path, dense) in [(false, "dense", true), (true, "general", false)] {
        let c = CompiledGraph::compile_with_registry(
            graph(with_add),
            &BackendProfile::default_cpu(),
            &registry,
        )
        .unwrap();
        assert_eq!(c.dense_buffers().is_some(), dense, "{path}");
        for _ in 0..3 {
            refused(c.run(|_| Some(x.clone())), path);
        }
    }
}
/// The update-many path (`runtime::apply_update_many`: Adam's whole step) runs the cited
/// guards too: an `adam_step` capsule citing a guard that refuses every call is refused on
/// every call, before any target is written.
#[test]
fn a_cited_guard_runs_on_every_update_of_several_tensors() {
    let mut r = Registry::new();
    for &op in OpKind::ALL {
        let mut c = native_cpu::capsule(op);
        if op == OpKind::AdamStep {
            c.layout_contract.evidence = Evidence::RuntimeGuard {
                guard: torchlean::guard!(always_refuses),
            };
        }
        r.register(c, native_cpu::binding_for(op)).unwrap();
    }
    let previous = runtime::install(Session::with_registry(
        BackendProfile::default_cpu(),
        Arc::new(r),
    ))
    .unwrap();
    let op = Op::AdamStep {
        beta1: 0.9,
        weight1: 0.1,
        beta2: 0.999,
        weight2: 0.001,
        step_size: 0.1,
        c2_sqrt: 0.5,
        eps: 1e-8,
        shrink: 1.0,
        l2: 0.0,
    };
    let mut w = Tensor::randn(&[5], 1).unwrap();
    let mut m = Tensor::zeros(&[5]).unwrap();
    let mut v = Tensor::zeros(&[5]).unwrap();
    let g = Tensor::randn(&[5], 2).unwrap();
    let before = w.to_vec();
    for _ in 0..3 {
        let e = runtime::apply_update_many(op.clone(), &mut [&mut w, &mut m, &mut v], &[&g])
            .expect_err("the guard refuses");
        assert!(
            e.to_string().contains("this guard refuses every call"),
            "{e}"
        );
    }
    assert_eq!(w.to_vec(), before, "a target was written");
    runtime::take().unwrap();
    if let Some(p) = previous {
        runtime::install(p).unwrap();
    }
}

#[test]
fn planning_error_lists_every_candidate_with_its_reason() {
    support::checked_cpu_default();
    let req = request(
        ProviderPreference::Only(Provider::NativeCpu),
        "strict",
        VjpMode::ExternalAutograd,
    );
    let err = plan_op(standard_registry(), OpKind::Sin, &req, &cpu_availability()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(
            "reference.sin (provider reference, device cpu): provider `reference` is not preferred"
        ),
        "{msg}"
    );
    assert!(
        msg.contains(
            "native_cpu.sin (provider native_cpu, device cpu): vjp mode `backend_vjp` does not fit"
        ),
        "{msg}"
    );
}

#[test]
fn coalescing_groups_adjacent_equal_capsules_and_never_claims_fusion() {
    support::checked_cpu_default();
    let req = request(ProviderPreference::Auto, "checked-runtime", VjpMode::None);
    let plan = plan_ops(
        standard_registry(),
        &[OpKind::Add, OpKind::Add, OpKind::Relu, OpKind::Add],
        &req,
        &cpu_availability(),
    )
    .unwrap();
    let groups = plan.lower();
    assert_eq!(groups.len(), 3);
    assert_eq!(groups[0].kind, GroupKind::Coalesced);
    assert_eq!(groups[0].nodes, vec![0, 1]);
    assert_eq!(groups[2].kind, GroupKind::Singleton);
    let accepted = gate_plan(&plan).unwrap();
    assert_eq!(accepted.kernels().len(), 4);
}

/// Evidence kinds a registrable capsule can carry (`not_provided` is refused by every trust
/// level, which the registry tests cover).
fn arb_evidence() -> impl Strategy<Value = EvidenceKind> {
    prop::sample::select(
        EvidenceKind::ALL
            .iter()
            .copied()
            .filter(|&k| k != EvidenceKind::NotProvided)
            .collect::<Vec<_>>(),
    )
}

/// Evidence of `kind` for `slot` of a capsule bound to the reference kernels (theorems are
/// the reference's own certificates; a layout claim has no theorem, so a checker stands in).
fn evidence_of(kind: EvidenceKind, slot: Obligation) -> Evidence {
    let checker = || Evidence::Checker {
        checker: torchlean::checker!(checkers::canonical_layout),
        soundness: "accepted => canonical layout".into(),
        mutation_tests: vec!["tests/trust.rs::layout_checker_rejects_wrong_shape".into()],
    };
    match kind {
        EvidenceKind::Theorem if slot == Obligation::Layout => checker(),
        EvidenceKind::Theorem => reference::capsule(OpKind::Sin)
            .contract(slot)
            .evidence
            .clone(),
        EvidenceKind::Checker => checker(),
        EvidenceKind::RuntimeGuard => guard(),
        EvidenceKind::TestSuite => Evidence::TestSuite {
            tests: vec!["tests/trust.rs::gate_accepts_iff_no_failures".into()],
        },
        EvidenceKind::FuzzOracle => Evidence::FuzzOracle { oracle: "f".into() },
        EvidenceKind::TrustedBoundary => Evidence::TrustedBoundary {
            boundary: "b".into(),
        },
        EvidenceKind::NotProvided => Evidence::NotProvided,
    }
}

proptest! {
    /// The gate's property: accepted ⇔ the failure list is empty, for random capsules (theorem
    /// evidence included) and policies. Every generated capsule registers (its declared trust
    /// level is the strongest its evidence supports), so no case is skipped.
    #[test]
    fn gate_accepts_iff_no_failures(
        ev in prop::collection::vec(arb_evidence(), 4),
        allowed in prop::collection::vec(prop::sample::select(EvidenceKind::ALL.to_vec()), 0..7),
        levels in prop::collection::vec(prop::sample::select(TrustLevel::ALL.to_vec()), 0..4),
        vjp in prop::sample::select(vec![VjpMode::None, VjpMode::TorchleanTape]),
    ) {
        let mut c = reference::capsule(OpKind::Sin);
        c.name = "p.sin".into();
        for (slot, &k) in Obligation::ALL.iter().zip(&ev) {
            let e = evidence_of(k, *slot);
            match slot {
                Obligation::Shape => c.shape_contract.evidence = e,
                Obligation::Layout => c.layout_contract.evidence = e,
                Obligation::Value => c.value_contract.evidence = e,
                Obligation::Vjp => c.vjp_contract.evidence = e,
            }
        }
        c.trust_level = *TrustLevel::ALL
            .iter()
            .find(|&&l| Obligation::ALL.iter().all(|&o| trust_supports(l, c.contract(o).evidence.kind())))
            .expect("trusted_external supports every provided evidence");
        let policy = AcceptancePolicy::custom(allowed, levels);
        let audit = audit(&c, vjp);
        let failures = gate_failures(&audit, &policy);
        let mut r = Registry::new();
        let registered = r.register(c, reference::binding());
        prop_assert!(registered.is_ok(), "{:?}", registered);
        // under only:reference the planner leaves trust to the gate, so planning succeeds
        let req = PlanRequest { device: Device::Cpu, preference: ProviderPreference::Only(Provider::Reference), policy: policy.clone(), vjp, mode: ExecutionMode::Eager };
        let planned = plan_op(&r, OpKind::Sin, &req, &cpu_availability()).unwrap();
        let verdict = gate_kernel(&planned, &req);
        prop_assert_eq!(verdict.is_ok(), failures.is_empty());
        if let Err(rej) = verdict {
            prop_assert_eq!(rej.failures, failures);
        }
    }
}

/// Planning and gate errors reach the library user whole: the op, the device, every
/// candidate's refusal, every gate failure — matchable, not flattened into strings.
#[test]
fn planning_and_gate_errors_keep_their_structure() {
    support::checked_cpu_default();
    let run_under = |profile: BackendProfile| {
        let before = runtime::install(Session::new(profile)).unwrap();
        let r = Tensor::ones(&[2]).unwrap().sin();
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
        r.unwrap_err()
    };
    // planning: the op, the device, and why each candidate was refused
    let e = run_under(BackendProfile::named("checked_cuda").unwrap());
    let Error::Planning(errors) = &e else {
        panic!("expected a planning error, got {e:?}")
    };
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].op, errors[0].device),
        (OpKind::Sin, Device::Cuda)
    );
    assert!(errors[0]
        .candidates
        .iter()
        .all(|c| matches!(c.refusal, Refusal::WrongDevice { .. })));
    assert!(e
        .to_string()
        .starts_with("planning: no admissible capsule for op `sin` on device `cuda`"));
    // gate (eager): the refused kernel's audit and every failure
    // native kernels rest on tests (checked) or replay checkers: a theorems-only policy
    // refuses both; under only:native_cpu the planner picks the capsule whose trust level the
    // policy allows (the replayed one), and the gate names its checker evidence
    let strict_native = BackendProfile::custom(
        Device::Cpu,
        ProviderPreference::Only(Provider::NativeCpu),
        AcceptancePolicy::custom(vec![EvidenceKind::Theorem], vec![TrustLevel::Verified]),
        VjpMode::TorchleanTape,
    );
    let e = run_under(strict_native.clone());
    let Error::Gate(rejection) = &e else {
        panic!("expected a gate rejection, got {e:?}")
    };
    assert!(matches!(rejection, GateRejection::Kernel(_)));
    assert_eq!(rejection.audits()[0].capsule, "native_cpu.replayed.sin");
    assert!(rejection.failures().iter().any(|f| matches!(
        f,
        GateFailure::EvidenceNotAccepted {
            op: OpKind::Sin,
            obligation: Obligation::Value,
            evidence: EvidenceKind::Checker,
            ..
        }
    )));
    assert!(
        e.to_string().starts_with("gate: op `sin` rejected:\n  "),
        "{e}"
    );
    // gate (compiled): the rejected plan as a whole
    let x = Tensor::ones(&[2]).unwrap();
    let captured = runtime::capture::capture(&[("x".into(), x)], &[], |xs| {
        Ok(vec![("y".into(), xs[0].sin()?)])
    })
    .unwrap();
    let e: Error = runtime::compiled::CompiledGraph::compile(captured.graph, &strict_native)
        .err()
        .expect("strict refuses native kernels")
        .into();
    let Error::Gate(GateRejection::Plan(plan)) = &e else {
        panic!("expected a rejected plan, got {e:?}")
    };
    assert!(plan.failures.iter().all(|f| match f {
        GateFailure::EvidenceNotAccepted { op, .. }
        | GateFailure::TrustLevelNotAllowed { op, .. }
        | GateFailure::NotAdmissible { op, .. }
        | GateFailure::WrongOp { op, .. } => *op == OpKind::Sin,
    }));
    assert!(
        e.to_string().starts_with("gate: rejected by the gate:\n  "),
        "{e}"
    );
}

/// A capsule that a policy admits only after an opt-in (`mark` makes a capsule such; `opt_in`
/// is the policy's opt-in, which appends `suffix` to its name) is planned only under a policy
/// that opted in, is then preferred over the plain capsule of the same op, and a plan made
/// under the opt-in does not pass the gate under a policy without it (the gate re-checks
/// the request); with only such a capsule registered, planning names the refusal.
fn opt_in_is_required(
    mark: fn(&mut KernelCapsule),
    opt_in: fn(AcceptancePolicy) -> AcceptancePolicy,
    suffix: &str,
    refusal: &str,
    message: &str,
) {
    support::checked_cpu_default();
    let mut marked = native_cpu::capsule(OpKind::Matmul);
    marked.name = "native_cpu.opt_in_test.matmul".into();
    mark(&mut marked);
    let mut r = Registry::new();
    r.register(native_cpu::capsule(OpKind::Matmul), native_cpu::binding())
        .unwrap();
    r.register(marked, native_cpu::binding()).unwrap();
    let plain = request(
        ProviderPreference::Auto,
        "checked-runtime",
        VjpMode::TorchleanTape,
    );
    let planned = plan_op(&r, OpKind::Matmul, &plain, &cpu_availability()).unwrap();
    assert_eq!(planned.capsule().name, "native_cpu.matmul");
    let mut opted = plain.clone();
    opted.policy = opt_in(opted.policy);
    assert_eq!(opted.policy.name, format!("checked-runtime{suffix}"));
    let planned = plan_op(&r, OpKind::Matmul, &opted, &cpu_availability()).unwrap();
    assert_eq!(planned.capsule().name, "native_cpu.opt_in_test.matmul");
    assert!(gate_kernel(&planned, &opted).is_ok());
    let rejection = gate_kernel(&planned, &plain).unwrap_err();
    let text = format!("{:?}", rejection.failures);
    assert!(text.contains(refusal), "{text}");
    let mut only = Registry::new();
    let mut c = native_cpu::capsule(OpKind::Matmul);
    mark(&mut c);
    only.register(c, native_cpu::binding()).unwrap();
    let err = plan_op(&only, OpKind::Matmul, &plain, &cpu_availability()).unwrap_err();
    assert!(err.to_string().contains(message), "{err}");
}

/// A capsule whose results are not bit-reproducible run to run (e.g. a VJP adding with
/// atomics) needs the policy to opt in (`--allow-nondeterministic`).
#[test]
fn nondeterministic_capsules_need_the_policy_to_opt_in() {
    opt_in_is_required(
        |c| c.deterministic = false,
        AcceptancePolicy::with_nondeterministic,
        "+nondeterministic",
        "NondeterministicNotAllowed",
        "did not opt into (--allow-nondeterministic)",
    );
}

/// A reduced-precision (TF32) capsule needs the policy to opt in (`--tf32`).
#[test]
fn reduced_precision_capsules_need_the_policy_to_opt_in() {
    opt_in_is_required(
        |c| c.precision = Precision::Tf32,
        AcceptancePolicy::with_tf32,
        "+tf32",
        "PrecisionNotAllowed",
        "did not opt into (--tf32)",
    );
}

/// native_cpu's VJP, except that it also returns zeros for an operand nobody asked a gradient
/// of — as native_cuda's index kernels did (the forty-ninth session's GPU run: the replay
/// checker took those zeros for a claimed gradient of the constant `index_select` read and
/// rejected a correct call).
fn vjp_with_unrequested_zeros(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    cotangent: &Tensor,
    needs: &[bool],
) -> torchlean::Result<Vec<Option<Tensor>>> {
    let mut grads = native_cpu::vjp(op, inputs, output, cotangent, needs)?;
    for (i, g) in grads.iter_mut().enumerate() {
        if !needs[i] {
            *g = Some(Tensor::from_vec(
                vec![0.0; inputs[i].numel()],
                inputs[i].shape(),
            )?);
        }
    }
    Ok(grads)
}

/// A gradient the caller did not ask for is no result of a VJP call: the checkers never see
/// it (a correct call is not rejected over it) and the tape never uses it, on the eager path
/// and the compiled executor alike.
#[test]
fn gradients_nobody_asked_for_are_not_results_of_the_call() {
    use torchlean::graph::{Graph, NodeKind, OutputDecl, ValueDecl};
    use torchlean::runtime::compiled::CompiledGraph;
    use torchlean::runtime::kernel::KernelBinding;
    let mut r = Registry::new();
    reference::register(&mut r).unwrap();
    for &op in OpKind::ALL {
        let binding = if matches!(op, OpKind::IndexSelect | OpKind::Mul) {
            KernelBinding::new(
                "native_cpu",
                native_cpu::forward,
                Some(vjp_with_unrequested_zeros),
            )
        } else {
            native_cpu::binding_for(op)
        };
        r.register(native_cpu::replayed_capsule(op), binding)
            .unwrap();
    }
    let registry = Arc::new(r);
    let profile = BackendProfile::named("strict_native_cpu").unwrap();
    // eager: y = w[idx] · x with w a constant (no gradient asked) and idx and x tracked:
    // index_select's VJP runs with needs [false, true] (an index gets no gradient), mul's
    // with [true, true]; then x · w[idx] with w[idx] untracked: mul's with [false, true]
    let previous = runtime::install(Session::with_registry(
        profile.clone(),
        Arc::clone(&registry),
    ))
    .unwrap();
    let w = Tensor::from_vec(vec![0.5, -1.5, 2.0, 4.0], &[4]).unwrap();
    let idx = Tensor::from_vec(vec![3.0, 0.0, 3.0], &[3]).unwrap();
    let x = Tensor::from_vec(vec![1.0, 2.0, -3.0], &[3])
        .unwrap()
        .requires_grad();
    let tracked_idx = idx.clone().requires_grad();
    let picked = w.index_select(0, &tracked_idx).unwrap();
    let loss = picked.mul(&x).unwrap().sum_all().unwrap();
    let grads = loss.backward().expect("no checker rejects a correct call");
    assert_eq!(grads.get(&x).unwrap().to_vec(), vec![4.0, 0.5, 4.0]);
    assert!(
        grads.get(&tracked_idx).is_none(),
        "an index has no gradient"
    );
    let picked = w.index_select(0, &idx).unwrap();
    let loss = x.mul(&picked).unwrap().sum_all().unwrap();
    let grads = loss.backward().expect("no checker rejects a correct call");
    assert_eq!(grads.get(&x).unwrap().to_vec(), vec![4.0, 0.5, 4.0]);
    runtime::take().unwrap();
    if let Some(p) = previous {
        runtime::install(p).unwrap();
    }
    // compiled: the same graph, w a parameter without a gradient asked (an input's only)
    let mut g = Graph::new();
    for (name, shape) in [("w", vec![4]), ("idx", vec![3]), ("x", vec![3])] {
        g.inputs.push(ValueDecl {
            name: name.into(),
            shape,
        });
    }
    let ids: Vec<_> = ["w", "idx", "x"]
        .iter()
        .map(|n| {
            g.push(
                NodeKind::Input {
                    name: n.to_string(),
                },
                vec![],
            )
            .unwrap()
        })
        .collect();
    let picked = g
        .push(
            NodeKind::Op {
                op: Op::IndexSelect { axis: 0 },
            },
            vec![ids[0], ids[1]],
        )
        .unwrap();
    let y = g
        .push(NodeKind::Op { op: Op::Mul }, vec![picked, ids[2]])
        .unwrap();
    let loss = g.push(NodeKind::Op { op: Op::SumAll }, vec![y]).unwrap();
    g.outputs.push(OutputDecl {
        name: "loss".into(),
        node: loss,
    });
    let names = torchlean::graph::append_backward(&mut g, "loss", Some(&["x"])).unwrap();
    assert_eq!(names, vec!["grad.x".to_string()]);
    let c = CompiledGraph::compile_with_registry(g, &profile, &registry).unwrap();
    let value = |n: &str| match n {
        "w" => Some(w.clone()),
        "idx" => Some(idx.clone()),
        "x" => Some(Tensor::from_vec(vec![1.0, 2.0, -3.0], &[3]).unwrap()),
        n if n == torchlean::graph::SEED => Some(Tensor::from_vec(vec![1.0], &[]).unwrap()),
        _ => None,
    };
    let out = c.run(value).expect("no checker rejects a correct call");
    let gx = out.iter().find(|(n, _)| n == "grad.x").unwrap();
    assert_eq!(gx.1.to_vec(), vec![4.0, 0.5, 4.0]);
}
