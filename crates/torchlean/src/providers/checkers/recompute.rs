//! Recompute checker: every output (or gradient) of the call recomputed with the f64 spec on
//! the call's own inputs, compared element by element.
//!
//! Bound: each element must be of the spec's class (NaN exactly where the spec is NaN, ±inf
//! of the same sign exactly where the spec has it) and, when finite, within
//! `TOL·(1 + max finite |spec|) + A` of the spec rounded to f32 — the bound the conformance
//! harness holds every kernel to, plus the cancellation allowance `A` of
//! [`spec::cancellation_allowance`] (0 except for sums, mean-subtracting norms, attention,
//! `spectral_conv1d` and `conv2d_map`'s conv sums whose inputs are large against their
//! result, where a correct f32
//! kernel errs by more; the piece
//! checks of `pieces.rs` use A = 0 and hand a failing call to this whole-call check). Where the spec run at f32 lands in another class than at f64
//! (an intermediate that overflows or underflows only in f32), either is accepted; a chain of
//! maps (`fused_unary`, `fused_map`) may also be within the bound of the spec run at f32 step
//! by step, which is what a kernel that rounds its intermediates computes (forward and
//! VJP). An element of a sum of terms ([`sums_of_terms`]: products, sums, means, pools,
//! the gathers' VJPs) may also err by γ_n·Σ|term| (its rounding in any order, Higham Thm
//! 3.5; Σ|term| from the spec on the inputs' magnitudes) or be an infinity (or NaN) that a
//! correct kernel's partial sums reach in some order whatever the exact sum (`overflow.rs`).
//! Cost: one
//! evaluation of the spec at f64 per call (for elementwise maps and reductions, a few passes
//! over the data).

use super::pieces::Tally;
use crate::backend::{Call, Operand};
use crate::graph::Op;
use crate::spec::{self, Array};

/// The declared relative tolerance (relative to 1 + the largest finite |spec value|).
pub const TOL: f64 = 2e-4;

/// An operand's elements when it is dense row-major and inside its storage.
pub(super) fn dense_slice<'a>(o: &Operand<'a>) -> Option<&'a [f32]> {
    let n: usize = o.shape.iter().product();
    let contiguous = o
        .strides
        .is_none_or(|s| s == crate::spec::contiguous_strides(o.shape).as_slice());
    contiguous
        .then(|| o.storage.get(o.offset..o.offset.checked_add(n)?))
        .flatten()
}

/// The row-major values of an operand, at f64. A strided view is read by
/// `layout::read_view`; a dense operand whose storage is short gives the elements it has, and
/// a view that addresses past its storage gives none (the caller's length check rejects
/// both).
pub(super) fn values(o: &Operand) -> Vec<f64> {
    if let Some(d) = dense_slice(o) {
        return d.iter().map(|&v| v as f64).collect();
    }
    let n: usize = o.shape.iter().product();
    match o.strides {
        Some(strides) => {
            super::layout::read_view_as(o.shape, strides, o.offset, o.storage, f64::from)
                .unwrap_or_default()
        }
        None => {
            let rest = o.storage.get(o.offset..).unwrap_or(&[]);
            rest.iter().take(n).map(|&v| v as f64).collect()
        }
    }
}

pub(super) fn array<T: crate::scalar::Scalar>(o: &Operand) -> Array<T> {
    Array {
        shape: o.shape.to_vec(),
        data: values(o).into_iter().map(T::c).collect(),
    }
}

/// The IEEE class of a value, as the recompute bound compares them: NaN and each infinity
/// must match exactly; only finite values are compared by size.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Class {
    Nan,
    PosInf,
    NegInf,
    Finite,
}

/// The [`Class`] of `v`.
pub fn class(v: f64) -> Class {
    if v.is_nan() {
        Class::Nan
    } else if v == f64::INFINITY {
        Class::PosInf
    } else if v == f64::NEG_INFINITY {
        Class::NegInf
    } else {
        Class::Finite
    }
}

/// An operand's elements, row-major (borrowed when dense).
pub(super) fn dense_values<'a>(o: &Operand<'a>) -> std::borrow::Cow<'a, [f32]> {
    match dense_slice(o) {
        Some(d) => std::borrow::Cow::Borrowed(d),
        None => std::borrow::Cow::Owned(values(o).into_iter().map(|v| v as f32).collect()),
    }
}

/// Ops whose every output element (and, `vjp`, every gradient element) is a sum of terms,
/// each a product of input elements with a non-negative coefficient (a mean's 1/n, a
/// pool's 1/divisor): evaluated on the inputs' magnitudes they give each element's Σ|term|.
/// The gathers' VJPs add the cotangent over repeated indices; the sums' and scatter_add's
/// VJPs copy one cotangent element (no sum). Not the spectral op (its DFT coefficients have
/// signs).
fn sums_of_terms(op: &Op, vjp: bool) -> bool {
    use crate::graph::OpKind as K;
    match op.kind() {
        K::Matmul | K::Linear | K::Conv2d | K::ConvTranspose2d | K::AvgPool2d => true,
        K::SumAll | K::ReduceSum | K::ReduceMean | K::ScatterAdd => !vjp,
        K::Gather | K::IndexSelect => vjp,
        // the gradient of a broadcast operand sums the cotangent (times the other operand,
        // for mul) over the broadcast axes, and `broadcast_to`'s likewise; sub's second
        // gradient is that sum negated, so the magnitudes are taken of the spec's result
        // (a cotangent [1e8, 1, -1e8] sums to 0 in f32 against an exact 1: an audit of the
        // forty-fifth session). Their VJPs do not read the output; `where` keeps its
        // condition (`index_operand`).
        K::Add | K::Sub | K::Mul | K::Where | K::BroadcastTo => vjp,
        _ => false,
    }
}

/// The operand's values as magnitudes (index operands are non-negative: unchanged).
fn magnitudes(o: &Operand) -> Array<f64> {
    let mut a: Array<f64> = array(o);
    a.data.iter_mut().for_each(|v| *v = v.abs());
    a
}

/// Per element of a sum of terms: Σ|term| (the spec on the inputs' magnitudes), its number
/// of terms n (the spec on ones), and the divisor by which its partial sums can exceed
/// Σ|term| before a mean's or pool's division (1 otherwise).
struct Magnitudes {
    sums: Vec<f64>,
    terms: Vec<f64>,
    divisors: Vec<f64>,
    /// When an input holds an infinity (forward only): per element, the positive and the
    /// negative finite terms' magnitudes (the spec on the inputs with infinities zeroed,
    /// as magnitudes and signed), for the NaN an infinite term meets (overflow.rs).
    finite: Option<(Vec<f64>, Vec<f64>)>,
}

/// The operands an op reads as indices (kept as they are when the others become ones).
fn index_operand(op: &Op, i: usize) -> bool {
    use crate::graph::OpKind as K;
    match op.kind() {
        K::Gather | K::IndexSelect | K::ScatterAdd => i == 1,
        // the condition selects which terms a gradient sums
        K::Where => i == 0,
        _ => false,
    }
}

/// The call's inputs as arrays of magnitudes, or (`ones`) of ones except index operands.
fn inputs_as(op: &Op, call: &Call, ones: bool) -> Vec<Array<f64>> {
    call.inputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let mut a = magnitudes(o);
            if ones && !index_operand(op, i) {
                a.data.iter_mut().for_each(|v| *v = 1.0);
            }
            a
        })
        .collect()
}

fn ones_like(shape: &[usize]) -> Array<f64> {
    Array {
        shape: shape.to_vec(),
        data: vec![1.0; shape.iter().product()],
    }
}

impl Magnitudes {
    /// The forward's ([`sums_of_terms`] ops only).
    fn forward(op: &Op, call: &Call) -> Option<Magnitudes> {
        let eval = |ones: bool| {
            let xs = inputs_as(op, call, ones);
            spec::forward(op, &xs.iter().collect::<Vec<_>>())
                .ok()
                .map(|a| a.data)
        };
        let sums = eval(false)?;
        let len = sums.len();
        let (terms, divisors) = match op {
            // a mean's element: the reduced count of terms, divided by it
            Op::ReduceMean { .. } => {
                let numel = |s: &[usize]| s.iter().product::<usize>();
                let n = (numel(call.inputs[0].shape) / numel(call.output.shape).max(1)).max(1);
                (vec![n as f64; len], vec![n as f64; len])
            }
            // a window's element: at most its taps, divided by its divisor (the taps inside
            // the input when the padding is not counted: the padded pool's mean of ones
            // times the window)
            Op::AvgPool2d {
                geometry,
                count_include_pad,
            } => {
                let area = (geometry.kernel[0] * geometry.kernel[1]) as f64;
                let divisors = if *count_include_pad {
                    vec![area; len]
                } else {
                    let padded = Op::AvgPool2d {
                        geometry: *geometry,
                        count_include_pad: true,
                    };
                    let xs = inputs_as(op, call, true);
                    let share = spec::forward(&padded, &xs.iter().collect::<Vec<_>>()).ok()?;
                    share.data.iter().map(|s| (s * area).round()).collect()
                };
                (vec![area; len], divisors)
            }
            // every other op sums its terms with coefficient 1: the spec on ones counts them
            _ => (eval(true)?, vec![1.0; len]),
        };
        // with an infinity among the inputs: the finite terms' two signs apart
        let finite = call
            .inputs
            .iter()
            .any(|o| array(o).data.iter().any(|v: &f64| v.is_infinite()))
            .then(|| {
                let zeroed = |abs: bool| {
                    let xs: Vec<Array<f64>> = call
                        .inputs
                        .iter()
                        .enumerate()
                        .map(|(i, o)| {
                            let mut a = array(o);
                            if !index_operand(op, i) {
                                a.data.iter_mut().for_each(|v: &mut f64| {
                                    *v = if v.is_infinite() {
                                        0.0
                                    } else if abs {
                                        v.abs()
                                    } else {
                                        *v
                                    }
                                });
                            }
                            a
                        })
                        .collect();
                    spec::forward(op, &xs.iter().collect::<Vec<_>>())
                        .ok()
                        .map(|a| a.data)
                };
                let (all, signed) = (zeroed(true)?, zeroed(false)?);
                let pos = all
                    .iter()
                    .zip(&signed)
                    .map(|(a, s)| ((a + s) / 2.0).max(0.0))
                    .collect();
                let neg = all
                    .iter()
                    .zip(&signed)
                    .map(|(a, s)| ((a - s) / 2.0).max(0.0))
                    .collect();
                Some((pos, neg))
            })
            .flatten();
        Some(Magnitudes {
            sums,
            terms,
            divisors,
            finite,
        })
    }

    /// Gradient `i`'s ([`sums_of_terms`] ops only; their VJPs do not read the output).
    fn vjp(op: &Op, call: &Call, i: usize) -> Option<Magnitudes> {
        let cot = call.cotangent.as_ref()?;
        let eval = |ones: bool| {
            let xs = inputs_as(op, call, ones);
            let (y, g) = if ones {
                (ones_like(call.output.shape), ones_like(cot.shape))
            } else {
                (magnitudes(&call.output), magnitudes(cot))
            };
            spec::vjp(op, &xs.iter().collect::<Vec<_>>(), &y, &g)
                .ok()
                .and_then(|gs| gs.into_iter().nth(i).flatten())
                // a negated sum (sub's second gradient) counts its terms' magnitudes
                .map(|a| a.data.into_iter().map(f64::abs).collect::<Vec<_>>())
        };
        let sums = eval(false)?;
        let len = sums.len();
        let terms = match op {
            // each input element is in at most a window's count of windows; the kernels
            // divide each term before adding (divisor 1)
            Op::AvgPool2d { geometry, .. } => {
                vec![(geometry.kernel[0] * geometry.kernel[1]) as f64; len]
            }
            _ => eval(true)?,
        };
        Some(Magnitudes {
            sums,
            terms,
            divisors: vec![1.0; len],
            finite: None,
        })
    }

    /// Whether `got` is within what a correct f32 summation of element `k`'s n terms gives,
    /// in some order, for the f64 value `exact` beyond the check's `bound`: within
    /// γ_{n+1}·Σ|term| (Higham Thm 3.5; the one more for a mean's or pool's division) plus an
    /// underflow floor, or an infinity (or NaN) its partial sums reach (overflow.rs).
    fn admits(&self, k: usize, got: f64, exact: f64, bound: f64) -> bool {
        let (Some(&total), Some(&terms), Some(&d)) =
            (self.sums.get(k), self.terms.get(k), self.divisors.get(k))
        else {
            return false;
        };
        if !terms.is_finite() || terms < 0.0 {
            return false;
        }
        let n = terms.ceil() as usize;
        if got.is_finite() && exact.is_finite() && total.is_finite() {
            let floor = (n as f64 + 1.0) * f32::MIN_POSITIVE as f64;
            return (got - exact).abs() <= bound + super::overflow::gamma(n + 1) * total + floor;
        }
        // an infinite term: its infinity is the exact class; NaN where the other sign's
        // finite terms can overflow first
        if exact.is_infinite() {
            if let Some((pos, neg)) = &self.finite {
                let other = if exact > 0.0 { neg.get(k) } else { pos.get(k) };
                return other
                    .is_some_and(|&o| super::overflow::nan_beside_an_infinity(got, o * d, n));
            }
        }
        let (pos, neg) = ((total + exact) / 2.0, (total - exact) / 2.0);
        super::overflow::reachable(got, pos.max(0.0) * d, neg.max(0.0) * d, n)
    }
}

/// Compares the operand `got` with the f64 spec's `want`; `alt` recomputes at f32 when
/// classes differ. An acceptance by the vectorized [`Tally`] is final (same values, same
/// bound); anything else is decided element by element below, which names the element.
fn compare(
    what: &str,
    got: &Operand,
    want: &[f64],
    allowance: impl FnOnce() -> f64,
    alt: impl FnOnce() -> Option<Vec<f64>>,
    stepwise: bool,
    magnitude: impl FnOnce() -> Option<Magnitudes>,
) -> Result<(), String> {
    let got = dense_values(got);
    if got.len() == want.len() {
        let mut t = Tally::default();
        t.feed(&got, want);
        // an acceptance without the allowance (A >= 0) is one with it: A is computed only
        // for the calls that need it
        if t.accepts() {
            return Ok(());
        }
    }
    let allowance = allowance();
    let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, the spec has {}",
            got.len(),
            want.len()
        ));
    }
    let exact = want;
    let want: Vec<f64> = want.iter().map(|&v| v as f32 as f64).collect();
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
    let bound = TOL * scale + allowance;
    let mut alt_values: Option<Option<Vec<f64>>> = None;
    let mut alt = Some(alt);
    let mut magnitude_values: Option<Option<Magnitudes>> = None;
    let mut magnitude = Some(magnitude);
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let ok = |w: f64| match (class(g), class(w)) {
            (Class::Finite, Class::Finite) => (g - w).abs() <= bound,
            (a, b) => a == b,
        };
        if ok(w) {
            continue;
        }
        // `stepwise`: a chain of maps whose intermediates a correct f32 kernel rounds to
        // f32 (fused_unary, fused_map) is also held to the spec evaluated at f32 step by
        // step — where a step is ill-conditioned (cos of x³ ≈ 115420, whose f32 rounding
        // moves the cosine by 4e-3) the f64 value is out of any f32 kernel's reach, and the
        // correct kernel was rejected (an audit of the thirty-eighth session)
        if class(g) != class(w) || stepwise {
            let a = alt_values.get_or_insert_with(|| alt.take().and_then(|f| f()));
            if let Some(a) = a {
                if (class(a[k]) != class(w) || stepwise) && ok(a[k]) {
                    continue;
                }
            }
        }
        // a sum of terms: a correct kernel errs by up to γ_n·Σ|term| in its order (a
        // cancelling sum: [1e8, 1, −1e8] is 0 in f32, 1 exactly; audits of the thirty-ninth
        // session), and its partial sums may overflow whatever the exact value ([3e38, 3e38,
        // −3e38] is +inf left to right): Magnitudes::admits
        let m = magnitude_values.get_or_insert_with(|| magnitude.take().and_then(|f| f()));
        if m.as_ref().is_some_and(|m| m.admits(k, g, exact[k], bound)) {
            continue;
        }
        return Err(format!(
            "{what}: element {k} is {g}, the f64 spec gives {w} (allowed error {bound:e})"
        ));
    }
    Ok(())
}

/// Recomputes the forward output with the spec at f64.
/// Ops that only move data are compared exactly (see `layout.rs`), ops that act on the rows
/// of their leading axis independently are checked piece by piece (see `pieces.rs`; layer
/// and RMS norm eight rows at a time, `norm.rs`), with the same verdict.
pub(super) fn forward(op: &Op, call: &Call) -> Result<(), String> {
    if let Some(verdict) =
        super::optim::forward(op, call).or_else(|| super::rounded::forward(op, call))
    {
        return verdict;
    }
    super::layout::forward(op, call)
        .or_else(|| super::attention::forward(op, call))
        .or_else(|| super::norm::forward(op, call))
        .or_else(|| super::pieces::forward(op, call))
        .unwrap_or_else(|| whole_forward(op, call))
}

/// The forward check on the whole call at once.
pub(super) fn whole_forward(op: &Op, call: &Call) -> Result<(), String> {
    // the optimizer maps' bound and the same-shape binary maps' are per element (optim.rs,
    // rounded.rs): the same check whole or in parts
    if let Some(verdict) =
        super::optim::forward(op, call).or_else(|| super::rounded::forward(op, call))
    {
        return verdict;
    }
    let xs: Vec<Array<f64>> = call.inputs.iter().map(array).collect();
    let refs: Vec<&Array<f64>> = xs.iter().collect();
    let want = spec::forward(op, &refs).map_err(|e| format!("the spec refuses the call: {e}"))?;
    if want.shape != call.output.shape {
        return Err(format!(
            "result shape {:?}, the spec gives {:?}",
            call.output.shape, want.shape
        ));
    }
    let alt = || {
        let xs: Vec<Array<f32>> = call.inputs.iter().map(array).collect();
        let refs: Vec<&Array<f32>> = xs.iter().collect();
        spec::forward(op, &refs)
            .ok()
            .map(|a| a.data.iter().map(|&v| v as f64).collect())
    };
    let allowance = || {
        spec::cancellation_allowance(op, &refs, None)
            .first()
            .copied()
            .unwrap_or(0.0)
    };
    let stepwise = matches!(
        op.kind(),
        crate::graph::OpKind::FusedUnary | crate::graph::OpKind::FusedMap
    );
    let magnitude = || {
        sums_of_terms(op, false)
            .then(|| Magnitudes::forward(op, call))
            .flatten()
    };
    compare(
        "result",
        &call.output,
        &want.data,
        allowance,
        alt,
        stepwise,
        magnitude,
    )
}

/// Recomputes every gradient with the spec VJP at f64.
pub(super) fn vjp(op: &Op, call: &Call) -> Result<(), String> {
    super::layout::vjp(op, call)
        .or_else(|| super::attention::vjp(op, call))
        .or_else(|| super::norm::vjp(op, call))
        .or_else(|| super::pieces::vjp(op, call))
        .unwrap_or_else(|| whole_vjp(op, call))
}

/// The VJP check on the whole call at once.
pub(super) fn whole_vjp(op: &Op, call: &Call) -> Result<(), String> {
    let Some(cot) = &call.cotangent else {
        return Err("a VJP call without a cotangent".into());
    };
    let xs: Vec<Array<f64>> = call.inputs.iter().map(array).collect();
    let refs: Vec<&Array<f64>> = xs.iter().collect();
    let want = spec::vjp(op, &refs, &array(&call.output), &array(cot))
        .map_err(|e| format!("the spec refuses the call: {e}"))?;
    if call.grads.len() != want.len() {
        return Err(format!(
            "{} gradients, the spec has {}",
            call.grads.len(),
            want.len()
        ));
    }
    let stepwise = matches!(
        op.kind(),
        crate::graph::OpKind::FusedUnary | crate::graph::OpKind::FusedMap
    );
    let allowances = std::cell::OnceCell::new();
    let allowance = |i: usize| {
        allowances
            .get_or_init(|| spec::cancellation_allowance(op, &refs, Some(&array(cot))))
            .get(i)
            .copied()
            .unwrap_or(0.0)
    };
    for (i, (got, want)) in call.grads.iter().zip(&want).enumerate() {
        match (got, want) {
            (Some(g), Some(w)) => {
                if g.shape != w.shape.as_slice() {
                    return Err(format!(
                        "gradient {i} has shape {:?}, the spec's {:?}",
                        g.shape, w.shape
                    ));
                }
                let alt = || {
                    let xs: Vec<Array<f32>> = call.inputs.iter().map(array).collect();
                    let refs: Vec<&Array<f32>> = xs.iter().collect();
                    spec::vjp(op, &refs, &array(&call.output), &array(cot))
                        .ok()
                        .and_then(|gs| gs.into_iter().nth(i).flatten())
                        .map(|a| a.data.iter().map(|&v| v as f64).collect())
                };
                let magnitude = || {
                    sums_of_terms(op, true)
                        .then(|| Magnitudes::vjp(op, call, i))
                        .flatten()
                };
                // a chain of maps: also the spec at f32 step by step (as the forward)
                compare(
                    &format!("gradient {i}"),
                    g,
                    &w.data,
                    || allowance(i),
                    alt,
                    stepwise,
                    magnitude,
                )?;
            }
            (None, Some(_)) if call.needs.get(i) == Some(&true) => {
                return Err(format!("gradient {i} is missing, the spec has one"));
            }
            // `None` for an input that needed no gradient; a gradient the spec lacks (an
            // index input) is ignored by the runtime
            (None, _) | (Some(_), None) => {}
        }
    }
    Ok(())
}
