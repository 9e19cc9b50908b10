//! Multi-head attention against an independent f64 computation; boolean masks (a blocked
//! entry contributes exactly zero), causal masking, fully blocked rows, key padding; the
//! pre-norm transformer block and encoder stack.

mod support;
use torchlean::nn::{
    key_padding_mask, Linear, Module, MultiheadAttention, TransformerConfig, TransformerEncoder,
    TransformerEncoderBlock,
};
use torchlean::Tensor;

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec().iter().map(|&v| v as f64).collect()
}

/// Attention computed from the layer's parameters in plain f64; `allowed(b, i, j)`.
fn mha_ref(
    m: &MultiheadAttention,
    q_in: &Tensor,
    kv_in: &Tensor,
    allowed: impl Fn(usize, usize, usize) -> bool,
) -> Vec<f64> {
    let e = m.embed_dim();
    let h = m.heads();
    let d = e / h;
    let (b, l, s) = (q_in.shape()[0], q_in.shape()[1], kv_in.shape()[1]);
    let w = &f64s(&m.in_proj_weight);
    let bias = &f64s(&m.in_proj_bias);
    let wo = &f64s(&m.out_proj.weight);
    let bo = &f64s(m.out_proj.bias.as_ref().unwrap());
    let (qv, kvv) = (f64s(q_in), f64s(kv_in));
    let proj = |x: &[f64], k: usize| -> Vec<f64> {
        // x rows of width e -> rows of width e, projection k
        x.chunks(e)
            .flat_map(|row| {
                (0..e).map(move |o| {
                    let r = k * e + o;
                    (0..e).map(|c| w[r * e + c] * row[c]).sum::<f64>() + bias[r]
                })
            })
            .collect()
    };
    let (q, k, v) = (proj(&qv, 0), proj(&kvv, 1), proj(&kvv, 2));
    let mut merged = vec![0f64; b * l * e];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                let qi = &q[(bi * l + i) * e + hi * d..(bi * l + i) * e + (hi + 1) * d];
                let scores: Vec<Option<f64>> = (0..s)
                    .map(|j| {
                        allowed(bi, i, j).then(|| {
                            let kj = &k[(bi * s + j) * e + hi * d..(bi * s + j) * e + (hi + 1) * d];
                            qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                        })
                    })
                    .collect();
                let mx = scores.iter().flatten().cloned().fold(f64::MIN, f64::max);
                let z: f64 = scores.iter().flatten().map(|v| (v - mx).exp()).sum();
                for (j, sc) in scores.iter().enumerate() {
                    let Some(sc) = sc else { continue };
                    let p = (sc - mx).exp() / z;
                    for c in 0..d {
                        merged[(bi * l + i) * e + hi * d + c] +=
                            p * v[(bi * s + j) * e + hi * d + c];
                    }
                }
            }
        }
    }
    merged
        .chunks(e)
        .flat_map(|row| {
            (0..e).map(move |o| (0..e).map(|c| wo[o * e + c] * row[c]).sum::<f64>() + bo[o])
        })
        .collect()
}

fn assert_close(a: &[f32], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!((x as f64 - y).abs() < 1e-4, "{what}[{i}]: {x} vs {y}");
    }
}

/// Gives the output projection a non-zero bias, so that rows of zeros are distinguishable.
fn mha(e: usize, h: usize, causal: bool, seed: u64) -> MultiheadAttention {
    let mut m = MultiheadAttention::new(e, h, causal, seed).unwrap();
    m.in_proj_bias = Tensor::randn(&[3 * e], seed + 1).unwrap().requires_grad();
    m.out_proj.bias = Some(Tensor::randn(&[e], seed + 2).unwrap().requires_grad());
    m
}

#[test]
fn self_attention_matches_an_f64_reference() {
    support::checked_cpu_default();
    let m = mha(8, 2, false, 3);
    let x = Tensor::randn(&[2, 5, 8], 4).unwrap();
    let y = m.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 5, 8]);
    assert_close(&y.to_vec(), &mha_ref(&m, &x, &x, |_, _, _| true), "mha");
    let names: Vec<String> = m.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
    // cross-attention (separate projections path) agrees with the reference too
    let kv = Tensor::randn(&[2, 3, 8], 5).unwrap();
    let c = m.attend(&x, &kv, &kv, None, false).unwrap();
    assert_eq!(c.shape(), &[2, 5, 8]);
    assert_close(&c.to_vec(), &mha_ref(&m, &x, &kv, |_, _, _| true), "cross");
}

#[test]
fn blocked_keys_contribute_exactly_zero() {
    support::checked_cpu_default();
    let m = mha(8, 4, false, 7);
    let q = Tensor::randn(&[1, 3, 8], 1).unwrap();
    let kv = Tensor::randn(&[1, 4, 8], 2).unwrap();
    // key 2 blocked for every query; key 0 also blocked for query 1
    let mut mask = vec![1.0f32; 12];
    for i in 0..3 {
        mask[i * 4 + 2] = 0.0;
    }
    mask[4] = 0.0;
    let mask = Tensor::from_vec(mask, &[3, 4]).unwrap();
    let y = m.attend(&q, &kv, &kv, Some(&mask), false).unwrap();
    let allowed = |_: usize, i: usize, j: usize| j != 2 && !(i == 1 && j == 0);
    assert_close(&y.to_vec(), &mha_ref(&m, &q, &kv, allowed), "masked");
    // replacing the blocked key/value by huge values changes nothing, bit for bit
    let mut kvv = kv.to_vec();
    for c in 0..8 {
        kvv[2 * 8 + c] = 1e6;
    }
    let kv2 = Tensor::from_vec(kvv, &[1, 4, 8]).unwrap();
    let y2 = m.attend(&q, &kv2, &kv2, Some(&mask), false).unwrap();
    assert_eq!(y.to_vec(), y2.to_vec());
    // the same mask given per batch [B, L, S] gives the same result
    let per_batch = mask.reshape(&[1, 3, 4]).unwrap();
    let y3 = m.attend(&q, &kv, &kv, Some(&per_batch), false).unwrap();
    assert_close(&y3.to_vec(), &f64s(&y), "per-batch mask");
}

#[test]
fn a_fully_blocked_row_outputs_the_projection_bias() {
    support::checked_cpu_default();
    let m = mha(4, 2, false, 9);
    let x = Tensor::randn(&[1, 3, 4], 3).unwrap();
    let mask = Tensor::from_vec(vec![0., 0., 0., 1., 1., 0., 1., 1., 1.], &[3, 3]).unwrap();
    let y = m.forward_masked(&x, Some(&mask)).unwrap().to_vec();
    let bias = m.out_proj.bias.as_ref().unwrap().to_vec();
    assert_eq!(&y[0..4], bias.as_slice());
    assert!(y[4..].iter().all(|v| v.is_finite()));
}

#[test]
fn causal_masking_equals_a_lower_triangular_mask_and_ignores_the_future() {
    support::checked_cpu_default();
    let m = mha(8, 2, true, 11);
    let x = Tensor::randn(&[2, 6, 8], 12).unwrap();
    let y = m.forward(&x).unwrap();
    assert_close(
        &y.to_vec(),
        &mha_ref(&m, &x, &x, |_, i, j| j <= i),
        "causal",
    );
    let tri: Vec<f32> = (0..36)
        .map(|k| if k % 6 <= k / 6 { 1.0 } else { 0.0 })
        .collect();
    let tri = Tensor::from_vec(tri, &[6, 6]).unwrap();
    let masked = m.attend(&x, &x, &x, Some(&tri), false).unwrap();
    assert_close(&masked.to_vec(), &f64s(&y), "explicit mask");
    // changing the last position leaves every earlier output unchanged, exactly
    let mut xv = x.to_vec();
    for b in 0..2 {
        for c in 0..8 {
            xv[(b * 6 + 5) * 8 + c] += 3.0;
        }
    }
    let y2 = m
        .forward(&Tensor::from_vec(xv, &[2, 6, 8]).unwrap())
        .unwrap();
    for b in 0..2 {
        let (a1, a2) = (y.to_vec(), y2.to_vec());
        assert_eq!(&a1[b * 48..b * 48 + 40], &a2[b * 48..b * 48 + 40]);
        assert_ne!(&a1[b * 48 + 40..b * 48 + 48], &a2[b * 48 + 40..b * 48 + 48]);
    }
}

#[test]
fn key_padding_masks_hide_padded_keys() {
    support::checked_cpu_default();
    let m = mha(4, 1, false, 13);
    let x = Tensor::randn(&[2, 3, 4], 14).unwrap();
    let keep = Tensor::from_vec(vec![1., 1., 0., 1., 0., 0.], &[2, 3]).unwrap();
    let mask = key_padding_mask(&keep, 3).unwrap();
    assert_eq!(mask.shape(), &[2, 3, 3]);
    let y = m.forward_masked(&x, Some(&mask)).unwrap();
    let kv = keep.to_vec();
    let allowed = |b: usize, _: usize, j: usize| kv[b * 3 + j] != 0.0;
    assert_close(&y.to_vec(), &mha_ref(&m, &x, &x, allowed), "key padding");
    assert!(m.forward_masked(&x, Some(&keep)).is_err());
    assert!(MultiheadAttention::new(6, 4, false, 0).is_err());
}

fn config(causal: bool) -> TransformerConfig {
    TransformerConfig {
        embed_dim: 8,
        heads: 2,
        ff_dim: 16,
        dropout: 0.0,
        causal,
    }
}

#[test]
fn transformer_block_is_a_residual_pre_norm_block() {
    support::checked_cpu_default();
    let mut block = TransformerEncoderBlock::new(config(false), 1).unwrap();
    let names: Vec<String> = block.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "norm1.weight",
            "norm1.bias",
            "self_attn.in_proj_weight",
            "self_attn.in_proj_bias",
            "self_attn.out_proj.weight",
            "self_attn.out_proj.bias",
            "norm2.weight",
            "norm2.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias"
        ]
    );
    let x = Tensor::randn(&[2, 4, 8], 2).unwrap();
    // with the feed-forward output zeroed, the block is x + MHA(LN(x))
    block.linear2 = Linear {
        weight: Tensor::zeros(&[8, 16]).unwrap().requires_grad(),
        bias: Some(Tensor::zeros(&[8]).unwrap().requires_grad()),
    };
    let y = block.forward(&x).unwrap();
    let ln = block.norm1.forward(&x).unwrap();
    let expect: Vec<f64> = x
        .to_vec()
        .iter()
        .zip(block.self_attn.forward(&ln).unwrap().to_vec())
        .map(|(&a, b)| a as f64 + b as f64)
        .collect();
    assert_close(&y.to_vec(), &expect, "attention residual");
    // with both branches' outputs zeroed, the block is the identity
    block.self_attn.out_proj = Linear {
        weight: Tensor::zeros(&[8, 8]).unwrap().requires_grad(),
        bias: Some(Tensor::zeros(&[8]).unwrap().requires_grad()),
    };
    assert_eq!(block.forward(&x).unwrap().to_vec(), x.to_vec());
}

#[test]
fn causal_encoder_stack_is_causal_and_trains() {
    support::checked_cpu_default();
    let enc = TransformerEncoder::new(config(true), 2, true, 5).unwrap();
    let names: Vec<String> = enc.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 2 * 12 + 2);
    assert_eq!(names[0], "layers.0.norm1.weight");
    assert_eq!(names[12], "layers.1.norm1.weight");
    assert_eq!(
        names[24..],
        ["norm.weight".to_string(), "norm.bias".to_string()]
    );
    let x = Tensor::randn(&[1, 5, 8], 6).unwrap();
    let y = enc.forward(&x).unwrap().to_vec();
    let mut xv = x.to_vec();
    xv[4 * 8] += 1.0;
    let y2 = enc
        .forward(&Tensor::from_vec(xv, &[1, 5, 8]).unwrap())
        .unwrap()
        .to_vec();
    assert_eq!(&y[..32], &y2[..32]);
    assert_ne!(&y[32..], &y2[32..]);
    let g = Tensor::from_vec(y, &[1, 5, 8]).unwrap();
    let loss = enc.forward(&x).unwrap().mul(&g).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    assert!(enc.parameters().iter().all(|(_, p)| grads.get(p).is_some()));
}

/// A mask that broadcasts to the scores' [B, H, L, S] (a key-padding [B, 1, 1, S], a
/// per-head [H, L, S], a [B, 1, L, S]) means what its full expansion means: the op's
/// values and gradients equal the f64 spec's with the mask expanded by hand, and an
/// additive mask's gradient is the spec's full gradient summed over the broadcast axes.
#[test]
fn broadcastable_masks_mean_their_full_expansion() {
    use torchlean::graph::{AttentionMask, Op};
    use torchlean::spec::{self, Array};
    support::checked_cpu_default();
    let (b, h, l, s, d) = (2, 3, 5, 6, 4);
    let full = [b, h, l, s];
    let data = |shape: &[usize], seed: u64| Tensor::randn(shape, seed).unwrap();
    let array = |t: &Tensor| Array {
        shape: t.shape().to_vec(),
        data: f64s(t),
    };
    // the element of a mask of `shape` that full-shape element `flat` reads (NumPy's rule)
    let source = |flat: usize, shape: &[usize]| -> usize {
        let (mut rem, mut idx) = (flat, [0usize; 4]);
        for ax in (0..4).rev() {
            idx[ax] = rem % full[ax];
            rem /= full[ax];
        }
        let lead = full.len() - shape.len();
        shape.iter().enumerate().fold(0, |acc, (ax, &n)| {
            acc * n + if n == 1 { 0 } else { idx[lead + ax] }
        })
    };
    let cells = full.iter().product::<usize>();
    let (q, k, v) = (
        data(&[b, h, l, d], 1),
        data(&[b, h, s, d], 2),
        data(&[b, h, s, d], 3),
    );
    for (kind, shape) in [
        (AttentionMask::Boolean, vec![b, 1, 1, s]),
        (AttentionMask::Boolean, vec![h, l, s]),
        (AttentionMask::AdditiveBias, vec![b, 1, l, s]),
        (AttentionMask::AdditiveBias, vec![1, s]),
    ] {
        let raw = data(&shape, 4);
        let m = if kind == AttentionMask::Boolean {
            Tensor::from_vec(
                raw.to_vec()
                    .iter()
                    .map(|&x| (x > -0.3) as u8 as f32)
                    .collect(),
                &shape,
            )
            .unwrap()
        } else {
            raw.requires_grad()
        };
        let (qg, kg, vg) = (
            q.clone().requires_grad(),
            k.clone().requires_grad(),
            v.clone().requires_grad(),
        );
        let y = qg
            .scaled_dot_product_attention(&kg, &vg, Some((&m, kind)), false, None)
            .unwrap();
        let gy = data(y.shape(), 5);
        let grads = y.mul(&gy).unwrap().sum_all().unwrap().backward().unwrap();
        // the spec with the mask expanded by hand
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: false,
            mask: kind,
        };
        let mfull = Array {
            shape: full.to_vec(),
            data: {
                let mv = f64s(&m);
                (0..cells).map(|f| mv[source(f, &shape)]).collect()
            },
        };
        let ins = [array(&q), array(&k), array(&v), mfull];
        let refs: Vec<&Array<f64>> = ins.iter().collect();
        let want = spec::forward(&op, &refs).unwrap();
        let gwant = spec::vjp(&op, &refs, &want, &array(&gy)).unwrap();
        let close = |got: &[f64], want: &[f64], what: &str| {
            let scale = 1.0 + want.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let err = got
                .iter()
                .zip(want)
                .fold(0.0f64, |a, (g, w)| a.max((g - w).abs()));
            assert!(err <= 1e-5 * scale, "{what}, mask {shape:?}: error {err:e}");
        };
        close(&f64s(&y), &want.data, "values");
        for (t, g, what) in [
            (&qg, &gwant[0], "dq"),
            (&kg, &gwant[1], "dk"),
            (&vg, &gwant[2], "dv"),
        ] {
            close(
                &f64s(grads.get(t).unwrap()),
                &g.as_ref().unwrap().data,
                what,
            );
        }
        if kind == AttentionMask::AdditiveBias {
            // the full gradient summed onto the mask's own elements
            let gm = gwant[3].as_ref().unwrap();
            let n: usize = shape.iter().product();
            let mut want = vec![0.0; n];
            for (flat, g) in gm.data.iter().enumerate() {
                want[source(flat, &shape)] += g;
            }
            close(&f64s(grads.get(&m).unwrap()), &want, "dmask");
        }
    }
}
