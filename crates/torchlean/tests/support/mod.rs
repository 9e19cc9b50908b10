//! Session set-up shared by the test binaries.
//!
//! An op runs only under a profile the program chose: a thread without a session and
//! without a process default gets `Error::NoSession`. These tests run eager ops on the
//! test harness's threads under `checked_cpu`, set here explicitly as the process default
//! (tests that need another profile install a session on their thread).

use torchlean::backend::BackendProfile;

/// Sets `checked_cpu` as the process default (idempotent).
pub fn checked_cpu_default() {
    torchlean::runtime::set_process_default(BackendProfile::default_cpu())
        .expect("every test sets the same process default");
}
