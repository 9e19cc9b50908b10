//! Target (what this build and machine are) and Availability (what is declared for planning).
//!
//! Both are data. The separate *runtime probe* of linked libraries and hardware, which eager
//! execution performs before its first kernel, lives in `runtime::probe`.

use super::vocab::{Device, Provider};
use serde::Serialize;
use std::collections::BTreeSet;

/// The operating system, architecture, accelerator and compiled features of this build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub os: String,
    pub arch: String,
    pub accelerator: Option<String>,
    pub features: Vec<String>,
}

impl Target {
    /// The target this crate was compiled for. CUDA is declared only by a build that links a
    /// CUDA provider crate (none in this build).
    pub fn host() -> Target {
        Target {
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            accelerator: None,
            features: vec!["cpu".into()],
        }
    }
}

/// Devices and (provider, device) pairs declared for planning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Availability {
    pub devices: BTreeSet<Device>,
    pub providers: BTreeSet<(Provider, Device)>,
}

impl Availability {
    /// What a target declares: CPU with the reference, native CPU and composition providers;
    /// CUDA providers only when the target has the `cuda` feature.
    pub fn declared(target: &Target) -> Availability {
        let mut devices = BTreeSet::from([Device::Cpu]);
        let mut providers = BTreeSet::from([
            (Provider::Reference, Device::Cpu),
            (Provider::NativeCpu, Device::Cpu),
            (Provider::Torchlean, Device::Cpu),
        ]);
        if target.features.iter().any(|f| f == "cuda") {
            devices.insert(Device::Cuda);
            for p in [
                Provider::NativeCuda,
                Provider::Cublas,
                Provider::Cufft,
                Provider::Torchlean,
            ] {
                providers.insert((p, Device::Cuda));
            }
        }
        Availability { devices, providers }
    }

    pub fn has_device(&self, d: Device) -> bool {
        self.devices.contains(&d)
    }

    pub fn has_provider(&self, p: Provider, d: Device) -> bool {
        self.providers.contains(&(p, d))
    }
}
