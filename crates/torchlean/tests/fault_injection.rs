//! The fault-injection campaign in small (needs `--features fault-injection`; the default
//! build has no injection hook and skips this file): every fault above its checker's
//! declared bound is rejected under `strict_native_cpu`. The full campaign is
//! `examples/fault_injection.rs` (docs/assurance.md).

#[path = "../examples/fault_injection.rs"]
mod campaign;

#[test]
fn strict_native_cpu_catches_every_fault_above_the_declared_bound() {
    let records = campaign::campaign(400, 7, |_| {});
    let table = campaign::tabulate(&records);
    println!("{}", campaign::markdown(&table));
    let above: Vec<_> = records.iter().filter(|r| r.measure.above).collect();
    assert!(above.len() > 200, "most faults are above the bound");
    for r in &above {
        assert_eq!(
            r.strict,
            campaign::Outcome::Checker,
            "{:?} {} on {}: {} escaped",
            r.model,
            r.target.class.name(),
            r.target.op.name(),
            r.detail
        );
    }
    // a below-bound fault is never an error of the recompute checker (it is deterministic;
    // a product check may reject inside the band between its two guarantees)
    for r in records.iter().filter(|r| !r.measure.above) {
        if !campaign::product_checked(r.target.op) {
            assert_ne!(r.strict, campaign::Outcome::Checker, "{r:?}");
        }
    }
    let differ: Vec<String> = records
        .iter()
        .filter(|r| !r.same_fault)
        .map(|r| {
            format!(
                "{:?} {} on {}",
                r.model,
                r.target.class.name(),
                r.target.op.name()
            )
        })
        .collect();
    assert!(differ.is_empty(), "{differ:?}");
}
