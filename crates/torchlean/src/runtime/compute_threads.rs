//! Running a program's op loop on the compute pool's own threads.
//!
//! The CPU kernels split their work over rayon's global pool. A parallel kernel called from
//! a thread *outside* the pool (a program's `main`) cannot take part in its own work: rayon
//! queues the job on the pool, wakes the workers and puts the caller to sleep until they are
//! done, so every op pays two cross-thread wake-ups, and on a machine with as many workers as
//! cores the caller and the workers compete for them. Measured on this project's 2-core
//! machine: the imported CNN (batch 32, about 30 small ops) took 0.52–0.64 ms per inference
//! called from `main` and 0.31–0.35 ms when the same loop ran on a pool thread, where an op's
//! parallel split keeps one half on the calling worker and hands the other to the second
//! (docs/BENCHMARKS.md, nineteenth session).
//!
//! [`on_compute_threads`] runs a closure on a pool thread, with the calling thread's eager
//! session moved there for the duration and moved back afterwards (also when the closure
//! panics: the panic resumes on the caller, which keeps its session): ops in the closure run
//! under exactly the session (profile, registry, report) they would have had on the caller,
//! never a weaker one, and the session's report includes them. The grad mode moves with it
//! (inside [`super::no_grad`] the closure runs without recording). Per-thread states that do
//! not move — a graph capture, a shape-only trace, a compiled run's buffer pool, a composite
//! kernel's parts — make it an error, never a silent change of meaning. Called from a pool
//! thread, it just runs the closure.
//!
//! This module owns only that hand-over; it plans, gates and runs nothing itself.
//!
//! Caveats for callers: while the closure runs, one pool thread is busy with it. A closure
//! that blocks waiting for work that itself needs the pool (e.g. a channel fed by another
//! thread whose ops are parallel) leaves one thread fewer for that work, and on a one-thread
//! pool would wait forever; run such producer/consumer loops outside this helper. Rayon may
//! run the closure's own parallel tasks on its thread, so a task that installs a session
//! ([`super::install`]) would replace the closure's: give such tasks threads of their own
//! ([`super::spawn`]). The pool gets a main thread's 8 MiB stacks only when this helper
//! starts it; a pool that kernels started earlier keeps rayon's default stack.

use super::session::{install, take, Session};
use crate::error::Result;

/// Runs `f` on one of the compute pool's threads under this thread's session (moved there
/// and back; none is created). Errors only when the session cannot be moved: inside a
/// [`super::with_current`] closure ([`crate::Error::SessionBusy`]), or when the pool thread
/// that picked the job up is itself lending its own session (the caller keeps its session).
pub fn on_compute_threads<R, F>(f: F) -> Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    if rayon::current_thread_index().is_some() {
        return Ok(f());
    }
    if let Some(state) = unmovable_state() {
        return Err(crate::Error::Other(format!(
            "on_compute_threads: called inside {state}, whose per-thread state does not move \
             to another thread; call it outside"
        )));
    }
    ensure_pool_stack();
    let grad = super::grad_enabled();
    let session = take()?;
    // `rayon::scope` runs its body on a pool thread and blocks this one until it ends
    let (result, session) = rayon::scope(move |_| {
        let mut session = session;
        match Lent::swap_in(&mut session) {
            Ok(lent) => {
                let run = || if grad { f() } else { super::no_grad(f) };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
                (Ok(result), lent.give_back())
            }
            Err(e) => (Err(e), session),
        }
    });
    if let Some(s) = session {
        // this thread's slot was emptied by `take` above and nothing borrows it
        install(s)?;
    }
    match result? {
        Ok(r) => Ok(r),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The per-thread state of the calling thread that a move to another thread would lose.
fn unmovable_state() -> Option<&'static str> {
    if super::autograd::capture_started() {
        Some("a graph capture")
    } else if super::trace::tracing() {
        Some("a shape-only trace")
    } else if super::buffers::pool_active() {
        Some("a compiled run (its buffer pool)")
    } else if super::guarded::composite_running() {
        Some("a composite kernel")
    } else {
        None
    }
}

/// The stack a pool thread gets when this module starts the pool: the 8 MiB of a program's
/// main thread, since the closure runs what `main` would have run.
const POOL_STACK_BYTES: usize = 8 << 20;

/// Starts rayon's global pool with [`POOL_STACK_BYTES`] per thread (and rayon's usual thread
/// count) if nothing has started it yet; if the program or an earlier kernel already did,
/// that pool is used as it is.
fn ensure_pool_stack() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rayon::ThreadPoolBuilder::new()
            .stack_size(POOL_STACK_BYTES)
            .build_global();
    });
}

/// The pool thread's own session, set aside while the caller's is installed there; put
/// back on [`Lent::give_back`], or on drop when `f` panics.
struct Lent {
    own: Option<Option<Session>>,
}

impl Lent {
    /// Installs `session` on this (pool) thread, taking it out of the slot; on an error the
    /// slot keeps it, for the caller to take back.
    fn swap_in(session: &mut Option<Session>) -> Result<Lent> {
        let own = take()?;
        if let Some(s) = session.take() {
            // the slot was just emptied by `take`, which proved nothing borrows it
            let _ = install(s);
        }
        Ok(Lent { own: Some(own) })
    }

    /// The caller's session, taken back off the pool thread; the thread's own restored.
    fn give_back(mut self) -> Option<Session> {
        let caller = take().ok().flatten();
        self.restore();
        caller
    }

    fn restore(&mut self) {
        if let Some(own) = self.own.take() {
            let _ = take();
            if let Some(own) = own {
                let _ = install(own);
            }
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.restore();
    }
}
