//! The `TORCHLEAN_*` switches the library and the CUDA module read from the environment,
//! checked once before a command runs: a value no switch understands (`TORCHLEAN_NO_AVX512=yes`,
//! `TORCHLEAN_OP_TIMES=false`) is refused naming the variable and its values, instead of
//! being read as "unset" (or, for some, as "on") without a word. An empty value is unset.
//! Paths (`TORCHLEAN_CACHE_DIR`) and the test harness's variables are not switches.

use crate::CliError;

/// Each switch, the values it takes and what they mean.
const SWITCHES: &[(&str, &[&str], &str)] = &[
    (
        "TORCHLEAN_NO_AVX512",
        &["0", "1"],
        "1: the hot loops on the as-built 256-bit path",
    ),
    (
        "TORCHLEAN_OP_TIMES",
        &["0", "1", "device"],
        "1: time per capsule (synchronized); device: device-side marks",
    ),
    (
        "TORCHLEAN_HOT_WORKERS",
        &["0", "1"],
        "0: no spinning compute workers",
    ),
    (
        "TORCHLEAN_COMPUTE_THREADS",
        &["0", "1"],
        "0: the command on the main thread, not a compute-pool thread",
    ),
    (
        "TORCHLEAN_DEVICE_GRAPH",
        &["0", "1"],
        "0: no CUDA Graph replay of compiled steps",
    ),
    (
        "TORCHLEAN_FLASH_MMA",
        &["0", "1"],
        "1: split-TF32 flash kernels forward and VJP; 0: neither",
    ),
    (
        "TORCHLEAN_CUBLASLT",
        &["0", "1", "forward"],
        "0: classic cuBLAS products; forward: cuBLASLt for the forward only",
    ),
    (
        "TORCHLEAN_FLASH_SPLIT",
        &["0", "1"],
        "0: no split of the key kernel's last wave",
    ),
    (
        "TORCHLEAN_LAUNCH_QUEUE",
        &["0", "1"],
        "0: one launch per small map",
    ),
    (
        "TORCHLEAN_FLASH_DQ_ORDERED",
        &["0", "1"],
        "0: the deterministic flash VJP's dQ in slots or by the query kernel instead of added in a fixed order of key tiles",
    ),
    (
        "TORCHLEAN_FLASH_DQ_SLOTS",
        &["0", "1"],
        "0: the deterministic flash VJP's dQ by the query kernel where it is not added in order (with TORCHLEAN_FLASH_DQ_ORDERED=0: everywhere)",
    ),
];

/// Refuses a switch set to a value it does not take (exit 2).
pub fn check() -> Result<(), CliError> {
    for (name, values, meaning) in SWITCHES {
        let Some(v) = std::env::var_os(name) else {
            continue;
        };
        let v = v.to_string_lossy();
        if !v.is_empty() && !values.contains(&v.as_ref()) {
            return Err(CliError::usage(format!(
                "environment variable {name}={v:?} is not one of its values {values:?} ({meaning}; \
                 unset or empty: the default)"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Every `"TORCHLEAN_…"` name in the workspace's library sources is a listed switch or a
    /// known non-switch (a path, a variable the command removes for its children), so a new
    /// switch cannot be read without being checked here.
    #[test]
    fn every_switch_the_sources_name_is_listed() {
        const NOT_SWITCHES: &[&str] = &["TORCHLEAN_CACHE_DIR", "TORCHLEAN_PROFILE"];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut stack = vec![
            root.join("torchlean/src"),
            root.join("torchlean-cuda/src"),
            root.join("torchlean-onnx/src"),
            root.join("torchlean-cli/src"),
        ];
        let mut seen = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("a source folder") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path.ends_with("environment.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("a source file");
                for (at, _) in text.match_indices("\"TORCHLEAN_") {
                    let name: String = text[at + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    seen += 1;
                    assert!(
                        NOT_SWITCHES.contains(&name.as_str())
                            || super::SWITCHES.iter().any(|(n, ..)| *n == name),
                        "{name} (in {}) is not in environment.rs's SWITCHES",
                        path.display()
                    );
                }
            }
        }
        assert!(seen >= 10, "only {seen} names found: the scan is broken");
    }
}
