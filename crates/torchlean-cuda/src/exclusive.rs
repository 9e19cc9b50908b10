//! One thread at a time while a device graph is recorded.
//!
//! The module has one stream per process, shared by every thread's sessions. Recording a
//! device graph (`graph.rs`) puts that stream in capture mode and makes the buffer pool hand
//! every allocation to the graph: work another thread launched meanwhile would be recorded
//! into the graph instead of running (its results never computed, the graph's replays
//! repeating it), a read it made would be refused, and a buffer it allocated would belong to
//! the graph. So every use of the context is counted, and a recording waits until no other
//! thread is using the context and keeps every other thread waiting until it ends:
//!
//! - [`Cx`], the guard [`crate::device::context`] returns, counts one use by this thread for
//!   as long as it lives (a kernel holds it from its first look at the context to its last
//!   launch). Creating one waits while another thread records — unless this thread already
//!   holds one (a nested use: the recorder is then still waiting for this thread, see below).
//! - [`Exclusive::begin`] (the recorder, holding no guard) marks itself the recorder, then
//!   waits until no guard of another thread is alive; dropping it lets the others go on.
//!
//! The two sides meet Dekker-style on sequentially consistent atomics: a new guard
//! increments the count, then reads the recorder; the recorder writes itself, then reads the
//! count — so either the guard sees the recorder (and waits) or the recorder sees the guard
//! (and waits for it to drop). Waiting sleeps in short steps: a recording happens once per
//! compiled step executor (milliseconds), never per call.
//!
//! Owns: who may use the context while a graph is recorded. Must not launch anything.

use crate::device::Context;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// Guards alive in the process.
static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The token of the recording thread (0: no recording).
static RECORDER: AtomicU64 = AtomicU64::new(0);

/// The source of thread tokens (0 is never handed out).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's token (0 until it first asks).
    static TOKEN: Cell<u64> = const { Cell::new(0) };
    /// Guards alive on this thread.
    static MINE: Cell<usize> = const { Cell::new(0) };
}

const WAIT_STEP: Duration = Duration::from_micros(50);

fn token() -> u64 {
    TOKEN.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_TOKEN.fetch_add(1, SeqCst));
        }
        t.get()
    })
}

/// One use of the context by this thread, counted for as long as it lives (see the module
/// docs). Not `Send`: the count is this thread's.
pub(crate) struct Use {
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Use {
    /// Counts a use by this thread, waiting first while another thread records.
    pub(crate) fn enter() -> Use {
        let nested = MINE.with(|m| m.get()) > 0;
        let me = token();
        loop {
            IN_USE.fetch_add(1, SeqCst);
            let recorder = RECORDER.load(SeqCst);
            if nested || recorder == 0 || recorder == me {
                break;
            }
            IN_USE.fetch_sub(1, SeqCst);
            while RECORDER.load(SeqCst) == recorder {
                std::thread::sleep(WAIT_STEP);
            }
        }
        MINE.with(|m| m.set(m.get() + 1));
        Use {
            _this_thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Use {
    fn drop(&mut self) {
        MINE.with(|m| m.set(m.get() - 1));
        IN_USE.fetch_sub(1, SeqCst);
    }
}

/// The context, with this thread's use of it counted ([`Use`]): what
/// [`crate::device::context`] returns. Dereferences to the context.
pub struct Cx {
    cx: &'static Context,
    _use: Use,
}

impl Cx {
    pub(crate) fn enter(cx: &'static Context) -> Cx {
        Cx {
            cx,
            _use: Use::enter(),
        }
    }
}

impl std::ops::Deref for Cx {
    type Target = Context;
    fn deref(&self) -> &Context {
        self.cx
    }
}

/// This thread records; every other thread's use of the context waits until it is dropped.
pub(crate) struct Exclusive {
    _this_thread: std::marker::PhantomData<*const ()>,
}

impl Exclusive {
    /// Waits for any other recording to end, then for every other thread's guards to drop.
    /// The caller holds no guard (a guard held here would keep another recorder waiting for
    /// it while this thread waits for that recorder); an error says so instead of waiting
    /// forever.
    pub(crate) fn begin() -> torchlean::Result<Exclusive> {
        if MINE.with(|m| m.get()) > 0 {
            return Err(crate::device::failure(
                "device graph recording",
                "recording was asked for while this thread uses the device context (a recording must start outside any kernel)",
            ));
        }
        let me = token();
        while RECORDER.compare_exchange(0, me, SeqCst, SeqCst).is_err() {
            std::thread::sleep(WAIT_STEP);
        }
        while IN_USE.load(SeqCst) != 0 {
            std::thread::sleep(WAIT_STEP);
        }
        Ok(Exclusive {
            _this_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        RECORDER.store(0, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Three threads take uses (some nested) in a loop while this one records fifty times:
    /// no use of another thread is alive at any moment of a recording, and every thread
    /// still gets through (nothing deadlocks, nobody waits forever).
    #[test]
    fn no_other_thread_uses_the_context_while_one_records() {
        let inside = Arc::new(AtomicUsize::new(0));
        let recording = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let (inside, recording, stop, violations) = (
                    Arc::clone(&inside),
                    Arc::clone(&recording),
                    Arc::clone(&stop),
                    Arc::clone(&violations),
                );
                std::thread::spawn(move || {
                    let mut uses = 0u64;
                    while !stop.load(SeqCst) {
                        let outer = Use::enter();
                        inside.fetch_add(1, SeqCst);
                        if recording.load(SeqCst) {
                            violations.fetch_add(1, SeqCst);
                        }
                        if uses % 3 == w {
                            // a nested use never waits (the recorder waits for this thread)
                            let _inner = Use::enter();
                            std::thread::yield_now();
                        }
                        if recording.load(SeqCst) {
                            violations.fetch_add(1, SeqCst);
                        }
                        inside.fetch_sub(1, SeqCst);
                        drop(outer);
                        uses += 1;
                    }
                    uses
                })
            })
            .collect();
        for _ in 0..50 {
            let alone = Exclusive::begin().expect("no use held here");
            recording.store(true, SeqCst);
            assert_eq!(inside.load(SeqCst), 0, "another thread's use is alive");
            // the recorder's own uses, nested too, do not wait for it
            let own = Use::enter();
            let _nested = Use::enter();
            std::thread::sleep(Duration::from_micros(300));
            assert_eq!(inside.load(SeqCst), 0, "another thread's use began");
            drop(own);
            recording.store(false, SeqCst);
            drop(alone);
            std::thread::sleep(Duration::from_micros(200));
        }
        stop.store(true, SeqCst);
        for w in workers {
            assert!(
                w.join().expect("a worker panicked") > 0,
                "a worker never ran"
            );
        }
        assert_eq!(violations.load(SeqCst), 0);
    }

    /// A recording asked for while this thread holds a use is an error, not a wait that could
    /// never end.
    #[test]
    fn recording_inside_a_use_is_refused() {
        let held = Use::enter();
        let err = Exclusive::begin().err().expect("refused");
        assert!(err.to_string().contains("outside any kernel"), "{err}");
        drop(held);
    }
}
