// How the layer kernel is launched (decode_sm90_layer.cu without a key split,
// decode_sm90_layer_split.cu with one: each instantiation set in its own file, so they build in
// parallel).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "src/common/kernel_launch.h"
#include "src/common/params.h"
#include "src/kernels/sm90/decode_sm90_layer.cuh"

namespace swa_decode::sm90 {

// Sources of two row formats (a seed window beside a kModel1 extra source, or the reverse): a pair
// then keeps v4's gather warps (LayerPair's kSplitGather) and no key split runs.
inline bool mixed_row_formats(const DecodeParams& params) {
  return params.extra.kv_cache != nullptr && params.extra.is_model1 != params.window.is_model1;
}

template <int kCtasPerToken, bool kSplitGather, bool kSplitKeys>
cudaError_t launch_layer_kernel(const DecodeParams& params, const CUtensorMap& q_map, int ctas, int splits,
                                bool dependent_launch, cudaStream_t stream) {
  const KernelLaunch launch{.grid = dim3(static_cast<unsigned>(ctas)),
                            .block = dim3(kThreads),
                            .smem_bytes = kLayerSmemBytes,
                            // H <= 64 without a key split launches without a cluster
                            .cluster_ctas = static_cast<unsigned>(kCtasPerToken * splits),
                            .dependent_launch = dependent_launch,
                            .stream = stream};
  return launch_kernel<decode_sm90_layer_kernel<kCtasPerToken, kSplitGather, kSplitKeys>>(launch, params, q_map, splits);
}

// One CTA (or pair) per share of each token: T x slabs x splits CTAs in clusters of slabs x splits
// (KeySplit, sm90_layer_plan.h). Sources of one row format only (LayerPair's kSplitGather).
cudaError_t launch_layer_split(const DecodeParams& params, const CUtensorMap& q_map, int splits, bool dependent_launch,
                               cudaStream_t stream);

}  // namespace swa_decode::sm90
