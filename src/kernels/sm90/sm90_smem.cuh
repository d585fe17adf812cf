// Where a Hopper kernel's plan and barrier block lie in its dynamic shared memory, for any base
// CUDA hands it (smem_layout_of, sm90_plan.h). The layer kernel starts with it; decode_sm90_kernel
// still spells the same lines out, because calling this changes its compiled code (ptxas
// schedules the whole kernel differently), and issue 11 keeps that kernel's code as it was.
#pragma once

#include <cstdint>

#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

template <typename Plan, typename Sync>
struct PlacedSmem {
  Plan& plan;
  Sync& sync;
};

// CUDA promises the base 16-byte alignment only; the swizzled tiles need 1024, so the plan
// starts at the next 1024-aligned address and the barriers fill the gap or follow it.
template <typename Plan, typename Sync>
__device__ __forceinline__ PlacedSmem<Plan, Sync> place_smem() {
  extern __shared__ __align__(16) uint8_t smem_raw[];
#if defined(SWA_DECODE_SM90_TEST_BASE_SHIFT)
  // Test builds only (CMake SWA_DECODE_SM90_TEST_BASE_SHIFT): static shared memory ahead of the
  // dynamic block moves its base off the 1024 boundary, so the GPU suite also runs the layout that
  // puts the barriers in the gap. 16 + kSmemBytes = 227 KiB still fits.
  __shared__ __align__(16) volatile uint8_t base_shift[SWA_DECODE_SM90_TEST_BASE_SHIFT];
  if (threadIdx.x == 0) base_shift[0] = 0;
#endif
  const SmemLayout layout = smem_layout_of<Plan, Sync>(ptx::smem_addr(smem_raw) % kSwizzleAtomBytes);
  return {*reinterpret_cast<Plan*>(smem_raw + layout.plan_offset), *reinterpret_cast<Sync*>(smem_raw + layout.sync_offset)};
}

}  // namespace swa_decode::sm90
