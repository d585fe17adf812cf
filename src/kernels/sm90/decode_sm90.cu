#include "src/kernels/sm90/decode_sm90.cuh"

#include "src/common/dependent_launch.h"
#include "src/kernels/sm90/launch_sm90.h"
#include "src/kernels/sm90/sm90_q_map.h"

namespace swa_decode {

cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, bool dependent_launch,
                               cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = sm90::encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(sm90::decode_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int ctas = params.num_tokens < persistent_ctas ? params.num_tokens : persistent_ctas;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(sm90::kThreads);
  config.dynamicSmemBytes = sm90::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute dependent = dependent_launch_attribute();
  config.attrs = &dependent;
  config.numAttrs = dependent_launch ? 1 : 0;
  return cudaLaunchKernelEx(&config, sm90::decode_sm90_kernel, params, q_map);
}

}  // namespace swa_decode
