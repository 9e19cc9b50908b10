//! The compiled executor's dense path: a static memory plan over raw buffers.
//!
//! When every op and vjp node of an accepted graph plan has destination-passing kernels
//! (see [`super::kernel::DenseKernels`]), [`DensePlan::build`] turns the graph into a list of
//! steps over numbered buffers, once:
//!
//! - every computed value gets a buffer; a buffer whose value is dead (after its last reader)
//!   goes back to a free list and is reused by the next value of the same size;
//! - a one-input map whose input dies at that node runs in place, in its input's buffer;
//! - the vjp nodes that share an op node and cotangent (siblings) are one step that writes
//!   all of their cotangents.
//!
//! Running the plan then creates no tensors and allocates nothing between the graph's inputs
//! and outputs: inputs and parameters are read where the caller keeps them, buffers persist
//! between runs, and only the graph outputs become tensors (their buffers come back through
//! [`DensePlan::give_back`]). Kernel order and arithmetic are the same as the general
//! executor's, so results are bit-identical to it.

use super::buffers::PoolStats;
use super::guarded;
use super::kernel::{Dense, ForwardIntoKernel, InPlaceIntoKernel, VjpIntoKernel};
use crate::backend::{AcceptedKernel, Call, Phase};
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeKind, Op};
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

/// The most operands a dense step passes (inputs of an op; a vjp's inputs come on top of
/// its output and cotangent). Graphs with wider nodes use the general executor.
const MAX_INPUTS: usize = 4;

/// Where a node's value lives during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    /// Supplied by the caller: index into the plan's external list.
    External(usize),
    /// One of the plan's buffers.
    Buffer(usize),
}

enum Step {
    Forward {
        op: Op,
        /// Index of the accepted kernel (its guards and checkers run around the step).
        accepted: usize,
        node: usize,
        kernel: ForwardIntoKernel,
        inputs: Vec<usize>,
        out: usize,
    },
    InPlace {
        op: Op,
        accepted: usize,
        node: usize,
        kernel: InPlaceIntoKernel,
        buf: usize,
    },
    Vjp {
        op: Op,
        accepted: usize,
        kernel: VjpIntoKernel,
        /// The op node's inputs, then its output, then the cotangent (node ids).
        operands: Vec<usize>,
        /// The buffer of each input's cotangent, where one is computed.
        outs: Vec<Option<usize>>,
    },
}

impl Step {
    /// The graph node the step computes (a VJP step: its op node) and a short label.
    fn node(&self) -> (usize, String) {
        match self {
            Step::Forward { op, node, .. } | Step::InPlace { op, node, .. } => {
                (*node, format!("`{}`", op.name()))
            }
            Step::Vjp { op, operands, .. } => (
                operands[operands.len().saturating_sub(2)],
                format!("the VJP of `{}`", op.name()),
            ),
        }
    }
}

#[derive(Default)]
struct State {
    buffers: Vec<Vec<f32>>,
    /// Output storage handed back by the caller, by length.
    spare: HashMap<usize, Vec<Vec<f32>>>,
    stats: PoolStats,
}

/// A graph lowered to steps over a static set of buffers (see the module documentation).
pub(crate) struct DensePlan {
    steps: Vec<Step>,
    home: Vec<Home>,
    shapes: Vec<Vec<usize>>,
    buffer_sizes: Vec<usize>,
    /// The caller-supplied values: (node, name).
    externals: Vec<(usize, String)>,
    outputs: Vec<(String, usize)>,
    state: Mutex<State>,
}

/// The buffers of a plan, assigned while lowering: a value takes a free buffer of its
/// element count, or a new one; a dead value's buffer becomes free.
#[derive(Default)]
struct BufferAssignment {
    /// Element count of every buffer, by number.
    sizes: Vec<usize>,
    /// Free buffers by element count.
    free: HashMap<usize, Vec<usize>>,
}

impl BufferAssignment {
    fn take(&mut self, size: usize) -> usize {
        match self.free.get_mut(&size).and_then(Vec::pop) {
            Some(b) => b,
            None => {
                self.sizes.push(size);
                self.sizes.len() - 1
            }
        }
    }

    fn release(&mut self, buffer: usize) {
        self.free
            .entry(self.sizes[buffer])
            .or_default()
            .push(buffer);
    }
}

impl DensePlan {
    /// Lowers `graph` whose node `n` runs `kernels[kernel_of[n]]`; `Err(why)` when some node
    /// has no destination-passing kernel (or more operands than a dense step passes).
    pub(crate) fn build(
        graph: &Graph,
        kernels: &[AcceptedKernel],
        kernel_of: &[Option<usize>],
        last_use: &[usize],
        siblings: &[Vec<(usize, usize)>],
    ) -> std::result::Result<DensePlan, String> {
        let n = graph.nodes.len();
        let sizes = graph.node_elements();
        let mut home: Vec<Option<Home>> = vec![None; n];
        let mut externals = vec![];
        let mut buffers = BufferAssignment::default();
        let mut steps = vec![];
        // the freeing is applied after each node's step, from this list
        let mut dies_at: Vec<Vec<usize>> = vec![vec![]; n];
        for (v, &lu) in last_use.iter().enumerate() {
            if lu < n {
                dies_at[lu].push(v);
            }
        }
        let mut moved = vec![false; n]; // an in-place step took this value's buffer
        for node in &graph.nodes {
            let id = node.id;
            match &node.kind {
                NodeKind::Input { name }
                | NodeKind::Parameter { name }
                | NodeKind::Constant { name } => {
                    home[id] = Some(Home::External(externals.len()));
                    externals.push((id, name.clone()));
                }
                NodeKind::Op { op } => {
                    let dense = dense_of(kernels, kernel_of, id)?;
                    let accepted = kernel_index(kernel_of, id)?;
                    // a checker replays the call on its inputs: those must survive it
                    let checked = !kernels[accepted].checkers(Phase::Forward).is_empty();
                    if node.parents.len() > MAX_INPUTS {
                        return Err(format!(
                            "node {id} has {} inputs (a dense step passes at most {MAX_INPUTS})",
                            node.parents.len()
                        ));
                    }
                    let in_place = match (dense.in_place_into, node.parents.as_slice()) {
                        (Some(k), &[p]) if last_use[p] == id && !checked => match home[p] {
                            Some(Home::Buffer(b)) => Some((k, b, p)),
                            _ => None,
                        },
                        _ => None,
                    };
                    match in_place {
                        Some((kernel, buf, p)) => {
                            moved[p] = true;
                            home[id] = Some(Home::Buffer(buf));
                            steps.push(Step::InPlace {
                                op: op.clone(),
                                accepted,
                                node: id,
                                kernel,
                                buf,
                            });
                        }
                        None => {
                            let out = buffers.take(sizes[id]);
                            home[id] = Some(Home::Buffer(out));
                            steps.push(Step::Forward {
                                op: op.clone(),
                                accepted,
                                node: id,
                                kernel: dense.forward_into,
                                inputs: node.parents.clone(),
                                out,
                            });
                        }
                    }
                }
                NodeKind::Vjp { op, .. } => {
                    if home[id].is_none() {
                        let dense = dense_of(kernels, kernel_of, id)?;
                        let kernel = dense.vjp_into.ok_or_else(|| {
                            format!(
                                "capsule `{}` has no vjp_into kernel",
                                capsule_of(kernels, kernel_of, id)
                            )
                        })?;
                        let m = node.parents.len().saturating_sub(2);
                        if m > MAX_INPUTS || node.parents.len() < 2 {
                            return Err(format!(
                                "vjp node {id} has {} operands (a dense step passes at most {MAX_INPUTS} inputs)",
                                node.parents.len()
                            ));
                        }
                        let mut outs = vec![None; m];
                        for &(sib, j) in &siblings[id] {
                            let b = buffers.take(sizes[sib]);
                            home[sib] = Some(Home::Buffer(b));
                            *outs.get_mut(j).ok_or_else(|| {
                                format!("vjp node {sib} names input {j} of a {m}-input op")
                            })? = Some(b);
                        }
                        steps.push(Step::Vjp {
                            op: op.clone(),
                            accepted: kernel_index(kernel_of, id)?,
                            kernel,
                            operands: node.parents.clone(),
                            outs,
                        });
                    }
                }
            }
            for &v in &dies_at[id] {
                if let (Some(Home::Buffer(b)), false) = (home[v], moved[v]) {
                    buffers.release(b);
                }
            }
        }
        Ok(DensePlan {
            steps,
            home: home
                .into_iter()
                .enumerate()
                .map(|(i, h)| h.ok_or_else(|| format!("node {i} has no value location")))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            shapes: graph.nodes.iter().map(|n| n.shape.clone()).collect(),
            buffer_sizes: buffers.sizes,
            externals,
            outputs: graph
                .outputs
                .iter()
                .map(|o| (o.name.clone(), o.node))
                .collect(),
            state: Mutex::new(State::default()),
        })
    }

    /// Number of buffers of the plan (distinct from graph values: reuse by liveness).
    pub(crate) fn buffer_count(&self) -> usize {
        self.buffer_sizes.len()
    }

    /// Number of steps (kernel calls) per run.
    pub(crate) fn step_count(&self) -> usize {
        self.steps.len()
    }

    /// Number of steps that run in place, in their input's buffer.
    pub(crate) fn in_place_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::InPlace { .. }))
            .count()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.state.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// Takes back output storage the caller is done with (tensors it owns alone).
    pub(crate) fn give_back(&self, tensors: impl IntoIterator<Item = Tensor>) {
        if let Ok(mut s) = self.state.lock() {
            for t in tensors {
                if let Some(v) = t.into_storage() {
                    s.stats.recycled += 1;
                    s.spare.entry(v.len()).or_default().push(v);
                }
            }
        }
    }

    /// Runs the steps; `ext[k]` is the value of the graph's k-th input, parameter or
    /// constant node (in node order); each must have its declared shape.
    pub(crate) fn run_ordered(
        &self,
        kernels: &[AcceptedKernel],
        ext: Vec<Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        let outs = self.run_outputs(kernels, ext)?;
        Ok(self
            .outputs
            .iter()
            .zip(outs)
            .map(|((name, _), t)| (name.clone(), t))
            .collect())
    }

    /// [`DensePlan::run_ordered`], returning the outputs in the graph's output order, unnamed.
    /// `kernels` are the accepted kernels the plan was built from (their guards and checkers
    /// run around every step).
    pub(crate) fn run_outputs(
        &self,
        kernels: &[AcceptedKernel],
        ext: Vec<Tensor>,
    ) -> Result<Vec<Tensor>> {
        if ext.len() != self.externals.len() {
            return Err(Error::Other(format!(
                "the graph reads {} inputs, parameters and constants; {} were supplied",
                self.externals.len(),
                ext.len()
            )));
        }
        for ((node, name), t) in self.externals.iter().zip(&ext) {
            if t.shape() != self.shapes[*node].as_slice() {
                return Err(Error::Other(format!(
                    "value `{name}` has shape {:?}, the graph declares {:?}",
                    t.shape(),
                    self.shapes[*node]
                )));
            }
        }
        let ext_data: Vec<Cow<[f32]>> = ext.iter().map(|t| t.host_data()).collect();
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *guard;
        state.buffers.resize_with(self.buffer_sizes.len(), Vec::new);
        for (buf, &size) in state.buffers.iter_mut().zip(&self.buffer_sizes) {
            if buf.len() == size {
                state.stats.reused += 1;
            } else if let Some(v) = state.spare.get_mut(&size).and_then(Vec::pop) {
                state.stats.reused += 1;
                *buf = v;
            } else {
                state.stats.allocated += 1;
                *buf = super::buffers::try_filled(size, 0.0, "a buffer of the compiled plan")?;
            }
        }
        for step in &self.steps {
            // the step's node names itself in an error (CompiledGraph adds what it reads)
            self.run_step(kernels, step, &mut state.buffers, &ext_data)
                .map_err(|e| {
                    let (node, what) = step.node();
                    e.at_node(node, || what)
                })?;
        }
        let mut out: Vec<Tensor> = Vec::with_capacity(self.outputs.len());
        for (k, (_, node)) in self.outputs.iter().enumerate() {
            // an output listed twice shares its tensor
            let earlier = self.outputs[..k].iter().position(|(_, n)| n == node);
            let t = match (earlier, self.home[*node]) {
                (Some(j), _) => out[j].clone(),
                (None, Home::External(i)) => ext[i].clone(),
                (None, Home::Buffer(b)) => Tensor::from_parts(
                    std::mem::take(&mut state.buffers[b]),
                    self.shapes[*node].clone(),
                ),
            };
            out.push(t);
        }
        Ok(out)
    }

    fn run_step(
        &self,
        kernels: &[AcceptedKernel],
        step: &Step,
        buffers: &mut [Vec<f32>],
        ext: &[Cow<[f32]>],
    ) -> Result<()> {
        match step {
            Step::InPlace {
                op,
                accepted,
                node,
                kernel,
                buf,
            } => {
                let k = &kernels[*accepted];
                let shape = &self.shapes[*node];
                guarded::guard(
                    k,
                    Phase::Forward,
                    op,
                    &[guarded::dense_operand(&buffers[*buf], shape)],
                )?;
                // (no checkers here: a kernel with checkers never runs in place)
                kernel(op, shape, &mut buffers[*buf])
            }
            Step::Forward {
                op,
                accepted,
                node,
                kernel,
                inputs,
                out,
            } => {
                let k = &kernels[*accepted];
                let mut target = std::mem::take(&mut buffers[*out]);
                let result = {
                    let mut xs = [Dense::EMPTY; MAX_INPUTS];
                    for (slot, &p) in xs.iter_mut().zip(inputs) {
                        *slot = self.view(p, buffers, ext);
                    }
                    let xs = &xs[..inputs.len()];
                    let mut operands = [guarded::dense_operand(&[], &[]); MAX_INPUTS];
                    for (o, d) in operands.iter_mut().zip(xs) {
                        *o = guarded::dense_operand(d.data, d.shape);
                    }
                    let operands = &operands[..inputs.len()];
                    guarded::guard(k, Phase::Forward, op, operands)
                        .and_then(|()| kernel(op, xs, &mut target))
                        .and_then(|()| {
                            if k.checkers(Phase::Forward).is_empty() {
                                return Ok(());
                            }
                            let call = Call {
                                inputs: operands,
                                output: guarded::dense_operand(&target, &self.shapes[*node]),
                                cotangent: None,
                                needs: &[],
                                grads: &[],
                                seed: guarded::next_seed(),
                            };
                            guarded::check(k, Phase::Forward, op, &call)
                        })
                };
                buffers[*out] = target;
                result
            }
            Step::Vjp {
                op,
                accepted,
                kernel,
                operands,
                outs,
            } => {
                let k = &kernels[*accepted];
                let m = outs.len();
                let mut targets: [Vec<f32>; MAX_INPUTS] = Default::default();
                for (t, o) in targets.iter_mut().zip(outs) {
                    if let Some(b) = o {
                        *t = std::mem::take(&mut buffers[*b]);
                    }
                }
                let result = {
                    let mut xs = [Dense::EMPTY; MAX_INPUTS];
                    for (slot, &p) in xs.iter_mut().zip(&operands[..m]) {
                        *slot = self.view(p, buffers, ext);
                    }
                    let y = self.view(operands[m], buffers, ext);
                    let g = self.view(operands[m + 1], buffers, ext);
                    let mut ins = [guarded::dense_operand(&[], &[]); MAX_INPUTS];
                    for (o, d) in ins.iter_mut().zip(&xs[..m]) {
                        *o = guarded::dense_operand(d.data, d.shape);
                    }
                    guarded::guard(k, Phase::Vjp, op, &ins[..m])?;
                    let mut dst: [Option<&mut [f32]>; MAX_INPUTS] = Default::default();
                    for ((d, t), o) in dst.iter_mut().zip(targets.iter_mut()).zip(outs) {
                        if o.is_some() {
                            *d = Some(t.as_mut_slice());
                        }
                    }
                    kernel(op, &xs[..m], y, g, &mut dst[..m]).and_then(|()| {
                        if k.checkers(Phase::Vjp).is_empty() {
                            return Ok(());
                        }
                        let mut grads = [None; MAX_INPUTS];
                        for ((gr, t), (o, x)) in grads
                            .iter_mut()
                            .zip(targets.iter())
                            .zip(outs.iter().zip(&xs[..m]))
                        {
                            if o.is_some() {
                                *gr = Some(guarded::dense_operand(t, x.shape));
                            }
                        }
                        let needs: [bool; MAX_INPUTS] =
                            std::array::from_fn(|i| outs.get(i).is_some_and(Option::is_some));
                        let call = Call {
                            inputs: &ins[..m],
                            output: guarded::dense_operand(y.data, y.shape),
                            cotangent: Some(guarded::dense_operand(g.data, g.shape)),
                            needs: &needs[..m],
                            grads: &grads[..m],
                            seed: guarded::next_seed(),
                        };
                        guarded::check(k, Phase::Vjp, op, &call)
                    })
                };
                for (t, o) in targets.into_iter().zip(outs) {
                    if let Some(b) = o {
                        buffers[*b] = t;
                    }
                }
                result
            }
        }
    }

    /// The dense view of node `p`'s value.
    fn view<'a>(&'a self, p: usize, buffers: &'a [Vec<f32>], ext: &'a [Cow<[f32]>]) -> Dense<'a> {
        let data: &[f32] = match self.home[p] {
            Home::External(i) => &ext[i],
            Home::Buffer(b) => &buffers[b],
        };
        Dense {
            data,
            shape: &self.shapes[p],
        }
    }
}

/// The capsule name of node `id`'s kernel (for messages).
fn capsule_of(kernels: &[AcceptedKernel], kernel_of: &[Option<usize>], id: usize) -> String {
    kernel_of[id]
        .map(|k| kernels[k].capsule().name.clone())
        .unwrap_or_else(|| "?".into())
}

/// The index of node `id`'s accepted kernel.
fn kernel_index(kernel_of: &[Option<usize>], id: usize) -> std::result::Result<usize, String> {
    kernel_of[id].ok_or_else(|| format!("node {id} has no accepted kernel"))
}

/// The destination-passing kernels of node `id`'s accepted capsule.
fn dense_of(
    kernels: &[AcceptedKernel],
    kernel_of: &[Option<usize>],
    id: usize,
) -> std::result::Result<super::kernel::DenseKernels, String> {
    let k = kernel_index(kernel_of, id)?;
    let binding = super::kernel::cpu_binding(&kernels[k]).map_err(|e| e.to_string())?;
    binding.dense().ok_or_else(|| {
        format!(
            "capsule `{}` has no destination-passing kernels",
            kernels[k].capsule().name
        )
    })
}
