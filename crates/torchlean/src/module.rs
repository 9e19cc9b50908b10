//! Provider modules: how a device and its providers plug into a build (DESIGN §7).
//!
//! A [`ProviderModule`] is one unit of linking: its capsules (registered in its own
//! tie-break order), the (provider, device) pairs it declares for planning, the target
//! features it adds, its runtime probe, and — for a device other than the host — how host
//! values reach its memory. The standard registry, the [`Target`] and the [`Availability`]
//! that eager and compiled mode plan against are all built from the linked modules, so adding
//! a provider is one module (plus its rows in the conformance table) and nothing else.
//!
//! The CPU module ([`CpuModule`]: reference, native_cpu, the `torchlean` compositions) is
//! always linked. Other modules are linked by the program at startup with [`link`], before
//! the first session or registry use: the set is frozen the first time it is read, and a
//! later `link` is [`Error::ModulesFrozen`] (a registry built without a module must not
//! silently gain one).
//!
//! This module owns the linking and the dispatch of probes and uploads to the module that
//! declares a device; it must not plan, gate or run kernels.

use crate::backend::{
    Availability, Device, Provider, ProviderPreference, Registry, RegistryError, Target,
};
use crate::error::{Error, Result};
use crate::runtime::probe::ProbeReport;
use crate::tensor::DeviceBuffer;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

/// One linked unit of providers and devices.
pub trait ProviderModule: Send + Sync + 'static {
    /// A stable name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// The devices whose memory and probe this module owns.
    fn devices(&self) -> Vec<Device>;
    /// The (provider, device) pairs it declares for planning.
    fn declares(&self) -> Vec<(Provider, Device)>;
    /// The target features it adds (e.g. `cuda`).
    fn target_features(&self) -> Vec<String>;
    /// Registers its capsules, in its planning tie-break order.
    fn register(&self, registry: &mut Registry) -> std::result::Result<(), RegistryError>;
    /// Checks, before the first kernel on `device`, that its hardware and libraries are
    /// really there; the report's detail line names what was found (versions, features).
    fn probe(&self, device: Device) -> Result<ProbeReport>;
    /// Copies host values into a new buffer on `device` (one of [`Self::devices`], not the
    /// host), refusing with what is missing when the device's probe fails.
    fn upload(&self, device: Device, data: &[f32]) -> Result<Arc<dyn DeviceBuffer>>;
    /// Memory statistics of `device` for reports (peak bytes, allocations, cache hits), if
    /// the module keeps any.
    fn memory_stats(&self, _device: Device) -> Option<serde_json::Value> {
        None
    }
    /// Waits until every kernel launched on `device` so far has finished (for timing; reads
    /// of values wait by themselves), then runs the checks that wait for it: an error may be
    /// an earlier call's (an invalid index on CUDA). Devices that run synchronously have
    /// nothing to wait for.
    fn synchronize(&self, _device: Device) -> Result<()> {
        Ok(())
    }
    /// A new buffer on `device` of `len` elements, all zero, written on the device (no host
    /// copy, so that it can be recorded in a device graph).
    fn zeros(&self, device: Device, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
        self.upload(device, &vec![0.0; len])
    }
    /// A new buffer with `src`'s elements, copied on the device.
    fn duplicate(&self, src: &dyn DeviceBuffer) -> Result<Arc<dyn DeviceBuffer>> {
        self.upload(src.device(), &src.read()?)
    }
    /// Copies `src`'s elements into `dst` (same device, same length), ordered after the work
    /// launched before. For a device graph's static buffers, which the caller owns alone.
    fn copy_into(&self, dst: &dyn DeviceBuffer, _src: &dyn DeviceBuffer) -> Result<()> {
        Err(no_graphs(dst.device()))
    }
    /// Copies each `(dst, src)` pair as [`Self::copy_into`] does, all ordered after the work
    /// launched before; a module may do them in one launch (a compiled step's inputs and
    /// parameters copied into its device graph's static buffers before each replay).
    fn copy_many(&self, pairs: &[(&dyn DeviceBuffer, &dyn DeviceBuffer)]) -> Result<()> {
        for (dst, src) in pairs {
            self.copy_into(*dst, *src)?;
        }
        Ok(())
    }
    /// Records the device work that `work` launches into a graph that [`DeviceGraph::replay`]
    /// runs again with the same buffers (CUDA Graphs), or says why it cannot. The work itself
    /// does not run while it is recorded.
    fn capture(
        &self,
        device: Device,
        _work: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Box<dyn DeviceGraph>> {
        Err(no_graphs(device))
    }
    /// Starts timing the device work launched on `device` from now on (an event in its
    /// stream), without waiting for anything; `None` when the device keeps no such marks
    /// (the host: its kernels finish before they return). For opt-in profiling only.
    fn start_span(&self, _device: Device) -> Result<Option<Box<dyn DeviceSpan>>> {
        Ok(None)
    }
}

/// The device time of the work launched between [`ProviderModule::start_span`] and
/// [`DeviceSpan::end`], read later so that timing does not serialize host and device.
pub trait DeviceSpan: Send {
    /// Marks the end of the span (after the work to be timed was launched).
    fn end(&mut self) -> Result<()>;
    /// The device time between the two marks, waiting for the end mark if it is pending.
    fn elapsed(&self) -> Result<std::time::Duration>;
}

/// Device work recorded once and replayed (a CUDA Graph): every replay runs the same kernels
/// on the same buffers, in the order they were recorded.
pub trait DeviceGraph: Send {
    /// Launches the recorded work again (asynchronously, ordered after earlier work).
    fn replay(&mut self) -> Result<()>;
    /// Finishes what the previous replay left pending that reads the graph's memory — its
    /// inputs included (e.g. the deferred check of an index it read) — so that the caller may
    /// overwrite the inputs for the next replay. Called before the inputs are rewritten.
    fn settle(&mut self) -> Result<()>;
    /// What was recorded, for the report (e.g. `412 nodes`).
    fn describe(&self) -> String;
}

fn no_graphs(device: Device) -> Error {
    Error::DeviceUnavailable {
        device: device.label().into(),
        reason: "this device's module cannot record device graphs".into(),
    }
}

/// The always-linked CPU module: the reference, native CPU and composition providers.
pub struct CpuModule;

impl ProviderModule for CpuModule {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn devices(&self) -> Vec<Device> {
        vec![Device::Cpu]
    }
    fn declares(&self) -> Vec<(Provider, Device)> {
        vec![
            (Provider::Reference, Device::Cpu),
            (Provider::NativeCpu, Device::Cpu),
            (Provider::Torchlean, Device::Cpu),
        ]
    }
    fn target_features(&self) -> Vec<String> {
        vec!["cpu".into()]
    }
    fn register(&self, registry: &mut Registry) -> std::result::Result<(), RegistryError> {
        crate::providers::register_cpu(registry)
    }
    fn probe(&self, device: Device) -> Result<ProbeReport> {
        crate::runtime::probe::probe_cpu(device)
    }
    fn upload(&self, device: Device, _data: &[f32]) -> Result<Arc<dyn DeviceBuffer>> {
        Err(Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "the CPU module keeps host memory only".into(),
        })
    }
}

static PENDING: Mutex<Vec<Arc<dyn ProviderModule>>> = Mutex::new(Vec::new());
static LINKED: OnceLock<Vec<Arc<dyn ProviderModule>>> = OnceLock::new();

/// Links `module` into this process (at startup, before the first session or registry use).
/// Linking a module of the same name twice is a no-op (also after the set was frozen).
pub fn link(module: Arc<dyn ProviderModule>) -> Result<()> {
    if let Some(linked) = LINKED.get() {
        if linked.iter().any(|m| m.name() == module.name()) {
            return Ok(());
        }
        return Err(Error::ModulesFrozen {
            module: module.name(),
        });
    }
    // a poisoned lock only means another thread panicked while pushing
    let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if pending.iter().any(|m| m.name() == module.name()) {
        return Ok(());
    }
    // validated now, with every module linked so far (invalid claims, duplicate capsule
    // names across modules), so that building the process's registry later cannot fail
    let mut r = Registry::new();
    CpuModule
        .register(&mut r)
        .map_err(|e| link_refused(&*module, e))?;
    for m in pending.iter().chain([&module]) {
        m.register(&mut r).map_err(|e| link_refused(&*module, e))?;
    }
    pending.push(module);
    Ok(())
}

fn link_refused(module: &dyn ProviderModule, e: RegistryError) -> Error {
    Error::Other(format!(
        "provider module `{}` cannot be linked: its capsules are refused by the registry: {e}",
        module.name()
    ))
}

/// The linked modules (the CPU module first); freezes the set.
pub fn linked() -> &'static [Arc<dyn ProviderModule>] {
    LINKED.get_or_init(|| {
        let mut all: Vec<Arc<dyn ProviderModule>> = vec![Arc::new(CpuModule)];
        let pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        all.extend(pending.iter().cloned());
        all
    })
}

/// The module that owns `device`, if one is linked.
pub fn owner(device: Device) -> Option<&'static Arc<dyn ProviderModule>> {
    linked().iter().find(|m| m.devices().contains(&device))
}

/// The target of this build: the host's OS and architecture, with the features of every
/// linked module.
pub fn target() -> Target {
    let mut t = Target::host();
    t.features = linked()
        .iter()
        .flat_map(|m| m.target_features())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    t
}

/// What the linked modules declare for planning.
pub fn availability() -> Availability {
    let providers: BTreeSet<(Provider, Device)> =
        linked().iter().flat_map(|m| m.declares()).collect();
    let devices = providers.iter().map(|&(_, d)| d).collect();
    Availability { devices, providers }
}

/// The registry of every linked module's capsules, in link order.
pub fn build_registry() -> std::result::Result<Registry, RegistryError> {
    let mut r = Registry::new();
    for m in linked() {
        m.register(&mut r)?;
    }
    Ok(r)
}

/// Probes `device` through the module that owns it (an error naming the device when no
/// linked module does).
pub fn probe(device: Device) -> Result<ProbeReport> {
    match owner(device) {
        Some(m) => m.probe(device),
        None => Err(Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "no provider module for this device is linked into this build".into(),
        }),
    }
}

/// The provider a preference names (`prefer:P`, `only:P`), if any.
fn named_provider(preference: ProviderPreference) -> Option<Provider> {
    match preference {
        ProviderPreference::Prefer(p) | ProviderPreference::Only(p) => Some(p),
        ProviderPreference::Auto => None,
    }
}

/// Refuses a provider preference (`prefer:P`, `only:P`) naming a provider that no linked
/// module declares on `device` — a property of the build, not of the machine, so `plan`
/// (static) refuses it as a run does (`plan --provider prefer:cublas` on the CPU was
/// accepted; the run refused it).
pub fn check_declared(device: Device, preference: ProviderPreference) -> Result<()> {
    let wanted = named_provider(preference);
    if let Some(p) = wanted {
        if !linked().iter().any(|m| m.declares().contains(&(p, device))) {
            return Err(Error::ProviderUnavailable {
                provider: p.label().into(),
                device: device.label().into(),
                reason: format!(
                    "the profile asks for it ({}), but no provider module linked into this build declares it there{}",
                    preference.label(),
                    provider_hint(p)
                ),
            });
        }
    }
    Ok(())
}

/// Probes `device` for a profile whose provider preference is `preference`, before its first
/// kernel: a provider the profile names (`prefer:P`, `only:P`) must be declared on `device` by
/// a linked module — never a silent run without it —, then the device's owner is probed
/// ([`probe`]), then every other linked module that declares a provider on `device` (the
/// LibTorch bridge on `cuda`): its detail (versions) is added to the report's, and its
/// failure refuses the run when the profile names one of its providers (otherwise it is
/// noted in the detail).
pub fn probe_for(device: Device, preference: ProviderPreference) -> Result<ProbeReport> {
    check_declared(device, preference)?;
    let wanted = named_provider(preference);
    let mut report = probe(device)?;
    for m in linked() {
        if m.devices().contains(&device) {
            continue;
        }
        let here: Vec<Provider> = m
            .declares()
            .into_iter()
            .filter(|&(_, d)| d == device)
            .map(|(p, _)| p)
            .collect();
        if here.is_empty() {
            continue;
        }
        match m.probe(device) {
            Ok(r) => {
                report.detail.push_str("; ");
                report.detail.push_str(&r.detail);
            }
            Err(e) => match wanted.filter(|p| here.contains(p)) {
                Some(p) => {
                    return Err(Error::ProviderUnavailable {
                        provider: p.label().into(),
                        device: device.label().into(),
                        reason: format!("the probe of module `{}` failed: {e}", m.name()),
                    })
                }
                None => report
                    .detail
                    .push_str(&format!("; module `{}` not usable here: {e}", m.name())),
            },
        }
    }
    Ok(report)
}

/// Why a provider is not available on the asked device: the devices a linked module does
/// declare it on (a device mismatch, e.g. cublas asked for on the cpu), else where its
/// module comes from.
fn provider_hint(p: Provider) -> String {
    let elsewhere: Vec<String> = linked()
        .iter()
        .flat_map(|m| {
            m.declares()
                .into_iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, d)| format!("`{}` (module `{}`)", d.label(), m.name()))
                .collect::<Vec<_>>()
        })
        .collect();
    if elsewhere.is_empty() {
        missing_module_hint(p).to_string()
    } else {
        format!(
            " (it is a provider of device {}: choose that device with --device)",
            elsewhere.join(", ")
        )
    }
}

/// Where the module of a provider that is not linked comes from.
fn missing_module_hint(p: Provider) -> &'static str {
    match p {
        Provider::Libtorch => " (the LibTorch bridge, crate torchlean-libtorch, is not linked into this build; the `torchlean` command links it when built with `--features libtorch`: docs/libtorch.md)",
        Provider::NativeCuda | Provider::Cublas | Provider::Cufft => {
            " (the CUDA module, crate torchlean-cuda, is not linked into this build)"
        }
        _ => "",
    }
}

/// Copies host values to `device` through its module (whose `upload` probes the device).
pub fn upload(device: Device, data: &[f32]) -> Result<Arc<dyn DeviceBuffer>> {
    owner_of(device)?.upload(device, data)
}

/// Waits for the work launched on `device` (see [`ProviderModule::synchronize`]).
pub fn synchronize(device: Device) -> Result<()> {
    match owner(device) {
        Some(m) => m.synchronize(device),
        None => Ok(()),
    }
}

fn owner_of(device: Device) -> Result<&'static Arc<dyn ProviderModule>> {
    owner(device).ok_or_else(|| Error::DeviceUnavailable {
        device: device.label().into(),
        reason: "no provider module for this device is linked into this build".into(),
    })
}

/// Copies each `(dst, src)` pair on their device (see [`ProviderModule::copy_many`]); every
/// buffer is on the first destination's device.
pub fn copy_many(pairs: &[(&dyn DeviceBuffer, &dyn DeviceBuffer)]) -> Result<()> {
    let Some((first, _)) = pairs.first() else {
        return Ok(());
    };
    let device = first.device();
    if let Some((d, s)) = pairs
        .iter()
        .find(|(d, s)| d.device() != device || s.device() != device)
    {
        return Err(Error::Other(format!(
            "copy_many: a copy from `{}` to `{}` among copies on `{device}`",
            s.device(),
            d.device()
        )));
    }
    owner_of(device)?.copy_many(pairs)
}

/// A span timing the device work launched on `device` from now (see
/// [`ProviderModule::start_span`]); `None` for devices without marks.
pub fn start_span(device: Device) -> Result<Option<Box<dyn DeviceSpan>>> {
    match owner(device) {
        Some(m) => m.start_span(device),
        None => Ok(None),
    }
}

/// A zero-filled buffer of `len` elements written on `device` (see [`ProviderModule::zeros`]).
pub fn zeros(device: Device, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
    owner_of(device)?.zeros(device, len)
}

/// A device-side copy of `src` (see [`ProviderModule::duplicate`]).
pub fn duplicate(src: &dyn DeviceBuffer) -> Result<Arc<dyn DeviceBuffer>> {
    owner_of(src.device())?.duplicate(src)
}

/// Copies `src` into `dst` on their device (see [`ProviderModule::copy_into`]).
pub fn copy_into(dst: &dyn DeviceBuffer, src: &dyn DeviceBuffer) -> Result<()> {
    if dst.device() != src.device() || dst.len() != src.len() {
        return Err(Error::Other(format!(
            "copy_into: a {} buffer of {} elements cannot take a {} buffer of {} elements",
            dst.device(),
            dst.len(),
            src.device(),
            src.len()
        )));
    }
    owner_of(dst.device())?.copy_into(dst, src)
}

/// Records `work` on `device` as a replayable graph (see [`ProviderModule::capture`]).
pub fn capture(
    device: Device,
    work: &mut dyn FnMut() -> Result<()>,
) -> Result<Box<dyn DeviceGraph>> {
    owner_of(device)?.capture(device, work)
}

/// Memory statistics of `device`, if its module keeps any.
pub fn memory_stats(device: Device) -> Option<serde_json::Value> {
    owner(device).and_then(|m| m.memory_stats(device))
}
