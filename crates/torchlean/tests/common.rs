//! Shared test support: the conformance table (every op with inputs over several shapes), and
//! its special-value rows (every non-random row again, its real-valued inputs sprinkled with
//! NaN, ±inf, ±0 and subnormals).
#![allow(dead_code)]

use torchlean::graph::{
    AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Op, OpKind, Pool2dGeometry,
};
use torchlean::spec::{splitmix64, uniform_from_bits, Array};

/// How an input is drawn.
#[derive(Clone, Copy, Debug)]
pub enum Gen {
    /// Standard normal-ish (sum of uniforms).
    Normal,
    /// Uniform in [0.5, 2].
    Positive,
    /// Uniform in (0.05, 0.95): decays of a scan.
    Unit,
    /// Uniform in [1.05, 3]: acosh's domain, away from its end.
    AboveOne,
    /// Integers in [0, bound), as f32.
    Index(usize),
    /// Multiples of ½ and ¼ in [−bound, bound): the ties and near-ties of rounding.
    Quarters(usize),
    /// 0/1 values, about 70% ones.
    Mask,
    /// 0/1 values with the first row (of the last two axes) fully zero.
    MaskBlockedRow,
}

/// One row of the table: an op and its inputs.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: Op,
    pub inputs: Vec<(Vec<usize>, Gen)>,
    /// A special-value row: real-valued inputs (`Normal`, `Positive`, `Unit`, `AboveOne`) hold NaN, ±inf,
    /// ±0 and subnormals among their ordinary values ([`draw_special`]).
    pub special: bool,
}

impl Case {
    pub fn name(&self) -> String {
        let shapes: Vec<&Vec<usize>> = self.inputs.iter().map(|(s, _)| s).collect();
        let tag = if self.special {
            " (special values)"
        } else {
            ""
        };
        format!("{} {:?}{tag}", self.op.name(), shapes)
    }

    /// Input `j` of this row, drawn deterministically from (row index, input index).
    pub fn input(&self, index: usize, j: usize) -> Array<f64> {
        let (s, g) = &self.inputs[j];
        let key = (index * 16 + j) as u64;
        if self.special {
            draw_special(s, *g, key)
        } else {
            draw(s, *g, key)
        }
    }
}

fn c(op: Op, inputs: &[(&[usize], Gen)]) -> Case {
    Case {
        op,
        inputs: inputs.iter().map(|(s, g)| (s.to_vec(), *g)).collect(),
        special: false,
    }
}

/// The whole table: [`cases`], then [`special_cases`].
pub fn table() -> Vec<Case> {
    let mut t = cases();
    t.extend(special_cases());
    t
}

/// The special-value rows: every row of [`cases`] whose op reads real inputs (all but the
/// random ops), again, with [`draw_special`] inputs.
pub fn special_cases() -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|c| !c.op.kind().is_random())
        .map(|c| Case { special: true, ..c })
        .collect()
}

/// The special values a special-value row mixes in: NaN, ±inf, ±0, ± the smallest f32
/// subnormal and a larger f32 subnormal (all exact in f32).
pub const SPECIALS: [f64; 8] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1.401_298_464_324_817e-45,
    -1.401_298_464_324_817e-45,
    5.877_471_754_111_438e-39,
];

/// [`draw`], with about one real-valued element in eight replaced by one of [`SPECIALS`], and
/// every value rounded to f32 (so the f64 spec and an f32 provider read the same numbers).
/// Index and mask inputs are drawn as by [`draw`].
pub fn draw_special(shape: &[usize], gen: Gen, key: u64) -> Array<f64> {
    let mut a = draw(shape, gen, key);
    if matches!(gen, Normal | Positive | Unit | AboveOne) {
        for (i, v) in a.data.iter_mut().enumerate() {
            let bits = splitmix64(key.wrapping_mul(7_000_003).wrapping_add(i as u64) ^ 0x5eed);
            if bits % 8 == 0 {
                *v = SPECIALS[((bits >> 8) % SPECIALS.len() as u64) as usize];
            }
            *v = *v as f32 as f64;
        }
    }
    a
}

use Gen::*;

/// The conformance table. Adding an op adds rows here, not a test file.
pub fn cases() -> Vec<Case> {
    let mut v = vec![
        c(
            Op::RandUniform {
                shape: vec![1000],
                seed: 7,
            },
            &[],
        ),
        c(
            Op::RandUniform {
                shape: vec![1],
                seed: 0,
            },
            &[],
        ),
        c(
            Op::RandUniform {
                shape: vec![40000],
                seed: 3,
            },
            &[],
        ),
        c(
            Op::BernoulliMask {
                shape: vec![3, 300],
                keep: 0.3,
                seed: 11,
            },
            &[],
        ),
        c(
            Op::BernoulliMask {
                shape: vec![40000],
                keep: 0.9,
                seed: 5,
            },
            &[],
        ),
    ];
    for op in [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum] {
        let b = if op == Op::Div { Positive } else { Normal };
        for (sa, sb) in [
            (&[3usize, 4][..], &[3usize, 4][..]),
            (&[2, 3, 4], &[4]),
            (&[1], &[5, 1]),
            (&[4, 1, 3], &[1, 5, 1]),
            (&[70000], &[70000]),
            (&[300, 256], &[256]),
        ] {
            v.push(c(op.clone(), &[(sa, Normal), (sb, b)]));
        }
    }
    v.push(c(
        Op::Where,
        &[(&[3, 4], Mask), (&[3, 4], Normal), (&[4], Normal)],
    ));
    v.push(c(
        Op::Where,
        &[(&[1], Mask), (&[2, 3], Normal), (&[2, 3], Normal)],
    ));
    // comparisons: random reals (their special rows mix in NaN, ±inf, ±0 and subnormals),
    // and small integers, whose ties exercise eq, le and ge
    for relation in torchlean::graph::Relation::ALL {
        let op = Op::Compare { relation };
        v.push(c(op.clone(), &[(&[3, 4], Normal), (&[3, 4], Normal)]));
        v.push(c(op.clone(), &[(&[4, 1, 3], Normal), (&[1, 5, 1], Normal)]));
        v.push(c(op.clone(), &[(&[2, 3, 4], Index(3)), (&[4], Index(3))]));
        v.push(c(op, &[(&[70000], Index(5)), (&[70000], Index(5))]));
    }
    let unary: Vec<(Op, Gen)> = vec![
        (Op::Neg, Normal),
        (Op::Abs, Normal),
        (Op::Sqrt, Positive),
        (Op::Exp, Normal),
        (Op::Log, Positive),
        (Op::Sin, Normal),
        (Op::Cos, Normal),
        (Op::Tanh, Normal),
        (Op::Sigmoid, Normal),
        (Op::Relu, Normal),
        (Op::Gelu, Normal),
        (Op::Silu, Normal),
        (Op::Softplus, Normal),
        (Op::Erf, Normal),
        // inside the domains and away from tan's poles (finite differences)
        (Op::Tan, Unit),
        (Op::Atan, Normal),
        (Op::Asin, Unit),
        (Op::Acos, Unit),
        (Op::Sinh, Normal),
        (Op::Cosh, Normal),
        (Op::Asinh, Normal),
        (Op::Acosh, AboveOne),
        (Op::Atanh, Unit),
        (Op::Inv, Positive),
        (Op::SafeLog { eps: 1e-3 }, Normal),
        (Op::Scale { factor: -1.5 }, Normal),
        (Op::AddScalar { value: 0.25 }, Normal),
        (
            Op::Clamp {
                min: -0.5,
                max: 0.7,
            },
            Normal,
        ),
        (Op::Pow { exponent: 2.5 }, Positive),
        (Op::Pow { exponent: 3.0 }, Normal),
    ];
    // rounding: random reals (with the special values), and the ties ±k + ½ and quarters
    for mode in torchlean::graph::RoundMode::ALL {
        let op = Op::Round { mode };
        v.push(c(op.clone(), &[(&[3, 4], Normal)]));
        v.push(c(op.clone(), &[(&[70000], Normal)]));
        v.push(c(op, &[(&[5, 8], Quarters(3))]));
    }
    for (op, g) in unary {
        for s in [&[1usize][..], &[3, 4], &[70000]] {
            v.push(c(op.clone(), &[(s, g)]));
        }
    }
    // optimizer updates: moments of any sign, second moments and parameters as Adam has them
    for square in [false, true] {
        let op = Op::ema_update(0.9, square);
        for s in [&[1usize][..], &[3, 4], &[70000]] {
            v.push(c(op.clone(), &[(s, Normal), (s, Normal)]));
        }
    }
    for shrink in [1.0, 0.99] {
        let op = Op::AdamUpdate {
            step_size: 0.01,
            c2_sqrt: 0.03,
            eps: 1e-8,
            shrink,
        };
        for s in [&[1usize][..], &[3, 4], &[70000]] {
            v.push(c(op.clone(), &[(s, Normal), (s, Normal), (s, Positive)]));
        }
    }
    // Adam's whole step over several parameters: groups (w, m, v, g) of different shapes
    // (one large enough for parallel chunks), with L2 decay (Adam) or a shrink (AdamW)
    for (shrink, l2) in [(1.0, 0.0), (0.99, 0.0), (1.0, 0.01)] {
        let op = Op::AdamStep {
            beta1: 0.9,
            weight1: 0.1,
            beta2: 0.999,
            weight2: 0.001,
            step_size: 0.01,
            c2_sqrt: 0.03,
            eps: 1e-8,
            shrink,
            l2,
        };
        let group = |s: &'static [usize]| [(s, Normal), (s, Normal), (s, Positive), (s, Normal)];
        v.push(c(op.clone(), &group(&[3, 4])));
        let mut three = group(&[1]).to_vec();
        three.extend(group(&[70000]));
        three.extend(group(&[5, 2, 3]));
        v.push(c(op, &three));
    }
    for op in [Op::Softmax { axis: 1 }, Op::LogSoftmax { axis: 1 }] {
        v.push(c(op.clone(), &[(&[3, 5], Normal)]));
        v.push(c(op.clone(), &[(&[2, 4, 3], Normal)]));
        v.push(c(op.clone(), &[(&[256, 300], Normal)]));
        v.push(c(op, &[(&[4, 1], Normal)]));
    }
    v.push(c(Op::Softmax { axis: 0 }, &[(&[4, 3], Normal)]));
    v.push(c(Op::LogSoftmax { axis: 2 }, &[(&[2, 3, 7], Normal)]));
    v.push(c(Op::SumAll, &[(&[3, 4], Normal)]));
    v.push(c(Op::SumAll, &[(&[1], Normal)]));
    v.push(c(Op::SumAll, &[(&[70000], Normal)]));
    for keepdim in [false, true] {
        for axes in [vec![1], vec![0, 2], vec![2], vec![0]] {
            v.push(c(
                Op::ReduceSum {
                    axes: axes.clone(),
                    keepdim,
                },
                &[(&[3, 4, 5], Normal)],
            ));
            v.push(c(Op::ReduceMean { axes, keepdim }, &[(&[3, 4, 5], Normal)]));
        }
    }
    v.push(c(
        Op::ReduceSum {
            axes: vec![0],
            keepdim: false,
        },
        &[(&[512, 300], Normal)],
    ));
    v.push(c(
        Op::ReduceMean {
            axes: vec![1],
            keepdim: true,
        },
        &[(&[300, 512], Normal)],
    ));
    v.push(c(Op::Argmax { axis: 1 }, &[(&[3, 5], Normal)]));
    v.push(c(Op::Argmax { axis: 0 }, &[(&[4, 2, 3], Normal)]));
    v.push(c(Op::Reshape { shape: vec![2, 6] }, &[(&[3, 4], Normal)]));
    v.push(c(Op::Reshape { shape: vec![] }, &[(&[1, 1], Normal)]));
    v.push(c(
        Op::Permute {
            axes: vec![2, 0, 1],
        },
        &[(&[2, 3, 4], Normal)],
    ));
    v.push(c(Op::Permute { axes: vec![1, 0] }, &[(&[1, 5], Normal)]));
    v.push(c(
        Op::BroadcastTo {
            shape: vec![2, 3, 4],
        },
        &[(&[3, 1], Normal)],
    ));
    v.push(c(Op::BroadcastTo { shape: vec![5] }, &[(&[1], Normal)]));
    v.push(c(
        Op::Concat { axis: 1 },
        &[(&[2, 3], Normal), (&[2, 5], Normal)],
    ));
    v.push(c(
        Op::Concat { axis: 0 },
        &[(&[1, 3], Normal), (&[2, 3], Normal), (&[1, 3], Normal)],
    ));
    v.push(c(
        Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        &[(&[3, 4, 2], Normal)],
    ));
    v.push(c(
        Op::Slice {
            axis: 0,
            start: 0,
            end: 1,
        },
        &[(&[1, 4], Normal)],
    ));
    v.push(c(
        Op::IndexSelect { axis: 0 },
        &[(&[5, 3], Normal), (&[4], Index(5))],
    ));
    v.push(c(
        Op::IndexSelect { axis: 1 },
        &[(&[2, 6, 3], Normal), (&[1], Index(6))],
    ));
    v.push(c(
        Op::Gather { axis: 1 },
        &[(&[3, 5], Normal), (&[3, 2], Index(5))],
    ));
    v.push(c(
        Op::Gather { axis: 0 },
        &[(&[4, 3], Normal), (&[2, 3], Index(4))],
    ));
    v.push(c(
        Op::ScatterAdd { axis: 0 },
        &[(&[4, 3], Normal), (&[6, 3], Index(4)), (&[6, 3], Normal)],
    ));
    v.push(c(
        Op::ScatterAdd { axis: 1 },
        &[(&[2, 5], Normal), (&[2, 3], Index(5)), (&[2, 3], Normal)],
    ));
    for (a, b) in [
        (&[3usize, 4][..], &[4usize, 5][..]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[3, 4], &[2, 4, 5]),
        (&[1, 1], &[1, 1]),
        (&[4, 4], &[4, 4]),
        (&[64, 128], &[128, 96]),
    ] {
        v.push(c(Op::Matmul, &[(a, Normal), (b, Normal)]));
    }
    v.push(c(
        Op::Linear,
        &[(&[5, 4], Normal), (&[3, 4], Normal), (&[3], Normal)],
    ));
    v.push(c(Op::Linear, &[(&[2, 3, 4], Normal), (&[6, 4], Normal)]));
    v.push(c(
        Op::Linear,
        &[(&[1, 1], Normal), (&[1, 1], Normal), (&[1], Normal)],
    ));
    v.push(c(
        Op::Linear,
        &[(&[128, 256], Normal), (&[64, 256], Normal), (&[64], Normal)],
    ));
    v.push(c(Op::MseLoss, &[(&[3, 4], Normal), (&[3, 4], Normal)]));
    v.push(c(Op::MseLoss, &[(&[1], Normal), (&[1], Normal)]));
    v.push(c(Op::MseLoss, &[(&[70000], Normal), (&[70000], Normal)]));
    v.push(c(
        Op::LayerNorm { eps: 1e-5 },
        &[(&[3, 8], Normal), (&[8], Normal), (&[8], Normal)],
    ));
    v.push(c(
        Op::LayerNorm { eps: 1e-5 },
        &[(&[1, 16], Normal), (&[16], Normal), (&[16], Normal)],
    ));
    v.push(c(
        Op::LayerNorm { eps: 1e-5 },
        &[(&[64, 512], Normal), (&[512], Normal), (&[512], Normal)],
    ));
    v.push(c(
        Op::RmsNorm { eps: 1e-6 },
        &[(&[3, 8], Normal), (&[8], Normal)],
    ));
    v.push(c(
        Op::RmsNorm { eps: 1e-6 },
        &[(&[64, 512], Normal), (&[512], Normal)],
    ));
    // many rows and a width that is not a multiple of 32: the CUDA norms' parameter
    // gradients sum over several row chunks, and their warps over partial strides
    v.push(c(
        Op::LayerNorm { eps: 1e-5 },
        &[(&[300, 40], Normal), (&[40], Normal), (&[40], Normal)],
    ));
    v.push(c(
        Op::RmsNorm { eps: 1e-6 },
        &[(&[130, 33], Normal), (&[33], Normal)],
    ));
    v.push(c(
        Op::BatchNorm {
            eps: 1e-5,
            channel_axis: 1,
        },
        &[(&[4, 3], Normal), (&[3], Normal), (&[3], Normal)],
    ));
    v.push(c(
        Op::BatchNorm {
            eps: 1e-5,
            channel_axis: 1,
        },
        &[(&[2, 3, 4, 5], Normal), (&[3], Normal), (&[3], Normal)],
    ));
    let g = Conv2dGeometry::default();
    v.push(c(
        Op::Conv2d(g),
        &[
            (&[2, 3, 6, 6], Normal),
            (&[4, 3, 3, 3], Normal),
            (&[4], Normal),
        ],
    ));
    v.push(c(
        Op::Conv2d(Conv2dGeometry {
            stride: [2, 2],
            padding: [1, 1],
            ..g
        }),
        &[(&[1, 2, 7, 6], Normal), (&[3, 2, 3, 3], Normal)],
    ));
    v.push(c(
        Op::Conv2d(Conv2dGeometry {
            dilation: [2, 1],
            padding: [2, 0],
            ..g
        }),
        &[
            (&[1, 2, 7, 7], Normal),
            (&[2, 2, 3, 2], Normal),
            (&[2], Normal),
        ],
    ));
    v.push(c(
        Op::Conv2d(Conv2dGeometry { groups: 3, ..g }),
        &[(&[1, 6, 5, 5], Normal), (&[6, 2, 3, 3], Normal)],
    ));
    v.push(c(
        Op::Conv2d(g),
        &[(&[1, 1, 1, 1], Normal), (&[1, 1, 1, 1], Normal)],
    ));
    v.push(c(
        Op::Conv2d(Conv2dGeometry {
            padding: [1, 1],
            ..g
        }),
        &[
            (&[4, 16, 16, 16], Normal),
            (&[32, 16, 3, 3], Normal),
            (&[32], Normal),
        ],
    ));
    // several images per call with stride, dilation and groups (the forward unfolds several
    // images side by side into one product)
    v.push(c(
        Op::Conv2d(Conv2dGeometry {
            stride: [2, 1],
            padding: [1, 2],
            dilation: [1, 2],
            groups: 2,
        }),
        &[
            (&[3, 4, 7, 6], Normal),
            (&[6, 2, 3, 2], Normal),
            (&[6], Normal),
        ],
    ));
    let t = ConvTranspose2dGeometry::default();
    v.push(c(
        Op::ConvTranspose2d(t),
        &[
            (&[2, 3, 4, 4], Normal),
            (&[3, 2, 3, 3], Normal),
            (&[2], Normal),
        ],
    ));
    v.push(c(
        Op::ConvTranspose2d(ConvTranspose2dGeometry {
            stride: [2, 2],
            padding: [1, 1],
            output_padding: [1, 1],
            ..t
        }),
        &[(&[1, 2, 3, 4], Normal), (&[2, 3, 3, 3], Normal)],
    ));
    v.push(c(
        Op::ConvTranspose2d(ConvTranspose2dGeometry {
            groups: 2,
            dilation: [2, 2],
            ..t
        }),
        &[
            (&[1, 4, 3, 3], Normal),
            (&[4, 3, 2, 2], Normal),
            (&[6], Normal),
        ],
    ));
    v.push(c(
        Op::ConvTranspose2d(ConvTranspose2dGeometry {
            stride: [2, 2],
            ..t
        }),
        &[(&[2, 16, 8, 8], Normal), (&[16, 8, 4, 4], Normal)],
    ));
    let p2 = Pool2dGeometry::square(2);
    let p3 = Pool2dGeometry {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    };
    for geometry in [p2, p3] {
        v.push(c(Op::MaxPool2d(geometry), &[(&[2, 3, 6, 6], Normal)]));
        v.push(c(
            Op::AvgPool2d {
                geometry,
                count_include_pad: true,
            },
            &[(&[2, 3, 7, 6], Normal)],
        ));
        v.push(c(
            Op::AvgPool2d {
                geometry,
                count_include_pad: false,
            },
            &[(&[1, 2, 7, 7], Normal)],
        ));
        v.push(c(
            Op::SmoothMaxPool2d {
                geometry,
                beta: 2.0,
            },
            &[(&[1, 2, 6, 7], Normal)],
        ));
    }
    v.push(c(
        Op::MaxPool2d(Pool2dGeometry {
            kernel: [1, 3],
            stride: [1, 2],
            padding: [0, 1],
        }),
        &[(&[2, 3, 1, 9], Normal)],
    ));
    v.push(c(Op::MaxPool2d(p2), &[(&[8, 32, 32, 32], Normal)]));
    v.push(c(
        Op::AvgPool2d {
            geometry: p2,
            count_include_pad: true,
        },
        &[(&[8, 32, 32, 32], Normal)],
    ));
    v.push(c(
        Op::SpectralConv1d { modes: 5 },
        &[
            (&[2, 3, 16], Normal),
            (&[3, 4, 5], Normal),
            (&[3, 4, 5], Normal),
        ],
    ));
    v.push(c(
        Op::SpectralConv1d { modes: 5 },
        &[
            (&[1, 1, 8], Normal),
            (&[1, 1, 5], Normal),
            (&[1, 1, 5], Normal),
        ],
    ));
    v.push(c(
        Op::SpectralConv1d { modes: 1 },
        &[
            (&[1, 2, 1], Normal),
            (&[2, 1, 1], Normal),
            (&[2, 1, 1], Normal),
        ],
    ));
    v.push(c(
        Op::SpectralConv1d { modes: 12 },
        &[
            (&[4, 8, 64], Normal),
            (&[8, 8, 12], Normal),
            (&[8, 8, 12], Normal),
        ],
    ));
    v.push(c(
        Op::SelectiveScan,
        &[(&[2, 6, 3], Unit), (&[2, 6, 3], Normal)],
    ));
    v.push(c(Op::SelectiveScan, &[(&[1, 1], Unit), (&[1, 1], Normal)]));
    v.push(c(
        Op::SelectiveScan,
        &[(&[4, 128, 64], Unit), (&[4, 128, 64], Normal)],
    ));
    // fused maps: a CNN's batch norm with its ReLU (per-channel sides over [N, C, H, W], large
    // enough for the parallel split), a bias over the last axis and a divisor on the left, a
    // same-shape side with a scalar side, and one side input of shape [1] before a unary map
    {
        use torchlean::graph::{FusedStep, SideOperand as S};
        let st = |op: Op, side: Option<S>| FusedStep { op, side };
        let map = |steps: Vec<FusedStep>| Op::FusedMap { steps };
        v.push(c(
            map(vec![
                st(Op::Sub, Some(S::Right)),
                st(Op::Mul, Some(S::Right)),
                st(Op::Add, Some(S::Right)),
                st(Op::Relu, None),
            ]),
            &[
                (&[4, 8, 16, 16], Normal),
                (&[8, 1, 1], Normal),
                (&[8, 1, 1], Positive),
                (&[1, 8, 1, 1], Normal),
            ],
        ));
        v.push(c(
            map(vec![
                st(Op::Add, Some(S::Right)),
                st(Op::Tanh, None),
                st(Op::Div, Some(S::Left)),
            ]),
            &[(&[3, 5, 7], Normal), (&[7], Normal), (&[5, 1], Positive)],
        ));
        v.push(c(
            map(vec![
                st(Op::Maximum, Some(S::Left)),
                st(Op::Minimum, Some(S::Right)),
                st(Op::Sub, Some(S::Left)),
            ]),
            &[
                (&[2, 3], Normal),
                (&[2, 3], Normal),
                (&[], Normal),
                (&[3], Normal),
            ],
        ));
        v.push(c(
            map(vec![st(Op::Mul, Some(S::Right)), st(Op::Exp, None)]),
            &[(&[6, 300], Normal), (&[1], Normal)],
        ));
    }
    // conv2d with an epilogue: a CNN's batch norm and ReLU over per-channel sides (the
    // direct path, with and without a bias), a left-hand side and a relu between steps
    // (grouped, two images), a side that varies over positions (not per channel: the
    // unfused form) and a strided conv (the im2col path)
    {
        use torchlean::graph::{FusedStep, SideOperand as S};
        let st = |op: Op, side: Option<S>| FusedStep { op, side };
        let bn = vec![
            st(Op::Sub, Some(S::Right)),
            st(Op::Mul, Some(S::Right)),
            st(Op::Add, Some(S::Right)),
            st(Op::Relu, None),
        ];
        let pad1 = Conv2dGeometry {
            padding: [1, 1],
            ..Conv2dGeometry::default()
        };
        let cm = |geometry, steps| Op::Conv2dMap { geometry, steps };
        v.push(c(
            cm(pad1, bn.clone()),
            &[
                (&[3, 2, 9, 10], Normal),
                (&[5, 2, 3, 3], Normal),
                (&[5], Normal),
                (&[5, 1, 1], Normal),
                (&[5, 1, 1], Positive),
                (&[1, 5, 1, 1], Normal),
            ],
        ));
        v.push(c(
            cm(pad1, bn),
            &[
                (&[2, 3, 6, 6], Normal),
                (&[4, 3, 3, 3], Normal),
                (&[4, 1, 1], Normal),
                (&[4, 1, 1], Positive),
                (&[4, 1, 1], Normal),
            ],
        ));
        v.push(c(
            cm(
                Conv2dGeometry { groups: 2, ..pad1 },
                vec![
                    st(Op::Mul, Some(S::Left)),
                    st(Op::Relu, None),
                    st(Op::Sub, Some(S::Left)),
                ],
            ),
            &[
                (&[2, 4, 5, 7], Normal),
                (&[6, 2, 3, 3], Normal),
                (&[6], Normal),
                (&[6, 1, 1], Normal),
                (&[1], Normal),
            ],
        ));
        v.push(c(
            cm(pad1, vec![st(Op::Add, Some(S::Right)), st(Op::Relu, None)]),
            &[
                (&[2, 2, 4, 4], Normal),
                (&[3, 2, 3, 3], Normal),
                (&[3], Normal),
                (&[4, 4], Normal),
            ],
        ));
        v.push(c(
            cm(
                Conv2dGeometry {
                    stride: [2, 2],
                    ..pad1
                },
                vec![st(Op::Mul, Some(S::Right)), st(Op::Add, Some(S::Left))],
            ),
            &[
                (&[2, 3, 7, 7], Normal),
                (&[4, 3, 3, 3], Normal),
                (&[4, 1, 1], Positive),
                (&[4, 1, 1], Normal),
            ],
        ));
    }
    let fused = |ops: Vec<Op>| Op::FusedUnary { ops };
    v.push(c(fused(vec![Op::Exp, Op::Tanh]), &[(&[3, 4], Normal)]));
    v.push(c(
        fused(vec![
            Op::Scale { factor: 0.5 },
            Op::Sigmoid,
            Op::Log,
            Op::Neg,
        ]),
        &[(&[1], Normal)],
    ));
    v.push(c(
        fused(vec![
            Op::Gelu,
            Op::AddScalar { value: 1.0 },
            Op::Pow { exponent: 1.5 },
        ]),
        &[(&[70000], Normal)],
    ));
    v.push(c(fused(vec![Op::Softplus]), &[(&[2, 5], Normal)]));
    // erf inside a chain (the GELU-like 1 + erf(x/2))
    v.push(c(
        fused(vec![
            Op::Scale { factor: 0.5 },
            Op::Erf,
            Op::AddScalar { value: 1.0 },
        ]),
        &[(&[4, 9], Normal)],
    ));
    // longer than one CUDA launch holds (8 maps), with clamp's two bounds
    v.push(c(
        fused(vec![
            Op::Tanh,
            Op::Scale { factor: 2.0 },
            Op::Clamp {
                min: -1.5,
                max: 1.25,
            },
            Op::Sin,
            Op::AddScalar { value: 0.5 },
            Op::Sigmoid,
            Op::Neg,
            Op::Exp,
            Op::Sqrt,
            Op::Softplus,
        ]),
        &[(&[3, 7], Normal)],
    ));
    let sdpa = |causal, mask| Op::ScaledDotProductAttention {
        scale: None,
        causal,
        mask,
    };
    v.push(c(
        sdpa(false, AttentionMask::None),
        &[
            (&[2, 3, 4], Normal),
            (&[2, 5, 4], Normal),
            (&[2, 5, 6], Normal),
        ],
    ));
    v.push(c(
        sdpa(true, AttentionMask::None),
        &[
            (&[1, 2, 4, 8], Normal),
            (&[1, 2, 4, 8], Normal),
            (&[1, 2, 4, 8], Normal),
        ],
    ));
    v.push(c(
        sdpa(false, AttentionMask::Boolean),
        &[
            (&[2, 4, 3], Normal),
            (&[2, 5, 3], Normal),
            (&[2, 5, 2], Normal),
            (&[4, 5], MaskBlockedRow),
        ],
    ));
    v.push(c(
        sdpa(true, AttentionMask::Boolean),
        &[
            (&[2, 4, 3], Normal),
            (&[2, 4, 3], Normal),
            (&[2, 4, 2], Normal),
            (&[2, 4, 4], Mask),
        ],
    ));
    v.push(c(
        sdpa(false, AttentionMask::AdditiveBias),
        &[
            (&[2, 4, 3], Normal),
            (&[2, 5, 3], Normal),
            (&[2, 5, 2], Normal),
            (&[4, 5], Normal),
        ],
    ));
    v.push(c(
        Op::ScaledDotProductAttention {
            scale: Some(0.3),
            causal: false,
            mask: AttentionMask::AdditiveBias,
        },
        &[
            (&[2, 4, 3], Normal),
            (&[2, 5, 3], Normal),
            (&[2, 5, 2], Normal),
            (&[2, 4, 5], Normal),
        ],
    ));
    v.push(c(
        sdpa(false, AttentionMask::None),
        &[
            (&[1, 1, 1], Normal),
            (&[1, 1, 1], Normal),
            (&[1, 1, 1], Normal),
        ],
    ));
    v.push(c(
        sdpa(true, AttentionMask::Boolean),
        &[
            (&[2, 4, 64, 32], Normal),
            (&[2, 4, 64, 32], Normal),
            (&[2, 4, 64, 32], Normal),
            (&[64, 64], Mask),
        ],
    ));
    v
}

/// Draws an input deterministically from (case index, input index).
pub fn draw(shape: &[usize], gen: Gen, key: u64) -> Array<f64> {
    let u = |i: usize, j: u64| {
        uniform_from_bits(splitmix64(
            key.wrapping_mul(1_000_003).wrapping_add(4 * i as u64 + j),
        ))
    };
    let last2 = if shape.len() >= 2 {
        shape[shape.len() - 1]
    } else {
        usize::MAX
    };
    Array::from_fn(shape, |i| match gen {
        Normal => (u(i, 0) + u(i, 1) + u(i, 2) - 1.5) * 2.0,
        Positive => 0.5 + 1.5 * u(i, 0),
        Unit => 0.05 + 0.9 * u(i, 0),
        AboveOne => 1.05 + 1.95 * u(i, 0),
        Index(b) => ((u(i, 0) * b as f64) as usize).min(b - 1) as f64,
        Quarters(b) => ((u(i, 0) * (8 * b) as f64) as usize).min(8 * b - 1) as f64 / 4.0 - b as f64,
        Mask => (u(i, 0) < 0.7) as u8 as f64,
        MaskBlockedRow => {
            let row = (i / last2) % shape[shape.len() - 2].max(1);
            if row == 0 {
                0.0
            } else {
                (u(i, 0) < 0.7) as u8 as f64
            }
        }
    })
}

/// Every op kind must have at least one row.
pub fn uncovered_kinds() -> Vec<OpKind> {
    let table = cases();
    OpKind::ALL
        .iter()
        .copied()
        .filter(|k| !table.iter().any(|c| c.op.kind() == *k))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Comparing a provider's f32 values with the f64 spec (shared by the CPU harness,
// tests/conformance.rs, and the GPU one, crates/torchlean-cuda/tests/gpu_only_conformance.rs).
// ---------------------------------------------------------------------------------------

/// Relative error bound for f32 kernels against the f64 spec: max |a-b| / (1 + max |b|).
/// Norm-wise: an element much smaller than the row's largest may be off by more, relative to
/// itself (a 1e-3 relative error is caught on elements of at least a fifth of 1 + that scale).
pub const F32_TOL: f64 = 2e-4;

/// The kind of a value: NaN, an infinity (of a sign) or finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Class {
    Nan,
    Inf(bool),
    Finite,
}

pub fn class(v: f64) -> Class {
    if v.is_nan() {
        Class::Nan
    } else if v.is_infinite() {
        Class::Inf(v > 0.0)
    } else {
        Class::Finite
    }
}

/// Compares a provider's values `got` with the f64 spec's `want`, rounded to f32 (the range
/// the provider computes in). Every element must be of the spec's class — NaN exactly where
/// the spec is NaN, ±inf exactly where the spec's infinity of that sign is — and finite
/// elements within `tol` of the spec relative to 1 + the largest finite |spec value| (the
/// error reported). A NaN never passes as a small error; lengths must agree.
///
/// `alt`, when given, is the spec run at f32 (the reference kernel) on the same inputs. Where
/// it lands in another class than the f64 spec — an intermediate that overflows or
/// underflows in f32 only, such as `b * b` for a subnormal `b` — either result is accepted.
pub fn compare(got: &[f64], want: &[f64], alt: Option<&[f64]>, tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} values, spec {}", got.len(), want.len()));
    }
    if let Some(a) = alt {
        if a.len() != want.len() {
            return Err(format!(
                "spec at f32 has {} values, spec {}",
                a.len(),
                want.len()
            ));
        }
    }
    let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
    // explicit comparisons: `f64::max` would skip a NaN, and NaNs are filtered out anyway
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| if v.abs() > m { v.abs() } else { m });
    let mut err = 0.0f64;
    let mut bad = vec![];
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let near = |w: f64| match (class(g), class(w)) {
            (Class::Finite, Class::Finite) => Some((g - w).abs() / scale),
            (a, b) if a == b => Some(0.0),
            _ => None,
        };
        let e = match (near(w), alt.map(|a| a[k])) {
            (Some(e), _) => Some(e),
            (None, Some(a)) if class(a) != class(w) => near(a),
            (None, _) => None,
        };
        match e {
            Some(e) if e <= tol => err = if e > err { e } else { err },
            Some(e) => bad.push(format!("[{k}] {g} vs spec {w} (error {e:e})")),
            None => bad.push(format!("[{k}] {g} vs spec {w}")),
        }
    }
    if bad.is_empty() {
        Ok(err)
    } else {
        let n = bad.len();
        bad.truncate(4);
        Err(format!("{n} elements differ: {}", bad.join(", ")))
    }
}

/// The CPU profiles a semantics test runs under: the spec at f32 (`only:reference`), the
/// native kernels (`only:native_cpu`), and the native kernels under their replay checkers
/// (`strict_native_cpu`, whose f64 spec must agree too or it would refuse them).
pub fn cpu_profiles() -> Vec<(&'static str, torchlean::backend::BackendProfile)> {
    use torchlean::backend::BackendProfile;
    let only = |p: &str| {
        BackendProfile::resolve(None, Some("cpu"), Some(p), Some("checked-runtime"))
            .expect("a CPU profile")
    };
    vec![
        ("only:reference", only("only:reference")),
        ("only:native_cpu", only("only:native_cpu")),
        (
            "strict_native_cpu",
            BackendProfile::named("strict_native_cpu").expect("named profile"),
        ),
    ]
}

/// Norm calls whose rows' statistics overflow f32 (|x| ~ 2⁶⁵: the squared deviations pass
/// f32's range): (op, x's shape, arity).
pub fn overflowing_norm_cases() -> Vec<(Op, Vec<usize>, usize)> {
    vec![
        (Op::LayerNorm { eps: 1e-5 }, vec![4, 40], 3),
        (Op::RmsNorm { eps: 1e-6 }, vec![5, 33], 2),
        (
            Op::BatchNorm {
                eps: 1e-5,
                channel_axis: 1,
            },
            vec![2, 3, 4, 5],
            3,
        ),
    ]
}

/// The inputs of an [`overflowing_norm_cases`] call — x Normal·2⁶⁵ + `offset` (rounded to
/// f32), the affine parameters Normal — and a cotangent for its VJP.
pub fn overflowing_norm_inputs(
    op: &Op,
    shape: &[usize],
    arity: usize,
    (scale, offset): (f64, f64),
) -> (Vec<Array<f64>>, Array<f64>) {
    let params = if matches!(op, Op::BatchNorm { .. }) {
        vec![shape[1]]
    } else {
        vec![*shape.last().expect("rank >= 1")]
    };
    let mut x = draw(shape, Gen::Normal, 1);
    for v in &mut x.data {
        *v = ((*v * scale + offset).clamp(-3e38, 3e38) as f32) as f64;
    }
    let mut inputs = vec![x];
    for j in 1..arity {
        inputs.push(draw(&params, Gen::Normal, 10 + j as u64));
    }
    (inputs, draw(shape, Gen::Normal, 99))
}

/// Layer and batch norm of **constant** groups (rows, channels) with a nonzero mean: the
/// exact mean is the value itself, every deviation 0, so the output is exactly the shift β —
/// PyTorch's too. A mean summed as Σx/n errs by a few ulps of a large value, and with ε small
/// against that error squared the row normalized to about ±0.8 (10000.3 over 768 values at
/// ε = 1e-5: −0.839; 3.7 at BERT's ε = 1e-12: 0.886); with ε = 0 the exact result is 0/0, NaN
/// (PyTorch: NaN), where a finite ±1 came out. Checks the forward (β exactly; NaN for ε = 0)
/// and the gradients against the f64 spec.
pub fn check_constant_norm_groups(
    place: impl Fn(&Array<f64>) -> torchlean::Tensor,
) -> Result<(), String> {
    use torchlean::spec;
    let read = read_f64;
    let cases = [
        (Op::LayerNorm { eps: 1e-5 }, vec![3, 768]),
        (Op::LayerNorm { eps: 1e-12 }, vec![2, 100]),
        (Op::LayerNorm { eps: 0.0 }, vec![2, 33]),
        (
            Op::BatchNorm {
                eps: 1e-5,
                channel_axis: 1,
            },
            vec![4, 3, 5, 7],
        ),
    ];
    for (op, shape) in cases {
        let d = if matches!(op, Op::BatchNorm { .. }) {
            shape[1]
        } else {
            shape[shape.len() - 1]
        };
        for value in [3.7f32, 1766.3466, 10000.3, -2.5e7, 1e-30] {
            let what = format!("{} {shape:?} of constant {value:e}", op.name());
            let n: usize = shape.iter().product();
            let x =
                Array::from_vec(shape.clone(), vec![value as f64; n]).map_err(|e| e.to_string())?;
            let gamma = draw(&[d], Gen::Normal, 11);
            let beta = draw(&[d], Gen::Normal, 12);
            let w = draw(&shape, Gen::Normal, 99);
            let inputs = [x, gamma, beta];
            let refs: Vec<&Array<f64>> = inputs.iter().collect();
            let want = spec::forward(&op, &refs).map_err(|e| e.to_string())?;
            let ts: Vec<torchlean::Tensor> =
                inputs.iter().map(|a| place(a).requires_grad()).collect();
            let tr: Vec<&torchlean::Tensor> = ts.iter().collect();
            let y = apply_norm(&op, &tr).map_err(|e| format!("{what}: {e}"))?;
            let got = read(&y)?;
            let zero_eps = matches!(op, Op::LayerNorm { eps } if eps == 0.0);
            for (k, &g) in got.iter().enumerate() {
                let channel = if matches!(op, Op::BatchNorm { .. }) {
                    (k / (shape[2] * shape[3])) % d
                } else {
                    k % d
                };
                let ok = if zero_eps {
                    g.is_nan() && want.data[k].is_nan()
                } else {
                    g == (inputs[2].data[channel] as f32) as f64
                };
                if !ok {
                    return Err(format!(
                        "{what}: output {k} is {g}, want {} (the spec: {})",
                        if zero_eps {
                            "NaN".to_string()
                        } else {
                            format!("β = {}", inputs[2].data[channel])
                        },
                        want.data[k]
                    ));
                }
            }
            if zero_eps {
                continue;
            }
            let want_g = spec::vjp(&op, &refs, &want, &w).map_err(|e| e.to_string())?;
            check_norm_grads(&what, &y, &ts, &place(&w), &want_g)?;
        }
    }
    Ok(())
}

/// A tensor's values (on any device) at f64.
fn read_f64(t: &torchlean::Tensor) -> Result<Vec<f64>, String> {
    Ok(t.try_to_vec()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The gradients of Σ y·w for the inputs `ts` against the spec's `want` (within the
/// conformance tolerance), `w` placed as `y` is.
fn check_norm_grads(
    what: &str,
    y: &torchlean::Tensor,
    ts: &[torchlean::Tensor],
    w: &torchlean::Tensor,
    want: &[Option<Array<f64>>],
) -> Result<(), String> {
    let grads = y
        .mul(w)
        .and_then(|p| p.sum_all())
        .and_then(|l| l.backward())
        .map_err(|e| format!("{what}: backward: {e}"))?;
    for (j, t) in ts.iter().enumerate() {
        let want_j = want[j]
            .as_ref()
            .ok_or(format!("{what}: no spec cotangent {j}"))?;
        let got = grads
            .get(t)
            .ok_or(format!("{what}: no gradient of input {j}"))?;
        compare(&read_f64(got)?, &want_j.data, None, F32_TOL)
            .map_err(|e| format!("{what}: gradient of input {j}: {e}"))?;
    }
    Ok(())
}

/// The norm `op` applied to tensors through the public API (on their device).
pub fn apply_norm(op: &Op, t: &[&torchlean::Tensor]) -> torchlean::Result<torchlean::Tensor> {
    match op {
        Op::LayerNorm { eps } => t[0].layer_norm(t[1], t[2], *eps),
        Op::RmsNorm { eps } => t[0].rms_norm(t[1], *eps),
        Op::BatchNorm { eps, channel_axis } => t[0].batch_norm(t[1], t[2], *eps, *channel_axis),
        other => panic!("not a norm: {}", other.name()),
    }
}

/// Attention with head dimension 0 over queries [1, 2, l, 0], keys [1, 2, s, 0] and the
/// values `v` [1, 2, s, dv]: every score is the empty dot product, so each output row is the
/// mean of the value rows its query sees (all, or keys 0..=i when causal: PyTorch's
/// top-left causal mask), and v's gradient for a cotangent of ones the sum of the weights
/// each key gets. Checks `out` and `dv` (row-major) against that.
pub fn check_empty_head_attention(
    (l, s, dv): (usize, usize, usize),
    v: &[f32],
    causal: bool,
    out: &[f32],
    grad_v: &[f32],
) -> Result<(), String> {
    for h in 0..2 {
        for i in 0..l {
            let keys = if causal { i + 1 } else { s };
            for c in 0..dv {
                let mean = (0..keys)
                    .map(|j| v[(h * s + j) * dv + c] as f64)
                    .sum::<f64>()
                    / keys as f64;
                let g = out[(h * l + i) * dv + c] as f64;
                if (g - mean).abs() > 1e-6 * (1.0 + mean.abs()) {
                    return Err(format!(
                        "head {h} query {i} column {c}: {g}, the mean of the values {mean}"
                    ));
                }
            }
        }
        for j in 0..s {
            let want: f64 = (0..l)
                .filter(|&i| !causal || j <= i)
                .map(|i| 1.0 / if causal { (i + 1) as f64 } else { s as f64 })
                .sum();
            let g = grad_v[(h * s + j) * dv] as f64;
            if (g - want).abs() > 1e-6 {
                return Err(format!("dv[{h}, {j}] = {g}, want {want}"));
            }
        }
    }
    Ok(())
}

/// (scale, offset) of the values of [`check_overflowing_norms`]: Normal·2⁶⁵ (squares past
/// f32's range) around 0 and around 2⁶⁶, and Normal·2¹²⁷ + 2¹²⁶ clamped to ±3·10³⁸, where
/// x − μ itself overflows f32 (x = −3e38 against a mean near 10³⁸: until the forty-fourth
/// session x̂ came out −inf and the gradients ±inf on every provider).
const OVERFLOWING_NORM_RANGES: [(f64, f64); 3] = [
    (3.6893488147419103e19, 0.0),
    (3.6893488147419103e19, 7.378697629483821e19),
    (1.7014118346046923e38, 8.507059173023462e37),
];

/// Every [`overflowing_norm_cases`] call over each of [`OVERFLOWING_NORM_RANGES`], with its
/// inputs placed by `place` (on the session's device): values and the gradients of every
/// input against the f64 spec (which never overflows for f32 inputs), within [`F32_TOL`].
pub fn check_overflowing_norms(
    place: impl Fn(&Array<f64>) -> torchlean::Tensor,
) -> Result<(), String> {
    use torchlean::spec;
    let read = read_f64;
    for (op, shape, arity) in overflowing_norm_cases() {
        for (scale, offset) in OVERFLOWING_NORM_RANGES {
            let what = format!("{} {shape:?} scale {scale:e} offset {offset:e}", op.name());
            let (inputs, w) = overflowing_norm_inputs(&op, &shape, arity, (scale, offset));
            let refs: Vec<&Array<f64>> = inputs.iter().collect();
            let want = spec::forward(&op, &refs).map_err(|e| e.to_string())?;
            let want_g = spec::vjp(&op, &refs, &want, &w).map_err(|e| e.to_string())?;
            let ts: Vec<torchlean::Tensor> =
                inputs.iter().map(|a| place(a).requires_grad()).collect();
            let tr: Vec<&torchlean::Tensor> = ts.iter().collect();
            let y = apply_norm(&op, &tr).map_err(|e| format!("{what}: {e}"))?;
            compare(&read(&y)?, &want.data, None, F32_TOL)
                .map_err(|e| format!("{what}: forward: {e}"))?;
            check_norm_grads(&what, &y, &ts, &place(&w), &want_g)?;
        }
    }
    Ok(())
}
