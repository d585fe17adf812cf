#include "src/kernels/sm90/decode_sm90_layer.cuh"

#include "src/kernels/sm90/launch_sm90.h"
#include "src/kernels/sm90/sm90_q_map.h"

namespace swa_decode {

cudaError_t launch_sm90_layer_decode(const DecodeParams& params, int persistent_ctas, cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = sm90::encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(sm90::decode_sm90_layer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             sm90::kLayerSmemBytes);
  if (err != cudaSuccess) return err;
  // sm90_record.cpp keeps num_tokens * slabs within int32.
  const int items = params.num_tokens * sm90::layer_slabs(params.num_heads);
  const int ctas = items < persistent_ctas ? items : persistent_ctas;
  sm90::decode_sm90_layer_kernel<<<ctas, sm90::kThreads, sm90::kLayerSmemBytes, stream>>>(params, q_map);
  return cudaGetLastError();
}

}  // namespace swa_decode
