//! The flash-attention specification (`spec::flash`: tiles and an online softmax) equals the
//! scaled dot-product attention spec, forward and VJP, at f64: over random shapes, every
//! mask kind (boolean with fully blocked rows, additive, per-batch or shared), causal or not,
//! and tile sizes from 1 to larger than the sequence (issue 12, item 1). The comparison is
//! relative to the values' scale, at 1e-12: the two definitions differ only in the order of
//! their sums.

use torchlean::graph::{AttentionMask, Op};
use torchlean::spec::flash::{self, Tiles};
use torchlean::spec::{self, splitmix64, Array};

/// A deterministic stream of draws.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn normal(&mut self) -> f64 {
        // a sum of uniforms: roughly normal, and never infinite
        (0..4)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
            .sum::<f64>()
            * 1.7
    }
    fn array(&mut self, shape: &[usize]) -> Array<f64> {
        Array::from_fn(shape, |_| self.normal())
    }
}

/// Largest |a − b| over the largest |b| (plus one), for equal-length data.
fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = 1.0 + b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn flash_attention_equals_the_sdpa_spec_forward_and_vjp() {
    let mut r = Draws(2026);
    let mut cases = 0;
    let mut fully_blocked_rows = 0;
    for case in 0..400 {
        let lead: Vec<usize> = (0..r.below(3)).map(|_| 1 + r.below(3)).collect();
        let (l, s, d, dv) = (
            1 + r.below(9),
            1 + r.below(9),
            1 + r.below(5),
            1 + r.below(5),
        );
        let mask = match r.below(3) {
            0 => AttentionMask::None,
            1 => AttentionMask::Boolean,
            _ => AttentionMask::AdditiveBias,
        };
        let causal = r.below(2) == 0;
        let scale = if r.below(3) == 0 { Some(0.37) } else { None };
        let op = Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        };
        let with = |last: [usize; 2]| -> Vec<usize> {
            let mut v = lead.clone();
            v.extend(last);
            v
        };
        let (q, k, v) = (
            r.array(&with([l, d])),
            r.array(&with([s, d])),
            r.array(&with([s, dv])),
        );
        let mut xs = vec![q, k, v];
        if mask != AttentionMask::None {
            let shape = if r.below(2) == 0 {
                vec![l, s]
            } else {
                with([l, s])
            };
            let mut m = r.array(&shape);
            if mask == AttentionMask::Boolean {
                for x in &mut m.data {
                    *x = if r.below(4) == 0 { 0.0 } else { 1.0 };
                }
                // block one row entirely now and then
                if r.below(3) == 0 {
                    let row = r.below(l);
                    let rows = m.data.len() / s;
                    for rr in (row..rows).step_by(l) {
                        m.data[rr * s..(rr + 1) * s]
                            .iter_mut()
                            .for_each(|x| *x = 0.0);
                    }
                    fully_blocked_rows += 1;
                }
            }
            xs.push(m);
        }
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&op, &refs).expect("the SDPA spec accepts the call");
        let gy = r.array(&want.shape);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).expect("the SDPA spec VJP");
        for tiles in [
            Tiles {
                queries: 1,
                keys: 1,
            },
            Tiles {
                queries: 2,
                keys: 3,
            },
            Tiles {
                queries: 1 + r.below(l + 1),
                keys: 1 + r.below(s + 1),
            },
            Tiles {
                queries: 64,
                keys: 64,
            },
        ] {
            let (got, _) = flash::forward(&op, &refs, tiles).expect("flash forward");
            assert_eq!(got.shape, want.shape);
            let e = rel_diff(&got.data, &want.data);
            assert!(
                e < 1e-12,
                "case {case} {op:?} {tiles:?}: forward differs by {e:e}"
            );
            let grads = flash::vjp(&op, &refs, &gy, tiles).expect("flash vjp");
            assert_eq!(grads.len(), want_grads.len(), "case {case}");
            for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
                match (g, w) {
                    (Some(g), Some(w)) => {
                        assert_eq!(g.shape, w.shape, "case {case} gradient {i}");
                        let e = rel_diff(&g.data, &w.data);
                        assert!(
                            e < 1e-12,
                            "case {case} {op:?} {tiles:?}: gradient {i} differs by {e:e}"
                        );
                    }
                    (None, None) => {}
                    _ => panic!("case {case}: gradient {i} present in one definition only"),
                }
            }
        }
        cases += 1;
    }
    assert_eq!(cases, 400);
    assert!(fully_blocked_rows > 10, "too few fully blocked rows drawn");
}

/// A fully blocked row gives zeros and passes no gradient, in the flash definition as in the
/// SDPA spec (checked directly, not only through their equality).
#[test]
fn a_fully_blocked_row_gives_zeros_and_no_gradient() {
    let op = Op::ScaledDotProductAttention {
        scale: None,
        causal: false,
        mask: AttentionMask::Boolean,
    };
    let mut r = Draws(7);
    let (q, k, v) = (r.array(&[3, 2]), r.array(&[4, 2]), r.array(&[4, 3]));
    let mut m = Array::from_fn(&[3, 4], |_| 1.0);
    m.data[4..8].iter_mut().for_each(|x| *x = 0.0); // row 1 fully blocked
    let refs = [&q, &k, &v, &m];
    let tiles = Tiles {
        queries: 2,
        keys: 2,
    };
    let (y, lse) = flash::forward(&op, &refs, tiles).expect("flash forward");
    assert!(y.data[3..6].iter().all(|&x| x == 0.0), "{:?}", y.data);
    assert!(lse[1].is_none() && lse[0].is_some() && lse[2].is_some());
    let gy = Array::from_fn(&[3, 3], |_| 1.0);
    let grads = flash::vjp(&op, &refs, &gy, tiles).expect("flash vjp");
    let gq = grads[0].as_ref().expect("a query gradient");
    assert!(gq.data[2..4].iter().all(|&x| x == 0.0), "{:?}", gq.data);
    assert!(grads[3].is_none(), "a boolean mask has no gradient");
    assert!(
        gq.data[..2].iter().any(|&x| x != 0.0),
        "the other rows do pass gradient"
    );
}

/// Another op, shapes the SDPA rule refuses, or a short array are typed errors, not panics.
#[test]
fn flash_attention_refuses_bad_calls_with_typed_errors() {
    let sdpa = Op::ScaledDotProductAttention {
        scale: None,
        causal: false,
        mask: AttentionMask::None,
    };
    let tiles = Tiles {
        queries: 2,
        keys: 2,
    };
    let (q, k, v) = (
        Array::from_fn(&[3, 2], |_| 1.0),
        Array::from_fn(&[4, 2], |_| 1.0),
        Array::from_fn(&[4, 3], |_| 1.0),
    );
    let e = flash::forward(&Op::Relu, &[&q], tiles).unwrap_err();
    assert!(e.to_string().contains("relu"), "{e}");
    let bad_k = Array::from_fn(&[4, 5], |_| 1.0);
    let e = flash::forward(&sdpa, &[&q, &bad_k, &v], tiles).unwrap_err();
    assert!(
        e.to_string().contains("scaled_dot_product_attention"),
        "{e}"
    );
    let short = Array {
        shape: vec![4, 3],
        data: vec![1.0; 5],
    };
    assert!(flash::forward(&sdpa, &[&q, &k, &short], tiles).is_err());
    let wrong_gy = Array::from_fn(&[3, 2], |_| 1.0);
    assert!(flash::vjp(&sdpa, &[&q, &k, &v], &wrong_gy, tiles).is_err());
}
