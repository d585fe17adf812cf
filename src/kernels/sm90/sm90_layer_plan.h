// Shared-memory plan, work items and barrier counts of the Hopper layer kernel
// (decode_sm90_layer.cuh): the window and an extra KV source in one softmax. The tile geometry,
// thread roles and swizzles are the window kernel's (sm90_plan.h); what differs is that q stays
// resident for a work item while subtiles of 64 entries stream through a two-stage K/V ring, and
// the compacted entries are double buffered per tile of 128 instead of per token.
#pragma once

#include <cstdint>

#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

// A work item is (token, slab of kSlabHeads heads): H <= 64 makes one per token, H in 65..128 two,
// with consecutive ids, which the two CTAs of a LayerPair run together.
constexpr int layer_slabs(int num_heads) { return num_heads > kSlabHeads ? 2 : 1; }

// The consumers take the entries in subtiles of 64 keys: S of 64 keys is 32 fp32 registers on top
// of O's 128, which live across the item's tiles. With S of all 128 keys (64 more) ptxas (CUDA
// 13.0) spilled the consumers 100-200 B even at 224-240 registers, and 224 is the most they can
// get: the producer warpgroup needs 56 (2 x 224 + 56 = 504). A subtile is also the unit of the K/V
// ring: two stages of 64 keys take the 128 KiB that one tile of 128 keys took (v1), so the gather
// warps dequantize subtile u + 1 while the consumers multiply subtile u.
inline constexpr int kSubtileKeys = kKeys / 2;
inline constexpr int kKvStages = 2;

// Two slabs run as a pair: the two CTAs of a cluster, one slab each, take the same items' tokens
// (item = 2 token + cluster rank, with an even grid) and split every subtile's gather and
// dequantization, each CTA writing its 32 keys into its own stage and the peer's. v2 (one CTA per
// item) was bound by its gather warps at ~4.6 us a subtile (docs/perf-notes.md); a pair halves
// that work per CTA and reads each row once from HBM instead of once more from L2, but measured
// 1-4% faster, not the 1.4x predicted (perf-notes, v4). kCtas is 1 for H <= 64, where nothing is
// shared.
//
// v5: in a pair the gather warps split into an issuer (warp 0: cp.async of each subtile's rows
// into a ring of two staging shares, completing on staged_full by cp.async.mbarrier.arrive) and two
// dequantizing warps (1, 2: staging -> the stages), so that the next share's rows are on their way
// while this one is dequantized, and the warp that waits for the next record is not the one that
// dequantizes (v4b deadlocked on that). v8: shares of 16 rows (a pair CTA's 32 keys of a subtile
// in two, a lone CTA's 64 in four), so that staging's rows 32-63 are free for ConsumerExchange,
// and the lone CTA (H <= 64) splits its gather warps too. A pair whose two sources have different
// row formats keeps v4's three gather warps, 32 rows staged at a time (kSplitGatherWarps false,
// launched by decode_sm90_layer.cu): there a stage's RoPE block is written by this CTA's cp.async
// for a kModel1 subtile and by the peer's stores for a seed one, and racecheck reports those
// writes as unordered in v5 (4 hazards, in GpuSm90Layer.Model1RowsInEitherSource, with the
// barriers ordering them as v4's do; perf-notes, v5), not in v4.
inline constexpr int kShareRows = 16;
inline constexpr int kStagingShares = 2;
static_assert(kShareRows % 8 == 0, "a share starts on a multiple of 8 keys (the staging swizzle)");
// Staging's rows from here on hold ConsumerExchange (below): no gather stages into them.
inline constexpr int kExchangeFirstRow = kStagingShares * kShareRows;  // 32

template <int kCtasPerToken, bool kSplitGatherWarps = true, bool kSplitKeysOverCtas = false>
struct LayerPair {
  static_assert(kCtasPerToken == 1 || kCtasPerToken == 2, "one slab or a pair");
  static_assert(!kSplitKeysOverCtas || kSplitGatherWarps, "a key split keeps the split gather (same-format sources)");
  static constexpr int kCtas = kCtasPerToken;
  // KeySplit (below): a token's entries over several CTAs (or pairs) of one cluster.
  static constexpr bool kSplitKeys = kSplitKeysOverCtas;
  static constexpr int kGatherKeys = kSubtileKeys / kCtas;  // keys of each subtile this CTA gathers
  static constexpr bool kSplitGather = kSplitGatherWarps;   // an issuer warp and dequantizing warps
  static constexpr int kIssuerThreads = 32;
  static constexpr int kSharesPerSubtile = kGatherKeys / kShareRows;  // split gather: 2 in a pair, 4 alone
  // The threads that write K/V stages from staging: the dequantizing warps, or all three gather
  // warps (with kIssuerCopiesRope the issuer writes a kModel1 stage's RoPE block too).
  static constexpr int kStageWriters = kSplitGather ? kGatherThreads - kIssuerThreads : kGatherThreads;
  // A pair's split gather hands its keys to the peer's stage by bulk copy (v14p): each CTA's
  // writers store their keys in their own stage, and one of them copies each share into the
  // peer's, completing on the peer's kv_full with complete_tx, which that CTA's first writer arms
  // with expect_tx. v4's gather warps (kSplitGather false) keep the stores into the peer's stage.
  static constexpr bool kPeerBulkCopy = kCtas == 2 && kSplitGather;
  // Who copies a kModel1 stage's RoPE block (64 keys x 128 B, no conversion): in a pair the issuer,
  // which issues 2 shares a subtile and idled 58% of the time while the dequantizing warps, busy
  // with the copy, paced kModel1 subtiles (ncu, session 25; moving it, session 26: C4A H = 128
  // T = 2048 1765 -> 1636 us). A lone CTA's issuer issues 4 shares a subtile; there the move cost
  // 9% (C4A H = 64 T = 2048 647 -> 704 us), so its dequantizing warps keep the copy.
  static constexpr bool kIssuerCopiesRope = kPeerBulkCopy;
  // A stage is full once both CTAs' writers wrote their keys (the peer's by its arrivals or, with
  // kPeerBulkCopy, by its copies' bytes), and free once both CTAs' consumers are done with it.
  // With kIssuerCopiesRope the issuer arrives too (32 arrivals) after a kModel1 stage's RoPE
  // values; for a seed stage the first dequantizing thread makes them (run_dequant_warps).
  static constexpr uint32_t kKvFullArrivals =
      kSplitGather ? kStageWriters + (kIssuerCopiesRope ? kIssuerThreads : 0) : kCtas * kStageWriters;
  static constexpr uint32_t kKvEmptyArrivals = kCtas * kConsumerThreads;
  // The issuer's parity wait on kv_empty (kIssuerCopiesRope) skips seed stages, so it needs the
  // stage's previous use released when it waits: the staging ring keeps the issuer at most one
  // subtile ahead of the dequantizing warps only while it holds fewer shares than 3 subtiles' worth.
  static_assert(!kIssuerCopiesRope || kStagingShares <= 3 * kSharesPerSubtile - 1,
                "the issuer may run ahead of kv_empty's parity");
  static_assert(kGatherKeys % kShareRows == 0, "whole shares a subtile");
  static_assert(kSplitGather || kGatherKeys <= kExchangeFirstRow,
                "v4's gather warps stage the CTA's keys below ConsumerExchange: a pair only");
};

// v15 (session 23; measured in session 24, docs/perf-notes.md): below a wave of work items most SMs idle while each
// item's chain of subtiles runs one after another (H200, T = 8: 64-71 us for 16 pairs, ~6.5 us a
// subtile against 3.1-3.5 at full occupancy). With a key split, the launch runs one item a CTA,
// not persistent: cluster = kCtas x count CTAs, rank = split * kCtas + slab, each CTA (or pair)
// taking a contiguous share of the token's index columns (window first, whole subtiles) and
// parking its unnormalized O and row statistics in its own shared memory for the combine
// (src/common/split_partials.cuh, as the portable kernel's window split does).
struct KeySplit {
  int index;  // this CTA's share
  int count;  // shares of each token: 1 without a split
};
inline constexpr int kMaxLayerClusterCtas = 8;  // the portable cluster size
// Where the partials are parked: O ([64 heads][512 dims] fp32, split_partials.cuh's layout) over
// the K/V ring, the row statistics (64 x float2) over q, both free once the item's last PV is done.
inline constexpr int kPartialsBytes = kSlabHeads * kHeadDim * 4;

// The layer kernel's K/V ring and q: sizeof is 226 KiB, the window kernel's SmemPlan with the two
// consumers' 4-stage q rings (2 x 4 x 8 KiB) turned into the item's whole q (8 x 8 KiB).
struct LayerSmemPlan {
  // bf16 K/V rows of one subtile per stage: [stage][64-dim block][key][128 B], 16-byte chunks
  // XOR-swizzled by key % 8 (canonical SW128: K-major for S, MN-major for PV, as SmemPlan::kv).
  alignas(1024) uint8_t kv[kKvStages][kQChunks][kSubtileKeys][kRowBytes];
  // The item's q: 64 heads x 512 dims in kQChunks TMA boxes of 64 dims x 64 heads, 128-byte swizzle.
  // Consumer 0 reads every chunk for every subtile's S (consumer 1 only multiplies P V, since v8).
  alignas(1024) uint8_t q[kQChunks][kSlabHeads][kRowBytes];
  // e4m3 rows of the subtile being gathered (512 B each), 16-byte chunks XOR-swizzled by key % 8.
  alignas(128) uint8_t staging[kSubtileKeys][kHeadDim];
  // The compacted entries of a tile (16-byte units from its source's kv_cache, inverse scales),
  // double buffered by tile: the compaction writes tile r + 1 while tile r is multiplied.
  uint32_t row_offset[2][kKeys];
  float inv_scale[2][kKeys];
};

// S is computed once (FlashMLA's split of the two math warpgroups): consumer 0 computes S, the
// softmax and its PV half with P in registers, and hands P (bf16, in the layout of a q chunk: 64
// heads x 64 keys, 128-byte swizzle, wgmma's K-major A), each head's rescale factor and, after
// an item, each head's out factor to consumer 1 through these 8.5 KiB in staging's rows 32-63;
// consumer 1 multiplies its PV half from there. Until v8 both consumers computed S.
// Barriers (arrival counts kWarpgroupThreads each; PipeState<1> phases in both consumers):
//   p_full      consumer 0, after writing P and the rescale factors (and a proxy fence)
//   p_empty     consumer 1, after the PV that read them
//   final_full  consumer 0, after writing an item's out factors
//   final_empty consumer 1, after reading them
struct ConsumerExchange {
  alignas(1024) uint8_t p[kSlabHeads][kRowBytes];
  float rescale[kSlabHeads];     // O *= rescale before this subtile's PV
  float out_factor[kSlabHeads];  // the item's finalize_row out_factor
  uint64_t p_full;
  uint64_t p_empty;
  uint64_t final_full;
  uint64_t final_empty;
};
static_assert(sizeof(ConsumerExchange) <= (kSubtileKeys - kExchangeFirstRow) * kHeadDim,
              "the exchange fits staging's rows 32-63");
static_assert(kExchangeFirstRow * kHeadDim % 1024 == 0, "P starts on a swizzle atom");

// The tokens this CTA runs, in order (sm90_layer_schedule.cuh): in staging's rows 32-63 after
// ConsumerExchange, which no gather stages into either. Written by every thread before the roles
// start, then only read. 1024 tokens a unit cover T <= 67,584 on 132 SMs at H = 128; more, and
// the kernel keeps round robin (sorted 0).
inline constexpr int kItemOrderCapacity = 1024;
struct ItemOrder {
  int32_t count;   // this CTA's items
  int32_t sorted;  // 1: item k's token is tokens[k]; 0: first + k * stride (round robin)
  int32_t first;
  int32_t stride;
  int32_t tokens[kItemOrderCapacity];
};
inline constexpr int kItemOrderOffset = (sizeof(ConsumerExchange) + 15) / 16 * 16;  // from staging's row 32
static_assert(kItemOrderOffset + sizeof(ItemOrder) <= (kSubtileKeys - kExchangeFirstRow) * kHeadDim,
              "ItemOrder fits staging's rows 32-63 beside ConsumerExchange");

// What the compaction warp says of each tile it publishes (a "record"). A record never mixes
// sources: the window gives at most one (window_size <= kKeys), the extra source one per 128 index
// columns. An item with no index column in either source gets a single record with num_valid 0.
struct TileRecord {
  int32_t num_valid;   // entries in row_offset / inv_scale of its buffer; 0: nothing to gather or multiply
  int32_t from_extra;  // its row offsets count from p.extra.kv_cache, else from p.window.kv_cache
  int32_t last;        // the item's last record: the consumers finalize and store after it
  int32_t has_q;       // the item has index columns, so the compaction warp loaded its q
};

// The records and the mbarriers (240 B), outside LayerSmemPlan so that smem_layout_of can put them
// in the alignment gap before it. Arrival counts (decode_sm90_layer.cuh initializes them):
//   q_full[c]     1 (compaction lane 0's arrive.expect_tx) + the 8 KiB of chunk c
//   q_empty[c]    kWarpgroupThreads: consumer 0's, each after the item's last wgmma that read chunk c
//   kv_full[s]    LayerPair::kKvFullArrivals: each gather thread of the pair after writing its
//                 share of stage s (with the split gather: this CTA's writers; in a pair also
//                 32 for the issuer, its own after a kModel1 stage's RoPE block, the first
//                 writer's for a seed stage (kIssuerCopiesRope), and the first writer's
//                 expect_tx for the bytes the peer's copies bring)
//   kv_empty[s]   LayerPair::kKvEmptyArrivals: each consumer thread of the pair after its PV on
//                 stage s (its last wgmma that reads it)
//   meta_full[b]  kCompactThreads: the record and the entries of buffer b are written
//   meta_empty[b] kConsumerThreads + kGatherThreads: the consumers read the scales, the gather warps
//                 the row offsets (and everyone the record); with the split gather the issuer
//                 reads the row offsets (its shares, and the RoPE copy with kIssuerCopiesRope),
//                 the dequantizing warps the record (and the row offsets for the RoPE copy alone)
//   staged_full[b], staged_empty[b]: a pair's share b (LayerPair's comment, kShareRows)
struct LayerSmemSync {
  TileRecord record[2];
  int warp_counts[1];  // the compaction runs on one warp
  uint64_t q_full[kQChunks];
  uint64_t q_empty[kQChunks];
  uint64_t kv_full[kKvStages];
  uint64_t kv_empty[kKvStages];
  uint64_t meta_full[2];
  uint64_t meta_empty[2];
  // The staging ring of the split gather (LayerPair::kSplitGather).
  uint64_t staged_full[kStagingShares];   // the issuer's 32 lanes, each once its copies landed
  uint64_t staged_empty[kStagingShares];  // the 64 dequantizing threads, each after reading the share
};
// kv 131072 + q 65536 + staging 32768 + row_offset 1024 + inv_scale 1024 = 231424 B = 226 KiB;
// 2 records (32 B) + 1 count (4 B, padded to 8) + 28 mbarriers x 8 B = 264 B.
static_assert(sizeof(LayerSmemPlan) == 226 * 1024 && sizeof(LayerSmemSync) == 264, "the sizes the comments here use");
static_assert(kPartialsBytes <= sizeof(LayerSmemPlan::kv) && kSlabHeads * (8 + 4) <= sizeof(LayerSmemPlan::q),
              "a key split's partials fit the ring, its row statistics and sinks q");

// Bytes the launch asks for. The records and barriers (264 B) fit every gap that SmemSync's 144 B
// fit but the ones from 144 to 256 B, where they go after the plan instead; the worst case is
// still a base 16 bytes past a 1024 boundary (1008 B of gap + 226 KiB).
inline constexpr int kLayerSmemBytes = static_cast<int>(largest_layout_end<LayerSmemPlan, LayerSmemSync>());
static_assert(kLayerSmemBytes == kSmemBytes, "the worst case named above");
static_assert(every_layout_fits<LayerSmemPlan, LayerSmemSync>(), "smem_layout_of must fit every 16-aligned base");

// Registers after setmaxnreg, within the 3 x 168 the launch gives (sm90_plan.h): 232 + 200 + 72 =
// 504. Consumer 0 holds S, P and O and writes P out (ptxas, CUDA 13.0, spilled it 32 B at the
// 216 both consumers had when both computed S, v2-v7); consumer 1 holds O for its PV alone; the
// producer warpgroup fits 72 with its kModel1 path only at the unroll counts
// sm90_layer_gather.cuh uses.
inline constexpr uint32_t kLayerProducerRegisters = 72;
inline constexpr uint32_t kScorerRegisters = 232;
inline constexpr uint32_t kValueRegisters = 200;
static_assert(kScorerRegisters + kValueRegisters + kLayerProducerRegisters <= 3 * kLaunchRegisters,
              "setmaxnreg.inc would wait for registers the CTA does not own");

// A position in a ring of kStages buffers and the parity of its current use, as CUTLASS's
// PipelineState: the waiters for "full" wait on parity `phase`, the ones for "empty" on phase ^ 1
// (a fresh mbarrier counts its previous phase, parity 1, as complete, so the first wait for an
// empty buffer passes). One stage: the barrier flips with every use.
template <int kStages>
struct PipeState {
  int index = 0;
  uint32_t phase = 0;
  constexpr void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace swa_decode::sm90
