//! Derives the backward graph from the VJP rules: for a scalar output, appends one `vjp` node
//! per (differentiable node, input that leads to an input or parameter), `add` nodes where
//! cotangents meet, and outputs `grad.<name>` for every input and parameter reached.

use super::ir::{Graph, GraphError, NodeKind, OutputDecl, ValueDecl};
use super::op::Op;

/// Name of the constant holding the seed cotangent (1.0) of a scalar output.
pub const SEED: &str = "grad.seed";

/// Which nodes depend on an input or a parameter (of `wrt`, when given) and so carry a
/// gradient, by position in `g.nodes` (a parent that is not an earlier node, in a graph that
/// was never validated, carries none).
pub fn depends_on_leaves(g: &Graph, wrt: Option<&[&str]>) -> Vec<bool> {
    let mut dep: Vec<bool> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let reached = |dep: &[bool]| n.parents.iter().any(|&p| dep.get(p) == Some(&true));
        let d = match &n.kind {
            NodeKind::Input { name } | NodeKind::Parameter { name } => {
                wrt.is_none_or(|w| w.contains(&name.as_str()))
            }
            NodeKind::Constant { .. } => false,
            NodeKind::Op { op } => op.kind().differentiable() && reached(&dep),
            NodeKind::Vjp { .. } => reached(&dep),
        };
        dep.push(d);
    }
    dep
}

/// Appends the backward graph of output `loss` (which must be a one-element node) and
/// returns the names of the gradient outputs it added: one per input and parameter reached,
/// or only those listed in `wrt` (then no work is spent on the others). The seed cotangent
/// is a constant named [`SEED`] of the loss's shape whose value (1.0) the caller provides.
pub fn append_backward(
    g: &mut Graph,
    loss: &str,
    wrt: Option<&[&str]>,
) -> Result<Vec<String>, GraphError> {
    // the names added below must not collide with (and silently replace) the user's
    g.check_user_names()?;
    // the graph's fields are public: one built by hand is validated here like a loaded one
    // (node ids, parents before children, shapes) before any node is indexed
    g.validate()?;
    let root = g
        .output(loss)
        .ok_or_else(|| GraphError::Other(format!("no output named `{loss}`")))?;
    let shape = g.nodes[root].shape.clone();
    if shape.iter().product::<usize>() != 1 {
        return Err(GraphError::Other(format!(
            "backward needs a one-element output, `{loss}` has shape {shape:?}"
        )));
    }
    let dep = depends_on_leaves(g, wrt);
    g.parameters.push(ValueDecl {
        name: SEED.into(),
        shape,
    });
    let seed = g.push(NodeKind::Constant { name: SEED.into() }, vec![])?;
    let forward_len = root + 1;
    let mut cot: Vec<Option<usize>> = vec![None; forward_len];
    cot[root] = Some(seed);
    for id in (0..forward_len).rev() {
        let Some(c) = cot[id] else { continue };
        let node = g.nodes[id].clone();
        let NodeKind::Op { op } = &node.kind else {
            continue;
        };
        if !dep[id] {
            continue;
        }
        for (i, &p) in node.parents.iter().enumerate() {
            if !dep[p] {
                continue;
            }
            let mut parents = node.parents.clone();
            parents.extend([id, c]);
            let gi = g.push(
                NodeKind::Vjp {
                    op: op.clone(),
                    input: i,
                },
                parents,
            )?;
            cot[p] = Some(match cot[p] {
                None => gi,
                Some(prev) => g.push(NodeKind::Op { op: Op::Add }, vec![prev, gi])?,
            });
        }
    }
    let mut names = vec![];
    let forward: Vec<_> = g.nodes[..forward_len]
        .iter()
        .map(|n| (n.id, n.kind.clone()))
        .collect();
    for (id, kind) in forward {
        let name = match kind {
            NodeKind::Input { name } | NodeKind::Parameter { name } => name,
            _ => continue,
        };
        if let (Some(c), true) = (cot[id], dep[id]) {
            let out = format!("grad.{name}");
            g.outputs.push(OutputDecl {
                name: out.clone(),
                node: c,
            });
            names.push(out);
        }
    }
    Ok(names)
}
