// How a portable CTA moves one tile of 32 cache rows: cp.async of the raw rows into a staging
// buffer, then dequantization into the f16 or bf16 tile the mma.sync operands are loaded from. Both
// buffers are XOR-swizzled by row so that ldmatrix, the dequantizer's 16-byte accesses and the
// copies hit distinct bank groups; the address helpers keep the swizzle to a few registers.
// kE4m3 rows (512 e4m3 bytes) and kModel1 rows (448 e4m3 bytes, 64 bf16 RoPE values and 7 scales
// in the block's footer; docs/semantics.md, "Row formats") share the copy and the layout of their
// first 512 bytes.
#pragma once

#include <cstdint>

#include "src/common/dim_permutation.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/common/window_compaction.cuh"
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

// Where the rows of a compacted kE4m3 list are: byte offsets from one cache base (an extra
// source's carry the distance from that base to its own cache; addresses are flat 64-bit values,
// so the sum is the row's address).
struct OffsetRows {
  static constexpr bool kModel1 = false;
  const uint8_t* base;
  const int64_t* s_row_offset;
  __device__ __forceinline__ const uint8_t* row(int key) const { return base + s_row_offset[key]; }
};

// Where the rows of a compacted kModel1 list are, and their scale rows: entry (block b, offset o)
// of the source's cache has its row at base + b * stride_kv_block + o * 576 and its scale row at
// base + b * stride_kv_block + block_size * 576 + o * 8 (docs/semantics.md, "Row formats").
struct Model1Rows {
  static constexpr bool kModel1 = true;
  const uint8_t* base;
  const SlotInBlock* s_entries;
  int64_t stride_kv_block;
  int32_t block_size;
  struct Addresses {
    const uint8_t* row;
    const uint8_t* scales;
  };
  __device__ __forceinline__ Addresses addresses(int key) const {
    const SlotInBlock entry = s_entries[key];
    const uint8_t* block = base + static_cast<uint64_t>(entry.block) * static_cast<uint64_t>(stride_kv_block);
    const uint64_t offset = entry.offset;  // < block_size <= INT32_MAX: 64-bit products
    return {block + offset * kModel1RowBytes,
            block + static_cast<uint64_t>(block_size) * kModel1RowBytes + offset * kModel1ScaleRowBytes};
  }
};

// Byte offset of 16-byte chunk `chunk` (0..3) of a kModel1 row's last 64 bytes in a staging
// buffer's tail (portable_plan.h, kModel1TailOffset): rows 64 bytes apart put rows r and r + 2 on
// the same banks, so the chunk is XOR-ed with bits 1-2 of the row, which gives the 8 rows a
// quarter-warp reads 8 different bank groups.
__device__ __forceinline__ uint32_t staging_tail_offset(int row, int chunk) {
  return static_cast<uint32_t>(kModel1TailOffset + row * kModel1RowTailBytes + ((chunk ^ ((row >> 1) & 3)) * kChunkBytes));
}

// Eight threads per row, each copying every eighth 16-byte chunk (in pieces of kWidth bytes) of
// the first 512 bytes of one row per pass: with rows 8 apart per step, (chunk ^ row & 7) is the
// thread's first swizzled chunk plus 8 i, so every destination is one register plus an immediate.
// A kModel1 row's last 64 bytes go to the stage's tail from the row's first four threads and its
// scale row to the stage's scale rows from its fifth (kModel1 rows are 16-byte aligned: the
// portable record checks it).
template <int kThreads, int kWidth, typename Rows>
__device__ __forceinline__ void issue_tile_copy_width(const Rows& rows, int num_valid, int tile, uint8_t* staging) {
  constexpr int kThreadsPerRow = 8;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  constexpr int kChunksPerThread = kHeadDim / kChunkBytes / kThreadsPerRow;  // 4
  static_assert(kRowsPerPass % 8 == 0 && kKeysPerTile % kRowsPerPass == 0, "rows 8 apart keep row & 7");
  static_assert(!Rows::kModel1 || kWidth == 16, "kModel1 rows are copied 16 bytes at a time");
  const int first_row = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int first_chunk = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const uint32_t dst_first = ptx::smem_addr(staging) + staging_chunk_offset(first_row, first_chunk);
#pragma unroll
  for (int pass = 0; pass < kKeysPerTile / kRowsPerPass; ++pass) {
    const int row = first_row + pass * kRowsPerPass;
    const int key = tile * kKeysPerTile + row;
    const bool valid = key < num_valid;
    // A masked row copies nothing (src-size 0 zero-fills) from an address that stays in bounds.
    const uint8_t* row_start;
    [[maybe_unused]] const uint8_t* scales_start;  // kModel1 only
    if constexpr (Rows::kModel1) {
      const typename Rows::Addresses at = valid ? rows.addresses(key) : typename Rows::Addresses{rows.base, rows.base};
      row_start = at.row;
      scales_start = at.scales;
    } else {
      row_start = valid ? rows.row(key) : rows.base;
    }
    const uint8_t* src_row = row_start + first_chunk * kChunkBytes;
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
    if constexpr (Rows::kModel1) {
      if (first_chunk < kModel1RowTailBytes / kChunkBytes) {
        ptx::cp_async_16(ptx::smem_addr(staging) + staging_tail_offset(row, first_chunk),
                         row_start + kHeadDim + first_chunk * kChunkBytes, src_bytes);
      } else if (first_chunk == kModel1RowTailBytes / kChunkBytes) {
        ptx::cp_async_ca<static_cast<int>(kModel1ScaleRowBytes)>(
            ptx::smem_addr(staging) + kModel1ScalesOffset + row * static_cast<uint32_t>(kModel1ScaleRowBytes),
            scales_start, valid ? static_cast<uint32_t>(kModel1ScaleRowBytes) : 0u);
      }
    }
  }
}

// Starts the copy of tile `tile`'s raw rows into `staging`; rows past num_valid are zero-filled.
// Always commits a group (possibly empty) so the ring's wait counts stay uniform. `width`
// (kv_copy_width) applies to kE4m3 rows; kModel1 rows are always copied 16 bytes at a time.
template <int kThreads, typename Rows>
__device__ __forceinline__ void issue_tile_copy(const Rows& rows, int num_valid, int tile, uint8_t* staging, int width) {
  if (tile * kKeysPerTile >= num_valid) {
    ptx::cp_async_commit();
    return;
  }
  if (Rows::kModel1 || width == 16) {
    issue_tile_copy_width<kThreads, 16>(rows, num_valid, tile, staging);
  } else if constexpr (!Rows::kModel1) {
    if (width == 8) {
      issue_tile_copy_width<kThreads, 8>(rows, num_valid, tile, staging);
    } else {
      issue_tile_copy_width<kThreads, 4>(rows, num_valid, tile, staging);
    }
  }
  ptx::cp_async_commit();
}

// Staging rows -> the tile the matmuls read (SmemPlan::kv), dims permuted per 32-dim group
// (src/common/dim_permutation.cuh). kE4m3 rows: the e4m3 codes, exact in f16 (q_f16.cuh says why
// f16) or, where the kernel's tiles are bf16 (a kModel1 source in the launch), in bf16. kModel1
// rows (always bf16): dims 0..447 are e4m3 * 2^(scale - 127), exact (e4m3x4_to_scaled_bf16x4), and
// dims 448..511 the row's bf16 values as they are.
// Lane l takes row l, warp w the 32-dim groups w, w + kWarps, ...: with both buffers swizzled, each
// quarter-warp's 16-byte loads and stores touch 8 different bank groups (no conflicts), and since
// a group index only moves bits above the swizzle's, all addresses are a few registers + immediates.
// In a kModel1 row the group decides the path, and it is the same for the whole warp.
template <int kWarps, bool kBf16, bool kModel1Rows>
__device__ __forceinline__ void dequantize_tile(const uint8_t* staging, uint8_t* kv_bytes, int warp, int lane) {
  constexpr int kGroupsPerRow = kHeadDim / kDimGroup;  // 16
  constexpr int kE4m3Groups = static_cast<int>(kModel1E4m3Dims) / kDimGroup;  // 14 in a kModel1 row
  constexpr int kDimsPerScale = 64;
  static_assert(kWarps == 4 || kWarps == 8, "group steps of 4 or 8 leave the low 3 chunk bits alone");
  static_assert(kBf16 || !kModel1Rows, "kModel1 rows need bf16 tiles");
  const int x = lane & 7;
  // Raw chunks 2g and 2g + 1 of row `lane`; f16 chunks 4g + a.
  const uint8_t* src_lo = staging + lane * kHeadDim + (((2 * warp) ^ x) * kChunkBytes);
  const uint8_t* src_hi = staging + lane * kHeadDim + (((2 * warp) ^ x ^ 1) * kChunkBytes);
  uint8_t* dst = kv_bytes + lane * (kHeadDim * 2);
  const int dst_chunk = (4 * warp) ^ x;
  [[maybe_unused]] uint2 scale_row;  // kModel1 only: the row's 7 UE8M0 scales and the pad byte
  if constexpr (kModel1Rows) {
    scale_row = *reinterpret_cast<const uint2*>(staging + kModel1ScalesOffset + lane * kModel1ScaleRowBytes);
  }
#pragma unroll
  for (int i = 0; i < kGroupsPerRow / kWarps; ++i) {
    const int step = i * kWarps;  // group = warp + step
    const int group = warp + step;
    // == kv_offset(lane, 4 group + a): 4 step and a miss the swizzled bits' overlap
    const auto store = [&](int a, uint4 chunk) {
      *reinterpret_cast<uint4*>(dst + (((dst_chunk ^ a) + 4 * step) * kChunkBytes)) = chunk;
    };
    if (!kModel1Rows || group < kE4m3Groups) {
      const uint4 lo = *reinterpret_cast<const uint4*>(src_lo + 2 * step * kChunkBytes);
      const uint4 hi = *reinterpret_cast<const uint4*>(src_hi + 2 * step * kChunkBytes);
      const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      [[maybe_unused]] float scale;  // kModel1 only: 2^(scale byte of this group's 64 dims - 127)
      if constexpr (kModel1Rows) {
        scale = ue8m0_to_float(__byte_perm(scale_row.x, scale_row.y, group * kDimGroup / kDimsPerScale) & 0xFFu);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        uint32_t pairs01, pairs23;
        gather_logical_chunk_e4m3(words, a, pairs01, pairs23);
        uint4 chunk;
        if constexpr (kModel1Rows) {
          e4m3x4_to_scaled_bf16x4(pairs01, scale, chunk.x, chunk.y);
          e4m3x4_to_scaled_bf16x4(pairs23, scale, chunk.z, chunk.w);
        } else if constexpr (kBf16) {
          e4m3x4_to_bf16x4(pairs01, chunk.x, chunk.y);
          e4m3x4_to_bf16x4(pairs23, chunk.z, chunk.w);
        } else {
          e4m3x4_to_f16x4(pairs01, chunk.x, chunk.y);
          e4m3x4_to_f16x4(pairs23, chunk.z, chunk.w);
        }
        store(a, chunk);
      }
    } else if constexpr (kModel1Rows) {
      // A RoPE group: 16 bf16 pairs, pair p (dims 2p, 2p + 1) in word p % 4 of staged chunk p / 4;
      // logical chunk a holds pairs a, 4 + a, 8 + a, 12 + a (physical dims 8b + 2a, b = 0..3).
      // Group 14 is row bytes 448..511 (staged chunks 28..31), group 15 the row's tail.
      uint4 staged[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t at = group == kE4m3Groups
                                ? staging_chunk_offset(lane, 2 * kE4m3Groups + k)
                                : staging_tail_offset(lane, k);
        staged[k] = *reinterpret_cast<const uint4*>(staging + at);
      }
      store(0, make_uint4(staged[0].x, staged[1].x, staged[2].x, staged[3].x));
      store(1, make_uint4(staged[0].y, staged[1].y, staged[2].y, staged[3].y));
      store(2, make_uint4(staged[0].z, staged[1].z, staged[2].z, staged[3].z));
      store(3, make_uint4(staged[0].w, staged[1].w, staged[2].w, staged[3].w));
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
