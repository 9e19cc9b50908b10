// ---- the tensor-core VJP for keys and values: flash_bwd_kv_mma (d, dv <= 64) ----
//
// Opt-in (TORCHLEAN_FLASH_MMA=1, src/device.rs) until it measures faster than flash_bwd_kv.
// flash_bwd_kv's computation (dV = Pᵀ dO, dK = scale · dSᵀ Q per key block, and with fuse_dq
// dQ += scale · dS K added atomically) with its five products in split-TF32 on tensor cores,
// each operand split as its fragment is read. Run only when every |q|, |k|, |v|, |O|, |dO|
// is below FA_LIMIT (flag `wide`; then |dP|, |D| <= 64 · 2^48 and |dS| < 2^55, so every
// split operand is finite and far from overflow); otherwise it returns at once and
// flash_bwd_kv, gated on the same flag, takes the call. Block: 64 keys, warp w owning keys
// 16w..16w+15 as the fragments' rows; the queries walked in tiles of FA_QB = 32, the next
// tile's q and dO rows fetched into registers while the current one is computed. Sᵀ and
// dPᵀ are C fragments whose columns are queries, turned into the A operand of the Pᵀ dO and
// dSᵀ Q products in place (inner index tq ↔ query 2tq, tq + 4 ↔ 2tq + 1, as the forward's
// P·V); for dQ, dS goes through shared memory as [query][key], its inner index (keys)
// ordered the same way (both fragments of a row in one 8-byte read). Probabilities in base 2 (exp2 of log2(e)·score −
// log2(e)·lse) without an additive mask; with one, fa_grad_entry's f32 code. Shared memory
// (FA_MMA_BWD_FLOATS): k and v rows of the block, q and dO rows of the query tile, dS, and
// the tile's statistics and mask words; q and dO rows are also kept row-split (FA_MP), the B
// operands of Sᵀ and dPᵀ, split once per block instead of once per warp.
#define FA_QB 32
#define FA_MMA_BWD_FLOATS (2 * FA_TILE + 3 * FA_QB * FA_P + 2 * FA_QB * FA_MP + 5 * FA_QB)

// The split pair (x[0], x[1]) of an 8-byte aligned read: fragment registers r0 (inner tq) and
// r1 (inner tq + 4) of one row.
__device__ __forceinline__ void fa_split_pair(const float* p, unsigned& b0, unsigned& s0,
                                              unsigned& b1, unsigned& s1) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    fa_split(x.x, b0, s0);
    fa_split(x.y, b1, s1);
}

// acc[n] += A·Bᵀ for n < N over the head dimension (`steps` chunks of 8 columns), A the 16
// rows at `a` (an f32 tile of stride FA_P, split here) and B's rows 8n.. in the row-split
// tile `bsp` (FA_MP), zero beyond their columns.
template <int N>
__device__ __forceinline__ void fa_mma_rows(float (*acc)[4], const float* a, const unsigned* bsp,
                                            int steps, int gq, int tq) {
    #pragma unroll
    for (int st = 0; st < 8; ++st) {
        if (st >= steps) break;  // uniform
        const float* ar = a + gq * FA_P + st * 8 + tq;
        unsigned ab[4], as[4];
        fa_split(ar[0], ab[0], as[0]);
        fa_split(ar[8 * FA_P], ab[1], as[1]);
        fa_split(ar[4], ab[2], as[2]);
        fa_split(ar[8 * FA_P + 4], ab[3], as[3]);
        fa_mma3_split(acc, ab, as, bsp + gq * FA_MP + st * 16 + 4 * tq, 8 * FA_MP, N);
    }
}

// acc[c] += A·B[:, 8c..8c+7] for c < min(count, 8) (uniform) with the split A fragment
// (ab, as) over 8 inner rows of B (row-major, stride FA_P) whose rows for inner index tq and
// tq + 4 are at `b` and `b + off` (column gq of block c at + 8c).
__device__ __forceinline__ void fa_mma_cols(float (*acc)[4], const unsigned ab[4],
                                            const unsigned as[4], const float* b, int off,
                                            int count) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {  // two groups of four column blocks (fewer live registers)
        unsigned bb[4][2], bs[4][2];
        #pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int c = 4 * h + n;
            if (c < count) {
                fa_split(b[8 * c], bb[n][0], bs[n][0]);
                fa_split(b[8 * c + off], bb[n][1], bs[n][1]);
            }
        }
        #pragma unroll
        for (int n = 0; n < 4; ++n)
            if (4 * h + n < count) fa_mma(acc[4 * h + n], as, bb[n]);
        #pragma unroll
        for (int n = 0; n < 4; ++n)
            if (4 * h + n < count) fa_mma(acc[4 * h + n], ab, bs[n]);
        #pragma unroll
        for (int n = 0; n < 4; ++n)
            if (4 * h + n < count) fa_mma(acc[4 * h + n], ab, bb[n]);
    }
}

template <bool TILES>
__device__ __forceinline__ void flash_bwd_kv_mma_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide,
    const float* __restrict__ stats, const float* __restrict__ dout, float* __restrict__ dk,
    float* __restrict__ dv, Flash g, float* __restrict__ dq, int fuse_dq) {
    if (wide[0] != 0) return;  // flash_bwd_kv takes the call (uniform over the grid)
    extern __shared__ __align__(16) float smem[];
    float* ks = smem;                      // k rows of this block's keys
    float* vs = smem + FA_TILE;            // v rows of this block's keys
    float* qs = smem + 2 * FA_TILE;        // q rows of the query tile
    float* os = qs + FA_QB * FA_P;         // dO rows of the query tile
    float* dsq = os + FA_QB * FA_P;        // dS [query][key] of the tile (for dQ)
    unsigned* qsp = reinterpret_cast<unsigned*>(dsq + FA_QB * FA_P);  // q rows, row-split
    unsigned* osp = qsp + FA_QB * FA_MP;                              // dO rows, row-split
    float* sh = reinterpret_cast<float*>(osp + FA_QB * FA_MP);  // lse, attends, D of the tile's queries
    unsigned* shw = reinterpret_cast<unsigned*>(sh + 3 * FA_QB);  // their mask words (2 each)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int gq = lane >> 2, tq = lane & 3;
    const long long k0 = (long long)blockIdx.x * FA_T;
    const long long keys = min((long long)FA_T, g.s - k0);
    const long long R = g.bh * g.l, nqt = (g.l + FA_QB - 1) / FA_QB;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    // causal: query tiles wholly before the block's first key see none of its keys
    const long long qt_begin = skip ? k0 / FA_QB : 0;
    const int dsteps = (int)((g.d + 7) / 8), vsteps = (int)((g.dv + 7) / 8);
    const float* att_of = stats + R;
    const float sl2 = g.scale * FA_LOG2E;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float ak[8][4] = {}, av[8][4] = {};
        __syncthreads();  // the previous batch matrix's reads are done
        fa_load(ks, k, b * g.s + k0, keys, g.d, 0, g.d, nullptr, 0);
        fa_load(vs, v, b * g.s + k0, keys, g.dv, 0, g.dv, nullptr, 0);
        auto next_tile = [&](long long t) {
            // uniform in the block; the mask's tile words are per 64 queries
            while (t < nqt && skip_tiles && !fa_tile_any(g, bits, b, t * FA_QB / FA_T, blockIdx.x)) ++t;
            return t;
        };
        float4 qst[2][2], ost[2][2];
        long long qt = next_tile(qt_begin);
        if (qt < nqt) {
            const long long i0 = qt * FA_QB, rows = min((long long)FA_QB, g.l - i0);
            fa_fetch_rows<2>(qst, q, b * g.l + i0, rows, g.d, g.d, att_of);
            fa_fetch_rows<2>(ost, dout, b * g.l + i0, rows, g.dv, g.dv, att_of);
        }
        while (qt < nqt) {
            const long long i0 = qt * FA_QB, rows = min((long long)FA_QB, g.l - i0);
            __syncthreads();  // the previous tile's reads are done
            fa_put_raw<2>(qs, qst);
            fa_put_raw<2>(os, ost);
            fa_put_rows<2>(qsp, qst);
            fa_put_rows<2>(osp, ost);
            if (threadIdx.x < FA_QB) {
                const int r = threadIdx.x;
                const bool in = r < rows;
                const long long row = b * g.l + i0 + r;
                sh[r] = in ? stats[row] : 0.0f;
                sh[FA_QB + r] = in ? stats[R + row] : 0.0f;
                sh[2 * FA_QB + r] = in ? stats[2 * R + row] : 0.0f;
            } else if (threadIdx.x < 3 * FA_QB) {
                const int x = threadIdx.x - FA_QB, r = x >> 1;
                shw[x] = fa_word(g, bits, b, i0 + r, k0 + 32 * (x & 1));
            }
            __syncthreads();
            const long long next = next_tile(qt + 1);
            if (next < nqt) {
                const long long n0 = next * FA_QB, nrows = min((long long)FA_QB, g.l - n0);
                fa_fetch_rows<2>(qst, q, b * g.l + n0, nrows, g.d, g.d, att_of);
                fa_fetch_rows<2>(ost, dout, b * g.l + n0, nrows, g.dv, g.dv, att_of);
            }
            // Sᵀ and dPᵀ: rows keys 16w + gq (+8), C fragment n of queries 8n..8n+7
            float sT[4][4] = {}, dpT[4][4] = {};
            fa_mma_rows<4>(sT, ks + warp * 16 * FA_P, qsp, dsteps, gq, tq);
            fa_mma_rows<4>(dpT, vs + warp * 16 * FA_P, osp, vsteps, gq, tq);
            // sT becomes Pᵀ, dpT becomes dSᵀ (entry: key kk, query ii)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int kk = warp * 16 + gq + 8 * h;
                const long long j = k0 + kk;
                #pragma unroll
                for (int n = 0; n < 4; ++n)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int ii = n * 8 + 2 * tq + e;
                        const long long i = i0 + ii;
                        float& s = sT[n][2 * h + e];
                        float& dp = dpT[n][2 * h + e];
                        if (g.mask == 2) {
                            float p, ds;
                            fa_grad_entry(g, bias, b, i, j, 1u, sh[ii], sh[FA_QB + ii],
                                          sh[2 * FA_QB + ii], s, dp, p, ds);
                            s = p;
                            dp = ds;
                        } else {
                            // every value is finite here (flag `wide`): a blocked entry's
                            // weight is exactly 0, and so is its score gradient
                            const bool ok = ii < rows && kk < keys && sh[FA_QB + ii] != 0.0f &&
                                            !(g.causal && j > i) &&
                                            ((shw[2 * ii + (kk >> 5)] >> (kk & 31)) & 1u);
                            const float p = ok ? fa_exp2(s * sl2 - sh[ii] * FA_LOG2E) * sh[FA_QB + ii] : 0.0f;
                            s = p;
                            dp = p * (dp - sh[2 * FA_QB + ii]);
                        }
                    }
            }
            // dV += Pᵀ dO and dK += dSᵀ Q: queries 8n..8n+7 are the inner index
            #pragma unroll
            for (int n = 0; n < 4; ++n) {
                unsigned pb[4], ps[4], sb[4], ss[4];
                fa_split(sT[n][0], pb[0], ps[0]);
                fa_split(sT[n][2], pb[1], ps[1]);
                fa_split(sT[n][1], pb[2], ps[2]);
                fa_split(sT[n][3], pb[3], ps[3]);
                fa_split(dpT[n][0], sb[0], ss[0]);
                fa_split(dpT[n][2], sb[1], ss[1]);
                fa_split(dpT[n][1], sb[2], ss[2]);
                fa_split(dpT[n][3], sb[3], ss[3]);
                fa_mma_cols(av, pb, ps, os + (n * 8 + 2 * tq) * FA_P + gq, FA_P, vsteps);
                fa_mma_cols(ak, sb, ss, qs + (n * 8 + 2 * tq) * FA_P + gq, FA_P, dsteps);
            }
            if (fuse_dq) {
                // dQ += scale · dS K: dS to shared memory as [query][key], then warp w takes
                // queries 16(w & 1) + gq (+8) as rows and column blocks 4(w >> 1).. of d,
                // keys as the inner index (tq ↔ key 2tq, tq + 4 ↔ 2tq + 1)
                #pragma unroll
                for (int n = 0; n < 4; ++n)
                    #pragma unroll
                    for (int h = 0; h < 2; ++h)
                        #pragma unroll
                        for (int e = 0; e < 2; ++e)
                            dsq[(n * 8 + 2 * tq + e) * FA_P + warp * 16 + gq + 8 * h] = dpT[n][2 * h + e];
                __syncthreads();
                const int qrow = 16 * (warp & 1), cb = 4 * (warp >> 1);
                float aq[4][4] = {};
                #pragma unroll
                for (int st = 0; st < 8; ++st) {  // keys 8st..8st+7
                    unsigned ab[4], as[4];
                    fa_split_pair(dsq + (qrow + gq) * FA_P + st * 8 + 2 * tq, ab[0], as[0], ab[2], as[2]);
                    fa_split_pair(dsq + (qrow + gq + 8) * FA_P + st * 8 + 2 * tq, ab[1], as[1], ab[3], as[3]);
                    // B: k rows 8st + 2tq (+1), column 8(cb + c) + gq
                    const float* kr = ks + (st * 8 + 2 * tq) * FA_P + 8 * cb + gq;
                    unsigned bb[4][2], bs[4][2];
                    #pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (cb + c < dsteps) {
                            fa_split(kr[8 * c], bb[c][0], bs[c][0]);
                            fa_split(kr[8 * c + FA_P], bb[c][1], bs[c][1]);
                        }
                    #pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (cb + c < dsteps) fa_mma(aq[c], as, bb[c]);
                    #pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (cb + c < dsteps) fa_mma(aq[c], ab, bs[c]);
                    #pragma unroll
                    for (int c = 0; c < 4; ++c)
                        if (cb + c < dsteps) fa_mma(aq[c], ab, bb[c]);
                }
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int ii = qrow + gq + 8 * h;
                    const long long i = i0 + ii, row = b * g.l + i;
                    if (i >= g.l || sh[FA_QB + ii] == 0.0f) continue;
                    #pragma unroll
                    for (int c = 0; c < 4; ++c)
                        #pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const long long col = (cb + c) * 8 + 2 * tq + e;
                            if (col < g.d) atomicAdd(&dq[row * g.d + col], g.scale * aq[c][2 * h + e]);
                        }
                }
            }
            qt = next;
        }
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long j = k0 + warp * 16 + gq + 8 * h;
            if (j >= g.s) continue;
            #pragma unroll
            for (int c = 0; c < 8; ++c)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const long long col = c * 8 + 2 * tq + e;
                    if (col < g.d) dk[(b * g.s + j) * g.d + col] = g.scale * ak[c][2 * h + e];
                    if (col < g.dv) dv[(b * g.s + j) * g.dv + col] = av[c][2 * h + e];
                }
        }
    }
}
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) flash_bwd_kv_mma(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide,
    const float* __restrict__ stats, const float* __restrict__ dout, float* __restrict__ dk,
    float* __restrict__ dv, Flash g, float* __restrict__ dq, int fuse_dq) {
    flash_bwd_kv_mma_impl<false>(q, k, v, bits, bias, nonfinite, wide, stats, dout, dk, dv, g, dq, fuse_dq);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) flash_bwd_kv_mma_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const int* __restrict__ wide,
    const float* __restrict__ stats, const float* __restrict__ dout, float* __restrict__ dk,
    float* __restrict__ dv, Flash g, float* __restrict__ dq, int fuse_dq) {
    flash_bwd_kv_mma_impl<true>(q, k, v, bits, bias, nonfinite, wide, stats, dout, dk, dv, g, dq, fuse_dq);
}

// VJP, queries (and the additive mask): one block per 64 query rows (blockIdx.x) and chunk
// z of d (blockIdx.z): dQ = scale · dS K over every key tile the rows can see; with
// want_bias (chunk 0 only), dbias[b, i, j] = dS for every entry visited (the caller zeroes
// the buffer first: skipped causal tiles hold exact zeros). Thread rows are queries,
// scattered columns keys. Dynamic shared memory 5 tiles.
