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
inline constexpr int kChunksPerPartRow = kPartDims / 16;  // 16-byte pieces of a key's part

// Copies `part` of the token's valid rows into a staging buffer as one cp.async group; rows past
// num_valid (or every row, for a token past the end) are zero-filled, so the dequantized tile
// holds zeros there and P = 0 never meets a NaN.
__device__ __forceinline__ void issue_part_gather(const DecodeParams& p, SmemPlan& smem, int meta, int part,
                                                  int num_valid, int tid) {
  uint8_t(&staging)[kKeys][kPartDims] = smem.staging[part % kStagingBuffers];
#pragma unroll 4
  for (int piece = tid; piece < kKeys * kChunksPerPartRow; piece += kGatherThreads) {
    const int key = piece / kChunksPerPartRow;
    const int chunk = piece % kChunksPerPartRow;
    const bool valid = key < num_valid;
    const uint8_t* src = valid ? p.kv_cache + smem.row_offset[meta][key] + part * kPartDims + chunk * 16 : p.kv_cache;
    ptx::cp_async_16(smem_u32(&staging[key][(chunk ^ (key & 7)) * 16]), src, valid ? 16u : 0u);
  }
  ptx::cp_async_commit();
}

// Units of (key, 32-dim group), keys fastest: the 8 threads of a quarter-warp take 8 consecutive
// keys of one group, so both the staging reads and the swizzled tile writes hit 8 different banks.
__device__ __forceinline__ void dequantize_part(SmemPlan& smem, int part, int tid) {
  constexpr int kGroups = kPartDims / 32;
  const uint8_t(&staging)[kKeys][kPartDims] = smem.staging[part % kStagingBuffers];
#pragma unroll 2
  for (int unit = tid; unit < kKeys * kGroups; unit += kGatherThreads) {
    const int key = unit % kKeys;
    const int group = unit / kKeys;
    const uint4 lo = *reinterpret_cast<const uint4*>(&staging[key][((2 * group) ^ (key & 7)) * 16]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&staging[key][((2 * group + 1) ^ (key & 7)) * 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint8_t* row = smem.kv[part * kBlocksPerPart + group / 2][key];
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
    // The rows are gathered a part at a time once the previous token's tile frees it: pulling them
    // into L2 now takes the HBM latency off that later gather. Plain per-lane prefetches of each
    // 128-byte line, after the arrive so the gather warps never wait for them: the bulk prefetch
    // takes a warp-uniform address, which the compiler turned into a lane-by-lane loop that cost
    // this warp 58% of its time (ncu, v4). row_offset[meta] is only rewritten by this warp, two
    // tokens from now.
    for (int key = lane; key < n; key += kCompactThreads) {
      const uint8_t* row = p.kv_cache + smem.row_offset[meta][key];
#pragma unroll
      for (int line = 0; line < kHeadDim; line += 128) prefetch_l2(row + line);
    }
  }
}

// Two part gathers are in flight at any time: part k + 1's while part k is dequantized, and part
// k + 2's is issued into part k's staging buffer as soon as that is free. The gathers run across
// tokens: parts 2 and 3 of one token refill with parts 0 and 1 of the next.
__device__ __forceinline__ void run_gather_warps(const DecodeParams& p, SmemPlan& smem) {
  const int tid = threadIdx.x;  // 0..95
  const int first = blockIdx.x;
  if (first >= p.num_tokens) return;
  mbarrier_wait(&smem.meta_full[0], 0);
  issue_part_gather(p, smem, 0, 0, smem.num_valid[0], tid);
  issue_part_gather(p, smem, 0, 1, smem.num_valid[0], tid);
  int it = 0;
  for (int token = first; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    const bool has_next = token + static_cast<int>(gridDim.x) < p.num_tokens;
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      ptx::cp_async_wait<1>();  // this part's group landed; the next part's may still be in flight
      named_barrier_sync(kProducerBarrier, kGatherThreads);  // ... for every thread's copies
      mbarrier_wait(&smem.kv_empty[part], (it & 1) ^ 1);     // consumers are done with the part
      dequantize_part(smem, part, tid);
      fence_proxy_async_shared();
      named_barrier_sync(kProducerBarrier, kGatherThreads);  // staging buffer free again
      mbarrier_arrive(&smem.kv_full[part]);
      if (part + 2 < kParts) {
        issue_part_gather(p, smem, meta, part + 2, smem.num_valid[meta], tid);
      } else {
        // The next token's part 0 or 1; past the last token an empty group keeps the count of
        // groups in flight, which cp_async_wait<1> relies on, the same.
        if (has_next && part == 2) mbarrier_wait(&smem.meta_full[meta ^ 1], ((it + 1) >> 1) & 1);
        if (has_next) {
          issue_part_gather(p, smem, meta ^ 1, part - 2, smem.num_valid[meta ^ 1], tid);
        } else {
          ptx::cp_async_commit();
        }
      }
    }
  }
}

}  // namespace swa_decode::sm90
