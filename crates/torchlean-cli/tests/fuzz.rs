//! `torchlean fuzz` (issue 13): a short flags campaign (the binary spawned with mutated
//! command lines must end with exit 0-3, never a panic or a signal), a short file campaign
//! through the subcommand, replaying a saved input, and its own flag checks.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_torchlean");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchlean-cli-fuzz-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every seed command line exits 0 and a few dozen mutated ones end with exit 0-3 (each run
/// spawns a process, so the test suite runs few; the long run is in docs/reliability.md).
#[test]
fn flags_campaign_finds_nothing() {
    let d = scratch("flags");
    let out = Command::new(BIN)
        .args([
            "fuzz",
            "--format",
            "flags",
            "--iterations",
            "24",
            "--seed",
            "11",
            "--timeout",
            "5",
        ])
        .arg("--findings")
        .arg(d.join("findings"))
        .current_dir(&d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("flags: "), "{text}");
    assert!(!text.contains("FINDING"), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn file_campaign_and_replay() {
    let d = scratch("files");
    let out = Command::new(BIN)
        .args([
            "fuzz",
            "--format",
            "npy",
            "--iterations",
            "500",
            "--seed",
            "3",
        ])
        .current_dir(&d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("npy: 510 inputs"), "{text}"); // 500 and 10 seeds
    assert!(text.contains("panic 0, slow 0, invariant 0"), "{text}");
    // a saved input replays: a truncated file is refused with its message
    std::fs::write(d.join("bad.npy"), b"\x93NUMPY\x01\x00\xff").unwrap();
    let out = Command::new(BIN)
        .args(["fuzz", "--format", "npy", "--replay", "bad.npy"])
        .current_dir(&d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("refused"), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn fuzz_flags_are_checked() {
    for args in [
        &["fuzz", "--format", "nope"][..],
        &["fuzz", "--format", "csv", "--time-bound", "nan"],
        &["fuzz", "--format", "csv", "--timeout", "0"],
        &["fuzz", "--format", "files", "--replay", "x"],
        &["fuzz", "--format", "flags", "--replay", "x"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A replay runs one saved input: a campaign flag beside it would be ignored, so it is refused
/// (exit 2) — on a file that replays (exit 0 alone).
#[test]
fn campaign_flags_beside_a_replay_are_refused() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let alone = Command::new(BIN)
        .args(["fuzz", "--format", "npy", "--replay", file])
        .output()
        .unwrap();
    assert_eq!(alone.status.code(), Some(0));
    for extra in [
        &["--iterations", "5"][..],
        &["--seed", "7"],
        &["--findings", "f"],
        &["--progress", "1"],
        &["--time-bound", "2"],
    ] {
        let out = Command::new(BIN)
            .args(["fuzz", "--format", "npy", "--replay", file])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains("cannot be used with"), "{extra:?}: {err}");
    }
}
