//! Pointwise calls run and checked tile by tile.
//!
//! A replay checker reads a call's inputs and result after the kernel wrote them. For a map
//! over large operands (an optimizer update of a weight matrix, a ReLU over a batch of
//! activations) that second pass comes from memory again and costs about what the kernel
//! did: under `strict_native_cpu` the optimizer's checks were a fifth of an MLP step.
//!
//! When every output element depends only on the input elements at its own position — the
//! unary, binary and optimizer maps over operands of one shape ([`pointwise`]) — a call is
//! the union of the same op's calls on flat tiles of its operands. For such a call the
//! runtime runs the accepted capsule's destination-passing kernel on one tile, then the
//! capsule's checkers on that tile's call while its operands are still in cache, tile after
//! tile (tiles in parallel), into a new output buffer that is handed back only when every
//! tile was accepted.
//!
//! What tiling keeps: the kernel is the accepted capsule's (its dense variant, which the
//! conformance harness holds to the forward kernel's bits); the checkers are exactly the
//! capsule's evidence, run on every tile, each tile a real call of the op with its actual
//! inputs and result and its own seed from the runtime's stream; every element is checked.
//! What it changes: the recompute checks' bound is relative to the largest |spec value| of
//! what they compare, which over a tile is at most the call's, so a tile-wise acceptance
//! implies the whole call's acceptance — tiling can only reject more (docs/assurance.md,
//! "Checked by tiles"). A rejection names the tile's elements.
//!
//! An update of several tensors whose new elements each read their group's operands at their
//! own position ([`pointwise_groups`]: `adam_step`, a parameter's `w`, `m`, `v` from its `w`,
//! `m`, `v`, `g`) runs the same way ([`update_many`]): each parameter's tiles are calls of the
//! op on one parameter of a tile's length, checked as they are computed, written into new
//! buffers that the targets take only when every tile of every parameter was accepted — so a
//! rejected update leaves every target as it was, and no flat value of all parameters is
//! built, copied and checked out of cache.
//!
//! In a fault-injection build with a campaign running, the tiles' kernels run first, the
//! fault is injected into the assembled result, then the tiles are checked: the same
//! checks, so the campaign measures them. (An update of several tensors runs whole then: its
//! faults are injected into the whole call's value, which the same checker replays.)
//!
//! Must not: run any kernel but the accepted capsule's, skip a checker, or tile an op whose
//! output element reads other positions.

use super::guarded::{check, dense_operand, next_seed};
use super::kernel::{Dense, DenseKernels, KernelBinding};
use crate::backend::{AcceptedKernel, Call, Device, Operand, Phase};
use crate::error::{Error, Result};
use crate::graph::{Op, OpKind};
use crate::spec::splitmix64;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Elements per tile: 64 KiB per operand, so an optimizer update's four operands stay in
/// the core's L2 between the kernel and the check.
pub(crate) const TILE: usize = 1 << 14;

/// Calls smaller than this run whole (their operands are in cache anyway).
const MIN_ELEMENTS: usize = 2 * TILE;

/// Whether each output element of `op` reads only the input elements at its position (for
/// operands of one shape): the unary, binary and optimizer maps.
pub(crate) fn pointwise(op: &Op) -> bool {
    let kind = op.kind();
    kind.is_unary_map() || kind.is_binary_map() || kind.is_optimizer_map()
}

/// Whether every checker of `phase` is one whose verdicts decompose over tiles (a tile's
/// acceptance implies the call's): the built-in layout and replay checkers, whose bounds are
/// per element or relative to a maximum over what they compare (docs/assurance.md, "Checked
/// by tiles"). A checker registered from elsewhere may hold a per-call budget, so a call it
/// checks runs whole.
fn decomposes(k: &AcceptedKernel, phase: Phase) -> bool {
    use crate::providers::checkers::{canonical_layout, replay};
    let known = [
        crate::checker!(canonical_layout),
        crate::checker!(replay::replay_forward),
        crate::checker!(replay::replay_vjp),
    ];
    k.checkers(phase).iter().all(|c| known.contains(c))
}

/// The elements of a dense host tensor of shape `shape`; `None` for anything else.
fn dense_host<'a>(t: &'a Tensor, shape: &[usize]) -> Option<&'a [f32]> {
    if t.device() != Device::Cpu || t.shape() != shape || !t.is_contiguous() {
        return None;
    }
    let off = t.layout().offset;
    t.storage_slice().get(off..off + t.numel())
}

/// The dense kernels of `k` when a call of `op` on `operands` (inputs, then for a VJP the
/// output and cotangent) qualifies for tiling: a pointwise op with checkers for `phase`, not
/// a composite, every operand dense on the host with one shape, large enough.
fn qualifies<'a>(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    phase: Phase,
    op: &Op,
    operands: &[&'a Tensor],
) -> Option<(DenseKernels, Vec<&'a [f32]>)> {
    if !pointwise(op)
        || !k.capsule().parts.is_empty()
        || k.checkers(phase).is_empty()
        || !decomposes(k, phase)
    {
        return None;
    }
    let dense = binding.dense()?;
    let shape = operands.first()?.shape();
    if operands[0].numel() < MIN_ELEMENTS {
        return None;
    }
    let slices = operands
        .iter()
        .map(|t| dense_host(t, shape))
        .collect::<Option<Vec<_>>>()?;
    Some((dense, slices))
}

/// For an op that updates several tensors in groups (`OpKind::update_groups`) and whose
/// every new element reads only its group's operands at its own position: the group's
/// (updated, read) counts. `adam_step` only.
pub(crate) fn pointwise_groups(kind: OpKind) -> Option<(usize, usize)> {
    match kind {
        OpKind::AdamStep => kind.update_groups(),
        _ => None,
    }
}

/// Whether an update of several tensors of `kind` under `k` runs by tiles
/// ([`update_many`]) when its operands are dense host tensors.
pub(crate) fn updates_many_by_tiles(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    kind: OpKind,
) -> bool {
    pointwise_groups(kind).is_some()
        && k.capsule().parts.is_empty()
        && !k.checkers(Phase::Forward).is_empty()
        && decomposes(k, Phase::Forward)
        && binding.dense().is_some()
}

#[cfg(feature = "fault-injection")]
/// The tiles' element ranges over `n` elements.
fn tiles(n: usize) -> impl IndexedParallelIterator<Item = (usize, usize)> {
    (0..n.div_ceil(TILE))
        .into_par_iter()
        .map(move |t| (t * TILE, ((t + 1) * TILE).min(n)))
}

/// A checker rejection, with the tile's elements named.
fn within_tile(e: Error, lo: usize, hi: usize, n: usize) -> Error {
    within(e, "", lo, hi, n)
}

/// A checker rejection, with the tile's elements (of the tensors `whose`) named.
fn within(e: Error, whose: &str, lo: usize, hi: usize, n: usize) -> Error {
    match e {
        Error::CheckerRejected {
            op,
            capsule,
            checker,
            reason,
        } => Error::CheckerRejected {
            op,
            capsule,
            checker,
            reason: format!(
                "{whose}elements {lo}..{hi} of {n} (checked by tiles; positions below count from {lo}): {reason}"
            ),
        },
        other => other,
    }
}

/// Runs the forward kernel of `k` by tiles, each followed by the forward checkers on its
/// call; `None` when the call does not qualify (the caller runs it whole).
pub(crate) fn forward(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    op: &Op,
    inputs: &[&Tensor],
) -> Option<Result<Tensor>> {
    let (dense, xs) = qualifies(k, binding, Phase::Forward, op, inputs)?;
    let shape = inputs[0].shape();
    Some(run_forward(k, binding, dense, op, inputs, &xs, shape))
}

fn run_forward(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    dense: DenseKernels,
    op: &Op,
    inputs: &[&Tensor],
    xs: &[&[f32]],
    shape: &[usize],
) -> Result<Tensor> {
    let n = xs[0].len();
    super::buffers::check_output(op.name(), n)?;
    let mut out = super::buffers::take_overwritten(n);
    let seed = next_seed();
    let kernel = |lo: usize, dst: &mut [f32]| -> Result<()> {
        let tile = [dst.len()];
        let parts: Vec<Dense> = xs
            .iter()
            .map(|x| Dense {
                data: &x[lo..lo + dst.len()],
                shape: &tile,
            })
            .collect();
        (dense.forward_into)(op, &parts, dst)
    };
    let checks = |lo: usize, hi: usize, y: &[f32]| -> Result<()> {
        let tile = [hi - lo];
        let operands: Vec<Operand> = xs
            .iter()
            .map(|x| dense_operand(&x[lo..hi], &tile))
            .collect();
        let call = Call {
            inputs: &operands,
            output: dense_operand(y, &tile),
            cotangent: None,
            needs: &[],
            grads: &[],
            seed: splitmix64(seed ^ lo as u64),
        };
        check(k, Phase::Forward, op, &call).map_err(|e| within_tile(e, lo, hi, n))
    };
    #[cfg(feature = "fault-injection")]
    if super::guarded::fault::active() {
        out.par_chunks_mut(TILE)
            .enumerate()
            .try_for_each(|(t, dst)| kernel(t * TILE, dst))?;
        let clean = Tensor::from_vec(out, shape)?;
        let hit = super::guarded::fault::after_forward(binding.forward(), op, inputs, clean)?;
        let y = hit.host_data();
        return tiles(n)
            .try_for_each(|(lo, hi)| checks(lo, hi, &y[lo..hi]))
            .map(|()| hit.clone());
    }
    let _ = (binding, inputs);
    super::op_times::timed(
        &k.capsule().name,
        "forward + checks, by tiles",
        Device::Cpu,
        || {
            out.par_chunks_mut(TILE)
                .enumerate()
                .try_for_each(|(t, dst)| {
                    let lo = t * TILE;
                    kernel(lo, dst)?;
                    checks(lo, lo + dst.len(), dst)
                })
        },
    )?;
    Tensor::from_vec(out, shape)
}

/// Runs the VJP kernel of `k` by tiles, each followed by the VJP checkers on its call;
/// `None` when the call does not qualify.
pub(crate) fn vjp(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    cotangent: &Tensor,
    needs: &[bool],
) -> Option<Result<Vec<Option<Tensor>>>> {
    #[cfg(feature = "fault-injection")]
    if super::guarded::fault::active() {
        // a VJP's faults (a dropped gradient among them) are injected on whole results:
        // such a campaign runs VJPs whole
        return None;
    }
    let mut all: Vec<&Tensor> = inputs.to_vec();
    all.extend([output, cotangent]);
    let (dense, slices) = qualifies(k, binding, Phase::Vjp, op, &all)?;
    let vjp_into = dense.vjp_into?;
    if needs.len() != inputs.len() {
        return None;
    }
    Some(run_vjp(k, vjp_into, op, &slices, inputs[0].shape(), needs))
}

fn run_vjp<'a>(
    k: &AcceptedKernel,
    vjp_into: super::kernel::VjpIntoKernel,
    op: &Op,
    slices: &[&'a [f32]],
    shape: &[usize],
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let m = needs.len();
    let (xs, y, g) = (&slices[..m], slices[m], slices[m + 1]);
    let n = y.len();
    let mut bufs: Vec<Option<Vec<f32>>> = Vec::with_capacity(m);
    for &need in needs {
        bufs.push(if need {
            super::buffers::check_output(op.name(), n)?;
            Some(super::buffers::take_overwritten(n))
        } else {
            None
        });
    }
    // per tile, the tile of each gradient buffer (`None` where no gradient is needed)
    let mut per_tile: Vec<Vec<Option<&mut [f32]>>> = (0..n.div_ceil(TILE))
        .map(|_| Vec::with_capacity(m))
        .collect();
    for buf in bufs.iter_mut() {
        match buf {
            Some(b) => {
                for (t, c) in b.chunks_mut(TILE).enumerate() {
                    per_tile[t].push(Some(c));
                }
            }
            None => per_tile.iter_mut().for_each(|t| t.push(None)),
        }
    }
    let seed = next_seed();
    super::op_times::timed(
        &k.capsule().name,
        "vjp + checks, by tiles",
        Device::Cpu,
        || {
            per_tile
                .into_par_iter()
                .enumerate()
                .try_for_each(|(t, mut outs)| {
                    let (lo, hi) = (t * TILE, ((t + 1) * TILE).min(n));
                    let tile = [hi - lo];
                    let part = |s: &'a [f32]| Dense {
                        data: &s[lo..hi],
                        shape: &tile,
                    };
                    let parts: Vec<Dense> = xs.iter().map(|&x| part(x)).collect();
                    vjp_into(op, &parts, part(y), part(g), &mut outs)?;
                    let operands: Vec<Operand> =
                        parts.iter().map(|d| dense_operand(d.data, &tile)).collect();
                    let grads: Vec<Option<Operand>> = outs
                        .iter()
                        .map(|o| o.as_deref().map(|o| dense_operand(o, &tile)))
                        .collect();
                    let call = Call {
                        inputs: &operands,
                        output: dense_operand(&y[lo..hi], &tile),
                        cotangent: Some(dense_operand(&g[lo..hi], &tile)),
                        needs,
                        grads: &grads,
                        seed: splitmix64(seed ^ lo as u64),
                    };
                    check(k, Phase::Vjp, op, &call).map_err(|e| within_tile(e, lo, hi, n))
                })
        },
    )?;
    bufs.into_iter()
        .map(|b| b.map(|b| Tensor::from_vec(b, shape)).transpose())
        .collect()
}

thread_local! {
    /// A tile's value (its parts side by side) between the kernel and the checks: taken out
    /// while in use, so a nested use on the same thread allocates instead of sharing it.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs an update of several tensors (`op` with [`pointwise_groups`]) under the forward
/// checkers of `k` by tiles: per group and tile, the accepted capsule's destination-passing
/// kernel on the tile's operands, then the checkers on that call, then the tile's parts
/// copied into new buffers; the targets take their buffers only after every tile was
/// accepted. `None` when the call does not qualify (the caller computes the whole value and
/// checks it). The caller ran the guards.
pub(crate) fn update_many(
    k: &AcceptedKernel,
    binding: &KernelBinding,
    op: &Op,
    targets: &mut [&mut Tensor],
    rest: &[&Tensor],
) -> Option<Result<()>> {
    #[cfg(feature = "fault-injection")]
    if super::guarded::fault::active() {
        return None;
    }
    let (t, r) = pointwise_groups(op.kind())?;
    if !updates_many_by_tiles(k, binding, op.kind()) {
        return None;
    }
    let dense = binding.dense()?;
    let groups = targets.len() / t;
    if groups == 0 || targets.len() != groups * t || rest.len() != groups * r {
        return None;
    }
    let buffers = {
        // each group's operands, its targets then its other inputs, dense on the host with
        // one shape
        let mut operands: Vec<&[f32]> = Vec::with_capacity(groups * (t + r));
        for gi in 0..groups {
            let shape = targets[gi * t].shape();
            let group = targets[gi * t..(gi + 1) * t]
                .iter()
                .map(|x| &**x)
                .chain(rest[gi * r..(gi + 1) * r].iter().copied());
            for x in group {
                operands.push(dense_host(x, shape)?);
            }
        }
        run_update_many(k, dense, op, (t, r), &operands)
    };
    Some(buffers.and_then(|buffers| {
        for (target, buffer) in targets.iter_mut().zip(buffers) {
            let value = Tensor::from_vec(buffer, target.shape())?;
            target.assign(value)?;
        }
        Ok(())
    }))
}

/// The new buffers of an update of several tensors, computed and checked by tiles
/// ([`update_many`]); `operands` holds each group's `t` targets and `r` other inputs.
fn run_update_many(
    k: &AcceptedKernel,
    dense: DenseKernels,
    op: &Op,
    (t, r): (usize, usize),
    operands: &[&[f32]],
) -> Result<Vec<Vec<f32>>> {
    let mut buffers = Vec::with_capacity(operands.len() / (t + r) * t);
    for group in operands.chunks(t + r) {
        for _ in 0..t {
            super::buffers::check_output(op.name(), group[0].len())?;
            buffers.push(super::buffers::take_overwritten(group[0].len()));
        }
    }
    // (group, first element, the tile of each of the group's new buffers)
    let mut items: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::new();
    for (gi, group) in buffers.chunks_mut(t).enumerate() {
        let mut chunks: Vec<_> = group.iter_mut().map(|b| b.chunks_mut(TILE)).collect();
        let mut lo = 0;
        while let Some(outs) = chunks
            .iter_mut()
            .map(Iterator::next)
            .collect::<Option<Vec<_>>>()
        {
            let len = outs[0].len();
            items.push((gi, lo, outs));
            lo += len;
        }
    }
    let groups = operands.len() / (t + r);
    let seed = next_seed();
    super::op_times::timed(
        &k.capsule().name,
        "update + checks, by tiles",
        Device::Cpu,
        || {
            items.into_par_iter().try_for_each(|(gi, lo, mut outs)| {
                let len = outs[0].len();
                let (hi, n) = (lo + len, operands[gi * (t + r)].len());
                let tile = [len];
                let parts: Vec<Dense> = operands[gi * (t + r)..(gi + 1) * (t + r)]
                    .iter()
                    .map(|x| Dense {
                        data: &x[lo..hi],
                        shape: &tile,
                    })
                    .collect();
                let mut value = SCRATCH.take();
                if value.len() < t * len {
                    value.resize(t * len, 0.0);
                }
                let result = (|| -> Result<()> {
                    let value = &mut value[..t * len];
                    (dense.forward_into)(op, &parts, value)?;
                    let inputs: Vec<Operand> =
                        parts.iter().map(|d| dense_operand(d.data, &tile)).collect();
                    let whole = [t * len];
                    let call = Call {
                        inputs: &inputs,
                        output: dense_operand(value, &whole),
                        cotangent: None,
                        needs: &[],
                        grads: &[],
                        seed: splitmix64(seed ^ ((gi as u64) << 40) ^ lo as u64),
                    };
                    let whose = if groups > 1 {
                        format!("group {gi} of {groups}: ")
                    } else {
                        String::new()
                    };
                    check(k, Phase::Forward, op, &call)
                        .map_err(|e| within(e, &whose, lo, hi, n))?;
                    for (j, out) in outs.iter_mut().enumerate() {
                        out.copy_from_slice(&value[j * len..(j + 1) * len]);
                    }
                    Ok(())
                })();
                SCRATCH.set(value);
                result
            })
        },
    )?;
    Ok(buffers)
}
