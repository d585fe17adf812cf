// The few-heads kernel's numbers (decode_few_heads.cuh), in plain C++ so that its record
// (src/dispatch/few_heads_record.cpp) checks the same shared-memory size and limits the kernel uses.
#pragma once

#include <cstdint>

#include "swa_decode/limits.h"

namespace swa_decode::few_heads {

inline constexpr int kHeadDim = static_cast<int>(kGpuHeadDim);
// The whole window in one shared-memory tile of raw e4m3 rows (66 KiB): a token's keys are loaded
// once and read by both matmuls, so the tile is also what caps the window.
inline constexpr int kKeys = 128;
// Rows 528 bytes apart: the 8 rows an ldmatrix matrix reads (8 consecutive keys, the same 16 bytes)
// start 16 bytes apart modulo 128, in 8 different bank groups, and each row lands whole from one
// bulk copy (a swizzle within the row would need 32 copies of 16 bytes).
inline constexpr int kRowStride = kHeadDim + 16;
inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kKeysPerWarp = kKeys / kWarps;     // 16: QK^T, one m16 tile of keys a warp
inline constexpr int kDimsPerWarp = kHeadDim / kWarps;  // 64: PV, four m16 tiles of dims a warp
inline constexpr int kHeadsPerTile = 8;                 // heads are the mma's N
inline constexpr int kMaxHeadTiles = 2;                 // a CTA holds up to 16 heads
// P rows ([head][key], f16) padded by 16 bytes so that the 4 heads a warp's store instruction
// writes (2t, t = 0..3) start 8 banks apart instead of in the same bank.
inline constexpr int kProbRowElems = kKeys + 8;

// Heads per CTA for a launch of num_heads heads: one n8 tile up to 8, two beyond.
constexpr int head_tiles_for(int64_t num_heads) { return num_heads <= kHeadsPerTile ? 1 : kMaxHeadTiles; }

// Shared memory of one CTA (the kernel's SmemPlan, which static_asserts it matches): the tile,
// q as f16 B fragments, P, per-warp row maxima and sums, the compacted list (offset and inv_scale
// of each entry), the q magnitudes, the sinks, the compaction's warp counts and the barriers.
constexpr int smem_bytes(int head_tiles) {
  const int heads = head_tiles * kHeadsPerTile;
  const int tile = kKeys * kRowStride;
  const int q_frags = (kHeadDim / 16) * head_tiles * 32 * 8;
  const int probs = heads * kProbRowElems * 2;
  const int row_stats = 2 * kWarps * heads * 4;
  const int list = kKeys * (8 + 4);
  const int small = 2 * heads * 4 + kWarps * 4 + kWarps * 8;  // ..., the warps' rows-landed mbarriers
  return (tile + q_frags + probs + row_stats + list + small + 127) / 128 * 128;  // the tile's 128-byte alignment
}
// Two CTAs share an SM on sm_90 (228 KiB, 1 KiB reserved per CTA): one gathers while the other computes.
static_assert(2 * (smem_bytes(kMaxHeadTiles) + 1024) <= 228 * 1024, "two 16-head CTAs per SM on sm_90");

}  // namespace swa_decode::few_heads
