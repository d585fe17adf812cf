#include "src/kernels/sm90/decode_sm90_layer_launch.cuh"

namespace swa_decode::sm90 {

cudaError_t launch_layer_split(const DecodeParams& params, const CUtensorMap& q_map, int splits, bool dependent_launch,
                               cudaStream_t stream) {
  // sm90_record.cpp splits sources of one row format only (LayerPair's kSplitGather).
  if (mixed_row_formats(params)) return cudaErrorInvalidValue;
  const int slabs = layer_slabs(params.num_heads);
  const int ctas = params.num_tokens * slabs * splits;  // sm90_record.cpp keeps it within one wave
  return slabs == 1 ? launch_layer_kernel<1, true, true>(params, q_map, ctas, splits, dependent_launch, stream)
                    : launch_layer_kernel<2, true, true>(params, q_map, ctas, splits, dependent_launch, stream);
}

}  // namespace swa_decode::sm90
