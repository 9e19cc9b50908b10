//! Compiled mode: plan and gate a graph once, then execute the accepted graph plan many times.
//!
//! [`CompiledGraph::compile`] validates the graph, plans every op node (and every VJP node,
//! with the capsule of its op) under one request, lowers, and gates the whole plan into an
//! `AcceptedGraphPlan`; a rejected plan is returned with its failures for inspection. The
//! executor then runs nothing but that plan: node by node in SSA order, each `op` node by its
//! accepted forward kernel and each `vjp` node by the same capsule's VJP kernel (asking only
//! for the one cotangent it needs). Memory: the liveness of every value is computed once;
//! a value is released right after its last use, so the peak is the plan's, not the graph's.

use super::guarded;
use crate::backend::Phase;
use crate::backend::{
    gate_plan, plan_op, AcceptedGraphPlan, BackendProfile, BackendReport, ExecutionMode,
    ExecutionPlan, PlanRequest, PlannedKernel, PlanningError, RejectedPlan, VjpMode,
};
use crate::error::{Error, GateRejection, Result};
use crate::graph::{Graph, GraphError, NodeKind, OpKind};
use crate::tensor::Tensor;
use std::collections::HashMap;
use thiserror::Error;

/// Why a graph could not be compiled.
#[derive(Debug, Error)]
pub enum CompileError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("planning failed:\n{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Planning(Vec<PlanningError>),
    #[error("rejected by the gate:\n  {}", .0.failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n  "))]
    Rejected(Box<RejectedPlan>),
    /// The accepted plan's device failed its probe (hardware or libraries missing).
    #[error(transparent)]
    Device(Box<Error>),
}

impl From<CompileError> for Error {
    fn from(e: CompileError) -> Error {
        match e {
            CompileError::Graph(g) => Error::Other(g.to_string()),
            CompileError::Planning(errors) => Error::Planning(errors),
            CompileError::Rejected(plan) => Error::Gate(GateRejection::Plan(plan)),
            CompileError::Device(e) => *e,
        }
    }
}

/// A graph with its accepted plan, ready to run.
pub struct CompiledGraph {
    graph: Graph,
    plan: AcceptedGraphPlan,
    /// For each node, the index of its accepted kernel (op and vjp nodes).
    kernel_of: Vec<Option<usize>>,
    /// For each node, the last node that reads it (itself if none); outputs live to the end.
    last_use: Vec<usize>,
    report: BackendReport,
    peak_elements: usize,
    /// For each vjp node, its siblings: the vjp nodes over the same op node and cotangent,
    /// as (node, input). The first sibling computes every one of their cotangents in one call
    /// of the VJP kernel; the others find their value already there.
    siblings: Vec<Vec<(usize, usize)>>,
    /// Whether a node's value is computed by the graph (not an input, parameter or constant
    /// the caller owns), so an in-place kernel may consume it at its last use.
    consumable: Vec<bool>,
    /// The buffers of the static memory plan, kept between runs.
    pool: std::sync::Mutex<super::buffers::BufferPool>,
    /// The dense lowering of the plan, when every node has destination-passing kernels
    /// (then it is what runs; see `dense_plan.rs`).
    dense: Option<super::dense_plan::DensePlan>,
    /// When the plan has composite kernels: the sessions (this plan's profile and registry)
    /// their parts run through, one installed on the thread for each run.
    parts_session: Option<PartsSessions>,
    profile: BackendProfile,
}

/// The sessions a compiled plan's composite kernels run their parts through: forks of one
/// session of the plan's profile and registry, so that every run — on any thread, several
/// at once — plans and gates the parts alike, and the parts that ran land in one log (the
/// report of what ran, [`CompiledGraph::ran_report`]).
struct PartsSessions {
    /// Never installed: the forks' origin and the keeper of their shared log.
    origin: std::sync::Mutex<super::session::Session>,
    /// Forks between runs (their plans cached), one taken per run in progress.
    idle: std::sync::Mutex<Vec<super::session::Session>>,
}

impl PartsSessions {
    fn new(session: super::session::Session) -> PartsSessions {
        let first = session.fork();
        PartsSessions {
            origin: std::sync::Mutex::new(session),
            idle: std::sync::Mutex::new(vec![first]),
        }
    }

    /// The parts' rows of every call so far, nested under their composites (`part_of`).
    fn ran_parts(&self) -> Vec<crate::backend::KernelAudit> {
        let origin = self.origin.lock().unwrap_or_else(|p| p.into_inner());
        origin
            .report()
            .kernels
            .into_iter()
            .filter(|a| a.part_of.is_some())
            .collect()
    }
}

/// Keeps one of a compiled plan's parts sessions installed on the thread until dropped, then
/// puts it back and the thread's previous session too.
struct PartsScope<'a> {
    sessions: &'a PartsSessions,
    previous: Option<super::session::Session>,
}

impl<'a> PartsScope<'a> {
    fn enter(sessions: &'a PartsSessions) -> Result<PartsScope<'a>> {
        let idle = sessions
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        // another thread runs this plan at the same time: a new fork of the same origin
        let session = match idle {
            Some(s) => s,
            None => sessions
                .origin
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .fork(),
        };
        let previous = super::session::install(session)?;
        Ok(PartsScope { sessions, previous })
    }
}

impl Drop for PartsScope<'_> {
    fn drop(&mut self) {
        if let Ok(Some(s)) = super::session::take() {
            let mut idle = self.sessions.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.push(s);
        }
        if let Some(p) = self.previous.take() {
            let _ = super::session::install(p);
        }
    }
}

/// Groups the vjp nodes that share their parents (same op node, same cotangent).
fn vjp_siblings(graph: &Graph) -> Vec<Vec<(usize, usize)>> {
    let mut by_parents: HashMap<&[usize], Vec<(usize, usize)>> = HashMap::new();
    for n in &graph.nodes {
        if let NodeKind::Vjp { input, .. } = &n.kind {
            by_parents
                .entry(n.parents.as_slice())
                .or_default()
                .push((n.id, *input));
        }
    }
    let mut out = vec![vec![]; graph.nodes.len()];
    for group in by_parents.into_values() {
        for &(id, _) in &group {
            out[id] = group.clone();
        }
    }
    out
}

impl CompiledGraph {
    /// Validates, plans, lowers and gates `graph` under `profile` over the standard registry.
    pub fn compile(
        graph: Graph,
        profile: &BackendProfile,
    ) -> std::result::Result<CompiledGraph, CompileError> {
        Self::compile_with_registry(graph, profile, super::session::standard_registry())
    }

    /// [`CompiledGraph::compile`] over a custom registry.
    pub fn compile_with_registry(
        graph: Graph,
        profile: &BackendProfile,
        registry: &std::sync::Arc<crate::backend::Registry>,
    ) -> std::result::Result<CompiledGraph, CompileError> {
        let GraphPlan {
            graph,
            accepted,
            kernel_of,
            audits,
            composite,
        } = plan_graph(graph, profile, registry)?;
        // the parts run through a session of this profile, installed for each run
        let parts_session = composite.then(|| {
            PartsSessions::new(super::session::Session::with_registry(
                profile.clone(),
                std::sync::Arc::clone(registry),
            ))
        });
        // the same probe as eager mode's, before any kernel of the plan can run
        let probed = super::probe::probe_for(profile.device, profile.preference)
            .map_err(|e| CompileError::Device(Box::new(e)))?;
        let mut report = BackendReport::new(
            profile,
            ExecutionMode::Compiled,
            audits,
            accepted.groups().to_vec(),
            vec![],
        );
        report.target = Some(probed.detail);
        let mut last_use: Vec<usize> = (0..graph.nodes.len()).collect();
        for n in &graph.nodes {
            for &p in &n.parents {
                last_use[p] = last_use[p].max(n.id);
            }
        }
        for o in &graph.outputs {
            last_use[o.node] = usize::MAX;
        }
        let sizes = graph.node_elements();
        // the values that die at each node, bucketed once (scanning every earlier value at
        // every node made compiling a 100k-node backward graph take seconds)
        let mut dies_at: Vec<Vec<usize>> = vec![vec![]; graph.nodes.len()];
        for (m, &lu) in last_use.iter().enumerate() {
            if lu != usize::MAX {
                dies_at[lu].push(m);
            }
        }
        let (mut live, mut peak) = (0usize, 0usize);
        for n in &graph.nodes {
            live += sizes[n.id];
            peak = peak.max(live);
            for &m in &dies_at[n.id] {
                live -= sizes[m];
            }
        }
        let siblings = vjp_siblings(&graph);
        let consumable = graph
            .nodes
            .iter()
            .map(|n| matches!(n.kind, NodeKind::Op { .. } | NodeKind::Vjp { .. }))
            .collect();
        let dense = super::dense_plan::DensePlan::build(
            &graph,
            accepted.kernels(),
            &kernel_of,
            &last_use,
            &siblings,
        );
        report.executor = Some(match &dense {
            Ok(d) => format!(
                "dense: {} steps ({} in place) over {} static buffers, running each capsule's destination-passing kernels (forward_into/vjp_into/in_place_into)",
                d.step_count(),
                d.in_place_count(),
                d.buffer_count()
            ),
            Err(why) => format!("general: tensor kernels with a liveness buffer pool (not dense: {why})"),
        });
        let dense = dense.ok();
        Ok(CompiledGraph {
            graph,
            plan: accepted,
            kernel_of,
            last_use,
            report,
            peak_elements: peak,
            siblings,
            consumable,
            pool: Default::default(),
            dense,
            parts_session,
            profile: profile.clone(),
        })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The report of the accepted plan (every capsule the executor runs; a composite's
    /// rows followed by those of every part it may run, planned and gated with it).
    pub fn report(&self) -> &BackendReport {
        &self.report
    }

    /// The report of what ran: the plan's rows, each composite's followed by the parts its
    /// calls actually ran so far (a `torchlean.fused_map` lists its chains' maps, not every
    /// map it may run). The same as [`CompiledGraph::report`] for a plan without composites.
    pub fn ran_report(&self) -> BackendReport {
        let mut report = self.report.clone();
        if let Some(sessions) = &self.parts_session {
            let mut parts = sessions.ran_parts();
            parts.sort_by_key(|a| a.op);
            let tops: Vec<_> = report
                .kernels
                .drain(..)
                .filter(|a| a.part_of.is_none())
                .collect();
            for top in tops {
                let name = top.capsule.clone();
                report.kernels.push(top);
                let (mine, rest): (Vec<_>, Vec<_>) = parts
                    .into_iter()
                    .partition(|p| p.part_of.as_deref() == Some(name.as_str()));
                report.kernels.extend(mine);
                parts = rest;
            }
        }
        report
    }

    /// The accepted plan's kernels.
    pub(crate) fn accepted_kernels(&self) -> &[crate::backend::AcceptedKernel] {
        self.plan.kernels()
    }

    /// Whether the plan runs on the dense path (every node has destination-passing kernels),
    /// and then its number of buffers.
    pub fn dense_buffers(&self) -> Option<usize> {
        self.dense.as_ref().map(|d| d.buffer_count())
    }

    /// Peak number of live f32 elements while running (from the liveness plan).
    pub fn peak_elements(&self) -> usize {
        self.peak_elements
    }

    /// Releases the values whose last reader is `n` (and `n` itself if nobody reads it),
    /// giving their buffers back to the pool.
    fn release_after(&self, n: &crate::graph::Node, slots: &mut [Option<Tensor>]) {
        let mut release = |i: usize| {
            if let Some(t) = slots[i].take() {
                super::buffers::recycle(t);
            }
        };
        if self.last_use[n.id] == n.id {
            release(n.id); // nobody reads it and it is not an output
        }
        for &p in &n.parents {
            if self.last_use[p] == n.id {
                release(p);
            }
        }
    }

    /// Gives output tensors the caller is done with back to the pool (only those it owns
    /// alone are taken), so the next run reuses their buffers.
    pub fn give_back(&self, tensors: impl IntoIterator<Item = Tensor>) {
        if let Some(dense) = &self.dense {
            return dense.give_back(tensors);
        }
        if let Ok(mut pool) = self.pool.lock() {
            for t in tensors {
                pool.give_back(t);
            }
        }
    }

    /// Counters of the buffer pool (reused vs newly allocated buffers, over all runs).
    pub fn pool_stats(&self) -> super::buffers::PoolStats {
        if let Some(dense) = &self.dense {
            return dense.stats();
        }
        self.pool.lock().map(|p| p.stats()).unwrap_or_default()
    }

    /// The names of the graph's input, parameter and constant nodes, in node order: the
    /// order of the values [`CompiledGraph::run_ordered`] takes.
    pub fn external_names(&self) -> Vec<&str> {
        self.graph
            .nodes
            .iter()
            .filter_map(|n| match &n.kind {
                NodeKind::Input { name }
                | NodeKind::Parameter { name }
                | NodeKind::Constant { name } => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Runs the plan with `values[k]` the value of the k-th of [`CompiledGraph::external_names`]
    /// (no lookups by name on the dense path).
    pub fn run_ordered(&self, values: Vec<Tensor>) -> Result<Vec<(String, Tensor)>> {
        match &self.dense {
            Some(dense) => dense
                .run_ordered(self.plan.kernels(), values)
                .map_err(|e| self.in_context(e)),
            None => {
                let names = self.external_names();
                self.run(|name| {
                    let k = names.iter().position(|n| *n == name)?;
                    values.get(k).cloned()
                })
            }
        }
    }

    /// [`CompiledGraph::run_ordered`], returning the outputs unnamed, in the graph's output
    /// order.
    pub fn run_ordered_outputs(&self, values: Vec<Tensor>) -> Result<Vec<Tensor>> {
        match &self.dense {
            Some(dense) => dense
                .run_outputs(self.plan.kernels(), values)
                .map_err(|e| self.in_context(e)),
            None => Ok(self
                .run_ordered(values)?
                .into_iter()
                .map(|(_, t)| t)
                .collect()),
        }
    }

    /// What graph node `id` computes and reads, for an error raised there: "`index_select`
    /// of input `table` and node 3", "the VJP of `linear`".
    fn node_label(&self, id: usize) -> String {
        let Some(n) = self.graph.nodes.get(id) else {
            return String::new();
        };
        let source = |p: &usize| match self.graph.nodes.get(*p).map(|q| &q.kind) {
            Some(NodeKind::Input { name }) => format!("input `{name}`"),
            Some(NodeKind::Parameter { name }) => format!("parameter `{name}`"),
            Some(NodeKind::Constant { name }) => format!("constant `{name}`"),
            _ => format!("node {p}"),
        };
        match &n.kind {
            NodeKind::Op { op } => format!(
                "`{}` of {}",
                op.name(),
                n.parents.iter().map(source).collect::<Vec<_>>().join(", ")
            ),
            NodeKind::Vjp { op, .. } => format!("the VJP of `{}`", op.name()),
            _ => source(&id),
        }
    }

    /// An error of the dense executor, its node's label completed from the graph.
    fn in_context(&self, e: Error) -> Error {
        match e {
            Error::AtNode { node, source, .. } => Error::AtNode {
                node,
                label: self.node_label(node),
                source,
            },
            e => e,
        }
    }

    /// Runs the plan. `value(name)` supplies inputs, parameters and constants by name; every
    /// supplied tensor must have its declared shape. Returns the named outputs.
    pub fn run(&self, value: impl Fn(&str) -> Option<Tensor>) -> Result<Vec<(String, Tensor)>> {
        // the CPU kernels' parallel splits find the pool's other workers awake
        super::hot_workers::with_hot_workers_on(self.profile.device, || self.run_here(value))
    }

    /// [`Self::run`] on this thread's schedule.
    fn run_here(&self, value: impl Fn(&str) -> Option<Tensor>) -> Result<Vec<(String, Tensor)>> {
        if self.dense.is_some() {
            let values = self
                .external_names()
                .into_iter()
                .map(|name| {
                    value(name)
                        .ok_or_else(|| Error::Other(format!("no value supplied for `{name}`")))
                })
                .collect::<Result<_>>()?;
            return self.run_ordered(values);
        }
        let _pool = super::buffers::ActivePool::enter(&self.pool);
        let _parts = match &self.parts_session {
            Some(sessions) => Some(PartsScope::enter(sessions)?),
            None => None,
        };
        let mut slots: Vec<Option<Tensor>> = vec![None; self.graph.nodes.len()];
        let kernels = self.plan.kernels();
        for n in &self.graph.nodes {
            if slots[n.id].is_some() {
                // a vjp computed together with an earlier sibling
                self.release_after(n, &mut slots);
                continue;
            }
            let get = |i: usize| -> Result<&Tensor> {
                slots[i].as_ref().ok_or_else(|| {
                    Error::Other(format!(
                        "graph node {i} was released before node {} used it",
                        n.id
                    ))
                })
            };
            let out = match &n.kind {
                NodeKind::Input { name }
                | NodeKind::Parameter { name }
                | NodeKind::Constant { name } => {
                    let t = value(name)
                        .ok_or_else(|| Error::Other(format!("no value supplied for `{name}`")))?;
                    if t.shape() != n.shape.as_slice() {
                        return Err(Error::Other(format!(
                            "value `{name}` has shape {:?}, the graph declares {:?}",
                            t.shape(),
                            n.shape
                        )));
                    }
                    t
                }
                NodeKind::Op { op } => {
                    // invariant: `compile` assigns a kernel to every op and vjp node or fails
                    let k = &kernels[self.kernel_of[n.id]
                        .expect("every op node has a kernel (compile checked)")];
                    let binding = super::kernel::cpu_binding(k)?;
                    // a checker replays the call on its inputs: those must survive it
                    let checked = !k.checkers(Phase::Forward).is_empty();
                    match (binding.in_place(), n.parents.as_slice()) {
                        // in place: the one input dies here, so its buffer may be overwritten
                        // by a value of its shape
                        (Some(in_place), &[p])
                            if self.consumable[p]
                                && self.last_use[p] == n.id
                                && !checked
                                && self.graph.nodes[p].shape == n.shape =>
                        {
                            let mut input = slots[p].take().ok_or_else(|| {
                                Error::Other(format!(
                                    "graph node {p} was released before node {} used it",
                                    n.id
                                ))
                            })?;
                            guarded::run_in_place(k, op, in_place, &mut input, &[])
                                .map_err(|e| e.at_node(n.id, || self.node_label(n.id)))?;
                            input
                        }
                        _ => {
                            let inputs: Vec<&Tensor> =
                                n.parents.iter().map(|&p| get(p)).collect::<Result<_>>()?;
                            guarded::run_forward(k, op, &inputs)
                                .map_err(|e| e.at_node(n.id, || self.node_label(n.id)))?
                        }
                    }
                }
                NodeKind::Vjp { op, input } => {
                    // invariant: `compile` assigns a kernel to every op and vjp node or fails
                    let k = &kernels[self.kernel_of[n.id]
                        .expect("every vjp node has a kernel (compile checked)")];
                    let all: Vec<&Tensor> =
                        n.parents.iter().map(|&p| get(p)).collect::<Result<_>>()?;
                    let m = all.len() - 2;
                    let group = &self.siblings[n.id];
                    let needs: Vec<bool> =
                        (0..m).map(|i| group.iter().any(|&(_, j)| j == i)).collect();
                    let mut grads = guarded::run_vjp(k, op, &all[..m], all[m], all[m + 1], &needs)
                        .map_err(|e| e.at_node(n.id, || self.node_label(n.id)))?;
                    let mut take = |i: usize, shape: &[usize]| -> Result<Tensor> {
                        match grads.get_mut(i).and_then(Option::take) {
                            Some(g) => Ok(g),
                            None => Tensor::zeros_on(shape, self.profile.device),
                        }
                    };
                    for &(sib, j) in group.iter().filter(|&&(sib, _)| sib != n.id) {
                        let value = take(j, &self.graph.nodes[sib].shape)?;
                        slots[sib] = Some(value);
                    }
                    take(*input, &n.shape)?
                }
            };
            slots[n.id] = Some(out);
            self.release_after(n, &mut slots);
        }
        self.graph
            .outputs
            .iter()
            .map(|o| {
                slots[o.node]
                    .clone()
                    .map(|t| (o.name.clone(), t))
                    .ok_or_else(|| Error::Other(format!("output `{}` was not computed", o.name)))
            })
            .collect()
    }
}

/// A compiled training step: the captured forward + loss, its derived backward graph, planned
/// and gated once. Each run returns the loss and the gradient of every parameter by name.
pub struct CompiledStep {
    compiled: CompiledGraph,
    seed: Tensor,
    constants: HashMap<String, Tensor>,
    /// Input and parameter names, in the order `build` received them.
    input_names: Vec<String>,
    param_names: Vec<String>,
    /// Where each external value of the graph comes from (see `external_names`).
    sources: Vec<Source>,
    /// What each graph output is: the loss, or the gradient of parameter j.
    roles: Vec<Role>,
    /// Whether each external value changes from step to step (inputs and parameters).
    changing: Vec<bool>,
    /// Replay as a device graph (see `device_graph.rs`), when asked for.
    device_graph: super::device_graph::StepGraph,
}

/// The meaning of one output of a compiled step's graph.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Loss,
    Grad(usize),
    Other,
}

/// The origin of one input, parameter or constant value of a compiled step's graph.
#[derive(Debug, Clone)]
enum Source {
    Input(usize),
    Param(usize),
    Seed,
    Constant(Tensor),
}

/// Name of the loss output of a compiled step.
pub const LOSS: &str = "loss";

impl CompiledStep {
    /// Captures `loss_fn(inputs)` (which uses `params`), derives the backward graph, compiles.
    pub fn build(
        inputs: &[(String, Tensor)],
        params: &[(String, Tensor)],
        loss_fn: impl FnOnce(&[Tensor]) -> Result<Tensor>,
        profile: &BackendProfile,
    ) -> Result<CompiledStep> {
        let captured = super::capture::capture(inputs, params, |xs| {
            Ok(vec![(LOSS.to_string(), loss_fn(xs)?)])
        })?;
        let mut graph = captured.graph;
        let wrt: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        crate::graph::append_backward(&mut graph, LOSS, Some(&wrt))
            .map_err(|e| Error::Other(e.to_string()))?;
        let seed_shape = graph
            .parameters
            .iter()
            .find(|p| p.name == crate::graph::SEED)
            .map(|p| p.shape.clone())
            .unwrap_or_default();
        let param_names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        // constants (values the model built from data) and the seed live on the plan's
        // device, moved once here
        let constants: HashMap<String, Tensor> = captured
            .values
            .into_iter()
            .filter(|(n, _)| !param_names.contains(&n.as_str()))
            .map(|(n, t)| Ok((n, t.to_device(profile.device)?)))
            .collect::<Result<_>>()?;
        let compiled = CompiledGraph::compile(graph, profile)?;
        let seed = Tensor::full(&seed_shape, 1.0)?.to_device(profile.device)?;
        let sources: Vec<Source> = compiled
            .external_names()
            .into_iter()
            .map(|name| {
                if name == crate::graph::SEED {
                    Ok(Source::Seed)
                } else if let Some(i) = inputs.iter().position(|(n, _)| n == name) {
                    Ok(Source::Input(i))
                } else if let Some(j) = params.iter().position(|(n, _)| n == name) {
                    Ok(Source::Param(j))
                } else if let Some(c) = constants.get(name) {
                    Ok(Source::Constant(c.clone()))
                } else {
                    Err(Error::Other(format!(
                        "compiled step: no value for `{name}`"
                    )))
                }
            })
            .collect::<Result<_>>()?;
        let roles = compiled
            .graph()
            .outputs
            .iter()
            .map(|o| {
                if o.name == LOSS {
                    Role::Loss
                } else {
                    o.name
                        .strip_prefix("grad.")
                        .and_then(|p| params.iter().position(|(n, _)| n == p))
                        .map_or(Role::Other, Role::Grad)
                }
            })
            .collect();
        let changing = sources
            .iter()
            .map(|s| matches!(s, Source::Input(_) | Source::Param(_)))
            .collect();
        let device_graph =
            super::device_graph::StepGraph::off(profile.device, "not requested by the caller");
        Ok(CompiledStep {
            roles,
            changing,
            device_graph,
            compiled,
            seed,
            constants,
            input_names: inputs.iter().map(|(n, _)| n.clone()).collect(),
            param_names: param_names.iter().map(|n| n.to_string()).collect(),
            sources,
        })
    }

    /// [`CompiledStep::run_ordered`] with the parameters `visit` hands over (a model's
    /// current parameters, which must be the ones `build` captured, in the same order): the
    /// loss and the gradients keyed by parameter. Holds no reference to the parameters once
    /// it returns, so an optimizer can update them in place. (The runtime knows no model
    /// type: `nn` passes its `Module::visit_parameters` here.)
    pub fn run_visiting(
        &self,
        inputs: &[(String, Tensor)],
        visit: impl FnOnce(&mut dyn FnMut(&Tensor)),
    ) -> Result<(Tensor, super::Gradients)> {
        let mut params = Vec::with_capacity(self.param_names.len());
        visit(&mut |t| params.push(t.clone()));
        let (loss, grads) = self.run_ordered(inputs, &params)?;
        let mut out = super::Gradients::default();
        for (p, g) in params.iter().zip(grads) {
            if let Some(g) = g {
                out.insert(p, g);
            }
        }
        Ok((loss, out))
    }

    /// Runs forward and backward with the inputs and parameters given in the order `build`
    /// received them (checked by count and input names): the loss and, per parameter, its
    /// gradient (`None` where the loss does not depend on it). No name lookups per value.
    pub fn run_ordered(
        &self,
        inputs: &[(String, Tensor)],
        params: &[Tensor],
    ) -> Result<(Tensor, Vec<Option<Tensor>>)> {
        let names_match = inputs.len() == self.input_names.len()
            && inputs
                .iter()
                .zip(&self.input_names)
                .all(|((a, _), b)| a == b);
        if !names_match || params.len() != self.param_names.len() {
            return Err(Error::Other(format!(
                "compiled step: expected inputs {:?} and {} parameters, got inputs {:?} and {} parameters",
                self.input_names,
                self.param_names.len(),
                inputs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
                params.len()
            )));
        }
        let values = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Input(i) => inputs[*i].1.clone(),
                Source::Param(j) => params[*j].clone(),
                Source::Seed => self.seed.clone(),
                Source::Constant(t) => t.clone(),
            })
            .collect();
        let outputs = self
            .device_graph
            .run(&self.compiled, values, &self.changing)?;
        let mut loss = None;
        let mut grads: Vec<Option<Tensor>> = vec![None; params.len()];
        for (role, t) in self.roles.iter().zip(outputs) {
            match *role {
                Role::Loss => loss = Some(t),
                Role::Grad(j) => grads[j] = Some(t),
                Role::Other => {}
            }
        }
        Ok((
            loss.ok_or_else(|| Error::Other("the compiled step produced no loss".into()))?,
            grads,
        ))
    }

    pub fn compiled(&self) -> &CompiledGraph {
        &self.compiled
    }

    /// Asks for the step to be replayed as a device graph (CUDA Graphs) where the plan and
    /// the device allow it: recorded at the second run, replayed from then on (see
    /// [`super::device_graph`]). The caller promises to drop the loss and the gradients of a
    /// step before running the next one (a replay rewrites them in place, and refuses to run
    /// while one is still held). Without effect on the host.
    pub fn replay_as_device_graph(&mut self) {
        self.device_graph =
            super::device_graph::StepGraph::requested(&self.compiled, self.compiled.profile.device);
    }

    /// Whether the step is being replayed as a device graph.
    pub fn replays_device_graph(&self) -> bool {
        self.device_graph.replaying()
    }

    /// The report of what the step ran ([`CompiledGraph::ran_report`]: a composite's rows
    /// followed by the parts its calls ran), its executor line also saying how the step runs
    /// on a device (recorded and replayed as a device graph, or why not).
    pub fn report(&self) -> BackendReport {
        let mut report = self.compiled.ran_report();
        if self.compiled.profile.device != crate::backend::Device::Cpu {
            let line = self.device_graph.describe();
            report.executor = Some(match report.executor.take() {
                Some(e) => format!("{e}; {line}"),
                None => line,
            });
        }
        report
    }

    /// Runs forward and backward: returns the loss and `grad.<param>` tensors by param name.
    pub fn run(
        &self,
        inputs: &[(String, Tensor)],
        params: &[(String, &Tensor)],
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let outputs = self.compiled.run(|name| {
            if name == crate::graph::SEED {
                return Some(self.seed.clone());
            }
            inputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .or_else(|| {
                    params
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, t)| (*t).clone())
                })
                .or_else(|| self.constants.get(name).cloned())
        })?;
        let mut loss = None;
        let mut grads = vec![];
        for (name, t) in outputs {
            if name == LOSS {
                loss = Some(t);
            } else if let Some(p) = name.strip_prefix("grad.") {
                if params.iter().any(|(n, _)| n == p) {
                    grads.push((p.to_string(), t));
                }
            }
        }
        Ok((
            loss.ok_or_else(|| Error::Other("the compiled step produced no loss".into()))?,
            grads,
        ))
    }
}

/// What compiling a graph decides before any device is probed or kernel run: the graph as it
/// will execute (lowered: element-wise chains and convolution epilogues fused on the CPU), the
/// accepted plan (one kernel per op and vjp node) and the audits a report lists (a composite's
/// parts nested under it, planned and gated under the same profile). `torchlean plan --mode
/// compiled` prints exactly this, so a plan and a run of the same graph name the same capsules.
pub struct GraphPlan {
    graph: Graph,
    accepted: AcceptedGraphPlan,
    kernel_of: Vec<Option<usize>>,
    audits: Vec<crate::backend::KernelAudit>,
    composite: bool,
}

impl GraphPlan {
    /// The lowered graph the plan is for.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The report of the plan (no target line, no executor line: nothing was probed or built).
    pub fn report(&self, profile: &BackendProfile) -> BackendReport {
        BackendReport::new(
            profile,
            ExecutionMode::Compiled,
            self.audits.clone(),
            self.accepted.groups().to_vec(),
            vec![],
        )
    }
}

/// The lowering compiled mode applies before planning: on the CPU, element-wise chains and
/// convolution epilogues become fused nodes (their capsules are CPU kernels); elsewhere the
/// graph is unchanged.
fn lower(graph: Graph, device: crate::backend::Device) -> std::result::Result<Graph, GraphError> {
    if device != crate::backend::Device::Cpu {
        return Ok(graph);
    }
    let chains = crate::graph::fuse_elementwise(&graph)?.0;
    Ok(crate::graph::fuse_conv_epilogues(&chains)?.0)
}

/// Validates, lowers, plans and gates `graph` under `profile` over `registry`, with no device
/// probe and nothing run (see [`GraphPlan`]); [`CompiledGraph::compile_with_registry`] starts
/// here.
pub fn plan_graph(
    graph: Graph,
    profile: &BackendProfile,
    registry: &crate::backend::Registry,
) -> std::result::Result<GraphPlan, CompileError> {
    graph.validate()?;
    // lowering: a fused node gets its own capsule when planned
    let graph = lower(graph, profile.device)?;
    let has_vjp = graph
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Vjp { .. }));
    let request = PlanRequest {
        device: profile.device,
        preference: profile.preference,
        policy: profile.policy.clone(),
        vjp: if has_vjp { profile.vjp } else { VjpMode::None },
        mode: ExecutionMode::Compiled,
    };
    let availability = crate::module::availability();
    let mut by_kind: HashMap<OpKind, PlannedKernel> = HashMap::new();
    let mut errors = vec![];
    let mut kernels = vec![];
    let mut kernel_of = vec![None; graph.nodes.len()];
    for n in &graph.nodes {
        let op = match &n.kind {
            NodeKind::Op { op } | NodeKind::Vjp { op, .. } => op,
            _ => continue,
        };
        let kind = op.kind();
        let planned = match by_kind.entry(kind) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                match plan_op(registry, kind, &request, &availability) {
                    Ok(k) => v.insert(k),
                    Err(e) => {
                        if !errors.iter().any(|x: &PlanningError| x.op == kind) {
                            errors.push(e);
                        }
                        continue;
                    }
                }
            }
        };
        kernel_of[n.id] = Some(kernels.len());
        kernels.push(planned.clone());
    }
    if !errors.is_empty() {
        return Err(CompileError::Planning(errors));
    }
    let plan = ExecutionPlan {
        request: request.clone(),
        kernels,
    };
    let accepted = gate_plan(&plan).map_err(|r| CompileError::Rejected(Box::new(r)))?;
    let mut audits: Vec<_> = vec![];
    let mut composite = false;
    for k in accepted.kernels() {
        // one row per capsule among the plan's own kernels; a composite's part rows (which
        // may name the same capsule: a `sub` both in the graph and inside `mse_loss`) are
        // other rows, and must not hide the graph's
        if audits.iter().any(|a: &crate::backend::KernelAudit| {
            a.part_of.is_none() && a.capsule == k.audit().capsule
        }) {
            continue;
        }
        audits.push(k.audit().clone());
        // a composite's parts: planned and gated under this profile now, before any
        // kernel runs, for its forward (no tape) and its VJP (which re-runs them taped)
        let parts = &k.capsule().parts;
        if parts.is_empty() {
            continue;
        }
        composite = true;
        let mut modes = vec![VjpMode::None];
        if request.vjp != VjpMode::None {
            modes.push(request.vjp);
        }
        for vjp in modes {
            let part_request = PlanRequest {
                vjp,
                mode: ExecutionMode::Eager,
                ..request.clone()
            };
            let part_plan = crate::backend::plan_ops(registry, parts, &part_request, &availability)
                .map_err(CompileError::Planning)?;
            let part_accepted =
                gate_plan(&part_plan).map_err(|r| CompileError::Rejected(Box::new(r)))?;
            for pk in part_accepted.kernels() {
                let mut a = pk.audit().clone();
                a.part_of = Some(k.capsule().name.clone());
                if !audits.contains(&a) {
                    audits.push(a);
                }
            }
        }
    }
    Ok(GraphPlan {
        graph,
        accepted,
        kernel_of,
        audits,
        composite,
    })
}
