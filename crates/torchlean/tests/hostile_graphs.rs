//! Hostile graph files and large graphs (issue 13, items 9-11): graph loading through the
//! library (`Graph::load`), strict field checking, and linear-time backward derivation and
//! validation.

use serde_json::{json, Value};
use torchlean::backend::BackendProfile;
use torchlean::graph::{append_backward, Graph, GraphError, NodeKind, OutputDecl, ValueDecl};
use torchlean::runtime::compiled::CompiledGraph;
use torchlean::Op;
use torchlean::OpKind;

/// A chain `x -> tanh -> tanh -> ... -> sum_all` of `n` nodes in all.
fn chain(n: usize) -> Graph {
    let mut g = Graph::new();
    g.inputs.push(ValueDecl {
        name: "x".into(),
        shape: vec![4],
    });
    let mut last = g
        .push(NodeKind::Input { name: "x".into() }, vec![])
        .unwrap();
    for _ in 0..n - 2 {
        last = g.push(NodeKind::Op { op: Op::Tanh }, vec![last]).unwrap();
    }
    let loss = g.push(NodeKind::Op { op: Op::SumAll }, vec![last]).unwrap();
    g.outputs.push(OutputDecl {
        name: "loss".into(),
        node: loss,
    });
    g
}

/// Derivation and validation are linear: a 200k-node chain (quadratic code took minutes)
/// derives and validates, and the backward part has the expected structure.
#[test]
fn backward_of_a_200k_node_chain_derives_and_validates() {
    let n = 200_000;
    let mut g = chain(n);
    g.validate().unwrap();
    let names = append_backward(&mut g, "loss", None).unwrap();
    assert_eq!(names, vec!["grad.x".to_string()]);
    // one seed constant and one vjp per op node (no cotangents meet in a chain)
    assert_eq!(g.nodes.len(), n + 1 + (n - 1));
    g.validate().unwrap();
    // compiling it (liveness and memory planning included) is linear too: the peak memory
    // estimate used to rescan every earlier node at every node
}

/// Compiling a derived graph (liveness and the peak-memory estimate) is linear: the
/// estimate used to rescan every earlier node at every node (a 100k-node backward graph took
/// seconds to compile, 400k nodes a minute).
#[test]
fn compiling_a_large_backward_graph_is_linear() {
    let mut g = chain(100_000);
    append_backward(&mut g, "loss", None).unwrap();
    let compiled = CompiledGraph::compile(g, &BackendProfile::default_cpu()).unwrap();
    assert_eq!(compiled.graph().outputs.len(), 2);
}

/// A small graph that uses payload-free ops, payload ops, a geometry and every node kind.
fn sample() -> Value {
    let mut g = chain(4);
    append_backward(&mut g, "loss", None).unwrap();
    serde_json::to_value(&g).unwrap()
}

fn parse(v: &Value) -> Result<Graph, String> {
    serde_json::from_str::<Graph>(&v.to_string()).map_err(|e| e.to_string())
}

fn first_op(g: &mut Value) -> &mut Value {
    g["nodes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|n| n["kind"] == "op")
        .unwrap()
}

/// Every place a field can hide, with the message expected.
type Edit = Box<dyn Fn(&mut Value)>;

fn hostile_edits() -> Vec<(&'static str, Edit, &'static str)> {
    vec![
        (
            "top level",
            Box::new(|g| g["comment"] = "x".into()),
            "unknown field `comment`",
        ),
        (
            "input decl",
            Box::new(|g| g["inputs"][0]["dtype"] = "f32".into()),
            "unknown field `dtype`",
        ),
        (
            "parameter decl",
            Box::new(|g| g["parameters"][0]["init"] = 0.into()),
            "unknown field `init`",
        ),
        (
            "output decl",
            Box::new(|g| g["outputs"][0]["shape"] = json!([])),
            "unknown field `shape`",
        ),
        (
            "node",
            Box::new(|g| g["nodes"][1]["requires_grad"] = true.into()),
            "unknown field `requires_grad`",
        ),
        (
            "input node with an op",
            Box::new(|g| g["nodes"][0]["op"] = json!({"op": "relu"})),
            "has no field `op`",
        ),
        (
            "input node with an input index",
            Box::new(|g| g["nodes"][0]["input"] = 0.into()),
            "has no field `input`",
        ),
        (
            "op node with a name",
            Box::new(|g| first_op(g)["name"] = "x".into()),
            "has no field `name`",
        ),
        (
            "op node without an op",
            Box::new(|g| {
                first_op(g).as_object_mut().unwrap().remove("op");
            }),
            "needs field `op`",
        ),
        (
            "payload-free op",
            Box::new(|g| first_op(g)["op"]["dim"] = 0.into()),
            "unknown field `dim` of op `tanh`",
        ),
        (
            "f32 payload beyond the f32 range",
            Box::new(|g| {
                let n = g["nodes"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|n| n["kind"] == "vjp")
                    .unwrap();
                n["op"] = json!({"op": "scale", "factor": -1e308});
            }),
            "field `factor` of op `scale`: -1e+308 is outside the range of f32",
        ),
        (
            "vjp node's op",
            Box::new(|g| {
                let n = g["nodes"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|n| n["kind"] == "vjp")
                    .unwrap();
                n["op"]["alpha"] = 1.into();
            }),
            "unknown field `alpha`",
        ),
    ]
}

/// Unknown fields are refused everywhere, including beside a payload-free op (serde skips
/// them there by default) and fields of another node kind.
#[test]
fn unknown_fields_are_refused_everywhere() {
    let base = sample();
    parse(&base).unwrap();
    for (what, edit, expect) in hostile_edits() {
        let mut g = base.clone();
        edit(&mut g);
        let e = parse(&g).expect_err(what);
        assert!(e.contains(expect), "{what}: expected `{expect}` in {e}");
    }
    // payload ops, geometries and nested ops
    let op = |v: Value| {
        serde_json::from_value::<torchlean::Op>(v.clone())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let strict = |v: Value| {
        let mut g = base.clone();
        first_op(&mut g)["op"] = v;
        parse(&g).map(|_| ())
    };
    assert!(op(json!({"op": "softmax", "axis": 1, "dim": 0}))
        .unwrap_err()
        .contains("unknown field `dim`"));
    let conv = json!({"op": "conv2d", "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1});
    op(conv.clone()).unwrap();
    let mut bad = conv.clone();
    bad["bias"] = true.into();
    assert!(op(bad).unwrap_err().contains("unknown field `bias`"));
    let pool = json!({"op": "avg_pool2d", "count_include_pad": false,
                      "geometry": {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0], "ceil": true}});
    assert!(op(pool).unwrap_err().contains("unknown field `ceil`"));
    let fused =
        json!({"op": "fused_unary", "ops": [{"op": "tanh"}, {"op": "relu", "inplace": true}]});
    assert!(strict(fused)
        .unwrap_err()
        .contains("unknown field `ops.1.inplace`"));
}

struct TempFile(std::path::PathBuf);
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `Graph::load` is the CLI's loader, for library users: capped, strict, validated.
#[test]
fn graph_load_refuses_devices_unknown_fields_and_invalid_graphs() {
    let e = Graph::load("/dev/zero").unwrap_err();
    assert!(matches!(e, GraphError::File { .. }), "{e}");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let dir = std::env::temp_dir();
    let file = TempFile(dir.join(format!("torchlean-graph-load-{}.json", std::process::id())));
    let mut g = serde_json::to_value(chain(4)).unwrap();
    std::fs::write(&file.0, g.to_string()).unwrap();
    let loaded = Graph::load(&file.0).unwrap();
    assert_eq!(loaded.loss_output().unwrap(), "loss");
    g["extra"] = 1.into();
    std::fs::write(&file.0, g.to_string()).unwrap();
    let e = Graph::load(&file.0).unwrap_err().to_string();
    assert!(
        e.contains("unknown field `extra`") && e.contains("torchlean-graph-load"),
        "{e}"
    );
    let mut g = serde_json::to_value(chain(4)).unwrap();
    g["nodes"][1]["parents"] = json!([5]);
    std::fs::write(&file.0, g.to_string()).unwrap();
    let e = Graph::load(&file.0).unwrap_err();
    assert!(matches!(e, GraphError::InFile { .. }), "{e}");
    let mut g = serde_json::to_value(chain(4)).unwrap();
    g["inputs"][0]["name"] = "grad.x".into();
    g["nodes"][0]["name"] = "grad.x".into();
    std::fs::write(&file.0, g.to_string()).unwrap();
    assert!(Graph::load(&file.0)
        .unwrap_err()
        .to_string()
        .contains("reserved prefix"));
}

// ---------------------------------------------------------------------------------------
// docs/ir-schema.json
// ---------------------------------------------------------------------------------------

/// The subset of JSON Schema that docs/ir-schema.json uses: type, const, enum, minimum, maximum,
/// minItems, maxItems, items, properties, required, additionalProperties (false), oneOf,
/// local $ref. Returns the first violation.
fn check(schema: &Value, root: &Value, v: &Value, at: &str) -> Result<(), String> {
    let s = schema.as_object().expect("schema objects");
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let mut target = root;
        for part in r.trim_start_matches("#/").split('/') {
            target = &target[part];
        }
        assert!(!target.is_null(), "dangling $ref {r}");
        return check(target, root, v, at);
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => panic!("bad type in schema"),
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            "number" => v.is_number(),
            "integer" => v.is_u64() || v.is_i64(),
            other => panic!("unsupported type {other}"),
        });
        if !ok {
            return Err(format!("{at}: {v} is not of type {t}"));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Err(format!("{at}: {v} is not {c}"));
        }
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        if !e.contains(v) {
            return Err(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let Some(m) = s.get("minimum").and_then(Value::as_f64) {
        if v.as_f64().is_some_and(|x| x < m) {
            return Err(format!("{at}: {v} < {m}"));
        }
    }
    if let Some(m) = s.get("maximum").and_then(Value::as_f64) {
        if v.as_f64().is_some_and(|x| x > m) {
            return Err(format!("{at}: {v} > {m}"));
        }
    }
    if let Value::Array(items) = v {
        if let Some(m) = s.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > m {
                return Err(format!("{at}: more than {m} items"));
            }
        }
        if let Some(m) = s.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < m {
                return Err(format!("{at}: fewer than {m} items"));
            }
        }
        if let Some(item) = s.get("items") {
            for (i, x) in items.iter().enumerate() {
                check(item, root, x, &format!("{at}/{i}"))?;
            }
        }
    }
    if let Value::Object(o) = v {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !o.contains_key(r) {
                    return Err(format!("{at}: missing `{r}`"));
                }
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(ps, root, x, &format!("{at}/{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{at}: unknown field `{k}`"))
                }
                None => {}
            }
        }
    }
    if let Some(Value::Array(alts)) = s.get("oneOf") {
        let errors: Vec<String> = alts
            .iter()
            .filter_map(|a| check(a, root, v, at).err())
            .collect();
        if alts.len() - errors.len() != 1 {
            return Err(format!(
                "{at}: matches {} of the oneOf alternatives, not exactly one (e.g. {:?})",
                alts.len() - errors.len(),
                errors.iter().min_by_key(|e| e.len())
            ));
        }
    }
    Ok(())
}

fn schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/ir-schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The schema lists exactly the op vocabulary.
#[test]
fn schema_op_list_is_the_vocabulary() {
    let schema = schema();
    let mut names: Vec<String> = schema["$defs"]["op"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["properties"]["op"]["const"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    let mut kinds: Vec<String> = OpKind::ALL.iter().map(|k| k.name().to_string()).collect();
    kinds.sort();
    assert_eq!(names, kinds);
}

/// Graphs the runtime writes satisfy the schema; graphs it refuses for a field violate it;
/// ops with payloads round-trip through it.
#[test]
fn exported_and_derived_graphs_satisfy_the_schema() {
    use torchlean::graph::{Conv2dGeometry, Pool2dGeometry};
    let schema = schema();
    let ok = |g: &Value| check(&schema, &schema, g, "#");
    ok(&sample()).unwrap();
    // a captured MLP with its loss, forward and backward
    let model = torchlean::nn::Mlp::new(&[3, 5, 2], torchlean::nn::Activation::Tanh, 1).unwrap();
    torchlean::runtime::set_process_default(torchlean::backend::BackendProfile::default_cpu())
        .unwrap();
    let x = torchlean::Tensor::ones(&[4, 3]).unwrap();
    let y = torchlean::Tensor::zeros(&[4, 2]).unwrap();
    use torchlean::nn::Module;
    let params: Vec<(String, torchlean::Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let captured =
        torchlean::runtime::capture::capture(&[("x".into(), x), ("y".into(), y)], &params, |xs| {
            let p = model.forward(&xs[0])?;
            let l = p.mse_loss(&xs[1])?;
            Ok(vec![("prediction".into(), p), ("loss".into(), l)])
        })
        .unwrap();
    let mut g = captured.graph;
    ok(&serde_json::to_value(&g).unwrap()).unwrap();
    append_backward(&mut g, "loss", None).unwrap();
    ok(&serde_json::to_value(&g).unwrap()).unwrap();
    // every payload shape the schema describes
    let ops = [
        Op::Softmax { axis: 1 },
        Op::Clamp {
            min: -1.0,
            max: 1.0,
        },
        Op::ReduceSum {
            axes: vec![0, 1],
            keepdim: true,
        },
        Op::Slice {
            axis: 0,
            start: 1,
            end: 2,
        },
        Op::BatchNorm {
            eps: 1e-5,
            channel_axis: 1,
        },
        Op::Conv2d(Conv2dGeometry::default()),
        Op::ConvTranspose2d(Default::default()),
        Op::MaxPool2d(Pool2dGeometry::square(2)),
        Op::AvgPool2d {
            geometry: Pool2dGeometry::square(2),
            count_include_pad: true,
        },
        Op::SmoothMaxPool2d {
            geometry: Pool2dGeometry::square(2),
            beta: 2.0,
        },
        Op::ScaledDotProductAttention {
            scale: None,
            causal: true,
            mask: torchlean::graph::AttentionMask::AdditiveBias,
        },
        Op::ScaledDotProductAttention {
            scale: Some(0.5),
            causal: false,
            mask: torchlean::graph::AttentionMask::None,
        },
        Op::FusedUnary {
            ops: vec![Op::Tanh, Op::Scale { factor: 2.0 }],
        },
        Op::RandUniform {
            shape: vec![2, 3],
            seed: 7,
        },
        Op::BernoulliMask {
            shape: vec![2],
            keep: 0.5,
            seed: 7,
        },
    ];
    // and one op of every kind, payload included (the schema is written by hand: a field
    // added to an op, such as ema_update's weight, must be added there too)
    let every_kind = OpKind::ALL.iter().map(|&k| torchlean::fuzz::sample_op(k));
    for op in ops.into_iter().chain(every_kind) {
        let v = serde_json::to_value(&op).unwrap();
        check(&schema["$defs"]["op"], &schema, &v, "#op").unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
    // what the reader refuses for a field, the schema refuses too
    for (what, edit, _) in hostile_edits() {
        let mut g = sample();
        edit(&mut g);
        assert!(ok(&g).is_err(), "{what}: the schema accepts it");
    }
}

/// An f32 payload beyond the f32 range (found by the fuzzer: `"value": -1e308`) used to be
/// accepted as an infinity, which the writer turns into `null`, so the accepted graph could
/// not be read back; it is refused with the field's path, also inside fused ops. The largest
/// f32 is accepted, and a graph read is written back to text that reads again.
#[test]
fn f32_payloads_beyond_the_f32_range_are_refused() {
    let with_op = |op: Value| {
        let mut g = sample();
        first_op(&mut g)["op"] = op;
        parse(&g)
    };
    for (op, field) in [
        (
            json!({"op": "add_scalar", "value": -1e308}),
            "`value` of op `add_scalar`",
        ),
        (
            json!({"op": "scale", "factor": 1e39}),
            "`factor` of op `scale`",
        ),
        (
            json!({"op": "clamp", "min": -1.0, "max": 3.5e38}),
            "`max` of op `clamp`",
        ),
        (
            json!({"op": "fused_unary", "ops": [{"op": "tanh"}, {"op": "pow", "exponent": 1e300}]}),
            "`ops.1.exponent` of op `fused_unary`",
        ),
    ] {
        let e = with_op(op.clone()).expect_err(&op.to_string());
        assert!(
            e.contains(field) && e.contains("outside the range of f32"),
            "{e}"
        );
    }
    let g = with_op(json!({"op": "scale", "factor": 3.4028234663852886e38})).unwrap();
    let text = serde_json::to_string(&g).unwrap();
    assert_eq!(serde_json::from_str::<Graph>(&text).unwrap(), g);
}

/// ONNX bytes given where a graph file is read (a pipe: the format comes from the name) are
/// refused with a hint to name the file `.onnx` (the forty-fifth session's hostile-input
/// audit); other bytes get no such hint.
#[test]
fn onnx_bytes_read_as_a_graph_file_get_a_hint() {
    let onnx_like = [0x08u8, 0x07, 0x12, 0x03, b'p', b'y', b't'];
    let e = torchlean::graph::Graph::from_json(&onnx_like, "/dev/fd/63")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("looks like an ONNX model") && e.contains(".onnx"),
        "{e}"
    );
    let e = torchlean::graph::Graph::from_json(b"not json", "x")
        .unwrap_err()
        .to_string();
    assert!(!e.contains("ONNX"), "{e}");
}
