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
        shape_contract: descriptor(shape_claim(op), "s", evidence.clone(), p.clone()),
        layout_contract: descriptor(layout_claim(op), "l", evidence.clone(), p.clone()),
        value_contract: descriptor(value_claim(op), "v", evidence.clone(), p.clone()),
        vjp_contract: descriptor(vjp_claim(op, vjp), "j", evidence, p),
    }
}

fn guard() -> Evidence {
    Evidence::RuntimeGuard {
        guard: "src/providers/native_cpu/guard.rs::output_shape".into(),
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
    assert!(
        proof::certify_spec_instantiation(value_claim(OpKind::Sin), &native_cpu::binding())
            .is_none()
    );
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

/// Every test, checker, guard or fuzz name cited as evidence resolves to a real function (and
/// tests to a real `#[test]`), relative to the crate root.
#[test]
fn every_cited_evidence_name_exists() {
    support::checked_cpu_default();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for e in standard_registry().entries() {
        for o in Obligation::ALL {
            for name in e.capsule.contract(o).evidence.cited_names() {
                let (file, func) = name.rsplit_once("::").unwrap_or_else(|| {
                    panic!(
                        "{}: evidence name `{name}` is not path::function",
                        e.capsule.name
                    )
                });
                let src = std::fs::read_to_string(root.join(file)).unwrap_or_else(|_| {
                    panic!("{}: evidence file `{file}` does not exist", e.capsule.name)
                });
                let pos = src
                    .find(&format!("fn {func}("))
                    .or_else(|| src.find(&format!("fn {func}<")))
                    .unwrap_or_else(|| {
                        panic!("{}: `{file}` has no function `{func}`", e.capsule.name)
                    });
                if file.starts_with("tests/") {
                    let before = &src[..pos];
                    let attr = before
                        .rfind("#[test]")
                        .unwrap_or_else(|| panic!("`{name}` is not a test"));
                    assert!(
                        before[attr..].lines().count() <= 2,
                        "`{name}` is not directly marked #[test]"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "expected many cited names, found {checked}");
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
        2,
        "every candidate is listed with its reason"
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
    let planned = plan_op(
        standard_registry(),
        OpKind::Matmul,
        &req,
        &cpu_availability(),
    )
    .unwrap();
    let rejection = gate_kernel(&planned, req.vjp, &req.policy).unwrap_err();
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
    let accepted = gate_kernel(&planned, req.vjp, &req.policy).unwrap();
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
    let accepted = gate_kernel(&planned, req.vjp, &req.policy).unwrap();
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
        let verdict = gate_kernel(&planned, req.vjp, &req.policy);
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
    let accepted = gate_kernel(&planned, req.vjp, &req.policy).unwrap();
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

#[test]
fn layout_checker_rejects_wrong_shape() {
    support::checked_cpu_default();
    let t = Tensor::zeros(&[2, 3]).unwrap();
    assert!(checkers::canonical_layout(&Op::Relu, &t, &[2, 3]).is_ok());
    assert!(checkers::canonical_layout(&Op::Relu, &t, &[3, 2]).is_err());
    assert!(checkers::canonical_layout(&Op::Relu, &t, &[6]).is_err());
}

#[test]
fn layout_checker_rejects_non_canonical_view() {
    support::checked_cpu_default();
    let t = Tensor::zeros(&[2, 3]).unwrap();
    let view = t.transpose(0, 1).unwrap();
    assert!(
        checkers::canonical_layout(&Op::Relu, &view, &[3, 2]).is_err(),
        "a transposed view is not canonical"
    );
    let slice = Tensor::zeros(&[4, 3]).unwrap().slice(0, 1, 3).unwrap();
    assert!(
        checkers::canonical_layout(&Op::Relu, &slice, &[2, 3]).is_err(),
        "an offset view over larger storage is not canonical"
    );
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

fn arb_evidence() -> impl Strategy<Value = EvidenceKind> {
    prop::sample::select(EvidenceKind::ALL.to_vec())
}

proptest! {
    /// The gate's property: accepted ⇔ the failure list is empty, for random capsules and policies.
    #[test]
    fn gate_accepts_iff_no_failures(
        ev in prop::collection::vec(arb_evidence(), 4),
        allowed in prop::collection::vec(arb_evidence(), 0..7),
        levels in prop::collection::vec(prop::sample::select(TrustLevel::ALL.to_vec()), 0..4),
        level in prop::sample::select(TrustLevel::ALL.to_vec()),
        vjp in prop::sample::select(vec![VjpMode::None, VjpMode::TorchleanTape]),
    ) {
        let mk = |k: EvidenceKind| match k {
            EvidenceKind::Theorem | EvidenceKind::Checker => Evidence::Checker { checker: "c".into(), soundness: "s".into(), mutation_tests: vec![] },
            EvidenceKind::RuntimeGuard => guard(),
            EvidenceKind::TestSuite => Evidence::TestSuite { tests: vec![] },
            EvidenceKind::FuzzOracle => Evidence::FuzzOracle { oracle: "f".into() },
            EvidenceKind::TrustedBoundary => Evidence::TrustedBoundary { boundary: "b".into() },
            EvidenceKind::NotProvided => Evidence::NotProvided,
        };
        let mut c = capsule_with(OpKind::Sin, "p.sin", Provider::Torchlean, level, VjpMode::BackendVjp, mk(ev[0]));
        c.layout_contract.evidence = mk(ev[1]);
        c.value_contract.evidence = mk(ev[2]);
        c.vjp_contract.evidence = mk(ev[3]);
        let policy = AcceptancePolicy::custom(allowed, levels);
        let entry = Arc::new(c);
        let audit = audit(&entry, vjp);
        let failures = gate_failures(&audit, &policy);
        // gate_kernel needs a planned kernel: plan it from a one-capsule registry
        let mut r = Registry::new();
        if r.register((*entry).clone(), native_cpu::binding()).is_ok() {
            let req = PlanRequest { device: Device::Cpu, preference: ProviderPreference::Only(Provider::Torchlean), policy: policy.clone(), vjp, mode: ExecutionMode::Eager };
            let planned = plan_op(&r, OpKind::Sin, &req, &cpu_availability()).unwrap();
            let verdict = gate_kernel(&planned, vjp, &policy);
            prop_assert_eq!(verdict.is_ok(), failures.is_empty());
            if let Err(rej) = verdict {
                prop_assert_eq!(rej.failures, failures);
            }
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
    let strict_native =
        BackendProfile::resolve(None, None, Some("only:native_cpu"), Some("strict")).unwrap();
    let e = run_under(strict_native.clone());
    let Error::Gate(rejection) = &e else {
        panic!("expected a gate rejection, got {e:?}")
    };
    assert!(matches!(rejection, GateRejection::Kernel(_)));
    assert_eq!(rejection.audits()[0].capsule, "native_cpu.sin");
    assert!(rejection.failures().iter().any(|f| matches!(
        f,
        GateFailure::EvidenceNotAccepted {
            op: OpKind::Sin,
            obligation: Obligation::Value,
            evidence: EvidenceKind::TestSuite,
            ..
        }
    )));
    assert!(rejection.failures().iter().any(|f| matches!(
        f,
        GateFailure::TrustLevelNotAllowed {
            op: OpKind::Sin,
            level: TrustLevel::Checked,
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
        | GateFailure::TrustLevelNotAllowed { op, .. } => *op == OpKind::Sin,
    }));
    assert!(
        e.to_string().starts_with("gate: rejected by the gate:\n  "),
        "{e}"
    );
}
