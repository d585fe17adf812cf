// Hopper fast path: persistent, warp-specialized, wgmma (sm_90a). Window <= 128, head_dim 512.
//
// One CTA per SM walks tokens blockIdx.x, blockIdx.x + gridDim.x, ... Three warpgroups:
//  * producer (WG 0): one warp compacts each token's valid entries a token ahead
//    (src/common/window_compaction.cuh); three warps gather the e4m3 rows with cp.async into a
//    staging buffer (32 KiB = half a window) and dequantize them into the bf16 K/V tile, one
//    256-dim half at a time;
//  * two consumers (WG 1, 2), 64 heads each (the wgmma M): S = Q K^T with Q streamed by TMA in
//    64-dim chunks through a private 4-stage ring, one-pass softmax in registers (the whole
//    window fits: no rescaling), then O = P V for each 256-dim half (m64n256k16, P from registers).
// The K/V tile is split in halves so the producer refills half 0 for the next token while the
// consumers still multiply with half 1: the tensor cores never wait for a full-window refill.
// For H <= 64 both consumers hold the same 64 heads, each computes S (duplicated) and one half of O.
// One instantiation per row format of the window (kModel1: docs/semantics.md, "Row formats"), each
// in its own file (decode_sm90.cu, decode_sm90_model1.cu): the formats differ in what the producer
// stages and converts (sm90_producer.cuh) and whether the consumers scale the scores.
#pragma once

#include <cuda.h>

#include "src/common/kernel_launch.h"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_consumer.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_producer.cuh"
#include "src/kernels/sm90/sm90_q_map.h"

namespace swa_decode::sm90 {

template <bool kModel1>
__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap q_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // CUDA promises the base 16-byte alignment only; the swizzled tiles need 1024, so the plan
  // starts at the next 1024-aligned address and the barriers fill the gap or follow it.
  extern __shared__ __align__(16) uint8_t smem_raw[];
#if defined(SWA_DECODE_SM90_TEST_BASE_SHIFT)
  // Test builds only (CMake SWA_DECODE_SM90_TEST_BASE_SHIFT): static shared memory ahead of the
  // dynamic block moves its base off the 1024 boundary, so the GPU suite also runs the layout that
  // puts the barriers in the gap. 16 + kSmemBytes = 227 KiB still fits.
  __shared__ __align__(16) volatile uint8_t base_shift[SWA_DECODE_SM90_TEST_BASE_SHIFT];
  if (threadIdx.x == 0) base_shift[0] = 0;
#endif
  const SmemLayout layout = smem_layout(ptx::smem_addr(smem_raw) % kSwizzleAtomBytes);
  SmemPlan& smem = *reinterpret_cast<SmemPlan*>(smem_raw + layout.plan_offset);
  SmemSync& sync = *reinterpret_cast<SmemSync*>(smem_raw + layout.sync_offset);
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    for (int s = 0; s < kQStages; ++s) {
      ptx::mbarrier_init(&sync.q_full[0][s], 1);
      ptx::mbarrier_init(&sync.q_full[1][s], 1);
    }
    for (int h = 0; h < kHalves; ++h) {
      ptx::mbarrier_init(&sync.kv_full[h], kGatherThreads);
      ptx::mbarrier_init(&sync.kv_empty[h], kConsumerThreads);
    }
    for (int m = 0; m < 2; ++m) {
      ptx::mbarrier_init(&sync.meta_full[m], kCompactThreads);
      ptx::mbarrier_init(&sync.meta_empty[m], kConsumerThreads);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  // Everything above touches only shared memory and the kernel's parameters.
  ptx::wait_for_prior_grid();
  ptx::let_dependent_grid_launch();

  const int wg = threadIdx.x / kWarpgroupThreads;
  if (wg == 0) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x < kGatherThreads) {
      run_gather_warps<kModel1>(p, smem, sync);
    } else {
      run_compaction_warp<kModel1>(p, smem, sync);
    }
  } else {
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    const bool two_slabs = p.num_heads > kSlabHeads;
    ConsumerRole role;
    role.wg = wg - 1;
    role.slab = two_slabs ? role.wg : 0;
    role.first_half = two_slabs ? 0 : role.wg;
    role.last_half = two_slabs ? kHalves - 1 : role.wg;
    role.writes_lse = two_slabs || role.wg == 0;
    run_consumer<kModel1>(p, q_map, smem, sync, role);
  }
#endif
}

}  // namespace swa_decode::sm90

namespace swa_decode {

template <bool kModel1>
cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, bool dependent_launch,
                               cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = sm90::encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  const int ctas = params.num_tokens < persistent_ctas ? params.num_tokens : persistent_ctas;
  const KernelLaunch launch{.grid = dim3(static_cast<unsigned>(ctas)),
                            .block = dim3(sm90::kThreads),
                            .smem_bytes = sm90::kSmemBytes,
                            .cluster_ctas = 1,
                            .dependent_launch = dependent_launch,
                            .stream = stream};
  return launch_kernel<sm90::decode_sm90_kernel<kModel1>>(launch, params, q_map);
}

}  // namespace swa_decode
