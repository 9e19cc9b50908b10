// ---- split-TF32 building blocks of the tensor-core kernels (flash_forward_mma in forward.cu,
// flash_bwd_kv_mma in backward_mma.cu) ----
//
// Rounding to TF32 and the split x = big + small, mma.sync m16n8k8, the base-2 exponential
// (which the f32 VJP uses too), and the split tiles in fragment order. The precision argument
// and the fragment layout are written at flash_forward_mma (forward.cu).

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
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
