// Prepended to the NVRTC program (every kernels/*.cu, in src/nvrtc.rs's order) for a C++
// syntax check on machines without a GPU (tests/kernel_sources.rs): emu.h's stand-ins for
// CUDA's qualifiers, types and intrinsics, the correctly rounded arithmetic intrinsics as
// plain operations, and math.h's macros hidden, as NVRTC has no math.h. What it catches: a
// kernel that does not parse, an undeclared name, a math.h macro. What it does not: NVRTC's
// own diagnostics beyond C++ (the GPU run compiles the program).
#include "emu.h"
#undef INFINITY
#undef NAN
#undef HUGE_VALF
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline bool isinf(float x) { return std::isinf(x); }
inline bool isnan(float x) { return std::isnan(x); }
