// Launcher of the portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// One CTA holds kHeadGroups groups of 16 heads; each group is split over 4 warps by D quarters.
template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, cudaStream_t stream);

}  // namespace swa_decode
