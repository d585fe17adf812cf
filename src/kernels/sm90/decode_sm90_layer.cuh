// Hopper layer kernel: the window and an extra KV source (DeepSeek-V4's compressed entries) in one
// softmax per (token, head) (docs/semantics.md, "The extra source"). sm_90a; window_size <= 128,
// head_dim 512, up to kMaxExtraEntries extra index columns.
//
// Persistent CTAs (one per SM) walk work items, an item being (token, slab of 64 heads): one slab
// a token for H <= 64, two for H in 65..128, run by the two CTAs of a cluster (a LayerPair,
// sm90_layer_plan.h; cluster rank r runs slab r). Which tokens a CTA (or pair) runs, and in which
// order, every CTA works out first from all tokens' lengths, largest first
// (sm90_layer_schedule.cuh). The window kernel's three warpgroups, with tiles for tokens:
//  * producer (WG 0): warp 3 compacts the item's valid entries a tile ahead, window first, then
//    the extra source 128 index columns at a time, each chunk a tile of at most 128 entries
//    (TileRecord), and loads the item's q by TMA (64 KiB, resident for all its tiles); warps 0-2
//    gather each tile's rows 64 keys (a subtile) at a time into staging and dequantize them into
//    one stage of the two-stage bf16 K/V ring, either row format (seed e4m3 or kModel1): warp 0
//    issues the copies into a two-share staging ring (and in a pair a kModel1 stage's RoPE
//    values), warps 1-2 dequantize (LayerPair). In a pair
//    each CTA gathers 32 of a subtile's keys and writes them into its stage and, by bulk copy
//    (v4's gather warps: by remote stores), the peer's;
//  * two consumers (WG 1, 2) hold the same 64 heads and own one 256-dim half of O each, whose
//    accumulators live across the tiles of an online softmax (log2 domain). Consumer 0 computes
//    each subtile's S = Q K^T and hands P, the rescale factors and at the end the out factors to
//    consumer 1 through shared memory (ConsumerExchange). After the item's last tile, the sink,
//    lse (consumer 0) and out.
//
// Barriers and phases (counts in sm90_layer_plan.h, LayerSmemSync; phases are PipeStates):
//  * meta_full / meta_empty [2]: the records and compacted entries, one buffer per record,
//    alternating; every role walks every record, so all three count them alike (PipeState<2>).
//  * kv_full / kv_empty [stage]: the K/V ring, one use per subtile (PipeState<kKvStages>, advanced
//    by the gather warps and the consumers per subtile of every record with entries); both
//    consumers arrive on kv_empty after their PV. In a pair the gather warps of either CTA fill
//    half of each CTA's stage: kv_full counts this CTA's writers, its issuer (a kModel1 stage's
//    RoPE block) and the bytes of the peer's copies (or, for v4's gather warps, both CTAs'
//    writers), kv_empty both CTAs' consumers, so a stage is free once both are done with it;
//    neither CTA exits before the other (a cluster barrier).
//  * q_full / q_empty [chunk]: one use per item that has index columns (PipeState<1>, advanced by
//    the compaction warp when it loads q and by the consumers after the item); the consumers hand
//    chunk c back during the last subtile's S, or after waiting for it when no tile had an entry.
// An item without index columns in either source is one record with num_valid 0 and no q: out 0,
// lse p.empty_token_lse, and no role waits for anything another does not give.
#pragma once

#include <cuda.h>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_layer_consumer.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_producer.cuh"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_layer_split.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_smem.cuh"

namespace swa_decode::sm90 {

// kCtasPerToken 2 (H > 64): launched in clusters of two CTAs, a LayerPair; 1: no cluster.
// kSplitGather: LayerPair's kSplitGatherWarps. kSplitKeys: a key split over `splits` CTAs (or
// pairs) a token (KeySplit), in clusters of kCtasPerToken x splits, one item a CTA; else splits 1.
template <int kCtasPerToken, bool kSplitGather, bool kSplitKeys>
__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_layer_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap q_map,
                             int splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pair = LayerPair<kCtasPerToken, kSplitGather, kSplitKeys>;
  constexpr bool kClustered = Pair::kCtas == 2 || Pair::kSplitKeys;
  const int rank = kClustered ? ptx::cluster_rank() : 0;
  const KeySplit split = Pair::kSplitKeys ? KeySplit{rank / Pair::kCtas, splits} : KeySplit{0, 1};
  const PlacedSmem<LayerSmemPlan, LayerSmemSync> placed = place_smem<LayerSmemPlan, LayerSmemSync>();
  LayerSmemPlan& smem = placed.plan;
  LayerSmemSync& sync = placed.sync;
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    for (int c = 0; c < kQChunks; ++c) {
      ptx::mbarrier_init(&sync.q_full[c], 1);
      ptx::mbarrier_init(&sync.q_empty[c], kWarpgroupThreads);  // consumer 0 alone reads q
    }
    for (int stage = 0; stage < kKvStages; ++stage) {
      ptx::mbarrier_init(&sync.kv_full[stage], Pair::kKvFullArrivals);
      ptx::mbarrier_init(&sync.kv_empty[stage], Pair::kKvEmptyArrivals);
    }
    for (int m = 0; m < 2; ++m) {
      ptx::mbarrier_init(&sync.meta_full[m], kCompactThreads);
      ptx::mbarrier_init(&sync.meta_empty[m], kConsumerThreads + kGatherThreads);
    }
    for (int b = 0; b < kStagingShares; ++b) {
      ptx::mbarrier_init(&sync.staged_full[b], Pair::kIssuerThreads);
      ptx::mbarrier_init(&sync.staged_empty[b], Pair::kStageWriters);
    }
    ConsumerExchange& exchange = consumer_exchange(smem);
    ptx::mbarrier_init(&exchange.p_full, kWarpgroupThreads);
    ptx::mbarrier_init(&exchange.p_empty, kWarpgroupThreads);
    ptx::mbarrier_init(&exchange.final_full, kWarpgroupThreads);
    ptx::mbarrier_init(&exchange.final_empty, kWarpgroupThreads);
    ptx::fence_barrier_init();
  }
  // A pair's CTAs arrive on each other's barriers: both must have initialized theirs.
  if constexpr (kClustered) {
    ptx::cluster_barrier();
  } else {
    __syncthreads();
  }
  // Everything above touches only shared memory and the kernel's parameters.
  ptx::wait_for_prior_grid();
  ptx::let_dependent_grid_launch();
  // In this CTA's q buffer and staging rows that the peer never writes, so no cluster barrier.
  order_items<Pair>(p, smem, split);

  const int wg = threadIdx.x / kWarpgroupThreads;
  if (wg == 0) {
    ptx::setmaxnreg_dec<kLayerProducerRegisters>();
    if (threadIdx.x < kGatherThreads) {
      if constexpr (Pair::kSplitGather) {
        if (threadIdx.x < Pair::kIssuerThreads) {
          run_issuer_warp<Pair>(p, smem, sync, rank);
        } else {
          run_dequant_warps<Pair>(p, smem, sync, rank);
        }
      } else {
        run_layer_gather_warps<Pair>(p, smem, sync, rank);
      }
    } else {
      run_layer_compaction_warp<Pair>(p, q_map, smem, sync, rank, split);
    }
  } else if (wg == 1) {  // consumer 0 computes S, consumer 1 only its PV half
    ptx::setmaxnreg_inc<kScorerRegisters>();
    run_scoring_consumer<Pair>(p, smem, sync, rank);
    if constexpr (Pair::kSplitKeys) combine_layer_split<Pair>(p, smem, rank, split);
  } else {
    ptx::setmaxnreg_inc<kValueRegisters>();
    run_value_consumer<Pair>(p, smem, sync, rank);
    if constexpr (Pair::kSplitKeys) combine_layer_split<Pair>(p, smem, rank, split);
  }
  // Neither CTA of a pair leaves while the other may still store into its stages or arrive on its
  // barriers (the last subtile's kv_empty arrivals are never waited for). With a key split the
  // consumers combine between two cluster barriers (combine_layer_split), which the producer
  // warps pass here: code after the roles runs at the producers' 72 registers.
  if constexpr (Pair::kSplitKeys) {
    if (wg == 0) {
      ptx::cluster_barrier();
      ptx::cluster_barrier_relaxed();
    }
  } else if constexpr (Pair::kCtas == 2) {
    ptx::cluster_barrier();
  }
#endif
}

}  // namespace swa_decode::sm90
