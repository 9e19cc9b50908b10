//! Device-graph replay of a compiled training step (CUDA Graphs).
//!
//! A compiled step launches the same kernels on the same shapes every step; on a device,
//! launching them one by one from the host costs a few microseconds each, which dominates
//! small models. [`StepGraph`] records the accepted plan's run once as a device graph and
//! then replays it:
//!
//! 1. the first run executes normally (a warm-up: the device module's buffer cache then
//!    holds every buffer the run needs, and the kernels are loaded);
//! 2. the second run records: the step's inputs and parameters are first copied into
//!    **static buffers** that the graph owns, the plan runs against them while the module
//!    records every launch instead of executing it, and the recording is replayed once;
//!    every intermediate and output buffer is the module's and stays the graph's (its
//!    static memory plan) for as long as the graph lives;
//! 3. later runs copy the new inputs and parameters into the static buffers and replay.
//!
//! The outputs (loss, gradients) are the graph's buffers, rewritten by each replay: a replay
//! refuses to run while a previous step's output is still held elsewhere (an error naming
//! it, never a silently rewritten tensor). The graph records only device work: a plan whose
//! kernels read values on the host (replay checkers under `strict`, a kernel that checks
//! indices on the host) cannot be recorded, and the step then runs kernel by kernel, with the
//! reason in the report's executor line — the same kernels, the same results either way.
//!
//! Owns: when to record, the static buffers, the replay and its refusals. Must not plan,
//! gate or choose kernels: it runs only what the compiled plan accepted.

use super::compiled::CompiledGraph;
use crate::backend::{Device, Phase};
use crate::error::{Error, Result};
use crate::module::DeviceGraph;
use crate::tensor::Tensor;
use std::sync::Mutex;

/// The environment variable that turns device-graph replay off (`0`), for comparisons.
pub const DEVICE_GRAPH_ENV: &str = "TORCHLEAN_DEVICE_GRAPH";

/// Where a compiled step stands with its device graph.
enum State {
    /// Not used, and why (the host, not asked for, turned off).
    Off(String),
    /// The next run executes normally and then asks to be recorded.
    Warming,
    /// The next run records.
    Record,
    Ready(Box<Recorded>),
    /// Recording was tried and is not possible for this plan (why).
    Unavailable(String),
}

struct Recorded {
    graph: Box<dyn DeviceGraph>,
    /// The value of every external of the plan as the graph reads it: static copies for the
    /// values that change from step to step, the caller's own tensors for the rest.
    externals: Vec<Tensor>,
    /// The graph's outputs (rewritten by every replay).
    outputs: Vec<Tensor>,
    replays: u64,
}

/// The device-graph state of one compiled step.
pub(crate) struct StepGraph {
    device: Device,
    state: Mutex<State>,
}

/// Whether any kernel of the plan runs a replay checker (which reads its call's values on
/// the host, so it cannot be recorded).
fn checked_kernel(graph: &CompiledGraph) -> Option<String> {
    graph.accepted_kernels().iter().find_map(|k| {
        let checked = !k.checkers(Phase::Forward).is_empty() || !k.checkers(Phase::Vjp).is_empty();
        checked.then(|| k.capsule().name.clone())
    })
}

impl StepGraph {
    /// Not used, and why.
    pub(crate) fn off(device: Device, why: &str) -> StepGraph {
        StepGraph {
            device,
            state: Mutex::new(State::Off(why.into())),
        }
    }

    /// Asks for replay of `graph` on `device`: recorded at the second run where possible.
    pub(crate) fn requested(graph: &CompiledGraph, device: Device) -> StepGraph {
        let state = if device == Device::Cpu {
            State::Off("the host runs kernels directly".into())
        } else if std::env::var(DEVICE_GRAPH_ENV).is_ok_and(|v| v == "0") {
            State::Off(format!("{DEVICE_GRAPH_ENV}=0"))
        } else if let Some(capsule) = checked_kernel(graph) {
            State::Off(format!(
                "`{capsule}` runs a replay checker, which reads each call's values on the host"
            ))
        } else {
            State::Warming
        };
        StepGraph {
            device,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // a poisoned state only means a panic during an earlier run; the state itself is
        // consistent (every transition is one assignment)
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The report's line for it.
    pub(crate) fn describe(&self) -> String {
        match &*self.lock() {
            State::Off(why) => format!("device graph: off ({why})"),
            State::Warming | State::Record => {
                "device graph: requested (recorded at the second run)".into()
            }
            State::Ready(r) => format!(
                "device graph: forward and backward recorded once ({}) and replayed ({} replays); inputs and parameters are copied into its static buffers before each replay, every intermediate and output buffer is fixed; the optimizer update runs outside it",
                r.graph.describe(),
                r.replays
            ),
            State::Unavailable(why) => format!("device graph: not used ({why})"),
        }
    }

    /// Whether the step is replayed as a device graph (recorded and in use).
    pub(crate) fn replaying(&self) -> bool {
        matches!(&*self.lock(), State::Ready(_))
    }

    /// Runs `graph` on `values` (its externals in order); `changing[k]` says whether value k
    /// changes from step to step (inputs, parameters) or is the same tensor every step
    /// (constants).
    pub(crate) fn run(
        &self,
        graph: &CompiledGraph,
        values: Vec<Tensor>,
        changing: &[bool],
    ) -> Result<Vec<Tensor>> {
        let mut state = self.lock();
        match &mut *state {
            State::Off(_) | State::Unavailable(_) => graph.run_ordered_outputs(values),
            State::Warming => {
                let out = graph.run_ordered_outputs(values)?;
                *state = State::Record;
                Ok(out)
            }
            State::Record => match self.record(graph, &values, changing)? {
                Ok(recorded) => {
                    let out = recorded.outputs.clone();
                    *state = State::Ready(Box::new(recorded));
                    Ok(out)
                }
                Err(why) => {
                    *state = State::Unavailable(why);
                    graph.run_ordered_outputs(values)
                }
            },
            State::Ready(r) => {
                if let Some(k) = r.outputs.iter().position(|t| !t.is_sole_handle()) {
                    // named only here, on the refusal: nothing is built per step
                    let name = graph
                        .graph()
                        .outputs
                        .get(k)
                        .map_or("?", |o| o.name.as_str());
                    return Err(Error::Other(format!(
                        "compiled step: output `{name}` of the previous step is still held; the next device-graph replay rewrites it in place, so drop it (or copy its values) before the next step"
                    )));
                }
                // the previous replay's pending checks may read these inputs: settle them
                // before the inputs are rewritten
                r.graph.settle()?;
                // one batch (one launch on CUDA), not a launch per parameter
                let mut pairs = Vec::new();
                for (k, v) in values.iter().enumerate().filter(|&(k, _)| changing[k]) {
                    pairs.push(copy_pair(&r.externals[k], v)?);
                }
                let pairs: Vec<_> = pairs.iter().map(|(d, s)| (&**d, &**s)).collect();
                crate::module::copy_many(&pairs)?;
                r.graph.replay()?;
                r.replays += 1;
                Ok(r.outputs.clone())
            }
        }
    }

    /// Records one run (then replays it once, so that its outputs hold this step's values).
    /// The outer error is a failure of the device; the inner one says why this plan cannot
    /// be recorded (the step then runs kernel by kernel).
    fn record(
        &self,
        graph: &CompiledGraph,
        values: &[Tensor],
        changing: &[bool],
    ) -> Result<std::result::Result<Recorded, String>> {
        let mut externals = Vec::with_capacity(values.len());
        for (k, v) in values.iter().enumerate() {
            externals.push(if changing[k] {
                static_copy(v)?
            } else {
                v.clone()
            });
        }
        let mut outputs = None;
        let recorded = crate::module::capture(self.device, &mut || {
            outputs = Some(graph.run_ordered_outputs(externals.clone())?);
            Ok(())
        });
        let mut recorded = match recorded {
            Ok(g) => g,
            Err(e) => return Ok(Err(format!("recording failed: {e}"))),
        };
        // `capture` returns a graph only after `work` returned Ok, which set the outputs
        let Some(outputs) = outputs else {
            return Ok(Err("the recorded run produced no outputs".into()));
        };
        // the outputs must be the graph's alone: one shared with an external or with another
        // output would be rewritten behind its other holder's back
        for (k, t) in outputs.iter().enumerate() {
            let shared = !t.is_sole_handle()
                || externals.iter().any(|e| e.shares_storage_with(t))
                || outputs[..k].iter().any(|o| o.shares_storage_with(t));
            if shared || t.device_buffer().is_none() {
                return Ok(Err(format!(
                    "output {k} of the plan shares memory with another value"
                )));
            }
        }
        recorded.replay()?;
        Ok(Ok(Recorded {
            graph: recorded,
            externals,
            outputs,
            replays: 1,
        }))
    }
}

/// A contiguous device copy of `v` that only the graph holds.
fn static_copy(v: &Tensor) -> Result<Tensor> {
    let whole = whole_buffer(v)?;
    let buffer = crate::module::duplicate(&**whole.device_buffer().ok_or_else(host_value)?)?;
    Tensor::from_device_buffer(buffer, v.shape())
}

/// `v` when it is a whole device buffer (device tensors are always dense: device kernels
/// and uploads produce whole buffers), else an error.
fn whole_buffer(v: &Tensor) -> Result<Tensor> {
    let whole = v.is_contiguous()
        && v.layout().offset == 0
        && v.device_buffer().is_some_and(|b| b.len() == v.numel());
    if whole {
        Ok(v.clone())
    } else {
        Err(host_value())
    }
}

fn host_value() -> Error {
    Error::Other("device graph: a value of the step is not a whole device buffer".into())
}

/// The device buffers of the static buffer `dst` and the value `v` copied into it (same
/// shape).
fn copy_pair(
    dst: &Tensor,
    v: &Tensor,
) -> Result<(
    std::sync::Arc<dyn crate::tensor::DeviceBuffer>,
    std::sync::Arc<dyn crate::tensor::DeviceBuffer>,
)> {
    if dst.shape() != v.shape() {
        return Err(Error::Other(format!(
            "compiled step: a value of shape {:?} where the recorded step has {:?}",
            v.shape(),
            dst.shape()
        )));
    }
    let src = whole_buffer(v)?;
    match (dst.device_buffer(), src.device_buffer()) {
        (Some(d), Some(s)) => Ok((d.clone(), s.clone())),
        _ => Err(host_value()),
    }
}
