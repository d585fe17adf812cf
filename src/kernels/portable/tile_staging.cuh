// How a portable CTA moves one tile of 32 cache rows: cp.async of the raw e4m3 rows into a staging
// buffer, then dequantization into the f16 tile the mma.sync operands are loaded from. Both
// buffers are XOR-swizzled by row so that ldmatrix, the dequantizer's 16-byte accesses and the
// copies hit distinct bank groups; the address helpers keep the swizzle to a few registers.
#pragma once

#include <cstdint>

#include "src/common/dim_permutation.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode::portable {

inline constexpr int kChunkBytes = 16;  // one cp.async / ldmatrix row / 8 f16

// Layout of the f16 tile (SmemPlan::kv): 16-byte chunk c of key row k lives at byte
//   kv_offset(k, c) = k * 1024 + (c ^ (k & 7)) * 16.
// XOR-ing the chunk's low 3 bits with the row makes the 8 rows an ldmatrix reads land in 8
// different bank groups. The helpers below compute it as registers plus immediates.

// ldmatrix addresses. Every row a lane addresses has row & 7 == lane & 7 (rows step by 8), so
// chunk ^ (row & 7) splits into a lane constant (bit 0 and the quarter's 16-chunk block), a term in
// 4 register values (bits 1-2) and immediates (bit 3, the row step): 4 registers per matmul
// instead of 16 full addresses, which is what keeps the kernel within 128 registers.
struct SwizzledRows {
  uint32_t addr[4];  // [(step / 2) & 3]: the remaining terms are immediates
};
// first_row: the lane's row at step 0; chunk_base: its first chunk (even, a multiple of 16 plus
// the lane's own bit 0). Chunk c = chunk_base + 2 j + 8 k lives at addr[j] + 128 k.
__device__ __forceinline__ SwizzledRows swizzled_rows(uint32_t tile_base, int first_row, int chunk_base) {
  const int x = first_row & 7;
  const uint32_t row = tile_base + first_row * (kHeadDim * 2) + (((chunk_base & ~1) | ((chunk_base & 1) ^ (x & 1))) * kChunkBytes);
  SwizzledRows rows;
#pragma unroll
  for (int j = 0; j < 4; ++j) rows.addr[j] = row + ((j ^ (x >> 1)) * 2 * kChunkBytes);
  return rows;
}

// Byte offset of 16-byte chunk `chunk` of raw row `row` in a staging buffer, swizzled the same way
// so that 8 threads dequantizing the same chunk of 8 consecutive rows read 8 different bank groups.
__device__ __forceinline__ uint32_t staging_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kHeadDim + ((chunk ^ (row & 7)) * kChunkBytes));
}

// Largest power of two <= 16 that divides every cache-row address of `src`: the cp.async width.
__device__ __forceinline__ int kv_copy_width(const KvSourceParams& src) {
  const uint64_t bits = reinterpret_cast<uint64_t>(src.kv_cache) | static_cast<uint64_t>(src.stride_kv_block) |
                        static_cast<uint64_t>(src.stride_kv_token);
  return (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : 4;
}

// Eight threads per row, each copying every eighth 16-byte chunk (in pieces of kWidth bytes) of
// one row per pass: with rows 8 apart per step, (chunk ^ row & 7) is the thread's first swizzled
// chunk plus 8 i, so every destination is one register plus an immediate. s_row_offset holds byte
// offsets from kv_cache; an extra source's carry the distance from kv_cache to its own cache
// (addresses are flat 64-bit values, so the sum is the row's address).
template <int kThreads, int kWidth>
__device__ __forceinline__ void issue_tile_copy_width(const uint8_t* kv_cache, const int64_t* s_row_offset,
                                                      int num_valid, int tile, uint8_t* staging) {
  constexpr int kThreadsPerRow = 8;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  constexpr int kChunksPerThread = kHeadDim / kChunkBytes / kThreadsPerRow;  // 4
  static_assert(kRowsPerPass % 8 == 0 && kKeysPerTile % kRowsPerPass == 0, "rows 8 apart keep row & 7");
  const int first_row = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int first_chunk = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const uint32_t dst_first = ptx::smem_addr(staging) + staging_chunk_offset(first_row, first_chunk);
#pragma unroll
  for (int pass = 0; pass < kKeysPerTile / kRowsPerPass; ++pass) {
    const int row = first_row + pass * kRowsPerPass;
    const int key = tile * kKeysPerTile + row;
    const bool valid = key < num_valid;
    // A masked row copies nothing (src-size 0 zero-fills) from an address that stays in bounds.
    const uint8_t* src_row = (valid ? kv_cache + s_row_offset[key] : kv_cache) + first_chunk * kChunkBytes;
    const uint32_t src_bytes = valid ? kWidth : 0;
    const uint32_t dst_row = dst_first + pass * kRowsPerPass * kHeadDim;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const uint32_t dst = dst_row + i * kThreadsPerRow * kChunkBytes;
      const uint8_t* src = src_row + i * kThreadsPerRow * kChunkBytes;
      if constexpr (kWidth == 16) {
        ptx::cp_async_16(dst, src, src_bytes);
      } else {
#pragma unroll
        for (int piece = 0; piece < kChunkBytes; piece += kWidth) {
          ptx::cp_async_ca<kWidth>(dst + piece, src + piece, src_bytes);
        }
      }
    }
  }
}

// Starts the copy of tile `tile`'s raw rows into `staging`; rows past num_valid are zero-filled.
// Always commits a group (possibly empty) so the ring's wait counts stay uniform.
template <int kThreads>
__device__ __forceinline__ void issue_tile_copy(const uint8_t* kv_cache, const int64_t* s_row_offset, int num_valid,
                                                int tile, uint8_t* staging, int width) {
  if (tile * kKeysPerTile >= num_valid) {
    ptx::cp_async_commit();
    return;
  }
  if (width == 16) {
    issue_tile_copy_width<kThreads, 16>(kv_cache, s_row_offset, num_valid, tile, staging);
  } else if (width == 8) {
    issue_tile_copy_width<kThreads, 8>(kv_cache, s_row_offset, num_valid, tile, staging);
  } else {
    issue_tile_copy_width<kThreads, 4>(kv_cache, s_row_offset, num_valid, tile, staging);
  }
  ptx::cp_async_commit();
}

// e4m3 staging rows -> f16 tile (exact, src/kernels/portable/q_f16.cuh says why f16), dims permuted per 32-dim group (src/common/dim_permutation.cuh).
// Lane l takes row l, warp w the 32-dim groups w, w + kWarps, ...: with both buffers swizzled, each
// quarter-warp's 16-byte loads and stores touch 8 different bank groups (no conflicts), and since
// a group index only moves bits above the swizzle's, all addresses are a few registers + immediates.
template <int kWarps>
__device__ __forceinline__ void dequantize_tile(const uint8_t* staging, uint8_t* kv_bytes, int warp, int lane) {
  constexpr int kGroupsPerRow = kHeadDim / kDimGroup;  // 16
  static_assert(kWarps == 4 || kWarps == 8, "group steps of 4 or 8 leave the low 3 chunk bits alone");
  const int x = lane & 7;
  // Raw chunks 2g and 2g + 1 of row `lane`; f16 chunks 4g + a.
  const uint8_t* src_lo = staging + lane * kHeadDim + (((2 * warp) ^ x) * kChunkBytes);
  const uint8_t* src_hi = staging + lane * kHeadDim + (((2 * warp) ^ x ^ 1) * kChunkBytes);
  uint8_t* dst = kv_bytes + lane * (kHeadDim * 2);
  const int dst_chunk = (4 * warp) ^ x;
#pragma unroll
  for (int i = 0; i < kGroupsPerRow / kWarps; ++i) {
    const int step = i * kWarps;  // group = warp + step
    const uint4 lo = *reinterpret_cast<const uint4*>(src_lo + 2 * step * kChunkBytes);
    const uint4 hi = *reinterpret_cast<const uint4*>(src_hi + 2 * step * kChunkBytes);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      uint32_t pairs01, pairs23;
      gather_logical_chunk_e4m3(words, a, pairs01, pairs23);
      uint4 chunk;
      e4m3x4_to_f16x4(pairs01, chunk.x, chunk.y);
      e4m3x4_to_f16x4(pairs23, chunk.z, chunk.w);
      // == kv_offset(lane, 4 (warp + step) + a): 4 step and a miss the swizzled bits' overlap
      *reinterpret_cast<uint4*>(dst + (((dst_chunk ^ a) + 4 * step) * kChunkBytes)) = chunk;
    }
  }
}

// Waits until at most `pending` of the most recent cp.async groups are still in flight.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0: ptx::cp_async_wait<0>(); break;
    case 1: ptx::cp_async_wait<1>(); break;
    case 2: ptx::cp_async_wait<2>(); break;
    default: ptx::cp_async_wait<3>(); break;
  }
}

}  // namespace swa_decode::portable
