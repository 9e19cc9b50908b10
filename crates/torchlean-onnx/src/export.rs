//! torchlean graph → ONNX model (opset [`EXPORT_OPSET`]).
//!
//! Each op becomes one ONNX operator where ONNX has it (`linear` → `Gemm`, `layer_norm` →
//! `LayerNormalization`, `gelu` → `Gelu`), or a short decomposition (`mse_loss`, `silu`,
//! `batch_norm`'s batch statistics, attention as MatMul → Softmax → MatMul). Parameters and
//! constants become initializers under their names; graph outputs keep theirs. An op with no
//! ONNX counterpart (random sources, optimizer updates, `vjp` nodes, the spectral and scan
//! ops) is refused with its name: export the forward graph.
//!
//! Masked attention keeps torchlean's meaning: a blocked entry is `-inf` before the softmax
//! (so it contributes exactly zero), and a row whose entries are all blocked is set to zero
//! after it (where ONNX's softmax alone would give NaN).

use crate::error::OnnxError;
use onnx_protobuf::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use torchlean::graph::{AttentionMask, Graph, NodeKind, Op, OpKind};
use torchlean::Tensor;

/// The opset exported models declare (Gelu is a standard operator from 20 on).
pub const EXPORT_OPSET: i64 = 20;

type Out<T> = Result<T, OnnxError>;

/// A float32 tensor value of a static shape (a graph input or output declaration).
pub fn value_info(name: &str, shape: &[usize]) -> ValueInfoProto {
    typed_value_info(name, shape, crate::constant::dtype::FLOAT)
}

fn typed_value_info(name: &str, shape: &[usize], elem_type: i32) -> ValueInfoProto {
    let mut s = TensorShapeProto::new();
    for &d in shape {
        let mut dim = tensor_shape_proto::Dimension::new();
        dim.value = Some(tensor_shape_proto::dimension::Value::DimValue(d as i64));
        s.dim.push(dim);
    }
    let mut t = type_proto::Tensor::new();
    t.elem_type = elem_type;
    t.shape = Some(s).into();
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(t));
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v.type_ = Some(ty).into();
    v
}

fn float_tensor(name: &str, dims: &[usize], data: &[f32]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.dims = dims.iter().map(|&d| d as i64).collect();
    t.data_type = crate::constant::dtype::FLOAT;
    t.raw_data = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    t
}

/// An attribute.
enum A {
    I(i64),
    F(f32),
    Is(Vec<i64>),
    S(&'static str),
}

/// The nodes and constant initializers being written.
struct Emitter {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    fresh: usize,
    /// Inputs declared int64 (read only as indices): no Cast before their Gather.
    int_inputs: std::collections::HashSet<String>,
    /// The graph's own names (inputs, parameters, constants, outputs), which no generated
    /// name may take: ONNX names each value once, and a generated initializer named like a
    /// parameter made two initializers of one name (onnxruntime silently used the last).
    reserved: std::collections::HashSet<String>,
}

impl Emitter {
    fn name(&mut self, what: &str) -> String {
        loop {
            self.fresh += 1;
            let name = format!("{what}_{}", self.fresh);
            if !self.reserved.contains(&name) {
                return name;
            }
        }
    }

    /// Appends `op_type(inputs)` with attributes; returns its (fresh) output name.
    fn node(&mut self, op_type: &str, inputs: &[&str], attrs: Vec<(&str, A)>) -> String {
        let out = self.name(&op_type.to_lowercase());
        let mut n = NodeProto::new();
        n.op_type = op_type.into();
        n.name = out.clone();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = vec![out.clone()];
        for (name, v) in attrs {
            let mut a = AttributeProto::new();
            a.name = name.into();
            match v {
                A::I(i) => {
                    a.type_ = AttributeType::INT.into();
                    a.i = i;
                }
                A::F(f) => {
                    a.type_ = AttributeType::FLOAT.into();
                    a.f = f;
                }
                A::Is(v) => {
                    a.type_ = AttributeType::INTS.into();
                    a.ints = v;
                }
                A::S(v) => {
                    a.type_ = AttributeType::STRING.into();
                    a.s = v.as_bytes().to_vec();
                }
            }
            n.attribute.push(a);
        }
        self.nodes.push(n);
        out
    }

    fn ints(&mut self, v: &[i64]) -> String {
        let name = self.name("ints");
        let mut t = TensorProto::new();
        t.name = name.clone();
        t.dims = vec![v.len() as i64];
        t.data_type = crate::constant::dtype::INT64;
        t.int64_data = v.to_vec();
        self.inits.push(t);
        name
    }

    fn floats(&mut self, dims: &[usize], v: &[f32]) -> String {
        let name = self.name("const");
        self.inits.push(float_tensor(&name, dims, v));
        name
    }

    fn scalar(&mut self, v: f32) -> String {
        self.floats(&[], &[v])
    }

    fn reshape(&mut self, x: &str, shape: &[usize]) -> String {
        let s = self.ints(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
        self.node("Reshape", &[x, &s], vec![])
    }

    fn as_bool(&mut self, x: &str) -> String {
        self.node(
            "Cast",
            &[x],
            vec![("to", A::I(crate::constant::dtype::BOOL as i64))],
        )
    }
}

fn pair(v: [usize; 2]) -> A {
    A::Is(v.iter().map(|&d| d as i64).collect())
}

fn pads(p: [usize; 2]) -> A {
    A::Is(vec![p[0] as i64, p[1] as i64, p[0] as i64, p[1] as i64])
}

fn refuse(op: &Op, why: &str) -> OnnxError {
    OnnxError::Export(format!("`{}` {why}", op.name()))
}

/// Why an op of `kind` cannot be exported, or `None` when [`export_model`] writes it: for a
/// caller that knows a model's op kinds (a shape-only trace) before it has run anything,
/// e.g. to refuse an export before a training run rather than after it. The same reasons
/// [`export_model`] gives (`tests/export_roundtrip.rs` holds the two to each other).
pub fn refusal(kind: OpKind) -> Option<&'static str> {
    match kind {
        OpKind::RandUniform | OpKind::BernoulliMask => {
            Some("is a random source: export in evaluation mode (no dropout)")
        }
        OpKind::EmaUpdate | OpKind::AdamUpdate | OpKind::AdamStep => {
            Some("is an optimizer update: export the forward graph")
        }
        OpKind::RmsNorm
        | OpKind::SmoothMaxPool2d
        | OpKind::SpectralConv1d
        | OpKind::SelectiveScan => {
            Some("has no ONNX export yet (docs/onnx.md lists the exported ops)")
        }
        _ => None,
    }
}

/// One op over input value names and shapes; returns the name of its result.
/// A chain's steps over `value` (of `out_shape` throughout: the sides broadcast onto it), each
/// as its own node; the name of the last.
fn steps_over(
    e: &mut Emitter,
    op: &Op,
    steps: &[torchlean::graph::FusedStep],
    value: String,
    sides: &[String],
    side_shapes: &[&[usize]],
    out_shape: &[usize],
) -> Out<String> {
    let mut cur = value;
    let mut sides = sides.iter().zip(side_shapes);
    for step in steps {
        let (args, arg_shapes): (Vec<String>, Vec<&[usize]>) = match step.side {
            None => (vec![cur.clone()], vec![out_shape]),
            Some(at) => {
                let (s, s_shape) = sides
                    .next()
                    .ok_or_else(|| refuse(op, "has fewer side inputs than steps"))?;
                match at {
                    torchlean::graph::SideOperand::Right => {
                        (vec![cur.clone(), s.clone()], vec![out_shape, *s_shape])
                    }
                    torchlean::graph::SideOperand::Left => {
                        (vec![s.clone(), cur.clone()], vec![*s_shape, out_shape])
                    }
                }
            }
        };
        cur = emit(e, &step.op, &args, &arg_shapes, out_shape)?;
    }
    Ok(cur)
}

fn emit(
    e: &mut Emitter,
    op: &Op,
    x: &[String],
    shapes: &[&[usize]],
    out_shape: &[usize],
) -> Out<String> {
    let xs: Vec<&str> = x.iter().map(String::as_str).collect();
    let unary = |e: &mut Emitter, t: &str| e.node(t, &[xs[0]], vec![]);
    Ok(match op {
        Op::Add => e.node("Add", &xs, vec![]),
        Op::Sub => e.node("Sub", &xs, vec![]),
        Op::Mul => e.node("Mul", &xs, vec![]),
        Op::Div => e.node("Div", &xs, vec![]),
        Op::Maximum => e.node("Max", &xs, vec![]),
        Op::Minimum => e.node("Min", &xs, vec![]),
        Op::Where => {
            let c = e.as_bool(xs[0]);
            e.node("Where", &[&c, xs[1], xs[2]], vec![])
        }
        Op::Compare { relation } => {
            use torchlean::graph::Relation as R;
            let holds = match relation {
                R::Eq | R::Ne => e.node("Equal", &xs, vec![]),
                R::Lt => e.node("Less", &xs, vec![]),
                R::Le => e.node("LessOrEqual", &xs, vec![]),
                R::Gt => e.node("Greater", &xs, vec![]),
                R::Ge => e.node("GreaterOrEqual", &xs, vec![]),
            };
            // a != b is not (a == b): true with a NaN operand, as IEEE's
            let holds = if *relation == R::Ne {
                e.node("Not", &[&holds], vec![])
            } else {
                holds
            };
            e.node(
                "Cast",
                &[&holds],
                vec![("to", A::I(crate::constant::dtype::FLOAT as i64))],
            )
        }
        Op::Neg => unary(e, "Neg"),
        Op::Abs => unary(e, "Abs"),
        Op::Sqrt => unary(e, "Sqrt"),
        Op::Exp => unary(e, "Exp"),
        Op::Log => unary(e, "Log"),
        Op::Sin => unary(e, "Sin"),
        Op::Cos => unary(e, "Cos"),
        Op::Tanh => unary(e, "Tanh"),
        Op::Sigmoid => unary(e, "Sigmoid"),
        Op::Relu => unary(e, "Relu"),
        Op::Gelu => unary(e, "Gelu"),
        Op::Softplus => unary(e, "Softplus"),
        Op::Erf => unary(e, "Erf"),
        Op::Tan => unary(e, "Tan"),
        Op::Atan => unary(e, "Atan"),
        Op::Asin => unary(e, "Asin"),
        Op::Acos => unary(e, "Acos"),
        Op::Sinh => unary(e, "Sinh"),
        Op::Cosh => unary(e, "Cosh"),
        Op::Asinh => unary(e, "Asinh"),
        Op::Acosh => unary(e, "Acosh"),
        Op::Atanh => unary(e, "Atanh"),
        Op::Inv => unary(e, "Reciprocal"),
        Op::Silu => {
            let s = unary(e, "Sigmoid");
            e.node("Mul", &[xs[0], &s], vec![])
        }
        Op::SafeLog { eps } => {
            let c = e.scalar(*eps);
            let m = e.node("Max", &[xs[0], &c], vec![]);
            e.node("Log", &[&m], vec![])
        }
        Op::Scale { factor } => {
            let c = e.scalar(*factor);
            e.node("Mul", &[xs[0], &c], vec![])
        }
        Op::AddScalar { value } => {
            let c = e.scalar(*value);
            e.node("Add", &[xs[0], &c], vec![])
        }
        Op::Clamp { min, max } => {
            let (lo, hi) = (e.scalar(*min), e.scalar(*max));
            e.node("Clip", &[xs[0], &lo, &hi], vec![])
        }
        Op::Pow { exponent } => {
            let c = e.scalar(*exponent);
            e.node("Pow", &[xs[0], &c], vec![])
        }
        Op::Round { mode } => {
            use torchlean::graph::RoundMode as M;
            match mode {
                M::Floor => unary(e, "Floor"),
                M::Ceil => unary(e, "Ceil"),
                M::HalfEven => unary(e, "Round"),
                // ONNX has no Trunc: ceil below zero, floor elsewhere (a NaN floors to NaN,
                // -0 to -0, as trunc)
                M::Trunc => {
                    let zero = e.scalar(0.0);
                    let below = e.node("Less", &[xs[0], &zero], vec![]);
                    let up = e.node("Ceil", &xs, vec![]);
                    let down = e.node("Floor", &xs, vec![]);
                    e.node("Where", &[&below, &up, &down], vec![])
                }
            }
        }
        Op::Softmax { axis } => e.node("Softmax", &xs, vec![("axis", A::I(*axis as i64))]),
        Op::LogSoftmax { axis } => e.node("LogSoftmax", &xs, vec![("axis", A::I(*axis as i64))]),
        Op::SumAll => {
            let s = e.node("ReduceSum", &xs, vec![("keepdims", A::I(0))]);
            e.reshape(&s, out_shape)
        }
        Op::ReduceSum { axes, keepdim } | Op::ReduceMean { axes, keepdim } => {
            let t = if matches!(op, Op::ReduceSum { .. }) {
                "ReduceSum"
            } else {
                "ReduceMean"
            };
            if axes.is_empty() {
                return Ok(e.node("Identity", &xs, vec![]));
            }
            let a = e.ints(&axes.iter().map(|&a| a as i64).collect::<Vec<_>>());
            e.node(t, &[xs[0], &a], vec![("keepdims", A::I(*keepdim as i64))])
        }
        Op::Argmax { axis } => {
            let i = e.node(
                "ArgMax",
                &xs,
                vec![("axis", A::I(*axis as i64)), ("keepdims", A::I(0))],
            );
            e.node(
                "Cast",
                &[&i],
                vec![("to", A::I(crate::constant::dtype::FLOAT as i64))],
            )
        }
        Op::Reshape { shape } => e.reshape(xs[0], shape),
        Op::Permute { axes } => e.node(
            "Transpose",
            &xs,
            vec![("perm", A::Is(axes.iter().map(|&a| a as i64).collect()))],
        ),
        Op::BroadcastTo { shape } => {
            let s = e.ints(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
            e.node("Expand", &[xs[0], &s], vec![])
        }
        Op::Concat { axis } => e.node("Concat", &xs, vec![("axis", A::I(*axis as i64))]),
        Op::Slice { axis, start, end } => {
            let (s, t, a) = (
                e.ints(&[*start as i64]),
                e.ints(&[*end as i64]),
                e.ints(&[*axis as i64]),
            );
            e.node("Slice", &[xs[0], &s, &t, &a], vec![])
        }
        Op::IndexSelect { axis } | Op::Gather { axis } | Op::ScatterAdd { axis } => {
            let i = if e.int_inputs.contains(xs[1]) {
                xs[1].to_string()
            } else {
                e.node(
                    "Cast",
                    &[xs[1]],
                    vec![("to", A::I(crate::constant::dtype::INT64 as i64))],
                )
            };
            let axis = ("axis", A::I(*axis as i64));
            match op {
                Op::IndexSelect { .. } => e.node("Gather", &[xs[0], &i], vec![axis]),
                Op::Gather { .. } => e.node("GatherElements", &[xs[0], &i], vec![axis]),
                // torch.scatter_add: ONNX's ScatterElements with reduction "add" (opset 16+)
                _ => e.node(
                    "ScatterElements",
                    &[xs[0], &i, xs[2]],
                    vec![axis, ("reduction", A::S("add"))],
                ),
            }
        }
        Op::Matmul => e.node("MatMul", &xs, vec![]),
        Op::Linear if shapes[0].len() == 2 => e.node("Gemm", &xs, vec![("transB", A::I(1))]),
        Op::Linear => {
            let wt = e.node("Transpose", &[xs[1]], vec![("perm", A::Is(vec![1, 0]))]);
            let y = e.node("MatMul", &[xs[0], &wt], vec![]);
            match xs.get(2) {
                Some(b) => e.node("Add", &[&y, b], vec![]),
                None => y,
            }
        }
        Op::MseLoss => {
            let d = e.node("Sub", &xs, vec![]);
            let sq = e.node("Mul", &[&d, &d], vec![]);
            let m = e.node("ReduceMean", &[&sq], vec![("keepdims", A::I(0))]);
            e.reshape(&m, out_shape)
        }
        Op::LayerNorm { eps } => e.node(
            "LayerNormalization",
            &xs,
            vec![("axis", A::I(-1)), ("epsilon", A::F(*eps))],
        ),
        Op::BatchNorm { eps, channel_axis } => {
            // batch statistics (torchlean's batch_norm is the training-mode formula)
            let rank = shapes[0].len();
            let axes: Vec<i64> = (0..rank)
                .filter(|a| a != channel_axis)
                .map(|a| a as i64)
                .collect();
            let a = e.ints(&axes);
            let mean = e.node("ReduceMean", &[xs[0], &a], vec![("keepdims", A::I(1))]);
            let d = e.node("Sub", &[xs[0], &mean], vec![]);
            let sq = e.node("Mul", &[&d, &d], vec![]);
            let a2 = e.ints(&axes);
            let var = e.node("ReduceMean", &[&sq, &a2], vec![("keepdims", A::I(1))]);
            let c = e.scalar(*eps);
            let ve = e.node("Add", &[&var, &c], vec![]);
            let sd = e.node("Sqrt", &[&ve], vec![]);
            let n = e.node("Div", &[&d, &sd], vec![]);
            let per: Vec<usize> = (0..rank)
                .map(|a| if a == *channel_axis { shapes[0][a] } else { 1 })
                .collect();
            let g = e.reshape(xs[1], &per);
            let b = e.reshape(xs[2], &per);
            let y = e.node("Mul", &[&n, &g], vec![]);
            e.node("Add", &[&y, &b], vec![])
        }
        Op::Conv2d(g) => {
            let k = [shapes[1][2], shapes[1][3]];
            e.node(
                "Conv",
                &xs,
                vec![
                    ("kernel_shape", pair(k)),
                    ("strides", pair(g.stride)),
                    ("pads", pads(g.padding)),
                    ("dilations", pair(g.dilation)),
                    ("group", A::I(g.groups as i64)),
                ],
            )
        }
        Op::ConvTranspose2d(g) => {
            let k = [shapes[1][2], shapes[1][3]];
            e.node(
                "ConvTranspose",
                &xs,
                vec![
                    ("kernel_shape", pair(k)),
                    ("strides", pair(g.stride)),
                    ("pads", pads(g.padding)),
                    ("output_padding", pair(g.output_padding)),
                    ("dilations", pair(g.dilation)),
                    ("group", A::I(g.groups as i64)),
                ],
            )
        }
        Op::MaxPool2d(g) => e.node(
            "MaxPool",
            &xs,
            vec![
                ("kernel_shape", pair(g.kernel)),
                ("strides", pair(g.stride)),
                ("pads", pads(g.padding)),
            ],
        ),
        Op::AvgPool2d {
            geometry: g,
            count_include_pad,
        } => e.node(
            "AveragePool",
            &xs,
            vec![
                ("kernel_shape", pair(g.kernel)),
                ("strides", pair(g.stride)),
                ("pads", pads(g.padding)),
                ("count_include_pad", A::I(*count_include_pad as i64)),
            ],
        ),
        Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } => attention(e, &xs, shapes, *scale, *causal, *mask),
        Op::FusedUnary { ops } => {
            let mut cur = x[0].clone();
            for part in ops {
                cur = emit(e, part, std::slice::from_ref(&cur), shapes, out_shape)?;
            }
            cur
        }
        Op::FusedMap { steps } => {
            steps_over(e, op, steps, x[0].clone(), &x[1..], &shapes[1..], out_shape)?
        }
        Op::Conv2dMap { geometry, steps } => {
            // the conv, then its epilogue's steps over the conv's value
            let k = x.len() - torchlean::spec::fused_map_sides(steps);
            let z = emit(e, &Op::Conv2d(*geometry), &x[..k], &shapes[..k], out_shape)?;
            steps_over(e, op, steps, z, &x[k..], &shapes[k..], out_shape)?
        }
        _ => {
            return Err(refuse(
                op,
                refusal(op.kind())
                    .unwrap_or("has no ONNX export yet (docs/onnx.md lists the exported ops)"),
            ))
        }
    })
}

/// softmax(scale · q kᵀ (+ bias | masked) (causal)) v, with fully blocked rows zeroed.
fn attention(
    e: &mut Emitter,
    xs: &[&str],
    shapes: &[&[usize]],
    scale: Option<f32>,
    causal: bool,
    mask: AttentionMask,
) -> String {
    let q = shapes[0];
    let r = q.len();
    let (l, s, d) = (q[r - 2], shapes[1][r - 2], q[r - 1]);
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 2, r - 1);
    let kt = e.node("Transpose", &[xs[1]], vec![("perm", A::Is(perm))]);
    let qk = e.node("MatMul", &[xs[0], &kt], vec![]);
    let c = e.scalar(scale.unwrap_or(1.0 / (d as f32).sqrt()));
    let mut scores = e.node("Mul", &[&qk, &c], vec![]);
    let mut keep: Option<String> = None;
    match mask {
        AttentionMask::None => {}
        AttentionMask::AdditiveBias => scores = e.node("Add", &[&scores, xs[3]], vec![]),
        AttentionMask::Boolean => keep = Some(e.as_bool(xs[3])),
    }
    if causal {
        // key j is visible from query i when j <= i
        let t = e.name("causal");
        let mut tri = TensorProto::new();
        tri.name = t.clone();
        tri.dims = vec![l as i64, s as i64];
        tri.data_type = crate::constant::dtype::BOOL;
        tri.raw_data = (0..l * s).map(|i| (i % s <= i / s) as u8).collect();
        e.inits.push(tri);
        keep = Some(match keep {
            Some(k) => e.node("And", &[&k, &t], vec![]),
            None => t,
        });
    }
    if let Some(k) = &keep {
        let ninf = e.scalar(f32::NEG_INFINITY);
        scores = e.node("Where", &[k, &scores, &ninf], vec![]);
    }
    let mut p = e.node("Softmax", &[&scores], vec![("axis", A::I(-1))]);
    if let Some(k) = &keep {
        let zero = e.scalar(0.0);
        p = e.node("Where", &[k, &p, &zero], vec![]);
    }
    e.node("MatMul", &[&p, xs[2]], vec![])
}

/// Writes `graph` as an ONNX model; `values` holds every parameter and constant it names.
pub fn export_model(graph: &Graph, values: &[(String, Tensor)]) -> Out<ModelProto> {
    // a validated graph has every op's arity and every parent before its node
    graph
        .validate()
        .map_err(|e| OnnxError::Export(e.to_string()))?;
    // an input whose values reach the indices of index_select/gather (directly or through
    // reshape/permute/slice/concat/broadcast_to) is exported as int64 — token ids, as
    // PyTorch's exporter declares them; torchlean holds them as float32 integers. When it
    // has other uses too, they read it through a Cast to float.
    let mut index_only = vec![true; graph.nodes.len()];
    let mut reaches_index = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        index_only[o.node] = false;
    }
    // consumers come after their parents: walking backwards settles each node's consumers first
    for n in graph.nodes.iter().rev() {
        for (k, &p) in n.parents.iter().enumerate() {
            let (only, reaches) = match &n.kind {
                NodeKind::Op {
                    op: Op::IndexSelect { .. } | Op::Gather { .. } | Op::ScatterAdd { .. },
                } => (k == 1, k == 1),
                NodeKind::Op { op } if op.kind().only_moves_elements() => {
                    (index_only[n.id], reaches_index[n.id])
                }
                _ => (false, false),
            };
            index_only[p] &= only;
            reaches_index[p] |= reaches;
        }
    }
    let int_inputs = graph
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Input { name } if reaches_index[n.id] => Some(name.clone()),
            _ => None,
        })
        .collect();
    let reserved = graph
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Input { name }
            | NodeKind::Parameter { name }
            | NodeKind::Constant { name } => Some(name.clone()),
            _ => None,
        })
        .chain(graph.outputs.iter().map(|o| o.name.clone()))
        .collect();
    let mut e = Emitter {
        nodes: vec![],
        inits: vec![],
        fresh: 0,
        int_inputs,
        reserved,
    };
    let mut g = GraphProto::new();
    g.name = "torchlean".into();
    let mut names: Vec<String> = Vec::with_capacity(graph.nodes.len());
    for n in &graph.nodes {
        let name = match &n.kind {
            NodeKind::Input { name } => {
                if !e.int_inputs.contains(name) {
                    g.input.push(value_info(name, &n.shape));
                    name.clone()
                } else {
                    g.input.push(typed_value_info(name, &n.shape, crate::constant::dtype::INT64));
                    if index_only[n.id] {
                        name.clone()
                    } else {
                        let float = crate::constant::dtype::FLOAT as i64;
                        e.node("Cast", &[name], vec![("to", A::I(float))])
                    }
                }
            }
            NodeKind::Parameter { name } | NodeKind::Constant { name } => {
                let t = values
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, t)| t)
                    .ok_or_else(|| OnnxError::Export(format!("no value for `{name}`")))?;
                if t.shape() != n.shape.as_slice() {
                    return Err(OnnxError::Export(format!("`{name}` has shape {:?}, the graph declares {:?}", t.shape(), n.shape)));
                }
                let data = t.try_to_vec().map_err(|err| OnnxError::Export(format!("`{name}`: {err}")))?;
                e.inits.push(float_tensor(name, &n.shape, &data));
                name.clone()
            }
            NodeKind::Op { op } => {
                let x: Vec<String> = n.parents.iter().map(|&p| names[p].clone()).collect();
                let shapes: Vec<&[usize]> = n.parents.iter().map(|&p| graph.nodes[p].shape.as_slice()).collect();
                emit(&mut e, op, &x, &shapes, &n.shape)?
            }
            NodeKind::Vjp { op, .. } => {
                return Err(OnnxError::Export(format!("node {} is a vjp node of `{}`: backward graphs have no ONNX counterpart; export the forward graph", n.id, op.name())))
            }
        };
        names.push(name);
    }
    // ONNX names each value once: an output that is already the value of that name (an
    // input or parameter output as itself) needs no Identity, and an output named like
    // another value cannot be written
    let defined: std::collections::HashSet<&str> = g
        .input
        .iter()
        .map(|i| i.name.as_str())
        .chain(e.inits.iter().map(|t| t.name.as_str()))
        .chain(
            e.nodes
                .iter()
                .flat_map(|n| n.output.iter().map(|o| o.as_str())),
        )
        .collect();
    let mut extra = vec![];
    for o in &graph.outputs {
        if names[o.node] == o.name {
            g.output
                .push(value_info(&o.name, &graph.nodes[o.node].shape));
            continue;
        }
        if defined.contains(o.name.as_str()) {
            return Err(OnnxError::Export(format!(
                "output `{}` has the name of another value of the graph (ONNX names each value once)",
                o.name
            )));
        }
        let mut n = NodeProto::new();
        n.op_type = "Identity".into();
        n.name = format!("output_{}", o.name);
        n.input = vec![names[o.node].clone()];
        n.output = vec![o.name.clone()];
        extra.push(n);
        g.output
            .push(value_info(&o.name, &graph.nodes[o.node].shape));
    }
    e.nodes.extend(extra);
    g.node = e.nodes;
    g.initializer = e.inits;
    let mut m = ModelProto::new();
    m.ir_version = 9;
    m.producer_name = "torchlean".into();
    m.producer_version = env!("CARGO_PKG_VERSION").into();
    let mut o = OperatorSetIdProto::new();
    o.version = EXPORT_OPSET;
    m.opset_import.push(o);
    m.graph = Some(g).into();
    Ok(m)
}
