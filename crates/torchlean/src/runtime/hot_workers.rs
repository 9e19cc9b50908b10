//! Keeping the compute pool's other workers awake while a compiled run is in flight.
//!
//! A CPU kernel splits its work over rayon's pool; a worker with nothing to do goes to
//! sleep, and the next op's split must wake it (a futex wake-up, tens of microseconds on this
//! project's VM), by which time the op, if small, is half done. Measured on the imported CNN
//! (batch 32, about 30 ops of 1–60 µs): two threads were *slower* than one (0.164 against
//! 0.152 ms), the convolutions no faster with the second thread at all (docs/BENCHMARKS.md,
//! twenty-seventh session). [`with_hot_workers`] runs a closure (a compiled graph's op
//! loop) while every other worker of the pool runs a spinner: a job that executes any pending
//! pool work as soon as it appears (`rayon::yield_now`) and spins otherwise, until the
//! closure returns — one wake-up per run instead of one per op, at the price of the other
//! cores spinning for the run's duration (as onnxruntime's and OpenMP's spinning workers do).
//!
//! Safety of the scheme (no deadlock, nothing left spinning): a spinner that lands on the
//! calling thread itself (which can happen while the caller waits in a join) returns at once;
//! spinners stop at the first check after the closure returns or panics (a drop guard sets
//! their flag); a spinner only runs pool work, so it never blocks work the closure waits for.
//! Outside a pool thread, or on a one-thread pool, the closure just runs; so it does when the
//! environment sets `TORCHLEAN_HOT_WORKERS=0` (a program that shares the cores with other
//! work and prefers sleeping workers to their latency).
//!
//! This module owns only that scheduling; it plans, gates and runs no kernel itself.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Spinners running now, in every pool (diagnostics and tests: 0 soon after every
/// [`with_hot_workers`] call has returned).
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// How many spinners are running now.
pub fn spinning() -> usize {
    SPINNING.load(Ordering::Acquire)
}

/// Sets the spinners' stop flag when dropped (also when the closure panics).
struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The environment variable that turns the spinners off (`0`).
pub const HOT_WORKERS_ENV: &str = "TORCHLEAN_HOT_WORKERS";

fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(HOT_WORKERS_ENV).map_or(true, |v| v != "0"))
}

/// [`with_hot_workers`] when `device` is the host (whose kernels use the pool), else just `f`.
pub fn with_hot_workers_on<R>(device: crate::backend::Device, f: impl FnOnce() -> R) -> R {
    if device == crate::backend::Device::Cpu {
        with_hot_workers(f)
    } else {
        f()
    }
}

/// Runs `f` on this pool thread while the pool's other workers spin, ready for its kernels'
/// parallel work (see the module docs).
pub fn with_hot_workers<R>(f: impl FnOnce() -> R) -> R {
    let Some(me) = rayon::current_thread_index().filter(|_| enabled()) else {
        return f();
    };
    let others = rayon::current_num_threads().saturating_sub(1);
    if others == 0 {
        return f();
    }
    let stop = Stop(Arc::new(AtomicBool::new(false)));
    for _ in 0..others {
        let flag = stop.0.clone();
        rayon::spawn(move || {
            if rayon::current_thread_index() == Some(me) {
                return;
            }
            SPINNING.fetch_add(1, Ordering::AcqRel);
            while !flag.load(Ordering::Acquire) {
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => {}
                    _ => std::hint::spin_loop(),
                }
            }
            SPINNING.fetch_sub(1, Ordering::AcqRel);
        });
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::time::{Duration, Instant};

    /// Waits (at most 5 s) until no spinner runs; false if some still does.
    fn settled() -> bool {
        let start = Instant::now();
        while spinning() != 0 {
            if start.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Parallel work inside the scope gives the same result as outside it; the spinners stop
    /// when the closure returns, when it panics, and when scopes nest; a one-thread pool and
    /// a thread outside any pool just run the closure.
    #[test]
    fn spinners_run_pool_work_and_always_stop() {
        let work = || {
            (0..100_000u64)
                .into_par_iter()
                .map(|x| x * x % 7)
                .sum::<u64>()
        };
        let expected: u64 = (0..100_000u64).map(|x| x * x % 7).sum();
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool");
        for _ in 0..20 {
            assert_eq!(two.install(|| with_hot_workers(work)), expected);
        }
        assert!(settled(), "spinners left running after the scopes returned");
        let panicked = two.install(|| {
            std::panic::catch_unwind(|| with_hot_workers(|| -> u64 { panic!("a failing run") }))
        });
        assert!(panicked.is_err());
        assert!(settled(), "spinners left running after a panic");
        let nested = two.install(|| with_hot_workers(|| with_hot_workers(work) + work()));
        assert_eq!(nested, 2 * expected);
        assert!(settled(), "spinners left running after nested scopes");
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a pool");
        assert_eq!(one.install(|| with_hot_workers(work)), expected);
        assert_eq!(with_hot_workers(work), expected);
        assert!(settled());
    }
}
