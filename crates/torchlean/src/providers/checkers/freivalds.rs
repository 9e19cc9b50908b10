//! Freivalds-style product checks for `matmul` and `linear` and their VJP products.
//!
//! For a claimed product C = P·Q (P m×k, Q k×n) the checker draws r ∈ {±1}^n and compares
//! C·r with P·(Q·r) against the rigorous float32 bound of any summation order (Higham,
//! *Accuracy and Stability of Numerical Algorithms*, Thm 3.5): |fl(PQ) − PQ| ≤ γ_k |P||Q|
//! with γ_k = k·u/(1 − k·u), u = 2^-24, hence |(fl(PQ) − PQ)·r| ≤ γ_k A_i with the row
//! allowance A = |P|(|Q|·1), plus an absolute (k+1)·2^-126 for underflow.
//!
//! The check's own arithmetic runs in f32 lanes (eight-wide, no conversions in the inner
//! loops), each lane summing at most [`BLOCK`] products before it is added into f64, so each
//! computed product errs by at most γ_8 times the sum of its terms' magnitudes (Higham Thm
//! 3.5 again, for the blocks; the f64 sums of blocks are covered by a 1e-9 relative slack).
//! Carrying that through the three passes (Q·r and |Q|·1; then P·(Q·r) with Q·r rounded once
//! to f32, and |P|·(|Q|·1); then C·r and |C|·1) gives the checker's own error
//! |ĉ_i − ẑ_i − (C·r − P·Q·r)_i| ≤ (γ_8(1+δ) + δ)·A_i + γ_8·(|C|·1)_i with δ = γ_8 + u(1+γ_8),
//! and the computed allowances are raised to upper bounds of the true ones. The row
//! threshold is therefore T_i = (γ_k + γ_8(1+δ) + δ)·A_i + γ_8·(|C|·1)_i + floor, about
//! 1.1·γ_k·A_i for k ≥ 128: a correct kernel is never rejected.
//!
//! If one element E_ij of the error exceeds its row's threshold T_i, then for the two values
//! of r_j one of |E_ij + S|, |−E_ij + S| is ≥ |E_ij| (S the rest of the row's sum), so each
//! vector catches it with probability ≥ 1/2 and [`super::replay::VECTORS`] vectors miss it
//! with probability ≤ 2^-VECTORS. Non-finite inputs (or an f32 sum that overflows) make the
//! product check meaningless; the call is then recomputed exactly (every element, O(mkn)),
//! where an element may also be an infinity (or NaN) that a correct kernel's partial sums
//! reach in some order (`overflow.rs`).
//! Cost otherwise: one pass over each of C, P and Q with three products per pass, O(mk + kn +
//! mn), against the kernel's O(mkn).

use super::overflow::gamma;
use super::recompute::dense_values as dense;
use super::replay::VECTORS;
use crate::backend::Call;
use crate::spec::splitmix64;

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Products each f32 lane sums before it is added into f64.
pub(super) const BLOCK: usize = 8;

/// Calls whose claims read at least this many elements check them on several threads.
const PAR_ELEMENTS: usize = 1 << 18;

/// Matrices of at least this many elements are read by several threads.
const PAR_MATRIX: usize = 1 << 16;

/// A logical `rows × cols` matrix over f32 data, row-major, or (`t`) the transpose of a
/// row-major `cols × rows` matrix: products read it in place, accumulating in f64.
#[derive(Clone, Copy)]
pub(super) struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    t: bool,
}

impl<'a> MatRef<'a> {
    pub(super) fn new(data: &'a [f32], rows: usize, cols: usize) -> MatRef<'a> {
        MatRef {
            data: &data[..rows * cols],
            rows,
            cols,
            t: false,
        }
    }
    pub(super) fn t(self) -> MatRef<'a> {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            t: !self.t,
            ..self
        }
    }
    fn get(&self, i: usize, j: usize) -> f64 {
        (if self.t {
            self.data[j * self.rows + i]
        } else {
            self.data[i * self.cols + j]
        }) as f64
    }
    /// `[|self|·v_0, self·v_1, …]` when `ABS`, else `[self·v_0, self·v_1, …]`: every
    /// product of one pass over the matrix, in f32 lanes of at most [`BLOCK`] products each,
    /// summed into f64 (see the module doc for the error this admits). A large matrix is
    /// split over the rayon pool (by output rows; the arithmetic of each output element is
    /// the same either way).
    fn mul_vecs<const N: usize, const ABS: bool>(&self, v: [&[f32]; N]) -> [Vec<f64>; N] {
        use rayon::prelude::*;
        let rows = self.rows;
        let span = if self.data.len() >= PAR_MATRIX {
            rows.div_ceil(rayon::current_num_threads().max(1) * 2)
                .next_multiple_of(16)
                .max(64)
        } else {
            rows.max(1)
        };
        let parts: Vec<[Vec<f64>; N]> = (0..rows.div_ceil(span))
            .into_par_iter()
            .map(|c| self.mul_vecs_rows::<N, ABS>(&v, c * span, ((c + 1) * span).min(rows)))
            .collect();
        let mut o: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(rows));
        for part in parts {
            for (os, p) in o.iter_mut().zip(part) {
                os.extend(p);
            }
        }
        o
    }

    /// Output rows `lo..hi` of [`MatRef::mul_vecs`].
    fn mul_vecs_rows<const N: usize, const ABS: bool>(
        &self,
        v: &[&[f32]; N],
        lo: usize,
        hi: usize,
    ) -> [Vec<f64>; N] {
        let mut o: [Vec<f64>; N] = std::array::from_fn(|_| vec![0.0; hi - lo]);
        if self.t {
            // stored row j holds column j of the logical matrix: each block of BLOCK stored
            // rows is read once, and each output element's BLOCK products are summed in an
            // f32 lane before they are added into its f64 output
            let width = self.rows.max(1);
            let stored: Vec<&[f32]> = self.data.chunks_exact(width).collect();
            for (b, block) in stored.chunks(BLOCK).enumerate() {
                let w: [[f32; BLOCK]; N] = std::array::from_fn(|s| {
                    std::array::from_fn(|u| {
                        if u < block.len() {
                            v[s][b * BLOCK + u]
                        } else {
                            0.0
                        }
                    })
                });
                super::lanes::column_block::<N, ABS>(block, &w, lo, hi, &mut o);
            }
        } else {
            let cols = self.cols.max(1);
            for (i, row) in self.data[lo * cols..hi * cols]
                .chunks_exact(cols)
                .enumerate()
            {
                let d = super::lanes::dots::<N, ABS>(row, v);
                for s in 0..N {
                    o[s][i] += d[s];
                }
            }
        }
        o
    }
}

/// Draws from the call's seed (never from the kernel).
pub(super) struct Signs {
    pub key: u64,
    pub i: u64,
}

impl Signs {
    fn vector(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.i += 1;
                if splitmix64(self.key.wrapping_add(self.i)) & 1 == 0 {
                    1.0
                } else {
                    -1.0
                }
            })
            .collect()
    }
}

/// One product claim: `c ≈ Σ_t p_t·q_t (+ bias on every row)`; each element sums
/// [`Claim::adds`] products.
pub(super) struct Claim<'a> {
    pub c: MatRef<'a>,
    pub terms: Vec<(MatRef<'a>, MatRef<'a>)>,
    pub bias: Option<&'a [f32]>,
}

impl Claim<'_> {
    /// Products summed per element: the inner dimensions of the terms, plus the bias.
    fn adds(&self) -> usize {
        self.terms.iter().map(|(p, _)| p.cols).sum::<usize>() + self.bias.is_some() as usize
    }
}

// `Passes` shares each pass among the allowance and exactly two random vectors.
const _: () = assert!(VECTORS == 2);

/// The f64 values rounded to f32 (the P pass reads Q's products as f32 lanes).
fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// The passes of one claim `C (m×n) ≈ Σ_t P_t·Q_t`, fed one term at a time (so that a
/// caller can build each term's operands, use them and drop them: the convolution checker's
/// unfolded inputs), then compared with C by [`Passes::verdict`].
pub(super) struct Passes {
    rs: [Vec<f32>; VECTORS],
    ones: Vec<f32>,
    allowance: Vec<f64>,
    want: [Vec<f64>; VECTORS],
    adds: usize,
}

impl Passes {
    pub(super) fn new(m: usize, n: usize, signs: &mut Signs) -> Passes {
        Passes {
            rs: std::array::from_fn(|_| signs.vector(n)),
            ones: vec![1.0f32; n],
            allowance: vec![0.0; m],
            want: std::array::from_fn(|_| vec![0.0; m]),
            adds: 0,
        }
    }

    /// Adds the term `p·q` (p m×k, q k×n): one pass over q gives (|q|·1, q·r_1, q·r_2), one
    /// over p then gives the row allowances |p|(|q|·1) and the products p(q·r_v).
    pub(super) fn add(&mut self, p: MatRef, q: MatRef) {
        let [qa, q1, q2] = q.mul_vecs::<3, true>([&self.ones, &self.rs[0], &self.rs[1]]);
        let (qa, q1, q2) = (to_f32(&qa), to_f32(&q1), to_f32(&q2));
        let [pa, p1, p2] = p.mul_vecs::<3, true>([&qa, &q1, &q2]);
        let [w1, w2] = &mut self.want;
        for (acc, part) in [&mut self.allowance, w1, w2].into_iter().zip([pa, p1, p2]) {
            for (a, v) in acc.iter_mut().zip(part) {
                *a += v;
            }
        }
        self.adds += p.cols;
    }

    /// Compares `c` (+ `bias` on every row) with the terms added so far. `None` when a pass
    /// is not finite: a non-finite operand makes some allowance non-finite (|x|·y is inf or
    /// NaN for x or y infinite, NaN for NaN), and a result that overflowed (or is NaN), or an
    /// f32 lane that overflowed, makes some pass non-finite; the caller then decides by an
    /// exact recomputation, which knows IEEE classes.
    pub(super) fn verdict(
        mut self,
        what: &str,
        c: MatRef,
        bias: Option<&[f32]>,
    ) -> Option<Result<(), String>> {
        let (m, n) = (c.rows, c.cols);
        let [ca, c1, c2] = c.mul_vecs::<3, true>([&self.ones, &self.rs[0], &self.rs[1]]);
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if ![&self.allowance, &ca, &c1, &c2]
            .into_iter()
            .all(|v| finite(v))
        {
            return None;
        }
        let g8 = gamma(BLOCK);
        let delta = g8 + U * (1.0 + g8);
        // computed sums of non-negative terms are raised to upper bounds of the exact ones:
        // the allowance went through two blocked sums and one rounding to f32, |C|·1 through
        // one
        let a_up = 1.0 / ((1.0 - g8) * (1.0 - g8) * (1.0 - U));
        let c_up = 1.0 / (1.0 - g8);
        let mut bias_abs = 0.0;
        if let Some(b) = bias {
            self.adds += 1;
            bias_abs = b.iter().map(|v| v.abs() as f64).sum::<f64>();
            for (w, r) in self.want.iter_mut().zip(&self.rs) {
                let br: f64 = b.iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum();
                for x in w.iter_mut() {
                    *x += br;
                }
            }
        }
        let g = gamma(self.adds);
        let floor = (self.adds + 2 * (m + n) + 3) as f64 * f32::MIN_POSITIVE as f64;
        for (cr, want) in [c1, c2].iter().zip(&self.want) {
            for (i, (got, want)) in cr.iter().zip(want).enumerate() {
                let a = self.allowance[i] * a_up;
                let bound = (g * (a + bias_abs)
                    + (g8 * (1.0 + delta) + delta) * a
                    + g8 * ca[i] * c_up
                    + floor)
                    * (1.0 + 1e-9);
                if (got - want).abs() > bound {
                    return Some(Err(format!(
                        "{what}: row {i} of the product check is off by {:e}, allowed {bound:e} (gamma_{} bound)",
                        (got - want).abs(),
                        self.adds
                    )));
                }
            }
        }
        Some(Ok(()))
    }
}

fn check(what: &str, claim: &Claim, signs: &mut Signs) -> Result<(), String> {
    let mut passes = Passes::new(claim.c.rows, claim.c.cols, signs);
    for &(p, q) in &claim.terms {
        passes.add(p, q);
    }
    passes
        .verdict(what, claim.c, claim.bias)
        .unwrap_or_else(|| recompute_exactly(what, claim))
}

/// The exact check for non-finite operands: every element recomputed in f64, compared by
/// class and within the same rigorous bound.
fn recompute_exactly(what: &str, claim: &Claim) -> Result<(), String> {
    let (m, n) = (claim.c.rows, claim.c.cols);
    let g = gamma(claim.adds());
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a, mut pos, mut neg) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            let mut add = |x: f64| {
                s += x;
                a += x.abs();
                if x > 0.0 {
                    pos += x;
                } else {
                    neg -= x;
                }
            };
            for (p, q) in &claim.terms {
                for l in 0..p.cols {
                    add(p.get(i, l) * q.get(l, j));
                }
            }
            if let Some(b) = claim.bias {
                add(b[j] as f64);
            }
            let s32 = s as f32 as f64;
            let got = claim.c.get(i, j);
            // a correct f32 kernel's partial sums may overflow in its own order whatever the
            // exact sum ([3e38, 3e38, −3e38] gives +inf left to right): the infinities (and
            // NaN) that some order can reach are accepted (overflow.rs)
            let ok = if super::overflow::reachable(got, pos, neg, claim.adds()) {
                true
            } else if s32.is_finite() {
                (got - s).abs() <= g * a + f32::MIN_POSITIVE as f64 * (claim.adds() + 1) as f64
            } else if s32.is_nan() {
                got.is_nan()
            } else {
                // overflow to ±inf in f32 (or a true infinity): the same infinity, or a
                // finite value at the edge of the range where rounding decides
                got == s32 || (got.is_finite() && got.abs() >= f32::MAX as f64 * (1.0 - g))
            };
            if !ok {
                return Err(format!(
                    "{what}: element ({i}, {j}) is {got}, the exact product gives {s}"
                ));
            }
        }
    }
    Ok(())
}

fn signs(call: &Call) -> Signs {
    Signs {
        key: splitmix64(call.seed),
        i: 0,
    }
}

/// Batch structure of `a @ b` (equal batch dims, or one side 2-D): (batch, a batched,
/// b batched, m, k, n).
fn matmul_dims(
    a: &[usize],
    b: &[usize],
) -> Result<(usize, bool, bool, usize, usize, usize), String> {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!("matmul shapes {a:?} and {b:?}"));
    }
    let (m, k, n) = (a[a.len() - 2], a[a.len() - 1], b[b.len() - 1]);
    let (ab, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let batch: usize = if ab.is_empty() {
        bb.iter().product()
    } else {
        ab.iter().product()
    };
    Ok((batch, !ab.is_empty(), !bb.is_empty(), m, k, n))
}

/// Block `t` of `rows × cols` matrices stored one after another.
fn block(v: &[f32], rows: usize, cols: usize, t: usize) -> MatRef<'_> {
    MatRef::new(&v[t * rows * cols..], rows, cols)
}

fn expect_len(what: &str, v: &[f32], n: usize) -> Result<(), String> {
    if v.len() == n {
        Ok(())
    } else {
        Err(format!("{what} has {} elements, expected {n}", v.len()))
    }
}

pub(super) fn matmul_forward(call: &Call) -> Result<(), String> {
    let (a, b) = (&call.inputs[0], &call.inputs[1]);
    let (batch, ab, bb, m, k, n) = matmul_dims(a.shape, b.shape)?;
    let (av, bv, cv) = (dense(a), dense(b), dense(&call.output));
    expect_len("the result", &cv, batch * m * n)?;
    let mut s = signs(call);
    for t in 0..batch {
        let claim = Claim {
            c: block(&cv, m, n, t),
            terms: vec![(
                block(&av, m, k, if ab { t } else { 0 }),
                block(&bv, k, n, if bb { t } else { 0 }),
            )],
            bias: None,
        };
        check(&format!("matmul batch {t}"), &claim, &mut s)?;
    }
    Ok(())
}

pub(super) fn matmul_vjp(call: &Call) -> Result<(), String> {
    let Some(g) = &call.cotangent else {
        return Err("a VJP call without a cotangent".into());
    };
    let (a, b) = (&call.inputs[0], &call.inputs[1]);
    let (batch, ab, bb, m, k, n) = matmul_dims(a.shape, b.shape)?;
    let (av, bv, gv) = (dense(a), dense(b), dense(g));
    let mut s = signs(call);
    let need = |i: usize| call.needs.get(i).copied().unwrap_or(false);
    // dA = G·Bᵀ per batch (summed over batches when A is the shared 2-D side)
    match call.grads.first() {
        Some(Some(da)) => {
            let dav = dense(da);
            expect_len("gradient 0", &dav, if ab { batch } else { 1 } * m * k)?;
            for t in 0..if ab { batch } else { 1 } {
                let batches: Vec<usize> = if ab { vec![t] } else { (0..batch).collect() };
                let claim = Claim {
                    c: block(&dav, m, k, t),
                    terms: batches
                        .iter()
                        .map(|&u| {
                            (
                                block(&gv, m, n, u),
                                block(&bv, k, n, if bb { u } else { 0 }).t(),
                            )
                        })
                        .collect(),
                    bias: None,
                };
                check(&format!("matmul gradient of a, batch {t}"), &claim, &mut s)?;
            }
        }
        _ if need(0) => return Err("gradient 0 is missing".into()),
        _ => {}
    }
    // dB = Aᵀ·G per batch (summed when B is shared)
    match call.grads.get(1) {
        Some(Some(db)) => {
            let dbv = dense(db);
            expect_len("gradient 1", &dbv, if bb { batch } else { 1 } * k * n)?;
            for t in 0..if bb { batch } else { 1 } {
                let batches: Vec<usize> = if bb { vec![t] } else { (0..batch).collect() };
                let claim = Claim {
                    c: block(&dbv, k, n, t),
                    terms: batches
                        .iter()
                        .map(|&u| {
                            (
                                block(&av, m, k, if ab { u } else { 0 }).t(),
                                block(&gv, m, n, u),
                            )
                        })
                        .collect(),
                    bias: None,
                };
                check(&format!("matmul gradient of b, batch {t}"), &claim, &mut s)?;
            }
        }
        _ if need(1) => return Err("gradient 1 is missing".into()),
        _ => {}
    }
    Ok(())
}

/// Rows, in and out features of `linear(x, w[, b])`.
fn linear_dims(call: &Call) -> (usize, usize, usize) {
    let (x, w) = (&call.inputs[0], &call.inputs[1]);
    let (out, inp) = (w.shape[0], w.shape[1]);
    (x.shape.iter().product::<usize>() / inp.max(1), inp, out)
}

pub(super) fn linear_forward(call: &Call) -> Result<(), String> {
    let (rows, inp, out) = linear_dims(call);
    let (xv, wv, yv) = (
        dense(&call.inputs[0]),
        dense(&call.inputs[1]),
        dense(&call.output),
    );
    expect_len("the result", &yv, rows * out)?;
    let bias = call.inputs.get(2).map(dense);
    let claim = Claim {
        c: MatRef::new(&yv, rows, out),
        terms: vec![(MatRef::new(&xv, rows, inp), MatRef::new(&wv, out, inp).t())],
        bias: bias.as_deref(),
    };
    check("linear", &claim, &mut signs(call))
}

pub(super) fn linear_vjp(call: &Call) -> Result<(), String> {
    let Some(g) = &call.cotangent else {
        return Err("a VJP call without a cotangent".into());
    };
    let (rows, inp, out) = linear_dims(call);
    let (xv, wv, gv) = (dense(&call.inputs[0]), dense(&call.inputs[1]), dense(g));
    let gm = MatRef::new(&gv, rows, out);
    let ones = vec![1.0f32; rows];
    let need = |i: usize| call.needs.get(i).copied().unwrap_or(false);
    let mut grads = Vec::new();
    for i in 0..call.inputs.len() {
        match call.grads.get(i) {
            Some(Some(grad)) => grads.push((i, dense(grad))),
            _ if need(i) => return Err(format!("gradient {i} is missing")),
            _ => {}
        }
    }
    let mut claims = Vec::new();
    for (i, gr) in &grads {
        let (c, term) = match i {
            // dx = G·W
            0 => (MatRef::new(gr, rows, inp), (gm, MatRef::new(&wv, out, inp))),
            // dW = Gᵀ·X
            1 => (
                MatRef::new(gr, out, inp),
                (gm.t(), MatRef::new(&xv, rows, inp)),
            ),
            // db = Gᵀ·1 (column sums)
            _ => (
                MatRef::new(gr, out, 1),
                (gm.t(), MatRef::new(&ones, rows, 1)),
            ),
        };
        expect_len(&format!("gradient {i}"), gr, c.rows * c.cols)?;
        let claim = Claim {
            c,
            terms: vec![term],
            bias: None,
        };
        claims.push((format!("linear gradient {i}"), claim));
    }
    check_all(call, claims)
}

/// Checks independent claims of one call, each with its own random vectors (keyed by the
/// call's seed and the claim's position); on two threads when the call is large.
fn check_all(call: &Call, claims: Vec<(String, Claim)>) -> Result<(), String> {
    use rayon::prelude::*;
    let size: usize = claims
        .iter()
        .map(|(_, c)| {
            c.c.data.len()
                + c.terms
                    .iter()
                    .map(|(p, q)| p.data.len() + q.data.len())
                    .sum::<usize>()
        })
        .sum();
    let one = |(n, (what, claim)): (usize, &(String, Claim))| {
        let mut s = Signs {
            key: splitmix64(call.seed ^ splitmix64(n as u64 + 1)),
            i: 0,
        };
        check(what, claim, &mut s)
    };
    if claims.len() > 1 && size >= PAR_ELEMENTS {
        claims.par_iter().enumerate().map(one).collect()
    } else {
        claims.iter().enumerate().try_for_each(one)
    }
}
