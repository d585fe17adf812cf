// Launcher of the portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// One CTA holds kHeadGroups groups of 16 heads; each group is split over 4 warps by D quarters.
// num_stages (2..4) staging buffers of 32 cache rows; see portable_smem_bytes for the footprint.
// window_splits > 1 (sm_90+ only: thread-block clusters) splits each window over that many CTAs
// (portable_plan.h, choose_window_splits).
template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, int num_stages, int window_splits, cudaStream_t stream);

// Dynamic shared memory the kernel needs for `num_stages` and `window_size`.
template <int kHeadGroups>
int portable_smem_bytes(int num_stages, int window_size);

}  // namespace swa_decode
