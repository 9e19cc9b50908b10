//! `torchlean ops`: the op vocabulary with TorchLean names and providers.

use crate::CliResult;
use torchlean::runtime::session::standard_registry;
use torchlean::OpKind;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON: an array of {"name", "torchlean_names", "providers"}.
    #[arg(long)]
    json: bool,
}

fn providers_of(op: OpKind) -> Vec<String> {
    // each provider once, in registry order (a provider may hold several capsules for an
    // op, e.g. native_cpu's plain and replay-checked ones, not next to each other)
    let mut v: Vec<String> = Vec::new();
    for e in standard_registry().for_op(op) {
        let label = e.capsule.provider.label().to_string();
        if !v.contains(&label) {
            v.push(label);
        }
    }
    v
}

pub fn run(a: Args) -> CliResult {
    if a.json {
        let rows: Vec<serde_json::Value> = OpKind::ALL
            .iter()
            .map(|&k| serde_json::json!({ "name": k.name(), "family": k.family(), "torchlean_names": k.torchlean_names(), "providers": providers_of(k) }))
            .collect();
        outln!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(());
    }
    outln!(
        "{:<30} {:<16} {:<40} providers",
        "op",
        "family",
        "torchlean names"
    );
    for &k in OpKind::ALL {
        outln!(
            "{:<30} {:<16} {:<40} {}",
            k.name(),
            k.family(),
            k.torchlean_names().join(","),
            providers_of(k).join(",")
        );
    }
    let covered: usize = OpKind::ALL.iter().map(|k| k.torchlean_names().len()).sum();
    outln!(
        "\n{} ops; {} TorchLean backend op names covered",
        OpKind::ALL.len(),
        covered
    );
    Ok(())
}
