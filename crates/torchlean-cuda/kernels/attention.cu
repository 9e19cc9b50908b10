// ---- native_cuda.flash_attention (kernels/attention.rs) ----
//
// Scaled dot-product attention in the FlashAttention-2 style over dense row-major
// q [BH, L, d], k [BH, S, d], v [BH, S, dv]: no L×S matrix in device memory. Tiles of 64
// query rows × 64 keys in shared memory, row-major (loaded with float4 reads where rows
// allow); 128 threads, thread (tx = t % 8, ty = t / 8) owning rows ty·4 + a (a < 4) and
// either the scattered columns tx + 8b (b < 8) of a score tile (so that the 8 lanes of a row
// group read 8 consecutive rows of the other operand: no bank conflicts) or the grouped
// columns tx·4 + c, 32 + tx·4 + c (c < 4) of an output chunk. The head dimensions are walked
// in chunks of 64 (any d, dv). Semantics are the spec's
// (spec::special, DESIGN §4): a blocked entry (causal j > i, a boolean mask's 0) has weight
// exactly 0 by selection, never through its score; a fully blocked row gives zeros and takes
// no part in any gradient; a row whose allowed scores are all -inf is NaN (0/0); a blocked
// entry of an attending row still multiplies its weight (the spec's 0 / z: 0, or NaN in a
// row whose normalizer is NaN or 0) into v (forward) and into the gradient products (VJP),
// as the spec's sums do, so a non-finite value there gives NaN where the spec's does. Causal
// key tiles, and tiles a boolean mask blocks entirely (flash_tile_any), are skipped only when
// the device flag `nonfinite` says every value those products read is finite (then a skipped
// entry adds exactly 0).

#define FA_T 64   // query rows and keys per tile
#define FA_C 64   // head-dimension chunk
#define FA_P 68   // row stride of a shared tile (float4-aligned, fewer bank conflicts)
#define FA_TILE (FA_T * FA_P)
#define FA_THREADS 128
// NVRTC has no math.h: -inf and a quiet NaN by their bits
#define FA_NEG_INF __int_as_float(0xff800000)
#define FA_POS_INF __int_as_float(0x7f800000)
#define FA_NAN __int_as_float(0x7fffffff)

struct Flash {
    long long bh, l, s, d, dv;
    long long mask_bstride;  // per batch matrix: words of the bit mask / floats of the bias; 0 when shared
    long long words;         // 32-key words per row of the bit mask
    float scale;
    int causal;
    int mask;                // 0 none, 1 boolean (bits), 2 additive bias
    int tiles;               // 1 when the tile flags follow the packed bits (flash_tile_any)
};

// bits[r * words + j / 32] bit j % 32 = (m[r * s + j] != 0): NaN is nonzero, as in the spec.
extern "C" __global__ void flash_pack_mask(const float* __restrict__ m, unsigned* __restrict__ bits,
                                           long long rows, long long s, long long words) {
    long long total = rows * words * 32;
    // total and the stride are multiples of 32: every warp runs the loop uniformly
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long r = t / (words * 32), j = t % (words * 32);
        bool on = j < s && m[r * s + j] != 0.0f;
        unsigned b = __ballot_sync(0xffffffffu, on);
        if ((threadIdx.x & 31) == 0) bits[t / 32] = b;
    }
}

// After the packed bits of `mats` mask matrices (l rows of `words` words each), one word
// per (matrix, query tile, key tile) of FA_T × FA_T entries: nonzero when some entry of the
// tile may attend (a bit set; bits past s are 0). A tile whose word is 0 is blocked for every
// row of its query tile, so the kernels skip it when every value is finite (as causal tiles).
extern "C" __global__ void flash_tile_any(unsigned* __restrict__ bits, long long mats,
                                          long long l, long long s, long long words) {
    const long long nqt = (l + FA_T - 1) / FA_T, nkt = (s + FA_T - 1) / FA_T;
    const long long total = mats * nqt * nkt;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long mat = t / (nqt * nkt), qt = (t / nkt) % nqt, kt = t % nkt;
        const long long i_end = min(l, (qt + 1) * FA_T);
        const long long w0 = kt * (FA_T / 32), w_end = min(words, w0 + FA_T / 32);
        unsigned any = 0u;
        for (long long i = qt * FA_T; i < i_end; ++i)
            for (long long w = w0; w < w_end; ++w) any |= bits[(mat * l + i) * words + w];
        bits[mats * l * words + t] = any != 0u;
    }
}

// flag[0] = 1 when any of the n values of a is not below `limit` in magnitude (left as it is
// otherwise): with limit = +inf, when one is not finite (NaN and ±inf fail the comparison).
extern "C" __global__ void flash_nonfinite(const float* __restrict__ a, long long n,
                                           int* __restrict__ flag, float limit) {
    bool bad = false;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        if (!(fabsf(a[p]) < limit)) bad = true;
    }
    if (bad) flag[0] = 1;
}

// The flags of a call from one pass over each tensor it reads (blockIdx.y: the tensor):
// nonfinite[0] = 1 when a tensor marked `finite` holds a value that is not finite, wide[0] = 1
// when a tensor marked `wide` holds one not below `limit` in magnitude (NaN included). Flags
// are only ever set here (zeroed before the launch).
#define FA_SCAN_MAX 6
struct Scan {
    unsigned long long p[FA_SCAN_MAX];  // device addresses of float tensors
    long long n[FA_SCAN_MAX];
    int finite[FA_SCAN_MAX];
    int wide[FA_SCAN_MAX];
    float limit;
};

extern "C" __global__ void flash_flags(Scan s, int* __restrict__ nonfinite, int* __restrict__ wide) {
    const int t = blockIdx.y;
    const float* a = (const float*)s.p[t];
    const long long n = s.n[t];
    const bool want_finite = s.finite[t] != 0, want_wide = s.wide[t] != 0;
    // |x| < limit for every value (the wide test) implies finiteness when limit is finite, so
    // one comparison against the smaller bound per value, and the exact tests only when a
    // value fails it
    const float bound = want_wide ? s.limit : FA_POS_INF;
    bool bad_finite = false, bad_wide = false;
    auto check = [&](float x) {
        if (!(fabsf(x) < bound)) {
            bad_wide |= want_wide;
            bad_finite |= want_finite && !isfinite(x);
        }
    };
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long head = 0;
    if ((s.p[t] & 15ull) == 0) {
        const float4* a4 = (const float4*)a;
        const long long n4 = n >> 2;
        for (long long i = i0; i < n4; i += step) {
            const float4 x = a4[i];
            check(x.x); check(x.y); check(x.z); check(x.w);
        }
        head = 4 * n4;
    }
    for (long long i = head + i0; i < n; i += step) check(a[i]);
    if (bad_finite) nonfinite[0] = 1;
    if (bad_wide) wide[0] = 1;
}

// out[i, j] = sum over b of full[b, i, j], b in order (a shared additive mask's gradient).
extern "C" __global__ void flash_sum_batches(const float* __restrict__ full, float* __restrict__ out,
                                             long long bh, long long n) {
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (long long b = 0; b < bh; ++b) acc += full[b * n + p];
        out[p] = acc;
    }
}

// tile[r * FA_P + c] = x[(row0 + r) * ld + c0 + c] for r < rows and c < cols, 0 elsewhere in
// the 64 × 64 tile, and 0 for the rows whose `keep` entry is 0 (rows that attend nothing:
// they take no part in a gradient). float4 reads when the rows allow them.
__device__ __forceinline__ void fa_load(float* tile, const float* __restrict__ x, long long row0,
                                        long long rows, long long ld, long long c0, long long cols,
                                        const float* __restrict__ keep, long long keep0) {
    if (ld % 4 == 0 && cols % 4 == 0) {
        for (int e = threadIdx.x; e < FA_T * (FA_C / 4); e += blockDim.x) {
            const int r = e / (FA_C / 4), c = (e % (FA_C / 4)) * 4;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows && c < cols && (keep == nullptr || keep[keep0 + r] != 0.0f))
                val = *reinterpret_cast<const float4*>(&x[(row0 + r) * ld + c0 + c]);
            *reinterpret_cast<float4*>(&tile[r * FA_P + c]) = val;
        }
    } else {
        for (int e = threadIdx.x; e < FA_T * FA_C; e += blockDim.x) {
            const int r = e / FA_C, c = e % FA_C;
            float val = 0.0f;
            if (r < rows && c < cols && (keep == nullptr || keep[keep0 + r] != 0.0f))
                val = x[(row0 + r) * ld + c0 + c];
            tile[r * FA_P + c] = val;
        }
    }
}

// acc[a][b] += sum over c < n of A[ra + a][c] · B[tx + 8b][c] (two row-major tiles; n a
// multiple of 4 — the tiles are zero beyond their columns).
__device__ __forceinline__ void fa_dot_rows(float acc[4][8], const float* A, int ra, const float* B,
                                            int tx, int n) {
    for (int c = 0; c < n; c += 4) {
        float4 x[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) x[a] = *reinterpret_cast<const float4*>(&A[(ra + a) * FA_P + c]);
#pragma unroll
        for (int b = 0; b < 8; ++b) {
            const float4 y = *reinterpret_cast<const float4*>(&B[(tx + 8 * b) * FA_P + c]);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                float t = acc[a][b];
                t = fmaf(x[a].x, y.x, t);
                t = fmaf(x[a].y, y.y, t);
                t = fmaf(x[a].z, y.z, t);
                acc[a][b] = fmaf(x[a].w, y.w, t);
            }
        }
    }
}

// The column swizzle of the key VJP's Pᵀ and dSᵀ tiles: row r's columns are XORed with 8
// for r % 16 >= 8. A warp's threads store rows ty·4 + a (ty < 4) at columns tx + 8c; with
// stride 68 rows 16 apart share banks, so without it ty and ty + 2 collide (two wavefronts
// per store). Groups of 4 columns stay together (float4 reads).
__device__ __forceinline__ int fa_swizzle(int r) { return ((r >> 3) & 1) * 8; }

// acc[a][c] += sum over j < n of A[ra + a][j] · B[j][col c] with col c the grouped columns
// tx·4 + c, 32 + tx·4 + c - 4 (A row-major over j, B row-major; n a multiple of 4, both
// zero beyond their rows / columns).
// With SW, A is stored swizzled (fa_swizzle): column j of row r at j ^ fa_swizzle(r).
template <bool SW = false>
__device__ __forceinline__ void fa_mul_rows(float acc[4][8], const float* A, int ra, const float* B,
                                            int tx, int n) {
    for (int j = 0; j < n; j += 4) {
        float4 x[4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
            x[a] = *reinterpret_cast<const float4*>(&A[(ra + a) * FA_P + (SW ? j ^ fa_swizzle(ra + a) : j)]);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const float4 y0 = *reinterpret_cast<const float4*>(&B[(j + t) * FA_P + tx * 4]);
            const float4 y1 = *reinterpret_cast<const float4*>(&B[(j + t) * FA_P + 32 + tx * 4]);
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                const float w = t == 0 ? x[a].x : t == 1 ? x[a].y : t == 2 ? x[a].z : x[a].w;
                acc[a][0] = fmaf(w, y0.x, acc[a][0]);
                acc[a][1] = fmaf(w, y0.y, acc[a][1]);
                acc[a][2] = fmaf(w, y0.z, acc[a][2]);
                acc[a][3] = fmaf(w, y0.w, acc[a][3]);
                acc[a][4] = fmaf(w, y1.x, acc[a][4]);
                acc[a][5] = fmaf(w, y1.y, acc[a][5]);
                acc[a][6] = fmaf(w, y1.z, acc[a][6]);
                acc[a][7] = fmaf(w, y1.w, acc[a][7]);
            }
        }
    }
}

// acc[a][c] += sum over j < n of At[j][ra + a] · B[j][col c]: fa_mul_rows with its first
// operand stored transposed (At row-major over j, so one float4 holds the four rows' values
// at j; ra a multiple of 4). The key/value VJP reads the dSᵀ it stored for dK this way for dQ.
// With SW, At is stored swizzled (fa_swizzle).
template <bool SW = false>
__device__ __forceinline__ void fa_mul_cols(float acc[4][8], const float* At, int ra, const float* B,
                                            int tx, int n) {
#pragma unroll 4
    for (int j = 0; j < n; ++j) {
        const float4 x = *reinterpret_cast<const float4*>(&At[j * FA_P + (SW ? ra ^ fa_swizzle(j) : ra)]);
        const float4 y0 = *reinterpret_cast<const float4*>(&B[j * FA_P + tx * 4]);
        const float4 y1 = *reinterpret_cast<const float4*>(&B[j * FA_P + 32 + tx * 4]);
        const float w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            acc[a][0] = fmaf(w[a], y0.x, acc[a][0]);
            acc[a][1] = fmaf(w[a], y0.y, acc[a][1]);
            acc[a][2] = fmaf(w[a], y0.z, acc[a][2]);
            acc[a][3] = fmaf(w[a], y0.w, acc[a][3]);
            acc[a][4] = fmaf(w[a], y1.x, acc[a][4]);
            acc[a][5] = fmaf(w[a], y1.y, acc[a][5]);
            acc[a][6] = fmaf(w[a], y1.z, acc[a][6]);
            acc[a][7] = fmaf(w[a], y1.w, acc[a][7]);
        }
    }
}

// p[0..3] += (x, y, z, w), each element atomically (p 16-byte aligned, in global memory):
// one vector reduction on sm_90 and later (red.global.add.v4.f32: a warp's 32 lanes then
// cover whole 32-byte sectors), four scalar atomics before and in the emulation.
__device__ __forceinline__ void fa_red4(float* p, float x, float y, float z, float w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(x), "f"(y), "f"(z),
                 "f"(w)
                 : "memory");
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
    atomicAdd(p + 2, z);
    atomicAdd(p + 3, w);
#endif
}

// Grouped output column c (< 8) of thread tx.
__device__ __forceinline__ int fa_gcol(int tx, int c) { return c < 4 ? tx * 4 + c : 32 + tx * 4 + c - 4; }

__device__ __forceinline__ int fa_round4(long long n) { return (int)((n + 3) / 4 * 4); }

// acc[a][b] += the products over the head dimension (n columns, in chunks of 64) of rows
// ty·4 + a of A (tile `as`, rows a0.. of a) and rows tx + 8b of B (tile `bs`, rows b0.. of b,
// read as zeros where `bkeep` is 0). A is loaded here only when n spans several chunks: a
// one-chunk A is loaded once by the caller and stays; B is loaded for every chunk.
__device__ __forceinline__ void fa_products(float acc[4][8], float* as, const float* __restrict__ a,
                                            long long a0, long long arows, float* bs,
                                            const float* __restrict__ b, long long b0,
                                            long long brows, const float* __restrict__ bkeep,
                                            long long n, int tx, int ty) {
    for (long long c0 = 0; c0 < n; c0 += FA_C) {
        const long long cn = min((long long)FA_C, n - c0);
        if (n > FA_C) fa_load(as, a, a0, arows, n, c0, cn, nullptr, 0);
        fa_load(bs, b, b0, brows, n, c0, cn, bkeep, b0);
        __syncthreads();
        fa_dot_rows(acc, as, ty * 4, bs, tx, fa_round4(cn));
        __syncthreads();
    }
}

// The mask word of row i holding key j0 (a multiple of 32): every key passes without a
// boolean mask; none for a row or key that does not exist.
__device__ __forceinline__ unsigned fa_word(const Flash& g, const unsigned* __restrict__ bits,
                                            long long b, long long i, long long j0) {
    if (g.mask != 1) return 0xffffffffu;
    if (i >= g.l || j0 >= g.s) return 0u;
    return bits[b * g.mask_bstride + i * g.words + j0 / 32];
}

// The mask bit of row i and key j.
__device__ __forceinline__ unsigned fa_bit(const Flash& g, const unsigned* __restrict__ bits,
                                           long long b, long long i, long long j) {
    if (g.mask != 1) return 1u;
    if (i >= g.l || j >= g.s) return 0u;
    return (bits[b * g.mask_bstride + i * g.words + j / 32] >> (j % 32)) & 1u;
}

// Whether tile (qt, kt) of batch matrix b has an entry the boolean mask lets attend (the
// words flash_tile_any appended to the packed bits); true when there are no tile words.
__device__ __forceinline__ bool fa_tile_any(const Flash& g, const unsigned* __restrict__ bits,
                                            long long b, long long qt, long long kt) {
    if (!g.tiles) return true;
    const long long nqt = (g.l + FA_T - 1) / FA_T, nkt = (g.s + FA_T - 1) / FA_T;
    const long long mats = g.mask_bstride ? g.bh : 1;
    const unsigned* t = bits + mats * g.l * g.words;
    return t[((g.mask_bstride ? b : 0) * nqt + qt) * nkt + kt] != 0u;
}

// The query tile of a block of the query-tile kernels (grid x = the query tiles). Blocks
// start in blockIdx.x order; under causal the last tiles see the most keys, so they are
// taken first and the lightest tiles fill the end of the grid, where SMs would otherwise
// wait on one heavy tile (a permutation of the blocks: each computes what it did before).
__device__ __forceinline__ long long fa_query_tile(const Flash& g) {
    return g.causal ? (long long)gridDim.x - 1 - blockIdx.x : (long long)blockIdx.x;
}

// Whether entry (i, j) exists and is not blocked (mask bit m).
__device__ __forceinline__ bool fa_allowed(const Flash& g, long long i, long long j, unsigned m) {
    return i < g.l && j < g.s && !(g.causal && j > i) && (m & 1u);
}

// The score of an allowed entry from its product: scale · q·k (+ the bias).
__device__ __forceinline__ float fa_score(const Flash& g, const float* __restrict__ bias,
                                          long long b, long long i, long long j, float dot) {
    float v = dot * g.scale;
    if (g.mask == 2) v += bias[b * g.mask_bstride + i * g.s + j];
    return v;
}

// Reductions over W adjacent lanes that share rows: the 8 lanes of a row group (the f32
// kernels' blocks), the 4 of a quad (the mma fragments).
template <int W>
__device__ __forceinline__ float fa_max_over(float x) {
    for (int o = W / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
template <int W>
__device__ __forceinline__ float fa_sum_over(float x) {
    for (int o = W / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Forward. Grid (query tiles, batches (grid-stride), dv chunks); FA_THREADS threads; dynamic
// shared memory 3 tiles. `gate` (mode 0 only): when given, the call runs only if gate[0] is
// nonzero — the tensor-core forward below declined it (a value too large to split). mode 0:
// out = attention (columns of chunk blockIdx.z), and, when
// `stats` is given, each row's log-sum-exp and attends as below (the VJP's). mode 1 (the
// VJP's first pass; one chunk): stats[row] = log-sum-exp of the row's allowed scores (0 for
// a row that attends nothing), stats[R + row] = 1 when the row attends some key (else 0),
// stats[2R + row] = dO·O.
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
    const long long qx = fa_query_tile(g), q0 = qx * FA_T;
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
            if (skip_tiles && !fa_tile_any(g, bits, b, qx, kt)) continue;
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
            // mode 0 with stats (chunk 0): the row's log-sum-exp and attends for the VJP, as
            // mode 1 writes them (mode 1 adds dO·O)
            if (tx == 0 && (mode == 1 || (stats != nullptr && blockIdx.z == 0))) {
                const float mu = m[r] == FA_NEG_INF ? 0.0f : m[r];
                // a row that attends nothing keeps 0: its stats are never read, and the
                // caller's finiteness check over the log-sum-exps then sees only real rows
                stats[row] = attends ? mu + logf(l[r]) : 0.0f;
                stats[R + row] = attends ? 1.0f : 0.0f;
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

#define FA_LIMIT 16777216.0f  // 2^24: every |value| the split-TF32 kernels read is below it

// x rounded to TF32 (round to nearest, ties away from zero), as its bits.
__device__ __forceinline__ unsigned fa_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r & 0xffffe000u;  // the TF32 value as an f32 (its low 13 bits zero)
#else
    // the same rounding on the magnitude's bits (x finite and far below 2^128 here)
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
}

// 2^x by the special-function unit, a result below the normal range flushed to zero (a
// weight below 2^-126 of its row's largest: nothing a float32 sum of them keeps). exp2f
// compiles to the same instruction plus a rescaling for that range.
__device__ __forceinline__ float fa_exp2(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);  // emulation: the library's
#endif
}

// x split into TF32 big and small parts (bits).
__device__ __forceinline__ void fa_split(float x, unsigned& big, unsigned& small) {
    big = fa_tf32(x);
    small = fa_tf32(x - __uint_as_float(big));
}

// c += A·B for one m16n8k8 TF32 fragment triple (f32 accumulation).
__device__ __forceinline__ void fa_mma(float c[4], const unsigned a[4], const unsigned b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // not volatile: the compiler may interleave independent products (their operands and
    // accumulators order them)
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    // below sm_80 the host never launches this kernel; a launch by mistake gives NaN
    c[0] = c[1] = c[2] = c[3] = FA_NAN;
#else
    fa_emu_mma(c, a, b);  // emu/emu.h: the instruction's definition, one warp at a time
#endif
}

// ---- split tiles: f32 tiles stored once as TF32 big and small parts, in fragment order ----
//
// A row-split tile holds rows of a row-major operand whose columns are the mma's inner index:
// word r·FA_MP + 16·g + 4·t + (0, 1, 2, 3) = (big x[r][8g + t], big x[r][8g + t + 4], small
// x[r][8g + t], small x[r][8g + t + 4]), so that an A fragment's row (a0, a2) and a B
// fragment (b0, b1) of a row-major operand whose rows are the n index are one 16-byte read.
// A column-split tile holds the columns of a row-major operand whose rows are the inner
// index: word c·FA_MP + 16·n + 4·t + (0..3) = (big x[8n + 2t][c], big x[8n + 2t + 1][c],
// small x[8n + 2t][c], small x[8n + 2t + 1][c]) — the B fragment of an inner index ordered
// tq ↔ 2tq, tq + 4 ↔ 2tq + 1 (see flash_forward_mma) in one read. FA_MP = 144 words (144 mod 32
// = 16): the eight lanes of a quarter warp, reading rows gq ∈ {0, 1} at offsets 4tq, touch
// 32 distinct banks. Each value is split once per block and tile, not once per warp.
#define FA_MP 144
#define FA_SPLIT_TILE (FA_T * FA_MP)

// The four words (big a, big b, small a, small b) at p.
__device__ __forceinline__ void fa_store_split(unsigned* p, float a, float b) {
    unsigned ab, as, bb, bs;
    fa_split(a, ab, as);
    fa_split(b, bb, bs);
    *reinterpret_cast<uint4*>(p) = make_uint4(ab, bb, as, bs);
}

// Staging: a thread's share of a 64 × 64 tile as eight float4 registers, fetched from global
// memory before the tile is needed (the next key tile's loads are in flight while the
// current tile is computed) and split into shared memory after. Item i < 4 of thread x is
// e = x + FA_THREADS·i, lane l = e % 32.

// Four floats of row `row` from column c (zero beyond `cols` and for a row that does not
// exist): one 16-byte read when the row's start allows it (ld a multiple of 4).
__device__ __forceinline__ float4 fa_fetch4(const float* __restrict__ x, long long row, bool in,
                                            long long ld, long long cols, int c) {
    float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!in) return r;
    const float* p = x + row * ld;
    if (ld % 4 == 0 && c + 4 <= cols) return *reinterpret_cast<const float4*>(p + c);
    if (c < cols) r.x = p[c];
    if (c + 1 < cols) r.y = p[c + 1];
    if (c + 2 < cols) r.z = p[c + 2];
    if (c + 3 < cols) r.w = p[c + 3];
    return r;
}

// For a row-split tile of 32·I rows: item e holds row (l >> 3) + 4(e >> 5), columns
// 8g..8g + 7 of group g = l & 7 (a warp reads four whole rows); rows past `rows`, and rows
// whose `keep` entry is 0 (when given), are zeros.
__device__ __forceinline__ void fa_row_item(int i, int& r, int& grp) {
    const int e = threadIdx.x + FA_THREADS * i, l = e & 31;
    r = (l >> 3) + 4 * (e >> 5);
    grp = l & 7;
}
template <int I>
__device__ __forceinline__ void fa_fetch_rows(float4 (&st)[I][2], const float* __restrict__ x,
                                              long long row0, long long rows, long long ld,
                                              long long cols, const float* __restrict__ keep) {
    #pragma unroll
    for (int i = 0; i < I; ++i) {
        int r, grp;
        fa_row_item(i, r, grp);
        const int c = grp * 8;
        const bool in = r < rows && (keep == nullptr || keep[row0 + r] != 0.0f);
        st[i][0] = fa_fetch4(x, row0 + r, in, ld, cols, c);
        st[i][1] = fa_fetch4(x, row0 + r, in, ld, cols, c + 4);
    }
}
template <int I>
__device__ __forceinline__ void fa_put_rows(unsigned* tile, const float4 (&st)[I][2]) {
    #pragma unroll
    for (int i = 0; i < I; ++i) {
        int r, grp;
        fa_row_item(i, r, grp);
        unsigned* p = tile + r * FA_MP + grp * 16;
        fa_store_split(p, st[i][0].x, st[i][1].x);
        fa_store_split(p + 4, st[i][0].y, st[i][1].y);
        fa_store_split(p + 8, st[i][0].z, st[i][1].z);
        fa_store_split(p + 12, st[i][0].w, st[i][1].w);
    }
}
// The same rows as they are (an f32 tile of stride FA_P).
template <int I>
__device__ __forceinline__ void fa_put_raw(float* tile, const float4 (&st)[I][2]) {
    #pragma unroll
    for (int i = 0; i < I; ++i) {
        int r, grp;
        fa_row_item(i, r, grp);
        float* p = tile + r * FA_P + grp * 8;
        *reinterpret_cast<float4*>(p) = st[i][0];
        *reinterpret_cast<float4*>(p + 4) = st[i][1];
    }
}

// For a column-split tile: item e holds rows 8n + 2t and 8n + 2t + 1, columns c..c + 3, with
// t = l & 3, n = 2(w & 3) + ((l >> 2) & 1), c = 4((l >> 3) + 4(w >> 2)), w = e >> 5 (the eight
// lanes of a quarter warp then store to eight distinct 4-bank sets).
__device__ __forceinline__ void fa_col_item(int i, int& r, int& n, int& t, int& c) {
    const int e = threadIdx.x + FA_THREADS * i, l = e & 31, w = e >> 5;
    t = l & 3;
    n = 2 * (w & 3) + ((l >> 2) & 1);
    c = 4 * ((l >> 3) + 4 * (w >> 2));
    r = n * 8 + 2 * t;
}
__device__ __forceinline__ void fa_fetch_cols(float4 (&st)[4][2], const float* __restrict__ x,
                                              long long row0, long long rows, long long ld,
                                              long long cols) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r, n, t, c;
        fa_col_item(i, r, n, t, c);
        st[i][0] = fa_fetch4(x, row0 + r, r < rows, ld, cols, c);
        st[i][1] = fa_fetch4(x, row0 + r + 1, r + 1 < rows, ld, cols, c);
    }
}
__device__ __forceinline__ void fa_put_cols(unsigned* tile, const float4 (&st)[4][2]) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        int r, n, t, c;
        fa_col_item(i, r, n, t, c);
        unsigned* p = tile + c * FA_MP + n * 16 + 4 * t;
        fa_store_split(p, st[i][0].x, st[i][1].x);
        fa_store_split(p + FA_MP, st[i][0].y, st[i][1].y);
        fa_store_split(p + 2 * FA_MP, st[i][0].z, st[i][1].z);
        fa_store_split(p + 3 * FA_MP, st[i][0].w, st[i][1].w);
    }
}

// The split A fragment (ab, as) of rows `row` and row + 8, columns 8st.. of a row-split tile.
__device__ __forceinline__ void fa_a_fragment(const unsigned* tile, int row, int st, int tq,
                                              unsigned ab[4], unsigned as[4]) {
    const uint4 x = *reinterpret_cast<const uint4*>(tile + row * FA_MP + st * 16 + 4 * tq);
    const uint4 y = *reinterpret_cast<const uint4*>(tile + (row + 8) * FA_MP + st * 16 + 4 * tq);
    ab[0] = x.x; ab[1] = y.x; ab[2] = x.y; ab[3] = y.y;
    as[0] = x.z; as[1] = y.z; as[2] = x.w; as[3] = y.w;
}

// c[n] += A·B[n] for n < count (at most 8, uniform) in split-TF32, B fragment n the 16-byte
// split word group at b + n·step: three products each, the small ones first (as CUTLASS
// orders them), issued pass by pass so that consecutive products are independent.
__device__ __forceinline__ void fa_mma3_split(float (*c)[4], const unsigned ab[4],
                                              const unsigned as[4], const unsigned* b, int step,
                                              int count) {
    uint4 z[8];
    #pragma unroll
    for (int n = 0; n < 8; ++n)
        if (n < count) z[n] = *reinterpret_cast<const uint4*>(b + n * step);
    #pragma unroll
    for (int n = 0; n < 8; ++n)
        if (n < count) {
            const unsigned bb[2] = {z[n].x, z[n].y};
            fa_mma(c[n], as, bb);
        }
    #pragma unroll
    for (int n = 0; n < 8; ++n)
        if (n < count) {
            const unsigned bs[2] = {z[n].z, z[n].w};
            fa_mma(c[n], ab, bs);
        }
    #pragma unroll
    for (int n = 0; n < 8; ++n)
        if (n < count) {
            const unsigned bb[2] = {z[n].x, z[n].y};
            fa_mma(c[n], ab, bb);
        }
}

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

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
    const long long qx = fa_query_tile(g), q0 = qx * FA_T;
    const long long rows = min((long long)FA_T, g.l - q0);
    const long long nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (q0 + rows - 1) / FA_T + 1) : nkt;
    const int dsteps = (int)((g.d + 7) / 8), vsteps = (int)((g.dv + 7) / 8);
    // scores in base-2 units: x = scale · log2(e) · q·k (+ log2(e) · bias), weights 2^(x - m)
    const float sl2 = g.scale * FA_LOG2E;
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
            while (t < kt_end && skip_tiles && !fa_tile_any(g, bits, b, qx, t)) ++t;
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
                            x = ok ? fa_score(g, bias, b, i, k0 + jj + 2 * tq, x) * FA_LOG2E : FA_NEG_INF;
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
                const float alpha = fa_exp2(m[h] - mu);
                float sum = 0.0f;
                #pragma unroll
                for (int n = 0; n < 8; ++n)
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = sc[n][2 * h + e];
                        // with a bias, an allowed score may be -inf too: its weight is 0
                        // and the row still attends (0/0 if every weight is)
                        if (g.mask == 2) x = (okm >> (2 * n + e)) & 1u ? fa_exp2(x - mu) : 0.0f;
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
                // the natural log-sum-exp: ln(2^mu · l) = mu · ln 2 + ln l
                const float mu = m[h] == FA_NEG_INF ? 0.0f : m[h];
                stats[row] = attends ? mu * FA_LN2 + logf(l[h]) : 0.0f;
                stats[R + row] = attends ? 1.0f : 0.0f;
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
// dP = dO_i·v_j, and the row's stats (lse, attends, D = dO_i·O_i): p = exp(score - lse) when
// allowed; a blocked entry's probability is the spec's 0 / z (0, or NaN when the row's
// normalizer z is NaN or 0: its log-sum-exp NaN or -inf); dS = p (dP - D) for every existing
// entry of an attending row (so 0 · a non-finite value is NaN, as in the spec), exactly 0
// for a row that attends nothing.
__device__ __forceinline__ void fa_grad_entry(const Flash& g, const float* __restrict__ bias,
                                              long long b, long long i, long long j, unsigned m,
                                              float lse, float att, float D, float dot, float dp,
                                              float& p, float& ds) {
    const bool part = i < g.l && j < g.s && att != 0.0f;
    const bool ok = part && fa_allowed(g, i, j, m);
    const float blocked = part && !(lse > FA_NEG_INF) ? FA_NAN : 0.0f;
    p = ok ? fa_exp2((fa_score(g, bias, b, i, j, dot) - lse) * FA_LOG2E) : blocked;
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
// of 4, else plain loads) and its three statistics into rs (lse, attends, D; zeros past the
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
    float* __restrict__ dq, int fuse_dq) {
    extern __shared__ __align__(16) float smem[];
    float* ks = smem;                // k rows
    float* vs = smem + FA_TILE;      // v rows
    float* qs = smem + 2 * FA_TILE;  // q rows of the query tile (rows that attend nothing: 0)
    float* os = smem + 3 * FA_TILE;  // dO rows of the query tile (likewise)
    float* pt = smem + 4 * FA_TILE;  // Pᵀ: [j][i], swizzled (fa_swizzle)
    float* dt = smem + 5 * FA_TILE;  // dSᵀ: [j][i], swizzled
    float* rs = smem + 6 * FA_TILE;  // the query tile's stats: lse, attends, D (3 × 64)
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long k0 = (long long)blockIdx.x * FA_T;
    const long long keys = min((long long)FA_T, g.s - k0);
    const long long nqt = (g.l + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long qt_begin = skip ? k0 / FA_T : 0;
    const bool vec_dq = g.d % 4 == 0;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float ak[4][8] = {}, av[4][8] = {};
        __syncthreads();
        fa_load(ks, k, b * g.s + k0, keys, g.d, 0, g.d, nullptr, 0);
        fa_load(vs, v, b * g.s + k0, keys, g.dv, 0, g.dv, nullptr, 0);
        long long qt = fa_next_tile<TILES>(g, bits, skip_tiles, b, qt_begin, nqt, blockIdx.x);
        if (qt < nqt) fa_stage(qs, os, rs, q, dout, stats, g, b, qt * FA_T, min((long long)FA_T, g.l - qt * FA_T));
        while (qt < nqt) {
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
                const float lse = rs[tx + 8 * c], att = rs[FA_T + tx + 8 * c], D = rs[2 * FA_T + tx + 8 * c];
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long j = k0 + ty * 4 + a;
                    float p, ds;
                    if (plain) {
                        // fa_grad_entry for an existing, allowed entry without a bias
                        const bool part = att != 0.0f;
                        p = part ? fa_exp2((st[a][c] * g.scale - lse) * FA_LOG2E) : 0.0f;
                        ds = part ? p * (dp[a][c] - D) : 0.0f;
                    } else {
                        fa_grad_entry(g, bias, b, i, j, fa_bit(g, bits, b, i, j), lse, att, D,
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
            const long long next = fa_next_tile<TILES>(g, bits, skip_tiles, b, qt + 1, nqt, blockIdx.x);
            // every thread is done with this tile's q, dO and stats: stage the next
            __syncthreads();
            if (next < nqt) fa_stage(qs, os, rs, q, dout, stats, g, b, next * FA_T, min((long long)FA_T, g.l - next * FA_T));
            if (fuse_dq) {
                // dQ rows i0 + ty·4 + a, grouped columns: dS K from dSᵀ and the k rows
                float aq[4][8] = {};
                fa_mul_cols<true>(aq, dt, ty * 4, ks, tx, FA_T);
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long i = i0 + ty * 4 + a, row = b * g.l + i;
                    if (i >= g.l || !attends[a]) continue;
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
            }
            qt = next;
        }
        #pragma unroll
        for (int a = 0; a < 4; ++a) {
            const long long j = k0 + ty * 4 + a;
            if (j >= g.s) continue;
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long col = fa_gcol(tx, c);
                if (col < g.d) dk[(b * g.s + j) * g.d + col] = g.scale * ak[a][c];
                if (col < g.dv) dv[(b * g.s + j) * g.dv + col] = av[a][c];
            }
        }
    }
}

// VJP, keys and values: one block per 64 keys (blockIdx.x) and chunk z of d / dv
// (blockIdx.z): dK = scale · dSᵀ Q, dV = Pᵀ dO over every query tile that can see these keys.
// Thread rows are keys, scattered columns queries. Dynamic shared memory 5 tiles (the
// launch gives flash_bwd_kv_one_chunk's 6 tiles and 3 × 64 floats). stats as
// flash_forward's mode 1 wrote them. Query rows that attend nothing are read as zeros.
// With one chunk of each head dimension (d, dv ≤ 64) the call goes to flash_bwd_kv_one_chunk,
// which with fuse_dq also adds dQ += scale · dS K for each query tile into dq (zeroed by the
// caller) atomically: the query kernel's recomputation of S and dP is saved, at the price of
// an order of additions that varies from run to run; rows that attend nothing receive
// nothing. `gate`: as flash_forward's (flash_bwd_kv_mma's flag).
template <bool TILES>
__device__ __forceinline__ void flash_bwd_kv_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, Flash g,
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate) {
    // the tensor-core kernel (flash_bwd_kv_mma) took the call unless its flag says not
    if (gate != nullptr && gate[0] == 0) return;
    if (g.d <= FA_C && g.dv <= FA_C) {
        flash_bwd_kv_one_chunk<TILES>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq);
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
                const float lse = in ? stats[row] : 0.0f, att = in ? stats[R + row] : 0.0f,
                            D = in ? stats[2 * R + row] : 0.0f;
                #pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const long long j = k0 + ty * 4 + a;
                    float p, ds;
                    fa_grad_entry(g, bias, b, i, j, fa_bit(g, bits, b, i, j), lse, att, D, st[a][c],
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
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate) {
    flash_bwd_kv_impl<false>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq, gate);
}
extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_bwd_kv_tiles(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv, Flash g,
    float* __restrict__ dq, int fuse_dq, const int* __restrict__ gate) {
    flash_bwd_kv_impl<true>(q, k, v, bits, bias, nonfinite, stats, dout, dk, dv, g, dq, fuse_dq, gate);
}

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
                            const float p = ok ? fa_exp2(s * sl2 - sh[ii] * FA_LOG2E) : 0.0f;
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
template <bool TILES>
__device__ __forceinline__ void flash_bwd_q_impl(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const unsigned* __restrict__ bits, const float* __restrict__ bias,
    const int* __restrict__ nonfinite, const float* __restrict__ stats,
    const float* __restrict__ dout, float* __restrict__ dq, float* __restrict__ dbias, Flash g,
    int want_dq, int want_bias) {
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;                // q rows, chunk of d
    float* os = smem + FA_TILE;      // dO rows, chunk of dv
    float* ks = smem + 2 * FA_TILE;  // k rows, chunk of d (chunk z for dQ)
    float* vs = smem + 3 * FA_TILE;  // v rows, chunk of dv
    float* dsb = smem + 4 * FA_TILE; // dS [i][j]
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
    const long long qx = fa_query_tile(g), i0 = qx * FA_T, z0 = (long long)blockIdx.z * FA_C;
    const long long rows = min((long long)FA_T, g.l - i0);
    const long long R = g.bh * g.l, nkt = (g.s + FA_T - 1) / FA_T;
    const bool skip = g.causal && nonfinite[0] == 0;
    const bool skip_tiles = TILES && g.tiles && nonfinite[0] == 0;
    const long long kt_end = skip ? min(nkt, (i0 + rows - 1) / FA_T + 1) : nkt;
    const bool single_d = g.d <= FA_C, single_v = g.dv <= FA_C;
    const bool bias_here = want_bias && blockIdx.z == 0;
    for (long long b = blockIdx.y; b < g.bh; b += gridDim.y) {
        float aq[4][8] = {}, lse[4], att[4], D[4];
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const long long i = i0 + ty * 4 + r, row = b * g.l + i;
            const bool in = i < g.l;
            lse[r] = in ? stats[row] : 0.0f;
            att[r] = in ? stats[R + row] : 0.0f;
            D[r] = in ? stats[2 * R + row] : 0.0f;
        }
        __syncthreads();
        if (single_d) fa_load(qs, q, b * g.l + i0, rows, g.d, 0, g.d, nullptr, 0);
        if (single_v) fa_load(os, dout, b * g.l + i0, rows, g.dv, 0, g.dv, nullptr, 0);
        for (long long kt = 0; kt < kt_end; ++kt) {
            if (skip_tiles && !fa_tile_any(g, bits, b, qx, kt)) continue;
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
                    fa_grad_entry(g, bias, b, i, j, bit, lse[r], att[r], D[r], st[r][c], dp[r][c], p,
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
        #pragma unroll
        for (int r = 0; r < 4; ++r) {
            const long long i = i0 + ty * 4 + r;
            if (i >= g.l) continue;
            #pragma unroll
            for (int c = 0; c < 8; ++c) {
                const long long col = z0 + fa_gcol(tx, c);
                // a row that attends nothing passes no gradient (not 0 · its keys)
                if (col < g.d) dq[(b * g.l + i) * g.d + col] = att[r] != 0.0f ? g.scale * aq[r][c] : 0.0f;
            }
        }
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
