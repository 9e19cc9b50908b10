// ---- native_cuda.flash_attention (src/kernels/attention.rs): what every kernel shares ----
// The kernels live in kernels/attention/, compiled as one program in this order:
// common.cu (geometry, masks and flags, shared tiles, scores), split_tf32.cu (the
// tensor-core building blocks), forward.cu, backward.cu (f32 VJP), backward_mma.cu
// (the tensor-core key/value VJP).
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

// Turns of the deterministic ordered dQ (flash_bwd_kv's fuse_dq 4). fa_turn_wait: one thread
// of the block waits until the turn counter at p reads `turn` (an acquire load on sm_70 and
// later; before it a volatile read and a fence); fa_turn_store: the release of the next turn.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ int fa_turn_load(const int* p) {
#if __CUDA_ARCH__ >= 700
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    const int v = *(const volatile int*)p;
    __threadfence();
    return v;
#endif
}
#endif
__device__ __forceinline__ void fa_turn_wait(const int* p, int turn) {
#if defined(__CUDA_ARCH__)
    // a plain spin: one load in flight per waiting block (each a round trip to L2)
    while (fa_turn_load(p) != turn) {
    }
#else
    fa_emu_turn_wait(p, turn);  // emu/emu.h: blocks run one after another, in ticket order
#endif
}
__device__ __forceinline__ void fa_turn_store(int* p, int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence();
    *(volatile int*)p = v;
#endif
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

// How many key tiles in [lo, hi) visit query tile qt of batch matrix b by the tile words
// (the ordered dQ's turn under a boolean mask): called by every lane of one warp together.
__device__ __forceinline__ int fa_count_visitors(const Flash& g, const unsigned* __restrict__ bits,
                                                 long long b, long long qt, long long lo,
                                                 long long hi) {
    int n = 0;
    for (long long base = lo; base < hi; base += 32) {
        const long long kt = base + (threadIdx.x & 31);
        n += __popc(__ballot_sync(0xffffffffu, kt < hi && fa_tile_any(g, bits, b, qt, kt)));
    }
    return n;
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
// `stats` is given, each row's maximum and 1 / normalizer as below (the VJP's). mode 1 (the
// VJP's first pass; one chunk): stats[row] = the maximum of the row's allowed scores (0 for
// a row that attends nothing or whose every allowed score is -inf), stats[R + row] = 1 / z,
// z = Σ exp(score - maximum) over the allowed scores (+inf when z is 0, NaN when z is; 0 for
// a row that attends nothing: nonzero exactly when the row attends some key),
// stats[2R + row] = dO·O.
