// A token's heads split over the CTAs of a thread-block cluster by their keys: each CTA ran the
// online softmax over its share of the entries and parked its unnormalized output (fp32) and each
// head's running max and sum in its own shared memory; after a cluster barrier, each CTA loads its
// share of the heads from every CTA (distributed shared memory, one batch of remote loads) and
// normalizes them: O = sum_s 2^(m_s - M) O_s, l = sum_s 2^(m_s - M) l_s with M = max_s m_s, then
// the sink and lse (softmax_finalize.cuh). No global scratch, so the run path allocates nothing.
// Used by the portable kernel's window split (window_split_combine.cuh) and the sm90 layer
// kernel's key split (sm90_layer_split.cuh).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "swa_decode/limits.h"

namespace swa_decode {

// Where a CTA parks its partial output: [head of the block][128 chunks of 4 dims], chunk c of head
// h stored at c ^ (h & 7) so that the 8 rows a warp's quarter writes at once (fragment rows g)
// land in 8 different bank groups.
inline constexpr int kPartialChunksPerHead = static_cast<int>(kGpuHeadDim) / 4;
__device__ __forceinline__ uint32_t partial_chunk_offset(int head, int chunk) {
  return static_cast<uint32_t>((head * kPartialChunksPerHead + (chunk ^ (head & 7))) * 16);
}

// The CTAs that split one block of heads: `count` of them, this one the `mine`-th, the s-th being
// cluster rank s * stride + offset (the portable kernel's cluster is one split: stride 1; the
// layer kernel's pairs interleave two slabs: stride 2, offset the slab).
struct SplitRanks {
  int count;
  int mine;
  int stride;
  int offset;
  __device__ __forceinline__ int rank_of(int split) const { return split * stride + offset; }
};

// Run by kThreads threads (`thread` = 0 .. kThreads - 1) of each CTA of the split after every CTA
// parked its partials and passed cluster_barrier(): normalizes this CTA's share of the block's
// kHeadsPerBlock heads and stores out and lse. `sinks` holds the block's sinks (-inf: none; in
// shared memory), `first_head` is the block's first head.
// kPerRankValueNorm == false: every CTA's partials are relative to the same `value_norm` (each
// compacted the whole window). true (an extra source: each CTA saw its own chunks): CTA s parked
// its value_norm v_s at row_stats[kHeadsPerBlock].x; partials are brought to the largest, V, by
// v_s / V <= 1 (powers of two: exact, and never an overflow), and the output scaled by V.
template <int kThreads, int kHeadsPerBlock, bool kPerRankValueNorm, int kMaxSplits>
__device__ __forceinline__ void combine_split_partials(const DecodeParams& p, const uint8_t* partials, const float2* row_stats,
                                                       const float* sinks, int token, int first_head, float value_norm,
                                                       const SplitRanks& ranks, int thread) {
  constexpr int kItemsPerHead = static_cast<int>(kGpuHeadDim) / 8;  // 16-byte stores of 8 bf16
  const int splits = ranks.count;
  const int heads_per_rank = kHeadsPerBlock / splits;
  const uint32_t partials_base = ptx::smem_addr(partials);
  const uint32_t stats_base = ptx::smem_addr(row_stats);
  float norm_ratio[kMaxSplits];  // kPerRankValueNorm only: v_s / V, 0 for ranks past the split
  if constexpr (kPerRankValueNorm) {
    float norms[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      norms[s] = s < splits ? ptx::load_cluster_f32x2(ptx::cluster_address(stats_base + kHeadsPerBlock * 8, ranks.rank_of(s))).x
                            : 0.0f;
    }
    value_norm = 0.0f;  // becomes >= 2^-126 (value_norm_of)
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) value_norm = fmaxf(value_norm, norms[s]);
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) norm_ratio[s] = norms[s] / value_norm;
  }
  for (int item = thread; item < heads_per_rank * kItemsPerHead; item += kThreads) {
    const int local_head = ranks.mine * heads_per_rank + item / kItemsPerHead;
    const int head = first_head + local_head;
    if (head >= p.num_heads) continue;
    const int chunk = 2 * (item % kItemsPerHead);
    // Every CTA's statistics and 8 dims first (one batch of remote loads), then the sums.
    float2 stats[kMaxSplits];
    float4 lo[kMaxSplits], hi[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < splits) {
        const int rank = ranks.rank_of(s);
        stats[s] = ptx::load_cluster_f32x2(ptx::cluster_address(stats_base + local_head * 8, rank));
        lo[s] = ptx::load_cluster_f32x4(ptx::cluster_address(partials_base + partial_chunk_offset(local_head, chunk), rank));
        hi[s] = ptx::load_cluster_f32x4(ptx::cluster_address(partials_base + partial_chunk_offset(local_head, chunk + 1), rank));
      } else {
        stats[s] = make_float2(-INFINITY, 0.0f);
        lo[s] = hi[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    float max_log2 = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) max_log2 = fmaxf(max_log2, stats[s].x);
    float sum_exp = 0.0f;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (max_log2 != -INFINITY) {  // otherwise no CTA saw a valid entry: out = 0, lse = p.empty_token_lse
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
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

}  // namespace swa_decode
