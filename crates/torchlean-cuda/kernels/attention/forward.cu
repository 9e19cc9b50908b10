// ---- the forward kernels: flash_forward (f32 FMA products) and flash_forward_mma ----

template <bool TILES>
__device__ __forceinline__ void flash_forward_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, float* __restrict__ out, float* __restrict__ stats,
    const float* __restrict__ dout, Flash g, int mode, const int* __restrict__ gate) {
    // the tensor-core forward (flash_forward_mma) took the call unless its flag says not
    if (gate != nullptr && gate[0] == 0) return;
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;                // q rows, chunk of d
    float* ks = smem + FA_TILE;      // k rows, chunk of d; then v rows, chunk z of dv
    float* ps = smem + 2 * FA_TILE;  // probabilities [i][j]
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long q0 = (long long)blockIdx.x * FA_T;
    const long long z0 = (long long)blockIdx.z * FA_C;
    const long long rows = min((long long)FA_T, g.l - q0);
    const long long nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (q0 + rows - 1) / FA_T + 1) : nkt;
    const bool single = g.d <= FA_C;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float o[4][8] = {}, m[4], l[4] = {};
        bool any[4] = {};
        #pragma unroll
        for (int r = 0; r < 4; ++r) m[r] = FA_NEG_INF;
        __syncthreads();
        if (single) fa_load(qs, q, b * g.l + q0, rows, g.d, 0, g.d, nullptr, 0);
        for (long long kt = 0; kt < kt_end; ++kt) {
            // uniform in the block: every thread skips the same tiles
            if (skip_tiles && !fa_tile_any(g, bits, b, blockIdx.x, kt)) continue;
            const long long k0 = kt * FA_T, keys = min((long long)FA_T, g.s - k0);
            float sc[4][8] = {};
            fa_products(sc, qs, q, b * g.l + q0, rows, ks, k, b * g.s + k0, keys, nullptr, g.d, tx, ty);
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const long long i = q0 + ty * 4 + r;
                const unsigned w0 = fa_word(g, bits, b, i, k0), w1 = fa_word(g, bits, b, i, k0 + 32);
                bool ok[8];
                float mx = FA_NEG_INF;
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    const long long j = k0 + tx + 8 * c;
                    const unsigned bit = (c < 4 ? w0 : w1) >> (tx + 8 * (c % 4));
                    ok[c] = fa_allowed(g, i, j, bit);
                    sc[r][c] = ok[c] ? fa_score(g, bias, b, i, j, sc[r][c]) : FA_NEG_INF;
                    mx = fmaxf(mx, sc[r][c]);
                    any[r] |= ok[c];
                }
                mx = fa_max_over<8>(mx);
                const float mn = fmaxf(m[r], mx);
                const float mu = mn == FA_NEG_INF ? 0.0f : mn;
                const float alpha = expf(m[r] - mu);
                float sum = 0.0f;
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    sc[r][c] = ok[c] ? expf(sc[r][c] - mu) : 0.0f;
                    sum += sc[r][c];
                }
                l[r] = l[r] * alpha + fa_sum_over<8>(sum);
                m[r] = mn;
                #pragma unroll
                for (int c = 0; c < 8; ++c) o[r][c] *= alpha;
            }
            if (mode == 1) continue;
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                #pragma unroll
                for (int c = 0; c < 8; ++c) ps[(ty * 4 + r) * FA_P + tx + 8 * c] = sc[r][c];
            fa_load(ks, v, b * g.s + k0, keys, g.dv, z0, min((long long)FA_C, g.dv - z0), nullptr, 0);
            __syncthreads();
            fa_mul_rows(o, ps, ty * 4, ks, tx, fa_round4(keys));
            __syncthreads();
        }
        const long long R = g.bh * g.l;
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const long long i = q0 + ty * 4 + r;
            // every lane of the row group takes part in the reductions (they shuffle); only
            // rows that exist are written. A fully blocked row has no allowed entry in any
            // tile of any lane.
            const bool attends = fa_sum_over<8>(any[r] ? 1.0f : 0.0f) > 0.0f;
            float dot = 0.0f;
            if (mode == 1 && i < g.l) {
                const long long row = b * g.l + i;
                for (long long col = tx; col < g.dv; col += 8)
                    dot += dout[row * g.dv + col] * out[row * g.dv + col];
            }
            dot = fa_sum_over<8>(dot);
            if (i >= g.l) continue;
            const long long row = b * g.l + i;
            if (mode == 0) {
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    const long long col = z0 + fa_gcol(tx, c);
                    if (col < g.dv) out[row * g.dv + col] = attends ? o[r][c] / l[r] : 0.0f;
                }
            }
            // mode 0 with stats (chunk 0): the row's maximum and 1 / normalizer for the VJP,
            // as mode 1 writes them (mode 1 adds dO·O)
            if (tx == 0 && (mode == 1 || (stats != nullptr && blockIdx.z == 0))) {
                const float mu = m[r] == FA_NEG_INF ? 0.0f : m[r];
                // a row that attends nothing keeps 0, 0: its stats are never read, and the
                // caller's finiteness check over them then sees only real rows
                stats[row] = attends ? mu : 0.0f;
                stats[R + row] = attends ? 1.0f / l[r] : 0.0f;
                if (mode == 1) stats[2 * R + row] = dot;
            }
        }
    }
}
// Without tile words (no boolean mask) the tile test is compiled out, so those calls run the
// same code as before tiles existed; with them, the _tiles entry point.
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_forward(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, float* __restrict__ out, float* __restrict__ stats,
    const float* __restrict__ dout, Flash g, int mode, const int* __restrict__ gate) {
    flash_forward_impl<false>(q, k, v, bits, bias, nonfinite, out, stats, dout, g, mode, gate);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_forward_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, float* __restrict__ out, float* __restrict__ stats,
    const float* __restrict__ dout, Flash g, int mode, const int* __restrict__ gate) {
    flash_forward_impl<true>(q, k, v, bits, bias, nonfinite, out, stats, dout, g, mode, gate);
}


// ---- the tensor-core forward: flash_forward_mma (d, dv <= 64) ----
//
// On by default (TORCHLEAN_FLASH_MMA=0 turns it off, src/device.rs): on the H200 it beats
// flash_forward with and without masks (docs/BENCHMARKS.md, seventeenth session).
//
// The same online softmax, masks and corner cases as flash_forward (in base 2: the row
// maximum and normalizer of 2^(log2(e)·score), the log-sum-exp converted back), with the
// two products on tensor cores
// in split-TF32 ("3xTF32", as CUTLASS's OpMultiplyAddFastF32, which PyTorch's f32
// memory-efficient attention uses): each f32 operand x is split into big = x rounded to TF32
// (cvt.rna, 10-bit mantissa) and small = (x - big) rounded to TF32, and a·b is taken as
// big·big + big·small + small·big with f32 accumulation. |x - big - small| <= 2^-22 |x| and the
// dropped small·small is below 2^-20 |a||b|, so each product is within about 2^-20 |a||b|
// (against 2^-24 for an f32 product) before the f32 sums that both paths share. The split
// needs x - big to be finite and big not to round to infinity: the host runs this kernel
// only when every |q|, |k|, |v| is below 2^24 (flag `wide`, computed on the device; the
// kernel returns at once otherwise and flash_forward, gated on the same flag, takes the call),
// so a non-finite or huge value always goes through the f32 FMA kernel and its exact
// non-finite semantics. Mode 0 only (the output, and the stats for the VJP).
//
// Layout: 128 threads = 4 warps, each owning 16 query rows of the block's 64. The block's q
// rows, and per 64-key tile the k rows and v columns, are split once into shared memory in
// fragment order (the split tiles below: one 16-byte read per fragment); the next tile's k
// and v are fetched into registers while the current tile is computed. The mma m16n8k8
// fragments (lane = 4·gq + tq): A (16×8, row) a0 (gq, tq), a1 (gq+8, tq), a2 (gq, tq+4),
// a3 (gq+8, tq+4); B (8×8, col) b0 (k tq, n gq), b1 (k tq+4, n gq); C (16×8) c0 (gq, 2tq),
// c1 (gq, 2tq+1), c2 (gq+8, 2tq), c3 (gq+8, 2tq+1). The score fragment of keys 8n.. becomes
// the A operand of P·V without moving between lanes by giving the product's inner index
// tq the key 2tq and tq+4 the key 2tq+1 (a sum over keys does not depend on their order):
// a = (c0, c2, c1, c3), and V's B fragment reads keys 2tq and 2tq+1 to match. The softmax
// runs in base 2 (scores times log2(e), weights exp2), as FlashAttention-2's.

template <bool TILES>
__device__ __forceinline__ void flash_forward_mma_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide, float* __restrict__ out,
    float* __restrict__ stats, Flash g) {
    if (wide[0] != 0) return;  // flash_forward takes the call (uniform over the grid)
    extern __shared__ __align__(16) float smem[];
    unsigned* qsp = reinterpret_cast<unsigned*>(smem);  // the block's q rows, row-split
    unsigned* ksp = qsp + FA_SPLIT_TILE;                // the key tile's k rows, row-split
    unsigned* vsp = ksp + FA_SPLIT_TILE;                // the key tile's v, column-split
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gq = lane >> 2, tq = lane & 3;
    const long long q0 = (long long)blockIdx.x * FA_T;
    const long long rows = min((long long)FA_T, g.l - q0);
    const long long nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (q0 + rows - 1) / FA_T + 1) : nkt;
    const int dsteps = (int)((g.d + 7) / 8), vsteps = (int)((g.dv + 7) / 8);
    // scores in base-2 units, x = scale · log2(e) · q·k, weights 2^(x - m); with an
    // additive bias in natural units, x = scale · q·k + bias, weights 2^((x - m) · log2(e))
    // (u): a bias near -FLT_MAX times log2(e) would overflow to -inf and give 0/0
    const float sl2 = g.scale * FA_LOG2E;
    const float u = g.mask == 2 ? FA_LOG2E : 1.0f;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        __syncthreads();  // the previous batch matrix's reads of qsp are done
        // (the key loop's barriers make the split rows visible before any read)
        {
            float4 qst[4][2];
            fa_fetch_rows<4>(qst, q, b * g.l + q0, rows, g.d, g.d, nullptr);
            fa_put_rows<4>(qsp, qst);
        }
        float o[8][4] = {}, m[2] = {FA_NEG_INF, FA_NEG_INF}, l[2] = {0.0f, 0.0f};
        bool any[2] = {false, false};
        // the next key tile to compute (uniform in the block: every thread skips the same
        // tiles), its k rows and v rows fetched one tile ahead
        auto next_tile = [&](long long t) {
            while (t < kt_end && skip_tiles && !fa_tile_any(g, bits, b, blockIdx.x, t)) ++t;
            return t;
        };
        float4 kst[4][2], vst[4][2];
        long long kt = next_tile(0);
        if (kt < kt_end) {
            fa_fetch_rows<4>(kst, k, b * g.s + kt * FA_T, min((long long)FA_T, g.s - kt * FA_T), g.d, g.d, nullptr);
            fa_fetch_cols(vst, v, b * g.s + kt * FA_T, min((long long)FA_T, g.s - kt * FA_T), g.dv, g.dv);
        }
        while (kt < kt_end) {
            const long long k0 = kt * FA_T, keys = min((long long)FA_T, g.s - k0);
            __syncthreads();  // the previous tile's reads are done
            fa_put_rows<4>(ksp, kst);
            fa_put_cols(vsp, vst);
            __syncthreads();
            const long long next = next_tile(kt + 1);
            if (next < kt_end) {
                const long long n0 = next * FA_T, nkeys = min((long long)FA_T, g.s - n0);
                fa_fetch_rows<4>(kst, k, b * g.s + n0, nkeys, g.d, g.d, nullptr);
                fa_fetch_cols(vst, v, b * g.s + n0, nkeys, g.dv, g.dv);
            }
            // scores: sc[n] is the C fragment of keys 8n..8n+7
            float sc[8][4] = {};
            #pragma unroll
            for (int st = 0; st < 8; ++st) {
                if (st >= dsteps) break;  // uniform
                unsigned ab[4], as[4];
                fa_a_fragment(qsp, warp * 16 + gq, st, tq, ab, as);
                fa_mma3_split(sc, ab, as, ksp + gq * FA_MP + st * 16 + 4 * tq, 8 * FA_MP, 8);
            }
            // the online softmax of rows gq (h = 0) and gq + 8 (h = 1). Entry (n, e) of a
            // row is key jj = 8n + 2tq + e of the tile; it is allowed when jj < lim (the
            // row exists, the key exists, causal) and its mask bit is set.
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const long long i = q0 + warp * 16 + gq + 8 * h;
                long long lim = i < g.l ? keys : 0;
                const long long seen = i - k0 + 1;  // causal: keys j <= i
                if (g.causal) lim = min(lim, seen < 0 ? 0LL : seen);
                const int lim2 = (int)lim - 2 * tq;
                // the row's mask words, shifted so that bit 8n' + e is entry (n' + 4·word, e)
                const unsigned w0 = fa_word(g, bits, b, i, k0) >> (2 * tq);
                const unsigned w1 = fa_word(g, bits, b, i, k0 + 32) >> (2 * tq);
                unsigned okm = 0u;
                float mx = FA_NEG_INF;
                if (g.mask == 0 && lim == FA_T) {
                    // every entry allowed (a whole key tile, no mask, not cut by causality):
                    // no per-entry tests
                    #pragma unroll
                    for (int n = 0; n < 8; ++n)
                        #pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float& x = sc[n][2 * h + e];
                            x *= sl2;
                            mx = fmaxf(mx, x);
                        }
                } else {
                #pragma unroll
                for (int n = 0; n < 8; ++n)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int jj = n * 8 + e;  // + 2tq
                        const bool ok = jj < lim2 && (((n < 4 ? w0 : w1) >> ((n % 4) * 8 + e)) & 1u);
                        float& x = sc[n][2 * h + e];
                        if (g.mask == 2) {
                            // natural units (u below): a score near -FLT_MAX (an f32::MIN
                            // bias) times log2(e) would overflow to -inf
                            x = ok ? fa_score(g, bias, b, i, k0 + jj + 2 * tq, x) : FA_NEG_INF;
                            okm |= (ok ? 1u : 0u) << (2 * n + e);
                        } else {
                            // scores are finite here (flag `wide`): a blocked entry is the
                            // only -inf, and its weight 2^-inf is exactly 0
                            x = ok ? x * sl2 : FA_NEG_INF;
                        }
                        mx = fmaxf(mx, x);
                    }
                }
                if (g.mask == 2) any[h] |= okm != 0u;
                else any[h] |= mx != FA_NEG_INF;
                mx = fa_max_over<4>(mx);
                const float mn = fmaxf(m[h], mx);
                const float mu = mn == FA_NEG_INF ? 0.0f : mn;
                const float alpha = fa_exp2((m[h] - mu) * u);
                float sum = 0.0f;
                #pragma unroll
                for (int n = 0; n < 8; ++n)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = sc[n][2 * h + e];
                        // with a bias, an allowed score may be -inf too: its weight is 0
                        // and the row still attends (0/0 if every weight is)
                        if (g.mask == 2) x = (okm >> (2 * n + e)) & 1u ? fa_exp2((x - mu) * u) : 0.0f;
                        else x = fa_exp2(x - mu);
                        sum += x;
                    }
                l[h] = l[h] * alpha + fa_sum_over<4>(sum);
                m[h] = mn;
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    o[c][2 * h] *= alpha;
                    o[c][2 * h + 1] *= alpha;
                }
            }
            // o += P·V: keys 8n..8n+7 are the inner index (tq ↔ key 2tq, tq + 4 ↔ 2tq + 1)
            #pragma unroll
            for (int n = 0; n < 8; ++n) {
                unsigned pb[4], ps[4];
                fa_split(sc[n][0], pb[0], ps[0]);
                fa_split(sc[n][2], pb[1], ps[1]);
                fa_split(sc[n][1], pb[2], ps[2]);
                fa_split(sc[n][3], pb[3], ps[3]);
                // B fragment c: v column 8c + gq, keys 8n + 2tq (+1)
                fa_mma3_split(o, pb, ps, vsp + gq * FA_MP + n * 16 + 4 * tq, 8 * FA_MP, vsteps);
            }
            kt = next;
        }
        const long long R = g.bh * g.l;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long i = q0 + warp * 16 + gq + 8 * h;
            // every lane of the quad takes part in the reduction; only rows that exist are
            // written, and a fully blocked row has no allowed entry in any lane's tiles
            const bool attends = fa_sum_over<4>(any[h] ? 1.0f : 0.0f) > 0.0f;
            if (i >= g.l) continue;
            const long long row = b * g.l + i;
            #pragma unroll
            for (int c = 0; c < 8; ++c)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const long long col = c * 8 + 2 * tq + e;
                    if (col < g.dv) out[row * g.dv + col] = attends ? o[c][2 * h + e] / l[h] : 0.0f;
                }
            if (tq == 0 && stats != nullptr) {
                // the row's maximum in natural units (the scores were in log2 units without
                // a bias) and 1 / normalizer
                const float mu = m[h] == FA_NEG_INF ? 0.0f : m[h];
                stats[row] = attends ? (g.mask == 2 ? mu : mu * FA_LN2) : 0.0f;
                stats[R + row] = attends ? 1.0f / l[h] : 0.0f;
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) flash_forward_mma(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide, float* __restrict__ out,
    float* __restrict__ stats, Flash g) {
    flash_forward_mma_impl<false>(q, k, v, bits, bias, nonfinite, wide, out, stats, g);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) flash_forward_mma_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide, float* __restrict__ out,
    float* __restrict__ stats, Flash g) {
    flash_forward_mma_impl<true>(q, k, v, bits, bias, nonfinite, wide, out, stats, g);
}

// stats[2R + row] = dO·O of each of the R rows (one warp per row), for a VJP whose
// log-sum-exps the forward left.
