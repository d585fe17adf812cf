// Launcher of the Hopper fast path (src/kernels/sm90/decode_sm90.cuh). Built only for sm_90a.
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// Launches min(num_tokens, persistent_ctas) persistent CTAs. Encodes q's TMA descriptor on the
// host (no allocation, no synchronization: capturable in a CUDA graph).
cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, cudaStream_t stream);

}  // namespace swa_decode
