//! Attention as exporters write it, recognized after the node walk.
//!
//! PyTorch exports `nn.MultiheadAttention` (and `scaled_dot_product_attention`) as
//! `MatMul(Mul(q, s₁), Mul(kᵀ, s₂))`, an optional `Add` of an additive mask, `Softmax` over
//! the last axis and `MatMul` with v. Node by node that is five kernels and an L×S matrix
//! written and read four times; torchlean's `scaled_dot_product_attention` computes the same
//! function in one kernel (the CPU's flash kernel reads q, k and v in place). So the mapped
//! graph is searched for
//!
//! ```text
//!   matmul(softmax_last(add(matmul(scale*(q), scale*(kt)), bias) | matmul(..)), v)
//! ```
//!
//! (each `scale` optional, also one around the first product), every intermediate value read
//! only inside the pattern and not a graph output, the `add` not broadcasting the scores,
//! and `scaled_dot_product_attention(q, permute(kt), v[, bias])` with the product of the
//! scales inferring the same shape; such a subgraph becomes `permute` + that op, with
//! `mask: additive_bias` when there is an `add`.
//!
//! A mask that is a constant causal mask (0 on and below the diagonal, -inf or f32::MIN
//! above: PyTorch's exporter writes `is_causal=True` with f32::MIN) read only here becomes
//! the op's `causal` flag instead (its constant is dropped): the same weights whenever the
//! scores are finite and within ±2¹²⁶ (see [`is_causal_mask`]); beyond that (a blocked score
//! of +inf or NaN, or scores near f32's range) the node-by-node form lets a blocked entry
//! change its row and the flag does not, as `is_causal` itself means.
//!
//! What changes: rounding only — the scores are s₁·s₂·(q·k) rounded once instead of
//! (s₁q)·(s₂k) — except where the node-by-node form underflows: a tiny q or k entry that a
//! scale rounds to zero, times an infinite entry, is NaN node by node and ±inf in the op, as
//! in the exact function. Fully masked rows (every bias -inf) are NaN in both (softmax's 0/0).
//! docs/onnx.md lists the pattern.

use torchlean::graph::{
    AttentionMask, Graph, GraphError, NodeKind, Op, OpKind, OutputDecl, Relation,
};

/// One recognized attention subgraph.
struct Found {
    /// The final product's node: replaced by the attention node.
    at: usize,
    /// Nodes absorbed (dropped from the graph).
    absorbed: Vec<usize>,
    q: usize,
    kt: usize,
    v: usize,
    bias: Option<usize>,
    /// The shape the bias is broadcast to first, when the op cannot read it as it is (the
    /// op reads [L, S] or the whole [..., L, S]; a key-padding mask is [B, 1, 1, S]).
    bias_to: Option<Vec<usize>>,
    /// The mask was a constant causal mask (0 where j ≤ i, -inf where j > i): the op's
    /// `causal` flag replaces it.
    causal: bool,
    /// `bias` is a boolean mask (1 = may attend): the exporter's safe-softmax form of a
    /// boolean `attn_mask` (see [`safe_softmax`]).
    boolean: bool,
    scale: f32,
}

/// The graph with every recognized attention subgraph replaced (or an identical copy), and
/// the names of the constants no node reads any more (causal masks the flag replaced);
/// `constant` gives the values of a constant node by name (to recognize a causal mask).
pub fn fuse_attention(
    g: &Graph,
    constant: &dyn Fn(&str) -> Option<Vec<f32>>,
) -> Result<(Graph, Vec<String>), GraphError> {
    let found = find(g, constant);
    if found.is_empty() {
        return Ok((g.clone(), vec![]));
    }
    let dropped = found
        .iter()
        .flat_map(|f| &f.absorbed)
        .filter_map(|&i| match &g.nodes[i].kind {
            NodeKind::Constant { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let n = g.nodes.len();
    let mut absorbed = vec![false; n];
    let mut at = vec![None; n];
    for (k, f) in found.iter().enumerate() {
        f.absorbed.iter().for_each(|&i| absorbed[i] = true);
        at[f.at] = Some(k);
    }
    let mut out = Graph {
        nodes: vec![],
        outputs: vec![],
        ..g.clone()
    };
    let mut new_id: Vec<Option<usize>> = vec![None; n];
    let map = |new_id: &[Option<usize>], p: usize| {
        new_id[p]
            .ok_or_else(|| GraphError::Other(format!("attention: node {p} has no replacement")))
    };
    for node in &g.nodes {
        if absorbed[node.id] {
            continue;
        }
        let id = match at[node.id] {
            Some(k) => {
                let f = &found[k];
                let kt = map(&new_id, f.kt)?;
                let rank = g.nodes[f.kt].shape.len();
                let mut axes: Vec<usize> = (0..rank).collect();
                axes.swap(rank - 2, rank - 1);
                let key = out.push(
                    NodeKind::Op {
                        op: Op::Permute { axes },
                    },
                    vec![kt],
                )?;
                let mut parents = vec![map(&new_id, f.q)?, key, map(&new_id, f.v)?];
                if let Some(b) = f.bias {
                    let b = map(&new_id, b)?;
                    parents.push(match &f.bias_to {
                        Some(shape) => out.push(
                            NodeKind::Op {
                                op: Op::BroadcastTo {
                                    shape: shape.clone(),
                                },
                            },
                            vec![b],
                        )?,
                        None => b,
                    });
                }
                out.push(NodeKind::Op { op: attention(f) }, parents)?
            }
            None => {
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
        out.outputs.push(OutputDecl {
            name: o.name.clone(),
            node: map(&new_id, o.node)?,
        });
    }
    Ok((out, dropped))
}

fn attention(f: &Found) -> Op {
    Op::ScaledDotProductAttention {
        scale: Some(f.scale),
        causal: f.causal,
        mask: if f.bias.is_some() {
            if f.boolean {
                AttentionMask::Boolean
            } else {
                AttentionMask::AdditiveBias
            }
        } else {
            AttentionMask::None
        },
    }
}

/// Whether `values` of `shape` (leading axes of size 1, then [l, s]) are the causal mask as
/// an additive bias: 0 where key j ≤ query i, and above the diagonal -inf or, as PyTorch's
/// exporter writes it, f32::MIN (-3.4·10³⁸). The spec's `causal` gives those entries weight
/// exactly 0, and so does the mask added to the scores: with -inf whenever the score is
/// not +inf or NaN, with f32::MIN whenever every score of the row lies within ±2¹²⁶ (then a
/// blocked entry ends at least 1.7·10³⁸ below the row's maximum, and its exp is 0).
fn is_causal_mask(values: &[f32], shape: &[usize], l: usize, s: usize) -> bool {
    let r = shape.len();
    r >= 2
        && shape[..r - 2].iter().all(|&d| d == 1)
        && shape[r - 2..] == [l, s]
        && values.len() == l * s
        && values.iter().enumerate().all(|(e, &v)| {
            let (i, j) = (e / s.max(1), e % s.max(1));
            if j <= i {
                v == 0.0
            } else {
                v == f32::NEG_INFINITY || v == f32::MIN
            }
        })
}

/// Every attention subgraph of `g`, none sharing a node.
fn find(g: &Graph, constant: &dyn Fn(&str) -> Option<Vec<f32>>) -> Vec<Found> {
    let n = g.nodes.len();
    let mut readers = vec![0usize; n];
    for node in &g.nodes {
        for &p in &node.parents {
            readers[p] += 1;
        }
    }
    for o in &g.outputs {
        readers[o.node] += 1; // an output is read by the caller: never absorbed
    }
    let op = |id: usize| op_at(g, id);
    let kind = |id: usize| op(id).map(Op::kind);
    // a node read once (here) whose kind is `k`
    let inner = |id: usize, k: OpKind| readers[id] == 1 && kind(id) == Some(k);
    // under a `scale` read once: (the value under it, its factor), else (id, 1)
    let under_scale = |id: usize| -> (usize, f32) {
        match op(id) {
            Some(Op::Scale { factor }) if readers[id] == 1 => (g.nodes[id].parents[0], *factor),
            _ => (id, 1.0),
        }
    };
    // strips a `scale` read once, absorbing it
    let unscale = |id: usize, absorbed: &mut Vec<usize>| -> (usize, f32) {
        let (under, factor) = under_scale(id);
        if under != id {
            absorbed.push(id);
        }
        (under, factor)
    };
    let mut used = vec![false; n];
    let mut found = vec![];
    for node in &g.nodes {
        let Some(Op::Matmul) = op(node.id) else {
            continue;
        };
        let Some(f) = (|| {
            let (s, v) = (node.parents[0], node.parents[1]);
            let mut absorbed = vec![];
            // PyTorch's export of a boolean `attn_mask`: where(isnan(p), 0, p) over the
            // softmax p of scores + where(mask, 0, -inf)
            let safe = safe_softmax(g, &readers, &constant, s);
            let s = match &safe {
                Some(tail) => {
                    absorbed.extend(&tail.absorbed);
                    tail.softmax
                }
                None => s,
            };
            let rank = g.nodes[s].shape.len();
            let softmax_reads = if safe.is_some() { 3 } else { 1 };
            match op(s) {
                Some(Op::Softmax { axis })
                    if readers[s] == softmax_reads && rank >= 2 && *axis == rank - 1 => {}
                _ => return None,
            }
            absorbed.push(s);
            let x = g.nodes[s].parents[0];
            // an additive mask on the scores, in either operand order, not broadcasting them
            let (scores, bias) = if inner(x, OpKind::Add) {
                let [a, b] = g.nodes[x].parents[..] else {
                    return None;
                };
                let product = |id: usize| {
                    inner(under_scale(id).0, OpKind::Matmul)
                        && g.nodes[id].shape == g.nodes[x].shape
                };
                absorbed.push(x);
                if product(a) {
                    (a, Some(b))
                } else if product(b) {
                    (b, Some(a))
                } else {
                    return None;
                }
            } else {
                (x, None)
            };
            if readers[scores] != 1 {
                return None;
            }
            let (m, outer) = unscale(scores, &mut absorbed);
            if !inner(m, OpKind::Matmul) {
                return None;
            }
            absorbed.push(m);
            let (q, sq) = unscale(g.nodes[m].parents[0], &mut absorbed);
            let (kt, sk) = unscale(g.nodes[m].parents[1], &mut absorbed);
            let scores_shape = &g.nodes[scores].shape;
            // a constant causal mask read only here becomes the op's causal flag (the flash
            // kernels skip the blocked tiles, and no L×S mask is read)
            // the safe form's mask is where(mask, 0, -inf): the op reads the mask itself
            let mut boolean = false;
            let bias = match (&safe, bias) {
                (Some(_), Some(b)) => {
                    let mask = boolean_mask(g, &readers, &constant, b)?;
                    absorbed.extend(&mask.absorbed);
                    boolean = true;
                    Some(mask.mask)
                }
                // the safe form without a mask: nothing for it to guard against, but no
                // boolean to read either; left node by node
                (Some(_), None) => return None,
                (None, b) => b,
            };
            let (bias, causal) = match bias {
                Some(b) if readers[b] == 1 && !boolean => {
                    let shape = &g.nodes[b].shape;
                    let r = scores_shape.len();
                    let causal = r >= 2
                        && match &g.nodes[b].kind {
                            NodeKind::Constant { name } => constant(name).is_some_and(|v| {
                                is_causal_mask(&v, shape, scores_shape[r - 2], scores_shape[r - 1])
                            }),
                            _ => false,
                        };
                    if causal {
                        absorbed.push(b);
                        (None, true)
                    } else {
                        (Some(b), false)
                    }
                }
                other => (other, false),
            };
            let mut f = Found {
                at: node.id,
                absorbed,
                q,
                kt,
                v,
                bias,
                bias_to: None,
                causal,
                boolean,
                scale: outer * sq * sk,
            };
            // the op must take these operands and give the product's shape
            let rk = g.nodes[kt].shape.len();
            if rk < 2 {
                return None;
            }
            let mut kshape = g.nodes[kt].shape.clone();
            kshape.swap(rk - 2, rk - 1);
            let mut shapes: Vec<&[usize]> = vec![&g.nodes[q].shape, &kshape, &g.nodes[v].shape];
            if let Some(b) = bias {
                let bs = &g.nodes[b].shape;
                let tail = &scores_shape[scores_shape.len().saturating_sub(2)..];
                if bs != scores_shape && bs.as_slice() != tail {
                    // broadcast to the scores' shape (the add broadcast it there)
                    f.bias_to = Some(scores_shape.clone());
                    shapes.push(scores_shape);
                } else {
                    shapes.push(bs);
                }
            }
            let inferred = torchlean::spec::infer_shape(&attention(&f), &shapes).ok()?;
            (inferred == node.shape).then_some(f)
        })() else {
            continue;
        };
        if f.absorbed.iter().any(|&i| used[i]) {
            continue;
        }
        f.absorbed.iter().for_each(|&i| used[i] = true);
        found.push(f);
    }
    found
}

/// The op of node `id`, if it is an op node.
fn op_at(g: &Graph, id: usize) -> Option<&Op> {
    match &g.nodes[id].kind {
        NodeKind::Op { op } => Some(op),
        _ => None,
    }
}

/// The nodes of a recognized safe-softmax tail.
struct SafeTail {
    /// The softmax under it.
    softmax: usize,
    /// The tail's own nodes (the `where`, the comparison and a zero constant read only here).
    absorbed: Vec<usize>,
}

/// `where(p ≠ p, 0, p)` at `id` — PyTorch's "safe softmax" export, which gives a fully blocked
/// row zeros instead of softmax's NaN — with `p` a softmax read only by it; `None` otherwise.
fn safe_softmax(
    g: &Graph,
    readers: &[usize],
    constant: &dyn Fn(&str) -> Option<Vec<f32>>,
    id: usize,
) -> Option<SafeTail> {
    let op = |id: usize| op_at(g, id);
    if readers[id] != 1 || op(id)? != &Op::Where {
        return None;
    }
    let [c, zero, p] = g.nodes[id].parents[..] else {
        return None;
    };
    let isnan = Op::Compare {
        relation: Relation::Ne,
    };
    if readers[c] != 1 || op(c)? != &isnan || g.nodes[c].parents[..] != [p, p] {
        return None;
    }
    if !matches!(op(p), Some(Op::Softmax { .. })) || !is_constant(g, constant, zero, 0.0) {
        return None;
    }
    let mut absorbed = vec![id, c];
    if readers[zero] == 1 {
        absorbed.push(zero);
    }
    Some(SafeTail {
        softmax: p,
        absorbed,
    })
}

/// A recognized boolean mask written as an additive bias.
struct BooleanMask {
    /// The 0/1 mask.
    mask: usize,
    absorbed: Vec<usize>,
}

/// `where(mask, 0, -inf)` at `id`, read only by the attention: the bias PyTorch's exporter
/// makes of a boolean `attn_mask`; `None` otherwise.
fn boolean_mask(
    g: &Graph,
    readers: &[usize],
    constant: &dyn Fn(&str) -> Option<Vec<f32>>,
    id: usize,
) -> Option<BooleanMask> {
    if readers[id] != 1 || op_at(g, id) != Some(&Op::Where) {
        return None;
    }
    let [mask, zero, blocked] = g.nodes[id].parents[..] else {
        return None;
    };
    // the where broadcasts its constants onto the mask's shape, not the mask onto theirs
    if g.nodes[mask].shape != g.nodes[id].shape
        || !is_constant(g, constant, zero, 0.0)
        || !is_constant(g, constant, blocked, f32::NEG_INFINITY)
    {
        return None;
    }
    let mut absorbed = vec![id];
    absorbed.extend([zero, blocked].into_iter().filter(|&c| readers[c] == 1));
    Some(BooleanMask { mask, absorbed })
}

/// Whether node `id` is a constant whose every element is `value` (+0 for 0: a -0 is a
/// different bias only in sign, but the exporter writes +0).
fn is_constant(
    g: &Graph,
    constant: &dyn Fn(&str) -> Option<Vec<f32>>,
    id: usize,
    value: f32,
) -> bool {
    match &g.nodes[id].kind {
        NodeKind::Constant { name } => constant(name)
            .is_some_and(|v| !v.is_empty() && v.iter().all(|x| x.to_bits() == value.to_bits())),
        _ => false,
    }
}
