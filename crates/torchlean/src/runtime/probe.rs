//! The runtime probe: before the first kernel, check that the device's hardware and linked
//! libraries are really there (planning only saw what the target *declares*).

use crate::backend::Device;
use crate::error::{Error, Result};

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    pub device: Device,
    pub detail: String,
}

/// Probes `device` through the linked module that owns it (see [`crate::module`]): the CPU
/// is always present; every other device needs its module linked and its probe to pass.
pub fn probe(device: Device) -> Result<ProbeReport> {
    crate::module::probe(device)
}

/// Probes `device` for a profile with provider preference `preference` (see
/// [`crate::module::probe_for`]): a provider the profile names must be linked and usable.
pub fn probe_for(
    device: Device,
    preference: crate::backend::ProviderPreference,
) -> Result<ProbeReport> {
    crate::module::probe_for(device, preference)
}

/// The CPU module's probe: the CPU is always present (its SIMD features are reported).
pub(crate) fn probe_cpu(device: Device) -> Result<ProbeReport> {
    match device {
        Device::Cpu => Ok(ProbeReport {
            device,
            detail: cpu_features(),
        }),
        other => Err(Error::DeviceUnavailable {
            device: other.label().into(),
            reason: "the CPU module probes only the cpu".into(),
        }),
    }
}

fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut f = vec![];
        if std::arch::is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            f.push("fma");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        // which vectors the hot loops run on (`crate::wide`): an opt-out is visible here
        let loops = if crate::wide::enabled() {
            "; hot loops on AVX-512"
        } else if f.contains(&"avx512f") {
            "; hot loops as built (AVX-512 unused: turned off by TORCHLEAN_NO_AVX512=1 or wide::set_as_built, or this CPU lacks one of AVX-512 BW, CD, DQ, VL)"
        } else {
            "; hot loops as built"
        };
        format!(
            "x86_64 cpu, {} threads, features: {}{loops}",
            rayon::current_num_threads(),
            f.join(",")
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        format!(
            "{} cpu, {} threads",
            std::env::consts::ARCH,
            rayon::current_num_threads()
        )
    }
}
