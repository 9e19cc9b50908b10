//! `torchlean capsules`: the registry, filtered.

use crate::{CliError, CliResult};
use torchlean::backend::{Device, Provider};
use torchlean::runtime::session::standard_registry;
use torchlean::OpKind;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON: every capsule with all fields and its four descriptors.
    #[arg(long)]
    json: bool,
    /// Only the capsules of this device (cpu, cuda, ...).
    #[arg(long)]
    device: Option<String>,
    /// Only the capsules of this provider (reference, native_cpu, native_cuda, cublas, ...).
    #[arg(long)]
    provider: Option<String>,
    /// Only the capsules of this op (`torchlean ops` lists the names).
    #[arg(long)]
    op: Option<String>,
}

pub fn run(a: Args) -> CliResult {
    let device = a
        .device
        .as_deref()
        .map(|d| Device::parse(d).ok_or_else(|| CliError::usage(format!("unknown device `{d}`"))))
        .transpose()?;
    let provider = a
        .provider
        .as_deref()
        .map(|p| {
            Provider::from_label(p)
                .ok_or_else(|| CliError::usage(format!("unknown provider `{p}`")))
        })
        .transpose()?;
    let op = a
        .op
        .as_deref()
        .map(|o| {
            OpKind::from_any_name(o)
                .ok_or_else(|| CliError::usage(format!("unknown op `{o}` (see `torchlean ops`)")))
        })
        .transpose()?;
    let caps: Vec<_> = standard_registry()
        .entries()
        .iter()
        .map(|e| &e.capsule)
        .filter(|c| {
            device.is_none_or(|d| c.device == d)
                && provider.is_none_or(|p| c.provider == p)
                && op.is_none_or(|o| c.op == o)
        })
        .collect();
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&caps).map_err(|e| CliError::runtime(e.to_string()))?
        );
        return Ok(());
    }
    for c in &caps {
        outln!(
            "{}: op={} provider={} device={} trust={} vjp={} runtime={}",
            c.name,
            c.op.name(),
            c.provider,
            c.device,
            c.trust_level,
            c.vjp_mode,
            c.runtime_support
        );
        for o in torchlean::backend::Obligation::ALL {
            let d = c.contract(o);
            outln!(
                "  {}: {}; {}",
                o.label(),
                d.claim.render(),
                d.evidence.render()
            );
        }
    }
    outln!("{} capsule(s)", caps.len());
    Ok(())
}
