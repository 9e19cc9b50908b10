//! Freivalds-style checks of `conv2d` and `conv_transpose2d` and of their VJPs, as products of
//! matrices that the checker unfolds from this call's own operands.
//!
//! Both ops relate a *small* side (conv2d's output, conv_transpose2d's input: spatial size
//! P, channels Cs) and a *big* side (conv2d's input, conv_transpose2d's output: spatial size
//! Q, channels Cb) through one weight W [Cs, Cb/groups, KH, KW] and one tap table: tap t of
//! small position p reads big position `tap(t, p)`, or padding. Per sample n and group g
//! (Csg = Cs/groups, Cbg = Cb/groups, T = KH·KW):
//!
//! - **gather** (conv2d forward, conv_transpose2d's input gradient):
//!   S_ng (Csg × P) = W_g (Csg × Cbg·T) · U(B_ng) (Cbg·T × P), with U the unfolded big side
//!   (im2col; padding reads 0, as in the spec);
//! - **scatter** (conv_transpose2d forward, conv2d's input gradient):
//!   B_ng (Cbg × Q) = W'_g (Cbg × Csg·T) · V(S_ng) (Csg·T × Q), with W' the weight's channel
//!   axes exchanged and V the small side spread to the big positions its taps reach;
//! - **weight gradient**: dW_g (Csg × Cbg·T) = Σ_n S_ng · U(B_ng)ᵀ;
//! - **bias gradient**: db = Σ_n G_n · 1 (G the cotangent, channels × positions);
//! - the forward bias is one more rank-one term, b_g · 1ᵀ.
//!
//! Each claim is a product in the sense of `freivalds.rs`, so the same bound and the same
//! argument hold: every element of a claim is a sum of `adds` products (zeros included:
//! Higham's γ_k bound holds for any k at least the number of nonzero terms and any order of
//! summation), a correct f32 kernel is never rejected, and an element error above its row's
//! threshold escapes with probability ≤ 2^-VECTORS. The rows of a claim are the (sample,
//! channel) rows of the result, and a weight gradient's rows are its output channels.
//!
//! Non-finite operands (where padding's 0·inf is NaN in the spec but absent from the scatter
//! claim), or passes that overflow f32, are decided by recomputing the whole call with the
//! f64 spec (`recompute.rs`). Cost: building U or V reads each operand once and writes
//! Cbg·T·P (or Csg·T·Q) elements per sample and group; the passes read them three vectors at
//! a time: O(T·(Cb·P + Cs·Q)) per sample against the kernel's O(Cs·Cbg·T·P).

use super::freivalds::{MatRef, Passes, Signs};
use super::recompute::{self, dense_values as dense};
use crate::backend::{Call, Operand};
use crate::graph::Op;
use crate::providers::native_cpu::vmath;
use crate::spec::{infer_shape, splitmix64};
use rayon::prelude::*;

/// The tap table of one call: `taps[t * small + p]` is the big position that tap t of small
/// position p reads, or `NONE` (padding, or a cropped transposed output).
struct Taps {
    taps: Vec<usize>,
    /// KH·KW.
    count: usize,
    /// Spatial size of the small side.
    small: usize,
    /// Spatial size of the big side.
    big: usize,
}

const NONE: usize = usize::MAX;

/// The spatial arithmetic shared by both ops: small position (i, j), tap (a, b) reads big
/// position (i·s + a·d − pad, j·s + b·d − pad).
struct Window {
    small: [usize; 2],
    big: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Taps {
    fn new(w: &Window) -> Taps {
        let (count, small) = (w.kernel[0] * w.kernel[1], w.small[0] * w.small[1]);
        let mut taps = Vec::with_capacity(count * small);
        for a in 0..w.kernel[0] {
            for b in 0..w.kernel[1] {
                for i in 0..w.small[0] {
                    for j in 0..w.small[1] {
                        let r = (i * w.stride[0] + a * w.dilation[0]).checked_sub(w.padding[0]);
                        let c = (j * w.stride[1] + b * w.dilation[1]).checked_sub(w.padding[1]);
                        taps.push(match (r, c) {
                            (Some(r), Some(c)) if r < w.big[0] && c < w.big[1] => r * w.big[1] + c,
                            _ => NONE,
                        });
                    }
                }
            }
        }
        Taps {
            taps,
            count,
            small,
            big: w.big[0] * w.big[1],
        }
    }

    /// U(B): `channels` rows of the big side (channels × big) unfolded to
    /// (channels·T × small).
    fn unfold(&self, big: &[f32], channels: usize) -> Vec<f32> {
        let mut u = Vec::with_capacity(channels * self.count * self.small);
        for c in 0..channels {
            let row = &big[c * self.big..(c + 1) * self.big];
            u.extend(
                self.taps
                    .iter()
                    .map(|&q| if q == NONE { 0.0 } else { row[q] }),
            );
        }
        u
    }

    /// V(S): `channels` rows of the small side (channels × small) spread to
    /// (channels·T × big), each tap's row holding the small values at the big positions
    /// they reach (a tap reaches each big position from at most one small position).
    fn spread(&self, small: &[f32], channels: usize) -> Vec<f32> {
        let mut v = vec![0.0f32; channels * self.count * self.big];
        for c in 0..channels {
            let row = &small[c * self.small..(c + 1) * self.small];
            for t in 0..self.count {
                let out = &mut v[(c * self.count + t) * self.big..][..self.big];
                for (&q, &x) in self.taps[t * self.small..][..self.small].iter().zip(row) {
                    if q != NONE {
                        out[q] = x;
                    }
                }
            }
        }
        v
    }
}

/// One call's sides: sizes and the tap table.
struct Geometry {
    taps: Taps,
    batch: usize,
    groups: usize,
    /// Channels of the small and big side per group.
    small_group: usize,
    big_group: usize,
}

impl Geometry {
    /// The geometry of a call with input shape `x`, weight `w` and output `y` (the spec's
    /// shapes), or why there is none.
    fn of(op: &Op, x: &[usize], w: &[usize], y: &[usize]) -> Result<Geometry, String> {
        let (small, big, g, stride, padding, dilation) = match op {
            Op::Conv2d(g) => (y, x, g.groups, g.stride, g.padding, g.dilation),
            Op::ConvTranspose2d(g) => (x, y, g.groups, g.stride, g.padding, g.dilation),
            _ => return Err(format!("{} is not a convolution", op.name())),
        };
        let window = Window {
            small: [small[2], small[3]],
            big: [big[2], big[3]],
            kernel: [w[2], w[3]],
            stride,
            padding,
            dilation,
        };
        Ok(Geometry {
            taps: Taps::new(&window),
            batch: x[0],
            groups: g,
            small_group: small[1] / g,
            big_group: big[1] / g,
        })
    }

    fn small_block(&self) -> usize {
        self.small_group * self.taps.small
    }
    fn big_block(&self) -> usize {
        self.big_group * self.taps.big
    }
    fn weight_block(&self) -> usize {
        self.small_group * self.big_group * self.taps.count
    }

    /// W'_g: the weight block of group g with its channel axes exchanged,
    /// (Cbg × Csg·T).
    fn exchanged_weight(&self, w: &[f32], g: usize) -> Vec<f32> {
        let (cs, cb, t) = (self.small_group, self.big_group, self.taps.count);
        let block = &w[g * self.weight_block()..][..self.weight_block()];
        let mut out = Vec::with_capacity(block.len());
        for b in 0..cb {
            for s in 0..cs {
                out.extend_from_slice(&block[(s * cb + b) * t..][..t]);
            }
        }
        out
    }
}

/// The operands of one (sample, group) claim or of the weight claim.
struct Sides<'a> {
    small: &'a [f32],
    big: &'a [f32],
    weight: &'a [f32],
    bias: Option<&'a [f32]>,
}

fn signs(seed: u64, claim: usize) -> Signs {
    Signs {
        key: splitmix64(seed ^ splitmix64((claim as u64).wrapping_add(1))),
        i: 0,
    }
}

/// Runs `claim(n, g)` for every sample and group, in parallel; `None` if any claim's passes
/// were not finite.
fn per_block(
    geo: &Geometry,
    claim: impl Fn(usize, usize) -> Option<Result<(), String>> + Sync,
) -> Option<Result<(), String>> {
    let blocks = geo.batch * geo.groups;
    let verdicts: Vec<Option<Result<(), String>>> = (0..blocks)
        .into_par_iter()
        .map(|k| claim(k / geo.groups, k % geo.groups))
        .collect();
    let mut first_err = None;
    for v in verdicts {
        match v? {
            Ok(()) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Some(first_err.map_or(Ok(()), Err))
}

/// Gather claims: the small side S (result) from the big side.
fn gather(what: &str, geo: &Geometry, sides: &Sides, seed: u64) -> Option<Result<(), String>> {
    let (csg, t, p) = (geo.small_group, geo.taps.count, geo.taps.small);
    let k = geo.big_group * t;
    per_block(geo, |n, g| {
        let block = n * geo.groups + g;
        let s = MatRef::new(&sides.small[block * geo.small_block()..], csg, p);
        let u = geo
            .taps
            .unfold(&sides.big[block * geo.big_block()..], geo.big_group);
        let mut passes = Passes::new(csg, p, &mut signs(seed, block));
        passes.add(
            MatRef::new(&sides.weight[g * geo.weight_block()..], csg, k),
            MatRef::new(&u, k, p),
        );
        let ones = vec![1.0f32; p];
        if let Some(b) = sides.bias {
            passes.add(MatRef::new(&b[g * csg..], csg, 1), MatRef::new(&ones, 1, p));
        }
        passes.verdict(&format!("{what}, sample {n} group {g}"), s, None)
    })
}

/// Scatter claims: the big side B (result) from the small side.
fn scatter(what: &str, geo: &Geometry, sides: &Sides, seed: u64) -> Option<Result<(), String>> {
    let (cbg, t, q) = (geo.big_group, geo.taps.count, geo.taps.big);
    let k = geo.small_group * t;
    let weights: Vec<Vec<f32>> = (0..geo.groups)
        .map(|g| geo.exchanged_weight(sides.weight, g))
        .collect();
    per_block(geo, |n, g| {
        let block = n * geo.groups + g;
        let b = MatRef::new(&sides.big[block * geo.big_block()..], cbg, q);
        let v = geo
            .taps
            .spread(&sides.small[block * geo.small_block()..], geo.small_group);
        let mut passes = Passes::new(cbg, q, &mut signs(seed, block));
        passes.add(MatRef::new(&weights[g], cbg, k), MatRef::new(&v, k, q));
        let ones = vec![1.0f32; q];
        if let Some(bias) = sides.bias {
            passes.add(
                MatRef::new(&bias[g * cbg..], cbg, 1),
                MatRef::new(&ones, 1, q),
            );
        }
        passes.verdict(&format!("{what}, sample {n} group {g}"), b, None)
    })
}

/// Weight-gradient claims, one per group: dW_g = Σ_n S_ng · U(B_ng)ᵀ (`sides.weight` is the
/// gradient), the unfolded big side built one sample at a time.
fn weight_gradient(geo: &Geometry, sides: &Sides, seed: u64) -> Option<Result<(), String>> {
    let (csg, p) = (geo.small_group, geo.taps.small);
    let k = geo.big_group * geo.taps.count;
    let verdicts: Vec<Option<Result<(), String>>> = (0..geo.groups)
        .into_par_iter()
        .map(|g| {
            let mut passes = Passes::new(csg, k, &mut signs(seed, usize::MAX - g));
            for n in 0..geo.batch {
                let block = n * geo.groups + g;
                let u = geo
                    .taps
                    .unfold(&sides.big[block * geo.big_block()..], geo.big_group);
                passes.add(
                    MatRef::new(&sides.small[block * geo.small_block()..], csg, p),
                    MatRef::new(&u, k, p).t(),
                );
            }
            let dw = MatRef::new(&sides.weight[g * geo.weight_block()..], csg, k);
            passes.verdict(&format!("weight gradient, group {g}"), dw, None)
        })
        .collect();
    verdicts
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().collect())
}

/// The bias-gradient claim: db = Σ_n G_n · 1, G the cotangent [N, C, positions].
fn bias_gradient(db: &[f32], cot: &[f32], batch: usize, seed: u64) -> Option<Result<(), String>> {
    let channels = db.len();
    let positions = cot.len() / (batch * channels).max(1);
    let ones = vec![1.0f32; positions];
    let mut passes = Passes::new(channels, 1, &mut signs(seed, usize::MAX / 2));
    for n in 0..batch {
        passes.add(
            MatRef::new(&cot[n * channels * positions..], channels, positions),
            MatRef::new(&ones, positions, 1),
        );
    }
    passes.verdict("bias gradient", MatRef::new(db, channels, 1), None)
}

fn all_finite(values: &[&[f32]]) -> bool {
    values.iter().all(|v| vmath::all_finite(v))
}

/// An operand's row-major values, all of them: a short storage (or a view past it) is a
/// rejection, not a short slice for the claims to index.
fn full<'a>(what: &str, o: &Operand<'a>) -> Result<std::borrow::Cow<'a, [f32]>, String> {
    let v = dense(o);
    let n: usize = o.shape.iter().product();
    if v.len() == n {
        Ok(v)
    } else {
        Err(format!(
            "{what} of shape {:?} has {} readable elements, expected {n}",
            o.shape,
            v.len()
        ))
    }
}

fn expect_shape(what: &str, got: &[usize], want: &[usize]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what} has shape {got:?}, expected {want:?}"))
    }
}

/// Checks a forward result of `conv2d` or `conv_transpose2d`.
pub(super) fn forward(op: &Op, call: &Call) -> Result<(), String> {
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    let want = infer_shape(op, &shapes).map_err(|e| format!("the spec refuses the call: {e}"))?;
    expect_shape("the result", call.output.shape, &want)?;
    let (x, w, y) = (
        full("input 0", &call.inputs[0])?,
        full("input 1", &call.inputs[1])?,
        full("the result", &call.output)?,
    );
    let b = call.inputs.get(2).map(|o| full("input 2", o)).transpose()?;
    if !all_finite(&[&x, &w, &y, b.as_deref().unwrap_or(&[])]) {
        return recompute::whole_forward(op, call);
    }
    let geo = Geometry::of(op, shapes[0], shapes[1], &want)?;
    let verdict = match op {
        Op::Conv2d(_) => {
            let sides = Sides {
                small: &y,
                big: &x,
                weight: &w,
                bias: b.as_deref(),
            };
            gather(op.name(), &geo, &sides, call.seed)
        }
        _ => {
            let sides = Sides {
                small: &x,
                big: &y,
                weight: &w,
                bias: b.as_deref(),
            };
            scatter(op.name(), &geo, &sides, call.seed)
        }
    };
    verdict.unwrap_or_else(|| recompute::whole_forward(op, call))
}

/// Checks the gradients of a VJP call of `conv2d` or `conv_transpose2d`.
pub(super) fn vjp(op: &Op, call: &Call) -> Result<(), String> {
    let Some(cot) = &call.cotangent else {
        return Err("a VJP call without a cotangent".into());
    };
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    let want = infer_shape(op, &shapes).map_err(|e| format!("the spec refuses the call: {e}"))?;
    expect_shape("the cotangent", cot.shape, &want)?;
    let mut grads = Vec::new();
    for (i, x) in call.inputs.iter().enumerate() {
        match call.grads.get(i) {
            Some(Some(g)) => {
                expect_shape(&format!("gradient {i}"), g.shape, x.shape)?;
                grads.push((i, full(&format!("gradient {i}"), g)?));
            }
            _ if call.needs.get(i) == Some(&true) => {
                return Err(format!("gradient {i} is missing"))
            }
            _ => {}
        }
    }
    let inputs: Vec<_> = call
        .inputs
        .iter()
        .enumerate()
        .map(|(i, o)| full(&format!("input {i}"), o))
        .collect::<Result<_, _>>()?;
    let gy = full("the cotangent", cot)?;
    let mut values: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
    values.push(&gy);
    values.extend(grads.iter().map(|(_, g)| &g[..]));
    if !all_finite(&values) {
        return recompute::whole_vjp(op, call);
    }
    let geo = Geometry::of(op, shapes[0], shapes[1], &want)?;
    let (x, w) = (&inputs[0], &inputs[1]);
    let conv = matches!(op, Op::Conv2d(_));
    for (i, g) in grads {
        let seed = call.seed ^ splitmix64(i as u64 + 11);
        let verdict = match (i, conv) {
            // the input gradient: conv2d's scatters the cotangent, conv_transpose2d's gathers it
            (0, true) => scatter(
                "input gradient",
                &geo,
                &Sides {
                    small: &gy,
                    big: &g,
                    weight: w,
                    bias: None,
                },
                seed,
            ),
            (0, false) => gather(
                "input gradient",
                &geo,
                &Sides {
                    small: &g,
                    big: &gy,
                    weight: w,
                    bias: None,
                },
                seed,
            ),
            (1, true) => weight_gradient(
                &geo,
                &Sides {
                    small: &gy,
                    big: x,
                    weight: &g,
                    bias: None,
                },
                seed,
            ),
            (1, false) => weight_gradient(
                &geo,
                &Sides {
                    small: x,
                    big: &gy,
                    weight: &g,
                    bias: None,
                },
                seed,
            ),
            _ => bias_gradient(&g, &gy, geo.batch, seed),
        };
        match verdict {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => return recompute::whole_vjp(op, call),
        }
    }
    Ok(())
}
