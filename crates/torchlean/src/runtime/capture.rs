//! Capture: run a model once, eagerly, and record its forward graph.
//!
//! Inputs become fresh tracked leaves, parameters are recognized by identity, and every op
//! run while capturing is recorded (differentiable or not). Walking the recorded links from
//! the outputs gives the graph in SSA order; any other leaf reached (a tensor the model built
//! from data, e.g. a causal mask) becomes a named constant whose value is returned beside the
//! graph. Shapes are those of this run: a captured graph is for fixed input shapes.
//!
//! **Traced values never leave the graph.** While `f` runs, model code that reads a traced
//! value on the host (`data`, `to_vec`, `item`, `get`), cuts it from the tape (`detach`,
//! `contiguous`) or feeds it to an op under `no_grad` would turn this run's data into a
//! constant of the graph, which every replay would then reuse (the way a first batch's token
//! ids were once frozen into a compiled transformer). Capture refuses it: the first such
//! access is remembered and capture returns [`Error::CaptureLeak`] naming it. Kernels reading
//! their own inputs are not model code and are exempt (see `autograd::KernelScope`).

use super::autograd::CaptureGuard;
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeKind, OutputDecl, ValueDecl};
use crate::tensor::{Tensor, TensorId};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    /// The first leak of a traced value out of the capture running on this thread.
    static LEAK: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Records that model code accessed the traced tensor `t` with `access` during a capture
/// (a no-op outside captures, inside kernels, and for untraced tensors).
pub(crate) fn note_host_access(t: &Tensor, access: &str) {
    if !t.is_tracked() || !super::autograd::in_capture_model_code() {
        return;
    }
    let producer = match t.grad_fn() {
        Some(node) => format!("produced by op `{}`", node.op.name()),
        None => "an input or parameter of the captured function".to_string(),
    };
    LEAK.with(|l| {
        let mut l = l.borrow_mut();
        if l.is_none() {
            *l = Some(Error::CaptureLeak {
                access: access.to_string(),
                producer,
            });
        }
    });
}

/// A captured graph and the values of its parameters and constants.
pub struct Captured {
    pub graph: Graph,
    /// Parameter and constant values by name (what a params file holds).
    pub values: Vec<(String, Tensor)>,
}

/// Captures `f` applied to `inputs` (named), with `params` (named, by identity) as parameters.
/// `f` returns the named outputs.
pub fn capture(
    inputs: &[(String, Tensor)],
    params: &[(String, Tensor)],
    f: impl FnOnce(&[Tensor]) -> Result<Vec<(String, Tensor)>>,
) -> Result<Captured> {
    for (what, list) in [("input", inputs), ("parameter", params)] {
        for (name, _) in list {
            crate::graph::check_user_name(what, name).map_err(|e| Error::Other(e.to_string()))?;
        }
    }
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|(_, t)| t.detach().requires_grad())
        .collect();
    let previous_leak = LEAK.with(|l| l.borrow_mut().take());
    let outputs = {
        let _capture = CaptureGuard::new();
        f(&leaves)
    };
    let leak = LEAK.with(|l| std::mem::replace(&mut *l.borrow_mut(), previous_leak));
    if let Some(leak) = leak {
        // the leak explains a later failure of `f` too (e.g. a shape built from read values)
        return Err(leak);
    }
    let outputs = outputs?;
    let mut graph = Graph::new();
    let mut named: HashMap<TensorId, NodeKind> = HashMap::new();
    for ((name, t), leaf) in inputs.iter().zip(&leaves) {
        graph.inputs.push(ValueDecl {
            name: name.clone(),
            shape: t.shape().to_vec(),
        });
        named.insert(leaf.id(), NodeKind::Input { name: name.clone() });
    }
    let mut values = vec![];
    for (name, t) in params {
        graph.parameters.push(ValueDecl {
            name: name.clone(),
            shape: t.shape().to_vec(),
        });
        named.insert(t.id(), NodeKind::Parameter { name: name.clone() });
        values.push((name.clone(), t.detach()));
    }
    let mut node_of: HashMap<TensorId, usize> = HashMap::new();
    for (name, out) in &outputs {
        let node = add_tensor(&mut graph, &mut node_of, &named, &mut values, out)?;
        graph.outputs.push(OutputDecl {
            name: name.clone(),
            node,
        });
    }
    graph
        .validate()
        .map_err(|e| Error::Other(format!("capture produced an invalid graph: {e}")))?;
    Ok(Captured { graph, values })
}

/// Adds `t` and everything it depends on (iterative post-order), returning its node id.
fn add_tensor(
    graph: &mut Graph,
    node_of: &mut HashMap<TensorId, usize>,
    named: &HashMap<TensorId, NodeKind>,
    values: &mut Vec<(String, Tensor)>,
    root: &Tensor,
) -> Result<usize> {
    let mut stack = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if node_of.contains_key(&t.id()) {
            continue;
        }
        let recorded = t.grad_fn().filter(|_| !named.contains_key(&t.id()));
        match recorded {
            Some(node) if !expanded => {
                let inputs = node.inputs.clone();
                stack.push((t, true));
                for i in inputs.into_iter().rev() {
                    if !node_of.contains_key(&i.id()) {
                        stack.push((i, false));
                    }
                }
            }
            Some(node) => {
                let parents = node.inputs.iter().map(|i| node_of[&i.id()]).collect();
                let id = graph
                    .push(
                        NodeKind::Op {
                            op: node.op.clone(),
                        },
                        parents,
                    )
                    .map_err(|e| Error::Other(e.to_string()))?;
                node_of.insert(t.id(), id);
            }
            None => {
                let kind = match named.get(&t.id()) {
                    Some(k) => k.clone(),
                    None => {
                        // a fresh name: a parameter may itself be called `const.0`
                        let mut k = values.len();
                        let name = loop {
                            let candidate = format!("const.{k}");
                            if !graph.parameters.iter().any(|p| p.name == candidate)
                                && !graph.inputs.iter().any(|p| p.name == candidate)
                            {
                                break candidate;
                            }
                            k += 1;
                        };
                        graph.parameters.push(ValueDecl {
                            name: name.clone(),
                            shape: t.shape().to_vec(),
                        });
                        values.push((name.clone(), t.detach()));
                        NodeKind::Constant { name }
                    }
                };
                let id = graph
                    .push(kind, vec![])
                    .map_err(|e| Error::Other(e.to_string()))?;
                node_of.insert(t.id(), id);
            }
        }
    }
    Ok(node_of[&root.id()])
}
