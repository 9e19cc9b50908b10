//! A short fuzz campaign over ONNX files: every mutated model ends in success or a typed
//! error, never a panic, a hang or a broken invariant (accepted models export and re-import).

use torchlean::fuzz::{run_campaign, Campaign, Outcome};
use torchlean_onnx::fuzz::OnnxTarget;

#[test]
fn onnx_fuzz_campaign_has_no_findings() {
    let mut c = Campaign::new(OnnxTarget, 400, 0x0ecc);
    c.time_bound = std::time::Duration::from_secs(5);
    let report = run_campaign(&c, |_| {}).unwrap();
    assert_eq!(report.finding_count(), 0, "{}", report.to_text());
    // the campaign reaches past the decoder: some mutants import and run
    assert!(report.count(Outcome::Accepted) > 20, "{}", report.to_text());
    assert!(report.count(Outcome::Refused) > 20, "{}", report.to_text());
}
