//! The process-wide default profile: set explicitly, used by threads without a session, and
//! named in their reports. (A binary of its own: the default cannot be unset.)

use torchlean::backend::BackendProfile;
use torchlean::runtime::{self, SessionOrigin};
use torchlean::{Error, Tensor};

#[test]
fn threads_without_a_session_run_under_the_explicit_process_default_and_say_so() {
    let strict = BackendProfile::named("strict_cpu").unwrap();
    runtime::set_process_default(strict.clone()).unwrap();
    runtime::set_process_default(strict).unwrap(); // the same profile again: fine
    let e = runtime::set_process_default(BackendProfile::default_cpu()).unwrap_err();
    assert!(matches!(&e, Error::ProcessDefaultSet { current, requested }
        if current == "strict_cpu" && requested == "checked_cpu"));
    let (capsule, origin, report) = std::thread::spawn(|| {
        let y = Tensor::ones(&[2]).unwrap().requires_grad().sin().unwrap();
        let (origin, report) = runtime::with_current(|s| (s.origin(), s.report())).unwrap();
        (y.producer().unwrap().1.to_string(), origin, report)
    })
    .join()
    .unwrap();
    assert_eq!(capsule, "reference.sin");
    assert_eq!(origin, SessionOrigin::ProcessDefault);
    assert_eq!(report.profile, "strict_cpu");
    assert_eq!(report.session.as_deref(), Some("process_default"));
    assert!(report
        .to_text()
        .lines()
        .next()
        .unwrap()
        .ends_with("session=process_default"));
    assert_eq!(report.to_json()["session"], "process_default");
}
