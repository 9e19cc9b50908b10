//! `native_cpu.flash_attention`: scaled dot-product attention computed tile by tile, the
//! kernel form of `spec::flash` (issue 12). No L×S matrix is formed: per tile of [`QT`] query
//! rows the forward walks tiles of [`KT`] keys with an online softmax (a running maximum,
//! normalizer and output per row), and, when every value is finite, visits only the keys
//! that some row of the query tile may attend (the causal cut and the keys a boolean mask
//! blocks for the whole tile are skipped: see [`Spans`]). The VJP recomputes the probabilities: up
//! to [`STRIPE_KEYS`] keys from one score stripe per query tile; above, from a log-sum-exp
//! pass over the key tiles and a second pass that recomputes each tile (FlashAttention-2's
//! backward); either way with D = rowsum(dO ∘ O) read from the forward output.
//!
//! Masks, fully blocked rows (zeros, no gradient), NaN rows and the additive bias's gradient
//! follow `special.rs` (the shared [`Attention`] geometry and `special::assemble`), so the
//! two native capsules of the op compute the same function; tests/flash_attention.rs holds
//! this one to the spec and to the other. Work is split over batch matrices (and, for the
//! forward of a single one, over query tiles); the tile products go through `par::gemm`.

use super::flash_small::{forward_small, Scratch, SMALL_KEYS};
use super::par::{gemm, Mat};
use super::special::{per_batch_grads, scale_and_mask_max, Attention, BatchGrads};
use super::strided::{Operand, Rows as Matrix};
use super::vmath;
use crate::graph::Op;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Query rows per tile where some tile may skip keys, and the rows of the tiles whose key
/// spans are computed ([`Spans`]).
const QT: usize = 64;
/// Query rows per tile when no tile skips a key (no causal cut, no key range a boolean mask
/// blocks for a whole tile) and S is at most [`DENSE_MAX_KEYS`]: each tile's product with
/// the keys packs them once for twice the rows. Measured on the 2-core VM at B·H = 32,
/// L = S = 512, d = 64 (thirty-first session, docs/attention.md): forward
/// 15.1 → 14.0 ms, forward + backward 51.5 → 48.0 ms; with a causal-pattern mask the
/// coarser tiles would skip less (2–5% slower), hence the choice per call.
const QT_DENSE: usize = 128;
/// Above this many keys the VJP's stripes of [`QT_DENSE`] rows would outgrow the core's
/// cache: tiles of [`QT`] rows then.
const DENSE_MAX_KEYS: usize = 1024;
/// The least multiply-adds a task of the forward is given when batch matrices are small.
const MIN_TASK_WORK: usize = 1 << 16;

/// Keys per tile.
const KT: usize = 512;
/// Up to this many keys, the VJP computes a query tile's scores once, over every key (a
/// stripe of a query tile × S, 512 KiB at most per thread: not an L×S matrix), instead of a
/// log-sum-exp pass and a recomputing pass.
const STRIPE_KEYS: usize = 2048;

/// The key span of every tile of [`QT`] query rows, per mask matrix (one when the mask is
/// shared by the batch matrices, or there is none): computed once per call, not per batch
/// matrix and pass; and the query rows per tile that the call runs with.
struct Spans {
    spans: Vec<Vec<std::ops::Range<usize>>>,
    /// Whether some span tile skips a key (else a finiteness scan, which only decides whether
    /// keys may be skipped, is not needed).
    skips_any: bool,
    /// Query rows per tile: [`QT_DENSE`] when no span skips a key, else [`QT`].
    rows: usize,
}

impl Spans {
    /// The spans when `compute` (else none: every tile visits every key).
    fn new(at: &Attention, compute: bool) -> Spans {
        let mats = if at.per_batch { at.batch } else { 1 };
        let tiles = at.l.div_ceil(QT);
        let spans: Vec<Vec<_>> = if compute {
            (0..mats)
                .into_par_iter()
                .map(|bi| {
                    (0..tiles)
                        .map(|t| at.key_span(bi, &(t * QT..((t + 1) * QT).min(at.l))))
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        let skips_none = spans.iter().flatten().all(|r| *r == (0..at.s));
        Spans {
            spans,
            skips_any: !skips_none,
            rows: if skips_none && at.s <= DENSE_MAX_KEYS {
                QT_DENSE
            } else {
                QT
            },
        }
    }

    /// The keys that query rows `rows` (a tile of [`Spans::rows`]) of batch matrix `bi` visit:
    /// the union of their span tiles' key spans (up to the causal cut, without the keys a
    /// boolean mask blocks for every row of a span tile) when `skip`, else every key. The
    /// spec multiplies a blocked entry's zero weight by the value (and, in the VJP, by the
    /// key, query and cotangent), so a NaN or an infinity there reaches rows that attend no
    /// key of its tile: with one present the caller passes `skip = false` and every key is
    /// visited, as the spec's sums do.
    fn keys(
        &self,
        at: &Attention,
        bi: usize,
        rows: &std::ops::Range<usize>,
        skip: bool,
    ) -> std::ops::Range<usize> {
        if !skip || self.spans.is_empty() {
            return 0..at.s;
        }
        // in range by construction: one list per mask matrix (one, or one per batch matrix
        // bi < batch), each of ⌈L / QT⌉ span tiles, and `rows` within 0..L
        let per_mat = if self.spans.len() == 1 { 0 } else { bi };
        let tiles = &self.spans[per_mat][rows.start / QT..rows.end.div_ceil(QT)];
        let visited = tiles.iter().filter(|r| !r.is_empty());
        let lo = visited.clone().map(|r| r.start).min();
        let hi = visited.map(|r| r.end).max();
        match (lo, hi) {
            (Some(lo), Some(hi)) => lo..hi,
            _ => 0..0,
        }
    }
}

/// `keys` in tiles of at most [`KT`].
fn key_tiles(keys: std::ops::Range<usize>) -> impl Iterator<Item = std::ops::Range<usize>> {
    (keys.start..keys.end)
        .step_by(KT)
        .map(move |j0| j0..(j0 + KT).min(keys.end))
}

/// Per-row state of the online softmax over one query tile.
struct Rows {
    max: Vec<f32>,
    sum: Vec<f32>,
    nan: Vec<bool>,
}

impl Rows {
    fn new(n: usize) -> Rows {
        Rows {
            max: vec![f32::NEG_INFINITY; n],
            sum: vec![0.0; n],
            nan: vec![false; n],
        }
    }

    /// Folds one tile of scores (rows of width `w`, each row's maximum `maxes[r]`) into the
    /// state and overwrites them with exp(score − new max) (zeros for a row still without an
    /// allowed key, or holding NaN); returns each row's rescaling factor of what was
    /// accumulated before.
    #[inline(always)]
    fn fold(&mut self, (scores, maxes): (&mut [f32], &[f32]), w: usize) -> Vec<f32> {
        let mut corr = vec![1.0f32; self.max.len()];
        for (r, row) in scores.chunks_mut(w.max(1)).enumerate() {
            let mx = maxes[r];
            if mx.is_nan() {
                self.nan[r] = true;
            }
            let m_new = self.max[r].max(mx);
            if self.nan[r] || m_new == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            corr[r] = vmath::exp(self.max[r] - m_new);
            self.sum[r] = self.sum[r] * corr[r] + vmath::exp_shifted_sum(row, m_new);
            self.max[r] = m_new;
        }
        corr
    }
}

/// The scores of query rows `rows` against keys `cols` of batch matrix `bi`, scaled,
/// masked (-inf where blocked, the bias added) and causally cut, into `out`
/// (rows.len() × cols.len(), row-major), and each row's maximum (from the same pass without a
/// mask row, a second one with: `special::scale_and_mask_max`). `q`
/// and `k` are that batch matrix's, read in place.
#[inline(always)]
fn tile_scores(
    at: &Attention,
    bi: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    (q, k): (Matrix, Matrix),
    out: &mut [f32],
) -> Vec<f32> {
    let (bq, bk) = (rows.len(), cols.len());
    gemm(
        bq,
        bk,
        at.d,
        q.mat(rows.start),
        k.mat_t(cols.start),
        out,
        false,
        false,
    );
    let mut maxes = vec![f32::NEG_INFINITY; bq];
    for (r, row) in out[..bq * bk].chunks_mut(bk.max(1)).enumerate() {
        let i = rows.start + r;
        // the keys this row may attend before the causal cut: the rest is -inf
        let cut = if at.causal {
            (i + 1).saturating_sub(cols.start).min(bk)
        } else {
            bk
        };
        row[cut..].fill(f32::NEG_INFINITY);
        let extra = at
            .extra_row(bi, i)
            .map(|m| &m[cols.start..cols.start + cut]);
        maxes[r] = scale_and_mask_max(&mut row[..cut], at.scale, at.mask, extra);
    }
    maxes
}

/// The forward of query rows `rows` of batch matrix `bi` into `out` (rows × dv), visiting
/// `keys`. On 512-bit vectors where the CPU has them (`crate::wide`: the same bits).
fn forward_tile(
    at: &Attention,
    bi: usize,
    rows: std::ops::Range<usize>,
    operands: (Matrix, Matrix, Matrix),
    keys: std::ops::Range<usize>,
    out: &mut [f32],
) {
    crate::wide::wide!(forward_tile_body(at, bi, rows, operands, keys, out))
}

#[inline(always)]
fn forward_tile_body(
    at: &Attention,
    bi: usize,
    rows: std::ops::Range<usize>,
    (q, k, v): (Matrix, Matrix, Matrix),
    keys: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let (dv, bq) = (at.dv, rows.len());
    let mut state = Rows::new(bq);
    // this thread's score tile from its previous query tile (every score is written before
    // it is read): a fresh one per tile was a page-faulting allocation of up to 256 KiB
    let (mut scores, spare) = STRIPES.with(|c| c.take());
    scores.resize(bq * KT.min(at.s), 0.0);
    out.fill(0.0);
    for cols in key_tiles(keys) {
        let bk = cols.len();
        let tile = &mut scores[..bq * bk];
        let maxes = tile_scores(at, bi, rows.clone(), cols.clone(), (q, k), tile);
        let corr = state.fold((tile, &maxes), bk);
        for (o, &c) in out.chunks_mut(dv.max(1)).zip(&corr) {
            if c != 1.0 {
                o.iter_mut().for_each(|x| *x *= c);
            }
        }
        gemm(
            bq,
            dv,
            bk,
            Mat::rows(tile, bk),
            v.mat(cols.start),
            out,
            true,
            false,
        );
    }
    for (r, o) in out.chunks_mut(dv.max(1)).enumerate() {
        if at.fully_blocked(bi, rows.start + r) {
            o.fill(0.0);
        } else if state.nan[r] {
            o.fill(f32::NAN);
        } else {
            // a row whose allowed scores are all -inf (an additive bias) has sum 0: 0/0 = NaN,
            // as the spec
            let inv = 1.0 / state.sum[r];
            o.iter_mut()
                .for_each(|x| *x = if inv.is_finite() { *x * inv } else { f32::NAN });
        }
    }
    STRIPES.with(|c| c.set((scores, spare)));
}

/// The forward kernel: the output row-major, or stored head-interleaved when `interleave`
/// (a `[B, H, L, Dv]` output; see [`super::heads`]).
pub fn forward(op: &Op, x: &[&Tensor], out_shape: &[usize], interleave: bool) -> Vec<f32> {
    // q, k and v read where they lie (heads of a permuted projection need no copy)
    let (q, k, v) = (Operand::new(x[0]), Operand::new(x[1]), Operand::new(x[2]));
    let at = Attention::new(op, x);
    let (l, dv) = (at.l, at.dv);
    let mut out = super::par::zeroed(out_shape.iter().product());
    let per = l * dv;
    if per == 0 {
        return out;
    }
    let small = at.s <= SMALL_KEYS;
    let skip = !small && (0..at.batch).all(|bi| v.finite(bi));
    let spans = Spans::new(&at, skip);
    let qt = if small { QT } else { spans.rows };
    let tile = (qt * dv).max(1);
    let run = |scratch: &mut Scratch, bi: usize, t: usize, o: &mut [f32]| {
        let rows = t * qt..((t + 1) * qt).min(l);
        let operands = (q.matrix(bi), k.matrix(bi), v.matrix(bi));
        if small {
            forward_small(&at, bi, rows, operands, scratch, o);
        } else {
            let keys = spans.keys(&at, bi, &rows, skip);
            forward_tile(&at, bi, rows, operands, keys, o);
        }
    };
    if interleave {
        // one task per (b, query tile) computes that tile of every head and places its rows
        // between the other heads' (a chunk of the output holds exactly those rows)
        let h = out_shape[1];
        out.par_chunks_mut(l * h * dv)
            .enumerate()
            .for_each(|(b, ob)| {
                ob.par_chunks_mut(qt * h * dv).enumerate().for_each_init(
                    || (Scratch::default(), vec![0.0f32; qt * dv]),
                    |(scratch, tile), (t, chunk)| {
                        let o = &mut tile[..chunk.len() / h];
                        for hi in 0..h {
                            run(scratch, b * h + hi, t, o);
                            for (r, row) in o.chunks_exact(dv).enumerate() {
                                chunk[(r * h + hi) * dv..][..dv].copy_from_slice(row);
                            }
                        }
                    },
                )
            });
    } else if at.batch > 1 {
        // batch matrices of a few dozen multiply-adds each (an encoder's ten-token heads)
        // go several to a task: a task per matrix costs more in scheduling than in work
        let work = (l * at.s * (at.d + dv)).max(1);
        out.par_chunks_mut(per)
            .enumerate()
            .with_min_len(MIN_TASK_WORK.div_ceil(work))
            .for_each_init(Scratch::default, |scratch, (bi, ob)| {
                ob.chunks_mut(tile)
                    .enumerate()
                    .for_each(|(t, o)| run(scratch, bi, t, o))
            });
    } else {
        out.par_chunks_mut(tile)
            .enumerate()
            .for_each_init(Scratch::default, |scratch, (t, o)| run(scratch, 0, t, o));
    }
    out
}

/// The operands of one batch matrix's gradient products (blocked rows zeroed where the
/// spec passes them no gradient) and the gradients being accumulated.
struct GradStep<'a> {
    at: &'a Attention<'a>,
    go: &'a [f32],
    q: Matrix<'a>,
    k: Matrix<'a>,
    v: Matrix<'a>,
    blocked: &'a [bool],
    threads: bool,
    gq: Vec<f32>,
    gk: Vec<f32>,
    gv: Vec<f32>,
    gs: Vec<f32>,
}

/// How a tile's `p` reaches [`GradStep::tile`]: already the probabilities, or each row's
/// exp(score − max) still to be divided by its normalizer (the probabilities are then written
/// in the pass that forms dS, one pass over the tile instead of two).
enum Probs<'a> {
    Ready,
    Unnormalized { inv: &'a [f32], nan: &'a [bool] },
}

impl GradStep<'_> {
    /// Accumulates the gradients of query rows `rows` against keys `cols` from their
    /// probabilities `p` (rows × cols; normalized here first when `probs` says so) and
    /// D = rowsum(dO ∘ O) per row.
    #[inline(always)]
    fn tile(
        &mut self,
        rows: &std::ops::Range<usize>,
        cols: &std::ops::Range<usize>,
        (p, probs): (&mut [f32], Probs),
        dsum: &[f32],
        dp: &mut [f32],
    ) {
        let (s, d, dv) = (self.at.s, self.at.d, self.at.dv);
        let (bq, bk) = (rows.len(), cols.len());
        let go_t = &self.go[rows.start * dv..];
        // dS = P ∘ (dO Vᵀ − D)
        let ds = &mut dp[..bq * bk];
        gemm(
            bq,
            bk,
            dv,
            Mat::rows(go_t, dv),
            self.v.mat_t(cols.start),
            ds,
            false,
            self.threads,
        );
        for (r, (drow, prow)) in ds
            .chunks_mut(bk.max(1))
            .zip(p.chunks_mut(bk.max(1)))
            .enumerate()
        {
            if self.blocked[rows.start + r] {
                // a blocked row's probabilities are 0 and it passes no gradient
                prow.fill(0.0);
                drow.fill(0.0);
                continue;
            }
            match probs {
                Probs::Ready => {
                    for (g, &pv) in drow.iter_mut().zip(prow.iter()) {
                        *g = pv * (*g - dsum[r]);
                    }
                }
                Probs::Unnormalized { nan, .. } if nan[r] => {
                    prow.fill(f32::NAN);
                    drow.fill(f32::NAN);
                }
                Probs::Unnormalized { inv, .. } => {
                    let (inv, dr) = (inv[r], dsum[r]);
                    for (g, pv) in drow.iter_mut().zip(prow.iter_mut()) {
                        *pv *= inv;
                        *g = *pv * (*g - dr);
                    }
                }
            }
        }
        // dV += Pᵀ dO
        gemm(
            bk,
            dv,
            bq,
            Mat::transposed(p, bk),
            Mat::rows(go_t, dv),
            &mut self.gv[cols.start * dv..],
            true,
            self.threads,
        );
        if !self.gs.is_empty() {
            for (r, drow) in ds.chunks(bk.max(1)).enumerate() {
                let at_row = (rows.start + r) * s + cols.start;
                self.gs[at_row..at_row + bk].copy_from_slice(drow);
            }
        }
        // dQ += dS K, dK += dSᵀ Q (scaled at the end)
        gemm(
            bq,
            d,
            bk,
            Mat::rows(ds, bk),
            self.k.mat(cols.start),
            &mut self.gq[rows.start * d..],
            true,
            self.threads,
        );
        gemm(
            bk,
            d,
            bq,
            Mat::transposed(ds, bk),
            self.q.mat(rows.start),
            &mut self.gk[cols.start * d..],
            true,
            self.threads,
        );
    }
}

/// The probabilities of a tile's rows from their scores: blocked rows 0, NaN rows NaN, the
/// others `f(score, row)`.
#[inline(always)]
fn probabilities(
    p: &mut [f32],
    w: usize,
    first_row: usize,
    blocked: &[bool],
    nan: &[bool],
    f: impl Fn(f32, usize) -> f32,
) {
    for (r, row) in p.chunks_mut(w.max(1)).enumerate() {
        if blocked[first_row + r] {
            row.fill(0.0);
        } else if nan[r] {
            row.fill(f32::NAN);
        } else {
            row.iter_mut().for_each(|x| *x = f(*x, r));
        }
    }
}

thread_local! {
    /// Per thread: the score and dS stripes of the VJP (the score tile of the forward), reused
    /// by the batch matrices (query tiles) it computes.
    static STRIPES: std::cell::Cell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// The gradients of batch matrix `bi`. Per query tile: when S is at most [`STRIPE_KEYS`],
/// one tile over every visited key (scores, softmax and gradient products from one score
/// computation); otherwise a log-sum-exp pass over the key tiles, then a second pass
/// recomputing each tile's probabilities from it. On 512-bit vectors where the CPU has them
/// (`crate::wide`: the same bits).
fn vjp_batch(
    at: &Attention,
    spans: &Spans,
    bi: usize,
    inputs: (&Operand, &Operand, &Operand),
    output: (&Operand, &Operand),
    threads: bool,
) -> BatchGrads {
    crate::wide::wide!(vjp_batch_body(at, spans, bi, inputs, output, threads))
}

#[inline(always)]
fn vjp_batch_body(
    at: &Attention,
    spans: &Spans,
    bi: usize,
    (q, k, v): (&Operand, &Operand, &Operand),
    (y, go): (&Operand, &Operand),
    threads: bool,
) -> BatchGrads {
    let (l, s, d, dv) = (at.l, at.s, at.d, at.dv);
    // the spec's gradient products run over every key, blocked ones with weight zero: a NaN
    // or an infinity anywhere in q, k, v, the output or the cotangent reaches rows or keys
    // of the causally skipped tiles
    // (scanned only where some tile could skip a key: without a mask or causal cut none can)
    let skip = spans.skips_any
        && q.finite(bi)
        && k.finite(bi)
        && v.finite(bi)
        && y.finite(bi)
        && go.finite(bi);
    let blocked: Vec<bool> = (0..l).map(|i| at.fully_blocked(bi, i)).collect();
    // a fully blocked row takes no part in any product (not even as 0 · NaN); y and the
    // cotangent are read where they lie (a head-interleaved output, say)
    let gob = go.dense_or_zeroing(bi, &blocked);
    let qz = blocked
        .iter()
        .any(|&b| b)
        .then(|| q.dense_zeroing(bi, &blocked));
    let additive = matches!(at.mask, crate::graph::AttentionMask::AdditiveBias);
    let mut step = GradStep {
        at,
        go: &gob,
        q: qz
            .as_deref()
            .map_or_else(|| q.matrix(bi), |z| Matrix::dense(z, d)),
        k: k.matrix(bi),
        v: v.matrix(bi),
        blocked: &blocked,
        threads,
        gq: vec![0.0f32; l * d],
        gk: vec![0.0f32; s * d],
        gv: vec![0.0f32; s * dv],
        gs: if additive {
            vec![0.0f32; l * s]
        } else {
            vec![]
        },
    };
    let stripe = s <= STRIPE_KEYS;
    let width = if stripe { s } else { KT };
    let qt = spans.rows;
    // this thread's stripes from its previous batch matrix (a tile writes every element it
    // reads first): fresh ones per matrix were two page-faulting allocations of up to
    // 512 KiB each
    let (mut scores, mut dp) = STRIPES.with(|c| c.take());
    scores.resize(qt * width, 0.0);
    dp.resize(qt * width, 0.0);
    for t in 0..l.div_ceil(qt) {
        let rows = t * qt..((t + 1) * qt).min(l);
        let bq = rows.len();
        // D = rowsum(dO ∘ O)
        let dsum: Vec<f32> = rows
            .clone()
            .map(|i| vmath::sum_zip(&gob[i * dv..(i + 1) * dv], y.row(bi, i), |a, b| a * b))
            .collect();
        let mut state = Rows::new(bq);
        // the scores of these query rows against keys `cols` (from q itself: a blocked row's
        // scores are computed, then dropped, as the spec's)
        let (q_b, k_b) = (q.matrix(bi), step.k);
        if stripe {
            let cols = spans.keys(at, bi, &rows, skip);
            if cols.is_empty() {
                // every row of the tile is fully blocked: no part in any product
                continue;
            }
            let w = cols.len();
            let p = &mut scores[..bq * w];
            let maxes = tile_scores(at, bi, rows.clone(), cols.clone(), (q_b, k_b), p);
            state.fold((p, &maxes), w);
            let inv: Vec<f32> = state.sum.iter().map(|z| 1.0 / z).collect();
            let probs = Probs::Unnormalized {
                inv: &inv,
                nan: &state.nan,
            };
            step.tile(&rows, &cols, (p, probs), &dsum, &mut dp);
            continue;
        }
        // pass 1: each row's maximum and normalizer
        for cols in key_tiles(spans.keys(at, bi, &rows, true)) {
            let tile = &mut scores[..bq * cols.len()];
            let maxes = tile_scores(at, bi, rows.clone(), cols.clone(), (q_b, k_b), tile);
            state.fold((tile, &maxes), cols.len());
        }
        // pass 2: probabilities exp(x - max) / z, and the gradient products. Not exp(x - lse)
        // with lse = max + ln z: where |max| dwarfs ln z (a row whose every allowed score is
        // near -1e9 or f32::MIN, an additive padding mask) lse rounds to max and every
        // probability of the row becomes 1 instead of 1/z
        let inv: Vec<f32> = state.sum.iter().map(|z| 1.0 / z).collect();
        for cols in key_tiles(spans.keys(at, bi, &rows, skip)) {
            let p = &mut scores[..bq * cols.len()];
            tile_scores(at, bi, rows.clone(), cols.clone(), (q_b, k_b), p);
            probabilities(p, cols.len(), rows.start, &blocked, &state.nan, |x, r| {
                vmath::exp(x - state.max[r]) * inv[r]
            });
            step.tile(&rows, &cols, (p, Probs::Ready), &dsum, &mut dp);
        }
    }
    STRIPES.with(|c| c.set((scores, dp)));
    let (mut gq, mut gk) = (step.gq, step.gk);
    super::special::zero_blocked_rows(&mut gq, d, &blocked);
    // one vectorized loop per gradient, the scale in a register (over a chain of the two,
    // with the scale read through `at` each time, this was a scalar loop: a fifth of the
    // VJP at 64 keys)
    let scale = at.scale;
    gq.iter_mut().for_each(|g| *g *= scale);
    gk.iter_mut().for_each(|g| *g *= scale);
    (gq, gk, step.gv, step.gs)
}

/// The VJP kernel (recomputing the probabilities tile by tile).
pub fn vjp(op: &Op, x: &[&Tensor], y: &Tensor, gy: &Tensor) -> Vec<Option<Tensor>> {
    let (q, k, v) = (Operand::new(x[0]), Operand::new(x[1]), Operand::new(x[2]));
    let (go, y) = (Operand::new(gy), Operand::new(y));
    let at = Attention::new(op, x);
    let spans = Spans::new(&at, true);
    let one =
        |bi: usize, threads: bool| vjp_batch(&at, &spans, bi, (&q, &k, &v), (&y, &go), threads);
    // each gradient stored like the input it belongs to (see `super::heads`)
    per_batch_grads(x, &at, one, true)
}
