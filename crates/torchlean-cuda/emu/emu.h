// A CPU emulation of the CUDA features the flash kernels (kernels/attention/*.cu) use, so that
// they run, unchanged, on a machine without a GPU (tests/emulated_flash.rs): one OS thread per
// CUDA thread, a barrier for __syncthreads and per-warp barriers for shuffles and ballots
// (every lane of a warp reaches them together, as the kernels guarantee); blocks run one after
// another, and shared memory is poisoned with NaN before each block so that a read of stale or
// unwritten shared memory shows in the results. It checks the kernels' logic, indexing and
// synchronization, not NVRTC's code generation or the GPU's timing.
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <atomic>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__
#define __align__(x)
struct dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
std::barrier<>* g_block;
std::barrier<>* g_warp[32];
float g_shfl[1024];
unsigned g_bal[1024];
inline void __syncthreads() { g_block->arrive_and_wait(); }
// __syncthreads_or: a barrier that returns whether some thread's predicate was nonzero. Two
// flags used alternately by successive calls (each thread counts its own calls): call k sets
// slot k % 2 before the first barrier and reads it after; between the two barriers thread 0
// clears the other slot, which no thread sets again before passing call k's second barrier.
inline std::atomic<int> g_or_slot[2];
inline thread_local unsigned t_or_calls = 0;
inline int __syncthreads_or(int p) {
    const unsigned k = t_or_calls++;
    if (p) g_or_slot[k % 2] = 1;
    g_block->arrive_and_wait();
    const int any = g_or_slot[k % 2];
    if (threadIdx.x == 0) g_or_slot[(k + 1) % 2] = 0;
    g_block->arrive_and_wait();
    return any;
}
inline float __shfl_xor_sync(unsigned, float x, int o) {
    int t = threadIdx.x, w = t / 32;
    g_shfl[t] = x;
    g_warp[w]->arrive_and_wait();
    float r = g_shfl[(t & ~31) | ((t & 31) ^ o)];
    g_warp[w]->arrive_and_wait();
    return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    int t = threadIdx.x, w = t / 32;
    g_bal[t] = p;
    g_warp[w]->arrive_and_wait();
    unsigned b = 0;
    for (int i = 0; i < 32; ++i) b |= (g_bal[w * 32 + i] ? 1u : 0u) << i;
    g_warp[w]->arrive_and_wait();
    return b;
}
std::mutex g_atomic;
inline float atomicAdd(float* p, float v) {
    std::lock_guard<std::mutex> lock(g_atomic);
    float old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    std::lock_guard<std::mutex> lock(g_atomic);
    unsigned old = *p;
    *p = old + v;
    return old;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// The ordered dQ's wait (kernels/attention/common.cu, fa_turn_wait): blocks run one after
// another here, in the order of their tickets, so every turn a block waits for was taken
// already; one that was not would never come (on the GPU: a hang), so it fails the run.
inline void fa_emu_turn_wait(const int* p, int turn) {
    if (*p != turn) {
        std::fprintf(stderr, "ordered dQ: a block waits for turn %d, the counter reads %d\n", turn, *p);
        std::abort();
    }
}
using std::isfinite;
inline float __int_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { return __int_as_float(x); }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 by its definition, for the warp of the
// calling thread (every lane calls it together, as the instruction requires): D = A·B + C
// with A 16×8, B 8×8, C 16×8 in the PTX fragment layout (lane = 4·gq + tq; A a0 (gq, tq),
// a1 (gq+8, tq), a2 (gq, tq+4), a3 (gq+8, tq+4); B b0 (k tq, n gq), b1 (k tq+4, n gq); C c0
// (gq, 2tq), c1 (gq, 2tq+1), c2 (gq+8, 2tq), c3 (gq+8, 2tq+1)). The operands are TF32 values
// (low 13 bits zero), so each product is exact in f32; the sum runs over k in order.
unsigned g_mma_a[1024][4], g_mma_b[1024][2];
inline void fa_emu_mma(float c[4], const unsigned a[4], const unsigned b[2]) {
    int t = threadIdx.x, w = t / 32, lane = t % 32;
    for (int r = 0; r < 4; ++r) g_mma_a[t][r] = a[r];
    for (int r = 0; r < 2; ++r) g_mma_b[t][r] = b[r];
    g_warp[w]->arrive_and_wait();
    const int gq = lane >> 2, tq = lane & 3;
    for (int e = 0; e < 4; ++e) {
        const int row = gq + 8 * (e >> 1), col = 2 * tq + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 8; ++k) {
            const float x = __uint_as_float(g_mma_a[w * 32 + (row % 8) * 4 + k % 4][row / 8 + 2 * (k / 4)]);
            const float y = __uint_as_float(g_mma_b[w * 32 + col * 4 + k % 4][k / 4]);
            acc += x * y;
        }
        c[e] = acc;
    }
    g_warp[w]->arrive_and_wait();
}
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
alignas(16) float smem[7 * 64 * 144];  // the largest kernel's dynamic shared memory
template <class F> void launch(dim3 grid, unsigned threads, F f) {
    gridDim = grid; blockDim = {threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z) for (unsigned y = 0; y < grid.y; ++y) for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        g_or_slot[0] = 0; g_or_slot[1] = 0;
        for (float& v : smem) v = NAN;  // stale shared memory must never be read
        std::barrier<> bb(threads);
        g_block = &bb;
        std::vector<std::unique_ptr<std::barrier<>>> ws;
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) { ws.emplace_back(new std::barrier<>(32)); g_warp[w] = ws.back().get(); }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t) ts.emplace_back([t, &f] { threadIdx = {t, 0, 0}; f(); });
        for (auto& t : ts) t.join();
    }
}
