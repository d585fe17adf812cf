// The layer kernel's pair (LayerPair, sm90_layer_plan.h): which slab of heads and half of each
// subtile a CTA takes, and the K/V ring's barriers as both CTAs of a pair arrive on and wait for
// them (the producer's stage writers and the consumers).
#pragma once

#include <cstdint>

#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"

namespace swa_decode::sm90 {

// The slab of 64 heads this CTA runs of each of its tokens, which is also its place in its pair
// (the half of each subtile it gathers): a pair's cluster rank (with a key split, the rank's low
// bit: rank = split * 2 + slab), 0 alone.
template <class Pair>
__device__ __forceinline__ int slab_of_cta(int rank) {
  if constexpr (Pair::kCtas == 2) return Pair::kSplitKeys ? rank % 2 : rank;
  return 0;
}

// Arrives on this CTA's barrier `bar` (kv_full) and, in a pair, on the peer's barrier
// at the same place, which counts this CTA's threads too; the remote arrive releases at cluster
// scope (wait_pair_phase acquires kv_full's).
template <class Pair>
__device__ __forceinline__ void arrive_pair(uint64_t* bar, int rank) {
  ptx::mbarrier_arrive(bar);
  if constexpr (Pair::kCtas == 2) ptx::mbarrier_arrive_cluster(ptx::cluster_address(ptx::smem_addr(bar), rank ^ 1));
}

// A consumer's arrive on kv_empty: this CTA's barrier and, in a pair, the peer's, whose writers
// fill this CTA's stage too. It orders only this thread's reads of the stage, by wgmmas already
// waited for, before those writes, so the remote arrive releases at CTA scope, as CUTLASS's
// cluster pipelines release a stage to the CTA that fills it; a cluster-scoped one cost consumer 0
// ~10% of its samples in a MEMBAR.ALL.GPU / ERRBAR that also waited for its out stores (ncu, v8).
// The writers' kv_full arrive, which carries their stores to the peer's consumers, stays
// cluster-scoped.
template <class Pair>
__device__ __forceinline__ void release_stage(uint64_t* bar, int rank) {
  ptx::mbarrier_arrive(bar);
  if constexpr (Pair::kCtas == 2) {
    ptx::mbarrier_arrive_cluster_cta_release(ptx::cluster_address(ptx::smem_addr(bar), rank ^ 1));
  }
}

// A stage writer's stores (to this CTA's stage and, in a pair of v4's gather warps, the peer's),
// ordered before the consumers' wgmmas read them through the async proxy; kv_full's arrive
// follows. With kPeerBulkCopy the peer's half arrives by bulk copy (async proxy) instead.
template <class Pair>
__device__ __forceinline__ void fence_stage_writes() {
  if constexpr (Pair::kCtas == 2 && !Pair::kPeerBulkCopy) {
    ptx::fence_proxy_async_cluster();
  } else {
    ptx::fence_proxy_async_shared();
  }
}

// A consumer's wait for phase `parity` of kv_full, on which a pair's peer arrives too. v4's gather
// warps release their kv_full arrivals at cluster scope, and what those order (their stores into
// this CTA's stage) is then read: the acquire must be cluster-scoped as well, or those stores are
// not ordered before this CTA's wgmmas after the wait. A lone CTA, and a pair whose peer's half
// comes by bulk copy (complete_tx on this CTA's barrier, as a TMA load's bytes), wait at CTA scope.
template <class Pair>
__device__ __forceinline__ void wait_pair_phase(uint64_t* bar, uint32_t parity) {
  if constexpr (Pair::kCtas == 2 && !Pair::kPeerBulkCopy) {
    ptx::mbarrier_wait_cluster(bar, parity);
  } else {
    ptx::mbarrier_wait(bar, parity);
  }
}

// A stage writer's wait for phase `parity` of kv_empty (the stage is free in both CTAs). Its
// remote arrivals release at CTA scope and order only reads completed before them (release_stage),
// so a cluster-scoped acquire would pair with nothing stronger; it would cost each wait an L1
// invalidate (CCTL.IVALL, 0.8% of the kernel's samples at the dequantizing warps' wait in v8's
// ncu profile). CUTLASS's cluster pipelines wait at CTA scope too.
__device__ __forceinline__ void wait_stage_free(uint64_t* bar, uint32_t parity) { ptx::mbarrier_wait(bar, parity); }

}  // namespace swa_decode::sm90
