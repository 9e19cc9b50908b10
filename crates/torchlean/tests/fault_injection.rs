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

/// Calls checked by tiles (`runtime/tiled.rs`: pointwise maps of at least 32768 elements,
/// which the campaign's small models never reach) catch injected faults too: the tiles'
/// kernels run, the fault is injected into the assembled result, the tiles are checked.
/// Every value here lies in [0.5, 1), so each fault class used moves some element by far
/// more than the declared bound.
#[test]
fn calls_checked_by_tiles_catch_injected_faults() {
    use torchlean::backend::{BackendProfile, Phase};
    use torchlean::graph::{Op, OpKind};
    use torchlean::runtime::fault::{self, Effect, FaultClass, Target};
    use torchlean::runtime::{self, Session};
    use torchlean::{Error, Tensor};
    let before = runtime::install(Session::new(
        BackendProfile::named("strict_native_cpu").unwrap(),
    ))
    .unwrap();
    let n = 50_000;
    let ramp = |k: usize| {
        let v = (0..n)
            .map(|i| 0.5 + ((i * k) % 500) as f32 / 1000.0)
            .collect();
        Tensor::from_vec(v, &[n]).unwrap()
    };
    let classes = [
        FaultClass::SignBit,
        FaultClass::ExponentBit,
        FaultClass::OneNan,
        FaultClass::Scaled,
        FaultClass::RowsShifted,
    ];
    let ema = Op::ema_update(0.9, false);
    for (k, &class) in classes.iter().enumerate() {
        for kind in [OpKind::Relu, OpKind::EmaUpdate] {
            fault::arm(Target {
                op: kind,
                phase: Phase::Forward,
                occurrence: 0,
                class,
                seed: k as u64,
            });
            let result = match kind {
                OpKind::Relu => ramp(7).relu().map(drop),
                _ => runtime::apply_update(ema.clone(), &mut ramp(3), &[&ramp(11)]),
            };
            match fault::disarm() {
                Some(Effect::Injected(_)) => match result {
                    Err(e @ Error::CheckerRejected { .. }) => {
                        let msg = e.to_string();
                        assert!(msg.contains("checked by tiles"), "{msg}");
                    }
                    other => panic!("{} on {kind:?} escaped: {other:?}", class.name()),
                },
                other => panic!("{} on {kind:?} was not injected: {other:?}", class.name()),
            }
        }
    }
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
}
