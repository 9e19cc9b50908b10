//! Size arithmetic is checked (issue 13, items 4 and 7): every op's shape rule, driven with
//! extreme payloads and input shapes, returns a correct shape or a typed error — never a
//! panic or a wrapped value — and no payload can make a kernel's work unbounded. Plus the
//! size helpers (`numel`, strides), tensor creation, the graph IR and the public `Layout`
//! methods. docs/reliability.md ("Size limits") states the rules tested here.

use proptest::prelude::*;
use torchlean::backend::BackendProfile;
use torchlean::graph::{
    AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Graph, GraphError, NodeKind, Op,
    OpKind, Pool2dGeometry, ValueDecl, MAX_NODE_ELEMENTS,
};
use torchlean::runtime::{self, Session};
use torchlean::spec::{
    self, check_shape, checked_contiguous_strides, checked_numel, contiguous_strides, numel,
    MAX_ELEMENTS, MAX_WORK,
};
use torchlean::tensor::Layout;
use torchlean::{Error, OpError, Tensor};

const P63: usize = 1 << 63;

/// Values that break unchecked size arithmetic, and small ones that make valid shapes.
const EXTREMES: [usize; 10] = [0, 1, 2, 3, 4, 1 << 31, 1 << 32, 1 << 40, P63, usize::MAX];

// ---------------------------------------------------------------------------------------
// Every op's shape rule with extreme payloads and shapes
// ---------------------------------------------------------------------------------------

/// An op of `kind` whose numeric payload fields take the values `v` (in order), `flag`
/// choosing among boolean variants. The match lists every kind, so a new op kind does not
/// compile until it joins this test.
fn build(kind: OpKind, v: &[usize], rank: usize, flag: bool) -> Op {
    let u = |i: usize| v[i % v.len()];
    let list = |from: usize| (0..rank).map(|i| u(from + i)).collect::<Vec<_>>();
    let geometry = Pool2dGeometry {
        kernel: [u(0), u(1)],
        stride: [u(2), u(3)],
        padding: [u(4), u(5)],
    };
    use OpKind as K;
    match kind {
        K::RandUniform => Op::RandUniform {
            shape: list(0),
            seed: u(7) as u64,
        },
        K::BernoulliMask => Op::BernoulliMask {
            shape: list(0),
            keep: 0.5,
            seed: u(7) as u64,
        },
        K::Add => Op::Add,
        K::Sub => Op::Sub,
        K::Mul => Op::Mul,
        K::Div => Op::Div,
        K::Maximum => Op::Maximum,
        K::Minimum => Op::Minimum,
        K::Where => Op::Where,
        K::Compare => Op::Compare {
            relation: if flag {
                torchlean::graph::Relation::Gt
            } else {
                torchlean::graph::Relation::Ne
            },
        },
        K::Neg => Op::Neg,
        K::Abs => Op::Abs,
        K::Sqrt => Op::Sqrt,
        K::Exp => Op::Exp,
        K::Log => Op::Log,
        K::Sin => Op::Sin,
        K::Cos => Op::Cos,
        K::Tanh => Op::Tanh,
        K::Sigmoid => Op::Sigmoid,
        K::Relu => Op::Relu,
        K::Gelu => Op::Gelu,
        K::Silu => Op::Silu,
        K::Softplus => Op::Softplus,
        K::Erf => Op::Erf,
        K::Tan => Op::Tan,
        K::Atan => Op::Atan,
        K::Asin => Op::Asin,
        K::Acos => Op::Acos,
        K::Sinh => Op::Sinh,
        K::Cosh => Op::Cosh,
        K::Asinh => Op::Asinh,
        K::Acosh => Op::Acosh,
        K::Atanh => Op::Atanh,
        K::Inv => Op::Inv,
        K::SafeLog => Op::SafeLog { eps: 1e-6 },
        K::Scale => Op::Scale { factor: 2.0 },
        K::AddScalar => Op::AddScalar { value: 1.0 },
        K::Clamp => Op::Clamp {
            min: -1.0,
            max: 1.0,
        },
        K::Pow => Op::Pow { exponent: 2.0 },
        K::Round => Op::Round {
            mode: if flag {
                torchlean::graph::RoundMode::Floor
            } else {
                torchlean::graph::RoundMode::HalfEven
            },
        },
        K::EmaUpdate => Op::ema_update(0.9, true),
        K::AdamUpdate => Op::AdamUpdate {
            step_size: 1e-3,
            c2_sqrt: 0.5,
            eps: 1e-8,
            shrink: 1.0,
        },
        // no size in its payload: the fuzzer's typical op
        K::AdamStep => torchlean::fuzz::sample_op(kind),
        K::Softmax => Op::Softmax { axis: u(0) },
        K::LogSoftmax => Op::LogSoftmax { axis: u(0) },
        K::SumAll => Op::SumAll,
        K::ReduceSum => Op::ReduceSum {
            axes: list(0),
            keepdim: flag,
        },
        K::ReduceMean => Op::ReduceMean {
            axes: list(0),
            keepdim: flag,
        },
        K::Argmax => Op::Argmax { axis: u(0) },
        K::Reshape => Op::Reshape { shape: list(0) },
        K::Permute => Op::Permute { axes: list(0) },
        K::BroadcastTo => Op::BroadcastTo { shape: list(0) },
        K::Concat => Op::Concat { axis: u(0) },
        K::Slice => Op::Slice {
            axis: u(0),
            start: u(1),
            end: u(2),
        },
        K::IndexSelect => Op::IndexSelect { axis: u(0) },
        K::Gather => Op::Gather { axis: u(0) },
        K::ScatterAdd => Op::ScatterAdd { axis: u(0) },
        K::Matmul => Op::Matmul,
        K::Linear => Op::Linear,
        K::MseLoss => Op::MseLoss,
        K::LayerNorm => Op::LayerNorm { eps: 1e-5 },
        K::RmsNorm => Op::RmsNorm { eps: 1e-5 },
        K::BatchNorm => Op::BatchNorm {
            eps: 1e-5,
            channel_axis: u(0),
        },
        K::Conv2d => Op::Conv2d(Conv2dGeometry {
            stride: [u(0), u(1)],
            padding: [u(2), u(3)],
            dilation: [u(4), u(5)],
            groups: u(6),
        }),
        K::ConvTranspose2d => Op::ConvTranspose2d(ConvTranspose2dGeometry {
            stride: [u(0), u(1)],
            padding: [u(2), u(3)],
            output_padding: [u(7), u(8)],
            dilation: [u(4), u(5)],
            groups: u(6),
        }),
        K::MaxPool2d => Op::MaxPool2d(geometry),
        K::AvgPool2d => Op::AvgPool2d {
            geometry,
            count_include_pad: flag,
        },
        K::SmoothMaxPool2d => Op::SmoothMaxPool2d {
            geometry,
            beta: 1.0,
        },
        K::SpectralConv1d => Op::SpectralConv1d { modes: u(0) },
        K::SelectiveScan => Op::SelectiveScan,
        K::ScaledDotProductAttention => Op::ScaledDotProductAttention {
            scale: None,
            causal: flag,
            mask: [
                AttentionMask::None,
                AttentionMask::Boolean,
                AttentionMask::AdditiveBias,
            ][u(1) % 3],
        },
        K::FusedUnary => Op::FusedUnary {
            ops: if flag {
                vec![]
            } else {
                vec![Op::Relu, Op::Exp]
            },
        },
        K::FusedMap => Op::FusedMap {
            steps: if flag {
                vec![]
            } else {
                use torchlean::graph::{FusedStep, SideOperand};
                vec![
                    FusedStep {
                        op: Op::Mul,
                        side: Some(SideOperand::Right),
                    },
                    FusedStep {
                        op: Op::Relu,
                        side: None,
                    },
                ]
            },
        },
        K::Conv2dMap => Op::Conv2dMap {
            geometry: Conv2dGeometry {
                stride: [u(0), u(1)],
                padding: [u(2), u(3)],
                dilation: [u(4), u(5)],
                groups: u(6),
            },
            steps: if flag {
                vec![]
            } else {
                use torchlean::graph::{FusedStep, SideOperand};
                vec![
                    FusedStep {
                        op: Op::Sub,
                        side: Some(SideOperand::Right),
                    },
                    FusedStep {
                        op: Op::Relu,
                        side: None,
                    },
                ]
            },
        },
    }
}

/// The element count in u128, saturating (four dims of 2^64 would overflow even u128).
fn wide(shape: &[usize]) -> u128 {
    if shape.contains(&0) {
        return 0;
    }
    shape
        .iter()
        .fold(1u128, |n, &d| n.saturating_mul(d as u128))
}

/// The product of the non-zero dims, exactly (the quantity the size limit bounds).
fn extent(shape: &[usize]) -> u128 {
    shape
        .iter()
        .filter(|&&d| d != 0)
        .fold(1u128, |n, &d| n.saturating_mul(d as u128))
}

/// The output shape recomputed in u128 (no wrapping possible) for every rule that does size
/// arithmetic; `None` for the rules whose output dims are copied from inputs or payloads.
fn wide_oracle(op: &Op, shapes: &[&[usize]]) -> Option<Vec<u128>> {
    let w = |d: usize| d as u128;
    match op {
        Op::Conv2d(g) => {
            let (x, k) = (shapes[0], shapes[1]);
            let axis = |a: usize| {
                let span = w(g.dilation[a]) * (w(k[2 + a].max(1)) - 1) + 1;
                (w(x[2 + a]) + 2 * w(g.padding[a]) - span) / w(g.stride[a]) + 1
            };
            Some(vec![w(x[0]), w(k[0]), axis(0), axis(1)])
        }
        Op::ConvTranspose2d(g) => {
            let (x, k) = (shapes[0], shapes[1]);
            let axis = |a: usize| {
                (w(x[2 + a]) - 1) * w(g.stride[a])
                    + w(g.dilation[a]) * (w(k[2 + a].max(1)) - 1)
                    + w(g.output_padding[a])
                    + 1
                    - 2 * w(g.padding[a])
            };
            Some(vec![w(x[0]), w(k[1]) * w(g.groups), axis(0), axis(1)])
        }
        Op::MaxPool2d(g)
        | Op::AvgPool2d { geometry: g, .. }
        | Op::SmoothMaxPool2d { geometry: g, .. } => {
            let x = shapes[0];
            let axis = |a: usize| {
                (w(x[2 + a]) + 2 * w(g.padding[a]) - w(g.kernel[a])) / w(g.stride[a]) + 1
            };
            Some(vec![w(x[0]), w(x[1]), axis(0), axis(1)])
        }
        Op::Concat { axis } => {
            let mut out: Vec<u128> = shapes[0].iter().map(|&d| w(d)).collect();
            out[*axis] = shapes.iter().map(|s| w(s[*axis])).sum();
            Some(out)
        }
        Op::Slice { axis, start, end } => {
            let mut out: Vec<u128> = shapes[0].iter().map(|&d| w(d)).collect();
            out[*axis] = w(*end) - w(*start);
            Some(out)
        }
        Op::Reshape { shape } => {
            assert_eq!(
                wide(shape),
                wide(shapes[0]),
                "reshape changed the element count"
            );
            Some(shape.iter().map(|&d| w(d)).collect())
        }
        Op::RandUniform { shape, .. }
        | Op::BernoulliMask { shape, .. }
        | Op::BroadcastTo { shape } => Some(shape.iter().map(|&d| w(d)).collect()),
        _ => None,
    }
}

/// Runs forward (and the VJP where defined) of the f64 spec on zero-filled inputs when every
/// size is small: the shape rule's guarantees must suffice for the kernels to index safely.
fn run_small(op: &Op, shapes: &[&[usize]], out: &[usize]) {
    let small = shapes.iter().all(|s| numel(s) <= 64) && numel(out) <= 1024;
    let window = match op {
        Op::MaxPool2d(g)
        | Op::AvgPool2d { geometry: g, .. }
        | Op::SmoothMaxPool2d { geometry: g, .. } => g.kernel[0].saturating_mul(g.kernel[1]),
        _ => 1,
    };
    if !small || window > 1024 {
        return;
    }
    let arrays: Vec<spec::Array<f64>> = shapes.iter().map(|s| spec::Array::zeros(s)).collect();
    let refs: Vec<&spec::Array<f64>> = arrays.iter().collect();
    // an index error (e.g. index 0 into an empty axis) is a typed error, which is fine
    if let Ok(y) = spec::forward(op, &refs) {
        assert_eq!(y.shape, out);
        assert_eq!(y.data.len(), numel(out));
        if op.kind().differentiable() {
            let gy = spec::Array::from_fn(out, |_| 1.0);
            let _ = spec::vjp(op, &refs, &y, &gy);
        }
    }
}

/// The graph IR infers the same shapes (or refuses, with its stricter per-node cap).
fn check_graph(op: &Op, shapes: &[&[usize]], inferred: &Result<Vec<usize>, OpError>) {
    let mut g = Graph::new();
    let mut parents = vec![];
    for (i, s) in shapes.iter().enumerate() {
        g.inputs.push(ValueDecl {
            name: format!("x{i}"),
            shape: s.to_vec(),
        });
        match g.push(
            NodeKind::Input {
                name: format!("x{i}"),
            },
            vec![],
        ) {
            Ok(id) => parents.push(id),
            Err(GraphError::TooLarge { .. }) => {
                assert!(extent(s) > MAX_NODE_ELEMENTS as u128, "{s:?} refused");
                return;
            }
            Err(e) => panic!("input {s:?}: {e}"),
        }
    }
    let pushed = g.push(NodeKind::Op { op: op.clone() }, parents);
    match (inferred, &pushed) {
        (Ok(out), Ok(id)) => assert_eq!(&g.nodes[*id].shape, out),
        (Ok(out), Err(GraphError::TooLarge { .. })) => {
            assert!(extent(out) > MAX_NODE_ELEMENTS as u128)
        }
        (Err(_), Err(GraphError::Op { .. })) => {}
        (a, b) => panic!("{op:?} on {shapes:?}: infer_shape {a:?} but graph push {b:?}"),
    }
    if pushed.is_ok() {
        assert!(g.validate().is_ok(), "{op:?} on {shapes:?}");
    }
}

fn check_rule(op: &Op, shapes: &[&[usize]]) {
    let inferred = spec::infer_shape(op, shapes);
    match &inferred {
        Ok(out) => {
            for s in shapes {
                assert!(
                    extent(s) <= MAX_ELEMENTS as u128,
                    "{op:?}: input {s:?} accepted"
                );
            }
            assert!(
                extent(out) <= MAX_ELEMENTS as u128,
                "{op:?} on {shapes:?}: output {out:?} beyond the size limit"
            );
            assert_eq!(checked_numel(out).map(|n| n as u128), Some(wide(out)));
            assert!(checked_contiguous_strides(out).is_some());
            if let Some(expected) = wide_oracle(op, shapes) {
                let got: Vec<u128> = out.iter().map(|&d| d as u128).collect();
                assert_eq!(got, expected, "{op:?} on {shapes:?}: wrapped shape");
            }
            if let Op::MaxPool2d(g)
            | Op::AvgPool2d { geometry: g, .. }
            | Op::SmoothMaxPool2d { geometry: g, .. } = op
            {
                let work = wide(out) * g.kernel[0] as u128 * g.kernel[1] as u128;
                assert!(
                    work <= MAX_WORK as u128,
                    "{op:?} on {shapes:?}: work {work}"
                );
            }
            run_small(op, shapes, out);
        }
        Err(e) => {
            // a typed error that names the op
            assert!(e.to_string().contains(op.name()), "{e}");
        }
    }
    check_graph(op, shapes, &inferred);
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 0usize..6,
        2 => proptest::sample::select(EXTREMES.to_vec()),
    ]
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(size(), 0..=4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    /// Every op kind, extreme payloads in every numeric field, extreme input shapes.
    #[test]
    fn every_shape_rule_returns_a_correct_shape_or_an_error(
        payload in proptest::collection::vec(size(), 9),
        rank in 0usize..=4,
        flag in any::<bool>(),
        shapes in proptest::collection::vec(shape(), 0..=4),
    ) {
        let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
        for &kind in OpKind::ALL {
            check_rule(&build(kind, &payload, rank, flag), &refs);
        }
    }

    /// Valid small payloads and shapes built to fit each op family (so the conv, pool,
    /// linalg and special rules get past their structural checks), then one or two payload
    /// fields and one input dim replaced by an extreme: the size arithmetic itself is hit.
    #[test]
    fn extreme_fields_in_otherwise_valid_ops(
        mut payload in proptest::collection::vec(1usize..=2, 9),
        hits in proptest::collection::vec((0usize..9, proptest::sample::select(EXTREMES.to_vec())), 1..=2),
        rank in 0usize..=4,
        flag in any::<bool>(),
        mut x in proptest::collection::vec(1usize..=5, 4),
        x_hit in proptest::option::of((0usize..4, proptest::sample::select(EXTREMES.to_vec()))),
        k in proptest::collection::vec(1usize..=3, 2),
        o in 1usize..=3,
        arity in 1usize..=3,
    ) {
        for (i, v) in hits {
            payload[i] = v;
        }
        if let Some((i, v)) = x_hit {
            x[i] = v;
        }
        for &kind in OpKind::ALL {
        let op = build(kind, &payload, rank, flag);
        let shapes: Vec<Vec<usize>> = match &op {
            Op::Conv2d(g) => {
                let w = if g.groups != 0 && x[1] % g.groups == 0 {
                    vec![o.saturating_mul(g.groups), x[1] / g.groups, k[0], k[1]]
                } else {
                    vec![o, x[1], k[0], k[1]]
                };
                let bias = vec![w[0]];
                [x.clone(), w, bias][..arity.max(2)].to_vec()
            }
            Op::ConvTranspose2d(g) => {
                let w = vec![x[1], o, k[0], k[1]];
                let bias = vec![o.saturating_mul(g.groups)];
                [x.clone(), w, bias][..arity.max(2)].to_vec()
            }
            Op::Linear => {
                let w = vec![o, x[3]];
                [x.clone(), w, vec![o]][..arity.max(2)].to_vec()
            }
            Op::Matmul => vec![x.clone(), vec![x[0], x[1], x[3], o]],
            Op::SpectralConv1d { modes } => {
                let w = vec![x[1], o, *modes];
                vec![x[..3].to_vec(), w.clone(), w]
            }
            // (w, m, v, g) per parameter: `arity` parameters of the extreme shape
            Op::AdamStep { .. } => vec![x.clone(); 4 * arity],
            _ => vec![x.clone(); arity],
        };
        let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
        check_rule(&op, &refs);
        }
    }

    /// Public `Layout` methods on arbitrary layouts and arguments: an error or a
    /// consistent result, never a panic, an underflow or an out-of-bounds read.
    #[test]
    fn layout_methods_never_panic(
        shape in shape(),
        strides in proptest::collection::vec(size(), 0..=4),
        offset in size(),
        storage_len in 0usize..24,
        axes in proptest::collection::vec(size(), 0..=4),
        target in shape(),
        (axis, start, end) in (size(), size(), size()),
        index in proptest::collection::vec(size(), 0..=4),
    ) {
        let l = Layout { shape, strides, offset };
        let storage = vec![1.0f32; storage_len];
        let fits = l.validate(storage_len).is_ok();
        let _ = l.is_contiguous();
        let _ = l.numel();
        if l.numel() <= 4096 {
            let mut out = vec![];
            match l.gather_into(&storage, &mut out) {
                Ok(()) => prop_assert_eq!(out.len(), l.numel()),
                Err(_) => prop_assert!(!fits),
            }
        }
        if let Some(p) = l.try_position(&index) {
            if fits {
                prop_assert!(p < storage_len);
            }
        }
        if let Ok(p) = l.try_permuted(&axes) {
            prop_assert_eq!(p.shape.len(), l.shape.len());
            if fits {
                prop_assert!(p.validate(storage_len).is_ok());
            }
        }
        if let Ok(b) = l.try_broadcast(&target) {
            prop_assert_eq!(&b.shape, &target);
            if fits {
                prop_assert!(b.validate(storage_len).is_ok());
            }
        }
        if let Ok(s) = l.try_sliced(axis, start, end) {
            prop_assert_eq!(s.shape[axis], end - start);
            if fits {
                prop_assert!(s.validate(storage_len).is_ok());
            }
        }
    }

    /// `numel` and the strides are exact or refused, for any shape.
    #[test]
    fn size_helpers_are_exact_or_refused(shape in shape()) {
        match checked_numel(&shape) {
            Some(n) => {
                prop_assert_eq!(n as u128, wide(&shape));
                prop_assert_eq!(numel(&shape), n);
            }
            None => {
                prop_assert!(wide(&shape) > usize::MAX as u128);
                prop_assert_eq!(numel(&shape), usize::MAX);
            }
        }
        let valid = check_shape("test", &shape).is_ok();
        prop_assert_eq!(valid, extent(&shape) <= MAX_ELEMENTS as u128);
        if valid {
            let strides = checked_contiguous_strides(&shape).unwrap();
            prop_assert_eq!(&contiguous_strides(&shape), &strides);
            for (i, &s) in strides.iter().enumerate() {
                prop_assert_eq!(s as u128, wide(&shape[i + 1..]));
            }
            prop_assert!(Layout::try_contiguous(shape.clone()).is_ok());
        } else {
            prop_assert!(Layout::try_contiguous(shape.clone()).is_err());
            prop_assert!(Tensor::zeros(&shape).is_err());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Regressions for the named cases
// ---------------------------------------------------------------------------------------

/// Runs `f` once under `only:reference` and once under `only:native_cpu`.
fn on_both(f: impl Fn(&str)) {
    for provider in ["only:reference", "only:native_cpu"] {
        let profile =
            BackendProfile::resolve(None, Some("cpu"), Some(provider), Some("checked-runtime"))
                .unwrap();
        let before = runtime::install(Session::new(profile)).unwrap();
        f(provider);
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}

#[test]
fn conv2d_padding_2_pow_63_is_refused() {
    // 4 + 2 * 2^63 wrapped to 4: the rule passed and the output was all zeros
    let g = Conv2dGeometry {
        padding: [P63, P63],
        ..Conv2dGeometry::default()
    };
    let e = spec::infer_shape(&Op::Conv2d(g), &[&[1, 1, 4, 4], &[1, 1, 3, 3]]).unwrap_err();
    assert!(matches!(e, OpError::Payload { op: "conv2d", .. }), "{e}");
    on_both(|p| {
        let x = Tensor::ones(&[1, 1, 4, 4]).unwrap();
        let w = Tensor::ones(&[1, 1, 3, 3]).unwrap();
        let e = x.conv2d(&w, None, g).unwrap_err();
        assert!(
            matches!(e, Error::Op(OpError::Payload { op: "conv2d", .. })),
            "{p}: {e}"
        );
    });
    // dilation and stride extremes, and conv_transpose2d's output size, are checked too
    for g in [
        Conv2dGeometry {
            dilation: [P63, 1],
            padding: [1 << 62, 0],
            ..Conv2dGeometry::default()
        },
        Conv2dGeometry {
            padding: [usize::MAX, 0],
            ..Conv2dGeometry::default()
        },
    ] {
        assert!(spec::infer_shape(&Op::Conv2d(g), &[&[1, 1, 4, 4], &[1, 1, 3, 3]]).is_err());
    }
    let t = ConvTranspose2dGeometry {
        stride: [P63, 1],
        ..ConvTranspose2dGeometry::default()
    };
    assert!(spec::infer_shape(&Op::ConvTranspose2d(t), &[&[1, 1, 4, 4], &[1, 1, 3, 3]]).is_err());
    let t = ConvTranspose2dGeometry {
        groups: P63,
        ..ConvTranspose2dGeometry::default()
    };
    assert!(spec::infer_shape(&Op::ConvTranspose2d(t), &[&[1, 0, 4, 4], &[0, 4, 3, 3]]).is_err());
}

#[test]
fn avg_pool2d_kernel_2_pow_63_is_refused() {
    // kernel * kernel wrapped to 0: the count_include_pad divisor was 0 and the output inf
    for padding in [0, 1 << 62] {
        let geometry = Pool2dGeometry {
            kernel: [P63, P63],
            stride: [1, 1],
            padding: [padding, padding],
        };
        let op = Op::AvgPool2d {
            geometry,
            count_include_pad: true,
        };
        let e = spec::infer_shape(&op, &[&[1, 1, 4, 4]]).unwrap_err();
        assert!(e.to_string().contains("avg_pool2d"), "{e}");
        on_both(|p| {
            let x = Tensor::ones(&[1, 1, 4, 4]).unwrap();
            let e = x.avg_pool2d(geometry, true).unwrap_err();
            assert!(e.to_string().contains("avg_pool2d"), "{p}: {e}");
        });
    }
    // padding 2^63 doubled to 0 and passed "padding at most half the kernel"
    let g = Pool2dGeometry {
        kernel: [2, 2],
        stride: [1, 1],
        padding: [P63, P63],
    };
    let e = spec::infer_shape(&Op::MaxPool2d(g), &[&[1, 1, 4, 4]]).unwrap_err();
    assert!(matches!(e, OpError::Payload { .. }), "{e}");
}

#[test]
fn max_pool_window_60001_on_4x4_is_refused_by_the_shape_rule() {
    // the reference provider visited every tap of every window (60001^2 per output element)
    for padding in [0, 30000] {
        let g = Pool2dGeometry {
            kernel: [60001, 60001],
            stride: [1, 1],
            padding: [padding, padding],
        };
        for op in [
            Op::MaxPool2d(g),
            Op::AvgPool2d {
                geometry: g,
                count_include_pad: false,
            },
            Op::SmoothMaxPool2d {
                geometry: g,
                beta: 1.0,
            },
        ] {
            assert!(spec::infer_shape(&op, &[&[1, 1, 4, 4]]).is_err(), "{op:?}");
        }
        on_both(|p| {
            let x = Tensor::ones(&[1, 1, 4, 4]).unwrap();
            let e = x.max_pool2d(g).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Op(OpError::Payload {
                        op: "max_pool2d",
                        ..
                    })
                ) || matches!(
                    e,
                    Error::Op(OpError::Shape {
                        op: "max_pool2d",
                        ..
                    })
                ),
                "{p}: {e}"
            );
        });
    }
    // a window no larger than the padded input, with bounded work, still runs (as in PyTorch)
    on_both(|p| {
        let x = Tensor::ones(&[1, 1, 4, 4]).unwrap();
        let g = Pool2dGeometry {
            kernel: [5, 5],
            stride: [1, 1],
            padding: [2, 2],
        };
        assert_eq!(x.max_pool2d(g).unwrap().shape(), [1, 1, 4, 4], "{p}");
    });
}

#[test]
fn numel_and_strides_of_0_2_pow_40_2_pow_40() {
    let s = [0, 1 << 40, 1 << 40];
    assert_eq!(numel(&s), 0);
    assert_eq!(checked_numel(&s), Some(0));
    // the strides do not fit: refused (checked) or saturated (never wrapped to 0)
    assert_eq!(checked_contiguous_strides(&s), None);
    assert_eq!(contiguous_strides(&s), vec![usize::MAX, 1 << 40, 1]);
    assert!(check_shape("t", &s).is_err());
    assert!(Layout::try_contiguous(s.to_vec()).is_err());
    assert!(matches!(Tensor::zeros(&s), Err(Error::Creation(_))));
    assert!(Tensor::from_vec(vec![], &s).is_err());
    // a product that wrapped to 0 or to a small number
    assert_eq!(numel(&[1 << 40, 1 << 40, 2]), usize::MAX);
    assert_eq!(checked_numel(&[1 << 32, 1 << 32]), None);
    assert_eq!(checked_numel(&[1 << 32, 1 << 32, 0]), Some(0));
    // ops refuse such shapes as outputs...
    let e = spec::infer_shape(&Op::Reshape { shape: s.to_vec() }, &[&[0]]).unwrap_err();
    assert!(matches!(e, OpError::Shape { op: "reshape", .. }), "{e}");
    let e = spec::infer_shape(
        &Op::RandUniform {
            shape: s.to_vec(),
            seed: 0,
        },
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("rand_uniform"), "{e}");
    // ...and as inputs
    assert!(spec::infer_shape(&Op::Relu, &[&s]).is_err());
    // a reshape target whose count wraps to the input's is refused
    let e = spec::infer_shape(
        &Op::Reshape {
            shape: vec![1 << 32, 1 << 32, 2],
        },
        &[&[0]],
    )
    .unwrap_err();
    assert!(matches!(e, OpError::Shape { op: "reshape", .. }), "{e}");
    // the graph IR refuses it as a declared shape
    let mut g = Graph::new();
    g.inputs.push(ValueDecl {
        name: "x".into(),
        shape: s.to_vec(),
    });
    assert!(g.validate().is_err());
    assert!(matches!(
        g.push(NodeKind::Input { name: "x".into() }, vec![]),
        Err(GraphError::TooLarge { .. })
    ));
    // tensor reshape with -1 and a product that wraps
    let x = Tensor::zeros(&[0]).unwrap();
    assert!(x.reshape(&[1 << 32, 1 << 32, -1]).is_err());
}

#[test]
fn layout_methods_refuse_bad_arguments() {
    let l = Layout::contiguous(vec![2, 3]);
    assert!(l.try_permuted(&[0, 0]).is_err());
    assert!(l.try_permuted(&[5, 0]).is_err());
    assert!(l.try_permuted(&[0]).is_err());
    assert_eq!(l.try_permuted(&[1, 0]).unwrap().shape, [3, 2]);
    assert!(l.try_broadcast(&[3]).is_err()); // shorter target underflowed
    assert!(l.try_broadcast(&[4, 3]).is_err());
    assert_eq!(l.try_broadcast(&[5, 2, 3]).unwrap().strides, [0, 3, 1]);
    assert!(l.try_sliced(2, 0, 1).is_err()); // axis out of range
    assert!(l.try_sliced(1, 2, 1).is_err()); // end < start underflowed
    assert!(l.try_sliced(1, 0, 4).is_err()); // beyond the axis
    assert_eq!(l.try_sliced(1, 1, 3).unwrap().offset, 1);
    assert_eq!(l.try_position(&[1, 2]), Some(5));
    assert_eq!(l.try_position(&[2, 0]), None);
    assert_eq!(l.try_position(&[0]), None);
    assert_eq!(l.try_position(&[usize::MAX, 0]), None);
    let storage = [0.0f32; 6];
    let mut out = vec![];
    l.gather_into(&storage, &mut out).unwrap();
    assert_eq!(out.len(), 6);
    // layouts that do not fit their storage, or are malformed, are refused
    let beyond = Layout {
        offset: 1,
        ..l.clone()
    };
    assert!(beyond.gather_into(&storage, &mut vec![]).is_err());
    let ranks = Layout {
        shape: vec![2, 3],
        strides: vec![1],
        offset: 0,
    };
    assert!(ranks.validate(6).is_err());
    assert!(!ranks.is_contiguous());
    assert!(ranks.try_sliced(1, 0, 1).is_err());
    let huge = Layout {
        shape: vec![2, 2],
        strides: vec![usize::MAX, P63],
        offset: usize::MAX,
    };
    assert!(huge.validate(usize::MAX).is_err());
    assert_eq!(huge.try_position(&[1, 1]), None);
    assert!(huge.try_sliced(0, 1, 2).is_err()); // offset + stride overflowed
}

/// Empty results beside huge axes (e.g. [2^31, 0]): the spec, the reference provider and the
/// native kernels skip the loops over the other axes instead of running 2^31 empty
/// iterations (softmax, concat, slice, matmul and attention did: a hostile file's zero-size
/// tensor hung the run), and give empty results and zero gradients.
#[test]
fn empty_results_beside_huge_axes_finish_at_once() {
    let h = 1usize << 31;
    let shape_sets: Vec<Vec<Vec<usize>>> = vec![
        vec![vec![h, 0]],
        vec![vec![0, h]],
        vec![vec![h, 2, 0]],
        vec![vec![0, 2, h, 2]],
        vec![vec![2, 2], vec![h, 2, 0]],
        vec![vec![h, 0], vec![h, 0]],
        vec![vec![h, 0], vec![h, 0], vec![h, 0]],
    ];
    let started = std::time::Instant::now();
    for &kind in OpKind::ALL {
        for payload in [vec![1usize; 9], vec![2usize; 9]] {
            for rank in 0..=2 {
                for flag in [false, true] {
                    let op = build(kind, &payload, rank, flag);
                    for shapes in &shape_sets {
                        let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
                        check_rule(&op, &refs);
                        empty_on_providers(&op, shapes);
                    }
                }
            }
        }
    }
    // generous: the loops this guards against take hours
    assert!(
        started.elapsed().as_secs() < 120,
        "took {:?}",
        started.elapsed()
    );
}

/// Runs the native and reference kernels (forward and VJP) of `op` on zero tensors of these
/// shapes when the result is empty: every result empty, every gradient zero.
fn empty_on_providers(op: &Op, shapes: &[Vec<usize>]) {
    use torchlean::providers::{native_cpu, reference};
    let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
    match spec::infer_shape(op, &refs) {
        Ok(out) if numel(&out) == 0 => {}
        _ => return,
    }
    let Ok(ts) = shapes
        .iter()
        .map(|s| torchlean::Tensor::zeros(s))
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let xs: Vec<&torchlean::Tensor> = ts.iter().collect();
    let needs = vec![true; xs.len()];
    for native in [true, false] {
        let y = if native {
            native_cpu::forward(op, &xs)
        } else {
            reference::spec_forward_f32(op, &xs)
        };
        let Ok(y) = y else { continue };
        assert_eq!(y.numel(), 0, "{op:?} on {shapes:?}");
        if !op.kind().differentiable() {
            continue;
        }
        let g = torchlean::Tensor::zeros(y.shape()).unwrap();
        let grads = if native {
            native_cpu::vjp(op, &xs, &y, &g, &needs)
        } else {
            reference::spec_vjp_f32(op, &xs, &y, &g, &needs)
        };
        for gi in grads.into_iter().flatten().flatten() {
            assert!(
                gi.to_vec().iter().all(|&v| v == 0.0),
                "{op:?} on {shapes:?}"
            );
        }
    }
}
