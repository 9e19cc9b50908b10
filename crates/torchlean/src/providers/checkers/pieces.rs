//! The recompute check of [`super::recompute`], run piece by piece.
//!
//! Many ops act independently on the rows of their leading axis: elementwise maps (on every
//! element), softmax over a later axis, layer and RMS norm over the last axis, attention over
//! its batch and head axes. For those, the spec applied to a block of rows gives exactly the
//! rows of the spec applied to the whole call, so the checker evaluates the spec at f64 on
//! blocks of about [`PIECE`] elements: no full-size f64 copies of the operands (the cost of the
//! whole-call check was mostly allocating and faulting them in), pieces in parallel, and the
//! comparison streamed into a [`Tally`] per compared tensor. Inputs that do not vary along the
//! split axis (norm weights, a broadcast operand, a shared mask) are passed whole to every
//! piece; their gradients are the sum over pieces of each piece's gradient, summed at f64.
//!
//! An acceptance here is the whole-call check's acceptance: the same f64 spec values, the
//! same bound `TOL·(1 + max finite |spec|)` per compared tensor. Anything else — an element
//! outside the bound, a value in another IEEE class than the spec's (where the whole-call
//! check consults its f32 fallback), an operand that is not dense — answers `None`, and the
//! caller runs the whole-call check, which decides and names the element.

use super::recompute::{dense_slice as dense, TOL};
use crate::backend::{Call, Operand};
use crate::graph::{AttentionMask, Op, OpKind};
use crate::spec::{self, Array};

/// Elements per piece (of the largest split operand): small enough to stay in cache.
const PIECE: usize = 1 << 13;

/// Calls with at least this many elements check their pieces on several threads.
const PAR_ELEMENTS: usize = 1 << 15;

/// How a call splits: `rows` along the leading axis (or over every element, `flat`), and
/// which inputs are split (the others are passed whole to each piece).
struct Split {
    rows: usize,
    flat: bool,
    split: Vec<bool>,
}

fn rank_and_lead(o: &Operand) -> (usize, usize) {
    (o.shape.len(), o.shape.first().copied().unwrap_or(1))
}

/// The split of `call`, when `op` acts independently on the rows of its leading axis.
fn split(op: &Op, call: &Call) -> Option<Split> {
    let out = call.output.shape;
    let n_in = call.inputs.len();
    let same_shape = call.inputs.iter().all(|x| x.shape == out);
    let kind = op.kind();
    let elementwise = kind.is_unary_map()
        || kind.is_binary_map()
        || kind.is_optimizer_map()
        || matches!(kind, OpKind::FusedUnary | OpKind::FusedMap | OpKind::Where);
    if elementwise && same_shape && n_in >= 1 {
        let rows = out.iter().product();
        return Some(Split {
            rows,
            flat: true,
            split: vec![true; n_in],
        });
    }
    let (rank, lead) = (out.len(), out.first().copied().unwrap_or(1));
    if rank < 2 || lead < 2 {
        return None;
    }
    let split: Vec<bool> = match op {
        // broadcasting: an operand of full rank and full leading axis is split; one of lower
        // rank, or with a leading axis of 1, does not vary along the split axis
        _ if elementwise => {
            let mut split = Vec::with_capacity(n_in);
            for x in call.inputs {
                let (r, l) = rank_and_lead(x);
                if r == rank && l == lead {
                    split.push(true);
                } else if r < rank || l == 1 {
                    split.push(false);
                } else {
                    return None;
                }
            }
            split
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } if *axis > 0 => vec![true],
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let mut s = vec![false; n_in];
            s[0] = true;
            s
        }
        Op::ScaledDotProductAttention { mask, .. } if rank >= 3 => {
            let mut s = vec![true; 3];
            if *mask != AttentionMask::None {
                s.push(call.inputs.get(3)?.shape.len() == rank);
            }
            s
        }
        _ => return None,
    };
    if split.len() != n_in {
        return None;
    }
    Some(Split {
        rows: lead,
        flat: false,
        split,
    })
}

/// A dense operand, for slicing into pieces.
struct Dense<'a> {
    shape: &'a [usize],
    data: &'a [f32],
}

impl Dense<'_> {
    /// Rows `lo..hi` of the leading axis (of the flat view when `flat`) at f64.
    fn piece(&self, flat: bool, lo: usize, hi: usize) -> Array<f64> {
        let row = if flat {
            1
        } else {
            self.shape[1..].iter().product()
        };
        let mut shape = if flat {
            vec![self.data.len()]
        } else {
            self.shape.to_vec()
        };
        shape[0] = hi - lo;
        Array {
            shape,
            data: self.data[lo * row..hi * row]
                .iter()
                .map(|&v| v as f64)
                .collect(),
        }
    }
    fn whole(&self) -> Array<f64> {
        Array {
            shape: self.shape.to_vec(),
            data: self.data.iter().map(|&v| v as f64).collect(),
        }
    }
}

fn dense_operand<'a>(o: &Operand<'a>) -> Option<Dense<'a>> {
    Some(Dense {
        shape: o.shape,
        data: dense(o)?,
    })
}

/// The running comparison of one tensor against the spec: the largest error between finite
/// values, the largest finite |spec| (for the bound), and whether any element is of another
/// IEEE class than the spec's. It keeps no positions: a failing verdict is handed to the
/// whole-call check, which names the element (rejections are rare; acceptance is the hot
/// path, and this loop vectorizes).
#[derive(Clone, Copy, Default)]
pub(super) struct Tally {
    err: f64,
    scale: f64,
    other_class: bool,
    /// The largest error bound of approximate reference values fed (`feed_approx32`): 0 when
    /// every reference value was the spec's own.
    slack: f64,
}

/// A reference value as [`Tally`] compares it: rounded to f32 for the lanes, and at f64 for
/// the element-by-element classification (which rounds it to f32 again).
trait Reference: Copy {
    fn rounded(self) -> f32;
    fn wide(self) -> f64;
}

impl Reference for f64 {
    #[inline(always)]
    fn rounded(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
}

impl Reference for f32 {
    #[inline(always)]
    fn rounded(self) -> f32 {
        self
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        self as f64
    }
}

impl Tally {
    /// A tally that never accepts (the whole-call check then decides).
    pub(super) fn rejecting() -> Tally {
        Tally {
            other_class: true,
            ..Tally::default()
        }
    }
    /// Compares `got` with the spec's `want` (rounded to f32 first, as the whole-call check
    /// does). The common case — every value finite — runs in f32 lanes: the largest
    /// `fl(|g − w|)` is inflated by (1 + 2^-23) into an upper bound of the true largest
    /// error (one f32 subtraction errs by at most 2^-24 relative), and `g·0 + w·0`,
    /// 0 for finite values and NaN otherwise, detects the rest; a block with a non-finite
    /// value makes the whole slice classified element by element at f64.
    pub(super) fn feed(&mut self, got: &[f32], want: &[f64]) {
        self.feed_refs(got, want);
    }
    /// [`Tally::feed`] for reference values that are f32 already (the same comparison: `feed`
    /// rounds its f64 references to f32 first).
    pub(super) fn feed32(&mut self, got: &[f32], want: &[f32]) {
        self.feed_refs(got, want);
    }
    /// [`Tally::feed`] over references of either width (monomorphized, so each loop
    /// vectorizes as written; on 512-bit vectors where the CPU has them: `crate::wide`).
    fn feed_refs<T: Reference>(&mut self, got: &[f32], want: &[T]) {
        crate::wide::wide!(self.feed_lanes(got, want))
    }
    #[inline(always)]
    fn feed_lanes<T: Reference>(&mut self, got: &[f32], want: &[T]) {
        const L: usize = 8;
        let n = got.len().min(want.len());
        let whole = n / L * L;
        let (mut err, mut scale, mut poison) = ([0.0f32; L], [0.0f32; L], [0.0f32; L]);
        for (gc, wc) in got[..whole]
            .chunks_exact(L)
            .zip(want[..whole].chunks_exact(L))
        {
            for l in 0..L {
                let (g, w) = (gc[l], wc[l].rounded());
                let e = (g - w).abs();
                err[l] = if e > err[l] { e } else { err[l] };
                let a = w.abs();
                scale[l] = if a > scale[l] { a } else { scale[l] };
                poison[l] += g * 0.0 + w * 0.0;
            }
        }
        let wide = |w: &[T]| -> Vec<f64> { w.iter().map(|v| v.wide()).collect() };
        if poison.iter().all(|p| *p == 0.0) {
            let e = err.iter().fold(0.0f32, |m, &v| m.max(v)) as f64;
            self.err = self.err.max(e * (1.0 + f32::EPSILON as f64));
            self.scale = self
                .scale
                .max(scale.iter().fold(0.0f32, |m, &v| m.max(v)) as f64);
        } else {
            self.classify(&got[..whole], &wide(&want[..whole]));
        }
        self.classify(&got[whole..n], &wide(&want[whole..n]));
    }
    /// [`Tally::feed32`] with reference values `want` that are within `delta` of the spec's
    /// (an approximation with a proven error bound, e.g. `checkers/gelu.rs`); [`accepts`]
    /// then tightens the bound so that an acceptance still implies the spec's verdict.
    ///
    /// [`accepts`]: Tally::accepts
    ///
    /// A chunk whose references are not all finite, or come within `delta` of the f32 range,
    /// makes the tally reject (the spec's own formula then decides): there the reference's
    /// IEEE class could differ from the spec's, which the slack does not cover.
    pub(super) fn feed_approx32(&mut self, got: &[f32], want: &[f32], delta: f64) {
        self.slack = self.slack.max(delta);
        self.feed32(got, want);
        // w·0 is 0 for a finite w and NaN otherwise; or-ed in lanes (a sequential sum of
        // them is one dependent addition per element)
        let poison = crate::wide::wide!({
            want.chunks(16).fold(false, |p, c| {
                p | c.iter().fold(false, |q, &w| q | (w * 0.0 != 0.0))
            })
        });
        if poison || self.scale + delta >= f32::MAX as f64 {
            self.other_class = true;
        }
    }
    /// The element-by-element comparison at f64, with IEEE classes.
    fn classify(&mut self, got: &[f32], want: &[f64]) {
        for (&g, &w) in got.iter().zip(want) {
            let (g, w) = (g as f64, w as f32 as f64);
            let finite = g.is_finite() && w.is_finite();
            if finite {
                self.err = self.err.max((g - w).abs());
            }
            if w.is_finite() {
                self.scale = self.scale.max(w.abs());
            }
            // same class: both finite, both NaN, or the same infinity
            self.other_class |= !(finite || (g.is_nan() && w.is_nan()) || g == w);
        }
    }
    /// The largest error, the slack and the scale (tests of the reference values' bounds).
    #[cfg(test)]
    pub(super) fn parts(&self) -> (f64, f64, f64) {
        (self.err, self.slack, self.scale)
    }
    /// Merges a tally of another part of the same tensor.
    pub(super) fn merge(&mut self, o: &Tally) {
        self.scale = self.scale.max(o.scale);
        self.err = self.err.max(o.err);
        self.other_class |= o.other_class;
        self.slack = self.slack.max(o.slack);
    }
    /// True when every element is of the spec's class and within the bound; otherwise the
    /// whole-call check decides (and words the rejection).
    ///
    /// With approximate reference values (slack δ > 0): each compared value fl32(w') may
    /// differ from the spec's fl32(w) by at most ρ = δ + 2⁻²²·(S' + δ) (|w' − w| ≤ δ, plus
    /// half an f32 ulp of each), so the spec's error is at most err + ρ and its scale at least
    /// S' − ρ; accepting only when err + ρ ≤ TOL·(1 + S' − ρ) implies the spec's acceptance.
    pub(super) fn accepts(&self) -> bool {
        let rho = if self.slack > 0.0 {
            self.slack + (self.scale + self.slack) / (1u64 << 22) as f64
        } else {
            0.0
        };
        !self.other_class && self.err + rho <= TOL * (1.0 + self.scale - rho)
    }
}

/// Runs `piece(lo, hi)` over row blocks of `rows`, in parallel when the call is large.
pub(super) fn over_pieces<R: Send>(
    rows: usize,
    row_len: usize,
    piece: impl Fn(usize, usize) -> Result<R, String> + Sync,
) -> Result<Vec<R>, String> {
    use rayon::prelude::*;
    let per = (PIECE / row_len.max(1)).max(1);
    let starts: Vec<usize> = (0..rows).step_by(per).collect();
    let run = |&lo: &usize| piece(lo, (lo + per).min(rows));
    if rows * row_len >= PAR_ELEMENTS {
        starts.par_iter().map(run).collect()
    } else {
        starts.iter().map(run).collect()
    }
}

/// The inputs of one piece: split inputs sliced, the others whole (converted once).
fn piece_inputs(
    s: &Split,
    inputs: &[Dense],
    whole: &[Option<Array<f64>>],
    lo: usize,
    hi: usize,
) -> Vec<Array<f64>> {
    inputs
        .iter()
        .zip(&s.split)
        .zip(whole)
        .map(|((x, &sp), w)| match (sp, w) {
            (false, Some(w)) => w.clone(),
            _ => x.piece(s.flat, lo, hi),
        })
        .collect()
}

struct Prepared<'a> {
    split: Split,
    inputs: Vec<Dense<'a>>,
    whole: Vec<Option<Array<f64>>>,
    row_len: usize,
}

fn prepare<'a>(op: &Op, call: &Call<'a>) -> Option<Prepared<'a>> {
    let split = split(op, call)?;
    let inputs: Vec<Dense> = call
        .inputs
        .iter()
        .map(dense_operand)
        .collect::<Option<_>>()?;
    let whole = inputs
        .iter()
        .zip(&split.split)
        .map(|(x, &sp)| (!sp).then(|| x.whole()))
        .collect();
    let out: usize = call.output.shape.iter().product();
    let row_len = if split.flat {
        1
    } else {
        out / split.rows.max(1)
    };
    Some(Prepared {
        split,
        inputs,
        whole,
        row_len,
    })
}

/// The forward check piece by piece; `None`: the whole-call check decides.
pub(super) fn forward(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if op.kind().is_unary_map() {
        let (x, y) = (call.inputs.first()?, &call.output);
        if x.shape != y.shape {
            return None;
        }
        let t = super::unary::forward(op, dense(x)?, dense(y)?)?;
        return t.accepts().then_some(Ok(()));
    }
    if let Some(t) = super::maps::reduction_forward(op, call) {
        return t.accepts().then_some(Ok(()));
    }
    let p = prepare(op, call)?;
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    if spec::infer_shape(op, &shapes).ok()?.as_slice() != call.output.shape {
        return None;
    }
    let out = dense_operand(&call.output)?;
    let s = &p.split;
    let tallies = over_pieces(s.rows, p.row_len, |lo, hi| {
        let xs = piece_inputs(s, &p.inputs, &p.whole, lo, hi);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let want =
            spec::forward(op, &refs).map_err(|e| format!("the spec refuses the call: {e}"))?;
        let mut t = Tally::default();
        let (a, b) = (lo * p.row_len, hi * p.row_len);
        t.feed(&out.data[a..b], &want.data);
        Ok(t)
    });
    let tallies = match tallies {
        Ok(t) => t,
        Err(e) => return Some(Err(e)),
    };
    let mut total = Tally::default();
    for t in &tallies {
        total.merge(t);
    }
    total.accepts().then_some(Ok(()))
}

/// What one piece of a VJP check found: a tally per split gradient, the spec's gradient of
/// each shared input (to be summed), and a gradient the kernel did not return.
struct VjpPiece {
    tallies: Vec<Tally>,
    shared: Vec<Option<Vec<f64>>>,
}

/// The VJP check piece by piece; `None`: the whole-call check decides.
pub(super) fn vjp(op: &Op, call: &Call) -> Option<Result<(), String>> {
    if op.kind().is_unary_map() {
        let (x, y, gy) = (call.inputs.first()?, &call.output, call.cotangent.as_ref()?);
        let gx = call.grads.first()?.as_ref()?;
        if x.shape != y.shape || gy.shape != y.shape || gx.shape != x.shape {
            return None;
        }
        let (x, y, gy, gx) = (dense(x)?, dense(y)?, dense(gy)?, dense(gx)?);
        let t = super::unary::vjp(op, x, y, gy, gx)?;
        return t.accepts().then_some(Ok(()));
    }
    if let Some(tallies) = super::maps::vjp(op, call) {
        return tallies.iter().all(Tally::accepts).then_some(Ok(()));
    }
    let p = prepare(op, call)?;
    let cot = dense_operand(call.cotangent.as_ref()?)?;
    let out = dense_operand(&call.output)?;
    if call.grads.len() != call.inputs.len() {
        return None;
    }
    let mut got: Vec<Option<Dense>> = Vec::with_capacity(call.grads.len());
    for (g, x) in call.grads.iter().zip(call.inputs) {
        match g {
            Some(g) if g.shape == x.shape => got.push(Some(dense_operand(g)?)),
            Some(_) => return None,
            None => got.push(None),
        }
    }
    let s = &p.split;
    let n_in = call.inputs.len();
    let pieces = over_pieces(s.rows, p.row_len, |lo, hi| {
        let xs = piece_inputs(s, &p.inputs, &p.whole, lo, hi);
        let refs: Vec<&Array<f64>> = xs.iter().collect();
        let (y, gy) = (out.piece(s.flat, lo, hi), cot.piece(s.flat, lo, hi));
        let want =
            spec::vjp(op, &refs, &y, &gy).map_err(|e| format!("the spec refuses the call: {e}"))?;
        let mut piece = VjpPiece {
            tallies: vec![Tally::default(); n_in],
            shared: vec![None; n_in],
        };
        for (i, w) in want.into_iter().enumerate().take(n_in) {
            let Some(w) = w else { continue };
            match &got[i] {
                None if call.needs.get(i) == Some(&true) => {
                    return Err(format!("gradient {i} is missing, the spec has one"));
                }
                None => {}
                Some(_) if !s.split[i] => piece.shared[i] = Some(w.data),
                Some(g) => {
                    let row = if s.flat {
                        1
                    } else {
                        g.shape[1..].iter().product()
                    };
                    let (a, b) = (lo * row, hi * row);
                    piece.tallies[i].feed(&g.data[a..b], &w.data);
                }
            }
        }
        Ok(piece)
    });
    let pieces = match pieces {
        Ok(p) => p,
        Err(e) => return Some(Err(e)),
    };
    for (i, g) in got.iter().enumerate() {
        let Some(g) = g else { continue };
        let mut total = Tally::default();
        if s.split[i] {
            for piece in &pieces {
                total.merge(&piece.tallies[i]);
            }
        } else {
            let mut sum: Option<Vec<f64>> = None;
            for part in pieces.iter().filter_map(|p| p.shared[i].as_ref()) {
                match &mut sum {
                    None => sum = Some(part.clone()),
                    Some(acc) => acc.iter_mut().zip(part).for_each(|(a, v)| *a += v),
                }
            }
            // the spec gives this input no gradient (an index input): nothing to compare
            let Some(sum) = sum else { continue };
            total.feed(g.data, &sum);
        }
        if !total.accepts() {
            return None;
        }
    }
    Some(Ok(()))
}
