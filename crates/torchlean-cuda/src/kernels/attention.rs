//! `native_cuda.flash_attention`: scaled dot-product attention in the FlashAttention-2 style
//! (issue 12), the CUDA sources `kernels/attention/*.cu`. No L×S matrix is kept in device
//! memory (an additive mask's gradient, which *is* such a matrix, is the one exception):
//!
//! - forward: one block per 64 query rows and 64-column chunk of dv, walking 64-key tiles
//!   with an online softmax (running maximum, normalizer and output per row). On sm_80 or
//!   newer with d, dv <= 64 its two products run on tensor cores in split-TF32
//!   (`flash_forward_mma`: three TF32 products per f32 product, each product within about
//!   2^-20 of |a||b|; on by default, `TORCHLEAN_FLASH_MMA=0` turns it off:
//!   `Context::flash_mma`), unless a value of q, k or v is 2^24 or more in magnitude or not
//!   finite — a device-side flag, on which the f32 FMA kernel is gated, so that such calls
//!   keep the f32 kernel's exact non-finite semantics without the host waiting; the same
//!   holds for the key/value VJP kernel below (`flash_bwd_kv_mma`, also over O and dO;
//!   opt-in with `TORCHLEAN_FLASH_MMA=1`: slower than the f32 kernel so far);
//! - VJP, recomputing: a stats pass (each row's log-sum-exp of its allowed scores, whether it
//!   attends any key, and D = dO·O), then one kernel per 64 keys for dK and dV, which with
//!   one chunk of each head dimension also leaves dQ's terms in slots that a last kernel adds
//!   in order (`attention_slots`), else one kernel per 64 query rows for dQ (and the
//!   additive mask's gradient): every sum in a fixed order, bit-identical run to run
//!   ([`vjp`], `native_cuda.flash_attention`). The
//!   opt-in `native_cuda.flash_attention_atomic` ([`vjp_atomic`], planned only under
//!   `--allow-nondeterministic`) lets the key kernel also add dQ with `atomicAdd` where one
//!   chunk of each head dimension (d, dv <= 64) allows it: two L×S×d products fewer, in an
//!   order that varies from run to run (declared nondeterministic).
//!
//! A boolean mask is packed to bits first (one pass over it; [L, S] shared or one per batch
//! matrix, as the shape rule allows). Causal key tiles past a query tile's last row are
//! skipped when a device-side flag says every value the skipped products would read is
//! finite — the spec multiplies a blocked entry's zero weight into v and into the gradient
//! products, so a NaN there reaches rows that attend none of its keys (docs/attention.md).
//!
//! The guards cited by the capsule (shape rule, dense CUDA inputs) have already run.

use super::{buffer, cx, launched, output, tensor};
use crate::device::Context;
use crate::memory::CudaBuffer;
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use torchlean::graph::{AttentionMask, Op, OpKind};
use torchlean::{Error, Result, Tensor};

/// The op these kernels compute.
pub const KINDS: &[OpKind] = &[OpKind::ScaledDotProductAttention];

/// Rows / keys per tile and head-dimension chunk (`FA_T`, `FA_C` in the source).
const TILE: usize = 64;
/// Floats of one shared tile (`FA_TILE`: 64 rows of stride 68).
const TILE_FLOATS: u32 = 64 * 68;
/// Shared tiles of each kernel.
const FORWARD_TILES: u32 = 3;
const BWD_KV_TILES: u32 = 6;
/// The key/value VJP's shared memory: its tiles and a query tile's three statistics
/// (`flash_bwd_kv_one_chunk`'s `rs`).
const BWD_KV_BYTES: u32 = BWD_KV_TILES * TILE_FLOATS * 4 + 3 * 64 * 4;
/// The query VJP kernel's tiles (its one-chunk path: q, dO, K, V, dS).
const BWD_Q_TILES: u32 = 5;
/// Shared memory of the tensor-core forward: three split tiles (`FA_SPLIT_TILE`: 64 rows of
/// 144 words — q rows, k rows, v columns, each value as its TF32 big and small parts).
const MMA_FWD_BYTES: u32 = 3 * 64 * 144 * 4;
/// Shared memory of the tensor-core key/value VJP (`FA_MMA_BWD_FLOATS`: the block's k and v
/// tiles; q, dO and dS of a 32-query tile, rows of stride 68; q and dO again row-split, rows
/// of 144 words; the tile's three statistics and two mask words per query).
const MMA_BWD_BYTES: u32 = (2 * TILE_FLOATS + 3 * 32 * 68 + 2 * 32 * 144 + 5 * 32) * 4;
/// A null `gate` of `flash_forward`: the f32 forward takes every call it is launched for.
const NO_GATE: u64 = 0;

/// Refuses a call where the GPU cannot give the flash kernels their shared memory (the
/// context records why; the rest of the CUDA module works there).
fn usable(cx: &Context, op: &Op) -> Result<()> {
    match &cx.flash_unavailable {
        Some(why) => Err(crate::device::failure(
            op.name(),
            format!(
                "the fused flash-attention kernels cannot run on this GPU: {why}; plan the \
                 composition instead (`--provider prefer:torchlean`)"
            ),
        )),
        None => Ok(()),
    }
}

/// Lets each flash kernel take the dynamic shared memory it needs (more than the default
/// 48 KiB): called once when the module loads ([`crate::device`]). A GPU whose per-block
/// opt-in limit is lower (about 99 KiB on sm_86/89/120, 64 KiB on sm_75) refuses some: the
/// error names the kernel, and the module records it for the flash calls only.
pub fn allow_shared_memory(f: &crate::device::Functions) -> std::result::Result<(), String> {
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX;
    let tiles = |n: u32| n * TILE_FLOATS * 4;
    for (name, func, bytes) in [
        ("flash_forward", &f.flash_forward, tiles(FORWARD_TILES)),
        ("flash_bwd_kv", &f.flash_bwd_kv, BWD_KV_BYTES),
        ("flash_bwd_q", &f.flash_bwd_q, tiles(BWD_Q_TILES)),
        (
            "flash_forward_tiles",
            &f.flash_forward_tiles,
            tiles(FORWARD_TILES),
        ),
        ("flash_bwd_kv_tiles", &f.flash_bwd_kv_tiles, BWD_KV_BYTES),
        (
            "flash_bwd_q_tiles",
            &f.flash_bwd_q_tiles,
            tiles(BWD_Q_TILES),
        ),
        ("flash_bwd_kv_mma", &f.flash_bwd_kv_mma, MMA_BWD_BYTES),
        ("flash_forward_mma", &f.flash_forward_mma, MMA_FWD_BYTES),
        (
            "flash_forward_mma_tiles",
            &f.flash_forward_mma_tiles,
            MMA_FWD_BYTES,
        ),
        (
            "flash_bwd_kv_mma_tiles",
            &f.flash_bwd_kv_mma_tiles,
            MMA_BWD_BYTES,
        ),
    ] {
        func.set_attribute(MAX, bytes as i32).map_err(|e| {
            format!("kernel `{name}`: cannot allow {bytes} bytes of shared memory: {e}")
        })?;
    }
    Ok(())
}

/// Blocks of the f32 key/value VJP (`flash_bwd_kv`, [`THREADS`] threads, [`BWD_KV_BYTES`]
/// of shared memory) one SM holds at once, by the driver's occupancy calculator; `None`
/// when it cannot tell.
pub fn key_kernel_blocks_per_sm(f: &crate::device::Functions) -> Option<usize> {
    f.flash_bwd_kv
        .occupancy_max_active_blocks_per_multiprocessor(THREADS, BWD_KV_BYTES as usize, None)
        .ok()
        .map(|n| n as usize)
        .filter(|&n| n > 0)
}

/// Mirror of `struct Flash` in `kernels/attention/common.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Flash {
    bh: i64,
    l: i64,
    s: i64,
    d: i64,
    dv: i64,
    mask_bstride: i64,
    words: i64,
    scale: f32,
    causal: i32,
    mask: i32,
    /// 1 when the tile words of `flash_tile_any` follow the packed bits.
    tiles: i32,
}
// SAFETY: plain `repr(C)` integers and a float, laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Flash {}

/// One call's geometry and its device-side mask and finiteness flag.
struct Call<'a> {
    g: Flash,
    q: &'a CudaBuffer,
    k: &'a CudaBuffer,
    v: &'a CudaBuffer,
    /// The packed boolean mask, or any buffer (unread) when there is none.
    bits: CudaBuffer,
    /// The additive mask, or any buffer (unread) when there is none.
    bias: &'a CudaBuffer,
    /// 1 when some value the skipped causal products would read is not finite.
    nonfinite: CudaBuffer,
    /// 1 when some value a tensor-core kernel would split is too large ([`MMA_LIMIT`]);
    /// present when the call asked for it (`prepare`'s `wide`).
    wide: Option<CudaBuffer>,
}

/// Tensors per launch of `flash_flags` (`FA_SCAN_MAX`).
const SCAN_MAX: usize = 6;

/// Mirror of `struct Scan` in `kernels/attention/common.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Scan {
    p: [u64; SCAN_MAX],
    n: [i64; SCAN_MAX],
    finite: [i32; SCAN_MAX],
    wide: [i32; SCAN_MAX],
    limit: f32,
}
// SAFETY: plain `repr(C)` integers and a float, laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Scan {}

/// Threads per block of the flash kernels (`FA_THREADS`).
const THREADS: u32 = 128;

/// The launch of a flash kernel: [`THREADS`] threads, `tiles` shared tiles, `x` blocks along the
/// rows or keys, the batch matrices along y (the kernels step through any more), `z` chunks.
fn launch_cfg(x: usize, bh: usize, z: usize, tiles: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, bh.clamp(1, 65_535) as u32, z as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: tiles * TILE_FLOATS * 4,
    }
}

/// Geometry, packed mask (with its tile words) and flags of a call whose shapes the shape
/// guard accepted; `finite` are the tensors whose finiteness lets causal tiles and the mask's
/// blocked tiles be skipped, `wide` those a tensor-core kernel would split (empty when none
/// runs). Both flags come from one pass over each tensor ([`scan_flags`]).
fn prepare<'a>(
    cx: &Context,
    op: &Op,
    inputs: &[&'a Tensor],
    finite: &[&Tensor],
    wide: &[&Tensor],
) -> Result<Call<'a>> {
    let (scale, causal, mask) = torchlean::providers::native_cpu::flash_payload(op)?;
    let qs = inputs[0].shape();
    let r = qs.len();
    let (l, d) = (qs[r - 2], qs[r - 1]);
    let (s, dv) = (inputs[1].shape()[r - 2], inputs[2].shape()[r - 1]);
    let bh: usize = qs[..r - 2].iter().product();
    let words = s.div_ceil(32).max(1);
    let (q, k, v) = (
        buffer(op, inputs[0])?,
        buffer(op, inputs[1])?,
        buffer(op, inputs[2])?,
    );
    // the mask's batch stride: 0 for a shared [L, S] mask (the shape rule's other form is
    // the full [..., L, S])
    let shared = mask != AttentionMask::None && inputs[3].shape().len() == 2;
    let mut bits = output(cx, op, 1)?;
    let mut tiles = 0i32;
    let mut mask_bstride = 0i64;
    let mut bias = q;
    match mask {
        AttentionMask::None => {}
        AttentionMask::Boolean => {
            let m = buffer(op, inputs[3])?;
            let rows = if shared { l } else { bh * l };
            let mats = if shared { 1 } else { bh };
            let tile_words = mats * l.div_ceil(TILE) * s.div_ceil(TILE);
            bits = output(cx, op, rows * words + tile_words)?;
            if rows > 0 {
                let (rows64, s64, w64) = (rows as i64, s as i64, words as i64);
                let mut b = cx.stream.launch_builder(&cx.functions.flash_pack_mask);
                b.arg(m.slice())
                    .arg(bits.slice_mut())
                    .arg(&rows64)
                    .arg(&s64)
                    .arg(&w64);
                // SAFETY: thread t reads m[r·s + j] for j < s (r < rows: the mask holds
                // rows·s elements, the shape rule) and lane 0 of each warp writes word t/32
                // < rows·words, the length of `bits`.
                launched(op, unsafe { b.launch(super::grid(rows * words * 32)) })?;
                if tile_words > 0 {
                    let (mats64, l64) = (mats as i64, l as i64);
                    let mut b = cx.stream.launch_builder(&cx.functions.flash_tile_any);
                    b.arg(bits.slice_mut())
                        .arg(&mats64)
                        .arg(&l64)
                        .arg(&s64)
                        .arg(&w64);
                    // SAFETY: thread t < mats·⌈l/64⌉·⌈s/64⌉ = tile_words reads words of rows
                    // below mats·l = rows (rows·words packed above) and writes word
                    // rows·words + t, inside the rows·words + tile_words allocated.
                    launched(op, unsafe { b.launch(super::grid(tile_words)) })?;
                    tiles = 1;
                }
            }
            if !shared {
                mask_bstride = (l * words) as i64;
            }
        }
        AttentionMask::AdditiveBias => {
            bias = buffer(op, inputs[3])?;
            if !shared {
                mask_bstride = (l * s) as i64;
            }
        }
    }
    let mut nonfinite = output(cx, op, 1)?;
    launched(op, cx.stream.memset_zeros(nonfinite.slice_mut()))?;
    let mut wide_flag = None;
    if !wide.is_empty() {
        let mut flag = output(cx, op, 1)?;
        launched(op, cx.stream.memset_zeros(flag.slice_mut()))?;
        wide_flag = Some(flag);
    }
    // the flag lets causal tiles and the boolean mask's blocked tiles be skipped
    let finite = if causal || tiles != 0 { finite } else { &[] };
    scan_flags(cx, op, finite, wide, &nonfinite, wide_flag.as_ref())?;
    let scale = scale.unwrap_or(torchlean::spec::default_attention_scale(d) as f32);
    Ok(Call {
        g: Flash {
            bh: bh as i64,
            l: l as i64,
            s: s as i64,
            d: d as i64,
            dv: dv as i64,
            mask_bstride,
            words: words as i64,
            scale,
            causal: causal as i32,
            mask: match mask {
                AttentionMask::None => 0,
                AttentionMask::Boolean => 1,
                AttentionMask::AdditiveBias => 2,
            },
            tiles,
        },
        q,
        k,
        v,
        bits,
        bias,
        nonfinite,
        wide: wide_flag,
    })
}

/// One pass over each tensor of `finite` and `wide` (a tensor in both is read once): sets
/// `nonfinite` when a value of a `finite` tensor is not finite, `wide` when a value of a `wide`
/// tensor is not below [`MMA_LIMIT`] in magnitude. Up to [`SCAN_MAX`] tensors per launch.
fn scan_flags(
    cx: &Context,
    op: &Op,
    finite: &[&Tensor],
    wide: &[&Tensor],
    nonfinite: &CudaBuffer,
    wide_flag: Option<&CudaBuffer>,
) -> Result<()> {
    // (tensor, finite?, wide?) in first-seen order, a tensor in both lists once
    let mut list: Vec<(&Tensor, bool, bool)> = Vec::new();
    for (t, is_wide) in finite
        .iter()
        .map(|t| (t, false))
        .chain(wide.iter().map(|t| (t, true)))
    {
        if t.numel() == 0 {
            continue;
        }
        match list.iter_mut().find(|(u, _, _)| u.id() == t.id()) {
            Some(e) if is_wide => e.2 = true,
            Some(e) => e.1 = true,
            None => list.push((t, !is_wide, is_wide)),
        }
    }
    let wide_buf: &CudaBuffer = match wide_flag {
        Some(w) => w,
        // no wide test is asked for: the kernel never writes this pointer
        None if list.iter().all(|e| !e.2) => nonfinite,
        None => {
            return Err(Error::Other(format!(
                "op `{}`: a wide test without its flag",
                op.name()
            )))
        }
    };
    use cudarc::driver::DevicePtr;
    for part in list.chunks(SCAN_MAX) {
        let mut scan = Scan {
            limit: MMA_LIMIT,
            ..Default::default()
        };
        let mut held = Vec::with_capacity(part.len());
        let mut longest = 0usize;
        for (i, (t, f, w)) in part.iter().enumerate() {
            let b = buffer(op, t)?;
            let (ptr, guard) = b.slice().device_ptr(&cx.stream);
            held.push(guard);
            scan.p[i] = ptr;
            scan.n[i] = t.numel() as i64;
            scan.finite[i] = *f as i32;
            scan.wide[i] = *w as i32;
            longest = longest.max(t.numel());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                longest.div_ceil(4 * 256).clamp(1, 1024) as u32,
                part.len() as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = cx.stream.launch_builder(&cx.functions.flash_flags);
        b.arg(&scan).arg(nonfinite.slice()).arg(wide_buf.slice());
        // SAFETY: block row y reads the first n[y] elements of tensor y's dense buffer (its
        // numel, which `buffer` checked the buffer holds; the buffers are held until the
        // launch is queued and reused only by later work on this stream) and may set the
        // first element of the two one-element flags (the same buffer when no tensor is
        // tested for width: then the second is never written); the flags are this call's own
        // buffers, which nothing else reads or writes until the call's kernels run after.
        launched(op, unsafe { b.launch(cfg) })?;
        drop(held);
    }
    Ok(())
}

impl Call<'_> {
    /// The entry point of a flash kernel for this call: the one that tests the tile words
    /// when the packed mask has them, else the one compiled without the test.
    fn kernel<'f>(&self, plain: &'f CudaFunction, tiles: &'f CudaFunction) -> &'f CudaFunction {
        if self.g.tiles != 0 {
            tiles
        } else {
            plain
        }
    }
}

/// A name for one call (its op and its inputs' identities and shapes), under which the
/// forward leaves its row statistics for the VJP of the same call. A VJP handed an output of
/// another call, or of another kernel, finds no statistics under its key and recomputes them.
fn call_key(op: &Op, inputs: &[&Tensor]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if let Op::ScaledDotProductAttention {
        scale,
        causal,
        mask,
    } = op
    {
        scale.map(f32::to_bits).hash(&mut h);
        causal.hash(&mut h);
        (*mask as u8).hash(&mut h);
    }
    for t in inputs {
        t.id().hash(&mut h);
        t.shape().hash(&mut h);
    }
    h.finish()
}

/// The `gate` argument of an f32 kernel that a tensor-core kernel may have taken the call
/// from: that kernel's flag `wide`, or a null pointer when none was launched.
fn gate_arg<'a>(b: &mut cudarc::driver::LaunchArgs<'a>, wide: &'a Option<CudaBuffer>) {
    match wide {
        Some(flag) => b.arg(flag.slice()),
        None => b.arg(&NO_GATE),
    };
}

/// Sets `flag` when one of the first `n` values of `x` is not finite.
fn flag_nonfinite(
    cx: &Context,
    op: &Op,
    x: &CudaBuffer,
    n: usize,
    flag: &mut CudaBuffer,
) -> Result<()> {
    flag_beyond(cx, op, x, n, f32::INFINITY, flag)
}

/// The magnitude every value the tensor-core kernels read must stay below (`FA_LIMIT`,
/// 2^24): then every split operand (q, k, v, dO, P, and dS = P (dP - D) with |dP|, |D| <=
/// 64 · 2^48) and every product stays finite and far from overflow, so the results differ
/// from f32 products only by rounding. Other calls run the f32 FMA kernels.
const MMA_LIMIT: f32 = (1u32 << 24) as f32;

/// Sets `flag` when one of the first `n` values of `x` is not below `limit` in magnitude (NaN
/// included).
fn flag_beyond(
    cx: &Context,
    op: &Op,
    x: &CudaBuffer,
    n: usize,
    limit: f32,
    flag: &mut CudaBuffer,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as i64;
    let mut b = cx.stream.launch_builder(&cx.functions.flash_nonfinite);
    b.arg(x.slice()).arg(&n64).arg(flag.slice_mut()).arg(&limit);
    // SAFETY: reads the first n elements of x (callers pass at most its length) and writes
    // the one-element flag.
    launched(op, unsafe { b.launch(super::grid(n)) })?;
    Ok(())
}

/// The row statistics of a call (`flash_forward` mode 1): log-sum-exp, attends, dO·O, each
/// over the BH·L rows. `out` is the forward's output and `dout` the cotangent.
fn stats(
    cx: &Context,
    op: &Op,
    c: &Call,
    out: &CudaBuffer,
    dout: &CudaBuffer,
) -> Result<CudaBuffer> {
    let rows = (c.g.bh * c.g.l) as usize;
    let mut st = output(cx, op, 3 * rows)?;
    let mode = 1i32;
    let mut b = cx.stream.launch_builder(c.kernel(
        &cx.functions.flash_forward,
        &cx.functions.flash_forward_tiles,
    ));
    call_args(&mut b, c);
    b.arg(out.slice())
        .arg(st.slice_mut())
        .arg(dout.slice())
        .arg(&c.g)
        .arg(&mode)
        .arg(&NO_GATE);
    let cfg = launch_cfg(
        (c.g.l as usize).div_ceil(TILE),
        c.g.bh as usize,
        1,
        FORWARD_TILES,
    );
    // SAFETY: as the forward (below); mode 1 reads `out` and `dout` ([BH, L, dv] each, the
    // output's and the cotangent's shape) and writes the 3·BH·L stats only.
    launched(op, unsafe { b.launch(cfg) })?;
    Ok(st)
}

/// The VJP's call: the flag also covers the additive mask and, after the stats pass, every
/// attending row's maximum and 1 / normalizer (a row whose normalizer is NaN or 0 gives its
/// blocked entries the spec's NaN weight, which a skipped tile would miss).
fn prepare_vjp<'a>(
    cx: &Context,
    op: &Op,
    inputs: &[&'a Tensor],
    out: &'a Tensor,
    gy: &'a Tensor,
    wide: bool,
) -> Result<(Call<'a>, CudaBuffer)> {
    let mut finite: Vec<&Tensor> = vec![inputs[0], inputs[1], inputs[2], out, gy];
    if let Some(bias) = inputs.get(3) {
        finite.push(bias);
    }
    let split = [inputs[0], inputs[1], inputs[2], out, gy];
    let mut c = prepare(cx, op, inputs, &finite, if wide { &split } else { &[] })?;
    let (o, g) = (buffer(op, out)?, buffer(op, gy)?);
    let st = match o.attached(call_key(op, inputs)) {
        Some(left) => {
            // the forward's row maxima and 1 / normalizers, and dO·O computed now
            let rows = (c.g.bh * c.g.l) as usize;
            let mut st = output(cx, op, 3 * rows)?;
            let from = left.slice().slice(0..2 * rows);
            let mut to = st.slice_mut().slice_mut(0..2 * rows);
            launched(op, cx.stream.memcpy_dtod(&from, &mut to))?;
            let (r64, dv64) = (rows as i64, c.g.dv);
            let mut b = cx.stream.launch_builder(&cx.functions.flash_row_dot);
            b.arg(g.slice())
                .arg(o.slice())
                .arg(st.slice_mut())
                .arg(&r64)
                .arg(&dv64);
            // SAFETY: warp `row` reads the dv elements of row `row` < R of the cotangent and
            // the output ([BH, L, dv] each) and writes stats[2R + row] (3R allocated).
            launched(op, unsafe { b.launch(super::warp_grid(rows)) })?;
            st
        }
        None => stats(cx, op, &c, o, g)?,
    };
    if c.g.causal != 0 || c.g.tiles != 0 {
        let rows = (c.g.bh * c.g.l) as usize;
        // every attending row's maximum and 1 / normalizer (the first 2·BH·L stats)
        flag_nonfinite(cx, op, &st, 2 * rows, &mut c.nonfinite)?;
    }
    Ok((c, st))
}

/// The arguments every flash kernel takes first: q, k, v, the mask's bits, the bias and the
/// finiteness flag.
fn call_args<'a>(b: &mut cudarc::driver::LaunchArgs<'a>, c: &'a Call) {
    b.arg(c.q.slice())
        .arg(c.k.slice())
        .arg(c.v.slice())
        .arg(c.bits.slice())
        .arg(c.bias.slice())
        .arg(c.nonfinite.slice());
}

/// The arguments both VJP kernels take first: the call's ([`call_args`]), the row
/// statistics and the cotangent.
fn vjp_inputs<'a>(
    b: &mut cudarc::driver::LaunchArgs<'a>,
    c: &'a Call,
    st: &'a CudaBuffer,
    g: &'a CudaBuffer,
) {
    call_args(b, c);
    b.arg(st.slice()).arg(g.slice());
}

/// The forward kernel of `native_cuda.flash_attention`.
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let n = torchlean::spec::numel(&shape);
    let in_use = cx()?;
    let cx = &*in_use;
    usable(cx, op)?;
    let mut out = output(cx, op, n)?;
    if n == 0 {
        return tensor(out, &shape);
    }
    // with one chunk of each head dimension the tensor-core kernel takes the call unless a
    // value of q, k or v is too large to split (flag `wide`, on the device: the host never
    // waits for it); the f32 kernel, gated on the same flag, then takes it instead
    let (d, dv) = (
        shapes[0][shapes[0].len() - 1],
        shapes[2][shapes[2].len() - 1],
    );
    let mma = cx.flash_mma.forward && d <= TILE && dv <= TILE;
    let mut c = prepare(
        cx,
        op,
        inputs,
        &[inputs[2]],
        if mma { &inputs[..3] } else { &[] },
    )?;
    // the rows' log-sum-exps and whether they attend, left beside the output for this
    // call's VJP (which recomputes them for any other output)
    let mut stats = output(cx, op, 3 * (c.g.bh * c.g.l) as usize)?;
    let blocks = (c.g.l as usize).div_ceil(TILE);
    let mut wide = None;
    if let Some(flag) = c.wide.take().filter(|_| mma) {
        let mut b = cx.stream.launch_builder(c.kernel(
            &cx.functions.flash_forward_mma,
            &cx.functions.flash_forward_mma_tiles,
        ));
        call_args(&mut b, &c);
        b.arg(flag.slice())
            .arg(out.slice_mut())
            .arg(stats.slice_mut())
            .arg(&c.g);
        // SAFETY: as the f32 forward below, with one chunk (d, dv <= 64: blockIdx.z = 0 only)
        // and MMA_FWD_BYTES of shared memory (allowed when the module loaded); it also reads the
        // one-element flag `wide`.
        launched(op, unsafe {
            b.launch(LaunchConfig {
                shared_mem_bytes: MMA_FWD_BYTES,
                ..launch_cfg(blocks, c.g.bh as usize, 1, 0)
            })
        })?;
        wide = Some(flag);
    }
    let mode = 0i32;
    let mut b = cx.stream.launch_builder(c.kernel(
        &cx.functions.flash_forward,
        &cx.functions.flash_forward_tiles,
    ));
    call_args(&mut b, &c);
    b.arg(out.slice_mut())
        .arg(stats.slice_mut())
        .arg(c.q.slice())
        .arg(&c.g)
        .arg(&mode);
    gate_arg(&mut b, &wide);
    let cfg = launch_cfg(
        (c.g.l as usize).div_ceil(TILE),
        c.g.bh as usize,
        (c.g.dv as usize).div_ceil(TILE),
        FORWARD_TILES,
    );
    // SAFETY: block (x, y, z) reads rows of q [BH, L, d], k [BH, S, d], v [BH, S, dv] inside
    // their shapes (every index is bounded by l, s, d, dv: the shape rule gave these
    // buffers exactly those shapes), the packed mask's words (rows·words, as packed) or the
    // bias (its shape, [L, S] or [BH, L, S]), the flag's one element, and writes the output
    // rows of its tile and chunk ([BH, L, dv]) and, chunk 0, their two stats (2·BH·L of
    // the 3·BH·L allocated); mode 0 does not read dout.
    launched(op, unsafe { b.launch(cfg) })?;
    out.attach(call_key(op, inputs), stats);
    tensor(out, &shape)
}

/// The VJP kernel of `native_cuda.flash_attention` (recomputing, deterministic): dQ by the
/// key kernel into slots added in order, or by the query kernel (one block per 64 query rows
/// summing its key tiles in order) where `attention_slots` says so, so every gradient is
/// bit-identical run to run.
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    output_t: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    vjp_with(op, inputs, output_t, gy, needs, DqBy::Deterministic)
}

/// The VJP kernel of `native_cuda.flash_attention_atomic` (recomputing): with one chunk of
/// each head dimension (d, dv <= 64) the key kernel also adds dQ with `atomicAdd`, which
/// saves the query kernel's recomputation of S and dP (five L×S×d products instead of
/// seven) in an order that varies from run to run.
pub fn vjp_atomic(
    op: &Op,
    inputs: &[&Tensor],
    output_t: &Tensor,
    gy: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    vjp_with(op, inputs, output_t, gy, needs, DqBy::KeyKernelAtomically)
}

/// Which kernel computes dQ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DqBy {
    /// Deterministically: the key kernel into slots where `attention_slots` allows, else the
    /// query kernel.
    Deterministic,
    /// The key kernel, atomically, where one chunk of each head dimension allows it.
    KeyKernelAtomically,
}

fn vjp_with(
    op: &Op,
    inputs: &[&Tensor],
    output_t: &Tensor,
    gy: &Tensor,
    needs: &[bool],
    dq_by: DqBy,
) -> Result<Vec<Option<Tensor>>> {
    let (_, _, mask) = torchlean::providers::native_cpu::flash_payload(op)?;
    let in_use = cx()?;
    let cx = &*in_use;
    usable(cx, op)?;
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    // every element of a gradient the kernels compute is written by them; one they do not
    // run for (no rows, no keys) is zeroed below
    let mut gq = output(cx, op, inputs[0].numel())?;
    let mut gk = output(cx, op, inputs[1].numel())?;
    let mut gv = output(cx, op, inputs[2].numel())?;
    let (mut wrote_q, mut wrote_kv) = (false, false);
    let wants_bias = mask == AttentionMask::AdditiveBias && need(3);
    let qs = inputs[0].shape();
    let r = qs.len();
    let (l, s) = (qs[r - 2], inputs[1].shape()[r - 2]);
    let bh: usize = qs[..r - 2].iter().product();
    let mut gbias_full = output(cx, op, if wants_bias { bh * l * s } else { 1 })?;
    launched(op, cx.stream.memset_zeros(gbias_full.slice_mut()))?;
    if bh * l * s > 0 {
        let g = buffer(op, gy)?;
        let (d, dv) = (qs[r - 1], inputs[2].shape()[r - 1]);
        let kv = (need(1) || need(2)) && d.max(dv) > 0;
        let mma = kv && cx.flash_mma.vjp && d <= TILE && dv <= TILE;
        let (mut c, st) = prepare_vjp(cx, op, inputs, output_t, gy, mma)?;
        // one chunk of each head dimension: the key kernel also computes dQ (atomically, or
        // deterministically in slots where attention_slots says so), and the query kernel
        // runs only for an additive mask's gradient
        let one_chunk = kv && need(0) && d.max(dv) <= TILE;
        // deterministic dQ added by the key kernel in a fixed order of key tiles; else
        // in slots or by the query kernel
        let ordered = dq_by == DqBy::Deterministic && one_chunk && !mma && cx.flash_dq_ordered();
        let slots = if dq_by == DqBy::Deterministic
            && one_chunk
            && !mma
            && !ordered
            && cx.flash_dq_slots
        {
            super::attention_slots::dq_slots(bh, s.div_ceil(TILE), bh * l * d, cx.flash_kv_resident)
        } else {
            None
        };
        let fuse_dq =
            (dq_by == DqBy::KeyKernelAtomically && one_chunk) || slots.is_some() || ordered;
        // the slots' scratch; zeroed where a key tile may skip query tiles (causal, mask
        // tiles) or a block runs several key tiles (fuse 3: every tile adds), else the first
        // tile of each slot stores (fuse 2)
        let mut dq_slots = slots
            .map(|p| output(cx, op, p.scratch_floats(bh * l, d).max(1)).map(|b| (p, b)))
            .transpose()?;
        let fuse: i32 = match &mut dq_slots {
            None if ordered => 4,
            None => fuse_dq as i32,
            Some((p, buf)) if p.group > 1 || c.g.causal != 0 || c.g.tiles != 0 => {
                launched(op, cx.stream.memset_zeros(buf.slice_mut()))?;
                3
            }
            Some(_) => 2,
        };
        if fuse == 1 || fuse == 4 {
            launched(op, cx.stream.memset_zeros(gq.slice_mut()))?;
        }
        // ordered dQ's ticket counter and one turn counter per query tile (zero bits: 0)
        let mut turns = output(
            cx,
            op,
            if ordered {
                1 + bh * l.div_ceil(TILE)
            } else {
                1
            },
        )?;
        if ordered {
            launched(op, cx.stream.memset_zeros(turns.slice_mut()))?;
            cx.count_flash_dq_ordered();
        }
        let (group, slot_stride) =
            slots.map_or((1i64, 0i64), |p| (p.group as i64, (bh * l * d) as i64));
        if kv {
            // with one chunk of each head dimension the tensor-core kernel takes the call
            // unless a value it would split is too large (the f32 kernel is gated on that)
            let mut wide = None;
            if let Some(flag) = c.wide.take().filter(|_| mma) {
                let mut b = cx.stream.launch_builder(c.kernel(
                    &cx.functions.flash_bwd_kv_mma,
                    &cx.functions.flash_bwd_kv_mma_tiles,
                ));
                call_args(&mut b, &c);
                b.arg(flag.slice())
                    .arg(st.slice())
                    .arg(g.slice())
                    .arg(gk.slice_mut())
                    .arg(gv.slice_mut())
                    .arg(&c.g)
                    .arg(gq.slice_mut())
                    .arg(&fuse);
                let cfg = LaunchConfig {
                    shared_mem_bytes: MMA_BWD_BYTES,
                    ..launch_cfg(s.div_ceil(TILE), bh, 1, 0)
                };
                // SAFETY: as the f32 key kernel below with one chunk (d, dv <= 64:
                // blockIdx.z = 0 only), and the one-element flag `wide`; its shared memory is
                // MMA_BWD_BYTES, allowed when the module loaded.
                launched(op, unsafe { b.launch(cfg) })?;
                wide = Some(flag);
            }
            // where every query tile costs the same (no causal cut, no mask tiles skipped)
            // and one chunk of each head dimension, the last batch matrices' key tiles may
            // run as several blocks over ranges of query tiles (attention_split.rs)
            let grouped = slots.is_some_and(|p| p.group > 1);
            let split =
                if !mma && !grouped && d.max(dv) <= TILE && c.g.causal == 0 && c.g.tiles == 0 {
                    super::attention_split::key_split(
                        bh,
                        s.div_ceil(TILE),
                        l.div_ceil(TILE),
                        cx.flash_kv_slots,
                        s,
                        d + dv,
                    )
                } else {
                    super::attention_split::KeySplit::NONE
                };
            let mut part = output(cx, op, split.scratch_floats(s, d, dv).max(1))?;
            let (heads, parts) = (split.heads as i64, split.parts as i64);
            let mut b = cx.stream.launch_builder(
                c.kernel(&cx.functions.flash_bwd_kv, &cx.functions.flash_bwd_kv_tiles),
            );
            vjp_inputs(&mut b, &c, &st, g);
            b.arg(gk.slice_mut()).arg(gv.slice_mut()).arg(&c.g);
            match &mut dq_slots {
                Some((_, buf)) => b.arg(buf.slice_mut()),
                None => b.arg(gq.slice_mut()),
            };
            b.arg(&fuse);
            gate_arg(&mut b, &wide);
            b.arg(&heads)
                .arg(&parts)
                .arg(part.slice_mut())
                .arg(&group)
                .arg(&slot_stride)
                .arg(turns.slice_mut());
            let rows = bh - split.heads + split.heads * split.parts;
            let key_blocks = slots.map_or(s.div_ceil(TILE), |p| p.slots);
            let cfg = LaunchConfig {
                shared_mem_bytes: BWD_KV_BYTES,
                ..launch_cfg(key_blocks, rows, d.max(dv).div_ceil(TILE), 0)
            };
            // SAFETY: reads as the forward plus the stats (3·BH·L) and the cotangent
            // ([BH, L, dv]); block (x, y, z) writes the rows of its key tiles (64 keys, or
            // `group` tiles of 64 with slots) in columns of chunk z of gk ([BH, S, d]) and gv
            // ([BH, S, dv]): disjoint between blocks; with fuse 1 (one chunk), it adds into
            // rows of gq ([BH, L, d], zeroed above) inside its shape with atomicAdd only;
            // with fuse 4 (one chunk, group 1) likewise, each block first drawing a ticket
            // from turns[0] (an atomic add) and reading and writing the turn counters
            // turns[1 + b·nqt + qt] (1 + BH·nqt allocated above; ints in the zeroed bits of
            // floats), waiting only for blocks of lower tickets, which have started;
            // with fuse 2 or 3 (one chunk), block x writes only slot x of `dq_slots`
            // (slots·BH·L·d allocated, slot_stride = BH·L·d, x < slots). With a split (one
            // chunk and group 1 only: heads = 0 otherwise), grid rows past bh - heads write
            // their 64 keys' rows of `part` ([heads·parts, S, d] then [heads·parts, S, dv],
            // allocated so) instead.
            launched(op, unsafe { b.launch(cfg) })?;
            if let Some((p, buf)) = dq_slots.as_ref().filter(|_| bh * l * d > 0) {
                let (slots64, n64) = (p.slots as i64, (bh * l * d) as i64);
                let mut b = cx.stream.launch_builder(&cx.functions.flash_sum_batches);
                b.arg(buf.slice())
                    .arg(gq.slice_mut())
                    .arg(&slots64)
                    .arg(&n64);
                // SAFETY: thread e reads dq_slots[x·n + e] for x < slots (slots·n allocated)
                // and writes gq[e], e < n = BH·L·d (gq's size).
                launched(op, unsafe { b.launch(super::grid(bh * l * d)) })?;
            }
            if split.heads > 0 {
                let (full, s64, d64, dv64) =
                    ((bh - split.heads) as i64, s as i64, d as i64, dv as i64);
                let mut b = cx.stream.launch_builder(&cx.functions.flash_sum_parts);
                b.arg(part.slice())
                    .arg(gk.slice_mut())
                    .arg(gv.slice_mut())
                    .arg(&full)
                    .arg(&heads)
                    .arg(&parts)
                    .arg(&s64)
                    .arg(&d64)
                    .arg(&dv64);
                // SAFETY: thread e reads `parts` elements of `part` (heads·parts·S·(d + dv)
                // allocated) and writes element e of the last `heads` matrices' rows of gk
                // ([BH, S, d]) or gv ([BH, S, dv]).
                launched(op, unsafe {
                    b.launch(super::grid(split.heads * s * (d + dv)))
                })?;
            }
            wrote_kv = true;
            wrote_q = fuse_dq;
        }
        if (need(0) && !fuse_dq) || wants_bias {
            let (want_dq, want_bias) = ((need(0) && !fuse_dq) as i32, wants_bias as i32);
            let mut b = cx.stream.launch_builder(
                c.kernel(&cx.functions.flash_bwd_q, &cx.functions.flash_bwd_q_tiles),
            );
            vjp_inputs(&mut b, &c, &st, g);
            b.arg(gq.slice_mut())
                .arg(gbias_full.slice_mut())
                .arg(&c.g)
                .arg(&want_dq)
                .arg(&want_bias);
            let cfg = launch_cfg(l.div_ceil(TILE), bh, d.div_ceil(TILE).max(1), BWD_Q_TILES);
            // SAFETY: reads as the KV kernel; block (x, y, z) writes the rows of its 64
            // queries in columns of chunk z of gq ([BH, L, d]) and, with want_bias, chunk 0
            // writes their entries of gbias_full ([BH, L, S], allocated so when wanted).
            launched(op, unsafe { b.launch(cfg) })?;
            wrote_q |= need(0);
        }
    }
    for (wrote, g) in [(wrote_q, &mut gq), (wrote_kv, &mut gk), (wrote_kv, &mut gv)] {
        if !wrote {
            launched(op, cx.stream.memset_zeros(g.slice_mut()))?;
        }
    }
    let mut grads = vec![
        need(0).then(|| tensor(gq, inputs[0].shape())).transpose()?,
        need(1).then(|| tensor(gk, inputs[1].shape())).transpose()?,
        need(2).then(|| tensor(gv, inputs[2].shape())).transpose()?,
    ];
    match mask {
        AttentionMask::None => {}
        AttentionMask::Boolean => grads.push(None),
        AttentionMask::AdditiveBias if !wants_bias => grads.push(None),
        AttentionMask::AdditiveBias => {
            let bias_shape = inputs[3].shape();
            if bias_shape.len() == 2 {
                // a shared [L, S] mask: its gradient sums the batch matrices', in order
                let n = l * s;
                let mut g = output(cx, op, n)?;
                if n > 0 {
                    let (bh64, n64) = (bh as i64, n as i64);
                    let mut b = cx.stream.launch_builder(&cx.functions.flash_sum_batches);
                    b.arg(gbias_full.slice())
                        .arg(g.slice_mut())
                        .arg(&bh64)
                        .arg(&n64);
                    // SAFETY: thread p reads full[b·n + p] for b < bh (bh·n elements
                    // allocated) and writes out[p], p < n.
                    launched(op, unsafe { b.launch(super::grid(n)) })?;
                }
                grads.push(Some(tensor(g, bias_shape)?));
            } else {
                grads.push(Some(tensor(gbias_full, bias_shape)?));
            }
        }
    }
    if grads.len() != inputs.len() {
        return Err(Error::Other(format!(
            "op `{}`: {} gradients for {} inputs",
            op.name(),
            grads.len(),
            inputs.len()
        )));
    }
    Ok(grads)
}
