// native_cuda elementwise kernels, compiled at run time by NVRTC for the device's
// architecture (crates/torchlean-cuda/src/nvrtc.rs). Semantics follow the f64 spec
// (crates/torchlean/src/spec/elementwise.rs) and docs/numerics.md: NaN propagates.
//
// Every kernel is grid-stride over `n` elements, 64-bit indices.

#define MAX_RANK 16

// A cascade sum, as the spec's (crates/torchlean/src/spec/sum.rs): terms added left to right
// from +0 in blocks of 32, then the blocks' sums pairwise (a binary counter over completed
// blocks), so a long sequential sum errs by (31 + log2(n / 32))·u instead of (n − 1)·u. The
// spec's order term for term up to 2^(CASCADE_LEVELS + 5) terms (beyond, the top level
// accumulates left to right). The level loops are unrolled so that every index is a
// constant and the levels stay in registers (a dynamically indexed array would live in
// local memory).
#define CASCADE_LEVELS 20
struct Cascade {
    float block;
    int in_block;
    unsigned done;  // completed blocks; bit i set: levels[i] holds 2^i of them
    float levels[CASCADE_LEVELS];
};

__device__ __forceinline__ void cascade_init(Cascade* c) {
    c->block = 0.0f;
    c->in_block = 0;
    c->done = 0;
}

__device__ __forceinline__ void cascade_push(Cascade* c, float v) {
    c->block = c->block + v;  // from +0, as the spec: a sum of -0s is +0
    if (++c->in_block == 32) {
        float carry = c->block;
        bool live = true;
#pragma unroll
        for (int level = 0; level < CASCADE_LEVELS; ++level) {
            if (live) {
                bool top = level == CASCADE_LEVELS - 1;
                if ((c->done >> level) & 1u) {
                    carry = c->levels[level] + carry;
                    if (top) {
                        c->levels[level] = carry;
                        live = false;
                    }
                } else {
                    c->levels[level] = carry;
                    live = false;
                }
            }
        }
        c->done += 1;
        if (c->done >> (CASCADE_LEVELS - 1)) c->done |= 1u << (CASCADE_LEVELS - 1);
        c->block = 0.0f;
        c->in_block = 0;
    }
}

__device__ __forceinline__ float cascade_total(const Cascade* c) {
    float acc = 0.0f;
    bool any = false;
#pragma unroll
    for (int level = CASCADE_LEVELS - 1; level >= 0; --level) {
        if ((c->done >> level) & 1u) {
            acc = any ? acc + c->levels[level] : c->levels[level];
            any = true;
        }
    }
    if (c->in_block > 0) acc = any ? acc + c->block : c->block;
    return acc;  // +0 for no terms
}

// Broadcast geometry: output shape and each input's strides over it (0 on broadcast axes).
struct Bcast {
    int rank;
    long long shape[MAX_RANK];
    long long a_stride[MAX_RANK];
    long long b_stride[MAX_RANK];
};

// Opcodes shared with src/kernels/elementwise.rs.
#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3
#define OP_MAX 4
#define OP_MIN 5
// compare: 1.0f where the IEEE relation holds, else 0.0f (false with a NaN operand but for
// OP_NE); the same opcodes in `binary_opcode` (elementwise.rs)
#define OP_EQ 6
#define OP_NE 7
#define OP_LT 8
#define OP_LE 9
#define OP_GT 10
#define OP_GE 11

#define U_NEG 0
#define U_EXP 1
#define U_SIN 2
#define U_COS 3
#define U_TANH 4
#define U_SIGMOID 5
#define U_RELU 6
#define U_SCALE 7
#define U_ADD_SCALAR 8
#define U_SQRT 9
#define U_LOG 10
#define U_INV 11
#define U_ABS 12
#define U_GELU 13
#define U_SILU 14
#define U_SOFTPLUS 15
#define U_POW 16
#define U_SAFE_LOG 17
// 19 (18 is fused_unary's U_CLAMP): p is the mode, 0 floor, 1 ceil, 2 half-even, 3 trunc
#define U_ROUND 19
#define U_ERF 20
#define U_TAN 21
#define U_ATAN 22
#define U_ASIN 23
#define U_ACOS 24
#define U_SINH 25
#define U_COSH 26
#define U_ASINH 27
#define U_ACOSH 28
#define U_ATANH 29

// spec maximum(a, b): NaN when either is NaN, the first operand on a tie
__device__ __forceinline__ float nan_max(float a, float b) { return (a < b || b != b) ? b : a; }
__device__ __forceinline__ float nan_min(float a, float b) { return (b < a || b != b) ? b : a; }
// standard normal CDF and density (exact GELU, as the spec)
__device__ __forceinline__ float phi_cdf(float x) { return 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float phi_pdf(float x) { return expf(-0.5f * x * x) * 0.39894228040143268f; }

__device__ __forceinline__ float binary_apply(int op, float x, float y) {
    switch (op) {
        case OP_ADD: return x + y;
        case OP_SUB: return x - y;
        case OP_MUL: return x * y;
        case OP_DIV: return x / y;
        // spec maximum/minimum: NaN when either is NaN; on a tie the first operand
        case OP_MAX: return (x < y || y != y) ? y : x;
        case OP_MIN: return (x > y || y != y) ? y : x;
        case OP_EQ: return x == y ? 1.0f : 0.0f;
        case OP_NE: return x != y ? 1.0f : 0.0f;
        case OP_LT: return x < y ? 1.0f : 0.0f;
        case OP_LE: return x <= y ? 1.0f : 0.0f;
        case OP_GT: return x > y ? 1.0f : 0.0f;
        default: return x >= y ? 1.0f : 0.0f;  // OP_GE
    }
}

// The partial of maximum or minimum for the operand that loses where loser < winner: 0
// there, 1/2 on a tie, 1 otherwise (NaN included), as the spec.
__device__ __forceinline__ float share(float loser, float winner) {
    return loser < winner ? 0.0f : (loser == winner ? 0.5f : 1.0f);
}

// d/da (which = 0) or d/db (which = 1) of the binary map at (a, b), as the spec.
__device__ __forceinline__ float binary_partial(int op, int which, float a, float b) {
    switch (op) {
        case OP_ADD: return 1.0f;
        case OP_SUB: return which == 0 ? 1.0f : -1.0f;
        case OP_MUL: return which == 0 ? b : a;
        case OP_DIV: return which == 0 ? 1.0f / b : -a / (b * b);
        // each input loses its cotangent where the other strictly wins, the two share it on
        // a tie, NaN keeps both (PyTorch's rule)
        case OP_MAX: return which == 0 ? share(a, b) : share(b, a);
        default: return which == 0 ? share(b, a) : share(a, b);  // OP_MIN
    }
}

// The cotangent of operand `which` for the output cotangent g: g times its partial, except
// maximum's and minimum's losing operand, which gets exactly 0 (PyTorch's masked_fill: an
// infinite or NaN g does not make it NaN), as the spec's binary_grads.
__device__ __forceinline__ float binary_grad_term(int op, int which, float a, float b, float g) {
    if (op == OP_MAX || op == OP_MIN) {
        const float loser = (op == OP_MAX) == (which == 0) ? a : b;
        const float winner = (op == OP_MAX) == (which == 0) ? b : a;
        if (loser < winner) return 0.0f;
    }
    // division: g / b and -g · ((a / b) / b), the spec's (PyTorch's) order: no b²
    if (op == OP_DIV) return which == 0 ? g / b : -g * ((a / b) / b);
    return g * binary_partial(op, which, a, b);
}

// The elements of the two operands of `g` (a_stride, b_stride) at output position `pos`.
__device__ __forceinline__ void bcast_index(const Bcast& g, long long pos, long long* ia,
                                            long long* ib) {
    long long prem = pos;
    *ia = 0;
    *ib = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
        long long c = prem % g.shape[d];
        prem /= g.shape[d];
        *ia += c * g.a_stride[d];
        *ib += c * g.b_stride[d];
    }
}

extern "C" __global__ void binary_same(int op, const float* __restrict__ a,
                                       const float* __restrict__ b, float* __restrict__ out,
                                       long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 x = a4[i], y = b4[i], r;
        r.x = binary_apply(op, x.x, y.x);
        r.y = binary_apply(op, x.y, y.y);
        r.z = binary_apply(op, x.z, y.z);
        r.w = binary_apply(op, x.w, y.w);
        o4[i] = r;
    }
    for (long long i = n4 * 4 + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = binary_apply(op, a[i], b[i]);
    }
}

extern "C" __global__ void binary_bcast(int op, const float* __restrict__ a,
                                        const float* __restrict__ b, float* __restrict__ out,
                                        long long n, Bcast g) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long ia, ib;
        bcast_index(g, i, &ia, &ib);
        out[i] = binary_apply(op, a[ia], b[ib]);
    }
}

// The cotangent of one operand of a binary op, reduced to that operand's shape: thread j
// owns element j of the operand and sums, in a fixed order, the output positions that read
// it (deterministic). `red` is the geometry of the output axes this operand broadcasts over
// (rank 0 when none), `own` maps element j to its first output position.
//   which = 0: d/da, which = 1: d/db.
struct Reduce {
    int rank;                     // output rank
    long long own_shape[MAX_RANK];  // the operand's shape padded to the output rank
    long long out_stride[MAX_RANK]; // the output's row-major strides
    long long red_shape[MAX_RANK];  // output extent on axes where the operand has 1, else 1
};

// The output position of operand element j with every broadcast axis at 0.
__device__ __forceinline__ long long reduce_base(const Reduce& r, long long j) {
    long long rem = j, base = 0;
    for (int d = r.rank - 1; d >= 0; --d) {
        long long c = rem % r.own_shape[d];
        rem /= r.own_shape[d];
        base += c * r.out_stride[d];
    }
    return base;
}

// How many output positions read one operand element.
__device__ __forceinline__ long long reduce_count(const Reduce& r) {
    long long count = 1;
    for (int d = 0; d < r.rank; ++d) count *= r.red_shape[d];
    return count;
}

// The t-th (t < reduce_count) output position reading the element whose base is `base`.
__device__ __forceinline__ long long reduce_pos(const Reduce& r, long long base, long long t) {
    long long trem = t, pos = base;
    for (int d = r.rank - 1; d >= 0; --d) {
        long long c = trem % r.red_shape[d];
        trem /= r.red_shape[d];
        pos += c * r.out_stride[d];
    }
    return pos;
}

// binary_grad for operands of the output's shape (nothing to reduce): one term per element.
extern "C" __global__ void binary_grad_same(int op, int which, const float* __restrict__ a,
                                            const float* __restrict__ b,
                                            const float* __restrict__ gy,
                                            float* __restrict__ out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = binary_grad_term(op, which, a[i], b[i], gy[i]);
    }
}

extern "C" __global__ void binary_grad(int op, int which, const float* __restrict__ a,
                                       const float* __restrict__ b,
                                       const float* __restrict__ gy, float* __restrict__ out,
                                       long long n_own, Bcast g, Reduce r) {
    long long count = reduce_count(r);
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n_own;
         j += (long long)gridDim.x * blockDim.x) {
        long long base = reduce_base(r, j);
        Cascade acc;
        cascade_init(&acc);
        for (long long t = 0; t < count; ++t) {
            long long pos = reduce_pos(r, base, t), ia, ib;
            bcast_index(g, pos, &ia, &ib);
            cascade_push(&acc, binary_grad_term(op, which, a[ia], b[ib], gy[pos]));
        }
        out[j] = cascade_total(&acc);
    }
}

// where(c, a, b) with broadcasting: `gca` maps output positions into c (a_stride) and a
// (b_stride), `gb` into b (b_stride). A condition is true when nonzero (NaN included), as the
// spec.
extern "C" __global__ void where_forward(const float* __restrict__ c, const float* __restrict__ a,
                                         const float* __restrict__ b, float* __restrict__ out,
                                         long long n, Bcast gca, Bcast gb) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long ic, ia, unused, ib;
        bcast_index(gca, i, &ic, &ia);
        bcast_index(gb, i, &unused, &ib);
        out[i] = c[ic] != 0.0f ? a[ia] : b[ib];
    }
}

// The cotangent of a (which = 0) or b (which = 1) of where, reduced to that operand's shape
// as `binary_grad` does: thread j sums, in a fixed order, the cotangent at the output
// positions that read element j and where the condition selects this operand. A select, not a
// product: a NaN cotangent at a position that chose the other operand does not reach this one.
// `gc` maps output positions into c (a_stride).
extern "C" __global__ void where_grad(int which, const float* __restrict__ c,
                                      const float* __restrict__ gy, float* __restrict__ out,
                                      long long n_own, Bcast gc, Reduce r) {
    long long count = reduce_count(r);
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n_own;
         j += (long long)gridDim.x * blockDim.x) {
        long long base = reduce_base(r, j);
        Cascade acc;
        cascade_init(&acc);
        for (long long t = 0; t < count; ++t) {
            long long pos = reduce_pos(r, base, t), ic, unused;
            bcast_index(gc, pos, &ic, &unused);
            bool picks_a = c[ic] != 0.0f;
            cascade_push(&acc, picks_a == (which == 0) ? gy[pos] : 0.0f);
        }
        out[j] = cascade_total(&acc);
    }
}

// x^p as PyTorch computes it (spec::pow): exponent 1/2 is the square root, -1/2 its
// reciprocal; IEEE pow otherwise (they differ at -0 and -inf only).
__device__ __forceinline__ float pow_torch(float x, float p) {
    if (p == 0.5f) return sqrtf(x);
    if (p == -0.5f) return 1.0f / sqrtf(x);
    return powf(x, p);
}

__device__ __forceinline__ float unary_apply(int op, float x, float p) {
    switch (op) {
        case U_NEG: return -x;
        case U_EXP: return expf(x);
        case U_SIN: return sinf(x);
        case U_COS: return cosf(x);
        case U_TANH: return tanhf(x);
        case U_SIGMOID: return 1.0f / (1.0f + expf(-x));
        // spec maximum(x, 0): NaN and -0 pass through
        case U_RELU: return x < 0.0f ? 0.0f : x;
        case U_SCALE: return x * p;
        case U_ADD_SCALAR: return x + p;
        case U_SQRT: return sqrtf(x);
        case U_LOG: return logf(x);
        case U_INV: return 1.0f / x;
        case U_GELU: return x * phi_cdf(x);
        case U_SILU: return x / (1.0f + expf(-x));
        // stable: max(x, 0) + log1p(exp(-|x|))
        case U_SOFTPLUS: return nan_max(x, 0.0f) + log1pf(expf(-fabsf(x)));
        case U_POW: return pow_torch(x, p);
        case U_SAFE_LOG: return logf(nan_max(x, p));
        // exact, as the spec: rintf rounds half to even (the default rounding mode)
        case U_ROUND: return p == 0.0f ? floorf(x) : p == 1.0f ? ceilf(x) : p == 2.0f ? rintf(x) : truncf(x);
        case U_ERF: return erff(x);
        case U_TAN: return tanf(x);
        case U_ATAN: return atanf(x);
        case U_ASIN: return asinf(x);
        case U_ACOS: return acosf(x);
        case U_SINH: return sinhf(x);
        case U_COSH: return coshf(x);
        case U_ASINH: return asinhf(x);
        case U_ACOSH: return acoshf(x);
        case U_ATANH: return atanhf(x);
        default: return fabsf(x);  // U_ABS
    }
}

__device__ __forceinline__ float unary_derivative(int op, float x, float y, float p) {
    switch (op) {
        case U_NEG: return -1.0f;
        case U_EXP: return y;
        case U_SIN: return cosf(x);
        case U_COS: return -sinf(x);
        case U_TANH: return 1.0f - y * y;
        case U_SIGMOID: return y * (1.0f - y);
        // zero where x <= 0; NaN passes the cotangent (spec)
        case U_RELU: return x <= 0.0f ? 0.0f : 1.0f;
        case U_SCALE: return p;
        case U_ADD_SCALAR: return 1.0f;
        case U_SQRT: return 0.5f / y;
        case U_LOG: return 1.0f / x;
        case U_INV: return -(y * y);
        case U_GELU: return phi_cdf(x) + x * phi_pdf(x);
        case U_SILU: {
            float s = 1.0f / (1.0f + expf(-x));
            return s * (1.0f + x * (1.0f - s));
        }
        case U_SOFTPLUS: return 1.0f / (1.0f + expf(-x));
        // the spec: p * x^(p-1), and 0 for p = 0
        case U_POW: return p == 0.0f ? 0.0f : p * pow_torch(x, p - 1.0f);
        // the cotangent passes where x > eps (none for NaN), as the spec
        case U_SAFE_LOG: return x > p ? 1.0f / x : 0.0f;
        case U_ROUND: return 0.0f;
        // 2/sqrt(pi) * exp(-x^2), the spec's (PyTorch's) erf derivative
        case U_ERF: return 1.1283791670955126f * expf(-(x * x));
        // the spec's (PyTorch's) forms; atan's g / (x^2 + 1) divides in unary_grad
        case U_TAN: return 1.0f + y * y;
        case U_ATAN: return 1.0f / (x * x + 1.0f);
        case U_ASIN: return 1.0f / sqrtf(1.0f - x * x);
        case U_ACOS: return -(1.0f / sqrtf(1.0f - x * x));
        // PyTorch's; atanh's g / (1 - x^2) divides in unary_grad
        case U_SINH: return coshf(x);
        case U_COSH: return sinhf(x);
        case U_ASINH: return 1.0f / sqrtf(x * x + 1.0f);
        case U_ACOSH: return 1.0f / sqrtf(x * x - 1.0f);
        case U_ATANH: return 1.0f / (1.0f - x * x);
        default: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);  // U_ABS
    }
}

// Four elements per step through 16-byte loads and stores (the buffers start 256-byte
// aligned), then the tail one by one: the same function of each element as a scalar loop.
extern "C" __global__ void unary_forward(int op, float p, const float* __restrict__ x,
                                         float* __restrict__ out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i], r;
        r.x = unary_apply(op, v.x, p);
        r.y = unary_apply(op, v.y, p);
        r.z = unary_apply(op, v.z, p);
        r.w = unary_apply(op, v.w, p);
        o4[i] = r;
    }
    for (long long i = n4 * 4 + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = unary_apply(op, x[i], p);
    }
}

// The launch queue (src/queue.rs): up to its CAPACITY small element-wise calls, each a
// same-shape binary map or a unary map, run in the order they were queued by one block, a
// barrier between calls (a later call may read what an earlier one wrote: the barrier makes
// the block's global writes visible to the block). Entry e is QUEUE_WORDS 32-bit words of
// `table`: kind << 16 | op (kind 0: binary_apply, 1: unary_apply), the unary parameter's
// bits, n, then the addresses of a, b and out, each as low and high word. The same
// per-element functions as binary_same and unary_forward: the same bits.
#define QUEUE_WORDS 10
extern "C" __global__ void queued_maps(const unsigned* __restrict__ table, int count) {
    for (int e = 0; e < count; ++e) {
        const unsigned* w = table + (long long)QUEUE_WORDS * e;
        const int kind = (int)(w[0] >> 16), op = (int)(w[0] & 0xffffu);
        const float p = __uint_as_float(w[1]);
        const long long n = (long long)w[2];
        const float* a = reinterpret_cast<const float*>(((unsigned long long)w[4] << 32) | w[3]);
        const float* b = reinterpret_cast<const float*>(((unsigned long long)w[6] << 32) | w[5]);
        float* out = reinterpret_cast<float*>(((unsigned long long)w[8] << 32) | w[7]);
        for (long long i = threadIdx.x; i < n; i += blockDim.x)
            out[i] = kind == 0 ? binary_apply(op, a[i], b[i]) : unary_apply(op, a[i], p);
        __syncthreads();
    }
}

// Whether the map's VJP selects 0 at x instead of multiplying by a zero derivative (the
// spec's unary_selects_zero): relu where x <= 0, safe_log where x <= eps (and NaN), pow with
// exponent 0, round everywhere; there the cotangent is exactly 0 whatever g is (PyTorch's where / zeros).
__device__ __forceinline__ bool unary_selects_zero(int op, float x, float p) {
    switch (op) {
        case U_RELU: return x <= 0.0f;
        case U_SAFE_LOG: return !(x > p);
        case U_POW: return p == 0.0f;
        case U_ROUND: return true;
        default: return false;
    }
}

// The input's cotangent for the output cotangent g (the spec's unary_grad): log's and
// safe_log's g / x and sqrt's g / (2y) divide, as PyTorch (a product with the reciprocal
// overflows for a tiny x where the gradient does not).
__device__ __forceinline__ float unary_grad(int op, float x, float y, float p, float g) {
    if (unary_selects_zero(op, x, p)) return 0.0f;
    if (op == U_LOG || op == U_SAFE_LOG) return g / x;
    if (op == U_SQRT) return g / (2.0f * y);
    if (op == U_ATAN) return g / (x * x + 1.0f);
    if (op == U_ATANH) return g / (1.0f - x * x);
    return g * unary_derivative(op, x, y, p);
}

extern "C" __global__ void unary_vjp(int op, float p, const float* __restrict__ x,
                                     const float* __restrict__ y, const float* __restrict__ gy,
                                     float* __restrict__ out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    const float4* g4 = reinterpret_cast<const float4*>(gy);
    float4* o4 = reinterpret_cast<float4*>(out);
    // only these derivatives read the output y: the others skip its load (a quarter of
    // the traffic)
    bool reads_y = op == U_EXP || op == U_TANH || op == U_SIGMOID || op == U_SQRT || op == U_INV
                   || op == U_TAN;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 a = x4[i], g = g4[i], r;
        float4 b = reads_y ? y4[i] : a;
        r.x = unary_grad(op, a.x, b.x, p, g.x);
        r.y = unary_grad(op, a.y, b.y, p, g.y);
        r.z = unary_grad(op, a.z, b.z, p, g.z);
        r.w = unary_grad(op, a.w, b.w, p, g.w);
        o4[i] = r;
    }
    for (long long i = n4 * 4 + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += stride) {
        out[i] = unary_grad(op, x[i], y[i], p, gy[i]);
    }
}

// clamp(x, lo, hi) = minimum(maximum(x, lo), hi), NaN passing through (the spec).
extern "C" __global__ void clamp_forward(const float* __restrict__ x, float* __restrict__ out,
                                         long long n, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = nan_min(nan_max(x[i], lo), hi);
    }
}

// Its VJP: gy where lo <= x <= hi, else exactly 0 (a NaN x included; an infinite cotangent
// outside the range gives 0, not NaN: the spec's selection, PyTorch's).
extern "C" __global__ void clamp_vjp(const float* __restrict__ x, const float* __restrict__ gy,
                                     float* __restrict__ out, long long n, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = (x[i] >= lo && x[i] <= hi) ? gy[i] : 0.0f;
    }
}

// fused_unary: a chain of at most FUSED_MAX unary maps per launch (longer chains are applied
// in segments by the host). U_CLAMP (only here) takes p = min and p2 = max.
#define FUSED_MAX 8
#define U_CLAMP 18
struct Chain {
    int len;
    int code[FUSED_MAX];
    float p[FUSED_MAX];
    float p2[FUSED_MAX];
};

__device__ __forceinline__ float chain_apply(const Chain& c, int k, float v) {
    return c.code[k] == U_CLAMP ? nan_min(nan_max(v, c.p[k]), c.p2[k])
                                : unary_apply(c.code[k], v, c.p[k]);
}

// Whether map k selects 0 at its input v (unary_selects_zero; clamp outside [p, p2]).
__device__ __forceinline__ bool chain_selects_zero(const Chain& c, int k, float v) {
    if (c.code[k] == U_CLAMP) return !(v >= c.p[k] && v <= c.p2[k]);
    return unary_selects_zero(c.code[k], v, c.p[k]);
}

__device__ __forceinline__ float chain_derivative(const Chain& c, int k, float v, float y) {
    if (c.code[k] == U_CLAMP) return (v >= c.p[k] && v <= c.p2[k]) ? 1.0f : 0.0f;
    return unary_derivative(c.code[k], v, y, c.p[k]);
}

extern "C" __global__ void fused_forward(const float* __restrict__ x, float* __restrict__ out,
                                         long long n, Chain c) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i];
        for (int k = 0; k < c.len; ++k) v = chain_apply(c, k, v);
        out[i] = v;
    }
}

// One segment of the chain rule (the spec's fused_chain_grad, segment by segment): v_out =
// chain(v_in); d = (first ? 1 : d) times each map's derivative at its input, until a map
// selects 0 (chain_selects_zero): then sel = 1 and d = 0 · d (0, or NaN where a derivative
// before it is not finite), frozen for the rest of the chain. The last segment writes the
// cotangent gx = sel ? d : gy · d instead of v_out, d and sel.
extern "C" __global__ void fused_derivative(const float* __restrict__ v_in,
                                            float* __restrict__ v_out, float* __restrict__ d,
                                            float* __restrict__ sel, long long n, Chain c,
                                            int first, int last, const float* __restrict__ gy,
                                            float* __restrict__ gx) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = v_in[i];
        float dd = first ? 1.0f : d[i];
        bool selected = first ? false : sel[i] != 0.0f;
        for (int k = 0; k < c.len && !selected; ++k) {
            if (chain_selects_zero(c, k, v)) {
                selected = true;
                dd = 0.0f * dd;
                break;
            }
            float y = chain_apply(c, k, v);
            dd *= chain_derivative(c, k, v, y);
            v = y;
        }
        if (last) {
            gx[i] = selected ? dd : gy[i] * dd;
        } else {
            v_out[i] = v;
            d[i] = dd;
            sel[i] = selected ? 1.0f : 0.0f;
        }
    }
}

// reduce_sum / reduce_mean, and the VJP of broadcast_to: out[j] = (the sum over the
// positions of `big` that element j of the smaller shape broadcasts to, in a fixed order)
// divided by `divisor` (1 for a sum; 0/0 = NaN for the mean of nothing, as the spec).
extern "C" __global__ void reduce_to(const float* __restrict__ big, float* __restrict__ out,
                                     long long n_own, Reduce r, float divisor) {
    long long count = reduce_count(r);
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n_own;
         j += (long long)gridDim.x * blockDim.x) {
        long long base = reduce_base(r, j);
        Cascade acc;
        cascade_init(&acc);
        for (long long t = 0; t < count; ++t) cascade_push(&acc, big[reduce_pos(r, base, t)]);
        out[j] = cascade_total(&acc) / divisor;
    }
}

// broadcast_to, and the VJPs of reduce_sum / reduce_mean: out[i] = small[ia] / divisor, ia the
// element of `small` (strides g.a_stride, 0 on broadcast axes) that output position i reads.
extern "C" __global__ void expand(const float* __restrict__ small, float* __restrict__ out,
                                  long long n, Bcast g, float divisor) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long ia, unused;
        bcast_index(g, i, &ia, &unused);
        out[i] = small[ia] / divisor;
    }
}

// argmax along an axis, one thread per (outer, inner) row: the first maximum, NaN above every
// number (the first NaN wins), as the spec; the index as a float.
extern "C" __global__ void argmax_rows(const float* __restrict__ x, float* __restrict__ out,
                                       long long outer, long long dim, long long inner) {
    long long rows = outer * inner;
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows;
         r += (long long)gridDim.x * blockDim.x) {
        long long o = r / inner, i = r % inner;
        const float* xr = x + o * dim * inner + i;
        long long best = 0;
        for (long long j = 1; j < dim; ++j) {
            float v = xr[j * inner], b = xr[best * inner];
            if (v > b || (v != v && b == b)) best = j;
        }
        out[r] = (float)best;
    }
}

// Deterministic sums over many blocks (sum_all, mse_loss), stage 1: block b sums the terms
// of its chunk [b*chunk, min(n, (b+1)*chunk)) — thread t the terms t, t + 256, ... — then a
// fixed tree in shared memory; part[b] = the chunk's sum. Terms: x[i] (mode 0) or
// (x[i] - y[i])^2 (mode 1). Launched with 256 threads per block.
extern "C" __global__ void sum_partial(int mode, const float* __restrict__ x,
                                       const float* __restrict__ y, float* __restrict__ part,
                                       long long n, long long chunk) {
    __shared__ float s[256];
    long long lo = blockIdx.x * chunk;
    long long hi = lo + chunk < n ? lo + chunk : n;
    float acc = 0.0f;
    for (long long i = lo + threadIdx.x; i < hi; i += 256) {
        float t = mode ? (x[i] - y[i]) * (x[i] - y[i]) : x[i];
        acc += t;
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}

// Stage 2: out[0] = (the sum of part[0 .. parts) by the same scheme) / divisor (one block of
// 256 threads; 0/0 = NaN for the mean of nothing, as the spec).
extern "C" __global__ void sum_finish(const float* __restrict__ part, float* __restrict__ out,
                                      long long parts, float divisor) {
    __shared__ float s[256];
    float acc = 0.0f;
    for (long long i = threadIdx.x; i < parts; i += 256) acc += part[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0] / divisor;
}

// out[i] = v[0] for every i (the VJP of sum_all).
extern "C" __global__ void fill_from(const float* __restrict__ v, float* __restrict__ out,
                                     long long n) {
    float s = v[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = s;
    }
}

// out[j] = sum over rows i of g[i * cols + j] (the bias gradient of linear), in a fixed
// order: a block of 32 x 32 threads owns 32 columns; thread (x, y) sums rows y, y + 32, ...
// of column x (reads coalesced across x), then the 32 partial sums of a column are added in
// a fixed tree in shared memory. Launched with grid (ceil(cols / 32)), block (32, 32).
extern "C" __global__ void sum_rows(const float* __restrict__ g, float* __restrict__ out,
                                    long long rows, long long cols) {
    __shared__ float part[32][33];
    long long j = blockIdx.x * 32LL + threadIdx.x;
    float acc = 0.0f;
    if (j < cols) {
        for (long long i = threadIdx.y; i < rows; i += 32) acc += g[i * cols + j];
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    for (int s = 16; s > 0; s >>= 1) {
        if (threadIdx.y < s) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + s][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && j < cols) out[j] = part[0][threadIdx.x];
}

// out[i * cols + j] += bias[j] (linear's bias), in place.
extern "C" __global__ void add_row_bias(float* __restrict__ out, const float* __restrict__ bias,
                                        long long rows, long long cols) {
    long long n = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] += bias[i % cols];
    }
}

// Counter-based SplitMix64 (crates/torchlean/src/spec/random.rs): element i of a draw with
// key `key` (the host passes the seed's stream key, `spec::stream_key`) uses
// splitmix64(key + i), its top 24 bits over 2^24 as the uniform value, so a
// draw is bit-identical to the CPU's. `bernoulli`: 1 where u < keep, else 0.
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
    unsigned long long z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void random_fill(unsigned long long key, int bernoulli, double keep,
                                       float* __restrict__ out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned long long bits = splitmix64(key + (unsigned long long)i);
        double u = (double)(bits >> 40) / 16777216.0;
        out[i] = bernoulli ? (u < keep ? 1.0f : 0.0f) : (float)u;
    }
}

// Optimizer updates (crates/torchlean/src/spec/optim.rs), left to right as the CPU loops.
// `weight` is 1 - decay computed in f64 on the host and rounded once (Op::ema_update).
extern "C" __global__ void ema_update(float decay, float weight, int square,
                                      const float* __restrict__ s,
                                      const float* __restrict__ x, float* __restrict__ out,
                                      long long n) {
    float rest = weight;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float xi = x[i];
        float y = square ? __fmul_rn(__fmul_rn(rest, xi), xi) : __fmul_rn(rest, xi);
        out[i] = __fadd_rn(__fmul_rn(decay, s[i]), y);
    }
}

extern "C" __global__ void adam_update(float step_size, float c2_sqrt, float eps, float shrink,
                                       const float* __restrict__ w,
                                       const float* __restrict__ m,
                                       const float* __restrict__ v, float* __restrict__ out,
                                       long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float denom = __fadd_rn(__fdiv_rn(sqrtf(v[i]), c2_sqrt), eps);
        float stepped = __fdiv_rn(__fmul_rn(step_size, m[i]), denom);
        out[i] = __fsub_rn(__fmul_rn(w[i], shrink), stepped);
    }
}

// adam_step over several parameters in one launch (src/kernels/optim.rs): `table` holds, per
// parameter, the addresses of w, m, v and g (read), of w', m' and v' (written: the read
// addresses themselves for an update in place) and its length, eight 64-bit words;
// blockIdx.y is the parameter. Each element gets exactly the values of Adam's L2 term,
// ema_update, ema_update (square) and adam_update above, rounded step by step in their order
// (spec/optim.rs); one thread reads and writes an element, so writing over the inputs is safe.
extern "C" __global__ void adam_step_many(const unsigned long long* __restrict__ table,
                                          float beta1, float weight1, float beta2,
                                          float weight2, float step_size, float c2_sqrt,
                                          float eps, float shrink, float l2) {
    const unsigned long long* p = table + 8 * blockIdx.y;
    const float* w = (const float*)p[0];
    const float* m = (const float*)p[1];
    const float* v = (const float*)p[2];
    const float* g = (const float*)p[3];
    float* w_out = (float*)p[4];
    float* m_out = (float*)p[5];
    float* v_out = (float*)p[6];
    long long n = (long long)p[7];
    float rest1 = weight1;
    float rest2 = weight2;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float wi = w[i];
        float gi = g[i];
        if (l2 != 0.0f) gi = __fadd_rn(gi, __fmul_rn(wi, l2));
        float m1 = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(rest1, gi));
        float v1 = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(rest2, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(sqrtf(v1), c2_sqrt), eps);
        float stepped = __fdiv_rn(__fmul_rn(step_size, m1), denom);
        w_out[i] = __fsub_rn(__fmul_rn(wi, shrink), stepped);
        m_out[i] = m1;
        v_out[i] = v1;
    }
}
