//! What the import knows of the sign of a value's elements by construction — used where a
//! lowering is exact only for positive operands (`Pow` of a computed base to a computed or
//! learnable exponent as exp(e · ln x)). Reads the graph built so far; never changes it.
//! Each query walks a node at most once (a value reached by several paths — a chain of
//! `y + y` — is not walked again: the walk is linear in the graph).

use super::{Builder, Value};
use std::collections::HashMap;
use torchlean::graph::{NodeKind, Op};

/// What is known of the sign of every element of a value.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Sign {
    Unknown,
    NonNegative,
    Positive,
}

/// Whether every element of `v` is positive by construction (up to float32 underflow of a
/// mean, product or exponential of tiny values, which can reach 0): see [`sign`].
pub(super) fn positive(b: &Builder, v: &Value) -> bool {
    match v {
        Value::Node(id) => sign(b, *id, &mut HashMap::new()) == Sign::Positive,
        Value::Const(c) => of_values(&c.floats()) == Sign::Positive,
        // a parameter: training may change its sign
        Value::Param(_) => false,
    }
}

fn of_values(xs: &[f32]) -> Sign {
    if xs.iter().all(|&x| x > 0.0) {
        Sign::Positive
    } else if xs.iter().all(|&x| x >= 0.0) {
        Sign::NonNegative
    } else {
        Sign::Unknown
    }
}

/// The sign of every element of node `id` by construction: a constant's; positive for a
/// clamp from below at a positive bound, a maximum with something positive, an exponential,
/// sigmoid or softplus, a sum of a positive and a non-negative value, products, quotients
/// by positive values, positive scalings, powers, means, average pools and layout moves of
/// positive values; non-negative for relu, abs, a square (`x · x`) and the same moves of
/// non-negative values. Never a parameter's (training may change it). `seen` holds the
/// nodes this query has already decided.
fn sign(b: &Builder, id: usize, seen: &mut HashMap<usize, Sign>) -> Sign {
    if let Some(&s) = seen.get(&id) {
        return s;
    }
    // parents come before their children (ids increase), so the walk ends; it is made
    // depth-first over a stack of pending nodes, so a deep chain cannot exhaust the
    // call stack
    let mut stack = vec![id];
    while let Some(&top) = stack.last() {
        let node = &b.graph.nodes[top];
        let pending: Vec<usize> = match &node.kind {
            NodeKind::Op { .. } => node
                .parents
                .iter()
                .copied()
                .filter(|p| !seen.contains_key(p))
                .collect(),
            _ => vec![],
        };
        if pending.is_empty() {
            stack.pop();
            let s = decide(b, top, seen);
            seen.insert(top, s);
        } else {
            stack.extend(pending);
        }
    }
    seen[&id]
}

/// The sign of node `id` from its parents' (all in `seen`).
fn decide(b: &Builder, id: usize, seen: &HashMap<usize, Sign>) -> Sign {
    let node = &b.graph.nodes[id];
    let op = match &node.kind {
        NodeKind::Constant { name } => {
            return b
                .stored
                .iter()
                .find(|(n, _)| n == name)
                .map_or(Sign::Unknown, |(_, t)| of_values(&t.data()))
        }
        NodeKind::Op { op } => op,
        _ => return Sign::Unknown,
    };
    let parent = |i: usize| {
        node.parents
            .get(i)
            .and_then(|p| seen.get(p).copied())
            .unwrap_or(Sign::Unknown)
    };
    let least = || {
        (0..node.parents.len())
            .map(parent)
            .fold(Sign::Positive, |a, s| if s < a { s } else { a })
    };
    match op {
        Op::Clamp { min, .. } if *min > 0.0 => Sign::Positive,
        Op::Clamp { min, .. } if *min >= 0.0 => Sign::NonNegative,
        Op::Exp | Op::Sigmoid | Op::Softplus => Sign::Positive,
        Op::Relu | Op::Abs | Op::Sqrt => Sign::NonNegative,
        Op::Maximum => {
            let (x, y) = (parent(0), parent(1));
            if x > y {
                x
            } else {
                y
            }
        }
        Op::Add => match (parent(0), parent(1)) {
            (Sign::Unknown, _) | (_, Sign::Unknown) => Sign::Unknown,
            (Sign::Positive, _) | (_, Sign::Positive) => Sign::Positive,
            _ => Sign::NonNegative,
        },
        Op::Mul if node.parents.len() == 2 && node.parents[0] == node.parents[1] => {
            match parent(0) {
                Sign::Positive => Sign::Positive,
                _ => Sign::NonNegative,
            }
        }
        // a quotient by something that may be 0 may be NaN (0 / 0)
        Op::Div if parent(1) == Sign::Positive => parent(0),
        Op::Mul | Op::Concat { .. } => least(),
        Op::Scale { factor } if *factor > 0.0 => parent(0),
        Op::Pow { .. }
        | Op::AvgPool2d { .. }
        | Op::ReduceMean { .. }
        | Op::ReduceSum { .. }
        | Op::Reshape { .. }
        | Op::Permute { .. }
        | Op::BroadcastTo { .. }
        | Op::Slice { .. }
        | Op::IndexSelect { .. } => parent(0),
        _ => Sign::Unknown,
    }
}
