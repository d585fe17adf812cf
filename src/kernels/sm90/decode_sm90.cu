#include "src/kernels/sm90/decode_sm90.cuh"

#include "src/kernels/sm90/launch_sm90.h"
#include "src/kernels/sm90/sm90_q_map.h"

namespace swa_decode {

cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = sm90::encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(sm90::decode_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int ctas = params.num_tokens < persistent_ctas ? params.num_tokens : persistent_ctas;
  sm90::decode_sm90_kernel<<<ctas, sm90::kThreads, sm90::kSmemBytes, stream>>>(params, q_map);
  return cudaGetLastError();
}

}  // namespace swa_decode
