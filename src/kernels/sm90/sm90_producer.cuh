// Producer warpgroup of the Hopper kernel: warps 0-2 gather and dequantize the window, warp 3
// compacts the next token's entries.
#pragma once

#include <cstdint>

#include "src/common/device_ptx.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_gmma.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_ptx.cuh"

namespace swa_decode::sm90 {

// ---- producer: warps 0-2 gather and dequantize, warp 3 compacts the next token's window ----
// The compaction is three dependent global round trips (length, indices, scales); on its own warp
// it runs a token ahead instead of sitting between two refills.
inline constexpr int kGatherThreads = 96;
inline constexpr int kCompactThreads = 32;
inline constexpr int kChunksPerQuarterRow = kQuarterDims / 16;  // 16-byte pieces of a key's quarter

__device__ __forceinline__ const uint8_t* row_address(const DecodeParams& p, uint32_t row_offset_16) {
  return p.kv_cache + (static_cast<int64_t>(row_offset_16) << 4);
}

// Copies dims [128 quarter, 128 quarter + 128) of the token's valid rows into staging buffer
// quarter % 2 as one cp.async group; keys past num_valid are zero-filled, so the dequantized tile
// holds zeros there and P = 0 never meets a NaN.
__device__ __forceinline__ void issue_quarter_gather(const DecodeParams& p, SmemPlan& smem, int meta, int quarter,
                                                     int tid) {
  const int num_valid = smem.num_valid[meta];
  uint8_t(&staging)[kKeys][kQuarterDims] = smem.staging[quarter % kStagingBuffers];
#pragma unroll 4
  for (int piece = tid; piece < kKeys * kChunksPerQuarterRow; piece += kGatherThreads) {
    const int key = piece / kChunksPerQuarterRow;
    const int chunk = piece % kChunksPerQuarterRow;
    const bool valid = key < num_valid;
    const uint8_t* src =
        valid ? row_address(p, smem.row_offset[meta][key]) + quarter * kQuarterDims + chunk * 16 : p.kv_cache;
    ptx::cp_async_16(smem_u32(&staging[key][(chunk ^ (key & 7)) * 16]), src, valid ? 16u : 0u);
  }
  ptx::cp_async_commit();
}

// Units of (key, 32-dim group), keys fastest: the 8 threads of a quarter-warp take 8 consecutive
// keys of one group, so both the staging reads and the swizzled tile writes hit 8 different banks.
__device__ __forceinline__ void dequantize_quarter(SmemPlan& smem, int quarter, int tid) {
  constexpr int kGroups = kQuarterDims / 32;
  const uint8_t(&staging)[kKeys][kQuarterDims] = smem.staging[quarter % kStagingBuffers];
  const int half = quarter / 2;
  const int first_block = (quarter % 2) * (kQuarterDims / kBlockDims);
#pragma unroll 2
  for (int unit = tid; unit < kKeys * kGroups; unit += kGatherThreads) {
    const int key = unit % kKeys;
    const int group = unit / kKeys;
    const uint4 lo = *reinterpret_cast<const uint4*>(&staging[key][((2 * group) ^ (key & 7)) * 16]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&staging[key][((2 * group + 1) ^ (key & 7)) * 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint8_t* row = smem.kv[half][first_block + group / 2][key];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint4 chunk;
      e4m3x4_to_bf16x4(words[2 * k], chunk.x, chunk.y);
      e4m3x4_to_bf16x4(words[2 * k + 1], chunk.z, chunk.w);
      const int position = ((group % 2) * 4 + k) ^ (key & 7);
      *reinterpret_cast<uint4*>(row + position * 16) = chunk;
    }
  }
}

__device__ __forceinline__ void run_compaction_warp(const DecodeParams& p, SmemPlan& smem) {
  const int lane = threadIdx.x % 32;
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    mbarrier_wait(&smem.meta_empty[meta], ((it >> 1) & 1) ^ 1);  // consumers are done with token it-2
    const int n = compact_window<kCompactThreads>(
        p, token, lane, [] { __syncwarp(); }, smem.row_offset[meta], smem.inv_scale[meta], smem.warp_counts);
    if (lane == 0) smem.num_valid[meta] = n;
    __syncwarp();
    mbarrier_arrive(&smem.meta_full[meta]);
    // The rows are gathered a quarter at a time once the previous token's tile frees them: pulling them
    // into L2 now takes the HBM latency off that later gather. Plain per-lane prefetches of each
    // 128-byte line, after the arrive so the gather warps never wait for them: the bulk prefetch
    // takes a warp-uniform address, which the compiler turned into a lane-by-lane loop that cost
    // this warp 58% of its time (ncu, v4). row_offset[meta] is only rewritten by this warp, two
    // tokens from now.
    for (int key = lane; key < n; key += kCompactThreads) {
      const uint8_t* row = row_address(p, smem.row_offset[meta][key]);
#pragma unroll
      for (int line = 0; line < kHeadDim; line += 128) prefetch_l2(row + line);
    }
  }
}

// The tile is released and refilled by halves (kv_empty / kv_full), but gathered by quarters into
// two staging buffers, two quarters in flight: once the consumers free a half, dequantizing its
// first quarter frees a buffer for the next half's first quarter, whose gather then runs under
// the second quarter's dequantization instead of after it (v7's profile: the next token's QK
// waited on dequantize half 0 -> gather half 1 -> dequantize half 1).
__device__ __forceinline__ void run_gather_warps(const DecodeParams& p, SmemPlan& smem) {
  const int tid = threadIdx.x;  // 0..95
  const int first = blockIdx.x;
  if (first >= p.num_tokens) return;
  mbarrier_wait(&smem.meta_full[0], 0);
  issue_quarter_gather(p, smem, 0, 0, tid);
  issue_quarter_gather(p, smem, 0, 1, tid);
  int it = 0;
  for (int token = first; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    const bool has_next = token + static_cast<int>(gridDim.x) < p.num_tokens;
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      mbarrier_wait(&smem.kv_empty[half], (it & 1) ^ 1);  // consumers are done with this half
#pragma unroll
      for (int b = 0; b < kStagingBuffers; ++b) {
        const int quarter = 2 * half + b;
        ptx::cp_async_wait<1>();  // this quarter landed; the next one may still be in flight
        named_barrier_sync(kProducerBarrier, kGatherThreads);  // ... for every thread's copies
        dequantize_quarter(smem, quarter, tid);
        fence_proxy_async_shared();
        named_barrier_sync(kProducerBarrier, kGatherThreads);  // buffer free; the quarter is written
        if (b == kStagingBuffers - 1) mbarrier_arrive(&smem.kv_full[half]);
        if (half == 0) {
          issue_quarter_gather(p, smem, meta, quarter + 2, tid);
        } else if (has_next) {
          if (b == 0) mbarrier_wait(&smem.meta_full[meta ^ 1], ((it + 1) >> 1) & 1);
          issue_quarter_gather(p, smem, meta ^ 1, b, tid);
        } else {
          ptx::cp_async_commit();  // an empty group keeps cp_async_wait<1>'s count right
        }
      }
    }
  }
}

}  // namespace swa_decode::sm90
