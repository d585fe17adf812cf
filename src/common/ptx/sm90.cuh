// Every inline-PTX wrapper the kernels use that needs sm_90 (sm_90a for setmaxnreg): mbarriers,
// the bulk tensor copy (TMA), the async-proxy fence, register reallocation, the wgmma shared-memory
// descriptor, and thread-block clusters with their distributed shared memory. One wrapper per
// instruction form; each cites the section of the PTX ISA it implements (section titles rather
// than numbers, which move between ISA versions):
// https://docs.nvidia.com/cuda/parallel-thread-execution/
// The wgmma instructions themselves come from CuTe's atoms (src/kernels/sm90/sm90_gmma.cuh).
#pragma once

#include <cstdint>

#include "src/common/ptx/sm80.cuh"

namespace swa_decode::ptx {

// ---- mbarrier ----
// "Parallel Synchronization and Communication Instructions: mbarrier.init".
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// Makes the initialized barriers visible to the async proxy and the cluster.
// "Parallel Synchronization and Communication Instructions: membar / fence".
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }

// "Parallel Synchronization and Communication Instructions: mbarrier.arrive".
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives and adds `bytes` to the transactions the current phase waits for.
// "Parallel Synchronization and Communication Instructions: mbarrier.arrive".
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Blocks until the phase with the given parity has completed. A fresh barrier counts its
// "previous" phase (parity 1) as complete, so producers wait on (use & 1) ^ 1 for empty slots.
// "Parallel Synchronization and Communication Instructions: mbarrier.test_wait / mbarrier.try_wait".
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

// ---- TMA ----
// 3-D tile load completing on an mbarrier.
// "Data Movement and Conversion Instructions: cp.async.bulk.tensor".
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const void* tensor_map, uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_addr(smem_dst)),
      "l"(tensor_map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to this CTA's shared
// memory in one bulk copy, completing on `bar` as transaction bytes.
// "Data Movement and Conversion Instructions: cp.async.bulk".
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t smem_dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_dst),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// "Data Movement and Conversion Instructions: prefetch, prefetchu" (the .tensormap form).
__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// Ordinary (generic-proxy) shared-memory stores that wgmma or TMA (the async proxy) reads next
// must be ordered before it by this fence ("Memory Consistency Model: Proxies").
// "Parallel Synchronization and Communication Instructions: membar / fence" (fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- register reallocation between warpgroups (sm_90a) ----
// "Miscellaneous Instructions: setmaxnreg".
template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
// "Miscellaneous Instructions: setmaxnreg".
template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- wgmma shared-memory descriptor, 128-byte swizzle (cute/arch/mma_sm90_desc.hpp layout) ----
// K-major (rows of 64 bf16 = 128 B, 8-row atoms of 1 KiB): stride between 8-row groups = 1 KiB.
// MN-major (64 MN-contiguous bf16 per K row, 8 K rows per 1 KiB atom): LBO = stride between
// 64-wide MN blocks, SBO = stride between 8-row K groups. The base-offset field stays 0, which
// holds only for operands whose swizzle atoms start 1024-aligned.
// "Asynchronous Warpgroup Level Matrix Shared Memory Layout: Matrix Descriptor".
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_byte_addr, uint32_t leading_bytes,
                                                         uint32_t stride_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_byte_addr >> 4) & 0x3FFF);
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // layout type 1 = SWIZZLE_128B
  return desc;
}
// The descriptor of the same layout offset_bytes (a multiple of 16) further on: only the
// start-address field (bits 0-13, in 16-byte units) moves, and a shared-memory address (below
// 228 KiB) never carries out of it. One add instead of make_smem_desc_sw128's masks and shifts
// per wgmma (the layer kernel's consumer 0 spent ~410 uniform instructions a subtile on them).
__device__ __forceinline__ uint64_t advance_smem_desc(uint64_t desc, uint32_t offset_bytes) {
  return desc + static_cast<uint64_t>(offset_bytes >> 4);
}

// ---- programmatic dependent launch ----
// Launched with cudaLaunchAttributeProgrammaticStreamSerialization (src/common/kernel_launch.h), a kernel
// may start while the kernel before it in the stream is still running; griddepcontrol.wait
// returns once that kernel has completed and its memory is visible, so every kernel calls it
// before its first read of global memory (q, indices, lens and the caches may be what the kernel
// before wrote) and before its first write (out, lse may be what it reads). launch_dependents
// lets the next kernel start once every CTA of this one has called it (or exited). Without the
// attribute, or before sm_90 (where the portable kernel also compiles), both do nothing.
// "Parallel Synchronization and Communication Instructions: griddepcontrol".
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void let_dependent_grid_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
#else
__device__ __forceinline__ void wait_for_prior_grid() {}
__device__ __forceinline__ void let_dependent_grid_launch() {}
#endif

// ---- thread-block clusters and distributed shared memory ----
// The portable kernel's window split (window_split_combine.cuh) calls these and is compiled for
// sm_80 too, where select_kernel.cpp never launches it (clusters need sm_90); there they compile
// to an unreachable trap so that the one kernel template builds for every target.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// "Special Registers: %cluster_ctarank".
__device__ __forceinline__ int cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return static_cast<int>(rank);
}
// "Special Registers: %cluster_nctarank".
__device__ __forceinline__ int cluster_size() {
  uint32_t size;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(size));
  return static_cast<int>(size);
}
// Every thread of every CTA of the cluster. The release/acquire form orders each CTA's
// shared-memory writes before the other CTAs' reads after it; the relaxed form only keeps CTAs
// alive until every remote read of their shared memory has returned (its values are in use).
// "Parallel Synchronization and Communication Instructions: barrier.cluster".
__device__ __forceinline__ void cluster_barrier() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}
// "Parallel Synchronization and Communication Instructions: barrier.cluster".
__device__ __forceinline__ void cluster_barrier_relaxed() {
  asm volatile(
      "barrier.cluster.arrive.relaxed.aligned;\n"
      "barrier.cluster.wait.aligned;\n" ::
          : "memory");
}
// The shared-memory address `local` (of this CTA) in CTA `rank` of the cluster.
// "Data Movement and Conversion Instructions: mapa".
__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
// Not volatile: the loads after a cluster barrier (which clobbers memory) may be batched.
// "Data Movement and Conversion Instructions: ld" (.shared::cluster).
__device__ __forceinline__ float4 load_cluster_f32x4(uint32_t address) {
  float4 v;
  asm("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(address));
  return v;
}
// "Data Movement and Conversion Instructions: ld" (.shared::cluster).
__device__ __forceinline__ float2 load_cluster_f32x2(uint32_t address) {
  float2 v;
  asm("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(address));
  return v;
}
// The layer kernel's CTA pairs (sm90_layer_plan.h, LayerPair) hand each other halves of K/V stages:
// a plain store to the peer's shared memory, a proxy fence that orders it (and this CTA's own
// stores) before the peer's wgmma reads them, a release arrive on the peer's barrier and, on the
// reading side, an acquire wait at cluster scope.
// "Data Movement and Conversion Instructions: st" (.shared::cluster).
__device__ __forceinline__ void store_cluster_u32x4(uint32_t address, const uint4& v) {
  asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from this CTA's shared memory `src`
// to `dst` (a shared::cluster address, another CTA's), written through the async proxy as a TMA
// load's and completed on that CTA's mbarrier `bar` (shared::cluster) by complete_tx: the peer's
// wgmmas read them after its wait, with no fence on either side. The source must be ordered for
// the async proxy first (fence_proxy_async_shared after the generic stores into it).
// "Data Movement and Conversion Instructions: cp.async.bulk".
__device__ __forceinline__ void bulk_copy_shared_to_cluster(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "r"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// "Parallel Synchronization and Communication Instructions: membar / fence" (fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_cluster() {
  asm volatile("fence.proxy.async.shared::cluster;\n" ::: "memory");
}
// `bar` is a shared::cluster address (cluster_address): the barrier of another CTA, or this one's.
// "Parallel Synchronization and Communication Instructions: mbarrier.arrive".
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The same arrive at CTA scope (no cluster-wide fence: no MEMBAR.ALL.GPU / ERRBAR), for a signal
// that orders only reads already complete, as a consumer's "stage free" to the CTA that writes it
// (CUTLASS's ClusterBarrier::arrive(cta_id) in its cluster pipelines).
__device__ __forceinline__ void mbarrier_arrive_cluster_cta_release(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (sm_90's count operand): one thread standing in for others that have
// nothing to publish in this phase.
// "Parallel Synchronization and Communication Instructions: mbarrier.arrive".
__device__ __forceinline__ void mbarrier_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
// mbarrier_wait whose acquire also covers what other CTAs of the cluster released into the phase.
// "Parallel Synchronization and Communication Instructions: mbarrier.test_wait / mbarrier.try_wait".
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
#else
__device__ __forceinline__ int cluster_rank() { __trap(); }
__device__ __forceinline__ int cluster_size() { __trap(); }
__device__ __forceinline__ void cluster_barrier() { __trap(); }
__device__ __forceinline__ void cluster_barrier_relaxed() { __trap(); }
__device__ __forceinline__ uint32_t cluster_address(uint32_t, int) { __trap(); }
__device__ __forceinline__ float4 load_cluster_f32x4(uint32_t) { __trap(); }
__device__ __forceinline__ float2 load_cluster_f32x2(uint32_t) { __trap(); }
__device__ __forceinline__ void store_cluster_u32x4(uint32_t, const uint4&) { __trap(); }
__device__ __forceinline__ void fence_proxy_async_cluster() { __trap(); }
__device__ __forceinline__ void bulk_copy_shared_to_cluster(uint32_t, uint32_t, uint32_t, uint32_t) { __trap(); }
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t) { __trap(); }
__device__ __forceinline__ void mbarrier_arrive_cluster_cta_release(uint32_t) { __trap(); }
__device__ __forceinline__ void mbarrier_arrive_count(uint64_t*, uint32_t) { __trap(); }
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t*, uint32_t) { __trap(); }
#endif

}  // namespace swa_decode::ptx
