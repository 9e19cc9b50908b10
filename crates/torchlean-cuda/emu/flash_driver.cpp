// Runs the flash-attention kernels of kernels/attention/*.cu (joined into one file by
// tests/emulated_flash.rs) under emu.h on the calls in a binary file, with the host logic of
// src/kernels/attention.rs (mask packing and tile words, finiteness flag, forward, stats,
// dK/dV, dQ and the additive mask's gradient), and writes each call's results
// (tests/emulated_flash.rs writes the calls and compares the results with the spec).
//
// Input, per call: i64 bh, l, s, d, dv, mask (0 none, 1 boolean, 2 additive), shared,
// causal, dq_path (where dQ is computed when one chunk of each head dimension allows the
// key kernel to: 0 atomically by it, 1 the query kernel, g >= 2 the key kernel in slots of
// g - 1 key tiles, as kernels/attention_slots.rs plans, ORDERED_DQ the key kernel adding in
// a fixed order of key tiles); f32 scale; f32 q, k, v, mask values (none without a mask), cotangent.
// Output, per call: f32 out, dq, dk, dv, then the mask's gradient (additive masks only).
#include "emu.h"
#include <cstdio>
#include <cstdint>
// NVRTC has no math.h: hide its macros from the kernels' source, so that a kernel using one
// fails here as it would on the GPU (the driver below uses them again)
#pragma push_macro("INFINITY")
#pragma push_macro("NAN")
#pragma push_macro("HUGE_VALF")
#undef INFINITY
#undef NAN
#undef HUGE_VALF
#include ATTENTION_CU
#pragma pop_macro("HUGE_VALF")
#pragma pop_macro("NAN")
#pragma pop_macro("INFINITY")

// dq_path of the ordered dQ (tests/emulated_flash.rs writes the same value)
constexpr long long ORDERED_DQ = 1000;

static std::vector<float> read_f32(FILE* f, long n) {
    std::vector<float> v(n > 0 ? n : 1, 0.0f);
    if (n > 0 && fread(v.data(), 4, n, f) != (size_t)n) { fprintf(stderr, "short input\n"); exit(2); }
    return v;
}

static void write_f32(FILE* f, const std::vector<float>& v, long n) {
    if (n > 0) fwrite(v.data(), 4, n, f);
}

// flash_flags on crafted tensors: which flag each kind of value sets (a finite value of 2^24
// or more sets only `wide`; ±inf and NaN set `nonfinite` where finiteness is asked, `wide`
// where width is), float4 and scalar tails alike; false (and a message) on a wrong flag.
static bool flags_self_check() {
    struct Want { std::vector<float> x; bool fin, wid; int nonfinite, wide; };
    const float big = 3e7f, at_limit = 16777216.0f, below = 16777215.0f;
    std::vector<Want> wants = {
        {{1, 2, 3, 4, 5, big}, true, true, 0, 1},      // tail element too large
        {{big, 1, 2, 3, 4}, true, true, 0, 1},         // float4 element too large
        {{1, 2, at_limit}, false, true, 0, 1},         // exactly 2^24: too large
        {{1, 2, below, -below}, true, true, 0, 0},     // below 2^24: neither
        {{1, INFINITY, 2}, true, false, 1, 0},         // inf, finiteness only
        {{1, 2, 3, 4, NAN}, true, true, 1, 1},         // NaN: both
        {{1, 2, 3, 4, NAN}, false, true, 0, 1},        // NaN, width only
        {{-INFINITY, 1, 2, 3}, false, false, 0, 0},    // nothing asked
    };
    for (size_t i = 0; i < wants.size(); ++i) {
        const Want& w = wants[i];
        Scan sc{};
        sc.limit = FA_LIMIT;
        sc.p[0] = (unsigned long long)w.x.data();
        sc.n[0] = (long long)w.x.size();
        sc.finite[0] = w.fin;
        sc.wide[0] = w.wid;
        int nonfinite = 0, wide = 0;
        launch({1, 1, 1}, 4, [&] { flash_flags(sc, &nonfinite, &wide); });
        if (nonfinite != w.nonfinite || wide != w.wide) {
            fprintf(stderr, "flash_flags self-check %zu: nonfinite %d wide %d, expected %d %d\n", i, nonfinite,
                    wide, w.nonfinite, w.wide);
            return false;
        }
    }
    return true;
}

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: flash_driver IN OUT\n"); return 2; }
    if (!flags_self_check()) return 3;
    FILE* in = fopen(argv[1], "rb");
    FILE* out_f = fopen(argv[2], "wb");
    if (!in || !out_f) { fprintf(stderr, "cannot open files\n"); return 2; }
    long long h[9];
    long call = 0;
    while (fread(h, 8, 9, in) == 9) {
        long long bh = h[0], l = h[1], s = h[2], d = h[3], dv = h[4];
        int mask = (int)h[5];
        bool shared = h[6] != 0, causal = h[7] != 0;
        const long long dq_path = h[8];
        float scale;
        if (fread(&scale, 4, 1, in) != 1) return 2;
        long mrows = shared ? l : bh * l;
        auto q = read_f32(in, bh * l * d), k = read_f32(in, bh * s * d), v = read_f32(in, bh * s * dv);
        auto m = read_f32(in, mask ? mrows * s : 0);
        auto gy = read_f32(in, bh * l * dv);
        long long words = std::max(1LL, (s + 31) / 32);
        long long mats = shared ? 1 : bh;
        long long tile_words = mats * ((l + 63) / 64) * ((s + 63) / 64);
        std::vector<unsigned> bits(std::max<long>(1, mrows * words + tile_words), 0xdeadbeefu);
        Flash g{bh, l, s, d, dv, 0, words, scale, causal, mask, 0};
        if (mask == 1) {
            launch({(unsigned)((mrows * words * 32 + 255) / 256), 1, 1}, 256,
                   [&] { flash_pack_mask(m.data(), bits.data(), mrows, s, words); });
            if (mrows > 0 && tile_words > 0) {
                launch({(unsigned)((tile_words + 255) / 256), 1, 1}, 256,
                       [&] { flash_tile_any(bits.data(), mats, l, s, words); });
                g.tiles = 1;
            }
            if (!shared) g.mask_bstride = l * words;
        }
        if (mask == 2 && !shared) g.mask_bstride = l * s;
        const float* bias = mask == 2 ? m.data() : q.data();
        auto flag_over = [&](const std::vector<float>& x, long n, int* flag, float limit = INFINITY) {
            if (n > 0)
                launch({(unsigned)((n + 255) / 256), 1, 1}, 256, [&] { flash_nonfinite(x.data(), n, flag, limit); });
        };
        // as kernels/attention.rs's `scan_flags`: one pass per tensor (flash_flags), each
        // marked for the finiteness flag, the width flag or both
        struct Entry { const std::vector<float>* x; long long n; bool fin, wid; };
        auto scan = [&](const std::vector<Entry>& es, int* fin_flag, int* wid_flag) {
            std::vector<Entry> list;
            for (const Entry& e : es)
                if (e.n > 0 && (e.fin || e.wid)) list.push_back(e);
            for (size_t at = 0; at < list.size(); at += FA_SCAN_MAX) {
                Scan sc{};
                sc.limit = FA_LIMIT;
                long long longest = 0;
                unsigned count = 0;
                for (size_t i = at; i < list.size() && count < FA_SCAN_MAX; ++i, ++count) {
                    sc.p[count] = (unsigned long long)list[i].x->data();
                    sc.n[count] = list[i].n;
                    sc.finite[count] = list[i].fin;
                    sc.wide[count] = list[i].wid;
                    longest = std::max(longest, list[i].n);
                }
                unsigned blocks = (unsigned)std::min(std::max((longest + 1023) / 1024, 1LL), 1024LL);
                launch({blocks, count, 1}, 256, [&] { flash_flags(sc, fin_flag, wid_flag); });
            }
        };
        unsigned qt = (unsigned)((l + 63) / 64), kt = (unsigned)((s + 63) / 64);
        std::vector<float> y(std::max(1LL, bh * l * dv), NAN);
        // the stats the forward leaves for the VJP (used for every other call; the others
        // recompute them, as a VJP handed another output does)
        std::vector<float> left(std::max(1LL, 3 * bh * l), NAN);
        const bool use_left = (call++ % 2) == 0;
        if (bh * l * dv > 0) {
            int flag = 0;
            // as kernels/attention.rs: with d, dv <= 64 the tensor-core kernel takes the call
            // unless a value is too large to split (then the f32 kernel, gated on that flag)
            const bool mma = d <= 64 && dv <= 64;
            const bool fin = causal || g.tiles;
            int wide = 0;
            scan({{&v, bh * s * dv, fin, mma}, {&q, bh * l * d, false, mma}, {&k, bh * s * d, false, mma}},
                 &flag, &wide);
            if (mma) {
                launch({qt, (unsigned)bh, 1}, FA_THREADS, [&] {
                    (g.tiles ? flash_forward_mma_tiles : flash_forward_mma)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, &wide,
                                  y.data(), left.data(), g);
                });
            }
            launch({qt, (unsigned)bh, (unsigned)((dv + 63) / 64)}, FA_THREADS, [&] {
                (g.tiles ? flash_forward_tiles : flash_forward)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, y.data(), left.data(),
                              nullptr, g, 0, mma ? &wide : nullptr);
            });
        }
        std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dvv(v.size(), 0.0f);
        std::vector<float> dbf(std::max(1LL, bh * l * s), 0.0f);
        if (bh * l * s > 0) {
            std::vector<float> st(3 * bh * l, NAN);
            int flag = 0;
            // with d, dv <= 64 the opt-in tensor-core key kernel (TORCHLEAN_FLASH_MMA=1) takes
            // the call unless a value of q, k, v, O or dO is too large to split: every third
            // call without slots here (kernels/attention.rs never plans slots with it); the
            // others go to the f32 key kernel directly, as by default
            const bool mma_kv = d <= 64 && dv <= 64 && dq_path < 2 && (call % 3) == 0;
            int wide_kv = 0;
            const bool fin = causal || g.tiles;
            scan({{&q, bh * l * d, fin, mma_kv}, {&k, bh * s * d, fin, mma_kv}, {&v, bh * s * dv, fin, mma_kv},
                  {&y, bh * l * dv, fin, mma_kv}, {&gy, bh * l * dv, fin, mma_kv},
                  {&m, mask ? mrows * s : 0, fin, false}},
                 &flag, &wide_kv);
            if (use_left && dv > 0) {
                std::copy(left.begin(), left.begin() + 2 * bh * l, st.begin());
                long long R = bh * l;
                launch({(unsigned)((R * 32 + 255) / 256), 1, 1}, 256,
                       [&] { flash_row_dot(gy.data(), y.data(), st.data(), R, dv); });
            } else {
                launch({qt, (unsigned)bh, 1}, FA_THREADS, [&] {
                    (g.tiles ? flash_forward_tiles : flash_forward)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, y.data(), st.data(),
                                  gy.data(), g, 1, nullptr);
                });
            }
            if (causal || g.tiles) flag_over(st, 2 * bh * l, &flag);

            // as kernels/attention.rs: with one chunk of each head dimension the key kernel
            // computes dQ itself — atomically, or deterministically in slots (groups of
            // dq_path - 1 key tiles; kernels/attention_slots.rs groups past 16 key tiles) —
            // else the query kernel does, as the call's dq_path says
            const bool one_chunk = std::max(d, dv) > 0 && std::max(d, dv) <= 64;
            const bool atomic = one_chunk && dq_path == 0;
            const bool ordered = one_chunk && dq_path == ORDERED_DQ;
            const bool slotted = one_chunk && dq_path >= 2 && dq_path != ORDERED_DQ;
            const bool fuse = atomic || slotted || ordered;
            const long long group = slotted ? dq_path - 1 : 1;
            const long long slots = slotted ? (kt + group - 1) / group : 0;
            // fuse 3: zeroed slots, every key tile adds; fuse 2: the first tile of a slot
            // stores (the slots start as NaN here, so a row it missed would show)
            const int fuse_mode = atomic ? 1 : ordered ? 4 : !slotted ? 0 : (group > 1 || causal || g.tiles) ? 3 : 2;
            std::vector<float> dq_slots(std::max(1LL, slots * bh * l * d), fuse_mode == 3 ? 0.0f : NAN);
            std::fill(dq.begin(), dq.end(), atomic || ordered ? 0.0f : NAN);
            // the ordered dQ's ticket counter and turn counters, zeroed (as attention.rs)
            std::vector<int> turns(ordered ? 1 + bh * qt : 1, 0);
            if (std::max(d, dv) > 0) {
                std::fill(dk.begin(), dk.end(), NAN);
                std::fill(dvv.begin(), dvv.end(), NAN);
                if (mma_kv)
                    launch({kt, (unsigned)bh, 1}, FA_THREADS, [&] {
                        (g.tiles ? flash_bwd_kv_mma_tiles : flash_bwd_kv_mma)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, &wide_kv,
                                     st.data(), gy.data(), dk.data(), dvv.data(), g, dq.data(), fuse ? 1 : 0);
                    });
                // as kernels/attention.rs's `key_split` may choose (for uniform work only; here
                // on half the calls without the tensor-core kernel, whatever the mask, and with
                // more parts than query tiles at times): the last batch matrices' key tiles
                // split along the queries, their dK, dV added by flash_sum_parts
                const bool one = d <= 64 && dv <= 64;
                const long long heads = !mma_kv && one && group == 1 && (call % 8) >= 4 ? std::min(bh, 1LL + call % 3) : 0;
                const long long parts = 2 + call % 3;
                std::vector<float> part(std::max(1LL, heads * parts * s * (d + dv)), NAN);
                const unsigned rows = (unsigned)(bh - heads + heads * parts);
                const unsigned key_blocks = slotted ? (unsigned)slots : kt;
                launch({key_blocks, rows, (unsigned)((std::max(d, dv) + 63) / 64)}, FA_THREADS, [&] {
                    (g.tiles ? flash_bwd_kv_tiles : flash_bwd_kv)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, st.data(), gy.data(),
                                 dk.data(), dvv.data(), g, slotted ? dq_slots.data() : dq.data(), fuse_mode,
                                 mma_kv ? &wide_kv : nullptr, heads, parts, part.data(), group, bh * l * d,
                                 turns.data());
                });
                if (slotted)
                    launch({4, 1, 1}, 256, [&] { flash_sum_batches(dq_slots.data(), dq.data(), slots, bh * l * d); });
                if (heads > 0)
                    launch({4, 1, 1}, 256, [&] {
                        flash_sum_parts(part.data(), dk.data(), dvv.data(), bh - heads, heads, parts, s, d, dv);
                    });
            }
            if (!fuse || mask == 2)
                launch({qt, (unsigned)bh, (unsigned)std::max(1LL, (d + 63) / 64)}, FA_THREADS, [&] {
                    (g.tiles ? flash_bwd_q_tiles : flash_bwd_q)(q.data(), k.data(), v.data(), bits.data(), bias, &flag, st.data(), gy.data(),
                                dq.data(), dbf.data(), g, fuse ? 0 : 1, mask == 2);
                });
        }
        write_f32(out_f, y, bh * l * dv);
        write_f32(out_f, dq, bh * l * d);
        write_f32(out_f, dk, bh * s * d);
        write_f32(out_f, dvv, bh * s * dv);
        if (mask == 2) {
            if (shared) {
                long n = l * s;
                std::vector<float> dm(std::max(1L, n), NAN);
                if (n > 0)
                    launch({(unsigned)((n + 255) / 256), 1, 1}, 256,
                           [&] { flash_sum_batches(dbf.data(), dm.data(), bh, n); });
                write_f32(out_f, dm, n);
            } else {
                write_f32(out_f, dbf, bh * l * s);
            }
        }
    }
    fclose(out_f);
    return 0;
}
