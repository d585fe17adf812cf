// Shared-memory plan of the portable kernel, in plain C++ so that the kernel selection (host code,
// no CUDA headers) sizes the staging ring from the same numbers the kernel uses.
#pragma once

#include <cstdint>

namespace swa_decode::portable {

inline constexpr int kHeadDim = 512;
inline constexpr int kHeadsPerGroup = 16;     // the M of one mma.sync
inline constexpr int kWarpsPerGroup = 4;      // head-dim quarters
inline constexpr int kKeysPerTile = 32;
inline constexpr int kMaxWindow = 1024;
inline constexpr int kMinStages = 2;
inline constexpr int kMaxStages = 4;
inline constexpr int kStageBytes = kKeysPerTile * kHeadDim;  // 16 KiB of raw e4m3 rows

// Fixed part: the bf16 tile, the partial-score exchange and the compaction's warp counts.
constexpr int fixed_smem_bytes(int head_groups) {
  const int tile = kKeysPerTile * kHeadDim * 2;
  const int partial_scores = head_groups * kWarpsPerGroup * 16 * 32 * 4;
  const int warp_counts = head_groups * kWarpsPerGroup * 4;
  return (tile + partial_scores + warp_counts + 127) / 128 * 128;
}

struct RingPlan {
  int staging_offset;     // bytes from the start of shared memory, 128-aligned
  int row_offset_offset;  // int64_t[window_size]: compacted entries' byte offsets in the cache
  int inv_scale_offset;   // float[window_size]
  int total_bytes;
};

constexpr RingPlan ring_plan(int head_groups, int num_stages, int window_size) {
  const int staging = fixed_smem_bytes(head_groups);
  const int row_offset = staging + num_stages * kStageBytes;
  const int inv_scale = row_offset + window_size * 8;
  return RingPlan{staging, row_offset, inv_scale, inv_scale + window_size * 4};
}
static_assert(ring_plan(2, kMinStages, kMaxWindow).total_bytes <= 99 * 1024,
              "two stages must fit sm_86/89/120's 99 KiB at any window");

// As many stages as fit in `smem_budget` bytes (kMinStages..kMaxStages), but no more than the
// window has tiles: with all of a 128-entry window in flight a CTA pays the gather latency once.
constexpr int choose_stages(int head_groups, int window_size, int64_t smem_budget) {
  const int tiles = (window_size + kKeysPerTile - 1) / kKeysPerTile;
  int stages = kMinStages;
  while (stages < kMaxStages && stages < tiles && ring_plan(head_groups, stages + 1, window_size).total_bytes <= smem_budget) {
    ++stages;
  }
  return stages;
}

}  // namespace swa_decode::portable
