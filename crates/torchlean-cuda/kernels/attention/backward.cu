// ---- the VJP kernels with f32 FMA products: statistics, keys and values, queries ----

extern "C" __global__ void flash_row_dot(const float* __restrict__ dout, const float* __restrict__ out,
                                         float* __restrict__ stats, long long R, long long dv) {
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    // R rows in a warp-uniform grid-stride loop
    for (long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; row < R; row += warps) {
        float dot = 0.0f;
        for (long long c = threadIdx.x % 32; c < dv; c += 32) dot += dout[row * dv + c] * out[row * dv + c];
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (threadIdx.x % 32 == 0) stats[2 * R + row] = dot;
    }
}

// The probability and score gradient of entry (i, j) from its recomputed product `dot`,
// dP = dO_i·v_j, and the row's stats (its maximum mx, inv = 1 / its normalizer z — nonzero
// exactly when the row attends — and D = dO_i·O_i): p = exp(score - mx) / z when allowed (not
// exp(score - lse): where |mx| dwarfs ln z, as under an additive mask of -1e9 or f32::MIN
// over a whole row, lse = mx + ln z rounds to mx and every p to 1); a blocked entry's
// probability is the spec's 0 / z (0, or NaN when z is NaN or 0: inv NaN or +inf); dS = p (dP - D) for every existing
// entry of an attending row (so 0 · a non-finite value is NaN, as in the spec), exactly 0
// for a row that attends nothing.
__device__ __forceinline__ void fa_grad_entry(const Flash& g, const float* __restrict__ bias,
                                              long long b, long long i, long long j, unsigned m,
                                              float mx, float inv, float D, float dot, float dp,
                                              float& p, float& ds) {
    const bool part = i < g.l && j < g.s && inv != 0.0f;
    const bool ok = part && fa_allowed(g, i, j, m);
    const float blocked = part && !(inv < FA_POS_INF) ? FA_NAN : 0.0f;
    p = ok ? fa_exp2((fa_score(g, bias, b, i, j, dot) - mx) * FA_LOG2E) * inv : blocked;
    ds = part ? p * (dp - D) : 0.0f;
}

// Asynchronous copies into shared memory (cp.async, sm_80 and later): 16 or 4 bytes, or
// zeros where `fill` is false (nothing is read then); in the emulation and before sm_80,
// plain copies, complete when they return. fa_cp_wait waits for the calling thread's copies;
// a barrier after it makes them visible to the block.
__device__ __forceinline__ void fa_cp16(float* dst, const float* __restrict__ src, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(fill ? 16 : 0)
                 : "memory");
#else
    *reinterpret_cast<float4*>(dst) =
        fill ? *reinterpret_cast<const float4*>(src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#endif
}
__device__ __forceinline__ void fa_cp4(float* dst, const float* __restrict__ src, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(fill ? 4 : 0)
                 : "memory");
#else
    *dst = fill ? *src : 0.0f;
#endif
}
__device__ __forceinline__ void fa_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Starts copying query tile i0 (`rows` rows) of batch matrix b: its q rows into qs, dO rows
// into os (zeros past the matrix and past d, dv; 16-byte copies when d and dv are multiples
// of 4, else plain loads) and its three statistics into rs (max, 1 / normalizer, D; zeros past the
// matrix). Rows that attend nothing are copied as they are: the caller zeroes them.
__device__ __forceinline__ void fa_stage(float* qs, float* os, float* rs, const float* __restrict__ q,
                                         const float* __restrict__ dout,
                                         const float* __restrict__ stats, const Flash& g,
                                         long long b, long long i0, long long rows) {
    const long long R = g.bh * g.l, row0 = b * g.l + i0;
    if (g.d % 4 == 0 && g.dv % 4 == 0) {
        for (int e = threadIdx.x; e < FA_T * (FA_C / 4); e += blockDim.x) {
            const int r = e / (FA_C / 4), c = (e % (FA_C / 4)) * 4;
            const bool fq = r < rows && c < g.d, fo = r < rows && c < g.dv;
            fa_cp16(&qs[r * FA_P + c], fq ? &q[(row0 + r) * g.d + c] : q, fq);
            fa_cp16(&os[r * FA_P + c], fo ? &dout[(row0 + r) * g.dv + c] : dout, fo);
        }
    } else {
        for (int e = threadIdx.x; e < FA_T * FA_C; e += blockDim.x) {
            const int r = e / FA_C, c = e % FA_C;
            qs[r * FA_P + c] = r < rows && c < g.d ? q[(row0 + r) * g.d + c] : 0.0f;
            os[r * FA_P + c] = r < rows && c < g.dv ? dout[(row0 + r) * g.dv + c] : 0.0f;
        }
    }
    if (threadIdx.x < FA_T) {
        const int t = threadIdx.x;
        const bool in = t < rows;
        fa_cp4(&rs[t], in ? &stats[row0 + t] : stats, in);
        fa_cp4(&rs[FA_T + t], in ? &stats[R + row0 + t] : stats, in);
        fa_cp4(&rs[2 * FA_T + t], in ? &stats[2 * R + row0 + t] : stats, in);
    }
}

// The first query tile at or after qt that the key block kt visits (nqt when none).
template <bool TILES>
__device__ __forceinline__ long long fa_next_tile(const Flash& g, const unsigned* __restrict__ bits,
                                                  bool skip_tiles, long long b, long long qt,
                                                  long long nqt, long long kt) {
    while (qt < nqt && TILES && skip_tiles && !fa_tile_any(g, bits, b, qt, kt)) ++qt;
    return qt;
}

// The key/value VJP with one chunk of each head dimension (d, dv <= 64; blockIdx.z = 0):
// flash_bwd_kv_impl's work in three barriers per query tile, the next tile's q, dO and
// statistics copied in (fa_stage) while this tile's dQ product runs. S = K Qᵀ and dP = V dOᵀ
// (thread rows keys, scattered columns queries) become P and dS entry by entry and are stored
// at once as Pᵀ and dSᵀ (key-major, swizzled); after one barrier dV += Pᵀ dO, dK += dSᵀ Q
// and, with fuse_dq, dQ += scale · dS K read from the same dSᵀ tile (fa_mul_cols), added with
// vector reductions where d is a multiple of 4. Query rows that attend nothing are zeroed in
// the staged tiles (when a tile has any: the first barrier tells) so that they take no part.
// A tile inside the matrix that no mask, bias or causal limit reaches (every entry exists and
// is allowed) takes fa_grad_entry's values without its tests. Dynamic shared memory 6 tiles
// and 3 × 64 floats.
template <bool TILES>
__device__ __forceinline__ void flash_bwd_kv_one_chunk(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, const Flash& g,
    float* __restrict__ dq, int fuse_dq, long long split_heads, long long parts, float* __restrict__ part,
    long long group, long long slot_stride, int* __restrict__ turns) {
    extern __shared__ __align__(16) float smem[];
    float* ks = smem;                // k rows
    float* vs = smem + FA_TILE;      // v rows
    float* qs = smem + 2 * FA_TILE;  // q rows of the query tile (rows that attend nothing: 0)
    float* os = smem + 3 * FA_TILE;  // dO rows of the query tile (likewise)
    float* pt = smem + 4 * FA_TILE;  // Pᵀ: [j][i], swizzled (fa_swizzle)
    float* dt = smem + 5 * FA_TILE;  // dSᵀ: [j][i], swizzled
    float* rs = smem + 6 * FA_TILE;  // the query tile's stats: max, 1 / normalizer, D (3 × 64)
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long nqt = (g.l + FA_T - 1) / FA_T, nkt = (g.s + FA_T - 1) / FA_T;
    // the block's coordinates: its own, or with ordered dQ (fuse_dq 4) those of a ticket
    // drawn when it starts (x fastest, key tiles descending), so that every block it waits
    // for (same batch matrix, the key tile after it: before it in the order of additions,
    // a lower ticket) has already started and never waits for it
    long long bx = blockIdx.x, by = blockIdx.y;
    if (fuse_dq == 4) {
        // handed to every thread through the statistics' shared words (staged only later)
        unsigned* slot = reinterpret_cast<unsigned*>(rs);
        if (threadIdx.x == 0) *slot = atomicAdd((unsigned*)turns, 1u);
        __syncthreads();
        const unsigned ticket = *slot;
        __syncthreads();
        bx = ticket % gridDim.x;
        by = ticket / gridDim.x;
        bx = gridDim.x - 1 - bx;
    }
    // key tiles [kt_first, kt_end) of this block (one unless dQ goes to slots of `group`)
    const long long kt_first = bx * group, kt_end = min(kt_first + group, nkt);
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const bool vec_dq = g.d % 4 == 0;
    // rows y of the grid: batch matrix y below `full`; after it, `parts` rows per batch matrix
    // of the last split_heads, row t = y - full taking query tiles [p·nqt/parts,
    // (p+1)·nqt/parts) of matrix full + t / parts (p = t % parts) and leaving its dK, dV in
    // rows t of `part` (flash_sum_parts adds them in order)
    const long long full = g.bh - split_heads, ny = full + split_heads * parts;
    for (long long y = by; y < ny; y += gridDim.y)
    for (long long kt = kt_first; kt < kt_end; ++kt) {
        const long long k0 = kt * FA_T, keys = min((long long)FA_T, g.s - k0);
        const long long t = y - full, b = t < 0 ? y : full + t / parts;
        const long long qt_end = t < 0 ? nqt : (t % parts + 1) * nqt / parts;
        const long long qt_begin = max(skip ? k0 / FA_T : 0LL, t < 0 ? 0LL : (t % parts) * nqt / parts);
        // dQ into slot bx: stored (fuse_dq 2: one key tile per slot, visiting every query
        // row of the matrix) or added to the zeroed slot (fuse_dq 3)
        const bool add_dq = fuse_dq == 3;
        float ak[4][8] = {}, av[4][8] = {};
        __syncthreads();
        fa_load(ks, k, b * g.s + k0, keys, g.d, 0, g.d, nullptr, 0);
        fa_load(vs, v, b * g.s + k0, keys, g.dv, 0, g.dv, nullptr, 0);
        long long qt = fa_next_tile<TILES>(g, bits, skip_tiles, b, qt_begin, qt_end, kt);
        if (qt < qt_end) fa_stage(qs, os, rs, q, dout, stats, g, b, qt * FA_T, min((long long)FA_T, g.l - qt * FA_T));
        int next_turn = 0;  // ordered dQ: the turn thread 0 releases after this tile's additions
        while (qt < qt_end) {
            const long long i0 = qt * FA_T, rows = min((long long)FA_T, g.l - i0);
            fa_cp_wait();
            // the staged tile is visible; some row of it attends nothing?
            if (__syncthreads_or(threadIdx.x < rows && rs[FA_T + threadIdx.x] == 0.0f)) {
                for (int e = threadIdx.x; e < FA_T * FA_C; e += blockDim.x) {
                    const int r = e / FA_C, c = e % FA_C;
                    if (rs[FA_T + r] == 0.0f) qs[r * FA_P + c] = os[r * FA_P + c] = 0.0f;
                }
                __syncthreads();
            }
            // entry (key k0 + ty·4 + a, query i0 + tx + 8c); the tiles are zero past d, dv
            float st[4][8] = {}, dp[4][8] = {};
            fa_dot_rows(st, ks, ty * 4, qs, tx, FA_C);
            fa_dot_rows(dp, vs, ty * 4, os, tx, FA_C);
            const bool plain = g.mask == 0 && i0 + FA_T <= g.l && k0 + FA_T <= g.s &&
                               !(g.causal && k0 + FA_T - 1 > i0);
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long i = i0 + tx + 8 * c;
                const float mx = rs[tx + 8 * c], inv = rs[FA_T + tx + 8 * c], D = rs[2 * FA_T + tx + 8 * c];
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long j = k0 + ty * 4 + a;
                    float p, ds;
                    if (plain) {
                        // fa_grad_entry for an existing, allowed entry without a bias
                        const bool part = inv != 0.0f;
                        p = part ? fa_exp2((st[a][c] * g.scale - mx) * FA_LOG2E) * inv : 0.0f;
                        ds = part ? p * (dp[a][c] - D) : 0.0f;
                    } else {
                        fa_grad_entry(g, bias, b, i, j, fa_bit(g, bits, b, i, j), mx, inv, D,
                                      st[a][c], dp[a][c], p, ds);
                    }
                    const int r = ty * 4 + a, col = (tx + 8 * c) ^ fa_swizzle(r);
                    pt[r * FA_P + col] = p;
                    dt[r * FA_P + col] = ds;
                }
            }
            __syncthreads();
            fa_mul_rows<true>(av, pt, ty * 4, os, tx, FA_T);
            fa_mul_rows<true>(ak, dt, ty * 4, qs, tx, FA_T);
            // whether this thread's dQ rows attend (rs is restaged below)
            bool attends[4];
            #pragma unroll
            for (int a = 0; a < 4; ++a) attends[a] = rs[FA_T + ty * 4 + a] != 0.0f;
            const long long next = fa_next_tile<TILES>(g, bits, skip_tiles, b, qt + 1, qt_end, kt);
            // every thread is done with this tile's q, dO and stats: stage the next
            __syncthreads();
            if (next < qt_end) fa_stage(qs, os, rs, q, dout, stats, g, b, next * FA_T, min((long long)FA_T, g.l - next * FA_T));
            if (fuse_dq) {
                // dQ rows i0 + ty·4 + a, grouped columns: dS K from dSᵀ and the k rows
                float aq[4][8] = {};
                fa_mul_cols<true>(aq, dt, ty * 4, ks, tx, FA_T);
                // ordered: the key tiles that visit this query tile add in a fixed order,
                // so the additions into each element of dQ are the same on every run:
                // descending, key tile kt after the visitors above it (every key tile up to
                // the last one, or the causal cut's diagonal tile; under a boolean mask
                // those the tile words let through). Each key tile walks the query tiles
                // upwards from its first, so with a causal cut — or a lower-triangular
                // mask — the diagonal tile, visited first, adds first and key tile kt, one
                // step behind kt + 1 at every query tile, seldom waits (ascending, key
                // tile kt would wait at its first tile until key tile 0 got there)
                int* turn = fuse_dq == 4 ? turns + 1 + b * nqt + qt : nullptr;
                if (turn != nullptr) {
                    const long long last = skip ? min(qt, nkt - 1) : nkt - 1;
                    int my_turn = (int)(last - kt);
                    if (skip_tiles && threadIdx.x < 32)
                        my_turn = fa_count_visitors(g, bits, b, qt, kt + 1, last + 1);
                    if (threadIdx.x == 0) {
                        fa_turn_wait(turn, my_turn);
                        next_turn = my_turn + 1;
                    }
                    __syncthreads();
                }
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long i = i0 + ty * 4 + a, row = b * g.l + i;
                    if (i >= g.l) continue;
                    if (fuse_dq == 2 || fuse_dq == 3) {
                        // this thread's entries of the slot, in the same order for every key
                        // tile of the group; a row that attends nothing gets exact zeros
                        float* out = dq + bx * slot_stride + row * g.d;
                        #pragma unroll
                        for (int h = 0; h < 2; ++h)
                            #pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const long long col = h * 32 + tx * 4 + e;
                                if (col >= g.d) continue;
                                const float x = attends[a] ? g.scale * aq[a][4 * h + e] : 0.0f;
                                out[col] = add_dq ? out[col] + x : x;
                            }
                        continue;
                    }
                    if (!attends[a]) continue;
                    float* out = dq + row * g.d;
                    #pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const long long col = h * 32 + tx * 4;
                        if (vec_dq) {
                            if (col < g.d)
                                fa_red4(out + col, g.scale * aq[a][4 * h], g.scale * aq[a][4 * h + 1],
                                        g.scale * aq[a][4 * h + 2], g.scale * aq[a][4 * h + 3]);
                        } else {
                            #pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (col + e < g.d) atomicAdd(&out[col + e], g.scale * aq[a][4 * h + e]);
                        }
                    }
                }
                if (turn != nullptr) {
                    // every thread's additions come before the next key tile's turn: the
                    // barrier orders them before thread 0's release store, which makes them
                    // visible with it (the PTX memory model's cumulativity, sm_70 and later;
                    // before it each thread fences)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 700
                    __threadfence();
#endif
                    __syncthreads();
                    if (threadIdx.x == 0) fa_turn_store(turn, next_turn);
                }
            }
            qt = next;
        }
        float* dk_rows = t < 0 ? dk + b * g.s * g.d : part + t * g.s * g.d;
        float* dv_rows = t < 0 ? dv + b * g.s * g.dv : part + split_heads * parts * g.s * g.d + t * g.s * g.dv;
        #pragma unroll
        for (int a = 0; a < 4; ++a) {
            const long long j = k0 + ty * 4 + a;
            if (j >= g.s) continue;
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long col = fa_gcol(tx, c);
                if (col < g.d) dk_rows[j * g.d + col] = g.scale * ak[a][c];
                if (col < g.dv) dv_rows[j * g.dv + col] = av[a][c];
            }
        }
    }
}

// The dK, dV rows of the key kernel's split batch matrices (flash_bwd_kv_one_chunk with
// split_heads > 0): element r of matrix full + h is the sum, in order p = 0, 1, …, of its
// `parts` partial values (deterministic: the same additions in the same order every run).
extern "C" __global__ void flash_sum_parts(const float* __restrict__ part, float* __restrict__ dk,
                                           float* __restrict__ dv, long long full, long long heads,
                                           long long parts, long long s, long long d, long long dvn) {
    const long long nk = heads * s * d, nv = heads * s * dvn;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nk + nv;
         e += (long long)gridDim.x * blockDim.x) {
        const bool is_k = e < nk;
        const long long n = is_k ? s * d : s * dvn, u = is_k ? e : e - nk;
        const long long h = u / n, r = u % n;
        const float* src = part + (is_k ? 0 : heads * parts * s * d) + h * parts * n + r;
        float sum = src[0];
        for (long long p = 1; p < parts; ++p) sum += src[p * n];
        (is_k ? dk : dv)[(full + h) * n + r] = sum;
    }
}

// VJP, keys and values: one block per 64 keys (blockIdx.x) and chunk z of d / dv
// (blockIdx.z): dK = scale · dSᵀ Q, dV = Pᵀ dO over every query tile that can see these keys.
// Thread rows are keys, scattered columns queries. Dynamic shared memory 5 tiles (the
// launch gives flash_bwd_kv_one_chunk's 6 tiles and 3 × 64 floats). stats as
// flash_forward's mode 1 wrote them. Query rows that attend nothing are read as zeros.
// With one chunk of each head dimension (d, dv ≤ 64) the call goes to flash_bwd_kv_one_chunk,
// which with fuse_dq also computes dQ's terms scale · dS K for each query tile, saving the
// query kernel's recomputation of S and dP:
// - fuse_dq 1: added into dq (zeroed by the caller) atomically, in an order that varies
//   from run to run; rows that attend nothing receive nothing;
// - fuse_dq 2 or 3: deterministic. Block x runs key tiles [x·group, (x + 1)·group) one
//   after the other (group 1: one tile, the grid as without slots) and leaves the sum of
//   their terms, in that order, in slot x of dq ([slots][BH·L·d], slot_stride = BH·L·d);
//   the caller adds the slots in order (flash_sum_batches). 2: one key tile per slot
//   (group 1) that visits every query row of the matrix (no causal cut, no mask tile
//   skipped), so it stores; 3: the caller zeroed the slots and every tile adds. A row that
//   attends nothing gets zeros.
// - fuse_dq 4: deterministic, ordered. Added into dq (zeroed by the caller) as with 1, but
//   the key tiles visiting query tile qt add there in a fixed order — descending from the
//   last visitor — each after the one before it (turns[1 + b·nqt + qt] counts the key tiles
//   done there; turns[0] hands out the blocks' tickets; all zeroed by the caller), so every
//   element's additions come in the same order on every run; under a boolean mask a key
//   tile's turn counts the visitors above it by the tile words. Group 1, one chunk.
// `gate`: as flash_forward's (flash_bwd_kv_mma's flag).
template <bool TILES>
__device__ __forceinline__ void flash_bwd_kv_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, Flash g,
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate, long long split_heads,
    long long parts, float* __restrict__ part, long long group, long long slot_stride,
    int* __restrict__ turns) {
    // the tensor-core kernel (flash_bwd_kv_mma) took the call unless its flag says not
    if (gate != nullptr && gate[0] == 0) return;
    if (g.d <= FA_C && g.dv <= FA_C) {
        flash_bwd_kv_one_chunk<TILES>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq,
                                      split_heads, parts, part, group, slot_stride, turns);
        return;
    }
    extern __shared__ __align__(16) float smem[];
    float* ks = smem;                // k rows, chunk of d
    float* vs = smem + FA_TILE;      // v rows, chunk of dv
    float* qs = smem + 2 * FA_TILE;  // q rows, chunk of d (chunk z for dK)
    float* os = smem + 3 * FA_TILE;  // dO rows, chunk of dv (chunk z for dV)
    float* pt = smem + 4 * FA_TILE;  // Pᵀ, then dSᵀ: [j][i]
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long k0 = (long long)blockIdx.x * FA_T, z0 = (long long)blockIdx.z * FA_C;
    const long long keys = min((long long)FA_T, g.s - k0);
    const long long R = g.bh * g.l, nqt = (g.l + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long qt_begin = skip ? k0 / FA_T : 0;
    const bool single_d = g.d <= FA_C, single_v = g.dv <= FA_C;
    const bool do_dk = z0 < g.d, do_dv = z0 < g.dv;
    const float* att_of = stats + R;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float ak[4][8] = {}, av[4][8] = {};
        __syncthreads();
        if (single_d) fa_load(ks, k, b * g.s + k0, keys, g.d, 0, g.d, nullptr, 0);
        if (single_v) fa_load(vs, v, b * g.s + k0, keys, g.dv, 0, g.dv, nullptr, 0);
        for (long long qt = qt_begin; qt < nqt; ++qt) {
            if (skip_tiles && !fa_tile_any(g, bits, b, qt, blockIdx.x)) continue;
            const long long i0 = qt * FA_T, rows = min((long long)FA_T, g.l - i0);
            float st[4][8] = {}, dp[4][8] = {};
            fa_products(st, ks, k, b * g.s + k0, keys, qs, q, b * g.l + i0, rows, att_of, g.d, tx, ty);
            fa_products(dp, vs, v, b * g.s + k0, keys, os, dout, b * g.l + i0, rows, att_of, g.dv, tx,
                        ty);
            // entry (key k0 + ty·4 + a, query i0 + tx + 8c): st becomes P, dp becomes dS
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long i = i0 + tx + 8 * c, row = b * g.l + i;
                const bool in = i < g.l;
                const float mx = in ? stats[row] : 0.0f, inv = in ? stats[R + row] : 0.0f,
                            D = in ? stats[2 * R + row] : 0.0f;
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long j = k0 + ty * 4 + a;
                    float p, ds;
                    fa_grad_entry(g, bias, b, i, j, fa_bit(g, bits, b, i, j), mx, inv, D, st[a][c],
                                  dp[a][c], p, ds);
                    st[a][c] = p;
                    dp[a][c] = ds;
                }
            }
            if (do_dv) {
                #pragma unroll
                for (int a = 0; a < 4; ++a)
                    #pragma unroll
                    for (int c = 0; c < 8; ++c) pt[(ty * 4 + a) * FA_P + tx + 8 * c] = st[a][c];
                if (!single_v)
                    fa_load(os, dout, b * g.l + i0, rows, g.dv, z0, min((long long)FA_C, g.dv - z0),
                            att_of, b * g.l + i0);
                __syncthreads();
                fa_mul_rows(av, pt, ty * 4, os, tx, fa_round4(rows));
                __syncthreads();
            }
            if (do_dk) {
                #pragma unroll
                for (int a = 0; a < 4; ++a)
                    #pragma unroll
                    for (int c = 0; c < 8; ++c) pt[(ty * 4 + a) * FA_P + tx + 8 * c] = dp[a][c];
                if (!single_d)
                    fa_load(qs, q, b * g.l + i0, rows, g.d, z0, min((long long)FA_C, g.d - z0), att_of,
                            b * g.l + i0);
                __syncthreads();
                fa_mul_rows(ak, pt, ty * 4, qs, tx, fa_round4(rows));
                __syncthreads();
            }
        }
        #pragma unroll
        for (int a = 0; a < 4; ++a) {
            const long long j = k0 + ty * 4 + a;
            if (j >= g.s) continue;
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long col = z0 + fa_gcol(tx, c);
                if (do_dk && col < g.d) dk[(b * g.s + j) * g.d + col] = g.scale * ak[a][c];
                if (do_dv && col < g.dv) dv[(b * g.s + j) * g.dv + col] = av[a][c];
            }
        }
    }
}
// Without tile words (no boolean mask) the tile test is compiled out, so those calls run the
// same code as before tiles existed; with them, the _tiles entry point.
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_bwd_kv(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, Flash g,
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate, long long split_heads,
    long long parts, float* __restrict__ part, long long group, long long slot_stride,
    int* __restrict__ turns) {
    flash_bwd_kv_impl<false>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq, gate,
                              split_heads, parts, part, group, slot_stride, turns);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_bwd_kv_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, Flash g,
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate, long long split_heads,
    long long parts, float* __restrict__ part, long long group, long long slot_stride,
    int* __restrict__ turns) {
    flash_bwd_kv_impl<true>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq, gate,
                              split_heads, parts, part, group, slot_stride, turns);
}


// The statistics of a thread's four query rows i, i + 1, i + 2, i + 3 of batch matrix b
// (log-sum-exp, whether the row attends, D = dO·O; zeros past the matrix).
__device__ __forceinline__ void fa_row_stats(const float* __restrict__ stats, const Flash& g,
                                             long long b, long long i, float mx[4], float inv[4],
                                             float D[4]) {
    const long long R = g.bh * g.l;
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        const long long row = b * g.l + i + r;
        const bool in = i + r < g.l;
        mx[r] = in ? stats[row] : 0.0f;
        inv[r] = in ? stats[R + row] : 0.0f;
        D[r] = in ? stats[2 * R + row] : 0.0f;
    }
}

// dQ of a thread's four query rows i.. of batch matrix b in the grouped columns z0 +
// fa_gcol(tx, c): scale · aq, and exactly 0 for a row that attends nothing (not 0 · its keys).
__device__ __forceinline__ void fa_store_dq(float* __restrict__ dq, const Flash& g, long long b,
                                            long long i, long long z0, int tx, const float inv[4],
                                            const float aq[4][8]) {
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
        if (i + r >= g.l) continue;
        #pragma unroll
        for (int c = 0; c < 8; ++c) {
            const long long col = z0 + fa_gcol(tx, c);
            if (col < g.d) dq[(b * g.l + i + r) * g.d + col] = inv[r] != 0.0f ? g.scale * aq[r][c] : 0.0f;
        }
    }
}

// Starts copying the rows [row0, row0 + rows) of x (row length ld <= 64) into a 64 × 64 tile,
// zeros past them and past ld: 16-byte cp.async copies when ld is a multiple of 4, else
// plain loads (fa_load). The caller waits (fa_cp_wait) and then synchronizes.
__device__ __forceinline__ void fa_stage_rows(float* tile, const float* __restrict__ x, long long row0,
                                              long long rows, long long ld) {
    if (ld % 4 == 0) {
        for (int e = threadIdx.x; e < FA_T * (FA_C / 4); e += blockDim.x) {
            const int r = e / (FA_C / 4), c = (e % (FA_C / 4)) * 4;
            const bool f = r < rows && c < ld;
            fa_cp16(&tile[r * FA_P + c], f ? &x[(row0 + r) * ld + c] : x, f);
        }
    } else {
        fa_load(tile, x, row0, rows, ld, 0, ld, nullptr, 0);
    }
}

// dQ with one chunk of each head dimension (d, dv <= 64) and no bias gradient: the
// deterministic VJP's query kernel (forty-first session). The query tile's q and dO rows are
// loaded once per batch matrix; per visited key tile, K and V arrive by cp.async — the next
// tile's V while this tile's dS and dS·K are computed, its K after this tile's last use —
// with four barriers per tile where the general path (below) has five and two synchronous
// loads. The products are the general path's (fa_dot_rows over d and dv, fa_mul_rows over
// the tile's keys) on the same tiles in the same order, so dQ has the same bits; a tile that
// no mask, bias or causal limit reaches takes fa_grad_entry's values without its tests (as
// the key kernel's). Dynamic shared memory: 5 tiles (qs, os, ks, vs, dS). (A second K
// buffer, the next K copied in while this tile's products run, was 2 % slower on an H100:
// six tiles of shared memory.)
template <bool TILES>
__device__ __forceinline__ void flash_bwd_q_one_chunk(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dq, const Flash& g) {
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;                // q rows of the query tile
    float* os = smem + FA_TILE;      // dO rows of the query tile
    float* ks = smem + 2 * FA_TILE;  // k rows of the key tile
    float* vs = smem + 3 * FA_TILE;  // v rows of the key tile
    float* dsb = smem + 4 * FA_TILE; // dS [i][j]
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long i0 = (long long)blockIdx.x * FA_T;
    const long long rows = min((long long)FA_T, g.l - i0);
    const long long nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (i0 + rows - 1) / FA_T + 1) : nkt;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        // the key tiles the general path visits, in its order
        auto visit = [&](long long kt) {
            while (kt < kt_end && skip_tiles && !fa_tile_any(g, bits, b, blockIdx.x, kt)) ++kt;
            return kt;
        };
        float aq[4][8] = {}, mx[4], inv[4], D[4];
        fa_row_stats(stats, g, b, i0 + ty * 4, mx, inv, D);
        // the previous batch matrix's last tile is no longer read
        __syncthreads();
        fa_load(qs, q, b * g.l + i0, rows, g.d, 0, g.d, nullptr, 0);
        fa_load(os, dout, b * g.l + i0, rows, g.dv, 0, g.dv, nullptr, 0);
        long long kt = visit(0);
        if (kt < kt_end) {
            const long long keys = min((long long)FA_T, g.s - kt * FA_T);
            fa_stage_rows(ks, k, b * g.s + kt * FA_T, keys, g.d);
            fa_stage_rows(vs, v, b * g.s + kt * FA_T, keys, g.dv);
        }
        while (kt < kt_end) {
            const long long k0 = kt * FA_T, keys = min((long long)FA_T, g.s - k0);
            fa_cp_wait();
            // K and V (and, on the first tile, q and dO) visible to the block
            __syncthreads();
            float st[4][8] = {}, dp[4][8] = {};
            fa_dot_rows(st, qs, ty * 4, ks, tx, fa_round4(g.d));
            fa_dot_rows(dp, os, ty * 4, vs, tx, fa_round4(g.dv));
            const long long next = visit(kt + 1);
            const long long next_keys = min((long long)FA_T, g.s - next * FA_T);
            // every thread is done with this tile's V: the next one's may come in
            __syncthreads();
            if (next < kt_end) fa_stage_rows(vs, v, b * g.s + next * FA_T, next_keys, g.dv);
            const bool plain = g.mask == 0 && i0 + FA_T <= g.l && k0 + FA_T <= g.s &&
                               !(g.causal && k0 + FA_T - 1 > i0);
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const long long i = i0 + ty * 4 + r;
                const unsigned w0 = fa_word(g, bits, b, i, k0), w1 = fa_word(g, bits, b, i, k0 + 32);
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    const long long j = k0 + tx + 8 * c;
                    float p, ds;
                    if (plain) {
                        // fa_grad_entry for an existing, allowed entry without a bias
                        const bool part = inv[r] != 0.0f;
                        p = part ? fa_exp2((st[r][c] * g.scale - mx[r]) * FA_LOG2E) * inv[r] : 0.0f;
                        ds = part ? p * (dp[r][c] - D[r]) : 0.0f;
                    } else {
                        const unsigned bit = (c < 4 ? w0 : w1) >> (tx + 8 * (c % 4));
                        fa_grad_entry(g, bias, b, i, j, bit, mx[r], inv[r], D[r], st[r][c],
                                      dp[r][c], p, ds);
                    }
                    dsb[(ty * 4 + r) * FA_P + tx + 8 * c] = ds;
                }
            }
            __syncthreads();
            fa_mul_rows(aq, dsb, ty * 4, ks, tx, fa_round4(keys));
            // every thread is done with this tile's K and dS: the next K may come in
            __syncthreads();
            if (next < kt_end) fa_stage_rows(ks, k, b * g.s + next * FA_T, next_keys, g.d);
            kt = next;
        }
        fa_store_dq(dq, g, b, i0 + ty * 4, 0, tx, inv, aq);
    }
}

template <bool TILES>
__device__ __forceinline__ void flash_bwd_q_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ dbias, Flash g,
    int want_dq, int want_bias) {
    if (want_dq && !want_bias && g.d <= FA_C && g.dv <= FA_C) {
        flash_bwd_q_one_chunk<TILES>(q, k, v, bits, bias, nonfinite, stats, dout, dq, g);
        return;
    }
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;                // q rows, chunk of d
    float* os = smem + FA_TILE;      // dO rows, chunk of dv
    float* ks = smem + 2 * FA_TILE;  // k rows, chunk of d (chunk z for dQ)
    float* vs = smem + 3 * FA_TILE;  // v rows, chunk of dv
    float* dsb = smem + 4 * FA_TILE; // dS [i][j]
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long i0 = (long long)blockIdx.x * FA_T, z0 = (long long)blockIdx.z * FA_C;
    const long long rows = min((long long)FA_T, g.l - i0);
    const long long nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (i0 + rows - 1) / FA_T + 1) : nkt;
    const bool single_d = g.d <= FA_C, single_v = g.dv <= FA_C;
    const bool bias_here = want_bias && blockIdx.z == 0;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float aq[4][8] = {}, mx[4], inv[4], D[4];
        fa_row_stats(stats, g, b, i0 + ty * 4, mx, inv, D);
        __syncthreads();
        if (single_d) fa_load(qs, q, b * g.l + i0, rows, g.d, 0, g.d, nullptr, 0);
        if (single_v) fa_load(os, dout, b * g.l + i0, rows, g.dv, 0, g.dv, nullptr, 0);
        for (long long kt = 0; kt < kt_end; ++kt) {
            if (skip_tiles && !fa_tile_any(g, bits, b, blockIdx.x, kt)) continue;
            const long long k0 = kt * FA_T, keys = min((long long)FA_T, g.s - k0);
            float st[4][8] = {}, dp[4][8] = {};
            fa_products(st, qs, q, b * g.l + i0, rows, ks, k, b * g.s + k0, keys, nullptr, g.d, tx, ty);
            fa_products(dp, os, dout, b * g.l + i0, rows, vs, v, b * g.s + k0, keys, nullptr, g.dv, tx,
                        ty);
            // entry (query i0 + ty·4 + r, key k0 + tx + 8c): dp becomes dS
            #pragma unroll
            for (int r = 0; r < 4; ++r) {
                const long long i = i0 + ty * 4 + r;
                const unsigned w0 = fa_word(g, bits, b, i, k0), w1 = fa_word(g, bits, b, i, k0 + 32);
                #pragma unroll
                for (int c = 0; c < 8; ++c) {
                    const long long j = k0 + tx + 8 * c;
                    const unsigned bit = (c < 4 ? w0 : w1) >> (tx + 8 * (c % 4));
                    float p, ds;
                    fa_grad_entry(g, bias, b, i, j, bit, mx[r], inv[r], D[r], st[r][c], dp[r][c], p,
                                  ds);
                    dp[r][c] = ds;
                    if (bias_here && i < g.l && j < g.s) dbias[(b * g.l + i) * g.s + j] = ds;
                }
            }
            if (!want_dq) continue;
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                #pragma unroll
                for (int c = 0; c < 8; ++c) dsb[(ty * 4 + r) * FA_P + tx + 8 * c] = dp[r][c];
            if (!single_d)
                fa_load(ks, k, b * g.s + k0, keys, g.d, z0, min((long long)FA_C, g.d - z0), nullptr, 0);
            __syncthreads();
            fa_mul_rows(aq, dsb, ty * 4, ks, tx, fa_round4(keys));
            __syncthreads();
        }
        if (!want_dq) continue;
        fa_store_dq(dq, g, b, i0 + ty * 4, z0, tx, inv, aq);
    }
}
// Without tile words (no boolean mask) the tile test is compiled out, so those calls run the
// same code as before tiles existed; with them, the _tiles entry point.
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_bwd_q(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ dbias, Flash g,
    int want_dq, int want_bias) {
    flash_bwd_q_impl<false>(q, k, v, bits, bias, nonfinite, stats, dout, dq, dbias, g, want_dq, want_bias);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_bwd_q_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ dbias, Flash g,
    int want_dq, int want_bias) {
    flash_bwd_q_impl<true>(q, k, v, bits, bias, nonfinite, stats, dout, dq, dbias, g, want_dq, want_bias);
}
