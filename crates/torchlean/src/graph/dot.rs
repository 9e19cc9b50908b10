//! Graphviz rendering of a graph (for people; the JSON form is the interchange format).

use super::ir::{Graph, NodeKind};
use std::fmt::Write;

/// The graph in DOT.
pub fn to_dot(g: &Graph) -> String {
    let mut s = String::from(
        "digraph torchlean {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
    );
    for n in &g.nodes {
        let (label, style) = match &n.kind {
            NodeKind::Input { name } => (
                format!("input {name}"),
                ", style=filled, fillcolor=lightblue",
            ),
            NodeKind::Parameter { name } => (
                format!("param {name}"),
                ", style=filled, fillcolor=lightyellow",
            ),
            NodeKind::Constant { name } => (
                format!("const {name}"),
                ", style=filled, fillcolor=lightgrey",
            ),
            NodeKind::Op { op } => (op.name().to_string(), ""),
            NodeKind::Vjp { op, input } => {
                (format!("vjp {}[{input}]", op.name()), ", style=dashed")
            }
        };
        let _ = writeln!(
            s,
            "  n{} [label=\"%{} {}\\n{:?}\"{}];",
            n.id, n.id, label, n.shape, style
        );
        for p in &n.parents {
            let _ = writeln!(s, "  n{p} -> n{};", n.id);
        }
    }
    for o in &g.outputs {
        let _ = writeln!(
            s,
            "  out_{0} [label=\"output {0}\", shape=ellipse];\n  n{1} -> out_{0};",
            o.name.replace('.', "_"),
            o.node
        );
    }
    s.push_str("}\n");
    s
}
