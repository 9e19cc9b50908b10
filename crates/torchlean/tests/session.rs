//! Sessions: no op runs under a policy the program did not choose. This binary never sets a
//! process default, so a thread without a session really has none (see `session_default.rs`
//! for the process default).

use std::sync::mpsc;
use torchlean::backend::BackendProfile;
use torchlean::nn::{Activation, Mlp, Module};
use torchlean::runtime::{self, Session};
use torchlean::{Error, OpKind, Tensor};

fn strict() -> Session {
    Session::new(BackendProfile::named("strict_cpu").unwrap())
}

/// Runs `f` on a fresh thread of the caller's choosing (not started by the library).
fn on_plain_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new()
        .name("user-thread".into())
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// A thread the user starts, under a strict run, used to get a `checked_cpu` session
/// silently; now it has none, and the op says how to give it one.
#[test]
fn an_op_on_a_thread_without_a_session_is_an_error_naming_the_fix() {
    runtime::install(strict()).unwrap();
    assert_eq!(Tensor::ones(&[2]).unwrap().sin().unwrap().to_vec().len(), 2);
    let r = on_plain_thread(|| Tensor::ones(&[2]).unwrap().sin().map(|t| t.to_vec()));
    let e = r.unwrap_err();
    assert!(
        matches!(&e, Error::NoSession { thread } if thread.contains("user-thread")),
        "{e:?}"
    );
    let msg = e.to_string();
    for fix in [
        "runtime::install",
        "runtime::spawn",
        "runtime::set_process_default",
    ] {
        assert!(msg.contains(fix), "{msg}");
    }
    // nor does asking for the session's report create one
    let r = on_plain_thread(|| runtime::with_current(|s| s.profile().name.clone()));
    assert!(matches!(r, Err(Error::NoSession { .. })), "{r:?}");
    assert!(on_plain_thread(|| !runtime::has_session()));
}

/// `runtime::spawn` starts a thread under a fork of the caller's session: same profile, and
/// what runs there is in the caller's report.
#[test]
fn a_spawned_thread_inherits_the_callers_session_and_reports_into_it() {
    runtime::install(strict()).unwrap();
    let handle = runtime::spawn(|| {
        let x = Tensor::ones(&[3]).unwrap().requires_grad();
        let y = x.cos().unwrap().sum_all().unwrap();
        (
            runtime::with_current(|s| s.profile().name.clone()).unwrap(),
            y.producer().map(|(_, capsule)| capsule.to_string()),
        )
    })
    .unwrap();
    let (profile, capsule) = handle.join().unwrap();
    assert_eq!(profile, "strict_cpu");
    assert_eq!(capsule.as_deref(), Some("reference.sum_all"));
    let report = runtime::with_current(|s| s.report()).unwrap();
    let ran: Vec<&str> = report.kernels.iter().map(|k| k.capsule.as_str()).collect();
    assert!(ran.contains(&"reference.cos"), "{ran:?}");
    assert!(
        report.session.is_none(),
        "an installed session is not a default"
    );
    // spawning without a session of one's own is the same error as an op
    let r = on_plain_thread(|| runtime::spawn(|| ()).map(|_| ()));
    assert!(matches!(r, Err(Error::NoSession { .. })), "{r:?}");
}

/// `with_current` lends the session to its closure: an op, install or take there is an
/// error (it used to panic with "already borrowed").
#[test]
fn session_use_inside_with_current_is_an_error_not_a_panic() {
    runtime::install(strict()).unwrap();
    let x = Tensor::ones(&[2]).unwrap();
    let inner = runtime::with_current(|_| x.sin()).unwrap();
    assert!(matches!(inner, Err(Error::SessionBusy { .. })), "{inner:?}");
    let inner = runtime::with_current(|_| runtime::install(strict()).map(|_| ())).unwrap();
    assert!(matches!(
        inner,
        Err(Error::SessionBusy {
            attempted: "install"
        })
    ));
    let inner = runtime::with_current(|_| runtime::take().map(|_| ())).unwrap();
    assert!(matches!(
        inner,
        Err(Error::SessionBusy { attempted: "take" })
    ));
    let nested = runtime::with_current(|_| runtime::with_current(|_| ())).unwrap();
    assert!(matches!(nested, Err(Error::SessionBusy { .. })));
    // the session is intact afterwards
    let y = x.requires_grad().sin().unwrap();
    assert_eq!(y.producer().unwrap().1, "reference.sin");
}

/// A shape-only trace records every (op, recording) use without planning or running a
/// kernel: it needs no session at all.
#[test]
fn a_trace_finds_the_ops_without_a_session_or_a_kernel() {
    let (tx, rx) = mpsc::channel();
    on_plain_thread(move || {
        let model = Mlp::new(&[4, 8, 1], Activation::Tanh, 1).unwrap();
        let x = Tensor::ones(&[5, 4]).unwrap();
        let y = Tensor::ones(&[5, 1]).unwrap();
        let uses = runtime::trace(|| {
            let out = model.forward(&x)?;
            assert_eq!(out.shape(), &[5, 1]);
            assert!(out.to_vec().iter().all(|&v| v == 0.0), "placeholders");
            out.mse_loss(&y).map(drop)
        })
        .unwrap();
        tx.send((uses, runtime::has_session())).unwrap();
    });
    let (uses, had_session) = rx.recv().unwrap();
    assert!(!had_session, "tracing created no session");
    assert_eq!(
        uses.uses(),
        &[
            (OpKind::Linear, true),
            (OpKind::Tanh, true),
            (OpKind::MseLoss, true)
        ]
    );
    // an op on untracked values only is not recorded; under no_grad nothing is
    let uses = runtime::trace(|| {
        let a = Tensor::ones(&[2]).unwrap();
        a.exp()?;
        torchlean::no_grad(|| a.requires_grad().sin()).map(drop)
    })
    .unwrap();
    assert_eq!(uses.uses(), &[(OpKind::Exp, false), (OpKind::Sin, false)]);
}

/// Issue 10 part 1 item 7, eager side: the kernels a composite ran for its parts are rows
/// nested under the composite in the session's report of what ran (the eager counterpart of
/// the compiled report's nesting, tests/compiled.rs), forward and VJP, and an op that ran
/// only inside the composite has no top-level row.
#[test]
fn an_eager_report_nests_a_composites_parts_under_it() {
    let profile =
        BackendProfile::resolve(None, Some("cpu"), Some("prefer:torchlean"), None).unwrap();
    let prev = runtime::install(Session::new(profile)).unwrap();
    let q = Tensor::randn(&[2, 4, 3], 1).unwrap().requires_grad();
    let k = Tensor::randn(&[2, 4, 3], 2).unwrap();
    let v = Tensor::randn(&[2, 4, 3], 3).unwrap();
    let y = q
        .scaled_dot_product_attention(&k, &v, None, true, None)
        .unwrap();
    y.tanh().unwrap().sum_all().unwrap().backward().unwrap();
    let report = runtime::take().unwrap().unwrap().report();
    if let Some(p) = prev {
        runtime::install(p).unwrap();
    }
    let composite = "torchlean.composed_attention";
    let at = report
        .kernels
        .iter()
        .position(|r| r.capsule == composite && r.part_of.is_none())
        .unwrap_or_else(|| panic!("no composite row:\n{}", report.to_text()));
    // its parts follow it, each marked as part of it
    let parts: Vec<&str> = report.kernels[at + 1..]
        .iter()
        .take_while(|r| r.part_of.as_deref() == Some(composite))
        .map(|r| r.op.name())
        .collect();
    assert!(
        parts.contains(&"matmul") && parts.contains(&"softmax"),
        "{parts:?}\n{}",
        report.to_text()
    );
    assert!(
        !report
            .kernels
            .iter()
            .any(|r| r.op == OpKind::Matmul && r.part_of.is_none()),
        "matmul ran only inside the composite:\n{}",
        report.to_text()
    );
    assert!(report
        .to_text()
        .contains(&format!("    (part of {composite}) matmul:")));
}

/// A profile that asks for a provider no linked module declares on its device (here the
/// LibTorch bridge, never linked into this test binary) stops before any kernel, naming what
/// is missing — `prefer:` falls through to other providers only when the preferred one
/// exists but has no capsule for an op, never when it is absent from the build.
#[test]
fn a_profile_asking_for_an_unlinked_provider_stops_before_any_kernel() {
    for pref in ["prefer:libtorch", "only:libtorch"] {
        let profile =
            BackendProfile::resolve(None, Some("cpu"), Some(pref), Some("allow-trusted-runtime"))
                .unwrap();
        let prev = runtime::install(Session::new(profile)).unwrap();
        let r = Tensor::ones(&[2]).unwrap().sin();
        let report = runtime::take().unwrap().unwrap().report();
        if let Some(p) = prev {
            runtime::install(p).unwrap();
        }
        let e = r.unwrap_err();
        let msg = e.to_string();
        if pref.starts_with("prefer") {
            assert!(
                matches!(&e, Error::ProviderUnavailable { provider, device, .. } if provider == "libtorch" && device == "cpu"),
                "{e:?}"
            );
            assert!(
                msg.contains("torchlean-libtorch") && msg.contains("--features libtorch"),
                "{msg}"
            );
        } else {
            // only:libtorch finds no capsule to plan first: a planning error listing them
            assert!(matches!(&e, Error::Planning(_)), "{e:?}");
        }
        assert!(
            report.kernels.is_empty(),
            "no kernel ran: {}",
            report.to_text()
        );
    }
    // with the default preference nothing changes
    runtime::install(Session::new(BackendProfile::default_cpu())).unwrap();
    assert_eq!(Tensor::ones(&[2]).unwrap().sin().unwrap().to_vec().len(), 2);
    runtime::take().unwrap();
}

/// `on_compute_threads` runs its closure on a pool thread under the caller's own session,
/// moved there and back: the ops run under the caller's profile and are in its report, the
/// pool thread keeps no session afterwards, and a caller without a session gets none there.
#[test]
fn on_compute_threads_moves_the_callers_session_to_a_pool_thread_and_back() {
    on_plain_thread(|| {
        runtime::install(strict()).unwrap();
        let (on_pool, profile, capsule) = runtime::on_compute_threads(|| {
            let y = Tensor::ones(&[3]).unwrap().requires_grad().cos().unwrap();
            (
                rayon::current_thread_index().is_some(),
                runtime::with_current(|s| s.profile().name.clone()).unwrap(),
                y.producer().map(|(_, c)| c.to_string()),
            )
        })
        .unwrap();
        assert!(on_pool, "the closure ran on the caller's thread");
        assert_eq!(profile, "strict_cpu");
        assert_eq!(capsule.as_deref(), Some("reference.cos"));
        // back on the caller, with the op in its report
        let report = runtime::with_current(|s| s.report()).unwrap();
        assert!(
            report.kernels.iter().any(|k| k.capsule == "reference.cos"),
            "{:?}",
            report.kernels
        );
        // no pool thread kept the session: every thread of the pool is without one
        let left: Vec<bool> = rayon::broadcast(|_| runtime::has_session());
        assert!(left.iter().all(|has| !has), "{left:?}");
    });
    // a caller without a session: the closure runs, and an op there is NoSession
    let r = on_plain_thread(|| {
        runtime::on_compute_threads(|| Tensor::ones(&[2]).unwrap().sin().map(|t| t.to_vec()))
    });
    assert!(matches!(r, Ok(Err(Error::NoSession { .. }))), "{r:?}");
    // inside `with_current` the session is lent and cannot be moved: an error, not a panic
    on_plain_thread(|| {
        runtime::install(strict()).unwrap();
        let r = runtime::with_current(|_| runtime::on_compute_threads(|| ()));
        assert!(matches!(r, Ok(Err(Error::SessionBusy { .. }))), "{r:?}");
        assert!(runtime::has_session(), "the session stayed on its thread");
    });
}

/// A panic in the closure resumes on the caller, which keeps its session; the grad mode
/// moves with the closure; inside a shape-only trace (whose state does not move) it is an
/// error, not a change of meaning.
#[test]
fn on_compute_threads_keeps_the_session_through_a_panic_and_carries_the_grad_mode() {
    on_plain_thread(|| {
        runtime::install(strict()).unwrap();
        let r = std::panic::catch_unwind(|| {
            runtime::on_compute_threads(|| -> () { panic!("a failing step") })
        });
        assert!(r.is_err(), "the panic reaches the caller");
        assert!(runtime::has_session(), "the caller kept its session");
        let left: Vec<bool> = rayon::broadcast(|_| runtime::has_session());
        assert!(left.iter().all(|has| !has), "{left:?}");
        // under no_grad the closure records nothing
        let x = Tensor::ones(&[3]).unwrap().requires_grad();
        let recorded = runtime::no_grad(|| {
            runtime::on_compute_threads(|| x.cos().unwrap().producer().is_some()).unwrap()
        });
        assert!(
            !recorded,
            "an op under no_grad was recorded on the pool thread"
        );
        let recorded =
            runtime::on_compute_threads(|| x.cos().unwrap().producer().is_some()).unwrap();
        assert!(recorded);
        // a trace's shape-only mode would not move: refused
        let mut inner = None;
        let _ = runtime::trace(|| {
            inner = Some(runtime::on_compute_threads(|| ()));
            Ok(())
        });
        let msg = match inner {
            Some(Err(e)) => e.to_string(),
            other => panic!("expected an error, got {other:?}"),
        };
        assert!(msg.contains("trace"), "{msg}");
    });
}

/// One report row per kernel: a kernel called on the tape and under `no_grad` is one row
/// (its VJP required, as the tape call required it), in the report of what ran and in the
/// plan made before the first kernel; a row per call kind was printed twice before.
#[test]
fn a_kernel_called_with_and_without_the_tape_is_one_report_row() {
    let session = Session::new(BackendProfile::named("checked_cpu").unwrap());
    runtime::install(session).unwrap();
    let x = Tensor::ones(&[4]).unwrap().requires_grad();
    let y = x.sin().unwrap().sum_all().unwrap();
    drop(y.backward().unwrap());
    let z = torchlean::no_grad(|| x.sin()).unwrap();
    assert_eq!(z.to_vec().len(), 4);
    let sin_rows = |r: &torchlean::backend::BackendReport| -> Vec<bool> {
        r.kernels
            .iter()
            .filter(|k| k.op == OpKind::Sin)
            .map(|k| {
                k.obligations
                    .iter()
                    .find(|o| o.obligation == torchlean::backend::Obligation::Vjp)
                    .unwrap()
                    .required
            })
            .collect()
    };
    let ran = runtime::with_current(|s| s.report()).unwrap();
    assert_eq!(sin_rows(&ran), vec![true], "{}", ran.to_text());
    // the plan of the same uses, as a training command makes it before the first kernel
    let mut uses = runtime::OpUses::from_kinds(&[OpKind::Sin], false);
    uses.extend(&runtime::OpUses::from_kinds(&[OpKind::Sin], true));
    assert_eq!(uses.uses().len(), 2, "two uses of one kind: {uses:?}");
    let planned = runtime::with_current(|s| s.preplan(&uses))
        .unwrap()
        .unwrap();
    assert_eq!(sin_rows(&planned), vec![true], "{}", planned.to_text());
}

/// The plan made before the first kernel lists the `concat` that places slices' cotangents
/// (runtime/slice_pieces.rs) only where the eager tape's backward can run it: on the CPU in
/// eager mode, not for a graph capture (`OpUses::all_recorded`: the compiled graph's own VJP
/// nodes differentiate the slice). It was listed for compiled runs too, which never called it
/// (an audit of the forty-third session).
#[test]
fn the_slice_pieces_concat_is_planned_only_where_the_tape_runs_it() {
    runtime::install(Session::new(BackendProfile::named("checked_cpu").unwrap())).unwrap();
    let uses = runtime::trace(|| {
        let x = Tensor::ones(&[2, 6])?.requires_grad();
        let (a, b) = (x.slice(1, 0, 3)?, x.slice(1, 3, 6)?);
        drop(a.add(&b)?.sum_all()?);
        Ok(())
    })
    .unwrap();
    let concat = |uses: &runtime::OpUses| {
        let planned = runtime::with_current(|s| s.preplan(uses)).unwrap().unwrap();
        planned.kernels.iter().any(|k| k.op == OpKind::Concat)
    };
    assert!(uses.uses().contains(&(OpKind::Slice, true)), "{uses:?}");
    assert!(
        concat(&uses),
        "eager: the tape's backward places the pieces with concat"
    );
    assert!(!concat(&uses.all_recorded()), "compiled: no concat runs");
    runtime::take().unwrap();
}
