// Window split for small batches (sm_90+): the S CTAs of a thread-block cluster share one (token,
// head block), each runs the online softmax over 1/S of the window's tiles (and 1/S of the extra
// source's columns, where there is one), and they combine
// through distributed shared memory, so no global scratch is needed and the run path still
// allocates nothing.
//
// Why: with few tokens a CTA's serial chain (q and index loads, gathers, 4 tiles of compute, the
// epilogue) sets the time while most SMs idle (H = 128, T = 1: 8 CTAs, issue slots 0.9% busy,
// docs/perf-notes.md). Splitting the window shortens each chain to ~1/S of the tiles and puts S
// times the CTAs to work.
//
// The combine: each CTA parks its unnormalized output (fp32, 16 * kHeadGroups heads x 512 dims)
// over its own f16 tile and q fragments, which the last tile has finished with, plus each head's
// running max and sum; after a cluster barrier, CTA rank r normalizes heads r/S .. (r+1)/S - 1 of
// the block, loading every CTA's partials remotely in one batch: O = sum_s 2^(m_s - M) O_s,
// l = sum_s 2^(m_s - M) l_s with M = max_s m_s, then the usual sink and LSE (softmax_finalize.cuh).
// Pushing the partials into the owner with remote stores instead measured 0.3 us slower at T = 1
// (the release barrier then waits for the stores; docs/perf-notes.md).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/kernels/portable/group_softmax.cuh"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode::portable {

// Where a CTA parks its partial output: [head of the block][128 chunks of 4 dims], chunk c of head
// h stored at c ^ (h & 7) so that the 8 rows a warp's quarter writes at once (fragment rows g)
// land in 8 different bank groups.
__device__ __forceinline__ uint32_t partial_chunk_offset(int head, int chunk) {
  return static_cast<uint32_t>((head * (kHeadDim / 4) + (chunk ^ (head & 7))) * 16);
}

// Parks this warp's rows g and g + 8 (of `group`), dims dim_base .. dim_base + 127 in the output
// order of the epilogue (4 n8 blocks of a 32-dim group are 8 contiguous dims), and, from the
// group's first warp, each row's max and sum. `partials` and `row_stats` must be free for the CTA.
template <int kOutBlocks>
__device__ __forceinline__ void park_split_partials(uint8_t* partials, float2* row_stats, const float (&o_acc)[kOutBlocks][4],
                                                    const RowState& rows, int group, int quarter, int lane) {
  const int frag_row = lane / 4;
  const int frag_quad = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = group * kHeadsPerGroup + frag_row + 8 * h;
#pragma unroll
    for (int c = 0; c < kOutBlocks / 4; ++c) {
      const int chunk = (quarter * 128 + c * 32 + 8 * frag_quad) / 4;
      *reinterpret_cast<float4*>(partials + partial_chunk_offset(head, chunk)) =
          make_float4(o_acc[4 * c + 0][2 * h], o_acc[4 * c + 0][2 * h + 1], o_acc[4 * c + 1][2 * h], o_acc[4 * c + 1][2 * h + 1]);
      *reinterpret_cast<float4*>(partials + partial_chunk_offset(head, chunk + 1)) =
          make_float4(o_acc[4 * c + 2][2 * h], o_acc[4 * c + 2][2 * h + 1], o_acc[4 * c + 3][2 * h], o_acc[4 * c + 3][2 * h + 1]);
    }
    if (quarter == 0 && frag_quad == 0) row_stats[head] = make_float2(rows.max[h], rows.sum[h]);
  }
}

// Run by all kThreads threads of each CTA of the cluster after every CTA parked its partials and
// passed cluster_barrier(): normalizes this CTA's share of the block's heads and stores out and lse.
// `sinks` holds the block's sinks, `first_head` is the block's first head.
// kPerRankValueNorm == false: every CTA's partials are relative to the same `value_norm` (each
// compacted the whole window). true (an extra source: each CTA saw its own chunks): CTA s parked
// its value_norm v_s at row_stats[kHeadsPerBlock].x; partials are brought to the largest, V, by
// v_s / V <= 1 (powers of two: exact, and never an overflow), and the output scaled by V.
template <int kThreads, int kHeadsPerBlock, bool kPerRankValueNorm>
__device__ __forceinline__ void combine_split_partials(const DecodeParams& p, const uint8_t* partials, const float2* row_stats,
                                                       const float* sinks, int token, int first_head, float value_norm) {
  constexpr int kItemsPerHead = kHeadDim / 8;  // 16-byte stores of 8 bf16
  const int splits = ptx::cluster_size();
  const int rank = ptx::cluster_rank();
  const int heads_per_rank = kHeadsPerBlock / splits;
  const uint32_t partials_base = ptx::smem_addr(partials);
  const uint32_t stats_base = ptx::smem_addr(row_stats);
  float norm_ratio[kMaxWindowSplits];  // kPerRankValueNorm only: v_s / V, 0 for ranks past the cluster
  if constexpr (kPerRankValueNorm) {
    float norms[kMaxWindowSplits];
#pragma unroll
    for (int s = 0; s < kMaxWindowSplits; ++s) {
      norms[s] = s < splits ? ptx::load_cluster_f32x2(ptx::cluster_address(stats_base + kHeadsPerBlock * 8, s)).x : 0.0f;
    }
    value_norm = 0.0f;  // becomes >= 2^-126 (value_norm_of)
#pragma unroll
    for (int s = 0; s < kMaxWindowSplits; ++s) value_norm = fmaxf(value_norm, norms[s]);
#pragma unroll
    for (int s = 0; s < kMaxWindowSplits; ++s) norm_ratio[s] = norms[s] / value_norm;
  }
  for (int item = threadIdx.x; item < heads_per_rank * kItemsPerHead; item += kThreads) {
    const int local_head = rank * heads_per_rank + item / kItemsPerHead;
    const int head = first_head + local_head;
    if (head >= p.num_heads) continue;
    const int chunk = 2 * (item % kItemsPerHead);
    // Every CTA's statistics and 8 dims first (one batch of remote loads), then the sums.
    float2 stats[kMaxWindowSplits];
    float4 lo[kMaxWindowSplits], hi[kMaxWindowSplits];
#pragma unroll
    for (int s = 0; s < kMaxWindowSplits; ++s) {
      if (s < splits) {
        stats[s] = ptx::load_cluster_f32x2(ptx::cluster_address(stats_base + local_head * 8, s));
        lo[s] = ptx::load_cluster_f32x4(ptx::cluster_address(partials_base + partial_chunk_offset(local_head, chunk), s));
        hi[s] = ptx::load_cluster_f32x4(ptx::cluster_address(partials_base + partial_chunk_offset(local_head, chunk + 1), s));
      } else {
        stats[s] = make_float2(-INFINITY, 0.0f);
        lo[s] = hi[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float max_log2 = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxWindowSplits; ++s) max_log2 = fmaxf(max_log2, stats[s].x);
    float sum_exp = 0.0f;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (max_log2 != -INFINITY) {  // otherwise no CTA saw a valid entry: out = 0, lse = p.empty_token_lse
#pragma unroll
      for (int s = 0; s < kMaxWindowSplits; ++s) {
        const float weight = ptx::exp2_approx(stats[s].x - max_log2);  // 0 for a CTA without entries
        sum_exp += weight * stats[s].y;
        const float out_weight = kPerRankValueNorm ? weight * norm_ratio[s] : weight;
        acc[0] += out_weight * lo[s].x;
        acc[1] += out_weight * lo[s].y;
        acc[2] += out_weight * lo[s].z;
        acc[3] += out_weight * lo[s].w;
        acc[4] += out_weight * hi[s].x;
        acc[5] += out_weight * hi[s].y;
        acc[6] += out_weight * hi[s].z;
        acc[7] += out_weight * hi[s].w;
      }
    }
    const FinalizedRow fin = finalize_row(max_log2, sum_exp, sinks[local_head], p.empty_token_lse);
    const float out_factor = fin.out_factor * value_norm;
    if (p.lse != nullptr && chunk == 0) p.lse[token * p.stride_lse_token + head] = fin.lse;
    const uint4 v = make_uint4(pack_bf16x2(acc[0] * out_factor, acc[1] * out_factor), pack_bf16x2(acc[2] * out_factor, acc[3] * out_factor),
                               pack_bf16x2(acc[4] * out_factor, acc[5] * out_factor), pack_bf16x2(acc[6] * out_factor, acc[7] * out_factor));
    ptx::st_global_v4(p.out + token * p.stride_out_token + head * p.stride_out_head + chunk * 4, v);
  }
}

}  // namespace swa_decode::portable
