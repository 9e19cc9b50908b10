//! ONNX graph → torchlean graph.
//!
//! The walk is node by node in file order (ONNX requires a topological order; a node that
//! reads a value not yet defined is reported). Each ONNX value becomes one of:
//! - a graph node (the output of a mapped op, a graph input, a parameter once used as data);
//! - an import-time constant (`Constant` nodes, shapes, and what is computed from them only),
//!   materialized as a torchlean `constant` node if an op reads it as data;
//! - a parameter: every float initializer. Initializers are never folded, so gradients reach
//!   them under `--grad` with their ONNX names (PyTorch's `state_dict` names).
//!
//! Failures are collected, not raised: an unsupported node poisons its outputs, nodes that
//! read a poisoned value are skipped silently (their cause is already listed), and the walk
//! goes on, so the error lists every node that needs something torchlean lacks.
//!
//! After each node, the shapes ONNX declares for its outputs (`value_info`, graph outputs)
//! are compared with torchlean's inference: a mismatch is reported like an unsupported node.

mod attention;
mod attrs;
mod composite;
mod control;
mod einsum;
mod integer;
mod loss;
mod ops;
mod pad;
mod patterns;
mod recurrent;
mod resize;
mod scatter;
mod sequence;
mod sign;
mod topk;
mod window;

pub use integer::InputLimit;
pub use ops::supported_operators;

use crate::constant::{dtype, sizes, Const};
use crate::error::{OnnxError, Unsupported};
use crate::model::default_opset;
use onnx_protobuf::{
    tensor_shape_proto::dimension, type_proto, ModelProto, NodeProto, ValueInfoProto,
};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use torchlean::graph::{Graph, NodeKind, Op, OutputDecl, ValueDecl};
use torchlean::tensor::io::StoredDtype;
use torchlean::Tensor;

/// An imported model: the graph and the values of its parameters and constants.
pub struct Imported {
    pub graph: Graph,
    /// Parameters (the model's initializers) and constants, by name.
    pub values: Vec<(String, Tensor)>,
    /// The model's default-domain opset.
    pub opset: i64,
    /// The inputs the model declares as integers (int64, int32), with their ONNX type code:
    /// torchlean reads them as float32 holding integers, so the values bound to them must be
    /// integers in the type's range ([`Imported::check_inputs`]).
    pub integer_inputs: Vec<(String, i32)>,
    /// The limit on the magnitudes of the int32/int64 inputs' values: 2^24, or lower where
    /// the model's arithmetic on them is exact in float32 only below it (`lengths − 1`),
    /// with the node that asked for it.
    pub integer_input_limit: integer::InputLimit,
    /// Parameters whose initializer the import also read as a constant (a Clip bound, a Pow
    /// exponent) in other uses: those uses keep the file's value, so another value given for
    /// the parameter, or its gradient, would cover only its uses as a parameter.
    pub baked_parameters: Vec<String>,
    /// Float initializers read only as import-time constants (a Pow exponent, a Resize
    /// scale): not parameters of the graph, so `--grad` writes no gradient for them, where
    /// PyTorch would for an `nn.Parameter` (the CLI says so when it differentiates).
    pub constant_initializers: Vec<String>,
    /// The element type the model declares for each output, where it is not float32 (an
    /// `ArgMax`'s int64, a comparison's bool, a `Cast` to float64): torchlean computes them
    /// as float32 values, and a caller writing the outputs writes them in these types, as
    /// PyTorch and onnxruntime return them (`torchlean run-graph` does).
    pub output_dtypes: Vec<(String, StoredDtype)>,
    /// The nodes the import evaluated in float32 arithmetic on constants, by ONNX operator,
    /// with their counts (`Sqrt` of a constant, `Div` of two: with the reference kernels'
    /// formulas, but by the importer, before any plan: outside the gate, so a run's report
    /// lists them apart). Moves, selections, comparisons, shape queries, `Neg`, `Abs` and
    /// integer arithmetic, which round nothing, are not counted.
    pub evaluated_at_import: Vec<(String, usize)>,
}

/// Operators whose evaluation on constants rounds nothing: their results are operands'
/// elements, comparisons, shapes or exact integers ([`Imported::evaluated_at_import`]).
const EXACT_ON_CONSTANTS: &[&str] = &[
    "Constant",
    "ConstantOfShape",
    "Identity",
    "Shape",
    "Size",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Expand",
    "Concat",
    "Slice",
    "Split",
    "Gather",
    "GatherND",
    "GatherElements",
    "Tile",
    "Trilu",
    "Where",
    "Max",
    "Min",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Not",
    "And",
    "Or",
    "Xor",
    "Neg",
    "Abs",
    "Sign",
    "Cast",
    "CastLike",
];

impl Imported {
    /// Checks values supplied for the model's inputs against the element types the model
    /// declares: an input declared int64 or int32 must hold integers within that type's range
    /// (and within 2^24, where float32 holds every integer, or the lower limit the model's
    /// arithmetic on them asked for: `integer_input_limit`). Names the model does not
    /// declare as integers are not checked here.
    pub fn check_inputs(&self, inputs: &[(String, Tensor)]) -> Result<(), OnnxError> {
        for (name, t) in inputs {
            let Some((_, ty)) = self.integer_inputs.iter().find(|(n, _)| n == name) else {
                continue;
            };
            let limit = self.integer_input_limit.limit as f32;
            let fits = |v: f32| match *ty {
                dtype::BOOL => v == 0.0 || v == 1.0,
                _ => v.fract() == 0.0 && v.abs() <= limit,
            };
            if let Some((i, v)) = t.data().iter().enumerate().find(|(_, v)| !fits(**v)) {
                let required = match (&self.integer_input_limit.set_by, *ty == dtype::BOOL) {
                    (_, true) => {
                        "0 or 1 is required: torchlean reads a boolean input as float32 0/1".into()
                    }
                    (None, false) => "an integer of magnitude at most 2^24 is required: torchlean reads integer inputs as float32".into(),
                    (Some((node, op)), false) => format!(
                        "an integer of magnitude at most {limit} is required: torchlean reads integer inputs as float32, and node `{node}` (`{op}`) computes on them exactly only up to there"
                    ),
                };
                return Err(OnnxError::Input {
                    name: name.clone(),
                    reason: format!(
                        "the model declares it {}, but element {i} is {v} ({required})",
                        dtype::name(*ty)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The prefix of the names of constants the importer materializes (`onnx.const.<value>`).
pub const CONSTANT_PREFIX: &str = "onnx.const.";

/// What an ONNX value is during the import.
#[derive(Clone)]
pub(crate) enum Value {
    /// A graph node.
    Node(usize),
    /// A value known at import time (not derived from inputs or parameters).
    Const(Rc<Const>),
    /// A float initializer: a parameter, declared on first use as data.
    Param(String),
}

/// The import state shared by the op mappings.
pub(crate) struct Builder {
    pub graph: Graph,
    pub opset: i64,
    values: HashMap<String, Value>,
    initializers: HashMap<String, Rc<Const>>,
    /// Each initializer's element type as the file declares it (what `CastLike` casts to).
    init_types: HashMap<String, i32>,
    /// The bound on the elements of all constants evaluated at import time.
    pub budget: crate::constant::Budget,
    materialized: HashMap<String, usize>,
    pub(crate) stored: Vec<(String, Tensor)>,
    constants: usize,
    /// Every name the model uses (initializers, inputs, outputs, node inputs and outputs,
    /// value_info): the generated constant names skip them.
    taken: HashSet<String>,
    /// Nodes holding integers: graph inputs the model declares as integers (read as float32
    /// integers) and what only moves their elements. A `Cast` of one to an integer type
    /// changes nothing.
    pub integral: HashSet<usize>,
    /// The integral nodes that hold booleans as 0/1: graph inputs the model declares bool and
    /// what only moves their elements (what `Not` may read).
    pub boolean: HashSet<usize>,
    /// Float initializers whose values the import read as constants (a Clip bound, a Pow
    /// exponent, a Pad value): those uses keep the file's value whatever `--params` says.
    read_as_constants: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

type Map<T> = Result<T, String>;

impl Builder {
    /// The graph node of a value, declaring a parameter or constant on first use.
    pub fn node(&mut self, v: &Value) -> Map<usize> {
        match v {
            Value::Node(id) => Ok(*id),
            Value::Param(name) => {
                if let Some(&id) = self.materialized.get(name) {
                    return Ok(id);
                }
                // invariant: a Param value is made only for a decoded initializer (import_model)
                let c = self.initializers[name].clone();
                match c.data {
                    crate::constant::Data::F32(_) => {}
                    // a boolean initializer (a mask) or an integer one (a bound, an index
                    // list) is data, not a trainable parameter: a constant, integers exact
                    // up to 2^24 as a `Constant` node's (an integer initializer was refused at
                    // any size, the same value as a `Constant` node accepted: an audit of the
                    // thirty-seventh session)
                    crate::constant::Data::Bool(_) | crate::constant::Data::I64(_) => {
                        let id = self.node(&Value::Const(c.clone()))?;
                        self.materialized.insert(name.clone(), id);
                        return Ok(id);
                    }
                }
                let t = Tensor::from_vec(c.try_floats()?, &c.dims).map_err(|e| e.to_string())?;
                self.graph.parameters.push(ValueDecl {
                    name: name.clone(),
                    shape: c.dims.clone(),
                });
                self.stored.push((name.clone(), t));
                let id = self.push(NodeKind::Parameter { name: name.clone() }, vec![])?;
                self.materialized.insert(name.clone(), id);
                Ok(id)
            }
            Value::Const(c) => {
                // integers read as data are float32 values: exact only up to 2^24
                if let crate::constant::Data::I64(v) = &c.data {
                    if let Some(big) = v.iter().find(|x| x.unsigned_abs() > 1 << 24) {
                        return Err(format!(
                            "the integer constant {big} is read as data, beyond 2^24 (torchlean's tensors are float32, exact for integers only up to 2^24)"
                        ));
                    }
                }
                // the next `onnx.const.N` that no value of the model is named
                let name = loop {
                    self.constants += 1;
                    let name = format!("{CONSTANT_PREFIX}{}", self.constants);
                    if !self.taken.contains(&name) {
                        break name;
                    }
                };
                let t = Tensor::from_vec(c.try_floats()?, &c.dims).map_err(|e| e.to_string())?;
                self.graph.parameters.push(ValueDecl {
                    name: name.clone(),
                    shape: c.dims.clone(),
                });
                self.stored.push((name.clone(), t));
                self.push(NodeKind::Constant { name }, vec![])
            }
        }
    }

    fn push(&mut self, kind: NodeKind, parents: Vec<usize>) -> Map<usize> {
        self.graph.push(kind, parents).map_err(|e| e.to_string())
    }

    /// Appends an op over graph nodes.
    pub fn op(&mut self, op: Op, parents: Vec<usize>) -> Map<usize> {
        self.push(NodeKind::Op { op }, parents)
    }

    /// Appends an op over values (materializing constants and parameters).
    pub fn op_on(&mut self, op: Op, inputs: &[&Value]) -> Map<Value> {
        let parents = inputs
            .iter()
            .map(|v| self.node(v))
            .collect::<Map<Vec<usize>>>()?;
        // integer values stay integer through the ops that only move elements
        let moves = op.kind().only_moves_elements();
        let integral = moves && parents.iter().all(|p| self.integral.contains(p));
        let boolean = moves && parents.iter().all(|p| self.boolean.contains(p));
        let id = self.op(op, parents)?;
        if integral {
            self.integral.insert(id);
        }
        if boolean {
            self.boolean.insert(id);
        }
        Ok(Value::Node(id))
    }

    /// The shape of a value.
    pub fn shape(&self, v: &Value) -> Vec<usize> {
        match v {
            Value::Node(id) => self.graph.nodes[*id].shape.clone(),
            Value::Const(c) => c.dims.clone(),
            // invariant: a Param value is made only for a decoded initializer
            Value::Param(name) => self.initializers[name].dims.clone(),
        }
    }

    /// The value as an import-time constant, if it is one (initializers included: reading
    /// an integer initializer as a shape is not a use of a parameter).
    pub fn known(&self, v: &Value) -> Option<Rc<Const>> {
        match v {
            Value::Node(_) => None,
            Value::Const(c) => Some(c.clone()),
            Value::Param(name) => {
                let c = self.initializers.get(name).cloned();
                if c.as_ref()
                    .is_some_and(|c| !matches!(c.data, crate::constant::Data::I64(_)))
                {
                    self.read_as_constants.borrow_mut().insert(name.clone());
                }
                c
            }
        }
    }

    /// The ONNX element type of a value (what `CastLike` casts to): a constant's, an
    /// initializer's as declared in the file, and for a node int64 when the import tracks it
    /// as integral, else float32.
    pub fn elem_type(&self, v: &Value) -> i32 {
        match v {
            Value::Const(c) => c.dtype(),
            Value::Param(name) => self.init_types.get(name).copied().unwrap_or(dtype::FLOAT),
            Value::Node(id) if self.integral.contains(id) => dtype::INT64,
            Value::Node(_) => dtype::FLOAT,
        }
    }

    /// The value as a folding operand: constants, and integer (or boolean) initializers,
    /// which can never be parameters (torchlean's tensors are f32) — exporters store shape
    /// arithmetic's operands such as `[-1]` as initializers. A float initializer is a
    /// parameter and never folded.
    pub fn folded(&self, v: &Value) -> Option<Rc<Const>> {
        match v {
            Value::Const(c) => Some(c.clone()),
            Value::Param(name) => self
                .initializers
                .get(name)
                .filter(|c| matches!(c.data, crate::constant::Data::I64(_)))
                .cloned(),
            Value::Node(_) => None,
        }
    }

    /// Integers an operand must hold at import time (a shape, axes, starts, ...).
    pub fn ints(&self, v: &Value, what: &str) -> Map<Vec<i64>> {
        self.known(v)
            .ok_or_else(|| format!("`{what}` must be known at import time (a constant or an initializer), but it is computed from the inputs"))?
            .ints()
    }
}

fn declared_shape(v: &ValueInfoProto) -> Option<Vec<Option<usize>>> {
    match v.type_.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(
            t.shape
                .as_ref()?
                .dim
                .iter()
                .map(|d| match &d.value {
                    Some(dimension::Value::DimValue(n)) => usize::try_from(*n).ok(),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

fn elem_type(v: &ValueInfoProto) -> Option<i32> {
    match v.type_.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t.elem_type),
        _ => None,
    }
}

/// Translates a decoded model. `input_shapes` fixes inputs whose ONNX shape has symbolic or
/// missing dimensions (a shape that ONNX states concretely must be given as stated). `name`
/// is used in messages.
pub fn import_model(
    model: &ModelProto,
    name: &str,
    input_shapes: &HashMap<String, Vec<usize>>,
) -> Result<Imported, OnnxError> {
    let opset = default_opset(model, name)?;
    let g = model.graph.as_ref().ok_or_else(|| OnnxError::Model {
        path: name.into(),
        reason: "the model has no graph".into(),
    })?;
    // the shapes given for inputs are the caller's (`--input-shape`), not the model's: one
    // that names no input, or contradicts a concrete declared shape, is that error (it was
    // listed as an "unsupported node")
    let initializers: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let model_inputs: Vec<&ValueInfoProto> = g
        .input
        .iter()
        .filter(|i| !initializers.contains(i.name.as_str()))
        .collect();
    let mut given_names: Vec<&String> = input_shapes.keys().collect();
    given_names.sort();
    for given in given_names {
        let shape = &input_shapes[given];
        let Some(input) = model_inputs.iter().find(|i| &i.name == given) else {
            let names: Vec<&str> = model_inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(OnnxError::Input {
                name: given.clone(),
                reason: format!(
                    "a shape was given for an input the model does not have (its inputs: {})",
                    names.join(", ")
                ),
            });
        };
        if let Some(dims) = declared_shape(input) {
            let agrees = dims.len() == shape.len()
                && dims
                    .iter()
                    .zip(shape)
                    .all(|(d, g)| d.is_none_or(|d| d == *g));
            if !agrees {
                return Err(OnnxError::Input {
                    name: given.clone(),
                    reason: format!(
                        "the model declares shape {} but {shape:?} was given",
                        show_dims(&dims)
                    ),
                });
            }
        }
    }
    let mut failures: Vec<Unsupported> = vec![];
    let mut fail = |name: &str, op_type: &str, reason: String| {
        failures.push(Unsupported {
            name: name.to_string(),
            op_type: op_type.to_string(),
            reason,
        })
    };
    let mut evaluated: std::collections::BTreeMap<String, usize> = Default::default();
    let mut b = Builder {
        graph: Graph::new(),
        opset,
        values: HashMap::new(),
        initializers: HashMap::new(),
        init_types: HashMap::new(),
        budget: Default::default(),
        materialized: HashMap::new(),
        stored: vec![],
        constants: 0,
        taken: g
            .initializer
            .iter()
            .map(|t| &t.name)
            .chain(
                g.input
                    .iter()
                    .chain(&g.output)
                    .chain(&g.value_info)
                    .map(|v| &v.name),
            )
            .chain(g.node.iter().flat_map(|n| n.input.iter().chain(&n.output)))
            .cloned()
            .collect(),
        integral: Default::default(),
        boolean: Default::default(),
        read_as_constants: Default::default(),
    };
    // every name a value is defined under: initializers, graph inputs, node outputs (ONNX
    // graphs are in SSA form: each name is defined once)
    let mut defined: HashSet<String> = HashSet::new();
    // names whose definition failed: what reads them is skipped (the cause is listed)
    let mut poisoned: HashSet<String> = HashSet::new();
    // float64 constants that float32 does not hold exactly (a comparison of a float64 value
    // with one is refused: `integer::check_double`)
    let mut inexact: HashSet<String> = HashSet::new();
    for t in &g.initializer {
        if !defined.insert(t.name.clone()) {
            fail(
                &t.name,
                "initializer",
                "two initializers have this name (ONNX names each value once)".into(),
            );
            continue;
        }
        if crate::constant::rounds_doubles(t) {
            inexact.insert(t.name.clone());
        }
        match Const::from_proto(t) {
            Ok(c) => {
                b.init_types.insert(t.name.clone(), t.data_type);
                b.initializers.insert(t.name.clone(), Rc::new(c));
                b.values
                    .insert(t.name.clone(), Value::Param(t.name.clone()));
            }
            Err(e) => {
                fail(&t.name, "initializer", e);
                poisoned.insert(t.name.clone());
            }
        }
    }
    // graph inputs (older IR versions also list the initializers here)
    let initializer_names = defined.clone();
    let mut integer_inputs = vec![];
    // ONNX values of type int32/int64 computed at run time (`integer`)
    let mut int_typed = integer::IntegerBounds::new();
    // the limit on the integer inputs' magnitudes (lowered where arithmetic on them needs it)
    let mut input_limit = integer::InputLimit::default();
    // float64-typed values (a float32 value cast to DOUBLE: the same numbers), read only by
    // what is exact on them (`integer::check_double`)
    let mut double_typed: HashSet<String> = HashSet::new();
    // sequences (a SplitToSequence's parts), with the name of the value they split
    let mut sequences: HashMap<String, (Vec<Value>, String)> = HashMap::new();
    for input in &g.input {
        if initializer_names.contains(&input.name) {
            continue;
        }
        if !defined.insert(input.name.clone()) {
            fail(
                &input.name,
                "input",
                "two graph inputs have this name (ONNX names each value once)".into(),
            );
            continue;
        }
        let given = input_shapes.get(&input.name);
        let shape = match (declared_shape(input), given) {
            // integer inputs (token ids, indices) are read as float32 holding integers,
            // exact up to 2^24: an index tensor in torchlean's vocabulary
            (_, _)
                if !matches!(
                    elem_type(input),
                    Some(dtype::FLOAT | dtype::INT64 | dtype::INT32 | dtype::BOOL)
                ) =>
            {
                fail(
                    &input.name,
                    "input",
                    format!(
                        "inputs of type {} are not supported (float32, and int64/int32/bool read as float32 integers)",
                        elem_type(input).map_or("unknown".into(), dtype::name)
                    ),
                );
                continue;
            }
            // agrees with the declared dims: checked above, before anything was translated
            (Some(_), Some(given)) => given.clone(),
            (Some(dims), None) if dims.iter().all(Option::is_some) => {
                dims.into_iter().flatten().collect()
            }
            (dims, None) => {
                fail(&input.name, "input", format!(
                    "the shape {} has symbolic or missing dimensions; give the input's shape (--input-shape {}=D0,D1,...)",
                    dims.as_deref().map_or("(none)".into(), show_dims), input.name));
                continue;
            }
            (None, Some(given)) => given.clone(),
        };
        // a given dimension beyond i64 (`--input-shape x=18446744073709551615`) is named as
        // given, not wrapped to a negative one
        let dims = match shape
            .iter()
            .map(|&d| i64::try_from(d).map_err(|_| d))
            .collect::<Result<Vec<i64>, usize>>()
        {
            Ok(dims) => dims,
            Err(d) => {
                fail(
                    &input.name,
                    "input",
                    format!("the dimension {d} in {shape:?} is above the bound of 2^31 elements a tensor may have"),
                );
                continue;
            }
        };
        if let Err(e) = sizes(&dims) {
            fail(&input.name, "input", e);
            continue;
        }
        b.graph.inputs.push(ValueDecl {
            name: input.name.clone(),
            shape,
        });
        match b.push(
            NodeKind::Input {
                name: input.name.clone(),
            },
            vec![],
        ) {
            Ok(id) => {
                if let Some(ty) = elem_type(input).filter(|&t| t != dtype::FLOAT) {
                    b.integral.insert(id);
                    if ty == dtype::BOOL {
                        b.boolean.insert(id);
                    }
                    integer_inputs.push((input.name.clone(), ty));
                    if matches!(ty, dtype::INT32 | dtype::INT64) {
                        // check_inputs holds them to magnitudes of at most 2^24, or
                        // the lower limit arithmetic on them asked for (`input_limit`)
                        int_typed.insert(input.name.clone(), integer::Bound::INPUT);
                    }
                }
                b.values.insert(input.name.clone(), Value::Node(id));
            }
            Err(e) => fail(&input.name, "input", e),
        }
    }
    // an input refused above: what reads it is skipped (its cause is listed)
    for input in &g.input {
        if !b.values.contains_key(&input.name) {
            poisoned.insert(input.name.clone());
        }
    }
    let declared: HashMap<&str, Vec<Option<usize>>> = g
        .value_info
        .iter()
        .chain(&g.output)
        .filter_map(|v| Some((v.name.as_str(), declared_shape(v)?)))
        .collect();
    // the names something reads (a node, in any branch, or the graph's outputs): a value no
    // one reads is not held to its declared shape — PyTorch's dynamo exporter with its
    // optimizer on declares an LSTM's unused Y with Y_h's shape, and onnxruntime runs such
    // a model (a mismatch on a value that is read is still refused)
    let mut read: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    fn reads(g: &onnx_protobuf::GraphProto, into: &mut HashSet<String>) {
        for n in &g.node {
            into.extend(n.input.iter().cloned());
            for a in &n.attribute {
                if let Some(sub) = a.g.as_ref() {
                    reads(sub, into);
                    into.extend(sub.output.iter().map(|o| o.name.clone()));
                }
            }
        }
    }
    reads(g, &mut read);
    // exporters' multi-node forms of one torchlean op (the Erf form of GELU) become one node
    let mut nodes: std::collections::VecDeque<NodeProto> = patterns::fuse_gelu(g).into();
    let mut index = 0usize;
    while let Some(node) = nodes.pop_front() {
        index += 1;
        let node = &node;
        let label = if node.name.is_empty() {
            node.output
                .first()
                .cloned()
                .unwrap_or_else(|| format!("node {}", index - 1))
        } else {
            node.name.clone()
        };
        let mut fail_node = |reason: String| fail(&label, &node.op_type, reason);
        // an `If` whose condition is known at import (exporters write them over shapes:
        // `Tensor.tile`, `diagonal`) is its chosen branch: the branch's nodes run next, then
        // an `Identity` per output gives the branch's results the `If`'s names
        if node.op_type == "If" && node.domain.is_empty() {
            let cond_name = node.input.first().map_or("", String::as_str);
            if poisoned.contains(cond_name) {
                poisoned.extend(node.output.iter().cloned());
                continue;
            }
            // a condition held by an initializer or a Constant is known at import
            let cond = b
                .values
                .get(cond_name)
                .map(|v| b.known(v).map(Value::Const).unwrap_or_else(|| v.clone()));
            match control::chosen_branch(node, cond_name, cond.as_ref()) {
                Ok(spliced) => {
                    for n in spliced.into_iter().rev() {
                        nodes.push_front(n);
                    }
                    continue;
                }
                Err(reason) => {
                    fail_node(reason);
                    poisoned.extend(node.output.iter().cloned());
                    continue;
                }
            }
        }
        // SSA: an output name defined before (an initializer, a graph input, an earlier
        // node's output, or this node's own other output) is refused, and the name poisoned
        if let Some(again) = node
            .output
            .iter()
            .filter(|o| !o.is_empty())
            .find(|o| !defined.insert(o.to_string()))
        {
            let what = if initializer_names.contains(again) {
                "an initializer"
            } else if g.input.iter().any(|i| &i.name == again) {
                "a graph input"
            } else {
                "an earlier output"
            };
            fail_node(format!(
                "writes `{again}`, which {what} already defines (ONNX graphs define each name once)"
            ));
            poisoned.extend(node.output.iter().cloned());
            continue;
        }
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            fail_node(format!(
                "operators of domain `{}` are not supported (only the default ai.onnx domain)",
                node.domain
            ));
            poisoned.extend(node.output.iter().cloned());
            continue;
        }
        // sequences held at import as lists of values (`import/sequence.rs`)
        if matches!(node.op_type.as_str(), "SplitToSequence" | "SequenceAt") {
            if node.input.iter().any(|i| poisoned.contains(i)) {
                poisoned.extend(node.output.iter().cloned());
                continue;
            }
            let attrs = attrs::Attrs::new(node);
            let source = node.input.first().cloned().unwrap_or_default();
            let result = if node.op_type == "SplitToSequence" {
                let inputs: Vec<Option<Value>> = node
                    .input
                    .iter()
                    .map(|i| b.values.get(i).cloned())
                    .collect();
                match inputs.first() {
                    Some(Some(_)) => sequence::split_to_sequence(&mut b, &attrs, &inputs)
                        .map(|parts| (parts, source)),
                    _ => Err(format!(
                        "reads `{source}`, which no earlier node, input or initializer defines"
                    )),
                }
            } else {
                match (sequences.get(&source), node.input.get(1).and_then(|p| b.values.get(p))) {
                    (Some((parts, from)), Some(pos)) => sequence::position(&b, pos, parts.len())
                        .map(|k| (vec![parts[k].clone()], from.clone())),
                    (None, _) => Err(format!(
                        "reads `{source}`, which is not a sequence of a SplitToSequence (only those are supported)"
                    )),
                    (_, None) => Err("SequenceAt needs a position".into()),
                }
            };
            let unread = attrs.unread();
            match (result, node.output.first()) {
                (Ok(_), _) if !unread.is_empty() => {
                    fail_node(format!(
                        "attribute(s) {} are not supported",
                        unread.join(", ")
                    ));
                    poisoned.extend(node.output.iter().cloned());
                }
                (Ok((values, from)), Some(out)) => {
                    // the parts hold what the split value holds (integers keep its bound)
                    let bound = int_typed.get(&from).copied();
                    if node.op_type == "SplitToSequence" {
                        sequences.insert(out.clone(), (values, from));
                    } else {
                        if let Some(bound) = bound {
                            int_typed.insert(out.clone(), bound);
                        }
                        if double_typed.contains(&from) {
                            double_typed.insert(out.clone());
                        }
                        b.values.insert(out.clone(), values[0].clone());
                    }
                }
                (Ok(_), None) => {}
                (Err(reason), _) => {
                    fail_node(reason);
                    poisoned.extend(node.output.iter().cloned());
                }
            }
            continue;
        }
        if !ops::is_known(&node.op_type) {
            fail_node(format!(
                "no torchlean mapping for `{}` (docs/onnx.md lists the supported operators)",
                node.op_type
            ));
            poisoned.extend(node.output.iter().cloned());
            continue;
        }
        // inputs: "" is an omitted optional input
        let mut inputs: Vec<Option<Value>> = Vec::with_capacity(node.input.len());
        let mut blocked = false;
        for i in &node.input {
            if i.is_empty() {
                inputs.push(None);
            } else if poisoned.contains(i) {
                blocked = true;
            } else if let Some(v) = b.values.get(i) {
                inputs.push(Some(v.clone()));
            } else {
                fail_node(format!(
                    "reads `{i}`, which no earlier node, input or initializer defines"
                ));
                blocked = true;
            }
        }
        if blocked {
            poisoned.extend(node.output.iter().cloned());
            continue;
        }
        let attrs = attrs::Attrs::new(node);
        let introduced = if node.doc_string == patterns::REWRITTEN {
            Ok(())
        } else {
            ops::check_introduced(&node.op_type, b.opset)
        };
        let result = introduced
            .and_then(|()| ops::map(&mut b, &node.op_type, &attrs, &inputs))
            .and_then(|outs| {
                let unread = attrs.unread();
                if unread.is_empty() {
                    integer::check(
                        &b,
                        &int_typed,
                        &mut input_limit,
                        if node.name.is_empty() {
                            node.output.first().map_or("", String::as_str)
                        } else {
                            &node.name
                        },
                        &node.op_type,
                        &node.input,
                        &inputs,
                        &outs,
                    )?;
                    integer::check_double(
                        &double_typed,
                        &inexact,
                        &node.op_type,
                        &node.input,
                        &outs,
                    )?;
                    Ok(outs)
                } else {
                    Err(format!(
                        "attribute(s) {} are not supported",
                        unread.join(", ")
                    ))
                }
            });
        let cast_to = node.attribute.iter().find(|a| a.name == "to").map(|a| a.i);
        if node.op_type == "Constant"
            && node
                .attribute
                .iter()
                .filter_map(|a| a.t.as_ref())
                .any(crate::constant::rounds_doubles)
        {
            inexact.extend(node.output.iter().cloned());
        }
        match result {
            Ok(outs) => {
                let float_const = |v: &Value| matches!(v, Value::Const(c) if matches!(c.data, crate::constant::Data::F32(_)));
                if !EXACT_ON_CONSTANTS.contains(&node.op_type.as_str())
                    && outs.iter().any(float_const)
                {
                    *evaluated.entry(node.op_type.clone()).or_default() += 1;
                }
                let wanted = node.output.iter().filter(|o| !o.is_empty()).count();
                if outs.len() < wanted {
                    fail_node(format!(
                        "only the first {} output(s) are supported",
                        outs.len()
                    ));
                    poisoned.extend(node.output.iter().cloned());
                    continue;
                }
                for (out, v) in node.output.iter().zip(outs) {
                    if out.is_empty() {
                        continue;
                    }
                    if let Some(dims) = declared.get(out.as_str()).filter(|_| read.contains(out)) {
                        let ours = b.shape(&v);
                        let agrees = dims.len() == ours.len()
                            && dims
                                .iter()
                                .zip(&ours)
                                .all(|(d, o)| d.is_none_or(|d| d == *o));
                        if !agrees {
                            fail_node(format!(
                                "ONNX declares `{out}` with shape {}, torchlean infers {ours:?}",
                                show_dims(dims)
                            ));
                        }
                    }
                    let bound = integer::output_bound(
                        &b,
                        &int_typed,
                        &node.op_type,
                        cast_to,
                        &node.input,
                        &inputs,
                        &v,
                    );
                    let is_integer = bound.is_some();
                    // (TopK's indices are int64 even where its values are float64)
                    if !is_integer
                        && integer::output_is_double(
                            &double_typed,
                            &node.op_type,
                            cast_to,
                            &node.input,
                            &v,
                        )
                    {
                        double_typed.insert(out.clone());
                        // a float64 value that moves or selects a float64 constant float32
                        // does not hold (`Where(m, x.double(), 0.1)`) holds it rounded: what
                        // compares it is refused (`check_double`), and so is a graph output
                        // of it (written as F64 it would claim PyTorch's 0.1)
                        if !matches!(node.op_type.as_str(), "Cast" | "CastLike")
                            && node.input.iter().any(|n| inexact.contains(n))
                        {
                            inexact.insert(out.clone());
                        }
                    }
                    if let Some(bound) = bound {
                        int_typed.insert(out.clone(), bound);
                        // what reads indices (Gather, Embedding's pattern) takes it too:
                        // `Clip`, `Abs`, `Max`, `ReduceMax`, … of token ids are ids (refused
                        // as "computed from float values" before the thirty-seventh session)
                        if let Value::Node(id) = &v {
                            b.integral.insert(*id);
                        }
                    }
                    b.values.insert(out.clone(), v);
                }
            }
            Err(reason) => {
                fail_node(reason);
                poisoned.extend(node.output.iter().cloned());
            }
        }
    }
    let output_dtypes = g
        .output
        .iter()
        .filter_map(|o| Some((o.name.clone(), stored_dtype(elem_type(o)?)?)))
        .collect();
    for out in &g.output {
        if poisoned.contains(&out.name) {
            continue;
        }
        if elem_type(out) == Some(dtype::DOUBLE) && inexact.contains(&out.name) {
            fail(
                &out.name,
                "output",
                "a float64 output holding a float64 constant that float32 does not hold exactly: torchlean computes in float32, so its value would differ from the model's (cast the constant, or the output, to float32 in the model)".into(),
            );
            continue;
        }
        let v = match b.values.get(&out.name) {
            Some(v) => v.clone(),
            None => {
                fail(
                    &out.name,
                    "output",
                    "no node, input or initializer defines it".into(),
                );
                continue;
            }
        };
        match b.node(&v) {
            Ok(node) => b.graph.outputs.push(OutputDecl {
                name: out.name.clone(),
                node,
            }),
            Err(e) => fail(&out.name, "output", e),
        }
    }
    if !failures.is_empty() {
        return Err(OnnxError::Unsupported {
            path: name.into(),
            list: failures,
        });
    }
    // the exporter's attention subgraphs become `scaled_dot_product_attention` nodes
    let constant = |n: &str| {
        b.stored
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, t)| t.to_vec())
    };
    let (mut graph, dropped) =
        attention::fuse_attention(&b.graph, &constant).map_err(|e| OnnxError::Model {
            path: name.into(),
            reason: e.to_string(),
        })?;
    // the constants the attention ops replaced (causal masks), unless a node still reads a
    // value of that name (an initializer named like one, in a re-imported export)
    let read: HashSet<&str> = graph
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Constant { name } | NodeKind::Parameter { name } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let gone: HashSet<String> = dropped
        .into_iter()
        .filter(|n| !read.contains(n.as_str()))
        .collect();
    graph.parameters.retain(|p| !gone.contains(&p.name));
    b.stored.retain(|(n, _)| !gone.contains(n));
    graph
        .check_user_names()
        .and_then(|()| graph.validate())
        .map_err(|e| OnnxError::Model {
            path: name.into(),
            reason: e.to_string(),
        })?;
    // float initializers read as constants somewhere and parameters elsewhere
    let params: HashSet<&str> = graph.parameters.iter().map(|p| p.name.as_str()).collect();
    let baked_parameters = b
        .read_as_constants
        .borrow()
        .iter()
        .filter(|n| params.contains(n.as_str()))
        .cloned()
        .collect();
    let mut constant_initializers: Vec<String> = b
        .read_as_constants
        .borrow()
        .iter()
        .filter(|n| !params.contains(n.as_str()))
        .cloned()
        .collect();
    constant_initializers.sort();
    Ok(Imported {
        graph,
        values: b.stored,
        opset,
        integer_inputs,
        integer_input_limit: input_limit,
        baked_parameters,
        constant_initializers,
        output_dtypes,
        evaluated_at_import: evaluated.into_iter().collect(),
    })
}

/// The stored type of an ONNX element type other than float32 (float16 and bfloat16
/// outputs, which torchlean does not compute, stay float32: narrowing would round).
fn stored_dtype(code: i32) -> Option<StoredDtype> {
    Some(match code {
        2 => StoredDtype::U8,
        3 => StoredDtype::I8,
        4 => StoredDtype::U16,
        5 => StoredDtype::I16,
        dtype::INT32 => StoredDtype::I32,
        dtype::INT64 => StoredDtype::I64,
        dtype::BOOL => StoredDtype::Bool,
        dtype::DOUBLE => StoredDtype::F64,
        12 => StoredDtype::U32,
        13 => StoredDtype::U64,
        _ => return None,
    })
}

fn show_dims(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".into(), |d| d.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}
