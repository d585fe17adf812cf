// The op's limits, defined once: validation (src/api/), kernel selection (src/dispatch/), the
// kernels' shared-memory plans, the CLI, the Python binding and the tests all read these names.
// Public so that a caller can size its buffers and check its shapes against the same numbers.
#pragma once

#include <cstdint>

namespace swa_decode {

// Head dim the GPU kernels are built for (DeepSeek-V4: 448 no-RoPE + 64 RoPE dims); the CPU
// backend takes any positive head_dim.
inline constexpr int64_t kGpuHeadDim = 512;

// Query heads per call on the GPU: DeepSeek-V4-Pro's 128 with data-parallel attention; the CPU
// backend takes up to INT32_MAX.
inline constexpr int64_t kMaxGpuHeads = 128;

// Index columns read per token (window_size), on every backend. DeepSeek-V4 uses 128; 1024 is
// the most the portable kernel's per-token compaction lists (8 + 4 bytes an entry) fit beside two
// staging stages in sm_86/89/120's 99 KiB (src/kernels/portable/portable_plan.h checks it).
inline constexpr int64_t kMaxWindow = 1024;

// Index columns read per token from the extra (compressed-entry) source: DeepSeek-V4's C128A
// layers attend to context / 128 entries, 8192 at a 1M context; 16384 leaves room for 2M. The
// kernels walk the extra entries in tiles, so this bounds only validation and the tests.
inline constexpr int64_t kMaxExtraEntries = 16384;

}  // namespace swa_decode
