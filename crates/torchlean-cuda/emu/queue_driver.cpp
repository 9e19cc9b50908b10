// Runs the launch queue's kernel (`queued_maps` of kernels/elementwise.cu, unchanged) under
// emu.h on a table written by tests/emulated_queue.rs with `torchlean_cuda::queue::table_entry`,
// whose addresses are byte offsets into one arena of f32: the driver adds the arena's host
// address to each, launches one block of 256 threads as src/queue.rs does, and writes the
// arena back.
//
// Input: i32 count, i64 arena length; f32 arena; u32 table (10 words per entry).
// syntax_prelude.h: emu.h, the correctly rounded intrinsics elementwise.cu's other kernels
// name, and math.h's macros hidden (as under NVRTC)
#include "syntax_prelude.h"
#include <cstdio>
#include <cstdint>
#include ELEMENTWISE_CU

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: queue_driver IN OUT\n"); return 2; }
    FILE* in = fopen(argv[1], "rb");
    if (!in) { fprintf(stderr, "cannot open %s\n", argv[1]); return 2; }
    int32_t count; int64_t len;
    if (fread(&count, 4, 1, in) != 1 || fread(&len, 8, 1, in) != 1) { fprintf(stderr, "short input\n"); return 2; }
    std::vector<float> arena(len);
    std::vector<unsigned> table(10 * (size_t)count);
    if (fread(arena.data(), 4, len, in) != (size_t)len || fread(table.data(), 4, table.size(), in) != table.size()) {
        fprintf(stderr, "short input\n"); return 2;
    }
    fclose(in);
    const unsigned long long base = (unsigned long long)(uintptr_t)arena.data();
    for (int e = 0; e < count; ++e)
        for (int p = 0; p < 3; ++p) {
            unsigned* w = &table[10 * e + 3 + 2 * p];
            const unsigned long long at = base + (((unsigned long long)w[1] << 32) | w[0]);
            w[0] = (unsigned)at;
            w[1] = (unsigned)(at >> 32);
        }
    launch({1, 1, 1}, 256, [&] { queued_maps(table.data(), count); });
    FILE* out = fopen(argv[2], "wb");
    if (!out || fwrite(arena.data(), 4, len, out) != (size_t)len) { fprintf(stderr, "cannot write\n"); return 2; }
    fclose(out);
    return 0;
}
