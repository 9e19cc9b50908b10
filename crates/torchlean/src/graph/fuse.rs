//! Elementwise fusion, a lowering step of its own: maximal chains of unary elementwise op
//! nodes become one `fused_unary` node, planned like any op — with its own capsule and
//! evidence (the conformance harness checks the fused kernel against the composition of its
//! parts). A chain only grows through a node whose value nobody else needs: exactly one
//! consumer, not a graph output, not read by a `vjp` node (a backward pass needs the
//! intermediate values, so training graphs keep them).

use super::ir::{Graph, GraphError, NodeKind, OutputDecl};
use super::op::Op;

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
    // the single consumer of each node, when there is exactly one
    let mut only_consumer = vec![None; n];
    for node in &g.nodes {
        for &p in &node.parents {
            if consumers[p] == 1 {
                only_consumer[p] = Some(node.id);
            }
        }
    }
    // chains, found from their first node
    let mut in_chain = vec![false; n];
    let mut chains: Vec<Vec<usize>> = vec![];
    for id in 0..n {
        if in_chain[id] || !unary(id) {
            continue;
        }
        let mut chain = vec![id];
        let mut last = id;
        while !pinned[last] {
            match only_consumer[last] {
                Some(c) if unary(c) => {
                    chain.push(c);
                    last = c;
                }
                _ => break,
            }
        }
        if chain.len() >= 2 {
            chain.iter().for_each(|&c| in_chain[c] = true);
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
        chain_of_last[*c.last().expect("chains have two or more nodes")] = Some(k);
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
                let ops: Vec<Op> = chain
                    .iter()
                    .map(|&c| match &g.nodes[c].kind {
                        NodeKind::Op { op } => op.clone(),
                        _ => unreachable!("chains hold op nodes only"),
                    })
                    .collect();
                let parent = map(g.nodes[chain[0]].parents[0])?;
                let id = out.push(
                    NodeKind::Op {
                        op: Op::FusedUnary { ops },
                    },
                    vec![parent],
                )?;
                fused.push(FusedChain {
                    replaced: chain.clone(),
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
