// native_cuda kernels for convolution, pooling and the mean squared error. Compiled by NVRTC
// with elementwise.cu and rows.cu. Semantics follow crates/torchlean/src/spec/conv.rs,
// spec/pool.rs and spec/linalg.rs.
//
// Every reduction has a fixed order (one thread, or one block with fixed per-thread strides
// and a fixed tree): the same result on every run, no atomics.

// Geometry of conv2d: input [n, cin, h, w], weight [cout, cin / groups, kh, kw], output
// [n, cout, oh, ow]; stride, padding, dilation per axis.
struct Conv {
    long long n, cin, h, w, cout, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups;
};

// The indices of flat element p of a row-major [*, d1, d2, d3] array (an NCHW tensor, or an
// OIHW weight).
struct Idx4 {
    long long i0, i1, i2, i3;
};
__device__ __forceinline__ Idx4 unflatten4(long long p, long long d1, long long d2,
                                           long long d3) {
    Idx4 r;
    r.i3 = p % d3;
    p /= d3;
    r.i2 = p % d2;
    p /= d2;
    r.i1 = p % d1;
    r.i0 = p / d1;
    return r;
}

// The input value under a tap: padding is a zero that takes part in the product (as the
// spec: an infinite weight on a padded tap gives NaN).
__device__ __forceinline__ float conv_x(const float* __restrict__ x, const Conv& g, long long nn,
                                        long long c, long long ih, long long iw) {
    if (ih < 0 || iw < 0 || ih >= g.h || iw >= g.w) return 0.0f;
    return x[((nn * g.cin + c) * g.h + ih) * g.w + iw];
}

// One thread per output element: the sum over its group's input channels and the kernel
// window, plus the bias.
extern "C" __global__ void conv2d_forward(const float* __restrict__ x,
                                          const float* __restrict__ wt,
                                          const float* __restrict__ bias, int has_bias,
                                          float* __restrict__ y, Conv g) {
    long long total = g.n * g.cout * g.oh * g.ow;
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        Idx4 e = unflatten4(p, g.cout, g.oh, g.ow);
        long long nn = e.i0, co = e.i1, oh_ = e.i2, ow_ = e.i3;
        long long c0 = (co / cout_g) * cin_g;
        float acc = 0.0f;
        for (long long ci = 0; ci < cin_g; ++ci) {
            for (long long a = 0; a < g.kh; ++a) {
                long long ih = oh_ * g.sh - g.ph + a * g.dh;
                for (long long b = 0; b < g.kw; ++b) {
                    long long iw = ow_ * g.sw - g.pw + b * g.dw;
                    acc += conv_x(x, g, nn, c0 + ci, ih, iw) *
                           wt[((co * cin_g + ci) * g.kh + a) * g.kw + b];
                }
            }
        }
        if (has_bias) acc += bias[co];
        y[p] = acc;
    }
}

// One thread per input element: the sum over the outputs whose window reads it (the taps
// that land on it exactly), in the order of output channel, then kernel row and column.
extern "C" __global__ void conv2d_grad_input(const float* __restrict__ gy,
                                             const float* __restrict__ wt,
                                             float* __restrict__ gx, Conv g) {
    long long total = g.n * g.cin * g.h * g.w;
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        Idx4 e = unflatten4(p, g.cin, g.h, g.w);
        long long nn = e.i0, c = e.i1, ih = e.i2, iw = e.i3;
        long long grp = c / cin_g, ci = c % cin_g;
        float acc = 0.0f;
        for (long long co = grp * cout_g; co < (grp + 1) * cout_g; ++co) {
            for (long long a = 0; a < g.kh; ++a) {
                long long th = ih + g.ph - a * g.dh;
                if (th < 0 || th % g.sh != 0) continue;
                long long oh_ = th / g.sh;
                if (oh_ >= g.oh) continue;
                for (long long b = 0; b < g.kw; ++b) {
                    long long tw = iw + g.pw - b * g.dw;
                    if (tw < 0 || tw % g.sw != 0) continue;
                    long long ow_ = tw / g.sw;
                    if (ow_ >= g.ow) continue;
                    acc += gy[((nn * g.cout + co) * g.oh + oh_) * g.ow + ow_] *
                           wt[((co * cin_g + ci) * g.kh + a) * g.kw + b];
                }
            }
        }
        gx[p] = acc;
    }
}

// Sums `terms` values of `term(i)` in one block: thread t takes i = t, t + blockDim, ...,
// then a fixed tree in shared memory. Needs blockDim.x a power of two, at most 256.
#define BLOCK_SUM(result, terms, term_expr)                                  \
    do {                                                                     \
        __shared__ float part_[256];                                         \
        float acc_ = 0.0f;                                                   \
        for (long long i = threadIdx.x; i < (terms); i += blockDim.x) {      \
            acc_ += (term_expr);                                             \
        }                                                                    \
        part_[threadIdx.x] = acc_;                                           \
        __syncthreads();                                                     \
        for (int s_ = blockDim.x / 2; s_ > 0; s_ >>= 1) {                    \
            if (threadIdx.x < s_) part_[threadIdx.x] += part_[threadIdx.x + s_]; \
            __syncthreads();                                                 \
        }                                                                    \
        result = part_[0];                                                   \
        __syncthreads();                                                     \
    } while (0)

// One block per weight element: the sum over batch and output positions of input (zero on
// padding, as the forward) times the output gradient.
extern "C" __global__ void conv2d_grad_weight(const float* __restrict__ x,
                                              const float* __restrict__ gy,
                                              float* __restrict__ gw, Conv g) {
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    long long weights = g.cout * cin_g * g.kh * g.kw;
    long long per = g.oh * g.ow, terms = g.n * per;
    for (long long q = blockIdx.x; q < weights; q += gridDim.x) {
        Idx4 e = unflatten4(q, cin_g, g.kh, g.kw);
        long long co = e.i0, ci = e.i1, a = e.i2, b = e.i3;
        long long c = (co / cout_g) * cin_g + ci;
        float sum;
        BLOCK_SUM(sum, terms,
                  conv_x(x, g, i / per, c, ((i % per) / g.ow) * g.sh - g.ph + a * g.dh,
                         (i % g.ow) * g.sw - g.pw + b * g.dw) *
                      gy[((i / per) * g.cout + co) * per + (i % per)]);
        if (threadIdx.x == 0) gw[q] = sum;
    }
}

// conv_transpose2d over the same geometry: input [n, cin, h, w], weight [cin, cout/groups,
// kh, kw], output [n, cout, oh, ow]. Input (r, s) with kernel tap (p, q) lands on output
// (r·sh + p·dh − ph, s·sw + q·dw − pw); a tap landing outside the output is cropped: it adds
// nothing, and its cotangent reads as zero in the VJP (0·w, x·0: the spec's IEEE products).
__device__ __forceinline__ float convt_gy(const float* __restrict__ gy, const Conv& g,
                                          long long nn, long long co, long long i, long long j) {
    if (i < 0 || j < 0 || i >= g.oh || j >= g.ow) return 0.0f;
    return gy[((nn * g.cout + co) * g.oh + i) * g.ow + j];
}

// One thread per output element: the bias plus the taps that land on it.
extern "C" __global__ void conv_transpose2d_forward(const float* __restrict__ x,
                                                    const float* __restrict__ wt,
                                                    const float* __restrict__ bias,
                                                    int has_bias, float* __restrict__ y,
                                                    Conv g) {
    long long total = g.n * g.cout * g.oh * g.ow;
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        Idx4 e = unflatten4(p, g.cout, g.oh, g.ow);
        long long nn = e.i0, co = e.i1, i = e.i2, j = e.i3;
        long long grp = co / cout_g, oc = co % cout_g;
        float acc = has_bias ? bias[co] : 0.0f;
        for (long long ci = grp * cin_g; ci < (grp + 1) * cin_g; ++ci) {
            for (long long a = 0; a < g.kh; ++a) {
                long long th = i + g.ph - a * g.dh;
                if (th < 0 || th % g.sh != 0) continue;
                long long r = th / g.sh;
                if (r >= g.h) continue;
                for (long long b = 0; b < g.kw; ++b) {
                    long long tw = j + g.pw - b * g.dw;
                    if (tw < 0 || tw % g.sw != 0) continue;
                    long long s = tw / g.sw;
                    if (s >= g.w) continue;
                    acc += x[((nn * g.cin + ci) * g.h + r) * g.w + s] *
                           wt[((ci * cout_g + oc) * g.kh + a) * g.kw + b];
                }
            }
        }
        y[p] = acc;
    }
}

// One thread per input element: the sum over its taps of the cotangent where each lands
// (zero where cropped) times the weight.
extern "C" __global__ void conv_transpose2d_grad_input(const float* __restrict__ gy,
                                                       const float* __restrict__ wt,
                                                       float* __restrict__ gx, Conv g) {
    long long total = g.n * g.cin * g.h * g.w;
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        Idx4 e = unflatten4(p, g.cin, g.h, g.w);
        long long nn = e.i0, ci = e.i1, r = e.i2, s = e.i3;
        long long grp = ci / cin_g;
        float acc = 0.0f;
        for (long long oc = 0; oc < cout_g; ++oc) {
            for (long long a = 0; a < g.kh; ++a) {
                long long i = r * g.sh + a * g.dh - g.ph;
                for (long long b = 0; b < g.kw; ++b) {
                    long long j = s * g.sw + b * g.dw - g.pw;
                    acc += convt_gy(gy, g, nn, grp * cout_g + oc, i, j) *
                           wt[((ci * cout_g + oc) * g.kh + a) * g.kw + b];
                }
            }
        }
        gx[p] = acc;
    }
}

// One block per weight element: the sum over batch and input positions of the input times
// the cotangent where the tap lands (zero where cropped).
extern "C" __global__ void conv_transpose2d_grad_weight(const float* __restrict__ x,
                                                        const float* __restrict__ gy,
                                                        float* __restrict__ gw, Conv g) {
    long long cin_g = g.cin / g.groups, cout_g = g.cout / g.groups;
    long long weights = g.cin * cout_g * g.kh * g.kw;
    long long per = g.h * g.w, terms = g.n * per;
    for (long long q = blockIdx.x; q < weights; q += gridDim.x) {
        Idx4 e = unflatten4(q, cout_g, g.kh, g.kw);
        long long ci = e.i0, oc = e.i1, a = e.i2, b = e.i3;
        long long co = (ci / cin_g) * cout_g + oc;
        float sum;
        BLOCK_SUM(sum, terms,
                  x[((i / per) * g.cin + ci) * per + (i % per)] *
                      convt_gy(gy, g, i / per, co, ((i % per) / g.w) * g.sh + a * g.dh - g.ph,
                               (i % g.w) * g.sw + b * g.dw - g.pw));
        if (threadIdx.x == 0) gw[q] = sum;
    }
}

// One block per output channel: the bias gradient, the sum of its output gradients.
extern "C" __global__ void conv2d_grad_bias(const float* __restrict__ gy,
                                            float* __restrict__ gb, Conv g) {
    long long per = g.oh * g.ow, terms = g.n * per;
    for (long long co = blockIdx.x; co < g.cout; co += gridDim.x) {
        float sum;
        BLOCK_SUM(sum, terms, gy[((i / per) * g.cout + co) * per + (i % per)]);
        if (threadIdx.x == 0) gb[co] = sum;
    }
}

// Geometry of 2-D pooling over [nc, h, w] planes (nc = batch x channels) into [nc, oh, ow].
struct Pool {
    long long nc, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

// The flat index of the first maximum of window (plane, i, j) among its real elements (the
// spec's `first_max`: a later value wins when greater, or NaN over a non-NaN), or -1 when
// the window holds no real element (the shape rule rules that out).
__device__ long long first_max(const float* __restrict__ x, const Pool& g, long long plane,
                               long long i, long long j) {
    long long best = -1;
    for (long long a = 0; a < g.kh; ++a) {
        long long r = i * g.sh + a - g.ph;
        if (r < 0 || r >= g.h) continue;
        for (long long b = 0; b < g.kw; ++b) {
            long long s = j * g.sw + b - g.pw;
            if (s < 0 || s >= g.w) continue;
            long long f = (plane * g.h + r) * g.w + s;
            if (best < 0) {
                best = f;
            } else {
                float v = x[f], m = x[best];
                if (v > m || (v != v && m == m)) best = f;
            }
        }
    }
    return best;
}

// The number of real elements of window (i, j).
__device__ __forceinline__ long long window_count(const Pool& g, long long i, long long j) {
    long long rows = 0, cols = 0;
    for (long long a = 0; a < g.kh; ++a) {
        long long r = i * g.sh + a - g.ph;
        rows += (r >= 0 && r < g.h);
    }
    for (long long b = 0; b < g.kw; ++b) {
        long long s = j * g.sw + b - g.pw;
        cols += (s >= 0 && s < g.w);
    }
    return rows * cols;
}

// The shift of a smooth max from its window maximum: the maximum when finite, else 0 (the
// spec's smooth_shift; NaN stays NaN).
__device__ __forceinline__ float smooth_shift(float m) { return isinf(m) ? 0.0f : m; }

// mode 0: max; mode 1: average over the real elements; mode 2: average over the whole
// window (count_include_pad); mode 3: smooth max (1/beta) ln Σ exp(beta x) over the real
// elements, shifted by the window maximum. One thread per output element.
extern "C" __global__ void pool2d_forward(int mode, float beta, const float* __restrict__ x,
                                          float* __restrict__ y, Pool g) {
    long long total = g.nc * g.oh * g.ow;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long j = p % g.ow, t = p / g.ow;
        long long i = t % g.oh, plane = t / g.oh;
        if (mode == 0) {
            long long f = first_max(x, g, plane, i, j);
            y[p] = f < 0 ? __int_as_float(0x7fc00000) : x[f];
            continue;
        }
        float m = 0.0f;
        if (mode == 3) {
            long long f = first_max(x, g, plane, i, j);
            m = smooth_shift(f < 0 ? __int_as_float(0x7fc00000) : x[f]);
        }
        float acc = 0.0f;
        for (long long a = 0; a < g.kh; ++a) {
            long long r = i * g.sh + a - g.ph;
            if (r < 0 || r >= g.h) continue;
            for (long long b = 0; b < g.kw; ++b) {
                long long s = j * g.sw + b - g.pw;
                if (s < 0 || s >= g.w) continue;
                float v = x[(plane * g.h + r) * g.w + s];
                acc += mode == 3 ? expf(beta * (v - m)) : v;
            }
        }
        if (mode == 3) {
            y[p] = m + logf(acc) / beta;
            continue;
        }
        float d = mode == 2 ? (float)(g.kh * g.kw) : (float)window_count(g, i, j);
        y[p] = acc / d;
    }
}

// One thread per input element: the sum, over the windows that hold it (in output order),
// of the output gradient it receives (max: all of it when it is the window's first maximum;
// average: the gradient over the window's divisor; smooth max: the gradient times
// exp(beta (x - y)), its softmax weight in the window).
extern "C" __global__ void pool2d_vjp(int mode, float beta, const float* __restrict__ x,
                                      const float* __restrict__ y,
                                      const float* __restrict__ gy, float* __restrict__ gx,
                                      Pool g) {
    long long total = g.nc * g.h * g.w;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long s = p % g.w, t = p / g.w;
        long long r = t % g.h, plane = t / g.h;
        // windows i with i*sh - ph <= r <= i*sh - ph + kh - 1
        long long hi_i = (r + g.ph) / g.sh;
        long long lo_num = r + g.ph - g.kh + 1;
        long long lo_i = lo_num <= 0 ? 0 : (lo_num + g.sh - 1) / g.sh;
        long long hi_j = (s + g.pw) / g.sw;
        long long lo_numj = s + g.pw - g.kw + 1;
        long long lo_j = lo_numj <= 0 ? 0 : (lo_numj + g.sw - 1) / g.sw;
        if (hi_i > g.oh - 1) hi_i = g.oh - 1;
        if (hi_j > g.ow - 1) hi_j = g.ow - 1;
        float acc = 0.0f;
        for (long long i = lo_i; i <= hi_i; ++i) {
            for (long long j = lo_j; j <= hi_j; ++j) {
                long long o = (plane * g.oh + i) * g.ow + j;
                if (mode == 0) {
                    if (first_max(x, g, plane, i, j) == p) acc += gy[o];
                } else if (mode == 3) {
                    acc += gy[o] * expf(beta * (x[p] - y[o]));
                } else {
                    float d = mode == 2 ? (float)(g.kh * g.kw) : (float)window_count(g, i, j);
                    acc += gy[o] / d;
                }
            }
        }
        gx[p] = acc;
    }
}

// The mse_loss VJP: ga = 2·gy·(a - b)/n, gb = 2·gy·(b - a)/n (PyTorch's: the same value as
// −ga, +0 where a = b).
extern "C" __global__ void mse_vjp(const float* __restrict__ a, const float* __restrict__ b,
                                   const float* __restrict__ gy, float* __restrict__ ga,
                                   float* __restrict__ gb, long long n) {
    float scale = 2.0f * gy[0] / (float)n;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        ga[i] = scale * (a[i] - b[i]);
        gb[i] = scale * (b[i] - a[i]);
    }
}

// batch_norm over `channel`s of [outer, c, inner] (training-mode statistics, as the spec:
// mean, biased variance, rstd = 1/sqrt(var + eps)); one block per channel, fixed trees.
// A channel of finite values whose statistics overflow f32 takes the spec's rescue
// (spec::norm::rescaled_stats): the same statistics of x * 2^-e, 2^e > max |x|.
#define BLOCK_MAX_ABS(result, terms, term_expr)                              \
    do {                                                                     \
        __shared__ float part_[256];                                         \
        float acc_ = 0.0f;                                                   \
        for (long long i = threadIdx.x; i < (terms); i += blockDim.x) {      \
            float t_ = fabsf(term_expr);                                     \
            acc_ = (acc_ < t_ || t_ != t_) ? t_ : acc_;                      \
        }                                                                    \
        part_[threadIdx.x] = acc_;                                           \
        __syncthreads();                                                     \
        for (int s_ = blockDim.x / 2; s_ > 0; s_ >>= 1) {                    \
            if (threadIdx.x < s_) {                                          \
                float o_ = part_[threadIdx.x + s_];                          \
                float m_ = part_[threadIdx.x];                               \
                part_[threadIdx.x] = (m_ < o_ || o_ != o_) ? o_ : m_;        \
            }                                                                \
            __syncthreads();                                                 \
        }                                                                    \
        result = part_[0];                                                   \
        __syncthreads();                                                     \
    } while (0)

// The channel's (mean, rstd, sc), rescued as above when they overflow: x̂ = (x·sc − mu)·rstd
// (spec::norm::GroupStats), sc = 1 unless rescued, when mu and rstd are the scaled values'.
#define BN_STATS(mu, rstd, sc, n, xat, eps)                                          \
    do {                                                                             \
        float s_bn, v_bn, x0_bn = 0.0f;                                              \
        /* relative to the first value, as the spec's mean: a constant channel's exact */ \
        if ((n) > 0) { long long i = 0; x0_bn = (xat); }                             \
        BLOCK_SUM(s_bn, n, (xat) - x0_bn);                                           \
        mu = x0_bn + s_bn / (float)n;                                                \
        BLOCK_SUM(v_bn, n, ((xat) - mu) * ((xat) - mu));                             \
        rstd = 1.0f / sqrtf(v_bn / (float)n + eps);                                  \
        sc = 1.0f;                                                                   \
        if (!(isfinite(mu) && isfinite(v_bn))) {                                     \
            float b_bn;                                                              \
            BLOCK_MAX_ABS(b_bn, n, xat);                                             \
            if (isfinite(b_bn)) {                                                    \
                float inv = ldexpf(1.0f, -(ilogbf(b_bn) + 1));                       \
                float x0s_bn = x0_bn * inv;                                          \
                BLOCK_SUM(s_bn, n, (xat) * inv - x0s_bn);                            \
                float ms = x0s_bn + s_bn / (float)n;                                 \
                BLOCK_SUM(v_bn, n, ((xat) * inv - ms) * ((xat) * inv - ms));         \
                mu = ms;                                                             \
                rstd = 1.0f / sqrtf(v_bn / (float)n + eps * inv * inv);              \
                sc = inv;                                                            \
            }                                                                        \
        }                                                                            \
    } while (0)
__device__ __forceinline__ long long bn_at(long long i, long long ch, long long c,
                                           long long inner) {
    return ((i / inner) * c + ch) * inner + (i % inner);
}

extern "C" __global__ void batch_norm_forward(const float* __restrict__ x,
                                              const float* __restrict__ gamma,
                                              const float* __restrict__ beta, int has_beta,
                                              float* __restrict__ y, long long outer,
                                              long long c, long long inner, float eps) {
    long long n = outer * inner;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float mu, rstd, sc;
        BN_STATS(mu, rstd, sc, n, x[bn_at(i, ch, c, inner)], eps);
        // no shift adds nothing (−0 stays −0, as the spec)
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            long long f = bn_at(i, ch, c, inner);
            const float scaled = (x[f] * sc - mu) * rstd * gamma[ch];
            y[f] = has_beta ? scaled + beta[ch] : scaled;
        }
    }
}

extern "C" __global__ void batch_norm_vjp(const float* __restrict__ x,
                                          const float* __restrict__ gamma,
                                          const float* __restrict__ gy, float* __restrict__ gx,
                                          float* __restrict__ ggamma, float* __restrict__ gbeta,
                                          long long outer, long long c, long long inner,
                                          float eps) {
    long long n = outer * inner;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float mu, rstd, sc, sgx, sb;
        BN_STATS(mu, rstd, sc, n, x[bn_at(i, ch, c, inner)], eps);
        float gm = gamma[ch];
        BLOCK_SUM(sgx, n, gy[bn_at(i, ch, c, inner)] * ((x[bn_at(i, ch, c, inner)] * sc - mu) * rstd));
        BLOCK_SUM(sb, n, gy[bn_at(i, ch, c, inner)]);
        // the spec's (PyTorch's) order: γ last (g·γ first overflows for a large cotangent)
        float mean_g = sb / (float)n, mean_gx = sgx / (float)n;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            long long f = bn_at(i, ch, c, inner);
            float xhat = (x[f] * sc - mu) * rstd;
            gx[f] = (gy[f] - mean_g - xhat * mean_gx) * (rstd * sc) * gm;
        }
        if (threadIdx.x == 0) {
            ggamma[ch] = sgx;
            gbeta[ch] = sb;
        }
    }
}
