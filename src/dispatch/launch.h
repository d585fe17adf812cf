// Enqueue the chosen kernel. No allocation, no synchronization (CUDA-graph capturable); every
// launch is followed by cudaGetLastError. Build with -DSWA_DECODE_SYNC_AFTER_LAUNCH=ON to also
// synchronize after each launch while debugging.
#pragma once

#include <cuda_runtime_api.h>

#include "swa_decode/swa_decode.h"
#include "src/common/params.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode {

Status launch_decode(const DecodeParams& params, const KernelChoice& choice, cudaStream_t stream);

}  // namespace swa_decode
