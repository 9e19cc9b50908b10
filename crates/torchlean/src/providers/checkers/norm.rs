//! The recompute check of `layer_norm` and `rms_norm` (over the last axis), eight rows at a
//! time.
//!
//! The piece-wise check (`pieces.rs`) evaluates the spec at f64 through its generic array
//! code: per block of rows, f64 copies of the operands, then one row after another with
//! dependent sums. Under `strict_native_cpu` that was a tenth of a transformer step. Rows of
//! a norm are independent, so this module runs **eight rows side by side**, row `r0 + l` in
//! lane `l` of every vector, and each lane performs its row's arithmetic exactly as the spec
//! writes it (`spec/norm.rs`: the statistics by `spec::sum::sum`'s cascade, then the same
//! operations on each element in the same order). The reference values are therefore the
//! spec's f64 values bit for bit (tested below), compared under the same bound
//! `TOL·(1 + max finite |spec|)` by the same [`Tally`].
//!
//! One exception, shared with `pieces.rs`: the affine parameters' gradients sum a term of
//! every row; the spec cascades those sums over all rows, this check adds each column's
//! terms at f64 in eight lanes over a piece of rows, then the lanes, then the pieces in order
//! — an f64 reordering, some 1e-16 relative, far below the bound.
//!
//! Blocks of rows run as the piece-wise check's pieces (`pieces::over_pieces`), as built: not
//! through `crate::wide`, because the lanes' strided loads and stores (a row's elements are a
//! column of the lane buffers) measured 1.6× slower compiled for AVX-512 (gathers and
//! scatters) on this project's VM.
//!
//! An acceptance is final. Anything else — an operand that is not dense, a parameter of
//! another shape, a tally that does not accept — answers `None`: the piece-wise and
//! whole-call checks then decide, name the element, and add the cancellation allowance for
//! rows whose mean is large against their spread.

use super::pieces::{over_pieces, Tally};
use super::recompute::dense_slice as dense;
use crate::backend::{Call, Operand};
use crate::graph::Op;
use crate::spec::sum::sum_with;

/// Rows per vector (f64 lanes of a 512-bit register).
const L: usize = 8;

type Lanes = [f64; L];

#[inline(always)]
fn zip(a: Lanes, b: Lanes, f: impl Fn(f64, f64) -> f64) -> Lanes {
    std::array::from_fn(|l| f(a[l], b[l]))
}

/// `spec::sum::sum` of the `n` terms `term(0..n)` in each lane: `spec::sum::sum_with`, the
/// same operations in the same order, lane by lane.
#[inline(always)]
fn cascade(n: usize, term: impl Fn(usize) -> Lanes) -> Lanes {
    sum_with((0..n).map(term), [0.0; L], |a, b| zip(a, b, |x, y| x + y))
}

/// A norm call's dense operands.
struct Norm<'a> {
    x: &'a [f32],
    gamma: &'a [f32],
    beta: Option<&'a [f32]>,
    /// The row length (the last axis).
    d: usize,
    rms: bool,
    eps: f64,
}

impl<'a> Norm<'a> {
    fn of(op: &Op, call: &Call<'a>) -> Option<Norm<'a>> {
        // the spec's arity: x, γ, β for layer norm; x, γ for RMS norm
        let (rms, eps, arity) = match *op {
            Op::LayerNorm { eps } => (false, eps, 3),
            Op::RmsNorm { eps } => (true, eps, 2),
            _ => return None,
        };
        if call.inputs.len() != arity {
            return None;
        }
        let x = call.inputs.first()?;
        let d = *x.shape.last()?;
        let param = |o: &Operand<'a>| (o.shape == [d]).then(|| dense(o)).flatten();
        let beta = match call.inputs.get(2) {
            Some(b) => Some(param(b)?),
            None => None,
        };
        let norm = Norm {
            x: dense(x)?,
            gamma: param(call.inputs.get(1)?)?,
            beta,
            d,
            rms,
            eps: eps as f64,
        };
        (d > 0 && call.output.shape == x.shape).then_some(norm)
    }

    fn rows(&self) -> usize {
        self.x.len() / self.d
    }

    /// Rows `r0..r0 + m` (m ≤ L) of `v` at f64 into `c`, by columns: element j of row r0 + l
    /// in lane l of entry j (lanes past m hold zeros, and their results are not read).
    #[inline(always)]
    fn columns(&self, v: &[f32], (r0, m): (usize, usize), c: &mut Vec<Lanes>) {
        let d = self.d;
        c.resize(d, [0.0; L]);
        if m < L {
            c.fill([0.0; L]);
        }
        for l in 0..m {
            for (j, &e) in v[(r0 + l) * d..(r0 + l + 1) * d].iter().enumerate() {
                c[j][l] = e as f64;
            }
        }
    }

    /// Each lane's (mean, 1/std): `spec::norm::stats_of`.
    #[inline(always)]
    fn stats(&self, x: &[Lanes]) -> (Lanes, Lanes) {
        let n = self.d as f64;
        // the spec's mean relative to the first value (`spec::norm::shifted_mean`); d > 0
        let mu = if self.rms {
            [0.0; L]
        } else {
            let s = cascade(self.d, |j| zip(x[j], x[0], |v, x0| v - x0));
            zip(x[0], s, |x0, s| x0 + s / n)
        };
        let var = cascade(self.d, |j| zip(x[j], mu, |v, m| (v - m) * (v - m))).map(|s| s / n);
        (mu, var.map(|v| 1.0 / (v + self.eps).sqrt()))
    }

    /// The spec's output rows `r0..r0 + m`, row-major: `forward_rows`' arithmetic.
    #[inline(always)]
    fn forward_rows<'s>(&self, (r0, m): (usize, usize), s: &'s mut Scratch) -> &'s [f64] {
        let d = self.d;
        self.columns(self.x, (r0, m), &mut s.x);
        let (x, want) = (&s.x[..d], &mut s.want);
        let (mu, rstd) = self.stats(x);
        want.resize(m * d, 0.0);
        for (j, xj) in x.iter().enumerate() {
            let (g, b) = (self.gamma[j] as f64, self.beta.map_or(0.0, |b| b[j] as f64));
            for l in 0..m {
                let xhat = (xj[l] - mu[l]) * rstd[l];
                want[l * d + j] = xhat * g + b;
            }
        }
        &want[..m * d]
    }

    /// The spec's input gradient for rows `r0..r0 + m` (row-major: `vjp_rows`' arithmetic),
    /// and these rows' terms of the parameters' gradients added into `gg`, `gb` (per column,
    /// row `r0 + l` into lane `l`: [`Scratch::param_sums`] adds the lanes).
    #[inline(always)]
    fn vjp_rows<'s>(&self, gy: &[f32], (r0, m): (usize, usize), s: &'s mut Scratch) -> &'s [f64] {
        let d = self.d;
        let n = d as f64;
        self.columns(self.x, (r0, m), &mut s.x);
        self.columns(gy, (r0, m), &mut s.g);
        let Scratch {
            x,
            g,
            xhat,
            gxhat,
            want,
            gg,
            gb,
        } = s;
        // slices and iterators from here: no bounds checks or reloads through the `Vec`s
        let (x, g) = (&x[..d], &g[..d]);
        let (mu, rstd) = self.stats(x);
        for v in [&mut *xhat, &mut *gxhat, &mut *gg, &mut *gb] {
            v.resize(d, [0.0; L]);
        }
        let pairs = xhat.iter_mut().zip(gxhat.iter_mut());
        for ((xh, gxh), ((xj, gj), &w)) in pairs.zip(x.iter().zip(g).zip(self.gamma)) {
            *xh = std::array::from_fn(|l| (xj[l] - mu[l]) * rstd[l]);
            *gxh = gj.map(|v| v * w as f64);
        }
        let (xhat, gxhat) = (&xhat[..d], &gxhat[..d]);
        let mean_g = if self.rms {
            [0.0; L]
        } else {
            cascade(d, |j| gxhat[j]).map(|s| s / n)
        };
        let mean_gx = cascade(d, |j| zip(gxhat[j], xhat[j], |a, b| a * b)).map(|s| s / n);
        want.resize(m * d, 0.0);
        for (l, row) in want[..m * d].chunks_exact_mut(d).enumerate() {
            for ((o, gxh), xh) in row.iter_mut().zip(gxhat).zip(xhat) {
                *o = rstd[l] * (gxh[l] - mean_g[l] - xh[l] * mean_gx[l]);
            }
        }
        // lanes past m add nothing (their x̂ may be NaN: a zero row with ε = 0)
        let sums = gg.iter_mut().zip(gb.iter_mut());
        for ((ggj, gbj), (gj, xh)) in sums.zip(g.iter().zip(xhat)) {
            for l in 0..L {
                let keep = l < m;
                ggj[l] += if keep { gj[l] * xh[l] } else { 0.0 };
                gbj[l] += if keep { gj[l] } else { 0.0 };
            }
        }
        &want[..m * d]
    }
}

/// A task's buffers, reused from one group of rows to the next.
#[derive(Default)]
struct Scratch {
    x: Vec<Lanes>,
    g: Vec<Lanes>,
    xhat: Vec<Lanes>,
    gxhat: Vec<Lanes>,
    want: Vec<f64>,
    /// The parameters' gradient terms summed per column and lane over the task's rows.
    gg: Vec<Lanes>,
    gb: Vec<Lanes>,
}

impl Scratch {
    /// The parameters' gradients over the task's rows: each column's lanes added in order.
    fn param_sums(&self) -> (Vec<f64>, Vec<f64>) {
        let total = |v: &[Lanes]| v.iter().map(|c| c.iter().sum()).collect();
        (total(&self.gg), total(&self.gb))
    }
}

/// The forward check; `None`: not this op, or not accepted here (module doc).
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    let norm = Norm::of(op, call)?;
    let y = dense(&call.output)?;
    if y.len() != norm.x.len() {
        return None;
    }
    let d = norm.d;
    let tallies = over_pieces(norm.rows(), d, |lo, hi| {
        let (mut t, mut s) = (Tally::default(), Scratch::default());
        for g0 in (lo..hi).step_by(L) {
            let m = L.min(hi - g0);
            t.feed(&y[g0 * d..(g0 + m) * d], norm.forward_rows((g0, m), &mut s));
        }
        Ok(t)
    })
    .ok()?;
    let mut total = Tally::default();
    tallies.iter().for_each(|t| total.merge(t));
    total.accepts().then_some(Ok(()))
}

/// The VJP check; `None`: not this op, or not accepted here (module doc).
pub(super) fn vjp(op: &Op, call: &Call) -> Option<Result<(), String>> {
    let norm = Norm::of(op, call)?;
    let gy = dense(call.cotangent.as_ref()?)?;
    if gy.len() != norm.x.len() || call.grads.len() != call.inputs.len() {
        return None;
    }
    // each gradient dense and of its input's shape; a missing one only where none was needed
    let mut got: Vec<Option<&[f32]>> = Vec::with_capacity(call.grads.len());
    for (i, (g, x)) in call.grads.iter().zip(call.inputs).enumerate() {
        match g {
            Some(g) if g.shape == x.shape => got.push(Some(dense(g)?)),
            None if call.needs.get(i) != Some(&true) => got.push(None),
            _ => return None,
        }
    }
    let d = norm.d;
    let parts = over_pieces(norm.rows(), d, |lo, hi| {
        let (mut t, mut s) = (Tally::default(), Scratch::default());
        for g0 in (lo..hi).step_by(L) {
            let m = L.min(hi - g0);
            let want = norm.vjp_rows(gy, (g0, m), &mut s);
            if let Some(gx) = got[0] {
                t.feed(&gx[g0 * d..(g0 + m) * d], want);
            }
        }
        let (gg, gb) = s.param_sums();
        Ok((t, gg, gb))
    })
    .ok()?;
    let mut tallies = [Tally::default(); 3];
    let (mut gg, mut gb) = (vec![0.0f64; d], vec![0.0f64; d]);
    for (t, pg, pb) in &parts {
        tallies[0].merge(t);
        gg.iter_mut().zip(pg).for_each(|(a, v)| *a += v);
        gb.iter_mut().zip(pb).for_each(|(a, v)| *a += v);
    }
    for (i, want) in [(1, &gg), (2, &gb)] {
        if let Some(Some(g)) = got.get(i) {
            tallies[i].feed(g, want);
        }
    }
    tallies.iter().all(Tally::accepts).then_some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Call, Operand};
    use crate::spec::{self, splitmix64, Array};

    fn draws(n: usize, seed: u64, spread: f64, offset: f64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let u = (splitmix64(seed ^ (i as u64) << 8) >> 11) as f64 / (1u64 << 53) as f64;
                (offset + spread * (u - 0.5)) as f32
            })
            .collect()
    }

    fn operand<'a>(data: &'a [f32], shape: &'a [usize]) -> Operand<'a> {
        Operand {
            storage: data,
            offset: 0,
            shape,
            strides: None,
            device: crate::backend::Device::Cpu,
        }
    }

    fn array(data: &[f32], shape: &[usize]) -> Array<f64> {
        Array {
            shape: shape.to_vec(),
            data: data.iter().map(|&v| v as f64).collect(),
        }
    }

    /// The lanes' values are the spec's at f64 bit for bit, forward and input gradient, over
    /// row lengths below, at and across the cascade's block, row counts that leave partial
    /// groups of eight, both norms (layer norm with β, RMS norm without), and rows whose mean
    /// is far from 0.
    #[test]
    fn lanes_compute_the_specs_values_bit_for_bit() {
        for (case, &(rows, d)) in [(1, 1), (3, 7), (9, 32), (17, 33), (8, 100), (13, 257)]
            .iter()
            .enumerate()
        {
            for (op, with_beta) in [
                (Op::LayerNorm { eps: 1e-5 }, true),
                (Op::RmsNorm { eps: 1e-6 }, false),
            ] {
                let shape = [rows, d];
                let x = draws(rows * d, case as u64, 6.0, 40.0 * (case % 2) as f64);
                let (gamma, beta) = (draws(d, 91, 2.0, 1.0), draws(d, 92, 1.0, 0.0));
                let gy = draws(rows * d, 93, 2.0, 0.0);
                let pshape = [d];
                let mut inputs = vec![operand(&x, &shape), operand(&gamma, &pshape)];
                if with_beta {
                    inputs.push(operand(&beta, &pshape));
                }
                let xs: Vec<Array<f64>> =
                    inputs.iter().map(|o| array(o.storage, o.shape)).collect();
                let refs: Vec<&Array<f64>> = xs.iter().collect();
                let want_y = spec::forward(&op, &refs).unwrap();
                let want_g = spec::vjp(&op, &refs, &want_y, &array(&gy, &shape)).unwrap();
                let y32: Vec<f32> = want_y.data.iter().map(|&v| v as f32).collect();
                let call = Call {
                    inputs: &inputs,
                    output: operand(&y32, &shape),
                    cotangent: None,
                    needs: &[],
                    grads: &[],
                    seed: 0,
                };
                let norm = Norm::of(&op, &call).expect("a dense norm call");
                let (mut s1, mut s2) = (Scratch::default(), Scratch::default());
                for g0 in (0..rows).step_by(L) {
                    let m = L.min(rows - g0);
                    let y = norm.forward_rows((g0, m), &mut s1);
                    let gx = norm.vjp_rows(&gy, (g0, m), &mut s2);
                    let span = g0 * d..(g0 + m) * d;
                    let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(y),
                        bits(&want_y.data[span.clone()]),
                        "{op:?} {shape:?}"
                    );
                    let gx_spec = want_g[0].as_ref().unwrap();
                    assert_eq!(bits(gx), bits(&gx_spec.data[span]), "{op:?} {shape:?}");
                }
                // the parameters' gradients: the same sums in another order
                let (gg, _) = s2.param_sums();
                let gg_spec = &want_g[1].as_ref().unwrap().data;
                for (a, b) in gg.iter().zip(gg_spec) {
                    assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
                }
            }
        }
    }

    /// A result within f32 rounding of the spec is accepted, forward and VJP; one element
    /// off by more than the bound is not (the caller's whole-call check then decides).
    #[test]
    fn correct_calls_are_accepted_and_a_wrong_element_is_not() {
        let (rows, d) = (300, 48);
        let shape = [rows, d];
        let pshape = [d];
        let x = draws(rows * d, 5, 4.0, 0.5);
        let (gamma, beta) = (draws(d, 6, 2.0, 1.0), draws(d, 7, 1.0, 0.0));
        let gy = draws(rows * d, 8, 2.0, 0.0);
        let op = Op::LayerNorm { eps: 1e-5 };
        let inputs = [
            operand(&x, &shape),
            operand(&gamma, &pshape),
            operand(&beta, &pshape),
        ];
        let xs: Vec<Array<f64>> = inputs.iter().map(|o| array(o.storage, o.shape)).collect();
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want_y = spec::forward(&op, &refs).unwrap();
        let grads = spec::vjp(&op, &refs, &want_y, &array(&gy, &shape)).unwrap();
        let f32s = |a: &Array<f64>| a.data.iter().map(|&v| v as f32).collect::<Vec<_>>();
        let mut y = f32s(&want_y);
        let mut g: Vec<Vec<f32>> = grads.iter().map(|a| f32s(a.as_ref().unwrap())).collect();
        let check = |y: &[f32], g: &[Vec<f32>]| {
            let fwd = Call {
                inputs: &inputs,
                output: operand(y, &shape),
                cotangent: None,
                needs: &[],
                grads: &[],
                seed: 0,
            };
            let accepted_forward = forward(&op, &fwd).is_some();
            let grad_ops = [
                Some(operand(&g[0], &shape)),
                Some(operand(&g[1], &pshape)),
                Some(operand(&g[2], &pshape)),
            ];
            let bwd = Call {
                cotangent: Some(operand(&gy, &shape)),
                needs: &[true, true, true],
                grads: &grad_ops,
                ..fwd
            };
            (accepted_forward, vjp(&op, &bwd).is_some())
        };
        assert_eq!(check(&y, &g), (true, true));
        y[4321] += 0.01;
        assert_eq!(check(&y, &g), (false, true));
        y[4321] -= 0.01;
        for (i, at) in [(0, 777), (1, 5), (2, 11)] {
            g[i][at] += 0.05;
            assert_eq!(check(&y, &g), (true, false), "gradient {i}");
            g[i][at] -= 0.05;
        }
    }
}
