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

/// One random attention call at f64 (inputs, op) over sizes that cross the native kernel's
/// tiles (64 queries, 512 keys), every mask kind, causal or not; now and then a fully blocked
/// row (boolean), a row whose allowed scores are all −inf (additive: NaN), or a NaN input.
fn kernel_case(r: &mut Draws) -> (Op, Vec<Array<f64>>) {
    let lead: Vec<usize> = (0..r.below(3)).map(|_| 1 + r.below(3)).collect();
    // small; crossing the query and key tiles; or more keys than the VJP's one-stripe
    // bound (2048), so that its two-pass path runs
    let (l, s) = match r.below(6) {
        0 | 1 => (1 + r.below(150), 1 + r.below(300)),
        2 => (1 + r.below(70), 2049 + r.below(300)),
        _ => (1 + r.below(9), 1 + r.below(9)),
    };
    // head dimensions mostly below a register lane (8), now and then wide enough for the
    // small-key forward's side-by-side blocks (4 × 8 columns) and their remainders
    let mut dim = || {
        if r.below(4) == 0 {
            [16, 32, 33, 64, 70][r.below(5)]
        } else {
            1 + r.below(9)
        }
    };
    let (d, dv) = (dim(), dim());
    let mask = match r.below(3) {
        0 => AttentionMask::None,
        1 => AttentionMask::Boolean,
        _ => AttentionMask::AdditiveBias,
    };
    let op = Op::ScaledDotProductAttention {
        scale: if r.below(3) == 0 { Some(0.37) } else { None },
        causal: r.below(2) == 0,
        mask,
    };
    let with = |last: [usize; 2]| -> Vec<usize> {
        let mut v = lead.clone();
        v.extend(last);
        v
    };
    let mut xs = vec![
        r.array(&with([l, d])),
        r.array(&with([s, d])),
        r.array(&with([s, dv])),
    ];
    if mask != AttentionMask::None {
        let shape = if r.below(2) == 0 {
            vec![l, s]
        } else {
            with([l, s])
        };
        let mut m = r.array(&shape);
        let row = r.below(l);
        let rows = m.data.len() / s;
        let special = r.below(3) == 0;
        if mask == AttentionMask::Boolean {
            for x in &mut m.data {
                *x = if r.below(4) == 0 { 0.0 } else { 1.0 };
            }
        }
        if special {
            for rr in (row..rows).step_by(l) {
                m.data[rr * s..(rr + 1) * s].iter_mut().for_each(|x| {
                    *x = if mask == AttentionMask::Boolean {
                        0.0
                    } else {
                        f64::NEG_INFINITY
                    }
                });
            }
        }
        xs.push(m);
    }
    // now and then a NaN in q, k or v
    if r.below(4) == 0 {
        let which = r.below(3);
        let at = r.below(xs[which].data.len());
        xs[which].data[at] = f64::NAN;
    }
    (op, xs)
}

fn tensor(a: &Array<f64>) -> torchlean::Tensor {
    torchlean::Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape).unwrap()
}

fn widen(t: &torchlean::Tensor) -> Vec<f64> {
    t.to_vec().into_iter().map(|v| v as f64).collect()
}

/// `got` within `tol`·(1 + max finite |want|) of `want`, NaN and ±inf exactly where `want` has
/// them; the largest relative error otherwise (∞ on a class mismatch).
fn error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (&g, &w)| {
        if w.is_nan() || g.is_nan() || w.is_infinite() || g.is_infinite() {
            if (w.is_nan() && g.is_nan()) || w == g {
                m
            } else {
                f64::INFINITY
            }
        } else {
            m.max((g - w).abs() / scale)
        }
    })
}

/// The flash kernel's forward and VJP on `xs`, and another kernel's (or the spec's, at f64).
type Outputs = (Vec<f64>, Vec<Option<Vec<f64>>>);

fn run_kernel(
    forward: torchlean::runtime::kernel::ForwardKernel,
    vjp: torchlean::runtime::kernel::VjpKernel,
    op: &Op,
    xs: &[Array<f64>],
    gy: &Array<f64>,
) -> Outputs {
    let ts: Vec<torchlean::Tensor> = xs.iter().map(tensor).collect();
    let refs: Vec<&torchlean::Tensor> = ts.iter().collect();
    let y = forward(op, &refs).expect("the kernel accepts the call");
    let needs = vec![true; ts.len()];
    let grads = vjp(op, &refs, &y, &tensor(gy), &needs).expect("the VJP kernel");
    (
        widen(&y),
        grads.iter().map(|g| g.as_ref().map(widen)).collect(),
    )
}

/// Runs the native flash kernel's forward and VJP on `xs` (a cotangent drawn from `r`) and
/// asserts both within 2e-4·(1 + max |spec|) of the f64 spec, every gradient present on both
/// sides or neither; returns the worst forward and gradient errors.
fn flash_within_bound_of_the_spec(
    what: &str,
    op: &Op,
    xs: &[Array<f64>],
    r: &mut Draws,
) -> (f64, f64) {
    use torchlean::providers::native_cpu::{flash_forward, flash_vjp};
    let refs: Vec<&Array<f64>> = xs.iter().collect();
    let want = spec::forward(op, &refs).expect("the spec accepts the call");
    let gy = r.array(&want.shape);
    let want_grads = spec::vjp(op, &refs, &want, &gy).expect("the spec VJP");
    let (y, grads) = run_kernel(flash_forward, flash_vjp, op, xs, &gy);
    let forward = error(&y, &want.data);
    assert!(forward <= 2e-4, "{what}: forward error {forward}");
    let mut worst = 0.0f64;
    for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
        match (g, w) {
            (Some(g), Some(w)) => {
                let e = error(g, &w.data);
                assert!(e <= 2e-4, "{what}: gradient {i} error {e}");
                worst = worst.max(e);
            }
            (None, None) => {}
            _ => panic!("{what}: gradient {i} present on one side only"),
        }
    }
    (forward, worst)
}

/// A query row whose every score is one huge finite value — an additive padding mask of
/// -1e9 or `f32::MIN` over the whole row (the query row zero, so q·k adds nothing) — attends
/// every key equally: forward the mean of v, and the VJP's probabilities 1/S. Over S = 100
/// (one stripe) and S = 2100 (the log-sum-exp pass over key tiles, which took exp(x - lse)
/// with lse = max + ln z rounded to max: probabilities 1, gradients S times too large).
#[test]
fn rows_of_one_huge_bias_attend_every_key_equally() {
    let mut r = Draws(8100);
    for s in [100usize, 2100] {
        let (l, d) = (12usize, 8usize);
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: false,
            mask: AttentionMask::AdditiveBias,
        };
        let mut q = r.array(&[2, l, d]);
        let (k, v) = (r.array(&[2, s, d]), r.array(&[2, s, d]));
        let mut bias = Array::from_fn(&[l, s], |_| 0.0);
        for (row, value) in [(3usize, -1e9), (5, f32::MIN as f64), (8, -3e38)] {
            bias.data[row * s..(row + 1) * s].fill(value);
            for b in 0..2 {
                q.data[(b * l + row) * d..(b * l + row + 1) * d].fill(0.0);
            }
        }
        for (i, x) in bias.data.iter_mut().enumerate() {
            if i / s == 1 {
                *x = r.normal();
            }
        }
        let what = format!("S = {s}");
        let xs = [q, k, v, bias];
        flash_within_bound_of_the_spec(&what, &op, &xs, &mut r);
        // the tiled f64 flash spec too (it took its probabilities from m + ln z: at
        // |m| = 3.4e38 ln z is below half an ulp of m even in f64)
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let gy = r.array(&[2, l, d]);
        let y = spec::forward(&op, &refs).expect("spec forward");
        let want = spec::vjp(&op, &refs, &y, &gy).expect("spec vjp");
        let tiles = Tiles {
            queries: 5,
            keys: 64,
        };
        let got = flash::vjp(&op, &refs, &gy, tiles).expect("flash spec vjp");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if let (Some(g), Some(w)) = (g, w) {
                let e = rel_diff(&g.data, &w.data);
                assert!(e < 1e-9, "{what}: the flash spec's gradient {i} is {e} off");
            }
        }
    }
}

#[test]
fn native_flash_kernel_matches_the_spec() {
    let mut r = Draws(3300);
    let (mut worst_forward, mut worst_vjp) = (0.0f64, 0.0f64);
    for case in 0..60 {
        let (op, xs) = kernel_case(&mut r);
        let what = format!("case {case} {op:?} {:?}", xs[0].shape);
        let (f, v) = flash_within_bound_of_the_spec(&what, &op, &xs, &mut r);
        worst_forward = worst_forward.max(f);
        worst_vjp = worst_vjp.max(v);
    }
    eprintln!("flash kernel vs spec: worst forward {worst_forward:e}, worst VJP {worst_vjp:e}");
}

#[test]
fn native_flash_kernel_equals_the_native_sdpa_kernel() {
    use torchlean::providers::native_cpu::{flash_forward, flash_vjp, forward, vjp};
    let mut r = Draws(3301);
    for case in 0..60 {
        let (op, xs) = kernel_case(&mut r);
        let shape_y = {
            let shapes: Vec<&[usize]> = xs.iter().map(|a| a.shape.as_slice()).collect();
            spec::infer_shape(&op, &shapes).expect("shape")
        };
        let gy = r.array(&shape_y);
        let (fy, fg) = run_kernel(flash_forward, flash_vjp, &op, &xs, &gy);
        let (ny, ng) = run_kernel(forward, vjp, &op, &xs, &gy);
        let e = error(&fy, &ny);
        assert!(e <= 1e-5, "case {case} {op:?}: forward differs by {e}");
        for (i, (a, b)) in fg.iter().zip(&ng).enumerate() {
            match (a, b) {
                (Some(a), Some(b)) => {
                    let e = error(a, b);
                    assert!(e <= 1e-4, "case {case} {op:?}: gradient {i} differs by {e}");
                }
                (None, None) => {}
                _ => panic!("case {case}: gradient {i} present in one kernel only"),
            }
        }
    }
}

/// `a` ([..lead, n, w]) as a strided view of a larger buffer, the way attention reads the
/// heads of a projection: the storage holds [n, ..lead, w + 3] (rows of one batch matrix
/// far apart, three extra floats per row), permuted to [..lead, n, w + 3] and sliced to
/// columns 1..=w (a nonzero offset). The view holds `a`'s values and is not contiguous.
fn strided_view(a: &Array<f64>, r: &mut Draws) -> torchlean::Tensor {
    let rank = a.shape.len();
    let (n, w) = (a.shape[rank - 2], a.shape[rank - 1]);
    let lead = &a.shape[..rank - 2];
    let batch: usize = lead.iter().product();
    let padded = w + 3;
    let mut buf = vec![0.0f32; n * batch * padded];
    for (slot, v) in buf.iter_mut().enumerate() {
        *v = r.normal() as f32; // the padding: values the kernel must never read
        let (i, rest) = (slot / (batch * padded), slot % (batch * padded));
        let (b, j) = (rest / padded, rest % padded);
        if (1..=w).contains(&j) {
            *v = a.data[(b * n + i) * w + j - 1] as f32;
        }
    }
    let mut shape = vec![n];
    shape.extend_from_slice(lead);
    shape.push(padded);
    let packed = torchlean::Tensor::from_vec(buf, &shape).unwrap();
    let mut axes: Vec<usize> = (1..rank - 1).collect();
    axes.push(0);
    axes.push(rank - 1);
    let view = packed
        .permute(&axes)
        .and_then(|t| t.slice(rank - 1, 1, w + 1))
        .expect("a permuted slice");
    assert_eq!(view.shape(), a.shape.as_slice());
    view
}

#[test]
fn native_flash_kernel_reads_strided_operands_in_place() {
    use torchlean::backend::BackendProfile;
    use torchlean::providers::native_cpu::{flash_forward, flash_vjp};
    use torchlean::runtime::{self, Session};
    // the views are made by the session's permute and slice (views on the host)
    let before =
        runtime::install(Session::new(BackendProfile::named("checked_cpu").unwrap())).unwrap();
    let mut r = Draws(3302);
    let mut strided_calls = 0;
    for case in 0..40 {
        let (op, xs) = kernel_case(&mut r);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want = spec::forward(&op, &refs).expect("the spec accepts the call");
        let gy = r.array(&want.shape);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).expect("the spec VJP");
        // q, k, v (and a mask or bias of full rank) as strided views
        let ts: Vec<torchlean::Tensor> = xs
            .iter()
            .map(|a| {
                if a.shape.len() >= 2 {
                    strided_view(a, &mut r)
                } else {
                    tensor(a)
                }
            })
            .collect();
        strided_calls += ts.iter().filter(|t| !t.is_contiguous()).count();
        let ts_refs: Vec<&torchlean::Tensor> = ts.iter().collect();
        let y = flash_forward(&op, &ts_refs).expect("the kernel accepts strided inputs");
        let e = error(&widen(&y), &want.data);
        assert!(
            e <= 2e-4,
            "case {case} {op:?}: forward error {e} on strided inputs"
        );
        let needs = vec![true; ts.len()];
        let grads = flash_vjp(&op, &ts_refs, &y, &tensor(&gy), &needs).expect("the VJP");
        for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            match (g, w) {
                (Some(g), Some(w)) => {
                    assert_eq!(g.shape(), w.shape.as_slice(), "case {case}: gradient {i}");
                    let e = error(&widen(g), &w.data);
                    assert!(
                        e <= 2e-4,
                        "case {case} {op:?}: gradient {i} error {e} (strided)"
                    );
                }
                (None, None) => {}
                _ => panic!("case {case}: gradient {i} present on one side only"),
            }
        }
    }
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
    // the views really were strided (else this test would check nothing new)
    assert!(
        strided_calls >= 100,
        "only {strided_calls} strided operands"
    );
}

/// Boolean masks with structure, whose blocked keys fill whole query tiles' key ranges: the
/// kernel visits only each query tile's key span when every value is finite. A causal
/// pattern given as a mask, per-batch key padding (keys from a length on blocked, one batch
/// matrix padded entirely), blocks along the diagonal, and a tile of fully blocked rows —
/// with and without a NaN or an infinity in q, k or v (which turns the skipping off: the
/// spec multiplies a blocked entry's zero weight by the value). Against the f64 spec,
/// forward and every gradient, on both paths of the VJP (one stripe up to 2048 keys, two
/// passes above).
#[test]
fn native_flash_kernel_skips_only_keys_the_mask_blocks_for_a_whole_tile() {
    let mut r = Draws(4400);
    for case in 0..40 {
        let batch = 1 + r.below(3);
        let (l, s) = if case % 8 == 7 {
            (1 + r.below(80), 2049 + r.below(200))
        } else {
            (1 + r.below(200), 1 + r.below(300))
        };
        let (d, dv) = (1 + r.below(9), 1 + r.below(9));
        let kind = case % 4;
        let mut mask = Array::from_fn(&[batch, l, s], |_| 0.0);
        let lengths: Vec<usize> = (0..batch)
            .map(|b| if b == 1 { 0 } else { r.below(s + 1) })
            .collect();
        let block = 1 + r.below(70);
        for (b, &length) in lengths.iter().enumerate() {
            for i in 0..l {
                for j in 0..s {
                    let allowed = match kind {
                        0 => j <= i,
                        1 => j < length,
                        2 => i / block == j / block,
                        // rows 64..128 (a whole query tile) fully blocked, the others a pattern
                        _ => !(64..128).contains(&i) && (i + j) % 3 != 0,
                    };
                    mask.data[(b * l + i) * s + j] = allowed as u8 as f64;
                }
            }
        }
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: r.below(4) == 0,
            mask: AttentionMask::Boolean,
        };
        let mut xs = vec![
            r.array(&[batch, l, d]),
            r.array(&[batch, s, d]),
            r.array(&[batch, s, dv]),
            mask,
        ];
        if case % 3 == 2 {
            let which = r.below(3);
            let at = r.below(xs[which].data.len());
            xs[which].data[at] = if r.below(2) == 0 {
                f64::NAN
            } else {
                f64::INFINITY
            };
        }
        let what = format!("case {case} (mask kind {kind}, L {l}, S {s})");
        flash_within_bound_of_the_spec(&what, &op, &xs, &mut r);
    }
}

/// Head split and merge without copies: q, k and v split off one `[B, L, 3·H·D]` projection
/// as a multi-head layer does (slice, reshape, permute: views). The kernel's output is then
/// stored like the query (head-interleaved), so the merge (permute back, reshape to
/// `[B, L, H·D]`) is a view of it; each gradient is stored like its input, so the split's
/// permute taken back is contiguous. Values and gradients equal the f64 spec; a row-major
/// query still gets a row-major output.
#[test]
fn native_flash_kernel_stores_results_like_its_head_split_inputs() {
    use torchlean::backend::BackendProfile;
    use torchlean::providers::native_cpu::{flash_forward, flash_vjp};
    use torchlean::runtime::{self, Session};
    let before =
        runtime::install(Session::new(BackendProfile::named("checked_cpu").unwrap())).unwrap();
    let mut r = Draws(7301);
    for (case, &(b, l, h, d, causal)) in [
        (2, 70, 3, 8, false),
        (1, 130, 4, 16, true),
        (3, 5, 2, 4, false),
    ]
    .iter()
    .enumerate()
    {
        let e = h * d;
        let packed = tensor(&r.array(&[b, l, 3 * e]));
        let split = |k: usize| {
            packed
                .slice(2, k * e, (k + 1) * e)
                .and_then(|t| t.reshape(&[b as isize, l as isize, h as isize, d as isize]))
                .and_then(|t| t.permute(&[0, 2, 1, 3]))
                .expect("a head split")
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal,
            mask: AttentionMask::None,
        };
        let arrays: Vec<Array<f64>> = [&q, &k, &v]
            .iter()
            .map(|t| Array::from_vec(t.shape().to_vec(), widen(t)).unwrap())
            .collect();
        let refs: Vec<&Array<f64>> = arrays.iter().collect();
        let want = spec::forward(&op, &refs).unwrap();
        let y = flash_forward(&op, &[&q, &k, &v]).unwrap();
        assert!(
            error(&widen(&y), &want.data) <= 2e-4,
            "case {case}: forward"
        );
        let merged = y
            .permute(&[0, 2, 1, 3])
            .and_then(|t| t.reshape(&[b as isize, l as isize, e as isize]))
            .unwrap();
        assert!(
            merged.is_contiguous() && merged.shares_storage_with(&y),
            "case {case}: the merge of the heads is a view of the output"
        );
        let gy = r.array(&want.shape);
        let want_grads = spec::vjp(&op, &refs, &want, &gy).unwrap();
        let grads = flash_vjp(&op, &[&q, &k, &v], &y, &tensor(&gy), &[true; 3]).unwrap();
        for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            let (g, w) = (g.as_ref().unwrap(), w.as_ref().unwrap());
            assert_eq!(g.shape(), w.shape.as_slice());
            assert!(
                error(&widen(g), &w.data) <= 2e-4,
                "case {case}: gradient {i}"
            );
            assert!(
                g.permute(&[0, 2, 1, 3]).unwrap().is_contiguous(),
                "case {case}: gradient {i} is stored like its input ([B, L, H, D])"
            );
        }
        // a row-major query: a row-major output and gradients
        let dense: Vec<torchlean::Tensor> = arrays.iter().map(tensor).collect();
        let y = flash_forward(&op, &[&dense[0], &dense[1], &dense[2]]).unwrap();
        assert!(
            y.is_contiguous(),
            "case {case}: row-major query, row-major output"
        );
        let grads = flash_vjp(
            &op,
            &[&dense[0], &dense[1], &dense[2]],
            &y,
            &tensor(&gy),
            &[true; 3],
        )
        .unwrap();
        assert!(grads.iter().all(|g| g.as_ref().unwrap().is_contiguous()));
    }
    runtime::take().unwrap();
    if let Some(s) = before {
        runtime::install(s).unwrap();
    }
}

/// The VJP of the heads' merge (permute [0, 2, 1, 3]) hands the attention VJP its cotangent
/// as it lies: a dense cotangent gives a gradient that is a view of it (its axes in another
/// order, equal to the permuted values); a cotangent that is not dense (a slice of a larger
/// tensor) gives a row-major copy.
#[test]
fn permute_vjp_of_a_dense_cotangent_is_a_view() {
    use torchlean::providers::native_cpu;
    support_session();
    let op = Op::Permute {
        axes: vec![0, 2, 1, 3],
    };
    let x = torchlean::Tensor::randn(&[2, 3, 5, 4], 1).unwrap();
    let y = native_cpu::forward(&op, &[&x]).unwrap();
    let dense = torchlean::Tensor::randn(&[2, 5, 3, 4], 2).unwrap();
    let wide = torchlean::Tensor::randn(&[2, 5, 3, 6], 3).unwrap();
    let strided = wide.slice(3, 1, 5).unwrap();
    for (what, gy, view) in [("dense", &dense, true), ("a slice", &strided, false)] {
        let g = native_cpu::vjp(&op, &[&x], &y, gy, &[true]).unwrap()[0]
            .clone()
            .unwrap();
        assert_eq!(g.shape(), x.shape());
        assert_eq!(g.shares_storage_with(gy), view, "{what}");
        assert_eq!(g.is_contiguous(), !view, "{what}");
        let back = g.permute(&[0, 2, 1, 3]).unwrap();
        assert_eq!(back.to_vec(), gy.to_vec(), "{what}: the permuted values");
    }
}

fn support_session() {
    use torchlean::backend::BackendProfile;
    use torchlean::runtime::{self, Session};
    // a test thread of its own: nothing else installed here
    let _ = runtime::install(Session::new(BackendProfile::named("checked_cpu").unwrap()));
}
