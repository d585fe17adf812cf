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
// Seed rows: each half stages its 256 e4m3 bytes. kModel1 rows (docs/semantics.md, "Row formats";
// kModel1 template arguments): half 0 stages e4m3 bytes 0..255 (64-dim groups 0-3), half 1 bytes
// 256..447 (groups 4-6, 12 of the 16 pieces), and each half's 4 scale bytes (bytes 4 half .. 4 half
// + 3 of the row's scale row; half 1's last is the pad byte) go to smem.model1_scales, since the
// staging rows have no room for them in half 0 (256 + 4 bytes). Half 1's last 64-dim block, the 64
// bf16 RoPE values, is copied straight into the tile (issue_model1_rope_copy).
inline constexpr int kChunksPerHalfRow = kHalfDims / 16;  // 16-byte pieces of a half row
inline constexpr int kModel1ScaleBytesPerHalf = kBlocksPerHalf;  // one UE8M0 byte per 64-dim block

// Pieces of a half row that a half stages.
template <bool kModel1>
constexpr int staged_chunks(int half) {
  return kModel1 && half == kHalves - 1 ? kModel1E4m3Chunks - kChunksPerHalfRow : kChunksPerHalfRow;
}

// cp.async of kChunks 16-byte pieces from byte half * 256 on of the first num_valid rows that
// row_offset lists (16-byte units from kv_cache) into the staging buffer; the keys past num_valid
// are zero-filled, so that they enter S and O as zeros. Not committed.
template <int kChunks>
__device__ __forceinline__ void issue_rows_half_gather(const uint8_t* kv_cache, const uint32_t* row_offset,
                                                       int num_valid, SmemPlan& smem, int half, int tid) {
#pragma unroll 4
  for (int piece = tid; piece < kKeys * kChunks; piece += kGatherThreads) {
    const int key = piece / kChunks;
    const int chunk = piece % kChunks;
    const bool valid = key < num_valid;
    const uint8_t* src = valid ? row_address(kv_cache, row_offset[key]) + half * kHalfDims + chunk * 16 : kv_cache;
    ptx::cp_async_16(ptx::smem_addr(&smem.staging[key][(chunk ^ (key & 15)) * 16]), src, valid ? 16u : 0u);
  }
}

// kModel1: the half's 4 scale bytes of each of the first num_valid rows into model1_scales[meta]
// (zero-filled past num_valid: scale byte 0 times a zero-filled e4m3 byte is 0, never NaN). Not
// committed.
__device__ __forceinline__ void issue_model1_scale_gather(const KvSourceParams& src, const uint32_t* row_offset,
                                                          int num_valid, uint32_t* s_scales, int half, int tid) {
  for (int key = tid; key < kKeys; key += kGatherThreads) {
    const bool valid = key < num_valid;
    const uint8_t* from =
        valid ? model1_scale_row(src, row_offset[key]) + half * kModel1ScaleBytesPerHalf : src.kv_cache;
    ptx::cp_async_ca<kModel1ScaleBytesPerHalf>(ptx::smem_addr(&s_scales[key]), from,
                                                valid ? uint32_t{kModel1ScaleBytesPerHalf} : 0u);
  }
}

// One commit group: what a half stages of token `meta`'s rows.
template <bool kModel1>
__device__ __forceinline__ void issue_half_gather(const DecodeParams& p, SmemPlan& smem, const SmemSync& sync,
                                                  int meta, int half, int tid) {
  const uint32_t* row_offset = smem.row_offset[meta];
  const int num_valid = sync.num_valid[meta];
  if constexpr (kModel1) {
    if (half == kHalves - 1) {
      issue_rows_half_gather<staged_chunks<true>(kHalves - 1)>(p.window.kv_cache, row_offset, num_valid, smem, half, tid);
    } else {
      issue_rows_half_gather<staged_chunks<true>(0)>(p.window.kv_cache, row_offset, num_valid, smem, half, tid);
    }
    issue_model1_scale_gather(p.window, row_offset, num_valid, smem.model1_scales[meta], half, tid);
  } else {
    issue_rows_half_gather<kChunksPerHalfRow>(p.window.kv_cache, row_offset, num_valid, smem, half, tid);
  }
  ptx::cp_async_commit();
}

// kModel1: token `meta`'s RoPE values into half 1's last 64-dim block, once the consumers are done
// with half 1. One commit group.
__device__ __forceinline__ void issue_half_rope_copy(const DecodeParams& p, SmemPlan& smem, const SmemSync& sync,
                                                     int meta, int tid) {
  issue_model1_rope_copy<kKeys, kGatherThreads>(p.window.kv_cache, smem.row_offset[meta], sync.num_valid[meta],
                                                smem.kv[kHalves - 1][kBlocksPerHalf - 1], tid);
}

// Units of (key, 32-dim group), keys fastest: the 8 threads of a quarter-warp take 8 consecutive
// keys of one group, so both the staging reads and the swizzled tile writes hit 8 different banks.
// Each 16 bytes as dequantize_chunk says.
template <bool kModel1>
__device__ __forceinline__ void dequantize_half(SmemPlan& smem, int meta, int half, int tid) {
  const int groups = staged_chunks<kModel1>(half) / 2;
#pragma unroll 2
  for (int unit = tid; unit < kKeys * groups; unit += kGatherThreads) {
    const int key = unit % kKeys;
    const int group = unit / kKeys;
    const uint4 lo = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group) ^ (key & 15)) * 16]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group + 1) ^ (key & 15)) * 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    __nv_bfloat162 scale{};
    if constexpr (kModel1) scale = ue8m0_to_bf16x2((smem.model1_scales[meta][key] >> (8 * (group / 2))) & 0xFFu);
    uint8_t* row = smem.kv[half][group / 2][key];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 chunk = dequantize_chunk<kModel1>(words[2 * k], words[2 * k + 1], scale);
      const int position = ((group % 2) * 4 + k) ^ (key & 7);
      *reinterpret_cast<uint4*>(row + position * 16) = chunk;
    }
  }
}

// Pulls rows first, first + step, ... below n of those row_offset lists into L2, one 128-byte line
// per prefetch (kModel1 rows: prefetch_model1_row_l2): the compaction warp's lanes take first =
// lane, step 32 (a layer pair's CTA only the keys it gathers).
template <bool kModel1>
__device__ __forceinline__ void prefetch_rows_l2(const KvSourceParams& src, const uint32_t* row_offset, int n,
                                                 int first, int step) {
  for (int key = first; key < n; key += step) {
    if constexpr (kModel1) {
      prefetch_model1_row_l2(src, row_offset[key]);
    } else {
      const uint8_t* row = row_address(src.kv_cache, row_offset[key]);
#pragma unroll
      for (int line = 0; line < kHeadDim; line += 128) ptx::prefetch_l2(row + line);
    }
  }
}

template <bool kModel1>
__device__ __forceinline__ void run_compaction_warp(const DecodeParams& p, SmemPlan& smem, SmemSync& sync) {
  const int lane = threadIdx.x % 32;
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    // The token's ids into L1 while this warp waits for its buffer and then for the length.
    prefetch_index_columns_l1<kCompactThreads, kKeys>(p.window, token, lane);
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
    prefetch_rows_l2<kModel1>(p.window, smem.row_offset[meta], n, lane, kCompactThreads);
  }
}

// Per half: its gather lands, the consumers are done with its tile, the tile is written and
// published, and the next half's gather goes out (half 1 of this token, or half 0 of the next).
// kModel1's half 1 also copies the RoPE block into the tile: issued as soon as the tile is free, it
// lands while the e4m3 bytes are dequantized.
template <bool kModel1>
__device__ __forceinline__ void run_gather_warps(const DecodeParams& p, SmemPlan& smem, SmemSync& sync) {
  const int tid = threadIdx.x;  // 0..95
  const int first = blockIdx.x;
  if (first >= p.num_tokens) return;
  ptx::mbarrier_wait(&sync.meta_full[0], 0);
  issue_half_gather<kModel1>(p, smem, sync, 0, 0, tid);
  int it = 0;
  for (int token = first; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    const int next = token + gridDim.x;
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      const bool copies_rope = kModel1 && half == kHalves - 1;
      if (copies_rope) {
        ptx::mbarrier_wait(&sync.kv_empty[half], (it & 1) ^ 1);  // consumers are done with it
        issue_half_rope_copy(p, smem, sync, meta, tid);
        ptx::cp_async_wait<1>();  // the half's e4m3 bytes and scales; the RoPE values may still fly
      } else {
        ptx::cp_async_wait<0>();
      }
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // the whole half landed
      if (!copies_rope) ptx::mbarrier_wait(&sync.kv_empty[half], (it & 1) ^ 1);  // consumers are done with it
      dequantize_half<kModel1>(smem, meta, half, tid);
      if (copies_rope) ptx::cp_async_wait<0>();  // this thread's RoPE values, before its proxy fence
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // staging free again
      ptx::mbarrier_arrive(&sync.kv_full[half]);
      if (half == 0) {
        issue_half_gather<kModel1>(p, smem, sync, meta, 1, tid);
      } else if (next < p.num_tokens) {
        ptx::mbarrier_wait(&sync.meta_full[meta ^ 1], ((it + 1) >> 1) & 1);
        issue_half_gather<kModel1>(p, smem, sync, meta ^ 1, 0, tid);
      }
    }
  }
}

}  // namespace swa_decode::sm90
