// Producer warpgroup of the Hopper kernel: warps 0-2 gather and dequantize the window, warp 3
// compacts the next token's entries.
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_rows.cuh"

namespace swa_decode::sm90 {

// ---- producer: warps 0-2 gather and dequantize, warp 3 compacts the next token's window ----
inline constexpr int kChunksPerHalfRow = kHalfDims / 16;  // 16-byte pieces of a half row

// cp.async of one 256-dim half of the first num_valid rows that row_offset lists (16-byte units
// from kv_cache) into the staging buffer; the keys past num_valid are zero-filled, so that they
// enter S and O as zeros.
__device__ __forceinline__ void issue_rows_half_gather(const uint8_t* kv_cache, const uint32_t* row_offset,
                                                       int num_valid, SmemPlan& smem, int half, int tid) {
#pragma unroll 4
  for (int piece = tid; piece < kKeys * kChunksPerHalfRow; piece += kGatherThreads) {
    const int key = piece / kChunksPerHalfRow;
    const int chunk = piece % kChunksPerHalfRow;
    const bool valid = key < num_valid;
    const uint8_t* src = valid ? row_address(kv_cache, row_offset[key]) + half * kHalfDims + chunk * 16 : kv_cache;
    ptx::cp_async_16(ptx::smem_addr(&smem.staging[key][(chunk ^ (key & 15)) * 16]), src, valid ? 16u : 0u);
  }
  ptx::cp_async_commit();
}

__device__ __forceinline__ void issue_half_gather(const DecodeParams& p, SmemPlan& smem, const SmemSync& sync,
                                                  int meta, int half, int tid) {
  issue_rows_half_gather(p.window.kv_cache, smem.row_offset[meta], sync.num_valid[meta], smem, half, tid);
}

// Units of (key, 32-dim group), keys fastest: the 8 threads of a quarter-warp take 8 consecutive
// keys of one group, so both the staging reads and the swizzled tile writes hit 8 different banks.
__device__ __forceinline__ void dequantize_half(SmemPlan& smem, int half, int tid) {
  constexpr int kGroups = kHalfDims / 32;
#pragma unroll 2
  for (int unit = tid; unit < kKeys * kGroups; unit += kGatherThreads) {
    const int key = unit % kKeys;
    const int group = unit / kKeys;
    const uint4 lo = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group) ^ (key & 15)) * 16]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group + 1) ^ (key & 15)) * 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint8_t* row = smem.kv[half][group / 2][key];
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

// Pulls the first n rows that row_offset lists into L2, one 128-byte line per prefetch, spread
// over the compaction warp's lanes.
__device__ __forceinline__ void prefetch_rows_l2(const uint8_t* kv_cache, const uint32_t* row_offset, int n, int lane) {
  for (int key = lane; key < n; key += kCompactThreads) {
    const uint8_t* row = row_address(kv_cache, row_offset[key]);
#pragma unroll
    for (int line = 0; line < kHeadDim; line += 128) ptx::prefetch_l2(row + line);
  }
}

__device__ __forceinline__ void run_compaction_warp(const DecodeParams& p, SmemPlan& smem, SmemSync& sync) {
  const int lane = threadIdx.x % 32;
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    ptx::mbarrier_wait(&sync.meta_empty[meta], ((it >> 1) & 1) ^ 1);  // consumers are done with token it-2
    const int n = compact_window<kCompactThreads>(
        p.window, token, lane, [] { __syncwarp(); }, smem.row_offset[meta], smem.inv_scale[meta], sync.warp_counts);
    if (lane == 0) sync.num_valid[meta] = n;
    __syncwarp();
    ptx::mbarrier_arrive(&sync.meta_full[meta]);
    // The rows are gathered a half at a time once the previous token's tile is free: pulling them
    // into L2 now takes the HBM latency off that later gather. Plain per-lane prefetches of each
    // 128-byte line, after the arrive so the gather warps never wait for them: the bulk prefetch
    // takes a warp-uniform address, which the compiler turned into a lane-by-lane loop that cost
    // this warp 58% of its time (ncu, v4). row_offset[meta] is only rewritten by this warp, two
    // tokens from now.
    prefetch_rows_l2(p.window.kv_cache, smem.row_offset[meta], n, lane);
  }
}

__device__ __forceinline__ void run_gather_warps(const DecodeParams& p, SmemPlan& smem, SmemSync& sync) {
  const int tid = threadIdx.x;  // 0..95
  const int first = blockIdx.x;
  if (first >= p.num_tokens) return;
  ptx::mbarrier_wait(&sync.meta_full[0], 0);
  issue_half_gather(p, smem, sync, 0, 0, tid);
  int it = 0;
  for (int token = first; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    const int next = token + gridDim.x;
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      ptx::cp_async_wait<0>();
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // the whole half landed
      ptx::mbarrier_wait(&sync.kv_empty[half], (it & 1) ^ 1);     // consumers are done with it
      dequantize_half(smem, half, tid);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // staging free again
      ptx::mbarrier_arrive(&sync.kv_full[half]);
      if (half == 0) {
        issue_half_gather(p, smem, sync, meta, 1, tid);
      } else if (next < p.num_tokens) {
        ptx::mbarrier_wait(&sync.meta_full[meta ^ 1], ((it + 1) >> 1) & 1);
        issue_half_gather(p, smem, sync, meta ^ 1, 0, tid);
      }
    }
  }
}

}  // namespace swa_decode::sm90
