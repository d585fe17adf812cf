// Shared-memory plan, thread roles and register budget of the Hopper kernel (decode_sm90.cuh).
#pragma once

#include <cstdint>

#include "swa_decode/limits.h"

namespace swa_decode::sm90 {

inline constexpr int kHeadDim = static_cast<int>(kGpuHeadDim);
inline constexpr int kKeys = 128;              // whole window in shared memory (window_size <= 128)
inline constexpr int kSlabHeads = 64;          // wgmma M: heads per consumer warpgroup
inline constexpr int kRowBytes = 128;          // one 128-byte swizzle atom row = 64 bf16
inline constexpr int kBlockDims = kRowBytes / 2;  // 64 dims per K/V dim block and per q chunk
inline constexpr int kQChunks = kHeadDim / kBlockDims;  // 8
inline constexpr int kQStages = 4;  // chunks 0-3 of the next token land during this one's PV
inline constexpr int kHalves = 2;
inline constexpr int kHalfDims = kHeadDim / kHalves;      // 256 = the N of one PV wgmma
inline constexpr int kBlocksPerHalf = kHalfDims / kBlockDims;  // 4
inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kThreads = 3 * kWarpgroupThreads;  // WG 0 produces, WG 1 and 2 consume
inline constexpr int kConsumerThreads = 2 * kWarpgroupThreads;
// __launch_bounds__(384, 1) gives every thread 168 registers at launch (64,512 per CTA), and
// setmaxnreg only redistributes those: an increase the CTA's pool cannot cover blocks forever.
// 2 x 200 + 104 = 504 = 3 x 168.
inline constexpr uint32_t kLaunchRegisters = 168;
inline constexpr uint32_t kProducerRegisters = 104;
inline constexpr uint32_t kConsumerRegisters = 200;
static_assert(2 * kConsumerRegisters + kProducerRegisters <= 3 * kLaunchRegisters,
              "setmaxnreg.inc would wait for registers the CTA does not own");
inline constexpr uint32_t kQChunkBytes = kSlabHeads * kRowBytes;  // 8 KiB per TMA
inline constexpr uint32_t kProducerBarrier = 1;  // named barrier id for the producer warpgroup

struct SmemPlan {
  // bf16 K/V rows: [half][64-dim block][key][128 B], 16-byte chunks XOR-swizzled by key % 8.
  // K-major for S = Q K^T, MN-major for O = P V: the same bytes serve both (canonical SW128).
  alignas(1024) uint8_t kv[kHalves][kBlocksPerHalf][kKeys][kRowBytes];
  alignas(1024) uint8_t q[2][kQStages][kSlabHeads][kRowBytes];  // per consumer: TMA SW128 ring
  alignas(128) uint8_t staging[kKeys][kHalfDims];  // e4m3, 16-byte chunks XOR-swizzled by key % 16
  uint32_t row_offset[2][kKeys];  // compacted entries in 16-byte units, double buffered by token
  float inv_scale[2][kKeys];
  int num_valid[2];
  int warp_counts[1];                              // the compaction runs on one warp
  uint64_t q_full[2][kQStages];
  uint64_t kv_full[kHalves];
  uint64_t kv_empty[kHalves];
  uint64_t meta_full[2];
  uint64_t meta_empty[2];
};
// No slack for aligning the base: the plan fills sm_90's 227 KiB per block, and a block's dynamic
// shared memory starts 1024-aligned there (the kernel traps otherwise; every GPU test runs it).
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SmemPlan));
static_assert(kSmemBytes <= 227 * 1024, "sm_90 plan exceeds the 227 KiB select_kernel checks for");

}  // namespace swa_decode::sm90
