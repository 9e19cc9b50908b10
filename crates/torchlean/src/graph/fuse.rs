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
