//! Linking a provider module validates its capsules against every module linked before it,
//! so a bad module is refused at `link` (a typed error) and the process's registry is never
//! built from capsules the registry would refuse.

use std::sync::Arc;
use torchlean::backend::{Device, Provider, Registry, RegistryError};
use torchlean::module::{self, ProviderModule};
use torchlean::runtime::probe::ProbeReport;
use torchlean::tensor::DeviceBuffer;
use torchlean::{Error, OpKind};

/// A module that registers a capsule the CPU module already has (a duplicate name).
struct Duplicate;

impl ProviderModule for Duplicate {
    fn name(&self) -> &'static str {
        "duplicate"
    }
    fn devices(&self) -> Vec<Device> {
        vec![]
    }
    fn declares(&self) -> Vec<(Provider, Device)> {
        vec![]
    }
    fn target_features(&self) -> Vec<String> {
        vec![]
    }
    fn register(&self, r: &mut Registry) -> Result<(), RegistryError> {
        r.register(
            torchlean::providers::native_cpu::capsule(OpKind::Add),
            torchlean::providers::native_cpu::binding(),
        )
    }
    fn probe(&self, device: Device) -> torchlean::Result<ProbeReport> {
        Err(Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "test module".into(),
        })
    }
    fn upload(&self, device: Device, _: &[f32]) -> torchlean::Result<Arc<dyn DeviceBuffer>> {
        Err(Error::DeviceUnavailable {
            device: device.label().into(),
            reason: "test module".into(),
        })
    }
}

#[test]
fn a_module_with_refused_capsules_is_refused_at_link() {
    match module::link(Arc::new(Duplicate)) {
        Err(Error::Other(m)) => {
            assert!(
                m.contains("duplicate") && m.contains("already registered"),
                "{m}"
            )
        }
        other => panic!("expected the link to be refused, got {other:?}"),
    }
    // the process's registry is built from the modules that were accepted
    assert!(module::linked().iter().all(|m| m.name() != "duplicate"));
    assert!(torchlean::runtime::session::standard_registry()
        .get("native_cpu.add")
        .is_some());
}
