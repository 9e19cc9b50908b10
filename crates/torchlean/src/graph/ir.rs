//! The graph IR: an SSA DAG of ops (format `torchlean.ir.v1`).
//!
//! Node `i` is at index `i` and its parents have smaller ids, so a graph is acyclic by
//! construction and its node order is a valid schedule. Every node carries its shape; shapes
//! are inferred in one place ([`Graph::validate`], via `spec::infer_shape`). Inputs,
//! parameters and constants are referenced by name; their values live outside the graph
//! (parameters and constants in a safetensors file). Graph files are untrusted input:
//! [`Graph::validate`] checks everything before anything is allocated or run.

use super::op::Op;
use crate::spec::{infer_shape, numel};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use thiserror::Error;

/// The format tag of this IR version.
pub const FORMAT: &str = "torchlean.ir.v1";
/// Largest element count any node may declare (2^31 f32 = 8 GiB).
pub const MAX_NODE_ELEMENTS: usize = 1 << 31;
/// Largest number of nodes a graph may have.
pub const MAX_NODES: usize = 1 << 20;
/// Largest graph file [`Graph::load`] reads (256 MiB).
pub const MAX_GRAPH_BYTES: u64 = 256 << 20;

/// A named value with a shape (an input or a parameter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueDecl {
    pub name: String,
    pub shape: Vec<usize>,
}

/// A named graph output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputDecl {
    pub name: String,
    pub node: usize,
}

/// What a node computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeKind {
    /// A graph input, by name.
    Input { name: String },
    /// A trainable parameter, by name.
    Parameter { name: String },
    /// A constant captured from the model (stored beside the parameters), by name.
    Constant { name: String },
    /// An op applied to the parents.
    Op { op: Op },
    /// The cotangent of input `input` of `op`: parents are the op's inputs, the op's output,
    /// and the output's cotangent. Executed by the VJP kernel of the op's accepted capsule.
    Vjp { op: Op, input: usize },
}

/// One SSA node. Read strictly (through [`NodeWire`]): `#[serde(flatten)]` cannot be
/// combined with `deny_unknown_fields`, so a node is read as its flat wire form with every
/// field known, then checked to carry exactly the fields of its kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "NodeWire")]
pub struct Node {
    pub id: usize,
    #[serde(flatten)]
    pub kind: NodeKind,
    pub parents: Vec<usize>,
    pub shape: Vec<usize>,
    pub dtype: String,
}

/// The kind tag of a node on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindTag {
    Input,
    Parameter,
    Constant,
    Op,
    Vjp,
}

/// A node as written in a graph file: every field any kind may have, unknown ones refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeWire {
    id: usize,
    kind: KindTag,
    name: Option<String>,
    op: Option<StrictOp>,
    input: Option<usize>,
    parents: Vec<usize>,
    shape: Vec<usize>,
    dtype: String,
}

impl TryFrom<NodeWire> for Node {
    type Error = String;

    fn try_from(w: NodeWire) -> Result<Node, String> {
        let id = w.id;
        let kind_name = match w.kind {
            KindTag::Input => "input",
            KindTag::Parameter => "parameter",
            KindTag::Constant => "constant",
            KindTag::Op => "op",
            KindTag::Vjp => "vjp",
        };
        let refuse = |field: &str| {
            Err(format!(
                "node {id}: a `{kind_name}` node has no field `{field}`"
            ))
        };
        let need = |field: &str| format!("node {id}: a `{kind_name}` node needs field `{field}`");
        let kind = match w.kind {
            KindTag::Input | KindTag::Parameter | KindTag::Constant => {
                if w.op.is_some() {
                    return refuse("op");
                }
                if w.input.is_some() {
                    return refuse("input");
                }
                let name = w.name.ok_or_else(|| need("name"))?;
                match w.kind {
                    KindTag::Input => NodeKind::Input { name },
                    KindTag::Parameter => NodeKind::Parameter { name },
                    _ => NodeKind::Constant { name },
                }
            }
            KindTag::Op => {
                if w.name.is_some() {
                    return refuse("name");
                }
                if w.input.is_some() {
                    return refuse("input");
                }
                NodeKind::Op {
                    op: w.op.ok_or_else(|| need("op"))?.0,
                }
            }
            KindTag::Vjp => {
                if w.name.is_some() {
                    return refuse("name");
                }
                NodeKind::Vjp {
                    op: w.op.ok_or_else(|| need("op"))?.0,
                    input: w.input.ok_or_else(|| need("input"))?,
                }
            }
        };
        Ok(Node {
            id,
            kind,
            parents: w.parents,
            shape: w.shape,
            dtype: w.dtype,
        })
    }
}

/// An [`Op`] read strictly: the derived reader ignores extra fields beside a payload-free
/// op (`{"op": "relu", "alpha": 1}`: serde's internally tagged unit variants skip them), so
/// the op is read, written back, and every field of the input must be a field of that
/// canonical form (recursively, for the ops inside `fused_unary`).
struct StrictOp(Op);

/// The first key of `given` that `canonical` does not have (as a dotted path).
fn unknown_key(given: &serde_json::Value, canonical: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match (given, canonical) {
        (Value::Object(g), Value::Object(c)) => g.iter().find_map(|(k, v)| match c.get(k) {
            None => Some(k.clone()),
            Some(cv) => unknown_key(v, cv).map(|inner| format!("{k}.{inner}")),
        }),
        (Value::Array(g), Value::Array(c)) => g
            .iter()
            .zip(c)
            .enumerate()
            .find_map(|(i, (gv, cv))| unknown_key(gv, cv).map(|inner| format!("{i}.{inner}"))),
        _ => None,
    }
}

/// The first number of `given` that its op's f32 payload could not hold: a finite JSON
/// number beyond the f32 range (`1e39`, `-1e308`) converts to an infinity, which the writer
/// turns into `null` (so the graph could not be read back) and the kernels would run with.
/// JSON has no literal for a non-finite number, so every finite payload is representable.
fn overflowed_key(
    given: &serde_json::Value,
    canonical: &serde_json::Value,
) -> Option<(String, serde_json::Number)> {
    use serde_json::Value;
    match (given, canonical) {
        (Value::Number(n), Value::Null) => Some((String::new(), n.clone())),
        (Value::Object(g), Value::Object(c)) => g.iter().find_map(|(k, v)| {
            let (inner, n) = overflowed_key(v, c.get(k)?)?;
            let path = if inner.is_empty() {
                k.clone()
            } else {
                format!("{k}.{inner}")
            };
            Some((path, n))
        }),
        (Value::Array(g), Value::Array(c)) => {
            g.iter().zip(c).enumerate().find_map(|(i, (gv, cv))| {
                let (inner, n) = overflowed_key(gv, cv)?;
                let path = if inner.is_empty() {
                    i.to_string()
                } else {
                    format!("{i}.{inner}")
                };
                Some((path, n))
            })
        }
        _ => None,
    }
}

impl<'de> Deserialize<'de> for StrictOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let given = serde_json::Value::deserialize(d)?;
        let op = Op::deserialize(&given).map_err(D::Error::custom)?;
        let canonical = serde_json::to_value(&op).map_err(D::Error::custom)?;
        if let Some(key) = unknown_key(&given, &canonical) {
            return Err(D::Error::custom(format!(
                "unknown field `{key}` of op `{}`",
                op.name()
            )));
        }
        if let Some((key, value)) = overflowed_key(&given, &canonical) {
            return Err(D::Error::custom(format!(
                "field `{key}` of op `{}`: {value} is outside the range of f32 (it would become an infinity)",
                op.name()
            )));
        }
        Ok(StrictOp(op))
    }
}

/// A graph: inputs, parameters, nodes in SSA order, outputs. Unknown fields are refused
/// everywhere (top level, declarations, nodes, op payloads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    pub format: String,
    pub inputs: Vec<ValueDecl>,
    pub parameters: Vec<ValueDecl>,
    pub nodes: Vec<Node>,
    pub outputs: Vec<OutputDecl>,
}

/// Why a graph is not well formed.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GraphError {
    #[error("graph: format is `{found}`, expected `{FORMAT}`")]
    Format { found: String },
    #[error("graph: {count} nodes exceed the limit of {MAX_NODES}")]
    TooManyNodes { count: usize },
    #[error("graph node {index}: id is {id}, expected its index {index}")]
    BadId { index: usize, id: usize },
    #[error("graph node {node}: parent {parent} is not an earlier node (cycle or out of range)")]
    BadParent { node: usize, parent: usize },
    #[error("graph node {node}: dtype `{dtype}` is not supported (only f32)")]
    Dtype { node: usize, dtype: String },
    #[error("graph node {node}: shape {shape:?} has more than {MAX_NODE_ELEMENTS} elements (counting an empty axis as 1, so that every stride fits)")]
    TooLarge { node: usize, shape: Vec<usize> },
    #[error("graph node {node}: refers to undeclared {what} `{name}`")]
    Undeclared {
        node: usize,
        what: &'static str,
        name: String,
    },
    #[error("graph: {what} `{name}` is declared twice")]
    Duplicate { what: &'static str, name: String },
    #[error("graph node {node}: declared shape {declared:?}, but {reason}")]
    ShapeMismatch {
        node: usize,
        declared: Vec<usize>,
        reason: String,
    },
    #[error("graph node {node} (`{op}`): {reason}")]
    Op {
        node: usize,
        op: &'static str,
        reason: String,
    },
    #[error("graph output `{name}`: node {node} does not exist")]
    BadOutput { name: String, node: usize },
    /// A user-declared name in the namespace that backward derivation generates names in.
    #[error("graph: {what} `{name}` uses the reserved prefix `{RESERVED_PREFIX}` (gradient outputs and the seed cotangent are named there); rename it")]
    ReservedName { what: &'static str, name: String },
    /// A user-declared name that the safetensors format reserves (`__metadata__`): inputs,
    /// parameters and outputs are read and written as safetensors tensors by their names.
    #[error("graph: {what} `{name}` is the safetensors format's metadata key, which no tensor may be named (a graph's inputs, parameters and outputs are read and written as safetensors files by name); rename it")]
    SafetensorsKey { what: &'static str, name: String },
    #[error("graph: {0}")]
    Other(String),
    /// A graph file could not be read or parsed (not JSON, unknown field, too large, ...).
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    /// A graph file was read but is not well formed.
    #[error("{path}: {source}")]
    InFile {
        path: String,
        source: Box<GraphError>,
    },
}

/// The name prefix reserved for names that backward derivation generates (`grad.seed`,
/// `grad.<input or parameter>`). User graphs, captures and model parameters may not use it.
pub const RESERVED_PREFIX: &str = "grad.";

/// The key a safetensors file keeps its metadata under: no tensor may be named so.
pub const SAFETENSORS_METADATA_KEY: &str = "__metadata__";

/// Refuses a user-chosen `name` in the reserved namespace (see [`RESERVED_PREFIX`]) or equal
/// to [`SAFETENSORS_METADATA_KEY`] (such an output was computed, then could not be written:
/// an audit of the thirty-seventh session).
pub fn check_user_name(what: &'static str, name: &str) -> Result<(), GraphError> {
    if name == SAFETENSORS_METADATA_KEY {
        return Err(GraphError::SafetensorsKey {
            what,
            name: name.to_string(),
        });
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(GraphError::ReservedName {
            what,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Refuses a shape whose non-zero dims multiply past [`MAX_NODE_ELEMENTS`] (checked): this
/// bounds the element count and every stride, so `(0, 2^40, 2^40)` — no elements, but
/// strides that overflow — is refused like `(2^40, 2^40)` (docs/reliability.md).
fn check_size(node: usize, shape: &[usize]) -> Result<(), GraphError> {
    let mut n: usize = 1;
    for &d in shape.iter().filter(|&&d| d != 0) {
        n = n
            .checked_mul(d)
            .filter(|&n| n <= MAX_NODE_ELEMENTS)
            .ok_or_else(|| GraphError::TooLarge {
                node,
                shape: shape.to_vec(),
            })?;
    }
    Ok(())
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph {
            format: FORMAT.into(),
            inputs: vec![],
            parameters: vec![],
            nodes: vec![],
            outputs: vec![],
        }
    }

    /// Appends a node whose shape is inferred; returns its id. The node limit
    /// ([`MAX_NODES`]) applies here, as each node is added, so that a builder (an importer
    /// unrolling a recurrence over a declared sequence length) is stopped at the limit, not
    /// after it has built a graph of any size that `validate` then refuses.
    pub fn push(&mut self, kind: NodeKind, parents: Vec<usize>) -> Result<usize, GraphError> {
        let id = self.nodes.len();
        if id >= MAX_NODES {
            return Err(GraphError::TooManyNodes { count: id + 1 });
        }
        let shape = self.infer(id, &kind, &parents)?;
        check_size(id, &shape)?;
        self.nodes.push(Node {
            id,
            kind,
            parents,
            shape,
            dtype: "f32".into(),
        });
        Ok(id)
    }

    /// The output node named `name`.
    pub fn output(&self, name: &str) -> Option<usize> {
        self.outputs.iter().find(|o| o.name == name).map(|o| o.node)
    }

    /// The shape a node of `kind` over `parents` must have (the one place shapes are inferred).
    fn infer(
        &self,
        id: usize,
        kind: &NodeKind,
        parents: &[usize],
    ) -> Result<Vec<usize>, GraphError> {
        for &p in parents {
            if p >= id || p >= self.nodes.len() {
                return Err(GraphError::BadParent {
                    node: id,
                    parent: p,
                });
            }
        }
        let decl = |list: &[ValueDecl], what: &'static str, name: &str| {
            list.iter()
                .find(|d| d.name == name)
                .map(|d| d.shape.clone())
                .ok_or_else(|| GraphError::Undeclared {
                    node: id,
                    what,
                    name: name.to_string(),
                })
        };
        let leaf = |shape: Vec<usize>| {
            if parents.is_empty() {
                Ok(shape)
            } else {
                Err(GraphError::Other(format!(
                    "node {id}: a leaf has no parents"
                )))
            }
        };
        let shapes: Vec<&[usize]> = parents
            .iter()
            .map(|&p| self.nodes[p].shape.as_slice())
            .collect();
        let op_err = |op: &Op, e: crate::error::OpError| GraphError::Op {
            node: id,
            op: op.name(),
            reason: e.to_string(),
        };
        match kind {
            NodeKind::Input { name } => leaf(decl(&self.inputs, "input", name)?),
            NodeKind::Parameter { name } => leaf(decl(&self.parameters, "parameter", name)?),
            NodeKind::Constant { name } => leaf(decl(&self.parameters, "constant", name)?),
            NodeKind::Op { op } => infer_shape(op, &shapes).map_err(|e| op_err(op, e)),
            NodeKind::Vjp { op, input } => {
                let n = shapes.len().checked_sub(2).ok_or_else(|| GraphError::Op {
                    node: id,
                    op: op.name(),
                    reason: "a vjp node needs the op's inputs, its output and a cotangent".into(),
                })?;
                if *input >= n {
                    return Err(GraphError::Op {
                        node: id,
                        op: op.name(),
                        reason: format!("input index {input} out of range for {n} inputs"),
                    });
                }
                let out = infer_shape(op, &shapes[..n]).map_err(|e| op_err(op, e))?;
                if shapes[n] != out.as_slice() || shapes[n + 1] != out.as_slice() {
                    return Err(GraphError::Op {
                        node: id,
                        op: op.name(),
                        reason: format!("output and cotangent must have shape {out:?}"),
                    });
                }
                if !op.kind().differentiable() {
                    return Err(GraphError::Op {
                        node: id,
                        op: op.name(),
                        reason: "the op is not differentiable".into(),
                    });
                }
                Ok(shapes[*input].to_vec())
            }
        }
    }

    /// Checks the whole graph: format, ids, parents, names, dtypes, sizes, shapes, outputs.
    /// Checks that no input, parameter or output of a graph written by a user (before
    /// backward derivation) has a name in the reserved namespace ([`RESERVED_PREFIX`]).
    pub fn check_user_names(&self) -> Result<(), GraphError> {
        for d in &self.inputs {
            check_user_name("input", &d.name)?;
        }
        for d in &self.parameters {
            check_user_name("parameter", &d.name)?;
        }
        for o in &self.outputs {
            check_user_name("output", &o.name)?;
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), GraphError> {
        if self.format != FORMAT {
            return Err(GraphError::Format {
                found: self.format.clone(),
            });
        }
        if self.nodes.len() > MAX_NODES {
            return Err(GraphError::TooManyNodes {
                count: self.nodes.len(),
            });
        }
        let mut names = HashSet::new();
        for (what, list) in [("input", &self.inputs), ("parameter", &self.parameters)] {
            for d in list {
                if !names.insert(d.name.as_str()) {
                    return Err(GraphError::Duplicate {
                        what,
                        name: d.name.clone(),
                    });
                }
                check_size(usize::MAX, &d.shape).map_err(|_| {
                    GraphError::Other(format!(
                        "{what} `{}`: shape {:?} is too large",
                        d.name, d.shape
                    ))
                })?;
            }
        }
        let mut prefix = Graph {
            nodes: Vec::with_capacity(self.nodes.len()),
            ..Graph {
                format: FORMAT.into(),
                inputs: self.inputs.clone(),
                parameters: self.parameters.clone(),
                nodes: vec![],
                outputs: vec![],
            }
        };
        // one leaf node per declared input or parameter: two nodes reading the same input
        // ran, then gave two gradients of one name (`grad.x` declared twice under --grad)
        let mut leaves = HashSet::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if node.id != index {
                return Err(GraphError::BadId { index, id: node.id });
            }
            let leaf = match &node.kind {
                NodeKind::Input { name } => Some(("input node", name)),
                NodeKind::Parameter { name } => Some(("parameter node", name)),
                NodeKind::Constant { name } => Some(("constant node", name)),
                _ => None,
            };
            if let Some((what, name)) = leaf {
                if !leaves.insert(name.as_str()) {
                    return Err(GraphError::Duplicate {
                        what,
                        name: name.clone(),
                    });
                }
            }
            if node.dtype != "f32" {
                return Err(GraphError::Dtype {
                    node: index,
                    dtype: node.dtype.clone(),
                });
            }
            check_size(index, &node.shape)?;
            let shape = prefix.infer(index, &node.kind, &node.parents)?;
            check_size(index, &shape)?;
            if shape != node.shape {
                return Err(GraphError::ShapeMismatch {
                    node: index,
                    declared: node.shape.clone(),
                    reason: format!("the inferred shape is {shape:?}"),
                });
            }
            prefix.nodes.push(node.clone());
        }
        let mut out_names = HashSet::new();
        for o in &self.outputs {
            if o.node >= self.nodes.len() {
                return Err(GraphError::BadOutput {
                    name: o.name.clone(),
                    node: o.node,
                });
            }
            if !out_names.insert(o.name.as_str()) {
                return Err(GraphError::Duplicate {
                    what: "output",
                    name: o.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Reads an untrusted graph file: at most [`MAX_GRAPH_BYTES`] (devices refused, pipes
    /// read up to the limit: [`crate::files::read_capped`]), then [`Graph::from_json`].
    /// Every error names the file.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Graph, GraphError> {
        let path = path.as_ref();
        let bytes =
            crate::files::read_capped(path, MAX_GRAPH_BYTES).map_err(|e| GraphError::File {
                path: path.display().to_string(),
                reason: format!("graph file: {e}"),
            })?;
        Graph::from_json(&bytes, &path.display().to_string())
    }

    /// Reads untrusted graph bytes (`name` names the source in errors): parsed strictly
    /// (unknown fields anywhere are refused), validated ([`Graph::validate`]) and checked for
    /// reserved names ([`Graph::check_user_names`]) before it is returned.
    pub fn from_json(bytes: &[u8], name: &str) -> Result<Graph, GraphError> {
        // a UTF-8 byte-order mark (Windows editors write one) is not part of the JSON, as
        // the CSV and text readers already skip it
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let graph: Graph = serde_json::from_slice(bytes).map_err(|e| GraphError::File {
            path: name.to_string(),
            reason: format!("not a {FORMAT} graph: {e}{}", onnx_hint(bytes)),
        })?;
        graph
            .validate()
            .and_then(|()| graph.check_user_names())
            .map_err(|e| GraphError::InFile {
                path: name.to_string(),
                source: Box::new(e),
            })?;
        Ok(graph)
    }

    /// The output to differentiate: the one named `loss`, or else the only one-element
    /// output.
    pub fn loss_output(&self) -> Result<&str, GraphError> {
        if let Some(o) = self.outputs.iter().find(|o| o.name == "loss") {
            return Ok(&o.name);
        }
        let scalars: Vec<&str> = self
            .outputs
            .iter()
            .filter(|o| self.nodes.get(o.node).is_some_and(|n| numel(&n.shape) == 1))
            .map(|o| o.name.as_str())
            .collect();
        match scalars.as_slice() {
            [one] => Ok(one),
            _ => Err(GraphError::Other(
                "backward needs an output named `loss` or exactly one one-element output".into(),
            )),
        }
    }

    /// Number of f32 elements of every node (for memory planning and reports).
    pub fn node_elements(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| numel(&n.shape)).collect()
    }
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new()
    }
}

/// A hint for graph bytes that look like an ONNX model (a protobuf message starting with
/// field 1, `ir_version`, as a varint): the command chose the JSON reader because the path
/// has no `.onnx` extension (a pipe, `<(cat model.onnx)`: the forty-fifth session's
/// hostile-input audit).
fn onnx_hint(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(&[0x08]) && bytes.get(1).is_some_and(|&b| b != 0) {
        " (this looks like an ONNX model: the format is chosen by the file's name — give it a path ending in `.onnx`, e.g. save it to a file first)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_refuses_the_node_past_the_limit() {
        let mut g = Graph::new();
        g.inputs.push(ValueDecl {
            name: "x".into(),
            shape: vec![1],
        });
        for _ in 0..MAX_NODES {
            g.push(NodeKind::Input { name: "x".into() }, vec![])
                .expect("below the limit");
        }
        let err = g
            .push(NodeKind::Input { name: "x".into() }, vec![])
            .expect_err("the node past the limit");
        assert!(
            matches!(err, GraphError::TooManyNodes { count } if count == MAX_NODES + 1),
            "{err}"
        );
        assert_eq!(g.nodes.len(), MAX_NODES);
    }
}
