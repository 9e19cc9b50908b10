// native_cuda kernels for spectral_conv1d (the Fourier-neural-operator layer), evaluated as
// the spec writes it (crates/torchlean/src/spec/special.rs): a direct DFT on the first `m`
// frequencies, complex channel mixing, and the normalized inverse of a real FFT whose other
// frequencies are zero. Direct sums cost O(n·m) per signal, the right order for the few
// modes an FNO keeps. Compiled by NVRTC with the other sources.

// The sine and cosine of the angle 2π·((k·t) mod n)/n, computed as the spec computes them
// (spec::twiddle): exact at the multiples of π/2 (sin π = 0: the imaginary parts at DC and
// Nyquist take no part, as in torch.fft.irfft), else the angle and its sine at f64, rounded.
__device__ __forceinline__ void dft_angle(long long k, long long t, long long n, float* s,
                                          float* c) {
    long long r = (k * t) % n;
    if ((4 * r) % n == 0) {
        long long q = 4 * r / n;
        *c = q == 0 ? 1.0f : (q == 2 ? -1.0f : 0.0f);
        *s = q == 1 ? 1.0f : (q == 3 ? -1.0f : 0.0f);
        return;
    }
    double th = 6.283185307179586 * (double)r / (double)n, sd, cd;
    sincos(th, &sd, &cd);
    *s = (float)sd;
    *c = (float)cd;
}

// The inverse real-FFT weight of frequency k over n points, divided by n: 1/n for k = 0 and
// the Nyquist frequency, 2/n otherwise.
__device__ __forceinline__ float irfft_scale(long long k, long long n) {
    return ((k == 0 || (n % 2 == 0 && k == n / 2)) ? 1.0f : 2.0f) / (float)n;
}

// One thread per (row, k < m): outr = Σ_t x[row, t] cos θ, outi = -Σ_t x[row, t] sin θ, each
// times irfft_scale(k) when `scaled` (the cotangent of the inverse transform). When `only` is
// not null, only the rows with only[row] != 0 are written (the cufft capsule's rows that hold
// a non-finite value, see fft_take).
extern "C" __global__ void spectral_dft(const float* __restrict__ x, float* __restrict__ outr,
                                        float* __restrict__ outi, long long rows, long long n,
                                        long long m, int scaled, const float* __restrict__ only) {
    long long total = rows * m;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % m, row = p / m;
        if (only != 0 && only[row] == 0.0f) continue;
        float re = 0.0f, im = 0.0f;
        for (long long t = 0; t < n; ++t) {
            float s, c;
            dft_angle(k, t, n, &s, &c);
            float v = x[row * n + t];
            re += v * c;
            im -= v * s;
        }
        float f = scaled ? irfft_scale(k, n) : 1.0f;
        outr[p] = f * re;
        outi[p] = f * im;
    }
}

// One thread per (row, t < n): out = Σ_{k<m} f_k (yr cos θ − yi sin θ), f_k = irfft_scale(k)
// when `scaled` (the inverse transform), else 1 (the cotangent of the forward DFT). `only` as
// for spectral_dft.
extern "C" __global__ void spectral_idft(const float* __restrict__ yr,
                                         const float* __restrict__ yi, float* __restrict__ out,
                                         long long rows, long long n, long long m, int scaled,
                                         const float* __restrict__ only) {
    long long total = rows * n;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long t = p % n, row = p / n;
        if (only != 0 && only[row] == 0.0f) continue;
        float acc = 0.0f;
        for (long long k = 0; k < m; ++k) {
            float s, c;
            dft_angle(k, t, n, &s, &c);
            float f = scaled ? irfft_scale(k, n) : 1.0f;
            acc += f * (yr[row * m + k] * c - yi[row * m + k] * s);
        }
        out[p] = acc;
    }
}

// Channel mixing, one thread per (b, o, k): Y = Σ_i X[b, i, k] · W[i, o, k] (complex).
extern "C" __global__ void spectral_mix(const float* __restrict__ ar, const float* __restrict__ ai,
                                        const float* __restrict__ wr, const float* __restrict__ wi,
                                        float* __restrict__ yr, float* __restrict__ yi,
                                        long long b, long long ci, long long co, long long m) {
    long long total = b * co * m;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % m, t = p / m;
        long long o = t % co, bb = t / co;
        float re = 0.0f, im = 0.0f;
        for (long long i = 0; i < ci; ++i) {
            float xr = ar[(bb * ci + i) * m + k], xi = ai[(bb * ci + i) * m + k];
            long long w = (i * co + o) * m + k;
            re += xr * wr[w] - xi * wi[w];
            im += xr * wi[w] + xi * wr[w];
        }
        yr[p] = re;
        yi[p] = im;
    }
}

// The mixing's input cotangent, one thread per (b, i, k): gx = Σ_o (gr wr + gi wi,
// gi wr − gr wi).
extern "C" __global__ void spectral_mix_vjp_x(const float* __restrict__ gr,
                                              const float* __restrict__ gi,
                                              const float* __restrict__ wr,
                                              const float* __restrict__ wi,
                                              float* __restrict__ gxr, float* __restrict__ gxi,
                                              long long b, long long ci, long long co,
                                              long long m) {
    long long total = b * ci * m;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % m, t = p / m;
        long long i = t % ci, bb = t / ci;
        float re = 0.0f, im = 0.0f;
        for (long long o = 0; o < co; ++o) {
            long long w = (i * co + o) * m + k;
            float g_r = gr[(bb * co + o) * m + k], g_i = gi[(bb * co + o) * m + k];
            re += g_r * wr[w] + g_i * wi[w];
            im += g_i * wr[w] - g_r * wi[w];
        }
        gxr[p] = re;
        gxi[p] = im;
    }
}

// The weights' cotangent, one thread per (i, o, k): gw = Σ_b (gr ar + gi ai, gi ar − gr ai).
extern "C" __global__ void spectral_mix_vjp_w(const float* __restrict__ gr,
                                              const float* __restrict__ gi,
                                              const float* __restrict__ ar,
                                              const float* __restrict__ ai,
                                              float* __restrict__ gwr, float* __restrict__ gwi,
                                              long long b, long long ci, long long co,
                                              long long m) {
    long long total = ci * co * m;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % m, t = p / m;
        long long o = t % co, i = t / co;
        float re = 0.0f, im = 0.0f;
        for (long long bb = 0; bb < b; ++bb) {
            float x_r = ar[(bb * ci + i) * m + k], x_i = ai[(bb * ci + i) * m + k];
            float g_r = gr[(bb * co + o) * m + k], g_i = gi[(bb * co + o) * m + k];
            re += g_r * x_r + g_i * x_i;
            im += g_i * x_r - g_r * x_i;
        }
        gwr[p] = re;
        gwi[p] = im;
    }
}

// ---- the cufft capsule's glue (kernels/fft.rs): cuFFT computes the transforms, these
// kernels move between its half spectra and the planar first-m frequencies above. A row that
// holds a non-finite value is summed again directly (spectral_dft / spectral_idft with
// `only`): an FFT combines terms in another order, so an infinity can meet another infinity
// (NaN) where the direct sum keeps it, or the other way round, and the spec's IEEE classes
// are those of the direct sums ----

// One thread per row: flags[row] = 1 if a[row, ·] (len values) holds a NaN or an infinity,
// or'ed into the flag already there when `accumulate`.
extern "C" __global__ void rows_nonfinite(const float* __restrict__ a, float* __restrict__ flags,
                                          long long rows, long long len, int accumulate) {
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        float any = accumulate ? flags[row] : 0.0f;
        for (long long t = 0; t < len; ++t) {
            if (!isfinite(a[row * len + t])) any = 1.0f;
        }
        flags[row] = any;
    }
}

// One thread per (row, k < m): frequency k of a cuFFT R2C result z (interleaved re, im;
// n/2 + 1 frequencies per row) of the signals x, times irfft_scale(k) when `scaled`, as
// spectral_dft writes.
extern "C" __global__ void fft_take(const float* __restrict__ z, const float* __restrict__ x,
                                    float* __restrict__ outr,
                                    float* __restrict__ outi, long long rows, long long n,
                                    long long m, int scaled) {
    long long nf = n / 2 + 1, total = rows * m;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % m, row = p / m;
        float f = scaled ? irfft_scale(k, n) : 1.0f;
        float im = z[2 * (row * nf + k) + 1];
        if (n % 2 == 0 && k == n / 2) {
            // the Nyquist frequency's imaginary part is exactly 0 in an FFT, but not in the
            // spec, whose sin(fl(π)) is 1.2e-16 (dft_angle): summed as spectral_dft sums it,
            // so that a later product with an infinity has the spec's class
            im = 0.0f;
            for (long long t = 0; t < n; ++t) {
                float s, c;
                dft_angle(k, t, n, &s, &c);
                im -= x[row * n + t] * s;
            }
        }
        outr[p] = f * z[2 * (row * nf + k)];
        outi[p] = f * im;
    }
}

// One thread per (row, k < n/2 + 1): the half spectrum Z whose cuFFT C2R is spectral_idft's
// Σ_{k<m} f_k (yr cos θ − yi sin θ). C2R counts each frequency other than DC and Nyquist
// twice (c_k = 2), so Z_k = f_k·Y_k / c_k for k < m (1/n when `scaled`, else 1/c_k) and 0
// above. At DC and Nyquist the imaginary part is written 0: the spec's sin θ is 0 there (about
// 1e-16 at Nyquist), and a C2R input that is not Hermitian there is outside cuFFT's contract
// (its result then depends on the algorithm and version; rows with a non-finite value are
// summed directly by spectral_idft, not here).
extern "C" __global__ void fft_put(const float* __restrict__ yr, const float* __restrict__ yi,
                                   float* __restrict__ z, long long rows, long long n,
                                   long long m, int scaled) {
    long long nf = n / 2 + 1, total = rows * nf;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = p % nf, row = p / nf;
        float re = 0.0f, im = 0.0f;
        if (k < m) {
            bool edge = k == 0 || (n % 2 == 0 && k == n / 2);
            float f = scaled ? 1.0f / (float)n : (edge ? 1.0f : 0.5f);
            re = f * yr[row * m + k];
            im = edge ? 0.0f : f * yi[row * m + k];
        }
        z[2 * p] = re;
        z[2 * p + 1] = im;
    }
}
