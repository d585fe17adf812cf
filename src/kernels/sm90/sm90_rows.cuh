// Where a source's cache rows lie and the copies of them that both Hopper kernels' producers make
// (the window kernel, sm90_producer.cuh; the layer kernel, sm90_layer_gather.cuh): row offsets
// as 32-bit counts of 16 bytes, and kModel1's pieces (docs/semantics.md, "Row formats": 448 e4m3
// bytes, then 64 bf16 RoPE values; 7 UE8M0 scale bytes in the block's footer).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "swa_decode/swa_decode.h"

namespace swa_decode::sm90 {

inline constexpr int kModel1E4m3Chunks = kModel1E4m3Dims / 16;  // 28 16-byte pieces of e4m3 bytes
inline constexpr int kModel1RopeChunks = (kHeadDim - kModel1E4m3Dims) * 2 / 16;  // 8: one 64-dim block

__device__ __forceinline__ const uint8_t* row_address(const uint8_t* kv_cache, uint32_t row_offset_16) {
  return kv_cache + (static_cast<int64_t>(row_offset_16) << 4);
}

// kModel1: the scale row of the row at `row_offset_16` (16-byte units from src.kv_cache): a row at
// b * stride_kv_block + o * 576 has its scales at b * stride_kv_block + B * 576 + o * 8. In 32 bits
// (row offsets are below 2^32 units, sm90_record.cpp): a 64-bit division would cost the producer,
// which runs on 72 registers, a spill.
__device__ __forceinline__ const uint8_t* model1_scale_row(const KvSourceParams& src, uint32_t row_offset_16) {
  const int64_t block_units = src.stride_kv_block >> 4;  // validate.cpp: a multiple of 576
  const uint32_t block = block_units > UINT32_MAX ? 0u : row_offset_16 / static_cast<uint32_t>(block_units);
  const uint32_t offset = (row_offset_16 - block * static_cast<uint32_t>(block_units)) / (kModel1RowBytes / 16);
  return src.kv_cache + static_cast<int64_t>(block) * src.stride_kv_block + int64_t{src.block_size} * kModel1RowBytes +
         static_cast<int64_t>(offset) * kModel1ScaleRowBytes;
}

// The compaction warp's L2 prefetch of one kModel1 row (as prefetch_rows_l2 for seed rows): its
// 576 bytes start anywhere in a 128-byte line, so its last byte is fetched too, and its scale row
// lies in the block's footer.
__device__ __forceinline__ void prefetch_model1_row_l2(const KvSourceParams& src, uint32_t row_offset_16) {
  const uint8_t* row = row_address(src.kv_cache, row_offset_16);
#pragma unroll
  for (int line = 0; line < kModel1RowBytes; line += 128) ptx::prefetch_l2(row + line);
  ptx::prefetch_l2(row + kModel1RowBytes - 1);
  ptx::prefetch_l2(model1_scale_row(src, row_offset_16));
}

// Eight e4m3 codes of a staged row (two u32, low byte first) -> the tile's 16-byte chunk of eight
// bf16 values. Seed rows convert exactly and keep their inverse scale for the consumers' scores
// (fp8_convert.cuh); a kModel1 group is multiplied by its power of two `scale` (ue8m0_to_bf16x2),
// exactly in bf16 (unused for seed rows).
template <bool kModel1>
__device__ __forceinline__ uint4 dequantize_chunk(uint32_t codes_lo, uint32_t codes_hi, __nv_bfloat162 scale) {
  uint4 chunk;
  if constexpr (kModel1) {
    e4m3x4_to_scaled_bf16x4(codes_lo, scale, chunk.x, chunk.y);
    e4m3x4_to_scaled_bf16x4(codes_hi, scale, chunk.z, chunk.w);
  } else {
    e4m3x4_to_bf16x4(codes_lo, chunk.x, chunk.y);
    e4m3x4_to_bf16x4(codes_hi, chunk.z, chunk.w);
  }
  return chunk;
}

// kModel1: the RoPE values (bytes 448..575 of the row) of the first count of the kKeysToCopy rows
// that row_offset lists into `block`, the tile's last 64-dim block ([key][128 B], 16-byte chunks
// XOR-swizzled by key % 8, as the tile); keys past count are zero-filled. They need no conversion,
// so they skip staging, and the copy may only be issued once the consumers are done with the tile.
// One commit group, run by kCopyThreads threads numbered tid: thread tid copies chunk tid % 8 of
// keys tid / 8, tid / 8 + kCopyThreads / 8, ... (the pieces each thread had when they were numbered
// key * 8 + chunk and dealt round robin). Unsigned, and the chunk fixed per thread: the signed
// division and remainder of each piece's number cost ~26 instructions a 16-byte copy in the layer
// kernel's dequant warps (ncu, session 25), where MODEL1 rows keep them behind the consumers.
template <int kKeysToCopy, int kCopyThreads>
__device__ __forceinline__ void issue_model1_rope_copy(const uint8_t* kv_cache, const uint32_t* row_offset, int count,
                                                       uint8_t (*block)[kRowBytes], int tid) {
  static_assert(kCopyThreads % kModel1RopeChunks == 0, "every thread keeps one chunk of its keys");
  constexpr unsigned kKeysPerPass = kCopyThreads / kModel1RopeChunks;
  const unsigned chunk = static_cast<unsigned>(tid) % kModel1RopeChunks;
  for (unsigned key = static_cast<unsigned>(tid) / kModel1RopeChunks; key < kKeysToCopy; key += kKeysPerPass) {
    const bool valid = static_cast<int>(key) < count;
    const uint8_t* src = valid ? row_address(kv_cache, row_offset[key]) + kModel1E4m3Dims + chunk * 16 : kv_cache;
    ptx::cp_async_16(ptx::smem_addr(&block[key][(chunk ^ (key & 7)) * 16]), src, valid ? 16u : 0u);
  }
  ptx::cp_async_commit();
}

}  // namespace swa_decode::sm90
