//! A short run of the fuzzer (issue 13) over every untrusted file format: seeds written by
//! the library, structure-aware and byte-level mutations, each input run in-process. Every
//! input must end in success or a typed error within the time bound, never a panic, a hang
//! or an accepted input that breaks its format's invariants. The long run (a million
//! inputs per format) is `torchlean fuzz`; its results are in docs/reliability.md.
//!
//! This file is its own test binary: the campaign installs a process-wide panic hook.

use std::time::Duration;
use torchlean::fuzz::{input_of, run_campaign, Campaign, Format, Outcome};

/// Inputs per format in the test suite (the seeds run in addition).
const SHORT_RUN: u64 = 300;

fn short_run(format: Format) {
    let mut c = Campaign::new(format, SHORT_RUN, 0x7e57);
    // generous: the test binary shares the machine with other tests
    c.time_bound = Duration::from_secs(5);
    let report = run_campaign(&c, |_| {}).unwrap();
    eprintln!("{}", report.to_text());
    assert_eq!(report.finding_count(), 0, "{}", report.to_text());
    assert_eq!(
        report.inputs,
        SHORT_RUN + format.seeds().unwrap().len() as u64
    );
    // the mutations reach past the parser: some inputs are accepted, most are refused
    assert!(
        report.count(Outcome::Refused) > SHORT_RUN / 4,
        "{}",
        report.to_text()
    );
    assert!(
        report.count(Outcome::Accepted) + report.count(Outcome::AcceptedNotRun)
            > format.seeds().unwrap().len() as u64,
        "no mutated input was accepted: {}",
        report.to_text()
    );
}

#[test]
fn fuzz_graph_json() {
    short_run(Format::Graph);
}

#[test]
fn fuzz_safetensors() {
    short_run(Format::Safetensors);
}

#[test]
fn fuzz_checkpoints() {
    short_run(Format::Checkpoint);
}

#[test]
fn fuzz_npy() {
    short_run(Format::Npy);
}

#[test]
fn fuzz_idx() {
    short_run(Format::Idx);
}

#[test]
fn fuzz_csv() {
    short_run(Format::Csv);
}

/// Seeds are valid files of their format, and inputs are a pure function of
/// (format, seed, iteration).
#[test]
fn seeds_are_accepted_and_inputs_reproducible() {
    for &f in Format::ALL {
        let seeds = f.seeds().unwrap();
        assert!(seeds.len() >= 4, "{}: {} seeds", f.name(), seeds.len());
        if f == Format::Graph {
            // a seed graph per op kind (a kind that compiles and runs nowhere would drop out)
            let ops = torchlean::OpKind::ALL.len();
            assert!(
                seeds.len() >= ops + 3,
                "{} graph seeds for {ops} ops",
                seeds.len()
            );
        }
        assert_eq!(
            seeds,
            f.seeds().unwrap(),
            "{}: seeds are deterministic",
            f.name()
        );
        for i in [0, 1, 999_999] {
            assert_eq!(input_of(&f, 5, i).unwrap(), input_of(&f, 5, i).unwrap());
        }
        let distinct: std::collections::HashSet<Vec<u8>> =
            (0..50).map(|i| input_of(&f, 5, i).unwrap()).collect();
        assert!(distinct.len() > 40, "{}: mutations repeat", f.name());
    }
}
