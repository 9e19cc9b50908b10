//! Freivalds-style product checks for `matmul` and `linear` and their VJP products.
//!
//! For a claimed product C = P·Q (P m×k, Q k×n) the checker draws r ∈ {±1}^n and compares
//! C·r with P·(Q·r), both in f64, against the rigorous float32 bound of any summation order
//! (Higham, *Accuracy and Stability of Numerical Algorithms*, Thm 3.5):
//! |fl(PQ) − PQ| ≤ γ_k |P||Q| with γ_k = k·u/(1 − k·u), u = 2^-24, hence
//! |(fl(PQ) − PQ)·r| ≤ γ_k |P|(|Q|·1) for |r| = 1, plus an absolute k·2^-126 for underflow.
//! So a correct kernel is never rejected (the f64 side's own rounding, ≤ 2^-50 relative, is
//! covered by a 1e-9 relative slack). If one element E_ij of the error exceeds its row's
//! allowance T_i = γ_k (|P||Q|·1)_i, then for the two values of r_j one of |E_ij + S|,
//! |−E_ij + S| is ≥ |E_ij| (S the rest of the row's sum), so each vector catches it with
//! probability ≥ 1/2 and [`super::replay::VECTORS`] vectors miss it with probability
//! ≤ 2^-VECTORS. Non-finite inputs make the product check meaningless; the call is then
//! recomputed exactly (every element, O(mkn)). Cost otherwise: O(mk + kn + mn) per vector
//! against the kernel's O(mkn).

use super::recompute::values;
use super::replay::VECTORS;
use crate::backend::{Call, Operand};
use crate::spec::splitmix64;
use std::borrow::Cow;

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Matrices at least this large are read by several threads.
const PAR_ELEMENTS: usize = 1 << 15;

fn gamma(k: usize) -> f64 {
    let ku = k as f64 * U;
    ku / (1.0 - ku).max(0.5)
}

/// A logical `rows × cols` matrix over f32 data, row-major, or (`t`) the transpose of a
/// row-major `cols × rows` matrix: products read it in place, accumulating in f64.
#[derive(Clone, Copy)]
struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    t: bool,
}

impl<'a> MatRef<'a> {
    fn new(data: &'a [f32], rows: usize, cols: usize) -> MatRef<'a> {
        MatRef {
            data: &data[..rows * cols],
            rows,
            cols,
            t: false,
        }
    }
    fn t(self) -> MatRef<'a> {
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
    /// `self · v` (or `|self| · v`).
    fn mul_vec(&self, v: &[f64], abs: bool) -> Vec<f64> {
        let f = |x: f32| if abs { x.abs() as f64 } else { x as f64 };
        use rayon::prelude::*;
        let parallel = self.data.len() >= PAR_ELEMENTS;
        if !self.t {
            let rows = self.data.chunks_exact(self.cols.max(1)).take(self.rows);
            if parallel {
                self.data
                    .par_chunks_exact(self.cols.max(1))
                    .take(self.rows)
                    .map(|row| dot(row, v, abs))
                    .collect()
            } else {
                rows.map(|row| dot(row, v, abs)).collect()
            }
        } else {
            // stored row j holds column j of the logical matrix; threads split the output
            let accumulate = |lo: usize, out: &mut [f64]| {
                for (row, &vj) in self.data.chunks_exact(self.rows.max(1)).zip(v) {
                    for (o, &a) in out.iter_mut().zip(&row[lo..]) {
                        *o += f(a) * vj;
                    }
                }
            };
            let mut out = vec![0.0; self.rows];
            if parallel {
                let step = self
                    .rows
                    .div_ceil(rayon::current_num_threads().max(1))
                    .max(1);
                out.par_chunks_mut(step)
                    .enumerate()
                    .for_each(|(c, o)| accumulate(c * step, o));
            } else {
                accumulate(0, &mut out);
            }
            out
        }
    }
    fn finite(&self) -> bool {
        self.data.iter().all(|v| v.is_finite())
    }
}

/// `Σ f(a_i)·v_i` with eight independent f64 accumulators (a sequential f64 fold does not
/// vectorize, and the check's passes are its whole cost).
fn dot(a: &[f32], v: &[f64], abs: bool) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ac, vc) = (a.chunks_exact(8), v.chunks_exact(8));
    let (ar, vr) = (ac.remainder(), vc.remainder());
    for (x, y) in ac.zip(vc) {
        for l in 0..8 {
            let xl = if abs { x[l].abs() } else { x[l] };
            acc[l] += xl as f64 * y[l];
        }
    }
    let mut s: f64 = acc.iter().sum();
    for (&x, &y) in ar.iter().zip(vr) {
        s += if abs { x.abs() } else { x } as f64 * y;
    }
    s
}

/// An operand's elements, row-major (borrowed when dense).
fn dense<'a>(o: &Operand<'a>) -> Cow<'a, [f32]> {
    let n: usize = o.shape.iter().product();
    let contiguous = match o.strides {
        None => true,
        Some(s) => s == crate::spec::contiguous_strides(o.shape).as_slice(),
    };
    if contiguous && o.offset + n <= o.storage.len() {
        Cow::Borrowed(&o.storage[o.offset..o.offset + n])
    } else {
        Cow::Owned(values(o).into_iter().map(|v| v as f32).collect())
    }
}

/// Draws from the call's seed (never from the kernel).
struct Signs {
    key: u64,
    i: u64,
}

impl Signs {
    fn vector(&mut self, n: usize) -> Vec<f64> {
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

/// One product claim: `c ≈ Σ_t p_t·q_t (+ bias on every row)`, each term summing `k`
/// products per element.
struct Claim<'a> {
    c: MatRef<'a>,
    terms: Vec<(MatRef<'a>, MatRef<'a>)>,
    bias: Option<&'a [f32]>,
    k: usize,
}

impl Claim<'_> {
    fn adds(&self) -> usize {
        self.k * self.terms.len() + self.bias.is_some() as usize
    }
}

fn check(what: &str, claim: &Claim, signs: &mut Signs) -> Result<(), String> {
    let exact = claim.terms.iter().all(|(p, q)| p.finite() && q.finite())
        && claim.bias.is_none_or(|b| b.iter().all(|v| v.is_finite()));
    if !exact {
        return recompute_exactly(what, claim);
    }
    let ones = vec![1.0; claim.c.cols];
    let mut allowance = vec![0.0; claim.c.rows];
    for (p, q) in &claim.terms {
        let qa = q.mul_vec(&ones, true);
        for (a, v) in allowance.iter_mut().zip(p.mul_vec(&qa, true)) {
            *a += v;
        }
    }
    if let Some(b) = claim.bias {
        let s: f64 = b.iter().map(|v| v.abs() as f64).sum();
        for a in allowance.iter_mut() {
            *a += s;
        }
    }
    let g = gamma(claim.adds());
    let floor = (claim.adds() + 1) as f64 * f32::MIN_POSITIVE as f64;
    for _ in 0..VECTORS {
        let r = signs.vector(claim.c.cols);
        let cr = claim.c.mul_vec(&r, false);
        let mut want = vec![0.0; claim.c.rows];
        for (p, q) in &claim.terms {
            for (w, v) in want.iter_mut().zip(p.mul_vec(&q.mul_vec(&r, false), false)) {
                *w += v;
            }
        }
        if let Some(b) = claim.bias {
            let br: f64 = b.iter().zip(&r).map(|(&a, b)| a as f64 * b).sum();
            for w in want.iter_mut() {
                *w += br;
            }
        }
        for (i, (got, want)) in cr.iter().zip(&want).enumerate() {
            let bound = (g * allowance[i] + floor) * (1.0 + 1e-9);
            // NaN in the result fails here (a NaN never compares as within the bound)
            let within = (got - want).abs() <= bound;
            if !within {
                return Err(format!(
                    "{what}: row {i} of the product check is off by {:e}, allowed {bound:e} (gamma_{} bound)",
                    (got - want).abs(),
                    claim.adds()
                ));
            }
        }
    }
    Ok(())
}

/// The exact check for non-finite operands: every element recomputed in f64, compared by
/// class and within the same rigorous bound.
fn recompute_exactly(what: &str, claim: &Claim) -> Result<(), String> {
    let (m, n) = (claim.c.rows, claim.c.cols);
    let g = gamma(claim.adds());
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for (p, q) in &claim.terms {
                for l in 0..p.cols {
                    let x = p.get(i, l) * q.get(l, j);
                    s += x;
                    a += x.abs();
                }
            }
            if let Some(b) = claim.bias {
                s += b[j] as f64;
                a += (b[j] as f64).abs();
            }
            let s32 = s as f32 as f64;
            let got = claim.c.get(i, j);
            let ok = if s32.is_finite() {
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
            k,
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
                    k: n,
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
                    k: m,
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
        k: inp,
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
    let mut s = signs(call);
    let need = |i: usize| call.needs.get(i).copied().unwrap_or(false);
    for i in 0..call.inputs.len() {
        let Some(Some(grad)) = call.grads.get(i) else {
            if need(i) {
                return Err(format!("gradient {i} is missing"));
            }
            continue;
        };
        let gr = dense(grad);
        let (c, term, k) = match i {
            // dx = G·W
            0 => (
                MatRef::new(&gr, rows, inp),
                (gm, MatRef::new(&wv, out, inp)),
                out,
            ),
            // dW = Gᵀ·X
            1 => (
                MatRef::new(&gr, out, inp),
                (gm.t(), MatRef::new(&xv, rows, inp)),
                rows,
            ),
            // db = Gᵀ·1 (column sums)
            _ => (
                MatRef::new(&gr, out, 1),
                (gm.t(), MatRef::new(&ones, rows, 1)),
                rows,
            ),
        };
        expect_len(&format!("gradient {i}"), &gr, c.rows * c.cols)?;
        let claim = Claim {
            c,
            terms: vec![term],
            bias: None,
            k,
        };
        check(&format!("linear gradient {i}"), &claim, &mut s)?;
    }
    Ok(())
}
