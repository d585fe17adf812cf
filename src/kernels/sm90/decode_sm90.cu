#include "src/kernels/sm90/decode_sm90.cuh"

#include <cudaTypedefs.h>

#include "src/kernels/sm90/launch_sm90.h"

namespace swa_decode {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point: no link against libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// q as a 3-D tensor (dims, heads, tokens), fetched in boxes of 64 dims x 64 heads x 1 token with
// the 128-byte swizzle wgmma reads. Heads past num_heads are zero-filled by the copy engine.
cudaError_t encode_q_map(const DecodeParams& p, CUtensorMap* map) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.num_heads),
                              static_cast<cuuint64_t>(p.num_tokens)};
  const cuuint64_t strides_bytes[2] = {static_cast<cuuint64_t>(p.stride_q_head) * 2,
                                       static_cast<cuuint64_t>(p.stride_q_token) * 2};
  const cuuint32_t box[3] = {sm90::kBlockDims, sm90::kSlabHeads, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(p.q), dims, strides_bytes, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_sm90_decode(const DecodeParams& params, int persistent_ctas, cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(sm90::decode_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int ctas = params.num_tokens < persistent_ctas ? params.num_tokens : persistent_ctas;
  sm90::decode_sm90_kernel<<<ctas, sm90::kThreads, sm90::kSmemBytes, stream>>>(params, q_map);
  return cudaGetLastError();
}

}  // namespace swa_decode
