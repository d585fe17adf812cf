// Shared-memory plan of the portable kernel, in plain C++ so that the kernel selection (host code,
// no CUDA headers) sizes the staging ring from the same numbers the kernel uses.
#pragma once

#include <cstdint>

#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"  // the kModel1 layout's numbers

namespace swa_decode::portable {

inline constexpr int kHeadDim = static_cast<int>(kGpuHeadDim);
inline constexpr int kHeadsPerGroup = 16;     // the M of one mma.sync
inline constexpr int kWarpsPerGroup = 4;      // head-dim quarters
inline constexpr int kKeysPerTile = 32;
inline constexpr int kMaxWindow = static_cast<int>(swa_decode::kMaxWindow);
inline constexpr int kMinStages = 2;
inline constexpr int kMaxStages = 4;
inline constexpr int kStageBytes = kKeysPerTile * kHeadDim;  // 16 KiB of raw e4m3 rows
// A staging buffer of kModel1 rows (docs/semantics.md, "Row formats"; tile_staging.cuh): the first
// 512 bytes of each row (e4m3 dims 0..447, RoPE dims 448..479) laid out as a kE4m3 stage lays out
// its rows, then the rows' last 64 bytes (RoPE dims 480..511), then their 8-byte scale rows:
// 32 x 584 = 18,688 bytes, 2,304 more than a kE4m3 stage.
inline constexpr int kModel1RowTailBytes = static_cast<int>(kModel1RowBytes) - kHeadDim;  // 64
inline constexpr int kModel1TailOffset = kStageBytes;
inline constexpr int kModel1ScalesOffset = kModel1TailOffset + kKeysPerTile * kModel1RowTailBytes;  // 18,432
inline constexpr int kModel1StageBytes = kModel1ScalesOffset + kKeysPerTile * static_cast<int>(kModel1ScaleRowBytes);
static_assert(kModel1StageBytes == 18688 && kModel1StageBytes % 128 == 0, "32 rows of 584 bytes, stages 128-aligned");
// A CTA's q, held in shared memory as ready-made mma A fragments: 16 heads x 512 dims of bf16 per
// group. Keeping it out of registers (32 per thread) is what lets two CTAs share an SM.
inline constexpr int kQBytesPerGroup = kHeadsPerGroup * kHeadDim * 2;  // 16 KiB
// The partial-score exchange (4 warps x 16 x 32 fp32 per group) reuses the stage its tile was
// dequantized from, so it needs no space of its own; it must fit there.
static_assert(2 * kWarpsPerGroup * 16 * 32 * 4 <= kStageBytes, "two groups' partial scores fill one stage");

// Row maxima and bf16 probabilities a group's warps swap each tile (group_softmax.cuh).
inline constexpr int kGroupExchangeBytes = 16 * kWarpsPerGroup * 4 + kWarpsPerGroup * 32 * 8;

// Fixed part: the f16 tile, and per group q's fragments, the exchange and the sinks; the
// compaction's warp counts; the extra source's walk (5 words, decode_portable.cuh). The walk
// fits in what the rounding to 128 bytes left at one and two groups, so no plan grew for it.
inline constexpr int kExtraWalkBytes = 5 * 4;
constexpr int fixed_smem_bytes(int head_groups) {
  const int tile = kKeysPerTile * kHeadDim * 2;
  const int q = head_groups * (kQBytesPerGroup + kGroupExchangeBytes + kHeadsPerGroup * 4);
  const int warp_counts = head_groups * kWarpsPerGroup * 4;
  return (tile + q + warp_counts + kExtraWalkBytes + 127) / 128 * 128;
}
static_assert(fixed_smem_bytes(1) == 50560 && fixed_smem_bytes(2) == 68352,
              "the fixed plan of issue 10 (the extra walk took no new bytes)");

// With an extra source (DeepSeek-V4's compressed entries, up to kMaxExtraEntries = 16384 columns a
// token), the token's entries do not fit one compacted list (12 bytes an entry: 192 KiB at 16384).
// The kernel walks them in chunks: the window, then the extra columns kExtraChunkColumns at a
// time, each compacted into the same list and run through the same ring and online softmax.
// 1024 columns take 12 KiB of list, which still lets every configuration keep the stages and CTAs
// per SM it has with a window of 1024 (static_asserts below): on sm_90 two CTAs per SM with
// 2 stages at two groups (113,408 of 115,712 bytes) or 3 at one (112,000); sm_86/89/120's 99 KiB
// one group with 2 stages (95,616 of 101,376; a window-only W = 128 launch has 3 there, which
// leave room for 138 entries). A chunk boundary costs a CTA its compaction (two dependent global
// round trips) and the ring's refill, ~3 us, while the SM's other CTA computes; a chunk of 32
// tiles takes ~75 us (H200, portable v11: ~2.4 us a tile per CTA at two per SM), so ~4% of a CTA's
// time, twice that at 512 columns, and 2048 would cost sm_90 its second CTA per SM.
inline constexpr int kExtraChunkColumns = 1024;
static_assert(kMaxWindow <= kExtraChunkColumns, "the list of an extra-source launch holds the whole window too");

// Entries the compacted list holds: the window's, or with an extra source one chunk of its
// columns (which also holds any window).
constexpr int compacted_list_entries(int window_size, bool has_extra) {
  return has_extra ? kExtraChunkColumns : window_size;
}

// The row formats of a launch's sources (a template axis of the kernel: a kModel1 source makes
// its tiles bf16, decode_portable.cuh). extra_model1 is false without an extra source.
struct SourceFormats {
  bool window_model1 = false;
  bool extra_model1 = false;
  constexpr bool any_model1() const { return window_model1 || extra_model1; }
};

// What the staging ring and the compacted list of a launch hold. Every entry has an 8-byte row
// offset (a kModel1 entry: its block and its offset in the block); only kE4m3 entries have an
// inv_scale (a kModel1 row's scales are in its block's footer and travel with the row). Listing
// none for kModel1 is what keeps sm_90's second CTA per SM with the larger kModel1 stages:
// 68,352 + 2 x 18,688 + 1024 x 8 = 113,920 of 115,712 bytes at two groups with an extra source
// (1024 x 12 would need 118,016).
struct ListShape {
  int entries;        // compacted_list_entries
  int scale_entries;  // the kE4m3 sources' share: a kE4m3 window's, or a kE4m3 extra source's chunk
  int stage_bytes;    // kStageBytes, or kModel1StageBytes when either source is kModel1
};
constexpr ListShape list_shape(int window_size, bool has_extra, SourceFormats formats = {}) {
  const int window_scales = formats.window_model1 ? 0 : window_size;
  const int extra_scales = has_extra && !formats.extra_model1 ? kExtraChunkColumns : 0;
  return ListShape{compacted_list_entries(window_size, has_extra),
                   window_scales > extra_scales ? window_scales : extra_scales,
                   formats.any_model1() ? kModel1StageBytes : kStageBytes};
}

struct RingPlan {
  int staging_offset;     // bytes from the start of shared memory, 128-aligned
  int row_offset_offset;  // int64_t[list.entries]: compacted entries' byte offsets in their source's cache
  int inv_scale_offset;   // float[list.scale_entries]
  int total_bytes;
};

constexpr RingPlan ring_plan(int head_groups, int num_stages, ListShape list) {
  const int staging = fixed_smem_bytes(head_groups);
  const int row_offset = staging + num_stages * list.stage_bytes;
  const int inv_scale = row_offset + list.entries * 8;
  return RingPlan{staging, row_offset, inv_scale, inv_scale + list.scale_entries * 4};
}
static_assert(ring_plan(1, kMinStages, list_shape(kMaxWindow, false)).total_bytes <= 99 * 1024 &&
                  ring_plan(1, kMinStages, list_shape(kMaxWindow, true)).total_bytes <= 99 * 1024 &&
                  ring_plan(1, kMinStages, list_shape(kMaxWindow, false, {true, false})).total_bytes <= 99 * 1024 &&
                  ring_plan(1, kMinStages, list_shape(kMaxWindow, true, {true, false})).total_bytes <= 99 * 1024 &&
                  ring_plan(1, kMinStages, list_shape(kMaxWindow, true, {false, true})).total_bytes <= 99 * 1024,
              "one head group with two stages must fit sm_86/89/120's 99 KiB at any window, with or without an extra "
              "source, in either format");

// Shared memory one CTA may use so that two share an SM. An SM has 1 KiB more than the per-block
// opt-in limit (228 vs 227 KiB on sm_90, 164 vs 163 on sm_80) and reserves 1 KiB per resident block.
constexpr int64_t two_ctas_per_sm_budget(int64_t smem_optin_bytes) {
  return (smem_optin_bytes + 1024) / 2 - 1024;
}

// Stages (kMinStages..kMaxStages, never more than the list has tiles) for `head_groups`: the most
// that still let two CTAs share an SM, since a second CTA hides one CTA's barriers and gather
// latency better than a deeper ring does; where even kMinStages cannot be shared, the most that
// fit one CTA. 0 if kMinStages does not fit at all.
constexpr int choose_stages(int head_groups, ListShape list, int64_t smem_optin_bytes) {
  const int tiles = (list.entries + kKeysPerTile - 1) / kKeysPerTile;
  const int64_t shared = two_ctas_per_sm_budget(smem_optin_bytes);
  const int64_t budget = ring_plan(head_groups, kMinStages, list).total_bytes <= shared ? shared : smem_optin_bytes;
  if (ring_plan(head_groups, kMinStages, list).total_bytes > budget) return 0;
  int stages = kMinStages;
  while (stages < kMaxStages && stages < tiles && ring_plan(head_groups, stages + 1, list).total_bytes <= budget) {
    ++stages;
  }
  return stages;
}
// sm_90 (227 KiB opt-in): an extra source's 1024-entry list keeps the window's stages (W = 128)
// and two CTAs per SM, in the seed format and with kModel1 rows in the extra source or in both
// (the engines' layers); so does a window of kModel1 rows alone. A kModel1 window with a kE4m3
// extra source lists 1024 inv_scales too: it runs one group a CTA (portable_record.cpp), with 2
// stages instead of 3 (3 would take 118,912 bytes), still two CTAs per SM.
inline constexpr int64_t kSm90SmemOptinBytes = 227 * 1024;
constexpr bool keeps_seed_stages_and_two_ctas(SourceFormats formats, bool has_extra) {
  for (int head_groups = 1; head_groups <= 2; ++head_groups) {
    const ListShape list = list_shape(128, has_extra, formats);
    const int stages = choose_stages(head_groups, list, kSm90SmemOptinBytes);
    if (stages != choose_stages(head_groups, list_shape(128, false), kSm90SmemOptinBytes) ||
        ring_plan(head_groups, stages, list).total_bytes > two_ctas_per_sm_budget(kSm90SmemOptinBytes)) {
      return false;
    }
  }
  return true;
}
static_assert(keeps_seed_stages_and_two_ctas({}, true) && keeps_seed_stages_and_two_ctas({true, false}, false) &&
                  keeps_seed_stages_and_two_ctas({false, true}, true) && keeps_seed_stages_and_two_ctas({true, true}, true),
              "an extra source or kModel1 rows must not cost sm_90 a stage or its second CTA per SM");

// CTAs that split each token's list (one thread-block cluster of 4 or 8, window_split_combine.cuh: the
// window's tiles and the extra source's columns), else 1. Clusters need sm_90.
// A window alone: 4 when the split grid stays within a quarter of the SMs and the window has 4
// tiles of 32 keys. Measured on the H200 (docs/perf-notes.md, portable v11): splitting 8 CTAs 4 ways
// saves 1.0-1.3 us (H = 128, T = 1: 12.6 -> 11.6 us; H = 16, T = 8: 13.0 -> 11.9 us), while 32 CTAs
// split 4 ways and every 2-way split were slower than no split.
// With an extra source of at least 4 tiles (a C4A or C128A layer: 500-8000 entries a token, each
// CTA's serial chain of tiles 4x shorter): 4 while the split grid fits two CTAs per SM (the ring's
// budget, keeps_seed_stages_and_two_ctas). Measured on the H200 (perf-notes, portable v14): T = 8
// C4A H = 128 66.9 -> 53.9 us, C4A H = 64 41.9 -> 25.3, C128A 64k H = 128 63.2 -> 39.7; 512 split
// CTAs (T = 32) were slower: C4A H = 128 81.1 -> 97.0, H = 64 42.9 -> 52.6.
// 8 ways, with an extra source of at least 8 tiles, where the 8-way grid fills at most half the
// SMs, or, with at least kHeavyExtraTiles, where it is at most two CTAs per SM. Tiles here are the
// extra source's columns (extra.max_entries, a capacity the caller passes) / 32. Every CTA still
// compacts the whole window, then runs its share of the window's tiles and of the extra columns (at
// C4A H = 128, T = 1 ranks 0-3 run 1 + 4 tiles of 32 keys and ranks 4-7 run 4, against 1 + 8 on each
// of 4 ranks). Measured on the H200 (perf-notes, session 25), split 8 vs 4 ways: T = 1 (64 or 32
// CTAs) C4A H = 128 26.3 -> 21.7 us, C4A H = 64 20.8 -> 19.1, C128A 64k 20.9 -> 19.1; 128 CTAs
// no gain (C4A H = 128 T = 2 26.4 vs 26.6) or a loss (C4A H = 64 T = 4 21.2 -> 23.2); 256 CTAs
// lost at 16-32 tiles (C4A H = 128 T = 4 32.4 -> 42.7, C128A 64k T = 4 28.2 -> 36.3, H = 64 T = 8
// 24.8 -> 36.6: 32 clusters of 8, and cudaOccupancyMaxActiveClusters gives 30 at 113 KiB) but won at
// 512 (C128A 1M, 16384 columns: T = 4 193 -> 123). 128 is the midpoint of 32 and 512 in log scale;
// nothing between them was measured.
inline constexpr int kMaxWindowSplits = 8;   // the combine's capacity (one portable cluster)
inline constexpr int kWindowAloneSplits = 4;  // a window alone: the 4 ways measured (portable v11)
inline constexpr int64_t kHeavyExtraTiles = 128;  // 4096 columns: C128A from a 512k context
constexpr int choose_window_splits(int64_t ctas, int window_size, int64_t extra_entries, int64_t num_sms,
                                   int cc_major) {
  if (cc_major < 9) return 1;
  const int64_t extra_tiles = (extra_entries + kKeysPerTile - 1) / kKeysPerTile;
  const int64_t eight_way_grid = ctas * kMaxWindowSplits;
  if (extra_tiles >= kMaxWindowSplits &&
      (eight_way_grid <= num_sms / 2 || (extra_tiles >= kHeavyExtraTiles && eight_way_grid <= 2 * num_sms))) {
    return kMaxWindowSplits;
  }
  if (extra_tiles >= kWindowAloneSplits) return ctas * kWindowAloneSplits <= 2 * num_sms ? kWindowAloneSplits : 1;
  const int tiles = (window_size + kKeysPerTile - 1) / kKeysPerTile;
  if (tiles < kWindowAloneSplits || ctas * kWindowAloneSplits > num_sms / 4) return 1;
  return kWindowAloneSplits;
}

}  // namespace swa_decode::portable
