//! Opt-in wall time per kernel, for finding where a step's time goes on a device that has no
//! profiler at hand (`TORCHLEAN_OP_TIMES=1`; `torchlean bench` prints the table).
//!
//! When enabled, every kernel call of the eager path and the compiled executor's general path
//! ([`super::guarded`]'s `run_forward`, `run_vjp`; not in-place calls, nor the CPU dense
//! executor's) is bracketed by synchronizations of its
//! device, so the time of a call is its kernels' time plus launch and synchronization
//! latency, and an enabled run is slower than a plain one: use it to rank kernels, not to
//! report speed. The time of a composite capsule's row includes its parts' rows. The replay
//! checkers a call runs after its kernel are timed as rows of their own (`… checks`). Off (one
//! relaxed load per call) unless the variable is set when the first kernel runs.

use crate::backend::Device;
use crate::error::Result;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Accumulated time of one (capsule, phase).
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    pub capsule: String,
    /// `forward`, `vjp`, or the checkers run after them: `forward checks`, `vjp checks`
    /// (rows only for capsules whose checkers run on every call, each with its calls).
    pub phase: &'static str,
    pub calls: u64,
    pub total: Duration,
}

type Table = HashMap<(String, &'static str), (u64, Duration)>;

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether timing is on (`TORCHLEAN_OP_TIMES` set to anything but `0` or empty).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHLEAN_OP_TIMES").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Runs `f` (one kernel call on `device`) and, when timing is on, adds its synchronized wall
/// time to the row of (`capsule`, `phase`).
pub(crate) fn timed<R>(
    capsule: &str,
    phase: &'static str,
    device: Device,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if !enabled() {
        return f();
    }
    crate::module::synchronize(device)?;
    let start = Instant::now();
    let out = f()?;
    crate::module::synchronize(device)?;
    let spent = start.elapsed();
    // a poisoned table (a panic elsewhere while it was held) only loses diagnostics
    if let Ok(mut t) = table().lock() {
        let row = t.entry((capsule.to_string(), phase)).or_default();
        row.0 += 1;
        row.1 += spent;
    }
    Ok(out)
}

/// The rows accumulated so far, largest total first, and clears them.
pub fn take() -> Vec<OpTime> {
    let Ok(mut t) = table().lock() else {
        return Vec::new();
    };
    let mut rows: Vec<OpTime> = t
        .drain()
        .map(|((capsule, phase), (calls, total))| OpTime {
            capsule,
            phase,
            calls,
            total,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.total));
    rows
}
