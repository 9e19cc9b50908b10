//! The layers of DESIGN §2 depend only downward (issue 10, part 1 item 10). These checks read
//! the crate's sources: a `use` or path that reaches a layer above fails here, naming the
//! file and line.
//!
//! - The trust layer (`backend`) is data and pure functions: it names neither the providers
//!   nor the runtime, nor `nn`.
//! - The core below `nn` (`spec`, `graph`, `backend`, `providers`, `runtime`, `tensor`, and the
//!   core `Error` in `error.rs`) never names `nn`: `nn` has its own error type, which wraps
//!   the core's, not the other way round.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every line of the files under `part` (a folder or one file of `src/`) that contains one
/// of `forbidden`, outside comments.
fn reaches(part: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(part);
    let mut files = Vec::new();
    if root.is_dir() {
        sources(&root, &mut files);
    } else {
        files.push(root);
    }
    assert!(!files.is_empty(), "no sources under src/{part}");
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for bad in forbidden {
                if code.contains(bad) {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_trust_layer_names_neither_providers_nor_runtime() {
    let found = reaches(
        "backend",
        &["crate::providers", "crate::runtime", "crate::nn"],
    );
    assert!(
        found.is_empty(),
        "backend reaches upward:\n{}",
        found.join("\n")
    );
}

#[test]
fn nothing_below_nn_names_nn() {
    for part in [
        "spec",
        "graph",
        "backend",
        "providers",
        "runtime",
        "tensor",
        "error.rs",
    ] {
        let found = reaches(part, &["crate::nn", "super::nn"]);
        assert!(
            found.is_empty(),
            "src/{part} reaches nn:\n{}",
            found.join("\n")
        );
    }
}

/// The core error has no variant of the `nn` layer: training and checkpoint failures are
/// `nn::Error`, which holds a core error as one of its cases.
#[test]
fn training_errors_wrap_core_errors_not_the_reverse() {
    let e = torchlean::nn::Error::from(torchlean::Error::Other("x".into()));
    assert!(matches!(e, torchlean::nn::Error::Core(_)));
    let t = torchlean::nn::Error::from(torchlean::nn::TrainError::Config("y".into()));
    assert_eq!(t.to_string(), "training configuration: y");
}
