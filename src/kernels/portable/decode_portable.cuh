// Portable tensor-core decode kernel: mma.sync m16n8k16 f16, cp.async, ldmatrix (sm_80 and newer).
//
// Grid: (token, block of 16 * kHeadGroups heads). One CTA gathers and dequantizes each valid KV row
// of its token once for all the heads it holds. Each 16-head group is split over 4 warps by head-dim
// quarters (128 dims each) so that a warp's output accumulator is 16 x 128 fp32 = 64 registers
// instead of 256; the 4 partial score tiles meet in shared memory and each warp finishes the
// softmax of a quarter of the keys (group_softmax.cuh). q waits in shared memory as ready-made A
// fragments, so a thread needs at most 128 registers and two CTAs share an SM: one CTA's barriers
// and gather latency hide under the other's matmuls (docs/perf-notes.md, portable v5). The tensor
// cores run f16 (q_f16.cuh says why and how q is scaled exactly). Keys stream in tiles of 32 with an
// online softmax through a ring of 2-4 staging buffers. On sm_90 the smallest batches (at most 8
// CTAs) split each window over a cluster of 4 CTAs instead (window_split_combine.cuh).
#pragma once

#include <cstdint>

#include "src/common/dim_permutation.cuh"
#include "src/common/fp8_convert.cuh"
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

// Fixed part of the shared-memory plan; the staging ring and the compacted window follow it
// (ring_plan in portable_plan.h), sized at launch by the number of stages and window_size.
template <int kHeadGroups>
struct SmemPlan {
  static constexpr int kWarps = kHeadGroups * kWarpsPerGroup;
  alignas(128) uint16_t kv[kKeysPerTile][kHeadDim];              // f16, swizzled, dim-permuted
  alignas(16) uint4 q_frags[kWarps][kDimsPerWarp / 16][32];      // [warp][k-step][lane]: A fragments
  alignas(16) GroupExchange exchange[kHeadGroups];
  float sinks[kHeadGroups * kHeadsPerGroup];  // read at the start, used at the end
  int warp_counts[kWarps];
};

static_assert(sizeof(SmemPlan<1>) <= fixed_smem_bytes(1) && sizeof(SmemPlan<2>) <= fixed_smem_bytes(2),
              "portable_plan.h must cover the fixed shared-memory plan");

// Two CTAs per SM on sm_90 (portable_plan.h sizes shared memory for that): at two head groups
// (256 threads) that caps a thread at 128 registers, which the kernel fits without spilling there.
// sm_80/86/89/120 have too little shared memory for two CTAs anyway; sm_100 could hold two, but
// its ptxas spills at 128 registers and it is compile-only here, so it keeps one until measured.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
inline constexpr int kPortableMinCtasPerSm = 2;
#else
inline constexpr int kPortableMinCtasPerSm = 1;
#endif
// kSplitWindow: the CTAs of a cluster split the window's tiles (window_split_combine.cuh); the grid's
// x is then token * cluster size + rank.
template <int kHeadGroups, bool kSplitWindow>
__global__ void __launch_bounds__(kHeadGroups * kWarpsPerGroup * 32, kPortableMinCtasPerSm)
    decode_portable_kernel(const __grid_constant__ DecodeParams p, int num_stages) {
  constexpr int kThreads = kHeadGroups * kWarpsPerGroup * 32;
  using Smem = SmemPlan<kHeadGroups>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const RingPlan ring = ring_plan(kHeadGroups, num_stages, p.window.max_entries);
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
  const int num_valid = compact_window<kThreads>(
      p.window, token, static_cast<int>(threadIdx.x), [] { __syncthreads(); }, s_row_offset, s_inv_scale, smem.warp_counts);

  // Each head's power-of-two scale into f16 (q_f16.cuh): its largest |q| over the 4 quarters.
  float row_logit[2];
  {
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
  const float value_norm = value_norm_of(list_max_magnitude(s_inv_scale, num_valid, lane));
  const float inv_value_norm = 1.0f / value_norm;

  const int num_tiles = (num_valid + kKeysPerTile - 1) / kKeysPerTile;
  const int copy_width = kv_copy_width(p);
  // This CTA's tiles: all of them, or its rank's share of a split window.
  int tile_begin = 0;
  int tile_end = num_tiles;
  if constexpr (kSplitWindow) {
    const int per_rank = (num_tiles + ptx::cluster_size() - 1) / ptx::cluster_size();
    tile_begin = min(ptx::cluster_rank() * per_rank, num_tiles);
    tile_end = min(tile_begin + per_rank, num_tiles);
  }
  // Copies past this CTA's last tile commit empty groups (issue_tile_copy skips tiles past the window).
  const auto copy_tile = [&](int tile) { return kSplitWindow && tile >= tile_end ? num_tiles : tile; };

  float o_acc[kDimsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  RowState rows;

  const uint32_t kv_base = ptx::smem_addr(&smem.kv[0][0]);
  const int matrix = lane / 8;  // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  const SwizzledRows qk_rows =
      swizzled_rows(kv_base, 8 * (matrix >> 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix & 1));
  const SwizzledRows pv_rows =
      swizzled_rows(kv_base, 8 * (matrix & 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix >> 1));
  for (int stage = 0; stage < num_stages - 1; ++stage) {
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, copy_tile(tile_begin + stage), staging + stage * kStageBytes,
                              copy_width);
  }
  // Byte offsets in the ring of this tile's stage and of the one refilled this iteration (the
  // previous tile's), stepped without a runtime modulo.
  int read_offset = 0;
  int refill_offset = (num_stages - 1) * kStageBytes;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    cp_async_wait_pending(num_stages - 2);
    // This tile's rows landed for all threads; every warp is done with the previous tile: its PV
    // (smem.kv) and its partial scores (in the stage refilled next).
    __syncthreads();
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, copy_tile(tile + num_stages - 1), staging + refill_offset,
                              copy_width);
    dequantize_tile<Smem::kWarps>(staging + read_offset, reinterpret_cast<uint8_t*>(&smem.kv[0][0]), warp, lane);
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
        ptx::mma_f16_16816(s_acc[n], q_frag, b0, b1);
        ptx::mma_f16_16816(s_acc[n + 1], q_frag, b2, b3);
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
    group_softmax_tile(scores, tile * kKeysPerTile + 8 * quarter + 2 * frag_quad, num_valid, s_inv_scale, row_logit,
                       inv_value_norm, smem.exchange[group], group, quarter, lane, rows, o_acc, p_frag);

    // O[16 heads][this warp's 128 dims] += P[16][32 keys] * V[32 keys][128 dims].
#pragma unroll
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
#pragma unroll
      for (int n = 0; n < kDimsPerWarp / 8; n += 2) {
        // == kv_base + kv_offset(16 ks + 8 (matrix % 2) + lane % 8, quarter * 16 + n + matrix / 2)
        const uint32_t addr = pv_rows.addr[(n / 2) & 3] + (n / 8) * 8 * kChunkBytes + ks * 16 * (kHeadDim * 2);
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4_trans(addr, b0, b1, b2, b3);
        ptx::mma_f16_16816(o_acc[n], p_frag[ks], b0, b1);
        ptx::mma_f16_16816(o_acc[n + 1], p_frag[ks], b2, b3);
      }
    }
    refill_offset = read_offset;
    read_offset = read_offset + kStageBytes == num_stages * kStageBytes ? 0 : read_offset + kStageBytes;
  }

  // Without a tile in this CTA's range (an empty window, or a split rank left without tiles) no
  // barrier separates the prologue's reads of exchange.row_max (the q scales) from the writes in
  // combine_row_sums: racecheck found a fast warp overwriting what a slow one still read.
  if (tile_begin >= tile_end) group_barrier(group);
  combine_row_sums(smem.exchange[group], group, quarter, lane, rows);
  if constexpr (kSplitWindow) {
    // Every warp is done with the f16 tile, the q fragments and the exchanges: the partials go over
    // the first two (64 KiB at two groups), the row statistics over group 0's exchange.
    static_assert(kHeadGroups * kHeadsPerGroup * kHeadDim * 4 <= sizeof(smem.kv) + sizeof(smem.q_frags), "partials fit");
    static_assert(kHeadGroups * kHeadsPerGroup * sizeof(float2) <= sizeof(smem.exchange[0].probs), "row stats fit");
    uint8_t* partials = reinterpret_cast<uint8_t*>(&smem.kv[0][0]);
    float2* row_stats = reinterpret_cast<float2*>(&smem.exchange[0].probs[0][0]);
    __syncthreads();
    park_split_partials(partials, row_stats, o_acc, rows, group, quarter, lane);
    ptx::cluster_barrier();
    combine_split_partials<kThreads, kHeadGroups * kHeadsPerGroup>(p, partials, row_stats, smem.sinks, token,
                                                                   head_block * kHeadGroups * kHeadsPerGroup, value_norm);
    ptx::cluster_barrier_relaxed();  // no CTA leaves while another still reads its partials
  } else {
    // Normalize (sink, LSE) and store: four n8 blocks of a 32-dim group are 8 contiguous dims.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = h == 0 ? head_lo : head_hi;
      if (head >= p.num_heads) continue;
      const FinalizedRow fin = finalize_row(rows.max[h], rows.sum[h], smem.sinks[group * kHeadsPerGroup + head - head_base]);
      const float out_factor = fin.out_factor * value_norm;
      if (p.lse != nullptr && quarter == 0 && frag_quad == 0) p.lse[token * p.stride_lse_token + head] = fin.lse;
      __nv_bfloat16* out_row = p.out + token * p.stride_out_token + head * p.stride_out_head + dim_base + 8 * frag_quad;
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

template <int kHeadGroups>
int portable_smem_bytes(int num_stages, int window_size) {
  return portable::ring_plan(kHeadGroups, num_stages, window_size).total_bytes;
}

// window_splits == 1: one CTA per (token, head block), numbered token-major by the kernel.
// window_splits > 1 (sm_90+): a cluster of that many CTAs per (token, head block).
template <int kHeadGroups, bool kSplitWindow>
cudaError_t launch_portable_variant(const DecodeParams& params, int num_stages, int window_splits, cudaStream_t stream) {
  constexpr int kThreads = kHeadGroups * portable::kWarpsPerGroup * 32;
  const int smem_bytes = portable_smem_bytes<kHeadGroups>(num_stages, params.window.max_entries);
  const auto kernel = portable::decode_portable_kernel<kHeadGroups, kSplitWindow>;
  // Raising the dynamic shared-memory limit is a per-function attribute, not a stream operation,
  // so it is legal while a CUDA graph is being captured; it costs well under a microsecond.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  constexpr int kHeadsPerCta = kHeadGroups * portable::kHeadsPerGroup;
  // x: tokens (times the splits), y: head blocks (up to 8).
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(params.num_tokens * window_splits),
                        static_cast<unsigned>((params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute cluster = {};
  if constexpr (kSplitWindow) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(window_splits);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, params, num_stages);
}

template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, int num_stages, int window_splits, cudaStream_t stream) {
  return window_splits > 1 ? launch_portable_variant<kHeadGroups, true>(params, num_stages, window_splits, stream)
                           : launch_portable_variant<kHeadGroups, false>(params, num_stages, 1, stream);
}

}  // namespace swa_decode
