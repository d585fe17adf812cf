// Launchers of the Hopper fast paths (src/kernels/sm90/): the window-only kernel
// (decode_sm90.cuh, either row format) and the layer kernel that also reads an extra KV source
// (decode_sm90_layer.cuh).
// Built only for sm_90a.
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// Launches min(num_tokens, persistent_ctas) persistent CTAs. Encodes q's TMA descriptor on the
// host (no allocation, no synchronization: capturable in a CUDA graph). kModel1: the window's rows
// are kModel1 (params.window.is_model1), each variant built in its own file (decode_sm90[_model1].cu).
// dependent_launch: LaunchPlan::dependent_launch.
template <bool kModel1>
cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, bool dependent_launch,
                               cudaStream_t stream);

// The same for the layer kernel: min(work items, persistent_ctas) CTAs, a work item being a token
// and a slab of 64 heads (two per token for more than 64 heads); with key_splits > 1, one CTA per
// item and share instead (KeySplit, sm90_layer_plan.h).
cudaError_t launch_sm90_layer_decode(const DecodeParams& params, int persistent_ctas, int key_splits,
                                     bool dependent_launch, cudaStream_t stream);

}  // namespace swa_decode
