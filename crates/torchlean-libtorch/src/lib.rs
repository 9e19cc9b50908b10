//! torchlean-libtorch: the LibTorch bridge of torchlean (provider `libtorch`, DESIGN §7).
//!
//! Linking this module ([`link`], at program start, after the CUDA module) adds provider
//! `libtorch` on `cuda` and on `cpu` with two capsules for `scaled_dot_product_attention`
//! ([`capsules`]):
//!
//! - `libtorch.sdpa_forward`: LibTorch computes the value (`at::scaled_dot_product_attention`
//!   with the boolean mask or additive bias as its mask); torchlean's tape applies its own backward rule
//!   (the `torchlean` composition's VJP, its parts planned and gated under the same profile);
//!   VJP mode `backend_vjp`.
//! - `libtorch.sdpa_autograd`: external autograd — LibTorch owns the local backward: the VJP
//!   kernel re-runs the forward under LibTorch's autograd and back-propagates the cotangent
//!   (`torch::autograd::grad`); VJP mode `external_autograd`.
//!
//! Both are `trusted_external`: the value (and, for the second, the VJP) is LibTorch's code,
//! named as a trusted boundary; shape and layout are runtime guards. Profiles
//! `libtorch_forward_cuda` and `libtorch_autograd_cuda` (prefer:libtorch) plan them for the
//! attention rows and the CUDA providers for everything else.
//!
//! Masks mean what torchlean's spec says ([`bridge`]): a boolean mask (nonzero = may attend,
//! `[L, S]` or `[..., L, S]`) and `causal` are combined into one boolean mask; a fully
//! blocked row outputs zeros and passes no gradient (LibTorch never sees such a row: it is
//! unblocked for LibTorch and its output zeroed after). Additive-bias masks are refused by
//! the layout guard (not bridged).
//!
//! Data moves through the host (torchlean tensor → host → LibTorch tensor on the same device
//! and back): correct on any device, at the cost of two host round trips per call
//! (docs/libtorch.md).
//!
//! This crate is **not** a workspace member: building it needs libtorch (docs/libtorch.md).

pub mod bridge;
pub mod capsules;
pub mod guard;
pub mod probe;

use std::sync::Arc;
use torchlean::backend::{Device, Provider, Registry, RegistryError};
use torchlean::module::ProviderModule;
use torchlean::runtime::probe::ProbeReport;
use torchlean::tensor::DeviceBuffer;

/// Errors of the bridge (converted to [`torchlean::Error`] at the kernel boundary).
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// A LibTorch call failed.
    #[error("LibTorch call `{call}` failed: {source}")]
    Torch {
        call: &'static str,
        #[source]
        source: tch::TchError,
    },
    /// The device is not one LibTorch can run here.
    #[error("LibTorch cannot run on `{device}` here: {reason}")]
    Device { device: String, reason: String },
    /// A size LibTorch's i64 shapes cannot hold.
    #[error("size {0} does not fit LibTorch's i64 shapes")]
    Size(usize),
}

impl BridgeError {
    /// As a torchlean error of `op` on `device`.
    pub fn into_core(self, op: &str, device: Device) -> torchlean::Error {
        match self {
            BridgeError::Device { device, reason } => torchlean::Error::ProviderUnavailable {
                provider: Provider::Libtorch.label().into(),
                device,
                reason,
            },
            other => torchlean::Error::DeviceFailure {
                op: op.into(),
                device: device.label().into(),
                reason: other.to_string(),
            },
        }
    }
}

/// The LibTorch provider module: declares `libtorch` on `cuda` and `cpu`; owns no device
/// memory (the CPU and CUDA modules own it).
pub struct LibtorchModule;

impl ProviderModule for LibtorchModule {
    fn name(&self) -> &'static str {
        "libtorch"
    }
    fn devices(&self) -> Vec<Device> {
        vec![]
    }
    fn declares(&self) -> Vec<(Provider, Device)> {
        vec![
            (Provider::Libtorch, Device::Cuda),
            (Provider::Libtorch, Device::Cpu),
        ]
    }
    fn target_features(&self) -> Vec<String> {
        vec!["libtorch".into()]
    }
    fn register(&self, registry: &mut Registry) -> Result<(), RegistryError> {
        capsules::register(registry)
    }
    fn probe(&self, device: Device) -> torchlean::Result<ProbeReport> {
        probe::probe(device)
            .map(|detail| ProbeReport { device, detail })
            .map_err(|e| e.into_core("probe", device))
    }
    fn upload(&self, device: Device, _data: &[f32]) -> torchlean::Result<Arc<dyn DeviceBuffer>> {
        Err(torchlean::Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "the LibTorch module keeps no device memory (the CPU and CUDA modules do)"
                .into(),
        })
    }
}

/// Links the LibTorch module into this process (at startup, before the first session; see
/// `torchlean::module::link`).
pub fn link() -> torchlean::Result<()> {
    // LibTorch's CUDA library first, before anything can query LibTorch's CUDA backend (it is
    // looked up once and cached); a failure is reported by the `cuda` probe, not here
    let _ = probe::load_cuda();
    torchlean::module::link(Arc::new(LibtorchModule))
}
