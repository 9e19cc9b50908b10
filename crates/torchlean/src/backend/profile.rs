//! Named backend profiles: device + provider preference + policy + VJP mode, in one name.

use super::gate::AcceptancePolicy;
use super::planner::ProviderPreference;
use super::vocab::{Device, PolicyName, Provider, VjpMode};
use serde::Serialize;

/// A bundle of the independent backend choices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendProfile {
    pub name: String,
    pub device: Device,
    pub preference: ProviderPreference,
    pub policy: AcceptancePolicy,
    /// The VJP mode requested when gradients are recorded.
    pub vjp: VjpMode,
}

fn profile(
    name: &str,
    device: Device,
    preference: ProviderPreference,
    policy: PolicyName,
    vjp: VjpMode,
) -> BackendProfile {
    BackendProfile {
        name: name.to_string(),
        device,
        preference,
        // named policies always exist
        policy: AcceptancePolicy::named(policy).expect("named policy"),
        vjp,
    }
}

impl BackendProfile {
    /// Every named profile (DESIGN §3).
    pub fn all_named() -> Vec<BackendProfile> {
        use ProviderPreference::*;
        use VjpMode::TorchleanTape as Tape;
        let mut v = vec![
            profile(
                "strict_cpu",
                Device::Cpu,
                Only(Provider::Reference),
                PolicyName::Strict,
                Tape,
            ),
            profile(
                "checked_cpu",
                Device::Cpu,
                Auto,
                PolicyName::CheckedRuntime,
                Tape,
            ),
            profile(
                "strict_native_cpu",
                Device::Cpu,
                Only(Provider::NativeCpu),
                PolicyName::Strict,
                Tape,
            ),
            profile(
                "checked_cuda",
                Device::Cuda,
                Auto,
                PolicyName::CheckedRuntime,
                Tape,
            ),
            profile(
                "strict_native_cuda",
                Device::Cuda,
                Auto,
                PolicyName::Strict,
                Tape,
            ),
            // checked_cuda with TF32 products where a capsule offers them (cuBLAS's)
            profile(
                "checked_cuda_tf32",
                Device::Cuda,
                Auto,
                PolicyName::CheckedRuntime,
                Tape,
            )
            .with_tf32(),
            // LibTorch only where it has an explicit bridge (attention: libtorch.sdpa_forward,
            // libtorch.sdpa_autograd), the CUDA providers for the rest of the model; the
            // session refuses either profile before any kernel when the bridge is not linked
            // (runtime::probe::probe_for)
            // (LibTorch's CUDA SDPA may pick a backend that is not bit-reproducible: both
            // profiles opt into nondeterministic capsules, and their policy's name says so)
            profile(
                "libtorch_forward_cuda",
                Device::Cuda,
                Prefer(Provider::Libtorch),
                PolicyName::AllowTrustedRuntime,
                Tape,
            )
            .with_nondeterministic(),
            profile(
                "libtorch_autograd_cuda",
                Device::Cuda,
                Prefer(Provider::Libtorch),
                PolicyName::AllowTrustedRuntime,
                VjpMode::ExternalAutograd,
            )
            .with_nondeterministic(),
        ];
        for (name, device) in [
            ("future_metal", Device::Metal),
            ("future_rocm", Device::Rocm),
            ("future_wasm", Device::Wasm),
            ("future_tpu", Device::Tpu),
            ("future_trainium", Device::Trainium),
            ("future_custom_chip", Device::Custom),
            ("future_external", Device::External),
        ] {
            v.push(profile(name, device, Auto, PolicyName::Strict, Tape));
        }
        v
    }

    /// This profile with its policy opted into TF32 capsules (`--tf32`).
    pub fn with_tf32(mut self) -> BackendProfile {
        self.policy = self.policy.with_tf32();
        self
    }

    /// This profile with its policy opted into nondeterministic capsules
    /// (`--allow-nondeterministic`).
    pub fn with_nondeterministic(mut self) -> BackendProfile {
        self.policy = self.policy.with_nondeterministic();
        self
    }

    /// Looks a named profile up.
    pub fn named(name: &str) -> Result<BackendProfile, String> {
        BackendProfile::all_named()
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let names: Vec<String> = BackendProfile::all_named()
                    .into_iter()
                    .map(|p| p.name)
                    .collect();
                format!("unknown profile `{name}` (known: {})", names.join(", "))
            })
    }

    /// The default: checked CPU.
    pub fn default_cpu() -> BackendProfile {
        profile(
            "checked_cpu",
            Device::Cpu,
            ProviderPreference::Auto,
            PolicyName::CheckedRuntime,
            VjpMode::TorchleanTape,
        )
    }

    /// A profile assembled from individual choices (named `custom`).
    pub fn custom(
        device: Device,
        preference: ProviderPreference,
        policy: AcceptancePolicy,
        vjp: VjpMode,
    ) -> BackendProfile {
        BackendProfile {
            name: "custom".into(),
            device,
            preference,
            policy,
            vjp,
        }
    }

    /// Builds the profile a command line asks for: `profile` (a name) or, without one, the
    /// default profile of `device` (cpu → checked_cpu, cuda → checked_cuda, others →
    /// future_*); then `device`, `provider` (auto | prefer:P | only:P) and `policy`
    /// override its fields. An overridden profile is reported as `custom(<base>)`.
    pub fn resolve(
        profile: Option<&str>,
        device: Option<&str>,
        provider: Option<&str>,
        policy: Option<&str>,
    ) -> Result<BackendProfile, String> {
        let parsed_device = device
            .map(|d| {
                Device::parse(d).ok_or_else(|| {
                    let known: Vec<&str> = Device::ALL.iter().map(|d| d.label()).collect();
                    format!("unknown device `{d}` (known: {}; aliases gpu, amd, mps, webgpu, xla, neuron)", known.join(", "))
                })
            })
            .transpose()?;
        let mut p = match (profile, parsed_device) {
            (Some(name), _) => BackendProfile::named(name)?,
            (None, Some(Device::Cpu)) | (None, None) => BackendProfile::default_cpu(),
            (None, Some(Device::Cuda)) => BackendProfile::named("checked_cuda")?,
            (None, Some(d)) => BackendProfile::all_named()
                .into_iter()
                .find(|p| p.device == d)
                .unwrap_or_else(|| {
                    BackendProfile::custom(
                        d,
                        ProviderPreference::Auto,
                        // `named` returns Some for every policy but `custom`
                        AcceptancePolicy::named(PolicyName::Strict).expect("named policy"),
                        VjpMode::TorchleanTape,
                    )
                }),
        };
        let base = p.name.clone();
        let mut overridden = false;
        if let Some(d) = parsed_device {
            overridden |= d != p.device;
            p.device = d;
        }
        if let Some(pref) = provider {
            let pref = ProviderPreference::parse(pref)?;
            overridden |= pref != p.preference;
            p.preference = pref;
        }
        if let Some(pol) = policy {
            let mut pol = AcceptancePolicy::parse(pol)?;
            // the profile's TF32 opt-in stays with the policy that replaces its own (it was
            // dropped without a word: `checked_cuda_tf32 --policy checked-runtime` planned
            // f32 products, and ran on the CPU where the profile alone is refused)
            if p.policy.allow_tf32 {
                if pol.name.starts_with("strict") {
                    return Err(format!(
                        "profile `{base}` opts into TF32 tensor-core products, which policy `{}` never admits (no TF32 capsule has a replay checker); use policy checked-runtime, or a profile without TF32",
                        pol.name
                    ));
                }
                pol = pol.with_tf32();
            }
            // so does its opt-in into nondeterministic capsules (the libtorch profiles'),
            // refused under strict as TF32's is (no such capsule has a replay checker)
            if p.policy.allow_nondeterministic {
                if pol.name.starts_with("strict") {
                    return Err(format!(
                        "profile `{base}` opts into nondeterministic capsules, which policy `{}` never admits (none has a replay checker); use policy allow-trusted-runtime or checked-runtime",
                        pol.name
                    ));
                }
                pol = pol.with_nondeterministic();
            }
            overridden |= pol != p.policy;
            p.policy = pol;
        }
        // an opt-in that nothing could honour is refused, never silently kept: TF32 capsules
        // exist on cuda only (`--profile checked_cuda_tf32 --device cpu` ran on the CPU with
        // a policy naming TF32, where `--tf32` on the CPU is refused)
        if p.policy.allow_tf32 && p.device != Device::Cuda {
            return Err(format!(
                "profile `{base}` opts into TF32 tensor-core products, which exist on device `cuda` only (this request runs on `{}`); choose a profile without TF32 for this device",
                p.device.label()
            ));
        }
        // the libtorch profiles' opt-in into nondeterministic capsules concerns their CUDA
        // capsules: moved to another device, where every capsule is deterministic, the
        // policy does not claim it
        if p.policy.allow_nondeterministic && p.device != Device::Cuda {
            p.policy = AcceptancePolicy {
                allow_nondeterministic: false,
                name: p.policy.name.replace("+nondeterministic", ""),
                ..p.policy
            };
        }
        if overridden {
            p.name = format!("custom({base})");
        }
        Ok(p)
    }
}
