// Portable tensor-core decode kernel: mma.sync m16n8k16 f16 or bf16, cp.async, ldmatrix (sm_80 and
// newer).
//
// Grid: (token, block of 16 * kHeadGroups heads). One CTA gathers and dequantizes each valid KV row
// of its token once for all the heads it holds. Each 16-head group is split over 4 warps by head-dim
// quarters (128 dims each) so that a warp's output accumulator is 16 x 128 fp32 = 64 registers
// instead of 256; the 4 partial score tiles meet in shared memory and each warp finishes the
// softmax of a quarter of the keys (group_softmax.cuh). q waits in shared memory as ready-made A
// fragments, so a thread needs at most 128 registers and two CTAs share an SM: one CTA's barriers
// and gather latency hide under the other's matmuls (docs/perf-notes.md, portable v5). The tensor
// cores run f16 (q_f16.cuh says why and how q is scaled exactly), or bf16 where a source holds
// kModel1 rows (see decode_portable_kernel). Keys stream in tiles of 32 with an
// online softmax through a ring of 2-4 staging buffers. On sm_90 the smallest batches (at most 8
// CTAs) split each window over a cluster of 4 CTAs instead, a layer's token over 4 or 8
// (window_split_combine.cuh, portable_plan.h's choose_window_splits). With an
// extra source (DeepSeek-V4's compressed entries) its entries follow the window's through the same
// tiles and softmax, compacted 1024 columns at a time (portable_plan.h, kExtraChunkColumns).
#pragma once

#include <cstdint>

#include "src/common/dim_permutation.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/kernel_launch.h"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/portable/launch_portable.h"
#include "src/kernels/portable/portable_plan.h"
#include "src/kernels/portable/group_softmax.cuh"
#include "src/kernels/portable/q_f16.cuh"
#include "src/kernels/portable/tile_staging.cuh"
#include "src/kernels/portable/window_split_combine.cuh"

namespace swa_decode::portable {

inline constexpr int kDimsPerWarp = kHeadDim / kWarpsPerGroup;  // 128

// With an extra source: what the CTA needs between the window's tiles, the chunks and the
// epilogue, kept in shared memory instead of in registers across the tile loop, where the
// two-group kernel has none to spare on sm_90 (128). Written by thread 0 only, before a barrier
// that precedes every read of the new value.
struct ExtraWalk {
  int token;
  int head_block;
  int next_column;       // this CTA's next extra column to compact
  int end_column;        // one past its last
  float inv_value_norm;  // 1 / value_norm over the entries so far (group_softmax.cuh)
};

// The compacted list's entries as compact_columns writes them for a source: byte offsets of kE4m3
// rows, or the block and offset of kModel1 ones (SlotInBlock), both 8 bytes in the same place.
template <bool kModel1>
__device__ __forceinline__ auto listed_entries(int64_t* s_row_offset) {
  static_assert(sizeof(SlotInBlock) == sizeof(int64_t), "one list layout for both formats");
  if constexpr (kModel1) {
    return reinterpret_cast<SlotInBlock*>(s_row_offset);
  } else {
    return s_row_offset;
  }
}

// Fixed part of the shared-memory plan; the staging ring and the compacted list follow it
// (ring_plan in portable_plan.h), sized at launch by the number of stages and the list's entries.
template <int kHeadGroups>
struct SmemPlan {
  static constexpr int kWarps = kHeadGroups * kWarpsPerGroup;
  alignas(128) uint16_t kv[kKeysPerTile][kHeadDim];              // f16 or bf16, swizzled, dim-permuted
  alignas(16) uint4 q_frags[kWarps][kDimsPerWarp / 16][32];      // [warp][k-step][lane]: A fragments
  alignas(16) GroupExchange exchange[kHeadGroups];
  float sinks[kHeadGroups * kHeadsPerGroup];  // read at the start, used at the end
  int warp_counts[kWarps];
  ExtraWalk extra;  // with an extra source only
};

static_assert(sizeof(SmemPlan<1>) <= fixed_smem_bytes(1) && sizeof(SmemPlan<2>) <= fixed_smem_bytes(2) &&
                  sizeof(ExtraWalk) == kExtraWalkBytes,
              "portable_plan.h must cover the fixed shared-memory plan");

// Where a thread's output accumulator (16 x 4 fp32) waits while an extra chunk is compacted:
// 16-byte piece i of thread t at [i * kThreads + t] (a warp's stores hit consecutive banks), the
// first pieces in the f16 tile (32 KiB) and the rest in the staging ring's first stages.
template <int kThreads>
__device__ __forceinline__ float4* parked_piece(int i, uint16_t* tile, uint8_t* staging) {
  constexpr int kTilePieces = kKeysPerTile * kHeadDim * 2 / 16 / kThreads;  // 8 at two groups, 16 at one
  static_assert((kDimsPerWarp / 8 - kTilePieces) * kThreads * 16 <= kMinStages * kStageBytes, "parked accumulators fit");
  return i < kTilePieces ? reinterpret_cast<float4*>(tile) + i * kThreads + threadIdx.x
                         : reinterpret_cast<float4*>(staging) + (i - kTilePieces) * kThreads + threadIdx.x;
}
template <int kThreads>
__device__ __forceinline__ void park_accumulators(const float (&o_acc)[kDimsPerWarp / 8][4], uint16_t* tile, uint8_t* staging) {
#pragma unroll
  for (int i = 0; i < kDimsPerWarp / 8; ++i) {
    *parked_piece<kThreads>(i, tile, staging) = make_float4(o_acc[i][0], o_acc[i][1], o_acc[i][2], o_acc[i][3]);
  }
}
template <int kThreads>
__device__ __forceinline__ void unpark_accumulators(float (&o_acc)[kDimsPerWarp / 8][4], uint16_t* tile, uint8_t* staging) {
#pragma unroll
  for (int i = 0; i < kDimsPerWarp / 8; ++i) {
    const float4 piece = *parked_piece<kThreads>(i, tile, staging);
    o_acc[i][0] = piece.x;
    o_acc[i][1] = piece.y;
    o_acc[i][2] = piece.z;
    o_acc[i][3] = piece.w;
  }
}

// Two CTAs per SM on sm_90 (portable_plan.h sizes shared memory for that): at two head groups
// (256 threads) that caps a thread at 128 registers, which the kernel fits without spilling there.
// sm_80/86/89/120 have too little shared memory for two CTAs anyway; sm_100 could hold two, but
// its ptxas spills at 128 registers and it is compile-only here, so it keeps one until measured.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
inline constexpr int kPortableMinCtasPerSm = 2;
#else
inline constexpr int kPortableMinCtasPerSm = 1;
#endif
// kSplitWindow: the CTAs of a cluster split the window's tiles and the extra source's columns
// (window_split_combine.cuh); the grid's x is then token * cluster size + rank.
// kHasExtra: p.extra is present (its kv_cache is not null). Its entries join the window's in the
// same online softmax, compacted and run kExtraChunkColumns columns at a time after the window's
// tiles (portable_plan.h). A template argument, not a runtime branch, so that a window-only launch
// runs exactly the window-only code: the chunk loop's state would otherwise be live across the
// tile loop of a kernel already at its 128-register cap (two groups on sm_90).
// kWindowModel1, kExtraModel1: the window's (the extra source's) rows are kModel1 (docs/semantics.md,
// "Row formats"; kExtraModel1 only with kHasExtra). A kModel1 element is e4m3 * 2^(scale - 127),
// per 64 dims, which f16 does not always hold, or a bf16 RoPE value, which f16 may not hold at
// all: with either source in kModel1 every tile is bf16 (a kE4m3 source's codes are exact in bf16
// too), q is its own bf16 values and P is bf16. Template arguments, so that the seed-format
// kernels stay what they were; in a launch with one source of each format the tile loop is built
// once per format, and the two copies need more than the two-group kernel's 128 registers on
// sm_90 (16-32 bytes of spills), so such a launch runs one group a CTA.
template <int kHeadGroups, bool kSplitWindow, bool kHasExtra, bool kWindowModel1, bool kExtraModel1>
__global__ void __launch_bounds__(kHeadGroups * kWarpsPerGroup * 32, kPortableMinCtasPerSm)
    decode_portable_kernel(const __grid_constant__ DecodeParams p, int num_stages) {
  static_assert(kHasExtra || !kExtraModel1, "an extra source's format needs an extra source");
  static_assert(!kHasExtra || kWindowModel1 == kExtraModel1 || kHeadGroups == 1,
                "one source of each format: one head group (portable_record.cpp, plan)");
  constexpr int kThreads = kHeadGroups * kWarpsPerGroup * 32;
  constexpr bool kBf16 = kWindowModel1 || kExtraModel1;
  constexpr SourceFormats kFormats{kWindowModel1, kExtraModel1};
  constexpr int kStage = list_shape(1, kHasExtra, kFormats).stage_bytes;
  using Smem = SmemPlan<kHeadGroups>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const RingPlan ring = ring_plan(kHeadGroups, num_stages, list_shape(p.window.max_entries, kHasExtra, kFormats));
  uint8_t* const staging = smem_raw + ring.staging_offset;
  int64_t* s_row_offset = reinterpret_cast<int64_t*>(smem_raw + ring.row_offset_offset);
  float* s_inv_scale = reinterpret_cast<float*>(smem_raw + ring.inv_scale_offset);

  // CTAs start in blockIdx.x-fastest order; numbering them token-major makes the head blocks of
  // one token neighbours, so their gathers of the same window rows meet in L2 instead of HBM.
  const int64_t cta = blockIdx.x + static_cast<int64_t>(blockIdx.y) * gridDim.x;
  const int token = kSplitWindow ? static_cast<int>(blockIdx.x) / ptx::cluster_size() : static_cast<int>(cta / gridDim.y);
  const int head_block = kSplitWindow ? static_cast<int>(blockIdx.y) : static_cast<int>(cta % gridDim.y);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int quarter = warp % kWarpsPerGroup;
  const int group = warp / kWarpsPerGroup;
  const int head_base = (head_block * kHeadGroups + group) * kHeadsPerGroup;
  const int frag_row = lane / 4;   // g: fragment rows g and g + 8
  const int frag_quad = lane % 4;  // q: fragment columns 2q, 2q + 1
  const int head_lo = head_base + frag_row;
  const int head_hi = head_lo + 8;
  const int dim_base = quarter * kDimsPerWarp;

  // Nothing above reads global memory; q may be what the kernel before this one wrote.
  ptx::wait_for_prior_grid();
  ptx::let_dependent_grid_launch();

  // q first: its latency hides under the index compaction below.
  uint4 q_lo[kDimsPerWarp / kDimGroup], q_hi[kDimsPerWarp / kDimGroup];  // rows g, g + 8: dims 8q..8q+7 per group
  {
    const __nv_bfloat16* q_token = p.q + token * p.stride_q_token + dim_base + 8 * frag_quad;
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      q_lo[c] = head_lo < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_lo * p.stride_q_head + c * kDimGroup) : zero;
      q_hi[c] = head_hi < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_hi * p.stride_q_head + c * kDimGroup) : zero;
    }
  }

  // Sinks are fetched now and parked in shared memory by the group's first warp (the group
  // barriers before the epilogue publish them), so the epilogue does not wait on a global load.
  if (quarter == 0 && lane < kHeadsPerGroup) {
    const int head = head_base + lane;
    smem.sinks[group * kHeadsPerGroup + lane] = p.attn_sink != nullptr && head < p.num_heads ? p.attn_sink[head] : -INFINITY;
  }
  if (kHasExtra && threadIdx.x == 0) {  // published by the barrier before the chunks
    smem.extra.token = token;
    smem.extra.head_block = head_block;
  }
  // The extra source's length is loaded now, so that its latency hides under the window's compaction.
  const int extra_columns = kHasExtra ? token_columns(p.extra, token) : 0;
  const int window_entries =
      compact_window<kThreads>(p.window, token, static_cast<int>(threadIdx.x), [] { __syncthreads(); },
                               listed_entries<kWindowModel1>(s_row_offset), s_inv_scale, smem.warp_counts);

  // Each head's power-of-two scale into f16 (q_f16.cuh): its largest |q| over the 4 quarters.
  // bf16 tiles take q's own bf16 values.
  float row_logit[2];
  if constexpr (kBf16) {
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      const QFragmentPair pair = q_words_to_fragments(q_lo[c], q_hi[c]);
      smem.q_frags[warp][2 * c][lane] = make_uint4(pair.kstep0[0], pair.kstep0[1], pair.kstep0[2], pair.kstep0[3]);
      smem.q_frags[warp][2 * c + 1][lane] = make_uint4(pair.kstep1[0], pair.kstep1[1], pair.kstep1[2], pair.kstep1[3]);
    }
    row_logit[0] = row_logit[1] = p.scale * kLog2e;
  } else {
    GroupExchange& ex = smem.exchange[group];
    const float quarter_max[2] = {quad_max(bf16_max_magnitude(q_lo)), quad_max(bf16_max_magnitude(q_hi))};
    if (frag_quad == 0) {
      ex.row_max[frag_row][quarter] = quarter_max[0];
      ex.row_max[frag_row + 8][quarter] = quarter_max[1];
    }
    group_barrier(group);
    float q_scale[2];
    bool scaled = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 m = *reinterpret_cast<const float4*>(&ex.row_max[frag_row + 8 * h][0]);
      const int k = q_scale_exponent(fmaxf(fmaxf(m.x, m.y), fmaxf(m.z, m.w)));
      scaled = scaled || k != 0;
      q_scale[h] = exp2_int(k);
      row_logit[h] = p.scale * kLog2e * exp2_int(-k);
    }
    scaled = __any_sync(0xFFFFFFFFu, scaled);
    // Parked in shared memory as A fragments in register order: each lane later reloads its own
    // 16 bytes per k-step, so no barrier is needed between these stores and those loads.
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      const QFragmentPair pair =
          scaled ? q_words_to_fragments(bf16x8_to_scaled_f16x8(q_lo[c], q_scale[0]), bf16x8_to_scaled_f16x8(q_hi[c], q_scale[1]))
                 : q_words_to_fragments(bf16x8_to_f16x8(q_lo[c]), bf16x8_to_f16x8(q_hi[c]));
      smem.q_frags[warp][2 * c][lane] = make_uint4(pair.kstep0[0], pair.kstep0[1], pair.kstep0[2], pair.kstep0[3]);
      smem.q_frags[warp][2 * c + 1][lane] = make_uint4(pair.kstep1[0], pair.kstep1[1], pair.kstep1[2], pair.kstep1[3]);
    }
  }
  // value_norm from the window's largest |inv_scale| (group_softmax.cuh), reduced by every warp on
  // its own.
  float value_norm = value_norm_of(listed_scale_magnitude<kWindowModel1>(s_inv_scale, window_entries, lane));
  float inv_value_norm = 1.0f / value_norm;

  const int window_tiles = (window_entries + kKeysPerTile - 1) / kKeysPerTile;
  // This CTA's window tiles: all of them, or its rank's share of a split window.
  int tile_begin = 0;
  int tile_end = window_tiles;
  if constexpr (kSplitWindow) {
    const int per_rank = (window_tiles + ptx::cluster_size() - 1) / ptx::cluster_size();
    tile_begin = min(ptx::cluster_rank() * per_rank, window_tiles);
    tile_end = min(tile_begin + per_rank, window_tiles);
  }
  // With an extra source both sources' rows are copied at the width both allow, so that one copy
  // of the tile loop serves the window and every chunk (below). kModel1 rows are always copied 16
  // bytes at a time: the width is that of the kE4m3 source.
  const int copy_width = kHasExtra && !kWindowModel1 && !kExtraModel1 ? min(kv_copy_width(p.window), kv_copy_width(p.extra))
                         : kWindowModel1 && kHasExtra                 ? kv_copy_width(p.extra)
                                                                      : kv_copy_width(p.window);

  float o_acc[kDimsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  RowState row_state;

  const uint32_t kv_base = ptx::smem_addr(&smem.kv[0][0]);
  const int matrix = lane / 8;  // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  const SwizzledRows qk_rows =
      swizzled_rows(kv_base, 8 * (matrix >> 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix & 1));
  const SwizzledRows pv_rows =
      swizzled_rows(kv_base, 8 * (matrix & 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix >> 1));

  // Where the listed rows are (tile_staging.cuh): kE4m3 rows at offsets from the window's cache (an
  // extra source's carry the distance between the caches), kModel1 rows at their source's blocks.
  const OffsetRows seed_rows{p.window.kv_cache, s_row_offset};
  const auto model1_rows = [&](const KvSourceParams& src) {
    return Model1Rows{src.kv_cache, listed_entries<true>(s_row_offset), src.stride_kv_block, src.block_size};
  };

  // Runs tiles [tile_begin, tile_end) of the compacted list (num_valid entries, where `rows` says:
  // OffsetRows from p.window.kv_cache, copied copy_width bytes at a time, or Model1Rows of one
  // source) through the staging ring and the online softmax. The ring starts empty and ends with
  // only empty copy groups in flight, so the window and each chunk of the extra source run one
  // after the other through the same code.
  const auto run_tiles = [&](const auto& rows, int copy_width, int num_valid, int tile_begin, int tile_end) {
    constexpr bool kModel1Rows = std::remove_reference_t<decltype(rows)>::kModel1;
    const int num_tiles = (num_valid + kKeysPerTile - 1) / kKeysPerTile;
    // Copies past this CTA's last tile commit empty groups (issue_tile_copy skips tiles past the list).
    const auto copy_tile = [&](int tile) { return kSplitWindow && tile >= tile_end ? num_tiles : tile; };
    for (int stage = 0; stage < num_stages - 1; ++stage) {
      issue_tile_copy<kThreads>(rows, num_valid, copy_tile(tile_begin + stage), staging + stage * kStage, copy_width);
    }
    // Byte offsets in the ring of this tile's stage and of the one refilled this iteration (the
    // previous tile's), stepped without a runtime modulo.
    int read_offset = 0;
    int refill_offset = (num_stages - 1) * kStage;
    for (int tile = tile_begin; tile < tile_end; ++tile) {
      cp_async_wait_pending(num_stages - 2);
      // This tile's rows landed for all threads; every warp is done with the previous tile: its PV
      // (smem.kv) and its partial scores (in the stage refilled next).
      __syncthreads();
      issue_tile_copy<kThreads>(rows, num_valid, copy_tile(tile + num_stages - 1), staging + refill_offset, copy_width);
      dequantize_tile<Smem::kWarps, kBf16, kModel1Rows>(staging + read_offset, reinterpret_cast<uint8_t*>(&smem.kv[0][0]),
                                                         warp, lane);
      __syncthreads();

      // Partial scores over this warp's 128 dims: S[16 heads][32 keys].
      float s_acc[kKeysPerTile / 8][4];
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 8; ++n) s_acc[n][0] = s_acc[n][1] = s_acc[n][2] = s_acc[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kDimsPerWarp / 16; ++ks) {
        const uint4 a = smem.q_frags[warp][ks][lane];
        const uint32_t q_frag[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int n = 0; n < kKeysPerTile / 8; n += 2) {
          // == kv_base + kv_offset(8 (n + matrix / 2) + lane % 8, quarter * 16 + 2 ks + matrix % 2)
          const uint32_t addr = qk_rows.addr[ks & 3] + (ks >> 2) * 8 * kChunkBytes + n * 8 * (kHeadDim * 2);
          uint32_t b0, b1, b2, b3;
          ptx::ldmatrix_x4(addr, b0, b1, b2, b3);
          ptx::mma_16816<kBf16>(s_acc[n], q_frag, b0, b1);
          ptx::mma_16816<kBf16>(s_acc[n + 1], q_frag, b2, b3);
        }
      }
      // The group's 4 partials meet in the stage this tile came from (dequantized, so free); this
      // warp finishes the scores and softmax of key block `quarter` (group_softmax.cuh).
      float* partials = reinterpret_cast<float*>(staging + read_offset) + group * (16 * 32 * kWarpsPerGroup);
      publish_partial_scores(partials, s_acc, quarter, lane);
      group_barrier(group);
      float scores[4];
      sum_partial_scores(partials, quarter, lane, scores);
      uint32_t p_frag[kKeysPerTile / 16][4];
      group_softmax_tile<kBf16, kModel1Rows>(scores, tile * kKeysPerTile + 8 * quarter + 2 * frag_quad, num_valid,
                                             s_inv_scale, row_logit, kHasExtra ? smem.extra.inv_value_norm : inv_value_norm,
                                             smem.exchange[group], group, quarter, lane, row_state, o_acc, p_frag);

      // O[16 heads][this warp's 128 dims] += P[16][32 keys] * V[32 keys][128 dims].
#pragma unroll
      for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
#pragma unroll
        for (int n = 0; n < kDimsPerWarp / 8; n += 2) {
          // == kv_base + kv_offset(16 ks + 8 (matrix % 2) + lane % 8, quarter * 16 + n + matrix / 2)
          const uint32_t addr = pv_rows.addr[(n / 2) & 3] + (n / 8) * 8 * kChunkBytes + ks * 16 * (kHeadDim * 2);
          uint32_t b0, b1, b2, b3;
          ptx::ldmatrix_x4_trans(addr, b0, b1, b2, b3);
          ptx::mma_16816<kBf16>(o_acc[n], p_frag[ks], b0, b1);
          ptx::mma_16816<kBf16>(o_acc[n + 1], p_frag[ks], b2, b3);
        }
      }
      refill_offset = read_offset;
      read_offset = read_offset + kStage == num_stages * kStage ? 0 : read_offset + kStage;
    }
  };

  if constexpr (!kHasExtra) {
    if constexpr (kWindowModel1) {
      run_tiles(model1_rows(p.window), copy_width, window_entries, tile_begin, tile_end);
    } else {
      run_tiles(seed_rows, copy_width, window_entries, tile_begin, tile_end);
    }
    // Without a tile in this CTA's range (an empty window, or a split rank left without tiles) no
    // barrier separates the prologue's reads of exchange.row_max (the q scales) from the writes in
    // combine_row_sums: racecheck found a fast warp overwriting what a slow one still read.
    if (tile_begin >= tile_end) group_barrier(group);
  } else {
    // This CTA's extra columns: all of the token's, or its rank's share of a split, in whole tiles
    // of columns so that only the last rank's last tile can be partial when every id is valid.
    int column_begin = 0;
    int column_end = extra_columns;
    if constexpr (kSplitWindow) {
      const int share = kKeysPerTile * ptx::cluster_size();
      const int per_rank = (extra_columns + share - 1) / share * kKeysPerTile;
      column_begin = min(ptx::cluster_rank() * per_rank, extra_columns);
      column_end = min(column_begin + per_rank, extra_columns);
    }
    // One copy of the tile loop serves the window and every chunk where both sources have the same
    // format: the extra list's kE4m3 offsets are from p.window.kv_cache too (they carry the
    // distance between the caches); kModel1 rows are found from their own source's fields.
    const auto run_listed = [&](bool window_listed, int num_listed, int tile_begin, int tile_end) {
      if constexpr (!kBf16) {
        run_tiles(seed_rows, copy_width, num_listed, tile_begin, tile_end);
      } else if constexpr (kWindowModel1 && kExtraModel1) {
        run_tiles(model1_rows(window_listed ? p.window : p.extra), copy_width, num_listed, tile_begin, tile_end);
      } else if (window_listed == kWindowModel1) {  // the list holds the kModel1 source's entries
        run_tiles(model1_rows(kWindowModel1 ? p.window : p.extra), copy_width, num_listed, tile_begin, tile_end);
      } else {
        run_tiles(seed_rows, copy_width, num_listed, tile_begin, tile_end);
      }
    };
    const int64_t extra_bias = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.extra.kv_cache) -
                                                    reinterpret_cast<uintptr_t>(p.window.kv_cache));
    ExtraWalk& walk = smem.extra;
    if (threadIdx.x == 0) {
      walk.next_column = column_begin;
      walk.end_column = column_end;
      walk.inv_value_norm = inv_value_norm;
    }
    // Publishes the walk; it also orders the prologue's reads of the q scales before
    // combine_row_sums' writes, which the window-only kernel needs a group barrier for (above).
    __syncthreads();
    int num_listed = window_entries;
    bool window_listed = true;  // the list holds the window's entries, else a chunk's
    for (;;) {
      run_listed(window_listed, num_listed, tile_begin, tile_end);
      window_listed = false;
      // Read by every thread before the compaction's barriers, rewritten by thread 0 after them.
      const int chunk_begin = walk.next_column;
      const int chunk_end = min(chunk_begin + kExtraChunkColumns, walk.end_column);
      const float value_norm_so_far = 1.0f / walk.inv_value_norm;  // exact: a power of two
      if (chunk_begin >= chunk_end) break;
      // The accumulators wait in the tile and the staging ring, idle between chunks, while the
      // chunk is compacted: in registers beside the compaction's they spilled at two groups on
      // sm_90. The barrier also keeps the list until the last tile's reads of it.
      __syncthreads();
      park_accumulators<kThreads>(o_acc, &smem.kv[0][0], staging);
      // Ids loaded per column at two groups (load_columns, kHoistIdType: the hoisted form spills).
      num_listed = compact_columns<kThreads, kExtraChunkColumns, (kHeadGroups == 1)>(
          p.extra, walk.token, chunk_begin, chunk_end, static_cast<int>(threadIdx.x), [] { __syncthreads(); },
          listed_entries<kExtraModel1>(s_row_offset), s_inv_scale, smem.warp_counts, extra_bias);
      unpark_accumulators<kThreads>(o_acc, &smem.kv[0][0], staging);
      // value_norm_of(max(a, b)) == value_norm_of(max(value_norm_of(a), b)): the running value_norm
      // stands for every earlier entry. Powers of two, so the rescale is exact.
      const float chunk_value_norm =
          value_norm_of(fmaxf(value_norm_so_far, listed_scale_magnitude<kExtraModel1>(s_inv_scale, num_listed, lane)));
      if (chunk_value_norm != value_norm_so_far) {  // the same in every thread: all reduced the same list
        const float rescale = value_norm_so_far / chunk_value_norm;
#pragma unroll
        for (int n = 0; n < kDimsPerWarp / 8; ++n) {
#pragma unroll
          for (int r = 0; r < 4; ++r) o_acc[n][r] *= rescale;
        }
      }
      if (threadIdx.x == 0) {
        walk.next_column = chunk_end;
        walk.inv_value_norm = 1.0f / chunk_value_norm;
      }
      // Every thread has its accumulators back before the ring is refilled, and sees the walk.
      __syncthreads();
      tile_begin = 0;
      tile_end = (num_listed + kKeysPerTile - 1) / kKeysPerTile;
    }
    value_norm = 1.0f / walk.inv_value_norm;
  }
  combine_row_sums(smem.exchange[group], group, quarter, lane, row_state);
  if constexpr (kSplitWindow) {
    // Every warp is done with the tile, the q fragments and the exchanges: the partials go over
    // the first two (64 KiB at two groups), the row statistics over group 0's exchange.
    static_assert(kHeadGroups * kHeadsPerGroup * kHeadDim * 4 <= sizeof(smem.kv) + sizeof(smem.q_frags), "partials fit");
    // With an extra source the ranks' value_norms differ (each saw other chunks); each CTA's follows
    // its heads' statistics (combine_split_partials).
    static_assert((kHeadGroups * kHeadsPerGroup + 1) * sizeof(float2) <= sizeof(smem.exchange[0].probs), "row stats fit");
    uint8_t* partials = reinterpret_cast<uint8_t*>(&smem.kv[0][0]);
    float2* row_stats = reinterpret_cast<float2*>(&smem.exchange[0].probs[0][0]);
    __syncthreads();
    park_split_partials(partials, row_stats, o_acc, row_state, group, quarter, lane);
    if (kHasExtra && threadIdx.x == 0) row_stats[kHeadGroups * kHeadsPerGroup] = make_float2(value_norm, 0.0f);
    ptx::cluster_barrier();
    combine_split_partials<kThreads, kHeadGroups * kHeadsPerGroup, kHasExtra, kMaxWindowSplits>(
        p, partials, row_stats, smem.sinks, kHasExtra ? smem.extra.token : token,
        (kHasExtra ? smem.extra.head_block : head_block) * kHeadGroups * kHeadsPerGroup, value_norm,
        SplitRanks{ptx::cluster_size(), ptx::cluster_rank(), 1, 0}, static_cast<int>(threadIdx.x));
    ptx::cluster_barrier_relaxed();  // no CTA leaves while another still reads its partials
  } else {
    // Normalize (sink, LSE) and store: four n8 blocks of a 32-dim group are 8 contiguous dims.
    const int out_token = kHasExtra ? smem.extra.token : token;
    const int out_head_base = kHasExtra ? (smem.extra.head_block * kHeadGroups + group) * kHeadsPerGroup : head_base;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = out_head_base + frag_row + 8 * h;
      if (head >= p.num_heads) continue;
      const FinalizedRow fin = finalize_row(row_state.max[h], row_state.sum[h],
                                            smem.sinks[group * kHeadsPerGroup + head - out_head_base], p.empty_token_lse);
      const float out_factor = fin.out_factor * value_norm;
      if (p.lse != nullptr && quarter == 0 && frag_quad == 0) p.lse[out_token * p.stride_lse_token + head] = fin.lse;
      __nv_bfloat16* out_row = p.out + out_token * p.stride_out_token + head * p.stride_out_head + dim_base + 8 * frag_quad;
#pragma unroll
      for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
        uint4 v;
        v.x = pack_bf16x2(o_acc[4 * c + 0][2 * h] * out_factor, o_acc[4 * c + 0][2 * h + 1] * out_factor);
        v.y = pack_bf16x2(o_acc[4 * c + 1][2 * h] * out_factor, o_acc[4 * c + 1][2 * h + 1] * out_factor);
        v.z = pack_bf16x2(o_acc[4 * c + 2][2 * h] * out_factor, o_acc[4 * c + 2][2 * h + 1] * out_factor);
        v.w = pack_bf16x2(o_acc[4 * c + 3][2 * h] * out_factor, o_acc[4 * c + 3][2 * h + 1] * out_factor);
        ptx::st_global_v4(out_row + c * kDimGroup, v);
      }
    }
  }
}

}  // namespace swa_decode::portable

namespace swa_decode {

// window_splits == 1: one CTA per (token, head block), numbered token-major by the kernel.
// window_splits > 1 (sm_90+): a cluster of that many CTAs per (token, head block).
template <int kHeadGroups, bool kSplitWindow, bool kHasExtra, bool kWindowModel1, bool kExtraModel1>
cudaError_t launch_portable_variant(const DecodeParams& params, int num_stages, int window_splits, bool dependent_launch,
                                    cudaStream_t stream) {
  constexpr int kThreads = kHeadGroups * portable::kWarpsPerGroup * 32;
  const int smem_bytes = portable::ring_plan(kHeadGroups, num_stages,
                                             portable::list_shape(params.window.max_entries, kHasExtra,
                                                                  {kWindowModel1, kExtraModel1}))
                             .total_bytes;
  constexpr int kHeadsPerCta = kHeadGroups * portable::kHeadsPerGroup;
  // x: tokens (times the splits), y: head blocks (up to 8).
  const KernelLaunch launch{
      .grid = dim3(static_cast<unsigned>(params.num_tokens * window_splits),
                   static_cast<unsigned>((params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta)),
      .block = dim3(kThreads),
      .smem_bytes = smem_bytes,
      .cluster_ctas = kSplitWindow ? static_cast<unsigned>(window_splits) : 1u,
      .dependent_launch = dependent_launch,
      .stream = stream,
  };
  return launch_kernel<portable::decode_portable_kernel<kHeadGroups, kSplitWindow, kHasExtra, kWindowModel1, kExtraModel1>>(
      launch, params, num_stages);
}

template <int kHeadGroups, bool kHasExtra, bool kWindowModel1, bool kExtraModel1>
cudaError_t launch_portable_source_variant(const DecodeParams& params, int num_stages, int window_splits,
                                           bool dependent_launch, cudaStream_t stream) {
  return window_splits > 1 ? launch_portable_variant<kHeadGroups, true, kHasExtra, kWindowModel1, kExtraModel1>(
                                 params, num_stages, window_splits, dependent_launch, stream)
                           : launch_portable_variant<kHeadGroups, false, kHasExtra, kWindowModel1, kExtraModel1>(
                                 params, num_stages, 1, dependent_launch, stream);
}

}  // namespace swa_decode
