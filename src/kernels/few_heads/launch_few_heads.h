// Launcher of the few-heads kernel (decode_few_heads.cuh; mma.sync, sm_80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// One variant per head-tile count (8 heads a tile, few_heads_plan.h), both built in
// decode_few_heads.cu: a CTA per (token, block of 8 * kHeadTiles heads).
template <int kHeadTiles>
cudaError_t launch_few_heads_variant(const DecodeParams& params, bool dependent_launch, cudaStream_t stream);

// head_tiles: few_heads::head_tiles_for(num_heads), which the record's plan chose.
inline cudaError_t launch_few_heads_decode(const DecodeParams& params, int head_tiles, bool dependent_launch,
                                           cudaStream_t stream) {
  if (head_tiles == 1) return launch_few_heads_variant<1>(params, dependent_launch, stream);
  if (head_tiles == 2) return launch_few_heads_variant<2>(params, dependent_launch, stream);
  return cudaErrorInvalidValue;
}

}  // namespace swa_decode
