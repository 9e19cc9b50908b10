//! Elementwise fusion, a lowering step of its own: maximal chains of elementwise op nodes
//! become one node, planned like any op — with its own capsule and evidence (the conformance
//! harness checks the fused kernel against the composition of its parts). A chain of unary
//! maps becomes `fused_unary`; a chain with binary maps whose other operand broadcasts onto
//! the running value (a batch norm's per-channel shift, scale and bias, a bias, a residual)
//! becomes `fused_map`, those operands its side inputs. A chain only grows through a node whose value nobody else needs: exactly one
//! consumer, not a graph output, not read by a `vjp` node (a backward pass needs the
//! intermediate values, so training graphs keep them).

use super::ir::{Graph, GraphError, NodeKind, OutputDecl};
use super::op::{FusedStep, Op, SideOperand};

/// A fused chain: the node ids it replaced (in order) and the id of the fused node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedChain {
    pub replaced: Vec<usize>,
    pub node: usize,
}

/// The graph with every fusable chain of two or more unary maps fused.
pub fn fuse_elementwise(g: &Graph) -> Result<(Graph, Vec<FusedChain>), GraphError> {
    let n = g.nodes.len();
    let mut consumers = vec![0usize; n];
    let mut pinned = vec![false; n]; // outputs and values a vjp node reads
    for node in &g.nodes {
        for &p in &node.parents {
            consumers[p] += 1;
            if matches!(node.kind, NodeKind::Vjp { .. }) {
                pinned[p] = true;
            }
        }
    }
    for o in &g.outputs {
        pinned[o.node] = true;
    }
    let unary =
        |id: usize| matches!(&g.nodes[id].kind, NodeKind::Op { op } if op.kind().is_unary_map());
    // a binary map whose value (the operand that `value` names) keeps its shape: the other
    // operand becomes a side input of a `fused_map`
    let binary_on = |id: usize, value: usize| {
        let node = &g.nodes[id];
        matches!(&node.kind, NodeKind::Op { op } if op.kind().is_binary_map())
            && node.parents.len() == 2
            && node.parents.iter().filter(|&&p| p == value).count() == 1
            && node.shape == g.nodes[value].shape
    };
    // the single consumer of each node, when there is exactly one
    let mut only_consumer = vec![None; n];
    for node in &g.nodes {
        for &p in &node.parents {
            if consumers[p] == 1 {
                only_consumer[p] = Some(node.id);
            }
        }
    }
    // chains, found from their first node, with the value each node reads
    let mut in_chain = vec![false; n];
    let mut chains: Vec<Vec<(usize, usize)>> = vec![];
    for id in 0..n {
        if in_chain[id] {
            continue;
        }
        let start = if unary(id) {
            g.nodes[id].parents[0]
        } else {
            match g.nodes[id].parents.iter().find(|&&p| binary_on(id, p)) {
                Some(&p) => p,
                None => continue,
            }
        };
        let mut chain = vec![(id, start)];
        let mut last = id;
        while !pinned[last] {
            match only_consumer[last] {
                // (a binary node has two parents: it may end two candidate chains, and
                // joins the first)
                Some(c) if !in_chain[c] && (unary(c) || binary_on(c, last)) => {
                    chain.push((c, last));
                    last = c;
                }
                _ => break,
            }
        }
        if chain.len() >= 2 {
            chain.iter().for_each(|&(c, _)| in_chain[c] = true);
            chains.push(chain);
        }
    }
    // rebuild with the chains collapsed onto their last node
    let mut out = Graph {
        nodes: vec![],
        outputs: vec![],
        ..g.clone()
    };
    let mut new_id: Vec<Option<usize>> = vec![None; n];
    let mut chain_of_last = vec![None; n];
    for (k, c) in chains.iter().enumerate() {
        // invariant: only chains of two or more nodes are kept above
        chain_of_last[c.last().expect("chains have two or more nodes").0] = Some(k);
    }
    let mut fused = vec![];
    for node in &g.nodes {
        if in_chain[node.id] && chain_of_last[node.id].is_none() {
            continue; // absorbed into the chain's fused node
        }
        let map = |p: usize| {
            new_id[p]
                .ok_or_else(|| GraphError::Other(format!("fusion: node {p} has no replacement")))
        };
        let id = match chain_of_last[node.id] {
            Some(k) => {
                let chain = &chains[k];
                let (kind, parents) = fused_node(g, chain, &map)?;
                let id = out.push(kind, parents)?;
                fused.push(FusedChain {
                    replaced: chain.iter().map(|&(c, _)| c).collect(),
                    node: id,
                });
                id
            }
            None => {
                let parents = node
                    .parents
                    .iter()
                    .map(|&p| map(p))
                    .collect::<Result<Vec<_>, _>>()?;
                out.push(node.kind.clone(), parents)?
            }
        };
        new_id[node.id] = Some(id);
    }
    for o in &g.outputs {
        let node = new_id[o.node].ok_or_else(|| {
            GraphError::Other(format!("fusion: output `{}` lost its node", o.name))
        })?;
        out.outputs.push(OutputDecl {
            name: o.name.clone(),
            node,
        });
    }
    Ok((out, fused))
}

/// The fused node of `chain` (nodes with the value each reads, in order) and its parents
/// (through `map`, old ids to new): `fused_unary` over the first value when every step is
/// unary, else `fused_map` over it with each binary step's other operand as a side input.
fn fused_node(
    g: &Graph,
    chain: &[(usize, usize)],
    map: &impl Fn(usize) -> Result<usize, GraphError>,
) -> Result<(NodeKind, Vec<usize>), GraphError> {
    let mut steps = vec![];
    let mut parents = vec![map(chain[0].1)?];
    for &(id, value) in chain {
        let node = &g.nodes[id];
        let NodeKind::Op { op } = &node.kind else {
            unreachable!("chains hold op nodes only")
        };
        let side = if op.kind().is_unary_map() {
            None
        } else {
            let (at, other) = if node.parents[0] == value {
                (SideOperand::Right, node.parents[1])
            } else {
                (SideOperand::Left, node.parents[0])
            };
            parents.push(map(other)?);
            Some(at)
        };
        steps.push(FusedStep {
            op: op.clone(),
            side,
        });
    }
    let op = if steps.iter().all(|s| s.side.is_none()) {
        Op::FusedUnary {
            ops: steps.into_iter().map(|s| s.op).collect(),
        }
    } else {
        Op::FusedMap { steps }
    };
    Ok((NodeKind::Op { op }, parents))
}

/// The graph with each `conv2d` whose value only feeds an epilogue — a `fused_map`, a
/// `fused_unary` of relus, or one relu, add, sub or mul over it (the other operand broadcast
/// onto it) — merged with it into one `conv2d_map` node (run after [`fuse_elementwise`], so
/// the epilogue is already one node). Only epilogue steps qualify (`spec::is_epilogue_step`:
/// a batch norm's shift, scale and bias and a ReLU); a conv whose value is an output or is
/// read by a `vjp` node is kept, as for elementwise chains.
pub fn fuse_conv_epilogues(g: &Graph) -> Result<(Graph, Vec<FusedChain>), GraphError> {
    let n = g.nodes.len();
    let mut consumers = vec![0usize; n];
    let mut pinned = vec![false; n];
    let mut only_consumer = vec![None; n];
    for node in &g.nodes {
        for &p in &node.parents {
            consumers[p] += 1;
            only_consumer[p] = Some(node.id);
            if matches!(node.kind, NodeKind::Vjp { .. }) {
                pinned[p] = true;
            }
        }
    }
    for o in &g.outputs {
        pinned[o.node] = true;
    }
    // conv id -> its epilogue
    let mut epilogue_of: Vec<Option<Epilogue>> = vec![None; n];
    let mut absorbed = vec![false; n];
    for node in &g.nodes {
        let NodeKind::Op {
            op: Op::Conv2d(_), ..
        } = &node.kind
        else {
            continue;
        };
        let c = node.id;
        if pinned[c] || consumers[c] != 1 {
            continue;
        }
        // (an epilogue over two convs, a residual sum of both, takes the first)
        let Some(e) = only_consumer[c].filter(|&e| !absorbed[e]) else {
            continue;
        };
        if let Some((steps, sides)) = epilogue_steps(g, e, c) {
            if !steps.is_empty() && steps.iter().all(crate::spec::is_epilogue_step) {
                epilogue_of[c] = Some((e, steps, sides));
                absorbed[e] = true;
            }
        }
    }
    let mut out = Graph {
        nodes: vec![],
        outputs: vec![],
        ..g.clone()
    };
    let mut new_id: Vec<Option<usize>> = vec![None; n];
    let mut fused = vec![];
    let mut conv_of = vec![None; n]; // epilogue node -> its conv
    for (c, e) in epilogue_of.iter().enumerate() {
        if let Some((e, ..)) = e {
            conv_of[*e] = Some(c);
        }
    }
    let map = |new_id: &[Option<usize>], p: usize| {
        new_id[p].ok_or_else(|| GraphError::Other(format!("fusion: node {p} has no replacement")))
    };
    for node in &g.nodes {
        if epilogue_of[node.id].is_some() {
            continue; // emitted at its epilogue's place (its sides may come after it)
        }
        let id = match conv_of[node.id] {
            Some(c) if absorbed[node.id] => {
                let conv = &g.nodes[c];
                // invariant: conv_of[e] = c only where epilogue_of[c] is set (just above)
                let (_, steps, sides) = epilogue_of[c].clone().expect("conv_of names a fused conv");
                let NodeKind::Op {
                    op: Op::Conv2d(geometry),
                } = &conv.kind
                else {
                    unreachable!("epilogues are recorded for conv2d nodes only")
                };
                let parents = conv
                    .parents
                    .iter()
                    .chain(&sides)
                    .map(|&p| map(&new_id, p))
                    .collect::<Result<Vec<_>, _>>()?;
                let op = Op::Conv2dMap {
                    geometry: *geometry,
                    steps,
                };
                let id = out.push(NodeKind::Op { op }, parents)?;
                fused.push(FusedChain {
                    replaced: vec![c, node.id],
                    node: id,
                });
                new_id[c] = Some(id);
                id
            }
            _ => {
                let parents = node
                    .parents
                    .iter()
                    .map(|&p| map(&new_id, p))
                    .collect::<Result<Vec<_>, _>>()?;
                out.push(node.kind.clone(), parents)?
            }
        };
        new_id[node.id] = Some(id);
    }
    for o in &g.outputs {
        let node = map(&new_id, o.node)?;
        out.outputs.push(OutputDecl {
            name: o.name.clone(),
            node,
        });
    }
    Ok((out, fused))
}

/// A conv's epilogue: its node, its steps and their side inputs (node ids).
type Epilogue = (usize, Vec<FusedStep>, Vec<usize>);

/// The steps and side inputs of node `e` as an epilogue over the value of node `c`, when it is
/// an elementwise op over it: a `fused_map` or `fused_unary` whose value is `c`, a unary map
/// of `c`, or a binary map with `c` as exactly one operand and the result of `c`'s shape.
fn epilogue_steps(g: &Graph, e: usize, c: usize) -> Option<(Vec<FusedStep>, Vec<usize>)> {
    let node = &g.nodes[e];
    let NodeKind::Op { op } = &node.kind else {
        return None;
    };
    let value_once = node.parents.iter().filter(|&&p| p == c).count() == 1;
    if !value_once || node.shape != g.nodes[c].shape {
        return None;
    }
    match op {
        Op::FusedMap { steps } if node.parents[0] == c => {
            Some((steps.clone(), node.parents[1..].to_vec()))
        }
        Op::FusedUnary { ops } if node.parents[0] == c => Some((
            ops.iter()
                .map(|op| FusedStep {
                    op: op.clone(),
                    side: None,
                })
                .collect(),
            vec![],
        )),
        _ if op.kind().is_unary_map() => Some((
            vec![FusedStep {
                op: op.clone(),
                side: None,
            }],
            vec![],
        )),
        _ if op.kind().is_binary_map() && node.parents.len() == 2 => {
            let (side, other) = if node.parents[0] == c {
                (SideOperand::Right, node.parents[1])
            } else {
                (SideOperand::Left, node.parents[0])
            };
            Some((
                vec![FusedStep {
                    op: op.clone(),
                    side: Some(side),
                }],
                vec![other],
            ))
        }
        _ => None,
    }
}
