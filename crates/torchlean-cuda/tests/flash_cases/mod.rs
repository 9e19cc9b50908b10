//! Random flash-attention calls and the comparison with the spec, shared by the GPU test
//! (`gpu_only_conformance.rs`) and the CPU emulation of the same kernels (`emulated_flash.rs`).

use super::common::{draw, Gen};
use torchlean::spec::Array;

/// A random attention call for the flash kernels: leading dims, L and S crossing the 64-row
/// tiles, d and dv crossing the 64-column chunks, every mask kind (shared or per batch),
/// causal or not, the default or an explicit scale; now and then a fully blocked row, a row
/// whose allowed scores are all −inf, or a NaN or ±inf in q, k or v.
pub fn flash_case(seed: u64, small: bool) -> (torchlean::graph::Op, Vec<Array<f64>>) {
    use torchlean::graph::{AttentionMask, Op};
    let mut n = seed;
    let mut below = |k: usize| -> usize {
        n = n.wrapping_add(1);
        (torchlean::spec::splitmix64(n) % k as u64) as usize
    };
    // `small`: at most two batch matrices and 140 rows or keys (the emulated kernels run one
    // OS thread per CUDA thread)
    let (nb, nl) = if small { (2, 140) } else { (3, 200) };
    let lead: Vec<usize> = (0..below(3)).map(|_| 1 + below(nb)).collect();
    let lead = if small && lead.iter().product::<usize>() > 2 {
        vec![2]
    } else {
        lead
    };
    let (l, s) = match below(4) {
        0 | 1 => (1 + below(nl), 1 + below(nl)),
        2 => (1 + below(9), 1 + below(9)),
        _ => (60 + below(80), 60 + below(80)),
    };
    // one chunk, exactly one, just over one, three
    const DIMS: [usize; 7] = [1, 7, 16, 32, 64, 65, 133];
    let (d, dv) = (DIMS[below(7)], DIMS[below(7)]);
    let mask = match below(3) {
        0 => AttentionMask::None,
        1 => AttentionMask::Boolean,
        _ => AttentionMask::AdditiveBias,
    };
    let op = Op::ScaledDotProductAttention {
        scale: if below(3) == 0 { Some(0.37) } else { None },
        causal: below(2) == 0,
        mask,
    };
    let with = |last: [usize; 2]| -> Vec<usize> {
        let mut v = lead.clone();
        v.extend(last);
        v
    };
    let seed2 = seed.wrapping_mul(7919);
    let mut xs = vec![
        draw(&with([l, d]), Gen::Normal, seed2),
        draw(&with([s, d]), Gen::Normal, seed2 + 1),
        draw(&with([s, dv]), Gen::Normal, seed2 + 2),
    ];
    if mask != AttentionMask::None {
        let shape = if below(2) == 0 {
            vec![l, s]
        } else {
            with([l, s])
        };
        let mut m = draw(&shape, Gen::Normal, seed2 + 3);
        if mask == AttentionMask::Boolean {
            // random entries, or a structure whose blocked entries fill whole 64 × 64 tiles
            // (which the kernels skip when every value is finite): a causal pattern given as
            // a mask, blocks along the diagonal, key padding (a length per batch matrix)
            let (structure, block, pad) = (below(4), 1 + below(80), below(s + 1));
            for (p, x) in m.data.iter_mut().enumerate() {
                let (mat, i, j) = (p / (l * s), (p / s) % l, p % s);
                let allowed = match structure {
                    0 => j <= i,
                    1 => i / block == j / block,
                    2 => j < (pad + 37 * mat) % (s + 1),
                    _ => below(4) != 0,
                };
                *x = if allowed { 1.0 } else { 0.0 };
            }
        }
        if below(3) == 0 {
            let row = below(l);
            let rows = m.data.len() / s;
            for rr in (row..rows).step_by(l) {
                let fill = if mask == AttentionMask::Boolean {
                    0.0
                } else {
                    f64::NEG_INFINITY
                };
                m.data[rr * s..(rr + 1) * s]
                    .iter_mut()
                    .for_each(|x| *x = fill);
            }
        }
        xs.push(m);
    }
    if below(4) == 0 {
        let which = below(3);
        let at = below(xs[which].data.len());
        xs[which].data[at] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][below(3)];
    }
    (op, xs)
}

/// How many fixed calls `fixed_case` has.
pub const FIXED_CASES: usize = 8;

/// Fixed calls that random shapes reach only now and then. 0–3: unmasked [2, 130, d] queries
/// against [2, 140, d] keys (d, dv <= 64: the key kernel's one-chunk path over whole 64 × 64
/// tiles without per-entry tests), causal for odd `c`. 4: a boolean mask that blocks every key
/// of query row 5, whose q holds a NaN: the row gives zeros and takes no part in any gradient
/// (its NaN must not reach dK through 0 · NaN). 5: causal, every value finite but one of v
/// too large for the split-TF32 kernels (3·10^7 ≥ 2^24): they must decline the call while the
/// causal tiles are still skipped. 6, 7: an additive mask whose rows 3, 5 and 8 are one huge
/// value (-1e9, f32::MIN, -3e38; those query rows zero, so every score of the row is that
/// value) over [2, 70, d] queries and [2, 140, d] keys, d = 32 (the split-TF32 forward, whose
/// base-2 scores overflowed to -inf: NaN rows) and d = 65 (two chunks): every key weighs 1/S,
/// forward and VJP (a log-sum-exp VJP gave them weight 1).
pub fn fixed_case(c: usize) -> (torchlean::graph::Op, Vec<Array<f64>>) {
    use torchlean::graph::{AttentionMask, Op};
    if c < 4 {
        let (d, dv) = if c % 2 == 0 { (32, 64) } else { (64, 16) };
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: c % 2 == 1,
            mask: AttentionMask::None,
        };
        let xs = [[2, 130, d], [2, 140, d], [2, 140, dv]]
            .iter()
            .enumerate()
            .map(|(i, shape)| draw(shape, Gen::Normal, 90_000 + 10 * c as u64 + i as u64))
            .collect();
        return (op, xs);
    }
    if c == 6 || c == 7 {
        let (l, s, d) = (70usize, 140usize, if c == 6 { 32 } else { 65 });
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: false,
            mask: AttentionMask::AdditiveBias,
        };
        let seed = 93_000 + 10 * c as u64;
        let mut q = draw(&[2, l, d], Gen::Normal, seed);
        let k = draw(&[2, s, d], Gen::Normal, seed + 1);
        let v = draw(&[2, s, d], Gen::Normal, seed + 2);
        let mut bias = draw(&[l, s], Gen::Normal, seed + 3);
        for (row, value) in [(3usize, -1e9), (5, f32::MIN as f64), (8, -3e38)] {
            bias.data[row * s..(row + 1) * s].fill(value);
            for b in 0..2 {
                q.data[(b * l + row) * d..(b * l + row + 1) * d].fill(0.0);
            }
        }
        return (op, vec![q, k, v, bias]);
    }
    if c == 5 {
        let op = Op::ScaledDotProductAttention {
            scale: None,
            causal: true,
            mask: AttentionMask::None,
        };
        let mut xs: Vec<Array<f64>> = (0..3)
            .map(|i| draw(&[1, 70, 32], Gen::Normal, 92_000 + i))
            .collect();
        xs[2].data[7 * 32 + 2] = 3e7;
        return (op, xs);
    }
    let (l, s, d) = (70, 80, 16);
    let op = Op::ScaledDotProductAttention {
        scale: None,
        causal: false,
        mask: AttentionMask::Boolean,
    };
    let mut q = draw(&[1, l, d], Gen::Normal, 91_000);
    q.data[5 * d + 3] = f64::NAN;
    let k = draw(&[1, s, d], Gen::Normal, 91_001);
    let v = draw(&[1, s, d], Gen::Normal, 91_002);
    let mut m = Array::from_vec(vec![l, s], vec![1.0; l * s]).expect("shape and length agree");
    m.data[5 * s..6 * s].iter_mut().for_each(|x| *x = 0.0);
    (op, vec![q, k, v, m])
}

/// `got` within `tol`·(1 + max finite |want|) of `want`, NaN and ±inf exactly where `want`
/// has them (an error message otherwise).
pub fn flash_compare(got: &[f64], want: &[f64], tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{} values, spec {}", got.len(), want.len()));
    }
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !(g.is_finite() && w.is_finite()) {
            if !((w.is_nan() && g.is_nan()) || w == g) {
                return Err(format!("element {i}: {g}, spec {w}"));
            }
        } else {
            let e = (g - w).abs() / scale;
            if e > tol {
                return Err(format!("element {i}: {g}, spec {w} (error {e:e})"));
            }
            worst = worst.max(e);
        }
    }
    Ok(worst)
}

/// An [l, s] boolean mask (1 allowed, 0 blocked) that blocks whole 64 × 64 tiles — query
/// tile qt, key tile kt when (qt + 2·kt) % 3 == 1 —, a quarter of the other entries at random
/// and query row 70 entirely: calls where the kernels skip tiles by their tile words.
pub fn tile_blocked_mask(l: usize, s: usize, seed: u64) -> Array<f64> {
    let mut m = draw(&[l, s], Gen::Normal, seed);
    for (e, x) in m.data.iter_mut().enumerate() {
        let (r, c) = (e / s, e % s);
        let tile_blocked = (r / 64 + 2 * (c / 64)) % 3 == 1;
        *x = if !tile_blocked && r != 70 && *x > -0.67 {
            1.0
        } else {
            0.0
        };
    }
    m
}
