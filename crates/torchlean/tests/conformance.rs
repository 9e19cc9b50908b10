//! The conformance harness (DESIGN §6): one table (tests/common.rs), every op × provider.
//!
//! For every row: provider forward vs the f64 spec; provider VJP vs the f64 spec VJP (with
//! every input needed, and with each input needed alone); and the f64 spec VJP vs central
//! finite differences of the f64 spec forward. The special-value rows (tests/common.rs) run
//! the first two with NaN, ±inf, ±0 and subnormals in the inputs: NaN must appear exactly where
//! the spec's is, infinities exactly where the spec's are and of their sign, finite values
//! within the usual tolerance ([`compare`]). A provider's kernel variants are checked against
//! its own tensor kernels, bit for bit: the in-place kernel on every one-input row (owned and
//! shared inputs), the destination-passing kernels on garbage-filled buffers.
//!
//! The checks are functions of a binding ([`check_forward`], [`check_vjp`],
//! [`check_in_place`], [`check_dense_forward`], [`check_dense_vjp`]) that return a [`Report`]
//! (the rows they ran and every failure) instead of panicking. The provider tests assert the
//! report is clean and covers every op the provider claims; the mutation tests (`harness_catches_*`)
//! bind deliberately wrong kernels (the native ones, corrupted) and assert the harness reports
//! exactly the rows the mutant corrupted. A `test_suite` evidence item citing this file is as
//! strong as those mutation tests show the harness to be.

mod common;

mod support;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::sync::OnceLock;

use common::{cases, compare, draw, table, uncovered_kinds, Case, Gen, F32_TOL};
use rayon::prelude::*;
use torchlean::runtime::kernel::{Dense, DenseKernels, KernelBinding};
use torchlean::spec::{self, Array};
use torchlean::{providers, Op, OpKind, Tensor};

/// Bound for the f64 spec VJP against central differences.
const FD_TOL: f64 = 1e-5;

fn inputs_of(case: &Case, index: usize) -> Vec<Array<f64>> {
    (0..case.inputs.len())
        .map(|j| case.input(index, j))
        .collect()
}

/// `a` rounded to f32, as the spec's scalar.
fn to_f32(a: &Array<f64>) -> Array<f32> {
    Array {
        shape: a.shape.clone(),
        data: a.data.iter().map(|&v| v as f32).collect(),
    }
}

fn widen(a: &Array<f32>) -> Vec<f64> {
    a.data.iter().map(|&v| v as f64).collect()
}

/// Values equal bit for bit, except that any NaN equals any NaN (two kernels on one path).
fn same_values(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn to_tensor(a: &Array<f64>) -> Tensor {
    Tensor::from_vec(a.data.iter().map(|&v| v as f32).collect(), &a.shape)
        .expect("shape matches data")
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    t.to_vec().into_iter().map(f64::from).collect()
}

fn providers_under_test() -> Vec<(&'static str, KernelBinding)> {
    vec![
        ("reference", providers::reference::binding()),
        ("native_cpu", providers::native_cpu::binding()),
        ("torchlean", providers::composition::binding()),
    ]
}

/// A cotangent for the output of a case.
fn cotangent(shape: &[usize], index: usize) -> Array<f64> {
    draw(shape, Gen::Normal, 10_000 + index as u64)
}

// ---------------------------------------------------------------------------------------
// The spec side of every row, computed once for every check of the binary.
// ---------------------------------------------------------------------------------------

/// One row of the table with its f64 spec results.
struct Row {
    index: usize,
    case: Case,
    inputs: Vec<Array<f64>>,
    /// The spec's forward value.
    want: Array<f64>,
    /// The spec at f32 (special-value rows only; see [`compare`]).
    alt: Option<Vec<f64>>,
    /// The output cotangent.
    gy: Array<f64>,
    /// The spec's cotangents, one per input (differentiable ops only).
    grads: Option<Vec<Option<Array<f64>>>>,
    /// The spec's cotangents at f32 (differentiable special-value rows only).
    grads_alt: Option<Vec<Option<Vec<f64>>>>,
}

impl Row {
    fn new(index: usize, case: Case) -> Row {
        let inputs = inputs_of(&case, index);
        let refs: Vec<&Array<f64>> = inputs.iter().collect();
        let want = spec::forward(&case.op, &refs)
            .unwrap_or_else(|e| panic!("spec rejected {}: {e}", case.name()));
        let x32: Vec<Array<f32>> = inputs.iter().map(to_f32).collect();
        let r32: Vec<&Array<f32>> = x32.iter().collect();
        let y32 = case
            .special
            .then(|| spec::forward(&case.op, &r32).expect("spec at f32"));
        let gy = cotangent(&want.shape, index);
        let differentiable = case.op.kind().differentiable();
        let grads = differentiable.then(|| {
            let g = spec::vjp(&case.op, &refs, &want, &gy)
                .unwrap_or_else(|e| panic!("spec vjp rejected {}: {e}", case.name()));
            assert_eq!(g.len(), inputs.len(), "spec vjp of {}", case.name());
            g
        });
        let grads_alt = match (&y32, differentiable) {
            (Some(y32), true) => {
                let g32 = spec::vjp(&case.op, &r32, y32, &to_f32(&gy)).expect("spec vjp at f32");
                Some(g32.iter().map(|g| g.as_ref().map(widen)).collect())
            }
            _ => None,
        };
        Row {
            index,
            inputs,
            want,
            alt: y32.as_ref().map(widen),
            gy,
            grads,
            grads_alt,
            case,
        }
    }

    fn name(&self) -> String {
        self.case.name()
    }

    fn kind(&self) -> OpKind {
        self.case.op.kind()
    }

    fn tensors(&self) -> Vec<Tensor> {
        self.inputs.iter().map(to_tensor).collect()
    }
}

/// Every row of [`table`] with its spec results (computed on first use, in parallel).
fn rows() -> &'static [Row] {
    static ROWS: OnceLock<Vec<Row>> = OnceLock::new();
    ROWS.get_or_init(|| {
        table()
            .into_par_iter()
            .enumerate()
            .map(|(i, case)| Row::new(i, case))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------
// The checking core: functions of a binding that return what they found.
// ---------------------------------------------------------------------------------------

/// How a check gets the binding of an op kind (a provider binds one per capsule; the native
/// provider's differ by their destination-passing kernels).
type Bind<'a> = &'a dyn Fn(OpKind) -> KernelBinding;
/// Which rows a check runs.
type Select<'a> = &'a dyn Fn(&Case) -> bool;

thread_local! {
    /// The row a check is running on this thread (for the mutation tests' bookkeeping).
    static ROW: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The rows on which a mutant kernel changed a value (see [`corrupted`]).
    static CORRUPTED: RefCell<BTreeSet<usize>> = const { RefCell::new(BTreeSet::new()) };
}

/// One thing the harness found wrong: the row and what differed.
#[derive(Debug)]
struct Failure {
    row: usize,
    what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", rows()[self.row].name(), self.what)
    }
}

/// What a check did: the rows it ran (none skipped without a failure) and every failure.
#[derive(Debug, Default)]
struct Report {
    ran: Vec<usize>,
    failures: Vec<Failure>,
}

impl Report {
    fn start(&mut self, row: &Row) {
        self.ran.push(row.index);
        ROW.set(row.index);
    }

    fn fail(&mut self, row: &Row, what: impl Into<String>) {
        self.failures.push(Failure {
            row: row.index,
            what: what.into(),
        });
    }

    fn failed_rows(&self) -> BTreeSet<usize> {
        self.failures.iter().map(|f| f.row).collect()
    }

    /// Panics listing every failure, if any.
    fn assert_clean(&self, what: &str) {
        let lines: Vec<String> = self.failures.iter().map(|f| f.to_string()).collect();
        assert!(
            lines.is_empty(),
            "{what}: {} failures:\n{}",
            lines.len(),
            lines.join("\n")
        );
    }

    /// Asserts the check ran exactly the rows of `table()` that `expected` picks (computed
    /// independently of the check's own selection), and that those cover every kind in
    /// `kinds`.
    fn assert_ran(&self, what: &str, expected: impl Fn(&Case) -> bool, kinds: &[OpKind]) {
        let want: Vec<usize> = table()
            .iter()
            .enumerate()
            .filter(|(_, c)| expected(c))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            self.ran, want,
            "{what}: rows run differ from the rows expected"
        );
        let ran: BTreeSet<OpKind> = self.ran.iter().map(|&i| rows()[i].kind()).collect();
        let missing: Vec<&OpKind> = kinds.iter().filter(|k| !ran.contains(k)).collect();
        assert!(missing.is_empty(), "{what}: no row ran for {missing:?}");
    }
}

/// Checks `got` against a spec value: shape, then [`compare`].
fn check_value(
    report: &mut Report,
    row: &Row,
    what: &str,
    got: &Tensor,
    want: &Array<f64>,
    alt: Option<&[f64]>,
    tol: f64,
) {
    if got.shape() != want.shape.as_slice() {
        report.fail(
            row,
            format!("{what}: shape {:?}, spec {:?}", got.shape(), want.shape),
        );
    } else if let Err(e) = compare(&to_f64(got), &want.data, alt, tol) {
        report.fail(row, format!("{what}: {e}"));
    }
}

/// Checks `got` against another kernel's `want`: same shape, same values bit for bit.
fn check_same(report: &mut Report, row: &Row, what: &str, got: &Tensor, want: &Tensor) {
    if got.shape() != want.shape() {
        report.fail(
            row,
            format!(
                "{what}: shape {:?}, expected {:?}",
                got.shape(),
                want.shape()
            ),
        );
    } else if !same_values(&got.to_vec(), &want.to_vec()) {
        report.fail(row, format!("{what}: values differ"));
    }
}

/// Forward kernel vs the f64 spec on every selected row.
fn check_forward(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows().iter().filter(|r| select(&r.case)) {
        report.start(row);
        let kind = row.kind();
        let xs = row.tensors();
        let tr: Vec<&Tensor> = xs.iter().collect();
        match (bind(kind).forward())(&row.case.op, &tr) {
            Err(e) => report.fail(row, format!("forward: {e}")),
            Ok(got) => {
                let exact = kind.is_random()
                    || matches!(kind, OpKind::Argmax | OpKind::Compare | OpKind::Round);
                let tol = if exact { 0.0 } else { F32_TOL };
                check_value(
                    &mut report,
                    row,
                    "forward",
                    &got,
                    &row.want,
                    row.alt.as_deref(),
                    tol,
                );
            }
        }
    }
    report
}

/// One VJP call's cotangents vs the spec's: one per input, present exactly where the spec's
/// is (for the inputs in `needed`), each of the input's shape and within tolerance.
fn check_grads(
    report: &mut Report,
    row: &Row,
    what: &str,
    got: &[Option<Tensor>],
    needed: &[bool],
) {
    let want = row.grads.as_ref().expect("a differentiable row");
    if got.len() != want.len() {
        report.fail(
            row,
            format!("{what}: {} cotangents for {} inputs", got.len(), want.len()),
        );
        return;
    }
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        if !needed[j] {
            continue; // allowed to be anything (kernel.rs): the runtime does not read it
        }
        match (g, w) {
            (None, None) => {}
            (Some(g), Some(w)) => {
                let alt = row
                    .grads_alt
                    .as_ref()
                    .and_then(|a| a.get(j))
                    .and_then(|a| a.as_deref());
                check_value(
                    report,
                    row,
                    &format!("{what} input {j}"),
                    g,
                    w,
                    alt,
                    F32_TOL,
                );
            }
            (None, Some(_)) => report.fail(
                row,
                format!("{what} input {j}: no cotangent, the spec has one"),
            ),
            (Some(_), None) => report.fail(
                row,
                format!("{what} input {j}: a cotangent, the spec has none"),
            ),
        }
    }
}

/// VJP kernel vs the f64 spec VJP on every selected differentiable row: with every input
/// needed, and (for several inputs) with each input needed alone, which must give that
/// input's cotangent (the runtime asks for subsets).
fn check_vjp(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows()
        .iter()
        .filter(|r| r.kind().differentiable() && select(&r.case))
    {
        report.start(row);
        let binding = bind(row.kind());
        let Some(vjp) = binding.vjp() else {
            report.fail(row, "no VJP kernel for a differentiable op");
            continue;
        };
        let op = &row.case.op;
        let xs = row.tensors();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let out = match (binding.forward())(op, &tr) {
            Ok(out) => out,
            Err(e) => {
                report.fail(row, format!("forward (for the VJP): {e}"));
                continue;
            }
        };
        let gy = to_tensor(&row.gy);
        let n = tr.len();
        let mut masks = vec![vec![true; n]];
        if n > 1 {
            masks.extend((0..n).map(|j| (0..n).map(|i| i == j).collect()));
        }
        for needs in masks {
            let what = format!("vjp (needs {needs:?})");
            match vjp(op, &tr, &out, &gy, &needs) {
                Err(e) => report.fail(row, format!("{what}: {e}")),
                Ok(got) => check_grads(&mut report, row, &what, &got, &needs),
            }
        }
    }
    report
}

/// The in-place kernel vs the binding's forward kernel, bit for bit, on every selected
/// one-input row (the compiled executor runs it on any one-input node): on an input it owns
/// (which it may overwrite) and on a shared one, which must come back unchanged.
fn check_in_place(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows()
        .iter()
        .filter(|r| !r.inputs.is_empty() && select(&r.case))
    {
        let binding = bind(row.kind());
        let Some(in_place) = binding.in_place() else {
            continue; // not run: `assert_ran` counts it
        };
        report.start(row);
        let op = &row.case.op;
        let xs = row.tensors();
        let (x, rest) = (&xs[0], xs[1..].iter().collect::<Vec<_>>());
        let all: Vec<&Tensor> = xs.iter().collect();
        let want = match (binding.forward())(op, &all) {
            Ok(w) => w,
            Err(e) => {
                report.fail(row, format!("forward: {e}"));
                continue;
            }
        };
        let before = x.to_vec();
        if want.shape() != x.shape() {
            // a value of another shape cannot be written over the first input: refused,
            // the input untouched
            let mut owned = Tensor::from_vec(before.clone(), x.shape()).expect("same shape");
            if in_place(op, &mut owned, &rest).is_ok() {
                report.fail(
                    row,
                    "in_place accepted a value of another shape than its target",
                );
            } else if !same_values(&owned.to_vec(), &before) || owned.shape() != x.shape() {
                report.fail(row, "in_place changed its target before refusing");
            }
            continue;
        }
        let mut owned = Tensor::from_vec(before.clone(), x.shape()).expect("same shape");
        let id = owned.id();
        match in_place(op, &mut owned, &rest) {
            Err(e) => report.fail(row, format!("in_place (owned input): {e}")),
            Ok(()) if owned.id() != id => {
                report.fail(row, "in_place (owned input) changed the target's id")
            }
            Ok(()) => check_same(&mut report, row, "in_place (owned input)", &owned, &want),
        }
        let mut shared = x.clone(); // shares `x`'s storage: must not be written
        match in_place(op, &mut shared, &rest) {
            Err(e) => report.fail(row, format!("in_place (shared input): {e}")),
            Ok(()) => check_same(&mut report, row, "in_place (shared input)", &shared, &want),
        }
        if !same_values(&x.to_vec(), &before) {
            report.fail(row, "in_place overwrote an input it shared");
        }
    }
    report
}

/// The update-many kernel vs the binding's forward kernel, bit for bit, on every selected
/// row of an op that updates several tensors (`OpKind::update_groups`): on targets it owns
/// (written in place: same ids, same buffers) and on shared ones (which must come back
/// unchanged while the targets get the values); and a call whose last group lacks its read
/// tensor is refused before any target is written.
fn check_update_many(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows().iter().filter(|r| select(&r.case)) {
        let Some((t, r)) = row.kind().update_groups() else {
            continue;
        };
        let binding = bind(row.kind());
        let Some(update_many) = binding.update_many() else {
            continue; // not run: `assert_ran` counts it
        };
        report.start(row);
        let op = &row.case.op;
        let xs = row.tensors();
        let all: Vec<&Tensor> = xs.iter().collect();
        let want = match (binding.forward())(op, &all) {
            Ok(w) => w.to_vec(),
            Err(e) => {
                report.fail(row, format!("forward: {e}"));
                continue;
            }
        };
        // each group's first `t` inputs are updated, the next `r` read
        let (updated, read): (Vec<&Tensor>, Vec<&Tensor>) = {
            let (mut u, mut d) = (vec![], vec![]);
            for (i, x) in xs.iter().enumerate() {
                if i % (t + r) < t {
                    u.push(x)
                } else {
                    d.push(x)
                }
            }
            (u, d)
        };
        let parts =
            |targets: &[Tensor]| -> Vec<f32> { targets.iter().flat_map(|x| x.to_vec()).collect() };
        let mut owned: Vec<Tensor> = updated
            .iter()
            .map(|x| Tensor::from_vec(x.to_vec(), x.shape()).expect("same shape"))
            .collect();
        let ids: Vec<_> = owned.iter().map(|x| x.id()).collect();
        let buffers: Vec<_> = owned.iter().map(|x| x.data().as_ptr()).collect();
        {
            let mut targets: Vec<&mut Tensor> = owned.iter_mut().collect();
            if let Err(e) = update_many(op, &mut targets, &read) {
                report.fail(row, format!("update_many (owned): {e}"));
                continue;
            }
        }
        if !same_values(&parts(&owned), &want) {
            report.fail(
                row,
                "update_many (owned): values differ from the forward kernel's",
            );
        }
        let kept = owned.iter().zip(&ids).all(|(x, id)| x.id() == *id);
        let in_place = owned
            .iter()
            .zip(&buffers)
            .all(|(x, b)| x.data().as_ptr() == *b);
        if !kept || !in_place {
            report.fail(
                row,
                format!("update_many (owned): ids kept {kept}, written in place {in_place}"),
            );
        }
        let before: Vec<Vec<f32>> = updated.iter().map(|x| x.to_vec()).collect();
        let mut shared: Vec<Tensor> = updated.iter().map(|x| (*x).clone()).collect();
        {
            let mut targets: Vec<&mut Tensor> = shared.iter_mut().collect();
            if let Err(e) = update_many(op, &mut targets, &read) {
                report.fail(row, format!("update_many (shared): {e}"));
                continue;
            }
        }
        if !same_values(&parts(&shared), &want) {
            report.fail(
                row,
                "update_many (shared): values differ from the forward kernel's",
            );
        }
        if updated
            .iter()
            .zip(&before)
            .any(|(x, b)| !same_values(&x.to_vec(), b))
        {
            report.fail(row, "update_many overwrote a target another handle shares");
        }
        let mut owned: Vec<Tensor> = updated
            .iter()
            .map(|x| Tensor::from_vec(x.to_vec(), x.shape()).expect("same shape"))
            .collect();
        let short = &read[..read.len() - 1];
        let refused = {
            let mut targets: Vec<&mut Tensor> = owned.iter_mut().collect();
            update_many(op, &mut targets, short).is_err()
        };
        if !refused {
            report.fail(row, "update_many accepted a group without its read tensor");
        } else if owned
            .iter()
            .zip(&before)
            .any(|(x, b)| !same_values(&x.to_vec(), b))
        {
            report.fail(row, "update_many wrote a target before refusing");
        }
    }
    report
}

/// A finite garbage value for output buffers, so that an element a kernel skips is caught
/// even where the right value is NaN.
const GARBAGE: f32 = -1.234_5e33;

fn views<'a>(xs: &'a [Tensor], data: &'a [Vec<f32>]) -> Vec<Dense<'a>> {
    xs.iter()
        .zip(data)
        .map(|(t, d)| Dense {
            data: d,
            shape: t.shape(),
        })
        .collect()
}

/// The destination-passing forward kernels (`forward_into`, `in_place_into`) vs the
/// binding's forward kernel, bit for bit, on garbage-filled buffers, on every selected row
/// whose binding has them.
fn check_dense_forward(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows().iter().filter(|r| select(&r.case)) {
        let binding = bind(row.kind());
        let Some(dense) = binding.dense() else {
            continue; // not run: `assert_ran` counts it
        };
        report.start(row);
        let op = &row.case.op;
        let xs = row.tensors();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let want = match (binding.forward())(op, &tr) {
            Ok(w) => w.to_vec(),
            Err(e) => {
                report.fail(row, format!("forward: {e}"));
                continue;
            }
        };
        let data: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
        let mut got = vec![GARBAGE; want.len()];
        match (dense.forward_into)(op, &views(&xs, &data), &mut got) {
            Err(e) => report.fail(row, format!("forward_into: {e}")),
            Ok(()) if !same_values(&got, &want) => {
                report.fail(row, "forward_into: values differ from forward")
            }
            Ok(()) => {}
        }
        if let Some(in_place) = dense.in_place_into {
            if xs.len() != 1 || data[0].len() != want.len() {
                report.fail(
                    row,
                    "in_place_into bound to an op that is not a one-input map",
                );
                continue;
            }
            let mut buf = data[0].clone();
            match in_place(op, xs[0].shape(), &mut buf) {
                Err(e) => report.fail(row, format!("in_place_into: {e}")),
                Ok(()) if !same_values(&buf, &want) => {
                    report.fail(row, "in_place_into: values differ from forward")
                }
                Ok(()) => {}
            }
        }
    }
    report
}

/// The destination-passing VJP kernel (`vjp_into`) vs the binding's VJP kernel, bit for bit,
/// on garbage-filled buffers, for every non-empty subset of needed cotangents, on every
/// selected row whose binding has one. An input the tensor VJP gives no cotangent (an
/// index) gets zeros.
fn check_dense_vjp(bind: Bind, select: Select) -> Report {
    let mut report = Report::default();
    for row in rows().iter().filter(|r| select(&r.case)) {
        let binding = bind(row.kind());
        let Some(vjp_into) = binding.dense().and_then(|d| d.vjp_into) else {
            continue; // not run: `assert_ran` counts it
        };
        report.start(row);
        let Some(vjp) = binding.vjp() else {
            report.fail(row, "vjp_into bound without a VJP kernel");
            continue;
        };
        let op = &row.case.op;
        let xs = row.tensors();
        let tr: Vec<&Tensor> = xs.iter().collect();
        let y = match (binding.forward())(op, &tr) {
            Ok(y) => y,
            Err(e) => {
                report.fail(row, format!("forward: {e}"));
                continue;
            }
        };
        let gy = to_tensor(&row.gy);
        let all = match vjp(op, &tr, &y, &gy, &vec![true; tr.len()]) {
            Ok(all) if all.len() == tr.len() => all,
            Ok(all) => {
                report.fail(
                    row,
                    format!("vjp: {} cotangents for {} inputs", all.len(), tr.len()),
                );
                continue;
            }
            Err(e) => {
                report.fail(row, format!("vjp: {e}"));
                continue;
            }
        };
        let data: Vec<Vec<f32>> = xs.iter().map(|t| t.to_vec()).collect();
        let views = views(&xs, &data);
        let (yd, gd) = (y.to_vec(), gy.to_vec());
        let yv = Dense {
            data: &yd,
            shape: y.shape(),
        };
        let gv = Dense {
            data: &gd,
            shape: gy.shape(),
        };
        for mask in 1u32..(1 << tr.len()) {
            let mut bufs: Vec<Option<Vec<f32>>> = xs
                .iter()
                .enumerate()
                .map(|(j, t)| (mask >> j & 1 == 1).then(|| vec![GARBAGE; t.numel()]))
                .collect();
            let mut outs: Vec<Option<&mut [f32]>> =
                bufs.iter_mut().map(|b| b.as_deref_mut()).collect();
            if let Err(e) = vjp_into(op, &views, yv, gv, &mut outs) {
                report.fail(row, format!("vjp_into (mask {mask:b}): {e}"));
                continue;
            }
            for (j, b) in bufs.iter().enumerate() {
                let Some(b) = b else { continue }; // not asked for
                let w = all[j]
                    .as_ref()
                    .map_or_else(|| vec![0.0; b.len()], |w| w.to_vec());
                if !same_values(b, &w) {
                    report.fail(
                        row,
                        format!("vjp_into (mask {mask:b}) input {j}: values differ from vjp"),
                    );
                }
            }
        }
    }
    report
}

// ---------------------------------------------------------------------------------------
// The providers' conformance tests (cited as `test_suite` evidence by their capsules).
// ---------------------------------------------------------------------------------------

fn all_ops(_: &Case) -> bool {
    true
}

/// The composition provider's rows: every row of the ops it composes, special values
/// included.
fn composed(case: &Case) -> bool {
    providers::composition::OPS.contains(&case.op.kind())
}

fn differentiable_kinds(kinds: &[OpKind]) -> Vec<OpKind> {
    kinds
        .iter()
        .copied()
        .filter(|k| k.differentiable())
        .collect()
}

fn reference(_: OpKind) -> KernelBinding {
    providers::reference::binding()
}

fn composition(_: OpKind) -> KernelBinding {
    providers::composition::binding()
}

#[test]
fn every_op_has_a_conformance_row() {
    support::checked_cpu_default();
    assert!(
        uncovered_kinds().is_empty(),
        "ops without a conformance row: {:?}",
        uncovered_kinds()
    );
}

#[test]
fn reference_forward_matches_spec() {
    support::checked_cpu_default();
    let r = check_forward(&reference, &all_ops);
    r.assert_clean("reference forward");
    r.assert_ran("reference forward", |_| true, OpKind::ALL);
}

#[test]
fn reference_vjp_matches_spec() {
    support::checked_cpu_default();
    let r = check_vjp(&reference, &all_ops);
    r.assert_clean("reference vjp");
    let kinds = differentiable_kinds(OpKind::ALL);
    r.assert_ran("reference vjp", |c| c.op.kind().differentiable(), &kinds);
}

#[test]
fn native_cpu_forward_matches_spec() {
    support::checked_cpu_default();
    let r = check_forward(&providers::native_cpu::binding_for, &all_ops);
    r.assert_clean("native_cpu forward");
    r.assert_ran("native_cpu forward", |_| true, OpKind::ALL);
}

#[test]
fn native_cpu_vjp_matches_spec() {
    support::checked_cpu_default();
    let r = check_vjp(&providers::native_cpu::binding_for, &all_ops);
    r.assert_clean("native_cpu vjp");
    let kinds = differentiable_kinds(OpKind::ALL);
    r.assert_ran("native_cpu vjp", |c| c.op.kind().differentiable(), &kinds);
}

/// Every provider's attention scales the scores, not the query: a subnormal query entry
/// that a scale rounds to zero, times an infinite key entry, is NaN (0·inf) where the
/// spec's q·k is -inf. The composition scaled q first until this was found (its output row
/// was NaN where the spec's is v's second row).
#[test]
fn attention_scales_the_scores_so_a_subnormal_query_meets_an_infinite_key_as_the_spec() {
    support::checked_cpu_default();
    let op = Op::ScaledDotProductAttention {
        scale: None,
        causal: false,
        mask: torchlean::graph::AttentionMask::None,
    };
    let tiny = f64::from(f32::from_bits(1)); // the smallest subnormal; times 1/2 rounds to 0
    let array = |shape: Vec<usize>, data: Vec<f64>| Array::from_vec(shape, data).expect("shape");
    let q = array(vec![1, 1, 4], vec![1.0, tiny, 0.5, 0.25]);
    let k = array(
        vec![1, 2, 4],
        vec![0.5, f64::NEG_INFINITY, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
    );
    let v = array(vec![1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let want = spec::forward(&op, &[&q, &k, &v]).expect("spec");
    assert_eq!(
        want.data,
        vec![3.0, 4.0],
        "the spec: the first key's score is -inf"
    );
    let xs = [to_tensor(&q), to_tensor(&k), to_tensor(&v)];
    let refs: Vec<&Tensor> = xs.iter().collect();
    for (name, bind) in providers_under_test() {
        let got = (bind.forward())(&op, &refs).expect("forward").to_vec();
        assert_eq!(got, vec![3.0f32, 4.0], "{name}");
    }
}

#[test]
fn composition_forward_matches_spec() {
    support::checked_cpu_default();
    let r = check_forward(&composition, &composed);
    r.assert_clean("torchlean forward");
    let ops = providers::composition::OPS;
    r.assert_ran("torchlean forward", |c| ops.contains(&c.op.kind()), ops);
}

#[test]
fn composition_vjp_matches_spec() {
    support::checked_cpu_default();
    let r = check_vjp(&composition, &composed);
    r.assert_clean("torchlean vjp");
    let ops = providers::composition::OPS;
    r.assert_ran(
        "torchlean vjp",
        |c| ops.contains(&c.op.kind()),
        &differentiable_kinds(ops),
    );
}

#[test]
fn every_provider_under_test_is_registered() {
    support::checked_cpu_default();
    let registry = torchlean::runtime::session::standard_registry();
    for (name, _) in providers_under_test() {
        assert!(
            registry
                .entries()
                .iter()
                .any(|e| e.capsule.provider.label() == name),
            "{name} has no capsules"
        );
    }
}

/// Needing only some inputs' cotangents gives each needed one as when all are needed (the
/// compiled executor asks for subsets): [`check_vjp`]'s one-input masks, on the native
/// kernels, for every multi-input row.
#[test]
fn native_cpu_vjp_skipping_unneeded_inputs_keeps_the_others() {
    support::checked_cpu_default();
    let multi = |c: &Case| c.inputs.len() > 1;
    let r = check_vjp(&providers::native_cpu::binding_for, &multi);
    r.assert_clean("native_cpu vjp with needs subsets");
    let kinds: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|&k| k.differentiable() && cases().iter().any(|c| c.op.kind() == k && multi(c)))
        .collect();
    assert!(kinds.contains(&OpKind::Matmul) && kinds.contains(&OpKind::Conv2d));
    r.assert_ran(
        "native_cpu vjp with needs subsets",
        |c| c.op.kind().differentiable() && multi(c),
        &kinds,
    );
}

/// The native in-place kernel gives exactly the forward kernel's values on every row whose
/// value has its first input's shape (unary maps, the optimizer maps and same-shape binary
/// maps overwrite an owned target; other ops compute their value and the target takes it),
/// keeps the target's id, leaves a shared target's storage alone, and refuses every row
/// whose value has another shape without touching the target.
#[test]
fn native_cpu_in_place_matches_forward() {
    let r = check_in_place(&providers::native_cpu::binding_for, &all_ops);
    r.assert_clean("native_cpu in_place");
    let kinds: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|&k| {
            cases()
                .iter()
                .any(|c| c.op.kind() == k && !c.inputs.is_empty())
        })
        .collect();
    for k in [
        OpKind::Tanh,
        OpKind::Softmax,
        OpKind::EmaUpdate,
        OpKind::AdamUpdate,
        OpKind::Add,
        OpKind::Sub,
        OpKind::Linear,
    ] {
        assert!(kinds.contains(&k), "{k:?}");
    }
    r.assert_ran("native_cpu in_place", |c| !c.inputs.is_empty(), &kinds);
}

/// The native update-many kernel (an optimizer's whole step: `adam_step`) gives exactly the
/// forward kernel's values, in place on owned targets, into new buffers for shared ones, and
/// refuses a malformed call before writing anything.
#[test]
fn native_cpu_update_many_matches_forward() {
    let r = check_update_many(&providers::native_cpu::binding_for, &all_ops);
    r.assert_clean("native_cpu update_many");
    r.assert_ran(
        "native_cpu update_many",
        |c| c.op.kind().update_groups().is_some(),
        &[OpKind::AdamStep],
    );
}

/// The native destination-passing kernels (used by the compiled executor's dense path) give
/// exactly the tensor kernels' values, on output buffers filled with garbage beforehand (so a
/// kernel that skips an element is caught), for every subset of needed cotangents.
#[test]
fn native_cpu_dense_kernels_match_the_tensor_kernels() {
    support::checked_cpu_default();
    let has_dense = |k: OpKind| providers::native_cpu::dense_kernels(k).is_some();
    let dense_kinds: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|&k| has_dense(k))
        .collect();
    assert!(dense_kinds.len() > 30, "{dense_kinds:?}");
    let bind = &providers::native_cpu::binding_for;
    let r = check_dense_forward(bind, &all_ops);
    r.assert_clean("native_cpu dense forward");
    r.assert_ran(
        "native_cpu dense forward",
        |c| has_dense(c.op.kind()),
        &dense_kinds,
    );
    // every differentiable op with dense kernels has a vjp_into (the dense path trains)
    let r = check_dense_vjp(bind, &all_ops);
    r.assert_clean("native_cpu dense vjp");
    r.assert_ran(
        "native_cpu dense vjp",
        |c| has_dense(c.op.kind()) && c.op.kind().differentiable(),
        &differentiable_kinds(&dense_kinds),
    );
}

// ---------------------------------------------------------------------------------------
// Mutation tests: deliberately wrong kernels (the native ones, corrupted after the fact) must
// make the harness fail, on exactly the rows where the corruption changed something.
// ---------------------------------------------------------------------------------------

mod mutants {
    //! Wrong kernels. Kernel types are fn pointers (no captures), so each mutant is a small
    //! fn that calls the native kernel and corrupts its result, noting the row ([`corrupted`])
    //! when the corruption changed a value.
    use super::*;
    use torchlean::error::Result;
    use torchlean::providers::native_cpu as native;

    /// Notes that a mutant changed a result on the row being checked.
    pub fn corrupted() {
        let row = ROW.get();
        CORRUPTED.with(|c| c.borrow_mut().insert(row));
    }

    /// The rows noted since the last call (this thread).
    pub fn take_corrupted() -> BTreeSet<usize> {
        CORRUPTED.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }

    fn with_data(t: &Tensor, f: impl FnOnce(&mut [f32]) -> bool) -> Result<Tensor> {
        let mut d = t.to_vec();
        if f(&mut d) {
            corrupted();
        }
        Tensor::from_vec(d, t.shape())
    }

    /// The first element that is not NaN becomes NaN.
    fn one_nan(d: &mut [f32]) -> bool {
        match d.iter().position(|v| !v.is_nan()) {
            Some(k) => {
                d[k] = f32::NAN;
                true
            }
            None => false,
        }
    }

    /// The finite element of largest magnitude is scaled by 1 + 1e-3, when that magnitude is
    /// at least 1 (so the error, at least 5e-4 of 1 + the row's scale, is over
    /// [`F32_TOL`]: smaller elements are within the harness's norm-wise tolerance).
    fn off_by_a_thousandth(d: &mut [f32]) -> bool {
        let big = (0..d.len())
            .filter(|&k| d[k].is_finite())
            .max_by(|&a, &b| d[a].abs().total_cmp(&d[b].abs()));
        match big {
            Some(k) if d[k].abs() >= 1.0 => {
                d[k] *= 1.0 + 1e-3;
                true
            }
            _ => false,
        }
    }

    /// A square matrix (the last two axes of a rank-2 value) is transposed; true when that
    /// changed a value.
    fn transposed(shape: &[usize], d: &mut [f32]) -> bool {
        let &[n, m] = shape else { return false };
        if n != m || n < 2 {
            return false;
        }
        let t: Vec<f32> = (0..n * n).map(|k| d[(k % n) * n + k / n]).collect();
        let changed = !same_values(&t, d);
        d.copy_from_slice(&t);
        changed
    }

    pub fn forward_with_a_nan(op: &Op, x: &[&Tensor]) -> Result<Tensor> {
        with_data(&native::forward(op, x)?, one_nan)
    }

    pub fn forward_off_by_a_thousandth(op: &Op, x: &[&Tensor]) -> Result<Tensor> {
        with_data(&native::forward(op, x)?, off_by_a_thousandth)
    }

    pub fn forward_transposed(op: &Op, x: &[&Tensor]) -> Result<Tensor> {
        let y = native::forward(op, x)?;
        let shape = y.shape().to_vec();
        with_data(&y, |d| transposed(&shape, d))
    }

    /// The native VJP with `f` applied to its first cotangent for a needed input.
    fn vjp_then(
        op: &Op,
        x: &[&Tensor],
        y: &Tensor,
        gy: &Tensor,
        needs: &[bool],
        f: impl FnOnce(&mut Option<Tensor>) -> Result<()>,
    ) -> Result<Vec<Option<Tensor>>> {
        let mut g = native::vjp(op, x, y, gy, needs)?;
        if let Some(j) = (0..g.len()).find(|&j| needs[j] && g[j].is_some()) {
            f(&mut g[j])?;
        }
        Ok(g)
    }

    pub fn vjp_dropping_a_gradient(
        op: &Op,
        x: &[&Tensor],
        y: &Tensor,
        gy: &Tensor,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        vjp_then(op, x, y, gy, needs, |g| {
            *g = None;
            corrupted();
            Ok(())
        })
    }

    pub fn vjp_with_a_nan(
        op: &Op,
        x: &[&Tensor],
        y: &Tensor,
        gy: &Tensor,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        vjp_then(op, x, y, gy, needs, |g| {
            *g = Some(with_data(g.as_ref().expect("some"), one_nan)?);
            Ok(())
        })
    }

    pub fn vjp_off_by_a_thousandth(
        op: &Op,
        x: &[&Tensor],
        y: &Tensor,
        gy: &Tensor,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        vjp_then(op, x, y, gy, needs, |g| {
            *g = Some(with_data(g.as_ref().expect("some"), off_by_a_thousandth)?);
            Ok(())
        })
    }

    pub fn vjp_transposed(
        op: &Op,
        x: &[&Tensor],
        y: &Tensor,
        gy: &Tensor,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        vjp_then(op, x, y, gy, needs, |g| {
            let t = g.as_ref().expect("some");
            let shape = t.shape().to_vec();
            *g = Some(with_data(t, |d| transposed(&shape, d))?);
            Ok(())
        })
    }

    /// Right on the unary maps (the only ops the old harness ran it on), the target unchanged
    /// for every other op whose value has its shape.
    pub fn in_place_only_for_unary_maps(op: &Op, x: &mut Tensor, rest: &[&Tensor]) -> Result<()> {
        if op.kind().is_unary_map() || op.kind() == OpKind::FusedUnary {
            return native::forward_in_place(op, x, rest);
        }
        let all: Vec<&Tensor> = std::iter::once(&*x).chain(rest.iter().copied()).collect();
        let right = native::forward(op, &all)?;
        if right.shape() != x.shape() {
            return native::forward_in_place(op, x, rest); // the refusal
        }
        if !same_values(&right.to_vec(), &x.to_vec()) {
            corrupted();
        }
        Ok(())
    }

    /// Right when it owns its target; when the target is shared (its storage copied on
    /// write), one element of the copy comes back as NaN. The old harness discarded the
    /// shared call's result.
    pub fn in_place_wrong_on_a_shared_input(
        op: &Op,
        x: &mut Tensor,
        rest: &[&Tensor],
    ) -> Result<()> {
        let before = x.data().as_ptr();
        x.update_data(|_| {});
        let owned = x.is_contiguous() && x.data().as_ptr() == before;
        native::forward_in_place(op, x, rest)?;
        if !owned {
            *x = with_data(x, one_nan)?;
        }
        Ok(())
    }

    fn native_dense(op: &Op) -> DenseKernels {
        native::dense_kernels(op.kind()).expect("bound only where native has dense kernels")
    }

    /// The native `forward_into`, leaving the last element as it found it.
    pub fn forward_into_skipping_an_element(op: &Op, x: &[Dense], out: &mut [f32]) -> Result<()> {
        let last = out.last().copied();
        (native_dense(op).forward_into)(op, x, out)?;
        if let (Some(old), Some(new)) = (last, out.last_mut()) {
            if old.to_bits() != new.to_bits() {
                *new = old;
                corrupted();
            }
        }
        Ok(())
    }

    /// The native `vjp_into`, leaving the first element of the first requested cotangent as
    /// it found it.
    pub fn vjp_into_skipping_an_element(
        op: &Op,
        x: &[Dense],
        y: Dense,
        gy: Dense,
        outs: &mut [Option<&mut [f32]>],
    ) -> Result<()> {
        let first = outs
            .iter()
            .position(|o| o.as_ref().is_some_and(|o| !o.is_empty()));
        let old = first.map(|j| outs[j].as_ref().expect("some")[0]);
        (native_dense(op).vjp_into.expect("a vjp_into"))(op, x, y, gy, outs)?;
        if let (Some(j), Some(old)) = (first, old) {
            let new = &mut outs[j].as_mut().expect("some")[0];
            if old.to_bits() != new.to_bits() {
                *new = old;
                corrupted();
            }
        }
        Ok(())
    }

    /// The native `in_place_into` with the first element of its result made NaN.
    pub fn in_place_into_with_a_nan(op: &Op, shape: &[usize], buf: &mut [f32]) -> Result<()> {
        (native_dense(op).in_place_into.expect("an in_place_into"))(op, shape, buf)?;
        if let Some(v) = buf.first_mut().filter(|v| !v.is_nan()) {
            *v = f32::NAN;
            corrupted();
        }
        Ok(())
    }

    /// The native binding of `kind` with its dense kernels replaced by `f` of them.
    pub fn with_dense(kind: OpKind, f: fn(DenseKernels) -> DenseKernels) -> KernelBinding {
        native::binding().with_dense(native::dense_kernels(kind).map(f))
    }

    pub fn binding(forward: torchlean::runtime::kernel::ForwardKernel) -> KernelBinding {
        KernelBinding::new("mutant", forward, Some(native::vjp))
    }

    pub fn vjp_binding(vjp: torchlean::runtime::kernel::VjpKernel) -> KernelBinding {
        KernelBinding::new("mutant", native::forward, Some(vjp))
    }
}

/// Asserts the harness failed on exactly the rows where the mutant changed something (all
/// of them caught, none blamed wrongly), and that there were some.
fn assert_caught(report: Report, mutant: &str) -> BTreeSet<usize> {
    let corrupted = mutants::take_corrupted();
    assert!(
        !corrupted.is_empty(),
        "{mutant}: the mutant changed nothing ({} rows ran)",
        report.ran.len()
    );
    let failed = report.failed_rows();
    let missed: Vec<String> = corrupted
        .difference(&failed)
        .map(|&i| rows()[i].name())
        .collect();
    let blamed: Vec<String> = failed
        .difference(&corrupted)
        .map(|&i| rows()[i].name())
        .collect();
    assert!(
        missed.is_empty() && blamed.is_empty(),
        "{mutant}: {} rows corrupted; the harness missed {missed:?} and blamed {blamed:?}",
        corrupted.len()
    );
    eprintln!(
        "{mutant}: {} rows corrupted, every one caught",
        corrupted.len()
    );
    corrupted
}

#[test]
fn harness_catches_a_nan_in_one_element() {
    mutants::take_corrupted();
    let r = check_forward(&|_| mutants::binding(mutants::forward_with_a_nan), &all_ops);
    assert_eq!(r.ran.len(), rows().len());
    assert_caught(r, "forward with one NaN");
}

#[test]
fn harness_catches_one_value_off_by_a_thousandth() {
    mutants::take_corrupted();
    let r = check_forward(
        &|_| mutants::binding(mutants::forward_off_by_a_thousandth),
        &all_ops,
    );
    assert_caught(r, "forward with one value off by 1e-3");
}

#[test]
fn harness_catches_a_transposed_result() {
    mutants::take_corrupted();
    let r = check_forward(&|_| mutants::binding(mutants::forward_transposed), &all_ops);
    let corrupted = assert_caught(r, "forward with a transposed square result");
    assert!(
        corrupted
            .iter()
            .any(|&i| rows()[i].kind() == OpKind::Matmul),
        "the square matmul row"
    );
}

#[test]
fn harness_catches_a_dropped_gradient() {
    mutants::take_corrupted();
    let r = check_vjp(
        &|_| mutants::vjp_binding(mutants::vjp_dropping_a_gradient),
        &all_ops,
    );
    assert_eq!(
        r.ran.len(),
        rows().iter().filter(|r| r.kind().differentiable()).count()
    );
    assert_caught(r, "vjp dropping a gradient");
}

#[test]
fn harness_catches_a_nan_in_one_gradient_element() {
    mutants::take_corrupted();
    let r = check_vjp(&|_| mutants::vjp_binding(mutants::vjp_with_a_nan), &all_ops);
    assert_caught(r, "vjp with one NaN");
}

#[test]
fn harness_catches_one_gradient_value_off_by_a_thousandth() {
    mutants::take_corrupted();
    let r = check_vjp(
        &|_| mutants::vjp_binding(mutants::vjp_off_by_a_thousandth),
        &all_ops,
    );
    assert_caught(r, "vjp with one value off by 1e-3");
}

#[test]
fn harness_catches_a_transposed_gradient() {
    mutants::take_corrupted();
    let r = check_vjp(&|_| mutants::vjp_binding(mutants::vjp_transposed), &all_ops);
    assert_caught(r, "vjp with a transposed square cotangent");
}

#[test]
fn harness_catches_an_in_place_kernel_wrong_off_the_unary_maps() {
    mutants::take_corrupted();
    let bind =
        |_| providers::native_cpu::binding().with_in_place(mutants::in_place_only_for_unary_maps);
    let r = check_in_place(&bind, &all_ops);
    assert_caught(r, "in-place kernel returning its input off the unary maps");
}

#[test]
fn harness_catches_an_in_place_kernel_wrong_on_a_shared_input() {
    mutants::take_corrupted();
    let bind = |_| {
        providers::native_cpu::binding().with_in_place(mutants::in_place_wrong_on_a_shared_input)
    };
    let r = check_in_place(&bind, &all_ops);
    assert!(
        r.failures.iter().all(|f| f.what.contains("shared input")),
        "{:?}",
        r.failures
    );
    assert_caught(r, "in-place kernel wrong on a shared input");
}

#[test]
fn harness_catches_a_dense_kernel_that_skips_an_element() {
    mutants::take_corrupted();
    let bind = |k| {
        mutants::with_dense(k, |d| DenseKernels {
            forward_into: mutants::forward_into_skipping_an_element,
            ..d
        })
    };
    let r = check_dense_forward(&bind, &all_ops);
    assert_caught(r, "forward_into skipping an element");
}

#[test]
fn harness_catches_a_dense_vjp_that_skips_an_element() {
    mutants::take_corrupted();
    let bind = |k| {
        mutants::with_dense(k, |d| DenseKernels {
            vjp_into: d
                .vjp_into
                .map(|_| mutants::vjp_into_skipping_an_element as _),
            ..d
        })
    };
    let r = check_dense_vjp(&bind, &all_ops);
    assert_caught(r, "vjp_into skipping an element");
}

#[test]
fn harness_catches_a_wrong_dense_in_place_kernel() {
    mutants::take_corrupted();
    let bind = |k| {
        mutants::with_dense(k, |d| DenseKernels {
            in_place_into: d
                .in_place_into
                .map(|_| mutants::in_place_into_with_a_nan as _),
            ..d
        })
    };
    let r = check_dense_forward(&bind, &all_ops);
    assert_caught(r, "in_place_into with a NaN");
}

/// The harness's own comparison: a NaN never passes as a small error (the `f64::max` fold
/// this replaced skipped NaN), nor does a length mismatch, an infinity of the wrong sign,
/// or an error just over the tolerance; an error just under passes.
#[test]
fn harness_compare_refuses_nan_lengths_and_infinities() {
    let want = [1.0, -2.0, 3.0];
    assert!(compare(&want, &want, None, F32_TOL).is_ok());
    assert!(compare(&[1.0, f64::NAN, 3.0], &want, None, F32_TOL).is_err());
    assert!(compare(&[f64::NAN; 3], &want, None, F32_TOL).is_err());
    assert!(compare(&[1.0, -2.0], &want, None, F32_TOL).is_err());
    assert!(compare(&[1.0, -2.0, 3.0, 4.0], &want, None, F32_TOL).is_err());
    assert!(compare(
        &[1.0, f64::INFINITY],
        &[1.0, f64::NEG_INFINITY],
        None,
        F32_TOL
    )
    .is_err());
    assert!(compare(&[1.0, 5.0], &[1.0, f64::NAN], None, F32_TOL).is_err());
    // scale 1 + 3 = 4: an absolute error of 4 * tol passes, 4 * 1.5 tol does not
    let near = [1.0, -2.0, 3.0 + 4.0 * F32_TOL * 0.9];
    let far = [1.0, -2.0, 3.0 + 4.0 * F32_TOL * 1.5];
    assert!(compare(&near, &want, None, F32_TOL).is_ok());
    assert!(compare(&far, &want, None, F32_TOL).is_err());
    // an alternative (the spec at f32) is taken only where it is of another class
    assert!(compare(&[f64::INFINITY], &[1.0], Some(&[f64::INFINITY]), F32_TOL).is_ok());
    assert!(compare(&[5.0], &[1.0], Some(&[5.0]), F32_TOL).is_err());
    assert!(compare(&[1.0], &[1.0], Some(&[]), F32_TOL).is_err());
}

/// The f64 spec VJP vs central differences of the f64 spec forward, on every ordinary
/// differentiable row: a cotangent for exactly the real-valued inputs (none for index and
/// mask inputs), of the input's shape, agreeing with the finite differences on every
/// coordinate of small inputs and a deterministic sample of 12 of large ones.
#[test]
fn spec_vjp_matches_finite_differences() {
    let ordinary = cases().len();
    let checked: Vec<(usize, Vec<String>)> = rows()[..ordinary]
        .par_iter()
        .filter(|r| r.kind().differentiable())
        .map(|row| (row.index, finite_difference_failures(row)))
        .collect();
    let failures: Vec<String> = checked.iter().flat_map(|(_, f)| f.clone()).collect();
    assert!(
        failures.is_empty(),
        "spec VJP disagrees with finite differences:\n{}",
        failures.join("\n")
    );
    let expected = cases()
        .iter()
        .filter(|c| c.op.kind().differentiable())
        .count();
    assert_eq!(checked.len(), expected);
}

fn finite_difference_failures(row: &Row) -> Vec<String> {
    let (i, case, xs) = (row.index, &row.case, &row.inputs);
    let w = &row.gy;
    let grads = row.grads.as_ref().expect("a differentiable row");
    let mut failures = vec![];
    let loss = |inputs: &[Array<f64>]| -> f64 {
        let r: Vec<&Array<f64>> = inputs.iter().collect();
        let out = spec::forward(&case.op, &r).expect("spec forward");
        assert_eq!(out.data.len(), w.data.len());
        out.data.iter().zip(&w.data).map(|(a, b)| a * b).sum()
    };
    for (j, g) in grads.iter().enumerate() {
        let real = matches!(
            case.inputs[j].1,
            Gen::Normal | Gen::Positive | Gen::Unit | Gen::AboveOne | Gen::Quarters(_)
        );
        let g = match (g, real) {
            (Some(g), true) => g,
            (None, false) => continue,
            (g, _) => {
                failures.push(format!(
                    "{} input {j} ({:?}): spec cotangent present: {}",
                    case.name(),
                    case.inputs[j].1,
                    g.is_some()
                ));
                continue;
            }
        };
        if g.shape != xs[j].shape || g.data.len() != xs[j].data.len() {
            failures.push(format!(
                "{} input {j}: spec cotangent of shape {:?} for an input of {:?}",
                case.name(),
                g.shape,
                xs[j].shape
            ));
            continue;
        }
        // rounding's ties and quarters sit on or beside its jumps, where a difference
        // quotient is no derivative (its random reals are checked)
        if matches!(case.inputs[j].1, Gen::Quarters(_)) {
            continue;
        }
        let n = xs[j].data.len();
        // all coordinates when small, else a deterministic sample of 12
        let coords: Vec<usize> = if n <= 24 {
            (0..n).collect()
        } else {
            (0..12).map(|k| (k * 7919 + i) % n).collect()
        };
        for k in coords {
            let h = 1e-6 * (1.0 + xs[j].data[k].abs());
            let mut plus = xs.clone();
            plus[j].data[k] += h;
            let mut minus = xs.clone();
            minus[j].data[k] -= h;
            let fd = (loss(&plus) - loss(&minus)) / (2.0 * h);
            let err = (fd - g.data[k]).abs() / (1.0 + g.data[k].abs());
            // a NaN error fails too
            if err.is_nan() || err > FD_TOL {
                failures.push(format!(
                    "{} input {j} coord {k}: vjp {} vs finite difference {fd} (err {err:e})",
                    case.name(),
                    g.data[k]
                ));
            }
        }
    }
    failures
}

/// Dense kernels refuse operands whose slices do not match their shapes.
#[test]
fn native_cpu_dense_kernels_check_their_buffers() {
    support::checked_cpu_default();
    use torchlean::runtime::kernel::Dense;
    let dense = providers::native_cpu::dense_kernels(OpKind::Tanh).expect("tanh has dense kernels");
    let x = [1.0f32, 2.0, 3.0];
    let op = torchlean::graph::Op::Tanh;
    let short = Dense {
        data: &x[..2],
        shape: &[3],
    };
    assert!((dense.forward_into)(&op, &[short], &mut [0.0; 3]).is_err());
    let ok = Dense {
        data: &x,
        shape: &[3],
    };
    let err = (dense.forward_into)(&op, &[ok], &mut [0.0; 2]).unwrap_err();
    assert!(
        err.to_string().contains("output buffer has 2 elements"),
        "{err}"
    );
}

/// One regression row of [`nan_is_never_dropped`]: an op, its inputs (data, shape), the
/// expected output, and optionally the expected cotangents for an all-ones output cotangent.
struct NanRow {
    op: Op,
    inputs: Vec<(Vec<f32>, Vec<usize>)>,
    want: Vec<f32>,
    grads: Option<Vec<Vec<f32>>>,
}

/// NaN where `want` is NaN and only there; other values within 1e-6 relative, and a zero of
/// the same sign as `want`'s.
fn matches_exactly(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| {
            if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if w == 0.0 {
                g.to_bits() == w.to_bits()
            } else {
                g == w || (g - w).abs() <= 1e-6 * (1.0 + w.abs())
            }
        })
}

/// Issue 13 item 2, "NaN disappears": relu(NaN) was 0, clamp(NaN) its lower bound,
/// maximum/minimum(NaN, x) = x, safe_log(NaN) = ln(eps), and max_pool2d skipped a NaN in its
/// window, on both providers (PyTorch propagates NaN in every one). Every row fails on that
/// code; each runs on reference and native_cpu (tensor kernels, and the native dense and
/// in-place kernels where the op has them).
#[test]
fn nan_is_never_dropped() {
    const N: f32 = f32::NAN;
    // 40 elements (more than one 16-lane chunk): NaN at 0, 17 and 39, -0 at 5
    let x: Vec<f32> = (0..40)
        .map(|i| match i {
            0 | 17 | 39 => N,
            5 => -0.0,
            _ => (i as f32 - 20.0) * 0.1,
        })
        .collect();
    let map = |f: &dyn Fn(f32) -> f32| {
        x.iter()
            .map(|&v| if v.is_nan() { N } else { f(v) })
            .collect::<Vec<_>>()
    };
    let relu_grad: Vec<f32> = x
        .iter()
        .map(|&v| if v <= 0.0 { 0.0 } else { 1.0 })
        .collect();
    let rows = vec![
        NanRow {
            op: Op::Relu,
            inputs: vec![(x.clone(), vec![40])],
            // relu(-0) = -0, as PyTorch eager
            want: map(&|v| if v < 0.0 { 0.0 } else { v }),
            // PyTorch masks where the output is <= 0: a NaN passes the cotangent
            grads: Some(vec![relu_grad]),
        },
        NanRow {
            op: Op::Clamp {
                min: -0.5,
                max: 0.7,
            },
            inputs: vec![(x.clone(), vec![40])],
            want: map(&|v| v.clamp(-0.5, 0.7)),
            grads: Some(vec![x
                .iter()
                .map(|&v| if (-0.5..=0.7).contains(&v) { 1.0 } else { 0.0 })
                .collect()]),
        },
        NanRow {
            op: Op::Maximum,
            inputs: vec![
                (vec![N, 1.0, N, f32::NEG_INFINITY, 2.0], vec![5]),
                (vec![1.0, N, N, N, 3.0], vec![5]),
            ],
            want: vec![N, N, N, N, 3.0],
            // with a NaN neither input strictly wins: both keep the cotangent (PyTorch)
            grads: Some(vec![vec![1.0, 1.0, 1.0, 1.0, 0.0], vec![1.0; 5]]),
        },
        NanRow {
            op: Op::Minimum,
            inputs: vec![
                (vec![N, 1.0, N, f32::INFINITY, 2.0], vec![5]),
                (vec![1.0, N, N, N, 3.0], vec![5]),
            ],
            want: vec![N, N, N, N, 2.0],
            grads: Some(vec![vec![1.0; 5], vec![1.0, 1.0, 1.0, 1.0, 0.0]]),
        },
        NanRow {
            op: Op::SafeLog { eps: 1e-3 },
            inputs: vec![(vec![N, -1.0, 1.0, 0.0], vec![4])],
            want: vec![N, 1e-3f32.ln(), 0.0, 1e-3f32.ln()],
            grads: Some(vec![vec![0.0, 0.0, 1.0, 0.0]]),
        },
        NanRow {
            op: Op::MaxPool2d(torchlean::graph::Pool2dGeometry::square(2)),
            // windows {1, NaN, 3, 4}, {5, 6, 7, 8}, {9, 1, 2, NaN}: NaN first and last
            inputs: vec![(
                vec![1.0, N, 5.0, 6.0, 9.0, 1.0, 3.0, 4.0, 7.0, 8.0, 2.0, N],
                vec![1, 1, 2, 6],
            )],
            want: vec![N, 8.0, N],
            // the gradient goes to the window's first maximum, a NaN ranking highest
            grads: Some(vec![vec![
                0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0,
            ]]),
        },
    ];
    let mut failures: Vec<String> = vec![];
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };
    let native = providers::native_cpu::binding();
    for (name, binding) in [
        ("reference", providers::reference::binding()),
        ("native_cpu", native),
    ] {
        for row in &rows {
            let ts: Vec<Tensor> = row
                .inputs
                .iter()
                .map(|(d, s)| Tensor::from_vec(d.clone(), s).unwrap())
                .collect();
            let tr: Vec<&Tensor> = ts.iter().collect();
            let y = (binding.forward())(&row.op, &tr).unwrap();
            check(
                matches_exactly(&y.to_vec(), &row.want),
                format!(
                    "{name} {}: {:?}, want {:?}",
                    row.op.name(),
                    y.to_vec(),
                    row.want
                ),
            );
            if let Some(grads) = &row.grads {
                let ones = Tensor::from_vec(vec![1.0; y.numel()], y.shape()).unwrap();
                let vjp = binding.vjp().expect("a VJP kernel");
                let got = vjp(&row.op, &tr, &y, &ones, &vec![true; tr.len()]).unwrap();
                assert_eq!(
                    grads.len(),
                    tr.len(),
                    "{}: a cotangent per input",
                    row.op.name()
                );
                check(
                    got.len() == tr.len(),
                    format!(
                        "{name} {}: {} cotangents for {} inputs",
                        row.op.name(),
                        got.len(),
                        tr.len()
                    ),
                );
                for (j, want) in grads.iter().enumerate().take(got.len()) {
                    let g = got[j].as_ref().expect("a cotangent").to_vec();
                    check(
                        matches_exactly(&g, want),
                        format!(
                            "{name} {} input {j}: cotangent {g:?}, want {want:?}",
                            row.op.name()
                        ),
                    );
                }
            }
        }
    }
    // the native destination-passing and in-place variants
    for row in &rows {
        let Some(dense) = providers::native_cpu::dense_kernels(row.op.kind()) else {
            continue;
        };
        let views: Vec<torchlean::runtime::kernel::Dense> = row
            .inputs
            .iter()
            .map(|(d, s)| torchlean::runtime::kernel::Dense { data: d, shape: s })
            .collect();
        let mut out = vec![0.0; row.want.len()];
        (dense.forward_into)(&row.op, &views, &mut out).unwrap();
        check(
            matches_exactly(&out, &row.want),
            format!("forward_into {}", row.op.name()),
        );
        if let Some(in_place) = dense.in_place_into {
            let mut buf = row.inputs[0].0.clone();
            in_place(&row.op, &row.inputs[0].1, &mut buf).unwrap();
            check(
                matches_exactly(&buf, &row.want),
                format!("in_place_into {}", row.op.name()),
            );
            let mut t = Tensor::from_vec(row.inputs[0].0.clone(), &row.inputs[0].1).unwrap();
            (native.in_place().expect("in-place kernel"))(&row.op, &mut t, &[]).unwrap();
            check(
                matches_exactly(&t.to_vec(), &row.want),
                format!("in_place {}", row.op.name()),
            );
        }
    }
    assert!(failures.is_empty(), "NaN dropped:\n{}", failures.join("\n"));
}

/// The reference provider (`strict_cpu`: the spec evaluated at f32) sums long sequences by
/// cascade, as PyTorch's CPU reductions do: a left-to-right f32 sum gave `sum_all` of a
/// million values near 100 a relative error of 1.7e-5, and a 512-wide layer norm of values
/// near 1000 an absolute error of 2e-3 (found by scripts/pytorch-oracle.py). Each result is
/// compared with the f64 spec on the same f32 inputs.
#[test]
fn the_reference_provider_sums_long_sequences_by_cascade() {
    use torchlean::backend::BackendProfile;
    use torchlean::runtime::{self, Session};
    std::thread::spawn(|| {
        runtime::install(Session::new(BackendProfile::named("strict_cpu").unwrap())).unwrap();
        let mut s = 7u64;
        let mut draw = |n: usize, offset: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    s = spec::splitmix64(s);
                    offset + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect()
        };
        let f64s = |v: &[f32]| Array {
            shape: vec![v.len()],
            data: v.iter().map(|&x| x as f64).collect(),
        };
        let rel = |got: f32, want: f64| ((got as f64 - want) / want).abs();
        // sum_all over 2^20 values near 100
        let x = draw(1 << 20, 100.0);
        let got = Tensor::from_vec(x.clone(), &[x.len()])
            .unwrap()
            .sum_all()
            .unwrap()
            .to_vec()[0];
        let want = spec::forward(&Op::SumAll, &[&f64s(&x)]).unwrap().data[0];
        assert!(
            rel(got, want) < 1e-6,
            "sum_all: relative error {:e}",
            rel(got, want)
        );
        // mse_loss over 300 000 pairs
        let (a, b) = (draw(300_000, 0.0), draw(300_000, 0.5));
        let got = Tensor::from_vec(a.clone(), &[a.len()])
            .unwrap()
            .mse_loss(&Tensor::from_vec(b.clone(), &[b.len()]).unwrap())
            .unwrap()
            .to_vec()[0];
        let want = spec::forward(&Op::MseLoss, &[&f64s(&a), &f64s(&b)])
            .unwrap()
            .data[0];
        assert!(
            rel(got, want) < 1e-6,
            "mse_loss: relative error {:e}",
            rel(got, want)
        );
        // layer norm of 8 rows of 512 values near 1000 (the mean's error is amplified by 1/σ)
        let (rows, d) = (8, 512);
        let x = draw(rows * d, 1000.0);
        let (g, b) = (vec![1.0f32; d], vec![0.0f32; d]);
        let t = |v: &Vec<f32>, s: &[usize]| Tensor::from_vec(v.clone(), s).unwrap();
        let got = t(&x, &[rows, d])
            .layer_norm(&t(&g, &[d]), &t(&b, &[d]), 1e-5)
            .unwrap()
            .to_vec();
        let op = Op::LayerNorm { eps: 1e-5 };
        let mut xa = f64s(&x);
        xa.shape = vec![rows, d];
        let want = spec::forward(&op, &[&xa, &f64s(&g), &f64s(&b)])
            .unwrap()
            .data;
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()));
        assert!(err < 2e-4, "layer_norm: absolute error {err:e}");
    })
    .join()
    .unwrap();
}
