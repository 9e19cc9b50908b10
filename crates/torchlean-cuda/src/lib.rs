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
//! functions), [`lt`] (cuBLASLt: plans for linear's products), [`memory`] (the caching allocator and [`memory::CudaBuffer`]), [`graph`]
//! (recording and replaying CUDA Graphs), [`queue`] (small element-wise calls, many to a launch), [`nvrtc`]
//! (run-time compilation and its disk cache), [`kernels`] (the kernels), [`guard`] (their
//! runtime guards), [`capsules`] (their contracts and evidence).

pub mod capsules;
pub mod device;
mod exclusive;
pub mod graph;
pub mod guard;
pub mod kernels;
pub mod lt;
pub mod memory;
pub mod nvrtc;
pub mod probe;
pub mod queue;

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
        // a copy from pageable host memory cannot be part of a device graph
        graph::refuse_while_recording("to_device")?;
        let mut b = cx.pool.alloc(data.len(), &"a host-to-device copy")?;
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
            Some(cx) => {
                cx.launch_queued()?;
                cx.stream
                    .synchronize()
                    .map_err(|e| device::failure("synchronize", e))?;
                // the checks of the calls launched so far (see `graph::check_at_next_read`)
                graph::run_pending()
            }
            None => Ok(()),
        }
    }
    fn zeros(&self, device: Device, len: usize) -> torchlean::Result<Arc<dyn DeviceBuffer>> {
        let cx = cuda_context(device)?;
        let mut b = cx.pool.alloc(len, &"zeros")?;
        cx.stream
            .memset_zeros(b.slice_mut())
            .map_err(|e| device::failure("zeros", e))?;
        Ok(Arc::new(b))
    }
    fn duplicate(&self, src: &dyn DeviceBuffer) -> torchlean::Result<Arc<dyn DeviceBuffer>> {
        let cx = cuda_context(src.device())?;
        let src = cuda_buffer(src)?;
        let mut b = cx.pool.alloc(src.len(), &"a device copy")?;
        if src.len() > 0 {
            let view = src.slice().slice(0..src.len());
            let mut dst = b.slice_mut().slice_mut(0..src.len());
            cx.stream
                .memcpy_dtod(&view, &mut dst)
                .map_err(|e| device::failure("a device copy", e))?;
        }
        Ok(Arc::new(b))
    }
    fn copy_into(&self, dst: &dyn DeviceBuffer, src: &dyn DeviceBuffer) -> torchlean::Result<()> {
        let cx = cuda_context(dst.device())?;
        let (dst, src) = (cuda_buffer(dst)?, cuda_buffer(src)?);
        if dst.len() != src.len() {
            return Err(device::failure(
                "copy_into",
                format!("{} elements into a buffer of {}", src.len(), dst.len()),
            ));
        }
        if src.len() == 0 {
            return Ok(());
        }
        use cudarc::driver::DevicePtr;
        let (d, _d) = dst.slice().device_ptr(&cx.stream);
        let (s, _s) = src.slice().device_ptr(&cx.stream);
        // SAFETY: both pointers address live buffers of at least `len` f32 (checked above);
        // the copy is ordered on the module's one stream after every earlier use of either
        // buffer. `dst` is written through a shared handle: its only holder is a device
        // graph's static buffer (`torchlean::runtime::device_graph`), which nothing else reads.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(d, s, src.len() * 4, cx.stream.cu_stream())
        }
        .map_err(|e| device::failure("copy_into", e))
    }
    fn copy_many(&self, pairs: &[(&dyn DeviceBuffer, &dyn DeviceBuffer)]) -> torchlean::Result<()> {
        let Some((first, _)) = pairs.first() else {
            return Ok(());
        };
        if pairs.len() == 1 {
            return self.copy_into(pairs[0].0, pairs[0].1);
        }
        let cx = cuda_context(first.device())?;
        graph::refuse_while_recording("copy_many")?;
        // one block row per copy (grid y)
        let count = u32::try_from(pairs.len())
            .ok()
            .filter(|&c| c <= 65_535)
            .ok_or_else(|| {
                device::failure(
                    "copy_many",
                    format!("{} copies in one batch (at most 65535)", pairs.len()),
                )
            })?;
        use cudarc::driver::DevicePtr;
        // per copy: destination address, source address, length in floats (each u64 as two
        // f32 bit patterns: the pool's buffers hold f32)
        let mut desc: Vec<f32> = Vec::with_capacity(6 * pairs.len());
        let mut longest = 0usize;
        let mut held = Vec::with_capacity(pairs.len());
        for (dst, src) in pairs {
            let (d, s) = (cuda_buffer(*dst)?, cuda_buffer(*src)?);
            if d.len() != s.len() {
                return Err(device::failure(
                    "copy_many",
                    format!("{} elements into a buffer of {}", s.len(), d.len()),
                ));
            }
            let (dp, dg) = d.slice().device_ptr(&cx.stream);
            let (sp, sg) = s.slice().device_ptr(&cx.stream);
            held.push((dg, sg));
            for word in [dp, sp, s.len() as u64] {
                desc.push(f32::from_bits(word as u32));
                desc.push(f32::from_bits((word >> 32) as u32));
            }
            longest = longest.max(s.len());
        }
        let mut table = cx.pool.alloc(desc.len(), &"copy_many's table")?;
        cx.stream
            .memcpy_htod(&desc, &mut table.slice_mut().slice_mut(0..desc.len()))
            .map_err(|e| device::failure("copy_many", e))?;
        let blocks = longest.div_ceil(4 * 256).clamp(1, 264) as u32;
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (blocks, count, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        use cudarc::driver::PushKernelArg;
        let mut l = cx.stream.launch_builder(&cx.functions.copy_segments);
        l.arg(table.slice());
        // SAFETY: the table holds, per copy, the addresses of two live buffers of the module's
        // (held above until the launch is queued; freed buffers return to the pool, which
        // reuses them only for later work on the same stream) and their common length (checked
        // above); each destination is a device graph's static buffer, which nothing else
        // writes (`copy_into`'s contract), and no two copies share one.
        unsafe { l.launch(cfg) }.map_err(|e| device::failure("copy_many", e))?;
        drop(held);
        Ok(())
    }
    fn capture(
        &self,
        device: Device,
        work: &mut dyn FnMut() -> torchlean::Result<()>,
    ) -> torchlean::Result<Box<dyn torchlean::module::DeviceGraph>> {
        cuda_context(device)?;
        Ok(Box::new(graph::record(work)?))
    }
    fn start_span(
        &self,
        device: Device,
    ) -> torchlean::Result<Option<Box<dyn torchlean::module::DeviceSpan>>> {
        // nothing runs while a graph is recorded: there is no time to take
        if device != Device::Cuda || graph::is_recording() {
            return Ok(None);
        }
        Ok(Some(Box::new(device::EventSpan::start(&*cuda_context(
            device,
        )?)?)))
    }
    fn memory_stats(&self, device: Device) -> Option<serde_json::Value> {
        if device != Device::Cuda {
            return None;
        }
        // only once the context exists: statistics never create it
        device::context_if_created().map(|cx| cx.pool.stats().to_json())
    }
}

/// The context, for `device` = cuda.
fn cuda_context(device: Device) -> torchlean::Result<device::Cx> {
    if device != Device::Cuda {
        return Err(torchlean::Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "the CUDA module keeps `cuda` memory only".into(),
        });
    }
    device::context()
}

/// `b` as this module's buffer.
fn cuda_buffer(b: &dyn DeviceBuffer) -> torchlean::Result<&memory::CudaBuffer> {
    b.as_any()
        .downcast_ref::<memory::CudaBuffer>()
        .ok_or_else(|| device::failure("a device copy", "not a CUDA buffer of this module"))
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
