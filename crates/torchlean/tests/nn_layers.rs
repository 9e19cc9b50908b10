//! nn layers: output shapes and values against the ops with the same weights and against
//! independent f64 computations; dropout, norms with running statistics, embeddings,
//! positional encodings, containers and initialization.

mod support;
use torchlean::graph::{Conv2dGeometry, Pool2dGeometry};
use torchlean::nn::init;
use torchlean::nn::{
    Activation, AvgPool2d, BatchNorm, Conv2d, Conv2dOptions, Dropout, Embedding, Flatten,
    GlobalAvgPool, LayerNorm, LearnedPositionalEncoding, Linear, MaxPool2d, Module, RmsNorm,
    Sequential, SinusoidalPositionalEncoding, Softmax,
};
use torchlean::{Error, OpError, Tensor};

fn assert_close(a: &[f32], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x as f64 - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// Direct convolution in f64 (NCHW, OIHW, groups).
fn conv_ref(x: &Tensor, w: &Tensor, b: &Tensor, g: Conv2dGeometry) -> (Vec<usize>, Vec<f64>) {
    let (xs, ws) = (x.shape(), w.shape());
    let (n, ci, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (co, cig, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let oh = (h + 2 * g.padding[0] - g.dilation[0] * (kh - 1) - 1) / g.stride[0] + 1;
    let ow = (wd + 2 * g.padding[1] - g.dilation[1] * (kw - 1) - 1) / g.stride[1] + 1;
    let (xd, wdat, bd) = (x.to_vec(), w.to_vec(), b.to_vec());
    let cog = co / g.groups;
    let mut out = vec![0f64; n * co * oh * ow];
    for ni in 0..n {
        for o in 0..co {
            let grp = o / cog;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = bd[o] as f64;
                    for c in 0..cig {
                        let cin = grp * cig + c;
                        for i in 0..kh {
                            for j in 0..kw {
                                let yy = (y * g.stride[0] + i * g.dilation[0]) as isize
                                    - g.padding[0] as isize;
                                let xx = (xo * g.stride[1] + j * g.dilation[1]) as isize
                                    - g.padding[1] as isize;
                                if yy < 0 || xx < 0 || yy >= h as isize || xx >= wd as isize {
                                    continue;
                                }
                                let xv = xd[((ni * ci + cin) * h + yy as usize) * wd + xx as usize];
                                let wv = wdat[((o * cig + c) * kh + i) * kw + j];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    out[((ni * co + o) * oh + y) * ow + xo] = acc;
                }
            }
        }
    }
    (vec![n, co, oh, ow], out)
}

#[test]
fn conv2d_layer_matches_the_op_and_a_direct_sum() {
    support::checked_cpu_default();
    for (opts, k) in [
        (
            Conv2dOptions {
                stride: 2,
                padding: 1,
                dilation: 1,
                groups: 2,
                bias: true,
            },
            3,
        ),
        (
            Conv2dOptions {
                stride: 1,
                padding: 2,
                dilation: 2,
                groups: 1,
                bias: true,
            },
            3,
        ),
    ] {
        let layer = Conv2d::new(4, 6, k, opts, 7).unwrap();
        let x = Tensor::randn(&[2, 4, 7, 7], 3).unwrap();
        let y = layer.forward(&x).unwrap();
        let via_op = x
            .conv2d(&layer.weight, layer.bias.as_ref(), layer.geometry)
            .unwrap();
        assert_eq!(y.to_vec(), via_op.to_vec());
        let (shape, expect) = conv_ref(
            &x,
            &layer.weight,
            layer.bias.as_ref().unwrap(),
            layer.geometry,
        );
        assert_eq!(y.shape(), shape.as_slice());
        assert_close(&y.to_vec(), &expect, 1e-4, "conv2d");
        assert_eq!(layer.weight.shape(), &[6, 4 / opts.groups, k, k]);
        let names: Vec<String> = layer.parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
    }
}

#[test]
fn conv2d_rejects_bad_groups_and_gets_gradients() {
    support::checked_cpu_default();
    let bad = Conv2d::new(
        3,
        4,
        3,
        Conv2dOptions {
            groups: 2,
            ..Default::default()
        },
        0,
    );
    assert!(matches!(bad, Err(Error::Creation(_))));
    let layer = Conv2d::new(2, 3, 3, Conv2dOptions::default(), 1).unwrap();
    let x = Tensor::randn(&[1, 2, 5, 5], 2).unwrap();
    let g = layer
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    // d(sum y)/d bias_o = number of output positions (3x3)
    assert_eq!(
        g.get(layer.bias.as_ref().unwrap()).unwrap().to_vec(),
        vec![9.0; 3]
    );
    assert!(g.get(&layer.weight).is_some());
}

#[test]
fn pooling_flatten_and_global_average_match_hand_values() {
    support::checked_cpu_default();
    let x = Tensor::from_vec((0..32).map(|v| v as f32).collect(), &[1, 2, 4, 4]).unwrap();
    let mp = MaxPool2d::new(2, 2, 0).forward(&x).unwrap();
    assert_eq!(mp.shape(), &[1, 2, 2, 2]);
    assert_eq!(mp.to_vec(), vec![5., 7., 13., 15., 21., 23., 29., 31.]);
    let ap = AvgPool2d::new(2, 2, 0).forward(&x).unwrap();
    assert_eq!(
        ap.to_vec(),
        vec![2.5, 4.5, 10.5, 12.5, 18.5, 20.5, 26.5, 28.5]
    );
    // padding 1, count_include_pad: corner window holds one real value out of 4
    let padded = AvgPool2d::new(2, 2, 1).forward(&x).unwrap();
    assert_eq!(padded.shape(), &[1, 2, 3, 3]);
    assert_eq!(padded.get(&[0, 0, 0, 0]).unwrap(), 0.0 / 4.0);
    assert_eq!(padded.get(&[0, 0, 2, 2]).unwrap(), 15.0 / 4.0);
    let gap = GlobalAvgPool.forward(&x).unwrap();
    assert_eq!(gap.shape(), &[1, 2]);
    assert_eq!(gap.to_vec(), vec![7.5, 23.5]);
    let flat = Flatten.forward(&x).unwrap();
    assert_eq!(flat.shape(), &[1, 32]);
    assert_eq!(flat.to_vec(), x.to_vec());
    assert!(GlobalAvgPool.forward(&flat).is_err());
    let geom = Pool2dGeometry::square(2);
    assert_eq!(
        MaxPool2d { geometry: geom }.forward(&x).unwrap().to_vec(),
        mp.to_vec()
    );
}

#[test]
fn activation_modules_match_their_formulas() {
    support::checked_cpu_default();
    let x = Tensor::from_vec(vec![-2.0, -0.5, 0.0, 0.7, 3.0, 1.5], &[2, 3]).unwrap();
    let xv: Vec<f64> = x.to_vec().iter().map(|&v| v as f64).collect();
    type Formula = fn(f64) -> f64;
    let cases: [(Activation, Formula); 4] = [
        (Activation::Relu, |v| v.max(0.0)),
        (Activation::Tanh, f64::tanh),
        (Activation::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
        (Activation::Silu, |v| v / (1.0 + (-v).exp())),
    ];
    for (act, f) in cases {
        let y = act.forward(&x).unwrap();
        let e: Vec<f64> = xv.iter().map(|&v| f(v)).collect();
        assert_close(&y.to_vec(), &e, 1e-6, &format!("{act:?}"));
    }
    // exact GELU: 0.5 x (1 + erf(x / sqrt 2)); erf(1/sqrt2) for x = 1 known value
    let g = Activation::Gelu
        .forward(&Tensor::from_vec(vec![1.0], &[1]).unwrap())
        .unwrap();
    assert!((g.to_vec()[0] as f64 - 0.841_344_746).abs() < 1e-5);
    let s = Softmax { axis: -1 }.forward(&x).unwrap().to_vec();
    for row in 0..2 {
        let r = &xv[row * 3..row * 3 + 3];
        let z: f64 = r.iter().map(|v| v.exp()).sum();
        let e: Vec<f64> = r.iter().map(|v| v.exp() / z).collect();
        assert_close(&s[row * 3..row * 3 + 3], &e, 1e-6, "softmax");
    }
}

#[test]
fn dropout_is_identity_in_eval_and_a_seeded_scaled_mask_in_training() {
    support::checked_cpu_default();
    let x = Tensor::ones(&[100, 100]).unwrap();
    let mut d = Dropout::new(0.25, 42).unwrap();
    d.set_training(false);
    assert_eq!(d.forward(&x).unwrap().to_vec(), x.to_vec());
    d.set_training(true);
    d.reseed(5);
    let a = d.forward(&x).unwrap().to_vec();
    let zeros = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
    assert!((zeros - 0.25).abs() < 0.02, "dropped fraction {zeros}");
    assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    // a second call draws a new mask; reseeding with the same key replays the first
    let b = d.forward(&x).unwrap().to_vec();
    assert_ne!(a, b);
    d.reseed(5);
    assert_eq!(d.forward(&x).unwrap().to_vec(), a);
    d.reseed(6);
    assert_ne!(d.forward(&x).unwrap().to_vec(), a);
    assert!(Dropout::new(1.0, 0).is_err());
}

#[test]
fn embedding_selects_rows_and_rejects_bad_ids() {
    support::checked_cpu_default();
    let e = Embedding::new(5, 3, 9).unwrap();
    let ids = Tensor::from_vec(vec![4.0, 0.0, 2.0, 2.0], &[2, 2]).unwrap();
    let y = e.forward(&ids).unwrap();
    assert_eq!(y.shape(), &[2, 2, 3]);
    let w = e.weight.to_vec();
    let expect: Vec<f32> = [4, 0, 2, 2]
        .iter()
        .flat_map(|&r| w[r * 3..r * 3 + 3].to_vec())
        .collect();
    assert_eq!(y.to_vec(), expect);
    let out_of_range = e.forward(&Tensor::from_vec(vec![5.0], &[1]).unwrap());
    assert!(matches!(
        out_of_range,
        Err(Error::Op(OpError::Index { .. }))
    ));
    let fractional = e.forward(&Tensor::from_vec(vec![1.5], &[1]).unwrap());
    assert!(matches!(fractional, Err(Error::Op(OpError::Index { .. }))));
    // gradient: row 2 is used twice
    let g = y.sum_all().unwrap().backward().unwrap();
    let gw = g.get(&e.weight).unwrap().to_vec();
    assert_eq!(&gw[6..9], &[2.0, 2.0, 2.0]);
    assert_eq!(&gw[3..6], &[0.0, 0.0, 0.0]);
}

#[test]
fn positional_encodings_follow_their_definitions() {
    support::checked_cpu_default();
    let pe = SinusoidalPositionalEncoding::new(10, 6).unwrap();
    let x = Tensor::zeros(&[2, 4, 6]).unwrap();
    let y = pe.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 4, 6]);
    for t in 0..4 {
        for j in 0..6 {
            let i2 = (j - j % 2) as f64;
            let a = t as f64 / 10000f64.powf(i2 / 6.0);
            let e = if j % 2 == 0 { a.sin() } else { a.cos() };
            let got = y.get(&[1, t, j]).unwrap() as f64;
            assert!((got - e).abs() < 1e-6, "PE[{t},{j}] = {got}, expected {e}");
        }
    }
    assert!(pe.forward(&Tensor::zeros(&[1, 11, 6]).unwrap()).is_err());
    let lp = LearnedPositionalEncoding::new(8, 3, 1).unwrap();
    let x = Tensor::randn(&[2, 5, 3], 2).unwrap();
    let y = lp.forward(&x).unwrap();
    let w = lp.weight.to_vec();
    let xv = x.to_vec();
    for b in 0..2 {
        for t in 0..5 {
            for j in 0..3 {
                let i = (b * 5 + t) * 3 + j;
                assert_eq!(y.to_vec()[i], xv[i] + w[t * 3 + j]);
            }
        }
    }
    assert_eq!(lp.parameters()[0].0, "weight");
}

#[test]
fn layer_norm_and_rms_norm_match_manual_formulas() {
    support::checked_cpu_default();
    let x = Tensor::randn(&[3, 5], 11).unwrap();
    let mut ln = LayerNorm::new(5).unwrap();
    ln.weight = Tensor::from_vec(vec![1.0, 2.0, 0.5, -1.0, 3.0], &[5])
        .unwrap()
        .requires_grad();
    ln.bias = Tensor::from_vec(vec![0.1, 0.0, -0.2, 0.3, 0.0], &[5])
        .unwrap()
        .requires_grad();
    let mut rn = RmsNorm::new(5).unwrap();
    rn.weight = ln.weight.clone();
    let (g, b) = (ln.weight.to_vec(), ln.bias.to_vec());
    let xv = x.to_vec();
    let (mut e_ln, mut e_rn) = (vec![], vec![]);
    for r in 0..3 {
        let row: Vec<f64> = xv[r * 5..r * 5 + 5].iter().map(|&v| v as f64).collect();
        let m = row.iter().sum::<f64>() / 5.0;
        let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 5.0;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 5.0;
        for j in 0..5 {
            e_ln.push((row[j] - m) / (var + 1e-5).sqrt() * g[j] as f64 + b[j] as f64);
            e_rn.push(row[j] / (ms + 1e-6).sqrt() * g[j] as f64);
        }
    }
    assert_close(&ln.forward(&x).unwrap().to_vec(), &e_ln, 1e-4, "layer_norm");
    assert_close(&rn.forward(&x).unwrap().to_vec(), &e_rn, 1e-4, "rms_norm");
}

#[test]
fn batch_norm_updates_running_stats_and_uses_them_in_eval() {
    support::checked_cpu_default();
    let mut bn = BatchNorm::new(2).unwrap();
    let x = Tensor::randn(&[4, 2, 3, 3], 5).unwrap();
    let xv = x.to_vec();
    let y = bn.forward(&x).unwrap().to_vec();
    // training output: per-channel mean 0, biased variance 1
    let mut means = vec![];
    let mut vars = vec![];
    for c in 0..2 {
        let vals: Vec<f64> = (0..4)
            .flat_map(|n| xv[(n * 2 + c) * 9..(n * 2 + c + 1) * 9].to_vec())
            .map(|v| v as f64)
            .collect();
        let ys: Vec<f64> = (0..4)
            .flat_map(|n| y[(n * 2 + c) * 9..(n * 2 + c + 1) * 9].to_vec())
            .map(|v| v as f64)
            .collect();
        let m = vals.iter().sum::<f64>() / 36.0;
        let unbiased = vals.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 35.0;
        means.push(m);
        vars.push(unbiased);
        let ym = ys.iter().sum::<f64>() / 36.0;
        let yv = ys.iter().map(|v| (v - ym).powi(2)).sum::<f64>() / 36.0;
        assert!(
            ym.abs() < 1e-5 && (yv - 1.0).abs() < 1e-3,
            "channel {c}: {ym} {yv}"
        );
    }
    let (rm, rv) = bn.running_stats();
    for c in 0..2 {
        assert!((rm[c] as f64 - 0.1 * means[c]).abs() < 1e-5);
        assert!((rv[c] as f64 - (0.9 + 0.1 * vars[c])).abs() < 1e-5);
    }
    // eval: y = (x - rm) / sqrt(rv + eps) * gamma + beta, with gamma, beta set by hand
    bn.weight = Tensor::from_vec(vec![2.0, -1.0], &[2])
        .unwrap()
        .requires_grad();
    bn.bias = Tensor::from_vec(vec![0.5, 0.25], &[2])
        .unwrap()
        .requires_grad();
    bn.set_training(false);
    let z = Tensor::randn(&[3, 2, 2, 2], 8).unwrap();
    let out = bn.forward(&z).unwrap().to_vec();
    let zv = z.to_vec();
    let expect: Vec<f64> = (0..zv.len())
        .map(|i| {
            let c = (i / 4) % 2;
            let g = [2.0, -1.0][c];
            let b = [0.5, 0.25][c];
            (zv[i] as f64 - rm[c] as f64) / (rv[c] as f64 + 1e-5).sqrt() * g + b
        })
        .collect();
    assert_close(&out, &expect, 1e-5, "batch_norm eval");
    // eval does not move the running statistics
    assert_eq!(bn.running_stats(), (rm.clone(), rv.clone()));
    let names: Vec<String> = bn.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["running_mean", "running_var"]);
    bn.set_buffer(
        "running_mean",
        &Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap(),
    )
    .unwrap();
    assert_eq!(bn.running_stats().0, vec![1.0, 2.0]);
    assert!(bn
        .set_buffer("running_mean", &Tensor::zeros(&[3]).unwrap())
        .is_err());
    assert!(bn
        .set_buffer("nope", &Tensor::zeros(&[2]).unwrap())
        .is_err());
    // a single value per channel cannot give batch statistics
    bn.set_training(true);
    assert!(bn.forward(&Tensor::zeros(&[1, 2]).unwrap()).is_err());
}

#[test]
fn sequential_names_nest_and_switches_propagate() {
    support::checked_cpu_default();
    let inner = Sequential::new()
        .push(Linear::new(4, 4, true, 1).unwrap())
        .push(BatchNorm::new(4).unwrap())
        .push(Dropout::new(0.5, 3).unwrap());
    let mut model = Sequential::new()
        .push(Linear::new(3, 4, true, 0).unwrap())
        .push(Activation::Relu)
        .push(inner)
        .push(Linear::new(4, 2, false, 2).unwrap());
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.2.layers.0.weight",
            "layers.2.layers.0.bias",
            "layers.2.layers.1.weight",
            "layers.2.layers.1.bias",
            "layers.3.weight"
        ]
    );
    let mut_names: Vec<String> = model.parameters_mut().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, mut_names);
    assert_eq!(model.parameter_count(), 3 * 4 + 4 + 16 + 4 + 4 + 4 + 8);
    let buffers: Vec<String> = model.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers,
        [
            "layers.2.layers.1.running_mean",
            "layers.2.layers.1.running_var"
        ]
    );
    model
        .set_buffer(
            "layers.2.layers.1.running_var",
            &Tensor::full(&[4], 2.0).unwrap(),
        )
        .unwrap();
    assert_eq!(model.buffers()[1].1.to_vec(), vec![2.0; 4]);
    assert!(model
        .set_buffer("layers.9.running_var", &Tensor::zeros(&[4]).unwrap())
        .is_err());
    // eval mode: dropout off and batch norm on running stats -> deterministic, batch-size free
    model.set_training(false);
    let x = Tensor::randn(&[5, 3], 4).unwrap();
    let a = model.forward(&x).unwrap().to_vec();
    let first = model.forward(&x.slice(0, 0, 1).unwrap()).unwrap().to_vec();
    assert_eq!(&a[..2], first.as_slice());
    assert_eq!(model.forward(&x).unwrap().to_vec(), a);
}

#[test]
fn initializations_are_seeded_and_bounded() {
    support::checked_cpu_default();
    let a = init::kaiming_uniform(&[64, 32], 32, 0.0, 1)
        .unwrap()
        .to_vec();
    let b = init::kaiming_uniform(&[64, 32], 32, 0.0, 1)
        .unwrap()
        .to_vec();
    let c = init::kaiming_uniform(&[64, 32], 32, 0.0, 2)
        .unwrap()
        .to_vec();
    assert_eq!(a, b);
    assert_ne!(a, c);
    let bound = (6.0f32 / 32.0).sqrt();
    assert!(a.iter().all(|v| v.abs() <= bound));
    assert!(a.iter().any(|v| v.abs() > 0.9 * bound));
    let x = init::xavier_uniform(&[10, 20], 20, 10, 1.0, 3)
        .unwrap()
        .to_vec();
    let xb = (6.0f32 / 30.0).sqrt();
    assert!(x.iter().all(|v| v.abs() <= xb) && x.iter().any(|v| v.abs() > 0.8 * xb));
    let l = Linear::new(25, 7, true, 5).unwrap();
    assert!(l.weight.to_vec().iter().all(|v| v.abs() <= 0.2));
    let (w, bias) = init::default_layer(&[7, 25], Some(7), 25, 5).unwrap();
    assert!(w.to_vec().iter().all(|v| v.abs() <= 0.2));
    assert!(bias.unwrap().to_vec().iter().all(|v| v.abs() <= 0.2));
    assert!(w.requires_grad_flag());
    let n = init::normal(&[10000], 0.02, 9).unwrap().to_vec();
    let std = (n.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 1e4).sqrt();
    assert!((std - 0.02).abs() < 0.002, "std {std}");
    assert!(init::kaiming_uniform(&[2], 0, 0.0, 0).is_err());
}

/// The longest run of equal consecutive values that `a` and `b` share at some offset (`b`
/// shifted against `a` by 1..=max_shift in either direction): a few for independent streams,
/// the whole overlap for streams that are shifts of one another.
fn longest_shared_run(a: &[f32], b: &[f32], max_shift: usize) -> usize {
    let mut best = 0;
    for shift in 1..=max_shift {
        for (x, y) in [(a, b), (b, a)] {
            let mut run = 0;
            for (u, v) in x[shift.min(x.len())..].iter().zip(y) {
                run = if u == v { run + 1 } else { 0 };
                best = best.max(run);
            }
        }
    }
    best
}

/// Draws with different seeds are independent streams, not shifts of one another: keyed by
/// the seed itself, element i of seed s + 1 was element i + 1 of seed s (so a `Linear` bias,
/// seeded a few thousand apart from its weight, was a copy of part of it, and consecutive
/// MLP layers were scaled copies of each other — the training-side oracle audit).
#[test]
fn draws_with_nearby_seeds_and_layer_parameters_are_independent() {
    for seed in [0u64, 1, 6, 41, 1000] {
        for other in [seed + 1, seed + 2, seed + 1000] {
            let a = Tensor::rand(&[2048], seed).unwrap().to_vec();
            let b = Tensor::rand(&[2048], other).unwrap().to_vec();
            let run = longest_shared_run(&a, &b, 1100);
            assert!(
                run < 8,
                "rand seeds {seed} and {other} share a run of {run}"
            );
            let a = Tensor::randn(&[2048], seed).unwrap().to_vec();
            let b = Tensor::randn(&[2048], other).unwrap().to_vec();
            assert!(
                longest_shared_run(&a, &b, 1100) < 4,
                "randn seeds {seed}, {other}"
            );
        }
    }
    // a bias is no window of its weight (the audit's case: bias == weight[45477..45605])
    let l = Linear::new(784, 128, true, 0).unwrap();
    let (w, b) = (l.weight.to_vec(), l.bias.as_ref().unwrap().to_vec());
    let copied = w.windows(b.len()).any(|win| win == b.as_slice());
    assert!(!copied, "the bias is a copy of part of the weight");
    // consecutive MLP layers are not proportional: the correlation of layer 1's weight with
    // layer 0's at every offset up to 2000 stays at the level of independent draws
    let mlp = torchlean::nn::Mlp::new(&[784, 128, 10], Activation::Relu, 0).unwrap();
    let params = mlp.parameters();
    let find = |name: &str| {
        let p = params.iter().find(|(n, _)| n == name);
        p.unwrap_or_else(|| panic!("no parameter {name}"))
            .1
            .to_vec()
    };
    let (w0, w1) = (find("layers.0.weight"), find("layers.1.weight"));
    let corr = |x: &[f32], y: &[f32]| {
        let n = x.len().min(y.len()) as f64;
        let (mx, my) = (
            x.iter().map(|&v| v as f64).sum::<f64>() / n,
            y.iter().map(|&v| v as f64).sum::<f64>() / n,
        );
        let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
        for (&u, &v) in x.iter().zip(y) {
            let (du, dv) = (u as f64 - mx, v as f64 - my);
            sxy += du * dv;
            sxx += du * du;
            syy += dv * dv;
        }
        sxy / (sxx * syy).sqrt()
    };
    for offset in 0..2000 {
        let c = corr(&w0[offset..], &w1);
        assert!(
            c.abs() < 0.2,
            "layer weights correlate {c} at offset {offset}"
        );
    }
}

/// The native batch-norm VJP sums each channel's N·H·W cotangents in f64: with a cotangent
/// whose mean is large (≈ 100 over 16·32·32 elements per channel), the bias gradient (that
/// sum) is the f64 sum rounded once, where the f32 left-to-right sum was off by ~4e-6
/// relative (~100× PyTorch's error; an audit of the thirty-eighth session).
#[test]
fn batch_norm_gradients_sum_large_cotangents_accurately() {
    support::checked_cpu_default();
    let shape = [16, 4, 32, 32];
    let x = Tensor::randn(&shape, 61).unwrap().requires_grad();
    let gamma = Tensor::rand(&[4], 62)
        .unwrap()
        .add_scalar(0.5)
        .unwrap()
        .requires_grad();
    let beta = Tensor::randn(&[4], 63).unwrap().requires_grad();
    let cot = Tensor::randn(&shape, 64)
        .unwrap()
        .add_scalar(100.0)
        .unwrap();
    let op = torchlean::graph::Op::BatchNorm {
        eps: 1e-5,
        channel_axis: 1,
    };
    let y = x.apply(op, &[&gamma, &beta]).unwrap();
    let loss = y.mul(&cot).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gbeta = grads.get(&beta).unwrap().to_vec();
    let c = cot.to_vec();
    let per = 32 * 32;
    for (ch, &got) in gbeta.iter().enumerate() {
        let exact: f64 = (0..16)
            .flat_map(|n| (0..per).map(move |i| (n * 4 + ch) * per + i))
            .map(|k| c[k] as f64)
            .sum();
        let rel = ((got as f64 - exact) / exact).abs();
        assert!(
            rel <= 1.2e-7,
            "channel {ch}: {got} against {exact} (relative {rel:e})"
        );
    }
}

/// A convolution over zero input channels is a sum of nothing: zeros (plus the bias), on
/// every provider, batches of one and more, forward and backward (the native kernel sliced
/// its empty patch matrix past its end for a batch of two and panicked — found by the graph
/// fuzzer, thirty-eighth session).
#[test]
fn a_convolution_over_zero_input_channels_is_zero_on_every_provider() {
    for profile in ["checked_cpu", "strict_cpu", "strict_native_cpu"] {
        let before = torchlean::runtime::install(torchlean::runtime::Session::new(
            torchlean::backend::BackendProfile::named(profile).unwrap(),
        ))
        .unwrap();
        for batch in [1usize, 2, 3] {
            for padding in [0usize, 1] {
                let x = Tensor::from_vec(vec![], &[batch, 0, 4, 4])
                    .unwrap()
                    .requires_grad();
                let w = Tensor::from_vec(vec![], &[2, 0, 3, 3])
                    .unwrap()
                    .requires_grad();
                let geometry = Conv2dGeometry {
                    padding: [padding; 2],
                    ..Conv2dGeometry::default()
                };
                let y = x
                    .apply(torchlean::graph::Op::Conv2d(geometry), &[&w])
                    .unwrap_or_else(|e| panic!("{profile} batch {batch}: {e}"));
                let side = 4 + 2 * padding - 2;
                assert_eq!(y.shape(), &[batch, 2, side, side]);
                assert!(y.to_vec().iter().all(|&v| v == 0.0), "{profile}");
                let grads = y.sum_all().unwrap().backward().unwrap();
                assert_eq!(grads.get(&x).unwrap().shape(), &[batch, 0, 4, 4]);
                assert_eq!(grads.get(&w).unwrap().shape(), &[2, 0, 3, 3]);
            }
        }
        torchlean::runtime::take().unwrap();
        if let Some(s) = before {
            torchlean::runtime::install(s).unwrap();
        }
    }
}
