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
//!
//! `TORCHLEAN_OP_TIMES=device` times with the device's own marks instead (CUDA events)
//! where the device keeps them: nothing is synchronized, a row is the device time between
//! the marks around its calls, read when the table is taken. On a device whose queue of
//! launched work stays ahead of the host (a step bound by its kernels) that is the kernels'
//! own time, without launch latency; host calls (the CPU) are still timed by the wall clock.

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

/// How calls are timed (`TORCHLEAN_OP_TIMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    /// synchronized wall time per call
    Synchronized,
    /// the device's marks (events), unsynchronized
    DeviceMarks,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TORCHLEAN_OP_TIMES") {
        Ok(v) if v == "device" => Mode::DeviceMarks,
        Ok(v) if !v.is_empty() && v != "0" => Mode::Synchronized,
        _ => Mode::Off,
    })
}

/// Whether timing is on (`TORCHLEAN_OP_TIMES` set to anything but `0` or empty).
pub fn enabled() -> bool {
    mode() != Mode::Off
}

/// Spans whose device time is read when the table is taken.
type Pending = Vec<(String, &'static str, Box<dyn crate::module::DeviceSpan>)>;

fn pending() -> &'static Mutex<Pending> {
    static PENDING: OnceLock<Mutex<Pending>> = OnceLock::new();
    PENDING.get_or_init(|| Mutex::new(Vec::new()))
}

fn add(capsule: &str, phase: &'static str, spent: Duration) {
    // a poisoned table (a panic elsewhere while it was held) only loses diagnostics
    if let Ok(mut t) = table().lock() {
        let row = t.entry((capsule.to_string(), phase)).or_default();
        row.0 += 1;
        row.1 += spent;
    }
}

/// Runs `f` (one kernel call on `device`) and, when timing is on, adds its synchronized wall
/// time to the row of (`capsule`, `phase`).
pub(crate) fn timed<R>(
    capsule: &str,
    phase: &'static str,
    device: Device,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    match mode() {
        Mode::Off => return f(),
        Mode::DeviceMarks => {
            if let Some(mut span) = crate::module::start_span(device)? {
                let out = f()?;
                span.end()?;
                if let Ok(mut p) = pending().lock() {
                    p.push((capsule.to_string(), phase, span));
                }
                return Ok(out);
            }
            let start = Instant::now();
            let out = f()?;
            add(capsule, phase, start.elapsed());
            return Ok(out);
        }
        Mode::Synchronized => {}
    }
    crate::module::synchronize(device)?;
    let start = Instant::now();
    let out = f()?;
    crate::module::synchronize(device)?;
    add(capsule, phase, start.elapsed());
    Ok(out)
}

/// The rows accumulated so far, largest total first, and clears them.
pub fn take() -> Vec<OpTime> {
    let spans = pending()
        .lock()
        .map(|mut p| std::mem::take(&mut *p))
        .unwrap_or_default();
    for (capsule, phase, span) in spans {
        // a span whose device time cannot be read (a failed device) is left out
        if let Ok(spent) = span.elapsed() {
            add(&capsule, phase, spent);
        }
    }
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
