// The layer kernel's key split (KeySplit, sm90_layer_plan.h): each CTA of a cluster ran its share
// of a token's entries; its two consumers park their unnormalized O and consumer 0 each head's
// running max and sum, then every CTA combines its share of the slab's heads from every CTA of
// the same slab (src/common/split_partials.cuh).
#pragma once

#include <cstdint>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/split_partials.cuh"
#include "src/kernels/sm90/sm90_consumer.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

__device__ __forceinline__ uint8_t* split_partials(LayerSmemPlan& smem) { return &smem.kv[0][0][0][0]; }
__device__ __forceinline__ float2* split_row_stats(LayerSmemPlan& smem) {
  return reinterpret_cast<float2*>(&smem.q[0][0][0]);
}
// The slab's sinks (-inf: none), after the row statistics, for the combine.
__device__ __forceinline__ float* split_sinks(LayerSmemPlan& smem) {
  return reinterpret_cast<float*>(split_row_stats(smem) + kSlabHeads);
}

// In a pair, this CTA's stages are the source of its bulk copies into the peer's
// (copy_share_to_peer), which complete on the peer's kv_full alone: before the partials go over
// the ring, both stages must be free as a stage writer would wait for them (kv_empty counts both
// CTAs' consumers, and the peer's consumed each stage after its copies landed). `kv` is the
// consumer's ring position after its last subtile; a ring it never used passes at once.
template <class Pair>
__device__ __forceinline__ void wait_peer_done_with_stages(LayerSmemSync& sync, PipeState<kKvStages> kv) {
  if constexpr (Pair::kCtas == 2) {
#pragma unroll
    for (int stage = 0; stage < kKvStages; ++stage) {
      wait_stage_free(&sync.kv_empty[kv.index], kv.phase ^ 1u);
      kv.advance();
    }
  }
}

// One consumer's half of O (o[4 n + 2 r + e]: dims half * 256 + 8 n + 2 q + e of row r, as
// store_out_row_half reads them) into the partials, zeros where no subtile had an entry (o holds
// whatever it held then); consumer 0 (stats != nullptr) adds each row's max and sum
// (quad-reduced) and sink (of heads first_head + row). Waits first for both consumers to be done
// with the ring (kConsumersBarrier), since the partials go over it.
__device__ __forceinline__ void park_layer_partials(const DecodeParams& p, LayerSmemPlan& smem, const float (&o)[128],
                                                    bool o_started, int half, const float (*row_stats)[2],
                                                    int first_head) {
  // threadIdx.x read anew (unhoisted): the 64 addresses below, derived once before the tile loop
  // and held across it, spilled the consumers 160 B (ptxas, CUDA 13.0).
  const int wtid = ptx::thread_index_x_unhoisted() % kWarpgroupThreads;
  const int frag_row = (wtid % 32) / 4;
  const int frag_quad = wtid % 4;
  const int row_lo = (wtid / 32) * 16 + frag_row;
  ptx::named_barrier_sync<kConsumerThreads>(kConsumersBarrier);
  uint8_t* partials = split_partials(smem);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
#pragma unroll
    for (int n = 0; n < kHalfDims / 8; ++n) {
      const int chunk = (half * kHalfDims + 8 * n + 2 * frag_quad) / 4;
      const float2 v = o_started ? make_float2(o[4 * n + 2 * r], o[4 * n + 2 * r + 1]) : make_float2(0.0f, 0.0f);
      *reinterpret_cast<float2*>(partials + partial_chunk_offset(row, chunk) + (frag_quad % 2) * 8) = v;
    }
    if (row_stats != nullptr && frag_quad == 0) {
      split_row_stats(smem)[row] = make_float2(row_stats[r][0], row_stats[r][1]);
      const int head = first_head + row;
      split_sinks(smem)[row] = p.attn_sink != nullptr && head < p.num_heads ? p.attn_sink[head] : -INFINITY;
    }
  }
}

// Run by the 256 consumer threads once they parked their partials: after a cluster barrier (every
// CTA's partials are parked), this CTA's share of its slab's 64 heads from the CTAs of the same
// slab (ranks split * kCtas + slab); then a second one, so that no CTA leaves while another may
// still read its partials. The producer warps pass the same two barriers (decode_sm90_layer.cuh).
template <class Pair>
__device__ __forceinline__ void combine_layer_split(const DecodeParams& p, LayerSmemPlan& smem, int rank,
                                                    const KeySplit& split) {
  ptx::cluster_barrier();
  const int slab = slab_of_cta<Pair>(rank);
  const ItemOrder& order = item_order(smem);
  if (order.count != 0) {
    const int first_head = slab * kSlabHeads;
    combine_split_partials<kConsumerThreads, kSlabHeads, false, kMaxLayerClusterCtas / Pair::kCtas>(
        p, split_partials(smem), split_row_stats(smem), split_sinks(smem), item_token(order, 0), first_head, 1.0f, SplitRanks{split.count, split.index, Pair::kCtas, slab},
        static_cast<int>(threadIdx.x) - kWarpgroupThreads);
  }
  ptx::cluster_barrier_relaxed();
}

}  // namespace swa_decode::sm90
