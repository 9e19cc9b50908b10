//! torchlean-cuda: the CUDA provider module of torchlean (DESIGN §7).
//!
//! Linking this module ([`link`], at program start) adds device `cuda` and the providers
//! `native_cuda` (kernels in `kernels/*.cu`, compiled at run time by NVRTC for the device's
//! architecture and cached on disk), `cublas` and `cufft` to the process's registry, target and
//! availability. Every kernel it runs is planned, audited and admitted by the gate like a CPU
//! kernel; the report's target line names the GPU, its compute capability, and the driver,
//! NVRTC, cuBLAS and cuFFT versions.
//!
//! CUDA is loaded dynamically (cudarc's `dynamic-loading`): the crate builds and runs on a
//! machine without a CUDA toolkit or GPU. There the probe ([`probe`]) finds what is missing
//! before anything touches a library, and a request for `cuda` stops before any kernel runs
//! with [`torchlean::Error::DeviceUnavailable`] naming it (the CLI's exit code 2).
//!
//! Layout: [`probe`] (libraries and versions), [`device`] (context, stream, handles,
//! functions), [`memory`] (the caching allocator and [`memory::CudaBuffer`]), [`nvrtc`]
//! (run-time compilation and its disk cache), [`kernels`] (the kernels), [`guard`] (their
//! runtime guards), [`capsules`] (their contracts and evidence).

pub mod capsules;
pub mod device;
pub mod guard;
pub mod kernels;
pub mod memory;
pub mod nvrtc;
pub mod probe;

use std::sync::Arc;
use torchlean::backend::{Device, Provider, Registry, RegistryError};
use torchlean::module::ProviderModule;
use torchlean::runtime::probe::ProbeReport;
use torchlean::tensor::DeviceBuffer;

/// The CUDA provider module.
pub struct CudaModule;

impl ProviderModule for CudaModule {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn devices(&self) -> Vec<Device> {
        vec![Device::Cuda]
    }
    fn declares(&self) -> Vec<(Provider, Device)> {
        vec![
            (Provider::NativeCuda, Device::Cuda),
            (Provider::Cublas, Device::Cuda),
            (Provider::Cufft, Device::Cuda),
            (Provider::Torchlean, Device::Cuda),
        ]
    }
    fn target_features(&self) -> Vec<String> {
        vec!["cuda".into()]
    }
    fn register(&self, registry: &mut Registry) -> Result<(), RegistryError> {
        capsules::register(registry)
    }
    fn probe(&self, device: Device) -> torchlean::Result<ProbeReport> {
        if device != Device::Cuda {
            return Err(torchlean::Error::DeviceUnavailable {
                device: device.label().into(),
                reason: "the CUDA module probes only `cuda`".into(),
            });
        }
        let cx = device::context()?;
        Ok(ProbeReport {
            device,
            detail: cx.detail.clone(),
        })
    }
    fn upload(&self, device: Device, data: &[f32]) -> torchlean::Result<Arc<dyn DeviceBuffer>> {
        if device != Device::Cuda {
            return Err(torchlean::Error::DeviceUnavailable {
                device: device.label().into(),
                reason: "the CUDA module keeps `cuda` memory only".into(),
            });
        }
        // the context is the probe: an error naming what is missing when CUDA is not usable
        let cx = device::context()?;
        let mut b = cx.pool.alloc(data.len(), "a host-to-device copy")?;
        if !data.is_empty() {
            let mut dst = b.slice_mut().slice_mut(0..data.len());
            cx.stream
                .memcpy_htod(data, &mut dst)
                .map_err(|e| device::failure("to_device", e))?;
        }
        Ok(Arc::new(b))
    }
    fn synchronize(&self, device: Device) -> torchlean::Result<()> {
        if device != Device::Cuda {
            return Ok(());
        }
        match device::context_if_created() {
            Some(cx) => cx
                .stream
                .synchronize()
                .map_err(|e| device::failure("synchronize", e)),
            None => Ok(()),
        }
    }
    fn memory_stats(&self, device: Device) -> Option<serde_json::Value> {
        if device != Device::Cuda {
            return None;
        }
        // only once the context exists: statistics never create it
        device::context_if_created().map(|cx| cx.pool.stats().to_json())
    }
}

/// Links the CUDA module into this process (call once at startup, before the first session;
/// see `torchlean::module::link`).
pub fn link() -> torchlean::Result<()> {
    torchlean::module::link(Arc::new(CudaModule))
}

/// Whether CUDA is usable here (libraries, driver and a device), and if not, why.
pub fn available() -> Result<String, String> {
    device::context()
        .map(|cx| cx.detail.clone())
        .map_err(|e| e.to_string())
}
