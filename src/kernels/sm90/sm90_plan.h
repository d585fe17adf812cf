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
// The producer warpgroup: warps 0-2 gather and dequantize, warp 3 compacts. The compaction is three
// dependent global round trips (length, indices, scales); on its own warp it runs a token ahead
// instead of sitting between two half refills.
inline constexpr int kGatherThreads = 96;
inline constexpr int kCompactThreads = 32;
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
inline constexpr uint32_t kStageWritersBarrier = 2;  // the layer kernel's dequantizing warps (peer copies)
inline constexpr uint32_t kConsumersBarrier = 3;  // both consumer warpgroups (the layer kernel's key split)

// The 128-byte swizzle of the K/V tile and the q ring (TMA writes it, wgmma reads it with a
// descriptor whose base-offset field is 0) is defined on 1024-byte atoms: 8 rows of 128 B.
inline constexpr uint32_t kSwizzleAtomBytes = 1024;
// All CUDA promises for the start of dynamic shared memory.
inline constexpr uint32_t kDynamicSmemAlign = 16;

// Tiles and compacted window: sizeof is 226 KiB, a multiple of its 1024-byte alignment.
struct SmemPlan {
  // bf16 K/V rows: [half][64-dim block][key][128 B], 16-byte chunks XOR-swizzled by key % 8.
  // K-major for S = Q K^T, MN-major for O = P V: the same bytes serve both (canonical SW128).
  alignas(1024) uint8_t kv[kHalves][kBlocksPerHalf][kKeys][kRowBytes];
  alignas(1024) uint8_t q[2][kQStages][kSlabHeads][kRowBytes];  // per consumer: TMA SW128 ring
  alignas(128) uint8_t staging[kKeys][kHalfDims];  // e4m3, 16-byte chunks XOR-swizzled by key % 16
  uint32_t row_offset[2][kKeys];  // compacted entries in 16-byte units, double buffered by token
  // 4 bytes per compacted entry, double buffered as row_offset. Seed rows: the inverse scale, the
  // consumers' factor. kModel1 rows: the 4 UE8M0 scale bytes of the half being gathered, which the
  // gather warps copy here over the compaction's factor 1 and read back to dequantize the half;
  // the consumers of a kModel1 window read no factor (sm90_consumer.cuh).
  union {
    float inv_scale[2][kKeys];
    uint32_t model1_scales[2][kKeys];
  };
};
// The per-token counts and the mbarriers (144 B), kept out of SmemPlan so that they can sit in
// the gap that aligning SmemPlan leaves before it, or after it when the gap is too small.
struct SmemSync {
  int num_valid[2];
  int warp_counts[1];  // the compaction runs on one warp
  uint64_t q_full[2][kQStages];
  uint64_t kv_full[kHalves];
  uint64_t kv_empty[kHalves];
  uint64_t meta_full[2];
  uint64_t meta_empty[2];
};
// kv 131072 + q 65536 + staging 32768 + row_offset 1024 + inv_scale 1024 = 231424 B = 226 KiB;
// 3 counts (12 B, padded to 16) + 16 mbarriers x 8 B = 144 B.
static_assert(sizeof(SmemPlan) == 226 * 1024 && sizeof(SmemSync) == 144, "the sizes the comments here use");

// Where the two blocks start, in bytes from the dynamic shared-memory base.
struct SmemLayout {
  uint32_t plan_offset;  // base + plan_offset is 1024-aligned
  uint32_t sync_offset;
  uint32_t end;  // bytes used from the base
};

// The layout for a base whose shared-state-space address is base_residue modulo 1024 (a multiple
// of 16): Plan at the next 1024-aligned address, Sync in the gap before it when the gap (0 to
// 1008 B) holds it, else right after it. Both kernels use it: SmemPlan / SmemSync here, the layer
// kernel's LayerSmemPlan / LayerSmemSync in sm90_layer_plan.h.
template <typename Plan, typename Sync>
constexpr SmemLayout smem_layout_of(uint32_t base_residue) {
  static_assert(sizeof(Plan) % kSwizzleAtomBytes == 0 && alignof(Plan) == kSwizzleAtomBytes,
                "Sync goes right after Plan");
  static_assert(alignof(Sync) <= kDynamicSmemAlign, "Sync goes at 16-byte offsets");
  const uint32_t plan_offset = (kSwizzleAtomBytes - base_residue % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  const uint32_t plan_end = plan_offset + static_cast<uint32_t>(sizeof(Plan));
  if (plan_offset >= sizeof(Sync)) return SmemLayout{plan_offset, 0, plan_end};
  return SmemLayout{plan_offset, plan_end, plan_end + static_cast<uint32_t>(sizeof(Sync))};
}
constexpr SmemLayout smem_layout(uint32_t base_residue) { return smem_layout_of<SmemPlan, SmemSync>(base_residue); }

// Bytes the launch asks for: the largest end over every base residue. For SmemPlan the worst is a
// base 16 bytes past a 1024 boundary: 1008 bytes of gap (SmemSync inside it) + 226 KiB = 232432 B,
// 16 below sm_90's 227 KiB per block. The kernel then runs wherever the base lies, instead of trapping.
template <typename Plan, typename Sync>
constexpr uint32_t largest_layout_end() {
  uint32_t end = 0;
  for (uint32_t residue = 0; residue < kSwizzleAtomBytes; residue += kDynamicSmemAlign) {
    const uint32_t this_end = smem_layout_of<Plan, Sync>(residue).end;
    end = this_end > end ? this_end : end;
  }
  return end;
}
inline constexpr int kSmemBytes = static_cast<int>(largest_layout_end<SmemPlan, SmemSync>());
static_assert(kSmemBytes == 1008 + 226 * 1024, "the worst case named above");
static_assert(kSmemBytes <= 227 * 1024, "sm_90 allows 227 KiB of shared memory per block (sm90_record.cpp checks the device)");

// For every residue: Plan 1024-aligned, Sync aligned, the two disjoint, both inside the bytes the
// launch asks for (tests/cpu/test_sm90_smem_layout.cpp checks every member the same way).
template <typename Plan, typename Sync>
constexpr bool layout_fits(uint32_t residue) {
  const SmemLayout layout = smem_layout_of<Plan, Sync>(residue);
  const uint32_t plan_end = layout.plan_offset + static_cast<uint32_t>(sizeof(Plan));
  const uint32_t sync_end = layout.sync_offset + static_cast<uint32_t>(sizeof(Sync));
  return (residue + layout.plan_offset) % kSwizzleAtomBytes == 0 &&
         (residue + layout.sync_offset) % alignof(Sync) == 0 &&
         (sync_end <= layout.plan_offset || plan_end <= layout.sync_offset) && plan_end <= layout.end &&
         sync_end <= layout.end && layout.end <= largest_layout_end<Plan, Sync>();
}
template <typename Plan, typename Sync>
constexpr bool every_layout_fits() {
  for (uint32_t residue = 0; residue < kSwizzleAtomBytes; residue += kDynamicSmemAlign) {
    if (!layout_fits<Plan, Sync>(residue)) return false;
  }
  return true;
}
static_assert(every_layout_fits<SmemPlan, SmemSync>(), "smem_layout must fit every 16-aligned base");

}  // namespace swa_decode::sm90
