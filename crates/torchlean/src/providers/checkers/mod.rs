//! Executable replay checkers, which the runtime runs after every call of the kernels whose
//! capsules cite them (see `backend::guard`).
//!
//! `canonical_layout` — claim: the kernel's result is a canonical row-major tensor of the
//! shape the spec's shape rule assigns (forward: the output, of `spec::infer_shape` of the
//! call's actual input shapes; VJP: each returned gradient, of its input's shape).
//! Soundness: the checker recomputes the expected shape from this call's inputs and verifies
//! the result has exactly that shape, a dense row-major layout from offset 0 and exactly
//! `numel(shape)` elements of storage, so acceptance implies the claim for this call (an
//! integer check: no float assumptions). It runs on what the kernel *returned*, after the
//! kernel: a kernel that returns a view, a wrong shape or a short buffer is rejected (mutation
//! tests in tests/trust.rs).

use crate::backend::{Call, Operand};
use crate::graph::Op;
use crate::spec::{contiguous_strides, infer_shape, numel};

fn canonical(what: &str, o: &Operand, expected: &[usize]) -> Result<(), String> {
    let dense_strides = match o.strides {
        None => true,
        Some(s) => expected
            .iter()
            .zip(s)
            .zip(contiguous_strides(expected))
            .all(|((&d, &s), c)| d <= 1 || s == c),
    };
    verdict(
        what,
        o,
        expected,
        dense_strides,
        "a canonical row-major tensor",
    )
}

/// Accepts `o` when it has `expected`'s shape, offset 0, exactly `numel(expected)` elements
/// of storage and acceptable strides (`strides_ok`); otherwise says what it has and that
/// `wanted` of that shape was expected.
fn verdict(
    what: &str,
    o: &Operand,
    expected: &[usize],
    strides_ok: bool,
    wanted: &str,
) -> Result<(), String> {
    if o.shape == expected && o.offset == 0 && strides_ok && o.storage.len() == numel(expected) {
        Ok(())
    } else {
        Err(format!(
            "{what} has shape {:?} strides {:?} offset {} over {} stored elements; expected {wanted} of shape {expected:?}",
            o.shape, o.strides, o.offset, o.storage.len()
        ))
    }
}

/// Checks that the result of a view op (reshape, permute, broadcast_to, slice, concat, which
/// may return views of their input's storage) has the shape the spec assigns and a strided
/// layout that addresses only elements of its storage; gradients are checked dense (see
/// [`dense_layout`]).
/// Soundness: an integer check of this call's result, as for [`canonical_layout`].
pub fn view_layout(op: &Op, call: &Call) -> Result<(), String> {
    if call.cotangent.is_some() {
        // gradients dense: row-major, or (a permute's VJP of a dense cotangent) its axes in
        // another order
        return dense_layout(op, call);
    }
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    let expected = infer_shape(op, &shapes).map_err(|e| e.to_string())?;
    let o = &call.output;
    if o.shape != expected.as_slice() {
        return Err(format!(
            "result has shape {:?}, expected {expected:?}",
            o.shape
        ));
    }
    let n = numel(&expected);
    if n == 0 {
        return Ok(());
    }
    let last = match o.strides {
        None => (n - 1).checked_add(o.offset),
        Some(s) => layout::last_address(&expected, s, o.offset),
    };
    match last {
        Some(end) if end < o.storage.len() => Ok(()),
        _ => Err(format!(
            "result view (strides {:?}, offset {}) addresses past its storage of {} elements",
            o.strides,
            o.offset,
            o.storage.len()
        )),
    }
}

/// Whether `o` has exactly `expected`'s shape, offset 0, exactly `numel` elements of storage,
/// and strides that are the row-major strides of `expected` with its axes in some order, so
/// that every element is stored exactly once (axes of extent ≤ 1 may have any stride).
/// Written here from the claim, not by calling `tensor::Layout::is_dense_in`, which the
/// kernels under check use to decide what they return.
fn dense(what: &str, o: &Operand, expected: &[usize]) -> Result<(), String> {
    let n = numel(expected);
    let strides_dense = match o.strides {
        None => true,
        Some(s) if s.len() != expected.len() => false,
        // no element: nothing is addressed
        Some(_) if n == 0 => true,
        Some(s) => {
            // the axes that move, innermost (smallest stride) first: each stride must be the
            // product of the extents of the axes inside it
            let mut axes: Vec<(usize, usize)> = expected
                .iter()
                .zip(s)
                .filter(|(&d, _)| d > 1)
                .map(|(&d, &st)| (st, d))
                .collect();
            axes.sort_unstable();
            let mut inner = Some(1usize);
            axes.iter().all(|&(st, d)| {
                let ok = inner == Some(st);
                inner = inner.and_then(|i| i.checked_mul(d));
                ok
            })
        }
    };
    verdict(
        what,
        o,
        expected,
        strides_dense,
        "a dense tensor (every element stored once, from offset 0, in some axis order)",
    )
}

/// Checks that the call's result (output, or each gradient of a VJP call) has the shape the
/// spec assigns and is dense: every element stored exactly once from offset 0, its axes in
/// some order (a head-interleaved attention output, say). Soundness: an integer check of
/// this call's result, as for [`canonical_layout`]; acceptance implies the storage holds the
/// tensor's elements and nothing else, each at the address its strides give.
pub fn dense_layout(op: &Op, call: &Call) -> Result<(), String> {
    each_result(op, call, dense)
}

/// `check(what, result, expected shape)` on each gradient of a VJP call (against its
/// input's shape), or on a forward call's output (against the spec's shape for the call's
/// inputs).
fn each_result(
    op: &Op,
    call: &Call,
    check: fn(&str, &Operand, &[usize]) -> Result<(), String>,
) -> Result<(), String> {
    if call.cotangent.is_some() {
        for (i, (g, x)) in call.grads.iter().zip(call.inputs).enumerate() {
            if let Some(g) = g {
                check(&format!("gradient {i}"), g, x.shape)?;
            }
        }
        return Ok(());
    }
    let shapes: Vec<&[usize]> = call.inputs.iter().map(|o| o.shape).collect();
    let expected = infer_shape(op, &shapes).map_err(|e| e.to_string())?;
    check("result", &call.output, &expected)
}

/// Checks that the call's result (output, or each gradient of a VJP call) is canonical
/// row-major with the shape the spec assigns.
pub fn canonical_layout(op: &Op, call: &Call) -> Result<(), String> {
    each_result(op, call, canonical)
}

mod attention;
mod attention32;
mod conv;
mod exp64;
mod freivalds;
mod gelu;
mod lanes;
mod layout;
mod maps;
mod norm;
mod optim;
mod overflow;
mod pieces;
pub mod recompute;
pub mod replay;
mod rounded;
mod unary;
