//! The LibTorch profiles' planning, with stand-in capsules declared for `cuda` (planning
//! reads declarations only: no CUDA module or LibTorch is needed). An integration test: the
//! trust layer must not name the providers (tests/layering.rs), and the stand-ins are built
//! from the CPU providers' capsules.

use torchlean::backend::{
    plan_op, request_refusal, AcceptancePolicy, Availability, BackendProfile, ContractClaim,
    Device, Evidence, ExecutionMode, KernelCapsule, PlanRequest, PolicyName, Provider,
    ProviderPreference, Refusal, Registry, TrustLevel, VjpMode,
};
use torchlean::graph::OpKind;
use torchlean::providers::{composition, native_cpu};

fn moved(mut c: KernelCapsule, name: &str, provider: Provider) -> KernelCapsule {
    c.name = name.into();
    c.provider = provider;
    c.device = Device::Cuda;
    c
}

/// A LibTorch SDPA stand-in with vjp mode `mode` and trusted-boundary value evidence.
fn libtorch_sdpa(name: &str, mode: VjpMode) -> KernelCapsule {
    let op = OpKind::ScaledDotProductAttention;
    let mut c = moved(composition::capsule(op), name, Provider::Libtorch);
    c.parts = vec![];
    c.trust_level = TrustLevel::TrustedExternal;
    // as LibTorch's CUDA capsules (it may pick a backend that adds with atomics)
    c.deterministic = false;
    c.vjp_mode = mode;
    c.value_contract.evidence = Evidence::TrustedBoundary {
        boundary: "stand-in".into(),
    };
    c.vjp_contract.claim = ContractClaim::VjpRefinement {
        op,
        spec: "spec::scaled_dot_product_attention.vjp".into(),
        mode,
    };
    c
}

fn fixture() -> (Registry, Availability) {
    let mut r = Registry::new();
    let attention = OpKind::ScaledDotProductAttention;
    // registered before LibTorch's, so that only the preference can pick LibTorch
    r.register(
        moved(
            composition::capsule(attention),
            "torchlean.cuda.composed_attention",
            Provider::Torchlean,
        ),
        composition::binding(),
    )
    .unwrap();
    for op in [OpKind::Matmul, OpKind::Relu] {
        r.register(
            moved(
                native_cpu::capsule(op),
                &format!("native_cuda.{}", op.name()),
                Provider::NativeCuda,
            ),
            native_cpu::binding_for(op),
        )
        .unwrap();
    }
    r.register(
        libtorch_sdpa("libtorch.sdpa_forward", VjpMode::BackendVjp),
        composition::binding(),
    )
    .unwrap();
    r.register(
        libtorch_sdpa("libtorch.sdpa_autograd", VjpMode::ExternalAutograd),
        composition::binding(),
    )
    .unwrap();
    let providers = [
        Provider::Torchlean,
        Provider::NativeCuda,
        Provider::Libtorch,
    ]
    .into_iter()
    .map(|p| (p, Device::Cuda))
    .collect();
    let availability = Availability {
        devices: [Device::Cuda].into_iter().collect(),
        providers,
    };
    (r, availability)
}

fn request(profile: &str, recording: bool) -> PlanRequest {
    let p = BackendProfile::named(profile).unwrap();
    PlanRequest {
        device: p.device,
        preference: p.preference,
        policy: p.policy,
        vjp: if recording { p.vjp } else { VjpMode::None },
        mode: ExecutionMode::Eager,
    }
}

fn planned(r: &Registry, a: &Availability, op: OpKind, req: &PlanRequest) -> String {
    plan_op(r, op, req, a)
        .unwrap_or_else(|e| panic!("{e}"))
        .capsule()
        .name
        .clone()
}

#[test]
fn libtorch_forward_profile_plans_its_forward_bridge_and_cuda_for_the_rest() {
    let (r, a) = fixture();
    for recording in [false, true] {
        let req = request("libtorch_forward_cuda", recording);
        assert_eq!(
            planned(&r, &a, OpKind::ScaledDotProductAttention, &req),
            "libtorch.sdpa_forward"
        );
        assert_eq!(planned(&r, &a, OpKind::Matmul, &req), "native_cuda.matmul");
    }
    // the tape session never takes the external-autograd capsule
    let req = request("libtorch_forward_cuda", true);
    let c = &r.get("libtorch.sdpa_autograd").unwrap().capsule;
    assert!(matches!(
        request_refusal(c, &req),
        Some(Refusal::VjpMode { .. })
    ));
}

#[test]
fn libtorch_autograd_profile_plans_external_autograd_for_attention_only() {
    let (r, a) = fixture();
    let req = request("libtorch_autograd_cuda", true);
    assert_eq!(req.vjp, VjpMode::ExternalAutograd);
    assert_eq!(
        planned(&r, &a, OpKind::ScaledDotProductAttention, &req),
        "libtorch.sdpa_autograd"
    );
    // the ops LibTorch does not bridge keep the torchlean tape
    assert_eq!(planned(&r, &a, OpKind::Matmul, &req), "native_cuda.matmul");
    assert_eq!(planned(&r, &a, OpKind::Relu, &req), "native_cuda.relu");
    // LibTorch's own tape capsule is refused: external autograd is asked of it
    let c = &r.get("libtorch.sdpa_forward").unwrap().capsule;
    assert!(matches!(
        request_refusal(c, &req),
        Some(Refusal::VjpMode { .. })
    ));
    // without recording, the forward bridge is as good as the other (registry order)
    let req = request("libtorch_autograd_cuda", false);
    assert_eq!(
        planned(&r, &a, OpKind::ScaledDotProductAttention, &req),
        "libtorch.sdpa_forward"
    );
}

#[test]
fn external_autograd_under_auto_or_only_still_matches_exactly() {
    let (r, a) = fixture();
    let mut req = request("libtorch_autograd_cuda", true);
    for pref in [
        ProviderPreference::Auto,
        ProviderPreference::Only(Provider::NativeCuda),
    ] {
        req.preference = pref;
        let e = plan_op(&r, OpKind::Matmul, &req, &a).unwrap_err();
        assert!(
            e.to_string()
                .contains("vjp mode `backend_vjp` does not fit"),
            "{e}"
        );
    }
}

/// LibTorch's CUDA capsules are declared nondeterministic: the two libtorch profiles opt in
/// (their policy's name says so) and plan them; the same policy without the opt-in refuses
/// them and plans the composition; a `--policy` override keeps the opt-in, strict refuses
/// it, and moved to the CPU (where every capsule is deterministic) the policy drops it.
#[test]
fn the_libtorch_profiles_opt_into_nondeterministic_capsules() {
    let (r, a) = fixture();
    let opted = request("libtorch_forward_cuda", true);
    assert_eq!(opted.policy.name, "allow-trusted-runtime+nondeterministic");
    let mut plain = opted.clone();
    plain.policy = AcceptancePolicy::named(PolicyName::AllowTrustedRuntime).unwrap();
    let c = &r.get("libtorch.sdpa_forward").unwrap().capsule;
    assert!(matches!(
        request_refusal(c, &plain),
        Some(Refusal::NondeterministicNotAllowed { .. })
    ));
    assert_eq!(
        planned(&r, &a, OpKind::ScaledDotProductAttention, &plain),
        "torchlean.cuda.composed_attention"
    );
    let kept = BackendProfile::resolve(
        Some("libtorch_forward_cuda"),
        None,
        None,
        Some("allow-trusted-runtime"),
    )
    .unwrap();
    assert!(kept.policy.allow_nondeterministic, "{:?}", kept.policy);
    let e = BackendProfile::resolve(Some("libtorch_autograd_cuda"), None, None, Some("strict"))
        .unwrap_err();
    assert!(e.contains("never admits"), "{e}");
    let cpu =
        BackendProfile::resolve(Some("libtorch_forward_cuda"), Some("cpu"), None, None).unwrap();
    assert!(!cpu.policy.allow_nondeterministic);
    assert_eq!(cpu.policy.name, "allow-trusted-runtime");
}
